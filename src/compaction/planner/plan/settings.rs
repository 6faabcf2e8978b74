//! What the planner is told: the stages, the mode, the settings from the config.

use crate::compaction::planner::conversation::PinnedText;
use crate::compaction::planner::skills::SkillRescue;
use crate::config::{ContextSize, Stage, SummarizationConfig};

/// The stages a request may go through, cheapest first (`summarization.stages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stages {
    /// `clear_tool_outputs`: outputs of at least this many tokens, outside the kept tail.
    pub clear_min_tokens: Option<u64>,
    pub summarize: bool,
    pub truncate: bool,
}

impl Default for Stages {
    /// Today's behaviour: a summary, nothing else.
    fn default() -> Self {
        Stages {
            clear_min_tokens: None,
            summarize: true,
            truncate: false,
        }
    }
}

impl Stages {
    pub fn from_config(config: &SummarizationConfig) -> Stages {
        let has = |stage| config.stages.contains(&stage);
        Stages {
            clear_min_tokens: has(Stage::ClearToolOutputs)
                .then_some(config.clear_tool_outputs.min_tokens),
            summarize: has(Stage::Summarize),
            truncate: has(Stage::Truncate),
        }
    }
}

/// The share of the room past an unreachable trigger that a reused summary may grow into when
/// headroom is off (headroom's own default).
pub(super) const UNREACHABLE_HEADROOM: f64 = 0.75;

/// What a plan is for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Compact when a trigger is reached.
    Normal,
    /// `x-compactor: force`: compact even under every trigger.
    Force,
    /// Precompute: the request is at `factor ×` a trigger; plan the summary its conversation
    /// will need once it crosses the trigger, so that it is ready by then.
    Ahead { factor: f64 },
}

/// The settings the planner reads, in the reference's vocabulary.
#[derive(Debug, Clone)]
pub struct PlanSettings {
    pub triggers: Vec<ContextSize>,
    pub keep: ContextSize,
    /// Compacted request must be under `headroom × threshold` for every trigger.
    pub headroom: Option<f64>,
    /// Turns of observed growth the cut leaves room for, on top of headroom (with it on).
    pub headroom_turns: u64,
    /// Size assumed for a summary that does not exist yet (`summary_max_tokens` + framing).
    pub summary_estimate_tokens: u64,
    /// The least a summary must cover to be worth a call: clearly more than the summary itself
    /// (see `worth_summarizing`: over a messages trigger the count decides, and a summary's real
    /// size lowers this once one exists).
    pub min_span_tokens: u64,
    pub skills: SkillRescue,
    pub stages: Stages,
    /// Text a client's context messages begin with (`<environment_context>`, …): such a
    /// message is never summarized, pinned with the system prompt at the start, kept verbatim
    /// after the summary elsewhere.
    pub pinned_context: Vec<PinnedText>,
}

impl PlanSettings {
    pub fn from_config(config: &SummarizationConfig) -> PlanSettings {
        PlanSettings {
            triggers: config.trigger.to_vec(),
            keep: config.keep,
            headroom: config.headroom,
            headroom_turns: config.headroom_turns,
            // The summary message's framing ("Here is a summary…", role) on top of its text.
            summary_estimate_tokens: config.summary_max_tokens + 16,
            min_span_tokens: config.summary_max_tokens.saturating_mul(3) / 2,
            skills: SkillRescue {
                max_count: config.preserve_recent_skill_count,
                max_tokens: config.preserve_recent_skill_tokens,
                max_tokens_per_skill: config.preserve_recent_skill_tokens_per_skill,
                tool_names: config.skill_file_read_tool_names.clone(),
                container_path: config.skills_container_path.clone(),
            },
            stages: Stages::from_config(config),
            pinned_context: config
                .pinned_context
                .iter()
                .filter_map(|text| PinnedText::new(text))
                .collect(),
        }
    }
}
