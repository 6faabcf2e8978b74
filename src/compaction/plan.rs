//! The compaction planner (DESIGN.md §2): pure, no I/O, no clock.
//!
//! Given a parsed request, settings and (through [`SummaryLookup`]) the summary cache, it decides
//! to pass through, to reuse a cached summary, or to summarize a precise set of messages, and
//! which messages stay verbatim and where. Everything it returns is checked again by
//! [`super::rewrite::validate`] before a byte is sent.

use super::conversation::{Conversation, Role};
use super::digest::{prefix_chain, Digest};
use super::skills::{skill_bundles, SkillBundle, SkillRescue};
use super::structure::{validate_layout, Groups, Layout, Split};
use super::tokens::TokenModel;
use crate::config::{ContextSize, SummarizationConfig};

/// The settings the planner reads, in the reference's vocabulary.
#[derive(Debug, Clone)]
pub struct PlanSettings {
    pub triggers: Vec<ContextSize>,
    pub keep: ContextSize,
    /// Compacted request must be under `headroom × threshold` for every trigger.
    pub headroom: Option<f64>,
    /// Size assumed for a summary that does not exist yet (`summary_max_tokens` + framing).
    pub summary_estimate_tokens: u64,
    /// The least a summary must cover to be worth a call: clearly more than the summary itself.
    pub min_span_tokens: u64,
    pub skills: SkillRescue,
}

impl PlanSettings {
    pub fn from_config(config: &SummarizationConfig) -> PlanSettings {
        PlanSettings {
            triggers: config.trigger.to_vec(),
            keep: config.keep,
            headroom: config.headroom,
            // The summary message's framing ("Here is a summary…", role) on top of its text.
            summary_estimate_tokens: config.summary_max_tokens + 16,
            min_span_tokens: config.summary_max_tokens.saturating_mul(3) / 2,
            skills: SkillRescue {
                max_count: config.preserve_recent_skill_count,
                max_tokens: config.preserve_recent_skill_tokens,
                max_tokens_per_skill: config.preserve_recent_skill_tokens_per_skill,
                tool_names: config.skill_file_read_tool_names.clone(),
                container_path: config.skills_container_path.clone(),
            },
        }
    }
}

/// A summary the cache holds for a prefix of this conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedSummary {
    /// The summary covers `messages[head..cut]` less `excluded`.
    pub cut: usize,
    /// Messages inside the summarized range kept verbatim (moved user, rescued groups), in order.
    pub excluded: Vec<usize>,
    /// Which of `excluded` are kept only in part.
    pub splits: Vec<Split>,
    pub text: String,
    /// Estimated tokens of the summary message.
    pub tokens: u64,
}

/// The planner's window on the cache: used only when the request is over a trigger.
pub trait SummaryLookup {
    /// Seeds the prefix chain, so that the chain's digests are the cache keys of one scope
    /// (tenant and summarizer settings) and no further hashing is needed per probe.
    fn chain_seed(&mut self) -> Digest;
    /// The summary cached under a prefix digest.
    fn get(&mut self, prefix: &Digest) -> Option<CachedSummary>;
}

/// No cache: every over-trigger request is summarized from scratch.
pub struct NoCache;

impl SummaryLookup for NoCache {
    fn chain_seed(&mut self) -> Digest {
        [0; 32]
    }
    fn get(&mut self, _: &Digest) -> Option<CachedSummary> {
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Threshold {
    Tokens(u64),
    Messages(u64),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Forward the original bytes.
    PassThrough { reason: &'static str },
    /// Use this cached summary; no summarizer call.
    Reuse {
        layout: Layout,
        summary: CachedSummary,
    },
    /// Summarize `to_summarize` (on top of `previous` when given).
    Summarize {
        layout: Layout,
        to_summarize: Vec<usize>,
        previous: Option<CachedSummary>,
        /// Estimated tokens the new summary replaces: the summarized messages plus the previous
        /// summary. A summary that is not smaller is not worth using.
        replaced_tokens: u64,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub decision: Decision,
    pub tokens_before: u64,
    /// The prefix chain, when the request was over a trigger (for storing a new summary).
    pub chain: Option<Vec<Digest>>,
    pub cache_consulted: bool,
    pub cache_hit: bool,
    /// Each message's token count, when the request was over a trigger.
    pub message_tokens: Vec<u64>,
}

/// Per-request facts every step reads.
struct Analysis {
    tokens: Vec<u64>,
    /// `suffix[i]` = tokens of `messages[i..]`.
    suffix: Vec<u64>,
    pinned_tokens: u64,
    schema_tokens: u64,
    head: usize,
    /// `valid_cut[c]`: no tool-call group has members on both sides of `c`.
    valid_cut: Vec<bool>,
    /// The largest cut that keeps the last group whole.
    max_cut: usize,
    latest_user: Option<usize>,
    thresholds: Vec<Threshold>,
    model: TokenModel,
    skill_bundles: Vec<SkillBundle>,
}

/// Plans one request. `force` compacts even under every trigger (`x-compactor: force`).
pub fn plan(
    conversation: &Conversation<'_>,
    settings: &PlanSettings,
    model: &TokenModel,
    force: bool,
    cache: &mut dyn SummaryLookup,
) -> Plan {
    let tokens = conversation.message_tokens(model);
    let thresholds = thresholds(settings, model, conversation.output_reserve);
    let tokens_before = conversation.schema_tokens(model) + tokens.iter().sum::<u64>();
    let pass = |reason| Plan {
        decision: Decision::PassThrough { reason },
        tokens_before,
        chain: None,
        cache_consulted: false,
        cache_hit: false,
        message_tokens: Vec::new(),
    };
    // Threshold first: under every trigger nothing else is computed and the cache is not read.
    if !force
        && !over_any(
            &thresholds,
            tokens_before,
            conversation.messages.len() as u64,
            1.0,
        )
    {
        return pass("under_trigger");
    }
    let analysis = Analysis::new(conversation, settings, model, tokens, thresholds);
    if analysis.max_cut <= analysis.head {
        return pass("nothing_to_summarize");
    }
    let chain = prefix_chain(&conversation.messages, cache.chain_seed());
    // The longest cached prefix: summaries are only ever stored at valid cuts.
    let cached = (analysis.head + 1..=analysis.max_cut)
        .rev()
        .filter(|&len| analysis.valid_cut[len])
        .find_map(|len| cache.get(&chain[len]).filter(|c| c.cut == len))
        .filter(|c| analysis.usable(c));
    let mut decision = match &cached {
        Some(summary) => analysis.plan_with_cache(settings, summary.clone(), force),
        None => analysis.plan_fresh(settings),
    };
    // A layout whose verbatim messages do not form a valid list (the request itself has an
    // unanswered call or an orphan result) is never worth a summarizer call.
    if let Decision::Summarize { layout, .. } | Decision::Reuse { layout, .. } = &decision {
        if validate_layout(&conversation.messages, layout).is_err() {
            decision = Decision::PassThrough {
                reason: "invalid_tool_structure",
            };
        }
    }
    Plan {
        decision,
        tokens_before,
        cache_hit: cached.is_some(),
        chain: Some(chain),
        cache_consulted: true,
        message_tokens: analysis.tokens,
    }
}

/// Whether the request is over any trigger (threshold-first check, nothing else computed).
pub fn over_trigger(
    conversation: &Conversation<'_>,
    settings: &PlanSettings,
    model: &TokenModel,
) -> (bool, u64) {
    let tokens =
        conversation.schema_tokens(model) + conversation.message_tokens(model).iter().sum::<u64>();
    let thresholds = thresholds(settings, model, conversation.output_reserve);
    (
        over_any(&thresholds, tokens, conversation.messages.len() as u64, 1.0),
        tokens,
    )
}

fn thresholds(settings: &PlanSettings, model: &TokenModel, output_reserve: u64) -> Vec<Threshold> {
    settings
        .triggers
        .iter()
        .filter_map(|size| threshold(*size, model, output_reserve))
        .collect()
}

/// Whether (tokens, messages) reach `factor ×` any threshold (`>=`).
fn over_any(thresholds: &[Threshold], tokens: u64, messages: u64, factor: f64) -> bool {
    thresholds.iter().any(|t| match *t {
        Threshold::Tokens(v) => tokens as f64 >= factor * v as f64,
        Threshold::Messages(v) => messages as f64 >= factor * v as f64,
    })
}

impl Analysis {
    fn new(
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
        let head = messages
            .iter()
            .take_while(|m| m.role.is_instruction())
            .count();
        let pinned_tokens = tokens[..head].iter().sum();

        let groups = Groups::of(messages);
        let latest_user = messages.iter().rposition(|m| m.role == Role::User);
        let skill_bundles = skill_bundles(conversation, &settings.skills, &tokens, &groups);
        Analysis {
            skill_bundles,
            tokens,
            suffix,
            pinned_tokens,
            schema_tokens: conversation.schema_tokens(model),
            head,
            valid_cut: groups.valid_cut,
            max_cut: groups.max_cut,
            latest_user,
            thresholds,
            model: *model,
        }
    }

    fn n(&self) -> usize {
        self.tokens.len()
    }

    fn over_any(&self, tokens: u64, messages: u64, factor: f64) -> bool {
        over_any(&self.thresholds, tokens, messages, factor)
    }

    /// Whether the compacted size satisfies headroom (strictly under `headroom × threshold`);
    /// always, with headroom off (`keep` alone decides, as in the reference).
    fn within_headroom(&self, tokens: u64, messages: u64, headroom: Option<f64>) -> bool {
        match headroom {
            None => true,
            Some(h) => !self.over_any(tokens, messages, h),
        }
    }

    fn usable(&self, cached: &CachedSummary) -> bool {
        cached.cut > self.head
            && cached.cut <= self.max_cut
            && self.valid_cut[cached.cut]
            && cached
                .excluded
                .iter()
                .all(|&i| i >= self.head && i < cached.cut)
    }

    /// (tokens, messages) of `[pinned, summary, excluded…, messages[cut..]]`.
    fn projected(&self, cut: usize, excluded: &[usize], summary_tokens: u64) -> (u64, u64) {
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
    fn keep_cut(&self, keep: ContextSize) -> usize {
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
    fn boundary_at_or_before(&self, raw: usize) -> usize {
        let raw = raw.min(self.max_cut);
        (self.head..=raw)
            .rev()
            .find(|&c| self.valid_cut[c])
            .unwrap_or(self.head)
    }

    fn next_boundary(&self, cut: usize) -> Option<usize> {
        (cut + 1..=self.max_cut).find(|&c| self.valid_cut[c])
    }

    /// The latest user message, when the cut passes it (it then moves to after the summary).
    /// Before `floor` only if `carried` has it (a cached summary cannot be un-summarized).
    fn moved_user(&self, cut: usize, floor: usize, carried: &[usize]) -> Vec<usize> {
        self.latest_user
            .filter(|&u| u >= self.head && u < cut && (u >= floor || carried.contains(&u)))
            .into_iter()
            .collect()
    }

    /// Skill groups inside `[head, cut)` kept verbatim, newest first, within the count, total
    /// and per-skill budgets, one per distinct set of paths, and only while the compacted
    /// request stays under `factor ×` every trigger with them: a rescue never undoes headroom.
    /// Groups before `floor` only if `carried` has them.
    #[allow(clippy::too_many_arguments)]
    fn rescue(
        &self,
        settings: &PlanSettings,
        cut: usize,
        floor: usize,
        carried: &[usize],
        mut excluded: Vec<usize>,
        summary_tokens: u64,
        factor: f64,
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
            if self.over_any(with_tokens, with_messages, factor) {
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
    /// within headroom, then rescues what still fits.
    fn apply_headroom(
        &self,
        settings: &PlanSettings,
        mut cut: usize,
        floor: usize,
        carried: &[usize],
        summary_tokens: u64,
    ) -> Layout {
        loop {
            let (layout, fits) = self.layout_at(settings, cut, floor, carried, summary_tokens);
            match self.next_boundary(cut) {
                Some(next) if !fits => cut = next,
                _ => return layout,
            }
        }
    }

    /// The layout of one cut, and whether it is within headroom.
    fn layout_at(
        &self,
        settings: &PlanSettings,
        cut: usize,
        floor: usize,
        carried: &[usize],
        summary_tokens: u64,
    ) -> (Layout, bool) {
        let moved = self.moved_user(cut, floor, carried);
        let (tokens, messages) = self.projected(cut, &moved, summary_tokens);
        let fits = self.within_headroom(tokens, messages, settings.headroom);
        // Under headroom, rescues must keep it; where even the minimal tail misses it, they may
        // not push the request over a trigger.
        let factor = match settings.headroom {
            Some(h) if fits => h,
            _ => 1.0,
        };
        let (excluded, splits) =
            self.rescue(settings, cut, floor, carried, moved, summary_tokens, factor);
        let (tokens, _) = self.projected(cut, &excluded, summary_tokens);
        let layout = Layout {
            head: self.head,
            cut,
            excluded,
            splits,
            projected_tokens: tokens,
            headroom_unmet: !fits,
        };
        (layout, fits)
    }

    /// Moves the cut on, group by group, until what the summary covers (`new` says which
    /// messages it has not covered before) is clearly larger than the summary itself: a
    /// summary about as large as its span is paid for and thrown away. None when even the
    /// largest cut is too small.
    fn widen_to_span(
        &self,
        settings: &PlanSettings,
        mut layout: Layout,
        floor: usize,
        carried: &[usize],
        new: impl Fn(usize) -> bool,
    ) -> Option<(Layout, Vec<usize>)> {
        loop {
            let to_summarize = layout.summarized(self.head, &new);
            if !to_summarize.is_empty() && self.tokens_of(&to_summarize) >= settings.min_span_tokens
            {
                return Some((layout, to_summarize));
            }
            let next = self.next_boundary(layout.cut)?;
            layout = self
                .layout_at(
                    settings,
                    next,
                    floor,
                    carried,
                    settings.summary_estimate_tokens,
                )
                .0;
        }
    }

    fn plan_fresh(&self, settings: &PlanSettings) -> Decision {
        let start = self.boundary_at_or_before(self.keep_cut(settings.keep));
        let layout = self.apply_headroom(
            settings,
            start,
            self.head,
            &[],
            settings.summary_estimate_tokens,
        );
        if layout.summarized(self.head, |_| true).is_empty() {
            return Decision::PassThrough {
                reason: "nothing_to_summarize",
            };
        }
        let Some((layout, to_summarize)) =
            self.widen_to_span(settings, layout, self.head, &[], |_| true)
        else {
            return Decision::PassThrough {
                reason: "span_too_small",
            };
        };
        Decision::Summarize {
            replaced_tokens: self.tokens_of(&to_summarize),
            layout,
            to_summarize,
            previous: None,
        }
    }

    fn plan_with_cache(
        &self,
        settings: &PlanSettings,
        cached: CachedSummary,
        force: bool,
    ) -> Decision {
        let (tokens, messages) = self.projected(cached.cut, &cached.excluded, cached.tokens);
        let reuse_layout = |headroom_unmet| Layout {
            head: self.head,
            cut: cached.cut,
            excluded: cached.excluded.clone(),
            splits: cached.splits.clone(),
            projected_tokens: tokens,
            headroom_unmet,
        };
        // Sticky boundary: while the compacted request stays under every trigger, reuse.
        if !force && !self.over_any(tokens, messages, 1.0) {
            return Decision::Reuse {
                layout: reuse_layout(false),
                summary: cached,
            };
        }
        let start = self
            .boundary_at_or_before(self.keep_cut(settings.keep))
            .max(cached.cut);
        let layout = self.apply_headroom(
            settings,
            start,
            cached.cut,
            &cached.excluded,
            settings.summary_estimate_tokens,
        );
        let new = |i: usize| {
            i >= cached.cut
                || (cached.excluded.contains(&i) && !cached.splits.iter().any(|s| s.message == i))
        };
        if layout.summarized(self.head, new).is_empty() {
            // Nothing new can be summarized: the cached summary is as far as compaction goes.
            return Decision::Reuse {
                layout: reuse_layout(true),
                summary: cached,
            };
        }
        let Some((layout, to_summarize)) =
            self.widen_to_span(settings, layout, cached.cut, &cached.excluded, new)
        else {
            // Nothing new worth a call: the cached summary is as far as compaction goes.
            return Decision::Reuse {
                layout: reuse_layout(true),
                summary: cached,
            };
        };
        Decision::Summarize {
            replaced_tokens: self.tokens_of(&to_summarize) + cached.tokens,
            layout,
            to_summarize,
            previous: Some(cached),
        }
    }

    fn tokens_of(&self, indices: &[usize]) -> u64 {
        indices.iter().map(|&i| self.tokens[i]).sum()
    }
}

fn threshold(size: ContextSize, model: &TokenModel, output_reserve: u64) -> Option<Threshold> {
    match size {
        ContextSize::Tokens(v) => Some(Threshold::Tokens(v)),
        ContextSize::Messages(v) => Some(Threshold::Messages(v)),
        // Skipped (never failed) when the model's window is unknown.
        ContextSize::Fraction(f) => model.max_input_tokens.map(|window| {
            let usable = window.saturating_sub(output_reserve);
            Threshold::Tokens(((usable as f64 * f).floor() as u64).max(1))
        }),
    }
}
