//! Google's Gemini API (`generateContent`, `streamGenerateContent`, `countTokens`), for an
//! upstream with `api: gemini`. Its paths carry the model and the method
//! (`/v1beta/models/{model}:generateContent`, Vertex's
//! `/v1/projects/{p}/locations/{l}/publishers/google/models/{model}:…`) and lie outside the
//! OpenAI-style prefix, so the provider claims them whole. Forwarded, not yet compacted.

pub mod provider;
pub mod wire;

/// A Gemini model call named by its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCall<'p> {
    pub model: &'p str,
    pub method: &'p str,
}

/// The versions Google serves its API under.
const VERSIONS: [&str; 3] = ["v1", "v1beta", "v1alpha"];

/// The model and method of a Gemini path: `/{version}/models/{model}:{method}`, or Vertex's
/// `/{version}/projects/{p}/locations/{l}/publishers/google/models/{model}:{method}`.
pub fn model_call(path: &str) -> Option<ModelCall<'_>> {
    let mut segments = path.strip_prefix('/')?.split('/');
    let version = segments.next()?;
    if !VERSIONS.contains(&version) {
        return None;
    }
    let rest: Vec<&str> = segments.collect();
    let call = match rest.as_slice() {
        ["models", call] => *call,
        ["projects", _, "locations", _, "publishers", "google", "models", call] => *call,
        _ => return None,
    };
    let (model, method) = call.split_once(':')?;
    let plain = |text: &str| {
        !text.is_empty()
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    (plain(model) && plain(method)).then_some(ModelCall { model, method })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_and_method_are_read_from_every_path_form() {
        let call = |model, method| Some(ModelCall { model, method });
        assert_eq!(
            model_call("/v1beta/models/gemini-2.5-pro:generateContent"),
            call("gemini-2.5-pro", "generateContent")
        );
        assert_eq!(
            model_call("/v1/models/gemini-2.5-flash:streamGenerateContent"),
            call("gemini-2.5-flash", "streamGenerateContent")
        );
        assert_eq!(
            model_call(
                "/v1/projects/p1/locations/us-central1/publishers/google/models/gemini-2.5-pro:countTokens"
            ),
            call("gemini-2.5-pro", "countTokens")
        );
        for other in [
            "/v1/models",
            "/v1/models/gpt-4o",
            "/v1/chat/completions",
            "/v2/models/m:generateContent",
            "/v1beta/models/:generateContent",
            "/v1beta/models/m:",
            "/v1beta/models/m%2F..:generateContent",
            "/v1beta/tunedModels/m:generateContent",
        ] {
            assert_eq!(model_call(other), None, "{other}");
        }
    }
}
