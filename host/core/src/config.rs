//! How a host is set up, and the fixed limits every tenant shares.

use std::path::PathBuf;
use std::time::Duration;

use toolhost_sandbox::SandboxConfig;
use toolhost_sandbox::egress::EgressConfig;
use toolhost_spec::policy::TenantPolicy;
#[cfg(feature = "postgres")]
use toolhost_store::PgOptions;
use toolhost_store::SecretsKey;

/// The largest JavaScript source `install_js` accepts, in bytes.
pub const MAX_JS_SOURCE_BYTES: usize = 1 << 20;
/// How deep `call-tool` calls may nest below a direct call.
pub const MAX_NESTING_DEPTH: u32 = 4;
/// A component may offer at most this many tools.
pub const MAX_TOOLS_PER_COMPONENT: usize = 256;
/// A tenant's tools' specs (their current versions, as JSON) are at most this many bytes
/// together: every node holds them in memory as parsed values, which take many times that.
pub const MAX_SPEC_BYTES_PER_TENANT: u64 = 8 << 20;
/// A configuration value is at most this many bytes.
pub const MAX_CONFIG_VALUE_BYTES: usize = 64 * 1024;
/// A tenant has at most this many configuration keys: with values of up to
/// [`MAX_CONFIG_VALUE_BYTES`], 16 MiB of store.
pub const MAX_CONFIG_KEYS: usize = 256;

/// How a [`crate::Host`] is opened: storage, the sandbox's limits, caches and the JS runtime.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Where installed tools persist. `None` keeps everything in memory. With `database`,
    /// only this node's own files: compiled artifacts, granted directories, the admin socket.
    pub data_dir: Option<PathBuf>,
    /// A PostgreSQL database that many hosts share (`--store postgres://…`): tenants, tools,
    /// keys, policies, configuration, data and held calls live there instead of `data_dir`.
    #[cfg(feature = "postgres")]
    pub database: Option<PgOptions>,
    /// Whether this host serves calls as a node of its cluster (on a shared database): it
    /// says so every few seconds, so that it counts in the share of each tenant's limits.
    /// False for a process that only manages the store (the CLI's one-shot commands).
    pub serves: bool,
    /// Durable calls (`Host::submit`): workers on this node, and their lease.
    pub durable: DurableConfig,
    /// How often a host on a shared database reads everything again, in case it missed
    /// another node's notice of a change.
    pub resync_interval: Duration,
    /// The engine's pool, slots, memory budget and egress.
    pub sandbox: SandboxConfig,
    /// Linked components kept in memory; past this the least recently used is dropped and
    /// reloaded from its stored artifact on its next call.
    pub max_loaded_components: usize,
    /// Bytes of compiled code those components may hold together (each weighs its artifact,
    /// at least this over `max_loaded_components`): a component of 64 MiB compiles to
    /// hundreds of MiB, so a count alone would let a few tenants' components fill memory.
    /// One heavier than this runs, loaded again at each call. One tenant's calls hold at
    /// most a quarter of it: past that the tenant's oldest is dropped, not another's.
    pub max_loaded_component_bytes: u64,
    /// A directory on this machine where compiled artifacts are shared, checked before
    /// compiling: hosts (and test runs) that share it compile each component once per engine.
    pub artifact_dir: Option<PathBuf>,
    /// Seals secret configuration values at rest (`--secrets-key-file`); without it they
    /// are stored as given, in the owner-only data directory.
    pub secrets_key: Option<SecretsKey>,
    /// The store's page cache, in bytes.
    pub store_cache_bytes: u64,
    /// Call trees (a direct call and the calls it nests) one tenant may run at once; its
    /// further calls wait in the tenant's own queue, within their timeout. Times the nesting
    /// depth (5 levels), it stays under `sandbox.max_instances`, so other tenants always find
    /// instance slots.
    pub tenant_share: u32,
    /// The policy of every tenant that has none of its own (`Host::set_policy`).
    pub default_policy: TenantPolicy,
    /// Where outbound requests may go.
    pub egress: EgressConfig,
    /// Root of tenants' granted directories [default: `data_dir/files`; none in memory].
    pub files_dir: Option<PathBuf>,
    /// The JavaScript runtime component (`scripts/build-js-runtime`) that runs stored-source
    /// JS tools; without it `install_js` refuses.
    pub js_runtime: Option<Vec<u8>>,
    /// JS tools kept pre-initialised on this node (a snapshot with the module evaluated, ~5 MB
    /// of compiled code each); past this the least recently used is dropped. 0: every call
    /// starts QuickJS and evaluates the module.
    pub js_snapshots: usize,
    /// Of those, at most this many of one tenant's tools: its next replaces one of its own.
    pub js_snapshots_per_tenant: usize,
    /// Calls kept per tenant in its recent-call history (`Host::recent_calls`), within
    /// [`MAX_HISTORY_BYTES_PER_TENANT`](crate::history::MAX_HISTORY_BYTES_PER_TENANT). 0
    /// keeps no history and no per-minute figures.
    pub call_history: usize,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            data_dir: None,
            #[cfg(feature = "postgres")]
            database: None,
            resync_interval: Duration::from_secs(30),
            serves: true,
            durable: DurableConfig::default(),
            sandbox: SandboxConfig::default(),
            max_loaded_components: 256,
            max_loaded_component_bytes: 2 << 30,
            artifact_dir: None,
            secrets_key: None,
            store_cache_bytes: 64 << 20,
            tenant_share: 8,
            default_policy: TenantPolicy::default(),
            egress: EgressConfig::default(),
            files_dir: None,
            js_runtime: None,
            js_snapshots: 64,
            js_snapshots_per_tenant: 8,
            call_history: 200,
        }
    }
}

/// How a host runs durable calls.
#[derive(Debug, Clone)]
pub struct DurableConfig {
    /// Calls this node runs at once. Each still passes its tenant's admission and share. 0
    /// for a process that only submits and reads calls (the CLI's one-shot commands).
    pub workers: usize,
    /// How long a claim holds without renewal: a dead node's calls are taken up this long
    /// after its last renewal. Renewed every third of it.
    pub lease: Duration,
}

impl Default for DurableConfig {
    fn default() -> Self {
        DurableConfig {
            workers: 8,
            lease: Duration::from_secs(5),
        }
    }
}
