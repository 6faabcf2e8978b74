//! The transparent gateway: what a client and an upstream observe through compactor.

use crate::common::*;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use mock_upstream::{MockHandle, MockOptions};

async fn gateway() -> (MockHandle, Proxy) {
    let mock = echo_mock().await;
    let proxy = proxy(&config_for(&mock, "")).await;
    (mock, proxy)
}

#[tokio::test]
async fn non_stream_round_trip_is_byte_exact_both_ways() {
    let (mock, proxy) = gateway().await;
    let client = client();
    // Odd spacing and key order: a re-serialising proxy would change these bytes.
    let body = "{ \"messages\":[{\"content\":\"h\\u00e9llo\",  \"role\":\"user\"}],\n \"model\":\"gpt-4o-mini\", \"zeta\": 1.50 }";
    let headers = [("x-mock-id", "fixed")];
    let through = roundtrip(
        &client,
        json_request(&proxy.url("/v1/chat/completions"), body, &headers),
    )
    .await;
    assert_eq!(
        mock.last_request().expect("upstream saw it").body,
        Bytes::from(body)
    );
    let direct = roundtrip(
        &client,
        json_request(
            &format!("{}/chat/completions", mock.base_url()),
            body,
            &headers,
        ),
    )
    .await;
    assert_eq!(through.status, StatusCode::OK);
    assert_eq!(through.body, direct.body);
    assert_eq!(through.headers["content-type"], "application/json");
}

#[tokio::test]
async fn sse_stream_is_byte_identical_and_flows_before_upstream_finishes() {
    let (mock, proxy) = gateway().await;
    let client = client();
    let body = chat_body("stream please", true);
    let headers = [
        ("x-mock-id", "s1"),
        ("x-mock-chunks", "5"),
        ("x-mock-gate", "g1"),
    ];
    let response = send(
        &client,
        json_request(&proxy.url("/v1/chat/completions"), body.clone(), &headers),
    )
    .await;
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut incoming = response.into_body();
    let first = next_data(&mut incoming).await.expect("first event");
    // The upstream is still holding the rest back behind the gate: the first event reached us
    // through compactor on its own.
    assert!(first.starts_with(b"data: {"), "{first:?}");
    assert!(first.ends_with(b"\n\n"));
    mock.open_gate("g1");
    let mut received = first.to_vec();
    while let Some(data) = next_data(&mut incoming).await {
        received.extend_from_slice(&data);
    }
    let direct_headers = [("x-mock-id", "s1"), ("x-mock-chunks", "5")];
    let direct = roundtrip(
        &client,
        json_request(
            &format!("{}/chat/completions", mock.base_url()),
            body,
            &direct_headers,
        ),
    )
    .await;
    assert_eq!(Bytes::from(received), direct.body);
    assert!(direct.text().ends_with("data: [DONE]\n\n"));
}

#[tokio::test]
async fn http2_prior_knowledge_clients_are_served() {
    let (_mock, proxy) = gateway().await;
    let response = roundtrip(
        &http2_client(),
        json_request(
            &proxy.url("/v1/chat/completions"),
            chat_body("hi", false),
            &[],
        ),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.json()["object"], "chat.completion");
}

#[tokio::test]
async fn twenty_megabyte_body_passes_and_one_over_the_limit_gets_413() {
    let (mock, proxy) = gateway().await;
    let client = client();
    let big = chat_body(&"x".repeat(20 * 1024 * 1024), false);
    let response = roundtrip(
        &client,
        json_request(&proxy.url("/v1/chat/completions"), big.clone(), &[]),
    )
    .await;
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(mock.last_request().expect("seen").body.len(), big.len());

    let small_limit = proxy_with_limit(&mock, 1024 * 1024).await;
    let response = roundtrip(
        &client,
        json_request(&small_limit.url("/v1/chat/completions"), big, &[]),
    )
    .await;
    assert_eq!(response.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(response.json()["error"]["code"], "request_too_large");
    assert_eq!(response.headers["x-compactor-error"], "request_too_large");
}

async fn proxy_with_limit(mock: &MockHandle, limit: u64) -> Proxy {
    proxy(&config_for(
        mock,
        &format!("limits:\n  max_request_body_bytes: {limit}\n"),
    ))
    .await
}

#[tokio::test]
async fn chunked_body_over_the_limit_gets_413_without_content_length() {
    let mock = echo_mock().await;
    // Compaction reads chat bodies; a chunked request has no content-length, so the limit must
    // hold while reading.
    let yaml = config_for(
        &mock,
        "limits:\n  max_request_body_bytes: 1000\nsummarization:\n  enabled: true\n",
    );
    let proxy = proxy(&yaml).await;
    let (mut sender, body) =
        http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(4);
    let request = Request::post(proxy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .expect("request");
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let feeder = tokio::spawn(async move {
        for _ in 0..10 {
            if sender
                .send_data(Bytes::from(vec![b' '; 500]))
                .await
                .is_err()
            {
                break;
            }
        }
    });
    let response = tokio::time::timeout(BOUND, client.request(request))
        .await
        .expect("bounded")
        .expect("response");
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    feeder.abort();
}

#[tokio::test]
async fn unreachable_upstream_is_502_with_proxy_error() {
    let dead = dead_address().await;
    let proxy = proxy(&format!(
        "upstreams:\n  - name: dead\n    base_url: http://{dead}/v1\n"
    ))
    .await;
    let response = roundtrip(
        &client(),
        json_request(
            &proxy.url("/v1/chat/completions"),
            chat_body("hi", false),
            &[],
        ),
    )
    .await;
    assert_eq!(response.status, StatusCode::BAD_GATEWAY);
    assert_eq!(response.json()["error"]["code"], "upstream_unreachable");
    assert_eq!(response.json()["error"]["type"], "upstream_error");
    assert_eq!(
        response.headers["x-compactor-error"],
        "upstream_unreachable"
    );
}

#[tokio::test]
async fn hanging_upstream_is_504() {
    let mock = echo_mock().await;
    let yaml = format!(
        "upstreams:\n  - name: slow\n    base_url: {}\n    first_byte_timeout_secs: 0.3\n",
        mock.base_url()
    );
    let proxy = proxy(&yaml).await;
    let response = roundtrip(
        &client(),
        json_request(
            &proxy.url("/v1/chat/completions"),
            chat_body("hi", false),
            &[("x-mock-fault", "hang")],
        ),
    )
    .await;
    assert_eq!(response.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(response.json()["error"]["code"], "upstream_timeout");
}

#[tokio::test]
async fn upstream_429_passes_through_verbatim() {
    let (mock, proxy) = gateway().await;
    let client = client();
    let headers = [("x-mock-status", "429")];
    let through = roundtrip(
        &client,
        json_request(
            &proxy.url("/v1/chat/completions"),
            chat_body("hi", false),
            &headers,
        ),
    )
    .await;
    let direct = roundtrip(
        &client,
        json_request(
            &format!("{}/chat/completions", mock.base_url()),
            chat_body("hi", false),
            &headers,
        ),
    )
    .await;
    assert_eq!(through.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(through.body, direct.body);
    assert_eq!(through.headers["retry-after"], "7");
    assert!(through.headers.get("x-compactor-error").is_none());
}

#[tokio::test]
async fn hop_by_hop_headers_are_removed_and_the_rest_preserved() {
    let (mock, proxy) = gateway().await;
    let request = Request::post(proxy.url("/v1/chat/completions?api-version=2024-10-21&x=1"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer client-key")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "must go")
        .header("keep-alive", "timeout=5")
        .header("proxy-authorization", "Basic abc")
        .header("x-custom", "kept")
        .header("openai-organization", "org-1")
        .header("x-compactor", "off")
        .body(Full::new(Bytes::from(chat_body("hi", false))))
        .expect("request");
    let response = roundtrip(&client(), request).await;
    assert_eq!(response.status, StatusCode::OK);
    let seen = mock.last_request().expect("seen");
    assert_eq!(
        seen.path_and_query,
        "/v1/chat/completions?api-version=2024-10-21&x=1"
    );
    for gone in ["x-hop", "keep-alive", "proxy-authorization", "x-compactor"] {
        assert!(seen.headers.get(gone).is_none(), "{gone} was forwarded");
    }
    assert_eq!(seen.headers["x-custom"], "kept");
    assert_eq!(seen.headers["openai-organization"], "org-1");
    assert_eq!(seen.headers["authorization"], "Bearer client-key");
    assert_eq!(seen.headers["host"], mock.addr.to_string());
}

#[tokio::test]
async fn upstream_api_key_and_headers_replace_the_clients() {
    let mock = echo_mock().await;
    let yaml = format!(
        "upstreams:\n  - name: keyed\n    base_url: {}\n    api_key: sk-upstream\n    headers: {{x-tenant: acme}}\n",
        mock.base_url()
    );
    let proxy = proxy(&yaml).await;
    let request = json_request(
        &proxy.url("/v1/chat/completions"),
        chat_body("hi", false),
        &[
            ("authorization", "Bearer client-key"),
            ("x-tenant", "client"),
        ],
    );
    assert_eq!(roundtrip(&client(), request).await.status, StatusCode::OK);
    let seen = mock.last_request().expect("seen");
    assert_eq!(seen.headers["authorization"], "Bearer sk-upstream");
    assert_eq!(seen.headers["x-tenant"], "acme");
}

#[tokio::test]
async fn requests_are_routed_by_model_and_model_less_ones_go_first() {
    let claude = echo_mock().await;
    let gpt = echo_mock().await;
    let yaml = format!(
        "upstreams:\n  - name: anthropic\n    base_url: {}\n    models: [\"claude-*\"]\n  - name: openai\n    base_url: {}\n    models: [\"gpt-*\", \"o?-mini\"]\n",
        claude.base_url(),
        gpt.base_url()
    );
    let proxy = proxy(&yaml).await;
    let client = client();
    let url = proxy.url("/v1/chat/completions");
    let body = |model: &str| {
        serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
            .to_string()
    };
    assert_eq!(
        roundtrip(&client, json_request(&url, body("claude-sonnet-4"), &[]))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        roundtrip(&client, json_request(&url, body("gpt-4o"), &[]))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        roundtrip(&client, json_request(&url, body("o3-mini"), &[]))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(claude.requests().len(), 1);
    assert_eq!(gpt.requests().len(), 2);
    let unknown = roundtrip(&client, json_request(&url, body("llama-3"), &[])).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.json()["error"]["code"], "model_not_found");
    let models = roundtrip(
        &client,
        Request::get(proxy.url("/v1/models"))
            .body(Full::new(Bytes::new()))
            .expect("req"),
    )
    .await;
    assert_eq!(models.status, StatusCode::OK);
    assert_eq!(claude.requests().len(), 2);
}

/// A mock upstream in chat mode, compactor in front of it, and a stream opened through both
/// with the given `x-mock-*` headers; the first event has already arrived.
async fn open_stream(
    yaml_extra: &str,
    headers: &[(&str, &str)],
) -> (MockHandle, Proxy, RawClient, hyper::body::Incoming) {
    let mock = mock(MockOptions::default()).await;
    let proxy = proxy(&config_for(&mock, yaml_extra)).await;
    let client = client();
    let request = json_request(
        &proxy.url("/v1/chat/completions"),
        chat_body("go", true),
        headers,
    );
    let mut incoming = send(&client, request).await.into_body();
    assert!(next_data(&mut incoming).await.is_some(), "first event");
    (mock, proxy, client, incoming)
}

#[tokio::test]
async fn client_disconnect_mid_stream_closes_the_upstream_stream() {
    let headers = [("x-mock-chunks", "100000"), ("x-mock-chunk-delay-ms", "1")];
    let (mock, _proxy, client, incoming) = open_stream("", &headers).await;
    drop(incoming);
    drop(client);
    assert!(
        mock.wait_stream_aborted(BOUND).await,
        "upstream stream was not closed"
    );
}

#[tokio::test]
async fn local_routes_and_unknown_paths() {
    let (_mock, proxy) = gateway().await;
    let client = client();
    let get = |path: &str| {
        Request::get(proxy.url(path))
            .body(Full::new(Bytes::new()))
            .expect("req")
    };
    assert_eq!(
        roundtrip(&client, get("/healthz")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        roundtrip(&client, get("/readyz")).await.status,
        StatusCode::OK
    );
    let missing = roundtrip(&client, get("/nowhere")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.json()["error"]["type"], "invalid_request_error");
    assert_eq!(missing.headers["x-compactor-error"], "not_found");
}

#[tokio::test]
async fn a_websocket_upgrade_gets_426_so_the_client_falls_back_to_http_at_once() {
    let mock = mock(MockOptions::default()).await;
    let proxy = proxy(&config_for(&mock, "")).await;
    // Codex's first request, as 0.171 sends it.
    let upgrade = Request::get(proxy.url("/v1/responses"))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "ZVKUZAyjPkCkgYczYac62g==")
        .header("openai-beta", "responses_websockets=2026-02-06")
        .body(Full::new(Bytes::new()))
        .expect("req");
    let refused = roundtrip(&client(), upgrade).await;
    assert_eq!(refused.status, StatusCode::UPGRADE_REQUIRED);
    assert_eq!(refused.json()["error"]["code"], "websocket_not_supported");
    assert_eq!(
        refused.headers["x-compactor-error"],
        "websocket_not_supported"
    );
    assert!(mock.requests().is_empty(), "nothing reached the upstream");
}

#[tokio::test]
async fn with_websocket_relay_the_upgraded_socket_is_joined_to_the_upstreams_byte_for_byte() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mock = mock(MockOptions::default()).await;
    let yaml = config_for(
        &mock,
        "websocket: relay\nlimits:\n  idle_connection_timeout_secs: 0.3\n",
    );
    let proxy = proxy(&yaml).await;
    let mut socket = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    socket
        .write_all(
            b"GET /v1/responses?x=1 HTTP/1.1\r\nhost: compactor\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\
              sec-websocket-version: 13\r\nsec-websocket-key: ZVKUZAyjPkCkgYczYac62g==\r\n\
              authorization: Bearer sk-client\r\nx-mock-upgrade: echo\r\n\r\n",
        )
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(BOUND, socket.read(&mut byte))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read, 1, "the connection closed before the response head");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("sec-websocket-accept: mock-accept"), "{head}");
    let upgrade = mock
        .last_request()
        .expect("the upgrade reached the upstream");
    assert_eq!(upgrade.path_and_query, "/v1/responses?x=1");
    assert_eq!(upgrade.headers["upgrade"], "websocket");
    assert_eq!(
        upgrade.headers["sec-websocket-key"],
        "ZVKUZAyjPkCkgYczYac62g=="
    );
    assert_eq!(upgrade.headers["authorization"], "Bearer sk-client");

    // A WebSocket frame (masked text "hello") goes up and comes back untouched.
    let frame = [
        0x81,
        0x85,
        1,
        2,
        3,
        4,
        b'h' ^ 1,
        b'e' ^ 2,
        b'l' ^ 3,
        b'l' ^ 4,
        b'o' ^ 1,
    ];
    socket.write_all(&frame).await.unwrap();
    let mut echoed = [0u8; 11];
    tokio::time::timeout(BOUND, socket.read_exact(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(echoed, frame);

    // Silent for longer than the idle timeout: the relay closes the socket.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(BOUND, socket.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok() && rest.is_empty(),
        "closed without a byte more"
    );
}

#[tokio::test]
async fn reachability_probes_outside_the_api_are_answered() {
    let mock = mock(MockOptions::default()).await;
    let proxy = proxy(&config_for(&mock, "")).await;
    // Claude Code's probe before its first request.
    for path in ["/api/hello", "/"] {
        let probe = Request::head(proxy.url(path))
            .body(Full::new(Bytes::new()))
            .expect("req");
        assert_eq!(
            roundtrip(&client(), probe).await.status,
            StatusCode::OK,
            "{path}"
        );
    }
    let get = Request::get(proxy.url("/api/hello"))
        .body(Full::new(Bytes::new()))
        .expect("req");
    assert_eq!(
        roundtrip(&client(), get).await.status,
        StatusCode::NOT_FOUND
    );
    assert!(mock.requests().is_empty());
}

#[tokio::test]
async fn graceful_shutdown_lets_an_open_stream_finish() {
    let headers = [("x-mock-chunks", "4"), ("x-mock-gate", "shutdown")];
    let (mock, proxy, _client, mut incoming) = open_stream("", &headers).await;
    let addr = proxy.addr;
    let shutting_down = tokio::spawn(proxy.shutdown());
    // New connections are refused once shutdown began; the open stream still completes.
    let refused = async {
        loop {
            if tokio::net::TcpStream::connect(addr).await.is_err() {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(BOUND, refused)
        .await
        .expect("listener closes");
    mock.open_gate("shutdown");
    let mut rest = Vec::new();
    while let Some(data) = next_data(&mut incoming).await {
        rest.extend_from_slice(&data);
    }
    assert!(String::from_utf8_lossy(&rest).ends_with("data: [DONE]\n\n"));
    assert!(
        shutting_down.await.expect("join"),
        "shutdown did not finish in its grace period"
    );
}

/// Reads a streaming body to its end; Err when it ended abruptly instead of cleanly.
async fn drain(mut body: hyper::body::Incoming) -> Result<Vec<u8>, String> {
    use http_body_util::BodyExt;
    let mut received = Vec::new();
    loop {
        match tokio::time::timeout(BOUND, body.frame())
            .await
            .expect("frame within bound")
        {
            None => return Ok(received),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    received.extend_from_slice(&data);
                }
            }
            Some(Err(e)) => return Err(e.to_string()),
        }
    }
}

#[tokio::test]
async fn an_upstream_reset_mid_stream_is_not_turned_into_a_clean_end() {
    let (_mock, proxy) = gateway().await;
    let headers = [("x-mock-fault", "reset"), ("x-mock-chunks", "5")];
    let request = json_request(
        &proxy.url("/v1/chat/completions"),
        chat_body("go", true),
        &headers,
    );
    // The upstream breaks right after its first event: the client sees the break either while
    // reading the head (nothing was flushed yet) or while reading the body, never a clean end.
    let outcome = match tokio::time::timeout(BOUND, client().request(request))
        .await
        .expect("bounded")
    {
        Err(e) => Err(e.to_string()),
        Ok(response) => drain(response.into_body()).await.map(|_| ()),
    };
    assert!(
        outcome.is_err(),
        "a broken upstream stream must reach the client broken"
    );
}

#[tokio::test]
async fn an_upstream_silent_past_the_idle_timeout_is_cut() {
    let mock = echo_mock().await;
    let yaml = format!(
        "upstreams:\n  - name: stalls\n    base_url: {}\n    idle_timeout_secs: 0.3\n",
        mock.base_url()
    );
    let proxy = proxy(&yaml).await;
    let headers = [("x-mock-fault", "stall"), ("x-mock-chunks", "5")];
    let response = send(
        &client(),
        json_request(
            &proxy.url("/v1/chat/completions"),
            chat_body("go", true),
            &headers,
        ),
    )
    .await;
    let result = drain(response.into_body()).await;
    assert!(
        result.is_err(),
        "the stalled stream was not cut: {result:?}"
    );
}

#[tokio::test]
async fn upstream_connections_are_reused_and_a_closed_one_is_replaced() {
    let (mock, proxy) = gateway().await;
    let client = client();
    let url = proxy.url("/v1/chat/completions");
    for turn in 0..4 {
        let reply = roundtrip(&client, json_request(&url, chat_body("hi", false), &[])).await;
        assert_eq!(reply.status, StatusCode::OK, "turn {turn}");
    }
    assert_eq!(mock.connections(), 1, "one kept-alive upstream connection");
    let seen = mock.last_request().expect("upstream saw it");
    assert_eq!(seen.headers["host"], mock.addr.to_string().as_str());
    assert_eq!(seen.path_and_query, "/v1/chat/completions");

    // The upstream closes the connection after this answer: the next request gets a new one.
    let closing = roundtrip(
        &client,
        json_request(&url, chat_body("bye", false), &[("x-mock-close", "1")]),
    )
    .await;
    assert_eq!(closing.status, StatusCode::OK);
    let after = roundtrip(&client, json_request(&url, chat_body("again", false), &[])).await;
    assert_eq!(after.status, StatusCode::OK);
    assert_eq!(mock.connections(), 2);
}
