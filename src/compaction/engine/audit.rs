//! Audit mode: the whole decision runs (count, trigger, cut, cache lookup) and the request is
//! forwarded as it came, with what enforce would have done in its outcome ([`Audit`]): the
//! headers, the metrics and the access log say it. No summarizer call is made, except for the
//! `shadow_sample` share of the conversations a summary would be made for: those are made off
//! the request path, so enforce starts with a warm cache.

use super::*;
use crate::compaction::outcome::Audit;
use crate::compaction::prepare::Job;

impl CompactionEngine {
    /// Whether `key`'s requests are audited rather than compacted.
    pub(super) fn audits(&self, key: Option<&str>) -> bool {
        self.inner.planner.mode_for(key) == CompactionMode::Audit
    }

    /// The original body, with what enforce would have done with `prepared`.
    pub(super) fn audited(
        &self,
        prepared: Offloaded<Prepared>,
        body: Bytes,
        headers: &HeaderMap,
    ) -> Compacted {
        let outcome = match prepared {
            Offloaded::Done(Prepared::Forward { outcome, .. }) => skipped(outcome),
            Offloaded::Done(Prepared::Rewritten { outcome, .. }) => Outcome {
                audit: Some(would(&outcome, outcome.tokens_after, 0, None)),
                ..forwarded_as_it_came(&outcome)
            },
            Offloaded::Done(Prepared::Summarize(job)) => self.audited_summary(*job, headers),
            Offloaded::Busy => Outcome::uncounted(Reason::Busy),
            Offloaded::Lost => Outcome::uncounted(Reason::InternalError),
        };
        Compacted::original(body, outcome)
    }

    /// A summary enforce would have made: its cost, what it would have saved, where the
    /// cached prefix would have ended; made for real in the background when sampled.
    fn audited_summary(&self, job: Job, headers: &HeaderMap) -> Outcome {
        let config = &self.inner.planner.config;
        let answer = config.summary_max_tokens;
        let summarizer_input: u64 = job
            .chunks
            .iter()
            .map(|chunk| job.token_model.tokens(CharCount::of_str(chunk)))
            .sum();
        let summarizer_tokens = summarizer_input + answer * job.chunks.len() as u64;
        let tokens_after = job
            .tokens_before
            .saturating_sub(job.replaced_tokens)
            .saturating_add(answer);
        let counted = Outcome {
            messages_summarized: job.messages_summarized,
            cache: CacheUse::Miss,
            basis: CountBasis::of(&job.token_model),
            ..Outcome::skipped(job.tokens_before, Reason::Audit)
        };
        let prefix_break = Some(job.layout.head);
        let key = job.key;
        let shadow = sampled(&key, config.audit.shadow_sample)
            && self.in_background(Box::new(job), key, headers);
        let mut audit = would(&counted, tokens_after, summarizer_tokens, prefix_break);
        audit.would = OutcomeKind::Summarized;
        audit.shadow = shadow;
        Outcome {
            audit: Some(audit),
            ..counted
        }
    }
}

/// A request enforce would have left alone too, said so.
pub(super) fn skipped(outcome: Outcome) -> Outcome {
    Outcome {
        audit: Some(would(&outcome, outcome.tokens_after, 0, None)),
        ..outcome
    }
}

/// A rewrite enforce would have forwarded, as audit forwards it: the original, counted.
fn forwarded_as_it_came(outcome: &Outcome) -> Outcome {
    Outcome {
        kind: OutcomeKind::Skipped,
        reason: Reason::Audit,
        tokens_after: outcome.tokens_before,
        messages_summarized: 0,
        outputs_cleared: 0,
        messages_dropped: 0,
        ..outcome.clone()
    }
}

fn would(
    outcome: &Outcome,
    tokens_after: u64,
    summarizer_tokens: u64,
    prefix_break: Option<usize>,
) -> Audit {
    Audit {
        would: outcome.kind,
        tokens_after,
        summarizer_tokens,
        prefix_break,
        shadow: false,
    }
}

/// Whether a conversation is in the `share` of those whose summaries audit makes for real:
/// decided by its summary's key, so a conversation is sampled on every turn or on none.
fn sampled(key: &CacheKey, share: f64) -> bool {
    let mut head = [0u8; 8];
    head.copy_from_slice(&key[..8]);
    (u64::from_le_bytes(head) as f64) < share * u64::MAX as f64
}
