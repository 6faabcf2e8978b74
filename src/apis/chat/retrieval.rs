//! Lookups (`summarization.retrieval`) on chat completions: the tool as a function, the
//! model's calls read from `choices[0].message.tool_calls` or from the chunks' `tool_calls`
//! deltas, and the final answer given as the first round's message.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::retrieval::{
    appended, ref_schema, reference_in, with_first_member, Call, CallRead, Part, StreamRounds,
    Turn, Usage, Wire, TOOL_DESCRIPTION,
};
use crate::served::splice::Event;

pub struct ChatRetrieval;

#[derive(Deserialize)]
struct Offer<'a> {
    #[serde(default)]
    n: Option<u64>,
    #[serde(borrow, default)]
    tool_choice: Option<&'a RawValue>,
    #[serde(borrow, default)]
    functions: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: &'a RawValue,
}

fn tool_json(tool: &str) -> String {
    json!({"type": "function", "function": {
        "name": tool,
        "description": TOOL_DESCRIPTION,
        "parameters": ref_schema(),
    }})
    .to_string()
}

/// A message's text: its string content, or its text parts joined.
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn calls_of(message: &Value) -> Vec<(String, String, String)> {
    message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|call| {
                    let field = |key: &str| {
                        call.pointer(key)
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string()
                    };
                    (
                        field("/id"),
                        field("/function/name"),
                        field("/function/arguments"),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

impl Wire for ChatRetrieval {
    fn parts(&self, messages: &[(&str, Value)]) -> Vec<Part> {
        let mut taken = vec![false; messages.len()];
        let mut parts = Vec::new();
        for i in 0..messages.len() {
            if taken[i] {
                continue;
            }
            taken[i] = true;
            let (raw, message) = &messages[i];
            let role = message.get("role").and_then(Value::as_str).unwrap_or("");
            let content = text_of(message.get("content"));
            let calls = calls_of(message);
            if calls.is_empty() {
                parts.push(Part::message(raw, role, &content));
                continue;
            }
            let mut raw_all = raw.to_string();
            let mut read = Vec::new();
            for (id, name, arguments) in &calls {
                let answering = (i + 1..messages.len()).find(|&j| {
                    !taken[j]
                        && messages[j].1.get("tool_call_id").and_then(Value::as_str)
                            == Some(id.as_str())
                });
                let output = answering.map(|j| {
                    taken[j] = true;
                    raw_all.push_str(messages[j].0);
                    text_of(messages[j].1.get("content"))
                });
                read.push(CallRead {
                    name,
                    arguments,
                    output,
                });
            }
            parts.push(Part::calls(raw_all, (role, &content), &read));
        }
        parts
    }

    fn offers(&self, body: &[u8]) -> bool {
        let Ok(offer) = serde_json::from_slice::<Offer>(body) else {
            return false;
        };
        let choice_ok = match offer.tool_choice.map(|raw| raw.get().trim()) {
            None | Some("\"auto\"") | Some("\"required\"") | Some("null") => true,
            Some(_) => false,
        };
        let tools_ok = offer
            .tools
            .is_none_or(|raw| raw.get().trim_start().starts_with('['));
        offer.n.unwrap_or(1) == 1
            && choice_ok
            && tools_ok
            && offer.functions.is_none()
            && offer.messages.get().trim_start().starts_with('[')
    }

    fn with_tool(&self, body: &[u8], tool: &str) -> Option<Vec<u8>> {
        let offer: Offer = serde_json::from_slice(body).ok()?;
        match offer.tools {
            Some(tools) => appended(body, tools, &tool_json(tool)),
            None => with_first_member(body, "tools", &format!("[{}]", tool_json(tool))),
        }
    }

    fn with_turn(&self, body: &[u8], tool: &str, turn: &Turn) -> Option<Vec<u8>> {
        let offer: Offer = serde_json::from_slice(body).ok()?;
        let calls: Vec<Value> = turn
            .calls
            .iter()
            .map(|call| {
                json!({"id": call.id, "type": "function",
                       "function": {"name": tool, "arguments": call.arguments}})
            })
            .collect();
        // A string, empty or not: OpenAI takes null beside tool calls, llama-cpp-python's
        // server refuses it (500).
        let content = Value::String(turn.said.clone());
        let mut items =
            vec![json!({"role": "assistant", "content": content, "tool_calls": calls}).to_string()];
        for (call, answer) in turn.calls.iter().zip(&turn.answers) {
            items.push(
                json!({"role": "tool", "tool_call_id": call.id, "content": answer}).to_string(),
            );
        }
        appended(body, offer.messages, &items.join(","))
    }

    fn lookups(&self, answer: &Value, tool: &str) -> Turn {
        let Some(message) = answer.pointer("/choices/0/message") else {
            return Turn::default();
        };
        let calls = calls_of(message)
            .into_iter()
            .filter(|(_, name, _)| name == tool)
            .map(|(id, _, arguments)| Call {
                reference: reference_in(&arguments),
                id,
                arguments,
            })
            .collect();
        Turn {
            said: text_of(message.get("content")),
            calls,
            ..Turn::default()
        }
    }

    fn add_usage(&self, answer: &Value, usage: &mut Usage) {
        usage.add(answer.get("usage"), "prompt_tokens", "completion_tokens");
    }

    fn merged(
        &self,
        first: &Value,
        said: &str,
        mut last: Value,
        usage: &Usage,
        tool: &str,
    ) -> Value {
        for key in ["id", "created"] {
            if let Some(value) = first.get(key) {
                last[key] = value.clone();
            }
        }
        if let Some(message) = last.pointer_mut("/choices/0/message") {
            if !said.is_empty() {
                let own = text_of(message.get("content"));
                message["content"] = Value::String(format!("{said}{own}"));
            }
            let left = without_tool(message, tool);
            if left == Some(0) {
                if let Some(choice) = last.pointer_mut("/choices/0") {
                    choice["finish_reason"] = Value::from("stop");
                }
            }
        }
        if usage.seen {
            last["usage"] = usage_json(usage, last.get("usage"));
        }
        last
    }

    fn stream(&self, tool: &str) -> Box<dyn StreamRounds> {
        Box::new(ChatStream {
            tool: tool.to_string(),
            ..ChatStream::default()
        })
    }
}

/// `message` without calls to `tool`; how many calls are left, when it had any to drop.
fn without_tool(message: &mut Value, tool: &str) -> Option<usize> {
    let calls = message.get_mut("tool_calls")?.as_array_mut()?;
    let before = calls.len();
    calls.retain(|call| call.pointer("/function/name").and_then(Value::as_str) != Some(tool));
    if calls.len() == before {
        return None;
    }
    let left = calls.len();
    if left == 0 {
        if let Some(object) = message.as_object_mut() {
            object.remove("tool_calls");
        }
    }
    Some(left)
}

fn usage_json(usage: &Usage, last: Option<&Value>) -> Value {
    usage.json(last, ["prompt_tokens", "completion_tokens", "total_tokens"])
}

/// One tool call as its deltas build it.
#[derive(Default)]
struct StreamedCall {
    id: String,
    name: String,
    arguments: String,
}

/// The chunks of a streamed answer across rounds: content goes to the client as it comes (as
/// the first round's chunks); tool-call chunks, the finish, the usage and `[DONE]` are held
/// until the round ends, since a lookup may be among the calls.
#[derive(Default)]
struct ChatStream {
    tool: String,
    /// The first round's `id` and `created`, which every chunk the client gets carries.
    first: Option<(Value, Value)>,
    rounds: usize,
    /// Whether the client has had the message's `role` (a held chunk may have carried it).
    role_sent: bool,
    said: String,
    held_calls: Vec<Value>,
    calls: BTreeMap<u64, StreamedCall>,
    finish: Option<Value>,
    usage_chunk: Option<Value>,
    usage: Usage,
    done: Option<Vec<u8>>,
}

impl ChatStream {
    /// A chunk as the client gets it: the first round's id and creation time; the role once.
    fn as_first(&mut self, mut chunk: Value) -> Value {
        if self.rounds > 0 {
            if let Some((id, created)) = &self.first {
                chunk["id"] = id.clone();
                chunk["created"] = created.clone();
            }
        }
        if let Some(delta) = chunk
            .pointer_mut("/choices/0/delta")
            .and_then(Value::as_object_mut)
        {
            if delta.contains_key("role") {
                if self.role_sent {
                    delta.remove("role");
                }
                self.role_sent = true;
            }
        }
        chunk
    }

    fn write(&mut self, chunk: Value, out: &mut Vec<u8>) {
        let chunk = self.as_first(chunk);
        out.extend_from_slice(format!("data: {chunk}\n\n").as_bytes());
    }

    /// What was held, as the final answer: calls to the tool dropped, the rest renumbered.
    fn flush(&mut self, out: &mut Vec<u8>) {
        let dropped: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, call)| call.name == self.tool)
            .map(|(index, _)| *index)
            .collect();
        let kept: Vec<u64> = self
            .calls
            .keys()
            .filter(|index| !dropped.contains(index))
            .copied()
            .collect();
        for mut chunk in std::mem::take(&mut self.held_calls) {
            let Some(delta) = chunk
                .pointer_mut("/choices/0/delta")
                .and_then(Value::as_object_mut)
            else {
                continue;
            };
            if let Some(deltas) = delta.get_mut("tool_calls").and_then(Value::as_array_mut) {
                deltas.retain(|d| {
                    !dropped.contains(&d.get("index").and_then(Value::as_u64).unwrap_or(0))
                });
                for call in deltas.iter_mut() {
                    let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
                    let renumbered = kept.iter().position(|&k| k == index).unwrap_or(0);
                    call["index"] = Value::from(renumbered);
                }
                if deltas.is_empty() {
                    delta.remove("tool_calls");
                    // The chunk that carried only a dropped call may still carry the role.
                    if !delta.contains_key("role") {
                        continue;
                    }
                }
            }
            self.write(chunk, out);
        }
        if let Some(mut finish) = self.finish.take() {
            if kept.is_empty() && !dropped.is_empty() {
                finish["choices"][0]["finish_reason"] = Value::from("stop");
            }
            if self.usage_chunk.is_none() && finish.get("usage").is_some_and(Value::is_object) {
                finish["usage"] = usage_json(&self.usage, finish.get("usage"));
            }
            self.write(finish, out);
        }
        if let Some(mut chunk) = self.usage_chunk.take() {
            chunk["usage"] = usage_json(&self.usage, chunk.get("usage"));
            self.write(chunk, out);
        }
        if let Some(done) = self.done.take() {
            out.extend_from_slice(&done);
        }
    }
}

impl StreamRounds for ChatStream {
    fn event(&mut self, event: Event<'_>, out: &mut Vec<u8>) {
        let mut chunk = event.data;
        if chunk.get("choices").is_none() {
            // Not a chunk (compactor's notice, an error): as it came.
            out.extend_from_slice(event.raw);
            return;
        }
        if self.first.is_none() {
            let field = |key: &str| chunk.get(key).cloned().unwrap_or(Value::Null);
            self.first = Some((field("id"), field("created")));
        }
        self.usage
            .add(chunk.get("usage"), "prompt_tokens", "completion_tokens");
        let Some(choice) = chunk.pointer("/choices/0").cloned() else {
            self.usage_chunk = Some(chunk);
            return;
        };
        if let Some(content) = choice.pointer("/delta/content").and_then(Value::as_str) {
            self.said.push_str(content);
        }
        if let Some(deltas) = choice
            .pointer("/delta/tool_calls")
            .and_then(Value::as_array)
        {
            for delta in deltas {
                let index = delta.get("index").and_then(Value::as_u64).unwrap_or(0);
                let call = self.calls.entry(index).or_default();
                let field = |key: &str| delta.pointer(key).and_then(Value::as_str);
                if let Some(id) = field("/id") {
                    call.id.push_str(id);
                }
                if let Some(name) = field("/function/name") {
                    call.name.push_str(name);
                }
                if let Some(arguments) = field("/function/arguments") {
                    call.arguments.push_str(arguments);
                }
            }
            self.held_calls.push(chunk);
            return;
        }
        if choice.get("finish_reason").is_some_and(|f| !f.is_null()) {
            let has_content = choice
                .pointer("/delta/content")
                .and_then(Value::as_str)
                .is_some_and(|c| !c.is_empty());
            if has_content {
                let mut said = chunk.clone();
                said["choices"][0]["finish_reason"] = Value::Null;
                if let Some(object) = said.as_object_mut() {
                    object.remove("usage");
                }
                self.write(said, out);
                chunk["choices"][0]["delta"] = json!({});
            }
            self.finish = Some(chunk);
            return;
        }
        self.write(chunk, out);
    }

    fn pass(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        let done = std::str::from_utf8(raw)
            .is_ok_and(|text| text.lines().any(|line| line.trim() == "data: [DONE]"));
        if done {
            self.done = Some(raw.to_vec());
        } else {
            out.extend_from_slice(raw);
        }
    }

    fn end(&mut self, may_expand: bool, out: &mut Vec<u8>) -> Turn {
        let lookups: Vec<Call> = self
            .calls
            .values()
            .filter(|call| call.name == self.tool)
            .map(|call| Call {
                id: call.id.clone(),
                reference: reference_in(&call.arguments),
                arguments: call.arguments.clone(),
            })
            .collect();
        let said = std::mem::take(&mut self.said);
        if lookups.is_empty() || !may_expand {
            self.flush(out);
            return Turn::default();
        }
        // The round's other calls, its finish and its usage chunk are the follow-up's to give.
        self.held_calls.clear();
        self.calls.clear();
        self.finish = None;
        self.usage_chunk = None;
        self.done = None;
        self.rounds += 1;
        Turn {
            said,
            calls: lookups,
            ..Turn::default()
        }
    }
}

#[cfg(test)]
mod tests;
