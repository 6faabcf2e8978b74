//! `/metrics`: Prometheus text that a parser reads, every counter and histogram moved by exactly
//! what a scripted run did, the admin listener, and no secret or message content in it.

use std::collections::HashMap;

use crate::common::*;
use mock_upstream::{MockFault, MockOptions};
use prometheus_parse::{Scrape, Value};
use serde_json::{json, Value as Json};

/// Every sample of a scrape by its name and sorted labels; histograms by their count and sum.
fn scrape(text: &str) -> HashMap<String, f64> {
    let lines = text.lines().map(|line| Ok(line.to_string()));
    let parsed = Scrape::parse(lines).expect("Prometheus text");
    let mut samples = HashMap::new();
    for sample in parsed.samples {
        let mut labels: Vec<String> = sample
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        labels.sort();
        let key = |suffix: &str| format!("{}{suffix}{{{}}}", sample.metric, labels.join(","));
        match sample.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => {
                samples.insert(key(""), v);
            }
            Value::Histogram(buckets) => {
                let count = buckets.last().map(|b| b.count).unwrap_or(0.0);
                samples.insert(key(":count"), count);
            }
            Value::Summary(_) => {}
        }
    }
    samples
}

async fn metrics_text(url: &str) -> String {
    let response = roundtrip(
        &client(),
        http::Request::get(url)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .expect("request"),
    )
    .await;
    assert_eq!(response.status, 200);
    assert!(response.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    response.text()
}

fn delta(before: &HashMap<String, f64>, after: &HashMap<String, f64>, key: &str) -> f64 {
    after.get(key).copied().unwrap_or(0.0) - before.get(key).copied().unwrap_or(0.0)
}

fn conversation(tag: &str, turns: usize) -> Vec<Json> {
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": format!("{tag} question {t}: ") + &"words ".repeat(40)}));
        messages.push(json!({"role": "assistant", "content": format!("{tag} answer {t}: ") + &"reply ".repeat(40)}));
    }
    messages.push(json!({"role": "user", "content": format!("{tag} purple-elephant, go on")}));
    messages
}

fn header_u64(response: &Collected, name: &str) -> u64 {
    response.headers[name].to_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn every_metric_moves_by_exactly_what_happened() {
    let stack = stack_with(
        "  trigger: [{type: tokens, value: 400}]\n  keep: {type: messages, value: 2}\n  max_calls_per_minute_per_tenant: 1000\nmodels:\n  - match: \"gpt-4o-mini\"\n",
        MockOptions::default(),
    )
    .await;
    let url = stack.proxy.url("/metrics");
    let before = scrape(&metrics_text(&url).await);
    let secret = [("authorization", "Bearer sk-client-secret-value")];

    let mut responses = Vec::new();
    // Under the trigger by its size: passed through.
    responses.push(send_chat(&stack.proxy, &conversation("small", 0), &secret).await);
    // Over it: summarized, then reused on the next turn.
    let mut long = conversation("long", 6);
    responses.push(send_chat(&stack.proxy, &long, &secret).await);
    long.push(json!({"role": "assistant", "content": "ok"}));
    long.push(json!({"role": "user", "content": "and then?"}));
    responses.push(send_chat(&stack.proxy, &long, &secret).await);
    // The summarizer down: failed, the original forwarded.
    stack.summarizer.set_fault(Some(MockFault::Status(500)));
    responses.push(send_chat(&stack.proxy, &conversation("other", 6), &secret).await);
    let outcomes: Vec<String> = responses.iter().map(outcome).collect();
    assert_eq!(outcomes, ["skipped", "summarized", "reused", "failed"]);
    // Not under the prefix: compactor's own 404.
    let missing = roundtrip(
        &client(),
        json_request(&stack.proxy.url("/nowhere"), "{}", &[]),
    )
    .await;
    assert_eq!(missing.status, 404);

    let text = metrics_text(&url).await;
    assert!(!text.contains("sk-client-secret-value"), "no credential");
    assert!(!text.contains("purple-elephant"), "no message content");
    let after = scrape(&text);
    let d = |key: &str| delta(&before, &after, key);

    assert_eq!(
        d("compactor_requests_total{route=chat_completions,status=200,upstream=mock}"),
        4.0
    );
    assert_eq!(
        d("compactor_requests_total{route=other,status=404,upstream=other}"),
        1.0
    );
    // The first scrape, counted once its own body was sent.
    assert_eq!(
        d("compactor_requests_total{route=local,status=200,upstream=other}"),
        1.0
    );
    assert_eq!(d("compactor_proxy_overhead_seconds:count{}"), 6.0);

    assert_eq!(
        d("compactor_compactions_total{outcome=skipped,reason=under_trigger_by_size}"),
        1.0
    );
    assert_eq!(
        d("compactor_compactions_total{outcome=summarized,reason=fresh}"),
        1.0
    );
    assert_eq!(
        d("compactor_compactions_total{outcome=reused,reason=sticky}"),
        1.0
    );
    assert_eq!(
        d("compactor_compactions_total{outcome=failed,reason=summarizer_http_error}"),
        1.0
    );
    assert_eq!(d("compactor_summary_cache_lookups_total{result=hit}"), 1.0);
    assert_eq!(d("compactor_summary_cache_lookups_total{result=miss}"), 2.0);
    assert_eq!(d("compactor_summarizer_calls_total{result=ok}"), 1.0);
    assert_eq!(d("compactor_summarizer_calls_total{result=error}"), 1.0);
    assert_eq!(d("compactor_summarizer_duration_seconds:count{}"), 2.0);
    assert_eq!(
        d("compactor_summarizer_failures_total{reason=summarizer_http_error}"),
        1.0
    );
    assert_eq!(d("compactor_single_flight_joins_total{}"), 0.0);
    assert_eq!(d("compactor_compaction_tokens_before:count{}"), 2.0);
    let saved: u64 = responses[1..3]
        .iter()
        .map(|r| {
            header_u64(r, "x-compactor-tokens-before") - header_u64(r, "x-compactor-tokens-after")
        })
        .sum();
    assert_eq!(d("compactor_tokens_saved_total{}"), saved as f64);
    assert_eq!(after["compactor_summary_cache_entries{}"], 1.0);
    assert_eq!(after["compactor_bodies_in_flight{}"], 0.0);
    assert_eq!(after["compactor_buffered_bytes{}"], 0.0);

    // The GenAI conventions: the upstream's own usage, one observation per call and kind.
    let genai =
        "gen_ai_operation_name=chat,gen_ai_provider_name=mock,gen_ai_request_model=gpt-4o-mini";
    assert_eq!(
        d(&format!(
            "gen_ai_server_request_duration_seconds:count{{{genai}}}"
        )),
        4.0
    );
    assert_eq!(
        d(&format!(
            "gen_ai_server_time_to_first_token_seconds:count{{{genai}}}"
        )),
        4.0
    );
    for kind in ["input", "output"] {
        let key = format!("gen_ai_client_token_usage:count{{{genai},gen_ai_token_type={kind}}}");
        assert_eq!(d(&key), 4.0, "{kind}");
    }
    let reported: f64 = responses
        .iter()
        .map(|r| r.json()["usage"]["prompt_tokens"].as_f64().unwrap())
        .sum();
    let text_sum = metric_value(
        &text,
        "gen_ai_client_token_usage_sum",
        &["gen_ai_token_type=\"input\""],
    )
    .unwrap();
    assert_eq!(
        text_sum, reported,
        "the sum of the upstream's prompt_tokens"
    );
}

#[tokio::test]
async fn metrics_move_to_the_admin_listener_and_can_be_switched_off() {
    let upstream = echo_mock().await;
    let admin = dead_address().await;
    let yaml = format!(
        "upstreams:\n  - name: mock\n    base_url: {}\nadmin:\n  listen: {admin}\n",
        upstream.base_url()
    );
    let api = proxy(&yaml).await;
    let app = api.app.clone();
    let listener = tokio::net::TcpListener::bind(admin)
        .await
        .expect("admin binds");
    tokio::spawn(compactor::operate::serve_admin(
        listener,
        app,
        std::future::pending(),
    ));
    // Not on the API port any more, but on the admin one; health stays on both.
    let on_api = roundtrip(
        &client(),
        http::Request::get(api.url("/metrics"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(on_api.status, 404);
    let text = metrics_text(&format!("http://{admin}/metrics")).await;
    assert!(scrape(&text).contains_key("compactor_tokens_saved_total{}"));
    for path in ["/healthz", "/readyz"] {
        for base in [api.url(""), format!("http://{admin}")] {
            let response = roundtrip(
                &client(),
                http::Request::get(format!("{base}{path}"))
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap(),
            )
            .await;
            assert_eq!(response.status, 200, "{base}{path}");
        }
    }

    let off = proxy(&format!(
        "upstreams:\n  - name: mock\n    base_url: {}\ntelemetry:\n  metrics: false\n",
        upstream.base_url()
    ))
    .await;
    let response = roundtrip(
        &client(),
        http::Request::get(off.url("/metrics"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(response.status, 404);
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_exported() {
    let stack = stack_with(
        "  trigger: [{type: tokens, value: 400}]\n  keep: {type: messages, value: 2}\n",
        MockOptions::default(),
    )
    .await;
    send_chat(&stack.proxy, &conversation("d", 6), &[]).await;
    let text = metrics_text(&stack.proxy.url("/metrics")).await;
    let dashboard: Json = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/grafana-dashboard.json"
        ))
        .expect("the dashboard"),
    )
    .expect("JSON");
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        let expr = panel["targets"][0]["expr"].as_str().expect("a query");
        let names = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("compactor_") || word.starts_with("gen_ai_"))
            .filter(|word| {
                !word.starts_with("gen_ai_token_type") && !word.starts_with("gen_ai_request_model")
            });
        for name in names {
            // A family is declared (`# TYPE`) before its first sample exists.
            let family = ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            assert!(
                text.contains(&format!("# TYPE {family} ")),
                "the dashboard queries {name}, which /metrics does not declare"
            );
            checked += 1;
        }
    }
    assert!(checked >= 16, "{checked}");
}
