"""Google's google-genai SDK and the Gemini CLI through compactor, unchanged: Gemini's model calls
are claimed by their whole path and go to an `api: gemini` upstream with its own key, whole and
streamed; past the trigger their conversations are compacted, summaries made by that same
upstream (`generateContent`), thought signatures intact."""

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest
from google import genai
from google.genai import types

from conftest import BIN_DIR, ROOT, Process, get_json, metric_total, start_compactor

# The Gemini CLI, pinned in tests/agents/package.json (scripts/test.sh installs it).
GEMINI_CLI = ROOT / "tests" / "agents" / "node_modules" / ".bin" / "gemini"
MODEL = "gemini-2.5-flash"
REPLY = "Hello from Gemini."


@pytest.fixture(scope="module")
def gemini_proxy(mock_upstream):
    # The mock's OpenAI face first, so nothing reaches the Gemini upstream by being first.
    extra = (
        "  - name: gemini\n"
        "    api: gemini\n"
        f"    base_url: {mock_upstream.url}\n"
        "    api_key: g-upstream\n"
    )
    process = start_compactor(mock_upstream.url, extra=extra)
    yield process
    process.stop()


def rejections(mock_upstream):
    with urllib.request.urlopen(f"{mock_upstream.url}/mock/stats", timeout=10) as response:
        return json.load(response)["rejections"]


def client(url):
    # The client's own key is replaced by the upstream's: the mock refuses a call without one.
    return genai.Client(
        api_key="client-key",
        http_options=types.HttpOptions(base_url=url, timeout=20_000),
    )


def run_gemini_cli(proxy_url, tmp_path, *args, cwd=None):
    """The Gemini CLI headless with its defaults (JSON output), pointed at compactor with an API
    key: a home of its own whose settings choose the key (headless mode needs that besides the
    environment), no Google variable of the machine's."""
    if not GEMINI_CLI.exists():
        pytest.fail(f"{GEMINI_CLI} is missing: scripts/test.sh installs the agent CLIs (npm in tests/agents)")
    home = tmp_path / "home"
    (home / ".gemini").mkdir(parents=True)
    settings = {"security": {"auth": {"selectedType": "gemini-api-key"}}}
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    work = cwd or tmp_path / "work"
    Path(work).mkdir(exist_ok=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("GEMINI_", "GOOGLE_"))}
    env.update(
        HOME=str(home),
        GEMINI_CLI_TRUST_WORKSPACE="true",
        GOOGLE_GEMINI_BASE_URL=proxy_url,
        GEMINI_API_KEY="client-key",
    )
    return subprocess.run(
        [str(GEMINI_CLI), *args, "-o", "json"], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )


def test_generate_content_whole_and_streamed(gemini_proxy, mock_upstream):
    before = rejections(mock_upstream)
    gemini = client(gemini_proxy.url)
    whole = gemini.models.generate_content(model=MODEL, contents="hi")
    assert whole.text == REPLY
    assert whole.usage_metadata.prompt_token_count == 10, "a quarter of the turns' JSON"
    streamed = "".join(
        chunk.text or "" for chunk in gemini.models.generate_content_stream(model=MODEL, contents="hi")
    )
    assert streamed == REPLY
    assert rejections(mock_upstream) == before


def test_a_function_call_turn_goes_through(gemini_proxy, mock_upstream):
    before = rejections(mock_upstream)
    contents = [
        types.Content(role="user", parts=[types.Part(text="weather in Paris?")]),
        types.Content(
            role="model",
            parts=[types.Part(function_call=types.FunctionCall(name="get_weather", args={"city": "Paris"}))],
        ),
        types.Content(
            role="user",
            parts=[
                types.Part(
                    function_response=types.FunctionResponse(name="get_weather", response={"temp": 21})
                )
            ],
        ),
    ]
    gemini = client(gemini_proxy.url)
    reply = gemini.models.generate_content(model=MODEL, contents=contents)
    assert reply.text == REPLY
    assert rejections(mock_upstream) == before


def test_the_gemini_cli_answers_through_compactor_with_its_defaults(gemini_proxy, mock_upstream, tmp_path):
    """Gemini CLI 0.61.0 headless, its defaults: a routing call (JSON-schema output) then the
    streamed agent turn, both through compactor to the mock with the upstream's key."""
    before = rejections(mock_upstream)
    run = run_gemini_cli(gemini_proxy.url, tmp_path, "-p", "say hi")
    assert run.returncode == 0, run.stderr[-3000:]
    output = json.loads(run.stdout)
    assert output["response"] == REPLY
    calls = output["stats"]["models"].values()
    assert sum(model["api"]["totalErrors"] for model in calls) == 0
    assert sum(model["api"]["totalRequests"] for model in calls) >= 2, "routing, then the turn"
    assert rejections(mock_upstream) == before


@pytest.fixture(scope="module")
def compacting_gemini(mock_upstream):
    extra = (
        "  - name: gemini\n"
        "    api: gemini\n"
        f"    base_url: {mock_upstream.url}\n"
        "    api_key: g-upstream\n"
    )
    process = start_compactor(mock_upstream.url, extra=extra, summarization=GEMINI_COMPACTION)
    yield process
    process.stop()


def long_function_calling_history(steps):
    """A task, then `steps` model turns calling `read_file` (twice every third) each answered by
    its responses, about 2 000 tokens a step."""
    contents = [types.Content(role="user", parts=[types.Part(text="Find where the parser fails.")])]
    for step in range(steps):
        files = [f"src/f{step}_{k}.rs" for k in range(2 if step % 3 == 2 else 1)]
        contents.append(
            types.Content(
                role="model",
                parts=[
                    types.Part(function_call=types.FunctionCall(name="read_file", args={"path": path}))
                    for path in files
                ],
            )
        )
        contents.append(
            types.Content(
                role="user",
                parts=[
                    types.Part(
                        function_response=types.FunctionResponse(
                            name="read_file", response={"output": f"// {path}\n" + "fn parse() {}\n" * 500}
                        )
                    )
                    for path in files
                ],
            )
        )
    return contents


def test_google_genai_long_histories_are_compacted_whole_and_streamed(compacting_gemini, mock_upstream):
    """Past the trigger, google-genai's function-calling history is summarized (by the Gemini
    upstream itself) then the summary reused, whole and streamed; the SDK reads every answer as
    it would from Google, and Google's rules hold for every request."""
    before = rejections(mock_upstream)
    counted = lambda outcome: metric_total(compacting_gemini, "compactor_compactions_total", outcome=outcome)
    gemini = client(compacting_gemini.url)
    config = types.GenerateContentConfig(
        system_instruction="You are a careful engineer.",
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(name="read_file", description="Reads a file.")])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    whole = gemini.models.generate_content(model=MODEL, contents=long_function_calling_history(14), config=config)
    assert whole.text == REPLY
    assert counted("summarized") == 1
    streamed = "".join(
        chunk.text or ""
        for chunk in gemini.models.generate_content_stream(
            model=MODEL, contents=long_function_calling_history(15), config=config
        )
    )
    assert streamed == REPLY
    assert counted("reused") == 1
    assert counted("failed") == 0
    assert rejections(mock_upstream) == before


AGENT_STEPS = 25


# As a user with only a Gemini key runs it: summaries by the same upstream and model.
GEMINI_COMPACTION = """\
summarization:
  enabled: true
  trigger: [{type: tokens, value: 20000}]
  keep: {type: messages, value: 6}
  summary_max_tokens: 1024
"""


@pytest.fixture(scope="module")
def gemini_agent(tmp_path_factory):
    """The mock in agent mode (it plays the model behind the CLI: each step reads a note with the
    CLI's `read_file`, every third step two at once, the first call of a turn signed) and
    compactor in front of it, Gemini upstream with its own key, compaction on."""
    notes = tmp_path_factory.mktemp("notes")
    for n in range(8):
        (notes / f"note_{n}.md").write_text(f"note {n}: the trail goes on. " * 300)
    mock = Process([
        str(BIN_DIR / "mock-upstream"), "--listen", "127.0.0.1:0", "--mode", "agent",
        "--agent-steps", str(AGENT_STEPS), "--agent-files", str(notes),
    ])
    extra = (
        "  - name: gemini\n"
        "    api: gemini\n"
        f"    base_url: {mock.url}\n"
        "    api_key: g-upstream\n"
    )
    proxy = start_compactor(mock.url, extra=extra, summarization=GEMINI_COMPACTION)
    yield mock, proxy, notes
    proxy.stop()
    mock.stop()


def test_the_gemini_cli_runs_a_tool_loop_through_compactor_compacted(gemini_agent, tmp_path):
    """25 tool steps, parallel calls every third, each model turn's first call signed, the history
    past the trigger from the middle of the loop on: summarized, then the summary reused, and
    every request accepted by the mock, which refuses what Google refuses (a call not answered
    one for one, a response or call out of place, a signature lost or altered in the active
    loop)."""
    mock, proxy, notes = gemini_agent
    counted = lambda outcome: metric_total(proxy, "compactor_compactions_total", outcome=outcome)
    prompt = "Read the notes and follow the trail."
    run = run_gemini_cli(proxy.url, tmp_path, "--yolo", "-p", prompt, cwd=notes)
    assert run.returncode == 0, run.stderr[-3000:]
    output = json.loads(run.stdout)
    assert output["response"] == f"AGENT-DONE steps={AGENT_STEPS}"
    calls = output["stats"]["models"].values()
    assert sum(model["api"]["totalErrors"] for model in calls) == 0
    # One request per step, the last one answered with text, and the routing call.
    assert sum(model["api"]["totalRequests"] for model in calls) == AGENT_STEPS + 2
    assert output["stats"]["tools"]["totalCalls"] > AGENT_STEPS, "parallel calls ran"
    stats = get_json(f"{mock.url}/mock/stats")
    assert stats["rejections"] == 0, stats["last_rejection"]
    assert counted("summarized") >= 1
    assert counted("reused") >= 1
    assert counted("failed") == 0



def test_the_gemini_cli_never_sees_compactors_lookups(gemini_agent, tmp_path):
    """The same loop with retrieval on: behind a summary, the mock's model reads one original
    through compactor's lookup tool at every step, signed as Google signs a call. The CLI
    makes the same requests and never gets a call of a tool it does not have."""
    mock, _, notes = gemini_agent
    extra = (
        "  - name: gemini\n"
        "    api: gemini\n"
        f"    base_url: {mock.url}\n"
        "    api_key: g-upstream\n"
    )
    proxy = start_compactor(mock.url, extra=extra, summarization=GEMINI_COMPACTION + "  retrieval: {enabled: true}\n")
    try:
        run = run_gemini_cli(proxy.url, tmp_path, "--yolo", "-p", "Read the notes and follow the trail.", cwd=notes)
        assert run.returncode == 0, run.stderr[-3000:]
        output = json.loads(run.stdout)
        # What the model said before its last lookup reached the CLI, as it would have.
        assert output["response"].endswith(f"AGENT-DONE steps={AGENT_STEPS}"), output["response"]
        calls = output["stats"]["models"].values()
        assert sum(model["api"]["totalErrors"] for model in calls) == 0
        assert sum(model["api"]["totalRequests"] for model in calls) == AGENT_STEPS + 2
        assert metric_total(proxy, "compactor_expansion_rounds_total") >= 1, "the model looked behind the summary"
        stats = get_json(f"{mock.url}/mock/stats")
        assert stats["rejections"] == 0, stats["last_rejection"]
        assert stats["lookups_in_client_history"] == 0
        assert "compactor_expand" not in run.stdout
    finally:
        proxy.stop()
