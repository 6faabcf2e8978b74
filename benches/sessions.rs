//! Simulated 100-turn sessions through the real compaction engine, with a summarizer that
//! answers realistic 1 000-token summaries: what compaction costs and how often it reuses,
//! then the agent session under each stage setting (summaries on demand, made ahead, tool
//! outputs cleared first). `cargo bench --bench sessions` prints the two tables.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use compactor::compaction::engine::CompactionEngine;
use compactor::compaction::front_ends::Api;
use compactor::compaction::scope::Caller;
use compactor::compaction::summaries::summarizer::{
    Summarizer, Summary, SummaryFuture, SummaryRequest,
};
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
        Box::pin(async { Ok(Summary::from("The session so far, in short. ".repeat(130))) })
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

/// The stage settings compared on the agent session.
const VARIANTS: [(&str, &str); 4] = [
    ("summarize (default)", ""),
    ("summarize, precompute_at 0.8", "  precompute_at: 0.8\n"),
    (
        "clear_tool_outputs, summarize",
        "  stages: [clear_tool_outputs, summarize]\n",
    ),
    (
        "clear_tool_outputs, summarize, precompute_at 0.8",
        "  stages: [clear_tool_outputs, summarize]\n  precompute_at: 0.8\n",
    ),
];

async fn session(kind: &str) -> String {
    session_with(kind, "").await.row(kind)
}

/// What one session cost.
struct Costs {
    conversation_tokens: u64,
    over: u64,
    summarized: u64,
    reused: u64,
    cleared: u64,
    calls: u64,
    input_tokens: u64,
    coverage: Option<f64>,
}

impl Costs {
    fn row(&self, label: &str) -> String {
        format!(
            "| {label} | {} | {} | {} | {} | {:.2} | {:.0} % | {} |",
            self.conversation_tokens,
            self.over,
            self.summarized,
            self.calls,
            self.input_tokens as f64 / self.conversation_tokens.max(1) as f64,
            100.0 * self.reused as f64 / self.over.max(1) as f64,
            self.coverage
                .map(|c| format!("{:.0} %", c * 100.0))
                .unwrap_or_else(|| "-".into()),
        )
    }

    fn stage_row(&self, label: &str) -> String {
        format!(
            "| {label} | {} | {} | {} | {} | {} | {} |",
            self.over, self.summarized, self.reused, self.cleared, self.calls, self.input_tokens,
        )
    }
}

async fn session_with(kind: &str, extra: &str) -> Costs {
    let config = Config::from_yaml(&format!("{CONFIG}{extra}")).expect("valid");
    let summarizer = Arc::new(Counting::default());
    let engine = CompactionEngine::with_summarizer(&config, summarizer.clone());
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    let (mut over, mut reused, mut summarized, mut cleared, mut coverage) =
        (0u64, 0u64, 0u64, 0u64, None);
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
        // A summary made ahead is ready before the next turn, as it is between turns of a
        // real session (the model's answer takes far longer than the summary).
        engine.background_idle().await;
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
            OutcomeKind::Cleared => cleared += 1,
            _ => {}
        }
    }
    Costs {
        conversation_tokens,
        over,
        summarized,
        reused,
        cleared,
        calls: summarizer.calls.load(Ordering::Relaxed),
        input_tokens: summarizer.input_tokens.load(Ordering::Relaxed),
        coverage,
    }
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
    println!();
    println!("| agent session (100 turns), stages | over-trigger turns | waited on the summarizer | reused | cleared only | summarizer calls | summarizer input tokens |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (label, extra) in VARIANTS {
        let costs = runtime.block_on(session_with("agent", extra));
        println!("{}", costs.stage_row(label));
    }
}
