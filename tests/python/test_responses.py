"""The Responses API through compactor with the official SDK: `client.responses.create` with and
without a stream, and the `client.responses.stream()` helper, in every notice mode."""

import itertools

import openai
import pytest

MODEL = "gpt-4.1"
MOCK_REPLY = "Hello from the mock upstream."
_fresh = itertools.count()


def agent_input():
    """An agent run over the trigger of 8 items, unique per call so each is summarized afresh."""
    tag = next(_fresh)
    items = [{"role": "developer", "content": "Work carefully."}]
    for i in range(3):
        items.append({"role": "user", "content": [{"type": "input_text", "text": f"run {tag} task {i}"}]})
        items.append({"type": "reasoning", "id": f"rs_{tag}_{i}", "summary": []})
        items.append({"type": "function_call", "call_id": f"call_{tag}_{i}", "name": "read", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"call_{tag}_{i}", "output": "contents " * 20})
        items.append({"role": "assistant", "content": [{"type": "output_text", "text": f"done {i}"}]})
    items.append({"role": "user", "content": "and now?"})
    return items


def client(compacting, mode="comment"):
    return openai.OpenAI(
        base_url=compacting.url + "/v1",
        api_key="sk-test",
        max_retries=0,
        timeout=20,
        default_headers={"x-compactor-notice": mode},
    )


def test_create_is_compacted_and_reads_the_answer(compacting):
    raw = client(compacting).responses.with_raw_response.create(model=MODEL, input=agent_input())
    assert raw.headers["x-compactor-compaction"] == "summarized"
    assert raw.parse().output_text == MOCK_REPLY


@pytest.mark.parametrize("mode", ["comment", "chunk", "named", "off"])
def test_streamed_create_reads_every_typed_event(compacting, mode):
    raw = client(compacting, mode).responses.with_raw_response.create(
        model=MODEL, input=agent_input(), stream=True
    )
    assert raw.headers["x-compactor-compaction"] == "summarized"
    text, kinds = "", []
    for event in raw.parse():
        kinds.append(getattr(event, "type", None))
        if event.type == "response.output_text.delta":
            text += event.delta
    assert text == MOCK_REPLY
    assert kinds[-1] == "response.completed"
    # Only `named` reaches user code: one event of type `context_compacting`, which a loop that
    # dispatches on `event.type` passes over.
    assert kinds[0] == ("context_compacting" if mode == "named" else "response.created"), kinds


@pytest.mark.parametrize("mode", ["comment", "chunk", "off"])
def test_the_stream_helper_accumulates_the_final_response(compacting, mode):
    with client(compacting, mode).responses.stream(model=MODEL, input=agent_input()) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text == MOCK_REPLY


def test_the_stream_helper_breaks_on_a_named_notice(compacting):
    """Why `named` is opt-in: the helper insists on `response.created` first."""
    with pytest.raises(RuntimeError, match="response.created"):
        with client(compacting, "named").responses.stream(model=MODEL, input=agent_input()) as stream:
            for _ in stream:
                pass
