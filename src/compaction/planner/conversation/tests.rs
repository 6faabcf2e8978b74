use super::*;
use crate::apis::chat;

fn tokens_of(message: serde_json::Value, cpt: f64) -> u64 {
    let raw = serde_json::to_string(&message).unwrap();
    let model = TokenModel {
        chars_per_token: cpt,
        ..TokenModel::default()
    };
    chat::parse_message(&raw).unwrap().tokens(&model)
}

#[test]
fn token_vectors_from_the_issue() {
    use serde_json::json;
    assert_eq!(
        tokens_of(json!({"role": "user", "content": "Hello"}), 4.0),
        6
    );
    assert_eq!(
        tokens_of(json!({"role": "assistant", "content": "Hi"}), 4.0),
        6
    );
    assert_eq!(
        tokens_of(
            json!({"role": "system", "content": "You are helpful."}),
            4.0
        ),
        9
    );
    assert_eq!(tokens_of(json!({"role": "user", "content": ""}), 4.0), 4);
    assert_eq!(
        tokens_of(
            json!({"role": "user", "content": "Hello", "name": "alice"}),
            4.0
        ),
        7
    );
    assert_eq!(
        tokens_of(
            json!({"role": "tool", "content": "72F and sunny", "tool_call_id": "call_123"}),
            4.0
        ),
        10
    );
    assert_eq!(
        tokens_of(
            json!({"role": "user", "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}),
            4.0
        ),
        95
    );
    assert_eq!(
        tokens_of(json!({"role": "user", "content": "a".repeat(12)}), 4.0),
        7
    );
    assert_eq!(
        tokens_of(json!({"role": "user", "content": "a".repeat(12)}), 3.3),
        8
    );
    assert_eq!(
        tokens_of(
            json!({"role": "user", "content": "你好世界".repeat(25)}),
            4.0
        ),
        104
    );
}

#[test]
fn parses_without_copying_and_finds_the_messages_span() {
    let body = br#"{"model":"gpt-4o", "messages" : [{"role":"user","content":"hi","x_unknown":{"a":1}}], "temperature":0.2}"#;
    let conversation = chat::parse(body).unwrap();
    assert_eq!(conversation.model.as_deref(), Some("gpt-4o"));
    let span = &body[conversation.messages_span.clone()];
    assert_eq!(
        span,
        br#"[{"role":"user","content":"hi","x_unknown":{"a":1}}]"#
    );
    assert_eq!(
        conversation.messages[0].raw.get(),
        r#"{"role":"user","content":"hi","x_unknown":{"a":1}}"#
    );
}

#[test]
fn rejects_non_chat_bodies() {
    assert!(chat::parse(b"nope").is_err());
    assert!(chat::parse(br#"{"model":"x"}"#).is_err());
    assert!(chat::parse(br#"{"messages":{}}"#).is_err());
    assert!(chat::parse(br#"{"messages":[{"content":"no role"}]}"#).is_err());
    assert!(chat::parse(br#"{"messages":[1]}"#).is_err());
}

#[test]
fn tool_calls_and_legacy_fields_are_read() {
    let body = br#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}],"max_tokens":50,"max_completion_tokens":70}"#;
    let conversation = chat::parse(body).unwrap();
    let call = &conversation.messages[0].tool_calls[0];
    assert_eq!(
        (
            call.id.as_ref(),
            call.name.as_ref(),
            call.arguments().as_ref()
        ),
        ("c1", "f", "{\"a\":1}")
    );
    assert!(conversation.messages[0].has_tool_calls());
    assert_eq!(conversation.messages[1].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(conversation.output_reserve, 70);
}

mod scanner_agrees_with_serde {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            ".{0,20}",
            Just("quote \" backslash \\ slash / tab \t".to_string()),
            Just("{\"not\": [\"json]\"}".to_string()),
            Just("你好 😀 é".to_string()),
        ]
    }

    fn message() -> impl Strategy<Value = Value> {
        (
                prop_oneof![Just("user"), Just("assistant"), Just("tool"), Just("system")],
                prop::option::of(text()),
                prop::option::of(text()),
                prop::option::of(text()),
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
            )
                .prop_map(|(role, content, name, id, parts, extra, odd_first_key)| {
                    // A first key with escaped quotes and backslashes: the object's start is
                    // found by walking back over it.
                    let mut m = if odd_first_key {
                        json!({"k\"e\\y\\\"": [1], "role": role})
                    } else {
                        json!({"role": role})
                    };
                    if let Some(content) = content {
                        m["content"] = if parts {
                            json!([{"type": "text", "text": content}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}])
                        } else {
                            json!(content)
                        };
                    }
                    if let Some(name) = name {
                        m["name"] = json!(name);
                    }
                    if let Some(id) = id {
                        m["tool_call_id"] = json!(id);
                    }
                    if extra {
                        m["x_extra"] = json!({"nested": ["}", "]", {"role": "fake"}]});
                    }
                    m
                })
    }

    #[derive(Deserialize)]
    struct RawMessages<'a> {
        #[serde(borrow)]
        messages: Vec<&'a RawValue>,
    }

    proptest! {
        #[test]
        fn one_pass_reader_agrees_with_serde_on_every_message_span(
            messages in prop::collection::vec(message(), 1..6),
            pretty in any::<bool>(),
        ) {
            let body = json!({"model": "m", "messages": messages, "temperature": 0.5});
            let text = if pretty {
                serde_json::to_string_pretty(&body).unwrap()
            } else {
                serde_json::to_string(&body).unwrap()
            };
            let conversation = chat::parse(text.as_bytes()).unwrap();
            let reference: RawMessages = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(conversation.messages.len(), reference.messages.len());
            for (i, (ours, theirs)) in conversation.messages.iter().zip(&reference.messages).enumerate() {
                prop_assert_eq!(ours.raw.get(), theirs.get());
                prop_assert_eq!(&text.as_bytes()[conversation.message_range(i)], theirs.get().as_bytes());
            }
            let span: Value = serde_json::from_slice(&text.as_bytes()[conversation.messages_span.clone()]).unwrap();
            prop_assert_eq!(&span, &body["messages"]);
        }

        #[test]
        fn fields_match(message in message(), pretty in any::<bool>()) {
            let raw = if pretty {
                serde_json::to_string_pretty(&message).unwrap()
            } else {
                serde_json::to_string(&message).unwrap()
            };
            let parsed = chat::parse_message(&raw).unwrap();
            prop_assert_eq!(parsed.role_text.as_ref(), message["role"].as_str().unwrap());
            prop_assert_eq!(parsed.name.as_deref(), message.get("name").and_then(Value::as_str));
            prop_assert_eq!(parsed.tool_call_id.as_deref(), message.get("tool_call_id").and_then(Value::as_str));
            let content: Option<Value> = parsed.content.map(|c| serde_json::from_str(c.get()).unwrap());
            prop_assert_eq!(content.as_ref(), message.get("content"));
        }
    }
}
