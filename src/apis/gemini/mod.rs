//! Google's Gemini API (`generateContent`, `streamGenerateContent`; `countTokens` and the rest
//! forwarded as they are) as the planner sees it, for an upstream with `api: gemini`. Each turn
//! of `contents` is one planner message; the model and the stream are named by the path.
//!
//! A `model` turn's `functionCall` parts are its calls; the next turn answers them with as many
//! `functionResponse` parts (Google refuses any other count), so the model turn binds to it and
//! the pair is one group that no cut splits and no summary separates. Ids are often absent, so
//! each call and each response is named by its function and its rank among the turn's parts of
//! that name: the k-th `read_file` call is answered by the k-th `read_file` response.
//!
//! Google checks thought signatures in the active loop (from the last user turn that holds text
//! and no function response); a model turn is never edited, so a kept turn keeps its signed
//! parts byte for byte, and a summarized one is summarized whole. The summary is a user turn of
//! text (or the first part of the first kept user turn), which starts the active loop anew:
//! every model turn after it was already in the client's own active loop, signed as it sent it.
//! The only turns rewritten are function responses, whose string `output` the
//! `clear_tool_outputs` stage may replace (Google signs the model's parts, not the client's).
//! `systemInstruction` is pinned like instructions; a request on `cachedContent` is left alone,
//! as its prefix lies upstream.

use std::borrow::Cow;
use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::compaction::front_end::{read_messages, FrontEnd, Parsed, Unplannable};
use crate::compaction::planner::conversation::{
    string_value, Conversation, Dialect, Json, Message, ParseError, PartKind, PartView, Role,
    ToolCall, ToolOutput,
};
use crate::compaction::planner::raw_json::{ContentMember, RoleAndContent};
use crate::compaction::planner::rewrite::with_first_element;
use crate::compaction::reason::Reason;
use crate::compaction::summaries::message_text::json_text;
use crate::config::{NoticeMode, SummaryPlacement, SummaryRole};

pub mod path;
pub mod provider;
pub mod retrieval;
pub mod wire;

pub use path::{is_google_path, model_call, ModelCall};

/// The members of a request that planning reads. Google's JSON takes proto names in either
/// case, so both spellings are read.
#[derive(Deserialize)]
struct RequestView<'a> {
    #[serde(borrow, default)]
    contents: Option<Vec<TurnFields<'a>>>,
    #[serde(
        borrow,
        default,
        rename = "systemInstruction",
        alias = "system_instruction"
    )]
    system_instruction: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(default, rename = "generationConfig", alias = "generation_config")]
    generation_config: Option<GenerationConfig>,
    #[serde(borrow, default, rename = "cachedContent", alias = "cached_content")]
    cached_content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct GenerationConfig {
    #[serde(default, rename = "maxOutputTokens", alias = "max_output_tokens")]
    max_output_tokens: Option<u64>,
}

/// A turn's members that planning reads: its role and `parts`.
struct Parts;

impl ContentMember for Parts {
    const NAME: &'static str = "parts";
}

type TurnFields<'a> = RoleAndContent<'a, Parts>;

/// One part: Google's parts carry no type, each is known by its one data member.
#[derive(Deserialize)]
struct PartFields<'a> {
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    /// A thought is reasoning whatever it holds.
    #[serde(default)]
    thought: Option<bool>,
    #[serde(borrow, default, rename = "inlineData", alias = "inline_data")]
    inline_data: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "fileData", alias = "file_data")]
    file_data: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "functionCall", alias = "function_call")]
    function_call: Option<FunctionCall<'a>>,
    #[serde(
        borrow,
        default,
        rename = "functionResponse",
        alias = "function_response"
    )]
    function_response: Option<FunctionResponse<'a>>,
}

impl PartFields<'_> {
    fn kind(&self) -> PartKind {
        if self.thought == Some(true) {
            PartKind::Reasoning
        } else if self.text.is_some() {
            PartKind::Text
        } else if self.inline_data.is_some() {
            PartKind::Image
        } else if self.file_data.is_some() {
            PartKind::File
        } else if self.function_call.is_some() {
            PartKind::ToolCall
        } else if self.function_response.is_some() {
            PartKind::ToolResult
        } else {
            PartKind::Opaque
        }
    }
}

#[derive(Deserialize)]
struct FunctionCall<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    args: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct FunctionResponse<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    response: Option<&'a RawValue>,
}

/// A function response's `response` object: its `output`, when it is text, is what clearing
/// may replace (the Gemini CLI's tools answer `{"output": "…"}`).
#[derive(Deserialize)]
struct ResponseObject<'a> {
    #[serde(borrow, default)]
    output: Option<&'a RawValue>,
}

pub fn parse(body: &[u8]) -> Result<Parsed<'_>, ParseError> {
    let text = std::str::from_utf8(body).map_err(|e| ParseError::NotChat(e.to_string()))?;
    let view: RequestView<'_> =
        serde_json::from_str(text).map_err(|e| ParseError::NotChat(e.to_string()))?;
    if view.cached_content.is_some_and(|raw| raw.get() != "null") {
        return Ok(Parsed::LeaveAlone(Reason::CachedContent));
    }
    let Some(turns) = view.contents else {
        return Err(ParseError::NotChat("no contents array".into()));
    };
    let messages = match read_messages(text, &turns, message)? {
        Ok(messages) => messages,
        Err(reason) => return Ok(Parsed::LeaveAlone(reason)),
    };
    let output_reserve = view
        .generation_config
        .and_then(|config| config.max_output_tokens)
        .unwrap_or(0);
    Ok(Parsed::Conversation(Conversation::from_parts(
        body,
        None,
        messages,
        view.tools,
        view.system_instruction.filter(|raw| raw.get() != "null"),
        output_reserve,
        &Gemini,
    )))
}

/// One turn read on its own (a copy made by a stage), as [`parse`] reads each turn.
pub(crate) fn parse_message(raw: &str) -> Option<Message<'_>> {
    let fields: TurnFields<'_> = serde_json::from_str(raw).ok()?;
    message(raw, &fields).ok()
}

/// The name a call or response goes by: its function's, ranked among the turn's parts of that
/// name, as Google pairs them.
fn ranked_name<'a>(name: Cow<'a, str>, seen: &mut Vec<Cow<'a, str>>) -> Cow<'a, str> {
    let rank = seen.iter().filter(|earlier| **earlier == name).count();
    let id = Cow::Owned(format!("{name}#{rank}"));
    seen.push(name);
    id
}

fn message<'a>(raw: &'a str, fields: &TurnFields<'a>) -> Result<Message<'a>, Unplannable> {
    let role = match fields.role.filter(|raw| *raw != "null") {
        Some(raw) => {
            string_value(raw).ok_or_else(|| Unplannable::Bad("role is not a string".into()))?
        }
        // A single turn may leave its role out: it is the user's.
        None => Cow::Borrowed("user"),
    };
    let from_model = match role.as_ref() {
        "model" => true,
        "user" | "function" => false,
        other => {
            return Err(Unplannable::Bad(format!(
                "role '{other}' is not user or model"
            )))
        }
    };
    let parts = fields.content.filter(|raw| *raw != "null");
    let mut calls = Vec::new();
    let mut answers = Vec::new();
    let mut outputs = Vec::new();
    let (mut called, mut answered) = (Vec::new(), Vec::new());
    if let Some(parts) = parts {
        let parts: Vec<PartFields<'a>> =
            serde_json::from_str(parts).map_err(|e| Unplannable::Bad(format!("parts: {e}")))?;
        for part in parts {
            if let (Some(call), true) = (part.function_call, from_model) {
                let name = call.name.unwrap_or(Cow::Borrowed(""));
                calls.push(ToolCall {
                    id: ranked_name(name.clone(), &mut called),
                    name,
                    arguments_raw: call.args.map(|raw| Json::of(raw.get())),
                });
            }
            if let (Some(response), false) = (part.function_response, from_model) {
                let name = response.name.unwrap_or(Cow::Borrowed(""));
                let id = ranked_name(name, &mut answered);
                let output = response
                    .response
                    .and_then(|raw| serde_json::from_str::<ResponseObject<'a>>(raw.get()).ok())
                    .and_then(|object| object.output)
                    .filter(|raw| raw.get().starts_with('"'));
                if let Some(value) = output {
                    outputs.push(ToolOutput {
                        value: Json::of(value.get()),
                        call_id: id.clone(),
                    });
                }
                answers.push(id);
            }
        }
    }
    let binds_next = !calls.is_empty();
    let mut message = Message::from_item(raw, role, parts, calls, None, None, binds_next, &Gemini);
    if from_model {
        message.role = Role::Assistant;
    } else if !answers.is_empty() {
        message.role = Role::Tool;
        message.more_answers = answers;
        message.tool_outputs = outputs;
    } else {
        message.role = Role::User;
    }
    Ok(message)
}

/// The Gemini front-end.
#[derive(Debug)]
pub struct Gemini;

impl Dialect for Gemini {
    /// Google's parts carry no type: see [`Dialect::kind_of`].
    fn part_kind(&self, _kind: &str) -> PartKind {
        PartKind::Opaque
    }

    fn kind_of(&self, _part: &PartView<'_>, raw: &str) -> Option<PartKind> {
        serde_json::from_str::<PartFields<'_>>(raw)
            .ok()
            .map(|part| part.kind())
    }

    /// `← result [name]: …`, a lone text `output` (the Gemini CLI's tools answer so) as its
    /// text, any other response as its JSON.
    fn result_shown(&self, raw: &str) -> Option<String> {
        let response = serde_json::from_str::<PartFields<'_>>(raw)
            .ok()?
            .function_response?;
        let object = response.response.map(RawValue::get).unwrap_or("");
        let output = serde_json::from_str::<ResponseObject<'_>>(object)
            .ok()
            .and_then(|object| object.output)
            .and_then(|output| json_text(output.get()));
        let shown = output.map_or_else(|| object.to_string(), Cow::into_owned);
        Some(format!(
            "← result [{}]: {shown}",
            response.name.as_deref().unwrap_or("")
        ))
    }

    fn parse_message<'a>(&self, raw: &'a str) -> Option<Message<'a>> {
        parse_message(raw)
    }

    /// Into the first kept user turn whenever its parts were found: one user turn reads as the
    /// client's own.
    fn merges_summary(&self, _: SummaryPlacement, _: SummaryRole, content_located: bool) -> bool {
        content_located
    }

    fn summary_json(&self, framed: &str, _role: SummaryRole, _breakpoint: Option<&str>) -> String {
        format!(r#"{{"role":"user","parts":[{}]}}"#, text_part(framed))
    }

    fn merged_summary(
        &self,
        body: &[u8],
        message: Range<usize>,
        content: Option<Range<usize>>,
        framed: &str,
        _breakpoint: Option<&str>,
    ) -> Option<String> {
        // `parts` is always an array; anything else is not joined.
        with_first_element(body, &message, &content?, &text_part(framed), |_| None)
    }
}

fn text_part(framed: &str) -> String {
    serde_json::json!({ "text": framed }).to_string()
}

impl FrontEnd for Gemini {
    /// Content generation, streamed or not, under any of Google's path forms.
    fn serves_path(&self, path: &str) -> bool {
        model_call(path)
            .is_some_and(|call| matches!(call.method, "generateContent" | "streamGenerateContent"))
    }

    fn path_model<'p>(&self, path: &'p str) -> Option<&'p str> {
        model_call(path).map(|call| call.model)
    }

    fn path_streams(&self, path: &str) -> bool {
        model_call(path).is_some_and(|call| call.method == "streamGenerateContent")
    }

    fn label(&self) -> &'static str {
        "gemini"
    }

    fn parse<'a>(&self, body: &'a [u8]) -> Result<Parsed<'a>, ParseError> {
        parse(body)
    }

    /// None: neither SDK skips a line it does not know. google-genai (Python) parses every
    /// line that is not `data: ` as JSON and fails on a comment or an `event:` line;
    /// @google/genai (JavaScript, the Gemini CLI) matches `^\s*data: ` at the head of its
    /// buffer, so any other line there stalls every frame after it; a `data:` frame would reach
    /// the application as an empty response. The `x-compactor-*` headers say what was done.
    fn notice_form(&self, _asked: NoticeMode) -> NoticeMode {
        NoticeMode::Off
    }

    /// A turn may leave its role out, so the `"role"` literals do not bound the turns.
    fn size_bound_applies(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests;
