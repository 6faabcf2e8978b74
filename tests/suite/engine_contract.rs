//! The engine contract (`POST /v1/compress`): a gateway's messages compacted as a request of
//! that model would be, with the counts it logs; summaries scoped to the caller's key and
//! reused on the next turn; the messages back as they came when there is nothing to do.

use crate::common::*;
use http::StatusCode;
use serde_json::{json, Value};

const SETTINGS: &str =
    "  trigger: [{type: tokens, value: 1500}]\n  keep: {type: messages, value: 4}\n";

async fn compress(proxy: &Proxy, body: &Value, headers: &[(&str, &str)]) -> Collected {
    let url = proxy.url("/v1/compress");
    roundtrip(&client(), json_request(&url, body.to_string(), headers)).await
}

#[tokio::test]
async fn a_gateways_messages_are_compacted_then_the_summary_reused() {
    let stack = stack_with(SETTINGS, Default::default()).await;
    let messages = long_chat(20);
    let first = compress(
        &stack.proxy,
        &json!({"model": "gpt-4o-mini", "messages": messages}),
        &[],
    )
    .await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    let answer = first.json();
    let compacted = answer["messages"].as_array().expect("messages");
    assert!(compacted.len() < messages.len(), "{answer}");
    assert_eq!(
        compacted[0], messages[0],
        "the system prompt is kept as it came"
    );
    assert_eq!(compacted.last(), messages.last(), "the latest turn too");
    assert_eq!(answer["compaction"], "summarized");
    assert_eq!(answer["transforms_applied"], json!(["summarized"]));
    let (before, after) = (
        answer["tokens_before"].as_u64().unwrap(),
        answer["tokens_after"].as_u64().unwrap(),
    );
    assert!(after < before);
    assert_eq!(answer["tokens_saved"].as_u64(), Some(before - after));
    assert!(answer["compression_ratio"]
        .as_f64()
        .is_some_and(|r| r > 0.0 && r < 1.0));
    assert!(
        stack.upstream.requests().is_empty(),
        "nothing is sent upstream"
    );

    let mut next = messages.clone();
    next.pop();
    next.push(json!({"role": "user", "content": "And what now?"}));
    next.push(json!({"role": "assistant", "content": "Run the parser tests."}));
    next.push(json!({"role": "user", "content": "Done; and then?"}));
    let second = compress(
        &stack.proxy,
        &json!({"model": "gpt-4o-mini", "messages": next}),
        &[],
    )
    .await;
    assert_eq!(second.json()["compaction"], "reused", "{}", second.text());
    assert_eq!(
        second.json()["messages"][1],
        compacted[1],
        "the same summary"
    );
    assert_eq!(stack.summarizer.chat_calls(), 1);
}

#[tokio::test]
async fn anthropic_shaped_messages_keep_their_tool_pairs() {
    let stack = stack_with(SETTINGS, Default::default()).await;
    let mut messages = vec![json!({"role": "user", "content": "Find the bug."})];
    for step in 0..12 {
        let id = format!("toolu_{step}");
        messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "Read", "input": {"file_path": format!("src/f{step}.rs")}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "fn parse() {}\n".repeat(40)}]}));
    }
    let answer = compress(
        &stack.proxy,
        &json!({"model": "claude-sonnet-4-5", "messages": messages}),
        &[],
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let answer = answer.json();
    assert_eq!(answer["compaction"], "summarized", "{answer}");
    let kept = answer["messages"].as_array().unwrap();
    // An Anthropic conversation: the summary opens it as a user turn, every kept call
    // still has its result right after it.
    assert_eq!(kept[0]["role"], "user");
    for (i, message) in kept.iter().enumerate() {
        let calls: Vec<&str> = message["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|block| block["type"] == "tool_use")
            .filter_map(|block| block["id"].as_str())
            .collect();
        for id in calls {
            let answered = kept
                .get(i + 1)
                .and_then(|next| next["content"].as_array())
                .into_iter()
                .flatten()
                .any(|block| block["tool_use_id"] == id);
            assert!(answered, "{id} lost its result: {answer}");
        }
    }
}

#[tokio::test]
async fn a_short_conversation_comes_back_as_it_came_and_a_bad_body_gets_400() {
    let stack = stack_with(SETTINGS, Default::default()).await;
    let messages = json!([{"role": "user", "content": "hi"}]);
    let answer = compress(
        &stack.proxy,
        &json!({"model": "gpt-4o-mini", "messages": messages}),
        &[],
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["messages"], messages);
    assert_eq!(answer.json()["compaction"], "skipped");
    assert_eq!(answer.json()["tokens_saved"], 0);
    for bad in [json!({"model": "m"}), json!({"messages": []}), json!([1])] {
        let refused = compress(&stack.proxy, &bad, &[]).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
        assert!(refused.json()["error"]["message"].is_string());
    }
}

#[tokio::test]
async fn with_auth_the_callers_key_is_required_and_scopes_its_summaries() {
    let keys = "auth:\n  keys:\n    - name: gateway\n      key: sk-gateway\n    - name: other\n      key: sk-other\n";
    let stack = stack_with(&format!("{SETTINGS}{keys}"), Default::default()).await;
    let body = json!({"model": "gpt-4o-mini", "messages": long_chat(20)});
    let anonymous = compress(&stack.proxy, &body, &[]).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let gateway = compress(
        &stack.proxy,
        &body,
        &[("authorization", "Bearer sk-gateway")],
    )
    .await;
    assert_eq!(gateway.json()["compaction"], "summarized");
    // Another key never reuses the gateway's summary.
    let other = compress(&stack.proxy, &body, &[("authorization", "Bearer sk-other")]).await;
    assert_eq!(other.json()["compaction"], "summarized");
    assert_eq!(stack.summarizer.chat_calls(), 2);
}
