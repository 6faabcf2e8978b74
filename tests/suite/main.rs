//! Every integration test in one binary: the dependency tree is linked once, not once per
//! file, which was most of the test command's time on a fresh clone.

mod common;

mod architecture;
mod audit;
mod binary;
mod compaction;
mod counting;
mod engine_contract;
mod eval;
mod front_ends;
mod gateway;
mod gemini;
mod hardening;
mod helm_chart;
mod messages;
mod overflow;
mod planner;
mod quality;
mod random_runs;
#[cfg(feature = "redis")]
mod redis;
mod responses;
mod retrieval;
mod sdk_async_openai;
mod security;
mod stages;
mod telemetry;
