//! The async-openai client pointed at compactor, as a Rust user would do it.

use crate::common::*;
use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{ChatCompletionMessageToolCalls, CreateChatCompletionRequest};
use async_openai::Client;
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

/// compactor with compaction on in front of `upstream`, summaries from a second mock.
async fn compacting_client(
    upstream: &mock_upstream::MockHandle,
) -> (mock_upstream::MockHandle, Proxy, Client<OpenAIConfig>) {
    compactor::server::install_crypto_provider();
    let summarizer = mock(MockOptions {
        mode: mock_upstream::MockMode::Summarizer,
        ..MockOptions::default()
    })
    .await;
    let extra = format!(
        "  - name: summarizer\n    base_url: {}\n    models: [\"summarizer-*\"]\nsummarization:\n  enabled: true\n  upstream: summarizer\n  model_name: summarizer-model\n  summary_max_tokens: 32\n  trigger: [{{type: messages, value: 10}}]\n  keep: {{type: messages, value: 3}}\n",
        summarizer.base_url()
    );
    let proxy = proxy(&config_for(upstream, &extra)).await;
    let config = OpenAIConfig::new()
        .with_api_base(proxy.base_url())
        .with_api_key("sk-test");
    (summarizer, proxy, Client::with_config(config))
}

fn agent_run() -> serde_json::Value {
    let mut input =
        vec![json!({"type": "message", "role": "developer", "content": "Work carefully."})];
    for i in 0..4 {
        input.push(json!({"type": "message", "role": "user", "content": format!("task {i}")}));
        input.push(json!({"type": "function_call", "call_id": format!("call_{i}"), "name": "read", "arguments": "{}"}));
        input.push(json!({"type": "function_call_output", "call_id": format!("call_{i}"), "output": "contents ".repeat(30)}));
        input.push(json!({"type": "message", "id": format!("msg_{i}"), "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": format!("done {i}"), "annotations": []}]}));
    }
    input.push(json!({"type": "message", "role": "user", "content": "and now?"}));
    json!({"model": "gpt-4.1", "input": input})
}

#[tokio::test]
async fn async_openai_responses_are_compacted() {
    let upstream = mock(MockOptions::default()).await;
    let (summarizer, _proxy, client) = compacting_client(&upstream).await;
    let request: async_openai::types::responses::CreateResponse =
        serde_json::from_value(agent_run()).expect("valid request");
    let response = client
        .responses()
        .create(request)
        .await
        .expect("response parses");
    assert_eq!(
        response.output_text().as_deref(),
        Some("Hello from the mock upstream.")
    );
    assert_eq!(summarizer.chat_calls(), 1);
    let forwarded = upstream.last_request().expect("seen").json();
    assert_eq!(forwarded["input"][1]["content"][0]["type"], "input_text");

    let mut request: async_openai::types::responses::CreateResponse =
        serde_json::from_value(agent_run()).expect("valid request");
    request.stream = Some(true);
    let mut stream = client
        .responses()
        .create_stream(request)
        .await
        .expect("stream opens");
    let mut text = String::new();
    while let Some(event) = tokio::time::timeout(BOUND, stream.next())
        .await
        .expect("bounded")
    {
        if let async_openai::types::responses::ResponseStreamEvent::ResponseOutputTextDelta(delta) =
            event.expect("every event parses")
        {
            text.push_str(&delta.delta);
        }
    }
    assert_eq!(text, "Hello from the mock upstream.");
    // The same conversation again: the summary is reused, no second call.
    assert_eq!(summarizer.chat_calls(), 1);
}
