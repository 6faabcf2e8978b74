//! Google's paths: they carry the version, the model and the method
//! (`/v1beta/models/{model}:generateContent`, Vertex's
//! `/v1/projects/{p}/locations/{l}/publishers/google/models/{model}:…`) and lie outside the
//! OpenAI-style prefix, so the provider claims them whole.

/// A Gemini model call named by its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCall<'p> {
    pub model: &'p str,
    pub method: &'p str,
}

/// The versions Google serves its API under.
const VERSIONS: [&str; 3] = ["v1", "v1beta", "v1alpha"];

/// Whether a whole request path is Google's: a model call under any of its versions, anything
/// under the versions only Google uses (listing models, files, cached contents), and Vertex's
/// project paths. OpenAI's own `/v1/models` stays OpenAI's.
pub fn is_google_path(path: &str) -> bool {
    let only_google = ["/v1beta", "/v1alpha"].iter().any(|version| {
        path.strip_prefix(version)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    });
    only_google || path.starts_with("/v1/projects/") || model_call(path).is_some()
}

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
    fn googles_paths_are_its_model_calls_its_own_versions_and_vertex_projects() {
        for google in [
            "/v1beta/models",
            "/v1beta/models/gemini-2.5-pro",
            "/v1beta/files",
            "/v1/models/gemini-2.5-pro:countTokens",
            "/v1/projects/p/locations/l/publishers/google/models/m:generateContent",
        ] {
            assert!(is_google_path(google), "{google}");
        }
        for other in [
            "/v1/models",
            "/v1/models/gpt-4o",
            "/v1/chat/completions",
            "/v1betas",
        ] {
            assert!(!is_google_path(other), "{other}");
        }
    }

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
