//! Every header name compactor defines, reads or strips, in one place.

use http::header::{self, HeaderMap, HeaderName};

/// Request header steering compaction: `off` or `force`.
pub const CONTROL: HeaderName = HeaderName::from_static("x-compactor");
/// Request header choosing the notice form for this request.
pub const NOTICE: HeaderName = HeaderName::from_static("x-compactor-notice");
/// Request headers that steer compactor itself and are never forwarded upstream.
pub const CONTROL_HEADERS: [HeaderName; 2] = [CONTROL, NOTICE];

/// Response header: what compaction did (`summarized`, `reused`, `cleared`, `truncated`,
/// `failed`, `skipped`).
pub const COMPACTION: HeaderName = HeaderName::from_static("x-compactor-compaction");
/// Response header: the token estimate before compaction.
pub const TOKENS_BEFORE: HeaderName = HeaderName::from_static("x-compactor-tokens-before");
/// Response header: the token estimate of what was forwarded.
pub const TOKENS_AFTER: HeaderName = HeaderName::from_static("x-compactor-tokens-after");
/// Response header: how the token counts were made: `calibrated` (the estimate's weights
/// learned from the upstream's own counts of this model) or `estimate` (the configured ratio).
pub const TOKENS_COUNT: HeaderName = HeaderName::from_static("x-compactor-tokens-count");
/// Response header: tool outputs the `clear_tool_outputs` stage replaced.
pub const OUTPUTS_CLEARED: HeaderName = HeaderName::from_static("x-compactor-tool-outputs-cleared");
/// Response header: messages the `truncate` stage dropped to fit the model's window.
pub const MESSAGES_DROPPED: HeaderName = HeaderName::from_static("x-compactor-messages-dropped");
/// Response header, audit mode: the outcome enforce would have had.
pub const AUDIT: HeaderName = HeaderName::from_static("x-compactor-audit");
/// Response header, audit mode: the tokens enforce would have forwarded.
pub const AUDIT_TOKENS_AFTER: HeaderName =
    HeaderName::from_static("x-compactor-audit-tokens-after");
/// Response header, audit mode: the summarizer tokens enforce would have spent.
pub const AUDIT_SUMMARIZER_TOKENS: HeaderName =
    HeaderName::from_static("x-compactor-audit-summarizer-tokens");
/// Response header, audit mode: the message where the upstream's cached prefix would have
/// stopped matching the previous request's (a new summary there).
pub const AUDIT_PREFIX_BREAK: HeaderName =
    HeaderName::from_static("x-compactor-audit-prefix-break");
/// Response header naming the error code on every response compactor generated itself.
pub const PROXY_ERROR: HeaderName = HeaderName::from_static("x-compactor-error");
/// Every response header compactor writes starts with this; an upstream may not send them.
pub const OWN_PREFIX: &str = "x-compactor-";

/// Azure's key header.
pub const API_KEY: HeaderName = HeaderName::from_static("api-key");
/// Anthropic's (and some gateways') key header.
pub const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
/// Google's key header.
pub const X_GOOG_API_KEY: HeaderName = HeaderName::from_static("x-goog-api-key");
/// The headers that carry a client's credential, in the order they identify a tenant.
pub const CREDENTIALS: [HeaderName; CREDENTIAL_COUNT] =
    [header::AUTHORIZATION, API_KEY, X_API_KEY, X_GOOG_API_KEY];
pub const CREDENTIAL_COUNT: usize = 4;
/// The credentials a tenant was always named by; one added later joins the name only when a
/// client sends it, so the tenants (and the summaries cached for them) of clients that do not
/// stay what they were.
pub const FIRST_CREDENTIALS: usize = 3;

/// Headers that describe one connection rather than the message (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes the hop-by-hop headers, including every header the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Removes every `x-compactor-*` header: on a response they must come from compactor alone, so
/// an upstream cannot make its own error look like one of ours.
pub fn strip_own(headers: &mut HeaderMap) {
    let own: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().starts_with(OWN_PREFIX))
        .cloned()
        .collect();
    for name in own {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-private"),
        );
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        headers.insert("x-kept", HeaderValue::from_static("yes"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
        assert_eq!(headers["x-kept"], "yes");
    }

    #[test]
    fn own_headers_are_stripped_and_others_kept() {
        let mut headers = HeaderMap::new();
        headers.insert(PROXY_ERROR, HeaderValue::from_static("spoofed"));
        headers.insert(COMPACTION, HeaderValue::from_static("reused"));
        headers.insert("x-compactorish", HeaderValue::from_static("kept"));
        strip_own(&mut headers);
        assert_eq!(headers.len(), 1);
        assert!(headers.contains_key("x-compactorish"));
    }
}
