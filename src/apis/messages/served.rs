//! Anthropic's `compact_20260112` context-management edit on `/v1/messages`, served for
//! upstreams that lack it. The edit is taken out of the request (the upstream would refuse or
//! ignore it); over its trigger (`input_tokens`, 150 000 by default) the conversation is
//! compacted by compactor's planner and summarizer. With `pause_after_compaction` the answer is
//! Anthropic's: one `compaction` block and `stop_reason: "compaction"`, streamed when asked.
//! Without it the compacted request goes on to the upstream, and its answer comes back with the
//! same block first ([`BlockSplice`] for a stream, [`splice_into_message`] for a whole one).
//!
//! A compaction block compactor made carries, sealed in its `encrypted_content`, the messages
//! the compacted request held (the summary and the kept tail). On later turns, as Anthropic
//! does, everything before the block is dropped and the block becomes those messages again.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::editing;
use crate::apis::Api;
use crate::body::ProxyBody;
use crate::compaction::engine::{Compacted, CompactionEngine};
use crate::compaction::offload::Offloaded;
use crate::compaction::summaries::summary_input;
use crate::compaction::{Outcome, OutcomeKind, SummarizerUsage};
use crate::error::ProxyError;
use crate::sealing::{Sealer, PREFIX};
use crate::served::splice::{spliced, typed_events, write_event, Event, Splice};
use crate::served::Binding;
use crate::served::{
    failed, hex_digest, nothing_to_summarize, now, open, seal, Ask, Before, BeforeFuture, Carried,
    Contracts,
};

/// The edit this module serves.
const EDIT: &str = "compact_20260112";
/// Anthropic's default trigger when the edit names none.
const DEFAULT_TRIGGER_TOKENS: u64 = 150_000;

/// What the upstream's answer to a served request gets: the compaction block first in its
/// content, and the context edits compactor applied in `context_management.applied_edits`.
#[derive(Debug, Default)]
pub struct Addition {
    pub block: Option<Value>,
    /// The block's entry in `usage.iterations`, before the upstream's own sampling.
    pub iteration: Option<Value>,
    pub applied: Vec<Value>,
}

impl Addition {
    /// The context edits compactor applied, and no compaction block.
    fn applied(applied: Vec<Value>) -> Addition {
        Addition {
            applied,
            ..Addition::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.block.is_none() && self.applied.is_empty()
    }

    fn context_management(&self) -> Option<Value> {
        (!self.applied.is_empty()).then(|| json!({"applied_edits": self.applied}))
    }
}

/// What serving the contracts made of a Messages request.
pub enum Served {
    /// Forward this body (compactor's blocks expanded), or the client's own bytes when None.
    Forward(Option<Bytes>),
    /// The edits taken out (and the context edits applied): forward it, compacted as any
    /// request; the answer gets `addition`.
    Edited { body: Bytes, addition: Addition },
    /// Over the compaction edit's trigger without a pause: compacted, to forward as it is; the
    /// answer gets `addition` (the block first).
    Compacted {
        body: Bytes,
        outcome: Outcome,
        addition: Addition,
    },
    /// `pause_after_compaction`: answered here.
    Answer {
        body: Bytes,
        streamed: bool,
        outcome: Outcome,
    },
}

pub async fn serve(ask: &Ask<'_>, body: &Bytes) -> Result<Served, ProxyError> {
    let binding = ask.binding();
    let expanded = expand(body, ask.sealer, &binding)?;
    let current = expanded.as_deref().unwrap_or(body);
    if memchr::memmem::find(current, b"context_management").is_none() {
        return Ok(Served::Forward(expanded));
    }
    let owned = expanded.clone().unwrap_or_else(|| body.clone());
    let Some(Edited {
        fields,
        compaction,
        applied,
    }) = edited_off_reactor(ask, owned).await?
    else {
        return Ok(Served::Forward(expanded));
    };
    let Some(edit) = compaction else {
        let body = Bytes::from(Value::Object(fields).to_string());
        let addition = Addition::applied(applied);
        return Ok(Served::Edited { body, addition });
    };
    let CompactEdit {
        trigger,
        pause,
        summary_prompt,
    } = CompactEdit::read(&edit, ask)?;
    let streamed = fields.get("stream").and_then(Value::as_bool) == Some(true);
    let model = fields
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let stripped = Bytes::from(Value::Object(fields).to_string());
    let edited = |applied| Served::Edited {
        body: stripped.clone(),
        addition: Addition::applied(applied),
    };
    let compacted = crate::served::compacted(
        ask,
        stripped.clone(),
        &Api::Messages.body_request(),
        summary_prompt.as_deref(),
        Some(trigger),
    )
    .await?;
    let outcome = compacted.outcome.clone();
    match outcome.kind {
        OutcomeKind::Summarized | OutcomeKind::Reused => {}
        // Under the edit's own trigger, nothing worth a summary, or a body the planner does
        // not read (uncounted): the edits applied, no compaction.
        OutcomeKind::Skipped if !outcome.counted || nothing_to_summarize(outcome.reason) => {
            return Ok(edited(applied))
        }
        _ => return Err(failed(outcome.reason)),
    }
    let addition = Addition {
        block: Some(compaction_block(ask.sealer, &binding.current, &compacted)?),
        iteration: Some(compaction_iteration(&outcome)),
        applied,
    };
    if !pause {
        return Ok(Served::Compacted {
            body: compacted.body,
            outcome,
            addition,
        });
    }
    let id = format!("msg_{}", hex_digest(&[body, &now().to_le_bytes()]));
    let body = paused_answer(&id, &model, &addition, &outcome, streamed);
    Ok(Served::Answer {
        body,
        streamed,
        outcome,
    })
}

/// What the client's `compact_20260112` edit asks.
struct CompactEdit {
    trigger: u64,
    pause: bool,
    /// The client's `instructions` as a summary prompt, when its instructions are honoured.
    summary_prompt: Option<String>,
}

impl CompactEdit {
    fn read(edit: &Value, ask: &Ask<'_>) -> Result<CompactEdit, ProxyError> {
        let trigger = edit
            .pointer("/trigger/value")
            .and_then(Value::as_u64)
            .filter(|_| {
                edit.pointer("/trigger/type").and_then(Value::as_str) == Some("input_tokens")
            })
            .unwrap_or(DEFAULT_TRIGGER_TOKENS);
        let pause = edit.get("pause_after_compaction").and_then(Value::as_bool) == Some(true);
        // Anthropic's `instructions` replace its default summarization prompt, for a caller
        // whose instructions are honoured.
        let instructions = edit
            .get("instructions")
            .and_then(Value::as_str)
            .filter(|instructions| !instructions.trim().is_empty());
        let limit = ask.engine.max_client_instructions_bytes();
        if instructions.is_some_and(|text| text.len() > limit) {
            return Err(ProxyError::BadRequest(format!(
                "context_management.edits: instructions are limited to {limit} bytes"
            )));
        }
        Ok(CompactEdit {
            trigger,
            pause,
            summary_prompt: instructions
                .filter(|_| ask.caller.may_instruct)
                .map(summary_input::client_template),
        })
    }
}

/// The request's served edits taken out and its context edits applied: parsing, editing and
/// counting a large body is CPU work, so it runs off the reactor.
async fn edited_off_reactor(ask: &Ask<'_>, body: Bytes) -> Result<Option<Edited>, ProxyError> {
    let engine = ask.engine.clone();
    let upstream = ask.upstream.to_string();
    match ask
        .engine
        .offload(body.len(), move || edit_request(&engine, &upstream, &body))
        .await
    {
        Offloaded::Done(edited) => edited,
        Offloaded::Busy => Err(ProxyError::Overloaded("planner threads")),
        Offloaded::Lost => Err(ProxyError::Internal("context editing failed".into())),
    }
}

/// A request with its served edits taken out and the context edits applied.
struct Edited {
    fields: Map<String, Value>,
    compaction: Option<Value>,
    applied: Vec<Value>,
}

/// Takes the served edits out of a Messages body and applies the context edits; None when it
/// holds none (or is not one JSON object).
fn edit_request(
    engine: &CompactionEngine,
    upstream: &str,
    body: &[u8],
) -> Result<Option<Edited>, ProxyError> {
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(body) else {
        return Ok(None);
    };
    let edits = editing::take_clearing_edits(&mut fields);
    let compaction = take_edit(&mut fields);
    if edits.is_empty() && compaction.is_none() {
        return Ok(None);
    }
    if edits.len() > editing::MAX_EDITS {
        return Err(ProxyError::BadRequest(format!(
            "context_management.edits: at most {} context edits are applied, {} were sent",
            editing::MAX_EDITS,
            edits.len()
        )));
    }
    let count = |fields: &Map<String, Value>| {
        let body = serde_json::to_vec(fields).unwrap_or_default();
        engine
            .count(&Api::Messages.body_request(), upstream, &body)
            .unwrap_or(0)
    };
    let applied = editing::apply(&mut fields, &edits, &count);
    Ok(Some(Edited {
        fields,
        compaction,
        applied,
    }))
}

/// The compaction block of a compacted request: the summary readable in `content`, the
/// request's messages sealed in `encrypted_content`.
fn compaction_block(
    sealer: &Sealer,
    tenant: &[u8; 32],
    compacted: &Compacted,
) -> Result<Value, ProxyError> {
    let messages = messages_of(&compacted.body);
    let summary = compacted.summary.as_deref().unwrap_or_default();
    let carried = Carried {
        summary: summary.to_string(),
        items: messages,
        replaces: false,
    };
    let sealed = seal(sealer, tenant, &carried)?;
    Ok(json!({"type": "compaction", "content": summary, "encrypted_content": sealed}))
}

/// A non-streamed answer with the addition made; None when it is not a message.
pub fn splice_into_message(body: &[u8], addition: &Addition) -> Option<Bytes> {
    let Ok(Value::Object(mut message)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    if let Some(block) = &addition.block {
        let content = message.get_mut("content")?.as_array_mut()?;
        content.insert(0, block.clone());
    }
    if let Some(management) = addition.context_management() {
        message.insert("context_management".into(), management);
    }
    if let (Some(iteration), Some(usage)) = (&addition.iteration, message.get_mut("usage")) {
        add_iteration(usage, iteration, None);
    }
    Some(Bytes::from(Value::Object(message).to_string()))
}

/// The `usage.iterations` entry of a compaction compactor made: what its summarizer calls
/// cost (nothing for a summary made before this request), never the size of what it closed.
fn compaction_iteration(outcome: &Outcome) -> Value {
    let cost = outcome.summarizer_usage.unwrap_or(SummarizerUsage {
        input_tokens: 0,
        output_tokens: 0,
    });
    json!({
        "type": "compaction",
        "input_tokens": cost.input_tokens,
        "output_tokens": cost.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    })
}

/// `usage` with the compaction's entry first in its iterations: before those the upstream
/// reported, else before one `message` entry for the upstream's sampling (its usage, with
/// what a stream's delta lacks taken from `started`, its `message_start` usage), which is
/// the entry clients size their context from. The top-level counts stay the upstream's.
fn add_iteration(usage: &mut Value, compaction: &Value, started: Option<&Value>) {
    let Some(fields) = usage.as_object_mut() else {
        return;
    };
    if let Some(Value::Array(iterations)) = fields.get_mut("iterations") {
        iterations.insert(0, compaction.clone());
        return;
    }
    let count = |name: &str| {
        let reported = fields
            .get(name)
            .or_else(|| started.and_then(|s| s.get(name)));
        reported.and_then(Value::as_u64).unwrap_or(0)
    };
    let message = json!({
        "type": "message",
        "input_tokens": count("input_tokens"),
        "output_tokens": count("output_tokens"),
        "cache_creation_input_tokens": count("cache_creation_input_tokens"),
        "cache_read_input_tokens": count("cache_read_input_tokens"),
    });
    fields.insert("iterations".into(), json!([compaction, message]));
}

/// A streamed answer with the addition made: the block's three events right after
/// `message_start` and every later content block's `index` one higher; the applied edits in
/// `message_delta`.
pub struct BlockSplice {
    block_events: Option<Vec<u8>>,
    /// Whether later blocks move up one (there is a block to put first).
    shift: bool,
    context_management: Option<Value>,
    iteration: Option<Value>,
    /// The usage `message_start` reported: the input counts a `message_delta` may leave out.
    started: Option<Value>,
}

impl BlockSplice {
    pub fn new(addition: &Addition) -> BlockSplice {
        let block_events = addition.block.as_ref().map(|block| {
            let delta = json!({
                "type": "compaction_delta",
                "content": block["content"],
                "encrypted_content": block["encrypted_content"],
            });
            let events = [
                (
                    "content_block_start",
                    json!({"index": 0, "content_block": {"type": "compaction", "content": null}}),
                ),
                ("content_block_delta", json!({"index": 0, "delta": delta})),
                ("content_block_stop", json!({"index": 0})),
            ];
            typed_events(events)
        });
        BlockSplice {
            shift: block_events.is_some(),
            block_events,
            context_management: addition.context_management(),
            iteration: addition.iteration.clone(),
            started: None,
        }
    }
}

impl Splice for BlockSplice {
    fn rewrite(&mut self, mut event: Event<'_>, out: &mut Vec<u8>) {
        let is_block = matches!(
            event.kind.as_str(),
            "content_block_start" | "content_block_delta" | "content_block_stop"
        );
        let index = event
            .data
            .get("index")
            .and_then(Value::as_u64)
            .filter(|_| is_block);
        match index {
            Some(index) if self.shift => {
                event.data["index"] = json!(index + 1);
                write_event(out, event.name.as_deref(), &event.data);
            }
            _ if event.kind == "message_delta"
                && (self.context_management.is_some() || self.iteration.is_some()) =>
            {
                if let Some(management) = self.context_management.take() {
                    event.data["context_management"] = management;
                }
                if let (Some(iteration), Some(usage)) =
                    (self.iteration.take(), event.data.get_mut("usage"))
                {
                    add_iteration(usage, &iteration, self.started.as_ref());
                }
                write_event(out, event.name.as_deref(), &event.data);
            }
            _ => {
                out.extend_from_slice(event.raw);
                if event.kind == "message_start" {
                    self.started = event.data.pointer("/message/usage").cloned();
                    if let Some(block) = self.block_events.take() {
                        out.extend_from_slice(&block);
                    }
                }
            }
        }
    }
}

/// A streamed upstream answer with the addition made.
pub fn spliced_stream(inner: ProxyBody, addition: &Addition) -> ProxyBody {
    spliced(inner, BlockSplice::new(addition))
}

/// Takes the `compact_20260112` edit out of `context_management` (and the field itself when
/// no edit is left).
fn take_edit(fields: &mut Map<String, Value>) -> Option<Value> {
    editing::take_edits(fields, |kind| kind == EDIT)
        .into_iter()
        .next()
}

fn messages_of(body: &[u8]) -> Vec<Value> {
    crate::apis::responses::compact::array_field(body, "messages")
}

/// Anthropic's answer to a paused compaction: the block alone, `stop_reason: "compaction"`,
/// the compaction's usage in `usage.iterations`.
fn paused_answer(
    id: &str,
    model: &str,
    addition: &Addition,
    outcome: &Outcome,
    streamed: bool,
) -> Bytes {
    let block = addition.block.clone().unwrap_or_default();
    let management = addition.context_management();
    let iteration = addition
        .iteration
        .clone()
        .unwrap_or_else(|| compaction_iteration(outcome));
    let usage = json!({
        "input_tokens": outcome.tokens_after,
        "output_tokens": 0,
        "iterations": [iteration],
    });
    if !streamed {
        let mut message = json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": [block], "stop_reason": "compaction", "stop_sequence": null,
            "usage": usage,
        });
        if let Some(management) = management {
            message["context_management"] = management;
        }
        return Bytes::from(message.to_string());
    }
    let start = json!({
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": outcome.tokens_after, "output_tokens": 0},
    });
    let delta = json!({
        "type": "compaction_delta",
        "content": block["content"],
        "encrypted_content": block["encrypted_content"],
    });
    let events = [
        ("message_start", json!({"message": start})),
        (
            "content_block_start",
            json!({"index": 0, "content_block": {"type": "compaction", "content": null}}),
        ),
        ("content_block_delta", json!({"index": 0, "delta": delta})),
        ("content_block_stop", json!({"index": 0})),
        (
            "message_delta",
            json!({
                "delta": {"stop_reason": "compaction", "stop_sequence": null},
                "usage": usage,
                "context_management": management,
            }),
        ),
        ("message_stop", json!({})),
    ];
    Bytes::from(typed_events(events))
}

/// `body` with compactor's latest compaction block expanded as Anthropic reads one: every
/// message before the one holding it is dropped, the block becomes the messages it carries,
/// and what followed it in its message stays; None when the body holds none.
pub fn expand(
    body: &[u8],
    sealer: &Sealer,
    binding: &Binding,
) -> Result<Option<Bytes>, ProxyError> {
    if memchr::memmem::find(body, PREFIX.as_bytes()).is_none() {
        return Ok(None);
    }
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(body) else {
        return Ok(None);
    };
    let Some(Value::Array(messages)) = fields.remove("messages") else {
        return Ok(None);
    };
    // The last of compactor's blocks decides: the ones before it are in what it carries.
    let mut found = None;
    for (m, message) in messages.iter().enumerate() {
        let Some(blocks) = message.get("content").and_then(Value::as_array) else {
            continue;
        };
        for (b, block) in blocks.iter().enumerate() {
            if block.get("type").and_then(Value::as_str) != Some("compaction") {
                continue;
            }
            let Some(sealed) = block.get("encrypted_content").and_then(Value::as_str) else {
                continue;
            };
            if let Some(carried) = open(sealer, binding, sealed)? {
                found = Some((m, b, carried));
            }
        }
    }
    let Some((m, b, carried)) = found else {
        return Ok(None);
    };
    let mut rebuilt = carried.items;
    let mut rest = messages.into_iter().skip(m);
    if let Some(mut holding) = rest.next() {
        let after: Vec<Value> = holding
            .get_mut("content")
            .and_then(Value::as_array_mut)
            .map(|blocks| blocks.split_off(b + 1))
            .unwrap_or_default();
        if !after.is_empty() {
            holding["content"] = Value::Array(after);
            push_alternating(&mut rebuilt, holding);
        }
    }
    for message in rest {
        push_alternating(&mut rebuilt, message);
    }
    fields.insert("messages".into(), Value::Array(rebuilt));
    Ok(Some(Bytes::from(Value::Object(fields).to_string())))
}

/// Appends `message`, merging it into the last one when both have the same role (the carried
/// messages end with a user turn; the client's next may be one too), as Anthropic's own
/// handling of consecutive turns does.
fn push_alternating(messages: &mut Vec<Value>, message: Value) {
    let same_role = messages
        .last()
        .and_then(|last| last.get("role"))
        .is_some_and(|role| Some(role) == message.get("role"));
    let Some(last) = messages.last_mut().filter(|_| same_role) else {
        messages.push(message);
        return;
    };
    let mut blocks = blocks_of(last.get("content"));
    blocks.extend(blocks_of(message.get("content")));
    last["content"] = Value::Array(blocks);
}

fn blocks_of(content: Option<&Value>) -> Vec<Value> {
    match content {
        Some(Value::String(text)) => vec![json!({"type": "text", "text": text})],
        Some(Value::Array(blocks)) => blocks.clone(),
        _ => Vec::new(),
    }
}

/// Anthropic's contracts on `/messages`, as one phase before the upstream call.
pub struct MessagesContracts;

impl Contracts for MessagesContracts {
    fn serves(&self, rest: &str) -> bool {
        rest == "/messages"
    }

    fn before<'a>(&'a self, ask: Ask<'a>, _rest: &'a str, body: &'a Bytes) -> BeforeFuture<'a> {
        Box::pin(async move {
            Ok(match serve(&ask, body).await? {
                Served::Forward(None) => Before::Forward,
                Served::Forward(Some(body)) => Before::Rewritten(body, None),
                Served::Edited { body, addition } => {
                    let addition = (!addition.is_empty()).then(|| boxed(addition));
                    Before::Rewritten(body, addition)
                }
                Served::Compacted {
                    body,
                    outcome,
                    addition,
                } => Before::Compacted(body, outcome, Some(boxed(addition))),
                Served::Answer {
                    body,
                    streamed,
                    outcome,
                } => Before::Answered {
                    body,
                    streamed,
                    outcome,
                },
            })
        })
    }
}

fn boxed(addition: Addition) -> Box<dyn crate::served::Addition> {
    Box::new(addition)
}

impl crate::served::Addition for Addition {
    fn splice_stream(&self, stream: ProxyBody) -> ProxyBody {
        spliced_stream(stream, self)
    }

    fn splice_whole(&self, whole: &[u8]) -> Option<Bytes> {
        splice_into_message(whole, self)
    }
}

#[cfg(test)]
mod tests;
