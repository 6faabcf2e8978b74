//! A way back from a summary (`summarization.retrieval`) on chat completions: the mock in agent
//! mode plays a model that calls compactor's lookup tool whenever the planted fact is not in
//! the summary, and answers with what the lookup returned.

use serde_json::{json, Value};

use crate::common::*;
use mock_upstream::{MockHandle, MockMode, MockOptions};

const FACT: &str = "FACT-7Q2KD";

/// A conversation whose only copy of the fact is a file read early on, then long exchanges,
/// ending on a question about it.
fn conversation() -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a careful engineer."}),
        json!({"role": "user", "content": "Read the notes and remember the code in them."}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_notes", "type": "function",
            "function": {"name": "read_file", "arguments": "{\"path\":\"notes/fact.txt\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_notes",
            "content": format!("line one of the notes\nthe code is {FACT} \"quoted\" é\nline three")}),
    ];
    for t in 0..20 {
        let words = |who: &str| format!("{who} {t}: ") + &"the parser drops a token ".repeat(12);
        messages.push(json!({"role": "user", "content": words("question")}));
        messages.push(json!({"role": "assistant", "content": words("answer")}));
    }
    messages.push(json!({"role": "user", "content": "Recall the code in the notes."}));
    messages
}

struct Setup {
    upstream: MockHandle,
    _summarizer: MockHandle,
    proxy: Proxy,
}

async fn setup(retrieval: &str) -> Setup {
    let upstream = mock(MockOptions {
        mode: MockMode::Agent,
        ..MockOptions::default()
    })
    .await;
    let summarizer = mock(MockOptions {
        mode: MockMode::Summarizer,
        ..MockOptions::default()
    })
    .await;
    // No identifier index: the summary loses the fact, as a real one did.
    let yaml = format!(
        "upstreams:\n  - name: mock\n    base_url: {}\n  - name: claude\n    api: anthropic\n    base_url: {}\n    api_key: sk-ant-operator\n  - name: gemini\n    api: gemini\n    base_url: {}\n    api_key: g-operator\n  - name: summarizer\n    base_url: {}\n    models: [\"summarizer-*\"]\nsummarization:\n  enabled: true\n  upstream: summarizer\n  model_name: summarizer-model\n  summary_max_tokens: 64\n  identifier_index: 0\n  trigger: {{type: tokens, value: 1500}}\n  keep: {{type: messages, value: 4}}\n  max_calls_per_minute_per_tenant: 1000\n  retrieval: {retrieval}\n",
        upstream.base_url(),
        upstream.base_url(),
        upstream.base_url().trim_end_matches("/v1"),
        summarizer.base_url()
    );
    Setup {
        proxy: proxy(&yaml).await,
        upstream,
        _summarizer: summarizer,
    }
}

fn chat(messages: &[Value], stream: bool) -> String {
    let mut body = json!({"model": "gpt-4o-mini", "messages": messages});
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body.to_string()
}

async fn ask(setup: &Setup, messages: &[Value], stream: bool) -> Collected {
    post(setup, "/v1/chat/completions", chat(messages, stream), &[]).await
}

/// The mock's usage of one request it answered: a quarter of its messages' JSON.
fn prompt_tokens(request: &Value) -> u64 {
    (request["messages"].to_string().len() / 4) as u64
}

/// The chat requests the upstream got, oldest first.
fn upstream_chats(upstream: &MockHandle) -> Vec<Value> {
    upstream_bodies(upstream, |path| path.ends_with("/chat/completions"))
}

/// A POST of `body` to `path` through the proxy.
async fn post(setup: &Setup, path: &str, body: String, headers: &[(&str, &str)]) -> Collected {
    roundtrip(
        &client(),
        json_request(&setup.proxy.url(path), body, headers),
    )
    .await
}

/// The bodies of the requests the upstream got at paths `at` accepts, oldest first.
fn upstream_bodies(upstream: &MockHandle, at: impl Fn(&str) -> bool) -> Vec<Value> {
    upstream
        .requests()
        .into_iter()
        .filter(|r| at(&r.path_and_query))
        .map(|r| r.json())
        .collect()
}

fn declares_lookup(request: &Value) -> bool {
    request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["function"]["name"] == "compactor_expand")
}

/// The fact reached the model's second round byte for byte, as the result of the lookup the
/// first round's answer asked for.
fn assert_looked_up(chats: &[Value]) {
    assert_eq!(chats.len(), 2, "one lookup, one more round: {chats:#?}");
    let first = &chats[0];
    assert!(declares_lookup(first), "the tool is offered");
    let summary = first["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .find(|c| c.starts_with("Here is a summary"))
        .expect("a summary")
        .to_string();
    assert!(summary.contains("\n- ref:"), "{summary}");
    assert!(summary.contains("read_file"), "{summary}");
    assert!(!summary.contains(FACT), "the summary lost the fact");
    let messages = chats[1]["messages"].as_array().unwrap();
    let result = messages.last().unwrap();
    assert_eq!(result["role"], "tool");
    let original = format!("line one of the notes\nthe code is {FACT} \"quoted\" é\nline three");
    assert!(
        result["content"].as_str().unwrap().contains(&original),
        "{result}"
    );
    let call = &messages[messages.len() - 2];
    assert_eq!(
        call["tool_calls"][0]["function"]["name"],
        "compactor_expand"
    );
    assert_eq!(call["tool_calls"][0]["id"], result["tool_call_id"]);
}

#[tokio::test]
async fn a_lookup_brings_back_what_the_summary_left_out_whole() {
    let setup = setup("{enabled: true}").await;
    let response = ask(&setup, &conversation(), false).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "summarized");
    assert_eq!(header(&response, "x-compactor-expansions"), "1");
    let chats = upstream_chats(&setup.upstream);
    assert_looked_up(&chats);
    let answer = response.json();
    let message = &answer["choices"][0]["message"];
    assert_eq!(message["content"], format!("Recalled: {FACT}"));
    assert!(message.get("tool_calls").is_none(), "{answer}");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    assert!(!response.text().contains("compactor_expand"));
    // The rounds' usage, summed: the client paid for both calls.
    let prompt: u64 = chats.iter().map(prompt_tokens).sum();
    assert_eq!(answer["usage"]["prompt_tokens"], prompt);
    assert_eq!(
        answer["usage"]["total_tokens"].as_u64(),
        Some(prompt + answer["usage"]["completion_tokens"].as_u64().unwrap())
    );
}

#[tokio::test]
async fn a_lookup_is_spliced_into_one_stream() {
    let setup = setup("{enabled: true}").await;
    let response = ask(&setup, &conversation(), true).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_looked_up(&upstream_chats(&setup.upstream));
    let text = response.text();
    assert!(!text.contains("compactor_expand"), "{text}");
    assert_eq!(text.matches("data: [DONE]").count(), 1, "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let chunks: Vec<Value> = text
        .split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str(data).ok())
        .collect();
    let ids: std::collections::HashSet<String> = chunks
        .iter()
        .map(|c| c["id"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(ids.len(), 1, "one message: {ids:?}");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, format!("Recalled: {FACT}"));
    let roles = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"].get("role").is_some())
        .count();
    assert_eq!(roles, 1, "{text}");
    assert!(chunks
        .iter()
        .all(|c| c["choices"][0]["delta"].get("tool_calls").is_none()));
    let finishes: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, [&json!("stop")]);
    let usages: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["usage"])
        .filter(|u| u.is_object())
        .collect();
    assert_eq!(usages.len(), 1, "{text}");
}

#[tokio::test]
async fn with_one_round_the_follow_up_goes_without_the_tool() {
    let setup = setup("{enabled: true, max_rounds: 1}").await;
    let response = ask(&setup, &conversation(), false).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let chats = upstream_chats(&setup.upstream);
    assert_looked_up(&chats);
    assert!(!declares_lookup(&chats[1]), "the last round cannot look up");
    assert!(response.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .contains(FACT));
}

#[tokio::test]
async fn the_tool_and_the_index_stay_byte_identical_while_the_summary_is_reused() {
    let setup = setup("{enabled: true}").await;
    let mut messages = conversation();
    assert_eq!(outcome(&ask(&setup, &messages, false).await), "summarized");
    messages.push(json!({"role": "assistant", "content": format!("Recalled: {FACT}")}));
    messages.push(json!({"role": "user", "content": "And the code again?"}));
    let second = ask(&setup, &messages, false).await;
    assert_eq!(outcome(&second), "reused");
    let firsts: Vec<bytes::Bytes> = setup
        .upstream
        .requests()
        .into_iter()
        .filter(|r| r.json().get("tools").is_some())
        .filter(|r| {
            let last = r.json()["messages"].as_array().unwrap().last().cloned();
            last.is_some_and(|m| m["role"] == "user")
        })
        .map(|r| r.body)
        .collect();
    assert_eq!(firsts.len(), 2, "each turn's first round");
    let (one, two) = (&firsts[0], &firsts[1]);
    let request: Value = serde_json::from_slice(one).unwrap();
    let summary = request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|m| m["content"].as_str().filter(|c| c.contains("\n- ref:")))
        .expect("a summary with its index")
        .to_string();
    let escaped = serde_json::to_string(&summary).unwrap();
    let summary_end =
        memchr::memmem::find(one, escaped.as_bytes()).expect("the summary") + escaped.len();
    assert_eq!(
        one[..summary_end],
        two[..summary_end],
        "the prefix through the summary's index"
    );
}

#[tokio::test]
async fn off_it_changes_nothing_on_the_wire() {
    let setup = setup("{enabled: false}").await;
    let response = ask(&setup, &conversation(), false).await;
    assert_eq!(outcome(&response), "summarized");
    assert_eq!(header(&response, "x-compactor-expansions"), "");
    let chats = upstream_chats(&setup.upstream);
    assert_eq!(chats.len(), 1);
    assert!(chats[0].get("tools").is_none());
    assert!(!chats[0].to_string().contains("- ref:"));
}

/// The real async-openai client reads the spliced stream and the merged answer as one message.
#[tokio::test]
async fn async_openai_reads_the_rounds_as_one_answer() {
    use async_openai::config::OpenAIConfig;
    use async_openai::types::chat::CreateChatCompletionRequest;
    use futures_util::StreamExt;

    compactor::server::install_crypto_provider();
    let setup = setup("{enabled: true}").await;
    let config = OpenAIConfig::new()
        .with_api_base(setup.proxy.base_url())
        .with_api_key("sk-test");
    let client = async_openai::Client::with_config(config);
    let request = |stream: bool| -> CreateChatCompletionRequest {
        serde_json::from_str(&chat(&conversation(), stream)).expect("a valid request")
    };
    let whole = client.chat().create(request(false)).await.expect("answer");
    assert_eq!(
        whole.choices[0].message.content.as_deref(),
        Some(format!("Recalled: {FACT}").as_str())
    );
    assert!(whole.choices[0].message.tool_calls.is_none());
    let mut stream = client
        .chat()
        .create_stream(request(true))
        .await
        .expect("stream opens");
    let mut text = String::new();
    let mut usage = None;
    while let Some(item) = tokio::time::timeout(BOUND, stream.next())
        .await
        .expect("bounded")
    {
        let chunk = item.expect("chunk parses");
        usage = usage.or(chunk.usage);
        for choice in chunk.choices {
            assert!(choice.delta.tool_calls.is_none());
            text.push_str(choice.delta.content.as_deref().unwrap_or(""));
        }
    }
    assert_eq!(text, format!("Recalled: {FACT}"));
    assert!(usage.is_some(), "the rounds' usage, once");
}

// Anthropic's Messages API, as Claude Code speaks it (thinking on, streamed).

fn messages_conversation() -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "user", "content": "Read the notes and remember the code in them."}),
        json!({"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_notes", "name": "read_file",
            "input": {"path": "notes/fact.txt"}}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_notes",
            "content": format!("line one of the notes\nthe code is {FACT} \"quoted\" é\nline three")}]}),
    ];
    for t in 0..20 {
        let words = |who: &str| format!("{who} {t}: ") + &"the parser drops a token ".repeat(12);
        messages.push(json!({"role": "user", "content": words("question")}));
        messages.push(
            json!({"role": "assistant", "content": [{"type": "text", "text": words("answer")}]}),
        );
    }
    messages.push(json!({"role": "user", "content": "Recall the code in the notes."}));
    messages
}

async fn ask_messages(setup: &Setup, stream: bool, thinking: bool) -> Collected {
    let mut body = json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "system": "You are a careful engineer.",
        "messages": messages_conversation(), "stream": stream,
        "tools": [{"name": "read_file", "description": "Read a file", "input_schema": {"type": "object"}}]});
    if thinking {
        body["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    }
    let version = [("anthropic-version", "2023-06-01")];
    post(setup, "/v1/messages", body.to_string(), &version).await
}

fn upstream_messages(upstream: &MockHandle) -> Vec<Value> {
    upstream_bodies(upstream, |path| path.ends_with("/messages"))
}

/// The fact reached the second round byte for byte, in the tool result answering the first
/// round's lookup, after the assistant turn as the model wrote it (thinking and signature too).
fn assert_looked_up_messages(rounds: &[Value], thinking: bool) {
    assert_eq!(rounds.len(), 2, "one lookup, one more round: {rounds:#?}");
    assert!(rounds[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "compactor_expand"));
    let messages = rounds[1]["messages"].as_array().unwrap();
    let result = &messages[messages.len() - 1];
    assert_eq!(result["role"], "user");
    let original = format!("line one of the notes\nthe code is {FACT} \"quoted\" é\nline three");
    let content = result["content"][0]["content"].as_str().unwrap();
    assert!(content.contains(&original), "{content}");
    let call = &messages[messages.len() - 2];
    assert_eq!(call["role"], "assistant");
    let blocks = call["content"].as_array().unwrap();
    let lookup = blocks.iter().find(|b| b["type"] == "tool_use").unwrap();
    assert_eq!(lookup["name"], "compactor_expand");
    assert_eq!(result["content"][0]["tool_use_id"], lookup["id"]);
    if thinking {
        assert_eq!(blocks[0]["type"], "thinking", "{call}");
        assert!(!blocks[0]["signature"].as_str().unwrap().is_empty());
    }
}

#[tokio::test]
async fn messages_a_lookup_is_answered_whole() {
    let setup = setup("{enabled: true}").await;
    let response = ask_messages(&setup, false, false).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "summarized");
    assert_eq!(header(&response, "x-compactor-expansions"), "1");
    assert_looked_up_messages(&upstream_messages(&setup.upstream), false);
    let answer = response.json();
    assert!(!response.text().contains("compactor_expand"), "{answer}");
    assert_eq!(answer["stop_reason"], "end_turn");
    let text: String = answer["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect();
    assert!(text.ends_with(&format!("Recalled: {FACT}")), "{answer}");
}

#[tokio::test]
async fn messages_a_lookup_is_spliced_into_one_stream_with_thinking() {
    let setup = setup("{enabled: true}").await;
    let response = ask_messages(&setup, true, true).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_looked_up_messages(&upstream_messages(&setup.upstream), true);
    let text = response.text();
    assert!(!text.contains("compactor_expand"), "{text}");
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter_map(|event| {
            let name = event.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = event.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name.to_string(), serde_json::from_str(data).ok()?))
        })
        .collect();
    let count = |kind: &str| events.iter().filter(|(name, _)| name == kind).count();
    assert_eq!(count("message_start"), 1, "{text}");
    assert_eq!(count("message_delta"), 1, "{text}");
    assert_eq!(count("message_stop"), 1, "{text}");
    // Blocks are numbered 0, 1, 2… in the order they start, each started and stopped once.
    let starts: Vec<u64> = events
        .iter()
        .filter(|(name, _)| name == "content_block_start")
        .map(|(_, data)| data["index"].as_u64().unwrap())
        .collect();
    assert_eq!(
        starts,
        (0..starts.len() as u64).collect::<Vec<_>>(),
        "{text}"
    );
    assert_eq!(count("content_block_stop"), starts.len());
    assert!(events
        .iter()
        .all(|(_, data)| data["content_block"]["type"] != "tool_use"));
    let said: String = events
        .iter()
        .filter_map(|(_, data)| data["delta"]["text"].as_str())
        .collect();
    assert!(said.ends_with(&format!("Recalled: {FACT}")), "{said}");
    let delta = &events
        .iter()
        .find(|(name, _)| name == "message_delta")
        .unwrap()
        .1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(
        delta["usage"]["output_tokens"], 80,
        "both rounds' output: {delta}"
    );
}

#[tokio::test]
async fn a_follow_up_the_upstream_refuses_is_asked_again_without_the_tool() {
    let setup = setup("{enabled: true}").await;
    for stream in [false, true] {
        let response = roundtrip(
            &client(),
            json_request(
                &setup.proxy.url("/v1/chat/completions"),
                chat(&conversation(), stream),
                &[("x-mock-refuse-lookups", "1")],
            ),
        )
        .await;
        assert_eq!(response.status, 200, "{}", response.text());
        let text = response.text();
        let said = if stream {
            streamed_content(&text)
        } else {
            response.json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(said, "Hello from the mock upstream.", "{text}");
        assert!(!text.contains("compactor_expand"), "{text}");
    }
    let chats = upstream_chats(&setup.upstream);
    // Each: the first round, the refused follow-up, the question again without the tool.
    assert_eq!(chats.len(), 6, "{chats:#?}");
    assert!(!declares_lookup(&chats[2]) && !declares_lookup(&chats[5]));
}

/// The content a chat stream's chunks carry, joined.
fn streamed_content(text: &str) -> String {
    text.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

// OpenAI's Responses API, as Codex speaks it (reasoning on, streamed).

fn responses_conversation() -> Vec<Value> {
    let mut items = vec![
        json!({"role": "user", "content": [{"type": "input_text", "text": "Read the notes and remember the code in them."}]}),
        json!({"type": "function_call", "id": "fc_notes", "call_id": "call_notes", "name": "read_file",
            "arguments": "{\"path\":\"notes/fact.txt\"}"}),
        json!({"type": "function_call_output", "call_id": "call_notes",
            "output": format!("line one of the notes\nthe code is {FACT} \"quoted\" é\nline three")}),
    ];
    for t in 0..20 {
        let words = |who: &str| format!("{who} {t}: ") + &"the parser drops a token ".repeat(12);
        items.push(json!({"role": "user", "content": words("question")}));
        items.push(json!({"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": words("answer")}]}));
    }
    items.push(json!({"role": "user", "content": "Recall the code in the notes."}));
    items
}

fn responses_body(input: &[Value], stream: bool) -> String {
    json!({"model": "gpt-5-codex", "instructions": "You are a careful engineer.", "input": input,
        "stream": stream, "reasoning": {"effort": "low"}, "store": false,
        "tools": [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]})
    .to_string()
}

async fn ask_responses(setup: &Setup, input: &[Value], stream: bool) -> Collected {
    post(setup, "/v1/responses", responses_body(input, stream), &[]).await
}

fn upstream_responses(upstream: &MockHandle) -> Vec<Value> {
    upstream_bodies(upstream, |path| path.ends_with("/responses"))
}

/// The fact reached the second round byte for byte, in the output answering the first round's
/// lookup, after the round's items as the model produced them (its reasoning first).
fn assert_looked_up_responses(rounds: &[Value]) {
    assert_eq!(rounds.len(), 2, "one lookup, one more round: {rounds:#?}");
    assert!(rounds[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "compactor_expand" && t["type"] == "function"));
    let input = rounds[1]["input"].as_array().unwrap();
    let result = &input[input.len() - 1];
    assert_eq!(result["type"], "function_call_output");
    let original = format!("line one of the notes\nthe code is {FACT} \"quoted\" é\nline three");
    assert!(
        result["output"].as_str().unwrap().contains(&original),
        "{result}"
    );
    let call = &input[input.len() - 2];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "compactor_expand");
    assert_eq!(call["call_id"], result["call_id"]);
    assert_eq!(input[input.len() - 4]["type"], "reasoning", "{input:#?}");
}

/// What the client sends next, its history grown by the answer's output, is a request the
/// upstream takes, and holds none of compactor's lookups.
async fn assert_next_turn_is_taken(setup: &Setup, output: &[Value]) {
    let mut input = responses_conversation();
    input.extend(output.iter().cloned());
    input.push(json!({"role": "user", "content": "Thanks. What next?"}));
    let next = ask_responses(setup, &input, false).await;
    assert_eq!(next.status, 200, "{}", next.text());
    assert_eq!(setup.upstream.rejections(), 0);
    let from_client = upstream_responses(&setup.upstream)
        .iter()
        .filter(|r| mock_upstream::agent::lookup_in_client_history(r))
        .count();
    assert_eq!(from_client, 0);
}

#[tokio::test]
async fn responses_a_lookup_is_answered_whole() {
    let setup = setup("{enabled: true}").await;
    let response = ask_responses(&setup, &responses_conversation(), false).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "summarized");
    assert_eq!(header(&response, "x-compactor-expansions"), "1");
    let rounds = upstream_responses(&setup.upstream);
    assert_looked_up_responses(&rounds);
    assert!(!response.text().contains("compactor_expand"));
    let answer = response.json();
    let output = answer["output"].as_array().unwrap().clone();
    let kinds: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
    // What the first round said, then the second round's reasoning and answer.
    assert_eq!(kinds, ["message", "reasoning", "message"], "{answer}");
    let text = output[2]["content"][0]["text"].as_str().unwrap();
    assert_eq!(text, format!("Recalled: {FACT}"));
    let tokens = |r: &Value| (r.to_string().len() / 4) as u64;
    let input_sum = tokens(&rounds[0]) + tokens(&rounds[1]);
    let usage = &answer["usage"];
    assert_eq!(usage["output_tokens"], 80, "{usage}");
    assert!(
        usage["input_tokens"].as_u64().unwrap() <= input_sum,
        "{usage}"
    );
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["input_tokens"].as_u64().unwrap() + 80)
    );
    assert_next_turn_is_taken(&setup, &output).await;
}

#[tokio::test]
async fn responses_a_lookup_is_spliced_into_one_stream() {
    let setup = setup("{enabled: true}").await;
    let response = ask_responses(&setup, &responses_conversation(), true).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_looked_up_responses(&upstream_responses(&setup.upstream));
    let text = response.text();
    assert!(!text.contains("compactor_expand"), "{text}");
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter_map(|event| {
            let name = event.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = event.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name.to_string(), serde_json::from_str(data).ok()?))
        })
        .filter(|(name, _)| name.starts_with("response."))
        .collect();
    let count = |kind: &str| events.iter().filter(|(name, _)| name == kind).count();
    assert_eq!(count("response.created"), 1, "{text}");
    assert_eq!(count("response.in_progress"), 1, "{text}");
    assert_eq!(count("response.completed"), 1, "{text}");
    let sequence: Vec<u64> = events
        .iter()
        .map(|(_, data)| data["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(sequence, (0..events.len() as u64).collect::<Vec<_>>());
    // Items are numbered 0, 1, 2… in the order they are added; every event names one added.
    let added: Vec<&Value> = events
        .iter()
        .filter(|(name, _)| name == "response.output_item.added")
        .map(|(_, data)| data)
        .collect();
    let indexes: Vec<u64> = added
        .iter()
        .map(|d| d["output_index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, (0..added.len() as u64).collect::<Vec<_>>());
    for (_, data) in &events {
        if let Some(index) = data["output_index"].as_u64() {
            assert!(index < added.len() as u64, "{data}");
        }
    }
    let done: Vec<Value> = events
        .iter()
        .filter(|(name, _)| name == "response.output_item.done")
        .map(|(_, data)| data["item"].clone())
        .collect();
    let completed = &events
        .iter()
        .find(|(name, _)| name == "response.completed")
        .unwrap()
        .1["response"];
    let created = &events[0].1["response"];
    assert_eq!(completed["id"], created["id"]);
    assert_eq!(completed["output"], Value::Array(done.clone()));
    let kinds: Vec<&str> = done.iter().map(|i| i["type"].as_str().unwrap()).collect();
    // Each round's reasoning went out with the message it led to.
    assert_eq!(
        kinds,
        ["reasoning", "message", "reasoning", "message"],
        "{text}"
    );
    let said: String = events
        .iter()
        .filter_map(|(_, data)| data["delta"].as_str())
        .collect();
    assert!(said.ends_with(&format!("Recalled: {FACT}")), "{said}");
    assert_eq!(
        completed["usage"]["output_tokens"], 80,
        "both rounds' output"
    );
    assert_next_turn_is_taken(&setup, &done).await;
}

// Google's Gemini API, as the Gemini CLI speaks it (streamed as events).

fn gemini_conversation() -> Vec<Value> {
    let mut turns = vec![
        json!({"role": "user", "parts": [{"text": "Read the notes and remember the code in them."}]}),
        json!({"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {"path": "notes/fact.txt"}},
            "thoughtSignature": "c2lnLWNsaWVudA"}]}),
        json!({"role": "user", "parts": [{"functionResponse": {"name": "read_file",
            "response": {"output": format!("line one of the notes\nthe code is {FACT} \"quoted\" é\nline three")}}}]}),
    ];
    for t in 0..20 {
        let words = |who: &str| format!("{who} {t}: ") + &"the parser drops a token ".repeat(12);
        turns.push(json!({"role": "user", "parts": [{"text": words("question")}]}));
        turns.push(json!({"role": "model", "parts": [{"text": words("answer")}]}));
    }
    turns.push(json!({"role": "user", "parts": [{"text": "Recall the code in the notes."}]}));
    turns
}

async fn ask_gemini(setup: &Setup, contents: &[Value], stream: bool) -> Collected {
    let body = json!({"contents": contents, "systemInstruction": {"parts": [{"text": "You are a careful engineer."}]},
        "tools": [{"functionDeclarations": [{"name": "read_file", "parameters": {"type": "object"}}]}]});
    let path = if stream {
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    } else {
        "/v1beta/models/gemini-2.5-pro:generateContent"
    };
    post(setup, path, body.to_string(), &[]).await
}

fn upstream_gemini(upstream: &MockHandle) -> Vec<Value> {
    upstream_bodies(upstream, |path| path.contains("/models/gemini-2.5-pro:"))
}

/// The fact reached the second round byte for byte, in the function response answering the
/// first round's lookup, after the model turn as the model wrote it (its signature kept: the
/// mock refuses the turn without it).
fn assert_looked_up_gemini(rounds: &[Value]) {
    assert_eq!(rounds.len(), 2, "one lookup, one more round: {rounds:#?}");
    let declared = rounds[0]["tools"][0]["functionDeclarations"]
        .as_array()
        .unwrap();
    assert!(declared.iter().any(|d| d["name"] == "compactor_expand"));
    assert_eq!(rounds[0]["tools"].as_array().unwrap().len(), 1);
    let turns = rounds[1]["contents"].as_array().unwrap();
    let result = &turns[turns.len() - 1]["parts"][0]["functionResponse"];
    let original = format!("line one of the notes\nthe code is {FACT} \"quoted\" é\nline three");
    assert!(
        result["response"]["output"]
            .as_str()
            .unwrap()
            .contains(&original),
        "{result}"
    );
    let call = &turns[turns.len() - 2];
    assert_eq!(call["role"], "model");
    let lookup = call["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p.get("functionCall").is_some())
        .unwrap();
    assert_eq!(lookup["functionCall"]["name"], "compactor_expand");
    assert!(lookup["thoughtSignature"].is_string(), "{call}");
}

#[tokio::test]
async fn gemini_a_lookup_is_answered_whole() {
    let setup = setup("{enabled: true}").await;
    let response = ask_gemini(&setup, &gemini_conversation(), false).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "summarized");
    assert_eq!(header(&response, "x-compactor-expansions"), "1");
    assert_looked_up_gemini(&upstream_gemini(&setup.upstream));
    assert_eq!(setup.upstream.rejections(), 0);
    assert!(!response.text().contains("compactor_expand"));
    let answer = response.json();
    let text: String = answer["candidates"][0]["content"]["parts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["text"].as_str())
        .collect();
    assert!(text.ends_with(&format!("Recalled: {FACT}")), "{answer}");
    let usage = &answer["usageMetadata"];
    assert_eq!(usage["candidatesTokenCount"], 8, "both rounds': {usage}");
}

#[tokio::test]
async fn gemini_a_lookup_is_spliced_into_one_stream() {
    let setup = setup("{enabled: true}").await;
    let response = ask_gemini(&setup, &gemini_conversation(), true).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_looked_up_gemini(&upstream_gemini(&setup.upstream));
    assert_eq!(setup.upstream.rejections(), 0);
    let text = response.text();
    assert!(!text.contains("compactor_expand"), "{text}");
    let chunks: Vec<Value> = text
        .split("\r\n\r\n")
        .filter_map(|event| event.trim().strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str(data).ok())
        .filter(|chunk: &Value| chunk.get("candidates").is_some())
        .collect();
    let finishes = chunks
        .iter()
        .filter(|c| c["candidates"][0].get("finishReason").is_some())
        .count();
    assert_eq!(finishes, 1, "{text}");
    let last = chunks.last().unwrap();
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    assert_eq!(last["usageMetadata"]["candidatesTokenCount"], 8, "{last}");
    let said: String = chunks
        .iter()
        .flat_map(|c| {
            c["candidates"][0]["content"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|p| p["text"].as_str().map(str::to_string))
        .collect();
    assert!(said.ends_with(&format!("Recalled: {FACT}")), "{said}");
    assert!(said.starts_with("Let me read the original."), "{said}");
}

#[tokio::test]
async fn gemini_a_stream_without_events_is_not_offered_the_tool() {
    let setup = setup("{enabled: true}").await;
    let body = json!({"contents": gemini_conversation()});
    let path = "/v1beta/models/gemini-2.5-pro:streamGenerateContent";
    let response = post(&setup, path, body.to_string(), &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(outcome(&response), "summarized");
    let rounds = upstream_gemini(&setup.upstream);
    assert_eq!(rounds.len(), 1);
    assert!(!rounds[0].to_string().contains("compactor_expand"));
}

#[tokio::test]
async fn a_request_offered_lookups_teaches_the_count_nothing() {
    // After a lookup its usage is every round's input summed, and its body carries
    // compactor's own tool and index: neither says how the conversation counts.
    let mut learned = Vec::new();
    for retrieval in ["{enabled: false}", "{enabled: true}"] {
        let setup = setup(retrieval).await;
        let response = ask(&setup, &conversation(), false).await;
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(outcome(&response), "summarized");
        let engine = setup.proxy.app.compaction().expect("compaction on");
        tokio::time::timeout(BOUND, engine.calibrations_idle())
            .await
            .expect("calibration within bound");
        let metrics = get(&setup.proxy.url("/metrics")).await.text();
        learned.push(
            metrics
                .lines()
                .filter(|l| l.starts_with("compactor_token_calibration_samples_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>(),
        );
    }
    // The summarizer's answer is a sample either way; the model's only without a lookup.
    assert_eq!(learned[1] + 1.0, learned[0], "{learned:?}");
}
