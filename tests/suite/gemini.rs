//! Gemini's API forwarded (not yet compacted): its paths carry their version, the model and
//! the method, so they are claimed whole wherever the listen prefix is; `x-goog-api-key` and
//! the `key` parameter are client credentials like the others; errors come in Google's shape.

use crate::common::*;
use http::StatusCode;
use mock_upstream::MockHandle;

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
    // The mock reports 8 prompt tokens on each call (`usageMetadata.promptTokenCount`).
    let input_sum = metrics
        .lines()
        .find(|line| {
            line.starts_with("gen_ai_client_token_usage_sum")
                && line.contains(r#"gen_ai_provider_name="gemini""#)
                && line.contains(r#"gen_ai_token_type="input""#)
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse::<f64>().ok());
    assert_eq!(input_sum, Some(16.0), "{metrics}");
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
