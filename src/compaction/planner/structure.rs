//! The conversation's structure (DESIGN.md §2): tool-call groups, the cuts that never split
//! one, the layout a plan chooses, and the validator every forwarded list must pass.

use std::collections::HashMap;

use crate::compaction::planner::conversation::{Message, Role};

/// Where the conversation is cut and what stays verbatim.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Leading system/developer messages, pinned first.
    pub head: usize,
    /// `messages[cut..]` is kept verbatim.
    pub cut: usize,
    /// Messages before `cut` kept verbatim after the summary: the latest user message if the
    /// cut passed it, then rescued skill groups, in original order.
    pub excluded: Vec<usize>,
    /// Rescued assistant messages kept only in part (their other calls are summarized).
    pub splits: Vec<Split>,
    /// Estimated tokens of the compacted request (with the summary's estimate or real size).
    pub projected_tokens: u64,
    pub headroom_unmet: bool,
}

impl Layout {
    /// The messages of `[head, cut)` the summary covers: those not kept verbatim, and split
    /// messages (their other calls), where `new` says they were not covered before.
    pub fn summarized(&self, head: usize, new: impl Fn(usize) -> bool) -> Vec<usize> {
        (head..self.cut)
            .filter(|i| !self.excluded.contains(i) || self.splits.iter().any(|s| s.message == *i))
            .filter(|&i| new(i))
            .collect()
    }
}

/// An assistant message in `excluded` that stays verbatim only in part: a copy with just these
/// tool calls (by position) and empty content, as DeerFlow rescues skill reads, so unrelated
/// calls and their output are summarized instead of kept.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Split {
    pub message: usize,
    pub calls: Vec<usize>,
}

impl Split {
    /// The split message as the validator sees it: only the kept calls.
    pub fn apply<'a>(&self, message: &Message<'a>) -> Message<'a> {
        let mut clone = message.clone();
        clone.tool_calls = self
            .calls
            .iter()
            .filter_map(|&k| message.tool_calls.get(k).cloned())
            .collect();
        clone
    }
}

/// Tool-call groups: an assistant with tool calls plus every later tool message answering one
/// of its ids, adjacent or not; any other message is a group of one. A cut never falls inside a
/// group, nor between a message that binds to the next one and that next one.
pub struct Groups {
    /// `start[i]`: the first message of message i's group.
    pub start: Vec<usize>,
    /// `end[i]`: the last message of message i's group.
    pub end: Vec<usize>,
    /// `valid_cut[c]`: no group has members on both sides of `c`.
    pub valid_cut: Vec<bool>,
    /// The largest cut that keeps the last group whole.
    pub max_cut: usize,
}

impl Groups {
    pub fn of(messages: &[Message<'_>]) -> Groups {
        let n = messages.len();
        let mut start: Vec<usize> = (0..n).collect();
        let mut end: Vec<usize> = (0..n).collect();
        let mut owner: HashMap<&str, usize> = HashMap::new();
        for (i, message) in messages.iter().enumerate() {
            if message.has_tool_calls() {
                for call in &message.tool_calls {
                    owner.insert(call.id.as_ref(), i);
                }
            } else if message.role == Role::Tool {
                if let Some(first) = message.answers().filter_map(|id| owner.get(id)).min() {
                    start[i] = *first;
                    end[*first] = end[*first].max(i);
                }
            }
        }
        for i in 0..n {
            end[i] = end[start[i]];
        }
        // A cut strictly inside a group's span would split it: count open spans per position.
        let mut depth = vec![0i64; n + 2];
        for first in 0..n {
            if start[first] == first && end[first] > first {
                depth[first + 1] += 1;
                depth[end[first] + 1] -= 1;
            }
        }
        // A message bound to the next one makes a span of two.
        for i in 0..n.saturating_sub(1) {
            if messages[i].binds_next {
                depth[i + 1] += 1;
                depth[i + 2] -= 1;
            }
        }
        let mut valid_cut = vec![true; n + 1];
        let mut running = 0;
        for (c, valid) in valid_cut.iter_mut().enumerate() {
            running += depth[c];
            *valid = running == 0;
        }
        let last_group_start = if n == 0 { 0 } else { start[n - 1] };
        let max_cut = (0..=last_group_start)
            .rev()
            .find(|&c| valid_cut[c])
            .unwrap_or(0);
        Groups {
            start,
            end,
            valid_cut,
            max_cut,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("message {0} is a tool result with no pending call")]
    OrphanToolResult(usize),
    #[error("call {0} is never answered")]
    UnansweredCall(String),
}

/// Whether a layout's verbatim messages (`[pinned…, excluded…, kept…]`) form a valid list: the
/// summary has no tool calls, so this is checked before any summarizer call is paid for.
pub fn validate_layout(messages: &[Message<'_>], layout: &Layout) -> Result<(), ValidationError> {
    let split_copies: Vec<(usize, Message<'_>)> = layout
        .splits
        .iter()
        .filter_map(|split| {
            messages
                .get(split.message)
                .map(|m| (split.message, split.apply(m)))
        })
        .collect();
    let excluded = layout.excluded.iter().map(|&i| {
        split_copies
            .iter()
            .find(|(at, _)| *at == i)
            .map(|(_, copy)| copy)
            .unwrap_or(&messages[i])
    });
    validate(
        messages[..layout.head]
            .iter()
            .chain(excluded)
            .chain(messages[layout.cut..].iter()),
    )
}

/// Every tool message answers a pending call of an earlier assistant; every call is answered,
/// except the calls of a final assistant turn that only tool results follow (the model's own
/// pending turn).
pub fn validate<'m, 'a: 'm>(
    messages: impl Iterator<Item = &'m Message<'a>>,
) -> Result<(), ValidationError> {
    let messages: Vec<&Message<'_>> = messages.collect();
    let mut open: HashMap<&str, usize> = HashMap::new();
    let mut last_caller = None;
    for (pos, message) in messages.iter().enumerate() {
        if message.role == Role::Tool {
            let mut answers = message.answers().peekable();
            if answers.peek().is_none() {
                return Err(ValidationError::OrphanToolResult(pos));
            }
            for id in answers {
                if open.remove(id).is_none() {
                    return Err(ValidationError::OrphanToolResult(pos));
                }
            }
        } else if message.has_tool_calls() {
            last_caller = Some(pos);
            for call in &message.tool_calls {
                open.insert(call.id.as_ref(), pos);
            }
        }
    }
    let final_turn =
        last_caller.filter(|&pos| messages[pos + 1..].iter().all(|m| m.role == Role::Tool));
    match open.into_iter().find(|(_, pos)| Some(*pos) != final_turn) {
        Some((id, _)) => Err(ValidationError::UnansweredCall(id.to_string())),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::chat;

    fn check(body: &str) -> Result<(), ValidationError> {
        let conversation = chat::parse(body.as_bytes()).unwrap();
        validate(conversation.messages.iter())
    }

    #[test]
    fn validator_accepts_answered_and_final_pending_calls() {
        assert!(check(r#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"id":"a"},{"id":"b"}]},{"role":"tool","tool_call_id":"b"},{"role":"tool","tool_call_id":"a"},{"role":"user","content":"q2"}]}"#).is_ok());
        assert!(check(r#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"id":"a"},{"id":"b"}]},{"role":"tool","tool_call_id":"a"}]}"#).is_ok());
    }

    #[test]
    fn validator_refuses_orphans_and_unanswered_calls() {
        assert_eq!(
            check(
                r#"{"messages":[{"role":"user","content":"q"},{"role":"tool","tool_call_id":"x"}]}"#
            ),
            Err(ValidationError::OrphanToolResult(1))
        );
        assert_eq!(
            check(
                r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"x"}]},{"role":"user","content":"q"}]}"#
            ),
            Err(ValidationError::UnansweredCall("x".into()))
        );
        assert_eq!(
            check(
                r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"x"}]},{"role":"tool","tool_call_id":"x"},{"role":"tool","tool_call_id":"x"}]}"#
            ),
            Err(ValidationError::OrphanToolResult(2))
        );
    }
}
