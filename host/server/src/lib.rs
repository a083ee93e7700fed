//! toolhost over the network: the HTTP API (`/v1`, key auth, the JSON error shape,
//! `/openapi.json`), MCP over Streamable HTTP (`/mcp`) and stdio, the progressive-disclosure
//! bridges (`tool_search`, `tool_describe`, `tool_call`), the web console (`/`), and the
//! operator's admin socket.
//! Everything below it is the `toolhost` library; nothing below it knows HTTP.

#![deny(missing_docs)]

pub mod admin;
mod batch;
pub mod bodies;
pub mod bridges;
mod console;
mod direct_requests;
pub mod events;
pub mod listener;
pub mod mcp;
mod per_tenant;
pub mod responses;
pub mod server;
pub mod sessions;
pub mod stdio;
#[cfg(test)]
mod testing;

pub use server::{BodyMemory, ServerOptions, router, serve};
