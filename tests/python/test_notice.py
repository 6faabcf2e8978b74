"""The context_compacting notice through real clients, mode by mode.

What each client does with each form follows ../shared/reference/sse-clients.md (tested there
with these pinned versions): comments are dropped by every SDK; `chunk` is a valid chunk with
empty `choices` (breaks only unguarded `chunk.choices[0]`); `named` reaches openai-python user
code as a chunk without `choices`.
"""

import itertools

import openai
import pytest
from langchain_openai import ChatOpenAI

MODEL = "gpt-4o-mini"
MOCK_REPLY = "Hello from the mock upstream."
_fresh = itertools.count()


def long_conversation():
    """Ten messages (over the trigger of 8), unique per call so each one is summarized afresh."""
    tag = next(_fresh)
    messages = [{"role": "system", "content": "You are helpful."}]
    for i in range(4):
        messages.append({"role": "user", "content": f"conversation {tag} question {i} " * 5})
        messages.append({"role": "assistant", "content": f"conversation {tag} answer {i} " * 5})
    messages.append({"role": "user", "content": "and now?"})
    return messages


def client(compacting, mode):
    return openai.OpenAI(
        base_url=compacting.url + "/v1",
        api_key="sk-test",
        max_retries=0,
        timeout=20,
        default_headers={"x-compactor-notice": mode},
    )


def guarded_loop(stream):
    text, notices = "", []
    for chunk in stream:
        extra = chunk.model_extra or {}
        if extra.get("context_compacting"):
            notices.append(extra["context_compacting"])
        if extra.get("type") == "context_compacting":
            notices.append(extra)
        if not chunk.choices:
            continue
        text += chunk.choices[0].delta.content or ""
    return text, notices


@pytest.mark.parametrize("mode", ["comment", "off"])
def test_naive_loop_reads_the_answer(compacting, mode):
    stream = client(compacting, mode).chat.completions.create(
        model=MODEL, messages=long_conversation(), stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream) == MOCK_REPLY


@pytest.mark.parametrize("mode,error", [("chunk", IndexError), ("named", TypeError)])
def test_naive_loop_breaks_where_the_reference_says(compacting, mode, error):
    stream = client(compacting, mode).chat.completions.create(
        model=MODEL, messages=long_conversation(), stream=True
    )
    with pytest.raises(error):
        "".join(c.choices[0].delta.content or "" for c in stream)


@pytest.mark.parametrize(
    "mode,visible", [("comment", False), ("chunk", True), ("named", True), ("off", False)]
)
def test_guarded_loop_reads_the_answer_and_sees_machine_readable_notices(compacting, mode, visible):
    raw = client(compacting, mode).chat.completions.with_raw_response.create(
        model=MODEL, messages=long_conversation(), stream=True
    )
    assert raw.headers["x-compactor-compaction"] == "summarized"
    text, notices = guarded_loop(raw.parse())
    assert text == MOCK_REPLY
    assert bool(notices) == visible
    for notice in notices:
        assert notice["type"] == "context_compacting"
        assert notice["message"].startswith("Compacted ")


@pytest.mark.parametrize("mode", ["comment", "chunk", "named", "off"])
def test_stream_helper_reads_the_answer(compacting, mode):
    with client(compacting, mode).chat.completions.stream(
        model=MODEL, messages=long_conversation()
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].message.content == MOCK_REPLY
    if mode == "chunk":
        # The helper's snapshot starts from the notice chunk, which carries the upstream's id.
        assert (final.model_extra or {}).get("context_compacting", {}).get("type") == "context_compacting"
    assert final.id.startswith("chatcmpl-")


@pytest.mark.parametrize("mode", ["comment", "chunk", "named", "off"])
def test_langchain_stream_reads_the_answer(compacting, mode):
    model = ChatOpenAI(
        model=MODEL,
        base_url=compacting.url + "/v1",
        api_key="sk-test",
        max_retries=0,
        timeout=20,
        default_headers={"x-compactor-notice": mode},
        include_response_headers=True,
    )
    chunks = list(model.stream(long_conversation()))
    assert "".join(c.content for c in chunks) == MOCK_REPLY
    headers = chunks[0].response_metadata["headers"]
    assert headers["x-compactor-compaction"] == "summarized"


def test_the_reuse_path_has_no_notice(compacting):
    messages = long_conversation()
    api = client(compacting, "chunk")
    first = api.chat.completions.with_raw_response.create(model=MODEL, messages=messages, stream=True)
    assert first.headers["x-compactor-compaction"] == "summarized"
    list(first.parse())
    again = api.chat.completions.with_raw_response.create(model=MODEL, messages=messages, stream=True)
    assert again.headers["x-compactor-compaction"] == "reused"
    text, notices = guarded_loop(again.parse())
    assert text == MOCK_REPLY and notices == []
