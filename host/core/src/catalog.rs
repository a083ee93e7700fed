//! Which tools exist, and changing that: install (components, HTTP tools, JS source),
//! versions, rollback, removal, listing, and resolving a name for a call. Each tenant's tools
//! are kept in memory, rebuilt from the store at start, beside the app's native tools.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolhost_sandbox::GuestToolDef;
use toolhost_spec::digest::sha256_hex;
use toolhost_spec::export::{self, Format};
use toolhost_spec::spec::{CachePolicy, Limits, RESERVED_NAMES, Schemas, SpecError, ToolSpec};
use toolhost_store::{SourceKind, Store, StoreError, ToolEntry, ToolRecords, code_bytes, now_ms};

use crate::components::Components;
use crate::config::{MAX_JS_SOURCE_BYTES, MAX_SPEC_BYTES_PER_TENANT, MAX_TOOLS_PER_COMPONENT};
use crate::error::{InstallError, ManageError};
use crate::http_tool::HttpToolDef;
use crate::registry::{NativeRegistry, NativeTool, TenantTool, TenantTools, is_valid_tenant};
use crate::released::Released;

/// A stored-source JS tool as stored: its source, and the runtime (by component sha256) it
/// was installed on and keeps running on, so a new runtime never changes an installed tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JsSource {
    /// sha256 (hex) of the runtime component.
    pub runtime: String,
    /// The tool's JavaScript.
    pub source: String,
}

/// The blobs `entries`' versions are implemented by, with their bytes (not the JS runtimes
/// they run on, which collection keeps while any tool names them).
fn blobs_named<'a>(entries: impl IntoIterator<Item = &'a ToolEntry>) -> HashMap<String, u64> {
    let versions = entries.into_iter().flat_map(|entry| &entry.versions);
    versions
        .map(|version| (version.component.clone(), version.bytes))
        .collect()
}

/// Forgets the blobs that no kept version of any tool implements: those of removed tools
/// and of versions past [`toolhost_store::MAX_VERSIONS_KEPT`]. A JS tool keeps the runtime it
/// was installed on, and the host keeps the one it runs new JS tools on. Run as the host
/// opens, before any install can race it.
async fn collect_blobs(
    store: &dyn Store,
    records: &ToolRecords,
    js_runtime: Option<&str>,
) -> Result<(), StoreError> {
    let mut live: HashSet<String> = js_runtime.map(str::to_owned).into_iter().collect();
    for version in records.entries.iter().flat_map(|entry| &entry.versions) {
        if let Some(runtime) = &version.runtime {
            live.insert(runtime.clone());
        } else if version.kind == SourceKind::Js
            // A record from before versions named their runtime: its source blob names it.
            && let Some(blob) = store.blob(&version.component).await?
            && let Ok(js) = serde_json::from_slice::<JsSource>(&blob)
        {
            live.insert(js.runtime);
        }
        live.insert(version.component.clone());
    }
    let collected = store
        .collect_blobs(records.unreadable, &|sha| live.contains(sha))
        .await?;
    if collected > 0 {
        tracing::info!(collected, "blobs no tool refers to any more removed");
    }
    Ok(())
}

/// Where a tool's code comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    /// A native tool of the embedding app.
    Native,
    /// A Wasm component; `component` is its sha256.
    Wasm {
        /// sha256 (hex) of the component.
        component: String,
        /// The version listed.
        version: u32,
        /// When it was installed (Unix milliseconds).
        installed_at_ms: u64,
    },
    /// A declarative HTTP request; `definition` is its sha256.
    Http {
        /// sha256 (hex) of the definition.
        definition: String,
        /// The version listed.
        version: u32,
        /// When it was installed (Unix milliseconds).
        installed_at_ms: u64,
    },
    /// JavaScript source on the host's runtime; `source` is its sha256.
    Js {
        /// sha256 (hex) of the stored source.
        source: String,
        /// The version listed.
        version: u32,
        /// When it was installed (Unix milliseconds).
        installed_at_ms: u64,
    },
}

/// A tool as listed: its spec and where it comes from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolInfo {
    /// Its spec.
    pub spec: ToolSpec,
    /// Its code.
    pub source: Source,
}

/// A tool resolved for one call.
#[derive(Clone)]
pub(crate) enum Resolved {
    Native(Arc<NativeTool>),
    Tenant(Arc<TenantTool>),
}

impl Resolved {
    pub fn spec(&self) -> &ToolSpec {
        match self {
            Resolved::Native(tool) => &tool.spec,
            Resolved::Tenant(tool) => tool.spec(),
        }
    }

    /// Its compiled schemas; an error if a stored spec's no longer compile.
    pub fn schemas(&self) -> Result<&Schemas, &SpecError> {
        match self {
            Resolved::Native(tool) => Ok(&tool.schemas),
            Resolved::Tenant(tool) => tool.schemas(),
        }
    }

    /// The content address of the code that answers (a native's is its name).
    pub fn content(&self) -> &str {
        match self {
            Resolved::Native(tool) => &tool.spec.name,
            Resolved::Tenant(tool) => &tool.version.component,
        }
    }

    /// Natives have no versions: 0.
    pub fn version(&self) -> u32 {
        match self {
            Resolved::Native(_) => 0,
            Resolved::Tenant(tool) => tool.version.version,
        }
    }
}

pub(crate) struct Catalog {
    natives: NativeRegistry,
    tools: TenantTools,
    store: Arc<dyn Store>,
    components: Arc<Components>,
    /// Serializes this process's read-modify-write of each tenant's tool entries (install,
    /// rollback, remove, reload), so that two installs of one tool cannot both become version
    /// N+1; the store's `lock_entries` does the same across the processes of a shared store.
    entry_writes: EntryLocks,
    /// The tenant whose visible tools changed, for subscribers such as MCP sessions.
    changes: tokio::sync::broadcast::Sender<String>,
    /// When each tenant's tools last changed, so that caches of one tenant's listing know
    /// to rebuild.
    stamps: std::sync::RwLock<ChangeStamps>,
    /// The JS runtime new JS tools are installed on, by component sha256.
    js_runtime: Option<String>,
    /// Each tenant's tools revision as of this process's last full read of them: a re-sync
    /// reads again only the tenants whose stored revision moved since.
    revisions_read: std::sync::Mutex<HashMap<String, u64>>,
    /// Blobs let go of and not yet collected.
    released: Released,
}

/// New versions of a tenant's tools, to be stored, and the blobs no version of its tools
/// names any more once they are.
struct Planned {
    entries: Vec<ToolEntry>,
    released: Vec<(String, u64)>,
}

/// When each tenant's tools last changed, counted in the catalog's changes. One count for
/// all keeps a tenant's stamp from ever coming back to a value a cache was built at; a stamp
/// per tenant keeps one tenant's installs from making the others' listings and search
/// indexes rebuild.
#[derive(Default)]
struct ChangeStamps {
    changes: u64,
    /// Tenants whose tools never changed since the host started are at 0.
    by_tenant: std::collections::HashMap<String, u64>,
}

impl ChangeStamps {
    fn stamp(&mut self, tenant: &str) {
        self.changes += 1;
        match self.by_tenant.get_mut(tenant) {
            Some(stamp) => *stamp = self.changes,
            None => {
                self.by_tenant.insert(tenant.to_owned(), self.changes);
            }
        }
    }
}

/// Every tenant's tools as read from the store, before the engine they run on exists: a
/// restart reads them while the engine is built.
pub struct StoredCatalog {
    store: Arc<dyn Store>,
    tools: TenantTools,
    js_runtime: Option<String>,
    revisions: HashMap<String, u64>,
}

impl StoredCatalog {
    /// The sha256 of the JS runtime new JS tools are installed on, if the host has one.
    pub fn js_runtime(&self) -> Option<&str> {
        self.js_runtime.as_deref()
    }

    /// Every tenant's tools as stored. A stored tool that no longer passes the rules is
    /// skipped, loudly, rather than refusing to start. The JS runtime new JS tools are
    /// installed on is stored once, like any component, and compiled on first use.
    pub async fn read(
        store: Arc<dyn Store>,
        js_runtime: Option<&[u8]>,
    ) -> Result<Self, StoreError> {
        let js_runtime = match js_runtime {
            Some(bytes) => {
                let sha = sha256_hex(bytes);
                if !store.has_blob(&sha).await? {
                    store.put_blob(&sha, bytes).await?;
                }
                Some(sha)
            }
            None => None,
        };
        // Before the entries: a write in between moves a revision past what was read, and
        // the next re-sync reads that tenant again.
        let revisions = store.tool_revisions().await?;
        let records = store.tool_entries().await?;
        collect_blobs(&*store, &records, js_runtime.as_deref()).await?;
        let tools = TenantTools::default();
        for tool in valid_tools(records.entries) {
            tools.insert(tool);
        }
        Ok(StoredCatalog {
            store,
            tools,
            js_runtime,
            revisions,
        })
    }
}

impl Catalog {
    /// The stored tools, run on `components`.
    pub fn new(stored: StoredCatalog, components: Arc<Components>) -> Self {
        Catalog {
            natives: NativeRegistry::default(),
            tools: stored.tools,
            store: stored.store,
            components,
            entry_writes: EntryLocks::default(),
            changes: tokio::sync::broadcast::channel(256).0,
            stamps: Default::default(),
            js_runtime: stored.js_runtime,
            revisions_read: std::sync::Mutex::new(stored.revisions),
            released: Released::default(),
        }
    }

    /// Collects released blobs in the background, a few seconds after each release, while
    /// the catalog lives.
    pub fn collect_released_blobs(self: &Arc<Self>) {
        let catalog = Arc::downgrade(self);
        let soon = self.released.waiter();
        tokio::spawn(async move {
            loop {
                // Woken by a release, or now and then to collect what was too young before
                // and to end once the catalog is gone.
                let woken =
                    tokio::time::timeout(crate::released::COLLECT_AGAIN_AFTER, soon.notified());
                if woken.await.is_ok() {
                    tokio::time::sleep(crate::released::COLLECT_AFTER).await;
                }
                let Some(catalog) = catalog.upgrade() else {
                    return;
                };
                if let Err(error) = catalog.collect_released().await {
                    tracing::warn!(%error, "released blobs not collected; trying again later");
                }
            }
        });
    }

    /// Removes the blobs no tool names (as at open), then settles each blob released before
    /// it that is gone or named again.
    async fn collect_released(&self) -> Result<(), StoreError> {
        let (released, records) = {
            let _alone = self.released.collecting().await;
            // Those released later may be named in the entries read here, and not collected.
            let released = self.released.all();
            if released.is_empty() {
                return Ok(());
            }
            let records = self.store.tool_entries().await?;
            collect_blobs(&*self.store, &records, self.js_runtime.as_deref()).await?;
            (released, records)
        };
        let named: HashSet<&str> = (records.entries.iter())
            .flat_map(|entry| &entry.versions)
            .map(|version| version.component.as_str())
            .collect();
        for (tenant, sha) in released {
            if named.contains(sha.as_str()) || !self.store.has_blob(&sha).await? {
                self.released.settled(&tenant, &sha);
            }
        }
        Ok(())
    }

    pub fn natives(&self) -> &NativeRegistry {
        &self.natives
    }

    /// Tenants with tools of their own.
    pub fn tenants_with_tools(&self) -> Vec<String> {
        self.tools.tenants()
    }

    /// Native first: a tenant never shadows a native name.
    pub fn resolve(&self, tenant: &str, name: &str) -> Option<Resolved> {
        match self.natives.get(name) {
            Some(native) => Some(Resolved::Native(native)),
            None => self.tools.get(tenant, name).map(Resolved::Tenant),
        }
    }

    /// Installs a component's tools; `code_quota` is the tenant's (see [`Catalog::plan_versions`]).
    pub async fn install(
        &self,
        tenant: &str,
        component: Vec<u8>,
        code_quota: u64,
    ) -> Result<Vec<ToolSpec>, InstallError> {
        check_tenant(tenant)?;
        let component = self.components.compile(tenant, component).await?;
        let defs = self
            .components
            .sandbox()
            .list_tools(&component.prepared, &Limits::default())
            .await
            .result
            .map_err(InstallError::ListTools)?;
        let specs = self.check_defs(tenant, defs)?;
        let _writing = self.entry_writes.lock(tenant).await;
        let _cluster = self.store.lock_entries(tenant).await?;
        let blob = (component.sha.as_str(), component.bytes.len() as u64);
        let planned = self
            .plan_versions(tenant, (SourceKind::Wasm, None), &specs, blob, code_quota)
            .await?;
        let _installing = self.released.installing().await;
        self.components.keep(tenant, component).await?;
        self.commit_versions(tenant, planned).await?;
        Ok(specs)
    }

    pub async fn install_http(
        &self,
        tenant: &str,
        def: HttpToolDef,
        code_quota: u64,
    ) -> Result<ToolSpec, InstallError> {
        check_tenant(tenant)?;
        let spec = def.validate()?;
        self.check_name(tenant, &spec, &[])?;
        let request = serde_json::to_vec(&def.request).expect("a request definition serializes");
        self.add_blob_version(tenant, (SourceKind::Http, None), spec, &request, code_quota)
            .await
    }

    pub async fn install_js(
        &self,
        tenant: &str,
        source: &str,
        code_quota: u64,
    ) -> Result<ToolSpec, InstallError> {
        check_tenant(tenant)?;
        if source.len() > MAX_JS_SOURCE_BYTES {
            return Err(InstallError::JsTooLarge { size: source.len() });
        }
        let runtime = self.js_runtime.clone().ok_or(InstallError::NoJsRuntime)?;
        let prepared = self
            .components
            .prepared(None, &runtime)
            .await
            .map_err(|message| InstallError::JsSource(format!("the runtime: {message}")))?;
        let described = self
            .components
            .sandbox()
            .js_describe(&prepared, &Limits::default(), source)
            .await;
        let spec_json = match described.result {
            Ok(Ok(json)) => json,
            Ok(Err(message)) => return Err(InstallError::JsSource(message)),
            Err(fault) => return Err(InstallError::JsSource(format!("evaluating it {fault}"))),
        };
        let spec: ToolSpec = serde_json::from_str(&spec_json)
            .map_err(|e| SpecError::new("(js)", "spec", format!("not a tool spec: {e}")))?;
        spec.validate()?;
        self.check_name(tenant, &spec, &[])?;
        let stored = JsSource {
            runtime: runtime.clone(),
            source: source.to_owned(),
        };
        let blob = serde_json::to_vec(&stored).expect("a JS source serializes");
        let kind = (SourceKind::Js, Some(runtime));
        self.add_blob_version(tenant, kind, spec, &blob, code_quota)
            .await
    }

    /// Stores `blob` and makes it the new version of `spec`'s tool, of `kind` (and, for JS,
    /// on its runtime).
    async fn add_blob_version(
        &self,
        tenant: &str,
        kind: (SourceKind, Option<String>),
        spec: ToolSpec,
        blob: &[u8],
        code_quota: u64,
    ) -> Result<ToolSpec, InstallError> {
        let sha = sha256_hex(blob);
        let _writing = self.entry_writes.lock(tenant).await;
        let _cluster = self.store.lock_entries(tenant).await?;
        let specs = std::slice::from_ref(&spec);
        let planned = self
            .plan_versions(
                tenant,
                kind.clone(),
                specs,
                (&sha, blob.len() as u64),
                code_quota,
            )
            .await?;
        let _installing = self.released.installing().await;
        if let (SourceKind::Js, Some(runtime)) = &kind {
            self.components.keep_carried(runtime).await?;
        }
        self.store.put_blob(&sha, blob).await?;
        self.commit_versions(tenant, planned).await?;
        Ok(spec)
    }

    /// The entries of `specs`' tools, each with a new version of `kind` (and runtime)
    /// implemented by `blob` (sha256, bytes), unless the tenant's kept versions and its
    /// released blobs not yet collected would then hold more than `code_quota` bytes of code.
    /// The caller holds the entry lock; nothing is stored yet.
    async fn plan_versions(
        &self,
        tenant: &str,
        kind: (SourceKind, Option<String>),
        specs: &[ToolSpec],
        blob: (&str, u64),
        code_quota: u64,
    ) -> Result<Planned, InstallError> {
        let planned = (self.plan_versions_now(tenant, kind.clone(), specs, blob, code_quota)).await;
        // Past the quota while code it let go of awaits collection: collected now (at most
        // once a second, as a collection reads every tool), and planned again.
        match planned {
            Err(InstallError::CodeQuota { .. })
                if self.released.weight(tenant) > 0 && self.released.may_collect_now() =>
            {
                self.collect_released().await?;
                (self.plan_versions_now(tenant, kind, specs, blob, code_quota)).await
            }
            planned => planned,
        }
    }

    async fn plan_versions_now(
        &self,
        tenant: &str,
        kind: (SourceKind, Option<String>),
        specs: &[ToolSpec],
        (sha, bytes): (&str, u64),
        code_quota: u64,
    ) -> Result<Planned, InstallError> {
        let installed_at_ms = now_ms();
        let mut entries = self.store.tool_entries_of(tenant).await?;
        let named_before = blobs_named(&entries);
        let released_weight = self.released.weight(tenant);
        let before = (
            code_bytes(&entries).saturating_add(released_weight),
            spec_bytes(&entries),
        );
        let mut changed = Vec::with_capacity(specs.len());
        for spec in specs {
            let mut entry = match entries.iter().position(|e| e.name == spec.name) {
                Some(at) => entries.swap_remove(at),
                None => ToolEntry {
                    tenant: tenant.to_owned(),
                    name: spec.name.clone(),
                    current: 0,
                    versions: Vec::new(),
                },
            };
            entry.push(
                kind.clone(),
                spec.clone(),
                sha.to_owned(),
                bytes,
                installed_at_ms,
            );
            changed.push(entry);
        }
        let used = code_bytes(entries.iter().chain(&changed)).saturating_add(released_weight);
        // Past the quota only by growing: an install that adds nothing is never refused.
        if used > code_quota && used > before.0 {
            return Err(InstallError::CodeQuota {
                used,
                quota: code_quota,
            });
        }
        let specs = spec_bytes(entries.iter().chain(&changed));
        if specs > MAX_SPEC_BYTES_PER_TENANT && specs > before.1 {
            return Err(InstallError::SpecsTooLarge(specs));
        }
        let named_after = blobs_named(entries.iter().chain(&changed));
        let released = (named_before.into_iter())
            .filter(|(sha, _)| !named_after.contains_key(sha))
            .collect();
        Ok(Planned {
            entries: changed,
            released,
        })
    }

    /// Stores the entries `plan_versions` made, and serves them. The caller holds the entry
    /// lock and has stored their blob.
    async fn commit_versions(&self, tenant: &str, planned: Planned) -> Result<(), InstallError> {
        self.store.put_tool_entries(&planned.entries).await?;
        self.released.release(tenant, planned.released);
        for entry in &planned.entries {
            self.tools.insert(tenant_tool(entry)?);
        }
        self.changed(tenant);
        Ok(())
    }

    fn check_defs(
        &self,
        tenant: &str,
        defs: Vec<GuestToolDef>,
    ) -> Result<Vec<ToolSpec>, InstallError> {
        match defs.len() {
            0 => return Err(InstallError::NoTools),
            count if count > MAX_TOOLS_PER_COMPONENT => {
                return Err(InstallError::TooManyTools { count });
            }
            _ => {}
        }
        let mut specs: Vec<ToolSpec> = Vec::with_capacity(defs.len());
        for def in defs {
            let spec = spec_from_guest(def)?;
            spec.validate()?;
            self.check_name(tenant, &spec, &specs)?;
            specs.push(spec);
        }
        Ok(specs)
    }

    /// A tenant's tool may not take a native's name, nor differ only in case from a native,
    /// another of its tools, or one installed along with it (`siblings`).
    fn check_name(
        &self,
        tenant: &str,
        spec: &ToolSpec,
        siblings: &[ToolSpec],
    ) -> Result<(), InstallError> {
        let name = &spec.name;
        if self.natives.get(name).is_some() {
            return Err(InstallError::NativeName(name.clone()));
        }
        if RESERVED_NAMES.iter().any(|r| r.eq_ignore_ascii_case(name)) {
            return Err(InstallError::ReservedName(name.clone()));
        }
        let twin = self
            .natives
            .case_twin(name)
            .or_else(|| self.tools.case_twin(tenant, name))
            .or_else(|| {
                siblings
                    .iter()
                    .find(|s| s.name.eq_ignore_ascii_case(name))
                    .map(|s| s.name.clone())
            });
        match twin {
            Some(existing) if existing == *name && siblings.iter().any(|s| s.name == *name) => {
                Err(SpecError::new(name, "name", "appears twice in this component").into())
            }
            Some(existing) if existing != *name => Err(InstallError::CaseConflict {
                name: name.clone(),
                existing,
            }),
            _ => Ok(()),
        }
    }

    /// Natives, then the tenant's own; private ones left out.
    pub fn list(&self, tenant: &str) -> Vec<ToolInfo> {
        let natives = self.natives.all().into_iter().map(|t| native_info(&t));
        let tenant_tools = self.tools.tenant_tools(tenant);
        let own = tenant_tools.iter().map(|t| tenant_info(t));
        natives
            .chain(own)
            .filter(|info| !info.spec.private)
            .collect()
    }

    pub fn export(&self, tenant: &str, format: Format) -> Vec<Value> {
        let listed = self.list(tenant);
        export::tools(listed.iter().map(|t| &t.spec), format)
    }

    pub fn describe(&self, tenant: &str, name: &str) -> Option<ToolInfo> {
        match self.resolve(tenant, name)? {
            Resolved::Native(native) => Some(native_info(&native)),
            Resolved::Tenant(tool) => Some(tenant_info(&tool)),
        }
    }

    pub async fn versions(&self, tenant: &str, name: &str) -> Result<ToolEntry, ManageError> {
        self.store
            .tool_entries_of(tenant)
            .await?
            .into_iter()
            .find(|e| e.name == name)
            .ok_or_else(|| ManageError::NotFound(name.to_owned()))
    }

    pub async fn rollback(
        &self,
        tenant: &str,
        name: &str,
        to: Option<u32>,
    ) -> Result<u32, ManageError> {
        let _writing = self.entry_writes.lock(tenant).await;
        let _cluster = self.store.lock_entries(tenant).await?;
        let mut entry = self.versions(tenant, name).await?;
        let target = match to {
            Some(version) => version,
            None => entry
                .versions
                .iter()
                .map(|v| v.version)
                .filter(|&v| v < entry.current)
                .max()
                .ok_or_else(|| ManageError::NoEarlierVersion(name.to_owned()))?,
        };
        if entry.version(target).is_none() {
            let available = entry.versions.iter().map(|v| v.version).collect();
            return Err(ManageError::NoSuchVersion {
                name: name.to_owned(),
                version: target,
                available,
            });
        }
        let served = self.tools.tenant_tools(tenant);
        let before: u64 = served.iter().map(|tool| tool.version.spec_bytes()).sum();
        let replaced = entry.current().spec_bytes();
        entry.current = target;
        let after = (before + entry.current().spec_bytes()).saturating_sub(replaced);
        if after > MAX_SPEC_BYTES_PER_TENANT && after > before {
            return Err(ManageError::SpecsTooLarge(after));
        }
        let tool = tenant_tool(&entry)?;
        self.store
            .put_tool_entries(std::slice::from_ref(&entry))
            .await?;
        self.tools.insert(tool);
        self.changed(tenant);
        Ok(target)
    }

    pub async fn remove(&self, tenant: &str, name: &str) -> Result<bool, StoreError> {
        let _writing = self.entry_writes.lock(tenant).await;
        let _cluster = self.store.lock_entries(tenant).await?;
        if self.tools.get(tenant, name).is_none() {
            return Ok(false);
        }
        let (gone, kept): (Vec<ToolEntry>, Vec<ToolEntry>) = (self.store)
            .tool_entries_of(tenant)
            .await?
            .into_iter()
            .partition(|entry| entry.name == name);
        self.store.remove_tool_entry(tenant, name).await?;
        let named = blobs_named(&kept);
        let released = blobs_named(&gone).into_iter();
        (self.released).release(tenant, released.filter(|(sha, _)| !named.contains_key(sha)));
        let removed = self.tools.remove(tenant, name);
        self.changed(tenant);
        Ok(removed)
    }

    pub fn subscribe_changes(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.changes.subscribe()
    }

    /// Changes whenever `tenant`'s visible tools may have changed: its own, or the natives.
    pub fn generation(&self, tenant: &str) -> (u64, u64) {
        let stamps = self.stamps.read().unwrap_or_else(|p| p.into_inner());
        let own = stamps.by_tenant.get(tenant).copied().unwrap_or(0);
        (own, self.natives.generation())
    }

    /// After `tenant`'s tools changed: stamped after the change, so that a listing built
    /// from the stamp it read holds every change up to it.
    fn changed(&self, tenant: &str) {
        self.stamps
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .stamp(tenant);
        // No receivers is fine: nobody is listening.
        let _ = self.changes.send(tenant.to_owned());
    }

    /// Reads a tenant's tools again (another node may have changed them) and, if they
    /// differ from those served, serves them and tells subscribers: a re-read that finds
    /// nothing new sends no MCP session a `list_changed` and rebuilds no search index.
    pub async fn reload(&self, tenant: &str) -> Result<(), StoreError> {
        // Not between this process's own read and write of the entries: it would put back
        // what that write replaces.
        let _writing = self.entry_writes.lock(tenant).await;
        let tools = valid_tools(self.store.tool_entries_of(tenant).await?);
        if self.tools.differs(tenant, &tools) {
            self.tools.replace_tenant(tenant, tools);
            self.changed(tenant);
        }
        Ok(())
    }

    /// Reads again the tools of every tenant whose stored revision moved since this process
    /// last read them (notices from other nodes may have been missed): one small row per
    /// tenant, not every entry of every tenant.
    pub async fn reload_all(&self) -> Result<(), StoreError> {
        let revisions = self.store.tool_revisions().await?;
        let stale = {
            let read = self.revisions_read();
            stale_tenants(self.tools.tenants(), &read, &revisions)
        };
        for tenant in stale {
            // Read under the tenant's lock, so this process's own write is not undone.
            self.reload(&tenant).await?;
            let revision = revisions.get(&tenant).copied().unwrap_or(0);
            self.revisions_read().insert(tenant, revision);
        }
        Ok(())
    }

    fn revisions_read(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.revisions_read
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

/// The tenants to read again: those whose stored revision is not the one last read, and
/// those served with no stored revision at all.
fn stale_tenants(
    served: Vec<String>,
    read: &HashMap<String, u64>,
    stored: &HashMap<String, u64>,
) -> BTreeSet<String> {
    let moved = stored
        .iter()
        .filter(|&(tenant, revision)| read.get(tenant) != Some(revision))
        .map(|(tenant, _)| tenant.clone());
    let unknown = served.into_iter().filter(|t| !stored.contains_key(t));
    moved.chain(unknown).collect()
}

/// Bytes of the current versions' specs of `entries`, as JSON: what serving them holds.
fn spec_bytes<'a>(entries: impl IntoIterator<Item = &'a ToolEntry>) -> u64 {
    let current = entries
        .into_iter()
        .map(|entry| entry.current().spec_bytes());
    current.sum()
}

/// Tenants whose tool entries this process writes at once: each write holds a connection of
/// a shared store's pool for its span (see `Store::lock_entries`), and needs another for its
/// reads and writes.
const CONCURRENT_ENTRY_WRITES: usize = 4;

/// One lock per tenant, so that one tenant's slow write (it reads every kept version of its
/// tools) never holds up another's, within [`CONCURRENT_ENTRY_WRITES`].
struct EntryLocks {
    by_tenant: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    writing: tokio::sync::Semaphore,
}

impl Default for EntryLocks {
    fn default() -> Self {
        EntryLocks {
            by_tenant: Default::default(),
            writing: tokio::sync::Semaphore::new(CONCURRENT_ENTRY_WRITES),
        }
    }
}

/// A tenant's entry lock, held (or waited for); its place in the map goes when no one else
/// wants it, also when the wait is given up.
struct EntryGuard<'a> {
    locks: &'a EntryLocks,
    tenant: String,
    lock: Arc<tokio::sync::Mutex<()>>,
    held: Option<(
        tokio::sync::OwnedMutexGuard<()>,
        tokio::sync::SemaphorePermit<'a>,
    )>,
}

impl EntryLocks {
    async fn lock(&self, tenant: &str) -> EntryGuard<'_> {
        let lock = self.locks().entry(tenant.to_owned()).or_default().clone();
        let mut guard = EntryGuard {
            locks: self,
            tenant: tenant.to_owned(),
            lock,
            held: None,
        };
        let own = guard.lock.clone().lock_owned().await;
        let slot = self.writing.acquire().await.expect("never closed");
        guard.held = Some((own, slot));
        guard
    }

    fn locks(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
        self.by_tenant.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for EntryGuard<'_> {
    fn drop(&mut self) {
        self.held = None;
        let mut locks = self.locks.locks();
        // The map's and this guard's only: no one else holds or waits for it.
        if Arc::strong_count(&self.lock) <= 2 {
            locks.remove(&self.tenant);
        }
    }
}

/// The tools `entries` serve. A stored tool that no longer passes the rules is skipped,
/// loudly, rather than taking its tenant's other tools down with it.
fn valid_tools(entries: Vec<ToolEntry>) -> Vec<TenantTool> {
    entries
        .into_iter()
        .filter_map(|entry| match entry.current().spec.check_fields() {
            Ok(()) => Some(stored_tenant_tool(entry)),
            Err(error) => {
                tracing::error!(tenant = entry.tenant, %error, "stored tool no longer valid; not loaded");
                None
            }
        })
        .collect()
}

fn check_tenant(tenant: &str) -> Result<(), InstallError> {
    match is_valid_tenant(tenant) {
        true => Ok(()),
        false => Err(InstallError::Tenant(tenant.chars().take(128).collect())),
    }
}

/// A tool being installed or rolled back: every rule checked, its schemas compiled.
fn tenant_tool(entry: &ToolEntry) -> Result<TenantTool, SpecError> {
    let version = entry.current().clone();
    let schemas = version.spec.validate()?;
    Ok(TenantTool {
        tenant: entry.tenant.clone(),
        version,
        schemas: OnceLock::from(Ok(schemas)),
    })
}

/// A tool read back from the store, its fields checked: its schemas wait for its first call.
fn stored_tenant_tool(mut entry: ToolEntry) -> TenantTool {
    TenantTool {
        tenant: std::mem::take(&mut entry.tenant),
        version: entry.into_current(),
        schemas: OnceLock::new(),
    }
}

fn spec_from_guest(def: GuestToolDef) -> Result<ToolSpec, SpecError> {
    let json = |field: &str, text: &str| {
        serde_json::from_str(text)
            .map_err(|e| SpecError::new(&def.name, field, format!("not JSON: {e}")))
    };
    let parameters = json("parameters", &def.parameters)?;
    let output_schema = match &def.output_schema {
        Some(text) => Some(json("output_schema", text)?),
        None => None,
    };
    let defaults = Limits::default();
    Ok(ToolSpec {
        name: def.name,
        description: def.description,
        parameters,
        strict: def.strict,
        group: def.group,
        private: def.private,
        limits: Limits {
            timeout_ms: def.limits.timeout_ms.unwrap_or(defaults.timeout_ms),
            fuel: def.limits.fuel.unwrap_or(defaults.fuel),
            memory_bytes: def.limits.memory_bytes.unwrap_or(defaults.memory_bytes),
            max_result_chars: def
                .limits
                .max_result_chars
                .unwrap_or(defaults.max_result_chars),
        },
        cache: def.cache.map(|c| CachePolicy {
            ttl_ms: c.ttl_ms,
            key_path: c.key_path,
        }),
        config: def.config,
        needs_approval: def.needs_approval,
        idempotent: def.idempotent,
        retry_count_on_stall: def.retry_count_on_stall,
        output_schema,
    })
}

fn native_info(tool: &NativeTool) -> ToolInfo {
    ToolInfo {
        spec: tool.spec.clone(),
        source: Source::Native,
    }
}

fn tenant_info(tool: &TenantTool) -> ToolInfo {
    let (version, installed_at_ms) = (tool.version.version, tool.version.installed_at_ms);
    let sha = tool.version.component.clone();
    ToolInfo {
        spec: tool.spec().clone(),
        source: match tool.version.kind {
            SourceKind::Wasm => Source::Wasm {
                component: sha,
                version,
                installed_at_ms,
            },
            SourceKind::Http => Source::Http {
                definition: sha,
                version,
                installed_at_ms,
            },
            SourceKind::Js => Source::Js {
                source: sha,
                version,
                installed_at_ms,
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_tenants_entry_lock_holds_up_only_its_own_writes_within_a_few_at_once() {
        let locks = EntryLocks::default();
        let acme = locks.lock("acme").await;
        let again = tokio::time::timeout(Duration::from_millis(50), locks.lock("acme")).await;
        assert!(again.is_err(), "acme's second write waits for its first");
        let mut others = Vec::new();
        for tenant in ["globex", "initech", "umbrella"]
            .iter()
            .take(CONCURRENT_ENTRY_WRITES - 1)
        {
            others.push(locks.lock(tenant).await);
        }
        let past = tokio::time::timeout(Duration::from_millis(50), locks.lock("hooli")).await;
        assert!(
            past.is_err(),
            "{CONCURRENT_ENTRY_WRITES} tenants write at once"
        );
        drop((acme, others));
        assert!(locks.locks().is_empty(), "a lock no one holds is forgotten");
        drop(locks.lock("hooli").await);
        assert!(locks.locks().is_empty());
    }

    #[test]
    fn a_resync_reads_again_only_the_tenants_whose_revision_moved() {
        let revisions = |pairs: &[(&str, u64)]| -> HashMap<String, u64> {
            pairs.iter().map(|&(t, r)| (t.to_owned(), r)).collect()
        };
        let read = revisions(&[("acme", 3), ("globex", 7), ("initech", 1)]);
        let stored = revisions(&[("acme", 3), ("globex", 8), ("initech", 1), ("hooli", 1)]);
        let served = ["acme", "globex", "initech", "umbrella"]
            .map(String::from)
            .to_vec();
        let stale = stale_tenants(served, &read, &stored);
        // globex moved, hooli is new, and umbrella is served with no stored revision at all.
        assert_eq!(
            stale,
            ["globex", "hooli", "umbrella"].map(String::from).into()
        );
        let served = ["acme", "globex"].map(String::from).to_vec();
        assert!(stale_tenants(served, &stored, &stored).is_empty());
    }
}
