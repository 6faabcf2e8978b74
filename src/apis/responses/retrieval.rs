//! Lookups (`summarization.retrieval`) on OpenAI's Responses API: the tool as a function tool
//! (`name`, `description`, `parameters` at the top of the tool), the model's calls read from its
//! `function_call` output items, answered by `function_call_output` items after the round's own
//! items as the model produced them (reasoning with its encrypted content included, which
//! OpenAI wants back before the call it led to).
//!
//! What the client gets holds nothing of a round that ended in a lookup but what it said: its
//! reasoning would reach the client's next request without the item it led to ("provided
//! without its required following item"). Streamed, message items reach the client as they
//! come; reasoning and call items are held to the round's end; every event is renumbered
//! (`output_index` across the rounds' items, `sequence_number` across the stream), and the
//! client reads one `response.created` and one `response.completed`, the first round's id on
//! both, its output the items it was given, its usage the rounds'.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::retrieval::{
    appended, ref_schema, reference_in, with_first_member, Call, CallRead, Part, StreamRounds,
    Turn, Usage, Wire, TOOL_DESCRIPTION,
};
use crate::served::splice::{write_event, Event};

pub struct ResponsesRetrieval;

/// The output items the client runs itself: a round that ends in a lookup drops them, and the
/// model asks for them again after it.
const CLIENT_CALLS: [&str; 7] = [
    "function_call",
    "custom_tool_call",
    "local_shell_call",
    "shell_call",
    "apply_patch_call",
    "computer_call",
    "mcp_approval_request",
];

#[derive(Deserialize)]
struct Offer<'a> {
    #[serde(borrow, default)]
    tool_choice: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
}

fn tool_json(tool: &str) -> String {
    let mut parameters = ref_schema();
    parameters["additionalProperties"] = Value::Bool(false);
    json!({"type": "function", "name": tool, "description": TOOL_DESCRIPTION,
           "parameters": parameters, "strict": false})
    .to_string()
}

fn field<'v>(value: &'v Value, key: &str) -> &'v str {
    value.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// An item's type: a bare `{role, content}` is a message.
fn kind_of(item: &Value) -> &str {
    item.get("type")
        .and_then(Value::as_str)
        .unwrap_or("message")
}

/// The text of a content or a call's output: a string, or its parts' text joined.
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

/// What a call item asked: a function's arguments, a custom tool's free-form input.
fn asked(item: &Value) -> String {
    match item.get("arguments").or_else(|| item.get("input")) {
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => item.get("action").map(Value::to_string).unwrap_or_default(),
    }
}

fn is_lookup(item: &Value, tool: &str) -> bool {
    kind_of(item) == "function_call" && field(item, "name") == tool
}

fn is_client_call(item: &Value) -> bool {
    CLIENT_CALLS.contains(&kind_of(item))
}

fn lookup_of(item: &Value) -> Call {
    let arguments = field(item, "arguments").to_string();
    Call {
        id: field(item, "call_id").to_string(),
        reference: reference_in(&arguments),
        arguments,
    }
}

/// The text of the round's message items.
fn said_in<'v>(items: impl IntoIterator<Item = &'v Value>) -> String {
    items
        .into_iter()
        .filter(|item| kind_of(item) == "message")
        .map(|item| text_of(item.get("content")))
        .collect()
}

impl Wire for ResponsesRetrieval {
    fn parts(&self, items: &[(&str, Value)]) -> Vec<Part> {
        let mut taken = vec![false; items.len()];
        let mut parts = Vec::new();
        for i in 0..items.len() {
            if taken[i] {
                continue;
            }
            taken[i] = true;
            let (raw, item) = &items[i];
            match kind_of(item) {
                "message" => {
                    let content = text_of(item.get("content"));
                    parts.push(Part::message(raw, field(item, "role"), &content));
                }
                kind if kind.ends_with("_call") => {
                    let name = match field(item, "name") {
                        "" => kind,
                        name => name,
                    };
                    let arguments = asked(item);
                    let call_id = field(item, "call_id");
                    let mut raw_all = raw.to_string();
                    let answering = (i + 1..items.len()).find(|&j| {
                        !taken[j]
                            && !call_id.is_empty()
                            && field(&items[j].1, "call_id") == call_id
                            && kind_of(&items[j].1).ends_with("_output")
                    });
                    let output = answering.map(|j| {
                        taken[j] = true;
                        raw_all.push_str(items[j].0);
                        text_of(items[j].1.get("output"))
                    });
                    let read = CallRead {
                        name,
                        arguments: &arguments,
                        output,
                    };
                    parts.push(Part::calls(raw_all, ("assistant", ""), &[read]));
                }
                kind if kind.ends_with("_output") => {
                    // An output whose call was summarized by an earlier compaction.
                    let output = text_of(item.get("output"));
                    parts.push(Part::message(raw, "tool result", &output));
                }
                // Reasoning (encrypted), compaction items: nothing a lookup could read.
                _ => {}
            }
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
        let items = offer
            .input
            .is_some_and(|raw| raw.get().trim_start().starts_with('['));
        choice_ok && tools_ok && items
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
        let mut items: Vec<String> = turn.content.iter().map(Value::to_string).collect();
        for (call, answer) in turn.calls.iter().zip(&turn.answers) {
            items.push(
                json!({"type": "function_call_output", "call_id": call.id, "output": answer})
                    .to_string(),
            );
        }
        appended(body, offer.input?, &items.join(","))
    }

    fn lookups(&self, answer: &Value, tool: &str) -> Turn {
        let items = answer
            .get("output")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let calls: Vec<Call> = items
            .iter()
            .filter(|item| is_lookup(item, tool))
            .map(lookup_of)
            .collect();
        if calls.is_empty() {
            return Turn::default();
        }
        let content: Vec<Value> = items
            .into_iter()
            .filter(|item| !is_client_call(item) || is_lookup(item, tool))
            .collect();
        Turn {
            said: said_in(&content),
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
        for key in ["id", "created_at"] {
            if let Some(value) = first.get(key) {
                last[key] = value.clone();
            }
        }
        let mut output = Vec::new();
        if !said.is_empty() {
            output.push(said_item(field(first, "id"), said));
        }
        output.extend(
            last.get("output")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|item| !is_lookup(item, tool)),
        );
        last["output"] = Value::Array(output);
        if usage.seen {
            last["usage"] = usage_json(usage, last.get("usage"));
        }
        last
    }

    fn stream(&self, tool: &str) -> Box<dyn StreamRounds> {
        Box::new(ResponsesStream {
            tool: tool.to_string(),
            ..ResponsesStream::default()
        })
    }

    fn failure(&self, status: u16, message: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let data = json!({"type": "error", "code": "expansion_failed", "param": null,
            "message": message, "status": status});
        write_event(&mut out, Some("error"), &data);
        out
    }
}

/// What the earlier rounds said before their lookups, as one message item of the answer.
fn said_item(response_id: &str, said: &str) -> Value {
    let id = format!(
        "msg_{}_said",
        response_id.strip_prefix("resp_").unwrap_or(response_id)
    );
    json!({"type": "message", "id": id, "status": "completed", "role": "assistant",
           "content": [{"type": "output_text", "text": said, "annotations": []}]})
}

fn usage_json(usage: &Usage, last: Option<&Value>) -> Value {
    usage.json(last, ["input_tokens", "output_tokens", "total_tokens"])
}

/// One output item of the round, as its events build it.
#[derive(Default)]
struct Item {
    value: Value,
    /// Its events, when it is held (reasoning, a call).
    held: Vec<Value>,
    /// The client's `output_index` for it, once it has been given one.
    client_index: Option<u64>,
    /// A reasoning item released by the message it led to.
    released: bool,
}

impl Item {
    fn is_held(&self) -> bool {
        !self.released && (kind_of(&self.value) == "reasoning" || is_client_call(&self.value))
    }
}

/// A streamed response across rounds.
#[derive(Default)]
struct ResponsesStream {
    tool: String,
    /// The first round's `response` object (its id, its creation time).
    first: Option<Value>,
    /// Rounds that ended in a lookup so far.
    rounds: usize,
    sequence: u64,
    next_index: u64,
    items: BTreeMap<u64, Item>,
    /// The items the client was given, by its index, as their `done` events had them.
    given: BTreeMap<u64, Value>,
    /// The round's `response.completed` (or `incomplete`, `failed`), held to the end.
    end: Option<(String, Value)>,
    usage: Usage,
}

impl ResponsesStream {
    fn write(&mut self, kind: &str, mut data: Value, out: &mut Vec<u8>) {
        if data.get("sequence_number").is_some() {
            data["sequence_number"] = Value::from(self.sequence);
            self.sequence += 1;
        }
        write_event(out, Some(kind), &data);
    }

    fn emit(&mut self, kind: &str, mut data: Value, upstream_index: u64, out: &mut Vec<u8>) {
        let item = self.items.entry(upstream_index).or_default();
        let index = *item.client_index.get_or_insert_with(|| {
            let index = self.next_index;
            self.next_index += 1;
            index
        });
        data["output_index"] = Value::from(index);
        if kind == "response.output_item.done" {
            if let Some(done) = data.get("item") {
                self.given.insert(index, done.clone());
            }
        }
        self.write(kind, data, out);
    }

    /// The reasoning held right before item `index`, a message: reasoning followed by the
    /// message it led to is whole whatever the round does next, so it goes out first (a
    /// reasoning model's text then streams as it comes).
    fn release_reasoning_before(&mut self, index: u64, out: &mut Vec<u8>) {
        let run: Vec<u64> = self
            .items
            .range(..index)
            .rev()
            .take_while(|(_, item)| kind_of(&item.value) == "reasoning" && item.is_held())
            .map(|(at, _)| *at)
            .collect();
        for at in run.into_iter().rev() {
            let Some(item) = self.items.get_mut(&at) else {
                continue;
            };
            item.released = true;
            for data in std::mem::take(&mut item.held) {
                let kind = field(&data, "type").to_string();
                self.emit(&kind, data, at, out);
            }
        }
    }

    /// The held items that are not lookups, then the end of the response.
    fn flush(&mut self, out: &mut Vec<u8>) {
        let indexes: Vec<u64> = self.items.keys().copied().collect();
        for upstream in indexes {
            let Some(item) = self.items.get_mut(&upstream) else {
                continue;
            };
            if is_lookup(&item.value, &self.tool) {
                continue;
            }
            for data in std::mem::take(&mut item.held) {
                let kind = field(&data, "type").to_string();
                self.emit(&kind, data, upstream, out);
            }
        }
        if let Some((kind, mut data)) = self.end.take() {
            if let Some(response) = data.get_mut("response") {
                if let Some(first) = &self.first {
                    for key in ["id", "created_at"] {
                        if let Some(value) = first.get(key) {
                            response[key] = value.clone();
                        }
                    }
                }
                response["output"] = Value::Array(self.given.values().cloned().collect());
                if self.usage.seen {
                    response["usage"] = usage_json(&self.usage, response.get("usage"));
                }
            }
            self.write(&kind, data, out);
        }
    }
}

impl StreamRounds for ResponsesStream {
    fn event(&mut self, event: Event<'_>, out: &mut Vec<u8>) {
        let data = event.data;
        let kind = event.kind.as_str();
        match kind {
            "response.created" | "response.in_progress" | "response.queued" => {
                // A later round's are not news to the client.
                if self.rounds == 0 {
                    if kind == "response.created" && self.first.is_none() {
                        self.first = data.get("response").cloned();
                    }
                    self.write(kind, data, out);
                }
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                self.usage.add(
                    data.pointer("/response/usage"),
                    "input_tokens",
                    "output_tokens",
                );
                self.end = Some((kind.to_string(), data));
            }
            _ => {
                let Some(index) = data.get("output_index").and_then(Value::as_u64) else {
                    // `error`, compactor's notice: as they came.
                    out.extend_from_slice(event.raw);
                    return;
                };
                let item = self.items.entry(index).or_default();
                if let Some(value) = data.get("item") {
                    item.value = value.clone();
                }
                if kind == "response.function_call_arguments.delta" {
                    let now = field(&item.value, "arguments").to_string();
                    item.value["arguments"] = Value::from(now + field(&data, "delta"));
                }
                if item.is_held() {
                    item.held.push(data);
                    return;
                }
                if kind == "response.output_item.added" && kind_of(&item.value) == "message" {
                    self.release_reasoning_before(index, out);
                }
                self.emit(kind, data, index, out);
            }
        }
    }

    fn pass(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(raw);
    }

    fn end(&mut self, may_expand: bool, out: &mut Vec<u8>) -> Turn {
        let lookups: Vec<Call> = self
            .items
            .values()
            .filter(|item| is_lookup(&item.value, &self.tool))
            .map(|item| lookup_of(&item.value))
            .collect();
        if lookups.is_empty() || !may_expand {
            self.flush(out);
            return Turn::default();
        }
        let content: Vec<Value> = self
            .items
            .values()
            .map(|item| &item.value)
            .filter(|value| !is_client_call(value) || is_lookup(value, &self.tool))
            .cloned()
            .collect();
        self.items.clear();
        self.end = None;
        self.rounds += 1;
        Turn {
            said: said_in(&content),
            calls: lookups,
            content,
            answers: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_and_its_output_are_one_ref_and_reasoning_none() {
        let call = json!({"type": "function_call", "call_id": "c1", "name": "read_file",
            "arguments": "{\"path\":\"notes.txt\"}"})
        .to_string();
        let output =
            json!({"type": "function_call_output", "call_id": "c1", "output": "the code is X"})
                .to_string();
        let reasoning =
            json!({"type": "reasoning", "summary": [], "encrypted_content": "e"}).to_string();
        let message =
            json!({"role": "user", "content": [{"type": "input_text", "text": "hi"}]}).to_string();
        let parts = ResponsesRetrieval.parts(&crate::retrieval::parsed([
            message.as_str(),
            reasoning.as_str(),
            &call,
            &output,
        ]));
        assert_eq!(parts.len(), 2, "{parts:#?}");
        assert_eq!(parts[0].text, "[user]\nhi");
        assert!(parts[1].what.starts_with("read_file("), "{}", parts[1].what);
        assert!(parts[1]
            .text
            .ends_with("[result of read_file]\nthe code is X"));
        assert_eq!(parts[1].raw, format!("{call}{output}"));
    }

    #[test]
    fn only_a_request_of_items_whose_choice_lets_it_call_is_offered_the_tool() {
        let offers = |body: Value| ResponsesRetrieval.offers(body.to_string().as_bytes());
        assert!(offers(json!({"input": []})));
        assert!(offers(
            json!({"input": [], "tool_choice": "auto", "tools": []})
        ));
        assert!(!offers(json!({"input": "a string"})));
        assert!(!offers(json!({"input": [], "tool_choice": "none"})));
        assert!(!offers(
            json!({"input": [], "tool_choice": {"type": "function", "name": "x"}})
        ));
    }
}
