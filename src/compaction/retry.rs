//! The reactive retry: when the upstream refuses a request for its length, the request is
//! compacted under the window the error states and sent once more.

use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body_util::BodyExt;

use crate::body::{self, prefixed, ProxyBody};
use crate::compaction::engine::{Compacted, CompactionEngine};
use crate::compaction::front_end::ApiRequest;
use crate::compaction::offload::Offloaded;
use crate::compaction::overflow;
use crate::compaction::prepare::Reactive;
use crate::compaction::scope::Caller;
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::upstream::Target;

/// Error bodies larger than this are not a context-length error worth reading.
const OVERFLOW_BODY_LIMIT: usize = 64 * 1024;

/// What a compacted request needs for its one retry after a context-length error.
pub struct Retry<'e, 'k> {
    pub engine: &'e CompactionEngine,
    pub api: ApiRequest,
    pub caller: Caller<'k>,
    /// The client's body as it came.
    pub original: Bytes,
    /// The headers as sent upstream, before the body's length: the client's own (control
    /// headers included, which the retry's compaction reads), less a compactor key.
    pub headers: HeaderMap,
    pub metrics: &'e Metrics,
}

impl Retry<'_, '_> {
    /// `response` is an error: when it is the upstream's context-length error, the request is
    /// compacted under the window it states and sent once more. The client gets the retry's
    /// answer when it succeeds, else the upstream's first error as it came.
    pub async fn after_overflow(
        self,
        target: &Target<'_>,
        response: Response<ProxyBody>,
        compacted: &mut Option<Compacted>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let (parts, body) = response.into_parts();
        let (error, rest) = read_bounded(body, OVERFLOW_BODY_LIMIT).await;
        let first =
            |error: Bytes, rest| Ok(Response::from_parts(parts.clone(), prefixed(error, rest)));
        let overflow = match &rest {
            Ok(None) => overflow::parse(parts.status.as_u16(), &error),
            _ => None,
        };
        let Some(overflow) = overflow else {
            return first(error, rest);
        };
        let sent_before = compacted.as_ref().map(|c| c.body.clone());
        // The refused size in the counting the retry's plan uses (the first plan may have
        // counted by the estimate): off the reactor for a large body.
        let forwarded_tokens = match &sent_before {
            Some(body) => {
                let (engine, api, body) = (self.engine.clone(), self.api.clone(), body.clone());
                let upstream = target.upstream.name.clone();
                let counted = self
                    .engine
                    .offload(body.len(), move || {
                        engine.count_as_retried(&api, &upstream, &body)
                    })
                    .await;
                match counted {
                    Offloaded::Done(tokens) => tokens,
                    Offloaded::Busy | Offloaded::Lost => None,
                }
            }
            None => None,
        };
        let reactive = Reactive {
            overflow,
            forwarded_tokens,
        };
        let retried = self
            .engine
            .compact_after_overflow(
                &self.headers,
                self.original,
                &target.upstream.name,
                self.caller,
                &self.api,
                reactive,
            )
            .await;
        let Ok(again) = retried else {
            self.metrics.reactive_retry("unchanged");
            return first(error, rest);
        };
        if !again.rewritten || sent_before.as_ref() == Some(&again.body) {
            self.metrics.reactive_retry("unchanged");
            return first(error, rest);
        }
        tracing::info!(
            upstream = %target.upstream.name,
            "context-length error from the upstream: retrying once, compacted"
        );
        let body = body::full(again.body.clone());
        let second = target.send(self.headers, body, again.as_sent()).await;
        match second {
            Ok(response) if response.status().is_success() => {
                self.metrics.reactive_retry("ok");
                *compacted = Some(again);
                Ok(response)
            }
            _ => {
                self.metrics.reactive_retry("failed");
                *compacted = Some(again.refused_on_retry());
                first(error, rest)
            }
        }
    }
}

/// Reads up to `limit` bytes of a body: all of it (and `Ok(None)`), or the bytes read and what
/// is left (`Ok(Some)`), or the bytes read and the error that stopped the reading.
pub async fn read_bounded(
    mut body: ProxyBody,
    limit: usize,
) -> (Bytes, Result<Option<ProxyBody>, body::BoxError>) {
    let mut read = bytes::BytesMut::new();
    loop {
        if read.len() > limit {
            return (read.freeze(), Ok(Some(body)));
        }
        match body.frame().await {
            None => return (read.freeze(), Ok(None)),
            Some(Err(error)) => return (read.freeze(), Err(error)),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    read.extend_from_slice(data);
                }
            }
        }
    }
}
