//! Compaction: the pure planner (`conversation`, `tokens`, `plan`, `summary_input`, `rewrite`)
//! and the in-flight parts that call out (`engine`, `summarizer`, `cache`).

pub mod engine;
mod outcome;

pub use outcome::{CacheUse, Outcome, OutcomeKind};
