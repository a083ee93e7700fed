//! What survives a restart, in sled.
//!
//! | tree        | key                          | value                                   |
//! |-------------|------------------------------|-----------------------------------------|
//! | `tools`     | `tenant \0 name`             | [`ToolRecord`] as JSON                  |
//! | `blobs`     | component sha256 (hex)       | the uploaded component bytes            |
//! | `artifacts` | `sha256 : engine fingerprint`| sha256 of the artifact, then the artifact |
//!
//! Blobs and artifacts are content-addressed and written before the records that point at
//! them, so a crash between the two leaves at worst an unreferenced blob, never a record that
//! points at nothing.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::sandbox::hex;
use crate::spec::ToolSpec;

/// One installed Wasm tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolRecord {
    pub tenant: String,
    pub spec: ToolSpec,
    /// sha256 (hex) of the component that implements it.
    pub component: String,
    pub installed_at_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the data directory {path} is in use by another toolhost process")]
    Locked { path: String },
    #[error("storage error: {0}")]
    Sled(String),
    #[error("stored record `{key}` is unreadable: {reason}")]
    Corrupt { key: String, reason: String },
}

impl From<sled::Error> for StoreError {
    fn from(error: sled::Error) -> Self {
        StoreError::Sled(error.to_string())
    }
}

pub struct Db {
    /// Held for the life of the store: one process per data directory.
    _lock: Option<std::fs::File>,
    db: sled::Db,
    tools: sled::Tree,
    blobs: sled::Tree,
    artifacts: sled::Tree,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn tool_key(tenant: &str, name: &str) -> Vec<u8> {
    [tenant.as_bytes(), b"\0", name.as_bytes()].concat()
}

impl Db {
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let io = |e: std::io::Error| StoreError::Sled(format!("opening {}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(io)?;
        let lock = std::fs::File::create(dir.join("toolhost.lock")).map_err(io)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked {
                    path: dir.display().to_string(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        Self::from_config(sled::Config::new().path(dir.join("db")), Some(lock), dir)
    }

    /// A store that lives only as long as this value.
    pub fn temporary() -> Result<Self, StoreError> {
        Self::from_config(
            sled::Config::new().temporary(true),
            None,
            Path::new("(temporary)"),
        )
    }

    fn from_config(
        config: sled::Config,
        lock: Option<std::fs::File>,
        dir: &Path,
    ) -> Result<Self, StoreError> {
        let db = config
            .open()
            .map_err(|e| StoreError::Sled(format!("opening {}: {e}", dir.display())))?;
        Ok(Db {
            _lock: lock,
            tools: db.open_tree("tools")?,
            blobs: db.open_tree("blobs")?,
            artifacts: db.open_tree("artifacts")?,
            db,
        })
    }

    pub fn blob(&self, sha: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.blobs.get(sha)?.map(|v| v.to_vec()))
    }

    /// Returns the artifact only if its checksum still matches; a damaged one is deleted so
    /// that the caller recompiles from the blob.
    pub fn artifact(&self, sha: &str, fingerprint: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = format!("{sha}:{fingerprint}");
        let Some(stored) = self.artifacts.get(&key)? else {
            return Ok(None);
        };
        if stored.len() >= 32 && Sha256::digest(&stored[32..])[..] == stored[..32] {
            return Ok(Some(stored[32..].to_vec()));
        }
        tracing::warn!(
            component = sha,
            "compiled artifact failed its checksum; recompiling"
        );
        self.artifacts.remove(&key)?;
        Ok(None)
    }

    /// Stores a component and its compiled artifact, durably, before any record points at them.
    pub fn put_component(
        &self,
        sha: &str,
        bytes: &[u8],
        fingerprint: &str,
        artifact: &[u8],
    ) -> Result<(), StoreError> {
        self.blobs.insert(sha, bytes)?;
        self.put_artifact(sha, fingerprint, artifact)
    }

    pub fn put_artifact(
        &self,
        sha: &str,
        fingerprint: &str,
        artifact: &[u8],
    ) -> Result<(), StoreError> {
        let stored = [&Sha256::digest(artifact)[..], artifact].concat();
        self.artifacts
            .insert(format!("{sha}:{fingerprint}"), stored)?;
        self.db.flush()?;
        Ok(())
    }

    /// Writes all records at once: after a crash, either all of them are there or none.
    pub fn put_tools(&self, records: &[ToolRecord]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for record in records {
            let value = serde_json::to_vec(record).expect("a record serializes");
            batch.insert(tool_key(&record.tenant, &record.spec.name), value);
        }
        self.tools.apply_batch(batch)?;
        self.db.flush()?;
        Ok(())
    }

    pub fn remove_tool(&self, tenant: &str, name: &str) -> Result<bool, StoreError> {
        let removed = self.tools.remove(tool_key(tenant, name))?.is_some();
        self.db.flush()?;
        Ok(removed)
    }

    pub fn tools(&self) -> Result<Vec<ToolRecord>, StoreError> {
        self.tools
            .iter()
            .map(|entry| {
                let (key, value) = entry?;
                serde_json::from_slice(&value).map_err(|e| StoreError::Corrupt {
                    key: String::from_utf8_lossy(&key).replace('\0', "/"),
                    reason: e.to_string(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_artifact_is_refused_and_dropped() {
        let db = Db::temporary().unwrap();
        db.put_component("abc", b"blob", "fp", b"machine code")
            .unwrap();
        assert_eq!(
            db.artifact("abc", "fp").unwrap().as_deref(),
            Some(&b"machine code"[..])
        );
        assert_eq!(db.artifact("abc", "other-engine").unwrap(), None);
        let mut stored = db.artifacts.get("abc:fp").unwrap().unwrap().to_vec();
        *stored.last_mut().unwrap() ^= 1;
        db.artifacts.insert("abc:fp", stored).unwrap();
        assert_eq!(db.artifact("abc", "fp").unwrap(), None);
        assert!(db.artifacts.get("abc:fp").unwrap().is_none());
        assert_eq!(db.blob("abc").unwrap().as_deref(), Some(&b"blob"[..]));
    }

    #[test]
    fn a_second_process_gets_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Db::open(dir.path()).unwrap();
        let second = Db::open(dir.path()).err().expect("locked");
        assert!(matches!(second, StoreError::Locked { .. }), "{second}");
    }
}
