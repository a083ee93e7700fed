//! toolhost: a sandboxed host for user-authored tools that AI agents call. This is the
//! library an app embeds: [`Host`] installs tenants' tools (Wasm components, JavaScript
//! source, declarative HTTP requests) beside the app's trusted native tools, and runs each
//! call through one pipeline of policy, admission, validation, hooks, approval, cache and a
//! fresh sandboxed instance. It knows nothing of HTTP serving, MCP or the CLI
//! (`toolhost-server`, `toolhost-cli`), nor of tool search (`toolhost-search`).
//!
//! ```no_run
//! # async fn demo(wasm: Vec<u8>) -> Result<(), Box<dyn std::error::Error>> {
//! use toolhost::{Caller, Host, HostConfig};
//!
//! let host = Host::open(HostConfig::default()).await?;
//! host.install("acme", wasm).await?;
//! let outcome = host
//!     .call(&Caller::tenant("acme"), "text_stats", serde_json::json!({"text": "hi there"}))
//!     .await;
//! println!("{}", outcome.result?);
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod admission;
pub use admission::{MAX_WAITING_BYTES_PER_TENANT, QUEUED_PER_PLACE};
pub mod approval;
mod artifacts;
mod catalog;
mod checks;
pub use checks::{MAX_CHECKS, MAX_CHECKS_PER_TENANT};
mod components;
mod config;
mod durable;
pub use config::DurableConfig;
pub use durable::{
    DurableStatus, MAX_DURABLE_WAITS, MAX_DURABLE_WAITS_PER_TENANT, MAX_UNENDED_PER_TENANT,
};
mod error;
mod exec;
pub use exec::MAX_RESULT_BYTES;
mod grants;
pub mod history;
pub mod hooks;
mod host;
pub mod http_tool;
mod js_snapshots;
pub mod metrics;
mod pipeline;
pub mod registry;
mod released;
mod sync;
mod tenants;

// The crates below the host, under one root for an app that embeds it.
pub use toolhost_sandbox::{self as sandbox, egress, helpers};
pub use toolhost_spec::access::{Access, Role};
pub use toolhost_spec::{access, call, clip, digest, export, keypath, policy, schema, spec};
pub use toolhost_store as store;

pub use approval::{ApprovalError, PendingCall};
pub use catalog::{JsSource, Source, ToolInfo};
pub use config::{
    HostConfig, MAX_CONFIG_KEYS, MAX_CONFIG_VALUE_BYTES, MAX_JS_SOURCE_BYTES, MAX_NESTING_DEPTH,
    MAX_SPEC_BYTES_PER_TENANT, MAX_TOOLS_PER_COMPONENT,
};
pub use error::{InstallError, ManageError, OpenError};
pub use hooks::{CallHook, HookCall};
pub use host::Host;
pub use tenants::NewKey;
pub use toolhost_sandbox::{HelperError, Helpers, SandboxConfig};
pub use toolhost_spec::{
    CachePolicy, CallContext, CallError, CallLog, CallOutcome, Caller, Level, Limits, SpecError,
    TenantPolicy, ToolError, ToolSpec,
};
pub use toolhost_store::{
    Change, KeyRecord, RedbStore, SecretsKey, Store, StoreError, ToolEntry, ToolVersion,
};
#[cfg(feature = "postgres")]
pub use toolhost_store::{PgOptions, PgStore};
