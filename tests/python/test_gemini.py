"""Google's google-genai SDK through compactor, unchanged: Gemini's model calls are claimed by
their whole path and forwarded to an `api: gemini` upstream with its own key, whole and
streamed. (Gemini conversations are forwarded, not yet compacted.)"""

import json
import urllib.request

import pytest
from google import genai
from google.genai import types

from conftest import start_compactor

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


def test_generate_content_whole_and_streamed(gemini_proxy, mock_upstream):
    before = rejections(mock_upstream)
    gemini = client(gemini_proxy.url)
    whole = gemini.models.generate_content(model=MODEL, contents="hi")
    assert whole.text == REPLY
    assert whole.usage_metadata.prompt_token_count == 8
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
