//! The third red-team round (issue 39), each hole reproduced at a small scale over loopback: the
//! attack gets a bounded answer and a well-behaved client is still served.

use crate::common::*;
use http::StatusCode;
use mock_upstream::MockOptions;
use std::net::IpAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const UPGRADE: &[u8] = b"GET /v1/responses HTTP/1.1\r\nhost: compactor\r\nconnection: Upgrade\r\n\
upgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: ZVKUZAyjPkCkgYczYac62g==\r\n\
x-mock-upgrade: echo\r\n";

/// An upgrade request from `from`, with `extra` header lines, and the head of its answer.
async fn upgrade(proxy: &Proxy, from: IpAddr, extra: &str) -> (TcpStream, String) {
    let mut socket = connect_from(proxy, from).await;
    let mut request = UPGRADE.to_vec();
    request.extend_from_slice(extra.as_bytes());
    request.extend_from_slice(b"\r\n");
    socket.write_all(&request).await.expect("writes");
    let head = read_head(&mut socket).await;
    (socket, head)
}

#[tokio::test]
async fn a_key_with_a_model_list_gets_no_relay_and_falls_back_to_http() {
    let mock = mock(MockOptions::default()).await;
    let yaml = format!(
        "websocket: relay\nupstreams:\n  - name: mock\n    base_url: {}\n    api_key: sk-operator\nauth:\n  keys:\n    - name: cheap\n      key: sk-cheap\n      models: [\"cheap-*\"]\n    - name: full\n      key: sk-full\n",
        mock.base_url()
    );
    let proxy = proxy(&yaml).await;
    let local: IpAddr = [127, 0, 0, 1].into();
    let (_refused, head) = upgrade(&proxy, local, "authorization: Bearer sk-cheap\r\n").await;
    assert!(head.starts_with("http/1.1 426"), "{head}");
    assert!(head.contains("x-compactor-error: websocket_not_supported"));
    assert!(
        mock.requests().is_empty(),
        "no upgrade reached the upstream under the operator's key"
    );
    // A key that may use every model is relayed.
    let (_relayed, head) = upgrade(&proxy, local, "authorization: Bearer sk-full\r\n").await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
}

#[tokio::test]
async fn relays_count_against_the_address_cap_and_end_at_their_lifetime() {
    let mock = mock(MockOptions::default()).await;
    let yaml = config_for(
        &mock,
        "websocket: relay\nlimits:\n  max_connections_per_ip: 2\n  eviction_grace_secs: 0\n  relay_max_lifetime_secs: 1\n",
    );
    let proxy = proxy(&yaml).await;
    let greedy: IpAddr = [127, 0, 0, 7].into();
    let mut relays = Vec::new();
    for _ in 0..2 {
        let (socket, head) = upgrade(&proxy, greedy, "").await;
        assert!(head.starts_with("http/1.1 101"), "{head}");
        relays.push(socket);
    }
    // Both relays hold their places, busy: a third connection from the address is refused.
    let (mut third, head) = upgrade(&proxy, greedy, "").await;
    assert!(head.starts_with("http/1.1 503"), "{head}");
    assert!(read_to_close(&mut third).await.contains("overloaded"));

    // A relay kept busy with a byte now and then still ends at its lifetime.
    let mut trickled = relays.pop().expect("a relay");
    let closed = tokio::time::timeout(BOUND, async {
        let mut interval = tokio::time::interval(std::time::Duration::from_millis(100));
        let mut echo = [0u8; 64];
        loop {
            interval.tick().await;
            if trickled.write_all(b"x").await.is_err() {
                return;
            }
            match trickled.read(&mut echo).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the relay was closed at its lifetime");
    // Its place came free: the address may open another.
    let (_again, head) = upgrade(&proxy, greedy, "").await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
}

/// One request on a kept-alive raw connection, and its answer's head and body read whole.
async fn keep_alive_request(stream: &mut TcpStream) -> Option<String> {
    let body = chat_body("served?", false);
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.ok()?;
    let head = read_head(stream).await;
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())?;
    let mut answer = vec![0u8; length];
    tokio::time::timeout(BOUND, stream.read_exact(&mut answer))
        .await
        .ok()?
        .ok()?;
    Some(head)
}

/// A keep-alive client from `from` that has just been served: its connection idle, open.
async fn served_keep_alive(proxy: &Proxy, from: IpAddr) -> TcpStream {
    let mut stream = connect_from(proxy, from).await;
    let head = keep_alive_request(&mut stream).await.expect("served");
    assert!(head.starts_with("http/1.1 200"), "{head}");
    stream
}

/// The client's next request on the same connection is answered: it was not closed.
async fn still_served(stream: &mut TcpStream) {
    let head = keep_alive_request(stream)
        .await
        .expect("the keep-alive connection is still open");
    assert!(head.starts_with("http/1.1 200"), "{head}");
}

#[tokio::test]
async fn at_the_cap_the_address_holding_most_makes_room_not_a_keep_alive_client() {
    let mock = echo_mock().await;
    let proxy = proxy(&config_for(
        &mock,
        "limits:\n  max_connections: 4\n  eviction_grace_secs: 0\n",
    ))
    .await;
    let mut good = served_keep_alive(&proxy, [127, 0, 0, 1].into()).await;
    // The good client's connection is now the idlest; another address holds two.
    let churner: IpAddr = [127, 0, 0, 2].into();
    let mut held = [
        connect_from(&proxy, churner).await,
        connect_from(&proxy, churner).await,
        connect_from(&proxy, [127, 0, 0, 3].into()).await,
    ];
    // At the cap: the newcomer's room is taken from the address holding the most.
    let _newcomer = connect_from(&proxy, [127, 0, 0, 5].into()).await;
    assert_eq!(
        read_to_close(&mut held[0]).await,
        "",
        "closed without a word"
    );
    still_served(&mut good).await;
}

#[tokio::test]
async fn a_keep_alive_connection_within_the_grace_is_never_closed_to_make_room() {
    let mock = echo_mock().await;
    let proxy = proxy(&config_for(
        &mock,
        "limits:\n  max_connections: 3\n  eviction_grace_secs: 600\n",
    ))
    .await;
    let mut good = served_keep_alive(&proxy, [127, 0, 0, 1].into()).await;
    // Sockets churned from other addresses, one each: they make room for each other (a socket
    // that never sent a request earns no grace), never at the client's expense.
    let mut churned = Vec::new();
    for i in 2..12u8 {
        churned.push(connect_from(&proxy, [127, 0, 0, i].into()).await);
    }
    // The newest churned sockets are still open; the first ones were closed for them.
    assert_eq!(read_to_close(&mut churned[0]).await, "");
    still_served(&mut good).await;
}

#[tokio::test]
async fn an_unterminated_header_is_cut_at_the_per_connection_bound() {
    let mock = echo_mock().await;
    let proxy = proxy(&config_for(
        &mock,
        "limits:\n  max_header_bytes: 8192\n  header_read_timeout_secs: 600\n",
    ))
    .await;
    let mut socket = connect_from(&proxy, [127, 0, 0, 1].into()).await;
    let mut request = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-pad: ".to_vec();
    request.extend(std::iter::repeat_n(b'a', 20_000));
    // The write may fail once the server has closed; the answer is what counts.
    let _ = socket.write_all(&request).await;
    let answer = read_to_close(&mut socket).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
}

/// A connection that has sent 6 000 bytes of an unfinished header, in one write (one read for
/// the server: two connections' bytes never arrive interleaved).
async fn half_a_header(proxy: &Proxy) -> TcpStream {
    let mut socket = connect_from(proxy, [127, 0, 0, 1].into()).await;
    let mut partial = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-pad: ".to_vec();
    partial.extend(std::iter::repeat_n(b'a', 6_000));
    socket.write_all(&partial).await.expect("writes");
    socket
}

/// Ends the header a connection began and reads the answer.
async fn finish_header(mut socket: TcpStream) -> String {
    socket.write_all(b"\r\n\r\n").await.expect("writes");
    read_head(&mut socket).await
}

#[tokio::test]
async fn header_bytes_in_flight_are_bounded_across_connections() {
    let mock = echo_mock().await;
    let proxy = proxy(&config_for(
        &mock,
        "limits:\n  max_header_bytes: 8192\n  max_header_bytes_total: 10000\n  header_read_timeout_secs: 600\n",
    ))
    .await;
    // Each fits a connection's bound; together they are over the total: one is closed.
    let (mut first, mut second) = (half_a_header(&proxy).await, half_a_header(&proxy).await);
    let (mut sink, mut other_sink) = ([0u8; 64], [0u8; 64]);
    let first_closed = tokio::time::timeout(BOUND, async {
        tokio::select! {
            _ = first.read(&mut sink) => true,
            _ = second.read(&mut other_sink) => false,
        }
    })
    .await
    .expect("one connection is closed within the bound");
    let kept = if first_closed { second } else { first };
    assert!(finish_header(kept).await.starts_with("http/1.1 200"));
    // The bytes a finished header held are given back: another is served.
    let again = half_a_header(&proxy).await;
    assert!(finish_header(again).await.starts_with("http/1.1 200"));
}

/// An upstream that answers the first request on each connection, keeps it open, and closes
/// it under the next one without a word: a pooled connection closed by its server.
async fn closes_reused_connections() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                for answered in [true, false] {
                    if !read_request(&mut stream).await {
                        return;
                    }
                    if !answered {
                        return;
                    }
                    let body = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Reads one request with a `content-length` body; false when the connection ends first.
async fn read_request(stream: &mut TcpStream) -> bool {
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse().ok())
                .unwrap_or(0);
            if seen.len() >= end + 4 + length {
                return true;
            }
        }
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return false,
            Ok(read) => seen.extend_from_slice(&buffer[..read]),
        }
    }
}

#[tokio::test]
async fn a_pooled_connection_the_upstream_closed_is_retried_once_on_a_new_one() {
    let upstream = closes_reused_connections().await;
    let yaml = format!(
        "upstreams:\n  - name: raw\n    base_url: http://{upstream}/v1\nsummarization:\n  enabled: true\n"
    );
    let proxy = proxy(&yaml).await;
    for turn in 0..3 {
        let response = roundtrip(
            &client(),
            json_request(
                &proxy.url("/v1/chat/completions"),
                chat_body("hello", false),
                &[],
            ),
        )
        .await;
        assert_eq!(
            response.status,
            StatusCode::OK,
            "turn {turn}: {}",
            response.text()
        );
    }
}

#[tokio::test]
async fn a_refusal_before_the_body_is_read_says_the_connection_closes() {
    // Without `connection: close`, a client that keeps the connection sends its next request
    // on a socket compactor is closing, and gets a disconnect for a request never read.
    let mock = echo_mock().await;
    let proxy = proxy(&config_for(
        &mock,
        "summarization:\n  enabled: true\nlimits:\n  max_request_body_bytes: 1000\n",
    ))
    .await;
    let mut socket = connect_from(&proxy, [127, 0, 0, 1].into()).await;
    let length = 3 << 20;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    );
    socket.write_all(head.as_bytes()).await.expect("writes");
    // The answer comes before the body is sent whole; the rest may be refused mid-way.
    let _ = socket.write_all(&vec![b'x'; length]).await;
    let answer = read_head(&mut socket).await;
    assert!(answer.starts_with("http/1.1 413"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
}
