//! The providers' own compaction contracts, served for upstreams that lack them, as two phases
//! around the upstream call: [`Contracts::before`] (answer here, rewrite, or forward) and
//! [`after_upstream`] (the compaction put first in the upstream's answer). Each API's folder in
//! `crate::apis` implements its contracts; this module holds what they share: which upstreams
//! get them, the sealed item a client carries back ([`Carried`]), the forced compaction they
//! all ask of the engine, and the error a failed one answers with.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use std::future::Future;
use std::pin::Pin;

use http::header;
use http::Response;

use crate::body::{self, ProxyBody};
use crate::compaction::engine::{Asked, Compacted, CompactionEngine};
use crate::compaction::front_end::ApiRequest;
use crate::compaction::offload::Offloaded;
use crate::compaction::reason::Reason;
use crate::compaction::retry::read_bounded;
use crate::compaction::scope::{Caller, Credentials};
use crate::compaction::Outcome;
use crate::config::Config;
use crate::error::ProxyError;
use crate::sealing::{Opened, Sealer};
use crate::upstream::Upstream;

pub mod splice;

/// What the contracts made of a request before the upstream call.
pub enum Before {
    /// Answered here (a compact call, a request that ends with a trigger, a paused
    /// compaction): the body, whether it is an event stream, what compaction did.
    Answered {
        body: Bytes,
        streamed: bool,
        outcome: Outcome,
    },
    /// To forward as it came, compacted as any request.
    Forward,
    /// To forward rewritten (compactor's items expanded, a served edit taken out or applied),
    /// compacted as any request; the answer gets the addition when there is one.
    Rewritten(Bytes, Option<Box<dyn Addition>>),
    /// Compacted as the client's own edit asked: forwarded without compacting it again; the
    /// compaction, when there is one, goes first in the answer.
    Compacted(Bytes, Outcome, Option<Box<dyn Addition>>),
}

/// What a served contract puts first in the upstream's answer.
pub trait Addition: Send + Sync {
    /// The answer's event stream with the compaction spliced in as it passes.
    fn splice_stream(&self, stream: ProxyBody) -> ProxyBody;
    /// A whole answer with the compaction in it; None when it is not one this can edit.
    fn splice_whole(&self, whole: &[u8]) -> Option<Bytes>;
}

pub type BeforeFuture<'a> = Pin<Box<dyn Future<Output = Result<Before, ProxyError>> + Send + 'a>>;

/// An API's served contracts.
pub trait Contracts: Sync {
    /// Whether a POST to `rest` (the path under the API prefix) is one of them: its body is
    /// read whole for [`Contracts::before`].
    fn serves(&self, rest: &str) -> bool;

    /// The phase before the upstream call.
    fn before<'a>(&'a self, ask: Ask<'a>, rest: &'a str, body: &'a Bytes) -> BeforeFuture<'a>;
}

const MAX_SPLICED_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// The phase after the upstream call: its answer with `addition` first in it, spliced into a
/// stream as it passes, or into a whole answer. A compressed answer (asked for plain and
/// answered compressed anyway) passes as it came.
pub async fn after_upstream(
    response: Response<ProxyBody>,
    addition: &dyn Addition,
    upstream: &Upstream,
) -> Result<Response<ProxyBody>, ProxyError> {
    let Some(streamed) = body::readable_answer(response.headers()) else {
        return Ok(response);
    };
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    if streamed {
        return Ok(Response::from_parts(parts, addition.splice_stream(body)));
    }
    // A message answer is small; the cap only keeps a broken upstream from growing it unbounded.
    let broken = |reason: String| ProxyError::UpstreamUnreachable {
        upstream: upstream.name.clone(),
        reason,
    };
    let whole = match read_bounded(body, MAX_SPLICED_MESSAGE_BYTES).await {
        (whole, Ok(None)) => whole,
        (_, Ok(Some(_))) => {
            return Err(broken(
                "the answer is too large to add the compaction block to".into(),
            ))
        }
        (_, Err(e)) => return Err(broken(e.to_string())),
    };
    let body = addition.splice_whole(&whole).unwrap_or(whole);
    parts
        .headers
        .insert(header::CONTENT_LENGTH, http::HeaderValue::from(body.len()));
    Ok(Response::from_parts(parts, body::full(body)))
}

/// Which upstreams get the contracts served, and the sealer for their items.
#[derive(Debug, Default)]
pub struct NativeCompaction {
    sealer: Option<Sealer>,
    served: Vec<String>,
}

impl NativeCompaction {
    pub fn new(config: &Config) -> NativeCompaction {
        let served = config
            .upstreams
            .iter()
            .filter(|u| config.summarization.enabled && u.serves_native_compaction(&config.sealing))
            .map(|u| u.name.clone())
            .collect();
        NativeCompaction {
            sealer: Sealer::new(&config.sealing.keys),
            served,
        }
    }

    /// The sealer, when compactor serves the contracts for `upstream`.
    pub fn for_upstream(&self, upstream: &str) -> Option<&Sealer> {
        let sealer = self.sealer.as_ref()?;
        self.served.iter().any(|u| u == upstream).then_some(sealer)
    }
}

/// What serving a contract needs besides the body: the engine and sealer, the upstream the
/// request is routed to, who sent it and its headers.
#[derive(Clone, Copy)]
pub struct Ask<'a> {
    pub engine: &'a CompactionEngine,
    pub sealer: &'a Sealer,
    pub upstream: &'a str,
    pub caller: Caller<'a>,
    pub headers: &'a HeaderMap,
}

impl Ask<'_> {
    /// What sealed items are bound to ([`Credentials::sealing_tenant`]), and what those
    /// sealed before it carry.
    pub fn binding(&self) -> Binding {
        let credentials = Credentials::of(self.caller, self.headers);
        Binding {
            current: credentials.sealing_tenant(),
            earlier: credentials.tenant(),
        }
    }
}

/// What compactor's sealed items are bound to: the binding they are sealed with, and the one
/// items sealed before it carry (the tenant's credential hash), opened too so conversations in
/// flight across an upgrade go on.
#[derive(Debug, Clone, Copy)]
pub struct Binding {
    pub current: [u8; 32],
    pub earlier: [u8; 32],
}

/// What a compaction item carries, sealed: the summary, and the items it stands for that the
/// client does not keep itself (after a `compaction_trigger`, the kept tail).
#[derive(Serialize, Deserialize)]
pub(crate) struct Carried {
    pub summary: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<Value>,
    /// The item stands for the whole input before it (made under `context_management`): what
    /// precedes it is dropped when it is expanded, as the provider reads its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replaces: bool,
}

/// `body` compacted as if `x-compactor: force` were sent: the client asked for it. With
/// `summary_prompt` (a template), the summary is written to the client's own prompt; with
/// `at_least`, only when it counts that many tokens.
pub(crate) async fn compacted(
    ask: &Ask<'_>,
    body: Bytes,
    api: &ApiRequest,
    summary_prompt: Option<&str>,
    at_least: Option<u64>,
) -> Result<Compacted, ProxyError> {
    let mut forced = ask.headers.clone();
    forced.insert(crate::headers::CONTROL, HeaderValue::from_static("force"));
    let caller = Caller {
        may_force: true,
        ..ask.caller
    };
    let asked = Asked::summary_prompt(summary_prompt)
        .at_least(at_least)
        .client_asked();
    ask.engine
        .compact_as(&forced, body, ask.upstream, caller, api, asked)
        .await
        .map_err(|refused| failed(refused.outcome.reason))
}

/// A served contract's body as one JSON object (None: it is not one), read off the reactor when
/// it is large: a contract rewrites the client's body, so it reads it whole, once.
pub(crate) async fn object_off_reactor(
    engine: &CompactionEngine,
    body: &Bytes,
) -> Result<Option<serde_json::Map<String, Value>>, ProxyError> {
    let owned = body.clone();
    let read = engine.offload(body.len(), move || {
        match serde_json::from_slice::<Value>(&owned) {
            Ok(Value::Object(fields)) => Some(fields),
            _ => None,
        }
    });
    match read.await {
        Offloaded::Done(fields) => Ok(fields),
        Offloaded::Busy => Err(ProxyError::Overloaded("planner threads")),
        Offloaded::Lost => Err(ProxyError::Internal("reading the body failed".into())),
    }
}

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(crate) fn seal(
    sealer: &Sealer,
    tenant: &[u8; 32],
    carried: &Carried,
) -> Result<String, ProxyError> {
    let plain = serde_json::to_string(carried).map_err(|e| ProxyError::Internal(e.to_string()))?;
    sealer
        .seal(tenant, &plain)
        .map_err(|e| ProxyError::Internal(e.to_string()))
}

/// What a sealed `encrypted_content` carries: None when compactor did not seal it.
pub(crate) fn open(
    sealer: &Sealer,
    binding: &Binding,
    sealed: &str,
) -> Result<Option<Carried>, ProxyError> {
    let opened = match sealer.open(&binding.current, sealed) {
        Opened::Refused => sealer.open(&binding.earlier, sealed),
        opened => opened,
    };
    match opened {
        Opened::Foreign => Ok(None),
        Opened::Refused => Err(ProxyError::SealedItemRefused),
        Opened::Plain(plain) => serde_json::from_str::<Carried>(&plain)
            .map(Some)
            .map_err(|_| ProxyError::SealedItemRefused),
    }
}

/// The planner found nothing worth a summary: the answer is the items as they came.
pub(crate) fn nothing_to_summarize(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::NothingToSummarize | Reason::SpanTooSmall | Reason::UnderTrigger
    )
}

pub(crate) fn failed(reason: Reason) -> ProxyError {
    if reason == Reason::Budget {
        return ProxyError::CompactionRateLimited;
    }
    ProxyError::NativeCompactionFailed(format!(
        "compactor could not summarize this conversation ({reason}); nothing was compacted, retry later"
    ))
}

pub(crate) fn hex_digest(parts: &[&[u8]]) -> String {
    let digest = crate::compaction::planner::digest::hash_parts(parts.iter().copied());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}
