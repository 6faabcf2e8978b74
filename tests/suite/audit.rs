//! Audit mode: the whole decision runs and every request is forwarded byte for byte; the
//! headers, the metrics and the access log say what enforce would have done. With
//! `shadow_sample` the summaries are made for real off the request path, so enforce starts warm.

use crate::common::*;
use http::StatusCode;
use serde_json::{json, Value};

const AUDIT: &str =
    "  mode: audit\n  trigger: [{type: tokens, value: 1500}]\n  keep: {type: messages, value: 4}\n";

fn number(response: &Collected, name: &str) -> u64 {
    header(response, name).parse().unwrap_or(0)
}

#[tokio::test]
async fn audit_forwards_every_request_as_it_came_and_says_what_enforce_would_have_done() {
    let stack = stack_with_defaults(AUDIT).await;
    let messages = long_chat(20);
    let body = json!({"model": "gpt-4o-mini", "messages": messages}).to_string();
    for stream in [false, true] {
        let mut sent: Value = serde_json::from_str(&body).unwrap();
        sent["stream"] = json!(stream);
        let sent = sent.to_string();
        let url = stack.proxy.url("/v1/chat/completions");
        let response = roundtrip(&client(), json_request(&url, sent.clone(), &[])).await;
        assert_eq!(response.status, StatusCode::OK, "{}", response.text());
        let forwarded = stack.upstream.last_request().expect("forwarded");
        assert_eq!(forwarded.body, sent.as_bytes(), "byte for byte");
        assert_eq!(outcome(&response), "skipped");
        assert_eq!(header(&response, "x-compactor-audit"), "summarized");
        let before = number(&response, "x-compactor-tokens-before");
        let would = number(&response, "x-compactor-audit-tokens-after");
        assert!(would > 0 && would < before, "{would} of {before}");
        assert!(number(&response, "x-compactor-audit-summarizer-tokens") > 0);
        // The system prompt is pinned: the summary would have gone in right after it.
        assert_eq!(header(&response, "x-compactor-audit-prefix-break"), "1");
        if stream {
            assert!(
                !response.text().contains("context_compacting"),
                "no notice: nothing was compacted"
            );
        }
    }
    assert_eq!(
        stack.summarizer.chat_calls(),
        0,
        "no summarizer call in audit"
    );
    let metrics = get(&stack.proxy.url("/metrics")).await.text();
    let line = |name: &str| metric_value(&metrics, name, &[]).unwrap_or(0.0);
    assert_eq!(
        metric_value(
            &metrics,
            "compactor_audit_total",
            &[r#"outcome="summarized""#]
        ),
        Some(2.0)
    );
    assert!(
        line("compactor_audit_tokens_saved_total") > 0.0,
        "{metrics}"
    );
    assert!(line("compactor_audit_summarizer_tokens_total") > 0.0);
    assert_eq!(line("compactor_audit_prefix_breaks_total"), 2.0);
    // `compactor report` reads the same metrics into words.
    let report = tokio::process::Command::new(BIN)
        .args(["report", "--url", &stack.proxy.url("/metrics")])
        .output()
        .await
        .expect("compactor report runs");
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(report.status.success(), "{text}");
    assert!(text.contains("Audited requests: 2"), "{text}");
    assert!(text.contains("  summarized  2\n"), "{text}");
    assert!(
        !text.contains("Input tokens it would have kept from the upstreams: 0"),
        "{text}"
    );

    // Under the trigger: said as well, so the audit counts every request.
    let short = roundtrip(
        &client(),
        json_request(
            &stack.proxy.url("/v1/chat/completions"),
            chat_body("hi", false),
            &[],
        ),
    )
    .await;
    assert_eq!(header(&short, "x-compactor-audit"), "skipped");
}

#[tokio::test]
async fn an_upstreams_context_error_reaches_the_client_as_it_would_without_compactor() {
    let stack = stack_with_defaults(AUDIT).await;
    let body = json!({"model": "gpt-4o-mini", "messages": long_chat(20)}).to_string();
    let url = stack.proxy.url("/v1/chat/completions");
    let response = roundtrip(
        &client(),
        json_request(&url, body, &[("x-mock-window", "500")]),
    )
    .await;
    assert_eq!(
        response.status,
        StatusCode::BAD_REQUEST,
        "no retry compacted"
    );
    assert_eq!(stack.upstream.window_refusals(), 1);
    assert_eq!(stack.summarizer.chat_calls(), 0);
}

#[tokio::test]
async fn one_key_is_audited_while_the_others_are_compacted() {
    let keys = "auth:\n  keys:\n    - name: trial\n      key: sk-trial\n      mode: audit\n    - name: team\n      key: sk-team\n";
    let stack = stack_with_defaults(&format!(
        "  trigger: [{{type: tokens, value: 1500}}]\n  keep: {{type: messages, value: 4}}\n{keys}"
    ))
    .await;
    let messages = long_chat(20);
    let trial = send_chat(
        &stack.proxy,
        &messages,
        &[("authorization", "Bearer sk-trial")],
    )
    .await;
    assert_eq!(trial.status, StatusCode::OK, "{}", trial.text());
    assert_eq!(outcome(&trial), "skipped");
    assert_eq!(header(&trial, "x-compactor-audit"), "summarized");
    let team = send_chat(
        &stack.proxy,
        &messages,
        &[("authorization", "Bearer sk-team")],
    )
    .await;
    assert_eq!(outcome(&team), "summarized");
    assert!(team.headers.get("x-compactor-audit").is_none());
}

#[tokio::test]
async fn a_shadow_sample_makes_the_summary_off_the_request_path_so_enforce_starts_warm() {
    let stack = stack_with_defaults(&format!("{AUDIT}  audit: {{shadow_sample: 1.0}}\n")).await;
    let messages = long_chat(20);
    let first = send_chat(&stack.proxy, &messages, &[]).await;
    assert_eq!(outcome(&first), "skipped");
    assert_eq!(header(&first, "x-compactor-audit"), "summarized");
    let engine = stack.proxy.app.compaction().expect("compaction on");
    tokio::time::timeout(BOUND, engine.background_idle())
        .await
        .expect("the shadow summary within bound");
    assert_eq!(stack.summarizer.chat_calls(), 1, "made for real, once");
    // The next turn finds it: enforce would reuse it, with no summarizer call.
    let mut next = messages.clone();
    next.push(json!({"role": "assistant", "content": "Run the parser tests."}));
    next.push(json!({"role": "user", "content": "Done; and then?"}));
    let second = send_chat(&stack.proxy, &next, &[]).await;
    assert_eq!(outcome(&second), "skipped");
    assert_eq!(header(&second, "x-compactor-audit"), "reused");
    assert_eq!(stack.summarizer.chat_calls(), 1);
    let forwarded = stack.upstream.last_request().unwrap();
    let sent: Value = serde_json::from_slice(&forwarded.body).unwrap();
    assert_eq!(sent["messages"], json!(next), "still forwarded as it came");
}

async fn stack_with_defaults(summarization: &str) -> Stack {
    stack_with(summarization, Default::default()).await
}
