"""The real coding-agent CLIs, unchanged and with their default settings, through compactor.

Claude Code (`claude -p`) on the Messages API, and Codex (`codex exec`, its built-in provider)
and opencode (`opencode run`, its built-in OpenAI provider) on the Responses API each run a scripted agent loop of 30 tool steps against the mock upstream in
agent mode (it plays the model: file reads, parallel calls, thinking or reasoning first), which
validates every request the way the provider does. The CLIs come from the npm registry at the
versions pinned in tests/agents/package.json (scripts/test.sh installs them).
"""

import json
import os
import subprocess
from pathlib import Path

import openai
import pytest

from conftest import BIN_DIR, ROOT, Process, get_json, metric_total, start_compacting

AGENTS = ROOT / "tests" / "agents"
CLIS = {
    "claude": "node_modules/.bin/claude",
    "codex": "node_modules/.bin/codex",
    # The last Codex whose remote compaction v1 (`POST /responses/compact`) can be chosen.
    "codex-v1": "codex-v1/node_modules/.bin/codex",
    "opencode": "node_modules/.bin/opencode",
}
STEPS = 30
CLI_TIMEOUT_S = 300


def cli(name):
    path = AGENTS / CLIS[name]
    if not path.exists():
        pytest.fail(f"{path} is missing: scripts/test.sh installs the agent CLIs (npm in tests/agents)")
    return str(path)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A git repository holding the notes the agent reads (about 11 KB each)."""
    root = tmp_path_factory.mktemp("workspace")
    notes = root / "notes"
    notes.mkdir()
    words = ["alpha", "kernel", "buffer", "socket", "parser", "window", "token", "summary", "cache"]
    for i in range(12):
        lines = [" ".join(words[(i * 7 + j * 3 + k) % len(words)] for k in range(14)) for j in range(120)]
        (notes / f"notes{i:02d}.txt").write_text(f"# notes {i}\n" + "\n".join(lines) + "\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def agent_mock(workspace, *extra):
    """The mock upstream in agent mode: it plays the model through STEPS tool steps."""
    return Process(
        [
            str(BIN_DIR / "mock-upstream"),
            "--listen",
            "127.0.0.1:0",
            "--mode",
            "agent",
            "--agent-steps",
            str(STEPS),
            "--agent-files",
            str(workspace / "notes"),
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def agent_upstream(workspace):
    process = agent_mock(workspace)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def gateway(agent_upstream, summarizer):
    """compactor as a user would run it for agents: a 30 000-token trigger, the last 6 messages
    kept, everything else default (the notice included)."""
    anthropic = f"  - name: anthropic\n    api: anthropic\n    base_url: {agent_upstream.url}/v1\n"
    process = start_compacting(
        agent_upstream,
        summarizer,
        "[{type: tokens, value: 30000}]",
        keep=6,
        summary_max_tokens=1024,
        upstreams=anthropic,
    )
    yield process
    process.stop()


def run(args, workspace, env):
    home = workspace.parent / (workspace.name + "-home")
    home.mkdir(exist_ok=True)
    result = subprocess.run(
        args,
        cwd=workspace,
        env={"PATH": os.environ["PATH"], "HOME": str(home), "TERM": "dumb", **env},
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"{args[0]} failed: {result.stdout[-2000:]} {result.stderr[-2000:]}"
    return result.stdout


class Counts:
    """How compaction and the upstream moved during one CLI run."""

    def __init__(self, gateway, upstream):
        self.gateway, self.upstream = gateway, upstream
        self.start = self.read()

    def read(self):
        stats = get_json(self.upstream.url + "/mock/stats")
        return {
            "summarized": metric_total(self.gateway, "compactor_compactions_total", outcome="summarized"),
            "reused": metric_total(self.gateway, "compactor_compactions_total", outcome="reused"),
            "failed": metric_total(self.gateway, "compactor_compactions_total", outcome="failed"),
            "rejections": stats["rejections"],
            "answered": stats["answered"],
            "last_rejection": stats["last_rejection"],
        }

    def delta(self):
        now = self.read()
        return {k: (now[k] - self.start[k] if k != "last_rejection" else now[k]) for k in now}


def assert_compacted_run(moved, steps):
    assert moved["rejections"] == 0, f"the upstream refused a request: {moved['last_rejection']}"
    assert moved["answered"] >= steps + 1
    assert moved["summarized"] >= 1, moved
    assert moved["reused"] >= 1, moved
    assert moved["failed"] == 0, moved


def claude_env(gateway):
    return {"ANTHROPIC_BASE_URL": gateway.url, "ANTHROPIC_API_KEY": "sk-ant-test"}


def test_claude_code_with_its_defaults_is_compacted_on_later_steps(gateway, agent_upstream, workspace):
    counts = Counts(gateway, agent_upstream)
    out = run([cli("claude"), "-p", "Investigate the notes and report what you find."], workspace, claude_env(gateway))
    assert f"AGENT-DONE steps={STEPS}" in out
    assert_compacted_run(counts.delta(), STEPS)

    # The next session continues the same conversation, now far over the trigger.
    counts = Counts(gateway, agent_upstream)
    out = run([cli("claude"), "-p", "--continue", "Go on."], workspace, claude_env(gateway))
    assert f"AGENT-DONE steps={STEPS}" in out
    moved = counts.delta()
    assert moved["rejections"] == 0, moved["last_rejection"]
    assert moved["summarized"] + moved["reused"] >= 1, moved


@pytest.fixture(scope="module")
def retrieving_gateway(workspace, summarizer):
    """As `gateway`, with retrieval on, before its own agent mock: every step behind a summary,
    that mock's model reads one original through compactor's lookup tool first."""
    upstream = agent_mock(workspace)
    anthropic = f"  - name: anthropic\n    api: anthropic\n    base_url: {upstream.url}/v1\n"
    process = start_compacting(
        upstream,
        summarizer,
        "[{type: tokens, value: 30000}]",
        keep=6,
        summary_max_tokens=1024,
        upstreams=anthropic,
        top_level="  retrieval: {enabled: true}\n",
    )
    yield process, upstream
    process.stop()
    upstream.stop()


def assert_never_sees_lookups(retrieving_gateway, run_cli):
    """`run_cli(gateway)` runs a CLI's whole loop behind summaries the mock's model looks behind:
    it completes, compactor answered lookups, and none came back in the history it sent next."""
    gateway, upstream = retrieving_gateway
    before = metric_total(gateway, "compactor_expansion_rounds_total")
    counts = Counts(gateway, upstream)
    out = run_cli(gateway)
    assert f"AGENT-DONE steps={STEPS}" in out
    assert_compacted_run(counts.delta(), STEPS)
    assert metric_total(gateway, "compactor_expansion_rounds_total") - before >= 1, "the model looked behind the summary"
    seen = get_json(upstream.url + "/mock/stats")
    assert seen["rejections"] == 0, seen["last_rejection"]
    assert seen["lookups_in_client_history"] == 0
    assert "compactor_expand" not in out


def test_claude_code_never_sees_compactors_lookups(retrieving_gateway, workspace):
    assert_never_sees_lookups(
        retrieving_gateway, lambda gateway: run([cli("claude"), "-p", "Investigate the notes and report what you find."], workspace, claude_env(gateway))
    )


def codex(gateway, workspace, *args):
    command = [cli("codex"), "exec", "-c", f"openai_base_url={gateway.url}/v1", *args]
    return run(command, workspace, {"CODEX_API_KEY": "sk-test"})


def test_codex_never_sees_compactors_lookups(retrieving_gateway, workspace):
    """Codex streams every step with reasoning items: a lookup's round is held back and spliced
    out of the stream, and what Codex keeps of it (the reasoning and what the model said) is
    history OpenAI takes back."""
    assert_never_sees_lookups(retrieving_gateway, lambda gateway: codex(gateway, workspace, "Investigate the notes and report what you find."))


def test_the_openai_stream_helper_reads_a_lookup_round_as_one_response(retrieving_gateway, summarizer):
    """openai-python's `responses.stream` checks every event against the response it builds
    (each delta names an item it was given, in order): the lookup's round spliced out of the
    stream leaves one response it accepts, and its output is history the upstream takes back."""
    _, upstream = retrieving_gateway
    # No identifier index: the summary loses the planted fact, and the model looks it up.
    gateway = start_compacting(
        upstream, summarizer, "[{type: tokens, value: 1500}]", keep=4,
        top_level="  identifier_index: 0\n  retrieval: {enabled: true}\n",
    )
    fact = "FACT-9XK2P"
    items = [
        {"role": "user", "content": "Read the notes and remember the code in them."},
        {"type": "function_call", "call_id": "call_notes", "name": "read_file", "arguments": '{"path": "notes/fact.txt"}'},
        {"type": "function_call_output", "call_id": "call_notes", "output": f"the code is {fact}"},
    ]
    for t in range(20):
        items.append({"role": "user", "content": f"question {t}: " + "the parser drops a token " * 12})
        items.append({"role": "assistant", "content": f"answer {t}: " + "the parser drops a token " * 12})
    items.append({"role": "user", "content": "Recall the code in the notes."})
    tools = [{"type": "function", "name": "read_file", "strict": False, "parameters": {"type": "object", "properties": {}}}]
    try:
        before = get_json(upstream.url + "/mock/stats")["rejections"]
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-test")
        with client.responses.stream(
            model="gpt-5-codex", input=items, tools=tools, reasoning={"effort": "low"}, store=False
        ) as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_response()
        assert metric_total(gateway, "compactor_expansion_rounds_total") == 1
        assert kinds.count("response.created") == 1 and kinds.count("response.completed") == 1
        assert final.output_text.endswith(f"Recalled: {fact}"), final.output_text
        assert [item.type for item in final.output] == ["reasoning", "message", "reasoning", "message"]
        history = items + [item.model_dump(exclude_none=True) for item in final.output]
        client.responses.create(model="gpt-5-codex", input=history + [{"role": "user", "content": "Thanks."}], tools=tools)
        seen = get_json(upstream.url + "/mock/stats")
        assert seen["rejections"] == before, seen["last_rejection"]
    finally:
        gateway.stop()


def opencode(gateway, workspace, prompt):
    """`opencode run` with its built-in OpenAI provider (the AI SDK, on the Responses API) pointed
    at compactor, everything else its default; offline: no model list fetched, no update."""
    config = {"provider": {"openai": {"options": {"baseURL": f"{gateway.url}/v1", "apiKey": "sk-test"}}}, "model": "openai/gpt-5"}
    env = {
        "OPENCODE_CONFIG_CONTENT": json.dumps(config),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
    }
    return run([cli("opencode"), "run", prompt], workspace, env)


def test_opencode_with_its_defaults_is_compacted_on_later_steps(gateway, agent_upstream, workspace):
    counts = Counts(gateway, agent_upstream)
    out = opencode(gateway, workspace, "Investigate the notes and report what you find.")
    assert f"AGENT-DONE steps={STEPS}" in out
    assert_compacted_run(counts.delta(), STEPS)


def test_opencode_never_sees_compactors_lookups(retrieving_gateway, workspace):
    assert_never_sees_lookups(retrieving_gateway, lambda gateway: opencode(gateway, workspace, "Investigate the notes and report what you find."))


def test_codex_with_its_built_in_provider_is_compacted_on_later_steps(gateway, agent_upstream, workspace):
    refused_before = metric_total(gateway, "compactor_requests_total", route="other", status="426")
    counts = Counts(gateway, agent_upstream)
    out = codex(gateway, workspace, "Investigate the notes and report what you find.")
    assert f"AGENT-DONE steps={STEPS}" in out
    assert_compacted_run(counts.delta(), STEPS)
    # Its WebSocket transport was refused once with 426 and it went to HTTP straight away
    # (a 404 makes it retry five times).
    assert metric_total(gateway, "compactor_requests_total", route="other", status="426") - refused_before == 1

    counts = Counts(gateway, agent_upstream)
    out = codex(gateway, workspace, "resume", "--last", "Go on.")
    assert f"AGENT-DONE steps={STEPS}" in out
    moved = counts.delta()
    assert moved["rejections"] == 0, moved["last_rejection"]
    assert moved["summarized"] + moved["reused"] >= 1, moved


@pytest.fixture(scope="module")
def plain_agent_upstream(workspace):
    """The agent mock as a Responses server without OpenAI's compaction contract (vLLM, SGLang):
    it refuses a `compaction` item and answers a `compaction_trigger` as an ordinary turn."""
    process = agent_mock(workspace, "--without-native-compaction")
    yield process
    process.stop()


@pytest.mark.parametrize(
    "codex, flags, compact_calls",  # compact_calls: at least that many, or none at all
    [
        # Codex 0.171: a `/responses` request ending with a `compaction_trigger` item.
        ("codex", [], 0),
        # Codex 0.150 with v2 off: `POST /responses/compact`, whose output replaces the history.
        ("codex-v1", ["--disable", "remote_compaction_v2"], 1),
    ],
    ids=["v2-trigger", "v1-compact-endpoint"],
)
def test_codex_remote_compaction_is_served_for_an_upstream_without_it(
    plain_agent_upstream, summarizer, workspace, codex, flags, compact_calls
):
    """Codex's built-in provider compacts remotely once its context passes
    `model_auto_compact_token_limit`: v2 with a trigger item, which must be answered with exactly
    one compaction item, v1 with a compact call. Against an upstream without the contract it
    stops ("expected exactly one compaction output item", or the compact call's 404); through
    compactor with sealing keys it runs to the end, and every later turn carries the item,
    expanded before the upstream."""
    sealing = "sealing:\n  keys: ['a sealing key, 16 bytes or more']\n"
    gateway = start_compacting(
        plain_agent_upstream, summarizer, "[{type: tokens, value: 60000}]", keep=6, top_level=sealing, log_level="info"
    )
    try:
        served_before = metric_total(gateway, "compactor_requests_total", route="local", status="200")
        counts = Counts(gateway, plain_agent_upstream)
        out = run(
            [cli(codex), *flags, "exec", "-c", f"openai_base_url={gateway.url}/v1", "-c", "model_auto_compact_token_limit=40000",
             "Investigate the notes and report what you find."],
            workspace,
            {"CODEX_API_KEY": "sk-test"},
        )
        assert f"AGENT-DONE steps={STEPS}" in out
        moved = counts.delta()
        assert moved["rejections"] == 0, f"the upstream refused a request: {moved['last_rejection']}"
        served = metric_total(gateway, "compactor_requests_total", route="local", status="200") - served_before
        assert served >= 2, served
        gateway.log.seek(0)
        compacts = gateway.log.read().count('path="/v1/responses/compact"')
        if compact_calls:
            assert compacts >= compact_calls, "Codex never called /responses/compact"
        else:
            assert compacts == 0, compacts
    finally:
        gateway.stop()


def test_the_loop_runs_going_direct_too(agent_upstream, workspace):
    """The same run straight at the mock: the loop and the validation hold without compactor."""
    before = get_json(agent_upstream.url + "/mock/stats")["rejections"]
    out = run(
        [cli("claude"), "-p", "Investigate the notes."],
        workspace,
        {"ANTHROPIC_BASE_URL": agent_upstream.url, "ANTHROPIC_API_KEY": "sk-ant-test"},
    )
    assert f"AGENT-DONE steps={STEPS}" in out
    assert get_json(agent_upstream.url + "/mock/stats")["rejections"] == before
