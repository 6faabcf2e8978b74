//! What compaction needs from the API a body speaks: [`FrontEnd`] reads a body as a
//! conversation and (through the planner's [`Dialect`]) writes the summary back. Each API's
//! folder in `crate::apis` implements it; compaction names no API.

use std::borrow::Cow;
use std::sync::Arc;

use crate::compaction::planner::conversation::Dialect;
use crate::compaction::planner::conversation::{Conversation, Message, ParseError};
use crate::compaction::planner::raw_json::{object_span, offset_in, RoleAndContent};
use crate::compaction::reason::Reason;
use crate::config::NoticeMode;

/// A body read by its front-end: a conversation to plan, or the reason it is forwarded as is.
#[derive(Debug)]
pub enum Parsed<'a> {
    Conversation(Conversation<'a>),
    LeaveAlone(Reason),
}

/// Why one message or item of a body cannot be planned: the body is left alone for a reason,
/// or it is not what its API accepts.
pub enum Unplannable {
    LeaveAlone(Reason),
    Bad(String),
}

/// Each of `items` (read from `text` in the body's one pass) as a message, by `message`, which
/// gets the item's own bytes: the messages, or why the body is left alone.
pub(crate) fn read_messages<'a, M>(
    text: &'a str,
    items: &[RoleAndContent<'a, M>],
    message: impl Fn(&'a str, &RoleAndContent<'a, M>) -> Result<Message<'a>, Unplannable>,
) -> Result<Result<Vec<Message<'a>>, Reason>, ParseError> {
    let mut messages = Vec::with_capacity(items.len());
    for (i, fields) in items.iter().enumerate() {
        let first = offset_in(text, fields.first);
        let last_end = offset_in(text, fields.last) + fields.last.len();
        let span = object_span(text, first, last_end)
            .ok_or_else(|| ParseError::BadMessage(i, "cannot locate the message".into()))?;
        match message(&text[span], fields) {
            Ok(message) => messages.push(message),
            Err(Unplannable::LeaveAlone(reason)) => return Ok(Err(reason)),
            Err(Unplannable::Bad(why)) => return Err(ParseError::BadMessage(i, why)),
        }
    }
    Ok(Ok(messages))
}

pub trait FrontEnd: Dialect {
    /// Whether it serves a `POST` to this path under the API prefix (a path that names the
    /// model, as Google's do, is one of a form).
    fn serves_path(&self, path: &str) -> bool;

    /// The model a path names, for an API whose paths name it (Google's) instead of its body.
    fn path_model<'p>(&self, _path: &'p str) -> Option<&'p str> {
        None
    }

    /// Whether a path asks for a streamed answer, for an API whose paths say so (Google's
    /// `streamGenerateContent`) instead of its body.
    fn path_streams(&self, _path: &str) -> bool {
        false
    }

    /// Its name in metrics and logs.
    fn label(&self) -> &'static str;

    /// Reads a request body.
    fn parse<'a>(&self, body: &'a [u8]) -> Result<Parsed<'a>, ParseError>;

    /// Whether the proof from byte length alone applies. It bounds the message count by the
    /// `"role"` literals in the body, so an API whose items need no role cannot use it.
    fn size_bound_applies(&self) -> bool {
        true
    }

    /// The notice form its stream carries when `asked` is asked for. A chunk is a
    /// chat-completion chunk, which a typed event stream (Responses, Messages) would not know:
    /// there it is a comment, which their SDKs skip.
    fn notice_form(&self, asked: NoticeMode) -> NoticeMode {
        match asked {
            NoticeMode::Chunk => NoticeMode::Comment,
            form => form,
        }
    }
}

/// A request as compaction reads it: the front-end of the API its body speaks, and what its
/// path says that its body does not (Google's paths name the model and the stream).
#[derive(Debug, Clone)]
pub struct ApiRequest {
    pub front_end: &'static dyn FrontEnd,
    path_model: Option<Arc<str>>,
    path_streams: bool,
}

impl ApiRequest {
    /// A POST to `path` (under the API prefix) read by `front_end`.
    pub fn at(front_end: &'static dyn FrontEnd, path: &str) -> ApiRequest {
        ApiRequest {
            front_end,
            path_model: front_end.path_model(path).map(Arc::from),
            path_streams: front_end.path_streams(path),
        }
    }

    /// A request whose body says all there is (every API but Google's).
    pub fn of_body(front_end: &'static dyn FrontEnd) -> ApiRequest {
        ApiRequest {
            front_end,
            path_model: None,
            path_streams: false,
        }
    }

    /// The body read by its front-end, the model its path names taken as the conversation's.
    pub fn parse<'a>(&self, body: &'a [u8]) -> Result<Parsed<'a>, ParseError> {
        let mut parsed = self.front_end.parse(body)?;
        if let (Parsed::Conversation(conversation), Some(model)) = (&mut parsed, &self.path_model) {
            conversation.model = Some(Cow::Owned(model.to_string()));
        }
        Ok(parsed)
    }

    /// Whether the answer is streamed: its path says so, or its body's top-level `"stream":
    /// true` (a key inside a string has escaped quotes and never matches; one nested in a tool
    /// schema could, and only makes an over-window request refused rather than forwarded).
    pub fn streams(&self, body: &[u8]) -> bool {
        self.path_streams
            || memchr::memmem::find_iter(body, br#""stream""#).any(|at| {
                let rest = body[at + 8..].trim_ascii_start();
                rest.strip_prefix(b":")
                    .is_some_and(|rest| rest.trim_ascii_start().starts_with(b"true"))
            })
    }
}
