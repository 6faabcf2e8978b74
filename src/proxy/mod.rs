//! The request handler, as its phases: local routes → address → authorize → classify → read
//! or stream the body → route → compact (chat completions, Responses, Messages) → send, with
//! its one retry (`compaction::retry`) → respond. Sending lives with the upstream.
//! Logging happens once, when the response body ends (see [`crate::access_log::LoggedBody`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use tracing::Instrument;

use crate::access_log::{LoggedBody, RequestLog};
use crate::apis;
use crate::app::{App, Current};
use crate::auth::ClientKey;
use crate::body::{self, ProxyBody};
use crate::compaction::engine::Compacted;
use crate::compaction::overflow::may_be_overflow;
use crate::compaction::retry::Retry;
use crate::compaction::scope::Caller;
use crate::error::ProxyError;
use crate::headers::CREDENTIALS;
use crate::inbound::ClientAddress;
use crate::metrics::Route;
use crate::routing::forwarded_path;
use crate::served;
use crate::telemetry;
use crate::upstream::{Target, Upstream};

use address::{address, forwarded_query, Addressed, UnderPrefix};
use compacting::{calibration_sample, compact, serve, Compacting, Served};
use facts::{authorize, classify, read, route, Facts, Inbound};

mod address;
mod compacting;
mod compress;
mod facts;
mod lookups;

/// The hyper service: never fails; every error becomes a response in the shape of the API the
/// path belongs to (OpenAI's, Anthropic's on `/messages…`, Google's on Gemini's paths).
pub async fn handle(
    app: Arc<App>,
    request: Request<Incoming>,
) -> Result<Response<LoggedBody>, Infallible> {
    let started = Instant::now();
    let current = app.current();
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
            let prefix = &current.generation.config.prefix;
            error.into_response(error_provider(prefix, log.uri.path()))
        }
    };
    log.status = response.status().as_u16();
    log.headers_after = Some(started.elapsed());
    Ok(response.map(|b| LoggedBody::new(b, log, started)))
}

/// Whose error shape a path's errors take: the API it belongs to. Decided only when there is an
/// error to answer, off the path of every request that has none.
fn error_provider(prefix: &str, path: &str) -> &'static dyn crate::provider::Provider {
    apis::provider_claiming(path).unwrap_or_else(|| {
        apis::provider_for_path(forwarded_path(prefix, path).unwrap_or_default())
    })
}

/// The phases of one proxied request, in order: address → authorize → classify → read →
/// route → served contracts → compact → send (with its one retry) → respond. Each phase notes
/// what it learned in `log`, written once the response body ends.
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
    let client_address = request.extensions().get::<ClientAddress>().map(|a| a.0);
    let addressed = match address(&current.generation.config, request, log)? {
        Addressed::Here(response) => return Ok(response),
        Addressed::Upstream(addressed) => addressed,
    };
    let auth = &current.generation.auth;
    let query = addressed.query.as_deref();
    let key = authorize(auth, &addressed.parts.headers, query, log)?;
    if addressed.upgrade {
        return relay_upgrade(app, current, addressed, key, log).await;
    }
    let UnderPrefix {
        rest,
        query,
        parts,
        incoming,
        ..
    } = addressed;
    let facts = classify(current, &rest, &parts.method, key, log);
    let (inbound, _reservation) = read(app, current, &facts, &parts, incoming, log).await?;
    if facts.engine_contract {
        let caller = facts.caller(current, client_address);
        return compress::answer(current, key, &parts.headers, inbound, caller, log).await;
    }
    let request = Classified {
        facts,
        parts,
        rest,
        query,
        client_address,
    };
    through_upstream(app, current, request, inbound, log).await
}

/// A request past the phases that read it: what it is, and where it was addressed.
struct Classified<'c> {
    facts: Facts<'c>,
    parts: http::request::Parts,
    rest: String,
    query: Option<String>,
    client_address: Option<std::net::IpAddr>,
}

/// The phases around the upstream call: route → served contracts → compact → send (with its
/// one retry) → the served contracts' addition → respond.
async fn through_upstream(
    app: &App,
    current: &Current,
    request: Classified<'_>,
    inbound: Inbound,
    log: &mut RequestLog,
) -> Result<Response<ProxyBody>, ProxyError> {
    let Classified {
        facts,
        mut parts,
        rest,
        query,
        client_address,
    } = request;
    let caller = facts.caller(current, client_address);
    let upstream = route(current, &facts, &inbound, log)?;
    let ask = (upstream, caller);
    let served = serve(
        current,
        &facts,
        &rest,
        ask,
        &mut parts.headers,
        inbound,
        log,
    )
    .await?;
    let (inbound, addition) = match served {
        Served::Answered(response) => return Ok(response),
        Served::Go {
            inbound,
            compacted,
            addition,
        } => ((inbound, compacted), addition),
    };
    let compacting = compact(
        current,
        &facts,
        &parts.headers,
        upstream,
        caller,
        inbound,
        log,
    );
    let mut compacting = compacting.await?;
    let keyed = facts.key.is_some();
    let query = forwarded_query(query.as_deref(), keyed, upstream);
    let mut outgoing = Outgoing {
        target: Target::new(
            upstream,
            parts.method,
            upstream_uri(upstream, &rest, query)?,
        ),
        headers: without_compactor_key(parts.headers, keyed),
        caller,
    };
    let rounds = lookups::offer(current, &facts, &mut compacting, &mut outgoing, log);
    let offered = rounds.as_ref().map(|rounds| &rounds.body);
    let (response, compacted) = send(app, outgoing, compacting, offered, log).await?;
    let sent = compacted.as_ref().map(|c| &c.body);
    let response = match rounds.filter(|rounds| lookups::still_offered(&rounds.body, sent)) {
        Some(rounds) => crate::retrieval::after_upstream(response, rounds).await?,
        None => response,
    };
    let response = match addition.filter(|_| response.status().is_success()) {
        Some(addition) => served::after_upstream(response, addition.as_ref(), upstream).await?,
        None => response,
    };
    Ok(respond(response, compacted, log))
}

/// The request as it goes upstream, less its body.
struct Outgoing<'a> {
    target: Target<'a>,
    headers: HeaderMap,
    caller: Caller<'a>,
}

/// The client's credential headers taken out when it is a compactor key: that never leaves
/// compactor.
fn without_compactor_key(mut headers: HeaderMap, keyed: bool) -> HeaderMap {
    if keyed {
        for name in CREDENTIALS {
            headers.remove(name);
        }
    }
    headers
}

fn upstream_uri(upstream: &Upstream, rest: &str, query: Option<String>) -> Result<Uri, ProxyError> {
    upstream
        .url_for(rest, query.as_deref())
        .map_err(|e| ProxyError::Internal(format!("cannot build upstream URL: {e}")))
}

/// The send phase: the upstream call, its one retry after a context-length error, and the
/// calibration sample a successful answer's usage will feed. `offered`: the body that carries
/// the lookup tool, when the request was offered it.
async fn send(
    app: &App,
    outgoing: Outgoing<'_>,
    compacting: Compacting<'_>,
    offered: Option<&bytes::Bytes>,
    log: &mut RequestLog,
) -> Result<(Response<ProxyBody>, Option<Compacted>), ProxyError> {
    let Outgoing {
        target,
        headers,
        caller,
    } = outgoing;
    let Compacting {
        body,
        mut compacted,
        engine,
        retry,
        ..
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
    if let Some(retry) = retry.filter(|_| may_be_overflow(response.status().as_u16())) {
        response = retry
            .after_overflow(&target, response, &mut compacted)
            .await?;
    }
    log.upstream_wait = target.waited();
    // Neither the answer to a body offered lookups (every round's input, summed, after one)
    // nor that body (compactor's own tool and index: ids and paths, which count unlike the
    // conversation) says how the conversation counts.
    let sent = compacted.as_ref().map(|c| &c.body);
    let sent_offered = offered.is_some_and(|offered| lookups::still_offered(offered, sent));
    if response.status().is_success() && !sent_offered {
        let upstream = &target.upstream.name;
        let model = log.model.as_deref();
        log.calibration = calibration_sample(engine, upstream, compacted.as_ref(), model);
    }
    Ok((response, compacted))
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
    addressed: UnderPrefix,
    key: Option<&ClientKey>,
    log: &mut RequestLog,
) -> Result<Response<ProxyBody>, ProxyError> {
    if key.is_some_and(ClientKey::restricts_models) {
        // A relayed socket is never read, so the model of its frames cannot be checked.
        return Err(ProxyError::UpgradeRefused(
            crate::error::UPGRADE_FOR_LIMITED_KEY,
        ));
    }
    let UnderPrefix {
        rest, query, parts, ..
    } = addressed;
    let with_key = key.is_some();
    let upstream = current
        .upstreams
        .route(None, apis::provider_for_path(&rest).family())
        .ok_or_else(|| ProxyError::NoUpstream(String::new()))?;
    log.upstream = Some(upstream.label.clone());
    let mut parts = parts;
    parts.headers = without_compactor_key(std::mem::take(&mut parts.headers), with_key);
    let query = forwarded_query(query.as_deref(), with_key, upstream);
    let uri = upstream_uri(upstream, &rest, query)?;
    crate::relay::relay(upstream, uri, parts, app.relay_limits()).await
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
