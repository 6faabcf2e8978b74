//! The phases before the upstream call that may change the body: the served contracts
//! ([`crate::served`]), then compaction as every request gets it.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::Response;
use http_body_util::BodyExt;

use super::facts::{Facts, Inbound};
use crate::access_log::RequestLog;
use crate::app::Current;
use crate::body::{self, ProxyBody};
use crate::compaction::engine::calibrating::CalibrationSample;
use crate::compaction::engine::{Compacted, CompactionEngine};
use crate::compaction::failure::CompactionFailure;
use crate::compaction::front_end::ApiRequest;
use crate::compaction::scope::Caller;
use crate::compaction::Outcome;
use crate::error::ProxyError;
use crate::metrics::Route;
use crate::routing::model_hint;
use crate::served::{Addition, Ask, Before};
use crate::upstream::Upstream;

/// What the served contracts left to do.
pub(super) enum Served {
    /// Answered here.
    Answered(Response<ProxyBody>),
    /// To compact and forward; `compacted` set when a contract compacted it already, on the
    /// client's own terms; the answer gets `addition`.
    Go {
        inbound: Inbound,
        compacted: Option<Outcome>,
        addition: Option<Box<dyn Addition>>,
    },
}

/// The phase of the served contracts, for an upstream compactor serves them for.
pub(super) async fn serve(
    current: &Current,
    facts: &Facts<'_>,
    rest: &str,
    ask: (&Upstream, Caller<'_>),
    headers: &mut HeaderMap,
    inbound: Inbound,
    log: &mut RequestLog,
) -> Result<Served, ProxyError> {
    let go = |inbound| Served::Go {
        inbound,
        compacted: None,
        addition: None,
    };
    let (upstream, caller) = ask;
    let sealer = current.generation.native.for_upstream(&upstream.name);
    let (Some(engine), Some(sealer), Some(contracts), Inbound::Buffered(bytes)) = (
        &current.generation.compaction,
        sealer,
        facts.contracts,
        &inbound,
    ) else {
        return Ok(go(inbound));
    };
    let ask = Ask {
        engine,
        sealer,
        upstream: &upstream.name,
        caller,
        headers,
    };
    let (body, compacted, addition) = match contracts.before(ask, rest, bytes).await? {
        Before::Answered {
            body,
            streamed,
            outcome,
        } => return Ok(Served::Answered(answered(body, streamed, outcome, log))),
        Before::Forward => return Ok(go(inbound)),
        Before::Rewritten(body, addition) => (body, None, addition),
        Before::Compacted(body, outcome, addition) => (body, Some(outcome), addition),
    };
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    if addition.is_some() {
        // The answer gets a compaction added: it must come back as plain text to be read.
        headers.remove(header::ACCEPT_ENCODING);
    }
    Ok(Served::Go {
        inbound: Inbound::Buffered(body),
        compacted,
        addition,
    })
}

/// A native compaction answered here: what compaction did in its headers and the log, which
/// counts it as compactor's own answer.
fn answered(
    body: Bytes,
    streamed: bool,
    outcome: Outcome,
    log: &mut RequestLog,
) -> Response<ProxyBody> {
    let content_type = if streamed {
        "text/event-stream"
    } else {
        "application/json"
    };
    let mut response = Response::new(body::full(body));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    outcome.write_headers(response.headers_mut());
    log.compaction = Some(outcome);
    log.route = Route::Local;
    response
}

/// The body to send, compacted where it is one compaction reads; and what a retry after a
/// context-length error needs.
pub(super) struct Compacting<'e> {
    pub body: ProxyBody,
    pub compacted: Option<Compacted>,
    /// The engine and API that read the body, when one did.
    pub engine: Option<(&'e CompactionEngine, ApiRequest)>,
    pub retry: Option<(&'e CompactionEngine, ApiRequest, Bytes)>,
    /// The client's body, when compaction rewrote it: what lookups are answered from.
    pub original: Option<Bytes>,
}

impl Compacting<'_> {
    fn plain(body: ProxyBody, compacted: Option<Compacted>) -> Self {
        Compacting {
            body,
            compacted,
            engine: None,
            retry: None,
            original: None,
        }
    }
}

/// The phase of compaction: a body compacted on a served contract's terms goes as it is; any
/// other buffered body of an API compaction reads is compacted.
pub(super) async fn compact<'e>(
    current: &'e Current,
    facts: &Facts<'_>,
    headers: &HeaderMap,
    upstream: &Upstream,
    caller: Caller<'_>,
    (inbound, served): (Inbound, Option<Outcome>),
    log: &mut RequestLog,
) -> Result<Compacting<'e>, ProxyError> {
    let bytes = match inbound {
        Inbound::Streaming(body) => return Ok(Compacting::plain(body.boxed_unsync(), None)),
        Inbound::Buffered(bytes) => bytes,
    };
    if let Some(outcome) = served {
        let compacted = Compacted::served(bytes.clone(), outcome);
        return Ok(Compacting::plain(body::full(bytes), Some(compacted)));
    }
    let (Some(engine), Some(api)) = (&current.generation.compaction, &facts.api) else {
        return Ok(Compacting::plain(body::full(bytes), None));
    };
    let retry = current
        .generation
        .config
        .summarization
        .reactive
        .then(|| (engine, api.clone(), bytes.clone()));
    let original = bytes.clone();
    let result = engine
        .compact(headers, bytes, &upstream.name, caller, api)
        .await
        .map_err(|refused| {
            log.compaction = Some(*refused.outcome);
            refused_error(refused.failure)
        })?;
    Ok(Compacting {
        body: body::full(result.body.clone()),
        compacted: Some(result),
        engine: Some((engine, api.clone())),
        retry,
        original: Some(original),
    })
}

/// The error a client gets when `fail_mode: closed` refuses a request compaction could not fix.
fn refused_error(failure: CompactionFailure) -> ProxyError {
    match failure {
        CompactionFailure::ContextTooLarge { tokens, window } => {
            ProxyError::ContextTooLarge { tokens, window }
        }
        failure => ProxyError::CompactionFailed(failure.to_string()),
    }
}

/// The forwarded body, held to calibrate its model's count against the upstream's usage when
/// the model is due a sample.
pub(super) fn calibration_sample(
    engine: Option<(&CompactionEngine, ApiRequest)>,
    upstream: &str,
    compacted: Option<&Compacted>,
    model: Option<&str>,
) -> Option<CalibrationSample> {
    let (engine, api) = engine?;
    let compacted = compacted?;
    // Routing skims the model only when it needs it; the sample checks the guess on parsing.
    let model = model.or_else(|| model_hint(&compacted.body))?;
    engine.calibration_sample(&api, upstream, model, compacted)
}
