//! The Responses API (`POST /v1/responses`) as the planner sees it: `input` items mapped onto
//! the message view, so one planner serves both APIs. A function call is an assistant turn with
//! one call (its `call_id`), its output a tool result answering it, so the tool-call groups
//! keep each call with its output, parallel and non-adjacent ones included. A reasoning item
//! binds to the item after it (OpenAI rejects one "provided without its required following
//! item"). Reasoning, compaction and built-in tool items are opaque: counted and hashed whole,
//! kept verbatim or dropped with their group, never shown to the summarizer as text.
//!
//! Requests whose history is not all in the body are left alone: `previous_response_id` and
//! `conversation` (the history lives upstream), `context_management` and a
//! `compaction_trigger` item (the provider compacts natively), an `item_reference` (an item the
//! proxy cannot see), and a string `input` (nothing to cut).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use std::ops::Range;

use crate::compaction::front_end::{FrontEnd, Parsed, Unplannable};
use crate::compaction::planner::conversation::{
    string_value, Conversation, Message, ParseError, ToolCall,
};
use crate::compaction::planner::conversation::{Dialect, PartKind};
use crate::compaction::planner::raw_json::{
    deserialize_raw_object, object_span, offset_in, RawObject,
};
use crate::compaction::planner::rewrite::SUMMARY_PREFIX;
use crate::compaction::reason::Reason;
use crate::config::{SummaryPlacement, SummaryRole};

pub mod compact;
pub mod managed;
pub mod retrieval;
pub mod served;
pub mod wire;

#[derive(Deserialize)]
struct RequestView<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<Input<'a>>,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(borrow, default)]
    previous_response_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    conversation: Option<&'a RawValue>,
    #[serde(borrow, default)]
    context_management: Option<&'a RawValue>,
}

/// `input`: a string, or the items, read in the same serde pass as the rest of the body.
enum Input<'a> {
    Text,
    Items(Vec<ItemFields<'a>>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Input<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InputVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for InputVisitor<'a> {
            type Value = Input<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an array of items")
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Input<'a>, E> {
                Ok(Input::Text)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Input<'a>, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(item) = seq.next_element::<ItemFields<'a>>()? {
                    items.push(item);
                }
                Ok(Input::Items(items))
            }
        }
        deserializer.deserialize_any(InputVisitor(std::marker::PhantomData))
    }
}

/// The members of one item that planning reads, as raw slices of the body; `first` and `last`
/// locate the object's braces.
#[derive(Default)]
struct ItemFields<'a> {
    kind: Option<&'a str>,
    role: Option<&'a str>,
    content: Option<&'a str>,
    id: Option<&'a str>,
    call_id: Option<&'a str>,
    name: Option<&'a str>,
    arguments: Option<&'a str>,
    /// A custom tool call's free-form input.
    input: Option<&'a str>,
    output: Option<&'a str>,
    approval_request_id: Option<&'a str>,
    encrypted_content: Option<&'a str>,
    first: &'a str,
    last: &'a str,
}

impl<'de: 'a, 'a> Deserialize<'de> for ItemFields<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_raw_object(deserializer)
    }
}

impl<'a> RawObject<'a> for ItemFields<'a> {
    const EXPECTING: &'static str = "an input item object";

    fn slot(&mut self, key: &str) -> Option<&mut Option<&'a str>> {
        Some(match key {
            "type" => &mut self.kind,
            "role" => &mut self.role,
            "content" => &mut self.content,
            "id" => &mut self.id,
            "call_id" => &mut self.call_id,
            "name" => &mut self.name,
            "arguments" => &mut self.arguments,
            "input" => &mut self.input,
            "output" => &mut self.output,
            "approval_request_id" => &mut self.approval_request_id,
            "encrypted_content" => &mut self.encrypted_content,
            _ => return None,
        })
    }

    fn finish<E: serde::de::Error>(mut self, ends: Option<(&'a str, &'a str)>) -> Result<Self, E> {
        let (first, last) = ends.ok_or_else(|| E::custom("an item has no members"))?;
        (self.first, self.last) = (first, last);
        Ok(self)
    }
}

/// An item's fields as planning reads them: strings decoded, absent or null as None.
struct ItemView<'a> {
    kind: Option<Cow<'a, str>>,
    role: Option<Cow<'a, str>>,
    content: Option<&'a str>,
    id: Option<Cow<'a, str>>,
    call_id: Option<Cow<'a, str>>,
    name: Option<Cow<'a, str>>,
    arguments: Option<&'a str>,
    input: Option<&'a str>,
    output: Option<&'a str>,
    approval_request_id: Option<Cow<'a, str>>,
}

impl<'a> ItemView<'a> {
    fn of(fields: &ItemFields<'a>) -> ItemView<'a> {
        let text = |raw: Option<&'a str>| raw.and_then(string_value);
        let value = |raw: Option<&'a str>| raw.filter(|raw| *raw != "null");
        ItemView {
            kind: text(fields.kind),
            role: text(fields.role),
            content: value(fields.content),
            id: text(fields.id),
            call_id: text(fields.call_id),
            name: text(fields.name),
            arguments: value(fields.arguments),
            input: value(fields.input),
            output: value(fields.output),
            approval_request_id: text(fields.approval_request_id),
        }
    }
}

fn present(raw: Option<&RawValue>) -> bool {
    raw.is_some_and(|raw| raw.get() != "null")
}

pub fn parse(body: &[u8]) -> Result<Parsed<'_>, ParseError> {
    let text = std::str::from_utf8(body).map_err(|e| ParseError::NotChat(e.to_string()))?;
    let view: RequestView<'_> =
        serde_json::from_str(text).map_err(|e| ParseError::NotChat(e.to_string()))?;
    if present(view.previous_response_id) {
        return Ok(Parsed::LeaveAlone(Reason::PreviousResponseId));
    }
    if present(view.conversation) {
        return Ok(Parsed::LeaveAlone(Reason::ConversationId));
    }
    if present(view.context_management) {
        return Ok(Parsed::LeaveAlone(Reason::ContextManagement));
    }
    let items = match view.input {
        Some(Input::Items(items)) => items,
        Some(Input::Text) => return Ok(Parsed::LeaveAlone(Reason::StringInput)),
        None => return Ok(Parsed::LeaveAlone(Reason::NoInput)),
    };
    let mut messages = Vec::with_capacity(items.len());
    for (i, fields) in items.iter().enumerate() {
        let first = offset_in(text, fields.first);
        let last_end = offset_in(text, fields.last) + fields.last.len();
        let span = object_span(text, first, last_end)
            .ok_or_else(|| ParseError::BadMessage(i, "cannot locate the item".into()))?;
        match item_message(&text[span], ItemView::of(fields)) {
            Ok(message) => messages.push(message),
            Err(Unplannable::LeaveAlone(reason)) => return Ok(Parsed::LeaveAlone(reason)),
            Err(Unplannable::Bad(why)) => return Err(ParseError::BadMessage(i, why)),
        }
    }
    Ok(Parsed::Conversation(Conversation::from_parts(
        body,
        view.model,
        messages,
        view.tools,
        view.instructions.filter(|raw| raw.get() != "null"),
        view.max_output_tokens.unwrap_or(0),
        &Responses,
    )))
}

/// The items of a Responses body's `input` array (or a `/responses/compact` body's): where
/// each item's object lies in `body`, and for a `compaction` item its `encrypted_content`.
/// None when the body is not one.
pub fn input_item_spans(body: &[u8]) -> Option<Vec<(Range<usize>, Option<String>)>> {
    let text = std::str::from_utf8(body).ok()?;
    let view: RequestView<'_> = serde_json::from_str(text).ok()?;
    let Some(Input::Items(items)) = view.input else {
        return Some(Vec::new());
    };
    let mut found = Vec::with_capacity(items.len());
    for fields in &items {
        let first = offset_in(text, fields.first);
        let last_end = offset_in(text, fields.last) + fields.last.len();
        let span = object_span(text, first, last_end)?;
        let sealed = (fields.kind.and_then(string_value).as_deref() == Some("compaction"))
            .then(|| fields.encrypted_content.and_then(string_value))
            .flatten()
            .map(Cow::into_owned);
        found.push((span, sealed));
    }
    Some(found)
}

/// One item read on its own (a copy made by a stage), as [`parse`] reads each item.
pub(crate) fn parse_item(raw: &str) -> Option<Message<'_>> {
    let fields: ItemFields<'_> = serde_json::from_str(raw).ok()?;
    item_message(raw, ItemView::of(&fields)).ok()
}

fn item_message<'a>(raw: &'a str, item: ItemView<'a>) -> Result<Message<'a>, Unplannable> {
    let required = |value: Option<Cow<'a, str>>, what: &str| {
        value.ok_or_else(|| Unplannable::Bad(format!("{what} is missing")))
    };
    let call = |id, name, arguments, opaque| call_item(raw, id, name, arguments, opaque);
    let answer = |id, output, opaque| answer_item(raw, id, output, opaque);
    let whole = |role, binds_next| whole_item(raw, role, binds_next);
    let kind = item.kind.as_deref().unwrap_or("message");
    Ok(match kind {
        "message" => {
            let role = required(item.role, "role")?;
            let responses = &Responses;
            Message::from_item(
                raw,
                role,
                item.content,
                vec![],
                None,
                None,
                false,
                responses,
            )
        }
        "function_call" | "custom_tool_call" => {
            let id = required(item.call_id, "call_id")?;
            let name = item.name.unwrap_or(Cow::Borrowed(""));
            call(id, name, item.arguments.or(item.input), None)
        }
        "mcp_approval_request" => {
            let id = required(item.id, "id")?;
            let name = item.name.unwrap_or(Cow::Borrowed("mcp_approval_request"));
            call(id, name, item.arguments, None)
        }
        "function_call_output" | "custom_tool_call_output" => {
            answer(required(item.call_id, "call_id")?, item.output, None)
        }
        // The output names its call by `id` (openai-python's `LocalShellCallOutput`).
        "local_shell_call_output" => answer(required(item.id, "id")?, item.output, None),
        "mcp_approval_response" => {
            let id = required(item.approval_request_id, "approval_request_id")?;
            answer(id, None, Some(raw))
        }
        "item_reference" => return Err(Unplannable::LeaveAlone(Reason::ItemReference)),
        "compaction_trigger" => return Err(Unplannable::LeaveAlone(Reason::CompactionTrigger)),
        "reasoning" => whole(Cow::Borrowed("reasoning"), true),
        // Other calls (`computer_call`, `local_shell_call`, kinds this version does not know)
        // name their call: the `*_output` answers it, so the two stay one group.
        other if item.call_id.is_some() => {
            let id = required(item.call_id, "call_id")?;
            if other.ends_with("_output") {
                answer(id, None, Some(raw))
            } else {
                call(id, Cow::Owned(other.to_string()), None, Some(raw))
            }
        }
        // An item that speaks as the developer or the system (Codex declares its tools in an
        // `additional_tools` item with `role: developer`) is an instruction, kept whole.
        _ if matches!(item.role.as_deref(), Some("developer" | "system")) => {
            whole(item.role.unwrap_or(Cow::Borrowed("developer")), false)
        }
        // Self-contained items (web and file search, image generation, code interpreter, MCP
        // calls with their output, compaction) and kinds this version does not know.
        other => whole(Cow::Owned(other.to_string()), false),
    })
}

// The shapes an item takes in the message view: a call the assistant made, the answer to one,
// an item kept whole and never read (opaque).

fn call_item<'a>(
    raw: &'a str,
    id: Cow<'a, str>,
    name: Cow<'a, str>,
    arguments: Option<&'a str>,
    opaque: Option<&'a str>,
) -> Message<'a> {
    let call = ToolCall {
        id,
        name,
        arguments_raw: arguments.map(crate::compaction::planner::conversation::Json::of),
    };
    let assistant = Cow::Borrowed("assistant");
    Message::from_item(
        raw,
        assistant,
        None,
        vec![call],
        None,
        opaque,
        false,
        &Responses,
    )
}

fn answer_item<'a>(
    raw: &'a str,
    id: Cow<'a, str>,
    output: Option<&'a str>,
    opaque: Option<&'a str>,
) -> Message<'a> {
    let tool = Cow::Borrowed("tool");
    Message::from_item(
        raw,
        tool,
        output,
        vec![],
        Some(id),
        opaque,
        false,
        &Responses,
    )
}

fn whole_item<'a>(raw: &'a str, role: Cow<'a, str>, binds_next: bool) -> Message<'a> {
    Message::from_item(
        raw,
        role,
        None,
        vec![],
        None,
        Some(raw),
        binds_next,
        &Responses,
    )
}

/// The Responses front-end.
#[derive(Debug)]
pub struct Responses;

impl Dialect for Responses {
    fn part_kind(&self, kind: &str) -> PartKind {
        match kind {
            "input_text" | "output_text" => PartKind::Text,
            "refusal" => PartKind::Refusal,
            "input_image" => PartKind::Image,
            "input_file" => PartKind::File,
            "input_audio" => PartKind::Audio,
            _ => PartKind::Opaque,
        }
    }

    fn parse_message<'a>(&self, raw: &'a str) -> Option<Message<'a>> {
        parse_item(raw)
    }

    /// Never: a summary is always an item of its own.
    fn merges_summary(&self, _: SummaryPlacement, _: SummaryRole, _: bool) -> bool {
        false
    }

    fn summary_json(&self, framed: &str, _role: SummaryRole, _breakpoint: Option<&str>) -> String {
        item_json(framed)
    }

    fn merged_summary(
        &self,
        _: &[u8],
        _: Range<usize>,
        _: Option<Range<usize>>,
        _: &str,
        _: Option<&str>,
    ) -> Option<String> {
        None
    }
}

impl FrontEnd for Responses {
    fn serves_path(&self, path: &str) -> bool {
        path == "/responses"
    }

    fn label(&self) -> &'static str {
        "responses"
    }

    fn parse<'a>(&self, body: &'a [u8]) -> Result<Parsed<'a>, ParseError> {
        parse(body)
    }

    fn size_bound_applies(&self) -> bool {
        false
    }
}

/// The summary as one Responses `message` item: role `user`, one `input_text` part.
pub fn summary_item(text: &str) -> String {
    item_json(&format!("{SUMMARY_PREFIX}{text}"))
}

fn item_json(framed: &str) -> String {
    serde_json::json!({
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": framed}],
    })
    .to_string()
}

#[cfg(test)]
mod tests;
