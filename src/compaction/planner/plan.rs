//! The compaction planner (DESIGN.md §2): pure, no I/O, no clock.
//!
//! Given a parsed request, settings and (through [`SummaryLookup`]) the summary cache, it decides
//! to pass through, to reuse a cached summary, or to summarize a precise set of messages, and
//! which messages stay verbatim and where. Everything it returns is checked again by
//! [`crate::compaction::planner::rewrite::validate`] before a byte is sent.

use crate::compaction::planner::clearing::{clear_outputs, Cleared};
use crate::compaction::planner::conversation::{Conversation, Dialect, Message, PinnedText, Role};
use crate::compaction::planner::digest::{prefix_chain, Digest};
use crate::compaction::planner::skills::{skill_bundles, SkillBundle, SkillRescue};
use crate::compaction::planner::structure::{validate_layout, Groups, Layout, Split};
use crate::compaction::planner::tokens::TokenModel;
use crate::compaction::reason::Reason;
use crate::config::{ContextSize, Stage, SummarizationConfig};

/// At most this many prefixes of a conversation are asked of a shared tier (the longest).
pub const MAX_SHARED_PREFIXES: usize = 256;

/// Tokens assumed for the note that takes the place of truncated messages.
pub const OMISSION_ESTIMATE_TOKENS: u64 = 48;

/// The stages a request may go through, cheapest first (`summarization.stages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stages {
    /// `clear_tool_outputs`: outputs of at least this many tokens, outside the kept tail.
    pub clear_min_tokens: Option<u64>,
    pub summarize: bool,
    pub truncate: bool,
}

impl Default for Stages {
    /// Today's behaviour: a summary, nothing else.
    fn default() -> Self {
        Stages {
            clear_min_tokens: None,
            summarize: true,
            truncate: false,
        }
    }
}

impl Stages {
    pub fn from_config(config: &SummarizationConfig) -> Stages {
        let has = |stage| config.stages.contains(&stage);
        Stages {
            clear_min_tokens: has(Stage::ClearToolOutputs)
                .then_some(config.clear_tool_outputs.min_tokens),
            summarize: has(Stage::Summarize),
            truncate: has(Stage::Truncate),
        }
    }
}

/// The share of the room past an unreachable trigger that a reused summary may grow into when
/// headroom is off (headroom's own default).
const UNREACHABLE_HEADROOM: f64 = 0.75;

/// What a plan is for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Compact when a trigger is reached.
    Normal,
    /// `x-compactor: force`: compact even under every trigger.
    Force,
    /// Precompute: the request is at `factor ×` a trigger; plan the summary its conversation
    /// will need once it crosses the trigger, so that it is ready by then.
    Ahead { factor: f64 },
}

/// The settings the planner reads, in the reference's vocabulary.
#[derive(Debug, Clone)]
pub struct PlanSettings {
    pub triggers: Vec<ContextSize>,
    pub keep: ContextSize,
    /// Compacted request must be under `headroom × threshold` for every trigger.
    pub headroom: Option<f64>,
    /// Turns of observed growth the cut leaves room for, on top of headroom (with it on).
    pub headroom_turns: u64,
    /// Size assumed for a summary that does not exist yet (`summary_max_tokens` + framing).
    pub summary_estimate_tokens: u64,
    /// The least a summary must cover to be worth a call: clearly more than the summary itself
    /// (see `worth_summarizing`: over a messages trigger the count decides, and a summary's real
    /// size lowers this once one exists).
    pub min_span_tokens: u64,
    pub skills: SkillRescue,
    pub stages: Stages,
    /// Text a client's context messages begin with (`<environment_context>`, …): such a
    /// message is never summarized, pinned with the system prompt at the start, kept verbatim
    /// after the summary elsewhere.
    pub pinned_context: Vec<PinnedText>,
}

impl PlanSettings {
    pub fn from_config(config: &SummarizationConfig) -> PlanSettings {
        PlanSettings {
            triggers: config.trigger.to_vec(),
            keep: config.keep,
            headroom: config.headroom,
            headroom_turns: config.headroom_turns,
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
            stages: Stages::from_config(config),
            pinned_context: config
                .pinned_context
                .iter()
                .filter_map(|text| PinnedText::new(text))
                .collect(),
        }
    }
}

/// A summary the cache holds for a prefix of this conversation.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
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
    /// Whether the summary under a prefix digest was made ahead of need and not used yet.
    fn made_ahead(&mut self, _prefix: &Digest) -> bool {
        false
    }
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

impl Threshold {
    fn value(self) -> u64 {
        match self {
            Threshold::Tokens(v) | Threshold::Messages(v) => v,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Forward the original bytes (with the cleared outputs of [`Plan::cleared`], if any).
    PassThrough { reason: Reason },
    /// Use this cached summary; no summarizer call.
    Reuse {
        layout: Layout,
        summary: CachedSummary,
        /// The conversation's prefix chain: its digests are the cache keys of this scope.
        chain: Vec<Digest>,
        /// Reused because no new summary could bring the request under a trigger (what no
        /// summary takes away is at it already): the size requests may grow to before one is
        /// made anyway.
        unreachable: Option<u64>,
    },
    /// Summarize `to_summarize` (on top of `previous` when given).
    Summarize {
        layout: Layout,
        to_summarize: Vec<usize>,
        previous: Option<CachedSummary>,
        /// Estimated tokens the new summary replaces: the summarized messages plus the previous
        /// summary. A summary that is not smaller is not worth using.
        replaced_tokens: u64,
        /// The conversation's prefix chain: its digests are the cache keys of this scope.
        chain: Vec<Digest>,
    },
}

/// What the analysis chose, before the plan names it by its keys.
enum Choice {
    PassThrough {
        reason: Reason,
    },
    Reuse {
        layout: Layout,
        summary: CachedSummary,
        unreachable: Option<u64>,
    },
    Summarize {
        layout: Layout,
        to_summarize: Vec<usize>,
        previous: Option<CachedSummary>,
        replaced_tokens: u64,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub decision: Decision,
    pub tokens_before: u64,
    pub cache_consulted: bool,
    pub cache_hit: bool,
    /// Each message's token count (after clearing), when the request was over a trigger.
    pub message_tokens: Vec<u64>,
    /// Messages whose old tool outputs the `clear_tool_outputs` stage replaced; they are
    /// forwarded (and shown to the summarizer) as these copies wherever they go.
    pub cleared: Cleared,
    /// Tokens of the request with the outputs cleared (and nothing else changed).
    pub tokens_cleared: u64,
    /// The model's window less the output reserve, when the window is known: the most the
    /// request may be.
    pub window: Option<u64>,
    /// With the `truncate` stage, when the request (cleared) reaches the window: the layout
    /// that drops the oldest whole groups until it fits, for when no summary can be had.
    pub truncation: Option<Layout>,
    /// When a new summary is planned on top of a cached one: the layout that reuses the cached
    /// one as it stands, for when the new one cannot be had (it needs no summarizer call).
    pub reuse_fallback: Option<Layout>,
    /// The prefixes a cached summary may cover (valid cuts after the pinned head), longest
    /// first, when the cache was consulted.
    pub candidate_cuts: Vec<usize>,
}

impl Plan {
    /// The conversation's prefix chain, when the decision uses the cache's keys.
    pub fn chain(&self) -> Option<&[Digest]> {
        match &self.decision {
            Decision::Reuse { chain, .. } | Decision::Summarize { chain, .. } => Some(chain),
            Decision::PassThrough { .. } => None,
        }
    }
}

/// Per-request facts every step reads.
struct Analysis {
    tokens: Vec<u64>,
    /// `suffix[i]` = tokens of `messages[i..]`.
    suffix: Vec<u64>,
    pinned_tokens: u64,
    schema_tokens: u64,
    head: usize,
    /// Messages after the head that are never summarized (pinned context, a Messages system
    /// turn): kept verbatim after the summary when the cut passes them.
    kept_context: Vec<usize>,
    /// `valid_cut[c]`: no tool-call group has members on both sides of `c`.
    valid_cut: Vec<bool>,
    /// The largest cut that keeps the last group whole.
    max_cut: usize,
    latest_user: Option<usize>,
    thresholds: Vec<Threshold>,
    model: TokenModel,
    skill_bundles: Vec<SkillBundle>,
    growth: Growth,
}

/// What one request adds to a conversation, on average over its latest steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Growth {
    tokens: u64,
    messages: u64,
}

/// Steps averaged for a conversation's growth: recent enough to follow a change of pace
/// (an agent moving from chat to reading files), enough to smooth one large tool output.
const GROWTH_STEPS: usize = 8;

impl Growth {
    /// Each response is one request: a run of assistant messages (a Responses turn's reasoning,
    /// calls and answer are several) after what the client sent. The span from one response to
    /// the next is what one request added. Unknown (zero) before two responses.
    fn of(messages: &[Message<'_>], suffix: &[u64], head: usize) -> Growth {
        let is_answer = |role: Role| matches!(role, Role::Assistant | Role::Other);
        let responses: Vec<usize> = (head..messages.len())
            .filter(|&i| {
                is_answer(messages[i].role) && (i == head || !is_answer(messages[i - 1].role))
            })
            .collect();
        let recent = &responses[responses.len().saturating_sub(GROWTH_STEPS + 1)..];
        let (Some(&first), Some(&last)) = (recent.first(), recent.last()) else {
            return Growth::default();
        };
        let steps = (recent.len() - 1) as u64;
        if steps == 0 {
            return Growth::default();
        }
        Growth {
            tokens: (suffix[first] - suffix[last]) / steps,
            messages: (last - first) as u64 / steps,
        }
    }
}

/// What a compacted request must stay under: `factor ×` each threshold, and, with `turns`,
/// the threshold less that many turns of the conversation's growth.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Target {
    factor: f64,
    turns: u64,
}

/// What a layout must fit under, besides the factor of each threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Goal {
    /// As the request is now.
    Now,
    /// Planning ahead: the request (as forwarded) is this size now and will grow until it
    /// reaches each threshold, so each threshold's coming growth is counted in.
    AheadOf { tokens: u64, messages: u64 },
}

/// Plans one request. `force` compacts even under every trigger (`x-compactor: force`).
pub fn plan(
    conversation: &Conversation<'_>,
    settings: &PlanSettings,
    model: &TokenModel,
    force: bool,
    cache: &mut dyn SummaryLookup,
) -> Plan {
    let mode = if force { Mode::Force } else { Mode::Normal };
    plan_in(conversation, settings, model, mode, cache)
}

/// Plans one request for `mode`, with the summaries `cache` holds.
pub fn plan_in(
    conversation: &Conversation<'_>,
    settings: &PlanSettings,
    model: &TokenModel,
    mode: Mode,
    cache: &mut dyn SummaryLookup,
) -> Plan {
    match analyse(conversation, settings, model, mode, cache) {
        Analysed::Decided(plan) => *plan,
        Analysed::Ready(ready) => ready.decide(cache),
    }
}

/// A request analysed: decided already (under every trigger, or nothing a summary could do),
/// or ready to be decided with the summaries on hand, as often as more come to hand.
pub enum Analysed<'c, 'a> {
    Decided(Box<Plan>),
    Ready(Box<Ready<'c, 'a>>),
}

/// A request over a trigger that a summary could shorten, analysed once: the prefix chain
/// (whose digests are the cache keys) and everything deciding reads besides the summaries.
pub struct Ready<'c, 'a> {
    conversation: &'c Conversation<'a>,
    settings: &'c PlanSettings,
    mode: Mode,
    analysis: Analysis,
    chain: Vec<Digest>,
    count: u64,
    tokens_before: u64,
    tokens_cleared: u64,
    cleared: Cleared,
    window: Option<u64>,
    truncation: Option<Layout>,
}

/// Threshold first: under every trigger nothing else is computed and `cache` is not touched
/// (not even for its seed).
pub fn analyse<'c, 'a>(
    conversation: &'c Conversation<'a>,
    settings: &'c PlanSettings,
    model: &TokenModel,
    mode: Mode,
    cache: &mut dyn SummaryLookup,
) -> Analysed<'c, 'a> {
    let tokens = conversation.message_tokens(model);
    let thresholds = thresholds(settings, model, conversation.output_reserve);
    let window = window(model, conversation.output_reserve);
    let schema_tokens = conversation.schema_tokens(model);
    let tokens_before = schema_tokens + tokens.iter().sum::<u64>();
    let count = conversation.messages.len() as u64;
    if !reached(&thresholds, mode, tokens_before, count) {
        return Analysed::Decided(Box::new(Plan {
            decision: Decision::PassThrough {
                reason: Reason::UnderTrigger,
            },
            tokens_before,
            cache_consulted: false,
            cache_hit: false,
            message_tokens: Vec::new(),
            cleared: Vec::new(),
            tokens_cleared: tokens_before,
            window,
            truncation: None,
            reuse_fallback: None,
            candidate_cuts: Vec::new(),
        }));
    }
    let mut analysis = Analysis::new(conversation, settings, model, tokens, thresholds);
    let cleared = match settings.stages.clear_min_tokens {
        Some(min_tokens) => analysis.clear(conversation, settings, min_tokens),
        None => Vec::new(),
    };
    let tokens_cleared = schema_tokens + analysis.suffix[0];
    let truncation = window
        .filter(|&window| settings.stages.truncate && tokens_cleared >= window)
        .and_then(|window| analysis.truncation(conversation, window));
    let early = if tokens_cleared < tokens_before
        && !reached(&analysis.thresholds, mode, tokens_cleared, count)
    {
        Some(Reason::ClearedUnderTrigger)
    } else if !settings.stages.summarize {
        Some(Reason::NoSummarizeStage)
    } else if analysis.max_cut <= analysis.head {
        Some(Reason::NothingToSummarize)
    } else {
        None
    };
    if let Some(reason) = early {
        return Analysed::Decided(Box::new(Plan {
            decision: Decision::PassThrough { reason },
            tokens_before,
            cache_consulted: false,
            cache_hit: false,
            message_tokens: analysis.tokens,
            cleared,
            tokens_cleared,
            window,
            truncation,
            reuse_fallback: None,
            candidate_cuts: Vec::new(),
        }));
    }
    let chain = prefix_chain(&conversation.messages, cache.chain_seed());
    Analysed::Ready(Box::new(Ready {
        conversation,
        settings,
        mode,
        analysis,
        chain,
        count,
        tokens_before,
        tokens_cleared,
        cleared,
        window,
        truncation,
    }))
}

/// Whether (tokens, messages) reach a trigger for `mode`.
fn reached(thresholds: &[Threshold], mode: Mode, tokens: u64, messages: u64) -> bool {
    match mode {
        Mode::Normal => over_any(thresholds, tokens, messages, 1.0),
        Mode::Force => true,
        Mode::Ahead { factor } => over_any(thresholds, tokens, messages, factor),
    }
}

impl Ready<'_, '_> {
    /// How the request's API writes a summary.
    pub fn dialect(&self) -> &'static dyn Dialect {
        self.conversation.dialect
    }

    /// The prefixes a summary on hand may cover (valid cuts after the pinned head), longest
    /// first, with their cache keys.
    pub fn candidates(&self) -> impl Iterator<Item = (usize, Digest)> + '_ {
        self.analysis
            .candidate_cuts()
            .map(|cut| (cut, self.chain[cut]))
    }

    /// The summary on hand that a decision would build on: the longest usable one.
    pub fn cached(&self, cache: &mut dyn SummaryLookup) -> Option<CachedSummary> {
        self.analysis.cached(&self.chain, cache, self.mode)
    }

    /// The plan with the summaries `cache` holds now.
    pub fn decide(&self, cache: &mut dyn SummaryLookup) -> Plan {
        let (analysis, settings, mode) = (&self.analysis, self.settings, self.mode);
        let cached = self.cached(cache);
        let choice = match &cached {
            Some(summary) => analysis.plan_with_cache(settings, summary.clone(), mode),
            None => {
                let goal = match mode {
                    Mode::Ahead { .. } => Goal::AheadOf {
                        tokens: self.tokens_cleared,
                        messages: self.count,
                    },
                    _ => Goal::Now,
                };
                analysis.plan_fresh(settings, goal)
            }
        };
        // A layout whose verbatim messages do not form a valid list (the request itself has an
        // unanswered call or an orphan result) is never worth a summarizer call.
        let valid = |layout: &Layout| validate_layout(&self.conversation.messages, layout).is_ok();
        let chain = || self.chain.clone();
        let reuse_fallback = match &choice {
            Choice::Summarize {
                previous: Some(previous),
                ..
            } => Some(analysis.reuse_within(previous, self.window)).filter(|layout| valid(layout)),
            _ => None,
        };
        let decision = match choice {
            Choice::PassThrough { reason } => Decision::PassThrough { reason },
            Choice::Reuse { layout, .. } | Choice::Summarize { layout, .. } if !valid(&layout) => {
                Decision::PassThrough {
                    reason: Reason::InvalidToolStructure,
                }
            }
            Choice::Reuse {
                layout,
                summary,
                unreachable,
            } => Decision::Reuse {
                layout,
                summary,
                chain: chain(),
                unreachable,
            },
            Choice::Summarize {
                layout,
                to_summarize,
                previous,
                replaced_tokens,
            } => Decision::Summarize {
                layout,
                to_summarize,
                previous,
                replaced_tokens,
                chain: chain(),
            },
        };
        Plan {
            decision,
            tokens_before: self.tokens_before,
            cache_consulted: true,
            candidate_cuts: analysis.candidate_cuts().collect(),
            cache_hit: cached.is_some(),
            message_tokens: analysis.tokens.clone(),
            cleared: self.cleared.clone(),
            tokens_cleared: self.tokens_cleared,
            window: self.window,
            truncation: self.truncation.clone(),
            reuse_fallback,
        }
    }
}

/// Whether the request is over any trigger (threshold-first check, nothing else computed).
pub fn over_trigger(
    conversation: &Conversation<'_>,
    settings: &PlanSettings,
    model: &TokenModel,
) -> (bool, u64) {
    over_share(conversation, settings, model, 1.0)
}

/// Whether the request reaches `share ×` any trigger (the model's window included).
pub fn reaches_share(
    conversation: &Conversation<'_>,
    settings: &PlanSettings,
    model: &TokenModel,
    share: f64,
) -> bool {
    over_share(conversation, settings, model, share).0
}

/// Whether the request reaches `share ×` any trigger, and its tokens.
fn over_share(
    conversation: &Conversation<'_>,
    settings: &PlanSettings,
    model: &TokenModel,
    share: f64,
) -> (bool, u64) {
    let tokens =
        conversation.schema_tokens(model) + conversation.message_tokens(model).iter().sum::<u64>();
    let thresholds = thresholds(settings, model, conversation.output_reserve);
    let messages = conversation.messages.len() as u64;
    (over_any(&thresholds, tokens, messages, share), tokens)
}

/// The configured triggers, and the model's window: a request that reaches the window is
/// compacted whatever the triggers say.
fn thresholds(settings: &PlanSettings, model: &TokenModel, output_reserve: u64) -> Vec<Threshold> {
    settings
        .triggers
        .iter()
        .filter_map(|size| threshold(*size, model, output_reserve))
        .chain(window(model, output_reserve).map(Threshold::Tokens))
        .collect()
}

/// The model's window less what the request reserves for its answer.
fn window(model: &TokenModel, output_reserve: u64) -> Option<u64> {
    threshold(ContextSize::Fraction(1.0), model, output_reserve).map(Threshold::value)
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

    fn n(&self) -> usize {
        self.tokens.len()
    }

    /// The cuts a cached summary may end at (valid, after the pinned head), longest first.
    fn candidate_cuts(&self) -> impl Iterator<Item = usize> + '_ {
        (self.head + 1..=self.max_cut)
            .rev()
            .filter(|&c| self.valid_cut[c])
    }

    /// The summary to build on: the longest cached prefix (summaries are only ever stored at
    /// valid cuts). A summary made ahead of need waits until the one in use stops fitting, so
    /// it takes over at the trigger, as the summary made then would.
    fn cached(
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
    fn keep_for(&self, keep: ContextSize, goal: Goal) -> ContextSize {
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
        let growth_tokens = growth(
            |t| matches!(t, Threshold::Tokens(_)).then_some(t.value()),
            tokens,
        );
        let growth_messages = growth(
            |t| matches!(t, Threshold::Messages(_)).then_some(t.value()),
            messages,
        );
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
    fn clear(
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
    fn over(&self, tokens: u64, messages: u64, factor: f64, goal: Goal) -> bool {
        self.over_target(tokens, messages, Target { factor, turns: 0 }, goal)
    }

    /// Whether (tokens, messages) reach any threshold's `target`, with each threshold's coming
    /// growth counted in when planning ahead.
    fn over_target(&self, tokens: u64, messages: u64, target: Target, goal: Goal) -> bool {
        if target.turns == 0 && goal == Goal::Now {
            return over_any(&self.thresholds, tokens, messages, target.factor);
        }
        self.thresholds.iter().any(|t| {
            let (measure, per_turn) = match t {
                Threshold::Tokens(_) => (tokens, self.growth.tokens),
                Threshold::Messages(_) => (messages, self.growth.messages),
            };
            let coming = match goal {
                Goal::Now => 0,
                Goal::AheadOf {
                    tokens: now_tokens,
                    messages: now_messages,
                } => t.value().saturating_sub(match t {
                    Threshold::Tokens(_) => now_tokens,
                    Threshold::Messages(_) => now_messages,
                }),
            };
            let mut limit = target.factor * t.value() as f64;
            if target.turns > 0 {
                // Room for growth never takes more than half of what headroom leaves: past
                // that, a faster conversation would be cut to its latest message and lose the
                // recent turns the model needs more than it needs a longer reuse.
                let room = target.turns.saturating_mul(per_turn) as f64;
                limit = limit.min((t.value() as f64 - room).max(limit / 2.0));
            }
            (measure + coming) as f64 >= limit
        })
    }

    /// Whether the compacted size satisfies `target` (strictly under it); always, with
    /// headroom off (`keep` alone decides, as in the reference).
    fn within(&self, tokens: u64, messages: u64, target: Option<Target>, goal: Goal) -> bool {
        match target {
            None => true,
            Some(target) => !self.over_target(tokens, messages, target, goal),
        }
    }

    /// Whether a cached summary fits this request: its cut a valid one, and each message it
    /// keeps back named once, in order, inside the summarized range (an entry that named one
    /// message many times would have it copied as often into the forwarded body).
    fn usable(&self, cached: &CachedSummary) -> bool {
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
    fn replaced_by(&self, cached: &CachedSummary) -> u64 {
        let span = self.suffix[self.head].saturating_sub(self.suffix[cached.cut]);
        let kept: u64 = cached.excluded.iter().map(|&i| self.tokens[i]).sum();
        span.saturating_sub(kept)
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

    /// What the cut passes but no summary may hold, in order: the latest user message (it then
    /// moves to after the summary) and the kept context. Before `floor` only if `carried` has
    /// it (a cached summary cannot be un-summarized).
    fn kept_in_span(&self, cut: usize, floor: usize, carried: &[usize]) -> Vec<usize> {
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
    fn apply_headroom(
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
    fn layout_at(
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
    fn truncation(&self, conversation: &Conversation<'_>, window: u64) -> Option<Layout> {
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
    fn widen_to_span(
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
    fn worth_summarizing(
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

    fn plan_fresh(&self, settings: &PlanSettings, goal: Goal) -> Choice {
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

    fn plan_with_cache(
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
            Mode::Ahead { factor } => Some(factor),
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
    fn unreachable_bound(&self, settings: &PlanSettings, summary_tokens: u64) -> Option<u64> {
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
    fn reuse_within(&self, cached: &CachedSummary, window: Option<u64>) -> Layout {
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
    fn reuse_layout(&self, cached: &CachedSummary, headroom_unmet: bool) -> Layout {
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
