//! OpenAI's server-side compaction on `/v1/responses` (`context_management: [{type:
//! "compaction", compact_threshold}]`), served for upstreams that lack it. The entry is taken
//! out of the request; over its threshold (compactor's count), or without one when compactor's
//! own triggers call for a summary, the input is compacted and the compacted request goes on,
//! and the upstream's answer comes back with one `compaction` item first in its output, as
//! OpenAI's does. The item stands for the whole input it replaced:
//! sent back later, everything before it is dropped and it becomes that compacted input again.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::compact::array_field;
use crate::apis::Api;
use crate::body::ProxyBody;
use crate::compaction::engine::Compacted;
use crate::compaction::reason::Reason;
use crate::compaction::{Outcome, OutcomeKind};
use crate::error::ProxyError;
use crate::served::splice::{spliced, write_event, Event, Splice};
use crate::served::{
    compacted, failed, hex_digest, nothing_to_summarize, object_off_reactor, seal, Ask, Carried,
};

/// What serving `context_management` made of a Responses request.
pub enum Managed {
    /// No compaction entry: the body as it was handed in.
    Untouched,
    /// The entry taken out; under its threshold (or compactor's triggers), to forward as any
    /// request.
    Stripped(Bytes),
    /// No threshold, and the summary compactor's triggers called for could not be had: the
    /// request as compactor left it (its `fail_mode`), forwarded without a second try.
    Unsummarized { body: Bytes, outcome: Outcome },
    /// Over the threshold: the compacted request, and the item its answer starts with.
    Compacted {
        body: Bytes,
        outcome: Outcome,
        item: Value,
    },
}

pub async fn serve(ask: &Ask<'_>, body: &Bytes) -> Result<Managed, ProxyError> {
    if memchr::memmem::find(body, b"context_management").is_none() {
        return Ok(Managed::Untouched);
    }
    let Some(mut fields) = object_off_reactor(ask.engine, body).await? else {
        return Ok(Managed::Untouched);
    };
    let Some(entry) = take_compaction(&mut fields) else {
        return Ok(Managed::Untouched);
    };
    let stripped = Bytes::from(Value::Object(fields).to_string());
    let compacted = match entry.get("compact_threshold").and_then(Value::as_u64) {
        Some(threshold) => {
            let api = Api::Responses.body_request();
            let compacted = compacted(ask, stripped.clone(), &api, None, Some(threshold)).await?;
            // Under the client's threshold, or a body the planner does not read (uncounted).
            let outcome = &compacted.outcome;
            let under = outcome.kind == OutcomeKind::Skipped
                && (!outcome.counted || outcome.reason == Reason::UnderTrigger);
            if under {
                return Ok(Managed::Stripped(stripped));
            }
            compacted
        }
        // Without a threshold the provider decides when: compactor's own triggers do here,
        // and a summary they call for is the compaction the client gets.
        None => {
            let compacted = compacted_by_triggers(ask, stripped.clone()).await?;
            match compacted.outcome.kind {
                OutcomeKind::Summarized | OutcomeKind::Reused => compacted,
                // The client did not ask for a compaction: it is not refused for want of one.
                OutcomeKind::Failed => {
                    return Ok(Managed::Unsummarized {
                        body: compacted.body,
                        outcome: compacted.outcome,
                    })
                }
                // Under the triggers, or only cleared or truncated: forwarded as any request,
                // planned again there (with the retry after an overflow that path has).
                _ => return Ok(Managed::Stripped(stripped)),
            }
        }
    };
    let outcome = compacted.outcome.clone();
    match outcome.kind {
        OutcomeKind::Summarized | OutcomeKind::Reused => {}
        OutcomeKind::Skipped if nothing_to_summarize(outcome.reason) => {
            return Ok(Managed::Stripped(stripped))
        }
        _ => return Err(failed(outcome.reason)),
    }
    let carried = Carried {
        summary: String::new(),
        items: array_field(&compacted.body, "input"),
        replaces: true,
    };
    let sealed = seal(ask.sealer, &ask.binding().current, &carried)?;
    let item = json!({
        "id": format!("cmp_{}", hex_digest(&[sealed.as_bytes()])),
        "type": "compaction",
        "encrypted_content": sealed,
    });
    Ok(Managed::Compacted {
        body: compacted.body,
        outcome,
        item,
    })
}

/// Takes the `compaction` entry out of `context_management` (and the field when none is left).
fn take_compaction(fields: &mut Map<String, Value>) -> Option<Value> {
    let entries = fields.get_mut("context_management")?.as_array_mut()?;
    let at = entries
        .iter()
        .position(|entry| entry.get("type").and_then(Value::as_str) == Some("compaction"))?;
    let entry = entries.remove(at);
    if entries.is_empty() {
        fields.remove("context_management");
    }
    Some(entry)
}

/// A whole `response` with `item` first in its output; None when it is not one.
pub fn splice_into_response(body: &[u8], item: &Value) -> Option<Bytes> {
    let Ok(Value::Object(mut response)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    response
        .get_mut("output")?
        .as_array_mut()?
        .insert(0, item.clone());
    Some(Bytes::from(Value::Object(response).to_string()))
}

/// A Responses event stream with the item first: its `output_item.added` and `.done` right
/// after `response.created` / `response.in_progress`, every later `output_index` one higher and
/// `sequence_number` two higher, and the item first in the final response's output.
pub struct ItemSplice {
    item: Value,
    injected: bool,
}

impl Splice for ItemSplice {
    fn rewrite(&mut self, event: Event<'_>, out: &mut Vec<u8>) {
        let opening = matches!(
            event.kind.as_str(),
            "response.created" | "response.in_progress"
        );
        if !self.injected && opening {
            out.extend_from_slice(event.raw);
            return;
        }
        let Event { name, mut data, .. } = event;
        if !self.injected {
            // The first event past the response's opening: the item's two events go first.
            self.injected = true;
            let sequence = data.get("sequence_number").and_then(Value::as_u64);
            for (offset, kind) in ["response.output_item.added", "response.output_item.done"]
                .into_iter()
                .enumerate()
            {
                let mut injected = json!({"type": kind, "output_index": 0, "item": self.item});
                if let Some(sequence) = sequence {
                    injected["sequence_number"] = json!(sequence + offset as u64);
                }
                write_event(out, name.as_ref().map(|_| kind), &injected);
            }
        }
        if let Some(sequence) = data.get("sequence_number").and_then(Value::as_u64) {
            data["sequence_number"] = json!(sequence + 2);
        }
        if let Some(index) = data.get("output_index").and_then(Value::as_u64) {
            data["output_index"] = json!(index + 1);
        }
        if let Some(output) = data
            .pointer_mut("/response/output")
            .and_then(Value::as_array_mut)
        {
            output.insert(0, self.item.clone());
        }
        write_event(out, name.as_deref(), &data);
    }
}

/// A streamed upstream answer with the item spliced in.
pub fn spliced_stream(inner: ProxyBody, item: &Value) -> ProxyBody {
    spliced(
        inner,
        ItemSplice {
            item: item.clone(),
            injected: false,
        },
    )
}

/// `body` compacted as any request is, by compactor's own triggers; a request it cannot
/// compact is refused as the client's own compaction would be.
async fn compacted_by_triggers(ask: &Ask<'_>, body: Bytes) -> Result<Compacted, ProxyError> {
    ask.engine
        .compact(
            ask.headers,
            body,
            ask.upstream,
            ask.caller,
            &Api::Responses.body_request(),
        )
        .await
        .map_err(|refused| failed(refused.outcome.reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::served::splice::Events;

    const UPSTREAM: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"output\":[]}}\n\n\
event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"output\":[]}}\n\n\
event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,\"item\":{\"type\":\"message\"}}\n\n\
event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":3,\"output_index\":0,\"content_index\":0,\"delta\":\"h\\u00e9\"}\n\n\
event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"sequence_number\":4,\"output_index\":0,\"item\":{\"type\":\"message\"}}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":5,\"response\":{\"output\":[{\"type\":\"message\"}]}}\n\n";

    fn events(text: &[u8]) -> Vec<Value> {
        std::str::from_utf8(text)
            .unwrap()
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| serde_json::from_str(e.split("data: ").nth(1).unwrap()).unwrap())
            .collect()
    }

    fn splice(item: &Value) -> Events<ItemSplice> {
        Events::new(ItemSplice {
            item: item.clone(),
            injected: false,
        })
    }

    #[test]
    fn the_item_goes_first_in_a_stream_however_it_is_cut() {
        let item =
            json!({"id": "cmp_1", "type": "compaction", "encrypted_content": "compactor.v1.x"});
        let whole = splice(&item).feed(UPSTREAM.as_bytes());
        let got = events(&whole);
        let kinds: Vec<&str> = got.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.output_item.done",
                "response.output_item.added",
                "response.output_text.delta",
                "response.output_item.done",
                "response.completed"
            ]
        );
        let sequence: Vec<u64> = got
            .iter()
            .map(|e| e["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(sequence, [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(got[2]["item"], item);
        assert_eq!(got[3]["output_index"], 0);
        assert_eq!(got[4]["output_index"], 1);
        assert_eq!(got[5]["delta"], "hé");
        assert_eq!(got[7]["response"]["output"][0], item);
        assert_eq!(got[7]["response"]["output"][1]["type"], "message");
        for cut in 1..UPSTREAM.len() {
            let mut events = splice(&item);
            let mut out = events.feed(&UPSTREAM.as_bytes()[..cut]).to_vec();
            out.extend_from_slice(&events.feed(&UPSTREAM.as_bytes()[cut..]));
            out.extend_from_slice(&events.finish());
            assert_eq!(out, whole, "cut at {cut}");
        }
    }

    #[test]
    fn the_item_goes_first_in_a_whole_response() {
        let item = json!({"type": "compaction"});
        let out =
            splice_into_response(br#"{"id":"r","output":[{"type":"message"}]}"#, &item).unwrap();
        let response: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(response["output"], json!([item, {"type": "message"}]));
    }

    #[test]
    fn the_compaction_entry_is_taken_out_with_its_field_when_alone() {
        let mut fields =
            json!({"context_management": [{"type": "compaction", "compact_threshold": 9}]})
                .as_object()
                .unwrap()
                .clone();
        assert_eq!(
            take_compaction(&mut fields).unwrap()["compact_threshold"],
            9
        );
        assert!(fields.is_empty());
    }
}
