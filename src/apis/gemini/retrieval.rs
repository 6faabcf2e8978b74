//! Lookups (`summarization.retrieval`) on Google's Gemini API: the tool as one more function
//! declaration (in the request's first tool that declares functions, since Google takes
//! function declarations in one tool), the model's calls read from its `functionCall` parts,
//! answered by a user turn of as many `functionResponse` parts after the model turn as the
//! model wrote it up to its lookups, thought signatures included (Google checks them in the
//! active loop, which the lookup's turn is part of).
//!
//! Streamed (`alt=sse`), text and thought parts reach the client as they come; call parts, the
//! finish and the usage are held to the round's end, when one last chunk carries the calls
//! that are the client's, the finish, and the rounds' usage summed. A stream without `alt=sse`
//! is one JSON array, which cannot be cut into rounds: it is not offered the tool.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::retrieval::{
    appended, ref_schema, with_first_member, Call, CallRead, Part, StreamRounds, Turn, Usage, Wire,
    TOOL_DESCRIPTION,
};
use crate::served::splice::Event;

pub struct GeminiRetrieval;

#[derive(Deserialize)]
struct Offer<'a> {
    #[serde(borrow, default)]
    contents: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(default, rename = "toolConfig", alias = "tool_config")]
    tool_config: Option<Value>,
    #[serde(default, rename = "generationConfig", alias = "generation_config")]
    generation_config: Option<Value>,
}

#[derive(Deserialize)]
struct ToolView<'a> {
    #[serde(
        borrow,
        default,
        rename = "functionDeclarations",
        alias = "function_declarations"
    )]
    declarations: Option<&'a RawValue>,
}

fn declaration_json(tool: &str) -> String {
    json!({"name": tool, "description": TOOL_DESCRIPTION, "parameters": ref_schema()}).to_string()
}

/// A member by its proto name in either spelling.
fn member<'v>(value: &'v Value, camel: &str, snake: &str) -> Option<&'v Value> {
    value.get(camel).or_else(|| value.get(snake))
}

fn call_of(part: &Value) -> Option<&Value> {
    member(part, "functionCall", "function_call")
}

fn response_of(part: &Value) -> Option<&Value> {
    member(part, "functionResponse", "function_response")
}

fn name_of(value: &Value) -> &str {
    value
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn parts_of(turn: &Value) -> Vec<Value> {
    turn.get("parts")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// The text of a turn's text parts (not its thoughts).
fn text_of(parts: &[Value]) -> String {
    parts
        .iter()
        .filter(|part| part.get("thought").and_then(Value::as_bool) != Some(true))
        .filter_map(|part| part.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("")
}

fn is_lookup(part: &Value, tool: &str) -> bool {
    call_of(part).is_some_and(|call| name_of(call) == tool)
}

fn lookup_of(part: &Value) -> Call {
    let call = call_of(part).cloned().unwrap_or_default();
    let args = call.get("args").cloned().unwrap_or_else(|| json!({}));
    Call {
        id: call
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        reference: args
            .get("ref")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        arguments: args.to_string(),
    }
}

/// What a function response says: its one member's text, or its JSON.
fn response_text(answer: &Value) -> String {
    match answer.get("response") {
        Some(Value::Object(response)) if response.len() == 1 => match response.values().next() {
            Some(Value::String(text)) => text.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        },
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// The first candidate's parts of an answer.
fn answer_parts(answer: &Value) -> Vec<Value> {
    answer
        .pointer("/candidates/0/content")
        .map(parts_of)
        .unwrap_or_default()
}

/// The turn a round's lookups make: its parts but the client's calls, and the lookups.
fn turn_of(parts: Vec<Value>, tool: &str) -> Turn {
    let calls: Vec<Call> = parts
        .iter()
        .filter(|p| is_lookup(p, tool))
        .map(lookup_of)
        .collect();
    if calls.is_empty() {
        return Turn::default();
    }
    let content: Vec<Value> = parts
        .into_iter()
        .filter(|p| call_of(p).is_none() || is_lookup(p, tool))
        .collect();
    Turn {
        said: text_of(&content),
        calls,
        content,
        answers: Vec::new(),
    }
}

impl Wire for GeminiRetrieval {
    fn parts(&self, turns: &[(&str, Value)]) -> Vec<Part> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < turns.len() {
            let (raw, turn) = &turns[i];
            let role = turn.get("role").and_then(Value::as_str).unwrap_or("user");
            let parts = parts_of(turn);
            let calls: Vec<&Value> = parts.iter().filter_map(call_of).collect();
            let text = text_of(&parts);
            if calls.is_empty() {
                out.push(Part::message(raw, role, &text));
                i += 1;
                continue;
            }
            // The next turn answers the calls, by name and rank.
            let answers: Vec<Value> = turns
                .get(i + 1)
                .map(|(_, next)| {
                    parts_of(next)
                        .iter()
                        .filter_map(response_of)
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            let mut raw_all = raw.to_string();
            if !answers.is_empty() {
                raw_all.push_str(turns[i + 1].0);
            }
            let arguments: Vec<String> = calls
                .iter()
                .map(|call| call.get("args").map(Value::to_string).unwrap_or_default())
                .collect();
            let mut used = vec![false; answers.len()];
            let read: Vec<CallRead> = calls
                .iter()
                .zip(&arguments)
                .map(|(call, arguments)| {
                    let name = name_of(call);
                    let answering = answers
                        .iter()
                        .enumerate()
                        .find(|(k, answer)| !used[*k] && name_of(answer) == name);
                    let output = answering.map(|(k, answer)| {
                        used[k] = true;
                        response_text(answer)
                    });
                    CallRead {
                        name,
                        arguments,
                        output,
                    }
                })
                .collect();
            out.push(Part::calls(raw_all, (role, &text), &read));
            i += if answers.is_empty() { 1 } else { 2 };
        }
        out
    }

    fn offers(&self, body: &[u8]) -> bool {
        let Ok(offer) = serde_json::from_slice::<Offer>(body) else {
            return false;
        };
        let calling = offer
            .tool_config
            .as_ref()
            .and_then(|config| member(config, "functionCallingConfig", "function_calling_config"));
        let choice_ok = calling.is_none_or(|calling| {
            let mode = calling
                .get("mode")
                .and_then(Value::as_str)
                .unwrap_or("AUTO");
            let allowed = member(calling, "allowedFunctionNames", "allowed_function_names");
            matches!(mode, "AUTO" | "MODE_UNSPECIFIED" | "VALIDATED") && allowed.is_none()
        });
        let one_candidate = offer
            .generation_config
            .as_ref()
            .and_then(|config| member(config, "candidateCount", "candidate_count"))
            .and_then(Value::as_u64)
            .unwrap_or(1)
            == 1;
        let tools_ok = offer
            .tools
            .is_none_or(|raw| raw.get().trim_start().starts_with('['));
        let turns = offer
            .contents
            .is_some_and(|raw| raw.get().trim_start().starts_with('['));
        choice_ok && one_candidate && tools_ok && turns
    }

    fn offers_at(&self, path_and_query: &str) -> bool {
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        !path.ends_with(":streamGenerateContent") || query.split('&').any(|p| p == "alt=sse")
    }

    fn with_tool(&self, body: &[u8], tool: &str) -> Option<Vec<u8>> {
        let offer: Offer = serde_json::from_slice(body).ok()?;
        let declaration = declaration_json(tool);
        let new_tool = format!("{{\"functionDeclarations\":[{declaration}]}}");
        let Some(tools) = offer.tools else {
            return with_first_member(body, "tools", &format!("[{new_tool}]"));
        };
        let views: Vec<ToolView> = serde_json::from_str(tools.get()).ok()?;
        match views.iter().find_map(|view| view.declarations) {
            Some(declarations) => appended(body, declarations, &declaration),
            None => appended(body, tools, &new_tool),
        }
    }

    fn with_turn(&self, body: &[u8], tool: &str, turn: &Turn) -> Option<Vec<u8>> {
        let offer: Offer = serde_json::from_slice(body).ok()?;
        let model = json!({"role": "model", "parts": turn.content});
        let responses: Vec<Value> = turn
            .calls
            .iter()
            .zip(&turn.answers)
            .map(|(call, answer)| {
                let mut response = json!({"name": tool, "response": {"output": answer}});
                if !call.id.is_empty() {
                    response["id"] = Value::from(call.id.clone());
                }
                json!({"functionResponse": response})
            })
            .collect();
        let user = json!({"role": "user", "parts": responses});
        appended(body, offer.contents?, &format!("{model},{user}"))
    }

    fn lookups(&self, answer: &Value, tool: &str) -> Turn {
        turn_of(answer_parts(answer), tool)
    }

    fn add_usage(&self, answer: &Value, usage: &mut Usage) {
        usage.add(
            answer.get("usageMetadata"),
            "promptTokenCount",
            "candidatesTokenCount",
        );
    }

    fn merged(
        &self,
        first: &Value,
        said: &str,
        mut last: Value,
        usage: &Usage,
        tool: &str,
    ) -> Value {
        if let Some(id) = first.get("responseId") {
            last["responseId"] = id.clone();
        }
        let mut parts = Vec::new();
        if !said.is_empty() {
            parts.push(json!({"text": said}));
        }
        parts.extend(
            answer_parts(&last)
                .into_iter()
                .filter(|p| !is_lookup(p, tool)),
        );
        if let Some(content) = last.pointer_mut("/candidates/0/content") {
            content["parts"] = Value::Array(parts);
        }
        if usage.seen {
            last["usageMetadata"] = usage_json(usage, last.get("usageMetadata"));
        }
        last
    }

    fn stream(&self, tool: &str) -> Box<dyn StreamRounds> {
        Box::new(GeminiStream {
            tool: tool.to_string(),
            ..GeminiStream::default()
        })
    }

    fn failure(&self, status: u16, message: &str) -> Vec<u8> {
        let data = json!({"error": {"code": status, "message": message, "status": "UNAVAILABLE"}});
        format!("data: {data}\r\n\r\n").into_bytes()
    }
}

fn usage_json(usage: &Usage, last: Option<&Value>) -> Value {
    usage.json(
        last,
        [
            "promptTokenCount",
            "candidatesTokenCount",
            "totalTokenCount",
        ],
    )
}

/// A streamed answer across rounds.
#[derive(Default)]
struct GeminiStream {
    tool: String,
    /// The first round's `responseId`, which every chunk the client gets carries.
    first_id: Option<Value>,
    rounds: usize,
    /// This round's parts as they came (text joined or not, calls whole).
    parts: Vec<Value>,
    /// This round's last chunk, whose finish and usage the round's end sends.
    last: Option<Value>,
    /// The usage of the rounds before this one, and this round's (Google's chunks carry it
    /// cumulated, so the last one counts).
    before: Usage,
    this_round: Usage,
}

impl StreamRounds for GeminiStream {
    fn event(&mut self, event: Event<'_>, out: &mut Vec<u8>) {
        let mut chunk = event.data;
        if chunk.get("candidates").is_none() && chunk.get("usageMetadata").is_none() {
            // An error, compactor's notice: as they came.
            out.extend_from_slice(event.raw);
            return;
        }
        if self.first_id.is_none() {
            self.first_id = chunk.get("responseId").cloned();
        }
        if chunk.get("usageMetadata").is_some() {
            let mut usage = Usage::default();
            usage.add(
                chunk.get("usageMetadata"),
                "promptTokenCount",
                "candidatesTokenCount",
            );
            self.this_round = usage;
        }
        let parts = answer_parts(&chunk);
        self.parts.extend(parts.iter().cloned());
        let finished = chunk
            .pointer("/candidates/0/finishReason")
            .is_some_and(|f| !f.is_null());
        let has_calls = parts.iter().any(|p| call_of(p).is_some());
        if !finished && !has_calls && self.rounds == 0 {
            out.extend_from_slice(event.raw);
            return;
        }
        let shown: Vec<Value> = parts.into_iter().filter(|p| call_of(p).is_none()).collect();
        self.last = Some(chunk.clone());
        if shown.is_empty() {
            return;
        }
        if let Some(content) = chunk.pointer_mut("/candidates/0/content") {
            content["parts"] = Value::Array(shown);
        }
        if let Some(candidate) = chunk
            .pointer_mut("/candidates/0")
            .and_then(Value::as_object_mut)
        {
            candidate.remove("finishReason");
        }
        if let Some(object) = chunk.as_object_mut() {
            object.remove("usageMetadata");
        }
        if let Some(id) = &self.first_id {
            if chunk.get("responseId").is_some() {
                chunk["responseId"] = id.clone();
            }
        }
        out.extend_from_slice(format!("data: {chunk}\r\n\r\n").as_bytes());
    }

    fn pass(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(raw);
    }

    fn end(&mut self, may_expand: bool, out: &mut Vec<u8>) -> Turn {
        let parts = std::mem::take(&mut self.parts);
        let turn = turn_of(parts.clone(), &self.tool);
        if turn.calls.is_empty() || !may_expand {
            self.flush(&parts, out);
            return Turn::default();
        }
        self.before.prompt += self.this_round.prompt;
        self.before.completion += self.this_round.completion;
        self.before.seen |= self.this_round.seen;
        self.this_round = Usage::default();
        self.last = None;
        self.rounds += 1;
        turn
    }
}

impl GeminiStream {
    /// The round's last chunk as the answer's end: the client's calls, the finish, the usage.
    fn flush(&mut self, parts: &[Value], out: &mut Vec<u8>) {
        let Some(mut last) = self.last.take() else {
            return;
        };
        let calls: Vec<Value> = parts
            .iter()
            .filter(|p| call_of(p).is_some() && !is_lookup(p, &self.tool))
            .cloned()
            .collect();
        if let Some(content) = last.pointer_mut("/candidates/0/content") {
            content["parts"] = Value::Array(calls);
        }
        let usage = Usage {
            prompt: self.before.prompt + self.this_round.prompt,
            completion: self.before.completion + self.this_round.completion,
            seen: self.before.seen || self.this_round.seen,
        };
        if usage.seen {
            last["usageMetadata"] = usage_json(&usage, last.get("usageMetadata"));
        }
        if let Some(id) = &self.first_id {
            last["responseId"] = id.clone();
        }
        out.extend_from_slice(format!("data: {last}\r\n\r\n").as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_turn_and_its_responses_are_one_ref() {
        let call = json!({"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {"path": "a"}}, "thoughtSignature": "s"}]}).to_string();
        let answer = json!({"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"output": "the code is X"}}}]}).to_string();
        let text = json!({"role": "user", "parts": [{"text": "hi"}]}).to_string();
        let parts =
            GeminiRetrieval.parts(&crate::retrieval::parsed([text.as_str(), &call, &answer]));
        assert_eq!(parts.len(), 2, "{parts:#?}");
        assert_eq!(parts[1].raw, format!("{call}{answer}"));
        assert!(parts[1]
            .text
            .ends_with("[result of read_file]\nthe code is X"));
    }

    #[test]
    fn a_stream_without_sse_and_a_forced_choice_are_not_offered() {
        assert!(GeminiRetrieval.offers_at("/v1beta/models/g:streamGenerateContent?alt=sse"));
        assert!(GeminiRetrieval.offers_at("/v1beta/models/g:generateContent"));
        assert!(!GeminiRetrieval.offers_at("/v1beta/models/g:streamGenerateContent"));
        let offers = |body: Value| GeminiRetrieval.offers(body.to_string().as_bytes());
        assert!(offers(json!({"contents": []})));
        assert!(!offers(
            json!({"contents": [], "toolConfig": {"functionCallingConfig": {"mode": "NONE"}}})
        ));
        assert!(!offers(
            json!({"contents": [], "generationConfig": {"candidateCount": 2}})
        ));
    }

    #[test]
    fn the_tool_joins_the_functions_already_declared() {
        let body = json!({"contents": [], "tools": [{"googleSearch": {}}, {"functionDeclarations": [{"name": "a"}]}]});
        let out = GeminiRetrieval
            .with_tool(body.to_string().as_bytes(), "compactor_expand")
            .unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        let names: Vec<&str> = out["tools"][1]["functionDeclarations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a", "compactor_expand"]);
        assert_eq!(out["tools"].as_array().unwrap().len(), 2);
    }
}
