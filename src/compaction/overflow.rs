//! An upstream's context-length error, read from its body: whether a response says the request
//! did not fit the model's window, and the numbers it gives. The shapes are the providers' own
//! (collected from their users' reports):
//! - OpenAI and Azure: 400, `error.code: context_length_exceeded`, "This model's maximum context
//!   length is 8192 tokens. However, your messages resulted in 8227 tokens." (or "you requested
//!   4120 tokens (3120 in the messages, 1000 in the completion)"); the Responses API says "Your
//!   input exceeds the context window of this model." with no numbers.
//! - vLLM: 400, `{"object":"error","message":"This model's maximum context length is 32768
//!   tokens. However, you requested 41648 tokens (37552 in the messages, 4096 in the
//!   completion)…","type":"BadRequestError","code":400}`.
//! - OpenRouter: 400, "This endpoint's maximum context length is 32768 tokens. However, you
//!   requested about 42832 tokens (42832 of text input)…".
//! - Anthropic: 400 `invalid_request_error`, "prompt is too long: 219898 tokens > 200000
//!   maximum", or "input length and `max_tokens` exceed context limit: 199759 + 8192 > 200000".
//! - Google (Gemini): 400 `INVALID_ARGUMENT`, "The input token count (1196265) exceeds the
//!   maximum number of tokens allowed (1048575).", or the same without the count.

use serde_json::Value;

/// What a context-length error says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow {
    /// The model's window, when the error states it.
    pub limit: Option<u64>,
    /// The input tokens the provider counted, when the error states them.
    pub input: Option<u64>,
}

/// Statuses a context-length error comes with.
pub fn may_be_overflow(status: u16) -> bool {
    matches!(status, 400 | 413 | 422)
}

/// Phrases (lowercase) only a context-length error uses.
const PHRASES: [&str; 7] = [
    "context length",
    "context_length_exceeded",
    "context window",
    "prompt is too long",
    "exceed context limit",
    "input is too long",
    "exceeds the maximum number of tokens allowed",
];

/// The context-length error in an error response's body, if it is one.
pub fn parse(status: u16, body: &[u8]) -> Option<Overflow> {
    if !may_be_overflow(status) {
        return None;
    }
    let value: Value = serde_json::from_slice(body).ok()?;
    let error = value.get("error").unwrap_or(&value);
    let code = error.get("code").and_then(Value::as_str).unwrap_or("");
    let message = error
        .get("message")
        .or_else(|| value.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_ascii_lowercase();
    let is_overflow =
        code == "context_length_exceeded" || PHRASES.iter().any(|p| message.contains(p));
    is_overflow.then(|| Overflow {
        limit: limit_in(&message),
        input: input_in(&message),
    })
}

fn limit_in(message: &str) -> Option<u64> {
    [
        "maximum context length is",
        "context window of",
        "maximum number of tokens allowed (",
    ]
    .iter()
    .find_map(|marker| number_after(message, marker))
    // Anthropic: "… > 200000 maximum", "… + 8192 > 200000, decrease …".
    .or_else(|| {
        message
            .rfind('>')
            .and_then(|at| number_at(&message[at + 1..]))
    })
}

fn input_in(message: &str) -> Option<u64> {
    // A breakdown names the input part of what was requested.
    let breakdown = message.find('(').and_then(|at| {
        let inside = &message[at + 1..];
        let value = number_at(inside)?;
        ["in the messages", "in your prompt", "of text input"]
            .iter()
            .any(|unit| {
                inside
                    .trim_start_matches(|c: char| c.is_ascii_digit() || c == ',')
                    .trim_start()
                    .starts_with(unit)
            })
            .then_some(value)
    });
    breakdown.or_else(|| {
        [
            "input token count (",
            "resulted in",
            "prompt is too long:",
            "context limit:",
            "your request has",
            "requested about",
            "requested",
        ]
        .iter()
        .find_map(|marker| number_after(message, marker))
    })
}

fn number_after(text: &str, marker: &str) -> Option<u64> {
    let at = text.find(marker)? + marker.len();
    number_at(&text[at..])
}

/// The number at the start of `text` (after blanks and backticks), thousands commas allowed.
fn number_at(text: &str) -> Option<u64> {
    let text = text.trim_start_matches([' ', '`']);
    let digits: String = text
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(body: Value) -> Option<Overflow> {
        parse(400, body.to_string().as_bytes())
    }

    fn numbers(limit: u64, input: u64) -> Option<Overflow> {
        Some(Overflow {
            limit: Some(limit),
            input: Some(input),
        })
    }

    #[test]
    fn every_provider_shape_is_read_with_its_numbers() {
        let openai = json!({"error": {"message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 8227 tokens. Please reduce the length of the messages.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
        assert_eq!(read(openai), numbers(8192, 8227));
        let with_completion = json!({"error": {"message": "This model's maximum context length is 4097 tokens. However, you requested 4120 tokens (3120 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
        assert_eq!(read(with_completion), numbers(4097, 3120));
        let responses = json!({"error": {"message": "Your input exceeds the context window of this model. Please adjust your input and try again.", "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}});
        assert_eq!(
            read(responses),
            Some(Overflow {
                limit: None,
                input: None
            })
        );
        let vllm = json!({"object": "error", "message": "This model's maximum context length is 32768 tokens. However, you requested 41648 tokens (37552 in the messages, 4096 in the completion). Please reduce the length of the messages or completion. None", "type": "BadRequestError", "param": null, "code": 400});
        assert_eq!(read(vllm), numbers(32768, 37552));
        let openrouter = json!({"error": {"message": "This endpoint's maximum context length is 32768 tokens. However, you requested about 42832 tokens (42832 of text input). Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically.", "code": 400}});
        assert_eq!(read(openrouter), numbers(32768, 42832));
        let anthropic = json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 219898 tokens > 200000 maximum"}, "request_id": "req_011CVjxiYzEFcAQC4Fk87zw2"});
        assert_eq!(read(anthropic), numbers(200000, 219898));
        let anthropic_limit = json!({"type": "error", "error": {"type": "invalid_request_error", "message": "input length and `max_tokens` exceed context limit: 199759 + 8192 > 200000, decrease input length or `max_tokens` and try again"}});
        assert_eq!(read(anthropic_limit), numbers(200000, 199759));
        let google = json!({"error": {"code": 400, "message": "The input token count (1196265) exceeds the maximum number of tokens allowed (1048575).", "status": "INVALID_ARGUMENT"}});
        assert_eq!(read(google), numbers(1048575, 1196265));
        let google_without_count = json!({"error": {"code": 400, "message": "The input token count exceeds the maximum number of tokens allowed (1048576).", "status": "INVALID_ARGUMENT"}});
        assert_eq!(
            read(google_without_count),
            Some(Overflow {
                limit: Some(1048576),
                input: None
            })
        );
    }

    #[test]
    fn other_errors_are_not_overflows() {
        let max_tokens = json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: 10000 > 4096, which is the maximum allowed number of output tokens for claude-3-5-sonnet-20240620"}});
        assert_eq!(read(max_tokens), None);
        let invalid = json!({"error": {"message": "Invalid 'messages[2].tool_call_id'", "type": "invalid_request_error", "code": null}});
        assert_eq!(read(invalid), None);
        let overflow = json!({"error": {"message": "maximum context length is 10 tokens", "code": "context_length_exceeded"}});
        assert_eq!(parse(500, overflow.to_string().as_bytes()), None);
        assert_eq!(parse(400, b"not json"), None);
    }
}
