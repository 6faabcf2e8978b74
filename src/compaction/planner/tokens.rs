//! The token estimate (DESIGN.md §2.1): per message `ceil(narrow chars / cpt) + wide chars + 3`,
//! where chars = role + name + text parts + `tool_calls` JSON + `tool_call_id`; image parts a
//! flat 85 (configurable); CJK and other wide characters one token each; plus the request's
//! `tools` schemas. Counting works on the raw JSON text, so no message content is copied.

use crate::compaction::planner::json_escape::{decode_escape, Escaped};
use wildmatch::WildMatch;

use crate::config::ModelConfig;

/// Tokens added per message for the role/separator framing.
pub const PER_MESSAGE_OVERHEAD: u64 = 3;
pub const DEFAULT_CHARS_PER_TOKEN: f64 = 4.0;
pub const CLAUDE_CHARS_PER_TOKEN: f64 = 3.3;
pub const DEFAULT_IMAGE_TOKENS: u64 = 85;

/// How one model's text turns into tokens, and its window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenModel {
    pub chars_per_token: f64,
    pub image_tokens: u64,
    pub max_input_tokens: Option<u64>,
}

impl Default for TokenModel {
    fn default() -> Self {
        TokenModel {
            chars_per_token: DEFAULT_CHARS_PER_TOKEN,
            image_tokens: DEFAULT_IMAGE_TOKENS,
            max_input_tokens: None,
        }
    }
}

/// The `models:` table, matched in order; built-in fallbacks after it.
#[derive(Debug, Clone, Default)]
pub struct ModelTable {
    entries: Vec<(WildMatch, ModelConfig)>,
}

impl ModelTable {
    pub fn new(models: &[ModelConfig]) -> ModelTable {
        ModelTable {
            entries: models
                .iter()
                .map(|m| (WildMatch::new(&m.pattern), m.clone()))
                .collect(),
        }
    }

    /// Every model `lookup` can return, at its most expensive: the builtins, and each entry
    /// with the lower built-in chars-per-token where it sets none.
    pub fn every_model(&self) -> Vec<TokenModel> {
        let builtins = [DEFAULT_CHARS_PER_TOKEN, CLAUDE_CHARS_PER_TOKEN].map(|cpt| TokenModel {
            chars_per_token: cpt,
            ..TokenModel::default()
        });
        let entries = self.entries.iter().map(|(_, entry)| TokenModel {
            chars_per_token: entry.chars_per_token.unwrap_or(CLAUDE_CHARS_PER_TOKEN),
            image_tokens: entry.image_tokens.unwrap_or(DEFAULT_IMAGE_TOKENS),
            max_input_tokens: entry.max_input_tokens,
        });
        builtins.into_iter().chain(entries).collect()
    }

    pub fn lookup(&self, model: Option<&str>) -> TokenModel {
        let model = model.unwrap_or("");
        let builtin_cpt = if model.starts_with("claude") {
            CLAUDE_CHARS_PER_TOKEN
        } else {
            DEFAULT_CHARS_PER_TOKEN
        };
        match self.entries.iter().find(|(glob, _)| glob.matches(model)) {
            Some((_, entry)) => TokenModel {
                chars_per_token: entry.chars_per_token.unwrap_or(builtin_cpt),
                image_tokens: entry.image_tokens.unwrap_or(DEFAULT_IMAGE_TOKENS),
                max_input_tokens: entry.max_input_tokens,
            },
            None => TokenModel {
                chars_per_token: builtin_cpt,
                ..TokenModel::default()
            },
        }
    }
}

/// Characters of some text, split into narrow ones (divided by chars-per-token) and wide ones
/// (one token each).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CharCount {
    pub narrow: u64,
    pub wide: u64,
}

impl CharCount {
    pub fn add(&mut self, other: CharCount) {
        self.narrow += other.narrow;
        self.wide += other.wide;
    }

    pub fn of_str(text: &str) -> CharCount {
        if text.is_ascii() {
            return CharCount {
                narrow: text.len() as u64,
                wide: 0,
            };
        }
        let mut count = CharCount::default();
        for c in text.chars() {
            count.push(c);
        }
        count
    }

    fn push(&mut self, c: char) {
        if is_wide(c) {
            self.wide += 1;
        } else {
            self.narrow += 1;
        }
    }
}

impl TokenModel {
    /// `ceil(narrow / cpt) + wide`.
    pub fn tokens(&self, chars: CharCount) -> u64 {
        let narrow = (chars.narrow as f64 / self.chars_per_token).ceil() as u64;
        narrow + chars.wide
    }
}

/// Characters a tokenizer usually spends a whole token (or more) on: CJK ideographs, kana,
/// hangul and fullwidth forms. Counting them at 4 per token undercounts 3–6×.
pub fn is_wide(c: char) -> bool {
    matches!(c as u32,
        0x1100..=0x115F
        | 0x2E80..=0x303E
        | 0x3041..=0x33FF
        | 0x3400..=0x4DBF
        | 0x4E00..=0x9FFF
        | 0xA000..=0xA4CF
        | 0xAC00..=0xD7A3
        | 0xF900..=0xFAFF
        | 0xFE30..=0xFE4F
        | 0xFF00..=0xFF60
        | 0xFFE0..=0xFFE6
        | 0x20000..=0x2FFFD
        | 0x30000..=0x3FFFD)
}

/// Counts the characters of a JSON string literal's *decoded* text straight from its raw form
/// (with the quotes), without allocating: `\n` is one character, `\u4f60` is one wide one.
pub fn json_string_chars(raw: &str) -> CharCount {
    let inner = raw
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(raw);
    let bytes = inner.as_bytes();
    let mut count = CharCount::default();
    let mut i = 0;
    // Fast path: runs of plain ASCII are counted in bulk.
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\\' {
            let (escaped, used) = decode_escape(inner, i);
            count.push(match escaped {
                Escaped::Char(c) => c,
                Escaped::LoneSurrogate(_) => '?',
            });
            i += used;
        } else if b < 0x80 {
            let start = i;
            i = plain_ascii_run_end(bytes, i);
            count.narrow += (i - start) as u64;
        } else {
            let width = utf8_width(b);
            let c = inner
                .get(i..i + width)
                .and_then(|s| s.chars().next())
                .unwrap_or('?');
            count.push(c);
            i += width.max(1);
        }
    }
    count
}

/// End of the run of ASCII bytes other than `\\` starting at `start`, eight bytes at a time.
fn plain_ascii_run_end(bytes: &[u8], mut i: usize) -> usize {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const ONES: u64 = 0x0101_0101_0101_0101;
    const BACKSLASHES: u64 = 0x5C5C_5C5C_5C5C_5C5C;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        let x = word ^ BACKSLASHES;
        let has_backslash = x.wrapping_sub(ONES) & !x & HIGH;
        if (word & HIGH) | has_backslash != 0 {
            break;
        }
        i += 8;
    }
    while i < bytes.len() && bytes[i] < 0x80 && bytes[i] != b'\\' {
        i += 1;
    }
    i
}

fn utf8_width(lead: u8) -> usize {
    match lead {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_string_chars_decodes_escapes_without_copying() {
        assert_eq!(
            json_string_chars(r#""Hello""#),
            CharCount { narrow: 5, wide: 0 }
        );
        assert_eq!(
            json_string_chars(r#""a\nb\"c""#),
            CharCount { narrow: 5, wide: 0 }
        );
        assert_eq!(
            json_string_chars(r#""\u4f60\u597d""#),
            CharCount { narrow: 0, wide: 2 }
        );
        assert_eq!(
            json_string_chars("\"你好x\""),
            CharCount { narrow: 1, wide: 2 }
        );
        assert_eq!(
            json_string_chars(r#""\ud83d\ude00""#),
            CharCount { narrow: 1, wide: 0 }
        );
        assert_eq!(
            json_string_chars("\"é😀\""),
            CharCount { narrow: 2, wide: 0 }
        );
        assert_eq!(json_string_chars(r#""""#), CharCount::default());
        // A lone surrogate of either half is one character, as the digest and the transcript
        // read it.
        assert_eq!(
            json_string_chars(r#""\ude00x\ud83d""#),
            CharCount { narrow: 3, wide: 0 }
        );
    }

    #[test]
    fn escaped_and_plain_forms_count_alike() {
        for text in [
            "plain",
            "tab\there",
            "quote \" and \\ slash",
            "日本語のテキスト",
            "emoji 😀 mix 한국어",
        ] {
            let raw = serde_json::to_string(text).unwrap();
            assert_eq!(json_string_chars(&raw), CharCount::of_str(text), "{text}");
            let ascii_escaped = raw
                .chars()
                .map(|c| {
                    if c.is_ascii() {
                        c.to_string()
                    } else {
                        let mut buf = [0u16; 2];
                        c.encode_utf16(&mut buf)
                            .iter()
                            .map(|u| format!("\\u{u:04x}"))
                            .collect()
                    }
                })
                .collect::<String>();
            assert_eq!(
                json_string_chars(&ascii_escaped),
                CharCount::of_str(text),
                "{text}"
            );
        }
    }

    #[test]
    fn model_table_uses_builtin_claude_ratio_and_configured_windows() {
        let table = ModelTable::new(&[ModelConfig {
            pattern: "gpt-4o*".into(),
            max_input_tokens: Some(128_000),
            chars_per_token: None,
            image_tokens: Some(170),
        }]);
        let gpt = table.lookup(Some("gpt-4o-mini"));
        assert_eq!(gpt.max_input_tokens, Some(128_000));
        assert_eq!(gpt.image_tokens, 170);
        assert_eq!(gpt.chars_per_token, 4.0);
        assert_eq!(table.lookup(Some("claude-3-5-haiku")).chars_per_token, 3.3);
        assert_eq!(table.lookup(None).max_input_tokens, None);
    }
}
