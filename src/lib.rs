//! compactor: an OpenAI-compatible reverse proxy that compacts long conversations in flight.
//!
//! The binary (`main.rs`) is a thin shell over this library: `server` accepts connections,
//! `proxy` handles one request as a sequence of phases, `upstream` owns the pooled clients and
//! routing, `compaction` decides and performs compaction, `config` loads proxy.yaml.

pub mod body;
pub mod compaction;
pub mod config;
pub mod error;
pub mod headers;
pub mod proxy;
pub mod server;
pub mod sse;
pub mod upstream;
