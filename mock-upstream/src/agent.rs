//! Agent mode (`--mode agent`): the mock plays the model behind a real coding agent (Claude Code
//! on the Messages API, Codex on the Responses API, the Gemini CLI on `generateContent`), so the
//! CLIs run a scripted loop of tool steps through compactor. Each step reads a file of `--agent-files` with the tool the client
//! declared (Claude Code's `Read`, Codex's `exec` running `exec_command`), every third step two
//! files at once where the client allows parallel calls, with thinking or a reasoning item first
//! when the request asks for it. After `--agent-steps` steps it answers
//! `AGENT-DONE steps=N`.
//!
//! The step is read back from the conversation itself: every call id the mock makes is
//! `…agentstep_NN_K`, and the next step is one past the highest it finds in the body. A
//! compacted request still holds the latest call verbatim, so the loop neither restarts nor
//! skips however the history before it was summarized.

use bytes::Bytes;
use serde_json::{json, Value};

/// The script: how many tool steps, which files they read.
#[derive(Debug, Clone, Default)]
pub struct AgentScript {
    pub steps: u32,
    /// Absolute paths, read in turn.
    pub files: Vec<String>,
}

const STEP_MARK: &str = "agentstep_";

impl AgentScript {
    /// Lists the regular files of `dir`, sorted, as absolute paths.
    pub fn new(steps: u32, dir: Option<&std::path::Path>) -> std::io::Result<AgentScript> {
        let mut files = Vec::new();
        if let Some(dir) = dir {
            let dir = std::fs::canonicalize(dir)?;
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                if path.is_file() {
                    files.push(path.to_string_lossy().into_owned());
                }
            }
            files.sort();
        }
        Ok(AgentScript { steps, files })
    }

    fn file(&self, index: usize) -> String {
        match self.files.len() {
            0 => "README.md".to_string(),
            n => self.files[index % n].clone(),
        }
    }
}

/// One past the highest step named by a call id in the body; 1 for a new conversation.
pub fn next_step(body: &[u8]) -> u32 {
    let text = String::from_utf8_lossy(body);
    let mut highest = 0;
    let mut rest = text.as_ref();
    while let Some(at) = rest.find(STEP_MARK) {
        rest = &rest[at + STEP_MARK.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(step) = digits.parse::<u32>() {
            highest = highest.max(step);
        }
    }
    highest + 1
}

fn step_text(step: u32, files: &[String]) -> String {
    format!(
        "Step {step}: reading {} to follow the trail of the task.",
        files.join(" and ")
    )
}

/// What the agent does at this request: which files it reads, or that it is done.
enum Move {
    Read(Vec<String>),
    Done(u32),
    LostTools,
}

fn next_move(script: &AgentScript, body: &[u8], parallel: bool, tools: bool) -> (u32, Move) {
    let step = next_step(body);
    if step > script.steps {
        return (step, Move::Done(script.steps));
    }
    // A model whose tool declarations were lost mid-run can only stop and say so.
    if !tools {
        return (step, Move::LostTools);
    }
    let first = (step as usize - 1) * 2;
    let files = if parallel && step % 3 == 0 {
        vec![script.file(first), script.file(first + 1)]
    } else {
        vec![script.file(first)]
    };
    (step, Move::Read(files))
}

fn event(kind: &str, data: Value) -> Bytes {
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

/// Gemini: the parts of this step's model turn: one call of the client's `read_file` (two every
/// third step), the first signed as Google signs it, or the final text. A request that declares
/// no `read_file` is a side request of the client's own.
pub fn gemini_parts(script: &AgentScript, request: &Value, body: &[u8]) -> Vec<Value> {
    let reads = request
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|tool| tool.get("functionDeclarations").and_then(Value::as_array))
        .flatten()
        .any(|declaration| declaration.get("name").and_then(Value::as_str) == Some("read_file"));
    if !reads {
        return vec![json!({"text": "Noted."})];
    }
    if let Some(parts) = lookup_parts(request) {
        return parts;
    }
    let (step, action) = next_move(script, body, true, true);
    match action {
        Move::Done(steps) => vec![json!({"text": format!("AGENT-DONE steps={steps}")})],
        Move::LostTools => vec![json!({"text": format!("AGENT-LOST-TOOLS at step {step}")})],
        Move::Read(files) => files
            .iter()
            .enumerate()
            .map(|(k, file)| {
                let id = format!("{STEP_MARK}{step:02}_{}", k + 1);
                let mut part = json!({"functionCall": {"name": "read_file", "args": {"file_path": file}, "id": id}});
                if k == 0 {
                    part["thoughtSignature"] = json!(crate::gemini::signature(&id));
                }
                part
            })
            .collect(),
    }
}

/// Messages: the blocks of this step's assistant turn and its stop reason.
fn message_blocks(
    script: &AgentScript,
    request: &Value,
    body: &[u8],
) -> (Vec<Value>, &'static str) {
    let tools: Vec<&str> = request
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|tool| tool.get("name").and_then(Value::as_str))
        .collect();
    let thinking = matches!(
        request.pointer("/thinking/type").and_then(Value::as_str),
        Some("enabled" | "adaptive")
    );
    if let Some(lookup) = lookup_blocks(request, thinking) {
        return lookup;
    }
    let (step, action) = next_move(script, body, true, !tools.is_empty());
    if step == 1 && tools.is_empty() {
        // A side request of the client's own (a title, a summary): not part of the loop.
        return (vec![json!({"type": "text", "text": "Noted."})], "end_turn");
    }
    let mut blocks = Vec::new();
    if thinking {
        let thought = format!("Step {step}: the next file should tell me more.");
        blocks.push(json!({"type": "thinking", "thinking": thought,
                           "signature": crate::anthropic::thinking_signature(&thought)}));
    }
    match action {
        Move::Done(steps) => {
            blocks.push(json!({"type": "text", "text": format!("AGENT-DONE steps={steps}")}));
            (blocks, "end_turn")
        }
        Move::LostTools => {
            let text = format!("AGENT-LOST-TOOLS at step {step}");
            blocks.push(json!({"type": "text", "text": text}));
            (blocks, "end_turn")
        }
        Move::Read(files) => {
            blocks.push(json!({"type": "text", "text": step_text(step, &files)}));
            let tool = if tools.contains(&"Read") {
                "Read"
            } else {
                tools[0]
            };
            for (k, file) in files.iter().enumerate() {
                blocks.push(
                    json!({"type": "tool_use", "id": format!("toolu_{STEP_MARK}{step:02}_{k}"),
                                   "name": tool, "input": {"file_path": file}}),
                );
            }
            (blocks, "tool_use")
        }
    }
}

/// Messages: the whole message, or its typed event stream.
pub fn message_reply(
    script: &AgentScript,
    request: &Value,
    body: &[u8],
    id: &str,
    model: &str,
) -> (Value, Vec<Bytes>) {
    let (blocks, stop) = message_blocks(script, request, body);
    let input_tokens = body.len() / 4;
    let usage = json!({"input_tokens": input_tokens, "output_tokens": 40});
    let message = json!({
        "id": format!("msg_{id}"), "type": "message", "role": "assistant", "model": model,
        "content": blocks, "stop_reason": stop, "stop_sequence": null, "usage": usage,
    });
    let mut events = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": format!("msg_{id}"), "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1}}}),
    )];
    for (index, block) in blocks.iter().enumerate() {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        let (start, deltas) = match kind {
            "thinking" => (
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                vec![
                    json!({"type": "thinking_delta", "thinking": block["thinking"]}),
                    json!({"type": "signature_delta", "signature": block["signature"]}),
                ],
            ),
            "tool_use" => (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                vec![
                    json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
                ],
            ),
            _ => (
                json!({"type": "text", "text": ""}),
                vec![json!({"type": "text_delta", "text": block["text"]})],
            ),
        };
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        for delta in deltas {
            events.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
               "usage": {"output_tokens": 40}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    (message, events)
}

/// Whether a Responses request offers a tool named `name`, at the top level or inside a
/// namespace (Codex declares its tools in an `additional_tools` input item).
fn offers_tool(request: &Value, name: &str) -> bool {
    fn search(tools: &Value, name: &str) -> bool {
        tools.as_array().into_iter().flatten().any(|tool| {
            tool.get("name").and_then(Value::as_str) == Some(name)
                || tool.get("tools").is_some_and(|nested| search(nested, name))
        })
    }
    let in_items = request
        .get("input")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|item| item.get("tools"))
        .any(|tools| search(tools, name));
    in_items
        || request
            .get("tools")
            .is_some_and(|tools| search(tools, name))
}

/// Responses: the output items of this step.
fn response_items(script: &AgentScript, request: &Value, body: &[u8], id: &str) -> Vec<Value> {
    let parallel = request
        .get("parallel_tool_calls")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let exec = offers_tool(request, "exec");
    // Codex's `shell` and `exec_command`, opencode's `bash`.
    let named = ["shell", "exec_command", "bash"]
        .into_iter()
        .find(|name| offers_tool(request, name));
    let reasoning = request.get("reasoning").is_some_and(|r| !r.is_null());
    if let Some(items) = lookup_items(request, reasoning, id) {
        return items;
    }
    let (step, action) = next_move(script, body, parallel, exec || named.is_some());
    let mut items = Vec::new();
    if reasoning {
        items.push(
            json!({"type": "reasoning", "id": format!("rs_{id}"), "summary": [],
                          "encrypted_content": format!("enc-step-{step}")}),
        );
    }
    let message = |text: String| {
        json!({"type": "message", "id": format!("msg_{id}"), "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": text, "annotations": []}]})
    };
    match action {
        Move::Done(steps) => items.push(message(format!("AGENT-DONE steps={steps}"))),
        Move::LostTools => items.push(message(format!("AGENT-LOST-TOOLS at step {step}"))),
        Move::Read(files) => {
            items.push(message(step_text(step, &files)));
            for (k, file) in files.iter().enumerate() {
                let call_id = format!("call_{STEP_MARK}{step:02}_{k}");
                let item_id = format!("ctc_{id}_{k}");
                if exec {
                    let input = format!(
                        "const r = await tools.exec_command({{cmd: {}}});\ntext(r.output);",
                        json!(format!("cat {file}"))
                    );
                    items.push(
                        json!({"type": "custom_tool_call", "id": item_id, "status": "completed",
                                      "call_id": call_id, "name": "exec", "input": input}),
                    );
                } else {
                    let name = named.unwrap_or("exec_command");
                    let arguments = if name == "bash" {
                        json!({"command": format!("cat {file}"), "description": "Read a note"})
                    } else {
                        json!({"cmd": format!("cat {file}"), "command": ["cat", file]})
                    };
                    items.push(json!({"type": "function_call", "id": item_id, "status": "completed",
                                      "call_id": call_id, "name": name, "arguments": arguments.to_string()}));
                }
            }
        }
    }
    items
}

/// Responses: the `response` object, or its typed event stream.
pub fn response_reply(
    script: &AgentScript,
    request: &Value,
    body: &[u8],
    id: &str,
    model: &str,
) -> (Value, Vec<Bytes>) {
    let items = response_items(script, request, body, id);
    let input_tokens = body.len() / 4;
    let response = |status: &str, output: Value, usage: Value| {
        json!({"id": format!("resp_{id}"), "object": "response", "created_at": 1_700_000_000,
               "status": status, "error": null, "incomplete_details": null, "model": model,
               "output": output, "parallel_tool_calls": false, "tool_choice": "auto", "tools": [],
               "usage": usage, "metadata": {}})
    };
    let usage = json!({"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                       "output_tokens": 40, "output_tokens_details": {"reasoning_tokens": 0},
                       "total_tokens": input_tokens + 40});
    let done = response("completed", json!(items), usage);
    let mut sequence = 0u64;
    let mut typed = |kind: &str, mut data: Value| {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(sequence);
        sequence += 1;
        event(kind, data)
    };
    let mut events = vec![
        typed(
            "response.created",
            json!({"response": response("in_progress", json!([]), Value::Null)}),
        ),
        typed(
            "response.in_progress",
            json!({"response": response("in_progress", json!([]), Value::Null)}),
        ),
    ];
    for (index, item) in items.iter().enumerate() {
        let mut added = item.clone();
        added["status"] = json!("in_progress");
        if item["type"] == "message" {
            added["content"] = json!([]);
        }
        if item["type"] == "function_call" {
            added["arguments"] = json!("");
        }
        events.push(typed(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        ));
        let at = json!({"item_id": item["id"], "output_index": index});
        let with = |mut extra: Value| {
            for (key, value) in at.as_object().into_iter().flatten() {
                extra[key] = value.clone();
            }
            extra
        };
        if item["type"] == "message" {
            let text = &item["content"][0]["text"];
            let empty = json!({"type": "output_text", "text": "", "annotations": []});
            events.push(typed(
                "response.content_part.added",
                with(json!({"content_index": 0, "part": empty})),
            ));
            events.push(typed(
                "response.output_text.delta",
                with(json!({"content_index": 0, "delta": text, "logprobs": []})),
            ));
            events.push(typed(
                "response.output_text.done",
                with(json!({"content_index": 0, "text": text, "logprobs": []})),
            ));
            events.push(typed(
                "response.content_part.done",
                with(json!({"content_index": 0, "part": item["content"][0]})),
            ));
        }
        if item["type"] == "function_call" {
            let arguments = &item["arguments"];
            events.push(typed(
                "response.function_call_arguments.delta",
                with(json!({"delta": arguments})),
            ));
            events.push(typed(
                "response.function_call_arguments.done",
                with(json!({"arguments": arguments})),
            ));
        }
        events.push(typed(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
    }
    events.push(typed("response.completed", json!({"response": done})));
    (done, events)
}

/// compactor's lookup tool (`summarization.retrieval`), by its default name.
pub const LOOKUP_TOOL: &str = "compactor_expand";
/// What a planted fact starts with: the model "needs" it, and asks for it when the summary
/// lacks it.
pub const FACT_MARK: &str = "FACT-";

/// The planted facts in `text`, in order.
fn facts_in(text: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(FACT_MARK) {
        let tail = &rest[at..];
        let end = tail
            .char_indices()
            .find(|(i, c)| *i >= FACT_MARK.len() && !(c.is_ascii_alphanumeric() || *c == '-'))
            .map_or(tail.len(), |(i, _)| i);
        found.push(&tail[..end]);
        rest = &tail[end..];
    }
    found
}

fn text_of(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Chat, with compactor's lookup tool declared: a model that needs the planted facts. After a
/// lookup it answers with the facts the result holds (`Recalled: …`); on a user turn whose
/// summary lacks them, it calls the tool (`Some(arguments)`) with the ref whose index line
/// mentions a fact, else the first; with them in the summary it answers from it. None: the
/// tool is not declared, or there is no summary to look behind.
pub fn lookup_reply(request: &Value) -> Option<(Option<String>, String)> {
    let messages = request.get("messages")?.as_array()?;
    let last = messages.last()?;
    if last.get("role").and_then(Value::as_str) == Some("tool") {
        let looked_up = messages.iter().rev().any(|m| {
            m.get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|c| c.pointer("/function/name").and_then(Value::as_str) == Some(LOOKUP_TOOL))
        });
        if !looked_up {
            return None;
        }
        let text = text_of(last);
        let facts = facts_in(&text);
        return Some((None, format!("Recalled: {}", facts.join(" "))));
    }
    let declared = request
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(LOOKUP_TOOL));
    let summary = messages
        .iter()
        .map(text_of)
        .find(|text| text.contains("Here is a summary of the conversation to date"))?;
    match planned_lookup(&summary, &text_of(last), declared)? {
        Lookup::Call(reference) => {
            Some((Some(json!({"ref": reference}).to_string()), String::new()))
        }
        Lookup::Answer(text) => Some((None, text)),
    }
}

/// Whether a chat request carries a call of compactor's lookup tool in its messages.
pub fn carries_lookup(request: &Value) -> bool {
    request
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("tool_calls").and_then(Value::as_array))
        .flatten()
        .any(|c| c.pointer("/function/name").and_then(Value::as_str) == Some(LOOKUP_TOOL))
}

/// Whether a request's history holds a call of compactor's lookup tool anywhere but in the
/// rounds compactor itself appends at its end (chat, Messages, Gemini: the last two turns;
/// Responses: the trailing run of the model's items and the lookups' outputs): one anywhere
/// else came back from a client that saw it.
pub fn lookup_in_client_history(request: &Value) -> bool {
    let call = format!("\"name\":\"{LOOKUP_TOOL}\"");
    let turns = request
        .get("messages")
        .or_else(|| request.get("contents"))
        .and_then(Value::as_array);
    if let Some(messages) = turns {
        let history = &messages[..messages.len().saturating_sub(2)];
        return history.iter().any(|m| m.to_string().contains(&call));
    }
    let Some(items) = request.get("input").and_then(Value::as_array) else {
        return false;
    };
    let lookup_ids: Vec<&str> = items
        .iter()
        .filter(|i| i.get("name").and_then(Value::as_str) == Some(LOOKUP_TOOL))
        .filter_map(|i| i.get("call_id").and_then(Value::as_str))
        .collect();
    let compactors = |item: &Value| {
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        let call_id = item.get("call_id").and_then(Value::as_str).unwrap_or("");
        match kind {
            "reasoning" => true,
            "message" => item.get("role").and_then(Value::as_str) == Some("assistant"),
            "function_call" | "function_call_output" => lookup_ids.contains(&call_id),
            _ => false,
        }
    };
    let tail = items.iter().rev().take_while(|i| compactors(i)).count();
    items[..items.len() - tail]
        .iter()
        .any(|i| i.to_string().contains(&call))
}

/// What a model that needs the planted facts does on a user turn asking to recall them.
enum Lookup {
    /// Call the lookup tool with this ref.
    Call(String),
    Answer(String),
}

fn planned_lookup(summary: &str, question: &str, declared: bool) -> Option<Lookup> {
    if !question.contains("Recall") {
        return None;
    }
    let in_summary = facts_in(summary);
    if !in_summary.is_empty() {
        return Some(Lookup::Answer(format!(
            "From the summary: {}",
            in_summary.join(" ")
        )));
    }
    if !declared {
        return None;
    }
    let refs: Vec<&str> = summary
        .lines()
        .filter_map(|line| line.strip_prefix("- ref:"))
        .collect();
    let pick = refs
        .iter()
        .find(|line| line.to_ascii_lowercase().contains("fact"))
        .or(refs.first())?;
    let id = pick.split_whitespace().next()?;
    Some(Lookup::Call(format!("ref:{id}")))
}

/// What the lookup model reads of a request, whatever its API.
struct LookupView {
    declared: bool,
    summary: Option<String>,
    /// The latest user text that is not the summary asks to recall the planted facts.
    recall: bool,
    /// When the request ends on tool results: their text, and whether it holds a lookup.
    results: Option<(String, bool)>,
    /// The last turn's text.
    question: String,
}

/// The model's turn: what it says, and the ref it looks up when it calls the tool.
struct LookupTurn {
    text: String,
    call: Option<String>,
}

/// What a model that needs the planted facts does with compactor's lookup tool; None when the
/// turn is not about lookups. Behind a summary, each agent step reads one original first, then
/// goes on with the step (what a real CLI must never see); after a lookup on a turn asking to
/// recall, it answers with the facts the result holds.
fn lookup_turn(view: LookupView) -> Option<LookupTurn> {
    if let Some((results, looked_up)) = view.results {
        if !looked_up {
            let first_ref = view
                .summary
                .as_deref()
                .filter(|_| view.declared && !view.recall)
                .and_then(|s| s.lines().find_map(|line| line.strip_prefix("- ref:")))
                .and_then(|line| line.split_whitespace().next())?;
            return Some(LookupTurn {
                text: "Reading what the summary stands for first.".into(),
                call: Some(format!("ref:{first_ref}")),
            });
        }
        if !view.recall {
            return None;
        }
        let text = format!("Recalled: {}", facts_in(&results).join(" "));
        return Some(LookupTurn { text, call: None });
    }
    Some(
        match planned_lookup(&view.summary?, &view.question, view.declared)? {
            Lookup::Call(reference) => LookupTurn {
                text: "Let me read the original.".into(),
                call: Some(reference),
            },
            Lookup::Answer(text) => LookupTurn { text, call: None },
        },
    )
}

/// Whether the latest non-empty user text that is not the summary asks to recall.
fn asks_to_recall(texts: impl DoubleEndedIterator<Item = String>) -> bool {
    texts
        .rev()
        .find(|text| !text.is_empty() && !text.contains("Here is a summary"))
        .is_some_and(|text| text.contains("Recall"))
}

fn summary_in(texts: impl Iterator<Item = String>) -> Option<String> {
    texts
        .into_iter()
        .find(|text| text.contains("Here is a summary of the conversation to date"))
}

/// A tool result's content as text: a string, or its JSON.
fn output_text(output: Option<&Value>) -> String {
    match output {
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// Responses: [`lookup_turn`] in output items (a reasoning item first when the request asks
/// for reasoning).
fn lookup_items(request: &Value, reasoning: bool, id: &str) -> Option<Vec<Value>> {
    let items = request.get("input")?.as_array()?;
    let last = items.last()?;
    let kind = |item: &Value| {
        item.get("type")
            .and_then(Value::as_str)
            .unwrap_or("message")
            .to_string()
    };
    let is_user =
        |i: &Value| kind(i) == "message" && i.get("role").and_then(Value::as_str) == Some("user");
    let results = kind(last).ends_with("_output").then(|| {
        let looked_up = items.iter().any(|i| {
            kind(i) == "function_call" && i.get("name").and_then(Value::as_str) == Some(LOOKUP_TOOL)
        });
        (output_text(last.get("output")), looked_up)
    });
    let turn = lookup_turn(LookupView {
        declared: offers_tool(request, LOOKUP_TOOL),
        summary: summary_in(items.iter().map(text_of)),
        recall: asks_to_recall(items.iter().filter(|i| is_user(i)).map(text_of)),
        results,
        question: text_of(last),
    })?;
    let mut out = Vec::new();
    if reasoning {
        out.push(
            json!({"type": "reasoning", "id": format!("rs_{id}"), "summary": [],
                        "encrypted_content": "enc-lookup"}),
        );
    }
    out.push(
        json!({"type": "message", "id": format!("msg_{id}"), "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": turn.text, "annotations": []}]}),
    );
    if let Some(reference) = turn.call {
        out.push(
            json!({"type": "function_call", "id": format!("fc_{id}"), "status": "completed",
                        "call_id": format!("call_lookup_{}", items.len()), "name": LOOKUP_TOOL,
                        "arguments": json!({"ref": reference}).to_string()}),
        );
    }
    Some(out)
}

/// Gemini: [`lookup_turn`] in parts; the lookup's call signed as Google signs a turn's first
/// call, so a lookup turn sent back without its signature is refused.
fn lookup_parts(request: &Value) -> Option<Vec<Value>> {
    let turns = request.get("contents")?.as_array()?;
    let last = turns.last()?;
    let parts_of = |turn: &Value| -> Vec<Value> {
        turn.get("parts")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let text = |turn: &Value| -> String {
        parts_of(turn)
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let declared = request
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|tool| tool.get("functionDeclarations").and_then(Value::as_array))
        .flatten()
        .any(|d| d.get("name").and_then(Value::as_str) == Some(LOOKUP_TOOL));
    let responses: Vec<Value> = parts_of(last)
        .into_iter()
        .filter_map(|p| p.get("functionResponse").cloned())
        .collect();
    let results = (!responses.is_empty()).then(|| {
        let looked_up = turns.iter().any(|turn| {
            parts_of(turn).iter().any(|p| {
                p.pointer("/functionCall/name").and_then(Value::as_str) == Some(LOOKUP_TOOL)
            })
        });
        let output: String = responses
            .iter()
            .map(|r| r["response"].to_string())
            .collect();
        (output, looked_up)
    });
    let from_model = |t: &Value| t.get("role").and_then(Value::as_str) == Some("model");
    let turn = lookup_turn(LookupView {
        declared,
        summary: summary_in(turns.iter().map(text)),
        recall: asks_to_recall(turns.iter().filter(|t| !from_model(t)).map(text)),
        results,
        question: text(last),
    })?;
    let mut parts = vec![json!({"text": turn.text})];
    if let Some(reference) = turn.call {
        let id = format!("{STEP_MARK}lookup_{}", turns.len());
        parts.push(
            json!({"functionCall": {"name": LOOKUP_TOOL, "args": {"ref": reference}, "id": id},
                   "thoughtSignature": crate::gemini::signature(&id)}),
        );
    }
    Some(parts)
}

/// Messages: [`lookup_turn`] in blocks (a thinking block first when the request asks for
/// thinking), with its stop reason.
fn lookup_blocks(request: &Value, thinking: bool) -> Option<(Vec<Value>, &'static str)> {
    let messages = request.get("messages")?.as_array()?;
    let last = messages.last()?;
    let blocks_of = |message: &Value, kind: &str| -> Vec<Value> {
        message
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some(kind))
            .cloned()
            .collect()
    };
    let declared = request
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|t| t.get("name").and_then(Value::as_str) == Some(LOOKUP_TOOL));
    let tool_results = blocks_of(last, "tool_result");
    let results = (!tool_results.is_empty()).then(|| {
        let looked_up = messages.iter().any(|m| {
            blocks_of(m, "tool_use")
                .iter()
                .any(|b| b.get("name").and_then(Value::as_str) == Some(LOOKUP_TOOL))
        });
        let text: String = tool_results
            .iter()
            .map(|r| output_text(r.get("content")))
            .collect();
        (text, looked_up)
    });
    let is_user = |m: &Value| m.get("role").and_then(Value::as_str) == Some("user");
    let turn = lookup_turn(LookupView {
        declared,
        summary: summary_in(messages.iter().map(text_of)),
        recall: asks_to_recall(messages.iter().filter(|m| is_user(m)).map(text_of)),
        results,
        question: text_of(last),
    })?;
    let mut blocks = Vec::new();
    if thinking {
        let thought = "The summary may have lost the code.".to_string();
        blocks.push(json!({"type": "thinking", "thinking": thought,
                           "signature": crate::anthropic::thinking_signature(&thought)}));
    }
    blocks.push(json!({"type": "text", "text": turn.text}));
    let Some(reference) = turn.call else {
        return Some((blocks, "end_turn"));
    };
    blocks.push(
        json!({"type": "tool_use", "id": format!("toolu_lookup_{}", messages.len()),
                       "name": LOOKUP_TOOL, "input": {"ref": reference}}),
    );
    Some((blocks, "tool_use"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_is_read_back_from_call_ids() {
        assert_eq!(next_step(b"{}"), 1);
        let body = br#"{"a":"toolu_agentstep_03_0","b":"call_agentstep_11_1","c":"agentstep_x"}"#;
        assert_eq!(next_step(body), 12);
    }

    #[test]
    fn messages_steps_read_files_then_finish() {
        let script = AgentScript {
            steps: 3,
            files: vec!["/w/a".into(), "/w/b".into()],
        };
        let request = json!({"tools": [{"name": "Bash"}, {"name": "Read"}], "thinking": {"type": "adaptive"}});
        let (blocks, stop) = message_blocks(&script, &request, b"{}");
        assert_eq!(stop, "tool_use");
        assert_eq!(blocks[0]["type"], "thinking");
        assert_eq!(blocks[2]["name"], "Read");
        assert_eq!(blocks[2]["input"]["file_path"], "/w/a");
        let third = br#"{"id":"toolu_agentstep_02_0"}"#;
        let (blocks, _) = message_blocks(&script, &request, third);
        assert_eq!(blocks.iter().filter(|b| b["type"] == "tool_use").count(), 2);
        let (blocks, stop) = message_blocks(&script, &request, br#"{"id":"toolu_agentstep_03_1"}"#);
        assert_eq!(stop, "end_turn");
        assert_eq!(blocks[1]["text"], "AGENT-DONE steps=3");
    }

    #[test]
    fn codex_gets_exec_calls_from_its_namespaced_tools() {
        let script = AgentScript {
            steps: 2,
            files: vec!["/w/a".into()],
        };
        let request = json!({"parallel_tool_calls": false, "reasoning": {"effort": "low"},
            "input": [{"type": "additional_tools", "tools": [{"type": "namespace", "name": "functions", "tools": [{"type": "custom", "name": "exec"}]}]}]});
        let items = response_items(&script, &request, br#"{"x":"call_agentstep_03_0"}"#, "1");
        assert_eq!(items[0]["type"], "reasoning");
        assert_eq!(items.len(), 2, "done: reasoning and the final message");
        let items = response_items(&script, &request, b"{}", "1");
        assert_eq!(items[2]["type"], "custom_tool_call");
        assert!(items[2]["input"].as_str().unwrap().contains("cat /w/a"));
    }
}
