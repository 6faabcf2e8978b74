//! The first phase: where a request is addressed. Its path checked (no dot segments, one
//! `Host`, chunked only), placed under the API prefix, a WebSocket upgrade refused unless
//! relayed; and the query a request or relay forwards, without credential parameters where
//! the credential headers are replaced.

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::{Method, Request, Response};
use hyper::body::Incoming;

use crate::access_log::RequestLog;
use crate::body::{self, ProxyBody};
use crate::config::WebSocketMode;
use crate::error::ProxyError;
use crate::metrics::Route;
use crate::routing::forwarded_path;
use crate::upstream::Upstream;

/// Where a request is addressed, once its path is checked.
pub(super) enum Addressed {
    /// Answered here (a probe outside the API prefix).
    Here(Response<ProxyBody>),
    Upstream(UnderPrefix),
}

/// A request addressed under the API prefix.
pub(super) struct UnderPrefix {
    /// The path under the prefix.
    pub rest: String,
    pub query: Option<String>,
    pub parts: http::request::Parts,
    pub incoming: Incoming,
    pub upgrade: bool,
}

/// The path checked and placed under the API prefix; a WebSocket upgrade refused unless
/// relayed.
pub(super) fn address(
    config: &crate::config::Config,
    request: Request<Incoming>,
    log: &mut RequestLog,
) -> Result<Addressed, ProxyError> {
    let path = checked_path(&request)?;
    // An API whose paths carry their own version (Gemini's `/v1beta/models/…`) is forwarded
    // by its whole path, wherever the listen prefix is: when an upstream speaks it, so no
    // other upstream is sent a path outside the prefix.
    let whole = crate::apis::provider_claiming(&path)
        .filter(|provider| config.upstreams.iter().any(|u| u.api == provider.family()))
        .map(|_| path.as_str());
    let Some(rest) = whole.or_else(|| forwarded_path(&config.prefix, &path)) else {
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

/// The query sent upstream: without its credential parameters whenever the credential headers
/// are replaced too (the client presented a compactor key, or the upstream has its own). None
/// when nothing is left.
pub(super) fn forwarded_query(
    query: Option<&str>,
    keyed: bool,
    upstream: &Upstream,
) -> Option<String> {
    match query {
        Some(query) if keyed || upstream.credential().is_some() => query_without_credentials(query),
        query => query.map(str::to_string),
    }
}

/// The `key` query parameter, decoded: Google's clients send their key there when they send
/// no header.
pub(super) fn query_key(query: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let value = pair.strip_prefix("key=")?;
        let value = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .ok()?;
        Some(value.into_owned())
    })
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
