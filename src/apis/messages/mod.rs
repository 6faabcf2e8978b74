//! Anthropic's Messages API (`POST /v1/messages`) as the planner sees it: each message is one
//! planner message, so one planner serves every API. An assistant turn's `tool_use` blocks are
//! its calls; the next user message answers them with `tool_result` blocks (Anthropic requires
//! the results "immediately after"), so the assistant turn binds to it and the pair is one
//! group that no cut splits and no summary separates. A user message holding tool results is a
//! tool turn to the planner: it is never the "latest user message" moved after the summary.
//! `thinking` and `redacted_thinking` blocks are never read as text; kept messages keep their
//! bytes, so the latest assistant turn's thinking is never modified.
//!
//! A `system` turn inside `messages` (Claude Code sends its environment as one, with its
//! per-turn-control beta) is an instruction: pinned at the head, kept in the tail, and kept
//! verbatim after the summary when the cut passes it (it takes no part in the alternation).
//!
//! Requests the provider compacts itself are left alone (unless compactor serves the contract
//! for the upstream: [`served`]): a `context_management` edit of a
//! `compact_*` type, and a history already holding a `compaction` block. Context *editing*
//! (`clear_thinking_*`, `clear_tool_uses_*`) is forwarded as sent and the request is compacted
//! as usual: the edits apply to what compactor forwards, and the latest assistant turn, whose
//! thinking they protect, is always kept verbatim.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use std::ops::Range;

use crate::compaction::front_end::{read_messages, FrontEnd, Parsed, Unplannable};
use crate::compaction::planner::conversation::{
    string_value, Conversation, Json, Message, ParseError, Role, ToolCall, ToolOutput,
};
use crate::compaction::planner::conversation::{Dialect, PartKind};
use crate::compaction::planner::raw_json::{ContentMember, RoleAndContent};
use crate::compaction::planner::rewrite::{with_first_element, SUMMARY_PREFIX};
use crate::compaction::reason::Reason;
use crate::config::{SummaryPlacement, SummaryRole};

pub mod editing;
pub mod provider;
pub mod retrieval;
pub mod served;
pub mod wire;

#[derive(Deserialize)]
struct RequestView<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<Vec<MessageFields<'a>>>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(borrow, default)]
    context_management: Option<&'a RawValue>,
}

/// A message's members that planning reads: its role and `content`.
struct Content;

impl ContentMember for Content {
    const NAME: &'static str = "content";
}

type MessageFields<'a> = RoleAndContent<'a, Content>;

/// One content block, its members raw.
#[derive(Deserialize)]
struct BlockView<'a> {
    #[serde(borrow, rename = "type", default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_use_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cache_control: Option<&'a RawValue>,
}

/// A nested block of a `tool_result`'s content: only its breakpoint matters here.
#[derive(Deserialize)]
struct NestedBlock<'a> {
    #[serde(borrow, default)]
    cache_control: Option<&'a RawValue>,
}

/// `context_management.edits`, each edit's type.
#[derive(Deserialize)]
struct ContextManagement<'a> {
    #[serde(borrow, default)]
    edits: Vec<Edit<'a>>,
}

#[derive(Deserialize)]
struct Edit<'a> {
    #[serde(borrow, rename = "type", default)]
    kind: Cow<'a, str>,
}

/// Whether `context_management` has the provider compact the history (a `compact_*` edit); a
/// value compactor cannot read counts as one, so such a request is never compacted twice.
fn provider_compacts(raw: &RawValue) -> bool {
    if raw.get() == "null" {
        return false;
    }
    match serde_json::from_str::<ContextManagement<'_>>(raw.get()) {
        Ok(management) => management
            .edits
            .iter()
            .any(|edit| edit.kind.starts_with("compact_")),
        Err(_) => true,
    }
}

fn present(raw: Option<&RawValue>) -> bool {
    raw.is_some_and(|raw| raw.get() != "null")
}

pub fn parse(body: &[u8]) -> Result<Parsed<'_>, ParseError> {
    let text = std::str::from_utf8(body).map_err(|e| ParseError::NotChat(e.to_string()))?;
    let view: RequestView<'_> =
        serde_json::from_str(text).map_err(|e| ParseError::NotChat(e.to_string()))?;
    if view.context_management.is_some_and(provider_compacts) {
        return Ok(Parsed::LeaveAlone(Reason::ContextManagement));
    }
    let Some(fields) = view.messages else {
        return Err(ParseError::NotChat("no messages array".into()));
    };
    let messages = match read_messages(text, &fields, message)? {
        Ok(messages) => messages,
        Err(reason) => return Ok(Parsed::LeaveAlone(reason)),
    };
    Ok(Parsed::Conversation(Conversation::from_parts(
        body,
        view.model,
        messages,
        view.tools,
        view.system.filter(|raw| raw.get() != "null"),
        view.max_tokens.unwrap_or(0),
        &Messages,
    )))
}

/// One message read on its own (a copy made by a stage), as [`parse`] reads each message.
pub(crate) fn parse_message(raw: &str) -> Option<Message<'_>> {
    let fields: MessageFields<'_> = serde_json::from_str(raw).ok()?;
    message(raw, &fields).ok()
}

fn message<'a>(raw: &'a str, fields: &MessageFields<'a>) -> Result<Message<'a>, Unplannable> {
    let role = fields
        .role
        .and_then(string_value)
        .ok_or_else(|| Unplannable::Bad("role is missing".into()))?;
    let assistant = match role.as_ref() {
        "user" | "system" => false,
        "assistant" => true,
        other => {
            return Err(Unplannable::Bad(format!(
                "role '{other}' is not user, assistant or system"
            )))
        }
    };
    let content = fields.content.filter(|raw| *raw != "null");
    let mut calls = Vec::new();
    let mut answers = Vec::new();
    let mut outputs = Vec::new();
    let mut breakpoint = None;
    if let Some(blocks) = content.filter(|raw| raw.starts_with('[')) {
        let blocks: Vec<BlockView<'a>> =
            serde_json::from_str(blocks).map_err(|e| Unplannable::Bad(format!("content: {e}")))?;
        for block in blocks {
            if present(block.cache_control) {
                breakpoint = block.cache_control;
            }
            match block.kind.as_deref() {
                Some("compaction") => return Err(Unplannable::LeaveAlone(Reason::CompactionBlock)),
                Some("tool_use") if assistant => calls.push(ToolCall {
                    id: block.id.unwrap_or(Cow::Borrowed("")),
                    name: block.name.unwrap_or(Cow::Borrowed("")),
                    arguments_raw: block.input.map(|raw| Json::of(raw.get())),
                }),
                Some("tool_result") if !assistant => {
                    let id = block.tool_use_id.unwrap_or(Cow::Borrowed(""));
                    if let Some(value) = block.content.filter(|raw| raw.get() != "null") {
                        outputs.push(ToolOutput {
                            value: Json::of(value.get()),
                            call_id: id.clone(),
                        });
                    }
                    answers.push(id);
                    let nested = block.content.filter(|raw| raw.get().starts_with('['));
                    if let Some(nested) = nested {
                        let nested: Vec<NestedBlock<'a>> = serde_json::from_str(nested.get())
                            .map_err(|e| Unplannable::Bad(format!("tool_result content: {e}")))?;
                        if let Some(last) = nested.iter().rev().find(|b| present(b.cache_control)) {
                            breakpoint = last.cache_control;
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let binds_next = !calls.is_empty();
    let mut message =
        Message::from_item(raw, role, content, calls, None, None, binds_next, &Messages);
    if !answers.is_empty() {
        message.role = Role::Tool;
        message.more_answers = answers;
        message.tool_outputs = outputs;
    }
    message.cache_breakpoint = breakpoint.map(|raw| Json::of(raw.get()));
    Ok(message)
}

/// The Anthropic Messages front-end.
#[derive(Debug)]
pub struct Messages;

impl Dialect for Messages {
    fn part_kind(&self, kind: &str) -> PartKind {
        match kind {
            "text" => PartKind::Text,
            "image" => PartKind::Image,
            "document" => PartKind::Document,
            "tool_use" | "server_tool_use" => PartKind::ToolCall,
            "tool_result" => PartKind::ToolResult,
            "thinking" | "redacted_thinking" => PartKind::Reasoning,
            _ => PartKind::Opaque,
        }
    }

    fn parse_message<'a>(&self, raw: &'a str) -> Option<Message<'a>> {
        parse_message(raw)
    }

    fn keeps_system_turns(&self) -> bool {
        true
    }

    /// Whenever the next kept turn is a user turn: two user turns in a row would break the
    /// alternation Anthropic asks for.
    fn merges_summary(&self, _: SummaryPlacement, _: SummaryRole, content_located: bool) -> bool {
        content_located
    }

    fn inherits_cache_breakpoint(&self) -> bool {
        true
    }

    fn summary_json(&self, framed: &str, _role: SummaryRole, breakpoint: Option<&str>) -> String {
        format!(
            r#"{{"role":"user","content":[{}]}}"#,
            block_json(framed, breakpoint)
        )
    }

    fn merged_summary(
        &self,
        body: &[u8],
        message: Range<usize>,
        content: Option<Range<usize>>,
        framed: &str,
        breakpoint: Option<&str>,
    ) -> Option<String> {
        // String content becomes a text block after the summary's.
        let block = block_json(framed, breakpoint);
        with_first_element(body, &message, &content?, &block, |raw| {
            Some(format!(r#"[{block},{{"type":"text","text":{raw}}}]"#))
        })
    }
}

impl FrontEnd for Messages {
    fn serves_path(&self, path: &str) -> bool {
        path == "/messages"
    }

    fn label(&self) -> &'static str {
        "messages"
    }

    fn parse<'a>(&self, body: &'a [u8]) -> Result<Parsed<'a>, ParseError> {
        parse(body)
    }
}

/// The summary as an Anthropic text block; `breakpoint` is the `cache_control` it inherits
/// from the messages it replaces, so the new prefix is cached turn after turn.
pub fn summary_block(text: &str, breakpoint: Option<&str>) -> String {
    block_json(&format!("{SUMMARY_PREFIX}{text}"), breakpoint)
}

fn block_json(framed: &str, breakpoint: Option<&str>) -> String {
    let mut block = serde_json::json!({"type": "text", "text": framed});
    if let Some(value) = breakpoint.and_then(|raw| serde_json::from_str(raw).ok()) {
        block["cache_control"] = value;
    }
    block.to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::compaction::planner::structure::{validate, Groups};

    fn conversation(body: &str) -> Conversation<'_> {
        match parse(body.as_bytes()).unwrap() {
            Parsed::Conversation(conversation) => conversation,
            Parsed::LeaveAlone(reason) => panic!("left alone: {reason}"),
        }
    }

    #[test]
    fn tool_turns_pair_up_and_bind() {
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "system": "be brief", "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "text", "text": "looking"}, {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "a"}}, {"type": "tool_use", "id": "t2", "name": "Read", "input": {"file_path": "b"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "A"}, {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "B", "cache_control": {"type": "ephemeral"}}]}, {"type": "text", "text": "also this"}]},
            {"role": "assistant", "content": "done"},
        ]})
        .to_string();
        let conversation = conversation(&body);
        let messages = &conversation.messages;
        assert_eq!(messages.len(), 4);
        assert_eq!(messages[1].tool_calls.len(), 2);
        assert!(messages[1].binds_next);
        assert_eq!(messages[2].role, Role::Tool);
        assert_eq!(messages[2].answers().collect::<Vec<_>>(), ["t1", "t2"]);
        assert_eq!(
            messages[2].cache_breakpoint.map(|raw| raw.get()),
            Some(r#"{"type":"ephemeral"}"#)
        );
        let groups = Groups::of(messages);
        assert_eq!(groups.valid_cut, [true, true, false, true, true]);
        assert!(validate(messages.iter()).is_ok());
        // Without the results, the calls are unanswered.
        assert!(validate([&messages[0], &messages[1], &messages[3]].into_iter()).is_err());
        assert!(conversation.schema_tokens(&Default::default()) > 0);
        assert_eq!(conversation.output_reserve, 64);
    }

    #[test]
    fn native_compaction_is_left_alone() {
        let left_alone = |body: serde_json::Value| match parse(body.to_string().as_bytes()) {
            Ok(Parsed::LeaveAlone(reason)) => reason.label(),
            _ => panic!("planned: {body}"),
        };
        assert_eq!(
            left_alone(
                json!({"model": "m", "messages": [{"role": "user", "content": "q"}], "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}, {"type": "compact_20260112"}]}})
            ),
            "context_management"
        );
        assert_eq!(
            left_alone(
                json!({"model": "m", "messages": [{"role": "user", "content": "q"}], "context_management": {"edits": "unreadable"}})
            ),
            "context_management"
        );
        assert_eq!(
            left_alone(
                json!({"model": "m", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "compaction", "content": "earlier"}]}, {"role": "user", "content": "go on"}]})
            ),
            "compaction_block"
        );
    }

    #[test]
    fn context_editing_and_system_turns_are_planned() {
        // Claude Code's defaults: thinking cleared by the provider, the environment as a
        // system turn after the first user turn.
        let body = json!({"model": "m", "max_tokens": 8, "thinking": {"type": "adaptive"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}, {"type": "clear_tool_uses_20250919"}]},
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"}, {"type": "text", "text": "go"}]},
                {"role": "system", "content": [{"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}], "output_config": {"effort": "medium"}},
                {"role": "assistant", "content": "ok"},
            ]})
        .to_string();
        let conversation = conversation(&body);
        assert_eq!(conversation.messages[1].role, Role::System);
        assert!(conversation.messages[1].cache_breakpoint.is_some());
    }

    #[test]
    fn bodies_that_are_not_messages_requests_are_errors() {
        assert!(parse(b"{}").is_err());
        assert!(parse(br#"{"messages":[{"role":"tool","content":"x"}]}"#).is_err());
        assert!(parse(br#"{"messages":[{"content":"x"}]}"#).is_err());
        assert!(parse(br#"{"messages":[{"role":"user","content":[1]}]}"#).is_err());
    }
}
