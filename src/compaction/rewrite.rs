//! The rewrite: `messages` becomes `[pinned…, summary, excluded…, kept…]`, spliced into the
//! original body so every other byte (other fields, their order, unknown fields of kept
//! messages) is unchanged; and the validator every rewritten list must pass before it is sent.

use std::collections::HashMap;

use super::conversation::{Conversation, Message, Role};
use super::plan::Layout;
use crate::config::SummaryRole;

/// The text before the summary, as the reference writes it.
pub const SUMMARY_PREFIX: &str = "Here is a summary of the conversation to date:\n\n";

/// The injected summary message as JSON.
pub fn summary_message(text: &str, role: SummaryRole) -> String {
    serde_json::json!({"role": role.as_str(), "content": format!("{SUMMARY_PREFIX}{text}")})
        .to_string()
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("message {0} is a tool result with no pending call")]
    OrphanToolResult(usize),
    #[error("call {0} is never answered")]
    UnansweredCall(String),
    #[error("the summary message is not valid JSON")]
    BadSummary,
    #[error("the messages array could not be located in the body")]
    NoMessagesArray,
}

/// The new body: the original bytes with only the `messages` array replaced.
pub fn rewrite(
    conversation: &Conversation<'_>,
    layout: &Layout,
    summary_json: &str,
) -> Result<Vec<u8>, ValidationError> {
    let summary = Message::parse(summary_json).map_err(|_| ValidationError::BadSummary)?;
    let messages = &conversation.messages;
    let order: Vec<&Message<'_>> = messages[..layout.head]
        .iter()
        .chain(std::iter::once(&summary))
        .chain(layout.excluded.iter().map(|&i| &messages[i]))
        .chain(messages[layout.cut..].iter())
        .collect();
    validate(order.iter().copied())?;

    let body = conversation.body;
    let span = conversation.messages_span.clone();
    if span.is_empty() {
        return Err(ValidationError::NoMessagesArray);
    }
    let array_len: usize = order.iter().map(|m| m.raw.get().len() + 1).sum::<usize>() + 1;
    let mut out = Vec::with_capacity(body.len() - span.len() + array_len);
    out.extend_from_slice(&body[..span.start]);
    out.push(b'[');
    for (i, message) in order.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(message.raw.get().as_bytes());
    }
    out.push(b']');
    out.extend_from_slice(&body[span.end..]);
    Ok(out)
}

/// Whether a layout's verbatim messages (`[pinned…, excluded…, kept…]`) form a valid list: the
/// summary has no tool calls, so this is checked before any summarizer call is paid for.
pub fn validate_layout(
    conversation: &Conversation<'_>,
    layout: &Layout,
) -> Result<(), ValidationError> {
    let messages = &conversation.messages;
    validate(
        messages[..layout.head]
            .iter()
            .chain(layout.excluded.iter().map(|&i| &messages[i]))
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
            let answered = message
                .tool_call_id
                .as_deref()
                .and_then(|id| open.remove(id));
            if answered.is_none() {
                return Err(ValidationError::OrphanToolResult(pos));
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

    fn check(body: &str) -> Result<(), ValidationError> {
        let conversation = Conversation::parse(body.as_bytes()).unwrap();
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
