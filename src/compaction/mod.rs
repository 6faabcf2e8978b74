//! Compaction. The pure planner: `conversation` (the request as a borrowed view), `tokens`
//! (the estimate), `plan` (what to summarize and keep), `summary_input` (the summarizer's
//! prompt), `rewrite` (the new body and its validator), `digest` (cache keys). The parts that
//! call out: `engine` (per request), `summarizer` (the LLM call), `cache` (sticky summaries).

pub mod cache;
pub mod conversation;
pub mod digest;
pub mod engine;
mod outcome;
pub mod plan;
pub mod rewrite;
pub mod summarizer;
pub mod summary_input;
pub mod tokens;

pub use outcome::{CacheUse, Outcome, OutcomeKind};
