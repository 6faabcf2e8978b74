//! Compaction items compactor makes for clients of a native compaction contract (OpenAI's
//! `/responses/compact`) carry their summary sealed: authenticated encryption (AES-256-GCM)
//! under the first of `sealing.keys`, bound to the tenant that asked. Only compactor can read
//! one, a changed byte or another tenant's item is refused, and every listed key opens, so a
//! key is rotated by putting the new one first and keeping the old one listed until the items
//! it sealed have aged out.
//!
//! The text form: `compactor.v1.` then URL-safe base64 (no padding) of the version byte, the
//! 12-byte nonce, and the ciphertext with its tag. The readable prefix is what tells compactor's
//! items from the provider's own (OpenAI's start `gAAAA`), which are forwarded untouched.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest as _, Sha256};

use crate::config::Secret;

pub const PREFIX: &str = "compactor.v1.";
const VERSION: u8 = 1;

/// What a compaction item's `encrypted_content` holds, as this deployment reads it.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// Sealed here, for this tenant: what was sealed.
    Plain(String),
    /// Not compactor's (the provider's own): forwarded as it came.
    Foreign,
    /// Marked as compactor's but no key opens it for this tenant: altered, sealed for another
    /// tenant, or under a key no longer listed.
    Refused,
}

pub struct Sealer {
    keys: Vec<LessSafeKey>,
    random: SystemRandom,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealer({} keys)", self.keys.len())
    }
}

impl Sealer {
    /// A sealer over `keys` (the first seals); None when there are none.
    pub fn new(keys: &[Secret]) -> Option<Sealer> {
        if keys.is_empty() {
            return None;
        }
        let keys = keys
            .iter()
            .map(|secret| {
                // Any string is a key: its digest, under a label of its own, is the AES key.
                let digest = Sha256::new()
                    .chain_update(b"compactor sealing v1\0")
                    .chain_update(secret.expose().as_bytes())
                    .finalize();
                let unbound = UnboundKey::new(&AES_256_GCM, &digest)
                    .expect("a SHA-256 digest is an AES-256 key");
                LessSafeKey::new(unbound)
            })
            .collect();
        Some(Sealer {
            keys,
            random: SystemRandom::new(),
        })
    }

    /// `summary` sealed for `tenant` under the first key.
    pub fn seal(&self, tenant: &[u8; 32], summary: &str) -> Result<String, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.random.fill(&mut nonce).map_err(|_| SealError)?;
        let mut sealed = summary.as_bytes().to_vec();
        self.keys[0]
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(tenant)),
                &mut sealed,
            )
            .map_err(|_| SealError)?;
        let mut framed = Vec::with_capacity(1 + NONCE_LEN + sealed.len());
        framed.push(VERSION);
        framed.extend_from_slice(&nonce);
        framed.extend_from_slice(&sealed);
        Ok(format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(framed)))
    }

    /// Reads `encrypted_content` for `tenant`.
    pub fn open(&self, tenant: &[u8; 32], encrypted_content: &str) -> Opened {
        let Some(encoded) = encrypted_content.strip_prefix(PREFIX) else {
            return Opened::Foreign;
        };
        let Ok(framed) = URL_SAFE_NO_PAD.decode(encoded) else {
            return Opened::Refused;
        };
        let Some((&VERSION, rest)) = framed.split_first() else {
            return Opened::Refused;
        };
        if rest.len() < NONCE_LEN {
            return Opened::Refused;
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        for key in &self.keys {
            let Ok(nonce) = Nonce::try_assume_unique_for_key(nonce) else {
                return Opened::Refused;
            };
            let mut buffer = sealed.to_vec();
            if let Ok(plain) = key.open_in_place(nonce, Aad::from(aad(tenant)), &mut buffer) {
                return match String::from_utf8(plain.to_vec()) {
                    Ok(summary) => Opened::Plain(summary),
                    Err(_) => Opened::Refused,
                };
            }
        }
        Opened::Refused
    }
}

/// The system's random source failed: nothing can be sealed safely.
#[derive(Debug, thiserror::Error)]
#[error("no randomness for a nonce")]
pub struct SealError;

fn aad(tenant: &[u8; 32]) -> [u8; 33] {
    let mut aad = [0u8; 33];
    aad[0] = VERSION;
    aad[1..].copy_from_slice(tenant);
    aad
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer(keys: &[&str]) -> Sealer {
        let keys: Vec<Secret> = keys.iter().map(|k| Secret::new(*k)).collect();
        Sealer::new(&keys).unwrap()
    }

    #[test]
    fn a_sealed_summary_opens_for_its_tenant_only() {
        let sealer = sealer(&["k1"]);
        let sealed = sealer.seal(&[1; 32], "the summary").unwrap();
        assert!(sealed.starts_with(PREFIX));
        assert!(!sealed.contains("summary"));
        assert_eq!(
            sealer.open(&[1; 32], &sealed),
            Opened::Plain("the summary".into())
        );
        assert_eq!(sealer.open(&[2; 32], &sealed), Opened::Refused);
    }

    #[test]
    fn any_changed_character_is_refused() {
        let sealer = sealer(&["k1"]);
        let sealed = sealer.seal(&[1; 32], "the summary").unwrap();
        for at in PREFIX.len()..sealed.len() {
            let mut bytes = sealed.clone().into_bytes();
            bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(bytes).unwrap();
            assert_eq!(sealer.open(&[1; 32], &altered), Opened::Refused, "at {at}");
        }
        assert_eq!(sealer.open(&[1; 32], PREFIX), Opened::Refused);
    }

    #[test]
    fn old_keys_still_open_after_a_rotation_and_unlisted_ones_do_not() {
        let before = sealer(&["old"]).seal(&[1; 32], "s").unwrap();
        let rotated = sealer(&["new", "old"]);
        assert_eq!(rotated.open(&[1; 32], &before), Opened::Plain("s".into()));
        let after = rotated.seal(&[1; 32], "t").unwrap();
        assert_eq!(sealer(&["old"]).open(&[1; 32], &after), Opened::Refused);
        assert_eq!(sealer(&["new"]).open(&[1; 32], &before), Opened::Refused);
    }

    #[test]
    fn the_providers_own_items_are_not_compactors() {
        assert_eq!(
            sealer(&["k"]).open(&[1; 32], "gAAAAABpZ3x0"),
            Opened::Foreign
        );
    }
}
