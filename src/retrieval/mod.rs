//! A way back from a summary (`summarization.retrieval`): a compacted request carries one more
//! tool, and its summary ends with an index of refs to what it stands for. When the upstream's
//! answer calls that tool, compactor answers it itself from the request in hand (the client
//! never changes its history, so the original of every summarized span is in it), adds the call
//! and its result to the compacted request and asks again, at most `max_rounds` times; the client
//! gets the final answer only, streamed or whole. No store, no TTL: any replica answers, and a
//! ref another request issued is unknown here.
//!
//! [`Wire`] is what one API does (its tool shape, its answers, its stream); this module holds
//! the rounds.

use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, Uri};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::body::{self, BoxError, ProxyBody};
use crate::compaction::planner::rewrite::SUMMARY_PREFIX;
use crate::compaction::retry::read_bounded;
use crate::config::RetrievalConfig;
use crate::error::ProxyError;
use crate::routing::Upstreams;
use crate::served::splice::{Event, Events, Splice};
use crate::upstream::{Rewrite, Target};

pub mod refs;

pub use refs::{CallRead, Part, Refs};

/// The largest whole answer read to look for a lookup in it.
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// One lookup the model asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub id: String,
    /// The arguments as the model wrote them.
    pub arguments: String,
    /// The `ref` they name ("" when they name none).
    pub reference: String,
}

/// The model's lookups of one round and compactor's answers, as the next round's request
/// carries them.
#[derive(Debug, Clone, Default)]
pub struct Turn {
    /// What the model said before it called.
    pub said: String,
    /// The answer's own content up to its lookups, for an API whose next round must carry it
    /// back as it came (Anthropic's thinking blocks with their signatures).
    pub content: Vec<Value>,
    pub calls: Vec<Call>,
    pub answers: Vec<String>,
}

/// What one API does for a lookup.
pub trait Wire: Sync {
    /// The units of the summarized messages (each message's raw JSON and its value, oldest
    /// first).
    fn parts(&self, covered: &[(&str, Value)]) -> Vec<Part>;
    /// Whether this request can be offered the tool: one choice, and a tool choice that lets
    /// the model call it.
    fn offers(&self, body: &[u8]) -> bool;
    /// Whether an answer to a request at `path_and_query` can be read in rounds (a stream
    /// that is not events cannot).
    fn offers_at(&self, path_and_query: &str) -> bool {
        let _ = path_and_query;
        true
    }
    /// `body` with the tool added to its tools.
    fn with_tool(&self, body: &[u8], tool: &str) -> Option<Vec<u8>>;
    /// `body` with a round's calls and answers after its messages.
    fn with_turn(&self, body: &[u8], tool: &str, turn: &Turn) -> Option<Vec<u8>>;
    /// The lookups in a whole answer (none: it is the final one), with what it said first.
    fn lookups(&self, answer: &Value, tool: &str) -> Turn;
    /// A whole answer's usage, added to the rounds'.
    fn add_usage(&self, answer: &Value, usage: &mut Usage);
    /// The answer the client gets: the last round's, as the first round's message, with what
    /// the earlier rounds said before it, the rounds' usage summed, and no call to the tool.
    fn merged(&self, first: &Value, said: &str, last: Value, usage: &Usage, tool: &str) -> Value;
    /// A stream's reader across rounds.
    fn stream(&self, tool: &str) -> Box<dyn StreamRounds>;
    /// A follow-up refused or failed mid-stream (`status` the upstream's, or 502), as this
    /// API's stream carries an error; chat's form by default.
    fn failure(&self, status: u16, message: &str) -> Vec<u8> {
        let _ = status;
        let data = serde_json::json!({"error": {
            "message": message,
            "type": "upstream_error",
            "code": "expansion_failed",
        }});
        format!("data: {data}\n\n").into_bytes()
    }
}

/// An event stream read across rounds: what the client gets of each as it comes.
pub trait StreamRounds: Send {
    /// One event of the current round.
    fn event(&mut self, event: Event<'_>, out: &mut Vec<u8>);
    /// An event whose data is not JSON (`[DONE]` is held to the end).
    fn pass(&mut self, raw: &[u8], out: &mut Vec<u8>);
    /// The round's stream ended. With `may_expand`, the lookups it asked for, its held events
    /// dropped; else (or when it asked none) it was the final answer: what was held goes out,
    /// with the rounds' usage summed.
    fn end(&mut self, may_expand: bool, out: &mut Vec<u8>) -> Turn;
}

/// Tokens summed over the rounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt: u64,
    pub completion: u64,
    pub seen: bool,
}

impl Usage {
    /// `last` (an API's usage object) with the rounds' sums under its `keys`: prompt,
    /// completion, total.
    pub fn json(&self, last: Option<&Value>, keys: [&str; 3]) -> Value {
        let mut out = last.and_then(Value::as_object).cloned().unwrap_or_default();
        let [prompt, completion, total] = keys;
        out.insert(prompt.into(), Value::from(self.prompt));
        out.insert(completion.into(), Value::from(self.completion));
        out.insert(total.into(), Value::from(self.prompt + self.completion));
        Value::Object(out)
    }

    pub fn add(&mut self, usage: Option<&Value>, prompt_key: &str, completion_key: &str) {
        let Some(usage) = usage.filter(|u| u.is_object()) else {
            return;
        };
        self.seen = true;
        self.prompt += usage.get(prompt_key).and_then(Value::as_u64).unwrap_or(0);
        self.completion += usage
            .get(completion_key)
            .and_then(Value::as_u64)
            .unwrap_or(0);
    }
}

/// A compacted request ready for lookups: the bodies of its rounds, and its refs.
pub struct Prepared {
    /// The first round's body: the compacted request with the index and the tool.
    pub body: Bytes,
    /// The compacted request with the index and without the tool: the last round's base.
    pub plain: Bytes,
    pub refs: Arc<Refs>,
}

/// The compacted body with its summary's index and the tool, when this request can have them:
/// `covered` are the summarized messages' ranges in `original`, `summary` the text after the
/// summary prefix.
pub fn prepare(
    wire: &dyn Wire,
    settings: &RetrievalConfig,
    original: &[u8],
    compacted: &[u8],
    (summary, covered): (&str, &[Range<usize>]),
) -> Option<Prepared> {
    if !wire.offers(compacted) {
        return None;
    }
    let raws = covered
        .iter()
        .filter_map(|range| std::str::from_utf8(original.get(range.clone())?).ok());
    let refs = Refs::new(wire.parts(&parsed(raws)), refs::MAX_INDEX_LINES);
    if refs.is_empty() {
        return None;
    }
    let framed = format!("{SUMMARY_PREFIX}{summary}");
    let plain = refs::with_index(compacted, &framed, &refs.index(&settings.tool_name))?;
    let body = wire.with_tool(&plain, &settings.tool_name)?;
    Some(Prepared {
        body: Bytes::from(body),
        plain: Bytes::from(plain),
        refs: Arc::new(refs),
    })
}

/// The tool's description: what the model reads to know when to call it.
pub const TOOL_DESCRIPTION: &str = "Read the original, verbatim, of part of this conversation that was replaced by its summary: pass one ref from the summary's list of originals (ref:…). Use it when an exact detail (an id, a path, an error, a value) is not in the summary.";

/// The tool's one argument, as a JSON schema every API's tool shape takes.
pub fn ref_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {"ref": {"type": "string", "description": "One ref from the summary's list, such as ref:0a1b2c3d4e."}},
        "required": ["ref"],
    })
}

/// Messages' raw JSON with their values, those that parse, as [`Wire::parts`] reads them.
pub fn parsed<'a>(raws: impl IntoIterator<Item = &'a str>) -> Vec<(&'a str, Value)> {
    raws.into_iter()
        .filter_map(|raw| Some((raw, serde_json::from_str(raw).ok()?)))
        .collect()
}

/// The `ref` a call's arguments name ("" when they name none).
pub fn reference_in(arguments: &str) -> String {
    serde_json::from_str::<Value>(arguments)
        .ok()
        .and_then(|v| v.get("ref").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_default()
}

/// `body` with `items` (JSON, comma-separated) added at the end of the array `raw`, a slice
/// of it; every other byte kept.
pub fn appended(body: &[u8], raw: &serde_json::value::RawValue, items: &str) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?;
    let start = crate::compaction::planner::raw_json::offset_in(text, raw.get());
    let inner = raw.get().trim_end().strip_suffix(']')?.trim_end();
    if !inner.trim_start().starts_with('[') {
        return None;
    }
    let empty = inner.trim_start() == "[";
    let end = start + inner.len();
    let mut out = Vec::with_capacity(body.len() + items.len() + 1);
    out.extend_from_slice(&body[..end]);
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(items.as_bytes());
    out.extend_from_slice(&body[end..]);
    Some(out)
}

/// `body` (a JSON object) with `"key":value` as its first member.
pub fn with_first_member(body: &[u8], key: &str, value: &str) -> Option<Vec<u8>> {
    let open = body.iter().position(|&b| b == b'{')?;
    let mut out = Vec::with_capacity(body.len() + key.len() + value.len() + 4);
    out.extend_from_slice(&body[..=open]);
    out.extend_from_slice(format!("{}:{value},", serde_json::to_string(key).ok()?).as_bytes());
    out.extend_from_slice(&body[open + 1..]);
    Some(out)
}

/// What the rounds after the first need: where they go and what they send.
pub struct Rounds {
    pub wire: &'static dyn Wire,
    pub settings: RetrievalConfig,
    pub upstreams: Arc<Upstreams>,
    pub upstream: String,
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    /// The first round's body and the last round's base.
    pub body: Bytes,
    pub plain: Bytes,
    pub refs: Arc<Refs>,
    /// Lookups answered and bytes returned, as the access log and the metrics read them.
    pub tally: Arc<Tally>,
}

/// Lookups answered for one request.
#[derive(Debug, Default)]
pub struct Tally {
    pub rounds: AtomicU64,
    pub bytes: AtomicU64,
}

impl Rounds {
    /// The body of the round after `turns`: the last allowed round goes without the tool, so
    /// its answer is the model's final one.
    fn body_after(&self, turns: &[Turn]) -> Option<Vec<u8>> {
        let last = turns.len() as u32 >= self.settings.max_rounds;
        let mut body = if last {
            self.plain.to_vec()
        } else {
            self.body.to_vec()
        };
        for turn in turns {
            body = self.wire.with_turn(&body, &self.settings.tool_name, turn)?;
        }
        Some(body)
    }

    /// compactor's answers to a round's lookups, counted.
    fn answer(&self, turn: &mut Turn) {
        for call in &turn.calls {
            let answer = self.refs.answer(&call.reference, self.settings.max_bytes);
            self.tally
                .bytes
                .fetch_add(answer.bytes as u64, Ordering::Relaxed);
            turn.answers.push(answer.text);
        }
        self.tally.rounds.fetch_add(1, Ordering::Relaxed);
    }

    /// The answer of the round after `turns`, and whether it is the final one anyway. A
    /// follow-up the upstream refuses (a server that does not take the lookup's messages:
    /// llama-cpp-python's refused null content beside tool calls) is asked once more as
    /// compaction left the request, without the tool: the client gets an answer, not the
    /// refusal of a call it never made.
    async fn follow_up(&self, turns: &[Turn]) -> Result<(Response<ProxyBody>, bool), ProxyError> {
        if let Some(body) = self.body_after(turns) {
            let response = self.ask(body).await?;
            if response.status().is_success() {
                return Ok((response, false));
            }
            tracing::warn!(
                status = response.status().as_u16(),
                upstream = %self.upstream,
                "the upstream refused the follow-up after a lookup: asked again without the tool"
            );
        }
        Ok((self.ask(self.plain.to_vec()).await?, true))
    }

    async fn ask(&self, body: Vec<u8>) -> Result<Response<ProxyBody>, ProxyError> {
        let upstream = self
            .upstreams
            .by_name(&self.upstream)
            .ok_or_else(|| ProxyError::NoUpstream(self.upstream.clone()))?;
        let target = Target::new(upstream, self.method.clone(), self.uri.clone());
        let body = Bytes::from(body);
        let rewrite = Rewrite {
            length: Some(body.len()),
            notice: None,
            replay: Some(&body),
        };
        target
            .send(self.headers.clone(), body::full(body.clone()), rewrite)
            .await
    }
}

/// The upstream's first answer, with the rounds its lookups need run and only the final answer
/// left for the client. A compressed answer, or one that is not a success, goes as it came.
pub async fn after_upstream(
    response: Response<ProxyBody>,
    rounds: Rounds,
) -> Result<Response<ProxyBody>, ProxyError> {
    let readable = body::readable_answer(response.headers());
    let Some(streamed) = readable.filter(|_| response.status().is_success()) else {
        return Ok(response);
    };
    let (mut parts, first) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    if streamed {
        return Ok(Response::from_parts(parts, streamed_rounds(first, rounds)));
    }
    let broken = |reason: String| ProxyError::UpstreamUnreachable {
        upstream: rounds.upstream.clone(),
        reason,
    };
    let whole = match read_bounded(first, MAX_ANSWER_BYTES).await {
        (whole, Ok(None)) => whole,
        (_, Ok(Some(_))) => return Err(broken("the answer is too large to read".into())),
        (_, Err(e)) => return Err(broken(e.to_string())),
    };
    let Ok(first_answer) = serde_json::from_slice::<Value>(&whole) else {
        return Ok(Response::from_parts(parts, body::full(whole)));
    };
    let tool = rounds.settings.tool_name.clone();
    let mut usage = Usage::default();
    let mut turns: Vec<Turn> = Vec::new();
    let mut said = String::new();
    let mut answer = first_answer.clone();
    loop {
        rounds.wire.add_usage(&answer, &mut usage);
        let mut turn = rounds.wire.lookups(&answer, &tool);
        if turn.calls.is_empty() || turns.len() as u32 >= rounds.settings.max_rounds {
            break;
        }
        said.push_str(&turn.said);
        rounds.answer(&mut turn);
        turns.push(turn);
        let (response, last) = rounds.follow_up(&turns).await?;
        if !response.status().is_success() {
            // Asked without the tool and refused again: that refusal is the answer.
            return Ok(response);
        }
        let (whole, read) = read_bounded(response.into_body(), MAX_ANSWER_BYTES).await;
        match read {
            Ok(None) => {}
            Ok(Some(_)) => return Err(broken("the answer is too large to read".into())),
            Err(e) => return Err(broken(e.to_string())),
        }
        answer = serde_json::from_slice(&whole)
            .map_err(|e| broken(format!("the follow-up answer is not JSON: {e}")))?;
        if last {
            rounds.wire.add_usage(&answer, &mut usage);
            break;
        }
    }
    if turns.is_empty() {
        // No lookup: the answer as it came, byte for byte.
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(whole.len()));
        return Ok(Response::from_parts(parts, body::full(whole)));
    }
    let merged = rounds
        .wire
        .merged(&first_answer, &said, answer, &usage, &tool);
    let bytes = Bytes::from(serde_json::to_vec(&merged).unwrap_or_default());
    let lookups = rounds.tally.rounds.load(Ordering::Relaxed);
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    parts
        .headers
        .insert(EXPANSIONS_HEADER, HeaderValue::from(lookups));
    Ok(Response::from_parts(parts, body::full(bytes)))
}

/// How many lookups compactor answered for a whole answer.
pub const EXPANSIONS_HEADER: &str = "x-compactor-expansions";

/// Frames of a stream in flight across rounds: bounded, so a slow client holds the rounds.
const STREAM_FRAMES: usize = 16;

/// The rounds of a streamed answer, run in a task that feeds the client's body.
fn streamed_rounds(first: ProxyBody, rounds: Rounds) -> ProxyBody {
    let (sender, receiver) = mpsc::channel(STREAM_FRAMES);
    tokio::spawn(async move {
        let tool = rounds.settings.tool_name.clone();
        let mut events = Events::new(Reader(rounds.wire.stream(&tool)));
        let mut turns: Vec<Turn> = Vec::new();
        let mut body = first;
        loop {
            if !relay_round(&mut body, &mut events, &sender).await {
                return;
            }
            let may_expand = (turns.len() as u32) < rounds.settings.max_rounds;
            let mut out = events.finish().to_vec();
            let mut turn = events.splice_mut().0.end(may_expand, &mut out);
            if !out.is_empty() && sender.send(Ok(Bytes::from(out))).await.is_err() {
                return;
            }
            if turn.calls.is_empty() {
                return;
            }
            rounds.answer(&mut turn);
            turns.push(turn);
            body = match rounds.follow_up(&turns).await.map(|(response, _)| response) {
                Ok(response) if response.status().is_success() => response.into_body(),
                Ok(response) => {
                    let status = response.status();
                    let (whole, _) = read_bounded(response.into_body(), 64 * 1024).await;
                    let text = String::from_utf8_lossy(&whole).into_owned();
                    let _ = sender
                        .send(Ok(error_event(rounds.wire, status.as_u16(), &text)))
                        .await;
                    return;
                }
                Err(error) => {
                    let _ = sender
                        .send(Ok(error_event(rounds.wire, 502, &error.to_string())))
                        .await;
                    return;
                }
            };
        }
    });
    ChannelBody { receiver }.boxed_unsync()
}

/// One round's stream through the reader to the client; false when it cannot go on.
async fn relay_round(
    body: &mut ProxyBody,
    events: &mut Events<Reader>,
    sender: &mpsc::Sender<Result<Bytes, BoxError>>,
) -> bool {
    loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let out = events.feed(&data);
                if !out.is_empty() && sender.send(Ok(out)).await.is_err() {
                    return false;
                }
            }
            Some(Err(error)) => {
                let _ = sender.send(Err(error)).await;
                return false;
            }
            None => return true,
        }
    }
}

/// A follow-up refused or failed mid-stream: an error event in the API's own form.
fn error_event(wire: &dyn Wire, status: u16, text: &str) -> Bytes {
    let message = format!("compactor's follow-up after a lookup failed ({status}): {text}");
    Bytes::from(wire.failure(status, &refs::cut_chars(&message, 2000)))
}

/// The API's stream reader as the event cutter's splice.
pub(crate) struct Reader(pub Box<dyn StreamRounds>);

impl Splice for Reader {
    fn rewrite(&mut self, event: Event<'_>, out: &mut Vec<u8>) {
        self.0.event(event, out);
    }

    fn pass(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        self.0.pass(raw, out);
    }
}

/// The client's body, fed by the rounds' task.
struct ChannelBody {
    receiver: mpsc::Receiver<Result<Bytes, BoxError>>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.receiver
            .poll_recv(cx)
            .map(|next| next.map(|item| item.map(Frame::data)))
    }
}
