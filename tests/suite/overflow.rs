//! Never a context-length error: the reactive retry after an upstream's context-length error
//! (each provider's real error shape, from the mock), the truncation of last resort, and the
//! clear 400 of `fail_mode: closed`. The mock counts tokens its own way (a quarter of the JSON
//! length), and the model is one compactor has no tokenizer for (`local-model`): its estimate
//! and the upstream's count differ, as against any server whose tokenizer compactor lacks.

use crate::common::*;
use mock_upstream::{MockFault, MockHandle, MockMode, MockOptions};
use serde_json::{json, Value};

/// compactor in front of an echoing chat upstream and an echoing Anthropic upstream, both
/// enforcing `window` tokens, and a summarizer; triggers far away so only the window matters.
struct Windowed {
    chat: MockHandle,
    claude: MockHandle,
    summarizer: MockHandle,
    proxy: Proxy,
}

async fn windowed(window: u64, summarization: &str, extra: &str) -> Windowed {
    let options = MockOptions {
        mode: MockMode::Echo,
        window: Some(window),
        ..MockOptions::default()
    };
    let chat = mock(options.clone()).await;
    let claude = mock(options).await;
    let summarizer = mock(MockOptions {
        mode: MockMode::Summarizer,
        ..MockOptions::default()
    })
    .await;
    let yaml = format!(
        "upstreams:\n  - name: chat\n    base_url: {}\n  - name: claude\n    api: anthropic\n    base_url: {}\n  - name: summarizer\n    base_url: {}\n    models: [\"summarizer-*\"]\nsummarization:\n  enabled: true\n  upstream: summarizer\n  model_name: summarizer-model\n  summary_max_tokens: 32\n  trigger: [{{type: tokens, value: 1000000}}]\n  keep: {{type: messages, value: 4}}\n{summarization}{extra}",
        chat.base_url(),
        claude.base_url(),
        summarizer.base_url()
    );
    Windowed {
        proxy: proxy(&yaml).await,
        chat,
        claude,
        summarizer,
    }
}

/// compactor in front of a `chat` upstream and a summarizer, keeping the last 4 messages, with
/// these `summarization` lines: the chat mock, the summarizer and the proxy.
async fn chat_stack(chat: MockOptions, summarization: &str) -> (MockHandle, MockHandle, Proxy) {
    let chat = mock(chat).await;
    let summarizer = mock(MockOptions {
        mode: MockMode::Summarizer,
        ..MockOptions::default()
    })
    .await;
    let yaml = format!(
        "upstreams:\n  - name: chat\n    base_url: {}\n  - name: summarizer\n    base_url: {}\n    models: [\"summarizer-*\"]\nsummarization:\n  enabled: true\n  upstream: summarizer\n  model_name: summarizer-model\n  summary_max_tokens: 32\n  keep: {{type: messages, value: 4}}\n{summarization}",
        chat.base_url(),
        summarizer.base_url()
    );
    let proxy = proxy(&yaml).await;
    (chat, summarizer, proxy)
}

/// A chat of `turns` user/assistant pairs, each message about `chars` characters.
fn chat_history(turns: usize, chars: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    for t in 0..turns {
        let words = |who: &str| format!("{who} {t}: ") + &"lorem ipsum dolor ".repeat(chars / 18);
        messages.push(json!({"role": "user", "content": words("question")}));
        messages.push(json!({"role": "assistant", "content": words("answer")}));
    }
    messages.push(json!({"role": "user", "content": "And what now?"}));
    messages
}

async fn post(proxy: &Proxy, path: &str, body: &Value, headers: &[(&str, &str)]) -> Collected {
    roundtrip(
        &client(),
        json_request(&proxy.url(path), body.to_string(), headers),
    )
    .await
}

/// The mock's own count of a request body.
fn mock_tokens(body: &[u8]) -> u64 {
    mock_upstream::window::input_tokens(&serde_json::from_slice(body).expect("JSON"))
}

#[tokio::test]
async fn a_context_length_error_becomes_one_compacted_answer_and_the_window_is_learned() {
    let stack = windowed(2_000, "", "").await;
    let messages = chat_history(15, 400);
    let body = json!({"model": "local-model", "messages": messages});
    assert!(mock_tokens(body.to_string().as_bytes()) > 2_000);

    let response = post(&stack.proxy, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "summarized");
    assert_eq!(
        stack.chat.window_refusals(),
        1,
        "one refusal, then the retry"
    );
    assert_eq!(stack.chat.chat_calls(), 1);
    assert_eq!(stack.summarizer.chat_calls(), 1);
    let retried = stack.chat.last_request().expect("retry");
    assert!(mock_tokens(&retried.body) <= 2_000);
    let forwarded: Value = retried.json();
    assert_eq!(
        forwarded["messages"][0], messages[0],
        "the system prompt stays first"
    );
    assert_eq!(
        forwarded["messages"].as_array().unwrap().last(),
        messages.last(),
        "the latest user message stays last"
    );
    // Counted as a reactive compaction and a retry that answered.
    let metrics = get(&stack.proxy.url("/metrics")).await.text();
    for sample in [
        r#"compactor_compactions_total{outcome="summarized",reason="reactive"} 1"#,
        r#"compactor_reactive_retries_total{result="ok"} 1"#,
    ] {
        assert!(metrics.lines().any(|line| line == sample), "{sample}");
    }

    // The error's limit is now this model's window: the next turn is compacted up front,
    // with no second round trip to be refused.
    let mut next = messages.clone();
    next.push(json!({"role": "assistant", "content": "Now this."}));
    next.push(json!({"role": "user", "content": "Thanks, and then?"}));
    let body = json!({"model": "local-model", "messages": next});
    let response = post(&stack.proxy, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(
        stack.chat.window_refusals(),
        1,
        "no refusal on the next turn"
    );
    assert!(["reused", "summarized"].contains(&outcome(&response).as_str()));
}

#[tokio::test]
async fn a_stream_refused_before_its_first_byte_is_retried_compacted() {
    let stack = windowed(2_000, "", "").await;
    let body = json!({"model": "local-model", "stream": true, "messages": chat_history(15, 400)});
    let response = post(&stack.proxy, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.headers["content-type"], "text/event-stream");
    assert_eq!(outcome(&response), "summarized");
    let text = response.text();
    assert!(
        text.starts_with(": context_compacting"),
        "the notice goes first: {text}"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(stack.chat.window_refusals(), 1);
    assert_eq!(stack.summarizer.chat_calls(), 1);
}

#[tokio::test]
async fn every_providers_error_shape_is_recognised_and_its_limit_used() {
    for style in ["openai", "azure", "vllm", "openrouter"] {
        let stack = windowed(2_000, "", "").await;
        let body =
            json!({"model": "local-model", "max_tokens": 100, "messages": chat_history(15, 400)});
        let headers = [("x-mock-window-style", style)];
        let response = post(&stack.proxy, "/v1/chat/completions", &body, &headers).await;
        assert_eq!(response.status, 200, "{style}: {}", response.text());
        assert_eq!(outcome(&response), "summarized", "{style}");
        assert_eq!(stack.chat.window_refusals(), 1, "{style}");
    }

    // Anthropic's "prompt is too long", on the Messages API.
    let stack = windowed(2_000, "", "").await;
    let mut messages = chat_history(15, 400);
    messages.remove(0);
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "system": "Be brief.", "messages": messages});
    let response = post(&stack.proxy, "/v1/messages", &body, &[]).await;
    assert_eq!(response.status, 200, "anthropic: {}", response.text());
    assert_eq!(outcome(&response), "summarized");
    assert_eq!(stack.claude.window_refusals(), 1);
    assert_eq!(response.json()["type"], "message");

    // The Responses API states no limit: the retry aims well under what was refused.
    let stack = windowed(2_000, "", "").await;
    let input: Vec<Value> = chat_history(15, 400).into_iter().skip(1).collect();
    let body = json!({"model": "local-model", "instructions": "Be brief.", "input": input});
    let response = post(&stack.proxy, "/v1/responses", &body, &[]).await;
    assert_eq!(response.status, 200, "responses: {}", response.text());
    assert_eq!(outcome(&response), "summarized");
    assert_eq!(stack.chat.window_refusals(), 1);
}

/// A Codex-like run on the Responses API: a developer item, the task, then calls and outputs.
fn responses_run(steps: usize) -> Vec<Value> {
    let mut input = vec![
        json!({"role": "developer", "content": "Work carefully."}),
        json!({"role": "user", "content": "Find the bug."}),
    ];
    for step in 0..steps {
        let id = format!("call_{step}");
        input.push(json!({"type": "function_call", "call_id": id, "name": "exec_command", "arguments": "{\"cmd\":\"cat a.rs\"}"}));
        input.push(json!({"type": "function_call_output", "call_id": id, "output": "fn step() { run(); }\n".repeat(20)}));
    }
    input
}

#[tokio::test]
async fn an_error_without_numbers_still_teaches_the_window() {
    let stack = windowed(2_000, "", "").await;
    // OpenAI's Responses error names no limit; each later step is bigger than the one refused.
    for steps in [16, 18, 20, 24, 28] {
        let body = json!({"model": "gpt-5-codex", "instructions": "Be brief.", "input": responses_run(steps)});
        let response = post(&stack.proxy, "/v1/responses", &body, &[]).await;
        assert_eq!(response.status, 200, "{steps} steps: {}", response.text());
        assert_ne!(outcome(&response), "skipped", "{steps} steps");
        let forwarded = stack.chat.last_request().expect("forwarded");
        assert!(mock_tokens(&forwarded.body) <= 2_000, "{steps} steps");
    }
    // Later steps are compacted before they are sent: not each one refused and retried.
    // (The estimate counts fewer tokens than this upstream, so the first guess at the window
    // can still be too large once; each refusal lowers it, never to a size already refused.)
    let refused: Vec<u64> = stack
        .chat
        .requests()
        .iter()
        .map(|request| mock_tokens(&request.body))
        .filter(|&tokens| tokens > 2_000)
        .collect();
    assert!(refused.len() <= 2, "refused: {refused:?}");
    assert!(
        refused.windows(2).all(|pair| pair[1] < pair[0]),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_retry_refused_again_is_logged_and_counted_as_failed() {
    // An upstream that refuses every size, with an error that names no limit: the compacted
    // retry is refused too.
    let stack = windowed(2_000, "", "").await;
    let body = json!({"model": "local-model", "messages": chat_history(15, 400)});
    let headers = [("x-mock-window", "1"), ("x-mock-window-style", "responses")];
    let response = post(&stack.proxy, "/v1/chat/completions", &body, &headers).await;
    assert_eq!(response.status, 400);
    assert_eq!(response.json()["error"]["code"], "context_length_exceeded");
    assert_eq!(outcome(&response), "failed");
    let metrics = get(&stack.proxy.url("/metrics")).await.text();
    for sample in [
        r#"compactor_compactions_total{outcome="failed",reason="reactive_refused"} 1"#,
        r#"compactor_reactive_retries_total{result="failed"} 1"#,
    ] {
        assert!(metrics.lines().any(|line| line == sample), "{sample}");
    }
}

#[tokio::test]
async fn a_request_that_cannot_fit_gets_the_upstreams_error_unchanged() {
    let stack = windowed(2_000, "", "").await;
    // One message larger than the window: nothing to summarize, nothing to drop.
    let body = json!({"model": "local-model", "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "word ".repeat(3_000)},
    ]});
    let through = post(&stack.proxy, "/v1/chat/completions", &body, &[]).await;
    let direct = roundtrip(
        &client(),
        json_request(
            &format!("{}/chat/completions", stack.chat.base_url()),
            body.to_string(),
            &[],
        ),
    )
    .await;
    assert_eq!(through.status, 400);
    assert_eq!(
        through.body, direct.body,
        "byte for byte the upstream's error"
    );
    assert_eq!(through.json()["error"]["code"], "context_length_exceeded");
    assert!(!through.headers.contains_key("x-compactor-error"));
    assert_eq!(
        stack.summarizer.chat_calls(),
        0,
        "no summary that cannot help"
    );
    assert_eq!(
        stack.chat.window_refusals(),
        2,
        "ours and the direct one: no retry"
    );
}

#[tokio::test]
async fn reactive_retries_can_be_switched_off() {
    let stack = windowed(2_000, "  reactive: false\n", "").await;
    let body = json!({"model": "local-model", "messages": chat_history(15, 400)});
    let response = post(&stack.proxy, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(response.status, 400);
    assert_eq!(response.json()["error"]["code"], "context_length_exceeded");
    assert_eq!(stack.summarizer.chat_calls(), 0);
}

const SMALL_WINDOW_MODEL: &str =
    "models:\n  - match: \"local-model\"\n    max_input_tokens: 2500\n";

#[tokio::test]
async fn with_the_summarizer_down_truncation_fits_the_window_and_says_so() {
    // The mock's window is a little larger than the configured one: its count is not ours.
    let stack = windowed(
        3_000,
        "  stages: [summarize, truncate]\n",
        SMALL_WINDOW_MODEL,
    )
    .await;
    stack.summarizer.set_fault(Some(MockFault::Status(500)));
    let messages = chat_history(15, 400);
    let body = json!({"model": "local-model", "messages": messages});
    let response = post(&stack.proxy, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "truncated");
    let dropped: usize = response.headers["x-compactor-messages-dropped"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(dropped >= 2 && dropped % 2 == 0, "whole turns: {dropped}");
    assert_eq!(stack.chat.window_refusals(), 0, "sent under the window");
    let forwarded = stack.chat.last_request().unwrap();
    assert!(mock_tokens(&forwarded.body) <= 3_000);
    let sent = forwarded.json()["messages"].as_array().unwrap().clone();
    assert_eq!(sent[0], messages[0], "pinned head first");
    assert!(sent[1]["content"]
        .as_str()
        .unwrap()
        .contains(&format!("{dropped} earlier messages were left out")));
    assert_eq!(sent.last(), messages.last(), "the latest user message kept");
    // What is kept is the newest part, verbatim.
    let kept = &sent[2..];
    assert_eq!(kept, &messages[messages.len() - kept.len()..]);
}

#[tokio::test]
async fn truncating_a_long_agent_run_keeps_its_one_user_message_and_whole_tool_groups() {
    let stack = windowed(
        3_000,
        "  stages: [summarize, truncate]\n",
        SMALL_WINDOW_MODEL,
    )
    .await;
    stack.summarizer.set_fault(Some(MockFault::Status(503)));
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Fix the failing tests."}),
    ];
    for i in 0..12 {
        let id = format!("call_{i}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/f{i}.rs\"}}")}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": "fn step() { run(); }\n".repeat(40)}));
    }
    let body = json!({"model": "local-model", "messages": messages});
    let response = post(&stack.proxy, "/v1/chat/completions", &body, &[]).await;
    // The mock validates every call against its result: a split group would be a 400.
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "truncated");
    let sent = stack.chat.last_request().unwrap().json()["messages"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(sent[0], messages[0]);
    // The note goes in front of the task, moved up, so no two user messages follow each other.
    let first = sent[1]["content"].as_str().unwrap();
    assert!(
        first.contains("left out") && first.ends_with("Fix the failing tests."),
        "{first}"
    );
    assert_eq!(sent[2]["role"], "assistant");
    assert_eq!(sent.last(), messages.last());
}

#[tokio::test]
async fn fail_closed_refuses_what_cannot_fit_with_the_numbers() {
    let models = "models:\n  - match: \"local-model\"\n    max_input_tokens: 2500\n  - match: \"claude-sonnet-4-5\"\n    max_input_tokens: 2500\n";
    let stack = windowed(1_000_000, "  fail_mode: closed\n", models).await;
    let body = json!({"model": "local-model", "messages": [
        {"role": "user", "content": "word ".repeat(4_000)},
    ]});
    let response = post(&stack.proxy, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(response.status, 400, "{}", response.text());
    // OpenAI's code, which clients (Codex, the Agents SDK) compact on.
    let error = &response.json()["error"];
    assert_eq!(error["code"], "context_length_exceeded");
    assert_eq!(error["type"], "invalid_request_error");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.starts_with("This model's maximum context length is 2500 tokens."),
        "{message}"
    );
    assert_eq!(
        response.headers["x-compactor-error"],
        "context_length_exceeded"
    );
    assert!(
        stack.chat.requests().is_empty(),
        "never sent to fail upstream"
    );

    // Anthropic's words on the Messages API, which Claude Code parses for both numbers.
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [
        {"role": "user", "content": "word ".repeat(4_000)},
    ]});
    let response = post(&stack.proxy, "/v1/messages", &body, &[]).await;
    assert_eq!(response.status, 400, "{}", response.text());
    let answer = response.json();
    assert_eq!(answer["type"], "error");
    assert_eq!(answer["error"]["type"], "invalid_request_error");
    let message = answer["error"]["message"].as_str().unwrap();
    let numbers: Vec<&str> = message
        .strip_prefix("prompt is too long: ")
        .and_then(|rest| rest.strip_suffix(" maximum"))
        .map(|rest| rest.split(" tokens > ").collect())
        .unwrap_or_default();
    assert_eq!(numbers.len(), 2, "{message}");
    assert!(numbers[0].parse::<u64>().unwrap() > 2500, "{message}");
    // What the window leaves for the input once the answer's `max_tokens` is set aside.
    assert_eq!(numbers[1], "2400", "{message}");
    assert!(
        stack.claude.requests().is_empty(),
        "never sent to fail upstream"
    );

    // The same in open mode goes upstream as it is.
    let stack = windowed(1_000_000, "", SMALL_WINDOW_MODEL).await;
    let response = post(&stack.proxy, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(response.status, 200);
    assert_eq!(stack.chat.chat_calls(), 1);
}

#[tokio::test]
async fn truncation_keeps_messages_and_responses_requests_valid_for_their_apis() {
    let models = "models:\n  - match: \"claude-sonnet-4-5\"\n    max_input_tokens: 2500\n  - match: \"local-model\"\n    max_input_tokens: 2500\n";
    let stack = windowed(3_000, "  stages: [summarize, truncate]\n", models).await;
    stack.summarizer.set_fault(Some(MockFault::Status(500)));
    // A Claude Code-style run: tool_use turns answered by tool_result turns, strict alternation.
    let mut messages = vec![json!({"role": "user", "content": "Fix the failing tests."})];
    for i in 0..12 {
        let id = format!("toolu_{i}");
        messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": "Reading."}, {"type": "tool_use", "id": id, "name": "Read", "input": {"file_path": format!("src/f{i}.rs")}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "fn step() { run(); }\n".repeat(40)}]}));
    }
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "system": "You are a coding agent.", "messages": messages});
    let response = post(&stack.proxy, "/v1/messages", &body, &[]).await;
    // The Anthropic mock refuses a broken alternation or an unpaired tool_use.
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "truncated");
    let sent = stack.claude.last_request().unwrap().json();
    let first = &sent["messages"][0]["content"];
    assert!(first.to_string().contains("left out"), "{first}");
    assert!(
        first.to_string().contains("Fix the failing tests."),
        "{first}"
    );

    let mut input = vec![json!({"role": "user", "content": "Fix the failing tests."})];
    for i in 0..12 {
        let id = format!("call_{i}");
        input.push(
            json!({"type": "function_call", "call_id": id, "name": "read_file", "arguments": "{}"}),
        );
        input.push(json!({"type": "function_call_output", "call_id": id, "output": "fn step() { run(); }\n".repeat(40)}));
    }
    let body =
        json!({"model": "local-model", "instructions": "You are a coding agent.", "input": input});
    let response = post(&stack.proxy, "/v1/responses", &body, &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "truncated");
}

#[tokio::test]
async fn with_the_summarizer_budget_spent_the_cached_summary_still_keeps_the_request_in_its_window()
{
    let (upstream, summarizer, proxy) = chat_stack(
        MockOptions {
            mode: MockMode::Echo,
            window: Some(3_500),
            ..MockOptions::default()
        },
        "  trigger: [{type: tokens, value: 1500}]\n  max_calls_per_minute_per_tenant: 1\n",
    )
    .await;
    let first = json!({"model": "local-model", "messages": chat_history(10, 400)});
    let response = post(&proxy, "/v1/chat/completions", &first, &[]).await;
    assert_eq!(outcome(&response), "summarized");

    // Ten turns later the request is past the trigger again and over the upstream's window as
    // it stands; the one call a minute is spent, so no new summary can be made.
    let later = json!({"model": "local-model", "messages": chat_history(20, 400)});
    assert!(mock_tokens(later.to_string().as_bytes()) > 3_500);
    let before = upstream.requests().len();
    let response = post(&proxy, "/v1/chat/completions", &later, &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "reused");
    assert_eq!(summarizer.chat_calls(), 1);
    let sent = upstream.requests();
    assert_eq!(sent.len(), before + 1, "forwarded once, and accepted");
    let forwarded = sent.last().expect("forwarded").json();
    let messages = forwarded["messages"].as_array().expect("messages");
    assert!(messages.len() < 42, "{} messages", messages.len());
    assert!(
        messages.iter().any(|m| m["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("Here is a summary of the conversation to date"))),
        "the first turn's summary is in it"
    );
}

#[tokio::test]
async fn a_retry_aims_under_the_refused_size_in_the_counting_its_plan_uses() {
    // Codex against an upstream that counts with the model's real tokenizer and whose error
    // names no limit. compactor has that tokenizer too (gpt-4o): the retry's plan counts with
    // it, so the size it aims under must be counted the same way, not by the estimate (which
    // puts these long words at several times their real count).
    let (chat, _summarizer, proxy) = chat_stack(
        MockOptions {
            mode: MockMode::Echo,
            window: Some(3_000),
            counting: mock_upstream::window::Counting::O200k,
            ..MockOptions::default()
        },
        "  trigger: [{type: tokens, value: 1000000}]\n",
    )
    .await;
    let mut input = vec![json!({"role": "user", "content": "Tidy the module."})];
    for step in 0..24 {
        let id = format!("call_{step}");
        input.push(json!({"type": "function_call", "call_id": id, "name": "exec_command", "arguments": "{\"cmd\":\"cat notes.md\"}"}));
        input.push(json!({"type": "function_call_output", "call_id": id, "output": "internationalization responsibilities ".repeat(40)}));
    }
    let body = json!({"model": "gpt-4o", "input": input});
    let response = post(&proxy, "/v1/responses", &body, &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "summarized");
    assert_eq!(chat.window_refusals(), 1, "refused once, then compacted");
}

#[tokio::test]
async fn a_stale_summary_too_small_for_the_grown_tail_leaves_out_the_oldest_groups_after_it() {
    // The summarizer budget is spent, and the cached summary with everything since is over the
    // model's window: forwarding it would only be refused. The oldest whole groups after the
    // summary are left out instead, with a note, and the latest question stays.
    let (upstream, summarizer, proxy) = chat_stack(
        MockOptions {
            mode: MockMode::Echo,
            window: Some(3_500),
            ..MockOptions::default()
        },
        "  trigger: [{type: tokens, value: 1500}]\n  max_calls_per_minute_per_tenant: 1\nmodels:\n  - match: local-model\n    max_input_tokens: 3500\n",
    )
    .await;
    let first = json!({"model": "local-model", "messages": chat_history(10, 400)});
    assert_eq!(
        outcome(&post(&proxy, "/v1/chat/completions", &first, &[]).await),
        "summarized"
    );
    let later = json!({"model": "local-model", "messages": chat_history(40, 400)});
    let response = post(&proxy, "/v1/chat/completions", &later, &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "reused");
    assert_eq!(summarizer.chat_calls(), 1, "the budget allowed one call");
    assert_eq!(
        upstream.window_refusals(),
        0,
        "nothing over the window was sent"
    );
    let forwarded = upstream.last_request().expect("forwarded").json();
    let messages = forwarded["messages"].as_array().expect("messages");
    let summary = messages[1]["content"].as_str().expect("the summary");
    assert!(
        summary.contains("earlier messages were left out"),
        "{summary}"
    );
    assert_eq!(
        messages.last(),
        later["messages"].as_array().unwrap().last()
    );
}
