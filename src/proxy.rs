//! The request handler, as its phases: local routes → read or stream the body → route →
//! compact (chat completions, Responses, Messages) → build the upstream request → send → respond.
//! Logging happens once, when the response body ends (see [`crate::access_log::LoggedBody`]).

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either};
use hyper::body::Incoming;
use tracing::Instrument;

use crate::access_log::{LoggedBody, RequestLog};
use crate::app::{App, Current};
use crate::auth::{Auth, AuthFailure, ClientKey};
use crate::body::{self, prefixed, ProxyBody, UpstreamBody};
use crate::compaction::engine::{Compacted, CompactionEngine};
use crate::compaction::failure::CompactionFailure;
use crate::compaction::front_ends::Api;
use crate::compaction::overflow::{self, may_be_overflow};
use crate::compaction::prepare::Reactive;
use crate::compaction::scope::Caller;
use crate::config::WebSocketMode;
use crate::error::{ErrorShape, ProxyError};
use crate::headers::{strip_hop_by_hop, strip_own, CREDENTIALS};
use crate::inbound::{read_whole, BodyFault, BufferBudget, GuardedBody, ReadError};
use crate::metrics::{Metrics, Route};
use crate::routing::{api_of, forwarded_path, model_hint, model_of};
use crate::telemetry;
use crate::upstream::Upstream;

/// The hyper service: never fails; every error becomes an OpenAI-shaped response (an
/// Anthropic-shaped one on the Messages API's paths).
pub async fn handle(
    app: Arc<App>,
    request: Request<Incoming>,
) -> Result<Response<LoggedBody>, Infallible> {
    let started = Instant::now();
    let current = app.current();
    let config = &current.generation.config;
    let shape = ErrorShape::for_path(forwarded_path(&config.prefix, request.uri().path()));
    let span = telemetry::request_span(request.method(), request.uri().path(), request.headers());
    let mut log = RequestLog {
        method: request.method().clone(),
        uri: request.uri().clone(),
        metrics: app.metrics().enabled().then(|| app.metrics_handle()),
        span: (!span.is_none()).then(|| span.clone()),
        ..RequestLog::default()
    };
    let proxied = proxy(&app, &current, request, &mut log)
        .instrument(span)
        .await;
    let response = match proxied {
        Ok(response) => response,
        Err(error) => {
            log.error = Some(error.code());
            if error.fault() != crate::error::Fault::Client {
                tracing::warn!(code = error.code(), "{error}");
            }
            error.into_response(shape)
        }
    };
    log.status = response.status().as_u16();
    log.headers_after = Some(started.elapsed());
    Ok(response.map(|b| LoggedBody::new(b, log, started)))
}

async fn proxy(
    app: &App,
    current: &Current,
    request: Request<Incoming>,
    log: &mut RequestLog,
) -> Result<Response<ProxyBody>, ProxyError> {
    let generation = &current.generation;
    let config = &generation.config;
    if let Some(response) = local_route(app, &request, false) {
        log.route = Route::Local;
        return Ok(response);
    }
    let path = checked_path(&request)?;
    let Some(rest) = forwarded_path(&config.prefix, &path) else {
        // Clients probe the address they were given before using it (Claude Code sends
        // `HEAD /api/hello`): compactor is what answers there.
        if request.method() == Method::HEAD {
            log.route = Route::Local;
            return Ok(Response::new(body::full(Bytes::new())));
        }
        return Err(ProxyError::NotFound {
            method: request.method().to_string(),
            path: request.uri().path().to_string(),
        });
    };
    let rest = rest.to_string();
    let upgrade = is_websocket_upgrade(request.headers());
    if upgrade && config.websocket == WebSocketMode::Refuse {
        return Err(ProxyError::UpgradeRefused);
    }
    let query = request.uri().query().map(str::to_string);
    let (parts, incoming) = request.into_parts();
    let key = authenticate(&generation.auth, &parts.headers)?;
    log.key = key.map(|k| k.name.clone());
    if upgrade {
        return relay_upgrade(
            app,
            current,
            &rest,
            query.as_deref(),
            parts,
            key.is_some(),
            log,
        )
        .await;
    }
    let api = Some(rest.as_str())
        .filter(|_| parts.method == Method::POST)
        .and_then(Api::for_path);
    log.route = api.map_or(Route::Other, Route::Api);
    let compacting = api.is_some() && generation.compaction.is_some();
    let family = api_of(&rest);

    let bounds = generation.bounds;
    let declared = declared_length(&parts.headers);
    if declared.is_some_and(|len| len > bounds.max_bytes) {
        return Err(ProxyError::BodyTooLarge {
            limit: bounds.max_bytes,
        });
    }
    let needs_model =
        current.upstreams.routing_needs_model(family) || key.is_some_and(|k| k.restricts_models());
    let body = GuardedBody::new(incoming, bounds);
    // The reservation is held until the upstream has answered: it bounds the bytes all
    // buffered requests pin.
    let (inbound, _reservation) =
        if is_json_post(&parts.method, &parts.headers) && (compacting || needs_model) {
            let (bytes, reservation) = read_whole(body, declared, app.buffer_budget())
                .await
                .map_err(|e| match e {
                    ReadError::Fault(fault) => ProxyError::from_body_fault(&fault),
                    ReadError::Overloaded(_) => ProxyError::Overloaded("buffered request bytes"),
                })?;
            log.bytes_in = bytes.len() as u64;
            (Inbound::Buffered(bytes), reservation)
        } else {
            log.bytes_in = declared.unwrap_or(0);
            (Inbound::Streaming(body), BufferBudget::empty_reservation())
        };

    // Skimming the model is a pass over the whole body: only paid for when routing or the
    // key's model list needs it (compaction reads the body on its own terms).
    let model = match &inbound {
        Inbound::Buffered(bytes) if needs_model => model_of(bytes),
        _ => None,
    };
    if let (Some(key), Some(model)) = (key, model.as_deref()) {
        if !key.allows_model(model) {
            return Err(ProxyError::ModelNotAllowed(model.to_string()));
        }
    }
    if log.metrics.is_some() && log.route.is_generation() {
        let hint = match (&model, &inbound) {
            (Some(model), _) => Some(model.as_str()),
            (None, Inbound::Buffered(bytes)) => model_hint(bytes),
            (None, Inbound::Streaming(_)) => None,
        };
        log.model_label = hint.and_then(|model| generation.model_labels.label(model));
    }
    log.model = model.clone();
    let upstream = current
        .upstreams
        .route(model.as_deref(), family)
        .ok_or_else(|| ProxyError::NoUpstream(model.clone().unwrap_or_default()))?;
    log.upstream = Some(upstream.label.clone());

    let mut compacted = None;
    let mut retry = None;
    let body = match inbound {
        Inbound::Streaming(body) => body.boxed_unsync(),
        Inbound::Buffered(bytes) => match (&generation.compaction, api) {
            (Some(engine), Some(api)) => {
                let caller = Caller {
                    key: key.map(|k| k.name.as_str()),
                    may_force: match key {
                        Some(key) => key.allow_force,
                        None => config.summarization.allow_force,
                    },
                };
                if config.summarization.reactive {
                    retry = Some((engine, api, caller, bytes.clone()));
                }
                let result = engine
                    .compact(&parts.headers, bytes, &upstream.name, caller, api)
                    .await
                    .map_err(|refused| {
                        log.compaction = Some(*refused.outcome);
                        refused_error(refused.failure)
                    })?;
                let body = body::full(result.body.clone());
                compacted = Some(result);
                body
            }
            _ => body::full(bytes),
        },
    };

    let mut headers = parts.headers;
    if key.is_some() {
        // The client's credential is a compactor key: it never leaves compactor.
        for name in CREDENTIALS {
            headers.remove(name);
        }
    }
    let uri = upstream
        .url_for(&rest, query.as_deref())
        .map_err(|e| ProxyError::Internal(format!("cannot build upstream URL: {e}")))?;
    let target = Target {
        upstream,
        method: parts.method,
        uri,
        waited: AtomicU64::new(0),
    };
    // A retry after a context-length error is sent with the same headers.
    let retry = retry.map(|(engine, api, caller, original)| Retry {
        engine,
        api,
        caller,
        original,
        headers: headers.clone(),
        metrics: app.metrics(),
    });
    let mut response = target.send(headers, body, compacted.as_ref()).await?;
    if let Some(retry) = retry {
        if may_be_overflow(response.status().as_u16()) {
            response = retry
                .after_overflow(&target, response, &mut compacted)
                .await?;
        }
    }
    log.upstream_wait = Duration::from_nanos(target.waited.load(Ordering::Relaxed));
    if let Some(result) = compacted {
        result.outcome.write_headers(response.headers_mut());
        log.compaction = Some(result.outcome);
    }
    Ok(response)
}

/// `websocket: relay`: the upgrade goes to the upstream of the path's API, with the client's
/// credential replaced as on any request.
async fn relay_upgrade(
    app: &App,
    current: &Current,
    rest: &str,
    query: Option<&str>,
    mut parts: http::request::Parts,
    with_key: bool,
    log: &mut RequestLog,
) -> Result<Response<ProxyBody>, ProxyError> {
    let upstream = current
        .upstreams
        .route(None, api_of(rest))
        .ok_or_else(|| ProxyError::NoUpstream(String::new()))?;
    log.upstream = Some(upstream.label.clone());
    if with_key {
        for name in CREDENTIALS {
            parts.headers.remove(name);
        }
    }
    let uri = upstream
        .url_for(rest, query)
        .map_err(|e| ProxyError::Internal(format!("cannot build upstream URL: {e}")))?;
    crate::relay::relay(upstream, uri, parts, app.relay_limits()).await
}

/// The error a client gets when `fail_mode: closed` refuses a request compaction could not fix.
fn refused_error(failure: CompactionFailure) -> ProxyError {
    match failure {
        CompactionFailure::ContextTooLarge { .. } => {
            ProxyError::ContextTooLarge(failure.to_string())
        }
        failure => ProxyError::CompactionFailed(failure.to_string()),
    }
}

/// Where a request goes upstream.
struct Target<'u> {
    upstream: &'u Upstream,
    method: Method,
    uri: http::Uri,
    /// Nanoseconds spent waiting for the upstream's response headers, retries included.
    waited: AtomicU64,
}

impl Target<'_> {
    async fn send(
        &self,
        mut headers: HeaderMap,
        body: ProxyBody,
        compacted: Option<&Compacted>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        if let Some(result) = compacted.filter(|c| c.rewritten) {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(result.body.len()));
        }
        telemetry::inject(&mut headers);
        let request =
            self.upstream
                .prepare_request(self.method.clone(), self.uri.clone(), headers, body);
        let started = Instant::now();
        let response = send(self.upstream, request, compacted).await;
        let waited = started.elapsed().as_nanos() as u64;
        self.waited.fetch_add(waited, Ordering::Relaxed);
        response
    }
}

/// Error bodies larger than this are not a context-length error worth reading.
const OVERFLOW_BODY_LIMIT: usize = 64 * 1024;

/// What a compacted request needs for its one retry after a context-length error.
struct Retry<'e, 'k> {
    engine: &'e CompactionEngine,
    api: Api,
    caller: Caller<'k>,
    /// The client's body as it came.
    original: Bytes,
    /// The headers as sent upstream, before the body's length: the client's own (control
    /// headers included, which the retry's compaction reads), less a compactor key.
    headers: HeaderMap,
    metrics: &'e Metrics,
}

impl Retry<'_, '_> {
    /// `response` is an error: when it is the upstream's context-length error, the request is
    /// compacted under the window it states and sent once more. The client gets the retry's
    /// answer when it succeeds, else the upstream's first error as it came.
    async fn after_overflow(
        self,
        target: &Target<'_>,
        response: Response<ProxyBody>,
        compacted: &mut Option<Compacted>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let (parts, body) = response.into_parts();
        let (error, rest) = read_bounded(body, OVERFLOW_BODY_LIMIT).await;
        let first =
            |error: Bytes, rest| Ok(Response::from_parts(parts.clone(), prefixed(error, rest)));
        let overflow = match &rest {
            Ok(None) => overflow::parse(parts.status.as_u16(), &error),
            _ => None,
        };
        let Some(overflow) = overflow else {
            return first(error, rest);
        };
        let forwarded = compacted.as_ref();
        let reactive = Reactive {
            overflow,
            forwarded_tokens: forwarded
                .and_then(|c| c.outcome.token_counts())
                .map(|(_, after)| after),
        };
        let sent_before = forwarded.map(|c| c.body.clone());
        let retried = self
            .engine
            .compact_after_overflow(
                &self.headers,
                self.original,
                &target.upstream.name,
                self.caller,
                self.api,
                reactive,
            )
            .await;
        let Ok(again) = retried else {
            self.metrics.reactive_retry("unchanged");
            return first(error, rest);
        };
        if !again.rewritten || sent_before.as_ref() == Some(&again.body) {
            self.metrics.reactive_retry("unchanged");
            return first(error, rest);
        }
        tracing::info!(
            upstream = %target.upstream.name,
            "context-length error from the upstream: retrying once, compacted"
        );
        let body = body::full(again.body.clone());
        let second = target.send(self.headers, body, Some(&again)).await;
        match second {
            Ok(response) if response.status().is_success() => {
                self.metrics.reactive_retry("ok");
                *compacted = Some(again);
                Ok(response)
            }
            _ => {
                self.metrics.reactive_retry("failed");
                *compacted = Some(again.refused_on_retry());
                first(error, rest)
            }
        }
    }
}

/// Reads up to `limit` bytes of a body: all of it (and `Ok(None)`), or the bytes read and what
/// is left (`Ok(Some)`), or the bytes read and the error that stopped the reading.
async fn read_bounded(
    mut body: ProxyBody,
    limit: usize,
) -> (Bytes, Result<Option<ProxyBody>, body::BoxError>) {
    let mut read = bytes::BytesMut::new();
    loop {
        if read.len() > limit {
            return (read.freeze(), Ok(Some(body)));
        }
        match body.frame().await {
            None => return (read.freeze(), Ok(None)),
            Some(Err(error)) => return (read.freeze(), Err(error)),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    read.extend_from_slice(data);
                }
            }
        }
    }
}

enum Inbound {
    Buffered(Bytes),
    Streaming(GuardedBody),
}

/// The client key, when auth is on.
fn authenticate<'a>(
    auth: &'a Auth,
    headers: &HeaderMap,
) -> Result<Option<&'a ClientKey>, ProxyError> {
    if !auth.enabled() {
        return Ok(None);
    }
    match auth.authenticate(headers) {
        Ok(key) => Ok(Some(key)),
        Err(AuthFailure::Missing) => Err(ProxyError::MissingKey),
        Err(AuthFailure::Unknown) => Err(ProxyError::UnknownKey),
    }
}

/// What is refused before routing: methods that have no business at an API gateway, more than
/// one `Host`, transfer codings other than chunked, dot segments; `//` runs are collapsed.
fn checked_path(request: &Request<Incoming>) -> Result<String, ProxyError> {
    if matches!(*request.method(), Method::TRACE | Method::CONNECT) {
        return Err(ProxyError::MethodNotAllowed(request.method().to_string()));
    }
    if request.headers().get_all(header::HOST).iter().count() > 1 {
        return Err(ProxyError::BadRequest("more than one Host header".into()));
    }
    for coding in request.headers().get_all(header::TRANSFER_ENCODING) {
        let coding = coding.to_str().unwrap_or("?").trim();
        if !coding.eq_ignore_ascii_case("chunked") {
            return Err(ProxyError::UnsupportedTransferEncoding(coding.to_string()));
        }
    }
    normalized_path(request.uri().path())
}

/// `path` with `//` runs collapsed; a `.` or `..` segment, plain or percent-encoded, is an error
/// rather than something to resolve (no client of an API sends one).
fn normalized_path(path: &str) -> Result<String, ProxyError> {
    let is_dot = |segment: &str| {
        let decoded = segment.replace("%2e", ".").replace("%2E", ".");
        decoded == "." || decoded == ".."
    };
    if path.split('/').any(is_dot) {
        return Err(ProxyError::BadRequest(format!(
            "path '{path}' has a dot segment"
        )));
    }
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// What compactor answers itself: health and readiness, and the metrics unless they have a
/// listener of their own (`admin.listen`). `on_admin` is that listener.
pub fn local_route<B>(
    app: &App,
    request: &Request<B>,
    on_admin: bool,
) -> Option<Response<ProxyBody>> {
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        return None;
    }
    let json = |status: StatusCode, text: &'static str| (status, "application/json", text.into());
    let (status, content_type, text): (StatusCode, &str, String) = match request.uri().path() {
        "/healthz" => json(StatusCode::OK, r#"{"status":"ok"}"#),
        "/readyz" if app.is_ready() => json(StatusCode::OK, r#"{"status":"ready"}"#),
        "/readyz" => json(StatusCode::SERVICE_UNAVAILABLE, r#"{"status":"not_ready"}"#),
        "/metrics"
            if app.metrics().enabled() && (on_admin || app.config().admin.listen.is_none()) =>
        {
            (
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                app.render_metrics(),
            )
        }
        _ => return None,
    };
    let mut response = Response::new(body::full(text));
    *response.status_mut() = status;
    if let Ok(value) = HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    Some(response)
}

fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| {
            v.split(',')
                .any(|p| p.trim().eq_ignore_ascii_case("websocket"))
        })
}

fn is_json_post(method: &Method, headers: &HeaderMap) -> bool {
    method == Method::POST
        && headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                let mime = v
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase();
                mime == "application/json" || mime.ends_with("+json")
            })
            .unwrap_or(false)
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

async fn send(
    upstream: &Upstream,
    request: Request<ProxyBody>,
    compacted: Option<&Compacted>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let sent = match &upstream.lean {
        Some(lean) => {
            let request = upstream.origin_form(request);
            tokio::time::timeout(upstream.first_byte_timeout, lean.send(request))
                .await
                .map(|result| result.map_err(ClientError::from))
                .map(|result| result.map(|response| response.map(Either::Left)))
        }
        None => tokio::time::timeout(
            upstream.first_byte_timeout,
            upstream.client.request(request),
        )
        .await
        .map(|result| result.map_err(ClientError::from))
        .map(|result| result.map(|response| response.map(Either::Right))),
    };
    let response = match sent {
        Err(_) => {
            return Err(ProxyError::UpstreamTimeout {
                upstream: upstream.name.clone(),
                secs: upstream.first_byte_timeout.as_secs_f64(),
            })
        }
        Ok(Err(e)) => {
            // A body the client broke, cut short or sent too slowly surfaces here while it was
            // being streamed on: the client's fault, not the upstream's.
            if let Some(fault) = BodyFault::in_chain(&*e.0) {
                return Err(ProxyError::from_body_fault(fault));
            }
            return Err(ProxyError::UpstreamUnreachable {
                upstream: upstream.name.clone(),
                reason: error_chain(&*e.0),
            });
        }
        Ok(Ok(response)) => response,
    };
    let (mut parts, incoming) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    strip_own(&mut parts.headers);
    let prelude = compacted.and_then(|c| c.notice_for(parts.status, &parts.headers));
    if prelude.is_some() {
        // The notice makes the body longer than the upstream declared.
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    let body = UpstreamBody::new(incoming, upstream.idle_timeout, prelude);
    Ok(Response::from_parts(parts, body.boxed_unsync()))
}

/// Either client's failure, with its source chain intact for [`BodyFault::in_chain`].
struct ClientError(Box<dyn std::error::Error + Send + Sync>);

impl From<crate::lean_client::LeanError> for ClientError {
    fn from(e: crate::lean_client::LeanError) -> Self {
        ClientError(Box::new(e))
    }
}

impl From<hyper_util::client::legacy::Error> for ClientError {
    fn from(e: hyper_util::client::legacy::Error) -> Self {
        ClientError(Box::new(e))
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_collapsed_and_dot_segments_refused() {
        assert_eq!(
            normalized_path("/v1//chat///completions").unwrap(),
            "/v1/chat/completions"
        );
        assert_eq!(normalized_path("/v1/models/").unwrap(), "/v1/models/");
        assert_eq!(normalized_path("/").unwrap(), "/");
        assert_eq!(normalized_path("//").unwrap(), "/");
        for bad in [
            "/v1/../admin",
            "/v1/./models",
            "/v1/%2e%2e/admin",
            "/v1/%2E/x",
            "/v1/.%2e/x",
            "/..",
        ] {
            assert!(normalized_path(bad).is_err(), "{bad}");
        }
        assert_eq!(normalized_path("/v1/a..b/.c").unwrap(), "/v1/a..b/.c");
    }
}
