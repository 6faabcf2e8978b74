//! Simulated 100-turn sessions through the real compaction engine, with a summarizer that
//! answers realistic 1 000-token summaries: what compaction costs and how often it reuses.
//! `cargo bench --bench sessions` prints one row per session.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use compactor::compaction::conversation::Api;
use compactor::compaction::engine::CompactionEngine;
use compactor::compaction::scope::Caller;
use compactor::compaction::summarizer::{Summarizer, SummaryFuture, SummaryRequest};
use compactor::compaction::OutcomeKind;
use compactor::config::Config;
use http::HeaderMap;
use serde_json::{json, Value};

/// Answers every call with about 1 000 tokens and counts what it was sent.
#[derive(Default)]
struct Counting {
    calls: AtomicU64,
    /// Estimated like compactor does: four narrow characters or one wide one per token.
    input_tokens: AtomicU64,
}

impl Summarizer for Counting {
    fn summarize(&self, request: SummaryRequest) -> SummaryFuture {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let wide = request.prompt.chars().filter(|c| !c.is_ascii()).count() as u64;
        let narrow = request.prompt.chars().count() as u64 - wide;
        self.input_tokens
            .fetch_add(narrow / 4 + wide, Ordering::Relaxed);
        Box::pin(async { Ok("The session so far, in short. ".repeat(130)) })
    }
}

const CONFIG: &str = r#"
upstreams:
  - name: mock
    base_url: http://127.0.0.1:9/v1
models:
  - match: "gpt-4o*"
    max_input_tokens: 128000
summarization:
  enabled: true
  trigger: [{type: tokens, value: 30000}]
  keep: {type: messages, value: 20}
  max_calls_per_minute_per_tenant: 100000
"#;

fn turn(kind: &str, i: usize, messages: &mut Vec<Value>) {
    let text = |unit: &str, n: usize| format!("{i}: {}", unit.repeat(n));
    match kind {
        "chat" => {
            messages.push(
                json!({"role": "user", "content": text("Please explain the next part. ", 20)}),
            );
            messages.push(json!({"role": "assistant", "content": text("Here is the explanation in detail. ", 45)}));
        }
        _ => {
            let unit = if kind == "cjk-agent" {
                "读取文件并修复错误。"
            } else {
                "fn step() { run(); }\n"
            };
            if i % 5 == 0 {
                messages
                    .push(json!({"role": "user", "content": text("Continue with the task. ", 10)}));
            }
            let id = format!("call_{i}");
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"/repo/src/f{i}.rs\"}}")}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": text(unit, if kind == "cjk-agent" { 60 } else { 100 })}));
            messages
                .push(json!({"role": "assistant", "content": text("Done with this file. ", 8)}));
        }
    }
}

async fn session(kind: &str) -> String {
    let config = Config::from_yaml(CONFIG).expect("valid");
    let summarizer = Arc::new(Counting::default());
    let engine = CompactionEngine::with_summarizer(&config, summarizer.clone());
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    let (mut over, mut reused, mut summarized, mut coverage) = (0u64, 0u64, 0u64, None);
    let mut conversation_tokens = 0;
    for i in 0..100 {
        turn(kind, i, &mut messages);
        messages.push(json!({"role": "user", "content": "next"}));
        let body = json!({"model": "gpt-4o", "messages": messages}).to_string();
        let Ok(compacted) = engine
            .compact(
                &HeaderMap::new(),
                Bytes::from(body),
                "mock",
                Caller::default(),
                Api::ChatCompletions,
            )
            .await
        else {
            continue;
        };
        messages.pop();
        let outcome = compacted.outcome;
        conversation_tokens = outcome.tokens_before;
        if outcome.tokens_before >= 30_000 {
            over += 1;
        }
        match outcome.kind {
            OutcomeKind::Reused => reused += 1,
            OutcomeKind::Summarized => {
                summarized += 1;
                coverage = coverage.or(outcome.coverage);
            }
            _ => {}
        }
    }
    let calls = summarizer.calls.load(Ordering::Relaxed);
    let input_tokens = summarizer.input_tokens.load(Ordering::Relaxed);
    format!(
        "| {kind} | {conversation_tokens} | {over} | {summarized} | {calls} | {:.2} | {:.0} % | {} |",
        input_tokens as f64 / conversation_tokens.max(1) as f64,
        100.0 * reused as f64 / over.max(1) as f64,
        coverage.map(|c| format!("{:.0} %", c * 100.0)).unwrap_or_else(|| "-".into()),
    )
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!("| session (100 turns) | final tokens | over-trigger turns | summarized | summarizer calls | summarizer input ÷ conversation | reuse rate (over-trigger turns) | first-compaction coverage |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for kind in ["chat", "agent", "cjk-agent"] {
        println!("{}", runtime.block_on(session(kind)));
    }
}
