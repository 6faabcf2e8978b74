//! Compaction in flight (DESIGN.md §1–§4): per request, threshold first, then the plan, then a
//! cached summary or one (single-flight) summarizer call, then the rewrite. Whatever goes
//! wrong, the original request is forwarded unless `fail_mode: closed` asks for a 503.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};
use http::StatusCode;

use super::cache::{Scope, ScopedLookup, SummaryCache};
use super::conversation::{Conversation, Message};
use super::digest::hash_parts;
use super::plan::{self, CachedSummary, Decision, Layout, PlanSettings};
use super::rewrite::{self, summary_message};
use super::summarizer::{HttpSummarizer, Summarizer, SummaryError, SummaryRequest};
use super::summary_input::{self, InputSettings};
use super::tokens::{ModelTable, TokenModel};
use super::{CacheUse, Outcome, OutcomeKind};
use crate::config::{Config, FailMode, NoticeMode, SummarizationConfig};
use crate::error::ProxyError;
use crate::sse::Notice;
use crate::upstream::{Upstream, Upstreams};

/// Request header steering compaction: `off` or `force`.
pub const CONTROL_HEADER: &str = "x-compactor";
/// Request header choosing the notice form for this request.
pub const NOTICE_HEADER: &str = "x-compactor-notice";

/// Bodies above this are planned on the blocking pool, off the reactor threads.
const INLINE_PLAN_LIMIT: usize = 1024 * 1024;

#[derive(Clone)]
pub struct CompactionEngine {
    inner: Arc<Inner>,
}

struct Inner {
    config: SummarizationConfig,
    settings: PlanSettings,
    models: ModelTable,
    cache: SummaryCache,
    summarizer: Arc<dyn Summarizer>,
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
    pub error: ProxyError,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Control {
    Auto,
    Off,
    Force,
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
    messages_summarized: usize,
    /// Tokens the summary replaces (summarized messages, plus the previous summary).
    replaced_tokens: u64,
    chunks: Vec<String>,
    previous: Option<String>,
    key: super::cache::CacheKey,
    model: String,
    upstream: String,
    token_model: TokenModel,
    tokens_before: u64,
    cache_hit: bool,
}

impl CompactionEngine {
    pub fn new(config: Arc<Config>, upstreams: Arc<Upstreams>) -> CompactionEngine {
        let timeout = Duration::from_secs_f64(config.summarization.timeout_secs);
        let summarizer = Arc::new(HttpSummarizer::new(upstreams, timeout));
        CompactionEngine::with_summarizer(&config, summarizer)
    }

    pub fn with_summarizer(config: &Config, summarizer: Arc<dyn Summarizer>) -> CompactionEngine {
        CompactionEngine {
            inner: Arc::new(Inner {
                config: config.summarization.clone(),
                settings: PlanSettings::from_config(&config.summarization),
                models: ModelTable::new(&config.models),
                cache: SummaryCache::new(config.cache.max_bytes),
                summarizer,
            }),
        }
    }

    pub fn cached_summaries(&self) -> usize {
        self.inner.cache.len()
    }

    pub async fn compact(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        upstream: &Upstream,
    ) -> Result<Compacted, CompactionRefused> {
        let control = match headers.get(CONTROL_HEADER).and_then(|v| v.to_str().ok()) {
            Some(v) if v.eq_ignore_ascii_case("off") => Control::Off,
            Some(v) if v.eq_ignore_ascii_case("force") => Control::Force,
            _ => Control::Auto,
        };
        if control == Control::Off {
            return Ok(Compacted::original(
                body,
                Outcome::skipped(0, "disabled_by_header"),
            ));
        }
        let notice_mode = headers
            .get(NOTICE_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(NoticeMode::parse)
            .unwrap_or(self.inner.config.notice);
        let credentials = Credentials::of(headers);
        let force = control == Control::Force;
        let upstream_name = upstream.name.clone();
        let prepared = {
            let inner = self.inner.clone();
            let body = body.clone();
            run_cpu(body.len(), move || {
                inner.prepare(&body, &credentials, &upstream_name, force)
            })
            .await
        };
        let job = match prepared {
            Some(Prepared::Forward { outcome }) => return Ok(Compacted::original(body, outcome)),
            Some(Prepared::Reused {
                body: rewritten,
                outcome,
            }) => {
                return Ok(Compacted {
                    body: Bytes::from(rewritten),
                    rewritten: true,
                    outcome,
                    notice: None,
                })
            }
            Some(Prepared::Summarize(job)) => job,
            None => {
                return self.failed(body, 0, CompactionFailure::Internal, CacheUse::NotConsulted)
            }
        };

        let started = Instant::now();
        let summary = self.summary_for(&job, headers).await;
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
        let rewritten = {
            let body = body.clone();
            let layout = job.layout.clone();
            let role = self.inner.config.summary_role;
            let text = summary.text.clone();
            run_cpu(body.len(), move || {
                let conversation = Conversation::parse(&body).ok()?;
                rewrite::rewrite(&conversation, &layout, &summary_message(&text, role)).ok()
            })
            .await
            .flatten()
        };
        let Some(rewritten) = rewritten else {
            return self.failed(
                body,
                job.tokens_before,
                CompactionFailure::RewriteInvalid,
                cache_use,
            );
        };
        let tokens_after = job.layout.projected_tokens
            - self
                .inner
                .settings
                .summary_estimate_tokens
                .min(job.layout.projected_tokens)
            + summary.tokens;
        let outcome = Outcome {
            kind: OutcomeKind::Summarized,
            tokens_before: job.tokens_before,
            tokens_after,
            messages_summarized: job.messages_summarized,
            summarizer_ms: Some(summarizer_ms),
            cache: cache_use,
            headroom_unmet: job.layout.headroom_unmet,
            reason: if job.previous.is_some() {
                "incremental"
            } else {
                "fresh"
            },
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

    /// The summary for a job: made once for all concurrent requests that need it.
    async fn summary_for(
        &self,
        job: &Job,
        headers: &HeaderMap,
    ) -> Result<Arc<CachedSummary>, CompactionFailure> {
        let request = SummaryRequest {
            upstream: job.upstream.clone(),
            model: job.model.clone(),
            prompt: String::new(),
            max_tokens: self.inner.config.summary_max_tokens,
            client_authorization: headers.get(http::header::AUTHORIZATION).cloned(),
            client_api_key: headers.get("api-key").cloned(),
        };
        let inner = self.inner.clone();
        // Requests sharing a prefix may still keep different messages verbatim (a newer user
        // message after the cut, say); only identical layouts share one summary.
        let excluded: Vec<u8> = job
            .layout
            .excluded
            .iter()
            .flat_map(|index| (*index as u64).to_le_bytes())
            .collect();
        let flight = hash_parts([job.key.as_slice(), &excluded]);
        let (result, _ran) = self
            .inner
            .cache
            .single_flight(flight, job.key, || async move {
                let mut previous = job.previous.clone();
                for chunk in &job.chunks {
                    let prompt = summary_input::render_prompt(
                        inner.config.summary_prompt.as_deref(),
                        previous.as_deref(),
                        chunk,
                    );
                    let text = inner
                        .summarizer
                        .summarize(SummaryRequest {
                            prompt,
                            ..request.clone()
                        })
                        .await
                        .map_err(CompactionFailure::Summarizer)?;
                    previous = Some(text);
                }
                let text = previous.ok_or(CompactionFailure::Summarizer(SummaryError::Blank))?;
                let tokens = summary_tokens(&text, &inner.config, &job.token_model);
                if tokens >= job.replaced_tokens {
                    return Err(CompactionFailure::NotSmaller);
                }
                Ok(Arc::new(CachedSummary {
                    cut: job.layout.cut,
                    excluded: job.layout.excluded.clone(),
                    text,
                    tokens,
                }))
            })
            .await;
        result
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
            FailMode::Closed => Err(CompactionRefused {
                error: ProxyError::CompactionFailed(failure.to_string()),
                outcome,
            }),
        }
    }
}

impl Inner {
    /// The CPU part: parse, threshold, cache lookup, plan, and for reuse the rewrite.
    fn prepare(
        &self,
        body: &[u8],
        credentials: &Credentials,
        upstream: &str,
        force: bool,
    ) -> Prepared {
        let Ok(conversation) = Conversation::parse(body) else {
            return Prepared::Forward {
                outcome: Outcome::skipped(0, "unparsable_body"),
            };
        };
        let token_model = self.models.lookup(conversation.model.as_deref());
        let model = self
            .config
            .model_name
            .clone()
            .or_else(|| conversation.model.as_deref().map(str::to_string))
            .unwrap_or_default();
        let upstream = self
            .config
            .upstream
            .clone()
            .unwrap_or_else(|| upstream.to_string());
        let mut lookup = ScopedLookup::new(&self.cache, || Scope {
            tenant: credentials.tenant(),
            fingerprint: self.fingerprint(&model, &upstream),
        });
        let plan = plan::plan(
            &conversation,
            &self.settings,
            &token_model,
            force,
            &mut lookup,
        );
        let cache_use = match (plan.cache_consulted, plan.cache_hit) {
            (false, _) => CacheUse::NotConsulted,
            (true, true) => CacheUse::Hit,
            (true, false) => CacheUse::Miss,
        };
        match plan.decision {
            Decision::PassThrough { reason } => Prepared::Forward {
                outcome: Outcome {
                    cache: cache_use,
                    ..Outcome::skipped(plan.tokens_before, reason)
                },
            },
            Decision::Reuse { layout, summary } => {
                let json = summary_message(&summary.text, self.config.summary_role);
                match rewrite::rewrite(&conversation, &layout, &json) {
                    Ok(body) => Prepared::Reused {
                        body,
                        outcome: Outcome {
                            kind: OutcomeKind::Reused,
                            tokens_before: plan.tokens_before,
                            tokens_after: layout.projected_tokens,
                            messages_summarized: 0,
                            summarizer_ms: None,
                            cache: CacheUse::Hit,
                            headroom_unmet: layout.headroom_unmet,
                            reason: "sticky",
                        },
                    },
                    Err(_) => Prepared::Forward {
                        outcome: Outcome {
                            kind: OutcomeKind::Failed,
                            cache: CacheUse::Hit,
                            ..Outcome::skipped(plan.tokens_before, "rewrite_invalid")
                        },
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
                    return Prepared::Forward {
                        outcome: Outcome::skipped(plan.tokens_before, "no_chain"),
                    };
                };
                if model.is_empty() {
                    return Prepared::Forward {
                        outcome: Outcome::skipped(plan.tokens_before, "no_model"),
                    };
                }
                let entries = summary_input::transcript_entries(&conversation, &to_summarize);
                let input = summary_input::build(
                    entries,
                    previous.as_ref().map(|p| p.text.as_str()),
                    &InputSettings {
                        budget: self.config.trim_tokens_to_summarize,
                        oversize: self.config.oversize,
                        model: token_model,
                    },
                );
                // The chain was seeded with this request's scope: its digests are cache keys.
                let key = chain[layout.cut];
                drop(lookup);
                Prepared::Summarize(Box::new(Job {
                    key,
                    layout,
                    messages_summarized: to_summarize.len(),
                    replaced_tokens,
                    chunks: input.chunks,
                    previous: input.previous,
                    model,
                    upstream,
                    token_model,
                    tokens_before: plan.tokens_before,
                    cache_hit: plan.cache_hit,
                }))
            }
        }
    }

    /// Everything that changes what a summary says: summaries made differently never mix.
    fn fingerprint(&self, model: &str, upstream: &str) -> [u8; 32] {
        let c = &self.config;
        let description = serde_json::json!({
            "model": model,
            "upstream": upstream,
            "prompt": c.summary_prompt,
            "trim": c.trim_tokens_to_summarize,
            "oversize": c.oversize,
            "max_tokens": c.summary_max_tokens,
            "role": c.summary_role,
        });
        hash_parts([description.to_string().as_bytes()])
    }
}

/// The headers that identify a client (cheap reference-counted copies).
struct Credentials([Option<HeaderValue>; 3]);

const CREDENTIAL_HEADERS: [&str; 3] = ["authorization", "api-key", "x-api-key"];

impl Credentials {
    fn of(headers: &HeaderMap) -> Credentials {
        Credentials(CREDENTIAL_HEADERS.map(|name| headers.get(name).cloned()))
    }

    /// A hash of the client's credential: tenants never share summaries.
    fn tenant(&self) -> [u8; 32] {
        let values = self
            .0
            .iter()
            .map(|value| value.as_ref().map(HeaderValue::as_bytes).unwrap_or(b""));
        hash_parts(
            CREDENTIAL_HEADERS
                .iter()
                .map(|n| n.as_bytes())
                .chain(values),
        )
    }
}

fn summary_tokens(text: &str, config: &SummarizationConfig, model: &TokenModel) -> u64 {
    let json = summary_message(text, config.summary_role);
    Message::parse(&json)
        .map(|m| m.tokens(model))
        .unwrap_or(u64::MAX)
}

/// Why compaction was needed but could not be applied.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CompactionFailure {
    #[error(transparent)]
    Summarizer(#[from] SummaryError),
    #[error("the summary is not smaller than what it replaces")]
    NotSmaller,
    #[error("the rewritten request did not validate")]
    RewriteInvalid,
    #[error("the planning task did not complete")]
    Internal,
}

impl CompactionFailure {
    /// A low-cardinality label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            CompactionFailure::Summarizer(SummaryError::NoUpstream(_)) => "summarizer_no_upstream",
            CompactionFailure::Summarizer(SummaryError::Transport(_)) => "summarizer_unreachable",
            CompactionFailure::Summarizer(SummaryError::Status(_)) => "summarizer_http_error",
            CompactionFailure::Summarizer(SummaryError::Timeout(_)) => "summarizer_timeout",
            CompactionFailure::Summarizer(SummaryError::Blank) => "summarizer_blank",
            CompactionFailure::NotSmaller => "summary_not_smaller",
            CompactionFailure::RewriteInvalid => "rewrite_invalid",
            CompactionFailure::Internal => "internal_error",
        }
    }
}

/// Runs CPU-heavy work inline for small bodies, on the blocking pool for large ones.
async fn run_cpu<T, F>(size: usize, work: F) -> Option<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if size <= INLINE_PLAN_LIMIT {
        Some(work())
    } else {
        tokio::task::spawn_blocking(work).await.ok()
    }
}
