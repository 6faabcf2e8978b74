//! The mock's Anthropic Messages API (`POST …/messages`): a `message` object or a typed event
//! stream (`event: message_start` … `event: message_stop`), errors in Anthropic's shape, and
//! Anthropic's structural checks on `messages`.

use bytes::Bytes;
use serde_json::{json, Value};

/// `{"type":"error","error":{"type","message"}}`.
pub fn error_body(error_type: &str, message: &str) -> String {
    json!({"type": "error", "error": {"type": error_type, "message": message}}).to_string()
}

/// Anthropic's error type for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 | 503 => "overloaded_error",
        _ => "api_error",
    }
}

/// The signature the mock gives a thinking text: a thinking block whose signature does not
/// match its text was modified, which Anthropic refuses in the latest assistant turn.
pub fn thinking_signature(thinking: &str) -> String {
    format!("sig{:016x}", crate::fnv1a(thinking.as_bytes()))
}

/// What the mock answers: text, or a call of the first tool.
pub enum Reply {
    Text(String),
    ToolUse { name: String, input: Value },
}

/// A call to the first tool unless the last message carries tool results (then the first
/// result's text); a greeting without tools.
pub fn chat_reply(request: &Value) -> Reply {
    let last_content = request
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .and_then(|m| m.get("content"));
    let first_result = last_content
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|block| block.get("type").and_then(Value::as_str) == Some("tool_result"));
    if let Some(result) = first_result {
        let text = match result.get("content") {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Array(blocks)) => blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect(),
            _ => String::new(),
        };
        return Reply::Text(format!("The tool said: {text}"));
    }
    let first_tool = request
        .get("tools")
        .and_then(Value::as_array)
        .and_then(|tools| tools.first())
        .and_then(|tool| tool.get("name"))
        .and_then(Value::as_str);
    match first_tool {
        Some(name) => Reply::ToolUse {
            name: name.to_string(),
            input: json!({"city": "Paris"}),
        },
        None => Reply::Text("Hello from the mock upstream.".into()),
    }
}

fn usage(request: &Value, output_chars: usize) -> Value {
    let input = request
        .get("messages")
        .map(|m| m.to_string().len() / 4)
        .unwrap_or(0);
    json!({"input_tokens": input, "output_tokens": (output_chars / 4).max(1)})
}

fn content_and_stop(reply: &Reply, id: &str) -> (Value, &'static str, usize) {
    match reply {
        Reply::Text(text) => (
            json!([{"type": "text", "text": text}]),
            "end_turn",
            text.len(),
        ),
        Reply::ToolUse { name, input } => (
            json!([{"type": "tool_use", "id": format!("toolu_{id}"), "name": name, "input": input}]),
            "tool_use",
            input.to_string().len(),
        ),
    }
}

pub fn message_json(id: &str, model: &str, reply: &Reply, request: &Value) -> Value {
    let (content, stop, chars) = content_and_stop(reply, id);
    json!({
        "id": format!("msg_{id}"), "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop, "stop_sequence": null,
        "usage": usage(request, chars),
    })
}

/// The typed stream of one message, its text or the call's input in `chunks` deltas.
pub fn message_events(
    id: &str,
    model: &str,
    reply: &Reply,
    request: &Value,
    chunks: usize,
) -> Vec<Bytes> {
    let event = |kind: &str, data: Value| Bytes::from(format!("event: {kind}\ndata: {data}\n\n"));
    let (_, stop, chars) = content_and_stop(reply, id);
    let mut start_usage = usage(request, 0);
    start_usage["output_tokens"] = json!(1);
    let mut events = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": format!("msg_{id}"), "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null, "usage": start_usage}}),
    )];
    let (block, deltas): (Value, Vec<Value>) = match reply {
        Reply::Text(text) => (
            json!({"type": "text", "text": ""}),
            crate::split_text(text, chunks)
                .into_iter()
                .map(|piece| json!({"type": "text_delta", "text": piece}))
                .collect(),
        ),
        Reply::ToolUse { name, input } => (
            json!({"type": "tool_use", "id": format!("toolu_{id}"), "name": name, "input": {}}),
            crate::split_text(&input.to_string(), chunks)
                .into_iter()
                .map(|piece| json!({"type": "input_json_delta", "partial_json": piece}))
                .collect(),
        ),
    };
    events.push(event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": block}),
    ));
    events.push(event("ping", json!({"type": "ping"})));
    for delta in deltas {
        events.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        ));
    }
    events.push(event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
               "usage": {"output_tokens": (chars / 4).max(1)}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    events
}

fn blocks(message: &Value) -> &[Value] {
    message
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn kind(block: &Value) -> &str {
    block.get("type").and_then(Value::as_str).unwrap_or("")
}

/// Every object under `value` with a non-null `cache_control`.
fn breakpoints(value: &Value) -> usize {
    match value {
        Value::Object(map) => {
            let own = map.get("cache_control").is_some_and(|c| !c.is_null()) as usize;
            own + map
                .iter()
                .filter(|(key, _)| key.as_str() != "cache_control")
                .map(|(_, v)| breakpoints(v))
                .sum::<usize>()
        }
        Value::Array(items) => items.iter().map(breakpoints).sum(),
        _ => 0,
    }
}

/// Anthropic's checks on `context_management`: known edit types only, and thinking edits only
/// when thinking is on.
fn validate_context_management(request: &Value) -> Result<(), String> {
    let Some(management) = request.get("context_management") else {
        return Ok(());
    };
    let edits = management
        .get("edits")
        .and_then(Value::as_array)
        .ok_or("context_management.edits: Field required")?;
    let thinking = matches!(
        request.pointer("/thinking/type").and_then(Value::as_str),
        Some("enabled" | "adaptive")
    );
    for (i, edit) in edits.iter().enumerate() {
        let kind = edit.get("type").and_then(Value::as_str).unwrap_or("");
        let known = ["clear_tool_uses_", "clear_thinking_", "compact_"]
            .iter()
            .any(|prefix| kind.starts_with(prefix));
        if !known {
            return Err(format!(
                "context_management.edits.{i}.type: unknown edit type '{kind}'"
            ));
        }
        if kind.starts_with("clear_thinking_") && !thinking {
            return Err(format!("context_management.edits.{i}: clear_thinking requires thinking to be enabled or adaptive"));
        }
    }
    Ok(())
}

/// What an Anthropic-compatible server without Anthropic's context management refuses: any
/// `context_management` edit (compaction or clearing) and a `compaction` block.
pub fn without_compaction(request: &Value) -> Result<(), String> {
    if request.get("context_management").is_some() {
        return Err("context_management: Extra inputs are not permitted".into());
    }
    let messages = request.get("messages").and_then(Value::as_array);
    for (m, message) in messages.into_iter().flatten().enumerate() {
        let blocks = message.get("content").and_then(Value::as_array);
        for (b, block) in blocks.into_iter().flatten().enumerate() {
            if block.get("type").and_then(Value::as_str) == Some("compaction") {
                return Err(format!(
                    "messages.{m}.content.{b}.type: unknown content block type 'compaction'"
                ));
            }
        }
    }
    Ok(())
}

/// Anthropic's checks on a Messages request: a non-empty `messages` starting with a user turn
/// and alternating roles; every `tool_use` answered by a `tool_result` in the next message and
/// every `tool_result` answering a `tool_use` of the previous one, results before any other
/// block; at most 4 `cache_control` breakpoints; the latest assistant turn's thinking blocks
/// unmodified. Err carries the message.
pub fn validate(request: &Value) -> Result<(), String> {
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        return Err("messages: Field required".into());
    };
    if messages.is_empty() {
        return Err("messages: at least one message is required".into());
    }
    validate_context_management(request)?;
    let mut previous_role = "";
    let mut pending: Vec<&str> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        // A system turn inside `messages` (Claude Code sends one, with its per-turn-control
        // beta) is an instruction between turns: it takes no part in the alternation.
        if role == "system" && !previous_role.is_empty() && pending.is_empty() {
            continue;
        }
        if !matches!(role, "user" | "assistant") {
            return Err(format!(
                "messages.{i}.role: Input should be 'user' or 'assistant'"
            ));
        }
        if previous_role.is_empty() && role != "user" {
            return Err("messages: first message must use the \"user\" role".into());
        }
        if role == previous_role {
            return Err(format!("messages: roles must alternate between \"user\" and \"assistant\", but found multiple \"{role}\" roles in a row"));
        }
        let mut results: Vec<&str> = Vec::new();
        let mut seen_other = false;
        for (k, block) in blocks(message).iter().enumerate() {
            match kind(block) {
                "tool_result" if role == "user" => {
                    if seen_other {
                        return Err(format!("messages.{i}.content.{k}: tool_result blocks must come first in the content of a user message, before any other block"));
                    }
                    let id = block
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    if !pending.contains(&id) {
                        return Err(format!("messages.{i}.content.{k}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."));
                    }
                    results.push(id);
                }
                _ => seen_other = true,
            }
        }
        if !pending.is_empty() {
            let missing: Vec<&str> = pending
                .iter()
                .copied()
                .filter(|id| !results.contains(id))
                .collect();
            if !missing.is_empty() {
                return Err(format!("messages.{}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.", i - 1, missing.join(", ")));
            }
        }
        pending = if role == "assistant" {
            blocks(message)
                .iter()
                .filter(|block| kind(block) == "tool_use")
                .filter_map(|block| block.get("id").and_then(Value::as_str))
                .collect()
        } else {
            Vec::new()
        };
        previous_role = role;
    }
    let count: usize = ["tools", "system", "messages"]
        .iter()
        .filter_map(|key| request.get(key))
        .map(breakpoints)
        .sum();
    if count > 4 {
        return Err(format!(
            "A maximum of 4 blocks with cache_control may be provided. Found {count}."
        ));
    }
    if let Some((i, latest)) = messages
        .iter()
        .enumerate()
        .rev()
        .find(|(_, m)| m.get("role").and_then(Value::as_str) == Some("assistant"))
    {
        for (k, block) in blocks(latest).iter().enumerate() {
            if kind(block) != "thinking" {
                continue;
            }
            let thinking = block.get("thinking").and_then(Value::as_str).unwrap_or("");
            let signature = block.get("signature").and_then(Value::as_str).unwrap_or("");
            if signature != thinking_signature(thinking) {
                return Err(format!(
                    "messages.{i}.content.{k}: Invalid `signature` in `thinking` block"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(messages: Value) -> String {
        validate(&json!({"model": "m", "max_tokens": 8, "messages": messages})).unwrap_err()
    }

    #[test]
    fn validation_follows_anthropic_rules() {
        let thinking =
            json!({"type": "thinking", "thinking": "t", "signature": thinking_signature("t")});
        let ok = json!({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [thinking, {"type": "tool_use", "id": "a", "name": "f", "input": {}}, {"type": "tool_use", "id": "b", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "b", "content": "rb"}, {"type": "tool_result", "tool_use_id": "a", "content": "ra"}, {"type": "text", "text": "more"}]},
        ]});
        assert_eq!(validate(&ok), Ok(()));
        assert!(error(json!([{"role": "assistant", "content": "a"}])).contains("first message"));
        assert!(
            error(json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]))
                .contains("alternate")
        );
        assert!(error(json!([
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
            {"role": "user", "content": "no result"}]))
        .contains("without `tool_result` blocks immediately after: a"));
        assert!(error(json!([
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "r"}]}]))
        .contains("unexpected `tool_use_id`"));
        assert!(error(json!([
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "tool_result", "tool_use_id": "a", "content": "r"}]}]))
        .contains("must come first"));
        let cached = json!({"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}});
        assert!(error(
            json!([{"role": "user", "content": [cached, cached, cached, cached, cached]}])
        )
        .contains("maximum of 4"));
        assert!(error(json!([
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "changed", "signature": thinking_signature("t")}]}]))
        .contains("Invalid `signature`"));
    }

    #[test]
    fn system_turns_and_context_edits_follow_claude_codes_use() {
        let messages = json!([
            {"role": "user", "content": "q"},
            {"role": "system", "content": "# Environment"},
            {"role": "assistant", "content": "a"},
        ]);
        let request = |extra: Value| {
            let mut request = json!({"model": "m", "max_tokens": 8, "messages": messages});
            if let (Some(r), Some(e)) = (request.as_object_mut(), extra.as_object()) {
                r.extend(e.clone());
            }
            validate(&request)
        };
        assert_eq!(request(json!({})), Ok(()));
        assert!(error(
            json!([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}])
        )
        .contains("Input should be"));
        assert!(error(json!([{"role": "user", "content": "q"}, {"role": "system", "content": "s"}, {"role": "user", "content": "again"}]))
            .contains("alternate"));
        let clear = json!({"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}});
        assert!(request(clear.clone())
            .unwrap_err()
            .contains("requires thinking"));
        let mut thinking = clear;
        thinking["thinking"] = json!({"type": "adaptive"});
        assert_eq!(request(thinking), Ok(()));
        assert!(
            request(json!({"context_management": {"edits": [{"type": "forget_everything"}]}}))
                .unwrap_err()
                .contains("unknown edit type")
        );
    }
}
