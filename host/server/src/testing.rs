//! Helpers for this crate's unit tests.

use std::sync::Arc;

use serde_json::json;
use toolhost::Host;
use toolhost::http_tool::HttpToolDef;

/// A host on a store in memory, where `acme` has one tool: `weather`.
pub(crate) async fn host_where_acme_has_a_tool() -> Arc<Host> {
    let host = Arc::new(Host::open(Default::default()).await.unwrap());
    host.install_http("acme", http_tool("weather"))
        .await
        .unwrap();
    host
}

/// A tool with no code named `name`: installing it compiles nothing.
pub(crate) fn http_tool(name: &str) -> HttpToolDef {
    serde_json::from_value(json!({
        "spec": {"name": name, "description": format!("Looks up {name}."), "parameters": {"type": "object"}},
        "request": {"method": "get", "url": "http://example.com/"}
    }))
    .unwrap()
}
