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
use crate::compaction::front_end::{ApiRequest, Parsed};
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
use crate::config::{CompactionMode, Config, FailMode, NoticeMode};
use crate::headers;
use crate::metrics::Metrics;
use crate::notice::Notice;
use crate::upstream::Rewrite;

mod audit;
pub mod calibrating;
mod summary;

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

/// The body to forward and what compaction did.
pub struct Compacted {
    pub body: Bytes,
    pub rewritten: bool,
    pub outcome: Outcome,
    /// The summary text the body carries (after the summary prefix), when it carries one.
    pub summary: Option<String>,
    /// Where the messages that summary stands for lie in the client's body, oldest first.
    pub covered: Vec<std::ops::Range<usize>>,
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

    /// A body compacted on a served contract's terms (see `crate::served`), forwarded as it is.
    pub fn served(body: Bytes, outcome: Outcome) -> Compacted {
        Compacted {
            body,
            rewritten: true,
            outcome,
            summary: None,
            covered: Vec::new(),
            notice: None,
        }
    }

    fn original(body: Bytes, outcome: Outcome) -> Compacted {
        Compacted {
            body,
            rewritten: false,
            outcome,
            summary: None,
            covered: Vec::new(),
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
        api: &ApiRequest,
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
        api: &ApiRequest,
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
    pub fn count(&self, api: &ApiRequest, upstream: &str, body: &[u8]) -> Option<u64> {
        self.input_tokens(api, upstream, body, false)
    }

    /// A body's input counted as a retry after a context-length error plans it: with the
    /// model's own tokenizer where compactor has it, else the estimate.
    pub fn count_as_retried(&self, api: &ApiRequest, upstream: &str, body: &[u8]) -> Option<u64> {
        self.input_tokens(api, upstream, body, true)
    }

    /// A body's messages and schemas counted; `exact`: with the model's own tokenizer where
    /// compactor has it.
    fn input_tokens(
        &self,
        api: &ApiRequest,
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
        api: &ApiRequest,
        reactive: Reactive,
    ) -> Result<Compacted, CompactionRefused> {
        let asked = Asked {
            reactive: Some(reactive),
            ..Asked::default()
        };
        self.run(headers, body, upstream, caller, api, asked).await
    }

    async fn run(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        upstream: &str,
        caller: Caller<'_>,
        api: &ApiRequest,
        asked: Asked<'_>,
    ) -> Result<Compacted, CompactionRefused> {
        let Asked {
            reactive,
            summary_prompt,
            at_least,
            client_asked,
        } = asked;
        let audits = !client_asked && self.audits(caller.key);
        let control = match self.control(headers, &body, caller, api, reactive.is_some()) {
            Ok(control) => control,
            Err(reason) => {
                let outcome = Outcome::uncounted(reason);
                let outcome = if audits {
                    audit::skipped(outcome)
                } else {
                    outcome
                };
                return Ok(Compacted::original(body, outcome));
            }
        };
        let notice_mode = self.notice_mode(headers, api);
        let credentials = Credentials::of(caller, headers);
        let ask = Ask {
            credentials: &credentials,
            upstream,
            force: control == Control::Force,
            api,
            reactive,
            summary_prompt,
            at_least,
        };
        let prepared = self.prepare(&body, &ask).await;
        if audits {
            return Ok(self.audited(prepared, body, headers));
        }
        let (result, window) = match prepared {
            Offloaded::Done(Prepared::Forward { outcome, next }) => {
                let window = self.start_ahead(next, headers);
                (Ok(Compacted::original(body, outcome)), window)
            }
            Offloaded::Done(Prepared::Rewritten {
                body: rewritten,
                outcome,
                summary,
                covered,
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
                    summary,
                    covered,
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
        self.fits(result, window, api)
    }

    /// The notice form for this request: asked for, else configured, in the form the API's
    /// stream can carry.
    fn notice_mode(&self, headers: &HeaderMap, api: &ApiRequest) -> NoticeMode {
        let asked = control::notice_mode(headers, self.inner.planner.config.notice);
        api.front_end.notice_form(asked)
    }

    /// The control a request is planned under; or why it goes as it is before it is parsed:
    /// `x-compactor: off`, or a body under every trigger by its size alone (against the share
    /// summaries are made ahead at, when they are).
    fn control(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        caller: Caller<'_>,
        api: &ApiRequest,
        reactive: bool,
    ) -> Result<Control, Reason> {
        let planner = &self.inner.planner;
        let control = match Control::of(headers) {
            Control::Force if !caller.may_force => Control::Auto,
            control => control,
        };
        if control == Control::Off {
            return Err(Reason::DisabledByHeader);
        }
        if !reactive && control != Control::Force && api.front_end.size_bound_applies() {
            let settings = planner.settings_for(caller.key).0;
            let share = planner.config.precompute_at.unwrap_or(1.0);
            if provably_under(body, settings, &planner.windows.bounds(), share) {
                return Err(Reason::UnderTriggerBySize);
            }
        }
        Ok(control)
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
        let (force, api, reactive, at_least) =
            (ask.force, ask.api.clone(), ask.reactive, ask.at_least);
        let summary_prompt = ask.summary_prompt.map(str::to_string);
        let runtime = tokio::runtime::Handle::current();
        self.inner
            .pool
            .run(body.len(), move || {
                let ask = Ask {
                    credentials: &credentials,
                    upstream: &upstream,
                    force,
                    api: &api,
                    reactive,
                    summary_prompt: summary_prompt.as_deref(),
                    at_least,
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
        api: &ApiRequest,
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
            || (compacted.outcome.basis.is_measured() && api.streams(&compacted.body));
        if refuse && tokens >= window {
            return Err(CompactionRefused {
                failure: CompactionFailure::ContextTooLarge { tokens, window },
                outcome: Box::new(compacted.outcome),
            });
        }
        Ok(compacted)
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
    at_least: Option<u64>,
    /// The client asked for this compaction (a served contract): done in audit mode too.
    client_asked: bool,
}

impl<'p> Asked<'p> {
    /// The summary written to the client's own prompt (a template holding `{messages}`) in
    /// place of `summary_prompt`.
    pub fn summary_prompt(summary_prompt: Option<&'p str>) -> Asked<'p> {
        Asked {
            summary_prompt,
            ..Asked::default()
        }
    }

    /// A compaction the client asked for through a served contract (its answer is the
    /// compaction): made in audit mode too.
    pub fn client_asked(self) -> Asked<'p> {
        Asked {
            client_asked: true,
            ..self
        }
    }

    /// Only a body of at least `tokens` (counted as the planner counts it, in the same parse)
    /// is compacted: a served contract's own threshold.
    pub fn at_least(self, tokens: Option<u64>) -> Asked<'p> {
        Asked {
            at_least: tokens,
            ..self
        }
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
