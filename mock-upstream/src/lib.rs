//! A real chat-completions server on loopback for tests, benchmarks and the demo.
//!
//! Behaviour is set per instance ([`MockOptions`], CLI flags of `mock-upstream`) and overridden
//! per request by `x-mock-*` headers, which pass through compactor like any other header:
//! - `x-mock-mode: chat | echo | summarizer` — echo replies with the exact request body it got;
//!   summarizer replies with a deterministic summary of its input.
//! - `x-mock-chunks`, `x-mock-chunk-delay-ms`, `x-mock-first-byte-delay-ms` — SSE pacing.
//! - `x-mock-status: 429` — answer that status with an OpenAI-shaped error.
//! - `x-mock-fault: hang | stall | reset` — never answer; stop after the first event; or break
//!   the connection after the first event.
//! - `x-mock-id: ID` — use this completion id (makes two replies byte-comparable).
//! - `x-mock-refuse-lookups: 1` — refuse (500) a chat request carrying a call of compactor's
//!   lookup tool, as a server that does not take its messages would.
//! - `x-mock-response-header: NAME=VALUE` — on non-chat paths, add that response header.
//! - `x-mock-close: 1` — answer with `connection: close` and close the connection after it.
//! - `x-mock-gate: KEY` — after the first event, wait until the gate is opened
//!   ([`MockHandle::open_gate`] or `POST /mock/gates/KEY`).
//! - `x-mock-window: N`, `x-mock-window-style: openai | azure | responses | vllm | openrouter |
//!   anthropic` — a context window of N tokens, refused with that provider's error ([`window`]).
//! - `x-mock-tokenizer: o200k | cl100k` — count input tokens with that real tokenizer, for the
//!   window and the usage a non-streamed reply reports ([`window::Counting`]).
//!
//! Requests to `/responses` get a Responses `response` object or a typed event stream, and their
//! `input` is validated as OpenAI does (calls and outputs paired by `call_id`, a reasoning item
//! followed by the item it produced and carrying `summary`).
//!
//! Requests to `/messages` speak Anthropic's Messages API ([`anthropic`]): a `message` object
//! or a typed event stream, Anthropic's checks on `messages` and its error shape.
//!
//! Requests to `/chat/completions` are validated the way OpenAI does (tool messages must answer a
//! pending call; every call must be answered before the next non-tool message) and get 400 with
//! OpenAI's error shape otherwise. When the request has `tools` and its last message is not a
//! tool result, the reply is a call to the first tool (scripted tool use).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::channel::{Channel, Sender};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::Notify;

pub mod agent;
pub mod anthropic;
pub mod gemini;
pub mod window;

/// The error type of every body the mock serves.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MockMode {
    Chat,
    Echo,
    Summarizer,
    /// A scripted coding agent for the real CLIs ([`agent`]).
    Agent,
}

impl MockMode {
    pub fn parse(value: &str) -> Option<MockMode> {
        match value {
            "chat" => Some(MockMode::Chat),
            "echo" => Some(MockMode::Echo),
            "summarizer" => Some(MockMode::Summarizer),
            "agent" => Some(MockMode::Agent),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MockFault {
    Status(u16),
    Hang,
    Stall,
    Reset,
    /// Summarizer mode: answer 200 with an empty message content.
    Blank,
    /// Summarizer mode: answer with a summary far longer than any input.
    Verbose,
}

/// The input count a reply reports, as servers differ in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Reported {
    /// Every input token, as OpenAI and Anthropic report them.
    #[default]
    Whole,
    /// Only the tokens past the previous request's, as a local server reports the tokens it
    /// evaluated after a prefix-cache hit.
    NewOnly,
    /// Always this number.
    Constant(u64),
}

#[derive(Debug, Clone)]
pub struct MockOptions {
    pub mode: MockMode,
    pub chunks: usize,
    pub chunk_delay: Duration,
    pub first_byte_delay: Duration,
    pub validate: bool,
    /// How many recent requests to keep for inspection.
    pub record: usize,
    /// A context window enforced on every request ([`window`]).
    pub window: Option<u64>,
    /// How input tokens are counted, for the window and the usage reported.
    pub counting: window::Counting,
    /// What a non-streamed reply reports of those tokens (with a tokenizer `counting`).
    pub reported: Reported,
    /// What agent mode does ([`agent`]).
    pub agent: agent::AgentScript,
    /// Whether it implements OpenAI's compaction contract. Without it, as vLLM, SGLang or
    /// any other Responses server: `/responses/compact` is 404 and a `compaction` input
    /// item is refused.
    pub native_compaction: bool,
}

impl Default for MockOptions {
    fn default() -> Self {
        MockOptions {
            mode: MockMode::Chat,
            chunks: 8,
            chunk_delay: Duration::ZERO,
            first_byte_delay: Duration::ZERO,
            validate: true,
            record: 256,
            window: None,
            counting: window::Counting::Quarter,
            reported: Reported::Whole,
            agent: agent::AgentScript::default(),
            native_compaction: true,
        }
    }
}

#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: Method,
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl RecordedRequest {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

#[derive(Default)]
struct MockState {
    recorded: Mutex<VecDeque<RecordedRequest>>,
    chat_calls: AtomicUsize,
    streams_aborted: AtomicUsize,
    stream_aborted: Notify,
    gates: Mutex<HashMap<String, Arc<Notify>>>,
    fault: Mutex<Option<MockFault>>,
    next_id: AtomicU64,
    /// The last request's whole input count, for [`Reported::NewOnly`].
    last_input: AtomicU64,
    /// Released one per request while a test holds requests back ([`MockHandle::hold`]).
    held: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
    arrived: Notify,
    arrivals: AtomicUsize,
    connections: AtomicUsize,
    window_refusals: AtomicUsize,
    /// Requests refused by the provider's validation, and the latest refusal's message.
    rejections: AtomicUsize,
    last_rejection: Mutex<String>,
}

/// A running mock upstream; dropping it does not stop it (it lives as long as the runtime).
#[derive(Clone)]
pub struct MockHandle {
    pub addr: SocketAddr,
    state: Arc<MockState>,
}

impl MockHandle {
    /// `http://addr/v1`, the base_url to configure.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.state.recorded).iter().cloned().collect()
    }

    pub fn last_request(&self) -> Option<RecordedRequest> {
        lock(&self.state.recorded).back().cloned()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Requests refused for not fitting the context window.
    pub fn window_refusals(&self) -> usize {
        self.state.window_refusals.load(Ordering::SeqCst)
    }

    /// Requests refused as the provider refuses them (a broken pair, a lost signature, …).
    pub fn rejections(&self) -> usize {
        self.state.rejections.load(Ordering::SeqCst)
    }

    /// Chat-completion requests served (validated ones included, faults excluded).
    pub fn chat_calls(&self) -> usize {
        self.state.chat_calls.load(Ordering::SeqCst)
    }

    pub fn open_gate(&self, key: &str) {
        gate(&self.state, key).notify_one();
    }

    /// Waits (bounded) until a streaming response was dropped before its end.
    pub async fn wait_stream_aborted(&self, within: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.state.stream_aborted.notified();
                if self.state.streams_aborted.load(Ordering::SeqCst) > 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }

    /// Sets a fault applied to every request until cleared.
    pub fn set_fault(&self, fault: Option<MockFault>) {
        *lock(&self.state.fault) = fault;
    }

    /// Holds every chat request until [`MockHandle::release`] lets it through.
    pub fn hold(&self) {
        *lock(&self.state.held) = Some(Arc::new(tokio::sync::Semaphore::new(0)));
    }

    pub fn release(&self, permits: usize) {
        if let Some(semaphore) = lock(&self.state.held).as_ref() {
            semaphore.add_permits(permits);
        }
    }

    /// Waits (bounded) until at least `count` chat requests have arrived.
    pub async fn wait_arrivals(&self, count: usize, within: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.state.arrived.notified();
                if self.state.arrivals.load(Ordering::SeqCst) >= count {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn gate(state: &MockState, key: &str) -> Arc<Notify> {
    lock(&state.gates)
        .entry(key.to_string())
        .or_insert_with(|| Arc::new(Notify::new()))
        .clone()
}

/// `x-mock-response-header: NAME=VALUE` asks for that header on the response (to test what a
/// proxy lets an upstream say).
fn add_requested_header(request: &HeaderMap, response: &mut HeaderMap) {
    let Some((name, value)) = request
        .get("x-mock-response-header")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once('='))
    else {
        return;
    };
    if let (Ok(name), Ok(value)) = (
        http::HeaderName::from_bytes(name.trim().as_bytes()),
        http::HeaderValue::from_str(value.trim()),
    ) {
        response.insert(name, value);
    }
}

/// Binds `addr` and serves in the background of the current runtime.
pub async fn start(addr: &str, options: MockOptions) -> std::io::Result<MockHandle> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let state = Arc::new(MockState::default());
    let handle = MockHandle {
        addr,
        state: state.clone(),
    };
    let options = Arc::new(options);
    tokio::spawn(async move {
        let builder = auto::Builder::new(TokioExecutor::new());
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            state.connections.fetch_add(1, Ordering::SeqCst);
            let state = state.clone();
            let options = options.clone();
            let service = service_fn(move |request: Request<Incoming>| {
                let close = request.headers().contains_key("x-mock-close");
                let served = serve_request(state.clone(), options.clone(), request);
                async move {
                    let mut response = served.await?;
                    if close {
                        response.headers_mut().insert(
                            http::header::CONNECTION,
                            http::HeaderValue::from_static("close"),
                        );
                    }
                    Ok::<_, Infallible>(response)
                }
            });
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .into_owned();
            tokio::spawn(connection);
        }
    });
    Ok(handle)
}

type MockBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<MockBody> {
    let mut response = Response::new(
        http_body_util::Full::new(body.into())
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, value);
    }
    response
}

fn openai_error(status: StatusCode, message: &str, param: Option<String>) -> Response<MockBody> {
    let body = json!({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": null}});
    full(status, "application/json", body.to_string())
}

fn anthropic_error(status: StatusCode, message: &str) -> Response<MockBody> {
    let body = anthropic::error_body(anthropic::error_type(status.as_u16()), message);
    full(status, "application/json", body)
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn header_num<T: std::str::FromStr>(headers: &HeaderMap, name: &str) -> Option<T> {
    header_str(headers, name).and_then(|v| v.trim().parse().ok())
}

async fn serve_request(
    state: Arc<MockState>,
    options: Arc<MockOptions>,
    request: Request<Incoming>,
) -> Result<Response<MockBody>, Infallible> {
    let (mut parts, incoming) = request.into_parts();
    let body = match incoming.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            return Ok(openai_error(
                StatusCode::BAD_REQUEST,
                "unreadable body",
                None,
            ))
        }
    };
    let path = parts.uri.path().to_string();
    if options.record > 0 {
        let mut recorded = lock(&state.recorded);
        if recorded.len() >= options.record {
            recorded.pop_front();
        }
        recorded.push_back(RecordedRequest {
            method: parts.method.clone(),
            path_and_query: parts
                .uri
                .path_and_query()
                .map(|pq| pq.to_string())
                .unwrap_or_default(),
            headers: parts.headers.clone(),
            body: body.clone(),
        });
    }
    if header_str(&parts.headers, "x-mock-upgrade") == Some("echo") {
        if let Some(on_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() {
            return Ok(echo_upgrade(on_upgrade));
        }
    }
    if let Some(key) = path.strip_prefix("/mock/gates/") {
        gate(&state, key).notify_one();
        return Ok(full(StatusCode::OK, "application/json", "{}"));
    }
    if path == "/mock/stats" {
        // The last chat request's messages, for a client that drives the mock from outside.
        let last_messages = lock(&state.recorded)
            .iter()
            .rev()
            .find(|request| request.path_and_query.ends_with("/chat/completions"))
            .and_then(|request| request.json().get("messages").cloned())
            .unwrap_or(Value::Null);
        // compactor's lookups belong in the last two messages of its own follow-up only: one
        // anywhere else came back from a client that saw it.
        let lookups_in_client_history = lock(&state.recorded)
            .iter()
            .filter(|request| agent::lookup_in_client_history(&request.json()))
            .count();
        let body = json!({
            "lookups_in_client_history": lookups_in_client_history,
            "last_messages": last_messages,
            "arrivals": state.arrivals.load(Ordering::SeqCst),
            "answered": state.chat_calls.load(Ordering::SeqCst),
            "rejections": state.rejections.load(Ordering::SeqCst),
            "last_rejection": lock(&state.last_rejection).clone(),
            "window_refusals": state.window_refusals.load(Ordering::SeqCst),
        });
        return Ok(full(StatusCode::OK, "application/json", body.to_string()));
    }
    if parts.method == Method::GET && path.ends_with("/models") {
        let body = json!({"object": "list", "data": [{"id": "mock-model", "object": "model", "created": 1_700_000_000, "owned_by": "compactor"}]});
        return Ok(full(StatusCode::OK, "application/json", body.to_string()));
    }
    if !options.native_compaction && path.ends_with("/responses/compact") {
        let body = json!({"detail": "Not Found"}).to_string();
        return Ok(full(StatusCode::NOT_FOUND, "application/json", body));
    }
    if parts.method == Method::POST {
        if let Some((model, method)) = gemini::call_of(&path) {
            return Ok(gemini_reply(
                &state,
                &options,
                &parts,
                &body,
                (model, method),
            ));
        }
    }
    let responses_api = parts.method == Method::POST && path.ends_with("/responses");
    let messages_api = parts.method == Method::POST && path.ends_with("/messages");
    if !(parts.method == Method::POST && path.ends_with("/chat/completions")
        || responses_api
        || messages_api)
    {
        let mut response = full(
            StatusCode::OK,
            "application/json",
            json!({"method": parts.method.as_str(), "path": path}).to_string(),
        );
        response
            .headers_mut()
            .insert("x-mock-path", http::HeaderValue::from_static("other"));
        add_requested_header(&parts.headers, response.headers_mut());
        return Ok(response);
    }

    state.arrivals.fetch_add(1, Ordering::SeqCst);
    state.arrived.notify_waiters();
    let held = lock(&state.held).clone();
    if let Some(semaphore) = held {
        if let Ok(permit) = semaphore.acquire().await {
            permit.forget();
        }
    }

    let headers = &parts.headers;
    let fault = header_str(headers, "x-mock-fault")
        .and_then(|f| match f {
            "hang" => Some(MockFault::Hang),
            "stall" => Some(MockFault::Stall),
            "reset" => Some(MockFault::Reset),
            "blank" => Some(MockFault::Blank),
            "verbose" => Some(MockFault::Verbose),
            _ => None,
        })
        .or_else(|| header_num::<u16>(headers, "x-mock-status").map(MockFault::Status))
        .or(*lock(&state.fault));
    match fault {
        Some(MockFault::Status(code)) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = if messages_api {
                anthropic_error(status, "mock upstream fault")
            } else {
                openai_error(status, "mock upstream fault", None)
            };
            if code == 429 {
                response
                    .headers_mut()
                    .insert("retry-after", http::HeaderValue::from_static("7"));
            }
            return Ok(response);
        }
        Some(MockFault::Hang) => {
            std::future::pending::<()>().await;
        }
        _ => {}
    }

    let request: Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(e) if messages_api => {
            return Ok(anthropic_error(
                StatusCode::BAD_REQUEST,
                &format!("The request body is not valid JSON: {e}"),
            ))
        }
        Err(e) => {
            return Ok(openai_error(
                StatusCode::BAD_REQUEST,
                &format!("We could not parse the JSON body of your request. ({e})"),
                None,
            ))
        }
    };
    let reject = |message: &str| {
        state.rejections.fetch_add(1, Ordering::SeqCst);
        *lock(&state.last_rejection) = message.to_string();
    };
    if options.validate && messages_api {
        let checked = anthropic::validate(&request).and_then(|()| {
            if options.native_compaction {
                Ok(())
            } else {
                anthropic::without_compaction(&request)
            }
        });
        if let Err(message) = checked {
            reject(&message);
            return Ok(anthropic_error(StatusCode::BAD_REQUEST, &message));
        }
    } else if options.validate {
        let checked = if responses_api {
            validate_items(&request).and_then(|()| {
                if options.native_compaction {
                    return Ok(());
                }
                if request.get("context_management").is_some() {
                    return Err((
                        "Unknown parameter: 'context_management'.".to_string(),
                        "context_management".to_string(),
                    ));
                }
                compaction_item_at(&request).map_or(Ok(()), |i| {
                    Err((
                        format!("Invalid value: 'compaction'. This server does not support the input item type 'compaction' (input[{i}])."),
                        format!("input[{i}].type"),
                    ))
                })
            })
        } else {
            validate_messages(&request)
        };
        if let Err((message, param)) = checked {
            reject(&message);
            return Ok(openai_error(StatusCode::BAD_REQUEST, &message, Some(param)));
        }
    }
    if header_str(headers, "x-mock-refuse-lookups").is_some()
        && !messages_api
        && !responses_api
        && agent::carries_lookup(&request)
    {
        reject("a lookup's messages");
        return Ok(openai_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "this server does not take the lookup's messages",
            None,
        ));
    }
    let style = if messages_api {
        window::Style::Anthropic
    } else if responses_api {
        window::Style::Responses
    } else {
        window::Style::OpenAi
    };
    let counting = match within_window(&state, &options, &parts.headers, &request, style) {
        Ok(counting) => counting,
        Err((status, body)) => return Ok(full(status, "application/json", body)),
    };
    state.chat_calls.fetch_add(1, Ordering::SeqCst);

    let mode = header_str(headers, "x-mock-mode")
        .and_then(MockMode::parse)
        .unwrap_or(options.mode);
    let chunks = header_num(headers, "x-mock-chunks")
        .unwrap_or(options.chunks)
        .max(1);
    let chunk_delay = header_num(headers, "x-mock-chunk-delay-ms")
        .map(Duration::from_millis)
        .unwrap_or(options.chunk_delay);
    let first_byte_delay = header_num(headers, "x-mock-first-byte-delay-ms")
        .map(Duration::from_millis)
        .unwrap_or(options.first_byte_delay);
    let gate_key = header_str(headers, "x-mock-gate").map(str::to_string);

    let id = match header_str(headers, "x-mock-id") {
        Some(id) => id.to_string(),
        None => format!(
            "chatcmpl-mock-{}",
            state.next_id.fetch_add(1, Ordering::SeqCst)
        ),
    };
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("mock-model")
        .to_string();
    let reply = build_reply(mode, &request, &body, fault);
    let anthropic_reply = match (&reply, mode) {
        (_, MockMode::Chat) => anthropic::chat_reply(&request),
        (Reply::Text(text), _) => anthropic::Reply::Text(text.clone()),
        (Reply::ToolCall { .. }, _) => anthropic::Reply::Text(String::new()),
    };
    if !first_byte_delay.is_zero() {
        tokio::time::sleep(first_byte_delay).await;
    }
    let stream = request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let text = match &reply {
        Reply::Text(text) => text.clone(),
        Reply::ToolCall { arguments, .. } => arguments.clone(),
    };
    let agent_reply = match mode {
        MockMode::Agent if messages_api => Some(agent::message_reply(
            &options.agent,
            &request,
            &body,
            &id,
            &model,
        )),
        MockMode::Agent if responses_api => Some(agent::response_reply(
            &options.agent,
            &request,
            &body,
            &id,
            &model,
        )),
        _ => None,
    };
    if let (Some((whole, _)), false) = (&agent_reply, stream) {
        return Ok(full(StatusCode::OK, "application/json", whole.to_string()));
    }
    if !stream {
        let mut body = if messages_api {
            anthropic::message_json(&id, &model, &anthropic_reply, &request)
        } else if responses_api {
            response_json(&id, &model, &text, "completed")
        } else {
            completion_json(&id, &model, &reply, &request)
        };
        if counting != window::Counting::Quarter {
            let whole = counting.input_tokens(&request);
            let previous = state.last_input.swap(whole, Ordering::SeqCst);
            let input = match options.reported {
                Reported::Whole => whole,
                Reported::NewOnly if whole > previous => whole - previous,
                Reported::NewOnly => whole,
                Reported::Constant(n) => n,
            };
            let key = if messages_api || responses_api {
                "input_tokens"
            } else {
                "prompt_tokens"
            };
            if let Some(usage) = body.get_mut("usage").and_then(Value::as_object_mut) {
                usage.insert(key.into(), json!(input));
            }
        }
        return Ok(full(StatusCode::OK, "application/json", body.to_string()));
    }
    let include_usage = request
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let events = if let Some((_, events)) = agent_reply {
        events
    } else if messages_api {
        anthropic::message_events(&id, &model, &anthropic_reply, &request, chunks)
    } else if responses_api {
        response_events(&id, &model, &text, chunks)
    } else {
        stream_events(&id, &model, &reply, chunks, include_usage)
    };
    let (sender, channel) = Channel::<Bytes, BoxError>::new(4);
    tokio::spawn(send_events(
        sender,
        events,
        chunk_delay,
        fault,
        gate_key.map(|key| gate(&state, &key)),
    ));
    let body = GuardedBody {
        inner: channel,
        state: state.clone(),
        finished: false,
    };
    let mut response = Response::new(body.boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache"),
    );
    Ok(response)
}

/// `x-mock-upgrade: echo`: switches protocols and sends back every byte it gets, so a relay
/// can be checked byte for byte without a WebSocket implementation on either end.
fn echo_upgrade(on_upgrade: hyper::upgrade::OnUpgrade) -> Response<MockBody> {
    tokio::spawn(async move {
        if let Ok(upgraded) = on_upgrade.await {
            let (mut read, mut write) = tokio::io::split(TokioIo::new(upgraded));
            let _ = tokio::io::copy(&mut read, &mut write).await;
        }
    });
    let mut response = full(
        StatusCode::SWITCHING_PROTOCOLS,
        "application/octet-stream",
        "",
    );
    let headers = response.headers_mut();
    headers.remove(http::header::CONTENT_TYPE);
    headers.insert(
        http::header::UPGRADE,
        http::HeaderValue::from_static("websocket"),
    );
    headers.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("upgrade"),
    );
    headers.insert(
        "sec-websocket-accept",
        http::HeaderValue::from_static("mock-accept"),
    );
    response
}

/// Records a stream dropped before its end (the client, or the proxy, went away).
struct GuardedBody {
    inner: Channel<Bytes, BoxError>,
    state: Arc<MockState>,
    finished: bool,
}

impl Body for GuardedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.finished = true;
        }
        polled
    }
}

impl Drop for GuardedBody {
    fn drop(&mut self) {
        if !self.finished {
            self.state.streams_aborted.fetch_add(1, Ordering::SeqCst);
            self.state.stream_aborted.notify_waiters();
        }
    }
}

async fn send_events(
    mut sender: Sender<Bytes, BoxError>,
    events: Vec<Bytes>,
    delay: Duration,
    fault: Option<MockFault>,
    gate: Option<Arc<Notify>>,
) {
    for (i, event) in events.into_iter().enumerate() {
        if i > 0 {
            if i == 1 {
                match fault {
                    Some(MockFault::Stall) => std::future::pending::<()>().await,
                    Some(MockFault::Reset) => {
                        sender.abort("mock upstream reset the stream".into());
                        return;
                    }
                    _ => {}
                }
                if let Some(gate) = &gate {
                    gate.notified().await;
                }
            }
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }
        if sender.send_data(event).await.is_err() {
            return;
        }
    }
}

enum Reply {
    Text(String),
    ToolCall { name: String, arguments: String },
}

fn build_reply(mode: MockMode, request: &Value, raw: &Bytes, fault: Option<MockFault>) -> Reply {
    let messages = request.get("messages").and_then(Value::as_array);
    match mode {
        MockMode::Echo => Reply::Text(String::from_utf8_lossy(raw).into_owned()),
        // On chat, agent mode scripts only compactor's lookup tool; else the chat reply.
        MockMode::Agent => agent::lookup_reply(request)
            .map(|(call, text)| match call {
                Some(arguments) => Reply::ToolCall {
                    name: agent::LOOKUP_TOOL.into(),
                    arguments,
                },
                None => Reply::Text(text),
            })
            .unwrap_or_else(|| build_reply(MockMode::Chat, request, raw, fault)),
        MockMode::Summarizer => {
            match fault {
                Some(MockFault::Blank) => return Reply::Text("   ".into()),
                Some(MockFault::Verbose) => {
                    return Reply::Text("very long summary ".repeat(20_000))
                }
                _ => {}
            }
            // A chat prompt is its messages' text; a Responses prompt, a string `input`.
            let prompt: String = messages
                .into_iter()
                .flatten()
                .filter_map(|m| m.get("content").and_then(Value::as_str))
                .chain(request.get("input").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n");
            Reply::Text(format!(
                "Summary {:016x} of {} chars of conversation.",
                fnv1a(prompt.as_bytes()),
                prompt.chars().count()
            ))
        }
        MockMode::Chat => {
            let last = messages.and_then(|m| m.last());
            let last_role = last.and_then(|m| m.get("role")).and_then(Value::as_str);
            let first_tool = request
                .get("tools")
                .and_then(Value::as_array)
                .and_then(|tools| tools.first())
                .and_then(|tool| tool.pointer("/function/name"))
                .and_then(Value::as_str);
            match (first_tool, last_role) {
                (Some(name), Some(role)) if role != "tool" => Reply::ToolCall {
                    name: name.to_string(),
                    arguments: r#"{"city":"Paris"}"#.to_string(),
                },
                (_, Some("tool")) => Reply::Text(format!(
                    "The tool said: {}",
                    last.and_then(|m| m.get("content"))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                )),
                _ => Reply::Text("Hello from the mock upstream.".into()),
            }
        }
    }
}

pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn usage(request: &Value, completion_chars: usize) -> Value {
    let prompt_chars = request
        .get("messages")
        .map(|m| m.to_string().len())
        .unwrap_or(0);
    let prompt = (prompt_chars / 4) as u64;
    let completion = (completion_chars / 4).max(1) as u64;
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

const CREATED: u64 = 1_700_000_000;

fn completion_json(id: &str, model: &str, reply: &Reply, request: &Value) -> Value {
    let (message, finish, chars) = match reply {
        Reply::Text(text) => (
            json!({"role": "assistant", "content": text, "refusal": null}),
            "stop",
            text.len(),
        ),
        Reply::ToolCall { name, arguments } => (
            json!({"role": "assistant", "content": null, "refusal": null, "tool_calls": [
                {"id": "call_mock_1", "type": "function", "function": {"name": name, "arguments": arguments}}
            ]}),
            "tool_calls",
            arguments.len(),
        ),
    };
    json!({
        "id": id, "object": "chat.completion", "created": CREATED, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
        "usage": usage(request, chars),
    })
}

/// How the request is counted (`x-mock-tokenizer`, else the instance's), or the provider's
/// context-length error when it does not fit the window (`x-mock-window`, else the instance's;
/// the error in `style` unless `x-mock-window-style` names another).
fn within_window(
    state: &MockState,
    options: &MockOptions,
    headers: &http::HeaderMap,
    request: &Value,
    style: window::Style,
) -> Result<window::Counting, (StatusCode, String)> {
    let counting = header_str(headers, "x-mock-tokenizer")
        .and_then(window::Counting::parse)
        .unwrap_or(options.counting);
    let Some(limit) = header_num::<u64>(headers, "x-mock-window").or(options.window) else {
        return Ok(counting);
    };
    let style = header_str(headers, "x-mock-window-style")
        .and_then(window::Style::parse)
        .unwrap_or(style);
    match window::check(request, limit, style, counting) {
        Some(refusal) => {
            state.window_refusals.fetch_add(1, Ordering::SeqCst);
            Err(refusal)
        }
        None => Ok(counting),
    }
}

/// A Gemini model call: refused as Google refuses it, else the fixed answer, whole or
/// streamed (SSE with `alt=sse`, else one JSON array).
fn gemini_reply(
    state: &MockState,
    options: &MockOptions,
    parts: &http::request::Parts,
    body: &[u8],
    (model, method): (&str, &str),
) -> Response<MockBody> {
    let query = parts.uri.query().unwrap_or_default();
    let has_key = parts.headers.contains_key("x-goog-api-key")
        || query.split('&').any(|pair| pair.starts_with("key="));
    if let Some((status, error)) = gemini::refusal(has_key, body) {
        state.rejections.fetch_add(1, Ordering::SeqCst);
        *lock(&state.last_rejection) = error
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
        return full(status, "application/json", error.to_string());
    }
    let request: Value = serde_json::from_slice(body).unwrap_or_default();
    let counting = match within_window(
        state,
        options,
        &parts.headers,
        &request,
        window::Style::Google,
    ) {
        Ok(counting) => counting,
        Err((status, body)) => return full(status, "application/json", body),
    };
    state.chat_calls.fetch_add(1, Ordering::SeqCst);
    let by = gemini::Answerer {
        model,
        prompt_tokens: counting.input_tokens(&request),
    };
    let asks_json = request.pointer("/generationConfig/responseMimeType")
        == Some(&Value::from("application/json"));
    let agent_turn = (options.mode == MockMode::Agent && !asks_json)
        .then(|| gemini::turn(by, agent::gemini_parts(&options.agent, &request, body)));
    let sse = query.split('&').any(|pair| pair == "alt=sse");
    match (method, agent_turn) {
        ("streamGenerateContent", Some(turn)) if sse => {
            let events: String = gemini::turn_chunks(&turn)
                .iter()
                .map(|chunk| format!("data: {chunk}\r\n\r\n"))
                .collect();
            full(StatusCode::OK, "text/event-stream", events)
        }
        ("streamGenerateContent", Some(turn)) => full(
            StatusCode::OK,
            "application/json",
            json!([turn]).to_string(),
        ),
        (_, Some(turn)) => full(StatusCode::OK, "application/json", turn.to_string()),
        ("streamGenerateContent", None) if sse => {
            let events: String = gemini::stream_chunks(by)
                .iter()
                .map(|chunk| format!("data: {chunk}\r\n\r\n"))
                .collect();
            full(StatusCode::OK, "text/event-stream", events)
        }
        ("streamGenerateContent", None) => {
            let array = Value::Array(gemini::stream_chunks(by));
            full(StatusCode::OK, "application/json", array.to_string())
        }
        _ => full(
            StatusCode::OK,
            "application/json",
            gemini::answer(by, body).to_string(),
        ),
    }
}

fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

fn stream_events(
    id: &str,
    model: &str,
    reply: &Reply,
    chunks: usize,
    include_usage: bool,
) -> Vec<Bytes> {
    let chunk = |delta: Value, finish: Value| {
        let mut value = json!({
            "id": id, "object": "chat.completion.chunk", "created": CREATED, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        if include_usage {
            value["usage"] = Value::Null;
        }
        sse(&value)
    };
    let mut events = Vec::with_capacity(chunks + 3);
    let (finish, chars) = match reply {
        Reply::Text(text) => {
            let pieces = split_text(text, chunks);
            for (i, piece) in pieces.iter().enumerate() {
                let delta = if i == 0 {
                    json!({"role": "assistant", "content": piece})
                } else {
                    json!({"content": piece})
                };
                events.push(chunk(delta, Value::Null));
            }
            ("stop", text.len())
        }
        Reply::ToolCall { name, arguments } => {
            events.push(chunk(
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"index": 0, "id": "call_mock_1", "type": "function", "function": {"name": name, "arguments": ""}}
                ]}),
                Value::Null,
            ));
            for piece in split_text(arguments, chunks.saturating_sub(1).max(1)) {
                events.push(chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                    Value::Null,
                ));
            }
            ("tool_calls", arguments.len())
        }
    };
    events.push(chunk(json!({}), json!(finish)));
    if include_usage {
        let value = json!({
            "id": id, "object": "chat.completion.chunk", "created": CREATED, "model": model,
            "choices": [], "usage": usage(&Value::Null, chars),
        });
        events.push(sse(&value));
    }
    events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    events
}

/// A Responses API `response` object with one assistant message holding `text`.
fn response_json(id: &str, model: &str, text: &str, status: &str) -> Value {
    let output = if status == "completed" {
        json!([response_message(id, text, "completed")])
    } else {
        json!([])
    };
    json!({
        "id": format!("resp_{id}"), "object": "response", "created_at": CREATED,
        "status": status, "error": null, "incomplete_details": null, "instructions": null,
        "max_output_tokens": null, "model": model, "output": output,
        "parallel_tool_calls": true, "previous_response_id": null, "reasoning": {"effort": null, "summary": null},
        "store": false, "temperature": 1.0, "text": {"format": {"type": "text"}},
        "tool_choice": "auto", "tools": [], "top_p": 1.0, "truncation": "disabled",
        "usage": if status == "completed" {
            json!({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                   "output_tokens": (text.len() / 4).max(1), "output_tokens_details": {"reasoning_tokens": 0},
                   "total_tokens": 10 + (text.len() / 4).max(1)})
        } else {
            Value::Null
        },
        "user": null, "metadata": {},
    })
}

fn response_message(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "completed" {
        json!([{"type": "output_text", "text": text, "annotations": []}])
    } else {
        json!([])
    };
    json!({"type": "message", "id": format!("msg_{id}"), "status": status, "role": "assistant", "content": content})
}

/// A typed Responses stream (`event: response.created` … `event: response.completed`), the
/// text in `chunks` deltas.
fn response_events(id: &str, model: &str, text: &str, chunks: usize) -> Vec<Bytes> {
    let mut sequence = 0u64;
    let mut event = |kind: &str, mut data: Value| {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(sequence);
        sequence += 1;
        Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
    };
    let item_id = format!("msg_{id}");
    let mut events = vec![
        event(
            "response.created",
            json!({"response": response_json(id, model, "", "in_progress")}),
        ),
        event(
            "response.in_progress",
            json!({"response": response_json(id, model, "", "in_progress")}),
        ),
        event(
            "response.output_item.added",
            json!({"output_index": 0, "item": response_message(id, "", "in_progress")}),
        ),
        event(
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
        ),
    ];
    for piece in split_text(text, chunks) {
        events.push(event("response.output_text.delta", json!({"item_id": item_id, "output_index": 0, "content_index": 0, "delta": piece, "logprobs": []})));
    }
    events.push(event("response.output_text.done", json!({"item_id": item_id, "output_index": 0, "content_index": 0, "text": text, "logprobs": []})));
    events.push(event("response.content_part.done", json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": []}})));
    events.push(event(
        "response.output_item.done",
        json!({"output_index": 0, "item": response_message(id, text, "completed")}),
    ));
    events.push(event(
        "response.completed",
        json!({"response": response_json(id, model, text, "completed")}),
    ));
    events
}

/// OpenAI's structural checks on a Responses `input`: every call answered and every output
/// answering an earlier call (by `call_id`), a reasoning item followed by the item it produced
/// and carrying its `summary`. Err carries the message and the `param` path.
pub fn validate_items(request: &Value) -> Result<(), (String, String)> {
    let Some(items) = request.get("input").and_then(Value::as_array) else {
        return Ok(());
    };
    let kind = |item: &Value| {
        item.get("type")
            .and_then(Value::as_str)
            .unwrap_or("message")
            .to_string()
    };
    let mut calls: HashMap<String, usize> = HashMap::new();
    let mut answered: std::collections::HashSet<String> = std::collections::HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let call_id = item
            .get("call_id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        match kind(item).as_str() {
            "function_call" | "custom_tool_call" => {
                calls.insert(call_id, i);
            }
            "function_call_output" | "custom_tool_call_output" => {
                if !calls.contains_key(&call_id) {
                    return Err((
                        format!(
                            "No tool call found for function call output with call_id {call_id}."
                        ),
                        format!("input[{i}]"),
                    ));
                }
                answered.insert(call_id);
            }
            "reasoning" => {
                if item.get("summary").is_none() {
                    return Err((
                        format!("Missing required parameter: 'input[{i}].summary'."),
                        format!("input[{i}].summary"),
                    ));
                }
                let produced = items.get(i + 1).map(|next| {
                    let next_kind = kind(next);
                    let role = next
                        .get("role")
                        .and_then(Value::as_str)
                        .unwrap_or("assistant");
                    !(next_kind.ends_with("_output")
                        || next_kind == "reasoning"
                        || (next_kind == "message" && role != "assistant"))
                });
                if produced != Some(true) {
                    let id = item.get("id").and_then(Value::as_str).unwrap_or("");
                    return Err((format!("Item '{id}' of type 'reasoning' was provided without its required following item."), "input".into()));
                }
            }
            _ => {}
        }
    }
    if let Some((call_id, _)) = calls
        .iter()
        .filter(|(id, _)| !answered.contains(*id))
        .min_by_key(|(_, i)| **i)
    {
        return Err((
            format!("No tool output found for function call {call_id}."),
            "input".into(),
        ));
    }
    Ok(())
}

/// Where the first `compaction` item of a Responses `input` is.
fn compaction_item_at(request: &Value) -> Option<usize> {
    request
        .get("input")?
        .as_array()?
        .iter()
        .position(|item| item.get("type").and_then(Value::as_str) == Some("compaction"))
}

/// Splits `text` into `parts` pieces on character boundaries (the last ones may be empty when
/// the text is short, which is still a valid delta).
pub(crate) fn split_text(text: &str, parts: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let parts = parts.max(1);
    let size = chars.len().div_ceil(parts).max(1);
    (0..parts)
        .map(|i| {
            let start = (i * size).min(chars.len());
            let end = ((i + 1) * size).min(chars.len());
            chars[start..end].iter().collect()
        })
        .collect()
}

/// OpenAI's structural checks on `messages`; Err carries the message and the `param` path.
pub fn validate_messages(request: &Value) -> Result<(), (String, String)> {
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        return Err((
            "Missing required parameter: 'messages'.".into(),
            "messages".into(),
        ));
    };
    if messages.is_empty() {
        return Err((
            "Invalid 'messages': empty array. Expected an array with minimum length 1.".into(),
            "messages".into(),
        ));
    }
    let mut pending: Vec<String> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        if !matches!(
            role,
            "system" | "developer" | "user" | "assistant" | "tool" | "function"
        ) {
            return Err((
                format!("Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'."),
                format!("messages[{i}].role"),
            ));
        }
        if role == "tool" {
            let id = message
                .get("tool_call_id")
                .and_then(Value::as_str)
                .unwrap_or("");
            match pending.iter().position(|p| p == id) {
                Some(pos) => {
                    pending.remove(pos);
                }
                None => {
                    return Err((
                        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.".into(),
                        format!("messages.[{i}].role"),
                    ))
                }
            }
            continue;
        }
        if !pending.is_empty() {
            return Err((
                format!("An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}", pending.join(", ")),
                format!("messages.[{i}].role"),
            ));
        }
        if role == "assistant" {
            if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
                pending = calls
                    .iter()
                    .filter_map(|c| c.get("id").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect();
            }
        }
    }
    if !pending.is_empty() {
        return Err((
            format!("An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}", pending.join(", ")),
            "messages".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_follows_openai_rules() {
        let ok = json!({"messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "b"}]},
            {"role": "tool", "tool_call_id": "b", "content": "rb"},
            {"role": "tool", "tool_call_id": "a", "content": "ra"},
            {"role": "user", "content": "q2"}]});
        assert!(validate_messages(&ok).is_ok());
        let orphan = json!({"messages": [{"role": "user"}, {"role": "tool", "tool_call_id": "x"}]});
        assert!(validate_messages(&orphan)
            .unwrap_err()
            .0
            .contains("preceeding"));
        let unanswered = json!({"messages": [
            {"role": "assistant", "tool_calls": [{"id": "a"}]}, {"role": "user"}]});
        assert!(validate_messages(&unanswered).unwrap_err().0.contains("a"));
        let interrupted = json!({"messages": [
            {"role": "assistant", "tool_calls": [{"id": "x"}]}, {"role": "user"},
            {"role": "tool", "tool_call_id": "x"}]});
        assert!(validate_messages(&interrupted).is_err());
    }

    #[test]
    fn split_text_reassembles() {
        let text = "héllo wörld, this is a test";
        for parts in 1..40 {
            assert_eq!(split_text(text, parts).concat(), text);
            assert_eq!(split_text(text, parts).len(), parts);
        }
    }
}
