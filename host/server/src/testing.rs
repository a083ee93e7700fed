//! Helpers for this crate's unit tests.

use serde_json::json;
use toolhost::http_tool::HttpToolDef;

/// A tool with no code named `name`: installing it compiles nothing.
pub(crate) fn http_tool(name: &str) -> HttpToolDef {
    serde_json::from_value(json!({
        "spec": {"name": name, "description": format!("Looks up {name}."), "parameters": {"type": "object"}},
        "request": {"method": "get", "url": "http://example.com/"}
    }))
    .unwrap()
}
