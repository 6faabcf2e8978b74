//! The rewrite: `messages` becomes `[pinned…, summary, excluded…, kept…]`, spliced into the
//! original body so every other byte (other fields, their order, unknown fields of kept
//! messages) is unchanged.

use std::ops::Range;

use crate::compaction::planner::clearing::Cleared;
use crate::compaction::planner::conversation::Role;
use crate::compaction::planner::conversation::{Api, Conversation};
use crate::compaction::planner::structure::{validate_layout, Layout, ValidationError};
use crate::config::{SummaryPlacement, SummaryRole};

/// The text before the summary, as the reference writes it.
pub const SUMMARY_PREFIX: &str = "Here is a summary of the conversation to date:\n\n";

/// The note that takes the place of messages the `truncate` stage dropped.
pub fn omission_text(dropped: usize) -> String {
    format!("[compactor: {dropped} earlier messages were left out here to fit the model's context window]")
}

/// The injected summary message as JSON.
pub fn summary_message(text: &str, role: SummaryRole) -> String {
    message_json(&format!("{SUMMARY_PREFIX}{text}"), role)
}

/// The summary as one Responses `message` item: role `user`, one `input_text` part.
pub fn summary_item(text: &str) -> String {
    item_json(&format!("{SUMMARY_PREFIX}{text}"))
}

/// The summary as an Anthropic text block; `breakpoint` is the `cache_control` it inherits
/// from the messages it replaces, so the new prefix is cached turn after turn.
pub fn summary_block(text: &str, breakpoint: Option<&str>) -> String {
    block_json(&format!("{SUMMARY_PREFIX}{text}"), breakpoint)
}

fn message_json(framed: &str, role: SummaryRole) -> String {
    serde_json::json!({"role": role.as_str(), "content": framed}).to_string()
}

fn item_json(framed: &str) -> String {
    serde_json::json!({
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": framed}],
    })
    .to_string()
}

fn block_json(framed: &str, breakpoint: Option<&str>) -> String {
    let mut block = serde_json::json!({"type": "text", "text": framed});
    if let Some(value) = breakpoint.and_then(|raw| serde_json::from_str(raw).ok()) {
        block["cache_control"] = value;
    }
    block.to_string()
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Splice {
    messages_span: Range<usize>,
    /// The pinned head, which goes before the summary.
    head: Vec<Range<usize>>,
    /// The verbatim messages after the summary: moved user, rescued groups, the kept tail.
    tail: Vec<Piece>,
    /// The summary goes into the first tail message (a user message) instead of its own.
    merge_into_first: bool,
    api: Api,
    /// Messages: the `cache_control` of the last breakpoint among the summarized messages.
    summary_breakpoint: Option<String>,
    /// Messages: where the first tail message's `content` lies in the body, for the merge.
    merge_content: Option<Range<usize>>,
}

impl Splice {
    /// The ranges of `layout`, which the planner has already validated; where the summary goes
    /// follows `placement` for a summary of `role`.
    pub fn new(
        conversation: &Conversation<'_>,
        layout: &Layout,
        role: SummaryRole,
        placement: SummaryPlacement,
        api: Api,
    ) -> Result<Splice, RewriteError> {
        if conversation.messages_span.is_empty() {
            return Err(RewriteError::NoMessagesArray);
        }
        let piece = |i: usize| match layout.splits.iter().find(|s| s.message == i) {
            Some(split) => split_copy(conversation.messages[i].raw.get(), &split.calls)
                .map(Piece::Made)
                .ok_or(RewriteError::Unsplittable(i)),
            None => Ok(Piece::Original(conversation.message_range(i))),
        };
        let order: Vec<usize> = layout
            .excluded
            .iter()
            .copied()
            .chain(layout.cut..conversation.messages.len())
            .collect();
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
        // A Responses summary is always an item of its own; a Messages summary joins the first
        // kept user turn, as two user turns in a row would break the alternation Anthropic asks
        // for.
        let merge_into_first = next_is_user
            && match api {
                Api::ChatCompletions => match placement {
                    SummaryPlacement::Separate => false,
                    SummaryPlacement::Merge => true,
                    SummaryPlacement::Auto => role == SummaryRole::User,
                },
                Api::Responses => false,
                Api::Messages => first_content.is_some(),
            };
        let summary_breakpoint = (api == Api::Messages)
            .then(|| {
                layout
                    .summarized(layout.head, |_| true)
                    .iter()
                    .rev()
                    .find_map(|&i| conversation.messages[i].cache_breakpoint)
                    .map(|raw| raw.get().to_string())
            })
            .flatten();
        Ok(Splice {
            summary_breakpoint,
            merge_content: first_content.filter(|_| merge_into_first && api == Api::Messages),
            messages_span: conversation.messages_span.clone(),
            head: (0..layout.head)
                .map(|i| conversation.message_range(i))
                .collect(),
            tail: order.into_iter().map(piece).collect::<Result<_, _>>()?,
            merge_into_first,
            api,
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
            Some(Piece::Original(range)) if self.merge_into_first => match &self.merge_content {
                Some(content) => {
                    merged_anthropic_user(body, range, content, &block_json(framed, breakpoint))
                }
                None => std::str::from_utf8(&body[range.clone()])
                    .ok()
                    .and_then(|user| merged_user_message(user, framed)),
            },
            _ => None,
        };
        let summary_json = match (&merged, self.api) {
            (Some(merged), _) => merged.clone(),
            (None, Api::ChatCompletions) => message_json(framed, role),
            (None, Api::Responses) => item_json(framed),
            (None, Api::Messages) => format!(
                r#"{{"role":"user","content":[{}]}}"#,
                block_json(framed, breakpoint)
            ),
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

/// The user message with the summary in front of its content: prepended to string content,
/// a leading text part of array content. Every other member keeps its value and place.
fn merged_user_message(raw: &str, framed: &str) -> Option<String> {
    let mut message: serde_json::Map<String, serde_json::Value> = serde_json::from_str(raw).ok()?;
    let summary = framed.to_string();
    let content = match message.get("content") {
        Some(serde_json::Value::String(original)) => {
            serde_json::Value::String(format!("{summary}\n\n{original}"))
        }
        Some(serde_json::Value::Array(parts)) => {
            let mut merged = vec![serde_json::json!({"type": "text", "text": summary})];
            merged.extend(parts.iter().cloned());
            serde_json::Value::Array(merged)
        }
        _ => serde_json::Value::String(summary),
    };
    message.insert("content".into(), content);
    serde_json::to_string(&message).ok()
}

/// The Anthropic user message at `message` with `block` as its first content block, spliced
/// into its bytes: string content becomes a text block after it, every other byte is kept.
fn merged_anthropic_user(
    body: &[u8],
    message: &Range<usize>,
    content: &Range<usize>,
    block: &str,
) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let raw = text.get(content.clone())?;
    let new_content = match raw.strip_prefix('[') {
        Some(rest) if rest.trim_start().starts_with(']') => format!("[{block}]"),
        Some(rest) => format!("[{block},{rest}"),
        None => format!(r#"[{block},{{"type":"text","text":{raw}}}]"#),
    };
    Some(format!(
        "{}{new_content}{}",
        text.get(message.start..content.start)?,
        text.get(content.end..message.end)?
    ))
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
        Api::ChatCompletions,
    )?;
    Ok(splice.splice(conversation.body, summary_json, &splice.tail))
}
