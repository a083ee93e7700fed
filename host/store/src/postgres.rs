//! [`PgStore`]: the store in a PostgreSQL database, shared by every node of a cluster.
//!
//! The schema is `migrations/*.sql`, applied in order at connect (sqlx's migrator, which
//! takes an advisory lock, so nodes starting together apply each once). Compiled artifacts
//! are not kept here: they belong to a node's engine and stay on its disk
//! (`HostConfig::artifact_dir`).
//!
//! A write that other nodes cache (tools, policies, keys, configuration, held calls) sends a
//! `NOTIFY` in its own transaction, so it is announced exactly when it is visible; every node
//! `LISTEN`s and passes the notices on as [`Change`]s.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use sqlx::{Postgres, Row, Transaction};
use tokio::sync::{broadcast, oneshot};
use toolhost_spec::policy::TenantPolicy;

use crate::{
    Change, ConfigValue, DurableCall, DurableState, EntriesLock, HeldCall, KeyRecord, Result,
    SecretsKey, SharedSpecs, Store, StoreError, ToolEntry, ToolRecords, cache_bytes, cache_expired,
    kv_bytes, now_ms, open_config, over, quota_error, seal_config,
};

/// A blob this young is never collected: an install on another node may not have written
/// the entry that refers to it yet. (Re-storing a blob makes it young again.)
const BLOB_GRACE_MS: u64 = 60 * 60 * 1000;

/// Connections a node keeps apart for leases and heartbeats.
const CONTROL_CONNECTIONS: u32 = 3;

/// The channel every node listens on.
const CHANNEL: &str = "toolhost_changes";

/// The migrations, in order; a released one never changes (sqlx checks their checksums).
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "initial", include_str!("../migrations/0001_initial.sql")),
    (
        2,
        "cache tenant expiry",
        include_str!("../migrations/0002_cache_tenant_expiry.sql"),
    ),
    (
        3,
        "tool revisions",
        include_str!("../migrations/0003_tool_revisions.sql"),
    ),
    (
        4,
        "entry overhead",
        include_str!("../migrations/0004_entry_overhead.sql"),
    ),
];

/// The migrations as sqlx's migrator takes them: compiled in, so a node needs no files.
#[derive(Debug)]
struct Embedded;

impl MigrationSource<'static> for Embedded {
    fn resolve(
        self,
    ) -> futures::future::BoxFuture<
        'static,
        std::result::Result<Vec<Migration>, sqlx::error::BoxDynError>,
    > {
        Box::pin(async {
            Ok(MIGRATIONS
                .iter()
                .map(|&(version, description, sql)| {
                    let (description, sql) = (Cow::Borrowed(description), Cow::Borrowed(sql));
                    Migration::new(version, description, MigrationType::Simple, sql, false)
                })
                .collect())
        })
    }
}

/// How a [`PgStore`] connects.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// `postgres://user:password@host:port/database` (or `?host=/socket/dir`).
    pub url: String,
    /// Connections this node holds at most.
    pub max_connections: u32,
    /// How long an operation waits for a connection before it fails.
    pub acquire_timeout: Duration,
}

impl PgOptions {
    /// The defaults for `url`: 16 connections, 5 s to get one.
    pub fn new(url: &str) -> Self {
        PgOptions {
            url: url.to_owned(),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
        }
    }
}

/// Unreadable durable calls a node passes over ([`PgStore::unreadable_durable`]).
const MAX_UNREADABLE_DURABLE: usize = 1024;

/// The PostgreSQL implementation of [`Store`].
pub struct PgStore {
    pool: PgPool,
    /// A few connections of their own for leases and heartbeats: tenants' reads and writes
    /// filling `pool` must not make a node lose the calls it runs.
    control: PgPool,
    secrets_key: Option<SecretsKey>,
    /// This process's name in its notices, so that it skips its own.
    node: String,
    changes: broadcast::Sender<Change>,
    /// Dropped with the store: stops its listener.
    _stop_listening: oneshot::Sender<()>,
    /// Durable calls this node could not read (another version's, or too deep to read back):
    /// left queued, as redb leaves them, and passed over so that none heads every claim.
    unreadable_durable: std::sync::Mutex<Vec<String>>,
    /// When this node last failed to reach the database for a lease ([`PgStore::may_take_over`]).
    cut_off_at: std::sync::Mutex<Option<std::time::Instant>>,
}

impl PgStore {
    /// `result`, noting when it says the database could not be reached.
    fn noting_cut_off<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(StoreError::Backend(_)) = &result {
            *self.cut_off_at.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(std::time::Instant::now());
        }
        result
    }

    /// Whether this node may take over stalled leases: not within a lease of its last failure
    /// to reach the database. Then its owner likely could not reach it either (an outage),
    /// and renews within a third of a lease once it is back; taken over before, the call
    /// ended `node_lost` (or ran twice) although no node had stopped.
    fn may_take_over(&self, lease_ms: u64) -> bool {
        let cut_off_at = *self.cut_off_at.lock().unwrap_or_else(|p| p.into_inner());
        let lease = std::time::Duration::from_millis(lease_ms);
        cut_off_at.is_none_or(|at| at.elapsed() >= lease)
    }

    /// Claims a queued call, or if `take_over` one whose lease ended, leasing it for `lease`
    /// ms (in the database's time).
    async fn claim_leasing(
        &self,
        node: &str,
        lease: u64,
        take_over: bool,
    ) -> Result<Option<DurableCall>> {
        // Each round ends at most one stalled call lost; a few rounds, then the next poll.
        for _ in 0..16 {
            let mut tx = self.begin_control().await?;
            let now_ms = database_now(&mut tx).await?;
            let lease_until_ms = now_ms.saturating_add(lease);
            let stalled_before_ms = if take_over { now_ms } else { 0 };
            let unreadable = self.lock_unreadable().clone();
            let row: Option<(String, String)> = sqlx::query_as(
                // The tenant running the fewest calls first, then the oldest call: one tenant's
                // flood of slow calls never holds every worker while another's wait.
                "SELECT id, call FROM durable_calls d \
                 WHERE (status = 'queued' OR (status = 'running' AND lease_until_ms < $3)) \
                 AND NOT (id = ANY($2)) \
                 ORDER BY (SELECT count(*) FROM durable_calls r WHERE r.tenant = d.tenant \
                 AND r.status = 'running' AND r.lease_until_ms >= $1), created_at_ms \
                 LIMIT 1 FOR UPDATE SKIP LOCKED",
            )
            .bind(to_i64(now_ms))
            .bind(&unreadable)
            .bind(to_i64(stalled_before_ms))
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
            let Some((id, json)) = row else {
                return Ok(None);
            };
            let mut call: DurableCall = match parse("durable call", &id, &json) {
                Ok(call) => call,
                Err(_) => {
                    let mut unreadable = self.lock_unreadable();
                    // Its tenant's unended calls are capped, so these are few; past a bound,
                    // forgotten (a claim reads them once more).
                    if unreadable.len() >= MAX_UNREADABLE_DURABLE {
                        unreadable.clear();
                    }
                    unreadable.push(id);
                    continue;
                }
            };
            let claimed =
                crate::claim(&mut call, node, (now_ms, stalled_before_ms), lease_until_ms);
            write_durable(&mut tx, &call, false).await?;
            if call.ended() {
                self.ended(&mut tx, &call.caller.tenant).await?;
            }
            tx.commit().await.map_err(backend)?;
            if claimed.is_some() {
                return Ok(claimed);
            }
        }
        Ok(None)
    }

    async fn renew(&self, id: &str, node: &str, lease_until_ms: u64) -> Result<bool> {
        let lease = lease_until_ms.saturating_sub(now_ms());
        let now = database_now(&mut self.begin_control().await?).await?;
        let next = DurableState::Running {
            node: node.to_owned(),
            lease_until_ms: now + lease,
        };
        self.durable_own(id, node, next).await
    }

    fn lock_unreadable(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        (self.unreadable_durable.lock()).unwrap_or_else(|p| p.into_inner())
    }

    /// Connects, applies the migrations this database lacks, and starts listening for other
    /// nodes' changes.
    pub async fn connect(options: &PgOptions) -> Result<Self> {
        let fail = |reason: String| StoreError::Open {
            path: redact_password(&options.url),
            reason,
        };
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .connect(&options.url)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let control = PgPoolOptions::new()
            .max_connections(CONTROL_CONNECTIONS)
            .acquire_timeout(Duration::from_secs(1))
            .connect(&options.url)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let migrator = Migrator::new(Embedded)
            .await
            .map_err(|e| fail(e.to_string()))?;
        migrator
            .run(&pool)
            .await
            .map_err(|e| fail(format!("migrating the schema: {e}")))?;
        let mut node = [0u8; 8];
        getrandom::fill(&mut node).expect("the system's randomness is available");
        let node: String = node.iter().map(|b| format!("{b:02x}")).collect();
        let (changes, _) = broadcast::channel(1024);
        let (stop_listening, stop) = oneshot::channel();
        let listener = (listener_on(&pool).await).map_err(|e| fail(e.to_string()))?;
        let listening = listen(pool.clone(), listener, node.clone(), changes.clone(), stop);
        tokio::spawn(listening);
        Ok(PgStore {
            pool,
            control,
            secrets_key: None,
            node,
            changes,
            _stop_listening: stop_listening,
            unreadable_durable: std::sync::Mutex::default(),
            cut_off_at: std::sync::Mutex::default(),
        })
    }

    /// Seals secret configuration values written from now on with `key`, and opens sealed
    /// ones with it.
    pub fn with_secrets_key(mut self, key: Option<SecretsKey>) -> Self {
        self.secrets_key = key;
        self
    }

    async fn begin(&self) -> Result<Transaction<'static, Postgres>> {
        self.pool.begin().await.map_err(backend)
    }

    /// A transaction on the control pool (leases, heartbeats).
    async fn begin_control(&self) -> Result<Transaction<'static, Postgres>> {
        self.control.begin().await.map_err(backend)
    }

    /// Queues `change` for the other nodes: sent when `tx` commits, never if it rolls back.
    async fn announce(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        change: Change,
    ) -> Result<()> {
        let payload = format!("{} {}", self.node, change.to_notice());
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(payload)
            .execute(&mut **tx)
            .await
            .map_err(backend)?;
        Ok(())
    }

    /// Runs one statement that changes what other nodes cache, and announces `change`.
    async fn write_announced(
        &self,
        query: sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments>,
        change: Change,
    ) -> Result<u64> {
        let mut tx = self.begin().await?;
        let affected = query
            .execute(&mut *tx)
            .await
            .map_err(backend)?
            .rows_affected();
        if affected > 0 {
            self.announce(&mut tx, change).await?;
        }
        tx.commit().await.map_err(backend)?;
        Ok(affected)
    }

    /// The tenant's counted bytes, its row locked until `tx` ends.
    async fn locked_usage(tx: &mut Transaction<'static, Postgres>, tenant: &str) -> Result<u64> {
        sqlx::query("INSERT INTO usage (tenant, bytes) VALUES ($1, 0) ON CONFLICT DO NOTHING")
            .bind(tenant)
            .execute(&mut **tx)
            .await
            .map_err(backend)?;
        let used: i64 = sqlx::query_scalar("SELECT bytes FROM usage WHERE tenant = $1 FOR UPDATE")
            .bind(tenant)
            .fetch_one(&mut **tx)
            .await
            .map_err(backend)?;
        Ok(used.max(0) as u64)
    }

    /// What writing a cached result of `json_len` bytes at `key` adds to the tenant's bytes.
    async fn cache_delta(
        tx: &mut Transaction<'static, Postgres>,
        tenant: &str,
        key: &[u8],
        json_len: usize,
    ) -> Result<i64> {
        let old: Option<i32> = sqlx::query_scalar(
            "SELECT octet_length(value) FROM cache WHERE tenant = $1 AND key = $2",
        )
        .bind(tenant)
        .bind(key)
        .fetch_optional(&mut **tx)
        .await
        .map_err(backend)?;
        let old = old.map_or(0, |len| cache_bytes(tenant, key, len as usize));
        Ok(cache_bytes(tenant, key, json_len) - old)
    }

    async fn charge(
        tx: &mut Transaction<'static, Postgres>,
        tenant: &str,
        delta: i64,
    ) -> Result<()> {
        if delta != 0 {
            sqlx::query("UPDATE usage SET bytes = GREATEST(bytes + $2, 0) WHERE tenant = $1")
                .bind(tenant)
                .bind(delta)
                .execute(&mut **tx)
                .await
                .map_err(backend)?;
        }
        Ok(())
    }

    /// Removes the tenant's expired results (all tenants' when `None`); how many, and the
    /// bytes freed by tenant.
    async fn purge_expired(
        tx: &mut Transaction<'static, Postgres>,
        tenant: Option<&str>,
        now_ms: u64,
    ) -> Result<(usize, Vec<(String, i64)>)> {
        // An expiry further off than any TTL means the clock went back: expired too.
        let latest = now_ms.saturating_add(toolhost_spec::spec::CACHE_TTL_MS.max);
        // Two statements rather than `$3 IS NULL OR tenant = $3`, which a generic plan could
        // not answer from the (tenant, expiry) index.
        let sql = match tenant {
            Some(_) => {
                "DELETE FROM cache WHERE (expires_at_ms <= $1 OR expires_at_ms > $2) \
                 AND tenant = $3 \
                 RETURNING tenant, length(key) AS key_len, octet_length(value) AS value_len"
            }
            None => {
                "DELETE FROM cache WHERE (expires_at_ms <= $1 OR expires_at_ms > $2) \
                 RETURNING tenant, length(key) AS key_len, octet_length(value) AS value_len"
            }
        };
        let mut query = sqlx::query(sql).bind(to_i64(now_ms)).bind(to_i64(latest));
        if let Some(tenant) = tenant {
            query = query.bind(tenant);
        }
        let rows = query.fetch_all(&mut **tx).await.map_err(backend)?;
        let (count, mut freed): (usize, Vec<(String, i64)>) = (rows.len(), Vec::new());
        for row in rows {
            let owner: String = row.get("tenant");
            let bytes = cache_bytes(&owner, &[], 0)
                + i64::from(row.get::<i32, _>("key_len"))
                + i64::from(row.get::<i32, _>("value_len"));
            match freed.iter_mut().find(|(t, _)| *t == owner) {
                Some((_, total)) => *total += bytes,
                None => freed.push((owner, bytes)),
            }
        }
        Ok((count, freed))
    }
}

impl PgStore {
    /// Moves `node`'s running call `id` to `next`; whether it was `node`'s.
    async fn durable_own(&self, id: &str, node: &str, next: DurableState) -> Result<bool> {
        let mut tx = self.begin_control().await?;
        let json: Option<String> = sqlx::query_scalar(
            "SELECT call FROM durable_calls \
             WHERE id = $1 AND status = 'running' AND node = $2 FOR UPDATE",
        )
        .bind(id)
        .bind(node)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        let Some(json) = json else {
            return Ok(false);
        };
        let mut call: DurableCall = parse("durable call", id, &json)?;
        call.state = next;
        write_durable(&mut tx, &call, false).await?;
        if call.ended() {
            self.ended(&mut tx, &call.caller.tenant).await?;
        }
        tx.commit().await.map_err(backend)?;
        Ok(true)
    }

    /// After one of `tenant`'s calls ended: its newest ended calls are kept, at most
    /// MAX_ENDED_KEPT of them and MAX_ENDED_BYTES as stored, and readers waiting are woken.
    async fn ended(&self, tx: &mut Transaction<'static, Postgres>, tenant: &str) -> Result<()> {
        sqlx::query(
            "DELETE FROM durable_calls WHERE id IN (SELECT id FROM (SELECT id, \
             row_number() OVER newest AS kept, sum(pg_column_size(call)) OVER newest AS bytes \
             FROM durable_calls WHERE tenant = $1 AND ended_at_ms IS NOT NULL \
             WINDOW newest AS (ORDER BY ended_at_ms DESC, id)) AS ranked \
             WHERE kept > $2 OR bytes > $3)",
        )
        .bind(tenant)
        .bind(crate::MAX_ENDED_KEPT as i64)
        .bind(to_i64(crate::MAX_ENDED_BYTES))
        .execute(&mut **tx)
        .await
        .map_err(backend)?;
        self.announce(tx, Change::CallEnded).await
    }
}

/// The database's clock, in Unix milliseconds: the one clock every node's leases agree on.
async fn database_now(tx: &mut Transaction<'static, Postgres>) -> Result<u64> {
    let now: i64 =
        sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
            .fetch_one(&mut **tx)
            .await
            .map_err(backend)?;
    Ok(now.max(0) as u64)
}

/// Writes a durable call's row: its record, and the columns claims select on.
async fn write_durable(
    tx: &mut Transaction<'static, Postgres>,
    call: &DurableCall,
    new: bool,
) -> Result<()> {
    let (node, lease, ended) = match &call.state {
        DurableState::Queued => (None, None, None),
        DurableState::Running {
            node,
            lease_until_ms,
        } => (Some(node.as_str()), Some(to_i64(*lease_until_ms)), None),
        DurableState::Done { ended_at_ms, .. } => (None, None, Some(to_i64(*ended_at_ms))),
        DurableState::Lost { node, ended_at_ms } => {
            (Some(node.as_str()), None, Some(to_i64(*ended_at_ms)))
        }
    };
    let json = serde_json::to_string(call).expect("a durable call serializes");
    let statement = if new {
        "INSERT INTO durable_calls \
         (id, tenant, status, node, lease_until_ms, created_at_ms, ended_at_ms, call) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    } else {
        "UPDATE durable_calls SET status = $3, node = $4, lease_until_ms = $5, \
         ended_at_ms = $7, call = $8 WHERE id = $1 AND tenant = $2 AND created_at_ms = $6"
    };
    sqlx::query(statement)
        .bind(&call.id)
        .bind(&call.caller.tenant)
        .bind(call.state.status())
        .bind(node)
        .bind(lease)
        .bind(to_i64(call.created_at_ms))
        .bind(ended)
        .bind(json)
        .execute(&mut **tx)
        .await
        .map_err(backend)?;
    Ok(())
}

/// Passes other nodes' notices on. After the connection drops, sqlx reconnects and
/// re-listens; what was sent meanwhile is lost, so a [`Change::Resync`] tells the host to
/// read everything again. A connection that fails otherwise (reset by the server, which
/// sqlx passes on as an error and keeps) is replaced by a new one from `pool`.
async fn listen(
    pool: PgPool,
    mut listener: PgListener,
    node: String,
    changes: broadcast::Sender<Change>,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        let notice = tokio::select! {
            notice = listener.try_recv() => notice,
            _ = &mut stop => return,
        };
        match notice {
            Ok(Some(notice)) => {
                let Some((from, change)) = notice.payload().split_once(' ') else {
                    continue;
                };
                if from != node
                    && let Some(change) = Change::from_notice(change)
                {
                    // No receiver yet is fine: nothing is cached to refresh.
                    let _ = changes.send(change);
                }
            }
            Ok(None) => {
                tracing::warn!("lost the database connection that listens for changes");
                let _ = changes.send(Change::Resync);
            }
            Err(error) => {
                tracing::warn!(%error, "listening for changes failed; listening anew");
                listener = loop {
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = &mut stop => return,
                    }
                    match listener_on(&pool).await {
                        Ok(listener) => break listener,
                        Err(error) => tracing::warn!(%error, "cannot listen for changes yet"),
                    }
                };
                // What was sent meanwhile is lost.
                let _ = changes.send(Change::Resync);
            }
        }
    }
}

/// A new connection that listens for other nodes' changes.
async fn listener_on(pool: &PgPool) -> std::result::Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

fn backend(error: sqlx::Error) -> StoreError {
    StoreError::Backend(error.to_string())
}

/// Milliseconds and byte counts as PostgreSQL's BIGINT.
fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The URL without its password, to show in errors.
fn redact_password(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.split('@').next_back().unwrap_or(url).to_owned(),
    }
}

/// A JSON record, or a corruption error naming it.
fn parse<T: serde::de::DeserializeOwned>(what: &str, key: &str, json: &str) -> Result<T> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt {
        key: format!("{what}/{key}"),
        reason: e.to_string(),
    })
}

/// Of a tool record, the blobs its versions name: what collecting blobs needs, and no more.
#[derive(serde::Deserialize)]
struct BlobsNamed {
    versions: Vec<BlobNamed>,
}

#[derive(serde::Deserialize)]
struct BlobNamed {
    component: String,
    runtime: Option<String>,
}

/// Every record that parses; an unreadable one is logged and left in place.
/// Parsed one by one as the caller takes them, each row freed once parsed.
fn readable<T: serde::de::DeserializeOwned>(
    what: &str,
    rows: Vec<(String, String)>,
) -> impl Iterator<Item = (String, T)> {
    rows.into_iter()
        .filter_map(move |(key, json)| match parse(what, &key, &json) {
            Ok(record) => Some((key, record)),
            Err(error) => {
                tracing::error!(%error, "{what} skipped");
                None
            }
        })
}

#[async_trait::async_trait]
impl Store for PgStore {
    async fn tool_entries(&self) -> Result<ToolRecords> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT tenant || '/' || name, entry FROM tools ORDER BY tenant, name")
                .fetch_all(&self.pool)
                .await
                .map_err(backend)?;
        let read = rows.len();
        let entries = SharedSpecs::collect(readable("tool record", rows).map(|(_, e)| e));
        Ok(ToolRecords::of(read, entries))
    }

    async fn tool_entries_of(&self, tenant: &str) -> Result<Vec<ToolEntry>> {
        let rows = sqlx::query_as(
            "SELECT tenant || '/' || name, entry FROM tools WHERE tenant = $1 ORDER BY name",
        )
        .bind(tenant)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(SharedSpecs::collect(
            readable("tool record", rows).map(|(_, e)| e),
        ))
    }

    async fn put_tool_entries(&self, entries: &[ToolEntry]) -> Result<()> {
        let mut tx = self.begin().await?;
        let mut tenants: Vec<&str> = Vec::new();
        for entry in entries {
            let json = serde_json::to_string(entry).expect("an entry serializes");
            sqlx::query(
                "INSERT INTO tools (tenant, name, entry) VALUES ($1, $2, $3) \
                 ON CONFLICT (tenant, name) DO UPDATE SET entry = EXCLUDED.entry",
            )
            .bind(&entry.tenant)
            .bind(&entry.name)
            .bind(json)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
            if !tenants.contains(&entry.tenant.as_str()) {
                tenants.push(&entry.tenant);
            }
        }
        for tenant in tenants {
            let change = Change::Tools {
                tenant: tenant.to_owned(),
            };
            self.announce(&mut tx, change).await?;
        }
        tx.commit().await.map_err(backend)
    }

    async fn remove_tool_entry(&self, tenant: &str, name: &str) -> Result<bool> {
        let query = sqlx::query("DELETE FROM tools WHERE tenant = $1 AND name = $2")
            .bind(tenant)
            .bind(name);
        let change = Change::Tools {
            tenant: tenant.to_owned(),
        };
        Ok(self.write_announced(query, change).await? > 0)
    }

    /// Moved on by a trigger at every write of `tools` (migration 0003).
    async fn tool_revisions(&self) -> Result<HashMap<String, u64>> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT tenant, revision FROM tool_revisions")
                .fetch_all(&self.pool)
                .await
                .map_err(backend)?;
        let revisions = rows.into_iter();
        Ok(revisions
            .map(|(tenant, revision)| (tenant, revision as u64))
            .collect())
    }

    /// A transaction-scoped advisory lock on the tenant's entries: released when the
    /// transaction ends, which dropping the lock does (sqlx rolls it back).
    async fn lock_entries(&self, tenant: &str) -> Result<EntriesLock> {
        let mut tx = self.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!("toolhost tools {tenant}"))
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        Ok(EntriesLock(Some(Box::new(tx))))
    }

    async fn blob(&self, sha: &str) -> Result<Option<Vec<u8>>> {
        sqlx::query_scalar("SELECT bytes FROM blobs WHERE sha = $1")
            .bind(sha)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)
    }

    /// Without fetching the bytes: the JS runtime's are megabytes, checked at every start.
    async fn has_blob(&self, sha: &str) -> Result<bool> {
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM blobs WHERE sha = $1)")
            .bind(sha)
            .fetch_one(&self.pool)
            .await
            .map_err(backend)
    }

    async fn touch_blob(&self, sha: &str) -> Result<bool> {
        let touched = sqlx::query("UPDATE blobs SET created_at_ms = $2 WHERE sha = $1")
            .bind(sha)
            .bind(to_i64(now_ms()))
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(touched.rows_affected() > 0)
    }

    async fn put_blob(&self, sha: &str, bytes: &[u8]) -> Result<()> {
        // Content-addressed: the same sha is the same bytes, so a second write is a no-op.
        sqlx::query(
            "INSERT INTO blobs (sha, bytes, created_at_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (sha) DO UPDATE SET created_at_ms = EXCLUDED.created_at_ms",
        )
        .bind(sha)
        .bind(bytes)
        .bind(to_i64(now_ms()))
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    /// The blob only: the artifact is this node's, kept on its disk.
    async fn put_component(&self, sha: &str, bytes: &[u8], _: &str, _: &[u8]) -> Result<()> {
        self.put_blob(sha, bytes).await
    }

    async fn artifact(&self, _: &str, _: &str) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }

    async fn put_artifact(&self, _: &str, _: &str, _: &[u8]) -> Result<()> {
        Ok(())
    }

    async fn collect_blobs(
        &self,
        _unreadable: usize,
        live: &(dyn for<'a> Fn(&'a str) -> bool + Sync),
    ) -> Result<usize> {
        // Other nodes write the table: what it holds now counts, not what the caller read,
        // and of each record only the blobs it names.
        let records: Vec<String> = sqlx::query_scalar("SELECT entry FROM tools")
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?;
        let mut referenced = std::collections::HashSet::new();
        for record in &records {
            let Ok(blobs) = serde_json::from_str::<BlobsNamed>(record) else {
                tracing::warn!("a tool record names no blobs that can be read: none collected");
                return Ok(0);
            };
            let named = blobs.versions.into_iter();
            referenced.extend(named.flat_map(|v| std::iter::once(v.component).chain(v.runtime)));
        }
        // Another node may be between storing a blob and the entry that refers to it.
        let settled = now_ms().saturating_sub(BLOB_GRACE_MS);
        let shas: Vec<String> =
            sqlx::query_scalar("SELECT sha FROM blobs WHERE created_at_ms < $1")
                .bind(to_i64(settled))
                .fetch_all(&self.pool)
                .await
                .map_err(backend)?;
        let dead: Vec<String> = shas
            .into_iter()
            .filter(|sha| !live(sha) && !referenced.contains(sha))
            .collect();
        if dead.is_empty() {
            return Ok(0);
        }
        // Stored again meanwhile (an install on another node): young again, kept.
        let removed = sqlx::query("DELETE FROM blobs WHERE sha = ANY($1) AND created_at_ms < $2")
            .bind(&dead)
            .bind(to_i64(settled))
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(removed.rows_affected() as usize)
    }

    async fn cache_get(&self, tenant: &str, key: &[u8], now_ms: u64) -> Result<Option<Value>> {
        let row: Option<(i64, String)> =
            sqlx::query_as("SELECT expires_at_ms, value FROM cache WHERE tenant = $1 AND key = $2")
                .bind(tenant)
                .bind(key)
                .fetch_optional(&self.pool)
                .await
                .map_err(backend)?;
        let Some((expires_at_ms, json)) = row else {
            return Ok(None);
        };
        if cache_expired(expires_at_ms.max(0) as u64, now_ms) {
            let mut tx = self.begin().await?;
            Self::locked_usage(&mut tx, tenant).await?;
            let removed: Option<i32> = sqlx::query_scalar(
                "DELETE FROM cache WHERE tenant = $1 AND key = $2 RETURNING octet_length(value)",
            )
            .bind(tenant)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
            if let Some(len) = removed {
                Self::charge(&mut tx, tenant, -cache_bytes(tenant, key, len as usize)).await?;
            }
            tx.commit().await.map_err(backend)?;
            return Ok(None);
        }
        // A damaged entry is a miss, not an error: the tool can always run again.
        Ok(serde_json::from_str(&json).ok())
    }

    async fn cache_put(
        &self,
        tenant: &str,
        key: &[u8],
        expires_at_ms: u64,
        value: &Value,
        quota: u64,
    ) -> Result<()> {
        let json = serde_json::to_string(value).expect("a Value serializes");
        let mut tx = self.begin().await?;
        let mut used = Self::locked_usage(&mut tx, tenant).await?;
        let mut delta = Self::cache_delta(&mut tx, tenant, key, json.len()).await?;
        if over(used, delta, quota) {
            let (_, freed) = Self::purge_expired(&mut tx, Some(tenant), now_ms()).await?;
            for (_, freed) in freed {
                Self::charge(&mut tx, tenant, -freed).await?;
                used = used.saturating_sub(freed.max(0) as u64);
            }
            // The purge may have removed the entry this write replaces: its bytes are
            // already given back.
            delta = Self::cache_delta(&mut tx, tenant, key, json.len()).await?;
        }
        if over(used, delta, quota) {
            // The expired results purged stay purged, as on redb.
            tx.commit().await.map_err(backend)?;
            return Err(quota_error(used, delta, quota));
        }
        sqlx::query(
            "INSERT INTO cache (tenant, key, expires_at_ms, value) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (tenant, key) DO UPDATE \
             SET expires_at_ms = EXCLUDED.expires_at_ms, value = EXCLUDED.value",
        )
        .bind(tenant)
        .bind(key)
        .bind(to_i64(expires_at_ms))
        .bind(&json)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        Self::charge(&mut tx, tenant, delta).await?;
        tx.commit().await.map_err(backend)
    }

    /// Tenant by tenant, each one's `usage` row locked before its cache rows: the order every
    /// other write takes them in, so a purge never deadlocks with a node's writes.
    async fn cache_purge(&self, now_ms: u64) -> Result<usize> {
        let latest = now_ms.saturating_add(toolhost_spec::spec::CACHE_TTL_MS.max);
        let tenants: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT tenant FROM cache WHERE expires_at_ms <= $1 OR expires_at_ms > $2",
        )
        .bind(to_i64(now_ms))
        .bind(to_i64(latest))
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        let mut count = 0;
        for tenant in tenants {
            let mut tx = self.begin().await?;
            Self::locked_usage(&mut tx, &tenant).await?;
            let (removed, freed) = Self::purge_expired(&mut tx, Some(&tenant), now_ms).await?;
            for (_, bytes) in &freed {
                Self::charge(&mut tx, &tenant, -bytes).await?;
            }
            tx.commit().await.map_err(backend)?;
            count += removed;
        }
        Ok(count)
    }

    async fn kv_get(&self, tenant: &str, tool: &str, key: &str) -> Result<Option<Vec<u8>>> {
        sqlx::query_scalar("SELECT value FROM kv WHERE tenant = $1 AND tool = $2 AND key = $3")
            .bind(tenant)
            .bind(tool)
            .bind(key.as_bytes())
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)
    }

    async fn kv_set(
        &self,
        tenant: &str,
        tool: &str,
        key: &str,
        value: &[u8],
        (max_keys, quota): (usize, u64),
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        // The tenant's usage row, locked, orders this write after every other of the tenant's.
        let used = Self::locked_usage(&mut tx, tenant).await?;
        let old: Option<i32> = sqlx::query_scalar(
            "SELECT length(value) FROM kv WHERE tenant = $1 AND tool = $2 AND key = $3",
        )
        .bind(tenant)
        .bind(tool)
        .bind(key.as_bytes())
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        if old.is_none() {
            let held: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM (SELECT 1 FROM kv WHERE tenant = $1 AND tool = $2 LIMIT $3) k",
            )
            .bind(tenant)
            .bind(tool)
            .bind(i64::try_from(max_keys).unwrap_or(i64::MAX))
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
            if held as usize >= max_keys {
                return Err(StoreError::KvKeys { limit: max_keys });
            }
        }
        let old = old.map_or(0, |len| kv_bytes(tenant, tool, key, len as usize));
        let delta = kv_bytes(tenant, tool, key, value.len()) - old;
        if over(used, delta, quota) {
            return Err(quota_error(used, delta, quota));
        }
        sqlx::query(
            "INSERT INTO kv (tenant, tool, key, value) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (tenant, tool, key) DO UPDATE SET value = EXCLUDED.value",
        )
        .bind(tenant)
        .bind(tool)
        .bind(key.as_bytes())
        .bind(value)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        Self::charge(&mut tx, tenant, delta).await?;
        tx.commit().await.map_err(backend)
    }

    async fn kv_delete(&self, tenant: &str, tool: &str, key: &str) -> Result<bool> {
        let mut tx = self.begin().await?;
        Self::locked_usage(&mut tx, tenant).await?;
        let removed: Option<i32> = sqlx::query_scalar(
            "DELETE FROM kv WHERE tenant = $1 AND tool = $2 AND key = $3 RETURNING length(value)",
        )
        .bind(tenant)
        .bind(tool)
        .bind(key.as_bytes())
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        if let Some(len) = removed {
            Self::charge(&mut tx, tenant, -kv_bytes(tenant, tool, key, len as usize)).await?;
        }
        tx.commit().await.map_err(backend)?;
        Ok(removed.is_some())
    }

    async fn kv_count(&self, tenant: &str, tool: &str) -> Result<usize> {
        let count: i64 =
            sqlx::query_scalar("SELECT count(*) FROM kv WHERE tenant = $1 AND tool = $2")
                .bind(tenant)
                .bind(tool)
                .fetch_one(&self.pool)
                .await
                .map_err(backend)?;
        Ok(count as usize)
    }

    async fn data_bytes(&self, tenant: &str) -> Result<u64> {
        let used: Option<i64> = sqlx::query_scalar("SELECT bytes FROM usage WHERE tenant = $1")
            .bind(tenant)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        Ok(used.unwrap_or(0).max(0) as u64)
    }

    async fn config_get(&self, tenant: &str, key: &str) -> Result<Option<ConfigValue>> {
        let json: Option<String> =
            sqlx::query_scalar("SELECT value FROM config WHERE tenant = $1 AND key = $2")
                .bind(tenant)
                .bind(key)
                .fetch_optional(&self.pool)
                .await
                .map_err(backend)?;
        json.map(|json| {
            let stored = parse("config", &format!("{tenant}/{key}"), &json)?;
            open_config(self.secrets_key.as_ref(), tenant, key, stored)
        })
        .transpose()
    }

    async fn config_set(&self, tenant: &str, key: &str, value: &ConfigValue) -> Result<()> {
        let stored = seal_config(self.secrets_key.as_ref(), tenant, key, value);
        let json = serde_json::to_string(&stored).expect("a config value serializes");
        let query = sqlx::query(
            "INSERT INTO config (tenant, key, value) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant, key) DO UPDATE SET value = EXCLUDED.value",
        )
        .bind(tenant)
        .bind(key)
        .bind(json);
        let change = Change::Config {
            tenant: tenant.to_owned(),
        };
        self.write_announced(query, change).await.map(drop)
    }

    async fn config_delete(&self, tenant: &str, key: &str) -> Result<bool> {
        let query = sqlx::query("DELETE FROM config WHERE tenant = $1 AND key = $2")
            .bind(tenant)
            .bind(key);
        let change = Change::Config {
            tenant: tenant.to_owned(),
        };
        Ok(self.write_announced(query, change).await? > 0)
    }

    async fn config_keys(&self, tenant: &str) -> Result<Vec<String>> {
        sqlx::query_scalar("SELECT key FROM config WHERE tenant = $1 ORDER BY key")
            .bind(tenant)
            .fetch_all(&self.pool)
            .await
            .map_err(backend)
    }

    async fn policy(&self, tenant: &str) -> Result<Option<TenantPolicy>> {
        let json: Option<String> =
            sqlx::query_scalar("SELECT policy FROM policies WHERE tenant = $1")
                .bind(tenant)
                .fetch_optional(&self.pool)
                .await
                .map_err(backend)?;
        json.map(|json| parse("policy", tenant, &json)).transpose()
    }

    async fn put_policy(&self, tenant: &str, policy: &TenantPolicy) -> Result<()> {
        let json = serde_json::to_string(policy).expect("a policy serializes");
        let query = sqlx::query(
            "INSERT INTO policies (tenant, policy) VALUES ($1, $2) \
             ON CONFLICT (tenant) DO UPDATE SET policy = EXCLUDED.policy",
        )
        .bind(tenant)
        .bind(json);
        let change = Change::Policy {
            tenant: tenant.to_owned(),
        };
        self.write_announced(query, change).await.map(drop)
    }

    async fn tenant_create(&self, tenant: &str, created_at_ms: u64) -> Result<bool> {
        let created = sqlx::query(
            "INSERT INTO tenants (tenant, created_at_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(tenant)
        .bind(to_i64(created_at_ms))
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(created.rows_affected() > 0)
    }

    async fn tenants(&self) -> Result<Vec<String>> {
        sqlx::query_scalar("SELECT tenant FROM tenants ORDER BY tenant")
            .fetch_all(&self.pool)
            .await
            .map_err(backend)
    }

    async fn key_put(&self, key_hash: &str, record: &KeyRecord) -> Result<()> {
        let json = serde_json::to_string(record).expect("a key record serializes");
        let query = sqlx::query(
            "INSERT INTO keys (hash, id, record) VALUES ($1, $2, $3) \
             ON CONFLICT (hash) DO UPDATE SET id = EXCLUDED.id, record = EXCLUDED.record",
        )
        .bind(key_hash)
        .bind(&record.id)
        .bind(json);
        self.write_announced(query, Change::Keys).await.map(drop)
    }

    async fn key_get(&self, key_hash: &str) -> Result<Option<KeyRecord>> {
        let json: Option<String> = sqlx::query_scalar("SELECT record FROM keys WHERE hash = $1")
            .bind(key_hash)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        json.map(|json| parse("key", key_hash, &json)).transpose()
    }

    async fn keys(&self) -> Result<Vec<KeyRecord>> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT hash, record FROM keys ORDER BY hash")
                .fetch_all(&self.pool)
                .await
                .map_err(backend)?;
        rows.iter()
            .map(|(hash, json)| parse("key", hash, json))
            .collect()
    }

    async fn key_revoke(&self, id: &str) -> Result<bool> {
        let query = sqlx::query("DELETE FROM keys WHERE id = $1").bind(id);
        Ok(self.write_announced(query, Change::Keys).await? > 0)
    }

    async fn held_call_put(&self, call_id: &str, held: &HeldCall) -> Result<()> {
        let json = serde_json::to_string(held).expect("a held call serializes");
        let query = sqlx::query(
            "INSERT INTO held_calls (id, held) VALUES ($1, $2) \
             ON CONFLICT (id) DO UPDATE SET held = EXCLUDED.held",
        )
        .bind(call_id)
        .bind(json);
        self.write_announced(query, Change::HeldCalls)
            .await
            .map(drop)
    }

    /// True for exactly one caller however many nodes remove it at once: the one whose
    /// `DELETE` removed the row runs the call.
    async fn held_call_remove(&self, call_id: &str) -> Result<bool> {
        let query = sqlx::query("DELETE FROM held_calls WHERE id = $1").bind(call_id);
        Ok(self.write_announced(query, Change::HeldCalls).await? > 0)
    }

    async fn held_calls(&self) -> Result<Vec<(String, HeldCall)>> {
        let rows = sqlx::query_as("SELECT id, held FROM held_calls ORDER BY id")
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?;
        Ok(readable("held call", rows).collect())
    }

    async fn search_vector(&self, key: &str) -> Result<Option<Vec<u8>>> {
        sqlx::query_scalar("SELECT vector FROM search_vectors WHERE key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)
    }

    async fn put_search_vector(&self, key: &str, vector: &[u8]) -> Result<()> {
        sqlx::query(
            "INSERT INTO search_vectors (key, vector) VALUES ($1, $2) \
             ON CONFLICT (key) DO UPDATE SET vector = EXCLUDED.vector",
        )
        .bind(key)
        .bind(vector)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn retain_search_vectors(
        &self,
        prefix: &str,
        keep: &std::collections::HashSet<String>,
    ) -> Result<usize> {
        let keys: Vec<String> =
            sqlx::query_scalar("SELECT key FROM search_vectors WHERE starts_with(key, $1)")
                .bind(prefix)
                .fetch_all(&self.pool)
                .await
                .map_err(backend)?;
        let stale: Vec<String> = keys.into_iter().filter(|k| !keep.contains(k)).collect();
        if stale.is_empty() {
            return Ok(0);
        }
        let removed = sqlx::query("DELETE FROM search_vectors WHERE key = ANY($1)")
            .bind(&stale)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(removed.rows_affected() as usize)
    }

    async fn durable_put(&self, call: &DurableCall) -> Result<()> {
        let mut tx = self.begin().await?;
        write_durable(&mut tx, call, true).await?;
        self.announce(&mut tx, Change::Calls).await?;
        tx.commit().await.map_err(backend)
    }

    async fn durable_get(&self, id: &str) -> Result<Option<DurableCall>> {
        let json: Option<String> =
            sqlx::query_scalar("SELECT call FROM durable_calls WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await
                .map_err(backend)?;
        json.map(|json| parse("durable call", id, &json))
            .transpose()
    }

    async fn durable_claim(
        &self,
        node: &str,
        now_ms: u64,
        lease_until_ms: u64,
    ) -> Result<Option<DurableCall>> {
        // Leases are read and written in the database's time, so nodes' clocks may differ.
        let lease = lease_until_ms.saturating_sub(now_ms);
        let take_over = self.may_take_over(lease);
        let claimed = self.claim_leasing(node, lease, take_over).await;
        self.noting_cut_off(claimed)
    }

    async fn durable_renew(&self, id: &str, node: &str, lease_until_ms: u64) -> Result<bool> {
        let renewed = self.renew(id, node, lease_until_ms).await;
        self.noting_cut_off(renewed)
    }

    async fn durable_finish(&self, id: &str, node: &str, outcome: &Value) -> Result<bool> {
        // In the database's time, as every other ending is: ended calls are trimmed newest
        // first by it, and a node whose clock is behind would have its outcome trimmed at once.
        let ended_at_ms = database_now(&mut self.begin_control().await?).await?;
        let next = DurableState::Done {
            outcome: outcome.clone(),
            ended_at_ms,
        };
        self.durable_own(id, node, next).await
    }

    async fn durable_unfinished(&self, tenant: &str) -> Result<usize> {
        let count: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM durable_calls \
             WHERE tenant = $1 AND status IN ('queued', 'running')",
        )
        .bind(tenant)
        .fetch_one(&self.pool)
        .await
        .map_err(backend)?;
        Ok(count as usize)
    }

    async fn durable_purge(&self, before_ms: u64) -> Result<usize> {
        let purged = sqlx::query("DELETE FROM durable_calls WHERE ended_at_ms < $1")
            .bind(to_i64(before_ms))
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(purged.rows_affected() as usize)
    }

    async fn mcp_session(&self, id: &str) -> Result<Option<(String, String)>> {
        sqlx::query_as("SELECT tenant, state FROM mcp_sessions WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)
    }

    async fn put_mcp_session(
        &self,
        id: &str,
        tenant: &str,
        state: &str,
        now_ms: u64,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO mcp_sessions (id, tenant, state, touched_at_ms) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, \
             touched_at_ms = EXCLUDED.touched_at_ms WHERE mcp_sessions.tenant = EXCLUDED.tenant",
        )
        .bind(id)
        .bind(tenant)
        .bind(state)
        .bind(to_i64(now_ms))
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        sqlx::query("DELETE FROM mcp_sessions WHERE touched_at_ms < $1")
            .bind(to_i64(now_ms.saturating_sub(crate::MCP_SESSION_TTL_MS)))
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)
    }

    async fn remove_mcp_session(&self, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM mcp_sessions WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn remove_mcp_session_untouched_since(&self, id: &str, touched_at_ms: u64) -> Result<()> {
        sqlx::query("DELETE FROM mcp_sessions WHERE id = $1 AND touched_at_ms <= $2")
            .bind(id)
            .bind(to_i64(touched_at_ms))
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn heartbeat(&self, node: &str) -> Result<u32> {
        let mut tx = self.begin_control().await?;
        // In the database's time, as leases are: a node whose clock is ahead would count no
        // other node alive, and take the whole of every shared limit.
        let now_ms = database_now(&mut tx).await?;
        sqlx::query(
            "INSERT INTO nodes (node, last_seen_ms) VALUES ($1, $2) \
             ON CONFLICT (node) DO UPDATE SET last_seen_ms = EXCLUDED.last_seen_ms",
        )
        .bind(node)
        .bind(to_i64(now_ms))
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        // Long gone: no one needs to know of them.
        sqlx::query("DELETE FROM nodes WHERE last_seen_ms < $1")
            .bind(to_i64(now_ms.saturating_sub(3_600_000)))
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        let alive: i64 = sqlx::query_scalar("SELECT count(*) FROM nodes WHERE last_seen_ms >= $1")
            .bind(to_i64(now_ms.saturating_sub(crate::NODE_TTL_MS)))
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(u32::try_from(alive).unwrap_or(u32::MAX).max(1))
    }

    async fn depart(&self, node: &str) -> Result<()> {
        sqlx::query("DELETE FROM nodes WHERE node = $1")
            .bind(node)
            .execute(&self.control)
            .await
            .map_err(backend)?;
        Ok(())
    }

    fn changes(&self) -> Option<broadcast::Receiver<Change>> {
        Some(self.changes.subscribe())
    }
}
