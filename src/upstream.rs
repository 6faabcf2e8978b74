//! One upstream: its pooled client and how a request is built for it (URL mapping, hop-by-hop
//! and control headers, credentials).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, Uri, Version};
use http_body_util::{BodyExt, Either};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use wildmatch::WildMatch;

use std::sync::Arc;

use crate::body::{ProxyBody, UpstreamBody};
use crate::config::{TlsConfig, UpstreamApi, UpstreamConfig};
use crate::error::ProxyError;
use crate::headers::{strip_hop_by_hop, strip_own, CONTROL_HEADERS, CREDENTIALS};
use crate::inbound::BodyFault;
use crate::lean_client::LeanPool;
use crate::notice::Notice;
use crate::provider::Provider;
use crate::telemetry;

pub type HttpClient = Client<HttpsConnector<HttpConnector>, ProxyBody>;

pub struct Upstream {
    pub name: String,
    /// The name as a metrics label (and the log's upstream field): a reference count to copy.
    pub label: Arc<str>,
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    /// The base URL's path without a trailing slash, e.g. `/v1`.
    base_path: String,
    /// The upstream's own key, as the header its API reads it from.
    credential: Option<(HeaderName, HeaderValue)>,
    pub api: UpstreamApi,
    extra_headers: Vec<(HeaderName, HeaderValue)>,
    models: Vec<WildMatch>,
    pub(crate) matches_every_model: bool,
    pub client: HttpClient,
    /// Set for `http://` upstreams: the forwarding path uses it instead of `client`.
    pub lean: Option<Arc<LeanPool>>,
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UpstreamSetupError(pub String);

impl Upstream {
    /// The upstream of `config`, speaking `provider`'s wire.
    pub fn new(
        config: &UpstreamConfig,
        tls: &TlsConfig,
        provider: &dyn Provider,
    ) -> Result<Upstream, UpstreamSetupError> {
        let uri: Uri = config
            .base_url
            .parse()
            .map_err(|e| UpstreamSetupError(format!("{}: base_url: {e}", config.name)))?;
        let parts = uri.into_parts();
        let (Some(scheme), Some(authority)) = (parts.scheme, parts.authority) else {
            return Err(UpstreamSetupError(format!(
                "{}: base_url needs a scheme and a host",
                config.name
            )));
        };
        let base_path = parts
            .path_and_query
            .map(|pq| pq.path().trim_end_matches('/').to_string())
            .unwrap_or_default();
        let credential = match config.api_key.as_ref().filter(|k| !k.is_empty()) {
            Some(key) => {
                let (name, text) = provider.credential(key.expose());
                let mut value = HeaderValue::from_str(&text).map_err(|_| {
                    UpstreamSetupError(format!("{}: api_key is not a valid header", config.name))
                })?;
                value.set_sensitive(true);
                Some((name, value))
            }
            None => None,
        };
        let mut extra_headers = Vec::new();
        for (name, value) in &config.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| UpstreamSetupError(format!("{}: header {name}: {e}", config.name)))?;
            let mut value = HeaderValue::from_str(value.expose())
                .map_err(|e| UpstreamSetupError(format!("{}: header {name}: {e}", config.name)))?;
            value.set_sensitive(true);
            extra_headers.push((name, value));
        }
        let lean = (scheme == http::uri::Scheme::HTTP).then(|| {
            let port = authority.port_u16().unwrap_or(80);
            Arc::new(LeanPool::new(
                format!("{}:{port}", authority.host()),
                Duration::from_secs_f64(config.connect_timeout_secs),
                Duration::from_secs_f64(config.idle_timeout_secs).min(Duration::from_secs(90)),
            ))
        });
        Ok(Upstream {
            lean,
            name: config.name.clone(),
            label: config.name.as_str().into(),
            scheme,
            authority,
            base_path,
            credential,
            api: config.api,
            extra_headers,
            matches_every_model: config.models.iter().any(|m| m == "*"),
            models: config.models.iter().map(|m| WildMatch::new(m)).collect(),
            client: build_client(
                Duration::from_secs_f64(config.connect_timeout_secs),
                Duration::from_secs_f64(config.idle_timeout_secs),
                tls,
            )?,
            first_byte_timeout: Duration::from_secs_f64(config.first_byte_timeout_secs),
            idle_timeout: Duration::from_secs_f64(config.idle_timeout_secs),
        })
    }

    pub fn serves(&self, model: &str) -> bool {
        self.matches_every_model || self.models.iter().any(|m| m.matches(model))
    }

    /// `{base_url}{rest}` with the client's query string kept.
    pub fn url_for(&self, rest: &str, query: Option<&str>) -> Result<Uri, http::Error> {
        let path_and_query = match query {
            Some(q) => format!("{}{}?{}", self.base_path, rest, q),
            None => format!("{}{}", self.base_path, rest),
        };
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path_and_query)
            .build()
    }

    /// The client's request rewritten for this upstream: hop-by-hop and control headers removed,
    /// `Host` left for the client to set from the URL, credentials and extra headers applied.
    pub fn prepare_request(
        &self,
        method: http::Method,
        uri: Uri,
        mut headers: HeaderMap,
        body: ProxyBody,
    ) -> Request<ProxyBody> {
        strip_hop_by_hop(&mut headers);
        headers.remove(header::HOST);
        for name in CONTROL_HEADERS {
            headers.remove(name);
        }
        if let Some((name, value)) = &self.credential {
            // The upstream's key replaces whichever credential the client sent.
            for client_credential in CREDENTIALS {
                headers.remove(client_credential);
            }
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.extra_headers {
            headers.insert(name.clone(), value.clone());
        }
        let mut request = Request::new(body);
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        // The pooled client picks HTTP/1.1 or h2 (by ALPN) per connection, whatever the client used.
        *request.version_mut() = Version::HTTP_11;
        *request.headers_mut() = headers;
        request
    }

    /// The request as a bare HTTP/1.1 connection takes it: path-only target and a `Host`
    /// header (the pooled client derives both from the absolute URL itself).
    pub fn origin_form(&self, mut request: Request<ProxyBody>) -> Request<ProxyBody> {
        if let Ok(host) = HeaderValue::from_str(self.authority.as_str()) {
            request.headers_mut().insert(header::HOST, host);
        }
        let target = request
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
        *request.uri_mut() = Uri::from(target);
        request
    }

    /// The upstream's own key and the header it goes in, for calls compactor makes itself.
    pub fn credential(&self) -> Option<&(HeaderName, HeaderValue)> {
        self.credential.as_ref()
    }

    pub fn extra_headers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.extra_headers
    }
}

fn build_client(
    connect_timeout: Duration,
    idle_timeout: Duration,
    tls: &TlsConfig,
) -> Result<HttpClient, UpstreamSetupError> {
    let mut http = HttpConnector::new();
    // Without NODELAY, Nagle's algorithm holds small writes (SSE frames, small bodies) until the
    // peer's delayed ACK: a ~40 ms stall per exchange.
    http.set_nodelay(true);
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let builder = if tls.native_roots {
        builder
            .with_native_roots()
            .map_err(|e| UpstreamSetupError(format!("tls.native_roots: {e}")))?
    } else {
        builder.with_webpki_roots()
    };
    let connector = builder
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .pool_idle_timeout(idle_timeout.min(Duration::from_secs(90)))
        .build(connector))
}
/// What compaction changed about a request, as sending it needs to know.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rewrite<'n> {
    /// The body's length, when it is not the client's own.
    pub length: Option<usize>,
    /// The notice a 2xx event stream starts with.
    pub notice: Option<&'n Notice>,
    /// The whole body, when it was read before sending: what a retry sends again.
    pub replay: Option<&'n bytes::Bytes>,
}

/// One request on its way to an upstream.
pub struct Target<'u> {
    pub upstream: &'u Upstream,
    pub method: Method,
    pub uri: Uri,
    /// Nanoseconds spent waiting for the upstream's response headers, retries included.
    waited: AtomicU64,
}

impl<'u> Target<'u> {
    pub fn new(upstream: &'u Upstream, method: Method, uri: Uri) -> Target<'u> {
        Target {
            upstream,
            method,
            uri,
            waited: AtomicU64::new(0),
        }
    }

    /// Time spent waiting for response headers, every send together.
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.waited.load(Ordering::Relaxed))
    }

    /// Sends the request and answers with the upstream's response, its body streamed on (with
    /// the notice first, when there is one).
    pub async fn send(
        &self,
        mut headers: HeaderMap,
        body: ProxyBody,
        rewrite: Rewrite<'_>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        if let Some(length) = rewrite.length {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        }
        telemetry::inject(&mut headers);
        // Kept only for a body that can be sent again.
        let again = rewrite.replay.map(|body| (headers.clone(), body.clone()));
        let request =
            self.upstream
                .prepare_request(self.method.clone(), self.uri.clone(), headers, body);
        let started = Instant::now();
        let mut response = send(self.upstream, request, rewrite.notice).await;
        let stale = matches!(response, Err(Failed::Stale(_)));
        if let (true, Some((headers, body))) = (stale, again) {
            // A pooled connection the upstream had closed took the request and answered
            // nothing: no answer began, so it goes once more, on another connection.
            let request = self.upstream.prepare_request(
                self.method.clone(),
                self.uri.clone(),
                headers,
                crate::body::full(body),
            );
            response = send(self.upstream, request, rewrite.notice).await;
        }
        let response = response.map_err(Failed::into_error);
        let waited = started.elapsed().as_nanos() as u64;
        self.waited.fetch_add(waited, Ordering::Relaxed);
        response
    }
}

/// Why a send failed: a connection closed under a request before any answer (which a body
/// read whole may be sent again for), or anything else.
enum Failed {
    Stale(ProxyError),
    Other(ProxyError),
}

impl Failed {
    fn into_error(self) -> ProxyError {
        match self {
            Failed::Stale(error) | Failed::Other(error) => error,
        }
    }
}

/// Whether the connection closed under the request before a byte of the answer came: what a
/// pooled connection the upstream closed while idle does.
fn closed_before_answer(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(error) = source {
        let hyper = match error.downcast_ref::<crate::lean_client::LeanError>() {
            Some(crate::lean_client::LeanError::Http(hyper)) => Some(hyper),
            _ => error.downcast_ref::<hyper::Error>(),
        };
        if hyper.is_some_and(hyper::Error::is_incomplete_message) {
            return true;
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ) {
                return true;
            }
        }
        source = error.source();
    }
    false
}

async fn send(
    upstream: &Upstream,
    request: Request<ProxyBody>,
    notice: Option<&Notice>,
) -> Result<Response<ProxyBody>, Failed> {
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
            return Err(Failed::Other(ProxyError::UpstreamTimeout {
                upstream: upstream.name.clone(),
                secs: upstream.first_byte_timeout.as_secs_f64(),
            }))
        }
        Ok(Err(e)) => {
            // A body the client broke, cut short or sent too slowly surfaces here while it was
            // being streamed on: the client's fault, not the upstream's.
            if let Some(fault) = BodyFault::in_chain(&*e.0) {
                return Err(Failed::Other(ProxyError::from_body_fault(fault)));
            }
            let error = ProxyError::UpstreamUnreachable {
                upstream: upstream.name.clone(),
                reason: error_chain(&*e.0),
            };
            return Err(if closed_before_answer(&*e.0) {
                Failed::Stale(error)
            } else {
                Failed::Other(error)
            });
        }
        Ok(Ok(response)) => response,
    };
    let (mut parts, incoming) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    strip_own(&mut parts.headers);
    let prelude = Notice::for_response(notice, parts.status, &parts.headers);
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
