"""The official openai SDK and LangChain's ChatOpenAI through compactor, unchanged."""

import json

import openai
import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from conftest import start_compacting

MODEL = "gpt-4o-mini"
MOCK_REPLY = "Hello from the mock upstream."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0, timeout=20)


def test_openai_chat(base_url):
    reply = client(base_url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == MOCK_REPLY


def test_openai_streaming_naive_loop(base_url):
    stream = client(base_url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == MOCK_REPLY


def test_openai_stream_helper(base_url):
    with client(base_url).chat.completions.stream(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].message.content == MOCK_REPLY


def test_openai_tool_call_round_trip(base_url):
    api = client(base_url)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = api.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18C and sunny"},
    ]
    second = api.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
    assert second.choices[0].message.content == "The tool said: 18C and sunny"


def test_openai_upstream_error_surfaces_as_sdk_error(base_url):
    api = client(base_url)
    try:
        api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-mock-status": "429"},
        )
    except openai.RateLimitError as error:
        assert error.status_code == 429
    else:
        raise AssertionError("expected a RateLimitError")


def chat_model(base_url):
    return ChatOpenAI(model=MODEL, base_url=base_url, api_key="sk-test", max_retries=0, timeout=20)


def test_langchain_invoke(base_url):
    assert chat_model(base_url).invoke("hi").content == MOCK_REPLY


def test_langchain_stream(base_url):
    text = "".join(chunk.content for chunk in chat_model(base_url).stream("hi"))
    assert text == MOCK_REPLY


@tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    return f"18C in {city}"


def test_langchain_tools(base_url):
    model = chat_model(base_url).bind_tools([get_weather])
    question = HumanMessage("Weather in Paris?")
    first = model.invoke([question])
    assert first.tool_calls[0]["name"] == "get_weather"
    assert first.tool_calls[0]["args"] == {"city": "Paris"}
    result = ToolMessage(get_weather.invoke(first.tool_calls[0]["args"]), tool_call_id=first.tool_calls[0]["id"])
    second = model.invoke([question, first, result])
    assert second.content == "The tool said: 18C in Paris"


@pytest.fixture(scope="module")
def auditing(mock_upstream, summarizer):
    """compactor in audit mode: an 8-message trigger, 2 kept."""
    process = start_compacting(mock_upstream, summarizer, "[{type: messages, value: 8}]", mode="audit")
    yield process
    process.stop()


def test_audit_mode_answers_the_sdk_as_if_compactor_were_not_there(auditing):
    """A conversation over the trigger, through the openai SDK with its defaults: the answer and
    the stream are the upstream's, and only the headers say what enforce would have done."""
    messages = [{"role": "system", "content": "Be brief."}]
    for turn in range(6):
        messages.append({"role": "user", "content": f"question {turn}: " + "words " * 40})
        messages.append({"role": "assistant", "content": f"answer {turn}: " + "reply " * 40})
    messages.append({"role": "user", "content": "And now?"})
    sdk = client(auditing.url + "/v1")
    raw = sdk.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert raw.parse().choices[0].message.content == MOCK_REPLY
    assert raw.headers["x-compactor-compaction"] == "skipped"
    assert raw.headers["x-compactor-audit"] == "summarized"
    assert int(raw.headers["x-compactor-audit-tokens-after"]) < int(raw.headers["x-compactor-tokens-before"])
    stream = sdk.chat.completions.create(model=MODEL, messages=messages, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == MOCK_REPLY
