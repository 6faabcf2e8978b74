//! The engine contract: `POST {prefix}/compress` with `{"messages": […], "model": "…"}`, as a
//! gateway that already runs (LiteLLM's `guardrail: headroom`, Kong's `ai-prompt-compressor`,
//! Tyk's engine URL) calls an external compressor before its own upstream call. The messages
//! are compacted as a request of that model would be (the same planner, summary cache, budgets
//! and keys: the caller's key scopes the summaries) and come back with the counts:
//! `{"messages", "tokens_before", "tokens_after", "tokens_saved", "compression_ratio",
//! "transforms_applied", "compaction", "reason"}`. OpenAI-shaped and Anthropic-shaped messages
//! are both read. When compaction cannot run the messages come back as they came (200), so
//! the gateway's request is never lost.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::facts::Inbound;
use crate::access_log::RequestLog;
use crate::apis::Api;
use crate::app::Current;
use crate::auth::ClientKey;
use crate::body::{self, ProxyBody};
use crate::compaction::engine::Compacted;
use crate::compaction::scope::Caller;
use crate::config::UpstreamApi;
use crate::error::ProxyError;
use crate::metrics::Route;

#[derive(Deserialize)]
struct CompressRequest<'a> {
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
    #[serde(default)]
    model: Option<String>,
}

/// Anthropic's content block types that chat completions never has: their presence says the
/// messages are Messages API turns.
const ANTHROPIC_BLOCKS: [&str; 4] = [
    r#""tool_use""#,
    r#""tool_result""#,
    r#""thinking""#,
    r#""redacted_thinking""#,
];

/// Whether the messages are Anthropic's (tool calls as `tool_use` blocks) rather than
/// OpenAI's.
fn speaks_messages_api(messages: &[&RawValue]) -> bool {
    messages.iter().any(|message| {
        let raw = message.get();
        ANTHROPIC_BLOCKS.iter().any(|block| raw.contains(block))
    })
}

/// Answers one engine call.
pub(super) async fn answer(
    current: &Current,
    key: Option<&ClientKey>,
    headers: &http::HeaderMap,
    inbound: Inbound,
    caller: Caller<'_>,
    log: &mut RequestLog,
) -> Result<Response<ProxyBody>, ProxyError> {
    log.route = Route::Local;
    let Inbound::Buffered(body) = inbound else {
        return Err(ProxyError::BadRequest(
            "the engine contract takes a JSON body (content-type: application/json)".into(),
        ));
    };
    let request: CompressRequest<'_> = serde_json::from_slice(&body).map_err(|e| {
        ProxyError::BadRequest(format!(
            "the body must be {{\"messages\": [...], \"model\": \"...\"}}: {e}"
        ))
    })?;
    if request.messages.is_empty() {
        return Err(ProxyError::BadRequest("`messages` is empty".into()));
    }
    let model = request.model.unwrap_or_default();
    if let (Some(key), false) = (key, model.is_empty()) {
        if !key.allows_model(&model) {
            return Err(ProxyError::ModelNotAllowed(model));
        }
    }
    log.model = Some(model.clone()).filter(|model| !model.is_empty());
    let messages_api = speaks_messages_api(&request.messages);
    let (api, family) = match messages_api {
        true => (Api::Messages, UpstreamApi::Anthropic),
        false => (Api::ChatCompletions, UpstreamApi::Openai),
    };
    // The messages go on as their bytes, into the body planned and back into the answer: never
    // taken apart into a tree and written again.
    let planned = serde_json::to_vec(&Planned {
        model: &model,
        messages: &request.messages,
    })
    .map_err(|e| ProxyError::Internal(format!("cannot write the planned body: {e}")))?;
    let upstream = current
        .upstreams
        .route(
            Some(&model)
                .filter(|model| !model.is_empty())
                .map(String::as_str),
            family,
        )
        .map(|upstream| upstream.name.clone());
    let compacted = match (&current.generation.compaction, upstream) {
        (Some(engine), Some(upstream)) => {
            let compacted = engine
                .compact(
                    headers,
                    Bytes::from(planned),
                    &upstream,
                    caller,
                    &api.body_request(),
                )
                .await
                .map_err(|refused| {
                    log.compaction = Some(*refused.outcome);
                    ProxyError::CompactionFailed(refused.failure.to_string())
                })?;
            Some(compacted)
        }
        _ => None,
    };
    // The compacted body is the planned one with its messages rewritten: read the same way.
    let compacted_messages = compacted
        .as_ref()
        .and_then(|compacted| serde_json::from_slice::<CompressRequest<'_>>(&compacted.body).ok());
    let messages = match &compacted_messages {
        Some(compacted) => &compacted.messages,
        None => &request.messages,
    };
    let answer = answer_json(messages, compacted.as_ref())
        .map_err(|e| ProxyError::Internal(format!("cannot write the answer: {e}")))?;
    let mut response = Response::new(body::full(Bytes::from(answer)));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(compacted) = compacted {
        compacted.outcome.write_headers(response.headers_mut());
        log.compaction = Some(compacted.outcome);
    }
    Ok(response)
}

/// A chat completions or Messages body as the engine plans it: each message the bytes it came
/// in.
#[derive(Serialize)]
struct Planned<'a> {
    model: &'a str,
    messages: &'a [&'a RawValue],
}

/// The answer a gateway reads: the messages (their bytes) and the counts it logs.
#[derive(Serialize)]
struct Answer<'a> {
    messages: &'a [&'a RawValue],
    tokens_before: u64,
    tokens_after: u64,
    tokens_saved: u64,
    compression_ratio: f64,
    transforms_applied: Vec<&'static str>,
    compaction: &'static str,
    reason: &'static str,
}

fn answer_json(
    messages: &[&RawValue],
    compacted: Option<&Compacted>,
) -> serde_json::Result<Vec<u8>> {
    let outcome = compacted.map(|compacted| &compacted.outcome);
    let (before, after) = outcome
        .and_then(|outcome| outcome.token_counts())
        .unwrap_or((0, 0));
    let ratio = if before == 0 {
        1.0
    } else {
        after as f64 / before as f64
    };
    let transforms: Vec<&'static str> = match outcome.map(|outcome| outcome.kind.label()) {
        Some(kind @ ("summarized" | "reused" | "cleared" | "truncated")) => vec![kind],
        _ => Vec::new(),
    };
    serde_json::to_vec(&Answer {
        messages,
        tokens_before: before,
        tokens_after: after,
        tokens_saved: before.saturating_sub(after),
        compression_ratio: (ratio * 1000.0).round() / 1000.0,
        transforms_applied: transforms,
        compaction: outcome.map_or("skipped", |outcome| outcome.label()),
        reason: outcome.map_or("", |outcome| outcome.reason.label()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_with_anthropics_blocks_are_read_as_the_messages_api() {
        let raw = |text: &str| serde_json::from_str::<Box<RawValue>>(text).unwrap();
        let chat = [raw(r#"{"role":"tool","tool_call_id":"c1","content":"ok"}"#)];
        let anthropic = [raw(
            r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}"#,
        )];
        assert!(!speaks_messages_api(
            &chat.iter().map(AsRef::as_ref).collect::<Vec<_>>()
        ));
        assert!(speaks_messages_api(
            &anthropic.iter().map(AsRef::as_ref).collect::<Vec<_>>()
        ));
    }

    #[test]
    fn the_answer_carries_the_counts_a_gateway_logs() {
        let message =
            serde_json::from_str::<Box<RawValue>>(r#"{"role":"user","content":"hi"}"#).unwrap();
        let answer = answer_json(&[message.as_ref()], None).unwrap();
        let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(answer["tokens_saved"], 0);
        assert_eq!(answer["compression_ratio"], 1.0);
        assert_eq!(answer["compaction"], "skipped");
        assert_eq!(answer["messages"][0]["content"], "hi");
    }
}
