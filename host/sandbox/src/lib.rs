//! One fresh, limited Wasm instance per tool call, and nothing the call was not granted.
//!
//! The wasmtime engine with its instance pool and epoch ticker; the linker of WASI p2,
//! `wasi:http` and toolhost's own `helpers` and `tools` interfaces; compiling and loading
//! components; the per-call store with fuel, an epoch deadline, a memory cap, captured stdio
//! and the call's [`Permissions`] (preopened directories, network rules); outbound HTTP
//! through the egress rules; and how each failure is classified. It knows components,
//! limits and one call's context, never tenants, catalogs or HTTP serving.

#![deny(missing_docs)]

pub mod egress;
mod files;
pub mod helpers;
#[cfg(feature = "wasi-http")]
mod outbound;
pub mod places;
mod redact;
mod reuse;
mod sandbox;
pub mod snapshot;
pub mod turns;

pub use files::{FilesBudget, FilesCount, MAX_FILE_ENTRIES, MAX_OPEN_FILES};
pub use helpers::{HelperError, Helpers};
#[cfg(feature = "wasi-http")]
pub use outbound::MAX_CONNECTIONS;
pub use sandbox::*;
