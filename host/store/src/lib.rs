//! What survives a restart: the [`Store`] trait and its two engines.
//!
//! - [`RedbStore`] (`redb_store.rs`): one file in a data directory, one process. The default.
//! - [`PgStore`] (`postgres.rs`): a PostgreSQL database that many nodes share.
//!
//! Both keep the same records under the same rules (`tests/conformance.rs` runs one suite
//! against each): blobs are content-addressed and written before the entries that point at
//! them, so a crash between the two leaves at worst an unreferenced blob; each write is one
//! transaction, durable when it returns; a tenant's data (KV and cached results) is counted
//! in the same transaction that writes it, so its quota holds however many writers there are.

#![deny(missing_docs)]

#[cfg(feature = "postgres")]
mod postgres;
mod redb_store;
mod sealed;

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[cfg(feature = "postgres")]
pub use postgres::{PgOptions, PgStore};
pub use redb_store::{RedbStore, STORE_FILE};
pub use sealed::SecretsKey;
use toolhost_spec::access::Role;
use toolhost_spec::call::Caller;
use toolhost_spec::policy::TenantPolicy;
use toolhost_spec::spec::{CACHE_TTL_MS, ToolSpec};

/// A tool's history: the versions kept, and which one answers calls. A stored record whose
/// current version is not one it keeps does not read as an entry: it is unreadable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "UncheckedToolEntry")]
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

/// A [`ToolEntry`] as stored, before its current version is checked.
#[derive(Deserialize)]
struct UncheckedToolEntry {
    tenant: String,
    name: String,
    current: u32,
    versions: Vec<ToolVersion>,
}

impl TryFrom<UncheckedToolEntry> for ToolEntry {
    type Error = String;

    fn try_from(stored: UncheckedToolEntry) -> std::result::Result<Self, String> {
        let entry = ToolEntry {
            tenant: stored.tenant,
            name: stored.name,
            current: stored.current,
            versions: stored.versions,
        };
        // `push` numbers the next version after the last: they must ascend, with room left.
        let numbers = entry.versions.iter().map(|v| v.version);
        if numbers.clone().zip(numbers.skip(1)).any(|(a, b)| a >= b)
            || entry.versions.last().is_some_and(|v| v.version == u32::MAX)
        {
            return Err("versions out of order, or no number left for the next".into());
        }
        match entry.version(entry.current) {
            Some(_) => Ok(entry),
            None => Err(format!(
                "current version {} is not one of the {} kept",
                entry.current,
                entry.versions.len()
            )),
        }
    }
}

/// Every tool record as read: the entries that parse, and how many did not.
#[derive(Debug, Default)]
pub struct ToolRecords {
    /// The readable entries.
    pub entries: Vec<ToolEntry>,
    /// Records skipped as unreadable (damaged, or from an incompatible version); each is
    /// logged and left in place.
    pub unreadable: usize,
}

impl ToolRecords {
    /// The entries that parsed out of `read` records.
    pub fn of(read: usize, entries: Vec<ToolEntry>) -> Self {
        ToolRecords {
            unreadable: read - entries.len(),
            entries,
        }
    }
}

/// One installed version of a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolVersion {
    /// Counts from 1 within its entry.
    pub version: u32,
    /// What implements it.
    #[serde(default)]
    pub kind: SourceKind,
    /// The spec it was installed with; one copy for every version read with an equal one
    /// (see [`SharedSpecs`]).
    pub spec: Arc<ToolSpec>,
    /// sha256 (hex) of the blob that implements it: the component, the HTTP request
    /// definition (JSON), or the JS source and the runtime it runs on (JSON).
    pub component: String,
    /// sha256 (hex) of the JS runtime a JS version runs on, which its source blob also names:
    /// kept here so that collecting blobs need not read that blob (absent in records written
    /// before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// That blob's size in bytes, charged to the tenant's code quota (0 in records written
    /// before sizes were kept).
    #[serde(default)]
    pub bytes: u64,
    /// Its spec's size as JSON, counted once at install (absent in records written before it
    /// was kept, until the entry is next written: then [`ToolVersion::spec_bytes`] counts it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub spec_json_bytes: u64,
    /// When it was installed (Unix milliseconds).
    pub installed_at_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ToolVersion {
    /// Its spec's size as JSON, which quotas charge.
    pub fn spec_bytes(&self) -> u64 {
        match self.spec_json_bytes {
            0 => toolhost_spec::clip::json_bytes(&*self.spec),
            counted => counted,
        }
    }
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

    /// The version calls run, taken out of the entry.
    pub fn into_current(self) -> ToolVersion {
        let current = self.current;
        self.versions
            .into_iter()
            .find(|v| v.version == current)
            .expect("an entry's current version is one of its versions")
    }

    /// The kept version numbered `version`.
    pub fn version(&self, version: u32) -> Option<&ToolVersion> {
        self.versions.iter().find(|v| v.version == version)
    }

    /// Adds `spec` as the next version and makes it current: implemented by the blob
    /// `component` of `bytes` bytes, on the JS runtime `runtime` for a JS version.
    pub fn push(
        &mut self,
        (kind, runtime): (SourceKind, Option<String>),
        spec: impl Into<Arc<ToolSpec>>,
        component: String,
        bytes: u64,
        installed_at_ms: u64,
    ) {
        let version = self.versions.last().map_or(1, |v| v.version + 1);
        let spec = spec.into();
        self.versions.push(ToolVersion {
            version,
            kind,
            spec_json_bytes: toolhost_spec::clip::json_bytes(&*spec),
            spec,
            component,
            runtime,
            bytes,
            installed_at_ms,
        });
        let excess = self.versions.len().saturating_sub(MAX_VERSIONS_KEPT);
        self.versions.drain(..excess);
        for older in &mut self.versions {
            older.spec_json_bytes = older.spec_bytes();
        }
        self.current = version;
    }
}

/// Equal specs held once: a component that a thousand tenants installed would otherwise be
/// parsed into a thousand copies of each of its specs. Holds none itself: a spec no tool
/// holds any more is forgotten.
#[derive(Default)]
pub struct SharedSpecs {
    by_code: HashMap<String, Weak<ToolSpec>>,
    /// Forgotten specs are swept out when the map has grown past this.
    sweep_at: usize,
}

impl SharedSpecs {
    /// `entries` as read, one at a time, each spec shared with an equal one read before it.
    pub fn collect(entries: impl Iterator<Item = ToolEntry>) -> Vec<ToolEntry> {
        let mut specs = SharedSpecs::default();
        entries.map(|entry| specs.share(entry)).collect()
    }

    /// `entry`, each of its versions pointing at an equal spec seen before for the same code.
    fn share(&mut self, mut entry: ToolEntry) -> ToolEntry {
        for version in &mut entry.versions {
            self.share_spec(&version.component, &mut version.spec);
        }
        entry
    }

    /// Points `spec`, implemented by the blob `component`, at an equal one seen before.
    pub fn share_spec(&mut self, component: &str, spec: &mut Arc<ToolSpec>) {
        use std::collections::hash_map::Entry;
        if self.by_code.len() >= self.sweep_at {
            self.by_code.retain(|_, seen| seen.strong_count() > 0);
            self.sweep_at = (2 * self.by_code.len()).max(1024);
        }
        match self.by_code.entry(format!("{component}/{}", spec.name)) {
            Entry::Occupied(mut slot) => match slot.get().upgrade() {
                Some(seen) if *seen == **spec => *spec = seen,
                // The same code installed with another spec: kept as it is.
                Some(_) => {}
                None => {
                    slot.insert(Arc::downgrade(spec));
                }
            },
            Entry::Vacant(slot) => {
                slot.insert(Arc::downgrade(spec));
            }
        }
    }
}

/// Bytes of code `entries` hold: the blob of every kept version, each distinct one once, and
/// every kept version's spec (as JSON). The specs count because a tenant can add any number
/// of tools over one blob (HTTP tools with the same request), each with schemas of up to
/// 64 KiB.
pub fn code_bytes<'a>(entries: impl IntoIterator<Item = &'a ToolEntry>) -> u64 {
    let mut blobs = std::collections::HashMap::new();
    let mut specs = 0u64;
    for version in entries.into_iter().flat_map(|entry| &entry.versions) {
        blobs.insert(&version.component, version.bytes);
        specs = specs.saturating_add(version.spec_bytes());
    }
    blobs.values().sum::<u64>().saturating_add(specs)
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
        "the tenant's data (KV entries and cached results) holds {used} bytes; {adding} more \
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
    /// The write would give the tool a key more than it may hold.
    #[error("this tool already has {limit} keys, the limit")]
    KvKeys {
        /// The most keys one tool may hold.
        limit: usize,
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
/// reads or writes tenant data takes the tenant. Async: a database is a network round trip
/// away, and a file store's synced writes block, so neither may hold an executor thread.
#[async_trait::async_trait]
pub trait Store: Send + Sync {
    /// Every tool entry of every tenant, and how many records were skipped as unreadable.
    async fn tool_entries(&self) -> Result<ToolRecords>;
    /// One tenant's tool entries.
    async fn tool_entries_of(&self, tenant: &str) -> Result<Vec<ToolEntry>>;
    /// Writes all entries at once: after a crash, either all of them are there or none.
    async fn put_tool_entries(&self, entries: &[ToolEntry]) -> Result<()>;
    /// Forgets a tool; false if there was none.
    async fn remove_tool_entry(&self, tenant: &str, name: &str) -> Result<bool>;
    /// Each tenant's tools revision: it moves whenever any of the tenant's entries is written
    /// or removed, by any process, so a node re-reads only the tenants whose revision moved.
    /// Empty for a store only this process writes: nothing there changes behind its back.
    async fn tool_revisions(&self) -> Result<HashMap<String, u64>> {
        Ok(HashMap::new())
    }
    /// Holds the tenant's tool entries for one read-modify-write (an install, a rollback, a
    /// removal) against every other process on this store, until the lock is dropped. A
    /// store only this process writes has nothing to lock: the host serializes its own.
    async fn lock_entries(&self, tenant: &str) -> Result<EntriesLock> {
        let _ = tenant;
        Ok(EntriesLock(None))
    }

    /// The blob with this sha256 (hex).
    async fn blob(&self, sha: &str) -> Result<Option<Vec<u8>>>;
    /// Whether the blob with this sha256 (hex) is stored, without reading it.
    async fn has_blob(&self, sha: &str) -> Result<bool> {
        Ok(self.blob(sha).await?.is_some())
    }
    /// Whether blob `sha` is stored; if so, it counts as stored just now, as a second
    /// [`Store::put_blob`] would make it, without sending its bytes (another node collects
    /// only blobs stored long enough ago that no install can be about to name them).
    async fn touch_blob(&self, sha: &str) -> Result<bool> {
        self.has_blob(sha).await
    }
    /// Stores `bytes` under `sha`, their sha256 (hex).
    async fn put_blob(&self, sha: &str, bytes: &[u8]) -> Result<()>;
    /// Stores a component and its compiled artifact before any entry points at them.
    async fn put_component(
        &self,
        sha: &str,
        bytes: &[u8],
        fingerprint: &str,
        artifact: &[u8],
    ) -> Result<()>;
    /// The artifact as stored. The host checks it (it seals every artifact it stores) and
    /// replaces one that fails with [`Store::put_artifact`].
    async fn artifact(&self, sha: &str, fingerprint: &str) -> Result<Option<Vec<u8>>>;
    /// Replaces a compiled artifact (one compiled again after the last was dropped).
    async fn put_artifact(&self, sha: &str, fingerprint: &str, artifact: &[u8]) -> Result<()>;
    /// Removes every blob that `live` does not keep, with its compiled artifacts; returns how
    /// many. Removes nothing while a tool record is unreadable: what it refers to is unknown.
    /// `unreadable` is the count the caller's [`Store::tool_entries`] just gave: a store only
    /// this process writes trusts it rather than parse every record again; one that other
    /// nodes write reads its records again, each only as far as the blobs it names (a record
    /// that is no longer a valid entry but still names them keeps them).
    async fn collect_blobs(
        &self,
        unreadable: usize,
        live: &(dyn for<'a> Fn(&'a str) -> bool + Sync),
    ) -> Result<usize>;

    /// A tenant's cached result, unless it expired by `now_ms`.
    async fn cache_get(&self, tenant: &str, key: &[u8], now_ms: u64) -> Result<Option<Value>>;
    /// Caches a tenant's result until `expires_at_ms`, within the tenant's data quota (its
    /// expired results are dropped first if the quota is reached).
    async fn cache_put(
        &self,
        tenant: &str,
        key: &[u8],
        expires_at_ms: u64,
        value: &Value,
        quota: u64,
    ) -> Result<()>;
    /// Drops expired results; returns how many.
    async fn cache_purge(&self, now_ms: u64) -> Result<usize>;

    /// A tool's KV value.
    async fn kv_get(&self, tenant: &str, tool: &str, key: &str) -> Result<Option<Vec<u8>>>;
    /// Sets a tool's KV value, unless a new key would give the tool more than `max_keys`
    /// keys or the write would take the tenant's data past `quota` bytes. Both are checked
    /// in the write's own transaction, so concurrent writers cannot pass them together.
    async fn kv_set(
        &self,
        tenant: &str,
        tool: &str,
        key: &str,
        value: &[u8],
        (max_keys, quota): (usize, u64),
    ) -> Result<()>;
    /// Deletes a tool's KV value; false if there was none.
    async fn kv_delete(&self, tenant: &str, tool: &str, key: &str) -> Result<bool>;
    /// How many KV keys a tool holds.
    async fn kv_count(&self, tenant: &str, tool: &str) -> Result<usize>;
    /// Bytes of the tenant's data: its KV keys and values and its cached results.
    async fn data_bytes(&self, tenant: &str) -> Result<u64>;

    /// A tenant's configuration value (opened, if sealed).
    async fn config_get(&self, tenant: &str, key: &str) -> Result<Option<ConfigValue>>;
    /// Sets a tenant's configuration value (sealed, if secret and a key is set).
    async fn config_set(&self, tenant: &str, key: &str, value: &ConfigValue) -> Result<()>;
    /// Deletes a configuration value; false if there was none.
    async fn config_delete(&self, tenant: &str, key: &str) -> Result<bool>;
    /// A tenant's configuration keys.
    async fn config_keys(&self, tenant: &str) -> Result<Vec<String>>;

    /// A tenant's policy, if it has one.
    async fn policy(&self, tenant: &str) -> Result<Option<TenantPolicy>>;
    /// Sets a tenant's policy.
    async fn put_policy(&self, tenant: &str, policy: &TenantPolicy) -> Result<()>;

    /// Records a tenant; false if it existed.
    async fn tenant_create(&self, tenant: &str, created_at_ms: u64) -> Result<bool>;
    /// Every tenant.
    async fn tenants(&self) -> Result<Vec<String>>;
    /// Stores an API key's record under the key's sha256.
    async fn key_put(&self, key_hash: &str, record: &KeyRecord) -> Result<()>;
    /// The record of the key with this sha256.
    async fn key_get(&self, key_hash: &str) -> Result<Option<KeyRecord>>;
    /// Every key's record.
    async fn keys(&self) -> Result<Vec<KeyRecord>>;
    /// Revokes the key with this public id; false if there was none.
    async fn key_revoke(&self, id: &str) -> Result<bool>;

    /// Calls waiting for approval, by call id.
    async fn held_call_put(&self, call_id: &str, held: &HeldCall) -> Result<()>;
    /// Forgets a held call; false if there was none.
    async fn held_call_remove(&self, call_id: &str) -> Result<bool>;
    /// Every held call, by call id.
    async fn held_calls(&self) -> Result<Vec<(String, HeldCall)>>;

    /// A search model's vector of a tool's text (its bytes, as the search crate encodes
    /// them), by model fingerprint and text digest.
    async fn search_vector(&self, key: &str) -> Result<Option<Vec<u8>>>;
    /// Committed lazily: a vector lost in a crash is encoded again.
    async fn put_search_vector(&self, key: &str, vector: &[u8]) -> Result<()>;
    /// Removes the vectors whose key starts with `prefix` (one model's) and is not in `keep`
    /// (no longer any tool's text); how many.
    async fn retain_search_vectors(
        &self,
        prefix: &str,
        keep: &std::collections::HashSet<String>,
    ) -> Result<usize>;

    /// Queues a durable call ([`DurableState::Queued`]).
    async fn durable_put(&self, call: &DurableCall) -> Result<()>;
    /// A durable call by id.
    async fn durable_get(&self, id: &str) -> Result<Option<DurableCall>>;
    /// Claims the oldest call ready to run for `node`, leased until `lease_until_ms`: a
    /// queued one, or one whose lease ran out by `now_ms` (its node died). Such a stalled call
    /// runs again only while it has `retries_left`; otherwise it ends [`DurableState::Lost`]
    /// and the next is tried. However many nodes claim at once, each call goes to one.
    async fn durable_claim(
        &self,
        node: &str,
        now_ms: u64,
        lease_until_ms: u64,
    ) -> Result<Option<DurableCall>>;
    /// Extends `node`'s lease on a running call; false if the call is no longer `node`'s.
    async fn durable_renew(&self, id: &str, node: &str, lease_until_ms: u64) -> Result<bool>;
    /// Records a call's outcome, if the call is still `node`'s; false if it is not (its lease
    /// ran out and another node took it, or it ended lost).
    async fn durable_finish(&self, id: &str, node: &str, outcome: &Value) -> Result<bool>;
    /// How many of the tenant's durable calls have not ended.
    async fn durable_unfinished(&self, tenant: &str) -> Result<usize>;
    /// Forgets the calls that ended before `before_ms`, and each tenant's ended calls past
    /// the newest [`MAX_ENDED_KEPT`]; how many.
    async fn durable_purge(&self, before_ms: u64) -> Result<usize>;

    /// An MCP session's tenant and state (rmcp's `SessionState` as JSON), for a node that does
    /// not hold it to restore. A store of one node keeps none: its sessions live in memory.
    async fn mcp_session(&self, id: &str) -> Result<Option<(String, String)>> {
        let _ = id;
        Ok(None)
    }
    /// Keeps an MCP session's state; forgets sessions untouched for [`MCP_SESSION_TTL_MS`].
    async fn put_mcp_session(
        &self,
        id: &str,
        tenant: &str,
        state: &str,
        now_ms: u64,
    ) -> Result<()> {
        let _ = (id, tenant, state, now_ms);
        Ok(())
    }
    /// Forgets an MCP session (it ended).
    async fn remove_mcp_session(&self, id: &str) -> Result<()> {
        let _ = id;
        Ok(())
    }
    /// Forgets an MCP session unless it was kept again after `touched_at_ms` (another node
    /// took it up and serves it: the session is idle only here).
    async fn remove_mcp_session_untouched_since(&self, id: &str, touched_at_ms: u64) -> Result<()> {
        let _ = (id, touched_at_ms);
        Ok(())
    }

    /// Records that `node` is alive now, in the store's own time (nodes' clocks may differ);
    /// how many nodes are (heard from within [`NODE_TTL_MS`]), this one included. A store only
    /// this process writes is one node.
    async fn heartbeat(&self, node: &str) -> Result<u32> {
        let _ = node;
        Ok(1)
    }
    /// Forgets `node` (it is stopping), so the others' shares grow at once.
    async fn depart(&self, node: &str) -> Result<()> {
        let _ = node;
        Ok(())
    }

    /// Whether writes reach the disk; if one failed, why. Reads from memory go on either way.
    fn health(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    /// What other processes change in this store, as they are told of it; `None` when this
    /// process is its only writer. A receiver that lags behind gets `Lagged` from the
    /// channel: like [`Change::Resync`], it means "read everything again".
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<Change>> {
        None
    }
}

/// An MCP session not restored or opened for this long is forgotten by the shared store.
pub const MCP_SESSION_TTL_MS: u64 = 24 * 3600 * 1000;

/// Ended durable calls kept per tenant (the newest); older ones are forgotten as others end.
pub const MAX_ENDED_KEPT: usize = 1000;

/// Bytes of ended durable calls kept per tenant, as stored (each with its arguments, caller
/// data and outcome: up to megabytes): past it the oldest are forgotten as others end.
pub const MAX_ENDED_BYTES: u64 = 64 << 20;

/// A node not heard from for this long no longer counts as alive (nodes beat every 5 s).
pub const NODE_TTL_MS: u64 = 15_000;

/// A call submitted to run later, on whichever node claims it, and what became of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DurableCall {
    /// The call id, also its outcome's.
    pub id: String,
    /// Who called.
    pub caller: Caller,
    /// The tool, by name.
    pub tool: String,
    /// The arguments as given.
    pub args: Value,
    /// Times a stalled run may still be started again: the tool's `retry_count_on_stall` if
    /// it is idempotent, else 0.
    pub retries_left: u32,
    /// Runs started so far.
    pub attempts: u32,
    /// When it was submitted (Unix milliseconds).
    pub created_at_ms: u64,
    /// Where it stands.
    pub state: DurableState,
}

impl DurableCall {
    /// Whether it has ended, one way or the other.
    pub fn ended(&self) -> bool {
        matches!(
            self.state,
            DurableState::Done { .. } | DurableState::Lost { .. }
        )
    }
}

/// Where a durable call stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum DurableState {
    /// Waiting for a node.
    Queued,
    /// Running on `node`, which renews its lease while it runs.
    Running {
        /// The node's id.
        node: String,
        /// When the call is taken to be stalled unless renewed (Unix milliseconds).
        lease_until_ms: u64,
    },
    /// Ended, with its outcome (`CallOutcome::to_json`).
    Done {
        /// The outcome.
        outcome: Value,
        /// When (Unix milliseconds).
        ended_at_ms: u64,
    },
    /// Its node stopped renewing the lease and the tool may not run twice.
    Lost {
        /// The node it was lost with.
        node: String,
        /// When the loss was noticed (Unix milliseconds).
        ended_at_ms: u64,
    },
}

impl DurableState {
    /// The stored status: `queued`, `running`, `done` or `lost`.
    pub fn status(&self) -> &'static str {
        match self {
            DurableState::Queued => "queued",
            DurableState::Running { .. } => "running",
            DurableState::Done { .. } => "done",
            DurableState::Lost { .. } => "lost",
        }
    }
}

/// What a claim at `now_ms` makes of a call that is queued, or whose lease ran out before
/// `stalled_before_ms`: the call to run (leased to `node`), or `None` when it is not ready. A
/// stalled call without retries left is ended lost in `call` itself.
pub(crate) fn claim(
    call: &mut DurableCall,
    node: &str,
    (now_ms, stalled_before_ms): (u64, u64),
    lease_until_ms: u64,
) -> Option<DurableCall> {
    match &call.state {
        DurableState::Queued => {}
        DurableState::Running {
            node: running_on,
            lease_until_ms: lease,
        } if *lease < stalled_before_ms => {
            if call.retries_left == 0 {
                let lost = running_on.clone();
                call.state = DurableState::Lost {
                    node: lost,
                    ended_at_ms: now_ms,
                };
                return None;
            }
            call.retries_left -= 1;
        }
        _ => return None,
    }
    call.attempts += 1;
    call.state = DurableState::Running {
        node: node.to_owned(),
        lease_until_ms,
    };
    Some(call.clone())
}

/// Held while a tenant's tool entries are read and written back ([`Store::lock_entries`]).
pub struct EntriesLock(pub Option<Box<dyn std::any::Any + Send>>);

/// A change another node made to records this node caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A tenant's tools: installed, rolled back or removed.
    Tools {
        /// Whose.
        tenant: String,
    },
    /// A tenant's policy.
    Policy {
        /// Whose.
        tenant: String,
    },
    /// A tenant's configuration.
    Config {
        /// Whose.
        tenant: String,
    },
    /// An API key made or revoked.
    Keys,
    /// A call held for approval, or one decided.
    HeldCalls,
    /// A durable call submitted: a node with a free worker may claim it.
    Calls,
    /// A durable call ended: its waiting readers may look.
    CallEnded,
    /// Notices may have been missed (the connection that receives them dropped): read
    /// everything again.
    Resync,
}

impl Change {
    /// As sent between nodes: `tools acme`, `keys`, ...
    pub fn to_notice(&self) -> String {
        match self {
            Change::Tools { tenant } => format!("tools {tenant}"),
            Change::Policy { tenant } => format!("policy {tenant}"),
            Change::Config { tenant } => format!("config {tenant}"),
            Change::Keys => "keys".into(),
            Change::HeldCalls => "held_calls".into(),
            Change::Calls => "calls".into(),
            Change::CallEnded => "call_ended".into(),
            Change::Resync => "resync".into(),
        }
    }

    /// The change a notice names; `None` for one this version does not know.
    pub fn from_notice(notice: &str) -> Option<Self> {
        let (kind, tenant) = notice.split_once(' ').unwrap_or((notice, ""));
        let tenant = tenant.to_owned();
        Some(match kind {
            "tools" => Change::Tools { tenant },
            "policy" => Change::Policy { tenant },
            "config" => Change::Config { tenant },
            "keys" => Change::Keys,
            "held_calls" => Change::HeldCalls,
            "calls" => Change::Calls,
            "call_ended" => Change::CallEnded,
            "resync" => Change::Resync,
            _ => return None,
        })
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
pub(crate) fn cache_expired(expires_at_ms: u64, now_ms: u64) -> bool {
    expires_at_ms <= now_ms || expires_at_ms - now_ms > CACHE_TTL_MS.max
}

/// What each KV entry and cached result costs its tenant's data quota beyond its key and
/// value: the store's own bookkeeping for it, so that a tenant cannot fill the disk with
/// empty entries. A PostgreSQL `kv` row of a 4-byte key and no value takes 76.5 bytes with
/// its index, 62.5 more than its key.
pub const ENTRY_OVERHEAD_BYTES: usize = 64;

#[cfg(feature = "postgres")]
/// What a KV entry costs its tenant: its key (`tenant \0 tool \0 key`), its value and
/// [`ENTRY_OVERHEAD_BYTES`].
pub(crate) fn kv_bytes(tenant: &str, tool: &str, key: &str, value_len: usize) -> i64 {
    (tenant.len() + 1 + tool.len() + 1 + key.len() + value_len + ENTRY_OVERHEAD_BYTES) as i64
}

#[cfg(feature = "postgres")]
/// What a cached result costs its tenant: its key (`tenant \0 key`), its expiry (8 bytes),
/// its JSON and [`ENTRY_OVERHEAD_BYTES`].
pub(crate) fn cache_bytes(tenant: &str, key: &[u8], json_len: usize) -> i64 {
    (tenant.len() + 1 + key.len() + 8 + json_len + ENTRY_OVERHEAD_BYTES) as i64
}

/// Whether adding `delta` bytes to `used` passes `quota` (shrinking never does).
pub(crate) fn over(used: u64, delta: i64, quota: u64) -> bool {
    delta > 0 && used.saturating_add(delta as u64) > quota
}

pub(crate) fn quota_error(used: u64, delta: i64, quota: u64) -> StoreError {
    StoreError::Quota {
        used,
        adding: delta.max(0) as u64,
        quota,
    }
}

/// A configuration value as stored: sealed when it is a secret and there is a key.
pub(crate) fn seal_config(
    secrets_key: Option<&SecretsKey>,
    tenant: &str,
    key: &str,
    value: &ConfigValue,
) -> ConfigValue {
    match (secrets_key, value.secret) {
        (Some(secrets_key), true) => ConfigValue {
            value: sealed::seal(secrets_key, tenant, key, &value.value),
            secret: true,
        },
        _ => value.clone(),
    }
}

/// A stored configuration value as the tool reads it: opened, if sealed.
pub(crate) fn open_config(
    secrets_key: Option<&SecretsKey>,
    tenant: &str,
    key: &str,
    mut stored: ConfigValue,
) -> Result<ConfigValue> {
    if stored.secret {
        stored.value = sealed::open(secrets_key, tenant, key, &stored.value)?;
    }
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Tool `t` of tenant `a`, with a Wasm version for each of `shas`, oldest first.
    pub(crate) fn wasm_entry(shas: impl IntoIterator<Item = impl ToString>) -> ToolEntry {
        let spec = ToolSpec::new("t", "d", json!({"type": "object"}));
        let mut entry = ToolEntry {
            tenant: "a".into(),
            name: "t".into(),
            current: 0,
            versions: vec![],
        };
        for (at, sha) in (1..).zip(shas) {
            let kind = (SourceKind::Wasm, None);
            entry.push(kind, spec.clone(), sha.to_string(), 10, at);
        }
        entry
    }

    #[test]
    fn an_equal_spec_is_shared_only_while_a_tool_holds_it() {
        let mut specs = SharedSpecs::default();
        let spec = || Arc::new(ToolSpec::new("t", "d", json!({"type": "object"})));
        let mut first = spec();
        let address = Arc::as_ptr(&first);
        specs.share_spec("sha1", &mut first);
        assert_eq!(Arc::as_ptr(&first), address, "nothing seen yet: its own");
        let mut second = spec();
        specs.share_spec("sha1", &mut second);
        assert!(Arc::ptr_eq(&first, &second), "equal, same code: shared");
        let mut edited = Arc::new(ToolSpec::new("t", "another", json!({"type": "object"})));
        specs.share_spec("sha1", &mut edited);
        assert!(
            !Arc::ptr_eq(&second, &edited),
            "same code, another spec: its own"
        );
        let mut other_code = spec();
        specs.share_spec("sha2", &mut other_code);
        assert!(!Arc::ptr_eq(&second, &other_code), "other code: its own");
        drop((first, second));
        let mut after = spec();
        let address = Arc::as_ptr(&after);
        specs.share_spec("sha1", &mut after);
        assert_eq!(
            Arc::as_ptr(&after),
            address,
            "no tool held the old one: kept as read"
        );
        let mut again = spec();
        specs.share_spec("sha1", &mut again);
        assert!(Arc::ptr_eq(&after, &again), "and it is the one shared now");
    }

    #[test]
    fn forgotten_specs_are_swept_out() {
        let mut specs = SharedSpecs::default();
        for sha in 0..5_000 {
            let mut spec = Arc::new(ToolSpec::new("t", "d", json!({"type": "object"})));
            specs.share_spec(&sha.to_string(), &mut spec);
        }
        assert!(specs.by_code.len() <= 1024, "{} kept", specs.by_code.len());
    }

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
    fn an_entry_whose_current_version_is_not_kept_does_not_read() {
        let entry = wasm_entry(["sha"]);
        let mut stored = serde_json::to_value(&entry).unwrap();
        assert_eq!(
            serde_json::from_value::<ToolEntry>(stored.clone()).unwrap(),
            entry
        );
        stored["current"] = json!(2);
        let error = serde_json::from_value::<ToolEntry>(stored).unwrap_err();
        assert!(error.to_string().contains("current version 2"), "{error}");
    }

    #[test]
    fn an_entry_whose_versions_leave_no_next_number_does_not_read() {
        let stored = serde_json::to_value(wasm_entry(["sha1", "sha2"])).unwrap();
        for versions in [[2, 1], [1, 1], [1, u32::MAX]] {
            let mut tampered = stored.clone();
            for (at, version) in versions.into_iter().enumerate() {
                tampered["versions"][at]["version"] = json!(version);
            }
            tampered["current"] = json!(versions[1]);
            let error = serde_json::from_value::<ToolEntry>(tampered).unwrap_err();
            assert!(error.to_string().contains("out of order"), "{versions:?}");
        }
    }

    #[test]
    fn versions_are_numbered_and_bounded() {
        let entry = wasm_entry((0..MAX_VERSIONS_KEPT + 5).map(|i| format!("sha{i}")));
        assert_eq!(entry.versions.len(), MAX_VERSIONS_KEPT);
        assert_eq!(entry.current, (MAX_VERSIONS_KEPT + 5) as u32);
        assert_eq!(
            entry.current().component,
            format!("sha{}", MAX_VERSIONS_KEPT + 4)
        );
        assert_eq!(entry.versions[0].version, 6);
    }
}
