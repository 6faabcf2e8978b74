//! Gemini's API: its paths carry their version, the model and the method, so they are claimed
//! whole wherever the listen prefix is; `x-goog-api-key` and the `key` parameter are client
//! credentials like the others; errors come in Google's shape. Its conversations are compacted
//! like the other APIs': a call never parted from its responses, every kept model turn (its
//! thought signatures with it) byte for byte, Google's context error retried compacted.

use crate::common::*;
use http::StatusCode;
use mock_upstream::MockHandle;
use serde_json::{json, Value};

const CALL: &str = "/v1beta/models/gemini-2.5-flash:generateContent";
const BODY: &str = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;

/// An OpenAI upstream first (so nothing reaches Gemini by being first), then a Gemini one.
async fn gemini_stack(upstream_key: Option<&str>, extra: &str) -> (Proxy, MockHandle, MockHandle) {
    let openai = echo_mock().await;
    let gemini = echo_mock().await;
    let key = upstream_key.map_or(String::new(), |key| format!("    api_key: {key}\n"));
    let root = gemini.base_url().trim_end_matches("/v1").to_string();
    let yaml = format!(
        "upstreams:\n  - name: openai\n    base_url: {}\n  - name: gemini\n    api: gemini\n    base_url: {root}\n{key}{extra}",
        openai.base_url()
    );
    (proxy(&yaml).await, openai, gemini)
}

#[tokio::test]
async fn a_gemini_call_goes_by_its_whole_path_with_the_upstreams_key_in_googles_header() {
    let (proxy, openai, gemini) = gemini_stack(Some("g-upstream"), "").await;
    let url = proxy.url(&format!("{CALL}?key=client-key&alt=json"));
    let response = roundtrip(
        &client(),
        json_request(&url, BODY, &[("x-goog-api-key", "client-key")]),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    let sent = gemini.last_request().expect("Gemini was called");
    assert_eq!(sent.path_and_query, format!("{CALL}?alt=json"));
    assert_eq!(sent.headers["x-goog-api-key"], "g-upstream");
    assert!(
        !sent.headers.contains_key("authorization"),
        "no Bearer added"
    );
    assert_eq!(sent.body, BODY.as_bytes(), "forwarded byte for byte");
    assert!(openai.requests().is_empty());
}

#[tokio::test]
async fn without_a_key_of_its_own_the_clients_google_key_goes_as_it_came() {
    let (proxy, _openai, gemini) = gemini_stack(None, "").await;
    let url = proxy.url("/v1/models/gemini-2.5-pro:streamGenerateContent?alt=sse");
    let response = roundtrip(
        &client(),
        json_request(&url, BODY, &[("x-goog-api-key", "client-key")]),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    let sent = gemini.last_request().expect("Gemini was called");
    assert_eq!(
        sent.path_and_query,
        "/v1/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    );
    assert_eq!(sent.headers["x-goog-api-key"], "client-key");
    assert!(!sent.headers.contains_key("authorization"));
}

#[tokio::test]
async fn keys_are_checked_against_the_model_in_the_path_and_refused_in_googles_shape() {
    let auth = "auth:\n  keys:\n    - name: team\n      key: sk-team\n      models: [\"gemini-2.5-flash\"]\n";
    let (proxy, _openai, gemini) = gemini_stack(Some("g-upstream"), auth).await;
    // A compactor key presented where a Gemini client puts its key, on a model it may use: the
    // body names no model (Gemini's never do) and is not needed to decide.
    let allowed = roundtrip(
        &client(),
        json_request(&proxy.url(CALL), BODY, &[("x-goog-api-key", "sk-team")]),
    )
    .await;
    assert_eq!(allowed.status, StatusCode::OK, "{}", allowed.text());
    assert_eq!(
        gemini.last_request().unwrap().headers["x-goog-api-key"],
        "g-upstream",
        "a compactor key never leaves compactor"
    );
    // Or in the `key` parameter, with no header: accepted, and the parameter never leaves.
    let in_query = proxy.url(&format!("{CALL}?key=sk-team&alt=json"));
    let allowed = roundtrip(&client(), json_request(&in_query, BODY, &[])).await;
    assert_eq!(allowed.status, StatusCode::OK, "{}", allowed.text());
    let sent = gemini.last_request().unwrap();
    assert_eq!(sent.path_and_query, format!("{CALL}?alt=json"));
    assert_eq!(sent.headers["x-goog-api-key"], "g-upstream");
    let other_model = proxy.url("/v1beta/models/gemini-2.5-pro:generateContent");
    for (headers, status, google_status) in [
        (
            vec![("x-goog-api-key", "sk-team")],
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
        ),
        (
            vec![("x-goog-api-key", "sk-unknown")],
            StatusCode::UNAUTHORIZED,
            "UNAUTHENTICATED",
        ),
    ] {
        let response = roundtrip(&client(), json_request(&other_model, BODY, &headers)).await;
        assert_eq!(response.status, status, "{}", response.text());
        let error = response.json();
        assert_eq!(error["error"]["code"], status.as_u16(), "{error}");
        assert_eq!(error["error"]["status"], google_status, "{error}");
        assert!(error["error"]["message"].as_str().is_some(), "{error}");
        assert!(response.headers.contains_key("x-compactor-error"));
    }
    assert_eq!(
        gemini.requests().len(),
        2,
        "refused calls never went upstream"
    );
}

#[tokio::test]
async fn gemini_calls_are_counted_as_model_calls_with_googles_usage() {
    let (proxy, _openai, _gemini) = gemini_stack(Some("g-upstream"), "").await;
    for path in [
        CALL,
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
    ] {
        let response = roundtrip(&client(), json_request(&proxy.url(path), BODY, &[])).await;
        assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    }
    let metrics = get(&proxy.url("/metrics")).await.text();
    assert!(
        metrics.contains(
            r#"compactor_requests_total{route="gemini",status="200",upstream="gemini"} 2"#
        ),
        "{metrics}"
    );
    // The mock reports 10 prompt tokens on each call (`usageMetadata.promptTokenCount`: a
    // quarter of the turns' JSON).
    let input_sum = metric_value(
        &metrics,
        "gen_ai_client_token_usage_sum",
        &[
            r#"gen_ai_provider_name="gemini""#,
            r#"gen_ai_token_type="input""#,
        ],
    );
    assert_eq!(input_sum, Some(20.0), "{metrics}");
}

#[tokio::test]
async fn without_a_gemini_upstream_its_paths_stay_outside_the_prefix() {
    let openai = echo_mock().await;
    let proxy = proxy(&config_for(&openai, "")).await;
    let response = roundtrip(&client(), json_request(&proxy.url(CALL), BODY, &[])).await;
    assert_eq!(
        response.status,
        StatusCode::NOT_FOUND,
        "{}",
        response.text()
    );
    assert!(
        openai.requests().is_empty(),
        "no upstream is sent a path it does not serve"
    );
}

#[tokio::test]
async fn listing_gemini_models_goes_to_the_gemini_upstream_and_openais_list_stays_openais() {
    let (proxy, openai, gemini) = gemini_stack(Some("g-upstream"), "").await;
    for (path, upstream) in [("/v1beta/models", &gemini), ("/v1/models", &openai)] {
        let response = get(&proxy.url(path)).await;
        assert_eq!(
            response.status,
            StatusCode::OK,
            "{path}: {}",
            response.text()
        );
        assert_eq!(upstream.last_request().unwrap().path_and_query, path);
    }
    assert_eq!(gemini.requests().len(), 1);
    assert_eq!(openai.requests().len(), 1);
}

/// An agent's turns on Gemini: the task, then `steps` model turns each calling `read_file`
/// (twice every third step, the first call signed as Google signs it) and answered by a user
/// turn of as many responses, each output about `output_chars` long.
fn agent_turns(steps: usize, output_chars: usize) -> Vec<Value> {
    let mut contents =
        vec![json!({"role": "user", "parts": [{"text": "Find the bug in the parser."}]})];
    for step in 0..steps {
        let calls = if step % 3 == 2 { 2 } else { 1 };
        let parts: Vec<Value> = (0..calls)
            .map(|k| {
                let mut part = json!({"functionCall": {"name": "read_file", "args": {"path": format!("src/f{step}_{k}.rs")}}});
                if k == 0 {
                    part["thoughtSignature"] = json!(format!("c2lnbmF0dXJl-{step}"));
                }
                part
            })
            .collect();
        contents.push(json!({"role": "model", "parts": parts}));
        let responses: Vec<Value> = (0..calls)
            .map(|k| json!({"functionResponse": {"name": "read_file", "response": {"output": format!("// f{step}_{k}\n{}", "fn parse() {}\n".repeat(output_chars / 14))}}}))
            .collect();
        contents.push(json!({"role": "user", "parts": responses}));
    }
    contents
}

fn gemini_body(contents: &[Value]) -> String {
    json!({
        "contents": contents,
        "systemInstruction": {"role": "user", "parts": [{"text": "You are a coding agent."}]},
        "tools": [{"functionDeclarations": [{"name": "read_file", "parameters": {"type": "OBJECT"}}]}],
        "generationConfig": {"maxOutputTokens": 512},
    })
    .to_string()
}

const AGENT_SUMMARIZATION: &str = "  trigger: [{type: tokens, value: 3000}]\n  keep: {type: messages, value: 6}\n  max_calls_per_minute_per_tenant: 1000\n";

#[tokio::test]
async fn a_gemini_agent_run_is_summarized_every_kept_model_turn_byte_for_byte_then_reused() {
    let stack = stack_with(AGENT_SUMMARIZATION, Default::default()).await;
    let contents = agent_turns(12, 1_200);
    let body = gemini_body(&contents);
    let response = roundtrip(
        &client(),
        json_request(&stack.proxy.url(CALL), body.clone(), &[]),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(outcome(&response), "summarized");
    let sent = stack.upstream.last_request().expect("forwarded");
    let sent_text = String::from_utf8(sent.body.to_vec()).expect("UTF-8");
    let forwarded: Value = serde_json::from_str(&sent_text).expect("JSON");
    let turns = forwarded["contents"].as_array().expect("contents");
    assert!(turns.len() < contents.len(), "turns were summarized away");
    // The summary is a user turn of text; the instruction and tools go as they came.
    let summary = turns[0]["parts"][0]["text"].as_str().unwrap_or_default();
    assert!(summary.contains("summary"), "{}", turns[0]);
    assert_eq!(
        forwarded["systemInstruction"],
        json!({"role": "user", "parts": [{"text": "You are a coding agent."}]})
    );
    // Every model turn kept is the client's, byte for byte, signature and all.
    let mut kept_model_turns = 0;
    for turn in turns.iter().filter(|turn| turn["role"] == "model") {
        let raw = turn.to_string();
        assert!(body.contains(&raw), "a model turn was changed: {raw}");
        kept_model_turns += 1;
    }
    assert!(kept_model_turns >= 1, "{sent_text}");
    // Google's signatures are not the conversation's words: never indexed for the model.
    assert!(!summary.contains("c2lnbmF0dXJl"), "{summary}");
    let last = contents.last().unwrap().to_string();
    assert!(sent_text.contains(&last), "the last turn went as it came");
    assert_eq!(stack.upstream.rejections(), 0, "Google's rules held");

    // The next step reuses the summary: the compacted prefix is the same bytes.
    let mut next = contents.clone();
    next.extend(agent_turns(13, 1_200).split_off(25));
    let again = roundtrip(
        &client(),
        json_request(&stack.proxy.url(CALL), gemini_body(&next), &[]),
    )
    .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text());
    assert_eq!(outcome(&again), "reused");
    let resent: Value =
        serde_json::from_slice(&stack.upstream.last_request().unwrap().body).unwrap();
    assert_eq!(
        resent["contents"][0], turns[0],
        "the summary turn is the same"
    );
    assert_eq!(stack.summarizer.chat_calls(), 1);
    assert_eq!(stack.upstream.rejections(), 0);
}

#[tokio::test]
async fn a_compacted_gemini_stream_comes_back_untouched_in_either_form() {
    let stack = stack_with(AGENT_SUMMARIZATION, Default::default()).await;
    let body = gemini_body(&agent_turns(12, 1_200));
    for (query, content_type) in [("?alt=sse", "text/event-stream"), ("", "application/json")] {
        let path = format!("/v1beta/models/gemini-2.5-pro:streamGenerateContent{query}");
        let response = roundtrip(
            &client(),
            json_request(&stack.proxy.url(&path), body.clone(), &[]),
        )
        .await;
        assert_eq!(response.status, StatusCode::OK, "{}", response.text());
        assert!(["summarized", "reused"].contains(&outcome(&response).as_str()));
        assert_eq!(response.headers["content-type"], content_type);
        // No notice in the body: neither Google SDK skips a line it does not know.
        let text = response.text();
        assert!(!text.contains("context_compacting"), "{text}");
        if query.is_empty() {
            let array: Value = serde_json::from_str(&text).expect("one JSON array");
            assert!(array.is_array());
        } else {
            assert!(text.starts_with("data: {"), "{text}");
        }
    }
}

#[tokio::test]
async fn googles_context_error_is_retried_compacted_and_its_limit_learned() {
    let stack = stack_with("  keep: {type: messages, value: 6}\n", Default::default()).await;
    // Under every trigger by compactor's count, over the window the upstream enforces.
    let body = gemini_body(&agent_turns(10, 1_200));
    let headers = [("x-mock-window", "2500")];
    let response = roundtrip(
        &client(),
        json_request(&stack.proxy.url(CALL), body, &headers),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(outcome(&response), "summarized");
    assert_eq!(stack.upstream.window_refusals(), 1);
    let metrics = get(&stack.proxy.url("/metrics")).await.text();
    let retried = r#"compactor_reactive_retries_total{result="ok"} 1"#;
    assert!(metrics.lines().any(|line| line == retried), "{metrics}");
}

#[tokio::test]
async fn a_request_on_cached_content_is_left_alone() {
    let stack = stack_with(AGENT_SUMMARIZATION, Default::default()).await;
    let mut body: Value = serde_json::from_str(&gemini_body(&agent_turns(12, 1_200))).unwrap();
    body["cachedContent"] = json!("cachedContents/abc123");
    let body = body.to_string();
    let response = roundtrip(
        &client(),
        json_request(&stack.proxy.url(CALL), body.clone(), &[]),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(outcome(&response), "skipped");
    assert_eq!(stack.upstream.last_request().unwrap().body, body.as_bytes());
}

#[tokio::test]
async fn googles_usage_calibrates_the_count_of_a_model_named_by_the_path() {
    let stack = stack_with(AGENT_SUMMARIZATION, Default::default()).await;
    let mut last = None;
    for steps in [2, 4, 6, 8, 10, 12] {
        let body = gemini_body(&agent_turns(steps, 1_200));
        let response = roundtrip(&client(), json_request(&stack.proxy.url(CALL), body, &[])).await;
        assert_eq!(response.status, StatusCode::OK, "{}", response.text());
        // The sample this response gave is learned before the next request is counted.
        if let Some(engine) = stack.proxy.app.compaction() {
            tokio::time::timeout(BOUND, engine.calibrations_idle())
                .await
                .expect("calibration within bound");
        }
        last = Some(response);
    }
    let last = last.expect("a response");
    assert_eq!(outcome(&last), "summarized");
    assert_eq!(last.headers["x-compactor-tokens-count"], "calibrated");
}
