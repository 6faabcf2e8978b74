//! The rewrite: `messages` becomes `[pinned…, summary, excluded…, kept…]`, spliced into the
//! original body so every other byte (other fields, their order, unknown fields of kept
//! messages) is unchanged.

use std::ops::Range;

use super::conversation::Conversation;
use super::structure::{validate_layout, Layout, ValidationError};
use crate::config::SummaryRole;

/// The text before the summary, as the reference writes it.
pub const SUMMARY_PREFIX: &str = "Here is a summary of the conversation to date:\n\n";

/// The injected summary message as JSON.
pub fn summary_message(text: &str, role: SummaryRole) -> String {
    serde_json::json!({"role": role.as_str(), "content": format!("{SUMMARY_PREFIX}{text}")})
        .to_string()
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("the messages array could not be located in the body")]
    NoMessagesArray,
}

/// Where a layout's messages lie in the original body: byte ranges only, so applying a summary
/// that arrives later never parses the body again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Splice {
    messages_span: Range<usize>,
    /// The pinned head, which goes before the summary.
    head: Vec<Range<usize>>,
    /// The verbatim messages after the summary: moved user, rescued groups, the kept tail.
    tail: Vec<Range<usize>>,
}

impl Splice {
    /// The ranges of `layout`, which the planner has already validated.
    pub fn new(conversation: &Conversation<'_>, layout: &Layout) -> Result<Splice, RewriteError> {
        if conversation.messages_span.is_empty() {
            return Err(RewriteError::NoMessagesArray);
        }
        let range = |i: usize| conversation.message_range(i);
        Ok(Splice {
            messages_span: conversation.messages_span.clone(),
            head: (0..layout.head).map(range).collect(),
            tail: layout
                .excluded
                .iter()
                .copied()
                .chain(layout.cut..conversation.messages.len())
                .map(range)
                .collect(),
        })
    }

    /// The new body: `body` (the one the splice was made from) with only `messages` replaced.
    pub fn apply(&self, body: &[u8], summary_json: &str) -> Vec<u8> {
        let span = &self.messages_span;
        let pieces = self.head.iter().chain(&self.tail);
        let array_len = pieces.clone().map(|r| r.len() + 1).sum::<usize>() + summary_json.len() + 2;
        let mut out = Vec::with_capacity(body.len() - span.len() + array_len);
        out.extend_from_slice(&body[..span.start]);
        out.push(b'[');
        for range in &self.head {
            out.extend_from_slice(&body[range.clone()]);
            out.push(b',');
        }
        out.extend_from_slice(summary_json.as_bytes());
        for range in &self.tail {
            out.push(b',');
            out.extend_from_slice(&body[range.clone()]);
        }
        out.push(b']');
        out.extend_from_slice(&body[span.end..]);
        out
    }
}

/// Validates `layout` and splices `summary_json` in: the whole rewrite in one call.
pub fn rewrite(
    conversation: &Conversation<'_>,
    layout: &Layout,
    summary_json: &str,
) -> Result<Vec<u8>, RewriteError> {
    validate_layout(&conversation.messages, layout)?;
    Ok(Splice::new(conversation, layout)?.apply(conversation.body, summary_json))
}
