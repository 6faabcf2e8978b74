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
use crate::notice::{event_end_from, resume_at};

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

    /// An event whose data is not JSON (a comment, `[DONE]`): on as it came unless held.
    fn pass(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(raw);
    }
}

/// The upstream's bytes, cut into events for a [`Splice`].
pub struct Events<S> {
    splice: S,
    pending: Vec<u8>,
    /// How far `pending` is known to hold no event end.
    scanned: usize,
}

impl<S: Splice> Events<S> {
    pub fn new(splice: S) -> Events<S> {
        Events {
            splice,
            pending: Vec::new(),
            scanned: 0,
        }
    }

    /// The upstream's next bytes; what to send on now (empty while an event is incomplete).
    pub fn feed(&mut self, bytes: &[u8]) -> Bytes {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = event_end_from(&self.pending, self.scanned) {
            self.scanned = 0;
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
                None => self.splice.pass(&raw, &mut out),
            }
        }
        self.scanned = resume_at(self.pending.len());
        Bytes::from(out)
    }

    /// The splice, between two streams it reads.
    pub fn splice_mut(&mut self) -> &mut S {
        &mut self.splice
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Passes every event on as it came.
    struct AsItCame;

    impl Splice for AsItCame {
        fn rewrite(&mut self, event: Event<'_>, out: &mut Vec<u8>) {
            out.extend_from_slice(event.raw);
        }
    }

    #[test]
    fn a_long_event_is_scanned_once_not_once_per_frame() {
        let mut events = Events::new(AsItCame);
        let line = format!("data: {{\"text\":\"{}\"}}", "x".repeat(1 << 20));
        let frames: Vec<&[u8]> = line.as_bytes().chunks(1024).collect();
        for frame in &frames {
            assert!(events.feed(frame).is_empty());
            // The next frame is looked at from where this one left off, less a mark's length.
            assert_eq!(events.scanned, events.pending.len() - 3);
        }
        let out = events.feed(b"\r\n\r\ndata: {}\n\n");
        assert_eq!(out.len(), line.len() + 4 + 10);
        assert_eq!(events.scanned, 0);
    }

    #[test]
    fn an_event_end_split_across_frames_is_found() {
        for ending in ["\n\n", "\r\n\r\n", "\r\r"] {
            let whole = format!("data: {{}}{ending}");
            for cut in 1..whole.len() {
                let mut events = Events::new(AsItCame);
                let first = events.feed(&whole.as_bytes()[..cut]);
                let second = events.feed(&whole.as_bytes()[cut..]);
                assert_eq!(
                    [first, second].concat(),
                    whole.as_bytes(),
                    "{ending:?} at {cut}"
                );
            }
        }
    }
}
