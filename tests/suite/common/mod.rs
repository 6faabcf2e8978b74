//! Test support: compactor and the mock upstream in-process on ephemeral loopback ports, and a
//! plain hyper client that shows exactly the bytes on the wire.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use compactor::app::App;
use compactor::config::Config;
use compactor::server;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mock_upstream::{self, MockHandle, MockOptions};
use tokio::sync::oneshot;

/// Bound for every wait in tests: long enough never to fire on a healthy run, short enough that
/// a broken build fails instead of hanging CI.
pub const BOUND: Duration = Duration::from_secs(20);

pub async fn mock(options: MockOptions) -> MockHandle {
    mock_upstream::start("127.0.0.1:0", options)
        .await
        .expect("mock upstream binds")
}

pub async fn echo_mock() -> MockHandle {
    mock(MockOptions {
        mode: mock_upstream::MockMode::Echo,
        ..MockOptions::default()
    })
    .await
}

pub struct Proxy {
    pub addr: SocketAddr,
    /// The running app: tests wait on its background work through it.
    pub app: Arc<App>,
    shutdown: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<bool>>,
}

impl Proxy {
    /// Waits until no summary is being made ahead of need.
    pub async fn background_idle(&self) {
        if let Some(engine) = self.app.compaction() {
            tokio::time::timeout(BOUND, engine.background_idle())
                .await
                .expect("background work ends within bound");
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn base_url(&self) -> String {
        self.url("/v1")
    }

    /// Triggers graceful shutdown and returns whether it finished within the grace period.
    pub async fn shutdown(mut self) -> bool {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.done.take() {
            Some(done) => tokio::time::timeout(BOUND, done)
                .await
                .expect("shutdown finishes")
                .expect("server task"),
            None => true,
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Starts compactor in-process with the given YAML; `listen` is forced to an ephemeral port.
pub async fn proxy(yaml: &str) -> Proxy {
    server::install_crypto_provider();
    let mut config = Config::from_yaml(yaml).expect("test config is valid");
    config.listen = "127.0.0.1:0".into();
    let listener = server::bind(&config).await.expect("proxy binds");
    let addr = listener.local_addr().expect("local addr");
    let app = Arc::new(App::new(config).expect("app builds"));
    let (tx, rx) = oneshot::channel::<()>();
    let done = tokio::spawn(server::serve(listener, app.clone(), async move {
        let _ = rx.await;
    }));
    Proxy {
        addr,
        app,
        shutdown: Some(tx),
        done: Some(done),
    }
}

/// A one-upstream config in front of `mock`, plus `extra` YAML appended at top level.
pub fn config_for(mock: &MockHandle, extra: &str) -> String {
    format!(
        "upstreams:\n  - name: mock\n    base_url: {}\n{extra}",
        mock.base_url()
    )
}

pub type RawClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> RawClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// A client whose connections come from `address` (any of 127.0.0.0/8 reaches a loopback
/// listener), to be another client address than the tests' usual 127.0.0.1.
pub fn client_from(address: std::net::IpAddr) -> RawClient {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(address));
    Client::builder(TokioExecutor::new()).build(connector)
}

pub fn http2_client() -> RawClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(HttpConnector::new())
}

pub fn json_request(
    url: &str,
    body: impl Into<Bytes>,
    headers: &[(&str, &str)],
) -> Request<Full<Bytes>> {
    let mut builder = Request::post(url).header("content-type", "application/json");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder
        .body(Full::new(body.into()))
        .expect("request builds")
}

pub async fn send(client: &RawClient, request: Request<Full<Bytes>>) -> Response<Incoming> {
    tokio::time::timeout(BOUND, client.request(request))
        .await
        .expect("response within bound")
        .expect("request succeeds")
}

pub struct Collected {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Collected {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub async fn collect(response: Response<Incoming>) -> Collected {
    let (parts, body) = response.into_parts();
    let body = tokio::time::timeout(BOUND, body.collect())
        .await
        .expect("body within bound")
        .expect("body completes")
        .to_bytes();
    Collected {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub async fn roundtrip(client: &RawClient, request: Request<Full<Bytes>>) -> Collected {
    collect(send(client, request).await).await
}

/// Reads the next data frame of a streaming body.
pub async fn next_data(body: &mut Incoming) -> Option<Bytes> {
    loop {
        let frame = tokio::time::timeout(BOUND, body.frame())
            .await
            .expect("frame within bound")?
            .ok()?;
        if let Ok(data) = frame.into_data() {
            return Some(data);
        }
    }
}

pub fn chat_body(content: &str, stream: bool) -> String {
    serde_json::json!({
        "model": "gpt-4o-mini",
        "stream": stream,
        "messages": [{"role": "user", "content": content}],
    })
    .to_string()
}

/// An address on loopback where nothing listens.
pub async fn dead_address() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    listener.local_addr().expect("addr")
}

/// compactor in front of an echo upstream (`mock`) and a summarizer upstream (`summarizer`,
/// serving `summarizer-*`, no key of its own).
pub struct Compacting {
    pub upstream: MockHandle,
    pub summarizer: MockHandle,
    pub proxy: Proxy,
}

/// [`Compacting`] with `summarization` lines (indented two spaces) after `enabled: true`.
pub async fn compacting_with(summarization: &str) -> Compacting {
    let upstream = echo_mock().await;
    let summarizer = mock(MockOptions {
        mode: mock_upstream::MockMode::Summarizer,
        ..MockOptions::default()
    })
    .await;
    let yaml = format!(
        "upstreams:\n  - name: mock\n    base_url: {}\n  - name: summarizer\n    base_url: {}\n    models: [\"summarizer-*\"]\nsummarization:\n  enabled: true\n{summarization}",
        upstream.base_url(),
        summarizer.base_url()
    );
    Compacting {
        proxy: proxy(&yaml).await,
        upstream,
        summarizer,
    }
}

/// A chat completion with these messages, through the proxy.
pub async fn send_chat(
    proxy: &Proxy,
    messages: &[serde_json::Value],
    headers: &[(&str, &str)],
) -> Collected {
    send_chat_with(&client(), proxy, messages, headers).await
}

pub async fn send_chat_with(
    client: &RawClient,
    proxy: &Proxy,
    messages: &[serde_json::Value],
    headers: &[(&str, &str)],
) -> Collected {
    let body = serde_json::json!({"model": "gpt-4o-mini", "messages": messages}).to_string();
    roundtrip(
        client,
        json_request(&proxy.url("/v1/chat/completions"), body, headers),
    )
    .await
}

/// The value of the first sample in a `/metrics` text named `name` whose labels include each
/// of `labels` (`key="value"`), when there is one.
pub fn metric_value(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .find(|(series, _)| {
            let (sample, sample_labels) = series.split_once('{').unwrap_or((series, ""));
            sample == name && labels.iter().all(|label| sample_labels.contains(label))
        })
        .and_then(|(_, value)| value.parse().ok())
}

/// A response header's value, empty when absent.
pub fn header(response: &Collected, name: &str) -> String {
    response
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// A chat conversation of `turns` exchanges (each about 80 tokens a side) after a system prompt,
/// ending on a user question: well over a 1 500-token trigger at 20 turns.
pub fn long_chat(turns: usize) -> Vec<serde_json::Value> {
    use serde_json::json;
    let mut messages = vec![json!({"role": "system", "content": "You are a careful engineer."})];
    for t in 0..turns {
        let words = |who: &str| format!("{who} {t}: ") + &"the parser drops a token ".repeat(12);
        messages.push(json!({"role": "user", "content": words("question")}));
        messages.push(json!({"role": "assistant", "content": words("answer")}));
    }
    messages.push(json!({"role": "user", "content": "And what now?"}));
    messages
}

/// The `x-compactor-compaction` header.
pub fn outcome(response: &Collected) -> String {
    response.headers["x-compactor-compaction"]
        .to_str()
        .unwrap_or_default()
        .to_string()
}

/// A tiny deterministic generator, so failures reproduce.
pub struct Rng(pub u64);

impl Rng {
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// compactor with compaction on, an echoing upstream and a summarizer, both mocks.
pub struct Stack {
    pub upstream: MockHandle,
    pub summarizer: MockHandle,
    pub proxy: Proxy,
}

pub async fn stack_with(summarization: &str, summarizer_options: MockOptions) -> Stack {
    let upstream = echo_mock().await;
    let summarizer = mock(MockOptions {
        mode: mock_upstream::MockMode::Summarizer,
        ..summarizer_options
    })
    .await;
    // The same mock plays Google behind an `api: gemini` upstream, at its root.
    let yaml = format!(
        "upstreams:\n  - name: mock\n    base_url: {}\n  - name: summarizer\n    base_url: {}\n    models: [\"summarizer-*\"]\n  - name: gemini\n    api: gemini\n    base_url: {}\n    api_key: g-upstream\nsummarization:\n  enabled: true\n  upstream: summarizer\n  model_name: summarizer-model\n  summary_max_tokens: 32\n{summarization}",
        upstream.base_url(),
        summarizer.base_url(),
        upstream.base_url().trim_end_matches("/v1"),
    );
    let proxy = proxy(&yaml).await;
    Stack {
        upstream,
        summarizer,
        proxy,
    }
}

/// The settings the 200-random-conversations tests run under (chat and Responses alike): low
/// triggers so most are compacted, skill rescue on, no rate limit in the way.
pub const RANDOM_RUNS_SUMMARIZATION: &str = "  trigger: [{type: messages, value: 10}, {type: tokens, value: 1500}]\n  keep: {type: messages, value: 5}\n  headroom: 0.75\n  preserve_recent_skill_count: 2\n  max_calls_per_minute_per_tenant: 1000\n";

/// The real `compactor` binary of this build.
pub const BIN: &str = env!("CARGO_BIN_EXE_compactor");

/// A config file that lives as long as the returned handle.
pub fn write_config(text: &str) -> tempfile::NamedTempFile {
    use std::io::Write;
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(text.as_bytes()).expect("write config");
    file
}

/// The binary, started on `config`, with its address and its stderr lines on a channel.
pub async fn start(
    config: &std::path::Path,
) -> (
    tokio::process::Child,
    String,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    use std::process::Stdio;
    use tokio::io::{AsyncBufReadExt, BufReader};
    let mut child = tokio::process::Command::new(BIN)
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("compactor starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(BOUND, stdout.next_line())
        .await
        .expect("announces in time")
        .expect("reads stdout")
        .expect("a line");
    let addr = line.rsplit("http://").next().expect("address").to_string();
    let (lines, received) = tokio::sync::mpsc::unbounded_channel();
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr")).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    (child, addr, received)
}

/// Waits (bounded) for a stderr line containing `text`; returns it.
pub async fn wait_for_line(
    lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    text: &str,
) -> String {
    let found = async {
        while let Some(line) = lines.recv().await {
            if line.contains(text) {
                return line;
            }
        }
        panic!("stderr ended before '{text}'");
    };
    tokio::time::timeout(BOUND, found)
        .await
        .unwrap_or_else(|_| panic!("no '{text}' in time"))
}

/// A GET through the plain client.
pub async fn get(url: &str) -> Collected {
    roundtrip(
        &client(),
        Request::get(url)
            .body(Full::new(Bytes::new()))
            .expect("request"),
    )
    .await
}

/// A summary cache that holds one summary, under one prefix's digest.
pub struct One(
    pub compactor::compaction::planner::digest::Digest,
    pub compactor::compaction::planner::plan::CachedSummary,
);

impl compactor::compaction::planner::plan::SummaryLookup for One {
    fn chain_seed(&mut self) -> compactor::compaction::planner::digest::Digest {
        [0; 32]
    }
    fn get(
        &mut self,
        prefix: &compactor::compaction::planner::digest::Digest,
    ) -> Option<compactor::compaction::planner::plan::CachedSummary> {
        (prefix == &self.0).then(|| self.1.clone())
    }
}

/// A connection from `from` (any of 127.0.0.0/8 reaches a loopback listener).
pub async fn connect_from(proxy: &Proxy, from: std::net::IpAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind((from, 0).into()).expect("binds");
    socket.connect(proxy.addr).await.expect("connects")
}

/// Everything the server sends until it closes the connection.
pub async fn read_to_close(stream: &mut tokio::net::TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(
        BOUND,
        tokio::io::AsyncReadExt::read_to_end(stream, &mut out),
    )
    .await
    .expect("the server closes the connection within the bound")
    .ok();
    String::from_utf8_lossy(&out).into_owned()
}

/// The head of a response, read byte by byte up to its blank line.
pub async fn read_head(stream: &mut tokio::net::TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(BOUND, tokio::io::AsyncReadExt::read(stream, &mut byte))
            .await
            .expect("a response head within the bound")
            .unwrap_or(0);
        if read == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).to_ascii_lowercase()
}
