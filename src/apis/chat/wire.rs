//! A summarizer call as a chat completion.

use serde_json::{json, Value};

use crate::apis::summary_wire::SummaryWire;

pub struct ChatWire;

impl SummaryWire for ChatWire {
    fn path(&self, _model: &str) -> String {
        "/chat/completions".to_string()
    }

    fn payload(&self, model: &str, max_tokens: u64, prompt: &str) -> Value {
        json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": false,
        })
    }

    /// `choices[0].message.content`, a string or text parts.
    fn reply_text(&self, reply: &Value) -> Option<String> {
        match reply.pointer("/choices/0/message/content")? {
            Value::String(text) => Some(text.clone()),
            Value::Array(parts) => Some(
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(""),
            ),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(reply: &str) -> Option<String> {
        ChatWire.reply_text(&serde_json::from_str(reply).unwrap())
    }

    #[test]
    fn a_reply_is_its_first_choices_content_as_a_string_or_text_parts() {
        assert_eq!(
            text(r#"{"choices":[{"message":{"content":"  sum  "}}]}"#).as_deref(),
            Some("  sum  ")
        );
        assert_eq!(
            text(r#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}"#).as_deref(),
            Some("ab")
        );
        assert_eq!(text(r#"{"choices":[]}"#), None);
    }
}
