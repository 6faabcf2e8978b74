//! Compaction that earns its cost (issue 10), each reproduction through the real proxy: skill
//! rescue within headroom, no summary paid for and thrown away, strict-template alternation,
//! and a first compaction that sees what it evicts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::common::*;
use compactor::apis::Api;
use compactor::compaction::engine::{Compacted, CompactionEngine};
use compactor::compaction::scope::Caller;
use compactor::compaction::summaries::summarizer::{
    Summarizer, Summary, SummaryFuture, SummaryRequest,
};
use http::StatusCode;
use mock_upstream::MockFault;
use serde_json::{json, Value};

fn forwarded(stack: &Compacting) -> Vec<Value> {
    stack.upstream.last_request().expect("forwarded").json()["messages"]
        .as_array()
        .expect("messages")
        .clone()
}

fn tokens_after(response: &Collected) -> u64 {
    response.headers["x-compactor-tokens-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn skill_read(id: &str, skill: &str) -> [Value; 2] {
    [
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"/mnt/skills/public/{skill}/SKILL.md\"}}")}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": "step ".repeat(3900)}),
    ]
}

#[tokio::test]
async fn rescued_skills_never_leave_the_request_over_the_trigger() {
    let stack = compacting_with(
        "  upstream: summarizer\n  model_name: summarizer-model\n  trigger: [{type: tokens, value: 6000}]\n  keep: {type: messages, value: 2}\n  headroom: 0.75\n  summary_max_tokens: 64\n",
    )
    .await;
    let mut messages = vec![
        json!({"role": "system", "content": "You are an agent."}),
        json!({"role": "user", "content": format!("Write the report. {}", "Details of the task. ".repeat(20))}),
    ];
    messages.extend(skill_read("c1", "a"));
    messages.extend(skill_read("c2", "b"));
    messages.push(json!({"role": "assistant", "content": "Skills loaded."}));
    messages.push(json!({"role": "user", "content": "Go on."}));
    let first = send_chat(&stack.proxy, &messages, &[]).await;
    assert_eq!(outcome(&first), "summarized");
    assert!(
        tokens_after(&first) < 6000,
        "{} tokens after",
        tokens_after(&first)
    );
    for turn in 0..2 {
        messages.push(json!({"role": "assistant", "content": format!("Working on part {turn}.")}));
        messages.push(json!({"role": "user", "content": "Go on."}));
        let next = send_chat(&stack.proxy, &messages, &[]).await;
        assert_eq!(outcome(&next), "reused", "turn {turn}");
        assert!(tokens_after(&next) < 6000);
    }
    assert_eq!(
        stack.summarizer.chat_calls(),
        1,
        "one summary for three turns"
    );
}

#[tokio::test]
async fn a_skill_read_beside_other_calls_keeps_only_the_skill_result() {
    let stack = compacting_with(
        "  upstream: summarizer\n  model_name: summarizer-model\n  trigger: [{type: messages, value: 12}]\n  keep: {type: messages, value: 2}\n  summary_max_tokens: 32\n",
    )
    .await;
    let mut messages = vec![
        json!({"role": "system", "content": "sys"}),
        json!({"role": "user", "content": "start"}),
        json!({"role": "assistant", "content": "reading skill and notes", "tool_calls": [
            {"id": "skill-1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"/mnt/skills/public/alpha/SKILL.md\"}"}},
            {"id": "file-1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"/mnt/user-data/notes.md\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "skill-1", "content": "alpha skill body"}),
        json!({"role": "tool", "tool_call_id": "file-1", "content": format!("user notes {}", "n".repeat(400))}),
    ];
    for i in 0..4 {
        messages
            .push(json!({"role": "user", "content": format!("question {i} {}", "q".repeat(200))}));
        messages.push(
            json!({"role": "assistant", "content": format!("answer {i} {}", "a".repeat(200))}),
        );
    }
    messages.push(json!({"role": "user", "content": "latest"}));
    let response = send_chat(&stack.proxy, &messages, &[]).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(outcome(&response), "summarized");
    let out = forwarded(&stack);
    let text = serde_json::to_string(&out).unwrap();
    assert!(text.contains("alpha skill body"));
    assert!(
        !text.contains("user notes"),
        "the unrelated output is summarized"
    );
    let copy = out
        .iter()
        .find(|m| m["tool_calls"].is_array())
        .expect("the rescued copy of the assistant");
    assert_eq!(copy["content"], "");
    assert_eq!(copy["tool_calls"].as_array().unwrap().len(), 1);
    assert_eq!(copy["tool_calls"][0]["id"], "skill-1");
}

fn short_chat() -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "system", "content": "sys"}),
        json!({"role": "user", "content": "hi"}),
        json!({"role": "assistant", "content": "yo"}),
    ];
    for k in 0..3 {
        messages
            .push(json!({"role": "user", "content": format!("question {k}{}", "q".repeat(80))}));
        messages
            .push(json!({"role": "assistant", "content": format!("answer {k}{}", "a".repeat(80))}));
    }
    messages
}

#[tokio::test]
async fn a_span_no_larger_than_the_summary_is_never_sent_to_the_summarizer() {
    // Over a token trigger only: over a messages trigger the count decides (below).
    let stack = compacting_with(
        "  upstream: summarizer\n  model_name: summarizer-model\n  trigger: [{type: tokens, value: 100}]\n  keep: {type: messages, value: 6}\n  headroom: null\n  summary_max_tokens: 500\n",
    )
    .await;
    for _ in 0..3 {
        let response = send_chat(&stack.proxy, &short_chat(), &[]).await;
        assert_eq!(response.status, StatusCode::OK);
        assert_eq!(outcome(&response), "skipped");
    }
    assert_eq!(stack.summarizer.requests().len(), 0);
}

#[tokio::test]
async fn a_messages_trigger_holds_for_short_turns_however_small_the_span() {
    // 60 short turns under `trigger: messages 20`: the span rule compared each span with the
    // summary's ceiling (1.5 × 500 tokens) and let 48 of them through uncompacted.
    let stack = compacting_with(
        "  upstream: summarizer\n  model_name: summarizer-model\n  trigger: [{type: messages, value: 20}]\n  keep: {type: messages, value: 6}\n  summary_max_tokens: 500\n",
    )
    .await;
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    let mut over = 0;
    for turn in 0..60 {
        messages.push(json!({"role": "user", "content": format!("ping {turn}")}));
        let response = send_chat(&stack.proxy, &messages, &[]).await;
        assert_eq!(response.status, StatusCode::OK);
        let forwarded = forwarded(&stack).len();
        if messages.len() >= 20 {
            over += 1;
            assert!(
                forwarded < 20,
                "turn {turn}: {forwarded} messages forwarded, {} ({})",
                outcome(&response),
                response.headers["x-compactor-compaction"]
                    .to_str()
                    .unwrap_or("")
            );
        }
        messages.push(json!({"role": "assistant", "content": format!("pong {turn}")}));
    }
    assert!(over > 40, "{over} turns were over the trigger");
}

#[tokio::test]
async fn a_summary_that_came_back_too_large_is_not_paid_for_again() {
    let stack = compacting_with(
        "  upstream: summarizer\n  model_name: summarizer-model\n  trigger: [{type: messages, value: 8}]\n  keep: {type: messages, value: 2}\n  summary_max_tokens: 16\n",
    )
    .await;
    stack.summarizer.set_fault(Some(MockFault::Verbose));
    let first = send_chat(&stack.proxy, &short_chat(), &[]).await;
    assert_eq!(outcome(&first), "failed");
    for _ in 0..2 {
        let again = send_chat(&stack.proxy, &short_chat(), &[]).await;
        assert_eq!(again.status, StatusCode::OK);
        assert_eq!(outcome(&again), "skipped");
    }
    assert_eq!(stack.summarizer.requests().len(), 1);
}

/// A conversation whose kept tail starts with a user message.
fn tail_starts_with_user() -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": "sys"})];
    for k in 0..5 {
        messages
            .push(json!({"role": "user", "content": format!("question {k} {}", "q".repeat(200))}));
        messages.push(
            json!({"role": "assistant", "content": format!("answer {k} {}", "a".repeat(200))}),
        );
    }
    messages.push(json!({"role": "user", "content": [{"type": "text", "text": "latest"}]}));
    messages
}

async fn placed(placement: &str) -> (Vec<Value>, Vec<Value>, Compacting) {
    let stack = compacting_with(&format!(
        "  upstream: summarizer\n  model_name: summarizer-model\n  trigger: [{{type: messages, value: 8}}]\n  keep: {{type: messages, value: 3}}\n  headroom: null\n  summary_max_tokens: 32\n  summary_placement: {placement}\n"
    ))
    .await;
    let first = send_chat(&stack.proxy, &tail_starts_with_user(), &[]).await;
    assert_eq!(outcome(&first), "summarized");
    let once = forwarded(&stack);
    let again = send_chat(&stack.proxy, &tail_starts_with_user(), &[]).await;
    assert_eq!(outcome(&again), "reused");
    let twice = forwarded(&stack);
    (once, twice, stack)
}

fn roles(messages: &[Value]) -> Vec<&str> {
    messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn merged_summaries_keep_roles_alternating_and_reuse_byte_stable() {
    for placement in ["auto", "merge"] {
        let (once, twice, stack) = placed(placement).await;
        assert_eq!(
            roles(&once),
            ["system", "user", "assistant", "user"],
            "{placement}"
        );
        let merged = once[1]["content"].as_str().unwrap();
        assert!(merged.starts_with("Here is a summary of the conversation to date:"));
        assert!(merged.contains("\n\nquestion 4 "), "{merged}");
        assert_eq!(once, twice);
        let bodies: Vec<_> = stack
            .upstream
            .requests()
            .iter()
            .map(|r| r.body.clone())
            .collect();
        assert_eq!(
            bodies[bodies.len() - 1],
            bodies[bodies.len() - 2],
            "{placement}"
        );
    }
    let (separate, _, _) = placed("separate").await;
    assert_eq!(
        roles(&separate),
        ["system", "user", "user", "assistant", "user"]
    );
}

#[tokio::test]
async fn a_first_compaction_sees_nearly_everything_it_evicts_within_the_call_cap() {
    let stack = compacting_with(
        "  upstream: summarizer\n  model_name: summarizer-model\n  trigger: [{type: tokens, value: 10000}]\n  keep: {type: messages, value: 4}\n  summary_max_tokens: 200\n  max_summarizer_calls: 4\n",
    )
    .await;
    let mut messages = vec![json!({"role": "system", "content": "sys"})];
    for k in 0..60 {
        messages.push(
            json!({"role": "user", "content": format!("marker-{k:03} {}", "word ".repeat(80))}),
        );
        messages.push(
            json!({"role": "assistant", "content": format!("reply-{k:03} {}", "text ".repeat(80))}),
        );
    }
    messages.push(json!({"role": "user", "content": "latest"}));
    let response = send_chat(&stack.proxy, &messages, &[]).await;
    assert_eq!(outcome(&response), "summarized");
    let calls = stack.summarizer.requests();
    assert!(
        !calls.is_empty() && calls.len() <= 4,
        "{} calls",
        calls.len()
    );
    let prompts: String = calls
        .iter()
        .map(|r| {
            r.json()["messages"][0]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    let evicted = (0..60).filter(|k| *k < 58).count();
    let seen = (0..58)
        .filter(|k| prompts.contains(&format!("marker-{k:03}")))
        .count();
    assert!(
        seen * 10 >= evicted * 9,
        "saw {seen} of {evicted} evicted turns"
    );
}

/// A summarizer that answers each prompt with what `answer` makes of it, counting the calls.
struct Scripted {
    calls: AtomicU64,
    answer: fn(&str) -> String,
}

impl Summarizer for Scripted {
    fn summarize(&self, request: SummaryRequest) -> SummaryFuture {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let text = (self.answer)(&request.prompt);
        Box::pin(async move { Ok(Summary::from(text)) })
    }
}

fn scripted_engine(answer: fn(&str) -> String) -> (CompactionEngine, Arc<Scripted>) {
    let yaml = "upstreams:\n  - name: mock\n    base_url: http://127.0.0.1:9/v1\nsummarization:\n  enabled: true\n  trigger: [{type: messages, value: 8}]\n  keep: {type: messages, value: 2}\n";
    let config = compactor::config::Config::from_yaml(yaml).expect("valid");
    let summarizer = Arc::new(Scripted {
        calls: Default::default(),
        answer,
    });
    let engine = CompactionEngine::with_summarizer(&config, summarizer.clone());
    (engine, summarizer)
}

async fn compact_chat(engine: &CompactionEngine, messages: &[Value]) -> Compacted {
    let body = json!({"model": "gpt-4o", "messages": messages}).to_string();
    match engine
        .compact(
            &http::HeaderMap::new(),
            bytes::Bytes::from(body),
            "mock",
            Caller::default(),
            &Api::ChatCompletions.body_request(),
        )
        .await
    {
        Ok(compacted) => compacted,
        Err(_) => panic!("fail_mode open never refuses"),
    }
}

fn twelve_turns() -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": "You are an agent."})];
    for i in 0..6 {
        messages.push(json!({"role": "user", "content": format!("question {i}: {}", "how does the parser work ".repeat(20))}));
        messages.push(json!({"role": "assistant", "content": format!("answer {i}: {}", "it reads tokens one by one ".repeat(20))}));
    }
    messages.push(json!({"role": "user", "content": "and now?"}));
    messages
}

#[tokio::test]
async fn an_answer_that_repeats_the_prompt_is_refused_and_not_paid_for_again() {
    // What a 135M model behind a real server did: it gave back its instructions.
    let (engine, summarizer) =
        scripted_engine(|prompt| prompt[..prompt.find("<<<").unwrap_or(prompt.len())].to_string());
    let messages = twelve_turns();
    let first = compact_chat(&engine, &messages).await;
    assert_eq!(first.outcome.label(), "failed");
    assert_eq!(first.outcome.reason.label(), "summary_echoed_prompt");
    assert!(!first.rewritten, "the original goes through");
    let again = compact_chat(&engine, &messages).await;
    assert!(!again.rewritten);
    assert_eq!(
        summarizer.calls.load(Ordering::Relaxed),
        1,
        "the refused layout is remembered"
    );
}

#[tokio::test]
async fn compactors_frame_tags_never_reach_the_upstream_inside_a_summary() {
    // The answer wraps its summary in the transcript's own frame tag, as weak models do.
    let (engine, _) = scripted_engine(|prompt| {
        let start = prompt.find("<msg-").expect("a framed block");
        let tag: String = prompt[start + 1..]
            .chars()
            .take_while(|c| *c != ' ' && *c != '>')
            .collect();
        format!("<{tag} role=\"assistant\">\nThe user is learning how the parser reads tokens.\n</{tag}>")
    });
    let compacted = compact_chat(&engine, &twelve_turns()).await;
    assert_eq!(compacted.outcome.label(), "summarized");
    let body = String::from_utf8(compacted.body.to_vec()).expect("UTF-8");
    assert!(body.contains("The user is learning how the parser reads tokens."));
    assert!(
        !body.contains("<msg-") && !body.contains("</msg-"),
        "{body}"
    );
}
