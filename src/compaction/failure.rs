//! Why compaction was needed but could not be applied.

use crate::compaction::reason::Reason;
use crate::compaction::summaries::budget::Refusal;
use crate::compaction::summaries::summarizer::SummaryError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum CompactionFailure {
    #[error(transparent)]
    Summarizer(#[from] SummaryError),
    #[error("the summary is not smaller than what it replaces")]
    NotSmaller,
    #[error("the summarizer's answer repeats its instructions instead of summarizing")]
    EchoedPrompt,
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
    /// Every reason [`Self::reason`] can return, so metrics can start each at zero.
    pub const REASONS: [Reason; 13] = [
        Reason::SummarizerNoUpstream,
        Reason::SummarizerUnreachable,
        Reason::SummarizerHttpError,
        Reason::SummarizerContextTooLong,
        Reason::SummarizerTimeout,
        Reason::SummarizerBlank,
        Reason::SummaryNotSmaller,
        Reason::SummaryEchoedPrompt,
        Reason::RewriteInvalid,
        Reason::Budget,
        Reason::CircuitOpen,
        Reason::InternalError,
        Reason::ContextTooLarge,
    ];

    pub fn reason(&self) -> Reason {
        match self {
            CompactionFailure::Summarizer(SummaryError::NoUpstream(_)) => {
                Reason::SummarizerNoUpstream
            }
            CompactionFailure::Summarizer(SummaryError::Transport(_)) => {
                Reason::SummarizerUnreachable
            }
            CompactionFailure::Summarizer(SummaryError::Status(_)) => Reason::SummarizerHttpError,
            CompactionFailure::Summarizer(SummaryError::ContextTooLong(_)) => {
                Reason::SummarizerContextTooLong
            }
            CompactionFailure::Summarizer(SummaryError::Timeout(_)) => Reason::SummarizerTimeout,
            CompactionFailure::Summarizer(SummaryError::Blank) => Reason::SummarizerBlank,
            CompactionFailure::NotSmaller => Reason::SummaryNotSmaller,
            CompactionFailure::EchoedPrompt => Reason::SummaryEchoedPrompt,
            CompactionFailure::RewriteInvalid => Reason::RewriteInvalid,
            CompactionFailure::Refused(Refusal::Budget) => Reason::Budget,
            CompactionFailure::TooManyCalls { .. } => Reason::Budget,
            CompactionFailure::Refused(Refusal::CircuitOpen) => Reason::CircuitOpen,
            CompactionFailure::Internal => Reason::InternalError,
            CompactionFailure::ContextTooLarge { .. } => Reason::ContextTooLarge,
        }
    }

    /// A low-cardinality label for logs and metrics.
    pub fn label(&self) -> &'static str {
        self.reason().label()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::overflow::Overflow;
    use std::time::Duration;

    #[test]
    fn every_label_is_listed() {
        let failures = [
            CompactionFailure::Summarizer(SummaryError::NoUpstream("x".into())),
            CompactionFailure::Summarizer(SummaryError::Transport("x".into())),
            CompactionFailure::Summarizer(SummaryError::Status(500)),
            CompactionFailure::Summarizer(SummaryError::ContextTooLong(Overflow {
                limit: Some(8),
                input: None,
            })),
            CompactionFailure::Summarizer(SummaryError::Timeout(Duration::ZERO)),
            CompactionFailure::Summarizer(SummaryError::Blank),
            CompactionFailure::NotSmaller,
            CompactionFailure::EchoedPrompt,
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
                CompactionFailure::REASONS.contains(&failure.reason()),
                "{failure:?}"
            );
        }
    }
}
