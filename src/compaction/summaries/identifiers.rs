//! The identifier index compactor appends to every summary it makes: the exact strings a model
//! needs back verbatim and a summarizer tends to drop or paraphrase (an error code, a path, a
//! decision's id, a URL, a command), found by compactor itself in the summarized messages, not
//! by the summarizer. Measured with a real 1.5B model, a summary kept the path of four planted
//! facts and dropped the error code and both ids; the index keeps them whatever the summary says.
//!
//! Bounded (`summarization.identifier_index` entries, each at most [`MAX_ENTRY_CHARS`]), ranked
//! most recent and most repeated first (taken in turn from each order), and written in one
//! fixed form after the summary, so a reused summary's bytes never change. An incremental
//! summary's index is this span's identifiers, then the previous index's, within the bound.
//!
//! Pure: text in, text out.

use std::collections::HashMap;

use serde_json::Value;

/// The line the index starts with; what follows it, one `- ` entry a line, is the index.
pub const MARKER: &str = "Identifiers from the summarized messages, verbatim:";
/// The longest entry kept (a longer error line is cut at a character boundary).
pub const MAX_ENTRY_CHARS: usize = 160;

/// Keys whose strings are not the conversation's words: ids of compactor's or the API's
/// bookkeeping, signatures and opaque payloads.
const SKIPPED_KEYS: [&str; 16] = [
    "id",
    "tool_use_id",
    "tool_call_id",
    "call_id",
    "signature",
    "encrypted_content",
    "data",
    "image_url",
    "type",
    "role",
    "cache_control",
    "media_type",
    "thoughtSignature",
    "thought_signature",
    "mimeType",
    "mime_type",
];

/// Words whose line is worth keeping whole: an error as it was printed.
const ERROR_WORDS: [&str; 7] = [
    "error",
    "exception",
    "failed",
    "fatal",
    "panicked",
    "traceback",
    "denied",
];

/// File extensions that make a word without a slash a path.
const EXTENSIONS: [&str; 30] = [
    "rs", "py", "js", "ts", "tsx", "jsx", "go", "java", "kt", "rb", "c", "h", "cc", "cpp", "hpp",
    "cs", "json", "yaml", "yml", "toml", "md", "txt", "sh", "sql", "log", "csv", "html", "css",
    "lock", "ini",
];

/// One candidate: how often it was seen and where last (a running position over the span).
struct Seen {
    count: u32,
    last: u64,
}

/// Identifiers found in the JSON of `messages` (raw message objects, oldest first), ranked:
/// most recent and most repeated first, at most `max`.
pub fn extract<'a>(messages: impl IntoIterator<Item = &'a str>, max: usize) -> Vec<String> {
    let mut seen: HashMap<String, Seen> = HashMap::new();
    let mut position = 0u64;
    for raw in messages {
        let Ok(value) = serde_json::from_str::<Value>(raw) else {
            continue;
        };
        strings(&value, &mut |text| {
            for candidate in candidates(text) {
                position += 1;
                let entry = seen.entry(candidate).or_insert(Seen { count: 0, last: 0 });
                entry.count += 1;
                entry.last = position;
            }
        });
    }
    let mut by_recency: Vec<(&String, &Seen)> = seen.iter().collect();
    by_recency.sort_by(|a, b| b.1.last.cmp(&a.1.last).then_with(|| a.0.cmp(b.0)));
    let mut by_count = by_recency.clone();
    by_count.sort_by(|a, b| {
        (b.1.count, b.1.last)
            .cmp(&(a.1.count, a.1.last))
            .then_with(|| a.0.cmp(b.0))
    });
    let mut ranked: Vec<String> = Vec::new();
    let (mut recent, mut repeated) = (by_recency.iter(), by_count.iter());
    while ranked.len() < max {
        let next = [recent.next(), repeated.next()];
        if next.iter().all(Option::is_none) {
            break;
        }
        for (text, _) in next.into_iter().flatten() {
            if ranked.len() < max && !ranked.contains(text) {
                ranked.push((*text).clone());
            }
        }
    }
    ranked
}

/// Calls `each` with every string in `value` but those under [`SKIPPED_KEYS`]; a string that
/// is itself JSON (a tool call's `arguments`) is read as such.
fn strings(value: &Value, each: &mut impl FnMut(&str)) {
    match value {
        Value::String(text) => {
            let nested = text.trim_start().starts_with(['{', '['])
                && serde_json::from_str::<Value>(text).is_ok_and(|inner| {
                    strings(&inner, each);
                    true
                });
            if !nested {
                each(text);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| strings(item, each)),
        Value::Object(fields) => {
            for (key, field) in fields {
                if !SKIPPED_KEYS.contains(&key.as_str()) {
                    strings(field, each);
                }
            }
        }
        _ => {}
    }
}

/// The identifiers in one text, in the order they appear.
fn candidates(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with("data:") {
            continue;
        }
        if let Some(command) = line.strip_prefix("$ ") {
            found.push(bounded(command.trim()));
        } else if mentions_error(line) {
            found.push(bounded(line));
        }
        let mut spans = line.split('`');
        spans.next();
        while let (Some(code), Some(_)) = (spans.next(), spans.next()) {
            let code = code.trim();
            if (2..=MAX_ENTRY_CHARS).contains(&code.len()) && !code.contains(' ') {
                found.push(code.to_string());
            }
        }
        for word in line.split_whitespace() {
            let word = word
                .trim_matches(|c: char| "\"'`()[]{}<>,;!?*".contains(c))
                .trim_end_matches(['.', ':']);
            if is_identifier(word) {
                found.push(word.to_string());
            }
        }
    }
    found
}

fn mentions_error(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    ERROR_WORDS.iter().any(|word| lower.contains(word))
}

/// `text` cut to [`MAX_ENTRY_CHARS`] at a character boundary.
fn bounded(text: &str) -> String {
    match text.char_indices().nth(MAX_ENTRY_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// A URL, a path, an id or code (letters and digits together, or capitals joined by a
/// hyphen), a constant's name, or a number of four digits or more.
fn is_identifier(word: &str) -> bool {
    if word.len() < 3 || word.len() > MAX_ENTRY_CHARS {
        return false;
    }
    if word.starts_with("http://") || word.starts_with("https://") {
        return true;
    }
    let path_chars = |c: char| c.is_ascii_alphanumeric() || "_./-~@+".contains(c);
    if word.chars().all(path_chars) {
        let has_letter = word.chars().any(|c| c.is_ascii_alphabetic());
        if word.contains('/') && has_letter && word.len() > 3 {
            return true;
        }
        if let Some((stem, extension)) = word.rsplit_once('.') {
            let stem_ok = !stem.is_empty() && stem.chars().any(|c| c.is_ascii_alphanumeric());
            if stem_ok && EXTENSIONS.contains(&extension) {
                return true;
            }
        }
    }
    let id_chars = |c: char| c.is_ascii_alphanumeric() || "_-.#:".contains(c);
    if !word.chars().all(id_chars) {
        return false;
    }
    let letters = word.chars().filter(|c| c.is_ascii_alphabetic()).count();
    let digits = word.chars().filter(|c| c.is_ascii_digit()).count();
    if letters > 0 && digits > 0 && word.len() >= 4 {
        return true;
    }
    // A ticket's or decision's id need not hold a digit (`D-LRPHR`, `OPS-QUEUE`): capitals
    // joined by a hyphen are one, where a capitalised word alone is not.
    let hyphenated_id = word.len() >= 4
        && word.contains('-')
        && !word.starts_with('-')
        && !word.ends_with('-')
        && word
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '-');
    if hyphenated_id {
        return true;
    }
    let constant = word.len() >= 5
        && word.contains('_')
        && word
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    constant || (letters == 0 && digits >= 4 && word.chars().all(|c| c.is_ascii_digit()))
}

/// A summary and the entries of the index it ends with (none without one).
pub fn split(summary: &str) -> (&str, Vec<&str>) {
    match summary.rfind(MARKER) {
        Some(at) => {
            let entries = summary[at + MARKER.len()..]
                .lines()
                .filter_map(|line| line.strip_prefix("- "))
                .collect();
            (summary[..at].trim_end(), entries)
        }
        None => (summary, Vec::new()),
    }
}

/// This span's identifiers, then the previous index's that are not among them, at most `max`.
pub fn merged(fresh: Vec<String>, previous: &[&str], max: usize) -> Vec<String> {
    let mut entries = fresh;
    for entry in previous {
        if entries.len() >= max {
            break;
        }
        if !entries.iter().any(|e| e == entry) {
            entries.push((*entry).to_string());
        }
    }
    entries.truncate(max);
    entries
}

/// `summary` with the index of `entries` after it, in the one fixed form; the summary alone
/// when there are none.
pub fn with_index(summary: &str, entries: &[String]) -> String {
    if entries.is_empty() {
        return summary.to_string();
    }
    let mut out = String::with_capacity(summary.len() + 64 + entries.len() * 24);
    out.push_str(summary.trim_end());
    out.push_str("\n\n");
    out.push_str(MARKER);
    for entry in entries {
        out.push_str("\n- ");
        out.push_str(entry);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(text: &str) -> String {
        json!({"role": "tool", "tool_call_id": "call_9z9", "content": text}).to_string()
    }

    #[test]
    fn paths_codes_ids_urls_errors_and_commands_are_found() {
        let messages = [
            message("Opened src/payments/ledger.rs and config.yaml; see https://example.test/issues/88."),
            message("$ cargo test -p ledger\nerror[E0502]: cannot borrow `ledger` as mutable\nDecision DEC-2041: keep the old schema."),
            json!({"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"docs/plan.md\"}"}}]}).to_string(),
            message("Next: run step NS-77 with ERR_CONN_RESET handling, port 8080, commit 3f9c2e1."),
            message("Decision D-LRPHR replaces the polling. NOTE: Retry-After stays."),
        ];
        let found = extract(messages.iter().map(String::as_str), 64);
        for expected in [
            "src/payments/ledger.rs",
            "config.yaml",
            "https://example.test/issues/88",
            "cargo test -p ledger",
            "error[E0502]: cannot borrow `ledger` as mutable",
            "DEC-2041",
            "NS-77",
            "ERR_CONN_RESET",
            "8080",
            "3f9c2e1",
            "docs/plan.md",
            "D-LRPHR",
        ] {
            assert!(
                found.iter().any(|f| f == expected),
                "{expected} in {found:?}"
            );
        }
        // The API's own ids and plain words are not identifiers.
        assert!(!found
            .iter()
            .any(|f| ["call_9z9", "Opened", "tool", "NOTE", "Retry-After"].contains(&f.as_str())));
    }

    #[test]
    fn the_most_recent_and_the_most_repeated_come_first_within_the_bound() {
        let repeated = message("src/hot.rs src/hot.rs src/hot.rs");
        let mut messages = vec![repeated];
        for i in 0..10 {
            messages.push(message(&format!("file_{i}.rs")));
        }
        let found = extract(messages.iter().map(String::as_str), 3);
        assert_eq!(found, ["file_9.rs", "src/hot.rs", "file_8.rs"]);
    }

    #[test]
    fn the_index_is_one_fixed_form_and_reads_back() {
        let entries = vec!["E0502".to_string(), "src/a.rs".to_string()];
        let text = with_index("The agent fixed the ledger.", &entries);
        assert_eq!(
            text,
            format!("The agent fixed the ledger.\n\n{MARKER}\n- E0502\n- src/a.rs")
        );
        assert_eq!(with_index("The agent fixed the ledger.", &entries), text);
        let (summary, read) = split(&text);
        assert_eq!(summary, "The agent fixed the ledger.");
        assert_eq!(read, ["E0502", "src/a.rs"]);
        assert_eq!(split("No index."), ("No index.", vec![]));
        let merged = merged(vec!["NEW-1".into(), "E0502".into()], &read, 3);
        assert_eq!(merged, ["NEW-1", "E0502", "src/a.rs"]);
    }

    #[test]
    fn long_error_lines_are_cut_at_a_character_boundary() {
        let line = format!("error: {}", "é".repeat(400));
        let found = extract([message(&line)].iter().map(String::as_str), 4);
        let kept = found.iter().find(|f| f.starts_with("error:")).unwrap();
        assert_eq!(kept.chars().count(), MAX_ENTRY_CHARS + 1);
    }
}
