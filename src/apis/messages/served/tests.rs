use super::*;
use crate::compaction::planner::rewrite::SUMMARY_PREFIX;
use crate::config::Secret;
use crate::served::splice::Events;

/// Items sealed for tenant `n` (and, before this binding, for the same `n`).
fn bound(n: u8) -> Binding {
    Binding {
        current: [n; 32],
        earlier: [n; 32],
    }
}

fn sealer() -> Sealer {
    Sealer::new(&[Secret::new("a sealing key of 16+ bytes")]).unwrap()
}

fn block(sealer: &Sealer, carried: &[Value]) -> Value {
    let items = carried.to_vec();
    let carried = Carried {
        summary: "S".into(),
        items,
        replaces: false,
    };
    let sealed = seal(sealer, &[3; 32], &carried).unwrap();
    json!({"type": "compaction", "content": "S", "encrypted_content": sealed})
}

fn expanded(sealer: &Sealer, messages: Value) -> Vec<Value> {
    let body = json!({"model": "m", "max_tokens": 9, "messages": messages}).to_string();
    let out = expand(body.as_bytes(), sealer, &bound(3)).unwrap().unwrap();
    messages_of(&out)
}

#[test]
fn what_came_before_the_block_is_dropped_and_the_block_becomes_what_it_carries() {
    let sealer = sealer();
    let carried = [
        json!({"role": "user", "content": [{"type": "text", "text": format!("{SUMMARY_PREFIX}S")}]}),
        json!({"role": "assistant", "content": "kept"}),
        json!({"role": "user", "content": "task"}),
    ];
    let block = block(&sealer, &carried);
    let messages = expanded(
        &sealer,
        json!([
            {"role": "user", "content": "old"},
            {"role": "assistant", "content": "old answer"},
            {"role": "user", "content": "task"},
            {"role": "assistant", "content": [block, {"type": "text", "text": "answer"}]},
            {"role": "user", "content": "go on"},
        ]),
    );
    assert_eq!(messages.len(), 5);
    assert_eq!(&messages[..3], &carried);
    assert_eq!(
        messages[3],
        json!({"role": "assistant", "content": [{"type": "text", "text": "answer"}]})
    );
    assert_eq!(messages[4], json!({"role": "user", "content": "go on"}));
}

#[test]
fn after_a_paused_compaction_the_next_user_turn_joins_the_carried_one() {
    let sealer = sealer();
    let carried = [json!({"role": "user", "content": "task"})];
    let block = block(&sealer, &carried);
    let messages = expanded(
        &sealer,
        json!([
            {"role": "user", "content": "task"},
            {"role": "assistant", "content": [block]},
            {"role": "user", "content": "go on"},
        ]),
    );
    assert_eq!(
        messages,
        [
            json!({"role": "user", "content": [{"type": "text", "text": "task"}, {"type": "text", "text": "go on"}]})
        ]
    );
}

const UPSTREAM: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":40,\"cache_read_input_tokens\":7,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: ping\ndata: {\"type\": \"ping\"}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi \\u00e9\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":12}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

fn events(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| serde_json::from_str(e.split("data: ").nth(1).unwrap()).unwrap())
        .collect()
}

#[test]
fn the_block_goes_first_in_a_stream_however_it_is_cut() {
    let block =
        json!({"type": "compaction", "content": "S", "encrypted_content": "compactor.v1.x"});
    let applied = json!({"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": 9});
    let iteration = json!({"type": "compaction", "input_tokens": 300, "output_tokens": 30});
    let block = Addition {
        block: Some(block),
        iteration: Some(iteration.clone()),
        applied: vec![applied.clone()],
    };
    let mut whole = Events::new(BlockSplice::new(&block));
    let expected = String::from_utf8(whole.feed(UPSTREAM.as_bytes()).to_vec()).unwrap();
    let got = events(&expected);
    let kinds: Vec<&str> = got.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(got[1]["content_block"]["type"], "compaction");
    assert_eq!(got[2]["delta"]["encrypted_content"], "compactor.v1.x");
    assert_eq!(
        [
            got[4]["index"].clone(),
            got[6]["index"].clone(),
            got[7]["index"].clone()
        ],
        [json!(1), json!(1), json!(1)]
    );
    assert_eq!(got[6]["delta"]["text"], "hi é");
    assert_eq!(
        got[8]["context_management"]["applied_edits"],
        json!([applied])
    );
    // The compaction's cost first, then the upstream's sampling, its input counts from
    // `message_start` (the delta carries only its output); the top-level counts stay.
    assert_eq!(
        got[8]["usage"],
        json!({"output_tokens": 12, "iterations": [iteration, {
            "type": "message", "input_tokens": 40, "output_tokens": 12,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 7,
        }]})
    );
    // Events that are not content blocks keep their bytes.
    assert!(expected.contains("event: ping\ndata: {\"type\": \"ping\"}\n\n"));
    for cut in 1..UPSTREAM.len() {
        let mut splice = Events::new(BlockSplice::new(&block));
        let mut out = splice.feed(&UPSTREAM.as_bytes()[..cut]).to_vec();
        out.extend_from_slice(&splice.feed(&UPSTREAM.as_bytes()[cut..]));
        out.extend_from_slice(&splice.finish());
        assert_eq!(String::from_utf8(out).unwrap(), expected, "cut at {cut}");
    }
    // Events named only in their data are shifted too.
    let unnamed = "data: {\"type\":\"message_start\",\"message\":{}}\n\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n";
    let out = Events::new(BlockSplice::new(&block)).feed(unnamed.as_bytes());
    let got = events(std::str::from_utf8(&out).unwrap());
    assert_eq!(got.len(), 5);
    assert_eq!(got[4], json!({"type": "content_block_stop", "index": 1}));
    // A stream that ends mid-event hands the rest on as it came.
    let mut splice = Events::new(BlockSplice::new(&block));
    let mut out = splice.feed(b"event: message_stop\ndata: {").to_vec();
    out.extend_from_slice(&splice.finish());
    assert_eq!(out, b"event: message_stop\ndata: {");
}

#[test]
fn the_block_goes_first_in_a_whole_message() {
    let block = json!({"type": "compaction", "content": "S"});
    let answer = br#"{"id":"m","content":[{"type":"text","text":"a"}],"stop_reason":"end_turn","usage":{"input_tokens":40,"output_tokens":5}}"#;
    let iteration = json!({"type": "compaction", "input_tokens": 300, "output_tokens": 30});
    let addition = Addition {
        block: Some(block.clone()),
        iteration: Some(iteration.clone()),
        applied: Vec::new(),
    };
    let out = splice_into_message(answer, &addition).unwrap();
    let message: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(message["content"][0], block);
    assert_eq!(message["content"][1]["text"], "a");
    assert!(message.get("context_management").is_none());
    assert_eq!(message["usage"]["input_tokens"], 40);
    assert_eq!(message["usage"]["iterations"][0], iteration);
    assert_eq!(
        message["usage"]["iterations"][1],
        json!({"type": "message", "input_tokens": 40, "output_tokens": 5,
                   "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
    );
    // Iterations the upstream reported itself keep theirs, after the compaction's.
    let looped = br#"{"content":[],"usage":{"input_tokens":9,"output_tokens":1,"iterations":[{"type":"message","input_tokens":9,"output_tokens":1}]}}"#;
    let message: Value =
        serde_json::from_slice(&splice_into_message(looped, &addition).unwrap()).unwrap();
    let kinds: Vec<&Value> = message["usage"]["iterations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["type"])
        .collect();
    assert_eq!(kinds, [&json!("compaction"), &json!("message")]);
    assert!(splice_into_message(b"not json", &addition).is_none());
    // Only edits: the content stays, the report is added.
    let edits = Addition {
        applied: vec![json!({"type": "clear_thinking_20251015"})],
        ..Addition::default()
    };
    let message: Value =
        serde_json::from_slice(&splice_into_message(answer, &edits).unwrap()).unwrap();
    assert_eq!(message["content"].as_array().unwrap().len(), 1);
    assert_eq!(
        message["context_management"]["applied_edits"][0]["type"],
        "clear_thinking_20251015"
    );
}

#[test]
fn with_only_edits_applied_no_block_index_moves() {
    let edits = Addition {
        applied: vec![json!({"type": "clear_thinking_20251015"})],
        ..Addition::default()
    };
    let out = Events::new(BlockSplice::new(&edits)).feed(UPSTREAM.as_bytes());
    let got = events(std::str::from_utf8(&out).unwrap());
    assert_eq!(got.len(), 7);
    assert_eq!(got[1]["index"], 0);
    assert_eq!(
        got[5]["context_management"]["applied_edits"][0]["type"],
        "clear_thinking_20251015"
    );
}

#[test]
fn a_compaction_edit_is_taken_out_with_its_field_when_alone() {
    let mut fields = json!({"context_management": {"edits": [{"type": EDIT}]}})
        .as_object()
        .unwrap()
        .clone();
    assert!(take_edit(&mut fields).is_some());
    assert!(!fields.contains_key("context_management"));
    let mut fields = json!({"context_management": {"edits": [{"type": "clear_thinking_20251015"}, {"type": EDIT}]}})
            .as_object()
            .unwrap()
            .clone();
    assert!(take_edit(&mut fields).is_some());
    assert_eq!(
        fields["context_management"],
        json!({"edits": [{"type": "clear_thinking_20251015"}]})
    );
}
