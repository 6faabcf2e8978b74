//! The request handler, as its phases: local routes → address → authorize → classify → read
//! or stream the body → route → compact (chat completions, Responses, Messages) → send, with
//! its one retry (`compaction::retry`) → respond. Sending lives with the upstream.
//! Logging happens once, when the response body ends (see [`crate::access_log::LoggedBody`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tracing::Instrument;

use crate::access_log::{LoggedBody, RequestLog};
use crate::app::{App, Current};
use crate::auth::{Auth, AuthFailure, ClientKey};
use crate::body::{self, ProxyBody};
use crate::compaction::engine::{Compacted, CompactionEngine};
use crate::compaction::failure::CompactionFailure;
use crate::compaction::front_ends::Api;
use crate::compaction::overflow::may_be_overflow;
use crate::compaction::retry::{read_bounded, Retry};
use crate::compaction::scope::Caller;
use crate::config::{UpstreamApi, WebSocketMode};
use crate::error::{ErrorShape, ProxyError};
use crate::headers::CREDENTIALS;
use crate::inbound::{
    read_whole, BufferBudget, ClientAddress, GuardedBody, ReadError, Reservation,
};
use crate::metrics::Route;
use crate::native;
use crate::routing::{body_model, forwarded_path, model_hint, model_of, BodyModel};
use crate::telemetry;
use crate::upstream::{Target, Upstream};

/// The hyper service: never fails; every error becomes an OpenAI-shaped response (an
/// Anthropic-shaped one on the Messages API's paths).
pub async fn handle(
    app: Arc<App>,
    request: Request<Incoming>,
) -> Result<Response<LoggedBody>, Infallible> {
    let started = Instant::now();
    let current = app.current();
    let config = &current.generation.config;
    let shape = ErrorShape::for_path(forwarded_path(&config.prefix, request.uri().path()));
    let span = telemetry::request_span(request.method(), request.uri().path(), request.headers());
    let mut log = RequestLog {
        method: request.method().clone(),
        uri: request.uri().clone(),
        metrics: app.metrics().enabled().then(|| app.metrics_handle()),
        span: (!span.is_none()).then(|| span.clone()),
        ..RequestLog::default()
    };
    let proxied = proxy(&app, &current, request, &mut log)
        .instrument(span)
        .await;
    let response = match proxied {
        Ok(response) => response,
        Err(error) => {
            log.error = Some(error.code());
            if error.fault() != crate::error::Fault::Client {
                tracing::warn!(code = error.code(), "{error}");
            }
            error.into_response(shape)
        }
    };
    log.status = response.status().as_u16();
    log.headers_after = Some(started.elapsed());
    Ok(response.map(|b| LoggedBody::new(b, log, started)))
}

/// The phases of one proxied request, in order: address → authorize → classify → read →
/// route → compact → send (with its one retry) → respond. Each phase notes what it learned in
/// `log`, written once the response body ends.
async fn proxy(
    app: &App,
    current: &Current,
    request: Request<Incoming>,
    log: &mut RequestLog,
) -> Result<Response<ProxyBody>, ProxyError> {
    if let Some(response) = local_route(app, &request, false) {
        log.route = Route::Local;
        return Ok(response);
    }
    let client_address = request
        .extensions()
        .get::<ClientAddress>()
        .map(|address| address.0);
    let addressed = match address(&current.generation.config, request, log)? {
        Addressed::Here(response) => return Ok(response),
        Addressed::Upstream(addressed) => addressed,
    };
    let UnderPrefix {
        rest,
        query,
        mut parts,
        incoming,
        upgrade,
    } = addressed;
    let key = authorize(&current.generation.auth, &parts.headers, log)?;
    if upgrade {
        if key.is_some_and(ClientKey::restricts_models) {
            // A relayed socket is never read, so the model of its frames cannot be checked.
            return Err(ProxyError::UpgradeRefused(
                crate::error::UPGRADE_FOR_LIMITED_KEY,
            ));
        }
        let keyed = key.is_some();
        return relay_upgrade(app, current, &rest, query.as_deref(), parts, keyed, log).await;
    }
    let class = classify(current, &rest, &parts.method, key, log);
    let (inbound, _reservation) = read(app, current, &class, &parts, incoming, log).await?;
    let upstream = route(current, &class, key, &inbound, log)?;
    let caller = Caller {
        key: key.map(|k| k.name.as_str()),
        key_digest: key.map(ClientKey::digest),
        may_force: key.map_or(current.generation.config.summarization.allow_force, |k| {
            k.allow_force
        }),
        may_instruct: key.map_or(
            current.generation.config.summarization.client_instructions,
            |k| k.client_instructions,
        ),
        address: client_address,
    };
    let sealer = current.generation.native.for_upstream(&upstream.name);
    let mut served = None;
    let mut add_to_answer = None;
    let inbound = match sealer {
        Some(sealer) => {
            match serve_native(
                current,
                &class,
                sealer,
                upstream,
                caller,
                &parts.headers,
                inbound,
                log,
            )
            .await?
            {
                Native::Answered(response) => return Ok(response),
                Native::Forward(inbound) => inbound,
                Native::Rewritten(body, add) => {
                    parts
                        .headers
                        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
                    add_to_answer = add;
                    Inbound::Buffered(body)
                }
                Native::Compacted(body, outcome, add) => {
                    parts
                        .headers
                        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
                    served = Some(outcome);
                    add_to_answer = add;
                    Inbound::Buffered(body)
                }
            }
        }
        None => inbound,
    };
    let compacting = match (served, inbound) {
        // Compacted already, on the client's own terms: forwarded as it is.
        (Some(outcome), Inbound::Buffered(body)) => {
            let compacted = Compacted::served(body.clone(), outcome);
            Compacting {
                body: body::full(body),
                compacted: Some(compacted),
                engine: None,
                retry: None,
            }
        }
        (_, inbound) => {
            compact(
                current,
                &class,
                &parts.headers,
                upstream,
                caller,
                inbound,
                log,
            )
            .await?
        }
    };
    let mut headers = parts.headers;
    if add_to_answer.is_some() {
        // The answer gets a compaction added: it must come back as plain text to be read.
        headers.remove(header::ACCEPT_ENCODING);
    }
    if key.is_some() {
        // The client's credential is a compactor key: it never leaves compactor.
        for name in CREDENTIALS {
            headers.remove(name);
        }
    }
    let query = forwarded_query(query.as_deref(), key.is_some(), upstream);
    let uri = upstream
        .url_for(&rest, query.as_deref())
        .map_err(|e| ProxyError::Internal(format!("cannot build upstream URL: {e}")))?;
    let target = Target::new(upstream, parts.method, uri);
    let Compacting {
        body,
        mut compacted,
        engine,
        retry,
    } = compacting;
    // A retry after a context-length error is sent with the same headers.
    let retry = retry.map(|(engine, api, original)| Retry {
        engine,
        api,
        caller,
        original,
        headers: headers.clone(),
        metrics: app.metrics(),
    });
    let sent = compacted
        .as_ref()
        .map(Compacted::as_sent)
        .unwrap_or_default();
    let mut response = target.send(headers, body, sent).await?;
    if let Some(retry) = retry {
        if may_be_overflow(response.status().as_u16()) {
            response = retry
                .after_overflow(&target, response, &mut compacted)
                .await?;
        }
    }
    log.upstream_wait = target.waited();
    if response.status().is_success() {
        log.calibration = calibration_sample(
            engine,
            &upstream.name,
            compacted.as_ref(),
            log.model.as_deref(),
        );
    }
    if let Some(add) = add_to_answer.filter(|_| response.status().is_success()) {
        response = with_compaction_first(response, &add, upstream).await?;
    }
    Ok(respond(response, compacted, log))
}

const MAX_SPLICED_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// The upstream's answer to a request compacted on a served contract's terms, with the
/// compaction first in it: spliced into a stream as it passes, or into a whole answer.
async fn with_compaction_first(
    response: Response<ProxyBody>,
    add: &AddToAnswer,
    upstream: &Upstream,
) -> Result<Response<ProxyBody>, ProxyError> {
    let encoded = response
        .headers()
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity");
    if encoded {
        // Asked for plain and answered compressed anyway: passed on as it came.
        return Ok(response);
    }
    let streamed = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    if streamed {
        let body = match add {
            AddToAnswer::Messages(addition) => native::messages::spliced_stream(body, addition),
            AddToAnswer::ResponsesItem(item) => native::managed::spliced_stream(body, item),
        };
        return Ok(Response::from_parts(parts, body));
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
    let spliced = match add {
        AddToAnswer::Messages(addition) => native::messages::splice_into_message(&whole, addition),
        AddToAnswer::ResponsesItem(item) => native::managed::splice_into_response(&whole, item),
    };
    let body = spliced.unwrap_or(whole);
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    Ok(Response::from_parts(parts, body::full(body)))
}

/// What the native compaction contracts made of a request to an upstream they are served for.
enum Native {
    /// Answered here: a compact call, or a Responses request ending with a trigger.
    Answered(Response<ProxyBody>),
    /// To forward as it came.
    Forward(Inbound),
    /// To forward rewritten (compactor's compaction items expanded, a served edit taken out or
    /// applied), compacted as any request; the answer gets what the edits call for.
    Rewritten(Bytes, Option<AddToAnswer>),
    /// Compacted as the client's own edit asked: forwarded without compacting it again; the
    /// compaction, when there is one, goes first in the answer.
    Compacted(Bytes, crate::compaction::Outcome, Option<AddToAnswer>),
}

/// The compaction a served contract puts first in the upstream's answer.
enum AddToAnswer {
    /// Anthropic's: a `compaction` content block first, the context edits applied.
    Messages(native::messages::Addition),
    /// OpenAI's: a `compaction` output item.
    ResponsesItem(serde_json::Value),
}

#[allow(clippy::too_many_arguments)]
async fn serve_native(
    current: &Current,
    class: &Class,
    sealer: &crate::sealing::Sealer,
    upstream: &Upstream,
    caller: Caller<'_>,
    headers: &HeaderMap,
    inbound: Inbound,
    log: &mut RequestLog,
) -> Result<Native, ProxyError> {
    let (Some(engine), Inbound::Buffered(bytes)) = (&current.generation.compaction, &inbound)
    else {
        return Ok(Native::Forward(inbound));
    };
    let ask = native::Ask {
        engine,
        sealer,
        upstream: &upstream.name,
        caller,
        headers,
    };
    if class.native_compact {
        let (answer, outcome) = native::compact(&ask, bytes).await?;
        return Ok(Native::Answered(answered(answer, false, outcome, log)));
    }
    if class.api == Some(Api::Messages) {
        let served = native::messages::serve(&ask, bytes).await?;
        return Ok(match served {
            native::messages::Served::Forward(None) => Native::Forward(inbound),
            native::messages::Served::Forward(Some(body)) => Native::Rewritten(body, None),
            native::messages::Served::Edited { body, addition } => {
                let add = (!addition.is_empty()).then_some(AddToAnswer::Messages(addition));
                Native::Rewritten(body, add)
            }
            native::messages::Served::Compacted {
                body,
                outcome,
                addition,
            } => Native::Compacted(body, outcome, Some(AddToAnswer::Messages(addition))),
            native::messages::Served::Answer {
                body,
                streamed,
                outcome,
            } => Native::Answered(answered(body, streamed, outcome, log)),
        });
    }
    if class.api != Some(Api::Responses) {
        return Ok(Native::Forward(inbound));
    }
    // The client's copy of a compaction compactor made becomes what it carries.
    let expanded = native::expand(bytes, sealer, &ask.tenant())?;
    let current = expanded.as_ref().unwrap_or(bytes);
    if !native::ends_with_trigger(current) {
        return Ok(match native::managed::serve(&ask, current).await? {
            native::managed::Managed::Untouched => match expanded {
                Some(expanded) => Native::Rewritten(expanded, None),
                None => Native::Forward(inbound),
            },
            native::managed::Managed::Stripped(body) => Native::Rewritten(body, None),
            native::managed::Managed::Compacted {
                body,
                outcome,
                item,
            } => Native::Compacted(body, outcome, Some(AddToAnswer::ResponsesItem(item))),
            native::managed::Managed::Unsummarized { body, outcome } => {
                Native::Compacted(body, outcome, None)
            }
        });
    }
    let (answer, streamed, outcome) = native::compact_on_trigger(&ask, current).await?;
    Ok(Native::Answered(answered(answer, streamed, outcome, log)))
}

/// A native compaction answered here: what compaction did in its headers and the log, which
/// counts it as compactor's own answer.
fn answered(
    body: Bytes,
    streamed: bool,
    outcome: crate::compaction::Outcome,
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

/// Where a request is addressed, once its path is checked.
enum Addressed {
    /// Answered here (a probe outside the API prefix).
    Here(Response<ProxyBody>),
    Upstream(UnderPrefix),
}

/// A request addressed under the API prefix.
struct UnderPrefix {
    /// The path under the prefix.
    rest: String,
    query: Option<String>,
    parts: http::request::Parts,
    incoming: Incoming,
    upgrade: bool,
}

/// The path checked and placed under the API prefix; a WebSocket upgrade refused unless
/// relayed.
fn address(
    config: &crate::config::Config,
    request: Request<Incoming>,
    log: &mut RequestLog,
) -> Result<Addressed, ProxyError> {
    let path = checked_path(&request)?;
    let Some(rest) = forwarded_path(&config.prefix, &path) else {
        // Clients probe the address they were given before using it (Claude Code sends
        // `HEAD /api/hello`): compactor is what answers there.
        if request.method() == Method::HEAD {
            log.route = Route::Local;
            return Ok(Addressed::Here(Response::new(body::full(Bytes::new()))));
        }
        return Err(ProxyError::NotFound {
            method: request.method().to_string(),
            path: request.uri().path().to_string(),
        });
    };
    let rest = rest.to_string();
    let upgrade = is_websocket_upgrade(request.headers());
    if upgrade && config.websocket == WebSocketMode::Refuse {
        return Err(ProxyError::UpgradeRefused(
            crate::error::UPGRADE_NOT_RELAYED,
        ));
    }
    let query = request.uri().query().map(str::to_string);
    let (parts, incoming) = request.into_parts();
    Ok(Addressed::Upstream(UnderPrefix {
        rest,
        query,
        parts,
        incoming,
        upgrade,
    }))
}

/// The client key, when auth is on.
fn authorize<'a>(
    auth: &'a Auth,
    headers: &HeaderMap,
    log: &mut RequestLog,
) -> Result<Option<&'a ClientKey>, ProxyError> {
    let key = authenticate(auth, headers)?;
    log.key = key.map(|k| k.name.clone());
    Ok(key)
}

/// What kind of request it is, before its body is read.
struct Class {
    /// The API compactor reads it as, when it does.
    api: Option<Api>,
    /// Its upstream family, by path.
    family: UpstreamApi,
    /// OpenAI's compaction endpoint, answered here for upstreams that lack it.
    native_compact: bool,
    /// Whether routing or the key's model list needs the body's model.
    needs_model: bool,
    /// The key may use some models only: whatever the method or content type, the body is read
    /// and must name its model unambiguously.
    restricted: bool,
}

fn classify(
    current: &Current,
    rest: &str,
    method: &Method,
    key: Option<&ClientKey>,
    log: &mut RequestLog,
) -> Class {
    let api = Some(rest)
        .filter(|_| *method == Method::POST)
        .and_then(Api::for_path);
    log.route = api.map_or(Route::Other, Route::Api);
    let family = UpstreamApi::of_path(rest);
    let restricted = key.is_some_and(|k| k.restricts_models());
    Class {
        api,
        family,
        native_compact: *method == Method::POST && rest == native::COMPACT_PATH,
        needs_model: current.upstreams.routing_needs_model(family) || restricted,
        restricted,
    }
}

/// The body: read whole when compaction or the model is needed (the reservation held until
/// the upstream has answered bounds the bytes all buffered requests pin), else streamed on.
async fn read(
    app: &App,
    current: &Current,
    class: &Class,
    parts: &http::request::Parts,
    incoming: Incoming,
    log: &mut RequestLog,
) -> Result<(Inbound, Reservation), ProxyError> {
    let bounds = current.generation.bounds;
    let declared = declared_length(&parts.headers);
    if declared.is_some_and(|len| len > bounds.max_bytes) {
        return Err(ProxyError::BodyTooLarge {
            limit: bounds.max_bytes,
        });
    }
    let compacting =
        (class.api.is_some() || class.native_compact) && current.generation.compaction.is_some();
    let body = GuardedBody::new(incoming, bounds);
    if class.restricted
        || (is_json_post(&parts.method, &parts.headers) && (compacting || class.needs_model))
    {
        let (bytes, reservation) =
            read_whole(body, app.buffer_budget())
                .await
                .map_err(|e| match e {
                    ReadError::Fault(fault) => ProxyError::from_body_fault(&fault),
                    ReadError::Overloaded(_) => ProxyError::Overloaded("buffered request bytes"),
                })?;
        log.bytes_in = bytes.len() as u64;
        Ok((Inbound::Buffered(bytes), reservation))
    } else {
        log.bytes_in = declared.unwrap_or(0);
        Ok((Inbound::Streaming(body), BufferBudget::empty_reservation()))
    }
}

/// The model (checked against the key's list) and the upstream it goes to.
fn route<'c>(
    current: &'c Current,
    class: &Class,
    key: Option<&ClientKey>,
    inbound: &Inbound,
    log: &mut RequestLog,
) -> Result<&'c Upstream, ProxyError> {
    // Skimming the model is a pass over the whole body: only paid for when routing or the
    // key's model list needs it (compaction reads the body on its own terms).
    let model = match (inbound, key) {
        (Inbound::Buffered(bytes), Some(key)) if class.restricted => {
            let model = restricted_model(bytes)?;
            if let Some(model) = &model {
                if !key.allows_model(model) {
                    return Err(ProxyError::ModelNotAllowed(model.clone()));
                }
            }
            model
        }
        (Inbound::Buffered(bytes), _) if class.needs_model => model_of(bytes),
        _ => None,
    };
    if log.metrics.is_some() && log.route.is_generation() {
        let hint = match (&model, inbound) {
            (Some(model), _) => Some(model.as_str()),
            (None, Inbound::Buffered(bytes)) => model_hint(bytes),
            (None, Inbound::Streaming(_)) => None,
        };
        log.model_label = hint.and_then(|model| current.generation.model_labels.label(model));
    }
    log.model = model.clone();
    let upstream = current
        .upstreams
        .route(model.as_deref(), class.family)
        .ok_or_else(|| ProxyError::NoUpstream(model.clone().unwrap_or_default()))?;
    log.upstream = Some(upstream.label.clone());
    Ok(upstream)
}

/// For a key limited to some models: the body's model, read as the strictest upstream would.
/// Only an empty body may name none; anything else a parser could read as another model (a
/// second `model`, trailing bytes, a byte-order mark, not JSON at all) is refused.
fn restricted_model(body: &[u8]) -> Result<Option<String>, ProxyError> {
    match body_model(body) {
        BodyModel::Named(model) => Ok(Some(model)),
        BodyModel::Absent if body.iter().all(u8::is_ascii_whitespace) => Ok(None),
        BodyModel::Absent => Err(ProxyError::ModelUnclear("the body names no model")),
        BodyModel::Unclear => Err(ProxyError::ModelUnclear(
            "not one JSON object with at most one string model",
        )),
    }
}

/// The body to send, compacted where it is one compaction reads; and what a retry after a
/// context-length error needs.
struct Compacting<'e> {
    body: ProxyBody,
    compacted: Option<Compacted>,
    /// The engine and API that read the body, when one did.
    engine: Option<(&'e CompactionEngine, Api)>,
    retry: Option<(&'e CompactionEngine, Api, Bytes)>,
}

async fn compact<'e>(
    current: &'e Current,
    class: &Class,
    headers: &HeaderMap,
    upstream: &Upstream,
    caller: Caller<'_>,
    inbound: Inbound,
    log: &mut RequestLog,
) -> Result<Compacting<'e>, ProxyError> {
    let bytes = match inbound {
        Inbound::Streaming(body) => {
            return Ok(Compacting {
                body: body.boxed_unsync(),
                compacted: None,
                engine: None,
                retry: None,
            })
        }
        Inbound::Buffered(bytes) => bytes,
    };
    let (Some(engine), Some(api)) = (&current.generation.compaction, class.api) else {
        return Ok(Compacting {
            body: body::full(bytes),
            compacted: None,
            engine: None,
            retry: None,
        });
    };
    let retry = current
        .generation
        .config
        .summarization
        .reactive
        .then(|| (engine, api, bytes.clone()));
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
        engine: Some((engine, api)),
        retry,
    })
}

/// The forwarded body, held to calibrate its model's count against the upstream's usage when
/// the model is due a sample.
fn calibration_sample(
    engine: Option<(&CompactionEngine, Api)>,
    upstream: &str,
    compacted: Option<&Compacted>,
    model: Option<&str>,
) -> Option<crate::compaction::engine::CalibrationSample> {
    let (engine, api) = engine?;
    let compacted = compacted?;
    // Routing skims the model only when it needs it; the sample checks the guess on parsing.
    let model = model.or_else(|| model_hint(&compacted.body))?;
    engine.calibration_sample(api, upstream, model, compacted)
}

/// The upstream's response, with what compaction did in its headers and the log.
fn respond(
    mut response: Response<ProxyBody>,
    compacted: Option<Compacted>,
    log: &mut RequestLog,
) -> Response<ProxyBody> {
    if let Some(result) = compacted {
        result.outcome.write_headers(response.headers_mut());
        log.compaction = Some(result.outcome);
    }
    response
}

/// `websocket: relay`: the upgrade goes to the upstream of the path's API, with the client's
/// credential replaced as on any request.
async fn relay_upgrade(
    app: &App,
    current: &Current,
    rest: &str,
    query: Option<&str>,
    mut parts: http::request::Parts,
    with_key: bool,
    log: &mut RequestLog,
) -> Result<Response<ProxyBody>, ProxyError> {
    let upstream = current
        .upstreams
        .route(None, UpstreamApi::of_path(rest))
        .ok_or_else(|| ProxyError::NoUpstream(String::new()))?;
    log.upstream = Some(upstream.label.clone());
    if with_key {
        for name in CREDENTIALS {
            parts.headers.remove(name);
        }
    }
    let query = forwarded_query(query, with_key, upstream);
    let uri = upstream
        .url_for(rest, query.as_deref())
        .map_err(|e| ProxyError::Internal(format!("cannot build upstream URL: {e}")))?;
    crate::relay::relay(upstream, uri, parts, app.relay_limits()).await
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

/// Where a request goes upstream.
enum Inbound {
    Buffered(Bytes),
    Streaming(GuardedBody),
}

/// The client key, when auth is on.
fn authenticate<'a>(
    auth: &'a Auth,
    headers: &HeaderMap,
) -> Result<Option<&'a ClientKey>, ProxyError> {
    if !auth.enabled() {
        return Ok(None);
    }
    match auth.authenticate(headers) {
        Ok(key) => Ok(Some(key)),
        Err(AuthFailure::Missing) => Err(ProxyError::MissingKey),
        Err(AuthFailure::Unknown) => Err(ProxyError::UnknownKey),
    }
}

/// What is refused before routing: methods that have no business at an API gateway, more than
/// one `Host`, transfer codings other than chunked, dot segments; `//` runs are collapsed.
fn checked_path(request: &Request<Incoming>) -> Result<String, ProxyError> {
    if matches!(*request.method(), Method::TRACE | Method::CONNECT) {
        return Err(ProxyError::MethodNotAllowed(request.method().to_string()));
    }
    if request.headers().get_all(header::HOST).iter().count() > 1 {
        return Err(ProxyError::BadRequest("more than one Host header".into()));
    }
    for coding in request.headers().get_all(header::TRANSFER_ENCODING) {
        let coding = coding.to_str().unwrap_or("?").trim();
        if !coding.eq_ignore_ascii_case("chunked") {
            return Err(ProxyError::UnsupportedTransferEncoding(coding.to_string()));
        }
    }
    normalized_path(request.uri().path())
}

/// `path` with `//` runs collapsed; a `.` or `..` segment, plain or percent-encoded, is an error
/// rather than something to resolve (no client of an API sends one). An upstream, or a proxy in
/// front of it, may decode a path once or twice before resolving it, so the check is made on
/// every decoding, and a separator that only decoding reveals (`%2f`, `%5c`, `\`) is refused.
fn normalized_path(path: &str) -> Result<String, ProxyError> {
    let refuse = |why: &str| ProxyError::BadRequest(format!("path '{path}' has {why}"));
    let is_dot = |segment: &str| segment == "." || segment == "..";
    let mut decoded = std::borrow::Cow::Borrowed(path);
    for _ in 0..MAX_PATH_DECODINGS {
        if decoded.contains('\\') {
            return Err(refuse("a backslash"));
        }
        if decoded.split('/').any(is_dot) {
            return Err(refuse("a dot segment"));
        }
        let next = percent_encoding::percent_decode_str(&decoded).decode_utf8_lossy();
        if next == decoded {
            break;
        }
        if next.matches('/').count() != decoded.matches('/').count() {
            return Err(refuse("an encoded separator"));
        }
        decoded = std::borrow::Cow::Owned(next.into_owned());
    }
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// Decodings of a path checked for what they reveal: more than any server in a chain applies.
const MAX_PATH_DECODINGS: usize = 3;

/// Query parameters that carry a credential (Gemini's `key`, many gateways' `api_key`).
const QUERY_CREDENTIALS: [&str; 6] = [
    "key",
    "api_key",
    "api-key",
    "apikey",
    "access_token",
    "token",
];

/// The query without its credential parameters, when the upstream is not to get the client's
/// credential (a compactor key, or the upstream has a key of its own): a key in the query
/// string is removed as the credential headers are. None when nothing is left.
/// The query sent upstream: without its credential parameters whenever the credential headers
/// are replaced too (the client presented a compactor key, or the upstream has its own).
fn forwarded_query(query: Option<&str>, keyed: bool, upstream: &Upstream) -> Option<String> {
    match query {
        Some(query) if keyed || upstream.credential().is_some() => query_without_credentials(query),
        query => query.map(str::to_string),
    }
}

fn query_without_credentials(query: &str) -> Option<String> {
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or_default();
            let name = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
            !QUERY_CREDENTIALS
                .iter()
                .any(|credential| name.eq_ignore_ascii_case(credential))
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// What compactor answers itself: health and readiness, and the metrics unless they have a
/// listener of their own (`admin.listen`). `on_admin` is that listener.
pub fn local_route<B>(
    app: &App,
    request: &Request<B>,
    on_admin: bool,
) -> Option<Response<ProxyBody>> {
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        return None;
    }
    let json = |status: StatusCode, text: &'static str| (status, "application/json", text.into());
    let (status, content_type, text): (StatusCode, &str, String) = match request.uri().path() {
        "/healthz" => json(StatusCode::OK, r#"{"status":"ok"}"#),
        "/readyz" if app.is_ready() => json(StatusCode::OK, r#"{"status":"ready"}"#),
        "/readyz" => json(StatusCode::SERVICE_UNAVAILABLE, r#"{"status":"not_ready"}"#),
        "/metrics"
            if app.metrics().enabled() && (on_admin || app.config().admin.listen.is_none()) =>
        {
            (
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                app.render_metrics(),
            )
        }
        _ => return None,
    };
    let mut response = Response::new(body::full(text));
    *response.status_mut() = status;
    if let Ok(value) = HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    Some(response)
}

fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| {
            v.split(',')
                .any(|p| p.trim().eq_ignore_ascii_case("websocket"))
        })
}

fn is_json_post(method: &Method, headers: &HeaderMap) -> bool {
    method == Method::POST
        && headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                let mime = v
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase();
                mime == "application/json" || mime.ends_with("+json")
            })
            .unwrap_or(false)
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_collapsed_and_dot_segments_refused() {
        assert_eq!(
            normalized_path("/v1//chat///completions").unwrap(),
            "/v1/chat/completions"
        );
        assert_eq!(normalized_path("/v1/models/").unwrap(), "/v1/models/");
        assert_eq!(normalized_path("/").unwrap(), "/");
        assert_eq!(normalized_path("//").unwrap(), "/");
        for bad in [
            "/v1/../admin",
            "/v1/./models",
            "/v1/%2e%2e/admin",
            "/v1/%2E/x",
            "/v1/.%2e/x",
            "/..",
        ] {
            assert!(normalized_path(bad).is_err(), "{bad}");
        }
        assert_eq!(normalized_path("/v1/a..b/.c").unwrap(), "/v1/a..b/.c");
    }
}
