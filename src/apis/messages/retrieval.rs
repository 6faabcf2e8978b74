//! Lookups (`summarization.retrieval`) on Anthropic's Messages API: the tool as a client tool
//! (`name`, `description`, `input_schema`), the model's calls read from its `tool_use` blocks,
//! answered in a user turn of `tool_result` blocks. The assistant turn goes back as the model
//! wrote it up to its lookups, thinking blocks and their signatures included (Anthropic refuses
//! a tool result after a thinking turn that lost them). Streamed, text and thinking blocks reach
//! the client as they come, renumbered so its indexes stay contiguous; `tool_use` blocks,
//! `message_delta` and `message_stop` are held to the round's end.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::retrieval::{
    appended, ref_schema, with_first_member, Call, CallRead, Part, StreamRounds, Turn, Usage, Wire,
    TOOL_DESCRIPTION,
};
use crate::served::splice::{write_event, Event};

pub struct MessagesRetrieval;

#[derive(Deserialize)]
struct Offer<'a> {
    #[serde(borrow, default)]
    tool_choice: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: &'a RawValue,
}

fn tool_json(tool: &str) -> String {
    json!({"name": tool, "description": TOOL_DESCRIPTION, "input_schema": ref_schema()}).to_string()
}

/// The text of a content: a string, or its text blocks (a tool result's too) joined.
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|block| match block.get("type").and_then(Value::as_str) {
                Some("text") => block
                    .get("text")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                Some("tool_result") => Some(text_of(block.get("content"))),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn blocks_of<'v>(message: &'v Value, kind: &'v str) -> impl Iterator<Item = &'v Value> + 'v {
    message
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(move |block| block.get("type").and_then(Value::as_str) == Some(kind))
}

fn field<'v>(value: &'v Value, key: &str) -> &'v str {
    value.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn lookup_of(block: &Value) -> Call {
    let input = block.get("input").cloned().unwrap_or(Value::Null);
    Call {
        id: field(block, "id").to_string(),
        reference: input
            .get("ref")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        arguments: input.to_string(),
    }
}

impl Wire for MessagesRetrieval {
    fn parts(&self, messages: &[(&str, Value)]) -> Vec<Part> {
        let mut taken = vec![false; messages.len()];
        let mut parts = Vec::new();
        for i in 0..messages.len() {
            if taken[i] {
                continue;
            }
            taken[i] = true;
            let (raw, message) = &messages[i];
            let role = field(message, "role");
            let content = text_of(message.get("content"));
            let uses: Vec<&Value> = blocks_of(message, "tool_use").collect();
            if uses.is_empty() {
                parts.push(Part::message(raw, role, &content));
                continue;
            }
            let mut raw_all = raw.to_string();
            let inputs: Vec<String> = uses
                .iter()
                .map(|block| block.get("input").map(Value::to_string).unwrap_or_default())
                .collect();
            let mut read = Vec::new();
            for (block, arguments) in uses.iter().zip(&inputs) {
                let (id, name) = (field(block, "id"), field(block, "name"));
                let answering = (i + 1..messages.len()).find(|&j| {
                    blocks_of(&messages[j].1, "tool_result").any(|r| field(r, "tool_use_id") == id)
                });
                let output = answering.map(|j| {
                    if !taken[j] {
                        taken[j] = true;
                        raw_all.push_str(messages[j].0);
                    }
                    blocks_of(&messages[j].1, "tool_result")
                        .filter(|r| field(r, "tool_use_id") == id)
                        .map(|r| text_of(r.get("content")))
                        .collect()
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
        let choice_ok = match offer.tool_choice {
            None => true,
            Some(raw) => serde_json::from_str::<Value>(raw.get()).is_ok_and(|choice| {
                matches!(
                    choice.get("type").and_then(Value::as_str),
                    Some("auto" | "any")
                )
            }),
        };
        let tools_ok = offer
            .tools
            .is_none_or(|raw| raw.get().trim_start().starts_with('['));
        choice_ok && tools_ok && offer.messages.get().trim_start().starts_with('[')
    }

    fn with_tool(&self, body: &[u8], tool: &str) -> Option<Vec<u8>> {
        let offer: Offer = serde_json::from_slice(body).ok()?;
        match offer.tools {
            Some(tools) => appended(body, tools, &tool_json(tool)),
            None => with_first_member(body, "tools", &format!("[{}]", tool_json(tool))),
        }
    }

    fn with_turn(&self, body: &[u8], _tool: &str, turn: &Turn) -> Option<Vec<u8>> {
        let offer: Offer = serde_json::from_slice(body).ok()?;
        let assistant = json!({"role": "assistant", "content": turn.content});
        let results: Vec<Value> = turn
            .calls
            .iter()
            .zip(&turn.answers)
            .map(|(call, answer)| {
                json!({"type": "tool_result", "tool_use_id": call.id, "content": answer})
            })
            .collect();
        let user = json!({"role": "user", "content": results});
        appended(body, offer.messages, &format!("{assistant},{user}"))
    }

    fn lookups(&self, answer: &Value, tool: &str) -> Turn {
        let is_lookup =
            |block: &Value| field(block, "type") == "tool_use" && field(block, "name") == tool;
        let blocks = answer
            .get("content")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let calls: Vec<Call> = blocks
            .iter()
            .filter(|b| is_lookup(b))
            .map(lookup_of)
            .collect();
        if calls.is_empty() {
            return Turn::default();
        }
        // The client's own calls are asked for again after the lookup.
        let content = blocks
            .iter()
            .filter(|b| field(b, "type") != "tool_use" || is_lookup(b))
            .cloned()
            .collect();
        Turn {
            said: text_of(answer.get("content")),
            calls,
            content,
            answers: Vec::new(),
        }
    }

    fn add_usage(&self, answer: &Value, usage: &mut Usage) {
        usage.add(answer.get("usage"), "input_tokens", "output_tokens");
    }

    fn merged(
        &self,
        first: &Value,
        said: &str,
        mut last: Value,
        usage: &Usage,
        tool: &str,
    ) -> Value {
        if let Some(id) = first.get("id") {
            last["id"] = id.clone();
        }
        let mut content: Vec<Value> = Vec::new();
        if !said.is_empty() {
            content.push(json!({"type": "text", "text": said}));
        }
        let own = last
            .get("content")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let before = own.len();
        content.extend(
            own.into_iter()
                .filter(|b| !(field(b, "type") == "tool_use" && field(b, "name") == tool)),
        );
        let dropped = before + usize::from(!said.is_empty()) != content.len();
        let calls_left = content.iter().any(|b| field(b, "type") == "tool_use");
        if dropped && !calls_left {
            last["stop_reason"] = Value::from("end_turn");
        }
        last["content"] = Value::Array(content);
        if usage.seen {
            let mut own = last.get("usage").cloned().unwrap_or_else(|| json!({}));
            own["input_tokens"] = Value::from(usage.prompt);
            own["output_tokens"] = Value::from(usage.completion);
            last["usage"] = own;
        }
        last
    }

    fn failure(&self, _status: u16, message: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let data = json!({"type": "error", "error": {"type": "api_error", "message": message}});
        write_event(&mut out, Some("error"), &data);
        out
    }

    fn stream(&self, tool: &str) -> Box<dyn StreamRounds> {
        Box::new(MessagesStream {
            tool: tool.to_string(),
            ..MessagesStream::default()
        })
    }
}

/// One content block of the round, as its events build it.
#[derive(Default)]
struct Block {
    value: Value,
    /// Its events, when it is held (a `tool_use`).
    held: Vec<Value>,
    /// The client's index for it, once it has been given one.
    client_index: Option<u64>,
}

/// A streamed message across rounds: one `message_start` (the first round's), blocks
/// renumbered in the order the client gets them, one `message_delta` with the rounds' usage,
/// one `message_stop`.
#[derive(Default)]
struct MessagesStream {
    tool: String,
    started: bool,
    next_index: u64,
    blocks: BTreeMap<u64, Block>,
    delta: Option<Value>,
    stop: Option<Value>,
    /// Input tokens of the rounds (from their `message_start`), output tokens of the rounds
    /// before this one.
    input: u64,
    output_before: u64,
    output: u64,
    usage_seen: bool,
}

impl MessagesStream {
    fn emit(&mut self, mut data: Value, upstream_index: u64, out: &mut Vec<u8>) {
        let block = self.blocks.entry(upstream_index).or_default();
        let index = *block.client_index.get_or_insert_with(|| {
            let index = self.next_index;
            self.next_index += 1;
            index
        });
        data["index"] = Value::from(index);
        let kind = field(&data, "type").to_string();
        write_event(out, Some(&kind), &data);
    }

    fn flush(&mut self, out: &mut Vec<u8>) {
        let indexes: Vec<u64> = self.blocks.keys().copied().collect();
        let mut dropped = false;
        for upstream in indexes {
            let Some(block) = self.blocks.get_mut(&upstream) else {
                continue;
            };
            let held = std::mem::take(&mut block.held);
            if held.is_empty() {
                continue;
            }
            if field(&block.value, "name") == self.tool {
                dropped = true;
                continue;
            }
            for data in held {
                self.emit(data, upstream, out);
            }
        }
        let calls_left = self
            .blocks
            .values()
            .any(|b| field(&b.value, "type") == "tool_use" && field(&b.value, "name") != self.tool);
        if let Some(mut delta) = self.delta.take() {
            if dropped && !calls_left {
                delta["delta"]["stop_reason"] = Value::from("end_turn");
            }
            if self.usage_seen {
                let mut usage = delta.get("usage").cloned().unwrap_or_else(|| json!({}));
                usage["output_tokens"] = Value::from(self.output_before + self.output);
                if usage.get("input_tokens").is_some() {
                    usage["input_tokens"] = Value::from(self.input);
                }
                delta["usage"] = usage;
            }
            write_event(out, Some("message_delta"), &delta);
        }
        if let Some(stop) = self.stop.take() {
            write_event(out, Some("message_stop"), &stop);
        }
    }
}

impl StreamRounds for MessagesStream {
    fn event(&mut self, event: Event<'_>, out: &mut Vec<u8>) {
        let data = event.data;
        match event.kind.as_str() {
            "message_start" => {
                let usage = data.pointer("/message/usage");
                self.input += usage
                    .and_then(|u| u.get("input_tokens"))
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                self.usage_seen |= usage.is_some();
                if !self.started {
                    self.started = true;
                    out.extend_from_slice(event.raw);
                }
            }
            "content_block_start" | "content_block_delta" | "content_block_stop" => {
                let index = data.get("index").and_then(Value::as_u64).unwrap_or(0);
                let block = self.blocks.entry(index).or_default();
                if let Some(start) = data.get("content_block") {
                    block.value = start.clone();
                }
                if let Some(delta) = data.get("delta") {
                    accumulate(&mut block.value, delta);
                }
                if field(&block.value, "type") == "tool_use" {
                    block.held.push(data);
                } else {
                    self.emit(data, index, out);
                }
            }
            "message_delta" => {
                if let Some(output) = data.pointer("/usage/output_tokens").and_then(Value::as_u64) {
                    self.output = output;
                    self.usage_seen = true;
                }
                self.delta = Some(data);
            }
            "message_stop" => self.stop = Some(data),
            // `ping`, `error`, compactor's notice: as they came.
            _ => out.extend_from_slice(event.raw),
        }
    }

    fn pass(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(raw);
    }

    fn end(&mut self, may_expand: bool, out: &mut Vec<u8>) -> Turn {
        let lookups: Vec<Call> = self
            .blocks
            .values()
            .filter(|b| {
                field(&b.value, "type") == "tool_use" && field(&b.value, "name") == self.tool
            })
            .map(|b| lookup_of(&finished(&b.value)))
            .collect();
        if lookups.is_empty() || !may_expand {
            self.flush(out);
            return Turn::default();
        }
        let content: Vec<Value> = self
            .blocks
            .values()
            .filter(|b| {
                field(&b.value, "type") != "tool_use" || field(&b.value, "name") == self.tool
            })
            .map(|b| finished(&b.value))
            .collect();
        let said = content
            .iter()
            .filter(|b| field(b, "type") == "text")
            .map(|b| field(b, "text"))
            .collect();
        self.blocks.clear();
        self.delta = None;
        self.stop = None;
        self.output_before += self.output;
        self.output = 0;
        Turn {
            said,
            calls: lookups,
            content,
            answers: Vec::new(),
        }
    }
}

/// A block's value with what its deltas added.
fn accumulate(block: &mut Value, delta: &Value) {
    let mut append = |key: &str, piece: &str| {
        let now = field(block, key).to_string();
        block[key] = Value::from(now + piece);
    };
    match field(delta, "type") {
        "text_delta" => append("text", field(delta, "text")),
        "thinking_delta" => append("thinking", field(delta, "thinking")),
        "signature_delta" => append("signature", field(delta, "signature")),
        "input_json_delta" => append("partial_json", field(delta, "partial_json")),
        _ => {}
    }
}

/// A block as a message's content carries it: a `tool_use`'s streamed input parsed.
fn finished(block: &Value) -> Value {
    let mut block = block.clone();
    if let Some(object) = block.as_object_mut() {
        if let Some(partial) = object.remove("partial_json") {
            let text = partial.as_str().unwrap_or_default();
            let input = if text.trim().is_empty() {
                json!({})
            } else {
                serde_json::from_str(text).unwrap_or_else(|_| json!({}))
            };
            object.insert("input".into(), input);
        }
    }
    block
}
