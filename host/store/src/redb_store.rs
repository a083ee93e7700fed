//! [`RedbStore`]: the store in one redb file in the data directory, for one process.
//!
//! | table       | key                            | value                                     |
//! |-------------|--------------------------------|-------------------------------------------|
//! | `tools`     | `tenant \0 name`               | [`ToolEntry`] JSON: every kept version (spec, source kind, component sha256, installed-at) |
//! | `blobs`     | component sha256 (hex)         | the uploaded component bytes              |
//! | `blob_shas` | component sha256 (hex)         | nothing: the list of `blobs`' keys        |
//! | `sealed_artifacts` | `sha256 : engine fingerprint` | the artifact as the host sealed it (the host checks the seal) |
//! | `cache`     | `tenant \0` sha256 of (tool, version, key) | expiry (u64 BE ms), then result JSON |
//! | `cache_expiry` | `tenant \0` expiry (u64 BE ms), the rest of the `cache` key | nothing |
//! | `kv`        | `tenant \0 tool \0 key`        | the value bytes                           |
//! | `config`    | `tenant \0 key`                | [`ConfigValue`] JSON                      |
//! | `policies`  | `tenant`                       | [`TenantPolicy`] JSON                     |
//! | `tenants`   | `tenant`                       | created-at (u64 BE ms)                    |
//! | `keys`      | sha256 of the API key (hex)    | [`KeyRecord`] JSON                        |
//! | `held_calls`| call id                        | [`HeldCall`] JSON                         |
//! | `search_vectors` | model fingerprint and text digest | the vector's bytes               |
//! | `data_usage` | `tenant`                      | bytes of its KV and cache entries, each with [`crate::ENTRY_OVERHEAD_BYTES`] (u64 BE) |
//! | `durable_calls` | call id                    | [`DurableCall`] JSON                      |
//! | `durable_pending` | `tenant \0` call id of each call not ended | created-at, lease-until (0: queued; u64 BE ms each) |
//!
//! Each write is one redb transaction, on disk (synced) before it returns; cached results and
//! search vectors, which are computed again if lost, are synced lazily. redb blocks: every
//! method of the [`Store`] runs on tokio's blocking threads.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle};
use serde_json::Value;
use toolhost_spec::policy::TenantPolicy;

use crate::{
    ConfigValue, DurableCall, DurableState, HeldCall, KeyRecord, Result, SecretsKey, SharedSpecs,
    Store, StoreError, ToolEntry, ToolRecords, cache_expired, now_ms, open_config, over,
    quota_error, seal_config,
};

fn key(parts: &[&str]) -> Vec<u8> {
    parts.join("\0").into_bytes()
}

/// What every KV key of one tenant's tool starts with.
fn kv_prefix(tenant: &str, tool: &str) -> Vec<u8> {
    key(&[tenant, tool, ""])
}

/// How many keys of `table` start with `prefix`, counting no further than `up_to`.
fn count_prefixed(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    prefix: &[u8],
    up_to: usize,
) -> std::result::Result<usize, redb::Error> {
    let mut count = 0;
    for entry in table.range(prefix..)? {
        if count == up_to || !entry?.0.value().starts_with(prefix) {
            break;
        }
        count += 1;
    }
    Ok(count)
}

/// A table of the store: byte keys to byte values.
type Table = TableDefinition<'static, &'static [u8], &'static [u8]>;

const TOOLS: Table = TableDefinition::new("tools");
const BLOBS: Table = TableDefinition::new("blobs");
/// Every blob's sha, with an empty value: listing `BLOBS` itself reads every blob's bytes.
const BLOB_SHAS: Table = TableDefinition::new("blob_shas");
/// Compiled artifacts as the host hands them over. It seals each one and checks the seal when
/// it reads one back, so the store adds no checksum of its own.
const ARTIFACTS: Table = TableDefinition::new("sealed_artifacts");
/// Where artifacts were kept before, each behind a sha256 of itself; moved once.
const CHECKSUMMED_ARTIFACTS: Table = TableDefinition::new("artifacts");
const CACHE: Table = TableDefinition::new("cache");
/// Each tenant's cached results by expiry (`tenant \0 expires_at key`, see [`expiry_key`]):
/// a put at the tenant's quota removes its expired results without reading the others, while
/// every other tenant's writes wait for it.
const CACHE_EXPIRY: Table = TableDefinition::new("cache_expiry");
const KV: Table = TableDefinition::new("kv");
const CONFIG: Table = TableDefinition::new("config");
const TENANTS: Table = TableDefinition::new("tenants");
const KEYS: Table = TableDefinition::new("keys");
const POLICIES: Table = TableDefinition::new("policies");
const HELD_CALLS: Table = TableDefinition::new("held_calls");
const SEARCH_VECTORS: Table = TableDefinition::new("search_vectors");
const DURABLE_CALLS: Table = TableDefinition::new("durable_calls");
/// The durable calls that have not ended, each with what a claim orders them by
/// ([`Pending`]): a claim reads only the call it takes, not every waiting call's arguments.
const DURABLE_PENDING: Table = TableDefinition::new("durable_pending");
/// What an older version kept in place of [`DURABLE_PENDING`]: removed when that is built.
const DURABLE_UNENDED: Table = TableDefinition::new("durable_unended");
/// Each tenant's ended durable calls, oldest first (`tenant \0 ended_at id`), each with its
/// record's bytes (u64 BE): a call that ends trims its tenant's to the newest
/// [`crate::MAX_ENDED_KEPT`] and [`crate::MAX_ENDED_BYTES`] at once, as PostgreSQL's store
/// does, and the purge finds the old ones without reading any record.
const DURABLE_ENDED: Table = TableDefinition::new("durable_ended");
/// Bytes of each tenant's data (KV and cache entries, keys included), kept with every write.
const USAGE: Table = TableDefinition::new("data_usage");
/// What an older version counted in place of [`USAGE`], without
/// [`crate::ENTRY_OVERHEAD_BYTES`]: removed when that is counted.
const USAGE_WITHOUT_OVERHEAD: Table = TableDefinition::new("usage");
const TABLES: [Table; 17] = [
    DURABLE_CALLS,
    DURABLE_PENDING,
    DURABLE_ENDED,
    TOOLS,
    BLOBS,
    BLOB_SHAS,
    ARTIFACTS,
    CACHE,
    CACHE_EXPIRY,
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
    file: Arc<RedbFile>,
    /// Seals secret configuration values at rest; without it they are stored as given.
    secrets_key: Option<SecretsKey>,
}

/// The file and its synchronous operations, which [`RedbStore`] runs on blocking threads.
struct RedbFile {
    db: redb::Database,
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

impl RedbFile {
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
        let store = RedbFile {
            db,
            _lock: lock,
            failing: Mutex::new(None),
            lazy_commits: AtomicU32::new(0),
            file: None,
        };
        // Every table exists from the start, so that a read never meets a missing one. A
        // store written before usage or blob shas were kept gets them counted once, and so
        // does one an older version wrote to again (what it keeps instead marks it). Read
        // first: a durable commit on every start would cost a restart a disk flush for nothing.
        if store.is_current().map_err(backend)? {
            return Ok(store);
        }
        store.write(Commit::Durable, |tx| {
            let had: Vec<String> = tx.list_tables()?.map(|t| t.name().to_owned()).collect();
            let had = |table: Table| had.iter().any(|name| name == table.name());
            let (counted, listed, indexed) = (had(USAGE), had(BLOB_SHAS), had(CACHE_EXPIRY));
            let checksummed = had(CHECKSUMMED_ARTIFACTS);
            let counted = counted && !had(USAGE_WITHOUT_OVERHEAD);
            let pending = had(DURABLE_PENDING) && !had(DURABLE_UNENDED);
            for table in TABLES {
                tx.open_table(table)?;
            }
            if !counted {
                recount_usage(tx)?;
                tx.delete_table(USAGE_WITHOUT_OVERHEAD)?;
            }
            if !listed {
                list_blob_shas(tx)?;
            }
            if !indexed {
                index_cache_expiry(tx)?;
            }
            if checksummed {
                move_checksummed_artifacts(tx)?;
            }
            if !pending {
                index_pending(tx)?;
            }
            Ok(())
        })?;
        Ok(store)
    }

    /// Whether every table exists and none that an older version keeps in place of one.
    fn is_current(&self) -> std::result::Result<bool, redb::Error> {
        let tx = self.db.begin_read()?;
        let names: std::collections::HashSet<String> = tx
            .list_tables()?
            .map(|table| table.name().to_owned())
            .collect();
        let older = [DURABLE_UNENDED, USAGE_WITHOUT_OVERHEAD];
        Ok(TABLES.iter().all(|table| names.contains(table.name()))
            && !older.iter().any(|table| names.contains(table.name())))
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
/// Parsed one by one as the caller takes them, each raw record freed once parsed.
fn readable<T: serde::de::DeserializeOwned>(
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    what: &str,
) -> impl Iterator<Item = (Vec<u8>, T)> {
    entries
        .into_iter()
        .filter_map(move |(key, value)| match serde_json::from_slice(&value) {
            Ok(record) => Some((key, record)),
            Err(e) => {
                tracing::error!(error = %corrupt(&key, e), "{what} skipped");
                None
            }
        })
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

/// What an entry costs its tenant: key, value and [`crate::ENTRY_OVERHEAD_BYTES`], or nothing
/// if there is none.
fn entry_bytes(key: &[u8], value_len: Option<usize>) -> i64 {
    value_len.map_or(0, |len| {
        (key.len() + len + crate::ENTRY_OVERHEAD_BYTES) as i64
    })
}

fn be_u64(bytes: &[u8]) -> u64 {
    bytes.try_into().map_or(0, u64::from_be_bytes)
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

/// Where the cached result at `cache_key` (`tenant \0 key`) is in [`CACHE_EXPIRY`].
fn expiry_key(cache_key: &[u8], expires_at_ms: u64) -> Vec<u8> {
    let tenant = cache_key
        .iter()
        .position(|&b| b == 0)
        .map_or(cache_key.len(), |i| i + 1);
    let (tenant, key) = cache_key.split_at(tenant);
    [tenant, &expires_at_ms.to_be_bytes(), key].concat()
}

/// The cache key an [`expiry_key`] was made from.
fn cache_key_of(expiry_key: &[u8]) -> Vec<u8> {
    let tenant = expiry_key.iter().position(|&b| b == 0).map_or(0, |i| i + 1);
    let key = expiry_key.get(tenant + 8..).unwrap_or_default();
    [&expiry_key[..tenant], key].concat()
}

/// Indexes every cached result of a store written before [`CACHE_EXPIRY`] was kept.
fn index_cache_expiry(tx: &redb::WriteTransaction) -> std::result::Result<(), redb::Error> {
    let mut index = tx.open_table(CACHE_EXPIRY)?;
    for entry in tx.open_table(CACHE)?.iter()? {
        let (key, stored) = entry?;
        let expiry = expiry_key(key.value(), cache_expiry(stored.value()));
        index.insert(&expiry[..], &[][..])?;
    }
    Ok(())
}

/// Removes the cached result at `key`, if it has expired by `now_ms`, and its place in
/// [`CACHE_EXPIRY`]; the bytes it held.
fn remove_expired(
    tx: &redb::WriteTransaction,
    cache: &mut redb::Table<'_, &'static [u8], &'static [u8]>,
    key: &[u8],
    now_ms: u64,
) -> std::result::Result<i64, redb::Error> {
    let expiry = match cache.get(key)? {
        Some(stored) => cache_expiry(stored.value()),
        None => return Ok(0),
    };
    if !cache_expired(expiry, now_ms) {
        return Ok(0);
    }
    let removed = cache.remove(key)?.map(|stored| stored.value().len());
    (tx.open_table(CACHE_EXPIRY)?).remove(&expiry_key(key, expiry)[..])?;
    Ok(entry_bytes(key, removed))
}

/// Removes `tenant`'s expired results, found through [`CACHE_EXPIRY`]; the bytes they held.
fn purge_expired(
    tx: &redb::WriteTransaction,
    cache: &mut redb::Table<'_, &'static [u8], &'static [u8]>,
    tenant: &str,
    now_ms: u64,
) -> std::result::Result<i64, redb::Error> {
    let prefix = [tenant.as_bytes(), b"\0"].concat();
    let at = |ms: u64| [&prefix[..], &ms.to_be_bytes()].concat();
    // Expired, or further off than any TTL (the clock went back): as `cache_expired` says.
    let latest = now_ms.saturating_add(toolhost_spec::spec::CACHE_TTL_MS.max);
    let mut found = Vec::new();
    let mut index = tx.open_table(CACHE_EXPIRY)?;
    {
        let past = index.range(&at(0)[..]..&at(now_ms.saturating_add(1))[..])?;
        let too_far = index.range(&at(latest.saturating_add(1))[..]..)?;
        for entry in past.chain(too_far) {
            let key = entry?.0.value().to_vec();
            if !key.starts_with(&prefix) {
                break;
            }
            found.push(key);
        }
    }
    // Each place found goes; its result only if the result itself says it expired (a place
    // left by a write the index missed names an older expiry).
    for place in &found {
        index.remove(&place[..])?;
    }
    drop(index);
    let mut freed = 0;
    for place in &found {
        freed += remove_expired(tx, cache, &cache_key_of(place), now_ms)?;
    }
    Ok(freed)
}

/// Where a call not ended is in [`DURABLE_PENDING`]: `tenant \0 id`.
fn pending_key(tenant: &str, id: &[u8]) -> Vec<u8> {
    [tenant.as_bytes(), b"\0", id].concat()
}

/// A durable call not ended, as [`DURABLE_PENDING`] keeps it.
#[derive(Debug, PartialEq)]
struct Pending {
    created_at_ms: u64,
    /// 0 while queued: a running call's lease ends later than that.
    lease_until_ms: u64,
    tenant: String,
}

impl Pending {
    /// `None` once the call has ended.
    fn of(call: &DurableCall) -> Option<Pending> {
        let lease_until_ms = match call.state {
            DurableState::Queued => 0,
            DurableState::Running { lease_until_ms, .. } => lease_until_ms,
            DurableState::Done { .. } | DurableState::Lost { .. } => return None,
        };
        Some(Pending {
            created_at_ms: call.created_at_ms,
            lease_until_ms,
            tenant: call.caller.tenant.clone(),
        })
    }

    fn running(&self) -> bool {
        self.lease_until_ms != 0
    }

    /// Its key in [`DURABLE_PENDING`] (`tenant \0 id`) and its value.
    fn to_entry(&self, id: &[u8]) -> (Vec<u8>, [u8; 16]) {
        let mut value = [0; 16];
        value[..8].copy_from_slice(&self.created_at_ms.to_be_bytes());
        value[8..].copy_from_slice(&self.lease_until_ms.to_be_bytes());
        (pending_key(&self.tenant, id), value)
    }

    /// The call's id and what is kept of it, from its entry in [`DURABLE_PENDING`].
    fn from_entry(key: &[u8], value: &[u8]) -> Option<(Vec<u8>, Pending)> {
        let (tenant, id) = key.split_at(key.iter().position(|&b| b == 0)?);
        let (created, lease) = value.split_first_chunk::<8>()?;
        let pending = Pending {
            created_at_ms: u64::from_be_bytes(*created),
            lease_until_ms: u64::from_be_bytes(lease.try_into().ok()?),
            tenant: String::from_utf8(tenant.to_vec()).ok()?,
        };
        Some((id[1..].to_vec(), pending))
    }
}

/// Writes `call`, and keeps [`DURABLE_PENDING`] and [`DURABLE_ENDED`] in step with its state.
fn store_durable(
    tx: &redb::WriteTransaction,
    calls: &mut redb::Table<&[u8], &[u8]>,
    call: &DurableCall,
) -> std::result::Result<(), redb::Error> {
    let json = serde_json::to_vec(call).expect("a durable call serializes");
    calls.insert(call.id.as_bytes(), &json[..])?;
    let mut pending = tx.open_table(DURABLE_PENDING)?;
    match Pending::of(call) {
        Some(state) => {
            let (key, value) = state.to_entry(call.id.as_bytes());
            pending.insert(&key[..], &value[..])?;
        }
        None => {
            pending.remove(&pending_key(&call.caller.tenant, call.id.as_bytes())[..])?;
            drop(pending);
            keep_newest_ended(tx, calls, call, json.len())?;
        }
    }
    Ok(())
}

/// When `call` ended, if it has.
fn ended_at(call: &DurableCall) -> Option<u64> {
    match call.state {
        DurableState::Done { ended_at_ms, .. } | DurableState::Lost { ended_at_ms, .. } => {
            Some(ended_at_ms)
        }
        DurableState::Queued | DurableState::Running { .. } => None,
    }
}

/// Lists every call not ended in [`DURABLE_PENDING`], and every ended one in
/// [`DURABLE_ENDED`] with its bytes, once, for a store written before they were kept so, and
/// drops what that store kept instead.
fn index_pending(tx: &redb::WriteTransaction) -> std::result::Result<(), redb::Error> {
    // Listed from nothing: an older version may have ended calls listed here as pending.
    tx.delete_table(DURABLE_PENDING)?;
    tx.delete_table(DURABLE_ENDED)?;
    let calls = tx.open_table(DURABLE_CALLS)?;
    let mut pending = tx.open_table(DURABLE_PENDING)?;
    let mut ended = tx.open_table(DURABLE_ENDED)?;
    for entry in calls.iter()? {
        let (id, json) = entry?;
        let Ok(call) = serde_json::from_slice::<DurableCall>(json.value()) else {
            continue;
        };
        if let Some(state) = Pending::of(&call) {
            let (key, value) = state.to_entry(id.value());
            pending.insert(&key[..], &value[..])?;
        } else if let Some(at) = ended_at(&call) {
            let bytes = (json.value().len() as u64).to_be_bytes();
            ended.insert(
                &ended_key(&call.caller.tenant, at, id.value())[..],
                &bytes[..],
            )?;
        }
    }
    tx.delete_table(DURABLE_UNENDED)?;
    Ok(())
}

/// Where an ended call is in [`DURABLE_ENDED`]: its tenant's calls in the order they ended.
fn ended_key(tenant: &str, ended_at_ms: u64, id: &[u8]) -> Vec<u8> {
    [tenant.as_bytes(), b"\0", &ended_at_ms.to_be_bytes(), id].concat()
}

/// Indexes `call`, which has just ended in a record of `bytes`, and removes its tenant's
/// oldest ended calls past [`crate::MAX_ENDED_KEPT`] or [`crate::MAX_ENDED_BYTES`].
fn keep_newest_ended(
    tx: &redb::WriteTransaction,
    calls: &mut redb::Table<&[u8], &[u8]>,
    call: &DurableCall,
    bytes: usize,
) -> std::result::Result<(), redb::Error> {
    let Some(ended_at_ms) = ended_at(call) else {
        return Ok(());
    };
    let tenant = &call.caller.tenant;
    let mut index = tx.open_table(DURABLE_ENDED)?;
    let key = ended_key(tenant, ended_at_ms, call.id.as_bytes());
    index.insert(&key[..], &(bytes as u64).to_be_bytes()[..])?;
    let prefix = [tenant.as_bytes(), b"\0"].concat();
    let end = [tenant.as_bytes(), b"\x01"].concat();
    let (mut kept, mut kept_bytes, mut past) = (0, 0u64, Vec::new());
    for entry in index.range(&prefix[..]..&end[..])?.rev() {
        let (key, bytes) = entry?;
        kept += 1;
        kept_bytes = kept_bytes.saturating_add(be_u64(bytes.value()));
        if kept > crate::MAX_ENDED_KEPT || kept_bytes > crate::MAX_ENDED_BYTES {
            past.push(key.value().to_vec());
        }
    }
    for key in &past {
        index.remove(&key[..])?;
        calls.remove(&key[prefix.len() + 8..])?;
    }
    Ok(())
}

fn recount_usage(tx: &redb::WriteTransaction) -> std::result::Result<(), redb::Error> {
    let mut used: std::collections::HashMap<String, u64> = Default::default();
    for table in [KV, CACHE] {
        for entry in tx.open_table(table)?.iter()? {
            let (key, value) = entry?;
            let bytes = entry_bytes(key.value(), Some(value.value().len()));
            *used.entry(key_tenant(key.value())).or_default() += bytes as u64;
        }
    }
    // Counted from nothing: a tenant whose data is all gone has no count left over.
    tx.delete_table(USAGE)?;
    let mut usage = tx.open_table(USAGE)?;
    for (tenant, bytes) in used {
        usage.insert(tenant.as_bytes(), &bytes.to_be_bytes()[..])?;
    }
    Ok(())
}

/// Stores a blob and lists its sha.
fn insert_blob(
    tx: &redb::WriteTransaction,
    sha: &str,
    bytes: &[u8],
) -> std::result::Result<(), redb::Error> {
    tx.open_table(BLOBS)?.insert(sha.as_bytes(), bytes)?;
    tx.open_table(BLOB_SHAS)?.insert(sha.as_bytes(), &[][..])?;
    Ok(())
}

/// Lists the sha of every stored blob, once, for a store written before they were listed.
fn list_blob_shas(tx: &redb::WriteTransaction) -> std::result::Result<(), redb::Error> {
    let mut shas = tx.open_table(BLOB_SHAS)?;
    for entry in tx.open_table(BLOBS)?.iter()? {
        shas.insert(entry?.0.value(), &[][..])?;
    }
    Ok(())
}

/// Moves artifacts kept behind a checksum, once, without it: the host's seal still checks each.
fn move_checksummed_artifacts(tx: &redb::WriteTransaction) -> std::result::Result<(), redb::Error> {
    {
        let mut artifacts = tx.open_table(ARTIFACTS)?;
        for entry in tx.open_table(CHECKSUMMED_ARTIFACTS)?.iter()? {
            let (key, stored) = entry?;
            if let Some(artifact) = stored.value().get(32..) {
                artifacts.insert(key.value(), artifact)?;
            }
        }
    }
    tx.delete_table(CHECKSUMMED_ARTIFACTS)?;
    Ok(())
}

impl RedbFile {
    fn tool_entries(&self) -> Result<ToolRecords> {
        let records = self.scan(TOOLS, b"")?;
        let read = records.len();
        let entries = SharedSpecs::collect(readable(records, "tool record").map(|(_, e)| e));
        Ok(ToolRecords::of(read, entries))
    }

    fn tool_entries_of(&self, tenant: &str) -> Result<Vec<ToolEntry>> {
        let entries = self.scan(TOOLS, &[tenant.as_bytes(), b"\0"].concat())?;
        Ok(SharedSpecs::collect(
            readable(entries, "tool record").map(|(_, e)| e),
        ))
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

    /// By its listing: a runtime's 12 MB are not read to say it is there.
    fn has_blob(&self, sha: &str) -> Result<bool> {
        self.read(BLOB_SHAS, |t| {
            Ok(t.get(sha.as_bytes()).map_err(backend)?.is_some())
        })
    }

    fn put_blob(&self, sha: &str, bytes: &[u8]) -> Result<()> {
        self.write(Commit::Durable, |tx| insert_blob(tx, sha, bytes))
    }

    fn put_component(
        &self,
        sha: &str,
        bytes: &[u8],
        fingerprint: &str,
        artifact: &[u8],
    ) -> Result<()> {
        self.write(Commit::Durable, |tx| {
            insert_blob(tx, sha, bytes)?;
            let key = format!("{sha}:{fingerprint}");
            tx.open_table(ARTIFACTS)?.insert(key.as_bytes(), artifact)?;
            Ok(())
        })
    }

    fn artifact(&self, sha: &str, fingerprint: &str) -> Result<Option<Vec<u8>>> {
        self.get(ARTIFACTS, format!("{sha}:{fingerprint}").as_bytes())
    }

    fn put_artifact(&self, sha: &str, fingerprint: &str, artifact: &[u8]) -> Result<()> {
        let key = format!("{sha}:{fingerprint}");
        self.put(ARTIFACTS, key.as_bytes(), artifact, Commit::Durable)
    }

    fn durable_put(&self, call: &DurableCall) -> Result<()> {
        self.write(Commit::Durable, |tx| {
            store_durable(tx, &mut tx.open_table(DURABLE_CALLS)?, call)
        })
    }

    fn durable_get(&self, id: &str) -> Result<Option<DurableCall>> {
        self.get_json(DURABLE_CALLS, id.as_bytes())
    }

    /// Of the calls queued, or running with their lease past `now_ms`, the oldest of the
    /// tenant running the fewest calls, leased to `node`: one tenant's flood of slow calls
    /// never holds every worker while another's wait. Ordered by [`DURABLE_PENDING`] alone,
    /// so only the calls tried are read. A stalled call without retries left ends `lost`, and
    /// the next is tried.
    fn durable_claim(
        &self,
        node: &str,
        now_ms: u64,
        lease_until: u64,
    ) -> Result<Option<DurableCall>> {
        // Idle workers ask often: with nothing to claim, no write (and no sync) at all.
        if self.read(DURABLE_PENDING, |t| t.is_empty().map_err(backend))? {
            return Ok(None);
        }
        self.write(Commit::Durable, |tx| {
            let mut pending: Vec<(Vec<u8>, Pending)> = Vec::new();
            for entry in tx.open_table(DURABLE_PENDING)?.iter()? {
                let (key, value) = entry?;
                pending.extend(Pending::from_entry(key.value(), value.value()));
            }
            let mut running: std::collections::HashMap<String, usize> = Default::default();
            for (_, state) in pending.iter().filter(|(_, state)| state.running()) {
                *running.entry(state.tenant.clone()).or_default() += 1;
            }
            let load = |state: &Pending| running.get(&state.tenant).copied().unwrap_or(0);
            pending.sort_by_key(|(_, state)| (load(state), state.created_at_ms));
            let mut calls = tx.open_table(DURABLE_CALLS)?;
            let claimable = |state: &Pending| !state.running() || state.lease_until_ms < now_ms;
            for (id, _) in pending.iter().filter(|(_, state)| claimable(state)) {
                let stored = calls.get(&id[..])?.map(|v| v.value().to_vec());
                let Some(mut call) =
                    stored.and_then(|v| serde_json::from_slice::<DurableCall>(&v).ok())
                else {
                    continue;
                };
                let before = call.state.clone();
                let claimed = crate::claim(&mut call, node, (now_ms, now_ms), lease_until);
                if call.state != before {
                    store_durable(tx, &mut calls, &call)?;
                }
                if claimed.is_some() {
                    return Ok(claimed);
                }
            }
            Ok(None)
        })
    }

    /// Moves `node`'s running call `id` to `next`; whether it was `node`'s.
    fn durable_own(&self, id: &str, node: &str, next: DurableState) -> Result<bool> {
        self.write(Commit::Durable, |tx| {
            let mut calls = tx.open_table(DURABLE_CALLS)?;
            let stored = calls.get(id.as_bytes())?.map(|v| v.value().to_vec());
            let call = stored.and_then(|v| serde_json::from_slice::<DurableCall>(&v).ok());
            let Some(mut call) = call else {
                return Ok(false);
            };
            let mine = matches!(&call.state, DurableState::Running { node: on, .. } if on == node);
            if mine {
                call.state = next;
                store_durable(tx, &mut calls, &call)?;
            }
            Ok(mine)
        })
    }

    /// The tenant's entries in [`DURABLE_PENDING`] alone, without reading the calls.
    fn durable_unfinished(&self, tenant: &str) -> Result<usize> {
        Ok(self.scan(DURABLE_PENDING, &pending_key(tenant, b""))?.len())
    }

    /// By [`DURABLE_ENDED`] alone: no record is read (a tenant's may hold megabytes each).
    fn durable_purge(&self, before_ms: u64) -> Result<usize> {
        let old: Vec<(Vec<u8>, usize)> = self.read(DURABLE_ENDED, |index| {
            let mut old = Vec::new();
            for entry in index.iter().map_err(backend)? {
                let key = entry.map_err(backend)?.0.value().to_vec();
                let Some(tenant_end) = key.iter().position(|&b| b == 0) else {
                    continue;
                };
                let Some(at) = key.get(tenant_end + 1..tenant_end + 9).map(be_u64) else {
                    continue;
                };
                if at < before_ms {
                    old.push((key, tenant_end + 9));
                }
            }
            Ok(old)
        })?;
        self.write(Commit::Durable, |tx| {
            let mut table = tx.open_table(DURABLE_CALLS)?;
            let mut index = tx.open_table(DURABLE_ENDED)?;
            for (key, id_at) in &old {
                index.remove(&key[..])?;
                table.remove(&key[*id_at..])?;
            }
            Ok(old.len())
        })
    }

    /// Every blob's sha.
    fn blob_shas(&self) -> Result<Vec<String>> {
        self.read(BLOB_SHAS, |blobs| {
            let mut shas = Vec::new();
            for entry in blobs.iter().map_err(backend)? {
                shas.push(String::from_utf8_lossy(entry.map_err(backend)?.0.value()).into_owned());
            }
            Ok(shas)
        })
    }

    /// Removes these blobs and their compiled artifacts, in one transaction.
    fn remove_blobs(&self, dead: &[String]) -> Result<()> {
        let artifacts: Vec<Vec<u8>> = dead
            .iter()
            .map(|sha| self.scan(ARTIFACTS, format!("{sha}:").as_bytes()))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .map(|(key, _)| key)
            .collect();
        self.write(Commit::Durable, |tx| {
            let (mut blobs, mut shas) = (tx.open_table(BLOBS)?, tx.open_table(BLOB_SHAS)?);
            for sha in dead {
                blobs.remove(sha.as_bytes())?;
                shas.remove(sha.as_bytes())?;
            }
            let mut stored = tx.open_table(ARTIFACTS)?;
            for key in &artifacts {
                stored.remove(&key[..])?;
            }
            Ok(())
        })
    }

    fn cache_get(&self, tenant: &str, key: &[u8], now_ms: u64) -> Result<Option<Value>> {
        let key = cache_key(tenant, key);
        let Some(stored) = self.get(CACHE, &key)? else {
            return Ok(None);
        };
        if cache_expired(cache_expiry(&stored), now_ms) {
            // Checked again in the write: a put since the read may have renewed it.
            self.write(Commit::Durable, |tx| {
                let freed = remove_expired(tx, &mut tx.open_table(CACHE)?, &key, now_ms)?;
                charge(tx, tenant, -freed)
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
            let new = entry_bytes(&key, Some(stored.len()));
            let replaced = |cache: &redb::Table<'_, &'static [u8], &'static [u8]>| {
                let old = cache.get(&key[..])?.map(|v| v.value().len());
                Ok::<_, redb::Error>(new - entry_bytes(&key, old))
            };
            let mut delta = replaced(&cache)?;
            let mut used = usage(tx, tenant)?;
            if over(used, delta, quota) {
                let freed = purge_expired(tx, &mut cache, tenant, now_ms())?;
                charge(tx, tenant, -freed)?;
                used = usage(tx, tenant)?;
                // The purge may have removed the entry this write replaces: its bytes are
                // already given back.
                delta = replaced(&cache)?;
            }
            if over(used, delta, quota) {
                return Ok(Err(quota_error(used, delta, quota)));
            }
            let mut index = tx.open_table(CACHE_EXPIRY)?;
            if let Some(old) = cache.insert(&key[..], &stored[..])? {
                index.remove(&expiry_key(&key, cache_expiry(old.value()))[..])?;
            }
            index.insert(&expiry_key(&key, expires_at_ms)[..], &[][..])?;
            charge(tx, tenant, delta)?;
            Ok(Ok(()))
        })?
    }

    fn cache_purge(&self, now_ms: u64) -> Result<usize> {
        // Most starts find nothing expired: then there is no write, and no disk flush.
        let expired = |stored: &[u8]| cache_expired(cache_expiry(stored), now_ms);
        let any_expired = self.read(CACHE, |cache| {
            for entry in cache.iter().map_err(backend)? {
                if expired(entry.map_err(backend)?.1.value()) {
                    return Ok(true);
                }
            }
            Ok(false)
        })?;
        if !any_expired {
            return Ok(0);
        }
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
                let removed = remove_expired(tx, &mut cache, key, now_ms)?;
                *freed.entry(key_tenant(key)).or_default() += removed;
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

    fn kv_set(
        &self,
        (tenant, tool, k): (&str, &str, &str),
        value: &[u8],
        (max_keys, quota): (usize, u64),
    ) -> Result<()> {
        let key = key(&[tenant, tool, k]);
        let prefix = kv_prefix(tenant, tool);
        self.write(Commit::Durable, |tx| {
            let mut kv = tx.open_table(KV)?;
            let old = kv.get(&key[..])?.map(|v| v.value().len());
            if old.is_none() && count_prefixed(&kv, &prefix, max_keys)? >= max_keys {
                return Ok(Err(StoreError::KvKeys { limit: max_keys }));
            }
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
        let prefix = kv_prefix(tenant, tool);
        self.read(KV, |kv| {
            count_prefixed(kv, &prefix, usize::MAX).map_err(backend)
        })
    }

    fn config_get(&self, tenant: &str, k: &str) -> Result<Option<ConfigValue>> {
        self.get_json(CONFIG, &key(&[tenant, k]))
    }

    fn config_set(&self, tenant: &str, k: &str, value: &ConfigValue) -> Result<()> {
        let json = serde_json::to_vec(value).expect("a config value serializes");
        self.put(CONFIG, &key(&[tenant, k]), &json, Commit::Durable)
    }

    fn config_delete(&self, tenant: &str, k: &str) -> Result<bool> {
        self.remove(CONFIG, &key(&[tenant, k]))
    }

    fn config_keys(&self, tenant: &str) -> Result<Vec<String>> {
        let prefix = [tenant.as_bytes(), b"\0"].concat();
        // Keys only: each value may be 64 KiB, and every set counts the keys.
        self.read(CONFIG, |t| {
            let mut keys = Vec::new();
            for entry in t.range(&prefix[..]..).map_err(backend)? {
                let (key, _) = entry.map_err(backend)?;
                let Some(name) = key.value().strip_prefix(&prefix[..]) else {
                    break;
                };
                keys.push(String::from_utf8_lossy(name).into_owned());
            }
            Ok(keys)
        })
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
            .map(|(key, held)| (String::from_utf8_lossy(&key).into_owned(), held))
            .collect())
    }

    fn search_vector(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.get(SEARCH_VECTORS, key.as_bytes())
    }

    fn put_search_vector(&self, key: &str, vector: &[u8]) -> Result<()> {
        self.put(SEARCH_VECTORS, key.as_bytes(), vector, Commit::Lazy)
    }

    fn retain_search_vectors(
        &self,
        prefix: &str,
        keep: &std::collections::HashSet<String>,
    ) -> Result<usize> {
        let stale = self.read(SEARCH_VECTORS, |vectors| {
            let mut stale = Vec::new();
            for entry in vectors.range(prefix.as_bytes()..).map_err(backend)? {
                let key = entry.map_err(backend)?.0.value().to_vec();
                if !key.starts_with(prefix.as_bytes()) {
                    break;
                }
                if !std::str::from_utf8(&key).is_ok_and(|key| keep.contains(key)) {
                    stale.push(key);
                }
            }
            Ok(stale)
        })?;
        if stale.is_empty() {
            return Ok(0);
        }
        self.write(Commit::Lazy, |tx| {
            let mut vectors = tx.open_table(SEARCH_VECTORS)?;
            for key in &stale {
                vectors.remove(&key[..])?;
            }
            Ok(stale.len())
        })
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

impl RedbStore {
    /// Opens `dir` with the store's page cache capped at `cache_bytes`.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Self> {
        RedbFile::open(dir, cache_bytes).map(Self::new)
    }

    /// A store that lives only as long as this value, in memory.
    pub fn temporary() -> Result<Self> {
        RedbFile::temporary().map(Self::new)
    }

    fn new(file: RedbFile) -> Self {
        RedbStore {
            file: Arc::new(file),
            secrets_key: None,
        }
    }

    /// Seals secret configuration values written from now on with `key`, and opens sealed
    /// ones with it.
    pub fn with_secrets_key(mut self, key: Option<SecretsKey>) -> Self {
        self.secrets_key = key;
        self
    }

    /// Runs `operation` on the file from one of tokio's blocking threads.
    async fn blocking<T: Send + 'static>(
        &self,
        operation: impl FnOnce(&RedbFile) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || operation(&file))
            .await
            .map_err(|error| StoreError::Backend(format!("a store operation panicked: {error}")))?
    }
}

/// Each method moves its arguments to a blocking thread and runs the file's own there.
#[async_trait::async_trait]
impl Store for RedbStore {
    async fn tool_entries(&self) -> Result<ToolRecords> {
        self.blocking(|file| file.tool_entries()).await
    }

    async fn tool_entries_of(&self, tenant: &str) -> Result<Vec<ToolEntry>> {
        let tenant = tenant.to_owned();
        self.blocking(move |file| file.tool_entries_of(&tenant))
            .await
    }

    async fn put_tool_entries(&self, entries: &[ToolEntry]) -> Result<()> {
        let entries = entries.to_vec();
        self.blocking(move |file| file.put_tool_entries(&entries))
            .await
    }

    async fn remove_tool_entry(&self, tenant: &str, name: &str) -> Result<bool> {
        let (tenant, name) = (tenant.to_owned(), name.to_owned());
        self.blocking(move |file| file.remove_tool_entry(&tenant, &name))
            .await
    }

    async fn has_blob(&self, sha: &str) -> Result<bool> {
        let sha = sha.to_owned();
        self.blocking(move |file| file.has_blob(&sha)).await
    }

    async fn blob(&self, sha: &str) -> Result<Option<Vec<u8>>> {
        let sha = sha.to_owned();
        self.blocking(move |file| file.blob(&sha)).await
    }

    async fn put_blob(&self, sha: &str, bytes: &[u8]) -> Result<()> {
        let (sha, bytes) = (sha.to_owned(), bytes.to_vec());
        self.blocking(move |file| file.put_blob(&sha, &bytes)).await
    }

    async fn put_component(
        &self,
        sha: &str,
        bytes: &[u8],
        fingerprint: &str,
        artifact: &[u8],
    ) -> Result<()> {
        let (sha, bytes) = (sha.to_owned(), bytes.to_vec());
        let (fingerprint, artifact) = (fingerprint.to_owned(), artifact.to_vec());
        self.blocking(move |file| file.put_component(&sha, &bytes, &fingerprint, &artifact))
            .await
    }

    async fn artifact(&self, sha: &str, fingerprint: &str) -> Result<Option<Vec<u8>>> {
        let (sha, fingerprint) = (sha.to_owned(), fingerprint.to_owned());
        self.blocking(move |file| file.artifact(&sha, &fingerprint))
            .await
    }

    async fn put_artifact(&self, sha: &str, fingerprint: &str, artifact: &[u8]) -> Result<()> {
        let (sha, fingerprint) = (sha.to_owned(), fingerprint.to_owned());
        let artifact = artifact.to_vec();
        self.blocking(move |file| file.put_artifact(&sha, &fingerprint, &artifact))
            .await
    }

    async fn collect_blobs(
        &self,
        unreadable: usize,
        live: &(dyn for<'a> Fn(&'a str) -> bool + Sync),
    ) -> Result<usize> {
        // This process holds the file's lock and writes only readable records: the count
        // read at open stands.
        if unreadable > 0 {
            tracing::warn!(unreadable, "tool records unreadable: no blob collected");
            return Ok(0);
        }
        let shas = self.blocking(|file| file.blob_shas()).await?;
        let dead: Vec<String> = shas.into_iter().filter(|sha| !live(sha)).collect();
        if dead.is_empty() {
            return Ok(0);
        }
        let count = dead.len();
        self.blocking(move |file| file.remove_blobs(&dead)).await?;
        Ok(count)
    }

    async fn cache_get(&self, tenant: &str, key: &[u8], now_ms: u64) -> Result<Option<Value>> {
        let (tenant, key) = (tenant.to_owned(), key.to_vec());
        self.blocking(move |file| file.cache_get(&tenant, &key, now_ms))
            .await
    }

    async fn cache_put(
        &self,
        tenant: &str,
        key: &[u8],
        expires_at_ms: u64,
        value: &Value,
        quota: u64,
    ) -> Result<()> {
        let (tenant, key, value) = (tenant.to_owned(), key.to_vec(), value.clone());
        self.blocking(move |file| file.cache_put(&tenant, &key, expires_at_ms, &value, quota))
            .await
    }

    async fn cache_purge(&self, now_ms: u64) -> Result<usize> {
        self.blocking(move |file| file.cache_purge(now_ms)).await
    }

    async fn kv_get(&self, tenant: &str, tool: &str, key: &str) -> Result<Option<Vec<u8>>> {
        let (tenant, tool, key) = (tenant.to_owned(), tool.to_owned(), key.to_owned());
        self.blocking(move |file| file.kv_get(&tenant, &tool, &key))
            .await
    }

    async fn kv_set(
        &self,
        tenant: &str,
        tool: &str,
        key: &str,
        value: &[u8],
        limits: (usize, u64),
    ) -> Result<()> {
        let (tenant, tool, key) = (tenant.to_owned(), tool.to_owned(), key.to_owned());
        let value = value.to_vec();
        self.blocking(move |file| file.kv_set((&tenant, &tool, &key), &value, limits))
            .await
    }

    async fn kv_delete(&self, tenant: &str, tool: &str, key: &str) -> Result<bool> {
        let (tenant, tool, key) = (tenant.to_owned(), tool.to_owned(), key.to_owned());
        self.blocking(move |file| file.kv_delete(&tenant, &tool, &key))
            .await
    }

    async fn kv_count(&self, tenant: &str, tool: &str) -> Result<usize> {
        let (tenant, tool) = (tenant.to_owned(), tool.to_owned());
        self.blocking(move |file| file.kv_count(&tenant, &tool))
            .await
    }

    async fn data_bytes(&self, tenant: &str) -> Result<u64> {
        let tenant = tenant.to_owned();
        self.blocking(move |file| file.data_bytes(&tenant)).await
    }

    async fn config_get(&self, tenant: &str, key: &str) -> Result<Option<ConfigValue>> {
        let (owner, name) = (tenant.to_owned(), key.to_owned());
        let stored = self
            .blocking(move |file| file.config_get(&owner, &name))
            .await?;
        let secrets_key = self.secrets_key.as_ref();
        stored
            .map(|stored| open_config(secrets_key, tenant, key, stored))
            .transpose()
    }

    async fn config_set(&self, tenant: &str, key: &str, value: &ConfigValue) -> Result<()> {
        let stored = seal_config(self.secrets_key.as_ref(), tenant, key, value);
        let (tenant, key) = (tenant.to_owned(), key.to_owned());
        self.blocking(move |file| file.config_set(&tenant, &key, &stored))
            .await
    }

    async fn config_delete(&self, tenant: &str, key: &str) -> Result<bool> {
        let (tenant, key) = (tenant.to_owned(), key.to_owned());
        self.blocking(move |file| file.config_delete(&tenant, &key))
            .await
    }

    async fn config_keys(&self, tenant: &str) -> Result<Vec<String>> {
        let tenant = tenant.to_owned();
        self.blocking(move |file| file.config_keys(&tenant)).await
    }

    async fn policy(&self, tenant: &str) -> Result<Option<TenantPolicy>> {
        let tenant = tenant.to_owned();
        self.blocking(move |file| file.policy(&tenant)).await
    }

    async fn put_policy(&self, tenant: &str, policy: &TenantPolicy) -> Result<()> {
        let (tenant, policy) = (tenant.to_owned(), policy.clone());
        self.blocking(move |file| file.put_policy(&tenant, &policy))
            .await
    }

    async fn tenant_create(&self, tenant: &str, created_at_ms: u64) -> Result<bool> {
        let tenant = tenant.to_owned();
        self.blocking(move |file| file.tenant_create(&tenant, created_at_ms))
            .await
    }

    async fn tenants(&self) -> Result<Vec<String>> {
        self.blocking(|file| file.tenants()).await
    }

    async fn key_put(&self, key_hash: &str, record: &KeyRecord) -> Result<()> {
        let (key_hash, record) = (key_hash.to_owned(), record.clone());
        self.blocking(move |file| file.key_put(&key_hash, &record))
            .await
    }

    async fn key_get(&self, key_hash: &str) -> Result<Option<KeyRecord>> {
        let key_hash = key_hash.to_owned();
        self.blocking(move |file| file.key_get(&key_hash)).await
    }

    async fn keys(&self) -> Result<Vec<KeyRecord>> {
        self.blocking(|file| file.keys()).await
    }

    async fn key_revoke(&self, id: &str) -> Result<bool> {
        let id = id.to_owned();
        self.blocking(move |file| file.key_revoke(&id)).await
    }

    async fn held_call_put(&self, call_id: &str, held: &HeldCall) -> Result<()> {
        let (call_id, held) = (call_id.to_owned(), held.clone());
        self.blocking(move |file| file.held_call_put(&call_id, &held))
            .await
    }

    async fn held_call_remove(&self, call_id: &str) -> Result<bool> {
        let call_id = call_id.to_owned();
        self.blocking(move |file| file.held_call_remove(&call_id))
            .await
    }

    async fn held_calls(&self) -> Result<Vec<(String, HeldCall)>> {
        self.blocking(|file| file.held_calls()).await
    }

    async fn search_vector(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let key = key.to_owned();
        self.blocking(move |file| file.search_vector(&key)).await
    }

    async fn put_search_vector(&self, key: &str, vector: &[u8]) -> Result<()> {
        let (key, vector) = (key.to_owned(), vector.to_vec());
        self.blocking(move |file| file.put_search_vector(&key, &vector))
            .await
    }

    async fn retain_search_vectors(
        &self,
        prefix: &str,
        keep: &std::collections::HashSet<String>,
    ) -> Result<usize> {
        let (prefix, keep) = (prefix.to_owned(), keep.clone());
        self.blocking(move |file| file.retain_search_vectors(&prefix, &keep))
            .await
    }

    async fn durable_put(&self, call: &DurableCall) -> Result<()> {
        let call = call.clone();
        self.blocking(move |file| file.durable_put(&call)).await
    }

    async fn durable_get(&self, id: &str) -> Result<Option<DurableCall>> {
        let id = id.to_owned();
        self.blocking(move |file| file.durable_get(&id)).await
    }

    async fn durable_claim(
        &self,
        node: &str,
        now_ms: u64,
        lease_until_ms: u64,
    ) -> Result<Option<DurableCall>> {
        let node = node.to_owned();
        self.blocking(move |file| file.durable_claim(&node, now_ms, lease_until_ms))
            .await
    }

    async fn durable_renew(&self, id: &str, node: &str, lease_until_ms: u64) -> Result<bool> {
        let (id, node) = (id.to_owned(), node.to_owned());
        let next = DurableState::Running {
            node: node.clone(),
            lease_until_ms,
        };
        self.blocking(move |file| file.durable_own(&id, &node, next))
            .await
    }

    async fn durable_finish(&self, id: &str, node: &str, outcome: &Value) -> Result<bool> {
        let (id, node) = (id.to_owned(), node.to_owned());
        let next = DurableState::Done {
            outcome: outcome.clone(),
            ended_at_ms: now_ms(),
        };
        self.blocking(move |file| file.durable_own(&id, &node, next))
            .await
    }

    async fn durable_unfinished(&self, tenant: &str) -> Result<usize> {
        let tenant = tenant.to_owned();
        self.blocking(move |file| file.durable_unfinished(&tenant))
            .await
    }

    async fn durable_purge(&self, before_ms: u64) -> Result<usize> {
        self.blocking(move |file| file.durable_purge(before_ms))
            .await
    }

    fn health(&self) -> std::result::Result<(), String> {
        self.file.health()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tempfile::TempDir;

    #[test]
    fn the_data_directory_is_the_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
        let store = RedbFile::open(&data, 1 << 20).unwrap();
        let mode = std::fs::metadata(&data).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");
        drop(store);
    }

    /// Kept as given: checking it is the host's (its seal; `tests/it/store.rs`).
    #[test]
    fn an_artifact_is_kept_per_component_and_engine() {
        let store = RedbFile::temporary().unwrap();
        store
            .put_component("abc", b"blob", "fp", b"machine code")
            .unwrap();
        assert_eq!(
            store.artifact("abc", "fp").unwrap().as_deref(),
            Some(&b"machine code"[..])
        );
        assert_eq!(store.artifact("abc", "other-engine").unwrap(), None);
        store.put_artifact("abc", "fp", b"compiled again").unwrap();
        assert_eq!(
            store.artifact("abc", "fp").unwrap().as_deref(),
            Some(&b"compiled again"[..])
        );
        assert_eq!(store.blob("abc").unwrap().as_deref(), Some(&b"blob"[..]));
    }

    #[test]
    fn a_second_process_gets_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let _first = RedbFile::open(dir.path(), 1 << 20).unwrap();
        let second = RedbFile::open(dir.path(), 1 << 20).err().expect("locked");
        assert!(matches!(second, StoreError::Locked { .. }), "{second}");
    }

    /// The names of the store's tables.
    fn table_names(store: &RedbFile) -> Vec<String> {
        let tx = store.db.begin_read().unwrap();
        let tables = tx.list_tables().unwrap();
        tables.map(|t| t.name().to_owned()).collect()
    }

    /// The store `write` fills, reopened as a version that did not keep `table` left it.
    fn reopened_without(table: Table, write: impl FnOnce(&RedbFile)) -> (TempDir, RedbFile) {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = RedbFile::open(dir.path(), 1 << 20).unwrap();
            write(&store);
            store
                .write(Commit::Durable, |tx| {
                    tx.delete_table(table)?;
                    Ok(())
                })
                .unwrap();
        }
        let store = RedbFile::open(dir.path(), 1 << 20).unwrap();
        (dir, store)
    }

    /// The keys of [`CACHE_EXPIRY`], and those the cached results call for.
    fn expiry_index(store: &RedbFile) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let keys = |table, key: fn(&[u8], &[u8]) -> Vec<u8>| {
            let read = |t: &redb::ReadOnlyTable<&'static [u8], &'static [u8]>| {
                let entries = t.iter().map_err(backend)?;
                let mut keys = Vec::new();
                for entry in entries {
                    let (k, v) = entry.map_err(backend)?;
                    keys.push(key(k.value(), v.value()));
                }
                keys.sort();
                Ok(keys)
            };
            store.read(table, read).unwrap()
        };
        (
            keys(CACHE_EXPIRY, |k, _| k.to_vec()),
            keys(CACHE, |k, v| expiry_key(k, cache_expiry(v))),
        )
    }

    /// A put at the tenant's quota finds its expired results through the index: every put,
    /// replacement and removal keeps it naming each cached result once.
    #[test]
    fn the_expiry_index_names_each_cached_result_once() {
        let store = RedbFile::temporary().unwrap();
        let (now, value, no_quota) = (now_ms(), serde_json::json!("result"), u64::MAX);
        let puts: [(&str, &[u8], u64); 5] = [
            ("acme", b"a", now + 60_000),
            ("acme", b"a", now + 90_000),
            ("acme", b"soon", now + 20),
            ("acme\u{1}", b"x", now + 20),
            ("globex", b"soon", now + 20),
        ];
        for (tenant, key, expires_at_ms) in puts {
            (store.cache_put(tenant, key, expires_at_ms, &value, no_quota)).unwrap();
        }
        let (indexed, cached) = expiry_index(&store);
        assert_eq!((indexed.len(), &indexed), (4, &cached));
        std::thread::sleep(std::time::Duration::from_millis(30));
        // At the quota: acme's expired result makes room, no one else's goes.
        let quota = store.data_bytes("acme").unwrap();
        store
            .cache_put("acme", b"b", now + 60_000, &value, quota)
            .unwrap();
        let (indexed, cached) = expiry_index(&store);
        assert_eq!((indexed.len(), &indexed), (4, &cached));
        assert!(indexed.iter().all(|key| cache_key_of(key) != b"acme\0soon"));
        // A place an unindexed write left names an older expiry: the place goes, not the result.
        let stale = expiry_key(b"acme\0a", 1);
        (store.write(Commit::Durable, |tx| {
            tx.open_table(CACHE_EXPIRY)?.insert(&stale[..], &[][..])?;
            Ok(())
        }))
        .unwrap();
        let quota = store.data_bytes("acme").unwrap();
        assert!(
            store
                .cache_put("acme", b"c", now + 60_000, &value, quota)
                .is_err()
        );
        assert!(store.cache_get("acme", b"a", now_ms()).unwrap().is_some());
        assert_eq!(expiry_index(&store).0, indexed);
        assert_eq!(store.cache_get("globex", b"soon", now_ms()).unwrap(), None);
        assert_eq!(store.cache_purge(now_ms()).unwrap(), 1);
        let (indexed, cached) = expiry_index(&store);
        assert_eq!((indexed.len(), &indexed), (2, &cached));
        // A store from before the index gets one.
        let (_dir, store) = reopened_without(CACHE_EXPIRY, |store| {
            store
                .cache_put("acme", b"a", now + 60_000, &value, no_quota)
                .unwrap();
        });
        let (indexed, cached) = expiry_index(&store);
        assert_eq!((indexed.len(), &indexed), (1, &cached));
    }

    #[test]
    fn artifacts_kept_behind_a_checksum_are_moved_once_without_it() {
        let (_dir, store) = reopened_without(ARTIFACTS, |store| {
            store.put_blob("sha", b"component").unwrap();
            let checksummed = [&[7u8; 32][..], b"code"].concat();
            store
                .write(Commit::Durable, |tx| {
                    let mut old = tx.open_table(CHECKSUMMED_ARTIFACTS)?;
                    old.insert(&b"sha:fp"[..], &checksummed[..])?;
                    Ok(())
                })
                .unwrap();
        });
        assert_eq!(
            store.artifact("sha", "fp").unwrap().as_deref(),
            Some(&b"code"[..])
        );
        let tables = table_names(&store);
        assert!(!tables.contains(&"artifacts".to_owned()), "{tables:?}");
    }

    fn durable(id: &str, tenant: &str, state: DurableState) -> DurableCall {
        DurableCall {
            id: id.into(),
            caller: toolhost_spec::call::Caller::tenant(tenant),
            tool: "t".into(),
            args: serde_json::json!({"pad": "x".repeat(1000)}),
            retries_left: 0,
            attempts: 0,
            created_at_ms: 1,
            state,
        }
    }

    #[test]
    fn a_pending_call_reads_back_as_kept() {
        let running = DurableState::Running {
            node: "n".into(),
            lease_until_ms: 7,
        };
        let state = Pending::of(&durable("a:1", "acme", running)).unwrap();
        let (key, value) = state.to_entry(b"a:1");
        assert_eq!(key, b"acme\0a:1");
        assert_eq!(
            Pending::from_entry(&key, &value),
            Some((b"a:1".to_vec(), state))
        );
        let queued = Pending::of(&durable("b", "acme", DurableState::Queued)).unwrap();
        assert!(!queued.running());
        let lost = DurableState::Lost {
            node: "n".into(),
            ended_at_ms: 2,
        };
        assert_eq!(Pending::of(&durable("c", "acme", lost)), None);
        assert_eq!(Pending::from_entry(b"acme\0a", &[0; 15]), None);
        assert_eq!(Pending::from_entry(b"no tenant", &[0; 16]), None);
    }

    #[test]
    fn calls_not_ended_are_listed_once_for_a_store_written_before_they_were_kept() {
        let done = DurableState::Done {
            outcome: serde_json::json!(null),
            ended_at_ms: 2,
        };
        let (_dir, store) = reopened_without(DURABLE_PENDING, |store| {
            store
                .durable_put(&durable("a1", "acme", DurableState::Queued))
                .unwrap();
            store.durable_put(&durable("a2", "acme", done)).unwrap();
            store
                .durable_put(&durable("g1", "globex", DurableState::Queued))
                .unwrap();
            // What the older version kept instead, and no list of ended calls.
            (store.write(Commit::Durable, |tx| {
                tx.open_table(DURABLE_UNENDED)?
                    .insert(&b"a1"[..], &b"acme"[..])?;
                tx.delete_table(DURABLE_ENDED)?;
                Ok(())
            }))
            .unwrap();
        });
        let counts = ["acme", "globex", "initech"].map(|t| store.durable_unfinished(t).unwrap());
        assert_eq!(counts, [1, 1, 0]);
        let tables = table_names(&store);
        assert!(
            !tables.contains(&"durable_unended".to_owned()),
            "{tables:?}"
        );
        let mut claimed = Vec::new();
        while let Some(call) = store.durable_claim("n", 10, 20).unwrap() {
            claimed.push(call.id);
        }
        claimed.sort();
        assert_eq!(claimed, ["a1", "g1"]);
        // The call that had ended is listed too, which is all the purge reads.
        assert_eq!(store.durable_purge(2).unwrap(), 0);
        assert_eq!(store.durable_purge(3).unwrap(), 1);
        assert_eq!(store.durable_get("a2").unwrap(), None);
    }

    /// An older version opening the store again keeps its own tables: then this one lists
    /// and counts everything again, not only what it kept itself.
    #[test]
    fn a_store_an_older_version_wrote_to_again_is_listed_and_counted_again() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = RedbFile::open(dir.path(), 1 << 20).unwrap();
            store
                .durable_put(&durable("a1", "acme", DurableState::Queued))
                .unwrap();
            store
                .kv_set(("t", "tool", "k"), b"value", (usize::MAX, u64::MAX))
                .unwrap();
            // What the older version does: it ends the call and removes the key in its tables.
            let done = DurableState::Done {
                outcome: serde_json::json!(null),
                ended_at_ms: 2,
            };
            let json = serde_json::to_vec(&durable("a1", "acme", done)).unwrap();
            (store.write(Commit::Durable, |tx| {
                tx.open_table(DURABLE_CALLS)?
                    .insert(&b"a1"[..], &json[..])?;
                tx.open_table(KV)?.remove(&key(&["t", "tool", "k"])[..])?;
                tx.open_table(DURABLE_UNENDED)?;
                tx.open_table(USAGE_WITHOUT_OVERHEAD)?;
                Ok(())
            }))
            .unwrap();
        }
        let store = RedbFile::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(store.durable_unfinished("acme").unwrap(), 0);
        assert_eq!(store.durable_claim("n", 10, 20).unwrap(), None);
        assert_eq!(store.data_bytes("t").unwrap(), 0);
        assert_eq!(
            store.durable_purge(3).unwrap(),
            1,
            "the ended call is listed"
        );
        let tables = table_names(&store);
        assert!(
            !tables.contains(&"durable_unended".to_owned()),
            "{tables:?}"
        );
        assert!(!tables.contains(&"usage".to_owned()), "{tables:?}");
    }

    #[test]
    fn usage_is_counted_once_for_a_store_written_before_it_was_kept() {
        let (_dir, store) = reopened_without(USAGE, |store| {
            store
                .kv_set(("t", "tool", "k"), b"value", (usize::MAX, u64::MAX))
                .unwrap();
            // What the older version counted instead, without the overhead.
            (store.write(Commit::Durable, |tx| {
                let count = 14u64.to_be_bytes();
                tx.open_table(USAGE_WITHOUT_OVERHEAD)?
                    .insert(&b"t"[..], &count[..])?;
                Ok(())
            }))
            .unwrap();
        });
        let bytes = "t\0tool\0k".len() + 5 + crate::ENTRY_OVERHEAD_BYTES;
        assert_eq!(store.data_bytes("t").unwrap(), bytes as u64);
        let tables = table_names(&store);
        assert!(
            !tables.contains(&"usage".to_owned()),
            "counted without the overhead: {tables:?}"
        );
    }

    #[test]
    fn blob_shas_are_listed_once_for_a_store_written_before_they_were_kept() {
        let (_dir, store) = reopened_without(BLOB_SHAS, |store| {
            store.put_blob("kept", b"one").unwrap();
            store.put_component("dead", b"two", "fp", b"code").unwrap();
        });
        let mut shas = store.blob_shas().unwrap();
        shas.sort();
        assert_eq!(shas, ["dead", "kept"]);
        store.remove_blobs(&["dead".into()]).unwrap();
        assert_eq!(store.blob_shas().unwrap(), ["kept"]);
        assert_eq!(store.blob("dead").unwrap(), None);
        assert_eq!(store.artifact("dead", "fp").unwrap(), None);
    }

    #[test]
    fn an_unreadable_tool_record_is_skipped_not_fatal() {
        let store = RedbFile::temporary().unwrap();
        let entry = crate::tests::wasm_entry(["sha"]);
        store
            .put_tool_entries(std::slice::from_ref(&entry))
            .unwrap();
        let broken = key(&["a", "broken"]);
        store
            .put(TOOLS, &broken, b"{not an entry", Commit::Durable)
            .unwrap();
        let records = store.tool_entries().unwrap();
        assert_eq!(
            (records.entries, records.unreadable),
            (vec![entry.clone()], 1)
        );
        assert_eq!(store.tool_entries_of("a").unwrap(), vec![entry]);
        assert!(
            store.get(TOOLS, &broken).unwrap().is_some(),
            "left in place"
        );
    }
}
