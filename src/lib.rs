//! compactor: an OpenAI-compatible reverse proxy that compacts long conversations in flight.
//!
//! The binary (`main.rs`) is a thin shell over this library: `server` accepts connections,
//! `proxy` handles one request as a sequence of phases, `routing` picks the upstream,
//! `upstream` owns its pooled client, `compaction` decides and performs compaction, `config`
//! loads proxy.yaml; `headers`, `body`, `notice`, `access_log` and `error` are what they say.
#![forbid(unsafe_code)]

pub mod access_log;
pub mod apis;
pub mod app;
pub mod auth;
pub mod body;
pub mod compaction;
pub mod config;
pub mod encoding;
pub mod error;
pub mod headers;
pub mod inbound;
pub mod lean_client;
pub mod metrics;
pub mod notice;
pub mod operate;
pub mod poison;
pub mod provider;
pub mod proxy;
pub mod relay;
pub mod report;
pub mod retrieval;
pub mod routing;
pub mod sealing;
pub mod served;
pub mod server;
#[cfg_attr(not(feature = "otel"), path = "telemetry_absent.rs")]
pub mod telemetry;
pub mod upstream;
pub mod usage;
