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
    /// Google's Gemini API: "The input token count (N) exceeds the maximum number of tokens
    /// allowed (L)."
    Google,
}

impl Style {
    pub fn parse(value: &str) -> Option<Style> {
        match value {
            "openai" | "azure" => Some(Style::OpenAi),
            "responses" => Some(Style::Responses),
            "vllm" => Some(Style::Vllm),
            "openrouter" => Some(Style::OpenRouter),
            "anthropic" => Some(Style::Anthropic),
            "google" | "gemini" => Some(Style::Google),
            _ => None,
        }
    }
}

/// How the mock counts a request's input: a quarter of its JSON length by default, or with a
/// real tokenizer (OpenAI's `o200k_base` or `cl100k_base`) as a model server does, each string
/// of the request tokenized and each message framed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Counting {
    #[default]
    Quarter,
    O200k,
    Cl100k,
}

/// Tokens a chat template adds per message (role markers and separators), and once for the
/// reply's priming, as OpenAI's cookbook counts them.
const TEMPLATE_PER_MESSAGE: u64 = 4;
const TEMPLATE_PRIMING: u64 = 3;

impl Counting {
    pub fn parse(value: &str) -> Option<Counting> {
        match value {
            "quarter" => Some(Counting::Quarter),
            "o200k" | "o200k_base" => Some(Counting::O200k),
            "cl100k" | "cl100k_base" => Some(Counting::Cl100k),
            _ => None,
        }
    }

    /// The request's input tokens.
    pub fn input_tokens(self, request: &Value) -> u64 {
        let tokenizer = match self {
            Counting::Quarter => return input_tokens(request),
            Counting::O200k => bpe_openai::o200k_base(),
            Counting::Cl100k => bpe_openai::cl100k_base(),
        };
        let strings = |value: &Value| strings_tokens(value, tokenizer);
        let mut total = TEMPLATE_PRIMING;
        for key in ["messages", "input", "contents"] {
            match request.get(key) {
                Some(Value::Array(items)) => {
                    for item in items {
                        total += TEMPLATE_PER_MESSAGE + strings(item);
                    }
                }
                Some(other) => total += TEMPLATE_PER_MESSAGE + strings(other),
                None => {}
            }
        }
        for key in ["system", "instructions", "systemInstruction"] {
            if let Some(value) = request.get(key) {
                total += TEMPLATE_PER_MESSAGE + strings(value);
            }
        }
        if let Some(tools) = request.get("tools") {
            total += tokenizer.count(tools.to_string().as_str()) as u64;
        }
        total
    }
}

/// Tokens of every string and scalar in a value (keys are the template's, not counted).
fn strings_tokens(value: &Value, tokenizer: &bpe_openai::Tokenizer) -> u64 {
    match value {
        Value::String(text) => tokenizer.count(text.as_str()) as u64,
        Value::Array(items) => items.iter().map(|v| strings_tokens(v, tokenizer)).sum(),
        Value::Object(members) => members.values().map(|v| strings_tokens(v, tokenizer)).sum(),
        Value::Null => 0,
        scalar => tokenizer.count(scalar.to_string().as_str()) as u64,
    }
}

/// The request's input tokens as the mock counts them by default.
pub fn input_tokens(request: &Value) -> u64 {
    let chars: usize = [
        "messages",
        "input",
        "system",
        "instructions",
        "tools",
        "contents",
        "systemInstruction",
    ]
    .iter()
    .filter_map(|key| request.get(key))
    .map(|value| value.to_string().len())
    .sum();
    (chars / 4) as u64
}

/// The error for a request over `limit`, or None when it fits.
pub fn check(
    request: &Value,
    limit: u64,
    style: Style,
    counting: Counting,
) -> Option<(StatusCode, String)> {
    let input = counting.input_tokens(request);
    let output = ["max_completion_tokens", "max_tokens", "max_output_tokens"]
        .iter()
        .find_map(|key| request.get(key).and_then(Value::as_u64))
        .or_else(|| {
            request
                .pointer("/generationConfig/maxOutputTokens")
                .and_then(Value::as_u64)
        })
        .unwrap_or(0);
    // Google's window is the input's alone: the answer has a limit of its own.
    let total = if style == Style::Google {
        input
    } else {
        input + output
    };
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
        Style::Google => {
            json!({"error": {"code": 400, "message": format!("The input token count ({input}) exceeds the maximum number of tokens allowed ({limit})."), "status": "INVALID_ARGUMENT"}})
        }
    };
    Some((StatusCode::BAD_REQUEST, body.to_string()))
}
