//! Body types of the request path: the boxed body every response uses, and the upstream
//! response body (frame by frame, with an idle timeout and an optional notice written first).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use tokio::time::Sleep;

use crate::config::NoticeMode;
use crate::notice::{self as sse, Notice};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response compactor sends to a client.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// How an upstream's answer can be read to be edited: None when it is compressed (asked for
/// plain and answered compressed anyway), else whether it is an event stream.
pub fn readable_answer(headers: &http::HeaderMap) -> Option<bool> {
    let encoded = headers
        .get(http::header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity");
    if encoded {
        return None;
    }
    Some(
        headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream")),
    )
}

pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

#[derive(Debug, thiserror::Error)]
#[error("upstream sent nothing for {0:?} in the middle of the response body")]
pub struct IdleTimeout(pub Duration);

/// An upstream response body forwarded frame by frame: each frame is handed on as soon as it
/// arrives (never coalesced), the compaction notice (if any) goes out first, and a silence
/// longer than `idle` ends the body with an error so a stuck upstream cannot pin a client.
pub struct UpstreamBody<B> {
    inner: B,
    notice: NoticeState,
    idle: Duration,
    /// Armed only once the upstream makes us wait: a response that is already there (most
    /// small ones) never touches the timer wheel.
    deadline: Option<Pin<Box<Sleep>>>,
}

enum NoticeState {
    None,
    /// Frames to send before reading anything more from upstream.
    Pending(VecDeque<Bytes>),
    /// `chunk` mode: upstream bytes held until its first event is complete.
    AwaitingFirstEvent {
        message: String,
        buffered: BytesMut,
    },
}

/// Held upstream bytes beyond which `chunk` mode gives up on finding the first event.
const FIRST_EVENT_LIMIT: usize = 64 * 1024;

impl<B> UpstreamBody<B> {
    pub fn new(inner: B, idle: Duration, notice: Option<Notice>) -> Self {
        let notice = match notice {
            None => NoticeState::None,
            Some(Notice { mode, message }) => match mode {
                NoticeMode::Off => NoticeState::None,
                NoticeMode::Comment => {
                    NoticeState::Pending(VecDeque::from([sse::comment(&message)]))
                }
                NoticeMode::Named => NoticeState::Pending(VecDeque::from([sse::named(&message)])),
                NoticeMode::Chunk => NoticeState::AwaitingFirstEvent {
                    message,
                    buffered: BytesMut::new(),
                },
            },
        };
        UpstreamBody {
            inner,
            notice,
            idle,
            deadline: None,
        }
    }
}

impl<B> UpstreamBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    fn poll_upstream(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                // The silence that counts starts after this frame.
                self.deadline = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let idle = self.idle;
                let deadline = self
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(IdleTimeout(idle))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<B> Body for UpstreamBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            match &mut self.notice {
                NoticeState::None => return self.poll_upstream(cx),
                NoticeState::Pending(frames) => match frames.pop_front() {
                    Some(frame) => return Poll::Ready(Some(Ok(Frame::data(frame)))),
                    None => self.notice = NoticeState::None,
                },
                NoticeState::AwaitingFirstEvent { .. } => {
                    let polled = self.poll_upstream(cx);
                    let NoticeState::AwaitingFirstEvent { message, buffered } = &mut self.notice
                    else {
                        return polled;
                    };
                    let mut finished = false;
                    match polled {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                            Ok(data) => buffered.extend_from_slice(&data),
                            // Trailers: flush what we hold, then pass them on.
                            Err(frame) => {
                                let held = std::mem::take(buffered).freeze();
                                let notice = sse::comment(message);
                                self.notice = NoticeState::Pending(VecDeque::from([notice, held]));
                                return Poll::Ready(Some(Ok(frame)));
                            }
                        },
                        Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                        Poll::Ready(None) => finished = true,
                    }
                    let end = sse::first_event_end(buffered);
                    if end.is_none() && !finished && buffered.len() < FIRST_EVENT_LIMIT {
                        continue;
                    }
                    let held = std::mem::take(buffered).freeze();
                    let notice = end
                        .and_then(|end| sse::chunk_from_first_event(&held[..end], message))
                        .unwrap_or_else(|| sse::comment(message));
                    let mut frames = VecDeque::from([notice]);
                    if !held.is_empty() {
                        frames.push_back(held);
                    }
                    self.notice = NoticeState::Pending(frames);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.notice, NoticeState::None) && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match self.notice {
            NoticeState::None => self.inner.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

/// A body whose first bytes were already read (to look at an upstream's error): they go out
/// first, then what is left of it, or the error that stopped the reading.
pub struct Prefixed {
    prefix: Option<Bytes>,
    rest: Result<Option<ProxyBody>, Option<BoxError>>,
}

/// `prefix`, then `rest` (or the error that stopped reading it).
pub fn prefixed(prefix: Bytes, rest: Result<Option<ProxyBody>, BoxError>) -> ProxyBody {
    Prefixed {
        prefix: Some(prefix).filter(|p| !p.is_empty()),
        rest: rest.map_err(Some),
    }
    .boxed_unsync()
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        match &mut self.rest {
            Ok(Some(rest)) => Pin::new(rest).poll_frame(cx),
            Ok(None) => Poll::Ready(None),
            Err(error) => Poll::Ready(error.take().map(Err)),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none()
            && match &self.rest {
                Ok(Some(rest)) => rest.is_end_stream(),
                Ok(None) => true,
                Err(error) => error.is_none(),
            }
    }
}
