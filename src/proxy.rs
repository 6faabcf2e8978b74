//! The request handler, as its phases: local routes → read or stream the body → route →
//! compact (chat completions only) → build the upstream request → send → respond.
//! Logging happens once, when the response body ends (see [`crate::access_log::LoggedBody`]).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::access_log::{LoggedBody, RequestLog};
use crate::body::{self, ProxyBody, UpstreamBody};
use crate::compaction::engine::{Compacted, CompactionEngine};
use crate::config::Config;
use crate::error::ProxyError;
use crate::headers::{strip_hop_by_hop, strip_own};
use crate::routing::{forwarded_path, model_of, Upstreams};
use crate::upstream::{Upstream, UpstreamSetupError};

/// Everything a request needs, built once at start-up.
pub struct App {
    pub config: Arc<Config>,
    pub upstreams: Arc<Upstreams>,
    pub compaction: Option<CompactionEngine>,
    ready: AtomicBool,
}

impl App {
    pub fn new(config: Config) -> Result<App, UpstreamSetupError> {
        let config = Arc::new(config);
        let upstreams = Arc::new(Upstreams::from_config(&config)?);
        let compaction = config
            .summarization
            .enabled
            .then(|| CompactionEngine::new(config.clone(), upstreams.clone()));
        Ok(App {
            config,
            upstreams,
            compaction,
            ready: AtomicBool::new(false),
        })
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }
}

/// The hyper service: never fails; every error becomes an OpenAI-shaped response.
pub async fn handle(
    app: Arc<App>,
    request: Request<Incoming>,
) -> Result<Response<LoggedBody>, Infallible> {
    let started = Instant::now();
    let mut log = RequestLog {
        method: request.method().to_string(),
        path: request.uri().path().to_string(),
        ..RequestLog::default()
    };
    let response = match proxy(&app, request, &mut log).await {
        Ok(response) => response,
        Err(error) => {
            log.error = Some(error.code());
            if error.fault() != crate::error::Fault::Client {
                tracing::warn!(code = error.code(), "{error}");
            }
            error.into_response()
        }
    };
    log.status = response.status().as_u16();
    Ok(response.map(|b| LoggedBody::new(b, log, started)))
}

async fn proxy(
    app: &App,
    request: Request<Incoming>,
    log: &mut RequestLog,
) -> Result<Response<ProxyBody>, ProxyError> {
    if let Some(response) = local_route(app, &request) {
        return Ok(response);
    }
    let rest = forwarded_path(&app.config.prefix, request.uri().path())
        .ok_or_else(|| ProxyError::NotFound {
            method: request.method().to_string(),
            path: request.uri().path().to_string(),
        })?
        .to_string();
    let query = request.uri().query().map(str::to_string);
    let (parts, incoming) = request.into_parts();
    let is_chat = parts.method == Method::POST && rest == "/chat/completions";
    let compacting = is_chat && app.compaction.is_some();

    let limit = app.config.limits.max_request_body_bytes;
    if declared_length(&parts.headers).is_some_and(|len| len > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let inbound = if is_json_post(&parts.method, &parts.headers)
        && (compacting || app.upstreams.routing_needs_model())
    {
        let bytes = read_body(incoming, limit).await?;
        log.bytes_in = bytes.len() as u64;
        Inbound::Buffered(bytes)
    } else {
        log.bytes_in = declared_length(&parts.headers).unwrap_or(0);
        Inbound::Streaming(incoming)
    };

    // Skimming the model is a pass over the whole body: only paid for when routing needs it
    // (compaction parses the body again anyway, for its own purposes).
    let model = match &inbound {
        Inbound::Buffered(bytes) if app.upstreams.routing_needs_model() => model_of(bytes),
        _ => None,
    };
    log.model = model.clone();
    let upstream = app
        .upstreams
        .route(model.as_deref())
        .ok_or_else(|| ProxyError::NoUpstream(model.clone().unwrap_or_default()))?;
    log.upstream = Some(upstream.name.clone());

    let mut compacted = None;
    let body = match inbound {
        Inbound::Streaming(incoming) => incoming.map_err(Into::into).boxed_unsync(),
        Inbound::Buffered(bytes) => match (&app.compaction, compacting) {
            (Some(engine), true) => {
                let result = engine
                    .compact(&parts.headers, bytes, &upstream.name)
                    .await
                    .map_err(|refused| {
                        log.compaction = Some(refused.outcome);
                        ProxyError::CompactionFailed(refused.failure.to_string())
                    })?;
                let body = body::full(result.body.clone());
                compacted = Some(result);
                body
            }
            _ => body::full(bytes),
        },
    };

    let mut headers = parts.headers;
    if let Some(result) = &compacted {
        if result.rewritten {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(result.body.len()));
        }
    }
    let uri = upstream
        .url_for(&rest, query.as_deref())
        .map_err(|e| ProxyError::Internal(format!("cannot build upstream URL: {e}")))?;
    let upstream_request = upstream.prepare_request(parts.method, uri, headers, body);
    let mut response = send(upstream, upstream_request, compacted.as_ref()).await?;
    if let Some(result) = compacted {
        result.outcome.write_headers(response.headers_mut());
        log.compaction = Some(result.outcome);
    }
    Ok(response)
}

enum Inbound {
    Buffered(Bytes),
    Streaming(Incoming),
}

fn local_route(app: &App, request: &Request<Incoming>) -> Option<Response<ProxyBody>> {
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        return None;
    }
    let (status, text) = match request.uri().path() {
        "/healthz" => (StatusCode::OK, r#"{"status":"ok"}"#),
        "/readyz" if app.ready.load(Ordering::SeqCst) => (StatusCode::OK, r#"{"status":"ready"}"#),
        "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, r#"{"status":"not_ready"}"#),
        _ => return None,
    };
    let mut response = Response::new(body::full(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Some(response)
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

/// Reads a body that must be inspected, bounded by `limit` even when no length was declared.
async fn read_body(incoming: Incoming, limit: u64) -> Result<Bytes, ProxyError> {
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    match Limited::new(incoming, limit_usize).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ProxyError::BodyTooLarge { limit })
        }
        Err(e) => Err(ProxyError::BodyRead(e.to_string())),
    }
}

async fn send(
    upstream: &Upstream,
    request: Request<ProxyBody>,
    compacted: Option<&Compacted>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let response = match tokio::time::timeout(
        upstream.first_byte_timeout,
        upstream.client.request(request),
    )
    .await
    {
        Err(_) => {
            return Err(ProxyError::UpstreamTimeout {
                upstream: upstream.name.clone(),
                secs: upstream.first_byte_timeout.as_secs_f64(),
            })
        }
        Ok(Err(e)) => {
            return Err(ProxyError::UpstreamUnreachable {
                upstream: upstream.name.clone(),
                reason: error_chain(&e),
            })
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
