//! The `clear_tool_outputs` stage: old tool outputs replaced by a short placeholder that names
//! the tool and the size, with no LLM call. Masking old observations alone matches an LLM
//! summary on agent benchmarks at about half the cost (JetBrains, "The Complexity Trap").
//!
//! Pure and deterministic: a message clears to the same bytes on every turn (only the output
//! values change; every other byte of the message is kept), so a cleared prefix stays
//! byte-identical for the provider's prompt cache. Digests are taken from the original
//! messages, so clearing never moves a cached summary's key.

use std::collections::HashMap;

use crate::compaction::planner::conversation::Dialect;
use crate::compaction::planner::conversation::{value_tokens, Conversation, Message};
use crate::compaction::planner::tokens::TokenModel;

/// One message with some of its tool outputs replaced.
#[derive(Debug, Clone, PartialEq)]
pub struct ClearedMessage {
    /// The message's JSON, each cleared output replaced by its placeholder string.
    pub copy: String,
    /// Tokens of the copy.
    pub tokens: u64,
    /// Outputs replaced in it.
    pub outputs: usize,
}

/// The cleared messages of one request, by index, in order.
pub type Cleared = Vec<(usize, ClearedMessage)>;

/// The text an output is replaced with: what a model needs to know to fetch it again.
pub fn placeholder(tool: &str, tokens: u64) -> String {
    let tool = if tool.is_empty() { "a tool" } else { tool };
    format!(
        "[compactor cleared this output of {tool} (about {tokens} tokens) to save context; call the tool again if it is needed]"
    )
}

/// In each message at `candidates`, every tool output of at least `min_tokens` tokens replaced
/// by its placeholder; messages with no such output are left out.
pub fn clear_outputs(
    conversation: &Conversation<'_>,
    candidates: impl Iterator<Item = usize>,
    min_tokens: u64,
    model: &TokenModel,
) -> Cleared {
    let names = call_names(&conversation.messages);
    candidates
        .filter_map(|i| {
            let message = conversation.messages.get(i)?;
            cleared_copy(message, &names, min_tokens, model, conversation.dialect).map(|c| (i, c))
        })
        .collect()
}

/// Each call id's tool name.
fn call_names<'m>(messages: &'m [Message<'_>]) -> HashMap<&'m str, &'m str> {
    messages
        .iter()
        .flat_map(|m| m.tool_calls.iter())
        .map(|call| (call.id.as_ref(), call.name.as_ref()))
        .collect()
}

fn cleared_copy(
    message: &Message<'_>,
    names: &HashMap<&str, &str>,
    min_tokens: u64,
    model: &TokenModel,
    dialect: &dyn Dialect,
) -> Option<ClearedMessage> {
    let raw = message.raw.get();
    let base = raw.as_ptr() as usize;
    let mut copy = String::with_capacity(raw.len());
    let mut at = 0;
    let mut outputs = 0;
    for output in &message.tool_outputs {
        let value = output.value.get();
        let tokens = value_tokens(value, message.dialect, model);
        let start = (value.as_ptr() as usize).checked_sub(base)?;
        if tokens < min_tokens || start < at || start + value.len() > raw.len() {
            continue;
        }
        let tool = names.get(output.call_id.as_ref()).copied().unwrap_or("");
        copy.push_str(&raw[at..start]);
        copy.push_str(&serde_json::to_string(&placeholder(tool, tokens)).ok()?);
        at = start + value.len();
        outputs += 1;
    }
    if outputs == 0 {
        return None;
    }
    copy.push_str(&raw[at..]);
    let tokens = dialect.parse_message(&copy)?.tokens(model);
    Some(ClearedMessage {
        copy,
        tokens,
        outputs,
    })
}

#[cfg(test)]
mod tests {
    use crate::apis::{chat, messages, responses};
    use serde_json::json;

    use super::*;
    use crate::apis::Parsed;

    fn chat(messages: serde_json::Value) -> String {
        json!({"model": "m", "messages": messages}).to_string()
    }

    #[test]
    fn a_large_output_becomes_a_placeholder_and_every_other_byte_stays() {
        let body = chat(json!([
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "x".repeat(4000), "x-extra": 1},
            {"role": "tool", "tool_call_id": "c1", "content": "small"},
        ]));
        let conversation = chat::parse(body.as_bytes()).unwrap();
        let model = TokenModel::default();
        let cleared = clear_outputs(&conversation, 0..4, 100, &model);
        assert_eq!(cleared.len(), 1, "only the large output is cleared");
        let (index, message) = &cleared[0];
        assert_eq!(*index, 2);
        let value: serde_json::Value = serde_json::from_str(&message.copy).unwrap();
        assert_eq!(value["tool_call_id"], "c1");
        assert_eq!(value["x-extra"], 1);
        let text = value["content"].as_str().unwrap();
        assert!(
            text.contains("read_file") && text.contains("1000 tokens"),
            "{text}"
        );
        assert!(message.tokens < 60, "{}", message.tokens);
        // Deterministic: the same message clears to the same bytes.
        assert_eq!(clear_outputs(&conversation, 0..4, 100, &model), cleared);
    }

    #[test]
    fn anthropic_results_and_responses_outputs_clear_in_place() {
        let body = json!({"model": "claude-x", "max_tokens": 10, "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}, {"type": "tool_use", "id": "t2", "name": "Grep", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "y".repeat(4000)},
                {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "z".repeat(4000)}]},
                {"type": "text", "text": "and then?"}]},
        ]})
        .to_string();
        let Parsed::Conversation(conversation) = messages::parse(body.as_bytes()).unwrap() else {
            panic!("planned");
        };
        let cleared = clear_outputs(&conversation, 0..3, 100, &TokenModel::default());
        assert_eq!(cleared.len(), 1);
        assert_eq!(cleared[0].1.outputs, 2);
        let copy: serde_json::Value = serde_json::from_str(&cleared[0].1.copy).unwrap();
        assert!(copy["content"][0]["content"]
            .as_str()
            .unwrap()
            .contains("Read"));
        assert!(copy["content"][1]["content"]
            .as_str()
            .unwrap()
            .contains("Grep"));
        assert_eq!(copy["content"][2]["text"], "and then?");

        let body = json!({"model": "m", "input": [
            {"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "a", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "output": "o".repeat(4000)},
        ]})
        .to_string();
        let Parsed::Conversation(conversation) = responses::parse(body.as_bytes()).unwrap() else {
            panic!("planned");
        };
        let cleared = clear_outputs(&conversation, 0..3, 100, &TokenModel::default());
        let copy: serde_json::Value = serde_json::from_str(&cleared[0].1.copy).unwrap();
        assert_eq!(copy["type"], "function_call_output");
        assert!(copy["output"].as_str().unwrap().contains("shell"));
    }
}
