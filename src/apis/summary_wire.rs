//! What a summarizer call needs from the API it speaks; each API's folder implements it for
//! the call its upstreams answer.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

/// How one API asks for a summary and reads the answer.
pub trait SummaryWire: Sync {
    /// The path under the upstream's base URL.
    fn path(&self, model: &str) -> String;

    /// The request body for `prompt`.
    fn payload(&self, model: &str, max_tokens: u64, prompt: &str) -> Value;

    /// The summary in a reply; None when it holds no text.
    fn reply_text(&self, reply: &Value) -> Option<String>;

    /// Headers the call carries besides the credential, from the client's
    /// (`with_client_credential`: the client's own credential goes along).
    fn headers(
        &self,
        _client: &HeaderMap,
        _with_client_credential: bool,
    ) -> Vec<(HeaderName, HeaderValue)> {
        Vec::new()
    }
}
