//! The planner alone, on generated agent conversations of 10 KB, 1 MB and 10 MB:
//! the under-trigger check (the size bound alone, and parse + count), the full plan + rewrite,
//! and the summarizer's input for a summarize decision; the parse + count and plan + rewrite
//! again for the same agent run as a Responses request and as a Messages request.

use compactor::apis::chat;
use std::hint::black_box;

use compactor::apis::chat::summary_message;
use compactor::apis::messages;
use compactor::apis::responses;
use compactor::apis::responses::summary_item;
use compactor::apis::Parsed;
use compactor::compaction::planner::conversation::Conversation;
use compactor::compaction::planner::plan::{over_trigger, plan, Decision, NoCache, PlanSettings};
use compactor::compaction::planner::rewrite::{rewrite, Splice};
use compactor::compaction::planner::size_bound::{provably_under, ModelBounds};
use compactor::compaction::planner::tokens::{Encoding, ModelTable, TokenModel, Weights};
use compactor::compaction::summaries::summary_input::{self, InputSettings};
use compactor::config::{
    ContextSize, Oversize, SummarizationConfig, SummaryPlacement, SummaryRole,
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde_json::json;

/// An agent conversation of about `target` bytes: system prompt, user turns, tool calls with
/// results of a few hundred bytes, some escaped text and some CJK.
fn conversation(target: usize) -> String {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent. Follow the rules.\n".repeat(20)}),
    ];
    let mut i = 0;
    let mut size = 0;
    // Whole rounds only, so every call has its result.
    while size < target || i % 4 != 0 {
        let turn = match i % 4 {
            0 => {
                json!({"role": "user", "content": format!("Step {i}: please look at \"src/main.rs\" and fix the bug.\n你好，世界。")})
            }
            1 => {
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{i}"), "type": "function",
                    "function": {"name": "read_file", "arguments": format!("{{\"path\":\"/repo/src/file_{i}.rs\"}}")}}]})
            }
            2 => {
                json!({"role": "tool", "tool_call_id": format!("call_{}", i - 1), "content": format!("fn main() {{\n    println!(\"{i}\");\n}}\n").repeat(12)})
            }
            _ => {
                json!({"role": "assistant", "content": format!("I changed line {i}; the tests pass now. ").repeat(4)})
            }
        };
        size += turn.to_string().len();
        messages.push(turn);
        i += 1;
    }
    messages.push(json!({"role": "user", "content": "What next?"}));
    json!({"model": "gpt-4o", "stream": true, "temperature": 0.2, "messages": messages}).to_string()
}

/// The same agent run as a Responses request: reasoning before each call, calls and outputs as
/// items, the system prompt as `instructions`.
fn responses_conversation(target: usize) -> String {
    let mut items = vec![json!({"role": "developer", "content": "Follow the rules.\n".repeat(20)})];
    let mut i = 0;
    let mut size = 0;
    while size < target || i % 5 != 0 {
        let item = match i % 5 {
            0 => {
                json!({"role": "user", "content": [{"type": "input_text", "text": format!("Step {i}: please look at \"src/main.rs\" and fix the bug.\n你好，世界。")}]})
            }
            1 => {
                json!({"type": "reasoning", "id": format!("rs_{i}"), "summary": [], "encrypted_content": "gAAAAB".repeat(40)})
            }
            2 => {
                json!({"type": "function_call", "call_id": format!("call_{}", i - 2), "name": "read_file", "arguments": format!("{{\"path\":\"/repo/src/file_{i}.rs\"}}")})
            }
            3 => {
                json!({"type": "function_call_output", "call_id": format!("call_{}", i - 3), "output": format!("fn main() {{\n    println!(\"{i}\");\n}}\n").repeat(12)})
            }
            _ => {
                json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": format!("I changed line {i}; the tests pass now. ").repeat(4)}]})
            }
        };
        size += item.to_string().len();
        items.push(item);
        i += 1;
    }
    items.push(json!({"role": "user", "content": "What next?"}));
    json!({"model": "gpt-4.1", "stream": true, "instructions": "You are a coding agent.", "input": items}).to_string()
}

/// The same agent run as an Anthropic Messages request: thinking and a `tool_use` in the
/// assistant turn, the `tool_result` in the next user turn, the system prompt top-level.
fn messages_conversation(target: usize) -> String {
    let mut messages = Vec::new();
    let mut i = 0;
    let mut size = 0;
    while size < target || i % 4 != 0 {
        let message = match i % 4 {
            0 => {
                json!({"role": "user", "content": format!("Step {i}: please look at \"src/main.rs\" and fix the bug.\n你好，世界。")})
            }
            1 => {
                json!({"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Read the file first.", "signature": "EqQB".repeat(40)},
                    {"type": "tool_use", "id": format!("toolu_{i}"), "name": "Read", "input": {"file_path": format!("/repo/src/file_{i}.rs")}}]})
            }
            2 => {
                json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{}", i - 1), "content": format!("fn main() {{\n    println!(\"{i}\");\n}}\n").repeat(12)}]})
            }
            _ => {
                json!({"role": "assistant", "content": format!("I changed line {i}; the tests pass now. ").repeat(4)})
            }
        };
        size += message.to_string().len();
        messages.push(message);
        i += 1;
    }
    messages.push(json!({"role": "user", "content": "What next?"}));
    json!({"model": "claude-sonnet-4-5", "max_tokens": 4096, "stream": true,
           "system": "You are a coding agent.\n".repeat(20), "messages": messages})
    .to_string()
}

fn parse_messages(body: &[u8]) -> Conversation<'_> {
    match messages::parse(body) {
        Ok(Parsed::Conversation(conversation)) => conversation,
        _ => panic!("expected a conversation"),
    }
}

fn parse_responses(body: &[u8]) -> Conversation<'_> {
    match responses::parse(body) {
        Ok(Parsed::Conversation(conversation)) => conversation,
        _ => panic!("expected a conversation"),
    }
}

fn settings(trigger: ContextSize) -> PlanSettings {
    PlanSettings {
        triggers: vec![trigger],
        ..PlanSettings::from_config(&SummarizationConfig::default())
    }
}

fn benches(c: &mut Criterion) {
    let model = TokenModel::default();
    let mut group = c.benchmark_group("planner");
    for (label, size) in [
        ("10KB", 10 * 1024),
        ("1MB", 1024 * 1024),
        ("10MB", 10 * 1024 * 1024),
    ] {
        let body = conversation(size);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.sample_size(if size > 2 * 1024 * 1024 { 10 } else { 50 });
        let under = settings(ContextSize::Tokens(u64::MAX / 2));
        group.bench_with_input(
            BenchmarkId::new("under_trigger_check", label),
            &body,
            |b, body| {
                b.iter(|| {
                    let conversation = chat::parse(black_box(body.as_bytes())).expect("parses");
                    black_box(over_trigger(&conversation, &under, &model))
                })
            },
        );
        // The same count with learned weights, and with OpenAI's o200k tokenizer (what a body
        // near a trigger of an OpenAI model gets).
        let counting_models = [
            (
                "count_calibrated",
                TokenModel {
                    calibration: Some(Weights::prior(3.0)),
                    ..model
                },
            ),
            (
                "count_exact_o200k",
                TokenModel {
                    exact: Some(Encoding::O200k),
                    ..model
                },
            ),
            (
                "count_exact_tokenizer_json",
                TokenModel {
                    exact: Some(
                        Encoding::from_file(concat!(
                            env!("CARGO_MANIFEST_DIR"),
                            "/tests/fixtures/tokenizer.json"
                        ))
                        .expect("the fixture loads"),
                    ),
                    ..model
                },
            ),
        ];
        for (name, counting) in counting_models {
            group.bench_with_input(BenchmarkId::new(name, label), &body, |b, body| {
                b.iter(|| {
                    let conversation = chat::parse(black_box(body.as_bytes())).expect("parses");
                    black_box(over_trigger(&conversation, &under, &counting))
                })
            });
        }
        let bounds = ModelBounds::of(&ModelTable::default());
        group.bench_with_input(
            BenchmarkId::new("under_trigger_size_bound", label),
            &body,
            |b, body| {
                b.iter(|| {
                    black_box(provably_under(
                        black_box(body.as_bytes()),
                        &under,
                        &bounds,
                        1.0,
                    ))
                })
            },
        );
        let over = settings(ContextSize::Messages(10));
        let summary = summary_message(&"summary text ".repeat(60), SummaryRole::User);
        let item = summary_item(&"summary text ".repeat(60));
        let summary_text = "summary text ".repeat(60);
        group.bench_with_input(
            BenchmarkId::new("plan_and_rewrite", label),
            &body,
            |b, body| {
                b.iter(|| {
                    let conversation = chat::parse(black_box(body.as_bytes())).expect("parses");
                    let plan = plan(&conversation, &over, &model, false, &mut NoCache);
                    let Decision::Summarize { layout, .. } = plan.decision else {
                        panic!("expected a summarize plan");
                    };
                    black_box(rewrite(&conversation, &layout, &summary).expect("valid"))
                })
            },
        );
        let responses_body = responses_conversation(size);
        group.bench_with_input(
            BenchmarkId::new("responses_under_trigger_check", label),
            &responses_body,
            |b, body| {
                b.iter(|| {
                    let conversation = parse_responses(black_box(body.as_bytes()));
                    black_box(over_trigger(&conversation, &under, &model))
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("responses_plan_and_rewrite", label),
            &responses_body,
            |b, body| {
                b.iter(|| {
                    let conversation = parse_responses(black_box(body.as_bytes()));
                    let plan = plan(&conversation, &over, &model, false, &mut NoCache);
                    let Decision::Summarize { layout, .. } = plan.decision else {
                        panic!("expected a summarize plan");
                    };
                    black_box(rewrite(&conversation, &layout, &item).expect("valid"))
                })
            },
        );
        let messages_body = messages_conversation(size);
        group.bench_with_input(
            BenchmarkId::new("messages_under_trigger_check", label),
            &messages_body,
            |b, body| {
                b.iter(|| {
                    let conversation = parse_messages(black_box(body.as_bytes()));
                    black_box(over_trigger(&conversation, &under, &model))
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("messages_plan_and_rewrite", label),
            &messages_body,
            |b, body| {
                b.iter(|| {
                    let conversation = parse_messages(black_box(body.as_bytes()));
                    let plan = plan(&conversation, &over, &model, false, &mut NoCache);
                    let Decision::Summarize { layout, .. } = plan.decision else {
                        panic!("expected a summarize plan");
                    };
                    let splice = Splice::new(
                        &conversation,
                        &layout,
                        SummaryRole::User,
                        SummaryPlacement::Auto,
                    )
                    .expect("valid");
                    black_box(splice.apply(body.as_bytes(), &summary_text, SummaryRole::User))
                })
            },
        );
        // What a summarize decision adds: the transcript of the evicted messages as shipped
        // (folded into at most 4 calls of 24 000 tokens, the budget without a known window).
        let conversation = chat::parse(body.as_bytes()).expect("parses");
        let planned = plan(&conversation, &over, &model, false, &mut NoCache);
        let Decision::Summarize {
            to_summarize,
            ref layout,
            ..
        } = planned.decision
        else {
            panic!("expected a summarize plan");
        };
        let input_settings = InputSettings {
            budget: Some(24_000),
            oversize: Oversize::Fold,
            max_calls: 4,
            model,
        };
        // What `summarization.retrieval` adds to a compacted request: the refs of the summarized
        // messages, the index after the summary and the tool (every summarized or reused turn).
        let splice = Splice::new(
            &conversation,
            layout,
            SummaryRole::User,
            SummaryPlacement::Auto,
        )
        .expect("valid");
        let compacted = splice.apply(body.as_bytes(), &summary_text, SummaryRole::User);
        let retrieval = compactor::config::RetrievalConfig {
            enabled: true,
            ..Default::default()
        };
        group.bench_with_input(
            BenchmarkId::new("retrieval_prepare", label),
            &compacted,
            |b, compacted| {
                b.iter(|| {
                    black_box(compactor::retrieval::prepare(
                        &compactor::apis::chat::retrieval::ChatRetrieval,
                        &retrieval,
                        body.as_bytes(),
                        black_box(compacted),
                        (&summary_text, splice.covered()),
                    ))
                    .expect("prepared")
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("summary_input", label),
            &to_summarize,
            |b, to_summarize| {
                b.iter(|| {
                    black_box(summary_input::select(
                        &conversation,
                        black_box(to_summarize),
                        &planned.message_tokens,
                        None,
                        &input_settings,
                    ))
                })
            },
        );
    }
    group.finish();
}

criterion_group!(planner, benches);
criterion_main!(planner);
