//! The summarizer call as compaction sees it: what one call asks ([`SummaryRequest`]) and
//! what it answers, behind a trait so the engine can be driven without a network. The real
//! one speaks the summarizer upstream's API (`crate::apis::summarizer`).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use http::HeaderMap;

use crate::compaction::overflow::Overflow;
use crate::config::SummarizerApi;

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
    /// The client's request headers, less its credential when that may not go to the
    /// summarizer upstream; the call takes the credential (when the upstream has no key of its
    /// own) and the headers its API versions requests by.
    pub client_headers: HeaderMap,
}

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
