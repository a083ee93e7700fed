//! Hooks the embedding app registers around every call, direct or through `tool_call`.

use serde_json::Value;

use toolhost_spec::call::CallOutcome;

/// One call as a hook sees it: after its arguments passed the schema, before it runs.
#[derive(Debug, Clone, Copy)]
pub struct HookCall<'a> {
    /// The calling tenant.
    pub tenant: &'a str,
    /// The tool, by name.
    pub tool: &'a str,
    /// 0 for a native tool.
    pub version: u32,
    /// The call's id.
    pub call_id: &'a str,
    /// The validated arguments.
    pub args: &'a Value,
    /// The caller's opaque data (`Caller::data`).
    pub data: &'a Value,
}

/// Runs on the caller's task, so it should be quick: it sits in every call's path.
pub trait CallHook: Send + Sync + 'static {
    /// `Err(reason)` stops the call with a `denied` outcome that carries the reason.
    fn before(&self, call: &HookCall<'_>) -> Result<(), String> {
        let _ = call;
        Ok(())
    }

    /// Sees every outcome of a call that reached `before`, including failures.
    fn after(&self, call: &HookCall<'_>, outcome: &CallOutcome) {
        let _ = (call, outcome);
    }
}
