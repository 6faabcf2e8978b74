//! The summarizer call: an OpenAI-compatible, non-streaming chat completion (or Responses
//! call, `summarizer_api: responses`), or an Anthropic Messages call when the upstream speaks
//! it (`api: anthropic`), made with the upstream's own pooled client and parsed leniently.
//! Behind a trait so the engine can be driven without a network.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request};
use http_body_util::{BodyExt, Limited};
use serde_json::{json, Value};

use crate::body;
use crate::compaction::overflow::{self, Overflow};
use crate::config::{SummarizerApi, UpstreamApi};
use crate::routing::Upstreams;
use crate::usage::UsageTap;

/// One summarizer call: the run's settings and this call's prompt.
#[derive(Debug, Clone)]
pub struct SummaryRequest {
    pub call: SummaryCall,
    pub prompt: String,
}

/// Where and how a run's calls go: everything a call needs but its prompt, the same for
/// every call of one run.
#[derive(Debug, Clone)]
pub struct SummaryCall {
    pub upstream: String,
    pub model: String,
    pub max_tokens: u64,
    pub api: SummarizerApi,
    /// The client's credentials, used when the upstream has no key of its own.
    pub client_authorization: Option<HeaderValue>,
    pub client_api_key: Option<HeaderValue>,
    pub client_x_api_key: Option<HeaderValue>,
    /// The client's `anthropic-version`, for a Messages summarizer (else a default).
    pub anthropic_version: Option<HeaderValue>,
    /// The client's `anthropic-beta`, sent along with its own credential (an OAuth token
    /// needs its beta flag).
    pub anthropic_beta: Option<HeaderValue>,
}

/// The `anthropic-version` a Messages summarizer call sends when the client sent none.
const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SummaryError {
    #[error("summarizer upstream '{0}' is not configured")]
    NoUpstream(String),
    #[error("summarizer call failed: {0}")]
    Transport(String),
    #[error("summarizer answered HTTP {0}")]
    Status(u16),
    /// The summarizer's model refused the prompt for its length (its own context-length
    /// error, read as an upstream's is): its window is learned, and this is not an outage.
    #[error("the summarizer's model refused the prompt as longer than its context window")]
    ContextTooLong(Overflow),
    #[error("summarizer did not answer within {0:?}")]
    Timeout(Duration),
    #[error("summarizer reply has no usable text")]
    Blank,
}

/// A summarizer's answer, and its count of the prompt's tokens when it reported one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub text: String,
    pub input_tokens: Option<u64>,
}

impl From<String> for Summary {
    fn from(text: String) -> Summary {
        Summary {
            text,
            input_tokens: None,
        }
    }
}

pub type SummaryFuture = Pin<Box<dyn Future<Output = Result<Summary, SummaryError>> + Send>>;

pub trait Summarizer: Send + Sync {
    fn summarize(&self, request: SummaryRequest) -> SummaryFuture;
}

/// The real summarizer: POST `{base_url}/chat/completions` on the chosen upstream.
pub struct HttpSummarizer {
    upstreams: Arc<Upstreams>,
    timeout: Duration,
}

/// Replies larger than this are not summaries.
const MAX_REPLY_BYTES: usize = 4 * 1024 * 1024;

impl HttpSummarizer {
    pub fn new(upstreams: Arc<Upstreams>, timeout: Duration) -> HttpSummarizer {
        HttpSummarizer { upstreams, timeout }
    }
}

impl Summarizer for HttpSummarizer {
    fn summarize(&self, request: SummaryRequest) -> SummaryFuture {
        let upstreams = self.upstreams.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, call(&upstreams, &request)).await {
                Ok(result) => result,
                Err(_) => Err(SummaryError::Timeout(timeout)),
            }
        })
    }
}

async fn call(upstreams: &Upstreams, request: &SummaryRequest) -> Result<Summary, SummaryError> {
    let upstream = upstreams
        .by_name(&request.call.upstream)
        .ok_or_else(|| SummaryError::NoUpstream(request.call.upstream.clone()))?;
    let anthropic = upstream.api == UpstreamApi::Anthropic;
    let (path, payload) = match request.call.api {
        _ if anthropic => (
            "/messages",
            json!({
                "model": request.call.model,
                "max_tokens": request.call.max_tokens,
                "messages": [{"role": "user", "content": request.prompt}],
            }),
        ),
        SummarizerApi::ChatCompletions => (
            "/chat/completions",
            json!({
                "model": request.call.model,
                "messages": [{"role": "user", "content": request.prompt}],
                "max_tokens": request.call.max_tokens,
                "stream": false,
            }),
        ),
        // Not stored upstream: the summary is compactor's, not a response the user made.
        SummarizerApi::Responses => (
            "/responses",
            json!({
                "model": request.call.model,
                "input": request.prompt,
                "max_output_tokens": request.call.max_tokens,
                "store": false,
                "stream": false,
            }),
        ),
    };
    let uri = upstream
        .url_for(path, None)
        .map_err(|e| SummaryError::Transport(e.to_string()))?;
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json");
    // The upstream's own key, else the client's credential in the header it came in.
    let client_credentials = [
        (header::AUTHORIZATION, &request.call.client_authorization),
        (crate::headers::X_API_KEY, &request.call.client_x_api_key),
        (crate::headers::API_KEY, &request.call.client_api_key),
    ];
    match upstream.credential() {
        Some((name, value)) => builder = builder.header(name, value.clone()),
        None => {
            if let Some((name, value)) = client_credentials
                .into_iter()
                .find_map(|(name, value)| value.as_ref().map(|value| (name, value)))
            {
                builder = builder.header(name, value.clone());
                if let Some(beta) = request.call.anthropic_beta.as_ref().filter(|_| anthropic) {
                    builder = builder.header("anthropic-beta", beta.clone());
                }
            }
        }
    }
    if anthropic {
        builder = builder.header(
            "anthropic-version",
            request
                .call
                .anthropic_version
                .clone()
                .unwrap_or(HeaderValue::from_static(DEFAULT_ANTHROPIC_VERSION)),
        );
    }
    for (name, value) in upstream.extra_headers() {
        builder = builder.header(name, value.clone());
    }
    let mut http_request = builder
        .body(body::full(Bytes::from(payload.to_string())))
        .map_err(|e| SummaryError::Transport(e.to_string()))?;
    crate::telemetry::inject(http_request.headers_mut());
    let response = upstream
        .client
        .request(http_request)
        .await
        .map_err(|e| SummaryError::Transport(e.to_string()))?;
    let status = response.status();
    let bytes = Limited::new(response.into_body(), MAX_REPLY_BYTES)
        .collect()
        .await
        .map_err(|e| SummaryError::Transport(e.to_string()))?
        .to_bytes();
    if !status.is_success() {
        return Err(match overflow::parse(status.as_u16(), &bytes) {
            Some(overflow) => SummaryError::ContextTooLong(overflow),
            None => SummaryError::Status(status.as_u16()),
        });
    }
    let text = extract_text(&bytes).ok_or(SummaryError::Blank)?;
    let mut usage = UsageTap::default();
    usage.observe(&bytes);
    Ok(Summary {
        text,
        input_tokens: usage.input_total(),
    })
}

/// `choices[0].message.content` as a string or as text parts, a Responses reply's
/// `output_text` parts of its `message` items, or a Messages reply's `text` blocks; blank
/// counts as nothing.
pub fn extract_text(reply: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(reply).ok()?;
    if value.get("type").and_then(Value::as_str) == Some("message") {
        let text: String = value
            .get("content")
            .and_then(Value::as_array)?
            .iter()
            .filter(|block| block.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|block| block.get("text").and_then(Value::as_str))
            .collect();
        let text = text.trim();
        return (!text.is_empty()).then(|| text.to_string());
    }
    if let Some(output) = value.get("output").and_then(Value::as_array) {
        let text: String = output
            .iter()
            .filter(|item| item.get("type").and_then(Value::as_str) == Some("message"))
            .filter_map(|item| item.get("content").and_then(Value::as_array))
            .flatten()
            .filter(|part| part.get("type").and_then(Value::as_str) == Some("output_text"))
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect();
        let text = text.trim();
        return (!text.is_empty()).then(|| text.to_string());
    }
    let content = value.pointer("/choices/0/message/content")?;
    let text = match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => return None,
    };
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_parsed_leniently() {
        assert_eq!(
            extract_text(br#"{"choices":[{"message":{"content":"  sum  "}}]}"#).as_deref(),
            Some("sum")
        );
        assert_eq!(
            extract_text(br#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}"#).as_deref(),
            Some("ab")
        );
        assert_eq!(
            extract_text(br#"{"choices":[{"message":{"content":"   "}}]}"#),
            None
        );
        assert_eq!(extract_text(br#"{"choices":[]}"#), None);
        assert_eq!(extract_text(b"<html>"), None);
        assert_eq!(
            extract_text(br#"{"object":"response","output":[{"type":"reasoning","summary":[]},{"type":"message","content":[{"type":"output_text","text":" s "}]}]}"#).as_deref(),
            Some("s")
        );
        assert_eq!(extract_text(br#"{"object":"response","output":[]}"#), None);
        assert_eq!(
            extract_text(br#"{"type":"message","role":"assistant","content":[{"type":"thinking","thinking":"x"},{"type":"text","text":" s "}]}"#).as_deref(),
            Some("s")
        );
    }
}
