//! OpenAI's wire, for every OpenAI-compatible upstream (`api: openai`): its key as a bearer
//! token, its error body.

use http::header::{self, HeaderName};
use serde_json::json;

use crate::config::UpstreamApi;
use crate::provider::{ErrorFacts, Provider};

pub struct OpenAi;

impl Provider for OpenAi {
    fn family(&self) -> UpstreamApi {
        UpstreamApi::Openai
    }

    /// Every path no other family claims.
    fn owns_path(&self, _rest: &str) -> bool {
        true
    }

    fn credential(&self, key: &str) -> (HeaderName, String) {
        (header::AUTHORIZATION, format!("Bearer {key}"))
    }

    /// `{"error":{"message","type","code","param"}}`.
    fn error_body(&self, error: &ErrorFacts<'_>) -> serde_json::Value {
        json!({
            "error": {
                "message": error.message,
                "type": error.error_type,
                "code": error.code,
                "param": null,
            }
        })
    }
}
