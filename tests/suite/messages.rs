//! Anthropic's Messages API through compactor (`POST /v1/messages`): the planner's rules on
//! Messages conversations (pairs, alternation, breakpoints, thinking), then what the upstream
//! receives and what the client gets back, against the mock's Anthropic-style validation.

use crate::common::*;
use compactor::apis::messages;
use compactor::apis::Parsed;
use compactor::compaction::planner::plan::{plan, Decision, NoCache, PlanSettings};
use compactor::compaction::planner::rewrite::{Splice, SUMMARY_PREFIX};
use compactor::compaction::planner::tokens::TokenModel;
use compactor::config::{ContextSize, SummaryPlacement, SummaryRole};
use http::StatusCode;
use mock_upstream::anthropic::{thinking_signature, validate};
use mock_upstream::MockOptions;
use serde_json::{json, Value};

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn assistant(text: &str) -> Value {
    json!({"role": "assistant", "content": [{"type": "text", "text": text}]})
}

fn thinking(text: &str) -> Value {
    json!({"type": "thinking", "thinking": text, "signature": thinking_signature(text)})
}

/// An assistant turn that thinks, says something and calls `Read` once per id.
fn tool_turn(ids: &[&str]) -> Value {
    let mut content = vec![
        thinking("which files?"),
        json!({"type": "text", "text": "Reading."}),
    ];
    for id in ids {
        content.push(json!({"type": "tool_use", "id": id, "name": "Read", "input": {"file_path": format!("/src/{id}.rs")}}));
    }
    json!({"role": "assistant", "content": content})
}

fn results(ids: &[&str]) -> Value {
    let content: Vec<Value> = ids
        .iter()
        .map(|id| json!({"type": "tool_result", "tool_use_id": id, "content": format!("fn {id}() {{}}\n").repeat(6)}))
        .collect();
    json!({"role": "user", "content": content})
}

/// A Claude Code-like run: a task, then tool turns and their results, ending on results.
fn agent_messages(turns: usize) -> Vec<Value> {
    let mut messages = vec![user(&format!("Fix the bug. {}", "context ".repeat(20)))];
    for t in 0..turns {
        let ids = [format!("toolu_{t}a"), format!("toolu_{t}b")];
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        messages.push(tool_turn(&ids));
        messages.push(results(&ids));
    }
    messages
}

fn body(messages: &[Value], extra: Value) -> String {
    let mut body = json!({
        "model": "claude-sonnet-4-5", "max_tokens": 1024,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Read", "description": "read a file", "input_schema": {"type": "object"}}],
        "messages": messages,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body.to_string()
}

// ---- The planner on Messages conversations ----

fn planner_settings(trigger_messages: u64, keep_messages: u64) -> PlanSettings {
    PlanSettings {
        triggers: vec![ContextSize::Messages(trigger_messages)],
        keep: ContextSize::Messages(keep_messages),
        headroom: None,
        min_span_tokens: 1,
        summary_estimate_tokens: 20,
        ..PlanSettings::from_config(&Default::default())
    }
}

/// The body forwarded upstream when the planner summarizes (summary text "S"), or None.
fn compacted(body: &str, settings: &PlanSettings) -> Option<String> {
    let Ok(Parsed::Conversation(conversation)) = messages::parse(body.as_bytes()) else {
        panic!("not planned: {body}");
    };
    let plan = plan(
        &conversation,
        settings,
        &TokenModel::default(),
        false,
        &mut NoCache,
    );
    let Decision::Summarize { layout, .. } = plan.decision else {
        return None;
    };
    let splice = Splice::new(
        &conversation,
        &layout,
        SummaryRole::User,
        SummaryPlacement::Auto,
    )
    .expect("splices");
    Some(String::from_utf8(splice.apply(body.as_bytes(), "S", SummaryRole::User)).unwrap())
}

fn breakpoints(value: &Value) -> usize {
    match value {
        Value::Object(map) => {
            map.get("cache_control").is_some_and(|c| !c.is_null()) as usize
                + map
                    .iter()
                    .filter(|(k, _)| k.as_str() != "cache_control")
                    .map(|(_, v)| breakpoints(v))
                    .sum::<usize>()
        }
        Value::Array(items) => items.iter().map(breakpoints).sum(),
        _ => 0,
    }
}

#[test]
fn a_cut_never_separates_tool_use_from_its_results() {
    let messages = agent_messages(5);
    let body = body(&messages, json!({}));
    for keep in 1..8 {
        let out = compacted(&body, &planner_settings(4, keep)).expect("summarized");
        let out: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(validate(&out), Ok(()), "keep {keep}: {out}");
        let sent = out["messages"].as_array().unwrap();
        // The tail is whole pairs: after the summary turn, an assistant tool turn.
        assert_eq!(sent[0]["role"], "user");
        assert_eq!(sent[1]["role"], "assistant", "keep {keep}");
        assert_eq!(&sent[1..], &messages[messages.len() - (sent.len() - 1)..]);
    }
}

#[test]
fn the_summary_joins_the_first_kept_user_turn_to_keep_roles_alternating() {
    // Kept tail starting with a user text turn: the summary is its first block.
    let mut messages = agent_messages(3);
    messages.push(assistant("Fixed."));
    messages.push(user("Now add a test."));
    let body = body(&messages, json!({}));
    let out = compacted(&body, &planner_settings(4, 1)).expect("summarized");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(validate(&out), Ok(()), "{out}");
    let sent = out["messages"].as_array().unwrap();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0]["content"],
        json!([
            {"type": "text", "text": format!("{SUMMARY_PREFIX}S")},
            {"type": "text", "text": "Now add a test."},
        ])
    );

    // A kept tail starting with an assistant turn: the summary is a user turn of its own.
    let out = compacted(&body, &planner_settings(4, 2)).expect("summarized");
    let out: Value = serde_json::from_str(&out).unwrap();
    let sent = out["messages"].as_array().unwrap();
    assert_eq!(
        sent[0],
        json!({"role": "user", "content": [{"type": "text", "text": format!("{SUMMARY_PREFIX}S")}]}),
        "{out}"
    );
    assert_eq!(&sent[1..], &messages[messages.len() - 2..]);
    assert_eq!(validate(&out), Ok(()));
}

#[test]
fn the_latest_user_request_moves_after_the_summary_with_the_pairs_after_it() {
    // The task, then only tool turns: keep 2 passes the task, which moves after the summary.
    let messages = agent_messages(4);
    let body = body(&messages, json!({}));
    let out = compacted(&body, &planner_settings(4, 2)).expect("summarized");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(validate(&out), Ok(()), "{out}");
    let sent = out["messages"].as_array().unwrap();
    let first_blocks = sent[0]["content"].as_array().unwrap();
    assert!(first_blocks[0]["text"]
        .as_str()
        .unwrap()
        .starts_with(SUMMARY_PREFIX));
    assert_eq!(first_blocks[1]["text"], messages[0]["content"]);
    assert_eq!(&sent[1..], &messages[messages.len() - 2..]);
}

/// Claude Code's opening as 2.1.332 sends it: reminders and the task in the first user turn,
/// then its environment as a `system` turn with a breakpoint and a per-turn setting.
fn claude_code_opening() -> Vec<Value> {
    vec![
        json!({"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>\nAttribution for commits\n</system-reminder>\n"},
            {"type": "text", "text": "Fix the bug."}]}),
        json!({"role": "system", "content": [{"type": "text", "text": "# Environment\n - Primary working directory: /w", "cache_control": {"type": "ephemeral"}}],
               "output_config": {"effort": "medium"}}),
    ]
}

#[test]
fn claude_codes_system_turn_is_never_summarized_and_roles_still_alternate() {
    let mut messages = claude_code_opening();
    messages.extend(agent_messages(5).into_iter().skip(1));
    let body = body(
        &messages,
        json!({"thinking": {"type": "adaptive"}, "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}),
    );
    for keep in [2, 4] {
        let out = compacted(&body, &planner_settings(4, keep)).expect("summarized");
        let out: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(validate(&out), Ok(()), "keep {keep}: {out}");
        let sent = out["messages"].as_array().unwrap();
        // The task keeps its turn, the summary in front of it; the environment follows it,
        // byte for byte, then the kept tool turns.
        let first = sent[0]["content"].as_array().unwrap();
        assert!(first[0]["text"]
            .as_str()
            .unwrap()
            .starts_with(SUMMARY_PREFIX));
        assert_eq!(
            &first[1..],
            messages[0]["content"].as_array().unwrap().as_slice()
        );
        assert_eq!(sent[1], messages[1]);
        assert_eq!(&sent[2..], &messages[messages.len() - keep as usize..]);
        assert!(breakpoints(&out) <= breakpoints(&serde_json::from_str(&body).unwrap()));
    }
}

#[test]
fn a_second_prompt_after_a_system_turn_keeps_the_roles_alternating() {
    // Claude Code 2.1 with per-turn control: a system turn before each prompt. Once the summary
    // covers the second prompt's turn, the prompt moves to after the summary, and the system
    // turns it passed must not sit between two user turns.
    let mut messages = claude_code_opening();
    messages.extend(agent_messages(3).into_iter().skip(1));
    messages.push(json!({"role": "assistant", "content": "Fixed."}));
    messages.push(json!({"role": "system", "content": [{"type": "text", "text": "# Environment\n - turn 2"}]}));
    messages.push(user("Now add a test."));
    messages.extend(agent_messages(4).into_iter().skip(1));
    let body = body(&messages, json!({}));
    let system_turns: Vec<&Value> = messages.iter().filter(|m| m["role"] == "system").collect();
    for keep in [2, 4, 6] {
        let out = compacted(&body, &planner_settings(4, keep)).expect("summarized");
        let out: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(validate(&out), Ok(()), "keep {keep}: {out}");
        let sent = out["messages"].as_array().unwrap();
        let kept_system: Vec<&Value> = sent.iter().filter(|m| m["role"] == "system").collect();
        assert_eq!(
            kept_system, system_turns,
            "keep {keep}: system turns kept verbatim"
        );
        assert_eq!(sent[0]["role"], "user");
    }
}

#[test]
fn a_breakpoint_in_the_summarized_span_moves_to_the_summary_and_kept_ones_stay() {
    let mut messages = agent_messages(4);
    // The client's breakpoints: on an early result (summarized) and on the last one (kept).
    messages[2]["content"][1]["cache_control"] = json!({"type": "ephemeral", "ttl": "1h"});
    let last = messages.len() - 1;
    messages[last]["content"][1]["cache_control"] = json!({"type": "ephemeral"});
    let body = body(&messages, json!({}));
    let before = breakpoints(&serde_json::from_str(&body).unwrap());
    let out = compacted(&body, &planner_settings(4, 2)).expect("summarized");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(validate(&out), Ok(()));
    assert_eq!(
        breakpoints(&out),
        before,
        "one left the span, one joined the summary"
    );
    let sent = out["messages"].as_array().unwrap();
    assert_eq!(
        sent[0]["content"][0]["cache_control"],
        json!({"type": "ephemeral", "ttl": "1h"})
    );
    assert_eq!(sent.last().unwrap(), &messages[last]);

    // With no breakpoint in the span, the summary gets none.
    let plain = agent_messages(4);
    let out = compacted(&self::body(&plain, json!({})), &planner_settings(4, 2)).unwrap();
    let out: Value = serde_json::from_str(&out).unwrap();
    assert!(out["messages"][0]["content"][0]
        .get("cache_control")
        .is_none());
}

#[test]
fn thinking_of_the_latest_assistant_turn_is_forwarded_byte_for_byte() {
    let messages = agent_messages(4);
    let body = body(&messages, json!({}));
    let out = compacted(&body, &planner_settings(4, 2)).unwrap();
    let latest = serde_json::to_string(&messages[messages.len() - 2]).unwrap();
    assert!(out.contains(&latest));
    // No thinking text reaches the summarizer's transcript.
    let Ok(Parsed::Conversation(conversation)) = messages::parse(body.as_bytes()) else {
        panic!()
    };
    let tokens = conversation.message_tokens(&TokenModel::default());
    let indices: Vec<usize> = (0..conversation.messages.len()).collect();
    let input = compactor::compaction::summaries::summary_input::select(
        &conversation,
        &indices,
        &tokens,
        None,
        &compactor::compaction::summaries::summary_input::InputSettings {
            budget: None,
            oversize: compactor::config::Oversize::Trim,
            max_calls: 1,
            model: TokenModel::default(),
        },
    );
    let transcript = input.chunks.concat();
    assert!(!transcript.contains("which files?"), "{transcript}");
    assert!(transcript.contains("→ calls Read("), "{transcript}");
    assert!(transcript.contains("← result [toolu_0a]: fn toolu_0a()"));
}

/// A random alternating conversation: user text or results, assistant text or tool turns with
/// parallel calls answered in any order, sometimes with text after the results, breakpoints on
/// random blocks (at most 4 in all, one on the system prompt).
fn random_messages(rng: &mut Rng, seed: u64) -> Vec<Value> {
    let mut messages = vec![user(&format!(
        "s{seed} task {}",
        "x".repeat(rng.below(300) as usize)
    ))];
    let mut breakpoints_left = 3;
    let mut call = 0;
    for _ in 0..(2 + rng.below(14)) {
        let mut answer = if rng.below(3) == 0 {
            assistant(&format!("s{seed} answer {}", rng.next()))
        } else {
            let ids: Vec<String> = (0..1 + rng.below(3))
                .map(|_| {
                    call += 1;
                    format!("toolu_{seed}_{call}")
                })
                .collect();
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            let turn = tool_turn(&ids);
            messages.push(turn);
            let mut reply = ids.clone();
            if rng.below(2) == 0 {
                reply.reverse();
            }
            let mut results = results(&reply);
            if rng.below(3) == 0 {
                results["content"].as_array_mut().unwrap().push(
                    json!({"type": "text", "text": "<system-reminder>go on</system-reminder>"}),
                );
            }
            results
        };
        if breakpoints_left > 0 && rng.below(4) == 0 {
            breakpoints_left -= 1;
            if let Some(blocks) = answer["content"].as_array_mut() {
                if let Some(block) = blocks.last_mut() {
                    block["cache_control"] = json!({"type": "ephemeral"});
                }
            }
        }
        if answer["role"] == "assistant" {
            messages.push(answer);
            messages.push(user(&format!("s{seed} next {}", rng.next())));
        } else {
            messages.push(answer);
        }
    }
    messages
}

#[test]
fn random_conversations_stay_valid_with_their_kept_blocks_untouched() {
    let mut rng = Rng(0xA076_1D64_78BD_642F);
    let mut summarized = 0;
    for seed in 0..400 {
        let messages = random_messages(&mut rng, seed);
        let body = body(&messages, json!({}));
        let input: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(validate(&input), Ok(()), "seed {seed}: the generator");
        let settings = planner_settings(4, 1 + rng.below(6));
        let Some(out) = compacted(&body, &settings) else {
            continue;
        };
        summarized += 1;
        let out_value: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(validate(&out_value), Ok(()), "seed {seed}: {out}");
        assert!(
            breakpoints(&out_value) <= breakpoints(&input),
            "seed {seed}"
        );
        assert_eq!(out_value["system"], input["system"]);
        let sent = out_value["messages"].as_array().unwrap();
        // Every forwarded message but the first is a message of the request, byte for byte.
        for message in &sent[1..] {
            let raw = serde_json::to_string(message).unwrap();
            assert!(body.contains(&raw), "seed {seed}: {raw}");
        }
        // The first carries the summary, and at most one original turn after it.
        let first = sent[0]["content"].as_array().unwrap();
        assert!(first[0]["text"]
            .as_str()
            .unwrap()
            .starts_with(SUMMARY_PREFIX));
        let merged: Vec<Value> = first[1..].to_vec();
        if !merged.is_empty() {
            let found = messages.iter().any(|m| match &m["content"] {
                Value::String(text) => merged == [json!({"type": "text", "text": text})],
                Value::Array(blocks) => blocks == &merged,
                _ => false,
            });
            assert!(found, "seed {seed}: merged blocks are an original turn's");
        }
    }
    assert!(summarized > 200, "only {summarized} of 400 were summarized");
}

// ---- Through the proxy ----

const SUMMARIZATION: &str =
    "  trigger: [{type: messages, value: 8}]\n  keep: {type: messages, value: 2}\n  timeout_secs: 10\n";

const ANTHROPIC_HEADERS: [(&str, &str); 3] = [
    ("x-api-key", "sk-ant-client"),
    ("anthropic-version", "2023-06-01"),
    ("anthropic-beta", "interleaved-thinking-2025-05-14"),
];

async fn send(stack: &Stack, path: &str, body: String) -> Collected {
    roundtrip(
        &client(),
        json_request(&stack.proxy.url(path), body, &ANTHROPIC_HEADERS),
    )
    .await
}

fn compaction(response: &Collected) -> &str {
    response.headers["x-compactor-compaction"].to_str().unwrap()
}

#[tokio::test]
async fn a_long_tool_run_is_summarized_and_the_next_turn_reuses_the_summary() {
    let stack = stack_with(SUMMARIZATION, MockOptions::default()).await;
    let messages = agent_messages(6);
    let sent = body(&messages, json!({}));
    let response = send(&stack, "/v1/messages", sent.clone()).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(compaction(&response), "summarized");
    assert_eq!(response.json()["type"], "message");
    let forwarded = stack.upstream.last_request().unwrap();
    for (name, value) in ANTHROPIC_HEADERS {
        assert_eq!(forwarded.headers[name], value, "{name}");
    }
    let forwarded_text = String::from_utf8(forwarded.body.to_vec()).unwrap();
    let forwarded = forwarded.json();
    let original: Value = serde_json::from_str(&sent).unwrap();
    for field in ["model", "max_tokens", "system", "tools", "thinking"] {
        assert_eq!(forwarded[field], original[field], "{field}");
    }
    let kept = forwarded["messages"].as_array().unwrap();
    assert_eq!(&kept[1..], &messages[messages.len() - 2..]);
    let tail = serde_json::to_string(&messages[messages.len() - 2..]).unwrap();
    assert!(forwarded_text.contains(&tail[1..tail.len() - 1]));

    // The summarizer (a chat-completions upstream here) saw the calls, not the thinking.
    let prompt = stack.summarizer.last_request().unwrap().json()["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(prompt.contains("→ calls Read(") && prompt.contains("← result [toolu_0a]"));
    assert!(!prompt.contains("which files?") && !prompt.contains("sig"));

    let mut next = messages.clone();
    next.push(assistant("Found it."));
    next.push(user("Fix it then."));
    let response = send(&stack, "/v1/messages", body(&next, json!({}))).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(compaction(&response), "reused");
    assert_eq!(stack.summarizer.chat_calls(), 1);
    let again = String::from_utf8(stack.upstream.last_request().unwrap().body.to_vec()).unwrap();
    // The same summary turn opens both requests, byte for byte: the provider's prefix cache
    // holds across turns.
    let prefix_end = |text: &str| text.find(r#""role":"assistant""#).unwrap();
    assert_eq!(
        &again[..prefix_end(&again)],
        &forwarded_text[..prefix_end(&forwarded_text)]
    );
}

#[tokio::test]
async fn claude_codes_default_requests_are_compacted_with_their_context_edits() {
    let stack = stack_with(SUMMARIZATION, MockOptions::default()).await;
    let mut messages = claude_code_opening();
    messages.extend(agent_messages(6).into_iter().skip(1));
    let edits = json!({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]});
    let sent = body(
        &messages,
        json!({"thinking": {"type": "adaptive"}, "context_management": edits}),
    );
    let response = send(&stack, "/v1/messages?beta=true", sent).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(compaction(&response), "summarized");
    let forwarded = stack.upstream.last_request().unwrap().json();
    assert_eq!(forwarded["context_management"], edits);
    assert_eq!(forwarded["messages"][1], messages[1]);
}

#[tokio::test]
async fn native_compaction_and_token_counting_are_forwarded_byte_for_byte() {
    let stack = stack_with(SUMMARIZATION, MockOptions::default()).await;
    let messages = agent_messages(6);
    let mut with_block = messages.clone();
    with_block.insert(
        1,
        json!({"role": "assistant", "content": [{"type": "compaction", "content": "Earlier: fixed the parser."}]}),
    );
    with_block.insert(2, user("continue"));
    for sent in [
        body(
            &messages,
            json!({"context_management": {"edits": [{"type": "compact_20260112"}]}}),
        ),
        body(&with_block, json!({})),
    ] {
        let response = send(&stack, "/v1/messages", sent.clone()).await;
        assert_eq!(response.status, StatusCode::OK, "{}", response.text());
        assert_eq!(compaction(&response), "skipped");
        assert!(
            response.headers.get("x-compactor-tokens-before").is_none(),
            "nothing was counted"
        );
        assert_eq!(stack.upstream.last_request().unwrap().body, sent.as_bytes());
    }
    let count = body(&messages, json!({}));
    let response = send(&stack, "/v1/messages/count_tokens", count.clone()).await;
    assert_eq!(response.status, StatusCode::OK);
    assert!(response.headers.get("x-compactor-compaction").is_none());
    let forwarded = stack.upstream.last_request().unwrap();
    assert_eq!(forwarded.path_and_query, "/v1/messages/count_tokens");
    assert_eq!(forwarded.body, count.as_bytes());
    assert_eq!(stack.summarizer.chat_calls(), 0);
}

#[tokio::test]
async fn a_compacted_stream_starts_with_the_notice_and_keeps_its_typed_events() {
    let stack = stack_with(SUMMARIZATION, MockOptions::default()).await;
    for (mode, start) in [
        ("comment", ": context_compacting {"),
        ("chunk", ": context_compacting {"),
        ("named", "event: context_compacting\ndata: {"),
    ] {
        let mut messages = agent_messages(6);
        messages[0] = user(mode);
        let mut headers = ANTHROPIC_HEADERS.to_vec();
        headers.push(("x-compactor-notice", mode));
        let response = roundtrip(
            &client(),
            json_request(
                &stack.proxy.url("/v1/messages"),
                body(&messages, json!({"stream": true})),
                &headers,
            ),
        )
        .await;
        assert_eq!(compaction(&response), "summarized");
        let text = response.text();
        assert!(text.starts_with(start), "{mode}: {text}");
        let after = text.split_once("\n\n").unwrap().1;
        assert!(
            after.starts_with("event: message_start\ndata: {"),
            "{after}"
        );
        assert!(text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
    }
}

#[tokio::test]
async fn an_anthropic_summarizer_gets_a_messages_call_with_its_own_key() {
    let upstream = echo_mock().await;
    let summarizer = mock(MockOptions {
        mode: mock_upstream::MockMode::Summarizer,
        ..MockOptions::default()
    })
    .await;
    let yaml = format!(
        "upstreams:\n  - name: claude\n    api: anthropic\n    base_url: {}\n    api_key: sk-ant-operator\n  - name: haiku\n    api: anthropic\n    base_url: {}\n    api_key: sk-ant-summarizer\n    models: [\"claude-haiku-*\"]\nsummarization:\n  enabled: true\n  upstream: haiku\n  model_name: claude-haiku-4-5\n  summary_max_tokens: 32\n{SUMMARIZATION}",
        upstream.base_url(),
        summarizer.base_url()
    );
    let proxy = proxy(&yaml).await;
    let response = roundtrip(
        &client(),
        json_request(
            &proxy.url("/v1/messages"),
            body(&agent_messages(6), json!({})),
            &[
                ("authorization", "Bearer client-oauth"),
                ("x-api-key", "sk-ant-client"),
                ("anthropic-version", "2023-06-01"),
            ],
        ),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(compaction(&response), "summarized");
    let call = summarizer.last_request().unwrap();
    assert_eq!(call.path_and_query, "/v1/messages");
    assert_eq!(call.headers["x-api-key"], "sk-ant-summarizer");
    assert_eq!(call.headers["anthropic-version"], "2023-06-01");
    let call = call.json();
    assert_eq!(call["model"], "claude-haiku-4-5");
    assert!(call["messages"][0]["content"]
        .as_str()
        .unwrap()
        .contains("→ calls Read("));
    // The operator's key replaced the client's credentials on the forwarded request.
    let forwarded = upstream.last_request().unwrap();
    assert_eq!(forwarded.headers["x-api-key"], "sk-ant-operator");
    assert!(forwarded.headers.get("authorization").is_none());
    let summary = forwarded.json()["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(summary.contains("chars of conversation"), "{summary}");
}

#[tokio::test]
async fn errors_compactor_makes_on_messages_paths_are_in_anthropics_shape() {
    let upstream = echo_mock().await;
    let yaml = format!(
        "upstreams:\n  - name: claude\n    api: anthropic\n    base_url: {}\nauth:\n  keys:\n    - name: alice\n      key: sk-alice\nlimits:\n  max_request_body_bytes: 4096\n",
        upstream.base_url()
    );
    let proxy = proxy(&yaml).await;
    let small = body(&[user("hi")], json!({}));
    for (headers, payload, status, error_type) in [
        (vec![], small.clone(), 401, "authentication_error"),
        (
            vec![("x-api-key", "sk-nope")],
            small.clone(),
            401,
            "authentication_error",
        ),
        (
            vec![("x-api-key", "sk-alice")],
            body(&agent_messages(20), json!({})),
            413,
            "request_too_large",
        ),
    ] {
        let response = roundtrip(
            &client(),
            json_request(&proxy.url("/v1/messages"), payload, &headers),
        )
        .await;
        assert_eq!(response.status.as_u16(), status);
        let error = response.json();
        assert_eq!(error["type"], "error", "{error}");
        assert_eq!(error["error"]["type"], error_type, "{error}");
        assert!(error["error"]["message"].as_str().is_some());
        assert!(response.headers.contains_key("x-compactor-error"));
    }
    // The same failure on a chat path keeps OpenAI's shape.
    let response = roundtrip(
        &client(),
        json_request(
            &proxy.url("/v1/chat/completions"),
            chat_body("hi", false),
            &[],
        ),
    )
    .await;
    assert_eq!(response.json()["error"]["code"], "missing_api_key");
}

#[tokio::test]
async fn messages_go_to_the_upstream_that_speaks_them() {
    let openai = echo_mock().await;
    let claude = echo_mock().await;
    let yaml = format!(
        "upstreams:\n  - name: openai\n    base_url: {}\n  - name: anthropic\n    api: anthropic\n    base_url: {}\n",
        openai.base_url(),
        claude.base_url()
    );
    let proxy = proxy(&yaml).await;
    for (path, body, expected) in [
        ("/v1/messages", body(&[user("hi")], json!({})), &claude),
        (
            "/v1/messages/count_tokens",
            body(&[user("hi")], json!({})),
            &claude,
        ),
        ("/v1/chat/completions", chat_body("hi", false), &openai),
    ] {
        let response = roundtrip(
            &client(),
            json_request(&proxy.url(path), body, &ANTHROPIC_HEADERS),
        )
        .await;
        assert_eq!(response.status, StatusCode::OK, "{path}");
        assert_eq!(expected.last_request().unwrap().path_and_query, path);
    }
    assert_eq!(openai.requests().len(), 1);
    assert_eq!(claude.requests().len(), 2);
}

#[tokio::test]
async fn without_a_key_of_its_own_the_summarizer_call_carries_the_clients_credential() {
    let upstream = mock(MockOptions {
        mode: mock_upstream::MockMode::Summarizer,
        ..MockOptions::default()
    })
    .await;
    let yaml = format!(
        "upstreams:\n  - name: claude\n    api: anthropic\n    base_url: {}\nsummarization:\n  enabled: true\n  summary_max_tokens: 32\n{SUMMARIZATION}",
        upstream.base_url()
    );
    let proxy = proxy(&yaml).await;
    let response = roundtrip(
        &client(),
        json_request(
            &proxy.url("/v1/messages"),
            body(&agent_messages(6), json!({})),
            &[
                ("authorization", "Bearer sk-ant-oat-client"),
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", "oauth-2025-04-20"),
            ],
        ),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(compaction(&response), "summarized");
    let requests = upstream.requests();
    let call = &requests[requests.len() - 2];
    assert_eq!(
        call.json()["model"],
        "claude-sonnet-4-5",
        "the request's own model"
    );
    assert_eq!(call.headers["authorization"], "Bearer sk-ant-oat-client");
    assert_eq!(call.headers["anthropic-beta"], "oauth-2025-04-20");
    assert!(call.json()["messages"][0]["content"]
        .as_str()
        .unwrap()
        .contains("← result"));
}
