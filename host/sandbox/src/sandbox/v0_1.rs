//! `toolhost:plugin@0.1.0`, as released: components built against it keep working. Its
//! imports are served by the current host code and its exports are mapped onto the current
//! types, so nothing else in the host knows which version a component was built against.

use wasmtime::component::{HasSelf, Linker};

use super::CallState;
use super::bindings::toolhost::plugin as current;

mod bindings {
    #![allow(missing_docs)]
    wasmtime::component::bindgen!({
        path: "wit/v0.1.0",
        world: "toolhost:plugin/plugin@0.1.0",
        imports: {
            "toolhost:plugin/helpers.kv-get": async,
            "toolhost:plugin/helpers.kv-set": async,
            "toolhost:plugin/helpers.kv-delete": async,
            "toolhost:plugin/helpers.config-get": async,
        },
        exports: { default: async },
    });
}

use bindings::toolhost::plugin::{helpers, types};
pub(crate) use bindings::{Plugin, PluginPre};

/// Adds 0.1.0's `types` and `helpers`; `tools.call-tool` is linked by hand with the current one.
pub(super) fn add_to_linker(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    types::add_to_linker::<CallState, HasSelf<CallState>>(linker, |state| state)?;
    helpers::add_to_linker::<CallState, HasSelf<CallState>>(linker, |state| state)
}

impl types::Host for CallState {}

impl helpers::Host for CallState {
    fn log(&mut self, level: helpers::Level, message: String) {
        let level = match level {
            helpers::Level::Trace => current::helpers::Level::Trace,
            helpers::Level::Debug => current::helpers::Level::Debug,
            helpers::Level::Info => current::helpers::Level::Info,
            helpers::Level::Warn => current::helpers::Level::Warn,
            helpers::Level::Error => current::helpers::Level::Error,
        };
        current::helpers::Host::log(self, level, message)
    }

    async fn kv_get(&mut self, key: String) -> Result<Option<Vec<u8>>, String> {
        current::helpers::Host::kv_get(self, key).await
    }

    async fn kv_set(&mut self, key: String, value: Vec<u8>) -> Result<(), String> {
        current::helpers::Host::kv_set(self, key, value).await
    }

    async fn kv_delete(&mut self, key: String) -> Result<bool, String> {
        current::helpers::Host::kv_delete(self, key).await
    }

    async fn config_get(&mut self, key: String) -> Result<Option<String>, String> {
        current::helpers::Host::config_get(self, key).await
    }
}

/// 0.1.0 has no `output-schema`.
impl From<types::ToolDef> for current::types::ToolDef {
    fn from(def: types::ToolDef) -> Self {
        current::types::ToolDef {
            name: def.name,
            description: def.description,
            parameters: def.parameters,
            strict: def.strict,
            group: def.group,
            private: def.private,
            limits: current::types::Limits {
                timeout_ms: def.limits.timeout_ms,
                fuel: def.limits.fuel,
                memory_bytes: def.limits.memory_bytes,
                max_result_chars: def.limits.max_result_chars,
            },
            cache: def.cache.map(|cache| current::types::CachePolicy {
                ttl_ms: cache.ttl_ms,
                key_path: cache.key_path,
            }),
            config: def.config,
            needs_approval: def.needs_approval,
            idempotent: def.idempotent,
            retry_count_on_stall: def.retry_count_on_stall,
            output_schema: None,
        }
    }
}

impl From<types::ToolError> for current::types::ToolError {
    fn from(error: types::ToolError) -> Self {
        match error {
            types::ToolError::InvalidArgs(message) => Self::InvalidArgs(message),
            types::ToolError::Failed(message) => Self::Failed(message),
        }
    }
}

impl From<&current::types::CallContext> for types::CallContext {
    fn from(ctx: &current::types::CallContext) -> Self {
        types::CallContext {
            tenant: ctx.tenant.clone(),
            call_id: ctx.call_id.clone(),
            tool: ctx.tool.clone(),
            data: ctx.data.clone(),
        }
    }
}
