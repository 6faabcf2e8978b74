//! Compaction in flight: threshold check, cache, summarizer call, rewrite.

use std::sync::Arc;

use bytes::Bytes;
use http::header::HeaderMap;
use http::StatusCode;

use super::Outcome;
use crate::config::Config;
use crate::error::ProxyError;
use crate::upstream::{Upstream, Upstreams};

pub struct CompactionEngine {
    #[allow(dead_code)]
    config: Arc<Config>,
    #[allow(dead_code)]
    upstreams: Arc<Upstreams>,
}

/// The body to forward and what compaction did.
pub struct Compacted {
    pub body: Bytes,
    pub rewritten: bool,
    pub outcome: Outcome,
    notice: Option<Bytes>,
}

/// Compaction could not run and `fail_mode: closed` asks for an error instead of forwarding.
pub struct CompactionRefused {
    pub error: ProxyError,
    pub outcome: Outcome,
}

impl Compacted {
    /// The bytes to write before the upstream's body: only for a 2xx event stream.
    pub fn notice_for(&self, status: StatusCode, headers: &HeaderMap) -> Option<Bytes> {
        let is_stream = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        if status.is_success() && is_stream {
            self.notice.clone()
        } else {
            None
        }
    }
}

impl CompactionEngine {
    pub fn new(config: Arc<Config>, upstreams: Arc<Upstreams>) -> CompactionEngine {
        CompactionEngine { config, upstreams }
    }

    pub async fn compact(
        &self,
        _headers: &HeaderMap,
        body: Bytes,
        _upstream: &Upstream,
    ) -> Result<Compacted, CompactionRefused> {
        Ok(Compacted {
            body,
            rewritten: false,
            outcome: Outcome::skipped(0, "not_implemented"),
            notice: None,
        })
    }
}
