//! What a summarizer's answer must be before it goes upstream as a summary. A weak model echoes
//! its prompt and compactor's own framing (`<msg-… role=…>` blocks, the transcript's fences): the
//! framing is stripped, and an answer that is then empty or only repeats the prompt's
//! instructions is refused, like one that is not smaller than what it replaces.

use std::collections::HashSet;

/// Why an answer cannot be used as a summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unusable {
    /// Nothing left once compactor's framing is taken out.
    Empty,
    /// It repeats the prompt's instructions rather than summarizing.
    EchoesPrompt,
}

/// Words in a shingle: long enough that a summary shares few with the instructions by chance.
const SHINGLE: usize = 5;
/// The share of an answer's shingles found in the instructions that makes it an echo.
const ECHO_SHARE: f64 = 0.5;

/// The answer with compactor's framing stripped, or why it is no summary. `instructions` is the
/// prompt without the transcript and the previous summary.
pub fn vet(answer: &str, instructions: &str) -> Result<String, Unusable> {
    let stripped = strip_framing(answer);
    let text = stripped.trim();
    if text.is_empty() {
        return Err(Unusable::Empty);
    }
    if echoes(text, instructions) {
        return Err(Unusable::EchoesPrompt);
    }
    Ok(text.to_string())
}

/// The answer without the frame tags of the transcript (`<msg-HEX …>`, `</msg-HEX>`) and the
/// fence lines of the prompt (`<<<TRANSCRIPT HEX`, `END TRANSCRIPT HEX>>>`, and the same for the
/// previous summary), with the blank lines they leave collapsed.
pub fn strip_framing(answer: &str) -> String {
    let mut out = String::with_capacity(answer.len());
    let mut rest = answer;
    while let Some(start) = rest.find('<') {
        out.push_str(&rest[..start]);
        let candidate = &rest[start..];
        match frame_tag_len(candidate) {
            Some(len) => rest = &candidate[len..],
            None => {
                out.push('<');
                rest = &candidate[1..];
            }
        }
    }
    out.push_str(rest);
    let mut lines: Vec<&str> = Vec::new();
    for line in out.lines() {
        if is_fence(line.trim()) {
            continue;
        }
        if line.trim().is_empty() && lines.last().is_none_or(|last| last.trim().is_empty()) {
            continue;
        }
        lines.push(line);
    }
    lines.join("\n")
}

/// The length of a frame tag at the start of `text`: `<msg-` or `</msg-`, hex digits, then `>`
/// or attributes up to the `>` on the same line.
fn frame_tag_len(text: &str) -> Option<usize> {
    let after = text
        .strip_prefix("</msg-")
        .or_else(|| text.strip_prefix("<msg-"))?;
    let hex = after.bytes().take_while(u8::is_ascii_hexdigit).count();
    if hex < 4 {
        return None;
    }
    let tail = &after[hex..];
    let end = if tail.starts_with('>') {
        0
    } else if tail.starts_with(' ') {
        tail.find(['>', '\n'])
            .filter(|&i| tail.as_bytes()[i] == b'>')?
    } else {
        return None;
    };
    Some(text.len() - tail.len() + end + 1)
}

fn is_fence(line: &str) -> bool {
    let hex_word = |word: &str| word.len() >= 8 && word.bytes().all(|b| b.is_ascii_hexdigit());
    ["TRANSCRIPT", "PREVIOUS SUMMARY"].iter().any(|label| {
        line.strip_prefix("<<<")
            .and_then(|l| l.strip_prefix(label))
            .is_some_and(|tag| hex_word(tag.trim()))
            || line
                .strip_prefix("END ")
                .and_then(|l| l.strip_prefix(label))
                .and_then(|l| l.strip_suffix(">>>"))
                .is_some_and(|tag| hex_word(tag.trim()))
    })
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Whether most of `text` is the instructions' own wording.
fn echoes(text: &str, instructions: &str) -> bool {
    let said = words(text);
    let given = words(instructions);
    if said.len() < SHINGLE {
        let joined = said.join(" ");
        return !joined.is_empty() && given.join(" ").contains(&joined);
    }
    let known: HashSet<&[String]> = given.windows(SHINGLE).collect();
    let shingles = said.windows(SHINGLE);
    let total = shingles.len();
    let repeated = said
        .windows(SHINGLE)
        .filter(|shingle| known.contains(shingle))
        .count();
    repeated as f64 >= ECHO_SHARE * total as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const INSTRUCTIONS: &str = "You are summarizing a conversation so that it can continue without the older messages. Keep the user's goal, decisions made, file paths and what changed in them, exact error messages, and the next step.";

    #[test]
    fn frame_tags_and_fences_are_stripped() {
        let answer = "<msg-880bc2555a2e role=\"user\">\nThe user fixed parser.rs.\n</msg-880bc2555a2e>\n\n<<<TRANSCRIPT 0123abcd4567ef89\nEND TRANSCRIPT 0123abcd4567ef89>>>\nNext: run the tests.";
        assert_eq!(
            vet(answer, INSTRUCTIONS).unwrap(),
            "The user fixed parser.rs.\n\nNext: run the tests."
        );
    }

    #[test]
    fn text_that_only_looks_like_a_tag_is_kept() {
        for kept in [
            "a <b> c",
            "x < y and <msg-xyz> stays",
            "<msg-12> is too short a tag",
            "vec<msg-abcdef",
            "<msg-abcdef role=\"user\"\nno closing bracket on this line",
        ] {
            assert_eq!(strip_framing(kept), kept, "{kept}");
        }
    }

    #[test]
    fn an_answer_of_only_framing_is_empty() {
        assert_eq!(
            vet(
                "<msg-abcdef12 role=\"tool\">\n\n</msg-abcdef12>",
                INSTRUCTIONS
            ),
            Err(Unusable::Empty)
        );
    }

    #[test]
    fn an_answer_that_repeats_the_instructions_is_refused_and_a_summary_is_not() {
        let echo = "You are summarizing a conversation so that it can continue without the older messages. Keep the user's goal, decisions made, file paths";
        assert_eq!(vet(echo, INSTRUCTIONS), Err(Unusable::EchoesPrompt));
        assert_eq!(
            vet("Keep the user's goal", INSTRUCTIONS),
            Err(Unusable::EchoesPrompt)
        );
        let summary = "The user's goal is a faster parser. Decisions made: keep the API. Changed src/parser.rs (the tokenizer loop). Error seen: `index out of bounds` in lexer.rs:88. Next step: rerun the benchmark.";
        assert!(vet(summary, INSTRUCTIONS).is_ok());
    }
}
