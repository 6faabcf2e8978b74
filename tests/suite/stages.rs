//! The cheap stages before a summary and summaries made ahead of need: `clear_tool_outputs`
//! (placeholders outside the kept tail, groups intact, the same bytes turn after turn, no
//! summarizer call when it is enough) and `precompute_at` (a long session crosses the trigger
//! with no request waiting on the summarizer, and no more calls than without it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::common::*;
use bytes::Bytes;
use compactor::apis::Api;
use compactor::compaction::engine::CompactionEngine;
use compactor::compaction::scope::Caller;
use compactor::compaction::summaries::summarizer::{
    Summarizer, Summary, SummaryFuture, SummaryRequest,
};
use compactor::compaction::OutcomeKind;
use compactor::config::Config;
use http::{HeaderMap, HeaderValue, StatusCode};
use mock_upstream::MockOptions;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// An agent run: a task, then `files` read-and-report groups with large, distinct outputs.
fn agent_run(files: usize) -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Read the sources and fix the bug."}),
    ];
    for i in 0..files {
        messages.extend(read_group(i));
    }
    messages.push(json!({"role": "user", "content": "Go on."}));
    messages
}

fn read_group(i: usize) -> [Value; 3] {
    read_group_of(i, 60)
}

/// A read of `lines` lines of about 8 tokens.
fn read_group_of(i: usize, lines: usize) -> [Value; 3] {
    let id = format!("call_{i}");
    [
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/f{i}.rs\"}}")}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": format!("file {i} line: fn step() {{ run(); }}\n").repeat(lines)}),
        json!({"role": "assistant", "content": format!("Read file {i}.")}),
    ]
}

/// Each forwarded message's raw bytes.
fn raw_messages(body: &[u8]) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct View<'a> {
        #[serde(borrow)]
        messages: Vec<&'a RawValue>,
    }
    let view: View<'_> = serde_json::from_slice(body).expect("a chat body");
    view.messages.iter().map(|m| m.get().to_string()).collect()
}

const CLEARING: &str = "  stages: [clear_tool_outputs, summarize]\n  clear_tool_outputs: {min_tokens: 100}\n  keep: {type: messages, value: 6}\n  headroom: 0.75\n  max_calls_per_minute_per_tenant: 1000\n";

async fn clearing_stack(trigger: u64) -> Stack {
    let summarization = format!("{CLEARING}  trigger: [{{type: tokens, value: {trigger}}}]\n");
    stack_with(&summarization, MockOptions::default()).await
}

#[tokio::test]
async fn clearing_alone_brings_an_agent_run_under_the_trigger_without_a_summarizer_call() {
    let stack = clearing_stack(5_000).await;
    let messages = agent_run(12);
    let response = send_chat(&stack.proxy, &messages, &[]).await;
    // The mock checks every call against its result: groups are intact.
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "cleared");
    assert_eq!(stack.summarizer.chat_calls(), 0);
    let sent = stack.upstream.last_request().unwrap().body;
    let sent_raw = raw_messages(&sent);
    let original = raw_messages(
        json!({"model": "gpt-4o-mini", "messages": messages})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(
        sent_raw.len(),
        original.len(),
        "no message added or dropped"
    );
    let tail = original.len() - 6;
    let mut cleared = 0;
    for (i, (sent, original)) in sent_raw.iter().zip(&original).enumerate() {
        let message: Value = serde_json::from_str(sent).unwrap();
        let is_old_output = message["role"] == "tool" && i < tail;
        if is_old_output {
            let text = message["content"].as_str().unwrap();
            assert!(text.contains("cleared this output of read_file"), "{text}");
            assert_eq!(
                message["tool_call_id"],
                serde_json::from_str::<Value>(original).unwrap()["tool_call_id"]
            );
            cleared += 1;
        } else {
            assert_eq!(sent, original, "message {i} is forwarded byte for byte");
        }
    }
    assert_eq!(cleared, 10);
    assert_eq!(response.headers["x-compactor-tool-outputs-cleared"], "10");
}

#[tokio::test]
async fn cleared_outputs_are_byte_stable_from_turn_to_turn() {
    let stack = clearing_stack(5_000).await;
    let mut messages = agent_run(12);
    let first = send_chat(&stack.proxy, &messages, &[]).await;
    assert_eq!(outcome(&first), "cleared");
    let first = raw_messages(&stack.upstream.last_request().unwrap().body);

    messages.pop();
    messages.extend(read_group(12));
    messages.push(json!({"role": "user", "content": "Go on."}));
    let second = send_chat(&stack.proxy, &messages, &[]).await;
    assert_eq!(outcome(&second), "cleared");
    let second = raw_messages(&stack.upstream.last_request().unwrap().body);
    // Everything the first turn forwarded, up to the start of its kept tail, goes out again
    // as the same bytes: the provider's prompt cache keeps hitting.
    let tail = first.len() - 6;
    assert_eq!(first[..tail], second[..tail]);
    assert!(
        second[tail].contains("cleared this output"),
        "newly out of the tail"
    );
}

#[tokio::test]
async fn when_clearing_is_not_enough_the_summarizer_sees_the_placeholders() {
    let stack = clearing_stack(1_200).await;
    let response = send_chat(&stack.proxy, &agent_run(12), &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "summarized");
    assert_eq!(stack.summarizer.chat_calls(), 1);
    let prompt = stack.summarizer.last_request().unwrap().json()["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(prompt.contains("cleared this output of read_file"));
    assert!(
        !prompt.contains("file 0 line"),
        "a cleared output is not shown"
    );
}

/// Answers every call with about 1 000 tokens and counts the calls.
#[derive(Default)]
struct Counting {
    calls: AtomicU64,
}

impl Summarizer for Counting {
    fn summarize(&self, _: SummaryRequest) -> SummaryFuture {
        self.calls.fetch_add(1, Ordering::Relaxed);
        Box::pin(async { Ok(Summary::from("The session so far, in short. ".repeat(130))) })
    }
}

/// What a 100-turn agent session cost: summarizer calls, requests that waited on one, and the
/// outcomes of the first requests to use a summary made ahead.
struct Session {
    calls: u64,
    waited: u64,
    compacted: u64,
    announced: Vec<(String, bool)>,
}

async fn session(precompute_at: Option<f64>) -> Session {
    session_of(precompute_at, 20_000, |_| 60).await
}

/// A session at `trigger` whose i-th read has `lines(i)` lines.
async fn session_of(
    precompute_at: Option<f64>,
    trigger: u64,
    lines: fn(usize) -> usize,
) -> Session {
    let precompute = precompute_at
        .map(|at| format!("  precompute_at: {at}\n"))
        .unwrap_or_default();
    let yaml = format!("upstreams:\n  - name: mock\n    base_url: http://127.0.0.1:9/v1\nsummarization:\n  enabled: true\n  trigger: [{{type: tokens, value: {trigger}}}]\n  keep: {{type: messages, value: 20}}\n  max_calls_per_minute_per_tenant: 100000\n{precompute}");
    let config = Config::from_yaml(&yaml).expect("valid");
    let summarizer = Arc::new(Counting::default());
    let engine = CompactionEngine::with_summarizer(&config, summarizer.clone());
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    let mut sse = HeaderMap::new();
    sse.insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    let (mut waited, mut compacted, mut announced) = (0, 0, Vec::new());
    for i in 0..100 {
        if i % 5 == 0 {
            messages
                .push(json!({"role": "user", "content": format!("{i}: continue with the task")}));
        }
        messages.extend(read_group_of(i, lines(i)));
        let body = json!({"model": "local-model", "messages": messages}).to_string();
        let result = engine
            .compact(
                &HeaderMap::new(),
                Bytes::from(body),
                "mock",
                Caller::default(),
                &Api::ChatCompletions.body_request(),
            )
            .await
            .unwrap_or_else(|_| panic!("turn {i} compacts"));
        engine.background_idle().await;
        let outcome = &result.outcome;
        match outcome.kind {
            OutcomeKind::Summarized => waited += 1,
            OutcomeKind::Reused
                if outcome.reason.label() == "precomputed" || announced.len() < 3 =>
            {
                let notice = result.notice_for(StatusCode::OK, &sse).is_some();
                announced.push((outcome.reason.to_string(), notice));
            }
            _ => {}
        }
        if matches!(outcome.kind, OutcomeKind::Summarized | OutcomeKind::Reused) {
            compacted += 1;
        }
    }
    Session {
        calls: summarizer.calls.load(Ordering::Relaxed),
        waited,
        compacted,
        announced,
    }
}

#[tokio::test]
async fn summaries_made_ahead_mean_no_request_waits_and_no_extra_calls() {
    let without = session(None).await;
    let with = session(Some(0.8)).await;
    assert!(without.waited > 0, "the baseline waits on its summaries");
    assert!(without.compacted > 50 && with.compacted > 50);
    assert_eq!(with.waited, 0, "no request waited on the summarizer");
    // Every summary made ahead is used, but for the last one when the session ends inside
    // its lead (it was made for a crossing the session never reached); and no more are used
    // than the baseline makes.
    let used = with
        .announced
        .iter()
        .filter(|(reason, _)| reason == "precomputed")
        .count() as u64;
    assert!(
        used <= without.calls && with.calls <= used + 1,
        "{} calls ahead ({used} used) vs {} on demand",
        with.calls,
        without.calls
    );
    // The first request to use a summary made ahead carries the notice; reuses after it don't.
    assert_eq!(with.announced[0], ("precomputed".to_string(), true));
    assert_eq!(with.announced[1], ("sticky".to_string(), false));
}

#[tokio::test]
async fn summaries_made_ahead_cost_at_most_one_call_more_when_a_request_is_a_large_share_of_the_trigger(
) {
    // Reads of 40 to 400 lines (about 300 to 3 000 tokens), each request two responses (the
    // call, and the text after its result): the request that crosses the trigger is well past
    // it. A summary made ahead for the trigger alone was taken up larger than one made on
    // demand and reused for fewer turns (22 calls ahead against 20 on demand at a 12 000-token
    // trigger). Planned for one request past it, it still did where the lead from
    // `precompute_at` left less room than a cut on demand (32 against 26 at 8 000): ahead of
    // need starts later there, or not at all. Measured between requests (about 2 000 tokens a
    // request), the lead fits from about 16 000 on (12 against 13 calls at 20 000, 3 requests
    // waiting against 13); at 8 000 and 12 000 it does not (26 against 26, 20 against 20).
    let uneven = |i: usize| 40 + (i * 7919 + 13) % 361;
    for trigger in [20_000, 8_000] {
        let without = session_of(None, trigger, uneven).await;
        let with = session_of(Some(0.8), trigger, uneven).await;
        assert!(without.calls >= 5, "{} calls on demand", without.calls);
        assert!(
            with.calls <= without.calls + 1,
            "{trigger}: {} calls ahead vs {} on demand",
            with.calls,
            without.calls
        );
        if trigger == 20_000 {
            // Where there is room for a lead, some requests that would wait do not.
            assert!(
                with.waited < without.waited,
                "{} waited ahead vs {}",
                with.waited,
                without.waited
            );
        }
    }
}

#[tokio::test]
async fn the_first_request_over_the_trigger_reuses_the_summary_made_ahead_with_the_notice() {
    let stack = stack_with(
        "  trigger: [{type: tokens, value: 3000}]\n  keep: {type: messages, value: 4}\n  precompute_at: 0.6\n  max_calls_per_minute_per_tenant: 1000\n",
        MockOptions::default(),
    )
    .await;
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    let mut outcomes = Vec::new();
    for i in 0..20 {
        messages.push(json!({"role": "user", "content": format!("step {i}")}));
        messages.push(json!({"role": "assistant", "content": "done ".repeat(200)}));
        let body = json!({"model": "gpt-4o-mini", "stream": true, "messages": messages});
        let response = roundtrip(
            &client(),
            json_request(
                &stack.proxy.url("/v1/chat/completions"),
                body.to_string(),
                &[],
            ),
        )
        .await;
        stack.proxy.background_idle().await;
        assert_eq!(response.status, 200);
        let notice = response.text().starts_with(": context_compacting");
        outcomes.push((outcome(&response), notice));
    }
    assert!(
        !outcomes.iter().any(|(o, _)| o == "summarized"),
        "{outcomes:?}"
    );
    let first = outcomes
        .iter()
        .position(|(o, _)| o == "reused")
        .unwrap_or_else(|| panic!("reused once over the trigger: {outcomes:?}"));
    assert!(
        outcomes[first].1,
        "the first compacted request carries the notice"
    );
    assert!(!outcomes[first + 1].1);
    assert!(stack.summarizer.chat_calls() >= 1);
}
