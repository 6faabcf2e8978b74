//! Anthropic's wire (`api: anthropic`): its paths, its key header, its error body.

use http::header::HeaderName;
use http::StatusCode;
use serde_json::json;

use crate::config::UpstreamApi;
use crate::provider::{ErrorFacts, Provider};

pub struct Anthropic;

const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

impl Provider for Anthropic {
    fn family(&self) -> UpstreamApi {
        UpstreamApi::Anthropic
    }

    /// `/messages` and `/messages/count_tokens`.
    fn owns_path(&self, rest: &str) -> bool {
        rest == "/messages" || rest.starts_with("/messages/")
    }

    fn credential(&self, key: &str) -> (HeaderName, String) {
        (X_API_KEY, key.to_string())
    }

    /// `{"type":"error","error":{"type","message"}}`; the code goes in `x-compactor-error`
    /// only. A request over the window is said in Anthropic's words: Claude Code parses
    /// "prompt is too long: N tokens > M maximum" to compact.
    fn error_body(&self, error: &ErrorFacts<'_>) -> serde_json::Value {
        let message = match error.over_window {
            Some((tokens, window)) => {
                format!("prompt is too long: {tokens} tokens > {window} maximum")
            }
            None => error.message.to_string(),
        };
        json!({"type": "error", "error": {"type": error_type(error.status), "message": message}})
    }
}

/// Anthropic's `error.type` for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        status if status.is_client_error() => "invalid_request_error",
        _ => "api_error",
    }
}
