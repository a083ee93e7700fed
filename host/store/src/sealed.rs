//! Secret configuration values at rest: sealed with ChaCha20-Poly1305 under a key the
//! operator provides (never stored beside the data), bound to their tenant and name, so a
//! copied data directory reveals nothing and a sealed value moved to another slot does not
//! open. Stored as `sealed:v1:` and base64 of the nonce and ciphertext.

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};

use crate::StoreError;

const PREFIX: &str = "sealed:v1:";
const NONCE: usize = 12;

/// The operator's key for secrets at rest: 32 bytes.
#[derive(Clone)]
pub struct SecretsKey(chacha20poly1305::Key);

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretsKey(..)")
    }
}

impl SecretsKey {
    /// A key from its 32 bytes.
    pub fn new(bytes: [u8; 32]) -> Self {
        SecretsKey(bytes.into())
    }

    /// A key file: 32 bytes, or 64 hex digits (`openssl rand -hex 32 > key`).
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let text = String::from_utf8_lossy(&bytes);
        let hex = text.trim();
        let key: Option<[u8; 32]> = match (bytes.len(), hex.len()) {
            (32, _) => bytes.try_into().ok(),
            (_, 64) => (0..32)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
                .collect::<Option<Vec<u8>>>()
                .and_then(|b| b.try_into().ok()),
            _ => None,
        };
        key.map(Self::new).ok_or_else(|| {
            format!(
                "{}: a secrets key is 32 bytes or 64 hex digits",
                path.display()
            )
        })
    }
}

fn slot(tenant: &str, name: &str) -> Vec<u8> {
    [tenant.as_bytes(), b"\0", name.as_bytes()].concat()
}

pub(crate) fn seal(key: &SecretsKey, tenant: &str, name: &str, value: &str) -> String {
    let mut nonce = [0u8; NONCE];
    getrandom::fill(&mut nonce).expect("the system's randomness is available");
    let payload = Payload {
        msg: value.as_bytes(),
        aad: &slot(tenant, name),
    };
    let sealed = ChaCha20Poly1305::new(&key.0)
        .encrypt(&Nonce::from(nonce), payload)
        .expect("sealing a short value cannot fail");
    format!(
        "{PREFIX}{}",
        STANDARD.encode([&nonce[..], &sealed].concat())
    )
}

/// The value as stored: opened if sealed, as is if it predates sealing.
pub(crate) fn open(
    key: Option<&SecretsKey>,
    tenant: &str,
    name: &str,
    stored: &str,
) -> Result<String, StoreError> {
    let Some(encoded) = stored.strip_prefix(PREFIX) else {
        return Ok(stored.to_owned());
    };
    let unreadable = |reason: &str| StoreError::Sealed {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    let key = key.ok_or_else(|| unreadable("the host has no secrets key (--secrets-key-file)"))?;
    let bytes = STANDARD
        .decode(encoded)
        .map_err(|_| unreadable("not base64"))?;
    if bytes.len() < NONCE {
        return Err(unreadable("too short"));
    }
    let (nonce, sealed) = bytes.split_at(NONCE);
    let nonce = Nonce::try_from(nonce).map_err(|_| unreadable("too short"))?;
    let payload = Payload {
        msg: sealed,
        aad: &slot(tenant, name),
    };
    let plain = ChaCha20Poly1305::new(&key.0)
        .decrypt(&nonce, payload)
        .map_err(|_| unreadable("it does not open with this key"))?;
    String::from_utf8(plain).map_err(|_| unreadable("not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_only_with_its_key_in_its_slot() {
        let key = SecretsKey::new([7; 32]);
        let sealed = seal(&key, "acme", "TOKEN", "s3cr3t");
        assert!(sealed.starts_with(PREFIX) && !sealed.contains("s3cr3t"));
        assert_eq!(
            open(Some(&key), "acme", "TOKEN", &sealed).unwrap(),
            "s3cr3t"
        );
        assert_ne!(
            seal(&key, "acme", "TOKEN", "s3cr3t"),
            sealed,
            "a fresh nonce each time"
        );
        let other = SecretsKey::new([8; 32]);
        assert!(open(Some(&other), "acme", "TOKEN", &sealed).is_err());
        assert!(
            open(Some(&key), "globex", "TOKEN", &sealed).is_err(),
            "another tenant's slot"
        );
        assert!(
            open(Some(&key), "acme", "OTHER", &sealed).is_err(),
            "another name"
        );
        assert!(open(None, "acme", "TOKEN", &sealed).is_err());
        assert_eq!(open(None, "acme", "TOKEN", "plain").unwrap(), "plain");
    }

    #[test]
    fn a_key_file_is_raw_or_hex() {
        let dir = tempfile::tempdir().unwrap();
        let (raw, hex, bad) = (
            dir.path().join("raw"),
            dir.path().join("hex"),
            dir.path().join("bad"),
        );
        std::fs::write(&raw, [1u8; 32]).unwrap();
        std::fs::write(&hex, format!("{}\n", "01".repeat(32))).unwrap();
        std::fs::write(&bad, "short").unwrap();
        let value = |key: SecretsKey| {
            open(
                Some(&key),
                "t",
                "k",
                &seal(&SecretsKey::new([1; 32]), "t", "k", "v"),
            )
        };
        assert_eq!(value(SecretsKey::from_file(&raw).unwrap()).unwrap(), "v");
        assert_eq!(value(SecretsKey::from_file(&hex).unwrap()).unwrap(), "v");
        assert!(SecretsKey::from_file(&bad).is_err());
    }
}
