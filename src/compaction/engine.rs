//! Compaction in flight (DESIGN.md §1–§4), as orchestration only: per request, threshold first,
//! then the plan, then a cached summary or one shared summarizer run, then the splice. Whatever
//! goes wrong, the original request is forwarded unless `fail_mode: closed` refuses it.

use crate::poison::lock;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::HeaderMap;
use http::StatusCode;
use tokio::sync::watch;
use tracing::Instrument;

use crate::compaction::calibration::{Learned, SampleClaim};
use crate::compaction::control::{self, Control};
use crate::compaction::failure::CompactionFailure;
use crate::compaction::front_end::FrontEnd;
use crate::compaction::front_end::Parsed;
use crate::compaction::offload::{CpuPool, Offloaded};
use crate::compaction::planner::conversation::Dialect;
use crate::compaction::planner::plan::CachedSummary;
use crate::compaction::planner::size_bound::provably_under;
use crate::compaction::planner::tokens::{CharCount, TokenModel};
use crate::compaction::prepare::{
    summary_tokens, Ask, Fallback, Job, Next, Planner, Prepared, Reactive, UNSTATED_LIMIT_SHARE,
};
use crate::compaction::reason::Reason;
use crate::compaction::scope::{Caller, Credentials};
use crate::compaction::summaries::budget::SummarizerBudget;
use crate::compaction::summaries::cache::CacheKey;
use crate::compaction::summaries::identifiers;
use crate::compaction::summaries::single_flight::SingleFlight;
use crate::compaction::summaries::store::{Claim, LayoutKey};
use crate::compaction::summaries::summarizer::{
    Summarizer, SummaryCall, SummaryError, SummaryRequest,
};
use crate::compaction::summaries::summary_input;
use crate::compaction::summaries::vet::{vet, Unusable};
use crate::compaction::windows::calibration_key;
use crate::compaction::windows::learned_window;
use crate::compaction::{CacheUse, CountBasis, Outcome, OutcomeKind, SummarizerUsage};
use crate::config::{Config, FailMode, NoticeMode};
use crate::headers;
use crate::metrics::Metrics;
use crate::notice::Notice;
use crate::upstream::Rewrite;

#[derive(Clone)]
pub struct CompactionEngine {
    inner: Arc<Inner>,
}

/// What every request waiting on one summarizer run gets.
type FlightResult = Result<Arc<CachedSummary>, CompactionFailure>;

struct Inner {
    planner: Planner,
    metrics: Arc<Metrics>,
    flights: SingleFlight<FlightResult>,
    budget: SummarizerBudget,
    summarizer: Arc<dyn Summarizer>,
    pool: CpuPool,
    background: Background,
}

/// Summaries being made ahead of need, in tasks no request waits on.
struct Background {
    running: watch::Sender<usize>,
    /// The conversations (by their base digest) with a summary being made ahead: one each.
    bases: Mutex<HashSet<CacheKey>>,
}

/// Counts one background run until it ends, also when it panics.
struct Running {
    inner: Arc<Inner>,
    base: CacheKey,
}

impl Drop for Running {
    fn drop(&mut self) {
        let background = &self.inner.background;
        lock(&background.bases).remove(&self.base);
        background.running.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Whether a request body asks for a streamed answer: a top-level `"stream": true` (a key
/// inside a string has escaped quotes and never matches; one nested in a tool schema could,
/// and only makes an over-window request refused rather than forwarded).
fn declares_stream(body: &[u8]) -> bool {
    memchr::memmem::find_iter(body, br#""stream""#).any(|at| {
        let rest = body[at + 8..].trim_ascii_start();
        rest.strip_prefix(b":")
            .is_some_and(|rest| rest.trim_ascii_start().starts_with(b"true"))
    })
}

/// One calibration sample, at debug: how far the count was from the upstream's before it.
fn log_calibration(model: &str, counted: u64, learned: Learned) {
    let (used, ratio) = match learned {
        Learned::Used { ratio } => (true, ratio),
        Learned::Outlier { ratio } => (false, ratio),
    };
    tracing::debug!(
        target: "compactor::calibration",
        model,
        counted,
        estimated = (ratio * counted as f64).round() as u64,
        ratio = (ratio * 1000.0).round() / 1000.0,
        used,
        "calibration sample"
    );
}

/// A forwarded body whose upstream count will calibrate its model's estimate: the body is
/// held (a shared reference, not a copy) until the response reports its usage, then counted
/// by class on the planner's pool, off the response path.
pub struct CalibrationSample {
    inner: Arc<Inner>,
    api: &'static dyn FrontEnd,
    /// The upstream and model it calibrates ([`calibration_key`]).
    key: String,
    model: String,
    body: Bytes,
    claim: SampleClaim,
}

impl CalibrationSample {
    /// Learns from the upstream's count of the body's input tokens.
    pub fn record(self, counted: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let CalibrationSample {
                inner,
                api,
                key,
                model,
                body,
                claim,
            } = self;
            let (windows, store) = (&inner.planner.windows, &inner.planner.store);
            // A model new here starts from what the other replicas learned of it.
            if claim.is_first() && store.has_shared() {
                if let Some(shared) = store.shared_calibration(&key).await {
                    windows.seed_calibration(&claim, &shared);
                }
            }
            let claimed_model = model.clone();
            let configured = windows.configured_token_model(&model);
            let features = inner
                .pool
                .run(body.len(), move || match api.parse(&body) {
                    Ok(Parsed::Conversation(conversation))
                        if conversation.model.as_deref() == Some(claimed_model.as_str()) =>
                    {
                        // No count of the whole is below half the last message's estimate.
                        let floor = conversation
                            .messages
                            .last()
                            .map_or(0, |last| last.tokens(&configured) / 2);
                        conversation.features().map(|features| (features, floor))
                    }
                    _ => None,
                })
                .await;
            let Offloaded::Done(Some((features, floor))) = features else {
                return;
            };
            let Some(learned) = windows.calibrate(&claim, &features, counted, floor) else {
                return;
            };
            if let Some(shared) = windows.calibration_to_share(&claim) {
                store.share_calibration(&key, &shared).await;
            }
            log_calibration(&model, counted, learned);
            inner.metrics.calibration(learned.used(), learned.ratio());
        });
    }
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
    pub outcome: Box<Outcome>,
}

impl Compacted {
    /// This compaction's retry was refused too: the client gets the upstream's first error,
    /// and the log and headers say the compaction failed rather than that it answered.
    pub fn refused_on_retry(mut self) -> Compacted {
        self.outcome.kind = OutcomeKind::Failed;
        self.outcome.reason = Reason::ReactiveRefused;
        self.notice = None;
        self
    }

    /// A body compacted on a native contract's terms (see `crate::native`), forwarded as it is.
    pub fn served(body: Bytes, outcome: Outcome) -> Compacted {
        Compacted {
            body,
            rewritten: true,
            outcome,
            notice: None,
        }
    }

    fn original(body: Bytes, outcome: Outcome) -> Compacted {
        Compacted {
            body,
            rewritten: false,
            outcome,
            notice: None,
        }
    }

    /// The notice to write before the upstream's body (see [`Notice::for_response`]).
    pub fn notice_for(&self, status: StatusCode, headers: &HeaderMap) -> Option<Notice> {
        Notice::for_response(self.notice.as_ref(), status, headers)
    }

    /// What sending it needs to know: the new length, the notice.
    pub fn as_sent(&self) -> Rewrite<'_> {
        Rewrite {
            length: self.rewritten.then_some(self.body.len()),
            notice: self.notice.as_ref(),
            replay: Some(&self.body),
        }
    }
}

impl CompactionEngine {
    /// The engine of `config`, calling the summarizer on `upstreams`; after a reload,
    /// `previous` hands over its summary cache and learned windows.
    /// The engine of a config generation, its summaries made by `summarizer` and carried over
    /// from the `previous` generation's.
    pub fn new(
        config: &Config,
        summarizer: Arc<dyn Summarizer>,
        metrics: Arc<Metrics>,
        previous: Option<&CompactionEngine>,
    ) -> CompactionEngine {
        CompactionEngine::build(config, summarizer, metrics, previous)
    }

    /// An engine with its own summarizer and no metrics (tests and benchmarks).
    pub fn with_summarizer(config: &Config, summarizer: Arc<dyn Summarizer>) -> CompactionEngine {
        CompactionEngine::build(config, summarizer, Arc::new(Metrics::new(false)), None)
    }

    fn build(
        config: &Config,
        summarizer: Arc<dyn Summarizer>,
        metrics: Arc<Metrics>,
        previous: Option<&CompactionEngine>,
    ) -> CompactionEngine {
        metrics.known_failures(CompactionFailure::REASONS.iter().map(|r| r.label()));
        CompactionEngine {
            inner: Arc::new(Inner {
                planner: Planner::new(config, previous.map(|p| &p.inner.planner), &metrics),
                metrics,
                flights: SingleFlight::default(),
                budget: SummarizerBudget::new(&config.summarization),
                summarizer,
                pool: CpuPool::new(config.runtime.planner_thread_count()),
                background: Background {
                    running: watch::channel(0).0,
                    bases: Mutex::default(),
                },
            }),
        }
    }

    pub fn cached_summaries(&self) -> usize {
        self.inner.planner.store.local().len()
    }

    /// Entries in the summary cache and the bytes they weigh.
    pub fn cache_size(&self) -> (u64, u64) {
        let cache = self.inner.planner.store.local();
        (cache.len() as u64, cache.weight())
    }

    /// Waits until no summary is being made ahead of need (for tests, benchmarks and shutdown).
    pub async fn background_idle(&self) {
        let mut running = self.inner.background.running.subscribe();
        let _ = running.wait_for(|n| *n == 0).await;
    }

    /// Waits until every calibration sample taken so far has been learned from (for tests: a
    /// sample is claimed before its response is sent, so one answered is waited for).
    pub async fn calibrations_idle(&self) {
        self.inner.planner.windows.calibrations_idle().await;
    }

    /// Compacts one chat-completions, Responses or Messages body from `caller` addressed to
    /// `upstream` (by name).
    pub async fn compact(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        upstream: &str,
        caller: Caller<'_>,
        api: &'static dyn FrontEnd,
    ) -> Result<Compacted, CompactionRefused> {
        self.compact_as(headers, body, upstream, caller, api, Asked::default())
            .await
    }

    /// As [`CompactionEngine::compact`], with what the request asks besides its body (a
    /// summary prompt of its own).
    pub async fn compact_as(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        upstream: &str,
        caller: Caller<'_>,
        api: &'static dyn FrontEnd,
        asked: Asked<'_>,
    ) -> Result<Compacted, CompactionRefused> {
        let first = self
            .run(headers, body, upstream, caller, api, asked)
            .await?;
        if first.outcome.reason != Reason::SummarizerContextTooLong {
            return Ok(first);
        }
        // The summarizer's window is learned now: planned again, the calls are cut to it.
        self.run(headers, first.body, upstream, caller, api, asked)
            .await
    }

    /// Runs CPU-heavy work for a body of `size` bytes on the planner's pool when the body is
    /// large, inline when small.
    pub async fn offload<T, F>(&self, size: usize, work: F) -> Offloaded<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        self.inner.pool.run(size, work).await
    }

    /// The longest summarization instructions a client may send.
    pub fn max_client_instructions_bytes(&self) -> usize {
        self.inner.planner.config.max_client_instructions_bytes
    }

    /// compactor's count of a body's input (its messages and schemas), as its triggers count
    /// it; None for a body its front-end cannot plan.
    pub fn count(&self, api: &'static dyn FrontEnd, upstream: &str, body: &[u8]) -> Option<u64> {
        self.input_tokens(api, upstream, body, false)
    }

    /// A body's input counted as a retry after a context-length error plans it: with the
    /// model's own tokenizer where compactor has it, else the estimate.
    pub fn count_as_retried(
        &self,
        api: &'static dyn FrontEnd,
        upstream: &str,
        body: &[u8],
    ) -> Option<u64> {
        self.input_tokens(api, upstream, body, true)
    }

    /// A body's messages and schemas counted; `exact`: with the model's own tokenizer where
    /// compactor has it.
    fn input_tokens(
        &self,
        api: &'static dyn FrontEnd,
        upstream: &str,
        body: &[u8],
        exact: bool,
    ) -> Option<u64> {
        let Ok(Parsed::Conversation(conversation)) = api.parse(body) else {
            return None;
        };
        let windows = &self.inner.planner.windows;
        let mut model = windows.token_model(upstream, conversation.model.as_deref());
        if exact {
            model.exact = windows.encoding(conversation.model.as_deref());
        }
        let messages: u64 = conversation.message_tokens(&model).iter().sum();
        Some(messages + conversation.schema_tokens(&model))
    }

    /// The right to calibrate `model`'s count from the upstream's usage for this forwarded
    /// body, when the model is due a sample.
    pub fn calibration_sample(
        &self,
        api: &'static dyn FrontEnd,
        upstream: &str,
        model: &str,
        compacted: &Compacted,
    ) -> Option<CalibrationSample> {
        // Bodies under every trigger by their size alone are sampled too (the parse is off
        // the response path): they are most of the traffic, and calibrate the count before a
        // conversation nears its trigger. Bodies left alone are not: their upstream count
        // includes what the body does not hold (a stored conversation, a previous response).
        if !compacted.outcome.counted && compacted.outcome.reason != Reason::UnderTriggerBySize {
            return None;
        }
        let claim = self
            .inner
            .planner
            .windows
            .calibration_claim(upstream, model)?;
        Some(CalibrationSample {
            inner: self.inner.clone(),
            api,
            key: calibration_key(upstream, model),
            model: model.to_string(),
            body: compacted.body.clone(),
            claim,
        })
    }

    /// Compacts a request the upstream refused with a context-length error, for its one retry:
    /// as if over the trigger, under the window the error states (remembered for the model) or,
    /// when it states none, clearly under what was forwarded (`forwarded_tokens`, when counted).
    #[allow(clippy::too_many_arguments)]
    pub async fn compact_after_overflow(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        upstream: &str,
        caller: Caller<'_>,
        api: &'static dyn FrontEnd,
        reactive: Reactive,
    ) -> Result<Compacted, CompactionRefused> {
        let asked = Asked {
            reactive: Some(reactive),
            summary_prompt: None,
        };
        self.run(headers, body, upstream, caller, api, asked).await
    }

    async fn run(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        upstream: &str,
        caller: Caller<'_>,
        api: &'static dyn FrontEnd,
        asked: Asked<'_>,
    ) -> Result<Compacted, CompactionRefused> {
        let Asked {
            reactive,
            summary_prompt,
        } = asked;
        let planner = &self.inner.planner;
        let control = match Control::of(headers) {
            Control::Force if !caller.may_force => Control::Auto,
            control => control,
        };
        if control == Control::Off {
            return Ok(Compacted::original(
                body,
                Outcome::uncounted(Reason::DisabledByHeader),
            ));
        }
        // Summaries made ahead start below the trigger, so the bound is then proved against
        // that share of it.
        let front_end = api;
        if reactive.is_none() && control != Control::Force && front_end.size_bound_applies() {
            let settings = planner.settings_for(caller.key).0;
            let share = planner.config.precompute_at.unwrap_or(1.0);
            if provably_under(&body, settings, &planner.windows.bounds(), share) {
                let outcome = Outcome::uncounted(Reason::UnderTriggerBySize);
                return Ok(Compacted::original(body, outcome));
            }
        }
        let notice_mode = match control::notice_mode(headers, planner.config.notice) {
            NoticeMode::Chunk if !front_end.notice_chunk_fits() => NoticeMode::Comment,
            mode => mode,
        };
        let credentials = Credentials::of(caller, headers);
        let ask = Ask {
            credentials: &credentials,
            upstream,
            force: control == Control::Force,
            api,
            reactive,
            summary_prompt,
        };
        let prepared = self.prepare(&body, &ask).await;
        let (result, window) = match prepared {
            Offloaded::Done(Prepared::Forward { outcome, next }) => {
                let window = self.start_ahead(next, headers);
                (Ok(Compacted::original(body, outcome)), window)
            }
            Offloaded::Done(Prepared::Rewritten {
                body: rewritten,
                outcome,
                notice,
                next,
            }) => {
                let window = self.start_ahead(next, headers);
                let notice = notice.then(|| Notice {
                    mode: notice_mode,
                    message: compacted_message(&outcome),
                });
                let compacted = Compacted {
                    body: Bytes::from(rewritten),
                    rewritten: true,
                    outcome,
                    notice,
                };
                (Ok(compacted), window)
            }
            Offloaded::Done(Prepared::Summarize(job)) => {
                let window = job.window;
                let basis = CountBasis::of(&job.token_model);
                let result = self.summarize(*job, headers, body, notice_mode).await;
                let result = result.map(|mut compacted| {
                    if compacted.outcome.counted {
                        compacted.outcome.basis = basis;
                    }
                    compacted
                });
                (result, window)
            }
            Offloaded::Busy => (
                Ok(Compacted::original(body, Outcome::uncounted(Reason::Busy))),
                None,
            ),
            Offloaded::Lost => (
                self.failed(body, 0, CompactionFailure::Internal, CacheUse::NotConsulted),
                None,
            ),
        };
        self.fits(result, window)
    }

    /// The preparation: inline for a small body; for a large one, on a pool thread, as one
    /// future, so the body is parsed once even when the shared tier is asked in the middle
    /// (that thread waits out the round trip).
    async fn prepare(&self, body: &Bytes, ask: &Ask<'_>) -> Offloaded<Prepared> {
        if !CpuPool::offloads(body.len()) {
            return Offloaded::Done(self.inner.planner.prepare(body, ask).await);
        }
        let inner = self.inner.clone();
        let body = body.clone();
        let credentials = ask.credentials.clone();
        let upstream = ask.upstream.to_string();
        let (force, api, reactive) = (ask.force, ask.api, ask.reactive);
        let summary_prompt = ask.summary_prompt.map(str::to_string);
        let runtime = tokio::runtime::Handle::current();
        self.inner
            .pool
            .run(body.len(), move || {
                let ask = Ask {
                    credentials: &credentials,
                    upstream: &upstream,
                    force,
                    api,
                    reactive,
                    summary_prompt: summary_prompt.as_deref(),
                };
                runtime.block_on(inner.planner.prepare(&body, &ask))
            })
            .await
    }

    /// With `fail_mode: closed`, a request still over the model's window after every stage is
    /// refused here rather than sent to fail upstream.
    fn fits(
        &self,
        result: Result<Compacted, CompactionRefused>,
        window: Option<u64>,
    ) -> Result<Compacted, CompactionRefused> {
        let compacted = result?;
        let tokens = compacted.outcome.token_counts().map(|(_, after)| after);
        let (Some(tokens), Some(window)) = (tokens, window) else {
            return Ok(compacted);
        };
        // An over-window stream is refused even when failing open once the count is
        // calibrated or exact: servers such as llama.cpp's answer one with 200 and an empty stream,
        // which no retry can see, so forwarding it loses the request silently.
        let refuse = self.inner.planner.config.fail_mode == FailMode::Closed
            || (compacted.outcome.basis.is_measured() && declares_stream(&compacted.body));
        if refuse && tokens >= window {
            return Err(CompactionRefused {
                failure: CompactionFailure::ContextTooLarge { tokens, window },
                outcome: Box::new(compacted.outcome),
            });
        }
        Ok(compacted)
    }

    /// Starts the summary a forwarded request's conversation will need, in the background;
    /// returns the request's window.
    fn start_ahead(&self, next: Next, headers: &HeaderMap) -> Option<u64> {
        let Some(job) = next.ahead else {
            return next.window;
        };
        let Some(base) = job.ahead_base else {
            return next.window;
        };
        if !lock(&self.inner.background.bases).insert(base) {
            return next.window;
        }
        self.inner.background.running.send_modify(|n| *n += 1);
        let running = Running {
            inner: self.inner.clone(),
            base,
        };
        let engine = self.clone();
        let headers = headers.clone();
        tokio::spawn(async move {
            let _running = running;
            let flight = job.flight_key();
            let cap = engine.inner.planner.config.max_summarizer_calls;
            if job.chunks.len() as u64 > cap
                || engine.inner.planner.store.local().known_too_large(&flight)
            {
                return;
            }
            if let Err(failure) = engine.summary_for(&job, flight, &headers).await {
                tracing::debug!(
                    reason = failure.label(),
                    "summary ahead of need failed: {failure}"
                );
            }
        });
        next.window
    }

    /// Gets the summary (shared with concurrent requests) and splices it in; without one, the
    /// `truncate` stage's body when there is one.
    async fn summarize(
        &self,
        mut job: Job,
        headers: &HeaderMap,
        body: Bytes,
        notice_mode: NoticeMode,
    ) -> Result<Compacted, CompactionRefused> {
        let cache_use = if job.cache_hit {
            CacheUse::Hit
        } else {
            CacheUse::Miss
        };
        let cap = self.inner.planner.config.max_summarizer_calls;
        let calls = job.chunks.len() as u64;
        let flight = job.flight_key();
        let started = Instant::now();
        let summary = if calls > cap {
            Err(CompactionFailure::TooManyCalls { calls, cap })
        } else if self.inner.planner.store.local().known_too_large(&flight) {
            if job.fallbacks.is_empty() {
                let outcome = Outcome {
                    outputs_cleared: job.outputs_cleared,
                    ..Outcome::skipped(job.tokens_before, Reason::SummaryKnownTooLarge)
                };
                return Ok(Compacted::original(body, outcome));
            }
            Err(CompactionFailure::NotSmaller)
        } else {
            self.summary_for(&job, flight, headers).await
        };
        let summarizer_ms = (calls <= cap).then(|| started.elapsed().as_millis() as u64);
        let summary = match summary {
            Ok(summary) => summary,
            Err(failure) => {
                self.inner.metrics.summary_failed(failure.label());
                let fallbacks = std::mem::take(&mut job.fallbacks);
                if let Some(fallback) = Fallback::choose(fallbacks, job.window) {
                    tracing::warn!(
                        reason = failure.label(),
                        instead = fallback.kind.label(),
                        "no summary: {failure}"
                    );
                    let outcome = fallback.outcome(Outcome {
                        summarizer_ms,
                        cache: cache_use,
                        outputs_cleared: job.outputs_cleared,
                        reason: job.reason.unwrap_or(failure.reason()),
                        ..Outcome::skipped(job.tokens_before, Reason::None)
                    });
                    return Ok(Compacted {
                        body: Bytes::from(fallback.body),
                        rewritten: true,
                        outcome,
                        notice: None,
                    });
                }
                let mut result = self.failed(body, job.tokens_before, failure, cache_use);
                if let Ok(compacted) = &mut result {
                    compacted.outcome.summarizer_ms = summarizer_ms;
                }
                return result;
            }
        };
        let config = &self.inner.planner.config;
        let rewritten = job.splice.apply(&body, &summary.text, config.summary_role);
        let estimate = self.inner.planner.summary_estimate_tokens();
        let tokens_after = job.layout.projected_tokens - estimate.min(job.layout.projected_tokens)
            + summary.tokens;
        let summarizer_usage = self.summarizer_usage(&job, &summary);
        let outcome = Outcome {
            kind: OutcomeKind::Summarized,
            summarizer_usage: Some(summarizer_usage),
            tokens_after,
            messages_summarized: job.messages_summarized,
            summarizer_ms,
            coverage: Some(job.coverage),
            cache: cache_use,
            headroom_unmet: job.layout.headroom_unmet,
            reason: match (job.reason, &job.previous) {
                (Some(reason), _) => reason,
                (None, Some(_)) => Reason::Incremental,
                (None, None) => Reason::Fresh,
            },
            outputs_cleared: job.outputs_cleared,
            ..Outcome::skipped(job.tokens_before, Reason::None)
        };
        Ok(Compacted {
            body: Bytes::from(rewritten),
            rewritten: true,
            notice: Some(Notice {
                mode: notice_mode,
                message: compacted_message(&outcome),
            }),
            outcome,
        })
    }

    /// What making `job`'s summary cost, in the summarizer model's estimated count: each call
    /// reads the prompt, the summary so far and its chunk, and writes a summary.
    fn summarizer_usage(&self, job: &Job, summary: &CachedSummary) -> SummarizerUsage {
        let planner = &self.inner.planner;
        let model = planner.windows.token_model(&job.upstream, Some(&job.model));
        let tokens = |text: &str| model.tokens(CharCount::of_str(text)) + model.message_overhead();
        let template = job
            .summary_prompt
            .as_deref()
            .or(planner.config.summary_prompt.as_deref());
        let prompt = tokens(&summary_input::render_prompt(template, None, ""));
        let calls = job.chunks.len().max(1) as u64;
        let chunks: u64 = job.chunks.iter().map(|chunk| tokens(chunk)).sum();
        let previous = job.previous.as_deref().map_or(0, tokens);
        SummarizerUsage {
            input_tokens: calls * prompt + chunks + previous + (calls - 1) * summary.tokens,
            output_tokens: calls * summary.tokens,
        }
    }

    /// The summary for a job, made once for all concurrent requests that need it, in a task
    /// that outlives any one of them and stores its result in the cache.
    async fn summary_for(&self, job: &Job, flight: [u8; 32], headers: &HeaderMap) -> FlightResult {
        let config = &self.inner.planner.config;
        let call = self.summary_call(job, headers);
        // Each call is bounded by timeout_secs; the run as a whole by that times its calls.
        let bound = Duration::from_secs_f64(config.timeout_secs) * job.chunks.len().max(1) as u32;
        let span = crate::telemetry::summarizer_span(
            &call.upstream,
            &call.model,
            call.max_tokens,
            job.chunks.len(),
        );
        let run = SummaryRun {
            call,
            key: job.key,
            flight,
            chunks: job.chunks.clone(),
            previous: job.previous.clone(),
            identifiers: job.identifiers.clone(),
            token_model: job.token_model,
            replaced_tokens: job.replaced_tokens,
            ahead: job.ahead_base.is_some(),
            layout: (
                job.layout.cut,
                job.layout.excluded.clone(),
                job.layout.splits.clone(),
            ),
            accounts: job.accounts.clone(),
            dialect: job.dialect,
            bound,
            summary_prompt: job.summary_prompt.clone(),
        };
        let inner = self.inner.clone();
        let (shared, started) = self
            .inner
            .flights
            .join(flight, move || inner.make_summary(run).instrument(span))
            .await;
        if !started {
            self.inner.metrics.single_flight_joined();
        }
        shared.unwrap_or(Err(CompactionFailure::Internal))
    }

    /// Where `job`'s summarizer calls go, with the client's own credentials where they may.
    fn summary_call(&self, job: &Job, headers: &HeaderMap) -> SummaryCall {
        let config = &self.inner.planner.config;
        let mut client_headers = headers.clone();
        if !job.client_credentials {
            for name in headers::CREDENTIALS {
                client_headers.remove(name);
            }
        }
        SummaryCall {
            upstream: job.upstream.clone(),
            model: job.model.clone(),
            max_tokens: config.summary_max_tokens,
            api: config.summarizer_api,
            client_headers,
        }
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
            reason: failure.reason(),
            ..Outcome::skipped(tokens, Reason::None)
        };
        match self.inner.planner.config.fail_mode {
            FailMode::Open => Ok(Compacted::original(body, outcome)),
            FailMode::Closed => Err(CompactionRefused {
                failure,
                outcome: Box::new(outcome),
            }),
        }
    }
}

/// What a request asks besides its body: a retry after an overflow, a prompt of its own.
#[derive(Clone, Copy, Default)]
pub struct Asked<'p> {
    reactive: Option<Reactive>,
    summary_prompt: Option<&'p str>,
}

impl<'p> Asked<'p> {
    /// The summary written to the client's own prompt (a template holding `{messages}`) in
    /// place of `summary_prompt`.
    pub fn summary_prompt(summary_prompt: Option<&'p str>) -> Asked<'p> {
        Asked {
            reactive: None,
            summary_prompt,
        }
    }
}

/// One summarizer run, owned, for the single flight that makes it.
struct SummaryRun {
    call: SummaryCall,
    key: CacheKey,
    flight: CacheKey,
    chunks: Vec<String>,
    previous: Option<String>,
    identifiers: Vec<String>,
    token_model: TokenModel,
    replaced_tokens: u64,
    ahead: bool,
    layout: LayoutKey,
    accounts: Vec<[u8; 32]>,
    bound: Duration,
    summary_prompt: Option<Arc<str>>,
    dialect: &'static dyn Dialect,
}

impl Inner {
    /// Makes one summary: the one another replica made or is making, else a run of calls
    /// within the budget and `bound`, kept in the store.
    async fn make_summary(self: Arc<Self>, run: SummaryRun) -> FlightResult {
        let store = &self.planner.store;
        let (key, flight, bound) = (run.key, run.flight, run.bound);
        // Across replicas: the summary another one made, or is making, first.
        let lease = match store.claim(&key, &flight, &run.layout, bound).await {
            Claim::Made(summary) => return Ok(Arc::new(summary)),
            Claim::TooLarge => return Err(CompactionFailure::NotSmaller),
            Claim::TimedOut => {
                return Err(CompactionFailure::Summarizer(SummaryError::Timeout(bound)))
            }
            Claim::Make(lease) => lease,
        };
        let ticket = self
            .budget
            .admit(&run.accounts, run.chunks.len() as u64, Instant::now())?;
        let (cut, excluded, splits) = run.layout;
        let made = async {
            let text = self
                .fold_chunks(
                    &run.call,
                    run.summary_prompt.as_deref(),
                    run.previous,
                    &run.chunks,
                )
                .await?;
            let count = |text: &str| {
                summary_tokens(text, &self.planner.config, &run.token_model, run.dialect)
            };
            if count(&text) >= run.replaced_tokens {
                return Err(CompactionFailure::NotSmaller);
            }
            // The index goes after the summary, as many entries as keep it smaller than what
            // it replaces.
            let mut entries = run.identifiers.as_slice();
            let (text, tokens) = loop {
                let indexed = identifiers::with_index(&text, entries);
                let tokens = count(&indexed);
                if tokens < run.replaced_tokens || entries.is_empty() {
                    break (indexed, tokens);
                }
                entries = &entries[..entries.len() / 2];
            };
            Ok(Arc::new(CachedSummary {
                cut,
                excluded,
                splits,
                text,
                tokens,
            }))
        };
        let result = match tokio::time::timeout(bound, made).await {
            Ok(result) => result,
            Err(_) => Err(CompactionFailure::Summarizer(SummaryError::Timeout(bound))),
        };
        // Only the summarizer's own failures count towards the breaker: a prompt its model
        // found too long is compactor's sizing, now corrected, not an outage.
        let summarizer_failed = matches!(
            &result,
            Err(CompactionFailure::Summarizer(error))
                if !matches!(error, SummaryError::ContextTooLong(_))
        );
        self.budget
            .record(&ticket, !summarizer_failed, Instant::now());
        match &result {
            Ok(summary) => store.keep(key, summary, run.ahead).await,
            // An answer that cannot be used is remembered: the same layout is not paid for again.
            Err(
                CompactionFailure::NotSmaller
                | CompactionFailure::EchoedPrompt
                | CompactionFailure::Summarizer(SummaryError::Blank),
            ) => store.too_large(flight).await,
            Err(_) => {}
        }
        if let Some(lease) = lease {
            lease.release().await;
        }
        result
    }

    /// Summarizes the chunks in order, each folded into the next; one chunk is one call.
    async fn fold_chunks(
        &self,
        call: &SummaryCall,
        client_prompt: Option<&str>,
        mut previous: Option<String>,
        chunks: &[String],
    ) -> Result<String, CompactionFailure> {
        let template = client_prompt.or(self.planner.config.summary_prompt.as_deref());
        let instructions = summary_input::render_prompt(template, None, "");
        for chunk in chunks {
            let prompt = summary_input::render_prompt(template, previous.as_deref(), chunk);
            let started = Instant::now();
            let windows = &self.planner.windows;
            let chars = CharCount::of_str(&prompt);
            let features = chars.features(1);
            let summarizer_model = windows.token_model(&call.upstream, Some(&call.model));
            let estimated = summarizer_model.tokens(chars) + summarizer_model.message_overhead();
            let answer = self
                .summarizer
                .summarize(SummaryRequest {
                    call: call.clone(),
                    prompt,
                })
                .await;
            self.metrics
                .summarizer_call(answer.is_ok(), started.elapsed());
            let summary = match answer {
                Ok(summary) => summary,
                Err(SummaryError::ContextTooLong(overflow)) => {
                    // Its next calls are cut to the window it stated (or under what failed).
                    match learned_window(&overflow, estimated) {
                        Some(window) => windows.learn(&call.model, window),
                        None => windows.learn_at_most(
                            &call.model,
                            (estimated as f64 * UNSTATED_LIMIT_SHARE) as u64,
                        ),
                    }
                    return Err(CompactionFailure::Summarizer(SummaryError::ContextTooLong(
                        overflow,
                    )));
                }
                Err(error) => return Err(CompactionFailure::Summarizer(error)),
            };
            // The summarizer's count of its own prompt calibrates its model's count, which
            // sizes its next calls.
            if let (Some(counted), Some(claim)) = (
                summary.input_tokens,
                windows.calibration_claim(&call.upstream, &call.model),
            ) {
                if let Some(learned) = windows.calibrate(&claim, &features, counted, 0) {
                    log_calibration(&call.model, counted, learned);
                    self.metrics.calibration(learned.used(), learned.ratio());
                }
            }
            let vetted = vet(&summary.text, &instructions).map_err(|unusable| match unusable {
                Unusable::Empty => CompactionFailure::Summarizer(SummaryError::Blank),
                Unusable::EchoesPrompt => CompactionFailure::EchoedPrompt,
            })?;
            previous = Some(vetted);
        }
        previous.ok_or(CompactionFailure::Summarizer(SummaryError::Blank))
    }
}

/// The notice's words for a request compacted with a summary.
fn compacted_message(outcome: &Outcome) -> String {
    match outcome.kind {
        OutcomeKind::Reused => format!(
            "Compacted earlier messages into a summary made ahead of time (about {} → {} tokens).",
            outcome.tokens_before, outcome.tokens_after
        ),
        _ => format!(
            "Compacted {} earlier messages into a summary (about {} → {} tokens).",
            outcome.messages_summarized, outcome.tokens_before, outcome.tokens_after
        ),
    }
}
