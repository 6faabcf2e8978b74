"""OpenAI's compaction contract (`client.responses.compact`) served by compactor for an upstream
that lacks it: the mock runs `--without-native-compaction`, so it answers `/responses/compact`
with 404 and refuses a `compaction` input item, as vLLM or SGLang would. compactor answers the
call, seals the summary into the one compaction item, and expands that item on later turns."""

import json
import socket
import textwrap

import anthropic
import openai
from anthropic.types.beta import BetaMessage
import pytest
from openai.types.responses import Response, ResponseCompactionItem, ResponseUsage

from conftest import BIN_DIR, Process, start_compactor
from test_messages import TOOLS, agent_run

MODEL = "gpt-4.1"
KEY = "a sealing key, 16 bytes or more"
OLD_KEY = "the key sealed before a rotation"


@pytest.fixture(scope="module")
def plain_upstream():
    process = Process([str(BIN_DIR / "mock-upstream"), "--listen", "127.0.0.1:0", "--without-native-compaction"])
    yield process
    process.stop()


def serving(upstream, summarizer_url, keys, mode=None, auth="", limits=""):
    """compactor in front of `upstream` with sealing `keys`; `mode` sets its native_compaction,
    `auth` is an `auth:` block, `limits` more `summarization` lines."""
    summarization = textwrap.dedent(
        f"""\
        summarization:
          enabled: true
          upstream: summarizer
          model_name: summarizer-model
          trigger: [{{type: messages, value: 8}}]
          keep: {{type: messages, value: 2}}
          summary_max_tokens: 32
          {limits}
        sealing:
          keys: {keys!r}
        """
    ) + auth
    extra = f"  - name: summarizer\n    base_url: {summarizer_url}/v1\n    models: [\"summarizer-*\"]\n"
    if mode:
        extra = f"    native_compaction: {mode}\n" + extra
    return start_compactor(upstream.url, summarization=summarization, extra=extra)


@pytest.fixture(scope="module")
def proxy(plain_upstream, summarizer):
    process = serving(plain_upstream, summarizer.url, [KEY])
    yield process
    process.stop()


def client(process, api_key="sk-test"):
    return openai.OpenAI(base_url=process.url + "/v1", api_key=api_key, max_retries=0, timeout=20)


def history(tag):
    items = [{"role": "developer", "content": "Work carefully."}]
    for i in range(4):
        items.append({"role": "user", "content": f"{tag}: task {i}"})
        items.append({"type": "function_call", "call_id": f"call_{tag}_{i}", "name": "read", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"call_{tag}_{i}", "output": "contents " * 20})
        items.append({"role": "assistant", "content": [{"type": "output_text", "text": f"done {i}"}]})
    return items


def compact(process, tag, api_key="sk-test"):
    raw = client(process, api_key).responses.with_raw_response.compact(model=MODEL, input=history(tag))
    return raw.http_response.json()


def compaction_items(output):
    return [item for item in output if item.get("type") == "compaction"]


def test_compact_answers_in_openais_shape_with_exactly_one_compaction_item(proxy):
    compacted = client(proxy).responses.compact(model=MODEL, input=history("shape"))
    assert compacted.object == "response.compaction"
    raw = compact(proxy, "shape-raw")
    (item,) = compaction_items(raw["output"])
    ResponseCompactionItem.model_validate(item, strict=True)
    ResponseUsage.model_validate(raw["usage"], strict=True)
    assert raw["id"].startswith("resp_") and isinstance(raw["created_at"], int)
    # The summary is sealed: nothing of it is readable in the item.
    assert item["encrypted_content"].startswith("compactor.v1.")
    assert "task" not in item["encrypted_content"]
    # As OpenAI's: the client's own messages (the developer item, the kept user turns), then the
    # one item, which carries the rest of the kept tail (Codex keeps only messages and the item).
    assert raw["output"][0] == {"role": "developer", "content": "Work carefully."}
    assert raw["output"][-1] is item
    assert all(i.get("role") in ("developer", "user") for i in raw["output"][:-1])
    assert len(raw["output"]) < len(history("shape-raw"))


def test_the_next_turn_with_the_item_is_expanded_before_the_upstream_sees_it(proxy, plain_upstream):
    output = compact(proxy, "next")["output"]
    next_turn = output + [{"role": "user", "content": "go on"}]
    # The upstream itself refuses the item: only the expansion lets the turn through.
    with pytest.raises(openai.BadRequestError, match="compaction"):
        openai.OpenAI(base_url=plain_upstream.url + "/v1", api_key="sk-test", max_retries=0).responses.create(
            model=MODEL, input=next_turn
        )
    answer = client(proxy).responses.create(model=MODEL, input=next_turn)
    assert answer.output_text
    streamed = client(proxy).responses.create(model=MODEL, input=next_turn, stream=True)
    assert [event.type for event in streamed][-1] == "response.completed"


def test_an_altered_item_is_refused_a_rotated_token_keeps_its_items_and_a_foreign_one_passes(proxy):
    output = compact(proxy, "tamper")["output"]
    (item,) = compaction_items(output)
    sealed = item["encrypted_content"]
    altered = dict(item, encrypted_content=sealed[:-3] + ("AAA" if not sealed.endswith("AAA") else "BBB"))
    turn = [altered if i is item else i for i in output]
    with pytest.raises(openai.BadRequestError) as refused:
        client(proxy).responses.create(model=MODEL, input=turn + [{"role": "user", "content": "q"}])
    assert refused.value.code == "invalid_compaction_item"
    # With auth off the item is bound to the deployment: a client whose token rotated goes on.
    rotated = client(proxy, "sk-rotated").responses.create(model=MODEL, input=output + [{"role": "user", "content": "q"}])
    assert rotated.output_text
    # An item compactor did not seal (the provider's own) goes on untouched: here the upstream,
    # which does not know the type, is the one that refuses it.
    foreign = [{"type": "compaction", "id": "cmp_x", "encrypted_content": "gAAAAABforeign"}]
    with pytest.raises(openai.BadRequestError, match="does not support the input item type"):
        client(proxy).responses.create(model=MODEL, input=foreign + [{"role": "user", "content": "q"}])


def test_with_auth_an_item_opens_for_its_key_whatever_its_secret_and_for_no_other_key(plain_upstream, summarizer):
    keys = lambda team_secret: (
        "auth:\n  keys:\n"
        f"    - name: team\n      key: {team_secret}\n"
        "    - name: other\n      key: sk-other\n"
    )
    before = serving(plain_upstream, summarizer.url, [KEY], auth=keys("sk-team-2025"))
    try:
        output = compact(before, "keyed", api_key="sk-team-2025")["output"]
    finally:
        before.stop()
    turn = output + [{"role": "user", "content": "go on"}]
    # The operator rotates the team's secret: the key's name is what the item is bound to.
    after = serving(plain_upstream, summarizer.url, [KEY], auth=keys("sk-team-2026"))
    try:
        assert client(after, "sk-team-2026").responses.create(model=MODEL, input=turn).output_text
        with pytest.raises(openai.BadRequestError) as refused:
            client(after, "sk-other").responses.create(model=MODEL, input=turn)
        assert refused.value.code == "invalid_compaction_item"
    finally:
        after.stop()


def test_items_sealed_before_a_key_rotation_still_open(plain_upstream, summarizer):
    before = serving(plain_upstream, summarizer.url, [OLD_KEY])
    try:
        output = compact(before, "rotation")["output"]
    finally:
        before.stop()
    turn = output + [{"role": "user", "content": "go on"}]
    rotated = serving(plain_upstream, summarizer.url, [KEY, OLD_KEY])
    dropped = serving(plain_upstream, summarizer.url, [KEY])
    try:
        assert client(rotated).responses.create(model=MODEL, input=turn).output_text
        with pytest.raises(openai.BadRequestError):
            client(dropped).responses.create(model=MODEL, input=turn)
    finally:
        rotated.stop()
        dropped.stop()


def test_a_failed_summary_is_an_error_in_openais_shape_never_a_fake_compaction(plain_upstream):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    process = serving(plain_upstream, dead, [KEY])
    try:
        with pytest.raises(openai.APIStatusError) as failed:
            client(process).responses.compact(model=MODEL, input=history("down"))
        assert failed.value.status_code == 502
        assert failed.value.code == "compaction_failed"
        # `context_management` without a threshold did not ask for a compaction: with no summary
        # to be had, the request still goes through (once), as any request does, with no item.
        raw = client(process).responses.with_raw_response.create(
            model=MODEL, input=history("down-managed"), context_management=[{"type": "compaction"}]
        )
        assert raw.headers["x-compactor-compaction"] == "failed"
        assert compaction_items(raw.http_response.json()["output"]) == []
        assert raw.parse().output_text
    finally:
        process.stop()


def test_compact_is_passed_to_an_upstream_marked_pass(plain_upstream, summarizer):
    process = serving(plain_upstream, summarizer.url, [KEY], mode="pass")
    try:
        with pytest.raises(openai.NotFoundError):
            client(process).responses.compact(model=MODEL, input=history("pass"))
    finally:
        process.stop()


def test_a_trigger_item_is_answered_with_exactly_one_compaction_item_streamed_or_not(proxy):
    """Codex's remote compaction v2: `/responses` with a trailing `compaction_trigger` item."""
    items = history("trigger") + [{"type": "compaction_trigger"}]
    raw = client(proxy).responses.with_raw_response.create(model=MODEL, input=items)
    body = raw.http_response.json()
    Response.model_validate(body, strict=True)
    (item,) = body["output"]
    ResponseCompactionItem.model_validate(item, strict=True)

    events = list(client(proxy).responses.create(model=MODEL, input=items, stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    done = [event.item for event in events if event.type == "response.output_item.done"]
    assert [item.type for item in done] == ["compaction"]
    assert events[-1].response.output[0].encrypted_content == done[0].encrypted_content

    # The client keeps its instructions and user turns and puts the item after them, as Codex
    # does; the item brings back the summary and the rest of the kept tail.
    kept = [i for i in history("trigger") if i.get("role") in ("developer", "user")]
    next_turn = kept + [done[0].model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
    assert client(proxy).responses.create(model=MODEL, input=next_turn).output_text


def test_a_served_compaction_says_what_it_did_in_the_usual_headers(proxy):
    raw = client(proxy).responses.with_raw_response.compact(model=MODEL, input=history("headers"))
    assert raw.headers["x-compactor-compaction"] in ("summarized", "reused")
    assert int(raw.headers["x-compactor-tokens-after"]) < int(raw.headers["x-compactor-tokens-before"])


# Anthropic's `compact_20260112` edit, for an Anthropic-compatible upstream without it (the mock
# with `--without-native-compaction` refuses the edit and a `compaction` block, as LiteLLM's or
# vLLM's Messages endpoints do).

CLAUDE = "claude-sonnet-4-5"
BETAS = ["compact-2026-01-12"]


def claude(process, api_key="sk-ant-test"):
    return anthropic.Anthropic(base_url=process.url, api_key=api_key, max_retries=0, timeout=20)


def edit(pause, trigger=100):
    return {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": trigger}, "pause_after_compaction": pause}]}


def test_a_paused_compaction_is_answered_in_anthropics_shape_streamed_or_not(proxy):
    run = agent_run(5)
    raw = claude(proxy).beta.messages.with_raw_response.create(
        model=CLAUDE, max_tokens=100, tools=TOOLS, messages=run, betas=BETAS, context_management=edit(True)
    )
    body = raw.http_response.json()
    BetaMessage.model_validate(body, strict=True)
    assert body["stop_reason"] == "compaction"
    (block,) = body["content"]
    assert block["type"] == "compaction" and block["content"]
    assert block["encrypted_content"].startswith("compactor.v1.")
    (iteration,) = body["usage"]["iterations"]
    assert iteration["type"] == "compaction"
    # The entry is what the summarizer calls cost: something when one ran for this request.
    summarized = raw.headers["x-compactor-compaction"] == "summarized"
    assert (iteration["input_tokens"] > 0) == summarized

    with claude(proxy).beta.messages.stream(
        model=CLAUDE, max_tokens=100, tools=TOOLS, messages=run, betas=BETAS, context_management=edit(True)
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "compaction"
    assert [b.type for b in final.content] == ["compaction"]
    assert final.content[0].content == block["content"]

    # The next turn sends the block back; the upstream, which refuses it, gets what it carries.
    next_turn = run + [{"role": "assistant", "content": [block]}, {"role": "user", "content": "go on"}]
    answer = claude(proxy).beta.messages.create(
        model=CLAUDE, max_tokens=100, tools=TOOLS, messages=next_turn, betas=BETAS, context_management=edit(True, 10**6)
    )
    assert answer.stop_reason == "end_turn"


def test_without_pause_the_upstreams_answer_comes_with_the_block_first_streamed_or_not(proxy):
    run = agent_run(5)
    raw = claude(proxy).beta.messages.with_raw_response.create(
        model=CLAUDE, max_tokens=100, tools=TOOLS, messages=run, betas=BETAS, context_management=edit(False)
    )
    assert raw.headers["x-compactor-compaction"] in ("summarized", "reused")
    body = raw.http_response.json()
    BetaMessage.model_validate(body, strict=True)
    assert [block["type"] for block in body["content"]] == ["compaction", "text"]
    assert body["stop_reason"] == "end_turn"
    # The compaction's cost, then the upstream's sampling, which clients size their context
    # from; the top-level counts stay the upstream's.
    usage = body["usage"]
    compaction, sampling = usage["iterations"]
    assert compaction["type"] == "compaction" and sampling["type"] == "message"
    assert (sampling["input_tokens"], sampling["output_tokens"]) == (usage["input_tokens"], usage["output_tokens"])

    with claude(proxy).beta.messages.stream(
        model=CLAUDE, max_tokens=100, tools=TOOLS, messages=run, betas=BETAS, context_management=edit(False)
    ) as stream:
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["compaction", "text"]
    assert final.content[1].text == body["content"][1]["text"]
    assert [entry.type for entry in final.usage.iterations] == ["compaction", "message"]
    assert final.usage.iterations[1].input_tokens == final.usage.input_tokens > 0
    assert final.usage.iterations[1].output_tokens == final.usage.output_tokens

    # The answer, block included, goes back as the assistant turn.
    turn = [block.model_dump(exclude_none=True) for block in final.content]
    next_turn = run + [{"role": "assistant", "content": turn}, {"role": "user", "content": "go on"}]
    answer = claude(proxy).beta.messages.create(
        model=CLAUDE, max_tokens=100, tools=TOOLS, messages=next_turn, betas=BETAS, context_management=edit(False, 10**6)
    )
    assert answer.content  # the upstream, which refuses the block, accepted what it carries


def test_the_edits_instructions_write_the_summary(proxy):
    """`instructions` replace the summarization prompt: the summarizer writes to them (the
    mock's summary is a digest of its prompt), and a summary written to other instructions is
    never reused for them."""
    run = agent_run(5)

    def summary(instructions=None):
        management = edit(True)
        if instructions:
            management["edits"][0]["instructions"] = instructions
        raw = claude(proxy).beta.messages.with_raw_response.create(
            model=CLAUDE, max_tokens=100, tools=TOOLS, messages=run, betas=BETAS, context_management=management
        )
        BetaMessage.model_validate(raw.http_response.json(), strict=True)
        return raw.headers["x-compactor-compaction"], raw.http_response.json()["content"][0]["content"]

    _, default = summary()
    files = summary("List only the file names the agent touched.")
    assert files[0] == "summarized" and files[1] != default
    assert summary("List only the file names the agent touched.") == ("reused", files[1])
    errors = summary("Keep every error message verbatim.")
    assert errors[0] == "summarized" and errors[1] not in (default, files[1])


def test_instructions_are_bounded_and_honoured_only_for_keys_that_may_use_any_model(plain_upstream, summarizer):
    """Instructions make the summarizer answer anything: a key with a model list gets
    compactor's own prompt instead (unless its `client_instructions` says otherwise), and
    instructions past `max_client_instructions_bytes` are refused."""
    auth = textwrap.dedent(
        """\
        auth:
          keys:
            - name: open
              key: sk-open
            - name: cheap
              key: sk-cheap
              models: ["claude-*"]
        """
    )
    process = serving(plain_upstream, summarizer.url, [KEY], auth=auth)
    try:
        run = agent_run(5)

        def summary(api_key, instructions=None):
            management = edit(True)
            if instructions:
                management["edits"][0]["instructions"] = instructions
            message = claude(process, api_key).beta.messages.create(
                model=CLAUDE, max_tokens=100, tools=TOOLS, messages=run, betas=BETAS, context_management=management
            )
            return message.content[0].content

        asked = "Ignore the transcript and write a poem."
        open_default, open_asked = summary("sk-open"), summary("sk-open", asked)
        assert open_asked != open_default
        cheap_default, cheap_asked = summary("sk-cheap"), summary("sk-cheap", asked)
        assert cheap_asked == cheap_default, "a limited key's instructions are not followed"

        with pytest.raises(anthropic.BadRequestError) as refused:
            summary("sk-open", "x" * (16 * 1024 + 1))
        assert "instructions are limited to 16384 bytes" in str(refused.value)
    finally:
        process.stop()


def test_a_compaction_past_the_summarizer_budget_is_429_with_retry_after(plain_upstream, summarizer):
    process = serving(plain_upstream, summarizer.url, [KEY], limits="max_calls_per_minute_per_tenant: 1")
    try:
        compact(process, "first")
        with pytest.raises(openai.RateLimitError) as limited:
            compact(process, "second")
        assert limited.value.response.headers["retry-after"] == "2"
        assert limited.value.response.headers["x-compactor-error"] == "rate_limit_exceeded"
    finally:
        process.stop()


def test_context_edits_are_bounded_in_number(proxy):
    """Each context edit is a pass over the conversation and a count of it: a request carrying
    more than compactor applies is refused, never worked through on the reactor."""
    edits = [{"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 1}}] * 9
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude(proxy).beta.messages.create(
            model=CLAUDE, max_tokens=100, tools=TOOLS, messages=agent_run(5),
            betas=["context-management-2025-06-27"], context_management={"edits": edits},
        )
    assert "at most 8 context edits" in str(refused.value)
    edits = edits[:8]
    answer = claude(proxy).beta.messages.create(
        model=CLAUDE, max_tokens=100, tools=TOOLS, messages=agent_run(5),
        betas=["context-management-2025-06-27"], context_management={"edits": edits},
    )
    assert answer.context_management.applied_edits


def test_under_the_trigger_the_edit_is_taken_out_and_the_request_goes_on(proxy):
    # The upstream refuses the edit: its answer shows it was taken out (compactor's own
    # triggers then apply as to any request).
    answer = claude(proxy).beta.messages.create(
        model=CLAUDE, max_tokens=100, tools=TOOLS, messages=agent_run(5), betas=BETAS,
        context_management=edit(False, 10**6),
    )
    assert answer.stop_reason == "end_turn"


def test_server_side_compaction_puts_one_item_first_in_the_answer_streamed_or_not(proxy):
    """`context_management: [{type: compaction, compact_threshold}]` on `/responses`, for an
    upstream that refuses the parameter and the item."""
    items = history("managed")
    management = [{"type": "compaction", "compact_threshold": 100}]
    raw = client(proxy).responses.with_raw_response.create(model=MODEL, input=items, context_management=management)
    assert raw.headers["x-compactor-compaction"] in ("summarized", "reused")
    body = raw.http_response.json()
    Response.model_validate(body, strict=True)
    ResponseCompactionItem.model_validate(body["output"][0], strict=True)
    assert len(compaction_items(body["output"])) == 1
    assert raw.parse().output_text

    events = list(client(proxy).responses.create(model=MODEL, input=items, context_management=management, stream=True))
    assert [event.sequence_number for event in events] == list(range(len(events)))
    done = [event.item.type for event in events if event.type == "response.output_item.done"]
    assert done[0] == "compaction" and done.count("compaction") == 1
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[0].type == "compaction"
    assert events[-1].response.output_text == raw.parse().output_text

    # The client keeps everything and appends the answer; the item stands for all before it.
    next_turn = items + body["output"] + [{"role": "user", "content": "go on"}]
    again = client(proxy).responses.create(model=MODEL, input=next_turn, context_management=[{"type": "compaction", "compact_threshold": 10**6}])
    assert again.output_text


def test_without_a_threshold_compactors_triggers_decide_and_the_item_follows(proxy):
    """No `compact_threshold`: the provider would decide when; compactor's own triggers do
    (8 messages here), and the summary they call for is the item the client gets."""
    management = [{"type": "compaction"}]
    raw = client(proxy).responses.with_raw_response.create(model=MODEL, input=history("untriggered"), context_management=management)
    assert raw.headers["x-compactor-compaction"] in ("summarized", "reused")
    output = raw.http_response.json()["output"]
    assert output[0]["type"] == "compaction" and len(compaction_items(output)) == 1

    short = [{"role": "user", "content": "hello"}]
    raw = client(proxy).responses.with_raw_response.create(model=MODEL, input=short, context_management=management)
    assert raw.headers["x-compactor-compaction"] == "skipped"
    assert compaction_items(raw.http_response.json()["output"]) == []
    assert raw.parse().output_text  # the upstream, which refuses the parameter, never saw it


def test_context_editing_is_applied_for_an_upstream_without_it_and_reported(proxy):
    """`clear_tool_uses_20250919` and `clear_thinking_20251015`, which the upstream refuses:
    applied by compactor, reported in `context_management.applied_edits`, streamed or not."""
    clear = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 2}, "keep": {"type": "tool_uses", "value": 1}}]}
    betas = ["context-management-2025-06-27"]
    run = agent_run(5)
    for message in run[2::2]:
        message["content"][0]["content"] = "fn main() {}\n" * 40
    raw = claude(proxy).beta.messages.with_raw_response.create(
        model=CLAUDE, max_tokens=100, tools=TOOLS, messages=run, betas=betas, context_management=clear
    )
    message = raw.parse()
    (applied,) = message.context_management.applied_edits
    assert applied.type == "clear_tool_uses_20250919"
    assert applied.cleared_tool_uses == 4
    assert applied.cleared_input_tokens > 0

    with claude(proxy).beta.messages.stream(
        model=CLAUDE, max_tokens=100, tools=TOOLS, messages=run, betas=betas, context_management=clear
    ) as stream:
        final = stream.get_final_message()
    assert final.context_management.applied_edits[0].cleared_tool_uses == 4
    assert final.content[0].text == message.content[0].text

    # Under the edit's trigger nothing is cleared or reported, and the edit still never reaches
    # the upstream.
    quiet = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 99}}]}
    untouched = claude(proxy).beta.messages.create(
        model=CLAUDE, max_tokens=100, tools=TOOLS, messages=run, betas=betas, context_management=quiet
    )
    assert untouched.context_management is None


def test_turns_after_a_compaction_block_keep_a_byte_identical_prefix(proxy):
    """What the block expands into is the same bytes every turn, so provider caches keep hitting."""
    run = agent_run(5)
    paused = claude(proxy).beta.messages.create(
        model=CLAUDE, max_tokens=100, tools=TOOLS, messages=run, betas=BETAS, context_management=edit(True)
    )
    block = paused.content[0].model_dump(exclude_none=True)
    history = run + [{"role": "assistant", "content": [block]}, {"role": "user", "content": "go on"}]
    echo = anthropic.Anthropic(
        base_url=proxy.url, api_key="sk-ant-test", max_retries=0, timeout=20, default_headers={"x-mock-mode": "echo"}
    )

    def forwarded(messages):
        answer = echo.beta.messages.create(
            model=CLAUDE, max_tokens=100, tools=TOOLS, messages=messages, betas=BETAS,
            context_management=edit(True, 10**6),
        )
        return answer.content[0].text

    first = forwarded(history)
    second = forwarded(history + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}])
    assert "compaction" not in first and "context_management" not in first
    assert json.loads(first)["messages"][0]["content"][0]["text"].startswith("Here is a summary")
    assert second.startswith(first[: first.rindex("]")])
