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

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use wildmatch::WildMatch;

use crate::config::Config;
use crate::usage::Usage;

/// The OpenTelemetry GenAI token usage buckets.
const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];
/// The OpenTelemetry GenAI request duration buckets (seconds).
/// Estimate over real: within 5 % is the goal, 2× off is what an uncalibrated CJK count does.
const RATIO_BUCKETS: [f64; 12] = [
    0.25, 0.5, 0.67, 0.8, 0.9, 0.95, 1.05, 1.1, 1.25, 1.5, 2.0, 4.0,
];
const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
/// The OpenTelemetry GenAI time-to-first-token buckets (seconds).
const FIRST_TOKEN_BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
/// Time spent in compactor itself: tens of microseconds for a pass-through, milliseconds for a
/// large plan.
const OVERHEAD_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn histograms<L: Clone + std::hash::Hash + Eq>(make: fn() -> Histogram) -> Histograms<L> {
    Family::new_with_constructor(make)
}

/// A label value taken from the config (an upstream's name, a model pattern): cloning it is a
/// reference count, never an allocation on the request path.
pub type Name = Arc<str>;

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

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    status: u16,
    upstream: Name,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GenAiLabels {
    gen_ai_operation_name: &'static str,
    gen_ai_provider_name: Name,
    gen_ai_request_model: Name,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TokenLabels {
    gen_ai_operation_name: &'static str,
    gen_ai_provider_name: Name,
    gen_ai_request_model: Name,
    gen_ai_token_type: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CompactionLabels {
    outcome: &'static str,
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
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

/// Requests, model calls and the bytes they hold.
struct Traffic {
    requests: Family<RequestLabels, Counter>,
    overhead: Histogram,
    token_usage: Histograms<TokenLabels>,
    request_duration: Histograms<GenAiLabels>,
    first_token: Histograms<GenAiLabels>,
    bodies_in_flight: Gauge,
    buffered_bytes: Gauge,
    reloads: Family<ResultLabels, Counter>,
}

impl Traffic {
    fn register(registry: &mut Registry) -> Traffic {
        let requests = Family::default();
        registry.register(
            "compactor_requests",
            "Requests served, by route, status and upstream",
            requests.clone(),
        );
        let overhead = Histogram::new(OVERHEAD_BUCKETS);
        registry.register(
            "compactor_proxy_overhead_seconds",
            "Time spent in compactor itself per request (reading, planning, forwarding), upstreams and the summarizer excluded",
            overhead.clone(),
        );
        let token_usage: Histograms<TokenLabels> = histograms(|| Histogram::new(TOKEN_BUCKETS));
        registry.register(
            "gen_ai_client_token_usage",
            "Tokens used per model call, as the upstream's usage reports them (gen_ai_token_type: input or output)",
            token_usage.clone(),
        );
        let request_duration: Histograms<GenAiLabels> =
            histograms(|| Histogram::new(DURATION_BUCKETS));
        registry.register(
            "gen_ai_server_request_duration_seconds",
            "Duration of model calls through compactor, until the response body ends",
            request_duration.clone(),
        );
        let first_token: Histograms<GenAiLabels> =
            histograms(|| Histogram::new(FIRST_TOKEN_BUCKETS));
        registry.register(
            "gen_ai_server_time_to_first_token_seconds",
            "Time from a model call's arrival to the first byte of its response body",
            first_token.clone(),
        );
        let bodies_in_flight = Gauge::default();
        registry.register(
            "compactor_bodies_in_flight",
            "Request bodies held in memory (for routing or compaction) now",
            bodies_in_flight.clone(),
        );
        let buffered_bytes = Gauge::default();
        registry.register(
            "compactor_buffered_bytes",
            "Bytes of request bodies held in memory now",
            buffered_bytes.clone(),
        );
        let reloads = Family::default();
        registry.register(
            "compactor_config_reloads",
            "Configuration reloads (result: ok or refused)",
            reloads.clone(),
        );
        for result in ["ok", "refused"] {
            let _ = reloads.get_or_create(&ResultLabels { result });
        }
        Traffic {
            requests,
            overhead,
            token_usage,
            request_duration,
            first_token,
            bodies_in_flight,
            buffered_bytes,
            reloads,
        }
    }
}

/// What compaction did and what its summaries cost.
struct CompactionMetrics {
    compactions: Family<CompactionLabels, Counter>,
    tokens_before: Histogram,
    tokens_after: Histogram,
    tokens_saved: Counter,
    outputs_cleared: Counter,
    messages_dropped: Counter,
    summarizer_calls: Family<ResultLabels, Counter>,
    summarizer_duration: Histogram,
    summarizer_failures: Family<ReasonLabels, Counter>,
    reactive_retries: Family<ResultLabels, Counter>,
    precomputes: Counter,
    single_flight_joins: Counter,
    calibration_samples: Family<ResultLabels, Counter>,
    estimate_ratio: Histogram,
}

impl CompactionMetrics {
    fn register(registry: &mut Registry) -> CompactionMetrics {
        let compactions = Family::default();
        registry.register(
            "compactor_compactions",
            "Requests through compaction, by outcome and reason",
            compactions.clone(),
        );
        let tokens_before = Histogram::new(TOKEN_BUCKETS);
        registry.register(
            "compactor_compaction_tokens_before",
            "Estimated tokens of compacted requests before compaction",
            tokens_before.clone(),
        );
        let tokens_after = Histogram::new(TOKEN_BUCKETS);
        registry.register(
            "compactor_compaction_tokens_after",
            "Estimated tokens of compacted requests as forwarded",
            tokens_after.clone(),
        );
        let tokens_saved = Counter::default();
        registry.register(
            "compactor_tokens_saved",
            "Estimated input tokens compaction kept from being sent upstream",
            tokens_saved.clone(),
        );
        let outputs_cleared = Counter::default();
        registry.register(
            "compactor_tool_outputs_cleared",
            "Tool outputs replaced by placeholders (clear_tool_outputs stage)",
            outputs_cleared.clone(),
        );
        let messages_dropped = Counter::default();
        registry.register(
            "compactor_messages_dropped",
            "Messages dropped to fit the model's window (truncate stage)",
            messages_dropped.clone(),
        );
        let summarizer_calls = Family::default();
        registry.register(
            "compactor_summarizer_calls",
            "Summarizer calls made, by result",
            summarizer_calls.clone(),
        );
        let summarizer_duration = Histogram::new(DURATION_BUCKETS);
        registry.register(
            "compactor_summarizer_duration_seconds",
            "Duration of one summarizer call",
            summarizer_duration.clone(),
        );
        let summarizer_failures = Family::default();
        registry.register(
            "compactor_summarizer_failures",
            "Summaries that could not be had, by reason",
            summarizer_failures.clone(),
        );
        let single_flight_joins = Counter::default();
        registry.register(
            "compactor_single_flight_joins",
            "Requests that waited on a summary another request was already making",
            single_flight_joins.clone(),
        );
        let reactive_retries = Family::default();
        registry.register(
            "compactor_reactive_retries",
            "Requests retried compacted after an upstream context-length error (result: ok, failed, unchanged)",
            reactive_retries.clone(),
        );
        let precomputes = Counter::default();
        registry.register(
            "compactor_precomputes_started",
            "Summaries started ahead of need (precompute_at)",
            precomputes.clone(),
        );
        let calibration_samples = Family::default();
        registry.register(
            "compactor_token_calibration_samples",
            "Upstream input counts compared with compactor's count of the same body (result: used, outlier)",
            calibration_samples.clone(),
        );
        let estimate_ratio = Histogram::new(RATIO_BUCKETS);
        registry.register(
            "compactor_token_estimate_ratio",
            "compactor's token count of a forwarded body over the upstream's, before learning from it (1 is exact)",
            estimate_ratio.clone(),
        );
        for result in ["used", "outlier"] {
            let _ = calibration_samples.get_or_create(&ResultLabels { result });
        }
        for result in ["ok", "error"] {
            let _ = summarizer_calls.get_or_create(&ResultLabels { result });
        }
        for result in ["ok", "failed", "unchanged"] {
            let _ = reactive_retries.get_or_create(&ResultLabels { result });
        }
        CompactionMetrics {
            compactions,
            tokens_before,
            tokens_after,
            tokens_saved,
            outputs_cleared,
            messages_dropped,
            summarizer_calls,
            summarizer_duration,
            summarizer_failures,
            reactive_retries,
            precomputes,
            single_flight_joins,
            calibration_samples,
            estimate_ratio,
        }
    }
}

/// The summary cache and the replicas' shared tier.
struct Caching {
    cache_lookups: Family<ResultLabels, Counter>,
    cache_entries: Gauge,
    cache_bytes: Gauge,
    redis_up: Gauge,
    redis_commands: Family<ResultLabels, Counter>,
    remote_lookups: Family<ResultLabels, Counter>,
    leases: Family<ResultLabels, Counter>,
    lease_waiting: Gauge,
}

impl Caching {
    fn register(registry: &mut Registry) -> Caching {
        let cache_lookups = Family::default();
        registry.register(
            "compactor_summary_cache_lookups",
            "Summary cache lookups of requests over a trigger (result: hit or miss)",
            cache_lookups.clone(),
        );
        let cache_entries = Gauge::default();
        registry.register(
            "compactor_summary_cache_entries",
            "Summaries in the cache",
            cache_entries.clone(),
        );
        let cache_bytes = Gauge::default();
        registry.register(
            "compactor_summary_cache_bytes",
            "Weight of the summary cache, in bytes of summaries",
            cache_bytes.clone(),
        );
        let redis_up = Gauge::default();
        registry.register(
            "compactor_redis_up",
            "Whether the shared summary cache (Redis) is being used: 0 while its breaker is open",
            redis_up.clone(),
        );
        let redis_commands = Family::default();
        registry.register(
            "compactor_redis_commands",
            "Commands sent to Redis (result: ok or error, a timeout included)",
            redis_commands.clone(),
        );
        let remote_lookups = Family::default();
        registry.register(
            "compactor_summary_cache_remote_lookups",
            "Lookups in Redis of summaries the local cache did not have (result: hit or miss)",
            remote_lookups.clone(),
        );
        let leases = Family::default();
        registry.register(
            "compactor_redis_leases",
            "Summaries asked for through Redis (result: made here, made by another replica, taken over from a replica that died, waited past the timeout)",
            leases.clone(),
        );
        let lease_waiting = Gauge::default();
        registry.register(
            "compactor_redis_lease_waiting",
            "Requests waiting now for a summary another replica is making",
            lease_waiting.clone(),
        );
        // Label sets known in advance start at zero, so `rate()` sees them before they move.
        for result in ["hit", "miss"] {
            let _ = cache_lookups.get_or_create(&ResultLabels { result });
        }
        for result in ["ok", "error"] {
            let _ = redis_commands.get_or_create(&ResultLabels { result });
        }
        for result in ["hit", "miss"] {
            let _ = remote_lookups.get_or_create(&ResultLabels { result });
        }
        for result in ["made", "joined", "taken_over", "timeout"] {
            let _ = leases.get_or_create(&ResultLabels { result });
        }
        Caching {
            cache_lookups,
            cache_entries,
            cache_bytes,
            redis_up,
            redis_commands,
            remote_lookups,
            leases,
            lease_waiting,
        }
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
        if let Some((before, after)) = outcome.tokens_changed {
            self.compaction.tokens_before.observe(before as f64);
            self.compaction.tokens_after.observe(after as f64);
            self.compaction
                .tokens_saved
                .inc_by(before.saturating_sub(after));
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
            .summarizer_calls
            .get_or_create(&ResultLabels { result })
            .inc();
        self.compaction
            .summarizer_duration
            .observe(took.as_secs_f64());
    }

    /// Starts each of these failure reasons at zero.
    pub fn known_failures(&self, reasons: impl IntoIterator<Item = &'static str>) {
        for reason in reasons {
            let _ = self
                .compaction
                .summarizer_failures
                .get_or_create(&ReasonLabels { reason });
        }
    }

    /// A summary could not be had (`reason` is the failure's label).
    pub fn summary_failed(&self, reason: &'static str) {
        if self.enabled() {
            self.compaction
                .summarizer_failures
                .get_or_create(&ReasonLabels { reason })
                .inc();
        }
    }

    pub fn single_flight_joined(&self) {
        if self.enabled() {
            self.compaction.single_flight_joins.inc();
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
mod tests {
    use super::*;

    #[test]
    fn model_labels_are_the_configured_patterns_only() {
        let config = Config::from_yaml_with_env(
            "upstreams:\n  - name: a\n    base_url: http://x/v1\n    models: [\"*\"]\n  - name: b\n    base_url: http://y/v1\n    models: [\"llama-*\", \"gpt-4o*\"]\nmodels:\n  - match: \"gpt-4o*\"\n  - match: \"claude*\"\n",
            &|_| None,
        )
        .unwrap();
        let labels = ModelLabels::new(&config);
        assert_eq!(labels.label("gpt-4o-mini").as_deref(), Some("gpt-4o*"));
        assert_eq!(
            labels.label("claude-sonnet-4-5").as_deref(),
            Some("claude*")
        );
        assert_eq!(labels.label("llama-3"), Some(Arc::from("llama-*")));
        assert_eq!(labels.label("made-up-by-a-client"), None);
        assert_eq!(labels.patterns.len(), 3, "no duplicate, no bare *");
    }

    #[test]
    fn a_disabled_registry_counts_nothing() {
        let metrics = Metrics::new(false);
        metrics.finished(&Finished {
            route: Route::Api("chat_completions"),
            status: 200,
            upstream: None,
            model: None,
            duration: Duration::from_millis(5),
            first_byte: None,
            overhead: None,
            usage: None,
            compaction: None,
        });
        assert!(!metrics
            .render(Gauges::default())
            .contains("compactor_requests_total{"));
    }
}
