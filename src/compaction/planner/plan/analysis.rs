//! What the analysis of one conversation answers: its cuts, what a cached summary stands
//! for and whether it may stand in, where a kept tail begins.

use super::*;

impl Analysis {
    pub(super) fn new(
        conversation: &Conversation<'_>,
        settings: &PlanSettings,
        model: &TokenModel,
        tokens: Vec<u64>,
        thresholds: Vec<Threshold>,
    ) -> Self {
        let messages = &conversation.messages;
        let n = messages.len();
        let mut suffix = vec![0u64; n + 1];
        for i in (0..n).rev() {
            suffix[i] = suffix[i + 1] + tokens[i];
        }
        let groups = Groups::of(messages);
        let pinned = &settings.pinned_context;
        let mut head = messages
            .iter()
            .take_while(|m| m.role.is_instruction() || m.opens_with(pinned))
            .count();
        // The provider's own compaction item stands for everything before it, which the
        // provider already replaced: that part stays exactly as the client sent it.
        let latest_compaction = messages
            .iter()
            .rposition(|m| m.opaque.is_some() && m.role_text == "compaction");
        if let Some(at) = latest_compaction.filter(|&at| groups.valid_cut[at + 1]) {
            head = head.max(at + 1);
        }
        let kept_context = (head..n)
            .filter(|&i| {
                let m = &messages[i];
                let system_turn =
                    conversation.dialect.keeps_system_turns() && m.role == Role::System;
                // An instruction the summarizer cannot read (a tool declaration item).
                let opaque_instruction = m.role.is_instruction() && m.opaque.is_some();
                let bound = m.binds_next || (i > 0 && messages[i - 1].binds_next);
                (system_turn || opaque_instruction || m.opens_with(pinned))
                    && !bound
                    && !m.has_tool_calls()
            })
            .collect();
        let pinned_tokens = tokens[..head].iter().sum();

        let latest_user = messages.iter().rposition(|m| m.role == Role::User);
        let skill_bundles = skill_bundles(conversation, &settings.skills, &tokens, &groups);
        let growth = Growth::of(messages, &suffix, head);
        Analysis {
            growth,
            response_growth: growth,
            summary_estimate_tokens: settings.summary_estimate_tokens,
            skill_bundles,
            tokens,
            suffix,
            pinned_tokens,
            schema_tokens: conversation.schema_tokens(model),
            head,
            kept_context,
            valid_cut: groups.valid_cut,
            max_cut: groups.max_cut,
            latest_user,
            thresholds,
            model: *model,
        }
    }

    pub(super) fn n(&self) -> usize {
        self.tokens.len()
    }

    /// The cuts a cached summary may end at (valid, after the pinned head), longest first.
    pub(super) fn candidate_cuts(&self) -> impl Iterator<Item = usize> + '_ {
        (self.head + 1..=self.max_cut)
            .rev()
            .filter(|&c| self.valid_cut[c])
    }

    /// The summary to build on: the longest cached prefix (summaries are only ever stored at
    /// valid cuts). A summary made ahead of need waits until the one in use stops fitting, so
    /// it takes over at the trigger, as the summary made then would.
    pub(super) fn cached(
        &self,
        chain: &[Digest],
        cache: &mut dyn SummaryLookup,
        mode: Mode,
    ) -> Option<CachedSummary> {
        let mut newest = None;
        for len in (self.head + 1..=self.max_cut).rev() {
            if !self.valid_cut[len] {
                continue;
            }
            let Some(summary) = cache
                .get(&chain[len])
                .filter(|c| c.cut == len && self.usable(c))
            else {
                continue;
            };
            let waiting = mode == Mode::Normal && cache.made_ahead(&chain[len]);
            match newest {
                None if waiting => newest = Some(summary),
                None => return Some(summary),
                Some(_) if waiting => {}
                Some(ahead) => {
                    let (tokens, messages) =
                        self.projected(summary.cut, &summary.excluded, summary.tokens);
                    let fits = !self.over(tokens, messages, 1.0, Goal::Now);
                    return Some(if fits { summary } else { ahead });
                }
            }
        }
        newest
    }

    /// What `keep` keeps now so that, once the request has grown to the trigger (`goal`), the
    /// tail is what `keep` would keep then: planning ahead, the growth still to come is taken
    /// off (in messages, at the tail's own size per message).
    pub(super) fn keep_for(&self, keep: ContextSize, goal: Goal) -> ContextSize {
        let Goal::AheadOf { tokens, messages } = goal else {
            return keep;
        };
        let growth = |kind: fn(&Threshold) -> Option<u64>, now: u64| {
            self.thresholds
                .iter()
                .filter_map(kind)
                .map(|v| v.saturating_sub(now))
                .min()
        };
        // As far as the request that crosses the trigger: one request's growth past it.
        let growth_tokens = growth(
            |t| matches!(t, Threshold::Tokens(_)).then_some(t.value()),
            tokens,
        )
        .map(|g| g + self.growth.tokens);
        let growth_messages = growth(
            |t| matches!(t, Threshold::Messages(_)).then_some(t.value()),
            messages,
        )
        .map(|g| g + self.growth.messages);
        let recent = self.n().saturating_sub(self.head).clamp(1, 20);
        let per_message = (self.suffix[self.n() - recent] / recent as u64).max(1);
        let coming = [growth_messages, growth_tokens.map(|g| g / per_message)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(0);
        let coming_tokens = growth_tokens.unwrap_or(coming * per_message);
        match keep {
            ContextSize::Messages(count) => ContextSize::Messages(count.saturating_sub(coming)),
            ContextSize::Tokens(budget) => {
                ContextSize::Tokens(budget.saturating_sub(coming_tokens))
            }
            ContextSize::Fraction(f) => match self.model.max_input_tokens {
                Some(window) => {
                    ContextSize::Tokens(((window as f64 * f) as u64).saturating_sub(coming_tokens))
                }
                None => ContextSize::Messages(20u64.saturating_sub(coming)),
            },
        }
    }

    /// The `clear_tool_outputs` stage: every tool output of at least `min_tokens` before the
    /// tail `keep` keeps, except skill reads (instructions the agent still follows, which skill
    /// rescue may keep whole). Counts the cleared copies from then on.
    pub(super) fn clear(
        &mut self,
        conversation: &Conversation<'_>,
        settings: &PlanSettings,
        min_tokens: u64,
    ) -> Cleared {
        let kept_from = self.boundary_at_or_before(self.keep_cut(settings.keep));
        let skill_reads: Vec<usize> = self
            .skill_bundles
            .iter()
            .flat_map(|bundle| bundle.members.iter().copied())
            .collect();
        let candidates = (self.head..kept_from)
            .filter(|i| conversation.messages[*i].role == Role::Tool && !skill_reads.contains(i));
        let cleared = clear_outputs(conversation, candidates, min_tokens, &self.model);
        for (i, message) in &cleared {
            self.tokens[*i] = message.tokens;
        }
        for i in (0..self.n()).rev() {
            self.suffix[i] = self.suffix[i + 1] + self.tokens[i];
        }
        cleared
    }

    /// Whether (tokens, messages) reach `factor ×` any threshold, with each threshold's coming
    /// growth counted in when planning ahead.
    pub(super) fn over(&self, tokens: u64, messages: u64, factor: f64, goal: Goal) -> bool {
        self.over_target(tokens, messages, Target { factor, turns: 0 }, goal)
    }

    /// The least a compacted request keeps under threshold `t`, however fast the conversation
    /// grows, once each of its requests holds several responses (a client sending one request
    /// per user turn, measured between its requests): what cannot be summarized, the summary
    /// and the latest `turns / 2` responses at their own size. Half of headroom held several
    /// whole user turns there and cost a summary every few of them. A client sending one
    /// request per response keeps half of headroom (None here), which holds about that many of
    /// its steps where the floor matters. The two are told apart by messages, not tokens: such
    /// a client changes pace in tokens (a run of large reads, then small ones) but still adds
    /// one response's messages a request. None too before two responses.
    fn verbatim_floor(&self, t: &Threshold, target: Target) -> f64 {
        let per_response = self.response_growth;
        if per_response.messages == 0 || self.growth.messages < 2 * per_response.messages {
            return f64::INFINITY;
        }
        let (per_response, fixed) = match t {
            Threshold::Tokens(_) => (
                per_response.tokens,
                self.pinned_tokens + self.schema_tokens + self.summary_estimate_tokens,
            ),
            Threshold::Messages(_) => (per_response.messages, self.head as u64 + 1),
        };
        let responses = (target.turns / 2).max(1);
        responses.saturating_mul(per_response).saturating_add(fixed) as f64
    }

    /// Whether (tokens, messages) reach any threshold's `target`, with each threshold's coming
    /// growth counted in when planning ahead.
    pub(super) fn over_target(
        &self,
        tokens: u64,
        messages: u64,
        target: Target,
        goal: Goal,
    ) -> bool {
        if target.turns == 0 && goal == Goal::Now {
            return over_any(&self.thresholds, tokens, messages, target.factor);
        }
        self.thresholds.iter().any(|t| {
            let (measure, per_turn) = match t {
                Threshold::Tokens(_) => (tokens, self.growth.tokens),
                Threshold::Messages(_) => (messages, self.growth.messages),
            };
            // A summary made ahead is taken up by the request that crosses the trigger, which
            // is past it by up to one request's growth: planned for the trigger alone, it
            // would be taken up larger than one made then, and reused for fewer turns.
            let coming = match goal {
                Goal::Now => 0,
                Goal::AheadOf {
                    tokens: now_tokens,
                    messages: now_messages,
                } => {
                    t.value().saturating_sub(match t {
                        Threshold::Tokens(_) => now_tokens,
                        Threshold::Messages(_) => now_messages,
                    }) + per_turn
                }
            };
            (measure + coming) as f64
                >= target_limit(t.value(), target, per_turn, self.verbatim_floor(t, target))
        })
    }

    /// Ahead of need, the share of the token trigger from which a summary is made: `factor`,
    /// or later where the lead from there would not fit the room a cut leaves; none where not
    /// even one request's lead fits. A summary made ahead cuts no later than its own request's
    /// last group, and what the conversation adds until the request that takes it up (one
    /// request's growth past the trigger) comes on top: past the room an on-demand cut leaves,
    /// it would be taken up larger than a summary made then and reused for fewer turns, one
    /// summary more every few. A conversation whose every request is that large a share of the
    /// trigger waits for its summaries as without `precompute_at`, rather than paying for one
    /// every other turn.
    pub(super) fn ahead_factor(&self, settings: &PlanSettings, factor: f64) -> Option<f64> {
        let trigger = self
            .thresholds
            .iter()
            .filter_map(|t| matches!(t, Threshold::Tokens(_)).then_some(t.value()))
            .min();
        let (Some(trigger), Some(headroom)) = (trigger, settings.headroom) else {
            return Some(factor);
        };
        let growth = self.growth.tokens;
        if growth == 0 || trigger == 0 {
            return Some(factor);
        }
        let target = Target {
            factor: headroom,
            turns: settings.headroom_turns,
        };
        let floor = self.verbatim_floor(&Threshold::Tokens(trigger), target);
        let room = target_limit(trigger, target, growth, floor)
            - settings.summary_estimate_tokens as f64
            - 2.0 * growth as f64;
        (room >= growth as f64).then(|| factor.max(1.0 - room / trigger as f64))
    }

    /// Whether the compacted size satisfies `target` (strictly under it); always, with
    /// headroom off (`keep` alone decides, as in the reference).
    pub(super) fn within(
        &self,
        tokens: u64,
        messages: u64,
        target: Option<Target>,
        goal: Goal,
    ) -> bool {
        match target {
            None => true,
            Some(target) => !self.over_target(tokens, messages, target, goal),
        }
    }

    /// Whether a cached summary fits this request: its cut a valid one, and each message it
    /// keeps back named once, in order, inside the summarized range (an entry that named one
    /// message many times would have it copied as often into the forwarded body).
    pub(super) fn usable(&self, cached: &CachedSummary) -> bool {
        let increasing = |indices: &[usize]| indices.windows(2).all(|pair| pair[0] < pair[1]);
        cached.cut > self.head
            && cached.cut <= self.max_cut
            && self.valid_cut[cached.cut]
            && increasing(&cached.excluded)
            && cached
                .excluded
                .iter()
                .all(|&i| i >= self.head && i < cached.cut)
            && cached
                .splits
                .windows(2)
                .all(|pair| pair[0].message < pair[1].message)
            && cached.splits.iter().all(|split| {
                cached.excluded.binary_search(&split.message).is_ok() && increasing(&split.calls)
            })
            && cached.tokens <= self.replaced_by(cached)
    }

    /// Tokens of what a cached summary stands for (its span less what it kept back): a summary
    /// larger than that would grow the body, whoever signed it.
    pub(super) fn replaced_by(&self, cached: &CachedSummary) -> u64 {
        let span = self.suffix[self.head].saturating_sub(self.suffix[cached.cut]);
        let kept: u64 = cached.excluded.iter().map(|&i| self.tokens[i]).sum();
        span.saturating_sub(kept)
    }

    /// (tokens, messages) of `[pinned, summary, excluded…, messages[cut..]]`.
    pub(super) fn projected(
        &self,
        cut: usize,
        excluded: &[usize],
        summary_tokens: u64,
    ) -> (u64, u64) {
        let excluded_tokens: u64 = excluded.iter().map(|&i| self.tokens[i]).sum();
        let tokens = self.schema_tokens
            + self.pinned_tokens
            + summary_tokens
            + excluded_tokens
            + self.suffix[cut];
        let messages = (self.head + 1 + excluded.len() + (self.n() - cut)) as u64;
        (tokens, messages)
    }

    /// The cut `keep` asks for, before group boundaries.
    pub(super) fn keep_cut(&self, keep: ContextSize) -> usize {
        let n = self.n();
        let by_tokens = |budget: u64| {
            let budget = budget.max(1);
            if self.suffix[self.head] <= budget {
                return self.head;
            }
            // suffix[] is non-increasing: binary search for the first suffix within budget.
            let (mut lo, mut hi) = (self.head, n);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if self.suffix[mid] <= budget {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            // The last message is kept even when it alone is over budget.
            lo.min(n.saturating_sub(1))
        };
        match keep {
            ContextSize::Messages(count) => n.saturating_sub(count as usize).max(self.head),
            ContextSize::Tokens(budget) => by_tokens(budget),
            ContextSize::Fraction(f) => match self.model.max_input_tokens {
                Some(window) => by_tokens((window as f64 * f) as u64),
                // The reference's fallback when no window is known.
                None => n.saturating_sub(20).max(self.head),
            },
        }
    }

    /// The nearest valid cut at or before `raw` (keeping more, never splitting a group).
    pub(super) fn boundary_at_or_before(&self, raw: usize) -> usize {
        let raw = raw.min(self.max_cut);
        (self.head..=raw)
            .rev()
            .find(|&c| self.valid_cut[c])
            .unwrap_or(self.head)
    }

    pub(super) fn next_boundary(&self, cut: usize) -> Option<usize> {
        (cut + 1..=self.max_cut).find(|&c| self.valid_cut[c])
    }

    /// What the cut passes but no summary may hold, in order: the latest user message (it then
    /// moves to after the summary) and the kept context. Before `floor` only if `carried` has
    /// it (a cached summary cannot be un-summarized).
    pub(super) fn kept_in_span(&self, cut: usize, floor: usize, carried: &[usize]) -> Vec<usize> {
        let mut kept: Vec<usize> = self
            .latest_user
            .into_iter()
            .chain(self.kept_context.iter().copied())
            .filter(|&u| u >= self.head && u < cut && (u >= floor || carried.contains(&u)))
            .collect();
        kept.sort_unstable();
        kept.dedup();
        kept
    }
}

/// What a threshold of `value` allows for `target`: `factor ×` it, and with `turns` of
/// `per_turn` growth, the threshold less that room. Room for growth never takes the request
/// below `floor` (what keeps the latest responses verbatim) nor below half of what headroom
/// leaves, whichever is less: past that, a faster conversation would be cut to its latest
/// message and lose the recent steps the model needs more than it needs a longer reuse.
fn target_limit(value: u64, target: Target, per_turn: u64, floor: f64) -> f64 {
    let limit = target.factor * value as f64;
    if target.turns == 0 {
        return limit;
    }
    let room = target.turns.saturating_mul(per_turn) as f64;
    limit.min((value as f64 - room).max(floor.min(limit / 2.0)))
}
