//! One property suite over every front-end: the same random agent conversations, written in
//! each API's own format, must keep the same invariants through the planner and the splice:
//! a tool call never loses its result, every message kept is kept byte for byte, and the
//! compacted prefix is byte-identical on the next turn when the summary is reused.

use crate::common::One;
use compactor::apis::{Api, Parsed};
use compactor::compaction::planner::conversation::Conversation;
use compactor::compaction::planner::plan::{plan, CachedSummary, Decision, NoCache, PlanSettings};
use compactor::compaction::planner::rewrite::Splice;
use compactor::compaction::planner::skills::SkillRescue;
use compactor::compaction::planner::structure::{validate, Layout};
use compactor::compaction::planner::tokens::TokenModel;
use compactor::config::{ContextSize, SummaryPlacement, SummaryRole};
use proptest::prelude::*;
use serde_json::{json, Value};

/// One exchange of an agent run: the user speaks, the assistant answers, in between it calls
/// tools (parallel calls answered together), each result of some size.
#[derive(Debug, Clone)]
struct Exchange {
    user: usize,
    calls: Vec<Vec<usize>>,
    answer: usize,
}

fn exchange() -> impl Strategy<Value = Exchange> {
    (
        1usize..120,
        prop::collection::vec(prop::collection::vec(1usize..400, 1..3), 0..3),
        1usize..120,
    )
        .prop_map(|(user, calls, answer)| Exchange {
            user,
            calls,
            answer,
        })
}

/// The run in `api`'s format: a system prompt where the API has one, the exchanges done, and
/// the user turn that opens the next one. The next turn of the conversation renders one more
/// exchange done: its items begin with every item of this one.
fn render(api: Api, system: bool, exchanges: &[Exchange], asking: &Exchange) -> String {
    let question = |t: usize, exchange: &Exchange| {
        user(api, &format!("u{t} {}", "words ".repeat(exchange.user)))
    };
    let mut items: Vec<Value> = Vec::new();
    let mut id = 0;
    for (t, exchange) in exchanges.iter().enumerate() {
        items.push(question(t, exchange));
        for group in &exchange.calls {
            let ids: Vec<String> = group
                .iter()
                .map(|_| {
                    id += 1;
                    format!("call_{id}")
                })
                .collect();
            items.extend(calls(api, &ids));
            items.extend(results(api, &ids, group));
        }
        items.push(assistant(
            api,
            &format!("a{t} {}", "reply ".repeat(exchange.answer)),
        ));
    }
    items.push(question(exchanges.len(), asking));
    let body = match api {
        Api::ChatCompletions => {
            let mut messages = Vec::new();
            if system {
                messages.push(json!({"role": "system", "content": "you are an agent"}));
            }
            messages.extend(items);
            json!({"model": "m", "messages": messages})
        }
        Api::Responses => {
            let mut body = json!({"model": "m", "input": items});
            if system {
                body["instructions"] = json!("you are an agent");
            }
            body
        }
        Api::Messages => {
            let mut body = json!({"model": "m", "max_tokens": 64, "messages": items});
            if system {
                body["system"] = json!("you are an agent");
            }
            body
        }
        Api::Gemini => {
            let mut body = json!({"contents": items, "generationConfig": {"maxOutputTokens": 64}});
            if system {
                body["systemInstruction"] = json!({"parts": [{"text": "you are an agent"}]});
            }
            body
        }
    };
    body.to_string()
}

fn user(api: Api, text: &str) -> Value {
    match api {
        Api::Responses => json!({"type": "message", "role": "user", "content": text}),
        Api::Gemini => json!({"role": "user", "parts": [{"text": text}]}),
        _ => json!({"role": "user", "content": text}),
    }
}

fn assistant(api: Api, text: &str) -> Value {
    match api {
        Api::ChatCompletions => json!({"role": "assistant", "content": text}),
        Api::Responses => json!({"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": text}]}),
        Api::Messages => json!({"role": "assistant", "content": [{"type": "text", "text": text}]}),
        Api::Gemini => json!({"role": "model", "parts": [{"text": text}]}),
    }
}

fn calls(api: Api, ids: &[String]) -> Vec<Value> {
    match api {
        Api::ChatCompletions => vec![json!({"role": "assistant", "content": null,
            "tool_calls": ids.iter().map(|id| json!({"id": id, "type": "function",
                "function": {"name": "read_file", "arguments": "{\"path\":\"a.rs\"}"}})).collect::<Vec<_>>()})],
        Api::Responses => ids
            .iter()
            .map(|id| {
                json!({"type": "function_call", "call_id": id, "name": "read_file",
                "arguments": "{\"path\":\"a.rs\"}"})
            })
            .collect(),
        Api::Messages => vec![json!({"role": "assistant",
            "content": ids.iter().map(|id| json!({"type": "tool_use", "id": id,
                "name": "read_file", "input": {"path": "a.rs"}})).collect::<Vec<_>>()})],
        // Signed as Google signs a turn: its first call.
        Api::Gemini => vec![json!({"role": "model",
            "parts": ids.iter().enumerate().map(|(k, id)| {
                let mut part = json!({"functionCall": {"name": "read_file", "args": {"path": "a.rs"}}});
                if k == 0 {
                    part["thoughtSignature"] = json!(format!("sig-{id}"));
                }
                part
            }).collect::<Vec<_>>()})],
    }
}

fn results(api: Api, ids: &[String], sizes: &[usize]) -> Vec<Value> {
    let output = |size: usize| "line of code\n".repeat(size);
    match api {
        Api::ChatCompletions => ids
            .iter()
            .zip(sizes)
            .map(|(id, &size)| json!({"role": "tool", "tool_call_id": id, "content": output(size)}))
            .collect(),
        Api::Responses => ids
            .iter()
            .zip(sizes)
            .map(|(id, &size)| {
                json!({"type": "function_call_output", "call_id": id,
                "output": output(size)})
            })
            .collect(),
        Api::Messages => vec![json!({"role": "user",
            "content": ids.iter().zip(sizes).map(|(id, &size)| json!({"type": "tool_result",
                "tool_use_id": id, "content": output(size)})).collect::<Vec<_>>()})],
        Api::Gemini => vec![json!({"role": "user",
            "parts": sizes.iter().map(|&size| json!({"functionResponse": {"name": "read_file",
                "response": {"output": output(size)}}})).collect::<Vec<_>>()})],
    }
}

fn parse(api: Api, body: &str) -> Conversation<'_> {
    match api.front_end().parse(body.as_bytes()) {
        Ok(Parsed::Conversation(conversation)) => conversation,
        other => panic!("{api:?} did not read its own format: {other:?}"),
    }
}

fn settings(trigger: u64, keep: u64, headroom: Option<f64>) -> PlanSettings {
    PlanSettings {
        triggers: vec![ContextSize::Tokens(trigger)],
        keep: ContextSize::Messages(keep),
        headroom,
        headroom_turns: 10,
        summary_estimate_tokens: 30,
        min_span_tokens: 1,
        skills: SkillRescue {
            max_count: 0,
            max_tokens: 0,
            max_tokens_per_skill: 0,
            tool_names: vec![],
            container_path: "/mnt/skills".into(),
        },
        stages: Default::default(),
        pinned_context: Vec::new(),
    }
}

/// The body with the summary `text` spliced in as `layout` says.
fn spliced(conversation: &Conversation<'_>, body: &str, layout: &Layout, text: &str) -> String {
    let splice = Splice::new(
        conversation,
        layout,
        SummaryRole::User,
        SummaryPlacement::Auto,
    )
    .expect("a layout the planner made splices");
    String::from_utf8(splice.apply(body.as_bytes(), text, SummaryRole::User)).expect("UTF-8")
}

/// Where the message array's first `count` items end in `body` (a compacted body, read by
/// `api`'s front-end): the byte prefix a provider's prompt cache keys on.
fn prefix_through(api: Api, body: &str, count: usize) -> String {
    let conversation = parse(api, body);
    let end = conversation.message_range(count - 1).end;
    body[..end].to_string()
}

/// What one case reached: a summary planned, and the next turn reusing it.
#[derive(Default)]
struct Reached {
    summarized: bool,
    reused: bool,
}

fn check(api: Api, system: bool, run: &[Exchange], next: &Exchange, s: &PlanSettings) -> Reached {
    let (done, asking) = run.split_at(run.len() - 1);
    let body = render(api, system, done, &asking[0]);
    let conversation = parse(api, &body);
    assert!(
        validate(conversation.messages.iter()).is_ok(),
        "{api:?}: {body}"
    );
    let model = TokenModel::default();
    let first = plan(&conversation, s, &model, false, &mut NoCache);
    let Decision::Summarize { layout, .. } = &first.decision else {
        return Reached::default();
    };
    let out = spliced(&conversation, &body, layout, "S");
    let compacted = parse(api, &out);
    // A tool call never loses its result, nor a result its call.
    assert!(
        validate(compacted.messages.iter()).is_ok(),
        "{api:?}: a pair split: {out}"
    );
    // Every message kept verbatim is there byte for byte, in order; only the first kept turn
    // may carry the summary in front of its own content.
    let kept: Vec<usize> = (0..layout.head)
        .chain(layout.excluded.iter().copied())
        .chain(layout.cut..conversation.messages.len())
        .collect();
    let mut at = 0;
    for (position, &i) in kept.iter().enumerate() {
        let raw = conversation.messages[i].raw.get();
        match out[at..].find(raw) {
            Some(found) => at += found + raw.len(),
            None => assert!(
                position == layout.head,
                "{api:?}: message {i} not kept byte for byte: {out}"
            ),
        }
    }
    // The next turn reuses the summary with a byte-identical prefix.
    let key = first.chain().expect("a chain")[layout.cut];
    // Smaller than what it stands for, as every summary compactor keeps is.
    let span: u64 = layout
        .summarized(layout.head, |_| true)
        .iter()
        .map(|&i| conversation.messages[i].tokens(&model))
        .sum();
    let cached = CachedSummary {
        cut: layout.cut,
        excluded: layout.excluded.clone(),
        splits: layout.splits.clone(),
        text: "S".into(),
        tokens: s.summary_estimate_tokens.min(span.saturating_sub(1)),
    };
    let next_body = render(api, system, run, next);
    let next_conversation = parse(api, &next_body);
    let again = plan(&next_conversation, s, &model, false, &mut One(key, cached));
    let reused = matches!(&again.decision, Decision::Reuse { .. });
    if let Decision::Reuse { layout: reused, .. } = &again.decision {
        let next_out = spliced(&next_conversation, &next_body, reused, "S");
        // Through the summary (and, where it is merged, the turn that carries it).
        let through = layout.head + 1;
        assert_eq!(
            prefix_through(api, &out, through),
            prefix_through(api, &next_out, through),
            "{api:?}: the compacted prefix moved between turns"
        );
    }
    Reached {
        summarized: true,
        reused,
    }
}

#[test]
fn every_front_end_keeps_pairs_bytes_and_the_prefix() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (summarized, reused) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let cases = (
        any::<bool>(),
        prop::collection::vec(exchange(), 3..15),
        exchange(),
        300u64..4000,
        1u64..8,
        prop_oneof![Just(None), Just(Some(0.75)), Just(Some(0.5))],
    );
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 150,
        ..ProptestConfig::default()
    });
    runner
        .run(&cases, |(system, run, next, trigger, keep, headroom)| {
            let s = settings(trigger, keep, headroom);
            for api in Api::ALL {
                let reached = check(api, system, &run, &next, &s);
                summarized.fetch_add(usize::from(reached.summarized), Ordering::Relaxed);
                reused.fetch_add(usize::from(reached.reused), Ordering::Relaxed);
            }
            Ok(())
        })
        .unwrap_or_else(|failure| panic!("{failure}"));
    // The checks above ran on summaries and on their reuse, not only on requests passed
    // through: 150 cases over every API reach both many times.
    let (summarized, reused) = (summarized.into_inner(), reused.into_inner());
    eprintln!("{summarized} summaries, {reused} reuses checked");
    assert!(
        summarized >= 100 && reused >= 50,
        "{summarized} summaries, {reused} reuses"
    );
}
