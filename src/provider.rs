//! What differs between the provider families compactor forwards to, on the wire: which paths
//! under the prefix are theirs, the header an upstream's own key goes in, and the body of an
//! error compactor answers with on their paths. Each family's facts are written in its API's
//! folder (`crate::apis`) and handed to the code below it through [`Provider`], so no
//! provider's header or error shape is spelled out here or in the modules that use them.

use http::header::HeaderName;
use http::StatusCode;

use crate::config::UpstreamApi;

/// An error compactor answers with, in the terms every provider's shape is built from.
#[derive(Debug, Clone)]
pub struct ErrorFacts<'e> {
    pub status: StatusCode,
    pub message: &'e str,
    /// OpenAI's `error.type` for it.
    pub error_type: &'e str,
    /// compactor's own code (also in the `x-compactor-error` header).
    pub code: &'e str,
    /// For a request over the model's window: its tokens and the window.
    pub over_window: Option<(u64, u64)>,
}

pub trait Provider: Sync + Send {
    /// The `api:` value of its upstreams.
    fn family(&self) -> UpstreamApi;

    /// Whether a path under the listen prefix is one of its API's.
    fn owns_path(&self, rest: &str) -> bool;

    /// Whether a whole request path is one of its API's wherever the listen prefix is (an API
    /// whose paths carry their own version); it is then forwarded as it came.
    fn claims_whole_path(&self, _path: &str) -> bool {
        false
    }

    /// The route label of a model call on its paths that no compaction API reads (its metrics
    /// then follow the GenAI conventions like the others').
    fn generation_label(&self, _rest: &str) -> Option<&'static str> {
        None
    }

    /// The model a path names, for an API that puts it there rather than in the body.
    fn path_model<'p>(&self, _rest: &'p str) -> Option<&'p str> {
        None
    }

    /// The header an upstream's own key is sent in, and the header's value for `key`.
    fn credential(&self, key: &str) -> (HeaderName, String);

    /// The JSON body of an error compactor answers with on its paths.
    fn error_body(&self, error: &ErrorFacts<'_>) -> serde_json::Value;
}
