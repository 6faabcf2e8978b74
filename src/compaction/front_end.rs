//! What compaction needs from the API a body speaks: [`FrontEnd`] reads a body as a
//! conversation and (through the planner's [`Dialect`]) writes the summary back. Each API's
//! folder in `crate::apis` implements it; compaction names no API.

use crate::compaction::planner::conversation::Dialect;
use crate::compaction::planner::conversation::{Conversation, ParseError};
use crate::compaction::reason::Reason;

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

pub trait FrontEnd: Dialect {
    /// Whether it serves a `POST` to this path under the API prefix (a path that names the
    /// model, as Google's do, is one of a form).
    fn serves_path(&self, path: &str) -> bool;

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
