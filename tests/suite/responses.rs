//! The Responses API through compactor (`POST /v1/responses`): what the upstream receives and
//! what the client gets back, against the mock's OpenAI-style validation of item groups.

use crate::common::*;
use http::StatusCode;
use mock_upstream::MockOptions;
use serde_json::{json, Value};

const DEFAULT_SUMMARIZATION: &str =
    "  trigger: [{type: messages, value: 20}]\n  keep: {type: messages, value: 6}\n  timeout_secs: 10\n";

async fn stack() -> Stack {
    stack_with(DEFAULT_SUMMARIZATION, MockOptions::default()).await
}

/// An agent run: a developer item, then turns of user, reasoning, a call, its output and an
/// answer, ending on a user item.
fn agent_input(turns: usize) -> Vec<Value> {
    let mut input = vec![json!({"role": "developer", "content": "Work carefully."})];
    for t in 0..turns {
        input.push(json!({"role": "user", "content": [{"type": "input_text", "text": format!("task {t}: {}", "details ".repeat(10))}]}));
        input.push(json!({"type": "reasoning", "id": format!("rs_{t}"), "summary": [{"type": "summary_text", "text": "plan"}], "encrypted_content": format!("enc{t}")}));
        input.push(json!({"type": "function_call", "id": format!("fc_{t}"), "call_id": format!("call_{t}"), "name": "read_file", "arguments": "{\"path\":\"a.rs\"}"}));
        input.push(json!({"type": "function_call_output", "call_id": format!("call_{t}"), "output": "fn main() {}\n".repeat(5)}));
        input.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": format!("done {t}"), "annotations": []}]}));
    }
    input.push(json!({"role": "user", "content": "and now?"}));
    input
}

fn body(input: &[Value], extra: Value) -> String {
    let mut body = json!({"model": "gpt-4.1", "instructions": "Be brief.", "input": input, "store": false, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k1"});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body.to_string()
}

async fn send(stack: &Stack, body: String) -> Collected {
    roundtrip(
        &client(),
        json_request(&stack.proxy.url("/v1/responses"), body, &[]),
    )
    .await
}

fn compaction(response: &Collected) -> &str {
    response.headers["x-compactor-compaction"].to_str().unwrap()
}

#[tokio::test]
async fn a_long_agent_run_is_summarized_and_the_next_turn_reuses_the_summary() {
    let stack = stack().await;
    let input = agent_input(6);
    let sent = body(&input, json!({}));
    let response = send(&stack, sent.clone()).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(compaction(&response), "summarized");
    assert_eq!(stack.summarizer.chat_calls(), 1);

    let forwarded = stack.upstream.last_request().unwrap();
    let forwarded_text = String::from_utf8(forwarded.body.to_vec()).unwrap();
    let forwarded = forwarded.json();
    let items = forwarded["input"].as_array().unwrap();
    assert!(items.len() < input.len());
    assert_eq!(items[0], input[0], "the developer item stays first");
    assert_eq!(items[1]["type"], "message");
    assert_eq!(items[1]["role"], "user");
    assert_eq!(items[1]["content"][0]["type"], "input_text");
    assert!(items[1]["content"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("Here is a summary of the conversation to date:"));
    // Every other field keeps its value, and the kept tail its bytes.
    for field in [
        "model",
        "instructions",
        "store",
        "include",
        "prompt_cache_key",
    ] {
        assert_eq!(
            forwarded[field],
            serde_json::from_str::<Value>(&sent).unwrap()[field]
        );
    }
    let kept = &input[input.len() - (items.len() - 2)..];
    assert_eq!(&items[2..], kept);
    let kept_bytes = serde_json::to_string(kept).unwrap();
    assert!(forwarded_text.contains(&kept_bytes[1..kept_bytes.len() - 1]));
    // No reasoning item lost the item it produced, no output lost its call (else a 400).
    assert_ne!(items[2]["type"], "function_call_output");
    // The summarizer saw no encrypted reasoning.
    let prompt = stack.summarizer.last_request().unwrap().json()["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        prompt.contains("task 0") && !prompt.contains("enc0"),
        "{prompt}"
    );
    assert!(!prompt.contains("role=\"reasoning\""), "{prompt}");
    assert!(prompt.contains("→ calls read_file("), "{prompt}");

    let mut next = input.clone();
    next.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "here", "annotations": []}]}));
    next.push(json!({"role": "user", "content": "thanks"}));
    let response = send(&stack, body(&next, json!({}))).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(compaction(&response), "reused");
    assert_eq!(stack.summarizer.chat_calls(), 1);
    let again = stack.upstream.last_request().unwrap().json();
    assert_eq!(again["input"][1], items[1], "the same summary item");
}

#[tokio::test]
async fn history_kept_upstream_or_compacted_natively_is_forwarded_byte_for_byte() {
    let stack = stack().await;
    let input = agent_input(6);
    for (extra, reason_input) in [
        (json!({"previous_response_id": "resp_1"}), None),
        (json!({"conversation": "conv_1"}), None),
        (
            json!({"context_management": [{"type": "compaction", "compact_threshold": 1000}]}),
            None,
        ),
        (
            json!({}),
            Some(json!({"type": "item_reference", "id": "msg_1"})),
        ),
    ] {
        let mut items = input.clone();
        if let Some(item) = reason_input {
            items.insert(3, item);
        }
        let sent = body(&items, extra);
        let response = send(&stack, sent.clone()).await;
        assert_eq!(compaction(&response), "skipped", "{sent}");
        assert_eq!(stack.upstream.last_request().unwrap().body, sent.as_bytes());
    }
    let plain = json!({"model": "gpt-4.1", "input": "one string"}).to_string();
    let response = send(&stack, plain.clone()).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(
        stack.upstream.last_request().unwrap().body,
        plain.as_bytes()
    );
    assert_eq!(stack.summarizer.chat_calls(), 0);
}

/// Codex's opening (0.171): its tools in an `additional_tools` item, developer instructions,
/// AGENTS.md and the workspace facts as user items, then the task.
fn codex_opening() -> Vec<Value> {
    vec![
        json!({"type": "additional_tools", "id": "at_1", "role": "developer", "tools": [{"type": "namespace", "name": "functions", "tools": [{"type": "custom", "name": "exec"}]}]}),
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "# AGENTS.md instructions for /w\n\nRun the tests."}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>"}]}),
    ]
}

/// Sends `input`, which must come back summarized; the items forwarded upstream.
async fn summarized_items(stack: &Stack, input: &[Value]) -> Vec<Value> {
    let response = send(stack, body(input, json!({}))).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(compaction(&response), "summarized");
    let forwarded = stack.upstream.last_request().unwrap().json();
    forwarded["input"].as_array().unwrap().clone()
}

fn is_summary(item: &Value) -> bool {
    item["content"][0]["text"]
        .as_str()
        .is_some_and(|text| text.starts_with("Here is a summary"))
}

#[tokio::test]
async fn codex_context_items_and_a_provider_compaction_are_never_summarized() {
    let stack = stack().await;
    // The opening stays first, byte for byte, however far the cut goes.
    let mut input = codex_opening();
    input.extend(agent_input(6).into_iter().skip(1));
    let items = summarized_items(&stack, &input).await;
    assert_eq!(&items[..4], &input[..4]);
    assert!(is_summary(&items[4]));
    let prompt = stack.summarizer.last_request().unwrap().json()["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!prompt.contains("environment_context") && !prompt.contains("AGENTS.md"));

    // Workspace facts sent again mid-run are kept too, after the summary.
    let mut input = codex_opening();
    let mut run = agent_input(6).into_iter().skip(1).collect::<Vec<_>>();
    let moved = json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>\n  <cwd>/w/sub</cwd>\n</environment_context>"}]});
    run.insert(6, moved.clone());
    input.extend(run);
    let items = summarized_items(&stack, &input).await;
    assert_eq!(&items[..4], &input[..4]);
    assert_eq!(items[5], moved);

    // A provider's compaction item, after the user items where Codex puts it: it and all
    // before it stay as sent; only what came after it is summarized.
    let mut input = codex_opening();
    input.push(json!({"role": "user", "content": "first task"}));
    input.push(json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque-history"}));
    input.extend(agent_input(6).into_iter().skip(1));
    let items = summarized_items(&stack, &input).await;
    assert_eq!(&items[..6], &input[..6]);
    assert!(is_summary(&items[6]));
}

#[tokio::test]
async fn the_mock_rejects_what_openai_rejects() {
    let upstream = mock(MockOptions::default()).await;
    for (input, expected) in [
        (
            json!([{"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"}, {"role": "user", "content": "q"}]),
            "No tool output found for function call a",
        ),
        (
            json!([{"type": "function_call_output", "call_id": "a", "output": "x"}]),
            "No tool call found for function call output",
        ),
        (
            json!([{"type": "reasoning", "id": "rs_1", "summary": []}, {"role": "user", "content": "q"}]),
            "without its required following item",
        ),
        (
            json!([{"type": "reasoning", "id": "rs_1"}, {"type": "message", "role": "assistant", "content": "a"}]),
            "summary",
        ),
    ] {
        let response = roundtrip(
            &client(),
            json_request(
                &format!("{}/responses", upstream.base_url()),
                json!({"model": "m", "input": input}).to_string(),
                &[],
            ),
        )
        .await;
        assert_eq!(response.status, StatusCode::BAD_REQUEST);
        assert!(response.text().contains(expected), "{}", response.text());
    }
}

#[tokio::test]
async fn a_compacted_stream_starts_with_the_notice_and_keeps_its_typed_events() {
    let stack = stack().await;
    for (mode, start) in [
        ("comment", ": context_compacting {"),
        ("chunk", ": context_compacting {"),
        ("named", "event: context_compacting\ndata: {"),
    ] {
        let mut input = agent_input(6);
        input.insert(1, json!({"role": "user", "content": mode}));
        let response = roundtrip(
            &client(),
            json_request(
                &stack.proxy.url("/v1/responses"),
                body(&input, json!({"stream": true})),
                &[("x-compactor-notice", mode)],
            ),
        )
        .await;
        assert_eq!(compaction(&response), "summarized");
        let text = response.text();
        assert!(text.starts_with(start), "{mode}: {text}");
        let after = text.split_once("\n\n").unwrap().1;
        assert!(
            after.starts_with("event: response.created\ndata: {"),
            "{after}"
        );
        assert!(text.contains("event: response.completed\n"));
    }
}

#[tokio::test]
async fn a_summarizer_that_speaks_only_responses_is_called_with_it() {
    let stack = stack_with(
        &format!("{DEFAULT_SUMMARIZATION}  summarizer_api: responses\n"),
        MockOptions::default(),
    )
    .await;
    let response = send(&stack, body(&agent_input(6), json!({}))).await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(compaction(&response), "summarized");
    let call = stack.summarizer.last_request().unwrap();
    assert_eq!(call.path_and_query, "/v1/responses");
    let call = call.json();
    assert_eq!(call["store"], false);
    assert!(call["input"].as_str().unwrap().contains("task 0"));
    let summary = stack.upstream.last_request().unwrap().json()["input"][1]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        summary.contains("Summary ") && summary.contains("chars of conversation"),
        "{summary}"
    );
}
