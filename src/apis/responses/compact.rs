//! OpenAI's compaction contracts on `/responses`, served for upstreams that lack them:
//! `POST /v1/responses/compact`, a request ending with a `compaction_trigger` item (Codex's
//! remote compaction), and the expansion of compactor's own `compaction` items when the client
//! sends them back.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::{input_item_spans, summary_item};
use crate::apis::Api;
use crate::compaction::reason::Reason;
use crate::compaction::{Outcome, OutcomeKind};
use crate::error::ProxyError;
use crate::sealing::Sealer;
use crate::served::splice;
use crate::served::Binding;
use crate::served::{
    compacted, failed, hex_digest, nothing_to_summarize, now, object_off_reactor, open, seal, Ask,
    Carried,
};

/// The path of OpenAI's compaction endpoint under the API prefix.
pub const COMPACT_PATH: &str = "/responses/compact";

/// `body` (a Responses or compact body) with compactor's own compaction items replaced by what
/// they carry (the summary message, kept items); None when it holds none (most bodies: a byte
/// search decides).
pub fn expand(
    body: &[u8],
    sealer: &Sealer,
    binding: &Binding,
) -> Result<Option<Bytes>, ProxyError> {
    if memchr::memmem::find(body, crate::sealing::PREFIX.as_bytes()).is_none() {
        return Ok(None);
    }
    let Some(items) = input_item_spans(body) else {
        return Ok(None);
    };
    let (Some(first), Some(last)) = (items.first(), items.last()) else {
        return Ok(None);
    };
    let array = first.0.start..last.0.end;
    // The items between the first and the last, rebuilt: each kept as its bytes or replaced by
    // what it carries (possibly nothing), joined by commas.
    let mut rebuilt: Vec<String> = Vec::with_capacity(items.len());
    let mut expanded = false;
    for (span, sealed) in &items {
        let original = || String::from_utf8_lossy(&body[span.clone()]).into_owned();
        let Some(sealed) = sealed else {
            rebuilt.push(original());
            continue;
        };
        let Some(carried) = open(sealer, binding, sealed)? else {
            rebuilt.push(original());
            continue;
        };
        expanded = true;
        if carried.replaces {
            rebuilt.clear();
        }
        if !carried.summary.is_empty() {
            rebuilt.push(summary_item(&carried.summary));
        }
        rebuilt.extend(carried.items.iter().map(Value::to_string));
    }
    if !expanded {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(body.len());
    out.extend_from_slice(&body[..array.start]);
    out.extend_from_slice(rebuilt.join(",").as_bytes());
    out.extend_from_slice(&body[array.end..]);
    Ok(Some(Bytes::from(out)))
}

/// A conversation compacted on the client's request: the pinned head, the summary (empty when
/// nothing was worth one) and the kept tail, as items.
struct Compaction {
    head: Vec<Value>,
    summary: String,
    tail: Vec<Value>,
    outcome: Outcome,
}

/// Compacts `body` (model, instructions, input) as if `x-compactor: force` were sent, with
/// the planner, summarizer, cache and budget every request uses.
async fn compact_forced(ask: &Ask<'_>, body: Bytes) -> Result<Compaction, ProxyError> {
    let original = input_items(&body);
    let compacted = compacted(ask, body, &Api::Responses.body_request(), None, None).await?;
    let outcome = compacted.outcome.clone();
    match outcome.kind {
        OutcomeKind::Summarized | OutcomeKind::Reused => {
            let summary = compacted.summary.ok_or_else(|| failed(Reason::None))?;
            let mut items = input_items(&compacted.body);
            // The summary's item is the one the planner added.
            let at = items
                .iter()
                .position(|item| !original.contains(item))
                .ok_or_else(|| failed(Reason::None))?;
            let tail = items.split_off(at + 1);
            items.truncate(at);
            Ok(Compaction {
                head: items,
                summary,
                tail,
                outcome,
            })
        }
        OutcomeKind::Skipped if nothing_to_summarize(outcome.reason) => {
            let mut tail = original;
            let pinned = tail.iter().take_while(|item| is_instruction(item)).count();
            let head = tail.drain(..pinned).collect();
            Ok(Compaction {
                head,
                summary: String::new(),
                tail,
                outcome,
            })
        }
        _ => Err(failed(outcome.reason)),
    }
}

/// Whether a kept item is one Codex keeps itself across a remote compaction (its instructions
/// and user turns): the compaction item carries the rest.
fn client_keeps(item: &Value) -> bool {
    is_instruction(item) || item.get("role").and_then(Value::as_str) == Some("user")
}

fn is_instruction(item: &Value) -> bool {
    matches!(
        item.get("role").and_then(Value::as_str),
        Some("system" | "developer")
    )
}

/// Answers `POST /responses/compact`: OpenAI's `response.compaction` object, whose output is
/// the new history: the head, the kept user turns, and one compaction item carrying the
/// summary and the rest of the kept tail.
pub async fn compact(ask: &Ask<'_>, body: &Bytes) -> Result<(Bytes, Outcome), ProxyError> {
    let binding = ask.binding();
    let fields = object_off_reactor(ask.engine, body).await?;
    let request = CompactRequest::read(fields)?;
    let expanded = expand(&request.body, ask.sealer, &binding)?.unwrap_or(request.body.clone());
    let compaction = compact_forced(ask, expanded).await?;
    // As OpenAI's: the messages a client keeps as they are (its instructions and user turns),
    // then the one item. Codex keeps only messages and compaction items of this output, so
    // the rest of the kept tail (tool calls, their outputs, reasoning, answers) travels in the
    // item, in its order, and expands after the summary.
    let (visible, carried): (Vec<Value>, Vec<Value>) =
        compaction.tail.into_iter().partition(client_keeps);
    let item = compaction_item(ask.sealer, &binding.current, &compaction.summary, carried)?;
    let mut output = compaction.head;
    output.extend(visible);
    output.push(item);
    let created_at = now();
    let response = json!({
        "id": format!("resp_{}", hex_digest(&[request.body.as_ref(), &created_at.to_le_bytes()])),
        "object": "response.compaction",
        "created_at": created_at,
        "output": output,
        "usage": usage(&compaction.outcome),
    });
    Ok((Bytes::from(response.to_string()), compaction.outcome))
}

/// Whether a Responses body ends its input with a `compaction_trigger` item: the client asks
/// for a compaction in this response (Codex's remote compaction v2).
pub fn ends_with_trigger(body: &[u8]) -> bool {
    if memchr::memmem::find(body, b"compaction_trigger").is_none() {
        return false;
    }
    // Only the last item's type is read: the items stay raw slices, no tree is built.
    #[derive(serde::Deserialize)]
    struct Input<'a> {
        #[serde(borrow, default)]
        input: Option<Vec<&'a serde_json::value::RawValue>>,
    }
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(borrow, rename = "type")]
        kind: std::borrow::Cow<'a, str>,
    }
    let Ok(Input { input: Some(items) }) = serde_json::from_slice::<Input<'_>>(body) else {
        return false;
    };
    items
        .last()
        .and_then(|item| serde_json::from_str::<Typed<'_>>(item.get()).ok())
        .is_some_and(|item| item.kind == "compaction_trigger")
}

/// Answers a `/responses` request whose input ends with a `compaction_trigger` item: a
/// response (streamed when asked) whose output is exactly one compaction item. The client
/// keeps its own instructions and user turns; the item carries the summary and the kept tail,
/// and expands into both.
pub async fn compact_on_trigger(
    ask: &Ask<'_>,
    body: &Bytes,
) -> Result<(Bytes, bool, Outcome), ProxyError> {
    let binding = ask.binding();
    let bad = |why: &str| ProxyError::BadRequest(why.to_string());
    let Some(mut fields) = object_off_reactor(ask.engine, body).await? else {
        return Err(bad("the body must be a JSON object"));
    };
    let model = fields
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("`model` is required and must be a string"))?
        .to_string();
    let stream = fields.get("stream").and_then(Value::as_bool) == Some(true);
    let mut input = match fields.remove("input") {
        Some(Value::Array(items)) => items,
        _ => return Err(bad("`input` must be an array of items")),
    };
    input.pop();
    let instructions = fields.get("instructions");
    let planned = planned_body(&model, instructions, Value::Array(input));
    let compaction = compact_forced(ask, planned).await?;
    // The client keeps its instructions and user turns itself (Codex puts them before the
    // item): the item carries the rest of the tail, so nothing reaches the upstream twice.
    let tail = compaction
        .tail
        .into_iter()
        .filter(|item| !client_keeps(item))
        .collect();
    let item = compaction_item(ask.sealer, &binding.current, &compaction.summary, tail)?;
    let created_at = now();
    let id = format!("resp_{}", hex_digest(&[body, &created_at.to_le_bytes()]));
    let usage = usage(&compaction.outcome);
    let response = |status: &str, output: Value, usage: Value| {
        json!({
            "id": id, "object": "response", "created_at": created_at, "status": status,
            "error": null, "incomplete_details": null, "instructions": null,
            "max_output_tokens": null, "model": model, "output": output,
            "parallel_tool_calls": false, "previous_response_id": null,
            "reasoning": {"effort": null, "summary": null}, "store": false,
            "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [],
            "truncation": "disabled", "usage": usage, "user": null, "metadata": {},
        })
    };
    if !stream {
        let done = response("completed", json!([item]), usage);
        return Ok((Bytes::from(done.to_string()), false, compaction.outcome));
    }
    let text = item_stream(&response, &item, usage);
    Ok((Bytes::from(text), true, compaction.outcome))
}

/// A streamed response whose output is one item: created, in progress, the item added and
/// done, completed; `response` builds the response object at a status with an output and usage.
fn item_stream(
    response: &dyn Fn(&str, Value, Value) -> Value,
    item: &Value,
    usage: Value,
) -> Vec<u8> {
    let events = [
        (
            "response.created",
            json!({"response": response("in_progress", json!([]), Value::Null)}),
        ),
        (
            "response.in_progress",
            json!({"response": response("in_progress", json!([]), Value::Null)}),
        ),
        (
            "response.output_item.added",
            json!({"output_index": 0, "item": item}),
        ),
        (
            "response.output_item.done",
            json!({"output_index": 0, "item": item}),
        ),
        (
            "response.completed",
            json!({"response": response("completed", json!([item]), usage)}),
        ),
    ];
    let sequenced = events
        .into_iter()
        .enumerate()
        .map(|(sequence, (kind, mut data))| {
            data["sequence_number"] = json!(sequence);
            (kind, data)
        });
    splice::typed_events(sequenced)
}

/// The usage of a compaction served here: compactor's count of the conversation before and
/// after it (no model produced tokens for the client).
fn usage(outcome: &Outcome) -> Value {
    let (before, after) = (outcome.tokens_before, outcome.tokens_after);
    json!({
        "input_tokens": before,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": after,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": before + after,
    })
}

/// A compact call's body, as the Responses body the planner reads.
struct CompactRequest {
    body: Bytes,
}

impl CompactRequest {
    fn read(fields: Option<Map<String, Value>>) -> Result<CompactRequest, ProxyError> {
        let bad = |why: &str| ProxyError::BadRequest(why.to_string());
        let Some(fields) = fields else {
            return Err(bad("the body must be a JSON object"));
        };
        let Some(model) = fields.get("model").and_then(Value::as_str) else {
            return Err(bad("`model` is required and must be a string"));
        };
        if fields
            .get("previous_response_id")
            .is_some_and(|v| !v.is_null())
        {
            return Err(bad("`previous_response_id` cannot be compacted here: the upstream does not hold that conversation; send its items as `input`"));
        }
        let input = match fields.get("input") {
            None | Some(Value::Null) => Value::Array(Vec::new()),
            Some(Value::String(text)) => json!([{"role": "user", "content": text}]),
            Some(items @ Value::Array(_)) => items.clone(),
            Some(_) => return Err(bad("`input` must be a string or an array of items")),
        };
        Ok(CompactRequest {
            body: planned_body(model, fields.get("instructions"), input),
        })
    }
}

/// The Responses body a compaction is planned on: the model, the instructions when there are
/// any (pinned), the input.
fn planned_body(model: &str, instructions: Option<&Value>, input: Value) -> Bytes {
    let mut planned = Map::new();
    planned.insert("model".into(), Value::String(model.to_string()));
    if let Some(instructions) = instructions.filter(|v| !v.is_null()) {
        planned.insert("instructions".into(), instructions.clone());
    }
    planned.insert("input".into(), input);
    Bytes::from(Value::Object(planned).to_string())
}

fn input_items(body: &[u8]) -> Vec<Value> {
    array_field(body, "input")
}

/// The array `key` of a JSON object body; empty when there is none.
pub(crate) fn array_field(body: &[u8], key: &str) -> Vec<Value> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(mut fields)) => match fields.remove(key) {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

fn compaction_item(
    sealer: &Sealer,
    tenant: &[u8; 32],
    summary: &str,
    items: Vec<Value>,
) -> Result<Value, ProxyError> {
    let carried = Carried {
        summary: summary.to_string(),
        items,
        replaces: false,
    };
    let sealed = seal(sealer, tenant, &carried)?;
    Ok(json!({
        "id": format!("cmp_{}", hex_digest(&[sealed.as_bytes()])),
        "type": "compaction",
        "encrypted_content": sealed,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Items sealed for tenant `n` (and, before this binding, for the same `n`).
    fn bound(n: u8) -> Binding {
        Binding {
            current: [n; 32],
            earlier: [n; 32],
        }
    }
    use crate::compaction::planner::rewrite::SUMMARY_PREFIX;
    use crate::config::Secret;

    fn sealer() -> Sealer {
        Sealer::new(&[Secret::new("a sealing key of 16+ bytes")]).unwrap()
    }

    fn sealed(sealer: &Sealer, summary: &str, items: &[&str]) -> String {
        let items = items
            .iter()
            .map(|raw| serde_json::from_str(raw).unwrap())
            .collect();
        let item = compaction_item(sealer, &[3; 32], summary, items).unwrap();
        item["encrypted_content"].as_str().unwrap().to_string()
    }

    #[test]
    fn an_item_carrying_the_kept_tail_expands_into_the_summary_and_the_tail() {
        let sealer = sealer();
        let call = r#"{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}"#;
        let output = r#"{"type":"function_call_output","call_id":"c","output":"x"}"#;
        let sealed = sealed(&sealer, "earlier", &[call, output]);
        let body = format!(
            r#"{{"model":"m","input":[{{"role":"user","content":"task"}},{{"type":"compaction","encrypted_content":"{sealed}"}},{{"role":"user","content":"go on"}}]}}"#
        );
        let out = expand(body.as_bytes(), &sealer, &bound(3))
            .unwrap()
            .unwrap();
        let value: Value = serde_json::from_slice(&out).unwrap();
        let items = value["input"].as_array().unwrap();
        assert_eq!(items.len(), 5);
        assert_eq!(
            items[1]["content"][0]["text"],
            format!("{SUMMARY_PREFIX}earlier")
        );
        assert_eq!(items[2]["type"], "function_call");
        assert_eq!(items[3]["type"], "function_call_output");
        assert_eq!(items[4]["content"], "go on");
    }

    #[test]
    fn an_item_that_replaces_the_input_drops_what_came_before_it() {
        let sealer = sealer();
        let carried = Carried {
            summary: String::new(),
            items: vec![
                json!({"role": "developer", "content": "d"}),
                json!({"role": "user", "content": "summary"}),
            ],
            replaces: true,
        };
        let sealed = seal(&sealer, &[3; 32], &carried).unwrap();
        let body = format!(
            r#"{{"model":"m","input":[{{"role":"developer","content":"d"}},{{"role":"user","content":"old"}},{{"type":"compaction","encrypted_content":"{sealed}"}},{{"role":"assistant","content":"a"}},{{"role":"user","content":"next"}}]}}"#
        );
        let out = expand(body.as_bytes(), &sealer, &bound(3))
            .unwrap()
            .unwrap();
        let texts: Vec<Value> = input_items(&out)
            .iter()
            .map(|i| i["content"].clone())
            .collect();
        assert_eq!(
            texts,
            [json!("d"), json!("summary"), json!("a"), json!("next")]
        );
    }

    #[test]
    fn a_trigger_is_the_last_item_or_nothing() {
        assert!(ends_with_trigger(
            br#"{"model":"m","input":[{"role":"user","content":"q"},{"type":"compaction_trigger"}]}"#
        ));
        assert!(!ends_with_trigger(
            br#"{"model":"m","input":[{"type":"compaction_trigger"},{"role":"user","content":"q"}]}"#
        ));
        assert!(!ends_with_trigger(
            br#"{"model":"m","input":"compaction_trigger"}"#
        ));
    }

    #[test]
    fn compactors_items_are_expanded_in_place_and_others_kept() {
        let sealer = sealer();
        let sealed = sealed(&sealer, "they fixed the bug", &[]);
        let body = format!(
            r#"{{"model":"m","input":[{{"type":"compaction","id":"c1","encrypted_content":"gAAAAforeign"}}, {{"type":"compaction","id":"c2","encrypted_content":"{sealed}"}},{{"role":"user","content":"go on"}}]}}"#
        );
        let out = expand(body.as_bytes(), &sealer, &bound(3))
            .unwrap()
            .unwrap();
        let value: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["input"][0]["encrypted_content"], "gAAAAforeign");
        assert_eq!(
            value["input"][1]["content"][0]["text"],
            format!("{SUMMARY_PREFIX}they fixed the bug")
        );
        assert_eq!(value["input"][2]["content"], "go on");
        // Every other item keeps its bytes; between items there is one comma.
        let foreign = r#"{"type":"compaction","id":"c1","encrypted_content":"gAAAAforeign"}"#;
        assert!(out.starts_with(format!(r#"{{"model":"m","input":[{foreign},"#).as_bytes()));
        assert!(out.ends_with(br#",{"role":"user","content":"go on"}]}"#));
    }

    #[test]
    fn another_tenants_or_an_altered_item_is_refused() {
        let sealer = sealer();
        let sealed = sealed(&sealer, "s", &[]);
        let body = format!(
            r#"{{"model":"m","input":[{{"type":"compaction","encrypted_content":"{sealed}"}}]}}"#
        );
        assert!(matches!(
            expand(body.as_bytes(), &sealer, &bound(4)),
            Err(ProxyError::SealedItemRefused)
        ));
        // Sealed before the binding changed (for the credential hash then used): still opens.
        let upgraded = Binding {
            current: [9; 32],
            earlier: [3; 32],
        };
        assert!(expand(body.as_bytes(), &sealer, &upgraded)
            .unwrap()
            .is_some());
    }

    #[test]
    fn an_empty_compaction_leaves_a_valid_array_wherever_it_stands() {
        let sealer = sealer();
        let empty = sealed(&sealer, "", &[]);
        let item = format!(r#"{{"type":"compaction","encrypted_content":"{empty}"}}"#);
        let user = r#"{"role":"user","content":"q"}"#;
        for (input, left) in [
            (format!("[{item}, {user}]"), 1),
            (format!("[{user} ,{item} ]"), 1),
            (format!("[{user},{item},{user}]"), 2),
            (format!("[{item}]"), 0),
            (format!("[{item},{item}]"), 0),
            (format!("[{user}, {item} , {item}]"), 1),
        ] {
            let body = format!(r#"{{"model":"m","input":{input}}}"#);
            let out = expand(body.as_bytes(), &sealer, &bound(3))
                .unwrap()
                .unwrap();
            let value: Value = serde_json::from_slice(&out).expect("valid JSON");
            assert_eq!(value["input"].as_array().unwrap().len(), left, "{input}");
        }
    }

    #[test]
    fn bodies_without_compactors_items_are_not_touched() {
        let body = br#"{"model":"m","input":[{"type":"compaction","encrypted_content":"gAAAA"}]}"#;
        assert!(expand(body, &sealer(), &bound(3)).unwrap().is_none());
    }

    #[test]
    fn a_compact_call_needs_a_model_and_its_own_input() {
        let object = |text: &str| match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(fields)) => Some(fields),
            _ => None,
        };
        for bad in [
            r#"[]"#,
            r#"{"input":[]}"#,
            r#"{"model":"m","previous_response_id":"resp_1"}"#,
            r#"{"model":"m","input":7}"#,
        ] {
            assert!(CompactRequest::read(object(bad)).is_err(), "{bad}");
        }
        let read =
            CompactRequest::read(object(r#"{"model":"m","input":"hi","store":false}"#)).unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&read.body).unwrap(),
            json!({"model": "m", "input": [{"role": "user", "content": "hi"}]})
        );
    }
}
