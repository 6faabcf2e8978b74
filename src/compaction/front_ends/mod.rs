//! One front-end per API.

pub mod messages;
pub mod responses;
