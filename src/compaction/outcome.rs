//! What compaction did for one request: the response headers and the log fields.

use http::header::{HeaderMap, HeaderValue};

use crate::compaction::planner::tokens::TokenModel;
use crate::compaction::reason::Reason;
use crate::headers;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKind {
    /// Nothing was changed: under every trigger, switched off, or nothing to summarize.
    Skipped,
    /// A summarizer call ran for this request and its result was used.
    Summarized,
    /// A cached summary was used without any summarizer call.
    Reused,
    /// Only old tool outputs were cleared (the `clear_tool_outputs` stage); no summary.
    Cleared,
    /// The oldest messages were dropped to fit the model's window (the `truncate` stage).
    Truncated,
    /// Compaction was needed but could not run; the original request was forwarded.
    Failed,
}

impl OutcomeKind {
    pub fn label(self) -> &'static str {
        match self {
            OutcomeKind::Skipped => "skipped",
            OutcomeKind::Summarized => "summarized",
            OutcomeKind::Reused => "reused",
            OutcomeKind::Cleared => "cleared",
            OutcomeKind::Truncated => "truncated",
            OutcomeKind::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheUse {
    NotConsulted,
    Hit,
    Miss,
}

/// What a request's token counts rest on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountBasis {
    /// The configured chars-per-token ratio.
    Estimate,
    /// The estimate with weights learned from the upstream's own counts of the model.
    Calibrated,
    /// The model's own tokenizer.
    Exact,
}

impl CountBasis {
    pub fn of(model: &TokenModel) -> CountBasis {
        if model.exact.is_some() {
            CountBasis::Exact
        } else if model.calibration.is_some() {
            CountBasis::Calibrated
        } else {
            CountBasis::Estimate
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            CountBasis::Estimate => "estimate",
            CountBasis::Calibrated => "calibrated",
            CountBasis::Exact => "exact",
        }
    }

    /// Whether the count is close enough to the upstream's to refuse a request on it.
    pub fn is_measured(self) -> bool {
        self != CountBasis::Estimate
    }
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub kind: OutcomeKind,
    pub tokens_before: u64,
    pub tokens_after: u64,
    pub messages_summarized: usize,
    pub summarizer_ms: Option<u64>,
    /// Summarized: the share of the evicted tokens the summarizer saw.
    pub coverage: Option<f64>,
    pub cache: CacheUse,
    pub headroom_unmet: bool,
    /// Why compaction was skipped or failed, as a short label for logs.
    pub reason: Reason,
    /// Whether the tokens were counted: a request skipped before its body was read (switched
    /// off, planner busy, under every trigger by its size alone) has no count to report.
    pub counted: bool,
    /// What the counts rest on.
    pub basis: CountBasis,
    /// Tool outputs the `clear_tool_outputs` stage replaced with placeholders.
    pub outputs_cleared: usize,
    /// Messages the `truncate` stage dropped.
    pub messages_dropped: usize,
    /// A summary for this conversation's coming cut was started in the background.
    pub precompute_started: bool,
    /// Summarized: what the summarizer calls read and wrote, in its model's estimated count.
    pub summarizer_usage: Option<SummarizerUsage>,
    /// In audit mode: what enforce would have done (the request went as it came).
    pub audit: Option<Audit>,
}

/// What enforce would have done with a request audit mode forwarded as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Audit {
    /// The outcome enforce would have had (`summarized` when a summary would have been made).
    pub would: OutcomeKind,
    /// The tokens enforce would have forwarded (a summary counted at its largest,
    /// `summary_max_tokens`).
    pub tokens_after: u64,
    /// The summarizer tokens a summary would have cost: its input and its largest answer.
    pub summarizer_tokens: u64,
    /// The message where the upstream's cached prefix would have stopped matching the
    /// previous request's: the first summarized one, when a new summary would have gone in.
    pub prefix_break: Option<usize>,
    /// Whether the summary is being made for real, off the request path (`shadow_sample`).
    pub shadow: bool,
}

/// Tokens a summary cost: the summarizer calls' prompts and answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummarizerUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Outcome {
    pub fn skipped(tokens: u64, reason: Reason) -> Outcome {
        Outcome {
            kind: OutcomeKind::Skipped,
            tokens_before: tokens,
            tokens_after: tokens,
            messages_summarized: 0,
            summarizer_ms: None,
            coverage: None,
            cache: CacheUse::NotConsulted,
            headroom_unmet: false,
            reason,
            counted: true,
            basis: CountBasis::Estimate,
            outputs_cleared: 0,
            messages_dropped: 0,
            precompute_started: false,
            summarizer_usage: None,
            audit: None,
        }
    }

    /// Skipped without counting the request's tokens.
    pub fn uncounted(reason: Reason) -> Outcome {
        Outcome {
            counted: false,
            ..Outcome::skipped(0, reason)
        }
    }

    /// The token estimates, when they were counted.
    pub fn token_counts(&self) -> Option<(u64, u64)> {
        self.counted
            .then_some((self.tokens_before, self.tokens_after))
    }

    pub fn label(&self) -> &'static str {
        self.kind.label()
    }

    /// What the metrics count of it.
    pub fn record(&self) -> crate::metrics::CompactionRecord {
        let changed = matches!(
            self.kind,
            OutcomeKind::Summarized
                | OutcomeKind::Reused
                | OutcomeKind::Cleared
                | OutcomeKind::Truncated
        );
        crate::metrics::CompactionRecord {
            outcome: self.label(),
            reason: self.reason.label(),
            cache_hit: match self.cache {
                CacheUse::Hit => Some(true),
                CacheUse::Miss => Some(false),
                CacheUse::NotConsulted => None,
            },
            outputs_cleared: self.outputs_cleared,
            messages_dropped: self.messages_dropped,
            precompute_started: self.precompute_started,
            tokens_changed: self.token_counts().filter(|_| changed),
            audit: self.audit.map(|audit| crate::metrics::AuditRecord {
                would: audit.would.label(),
                tokens_saved: self.tokens_before.saturating_sub(audit.tokens_after),
                summarizer_tokens: audit.summarizer_tokens,
                prefix_break: audit.prefix_break.is_some(),
                shadow: audit.shadow,
            }),
        }
    }

    pub fn cache_label(&self) -> &'static str {
        match self.cache {
            CacheUse::NotConsulted => "-",
            CacheUse::Hit => "hit",
            CacheUse::Miss => "miss",
        }
    }

    pub fn write_headers(&self, headers: &mut HeaderMap) {
        headers.insert(headers::COMPACTION, HeaderValue::from_static(self.label()));
        if let Some((before, after)) = self.token_counts() {
            headers.insert(headers::TOKENS_BEFORE, HeaderValue::from(before));
            headers.insert(headers::TOKENS_AFTER, HeaderValue::from(after));
            headers.insert(
                headers::TOKENS_COUNT,
                HeaderValue::from_static(self.basis.label()),
            );
        }
        if self.outputs_cleared > 0 {
            headers.insert(
                headers::OUTPUTS_CLEARED,
                HeaderValue::from(self.outputs_cleared),
            );
        }
        if self.messages_dropped > 0 {
            headers.insert(
                headers::MESSAGES_DROPPED,
                HeaderValue::from(self.messages_dropped),
            );
        }
        if let Some(audit) = &self.audit {
            headers.insert(
                headers::AUDIT,
                HeaderValue::from_static(audit.would.label()),
            );
            headers.insert(
                headers::AUDIT_TOKENS_AFTER,
                HeaderValue::from(audit.tokens_after),
            );
            headers.insert(
                headers::AUDIT_SUMMARIZER_TOKENS,
                HeaderValue::from(audit.summarizer_tokens),
            );
            if let Some(at) = audit.prefix_break {
                headers.insert(headers::AUDIT_PREFIX_BREAK, HeaderValue::from(at));
            }
        }
    }
}
