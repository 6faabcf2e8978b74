//! Every metric family compactor registers, by concern (traffic, compaction, caching), with
//! their labels and buckets.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// A label value taken from the config (an upstream's name, a model pattern): cloning it is a
/// reference count, never an allocation on the request path.
pub type Name = Arc<str>;

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

/// `metric`, registered under `name` with its help text.
fn registered<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// Each of these results of `family` counted from zero, so it is exported before it happens.
fn at_zero(family: &Family<ResultLabels, Counter>, results: &[&'static str]) {
    for &result in results {
        let _ = family.get_or_create(&ResultLabels { result });
    }
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn histograms<L: Clone + std::hash::Hash + Eq>(make: fn() -> Histogram) -> Histograms<L> {
    Family::new_with_constructor(make)
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct RequestLabels {
    pub(super) route: &'static str,
    pub(super) status: u16,
    pub(super) upstream: Name,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct GenAiLabels {
    pub(super) gen_ai_operation_name: &'static str,
    pub(super) gen_ai_provider_name: Name,
    pub(super) gen_ai_request_model: Name,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct TokenLabels {
    pub(super) gen_ai_operation_name: &'static str,
    pub(super) gen_ai_provider_name: Name,
    pub(super) gen_ai_request_model: Name,
    pub(super) gen_ai_token_type: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct CompactionLabels {
    pub(super) outcome: &'static str,
    pub(super) reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct OutcomeLabels {
    pub(super) outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ResultLabels {
    pub(super) result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ReasonLabels {
    pub(super) reason: &'static str,
}

/// Requests, model calls and the bytes they hold.
pub(super) struct Traffic {
    pub(super) requests: Family<RequestLabels, Counter>,
    pub(super) overhead: Histogram,
    pub(super) token_usage: Histograms<TokenLabels>,
    pub(super) request_duration: Histograms<GenAiLabels>,
    pub(super) first_token: Histograms<GenAiLabels>,
    pub(super) bodies_in_flight: Gauge,
    pub(super) buffered_bytes: Gauge,
    pub(super) reloads: Family<ResultLabels, Counter>,
}

impl Traffic {
    pub(super) fn register(registry: &mut Registry) -> Traffic {
        let requests = registered(
            registry,
            "compactor_requests",
            "Requests served, by route, status and upstream",
            Family::default(),
        );
        let overhead = registered(registry, "compactor_proxy_overhead_seconds", "Time spent in compactor itself per request (reading, planning, forwarding), upstreams and the summarizer excluded", Histogram::new(OVERHEAD_BUCKETS));
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
        let bodies_in_flight = registered(
            registry,
            "compactor_bodies_in_flight",
            "Request bodies held in memory (for routing or compaction) now",
            Gauge::default(),
        );
        let buffered_bytes = registered(
            registry,
            "compactor_buffered_bytes",
            "Bytes of request bodies held in memory now",
            Gauge::default(),
        );
        let reloads = registered(
            registry,
            "compactor_config_reloads",
            "Configuration reloads (result: ok or refused)",
            Family::default(),
        );
        at_zero(&reloads, &["ok", "refused"]);
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
pub(super) struct CompactionMetrics {
    pub(super) compactions: Family<CompactionLabels, Counter>,
    pub(super) tokens_before: Histogram,
    pub(super) tokens_after: Histogram,
    pub(super) tokens_saved: Counter,
    pub(super) outputs_cleared: Counter,
    pub(super) messages_dropped: Counter,
    pub(super) reactive_retries: Family<ResultLabels, Counter>,
    pub(super) precomputes: Counter,
    pub(super) expansion_rounds: Counter,
    pub(super) expansion_bytes: Counter,
    pub(super) calibration_samples: Family<ResultLabels, Counter>,
    pub(super) estimate_ratio: Histogram,
    pub(super) summarizer: SummarizerMetrics,
    pub(super) audit: AuditMetrics,
}

/// Audit mode: what enforce would have done with the requests forwarded as they came.
pub(super) struct AuditMetrics {
    pub(super) outcomes: Family<OutcomeLabels, Counter>,
    pub(super) tokens_saved: Counter,
    pub(super) summarizer_tokens: Counter,
    pub(super) prefix_breaks: Counter,
    pub(super) shadow_summaries: Counter,
}

impl AuditMetrics {
    fn register(registry: &mut Registry) -> AuditMetrics {
        let outcomes: Family<OutcomeLabels, Counter> = registered(
            registry,
            "compactor_audit",
            "Requests audit mode forwarded as they came, by the outcome enforce would have had",
            Family::default(),
        );
        // Every outcome from the start, so a dashboard shows zero rather than no data.
        for outcome in [
            "skipped",
            "summarized",
            "reused",
            "cleared",
            "truncated",
            "failed",
        ] {
            let _ = outcomes.get_or_create(&OutcomeLabels { outcome });
        }
        AuditMetrics {
            outcomes,
            tokens_saved: registered(
                registry,
                "compactor_audit_tokens_saved",
                "Input tokens enforce would have kept from being sent upstream (a summary counted at summary_max_tokens)",
                Counter::default(),
            ),
            summarizer_tokens: registered(
                registry,
                "compactor_audit_summarizer_tokens",
                "Summarizer tokens enforce would have spent (input, and summary_max_tokens of answer)",
                Counter::default(),
            ),
            prefix_breaks: registered(
                registry,
                "compactor_audit_prefix_breaks",
                "Requests where a new summary would have ended the upstream's cached prefix",
                Counter::default(),
            ),
            shadow_summaries: registered(
                registry,
                "compactor_audit_shadow_summaries",
                "Summaries audit mode made for real off the request path (shadow_sample)",
                Counter::default(),
            ),
        }
    }
}

impl CompactionMetrics {
    pub(super) fn register(registry: &mut Registry) -> CompactionMetrics {
        let compactions = registered(
            registry,
            "compactor_compactions",
            "Requests through compaction, by outcome and reason",
            Family::default(),
        );
        let tokens_before = registered(
            registry,
            "compactor_compaction_tokens_before",
            "Estimated tokens of compacted requests before compaction",
            Histogram::new(TOKEN_BUCKETS),
        );
        let tokens_after = registered(
            registry,
            "compactor_compaction_tokens_after",
            "Estimated tokens of compacted requests as forwarded",
            Histogram::new(TOKEN_BUCKETS),
        );
        let tokens_saved = registered(
            registry,
            "compactor_tokens_saved",
            "Estimated input tokens compaction kept from being sent upstream",
            Counter::default(),
        );
        let outputs_cleared = registered(
            registry,
            "compactor_tool_outputs_cleared",
            "Tool outputs replaced by placeholders (clear_tool_outputs stage)",
            Counter::default(),
        );
        let messages_dropped = registered(
            registry,
            "compactor_messages_dropped",
            "Messages dropped to fit the model's window (truncate stage)",
            Counter::default(),
        );
        let precomputes = registered(
            registry,
            "compactor_precomputes_started",
            "Summaries started ahead of need (precompute_at)",
            Counter::default(),
        );
        let expansion_rounds = registered(
            registry,
            "compactor_expansion_rounds",
            "Lookups of what a summary left out that compactor answered, each one more upstream call (summarization.retrieval)",
            Counter::default(),
        );
        let expansion_bytes = registered(
            registry,
            "compactor_expansion_bytes",
            "Bytes of originals compactor returned to lookups (summarization.retrieval)",
            Counter::default(),
        );
        let reactive_retries = registered(
            registry,
            "compactor_reactive_retries",
            "Requests retried compacted after an upstream context-length error (result: ok, failed, unchanged)",
            Family::default(),
        );
        let calibration_samples = registered(
            registry,
            "compactor_token_calibration_samples",
            "Upstream input counts compared with compactor's count of the same body (result: used, outlier)",
            Family::default(),
        );
        let estimate_ratio = registered(
            registry,
            "compactor_token_estimate_ratio",
            "compactor's token count of a forwarded body over the upstream's, before learning from it (1 is exact)",
            Histogram::new(RATIO_BUCKETS),
        );
        at_zero(&calibration_samples, &["used", "outlier"]);
        at_zero(&reactive_retries, &["ok", "failed", "unchanged"]);
        CompactionMetrics {
            compactions,
            tokens_before,
            tokens_after,
            tokens_saved,
            outputs_cleared,
            messages_dropped,
            precomputes,
            expansion_rounds,
            expansion_bytes,
            reactive_retries,
            calibration_samples,
            estimate_ratio,
            summarizer: SummarizerMetrics::register(registry),
            audit: AuditMetrics::register(registry),
        }
    }
}

/// The summarizer's calls: made, how long, failed, joined by another request.
pub(super) struct SummarizerMetrics {
    pub(super) calls: Family<ResultLabels, Counter>,
    pub(super) duration: Histogram,
    pub(super) failures: Family<ReasonLabels, Counter>,
    pub(super) single_flight_joins: Counter,
}

impl SummarizerMetrics {
    fn register(registry: &mut Registry) -> SummarizerMetrics {
        let summarizer_calls = registered(
            registry,
            "compactor_summarizer_calls",
            "Summarizer calls made, by result",
            Family::default(),
        );
        let summarizer_duration = registered(
            registry,
            "compactor_summarizer_duration_seconds",
            "Duration of one summarizer call",
            Histogram::new(DURATION_BUCKETS),
        );
        let summarizer_failures = registered(
            registry,
            "compactor_summarizer_failures",
            "Summaries that could not be had, by reason",
            Family::default(),
        );
        let single_flight_joins = registered(
            registry,
            "compactor_single_flight_joins",
            "Requests that waited on a summary another request was already making",
            Counter::default(),
        );
        at_zero(&summarizer_calls, &["ok", "error"]);
        SummarizerMetrics {
            calls: summarizer_calls,
            duration: summarizer_duration,
            failures: summarizer_failures,
            single_flight_joins,
        }
    }
}

/// The summary cache and the replicas' shared tier.
pub(super) struct Caching {
    pub(super) cache_lookups: Family<ResultLabels, Counter>,
    pub(super) cache_entries: Gauge,
    pub(super) cache_bytes: Gauge,
    pub(super) redis_up: Gauge,
    pub(super) redis_commands: Family<ResultLabels, Counter>,
    pub(super) remote_lookups: Family<ResultLabels, Counter>,
    pub(super) leases: Family<ResultLabels, Counter>,
    pub(super) lease_waiting: Gauge,
}

impl Caching {
    pub(super) fn register(registry: &mut Registry) -> Caching {
        let cache_lookups = registered(
            registry,
            "compactor_summary_cache_lookups",
            "Summary cache lookups of requests over a trigger (result: hit or miss)",
            Family::default(),
        );
        let cache_entries = registered(
            registry,
            "compactor_summary_cache_entries",
            "Summaries in the cache",
            Gauge::default(),
        );
        let cache_bytes = registered(
            registry,
            "compactor_summary_cache_bytes",
            "Weight of the summary cache, in bytes of summaries",
            Gauge::default(),
        );
        let redis_up = registered(
            registry,
            "compactor_redis_up",
            "Whether the shared summary cache (Redis) is being used: 0 while its breaker is open",
            Gauge::default(),
        );
        let redis_commands = registered(
            registry,
            "compactor_redis_commands",
            "Commands sent to Redis (result: ok or error, a timeout included)",
            Family::default(),
        );
        let remote_lookups = registered(
            registry,
            "compactor_summary_cache_remote_lookups",
            "Lookups in Redis of summaries the local cache did not have (result: hit or miss)",
            Family::default(),
        );
        let leases = registered(registry, "compactor_redis_leases", "Summaries asked for through Redis (result: made here, made by another replica, taken over from a replica that died, waited past the timeout)", Family::default());
        let lease_waiting = registered(
            registry,
            "compactor_redis_lease_waiting",
            "Requests waiting now for a summary another replica is making",
            Gauge::default(),
        );
        // Label sets known in advance start at zero, so `rate()` sees them before they move.
        at_zero(&cache_lookups, &["hit", "miss"]);
        at_zero(&redis_commands, &["ok", "error"]);
        at_zero(&remote_lookups, &["hit", "miss"]);
        at_zero(&leases, &["made", "joined", "taken_over", "timeout"]);
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
