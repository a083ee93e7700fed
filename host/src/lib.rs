//! toolhost: a sandboxed host for user-authored tools that AI agents call.
//!
//! ```no_run
//! # async fn demo(wasm: Vec<u8>) -> Result<(), Box<dyn std::error::Error>> {
//! use toolhost::{Caller, Host, HostConfig};
//!
//! let host = Host::open(HostConfig::default())?;
//! host.install("acme", wasm).await?;
//! let outcome = host
//!     .call(&Caller::tenant("acme"), "text_stats", serde_json::json!({"text": "hi there"}))
//!     .await;
//! println!("{}", outcome.result?);
//! # Ok(()) }
//! ```

pub mod admin;
pub mod approval;
pub mod cache;
pub mod call;
pub mod clip;
pub mod disclosure;
pub mod egress;
pub mod embed;
pub mod encoder;
pub mod export;
pub mod helpers;
pub mod hooks;
mod host;
pub mod http_tool;
mod loaded;
pub mod mcp;
pub mod metrics;
mod outbound;
pub mod policy;
pub mod registry;
pub mod sandbox;
pub mod schema;
pub mod server;
pub mod spec;
pub mod store;

pub use approval::{ApprovalError, PendingCall};
pub use call::{CallContext, CallError, CallLog, CallOutcome, Caller, Level, ToolError};
pub use helpers::{HelperError, Helpers};
pub use hooks::{CallHook, HookCall};
pub use host::{
    Host, HostConfig, InstallError, MAX_NESTING_DEPTH, ManageError, NewKey, OpenError, Source,
    ToolInfo,
};
pub use policy::TenantPolicy;
pub use sandbox::SandboxConfig;
pub use spec::{CachePolicy, Limits, SpecError, ToolSpec};
pub use store::{KeyRecord, SledStore, Store, StoreError, ToolEntry, ToolVersion};
