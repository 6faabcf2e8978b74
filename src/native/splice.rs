//! Adding a compaction to an answer compactor forwards: the upstream's server-sent events are
//! read whole as they complete and rewritten by a [`Splice`]; bytes that are not an event pass
//! on as they came, and whatever is left when the stream ends goes out untouched.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use serde_json::Value;

use crate::body::{BoxError, ProxyBody};

/// One complete event whose data is JSON, as a [`Splice`] sees it.
pub struct Event<'a> {
    /// Its bytes as they came, blank line included.
    pub raw: &'a [u8],
    /// Its `event:` name, when it has one.
    pub name: Option<String>,
    /// Its name, or the `type` its data carries.
    pub kind: String,
    pub data: Value,
}

/// Rewrites one event into `out`. Events whose data is not JSON never reach it: they pass on
/// as they came.
pub trait Splice: Send + Unpin + 'static {
    fn rewrite(&mut self, event: Event<'_>, out: &mut Vec<u8>);
}

/// The upstream's bytes, cut into events for a [`Splice`].
pub struct Events<S> {
    splice: S,
    pending: Vec<u8>,
}

impl<S: Splice> Events<S> {
    pub fn new(splice: S) -> Events<S> {
        Events {
            splice,
            pending: Vec::new(),
        }
    }

    /// The upstream's next bytes; what to send on now (empty while an event is incomplete).
    pub fn feed(&mut self, bytes: &[u8]) -> Bytes {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = event_end(&self.pending) {
            let raw: Vec<u8> = self.pending.drain(..end).collect();
            match read_event(&raw) {
                Some((name, data)) => {
                    let kind = name
                        .clone()
                        .or_else(|| data.get("type").and_then(Value::as_str).map(str::to_string))
                        .unwrap_or_default();
                    let event = Event {
                        raw: &raw,
                        name,
                        kind,
                        data,
                    };
                    self.splice.rewrite(event, &mut out);
                }
                None => out.extend_from_slice(&raw),
            }
        }
        Bytes::from(out)
    }

    /// What is left at the end of the stream, as it came.
    pub fn finish(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.pending))
    }
}

/// `inner` passed through `splice`, frame by frame.
pub fn spliced<S: Splice>(inner: ProxyBody, splice: S) -> ProxyBody {
    SplicedBody {
        inner,
        events: Events::new(splice),
        finished: false,
    }
    .boxed_unsync()
}

struct SplicedBody<S> {
    inner: ProxyBody,
    events: Events<S>,
    finished: bool,
}

impl<S: Splice> Body for SplicedBody<S> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if self.finished {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let out = self.events.feed(&data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    self.finished = true;
                    let rest = self.events.finish();
                    if !rest.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Where the first complete event in `bytes` ends (after its blank line).
fn event_end(bytes: &[u8]) -> Option<usize> {
    let lf = memchr::memmem::find(bytes, b"\n\n").map(|at| at + 2);
    let crlf = memchr::memmem::find(bytes, b"\r\n\r\n").map(|at| at + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// An event's name (its `event:` line, when it has one) and its data as JSON (the `data:`
/// lines joined, as SSE defines); None when the data is not JSON.
fn read_event(event: &[u8]) -> Option<(Option<String>, Value)> {
    let text = std::str::from_utf8(event).ok()?;
    let mut named = None;
    let mut data = Vec::new();
    for line in text.lines() {
        if let Some(value) = line.strip_prefix("event:") {
            named = Some(value.trim().to_string());
        } else if let Some(value) = line.strip_prefix("data:") {
            data.push(value.strip_prefix(' ').unwrap_or(value));
        }
    }
    let data = serde_json::from_str(&data.join("\n")).ok()?;
    Some((named, data))
}

/// Events compactor writes itself: each named by its kind, which its data carries as `type`.
pub fn typed_events<'a>(events: impl IntoIterator<Item = (&'a str, Value)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (kind, mut data) in events {
        data["type"] = Value::from(kind);
        write_event(&mut out, Some(kind), &data);
    }
    out
}

pub fn write_event(out: &mut Vec<u8>, name: Option<&str>, data: &Value) {
    if let Some(name) = name {
        out.extend_from_slice(format!("event: {name}\n").as_bytes());
    }
    out.extend_from_slice(format!("data: {data}\n\n").as_bytes());
}
