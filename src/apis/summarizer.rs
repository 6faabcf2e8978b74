//! The real summarizer: one non-streaming call to the summarizer upstream, in the API that
//! upstream speaks ([`SummaryWire`]: a chat completion, a Responses call with
//! `summarizer_api: responses`, or Anthropic's Messages for `api: anthropic`), made with the
//! upstream's own pooled client.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header;
use http::{Method, Request};
use http_body_util::{BodyExt, Limited};
use serde_json::Value;

use super::summary_wire::SummaryWire;
use crate::body;
use crate::compaction::overflow;
use crate::compaction::summaries::summarizer::{
    Summarizer, Summary, SummaryError, SummaryFuture, SummaryRequest,
};
use crate::config::{SummarizerApi, UpstreamApi};
use crate::headers::CREDENTIALS;
use crate::routing::Upstreams;
use crate::upstream::Upstream;
use crate::usage::UsageTap;

/// The wire a summarizer call speaks to an upstream of `upstream`'s API.
fn wire(upstream: UpstreamApi, asked: SummarizerApi) -> &'static dyn SummaryWire {
    match (upstream, asked) {
        (UpstreamApi::Anthropic, _) => &super::messages::wire::MessagesWire,
        (UpstreamApi::Gemini, _) => &super::gemini::wire::GeminiWire,
        (UpstreamApi::Openai, SummarizerApi::ChatCompletions) => &super::chat::wire::ChatWire,
        (UpstreamApi::Openai, SummarizerApi::Responses) => &super::responses::wire::ResponsesWire,
    }
}

pub struct HttpSummarizer {
    upstreams: Arc<Upstreams>,
    timeout: Duration,
}

/// Replies larger than this are not summaries.
const MAX_REPLY_BYTES: usize = 4 * 1024 * 1024;

impl HttpSummarizer {
    pub fn new(upstreams: Arc<Upstreams>, timeout: Duration) -> HttpSummarizer {
        HttpSummarizer { upstreams, timeout }
    }
}

impl Summarizer for HttpSummarizer {
    fn summarize(&self, request: SummaryRequest) -> SummaryFuture {
        let upstreams = self.upstreams.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, call(&upstreams, &request)).await {
                Ok(result) => result,
                Err(_) => Err(SummaryError::Timeout(timeout)),
            }
        })
    }
}

async fn call(upstreams: &Upstreams, request: &SummaryRequest) -> Result<Summary, SummaryError> {
    let upstream = upstreams
        .by_name(&request.call.upstream)
        .ok_or_else(|| SummaryError::NoUpstream(request.call.upstream.clone()))?;
    let wire = wire(upstream.api, request.call.api);
    let payload = wire.payload(
        &request.call.model,
        request.call.max_tokens,
        &request.prompt,
    );
    let http_request = http_request(upstream, wire, request, payload)?;
    let response = upstream
        .client
        .request(http_request)
        .await
        .map_err(|e| SummaryError::Transport(e.to_string()))?;
    let status = response.status();
    let bytes = Limited::new(response.into_body(), MAX_REPLY_BYTES)
        .collect()
        .await
        .map_err(|e| SummaryError::Transport(e.to_string()))?
        .to_bytes();
    if !status.is_success() {
        return Err(match overflow::parse(status.as_u16(), &bytes) {
            Some(overflow) => SummaryError::ContextTooLong(overflow),
            None => SummaryError::Status(status.as_u16()),
        });
    }
    let reply: Value = serde_json::from_slice(&bytes).map_err(|_| SummaryError::Blank)?;
    let text = wire
        .reply_text(&reply)
        .map(|text| text.trim().to_string())
        .filter(|text| !text.is_empty())
        .ok_or(SummaryError::Blank)?;
    let mut usage = UsageTap::default();
    usage.observe(&bytes);
    Ok(Summary {
        text,
        input_tokens: usage.input_total(),
    })
}

/// The call: the upstream's own key, else the client's credential in the header it came in,
/// and the headers the wire adds.
fn http_request(
    upstream: &Upstream,
    wire: &dyn SummaryWire,
    request: &SummaryRequest,
    payload: Value,
) -> Result<Request<crate::body::ProxyBody>, SummaryError> {
    let uri = upstream
        .url_for(&wire.path(&request.call.model), None)
        .map_err(|e| SummaryError::Transport(e.to_string()))?;
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json");
    let client = &request.call.client_headers;
    let client_credential = match upstream.credential() {
        Some((name, value)) => {
            builder = builder.header(name, value.clone());
            false
        }
        None => match CREDENTIALS
            .iter()
            .find_map(|name| Some((name, client.get(name)?)))
        {
            Some((name, value)) => {
                builder = builder.header(name, value.clone());
                true
            }
            None => false,
        },
    };
    for (name, value) in wire.headers(client, client_credential) {
        builder = builder.header(name, value);
    }
    for (name, value) in upstream.extra_headers() {
        builder = builder.header(name, value.clone());
    }
    let mut http_request = builder
        .body(body::full(Bytes::from(payload.to_string())))
        .map_err(|e| SummaryError::Transport(e.to_string()))?;
    crate::telemetry::inject(http_request.headers_mut());
    Ok(http_request)
}
