//! Making a summary: ahead of need or for this request, once for all who need it (single
//! flight), within the budget, chunk after chunk, vetted and kept in the store.

use super::calibrating::log_calibration;
use super::*;

impl CompactionEngine {
    /// Starts the summary a forwarded request's conversation will need, in the background;
    /// returns the request's window.
    pub(super) fn start_ahead(&self, next: Next, headers: &HeaderMap) -> Option<u64> {
        if let Some(job) = next.ahead {
            if let Some(base) = job.ahead_base {
                self.in_background(job, base, headers);
            }
        }
        next.window
    }

    /// Makes `job`'s summary off the request path, one at a time for its conversation's
    /// `base`; false when one is already being made for it.
    pub(super) fn in_background(&self, job: Box<Job>, base: CacheKey, headers: &HeaderMap) -> bool {
        if !lock(&self.inner.background.bases).insert(base) {
            return false;
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
        true
    }

    /// Gets the summary (shared with concurrent requests) and splices it in; without one, the
    /// `truncate` stage's body when there is one.
    pub(super) async fn summarize(
        &self,
        job: Job,
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
                return self.without_summary(job, body, failure, cache_use, summarizer_ms);
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
            summary: Some(summary.text.clone()),
            covered: job.splice.covered().to_vec(),
            notice: Some(Notice {
                mode: notice_mode,
                message: compacted_message(&outcome),
            }),
            outcome,
        })
    }

    /// The summary could not be had: the best fallback that fits, else the request as it is
    /// (or refused, with `fail_mode: closed`).
    fn without_summary(
        &self,
        mut job: Job,
        body: Bytes,
        failure: CompactionFailure,
        cache_use: CacheUse,
        summarizer_ms: Option<u64>,
    ) -> Result<Compacted, CompactionRefused> {
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
                summary: fallback.summary,
                covered: fallback.covered,
                notice: None,
            });
        }
        let mut result = self.failed(body, job.tokens_before, failure, cache_use);
        if let Ok(compacted) = &mut result {
            compacted.outcome.summarizer_ms = summarizer_ms;
        }
        result
    }

    /// What making `job`'s summary cost, in the summarizer model's estimated count: each call
    /// reads the prompt, the summary so far and its chunk, and writes a summary.
    pub(super) fn summarizer_usage(&self, job: &Job, summary: &CachedSummary) -> SummarizerUsage {
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
    pub(super) async fn summary_for(
        &self,
        job: &Job,
        flight: [u8; 32],
        headers: &HeaderMap,
    ) -> FlightResult {
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
    pub(super) fn summary_call(&self, job: &Job, headers: &HeaderMap) -> SummaryCall {
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
