//! Google's wire (`api: gemini`): the paths that name a Gemini model call, the key header, the
//! error body.

use http::header::HeaderName;
use http::StatusCode;
use serde_json::json;

use super::path::{is_google_path, model_call};
use crate::config::UpstreamApi;
use crate::provider::{ErrorFacts, Provider};

pub struct Gemini;

const X_GOOG_API_KEY: HeaderName = HeaderName::from_static("x-goog-api-key");

impl Provider for Gemini {
    fn family(&self) -> UpstreamApi {
        UpstreamApi::Gemini
    }

    fn owns_path(&self, rest: &str) -> bool {
        is_google_path(rest)
    }

    /// Gemini's paths carry their version (`/v1beta/models/…`): claimed whole, wherever the
    /// listen prefix is.
    fn claims_whole_path(&self, path: &str) -> bool {
        is_google_path(path)
    }

    /// Content generation, streamed or not (not `countTokens` and the like).
    fn generation_label(&self, rest: &str) -> Option<&'static str> {
        model_call(rest)
            .filter(|call| matches!(call.method, "generateContent" | "streamGenerateContent"))
            .map(|_| "gemini")
    }

    fn path_model<'p>(&self, rest: &'p str) -> Option<&'p str> {
        model_call(rest).map(|call| call.model)
    }

    fn credential(&self, key: &str) -> (HeaderName, String) {
        (X_GOOG_API_KEY, key.to_string())
    }

    /// `{"error":{"code","message","status"}}`, the status in Google's words.
    fn error_body(&self, error: &ErrorFacts<'_>) -> serde_json::Value {
        json!({
            "error": {
                "code": error.status.as_u16(),
                "message": error.message,
                "status": status_name(error.status),
            }
        })
    }
}

/// Google's canonical status name for an HTTP status.
fn status_name(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => "INVALID_ARGUMENT",
        StatusCode::UNAUTHORIZED => "UNAUTHENTICATED",
        StatusCode::FORBIDDEN => "PERMISSION_DENIED",
        StatusCode::NOT_FOUND => "NOT_FOUND",
        StatusCode::REQUEST_TIMEOUT | StatusCode::GATEWAY_TIMEOUT => "DEADLINE_EXCEEDED",
        StatusCode::TOO_MANY_REQUESTS => "RESOURCE_EXHAUSTED",
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY => "UNAVAILABLE",
        status if status.is_client_error() => "FAILED_PRECONDITION",
        _ => "INTERNAL",
    }
}
