//! Who a summary belongs to: summaries are only ever shared within one scope, a tenant (a hash
//! of the client's credential) and a summarizer fingerprint (everything that changes what a
//! summary says).

use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::compaction::planner::digest::{hash_parts, Digest};
use crate::config::SummarizationConfig;
use crate::headers::{CREDENTIALS, CREDENTIAL_COUNT, FIRST_CREDENTIALS};

/// Who sent a request, as compaction needs to know.
#[derive(Debug, Clone, Copy, Default)]
pub struct Caller<'a> {
    /// The client key's name when auth is on: its triggers, and with its digest the tenant of
    /// its summaries.
    pub key: Option<&'a str>,
    /// The SHA-256 of the client key itself: two deployments that both name a key `team` are
    /// still two tenants.
    pub key_digest: Option<[u8; 32]>,
    /// Whether `x-compactor: force` is honoured for this caller.
    pub may_force: bool,
    /// Whether this caller's own summarization instructions write its summaries.
    pub may_instruct: bool,
    /// The address the request came from.
    pub address: Option<IpAddr>,
}

#[derive(Clone, Copy)]
pub struct Scope {
    /// The deployment the summaries are shared within (see `SummaryStore::deployment`).
    pub deployment: [u8; 32],
    pub tenant: [u8; 32],
    pub fingerprint: [u8; 32],
}

impl Scope {
    /// Seeds the prefix chain: a chain digest is then the cache key of that prefix in this scope.
    pub fn seed(&self) -> Digest {
        hash_parts([self.deployment.as_slice(), &self.tenant, &self.fingerprint])
    }
}

/// What identifies a tenant: the client key's name when auth is on, else the credential
/// headers the client sent (cheap reference-counted copies), hashed only when needed.
#[derive(Clone)]
pub enum Credentials {
    Key {
        name: String,
        digest: [u8; 32],
    },
    /// Auth off: the headers, and the address they came from, since anyone may send any
    /// headers.
    Headers {
        values: [Option<HeaderValue>; CREDENTIAL_COUNT],
        address: Option<IpAddr>,
    },
}

impl Credentials {
    pub fn of(caller: Caller<'_>, headers: &HeaderMap) -> Credentials {
        match caller.key {
            Some(name) => Credentials::Key {
                name: name.to_string(),
                digest: caller.key_digest.unwrap_or_default(),
            },
            None => Credentials::Headers {
                values: CREDENTIALS.map(|name| headers.get(name).cloned()),
                address: caller.address,
            },
        }
    }

    /// Whom summarizer calls are charged to: the tenant; with auth off also the client's
    /// address, since a client can name itself another tenant by changing a header but cannot
    /// so easily change where it connects from. Not a loopback address: every client on the
    /// machine has it, so it names none of them (several local agents, each with its own
    /// provider key, keep their own budgets).
    pub fn accounts(&self, tenant: [u8; 32]) -> Vec<[u8; 32]> {
        match self {
            Credentials::Headers {
                address: Some(address),
                ..
            } if !address.to_canonical().is_loopback() => {
                let canonical = address.to_canonical().to_string();
                vec![
                    tenant,
                    hash_parts([b"address".as_slice(), canonical.as_bytes()]),
                ]
            }
            _ => vec![tenant],
        }
    }

    /// What compactor's sealed items are bound to: something a client keeps when its secret
    /// changes. With auth on, the key's name (not its secret, which an operator rotates); with
    /// auth off, the deployment itself (the sealing keys are its own): no header a client sends
    /// survives its token being rotated, and with auth off any client may use the deployment.
    pub fn sealing_tenant(&self) -> [u8; 32] {
        match self {
            Credentials::Key { name, .. } => {
                hash_parts([b"sealed for key".as_slice(), name.as_bytes()])
            }
            Credentials::Headers { .. } => hash_parts([b"sealed for the deployment".as_slice()]),
        }
    }

    /// A hash of the client's identity: tenants never share summaries.
    pub fn tenant(&self) -> [u8; 32] {
        match self {
            Credentials::Key { name, digest } => {
                hash_parts([b"key".as_slice(), name.as_bytes(), digest])
            }
            Credentials::Headers { values, .. } => {
                let names = CREDENTIALS;
                let named: Vec<(&HeaderName, Option<&HeaderValue>)> = names
                    .iter()
                    .zip(values.iter().map(Option::as_ref))
                    .enumerate()
                    .filter(|(i, (_, value))| *i < FIRST_CREDENTIALS || value.is_some())
                    .map(|(_, pair)| pair)
                    .collect();
                let values = named
                    .iter()
                    .map(|(_, value)| value.map(HeaderValue::as_bytes).unwrap_or(b""));
                hash_parts(
                    named
                        .iter()
                        .map(|(name, _)| name.as_str().as_bytes())
                        .chain(values),
                )
            }
        }
    }
}

/// Everything that changes what a summary says: summaries made differently never mix. A
/// client's own prompt (`client_prompt`) stands in the place of `summary_prompt`.
pub fn fingerprint(
    config: &SummarizationConfig,
    client_prompt: Option<&str>,
    model: &str,
    upstream: &str,
) -> [u8; 32] {
    let description = serde_json::json!({
        "model": model,
        "upstream": upstream,
        "prompt": client_prompt.or(config.summary_prompt.as_deref()),
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
    fn sealed_items_are_bound_to_what_survives_a_rotated_secret() {
        let with_key = |name: &str, digest: u8| Credentials::Key {
            name: name.into(),
            digest: [digest; 32],
        };
        let rotated = (with_key("team", 1), with_key("team", 2));
        assert_eq!(rotated.0.sealing_tenant(), rotated.1.sealing_tenant());
        assert_ne!(
            rotated.0.tenant(),
            rotated.1.tenant(),
            "summaries stay per secret"
        );
        assert_ne!(
            with_key("team", 1).sealing_tenant(),
            with_key("other", 1).sealing_tenant()
        );
        let headers = |token: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("authorization", HeaderValue::from_str(token).unwrap());
            Credentials::of(Caller::default(), &headers)
        };
        assert_eq!(
            headers("Bearer a").sealing_tenant(),
            headers("Bearer b").sealing_tenant()
        );
        assert_ne!(
            headers("Bearer a").sealing_tenant(),
            with_key("team", 1).sealing_tenant()
        );
    }

    #[test]
    fn a_credential_added_later_names_a_tenant_only_when_it_is_sent() {
        let caller = Caller {
            key: None,
            key_digest: None,
            may_force: false,
            may_instruct: false,
            address: None,
        };
        let tenant = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(*name, HeaderValue::from_static(value));
            }
            Credentials::of(caller, &headers).tenant()
        };
        // The tenant a client without Google's header had before that header was read.
        let before = hash_parts(
            [b"authorization".as_slice(), b"api-key", b"x-api-key"]
                .into_iter()
                .chain([b"Bearer a".as_slice(), b"", b""]),
        );
        assert_eq!(tenant(&[("authorization", "Bearer a")]), before);
        let google = tenant(&[("x-goog-api-key", "g")]);
        assert_ne!(google, tenant(&[("x-goog-api-key", "h")]));
        assert_ne!(google, tenant(&[]));
    }

    #[test]
    fn scopes_never_share_keys() {
        let a = Scope {
            deployment: [0; 32],
            tenant: [1; 32],
            fingerprint: [9; 32],
        };
        let b = Scope {
            tenant: [2; 32],
            ..a
        };
        let c = Scope {
            fingerprint: [8; 32],
            ..a
        };
        let d = Scope {
            deployment: [7; 32],
            ..a
        };
        assert_ne!(a.seed(), b.seed());
        assert_ne!(a.seed(), c.seed());
        assert_ne!(a.seed(), d.seed());
    }

    #[test]
    fn a_clients_own_prompt_is_a_scope_of_its_own() {
        let config = SummarizationConfig::default();
        let plain = fingerprint(&config, None, "m", "u");
        let asked = fingerprint(&config, Some("Only file names.\n\n{messages}"), "m", "u");
        let other = fingerprint(&config, Some("Errors verbatim.\n\n{messages}"), "m", "u");
        assert_ne!(plain, asked);
        assert_ne!(asked, other);
        // The client asking for the configured prompt shares its summaries.
        let configured = SummarizationConfig {
            summary_prompt: Some("Errors verbatim.\n\n{messages}".into()),
            ..SummarizationConfig::default()
        };
        assert_eq!(fingerprint(&configured, None, "m", "u"), other);
    }

    #[test]
    fn with_auth_off_a_remote_address_is_charged_too_and_loopback_is_not() {
        let accounts = |key: &'static str, address: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("authorization", HeaderValue::from_static(key));
            let caller = Caller {
                address: Some(address.parse().unwrap()),
                ..Caller::default()
            };
            let credentials = Credentials::of(caller, &headers);
            credentials.accounts(credentials.tenant())
        };
        let remote = accounts("Bearer sk-a", "203.0.113.7");
        assert_eq!(remote.len(), 2);
        // Another credential from the same address shares the address's account.
        let dodging = accounts("Bearer sk-b", "203.0.113.7");
        assert_ne!(remote[0], dodging[0]);
        assert_eq!(remote[1], dodging[1]);
        assert_eq!(accounts("Bearer sk-a", "::ffff:203.0.113.7")[1], remote[1]);
        assert_eq!(accounts("Bearer sk-a", "127.0.0.1").len(), 1);
        assert_eq!(accounts("Bearer sk-a", "::1").len(), 1);
        // With auth on the key is the account, wherever it connects from.
        let caller = Caller {
            key: Some("team"),
            key_digest: Some([1; 32]),
            address: Some("203.0.113.7".parse().unwrap()),
            ..Caller::default()
        };
        let credentials = Credentials::of(caller, &HeaderMap::new());
        assert_eq!(credentials.accounts(credentials.tenant()).len(), 1);
    }

    #[test]
    fn two_keys_of_one_name_are_two_tenants() {
        let headers = HeaderMap::new();
        let tenant = |digest: [u8; 32]| {
            let caller = Caller {
                key: Some("team"),
                key_digest: Some(digest),
                may_force: false,
                may_instruct: false,
                address: None,
            };
            Credentials::of(caller, &headers).tenant()
        };
        assert_ne!(tenant([1; 32]), tenant([2; 32]));
        assert_eq!(tenant([1; 32]), tenant([1; 32]));
    }
}
