//! Content addresses: every blob, artifact and key is named by the sha256 of its bytes.

use sha2::{Digest, Sha256};

/// Lower-case hexadecimal, two digits a byte.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The sha256 of `bytes`, in hex: the name content-addressed data is stored under.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}
