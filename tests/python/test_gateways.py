"""compactor as the compression engine of a gateway that already runs: the real LiteLLM proxy
(PyPI, frozen in tests/gateways/requirements.txt) with its `headroom` guardrail pointed at
compactor's `POST /v1/compress`. A long conversation sent to LiteLLM reaches LiteLLM's upstream
compacted, and the next turn reuses the summary."""

import os
import socket
import subprocess
import tempfile
import textwrap
import time
import urllib.request

import openai
import pytest

from conftest import BIN_DIR, ROOT, Process, get_json, metric_total, start_compacting

LITELLM = ROOT / ".venv-gateways" / "bin" / "litellm"
READY_WITHIN_S = 90


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiteLLM(Process):
    """The LiteLLM proxy on a loopback port, its model served by `upstream`, every request
    through the `headroom` guardrail at `engine`; stopped as the other processes are."""

    def __init__(self, upstream_url, engine_url):
        if not LITELLM.exists():
            pytest.fail(f"{LITELLM} is missing: scripts/test.sh installs it (tests/gateways/requirements.txt)")
        config = textwrap.dedent(
            f"""\
            model_list:
              - model_name: gpt-4o-mini
                litellm_params:
                  model: openai/gpt-4o-mini
                  api_base: {upstream_url}/v1
                  api_key: sk-upstream
            guardrails:
              - guardrail_name: compactor
                litellm_params:
                  guardrail: headroom
                  mode: pre_call
                  api_base: {engine_url}
                  default_on: true
            """
        )
        self.config = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
        self.config.write(config)
        self.config.close()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile("w+")
        # No network: the cost map ships with the package, telemetry is off.
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
        self.proc = subprocess.Popen(
            [str(LITELLM), "--config", self.config.name, "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + READY_WITHIN_S
        while not self.ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                self.log.seek(0)
                raise RuntimeError(f"LiteLLM did not start: {self.log.read()[-3000:]}")
            time.sleep(0.2)

    def ready(self):
        try:
            with urllib.request.urlopen(f"{self.url}/health/liveliness", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False



@pytest.fixture(scope="module")
def upstream():
    """LiteLLM's upstream: the mock, keeping its last requests for `/mock/stats`."""
    process = Process([str(BIN_DIR / "mock-upstream"), "--listen", "127.0.0.1:0", "--record", "8"])
    yield process
    process.stop()


@pytest.fixture(scope="module")
def engine(upstream, summarizer):
    process = start_compacting(upstream, summarizer, "[{type: tokens, value: 1500}]", keep=4)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def litellm(upstream, engine):
    proxy = LiteLLM(upstream.url, engine.url)
    yield proxy
    proxy.stop()


def history(turns):
    messages = [{"role": "system", "content": "You are a careful engineer."}]
    for t in range(turns):
        words = "the parser drops a token " * 12
        messages.append({"role": "user", "content": f"question {t}: {words}"})
        messages.append({"role": "assistant", "content": f"answer {t}: {words}"})
    messages.append({"role": "user", "content": "And what now?"})
    return messages


def test_litellm_sends_a_long_conversation_upstream_compacted_then_reuses_the_summary(litellm, engine, upstream):
    client = openai.OpenAI(base_url=f"{litellm.url}/v1", api_key="sk-litellm-client", max_retries=0, timeout=60)
    counted = lambda outcome: metric_total(engine, "compactor_compactions_total", outcome=outcome)
    before = {outcome: counted(outcome) for outcome in ("summarized", "reused", "failed")}
    messages = history(20)
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
    assert reply.choices[0].message.content
    sent = get_json(f"{upstream.url}/mock/stats")["last_messages"]
    assert len(sent) < len(messages), "LiteLLM's upstream got the compacted conversation"
    assert sent[0] == messages[0], "the system prompt as it came"
    assert "summary" in str(sent[1]["content"]).lower()
    assert counted("summarized") == before["summarized"] + 1

    grown = messages + [
        {"role": "assistant", "content": "Run the parser tests."},
        {"role": "user", "content": "Done; and then?"},
    ]
    client.chat.completions.create(model="gpt-4o-mini", messages=grown)
    resent = get_json(f"{upstream.url}/mock/stats")["last_messages"]
    assert len(resent) < len(grown)
    assert resent[1] == sent[1], "the same summary, so the upstream's prompt cache keeps hitting"
    assert counted("reused") == before["reused"] + 1
    assert counted("failed") == before["failed"]
