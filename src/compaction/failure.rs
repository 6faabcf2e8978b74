//! Why compaction was needed but could not be applied.

use crate::compaction::summaries::budget::Refusal;
use crate::compaction::summaries::summarizer::SummaryError;

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
    /// Every label [`Self::label`] can return, so metrics can start each at zero.
    pub const LABELS: [&'static str; 11] = [
        "summarizer_no_upstream",
        "summarizer_unreachable",
        "summarizer_http_error",
        "summarizer_timeout",
        "summarizer_blank",
        "summary_not_smaller",
        "rewrite_invalid",
        "budget",
        "circuit_open",
        "internal_error",
        "context_too_large",
    ];

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_label_is_listed() {
        let failures = [
            CompactionFailure::Summarizer(SummaryError::NoUpstream("x".into())),
            CompactionFailure::Summarizer(SummaryError::Transport("x".into())),
            CompactionFailure::Summarizer(SummaryError::Status(500)),
            CompactionFailure::Summarizer(SummaryError::Timeout(Duration::ZERO)),
            CompactionFailure::Summarizer(SummaryError::Blank),
            CompactionFailure::NotSmaller,
            CompactionFailure::RewriteInvalid,
            CompactionFailure::Refused(Refusal::Budget),
            CompactionFailure::TooManyCalls { calls: 1, cap: 1 },
            CompactionFailure::Refused(Refusal::CircuitOpen),
            CompactionFailure::Internal,
            CompactionFailure::ContextTooLarge {
                tokens: 1,
                window: 1,
            },
        ];
        for failure in failures {
            assert!(
                CompactionFailure::LABELS.contains(&failure.label()),
                "{failure:?}"
            );
        }
    }
}
