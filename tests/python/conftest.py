"""Starts the real mock-upstream and compactor binaries on ephemeral loopback ports."""

import json
import os
import re
import subprocess
import tempfile
import textwrap
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("COMPACTOR_BIN_DIR", ROOT / "target" / "debug"))
START_TIMEOUT_S = 20


class Process:
    def __init__(self, args, env=None):
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={**os.environ, **(env or {})},
        )
        # The first stdout line is "<name> listening on http://HOST:PORT".
        line = self.proc.stdout.readline()
        if "listening on http://" not in line:
            self.stop()
            self.log.seek(0)
            raise RuntimeError(f"{args[0]} did not start: {line!r} {self.log.read()}")
        self.url = line.strip().rsplit(" ", 1)[-1]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_compactor(upstream_url, summarization="", extra="", log_level="warn"):
    """Starts compactor in front of `upstream_url`; `extra` adds upstreams, `summarization` a
    block; its log (`log_level` and up) is kept in `process.log`."""
    config = (
        textwrap.dedent(
            f"""\
            listen: 127.0.0.1:0
            upstreams:
              - name: mock
                base_url: {upstream_url}/v1
            """
        )
        + extra
        + summarization
    )
    handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    handle.write(config)
    handle.close()
    process = Process([str(BIN_DIR / "compactor"), "--config", handle.name], env={"RUST_LOG": log_level})
    process.config_path = handle.name
    return process


@pytest.fixture(scope="session")
def mock_upstream():
    process = Process([str(BIN_DIR / "mock-upstream"), "--listen", "127.0.0.1:0", "--chunks", "6"])
    yield process
    process.stop()


@pytest.fixture(scope="session")
def compactor(mock_upstream):
    process = start_compactor(mock_upstream.url)
    yield process
    process.stop()


@pytest.fixture
def base_url(compactor):
    return compactor.url + "/v1"


@pytest.fixture(scope="session")
def summarizer():
    process = Process([str(BIN_DIR / "mock-upstream"), "--listen", "127.0.0.1:0", "--mode", "summarizer"])
    yield process
    process.stop()


def start_compacting(
    mock_upstream, summarizer, trigger, keep=2, summary_max_tokens=32, upstreams="", top_level="", log_level="warn", mode="enforce"
):
    """compactor with compaction on (`trigger` as YAML), `keep` messages kept, summaries from
    `summarizer`, in `mode` (`enforce` or `audit`); `upstreams` adds upstream entries before the
    summarizer's, `top_level` more top-level keys."""
    extra = upstreams + (
        "  - name: summarizer\n"
        f"    base_url: {summarizer.url}/v1\n"
        '    models: ["summarizer-*"]\n'
    )
    summarization = textwrap.dedent(
        """\
        summarization:
          enabled: true
          upstream: summarizer
          model_name: summarizer-model
          trigger: {trigger}
          keep: {{type: messages, value: {keep}}}
          summary_max_tokens: {summary_max_tokens}
          mode: {mode}
        """
    ).format(trigger=trigger, keep=keep, summary_max_tokens=summary_max_tokens, mode=mode)
    return start_compactor(mock_upstream.url, summarization=summarization + top_level, extra=extra, log_level=log_level)


@pytest.fixture(scope="session")
def compacting(mock_upstream, summarizer):
    """compactor with compaction on: 8+ messages trigger, 2 kept, summaries from `summarizer`."""
    process = start_compacting(mock_upstream, summarizer, "[{type: messages, value: 8}]")
    yield process
    process.stop()


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def metric_total(compactor, name, **labels):
    """The sum of `name`'s samples whose labels include `labels`."""
    with urllib.request.urlopen(compactor.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith((name + "{", name + " ")):
            continue
        sample_labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(sample_labels.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[-1])
    return total
