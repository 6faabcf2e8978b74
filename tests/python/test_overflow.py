"""A context-length error never reaches the SDKs: the mock upstream enforces a window
(`x-mock-window`, answered with each provider's real error), and compactor retries once,
compacted. The official openai and anthropic SDKs see one ordinary answer."""

import anthropic
import openai
import pytest

from conftest import start_compacting

WINDOW = {"x-mock-window": "1500"}


@pytest.fixture(scope="module")
def reactive(mock_upstream, summarizer):
    """compactor whose triggers are far away: only the upstream's refusal makes it compact."""
    process = start_compacting(mock_upstream, summarizer, "[{type: tokens, value: 1000000}]")
    yield process
    process.stop()


def history(turns=12):
    messages = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"question {t}: " + "words " * 60})
        messages.append({"role": "assistant", "content": f"answer {t}: " + "reply " * 60})
    messages.append({"role": "user", "content": "and now?"})
    return messages


def openai_client(reactive):
    return openai.OpenAI(
        base_url=reactive.url + "/v1", api_key="sk-test", max_retries=0, timeout=20, default_headers=WINDOW
    )


def test_without_compactor_the_sdk_raises_the_providers_error(mock_upstream):
    direct = openai.OpenAI(
        base_url=mock_upstream.url + "/v1", api_key="sk-test", max_retries=0, timeout=20, default_headers=WINDOW
    )
    with pytest.raises(openai.BadRequestError) as refused:
        direct.chat.completions.create(model="gpt-4o-mini", messages=history())
    assert refused.value.code == "context_length_exceeded"


def test_openai_create_gets_an_answer_instead_of_the_error(reactive):
    raw = openai_client(reactive).chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=history()
    )
    assert raw.headers["x-compactor-compaction"] == "summarized"
    assert raw.parse().choices[0].message.content


def test_openai_stream_gets_an_answer_instead_of_the_error(reactive):
    stream = openai_client(reactive).chat.completions.create(
        model="gpt-4o-mini", messages=history(13), stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text


def test_anthropic_create_gets_an_answer_instead_of_prompt_is_too_long(reactive):
    client = anthropic.Anthropic(
        base_url=reactive.url, api_key="sk-ant-test", max_retries=0, timeout=20, default_headers=WINDOW
    )
    raw = client.messages.with_raw_response.create(
        model="claude-sonnet-4-5", max_tokens=100, system="Be brief.", messages=history(14)
    )
    assert raw.headers["x-compactor-compaction"] == "summarized"
    assert raw.parse().content[0].text
