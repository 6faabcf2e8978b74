//! Content addressing for the summary cache (DESIGN.md §3): a digest of each message's meaning
//! (role, name, content, tool calls, tool_call_id; not JSON whitespace or key order) and the
//! prefix chain `P[i+1] = H(P[i], digest[i])` that names every prefix of a conversation.
//! 256-bit digests (SHA-256): a collision would splice another conversation's summary in.

use std::borrow::Cow;

use crate::compaction::planner::conversation::Message;
use crate::compaction::planner::json_escape::{decode_escape, Escaped};

pub type Digest = [u8; 32];

/// `chain[i]` names `messages[..i]` within the scope `seed`; `chain.len() == messages.len() + 1`.
pub fn prefix_chain(messages: &[Message<'_>], seed: Digest) -> Vec<Digest> {
    use sha2::Digest as _;
    let mut chain = Vec::with_capacity(messages.len() + 1);
    let mut hasher = Sha256::new();
    hasher.update(b"compactor prefix chain v1");
    hasher.update(seed);
    let mut current: Digest = hasher.finalize().into();
    chain.push(current);
    let mut scratch = Vec::new();
    for message in messages {
        let mut hasher = Sha256::new();
        hasher.update(current);
        write_fields(message, &mut hasher, &mut scratch);
        current = hasher.finalize().into();
        chain.push(current);
    }
    chain
}

/// A digest of one message's meaning (the same fields the chain links hash).
pub fn message_digest(message: &Message<'_>) -> Digest {
    use sha2::Digest as _;
    let mut hasher = Sha256::new();
    write_fields(message, &mut hasher, &mut Vec::new());
    hasher.finalize().into()
}

/// SHA-256: on CPUs with SHA extensions (most x86-64 servers since 2017, ARMv8) it runs at
/// 1.5–2 GB/s on the short inputs a message makes, where BLAKE3 cannot use its SIMD lanes.
type Sha256 = sha2::Sha256;

/// SHA-256 over several parts, each length-prefixed so different splits never collide.
pub fn hash_parts<'p>(parts: impl IntoIterator<Item = &'p [u8]>) -> Digest {
    use sha2::Digest as _;
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

/// Hashes the message's meaningful fields, each framed as tag length, tag, value length, value,
/// so no two different field sequences produce the same bytes. Values are hashed from the
/// request's own bytes; only a string with escapes is decoded, into `scratch`.
fn write_fields(message: &Message<'_>, hasher: &mut Sha256, scratch: &mut Vec<u8>) {
    field(hasher, b"role", message.role_text.as_bytes());
    if let Some(name) = &message.name {
        field(hasher, b"name", name.as_bytes());
    }
    if let Some(content) = message.content {
        field(hasher, b"content", &json_meaning(content.get(), scratch));
    }
    if let Some(refusal) = message.refusal {
        field(hasher, b"refusal", &json_meaning(refusal.get(), scratch));
    }
    for call in &message.tool_calls {
        field(hasher, b"call.id", call.id.as_bytes());
        field(hasher, b"call.name", call.name.as_bytes());
        match call.arguments_raw {
            Some(raw) => field(hasher, b"call.arguments", &json_meaning(raw.get(), scratch)),
            None => field(hasher, b"call.arguments", b""),
        }
    }
    if let Some(id) = &message.tool_call_id {
        field(hasher, b"tool_call_id", id.as_bytes());
    }
    // Opaque items (reasoning with its encrypted content, built-in tool items) come back from
    // the provider and are resent as received: their bytes are hashed as they are, since a
    // canonical form would parse and re-serialize the largest items of the request. A client
    // that re-formats them only costs itself a cache miss.
    if let Some(opaque) = message.opaque {
        field(hasher, b"opaque", opaque.get().as_bytes());
    }
}

fn field(hasher: &mut Sha256, tag: &[u8], value: &[u8]) {
    use sha2::Digest as _;
    hasher.update((tag.len() as u64).to_le_bytes());
    hasher.update(tag);
    hasher.update((value.len() as u64).to_le_bytes());
    hasher.update(value);
}

/// A JSON value's meaning: a string's decoded text, any other value with sorted keys and no
/// whitespace.
fn json_meaning<'a>(raw: &'a str, scratch: &'a mut Vec<u8>) -> Cow<'a, [u8]> {
    if raw.starts_with('"') && raw.len() >= 2 {
        let body = &raw[1..raw.len() - 1];
        if memchr::memchr(b'\\', body.as_bytes()).is_none() {
            return Cow::Borrowed(body.as_bytes());
        }
        scratch.clear();
        decode_string_into(body, scratch);
        Cow::Borrowed(scratch.as_slice())
    } else {
        match canonical(raw) {
            Cow::Borrowed(text) => Cow::Borrowed(text.as_bytes()),
            Cow::Owned(text) => Cow::Owned(text.into_bytes()),
        }
    }
}

/// Appends the decoded text of a JSON string body (without quotes) to `out`.
fn decode_string_into(body: &str, out: &mut Vec<u8>) {
    let bytes = body.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while let Some(offset) = memchr::memchr(b'\\', &bytes[i..]) {
        i += offset;
        out.extend_from_slice(&bytes[start..i]);
        let (decoded, used) = decode_escape(body, i);
        match decoded {
            Escaped::Char(c) => out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes()),
            // A lone surrogate has no UTF-8 form; its WTF-8 bytes keep it apart from U+FFFD.
            Escaped::LoneSurrogate(code) => out.extend_from_slice(&[
                0xE0 | (code >> 12) as u8,
                0x80 | ((code >> 6) & 0x3F) as u8,
                0x80 | (code & 0x3F) as u8,
            ]),
        }
        i += used;
        start = i;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Any JSON value with sorted keys and no whitespace (strings decoded), written in the one
/// serde pass that reads it: no document tree is built (block content, the bulk of an agent's
/// history, would otherwise allocate every string it holds).
fn canonical(raw: &str) -> Cow<'_, str> {
    use serde::de::DeserializeSeed as _;
    let mut out = Vec::with_capacity(raw.len());
    let mut deserializer = serde_json::Deserializer::from_str(raw);
    let written = Canonical(&mut out)
        .deserialize(&mut deserializer)
        .and_then(|()| deserializer.end());
    match (written, String::from_utf8(out)) {
        (Ok(()), Ok(text)) => Cow::Owned(text),
        _ => Cow::Borrowed(raw),
    }
}

/// Writes the canonical form of the value it deserializes into its buffer.
struct Canonical<'o>(&'o mut Vec<u8>);

impl<'de> serde::de::DeserializeSeed<'de> for Canonical<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Canonical<'_> {
    fn scalar<T: serde::Serialize, E: serde::de::Error>(self, value: T) -> Result<(), E> {
        serde_json::to_writer(&mut *self.0, &value).map_err(E::custom)
    }
}

impl<'de> serde::de::Visitor<'de> for Canonical<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<(), E> {
        self.scalar(v)
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        self.scalar(v)
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        self.scalar(v)
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        // As serde_json's `Value` prints it: a non-finite number is null.
        match serde_json::Number::from_f64(v) {
            Some(number) => self.scalar(number),
            None => self.scalar(()),
        }
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        self.scalar(v)
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.scalar(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.push(b'[');
        let mut first = true;
        loop {
            let mark = self.0.len();
            if !first {
                self.0.push(b',');
            }
            if seq.next_element_seed(Canonical(&mut *self.0))?.is_none() {
                self.0.truncate(mark);
                break;
            }
            first = false;
        }
        self.0.push(b']');
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // Values are written to one scratch buffer as they come, then emitted by sorted key.
        let mut values = Vec::new();
        let mut members: Vec<(Cow<'de, str>, std::ops::Range<usize>)> = Vec::new();
        while let Some(crate::compaction::planner::raw_json::MemberKey(key)) = map.next_key()? {
            let start = values.len();
            map.next_value_seed(Canonical(&mut values))?;
            members.push((key, start..values.len()));
        }
        members.sort_by(|a, b| a.0.cmp(&b.0));
        self.0.push(b'{');
        for (i, (key, range)) in members.iter().enumerate() {
            if i > 0 {
                self.0.push(b',');
            }
            serde_json::to_writer(&mut *self.0, key.as_ref()).map_err(serde::de::Error::custom)?;
            self.0.push(b':');
            self.0.extend_from_slice(&values[range.clone()]);
        }
        self.0.push(b'}');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::chat;

    fn digests(body: &str) -> Vec<Digest> {
        let conversation = chat::parse(body.as_bytes()).unwrap();
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
    fn escaped_and_literal_forms_of_the_same_text_agree() {
        let a = digests(
            r#"{"messages":[{"role":"user","content":"caf\u00e9 \ud83d\ude00\n\"q\" \/"}]}"#,
        );
        let b =
            digests("{\"messages\":[{\"role\":\"user\",\"content\":\"café 😀\\n\\\"q\\\" /\"}]}");
        assert_eq!(a, b);
    }

    #[test]
    fn a_lone_surrogate_is_not_the_replacement_character() {
        let lone = digests(r#"{"messages":[{"role":"user","content":"a\ud800b"}]}"#);
        let replaced = digests(r#"{"messages":[{"role":"user","content":"a\ufffdb"}]}"#);
        let literal = digests("{\"messages\":[{\"role\":\"user\",\"content\":\"a\u{fffd}b\"}]}");
        assert_ne!(lone, replaced);
        assert_eq!(replaced, literal);
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

    /// The document-tree form the streaming writer replaced: both must agree byte for byte.
    fn canonical_by_tree(raw: &str) -> String {
        fn write(value: &serde_json::Value, out: &mut String) {
            match value {
                serde_json::Value::Object(map) => {
                    let mut keys: Vec<&String> = map.keys().collect();
                    keys.sort();
                    out.push('{');
                    for (i, key) in keys.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(&serde_json::Value::String((*key).clone()).to_string());
                        out.push(':');
                        write(&map[*key], out);
                    }
                    out.push('}');
                }
                serde_json::Value::Array(items) => {
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        write(item, out);
                    }
                    out.push(']');
                }
                other => out.push_str(&other.to_string()),
            }
        }
        let mut out = String::new();
        write(&serde_json::from_str(raw).unwrap(), &mut out);
        out
    }

    proptest::proptest! {
        #[test]
        fn the_streaming_canonical_form_is_the_tree_form(
            value in {
                use proptest::prelude::*;
                let leaf = prop_oneof![
                    Just(serde_json::Value::Null),
                    any::<bool>().prop_map(serde_json::Value::from),
                    any::<i64>().prop_map(serde_json::Value::from),
                    any::<u64>().prop_map(serde_json::Value::from),
                    (-1e6f64..1e6).prop_map(serde_json::Value::from),
                    "(\\PC|[\"\\\\/\n\t\u{1}é😀]){0,12}".prop_map(serde_json::Value::from),
                ];
                leaf.prop_recursive(4, 40, 6, |inner| prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                    proptest::collection::vec(("[a-z\"é]{0,4}", inner), 0..6)
                        .prop_map(|members| serde_json::Value::Object(members.into_iter().collect())),
                ])
            },
            pretty in proptest::prelude::any::<bool>(),
        ) {
            let raw = if pretty {
                serde_json::to_string_pretty(&value).unwrap()
            } else {
                serde_json::to_string(&value).unwrap()
            };
            let (streamed, tree) = (canonical(&raw).into_owned(), canonical_by_tree(&raw));
            proptest::prop_assert_eq!(streamed, tree);
        }
    }

    #[test]
    fn chains_share_exactly_their_common_prefix() {
        let one = chat::parse(
            br#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}"#,
        )
        .unwrap();
        let two = chat::parse(
            br#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"c"}]}"#,
        )
        .unwrap();
        let (c1, c2) = (
            prefix_chain(&one.messages, [0; 32]),
            prefix_chain(&two.messages, [0; 32]),
        );
        assert_eq!(c1.len(), 3);
        assert_eq!(c1[..2], c2[..2]);
        assert_ne!(c1[2], c2[2]);
    }
}
