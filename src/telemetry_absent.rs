//! A build without the `otel` feature exports no traces: with no `telemetry.otlp_endpoint` it
//! runs as the full build does with none (no span is made); with one, it refuses to start
//! rather than drop the traces an operator asked for.

use http::HeaderMap;
use tracing::Span;

use crate::config::TelemetryConfig;

/// No value of it exists: there is no tracer to hand the log's subscriber.
pub enum Tracer {}

/// The running exporter, of which there is none.
pub struct Traces(#[allow(dead_code)] Tracer);

impl Drop for Traces {
    /// As the full build's: dropping it is where the last spans would be flushed.
    fn drop(&mut self) {}
}

pub fn traces_on() -> bool {
    false
}

pub fn init(config: &TelemetryConfig) -> Result<Option<(Traces, Tracer)>, String> {
    match &config.otlp_endpoint {
        None => Ok(None),
        Some(_) => {
            Err("telemetry.otlp_endpoint needs a compactor built with the otel feature".into())
        }
    }
}

pub fn request_span(_method: &http::Method, _path: &str, _headers: &HeaderMap) -> Span {
    Span::none()
}

pub fn summarizer_span(_upstream: &str, _model: &str, _max_tokens: u64, _calls: usize) -> Span {
    Span::none()
}

pub fn inject(_headers: &mut HeaderMap) {}
