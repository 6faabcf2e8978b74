//! The token estimate (DESIGN.md §2.1): per message `ceil(narrow chars / cpt) + wide chars + 3`,
//! where chars = role + name + text parts + `tool_calls` JSON + `tool_call_id`; image parts a
//! flat 85 (configurable); CJK and other wide characters one token each; plus the request's
//! `tools` schemas. Counting works on the raw JSON text, so no message content is copied.
//!
//! Characters are counted by class (letters, digits, punctuation, spaces, other narrow, wide,
//! plus word starts and the tail of long runs) because tokenizers treat them very differently:
//! prose runs 5 characters a token, code and JSON 3, CJK 1 or less. Uncalibrated, every narrow
//! class costs `1 / cpt` as above; once a model's upstream has reported its own counts, each
//! class has the weight learned from them (see [`crate::compaction::calibration`]).

use crate::compaction::planner::json_escape::{decode_escape, Escaped};
use wildmatch::WildMatch;

use crate::config::{ModelConfig, TokenizerChoice};
pub use crate::encoding::Encoding;

/// Tokens added per message for the role/separator framing.
pub const PER_MESSAGE_OVERHEAD: u64 = 3;
pub const DEFAULT_CHARS_PER_TOKEN: f64 = 4.0;
pub const CLAUDE_CHARS_PER_TOKEN: f64 = 3.3;
pub const DEFAULT_IMAGE_TOKENS: u64 = 85;

/// Alphanumeric characters of a run past this many count as `dense` too: identifiers, hashes
/// and base64 split into many more tokens than words of the same length.
const DENSE_AFTER: u32 = 12;

/// The estimate's features, in the order of [`Weights`]: the character classes, then messages.
pub const FEATURES: usize = 9;

/// Tokens per unit of each feature: letters, digits, punctuation, spaces, other narrow, wide,
/// words, dense, and per message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights(pub [f64; FEATURES]);

impl Weights {
    pub const MESSAGE: usize = 8;

    /// What a configured chars-per-token ratio says: every narrow character `1 / cpt`, a wide
    /// one 1, the message framing [`PER_MESSAGE_OVERHEAD`].
    pub fn prior(chars_per_token: f64) -> Weights {
        let narrow = 1.0 / chars_per_token;
        Weights([
            narrow,
            narrow,
            narrow,
            narrow,
            narrow,
            1.0,
            0.0,
            0.0,
            PER_MESSAGE_OVERHEAD as f64,
        ])
    }

    pub fn of(&self, features: &[f64; FEATURES]) -> f64 {
        self.0.iter().zip(features).map(|(w, x)| w * x).sum()
    }

    /// The most tokens one byte of raw JSON can cost (a counted character is at least one byte,
    /// a wide one three), for the size bound.
    pub fn max_tokens_per_byte(&self) -> f64 {
        let [letters, digits, punct, spaces, other, wide, words, dense, _] = self.0;
        let alnum = letters.max(digits) + words + dense;
        alnum
            .max(punct)
            .max(spaces)
            .max(other / 2.0)
            .max(wide / 3.0)
    }
}

fn encoding_of_choice(choice: Option<TokenizerChoice>, model: &str) -> Option<Encoding> {
    match choice {
        Some(TokenizerChoice::O200k) => Some(Encoding::O200k),
        Some(TokenizerChoice::Cl100k) => Some(Encoding::Cl100k),
        Some(TokenizerChoice::Estimate) => None,
        None => Encoding::for_model(model),
    }
}

/// How one model's text turns into tokens, and its window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenModel {
    pub chars_per_token: f64,
    pub image_tokens: u64,
    pub max_input_tokens: Option<u64>,
    /// Learned from the upstream's own counts of this model's requests; None: the configured
    /// ratio alone.
    pub calibration: Option<Weights>,
    /// The model's own tokenizer, when compactor has it. Messages and schemas are counted with
    /// it only where it is set here, which the planner does for a body near a trigger.
    pub exact: Option<Encoding>,
}

impl Default for TokenModel {
    fn default() -> Self {
        TokenModel {
            chars_per_token: DEFAULT_CHARS_PER_TOKEN,
            image_tokens: DEFAULT_IMAGE_TOKENS,
            max_input_tokens: None,
            calibration: None,
            exact: None,
        }
    }
}

/// The `models:` table, matched in order; built-in fallbacks after it.
#[derive(Debug, Clone, Default)]
pub struct ModelTable {
    entries: Vec<(WildMatch, ModelConfig)>,
    /// Each entry's `tokenizer_file`, loaded (a file that does not load was refused when the
    /// configuration was checked).
    files: Vec<Option<Encoding>>,
}

impl ModelTable {
    pub fn new(models: &[ModelConfig]) -> ModelTable {
        ModelTable {
            entries: models
                .iter()
                .map(|m| (WildMatch::new(&m.pattern), m.clone()))
                .collect(),
            files: models
                .iter()
                .map(|m| {
                    m.tokenizer_file
                        .as_deref()
                        .and_then(|path| Encoding::from_file(path).ok())
                })
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
            calibration: None,
            exact: None,
        });
        builtins.into_iter().chain(entries).collect()
    }

    /// Whether `model`'s estimate learns from its upstreams' counts (`models[].calibrate`).
    pub fn calibrates(&self, model: &str) -> bool {
        self.entries
            .iter()
            .find(|(glob, _)| glob.matches(model))
            .and_then(|(_, entry)| entry.calibrate)
            .unwrap_or(true)
    }

    /// How `model` counts; its tokenizer, when it has one, is in [`ModelTable::encoding`].
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
                calibration: None,
                exact: None,
            },
            None => TokenModel {
                chars_per_token: builtin_cpt,
                ..TokenModel::default()
            },
        }
    }

    /// The tokenizer `model` is counted with near a trigger: its entry's `tokenizer`, else
    /// OpenAI's encoding for an OpenAI model name.
    pub fn encoding(&self, model: Option<&str>) -> Option<Encoding> {
        let model = model.unwrap_or("");
        let found = self
            .entries
            .iter()
            .position(|(glob, _)| glob.matches(model));
        if let Some(file) = found.and_then(|i| self.files[i]) {
            return Some(file);
        }
        let choice = found.and_then(|i| self.entries[i].1.tokenizer);
        encoding_of_choice(choice, model)
    }
}

/// Characters of some text by class. `words` counts runs of ASCII letters and digits, `dense`
/// their characters past the [`DENSE_AFTER`]th: both overlap the classes they were counted in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CharCount {
    pub letters: u64,
    pub digits: u64,
    pub punct: u64,
    pub spaces: u64,
    /// Narrow characters outside ASCII (accented Latin, Cyrillic, emoji…).
    pub other: u64,
    pub wide: u64,
    pub words: u64,
    pub dense: u64,
}

impl CharCount {
    pub fn add(&mut self, other: CharCount) {
        self.letters += other.letters;
        self.digits += other.digits;
        self.punct += other.punct;
        self.spaces += other.spaces;
        self.other += other.other;
        self.wide += other.wide;
        self.words += other.words;
        self.dense += other.dense;
    }

    /// Every character that is not wide.
    pub fn narrow(&self) -> u64 {
        self.letters + self.digits + self.punct + self.spaces + self.other
    }

    /// `n` characters of markup (frame tags and the like), counted as punctuation.
    pub fn markup(n: u64) -> CharCount {
        CharCount {
            punct: n,
            ..CharCount::default()
        }
    }

    pub fn of_str(text: &str) -> CharCount {
        let mut counter = Counter::default();
        if text.is_ascii() {
            counter.ascii(text.as_bytes());
        } else {
            for c in text.chars() {
                counter.push(c);
            }
        }
        counter.count
    }

    /// The features [`Weights`] apply to, for text framed as `messages` messages.
    pub fn features(&self, messages: u64) -> [f64; FEATURES] {
        [
            self.letters as f64,
            self.digits as f64,
            self.punct as f64,
            self.spaces as f64,
            self.other as f64,
            self.wide as f64,
            self.words as f64,
            self.dense as f64,
            messages as f64,
        ]
    }
}

/// ASCII byte classes: letter, digit, punctuation, space (controls count as spaces).
const LETTER: u8 = 0;
const DIGIT: u8 = 1;
const PUNCT: u8 = 2;
const SPACE: u8 = 3;

static ASCII_CLASS: [u8; 128] = {
    let mut table = [SPACE; 128];
    let mut b = 0;
    while b < 128 {
        table[b] = match b as u8 {
            b'a'..=b'z' | b'A'..=b'Z' => LETTER,
            b'0'..=b'9' => DIGIT,
            0x21..=0x7E => PUNCT,
            _ => SPACE,
        };
        b += 1;
    }
    table
};

/// Counts characters one at a time, remembering the alphanumeric run it is in.
#[derive(Default)]
struct Counter {
    count: CharCount,
    run: u32,
}

impl Counter {
    // Branch-free forms (class counts as lanes of one register, the run as arithmetic) measured
    // no faster: the alphanumeric run is a chain through every byte either way.
    fn ascii(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.ascii_byte(b);
        }
    }

    #[inline]
    fn ascii_byte(&mut self, b: u8) {
        let class = ASCII_CLASS[(b & 0x7F) as usize];
        if class <= DIGIT {
            if self.run == 0 {
                self.count.words += 1;
            }
            self.run += 1;
            if self.run > DENSE_AFTER {
                self.count.dense += 1;
            }
            if class == LETTER {
                self.count.letters += 1;
            } else {
                self.count.digits += 1;
            }
            return;
        }
        self.run = 0;
        if class == PUNCT {
            self.count.punct += 1;
        } else {
            self.count.spaces += 1;
        }
    }

    fn push(&mut self, c: char) {
        if c.is_ascii() {
            self.ascii_byte(c as u8);
            return;
        }
        self.run = 0;
        if is_wide(c) {
            self.count.wide += 1;
        } else {
            self.count.other += 1;
        }
    }
}

impl TokenModel {
    /// `ceil(narrow / cpt) + wide`, or the calibrated weights' sum.
    pub fn tokens(&self, chars: CharCount) -> u64 {
        match &self.calibration {
            Some(weights) => weights.of(&chars.features(0)).max(0.0).ceil() as u64,
            None => {
                let narrow = (chars.narrow() as f64 / self.chars_per_token).ceil() as u64;
                narrow + chars.wide
            }
        }
    }

    /// Tokens of a message's framing (role markers, separators).
    pub fn message_overhead(&self) -> u64 {
        self.calibration.map_or(PER_MESSAGE_OVERHEAD, |w| {
            w.0[Weights::MESSAGE].round() as u64
        })
    }

    /// About what one character costs, for cutting text to a budget.
    pub fn char_cost(&self, c: char) -> f64 {
        let Some(Weights([letters, digits, punct, spaces, other, wide, words, ..])) =
            self.calibration
        else {
            return if is_wide(c) {
                1.0
            } else {
                1.0 / self.chars_per_token
            };
        };
        match c {
            'a'..='z' | 'A'..='Z' => letters + words / 5.0,
            '0'..='9' => digits + words / 5.0,
            c if c.is_ascii_whitespace() || c.is_ascii_control() => spaces,
            c if c.is_ascii() => punct,
            c if is_wide(c) => wide,
            _ => other,
        }
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
    let mut counter = Counter::default();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\\' {
            let (escaped, used) = decode_escape(inner, i);
            counter.push(match escaped {
                Escaped::Char(c) => c,
                Escaped::LoneSurrogate(_) => '?',
            });
            i += used;
        } else if b < 0x80 {
            let start = i;
            i = plain_ascii_run_end(bytes, i);
            counter.ascii(&bytes[start..i]);
        } else {
            let width = utf8_width(b);
            let c = inner
                .get(i..i + width)
                .and_then(|s| s.chars().next())
                .unwrap_or('?');
            counter.push(c);
            i += width.max(1);
        }
    }
    counter.count
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
        let narrow_wide = |raw: &str| {
            let count = json_string_chars(raw);
            (count.narrow(), count.wide)
        };
        assert_eq!(narrow_wide(r#""Hello""#), (5, 0));
        assert_eq!(narrow_wide(r#""a\nb\"c""#), (5, 0));
        assert_eq!(narrow_wide(r#""\u4f60\u597d""#), (0, 2));
        assert_eq!(narrow_wide("\"你好x\""), (1, 2));
        assert_eq!(narrow_wide(r#""\ud83d\ude00""#), (1, 0));
        assert_eq!(narrow_wide("\"é😀\""), (2, 0));
        assert_eq!(json_string_chars(r#""""#), CharCount::default());
        // A lone surrogate of either half is one character, as the digest and the transcript
        // read it.
        assert_eq!(narrow_wide(r#""\ude00x\ud83d""#), (3, 0));
    }

    #[test]
    fn characters_are_counted_by_class() {
        let count = CharCount::of_str("Hello, world 42\n0123456789abcdefXYZ é你");
        assert_eq!(
            count,
            CharCount {
                letters: 10 + 9,
                digits: 2 + 10,
                punct: 1,
                spaces: 4,
                other: 1,
                wide: 1,
                words: 4,
                dense: 19 - 12,
            }
        );
        let raw = serde_json::to_string("Hello, world 42\n0123456789abcdefXYZ é你").unwrap();
        assert_eq!(json_string_chars(&raw), count);
    }

    #[test]
    fn openai_models_have_their_encoding_and_the_table_can_override_it() {
        for (model, encoding) in [
            ("gpt-4o-mini", Some(Encoding::O200k)),
            ("gpt-5.1-codex", Some(Encoding::O200k)),
            ("o4-mini", Some(Encoding::O200k)),
            ("gpt-4-turbo", Some(Encoding::Cl100k)),
            ("gpt-3.5-turbo", Some(Encoding::Cl100k)),
            ("claude-sonnet-4-5", None),
            ("llama-3.1-8b", None),
        ] {
            assert_eq!(
                ModelTable::new(&[]).encoding(Some(model)),
                encoding,
                "{model}"
            );
        }
        let table = ModelTable::new(&[
            ModelConfig {
                pattern: "gpt-4o*".into(),
                tokenizer: Some(TokenizerChoice::Estimate),
                ..ModelConfig::default()
            },
            ModelConfig {
                pattern: "my-azure-deployment".into(),
                tokenizer: Some(TokenizerChoice::O200k),
                ..ModelConfig::default()
            },
        ]);
        assert_eq!(table.encoding(Some("gpt-4o")), None);
        assert_eq!(
            table.encoding(Some("my-azure-deployment")),
            Some(Encoding::O200k)
        );
        assert_eq!(Encoding::O200k.count("Hello, world!"), 4);
    }

    #[cfg(feature = "hf-tokenizers")]
    #[test]
    fn a_tokenizer_file_counts_an_open_model_and_is_loaded_once() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tokenizer.json");
        let table = ModelTable::new(&[ModelConfig {
            pattern: "local-*".into(),
            tokenizer_file: Some(path.into()),
            ..ModelConfig::default()
        }]);
        let encoding = table.encoding(Some("local-model")).expect("loaded");
        // The fixture's BPE (trained on this project's generated prose) knows these words.
        assert_eq!(encoding.count("the deployment failed"), 4);
        assert_eq!(Encoding::from_file(path), Ok(encoding), "the same copy");
        assert!(Encoding::from_file("/nonexistent/tokenizer.json").is_err());
    }

    #[test]
    fn calibrated_weights_replace_the_ratio() {
        let chars = CharCount::of_str("日本語 text");
        let plain = TokenModel::default();
        assert_eq!(plain.tokens(chars), 2 + 3);
        assert_eq!(plain.message_overhead(), PER_MESSAGE_OVERHEAD);
        let mut weights = Weights::prior(4.0);
        weights.0[5] = 2.0;
        weights.0[Weights::MESSAGE] = 7.0;
        let calibrated = TokenModel {
            calibration: Some(weights),
            ..TokenModel::default()
        };
        assert_eq!(calibrated.tokens(chars), 2 + 6);
        assert_eq!(calibrated.message_overhead(), 7);
        assert_eq!(calibrated.char_cost('日'), 2.0);
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
            tokenizer: None,
            tokenizer_file: None,
            calibrate: None,
        }]);
        let gpt = table.lookup(Some("gpt-4o-mini"));
        assert_eq!(gpt.max_input_tokens, Some(128_000));
        assert_eq!(gpt.image_tokens, 170);
        assert_eq!(gpt.chars_per_token, 4.0);
        assert_eq!(table.lookup(Some("claude-3-5-haiku")).chars_per_token, 3.3);
        assert_eq!(table.lookup(None).max_input_tokens, None);
    }
}
