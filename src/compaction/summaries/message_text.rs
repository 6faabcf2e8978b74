//! What the summarizer is shown of one message: its text parts, a placeholder for each image
//! or file, its tool calls as call lines, base64 payloads replaced; JSON string text decoded
//! even where it holds a lone surrogate.

use std::borrow::Cow;

use serde_json::value::RawValue;

use crate::compaction::planner::conversation::{
    Conversation, Dialect, Message, PartKind, PartView,
};
use crate::compaction::planner::json_escape::{decode_escape, Escaped};

/// The call lines of the calls `message` answers that none of the messages shown made (their
/// ids: `made_here`), found in the whole conversation; None when every call it answers is
/// shown (or it answers none).
pub(super) fn calls_elsewhere(
    conversation: &Conversation<'_>,
    made_here: &std::collections::HashSet<&str>,
    message: &Message<'_>,
) -> Option<String> {
    let lines: Vec<String> = message
        .answers()
        .filter(|id| !made_here.contains(id))
        .filter_map(|id| {
            conversation
                .messages
                .iter()
                .flat_map(|m| &m.tool_calls)
                .find(|call| call.id == id)
        })
        .map(|call| call_line(call))
        .collect();
    (!lines.is_empty()).then(|| without_payloads(&lines.join("\n")))
}

pub(super) fn call_line(call: &crate::compaction::planner::conversation::ToolCall<'_>) -> String {
    format!("→ calls {}({}) [{}]", call.name, call.arguments(), call.id)
}

/// A message's text, its tool calls, base64 payloads replaced by placeholders.
pub(crate) fn message_body(message: &Message<'_>) -> String {
    let mut body = content_text(message);
    for call in &message.tool_calls {
        if !body.is_empty() {
            body.push('\n');
        }
        body.push_str(&call_line(call));
    }
    without_payloads(&body)
}

/// `text` with its base64 payloads, with or without a `data:` header, replaced by placeholders.
pub fn without_payloads(text: &str) -> String {
    let headed = strip_base64(text);
    strip_raw_base64(&headed).into_owned()
}

pub(super) fn content_text(message: &Message<'_>) -> String {
    let mut out = String::new();
    for raw in [message.content, message.refusal].into_iter().flatten() {
        if let Some(text) = json_text(raw.get()) {
            out.push_str(&text);
            continue;
        }
        let parts: Vec<&RawValue> = serde_json::from_str(raw.get()).unwrap_or_default();
        for raw in parts {
            let Some(piece) = part_text(raw.get(), message.dialect) else {
                continue;
            };
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&piece);
        }
    }
    out
}

/// What the summarizer is shown of one content part (`raw`), by what its API says it is; None
/// for parts it never sees: a call inside the content (listed with the message's calls) and
/// reasoning, which is opaque.
pub(super) fn part_text(raw: &str, dialect: &dyn Dialect) -> Option<String> {
    let Ok(part) = serde_json::from_str::<PartView<'_>>(raw) else {
        return json_text(raw).map(Cow::into_owned);
    };
    let text_of = |raw: Option<&RawValue>| -> String {
        raw.and_then(|r| json_text(r.get()))
            .map(Cow::into_owned)
            .unwrap_or_default()
    };
    let kind = part.kind.as_deref().unwrap_or("");
    let part_kind = dialect
        .kind_of(&part, raw)
        .unwrap_or_else(|| dialect.part_kind(kind));
    Some(match part_kind {
        PartKind::Text => text_of(part.text),
        PartKind::Refusal => text_of(part.refusal),
        PartKind::Image => image_text(&part),
        PartKind::File => {
            let file: Option<serde_json::Value> =
                part.file.and_then(|r| serde_json::from_str(r.get()).ok());
            match file.as_ref().and_then(|f| f.get("filename")?.as_str()) {
                Some(name) => format!("[file: {name}]"),
                None => "[file]".to_string(),
            }
        }
        PartKind::Document => "[document]".to_string(),
        PartKind::Audio => "[audio]".to_string(),
        PartKind::ToolCall | PartKind::Reasoning => return None,
        PartKind::ToolResult => {
            if let Some(shown) = dialect.result_shown(raw) {
                return Some(shown);
            }
            let id = part.tool_use_id.as_deref().unwrap_or("");
            let result = match part.content {
                Some(raw) if raw.get().starts_with('[') => {
                    let nested: Vec<&RawValue> =
                        serde_json::from_str(raw.get()).unwrap_or_default();
                    nested
                        .iter()
                        .filter_map(|part| part_text(part.get(), dialect))
                        .collect::<Vec<_>>()
                        .join("\n")
                }
                raw => text_of(raw),
            };
            format!("← result [{id}]: {result}")
        }
        PartKind::Opaque if kind.is_empty() => "[part]".to_string(),
        PartKind::Opaque => format!("[{kind} part]"),
    })
}

/// An image part: its URL when it has one that is not inline data, else a placeholder.
fn image_text(part: &PartView<'_>) -> String {
    let url: Option<serde_json::Value> = part
        .image_url
        .and_then(|r| serde_json::from_str(r.get()).ok());
    let url = url
        .as_ref()
        .and_then(|v| v.get("url").or(Some(v)))
        .and_then(|v| v.as_str())
        .unwrap_or("");
    if url.starts_with("data:") || url.is_empty() {
        "[image]".to_string()
    } else {
        format!("[image: {url}]")
    }
}

/// A JSON string literal's text. A lone surrogate escape (valid JSON, not valid Unicode) is kept
/// as its escape text rather than losing the whole string.
pub fn json_text(raw: &str) -> Option<Cow<'_, str>> {
    if let Ok(text) = serde_json::from_str::<Cow<'_, str>>(raw) {
        return Some(text);
    }
    let body = raw.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(body.len());
    let mut i = 0;
    while let Some(offset) = body[i..].find('\\') {
        out.push_str(&body[i..i + offset]);
        i += offset;
        let (escaped, used) = decode_escape(body, i);
        match escaped {
            Escaped::Char(c) => out.push(c),
            Escaped::LoneSurrogate(_) => out.push_str(body.get(i..i + used)?),
        }
        i += used;
    }
    out.push_str(&body[i..]);
    Some(Cow::Owned(out))
}

/// Replaces `data:<mime>;base64,<payload>` runs with a placeholder: the summarizer gains nothing
/// from them and they would eat its whole budget.
pub fn strip_base64(text: &str) -> Cow<'_, str> {
    if !text.contains(";base64,") {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("data:") {
        let candidate = &rest[pos..];
        let header_end = candidate
            .find(|c: char| c.is_whitespace() || c == '"' || c == ')')
            .unwrap_or(candidate.len());
        let header = &candidate[..header_end];
        match header.find(";base64,") {
            Some(marker) => {
                out.push_str(&rest[..pos]);
                let mime = &header[5..marker];
                let payload = header.len() - marker - 8;
                out.push_str(&format!("[base64 {mime} data, {payload} chars omitted]"));
                rest = &candidate[header_end..];
            }
            None => {
                // No payload up to the header's end, so none for any `data:` inside it either:
                // skip it whole (rescanning from each `data:` was quadratic).
                out.push_str(&rest[..pos + header_end]);
                rest = &candidate[header_end..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// A run of base64 with no `data:` header (an MCP tool's image, a file dumped as base64) is
/// replaced from this many characters on; shorter runs (ids, hashes, keys) stay.
const RAW_BASE64_MIN: usize = 256;
/// A line break continues a run when the line before it is at least this long (MIME and PEM
/// wrap at 64 or 76).
const RAW_BASE64_MIN_LINE: usize = 40;

pub(super) fn is_base64_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'+' | b'/' | b'=' | b'-' | b'_')
}

/// Replaces long runs of base64 that carry no `data:` header with a placeholder. A run must mix
/// upper case, lower case and digits, so long hex digests, numbers and words are not taken for
/// one; single line breaks between long lines belong to the run.
pub fn strip_raw_base64(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let mut out: Option<String> = None;
    let (mut copied, mut i) = (0, 0);
    while i < bytes.len() {
        if !is_base64_byte(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        let (mut chars, mut line) = (0usize, 0usize);
        let (mut upper, mut lower, mut digit) = (false, false, false);
        loop {
            while i < bytes.len() && is_base64_byte(bytes[i]) {
                upper |= bytes[i].is_ascii_uppercase();
                lower |= bytes[i].is_ascii_lowercase();
                digit |= bytes[i].is_ascii_digit();
                chars += 1;
                line += 1;
                i += 1;
            }
            let after_break = match &bytes[i..] {
                [b'\r', b'\n', ..] => i + 2,
                [b'\n', ..] => i + 1,
                _ => i,
            };
            let continues = after_break > i
                && line >= RAW_BASE64_MIN_LINE
                && bytes.get(after_break).copied().is_some_and(is_base64_byte);
            if !continues {
                break;
            }
            i = after_break;
            line = 0;
        }
        if chars >= RAW_BASE64_MIN && upper && lower && digit {
            let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
            out.push_str(&text[copied..start]);
            out.push_str(&format!("[base64 data, {chars} chars omitted]"));
            copied = i;
        }
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut out) => {
            out.push_str(&text[copied..]);
            Cow::Owned(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::{chat, messages, responses};

    fn shown(dialect: &dyn Dialect, raw: &str) -> String {
        content_text(&dialect.parse_message(raw).expect("a message"))
    }

    #[test]
    fn each_api_names_its_own_parts_and_a_typeless_part_is_shown_as_a_part() {
        let chat_parts = r#"{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"https://x/cat.png"}},{"type":"input_image","image_url":"https://x/dog.png"},{"text":"no type"}]}"#;
        assert_eq!(
            shown(&chat::Chat, chat_parts),
            "look\n[image: https://x/cat.png]\n[input_image part]\n[part]"
        );
        let anthropic = r#"{"role":"user","content":[{"type":"thinking","thinking":"hmm"},{"type":"image","source":{"type":"base64","data":"AAAA"}},{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"ok"}]}]}"#;
        assert_eq!(
            shown(&messages::Messages, anthropic),
            "[image]\n← result [t1]: ok"
        );
        let item = r#"{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_file","file_id":"f1"}]}"#;
        assert_eq!(shown(&responses::Responses, item), "hi\n[file]");
    }
}
