//! What survives a restart: the [`Store`] trait, and [`RedbStore`], its redb implementation.
//!
//! | table       | key                            | value                                     |
//! |-------------|--------------------------------|-------------------------------------------|
//! | `tools`     | `tenant \0 name`               | [`ToolEntry`] JSON: every kept version (spec, source kind, component sha256, installed-at) |
//! | `blobs`     | component sha256 (hex)         | the uploaded component bytes              |
//! | `artifacts` | `sha256 : engine fingerprint`  | sha256 of the artifact, then the artifact |
//! | `cache`     | sha256 of (tenant, tool, version, key) | expiry (u64 BE ms), then result JSON |
//! | `kv`        | `tenant \0 tool \0 key`        | the value bytes                           |
//! | `config`    | `tenant \0 key`                | [`ConfigValue`] JSON                      |
//! | `policies`  | `tenant`                       | [`TenantPolicy`] JSON                     |
//! | `tenants`   | `tenant`                       | created-at (u64 BE ms)                    |
//! | `keys`      | sha256 of the API key (hex)    | [`KeyRecord`] JSON                        |
//! | `held_calls`| call id                        | [`HeldCall`] JSON                         |
//! | `search_vectors` | model fingerprint and text digest | the vector's bytes               |
//!
//! Blobs and artifacts are content-addressed and written before the entries that point at
//! them, so a crash between the two leaves at worst an unreferenced blob, never an entry that
//! points at nothing. Each write is one redb transaction, on disk (synced) before it returns;
//! cached results and search vectors, which are computed again if lost, are synced lazily.

#![deny(missing_docs)]

mod sealed;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub use sealed::SecretsKey;
use toolhost_spec::access::Role;
use toolhost_spec::call::Caller;
use toolhost_spec::policy::TenantPolicy;
use toolhost_spec::spec::{CACHE_TTL_MS, ToolSpec};

/// A tool's history: the versions kept, and which one answers calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolEntry {
    /// The tenant that owns the tool.
    pub tenant: String,
    /// The tool's name, unique within its tenant.
    pub name: String,
    /// The version calls run, one of `versions`.
    pub current: u32,
    /// Oldest first; at most [`MAX_VERSIONS_KEPT`].
    pub versions: Vec<ToolVersion>,
}

/// One installed version of a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolVersion {
    /// Counts from 1 within its entry.
    pub version: u32,
    /// What implements it.
    #[serde(default)]
    pub kind: SourceKind,
    /// The spec it was installed with.
    pub spec: ToolSpec,
    /// sha256 (hex) of the blob that implements it: the component, the HTTP request
    /// definition (JSON), or the JS source and the runtime it runs on (JSON).
    pub component: String,
    /// That blob's size in bytes, charged to the tenant's code quota (0 in records written
    /// before sizes were kept).
    #[serde(default)]
    pub bytes: u64,
    /// When it was installed (Unix milliseconds).
    pub installed_at_ms: u64,
}

/// What kind of code implements a version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// A WebAssembly component.
    #[default]
    Wasm,
    /// A declarative HTTP request (`toolhost::http_tool::HttpRequestDef` JSON).
    Http,
    /// JavaScript source run on the host's JS runtime (`toolhost::JsSource` JSON).
    Js,
}

/// Older versions past this many are forgotten (their blobs stay, shared by content).
pub const MAX_VERSIONS_KEPT: usize = 20;

impl ToolEntry {
    /// The version calls run.
    pub fn current(&self) -> &ToolVersion {
        self.version(self.current)
            .expect("an entry's current version is one of its versions")
    }

    /// The kept version numbered `version`.
    pub fn version(&self, version: u32) -> Option<&ToolVersion> {
        self.versions.iter().find(|v| v.version == version)
    }

    /// Adds `spec` as the next version and makes it current.
    pub fn push(
        &mut self,
        kind: SourceKind,
        spec: ToolSpec,
        component: String,
        bytes: u64,
        installed_at_ms: u64,
    ) {
        let version = self.versions.last().map_or(1, |v| v.version + 1);
        self.versions.push(ToolVersion {
            version,
            kind,
            spec,
            component,
            bytes,
            installed_at_ms,
        });
        let excess = self.versions.len().saturating_sub(MAX_VERSIONS_KEPT);
        self.versions.drain(..excess);
        self.current = version;
    }
}

/// Bytes of code `entries` hold: the blob of every kept version, each distinct one once.
pub fn code_bytes<'a>(entries: impl IntoIterator<Item = &'a ToolEntry>) -> u64 {
    let mut blobs = std::collections::HashMap::new();
    for version in entries.into_iter().flat_map(|entry| &entry.versions) {
        blobs.insert(&version.component, version.bytes);
    }
    blobs.values().sum()
}

/// An API key, stored by the sha256 of the key: the key itself is never stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// Public id, to list and revoke the key by.
    pub id: String,
    /// The tenant the key acts for.
    pub tenant: String,
    /// When it was made (Unix milliseconds).
    pub created_at_ms: u64,
    /// What the key may do; keys stored before roles read as developers.
    #[serde(default = "Role::stored_before_roles")]
    pub role: Role,
}

/// A tenant's configuration value, readable by the tools that declare its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigValue {
    /// The value, sealed at rest when `secret`.
    pub value: String,
    /// Never shown in listings, logs or errors.
    pub secret: bool,
}

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another process holds the data directory.
    #[error("the data directory {path} is in use by another toolhost process")]
    Locked {
        /// The data directory.
        path: String,
    },
    /// The data directory cannot be opened.
    #[error("cannot open the data directory {path}: {reason}")]
    Open {
        /// The data directory.
        path: String,
        /// Why not.
        reason: String,
    },
    /// The storage engine failed (I/O, a full disk).
    #[error("storage error: {0}")]
    Backend(String),
    /// A record does not decode.
    #[error("stored record `{key}` is unreadable: {reason}")]
    Corrupt {
        /// The record's key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The write would take the tenant's data past its quota.
    #[error(
        "the tenant's data (KV values and cached results) holds {used} bytes; {adding} more \
         would pass its quota of {quota} (data_quota_bytes)"
    )]
    Quota {
        /// Bytes held now.
        used: u64,
        /// Bytes the write would add.
        adding: u64,
        /// The quota.
        quota: u64,
    },
    /// A sealed secret cannot be opened (a different or missing secrets key).
    #[error("the secret `{name}` is sealed and cannot be read: {reason}")]
    Sealed {
        /// The configuration key.
        name: String,
        /// Why it cannot be opened.
        reason: String,
    },
}

/// The store's result.
pub type Result<T> = std::result::Result<T, StoreError>;

/// Everything the host persists. Keys are tenant-scoped by construction: every method that
/// reads or writes tenant data takes the tenant.
pub trait Store: Send + Sync {
    /// Every tool entry of every tenant.
    fn tool_entries(&self) -> Result<Vec<ToolEntry>>;
    /// One tenant's tool entries.
    fn tool_entries_of(&self, tenant: &str) -> Result<Vec<ToolEntry>>;
    /// Writes all entries at once: after a crash, either all of them are there or none.
    fn put_tool_entries(&self, entries: &[ToolEntry]) -> Result<()>;
    /// Forgets a tool; false if there was none.
    fn remove_tool_entry(&self, tenant: &str, name: &str) -> Result<bool>;

    /// The blob with this sha256 (hex).
    fn blob(&self, sha: &str) -> Result<Option<Vec<u8>>>;
    /// Stores `bytes` under `sha`, their sha256 (hex).
    fn put_blob(&self, sha: &str, bytes: &[u8]) -> Result<()>;
    /// Stores a component and its compiled artifact before any entry points at them.
    fn put_component(
        &self,
        sha: &str,
        bytes: &[u8],
        fingerprint: &str,
        artifact: &[u8],
    ) -> Result<()>;
    /// The artifact, only if its checksum still matches; a damaged one is dropped so that the
    /// caller recompiles from the blob.
    fn artifact(&self, sha: &str, fingerprint: &str) -> Result<Option<Vec<u8>>>;
    /// Replaces a compiled artifact (one compiled again after the last was dropped).
    fn put_artifact(&self, sha: &str, fingerprint: &str, artifact: &[u8]) -> Result<()>;
    /// Removes every blob that `live` does not keep, with its compiled artifacts; returns how
    /// many. Removes nothing while a tool record is unreadable: what it refers to is unknown.
    fn collect_blobs(&self, live: &dyn Fn(&str) -> bool) -> Result<usize>;

    /// A tenant's cached result, unless it expired by `now_ms`.
    fn cache_get(&self, tenant: &str, key: &[u8], now_ms: u64) -> Result<Option<Value>>;
    /// Caches a tenant's result until `expires_at_ms`, within the tenant's data quota (its
    /// expired results are dropped first if the quota is reached).
    fn cache_put(
        &self,
        tenant: &str,
        key: &[u8],
        expires_at_ms: u64,
        value: &Value,
        quota: u64,
    ) -> Result<()>;
    /// Drops expired results; returns how many.
    fn cache_purge(&self, now_ms: u64) -> Result<usize>;

    /// A tool's KV value.
    fn kv_get(&self, tenant: &str, tool: &str, key: &str) -> Result<Option<Vec<u8>>>;
    /// Sets a tool's KV value, unless it would take the tenant's data past `quota` bytes.
    fn kv_set(&self, tenant: &str, tool: &str, key: &str, value: &[u8], quota: u64) -> Result<()>;
    /// Deletes a tool's KV value; false if there was none.
    fn kv_delete(&self, tenant: &str, tool: &str, key: &str) -> Result<bool>;
    /// How many KV keys a tool holds.
    fn kv_count(&self, tenant: &str, tool: &str) -> Result<usize>;
    /// Bytes of the tenant's data: its KV keys and values and its cached results.
    fn data_bytes(&self, tenant: &str) -> Result<u64>;

    /// A tenant's configuration value (opened, if sealed).
    fn config_get(&self, tenant: &str, key: &str) -> Result<Option<ConfigValue>>;
    /// Sets a tenant's configuration value (sealed, if secret and a key is set).
    fn config_set(&self, tenant: &str, key: &str, value: &ConfigValue) -> Result<()>;
    /// Deletes a configuration value; false if there was none.
    fn config_delete(&self, tenant: &str, key: &str) -> Result<bool>;
    /// A tenant's configuration keys.
    fn config_keys(&self, tenant: &str) -> Result<Vec<String>>;

    /// A tenant's policy, if it has one.
    fn policy(&self, tenant: &str) -> Result<Option<TenantPolicy>>;
    /// Sets a tenant's policy.
    fn put_policy(&self, tenant: &str, policy: &TenantPolicy) -> Result<()>;

    /// Records a tenant; false if it existed.
    fn tenant_create(&self, tenant: &str, created_at_ms: u64) -> Result<bool>;
    /// Every tenant.
    fn tenants(&self) -> Result<Vec<String>>;
    /// Stores an API key's record under the key's sha256.
    fn key_put(&self, key_hash: &str, record: &KeyRecord) -> Result<()>;
    /// The record of the key with this sha256.
    fn key_get(&self, key_hash: &str) -> Result<Option<KeyRecord>>;
    /// Every key's record.
    fn keys(&self) -> Result<Vec<KeyRecord>>;
    /// Revokes the key with this public id; false if there was none.
    fn key_revoke(&self, id: &str) -> Result<bool>;

    /// Calls waiting for approval, by call id.
    fn held_call_put(&self, call_id: &str, held: &HeldCall) -> Result<()>;
    /// Forgets a held call; false if there was none.
    fn held_call_remove(&self, call_id: &str) -> Result<bool>;
    /// Every held call, by call id.
    fn held_calls(&self) -> Result<Vec<(String, HeldCall)>>;

    /// A search model's vector of a tool's text (its bytes, as the search crate encodes
    /// them), by model fingerprint and text digest.
    fn search_vector(&self, key: &str) -> Result<Option<Vec<u8>>>;
    /// Committed lazily: a vector lost in a crash is encoded again.
    fn put_search_vector(&self, key: &str, vector: &[u8]) -> Result<()>;

    /// Whether writes reach the disk; if one failed, why. Reads from memory go on either way.
    fn health(&self) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// Wall-clock milliseconds since the Unix epoch: how stored expiries and ages are kept.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A call waiting for approval, as stored: everything needed to run it once approved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldCall {
    /// Who called, as at the call.
    pub caller: Caller,
    /// The tool, by name.
    pub tool: String,
    /// The validated arguments.
    pub args: Value,
    /// Wall-clock milliseconds since the Unix epoch, so that the age survives a restart.
    pub held_at_ms: u64,
}

impl HeldCall {
    /// How long it has waited by `now_ms`.
    pub fn waiting_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.held_at_ms)
    }
}

/// A cached result expires at its time, or at once if that is further off than any TTL
/// allows: the wall clock went back, and the entry's real age is unknown. So a jump back
/// neither expires a result early nor keeps one forever.
fn cache_expired(expires_at_ms: u64, now_ms: u64) -> bool {
    expires_at_ms <= now_ms || expires_at_ms - now_ms > CACHE_TTL_MS.max
}

fn key(parts: &[&str]) -> Vec<u8> {
    parts.join("\0").into_bytes()
}

/// A table of the store: byte keys to byte values.
type Table = TableDefinition<'static, &'static [u8], &'static [u8]>;

const TOOLS: Table = TableDefinition::new("tools");
const BLOBS: Table = TableDefinition::new("blobs");
const ARTIFACTS: Table = TableDefinition::new("artifacts");
const CACHE: Table = TableDefinition::new("cache");
const KV: Table = TableDefinition::new("kv");
const CONFIG: Table = TableDefinition::new("config");
const TENANTS: Table = TableDefinition::new("tenants");
const KEYS: Table = TableDefinition::new("keys");
const POLICIES: Table = TableDefinition::new("policies");
const HELD_CALLS: Table = TableDefinition::new("held_calls");
const SEARCH_VECTORS: Table = TableDefinition::new("search_vectors");
/// Bytes of each tenant's data (KV and cache entries, keys included), kept with every write.
const USAGE: Table = TableDefinition::new("usage");
const TABLES: [Table; 12] = [
    TOOLS,
    BLOBS,
    ARTIFACTS,
    CACHE,
    KV,
    CONFIG,
    TENANTS,
    KEYS,
    POLICIES,
    HELD_CALLS,
    SEARCH_VECTORS,
    USAGE,
];

/// The store's file in the data directory.
pub const STORE_FILE: &str = "store.redb";

/// Writes that may be lost in a crash (cached results, search vectors) are committed without
/// a sync; every this many of them, one is synced so that the space they free is reused.
const LAZY_COMMITS_PER_SYNC: u32 = 64;

/// The redb implementation of [`Store`]: one file in the data directory, one process.
pub struct RedbStore {
    db: redb::Database,
    /// Seals secret configuration values at rest; without it they are stored as given.
    secrets_key: Option<SecretsKey>,
    /// Held for the life of the store: one process per data directory.
    _lock: Option<std::fs::File>,
    /// Why a write failed, if one did: the store takes no more writes.
    failing: Mutex<Option<String>>,
    /// Commits without a sync since the last synced one.
    lazy_commits: AtomicU32,
    /// The store's file as opened: a write checks that it is still the one at its path.
    file: Option<OpenedFile>,
}

/// A file by path and identity.
struct OpenedFile {
    path: std::path::PathBuf,
    id: (u64, u64),
}

impl OpenedFile {
    fn new(path: std::path::PathBuf) -> std::io::Result<Self> {
        let meta = std::fs::metadata(&path)?;
        Ok(OpenedFile {
            id: (meta.dev(), meta.ino()),
            path,
        })
    }

    /// Why the file at the path is no longer this one, if it is not. Writes to a file whose
    /// directory was removed would succeed and be lost at the next start.
    fn gone(&self) -> Option<String> {
        match std::fs::metadata(&self.path) {
            Ok(meta) if (meta.dev(), meta.ino()) == self.id => None,
            _ => Some(format!(
                "the store's file {} was removed or replaced (its data directory removed or \
                 unmounted?) while this process had it open",
                self.path.display()
            )),
        }
    }
}

/// Whether a write must be on disk when it returns.
#[derive(Clone, Copy, PartialEq)]
enum Commit {
    /// On disk when the write returns.
    Durable,
    /// A cache: lost in a crash, it is computed again.
    Lazy,
}

impl RedbStore {
    /// Opens `dir` with the store's page cache capped at `cache_bytes`.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Self> {
        let fail = |e: &dyn std::fmt::Display| StoreError::Open {
            path: dir.display().to_string(),
            reason: e.to_string(),
        };
        std::fs::create_dir_all(dir).map_err(|e| fail(&e))?;
        // Owner only: the store holds secrets and compiled code, and the admin socket lives
        // here too, so no other local user may even reach a path below it.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| fail(&e))?;
        let lock = std::fs::File::create(dir.join("toolhost.lock")).map_err(|e| fail(&e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked {
                    path: dir.display().to_string(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(fail(&e)),
        }
        let file = dir.join(STORE_FILE);
        if !file.exists() && dir.join("db").is_dir() {
            // Left untouched rather than shown as an empty store.
            return Err(fail(
                &"it holds a store of toolhost 0.1 (sled, in `db/`), which this \
                version cannot read: keep using the toolhost that wrote it, or move `db/` \
                away to start empty",
            ));
        }
        let db = redb::Database::builder()
            .set_cache_size(usize::try_from(cache_bytes).unwrap_or(usize::MAX))
            .create(&file)
            .map_err(|e| fail(&e))?;
        let mut store = Self::from_db(db, Some(lock))?;
        store.file = Some(OpenedFile::new(file).map_err(|e| fail(&e))?);
        Ok(store)
    }

    /// A store that lives only as long as this value, in memory.
    pub fn temporary() -> Result<Self> {
        let db = redb::Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(backend)?;
        Self::from_db(db, None)
    }

    fn from_db(db: redb::Database, lock: Option<std::fs::File>) -> Result<Self> {
        let store = RedbStore {
            db,
            secrets_key: None,
            _lock: lock,
            failing: Mutex::new(None),
            lazy_commits: AtomicU32::new(0),
            file: None,
        };
        // Every table exists from the start, so that a read never meets a missing one. A
        // store written before usage was kept gets it counted once.
        store.write(Commit::Durable, |tx| {
            let counted = tx.list_tables()?.any(|table| table.name() == USAGE.name());
            for table in TABLES {
                tx.open_table(table)?;
            }
            if !counted {
                recount_usage(tx)?;
            }
            Ok(())
        })?;
        Ok(store)
    }

    /// Seals secret configuration values written from now on with `key`, and opens sealed
    /// ones with it.
    pub fn with_secrets_key(mut self, key: Option<SecretsKey>) -> Self {
        self.secrets_key = key;
        self
    }

    /// Runs `write` in one transaction and commits it: all of it is stored, or none. Once a
    /// write has failed, or the file is gone, none is tried again in this process (the disk is
    /// full or failing: a restart once it is fixed recovers, with every acknowledged write).
    fn write<T>(
        &self,
        commit: Commit,
        write: impl FnOnce(&redb::WriteTransaction) -> std::result::Result<T, redb::Error>,
    ) -> Result<T> {
        if let Err(reason) = self.health() {
            return Err(StoreError::Backend(format!(
                "{reason} (this process takes no more writes: restart it once the disk is fixed)"
            )));
        }
        let lazy = commit == Commit::Lazy
            && !(self.lazy_commits.fetch_add(1, Ordering::Relaxed))
                .is_multiple_of(LAZY_COMMITS_PER_SYNC);
        let committed = (|| {
            let mut tx = self.db.begin_write()?;
            if lazy {
                tx.set_durability(redb::Durability::None)?;
            }
            let value = write(&tx)?;
            tx.commit()?;
            Ok(value)
        })();
        committed.map_err(|error: redb::Error| {
            tracing::error!(%error, "the store cannot write to its disk");
            *self.failing.lock().unwrap_or_else(|p| p.into_inner()) = Some(error.to_string());
            backend(error)
        })
    }

    /// Runs `read` on a snapshot of `table`.
    fn read<T>(
        &self,
        table: Table,
        read: impl FnOnce(&redb::ReadOnlyTable<&'static [u8], &'static [u8]>) -> Result<T>,
    ) -> Result<T> {
        let tx = self.db.begin_read().map_err(backend)?;
        read(&tx.open_table(table).map_err(backend)?)
    }

    /// The value at `key` in `table`.
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.read(table, |t| {
            Ok(t.get(key).map_err(backend)?.map(|v| v.value().to_vec()))
        })
    }

    /// Every entry of `table` whose key starts with `prefix`, in key order.
    fn scan(&self, table: Table, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.read(table, |t| {
            let mut entries = Vec::new();
            for entry in t.range(prefix..).map_err(backend)? {
                let (key, value) = entry.map_err(backend)?;
                if !key.value().starts_with(prefix) {
                    break;
                }
                entries.push((key.value().to_vec(), value.value().to_vec()));
            }
            Ok(entries)
        })
    }

    /// Stores `value` at `key` in `table`.
    fn put(&self, table: Table, key: &[u8], value: &[u8], commit: Commit) -> Result<()> {
        self.write(commit, |tx| {
            tx.open_table(table)?.insert(key, value)?;
            Ok(())
        })
    }

    /// Removes `key` from `table`; whether it was there.
    fn remove(&self, table: Table, key: &[u8]) -> Result<bool> {
        self.write(Commit::Durable, |tx| {
            Ok(tx.open_table(table)?.remove(key)?.is_some())
        })
    }

    /// The JSON record at `key`, if any; one that does not parse is a corruption error
    /// naming it.
    fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        table: Table,
        key: &[u8],
    ) -> Result<Option<T>> {
        match self.get(table, key)? {
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| corrupt(key, e)),
            None => Ok(None),
        }
    }
}

fn backend(error: impl Into<redb::Error>) -> StoreError {
    StoreError::Backend(error.into().to_string())
}

/// Every record that parses. An unreadable one (damaged, or from an incompatible version) is
/// logged and left in place, untouched: one bad record must not stop every tenant's tools.
fn readable<T: serde::de::DeserializeOwned>(
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    what: &str,
) -> Vec<(Vec<u8>, T)> {
    entries
        .into_iter()
        .filter_map(|(key, value)| match serde_json::from_slice(&value) {
            Ok(record) => Some((key, record)),
            Err(e) => {
                tracing::error!(error = %corrupt(&key, e), "{what} skipped");
                None
            }
        })
        .collect()
}

fn corrupt(key: &[u8], error: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        key: String::from_utf8_lossy(key).replace('\0', "/"),
        reason: error.to_string(),
    }
}

/// A cached result as stored: its expiry (u64 BE ms), then its JSON.
fn cache_expiry(stored: &[u8]) -> u64 {
    stored
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

/// A tenant's cached result is keyed under the tenant, so that its bytes are charged to it.
fn cache_key(tenant: &str, key: &[u8]) -> Vec<u8> {
    [tenant.as_bytes(), b"\0", key].concat()
}

/// The tenant a KV or cache key belongs to: its first part.
fn key_tenant(key: &[u8]) -> String {
    let end = key.iter().position(|&b| b == 0).unwrap_or(key.len());
    String::from_utf8_lossy(&key[..end]).into_owned()
}

/// What an entry costs its tenant: key and value, or nothing if there is none.
fn entry_bytes(key: &[u8], value_len: Option<usize>) -> i64 {
    value_len.map_or(0, |len| (key.len() + len) as i64)
}

fn be_u64(bytes: &[u8]) -> u64 {
    bytes.try_into().map_or(0, u64::from_be_bytes)
}

/// Whether adding `delta` bytes to `used` passes `quota` (shrinking never does).
fn over(used: u64, delta: i64, quota: u64) -> bool {
    delta > 0 && used.saturating_add(delta as u64) > quota
}

fn quota_error(used: u64, delta: i64, quota: u64) -> StoreError {
    StoreError::Quota {
        used,
        adding: delta.max(0) as u64,
        quota,
    }
}

/// Bytes of `tenant`'s data, as counted in the transaction.
fn usage(tx: &redb::WriteTransaction, tenant: &str) -> std::result::Result<u64, redb::Error> {
    let table = tx.open_table(USAGE)?;
    let stored = table.get(tenant.as_bytes())?;
    Ok(stored.map_or(0, |v| be_u64(v.value())))
}

/// Adds `delta` bytes (negative: frees) to `tenant`'s count.
fn charge(
    tx: &redb::WriteTransaction,
    tenant: &str,
    delta: i64,
) -> std::result::Result<(), redb::Error> {
    if delta == 0 {
        return Ok(());
    }
    let used = usage(tx, tenant)?.saturating_add_signed(delta);
    tx.open_table(USAGE)?
        .insert(tenant.as_bytes(), &used.to_be_bytes()[..])?;
    Ok(())
}

/// Removes the expired results under `prefix`; the bytes they held.
fn purge_expired(
    cache: &mut redb::Table<'_, &'static [u8], &'static [u8]>,
    prefix: &[u8],
    now_ms: u64,
) -> std::result::Result<i64, redb::Error> {
    let mut expired = Vec::new();
    for entry in cache.range(prefix..)? {
        let (key, stored) = entry?;
        if !key.value().starts_with(prefix) {
            break;
        }
        if cache_expired(cache_expiry(stored.value()), now_ms) {
            expired.push(key.value().to_vec());
        }
    }
    let mut freed = 0;
    for key in expired {
        let removed = cache.remove(&key[..])?.map(|v| v.value().len());
        freed += entry_bytes(&key, removed);
    }
    Ok(freed)
}

/// Counts every tenant's data from its KV and cache entries.
fn recount_usage(tx: &redb::WriteTransaction) -> std::result::Result<(), redb::Error> {
    let mut used: std::collections::HashMap<String, u64> = Default::default();
    for table in [KV, CACHE] {
        for entry in tx.open_table(table)?.iter()? {
            let (key, value) = entry?;
            *used.entry(key_tenant(key.value())).or_default() +=
                (key.value().len() + value.value().len()) as u64;
        }
    }
    let mut usage = tx.open_table(USAGE)?;
    for (tenant, bytes) in used {
        usage.insert(tenant.as_bytes(), &bytes.to_be_bytes()[..])?;
    }
    Ok(())
}

impl Store for RedbStore {
    fn tool_entries(&self) -> Result<Vec<ToolEntry>> {
        let entries = self.scan(TOOLS, b"")?;
        Ok(readable(entries, "tool record")
            .into_iter()
            .map(|(_, e)| e)
            .collect())
    }

    fn tool_entries_of(&self, tenant: &str) -> Result<Vec<ToolEntry>> {
        let entries = self.scan(TOOLS, &[tenant.as_bytes(), b"\0"].concat())?;
        Ok(readable(entries, "tool record")
            .into_iter()
            .map(|(_, e)| e)
            .collect())
    }

    fn put_tool_entries(&self, entries: &[ToolEntry]) -> Result<()> {
        self.write(Commit::Durable, |tx| {
            let mut tools = tx.open_table(TOOLS)?;
            for entry in entries {
                let value = serde_json::to_vec(entry).expect("an entry serializes");
                tools.insert(&key(&[&entry.tenant, &entry.name])[..], &value[..])?;
            }
            Ok(())
        })
    }

    fn remove_tool_entry(&self, tenant: &str, name: &str) -> Result<bool> {
        self.remove(TOOLS, &key(&[tenant, name]))
    }

    fn blob(&self, sha: &str) -> Result<Option<Vec<u8>>> {
        self.get(BLOBS, sha.as_bytes())
    }

    fn put_blob(&self, sha: &str, bytes: &[u8]) -> Result<()> {
        self.put(BLOBS, sha.as_bytes(), bytes, Commit::Durable)
    }

    fn put_component(
        &self,
        sha: &str,
        bytes: &[u8],
        fingerprint: &str,
        artifact: &[u8],
    ) -> Result<()> {
        let stored = [&Sha256::digest(artifact)[..], artifact].concat();
        self.write(Commit::Durable, |tx| {
            tx.open_table(BLOBS)?.insert(sha.as_bytes(), bytes)?;
            let key = format!("{sha}:{fingerprint}");
            tx.open_table(ARTIFACTS)?
                .insert(key.as_bytes(), &stored[..])?;
            Ok(())
        })
    }

    fn artifact(&self, sha: &str, fingerprint: &str) -> Result<Option<Vec<u8>>> {
        let key = format!("{sha}:{fingerprint}");
        let Some(mut stored) = self.get(ARTIFACTS, key.as_bytes())? else {
            return Ok(None);
        };
        if stored.len() >= 32 && Sha256::digest(&stored[32..])[..] == stored[..32] {
            return Ok(Some(stored.split_off(32)));
        }
        tracing::warn!(
            component = sha,
            "compiled artifact failed its checksum; recompiling"
        );
        self.remove(ARTIFACTS, key.as_bytes())?;
        Ok(None)
    }

    fn put_artifact(&self, sha: &str, fingerprint: &str, artifact: &[u8]) -> Result<()> {
        let stored = [&Sha256::digest(artifact)[..], artifact].concat();
        let key = format!("{sha}:{fingerprint}");
        self.put(ARTIFACTS, key.as_bytes(), &stored, Commit::Durable)
    }

    fn collect_blobs(&self, live: &dyn Fn(&str) -> bool) -> Result<usize> {
        let unreadable = self
            .scan(TOOLS, b"")?
            .iter()
            .filter(|(_, value)| serde_json::from_slice::<ToolEntry>(value).is_err())
            .count();
        if unreadable > 0 {
            tracing::warn!(unreadable, "tool records unreadable: no blob collected");
            return Ok(0);
        }
        let dead: Vec<String> = self
            .read(BLOBS, |blobs| {
                let mut shas = Vec::new();
                for entry in blobs.iter().map_err(backend)? {
                    shas.push(
                        String::from_utf8_lossy(entry.map_err(backend)?.0.value()).into_owned(),
                    );
                }
                Ok(shas)
            })?
            .into_iter()
            .filter(|sha| !live(sha))
            .collect();
        if dead.is_empty() {
            return Ok(0);
        }
        let artifacts: Vec<Vec<u8>> = dead
            .iter()
            .map(|sha| self.scan(ARTIFACTS, format!("{sha}:").as_bytes()))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .map(|(key, _)| key)
            .collect();
        self.write(Commit::Durable, |tx| {
            let mut blobs = tx.open_table(BLOBS)?;
            for sha in &dead {
                blobs.remove(sha.as_bytes())?;
            }
            let mut stored = tx.open_table(ARTIFACTS)?;
            for key in &artifacts {
                stored.remove(&key[..])?;
            }
            Ok(())
        })?;
        Ok(dead.len())
    }

    fn cache_get(&self, tenant: &str, key: &[u8], now_ms: u64) -> Result<Option<Value>> {
        let key = cache_key(tenant, key);
        let Some(stored) = self.get(CACHE, &key)? else {
            return Ok(None);
        };
        if cache_expired(cache_expiry(&stored), now_ms) {
            self.write(Commit::Durable, |tx| {
                let removed = tx
                    .open_table(CACHE)?
                    .remove(&key[..])?
                    .map(|v| v.value().len());
                charge(tx, tenant, -entry_bytes(&key, removed))
            })?;
            return Ok(None);
        }
        // A damaged entry is a miss, not an error: the tool can always run again.
        Ok(serde_json::from_slice(&stored[8..]).ok())
    }

    fn cache_put(
        &self,
        tenant: &str,
        key: &[u8],
        expires_at_ms: u64,
        value: &Value,
        quota: u64,
    ) -> Result<()> {
        let json = serde_json::to_vec(value).expect("a Value serializes");
        let stored = [&expires_at_ms.to_be_bytes()[..], &json].concat();
        let key = cache_key(tenant, key);
        self.write(Commit::Lazy, |tx| {
            let mut cache = tx.open_table(CACHE)?;
            let old = cache.get(&key[..])?.map(|v| v.value().len());
            let delta = entry_bytes(&key, Some(stored.len())) - entry_bytes(&key, old);
            let mut used = usage(tx, tenant)?;
            if over(used, delta, quota) {
                let freed = purge_expired(&mut cache, &cache_key(tenant, b""), now_ms())?;
                charge(tx, tenant, -freed)?;
                used = usage(tx, tenant)?;
            }
            if over(used, delta, quota) {
                return Ok(Err(quota_error(used, delta, quota)));
            }
            cache.insert(&key[..], &stored[..])?;
            charge(tx, tenant, delta)?;
            Ok(Ok(()))
        })?
    }

    fn cache_purge(&self, now_ms: u64) -> Result<usize> {
        self.write(Commit::Durable, |tx| {
            let mut cache = tx.open_table(CACHE)?;
            let mut freed: std::collections::HashMap<String, i64> = Default::default();
            let expired: Vec<Vec<u8>> = cache
                .iter()?
                .filter_map(|entry| {
                    let (key, stored) = entry.ok()?;
                    cache_expired(cache_expiry(stored.value()), now_ms)
                        .then(|| key.value().to_vec())
                })
                .collect();
            for key in &expired {
                let removed = cache.remove(&key[..])?.map(|v| v.value().len());
                *freed.entry(key_tenant(key)).or_default() += entry_bytes(key, removed);
            }
            for (tenant, bytes) in freed {
                charge(tx, &tenant, -bytes)?;
            }
            Ok(expired.len())
        })
    }

    fn kv_get(&self, tenant: &str, tool: &str, k: &str) -> Result<Option<Vec<u8>>> {
        self.get(KV, &key(&[tenant, tool, k]))
    }

    fn kv_set(&self, tenant: &str, tool: &str, k: &str, value: &[u8], quota: u64) -> Result<()> {
        let key = key(&[tenant, tool, k]);
        self.write(Commit::Durable, |tx| {
            let mut kv = tx.open_table(KV)?;
            let old = kv.get(&key[..])?.map(|v| v.value().len());
            let delta = entry_bytes(&key, Some(value.len())) - entry_bytes(&key, old);
            let used = usage(tx, tenant)?;
            if over(used, delta, quota) {
                return Ok(Err(quota_error(used, delta, quota)));
            }
            kv.insert(&key[..], value)?;
            charge(tx, tenant, delta)?;
            Ok(Ok(()))
        })?
    }

    fn kv_delete(&self, tenant: &str, tool: &str, k: &str) -> Result<bool> {
        let key = key(&[tenant, tool, k]);
        self.write(Commit::Durable, |tx| {
            let removed = tx
                .open_table(KV)?
                .remove(&key[..])?
                .map(|v| v.value().len());
            charge(tx, tenant, -entry_bytes(&key, removed))?;
            Ok(removed.is_some())
        })
    }

    fn data_bytes(&self, tenant: &str) -> Result<u64> {
        let tx = self.db.begin_read().map_err(backend)?;
        let table = tx.open_table(USAGE).map_err(backend)?;
        let stored = table.get(tenant.as_bytes()).map_err(backend)?;
        Ok(stored.map_or(0, |v| be_u64(v.value())))
    }

    fn kv_count(&self, tenant: &str, tool: &str) -> Result<usize> {
        let prefix = [key(&[tenant, tool]), b"\0".to_vec()].concat();
        self.read(KV, |kv| {
            let mut count = 0;
            for entry in kv.range(&prefix[..]..).map_err(backend)? {
                if !entry.map_err(backend)?.0.value().starts_with(&prefix) {
                    break;
                }
                count += 1;
            }
            Ok(count)
        })
    }

    fn config_get(&self, tenant: &str, k: &str) -> Result<Option<ConfigValue>> {
        let stored: Option<ConfigValue> = self.get_json(CONFIG, &key(&[tenant, k]))?;
        let Some(mut value) = stored else {
            return Ok(None);
        };
        if value.secret {
            value.value = sealed::open(self.secrets_key.as_ref(), tenant, k, &value.value)?;
        }
        Ok(Some(value))
    }

    fn config_set(&self, tenant: &str, k: &str, value: &ConfigValue) -> Result<()> {
        let sealed;
        let value = match (&self.secrets_key, value.secret) {
            (Some(secrets_key), true) => {
                sealed = ConfigValue {
                    value: sealed::seal(secrets_key, tenant, k, &value.value),
                    secret: true,
                };
                &sealed
            }
            _ => value,
        };
        let json = serde_json::to_vec(value).expect("a config value serializes");
        self.put(CONFIG, &key(&[tenant, k]), &json, Commit::Durable)
    }

    fn config_delete(&self, tenant: &str, k: &str) -> Result<bool> {
        self.remove(CONFIG, &key(&[tenant, k]))
    }

    fn config_keys(&self, tenant: &str) -> Result<Vec<String>> {
        let prefix = [tenant.as_bytes(), b"\0"].concat();
        let entries = self.scan(CONFIG, &prefix)?;
        Ok(entries
            .into_iter()
            .map(|(key, _)| String::from_utf8_lossy(&key[prefix.len()..]).into_owned())
            .collect())
    }

    fn policy(&self, tenant: &str) -> Result<Option<TenantPolicy>> {
        self.get_json(POLICIES, tenant.as_bytes())
    }

    fn put_policy(&self, tenant: &str, policy: &TenantPolicy) -> Result<()> {
        let json = serde_json::to_vec(policy).expect("a policy serializes");
        self.put(POLICIES, tenant.as_bytes(), &json, Commit::Durable)
    }

    fn held_call_put(&self, call_id: &str, held: &HeldCall) -> Result<()> {
        let json = serde_json::to_vec(held).expect("a held call serializes");
        self.put(HELD_CALLS, call_id.as_bytes(), &json, Commit::Durable)
    }

    fn held_call_remove(&self, call_id: &str) -> Result<bool> {
        self.remove(HELD_CALLS, call_id.as_bytes())
    }

    /// Every record that parses; an unreadable one is logged and left in place.
    fn held_calls(&self) -> Result<Vec<(String, HeldCall)>> {
        let entries = self.scan(HELD_CALLS, b"")?;
        Ok(readable(entries, "held call")
            .into_iter()
            .map(|(key, held)| (String::from_utf8_lossy(&key).into_owned(), held))
            .collect())
    }

    fn search_vector(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.get(SEARCH_VECTORS, key.as_bytes())
    }

    fn put_search_vector(&self, key: &str, vector: &[u8]) -> Result<()> {
        self.put(SEARCH_VECTORS, key.as_bytes(), vector, Commit::Lazy)
    }

    fn health(&self) -> std::result::Result<(), String> {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        if failing.is_none()
            && let Some(reason) = self.file.as_ref().and_then(OpenedFile::gone)
        {
            tracing::error!(%reason, "the store cannot write to its disk");
            *failing = Some(reason);
        }
        match &*failing {
            None => Ok(()),
            Some(reason) => Err(reason.clone()),
        }
    }

    fn tenant_create(&self, tenant: &str, created_at_ms: u64) -> Result<bool> {
        self.write(Commit::Durable, |tx| {
            let mut tenants = tx.open_table(TENANTS)?;
            if tenants.get(tenant.as_bytes())?.is_some() {
                return Ok(false);
            }
            tenants.insert(tenant.as_bytes(), &created_at_ms.to_be_bytes()[..])?;
            Ok(true)
        })
    }

    fn tenants(&self) -> Result<Vec<String>> {
        let entries = self.scan(TENANTS, b"")?;
        Ok(entries
            .into_iter()
            .map(|(key, _)| String::from_utf8_lossy(&key).into_owned())
            .collect())
    }

    fn key_put(&self, key_hash: &str, record: &KeyRecord) -> Result<()> {
        let json = serde_json::to_vec(record).expect("a key record serializes");
        self.put(KEYS, key_hash.as_bytes(), &json, Commit::Durable)
    }

    fn key_get(&self, key_hash: &str) -> Result<Option<KeyRecord>> {
        self.get_json(KEYS, key_hash.as_bytes())
    }

    fn keys(&self) -> Result<Vec<KeyRecord>> {
        self.scan(KEYS, b"")?
            .into_iter()
            .map(|(key, value)| serde_json::from_slice(&value).map_err(|e| corrupt(&key, e)))
            .collect()
    }

    fn key_revoke(&self, id: &str) -> Result<bool> {
        let mut hashes = Vec::new();
        for (hash, value) in self.scan(KEYS, b"")? {
            let record: KeyRecord =
                serde_json::from_slice(&value).map_err(|e| corrupt(&hash, e))?;
            if record.id == id {
                hashes.push(hash);
            }
        }
        if hashes.is_empty() {
            return Ok(false);
        }
        self.write(Commit::Durable, |tx| {
            let mut keys = tx.open_table(KEYS)?;
            for hash in &hashes {
                keys.remove(&hash[..])?;
            }
            Ok(true)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_clock_jump_neither_expires_a_cached_result_early_nor_keeps_it_forever() {
        let (t, minute, hour) = (1_900_000_000_000_u64, 60_000, 3_600_000);
        let expires = t + minute;
        assert!(!cache_expired(expires, t), "within its TTL");
        assert!(
            !cache_expired(expires, t - hour),
            "an hour back: still there"
        );
        assert!(cache_expired(expires, t + minute), "at its time");
        assert!(cache_expired(expires, t + 365 * 24 * hour), "a year on");
        assert!(
            cache_expired(expires, t - 365 * 24 * hour),
            "a year back: further off than any TTL, so its age is unknown"
        );
        assert!(
            cache_expired(expires, 0),
            "the clock at the epoch: no overflow"
        );
    }

    #[test]
    fn a_key_stored_before_roles_reads_as_a_developer() {
        let old = json!({"id": "4b715e2b", "tenant": "acme", "created_at_ms": 1});
        let record: KeyRecord = serde_json::from_value(old).unwrap();
        assert_eq!(record.role, Role::Developer);
    }

    #[test]
    fn the_data_directory_is_the_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
        let store = RedbStore::open(&data, 1 << 20).unwrap();
        let mode = std::fs::metadata(&data).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");
        drop(store);
    }

    #[test]
    fn a_damaged_artifact_is_refused_and_dropped() {
        let store = RedbStore::temporary().unwrap();
        store
            .put_component("abc", b"blob", "fp", b"machine code")
            .unwrap();
        assert_eq!(
            store.artifact("abc", "fp").unwrap().as_deref(),
            Some(&b"machine code"[..])
        );
        assert_eq!(store.artifact("abc", "other-engine").unwrap(), None);
        let mut stored = store.get(ARTIFACTS, b"abc:fp").unwrap().unwrap();
        *stored.last_mut().unwrap() ^= 1;
        store
            .put(ARTIFACTS, b"abc:fp", &stored, Commit::Durable)
            .unwrap();
        assert_eq!(store.artifact("abc", "fp").unwrap(), None);
        assert!(store.get(ARTIFACTS, b"abc:fp").unwrap().is_none());
        assert_eq!(store.blob("abc").unwrap().as_deref(), Some(&b"blob"[..]));
    }

    #[test]
    fn a_second_process_gets_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let _first = RedbStore::open(dir.path(), 1 << 20).unwrap();
        let second = RedbStore::open(dir.path(), 1 << 20).err().expect("locked");
        assert!(matches!(second, StoreError::Locked { .. }), "{second}");
    }

    #[test]
    fn cached_results_expire() {
        let store = RedbStore::temporary().unwrap();
        let quota = u64::MAX;
        store
            .cache_put("t", b"k", 1_000, &json!({"a": 1}), quota)
            .unwrap();
        store.cache_put("t", b"old", 10, &json!(1), quota).unwrap();
        assert_eq!(
            store.cache_get("t", b"k", 999).unwrap(),
            Some(json!({"a": 1}))
        );
        assert_eq!(store.cache_get("u", b"k", 999).unwrap(), None, "per tenant");
        assert_eq!(store.cache_purge(500).unwrap(), 1);
        assert_eq!(store.cache_get("t", b"k", 1_000).unwrap(), None);
        let left = store.scan(CACHE, b"").unwrap();
        assert!(left.is_empty(), "an expired read drops the entry");
        assert_eq!(store.data_bytes("t").unwrap(), 0, "and its bytes");
    }

    #[test]
    fn cached_results_stay_within_the_data_quota_dropping_expired_ones_first() {
        let store = RedbStore::temporary().unwrap();
        let value = json!("x".repeat(1000));
        let (quota, later) = (2_100, now_ms() + 60_000);
        store.cache_put("t", b"a", 100, &value, quota).unwrap();
        store.cache_put("t", b"b", later, &value, quota).unwrap();
        // `a` has expired by now: it makes room for `c`.
        store.cache_put("t", b"c", later, &value, quota).unwrap();
        let refused = store.cache_put("t", b"d", later, &value, quota);
        assert!(
            matches!(refused, Err(StoreError::Quota { .. })),
            "{refused:?}"
        );
        assert!(store.data_bytes("t").unwrap() <= quota);
        store.cache_put("u", b"d", later, &value, quota).unwrap();
    }

    #[test]
    fn usage_is_counted_once_for_a_store_written_before_it_was_kept() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = RedbStore::open(dir.path(), 1 << 20).unwrap();
            store.kv_set("t", "tool", "k", b"value", u64::MAX).unwrap();
            store
                .write(Commit::Durable, |tx| {
                    tx.delete_table(USAGE)?;
                    Ok(())
                })
                .unwrap();
        }
        let store = RedbStore::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(
            store.data_bytes("t").unwrap(),
            ("t\0tool\0k".len() + 5) as u64
        );
    }

    #[test]
    fn kv_and_config_are_scoped_by_tenant() {
        let store = RedbStore::temporary().unwrap();
        store.kv_set("a", "tool", "k", b"1", u64::MAX).unwrap();
        store.kv_set("a", "tool", "k2", b"2", u64::MAX).unwrap();
        store.kv_set("ab", "tool", "k", b"3", u64::MAX).unwrap();
        assert_eq!(store.kv_get("b", "tool", "k").unwrap(), None);
        assert_eq!(store.kv_count("a", "tool").unwrap(), 2);
        assert_eq!(
            store.kv_count("a", "too").unwrap(),
            0,
            "prefixes do not bleed"
        );
        let secret = ConfigValue {
            value: "s3cret".into(),
            secret: true,
        };
        store.config_set("a", "TOKEN", &secret).unwrap();
        assert_eq!(store.config_get("a", "TOKEN").unwrap(), Some(secret));
        assert_eq!(store.config_get("b", "TOKEN").unwrap(), None);
        assert_eq!(store.config_keys("a").unwrap(), ["TOKEN"]);
        assert!(store.config_keys("").unwrap().is_empty());
    }

    #[test]
    fn an_unreadable_tool_record_is_skipped_not_fatal() {
        let store = RedbStore::temporary().unwrap();
        let spec = ToolSpec::new("t", "d", json!({"type": "object"}));
        let mut entry = ToolEntry {
            tenant: "a".into(),
            name: "t".into(),
            current: 0,
            versions: vec![],
        };
        entry.push(SourceKind::Wasm, spec, "sha".into(), 10, 1);
        store.put_tool_entries(&[entry.clone()]).unwrap();
        let broken = key(&["a", "broken"]);
        store
            .put(TOOLS, &broken, b"{not an entry", Commit::Durable)
            .unwrap();
        assert_eq!(store.tool_entries().unwrap(), vec![entry.clone()]);
        assert_eq!(store.tool_entries_of("a").unwrap(), vec![entry]);
        assert!(
            store.get(TOOLS, &broken).unwrap().is_some(),
            "left in place"
        );
    }

    #[test]
    fn versions_are_numbered_and_bounded() {
        let spec = ToolSpec::new("t", "d", json!({"type": "object"}));
        let mut entry = ToolEntry {
            tenant: "a".into(),
            name: "t".into(),
            current: 0,
            versions: vec![],
        };
        for i in 0..MAX_VERSIONS_KEPT + 5 {
            entry.push(
                SourceKind::Wasm,
                spec.clone(),
                format!("sha{i}"),
                10,
                i as u64,
            );
        }
        assert_eq!(entry.versions.len(), MAX_VERSIONS_KEPT);
        assert_eq!(entry.current, (MAX_VERSIONS_KEPT + 5) as u32);
        assert_eq!(
            entry.current().component,
            format!("sha{}", MAX_VERSIONS_KEPT + 4)
        );
        assert_eq!(entry.versions[0].version, 6);
    }
}
