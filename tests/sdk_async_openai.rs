//! The async-openai client pointed at compactor, as a Rust user would do it.

mod common;

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{ChatCompletionMessageToolCalls, CreateChatCompletionRequest};
use async_openai::Client;
use common::*;
use futures_util::StreamExt;
use mock_upstream::MockOptions;
use serde_json::json;

async fn sdk_client() -> (mock_upstream::MockHandle, Proxy, Client<OpenAIConfig>) {
    compactor::server::install_crypto_provider();
    let mock = mock(MockOptions::default()).await;
    let proxy = proxy(&config_for(&mock, "")).await;
    let config = OpenAIConfig::new()
        .with_api_base(proxy.base_url())
        .with_api_key("sk-test");
    (mock, proxy, Client::with_config(config))
}

fn request(value: serde_json::Value) -> CreateChatCompletionRequest {
    serde_json::from_value(value).expect("valid request")
}

#[tokio::test]
async fn async_openai_chat() {
    let (mock, _proxy, client) = sdk_client().await;
    let response = client
        .chat()
        .create(request(
            json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}),
        ))
        .await
        .expect("chat succeeds");
    assert_eq!(
        response.choices[0].message.content.as_deref(),
        Some("Hello from the mock upstream.")
    );
    assert_eq!(
        mock.last_request().expect("seen").headers["authorization"],
        "Bearer sk-test"
    );
}

#[tokio::test]
async fn async_openai_streaming_chat() {
    let (_mock, _proxy, client) = sdk_client().await;
    let mut stream = client
        .chat()
        .create_stream(request(json!({"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "hi"}]})))
        .await
        .expect("stream opens");
    let mut text = String::new();
    while let Some(item) = tokio::time::timeout(BOUND, stream.next())
        .await
        .expect("bounded")
    {
        let chunk = item.expect("chunk parses");
        for choice in chunk.choices {
            text.push_str(choice.delta.content.as_deref().unwrap_or(""));
        }
    }
    assert_eq!(text, "Hello from the mock upstream.");
}

#[tokio::test]
async fn async_openai_tool_call_round_trip() {
    let (mock, _proxy, client) = sdk_client().await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let first = client
        .chat()
        .create(request(json!({"model": "gpt-4o-mini", "tools": tools, "messages": [{"role": "user", "content": "Weather in Paris?"}]})))
        .await
        .expect("tool call");
    let calls = first.choices[0]
        .message
        .tool_calls
        .clone()
        .expect("tool calls");
    let ChatCompletionMessageToolCalls::Function(call) = &calls[0] else {
        panic!("expected a function call");
    };
    assert_eq!(call.function.name, "get_weather");
    assert_eq!(call.function.arguments, r#"{"city":"Paris"}"#);
    let second = client
        .chat()
        .create(request(json!({"model": "gpt-4o-mini", "tools": tools, "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": call.id, "type": "function",
                "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "18C and sunny"}]})))
        .await
        .expect("answer after the tool result");
    assert_eq!(
        second.choices[0].message.content.as_deref(),
        Some("The tool said: 18C and sunny")
    );
    assert_eq!(mock.chat_calls(), 2);
}
