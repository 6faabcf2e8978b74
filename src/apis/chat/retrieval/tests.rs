use super::*;
use crate::retrieval::Reader;
use crate::served::splice::Events;

#[test]
fn a_call_and_its_result_are_one_unit_and_other_messages_one_each() {
    let covered = [
        json!({"role": "user", "content": "Read the notes."}).to_string(),
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}},
            {"id": "c2", "type": "function", "function": {"name": "grep", "arguments": "{\"q\":\"x\"}"}}]})
        .to_string(),
        json!({"role": "tool", "tool_call_id": "c2", "content": "grep output"}).to_string(),
        json!({"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "the code is E-42"}]})
            .to_string(),
    ];
    let raws: Vec<&str> = covered.iter().map(String::as_str).collect();
    let parts = ChatRetrieval.parts(&crate::retrieval::parsed(raws.iter().copied()));
    assert_eq!(parts.len(), 2, "{parts:#?}");
    assert!(
        parts[0].what.starts_with("user message"),
        "{}",
        parts[0].what
    );
    let group = &parts[1];
    assert!(
        group
            .what
            .starts_with("read_file({\"path\":\"a.txt\"}), grep("),
        "{}",
        group.what
    );
    assert!(
        group
            .text
            .contains("[result of read_file]\nthe code is E-42"),
        "{}",
        group.text
    );
    assert!(group.text.contains("[result of grep]\ngrep output"));
}

#[test]
fn the_tool_is_offered_only_where_the_model_may_call_it() {
    let offers = |extra: Value| {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        ChatRetrieval.offers(body.to_string().as_bytes())
    };
    assert!(offers(json!({})));
    assert!(offers(json!({"tool_choice": "auto"})));
    assert!(offers(json!({"tool_choice": "required", "tools": []})));
    assert!(!offers(json!({"tool_choice": "none"})));
    assert!(!offers(
        json!({"tool_choice": {"type": "function", "function": {"name": "f"}}})
    ));
    assert!(!offers(json!({"n": 2})));
    assert!(!offers(json!({"functions": [{"name": "f"}]})));
}

#[test]
fn the_tool_goes_last_among_the_clients_tools_every_other_byte_kept() {
    let tool = |body: &str| {
        let out = ChatRetrieval
            .with_tool(body.as_bytes(), "compactor_expand")
            .unwrap();
        String::from_utf8(out).unwrap()
    };
    let with_tools =
        r#"{"model":"m", "tools": [ {"type":"function","function":{"name":"f"}} ] ,"messages":[]}"#;
    let out = tool(with_tools);
    assert!(out.starts_with(r#"{"model":"m", "tools": [ {"type":"function","function":{"name":"f"}},{"type":"function""#), "{out}");
    let value: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(value["tools"][1]["function"]["name"], "compactor_expand");
    let empty: Value = serde_json::from_str(&tool(r#"{"tools":[],"messages":[]}"#)).unwrap();
    assert_eq!(empty["tools"].as_array().unwrap().len(), 1);
    let none: Value = serde_json::from_str(&tool(r#"{"messages":[]}"#)).unwrap();
    assert_eq!(none["tools"][0]["function"]["name"], "compactor_expand");
}

#[test]
fn a_turn_goes_after_the_messages_as_a_call_and_its_result() {
    let body = br#"{"messages":[{"role":"user","content":"q"}],"model":"m"}"#;
    let turn = Turn {
        said: "Let me look.".into(),
        calls: vec![Call {
            id: "call_1".into(),
            arguments: r#"{"ref":"ref:ab"}"#.into(),
            reference: "ref:ab".into(),
        }],
        answers: vec!["the original".into()],
        ..Turn::default()
    };
    let out = ChatRetrieval
        .with_turn(body, "compactor_expand", &turn)
        .unwrap();
    let value: Value = serde_json::from_slice(&out).unwrap();
    let messages = value["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[1]["content"], "Let me look.");
    assert_eq!(
        messages[1]["tool_calls"][0]["function"]["arguments"],
        r#"{"ref":"ref:ab"}"#
    );
    assert_eq!(
        messages[2],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "the original"})
    );
    assert_eq!(value["model"], "m");
}

fn chunk(delta: Value, finish: Value) -> String {
    let data = json!({"id": "x", "created": 1, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {data}\n\n")
}

#[test]
fn a_lookup_that_cannot_be_answered_is_dropped_and_the_clients_calls_renumbered() {
    let stream = [
        chunk(json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "a", "function": {"name": "compactor_expand", "arguments": "{}"}}]}), Value::Null),
        chunk(json!({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "get_weather", "arguments": "{}"}}]}), Value::Null),
        chunk(json!({}), json!("tool_calls")),
        "data: [DONE]\n\n".to_string(),
    ]
    .concat();
    let mut events = Events::new(Reader(ChatRetrieval.stream("compactor_expand")));
    let mut out = events.feed(stream.as_bytes()).to_vec();
    assert!(
        out.is_empty(),
        "tool calls are held: {}",
        String::from_utf8_lossy(&out)
    );
    let turn = events.splice_mut().0.end(false, &mut out);
    assert!(turn.calls.is_empty());
    let text = String::from_utf8(out).unwrap();
    assert!(!text.contains("compactor_expand"), "{text}");
    assert!(
        text.contains(r#""index":0,"id":"b""#) || text.contains(r#""id":"b","index":0"#),
        "{text}"
    );
    assert!(text.contains("\"finish_reason\":\"tool_calls\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert_eq!(text.matches("\"role\":\"assistant\"").count(), 1, "{text}");
}
