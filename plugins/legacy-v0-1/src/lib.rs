//! A component built against `toolhost:plugin@0.1.0` with bare wit-bindgen, as a tool of
//! that release was: the host must list and run it, serve its helpers and its nested calls.

mod bindings {
    #![allow(clippy::too_many_arguments)] // generated code
    wit_bindgen::generate!({
        path: "../../host/sandbox/wit/v0.1.0",
        world: "toolhost:plugin/plugin@0.1.0",
    });
}

use bindings::toolhost::plugin::helpers::{self, Level};
use bindings::toolhost::plugin::tools;
use bindings::toolhost::plugin::types::{CallContext, Limits, ToolDef, ToolError};
use bindings::{Guest, export};

struct Legacy;

impl Guest for Legacy {
    fn list_tools() -> Vec<ToolDef> {
        vec![ToolDef {
            name: "legacy_echo".into(),
            description:
                "Echoes its text, counts its calls, and measures the text with text_stats.".into(),
            parameters:
                r#"{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}"#
                    .into(),
            strict: false,
            group: Some("legacy".into()),
            private: false,
            limits: Limits {
                timeout_ms: Some(5_000),
                fuel: None,
                memory_bytes: None,
                max_result_chars: None,
            },
            cache: None,
            config: Vec::new(),
            needs_approval: false,
            idempotent: false,
            retry_count_on_stall: 0,
        }]
    }

    fn call(tool: String, args: String, ctx: CallContext) -> Result<String, ToolError> {
        if tool != "legacy_echo" {
            return Err(ToolError::Failed(format!("no tool named {tool}")));
        }
        helpers::log(Level::Info, &format!("{} called {tool}", ctx.tenant));
        let calls = match helpers::kv_get("calls").map_err(ToolError::Failed)? {
            Some(bytes) => u64::from_le_bytes(bytes.try_into().unwrap_or_default()) + 1,
            None => 1,
        };
        helpers::kv_set("calls", &calls.to_le_bytes()).map_err(ToolError::Failed)?;
        let stats = tools::call_tool("text_stats", &args).map_err(ToolError::Failed)?;
        Ok(format!(
            r#"{{"args":{args},"calls":{calls},"stats":{stats}}}"#
        ))
    }
}

export!(Legacy with_types_in bindings);
