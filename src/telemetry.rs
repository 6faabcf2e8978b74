//! Traces, when `telemetry.otlp_endpoint` is set: a span per request (its parent taken from the
//! client's W3C `traceparent`), the summarizer call as a child span with the GenAI attributes,
//! and `traceparent` sent upstream so the provider's spans join the trace. Exported as OTLP/HTTP
//! JSON in batches. With no endpoint nothing here runs: no span is even created.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::TracerProvider;
use opentelemetry::{global, KeyValue};
use opentelemetry_http::{HeaderExtractor, HeaderInjector, HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
pub use opentelemetry_sdk::trace::Tracer;
use opentelemetry_sdk::Resource;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::TelemetryConfig;

static TRACES: AtomicBool = AtomicBool::new(false);

/// Whether spans are made and exported.
pub fn traces_on() -> bool {
    TRACES.load(Ordering::Relaxed)
}

/// The running exporter: dropping it flushes the spans still queued.
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Drop for Traces {
    fn drop(&mut self) {
        TRACES.store(false, Ordering::Relaxed);
        if let Err(e) = self.provider.shutdown() {
            eprintln!("compactor: exporting the last spans failed: {e}");
        }
    }
}

/// Starts the exporter when an endpoint is configured: the tracer for the subscriber's layer,
/// and the guard that flushes at exit.
pub fn init(config: &TelemetryConfig) -> Result<Option<(Traces, Tracer)>, String> {
    let Some(endpoint) = &config.otlp_endpoint else {
        return Ok(None);
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
        .with_timeout(Duration::from_secs(10))
        .with_http_client(OtlpHttp::new()?)
        .build()
        .map_err(|e| format!("telemetry.otlp_endpoint: {e}"))?;
    let resource = Resource::builder()
        .with_attribute(KeyValue::new("service.name", config.service_name.clone()))
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    global::set_text_map_propagator(TraceContextPropagator::new());
    let tracer = provider.tracer("compactor");
    TRACES.store(true, Ordering::Relaxed);
    Ok(Some((Traces { provider }, tracer)))
}

/// The span of one request, a child of the client's trace when it sent `traceparent`; none
/// when traces are off.
pub fn request_span(method: &http::Method, path: &str, headers: &HeaderMap) -> Span {
    if !traces_on() {
        return Span::none();
    }
    let span = tracing::info_span!(
        "request",
        otel.name = tracing::field::Empty,
        otel.kind = "server",
        http.request.method = %method,
        url.path = path,
        http.response.status_code = tracing::field::Empty,
        gen_ai.operation.name = tracing::field::Empty,
        gen_ai.provider.name = tracing::field::Empty,
        gen_ai.request.model = tracing::field::Empty,
        compactor.compaction = tracing::field::Empty,
        compactor.reason = tracing::field::Empty,
        compactor.tokens_before = tracing::field::Empty,
        compactor.tokens_after = tracing::field::Empty,
    );
    let parent = global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)));
    let _ = span.set_parent(parent);
    span
}

/// The summarizer call's span, a child of the request that asked for the summary.
pub fn summarizer_span(upstream: &str, model: &str, max_tokens: u64, calls: usize) -> Span {
    if !traces_on() {
        return Span::none();
    }
    tracing::info_span!(
        "summarize",
        otel.name = %format!("chat {model}"),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = upstream,
        gen_ai.request.model = model,
        gen_ai.request.max_tokens = max_tokens,
        compactor.summarizer_calls = calls,
    )
}

/// Sends the current span as `traceparent` (and `tracestate`), replacing the client's.
pub fn inject(headers: &mut HeaderMap) {
    if !traces_on() {
        return;
    }
    let context = Span::current().context();
    global::get_text_map_propagator(|p| p.inject_context(&context, &mut HeaderInjector(headers)));
}

/// Spans are exported from the SDK's own thread, outside any request's runtime: the client
/// runs on a small runtime of its own, with the proxy's rustls set-up.
struct OtlpHttp {
    runtime: Option<tokio::runtime::Runtime>,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// Replies from a collector larger than this are not read.
const MAX_REPLY_BYTES: usize = 1024 * 1024;

impl OtlpHttp {
    fn new() -> Result<OtlpHttp, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("compactor-otlp")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the span exporter: {e}"))?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        Ok(OtlpHttp {
            runtime: Some(runtime),
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }
}

impl std::fmt::Debug for OtlpHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OtlpHttp")
    }
}

impl Drop for OtlpHttp {
    fn drop(&mut self) {
        // Dropped from wherever the provider ends, maybe inside a runtime: never block there.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[async_trait::async_trait]
impl HttpClient for OtlpHttp {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let runtime = self
            .runtime
            .as_ref()
            .ok_or("the span exporter has stopped")?;
        let client = self.client.clone();
        let request = request.map(Full::new);
        let sent = runtime.spawn(async move {
            let response = client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_REPLY_BYTES)
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, HttpError>(http::Response::from_parts(parts, body))
        });
        sent.await?
    }
}
