//! Black-box tests of the real `compactor` binary: `check`, and SIGTERM during a stream.

use std::process::Stdio;

use crate::common::*;
use mock_upstream::MockOptions;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// Runs `compactor check` on a config text, with extra environment variables.
async fn check(config: &str, env: &[(&str, &str)]) -> std::process::Output {
    let file = write_config(config);
    Command::new(BIN)
        .args(["check", "--config"])
        .arg(file.path())
        .envs(env.iter().copied())
        .output()
        .await
        .expect("compactor check runs")
}

#[tokio::test]
async fn check_accepts_a_good_config_and_redacts_secrets() {
    let output = check(
        "upstreams:\n  - name: openai\n    base_url: https://api.openai.com/v1\n    api_key: ${TEST_KEY}\n",
        &[("TEST_KEY", "sk-secret-value")],
    )
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains("base_url: https://api.openai.com/v1"),
        "{stdout}"
    );
    assert!(!stdout.contains("sk-secret-value"), "{stdout}");
}

#[tokio::test]
async fn check_rejects_a_bad_config_with_exit_2_naming_the_key() {
    let output = check(
        "upstreams:\n  - name: openai\n    base_url: https://api.openai.com/v1\nsummarization:\n  trigger: [{type: fraction, value: 0}]\n",
        &[],
    )
    .await;
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("summarization.trigger[0]"), "{stderr}");

    let output = check(
        "upstreams:
  - name: a
    base_url: http://x/v1
    api_kye: k
",
        &[],
    )
    .await;
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("api_kye") && stderr.contains("line 4"),
        "{stderr}"
    );
}

#[tokio::test]
async fn sigterm_during_a_stream_lets_it_finish_then_exits_zero() {
    let mock = mock(MockOptions::default()).await;
    let file = write_config(&format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - name: mock\n    base_url: {}\n",
        mock.base_url()
    ));
    let (mut child, addr, mut lines) = start(file.path()).await;

    let client = client();
    let headers = [("x-mock-chunks", "4"), ("x-mock-gate", "term")];
    let url = format!("http://{addr}/v1/chat/completions");
    let response = send(&client, json_request(&url, chat_body("go", true), &headers)).await;
    let mut body = response.into_body();
    assert!(next_data(&mut body).await.is_some());

    let pid = child.id().expect("pid").to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill runs");
    assert!(killed.success());
    // Wait until compactor says it is draining, so the stream really finishes during shutdown.
    wait_for_line(&mut lines, "shutting down").await;
    mock.open_gate("term");
    let mut rest = Vec::new();
    while let Some(data) = next_data(&mut body).await {
        rest.extend_from_slice(&data);
    }
    assert!(String::from_utf8_lossy(&rest).ends_with("data: [DONE]\n\n"));
    drop(body);
    drop(client);
    let status = tokio::time::timeout(BOUND, child.wait())
        .await
        .expect("exits in time")
        .expect("wait");
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn check_warns_loudly_about_a_public_port_spending_a_key_without_auth() {
    let open = "listen: 0.0.0.0:8080\nupstreams:\n  - name: openai\n    base_url: https://api.openai.com/v1\n    api_key: sk-operator\n";
    let output = check(open, &[]).await;
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("WARNING") && stderr.contains("auth"),
        "{stderr}"
    );
    let guarded = format!("{open}auth:\n  keys:\n    - name: team\n      key: sk-team\n");
    let output = check(&guarded, &[]).await;
    assert!(!String::from_utf8_lossy(&output.stderr).contains("WARNING"));
    assert!(!String::from_utf8_lossy(&output.stdout).contains("sk-team"));
}

/// Starts the binary under a shell that lowers the soft open-files limit first; returns the
/// child and its address, or None when the hard limit is too low to show anything.
async fn start_with_soft_fd_limit(
    config: &tempfile::NamedTempFile,
    soft: u32,
) -> Option<(tokio::process::Child, String)> {
    let script = format!(
        "[ \"$(ulimit -Hn)\" = unlimited ] || [ \"$(ulimit -Hn)\" -ge 4096 ] || exit 77; ulimit -Sn {soft} && exec \"$0\" --config \"$1\""
    );
    let mut child = Command::new("sh")
        .args(["-c", &script, BIN])
        .arg(config.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("sh starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(BOUND, stdout.next_line())
        .await
        .expect("announces in time")
        .expect("reads stdout")?;
    let addr = line.rsplit("http://").next()?.to_string();
    Some((child, addr))
}

#[tokio::test]
async fn the_soft_fd_limit_is_raised_so_idle_sockets_cannot_lock_clients_out() {
    let mock = echo_mock().await;
    let file = write_config(&format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - name: mock\n    base_url: {}\n",
        mock.base_url()
    ));
    let Some((_child, addr)) = start_with_soft_fd_limit(&file, 64).await else {
        eprintln!("skipped: the hard open-files limit is below 4096 here");
        return;
    };
    // More idle sockets than the soft limit the process was started with.
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connects"),
        );
    }
    let url = format!("http://{addr}/v1/chat/completions");
    let response = roundtrip(&client(), json_request(&url, chat_body("hi", false), &[])).await;
    assert_eq!(response.status, http::StatusCode::OK);
}

async fn sighup(child: &tokio::process::Child) {
    let pid = child.id().expect("pid").to_string();
    let sent = Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .await
        .expect("kill runs");
    assert!(sent.success());
}

#[tokio::test]
async fn a_sighup_right_after_the_announcement_reloads_in_both_runtime_modes() {
    let upstream = echo_mock().await;
    for mode in ["per_core", "shared"] {
        let config = |key: &str| {
            format!(
                "listen: 127.0.0.1:0\nruntime:\n  mode: {mode}\nupstreams:\n  - name: mock\n    base_url: {}\n    api_key: {key}\n",
                upstream.base_url()
            )
        };
        let file = write_config(&config("key-one"));
        let (mut child, addr, mut lines) = start(file.path()).await;
        std::fs::write(file.path(), config("key-two")).unwrap();
        // No request first: the signal lands as early as a script that waits for the
        // announcement can send it.
        sighup(&child).await;
        wait_for_line(&mut lines, "configuration reloaded").await;
        let url = format!("http://{addr}/v1/chat/completions");
        let response = roundtrip(&client(), json_request(&url, chat_body("hi", false), &[])).await;
        assert_eq!(response.status, 200, "{mode}");
        assert_eq!(
            upstream.last_request().unwrap().headers["authorization"],
            "Bearer key-two",
            "{mode}"
        );
        let _ = child.kill().await;
    }
}

fn reloadable_config(upstream: &str, summarizer: &str, key: &str, trigger: u64) -> String {
    format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - name: mock\n    base_url: {upstream}\n    api_key: {key}\n  - name: summarizer\n    base_url: {summarizer}\n    models: [\"summarizer-*\"]\nsummarization:\n  enabled: true\n  upstream: summarizer\n  model_name: summarizer-model\n  summary_max_tokens: 32\n  trigger: [{{type: tokens, value: {trigger}}}]\n  keep: {{type: messages, value: 2}}\n"
    )
}

fn long_chat() -> String {
    let mut messages = Vec::new();
    for t in 0..6 {
        messages.push(serde_json::json!({"role": "user", "content": format!("question {t} ") + &"words ".repeat(40)}));
        messages.push(serde_json::json!({"role": "assistant", "content": format!("answer {t} ") + &"reply ".repeat(40)}));
    }
    messages.push(serde_json::json!({"role": "user", "content": "go on"}));
    serde_json::json!({"model": "gpt-4o-mini", "messages": messages}).to_string()
}

#[tokio::test]
async fn sighup_reloads_keys_and_triggers_without_dropping_a_stream_and_refuses_a_broken_file() {
    let upstream = mock(MockOptions::default()).await;
    let summarizer = mock(MockOptions {
        mode: mock_upstream::MockMode::Summarizer,
        ..MockOptions::default()
    })
    .await;
    let (up, sum) = (upstream.base_url(), summarizer.base_url());
    let file = write_config(&reloadable_config(&up, &sum, "key-one", 1_000_000));
    let (mut child, addr, mut lines) = start(file.path()).await;
    let url = format!("http://{addr}/v1/chat/completions");
    let client = client();

    // A stream in flight across the reload.
    let headers = [("x-mock-chunks", "4"), ("x-mock-gate", "reload")];
    let response = send(&client, json_request(&url, chat_body("go", true), &headers)).await;
    let mut stream = response.into_body();
    assert!(next_data(&mut stream).await.is_some());
    assert_eq!(
        upstream.last_request().unwrap().headers["authorization"],
        "Bearer key-one"
    );

    std::fs::write(file.path(), reloadable_config(&up, &sum, "key-two", 200)).unwrap();
    sighup(&child).await;
    wait_for_line(&mut lines, "configuration reloaded").await;
    upstream.open_gate("reload");
    let mut rest = Vec::new();
    while let Some(data) = next_data(&mut stream).await {
        rest.extend_from_slice(&data);
    }
    assert!(
        String::from_utf8_lossy(&rest).ends_with("data: [DONE]\n\n"),
        "the stream finished"
    );

    // The next request has the new key and the new trigger.
    let compacted = roundtrip(&client, json_request(&url, long_chat(), &[])).await;
    assert_eq!(compacted.status, 200);
    assert_eq!(compacted.headers["x-compactor-compaction"], "summarized");
    assert_eq!(
        upstream.last_request().unwrap().headers["authorization"],
        "Bearer key-two"
    );

    // A broken file is refused, naming the key, and the running config stays.
    std::fs::write(
        file.path(),
        reloadable_config(&up, &sum, "key-three", 200).replace("keep:", "kepe:"),
    )
    .unwrap();
    sighup(&child).await;
    let refused = wait_for_line(&mut lines, "reload refused").await;
    assert!(refused.contains("kepe"), "{refused}");
    let still = roundtrip(&client, json_request(&url, long_chat(), &[])).await;
    assert_eq!(still.status, 200);
    assert_eq!(still.headers["x-compactor-compaction"], "reused");
    assert_eq!(
        upstream.last_request().unwrap().headers["authorization"],
        "Bearer key-two"
    );

    // `listen` changes only with a restart, and the log says so.
    let moved = reloadable_config(&up, &sum, "key-two", 200).replace("127.0.0.1:0", "127.0.0.1:1");
    std::fs::write(file.path(), moved).unwrap();
    sighup(&child).await;
    let warning = wait_for_line(&mut lines, "only after a restart").await;
    assert!(warning.contains("listen"), "{warning}");
    let _ = child.kill().await;
}

#[tokio::test]
async fn a_watched_file_is_reloaded_when_its_content_changes() {
    let upstream = echo_mock().await;
    let config = |key: &str| {
        format!(
            "listen: 127.0.0.1:0\nreload:\n  watch: true\n  interval_secs: 0.1\nupstreams:\n  - name: mock\n    base_url: {}\n    api_key: {key}\n",
            upstream.base_url()
        )
    };
    let file = write_config(&config("key-one"));
    let (mut child, addr, mut lines) = start(file.path()).await;
    std::fs::write(file.path(), config("key-two")).unwrap();
    wait_for_line(&mut lines, "configuration reloaded").await;
    let url = format!("http://{addr}/v1/chat/completions");
    let response = roundtrip(&client(), json_request(&url, chat_body("hi", false), &[])).await;
    assert_eq!(response.status, 200);
    assert_eq!(
        upstream.last_request().unwrap().headers["authorization"],
        "Bearer key-two"
    );
    let _ = child.kill().await;
}

#[tokio::test]
async fn the_log_and_the_metrics_carry_no_secret_and_no_message_content() {
    let upstream = echo_mock().await;
    let file = write_config(&format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - name: mock\n    base_url: {}\n    api_key: sk-operator-secret\n",
        upstream.base_url()
    ));
    let (child, addr, lines) = start(file.path()).await;
    let url = format!("http://{addr}/v1/chat/completions");
    let client = client();
    let headers = [("authorization", "Bearer sk-client-secret")];
    for stream in [false, true] {
        let body = chat_body("the secret plan is tangerine-nebula", stream);
        let response = roundtrip(&client, json_request(&url, body, &headers)).await;
        assert_eq!(response.status, 200);
    }
    let metrics = roundtrip(
        &client,
        http::Request::get(format!("http://{addr}/metrics"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await
    .text();
    assert!(metrics.contains("compactor_requests_total"));
    let log = terminate_and_read_log(child, lines).await.join("\n");
    assert!(log.contains("request"), "the access log was written: {log}");
    for text in [&log, &metrics] {
        for secret in ["sk-operator-secret", "sk-client-secret", "tangerine-nebula"] {
            assert!(!text.contains(secret), "{secret} leaked");
        }
    }
}

#[cfg(feature = "otel")]
#[tokio::test]
async fn traces_go_to_the_collector_with_the_summarizer_as_a_child_and_traceparent_upstream() {
    let upstream = echo_mock().await;
    let summarizer = mock(MockOptions {
        mode: mock_upstream::MockMode::Summarizer,
        ..MockOptions::default()
    })
    .await;
    let collector = mock(MockOptions::default()).await;
    let config = reloadable_config(&upstream.base_url(), &summarizer.base_url(), "key", 200)
        + &format!("telemetry:\n  otlp_endpoint: http://{}\n", collector.addr);
    let file = write_config(&config);
    let (mut child, addr, _lines) = start(file.path()).await;
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let parent = format!("00-{trace}-b7ad6b7169203331-01");
    let url = format!("http://{addr}/v1/chat/completions");
    let response = roundtrip(
        &client(),
        json_request(&url, long_chat(), &[("traceparent", &parent)]),
    )
    .await;
    assert_eq!(response.headers["x-compactor-compaction"], "summarized");
    for (mock, what) in [(&upstream, "upstream"), (&summarizer, "summarizer")] {
        let sent = mock.last_request().unwrap().headers["traceparent"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(sent.starts_with(&format!("00-{trace}-")), "{what}: {sent}");
        assert!(
            !sent.contains("b7ad6b7169203331"),
            "{what}: a span of compactor's"
        );
    }

    // Queued spans are flushed at exit.
    let pid = child.id().expect("pid").to_string();
    Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill");
    tokio::time::timeout(BOUND, child.wait())
        .await
        .expect("exits")
        .expect("wait");
    let exported: Vec<serde_json::Value> = collector
        .requests()
        .into_iter()
        .filter(|r| r.path_and_query == "/v1/traces")
        .map(|r| r.json())
        .collect();
    assert!(!exported.is_empty(), "spans were exported");
    let spans: Vec<serde_json::Value> = exported
        .iter()
        .flat_map(|batch| {
            batch["resourceSpans"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|r| r["scopeSpans"].as_array().cloned().unwrap_or_default())
        .flat_map(|s| s["spans"].as_array().cloned().unwrap_or_default())
        .collect();
    let attribute = |span: &serde_json::Value, key: &str| {
        span["attributes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["key"] == key)
            .map(|a| a["value"].clone())
    };
    let request = spans
        .iter()
        .find(|s| attribute(s, "http.request.method").is_some())
        .expect("the request span");
    assert_eq!(request["traceId"], trace);
    assert_eq!(request["parentSpanId"], "b7ad6b7169203331");
    assert_eq!(
        attribute(request, "compactor.compaction").unwrap()["stringValue"],
        "summarized"
    );
    let summarize = spans
        .iter()
        .find(|s| {
            attribute(s, "gen_ai.request.model")
                .is_some_and(|m| m["stringValue"] == "summarizer-model")
        })
        .expect("the summarizer span");
    assert_eq!(summarize["traceId"], trace);
    assert_eq!(summarize["parentSpanId"], request["spanId"]);
    assert_eq!(summarize["name"], "chat summarizer-model");
    let resource = &exported[0]["resourceSpans"][0]["resource"];
    assert!(resource.to_string().contains("\"compactor\""), "{resource}");
}

#[tokio::test]
async fn the_health_subcommand_answers_for_a_running_proxy_and_fails_without_one() {
    let upstream = echo_mock().await;
    let file = write_config(&format!(
        "listen: 127.0.0.1:0\nupstreams:\n  - name: mock\n    base_url: {}\n",
        upstream.base_url()
    ));
    let (mut child, addr, _lines) = start(file.path()).await;
    let health = |url: String| async move {
        Command::new(BIN)
            .args(["health", "--url", &url])
            .output()
            .await
            .expect("compactor health runs")
    };
    let up = health(format!("http://{addr}/healthz")).await;
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let dead = dead_address().await;
    let down = health(format!("http://{dead}/healthz")).await;
    assert_eq!(down.status.code(), Some(1));
    let _ = child.kill().await;
}

/// SIGTERM, then every line of stderr until it closes (a clean exit flushes the log).
async fn terminate_and_read_log(
    mut child: tokio::process::Child,
    mut lines: tokio::sync::mpsc::UnboundedReceiver<String>,
) -> Vec<String> {
    let pid = child.id().expect("pid").to_string();
    let stopped = Command::new("kill").args(["-TERM", &pid]).status().await;
    assert!(stopped.expect("kill runs").success());
    let mut log = Vec::new();
    let read_all = async {
        while let Some(line) = lines.recv().await {
            log.push(line);
        }
    };
    tokio::time::timeout(BOUND, read_all)
        .await
        .expect("stderr closes once the process exits");
    let _ = child.wait().await;
    log
}

#[tokio::test]
async fn probes_stay_out_of_the_access_log_and_shutdown_is_said_once_for_all_workers() {
    let upstream = echo_mock().await;
    let file = write_config(&format!(
        "listen: 127.0.0.1:0\nruntime:\n  mode: per_core\n  workers: 3\nupstreams:\n  - name: mock\n    base_url: {}\n",
        upstream.base_url()
    ));
    let (child, addr, lines) = start(file.path()).await;
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(get(&format!("http://{addr}{path}")).await.status, 200);
    }
    let url = format!("http://{addr}/v1/chat/completions");
    let response = roundtrip(&client(), json_request(&url, chat_body("hi", false), &[])).await;
    assert_eq!(response.status, 200);
    // Forwarded like any path compactor does not read (the echo mock answers it).
    get(&format!("http://{addr}/v1/nothing-here")).await;
    let log = terminate_and_read_log(child, lines).await;
    let access: Vec<&String> = log.iter().filter(|l| l.contains("request")).collect();
    assert!(
        access.iter().any(|l| l.contains("/v1/chat/completions")),
        "a model call is logged: {log:?}"
    );
    assert!(
        access.iter().any(|l| l.contains("/v1/nothing-here")),
        "a forwarded path is logged: {log:?}"
    );
    for probe in ["/healthz", "/readyz", "/metrics"] {
        assert!(
            !access.iter().any(|l| l.contains(probe)),
            "{probe} answered well is not logged at info: {log:?}"
        );
    }
    let said = log.iter().filter(|l| l.contains("shutting down")).count();
    assert_eq!(said, 1, "said once, not once per worker: {log:?}");
}
