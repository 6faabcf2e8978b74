//! OpenAI's chat completions (`POST /v1/chat/completions`): the format the conversation
//! view was modelled on, so a message maps onto it member for member.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use std::ops::Range;

use crate::compaction::front_end::{FrontEnd, Parsed};
use crate::compaction::planner::conversation::{
    string_value, Conversation, Json, Message, ParseError, Role, ToolCall,
};
use crate::compaction::planner::conversation::{Dialect, PartKind};
use crate::compaction::planner::raw_json::{
    deserialize_raw_object, object_span, offset_in, RawObject,
};
use crate::compaction::planner::rewrite::SUMMARY_PREFIX;
use crate::config::{NoticeMode, SummaryPlacement, SummaryRole};

pub mod provider;
pub mod retrieval;
pub mod wire;

#[derive(Deserialize)]
struct RequestView<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    messages: Vec<MessageFields<'a>>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    functions: Option<&'a RawValue>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
}

/// The members of one message object that planning reads, as raw slices, read in the same
/// serde pass that validates the body; `first` and `last` locate the object's braces.
#[derive(Default)]
struct MessageFields<'a> {
    role: Option<&'a str>,
    name: Option<&'a str>,
    content: Option<&'a str>,
    refusal: Option<&'a str>,
    tool_calls: Option<&'a str>,
    function_call: Option<&'a str>,
    tool_call_id: Option<&'a str>,
    /// The first member's value and the last member's value.
    first: &'a str,
    last: &'a str,
}

impl<'de: 'a, 'a> Deserialize<'de> for MessageFields<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_raw_object(deserializer)
    }
}

impl<'a> RawObject<'a> for MessageFields<'a> {
    const EXPECTING: &'static str = "a message object";

    fn slot(&mut self, key: &str) -> Option<&mut Option<&'a str>> {
        Some(match key {
            "role" => &mut self.role,
            "name" => &mut self.name,
            "content" => &mut self.content,
            "refusal" => &mut self.refusal,
            "tool_calls" => &mut self.tool_calls,
            "function_call" => &mut self.function_call,
            "tool_call_id" => &mut self.tool_call_id,
            _ => return None,
        })
    }

    fn finish<E: serde::de::Error>(mut self, ends: Option<(&'a str, &'a str)>) -> Result<Self, E> {
        if self.role.is_none() {
            return Err(E::missing_field("role"));
        }
        if let Some((first, last)) = ends {
            (self.first, self.last) = (first, last);
        }
        Ok(self)
    }
}

#[derive(Debug, Deserialize)]
struct ToolCallView<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function: Option<FunctionView<'a>>,
}

#[derive(Debug, Deserialize)]
struct FunctionView<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

/// Reads a chat-completions body: the messages, and where they sit in it.
pub fn parse(body: &[u8]) -> Result<Conversation<'_>, ParseError> {
    let text = std::str::from_utf8(body).map_err(|e| ParseError::NotChat(e.to_string()))?;
    let view: RequestView<'_> =
        serde_json::from_str(text).map_err(|e| ParseError::NotChat(e.to_string()))?;
    let messages = view
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, fields)| {
            message_from_fields(text, fields).map_err(|e| ParseError::BadMessage(i, e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut conversation = Conversation::from_parts(
        body,
        view.model,
        messages,
        view.tools,
        None,
        view.max_completion_tokens.or(view.max_tokens).unwrap_or(0),
        &Chat,
    );
    conversation.functions = view.functions;
    Ok(conversation)
}

/// Reads one message object on its own (the injected summary, say).
pub fn parse_message(raw: &str) -> Result<Message<'_>, String> {
    let fields: MessageFields<'_> = serde_json::from_str(raw).map_err(|e| e.to_string())?;
    message_from_fields(raw, fields)
}

/// Builds a message from the members the body pass collected; `text` is the document
/// they are slices of.
fn message_from_fields<'a>(
    text: &'a str,
    fields: MessageFields<'a>,
) -> Result<Message<'a>, String> {
    let first = offset_in(text, fields.first);
    let last_end = offset_in(text, fields.last) + fields.last.len();
    let span = object_span(text, first, last_end).ok_or("cannot locate the message object")?;
    let role = fields
        .role
        .and_then(string_value)
        .ok_or("role is not a string")?;
    let tool_calls_raw = fields.tool_calls.and_then(Json::non_null);
    let tool_calls = match tool_calls_raw {
        Some(raw_calls) => {
            let calls: Vec<ToolCallView<'a>> =
                serde_json::from_str(raw_calls.get()).map_err(|e| format!("tool_calls: {e}"))?;
            calls
                .into_iter()
                .map(|call| {
                    let (name, arguments_raw) = match call.function {
                        Some(f) => (
                            f.name.unwrap_or(Cow::Borrowed("")),
                            f.arguments.map(|raw| Json::of(raw.get())),
                        ),
                        None => (Cow::Borrowed(""), None),
                    };
                    ToolCall {
                        id: call.id.unwrap_or(Cow::Borrowed("")),
                        name,
                        arguments_raw,
                    }
                })
                .collect()
        }
        None => Vec::new(),
    };
    Ok(Message {
        raw: Json::of(&text[span]),
        role: Role::parse(&role),
        role_text: role,
        name: fields.name.and_then(string_value),
        content: fields.content.and_then(Json::non_null),
        refusal: fields.refusal.and_then(Json::non_null),
        tool_calls,
        tool_calls_raw,
        function_call: fields.function_call.and_then(Json::non_null),
        tool_call_id: fields.tool_call_id.and_then(string_value),
        more_answers: Vec::new(),
        opaque: None,
        binds_next: false,
        cache_breakpoint: None,
        tool_outputs: Vec::new(),
        dialect: &Chat,
    }
    .with_own_output())
}

/// The chat-completions front-end.
#[derive(Debug)]
pub struct Chat;

impl Dialect for Chat {
    fn part_kind(&self, kind: &str) -> PartKind {
        match kind {
            "text" => PartKind::Text,
            "refusal" => PartKind::Refusal,
            "image_url" => PartKind::Image,
            "file" => PartKind::File,
            "input_audio" => PartKind::Audio,
            _ => PartKind::Opaque,
        }
    }

    fn parse_message<'a>(&self, raw: &'a str) -> Option<Message<'a>> {
        parse_message(raw).ok()
    }

    /// As configured (`summary_placement`): chat completions accept a system or user summary
    /// on its own as well as one joined to the next user turn.
    fn merges_summary(
        &self,
        placement: SummaryPlacement,
        role: SummaryRole,
        _content_located: bool,
    ) -> bool {
        match placement {
            SummaryPlacement::Separate => false,
            SummaryPlacement::Merge => true,
            SummaryPlacement::Auto => role == SummaryRole::User,
        }
    }

    fn summary_json(&self, framed: &str, role: SummaryRole, _breakpoint: Option<&str>) -> String {
        message_json(framed, role)
    }

    fn merged_summary(
        &self,
        body: &[u8],
        message: Range<usize>,
        _content: Option<Range<usize>>,
        framed: &str,
        _breakpoint: Option<&str>,
    ) -> Option<String> {
        let user = std::str::from_utf8(body.get(message)?).ok()?;
        merged_user_message(user, framed)
    }
}

impl FrontEnd for Chat {
    fn serves_path(&self, path: &str) -> bool {
        path == "/chat/completions"
    }

    fn label(&self) -> &'static str {
        "chat_completions"
    }

    fn parse<'a>(&self, body: &'a [u8]) -> Result<Parsed<'a>, ParseError> {
        parse(body).map(Parsed::Conversation)
    }

    fn notice_form(&self, asked: NoticeMode) -> NoticeMode {
        asked
    }
}

/// The injected summary message as JSON.
pub fn summary_message(text: &str, role: SummaryRole) -> String {
    message_json(&format!("{SUMMARY_PREFIX}{text}"), role)
}

fn message_json(framed: &str, role: SummaryRole) -> String {
    serde_json::json!({"role": role.as_str(), "content": framed}).to_string()
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
