//! The `summarization:` block: when and how conversations are compacted, and its defaults.

use serde::{Deserialize, Serialize};

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

/// Whether compaction changes what is forwarded, or only says what it would have done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CompactionMode {
    /// Compact as configured.
    #[default]
    Enforce,
    /// Run the whole decision (count, trigger, cut, cache lookup) and forward every request
    /// byte for byte; headers, metrics and the log say what enforce would have done.
    Audit,
}

/// Settings of audit mode.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// The share (0 to 1) of the conversations that would be summarized whose summaries are
    /// made for real, off the request path: enforce then starts with a warm cache, and the
    /// summaries can be read before anyone relies on them. 0: no summarizer call in audit.
    pub shadow_sample: f64,
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

/// The API the summarizer upstream is called with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SummarizerApi {
    /// `POST {base_url}/chat/completions`, the prompt as one user message.
    ChatCompletions,
    /// `POST {base_url}/responses`, the prompt as `input`, for upstreams that speak only it.
    Responses,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SummaryPlacement {
    /// Always a message of its own.
    Separate,
    /// A leading text part of the user message that follows it, when one does.
    Merge,
    /// Merged only where a message of its own would break role alternation.
    Auto,
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

/// One way of making a request smaller, in the order `summarization.stages` lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Old tool outputs (outside the kept tail) replaced by a placeholder; no LLM call.
    ClearToolOutputs,
    /// The older messages replaced by an LLM summary.
    Summarize,
    /// Last resort when no summary can be had and the request would not fit the model's
    /// window: the oldest whole groups after the pinned head are dropped.
    Truncate,
}

impl Stage {
    pub fn label(self) -> &'static str {
        match self {
            Stage::ClearToolOutputs => "clear_tool_outputs",
            Stage::Summarize => "summarize",
            Stage::Truncate => "truncate",
        }
    }
}

/// The `clear_tool_outputs` stage's settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClearToolOutputsConfig {
    /// Only outputs of at least this many tokens are replaced (a placeholder costs about 30).
    pub min_tokens: u64,
}

/// A way back from a summary: the model may ask for the original of what it stands for.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetrievalConfig {
    /// Off changes nothing on the wire.
    pub enabled: bool,
    /// The tool compactor adds to a compacted request and answers itself.
    pub tool_name: String,
    /// Lookups one request may cost: each is one more upstream call.
    pub max_rounds: u32,
    /// The longest original one lookup answers with; longer ones are cut, with a note.
    pub max_bytes: usize,
}

impl Default for RetrievalConfig {
    fn default() -> Self {
        RetrievalConfig {
            enabled: false,
            tool_name: "compactor_expand".into(),
            max_rounds: 2,
            max_bytes: 64 * 1024,
        }
    }
}

/// The `summarization:` block. A DeerFlow `summarization:` block loads as is; the rest is ours.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SummarizationConfig {
    /// Compaction on or off.
    pub enabled: bool,
    /// `enforce` compacts; `audit` forwards every request as it came and says what enforce
    /// would have done (per client key: `auth.keys[].mode`).
    pub mode: CompactionMode,
    /// Settings of audit mode.
    pub audit: AuditConfig,
    /// Model for the summarizer call; null uses the request's own model.
    pub model_name: Option<String>,
    /// Upstream (by name) for the summarizer call; null uses the request's upstream.
    pub upstream: Option<String>,
    /// When to compact: any entry reached (`>=`) triggers. The model's window (from `models`,
    /// or learned from an upstream's context-length error) is always a trigger too.
    pub trigger: OneOrMany,
    /// What compaction may do, in this order, each only while the request is still over a
    /// trigger: `clear_tool_outputs`, `summarize`, `truncate`.
    pub stages: Vec<Stage>,
    /// Settings of the `clear_tool_outputs` stage.
    pub clear_tool_outputs: ClearToolOutputsConfig,
    /// Summaries made ahead of need: a request at this fraction of a trigger is forwarded as is
    /// while the summary its conversation will need is made in the background; null: off.
    pub precompute_at: Option<f64>,
    /// When the upstream answers with a context-length error, compact the request (as if over
    /// the trigger, the error's stated limit becoming the model's window) and retry it once.
    pub reactive: bool,
    /// How much recent conversation is kept verbatim.
    pub keep: ContextSize,
    /// Input tokens of one summarizer call; null: as many as the summarizer model's window
    /// holds (from `models`; 24 000 when it has no entry).
    pub trim_tokens_to_summarize: Option<u64>,
    /// Custom prompt; must contain `{messages}`.
    pub summary_prompt: Option<String>,
    /// Role of the injected summary message.
    pub summary_role: SummaryRole,
    /// Where the summary goes: its own message, merged into the user message after it, or
    /// merged only when its own message would put two user messages in a row.
    pub summary_placement: SummaryPlacement,
    /// `max_tokens` of the summarizer call, also the summary's size estimate for headroom.
    pub summary_max_tokens: u64,
    /// Entries of the identifier index compactor appends to each summary (exact error lines,
    /// paths, ids, URLs, commands found in the summarized messages); 0: none.
    pub identifier_index: usize,
    /// Lookups of what a summary left out, answered from the request itself.
    pub retrieval: RetrievalConfig,
    /// After compaction the request must sit under `headroom × threshold`; null disables.
    pub headroom: Option<f64>,
    /// With headroom on, the cut also leaves room for this many turns of the conversation's
    /// own growth (what one request added, on average, over its latest steps) before the
    /// trigger is reached again, so a fast-growing conversation reuses its summary for about
    /// as many turns as a slow one. The room never takes more than half of what headroom
    /// leaves, or, where each request holds several responses (one request per user turn),
    /// more than leaves the latest `headroom_turns / 2` responses beside the summary.
    /// 0: headroom alone.
    pub headroom_turns: u64,
    /// Summarizer call timeout.
    pub timeout_secs: f64,
    /// What happens when compaction was needed but could not run.
    pub fail_mode: FailMode,
    /// Form of the `context_compacting` notice on streams.
    pub notice: NoticeMode,
    /// How an over-budget summarizer input is handled.
    pub oversize: Oversize,
    /// The API the summarizer upstream is called with.
    pub summarizer_api: SummarizerApi,
    /// Summarizer calls running at once, across all clients; past it compaction fails open.
    pub max_concurrent_calls: u64,
    /// Summarizer calls running at once for one tenant.
    pub max_concurrent_calls_per_tenant: u64,
    /// Summarizer calls one tenant may start per minute.
    pub max_calls_per_minute_per_tenant: u64,
    /// Summarizer calls one request may cost: `oversize: fold` makes one per chunk, up to this.
    pub max_summarizer_calls: u64,
    /// Consecutive summarizer failures that open the circuit breaker.
    pub breaker_failures: u64,
    /// How long an open breaker skips the summarizer before one probe call.
    pub breaker_cooldown_secs: f64,
    /// Whether `x-compactor: force` is honoured when auth is off (keys have their own flag).
    pub allow_force: bool,
    /// Whether a client's own summarization instructions (the `instructions` of Anthropic's
    /// `compact_20260112` edit) write its summaries when auth is off (keys have their own
    /// flag); when not, compactor's prompt writes them.
    pub client_instructions: bool,
    /// Largest client instructions taken, in bytes; a request with longer ones gets 400.
    pub max_client_instructions_bytes: usize,
    /// Skill-read groups kept verbatim instead of summarized, newest first; 0 disables.
    pub preserve_recent_skill_count: u64,
    /// Total token budget of the rescued skill groups.
    pub preserve_recent_skill_tokens: u64,
    /// A skill group larger than this is not rescued.
    pub preserve_recent_skill_tokens_per_skill: u64,
    /// Tools whose calls read skill files.
    pub skill_file_read_tool_names: Vec<String>,
    /// A read counts as a skill read when its path lies under this directory.
    pub skills_container_path: String,
    /// Text that a client's context messages begin with (leading whitespace aside): such a
    /// user, system or developer message is never summarized. At the start of the conversation
    /// it is pinned with the system prompt; elsewhere it is kept verbatim after the summary.
    pub pinned_context: Vec<String>,
}

impl Default for SummarizationConfig {
    fn default() -> Self {
        SummarizationConfig {
            enabled: false,
            mode: CompactionMode::Enforce,
            audit: AuditConfig::default(),
            model_name: None,
            upstream: None,
            trigger: OneOrMany::Many(vec![ContextSize::Tokens(60_000)]),
            stages: vec![Stage::Summarize],
            clear_tool_outputs: ClearToolOutputsConfig::default(),
            precompute_at: None,
            reactive: true,
            keep: ContextSize::Messages(20),
            trim_tokens_to_summarize: None,
            summary_prompt: None,
            summary_role: SummaryRole::User,
            summary_placement: SummaryPlacement::Auto,
            summary_max_tokens: 1024,
            identifier_index: 24,
            retrieval: RetrievalConfig::default(),
            headroom: Some(0.75),
            headroom_turns: 10,
            timeout_secs: 60.0,
            fail_mode: FailMode::Open,
            notice: NoticeMode::Comment,
            oversize: Oversize::Fold,
            summarizer_api: SummarizerApi::ChatCompletions,
            max_concurrent_calls: 16,
            max_concurrent_calls_per_tenant: 2,
            max_calls_per_minute_per_tenant: 30,
            max_summarizer_calls: 4,
            breaker_failures: 5,
            breaker_cooldown_secs: 30.0,
            allow_force: false,
            client_instructions: true,
            max_client_instructions_bytes: 16 * 1024,
            preserve_recent_skill_count: 5,
            preserve_recent_skill_tokens: 25_000,
            preserve_recent_skill_tokens_per_skill: 5_000,
            skill_file_read_tool_names: ["read_file", "read", "view", "cat"]
                .map(String::from)
                .to_vec(),
            skills_container_path: "/mnt/skills".into(),
            // Codex's workspace facts and AGENTS.md, each a user item at the head of its input.
            pinned_context: [
                "<environment_context>",
                "<user_instructions>",
                "# AGENTS.md instructions",
            ]
            .map(String::from)
            .to_vec(),
        }
    }
}

impl Default for ClearToolOutputsConfig {
    fn default() -> Self {
        ClearToolOutputsConfig { min_tokens: 200 }
    }
}
