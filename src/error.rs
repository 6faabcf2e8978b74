//! The one error type of the request path, and the one place its error bodies are built: in
//! OpenAI's shape, or in Anthropic's for the Messages API's paths, so each SDK parses them.
//!
//! Every error compactor itself produces carries `x-compactor-error: <code>` so a user can tell a
//! proxy failure from an upstream failure (upstream error responses pass through untouched).

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use crate::body::ProxyBody;
use crate::provider::{ErrorFacts, Provider};

/// Who caused a failure; decides the log level and, later, whether a retry could help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Client,
    Upstream,
    Internal,
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("no route for {method} {path}")]
    NotFound { method: String, path: String },
    #[error("request body exceeds the limit of {limit} bytes")]
    BodyTooLarge { limit: u64 },
    #[error("could not read the request body: {0}")]
    BodyRead(String),
    #[error("{0}")]
    BodyTimeout(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("method {0} is not allowed")]
    MethodNotAllowed(String),
    /// 426, so the client falls back to HTTP at once; the text says why.
    #[error("{0}")]
    UpgradeRefused(&'static str),
    #[error("transfer coding '{0}' is not supported; send the body plain or chunked")]
    UnsupportedTransferEncoding(String),
    #[error(
        "a valid API key is required: pass it as Authorization: Bearer <key>, x-api-key or x-goog-api-key"
    )]
    MissingKey,
    #[error("incorrect API key provided")]
    UnknownKey,
    #[error("this key may not use model '{0}'")]
    ModelNotAllowed(String),
    #[error("this key may use only some models, and this request's model cannot be read unambiguously ({0}): send one JSON object with a single string `model`")]
    ModelUnclear(&'static str),
    #[error("compactor is at capacity ({0}); retry shortly")]
    Overloaded(&'static str),
    #[error("no upstream is configured for model '{0}'")]
    NoUpstream(String),
    #[error("upstream '{upstream}' is unreachable: {reason}")]
    UpstreamUnreachable { upstream: String, reason: String },
    #[error("upstream '{upstream}' did not answer within {secs}s")]
    UpstreamTimeout { upstream: String, secs: f64 },
    #[error("compaction failed and fail_mode is closed: {0}")]
    CompactionFailed(String),
    /// Over the model's window after every compaction stage (`fail_mode: closed`, or a stream
    /// a server would answer with an empty 200): worded as the providers word it, so clients
    /// that compact on a context error (Codex by its code, Claude Code by its message) do.
    #[error("This model's maximum context length is {window} tokens. However, your request resulted in {tokens} tokens (compactor's count, after every compaction stage). Please reduce the length of the messages.")]
    ContextTooLarge { tokens: u64, window: u64 },
    #[error("a compaction item's encrypted_content was sealed by compactor but does not open for this client: it was altered, made for another tenant, or sealed under a key no longer in sealing.keys")]
    SealedItemRefused,
    #[error("{0}")]
    NativeCompactionFailed(String),
    /// A served compaction the summarizer budget has no call left for (per tenant, or all
    /// calls in flight): the client may retry shortly.
    #[error("compactor's summarizer budget for this client is spent for now (max_calls_per_minute_per_tenant, max_concurrent_calls): nothing was compacted; retry after the time in retry-after")]
    CompactionRateLimited,
    #[error("{0}")]
    Internal(String),
}

/// Why an upgrade is refused: compactor serves the API over HTTP.
pub const UPGRADE_NOT_RELAYED: &str = "compactor serves this API over HTTP: a WebSocket upgrade is refused so that the client falls back to HTTP at once (websocket: relay passes upgrades to the upstream)";
/// Why an upgrade is refused to a key with a model list: a relayed socket is never read, so
/// the model of its frames could not be checked.
pub const UPGRADE_FOR_LIMITED_KEY: &str = "this key may use only some models, which compactor checks on HTTP requests: a WebSocket upgrade is refused so that the client falls back to HTTP at once";

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NotFound { .. } => StatusCode::NOT_FOUND,
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BodyRead(_) | ProxyError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ProxyError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ProxyError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            // 426, not 404: clients (Codex) take it as "use HTTP" and fall back without retrying.
            ProxyError::UpgradeRefused(_) => StatusCode::UPGRADE_REQUIRED,
            ProxyError::UnsupportedTransferEncoding(_) => StatusCode::NOT_IMPLEMENTED,
            ProxyError::MissingKey | ProxyError::UnknownKey => StatusCode::UNAUTHORIZED,
            ProxyError::ModelNotAllowed(_) => StatusCode::FORBIDDEN,
            ProxyError::ModelUnclear(_) => StatusCode::BAD_REQUEST,
            ProxyError::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::NoUpstream(_) => StatusCode::NOT_FOUND,
            ProxyError::UpstreamUnreachable { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::CompactionFailed(_) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::ContextTooLarge { .. } => StatusCode::BAD_REQUEST,
            ProxyError::SealedItemRefused => StatusCode::BAD_REQUEST,
            ProxyError::NativeCompactionFailed(_) => StatusCode::BAD_GATEWAY,
            ProxyError::CompactionRateLimited => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn fault(&self) -> Fault {
        match self {
            ProxyError::NotFound { .. }
            | ProxyError::BodyTooLarge { .. }
            | ProxyError::BodyRead(_)
            | ProxyError::BodyTimeout(_)
            | ProxyError::BadRequest(_)
            | ProxyError::MethodNotAllowed(_)
            | ProxyError::UpgradeRefused(_)
            | ProxyError::UnsupportedTransferEncoding(_)
            | ProxyError::MissingKey
            | ProxyError::UnknownKey
            | ProxyError::ModelNotAllowed(_)
            | ProxyError::ModelUnclear(_)
            | ProxyError::NoUpstream(_)
            | ProxyError::ContextTooLarge { .. }
            | ProxyError::SealedItemRefused
            | ProxyError::CompactionRateLimited => Fault::Client,
            ProxyError::Overloaded(_) => Fault::Internal,
            ProxyError::UpstreamUnreachable { .. }
            | ProxyError::UpstreamTimeout { .. }
            | ProxyError::CompactionFailed(_)
            | ProxyError::NativeCompactionFailed(_) => Fault::Upstream,
            ProxyError::Internal(_) => Fault::Internal,
        }
    }

    /// OpenAI's `error.type`.
    fn error_type(&self) -> &'static str {
        if matches!(self, ProxyError::MissingKey | ProxyError::UnknownKey) {
            return "invalid_request_error";
        }
        match self.fault() {
            Fault::Client => "invalid_request_error",
            Fault::Upstream => "upstream_error",
            Fault::Internal => "server_error",
        }
    }

    /// OpenAI's `error.code`; also the value of [`crate::headers::PROXY_ERROR`] and a low-cardinality log label.
    pub fn code(&self) -> &'static str {
        match self {
            ProxyError::NotFound { .. } => "not_found",
            ProxyError::BodyTooLarge { .. } => "request_too_large",
            ProxyError::BodyRead(_) => "invalid_body",
            ProxyError::BodyTimeout(_) => "request_timeout",
            ProxyError::BadRequest(_) => "invalid_request",
            ProxyError::MethodNotAllowed(_) => "method_not_allowed",
            ProxyError::UpgradeRefused(_) => "websocket_not_supported",
            ProxyError::UnsupportedTransferEncoding(_) => "unsupported_transfer_encoding",
            ProxyError::MissingKey => "missing_api_key",
            ProxyError::UnknownKey => "invalid_api_key",
            ProxyError::ModelNotAllowed(_) => "model_not_allowed",
            ProxyError::ModelUnclear(_) => "model_unclear",
            ProxyError::Overloaded(_) => "overloaded",
            ProxyError::NoUpstream(_) => "model_not_found",
            ProxyError::UpstreamUnreachable { .. } => "upstream_unreachable",
            ProxyError::UpstreamTimeout { .. } => "upstream_timeout",
            ProxyError::CompactionFailed(_) => "compaction_failed",
            ProxyError::ContextTooLarge { .. } => "context_length_exceeded",
            ProxyError::SealedItemRefused => "invalid_compaction_item",
            ProxyError::NativeCompactionFailed(_) => "compaction_failed",
            ProxyError::CompactionRateLimited => "rate_limit_exceeded",
            ProxyError::Internal(_) => "internal_error",
        }
    }

    /// The response a client gets: the error body in the shape of the API the path belongs
    /// to (`provider`'s), the `x-compactor-error` header, a `retry-after` where one applies.
    pub fn into_response(self, provider: &dyn Provider) -> Response<ProxyBody> {
        let message = self.to_string();
        let facts = ErrorFacts {
            status: self.status(),
            message: &message,
            error_type: self.error_type(),
            code: self.code(),
            over_window: match self {
                ProxyError::ContextTooLarge { tokens, window } => Some((tokens, window)),
                _ => None,
            },
        };
        let mut response = json_response(facts.status, provider.error_body(&facts), facts.code);
        match self {
            ProxyError::Overloaded(_) => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            // A call comes free every 2 s at the default 30 calls a minute.
            ProxyError::CompactionRateLimited => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
            }
            _ => {}
        }
        response
    }

    /// The error a client's body fault is answered with.
    pub fn from_body_fault(fault: &crate::inbound::BodyFault) -> ProxyError {
        use crate::inbound::BodyFault;
        match fault {
            BodyFault::TooLarge(limit) => ProxyError::BodyTooLarge { limit: *limit },
            BodyFault::Timeout(_) | BodyFault::TooSlow(_) => {
                ProxyError::BodyTimeout(fault.to_string())
            }
            BodyFault::Invalid(reason) => ProxyError::BodyRead(reason.clone()),
        }
    }
}

fn json_response(status: StatusCode, body: serde_json::Value, code: &str) -> Response<ProxyBody> {
    let bytes = Bytes::from(body.to_string());
    let mut response = Response::new(
        Full::new(bytes)
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(value) = HeaderValue::from_str(code) {
        headers.insert(crate::headers::PROXY_ERROR, value);
    }
    response
}
