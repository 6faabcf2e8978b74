"""Anthropic's Messages API through compactor with the official `anthropic` SDK (create, a
streamed create, the `messages.stream()` helper) and LangChain's `ChatAnthropic`: a long
tool-using run is summarized, the next turn reuses the summary with a byte-identical prefix,
native compaction is forwarded byte for byte, and every notice form is read cleanly."""

import itertools
import json

import anthropic
import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

MODEL = "claude-sonnet-4-5"
TOOLS = [{"name": "Read", "description": "read a file", "input_schema": {"type": "object"}}]
ANSWER = "The tool said: fn main() {}"
_fresh = itertools.count()


def agent_run(turns=4):
    """A task and tool turns over the trigger of 8 messages, unique per call, ending on results."""
    tag = next(_fresh)
    messages = [{"role": "user", "content": f"run {tag}: fix the bug"}]
    for i in range(turns):
        tool_id = f"toolu_{tag}_{i}"
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": tool_id, "name": "Read", "input": {"file_path": f"src/{i}.rs"}},
        ]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_id, "content": "fn main() {}"},
        ]})
    return messages


class Capture:
    """The bytes of each request the SDK sends."""

    def __init__(self):
        self.bodies = []

    def __call__(self, request):
        self.bodies.append(request.read())


def client(compacting, mode="comment", capture=None, headers=None):
    # The SDK's own client class (it builds on httpx2, not httpx), with a hook that sees the bytes.
    http_client = anthropic.DefaultHttpxClient(event_hooks={"request": [capture]} if capture else {})
    return anthropic.Anthropic(
        base_url=compacting.url,
        api_key="sk-ant-test",
        max_retries=0,
        timeout=20,
        http_client=http_client,
        default_headers={"x-compactor-notice": mode, **(headers or {})},
    )


def test_create_is_compacted_and_reads_the_answer(compacting):
    raw = client(compacting).messages.with_raw_response.create(
        model=MODEL, max_tokens=100, tools=TOOLS, messages=agent_run()
    )
    assert raw.headers["x-compactor-compaction"] == "summarized"
    message = raw.parse()
    assert message.content[0].text == ANSWER
    assert message.stop_reason == "end_turn"


def test_the_next_turn_reuses_the_summary_with_a_byte_identical_prefix(compacting):
    echo = client(compacting, headers={"x-mock-mode": "echo"})
    messages = agent_run()
    first = echo.messages.with_raw_response.create(model=MODEL, max_tokens=100, tools=TOOLS, messages=messages)
    assert first.headers["x-compactor-compaction"] == "summarized"
    forwarded = first.parse().content[0].text
    messages += [
        {"role": "assistant", "content": "Found it."},
        {"role": "user", "content": "Fix it then."},
    ]
    second = echo.messages.with_raw_response.create(model=MODEL, max_tokens=100, tools=TOOLS, messages=messages)
    assert second.headers["x-compactor-compaction"] == "reused"
    again = second.parse().content[0].text
    summary_turn = json.loads(forwarded)["messages"][0]
    assert summary_turn["content"][0]["text"].startswith("Here is a summary of the conversation to date:")
    prefix = forwarded[: forwarded.index('"role":"assistant"')]
    assert again.startswith(prefix)


@pytest.mark.parametrize("extra, messages", [
    ({"context_management": {"edits": [{"type": "compact_20260112"}]}}, None),
    ({}, [{"role": "user", "content": "go"},
          {"role": "assistant", "content": [{"type": "compaction", "content": "Earlier work."}]}]),
])
def test_native_compaction_is_forwarded_byte_for_byte(compacting, extra, messages):
    capture = Capture()
    echo = client(compacting, capture=capture, headers={"x-mock-mode": "echo"})
    history = (messages or []) + agent_run()
    raw = echo.messages.with_raw_response.create(
        model=MODEL, max_tokens=100, tools=TOOLS, messages=history, extra_body=extra
    )
    assert raw.headers["x-compactor-compaction"] == "skipped"
    assert raw.parse().content[0].text.encode() == capture.bodies[-1]


def test_count_tokens_is_forwarded_untouched(compacting):
    raw = client(compacting).messages.with_raw_response.count_tokens(
        model=MODEL, tools=TOOLS, messages=agent_run()
    )
    assert "x-compactor-compaction" not in raw.headers
    # The mock answers other paths with what it saw.
    assert raw.http_response.json() == {"method": "POST", "path": "/v1/messages/count_tokens"}


@pytest.mark.parametrize("mode", ["comment", "chunk", "named", "off"])
def test_streamed_create_reads_every_typed_event(compacting, mode):
    raw = client(compacting, mode).messages.with_raw_response.create(
        model=MODEL, max_tokens=100, tools=TOOLS, messages=agent_run(), stream=True
    )
    assert raw.headers["x-compactor-compaction"] == "summarized"
    text, kinds = "", []
    for event in raw.parse():
        kinds.append(event.type)
        if event.type == "content_block_delta":
            text += event.delta.text
    assert text == ANSWER
    assert kinds[-1] == "message_stop"
    # Only `named` reaches user code: one event of type `context_compacting` before
    # `message_start`, which a loop dispatching on `event.type` passes over.
    assert kinds[0] == ("context_compacting" if mode == "named" else "message_start"), kinds


@pytest.mark.parametrize("mode", ["comment", "chunk", "named", "off"])
def test_the_stream_helper_accumulates_the_final_message(compacting, mode):
    with client(compacting, mode).messages.stream(
        model=MODEL, max_tokens=100, tools=TOOLS, messages=agent_run()
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == ANSWER
    assert final.content[0].text == ANSWER


def langchain_history(tag):
    history = [HumanMessage(f"{tag}: fix the bug")]
    for i in range(4):
        history.append(AIMessage(content="", tool_calls=[{"id": f"toolu_{tag}_{i}", "name": "Read", "args": {"file_path": "a.rs"}}]))
        history.append(ToolMessage("fn main() {}", tool_call_id=f"toolu_{tag}_{i}"))
    return history


@pytest.mark.parametrize("mode", ["comment", "named"])
def test_langchain_chat_anthropic_invokes_and_streams_through_compaction(compacting, mode):
    llm = ChatAnthropic(
        model=MODEL,
        base_url=compacting.url,
        api_key="sk-ant-test",
        max_retries=0,
        max_tokens=100,
        default_headers={"x-compactor-notice": mode},
    )
    tag = f"lc{next(_fresh)}"
    reply = llm.invoke(langchain_history(tag))
    assert reply.content == ANSWER
    streamed = "".join(
        chunk.content if isinstance(chunk.content, str) else "".join(b.get("text", "") for b in chunk.content)
        for chunk in llm.stream(langchain_history(tag + "s"))
    )
    assert streamed == ANSWER
