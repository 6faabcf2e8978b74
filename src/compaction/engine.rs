//! Compaction in flight (DESIGN.md §1–§4), as orchestration only: per request, threshold first,
//! then the plan, then a cached summary or one shared summarizer run, then the splice. Whatever
//! goes wrong, the original request is forwarded unless `fail_mode: closed` refuses it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderMap, AUTHORIZATION};
use http::StatusCode;

use super::budget::SummarizerBudget;
use super::cache::{CacheKey, ScopedLookup, SummaryCache};
use super::control::{self, Control};
use super::conversation::{Api, Conversation, Message};
use super::digest::hash_parts;
use super::failure::CompactionFailure;
use super::messages;
use super::offload::{CpuPool, Offloaded};
use super::plan::{self, CachedSummary, Decision, PlanSettings};
use super::responses::{self, Parsed};
use super::rewrite::{summary_message, RewriteError, Splice};
use super::scope::{fingerprint, Caller, Credentials, Scope};
use super::single_flight::SingleFlight;
use super::size_bound::{provably_under, ModelBounds};
use super::structure::Layout;
use super::summarizer::{HttpSummarizer, Summarizer, SummaryError, SummaryRequest};
use super::summary_input::{self, InputSettings};
use super::tokens::{ModelTable, TokenModel};
use super::{CacheUse, Outcome, OutcomeKind};
use crate::config::{Config, FailMode, NoticeMode, SummarizationConfig};
use crate::headers;
use crate::notice::Notice;
use crate::routing::Upstreams;

#[derive(Clone)]
pub struct CompactionEngine {
    inner: Arc<Inner>,
}

/// The prompt's own words and the previous summary's framing, besides the transcript.
const PROMPT_ALLOWANCE_TOKENS: u64 = 1024;
const MIN_CALL_BUDGET_TOKENS: u64 = 1024;
/// A summarizer model with no `models` entry: a call that fits a 32k window.
const UNKNOWN_WINDOW_CALL_BUDGET_TOKENS: u64 = 24_000;

/// What every request waiting on one summarizer run gets.
type Shared = Result<Arc<CachedSummary>, CompactionFailure>;

struct Inner {
    config: SummarizationConfig,
    settings: PlanSettings,
    /// Client keys with triggers or a summarizer model of their own, by key name.
    per_key: HashMap<String, KeySettings>,
    models: ModelTable,
    model_bounds: ModelBounds,
    cache: SummaryCache,
    flights: SingleFlight<Shared>,
    budget: SummarizerBudget,
    summarizer: Arc<dyn Summarizer>,
    planner: CpuPool,
}

/// A client key's own compaction settings.
struct KeySettings {
    plan: PlanSettings,
    model_name: Option<String>,
}

/// The body to forward and what compaction did.
pub struct Compacted {
    pub body: Bytes,
    pub rewritten: bool,
    pub outcome: Outcome,
    notice: Option<Notice>,
}

/// Compaction could not run and `fail_mode: closed` asks for an error instead of forwarding.
pub struct CompactionRefused {
    pub failure: CompactionFailure,
    pub outcome: Outcome,
}

impl Compacted {
    fn original(body: Bytes, outcome: Outcome) -> Compacted {
        Compacted {
            body,
            rewritten: false,
            outcome,
            notice: None,
        }
    }

    /// The notice to write before the upstream's body: only on a 2xx event stream.
    pub fn notice_for(&self, status: StatusCode, headers: &HeaderMap) -> Option<Notice> {
        let is_stream = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        self.notice
            .clone()
            .filter(|n| status.is_success() && is_stream && n.mode != NoticeMode::Off)
    }
}

/// What the synchronous (CPU) part decided.
enum Prepared {
    Forward { outcome: Outcome },
    Reused { body: Vec<u8>, outcome: Outcome },
    Summarize(Box<Job>),
}

/// Everything the asynchronous part needs to make and apply a summary.
struct Job {
    layout: Layout,
    /// Where the kept messages lie in the body: the summary is spliced in without a re-parse.
    splice: Splice,
    messages_summarized: usize,
    /// Tokens the summary replaces (summarized messages, plus the previous summary).
    replaced_tokens: u64,
    chunks: Vec<String>,
    previous: Option<String>,
    /// The share of the evicted tokens the summarizer sees.
    coverage: f64,
    key: CacheKey,
    tenant: [u8; 32],
    model: String,
    upstream: String,
    /// Whether the client's own credential may go to the summarizer upstream: only when it
    /// is the upstream the client addressed and the credential is not a compactor key.
    client_credentials: bool,
    token_model: TokenModel,
    tokens_before: u64,
    cache_hit: bool,
}

impl Job {
    /// Requests sharing a prefix may still keep different messages verbatim (a newer user
    /// message after the cut, say); only identical layouts share one summary.
    fn flight_key(&self) -> [u8; 32] {
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

impl CompactionEngine {
    pub fn new(config: Arc<Config>, upstreams: Arc<Upstreams>) -> CompactionEngine {
        let timeout = Duration::from_secs_f64(config.summarization.timeout_secs);
        let summarizer = Arc::new(HttpSummarizer::new(upstreams, timeout));
        CompactionEngine::with_summarizer(&config, summarizer)
    }

    pub fn with_summarizer(config: &Config, summarizer: Arc<dyn Summarizer>) -> CompactionEngine {
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
        CompactionEngine {
            inner: Arc::new(Inner {
                config: config.summarization.clone(),
                settings,
                per_key,
                models: ModelTable::new(&config.models),
                model_bounds: ModelBounds::of(&ModelTable::new(&config.models)),
                cache: SummaryCache::new(config.cache.max_bytes),
                flights: SingleFlight::default(),
                budget: SummarizerBudget::new(&config.summarization),
                summarizer,
                planner: CpuPool::new(config.runtime.planner_thread_count()),
            }),
        }
    }

    pub fn cached_summaries(&self) -> usize {
        self.inner.cache.len()
    }

    /// Compacts one chat-completions or Responses body from `caller` addressed to `upstream`
    /// (by name).
    pub async fn compact(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        upstream: &str,
        caller: Caller<'_>,
        api: Api,
    ) -> Result<Compacted, CompactionRefused> {
        let control = match Control::of(headers) {
            Control::Force if !caller.may_force => Control::Auto,
            control => control,
        };
        if control == Control::Off {
            return Ok(Compacted::original(
                body,
                Outcome::uncounted("disabled_by_header"),
            ));
        }
        // The size bound counts `"role"` literals to bound the message count; Responses items
        // need not have one, so their bodies always take the full count.
        if control != Control::Force && api != Api::Responses {
            let settings = self.inner.settings_for(caller.key).0;
            if provably_under(&body, settings, &self.inner.model_bounds) {
                let outcome = Outcome::uncounted("under_trigger_by_size");
                return Ok(Compacted::original(body, outcome));
            }
        }
        let notice_mode = match control::notice_mode(headers, self.inner.config.notice) {
            // A chat-completion chunk means nothing in a typed Responses or Messages stream.
            NoticeMode::Chunk if api != Api::ChatCompletions => NoticeMode::Comment,
            mode => mode,
        };
        match self
            .prepare(headers, &body, upstream, caller, control, api)
            .await
        {
            Offloaded::Done(Prepared::Forward { outcome }) => {
                Ok(Compacted::original(body, outcome))
            }
            Offloaded::Done(Prepared::Reused {
                body: rewritten,
                outcome,
            }) => Ok(Compacted {
                body: Bytes::from(rewritten),
                rewritten: true,
                outcome,
                notice: None,
            }),
            Offloaded::Done(Prepared::Summarize(job)) => {
                self.summarize(*job, headers, body, notice_mode).await
            }
            Offloaded::Busy => Ok(Compacted::original(body, Outcome::uncounted("busy"))),
            Offloaded::Lost => {
                self.failed(body, 0, CompactionFailure::Internal, CacheUse::NotConsulted)
            }
        }
    }

    /// The CPU part, off the reactor for large bodies.
    async fn prepare(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
        upstream: &str,
        caller: Caller<'_>,
        control: Control,
        api: Api,
    ) -> Offloaded<Prepared> {
        let inner = self.inner.clone();
        let body = body.clone();
        let credentials = Credentials::of(caller, headers);
        let upstream = upstream.to_string();
        self.inner
            .planner
            .run(body.len(), move || {
                inner.prepare(
                    &body,
                    &credentials,
                    &upstream,
                    control == Control::Force,
                    api,
                )
            })
            .await
    }

    /// Gets the summary (shared with concurrent requests) and splices it in.
    async fn summarize(
        &self,
        job: Job,
        headers: &HeaderMap,
        body: Bytes,
        notice_mode: NoticeMode,
    ) -> Result<Compacted, CompactionRefused> {
        let cap = self.inner.config.max_summarizer_calls;
        let calls = job.chunks.len() as u64;
        if calls > cap {
            let failure = CompactionFailure::TooManyCalls { calls, cap };
            return self.failed(body, job.tokens_before, failure, CacheUse::Miss);
        }
        let flight = job.flight_key();
        if self.inner.cache.known_too_large(&flight) {
            let outcome = Outcome::skipped(job.tokens_before, "summary_known_too_large");
            return Ok(Compacted::original(body, outcome));
        }
        let started = Instant::now();
        let summary = self.summary_for(&job, flight, headers).await;
        let summarizer_ms = started.elapsed().as_millis() as u64;
        let cache_use = if job.cache_hit {
            CacheUse::Hit
        } else {
            CacheUse::Miss
        };
        let summary = match summary {
            Ok(summary) => summary,
            Err(failure) => {
                let mut result = self.failed(body, job.tokens_before, failure, cache_use);
                if let Ok(compacted) = &mut result {
                    compacted.outcome.summarizer_ms = Some(summarizer_ms);
                }
                return result;
            }
        };
        let rewritten = job
            .splice
            .apply(&body, &summary.text, self.inner.config.summary_role);
        let estimate = self.inner.settings.summary_estimate_tokens;
        let tokens_after = job.layout.projected_tokens - estimate.min(job.layout.projected_tokens)
            + summary.tokens;
        let outcome = Outcome {
            kind: OutcomeKind::Summarized,
            tokens_before: job.tokens_before,
            tokens_after,
            messages_summarized: job.messages_summarized,
            summarizer_ms: Some(summarizer_ms),
            coverage: Some(job.coverage),
            cache: cache_use,
            headroom_unmet: job.layout.headroom_unmet,
            reason: if job.previous.is_some() {
                "incremental"
            } else {
                "fresh"
            },
            counted: true,
        };
        let message = format!(
            "Compacted {} earlier messages into a summary (about {} → {} tokens).",
            job.messages_summarized, job.tokens_before, tokens_after
        );
        Ok(Compacted {
            body: Bytes::from(rewritten),
            rewritten: true,
            outcome,
            notice: Some(Notice {
                mode: notice_mode,
                message,
            }),
        })
    }

    /// The summary for a job, made once for all concurrent requests that need it, in a task
    /// that outlives any one of them and stores its result in the cache.
    async fn summary_for(&self, job: &Job, flight: [u8; 32], headers: &HeaderMap) -> Shared {
        let credential = |name| {
            job.client_credentials
                .then(|| headers.get(name).cloned())
                .flatten()
        };
        let request = SummaryRequest {
            upstream: job.upstream.clone(),
            model: job.model.clone(),
            prompt: String::new(),
            max_tokens: self.inner.config.summary_max_tokens,
            api: self.inner.config.summarizer_api,
            client_authorization: credential(AUTHORIZATION),
            client_api_key: credential(headers::API_KEY),
            client_x_api_key: credential(headers::X_API_KEY),
            anthropic_version: headers.get("anthropic-version").cloned(),
            anthropic_beta: credential(http::HeaderName::from_static("anthropic-beta")),
        };
        let inner = self.inner.clone();
        let key = job.key;
        let chunks = job.chunks.clone();
        let previous = job.previous.clone();
        let token_model = job.token_model;
        let replaced_tokens = job.replaced_tokens;
        let (cut, excluded, splits) = (
            job.layout.cut,
            job.layout.excluded.clone(),
            job.layout.splits.clone(),
        );
        let tenant = job.tenant;
        // Each call is bounded by timeout_secs; the run as a whole by that times its calls.
        let bound = Duration::from_secs_f64(inner.config.timeout_secs) * chunks.len().max(1) as u32;
        let (shared, _started) = self
            .inner
            .flights
            .join(flight, move || {
                // Admitted when the run starts: requests that join it cost nothing more.
                let ticket = inner
                    .budget
                    .admit(tenant, chunks.len() as u64, Instant::now());
                async move {
                    let ticket = ticket?;
                    let made = async {
                        let text = inner.fold_chunks(&request, previous, &chunks).await?;
                        let tokens = summary_tokens(&text, &inner.config, &token_model);
                        if tokens >= replaced_tokens {
                            inner.cache.remember_too_large(flight);
                            return Err(CompactionFailure::NotSmaller);
                        }
                        let summary = Arc::new(CachedSummary {
                            cut,
                            excluded,
                            splits,
                            text,
                            tokens,
                        });
                        inner.cache.insert(key, summary.clone());
                        Ok(summary)
                    };
                    let result = match tokio::time::timeout(bound, made).await {
                        Ok(result) => result,
                        Err(_) => Err(CompactionFailure::Summarizer(SummaryError::Timeout(bound))),
                    };
                    // Only the summarizer's own failures count towards the breaker.
                    let summarizer_failed = matches!(result, Err(CompactionFailure::Summarizer(_)));
                    inner
                        .budget
                        .record(&ticket, !summarizer_failed, Instant::now());
                    result
                }
            })
            .await;
        shared.unwrap_or(Err(CompactionFailure::Internal))
    }

    fn failed(
        &self,
        body: Bytes,
        tokens: u64,
        failure: CompactionFailure,
        cache: CacheUse,
    ) -> Result<Compacted, CompactionRefused> {
        tracing::warn!(reason = failure.label(), "compaction failed: {failure}");
        let outcome = Outcome {
            kind: OutcomeKind::Failed,
            cache,
            reason: failure.label(),
            ..Outcome::skipped(tokens, "")
        };
        match self.inner.config.fail_mode {
            FailMode::Open => Ok(Compacted::original(body, outcome)),
            FailMode::Closed => Err(CompactionRefused { failure, outcome }),
        }
    }
}

impl Inner {
    /// The plan settings and summarizer model for a caller: its key's own, else the defaults.
    fn settings_for(&self, key: Option<&str>) -> (&PlanSettings, &Option<String>) {
        match key.and_then(|name| self.per_key.get(name)) {
            Some(own) => (&own.plan, &own.model_name),
            None => (&self.settings, &self.config.model_name),
        }
    }

    /// Summarizes the chunks in order, each folded into the next; one chunk is one call.
    async fn fold_chunks(
        &self,
        request: &SummaryRequest,
        mut previous: Option<String>,
        chunks: &[String],
    ) -> Result<String, CompactionFailure> {
        for chunk in chunks {
            let prompt = summary_input::render_prompt(
                self.config.summary_prompt.as_deref(),
                previous.as_deref(),
                chunk,
            );
            let text = self
                .summarizer
                .summarize(SummaryRequest {
                    prompt,
                    ..request.clone()
                })
                .await?;
            previous = Some(text);
        }
        previous.ok_or(CompactionFailure::Summarizer(SummaryError::Blank))
    }

    /// Input tokens one summarizer call may take: `trim_tokens_to_summarize` when set, else as
    /// much as the summarizer model's window holds besides the prompt and the summary, else a
    /// size every current model's window holds.
    fn call_budget(&self, summarizer_model: &str) -> Option<u64> {
        if let Some(budget) = self.config.trim_tokens_to_summarize {
            return Some(budget);
        }
        let window = self.models.lookup(Some(summarizer_model)).max_input_tokens;
        Some(match window {
            Some(window) => window
                .saturating_sub(self.config.summary_max_tokens + PROMPT_ALLOWANCE_TOKENS)
                .max(MIN_CALL_BUDGET_TOKENS),
            None => UNKNOWN_WINDOW_CALL_BUDGET_TOKENS,
        })
    }

    fn splice(
        &self,
        conversation: &Conversation<'_>,
        layout: &Layout,
        api: Api,
    ) -> Result<Splice, RewriteError> {
        Splice::new(
            conversation,
            layout,
            self.config.summary_role,
            self.config.summary_placement,
            api,
        )
    }

    /// The CPU part: parse, threshold, cache lookup, plan, and for reuse the splice.
    fn prepare(
        &self,
        body: &[u8],
        credentials: &Credentials,
        upstream: &str,
        force: bool,
        api: Api,
    ) -> Prepared {
        let parsed = match api {
            Api::ChatCompletions => Conversation::parse(body).map(Parsed::Conversation),
            Api::Responses => responses::parse(body),
            Api::Messages => messages::parse(body),
        };
        let conversation = match parsed {
            Ok(Parsed::Conversation(conversation)) => conversation,
            Ok(Parsed::LeaveAlone(reason)) => {
                return Prepared::Forward {
                    outcome: Outcome::skipped(0, reason),
                }
            }
            Err(_) => {
                return Prepared::Forward {
                    outcome: Outcome::skipped(0, "unparsable_body"),
                }
            }
        };
        let key = match credentials {
            Credentials::Key(name) => Some(name.as_str()),
            Credentials::Headers(_) => None,
        };
        let (settings, model_name) = self.settings_for(key);
        let token_model = self.models.lookup(conversation.model.as_deref());
        let model = model_name
            .clone()
            .or_else(|| conversation.model.as_deref().map(str::to_string))
            .unwrap_or_default();
        let requested_upstream = upstream;
        let upstream = self
            .config
            .upstream
            .clone()
            .unwrap_or_else(|| upstream.to_string());
        let client_credentials =
            matches!(credentials, Credentials::Headers(_)) && upstream == requested_upstream;
        let mut lookup = ScopedLookup::new(&self.cache, || Scope {
            tenant: credentials.tenant(),
            fingerprint: fingerprint(&self.config, &model, &upstream),
        });
        let plan = plan::plan(&conversation, settings, &token_model, force, &mut lookup);
        let cache_use = match (plan.cache_consulted, plan.cache_hit) {
            (false, _) => CacheUse::NotConsulted,
            (true, true) => CacheUse::Hit,
            (true, false) => CacheUse::Miss,
        };
        let tokens_before = plan.tokens_before;
        let forward =
            |kind: OutcomeKind, cache: CacheUse, reason: &'static str| Prepared::Forward {
                outcome: Outcome {
                    kind,
                    cache,
                    ..Outcome::skipped(tokens_before, reason)
                },
            };
        match plan.decision {
            Decision::PassThrough { reason } => forward(OutcomeKind::Skipped, cache_use, reason),
            Decision::Reuse { layout, summary } => {
                let Ok(splice) = self.splice(&conversation, &layout, api) else {
                    return forward(OutcomeKind::Failed, CacheUse::Hit, "rewrite_invalid");
                };
                Prepared::Reused {
                    body: splice.apply(body, &summary.text, self.config.summary_role),
                    outcome: Outcome {
                        kind: OutcomeKind::Reused,
                        tokens_before,
                        tokens_after: layout.projected_tokens,
                        messages_summarized: 0,
                        summarizer_ms: None,
                        coverage: None,
                        cache: CacheUse::Hit,
                        headroom_unmet: layout.headroom_unmet,
                        reason: "sticky",
                        counted: true,
                    },
                }
            }
            Decision::Summarize {
                layout,
                to_summarize,
                previous,
                replaced_tokens,
            } => {
                let Some(chain) = plan.chain.as_ref() else {
                    return forward(OutcomeKind::Skipped, cache_use, "no_chain");
                };
                if model.is_empty() {
                    return forward(OutcomeKind::Skipped, cache_use, "no_model");
                }
                let Ok(splice) = self.splice(&conversation, &layout, api) else {
                    return forward(OutcomeKind::Failed, cache_use, "rewrite_invalid");
                };
                let input = summary_input::select(
                    &conversation,
                    &to_summarize,
                    &plan.message_tokens,
                    previous.as_ref().map(|p| p.text.as_str()),
                    &InputSettings {
                        budget: self.call_budget(&model),
                        oversize: self.config.oversize,
                        max_calls: self.config.max_summarizer_calls,
                        model: token_model,
                    },
                );
                // The chain was seeded with this request's scope: its digests are cache keys.
                let key = chain[layout.cut];
                let tenant = lookup.scope().tenant;
                drop(lookup);
                Prepared::Summarize(Box::new(Job {
                    key,
                    tenant,
                    client_credentials,
                    splice,
                    layout,
                    messages_summarized: to_summarize.len(),
                    replaced_tokens,
                    coverage: input.coverage(),
                    chunks: input.chunks,
                    previous: input.previous,
                    model,
                    upstream,
                    token_model,
                    tokens_before,
                    cache_hit: plan.cache_hit,
                }))
            }
        }
    }
}

fn summary_tokens(text: &str, config: &SummarizationConfig, model: &TokenModel) -> u64 {
    let json = summary_message(text, config.summary_role);
    Message::parse(&json)
        .map(|m| m.tokens(model))
        .unwrap_or(u64::MAX)
}
