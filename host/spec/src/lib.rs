//! What a tool is and what a call is, as data and pure rules: [`ToolSpec`] and its
//! [`Limits`], parameter schemas compiled into argument validators, the shapes tools are
//! exported in (OpenAI, Anthropic, MCP, OpenAI strict), result clipping, result-cache key
//! paths, tenant policies, and the outcome of a call. Nothing here runs Wasm, touches a disk
//! or knows HTTP, so every crate of toolhost, and an app's own code, can share these types.

#![deny(missing_docs)]

pub mod access;
pub mod anthropic;
pub mod call;
pub mod clip;
pub mod digest;
pub mod export;
pub mod keypath;
pub mod policy;
pub mod schema;
pub mod spec;
pub mod strict;

#[cfg(test)]
mod fuzz;

pub use call::{CallContext, CallError, CallLog, CallOutcome, Caller, Level, LogLine, ToolError};
pub use policy::TenantPolicy;
pub use spec::{CachePolicy, Limits, SpecError, ToolSpec};
