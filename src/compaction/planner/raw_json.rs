//! Reading JSON without copying it: an object's members as raw slices, and where a value lies
//! in the text it came from.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

/// An object a front-end reads in the body's one serde pass: the members planning reads, each
/// a raw slice of the body, and where the object's braces are.
pub(crate) trait RawObject<'a>: Default {
    /// What serde says it expected when the value is not an object.
    const EXPECTING: &'static str;
    /// Where a member's raw value goes, when planning reads it.
    fn slot(&mut self, key: &str) -> Option<&mut Option<&'a str>>;
    /// The object read; `ends` are its first and last members' values (None: no members),
    /// which locate its braces ([`object_span`]).
    fn finish<E: serde::de::Error>(self, ends: Option<(&'a str, &'a str)>) -> Result<Self, E>;
}

/// Deserializes a [`RawObject`]: every front-end's `Deserialize` for its fields.
pub(crate) fn deserialize_raw_object<'de, T, D>(deserializer: D) -> Result<T, D::Error>
where
    T: RawObject<'de>,
    D: serde::Deserializer<'de>,
{
    struct ObjectVisitor<T>(std::marker::PhantomData<T>);
    impl<'de, T: RawObject<'de>> serde::de::Visitor<'de> for ObjectVisitor<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str(T::EXPECTING)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
            let mut fields = T::default();
            let ends = raw_members(&mut map, |key, value| {
                if let Some(slot) = fields.slot(key) {
                    *slot = Some(value);
                }
            })?;
            fields.finish(ends)
        }
    }
    deserializer.deserialize_map(ObjectVisitor(std::marker::PhantomData))
}

/// The member a message object holds its content in (`content`, Google's `parts`).
pub(crate) trait ContentMember {
    const NAME: &'static str;
}

/// A message object's `role` and content member (named by `M`), as raw slices of the body;
/// `first` and `last` locate the object's braces ([`object_span`]).
pub(crate) struct RoleAndContent<'a, M> {
    pub role: Option<&'a str>,
    pub content: Option<&'a str>,
    pub first: &'a str,
    pub last: &'a str,
    member: std::marker::PhantomData<M>,
}

impl<M> Default for RoleAndContent<'_, M> {
    fn default() -> Self {
        RoleAndContent {
            role: None,
            content: None,
            first: "",
            last: "",
            member: std::marker::PhantomData,
        }
    }
}

impl<'de: 'a, 'a, M: ContentMember> Deserialize<'de> for RoleAndContent<'a, M> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_raw_object(deserializer)
    }
}

impl<'a, M: ContentMember> RawObject<'a> for RoleAndContent<'a, M> {
    const EXPECTING: &'static str = "a message object";

    fn slot(&mut self, key: &str) -> Option<&mut Option<&'a str>> {
        match key {
            "role" => Some(&mut self.role),
            key if key == M::NAME => Some(&mut self.content),
            _ => None,
        }
    }

    fn finish<E: serde::de::Error>(mut self, ends: Option<(&'a str, &'a str)>) -> Result<Self, E> {
        let (first, last) = ends.ok_or_else(|| E::custom("a message has no members"))?;
        (self.first, self.last) = (first, last);
        Ok(self)
    }
}

/// Reads one JSON object's members with every value taken raw (a slice of the body, unknown
/// members too), handing each key and value to `member`; returns the first and the last value,
/// which locate the object's braces ([`object_span`]). None for an empty object.
pub(crate) fn raw_members<'de, A: serde::de::MapAccess<'de>>(
    map: &mut A,
    mut member: impl FnMut(&str, &'de str),
) -> Result<Option<(&'de str, &'de str)>, A::Error> {
    let mut ends: Option<(&'de str, &'de str)> = None;
    while let Some(MemberKey(key)) = map.next_key::<MemberKey<'de>>()? {
        let value: &'de RawValue = map.next_value()?;
        let value = value.get();
        ends = Some(match ends {
            None => (value, value),
            Some((first, _)) => (first, value),
        });
        member(&key, value);
    }
    Ok(ends)
}

/// A member name borrowed from the body unless it has escapes (serde's own `Cow<str>` always
/// copies, which cost a third of the parse).
pub(crate) struct MemberKey<'de>(pub(crate) Cow<'de, str>);

impl<'de> Deserialize<'de> for MemberKey<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> serde::de::Visitor<'de> for KeyVisitor {
            type Value = MemberKey<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                key: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(MemberKey(Cow::Borrowed(key)))
            }
            fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
                Ok(MemberKey(Cow::Owned(key.to_string())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// Byte offset of `inner` (a subslice of `outer`) within `outer`.
pub(crate) fn offset_in(outer: &str, inner: &str) -> usize {
    (inner.as_ptr() as usize).saturating_sub(outer.as_ptr() as usize)
}

pub(crate) fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while matches!(bytes.get(i), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        i += 1;
    }
    i
}

/// The index after the last non-whitespace byte before `end`.
pub(crate) fn skip_ws_back(bytes: &[u8], mut end: usize) -> usize {
    while end > 0 && matches!(bytes[end - 1], b' ' | b'\n' | b'\r' | b'\t') {
        end -= 1;
    }
    end
}

/// The byte range of the object whose first member's value starts at `first` and whose last
/// member's value ends at `last_end`, in text serde has already validated: back over
/// `"key" :` to the `{`, forward over whitespace to the `}`.
pub(crate) fn object_span(
    text: &str,
    first: usize,
    last_end: usize,
) -> Option<std::ops::Range<usize>> {
    let bytes = text.as_bytes();
    let mut i = skip_ws_back(bytes, first);
    if i == 0 || bytes[i - 1] != b':' {
        return None;
    }
    i = skip_ws_back(bytes, i - 1);
    if i == 0 || bytes[i - 1] != b'"' {
        return None;
    }
    // The key's opening quote: the nearest quote before its closing one that is not escaped
    // (inside a valid string every quote is preceded by an odd run of backslashes).
    let mut j = i - 1;
    loop {
        let quote = memchr::memrchr(b'"', &bytes[..j])?;
        let backslashes = bytes[..quote]
            .iter()
            .rev()
            .take_while(|&&b| b == b'\\')
            .count();
        if backslashes % 2 == 0 {
            j = quote;
            break;
        }
        j = quote;
    }
    let open = skip_ws_back(bytes, j);
    let close = skip_ws(bytes, last_end);
    (open > 0 && bytes[open - 1] == b'{' && bytes.get(close) == Some(&b'}'))
        .then(|| open - 1..close + 1)
}
