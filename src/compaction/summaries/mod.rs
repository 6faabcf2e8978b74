//! Making and keeping summaries: the summarizer's prompt and call, what it may cost, one call
//! per prefix, what its answer must be to be used, and the sticky cache with its shared tier.

pub mod breaker;
pub mod budget;
pub mod cache;
pub mod identifiers;
pub mod message_text;
#[cfg(feature = "redis")]
pub mod redis_tier;
#[cfg(not(feature = "redis"))]
#[path = "redis_tier_absent.rs"]
pub mod redis_tier;
pub mod single_flight;
pub mod store;
pub mod summarizer;
pub mod summary_input;
pub mod vet;
