use serde_json::json;

use super::*;
use crate::compaction::planner::structure::{validate, Groups};
use crate::compaction::summaries::message_text::message_body as message_text_of;

fn conversation(body: &str) -> Conversation<'_> {
    match parse(body.as_bytes()).unwrap() {
        Parsed::Conversation(conversation) => conversation,
        Parsed::LeaveAlone(reason) => panic!("left alone: {reason}"),
    }
}

#[test]
fn calls_pair_with_as_many_responses_by_name_and_rank() {
    let body = json!({"contents": [
        {"role": "user", "parts": [{"text": "read a and b"}]},
        {"role": "model", "parts": [
            {"text": "plan", "thought": true},
            {"functionCall": {"name": "read_file", "args": {"path": "a"}}, "thoughtSignature": "c2ln"},
            {"functionCall": {"name": "read_file", "args": {"path": "b"}}},
            {"functionCall": {"name": "ls", "args": {}}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "ls", "response": {"output": "a b"}}},
            {"functionResponse": {"name": "read_file", "response": {"output": "A"}}},
            {"functionResponse": {"name": "read_file", "response": {"error": "gone"}}}]},
        {"parts": [{"text": "thanks"}]},
    ], "systemInstruction": {"parts": [{"text": "be brief"}]}, "generationConfig": {"maxOutputTokens": 99}})
    .to_string();
    let conversation = conversation(&body);
    let messages = &conversation.messages;
    assert_eq!(
        messages.iter().map(|m| m.role).collect::<Vec<_>>(),
        [Role::User, Role::Assistant, Role::Tool, Role::User]
    );
    let ids: Vec<&str> = messages[1]
        .tool_calls
        .iter()
        .map(|c| c.id.as_ref())
        .collect();
    assert_eq!(ids, ["read_file#0", "read_file#1", "ls#0"]);
    assert_eq!(
        messages[2].answers().collect::<Vec<_>>(),
        ["ls#0", "read_file#0", "read_file#1"]
    );
    // Only text outputs can be cleared.
    assert_eq!(messages[2].tool_outputs.len(), 2);
    assert_eq!(messages[2].tool_outputs[0].value.get(), r#""a b""#);
    assert!(messages[1].binds_next);
    assert_eq!(
        Groups::of(messages).valid_cut,
        [true, true, false, true, true]
    );
    assert!(validate(messages.iter()).is_ok());
    assert!(validate([&messages[0], &messages[1], &messages[3]].into_iter()).is_err());
    assert_eq!(conversation.output_reserve, 99);
    assert!(
        conversation.schema_tokens(&Default::default()) > 0,
        "the instruction counts"
    );
}

#[test]
fn the_summarizer_sees_text_calls_and_results_never_thoughts_or_signatures() {
    let model = r#"{"role":"model","parts":[{"text":"secret plan","thought":true},{"text":"Reading."},{"functionCall":{"name":"read_file","args":{"path":"a"}},"thoughtSignature":"c2lnbmF0dXJl"}]}"#;
    let shown = message_text_of(&parse_message(model).unwrap());
    assert!(shown.contains("Reading."), "{shown}");
    assert!(
        shown.contains(r#"→ calls read_file({"path":"a"})"#),
        "{shown}"
    );
    assert!(
        !shown.contains("secret plan") && !shown.contains("c2lnbmF0dXJl"),
        "{shown}"
    );
    let user = r#"{"role":"user","parts":[{"functionResponse":{"name":"read_file","response":{"output":"line 1"}}},{"inlineData":{"mimeType":"image/png","data":"AAAA"}}]}"#;
    assert_eq!(
        message_text_of(&parse_message(user).unwrap()),
        "← result [read_file]: line 1\n[image]"
    );
}

#[test]
fn the_summary_joins_the_first_kept_user_turn_or_stands_as_one() {
    let framed = "[summary] S";
    assert_eq!(
        Gemini.summary_json(framed, SummaryRole::User, None),
        r#"{"role":"user","parts":[{"text":"[summary] S"}]}"#
    );
    let body = r#"{"contents":[{"role":"user","parts":[ {"text":"go"} ]}]}"#;
    let conversation = conversation(body);
    let merged = Gemini
        .merged_summary(
            body.as_bytes(),
            conversation.message_range(0),
            conversation.messages[0].content.map(|c| {
                let start = c.get().as_ptr() as usize - body.as_ptr() as usize;
                start..start + c.get().len()
            }),
            framed,
            None,
        )
        .unwrap();
    assert_eq!(
        merged,
        r#"{"role":"user","parts":[{"text":"[summary] S"}, {"text":"go"} ]}"#
    );
}

#[test]
fn requests_on_cached_content_are_left_alone_and_other_bodies_are_errors() {
    let cached = json!({"cachedContent": "cachedContents/abc", "contents": [{"role": "user", "parts": [{"text": "q"}]}]});
    assert!(matches!(
        parse(cached.to_string().as_bytes()),
        Ok(Parsed::LeaveAlone(Reason::CachedContent))
    ));
    assert!(parse(b"{}").is_err());
    assert!(parse(br#"{"contents":[{"role":"assistant","parts":[]}]}"#).is_err());
    assert!(parse(br#"{"contents":[{"role":"user","parts":[1]}]}"#).is_err());
    // Proto names in snake case read as well.
    let snake = json!({"contents": [{"role": "model", "parts": [{"function_call": {"name": "f", "args": {}}}]},
        {"role": "user", "parts": [{"function_response": {"name": "f", "response": {}}}]}],
        "system_instruction": {"parts": [{"text": "x"}]}});
    let snake = snake.to_string();
    let conversation = conversation(&snake);
    assert_eq!(
        conversation.messages[1].answers().collect::<Vec<_>>(),
        ["f#0"]
    );
}

#[test]
fn the_path_names_the_model_and_the_stream() {
    let call = "/v1beta/models/gemini-2.5-pro:streamGenerateContent";
    assert!(Gemini.serves_path(call));
    assert!(Gemini.serves_path("/v1/models/m:generateContent"));
    let vertex = "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-pro:generateContent";
    assert!(Gemini.serves_path(vertex));
    assert_eq!(Gemini.path_model(vertex), Some("gemini-2.5-pro"));
    assert!(!Gemini.serves_path("/v1beta/models/m:countTokens"));
    assert_eq!(Gemini.path_model(call), Some("gemini-2.5-pro"));
    assert!(Gemini.path_streams(call));
    assert!(!Gemini.path_streams("/v1/models/m:generateContent"));
}
