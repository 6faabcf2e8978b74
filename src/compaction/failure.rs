//! Why compaction was needed but could not be applied.

use super::budget::Refusal;
use super::summarizer::SummaryError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum CompactionFailure {
    #[error(transparent)]
    Summarizer(#[from] SummaryError),
    #[error("the summary is not smaller than what it replaces")]
    NotSmaller,
    #[error("the rewritten request did not validate")]
    RewriteInvalid,
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(
        "the summary would take {calls} summarizer calls; at most {cap} are allowed per request"
    )]
    TooManyCalls { calls: u64, cap: u64 },
    #[error("the planning task did not complete")]
    Internal,
    #[error(
        "the request is about {tokens} tokens after every compaction stage, over the {window} tokens the model's window leaves for it"
    )]
    ContextTooLarge { tokens: u64, window: u64 },
}

impl CompactionFailure {
    /// A low-cardinality label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            CompactionFailure::Summarizer(SummaryError::NoUpstream(_)) => "summarizer_no_upstream",
            CompactionFailure::Summarizer(SummaryError::Transport(_)) => "summarizer_unreachable",
            CompactionFailure::Summarizer(SummaryError::Status(_)) => "summarizer_http_error",
            CompactionFailure::Summarizer(SummaryError::Timeout(_)) => "summarizer_timeout",
            CompactionFailure::Summarizer(SummaryError::Blank) => "summarizer_blank",
            CompactionFailure::NotSmaller => "summary_not_smaller",
            CompactionFailure::RewriteInvalid => "rewrite_invalid",
            CompactionFailure::Refused(Refusal::Budget) => "budget",
            CompactionFailure::TooManyCalls { .. } => "budget",
            CompactionFailure::Refused(Refusal::CircuitOpen) => "circuit_open",
            CompactionFailure::Internal => "internal_error",
            CompactionFailure::ContextTooLarge { .. } => "context_too_large",
        }
    }
}
