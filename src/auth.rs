//! Client keys (`auth.keys`): which callers may use the proxy, under which name, for which
//! models. Keys are kept only as SHA-256 digests and compared in constant time.

use http::header::{HeaderMap, AUTHORIZATION};
use sha2::{Digest as _, Sha256};
use wildmatch::WildMatch;

use crate::config::{AuthConfig, ClientKeyConfig};
use crate::headers::{API_KEY, X_API_KEY, X_GOOG_API_KEY};

/// A configured client key, as the request path sees it.
pub struct ClientKey {
    /// The tenant of this key's summaries and its label in logs.
    pub name: String,
    digest: [u8; 32],
    models: Vec<WildMatch>,
    every_model: bool,
    /// Whether `x-compactor: force` is honoured for this key.
    pub allow_force: bool,
    /// Whether the client's own summarization instructions write this key's summaries.
    pub client_instructions: bool,
}

impl ClientKey {
    fn new(config: &ClientKeyConfig) -> ClientKey {
        let digest = match (&config.key, &config.key_sha256) {
            (Some(key), _) => Sha256::digest(key.expose().as_bytes()).into(),
            (None, Some(hex)) => decode_hex(hex).unwrap_or([0; 32]),
            // validate() refuses a key with neither; nothing hashes to all zeroes.
            (None, None) => [0; 32],
        };
        ClientKey {
            name: config.name.clone(),
            digest,
            models: config.models.iter().map(|m| WildMatch::new(m)).collect(),
            every_model: config.models.iter().any(|m| m == "*"),
            allow_force: config.allow_force,
            client_instructions: config
                .client_instructions
                .unwrap_or_else(|| config.models.iter().any(|m| m == "*")),
        }
    }

    /// The SHA-256 of the key itself.
    pub fn digest(&self) -> [u8; 32] {
        self.digest
    }

    /// Whether this key may use `model`.
    pub fn allows_model(&self, model: &str) -> bool {
        self.every_model || self.models.iter().any(|m| m.matches(model))
    }

    /// Whether this key may use some models only (its requests' bodies must be read).
    pub fn restricts_models(&self) -> bool {
        !self.every_model
    }
}

fn decode_hex(hex: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

pub struct Auth {
    keys: Vec<ClientKey>,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No key in `Authorization: Bearer`, `x-api-key`, `api-key`, `x-goog-api-key` or a
    /// `key` query parameter.
    Missing,
    /// A key that matches none configured.
    Unknown,
}

impl Auth {
    pub fn from_config(config: &AuthConfig) -> Auth {
        Auth {
            keys: config.keys.iter().map(ClientKey::new).collect(),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The key a request presents. Every configured key is compared, without an early exit, so
    /// the time taken says nothing about which key came close.
    /// `query_key`: a `key` query parameter, where Google's clients put their key when they
    /// send no header.
    pub fn authenticate(
        &self,
        headers: &HeaderMap,
        query_key: Option<&str>,
    ) -> Result<&ClientKey, AuthFailure> {
        let presented = presented_key(headers)
            .or_else(|| query_key.map(str::as_bytes).filter(|key| !key.is_empty()))
            .ok_or(AuthFailure::Missing)?;
        let digest: [u8; 32] = Sha256::digest(presented).into();
        let mut found = None;
        for key in &self.keys {
            let difference = key
                .digest
                .iter()
                .zip(digest.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if difference == 0 && found.is_none() {
                found = Some(key);
            }
        }
        found.ok_or(AuthFailure::Unknown)
    }
}

/// The key in `Authorization: Bearer …`, else `x-api-key`, `api-key` or `x-goog-api-key`.
fn presented_key(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(value) = headers.get(AUTHORIZATION) {
        let bytes = value.as_bytes();
        if bytes.len() > 7 && bytes[..7].eq_ignore_ascii_case(b"bearer ") {
            return Some(bytes[7..].trim_ascii()).filter(|k| !k.is_empty());
        }
    }
    [X_API_KEY, API_KEY, X_GOOG_API_KEY]
        .iter()
        .filter_map(|name| headers.get(name))
        .map(|value| value.as_bytes().trim_ascii())
        .find(|key| !key.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn auth() -> Auth {
        let hex: String = Sha256::digest(b"sk-hashed")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Auth::from_config(&AuthConfig {
            keys: vec![
                ClientKeyConfig {
                    name: "alice".into(),
                    key: Some(Secret::new("sk-alice")),
                    models: vec!["gpt-4o*".into()],
                    ..ClientKeyConfig::default()
                },
                ClientKeyConfig {
                    name: "bob".into(),
                    key_sha256: Some(hex),
                    ..ClientKeyConfig::default()
                },
            ],
            disabled: false,
        })
    }

    fn headers(name: &str, value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
        headers
    }

    #[test]
    fn keys_are_found_in_every_header_form_and_by_hash() {
        let auth = auth();
        let alice = auth.authenticate(&headers("authorization", "Bearer sk-alice"), None);
        assert_eq!(alice.map(|k| k.name.as_str()), Ok("alice"));
        let bob = auth.authenticate(&headers("x-api-key", "sk-hashed"), None);
        assert_eq!(bob.map(|k| k.name.as_str()), Ok("bob"));
        let azure = auth.authenticate(&headers("api-key", "sk-alice"), None);
        assert_eq!(azure.map(|k| k.name.as_str()), Ok("alice"));
        assert_eq!(
            auth.authenticate(&headers("authorization", "Bearer sk-nope"), None)
                .err(),
            Some(AuthFailure::Unknown)
        );
        assert_eq!(
            auth.authenticate(&HeaderMap::new(), None).err(),
            Some(AuthFailure::Missing)
        );
        assert_eq!(
            auth.authenticate(&headers("authorization", "Basic sk-alice"), None)
                .err(),
            Some(AuthFailure::Missing)
        );
    }

    #[test]
    fn model_restrictions_are_globs() {
        let auth = auth();
        let alice = auth
            .authenticate(&headers("x-api-key", "sk-alice"), None)
            .unwrap();
        assert!(alice.restricts_models());
        assert!(alice.allows_model("gpt-4o-mini"));
        assert!(!alice.allows_model("o3"));
        let bob = auth
            .authenticate(&headers("x-api-key", "sk-hashed"), None)
            .unwrap();
        assert!(!bob.restricts_models());
    }
}
