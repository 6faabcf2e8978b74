//! One upstream: its pooled client and how a request is built for it (URL mapping, hop-by-hop
//! and control headers, credentials).

use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Uri, Version};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use wildmatch::WildMatch;

use std::sync::Arc;

use crate::body::ProxyBody;
use crate::config::{TlsConfig, UpstreamApi, UpstreamConfig};
use crate::headers::{strip_hop_by_hop, CONTROL_HEADERS, CREDENTIALS, X_API_KEY};
use crate::lean_client::LeanPool;

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
    pub fn new(config: &UpstreamConfig, tls: &TlsConfig) -> Result<Upstream, UpstreamSetupError> {
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
                let (name, text) = match config.api {
                    UpstreamApi::Openai => {
                        (header::AUTHORIZATION, format!("Bearer {}", key.expose()))
                    }
                    UpstreamApi::Anthropic => (X_API_KEY, key.expose().to_string()),
                };
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
