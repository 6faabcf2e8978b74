//! What a request is sent as when no new summary is made for it: passed through, a cached
//! summary reused, or one of the fallbacks (the request cleared, truncated, or the cached
//! summary as it stands).

use super::*;

impl Planner {
    /// No summary: the request as it came, with its old tool outputs cleared when the stage
    /// cleared any, or cut down by the `truncate` stage when it must be.
    pub(super) fn pass_through(
        &self,
        context: &Context<'_, '_>,
        plan: &Plan,
        base: Outcome,
        next: Next,
    ) -> Prepared {
        if let Some(truncated) = self.truncated(context, plan) {
            return truncated_body(truncated, base, next);
        }
        if plan.cleared.is_empty() {
            return Prepared::Forward {
                outcome: base,
                next,
            };
        }
        Prepared::Rewritten {
            body: apply_cleared(context.body, context.conversation, &plan.cleared),
            summary: None,
            covered: Vec::new(),
            outcome: Outcome {
                kind: OutcomeKind::Cleared,
                tokens_after: plan.tokens_cleared,
                ..base
            },
            notice: false,
            next,
        }
    }

    /// A cached summary spliced in, with no summarizer call.
    pub(super) fn reuse(
        &self,
        context: &Context<'_, '_>,
        plan: &Plan,
        (layout, summary, chain): (&Layout, &CachedSummary, &[Digest]),
        base: Outcome,
        next: Next,
        why: Option<Reason>,
    ) -> Prepared {
        let Ok(splice) = self.splice(context.conversation, layout, &plan.cleared) else {
            let outcome = Outcome {
                kind: OutcomeKind::Failed,
                reason: Reason::RewriteInvalid,
                ..base
            };
            return Prepared::Forward { outcome, next };
        };
        let announce = self.store.local().take_made_ahead(&chain[layout.cut]);
        let reason = match (context.reason.or(why), announce) {
            (Some(reason), _) => reason,
            (None, true) => Reason::Precomputed,
            (None, false) => Reason::Sticky,
        };
        Prepared::Rewritten {
            body: splice.apply(context.body, &summary.text, self.config.summary_role),
            summary: Some(summary.text.clone()),
            covered: splice.covered().to_vec(),
            outcome: Outcome {
                kind: OutcomeKind::Reused,
                tokens_after: layout.projected_tokens,
                cache: CacheUse::Hit,
                headroom_unmet: layout.headroom_unmet,
                reason,
                ..base
            },
            notice: announce,
            next,
        }
    }

    /// Says once per model (the first [`UNREACHABLE_WARNINGS`] models) that its trigger cannot
    /// be reached, and which would be.
    pub(super) fn warn_unreachable(&self, model: &Option<Cow<'_, str>>, bound: u64) {
        let model = model.as_deref().unwrap_or_default();
        let mut warned = lock(&self.warned_unreachable);
        if warned.len() >= UNREACHABLE_WARNINGS || !warned.insert(model.to_string()) {
            return;
        }
        let suggested = bound.div_ceil(1000) * 1000;
        tracing::warn!(
            model,
            reuse_until_tokens = bound,
            suggested_trigger_tokens = suggested,
            "what no summary can take away (system, tools, pinned turns, the latest turn) is over a token trigger: summaries cannot bring requests under it, so the cached summary is reused until requests reach {bound} tokens (outcome reason trigger_unreachable); a trigger of about {suggested} tokens would be reached"
        );
    }

    /// The `truncate` stage's body, when the plan has one.
    pub(super) fn truncated(&self, context: &Context<'_, '_>, plan: &Plan) -> Option<Fallback> {
        let layout = plan.truncation.as_ref()?;
        let splice = self
            .splice(context.conversation, layout, &plan.cleared)
            .ok()?;
        let dropped = layout.summarized(layout.head, |_| true).len();
        Some(Fallback {
            kind: OutcomeKind::Truncated,
            body: splice.apply_omission(context.body, dropped, self.config.summary_role),
            summary: None,
            covered: Vec::new(),
            tokens_after: layout.projected_tokens,
            dropped,
            headroom_unmet: false,
        })
    }

    /// The cached summary a new one would extend, spliced in as it stands.
    pub(super) fn reused_as_it_stands(
        &self,
        context: &Context<'_, '_>,
        plan: &Plan,
        previous: Option<&CachedSummary>,
    ) -> Option<Fallback> {
        let (layout, previous) = (plan.reuse_fallback.as_ref()?, previous?);
        let splice = self
            .splice(context.conversation, layout, &plan.cleared)
            .ok()?;
        // Groups after the summary left out to fit the window: the summary says so at its end.
        let dropped = (previous.cut..layout.cut)
            .filter(|i| !layout.excluded.contains(i))
            .count();
        let text = match dropped {
            0 => Cow::Borrowed(previous.text.as_str()),
            dropped => Cow::Owned(format!("{}\n\n{}", previous.text, omission_text(dropped))),
        };
        Some(Fallback {
            kind: OutcomeKind::Reused,
            body: splice.apply(context.body, &text, self.config.summary_role),
            summary: Some(text.into_owned()),
            covered: splice.covered().to_vec(),
            tokens_after: layout.projected_tokens,
            dropped,
            headroom_unmet: true,
        })
    }

    /// The request with the `clear_tool_outputs` stage's copies, when it cleared any.
    pub(super) fn cleared(&self, context: &Context<'_, '_>, plan: &Plan) -> Option<Fallback> {
        if plan.cleared.is_empty() {
            return None;
        }
        Some(Fallback {
            kind: OutcomeKind::Cleared,
            body: apply_cleared(context.body, context.conversation, &plan.cleared),
            summary: None,
            covered: Vec::new(),
            tokens_after: plan.tokens_cleared,
            dropped: 0,
            headroom_unmet: false,
        })
    }
}
