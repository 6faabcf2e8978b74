//! What a request is, read once: its key, its API and served contracts (by path), whether its
//! body is read whole, its model (checked against the key's list) and the upstream it goes to.
//! Every later phase reads these facts; none re-reads the body for them.

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::Method;
use hyper::body::Incoming;

use crate::access_log::RequestLog;
use crate::apis::{self, Api, ApiRequest};
use crate::app::{App, Current};
use crate::auth::{Auth, AuthFailure, ClientKey};
use crate::compaction::scope::Caller;
use crate::config::UpstreamApi;
use crate::error::ProxyError;
use crate::inbound::{read_whole, BufferBudget, GuardedBody, ReadError, Reservation};
use crate::metrics::Route;
use crate::routing::{body_model, model_hint, model_of, BodyModel};
use crate::served::Contracts;
use crate::upstream::Upstream;

/// The engine contract's path under the API prefix (`super::compress`).
const ENGINE_CONTRACT_PATH: &str = "/compress";

/// What kind of request it is, before its body is read.
pub(super) struct Facts<'c> {
    /// The client key, when auth is on.
    pub key: Option<&'c ClientKey>,
    /// The API compactor reads it as, when it does, with what its path says.
    pub api: Option<ApiRequest>,
    /// The contracts served for its path, when compactor serves any there.
    pub contracts: Option<&'static dyn Contracts>,
    /// Its upstream family, by path.
    pub family: UpstreamApi,
    /// The model its path names (Gemini's), read there instead of from the body.
    pub path_model: Option<String>,
    /// Whether routing or the key's model list needs the body's model.
    pub needs_model: bool,
    /// The key may use some models only: whatever the method or content type, the body is read
    /// and must name its model unambiguously.
    pub restricted: bool,
    /// A call of the engine contract (`POST {prefix}/compress`), answered here.
    pub engine_contract: bool,
    /// How its API carries lookups of what a summary left out, when it does.
    pub retrieval: Option<&'static dyn crate::retrieval::Wire>,
}

/// Where a request goes upstream.
pub(super) enum Inbound {
    Buffered(Bytes),
    Streaming(GuardedBody),
}

/// The client key, when auth is on.
pub(super) fn authorize<'a>(
    auth: &'a Auth,
    headers: &HeaderMap,
    query: Option<&str>,
    log: &mut RequestLog,
) -> Result<Option<&'a ClientKey>, ProxyError> {
    if !auth.enabled() {
        return Ok(None);
    }
    let query_key = query.and_then(super::address::query_key);
    let key = match auth.authenticate(headers, query_key.as_deref()) {
        Ok(key) => key,
        Err(AuthFailure::Missing) => return Err(ProxyError::MissingKey),
        Err(AuthFailure::Unknown) => return Err(ProxyError::UnknownKey),
    };
    log.key = Some(key.name.clone());
    Ok(Some(key))
}

pub(super) fn classify<'c>(
    current: &Current,
    rest: &str,
    method: &Method,
    key: Option<&'c ClientKey>,
    log: &mut RequestLog,
) -> Facts<'c> {
    let post = *method == Method::POST;
    let api = Some(rest).filter(|_| post).and_then(Api::for_path);
    let provider = apis::provider_for_path(rest);
    let generation = api
        .map(Api::label)
        .or_else(|| provider.generation_label(rest).filter(|_| post));
    log.route = generation.map_or(Route::Other, Route::Api);
    let family = provider.family();
    let path_model = provider.path_model(rest).map(str::to_string);
    let restricted = key.is_some_and(|k| k.restricts_models()) && path_model.is_none();
    Facts {
        key,
        api: api.map(|api| api.request_at(rest)),
        contracts: Some(rest).filter(|_| post).and_then(Api::contracts_for),
        family,
        needs_model: path_model.is_none()
            && (current.upstreams.routing_needs_model(family) || restricted),
        restricted,
        path_model,
        engine_contract: post && rest == ENGINE_CONTRACT_PATH,
        retrieval: api.and_then(Api::retrieval),
    }
}

impl Facts<'_> {
    /// Who sent it, as compaction scopes and permits it.
    pub fn caller(&self, current: &Current, address: Option<std::net::IpAddr>) -> Caller<'_> {
        let summarization = &current.generation.config.summarization;
        Caller {
            key: self.key.map(|k| k.name.as_str()),
            key_digest: self.key.map(ClientKey::digest),
            may_force: self
                .key
                .map_or(summarization.allow_force, |k| k.allow_force),
            may_instruct: self
                .key
                .map_or(summarization.client_instructions, |k| k.client_instructions),
            address,
        }
    }
}

/// The body: read whole when compaction or the model is needed (the reservation held until
/// the upstream has answered bounds the bytes all buffered requests pin), else streamed on.
pub(super) async fn read(
    app: &App,
    current: &Current,
    facts: &Facts<'_>,
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
    let compacting = (facts.api.is_some() || facts.contracts.is_some() || facts.engine_contract)
        && current.generation.compaction.is_some();
    let body = GuardedBody::new(incoming, bounds);
    if facts.restricted
        || (is_json_post(&parts.method, &parts.headers) && (compacting || facts.needs_model))
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
pub(super) fn route<'c>(
    current: &'c Current,
    facts: &Facts<'_>,
    inbound: &Inbound,
    log: &mut RequestLog,
) -> Result<&'c Upstream, ProxyError> {
    // Skimming the model is a pass over the whole body: only paid for when routing or the
    // key's model list needs it (compaction reads the body on its own terms).
    let model = match (inbound, facts.key) {
        _ if facts.path_model.is_some() => {
            let model = facts.path_model.clone();
            if let (Some(key), Some(model)) = (facts.key, &model) {
                if !key.allows_model(model) {
                    return Err(ProxyError::ModelNotAllowed(model.clone()));
                }
            }
            model
        }
        (Inbound::Buffered(bytes), Some(key)) if facts.restricted => {
            let model = restricted_model(bytes)?;
            if let Some(model) = &model {
                if !key.allows_model(model) {
                    return Err(ProxyError::ModelNotAllowed(model.clone()));
                }
            }
            model
        }
        (Inbound::Buffered(bytes), _) if facts.needs_model => model_of(bytes),
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
        .route(model.as_deref(), facts.family)
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
