//! A summarizer call as Gemini's `generateContent`, for a summarizer upstream with
//! `api: gemini`.

use serde_json::{json, Value};

use crate::apis::summary_wire::SummaryWire;

pub struct GeminiWire;

impl SummaryWire for GeminiWire {
    fn path(&self, model: &str) -> String {
        format!("/v1beta/models/{model}:generateContent")
    }

    fn payload(&self, _model: &str, max_tokens: u64, prompt: &str) -> Value {
        json!({
            "contents": [{"role": "user", "parts": [{"text": prompt}]}],
            "generationConfig": {"maxOutputTokens": max_tokens},
        })
    }

    /// The text parts of the first candidate, thoughts left out.
    fn reply_text(&self, reply: &Value) -> Option<String> {
        let text: String = reply
            .pointer("/candidates/0/content/parts")?
            .as_array()?
            .iter()
            .filter(|part| part.get("thought").and_then(Value::as_bool) != Some(true))
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect();
        Some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_the_first_candidates_text_without_its_thoughts() {
        let reply = json!({"candidates": [{"content": {"role": "model", "parts": [
            {"text": "thinking...", "thought": true}, {"text": " the summary "}]}}]});
        assert_eq!(
            GeminiWire.reply_text(&reply).as_deref(),
            Some(" the summary ")
        );
        assert_eq!(GeminiWire.reply_text(&json!({"candidates": []})), None);
        assert_eq!(
            GeminiWire.path("gemini-2.5-flash"),
            "/v1beta/models/gemini-2.5-flash:generateContent"
        );
    }
}
