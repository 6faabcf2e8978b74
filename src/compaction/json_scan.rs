//! A minimal scanner over JSON text: the members of an object as raw slices, without building
//! or copying anything. Conversation parsing runs serde_json once over the whole body (which
//! validates it) and then uses this on each message, a second pass that only has to find the
//! ends of values. It never panics on any input; malformed text gives an error.

/// Iterates `(key, raw value)` of a JSON object's members, in order. Keys are returned as their
/// raw string contents (between the quotes, escapes not decoded).
pub fn object_members(text: &str) -> Result<Vec<(&str, &str)>, String> {
    let bytes = text.as_bytes();
    let mut i = skip_ws(bytes, 0);
    if bytes.get(i) != Some(&b'{') {
        return Err("not an object".into());
    }
    i = skip_ws(bytes, i + 1);
    let mut members = Vec::with_capacity(4);
    if bytes.get(i) == Some(&b'}') {
        return Ok(members);
    }
    loop {
        if bytes.get(i) != Some(&b'"') {
            return Err(format!("expected a key at byte {i}"));
        }
        let key_end = string_end(bytes, i)?;
        let key = &text[i + 1..key_end - 1];
        i = skip_ws(bytes, key_end);
        if bytes.get(i) != Some(&b':') {
            return Err(format!("expected ':' at byte {i}"));
        }
        let value_start = skip_ws(bytes, i + 1);
        let value_end = value_end(bytes, value_start)?;
        members.push((key, &text[value_start..value_end]));
        i = skip_ws(bytes, value_end);
        match bytes.get(i) {
            Some(b',') => i = skip_ws(bytes, i + 1),
            Some(b'}') => return Ok(members),
            _ => return Err(format!("expected ',' or '}}' at byte {i}")),
        }
    }
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while matches!(bytes.get(i), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        i += 1;
    }
    i
}

/// End (exclusive) of the string literal whose opening quote is at `start`. Searches for quotes
/// only (escapes such as `\n` are dense in agent transcripts, quotes are not) and treats a quote
/// as closing when an even number of backslashes precedes it.
fn string_end(bytes: &[u8], start: usize) -> Result<usize, String> {
    let mut i = start + 1;
    loop {
        let rest = bytes.get(i..).unwrap_or_default();
        let Some(offset) = memchr::memchr(b'"', rest) else {
            return Err("unterminated string".into());
        };
        let quote = i + offset;
        let backslashes = bytes[start + 1..quote]
            .iter()
            .rev()
            .take_while(|&&b| b == b'\\')
            .count();
        if backslashes % 2 == 0 {
            return Ok(quote + 1);
        }
        i = quote + 1;
    }
}

/// End (exclusive) of the value starting at `start`.
fn value_end(bytes: &[u8], start: usize) -> Result<usize, String> {
    match bytes.get(start) {
        Some(b'"') => string_end(bytes, start),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut i = start;
            while let Some(&b) = bytes.get(i) {
                match b {
                    b'"' => {
                        i = string_end(bytes, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            Err("unterminated container".into())
        }
        Some(_) => {
            let mut i = start;
            while let Some(&b) = bytes.get(i) {
                if matches!(b, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t') {
                    break;
                }
                i += 1;
            }
            if i == start {
                Err(format!("expected a value at byte {start}"))
            } else {
                Ok(i)
            }
        }
        None => Err("expected a value, found the end".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_raw_slices_in_order() {
        let text = r#" { "role" : "user", "content":[{"type":"text","text":"a \"}\" b"}], "n": -1.5e3, "x":null ,"o":{"k":["]"]}} "#;
        let members = object_members(text).unwrap();
        assert_eq!(
            members,
            vec![
                ("role", r#""user""#),
                ("content", r#"[{"type":"text","text":"a \"}\" b"}]"#),
                ("n", "-1.5e3"),
                ("x", "null"),
                ("o", r#"{"k":["]"]}"#),
            ]
        );
        assert_eq!(object_members("{}").unwrap(), vec![]);
        assert_eq!(
            object_members(r#"{"k\"ey":1}"#).unwrap(),
            vec![(r#"k\"ey"#, "1")]
        );
    }

    #[test]
    fn malformed_text_is_an_error_not_a_panic() {
        for text in [
            "",
            "[]",
            "{",
            r#"{"a""#,
            r#"{"a":}"#,
            r#"{"a":"x}"#,
            r#"{"a":[1,2}"#,
            r#"{"a":1 "b":2}"#,
            "{\"a\":\"\\",
        ] {
            assert!(object_members(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn agrees_with_serde_json_on_valid_objects() {
        let text = r#"{"a":"\u00e9\\","b":[1,{"c":"]}"}],"d":true,"e":{"f":{}}}"#;
        let reference: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(text).unwrap();
        let members = object_members(text).unwrap();
        assert_eq!(members.len(), reference.len());
        for (key, raw) in members {
            let value: serde_json::Value = serde_json::from_str(raw).unwrap();
            assert_eq!(reference[key], value);
        }
    }
}
