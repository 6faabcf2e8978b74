use serde_json::json;

use super::*;
use crate::compaction::planner::structure::{validate, Groups};

fn conversation(body: &str) -> Conversation<'_> {
    match parse(body.as_bytes()).unwrap() {
        Parsed::Conversation(conversation) => conversation,
        Parsed::LeaveAlone(reason) => panic!("left alone: {reason}"),
    }
}

fn plan_of(
    conversation: &Conversation<'_>,
    trigger: crate::config::ContextSize,
) -> crate::compaction::planner::plan::Plan {
    let settings = crate::compaction::planner::plan::PlanSettings {
        triggers: vec![trigger],
        ..crate::compaction::planner::plan::PlanSettings::from_config(&Default::default())
    };
    crate::compaction::planner::plan::plan(
        conversation,
        &settings,
        &Default::default(),
        false,
        &mut crate::compaction::planner::plan::NoCache,
    )
}

fn left_alone(body: serde_json::Value) -> &'static str {
    let text = body.to_string();
    match parse(text.as_bytes()).unwrap() {
        Parsed::LeaveAlone(reason) => reason.label(),
        Parsed::Conversation(_) => panic!("planned: {text}"),
    }
}

#[test]
fn history_the_proxy_cannot_see_is_left_alone() {
    let input = json!([{"role": "user", "content": "hi"}]);
    assert_eq!(
        left_alone(json!({"model": "m", "input": input, "previous_response_id": "resp_1"})),
        "previous_response_id"
    );
    assert_eq!(
        left_alone(json!({"model": "m", "input": input, "conversation": "conv_1"})),
        "conversation"
    );
    assert_eq!(
        left_alone(
            json!({"model": "m", "input": input, "context_management": [{"type": "compaction"}]})
        ),
        "context_management"
    );
    assert_eq!(
        left_alone(json!({"model": "m", "input": "just text"})),
        "string_input"
    );
    assert_eq!(
        left_alone(
            json!({"model": "m", "input": [{"role": "user", "content": "q"}, {"type": "item_reference", "id": "msg_1"}]})
        ),
        "item_reference"
    );
    assert_eq!(
        left_alone(
            json!({"model": "m", "input": [{"role": "user", "content": "q"}, {"type": "compaction_trigger"}]})
        ),
        "compaction_trigger"
    );
    // An explicit null is absent.
    let body = json!({"model": "m", "input": input, "previous_response_id": null}).to_string();
    assert!(matches!(
        parse(body.as_bytes()).unwrap(),
        Parsed::Conversation(_)
    ));
}

#[test]
fn items_keep_their_bytes_and_the_array_is_located() {
    let body = r#"{"model":"m","instructions":"be brief","input": [ {"role":"developer","content":"rules"}, {"type":"message","role":"user","content":[{"type":"input_text","text":"hello"}],"x-unknown":1} ],"store":false}"#;
    let conversation = conversation(body);
    assert_eq!(conversation.messages.len(), 2);
    assert_eq!(
        conversation.messages[1].raw.get(),
        r#"{"type":"message","role":"user","content":[{"type":"input_text","text":"hello"}],"x-unknown":1}"#
    );
    assert!(conversation.messages[0].role.is_instruction());
    let span = conversation.messages_span.clone();
    assert!(body[span.clone()].starts_with("[ {") && body[span].ends_with("} ]"));
    assert!(conversation.schema_tokens(&Default::default()) > 0);
}

#[test]
fn a_call_and_its_output_are_one_group_even_parallel_and_apart() {
    let body = json!({"model": "m", "input": [
        {"role": "user", "content": "q"},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "b", "output": "B"},
        {"role": "assistant", "content": "thinking aloud"},
        {"type": "function_call_output", "call_id": "a", "output": "A"},
        {"role": "user", "content": "next"},
    ]})
    .to_string();
    let conversation = conversation(&body);
    let groups = Groups::of(&conversation.messages);
    assert_eq!(
        groups.valid_cut,
        [true, true, false, false, false, false, true, true]
    );
    assert!(validate(conversation.messages.iter()).is_ok());
    // Without its call the output is an orphan, as OpenAI says.
    assert!(validate(conversation.messages[3..].iter()).is_err());
}

#[test]
fn reasoning_stays_with_the_item_it_produced() {
    let body = json!({"model": "m", "input": [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA".repeat(800)},
            {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "output": "A"},
            {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "s"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
            {"role": "user", "content": "next"},
        ]})
        .to_string();
    let conversation = conversation(&body);
    let groups = Groups::of(&conversation.messages);
    assert_eq!(
        groups.valid_cut,
        [true, true, false, false, true, false, true, true]
    );
    // Opaque items are counted whole: 4 000 characters of encrypted content cost tokens.
    let model = Default::default();
    assert!(conversation.messages[1].tokens(&model) >= 1_000);
    assert!(conversation.messages[1].opaque.is_some());
    assert!(conversation.messages[1].content.is_none());
}

#[test]
fn an_unknown_call_and_its_output_are_kept_together() {
    let body = json!({"model": "m", "input": [
        {"role": "user", "content": "q"},
        {"type": "program", "call_id": "p1", "code": "x"},
        {"type": "program_output", "call_id": "p1", "output": "y"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"role": "user", "content": "next"},
    ]})
    .to_string();
    let conversation = conversation(&body);
    let groups = Groups::of(&conversation.messages);
    assert_eq!(groups.valid_cut, [true, true, false, true, true, true]);
}

#[test]
fn an_item_without_its_required_fields_is_a_parse_error() {
    for item in [
        json!({"type": "function_call", "name": "f", "arguments": "{}"}),
        json!({"type": "function_call_output", "output": "x"}),
        json!({"type": "message", "content": "no role"}),
    ] {
        let body = json!({"model": "m", "input": [item]}).to_string();
        assert!(
            matches!(parse(body.as_bytes()), Err(ParseError::BadMessage(0, _))),
            "{body}"
        );
    }
}

#[test]
fn a_long_agent_run_is_summarized_at_a_cut_that_keeps_reasoning_whole() {
    let mut input = vec![json!({"role": "developer", "content": "rules"})];
    for t in 0..12 {
        input.push(json!({"role": "user", "content": format!("task {t} ") + &"words ".repeat(50)}));
        input.push(json!({"type": "reasoning", "id": format!("rs_{t}"), "summary": [], "encrypted_content": "e".repeat(200)}));
        input.push(json!({"type": "function_call", "call_id": format!("c{t}"), "name": "read", "arguments": "{}"}));
        input.push(json!({"type": "function_call_output", "call_id": format!("c{t}"), "output": "data ".repeat(80)}));
    }
    input.push(json!({"type": "reasoning", "id": "rs_last", "summary": []}));
    input.push(json!({"role": "assistant", "content": [{"type": "output_text", "text": "done"}]}));
    let body = json!({"model": "m", "instructions": "be brief", "input": input}).to_string();
    let conversation = conversation(&body);
    let plan = plan_of(&conversation, crate::config::ContextSize::Tokens(2_000));
    let crate::compaction::planner::plan::Decision::Summarize { layout, .. } = plan.decision else {
        panic!("expected a summary: {:?}", plan.decision);
    };
    assert_eq!(layout.head, 1, "the developer item stays pinned");
    assert!(layout.cut > 1 && !conversation.messages[layout.cut - 1].binds_next);
    assert!(validate(conversation.messages[layout.cut..].iter()).is_ok());
}

#[test]
fn with_instructions_only_the_summary_is_the_first_item_and_instructions_stay() {
    let mut input = Vec::new();
    for t in 0..12 {
        input.push(json!({"role": "user", "content": format!("task {t} ") + &"words ".repeat(60)}));
        input.push(json!({"role": "assistant", "content": [{"type": "output_text", "text": "ok ".repeat(60)}]}));
    }
    input.push(json!({"role": "user", "content": "next"}));
    let instructions = "Be brief. ".repeat(100);
    let body = json!({"model": "m", "instructions": instructions, "input": input}).to_string();
    let conversation = conversation(&body);
    let model = Default::default();
    // The instructions are sent with every request, so they count.
    assert!(conversation.schema_tokens(&model) >= 200);
    let plan = plan_of(&conversation, crate::config::ContextSize::Tokens(1_500));
    let crate::compaction::planner::plan::Decision::Summarize { layout, .. } = plan.decision else {
        panic!("expected a summary: {:?}", plan.decision);
    };
    assert_eq!(layout.head, 0);
    let splice = crate::compaction::planner::rewrite::Splice::new(
        &conversation,
        &layout,
        crate::config::SummaryRole::User,
        crate::config::SummaryPlacement::Auto,
    )
    .unwrap();
    let out: serde_json::Value = serde_json::from_slice(&splice.apply(
        body.as_bytes(),
        "S",
        crate::config::SummaryRole::User,
    ))
    .unwrap();
    assert_eq!(out["instructions"], json!(instructions));
    assert_eq!(out["input"][0]["type"], "message");
    assert_eq!(out["input"][0]["role"], "user");
    assert_eq!(
        out["input"][0]["content"][0],
        json!({"type": "input_text", "text": "Here is a summary of the conversation to date:\n\nS"})
    );
    // An item of its own, never merged into the user item that follows (placement auto).
    let kept = conversation.messages.len() - layout.cut + layout.excluded.len();
    assert_eq!(out["input"].as_array().unwrap().len(), kept + 1);
}

/// Random agent runs: user turns, each followed by steps that are an answer or a batch of
/// parallel calls (outputs in either order, sometimes with a message between), each step
/// sometimes preceded by a reasoning item.
fn agent_run() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let step = (any::<bool>(), 0usize..4, any::<bool>(), any::<bool>());
    proptest::collection::vec(proptest::collection::vec(step, 0..4), 1..8).prop_map(|turns| {
            let mut input = vec![json!({"role": "developer", "content": "rules"})];
            let mut next_call = 0;
            for (t, steps) in turns.iter().enumerate() {
                input.push(json!({"role": "user", "content": format!("turn {t}")}));
                for &(reasoning, calls, reversed, interleave) in steps {
                    if reasoning {
                        input.push(json!({"type": "reasoning", "id": format!("rs_{next_call}_{t}"), "summary": []}));
                    }
                    if calls == 0 {
                        input.push(json!({"role": "assistant", "content": [{"type": "output_text", "text": "answer"}]}));
                        continue;
                    }
                    let ids: Vec<String> = (0..calls).map(|k| format!("call_{}", next_call + k)).collect();
                    next_call += calls;
                    for id in &ids {
                        input.push(json!({"type": "function_call", "call_id": id, "name": "f", "arguments": "{}"}));
                    }
                    let mut outputs: Vec<serde_json::Value> = ids
                        .iter()
                        .map(|id| json!({"type": "function_call_output", "call_id": id, "output": "ok"}))
                        .collect();
                    if reversed {
                        outputs.reverse();
                    }
                    if interleave {
                        outputs.insert(1, json!({"role": "assistant", "content": "meanwhile"}));
                    }
                    input.extend(outputs);
                }
            }
            input.push(json!({"role": "user", "content": "last"}));
            json!({"model": "m", "input": input}).to_string()
        })
}

proptest::proptest! {
    #[test]
    fn every_valid_cut_leaves_a_list_openai_accepts(body in agent_run()) {
        let conversation = conversation(&body);
        let messages = &conversation.messages;
        let groups = Groups::of(messages);
        for cut in 1..=messages.len() {
            if !groups.valid_cut[cut] {
                continue;
            }
            proptest::prop_assert!(!messages[cut - 1].binds_next, "cut {cut} after reasoning");
            proptest::prop_assert!(validate(messages[cut..].iter()).is_ok(), "cut {cut}");
        }
        let plan = plan_of(&conversation, crate::config::ContextSize::Messages(6));
        if let crate::compaction::planner::plan::Decision::Summarize { layout, .. } = plan.decision {
            proptest::prop_assert!(groups.valid_cut[layout.cut]);
            proptest::prop_assert!(
                crate::compaction::planner::structure::validate_layout(messages, &layout).is_ok()
            );
            // Kept items are the request's own bytes.
            for message in &messages[layout.cut..] {
                proptest::prop_assert!(body.contains(message.raw.get()));
            }
        }
    }
}
