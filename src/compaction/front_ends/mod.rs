//! One front-end per API, each a unit: how its body reads as a conversation (`parse`), the
//! planner's [`Dialect`] (a message read back, the summary's shape and merge rule), the path it
//! serves and what its stream can carry. [`Api`] is matched here and nowhere else, so a fourth
//! API is one more file and one more arm.

use crate::compaction::planner::conversation::Dialect;
use crate::compaction::planner::conversation::{Conversation, ParseError};
use crate::compaction::reason::Reason;

pub mod chat;
pub mod messages;
pub mod responses;

/// The API a request speaks: it decides how the body is read and how the summary is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    /// OpenAI's chat completions (`POST /v1/chat/completions`).
    ChatCompletions,
    /// OpenAI's Responses (`POST /v1/responses`).
    Responses,
    /// Anthropic's Messages (`POST /v1/messages`).
    Messages,
}

/// A body read by its front-end: a conversation to plan, or the reason it is forwarded as is.
#[derive(Debug)]
pub enum Parsed<'a> {
    Conversation(Conversation<'a>),
    LeaveAlone(Reason),
}

/// Why one message or item of a body cannot be planned: the body is left alone for a reason,
/// or it is not what its API accepts.
enum Unplannable {
    LeaveAlone(Reason),
    Bad(String),
}

pub trait FrontEnd: Dialect {
    /// The path it serves under the API prefix (`POST` only).
    fn path(&self) -> &'static str;

    /// Its name in metrics and logs.
    fn label(&self) -> &'static str;

    /// Reads a request body.
    fn parse<'a>(&self, body: &'a [u8]) -> Result<Parsed<'a>, ParseError>;

    /// Whether the proof from byte length alone applies. It bounds the message count by the
    /// `"role"` literals in the body, so an API whose items need no role cannot use it.
    fn size_bound_applies(&self) -> bool {
        true
    }

    /// Whether its stream can carry the notice as a chat-completion chunk; a typed event
    /// stream (Responses, Messages) would not know what one means.
    fn notice_chunk_fits(&self) -> bool {
        false
    }
}

impl Api {
    pub const ALL: [Api; 3] = [Api::ChatCompletions, Api::Responses, Api::Messages];

    pub fn front_end(self) -> &'static dyn FrontEnd {
        match self {
            Api::ChatCompletions => &chat::Chat,
            Api::Responses => &responses::Responses,
            Api::Messages => &messages::Messages,
        }
    }

    /// The API served at `path` (under the API prefix) for a POST.
    pub fn for_path(path: &str) -> Option<Api> {
        Api::ALL
            .into_iter()
            .find(|api| api.front_end().path() == path)
    }

    pub fn label(self) -> &'static str {
        self.front_end().label()
    }

    /// The planner's view of it.
    pub fn dialect(self) -> &'static dyn Dialect {
        self.front_end()
    }
}
