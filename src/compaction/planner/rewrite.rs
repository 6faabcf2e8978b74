//! The rewrite: `messages` becomes `[pinned…, summary, excluded…, kept…]`, spliced into the
//! original body so every other byte (other fields, their order, unknown fields of kept
//! messages) is unchanged.

use std::ops::Range;

use crate::compaction::planner::clearing::Cleared;
use crate::compaction::planner::conversation::Conversation;
use crate::compaction::planner::conversation::Dialect;
use crate::compaction::planner::conversation::Role;
use crate::compaction::planner::structure::{validate_layout, Layout, ValidationError};
use crate::config::{SummaryPlacement, SummaryRole};

/// The text before the summary, as the reference writes it.
pub const SUMMARY_PREFIX: &str = "Here is a summary of the conversation to date:\n\n";

/// The note that takes the place of messages the `truncate` stage dropped.
pub fn omission_text(dropped: usize) -> String {
    format!("[compactor: {dropped} earlier messages were left out here to fit the model's context window]")
}

/// `body` with each cleared message replaced by its copy: the `clear_tool_outputs` stage on
/// its own, every other byte unchanged.
pub fn apply_cleared(body: &[u8], conversation: &Conversation<'_>, cleared: &Cleared) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut at = 0;
    for (i, message) in cleared {
        let range = conversation.message_range(*i);
        out.extend_from_slice(&body[at..range.start]);
        out.extend_from_slice(message.copy.as_bytes());
        at = range.end;
    }
    out.extend_from_slice(&body[at..]);
    out
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("the messages array could not be located in the body")]
    NoMessagesArray,
    #[error("message {0} cannot be split")]
    Unsplittable(usize),
}

/// One element of the new `messages` array.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    /// A message forwarded byte for byte: its range in the original body.
    Original(Range<usize>),
    /// A rescued part of an assistant message, made once when the plan was made.
    Made(String),
}

/// Where a layout's messages lie in the original body: byte ranges only, so applying a summary
/// that arrives later never parses the body again.
#[derive(Debug, Clone)]
pub struct Splice {
    messages_span: Range<usize>,
    /// The pinned head, which goes before the summary.
    head: Vec<Range<usize>>,
    /// The verbatim messages after the summary: moved user, rescued groups, the kept tail.
    tail: Vec<Piece>,
    /// The summary goes into the first tail message (a user message) instead of its own.
    merge_into_first: bool,
    dialect: &'static dyn Dialect,
    /// The `cache_control` of the last breakpoint among the summarized messages, where the
    /// dialect carries it over.
    summary_breakpoint: Option<String>,
    /// Where the first tail message's `content` lies in the body, for a merge.
    merge_content: Option<Range<usize>>,
    /// Where the messages the summary stands for lie in the body, oldest first: what a
    /// lookup (`summarization.retrieval`) is answered from.
    covered: Vec<Range<usize>>,
}

impl Splice {
    /// The ranges of `layout`, which the planner has already validated; where the summary goes
    /// follows `placement` for a summary of `role`.
    pub fn new(
        conversation: &Conversation<'_>,
        layout: &Layout,
        role: SummaryRole,
        placement: SummaryPlacement,
    ) -> Result<Splice, RewriteError> {
        let dialect = conversation.dialect;
        if conversation.messages_span.is_empty() {
            return Err(RewriteError::NoMessagesArray);
        }
        let piece = |i: usize| match layout.splits.iter().find(|s| s.message == i) {
            Some(split) => split_copy(conversation.messages[i].raw.get(), &split.calls)
                .map(Piece::Made)
                .ok_or(RewriteError::Unsplittable(i)),
            None => Ok(Piece::Original(conversation.message_range(i))),
        };
        let mut order: Vec<usize> = layout
            .excluded
            .iter()
            .copied()
            .chain(layout.cut..conversation.messages.len())
            .collect();
        if dialect.keeps_system_turns() {
            // System turns take no part in the alternation: a user turn right after the ones
            // that lead the tail goes first, so the summary (a user turn) joins it instead of
            // standing as a second user turn in a row. The system turns follow it, verbatim.
            let messages = &conversation.messages;
            let leading = order
                .iter()
                .take_while(|&&i| messages[i].role == Role::System)
                .count();
            if leading > 0
                && order
                    .get(leading)
                    .is_some_and(|&i| messages[i].role == Role::User)
            {
                let user = order.remove(leading);
                order.insert(0, user);
            }
        }
        let next_is_user = order.first().is_some_and(|&i| {
            conversation.messages[i].role == Role::User
                && !layout.splits.iter().any(|s| s.message == i)
        });
        let first_content = order
            .first()
            .and_then(|&i| conversation.messages[i].content)
            .map(|content| {
                let start = (content.get().as_ptr() as usize)
                    .saturating_sub(conversation.body.as_ptr() as usize);
                start..start + content.get().len()
            });
        let merge_into_first =
            next_is_user && dialect.merges_summary(placement, role, first_content.is_some());
        let summary_breakpoint = dialect
            .inherits_cache_breakpoint()
            .then(|| {
                layout
                    .summarized(layout.head, |_| true)
                    .iter()
                    .rev()
                    .find_map(|&i| conversation.messages[i].cache_breakpoint)
                    .map(|raw| raw.get().to_string())
            })
            .flatten();
        let covered = layout
            .summarized(layout.head, |_| true)
            .into_iter()
            .map(|i| conversation.message_range(i))
            .collect();
        Ok(Splice {
            covered,
            summary_breakpoint,
            merge_content: first_content.filter(|_| merge_into_first),
            messages_span: conversation.messages_span.clone(),
            head: (0..layout.head)
                .map(|i| conversation.message_range(i))
                .collect(),
            tail: order.into_iter().map(piece).collect::<Result<_, _>>()?,
            merge_into_first,
            dialect,
        })
    }

    /// The kept messages the `clear_tool_outputs` stage cleared go as their copies.
    pub fn with_cleared(mut self, conversation: &Conversation<'_>, cleared: &Cleared) -> Splice {
        for piece in &mut self.tail {
            if let Piece::Original(range) = piece {
                let copy = cleared
                    .iter()
                    .find(|(i, _)| conversation.message_range(*i) == *range);
                if let Some((_, message)) = copy {
                    *piece = Piece::Made(message.copy.clone());
                }
            }
        }
        self
    }

    /// Where the messages the summary stands for lie in the body the splice was made from.
    pub fn covered(&self) -> &[Range<usize>] {
        &self.covered
    }

    /// The new body: `body` (the one the splice was made from) with only `messages` replaced and
    /// the summary `text` placed as planned.
    pub fn apply(&self, body: &[u8], text: &str, role: SummaryRole) -> Vec<u8> {
        self.apply_framed(body, &format!("{SUMMARY_PREFIX}{text}"), role)
    }

    /// The new body with a note that `dropped` messages were left out where a summary would go
    /// (the `truncate` stage).
    pub fn apply_omission(&self, body: &[u8], dropped: usize, role: SummaryRole) -> Vec<u8> {
        self.apply_framed(body, &omission_text(dropped), role)
    }

    fn apply_framed(&self, body: &[u8], framed: &str, role: SummaryRole) -> Vec<u8> {
        let breakpoint = self.summary_breakpoint.as_deref();
        let merged = match self.tail.first() {
            Some(Piece::Original(range)) if self.merge_into_first => self.dialect.merged_summary(
                body,
                range.clone(),
                self.merge_content.clone(),
                framed,
                breakpoint,
            ),
            _ => None,
        };
        let summary_json = match &merged {
            Some(merged) => merged.clone(),
            None => self.dialect.summary_json(framed, role, breakpoint),
        };
        let tail = if merged.is_some() {
            &self.tail[1..]
        } else {
            &self.tail[..]
        };
        self.splice(body, &summary_json, tail)
    }

    fn splice(&self, body: &[u8], summary_json: &str, tail: &[Piece]) -> Vec<u8> {
        let span = &self.messages_span;
        let tail_len: usize = tail
            .iter()
            .map(|piece| match piece {
                Piece::Original(range) => range.len() + 1,
                Piece::Made(text) => text.len() + 1,
            })
            .sum();
        let head_len: usize = self.head.iter().map(|r| r.len() + 1).sum();
        let array_len = head_len + tail_len + summary_json.len() + 2;
        let mut out = Vec::with_capacity(body.len() - span.len() + array_len);
        out.extend_from_slice(&body[..span.start]);
        out.push(b'[');
        for range in &self.head {
            out.extend_from_slice(&body[range.clone()]);
            out.push(b',');
        }
        out.extend_from_slice(summary_json.as_bytes());
        for piece in tail {
            out.push(b',');
            match piece {
                Piece::Original(range) => out.extend_from_slice(&body[range.clone()]),
                Piece::Made(text) => out.extend_from_slice(text.as_bytes()),
            }
        }
        out.push(b']');
        out.extend_from_slice(&body[span.end..]);
        out
    }
}

/// A copy of an assistant message with only the tool calls at `calls` and empty content, every
/// other member kept: the rescued part of a split (DeerFlow's rescued clone).
fn split_copy(raw: &str, calls: &[usize]) -> Option<String> {
    let mut message: serde_json::Map<String, serde_json::Value> = serde_json::from_str(raw).ok()?;
    let all = message.get("tool_calls")?.as_array()?.clone();
    let kept: Vec<serde_json::Value> = calls.iter().filter_map(|&k| all.get(k).cloned()).collect();
    if kept.len() != calls.len() {
        return None;
    }
    message.insert("content".into(), serde_json::Value::String(String::new()));
    message.insert("tool_calls".into(), serde_json::Value::Array(kept));
    serde_json::to_string(&message).ok()
}

/// The message at `message` in `body` with `element` first in its content (at `content`): an
/// array gets it in front of its items, every other byte kept; content that is not an array is
/// rewritten by `not_array` (None: the summary is not joined to it).
pub(crate) fn with_first_element(
    body: &[u8],
    message: &Range<usize>,
    content: &Range<usize>,
    element: &str,
    not_array: impl FnOnce(&str) -> Option<String>,
) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let raw = text.get(content.clone())?;
    let new_content = match raw.strip_prefix('[') {
        Some(rest) if rest.trim_start().starts_with(']') => format!("[{element}]"),
        Some(rest) => format!("[{element},{rest}"),
        None => not_array(raw)?,
    };
    Some(format!(
        "{}{new_content}{}",
        text.get(message.start..content.start)?,
        text.get(content.end..message.end)?
    ))
}

/// Validates `layout` and splices `summary_json` in as a message of its own: the whole
/// rewrite in one call.
pub fn rewrite(
    conversation: &Conversation<'_>,
    layout: &Layout,
    summary_json: &str,
) -> Result<Vec<u8>, RewriteError> {
    validate_layout(&conversation.messages, layout)?;
    let splice = Splice::new(
        conversation,
        layout,
        SummaryRole::User,
        SummaryPlacement::Separate,
    )?;
    Ok(splice.splice(conversation.body, summary_json, &splice.tail))
}
