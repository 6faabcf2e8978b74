//! Who a summary belongs to: summaries are only ever shared within one scope, a tenant (a hash
//! of the client's credential) and a summarizer fingerprint (everything that changes what a
//! summary says).

use http::header::{HeaderMap, HeaderValue};

use super::digest::{hash_parts, Digest};
use crate::config::SummarizationConfig;
use crate::headers::CREDENTIALS;

#[derive(Clone, Copy)]
pub struct Scope {
    pub tenant: [u8; 32],
    pub fingerprint: [u8; 32],
}

impl Scope {
    /// Seeds the prefix chain: a chain digest is then the cache key of that prefix in this scope.
    pub fn seed(&self) -> Digest {
        hash_parts([self.tenant.as_slice(), &self.fingerprint])
    }
}

/// The headers that identify a client (cheap reference-counted copies), hashed only when the
/// cache is consulted.
pub struct Credentials([Option<HeaderValue>; 3]);

impl Credentials {
    pub fn of(headers: &HeaderMap) -> Credentials {
        Credentials(CREDENTIALS.map(|name| headers.get(name).cloned()))
    }

    /// A hash of the client's credential: tenants never share summaries.
    pub fn tenant(&self) -> [u8; 32] {
        let values = self
            .0
            .iter()
            .map(|value| value.as_ref().map(HeaderValue::as_bytes).unwrap_or(b""));
        hash_parts(
            CREDENTIALS
                .iter()
                .map(|n| n.as_str().as_bytes())
                .chain(values),
        )
    }
}

/// Everything that changes what a summary says: summaries made differently never mix.
pub fn fingerprint(config: &SummarizationConfig, model: &str, upstream: &str) -> [u8; 32] {
    let description = serde_json::json!({
        "model": model,
        "upstream": upstream,
        "prompt": config.summary_prompt,
        "trim": config.trim_tokens_to_summarize,
        "oversize": config.oversize,
        "max_tokens": config.summary_max_tokens,
        "role": config.summary_role,
    });
    hash_parts([description.to_string().as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_never_share_keys() {
        let a = Scope {
            tenant: [1; 32],
            fingerprint: [9; 32],
        };
        let b = Scope {
            tenant: [2; 32],
            fingerprint: [9; 32],
        };
        let c = Scope {
            tenant: [1; 32],
            fingerprint: [8; 32],
        };
        assert_ne!(a.seed(), b.seed());
        assert_ne!(a.seed(), c.seed());
    }
}
