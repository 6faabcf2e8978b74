//! The compaction planner (DESIGN.md §2): pure, no I/O, no clock.
//!
//! Given a parsed request, settings and (through [`SummaryLookup`]) the summary cache, it decides
//! to pass through, to reuse a cached summary, or to summarize a precise set of messages, and
//! which messages stay verbatim and where. Everything it returns is checked again by
//! [`crate::compaction::planner::rewrite::validate`] before a byte is sent.

use crate::compaction::planner::clearing::{clear_outputs, Cleared};
use crate::compaction::planner::conversation::{Conversation, Dialect, Message, Role};
use crate::compaction::planner::digest::{prefix_chain, Digest};
use crate::compaction::planner::skills::{skill_bundles, SkillBundle};
use crate::compaction::planner::structure::{validate_layout, Groups, Layout, Split};
use crate::compaction::planner::tokens::TokenModel;
use crate::compaction::reason::Reason;
use crate::config::ContextSize;

mod analysis;
mod choose;
mod pace;
mod settings;

use pace::GROWTH_STEPS;
pub use pace::{Pace, PaceRecord};
use settings::UNREACHABLE_HEADROOM;
pub use settings::{Mode, PlanSettings, Stages};

/// At most this many prefixes of a conversation are asked of a shared tier (the longest).
pub const MAX_SHARED_PREFIXES: usize = 256;

/// Tokens assumed for the note that takes the place of truncated messages.
pub const OMISSION_ESTIMATE_TOKENS: u64 = 48;

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
    /// What compactor remembers of the conversation as of the request whose messages the
    /// digest names ([`Plan::pace`] says what to remember).
    fn pace(&mut self, _request: &Digest) -> Option<Pace> {
        None
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
    /// What to remember of the conversation for its next request, when the cache was
    /// consulted.
    pub pace: Option<PaceRecord>,
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
    /// What one request adds: read off the history, then measured between requests.
    growth: Growth,
    /// What one response adds, read off the history whatever the client's cadence.
    response_growth: Growth,
    summary_estimate_tokens: u64,
}

/// What one request adds to a conversation, on average over its latest steps: read off the
/// history (`Growth::of`) until compactor has seen two requests of the conversation, then
/// measured between the requests it saw ([`pace`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Growth {
    tokens: u64,
    messages: u64,
}

impl Growth {
    /// Each response is one request: a run of assistant messages (a Responses turn's reasoning,
    /// calls and answer are several) after what the client sent. The span from one response to
    /// the next is what one request added, whether the client added its tools' results or the
    /// user's next turn: a client that holds a tool's result ran that tool and sent the result
    /// to get the next response, and tools run behind the API (a hosted web search, a server
    /// tool) come back inside the one response. Counting a user turn with every response to it
    /// as one request would take an agent's whole task for one request's growth the moment
    /// its user types, and cut the next compaction far deeper than the loop's real pace asks.
    /// A client that does send one request per user turn is measured once it sends its second
    /// ([`pace`]). Unknown (zero) before two responses.
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
    pace: PaceRecord,
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
            pace: None,
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
            pace: None,
        }));
    }
    let chain = prefix_chain(&conversation.messages, cache.chain_seed());
    let pace = pace::learn(&chain, analysis.head, tokens_before, &mut |request| {
        cache.pace(request)
    });
    if let Some((tokens, messages)) = pace.pace.per_request() {
        analysis.growth = Growth { tokens, messages };
    }
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
        pace,
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
            None => match mode {
                Mode::Ahead { factor }
                    if analysis.ahead_factor(settings, factor).is_none_or(|at| {
                        !analysis.over(self.tokens_cleared, self.count, at, Goal::Now)
                    }) =>
                {
                    Choice::PassThrough {
                        reason: Reason::UnderTrigger,
                    }
                }
                Mode::Ahead { .. } => analysis.plan_fresh(
                    settings,
                    Goal::AheadOf {
                        tokens: self.tokens_cleared,
                        messages: self.count,
                    },
                ),
                _ => analysis.plan_fresh(settings, Goal::Now),
            },
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
            pace: Some(self.pace),
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
