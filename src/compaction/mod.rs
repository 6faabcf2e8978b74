//! Compaction, in three parts and the orchestration that joins them:
//! - `planner`: pure, no I/O and no clock. The request as a borrowed view (`conversation`),
//!   the estimate (`tokens`), tool-call groups and valid cuts (`structure`), skill reads worth
//!   keeping (`skills`), the `clear_tool_outputs` stage (`clearing`), what to summarize and keep
//!   (`plan`), the proof from byte length alone (`size_bound`), the splice (`rewrite`), cache
//!   keys (`digest`).
//! - `front_end`: the trait each API's folder (`crate::apis`) implements: how its body reads
//!   as a conversation and how a summary is written back into it. Compaction names no API.
//! - `summaries`: making and keeping summaries: the summarizer's prompt (`summary_input`) and
//!   call (`summarizer`), what it may cost (`budget`), one call per prefix (`single_flight`),
//!   the sticky cache (`cache`) and its shared tier (`redis_tier`).
//!
//! Orchestration: `engine` (per request), `prepare` (the CPU part), `control` (the request's
//! control headers), `scope` (tenant and fingerprint), `offload` (CPU work off the reactor),
//! `windows` (each model's context window), `calibration` (each model's count learned from
//! its upstream's usage), `overflow` (an upstream's context-length error) and
//! `retry` (the one retry after it),
//! `failure`, `outcome` and `reason` (what happened, and why).

pub mod calibration;
pub mod control;
pub mod engine;
pub mod failure;
pub mod front_end;
pub mod offload;
mod outcome;
pub mod overflow;
pub mod planner;
pub mod prepare;
pub mod reason;
pub mod retry;
pub mod scope;
pub mod summaries;
pub mod windows;

pub use outcome::{CacheUse, CountBasis, Outcome, OutcomeKind, SummarizerUsage};
pub use reason::Reason;
