//! The host: one call from name and JSON to a clipped, typed outcome.
//!
//! resolve (native first, then the caller's tenant) -> validate args -> execute (fresh
//! instance, or the native handler) under the tool's limits -> check and clip the result.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value;

use crate::call::{CallContext, CallError, CallOutcome, Caller, ToolError};
use crate::clip::clip;
use crate::helpers::Helpers;
use crate::registry::{Catalog, NativeRegistry, NativeTool, WasmTool, is_valid_tenant};
use crate::sandbox::{
    Fault, GuestToolDef, GuestToolError, LoadError, Prepared, Sandbox, SandboxConfig,
};
use crate::spec::{Limits, SpecError, ToolSpec};
use crate::store::{Db, StoreError, ToolRecord, sha256_hex};

/// A component may offer at most this many tools.
pub const MAX_TOOLS_PER_COMPONENT: usize = 256;
/// A tool's own error message is cut to this many characters.
const MAX_ERROR_CHARS: usize = 4096;

#[derive(Debug, Clone, Default)]
pub struct HostConfig {
    /// Where installed tools persist. `None` keeps everything in memory.
    pub data_dir: Option<PathBuf>,
    pub sandbox: SandboxConfig,
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
    #[error("tool `{0}`: the name belongs to a native tool of this host")]
    NativeName(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where a tool's code comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    Native,
    Wasm {
        component: String,
        installed_at_ms: u64,
    },
}

/// A tool as listed: its spec and where it comes from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolInfo {
    pub spec: ToolSpec,
    pub source: Source,
}

pub struct Host {
    natives: NativeRegistry,
    catalog: Catalog,
    db: Db,
    sandbox: Arc<Sandbox>,
    /// Linked components by sha256, so a call only instantiates.
    prepared: Mutex<HashMap<String, Prepared>>,
    call_ids: CallIds,
}

impl Host {
    /// Opens the store and loads every tenant's catalog. Components are compiled or loaded
    /// lazily, on first call.
    pub fn open(config: HostConfig) -> Result<Self, OpenError> {
        let db = match &config.data_dir {
            Some(dir) => Db::open(dir)?,
            None => Db::temporary()?,
        };
        let sandbox =
            Sandbox::new(config.sandbox).map_err(|e| OpenError::Engine(format!("{e:#}")))?;
        let catalog = Catalog::default();
        for record in db.tools()? {
            match record.spec.validate() {
                Ok(validator) => catalog.insert(WasmTool { record, validator }),
                // Rules can tighten between versions: skip, loudly, rather than refuse to start.
                Err(error) => {
                    tracing::error!(tenant = record.tenant, %error, "stored tool no longer valid; not loaded")
                }
            }
        }
        Ok(Host {
            natives: NativeRegistry::default(),
            catalog,
            db,
            sandbox: Arc::new(sandbox),
            prepared: Mutex::default(),
            call_ids: CallIds::default(),
        })
    }

    /// The embedding app's trusted tools.
    pub fn natives(&self) -> &NativeRegistry {
        &self.natives
    }

    /// Installs every tool a component offers for `tenant`, replacing tools of the same names.
    /// Nothing is stored unless every tool's spec is valid.
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
        let (component, artifact) = match self.db.artifact(&sha, &fingerprint)? {
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
        let tools = self.check_defs(tenant, &sha, defs)?;

        self.db
            .put_component(&sha, &component, &fingerprint, &artifact)?;
        let records: Vec<ToolRecord> = tools.iter().map(|t| t.record.clone()).collect();
        self.db.put_tools(&records)?;
        self.lock_prepared().insert(sha, prepared);
        let specs = records.into_iter().map(|r| r.spec).collect();
        tools.into_iter().for_each(|tool| self.catalog.insert(tool));
        Ok(specs)
    }

    fn check_defs(
        &self,
        tenant: &str,
        sha: &str,
        defs: Vec<GuestToolDef>,
    ) -> Result<Vec<WasmTool>, InstallError> {
        match defs.len() {
            0 => return Err(InstallError::NoTools),
            count if count > MAX_TOOLS_PER_COMPONENT => {
                return Err(InstallError::TooManyTools { count });
            }
            _ => {}
        }
        let installed_at_ms = now_ms();
        let mut tools: Vec<WasmTool> = Vec::with_capacity(defs.len());
        for def in defs {
            let spec = spec_from_guest(def)?;
            if self.natives.get(&spec.name).is_some() {
                return Err(InstallError::NativeName(spec.name));
            }
            if tools.iter().any(|t| t.record.spec.name == spec.name) {
                return Err(
                    SpecError::new(&spec.name, "name", "appears twice in this component").into(),
                );
            }
            let validator = spec.validate()?;
            let record = ToolRecord {
                tenant: tenant.to_owned(),
                spec,
                component: sha.to_owned(),
                installed_at_ms,
            };
            tools.push(WasmTool { record, validator });
        }
        Ok(tools)
    }

    /// Tools an agent of `tenant` may see: natives, then the tenant's own. Private ones are left out.
    pub fn list(&self, tenant: &str) -> Vec<ToolInfo> {
        let natives = self.natives.all().into_iter().map(|t| native_info(&t));
        let wasm = self
            .catalog
            .tenant_tools(tenant)
            .into_iter()
            .map(|t| wasm_info(&t));
        natives
            .chain(wasm)
            .filter(|info| !info.spec.private)
            .collect()
    }

    /// One tool as `tenant` sees it, private ones included (the host may call them).
    pub fn describe(&self, tenant: &str, name: &str) -> Option<ToolInfo> {
        match self.natives.get(name) {
            Some(native) => Some(native_info(&native)),
            None => self.catalog.get(tenant, name).map(|t| wasm_info(&t)),
        }
    }

    /// Removes a tenant's tool. Calls already running finish; later ones get `not_found`.
    pub fn remove(&self, tenant: &str, name: &str) -> Result<bool, StoreError> {
        if self.catalog.get(tenant, name).is_none() {
            return Ok(false);
        }
        self.db.remove_tool(tenant, name)?;
        Ok(self.catalog.remove(tenant, name))
    }

    /// Calls `name` for `caller` with JSON `args`. Never panics: every failure is an outcome.
    pub async fn call(&self, caller: &Caller, name: &str, args: Value) -> CallOutcome {
        let started = Instant::now();
        let ctx = CallContext {
            tenant: caller.tenant.clone(),
            call_id: self.call_ids.next(),
            tool: name.to_owned(),
            data: caller.data.clone(),
        };
        let helpers = Helpers::default();
        let (result, limits, fuel_used) = match self.natives.get(name) {
            Some(native) => {
                let result = run_native(&native, args, helpers.clone(), ctx.clone()).await;
                (result, native.spec.limits, None)
            }
            None => match self.catalog.get(&caller.tenant, name) {
                Some(tool) => {
                    let (result, fuel) = self.run_wasm(&tool, args, helpers.clone(), &ctx).await;
                    (result, tool.record.spec.limits, fuel)
                }
                None => (
                    Err(CallError::NotFound {
                        name: name.to_owned(),
                    }),
                    Limits::default(),
                    None,
                ),
            },
        };
        let (result, clipped) = match result {
            Ok(value) => {
                let (value, clipped) = clip(value, limits.max_result_chars as usize);
                (Ok(value), clipped)
            }
            Err(error) => (Err(error), None),
        };
        let outcome = CallOutcome {
            call_id: ctx.call_id,
            tool: ctx.tool,
            result,
            clipped,
            log: helpers.snapshot(),
            duration: started.elapsed(),
            fuel_used,
        };
        tracing::info!(
            tenant = ctx.tenant,
            tool = outcome.tool,
            call_id = outcome.call_id,
            outcome = outcome.code(),
            ms = outcome.duration.as_secs_f64() * 1e3,
            fuel = outcome.fuel_used,
            clipped = outcome.clipped.is_some(),
            "call"
        );
        outcome
    }

    async fn run_wasm(
        &self,
        tool: &WasmTool,
        args: Value,
        helpers: Helpers,
        ctx: &CallContext,
    ) -> (Result<Value, CallError>, Option<u64>) {
        if let Err(errors) = tool.validator.validate(&args) {
            return (Err(CallError::InvalidArgs { errors }), None);
        }
        let prepared = match self.prepared_for(&tool.record.component).await {
            Ok(prepared) => prepared,
            Err(message) => return (Err(CallError::Internal { message }), None),
        };
        let limits = &tool.record.spec.limits;
        let run = self
            .sandbox
            .call(&prepared, limits, helpers.clone(), &args.to_string(), ctx)
            .await;
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
            Err(fault) => Err(fault_to_error(fault, limits, &helpers)),
        };
        (result, Some(run.fuel_used))
    }

    /// The linked component for `sha`: from memory, else the stored artifact, else compiled
    /// from the stored blob (and the artifact stored for next time).
    async fn prepared_for(&self, sha: &str) -> Result<Prepared, String> {
        if let Some(prepared) = self.lock_prepared().get(sha) {
            return Ok(prepared.clone());
        }
        let fingerprint = self.sandbox.fingerprint().to_owned();
        let artifact = match self
            .db
            .artifact(sha, &fingerprint)
            .map_err(|e| e.to_string())?
        {
            Some(artifact) => artifact,
            None => {
                let blob = self
                    .db
                    .blob(sha)
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("component {sha} is missing from the store"))?;
                let sandbox = self.sandbox.clone();
                let artifact = tokio::task::spawn_blocking(move || sandbox.compile(&blob))
                    .await
                    .expect("compilation does not panic")
                    .map_err(|e| e.to_string())?;
                self.db
                    .put_artifact(sha, &fingerprint, &artifact)
                    .map_err(|e| e.to_string())?;
                artifact
            }
        };
        // SAFETY: as in `install`: compiled here, or checksummed by the store.
        let prepared = unsafe { self.sandbox.load(&artifact) }.map_err(|e| e.to_string())?;
        self.lock_prepared()
            .insert(sha.to_owned(), prepared.clone());
        Ok(prepared)
    }

    fn lock_prepared(&self) -> std::sync::MutexGuard<'_, HashMap<String, Prepared>> {
        self.prepared.lock().unwrap_or_else(|p| p.into_inner())
    }
}

async fn run_native(
    tool: &NativeTool,
    args: Value,
    helpers: Helpers,
    ctx: CallContext,
) -> Result<Value, CallError> {
    if let Err(errors) = tool.validator.validate(&args) {
        return Err(CallError::InvalidArgs { errors });
    }
    let limit = tool.spec.limits.timeout();
    // Its own task, so that a panic in the handler stays in that task.
    let mut task = tokio::spawn((tool.handler)(args, helpers, ctx));
    match tokio::time::timeout(limit, &mut task).await {
        Err(_elapsed) => {
            task.abort();
            Err(CallError::Timeout {
                limit_ms: tool.spec.limits.timeout_ms,
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
    })
}

fn native_info(tool: &NativeTool) -> ToolInfo {
    ToolInfo {
        spec: tool.spec.clone(),
        source: Source::Native,
    }
}

fn wasm_info(tool: &WasmTool) -> ToolInfo {
    ToolInfo {
        spec: tool.record.spec.clone(),
        source: Source::Wasm {
            component: tool.record.component.clone(),
            installed_at_ms: tool.record.installed_at_ms,
        },
    }
}

fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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
