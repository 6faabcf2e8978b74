//! Compaction in flight, observed from the outside: what the upstream receives, what the
//! summarizer is asked, what the client gets back.

use std::time::Duration;

use crate::common::*;
use compactor::compaction::summaries::identifiers;
use http::StatusCode;
use mock_upstream::{MockFault, MockHandle, MockOptions};
use serde_json::{json, Value};

/// Headroom alone (no turns of growth reserved), so the layouts below are `keep`'s and
/// headroom's; room for growth has its own tests in `planner.rs`.
const DEFAULT_SUMMARIZATION: &str = "  trigger: [{type: messages, value: 12}]\n  keep: {type: messages, value: 4}\n  headroom: 0.75\n  headroom_turns: 0\n  timeout_secs: 10\n  allow_force: true\n";

async fn stack() -> Stack {
    stack_with(DEFAULT_SUMMARIZATION, MockOptions::default()).await
}

/// `[system, (user, assistant) × exchanges, user]` with distinct, searchable contents.
fn conversation(exchanges: usize, tag: &str) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    for i in 0..exchanges {
        messages.push(json!({"role": "user", "content": format!("{tag}-msg-{:03}: {}", 2 * i + 1, "some question text ".repeat(5))}));
        messages.push(json!({"role": "assistant", "content": format!("{tag}-msg-{:03}: {}", 2 * i + 2, "a fairly long answer ".repeat(5))}));
    }
    messages.push(json!({"role": "user", "content": format!("{tag}-msg-{:03}: the latest question", 2 * exchanges + 1)}));
    messages
}

fn request_body(messages: &[Value], stream: bool) -> String {
    json!({"model": "gpt-4o-mini", "messages": messages, "stream": stream, "temperature": 0.5})
        .to_string()
}

async fn chat(stack: &Stack, messages: &[Value], headers: &[(&str, &str)]) -> Collected {
    let request = json_request(
        &stack.proxy.url("/v1/chat/completions"),
        request_body(messages, false),
        headers,
    );
    roundtrip(&client(), request).await
}

fn forwarded_messages(mock: &MockHandle) -> Vec<Value> {
    mock.last_request().expect("upstream saw a request").json()["messages"]
        .as_array()
        .expect("messages")
        .clone()
}

fn compaction(response: &Collected) -> &str {
    response.headers["x-compactor-compaction"].to_str().unwrap()
}

fn summary_text(message: &Value) -> String {
    let content = message["content"].as_str().expect("summary content");
    content
        .strip_prefix("Here is a summary of the conversation to date:\n\n")
        .expect("summary prefix")
        .to_string()
}

fn summarizer_prompt(request: &mock_upstream::RecordedRequest) -> String {
    request.json()["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn under_every_trigger_the_upstream_gets_the_exact_bytes_and_no_summary_is_made() {
    let stack = stack().await;
    let messages = conversation(3, "u");
    let body = request_body(&messages, false);
    let response = roundtrip(
        &client(),
        json_request(&stack.proxy.url("/v1/chat/completions"), body.clone(), &[]),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(stack.upstream.last_request().unwrap().body, body.as_bytes());
    assert_eq!(stack.summarizer.chat_calls(), 0);
    assert_eq!(compaction(&response), "skipped");
}

#[tokio::test]
async fn a_body_far_under_the_trigger_passes_on_its_size_and_one_near_it_is_counted() {
    // 3000 tokens: a 2 KB body is under it whatever it holds; a 12 KB one might not be.
    let stack = stack_with(
        "  trigger: [{type: tokens, value: 3000}]\n  keep: {type: messages, value: 4}\n",
        MockOptions::default(),
    )
    .await;
    for (exchanges, counted) in [(4, false), (40, true)] {
        let body = request_body(&conversation(exchanges, "s"), false);
        let response = roundtrip(
            &client(),
            json_request(&stack.proxy.url("/v1/chat/completions"), body.clone(), &[]),
        )
        .await;
        assert_eq!(response.status, StatusCode::OK);
        assert_eq!(compaction(&response), "skipped", "{exchanges} exchanges");
        assert_eq!(stack.upstream.last_request().unwrap().body, body.as_bytes());
        let tokens = response.headers.get("x-compactor-tokens-before");
        assert_eq!(
            tokens.is_some(),
            counted,
            "{exchanges} exchanges: {tokens:?}"
        );
    }
    assert_eq!(stack.summarizer.chat_calls(), 0);
}

#[tokio::test]
async fn a_conversation_is_summarized_then_reused_then_summarized_incrementally() {
    let stack = stack().await;
    // Turn 1: 14 messages, over the trigger of 12.
    let mut messages = conversation(6, "c");
    let first = chat(&stack, &messages, &[]).await;
    assert_eq!(compaction(&first), "summarized");
    assert_eq!(stack.summarizer.chat_calls(), 1);
    let forwarded = forwarded_messages(&stack.upstream);
    assert_eq!(forwarded.len(), 6);
    assert_eq!(forwarded[0], messages[0]);
    assert_eq!(&forwarded[2..], &messages[10..]);
    let summary = summary_text(&forwarded[1]);
    assert!(summary.starts_with("Summary "), "{summary}");
    let first_prompt = summarizer_prompt(&stack.summarizer.last_request().unwrap());
    for i in 1..=9 {
        assert!(
            first_prompt.contains(&format!("c-msg-{i:03}")),
            "message {i} not summarized"
        );
    }
    assert!(!first_prompt.contains("c-msg-010"));
    let tokens_before: u64 = first.headers["x-compactor-tokens-before"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let tokens_after: u64 = first.headers["x-compactor-tokens-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(tokens_after < tokens_before);

    // Turn 2: the client resends everything plus one exchange: same summary, no call.
    messages.push(json!({"role": "assistant", "content": "c-msg-014: answer"}));
    messages.push(json!({"role": "user", "content": "c-msg-015: and then?"}));
    let second = chat(&stack, &messages, &[]).await;
    assert_eq!(compaction(&second), "reused");
    assert_eq!(stack.summarizer.chat_calls(), 1);
    let forwarded = forwarded_messages(&stack.upstream);
    assert_eq!(
        forwarded[1],
        json!({"role": "user", "content": format!("Here is a summary of the conversation to date:\n\n{summary}")})
    );
    assert_eq!(&forwarded[2..], &messages[10..]);

    // Grow until the compacted request reaches the trigger again (1 + 1 + 10 kept = 12).
    for i in 16..=19 {
        let role = if i % 2 == 0 { "assistant" } else { "user" };
        messages.push(json!({"role": role, "content": format!("c-msg-{i:03}: more")}));
    }
    let third = chat(&stack, &messages, &[]).await;
    assert_eq!(compaction(&third), "summarized");
    assert_eq!(stack.summarizer.chat_calls(), 2);
    let prompt = summarizer_prompt(&stack.summarizer.last_request().unwrap());
    // The summarizer extends the previous summary; its identifier index is compactor's to
    // carry over, and goes back on after the new one.
    let (previous, index) = identifiers::split(&summary);
    assert!(
        !index.is_empty(),
        "the summary carries its span's ids: {summary}"
    );
    assert!(
        prompt.contains(previous),
        "previous summary missing from the incremental input"
    );
    assert!(!prompt.contains(identifiers::MARKER));
    let renewed = summary_text(&forwarded_messages(&stack.upstream)[1]);
    let (_, renewed_index) = identifiers::split(&renewed);
    assert!(
        index.iter().all(|entry| renewed_index.contains(entry)),
        "{index:?} carried into {renewed_index:?}"
    );
    for i in 10..=15 {
        assert!(
            prompt.contains(&format!("c-msg-{i:03}")),
            "newly evicted message {i} missing"
        );
    }
    for i in 1..=9 {
        assert!(
            !prompt.contains(&format!("c-msg-{i:03}")),
            "message {i} was summarized twice"
        );
    }
    let forwarded = forwarded_messages(&stack.upstream);
    assert_eq!(&forwarded[2..], &messages[16..]);
}

#[tokio::test]
async fn concurrent_identical_requests_make_one_summarizer_call() {
    let stack = stack_with(
        DEFAULT_SUMMARIZATION,
        MockOptions {
            first_byte_delay: Duration::from_millis(300),
            ..MockOptions::default()
        },
    )
    .await;
    let body = request_body(&conversation(8, "burst"), false);
    let url = stack.proxy.url("/v1/chat/completions");
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (url, body) = (url.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            roundtrip(&client(), json_request(&url, body, &[])).await
        }));
    }
    for task in tasks {
        let response = task.await.expect("task");
        assert_eq!(response.status, StatusCode::OK);
        assert!(["summarized", "reused"].contains(&compaction(&response)));
    }
    assert_eq!(stack.summarizer.chat_calls(), 1);
}

#[tokio::test]
async fn tenants_never_share_summaries() {
    let stack = stack().await;
    let messages = conversation(7, "tenant");
    let alice = chat(&stack, &messages, &[("authorization", "Bearer sk-alice")]).await;
    let bob = chat(&stack, &messages, &[("authorization", "Bearer sk-bob")]).await;
    assert_eq!(compaction(&alice), "summarized");
    assert_eq!(compaction(&bob), "summarized");
    assert_eq!(stack.summarizer.chat_calls(), 2);
    let again = chat(&stack, &messages, &[("authorization", "Bearer sk-alice")]).await;
    assert_eq!(compaction(&again), "reused");
    assert_eq!(stack.summarizer.chat_calls(), 2);
}

#[tokio::test]
async fn an_edited_earlier_message_misses_the_cache() {
    let stack = stack().await;
    let mut messages = conversation(7, "edit");
    assert_eq!(
        compaction(&chat(&stack, &messages, &[]).await),
        "summarized"
    );
    messages[3]["content"] = json!("edit-msg-003: I changed my mind about this");
    let edited = chat(&stack, &messages, &[]).await;
    assert_eq!(compaction(&edited), "summarized");
    assert_eq!(stack.summarizer.chat_calls(), 2);
    assert!(
        summarizer_prompt(&stack.summarizer.last_request().unwrap()).contains("I changed my mind")
    );
}

async fn assert_fails_open(fault: MockFault) {
    // A short summarizer timeout, so the hanging case fails fast.
    let summarization = DEFAULT_SUMMARIZATION.replace("timeout_secs: 10", "timeout_secs: 0.5");
    let stack = stack_with(&summarization, MockOptions::default()).await;
    stack.summarizer.set_fault(Some(fault));
    let body = request_body(&conversation(7, "fail"), false);
    let response = roundtrip(
        &client(),
        json_request(&stack.proxy.url("/v1/chat/completions"), body.clone(), &[]),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK, "{fault:?}");
    assert_eq!(compaction(&response), "failed", "{fault:?}");
    assert_eq!(
        stack.upstream.last_request().unwrap().body,
        body.as_bytes(),
        "{fault:?}"
    );
    assert_eq!(response.json()["object"], "chat.completion");
}

#[tokio::test]
async fn summarizer_errors_forward_the_original_request() {
    assert_fails_open(MockFault::Status(500)).await;
    assert_fails_open(MockFault::Hang).await;
    assert_fails_open(MockFault::Blank).await;
}

#[tokio::test]
async fn a_summary_larger_than_what_it_replaces_is_not_used() {
    assert_fails_open(MockFault::Verbose).await;
}

#[tokio::test]
async fn fail_mode_closed_answers_503() {
    let stack = stack_with(
        &format!("{DEFAULT_SUMMARIZATION}  fail_mode: closed\n"),
        MockOptions::default(),
    )
    .await;
    stack.summarizer.set_fault(Some(MockFault::Status(500)));
    let response = chat(&stack, &conversation(7, "closed"), &[]).await;
    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.json()["error"]["code"], "compaction_failed");
    assert_eq!(response.headers["x-compactor-error"], "compaction_failed");
    assert!(stack.upstream.requests().is_empty());
}

#[tokio::test]
async fn control_headers_switch_compaction_off_or_force_it_and_are_not_forwarded() {
    let stack = stack().await;
    let long = conversation(7, "ctl");
    let body = request_body(&long, false);
    let off = roundtrip(
        &client(),
        json_request(
            &stack.proxy.url("/v1/chat/completions"),
            body.clone(),
            &[("x-compactor", "off")],
        ),
    )
    .await;
    assert_eq!(compaction(&off), "skipped");
    assert_eq!(stack.upstream.last_request().unwrap().body, body.as_bytes());
    assert!(stack
        .upstream
        .last_request()
        .unwrap()
        .headers
        .get("x-compactor")
        .is_none());
    assert_eq!(stack.summarizer.chat_calls(), 0);

    let short = conversation(4, "force");
    let forced = chat(
        &stack,
        &short,
        &[("x-compactor", "force"), ("x-compactor-notice", "off")],
    )
    .await;
    assert_eq!(compaction(&forced), "summarized");
    assert_eq!(stack.summarizer.chat_calls(), 1);
    let seen = stack.upstream.last_request().unwrap();
    assert!(seen.headers.get("x-compactor").is_none());
    assert!(seen.headers.get("x-compactor-notice").is_none());
    assert!(forwarded_messages(&stack.upstream).len() < short.len());
}

/// The raw body of a streamed, compacted request with the given notice mode.
async fn stream_bytes(stack: &Stack, tag: &str, mode: &str) -> (Collected, String) {
    let body = request_body(&conversation(7, tag), true);
    let response = roundtrip(
        &client(),
        json_request(
            &stack.proxy.url("/v1/chat/completions"),
            body,
            &[("x-compactor-notice", mode), ("x-mock-chunks", "3")],
        ),
    )
    .await;
    let text = response.text();
    (response, text)
}

#[tokio::test]
async fn the_notice_goes_first_in_the_chosen_form_and_only_when_summarized() {
    let stack = stack().await;
    let (response, text) = stream_bytes(&stack, "comment", "comment").await;
    assert_eq!(compaction(&response), "summarized");
    assert!(
        text.starts_with(
            ": context_compacting {\"type\":\"context_compacting\",\"message\":\"Compacted "
        ),
        "{text}"
    );
    let after_notice = text.split_once("\n\n").unwrap().1;
    assert!(after_notice.starts_with("data: {"));
    assert!(text.ends_with("data: [DONE]\n\n"));

    let (_, named) = stream_bytes(&stack, "named", "named").await;
    assert!(
        named.starts_with("event: context_compacting\ndata: {\"type\":\"context_compacting\""),
        "{named}"
    );

    let (_, chunk) = stream_bytes(&stack, "chunk", "chunk").await;
    let (first, rest) = chunk.split_once("\n\n").unwrap();
    let first: Value = serde_json::from_str(first.strip_prefix("data: ").unwrap()).unwrap();
    let second: Value = serde_json::from_str(
        rest.split_once("\n\n")
            .unwrap()
            .0
            .strip_prefix("data: ")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["choices"], json!([]));
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["id"], second["id"]);
    assert_eq!(first["model"], second["model"]);
    assert_eq!(first["context_compacting"]["type"], "context_compacting");

    let (response, off) = stream_bytes(&stack, "off", "off").await;
    assert_eq!(compaction(&response), "summarized");
    assert!(off.starts_with("data: {"));

    // The reuse path is silent.
    let (response, reused) = stream_bytes(&stack, "comment", "comment").await;
    assert_eq!(compaction(&response), "reused");
    assert!(reused.starts_with("data: {"), "{reused}");
}

#[tokio::test]
async fn async_openai_reads_every_notice_mode() {
    use async_openai::config::OpenAIConfig;
    use async_openai::types::chat::CreateChatCompletionRequest;
    use futures_util::StreamExt;

    compactor::server::install_crypto_provider();
    let stack = stack().await;
    for (mode, expected_errors) in [("comment", 0), ("chunk", 0), ("named", 1), ("off", 0)] {
        let http = reqwest_client_with_notice(mode);
        let config = OpenAIConfig::new()
            .with_api_base(stack.proxy.base_url())
            .with_api_key("sk-test");
        let client = async_openai::Client::with_config(config).with_http_client(http);
        let messages = conversation(7, &format!("sdk-{mode}"));
        let request: CreateChatCompletionRequest = serde_json::from_value(
            json!({"model": "gpt-4o-mini", "messages": messages, "stream": true}),
        )
        .unwrap();
        let mut stream = client
            .chat()
            .create_stream(request)
            .await
            .expect("stream opens");
        let mut text = String::new();
        let mut errors = 0;
        while let Some(item) = tokio::time::timeout(BOUND, stream.next())
            .await
            .expect("bounded")
        {
            match item {
                Ok(chunk) => {
                    for choice in chunk.choices {
                        text.push_str(choice.delta.content.as_deref().unwrap_or(""));
                    }
                }
                Err(_) => errors += 1,
            }
        }
        // Echo mode: the reply is the request the upstream received, i.e. the compacted one.
        let echoed: Value = serde_json::from_str(&text).expect("full reply arrived");
        assert!(
            echoed["messages"][1]["content"]
                .as_str()
                .unwrap()
                .starts_with("Here is a summary"),
            "{mode}"
        );
        assert_eq!(errors, expected_errors, "{mode}");
    }
}

fn reqwest_client_with_notice(mode: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-compactor-notice", mode.parse().unwrap());
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .expect("client")
}

fn random_agent_conversation(rng: &mut Rng, seed: u64) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": "agent"})];
    let mut call = 0;
    for _ in 0..(4 + rng.below(30)) {
        match rng.below(4) {
            0 => messages.push(
                json!({"role": "user", "content": format!("s{seed} question {}", rng.next())}),
            ),
            1 => messages.push(
                json!({"role": "assistant", "content": format!("s{seed} answer {}", rng.next())}),
            ),
            _ => {
                let parallel = 1 + rng.below(3);
                let ids: Vec<String> = (0..parallel)
                    .map(|_| {
                        call += 1;
                        format!("call_{seed}_{call}")
                    })
                    .collect();
                let calls: Vec<Value> = ids.iter().map(|id| json!({"id": id, "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"/mnt/skills/x/SKILL.md\"}"}})).collect();
                messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
                for id in ids.iter().rev() {
                    messages.push(json!({"role": "tool", "tool_call_id": id, "content": "x".repeat(rng.below(400) as usize)}));
                }
            }
        }
    }
    if rng.below(3) == 0 {
        // End on a pending tool turn answered by results (the agent loop's next model call).
        call += 1;
        let id = format!("call_{seed}_{call}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "search", "arguments": "{}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": "found"}));
    } else {
        messages.push(json!({"role": "user", "content": "latest"}));
    }
    messages
}

#[tokio::test]
async fn random_tool_heavy_conversations_through_every_stage_are_always_accepted_upstream() {
    let settings = "  stages: [clear_tool_outputs, summarize, truncate]\n  clear_tool_outputs: {min_tokens: 30}\n  trigger: [{type: tokens, value: 1000}]\n  keep: {type: messages, value: 5}\n  headroom: 0.75\n  preserve_recent_skill_count: 0\n  max_calls_per_minute_per_tenant: 1000\n  breaker_failures: 1000\nmodels:\n  - match: \"gpt-4o-mini\"\n    max_input_tokens: 1200\n";
    let stack = stack_with(settings, MockOptions::default()).await;
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut seen = std::collections::BTreeMap::new();
    for seed in 0..200 {
        // Every third conversation finds the summarizer down: truncation is the last resort.
        let down = (seed % 3 == 0).then_some(mock_upstream::MockFault::Status(500));
        stack.summarizer.set_fault(down);
        let messages = random_agent_conversation(&mut rng, seed);
        let response = chat(&stack, &messages, &[]).await;
        assert_eq!(
            response.status,
            StatusCode::OK,
            "seed {seed}: {}",
            response.text()
        );
        *seen.entry(compaction(&response).to_string()).or_insert(0) += 1;
    }
    for outcome in ["cleared", "summarized", "truncated"] {
        assert!(seen.get(outcome).is_some_and(|n| *n > 5), "{seen:?}");
    }
}

#[tokio::test]
async fn an_agent_whose_fixed_part_sits_at_the_trigger_is_not_summarized_every_turn() {
    // Claude Code 2.1.197's shape, scaled down: the system prompt fills a 2 000-token trigger,
    // so no summary can bring a request under it. A summary is made, then reused while the
    // request grows into the room headroom would leave (8 calls in 30 steps here, one each 4
    // steps), instead of a summarizer call on every step (29 before).
    let stack = stack_with(
        "  trigger: [{type: tokens, value: 2000}]\n  keep: {type: messages, value: 4}\n  max_calls_per_minute_per_tenant: 1000\n",
        MockOptions::default(),
    )
    .await;
    let system = "You are an agent. Follow the rules. ".repeat(215);
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "Fix the failing test."}),
    ];
    let mut compacted = 0;
    for step in 0..30 {
        let id = format!("call_{step}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "read", "arguments": format!("{{\"path\":\"src/{step}.rs\"}}")}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": format!("fn f{step}() {{}} ").repeat(30)}));
        let response = send_chat(&stack.proxy, &messages, &[]).await;
        assert_eq!(response.status, 200, "step {step}: {}", response.text());
        if ["summarized", "reused"].contains(&outcome(&response).as_str()) {
            compacted += 1;
        }
    }
    assert!(compacted >= 20, "the run was compacted ({compacted} of 30)");
    let calls = stack.summarizer.chat_calls();
    assert!(
        calls <= 10,
        "{calls} summarizer calls in 30 steps: one per step is what this replaces"
    );
    let metrics = get(&stack.proxy.url("/metrics")).await.text();
    assert!(
        metrics.contains(
            r#"compactor_compactions_total{outcome="reused",reason="trigger_unreachable"}"#
        ),
        "the reuse says why: {metrics}"
    );
}

#[tokio::test]
async fn the_summary_keeps_the_evicted_identifiers_verbatim_whatever_the_summarizer_writes() {
    // The four kinds a real 1.5B model's summary dropped: an error code, a path, a decision's
    // id and the next step's id. The mock summarizer writes none of them back.
    let planted = [
        "error[E0502]",
        "src/payments/ledger.rs",
        "DEC-2041",
        "NS-77",
    ];
    let mut messages = conversation(6, "p");
    messages[2]["content"] = json!("cargo build failed: error[E0502] in src/payments/ledger.rs");
    messages[4]["content"] = json!("Decision DEC-2041: keep the old schema. Next step NS-77.");
    for (index, expected) in [(24, planted.len()), (0, 0)] {
        let summarization = format!("{DEFAULT_SUMMARIZATION}  identifier_index: {index}\n");
        let stack = stack_with(&summarization, MockOptions::default()).await;
        let response = chat(&stack, &messages, &[]).await;
        assert_eq!(compaction(&response), "summarized");
        let summary = summary_text(&forwarded_messages(&stack.upstream)[1]);
        let kept = planted.iter().filter(|id| summary.contains(*id)).count();
        assert_eq!(kept, expected, "identifier_index {index}: {summary}");
    }
}
