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
pub(super) struct CompactionMetrics {
    pub(super) compactions: Family<CompactionLabels, Counter>,
    pub(super) tokens_before: Histogram,
    pub(super) tokens_after: Histogram,
    pub(super) tokens_saved: Counter,
    pub(super) outputs_cleared: Counter,
    pub(super) messages_dropped: Counter,
    pub(super) summarizer_calls: Family<ResultLabels, Counter>,
    pub(super) summarizer_duration: Histogram,
    pub(super) summarizer_failures: Family<ReasonLabels, Counter>,
    pub(super) reactive_retries: Family<ResultLabels, Counter>,
    pub(super) precomputes: Counter,
    pub(super) single_flight_joins: Counter,
    pub(super) calibration_samples: Family<ResultLabels, Counter>,
    pub(super) estimate_ratio: Histogram,
}

impl CompactionMetrics {
    pub(super) fn register(registry: &mut Registry) -> CompactionMetrics {
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
