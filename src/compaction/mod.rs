//! Compaction. The pure planner: `conversation` (the request as a borrowed view, read in one
//! pass), `responses` and `messages` (the Responses and Anthropic Messages front-ends, mapped onto that view), `tokens` (the estimate), `structure` (tool-call groups, valid cuts, the validator),
//! `skills` (skill reads worth keeping), `plan` (what to summarize and keep), `size_bound` (under every trigger, from the byte length), `summary_input`
//! (the summarizer's prompt), `rewrite` (the splice), `digest` (cache keys). The parts that
//! call out or hold state: `engine` (orchestration per request), `control` (the request's
//! control headers), `scope` (tenant and fingerprint), `offload` (CPU work off the reactor),
//! `single_flight`, `budget` (what the summarizer may cost), `summarizer` (the LLM call), `cache` (sticky summaries), `failure` and
//! `outcome` (what happened).

pub mod budget;
pub mod cache;
pub mod clearing;
pub mod control;
pub mod conversation;
pub mod digest;
pub mod engine;
pub mod failure;
pub mod messages;
pub mod offload;
mod outcome;
pub mod overflow;
pub mod plan;
pub mod prepare;
pub mod redis_tier;
pub mod responses;
pub mod rewrite;
pub mod scope;
pub mod single_flight;
pub mod size_bound;
pub mod skills;
pub mod structure;
pub mod summarizer;
pub mod summary_input;
pub mod tokens;
pub mod windows;

pub use outcome::{CacheUse, Outcome, OutcomeKind};
