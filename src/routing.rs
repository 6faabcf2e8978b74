//! Routing: which requests compactor forwards (the listen prefix) and to which upstream: the
//! first that speaks the request's API (Anthropic's for `/messages…`, OpenAI's otherwise) and
//! serves its `model` (each upstream's globs), else the first that serves the model whatever it
//! speaks; a request without a model goes to the first of its API, else the first upstream.

use std::borrow::Cow;

use serde::Deserialize;

use crate::config::{Config, UpstreamApi};
use crate::provider::Provider;
use crate::upstream::{Upstream, UpstreamSetupError};

/// All configured upstreams in order.
pub struct Upstreams {
    list: Vec<Upstream>,
}

impl Upstreams {
    /// The configured upstreams, each speaking the wire `provider` gives its family.
    pub fn from_config(
        config: &Config,
        provider: fn(UpstreamApi) -> &'static dyn Provider,
    ) -> Result<Upstreams, UpstreamSetupError> {
        let list = config
            .upstreams
            .iter()
            .map(|u| Upstream::new(u, &config.tls, provider(u.api)))
            .collect::<Result<Vec<_>, _>>()?;
        if list.is_empty() {
            return Err(UpstreamSetupError("no upstream configured".into()));
        }
        Ok(Upstreams { list })
    }

    /// Whether routing needs the body's `model` (false when the first upstream takes every model).
    pub fn routing_needs_model(&self, api: UpstreamApi) -> bool {
        !self.first_of(api).matches_every_model
    }

    /// The first upstream speaking `api`, else the first one.
    fn first_of(&self, api: UpstreamApi) -> &Upstream {
        self.list
            .iter()
            .find(|u| u.api == api)
            .unwrap_or(&self.list[0])
    }

    /// The first upstream speaking `api` that serves `model`, else the first serving `model`;
    /// without a model, [`Self::first_of`] `api`.
    pub fn route(&self, model: Option<&str>, api: UpstreamApi) -> Option<&Upstream> {
        match model {
            Some(model) => self
                .list
                .iter()
                .find(|u| u.api == api && u.serves(model))
                .or_else(|| self.list.iter().find(|u| u.serves(model))),
            None => Some(self.first_of(api)),
        }
    }

    pub fn by_name(&self, name: &str) -> Option<&Upstream> {
        self.list.iter().find(|u| u.name == name)
    }
}

/// The part of `path` after the listen prefix, or None when the path is not under it.
pub fn forwarded_path<'a>(prefix: &str, path: &'a str) -> Option<&'a str> {
    if prefix == "/" {
        return Some(path);
    }
    let rest = path.strip_prefix(prefix)?;
    (rest.is_empty() || rest.starts_with('/')).then_some(rest)
}

/// The body's `model`, skimmed without building the rest of the document.
pub fn model_of(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct ModelOnly<'a> {
        #[serde(borrow, default)]
        model: Option<Cow<'a, str>>,
    }
    serde_json::from_slice::<ModelOnly>(body)
        .ok()
        .and_then(|m| m.model.map(Cow::into_owned))
}

/// What a body says its model is, read the way the strictest upstream reads it: one JSON
/// object, nothing before or after it, member names unescaped, `model` at most once and a
/// string. Anything a parser could read two ways is [`BodyModel::Unclear`].
#[derive(Debug, PartialEq, Eq)]
pub enum BodyModel {
    /// An empty body, or an object without `model`.
    Absent,
    Named(String),
    /// Not one JSON object, `model` more than once, or not a string.
    Unclear,
}

pub fn body_model(body: &[u8]) -> BodyModel {
    struct Members;
    impl<'de> serde::de::Visitor<'de> for Members {
        type Value = BodyModel;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<BodyModel, A::Error> {
            let mut found = BodyModel::Absent;
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                if key != "model" {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    continue;
                }
                let value: serde_json::Value = map.next_value()?;
                found = match (found, value) {
                    (BodyModel::Absent, serde_json::Value::String(model)) => {
                        BodyModel::Named(model)
                    }
                    _ => BodyModel::Unclear,
                };
            }
            Ok(found)
        }
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return BodyModel::Absent;
    }
    let mut reader = serde_json::Deserializer::from_slice(body);
    match serde::Deserializer::deserialize_map(&mut reader, Members) {
        Ok(model) if reader.end().is_ok() => model,
        _ => BodyModel::Unclear,
    }
}

/// A cheap guess at the body's `model` for metrics labels: the first `"model"` member with a
/// plain string value, found without parsing (a key cannot occur inside a string, where its
/// quotes are escaped; an escaped value is not guessed at).
pub fn model_hint(body: &[u8]) -> Option<&str> {
    memchr::memmem::find_iter(body, br#""model""#).find_map(|at| {
        let rest = body[at + 7..].trim_ascii_start().strip_prefix(b":")?;
        let value = rest.trim_ascii_start().strip_prefix(b"\"")?;
        let end = memchr::memchr2(b'"', b'\\', value)?;
        (value[end] == b'"')
            .then(|| std::str::from_utf8(&value[..end]).ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_read_two_ways_by_two_parsers_is_unclear() {
        let named = |m: &str| BodyModel::Named(m.to_string());
        assert_eq!(
            body_model(br#"{"model":"cheap-1","n":1}"#),
            named("cheap-1")
        );
        assert_eq!(
            body_model(br#" {"mod\u0065l":"expensive"} "#),
            named("expensive")
        );
        assert_eq!(body_model(b""), BodyModel::Absent);
        assert_eq!(body_model(br#"{"messages":[]}"#), BodyModel::Absent);
        for unclear in [
            &br#"{"model":"cheap-1","model":"expensive"}"#[..],
            br#"{"model":"cheap-1","mod\u0065l":"expensive"}"#,
            b"\xef\xbb\xbf{\"model\":\"cheap-1\"}",
            br#"{"model":"cheap-1"} {"model":"expensive"}"#,
            br#"{"model":"cheap-1"}garbage"#,
            br#"{"model":["expensive"]}"#,
            br#"{"model":null}"#,
            br#"[{"model":"cheap-1"}]"#,
            b"model=expensive",
            br#"{"model":"cheap-1""#,
        ] {
            assert_eq!(
                body_model(unclear),
                BodyModel::Unclear,
                "{}",
                String::from_utf8_lossy(unclear)
            );
        }
    }

    #[test]
    fn prefix_matching_respects_segment_boundaries() {
        assert_eq!(
            forwarded_path("/v1", "/v1/chat/completions"),
            Some("/chat/completions")
        );
        assert_eq!(forwarded_path("/v1", "/v1"), Some(""));
        assert_eq!(forwarded_path("/v1", "/v10/models"), None);
        assert_eq!(forwarded_path("/v1", "/other"), None);
        assert_eq!(forwarded_path("/", "/anything"), Some("/anything"));
    }

    #[test]
    fn model_is_skimmed_including_escaped_strings() {
        assert_eq!(
            model_of(br#"{"messages":[],"model":"gpt-4o"}"#).as_deref(),
            Some("gpt-4o")
        );
        assert_eq!(model_of(br#"{"model":"a\"b"}"#).as_deref(), Some("a\"b"));
        assert_eq!(model_of(b"not json"), None);
        assert_eq!(model_of(br#"{"model":3}"#), None);
    }

    #[test]
    fn the_model_hint_takes_the_first_plain_string_member() {
        assert_eq!(
            model_hint(br#"{"messages":[{"content":"say \"model\": \"x\""}],"model":"gpt-4o"}"#),
            Some("gpt-4o")
        );
        assert_eq!(
            model_hint(br#"{"tools":[{"properties":{"model":{"type":"string"}}}],"model" : "m"}"#),
            Some("m")
        );
        assert_eq!(model_hint(br#"{"model":"a\"b"}"#), None);
        assert_eq!(model_hint(b"{}"), None);
    }
}
