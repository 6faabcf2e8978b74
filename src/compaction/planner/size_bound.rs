//! "Under every trigger" proved from the body's bytes alone, without parsing it: most requests
//! through compactor are far below the trigger, and a few `memchr` passes (about 0.1 ms per MB)
//! cost much less than the parse and count that would otherwise show it.
//!
//! The bound follows the estimate of [`super::tokens`]: every counted character is at least one
//! byte of the raw JSON, a wide character (one token) at least three (six as a `\u` escape), each
//! message adds at most `PER_MESSAGE_OVERHEAD + 1` (its framing and the rounding up), each image
//! part a flat count. A message must have a `"role"` key and an image part a `"image…"` type, so
//! counting those literals bounds both, unless the body spells an ASCII letter as a `\u00XX`
//! escape; such a body (and one whose output reserve is not a plain number, where a `fraction`
//! trigger or the model's window depends on it) is left to the full count.

use std::sync::LazyLock;

use memchr::memmem::Finder;

use crate::compaction::planner::plan::PlanSettings;
use crate::compaction::planner::tokens::{ModelTable, PER_MESSAGE_OVERHEAD};
use crate::config::ContextSize;

/// What every model the table can pick has in common, for the bound: the fewest characters per
/// token, the most tokens per image, the smallest known window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelBounds {
    pub min_chars_per_token: f64,
    pub max_image_tokens: u64,
    /// None: no model has a known window, so `fraction` triggers never apply.
    pub min_window: Option<u64>,
    /// The most tokens a byte costs under any calibrated model's weights (0: none calibrated).
    pub max_calibrated_per_byte: f64,
    /// The most tokens a message's framing costs under any calibrated model's weights.
    pub max_message_overhead: u64,
}

impl ModelBounds {
    pub fn of(table: &ModelTable) -> ModelBounds {
        let models = table.every_model();
        ModelBounds {
            min_chars_per_token: models
                .iter()
                .map(|m| m.chars_per_token)
                .fold(f64::INFINITY, f64::min),
            max_image_tokens: models.iter().map(|m| m.image_tokens).max().unwrap_or(0),
            min_window: models.iter().filter_map(|m| m.max_input_tokens).min(),
            max_calibrated_per_byte: 0.0,
            max_message_overhead: PER_MESSAGE_OVERHEAD,
        }
    }

    /// These bounds, allowing for what calibration has learned.
    pub fn with_calibration(self, max_per_byte: f64, max_per_message: u64) -> ModelBounds {
        ModelBounds {
            max_calibrated_per_byte: self.max_calibrated_per_byte.max(max_per_byte),
            max_message_overhead: self.max_message_overhead.max(max_per_message),
            ..self
        }
    }
}

/// Built once: a searcher's set-up costs more than the search of a small body.
struct Finders {
    role: Finder<'static>,
    image: Finder<'static>,
    max_tokens: Finder<'static>,
    max_completion_tokens: Finder<'static>,
    escape: Finder<'static>,
}

static FINDERS: LazyLock<Finders> = LazyLock::new(|| Finders {
    role: Finder::new(br#""role""#),
    image: Finder::new(br#""image"#),
    max_tokens: Finder::new(br#""max_tokens""#),
    max_completion_tokens: Finder::new(br#""max_completion_tokens""#),
    escape: Finder::new(br"\u00"),
});

/// Whether any body of these bytes is under `share ×` every trigger of `settings` (the model's
/// window included), whatever model it names; false means only "not proved" (the full count
/// decides).
pub fn provably_under(
    body: &[u8],
    settings: &PlanSettings,
    models: &ModelBounds,
    share: f64,
) -> bool {
    let finders = &*FINDERS;
    if has_escaped_ascii_letter(body, &finders.escape) {
        return false;
    }
    let roles = finders.role.find_iter(body).count() as u64;
    let images = finders.image.find_iter(body).count() as u64;
    // A wide character is one token for at least 3 bytes (UTF-8) or 6 (a `\u` escape, the only
    // way an ASCII body holds one).
    let bytes_per_wide = if body.is_ascii() { 6.0 } else { 3.0 };
    let divisor = models.min_chars_per_token.min(bytes_per_wide);
    let text_tokens = (body.len() as f64 / divisor)
        .max(body.len() as f64 * models.max_calibrated_per_byte)
        .ceil();
    // The tools schema is counted (and rounded up) once more, apart from the messages.
    let tokens = text_tokens
        + (images * models.max_image_tokens) as f64
        + (roles * (models.max_message_overhead + 1)) as f64
        + 1.0;
    // The model's window is a trigger too (a `fraction` of 1).
    let window = ContextSize::Fraction(1.0);
    let reserve = declared_reserve(body, finders);
    settings
        .triggers
        .iter()
        .chain(std::iter::once(&window))
        .all(|trigger| match *trigger {
            ContextSize::Tokens(v) => tokens < share * v as f64,
            ContextSize::Messages(v) => (roles as f64) < share * v as f64,
            ContextSize::Fraction(f) => match (models.min_window, reserve) {
                (None, _) => true,
                (Some(_), None) => false,
                // The smallest threshold any model's window gives with the largest reserve.
                (Some(window), Some(reserve)) => {
                    let usable = window.saturating_sub(reserve) as f64;
                    tokens < share * (usable * f).floor().max(1.0)
                }
            },
        })
}

/// The largest output reserve the body can declare: every `"max_tokens"` and
/// `"max_completion_tokens"` member's number (a key cannot occur inside a string, where its
/// quotes would be escaped), 0 for none or `null`; None when one is not a plain number.
fn declared_reserve(body: &[u8], finders: &Finders) -> Option<u64> {
    let mut reserve = 0u64;
    let keys = [&finders.max_tokens, &finders.max_completion_tokens];
    for (finder, at) in keys
        .into_iter()
        .flat_map(|finder| finder.find_iter(body).map(move |at| (finder, at)))
    {
        let rest = &body[at + finder.needle().len()..];
        let rest = rest
            .trim_ascii_start()
            .strip_prefix(b":")?
            .trim_ascii_start();
        if rest.starts_with(b"null") {
            continue;
        }
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        let value: u64 = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
        if matches!(rest.get(digits), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        reserve = reserve.max(value);
    }
    Some(reserve)
}

/// `\u004X` … `\u007X`: an escaped ASCII letter (or `_`), the one way a body can spell a key or
/// type the literal search would miss. (An escaped backslash followed by `u004…` counts too:
/// a false alarm only costs the full count.)
fn has_escaped_ascii_letter(body: &[u8], escape: &Finder<'_>) -> bool {
    escape
        .find_iter(body)
        .any(|at| matches!(body.get(at + 4), Some(b'4'..=b'7')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::chat;
    use crate::compaction::planner::plan::over_trigger;
    use crate::config::{ModelConfig, SummarizationConfig};
    use proptest::prelude::*;
    use serde_json::json;

    fn settings(triggers: Vec<ContextSize>) -> PlanSettings {
        PlanSettings {
            triggers,
            ..PlanSettings::from_config(&SummarizationConfig::default())
        }
    }

    fn table() -> ModelTable {
        ModelTable::new(&[ModelConfig {
            pattern: "small*".into(),
            max_input_tokens: Some(8_000),
            chars_per_token: Some(2.5),
            image_tokens: Some(200),
            tokenizer: None,
            tokenizer_file: None,
            calibrate: None,
        }])
    }

    #[test]
    fn the_bounds_cover_the_table_and_the_builtins() {
        let bounds = ModelBounds::of(&table());
        assert_eq!(bounds.min_chars_per_token, 2.5);
        assert_eq!(bounds.max_image_tokens, 200);
        assert_eq!(bounds.min_window, Some(8_000));
        let builtin = ModelBounds::of(&ModelTable::default());
        assert_eq!(builtin.min_chars_per_token, 3.3);
        assert_eq!(builtin.min_window, None);
    }

    #[test]
    fn a_small_body_is_proved_under_and_a_large_one_is_left_to_the_count() {
        let bounds = ModelBounds::of(&ModelTable::default());
        let small = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
        let small = small.to_string();
        let tokens = settings(vec![ContextSize::Tokens(60_000)]);
        assert!(provably_under(small.as_bytes(), &tokens, &bounds, 1.0));
        let large = json!({"messages": [{"role": "user", "content": "a".repeat(400_000)}]});
        assert!(!provably_under(
            large.to_string().as_bytes(),
            &tokens,
            &bounds,
            1.0
        ));
        let two_messages = settings(vec![ContextSize::Messages(1)]);
        assert!(!provably_under(
            small.as_bytes(),
            &two_messages,
            &bounds,
            1.0
        ));
    }

    #[test]
    fn escaped_letters_and_an_output_reserve_defeat_the_bound() {
        let bounds = ModelBounds::of(&table());
        let tokens = settings(vec![ContextSize::Tokens(60_000)]);
        let escaped = br#"{"messages":[{"\u0072ole":"user","content":"hi"}]}"#;
        assert!(!provably_under(escaped, &tokens, &bounds, 1.0));
        // A wide escape is fine: it cannot spell a key.
        let cjk = br#"{"messages":[{"role":"user","content":"\u4f60"}]}"#;
        assert!(provably_under(cjk, &tokens, &bounds, 1.0));
        let fraction = settings(vec![ContextSize::Fraction(0.8)]);
        let plain = br#"{"model":"small-1","messages":[{"role":"user","content":"hi"}]}"#;
        assert!(provably_under(plain, &fraction, &bounds, 1.0));
        let reserve =
            br#"{"model":"small-1","max_tokens":7999,"messages":[{"role":"user","content":"hi"}]}"#;
        assert!(!provably_under(reserve, &fraction, &bounds, 1.0));
        let small_reserve =
            br#"{"model":"small-1","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
        assert!(provably_under(small_reserve, &fraction, &bounds, 1.0));
        let odd_reserve =
            br#"{"model":"small-1","max_tokens":"100","messages":[{"role":"user","content":"hi"}]}"#;
        assert!(!provably_under(odd_reserve, &fraction, &bounds, 1.0));
    }

    fn part() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            "[a-z \\n\"\\\\{}]{0,40}".prop_map(|t| json!({"type": "text", "text": t})),
            Just(json!({"type": "image_url", "image_url": {"url": "x"}})),
            Just(json!({"type": "image"})),
            "[a-z]{0,8}".prop_map(|t| json!({"type": t})),
        ]
    }

    fn message() -> impl Strategy<Value = serde_json::Value> {
        let text = prop_oneof![
            "[a-z ]{0,60}",
            "[你好世界ｱ한]{0,30}",
            "[\\x00-\\x1f\"]{0,10}"
        ];
        prop_oneof![
            (text.clone(), "(user|system|assistant|tool)")
                .prop_map(|(t, r)| json!({"role": r, "content": t})),
            (proptest::collection::vec(part(), 0..4))
                .prop_map(|parts| json!({"role": "user", "content": parts})),
            (text, "[a-z]{0,6}").prop_map(|(t, id)| json!({"role": "assistant", "content": null,
                "tool_calls": [{"id": id, "type": "function", "function": {"name": "f", "arguments": t}}]})),
        ]
    }

    proptest! {
        // The bound is only ever used to skip the count: it must never claim "under" for a
        // body the full count puts over a trigger.
        #[test]
        fn never_claims_under_for_a_body_over_a_trigger(
            messages in proptest::collection::vec(message(), 0..30),
            tools in proptest::option::of("[a-z]{0,200}"),
            model in "(gpt-4o|claude-3|small-1|other)",
            ascii_escaped in any::<bool>(),
            tokens in 1u64..3_000,
            count in 1u64..40,
            fraction in 0.01f64..1.0,
            reserve in proptest::option::of(0u64..10_000),
        ) {
            let mut body = json!({"model": model, "messages": messages});
            if let Some(reserve) = reserve {
                body["max_tokens"] = json!(reserve);
            }
            if let Some(tools) = tools {
                body["tools"] = json!([{"type": "function", "function": {"name": tools}}]);
            }
            let text = if ascii_escaped {
                // What Python's json.dumps sends: every non-ASCII character escaped.
                let mut out = String::new();
                for c in body.to_string().chars() {
                    if c.is_ascii() {
                        out.push(c);
                    } else {
                        let mut units = [0u16; 2];
                        for unit in c.encode_utf16(&mut units) {
                            out.push_str(&format!("\\u{unit:04x}"));
                        }
                    }
                }
                out
            } else {
                body.to_string()
            };
            let table = table();
            let bounds = ModelBounds::of(&table);
            let conversation = chat::parse(text.as_bytes()).expect("parses");
            let model = table.lookup(conversation.model.as_deref());
            for trigger in [
                ContextSize::Tokens(tokens),
                ContextSize::Messages(count),
                ContextSize::Fraction(fraction),
            ] {
                let settings = settings(vec![trigger]);
                if provably_under(text.as_bytes(), &settings, &bounds, 1.0) {
                    prop_assert!(!over_trigger(&conversation, &settings, &model).0, "{trigger:?}");
                }
            }
        }
    }
}
