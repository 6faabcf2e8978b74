//! Content addressing for the summary cache (DESIGN.md §3): a digest of each message's meaning
//! (role, name, content, tool calls, tool_call_id; not JSON whitespace or key order) and the
//! prefix chain `P[i+1] = H(P[i], digest[i])` that names every prefix of a conversation.
//! 256-bit digests: a collision would splice another conversation's summary in.

use std::borrow::Cow;

use serde_json::Value;

use super::conversation::Message;

pub type Digest = [u8; 32];

/// `chain[i]` names `messages[..i]`; `chain.len() == messages.len() + 1`.
pub fn prefix_chain(messages: &[Message<'_>]) -> Vec<Digest> {
    let mut chain = Vec::with_capacity(messages.len() + 1);
    let mut current = *blake3::hash(b"compactor prefix chain v1").as_bytes();
    chain.push(current);
    for message in messages {
        let mut hasher = blake3::Hasher::new();
        hasher.update(&current);
        hasher.update(&message_digest(message));
        current = *hasher.finalize().as_bytes();
        chain.push(current);
    }
    chain
}

pub fn message_digest(message: &Message<'_>) -> Digest {
    let mut hasher = blake3::Hasher::new();
    field(&mut hasher, b"role", message.role_text.as_bytes());
    if let Some(name) = &message.name {
        field(&mut hasher, b"name", name.as_bytes());
    }
    if let Some(content) = message.content {
        field(&mut hasher, b"content", canonical(content.get()).as_bytes());
    }
    if let Some(refusal) = message.refusal {
        field(&mut hasher, b"refusal", canonical(refusal.get()).as_bytes());
    }
    for call in &message.tool_calls {
        field(&mut hasher, b"call.id", call.id.as_bytes());
        field(&mut hasher, b"call.name", call.name.as_bytes());
        field(&mut hasher, b"call.arguments", call.arguments.as_bytes());
    }
    if let Some(id) = &message.tool_call_id {
        field(&mut hasher, b"tool_call_id", id.as_bytes());
    }
    *hasher.finalize().as_bytes()
}

/// Tag and length prefix, so no two different field sequences hash alike.
fn field(hasher: &mut blake3::Hasher, tag: &[u8], value: &[u8]) {
    hasher.update(&(tag.len() as u64).to_le_bytes());
    hasher.update(tag);
    hasher.update(&(value.len() as u64).to_le_bytes());
    hasher.update(value);
}

/// A string's decoded text, or any other JSON value with sorted keys and no whitespace.
fn canonical(raw: &str) -> Cow<'_, str> {
    if raw.starts_with('"') {
        if let Ok(text) = serde_json::from_str::<Cow<'_, str>>(raw) {
            return text;
        }
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(value) => {
            let mut out = String::with_capacity(raw.len());
            write_canonical(&value, &mut out);
            Cow::Owned(out)
        }
        Err(_) => Cow::Borrowed(raw),
    }
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*key).clone()).to_string());
                out.push(':');
                write_canonical(&map[*key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::conversation::Conversation;

    fn digests(body: &str) -> Vec<Digest> {
        let conversation = Conversation::parse(body.as_bytes()).unwrap();
        conversation.messages.iter().map(message_digest).collect()
    }

    #[test]
    fn whitespace_key_order_and_unknown_fields_do_not_change_the_digest() {
        let a =
            digests(r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#);
        let b = digests(
            r#"{"messages":[ { "content" : [ {"text":"hi", "type":"text"} ], "role":"user", "x":1 } ]}"#,
        );
        assert_eq!(a, b);
    }

    #[test]
    fn meaning_changes_change_the_digest() {
        let base = digests(r#"{"messages":[{"role":"user","content":"hi"}]}"#);
        for other in [
            r#"{"messages":[{"role":"user","content":"hi!"}]}"#,
            r#"{"messages":[{"role":"assistant","content":"hi"}]}"#,
            r#"{"messages":[{"role":"user","content":"hi","name":"bob"}]}"#,
        ] {
            assert_ne!(base, digests(other), "{other}");
        }
    }

    #[test]
    fn chains_share_exactly_their_common_prefix() {
        let one = Conversation::parse(
            br#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}"#,
        )
        .unwrap();
        let two = Conversation::parse(
            br#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"c"}]}"#,
        )
        .unwrap();
        let (c1, c2) = (prefix_chain(&one.messages), prefix_chain(&two.messages));
        assert_eq!(c1.len(), 3);
        assert_eq!(c1[..2], c2[..2]);
        assert_ne!(c1[2], c2[2]);
    }
}
