//! The choice among cuts: a fresh summary or a cached one, skill groups rescued, headroom
//! applied, and truncation when nothing else fits the window.

use super::*;

impl Analysis {
    /// Skill groups inside `[head, cut)` kept verbatim, newest first, within the count, total
    /// and per-skill budgets, one per distinct set of paths, and only while the compacted
    /// request stays under `factor ×` every trigger with them: a rescue never undoes headroom.
    /// Groups before `floor` only if `carried` has them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rescue(
        &self,
        settings: &PlanSettings,
        cut: usize,
        floor: usize,
        carried: &[usize],
        mut excluded: Vec<usize>,
        summary_tokens: u64,
        target: Target,
        goal: Goal,
    ) -> (Vec<usize>, Vec<Split>) {
        let skills = &settings.skills;
        let mut splits = Vec::new();
        let mut seen_keys: Vec<&str> = Vec::new();
        let mut total = 0u64;
        let mut count = 0u64;
        // A bundle adds its members' tokens and count to the projection, nothing else.
        let (mut tokens, mut messages) = self.projected(cut, &excluded, summary_tokens);
        for bundle in self.skill_bundles.iter().rev() {
            if bundle.start >= cut || bundle.start < self.head {
                continue;
            }
            if bundle.start < floor && !carried.contains(&bundle.start) {
                continue;
            }
            if count >= skills.max_count {
                break;
            }
            if seen_keys.contains(&bundle.key.as_str())
                || bundle.tokens > skills.max_tokens_per_skill
                || total + bundle.tokens > skills.max_tokens
            {
                continue;
            }
            let with_tokens = tokens + bundle.tokens;
            let with_messages = messages + bundle.members.len() as u64;
            if self.over_target(with_tokens, with_messages, target, goal) {
                continue;
            }
            (tokens, messages) = (with_tokens, with_messages);
            total += bundle.tokens;
            count += 1;
            seen_keys.push(&bundle.key);
            excluded.extend_from_slice(&bundle.members);
            if let Some(calls) = &bundle.split {
                splits.push(Split {
                    message: bundle.start,
                    calls: calls.clone(),
                });
            }
        }
        excluded.sort_unstable();
        excluded.dedup();
        splits.sort_by_key(|split| split.message);
        (excluded, splits)
    }

    /// Advances `cut` group by group until the compacted request (moved user included) is
    /// within headroom with room for `headroom_turns` of growth (else as far as it goes: the
    /// minimal tail), then rescues what still fits.
    pub(super) fn apply_headroom(
        &self,
        settings: &PlanSettings,
        mut cut: usize,
        floor: usize,
        carried: &[usize],
        goal: Goal,
    ) -> Layout {
        loop {
            let (layout, fits) = self.layout_at(settings, cut, floor, carried, goal);
            match self.next_boundary(cut) {
                Some(next) if !fits => cut = next,
                _ => return layout,
            }
        }
    }

    /// The layout of one cut (with the summary's estimate), and whether it is within headroom
    /// with room for the turns of growth asked for.
    pub(super) fn layout_at(
        &self,
        settings: &PlanSettings,
        cut: usize,
        floor: usize,
        carried: &[usize],
        goal: Goal,
    ) -> (Layout, bool) {
        let summary_tokens = settings.summary_estimate_tokens;
        let moved = self.kept_in_span(cut, floor, carried);
        let (tokens, messages) = self.projected(cut, &moved, summary_tokens);
        let headroom = settings.headroom.map(|factor| Target { factor, turns: 0 });
        let roomy = headroom.map(|target| Target {
            turns: settings.headroom_turns,
            ..target
        });
        let fits = self.within(tokens, messages, headroom, goal);
        let has_room = self.within(tokens, messages, roomy, goal);
        // Rescued skills may spend the room left for growth (the model needs them more than a
        // longer reuse) but must keep headroom; where even the minimal tail misses headroom,
        // they may not push the request over a trigger.
        let target = match headroom {
            Some(headroom) if fits => headroom,
            _ => Target {
                factor: 1.0,
                turns: 0,
            },
        };
        let (excluded, splits) = self.rescue(
            settings,
            cut,
            floor,
            carried,
            moved,
            summary_tokens,
            target,
            goal,
        );
        let (tokens, _) = self.projected(cut, &excluded, summary_tokens);
        let layout = Layout {
            head: self.head,
            cut,
            excluded,
            splits,
            projected_tokens: tokens,
            headroom_unmet: !fits,
        };
        (layout, has_room)
    }

    /// The `truncate` stage's layout: the fewest oldest whole groups after the pinned head
    /// dropped (the latest user message kept, moved up when it falls in the dropped span) so
    /// that the request, with a short note in their place, is under `window`. None when even
    /// the last group alone is not, or the remaining messages do not form a valid list.
    pub(super) fn truncation(
        &self,
        conversation: &Conversation<'_>,
        window: u64,
    ) -> Option<Layout> {
        let mut cut = self.next_boundary(self.head)?;
        loop {
            let moved = self.kept_in_span(cut, self.head, &[]);
            let (tokens, _) = self.projected(cut, &moved, OMISSION_ESTIMATE_TOKENS);
            if tokens < window {
                let layout = Layout {
                    head: self.head,
                    cut,
                    excluded: moved,
                    splits: Vec::new(),
                    projected_tokens: tokens,
                    headroom_unmet: false,
                };
                return validate_layout(&conversation.messages, &layout)
                    .is_ok()
                    .then_some(layout);
            }
            cut = self.next_boundary(cut)?;
        }
    }

    /// Moves the cut on, group by group, until what the summary covers (`new` says which
    /// messages it has not covered before) is clearly larger than the summary itself: a
    /// summary about as large as its span is paid for and thrown away. None when even the
    /// largest cut is too small.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn widen_to_span(
        &self,
        settings: &PlanSettings,
        mut layout: Layout,
        floor: usize,
        carried: &[usize],
        new: impl Fn(usize) -> bool,
        previous_tokens: Option<u64>,
        goal: Goal,
    ) -> Option<(Layout, Vec<usize>)> {
        loop {
            let to_summarize = layout.summarized(self.head, &new);
            if self.worth_summarizing(settings, &to_summarize, previous_tokens, goal) {
                return Some((layout, to_summarize));
            }
            let next = self.next_boundary(layout.cut)?;
            layout = self.layout_at(settings, next, floor, carried, goal).0;
        }
    }

    /// Whether a call for `to_summarize` pays. Over a messages trigger, any span of two or more
    /// messages does: the count is what was asked to shrink, and one summary replaces them.
    /// Otherwise the span must clearly outweigh the summary it becomes (`min_span_tokens`), and
    /// once a summary exists its real size, often well under the ceiling, is that weight.
    pub(super) fn worth_summarizing(
        &self,
        settings: &PlanSettings,
        to_summarize: &[usize],
        previous_tokens: Option<u64>,
        goal: Goal,
    ) -> bool {
        if to_summarize.is_empty() {
            return false;
        }
        // Ahead of need the count is still to come: only the token rule applies there.
        let over_messages = goal == Goal::Now
            && self.thresholds.iter().any(|threshold| match threshold {
                Threshold::Messages(limit) => self.tokens.len() as u64 >= *limit,
                Threshold::Tokens(_) => false,
            });
        if over_messages && to_summarize.len() >= 2 {
            return true;
        }
        let min_span = match previous_tokens {
            Some(previous) => settings.min_span_tokens.min(previous.saturating_mul(3) / 2),
            None => settings.min_span_tokens,
        };
        self.tokens_of(to_summarize) >= min_span
    }

    pub(super) fn plan_fresh(&self, settings: &PlanSettings, goal: Goal) -> Choice {
        let start = self.boundary_at_or_before(self.keep_cut(self.keep_for(settings.keep, goal)));
        let layout = self.apply_headroom(settings, start, self.head, &[], goal);
        if layout.summarized(self.head, |_| true).is_empty() {
            return Choice::PassThrough {
                reason: Reason::NothingToSummarize,
            };
        }
        let Some((layout, to_summarize)) =
            self.widen_to_span(settings, layout, self.head, &[], |_| true, None, goal)
        else {
            return Choice::PassThrough {
                reason: Reason::SpanTooSmall,
            };
        };
        Choice::Summarize {
            replaced_tokens: self.tokens_of(&to_summarize),
            layout,
            to_summarize,
            previous: None,
        }
    }

    pub(super) fn plan_with_cache(
        &self,
        settings: &PlanSettings,
        cached: CachedSummary,
        mode: Mode,
    ) -> Choice {
        let (tokens, messages) = self.projected(cached.cut, &cached.excluded, cached.tokens);
        let reuse_layout = |headroom_unmet| self.reuse_layout(&cached, headroom_unmet);
        // Sticky boundary: while the compacted request stays under every trigger, reuse; ahead
        // of need, while it stays under the share of them that starts a new summary.
        let sticky = match mode {
            Mode::Normal => Some(1.0),
            // With no summary to be made ahead, the one on hand is kept for now.
            Mode::Ahead { factor } => Some(self.ahead_factor(settings, factor).unwrap_or(1.0)),
            Mode::Force => None,
        };
        if sticky.is_some_and(|factor| !self.over(tokens, messages, factor, Goal::Now)) {
            return Choice::Reuse {
                layout: reuse_layout(false),
                summary: cached,
                unreachable: None,
            };
        }
        // A summary made now could not get under the trigger either: it is paid for only once
        // the request has grown as far past what cannot be summarized as headroom allows.
        if mode == Mode::Normal {
            if let Some(bound) = self.unreachable_bound(settings, cached.tokens) {
                if tokens < bound {
                    return Choice::Reuse {
                        layout: reuse_layout(true),
                        summary: cached,
                        unreachable: Some(bound),
                    };
                }
            }
        }
        // Ahead of need, the request as forwarded is the cached layout: it grows from there.
        let goal = match mode {
            Mode::Ahead { .. } => Goal::AheadOf { tokens, messages },
            _ => Goal::Now,
        };
        let start = self
            .boundary_at_or_before(self.keep_cut(self.keep_for(settings.keep, goal)))
            .max(cached.cut);
        let layout = self.apply_headroom(settings, start, cached.cut, &cached.excluded, goal);
        let new = |i: usize| {
            i >= cached.cut
                || (cached.excluded.contains(&i) && !cached.splits.iter().any(|s| s.message == i))
        };
        if layout.summarized(self.head, new).is_empty() {
            // Nothing new can be summarized: the cached summary is as far as compaction goes.
            return Choice::Reuse {
                layout: reuse_layout(true),
                summary: cached,
                unreachable: None,
            };
        }
        let Some((layout, to_summarize)) = self.widen_to_span(
            settings,
            layout,
            cached.cut,
            &cached.excluded,
            new,
            Some(cached.tokens),
            goal,
        ) else {
            // Nothing new worth a call: the cached summary is as far as compaction goes.
            return Choice::Reuse {
                layout: reuse_layout(true),
                summary: cached,
                unreachable: None,
            };
        };
        Choice::Summarize {
            replaced_tokens: self.tokens_of(&to_summarize) + cached.tokens,
            layout,
            to_summarize,
            previous: Some(cached),
        }
    }

    /// When what no summary takes away (the pinned head, the schemas, the context kept
    /// verbatim and the last group, with a summary of `summary_tokens`) is at a token trigger
    /// already, no summary brings a request under it: the size a reused summary may grow to
    /// before another is worth its call (that floor with the room headroom leaves under a
    /// reachable trigger, never past a trigger the floor is still under). None while every
    /// trigger can be reached.
    pub(super) fn unreachable_bound(
        &self,
        settings: &PlanSettings,
        summary_tokens: u64,
    ) -> Option<u64> {
        let kept = self.kept_in_span(self.max_cut, self.head, &[]);
        let (floor, _) = self.projected(self.max_cut, &kept, summary_tokens);
        let headroom = settings.headroom.unwrap_or(UNREACHABLE_HEADROOM);
        let mut bound = (floor as f64 / headroom).ceil() as u64;
        let mut reached = false;
        for threshold in &self.thresholds {
            if let Threshold::Tokens(value) = *threshold {
                if floor >= value {
                    reached = true;
                } else {
                    bound = bound.min(value);
                }
            }
        }
        reached.then_some(bound)
    }

    /// The layout that reuses `cached` when no new summary can be had: as it stands, or, when
    /// that with the tail grown since is over `window`, with the fewest oldest whole groups
    /// after the summary left out so that it fits (a note says so where they were).
    pub(super) fn reuse_within(&self, cached: &CachedSummary, window: Option<u64>) -> Layout {
        let whole = self.reuse_layout(cached, true);
        let Some(window) = window.filter(|&w| whole.projected_tokens >= w) else {
            return whole;
        };
        let summary_tokens = cached.tokens + OMISSION_ESTIMATE_TOKENS;
        let mut cut = cached.cut;
        while let Some(next) = self.next_boundary(cut) {
            cut = next;
            // What no summary may hold (the latest user message, the kept context) stays,
            // moved up to after the summary, as truncation keeps it.
            let mut excluded = cached.excluded.clone();
            excluded.extend(self.kept_in_span(cut, cached.cut, &[]));
            excluded.sort_unstable();
            excluded.dedup();
            let (tokens, _) = self.projected(cut, &excluded, summary_tokens);
            if tokens < window {
                return Layout {
                    head: self.head,
                    cut,
                    excluded,
                    splits: cached.splits.clone(),
                    projected_tokens: tokens,
                    headroom_unmet: true,
                };
            }
        }
        whole
    }

    /// The layout that reuses `cached` as it stands.
    pub(super) fn reuse_layout(&self, cached: &CachedSummary, headroom_unmet: bool) -> Layout {
        let (tokens, _) = self.projected(cached.cut, &cached.excluded, cached.tokens);
        Layout {
            head: self.head,
            cut: cached.cut,
            excluded: cached.excluded.clone(),
            splits: cached.splits.clone(),
            projected_tokens: tokens,
            headroom_unmet,
        }
    }

    pub(super) fn tokens_of(&self, indices: &[usize]) -> u64 {
        indices.iter().map(|&i| self.tokens[i]).sum()
    }
}
