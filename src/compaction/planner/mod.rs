//! The compaction planner: pure functions over the request bytes, no I/O, no clock, so every
//! rule can be tested exhaustively and benchmarked alone.

pub mod clearing;
pub mod conversation;
pub mod digest;
pub mod json_escape;
pub mod plan;
pub mod raw_json;
pub mod rewrite;
pub mod size_bound;
pub mod skills;
pub mod structure;
pub mod tokens;
