//! Simulated 200-request sessions through the real compaction engine, with a summarizer that
//! answers realistic 1 000-token summaries: how often a summary is reused at the shipped
//! defaults and at a tight scale, against headroom alone and against the bound (only the
//! latest step kept), then the agent session under each stage setting (summaries on demand,
//! made ahead, tool outputs cleared first). `cargo bench --bench sessions` prints both tables.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use compactor::apis::Api;
use compactor::compaction::engine::CompactionEngine;
use compactor::compaction::planner::tokens::Encoding;
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
    /// Counted with gpt-4o's own encoding, as the conversation's tokens are.
    input_tokens: AtomicU64,
}

impl Summarizer for Counting {
    fn summarize(&self, request: SummaryRequest) -> SummaryFuture {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let tokens = Encoding::for_model("gpt-4o").map_or(0, |e| e.count(&request.prompt));
        self.input_tokens.fetch_add(tokens, Ordering::Relaxed);
        Box::pin(async { Ok(Summary::from("The session so far, in short. ".repeat(130))) })
    }
}

/// The two scales of the reuse table: the shipped defaults on a 128k model, and a tight one
/// (a 32k window with a `fraction: 0.5` trigger) where a turn is a large share of the trigger.
const DEFAULT_SCALE: &str = r#"
upstreams:
  - name: mock
    base_url: http://127.0.0.1:9/v1
models:
  - match: "gpt-4o*"
    max_input_tokens: 128000
summarization:
  enabled: true
  max_calls_per_minute_per_tenant: 100000
"#;

const TIGHT_SCALE: &str = r#"
upstreams:
  - name: mock
    base_url: http://127.0.0.1:9/v1
models:
  - match: "gpt-4o*"
    max_input_tokens: 32000
summarization:
  enabled: true
  trigger: [{type: fraction, value: 0.5}]
  max_calls_per_minute_per_tenant: 100000
"#;

/// Requests per session: each sends the conversation so far and appends the model's answer.
const REQUESTS: usize = 200;
/// Requests of a session sent one per user turn: each holds several responses.
const USER_TURNS: usize = 100;

/// A deterministic spread of sizes (a 64-bit LCG), so tool outputs and answers vary the way
/// real ones do without the bench depending on a random seed.
fn spread(i: usize, salt: u64, low: usize, high: usize) -> usize {
    let x = (i as u64 ^ salt)
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    low + (x >> 33) as usize % (high - low + 1)
}

/// One request's worth of conversation: a chat turn is the user's message (the answer is
/// appended after the request); an agent step is the model's call and the tool's output, with a
/// user message every fifth step. Sizes in characters: chat about 150 + 400 tokens a turn,
/// code agent 200–2 000 tokens per file read, CJK agent 500–3 500 (one token a character).
fn step(kind: &str, i: usize, messages: &mut Vec<Value>) {
    let text = |unit: &str, n: usize| format!("{i}: {}", unit.repeat(n.max(1)));
    match kind {
        "chat" => messages.push(
            json!({"role": "user", "content": text("Please explain the next part. ", spread(i, 1, 10, 30))}),
        ),
        _ => {
            if i % 5 == 0 {
                messages
                    .push(json!({"role": "user", "content": text("Continue with the task. ", 10)}));
            }
            let id = format!("call_{i}");
            messages.push(json!({"role": "assistant", "content": text("Done with the last file. ", 4), "tool_calls": [{"id": id, "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"/repo/src/f{i}.rs\"}}")}}]}));
            let output = if kind == "cjk-agent" {
                text("读取文件并修复错误。", spread(i, 2, 50, 350))
            } else {
                text("fn step() { run(); }\n", spread(i, 3, 38, 380))
            };
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
        }
    }
}

/// What the model answers a chat turn (an agent's answer is its next step's call).
fn answer(kind: &str, i: usize, messages: &mut Vec<Value>) {
    if kind == "chat" {
        let text = "Here is the explanation in detail. ".repeat(spread(i, 4, 20, 70));
        messages.push(json!({"role": "assistant", "content": format!("{i}: {text}")}));
    }
}

/// How a client sends a conversation: a request per model response (an agent loop that runs
/// its tools itself), or a request per user turn whose answer holds several responses whose
/// requests compactor never saw (a loop run behind it). The second is the case compactor's
/// growth estimate, one response a request, undercounts: here the steps run behind it are in the
/// history as the client's own tool messages, which no client through compactor holds unless it
/// sent them (a hosted tool's call and result come back inside one response), so this measures
/// the cost of that estimate where it is wrong, not a client seen in the field.
#[derive(Clone, Copy, PartialEq)]
enum Cadence {
    PerResponse,
    PerUserTurn,
}

/// A user turn's request (the user's message) and, after it, its answer: one to three steps
/// of call and output (for chat a web search whose results are 300-900 tokens; for agents the
/// same step sizes as one step per request), then the answer's text.
fn user_turn(kind: &str, i: usize, messages: &mut Vec<Value>, answered: bool) {
    if !answered {
        let text = format!(
            "{i}: {}",
            "Please go on with the next part. ".repeat(spread(i, 1, 10, 30))
        );
        messages.push(json!({"role": "user", "content": text}));
        return;
    }
    for s in 0..spread(i, 5, 1, 3) {
        let at = i * 8 + s + 1;
        if kind == "chat" {
            let id = format!("search_{at}");
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "web_search", "arguments": format!("{{\"q\":\"part {at}\"}}")}}]}));
            let results = format!(
                "{at}: {}",
                "A result about the next part. ".repeat(spread(at, 6, 45, 135))
            );
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": results}));
            continue;
        }
        let mut step_messages = Vec::new();
        step(kind, at, &mut step_messages);
        messages.extend(step_messages.into_iter().filter(|m| m["role"] != "user"));
    }
    answer("chat", i, messages);
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

/// The reuse table's settings: headroom alone (before `headroom_turns`), the shipped default,
/// and the bound no cut can beat (headroom so low that only the latest step stays verbatim).
const REUSE_VARIANTS: [(&str, &str); 3] = [
    ("headroom only", "  headroom_turns: 0\n"),
    ("default", ""),
    ("bound", "  headroom: 0.01\n"),
];

/// What one session cost.
struct Costs {
    conversation_tokens: u64,
    over: u64,
    summarized: u64,
    reused: u64,
    cleared: u64,
    calls: u64,
    input_tokens: u64,
    /// Tokens forwarded, summed over the over-trigger turns.
    forwarded: u64,
}

impl Costs {
    fn reuse(&self) -> f64 {
        self.reused as f64 / self.over.max(1) as f64
    }

    fn stage_row(&self, label: &str) -> String {
        format!(
            "| {label} | {} | {} | {} | {} | {} | {} |",
            self.over, self.summarized, self.reused, self.cleared, self.calls, self.input_tokens,
        )
    }
}

async fn session_with(scale: &str, trigger: u64, kind: &str, extra: &str) -> Costs {
    session_at(scale, trigger, kind, extra, Cadence::PerResponse, REQUESTS).await
}

async fn session_at(
    scale: &str,
    trigger: u64,
    kind: &str,
    extra: &str,
    cadence: Cadence,
    requests: usize,
) -> Costs {
    let config = Config::from_yaml(&format!("{scale}{extra}")).expect("valid");
    let summarizer = Arc::new(Counting::default());
    let engine = CompactionEngine::with_summarizer(&config, summarizer.clone());
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    let (mut over, mut reused, mut summarized, mut cleared, mut forwarded) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut conversation_tokens = 0;
    for i in 0..requests {
        match cadence {
            Cadence::PerResponse => step(kind, i, &mut messages),
            Cadence::PerUserTurn => user_turn(kind, i, &mut messages, false),
        }
        let body = json!({"model": "gpt-4o", "messages": messages}).to_string();
        let compacted = engine
            .compact(
                &HeaderMap::new(),
                Bytes::from(body),
                "mock",
                Caller::default(),
                &Api::ChatCompletions.body_request(),
            )
            .await;
        match cadence {
            Cadence::PerResponse => answer(kind, i, &mut messages),
            Cadence::PerUserTurn => user_turn(kind, i, &mut messages, true),
        }
        let Ok(compacted) = compacted else {
            continue;
        };
        // A summary made ahead is ready before the next turn, as it is between turns of a
        // real session (the model's answer takes far longer than the summary).
        engine.background_idle().await;
        let outcome = compacted.outcome;
        conversation_tokens = outcome.tokens_before;
        if outcome.tokens_before >= trigger {
            over += 1;
            forwarded += outcome.tokens_after;
        }
        match outcome.kind {
            OutcomeKind::Reused => reused += 1,
            OutcomeKind::Summarized => summarized += 1,
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
        forwarded,
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!("| scale | session | final tokens | over-trigger turns | summarized (default) | summarizer input ÷ conversation | mean forwarded tokens, headroom only → default | reuse, headroom only | reuse, default | reuse bound (latest step only) |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let scales = [
        (
            "default (trigger 60 000, window 128k)",
            DEFAULT_SCALE,
            60_000,
        ),
        ("tight (window 32k, fraction 0.5)", TIGHT_SCALE, 16_000),
    ];
    let cadences = [
        (Cadence::PerResponse, REQUESTS, "per response"),
        (Cadence::PerUserTurn, USER_TURNS, "per user turn"),
    ];
    for (cadence, requests, cadence_label) in cadences {
        for (scale_label, scale, trigger) in scales {
            for kind in ["chat", "agent", "cjk-agent"] {
                let [before, default, bound] = REUSE_VARIANTS.map(|(_, extra)| {
                    runtime.block_on(session_at(scale, trigger, kind, extra, cadence, requests))
                });
                println!(
                    "| {scale_label} | {kind}, {requests} requests, one {cadence_label} | {} | {} | {} | {:.2} | {} → {} | {:.0} % | {:.0} % | {:.0} % |",
                    default.conversation_tokens,
                    default.over,
                    default.summarized,
                    default.input_tokens as f64 / default.conversation_tokens.max(1) as f64,
                    before.forwarded / before.over.max(1),
                    default.forwarded / default.over.max(1),
                    100.0 * before.reuse(),
                    100.0 * default.reuse(),
                    100.0 * bound.reuse(),
                );
            }
        }
    }
    println!();
    println!("| session | summarizer calls, on demand | summarizer calls, precompute_at 0.8 | waited on the summarizer, on demand → precompute_at 0.8 |");
    println!("|---|---:|---:|---:|");
    for (cadence, requests, cadence_label) in cadences {
        for (scale_label, scale, trigger) in scales {
            for kind in ["chat", "agent", "cjk-agent"] {
                let [on_demand, ahead] = ["", "  precompute_at: 0.8\n"].map(|extra| {
                    runtime.block_on(session_at(scale, trigger, kind, extra, cadence, requests))
                });
                println!(
                    "| {scale_label}, {kind}, one request {cadence_label} | {} | {} | {} → {} |",
                    on_demand.calls, ahead.calls, on_demand.summarized, ahead.summarized,
                );
            }
        }
    }
    println!();
    println!("| agent session ({REQUESTS} requests, default scale), stages | over-trigger turns | waited on the summarizer | reused | cleared only | summarizer calls | summarizer input tokens |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (label, extra) in VARIANTS {
        let costs = runtime.block_on(session_with(DEFAULT_SCALE, 60_000, "agent", extra));
        println!("{}", costs.stage_row(label));
    }
}
