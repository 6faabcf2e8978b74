//! Gemini's `generateContent` as the mock plays it: a fixed answer, whole, as SSE
//! (`alt=sse`) or as the one JSON array Google streams without it; and what Google refuses
//! before it answers: a call without an API key (`x-goog-api-key` or `key`), a body whose
//! `contents` are not turns of `user` and `model` holding `parts`.

use serde_json::{json, Value};

/// The answer's text.
pub const REPLY: &str = "Hello from Gemini.";

/// The model and method of a Gemini model call's path (`/v1beta/models/{m}:{method}`).
pub fn call_of(path: &str) -> Option<(&str, &str)> {
    let call = path.rsplit('/').next()?;
    let (model, method) = call.split_once(':')?;
    path.contains("/models/").then_some((model, method))
}

/// Why Google would refuse the call, in its error shape, with the status.
pub fn refusal(has_key: bool, body: &[u8]) -> Option<(u16, Value)> {
    let error = |code: u16, status: &str, message: &str| {
        Some((
            code,
            json!({"error": {"code": code, "message": message, "status": status}}),
        ))
    };
    if !has_key {
        return error(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.");
    }
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.");
    };
    let turns_valid = request
        .get("contents")
        .and_then(Value::as_array)
        .is_some_and(|turns| {
            turns.iter().all(|turn| {
                matches!(
                    turn.get("role").and_then(Value::as_str),
                    None | Some("user" | "model")
                ) && turn.get("parts").and_then(Value::as_array).is_some()
            })
        });
    if !turns_valid {
        return error(
            400,
            "INVALID_ARGUMENT",
            "* GenerateContentRequest.contents: contents is not specified or not turns of parts",
        );
    }
    let turns = request
        .get("contents")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let why = out_of_place(&turns)
        .or_else(|| unanswered_calls(&turns))
        .or_else(|| broken_signature(&turns));
    if let Some(why) = why {
        return error(400, "INVALID_ARGUMENT", &why);
    }
    None
}

/// The signature the mock gives the first call of a model turn it makes.
pub fn signature(call_id: &str) -> String {
    format!("c2lnLW1vY2s-{call_id}")
}

fn parts_with<'t>(turn: &'t Value, key: &str) -> Vec<&'t Value> {
    turn.get("parts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|part| part.get(key).is_some())
        .collect()
}

/// Google's order of function turns: a turn of calls right after a user turn or a turn of
/// responses, a turn of responses right after a turn of calls.
fn out_of_place(turns: &[Value]) -> Option<String> {
    let from_model = |turn: &Value| turn.get("role").and_then(Value::as_str) == Some("model");
    for (i, turn) in turns.iter().enumerate() {
        let before = i.checked_sub(1).and_then(|j| turns.get(j));
        let calls = from_model(turn) && !parts_with(turn, "functionCall").is_empty();
        if calls && (i == 0 || before.is_some_and(from_model)) {
            return Some(format!("Please ensure that function call turn comes immediately after a user turn or after a function response turn (contents[{i}])."));
        }
        if !from_model(turn) && !parts_with(turn, "functionResponse").is_empty() {
            let after_calls = before.is_some_and(|before| {
                from_model(before) && !parts_with(before, "functionCall").is_empty()
            });
            if !after_calls {
                return Some(format!("Please ensure that function response turn comes immediately after a function call turn (contents[{i}])."));
            }
        }
    }
    None
}

/// A model turn's function calls must be answered by the next turn, a user turn holding as many
/// function responses (Google: "Please ensure that the number of function response parts is
/// equal to the number of function call parts of the function call turn").
fn unanswered_calls(turns: &[Value]) -> Option<String> {
    for (i, turn) in turns.iter().enumerate() {
        let calls = parts_with(turn, "functionCall").len();
        if calls == 0 {
            continue;
        }
        let answers = turns
            .get(i + 1)
            .filter(|next| next.get("role").and_then(Value::as_str) != Some("model"))
            .map_or(0, |next| parts_with(next, "functionResponse").len());
        if answers != calls {
            return Some(format!("Please ensure that the number of function response parts ({answers}) is equal to the number of function call parts ({calls}) of the function call turn (contents[{i}])."));
        }
    }
    None
}

/// In the active loop (from the last user turn holding text and no function response), the
/// first call of each model turn the mock made must carry the signature it was given.
fn broken_signature(turns: &[Value]) -> Option<String> {
    let starts_loop = |turn: &Value| {
        turn.get("role").and_then(Value::as_str) != Some("model")
            && !parts_with(turn, "text").is_empty()
            && parts_with(turn, "functionResponse").is_empty()
    };
    let start = turns.iter().rposition(starts_loop).unwrap_or(0);
    for (i, turn) in turns.iter().enumerate().skip(start) {
        let Some(first) = parts_with(turn, "functionCall").into_iter().next() else {
            continue;
        };
        let Some(id) = first.pointer("/functionCall/id").and_then(Value::as_str) else {
            continue;
        };
        if !id.starts_with("agentstep_") {
            continue;
        }
        let signed = first.get("thoughtSignature").and_then(Value::as_str);
        if signed != Some(signature(id).as_str()) {
            return Some(format!("Function call is missing a thought_signature in functionCall parts (contents[{i}])."));
        }
    }
    None
}

/// Who answers: the model, and the prompt's tokens as the mock counted them (the usage).
#[derive(Debug, Clone, Copy)]
pub struct Answerer<'m> {
    pub model: &'m str,
    pub prompt_tokens: u64,
}

/// One response object with `text`, the last of a stream carrying the finish and the usage.
fn chunk(by: Answerer<'_>, text: &str, last: bool) -> Value {
    let mut candidate =
        json!({"content": {"role": "model", "parts": [{"text": text}]}, "index": 0});
    let mut response = json!({"modelVersion": by.model, "responseId": "mock-gemini"});
    if last {
        candidate["finishReason"] = json!("STOP");
        let prompt = by.prompt_tokens;
        response["usageMetadata"] = json!({"promptTokenCount": prompt, "candidatesTokenCount": 4, "totalTokenCount": prompt + 4});
    }
    response["candidates"] = json!([candidate]);
    response
}

/// The whole answer: the fixed text, or, when the request asks for JSON with a schema (the
/// Gemini CLI's routing call), an object with every required property of the schema.
pub fn answer(by: Answerer<'_>, request: &[u8]) -> Value {
    let schema = serde_json::from_slice::<Value>(request)
        .ok()
        .and_then(|request| {
            let config = request.get("generationConfig")?;
            let json = config.get("responseMimeType")?.as_str()? == "application/json";
            json.then(|| {
                config
                    .get("responseJsonSchema")
                    .or_else(|| config.get("responseSchema"))
                    .cloned()
                    .unwrap_or(Value::Null)
            })
        });
    match schema {
        Some(schema) => chunk(by, &schema_instance(&schema).to_string(), true),
        None => chunk(by, REPLY, true),
    }
}

/// The plainest value of a JSON schema (Google's upper-case type names or JSON Schema's).
fn schema_instance(schema: &Value) -> Value {
    let kind = schema
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("object")
        .to_ascii_lowercase();
    match kind.as_str() {
        "string" => json!("mock"),
        "integer" | "number" => json!(1),
        "boolean" => json!(false),
        "array" => json!([]),
        _ => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let object = properties
                .into_iter()
                .flatten()
                .map(|(name, property)| (name.clone(), schema_instance(property)))
                .collect();
            Value::Object(object)
        }
    }
}

/// A model turn of `parts` as one response, finished, with usage.
pub fn turn(by: Answerer<'_>, parts: Vec<Value>) -> Value {
    let mut response = chunk(by, "", true);
    response["candidates"][0]["content"]["parts"] = Value::Array(parts);
    response
}

/// A model turn streamed as Google streams one: a chunk per text part, then the other parts
/// with the finish and the usage.
pub fn turn_chunks(turn: &Value) -> Vec<Value> {
    let parts = turn
        .pointer("/candidates/0/content/parts")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let (texts, rest): (Vec<Value>, Vec<Value>) =
        parts.into_iter().partition(|p| p.get("text").is_some());
    let mut chunks: Vec<Value> = texts
        .into_iter()
        .map(|part| {
            let mut chunk = turn.clone();
            chunk["candidates"][0]["content"]["parts"] = json!([part]);
            if let Some(candidate) = chunk["candidates"][0].as_object_mut() {
                candidate.remove("finishReason");
            }
            if let Some(object) = chunk.as_object_mut() {
                object.remove("usageMetadata");
            }
            chunk
        })
        .collect();
    let mut last = turn.clone();
    last["candidates"][0]["content"]["parts"] = Value::Array(rest);
    chunks.push(last);
    chunks
}

/// The answer streamed: two chunks.
pub fn stream_chunks(by: Answerer<'_>) -> Vec<Value> {
    let (first, rest) = REPLY.split_at(6);
    vec![chunk(by, first, false), chunk(by, rest, true)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn google_refuses_a_call_without_a_key_or_with_contents_that_are_not_turns() {
        let turns = br#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;
        assert_eq!(refusal(true, turns), None);
        assert_eq!(refusal(false, turns).map(|(code, _)| code), Some(403));
        for bad in [
            &br#"{"contents":[{"role":"assistant","parts":[]}]}"#[..],
            br#"{"contents":[{"role":"user"}]}"#,
            br#"{"messages":[]}"#,
            b"not json",
        ] {
            assert_eq!(refusal(true, bad).map(|(code, _)| code), Some(400));
        }
        assert_eq!(
            call_of("/v1beta/models/gemini-2.5-pro:streamGenerateContent"),
            Some(("gemini-2.5-pro", "streamGenerateContent"))
        );
        assert_eq!(call_of("/v1/chat/completions"), None);
    }

    const BY: Answerer<'static> = Answerer {
        model: "m",
        prompt_tokens: 8,
    };

    #[test]
    fn a_request_for_json_gets_every_property_of_its_schema() {
        let routing = br#"{"contents":[],"generationConfig":{"responseMimeType":"application/json","responseJsonSchema":{"type":"OBJECT","properties":{"complexity_reasoning":{"type":"STRING"},"complexity_score":{"type":"INTEGER"}}}}}"#;
        let text = answer(BY, routing)["candidates"][0]["content"]["parts"][0]["text"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_default();
        let object: Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(object["complexity_reasoning"], "mock");
        assert_eq!(object["complexity_score"], 1);
        let plain = answer(BY, br#"{"contents":[]}"#);
        assert_eq!(plain["candidates"][0]["content"]["parts"][0]["text"], REPLY);
    }

    #[test]
    fn calls_must_be_answered_one_for_one_and_signed_in_the_active_loop() {
        let call = |id: &str, signed: bool| {
            let mut part = json!({"functionCall": {"name": "read_file", "args": {}, "id": id}});
            if signed {
                part["thoughtSignature"] = json!(signature(id));
            }
            part
        };
        let answer = json!({"functionResponse": {"name": "read_file", "response": {}}});
        let body = |turns: Value| json!({"contents": turns}).to_string().into_bytes();
        let task = json!({"role": "user", "parts": [{"text": "go"}]});
        let good = body(
            json!([task, {"role": "model", "parts": [call("agentstep_01_1", true), call("agentstep_01_2", false)]},
            {"role": "user", "parts": [answer, answer]}]),
        );
        assert_eq!(refusal(true, &good), None);
        let short = body(
            json!([task, {"role": "model", "parts": [call("agentstep_01_1", true), call("agentstep_01_2", false)]},
            {"role": "user", "parts": [answer]}]),
        );
        assert_eq!(refusal(true, &short).map(|(code, _)| code), Some(400));
        let unsigned = body(
            json!([task, {"role": "model", "parts": [call("agentstep_01_1", false)]},
            {"role": "user", "parts": [answer]}]),
        );
        assert_eq!(refusal(true, &unsigned).map(|(code, _)| code), Some(400));
        // Before the active loop (a later user turn with text), signatures are not checked.
        let earlier = body(
            json!([task, {"role": "model", "parts": [call("agentstep_01_1", false)]},
            {"role": "user", "parts": [answer]}, {"role": "user", "parts": [{"text": "next task"}]}]),
        );
        assert_eq!(refusal(true, &earlier), None);
        // A response with no call before it, a call after a model turn: out of place.
        let orphan = body(json!([task, {"role": "user", "parts": [answer]}]));
        assert_eq!(refusal(true, &orphan).map(|(code, _)| code), Some(400));
        let after_model = body(json!([task, {"role": "model", "parts": [{"text": "hm"}]},
            {"role": "model", "parts": [call("x", false)]}, {"role": "user", "parts": [answer]}]));
        assert_eq!(refusal(true, &after_model).map(|(code, _)| code), Some(400));
    }
}
