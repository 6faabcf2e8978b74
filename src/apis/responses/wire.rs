//! A summarizer call on the Responses API (`summarizer_api: responses`).

use serde_json::{json, Value};

use crate::apis::summary_wire::SummaryWire;

pub struct ResponsesWire;

impl SummaryWire for ResponsesWire {
    fn path(&self, _model: &str) -> String {
        "/responses".to_string()
    }

    // Not stored upstream: the summary is compactor's, not a response the user made.
    fn payload(&self, model: &str, max_tokens: u64, prompt: &str) -> Value {
        json!({
            "model": model,
            "input": prompt,
            "max_output_tokens": max_tokens,
            "store": false,
            "stream": false,
        })
    }

    /// The `output_text` parts of the reply's `message` items.
    fn reply_text(&self, reply: &Value) -> Option<String> {
        let text: String = reply
            .get("output")
            .and_then(Value::as_array)?
            .iter()
            .filter(|item| item.get("type").and_then(Value::as_str) == Some("message"))
            .filter_map(|item| item.get("content").and_then(Value::as_array))
            .flatten()
            .filter(|part| part.get("type").and_then(Value::as_str) == Some("output_text"))
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect();
        Some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_the_text_of_its_message_items() {
        let text = |reply: &str| ResponsesWire.reply_text(&serde_json::from_str(reply).unwrap());
        assert_eq!(
            text(r#"{"object":"response","output":[{"type":"reasoning","summary":[]},{"type":"message","content":[{"type":"output_text","text":" s "}]}]}"#).as_deref(),
            Some(" s ")
        );
        assert_eq!(
            text(r#"{"object":"response","output":[]}"#).as_deref(),
            Some("")
        );
        assert_eq!(text(r#"{"choices":[]}"#), None);
    }
}
