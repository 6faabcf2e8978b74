//! The OpenAI chat format as compaction sees it: a borrowed view over the request bytes.
//!
//! Messages stay raw slices ([`Json`]) of the original body, so a kept message is forwarded byte
//! for byte (unknown fields included) and nothing is copied that is not needed. Only the fields
//! that planning reads are parsed: role, name, content (as raw JSON), tool calls, tool_call_id.

use std::borrow::Cow;
use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::config::{SummaryPlacement, SummaryRole};

use crate::compaction::planner::raw_json::{offset_in, skip_ws, skip_ws_back};
use crate::compaction::planner::tokens::{json_string_chars, CharCount, TokenModel, FEATURES};

/// A raw JSON value as it appears in the request (a slice of its bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Json<'a>(&'a str);

impl<'a> Json<'a> {
    pub fn get(&self) -> &'a str {
        self.0
    }

    /// A slice a front-end already knows to be one JSON value of the body.
    pub(crate) fn of(raw: &'a str) -> Json<'a> {
        Json(raw)
    }

    /// None for an explicit `null`, which the API treats as absent.
    pub(crate) fn non_null(raw: &'a str) -> Option<Json<'a>> {
        (raw != "null").then_some(Json(raw))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    Function,
    Other,
}

impl Role {
    pub(crate) fn parse(role: &str) -> Role {
        match role {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            "function" => Role::Function,
            _ => Role::Other,
        }
    }

    pub fn is_instruction(self) -> bool {
        matches!(self, Role::System | Role::Developer)
    }
}

/// One tool call of an assistant message.
#[derive(Debug, Clone)]
pub struct ToolCall<'a> {
    pub id: Cow<'a, str>,
    pub name: Cow<'a, str>,
    /// The `arguments` JSON string literal as sent; decoded on demand by [`ToolCall::arguments`].
    pub arguments_raw: Option<Json<'a>>,
}

impl<'a> ToolCall<'a> {
    /// The decoded arguments text (a JSON document in a JSON string, by the API's convention).
    pub fn arguments(&self) -> Cow<'a, str> {
        match self.arguments_raw {
            Some(raw) => {
                serde_json::from_str::<Cow<'a, str>>(raw.get()).unwrap_or(Cow::Borrowed(raw.get()))
            }
            None => Cow::Borrowed(""),
        }
    }
}

/// What the planner needs from the API a conversation was read from. The planner declares it;
/// each API's front-end (`crate::apis`) implements it, so the planner never names an API.
pub trait Dialect: Sync + std::fmt::Debug {
    /// Reads one message made anew (a cleared copy) the way the body's own were read.
    fn parse_message<'a>(&self, raw: &'a str) -> Option<Message<'a>>;

    /// What a content part of this API's `type` is.
    fn part_kind(&self, kind: &str) -> PartKind;

    /// What a content part (`raw`, read as `part`) is: by its `type` for an API that types its
    /// parts; an API whose parts are known by their members (Google's) reads those in `raw`.
    fn kind_of(&self, part: &PartView<'_>, _raw: &str) -> Option<PartKind> {
        part.kind.as_deref().map(|kind| self.part_kind(kind))
    }

    /// What the summarizer is shown of a tool result part, for an API whose results are not
    /// `tool_result` blocks with a `tool_use_id` and a `content` (Google's function responses).
    fn result_shown(&self, _raw: &str) -> Option<String> {
        None
    }

    /// `role: "system"` turns inside the message list are context the client placed there:
    /// kept, never summarized (Anthropic's Messages).
    fn keeps_system_turns(&self) -> bool {
        false
    }

    /// Whether the summary joins the first kept turn (a user turn nothing was split from)
    /// rather than going as a message of its own; `content_located` says whether that turn's
    /// `content` was found in the body.
    fn merges_summary(
        &self,
        placement: SummaryPlacement,
        role: SummaryRole,
        content_located: bool,
    ) -> bool;

    /// Whether the summary carries the last prompt-cache breakpoint of the messages it
    /// replaces, so the new prefix is cached turn after turn.
    fn inherits_cache_breakpoint(&self) -> bool {
        false
    }

    /// The summary (`framed`: its text with the prefix) as a message of its own.
    fn summary_json(&self, framed: &str, role: SummaryRole, breakpoint: Option<&str>) -> String;

    /// The first kept turn, at `message` in `body`, with the summary joined in front of its
    /// content (`content`: where that lies in `body`). None when it cannot be joined: the
    /// summary then goes as a message of its own.
    fn merged_summary(
        &self,
        body: &[u8],
        message: Range<usize>,
        content: Option<Range<usize>>,
        framed: &str,
        breakpoint: Option<&str>,
    ) -> Option<String>;
}

/// What a content part is, whatever its API calls it: each API maps its own part types onto
/// these ([`Dialect::part_kind`]), so counting and the summarizer's transcript name no API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKind {
    Text,
    Refusal,
    /// Counted flat, never by its (often base64) bytes.
    Image,
    File,
    Document,
    Audio,
    /// A call the message makes inside its content (listed with the message's calls).
    ToolCall,
    /// A tool's result inside a message's content, with the call it answers.
    ToolResult,
    /// Model reasoning: counted, never shown to the summarizer.
    Reasoning,
    /// Anything else: counted by its JSON.
    Opaque,
}

/// One message: its original bytes plus what planning needs.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    pub raw: Json<'a>,
    pub role: Role,
    pub role_text: Cow<'a, str>,
    pub name: Option<Cow<'a, str>>,
    pub content: Option<Json<'a>>,
    pub refusal: Option<Json<'a>>,
    pub tool_calls: Vec<ToolCall<'a>>,
    pub(crate) tool_calls_raw: Option<Json<'a>>,
    pub(crate) function_call: Option<Json<'a>>,
    pub tool_call_id: Option<Cow<'a, str>>,
    /// The calls a message of tool results answers besides `tool_call_id` (an Anthropic user
    /// message answers every `tool_use` of the assistant turn before it).
    pub more_answers: Vec<Cow<'a, str>>,
    /// An item the planner does not read (a Responses reasoning item, a built-in tool call):
    /// counted and hashed whole, never shown to the summarizer as text.
    pub opaque: Option<Json<'a>>,
    /// It must stay next to the message after it (a Responses reasoning item and the item it
    /// produced): no cut falls between them.
    pub binds_next: bool,
    /// The last `cache_control` among an Anthropic message's blocks: a prompt-cache
    /// breakpoint a summary of this message inherits.
    pub cache_breakpoint: Option<Json<'a>>,
    /// The tool outputs this message carries, each a value the `clear_tool_outputs` stage may
    /// replace with a placeholder: a tool message's `content`, a Responses output item's
    /// `output`, each `tool_result` block's `content` of an Anthropic user turn.
    pub tool_outputs: Vec<ToolOutput<'a>>,
    /// The API it was read by: what its content parts are.
    pub dialect: &'static dyn Dialect,
}

/// One tool output inside a message: its raw value and the call it answers.
#[derive(Debug, Clone)]
pub struct ToolOutput<'a> {
    pub value: Json<'a>,
    pub call_id: Cow<'a, str>,
}

/// A parsed chat-completions request: the messages, and where they sit in the body.
#[derive(Debug)]
pub struct Conversation<'a> {
    pub body: &'a [u8],
    pub model: Option<Cow<'a, str>>,
    pub messages: Vec<Message<'a>>,
    /// Byte range of the `messages` array in `body` (replaced by a rewrite, nothing else is).
    pub messages_span: std::ops::Range<usize>,
    tools: Option<&'a RawValue>,
    pub(crate) functions: Option<&'a RawValue>,
    /// Pinned text sent outside the message list (Responses `instructions`).
    instructions: Option<&'a RawValue>,
    /// Tokens the caller reserved for the answer (`max_completion_tokens`, else `max_tokens`).
    pub output_reserve: u64,
    /// The API whose front-end read it, as the planner sees it: a message made anew (a
    /// cleared copy) is read back by it and the summary written in its shape.
    pub dialect: &'static dyn Dialect,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("body is not a chat-completions JSON object with a messages array: {0}")]
    NotChat(String),
    #[error("message {0} is not an object with a role: {1}")]
    BadMessage(usize, String),
}

impl<'a> Conversation<'a> {
    /// Byte range of message `i` in `body`.
    pub fn message_range(&self, i: usize) -> std::ops::Range<usize> {
        let raw = self.messages[i].raw.get();
        let start = (raw.as_ptr() as usize).saturating_sub(self.body.as_ptr() as usize);
        start..start + raw.len()
    }

    /// A conversation read by another API's front-end: `messages` are its items mapped onto
    /// the message view, `messages_span` the byte range of the array holding them.
    pub(crate) fn from_parts(
        body: &'a [u8],
        model: Option<Cow<'a, str>>,
        messages: Vec<Message<'a>>,
        tools: Option<&'a RawValue>,
        instructions: Option<&'a RawValue>,
        output_reserve: u64,
        dialect: &'static dyn Dialect,
    ) -> Conversation<'a> {
        let text = std::str::from_utf8(body).unwrap_or("");
        let messages_span = array_span(text, &messages);
        Conversation {
            body,
            model,
            messages,
            messages_span,
            tools,
            functions: None,
            instructions,
            output_reserve,
            dialect,
        }
    }

    /// Tokens of what is sent with every request besides the messages: tool and function
    /// schemas, and instructions.
    pub fn schema_tokens(&self, model: &TokenModel) -> u64 {
        match model.exact {
            Some(encoding) => self.schemas().map(|raw| encoding.count(raw.get())).sum(),
            None => model.tokens(self.schema_chars()),
        }
    }

    fn schemas(&self) -> impl Iterator<Item = &RawValue> {
        [self.tools, self.functions, self.instructions]
            .into_iter()
            .flatten()
            .filter(|raw| raw.get() != "null")
    }

    fn schema_chars(&self) -> CharCount {
        let mut chars = CharCount::default();
        for raw in self.schemas() {
            chars.add(CharCount::of_str(raw.get()));
        }
        chars
    }

    /// What the estimate counts of the whole request, as calibration's features: every
    /// message's characters and framing, and the schemas. None for a request with images,
    /// whose flat count would pass for text.
    pub fn features(&self) -> Option<[f64; FEATURES]> {
        let mut chars = self.schema_chars();
        for message in &self.messages {
            let (text, images) = message.chars();
            if images > 0 {
                return None;
            }
            chars.add(text);
        }
        Some(chars.features(self.messages.len() as u64))
    }

    /// Estimated tokens of each message.
    pub fn message_tokens(&self, model: &TokenModel) -> Vec<u64> {
        self.messages.iter().map(|m| m.tokens(model)).collect()
    }
}

/// The byte range of the array holding `messages` (slices of `text`): JSON allows only
/// whitespace between the brackets and the first and last items. Empty for an empty array,
/// which is never rewritten.
fn array_span(text: &str, messages: &[Message<'_>]) -> std::ops::Range<usize> {
    let (Some(first), Some(last)) = (messages.first(), messages.last()) else {
        return 0..0;
    };
    let bytes = text.as_bytes();
    let start = skip_ws_back(bytes, offset_in(text, first.raw.get()));
    let end = skip_ws(
        bytes,
        offset_in(text, last.raw.get()) + last.raw.get().len(),
    );
    if start == 0 || bytes[start - 1] != b'[' || bytes.get(end) != Some(&b']') {
        return 0..0;
    }
    start - 1..end + 1
}

impl<'a> Message<'a> {
    /// One item of another API, already taken apart by its front-end; `raw` is its bytes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_item(
        raw: &'a str,
        role_text: Cow<'a, str>,
        content: Option<&'a str>,
        tool_calls: Vec<ToolCall<'a>>,
        tool_call_id: Option<Cow<'a, str>>,
        opaque: Option<&'a str>,
        binds_next: bool,
        dialect: &'static dyn Dialect,
    ) -> Message<'a> {
        let counted_calls = tool_calls.first().and_then(|call| call.arguments_raw);
        Message {
            raw: Json(raw),
            role: Role::parse(&role_text),
            role_text,
            name: None,
            content: content.and_then(Json::non_null),
            refusal: None,
            tool_calls,
            tool_calls_raw: counted_calls,
            function_call: None,
            tool_call_id,
            more_answers: Vec::new(),
            opaque: opaque.map(Json),
            binds_next,
            cache_breakpoint: None,
            tool_outputs: Vec::new(),
            dialect,
        }
        .with_own_output()
    }

    /// A tool message whose content is its output (chat completions, Responses) lists it.
    pub(crate) fn with_own_output(mut self) -> Self {
        if self.role == Role::Tool && self.opaque.is_none() {
            if let (Some(value), Some(id)) = (self.content, &self.tool_call_id) {
                self.tool_outputs.push(ToolOutput {
                    value,
                    call_id: id.clone(),
                });
            }
        }
        self
    }

    /// Every call id this message answers.
    pub fn answers(&self) -> impl Iterator<Item = &str> {
        self.tool_call_id
            .as_deref()
            .into_iter()
            .chain(self.more_answers.iter().map(|id| id.as_ref()))
    }

    pub fn has_tool_calls(&self) -> bool {
        self.role == Role::Assistant && !self.tool_calls.is_empty()
    }

    /// The estimate of DESIGN.md §2.1 for this message.
    pub fn tokens(&self, model: &TokenModel) -> u64 {
        let (text, images) = match model.exact {
            Some(encoding) => {
                let (text, images) = self.tokenizer_text();
                (encoding.count(&text), images)
            }
            None => {
                let (chars, images) = self.chars();
                (model.tokens(chars), images)
            }
        };
        text + images * model.image_tokens + model.message_overhead()
    }

    /// The characters this message is counted by, and its image parts.
    fn chars(&self) -> (CharCount, u64) {
        let (mut chars, mut images) = (CharCount::default(), 0u64);
        self.pieces(&mut |piece| tally(piece, &mut chars, &mut images));
        (chars, images)
    }

    /// The text a tokenizer reads of this message (its pieces decoded, one per line), and its
    /// image parts.
    fn tokenizer_text(&self) -> (String, u64) {
        let (mut text, mut images) = (String::new(), 0u64);
        self.pieces(&mut |piece| {
            match piece {
                Piece::Literal(raw) => text.push_str(&string_value(raw).unwrap_or_default()),
                Piece::Plain(plain) => text.push_str(plain),
                // A template renders a call's values (name, arguments), not its JSON keys.
                Piece::Structured(raw) => match serde_json::from_str::<Value>(raw) {
                    Ok(value) => push_values(&value, &mut text),
                    Err(_) => text.push_str(raw),
                },
                Piece::Image => {
                    images += 1;
                    return;
                }
            }
            text.push('\n');
        });
        (text, images)
    }

    /// Every piece the count reads, in order: role, name, content, refusal, calls, call id.
    fn pieces(&self, visit: &mut dyn FnMut(Piece<'_>)) {
        visit(Piece::Plain(&self.role_text));
        if let Some(name) = &self.name {
            visit(Piece::Plain(name));
        }
        for content in [self.content, self.refusal].into_iter().flatten() {
            content_pieces(content, self.dialect, visit);
        }
        for raw in [self.tool_calls_raw, self.function_call]
            .into_iter()
            .flatten()
        {
            visit(Piece::Structured(raw.get()));
        }
        if let Some(raw) = self.opaque {
            visit(Piece::Plain(raw.get()));
        }
        if let Some(id) = &self.tool_call_id {
            visit(Piece::Plain(id));
        }
    }

    /// Whether this is a user or instruction message whose text begins with one of
    /// `patterns` (leading whitespace aside): pinned context a client sends, never summarized.
    pub fn opens_with(&self, patterns: &[PinnedText]) -> bool {
        if !matches!(self.role, Role::User | Role::System | Role::Developer) {
            return false;
        }
        let Some(content) = self.content else {
            return false;
        };
        // The raw JSON is searched first, so only a message that mentions a pattern is decoded.
        let mentioned = patterns
            .iter()
            .any(|pattern| content.get().contains(pattern.escaped.as_str()));
        if !mentioned {
            return false;
        }
        let text = self.text();
        let text = text.trim_start();
        patterns
            .iter()
            .any(|pattern| text.starts_with(pattern.text.as_str()))
    }

    /// The message's text content (string content, or its text parts joined).
    pub fn text(&self) -> String {
        let Some(content) = self.content else {
            return String::new();
        };
        match serde_json::from_str::<Cow<'_, str>>(content.get()) {
            Ok(text) => text.into_owned(),
            Err(_) => {
                let parts: Vec<serde_json::Value> =
                    serde_json::from_str(content.get()).unwrap_or_default();
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(|t| t.as_str()))
                    .collect::<Vec<_>>()
                    .join("\n")
            }
        }
    }
}

/// A text that pinned context begins with, and that text as it appears inside a JSON string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedText {
    text: String,
    escaped: String,
}

impl PinnedText {
    /// None for an empty text, which would pin every message.
    pub fn new(text: &str) -> Option<PinnedText> {
        let quoted = serde_json::to_string(text).ok()?;
        let escaped = quoted.get(1..quoted.len().saturating_sub(1))?.to_string();
        (!text.is_empty()).then(|| PinnedText {
            text: text.to_string(),
            escaped,
        })
    }
}

/// One part of an array `content`, its members raw.
#[derive(Deserialize)]
pub struct PartView<'a> {
    #[serde(borrow, rename = "type", default)]
    pub kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub refusal: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub image_url: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub file: Option<&'a RawValue>,
    /// An Anthropic `tool_result`'s content (a string or blocks) and the call it answers.
    #[serde(borrow, default)]
    pub content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub tool_use_id: Option<Cow<'a, str>>,
}

/// A string value's text (borrowed when it has no escapes); None for null or a non-string.
pub(crate) fn string_value(raw: &str) -> Option<Cow<'_, str>> {
    if !raw.starts_with('"') {
        return None;
    }
    let inner = &raw[1..raw.len().saturating_sub(1).max(1)];
    if inner.contains('\\') {
        serde_json::from_str::<String>(raw).ok().map(Cow::Owned)
    } else {
        Some(Cow::Borrowed(inner))
    }
}

/// One piece of a message as the count reads it.
enum Piece<'t> {
    /// A JSON string literal, quotes included: its decoded text counts.
    Literal(&'t str),
    /// Text counted as it stands (a role, an id, an opaque item's JSON).
    Plain(&'t str),
    /// A tool call's JSON: the estimate counts it whole, a tokenizer its values.
    Structured(&'t str),
    /// An image part: a flat count.
    Image,
}

/// Adds a piece to the estimate's characters and image count.
fn tally(piece: Piece<'_>, chars: &mut CharCount, images: &mut u64) {
    match piece {
        Piece::Literal(raw) => chars.add(json_string_chars(raw)),
        Piece::Plain(text) | Piece::Structured(text) => chars.add(CharCount::of_str(text)),
        Piece::Image => *images += 1,
    }
}

/// Every string and scalar of a JSON value, one per line.
fn push_values(value: &Value, text: &mut String) {
    match value {
        Value::String(s) => {
            text.push_str(s);
            text.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|v| push_values(v, text)),
        Value::Object(members) => members.values().for_each(|v| push_values(v, text)),
        Value::Null => {}
        scalar => {
            text.push_str(&scalar.to_string());
            text.push('\n');
        }
    }
}

/// Tokens of one content value (a string or an array of parts), as a message counts it.
pub(crate) fn value_tokens(raw: &str, dialect: &dyn Dialect, model: &TokenModel) -> u64 {
    let (mut chars, mut images) = (CharCount::default(), 0);
    content_pieces(Json(raw), dialect, &mut |piece| {
        tally(piece, &mut chars, &mut images)
    });
    model.tokens(chars) + images * model.image_tokens
}

/// The pieces of a content value: a string, or an array of parts (text counted, images flat,
/// anything else by its JSON so nothing is free).
fn content_pieces(raw: Json<'_>, dialect: &dyn Dialect, visit: &mut dyn FnMut(Piece<'_>)) {
    let text = raw.get();
    if text.starts_with('"') {
        visit(Piece::Literal(text));
        return;
    }
    let Ok(parts) = serde_json::from_str::<Vec<&RawValue>>(text) else {
        visit(Piece::Plain(text));
        return;
    };
    for part in parts {
        match serde_json::from_str::<PartView>(part.get()) {
            Ok(view) => {
                let kind = dialect.kind_of(&view, part.get());
                match (kind, view.text, view.refusal) {
                    (Some(PartKind::Image), _, _) => visit(Piece::Image),
                    (_, Some(text), _) if text.get().starts_with('"') => {
                        visit(Piece::Literal(text.get()))
                    }
                    (Some(PartKind::Refusal), _, Some(refusal))
                        if refusal.get().starts_with('"') =>
                    {
                        visit(Piece::Literal(refusal.get()))
                    }
                    _ => visit(Piece::Plain(part.get())),
                }
            }
            Err(_) if part.get().starts_with('"') => visit(Piece::Literal(part.get())),
            Err(_) => visit(Piece::Plain(part.get())),
        }
    }
}

#[cfg(test)]
mod tests;
