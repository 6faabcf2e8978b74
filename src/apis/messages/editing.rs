//! Anthropic's context editing (`clear_tool_uses_20250919`, `clear_thinking_20251015` in
//! `context_management.edits`), applied by compactor for upstreams that lack it: the edits are
//! taken out of the request, applied to its messages, and the ones that changed something are
//! reported as Anthropic does, in the answer's `context_management.applied_edits`.
//!
//! Pure: the request's JSON in, the edited JSON and the report out; a token count is passed in.

use std::collections::HashSet;

use serde_json::{json, Map, Value};

use crate::compaction::planner::clearing::placeholder;

pub const CLEAR_TOOL_USES: &str = "clear_tool_uses_20250919";
pub const CLEAR_THINKING: &str = "clear_thinking_20251015";
/// The most context edits one request may carry: each is a pass over the conversation and a
/// count of it (Anthropic's two kinds, a few of each, is all a client has a use for).
pub const MAX_EDITS: usize = 8;
/// Anthropic's defaults when an edit names none.
const DEFAULT_TRIGGER_TOKENS: u64 = 100_000;
const DEFAULT_KEEP_TOOL_USES: u64 = 3;
const DEFAULT_KEEP_THINKING_TURNS: u64 = 1;

/// Takes the context-editing edits out of `context_management` (and the field when none is
/// left), in the order they were listed.
pub fn take_clearing_edits(fields: &mut Map<String, Value>) -> Vec<Value> {
    take_edits(fields, |kind| {
        matches!(kind, CLEAR_TOOL_USES | CLEAR_THINKING)
    })
}

/// Takes the edits whose type `wanted` accepts out of `context_management.edits` (and the
/// field when no edit is left), in the order they were listed.
pub fn take_edits(fields: &mut Map<String, Value>, wanted: impl Fn(&str) -> bool) -> Vec<Value> {
    let Some(edits) = fields
        .get_mut("context_management")
        .and_then(|management| management.get_mut("edits"))
        .and_then(Value::as_array_mut)
    else {
        return Vec::new();
    };
    let (taken, kept): (Vec<Value>, Vec<Value>) = std::mem::take(edits)
        .into_iter()
        .partition(|edit| wanted(kind(edit)));
    *edits = kept;
    if edits.is_empty() {
        fields.remove("context_management");
    }
    taken
}

fn kind(edit: &Value) -> &str {
    edit.get("type").and_then(Value::as_str).unwrap_or_default()
}

/// Applies `edits` in order to `fields["messages"]`; `count` is compactor's count of a
/// request's input tokens. Returns the report of each edit that changed something.
pub fn apply(
    fields: &mut Map<String, Value>,
    edits: &[Value],
    count: &dyn Fn(&Map<String, Value>) -> u64,
) -> Vec<Value> {
    let mut applied = Vec::new();
    // Each edit's count after is the next one's before: one count per edit, not two.
    let mut before = count(fields);
    for edit in edits {
        let Some(Value::Array(messages)) = fields.get_mut("messages") else {
            break;
        };
        let changed = match kind(edit) {
            CLEAR_TOOL_USES => clear_tool_uses(messages, edit, before),
            CLEAR_THINKING => clear_thinking(messages, edit),
            _ => None,
        };
        let Some((key, cleared, undo)) = changed else {
            continue;
        };
        let after = count(fields);
        let removed = before.saturating_sub(after);
        let least = edit
            .pointer("/clear_at_least/value")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        if removed < least {
            // Not worth breaking the provider's cache for: the edit is not applied.
            fields.insert("messages".into(), Value::Array(undo));
            continue;
        }
        before = after;
        applied.push(json!({"type": kind(edit), key: cleared, "cleared_input_tokens": removed}));
    }
    applied
}

/// `clear_tool_uses_20250919`: past its trigger, the results of all but the latest `keep` tool
/// uses (those of `exclude_tools` aside) replaced by a placeholder, and their inputs emptied
/// when `clear_tool_inputs` says so. Returns the report's key, the uses cleared and the
/// messages as they were.
fn clear_tool_uses(
    messages: &mut [Value],
    edit: &Value,
    tokens: u64,
) -> Option<(&'static str, u64, Vec<Value>)> {
    let uses: Vec<(String, String)> = messages
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .flat_map(|m| blocks(m).iter())
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
        .filter_map(|b| {
            let id = b.get("id")?.as_str()?.to_string();
            let name = b.get("name").and_then(Value::as_str).unwrap_or_default();
            Some((id, name.to_string()))
        })
        .collect();
    let trigger = edit.pointer("/trigger/value").and_then(Value::as_u64);
    let triggered = match edit.pointer("/trigger/type").and_then(Value::as_str) {
        Some("tool_uses") => uses.len() as u64 >= trigger.unwrap_or(0),
        _ => tokens >= trigger.unwrap_or(DEFAULT_TRIGGER_TOKENS),
    };
    if !triggered {
        return None;
    }
    let keep = edit
        .pointer("/keep/value")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_KEEP_TOOL_USES) as usize;
    let excluded: HashSet<&str> = edit
        .get("exclude_tools")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let inputs_of = |name: &str| match edit.get("clear_tool_inputs") {
        Some(Value::Bool(all)) => *all,
        Some(Value::Array(names)) => names.iter().any(|n| n.as_str() == Some(name)),
        _ => false,
    };
    let cleared: Vec<&(String, String)> = uses
        .iter()
        .take(uses.len().saturating_sub(keep))
        .filter(|(_, name)| !excluded.contains(name.as_str()))
        .collect();
    if cleared.is_empty() {
        return None;
    }
    let undo = messages.to_vec();
    let names: std::collections::HashMap<&str, &str> = cleared
        .iter()
        .map(|(id, name)| (id.as_str(), name.as_str()))
        .collect();
    for message in messages.iter_mut() {
        let Some(blocks) = message.get_mut("content").and_then(Value::as_array_mut) else {
            continue;
        };
        for block in blocks {
            clear_block(block, &names, &inputs_of);
        }
    }
    Some(("cleared_tool_uses", cleared.len() as u64, undo))
}

/// One block of a cleared call: a result replaced by its placeholder (unless shorter), a
/// call's input emptied when the edit clears that tool's inputs.
fn clear_block(
    block: &mut Value,
    names: &std::collections::HashMap<&str, &str>,
    inputs_of: &dyn Fn(&str) -> bool,
) {
    match block.get("type").and_then(Value::as_str) {
        Some("tool_result") => {
            let id = block.get("tool_use_id").and_then(Value::as_str);
            if let Some(name) = id.and_then(|id| names.get(id)) {
                let chars = block.get("content").map_or(0, |c| c.to_string().len());
                let replacement = placeholder(name, chars as u64 / 4);
                // A result shorter than its placeholder is left as it is.
                if replacement.len() < chars {
                    block["content"] = json!(replacement);
                }
            }
        }
        Some("tool_use") => {
            let id = block.get("id").and_then(Value::as_str);
            if id
                .and_then(|id| names.get(id))
                .is_some_and(|name| inputs_of(name))
            {
                block["input"] = json!({});
            }
        }
        _ => {}
    }
}

/// `clear_thinking_20251015`: thinking blocks taken out of every assistant turn but the latest
/// `keep` turns that have them (`"all"` keeps every one).
fn clear_thinking(messages: &mut [Value], edit: &Value) -> Option<(&'static str, u64, Vec<Value>)> {
    let keep = match edit.get("keep") {
        Some(Value::String(all)) if all == "all" => return None,
        Some(keep) if keep.get("type").and_then(Value::as_str) == Some("all") => return None,
        Some(keep) => keep
            .get("value")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_KEEP_THINKING_TURNS),
        None => DEFAULT_KEEP_THINKING_TURNS,
    } as usize;
    let is_thinking = |b: &Value| {
        matches!(
            b.get("type").and_then(Value::as_str),
            Some("thinking" | "redacted_thinking")
        )
    };
    let turns: Vec<usize> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .filter(|(_, m)| blocks(m).iter().any(is_thinking))
        .map(|(i, _)| i)
        .collect();
    let cleared = &turns[..turns.len().saturating_sub(keep)];
    if cleared.is_empty() {
        return None;
    }
    let undo = messages.to_vec();
    for &i in cleared {
        if let Some(blocks) = messages[i].get_mut("content").and_then(Value::as_array_mut) {
            blocks.retain(|b| !is_thinking(b));
            if blocks.is_empty() {
                // A turn that only thought keeps a word, so it is not an empty message.
                blocks.push(json!({"type": "text", "text": "…"}));
            }
        }
    }
    Some(("cleared_thinking_turns", cleared.len() as u64, undo))
}

fn blocks(message: &Value) -> &[Value] {
    message
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(uses: usize) -> Map<String, Value> {
        let mut messages = vec![json!({"role": "user", "content": "task"})];
        for i in 0..uses {
            messages.push(json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": format!("t{i}"), "signature": "s"},
                {"type": "tool_use", "id": format!("u{i}"), "name": if i == 0 { "Keep" } else { "Read" }, "input": {"path": i}},
            ]}));
            messages.push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": format!("u{i}"), "content": "x".repeat(400)},
            ]}));
        }
        json!({"model": "m", "messages": messages})
            .as_object()
            .unwrap()
            .clone()
    }

    fn chars(fields: &Map<String, Value>) -> u64 {
        Value::Object(fields.clone()).to_string().len() as u64 / 4
    }

    fn results(fields: &Map<String, Value>) -> Vec<String> {
        fields["messages"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|m| blocks(m).to_vec())
            .filter(|b| b["type"] == "tool_result")
            .map(|b| b["content"].as_str().unwrap().chars().take(18).collect())
            .collect()
    }

    #[test]
    fn old_tool_results_are_cleared_but_the_latest_and_excluded_ones() {
        let mut fields = run(5);
        let edit = json!({"type": CLEAR_TOOL_USES, "trigger": {"type": "input_tokens", "value": 10}, "keep": {"type": "tool_uses", "value": 2}, "exclude_tools": ["Keep"], "clear_tool_inputs": true});
        let applied = apply(&mut fields, &[edit], &chars);
        assert_eq!(applied.len(), 1);
        assert_eq!(applied[0]["cleared_tool_uses"], 2);
        assert!(applied[0]["cleared_input_tokens"].as_u64().unwrap() > 100);
        let cleared = "[compactor cleare".to_string() + "d";
        assert_eq!(
            results(&fields),
            [
                "x".repeat(18),
                cleared.clone(),
                cleared,
                "x".repeat(18),
                "x".repeat(18)
            ]
        );
        assert_eq!(fields["messages"][3]["content"][1]["input"], json!({}));
        assert_eq!(
            fields["messages"][1]["content"][1]["input"],
            json!({"path": 0})
        );
    }

    #[test]
    fn under_the_trigger_or_short_of_clear_at_least_nothing_changes() {
        let original = run(5);
        for edit in [
            json!({"type": CLEAR_TOOL_USES}),
            json!({"type": CLEAR_TOOL_USES, "trigger": {"type": "tool_uses", "value": 9}}),
            json!({"type": CLEAR_TOOL_USES, "trigger": {"type": "tool_uses", "value": 2}, "clear_at_least": {"type": "input_tokens", "value": 100000}}),
        ] {
            let mut fields = original.clone();
            assert!(
                apply(&mut fields, std::slice::from_ref(&edit), &chars).is_empty(),
                "{edit}"
            );
            assert_eq!(fields, original, "{edit}");
        }
    }

    #[test]
    fn thinking_is_taken_out_of_all_but_the_latest_turns() {
        let mut fields = run(3);
        let applied = apply(
            &mut fields,
            &[json!({"type": CLEAR_THINKING, "keep": {"type": "thinking_turns", "value": 1}})],
            &chars,
        );
        assert_eq!(applied[0]["cleared_thinking_turns"], 2);
        let thinking: Vec<usize> = fields["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| blocks(m).iter().filter(|b| b["type"] == "thinking").count())
            .collect();
        assert_eq!(thinking, [0, 0, 0, 0, 0, 1, 0]);
        let mut all = run(3);
        assert!(apply(
            &mut all,
            &[json!({"type": CLEAR_THINKING, "keep": "all"})],
            &chars
        )
        .is_empty());
    }

    #[test]
    fn the_edits_are_taken_out_and_the_rest_stays() {
        let mut fields = json!({"context_management": {"edits": [{"type": CLEAR_THINKING}, {"type": "compact_20260112"}, {"type": CLEAR_TOOL_USES}]}})
            .as_object()
            .unwrap()
            .clone();
        let taken = take_clearing_edits(&mut fields);
        assert_eq!(taken.len(), 2);
        assert_eq!(
            fields["context_management"]["edits"],
            json!([{"type": "compact_20260112"}])
        );
    }
}
