//! The checks a parsed config must pass; every problem is reported with its key.

use std::net::SocketAddr;

use super::{
    CacheBackend, Config, ConfigError, ContextSize, NativeCompaction, OneOrMany, RetrievalConfig,
    Stage,
};

impl Config {
    /// Every problem, each naming its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        self.validate_into(&mut problems);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError(problems))
        }
    }

    pub(super) fn validate_into(&self, problems: &mut Vec<String>) {
        if self.listen.parse::<SocketAddr>().is_err() {
            problems.push(format!(
                "listen: '{}' is not a host:port socket address",
                self.listen
            ));
        }
        if !self.prefix.starts_with('/') || (self.prefix.len() > 1 && self.prefix.ends_with('/')) {
            problems.push(format!(
                "prefix: '{}' must start with '/' and not end with '/'",
                self.prefix
            ));
        }
        if self.upstreams.is_empty() {
            problems.push("upstreams: at least one upstream is required".into());
        }
        if let Some(admin) = &self.admin.listen {
            if admin.parse::<SocketAddr>().is_err() {
                problems.push(format!(
                    "admin.listen: '{admin}' is not a host:port socket address"
                ));
            }
        }
        if let Some(endpoint) = &self.telemetry.otlp_endpoint {
            let valid = endpoint.parse::<http::Uri>().is_ok_and(|uri| {
                matches!(uri.scheme_str(), Some("http") | Some("https"))
                    && uri.authority().is_some()
            });
            if !valid {
                problems.push(format!(
                    "telemetry.otlp_endpoint: '{endpoint}' is not an http(s) URL"
                ));
            }
        }
        positive_secs("reload.interval_secs", self.reload.interval_secs, problems);
        self.validate_upstreams(problems);
        for (i, secret) in self.sealing.keys.iter().enumerate() {
            if secret.expose().len() < 16 {
                problems.push(format!(
                    "sealing.keys[{i}]: must be 16 bytes or more (use ${{VAR}})"
                ));
            }
        }
        self.validate_models(problems);
        positive_secs("shutdown_grace_secs", self.shutdown_grace_secs, problems);
        self.validate_limits(problems);
        self.validate_auth(problems);
        self.validate_summarization(problems);
        if self.cache.max_bytes == 0 {
            problems.push("cache.max_bytes: must be > 0".into());
        }
        self.validate_redis(problems);
    }

    fn validate_upstreams(&self, problems: &mut Vec<String>) {
        let mut names = std::collections::HashSet::new();
        for (i, upstream) in self.upstreams.iter().enumerate() {
            let key = format!("upstreams[{i}]");
            if upstream.name.is_empty() {
                problems.push(format!("{key}.name: must not be empty"));
            } else if !names.insert(upstream.name.as_str()) {
                problems.push(format!(
                    "{key}.name: '{}' is used by an earlier upstream",
                    upstream.name
                ));
            }
            match upstream.base_url.parse::<http::Uri>() {
                Ok(uri)
                    if matches!(uri.scheme_str(), Some("http") | Some("https"))
                        && uri.authority().is_some()
                        && uri.query().is_none() => {}
                _ => problems.push(format!(
                    "{key}.base_url: '{}' must be an http:// or https:// URL without a query",
                    upstream.base_url
                )),
            }
            for (name, value) in &upstream.headers {
                if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                    problems.push(format!(
                        "{key}.headers: '{name}' is not a valid header name"
                    ));
                }
                if http::HeaderValue::from_str(value.expose()).is_err() {
                    problems.push(format!("{key}.headers.{name}: not a valid header value"));
                }
            }
            if upstream.models.is_empty() {
                problems.push(format!("{key}.models: must list at least one pattern"));
            }
            for (field, value) in [
                ("connect_timeout_secs", upstream.connect_timeout_secs),
                ("first_byte_timeout_secs", upstream.first_byte_timeout_secs),
                ("idle_timeout_secs", upstream.idle_timeout_secs),
            ] {
                positive_secs(&format!("{key}.{field}"), value, problems);
            }
            if upstream.native_compaction == NativeCompaction::Serve {
                if self.sealing.keys.is_empty() {
                    problems.push(format!(
                        "{key}.native_compaction: serve needs sealing.keys (the compaction items it makes are sealed)"
                    ));
                }
                if !self.summarization.enabled {
                    problems.push(format!(
                        "{key}.native_compaction: serve needs summarization.enabled"
                    ));
                }
            }
        }
    }

    fn validate_models(&self, problems: &mut Vec<String>) {
        for (i, model) in self.models.iter().enumerate() {
            let key = format!("models[{i}]");
            if model.pattern.is_empty() {
                problems.push(format!("{key}.match: a model glob is required"));
            }
            if model.max_input_tokens == Some(0) {
                problems.push(format!("{key}.max_input_tokens: must be > 0"));
            }
            if let Some(path) = &model.tokenizer_file {
                if let Err(e) = crate::encoding::Encoding::from_file(path) {
                    problems.push(format!("{key}.tokenizer_file: cannot load {path}: {e}"));
                }
            }
            if let Some(cpt) = model.chars_per_token {
                if !(cpt.is_finite() && cpt > 0.0) {
                    problems.push(format!("{key}.chars_per_token: must be > 0"));
                }
            }
        }
    }

    fn validate_limits(&self, problems: &mut Vec<String>) {
        let l = &self.limits;
        for (key, value) in [
            ("max_request_body_bytes", l.max_request_body_bytes),
            ("max_buffered_bytes", l.max_buffered_bytes),
            ("max_connections", l.max_connections as u64),
        ] {
            if value == 0 {
                problems.push(format!("limits.{key}: must be > 0"));
            }
        }
        for (key, value) in [
            ("workers", self.runtime.workers),
            ("planner_threads", self.runtime.planner_threads),
        ] {
            if value == Some(0) {
                problems.push(format!(
                    "runtime.{key}: must be > 0 (or null: one per core)"
                ));
            }
        }
        for (key, value) in [
            ("header_read_timeout_secs", l.header_read_timeout_secs),
            ("body_read_timeout_secs", l.body_read_timeout_secs),
            (
                "idle_connection_timeout_secs",
                l.idle_connection_timeout_secs,
            ),
            ("relay_max_lifetime_secs", l.relay_max_lifetime_secs),
        ] {
            positive_secs(&format!("limits.{key}"), value, problems);
        }
        if !(l.eviction_grace_secs.is_finite() && l.eviction_grace_secs >= 0.0) {
            problems.push("limits.eviction_grace_secs: must be a number >= 0".into());
        }
        // hyper's read buffer cannot be smaller.
        if l.max_header_bytes < 8192 {
            problems.push("limits.max_header_bytes: must be at least 8192".into());
        }
        if l.max_header_bytes_total < l.max_header_bytes {
            problems.push(
                "limits.max_header_bytes_total: must be at least limits.max_header_bytes".into(),
            );
        }
    }

    fn validate_auth(&self, problems: &mut Vec<String>) {
        if self.auth.disabled && self.auth.enabled() {
            problems.push("auth.disabled: true, but auth.keys are given: remove one".into());
        }
        let mut names = std::collections::HashSet::new();
        for (i, key) in self.auth.keys.iter().enumerate() {
            let at = format!("auth.keys[{i}]");
            if key.name.is_empty() {
                problems.push(format!("{at}.name: must not be empty"));
            } else if !names.insert(key.name.as_str()) {
                problems.push(format!(
                    "{at}.name: '{}' is used by an earlier key",
                    key.name
                ));
            }
            match (&key.key, &key.key_sha256) {
                (Some(secret), None) if secret.is_empty() => {
                    problems.push(format!("{at}.key: must not be empty"))
                }
                (Some(_), None) => {}
                (None, Some(hex))
                    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {}
                (None, Some(_)) => problems.push(format!(
                    "{at}.key_sha256: must be 64 hex digits (the SHA-256 of the key)"
                )),
                _ => problems.push(format!(
                    "{at}: exactly one of key and key_sha256 is required"
                )),
            }
            if key.models.is_empty() {
                problems.push(format!("{at}.models: must list at least one pattern"));
            }
            if let Some(trigger) = &key.trigger {
                for (j, size) in trigger.to_vec().iter().enumerate() {
                    validate_size(&format!("{at}.trigger[{j}]"), size, problems);
                }
            }
        }
    }

    /// What is valid but unsafe: said by `compactor check` and at start-up.
    /// Whether `listen` is reachable from this machine only.
    pub fn listens_on_loopback(&self) -> bool {
        let host = self.listen.rsplit_once(':').map_or("", |(host, _)| host);
        host == "localhost"
            || self
                .listen
                .parse::<SocketAddr>()
                .is_ok_and(|addr| addr.ip().is_loopback())
    }

    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        let loopback = self.listens_on_loopback();
        let keyed: Vec<&str> = self
            .upstreams
            .iter()
            .filter(|u| u.api_key.as_ref().is_some_and(|k| !k.is_empty()))
            .map(|u| u.name.as_str())
            .collect();
        if !loopback && !keyed.is_empty() && !self.auth.enabled() {
            warnings.push(format!(
                "listen {} is reachable beyond this machine, upstream(s) {} hold an api_key, and auth is off: anyone who reaches the port spends that key. Add auth.keys.",
                self.listen,
                keyed.join(", ")
            ));
        }
        warnings
    }

    fn validate_summarization(&self, problems: &mut Vec<String>) {
        let s = &self.summarization;
        let triggers = s.trigger.to_vec();
        for (i, size) in triggers.iter().enumerate() {
            let key = match s.trigger {
                OneOrMany::One(_) => "summarization.trigger".to_string(),
                OneOrMany::Many(_) => format!("summarization.trigger[{i}]"),
            };
            validate_size(&key, size, problems);
        }
        if s.enabled && triggers.is_empty() {
            problems.push(
                "summarization.trigger: at least one trigger is required when enabled".into(),
            );
        }
        validate_size("summarization.keep", &s.keep, problems);
        validate_stages(&s.stages, problems);
        if s.clear_tool_outputs.min_tokens == 0 {
            problems.push("summarization.clear_tool_outputs.min_tokens: must be > 0".into());
        }
        if let Some(at) = s.precompute_at {
            if !(at > 0.0 && at < 1.0) {
                problems.push(format!(
                    "summarization.precompute_at: {at} must be in (0, 1) or null"
                ));
            }
        }
        let shadow = s.audit.shadow_sample;
        if !(0.0..=1.0).contains(&shadow) {
            problems.push(format!(
                "summarization.audit.shadow_sample: {shadow} must be between 0 and 1"
            ));
        }
        if s.trim_tokens_to_summarize == Some(0) {
            problems.push("summarization.trim_tokens_to_summarize: must be > 0 or null".into());
        }
        if let Some(prompt) = &s.summary_prompt {
            if !prompt.contains("{messages}") {
                problems.push(
                    "summarization.summary_prompt: must contain the {messages} placeholder".into(),
                );
            }
        }
        if s.summary_max_tokens == 0 {
            problems.push("summarization.summary_max_tokens: must be > 0".into());
        }
        if let Some(headroom) = s.headroom {
            if !(headroom > 0.0 && headroom <= 1.0) {
                problems.push(format!(
                    "summarization.headroom: {headroom} must be in (0, 1] or null"
                ));
            }
        }
        validate_retrieval("summarization.retrieval", &s.retrieval, problems);
        for key in &self.auth.keys {
            if let Some(retrieval) = &key.retrieval {
                let at = format!("auth.keys[{}].retrieval", key.name);
                validate_retrieval(&at, retrieval, problems);
            }
        }
        self.validate_summarizer_bounds(problems);
    }

    /// The summarizer's time, concurrency, call and breaker bounds, and where it is sent.
    fn validate_summarizer_bounds(&self, problems: &mut Vec<String>) {
        let s = &self.summarization;
        positive_secs("summarization.timeout_secs", s.timeout_secs, problems);
        positive_secs(
            "summarization.breaker_cooldown_secs",
            s.breaker_cooldown_secs,
            problems,
        );
        for (key, value) in [
            ("max_concurrent_calls", s.max_concurrent_calls),
            (
                "max_concurrent_calls_per_tenant",
                s.max_concurrent_calls_per_tenant,
            ),
            (
                "max_calls_per_minute_per_tenant",
                s.max_calls_per_minute_per_tenant,
            ),
            ("max_summarizer_calls", s.max_summarizer_calls),
            ("breaker_failures", s.breaker_failures),
        ] {
            if value == 0 {
                problems.push(format!("summarization.{key}: must be > 0"));
            }
        }
        if let Some(name) = &s.upstream {
            if !self.upstreams.iter().any(|u| &u.name == name) {
                problems.push(format!(
                    "summarization.upstream: no upstream is named '{name}'"
                ));
            }
        }
    }
}

/// A signing key shorter than this could be guessed.
const MIN_SIGNING_KEY_BYTES: usize = 16;

impl Config {
    fn validate_redis(&self, problems: &mut Vec<String>) {
        let redis = &self.cache.redis;
        #[cfg(not(feature = "redis"))]
        if self.cache.backend == CacheBackend::Redis {
            problems
                .push("cache.backend: redis needs a compactor built with the redis feature".into());
        }
        if self.cache.backend == CacheBackend::Redis {
            let scheme = |url: &str| url.starts_with("redis://") || url.starts_with("rediss://");
            let url = redis
                .url
                .as_ref()
                .map(|url| url.expose())
                .filter(|url| !url.is_empty());
            match (url, redis.cluster.is_empty()) {
                (None, true) => problems.push(
                    "cache.redis.url (or cache.redis.cluster): required with cache.backend: redis"
                        .into(),
                ),
                (Some(_), false) => problems.push(
                    "cache.redis.url and cache.redis.cluster: one or the other, not both".into(),
                ),
                (Some(url), true) if !scheme(url) => {
                    problems.push("cache.redis.url: must start with redis:// or rediss://".into())
                }
                _ => {}
            }
            for (i, node) in redis.cluster.iter().enumerate() {
                if !scheme(node.expose()) {
                    problems.push(format!(
                        "cache.redis.cluster[{i}]: must start with redis:// or rediss://"
                    ));
                }
            }
            match redis.signing_key.as_ref().map(|key| key.expose().len()) {
                None | Some(0) => problems.push(
                    "cache.redis.signing_key: required with cache.backend: redis (a secret the replicas share, e.g. ${COMPACTOR_CACHE_SIGNING_KEY} set to `openssl rand -hex 32`): summaries in Redis are authenticated with it".into(),
                ),
                Some(len) if len < MIN_SIGNING_KEY_BYTES => problems.push(format!(
                    "cache.redis.signing_key: {len} bytes is too short to authenticate with; use {MIN_SIGNING_KEY_BYTES} or more"
                )),
                Some(_) => {}
            }
        }
        for (key, value) in [
            ("ttl_secs", redis.ttl_secs),
            ("connect_timeout_secs", redis.connect_timeout_secs),
            ("command_timeout_secs", redis.command_timeout_secs),
            ("lease_secs", redis.lease_secs),
            ("breaker_cooldown_secs", redis.breaker_cooldown_secs),
        ] {
            positive_secs(&format!("cache.redis.{key}"), value, problems);
        }
        if redis.breaker_failures == 0 {
            problems.push("cache.redis.breaker_failures: must be > 0".into());
        }
    }
}

/// Stages run cheapest first and truncation is the last resort, so the list must keep that
/// order; each stage at most once.
fn validate_stages(stages: &[Stage], problems: &mut Vec<String>) {
    const ORDER: [Stage; 3] = [Stage::ClearToolOutputs, Stage::Summarize, Stage::Truncate];
    if stages.is_empty() {
        problems.push("summarization.stages: at least one stage is required".into());
    }
    let positions: Vec<usize> = stages
        .iter()
        .filter_map(|stage| ORDER.iter().position(|s| s == stage))
        .collect();
    if positions.windows(2).any(|pair| pair[0] >= pair[1]) {
        problems.push(
            "summarization.stages: each stage at most once, in the order clear_tool_outputs, summarize, truncate"
                .into(),
        );
    }
}

fn validate_size(key: &str, size: &ContextSize, problems: &mut Vec<String>) {
    match *size {
        ContextSize::Tokens(0) => problems.push(format!("{key}: tokens must be > 0")),
        ContextSize::Messages(0) => problems.push(format!("{key}: messages must be > 0")),
        ContextSize::Fraction(f) if !(f > 0.0 && f <= 1.0) => {
            problems.push(format!("{key}: fraction {f} must be in (0, 1]"))
        }
        _ => {}
    }
}

fn positive_secs(key: &str, value: f64, problems: &mut Vec<String>) {
    if !(value.is_finite() && value > 0.0) {
        problems.push(format!("{key}: must be a positive number of seconds"));
    }
}

/// A tool name every API accepts, and bounds that keep a lookup one bounded extra call.
fn validate_retrieval(at: &str, r: &RetrievalConfig, problems: &mut Vec<String>) {
    let name_ok = (1..=64).contains(&r.tool_name.len())
        && r.tool_name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !name_ok {
        problems.push(format!(
            "{at}.tool_name: {:?} must be 1 to 64 letters, digits, '_' or '-'",
            r.tool_name
        ));
    }
    if !(1..=8).contains(&r.max_rounds) {
        problems.push(format!("{at}.max_rounds: {} must be 1 to 8", r.max_rounds));
    }
    if !(256..=16 * 1024 * 1024).contains(&r.max_bytes) {
        problems.push(format!(
            "{at}.max_bytes: {} must be 256 to 16777216",
            r.max_bytes
        ));
    }
}
