//! The job a summary is made from: the span to summarize, the summarizer's input in chunks,
//! the identifier index, the cache key and what to fall back on.

use super::*;

impl Planner {
    /// A summary to make, with what to fall back on if it cannot be had; when no summary can
    /// bring the request under the model's window, the last resort (or the request as it is).
    pub(super) fn summarize(
        &self,
        context: &Context<'_, '_>,
        plan: &Plan,
        lookup: &mut ScopedLookup<'_>,
        base: Outcome,
        next: Next,
    ) -> Prepared {
        let Decision::Summarize {
            layout,
            to_summarize,
            previous,
            replaced_tokens,
            chain,
        } = &plan.decision
        else {
            return Prepared::Forward {
                outcome: base,
                next,
            };
        };
        // A summary that cannot bring the request under the model's window is not
        // paid for: the last resort, or the request as it is.
        if plan.window.is_some_and(|w| layout.projected_tokens >= w) {
            let reason = context.reason.unwrap_or(Reason::WontFit);
            return match self.truncated(context, plan) {
                Some(truncated) => truncated_body(truncated, Outcome { reason, ..base }, next),
                None => Prepared::Forward {
                    outcome: Outcome {
                        reason: Reason::WontFit,
                        ..base
                    },
                    next,
                },
            };
        }
        let job = self.job(
            context,
            plan,
            layout,
            to_summarize,
            previous,
            *replaced_tokens,
            chain,
            lookup,
        );
        match job {
            Ok(mut job) => {
                job.fallbacks = [
                    self.reused_as_it_stands(context, plan, previous.as_ref()),
                    self.cleared(context, plan),
                    self.truncated(context, plan),
                ]
                .into_iter()
                .flatten()
                .collect();
                Prepared::Summarize(Box::new(job))
            }
            Err((kind, reason)) => Prepared::Forward {
                outcome: Outcome {
                    kind,
                    reason,
                    ..base
                },
                next,
            },
        }
    }

    /// The summarizer job for a planned summary, or why it cannot be made.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn job(
        &self,
        context: &Context<'_, '_>,
        plan: &Plan,
        layout: &Layout,
        to_summarize: &[usize],
        previous: &Option<CachedSummary>,
        replaced_tokens: u64,
        chain: &[Digest],
        lookup: &mut ScopedLookup<'_>,
    ) -> Result<Job, (OutcomeKind, Reason)> {
        let conversation = context.conversation;
        if context.model.is_empty() {
            return Err((OutcomeKind::Skipped, Reason::NoModel));
        }
        let splice = self
            .splice(conversation, layout, &plan.cleared)
            .map_err(|_| (OutcomeKind::Failed, Reason::RewriteInvalid))?;
        // The previous summary's index is compactor's to carry over, not the summarizer's to
        // rewrite: it goes back on after the new summary.
        let (previous_summary, previous_index) = match previous {
            Some(previous) => {
                let (summary, index) = identifiers::split(&previous.text);
                (Some(summary), index)
            }
            None => (None, Vec::new()),
        };
        let identifiers = identifier_index(
            conversation,
            to_summarize,
            &previous_index,
            self.config.identifier_index,
        );
        let input = summary_input::select_cleared(
            conversation,
            to_summarize,
            &plan.message_tokens,
            &plan.cleared,
            previous_summary,
            &InputSettings {
                budget: self.call_budget(&context.upstream, &context.model, context.summary_prompt),
                oversize: self.config.oversize,
                max_calls: self.config.max_summarizer_calls,
                // Each call is sized in the summarizer model's own count (calibrated by its
                // replies, its window learned from its errors).
                model: self
                    .windows
                    .token_model(&context.upstream, Some(&context.model)),
            },
        );
        Ok(Job {
            // The chain was seeded with this request's scope: its digests are cache keys.
            key: chain[layout.cut],
            accounts: context.credentials.accounts(lookup.scope().tenant),
            client_credentials: context.client_credentials,
            splice,
            layout: layout.clone(),
            messages_summarized: to_summarize.len(),
            replaced_tokens,
            coverage: input.coverage(),
            chunks: input.chunks,
            previous: input.previous,
            identifiers,
            model: context.model.clone(),
            upstream: context.upstream.clone(),
            token_model: context.token_model,
            tokens_before: plan.tokens_before,
            cache_hit: plan.cache_hit,
            outputs_cleared: plan.cleared.iter().map(|(_, c)| c.outputs).sum(),
            window: plan.window,
            fallbacks: Vec::new(),
            reason: context.reason,
            ahead_base: None,
            summary_prompt: context.summary_prompt.map(Arc::from),
            dialect: conversation.dialect,
        })
    }
}

/// The identifier index a summary gets: the span's own identifiers, then the previous
/// summary's, at most `max` (none when `max` is 0).
fn identifier_index(
    conversation: &Conversation<'_>,
    to_summarize: &[usize],
    previous_index: &[&str],
    max: usize,
) -> Vec<String> {
    if max == 0 {
        return Vec::new();
    }
    let fresh = identifiers::extract(
        to_summarize
            .iter()
            .map(|&i| conversation.messages[i].raw.get()),
        max,
    );
    identifiers::merged(fresh, previous_index, max)
}
