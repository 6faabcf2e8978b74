//! The one log line per request, written once its response body has ended, failed, or was
//! dropped (a client that went away), and the request counted in the metrics at the same
//! moment. No message content and no credential is ever in either.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::body::{BoxError, ProxyBody};
use crate::compaction::engine::calibrating::CalibrationSample;
use crate::metrics::{Finished, Metrics, Name, Route};
use crate::usage::UsageTap;

/// What the request log line says; filled in as the request goes through its phases.
#[derive(Default)]
pub struct RequestLog {
    /// Both are cheap clones of the request's own (shared) parts, not copies.
    pub method: http::Method,
    pub uri: http::Uri,
    pub status: u16,
    pub route: Route,
    pub upstream: Option<Name>,
    pub model: Option<String>,
    /// The client key's name, when auth is on.
    pub key: Option<String>,
    pub bytes_in: u64,
    pub error: Option<&'static str>,
    pub compaction: Option<crate::compaction::Outcome>,
    /// Where the request is counted, when metrics are on.
    pub metrics: Option<Arc<Metrics>>,
    /// The configured pattern the model matched, for the metrics.
    pub model_label: Option<Name>,
    /// When the response headers were ready, from the request's arrival.
    pub headers_after: Option<Duration>,
    /// Time spent waiting on upstreams for response headers.
    pub upstream_wait: Duration,
    /// The request's trace span (none when traces are off): it ends with the response body.
    pub span: Option<tracing::Span>,
    /// The forwarded body, to calibrate its model's count once the usage is read.
    pub calibration: Option<CalibrationSample>,
    /// The lookups compactor answered for it (`summarization.retrieval`), when it offered any.
    pub expansions: Option<Arc<crate::retrieval::Tally>>,
}

/// Counts the bytes a client received and writes the request's log line exactly once: when the
/// body ends, fails, or is dropped early (a client that went away).
pub struct LoggedBody {
    inner: ProxyBody,
    log: Option<RequestLog>,
    started: Instant,
    bytes_out: u64,
    first_byte: Option<Duration>,
    /// The usage the upstream reports, read as the body streams past (model calls only).
    usage: Option<Box<UsageTap>>,
}

impl LoggedBody {
    pub fn new(inner: ProxyBody, log: RequestLog, started: Instant) -> Self {
        let reads_usage = (log.metrics.is_some() || log.calibration.is_some())
            && log.route.is_generation()
            && (200..300).contains(&log.status);
        LoggedBody {
            inner,
            usage: reads_usage.then(Box::default),
            log: Some(log),
            started,
            bytes_out: 0,
            first_byte: None,
        }
    }

    fn finish(&mut self, end: &'static str) {
        let Some(mut log) = self.log.take() else {
            return;
        };
        let counted = self.usage.as_ref().and_then(|tap| tap.input_total());
        if let (Some(sample), Some(counted)) = (log.calibration.take(), counted) {
            sample.record(counted);
        }
        let elapsed = self.started.elapsed();
        emit_log_line(&log, elapsed, self.bytes_out, end);
        record_span(&log);
        if let (Some(metrics), Some(tally)) = (&log.metrics, &log.expansions) {
            metrics.expansions(
                tally.rounds.load(Ordering::Relaxed),
                tally.bytes.load(Ordering::Relaxed),
            );
        }
        if let Some(metrics) = &log.metrics {
            let summarizer = log
                .compaction
                .as_ref()
                .and_then(|c| c.summarizer_ms)
                .map(Duration::from_millis)
                .unwrap_or_default();
            metrics.finished(&Finished {
                route: log.route,
                status: log.status,
                upstream: log.upstream.as_ref(),
                model: log.model_label.as_ref(),
                duration: elapsed,
                first_byte: self.first_byte,
                overhead: log
                    .headers_after
                    .map(|at| at.saturating_sub(log.upstream_wait + summarizer)),
                usage: self.usage.as_ref().and_then(|tap| tap.usage()),
                compaction: log
                    .compaction
                    .as_ref()
                    .map(crate::compaction::Outcome::record),
            });
        }
    }
}

fn emit_log_line(log: &RequestLog, elapsed: Duration, bytes_out: u64, end: &'static str) {
    // Health and readiness probes arrive every few seconds from every orchestrator: answered
    // well, they would drown the lines an operator reads, so they log at debug (as nginx
    // users turn `access_log off` for them). A refused probe still logs at info, and so does
    // a compaction compactor answered itself (a served compact call or trigger).
    if log.route == Route::Local && log.status < 400 && log.compaction.is_none() {
        tracing::debug!(
            target: "compactor::access",
            method = %log.method, path = log.uri.path(), status = log.status,
            duration_ms = elapsed.as_secs_f64() * 1000.0, bytes_out, end,
            "request"
        );
        return;
    }
    if !tracing::enabled!(target: "compactor::access", tracing::Level::INFO) {
        return;
    }
    let duration_ms = format!("{:.2}", elapsed.as_secs_f64() * 1000.0);
    let upstream = log.upstream.as_deref().unwrap_or("-");
    let model = log.model.as_deref().unwrap_or("-");
    let error = log.error.unwrap_or("-");
    let key = log.key.as_deref().unwrap_or("-");
    match &log.compaction {
        None => tracing::info!(
            target: "compactor::access",
            method = %log.method, path = log.uri.path(), status = log.status, upstream, model, key,
            duration_ms, bytes_in = log.bytes_in, bytes_out, end, error,
            "request"
        ),
        Some(c) => tracing::info!(
            target: "compactor::access",
            method = %log.method, path = log.uri.path(), status = log.status, upstream, model, key,
            duration_ms, bytes_in = log.bytes_in, bytes_out, end, error,
            compaction = c.label(), reason = c.reason.label(),
            tokens_before = c.token_counts().map(|(before, _)| before),
            tokens_after = c.token_counts().map(|(_, after)| after), messages_summarized = c.messages_summarized,
            summarizer_ms = c.summarizer_ms.unwrap_or(0), cache = c.cache_label(),
            coverage = c.coverage.map(|v| (v * 100.0).round() / 100.0),
            headroom_unmet = c.headroom_unmet, outputs_cleared = c.outputs_cleared,
            messages_dropped = c.messages_dropped, precompute = c.precompute_started,
            audit = c.audit.map_or("-", |audit| audit.would.label()),
            audit_tokens_after = c.audit.map(|audit| audit.tokens_after),
            expansions = log.expansions.as_ref().map(|t| t.rounds.load(Ordering::Relaxed)),
            expansion_bytes = log.expansions.as_ref().map(|t| t.bytes.load(Ordering::Relaxed)),
            "request"
        ),
    }
}

/// What the log line says, on the request's span too.
fn record_span(log: &RequestLog) {
    let Some(span) = &log.span else {
        return;
    };
    span.record("http.response.status_code", log.status);
    if let Some(upstream) = &log.upstream {
        span.record("gen_ai.provider.name", upstream.as_ref());
    }
    if log.route.is_generation() {
        let model = log.model_label.as_deref().unwrap_or("other");
        span.record("gen_ai.operation.name", "chat");
        span.record("gen_ai.request.model", model);
        span.record("otel.name", format!("chat {model}"));
    }
    if let Some(c) = &log.compaction {
        span.record("compactor.compaction", c.label());
        span.record("compactor.reason", c.reason.label());
        if let Some((before, after)) = c.token_counts() {
            span.record("compactor.tokens_before", before);
            span.record("compactor.tokens_after", after);
        }
    }
}

impl Body for LoggedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if self.first_byte.is_none() {
                        self.first_byte = Some(self.started.elapsed());
                    }
                    self.bytes_out += data.len() as u64;
                    if let Some(tap) = &mut self.usage {
                        tap.observe(data);
                    }
                }
            }
            Poll::Ready(Some(Err(_))) => self.finish("error"),
            Poll::Ready(None) => self.finish("complete"),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for LoggedBody {
    fn drop(&mut self) {
        // A body dropped before its end means the client went away (or hyper never polled an
        // empty body to its end); either way the line is still written.
        let end = if self.inner.is_end_stream() {
            "complete"
        } else {
            "client_gone"
        };
        self.finish(end);
    }
}
