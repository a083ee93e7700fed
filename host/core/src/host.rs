//! [`Host`]: the one type an app embeds. A facade: each method hands its work to the part
//! that owns it (the catalog, tenants, or the call pipeline) and adds nothing of its own.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use toolhost_sandbox::Sandbox;
use toolhost_spec::access::Role;
use toolhost_spec::call::{CallError, CallOutcome, Caller};
use toolhost_spec::export::Format;
use toolhost_spec::policy::{DiskUsage, TenantPolicy, Usage};
use toolhost_spec::spec::ToolSpec;
#[cfg(feature = "postgres")]
use toolhost_store::PgStore;
use toolhost_store::{KeyRecord, RedbStore, Store, StoreError, ToolEntry, now_ms};

use crate::admission::{Admission, Shares};
use crate::approval::{ApprovalError, Approvals, PendingCall};
use crate::catalog::{Catalog, Resolved, StoredCatalog, ToolInfo};
use crate::components::Components;
use crate::config::HostConfig;
use crate::durable::{self, DurableStatus};
use crate::error::{InstallError, ManageError, OpenError};
use crate::exec::Executors;
use crate::history::{CallFilter, CallRecord, History, ToolStats};
use crate::hooks::CallHook;
use crate::http_tool::HttpToolDef;
use crate::metrics::Metrics;
use crate::pipeline::{Budget, Pipeline};
use crate::registry::NativeRegistry;
use crate::sync;
use crate::tenants::{NewKey, Tenants};

/// The host: tenants' tools and the app's native tools, and one call path for both.
/// Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Host {
    catalog: Arc<Catalog>,
    tenants: Arc<Tenants>,
    components: Arc<Components>,
    pipeline: Arc<Pipeline>,
    /// Applies other nodes' changes while the host lives (a shared store only).
    _follow: Option<sync::Following>,
    /// Run durable calls while the host lives.
    workers: durable::Workers,
    /// Tells the other nodes this one is alive (a shared store only), until it drains.
    heartbeat: std::sync::Mutex<Option<sync::Following>>,
}

impl Host {
    /// Opens the store (the PostgreSQL database of `config.database`, else the data
    /// directory, else memory) and loads every tenant's catalog. Components are loaded
    /// lazily, on first call.
    pub async fn open(config: HostConfig) -> Result<Self, OpenError> {
        Self::start(None, config).await
    }

    /// A host over any [`Store`]. `config.data_dir` is not opened as a store; it still holds
    /// granted files and the artifact key.
    pub async fn with_store(store: Arc<dyn Store>, config: HostConfig) -> Result<Self, OpenError> {
        Self::start(Some(store), config).await
    }

    /// The engine takes most of a restart and needs nothing stored: the store is opened and
    /// read beside it, so a restart waits for the slower of the two only.
    async fn start(store: Option<Arc<dyn Store>>, config: HostConfig) -> Result<Self, OpenError> {
        let engine = {
            let config = config.clone();
            tokio::task::spawn_blocking(move || new_sandbox(&config))
        };
        let stored = async {
            let store = match store {
                Some(store) => store,
                None => open_store(&config).await?,
            };
            Stored::read(store, &config).await
        };
        let (stored, sandbox) = tokio::join!(stored, engine);
        let sandbox = sandbox.unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()));
        Self::assemble(stored?, sandbox?, config)
    }

    fn assemble(stored: Stored, sandbox: Sandbox, config: HostConfig) -> Result<Self, OpenError> {
        let Stored {
            store,
            catalog,
            approvals,
        } = stored;
        let metrics = Arc::new(Metrics::default());
        // Put back in the store should a node on another runtime collect it.
        let js_runtime = catalog
            .js_runtime()
            .map(str::to_owned)
            .zip(config.js_runtime);
        let components = Components::new(
            Arc::new(sandbox),
            store.clone(),
            (
                config.max_loaded_components,
                config.max_loaded_component_bytes,
            ),
            (config.artifact_dir.as_deref(), config.data_dir.as_deref()),
            metrics.clone(),
        )?;
        let components = Arc::new(components.carrying(js_runtime));
        let catalog = Arc::new(Catalog::new(catalog, components.clone()));
        catalog.collect_released_blobs();
        let tenants = Arc::new(Tenants::new(store.clone(), config.default_policy));
        let files_dir = config
            .files_dir
            .or(config.data_dir.map(|d| d.join("files")));
        let exec = Executors::new(
            components.clone(),
            store.clone(),
            config.egress,
            files_dir,
            (config.js_snapshots, config.js_snapshots_per_tenant),
            metrics.clone(),
        );
        let approvals = Arc::new(approvals);
        let durable_wakes = sync::DurableWakes::default();
        let _follow = store.changes().map(|changes| {
            let cached = (catalog.clone(), tenants.clone(), approvals.clone());
            let wakes = durable_wakes.clone();
            sync::follow(changes, (cached, wakes), config.resync_interval)
        });
        let call_ids = crate::pipeline::CallIds::default();
        let pipeline = Arc::new(Pipeline {
            catalog: catalog.clone(),
            tenants: tenants.clone(),
            exec,
            approvals,
            store,
            admission: Admission::default(),
            shares: Shares::new(config.tenant_share),
            hooks: Default::default(),
            metrics,
            history: History::new(config.call_history),
            node: call_ids.node(),
            call_ids,
            durable_wakes,
        });
        let heartbeat = (_follow.is_some() && config.serves).then(|| sync::heartbeat(&pipeline));
        let workers = durable::start(pipeline.clone(), config.durable);
        Ok(Host {
            catalog,
            tenants,
            components,
            pipeline,
            _follow,
            workers,
            heartbeat: std::sync::Mutex::new(heartbeat),
        })
    }

    /// The largest component `install` accepts, in bytes.
    pub fn max_component_bytes(&self) -> usize {
        self.components.sandbox().max_component_bytes()
    }

    /// Where derived data (such as search vectors) is kept beside the catalog.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.pipeline.store
    }

    /// The embedding app's trusted tools.
    pub fn natives(&self) -> &NativeRegistry {
        self.catalog.natives()
    }

    /// Installs every tool a component offers for `tenant`. A tool whose name exists gets a
    /// new version, which answers calls from now on (calls already running finish on theirs).
    /// Nothing is stored unless every tool of the component is valid.
    pub async fn install(
        &self,
        tenant: &str,
        component: Vec<u8>,
    ) -> Result<Vec<ToolSpec>, InstallError> {
        let _admitted = self.pipeline.admit_install(tenant).await?;
        let quota = self.policy(tenant).await.code_quota();
        self.catalog.install(tenant, component, quota).await
    }

    /// Installs a tool with no code that makes one HTTP request (see [`HttpToolDef`]). Like
    /// a component's tool, a name that exists gets a new version.
    pub async fn install_http(
        &self,
        tenant: &str,
        def: HttpToolDef,
    ) -> Result<ToolSpec, InstallError> {
        let _admitted = self.pipeline.admit_install(tenant).await?;
        let quota = self.policy(tenant).await.code_quota();
        self.catalog.install_http(tenant, def, quota).await
    }

    /// Installs a stored-source JavaScript tool: an ES module that exports its `spec` and,
    /// as default, the handler `(args, ctx) => result`. It runs on the host's JS runtime, so
    /// it is callable at once: nothing is compiled. The module is evaluated once here, under
    /// the default limits, to read its spec; a syntax error names the line and column. Then,
    /// in the background, it is pre-initialised: later calls start with the module ready.
    pub async fn install_js(&self, tenant: &str, source: &str) -> Result<ToolSpec, InstallError> {
        let _admitted = self.pipeline.admit_install(tenant).await?;
        let quota = self.policy(tenant).await.code_quota();
        let spec = self.catalog.install_js(tenant, source, quota).await?;
        if let Some(Resolved::Tenant(tool)) = self.catalog.resolve(tenant, &spec.name) {
            self.pipeline.exec.pre_initialize(&tool).await;
        }
        Ok(spec)
    }

    /// Tenants with tools of their own installed, as this node knows them.
    pub fn tenants_with_tools(&self) -> Vec<String> {
        self.catalog.tenants_with_tools()
    }

    /// Tools an agent of `tenant` may see: natives, then the tenant's own. Private ones are left out.
    pub fn list(&self, tenant: &str) -> Vec<ToolInfo> {
        self.catalog.list(tenant)
    }

    /// The tools an agent of `tenant` sees (private ones left out), in an LLM API's shape.
    pub fn export(&self, tenant: &str, format: Format) -> Vec<Value> {
        self.catalog.export(tenant, format)
    }

    /// One tool as `tenant` sees it, private ones included (the host may call them).
    pub fn describe(&self, tenant: &str, name: &str) -> Option<ToolInfo> {
        self.catalog.describe(tenant, name)
    }

    /// Whether `tenant` has a tool `name` that agents see: any but a private one. Cheaper
    /// than [`Host::describe`], which copies the spec.
    pub fn is_visible(&self, tenant: &str, name: &str) -> bool {
        self.catalog
            .resolve(tenant, name)
            .is_some_and(|tool| !tool.spec().private)
    }

    /// A tenant's tool with every kept version.
    pub async fn versions(&self, tenant: &str, name: &str) -> Result<ToolEntry, ManageError> {
        self.catalog.versions(tenant, name).await
    }

    /// Makes an earlier version answer calls: `to`, or the one before the current. Returns
    /// the version now current.
    pub async fn rollback(
        &self,
        tenant: &str,
        name: &str,
        to: Option<u32>,
    ) -> Result<u32, ManageError> {
        self.catalog.rollback(tenant, name, to).await
    }

    /// Removes a tenant's tool and its versions. Calls already running finish; later ones get
    /// `not_found`.
    pub async fn remove(&self, tenant: &str, name: &str) -> Result<bool, StoreError> {
        self.catalog.remove(tenant, name).await
    }

    /// Tenants whose visible tools change (install, rollback, remove), as they happen. A
    /// lagging receiver should treat the lag as a change of its tenant.
    pub fn subscribe_changes(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.catalog.subscribe_changes()
    }

    /// Changes whenever `tenant`'s visible tools may have changed (natives included), and
    /// only then: another tenant's installs leave it as it is. For caches of what a tenant
    /// sees, such as its listings.
    pub fn generation(&self, tenant: &str) -> (u64, u64) {
        self.catalog.generation(tenant)
    }

    /// Linked components in memory now (bounded by `max_loaded_components`).
    pub fn loaded_components(&self) -> usize {
        self.components.loaded()
    }

    /// What the linked components in memory weigh, in bytes of compiled code (bounded by
    /// `max_loaded_component_bytes`).
    pub fn loaded_component_bytes(&self) -> u64 {
        self.components.loaded_bytes()
    }

    /// Sets a configuration value of `tenant`, readable by its tools that declare `key`.
    /// A secret is never shown again: not in listings, logs or error messages.
    pub async fn set_config(
        &self,
        tenant: &str,
        key: &str,
        value: &str,
        secret: bool,
    ) -> Result<(), ManageError> {
        self.tenants.set_config(tenant, key, value, secret).await
    }

    /// Deletes a configuration value; false if there was none.
    pub async fn remove_config(&self, tenant: &str, key: &str) -> Result<bool, ManageError> {
        self.tenants.remove_config(tenant, key).await
    }

    /// The tenant's configuration keys, each with its value unless it is a secret.
    pub async fn config(&self, tenant: &str) -> Result<Vec<(String, Option<String>)>, ManageError> {
        self.tenants.config(tenant).await
    }

    /// Records a tenant (idempotent); its id must be valid.
    pub async fn create_tenant(&self, tenant: &str) -> Result<bool, ManageError> {
        self.tenants.create(tenant).await
    }

    /// Every tenant.
    pub async fn tenants(&self) -> Result<Vec<String>, ManageError> {
        self.tenants.all().await
    }

    /// A new API key for an existing tenant, with what it may do. The returned secret is
    /// shown once: only its sha256 is stored.
    pub async fn create_key(&self, tenant: &str, role: Role) -> Result<NewKey, ManageError> {
        self.tenants.create_key(tenant, role).await
    }

    /// Keys of `tenant` (or all), without their secrets.
    pub async fn keys(&self, tenant: Option<&str>) -> Result<Vec<KeyRecord>, ManageError> {
        self.tenants.keys(tenant).await
    }

    /// Revokes the key with this public id; false if there was none.
    pub async fn revoke_key(&self, id: &str) -> Result<bool, ManageError> {
        self.tenants.revoke_key(id).await
    }

    /// The live key's record (its tenant and role), if it is one.
    pub async fn authenticate(&self, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        self.tenants.authenticate(key).await
    }

    /// The tenant's policy, or the host's default if it has none of its own.
    pub async fn policy(&self, tenant: &str) -> Arc<TenantPolicy> {
        self.tenants.policy(tenant).await
    }

    /// Stores the tenant's policy; it applies to the next call.
    pub async fn set_policy(&self, tenant: &str, policy: TenantPolicy) -> Result<(), ManageError> {
        self.tenants.set_policy(tenant, policy).await
    }

    /// What the tenant keeps on disk against each of its quotas (`files_quota_bytes`,
    /// `data_quota_bytes`, `code_quota_bytes`). Counting the files walks the tenant's
    /// directory the first time.
    pub async fn disk_usage(&self, tenant: &str) -> Result<DiskUsage, StoreError> {
        let policy = self.policy(tenant).await;
        let store = self.store();
        let files = self
            .pipeline
            .exec
            .files_used(tenant, &policy)
            .await
            .map_err(StoreError::Backend)?;
        Ok(DiskUsage {
            files: Usage::new(files, policy.files_quota()),
            data: Usage::new(store.data_bytes(tenant).await?, policy.data_quota()),
            code: Usage::new(
                toolhost_store::code_bytes(&store.tool_entries_of(tenant).await?),
                policy.code_quota(),
            ),
        })
    }

    /// The directory that holds `tenant`'s granted directories (`None` for an in-memory host).
    pub fn tenant_files(&self, tenant: &str) -> Option<PathBuf> {
        self.pipeline.exec.tenant_files(tenant)
    }

    /// Calls `name` for `caller` with JSON `args`. Never panics: every failure is an outcome.
    pub async fn call(&self, caller: &Caller, name: &str, args: Value) -> CallOutcome {
        self.pipeline
            .call(caller, name, args, None, Budget::TOP, None)
            .await
    }

    /// As [`Host::call`], until `cancel` fires (as the MCP server fires it on the client's
    /// `notifications/cancelled`): then the call stops where it is, waiting for its turn or
    /// running, its instance dropped, and ends [`CallError::Cancelled`].
    ///
    /// [`CallError::Cancelled`]: toolhost_spec::CallError::Cancelled
    pub async fn call_cancellable(
        &self,
        caller: &Caller,
        name: &str,
        args: Value,
        cancel: &CancellationToken,
    ) -> CallOutcome {
        self.pipeline
            .call(caller, name, args, None, Budget::TOP, Some(cancel))
            .await
    }

    /// Queues a call for whichever node claims it first (this one included), and returns
    /// its call id at once. The tool must exist now; everything else (policy, limits,
    /// validation, approval) applies when it runs. See [`DurableConfig`] for what happens when
    /// the node running it dies.
    ///
    /// [`DurableConfig`]: crate::DurableConfig
    pub async fn submit(
        &self,
        caller: &Caller,
        name: &str,
        args: Value,
    ) -> Result<String, CallError> {
        self.pipeline.submit(caller, name, args).await
    }

    /// The tenant's durable call `id` (`None` if it has none by that id), once it has ended
    /// or `wait` has passed, whichever is first. A tenant has at most
    /// [`MAX_DURABLE_WAITS_PER_TENANT`](crate::MAX_DURABLE_WAITS_PER_TENANT) reads waiting at
    /// once (the process [`MAX_DURABLE_WAITS`](crate::MAX_DURABLE_WAITS)); past that one
    /// answers at once, as with no `wait`.
    pub async fn durable_call(
        &self,
        tenant: &str,
        id: &str,
        wait: std::time::Duration,
    ) -> Result<Option<DurableStatus>, StoreError> {
        self.pipeline.durable(tenant, id, wait).await
    }

    /// Stops taking durable calls and waits up to `grace` for those this node is running to
    /// end; whether they all did. Call before stopping a node (`toolhost serve` does on
    /// SIGTERM), so that a rolling restart leaves no call to its lease.
    pub async fn drain(&self, grace: std::time::Duration) -> bool {
        let drained = self.workers.drain(grace).await;
        drop(
            self.heartbeat
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        // The other nodes take up this one's share of the limits now, not at its TTL.
        if let Err(error) = self.pipeline.store.depart(&self.pipeline.node).await {
            tracing::warn!(%error, "departure not recorded");
        }
        drained
    }

    /// Runs a call that waits for approval (see [`CallError::ApprovalRequired`]) and returns
    /// its outcome. It passes every other step again: policy, limits, hooks.
    ///
    /// [`CallError::ApprovalRequired`]: toolhost_spec::CallError::ApprovalRequired
    pub async fn approve(&self, tenant: &str, call_id: &str) -> Result<CallOutcome, ApprovalError> {
        self.pipeline.approve(tenant, call_id).await
    }

    /// Drops a call that waits for approval; its outcome is `rejected` with `reason`.
    pub async fn reject(
        &self,
        tenant: &str,
        call_id: &str,
        reason: &str,
    ) -> Result<CallOutcome, ApprovalError> {
        self.pipeline.reject(tenant, call_id, reason).await
    }

    /// The tenant's calls waiting for approval, longest waiting first.
    pub fn pending_approvals(&self, tenant: &str) -> Vec<PendingCall> {
        self.pipeline.pending_approvals(tenant)
    }

    /// The tenant's recent calls on this node that pass `filter`, newest first (see
    /// [`HostConfig::call_history`]).
    pub fn recent_calls(&self, tenant: &str, filter: &CallFilter) -> Vec<Arc<CallRecord>> {
        self.pipeline.history.recent(tenant, filter)
    }

    /// Per tool, the tenant's calls, errors and latency for each minute with calls among
    /// the last `minutes` (at most [`HISTORY_MINUTES`](crate::history::HISTORY_MINUTES)) on
    /// this node.
    pub fn call_stats(&self, tenant: &str, minutes: u64) -> Vec<ToolStats> {
        self.pipeline.history.stats(tenant, minutes, now_ms())
    }

    /// Registers a hook that runs around every call of every tenant, in registration order.
    pub fn add_hook(&self, hook: Arc<dyn CallHook>) {
        self.pipeline.add_hook(hook)
    }

    /// Counters for an operator (`/metrics`); `toolhost_storage_up` is refreshed here.
    pub fn metrics(&self) -> &Metrics {
        let metrics = &self.pipeline.metrics;
        metrics.storage_up(self.storage_health().is_ok());
        metrics
    }

    /// Whether the store's writes reach its disk; if not, the reason. Listing, describing and
    /// calls that write nothing are served either way.
    pub fn storage_health(&self) -> Result<(), String> {
        self.pipeline.store.health()
    }
}

/// What a host reads from its store before it serves.
struct Stored {
    store: Arc<dyn Store>,
    catalog: StoredCatalog,
    approvals: Approvals,
}

impl Stored {
    /// Three independent reads, side by side: each waits for a blocking-pool thread.
    async fn read(store: Arc<dyn Store>, config: &HostConfig) -> Result<Self, OpenError> {
        let (catalog, purged, approvals) = tokio::join!(
            StoredCatalog::read(store.clone(), config.js_runtime.as_deref()),
            store.cache_purge(now_ms()),
            Approvals::load(store.clone()),
        );
        // A cache: one not purged now is purged when read, or at the next start.
        match purged {
            Ok(purged) => tracing::debug!(purged, "expired cached results dropped"),
            Err(error) => tracing::warn!(%error, "expired cached results not purged"),
        }
        Ok(Stored {
            store,
            catalog: catalog?,
            approvals: approvals?,
        })
    }
}

/// The store `config` names, with its secrets key.
async fn open_store(config: &HostConfig) -> Result<Arc<dyn Store>, OpenError> {
    let key = config.secrets_key.clone();
    #[cfg(feature = "postgres")]
    if let Some(database) = &config.database {
        let store = PgStore::connect(database).await?;
        return Ok(Arc::new(store.with_secrets_key(key)));
    }
    let store = match config.data_dir.clone() {
        Some(dir) => {
            let cache_bytes = config.store_cache_bytes;
            tokio::task::spawn_blocking(move || RedbStore::open(&dir, cache_bytes))
                .await
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))?
        }
        None => RedbStore::temporary()?,
    };
    Ok(Arc::new(store.with_secrets_key(key)))
}

fn new_sandbox(config: &HostConfig) -> Result<Sandbox, OpenError> {
    Sandbox::new(config.sandbox.clone()).map_err(|e| OpenError::Engine(format!("{e:#}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A re-sync reads tenants' tools again whenever it cannot tell they are unchanged: one
    /// that finds them unchanged must not make every MCP session list them and every search
    /// index rebuild.
    #[tokio::test]
    async fn reading_a_tenants_unchanged_tools_again_tells_no_one() {
        let host = Host::open(Default::default()).await.unwrap();
        let def = serde_json::json!({
            "spec": {"name": "weather", "description": "Weather.", "parameters": {"type": "object"}},
            "request": {"method": "get", "url": "http://example.com/"}
        });
        let def = serde_json::from_value(def).unwrap();
        host.install_http("acme", def).await.unwrap();
        let (before, mut changes) = (host.generation("acme"), host.catalog.subscribe_changes());
        host.catalog.reload("acme").await.unwrap();
        host.catalog.reload_all().await.unwrap();
        assert_eq!(host.generation("acme"), before);
        assert!(changes.try_recv().is_err());
        // Changed behind the catalog's back, as another node would: served, and told.
        assert!(
            host.store()
                .remove_tool_entry("acme", "weather")
                .await
                .unwrap()
        );
        host.catalog.reload_all().await.unwrap();
        assert_ne!(host.generation("acme"), before);
        assert_eq!(changes.try_recv().unwrap(), "acme");
        assert!(host.describe("acme", "weather").is_none());
    }
}
