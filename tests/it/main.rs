//! Every integration test, in one binary: the wasmtime stack is linked once, and the tests
//! share the example plugins, built once per run (`plugins`).

mod cluster;
mod console;
mod crash;
mod disclosure;
mod e2e;
mod faults;
mod grants;
mod http_tools;
mod isolation;
mod js_platform;
mod js_tools;
mod js_wpt;
mod mcp;
mod pipeline;
mod plugins;
mod process;
mod reuse;
mod server;
mod store;
