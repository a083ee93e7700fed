//! Running guest components: the wasmtime engine, its pool and epoch ticker, and one fresh,
//! limited instance per call.
//!
//! This module knows components, limits and a call's context; it knows nothing of tenants,
//! catalogs or storage.

use std::hash::Hasher;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::{Arc, mpsc};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter, Store,
    Trap, UpdateDeadline,
};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};
#[cfg(feature = "wasi-http")]
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::egress::EgressConfig;
use crate::files::{self, FilesBudget, FilesQuota, OpenFiles};
use crate::helpers::{Helpers, Stream};
#[cfg(feature = "wasi-http")]
use crate::outbound::Outbound;
use crate::turns::{GuestTurn, Turns};
use toolhost_spec::call::{CallContext, Level};
use toolhost_spec::digest::hex;
use toolhost_spec::policy::NetworkRule;
use toolhost_spec::spec::{Limits, MEMORY_BYTES};

pub(crate) mod v0_1;

/// The current `toolhost:plugin`, which the SDKs build against.
pub(crate) mod bindings {
    #![allow(missing_docs)]
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "toolhost:plugin/plugin@0.2.0",
        // Storage is a database round trip away, or a blocking file: the guest waits, its
        // thread does not.
        imports: {
            "toolhost:plugin/helpers.kv-get": async,
            "toolhost:plugin/helpers.kv-set": async,
            "toolhost:plugin/helpers.kv-delete": async,
            "toolhost:plugin/helpers.config-get": async,
        },
        exports: { default: async },
    });
}

/// The host's JavaScript runtime: the same imports, other exports.
mod js_bindings {
    #![allow(missing_docs)]
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "toolhost:plugin/js-runtime@0.2.0",
        exports: { default: async },
        with: {
            "toolhost:plugin/types": super::bindings::toolhost::plugin::types,
            "toolhost:plugin/helpers": super::bindings::toolhost::plugin::helpers,
            "toolhost:plugin/tools": super::bindings::toolhost::plugin::tools,
        },
    });
}

pub use bindings::toolhost::plugin::types::{ToolDef as GuestToolDef, ToolError as GuestToolError};
pub(crate) use js_bindings::{JsRuntime, JsRuntimePre};

/// The most memory one call's tables may hold, in elements.
const MAX_TABLE_ELEMENTS: usize = 100_000;
/// The most WASI handles (streams, pollables, descriptors, HTTP fields, ...) one call may
/// hold at once: each costs the host memory outside the guest's cap, and wasmtime's default
/// allows a million.
pub const MAX_HANDLES: usize = 16_384;
/// Core instances, memories and tables one component may use, for sizing the pool: a Rust
/// wasip2 component uses a handful; a componentize-js one about a dozen core instances.
const CORE_INSTANCES_PER_COMPONENT: u32 = 32;
const MEMORIES_PER_COMPONENT: u32 = 2;
const TABLES_PER_COMPONENT: u32 = 32;

/// Engine-wide settings, chosen by the operator.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Instances alive at once; more calls wait for a slot. Sizes the pooling allocator.
    pub max_instances: u32,
    /// The memory limits of all live instances together, in bytes: a call whose
    /// `memory_bytes` does not fit waits (within its timeout) instead of the host running out.
    pub memory_budget_bytes: u64,
    /// The part of `memory_budget_bytes` one tenant's live instances may hold together. Its
    /// calls nest (a caller's instance lives while its callees run), so its share of the
    /// host's call trees (`HostConfig::tenant_share`) does not bound it: eight trees five
    /// deep at the 512 MiB cap would hold 20 GiB.
    pub memory_budget_per_tenant_bytes: u64,
    /// How often the epoch advances: the granularity of timeouts and of guest yields.
    pub epoch_tick: Duration,
    /// Largest component accepted, in bytes.
    pub max_component_bytes: usize,
    /// Guests that run past their first epoch tick at once: one per core. They take turns
    /// round the tenants that wait (see [`crate::turns`]).
    pub cpu_turns: usize,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            max_instances: 64,
            // A third of this kind of machine (24 GiB): 16 calls at the 512 MiB cap.
            memory_budget_bytes: 8 << 30,
            // A quarter: four tenants at the most cannot take it all.
            memory_budget_per_tenant_bytes: 2 << 30,
            epoch_tick: Duration::from_millis(5),
            max_component_bytes: 64 << 20,
            cpu_turns: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// Why a component could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// Over `SandboxConfig::max_component_bytes`.
    #[error("the component is {size} bytes; the limit is {limit}")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Not a WebAssembly binary at all.
    #[error("not WebAssembly: the bytes do not start with the `\\0asm` header")]
    NotWasm,
    #[error(
        "this is a core WebAssembly module, not a component: build for `wasm32-wasip2` \
         (or wrap it with `wasm-tools component new`)"
    )]
    /// A core module: toolhost runs components only.
    CoreModule,
    /// Cranelift refused it (invalid Wasm, or a feature the engine does not enable).
    #[error("the component does not compile: {0}")]
    Compile(String),
    /// An import this host does not provide, or exports that do not match the WIT world.
    #[error("the component does not fit toolhost:plugin@0.2.0 (nor 0.1.0): {0}")]
    Link(String),
}

/// How a guest run ended other than by returning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// It ran past its deadline (the epoch interrupt).
    Timeout,
    /// It burned its fuel.
    OutOfFuel,
    /// It tried to grow its memory past its cap.
    MemoryLimit,
    /// It trapped; the guest's panic message where it left one.
    Trap(String),
    /// The sandbox itself failed (for example, instantiation failed for a host reason).
    Host(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Timeout => f.write_str("timed out"),
            Fault::OutOfFuel => f.write_str("ran out of fuel"),
            Fault::MemoryLimit => f.write_str("exceeded its memory limit"),
            Fault::Trap(message) => write!(f, "trapped: {message}"),
            Fault::Host(message) => write!(f, "failed in the host: {message}"),
        }
    }
}

/// What one call may reach beyond its sandbox; [`Permissions::default`] is nothing at all.
#[derive(Debug, Clone, Default)]
pub struct Permissions {
    /// Destinations `wasi:http` requests may go to.
    pub network: Vec<NetworkRule>,
    /// The operator's egress rules, which every connection passes too.
    pub egress: Arc<EgressConfig>,
    /// Directories preopened for the guest.
    pub dirs: Vec<Preopen>,
    /// Where `call-tool` requests go; `None`: the guest may not call other tools.
    pub tools: Option<tokio::sync::mpsc::Sender<NestedCall>>,
    /// The tenant's files budget, which writes to `dirs` are charged to; `None`: unbounded.
    pub files: Option<Arc<FilesBudget>>,
    /// Whether this call may run in an instance an earlier call left, and leave its own.
    pub reuse: Option<ReusePolicy>,
}

/// Lets calls with the same `key` share an instance (see [`crate::reuse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReusePolicy {
    /// Calls with equal keys may share instances: the caller puts the tenant, the tool, the
    /// component and anything else that must match in it.
    pub key: String,
    /// Calls one instance serves.
    pub max_calls: u32,
    /// From an instance's first call to its last.
    pub max_age: Duration,
}

/// A guest's `call-tool`: served by whoever runs the call, answered on `reply`.
#[derive(Debug)]
pub struct NestedCall {
    /// The callee, by name.
    pub tool: String,
    /// Its arguments, as JSON text.
    pub args: String,
    /// What the caller has left, which bounds the callee.
    pub fuel: u64,
    /// The caller's deadline, which bounds the callee.
    pub deadline: Instant,
    /// Where the answer goes.
    pub reply: tokio::sync::oneshot::Sender<NestedReply>,
}

/// The answer to a [`NestedCall`].
#[derive(Debug)]
pub struct NestedReply {
    /// The callee's JSON result, or `code: message`.
    pub result: Result<String, String>,
    /// Charged to the caller.
    pub fuel_used: u64,
}

/// A host directory the guest sees at `guest`.
#[derive(Debug, Clone)]
pub struct Preopen {
    /// The directory on the host (for messages; `handle` is what is opened).
    pub host: std::path::PathBuf,
    /// Where the guest sees it.
    pub guest: String,
    /// Whether the guest may write there.
    pub write: bool,
    /// The directory, already opened safely by the host: then it is preopened through this
    /// handle, never by resolving `host` again (which a symlink or a rename could redirect).
    pub handle: Option<Arc<std::os::fd::OwnedFd>>,
}

/// A guest run: how it ended and what it cost.
#[derive(Debug)]
pub struct Run<T> {
    /// What the guest returned, or how it failed.
    pub result: Result<T, Fault>,
    /// Fuel it burned.
    pub fuel_used: u64,
}

impl<T> Run<T> {
    pub(crate) fn host_fault(message: &str) -> Self {
        Run {
            result: Err(Fault::Host(message.to_owned())),
            fuel_used: 0,
        }
    }
}

/// A component ready to instantiate: compiled, linked and type-checked once.
#[derive(Clone)]
pub struct Prepared {
    /// Set for a tool component (the `plugin` world).
    plugin: Option<PluginPre>,
    /// Set for the JavaScript runtime (the `js-runtime` world).
    pub(crate) js: Option<JsRuntimePre<CallState>>,
    /// Bytes of the artifact it was loaded from: about the memory it holds (its code).
    bytes: usize,
}

impl Prepared {
    /// About the memory it holds: the bytes of its compiled artifact.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A tool component, of the `toolhost:plugin` version it was built against.
#[derive(Clone)]
pub(crate) enum PluginPre {
    Current(bindings::PluginPre<CallState>),
    V0_1(v0_1::PluginPre<CallState>),
}

/// What one call runs, with its arguments (JSON text): a tool of a component, or JS source
/// on the runtime.
#[derive(Debug, Clone, Copy)]
pub enum Entry<'a> {
    /// A tool component's `call`.
    Tool {
        /// The arguments.
        args: &'a str,
    },
    /// The JS runtime's `run` of a tool's source.
    Js {
        /// The tool's JavaScript.
        source: &'a str,
        /// The arguments.
        args: &'a str,
    },
}

/// The engine, its pooled instances and the limits every call runs under. One per host.
pub struct Sandbox {
    pub(crate) engine: Engine,
    linker: Linker<CallState>,
    slots: Arc<Semaphore>,
    /// The memory budget in MiB: each instance holds its `memory_bytes`, rounded up.
    memory_mib: Arc<Semaphore>,
    /// Where tenants' components are compiled, and the host's own ([`Sandbox::compile_in`]).
    compiles: crate::places::Places,
    host_compiles: crate::places::Places,
    /// Each tenant's part of `memory_mib` (`memory_budget_per_tenant_bytes`), by tenant.
    tenants_memory_mib: std::sync::Mutex<std::collections::HashMap<String, Arc<Semaphore>>>,
    config: SandboxConfig,
    fingerprint: String,
    pub(crate) turns: Arc<Turns>,
    /// Instances kept for calls that may reuse them.
    pub(crate) idle: Arc<crate::reuse::Idle>,
    /// Dropping it stops the epoch ticker.
    _ticker: mpsc::Sender<()>,
}

impl Sandbox {
    /// An engine and a pool sized by `config`, and the epoch ticker.
    pub fn new(config: SandboxConfig) -> Result<Self, wasmtime::Error> {
        let engine = engine(&config)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        files::add_to_linker(&mut linker)?;
        #[cfg(feature = "wasi-http")]
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        use bindings::toolhost::plugin::{helpers, types};
        types::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |state| state)?;
        helpers::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |state| state)?;
        v0_1::add_to_linker(&mut linker)?;
        // By hand, for the store: the callee's fuel is charged to the caller.
        for tools in ["toolhost:plugin/tools@0.2.0", "toolhost:plugin/tools@0.1.0"] {
            linker
                .instance(tools)?
                .func_wrap_async("call-tool", |store, (tool, args): (String, String)| {
                    Box::new(call_tool(store, tool, args))
                })?;
        }
        let fingerprint = fingerprint(&engine);
        // A turn outlives two ticks without its holder's: it is not using the CPU.
        let turns = Turns::new(config.cpu_turns, 2 * config.epoch_tick);
        let idle = Arc::new(crate::reuse::Idle::new(config.max_instances));
        let ticker = spawn_epoch_ticker(
            engine.clone(),
            (turns.clone(), idle.clone()),
            config.epoch_tick,
        );
        Ok(Sandbox {
            idle,
            turns,
            slots: Arc::new(Semaphore::new(config.max_instances as usize)),
            memory_mib: Arc::new(Semaphore::new(mib(config.memory_budget_bytes) as usize)),
            tenants_memory_mib: Default::default(),
            compiles: crate::places::Places::new(MAX_COMPILES, 1),
            host_compiles: crate::places::Places::new(1, 1),
            engine,
            linker,
            config,
            fingerprint,
            _ticker: ticker,
        })
    }

    /// The largest component [`Sandbox::compile`] accepts.
    pub fn max_component_bytes(&self) -> usize {
        self.config.max_component_bytes
    }

    /// Identifies everything that changes compiled code: a compiled artifact is only valid
    /// for the same fingerprint.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Checks that `bytes` are a component within the size limit, compiles it, and returns
    /// the compiled artifact to store. CPU-heavy: call it off the async executor.
    pub fn compile(&self, bytes: &[u8]) -> Result<Vec<u8>, LoadError> {
        let limit = self.config.max_component_bytes;
        if bytes.len() > limit {
            return Err(LoadError::TooLarge {
                size: bytes.len(),
                limit,
            });
        }
        if !bytes.starts_with(b"\0asm") {
            return Err(LoadError::NotWasm);
        }
        // The four bytes after the magic: version 1, layer 0 is a core module.
        if bytes.get(4..8) == Some(&[1, 0, 0, 0]) {
            return Err(LoadError::CoreModule);
        }
        self.engine
            .precompile_component(bytes)
            .map_err(|e| LoadError::Compile(format!("{e:#}")))
    }

    /// [`Sandbox::compile`] off the async workers, in one of `tenant`'s compile places (one
    /// per tenant, [`MAX_COMPILES`] in all): Cranelift takes every core it is given, and
    /// memory outside any instance's cap, for seconds on a large component. `tenant` is ""
    /// for the host's own (the JS runtime), which has a place of its own: every JS call may
    /// wait for it. The bytes come back with the artifact.
    pub async fn compile_in(
        self: &Arc<Self>,
        tenant: &str,
        bytes: Vec<u8>,
    ) -> (Vec<u8>, Result<Vec<u8>, LoadError>) {
        let places = match tenant {
            "" => &self.host_compiles,
            _ => &self.compiles,
        };
        let place = places.take(tenant).await;
        let sandbox = self.clone();
        tokio::task::spawn_blocking(move || {
            let _place = place;
            let artifact = sandbox.compile(&bytes);
            (bytes, artifact)
        })
        .await
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))
    }

    /// Compiles and links a component in one step.
    pub fn prepare(&self, component: &[u8]) -> Result<Prepared, LoadError> {
        let artifact = self.compile(component)?;
        // SAFETY: `compile` just produced this artifact with this engine.
        unsafe { self.load(&artifact) }
    }

    /// Loads an artifact that [`Sandbox::compile`] produced and links it.
    ///
    /// # Safety
    ///
    /// wasmtime runs the artifact's machine code as is: `artifact` must be the output of
    /// `compile` on an engine with this fingerprint, unaltered (the host seals what it stores).
    pub unsafe fn load(&self, artifact: &[u8]) -> Result<Prepared, LoadError> {
        // SAFETY: the caller upholds this function's contract.
        let component = unsafe { Component::deserialize(&self.engine, artifact) }
            .map_err(|e| LoadError::Compile(format!("{e:#}")))?;
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::Link(format!("{e:#}")))?;
        let js = JsRuntimePre::new(pre.clone()).ok();
        let plugin = match bindings::PluginPre::new(pre.clone()) {
            Ok(plugin) => Some(PluginPre::Current(plugin)),
            Err(current) => match v0_1::PluginPre::new(pre) {
                Ok(plugin) => Some(PluginPre::V0_1(plugin)),
                Err(_) if js.is_some() => None,
                // The current version's complaint: what a new component should fix.
                Err(_) => return Err(LoadError::Link(format!("{current:#}"))),
            },
        };
        Ok(Prepared {
            plugin,
            js,
            bytes: artifact.len(),
        })
    }

    /// Asks a component for its tools.
    pub async fn list_tools(&self, prepared: &Prepared, limits: &Limits) -> Run<Vec<GuestToolDef>> {
        let Some(pre) = prepared.plugin.clone() else {
            return Run::host_fault("not a tool component: it does not export list-tools");
        };
        let nothing = Permissions::default();
        self.run(INSTALLS, limits, Helpers::default(), &nothing, |store| {
            Box::pin(async move {
                match pre {
                    PluginPre::Current(pre) => {
                        let plugin = pre.instantiate_async(&mut *store).await?;
                        plugin.call_list_tools(store).await
                    }
                    PluginPre::V0_1(pre) => {
                        let plugin = pre.instantiate_async(&mut *store).await?;
                        let defs = plugin.call_list_tools(store).await?;
                        Ok(defs.into_iter().map(Into::into).collect())
                    }
                }
            })
        })
        .await
    }

    /// Evaluates JS `source` on the runtime and returns its `spec` export as JSON text.
    pub async fn js_describe(
        &self,
        runtime: &Prepared,
        limits: &Limits,
        source: &str,
    ) -> Run<Result<String, String>> {
        let Some(pre) = runtime.js.clone() else {
            return Run::host_fault("not the JavaScript runtime");
        };
        let source = source.to_owned();
        let nothing = Permissions::default();
        self.run(INSTALLS, limits, Helpers::default(), &nothing, |store| {
            Box::pin(async move {
                let js = pre.instantiate_async(&mut *store).await?;
                js.call_describe(store, &source).await
            })
        })
        .await
    }

    /// Runs one tool call in a fresh instance.
    pub async fn call(
        &self,
        prepared: &Prepared,
        limits: &Limits,
        helpers: Helpers,
        permissions: &Permissions,
        entry: Entry<'_>,
        ctx: &CallContext,
    ) -> Run<Result<String, GuestToolError>> {
        let guest_ctx = bindings::toolhost::plugin::types::CallContext {
            tenant: ctx.tenant.clone(),
            call_id: ctx.call_id.clone(),
            tool: ctx.tool.clone(),
            data: ctx.data.to_string(),
        };
        let tool = ctx.tool.clone();
        let tenant = &*ctx.tenant;
        match entry {
            Entry::Tool { args } => {
                let args = args.to_owned();
                let Some(pre) = prepared.plugin.clone() else {
                    return Run::host_fault("not a tool component");
                };
                // Not with grants: a kept instance's requests and open files would outlive
                // the call that made them.
                if let Some(reuse) = &permissions.reuse
                    && permissions.dirs.is_empty()
                    && permissions.network.is_empty()
                {
                    let call = (limits, helpers, permissions, &*tool, &*args, &guest_ctx);
                    return self.call_reusing(tenant, pre, reuse, call).await;
                }
                self.run(tenant, limits, helpers, permissions, move |store| {
                    Box::pin(async move {
                        match pre {
                            PluginPre::Current(pre) => {
                                let plugin = pre.instantiate_async(&mut *store).await?;
                                plugin.call_call(store, &tool, &args, &guest_ctx).await
                            }
                            PluginPre::V0_1(pre) => {
                                let plugin = pre.instantiate_async(&mut *store).await?;
                                let ctx = (&guest_ctx).into();
                                let result = plugin.call_call(store, &tool, &args, &ctx).await?;
                                Ok(result.map_err(Into::into))
                            }
                        }
                    })
                })
                .await
            }
            Entry::Js { source, args } => {
                let Some(pre) = prepared.js.clone() else {
                    return Run::host_fault("not the JavaScript runtime");
                };
                let (source, args) = (source.to_owned(), args.to_owned());
                self.run(tenant, limits, helpers, permissions, move |store| {
                    Box::pin(async move {
                        let js = pre.instantiate_async(&mut *store).await?;
                        js.call_run(store, &source, &args, &guest_ctx).await
                    })
                })
                .await
            }
        }
    }

    /// The call's memory from `tenant`'s part of the budget, then an instance slot and the
    /// memory from the whole, waited for until `deadline`. Kept idle instances give theirs
    /// back first when any runs short: the tenant's own for its part, any for the whole.
    pub(crate) async fn admit(
        &self,
        tenant: &str,
        limits: &Limits,
        deadline: Instant,
    ) -> Result<Admitted, Fault> {
        let (own_part, own_memory) = self.memory_part(tenant);
        let memory = mib(limits.memory_bytes).min(mib(self.config.memory_budget_bytes));
        let own = memory.min(own_memory) as u32;
        let deadline = tokio::time::Instant::from(deadline);
        // A tenant at its part waits holding nothing another tenant needs, and does not
        // make any other tenant's kept instances go.
        if own_part.available_permits() < own as usize {
            self.idle.clear_tenant(tenant);
        }
        let own_memory = tokio::time::timeout_at(deadline, own_part.acquire_many_owned(own));
        let own_memory = match own_memory.await {
            Err(_elapsed) => return Err(Fault::Timeout),
            Ok(Err(_closed)) => return Err(Fault::Host("the sandbox is shutting down".into())),
            Ok(Ok(permit)) => permit,
        };
        if self.slots.available_permits() == 0
            || self.memory_mib.available_permits() < memory as usize
        {
            self.idle.clear();
        }
        // While any call waits, no instance is kept: its slot and memory go to the waiter.
        let _waiting = self.idle.waiting();
        let admitted = tokio::time::timeout_at(deadline, async {
            let slot = self.slots.clone().acquire_owned().await?;
            let memory = (self.memory_mib.clone())
                .acquire_many_owned(memory as u32)
                .await?;
            Ok::<_, tokio::sync::AcquireError>((slot, memory))
        });
        match admitted.await {
            Err(_elapsed) => Err(Fault::Timeout),
            // Closed only if the sandbox is dropped, which cannot happen while `&self` lives.
            Ok(Err(_)) => Err(Fault::Host("the sandbox is shutting down".into())),
            Ok(Ok((slot, memory))) => Ok(Admitted {
                _slot: slot,
                _memory: memory,
                _own_memory: own_memory,
            }),
        }
    }

    /// `tenant`'s part of the memory budget, made at its first call, and its size in MiB.
    fn memory_part(&self, tenant: &str) -> (Arc<Semaphore>, u64) {
        let part = mib(self.config.memory_budget_per_tenant_bytes.max(1));
        let mut tenants = (self.tenants_memory_mib.lock()).unwrap_or_else(|p| p.into_inner());
        // Looked up before inserting: most calls find it, and need not copy the tenant.
        if let Some(own) = tenants.get(tenant) {
            return (own.clone(), part);
        }
        let own = Arc::new(Semaphore::new(part as usize));
        tenants.insert(tenant.to_owned(), own.clone());
        (own, part)
    }

    /// Instantiates, runs `entry` under `limits`, and drops the instance.
    pub(crate) async fn run<T>(
        &self,
        tenant: &str,
        limits: &Limits,
        helpers: Helpers,
        permissions: &Permissions,
        entry: impl for<'s> FnOnce(
            &'s mut Store<CallState>,
        )
            -> Pin<Box<dyn Future<Output = wasmtime::Result<T>> + Send + 's>>
        + Send,
    ) -> Run<T> {
        // Waiting for a slot and for memory counts against the call's time.
        let deadline = Instant::now() + limits.timeout();
        let admitted = match self.admit(tenant, limits, deadline).await {
            Ok(admitted) => admitted,
            Err(fault) => {
                return Run {
                    result: Err(fault),
                    fuel_used: 0,
                };
            }
        };
        let turn = self.turns.guest(tenant);
        let call = (limits, helpers, permissions, deadline, turn);
        let mut store = match new_store(&self.engine, call) {
            Ok(store) => store,
            Err(message) => {
                return Run {
                    result: Err(Fault::Host(message)),
                    fuel_used: 0,
                };
            }
        };
        let run = execute(&mut store, limits, deadline, entry).await;
        release(store, admitted);
        run
    }
}

/// Runs `entry` in `store` until it returns or `deadline`, and says how it ended.
pub(crate) async fn execute<T>(
    store: &mut Store<CallState>,
    limits: &Limits,
    deadline: Instant,
    entry: impl for<'s> FnOnce(
        &'s mut Store<CallState>,
    ) -> Pin<Box<dyn Future<Output = wasmtime::Result<T>> + Send + 's>>,
) -> Run<T> {
    let execution = entry(store);
    // The epoch deadline stops guest code; this stops a guest blocked in a host call.
    let outcome = tokio::time::timeout_at(deadline.into(), execution).await;
    ended(store, limits, outcome)
}

/// How a run that ended with `outcome` (`Err`: past its deadline) went, and its fuel.
pub(crate) fn ended<T>(
    store: &Store<CallState>,
    limits: &Limits,
    outcome: Result<wasmtime::Result<T>, tokio::time::error::Elapsed>,
) -> Run<T> {
    let fuel_used = limits.fuel.saturating_sub(store.get_fuel().unwrap_or(0));
    let result = match outcome {
        Err(_elapsed) => Err(Fault::Timeout),
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(classify(store.data(), &error)),
    };
    Run { result, fuel_used }
}

/// Drops an instance and gives back its slot and memory. A large memory (madvise over every
/// touched page) takes milliseconds to hundreds of them: then off the async workers, which
/// other tenants' calls need, and the slot and budget are released once it is done.
pub(crate) fn release(store: Store<CallState>, admitted: Admitted) {
    if store.data().memory.used > RELEASE_OFF_WORKER_BYTES {
        tokio::task::spawn_blocking(move || drop((store, admitted)));
    }
}

/// Components compiled at once in the process (each on every core Cranelift is given), one of
/// them a tenant's at most.
pub const MAX_COMPILES: usize = 2;

/// An instance slot and the call's memory from the budget and from its tenant's part of it,
/// held while the instance lives.
pub(crate) struct Admitted {
    _slot: tokio::sync::OwnedSemaphorePermit,
    _memory: tokio::sync::OwnedSemaphorePermit,
    _own_memory: tokio::sync::OwnedSemaphorePermit,
}

/// The CPU turns of guests that run while a tenant installs (`list-tools`, a JS module's
/// spec): one group for all.
pub(crate) const INSTALLS: &str = "";

/// Bytes of each recycled table, and of each memory where the kernel cannot say which pages
/// a call dirtied, kept resident (zeroed in place) between calls.
const KEEP_RESIDENT_BYTES: usize = 64 << 10;

/// Bytes of each recycled memory kept resident where the kernel has PAGEMAP_SCAN: only the
/// pages a call dirtied are restored, by copying, so a pre-initialised JS tool's heap (a few
/// MiB, copy-on-write from its snapshot) is not faulted in again at every call: 0.23 → 0.08 ms
/// per call here. Costs resident memory only where a slot's calls wrote that much.
const KEEP_RESIDENT_DIRTY_BYTES: usize = 8 << 20;

/// PAGEMAP_SCAN came with Linux 6.7.
fn kernel_has_pagemap_scan() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    version >= (6, 7)
}

/// An instance whose memory grew past this is dropped on a blocking thread.
const RELEASE_OFF_WORKER_BYTES: usize = 16 << 20;

/// Everything that is set once per engine, in one place (after `wasmtime serve`). Left at
/// wasmtime's defaults after measuring them (BENCHMARKS.md): lazy table init and copy-on-write
/// memory images (each faster here), memory protection keys off (experimental in wasmtime 48).
fn engine(config: &SandboxConfig) -> Result<Engine, wasmtime::Error> {
    let base = || {
        let mut c = Config::new();
        c.wasm_component_model(true)
            .consume_fuel(true)
            .epoch_interruption(true)
            .parallel_compilation(true);
        c
    };
    let slots = config.max_instances;
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(slots)
        .total_stacks(slots)
        .total_core_instances(slots * CORE_INSTANCES_PER_COMPONENT)
        .total_memories(slots * MEMORIES_PER_COMPONENT)
        .total_tables(slots * TABLES_PER_COMPONENT)
        .max_memory_size(MEMORY_BYTES.max as usize)
        // Up to 64 KiB of a recycled slot's memory and tables is zeroed with memset rather
        // than given back with madvise: cheaper for small tools, and fewer TLB-shootdown IPIs
        // between cores. With PAGEMAP_SCAN, up to 8 MiB of dirtied memory pages.
        .linear_memory_keep_resident(if kernel_has_pagemap_scan() {
            KEEP_RESIDENT_DIRTY_BYTES
        } else {
            KEEP_RESIDENT_BYTES
        })
        .table_keep_resident(KEEP_RESIDENT_BYTES)
        // Where the kernel has PAGEMAP_SCAN (Linux 6.7+), only the pages a call dirtied are
        // reset, with memset up to the resident size: a small tool's slot is recycled with no
        // madvise at all, so no TLB-shootdown IPI to the other cores. 2.5x the calls/s on two
        // threads here; BENCHMARKS.md has the figures.
        .pagemap_scan(wasmtime::Enabled::Auto);
    let mut pooled = base();
    pooled.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    match Engine::new(&pooled) {
        Ok(engine) => Ok(engine),
        // The pool reserves address space up front; a constrained process may refuse it.
        Err(error) => {
            tracing::warn!(%error, "pooling allocator unavailable; allocating instances on demand");
            Engine::new(&base())
        }
    }
}

/// sha256 over wasmtime's own compatibility hash (its version and every code-changing setting).
fn fingerprint(engine: &Engine) -> String {
    struct Sha(Sha256);
    impl Hasher for Sha {
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
        fn finish(&self) -> u64 {
            unreachable!("only the digest is read")
        }
    }
    let mut hasher = Sha(Sha256::new());
    std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
    hex(&hasher.0.finalize())
}

/// Bytes in whole MiB, rounded up: the unit of the memory budget.
fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

/// One ticker per engine: it also hands out CPU turns and drops kept instances past their
/// age. Stops when the returned sender is dropped.
fn spawn_epoch_ticker(
    engine: Engine,
    (turns, idle): (Arc<Turns>, Arc<crate::reuse::Idle>),
    tick: Duration,
) -> mpsc::Sender<()> {
    let (stop, stopped) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("toolhost-epoch".into())
        .spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                engine.increment_epoch();
                turns.expire();
                idle.expire();
            }
        })
        .expect("spawning the epoch thread");
    stop
}

/// What a store is made, or rebound, for: one call's limits, log, permissions, deadline and
/// CPU turn.
pub(crate) type ForCall<'a> = (&'a Limits, Helpers, &'a Permissions, Instant, GuestTurn);

pub(crate) fn new_store(
    engine: &Engine,
    (limits, helpers, permissions, deadline, turn): ForCall<'_>,
) -> Result<Store<CallState>, String> {
    // No env, args or sockets, and only the granted directories and HTTP destinations.
    let mut wasi = WasiCtx::builder();
    let log_to = Arc::new(std::sync::Mutex::new(helpers.clone()));
    wasi.stdout(Capture(log_to.clone(), Stream::Stdout))
        .stderr(Capture(log_to.clone(), Stream::Stderr))
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    for dir in &permissions.dirs {
        let perms = match dir.write {
            true => FsPerms::ReadWrite,
            false => FsPerms::ReadOnly,
        };
        // `/proc/self/fd/N` reopens the very directory the handle holds, whatever its name.
        let host = match &dir.handle {
            Some(handle) => format!("/proc/self/fd/{}", handle.as_raw_fd()).into(),
            None => dir.host.clone(),
        };
        wasi.preopened_dir(&host, &dir.guest, perms)
            .map_err(|e| format!("cannot open the granted directory {}: {e}", dir.guest))?;
    }
    let files = permissions.files.clone().map(|budget| FilesQuota {
        budget,
        helpers: helpers.clone(),
    });
    // Each handle costs the host memory outside the guest's cap.
    let mut table = ResourceTable::new();
    table.set_max_capacity(MAX_HANDLES);
    let state = CallState {
        tools: permissions.tools.clone(),
        deadline,
        wasi: wasi.build(),
        files,
        turn,
        #[cfg(feature = "wasi-http")]
        http: WasiHttpCtx::new(),
        #[cfg(feature = "wasi-http")]
        outbound: Outbound {
            rules: permissions.network.clone(),
            egress: permissions.egress.clone(),
            helpers: helpers.clone(),
            connections: Arc::new(tokio::sync::Semaphore::new(
                crate::outbound::MAX_CONNECTIONS,
            )),
        },
        table,
        open_files: OpenFiles::default(),
        log_to,
        memory: MemoryCap {
            limit: limits.memory_bytes as usize,
            used: 0,
            exceeded: false,
        },
        helpers,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|state| &mut state.memory);
    store
        .set_fuel(limits.fuel)
        .expect("fuel is enabled on this engine");
    arm(&mut store, deadline);
    Ok(store)
}

/// Checks `deadline` at every epoch tick, from the next one.
pub(crate) fn arm(store: &mut Store<CallState>, deadline: Instant) {
    // Check the deadline at every tick and yield to the executor, so that busy guests never
    // starve other calls. `yield_now` defers the wake-up until tokio has polled its timers
    // and sockets; a plain yield would let guests delay them by 61 ticks. A guest that goes
    // on running takes a CPU turn, waiting for one while other tenants' guests have theirs.
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |store| {
        if Instant::now() >= deadline {
            return Ok(UpdateDeadline::Interrupt);
        }
        Ok(match store.data().turn.tick() {
            None => UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now())),
            Some(turn) => UpdateDeadline::YieldCustom(
                1,
                Box::pin(async move {
                    let _ = turn.await;
                    // Woken by another guest's tick, it would run before tokio polls its
                    // timers: defer once more, as above.
                    tokio::task::yield_now().await;
                }),
            ),
        })
    });
}

/// `tools.call-tool`: hands the call to whoever runs this one, and waits for the answer.
async fn call_tool(
    mut store: wasmtime::StoreContextMut<'_, CallState>,
    tool: String,
    args: String,
) -> wasmtime::Result<(Result<String, String>,)> {
    let Some(tools) = store.data().tools.clone() else {
        return Ok((Err("denied: this call may not call other tools".into()),));
    };
    let fuel = store.get_fuel()?;
    let (reply, answer) = tokio::sync::oneshot::channel();
    let request = NestedCall {
        tool,
        args,
        fuel,
        deadline: store.data().deadline,
        reply,
    };
    if tools.send(request).await.is_err() {
        return Ok((Err("internal: nested calls are not served".into()),));
    }
    let Ok(answer) = answer.await else {
        return Ok((Err("internal: the nested call was dropped".into()),));
    };
    store.set_fuel(fuel.saturating_sub(answer.fuel_used))?;
    Ok((answer.result,))
}

pub(crate) fn classify(state: &CallState, error: &wasmtime::Error) -> Fault {
    // Checked first: a memory refusal surfaces as an error of ours, not as a `Trap`.
    if state.memory.exceeded {
        return Fault::MemoryLimit;
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => Fault::Timeout,
        Some(Trap::OutOfFuel) => Fault::OutOfFuel,
        Some(trap) => Fault::Trap(trap.to_string()),
        None => Fault::Trap(format!("{error:#}")),
    }
}

/// The per-call state a guest's host calls see.
pub struct CallState {
    tools: Option<tokio::sync::mpsc::Sender<NestedCall>>,
    deadline: Instant,
    pub(crate) wasi: WasiCtx,
    pub(crate) files: Option<FilesQuota>,
    turn: GuestTurn,
    #[cfg(feature = "wasi-http")]
    http: WasiHttpCtx,
    #[cfg(feature = "wasi-http")]
    outbound: Outbound,
    pub(crate) table: ResourceTable,
    pub(crate) open_files: OpenFiles,
    /// Where stdout and stderr go: this call's log (swapped when the instance is reused).
    log_to: Arc<std::sync::Mutex<Helpers>>,
    memory: MemoryCap,
    pub(crate) helpers: Helpers,
}

impl CallState {
    /// Points a reused instance's state at a new call: its log, deadline, turn, nested
    /// calls, network rules and memory cap. The instance keeps its memory and its WASI
    /// resources.
    pub(crate) fn rebind(&mut self, (limits, helpers, permissions, deadline, turn): ForCall<'_>) {
        self.tools = permissions.tools.clone();
        self.deadline = deadline;
        self.turn = turn;
        *self.log_to.lock().unwrap_or_else(|p| p.into_inner()) = helpers.clone();
        #[cfg(feature = "wasi-http")]
        {
            self.outbound.rules = permissions.network.clone();
            self.outbound.egress = permissions.egress.clone();
            self.outbound.helpers = helpers.clone();
        }
        self.memory.limit = limits.memory_bytes as usize;
        self.memory.exceeded = false;
        self.helpers = helpers;
    }

    /// Between calls: the instance holds no CPU turn (nor waits for one).
    pub(crate) fn set_turn(&mut self, turn: GuestTurn) {
        self.turn = turn;
    }

    /// Memory the instance holds now.
    pub(crate) fn memory_used(&self) -> usize {
        self.memory.used
    }
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

#[cfg(feature = "wasi-http")]
impl WasiHttpView for CallState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.outbound,
        }
    }
}

impl bindings::toolhost::plugin::types::Host for CallState {}

impl bindings::toolhost::plugin::helpers::Host for CallState {
    fn log(&mut self, level: bindings::toolhost::plugin::helpers::Level, message: String) {
        use bindings::toolhost::plugin::helpers::Level as L;
        let level = match level {
            L::Trace => Level::Trace,
            L::Debug => Level::Debug,
            L::Info => Level::Info,
            L::Warn => Level::Warn,
            L::Error => Level::Error,
        };
        self.helpers.log(level, &message);
    }

    async fn kv_get(&mut self, key: String) -> Result<Option<Vec<u8>>, String> {
        self.helpers.kv_get(&key).await.map_err(|e| e.0)
    }

    async fn kv_set(&mut self, key: String, value: Vec<u8>) -> Result<(), String> {
        self.helpers.kv_set(&key, &value).await.map_err(|e| e.0)
    }

    async fn kv_delete(&mut self, key: String) -> Result<bool, String> {
        self.helpers.kv_delete(&key).await.map_err(|e| e.0)
    }

    async fn config_get(&mut self, key: String) -> Result<Option<String>, String> {
        self.helpers.config_get(&key).await.map_err(|e| e.0)
    }
}

/// Caps the total linear memory of one call and remembers whether the cap was hit.
struct MemoryCap {
    limit: usize,
    used: usize,
    exceeded: bool,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let used = self.used - current.min(self.used) + desired;
        if used > self.limit {
            self.exceeded = true;
            wasmtime::bail!("memory limit of {} bytes reached", self.limit);
        }
        self.used = used;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// Guest stdout or stderr, written into the call's log. Always accepts the write (a guest
/// whose `println!` failed would panic); bytes past the cap are counted and dropped.
#[derive(Clone)]
struct Capture(Arc<std::sync::Mutex<Helpers>>, Stream);

impl Capture {
    fn write(&self, bytes: &[u8]) {
        let helpers = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        helpers.write(self.1, bytes);
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        Capture::write(self, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Capture::write(&self, buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tenants_compiles_run_one_at_a_time_and_never_wait_for_anothers() {
        let sandbox = Arc::new(Sandbox::new(SandboxConfig::default()).unwrap());
        let not_wasm = || b"not wasm".to_vec();
        let held = sandbox.compiles.try_take("acme").unwrap();
        let waits = Duration::from_millis(100);
        let acme = tokio::time::timeout(waits, sandbox.compile_in("acme", not_wasm())).await;
        assert!(acme.is_err(), "acme's second compile waits for its first");
        let soon = Duration::from_secs(10);
        let globex = tokio::time::timeout(soon, sandbox.compile_in("globex", not_wasm()));
        assert!(matches!(globex.await.unwrap().1, Err(LoadError::NotWasm)));
        drop(held);
        let acme = tokio::time::timeout(soon, sandbox.compile_in("acme", not_wasm()));
        assert!(matches!(acme.await.unwrap().1, Err(LoadError::NotWasm)));
        // Tenants holding every place hold up no compile of the host's own.
        let held: Vec<_> = ["acme", "globex"]
            .map(|tenant| sandbox.compiles.try_take(tenant).unwrap())
            .into();
        assert_eq!(held.len(), MAX_COMPILES);
        let host = tokio::time::timeout(soon, sandbox.compile_in("", not_wasm()));
        assert!(matches!(host.await.unwrap().1, Err(LoadError::NotWasm)));
    }
}
