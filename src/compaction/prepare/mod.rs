//! Preparing one request, off the reactor for large bodies: parse once, the threshold, the
//! stages (clear, the summaries on hand from the store, plan, truncation as a fallback), and
//! for anything that needs no summarizer call, the new body itself. What needs a call is handed to
//! the engine as a [`Job`]; a summary worth making ahead of need as a second one.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::compaction::front_end::{ApiRequest, Parsed};
use crate::compaction::overflow::Overflow;
use crate::compaction::planner::clearing::Cleared;
use crate::compaction::planner::conversation::{Conversation, Dialect};
use crate::compaction::planner::digest::{hash_parts, Digest};
use crate::compaction::planner::plan::{
    self, Analysed, CachedSummary, Decision, Mode, Plan, PlanSettings, Ready,
};
use crate::compaction::planner::rewrite::SUMMARY_PREFIX;
use crate::compaction::planner::rewrite::{apply_cleared, omission_text, RewriteError, Splice};
use crate::compaction::planner::structure::Layout;
use crate::compaction::planner::tokens::{CharCount, TokenModel};
use crate::compaction::reason::Reason;
use crate::compaction::scope::{fingerprint, Credentials, Scope};
use crate::compaction::summaries::cache::{CacheKey, ScopedLookup};
use crate::compaction::summaries::identifiers;
use crate::compaction::summaries::store::SummaryStore;
use crate::compaction::summaries::summary_input::{self, InputSettings};
use crate::compaction::windows::{learned_window, Windows};
use crate::compaction::{CacheUse, CountBasis, Outcome, OutcomeKind};
use crate::config::{CompactionMode, Config, SummarizationConfig};
use crate::metrics::Metrics;
use crate::poison::lock;

mod answers;
mod job;

/// The prompt's own words and the previous summary's framing, besides the transcript.
const PROMPT_ALLOWANCE_TOKENS: u64 = 1024;
const MIN_CALL_BUDGET_TOKENS: u64 = 1024;
/// A summarizer model with no `models` entry: a call that fits a 32k window.
const UNKNOWN_WINDOW_CALL_BUDGET_TOKENS: u64 = 24_000;
/// A retry after a context-length error that states no limit aims this far under what failed.
pub(super) const UNSTATED_LIMIT_SHARE: f64 = 0.9;
/// A body whose estimate reaches this share of a trigger is counted with the model's own
/// tokenizer (the estimate is off by up to 40 % either way before calibration).
const EXACT_FROM_SHARE: f64 = 0.5;

/// What the CPU part decided.
pub(super) enum Prepared {
    /// Forward the original bytes.
    Forward { outcome: Outcome, next: Next },
    /// Forward this body, made without a summarizer call (reuse, clearing, truncation).
    Rewritten {
        body: Vec<u8>,
        outcome: Outcome,
        /// The summary text the body carries, when it carries one.
        summary: Option<String>,
        /// Where the messages that summary stands for lie in the original body.
        covered: Vec<Range<usize>>,
        /// The first request to use a summary made ahead of need carries the notice.
        notice: bool,
        next: Next,
    },
    /// A summary must be made (or joined) first.
    Summarize(Box<Job>),
}

/// What a forwarded request leaves to do: its window (for `fail_mode: closed`), and a
/// summary to make in the background for its conversation's coming cut.
pub(super) struct Next {
    pub window: Option<u64>,
    pub ahead: Option<Box<Job>>,
}

/// A body that needs no summarizer call: the truncate stage's, the cached summary reused as it
/// stands, or the request with its old tool outputs cleared. What is forwarded when a summary is
/// needed and cannot be had.
pub(super) struct Fallback {
    pub kind: OutcomeKind,
    pub body: Vec<u8>,
    /// The summary text the body carries, when it carries one.
    pub summary: Option<String>,
    /// Where the messages that summary stands for lie in the original body.
    pub covered: Vec<Range<usize>>,
    pub tokens_after: u64,
    pub dropped: usize,
    pub headroom_unmet: bool,
}

impl Fallback {
    /// `base` as the outcome of forwarding this body.
    pub fn outcome(&self, base: Outcome) -> Outcome {
        Outcome {
            kind: self.kind,
            tokens_after: self.tokens_after,
            messages_dropped: self.dropped,
            headroom_unmet: self.headroom_unmet,
            cache: match self.kind {
                OutcomeKind::Reused => CacheUse::Hit,
                _ => base.cache,
            },
            ..base
        }
    }

    /// The first of `fallbacks` (in order of preference) that fits `window`, else the smallest.
    pub fn choose(fallbacks: Vec<Fallback>, window: Option<u64>) -> Option<Fallback> {
        let fits = |f: &Fallback| window.is_none_or(|w| f.tokens_after < w);
        if fallbacks.iter().any(fits) {
            return fallbacks.into_iter().find(fits);
        }
        fallbacks.into_iter().min_by_key(|f| f.tokens_after)
    }
}

/// Everything the asynchronous part needs to make and apply a summary.
pub(super) struct Job {
    pub layout: Layout,
    /// Where the kept messages lie in the body: the summary is spliced in without a re-parse.
    pub splice: Splice,
    pub messages_summarized: usize,
    /// Tokens the summary replaces (summarized messages, plus the previous summary).
    pub replaced_tokens: u64,
    pub chunks: Vec<String>,
    pub previous: Option<String>,
    /// The identifier index the summary gets (this span's, then the previous summary's).
    pub identifiers: Vec<String>,
    /// The share of the evicted tokens the summarizer sees.
    pub coverage: f64,
    pub key: CacheKey,
    /// Whom its summarizer calls are charged to (see `Credentials::accounts`).
    pub accounts: Vec<[u8; 32]>,
    pub model: String,
    pub upstream: String,
    /// Whether the client's own credential may go to the summarizer upstream: only when it
    /// is the upstream the client addressed and the credential is not a compactor key.
    pub client_credentials: bool,
    pub token_model: TokenModel,
    pub tokens_before: u64,
    pub cache_hit: bool,
    /// Tool outputs the `clear_tool_outputs` stage replaced.
    pub outputs_cleared: usize,
    /// The model's window less the output reserve, when known.
    pub window: Option<u64>,
    /// What to forward when the summary cannot be had, in order of preference (see
    /// [`Fallback::choose`]): the cached summary it would extend, the request cleared, the
    /// `truncate` stage's body.
    pub fallbacks: Vec<Fallback>,
    /// Why this request is compacted, when not for the usual reason.
    pub reason: Option<Reason>,
    /// A summary made ahead of need: what identifies its conversation's base (so one runs per
    /// conversation at a time).
    pub ahead_base: Option<CacheKey>,
    /// The client's own summary prompt, in place of `summary_prompt`.
    pub summary_prompt: Option<Arc<str>>,
    /// How the request's API writes a summary: the summary is counted as it will be sent.
    pub dialect: &'static dyn Dialect,
}

impl Job {
    /// Requests sharing a prefix may still keep different messages verbatim (a newer user
    /// message after the cut, say); only identical layouts share one summary.
    pub fn flight_key(&self) -> [u8; 32] {
        let splits =
            self.layout.splits.iter().flat_map(|split| {
                std::iter::once(split.message).chain(split.calls.iter().copied())
            });
        let excluded: Vec<u8> = self
            .layout
            .excluded
            .iter()
            .copied()
            .chain(std::iter::once(usize::MAX))
            .chain(splits)
            .flat_map(|index| (index as u64).to_le_bytes())
            .collect();
        hash_parts([self.key.as_slice(), &excluded])
    }
}

/// A retry after the upstream's context-length error.
#[derive(Debug, Clone, Copy)]
pub struct Reactive {
    pub overflow: Overflow,
    /// What was forwarded the first time, counted as the retry's plan counts (the model's own
    /// tokenizer where compactor has it: [`crate::compaction::engine::CompactionEngine::count_as_retried`]).
    pub forwarded_tokens: Option<u64>,
}

/// What one request asks of the planner.
#[derive(Clone, Copy)]
pub(super) struct Ask<'r> {
    pub credentials: &'r Credentials,
    pub upstream: &'r str,
    pub force: bool,
    pub api: &'r ApiRequest,
    pub reactive: Option<Reactive>,
    /// The client's own summary prompt for this request (a template with `{messages}`), in
    /// place of `summary_prompt`.
    pub summary_prompt: Option<&'r str>,
    /// A served contract's own threshold: a body under it is not compacted.
    pub at_least: Option<u64>,
}

/// A client key's own compaction settings.
struct KeySettings {
    plan: PlanSettings,
    model_name: Option<String>,
}

/// The planner with everything it reads: settings, windows, the summary cache.
pub(super) struct Planner {
    pub config: SummarizationConfig,
    settings: PlanSettings,
    /// Client keys with triggers or a summarizer model of their own, by key name.
    per_key: HashMap<String, KeySettings>,
    /// Client keys with a compaction mode of their own, by key name.
    key_modes: HashMap<String, CompactionMode>,
    pub windows: Windows,
    pub store: SummaryStore,
    /// Models whose unreachable trigger was already reported.
    warned_unreachable: Mutex<HashSet<String>>,
}

/// Models an unreachable trigger is reported for, at most: the log says it once each.
const UNREACHABLE_WARNINGS: usize = 1024;

impl Planner {
    /// The planner of `config`; with `previous` (a reload), its summaries (see
    /// [`SummaryStore::new`]) and learned windows carry over.
    pub fn new(config: &Config, previous: Option<&Planner>, metrics: &Arc<Metrics>) -> Planner {
        let settings = PlanSettings::from_config(&config.summarization);
        let per_key = config
            .auth
            .keys
            .iter()
            .filter(|key| key.trigger.is_some() || key.model_name.is_some())
            .map(|key| {
                let mut plan = settings.clone();
                if let Some(trigger) = &key.trigger {
                    plan.triggers = trigger.to_vec();
                }
                let model_name = key
                    .model_name
                    .clone()
                    .or_else(|| config.summarization.model_name.clone());
                (key.name.clone(), KeySettings { plan, model_name })
            })
            .collect();
        let key_modes = config
            .auth
            .keys
            .iter()
            .filter_map(|key| Some((key.name.clone(), key.mode?)))
            .collect();
        Planner {
            config: config.summarization.clone(),
            settings,
            per_key,
            key_modes,
            windows: Windows::carrying(&config.models, previous.map(|p| &p.windows)),
            store: SummaryStore::new(config, previous.map(|p| &p.store), metrics.clone()),
            warned_unreachable: Mutex::default(),
        }
    }

    /// The size assumed for a summary before it exists (the same for every key).
    pub fn summary_estimate_tokens(&self) -> u64 {
        self.settings.summary_estimate_tokens
    }

    /// Whether a caller's requests are compacted or audited: its key's mode, else the default.
    pub fn mode_for(&self, key: Option<&str>) -> CompactionMode {
        key.and_then(|name| self.key_modes.get(name))
            .copied()
            .unwrap_or(self.config.mode)
    }

    /// The plan settings and summarizer model for a caller: its key's own, else the defaults.
    pub fn settings_for(&self, key: Option<&str>) -> (&PlanSettings, &Option<String>) {
        match key.and_then(|name| self.per_key.get(name)) {
            Some(own) => (&own.plan, &own.model_name),
            None => (&self.settings, &self.config.model_name),
        }
    }

    /// Input tokens one summarizer call may take: `trim_tokens_to_summarize` when set, else as
    /// much as the summarizer model's window holds besides the prompt and the summary, else a
    /// size every current model's window holds.
    fn call_budget(
        &self,
        summarizer_upstream: &str,
        summarizer_model: &str,
        client_prompt: Option<&str>,
    ) -> Option<u64> {
        let model = self
            .windows
            .token_model(summarizer_upstream, Some(summarizer_model));
        // A client's own prompt may be longer than the allowance made for compactor's: it is
        // counted inside the call's budget, once a call, never on top of it.
        let client_prompt_tokens =
            client_prompt.map_or(0, |prompt| model.tokens(CharCount::of_str(prompt)));
        if let Some(budget) = self.config.trim_tokens_to_summarize {
            if client_prompt_tokens == 0 {
                return Some(budget);
            }
            return Some(
                budget
                    .saturating_sub(client_prompt_tokens)
                    .max(MIN_CALL_BUDGET_TOKENS),
            );
        }
        let budget = match model.max_input_tokens {
            Some(window) => window.saturating_sub(
                self.config.summary_max_tokens + PROMPT_ALLOWANCE_TOKENS + client_prompt_tokens,
            ),
            None => UNKNOWN_WINDOW_CALL_BUDGET_TOKENS.saturating_sub(client_prompt_tokens),
        };
        Some(budget.max(MIN_CALL_BUDGET_TOKENS))
    }

    fn splice(
        &self,
        conversation: &Conversation<'_>,
        layout: &Layout,
        cleared: &Cleared,
    ) -> Result<Splice, RewriteError> {
        Splice::new(
            conversation,
            layout,
            self.config.summary_role,
            self.config.summary_placement,
        )
        .map(|splice| splice.with_cleared(conversation, cleared))
    }

    /// Parse once, threshold, stages, the summaries on hand (the shared tier asked in the
    /// middle when there is one), plan, and the body when no summarizer call is needed.
    pub async fn prepare(&self, body: &[u8], ask: &Ask<'_>) -> Prepared {
        let parsed = ask.api.parse(body);
        let conversation = match parsed {
            Ok(Parsed::Conversation(conversation)) => conversation,
            Ok(Parsed::LeaveAlone(reason)) => return forward(Outcome::uncounted(reason), None),
            Err(_) => return forward(Outcome::uncounted(Reason::UnparsableBody), None),
        };
        let key = match ask.credentials {
            Credentials::Key { name, .. } => Some(name.as_str()),
            Credentials::Headers { .. } => None,
        };
        let (settings, model_name) = self.settings_for(key);
        let token_model = self.token_model_for(&conversation, settings, ask);
        if let Some(at_least) = ask.at_least {
            let tokens = conversation
                .message_tokens(&token_model)
                .iter()
                .sum::<u64>()
                + conversation.schema_tokens(&token_model);
            if tokens < at_least {
                return forward(Outcome::skipped(tokens, Reason::UnderTrigger), None);
            }
        }
        let model = model_name
            .clone()
            .or_else(|| conversation.model.as_deref().map(str::to_string))
            .unwrap_or_default();
        let upstream = self
            .config
            .upstream
            .clone()
            .unwrap_or_else(|| ask.upstream.to_string());
        let context = Context {
            conversation: &conversation,
            body,
            settings,
            token_model,
            client_credentials: matches!(ask.credentials, Credentials::Headers { .. })
                && upstream == ask.upstream,
            credentials: ask.credentials,
            model,
            upstream,
            reason: ask.reactive.map(|_| Reason::Reactive),
            summary_prompt: ask.summary_prompt,
        };
        let mut lookup = ScopedLookup::new(self.store.local(), || Scope {
            deployment: self.store.deployment(),
            tenant: ask.credentials.tenant(),
            fingerprint: fingerprint(
                &self.config,
                context.summary_prompt,
                &context.model,
                &context.upstream,
            ),
        });
        let mode = if ask.force { Mode::Force } else { Mode::Normal };
        let plan = match plan::analyse(&conversation, settings, &token_model, mode, &mut lookup) {
            Analysed::Decided(plan) => *plan,
            Analysed::Ready(ready) => {
                self.decide_with_store(&ready, &mut lookup, &context.token_model)
                    .await
            }
        };
        if let Some(record) = plan.pace {
            self.store.local().keep_pace(record);
        }
        let ahead = match (&plan.decision, self.config.precompute_at) {
            (Decision::PassThrough { reason }, Some(factor))
                if ask.reactive.is_none()
                    && matches!(reason, Reason::UnderTrigger | Reason::ClearedUnderTrigger) =>
            {
                self.ahead(&context, factor, &mut lookup)
            }
            (Decision::Reuse { layout, .. }, Some(factor))
                if ask.reactive.is_none() && !layout.headroom_unmet =>
            {
                self.ahead(&context, factor, &mut lookup)
            }
            _ => None,
        };
        let mut prepared = self.decide(&context, plan, &mut lookup, ahead);
        if let Prepared::Forward { outcome, .. } | Prepared::Rewritten { outcome, .. } =
            &mut prepared
        {
            if outcome.counted {
                outcome.basis = CountBasis::of(&token_model);
            }
        }
        prepared
    }

    /// How this request is counted: its model's estimate, with the model's own tokenizer
    /// where compactor has it and it can decide something (a retry, a body near a trigger).
    fn token_model_for(
        &self,
        conversation: &Conversation<'_>,
        settings: &PlanSettings,
        ask: &Ask<'_>,
    ) -> TokenModel {
        let mut token_model = self
            .windows
            .token_model(ask.upstream, conversation.model.as_deref());
        let encoding = self.windows.encoding(conversation.model.as_deref());
        if let Some(reactive) = &ask.reactive {
            // A retry counts with the model's own tokenizer where compactor has it, and aims
            // under the refused size counted the same way (`Reactive::forwarded_tokens`).
            token_model.exact = encoding;
            token_model.max_input_tokens =
                Some(self.retry_window(conversation, &token_model, reactive));
        }
        // The model's own tokenizer, where compactor has it, for a body the estimate puts
        // near a trigger: only there does the difference decide anything.
        if let Some(encoding) = encoding {
            if plan::reaches_share(conversation, settings, &token_model, EXACT_FROM_SHARE) {
                token_model.exact = Some(encoding);
            }
        }
        token_model
    }

    /// The plan with the summaries on hand. The shared tier, when there is one, is asked before
    /// any summary is paid for: for every prefix when nothing is cached here, else for the
    /// prefixes past the one cached here (another replica may hold a newer summary).
    async fn decide_with_store(
        &self,
        ready: &Ready<'_, '_>,
        lookup: &mut ScopedLookup<'_>,
        token_model: &TokenModel,
    ) -> Plan {
        if !self.store.has_shared() {
            return ready.decide(lookup);
        }
        // What another replica wrote is counted here again rather than believed.
        let recount = |summary: &mut CachedSummary| {
            summary.tokens =
                summary_tokens(&summary.text, &self.config, token_model, ready.dialect());
        };
        let shared_keys = |past: usize| -> Vec<CacheKey> {
            ready
                .candidates()
                .filter(|&(cut, _)| cut > past)
                .map(|(_, key)| key)
                .take(plan::MAX_SHARED_PREFIXES)
                .collect()
        };
        if ready.cached(lookup).is_none() {
            let fetched = self.store.fetch(&shared_keys(0), recount).await;
            lookup.add(fetched);
            return ready.decide(lookup);
        }
        let plan = ready.decide(lookup);
        let Decision::Summarize {
            previous: Some(previous),
            ..
        } = &plan.decision
        else {
            return plan;
        };
        let fetched = self.store.fetch(&shared_keys(previous.cut), recount).await;
        if fetched.is_empty() {
            return plan;
        }
        lookup.add(fetched);
        ready.decide(lookup)
    }

    /// The window a retry after a context-length error aims under, in the estimate's tokens:
    /// the error's limit (scaled by how much the estimate undercounted, and remembered for the
    /// model), and in any case clearly under what failed.
    fn retry_window(
        &self,
        conversation: &Conversation<'_>,
        token_model: &TokenModel,
        reactive: &Reactive,
    ) -> u64 {
        let estimated = reactive.forwarded_tokens.unwrap_or_else(|| {
            conversation.schema_tokens(token_model)
                + conversation.message_tokens(token_model).iter().sum::<u64>()
        });
        let reserve = conversation.output_reserve;
        let under_failed = (estimated as f64 * UNSTATED_LIMIT_SHARE) as u64;
        let calibrated = token_model.calibration.is_some();
        let learned = learned_window(&reactive.overflow, estimated);
        if let Some(name) = conversation.model.as_deref() {
            match learned {
                Some(window) => self.windows.learn(name, window),
                // An error that states no limit (OpenAI's Responses API) still says the window
                // is under what was just refused: later turns stay under what the retry aims
                // at, never at a size that was refused.
                None => self.windows.learn_at_most(name, under_failed),
            }
        }
        let learned = learned.map(|window| window.in_estimate(calibrated));
        let usable = match learned.or(token_model.max_input_tokens) {
            Some(window) => window.saturating_sub(reserve).min(under_failed),
            None => under_failed,
        };
        usable.max(1) + reserve
    }

    /// The summary the conversation will need once it crosses the trigger, when it is close
    /// enough (`precompute_at`) and none is cached for it yet.
    fn ahead(
        &self,
        context: &Context<'_, '_>,
        factor: f64,
        lookup: &mut ScopedLookup<'_>,
    ) -> Option<Box<Job>> {
        let plan = plan::plan_in(
            context.conversation,
            context.settings,
            &context.token_model,
            Mode::Ahead { factor },
            lookup,
        );
        if let Some(record) = plan.pace {
            self.store.local().keep_pace(record);
        }
        let Decision::Summarize {
            layout,
            to_summarize,
            previous,
            replaced_tokens,
            chain,
        } = &plan.decision
        else {
            return None;
        };
        let base_at = previous
            .as_ref()
            .map_or((layout.head + 1).min(layout.cut), |p| p.cut);
        let base = chain[base_at];
        let mut job = self
            .job(
                context,
                &plan,
                layout,
                to_summarize,
                previous,
                *replaced_tokens,
                chain,
                lookup,
            )
            .ok()?;
        job.ahead_base = Some(base);
        Some(Box::new(job))
    }

    fn decide(
        &self,
        context: &Context<'_, '_>,
        plan: Plan,
        lookup: &mut ScopedLookup<'_>,
        ahead: Option<Box<Job>>,
    ) -> Prepared {
        let next = Next {
            window: plan.window,
            ahead,
        };
        let cache_use = match (plan.cache_consulted, plan.cache_hit) {
            (false, _) => CacheUse::NotConsulted,
            (true, true) => CacheUse::Hit,
            (true, false) => CacheUse::Miss,
        };
        let base = Outcome {
            cache: cache_use,
            outputs_cleared: plan.cleared.iter().map(|(_, c)| c.outputs).sum(),
            precompute_started: next.ahead.is_some(),
            ..Outcome::skipped(plan.tokens_before, Reason::None)
        };
        match &plan.decision {
            Decision::PassThrough { reason } => {
                let reason = context.reason.unwrap_or(*reason);
                self.pass_through(context, &plan, Outcome { reason, ..base }, next)
            }
            Decision::Reuse {
                layout,
                summary,
                chain,
                unreachable,
            } => {
                if let Some(bound) = unreachable {
                    self.warn_unreachable(&context.conversation.model, *bound);
                }
                let reason = unreachable.map(|_| Reason::TriggerUnreachable);
                self.reuse(context, &plan, (layout, summary, chain), base, next, reason)
            }
            Decision::Summarize { .. } => self.summarize(context, &plan, lookup, base, next),
        }
    }
}

/// One request as the planner sees it once parsed.
struct Context<'c, 'a> {
    conversation: &'c Conversation<'a>,
    body: &'c [u8],
    settings: &'c PlanSettings,
    token_model: TokenModel,
    client_credentials: bool,
    credentials: &'c Credentials,
    model: String,
    upstream: String,
    reason: Option<Reason>,
    summary_prompt: Option<&'c str>,
}

fn forward(outcome: Outcome, window: Option<u64>) -> Prepared {
    Prepared::Forward {
        outcome,
        next: Next {
            window,
            ahead: None,
        },
    }
}

fn truncated_body(truncated: Fallback, base: Outcome, next: Next) -> Prepared {
    Prepared::Rewritten {
        outcome: truncated.outcome(base),
        summary: truncated.summary,
        covered: truncated.covered,
        body: truncated.body,
        notice: false,
        next,
    }
}

/// Estimated tokens of the summary message that carries `text`.
pub(super) fn summary_tokens(
    text: &str,
    config: &SummarizationConfig,
    model: &TokenModel,
    dialect: &dyn Dialect,
) -> u64 {
    let json = dialect.summary_json(
        &format!("{SUMMARY_PREFIX}{text}"),
        config.summary_role,
        None,
    );
    dialect
        .parse_message(&json)
        .map(|m| m.tokens(model))
        .unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
