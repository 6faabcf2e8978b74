//! The refs a compacted request's summary issues: one per summarized unit (a tool-call group,
//! or a message), each id derived from the unit's own bytes, so the same span has the same id
//! on every turn and a reused summary's index never changes. A lookup is answered from the
//! request in hand: only a ref this request issued has an answer.
//!
//! Pure: text in, text out.

use sha2::{Digest, Sha256};

/// The most index lines a summary gets; more units are grouped with their neighbours.
pub const MAX_INDEX_LINES: usize = 24;
/// The shortest text a lookup that names no ref is searched for in the originals by.
const MIN_SEARCH_CHARS: usize = 4;
/// The longest description of one unit in the index.
const MAX_WHAT_CHARS: usize = 100;

/// One summarized unit, as an API's front-end reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Its messages' raw bytes, which its id is derived from.
    pub raw: String,
    /// What it was, in a line: the tool and its arguments, or the speaker and first words.
    pub what: String,
    /// Its exact text, as a lookup answers it.
    pub text: String,
}

/// The longest arguments a unit's description quotes.
const WHAT_ARGUMENT_CHARS: usize = 60;
/// The most first words of a message or a result a unit's description quotes.
const WHAT_WORDS_CHARS: usize = 40;

/// One call of a unit, with the result answering it when the unit holds one.
pub struct CallRead<'a> {
    pub name: &'a str,
    pub arguments: &'a str,
    pub output: Option<String>,
}

impl Part {
    /// A message (or a turn) without calls.
    pub fn message(raw: &str, role: &str, content: &str) -> Part {
        Part {
            raw: raw.to_string(),
            what: format!(
                "{role} message, {} bytes: \"{}\"",
                content.len(),
                cut_chars(content, WHAT_WORDS_CHARS)
            ),
            text: format!("[{role}]\n{content}"),
        }
    }

    /// A turn of calls with the results answering them; `raw` the bytes of both, `said` the
    /// role and text the calls came with.
    pub fn calls(raw: String, said: (&str, &str), calls: &[CallRead<'_>]) -> Part {
        let (role, content) = said;
        let mut text = if content.is_empty() {
            String::new()
        } else {
            format!("[{role}]\n{content}\n")
        };
        let mut what = Vec::new();
        let mut result_bytes = 0;
        let mut first_words = None;
        for call in calls {
            let (name, arguments) = (call.name, call.arguments);
            text.push_str(&format!("[call {name}({arguments})]\n"));
            what.push(format!(
                "{name}({})",
                cut_chars(arguments, WHAT_ARGUMENT_CHARS)
            ));
            if let Some(output) = &call.output {
                result_bytes += output.len();
                first_words.get_or_insert_with(|| cut_chars(output, WHAT_WORDS_CHARS));
                text.push_str(&format!("[result of {name}]\n{output}\n"));
            }
        }
        Part {
            raw,
            what: format!(
                "{} → {result_bytes} bytes: \"{}\"",
                what.join(", "),
                first_words.unwrap_or_default()
            ),
            text: text.trim_end().to_string(),
        }
    }
}

/// A ref and what it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unit {
    id: String,
    what: String,
    text: String,
}

/// The refs of one compacted request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refs {
    units: Vec<Unit>,
}

/// What a lookup answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub text: String,
    /// Bytes of the original it carries (0 for a ref not issued).
    pub bytes: usize,
}

impl Refs {
    /// The refs of `parts` (oldest first), at most `max_lines` of them: neighbours are grouped
    /// into runs of equal length when there are more.
    pub fn new(parts: Vec<Part>, max_lines: usize) -> Refs {
        let max_lines = max_lines.max(1);
        let per_line = parts.len().div_ceil(max_lines).max(1);
        let units = parts
            .chunks(per_line)
            .map(|run| {
                let mut hasher = Sha256::new();
                for part in run {
                    hasher.update(part.raw.as_bytes());
                    hasher.update([0]);
                }
                let digest = hasher.finalize();
                let id: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
                let what = run
                    .iter()
                    .map(|part| part.what.as_str())
                    .collect::<Vec<_>>()
                    .join("; ");
                let text = run
                    .iter()
                    .map(|part| part.text.as_str())
                    .collect::<Vec<_>>()
                    .join("\n\n");
                Unit {
                    id,
                    what: cut_chars(&what, MAX_WHAT_CHARS),
                    text,
                }
            })
            .collect();
        Refs { units }
    }

    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    pub fn len(&self) -> usize {
        self.units.len()
    }

    /// The index the summary ends with, in one fixed form.
    pub fn index(&self, tool: &str) -> String {
        let mut out = format!(
            "\n\nOriginals of the summarized messages, by ref (call the `{tool}` tool with one to read it verbatim):"
        );
        for unit in &self.units {
            out.push_str("\n- ref:");
            out.push_str(&unit.id);
            out.push(' ');
            out.push_str(&unit.what);
        }
        out
    }

    /// The answer to a lookup of `reference` (with or without its `ref:`), cut at `max_bytes`
    /// on a character boundary, with a note saying so.
    pub fn answer(&self, reference: &str, max_bytes: usize) -> Answer {
        let id = reference.trim();
        let id = id.strip_prefix("ref:").unwrap_or(id);
        let by_id = self.units.iter().find(|unit| unit.id == id);
        // A model that passes what it looks for (a path, an id) instead of a ref gets the
        // latest original of this request that holds it.
        let by_content = || {
            (id.chars().count() >= MIN_SEARCH_CHARS)
                .then(|| self.units.iter().rev().find(|unit| unit.text.contains(id)))
                .flatten()
        };
        let Some(unit) = by_id.or_else(by_content) else {
            return Answer {
                text: format!(
                    "Unknown ref {reference:?}: it is not one of the refs this conversation's summary lists."
                ),
                bytes: 0,
            };
        };
        let heading = if unit.id == id {
            String::new()
        } else {
            format!(
                "[no ref {id:?}: the original that mentions it, ref:{}]\n",
                unit.id
            )
        };
        let full = unit.text.len();
        if full <= max_bytes {
            return Answer {
                text: format!("{heading}{}", unit.text),
                bytes: full,
            };
        }
        let mut end = max_bytes;
        while !unit.text.is_char_boundary(end) {
            end -= 1;
        }
        Answer {
            text: format!(
                "{heading}{}\n[cut at {end} of {full} bytes]",
                &unit.text[..end]
            ),
            bytes: end,
        }
    }
}

/// `text` on one line, cut to `max` characters.
pub fn cut_chars(text: &str, max: usize) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match line.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line,
    }
}

/// `body` with `index` after the summary text `framed` it carries (as a JSON string's
/// content); None when the summary is not found once.
pub fn with_index(body: &[u8], framed: &str, index: &str) -> Option<Vec<u8>> {
    let escaped = serde_json::to_string(framed).ok()?;
    let escaped = escaped.get(1..escaped.len() - 1)?;
    let at = memchr::memmem::find(body, escaped.as_bytes())?;
    let end = at + escaped.len();
    if memchr::memmem::find(&body[end..], escaped.as_bytes()).is_some() {
        return None;
    }
    let index = serde_json::to_string(index).ok()?;
    let index = index.get(1..index.len() - 1)?;
    let mut out = Vec::with_capacity(body.len() + index.len());
    out.extend_from_slice(&body[..end]);
    out.extend_from_slice(index.as_bytes());
    out.extend_from_slice(&body[end..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(raw: &str) -> Part {
        Part {
            raw: raw.into(),
            what: format!("what {raw}"),
            text: format!("text of {raw}"),
        }
    }

    #[test]
    fn ids_follow_the_content_not_the_position() {
        let one = Refs::new(vec![part("a"), part("b")], 8);
        let other = Refs::new(vec![part("z"), part("a"), part("b")], 8);
        assert_eq!(one.units[0].id, other.units[1].id);
        assert_eq!(one.units[1].id, other.units[2].id);
        assert_ne!(one.units[0].id, one.units[1].id);
        assert_eq!(
            one.index("t"),
            Refs::new(vec![part("a"), part("b")], 8).index("t")
        );
    }

    #[test]
    fn many_units_are_grouped_within_the_bound() {
        let parts: Vec<Part> = (0..70).map(|i| part(&i.to_string())).collect();
        let refs = Refs::new(parts, MAX_INDEX_LINES);
        assert!(refs.len() <= MAX_INDEX_LINES, "{}", refs.len());
        let first = &refs.units[0];
        assert!(first.text.contains("text of 0") && first.text.contains("text of 2"));
        assert_eq!(
            refs.index("t")
                .lines()
                .filter(|l| l.starts_with("- ref:"))
                .count(),
            refs.len()
        );
    }

    #[test]
    fn a_lookup_answers_only_what_was_issued_and_is_cut_with_a_note() {
        let refs = Refs::new(vec![part("é".repeat(100).as_str())], 8);
        let id = refs.units[0].id.clone();
        let whole = refs.answer(&format!("ref:{id}"), 1 << 20);
        assert_eq!(whole.text, refs.units[0].text);
        let cut = refs.answer(&id, 9);
        assert!(cut.text.ends_with("bytes]"), "{}", cut.text);
        assert!(cut.bytes <= 9);
        let unknown = refs.answer("ref:0000000000", 1 << 20);
        assert_eq!(unknown.bytes, 0);
        assert!(unknown.text.starts_with("Unknown ref"));
    }

    #[test]
    fn a_lookup_by_what_it_wants_gets_the_latest_original_holding_it() {
        let refs = Refs::new(
            vec![
                part("config/a.yaml"),
                part("x"),
                part("config/a.yaml again"),
            ],
            8,
        );
        let found = refs.answer("config/a.yaml", 1 << 20);
        assert!(
            found.text.ends_with("text of config/a.yaml again"),
            "{}",
            found.text
        );
        assert!(found.text.contains(&format!("ref:{}", refs.units[2].id)));
        // Too short to search by, or held by none: unknown.
        assert_eq!(refs.answer("x", 1 << 20).bytes, 0);
        assert_eq!(refs.answer("not/in/any", 1 << 20).bytes, 0);
    }

    #[test]
    fn the_index_goes_right_after_the_summary_once() {
        let framed = "Here is a summary:\n\nThe agent \"fixed\" it.";
        let body =
            serde_json::json!({"messages": [{"role": "user", "content": framed}]}).to_string();
        let out = with_index(body.as_bytes(), framed, "\n\n- ref:1 x").unwrap();
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            value["messages"][0]["content"],
            format!("{framed}\n\n- ref:1 x")
        );
        let twice = format!("[{body},{body}]");
        assert!(with_index(twice.as_bytes(), framed, "x").is_none());
    }
}
