//! proxy.yaml: the schema, every default in one place (the `Default` impls below), and loading.
//! `${VAR}` expansion lives in `env`, the checks that report every problem with its key in
//! `validate`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

mod env;
mod summarization;
mod validate;

pub use env::expand_vars;
pub use summarization::{
    AuditConfig, ClearToolOutputsConfig, CompactionMode, ContextSize, FailMode, NoticeMode,
    OneOrMany, Oversize, RetrievalConfig, Stage, SummarizationConfig, SummarizerApi,
    SummaryPlacement, SummaryRole,
};

use serde::{Deserialize, Serialize, Serializer};

/// A string that must never reach a log or `compactor check` output (API keys).
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub(crate) String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(if self.0.is_empty() { "" } else { "***" })
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on, `host:port`. Port 0 picks a free port (printed at start-up).
    pub listen: String,
    /// Path prefix clients use; `{prefix}/rest` is forwarded to `{base_url}/rest`.
    pub prefix: String,
    /// Upstreams, tried in order: a request goes to the first whose `models` matches its model.
    pub upstreams: Vec<UpstreamConfig>,
    /// Per-model facts used by token estimates and `fraction` triggers; first match wins.
    pub models: Vec<ModelConfig>,
    /// Compaction: when, how much, and with which summarizer.
    pub summarization: SummarizationConfig,
    /// The summary cache.
    pub cache: CacheConfig,
    /// Client keys; when any is listed, every proxied request needs one.
    pub auth: AuthConfig,
    /// Bounds on what one client may make compactor hold.
    pub limits: LimitsConfig,
    /// How upstream TLS certificates are checked.
    pub tls: TlsConfig,
    /// How long in-flight requests and streams may run after SIGINT/SIGTERM.
    pub shutdown_grace_secs: f64,
    /// How requests are spread over the cores.
    pub runtime: RuntimeConfig,
    /// Metrics and traces.
    pub telemetry: TelemetryConfig,
    /// A second listener for operators: `/metrics`, `/healthz`, `/readyz` away from the API.
    pub admin: AdminConfig,
    /// Reloading this file while serving.
    pub reload: ReloadConfig,
    /// WebSocket upgrades (the Responses API's WebSocket transport, which Codex tries first):
    /// `refuse` answers 426 so the client falls back to HTTP at once and is compacted; `relay`
    /// passes them to the upstream, and what travels on the socket is not compacted.
    pub websocket: WebSocketMode,
    /// Keys for the compaction items compactor makes (see `upstreams[].native_compaction`).
    pub sealing: SealingConfig,
}

/// What a WebSocket upgrade request gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WebSocketMode {
    /// 426 Upgrade Required, in the API's error shape.
    #[default]
    Refuse,
    /// Passed to the upstream; after its 101 the two connections are joined byte for byte.
    Relay,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Prometheus metrics at `GET /metrics` (on `admin.listen` when set, else on `listen`).
    pub metrics: bool,
    /// OTLP/HTTP collector base URL (e.g. `http://otel-collector:4318`): a span per request,
    /// the summarizer call as a child span, W3C `traceparent` sent upstream; null: no traces.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans.
    pub service_name: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// `host:port` of the operators' listener; null: those routes are on `listen`.
    pub listen: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReloadConfig {
    /// Also reload when the file's content changes (checked every `interval_secs`), besides on
    /// SIGHUP.
    pub watch: bool,
    /// How often the watch looks at the file.
    pub interval_secs: f64,
}

/// How the proxy's threads serve connections.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// `per_core`: one single-threaded worker per core, each with its own listening socket
    /// (`SO_REUSEPORT`) and its own upstream connections; `shared`: one work-stealing runtime.
    pub mode: RuntimeMode,
    /// Worker threads; null: one per core.
    pub workers: Option<usize>,
    /// Compaction planning of large bodies runs on this many threads at most (null: one per
    /// core); a request that finds them all busy is forwarded as is (reason `busy`).
    pub planner_threads: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeMode {
    PerCore,
    Shared,
}

impl RuntimeConfig {
    /// Worker threads to start: the configured count, else the cores available.
    pub fn worker_count(&self) -> usize {
        self.workers.unwrap_or_else(available_cores).max(1)
    }

    pub fn planner_thread_count(&self) -> usize {
        self.planner_threads.unwrap_or_else(available_cores).max(1)
    }
}

fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Name used in logs, response headers and `summarization.upstream`.
    pub name: String,
    /// Base URL including the API version path, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// The API this upstream speaks: `openai` (chat completions, Responses), `anthropic`
    /// (Messages) or `gemini` (`generateContent`). It decides how its key is sent and how the
    /// summarizer calls it.
    pub api: UpstreamApi,
    /// When set and non-empty, replaces the client's credential: `Authorization: Bearer
    /// <api_key>` for `openai`, `x-api-key: <api_key>` for `anthropic`.
    pub api_key: Option<Secret>,
    /// Extra headers set on every request to this upstream (replacing any the client sent).
    pub headers: BTreeMap<String, Secret>,
    /// Glob patterns (`*`, `?`) of the models this upstream serves.
    pub models: Vec<String>,
    /// TCP (and TLS) connect timeout.
    pub connect_timeout_secs: f64,
    /// Time allowed between sending the request and receiving the response headers.
    pub first_byte_timeout_secs: f64,
    /// Longest silence allowed between two response body frames.
    pub idle_timeout_secs: f64,
    /// The providers' own compaction contracts (OpenAI's `/responses/compact`,
    /// `compaction_trigger` and `context_management`, Anthropic's `compact_20260112` and
    /// `clear_*` edits): `pass` forwards them,
    /// `serve` answers them with compactor's planner and summarizer, `auto` (default) serves
    /// them when `sealing.keys` is set and the upstream is not a provider that defines them
    /// (`api.openai.com`, `api.anthropic.com`), else passes.
    pub native_compaction: NativeCompaction,
}

/// An upstream's `native_compaction`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NativeCompaction {
    Pass,
    Serve,
    #[default]
    Auto,
}

impl UpstreamConfig {
    /// Whether compactor answers the native compaction contracts for this upstream.
    pub fn serves_native_compaction(&self, sealing: &SealingConfig) -> bool {
        match self.native_compaction {
            NativeCompaction::Pass => false,
            NativeCompaction::Serve => true,
            NativeCompaction::Auto => !sealing.keys.is_empty() && !self.defines_native_compaction(),
        }
    }

    /// A provider whose contracts these are: it answers them itself (OpenAI's
    /// `/responses/compact` and trigger item, Anthropic's `compact_*` edit).
    fn defines_native_compaction(&self) -> bool {
        let host = self
            .base_url
            .split("://")
            .nth(1)
            .and_then(|rest| rest.split(['/', ':']).next())
            .unwrap_or("");
        ["api.openai.com", "api.anthropic.com"]
            .iter()
            .any(|provider| host.eq_ignore_ascii_case(provider))
    }
}

/// The keys compaction items compactor makes are sealed with (`${VAR}` each; the first seals,
/// every one listed opens).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SealingConfig {
    pub keys: Vec<Secret>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Glob matched against the request's `model`.
    #[serde(rename = "match")]
    pub pattern: String,
    /// Context window, used by `fraction` triggers and keeps.
    pub max_input_tokens: Option<u64>,
    /// Characters per token for the estimate (default 4.0, 3.3 for `claude*`).
    pub chars_per_token: Option<f64>,
    /// Tokens counted for each image part (default 85).
    pub image_tokens: Option<u64>,
    /// The model's tokenizer, for exact counts near a trigger: `o200k`, `cl100k`, or
    /// `estimate` for none. Default: OpenAI's encoding for OpenAI model names, else none.
    pub tokenizer: Option<TokenizerChoice>,
    /// A Hugging Face `tokenizer.json` to count this model with near a trigger (an open model
    /// served by vLLM, SGLang, llama.cpp…); takes precedence over `tokenizer`.
    pub tokenizer_file: Option<String>,
    /// Whether the estimate learns from the usage this model's upstreams report (default
    /// true): off for an upstream whose counts cannot be trusted (one that reports only the
    /// tokens it evaluated after a prefix-cache hit, say).
    pub calibrate: Option<bool>,
}

/// A `models[].tokenizer` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerChoice {
    O200k,
    Cl100k,
    Estimate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamApi {
    #[default]
    Openai,
    Anthropic,
    Gemini,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// Upper bound of the in-process summary cache, in bytes of summary text.
    pub max_bytes: u64,
    /// `memory`: each replica its own cache; `redis`: the in-process cache in front of a Redis
    /// (or Valkey) every replica shares.
    pub backend: CacheBackend,
    /// The shared tier, with `backend: redis`.
    pub redis: RedisConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheBackend {
    Memory,
    Redis,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]`, or `rediss://` for TLS (use `${VAR}`).
    pub url: Option<Secret>,
    /// A Redis Cluster (or Valkey cluster) instead of `url`: some of its nodes, each
    /// `redis://host:port` or `rediss://` (the rest are found from them).
    pub cluster: Vec<Secret>,
    /// Overrides the URL's user name.
    pub username: Option<String>,
    /// Overrides the URL's password.
    pub password: Option<Secret>,
    /// The secret the replicas share (use `${VAR}`; 16 bytes or more): every summary written
    /// to Redis is authenticated with it, and one that does not verify is a miss. Required with
    /// `backend: redis`, since whoever can write to Redis could otherwise put words into every
    /// conversation. Deployments with different keys never read each other's summaries.
    pub signing_key: Option<Secret>,
    /// Prepended to every key compactor writes.
    pub key_prefix: String,
    /// How long a summary stays in Redis.
    pub ttl_secs: f64,
    pub connect_timeout_secs: f64,
    /// A command that takes longer counts as a failure; the request goes on without it.
    pub command_timeout_secs: f64,
    /// How long a replica's claim on a summary it is making lasts unless renewed (it is
    /// renewed while the replica works, so a replica that died is noticed within this).
    pub lease_secs: f64,
    /// Consecutive failures that stop compactor asking Redis (the local cache serves alone).
    pub breaker_failures: u64,
    /// How long it stops asking before one probe.
    pub breaker_cooldown_secs: f64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest request body on any route, declared or streamed; 413 above.
    pub max_request_body_bytes: u64,
    /// Bytes of request bodies held in memory at once (bodies read for routing or compaction),
    /// across all clients; a request that would go over gets 503 `overloaded`.
    pub max_buffered_bytes: u64,
    /// HTTP/1.1: a request's headers must arrive within this, counted from when the connection
    /// opened or its previous response ended (an idle keep-alive connection is closed after it).
    pub header_read_timeout_secs: f64,
    /// A request body must arrive whole within this; 408 after.
    pub body_read_timeout_secs: f64,
    /// A request body must keep arriving at this rate, measured over any 10 seconds of waiting
    /// (a 10-second stall ends it, whatever arrived before); 408 below it.
    pub min_body_bytes_per_sec: u64,
    /// Client connections held at once. At the cap the connection idle for longest is closed to
    /// make room; only when all are busy does a new connection get a 503 and close.
    pub max_connections: usize,
    /// Client connections from one address at once (0: no cap of its own), under the same rule:
    /// its own idlest connection makes room, else a 503. Behind a load balancer or a NAT every
    /// client shares its address: raise it there or set 0.
    pub max_connections_per_ip: usize,
    /// A connection (HTTP/2 included) with no request in flight for this long is closed; a
    /// WebSocket relay with no byte either way too.
    pub idle_connection_timeout_secs: f64,
    /// A WebSocket relay is closed after this long, however busy (the client reconnects).
    pub relay_max_lifetime_secs: f64,
    /// At a connection cap, a connection idle for less than this is never closed to make room
    /// (a keep-alive client between two requests keeps its socket).
    pub eviction_grace_secs: f64,
    /// HTTP/1.1: bytes of one request's headers (at least 8192); 431 above. HTTP/2: the
    /// header list's size.
    pub max_header_bytes: usize,
    /// Bytes of request headers still arriving, across all connections; a connection that
    /// would go over is closed.
    pub max_header_bytes_total: usize,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// The keys clients may present (`Authorization: Bearer`, `x-api-key` or `api-key`).
    pub keys: Vec<ClientKeyConfig>,
    /// Says that no keys is meant: a reload that removes every key from a proxy listening beyond
    /// loopback is refused unless the new file says this.
    pub disabled: bool,
}

impl AuthConfig {
    pub fn enabled(&self) -> bool {
        !self.keys.is_empty()
    }
}

/// One client key. Its name is the tenant of its summaries and its label in logs.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientKeyConfig {
    /// Label in logs and the summary cache's tenant.
    pub name: String,
    /// The key itself (use `${VAR}`); or give `key_sha256` instead.
    pub key: Option<Secret>,
    /// Hex SHA-256 of the key, so the file holds no secret.
    pub key_sha256: Option<String>,
    /// Globs of the models this key may use.
    pub models: Vec<String>,
    /// Whether `x-compactor: force` is honoured for this key.
    pub allow_force: bool,
    /// Whether this key's own summarization instructions write its summaries. Unset: yes for
    /// a key that may use every model, no for one with a model list (instructions make the
    /// summarizer answer anything, and it may be a model the key may not use).
    pub client_instructions: Option<bool>,
    /// This key's own triggers (else `summarization.trigger`).
    pub trigger: Option<OneOrMany>,
    /// This key's own summarizer model (else `summarization.model_name`).
    pub model_name: Option<String>,
    /// This key's own compaction mode (else `summarization.mode`): a tenant can be audited
    /// before it is enforced, or the other way round.
    pub mode: Option<CompactionMode>,
    /// This key's own lookups of what a summary left out (else `summarization.retrieval`).
    pub retrieval: Option<RetrievalConfig>,
}

impl Default for ClientKeyConfig {
    fn default() -> Self {
        ClientKeyConfig {
            name: String::new(),
            key: None,
            key_sha256: None,
            models: vec!["*".into()],
            allow_force: false,
            client_instructions: None,
            trigger: None,
            model_name: None,
            mode: None,
            retrieval: None,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Trust the operating system's roots instead of the compiled-in web roots.
    pub native_roots: bool,
}

// Every default, in one place.

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            mode: RuntimeMode::PerCore,
            workers: None,
            planner_threads: None,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8080".into(),
            prefix: "/v1".into(),
            upstreams: Vec::new(),
            models: Vec::new(),
            summarization: SummarizationConfig::default(),
            cache: CacheConfig::default(),
            auth: AuthConfig::default(),
            limits: LimitsConfig::default(),
            tls: TlsConfig::default(),
            shutdown_grace_secs: 30.0,
            runtime: RuntimeConfig::default(),
            telemetry: TelemetryConfig::default(),
            admin: AdminConfig::default(),
            reload: ReloadConfig::default(),
            websocket: WebSocketMode::default(),
            sealing: SealingConfig::default(),
        }
    }
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            name: String::new(),
            base_url: String::new(),
            api: UpstreamApi::Openai,
            api_key: None,
            headers: BTreeMap::new(),
            models: vec!["*".into()],
            connect_timeout_secs: 10.0,
            first_byte_timeout_secs: 600.0,
            idle_timeout_secs: 300.0,
            native_compaction: NativeCompaction::Auto,
        }
    }
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            metrics: true,
            otlp_endpoint: None,
            service_name: "compactor".into(),
        }
    }
}

impl Default for ReloadConfig {
    fn default() -> Self {
        ReloadConfig {
            watch: false,
            interval_secs: 2.0,
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            max_bytes: 64 * 1024 * 1024,
            backend: CacheBackend::Memory,
            redis: RedisConfig::default(),
        }
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: None,
            cluster: Vec::new(),
            username: None,
            password: None,
            signing_key: None,
            key_prefix: "compactor:".into(),
            ttl_secs: 86_400.0,
            connect_timeout_secs: 1.0,
            command_timeout_secs: 0.25,
            lease_secs: 5.0,
            breaker_failures: 3,
            breaker_cooldown_secs: 5.0,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_request_body_bytes: 32 * 1024 * 1024,
            max_buffered_bytes: 128 * 1024 * 1024,
            header_read_timeout_secs: 15.0,
            body_read_timeout_secs: 120.0,
            min_body_bytes_per_sec: 4096,
            max_connections: 4096,
            max_connections_per_ip: 1024,
            idle_connection_timeout_secs: 60.0,
            relay_max_lifetime_secs: 3600.0,
            eviction_grace_secs: 2.0,
            max_header_bytes: 32 * 1024,
            max_header_bytes_total: 64 * 1024 * 1024,
        }
    }
}

/// Everything wrong with a config, one line per problem, each naming its key.
#[derive(Debug)]
pub struct ConfigError(pub Vec<String>);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            f.write_str(problem)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(vec![format!("{}: {e}", path.display())]))?;
        Config::from_yaml(&text)
    }

    /// Parses, expands `${VAR}` / `${VAR:-default}` in string values, then validates.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        Config::from_yaml_with_env(text, &|name| std::env::var(name).ok())
    }

    pub fn from_yaml_with_env(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        // serde_yaml_ng's message names the key path and the line, e.g.
        // "upstreams[0]: unknown field `nmae` ... at line 4 column 5".
        let mut config: Config =
            serde_yaml_ng::from_str(text).map_err(|e| ConfigError(vec![e.to_string()]))?;
        let mut problems = Vec::new();
        config.expand_env(env, &mut problems);
        config.validate_into(&mut problems);
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError(problems))
        }
    }

    fn expand_env(&mut self, env: &dyn Fn(&str) -> Option<String>, problems: &mut Vec<String>) {
        let mut expand = |key: String, value: &mut String| match expand_vars(value, env) {
            Ok(expanded) => *value = expanded,
            Err(e) => problems.push(format!("{key}: {e}")),
        };
        expand("listen".into(), &mut self.listen);
        expand("prefix".into(), &mut self.prefix);
        for (i, key) in self.sealing.keys.iter_mut().enumerate() {
            expand(format!("sealing.keys[{i}]"), &mut key.0);
        }
        for (i, upstream) in self.upstreams.iter_mut().enumerate() {
            expand(format!("upstreams[{i}].name"), &mut upstream.name);
            expand(format!("upstreams[{i}].base_url"), &mut upstream.base_url);
            if let Some(key) = upstream.api_key.as_mut() {
                expand(format!("upstreams[{i}].api_key"), &mut key.0);
            }
            for (name, value) in upstream.headers.iter_mut() {
                expand(format!("upstreams[{i}].headers.{name}"), &mut value.0);
            }
        }
        for (i, key) in self.auth.keys.iter_mut().enumerate() {
            if let Some(secret) = key.key.as_mut() {
                expand(format!("auth.keys[{i}].key"), &mut secret.0);
            }
        }
        if let Some(endpoint) = self.telemetry.otlp_endpoint.as_mut() {
            expand("telemetry.otlp_endpoint".into(), endpoint);
        }
        if let Some(listen) = self.admin.listen.as_mut() {
            expand("admin.listen".into(), listen);
        }
        // `${VAR:-}` left empty means "not set", so one file serves with and without them.
        for optional in [&mut self.telemetry.otlp_endpoint, &mut self.admin.listen] {
            if optional.as_deref() == Some("") {
                *optional = None;
            }
        }
        let redis = &mut self.cache.redis;
        if let Some(url) = redis.url.as_mut() {
            expand("cache.redis.url".into(), &mut url.0);
        }
        for (i, node) in redis.cluster.iter_mut().enumerate() {
            expand(format!("cache.redis.cluster[{i}]"), &mut node.0);
        }
        if let Some(password) = redis.password.as_mut() {
            expand("cache.redis.password".into(), &mut password.0);
        }
        if let Some(username) = redis.username.as_mut() {
            expand("cache.redis.username".into(), username);
        }
        let s = &mut self.summarization;
        if let Some(model) = s.model_name.as_mut() {
            expand("summarization.model_name".into(), model);
        }
        if let Some(upstream) = s.upstream.as_mut() {
            expand("summarization.upstream".into(), upstream);
        }
        expand(
            "summarization.skills_container_path".into(),
            &mut s.skills_container_path,
        );
    }

    /// The effective config as YAML with every secret replaced by `***`.
    pub fn redacted_yaml(&self) -> String {
        serde_yaml_ng::to_string(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}

#[cfg(test)]
mod tests;
