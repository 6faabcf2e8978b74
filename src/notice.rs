//! The `context_compacting` notice in its three wire forms (DESIGN.md §4 and
//! `reference/sse-clients.md`): always written before the upstream's first byte, never inside
//! an upstream event.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::config::NoticeMode;

/// What to announce on a stream whose request was just summarized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub mode: NoticeMode,
    pub message: String,
}

impl Notice {
    /// The notice to write before an upstream's body: only on a 2xx event stream, and not when
    /// switched off.
    pub fn for_response(
        notice: Option<&Notice>,
        status: http::StatusCode,
        headers: &http::HeaderMap,
    ) -> Option<Notice> {
        let is_stream = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        notice
            .filter(|n| status.is_success() && is_stream && n.mode != NoticeMode::Off)
            .cloned()
    }
}

fn payload(message: &str) -> Value {
    json!({"type": "context_compacting", "message": message})
}

/// `: context_compacting {...}` and a blank line: every SDK drops comments, and at the very
/// start of the body no `id:` has been seen yet (openai-python mis-parses comments after one).
pub fn comment(message: &str) -> Bytes {
    Bytes::from(format!(": context_compacting {}\n\n", payload(message)))
}

/// `event: context_compacting` + `data: {...}`, for UIs that dispatch on event names.
pub fn named(message: &str) -> Bytes {
    Bytes::from(format!(
        "event: context_compacting\ndata: {}\n\n",
        payload(message)
    ))
}

/// A `chat.completion.chunk` with `choices: []` carrying the upstream's own id/created/model
/// (copied from its first event), so strict parsers and stream helpers accept it. None when
/// the first event is not a JSON chunk with an id (the caller then falls back to a comment).
pub fn chunk_from_first_event(first_event: &[u8], message: &str) -> Option<Bytes> {
    let text = std::str::from_utf8(first_event).ok()?;
    let data: String = text
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect::<Vec<_>>()
        .join("\n");
    let event: Value = serde_json::from_str(&data).ok()?;
    let id = event.get("id")?.as_str()?;
    let chunk = json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": event.get("created").cloned().unwrap_or(json!(0)),
        "model": event.get("model").cloned().unwrap_or(json!("")),
        "choices": [],
        "context_compacting": payload(message),
    });
    Some(Bytes::from(format!("data: {chunk}\n\n")))
}

/// End (exclusive) of the first complete event in `buffer`: after a blank line in any of the
/// three line-ending styles.
pub fn first_event_end(buffer: &[u8]) -> Option<usize> {
    event_end_from(buffer, 0)
}

/// [`first_event_end`], looking at line ends from `from` on: a reader that found none in the
/// bytes it had resumes at [`resume_at`] of them, so a long event is scanned once, not once
/// per frame that brings more of it.
pub fn event_end_from(buffer: &[u8], from: usize) -> Option<usize> {
    let mut i = from.min(buffer.len());
    while let Some(found) = memchr::memchr2(b'\n', b'\r', &buffer[i..]) {
        let at = i + found;
        match buffer[at] {
            b'\n' if buffer.get(at + 1) == Some(&b'\n') => return Some(at + 2),
            b'\r' if buffer[at + 1..].starts_with(b"\n\r\n") => return Some(at + 4),
            b'\r' if buffer.get(at + 1) == Some(&b'\r') => return Some(at + 2),
            _ => {}
        }
        i = at + 1;
    }
    None
}

/// Where to resume looking for an event's end in `buffered` bytes that hold none: the longest
/// blank-line mark (`\r\n\r\n`) may have begun in their last three bytes.
pub fn resume_at(buffered: usize) -> usize {
    buffered.saturating_sub(3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comment_and_named_forms() {
        assert_eq!(
            comment("hi"),
            ": context_compacting {\"type\":\"context_compacting\",\"message\":\"hi\"}\n\n"
        );
        assert_eq!(
            named("hi"),
            "event: context_compacting\ndata: {\"type\":\"context_compacting\",\"message\":\"hi\"}\n\n"
        );
    }

    #[test]
    fn chunk_copies_the_upstreams_identity() {
        let first = b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":17,\"model\":\"gpt-4o\",\"choices\":[]}\n\n";
        let chunk = chunk_from_first_event(first, "m").unwrap();
        let text = std::str::from_utf8(&chunk).unwrap();
        let value: Value = serde_json::from_str(text.trim_start_matches("data: ").trim()).unwrap();
        assert_eq!(value["id"], "chatcmpl-1");
        assert_eq!(value["created"], 17);
        assert_eq!(value["model"], "gpt-4o");
        assert_eq!(value["choices"], json!([]));
        assert_eq!(value["context_compacting"]["type"], "context_compacting");
        assert!(chunk_from_first_event(b"data: [DONE]\n\n", "m").is_none());
        assert!(chunk_from_first_event(b": ping\n\n", "m").is_none());
    }

    #[test]
    fn event_ends_in_every_line_ending_style() {
        assert_eq!(first_event_end(b"data: a\n\ndata: b\n\n"), Some(9));
        assert_eq!(first_event_end(b"data: a\r\n\r\nrest"), Some(11));
        assert_eq!(first_event_end(b"data: a\r\rrest"), Some(9));
        assert_eq!(first_event_end(b"data: partial\n"), None);
    }
}
