//! Arbitrary bodies through the parser, the planner and the rewrite: nothing may panic, and
//! every rewrite is checked by an oracle that shares no code with the planner's validator:
//! the output parses, every verbatim message is a byte-identical slice of the input, and every
//! tool result answers an earlier call (every call answered, but for a final pending turn).
#![no_main]

use compactor::apis::chat;
use std::collections::HashMap;

use compactor::compaction::planner::conversation::Conversation;
use compactor::compaction::planner::plan::{plan, Decision, NoCache, PlanSettings};
use compactor::apis::chat::summary_message;
use compactor::compaction::planner::rewrite::rewrite;
use compactor::compaction::summaries::summary_input::{self, InputSettings};
use compactor::compaction::planner::tokens::TokenModel;
use compactor::config::{ContextSize, Oversize, SummarizationConfig, SummaryRole};
use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;
use serde_json::Value;

#[derive(serde::Deserialize)]
struct Messages<'a> {
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
}

fn oracle(input: &Conversation<'_>, output: &[u8], summary: &str) {
    let parsed: Messages = serde_json::from_slice(output).expect("the rewrite parses");
    let inputs: Vec<&str> = input.messages.iter().map(|m| m.raw.get()).collect();
    let mut summaries = 0;
    for message in &parsed.messages {
        if message.get() == summary {
            summaries += 1;
        } else {
            assert!(
                inputs.contains(&message.get()),
                "a verbatim message is not a slice of the input"
            );
        }
    }
    assert_eq!(summaries, 1, "exactly one summary");
    let values: Vec<Value> = parsed
        .messages
        .iter()
        .map(|m| serde_json::from_str(m.get()).expect("each message parses"))
        .collect();
    let mut open: HashMap<String, usize> = HashMap::new();
    let mut last_caller = None;
    for (i, message) in values.iter().enumerate() {
        match message["role"].as_str() {
            Some("tool") => {
                let id = message["tool_call_id"].as_str().unwrap_or_default();
                assert!(open.remove(id).is_some(), "a tool result without its call");
            }
            Some("assistant") => {
                if let Some(calls) = message["tool_calls"].as_array().filter(|c| !c.is_empty()) {
                    last_caller = Some(i);
                    for call in calls {
                        open.insert(call["id"].as_str().unwrap_or_default().to_string(), i);
                    }
                }
            }
            _ => {}
        }
    }
    let pending_ok = last_caller.filter(|&i| {
        values[i + 1..]
            .iter()
            .all(|m| m["role"].as_str() == Some("tool"))
    });
    assert!(
        open.values().all(|&caller| Some(caller) == pending_ok),
        "a call without its result"
    );
}

fuzz_target!(|data: &[u8]| {
    let Ok(conversation) = chat::parse(data) else {
        return;
    };
    let base = PlanSettings::from_config(&SummarizationConfig::default());
    for (trigger, keep) in [
        (ContextSize::Messages(1), ContextSize::Messages(1)),
        (ContextSize::Tokens(1), ContextSize::Tokens(5)),
        (ContextSize::Fraction(0.1), ContextSize::Fraction(0.5)),
    ] {
        let settings = PlanSettings { triggers: vec![trigger], keep, ..base.clone() };
        let model = TokenModel { max_input_tokens: Some(100), ..TokenModel::default() };
        let planned = plan(&conversation, &settings, &model, false, &mut NoCache);
        if let Decision::Summarize { layout, to_summarize, .. } = planned.decision {
            let input = summary_input::select(&conversation, &to_summarize, &planned.message_tokens, None, &InputSettings {
                budget: Some(50),
                oversize: Oversize::Fold,
                max_calls: 4,
                model,
            });
            assert!(!input.chunks.is_empty());
            let summary = summary_message("s", SummaryRole::User);
            let output = rewrite(&conversation, &layout, &summary)
                .expect("a planned layout always rewrites");
            oracle(&conversation, &output, &summary);
        }
    }
});
