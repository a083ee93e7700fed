//! The host: one call from name and JSON to a clipped, typed outcome.
//!
//! resolve (native first, then the caller's tenant) -> validate args -> result cache ->
//! execute (fresh instance, or the native handler) under the tool's limits -> check and clip
//! the result -> cache it.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::approval::{ApprovalError, Approvals, PendingCall};
use crate::cache::{self, KeyPath};
use crate::call::Level;
use crate::call::{CallContext, CallError, CallOutcome, Caller, ToolError};
use crate::clip::clip;
use crate::egress::EgressConfig;
use crate::helpers::Helpers;
use crate::hooks::{CallHook, HookCall};
use crate::http_tool::{HttpRequestDef, HttpToolDef};
use crate::loaded::Loaded;
use crate::metrics::{ComponentSource, Metrics};
use crate::policy::{Admission, DEFAULT_FILES_QUOTA_BYTES, Decision, PolicyError, TenantPolicy};
use crate::registry::{Catalog, NativeRegistry, NativeTool, TenantTool, is_valid_tenant};
use crate::sandbox::{
    Entry, Fault, GuestToolDef, GuestToolError, LoadError, NestedCall, NestedReply, Permissions,
    Preopen, Prepared, Sandbox, SandboxConfig,
};
use crate::schema::ArgsValidator;
use crate::spec::{CachePolicy, Limits, SpecError, ToolSpec, is_valid_config_key};
use crate::store::{
    ConfigValue, KeyRecord, SledStore, SourceKind, Store, StoreError, ToolEntry, now_ms, sha256_hex,
};

/// The largest JavaScript source `install_js` accepts, in bytes.
pub const MAX_JS_SOURCE_BYTES: usize = 1 << 20;

/// A stored-source JS tool as stored: its source, and the runtime (by component sha256) it
/// was installed on and keeps running on, so a new runtime never changes an installed tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JsSource {
    pub runtime: String,
    pub source: String,
}

/// How deep `call-tool` calls may nest below a direct call.
pub const MAX_NESTING_DEPTH: u32 = 4;

/// What a call may spend: its depth of nesting, and for a nested call what its caller has
/// left, which narrows the callee's own limits. An approved call has spent its approval.
#[derive(Debug, Clone, Copy)]
struct Budget {
    depth: u32,
    deadline: Option<Instant>,
    fuel: Option<u64>,
    approved: bool,
}

impl Budget {
    const TOP: Budget = Budget {
        depth: 0,
        deadline: None,
        fuel: None,
        approved: false,
    };

    fn narrow(&self, limits: &Limits) -> Limits {
        let mut narrowed = *limits;
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            narrowed.timeout_ms = narrowed.timeout_ms.min(left.as_millis() as u64).max(1);
        }
        if let Some(fuel) = self.fuel {
            narrowed.fuel = narrowed.fuel.min(fuel).max(1);
        }
        narrowed
    }
}

/// A component may offer at most this many tools.
pub const MAX_TOOLS_PER_COMPONENT: usize = 256;
/// A configuration value is at most this many bytes.
pub const MAX_CONFIG_VALUE_BYTES: usize = 64 * 1024;
/// A tool's own error message is cut to this many characters.
const MAX_ERROR_CHARS: usize = 4096;

#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Where installed tools persist. `None` keeps everything in memory.
    pub data_dir: Option<PathBuf>,
    pub sandbox: SandboxConfig,
    /// Linked components kept in memory; past this the least recently used is dropped and
    /// reloaded from its stored artifact on its next call.
    pub max_loaded_components: usize,
    /// The store's page cache, in bytes.
    pub store_cache_bytes: u64,
    /// The policy of every tenant that has none of its own (`Host::set_policy`).
    pub default_policy: TenantPolicy,
    /// Where outbound requests may go.
    pub egress: EgressConfig,
    /// Root of tenants' granted directories [default: `data_dir/files`; none in memory].
    pub files_dir: Option<PathBuf>,
    /// The JavaScript runtime component (`scripts/build-js-runtime`) that runs stored-source
    /// JS tools; without it `install_js` refuses.
    pub js_runtime: Option<Vec<u8>>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            data_dir: None,
            sandbox: SandboxConfig::default(),
            max_loaded_components: 256,
            store_cache_bytes: 64 << 20,
            default_policy: TenantPolicy::default(),
            egress: EgressConfig::default(),
            files_dir: None,
            js_runtime: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot start the Wasm engine: {0}")]
    Engine(String),
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("tenant `{0}` is not a valid tenant id (1 to 128 printable characters)")]
    Tenant(String),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("the component's list-tools {0}")]
    ListTools(Fault),
    #[error("the component offers no tools")]
    NoTools,
    #[error("the component offers {count} tools; the limit is {MAX_TOOLS_PER_COMPONENT}")]
    TooManyTools { count: usize },
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(
        "JavaScript tools need the JS runtime: start the host with one (HostConfig::js_runtime, `--js-runtime`; `scripts/build-js-runtime` builds it)"
    )]
    NoJsRuntime,
    #[error("the JavaScript source is {size} bytes; the limit is {MAX_JS_SOURCE_BYTES}")]
    JsTooLarge { size: usize },
    /// The module does not compile or run, or has no usable `spec` export.
    #[error("the JavaScript source: {0}")]
    JsSource(String),
    #[error("tool `{0}`: the name belongs to a native tool of this host")]
    NativeName(String),
    #[error("tool `{name}`: differs only in case from the existing tool `{existing}`")]
    CaseConflict { name: String, existing: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, thiserror::Error)]
pub enum ManageError {
    #[error("no tool named `{0}`")]
    NotFound(String),
    #[error("tool `{name}` has no version {version}; it has {available:?}")]
    NoSuchVersion {
        name: String,
        version: u32,
        available: Vec<u32>,
    },
    #[error("tool `{0}` has no earlier version to roll back to")]
    NoEarlierVersion(String),
    #[error("tenant `{0}` is not a valid tenant id (1 to 128 printable characters)")]
    Tenant(String),
    #[error("no tenant `{0}`: create it first")]
    NoTenant(String),
    #[error("no randomness available: {0}")]
    Random(String),
    #[error("config key `{0}` must match ^[A-Za-z0-9_.-]{{1,128}}$")]
    ConfigKey(String),
    #[error("config value is {0} bytes; the limit is {MAX_CONFIG_VALUE_BYTES}")]
    ConfigValue(usize),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A freshly created API key: `secret` is shown once and never stored.
#[derive(Debug, Clone, Serialize)]
pub struct NewKey {
    pub secret: String,
    #[serde(flatten)]
    pub record: KeyRecord,
}

/// Where a tool's code comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    Native,
    Wasm {
        component: String,
        version: u32,
        installed_at_ms: u64,
    },
    /// A declarative HTTP request; `definition` is its sha256.
    Http {
        definition: String,
        version: u32,
        installed_at_ms: u64,
    },
    /// JavaScript source on the host's runtime; `source` is its sha256.
    Js {
        source: String,
        version: u32,
        installed_at_ms: u64,
    },
}

/// A tool as listed: its spec and where it comes from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolInfo {
    pub spec: ToolSpec,
    pub source: Source,
}

/// A tool resolved for one call.
enum Resolved {
    Native(Arc<NativeTool>),
    Tenant(Arc<TenantTool>),
}

impl Resolved {
    fn spec(&self) -> &ToolSpec {
        match self {
            Resolved::Native(tool) => &tool.spec,
            Resolved::Tenant(tool) => tool.spec(),
        }
    }

    fn validator(&self) -> &ArgsValidator {
        match self {
            Resolved::Native(tool) => &tool.validator,
            Resolved::Tenant(tool) => &tool.validator,
        }
    }

    /// Natives have no versions: 0.
    fn version(&self) -> u32 {
        match self {
            Resolved::Native(_) => 0,
            Resolved::Tenant(tool) => tool.version.version,
        }
    }
}

pub struct Host {
    natives: NativeRegistry,
    catalog: Catalog,
    store: Arc<dyn Store>,
    sandbox: Arc<Sandbox>,
    loaded: Loaded,
    call_ids: CallIds,
    /// Serializes read-modify-write of tool entries (install, rollback, remove), so that two
    /// installs of one tool cannot both become version N+1. Never held across an `await`.
    entry_writes: Mutex<()>,
    /// The tenant whose visible tools changed, for subscribers such as MCP sessions.
    changes: tokio::sync::broadcast::Sender<String>,
    /// Bumped on every catalog change, so caches of listings know to rebuild.
    generation: AtomicU64,
    /// Tenants' policies as last read or set; `default_policy` for tenants without one.
    policies: Mutex<HashMap<String, Arc<TenantPolicy>>>,
    default_policy: Arc<TenantPolicy>,
    admission: Admission,
    hooks: RwLock<Vec<Arc<dyn CallHook>>>,
    approvals: Approvals,
    metrics: Metrics,
    egress: Arc<EgressConfig>,
    /// Where tenants' granted directories live, one directory per tenant.
    files_dir: Option<PathBuf>,
    /// Parsed HTTP request definitions by blob sha256; small, and shared by versions.
    http_requests: Mutex<HashMap<String, Arc<HttpRequestDef>>>,
    /// The JS runtime new JS tools are installed on, by component sha256.
    js_runtime: Option<String>,
    /// Stored JS sources by blob sha256.
    js_sources: Mutex<HashMap<String, Arc<JsSource>>>,
}

impl Host {
    /// Opens the data directory (or an in-memory store) and loads every tenant's catalog.
    /// Components are loaded lazily, on first call.
    pub fn open(config: HostConfig) -> Result<Self, OpenError> {
        let store: Arc<dyn Store> = match &config.data_dir {
            Some(dir) => Arc::new(SledStore::open(dir, config.store_cache_bytes)?),
            None => Arc::new(SledStore::temporary()?),
        };
        Self::with_store(store, config)
    }

    /// A host over any [`Store`]; `config.data_dir` is ignored.
    pub fn with_store(store: Arc<dyn Store>, config: HostConfig) -> Result<Self, OpenError> {
        let sandbox =
            Sandbox::new(config.sandbox).map_err(|e| OpenError::Engine(format!("{e:#}")))?;
        let catalog = Catalog::default();
        for entry in store.tool_entries()? {
            match tenant_tool(&entry) {
                Ok(tool) => catalog.insert(tool),
                // Rules can tighten between versions: skip, loudly, rather than refuse to start.
                Err(error) => {
                    tracing::error!(tenant = entry.tenant, %error, "stored tool no longer valid; not loaded")
                }
            }
        }
        // Stored once, like any component; compiled on first use and its artifact kept.
        let js_runtime = match &config.js_runtime {
            Some(bytes) => {
                let sha = sha256_hex(bytes);
                if store.blob(&sha)?.is_none() {
                    store.put_blob(&sha, bytes)?;
                }
                Some(sha)
            }
            None => None,
        };
        let purged = store.cache_purge(now_ms())?;
        tracing::debug!(purged, "expired cached results dropped");
        let approvals = Approvals::load(store.clone())?;
        Ok(Host {
            natives: NativeRegistry::default(),
            catalog,
            store,
            sandbox: Arc::new(sandbox),
            loaded: Loaded::new(config.max_loaded_components),
            call_ids: CallIds::default(),
            entry_writes: Mutex::new(()),
            changes: tokio::sync::broadcast::channel(256).0,
            generation: AtomicU64::new(0),
            policies: Mutex::default(),
            default_policy: Arc::new(config.default_policy),
            admission: Admission::default(),
            hooks: RwLock::default(),
            approvals,
            metrics: Metrics::default(),
            egress: Arc::new(config.egress),
            files_dir: config
                .files_dir
                .or(config.data_dir.map(|d| d.join("files"))),
            http_requests: Mutex::default(),
            js_runtime,
            js_sources: Mutex::default(),
        })
    }

    /// The largest component `install` accepts, in bytes.
    pub fn max_component_bytes(&self) -> usize {
        self.sandbox.max_component_bytes()
    }

    /// Where derived data (such as search vectors) is kept beside the catalog.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The embedding app's trusted tools.
    pub fn natives(&self) -> &NativeRegistry {
        &self.natives
    }

    /// Installs every tool a component offers for `tenant`. A tool whose name exists gets a
    /// new version, which answers calls from now on (calls already running finish on theirs).
    /// Nothing is stored unless every tool of the component is valid.
    pub async fn install(
        &self,
        tenant: &str,
        component: Vec<u8>,
    ) -> Result<Vec<ToolSpec>, InstallError> {
        if !is_valid_tenant(tenant) {
            return Err(InstallError::Tenant(tenant.chars().take(128).collect()));
        }
        let sha = sha256_hex(&component);
        let fingerprint = self.sandbox.fingerprint().to_owned();
        let stored = self.store.artifact(&sha, &fingerprint)?;
        let already_stored = stored.is_some();
        let (component, artifact) = match stored {
            Some(artifact) => (component, artifact),
            None => {
                let sandbox = self.sandbox.clone();
                tokio::task::spawn_blocking(move || {
                    let artifact = sandbox.compile(&component);
                    artifact.map(|artifact| (component, artifact))
                })
                .await
                .expect("compilation does not panic")?
            }
        };
        // SAFETY: the artifact was just compiled here, or came from the store, which returns
        // only artifacts of this fingerprint whose checksum matches.
        let prepared = unsafe { self.sandbox.load(&artifact) }?;
        let defs = self
            .sandbox
            .list_tools(&prepared, &Limits::default())
            .await
            .result
            .map_err(InstallError::ListTools)?;
        let specs = self.check_defs(tenant, defs)?;
        let _writing = self.lock_entries();
        // A stored artifact means its blob was stored with it: the same bytes need no rewrite.
        if !already_stored {
            self.store
                .put_component(&sha, &component, &fingerprint, &artifact)?;
        }
        self.loaded.insert(&sha, prepared);
        self.add_versions(tenant, SourceKind::Wasm, &specs, &sha)?;
        Ok(specs)
    }

    /// Installs a tool with no code that makes one HTTP request (see [`HttpToolDef`]). Like
    /// a component's tool, a name that exists gets a new version.
    pub fn install_http(&self, tenant: &str, def: HttpToolDef) -> Result<ToolSpec, InstallError> {
        if !is_valid_tenant(tenant) {
            return Err(InstallError::Tenant(tenant.chars().take(128).collect()));
        }
        let spec = def.validate()?;
        self.check_name(tenant, &spec, &[])?;
        let request = serde_json::to_vec(&def.request).expect("a request definition serializes");
        let sha = sha256_hex(&request);
        let _writing = self.lock_entries();
        self.store.put_blob(&sha, &request)?;
        self.add_versions(tenant, SourceKind::Http, std::slice::from_ref(&spec), &sha)?;
        Ok(spec)
    }

    /// Installs a stored-source JavaScript tool: an ES module that exports its `spec` and,
    /// as default, the handler `(args, ctx) => result`. It runs on the host's JS runtime, so
    /// it is callable at once: nothing is compiled. The module is evaluated once here, under
    /// the default limits, to read its spec; a syntax error names the line and column.
    pub async fn install_js(&self, tenant: &str, source: &str) -> Result<ToolSpec, InstallError> {
        if !is_valid_tenant(tenant) {
            return Err(InstallError::Tenant(tenant.chars().take(128).collect()));
        }
        if source.len() > MAX_JS_SOURCE_BYTES {
            return Err(InstallError::JsTooLarge { size: source.len() });
        }
        let runtime = self.js_runtime.clone().ok_or(InstallError::NoJsRuntime)?;
        let prepared = self
            .prepared(&runtime)
            .await
            .map_err(|message| InstallError::JsSource(format!("the runtime: {message}")))?;
        let described = self
            .sandbox
            .js_describe(&prepared, &Limits::default(), source)
            .await;
        let spec_json = match described.result {
            Ok(Ok(json)) => json,
            Ok(Err(message)) => return Err(InstallError::JsSource(message)),
            Err(fault) => return Err(InstallError::JsSource(format!("evaluating it {fault}"))),
        };
        let spec: ToolSpec = serde_json::from_str(&spec_json).map_err(|e| {
            InstallError::Spec(SpecError::new(
                "(js)",
                "spec",
                format!("not a tool spec: {e}"),
            ))
        })?;
        spec.validate()?;
        self.check_name(tenant, &spec, &[])?;
        let stored = JsSource {
            runtime,
            source: source.to_owned(),
        };
        let blob = serde_json::to_vec(&stored).expect("a JS source serializes");
        let sha = sha256_hex(&blob);
        let _writing = self.lock_entries();
        self.store.put_blob(&sha, &blob)?;
        self.add_versions(tenant, SourceKind::Js, std::slice::from_ref(&spec), &sha)?;
        Ok(spec)
    }

    /// Adds a version implemented by blob `sha` to each tool of `specs`, written together.
    /// The caller holds the entry lock and has stored the blob.
    fn add_versions(
        &self,
        tenant: &str,
        kind: SourceKind,
        specs: &[ToolSpec],
        sha: &str,
    ) -> Result<(), InstallError> {
        let installed_at_ms = now_ms();
        let mut entries = self.store.tool_entries_of(tenant)?;
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
            entry.push(kind, spec.clone(), sha.to_owned(), installed_at_ms);
            changed.push(entry);
        }
        self.store.put_tool_entries(&changed)?;
        for entry in &changed {
            self.catalog.insert(tenant_tool(entry)?);
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
        let twin = self
            .natives
            .case_twin(name)
            .or_else(|| self.catalog.case_twin(tenant, name))
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

    /// Tools an agent of `tenant` may see: natives, then the tenant's own. Private ones are left out.
    pub fn list(&self, tenant: &str) -> Vec<ToolInfo> {
        let natives = self.natives.all().into_iter().map(|t| native_info(&t));
        let wasm = self
            .catalog
            .tenant_tools(tenant)
            .into_iter()
            .map(|t| tenant_info(&t));
        natives
            .chain(wasm)
            .filter(|info| !info.spec.private)
            .collect()
    }

    /// The tools an agent of `tenant` sees (private ones left out), in an LLM API's shape.
    pub fn export(&self, tenant: &str, format: crate::export::Format) -> Vec<Value> {
        let listed = self.list(tenant);
        crate::export::tools(listed.iter().map(|t| &t.spec), format)
    }

    /// One tool as `tenant` sees it, private ones included (the host may call them).
    pub fn describe(&self, tenant: &str, name: &str) -> Option<ToolInfo> {
        match self.natives.get(name) {
            Some(native) => Some(native_info(&native)),
            None => self.catalog.get(tenant, name).map(|t| tenant_info(&t)),
        }
    }

    /// A tenant's tool with every kept version.
    pub fn versions(&self, tenant: &str, name: &str) -> Result<ToolEntry, ManageError> {
        self.store
            .tool_entries_of(tenant)?
            .into_iter()
            .find(|e| e.name == name)
            .ok_or_else(|| ManageError::NotFound(name.to_owned()))
    }

    /// Makes an earlier version answer calls: `to`, or the one before the current. Returns
    /// the version now current.
    pub fn rollback(&self, tenant: &str, name: &str, to: Option<u32>) -> Result<u32, ManageError> {
        let _writing = self.lock_entries();
        let mut entry = self.versions(tenant, name)?;
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
        entry.current = target;
        let tool = tenant_tool(&entry)?;
        self.store.put_tool_entries(std::slice::from_ref(&entry))?;
        self.catalog.insert(tool);
        self.changed(tenant);
        Ok(target)
    }

    /// Removes a tenant's tool and its versions. Calls already running finish; later ones get
    /// `not_found`.
    pub fn remove(&self, tenant: &str, name: &str) -> Result<bool, StoreError> {
        let _writing = self.lock_entries();
        if self.catalog.get(tenant, name).is_none() {
            return Ok(false);
        }
        self.store.remove_tool_entry(tenant, name)?;
        let removed = self.catalog.remove(tenant, name);
        self.changed(tenant);
        Ok(removed)
    }

    /// Sets a configuration value of `tenant`, readable by its tools that declare `key`.
    /// A secret is never shown again: not in listings, logs or error messages.
    pub fn set_config(
        &self,
        tenant: &str,
        key: &str,
        value: &str,
        secret: bool,
    ) -> Result<(), ManageError> {
        if !is_valid_config_key(key) {
            return Err(ManageError::ConfigKey(key.chars().take(129).collect()));
        }
        if value.len() > MAX_CONFIG_VALUE_BYTES {
            return Err(ManageError::ConfigValue(value.len()));
        }
        let value = ConfigValue {
            value: value.to_owned(),
            secret,
        };
        Ok(self.store.config_set(tenant, key, &value)?)
    }

    pub fn remove_config(&self, tenant: &str, key: &str) -> Result<bool, ManageError> {
        Ok(self.store.config_delete(tenant, key)?)
    }

    /// The tenant's configuration keys, each with its value unless it is a secret.
    pub fn config(&self, tenant: &str) -> Result<Vec<(String, Option<String>)>, ManageError> {
        let mut shown = Vec::new();
        for key in self.store.config_keys(tenant)? {
            let value = self.store.config_get(tenant, &key)?;
            shown.push((key, value.filter(|v| !v.secret).map(|v| v.value)));
        }
        Ok(shown)
    }

    /// Records a tenant (idempotent); its id must be valid.
    pub fn create_tenant(&self, tenant: &str) -> Result<bool, ManageError> {
        if !is_valid_tenant(tenant) {
            return Err(ManageError::Tenant(tenant.chars().take(128).collect()));
        }
        Ok(self.store.tenant_create(tenant, now_ms())?)
    }

    pub fn tenants(&self) -> Result<Vec<String>, ManageError> {
        Ok(self.store.tenants()?)
    }

    /// A new API key for an existing tenant. The returned secret is shown once: only its
    /// sha256 is stored.
    pub fn create_key(&self, tenant: &str) -> Result<NewKey, ManageError> {
        if !self.store.tenants()?.iter().any(|t| t == tenant) {
            return Err(ManageError::NoTenant(tenant.chars().take(128).collect()));
        }
        let mut random = [0u8; 20];
        getrandom::fill(&mut random).map_err(|e| ManageError::Random(e.to_string()))?;
        let id = crate::sandbox::hex(&random[..4]);
        let secret = format!("thk_{id}_{}", crate::sandbox::hex(&random[4..]));
        let record = KeyRecord {
            id,
            tenant: tenant.to_owned(),
            created_at_ms: now_ms(),
        };
        self.store
            .key_put(&sha256_hex(secret.as_bytes()), &record)?;
        Ok(NewKey { secret, record })
    }

    /// Keys of `tenant` (or all), without their secrets.
    pub fn keys(&self, tenant: Option<&str>) -> Result<Vec<KeyRecord>, ManageError> {
        let keys = self.store.keys()?;
        Ok(keys
            .into_iter()
            .filter(|k| tenant.is_none_or(|t| k.tenant == t))
            .collect())
    }

    pub fn revoke_key(&self, id: &str) -> Result<bool, ManageError> {
        Ok(self.store.key_revoke(id)?)
    }

    /// The tenant an API key belongs to, if it is a live key.
    pub fn authenticate(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .store
            .key_get(&sha256_hex(key.as_bytes()))?
            .map(|k| k.tenant))
    }

    /// Tenants whose visible tools change (install, rollback, remove), as they happen. A
    /// lagging receiver should treat the lag as a change of its tenant.
    pub fn subscribe_changes(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.changes.subscribe()
    }

    /// Changes whenever any tenant's visible tools may have changed (natives included).
    pub fn generation(&self) -> (u64, u64) {
        (
            self.generation.load(Ordering::Acquire),
            self.natives.generation(),
        )
    }

    fn changed(&self, tenant: &str) {
        self.generation.fetch_add(1, Ordering::Release);
        // No receivers is fine: nobody is listening.
        let _ = self.changes.send(tenant.to_owned());
    }

    fn lock_entries(&self) -> std::sync::MutexGuard<'_, ()> {
        self.entry_writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Linked components in memory now (bounded by `max_loaded_components`).
    pub fn loaded_components(&self) -> usize {
        self.loaded.len()
    }

    /// Calls `name` for `caller` with JSON `args`. Never panics: every failure is an outcome.
    pub async fn call(&self, caller: &Caller, name: &str, args: Value) -> CallOutcome {
        self.call_as(caller, name, args, None, Budget::TOP).await
    }

    /// Runs a call that waits for approval (see [`CallError::ApprovalRequired`]) and returns
    /// its outcome. It passes every other step again: policy, limits, hooks.
    pub async fn approve(&self, tenant: &str, call_id: &str) -> Result<CallOutcome, ApprovalError> {
        let pending = self.approvals.take(tenant, call_id)?;
        Ok(self
            .call_as(
                &pending.caller,
                &pending.tool,
                pending.args,
                Some(call_id),
                Budget {
                    approved: true,
                    ..Budget::TOP
                },
            )
            .await)
    }

    /// Drops a call that waits for approval; its outcome is `rejected` with `reason`.
    pub fn reject(
        &self,
        tenant: &str,
        call_id: &str,
        reason: &str,
    ) -> Result<CallOutcome, ApprovalError> {
        let pending = self.approvals.take(tenant, call_id)?;
        let mut outcome = CallOutcome::new(call_id.to_owned(), pending.tool);
        outcome.result = Err(CallError::Rejected {
            reason: truncate(reason, MAX_ERROR_CHARS),
        });
        self.record(tenant, None, &outcome);
        Ok(outcome)
    }

    /// The tenant's calls waiting for approval, longest waiting first.
    pub fn pending_approvals(&self, tenant: &str) -> Vec<PendingCall> {
        self.approvals.list(tenant)
    }

    /// Registers a hook that runs around every call of every tenant, in registration order.
    pub fn add_hook(&self, hook: Arc<dyn CallHook>) {
        self.hooks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(hook);
    }

    /// The tenant's policy, or the host's default if it has none of its own.
    pub fn policy(&self, tenant: &str) -> Arc<TenantPolicy> {
        let mut policies = self.policies.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(policy) = policies.get(tenant) {
            return policy.clone();
        }
        let policy = match self.store.policy(tenant) {
            Ok(Some(policy)) => Arc::new(policy),
            Ok(None) => self.default_policy.clone(),
            Err(error) => {
                // Fail closed: a tenant whose policy cannot be read can call nothing.
                tracing::error!(tenant, %error, "policy unreadable; denying every call");
                Arc::new(TenantPolicy {
                    deny: vec!["*".into()],
                    ..TenantPolicy::default()
                })
            }
        };
        policies.insert(tenant.to_owned(), policy.clone());
        policy
    }

    /// Stores the tenant's policy; it applies to the next call.
    pub fn set_policy(&self, tenant: &str, policy: TenantPolicy) -> Result<(), ManageError> {
        if !is_valid_tenant(tenant) {
            return Err(ManageError::Tenant(tenant.to_owned()));
        }
        policy.validate()?;
        self.store.put_policy(tenant, &policy)?;
        let mut policies = self.policies.lock().unwrap_or_else(|p| p.into_inner());
        policies.insert(tenant.to_owned(), Arc::new(policy));
        Ok(())
    }

    /// Counters for an operator (`/metrics`).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    async fn call_as(
        &self,
        caller: &Caller,
        name: &str,
        args: Value,
        call_id: Option<&str>,
        budget: Budget,
    ) -> CallOutcome {
        let started = Instant::now();
        let ctx = CallContext {
            tenant: caller.tenant.clone(),
            call_id: call_id.map_or_else(|| self.call_ids.next(), str::to_owned),
            tool: name.to_owned(),
            data: caller.data.clone(),
        };
        let resolved = match self.natives.get(name) {
            Some(native) => Some(Resolved::Native(native)),
            None => self.catalog.get(&caller.tenant, name).map(Resolved::Tenant),
        };
        let config_keys = resolved.as_ref().map_or(&[][..], |r| &r.spec().config[..]);
        let helpers = Helpers::for_call(self.store.clone(), &ctx.tenant, name, config_keys);
        let mut outcome = CallOutcome::new(ctx.call_id.clone(), ctx.tool.clone());
        if let Some(tool) = &resolved {
            self.admit_and_run(tool, args, &helpers, &ctx, budget, &mut outcome)
                .await;
        }
        outcome.log = helpers.snapshot();
        outcome.duration = started.elapsed();
        self.record(
            &ctx.tenant,
            resolved.as_ref().map(Resolved::version),
            &outcome,
        );
        outcome
    }

    /// One structured event and the metrics, for every outcome.
    fn record(&self, tenant: &str, version: Option<u32>, outcome: &CallOutcome) {
        self.metrics
            .record_call(outcome.code(), outcome.duration, outcome.retries);
        // Every field always present (0 when it does not apply), so queries need no cases.
        tracing::info!(
            tenant,
            tool = outcome.tool,
            version = version.unwrap_or(0),
            call_id = outcome.call_id,
            outcome = outcome.code(),
            ms = outcome.duration.as_secs_f64() * 1e3,
            fuel = outcome.fuel_used.unwrap_or(0),
            cache_hit = outcome.cache_hit,
            retries = outcome.retries,
            clipped = outcome.clipped.is_some(),
            "call"
        );
    }

    /// The preflight steps, in order: policy, rate and concurrency, arguments, hooks,
    /// approval; then the call itself, and the hooks that see its outcome.
    async fn admit_and_run(
        &self,
        tool: &Resolved,
        args: Value,
        helpers: &Helpers,
        ctx: &CallContext,
        budget: Budget,
        outcome: &mut CallOutcome,
    ) {
        let spec = tool.spec();
        let policy = self.policy(&ctx.tenant);
        let needs_approval = match policy.decide(&spec.name, spec.needs_approval) {
            Decision::Denied(reason) => {
                outcome.result = Err(CallError::Denied { reason });
                return;
            }
            Decision::NeedsApproval => !budget.approved,
            Decision::Run => false,
        };
        let _permit = match self.admission.admit(&ctx.tenant, &policy) {
            Ok(permit) => permit,
            Err(refused) => {
                outcome.result = Err(CallError::RateLimited {
                    limit: refused.limit,
                    message: refused.message,
                    retry_after_ms: refused.retry_after_ms,
                });
                return;
            }
        };
        if let Err(errors) = tool.validator().validate(&args) {
            outcome.result = Err(CallError::InvalidArgs { errors });
            return;
        }
        let hooks = self.hooks.read().unwrap_or_else(|p| p.into_inner()).clone();
        let hook_call = HookCall {
            tenant: &ctx.tenant,
            tool: &spec.name,
            version: tool.version(),
            call_id: &ctx.call_id,
            args: &args,
            data: &ctx.data,
        };
        let refusal = hooks.iter().find_map(|hook| hook.before(&hook_call).err());
        if let Some(reason) = refusal {
            outcome.result = Err(CallError::Denied {
                reason: truncate(&reason, MAX_ERROR_CHARS),
            });
        } else if needs_approval {
            let caller = Caller {
                tenant: ctx.tenant.clone(),
                data: ctx.data.clone(),
            };
            outcome.result =
                match self
                    .approvals
                    .hold(&ctx.call_id, &caller, &spec.name, args.clone())
                {
                    Ok(()) => Err(CallError::ApprovalRequired {
                        call_id: ctx.call_id.clone(),
                    }),
                    Err(ApprovalError::Store(error)) => Err(CallError::Internal {
                        message: format!("could not hold the call for approval: {error}"),
                    }),
                    Err(error) => Err(CallError::RateLimited {
                        limit: "pending approvals",
                        message: error.to_string(),
                        retry_after_ms: None,
                    }),
                };
        } else {
            self.run(tool, args.clone(), helpers, ctx, budget, outcome)
                .await;
        }
        for hook in &hooks {
            hook.after(&hook_call, outcome);
        }
    }

    /// Cache, execute (again after a timeout, for an idempotent tool), clip, cache.
    async fn run(
        &self,
        tool: &Resolved,
        args: Value,
        helpers: &Helpers,
        ctx: &CallContext,
        budget: Budget,
        outcome: &mut CallOutcome,
    ) {
        let spec = tool.spec();
        let cache_key = spec
            .cache
            .as_ref()
            .map(|policy| cached_key(policy, &ctx.tenant, tool, &args));
        if let Some(key) = &cache_key {
            match self.store.cache_get(key, now_ms()) {
                Ok(Some(value)) => {
                    outcome.result = Ok(value);
                    outcome.cache_hit = true;
                    return;
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "result cache unreadable; running the tool"),
            }
        }
        let retries = if spec.idempotent {
            spec.retry_count_on_stall
        } else {
            0
        };
        let mut result = Err(CallError::Timeout { limit_ms: 0 });
        for attempt in 0..=retries {
            outcome.retries = attempt;
            // Narrowed again on each attempt: a nested call stays within its caller's time.
            let limits = budget.narrow(&spec.limits);
            result = match tool {
                Resolved::Native(native) => {
                    run_native(native, &limits, args.clone(), helpers.clone(), ctx.clone()).await
                }
                Resolved::Tenant(tool) if tool.version.kind == SourceKind::Http => {
                    self.run_http(tool, &limits, &args, helpers).await
                }
                Resolved::Tenant(wasm) => {
                    let run = self.run_wasm(wasm, &limits, args.clone(), helpers, ctx, budget);
                    let (result, fuel) = run.await;
                    if let Some(fuel) = fuel {
                        *outcome.fuel_used.get_or_insert(0) += fuel;
                    }
                    result
                }
            };
            if !matches!(result, Err(CallError::Timeout { .. })) {
                break;
            }
        }
        outcome.result = match result {
            Ok(value) => {
                let (value, clipped) = clip(value, spec.limits.max_result_chars as usize);
                outcome.clipped = clipped;
                if let (Some(key), Some(policy)) = (&cache_key, &spec.cache)
                    && let Err(error) = self.store.cache_put(key, now_ms() + policy.ttl_ms, &value)
                {
                    tracing::warn!(%error, "result not cached");
                }
                Ok(value)
            }
            Err(error) => Err(redact_error(error, helpers)),
        };
    }

    async fn run_http(
        &self,
        tool: &TenantTool,
        limits: &Limits,
        args: &Value,
        helpers: &Helpers,
    ) -> Result<Value, CallError> {
        let request = self
            .parsed_blob(
                &self.http_requests,
                &tool.version.component,
                "request definition",
            )
            .map_err(|message| CallError::Internal { message })?;
        let deadline = tokio::time::Instant::now() + limits.timeout();
        let call = crate::http_tool::call(&request, args, helpers, &self.egress, deadline);
        match tokio::time::timeout_at(deadline, call).await {
            Ok(result) => result.map_err(CallError::Tool),
            Err(_elapsed) => Err(CallError::Timeout {
                limit_ms: limits.timeout_ms,
            }),
        }
    }

    /// The directory that holds `tenant`'s granted directories (`None` for an in-memory host).
    pub fn tenant_files(&self, tenant: &str) -> Option<PathBuf> {
        // Tenant ids may hold any printable character: never a path component as is.
        let id = &sha256_hex(tenant.as_bytes())[..32];
        self.files_dir.as_ref().map(|dir| dir.join(id))
    }

    /// What the tenant's policy grants `tool`: HTTP destinations, and directories under the
    /// tenant's files root (read-only for this call if the tenant is at its files quota).
    async fn permissions(
        &self,
        tenant: &str,
        tool: &str,
        helpers: &Helpers,
    ) -> Result<Permissions, String> {
        let policy = self.policy(tenant);
        let grants = policy.grants_for(tool);
        let mut permissions = Permissions {
            network: grants.network,
            egress: self.egress.clone(),
            dirs: Vec::new(),
            tools: None,
        };
        if grants.filesystem.is_empty() {
            return Ok(permissions);
        }
        let root = self
            .tenant_files(tenant)
            .ok_or("filesystem grants need a data directory (HostConfig::data_dir)")?;
        let quota = policy
            .files_quota_bytes
            .unwrap_or(DEFAULT_FILES_QUOTA_BYTES);
        let dirs = grants.filesystem;
        let (dirs, used) = tokio::task::spawn_blocking(move || {
            let mut preopens = Vec::with_capacity(dirs.len());
            for dir in dirs {
                let host = root.join(&dir.dir);
                std::fs::create_dir_all(&host)
                    .map_err(|e| format!("cannot create the granted directory {}: {e}", dir.dir))?;
                preopens.push((host, dir));
            }
            Ok::<_, String>((preopens, bytes_under(&root)))
        })
        .await
        .map_err(|e| e.to_string())??;
        let full = used >= quota;
        if full {
            helpers.log(
                Level::Warn,
                &format!(
                    "the tenant's files hold {used} bytes, at or over its quota of {quota} (files_quota_bytes): granted directories are read-only for this call"
                ),
            );
        }
        permissions.dirs = dirs
            .into_iter()
            .map(|(host, dir)| Preopen {
                host,
                guest: dir.guest,
                write: dir.write && !full,
            })
            .collect();
        Ok(permissions)
    }

    /// A stored JSON blob (an HTTP request definition, a JS source), parsed once and kept:
    /// blobs are content-addressed, so a parsed one never goes stale.
    fn parsed_blob<T: DeserializeOwned>(
        &self,
        cache: &Mutex<HashMap<String, Arc<T>>>,
        sha: &str,
        what: &str,
    ) -> Result<Arc<T>, String> {
        let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(parsed) = cache.get(sha) {
            return Ok(parsed.clone());
        }
        let bytes = self
            .store
            .blob(sha)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{what} {sha} is missing from the store"))?;
        let parsed: Arc<T> = Arc::new(
            serde_json::from_slice(&bytes)
                .map_err(|e| format!("{what} {sha} is unreadable: {e}"))?,
        );
        cache.insert(sha.to_owned(), parsed.clone());
        Ok(parsed)
    }

    async fn run_wasm(
        &self,
        tool: &TenantTool,
        limits: &Limits,
        args: Value,
        helpers: &Helpers,
        ctx: &CallContext,
        budget: Budget,
    ) -> (Result<Value, CallError>, Option<u64>) {
        // A JS tool runs its stored source on the runtime it was installed on.
        let js = match tool.version.kind {
            SourceKind::Js => {
                match self.parsed_blob(&self.js_sources, &tool.version.component, "JS source") {
                    Ok(js) => Some(js),
                    Err(message) => return (Err(CallError::Internal { message }), None),
                }
            }
            _ => None,
        };
        let component = js
            .as_ref()
            .map_or(&tool.version.component, |js| &js.runtime);
        let prepared = match self.prepared(component).await {
            Ok(prepared) => prepared,
            Err(message) => return (Err(CallError::Internal { message }), None),
        };
        let args = args.to_string();
        let entry = match &js {
            Some(js) => Entry::Js {
                source: &js.source,
                args: &args,
            },
            None => Entry::Tool { args: &args },
        };
        let mut permissions = match self.permissions(&ctx.tenant, &ctx.tool, helpers).await {
            Ok(permissions) => permissions,
            Err(message) => return (Err(CallError::Internal { message }), None),
        };
        let (tools, mut nested_calls) = tokio::sync::mpsc::channel(1);
        permissions.tools = Some(tools);
        let _live = self.metrics.instance();
        let run = self
            .sandbox
            .call(&prepared, limits, helpers.clone(), &permissions, entry, ctx);
        tokio::pin!(run);
        // The guest waits in `call-tool` while its nested call runs here.
        let run = loop {
            tokio::select! {
                run = &mut run => break run,
                Some(nested) = nested_calls.recv() => {
                    let reply = self.call_nested(ctx, budget, &nested).await;
                    let _ = nested.reply.send(reply);
                }
            }
        };
        let result = match run.result {
            Ok(Ok(text)) => serde_json::from_str(&text).map_err(|e| CallError::InvalidOutput {
                reason: format!("not JSON ({e}): {}", truncate(&text, 80)),
            }),
            Ok(Err(GuestToolError::InvalidArgs(m))) => {
                Err(ToolError::InvalidArgs(truncate(&m, MAX_ERROR_CHARS)).into())
            }
            Ok(Err(GuestToolError::Failed(m))) => {
                Err(ToolError::Failed(truncate(&m, MAX_ERROR_CHARS)).into())
            }
            Err(fault) => Err(fault_to_error(fault, limits, helpers)),
        };
        (result, Some(run.fuel_used))
    }

    /// A guest's `call-tool`: the whole pipeline again, for the same tenant, one level deeper,
    /// within what the caller has left.
    fn call_nested<'a>(
        &'a self,
        parent: &'a CallContext,
        budget: Budget,
        nested: &'a NestedCall,
    ) -> Pin<Box<dyn Future<Output = NestedReply> + Send + 'a>> {
        Box::pin(async move {
            let refuse = |message: String| NestedReply {
                result: Err(message),
                fuel_used: 0,
            };
            if budget.depth >= MAX_NESTING_DEPTH {
                return refuse(format!(
                    "denied: calls nest at most {MAX_NESTING_DEPTH} deep"
                ));
            }
            let Ok(args) = serde_json::from_str::<Value>(&nested.args) else {
                return refuse("invalid_args: the arguments are not JSON".into());
            };
            let caller = Caller {
                tenant: parent.tenant.clone(),
                data: parent.data.clone(),
            };
            let inner = Budget {
                depth: budget.depth + 1,
                deadline: Some(nested.deadline),
                fuel: Some(nested.fuel),
                approved: false,
            };
            let outcome = self.call_as(&caller, &nested.tool, args, None, inner).await;
            NestedReply {
                result: match outcome.result {
                    Ok(value) => Ok(value.to_string()),
                    Err(error) => Err(format!("{}: {error}", error.code())),
                },
                fuel_used: outcome.fuel_used.unwrap_or(0),
            }
        })
    }

    /// The linked component for `sha`: from memory, else the stored artifact, else compiled
    /// from the stored blob (and the artifact stored for next time).
    async fn prepared(&self, sha: &str) -> Result<Prepared, String> {
        if let Some(prepared) = self.loaded.get(sha) {
            self.metrics.component_loaded(ComponentSource::Memory);
            return Ok(prepared);
        }
        let fingerprint = self.sandbox.fingerprint().to_owned();
        let artifact = match self
            .store
            .artifact(sha, &fingerprint)
            .map_err(|e| e.to_string())?
        {
            Some(artifact) => {
                self.metrics.component_loaded(ComponentSource::Artifact);
                artifact
            }
            None => {
                self.metrics.component_loaded(ComponentSource::Compiled);
                let blob = self
                    .store
                    .blob(sha)
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("component {sha} is missing from the store"))?;
                let sandbox = self.sandbox.clone();
                let artifact = tokio::task::spawn_blocking(move || sandbox.compile(&blob))
                    .await
                    .expect("compilation does not panic")
                    .map_err(|e| e.to_string())?;
                self.store
                    .put_artifact(sha, &fingerprint, &artifact)
                    .map_err(|e| e.to_string())?;
                artifact
            }
        };
        // SAFETY: as in `install`: compiled here, or checksummed by the store.
        let prepared = unsafe { self.sandbox.load(&artifact) }.map_err(|e| e.to_string())?;
        self.loaded.insert(sha, prepared.clone());
        Ok(prepared)
    }
}

fn tenant_tool(entry: &ToolEntry) -> Result<TenantTool, SpecError> {
    let version = entry.current().clone();
    let validator = version.spec.validate()?;
    Ok(TenantTool {
        tenant: entry.tenant.clone(),
        version,
        validator,
    })
}

fn cached_key(policy: &CachePolicy, tenant: &str, tool: &Resolved, args: &Value) -> [u8; 32] {
    // The spec was validated, so its key path parses.
    let selected = KeyPath::parse(&policy.key_path).map_or(&Value::Null, |path| path.select(args));
    cache::key(tenant, &tool.spec().name, tool.version(), selected)
}

async fn run_native(
    tool: &NativeTool,
    limits: &Limits,
    args: Value,
    helpers: Helpers,
    ctx: CallContext,
) -> Result<Value, CallError> {
    let limit = limits.timeout();
    // Its own task, so that a panic in the handler stays in that task.
    let mut task = tokio::spawn((tool.handler)(args, helpers, ctx));
    match tokio::time::timeout(limit, &mut task).await {
        Err(_elapsed) => {
            task.abort();
            Err(CallError::Timeout {
                limit_ms: limits.timeout_ms,
            })
        }
        Ok(Ok(result)) => result.map_err(CallError::Tool),
        Ok(Err(join)) => Err(CallError::Trap {
            message: match join.try_into_panic() {
                Ok(payload) => panic_message(payload.as_ref()),
                Err(cancelled) => cancelled.to_string(),
            },
        }),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    format!("native tool panicked: {text}")
}

fn fault_to_error(fault: Fault, limits: &Limits, helpers: &Helpers) -> CallError {
    match fault {
        Fault::Timeout => CallError::Timeout {
            limit_ms: limits.timeout_ms,
        },
        Fault::OutOfFuel => CallError::OutOfFuel { limit: limits.fuel },
        Fault::MemoryLimit => CallError::MemoryLimit {
            limit_bytes: limits.memory_bytes,
        },
        Fault::Trap(trap) => {
            let message = match helpers.snapshot().guest_panic() {
                Some(panic) => format!(
                    "{trap}; the guest panicked: {}",
                    truncate(panic, MAX_ERROR_CHARS)
                ),
                None => trap,
            };
            CallError::Trap { message }
        }
        Fault::Host(message) => CallError::Internal { message },
    }
}

/// A tool's own words may quote a secret it read: never pass one on.
fn redact_error(error: CallError, helpers: &Helpers) -> CallError {
    match error {
        CallError::Tool(ToolError::Failed(m)) => ToolError::Failed(helpers.redact(&m)).into(),
        CallError::Tool(ToolError::InvalidArgs(m)) => {
            ToolError::InvalidArgs(helpers.redact(&m)).into()
        }
        CallError::Trap { message } => CallError::Trap {
            message: helpers.redact(&message),
        },
        CallError::InvalidOutput { reason } => CallError::InvalidOutput {
            reason: helpers.redact(&reason),
        },
        other => other,
    }
}

fn spec_from_guest(def: GuestToolDef) -> Result<ToolSpec, SpecError> {
    let parameters = serde_json::from_str(&def.parameters)
        .map_err(|e| SpecError::new(&def.name, "parameters", format!("not JSON: {e}")))?;
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
    })
}

fn native_info(tool: &NativeTool) -> ToolInfo {
    ToolInfo {
        spec: tool.spec.clone(),
        source: Source::Native,
    }
}

fn tenant_info(tool: &TenantTool) -> ToolInfo {
    ToolInfo {
        spec: tool.spec().clone(),
        source: match tool.version.kind {
            SourceKind::Wasm => Source::Wasm {
                component: tool.version.component.clone(),
                version: tool.version.version,
                installed_at_ms: tool.version.installed_at_ms,
            },
            SourceKind::Http => Source::Http {
                definition: tool.version.component.clone(),
                version: tool.version.version,
                installed_at_ms: tool.version.installed_at_ms,
            },
            SourceKind::Js => Source::Js {
                source: tool.version.component.clone(),
                version: tool.version.version,
                installed_at_ms: tool.version.installed_at_ms,
            },
        },
    }
}

/// Bytes of the regular files under `root`, not following symlinks.
fn bytes_under(root: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(meta) if meta.is_dir() => pending.push(entry.path()),
                Ok(meta) if meta.is_file() => total += meta.len(),
                _ => {}
            }
        }
    }
    total
}

fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Unique call ids: a random per-process prefix and a counter.
struct CallIds {
    prefix: u64,
    next: AtomicU64,
}

impl Default for CallIds {
    fn default() -> Self {
        CallIds {
            prefix: RandomState::new().hash_one(now_ms()),
            next: AtomicU64::new(1),
        }
    }
}

impl CallIds {
    fn next(&self) -> String {
        format!(
            "{:016x}-{:08x}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }
}
