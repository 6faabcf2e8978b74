//! Prometheus metrics (`GET /metrics`): the OpenTelemetry GenAI conventions for the generic
//! part (token usage read from the upstream's `usage`, request duration, time to first token),
//! and compactor's own: requests, the time spent in compactor, compactions and the tokens they
//! saved, summarizer calls, the summary cache, buffered request bodies.
//!
//! No label takes a value a client chooses freely: models are labelled by the configured
//! pattern they match (`models[].match`, an upstream's globs) or `other`; upstreams, routes,
//! outcomes and reasons come from the config and compactor's own fixed lists.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use wildmatch::WildMatch;

use crate::config::Config;
use crate::usage::Usage;

mod families;

pub use families::Name;
use families::{
    Caching, CompactionLabels, CompactionMetrics, GenAiLabels, OutcomeLabels, ReasonLabels,
    RequestLabels, ResultLabels, TokenLabels, Traffic,
};

/// The route a request took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Route {
    /// A model call on an API compactor reads, by the API's label.
    Api(&'static str),
    /// Another path forwarded upstream.
    #[default]
    Other,
    /// Answered by compactor itself (health, metrics, errors before routing).
    Local,
}

impl Route {
    pub fn label(self) -> &'static str {
        match self {
            Route::Api(label) => label,
            Route::Other => "other",
            Route::Local => "local",
        }
    }

    /// Whether it is a model call the GenAI metrics describe.
    pub fn is_generation(self) -> bool {
        matches!(self, Route::Api(_))
    }
}

/// What one finished request tells the metrics.
pub struct Finished<'r> {
    pub route: Route,
    pub status: u16,
    pub upstream: Option<&'r Name>,
    pub model: Option<&'r Name>,
    /// From the request's arrival to the end of its response body.
    pub duration: Duration,
    /// From the request's arrival to the first byte of its response body.
    pub first_byte: Option<Duration>,
    /// Time spent in compactor itself (everything but waiting on upstreams).
    pub overhead: Option<Duration>,
    pub usage: Option<Usage>,
    pub compaction: Option<CompactionRecord>,
}

/// What compaction did to one request, as the metrics count it (compaction's `Outcome` says
/// it this way).
#[derive(Debug, Clone, Copy, Default)]
pub struct CompactionRecord {
    pub outcome: &'static str,
    pub reason: &'static str,
    /// The summary cache's answer, when it was asked: hit or miss.
    pub cache_hit: Option<bool>,
    pub outputs_cleared: usize,
    pub messages_dropped: usize,
    pub precompute_started: bool,
    /// The estimate before and after, when compaction changed the request.
    pub tokens_changed: Option<(u64, u64)>,
    /// In audit mode, what enforce would have done.
    pub audit: Option<AuditRecord>,
}

/// What audit mode counts of one request.
#[derive(Debug, Clone, Copy, Default)]
pub struct AuditRecord {
    pub would: &'static str,
    pub tokens_saved: u64,
    pub summarizer_tokens: u64,
    pub prefix_break: bool,
    pub shadow: bool,
}

/// Every metric compactor exports, and the registry that renders them.
pub struct Metrics {
    enabled: AtomicBool,
    registry: Registry,
    other: Name,
    traffic: Traffic,
    compaction: CompactionMetrics,
    caching: Caching,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(true)
    }
}

impl Metrics {
    pub fn new(enabled: bool) -> Metrics {
        let mut registry = Registry::default();
        Metrics {
            enabled: AtomicBool::new(enabled),
            other: Arc::from("other"),
            traffic: Traffic::register(&mut registry),
            compaction: CompactionMetrics::register(&mut registry),
            caching: Caching::register(&mut registry),
            registry,
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Follows `telemetry.metrics` across reloads.
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    /// Counts one request once its response has ended.
    pub fn finished(&self, request: &Finished<'_>) {
        if !self.enabled() {
            return;
        }
        let upstream = request.upstream.unwrap_or(&self.other);
        self.traffic
            .requests
            .get_or_create(&RequestLabels {
                route: request.route.label(),
                status: request.status,
                upstream: upstream.clone(),
            })
            .inc();
        if let Some(overhead) = request.overhead {
            self.traffic.overhead.observe(overhead.as_secs_f64());
        }
        if let Some(outcome) = &request.compaction {
            self.compaction(outcome);
        }
        if !request.route.is_generation() || request.upstream.is_none() {
            return;
        }
        let labels = GenAiLabels {
            gen_ai_operation_name: "chat",
            gen_ai_provider_name: upstream.clone(),
            gen_ai_request_model: request.model.unwrap_or(&self.other).clone(),
        };
        self.traffic
            .request_duration
            .get_or_create(&labels)
            .observe(request.duration.as_secs_f64());
        if let Some(first) = request
            .first_byte
            .filter(|_| (200..300).contains(&request.status))
        {
            self.traffic
                .first_token
                .get_or_create(&labels)
                .observe(first.as_secs_f64());
        }
        if let Some(usage) = request.usage {
            let tokens = [("input", usage.input), ("output", usage.output)];
            for (kind, count) in tokens {
                let Some(count) = count else { continue };
                self.traffic
                    .token_usage
                    .get_or_create(&TokenLabels {
                        gen_ai_operation_name: labels.gen_ai_operation_name,
                        gen_ai_provider_name: labels.gen_ai_provider_name.clone(),
                        gen_ai_request_model: labels.gen_ai_request_model.clone(),
                        gen_ai_token_type: kind,
                    })
                    .observe(count as f64);
            }
        }
    }

    fn compaction(&self, outcome: &CompactionRecord) {
        self.compaction
            .compactions
            .get_or_create(&CompactionLabels {
                outcome: outcome.outcome,
                reason: outcome.reason,
            })
            .inc();
        match outcome.cache_hit {
            Some(true) => self.lookup("hit"),
            Some(false) => self.lookup("miss"),
            None => {}
        }
        if outcome.outputs_cleared > 0 {
            self.compaction
                .outputs_cleared
                .inc_by(outcome.outputs_cleared as u64);
        }
        if outcome.messages_dropped > 0 {
            self.compaction
                .messages_dropped
                .inc_by(outcome.messages_dropped as u64);
        }
        if outcome.precompute_started {
            self.compaction.precomputes.inc();
        }
        if let Some(audit) = &outcome.audit {
            self.audit(audit);
        }
        if let Some((before, after)) = outcome.tokens_changed {
            self.compaction.tokens_before.observe(before as f64);
            self.compaction.tokens_after.observe(after as f64);
            self.compaction
                .tokens_saved
                .inc_by(before.saturating_sub(after));
        }
    }

    fn audit(&self, audit: &AuditRecord) {
        let metrics = &self.compaction.audit;
        metrics
            .outcomes
            .get_or_create(&OutcomeLabels {
                outcome: audit.would,
            })
            .inc();
        metrics.tokens_saved.inc_by(audit.tokens_saved);
        metrics.summarizer_tokens.inc_by(audit.summarizer_tokens);
        if audit.prefix_break {
            metrics.prefix_breaks.inc();
        }
        if audit.shadow {
            metrics.shadow_summaries.inc();
        }
    }

    fn lookup(&self, result: &'static str) {
        self.caching
            .cache_lookups
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// One sample of an upstream's input count against compactor's: its ratio, and whether
    /// it was used or set aside as an outlier.
    pub fn calibration(&self, used: bool, ratio: f64) {
        if !self.enabled() {
            return;
        }
        let result = if used { "used" } else { "outlier" };
        self.compaction
            .calibration_samples
            .get_or_create(&ResultLabels { result })
            .inc();
        self.compaction.estimate_ratio.observe(ratio);
    }

    pub fn summarizer_call(&self, ok: bool, took: Duration) {
        if !self.enabled() {
            return;
        }
        let result = if ok { "ok" } else { "error" };
        self.compaction
            .summarizer
            .calls
            .get_or_create(&ResultLabels { result })
            .inc();
        self.compaction
            .summarizer
            .duration
            .observe(took.as_secs_f64());
    }

    /// Starts each of these failure reasons at zero.
    pub fn known_failures(&self, reasons: impl IntoIterator<Item = &'static str>) {
        for reason in reasons {
            let _ = self
                .compaction
                .summarizer
                .failures
                .get_or_create(&ReasonLabels { reason });
        }
    }

    /// A summary could not be had (`reason` is the failure's label).
    /// Lookups answered for one request, and the bytes they returned.
    pub fn expansions(&self, rounds: u64, bytes: u64) {
        if self.enabled() && rounds > 0 {
            self.compaction.expansion_rounds.inc_by(rounds);
            self.compaction.expansion_bytes.inc_by(bytes);
        }
    }

    pub fn summary_failed(&self, reason: &'static str) {
        if self.enabled() {
            self.compaction
                .summarizer
                .failures
                .get_or_create(&ReasonLabels { reason })
                .inc();
        }
    }

    pub fn single_flight_joined(&self) {
        if self.enabled() {
            self.compaction.summarizer.single_flight_joins.inc();
        }
    }

    /// A reactive retry ended: `ok` (answered), `failed` (the first error went back) or
    /// `unchanged` (compaction could not change the request).
    pub fn reactive_retry(&self, result: &'static str) {
        if self.enabled() {
            self.compaction
                .reactive_retries
                .get_or_create(&ResultLabels { result })
                .inc();
        }
    }

    pub fn redis_up(&self, up: bool) {
        self.caching.redis_up.set(i64::from(up));
    }

    pub fn redis_command(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.caching
            .redis_commands
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    pub fn remote_lookup(&self, hit: bool) {
        let result = if hit { "hit" } else { "miss" };
        self.caching
            .remote_lookups
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// How a summary asked for through Redis was had: `made`, `joined`, `taken_over`, `timeout`.
    pub fn lease(&self, result: &'static str) {
        self.caching
            .leases
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// A request starts (`true`) or stops waiting on another replica's summary.
    pub fn lease_waiting(&self, waiting: bool) {
        if waiting {
            self.caching.lease_waiting.inc();
        } else {
            self.caching.lease_waiting.dec();
        }
    }

    pub fn reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "refused" };
        self.traffic
            .reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// The text exposition, with the gauges read now.
    pub fn render(&self, gauges: Gauges) -> String {
        self.caching.cache_entries.set(gauges.cache_entries as i64);
        self.caching.cache_bytes.set(gauges.cache_bytes as i64);
        self.traffic
            .bodies_in_flight
            .set(gauges.bodies_in_flight as i64);
        self.traffic
            .buffered_bytes
            .set(gauges.buffered_bytes as i64);
        let mut out = String::with_capacity(16 * 1024);
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!("cannot render metrics: {e}");
        }
        out
    }
}

/// Values read when `/metrics` is scraped.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gauges {
    pub cache_entries: u64,
    pub cache_bytes: u64,
    pub bodies_in_flight: u64,
    pub buffered_bytes: u64,
}

/// Model label values: the configured patterns a model name may match, most specific first
/// (`models[].match`, then the upstreams' globs other than `*`); everything else is `other`.
pub struct ModelLabels {
    patterns: Vec<(WildMatch, Name)>,
}

impl ModelLabels {
    pub fn new(config: &Config) -> ModelLabels {
        let mut seen: Vec<&str> = Vec::new();
        let models = config.models.iter().map(|m| m.pattern.as_str());
        let upstreams = config
            .upstreams
            .iter()
            .flat_map(|u| u.models.iter())
            .map(String::as_str);
        let patterns = models
            .chain(upstreams)
            .filter(|p| *p != "*" && !p.is_empty())
            .filter(|p| {
                let new = !seen.contains(p);
                seen.push(p);
                new
            })
            .map(|p| (WildMatch::new(p), Arc::from(p)))
            .collect();
        ModelLabels { patterns }
    }

    /// The label for a request's model: the first pattern it matches, else None (`other`).
    pub fn label(&self, model: &str) -> Option<Name> {
        self.patterns
            .iter()
            .find(|(glob, _)| glob.matches(model))
            .map(|(_, name)| name.clone())
    }
}

#[cfg(test)]
mod tests;
