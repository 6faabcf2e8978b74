//! One JSON string escape, decoded the same way for every reader of the body (the digest, the
//! token count, the summarizer's transcript), so a lone surrogate means the same to all three.

/// What an escape stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escaped {
    Char(char),
    /// A `\uD800`–`\uDFFF` escape without its other half: valid JSON, no Unicode character.
    /// Each reader keeps it apart from U+FFFD in its own way.
    LoneSurrogate(u32),
}

/// The escape starting at the backslash at `at` in `body` (a string literal's text without its
/// quotes), and how many bytes it used. A pair of surrogate escapes is one character.
#[inline]
pub fn decode_escape(body: &str, at: usize) -> (Escaped, usize) {
    let simple = |c: char| (Escaped::Char(c), 2);
    let Some(&next) = body.as_bytes().get(at + 1) else {
        return (Escaped::Char('\\'), 1);
    };
    match next {
        b'n' => simple('\n'),
        b't' => simple('\t'),
        b'r' => simple('\r'),
        b'b' => simple('\u{8}'),
        b'f' => simple('\u{c}'),
        b'u' => decode_unicode(body, at),
        // `\"`, `\\`, `\/`, and any other ASCII a lenient reader let through, as itself.
        ascii if ascii.is_ascii() => simple(ascii as char),
        // Not JSON; taken as the character it is (the backslash is ASCII, so `at + 1` starts one).
        _ => match body.get(at + 1..).and_then(|rest| rest.chars().next()) {
            Some(c) => (Escaped::Char(c), 1 + c.len_utf8()),
            None => (Escaped::Char('\\'), 1),
        },
    }
}

fn decode_unicode(body: &str, at: usize) -> (Escaped, usize) {
    let hex = |from: usize| {
        body.get(from..from + 4)
            .and_then(|h| u32::from_str_radix(h, 16).ok())
    };
    match hex(at + 2) {
        Some(high @ 0xD800..=0xDBFF) if body.get(at + 6..at + 8) == Some("\\u") => {
            match hex(at + 8) {
                Some(low @ 0xDC00..=0xDFFF) => {
                    match char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)) {
                        Some(c) => (Escaped::Char(c), 12),
                        None => (Escaped::LoneSurrogate(high), 6),
                    }
                }
                _ => (Escaped::LoneSurrogate(high), 6),
            }
        }
        Some(code) => match char::from_u32(code) {
            Some(c) => (Escaped::Char(c), 6),
            None => (Escaped::LoneSurrogate(code), 6),
        },
        None => (Escaped::Char('\u{fffd}'), 2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_pairs_and_lone_halves() {
        assert_eq!(decode_escape(r"\n", 0), (Escaped::Char('\n'), 2));
        assert_eq!(decode_escape(r#"a\"b"#, 1), (Escaped::Char('"'), 2));
        assert_eq!(decode_escape(r"\u4f60", 0), (Escaped::Char('你'), 6));
        assert_eq!(decode_escape(r"\ud83d\ude00", 0), (Escaped::Char('😀'), 12));
        assert_eq!(
            decode_escape(r"\ud83dx", 0),
            (Escaped::LoneSurrogate(0xD83D), 6)
        );
        assert_eq!(
            decode_escape(r"\ude00", 0),
            (Escaped::LoneSurrogate(0xDE00), 6)
        );
        assert_eq!(decode_escape(r"\é", 0), (Escaped::Char('é'), 3));
        assert_eq!(decode_escape("\\", 0), (Escaped::Char('\\'), 1));
    }
}
