//! A context window the mock enforces by its own token count (a quarter of the history's JSON
//! length: not compactor's estimate, as no real tokenizer is), answering each provider's real
//! context-length error when a request does not fit. Set per instance
//! ([`crate::MockOptions::window`]) or per request (`x-mock-window: N`), the error's shape by
//! `x-mock-window-style` (default: the path's own provider).

use http::StatusCode;
use serde_json::{json, Value};

/// The providers whose context-length errors the mock speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// OpenAI and Azure chat completions: `code: context_length_exceeded`, with numbers.
    OpenAi,
    /// OpenAI's Responses API: the same code, no numbers.
    Responses,
    /// vLLM's OpenAI server: a top-level `{"object":"error",…}`.
    Vllm,
    /// OpenRouter: "This endpoint's maximum context length is …".
    OpenRouter,
    /// Anthropic's Messages API: "prompt is too long: N tokens > L maximum".
    Anthropic,
}

impl Style {
    pub fn parse(value: &str) -> Option<Style> {
        match value {
            "openai" | "azure" => Some(Style::OpenAi),
            "responses" => Some(Style::Responses),
            "vllm" => Some(Style::Vllm),
            "openrouter" => Some(Style::OpenRouter),
            "anthropic" => Some(Style::Anthropic),
            _ => None,
        }
    }
}

/// The request's input tokens as the mock counts them.
pub fn input_tokens(request: &Value) -> u64 {
    let chars: usize = ["messages", "input", "system", "instructions", "tools"]
        .iter()
        .filter_map(|key| request.get(key))
        .map(|value| value.to_string().len())
        .sum();
    (chars / 4) as u64
}

/// The error for a request over `limit`, or None when it fits.
pub fn check(request: &Value, limit: u64, style: Style) -> Option<(StatusCode, String)> {
    let input = input_tokens(request);
    let output = ["max_completion_tokens", "max_tokens", "max_output_tokens"]
        .iter()
        .find_map(|key| request.get(key).and_then(Value::as_u64))
        .unwrap_or(0);
    let total = input + output;
    if total <= limit {
        return None;
    }
    let body = match style {
        Style::OpenAi => {
            let message = if output > 0 {
                format!("This model's maximum context length is {limit} tokens. However, you requested {total} tokens ({input} in the messages, {output} in the completion). Please reduce the length of the messages or completion.")
            } else {
                format!("This model's maximum context length is {limit} tokens. However, your messages resulted in {input} tokens. Please reduce the length of the messages.")
            };
            json!({"error": {"message": message, "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
        }
        Style::Responses => {
            json!({"error": {"message": "Your input exceeds the context window of this model. Please adjust your input and try again.", "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}})
        }
        Style::Vllm => {
            json!({"object": "error", "message": format!("This model's maximum context length is {limit} tokens. However, you requested {total} tokens ({input} in the messages, {output} in the completion). Please reduce the length of the messages or completion. None"), "type": "BadRequestError", "param": null, "code": 400})
        }
        Style::OpenRouter => {
            json!({"error": {"message": format!("This endpoint's maximum context length is {limit} tokens. However, you requested about {total} tokens ({input} of text input, {output} in the output). Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically."), "code": 400}})
        }
        Style::Anthropic => {
            let message = if input > limit {
                format!("prompt is too long: {input} tokens > {limit} maximum")
            } else {
                format!("input length and `max_tokens` exceed context limit: {input} + {output} > {limit}, decrease input length or `max_tokens` and try again")
            };
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}, "request_id": "req_mock_window"})
        }
    };
    Some((StatusCode::BAD_REQUEST, body.to_string()))
}
