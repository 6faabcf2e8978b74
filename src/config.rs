//! proxy.yaml: typed structs with their defaults, `${VAR}` expansion, and a `validate()` pass that
//! reports every problem with the key it concerns.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize, Serializer};

/// A string that must never reach a log or `compactor check` output (API keys).
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

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
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address to listen on, `host:port`. Port 0 picks a free port (printed at start-up).
    #[serde(default = "defaults::listen")]
    pub listen: String,
    /// Path prefix clients use; `{prefix}/rest` is forwarded to `{base_url}/rest`.
    #[serde(default = "defaults::prefix")]
    pub prefix: String,
    /// Upstreams, tried in order: a request goes to the first whose `models` matches its model.
    pub upstreams: Vec<UpstreamConfig>,
    /// Per-model facts used by token estimates and `fraction` triggers; first match wins.
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    #[serde(default)]
    pub summarization: SummarizationConfig,
    #[serde(default)]
    pub cache: CacheConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub tls: TlsConfig,
    /// How long in-flight requests and streams may run after SIGINT/SIGTERM.
    #[serde(default = "defaults::shutdown_grace_secs")]
    pub shutdown_grace_secs: f64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Name used in logs, response headers and `summarization.upstream`.
    pub name: String,
    /// Base URL including the API version path, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// When set and non-empty, replaces the client's Authorization with `Bearer <api_key>`.
    #[serde(default)]
    pub api_key: Option<Secret>,
    /// Extra headers set on every request to this upstream (replacing any the client sent).
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    /// Glob patterns (`*`, `?`) of the models this upstream serves.
    #[serde(default = "defaults::all_models")]
    pub models: Vec<String>,
    /// TCP (and TLS) connect timeout.
    #[serde(default = "defaults::connect_timeout_secs")]
    pub connect_timeout_secs: f64,
    /// Time allowed between sending the request and receiving the response headers.
    #[serde(default = "defaults::first_byte_timeout_secs")]
    pub first_byte_timeout_secs: f64,
    /// Longest silence allowed between two response body frames.
    #[serde(default = "defaults::idle_timeout_secs")]
    pub idle_timeout_secs: f64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Glob matched against the request's `model`.
    #[serde(rename = "match")]
    pub pattern: String,
    /// Context window, used by `fraction` triggers and keeps.
    #[serde(default)]
    pub max_input_tokens: Option<u64>,
    /// Characters per token for the estimate (default 4.0, 3.3 for `claude*`).
    #[serde(default)]
    pub chars_per_token: Option<f64>,
    /// Tokens counted for each image part (default 85).
    #[serde(default)]
    pub image_tokens: Option<u64>,
}

/// A size in the reference's vocabulary: `{type: tokens|messages|fraction, value: N}`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(tag = "type", content = "value", rename_all = "lowercase")]
pub enum ContextSize {
    Tokens(u64),
    Messages(u64),
    Fraction(f64),
}

/// `trigger` accepts one size or a list of sizes (OR).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(ContextSize),
    Many(Vec<ContextSize>),
}

impl OneOrMany {
    pub fn to_vec(&self) -> Vec<ContextSize> {
        match self {
            OneOrMany::One(size) => vec![*size],
            OneOrMany::Many(sizes) => sizes.clone(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Forward the original request when compaction cannot run.
    Open,
    /// Answer 503 when compaction was needed but could not run.
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NoticeMode {
    Comment,
    Chunk,
    Named,
    Off,
}

impl NoticeMode {
    pub fn parse(value: &str) -> Option<NoticeMode> {
        match value.trim().to_ascii_lowercase().as_str() {
            "comment" => Some(NoticeMode::Comment),
            "chunk" => Some(NoticeMode::Chunk),
            "named" => Some(NoticeMode::Named),
            "off" => Some(NoticeMode::Off),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Oversize {
    /// Keep the head and the tail of an over-budget summarizer input.
    Trim,
    /// Summarize an over-budget input chunk by chunk, folding each summary into the next.
    Fold,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SummaryRole {
    User,
    System,
    Developer,
    Assistant,
}

impl SummaryRole {
    pub fn as_str(self) -> &'static str {
        match self {
            SummaryRole::User => "user",
            SummaryRole::System => "system",
            SummaryRole::Developer => "developer",
            SummaryRole::Assistant => "assistant",
        }
    }
}

/// The `summarization:` block. A DeerFlow `summarization:` block loads as is; the rest is ours.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SummarizationConfig {
    /// Compaction on or off.
    #[serde(default)]
    pub enabled: bool,
    /// Model for the summarizer call; null uses the request's own model.
    #[serde(default)]
    pub model_name: Option<String>,
    /// Upstream (by name) for the summarizer call; null uses the request's upstream.
    #[serde(default)]
    pub upstream: Option<String>,
    /// When to compact: any entry reached (`>=`) triggers.
    #[serde(default = "defaults::trigger")]
    pub trigger: OneOrMany,
    /// How much recent conversation is kept verbatim.
    #[serde(default = "defaults::keep")]
    pub keep: ContextSize,
    /// Token budget of the summarizer's input; null means no bound.
    #[serde(default = "defaults::trim_tokens_to_summarize")]
    pub trim_tokens_to_summarize: Option<u64>,
    /// Custom prompt; must contain `{messages}`.
    #[serde(default)]
    pub summary_prompt: Option<String>,
    /// Role of the injected summary message.
    #[serde(default = "defaults::summary_role")]
    pub summary_role: SummaryRole,
    /// `max_tokens` of the summarizer call, also the summary's size estimate for headroom.
    #[serde(default = "defaults::summary_max_tokens")]
    pub summary_max_tokens: u64,
    /// After compaction the request must sit under `headroom × threshold`; null disables.
    #[serde(default = "defaults::headroom")]
    pub headroom: Option<f64>,
    /// Summarizer call timeout.
    #[serde(default = "defaults::timeout_secs")]
    pub timeout_secs: f64,
    /// What happens when compaction was needed but could not run.
    #[serde(default = "defaults::fail_mode")]
    pub fail_mode: FailMode,
    /// Form of the `context_compacting` notice on streams.
    #[serde(default = "defaults::notice")]
    pub notice: NoticeMode,
    /// How an over-budget summarizer input is handled.
    #[serde(default = "defaults::oversize")]
    pub oversize: Oversize,
    #[serde(default = "defaults::preserve_recent_skill_count")]
    pub preserve_recent_skill_count: u64,
    #[serde(default = "defaults::preserve_recent_skill_tokens")]
    pub preserve_recent_skill_tokens: u64,
    #[serde(default = "defaults::preserve_recent_skill_tokens_per_skill")]
    pub preserve_recent_skill_tokens_per_skill: u64,
    #[serde(default = "defaults::skill_file_read_tool_names")]
    pub skill_file_read_tool_names: Vec<String>,
    #[serde(default = "defaults::skills_container_path")]
    pub skills_container_path: String,
}

impl Default for SummarizationConfig {
    fn default() -> Self {
        SummarizationConfig {
            enabled: false,
            model_name: None,
            upstream: None,
            trigger: defaults::trigger(),
            keep: defaults::keep(),
            trim_tokens_to_summarize: defaults::trim_tokens_to_summarize(),
            summary_prompt: None,
            summary_role: defaults::summary_role(),
            summary_max_tokens: defaults::summary_max_tokens(),
            headroom: defaults::headroom(),
            timeout_secs: defaults::timeout_secs(),
            fail_mode: defaults::fail_mode(),
            notice: defaults::notice(),
            oversize: defaults::oversize(),
            preserve_recent_skill_count: defaults::preserve_recent_skill_count(),
            preserve_recent_skill_tokens: defaults::preserve_recent_skill_tokens(),
            preserve_recent_skill_tokens_per_skill:
                defaults::preserve_recent_skill_tokens_per_skill(),
            skill_file_read_tool_names: defaults::skill_file_read_tool_names(),
            skills_container_path: defaults::skills_container_path(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// Upper bound of the summary cache, in bytes of summary text.
    #[serde(default = "defaults::cache_max_bytes")]
    pub max_bytes: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            max_bytes: defaults::cache_max_bytes(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// JSON bodies read for routing or compaction larger than this get 413.
    #[serde(default = "defaults::max_request_body_bytes")]
    pub max_request_body_bytes: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_request_body_bytes: defaults::max_request_body_bytes(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Trust the operating system's roots instead of the compiled-in web roots.
    #[serde(default)]
    pub native_roots: bool,
}

mod defaults {
    use super::*;
    pub fn listen() -> String {
        "127.0.0.1:8080".into()
    }
    pub fn prefix() -> String {
        "/v1".into()
    }
    pub fn shutdown_grace_secs() -> f64 {
        30.0
    }
    pub fn all_models() -> Vec<String> {
        vec!["*".into()]
    }
    pub fn connect_timeout_secs() -> f64 {
        10.0
    }
    pub fn first_byte_timeout_secs() -> f64 {
        600.0
    }
    pub fn idle_timeout_secs() -> f64 {
        300.0
    }
    pub fn trigger() -> OneOrMany {
        OneOrMany::Many(vec![ContextSize::Tokens(60_000)])
    }
    pub fn keep() -> ContextSize {
        ContextSize::Messages(20)
    }
    pub fn trim_tokens_to_summarize() -> Option<u64> {
        Some(4000)
    }
    pub fn summary_role() -> SummaryRole {
        SummaryRole::User
    }
    pub fn summary_max_tokens() -> u64 {
        1024
    }
    pub fn headroom() -> Option<f64> {
        Some(0.75)
    }
    pub fn timeout_secs() -> f64 {
        60.0
    }
    pub fn fail_mode() -> FailMode {
        FailMode::Open
    }
    pub fn notice() -> NoticeMode {
        NoticeMode::Comment
    }
    pub fn oversize() -> Oversize {
        Oversize::Trim
    }
    pub fn preserve_recent_skill_count() -> u64 {
        5
    }
    pub fn preserve_recent_skill_tokens() -> u64 {
        25_000
    }
    pub fn preserve_recent_skill_tokens_per_skill() -> u64 {
        5_000
    }
    pub fn skill_file_read_tool_names() -> Vec<String> {
        ["read_file", "read", "view", "cat"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }
    pub fn skills_container_path() -> String {
        "/mnt/skills".into()
    }
    pub fn cache_max_bytes() -> u64 {
        64 * 1024 * 1024
    }
    pub fn max_request_body_bytes() -> u64 {
        32 * 1024 * 1024
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

    fn validate_into(&self, problems: &mut Vec<String>) {
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
        }
        for (i, model) in self.models.iter().enumerate() {
            let key = format!("models[{i}]");
            if model.max_input_tokens == Some(0) {
                problems.push(format!("{key}.max_input_tokens: must be > 0"));
            }
            if let Some(cpt) = model.chars_per_token {
                if !(cpt.is_finite() && cpt > 0.0) {
                    problems.push(format!("{key}.chars_per_token: must be > 0"));
                }
            }
        }
        positive_secs("shutdown_grace_secs", self.shutdown_grace_secs, problems);
        if self.limits.max_request_body_bytes == 0 {
            problems.push("limits.max_request_body_bytes: must be > 0".into());
        }
        self.validate_summarization(problems);
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
        positive_secs("summarization.timeout_secs", s.timeout_secs, problems);
        if let Some(name) = &s.upstream {
            if !self.upstreams.iter().any(|u| &u.name == name) {
                problems.push(format!(
                    "summarization.upstream: no upstream is named '{name}'"
                ));
            }
        }
        if self.cache.max_bytes == 0 {
            problems.push("cache.max_bytes: must be > 0".into());
        }
    }

    /// The effective config as YAML with every secret replaced by `***`.
    pub fn redacted_yaml(&self) -> String {
        serde_yaml_ng::to_string(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
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

/// Expands `${VAR}` and `${VAR:-default}`; `$$` is a literal `$`. An unset variable without a
/// default is an error rather than a silent empty string, so a typo cannot blank an API key.
pub fn expand_vars(input: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| format!("unterminated '${{' in '{input}'"))?;
            let expr = &body[..end];
            let (name, default) = match expr.split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (expr, None),
            };
            let valid_name =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid_name {
                return Err(format!("'${{{expr}}}' is not a valid variable reference"));
            }
            match (env(name).filter(|v| !v.is_empty()), default) {
                (Some(value), _) => out.push_str(&value),
                (None, Some(default)) => out.push_str(default),
                (None, None) => {
                    return Err(format!(
                        "environment variable {name} is not set (use ${{{name}:-}} for an optional one)"
                    ))
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "upstreams:\n  - name: a\n    base_url: http://127.0.0.1:9/v1\n";

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let config = Config::from_yaml_with_env(MINIMAL, &no_env).expect("valid");
        assert_eq!(config.listen, "127.0.0.1:8080");
        assert_eq!(config.prefix, "/v1");
        assert_eq!(config.upstreams[0].models, vec!["*".to_string()]);
        assert_eq!(config.limits.max_request_body_bytes, 32 * 1024 * 1024);
        assert!(!config.summarization.enabled);
        assert_eq!(config.summarization.trim_tokens_to_summarize, Some(4000));
        assert_eq!(config.summarization.headroom, Some(0.75));
    }

    #[test]
    fn unknown_key_is_named_with_its_line() {
        let yaml = "upstreams:\n  - name: a\n    base_url: http://x/v1\n    bogus: 1\n";
        let err = Config::from_yaml_with_env(yaml, &no_env)
            .unwrap_err()
            .to_string();
        assert!(err.contains("bogus"), "{err}");
        assert!(err.contains("line 4"), "{err}");
    }

    #[test]
    fn env_vars_expand_with_defaults_and_fail_when_missing() {
        let env = |name: &str| (name == "KEY").then(|| "sk-live".to_string());
        assert_eq!(expand_vars("${KEY}", &env).unwrap(), "sk-live");
        assert_eq!(expand_vars("a${NOPE:-b}c", &env).unwrap(), "abc");
        assert_eq!(expand_vars("${NOPE:-}", &env).unwrap(), "");
        assert_eq!(expand_vars("cost $$5", &env).unwrap(), "cost $5");
        assert!(expand_vars("${NOPE}", &env).unwrap_err().contains("NOPE"));
        let yaml = "upstreams:\n  - name: a\n    base_url: http://x/v1\n    api_key: ${MISSING}\n";
        let err = Config::from_yaml_with_env(yaml, &no_env)
            .unwrap_err()
            .to_string();
        assert!(err.contains("upstreams[0].api_key"), "{err}");
    }

    #[test]
    fn secrets_are_redacted_in_check_output_and_debug() {
        let env = |_: &str| Some("sk-very-secret".to_string());
        let yaml = "upstreams:\n  - name: a\n    base_url: http://x/v1\n    api_key: ${K}\n    headers:\n      x-api-key: ${K}\n";
        let config = Config::from_yaml_with_env(yaml, &env).unwrap();
        assert_eq!(
            config.upstreams[0].api_key.as_ref().unwrap().expose(),
            "sk-very-secret"
        );
        let rendered = config.redacted_yaml();
        assert!(!rendered.contains("sk-very-secret"), "{rendered}");
        assert!(!format!("{config:?}").contains("sk-very-secret"));
    }

    #[test]
    fn bad_values_are_all_reported_with_their_keys() {
        let yaml = r#"
listen: nope
upstreams:
  - name: a
    base_url: ftp://x
summarization:
  trigger:
    - {type: fraction, value: 1.5}
    - {type: tokens, value: 0}
  keep: {type: messages, value: 0}
  summary_prompt: "no placeholder"
  upstream: ghost
"#;
        let err = Config::from_yaml_with_env(yaml, &no_env)
            .unwrap_err()
            .to_string();
        for key in [
            "listen:",
            "upstreams[0].base_url",
            "summarization.trigger[0]",
            "summarization.trigger[1]",
            "summarization.keep",
            "summarization.summary_prompt",
            "summarization.upstream",
        ] {
            assert!(err.contains(key), "missing {key} in {err}");
        }
    }

    #[test]
    fn unknown_trigger_type_is_rejected() {
        let yaml = format!("{MINIMAL}summarization:\n  trigger: [{{type: bananas, value: 3}}]\n");
        let err = Config::from_yaml_with_env(&yaml, &no_env)
            .unwrap_err()
            .to_string();
        assert!(err.contains("summarization"), "{err}");
    }

    #[test]
    fn deerflow_block_loads_as_is() {
        let yaml = format!(
            "{MINIMAL}{}",
            r#"summarization:
  enabled: true
  model_name: gpt-4o-mini
  trigger:
    type: tokens
    value: 4000
  keep:
    type: messages
    value: 20
  trim_tokens_to_summarize: null
  summary_prompt: null
  preserve_recent_skill_count: 5
  preserve_recent_skill_tokens: 25000
  preserve_recent_skill_tokens_per_skill: 5000
  skill_file_read_tool_names: [read_file, read, view, cat]
"#
        );
        let config = Config::from_yaml_with_env(&yaml, &no_env).expect("loads");
        assert_eq!(
            config.summarization.trigger.to_vec(),
            vec![ContextSize::Tokens(4000)]
        );
        assert_eq!(config.summarization.trim_tokens_to_summarize, None);
    }
}
