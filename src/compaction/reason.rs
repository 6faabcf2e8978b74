//! Why compaction did what it did to one request: one low-cardinality label for logs, the
//! access log and the `compactions_total` metric. Branches match on the variant, never on text.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Reason {
    /// Nothing to say (a summary made or reused says how in its own variant).
    #[default]
    None,

    // Passed through, counted or not.
    UnderTrigger,
    ClearedUnderTrigger,
    UnderTriggerBySize,
    DisabledByHeader,
    /// Every planner thread was busy.
    Busy,
    UnparsableBody,
    NothingToSummarize,
    SpanTooSmall,
    NoSummarizeStage,
    /// The client's own tool calls and results do not pair up: nothing is cut.
    InvalidToolStructure,
    /// No summarizer model is configured or known.
    NoModel,
    /// A summary could not bring the request under the model's window.
    WontFit,
    SummaryKnownTooLarge,

    // Left alone: a rewrite would break what the body asks for.
    ContextManagement,
    CompactionBlock,
    PreviousResponseId,
    ConversationId,
    StringInput,
    NoInput,
    ItemReference,
    CompactionTrigger,
    CachedContent,

    // Audit mode: forwarded as it came, whatever enforce would have done.
    Audit,

    // How a summary was had.
    Fresh,
    Incremental,
    Sticky,
    /// Reused: what no summary takes away is at a trigger already, so a new summary could not
    /// bring the request under it.
    TriggerUnreachable,
    Precomputed,
    /// After the upstream refused the request for its length.
    Reactive,
    /// The retry after a context-length error was refused again.
    ReactiveRefused,

    // Failed.
    RewriteInvalid,
    SummarizerNoUpstream,
    SummarizerUnreachable,
    SummarizerHttpError,
    /// The summarizer's own model refused the call's prompt for its length.
    SummarizerContextTooLong,
    SummarizerTimeout,
    SummarizerBlank,
    SummaryNotSmaller,
    SummaryEchoedPrompt,
    Budget,
    CircuitOpen,
    InternalError,
    ContextTooLarge,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Reason::None => "",
            Reason::UnderTrigger => "under_trigger",
            Reason::ClearedUnderTrigger => "cleared_under_trigger",
            Reason::UnderTriggerBySize => "under_trigger_by_size",
            Reason::DisabledByHeader => "disabled_by_header",
            Reason::Busy => "busy",
            Reason::UnparsableBody => "unparsable_body",
            Reason::NothingToSummarize => "nothing_to_summarize",
            Reason::SpanTooSmall => "span_too_small",
            Reason::NoSummarizeStage => "no_summarize_stage",
            Reason::InvalidToolStructure => "invalid_tool_structure",
            Reason::NoModel => "no_model",
            Reason::WontFit => "wont_fit",
            Reason::SummaryKnownTooLarge => "summary_known_too_large",
            Reason::ContextManagement => "context_management",
            Reason::CompactionBlock => "compaction_block",
            Reason::PreviousResponseId => "previous_response_id",
            Reason::ConversationId => "conversation",
            Reason::StringInput => "string_input",
            Reason::NoInput => "no_input",
            Reason::ItemReference => "item_reference",
            Reason::CompactionTrigger => "compaction_trigger",
            Reason::CachedContent => "cached_content",
            Reason::Audit => "audit",
            Reason::Fresh => "fresh",
            Reason::Incremental => "incremental",
            Reason::Sticky => "sticky",
            Reason::TriggerUnreachable => "trigger_unreachable",
            Reason::Precomputed => "precomputed",
            Reason::Reactive => "reactive",
            Reason::ReactiveRefused => "reactive_refused",
            Reason::RewriteInvalid => "rewrite_invalid",
            Reason::SummarizerNoUpstream => "summarizer_no_upstream",
            Reason::SummarizerUnreachable => "summarizer_unreachable",
            Reason::SummarizerHttpError => "summarizer_http_error",
            Reason::SummarizerContextTooLong => "summarizer_context_too_long",
            Reason::SummarizerTimeout => "summarizer_timeout",
            Reason::SummarizerBlank => "summarizer_blank",
            Reason::SummaryNotSmaller => "summary_not_smaller",
            Reason::SummaryEchoedPrompt => "summary_echoed_prompt",
            Reason::Budget => "budget",
            Reason::CircuitOpen => "circuit_open",
            Reason::InternalError => "internal_error",
            Reason::ContextTooLarge => "context_too_large",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}
