//! A summarizer call on Anthropic's Messages API, for an upstream with `api: anthropic`.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{json, Value};

use crate::apis::summary_wire::SummaryWire;

/// The `anthropic-version` a call sends when the client sent none.
const DEFAULT_VERSION: &str = "2023-06-01";
const VERSION: HeaderName = HeaderName::from_static("anthropic-version");
const BETA: HeaderName = HeaderName::from_static("anthropic-beta");

pub struct MessagesWire;

impl SummaryWire for MessagesWire {
    fn path(&self, _model: &str) -> String {
        "/messages".to_string()
    }

    fn payload(&self, model: &str, max_tokens: u64, prompt: &str) -> Value {
        json!({
            "model": model,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt}],
        })
    }

    /// The `text` blocks of the reply (thinking blocks are not the summary).
    fn reply_text(&self, reply: &Value) -> Option<String> {
        let text: String = reply
            .get("content")
            .and_then(Value::as_array)?
            .iter()
            .filter(|block| block.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|block| block.get("text").and_then(Value::as_str))
            .collect();
        Some(text)
    }

    /// The client's `anthropic-version` (else a default); its `anthropic-beta` only along
    /// with its own credential (an OAuth token needs its beta flag).
    fn headers(
        &self,
        client: &HeaderMap,
        with_client_credential: bool,
    ) -> Vec<(HeaderName, HeaderValue)> {
        let version = client
            .get(VERSION)
            .cloned()
            .unwrap_or(HeaderValue::from_static(DEFAULT_VERSION));
        let mut headers = vec![(VERSION, version)];
        if let Some(beta) = client.get(BETA).filter(|_| with_client_credential) {
            headers.push((BETA, beta.clone()));
        }
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_its_text_blocks_and_the_version_defaults() {
        let reply = r#"{"type":"message","role":"assistant","content":[{"type":"thinking","thinking":"x"},{"type":"text","text":" s "}]}"#;
        let text = MessagesWire.reply_text(&serde_json::from_str(reply).unwrap());
        assert_eq!(text.as_deref(), Some(" s "));
        let mut client = HeaderMap::new();
        client.insert(BETA, HeaderValue::from_static("oauth"));
        assert_eq!(MessagesWire.headers(&client, false).len(), 1);
        let with_credential = MessagesWire.headers(&client, true);
        assert_eq!(with_credential[0].1, DEFAULT_VERSION);
        assert_eq!(with_credential[1].1, "oauth");
    }
}
