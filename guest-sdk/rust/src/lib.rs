//! Write toolhost tools in Rust.
//!
//! A tool is a function from a `serde` argument type to a `serde` result. Its JSON Schema is
//! derived from the argument type with `schemars`, so the schema the agent sees and the type
//! the function receives cannot drift apart.
//!
//! ```ignore
//! use toolhost_sdk::{export_tools, Context, JsonSchema, Tool, ToolError};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize, JsonSchema)]
//! struct Args {
//!     /// The text to count words in.
//!     text: String,
//! }
//!
//! fn word_count(args: Args, _ctx: &Context) -> Result<usize, ToolError> {
//!     Ok(args.text.split_whitespace().count())
//! }
//!
//! export_tools!(Tool::new("word_count", "Counts the words in a text.", word_count));
//! ```

#[doc(hidden)]
#[allow(clippy::too_many_arguments)] // generated code
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "toolhost:plugin/plugin@0.2.0",
        pub_export_macro: true,
        export_macro_name: "__export_plugin",
        default_bindings_module: "toolhost_sdk::bindings",
    });
}

use bindings::toolhost::plugin::{helpers, types};
pub use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
pub use serde_json::{Value, json};

/// Who is calling: supplied by the host, never by the model.
#[derive(Debug, Clone)]
pub struct Context {
    /// The tenant whose agent made the call. Scope anything tenant-specific by this.
    pub tenant: String,
    /// Unique per call.
    pub call_id: String,
    /// The tool being called.
    pub tool: String,
    /// JSON the embedding application attached to the call (`Value::Null` if none).
    pub data: Value,
}

/// A failure the tool reports to the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolError {
    /// The arguments passed the schema but cannot be used (say, an unknown unit).
    InvalidArgs(String),
    /// The tool ran and failed.
    Failed(String),
}

impl ToolError {
    pub fn invalid_args(message: impl std::fmt::Display) -> Self {
        Self::InvalidArgs(message.to_string())
    }

    pub fn failed(message: impl std::fmt::Display) -> Self {
        Self::Failed(message.to_string())
    }
}

type Run = Box<dyn Fn(&str, &Context) -> Result<String, ToolError>>;

/// One tool: its definition for the agent and the function that runs it.
pub struct Tool {
    /// Everything but the schema, which only `list-tools` needs: deriving it on every call
    /// would cost more than most tools' own work.
    def: types::ToolDef,
    parameters: Schema,
    output_schema: Option<Schema>,
    run: Run,
}

/// A schema, derived only when `list-tools` asks for it.
type Schema = Box<dyn Fn() -> Value>;

impl Tool {
    /// A tool whose arguments are `A` (schema derived from it) and whose result is `R`.
    pub fn new<A, R, F>(name: &str, description: &str, f: F) -> Self
    where
        A: DeserializeOwned + JsonSchema,
        R: Serialize,
        F: Fn(A, &Context) -> Result<R, ToolError> + 'static,
    {
        let run = move |args: &str, ctx: &Context| {
            let args: A = serde_json::from_str(args).map_err(ToolError::invalid_args)?;
            let result = f(args, ctx)?;
            serde_json::to_string(&result).map_err(ToolError::failed)
        };
        let schema: fn() -> Value = schema_of::<A>;
        Self::build(name, description, Box::new(schema), Box::new(run))
    }

    /// A tool that takes and returns JSON text as is, with a hand-written schema. The host
    /// checks that the returned text is JSON; prefer [`Tool::new`].
    pub fn raw(
        name: &str,
        description: &str,
        parameters: Value,
        run: impl Fn(&str, &Context) -> Result<String, ToolError> + 'static,
    ) -> Self {
        Self::build(
            name,
            description,
            Box::new(move || parameters.clone()),
            Box::new(run),
        )
    }

    fn build(name: &str, description: &str, parameters: Schema, run: Run) -> Self {
        let def = types::ToolDef {
            name: name.to_owned(),
            description: description.to_owned(),
            parameters: String::new(),
            strict: false,
            group: None,
            private: false,
            limits: types::Limits {
                timeout_ms: None,
                fuel: None,
                memory_bytes: None,
                max_result_chars: None,
            },
            cache: None,
            config: Vec::new(),
            needs_approval: false,
            idempotent: false,
            retry_count_on_stall: 0,
            output_schema: None,
        };
        Tool {
            def,
            parameters,
            output_schema: None,
            run,
        }
    }

    /// Reject arguments with properties the schema does not declare.
    pub fn strict(mut self) -> Self {
        self.def.strict = true;
        self
    }

    /// Declares that every result is an `R` (a struct: the schema must be an object). The host
    /// checks each result against `R`'s schema (a mismatch is `invalid_output`), and MCP
    /// clients get it as `outputSchema` with the result as `structuredContent`.
    pub fn output_schema<R: JsonSchema>(mut self) -> Self {
        let schema: fn() -> Value = schema_of::<R>;
        self.output_schema = Some(Box::new(schema));
        self
    }

    /// [`Tool::output_schema`] with a hand-written JSON Schema.
    pub fn raw_output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(Box::new(move || schema.clone()));
        self
    }

    /// Group related tools in listings.
    pub fn group(mut self, group: &str) -> Self {
        self.def.group = Some(group.to_owned());
        self
    }

    /// Callable by the host application only, never listed to an agent.
    pub fn private(mut self) -> Self {
        self.def.private = true;
        self
    }

    /// Wall-clock time for one call (the host's default is 30 s, its cap 120 s).
    pub fn timeout_ms(mut self, ms: u64) -> Self {
        self.def.limits.timeout_ms = Some(ms);
        self
    }

    /// WebAssembly fuel for one call, about one unit per instruction.
    pub fn fuel(mut self, fuel: u64) -> Self {
        self.def.limits.fuel = Some(fuel);
        self
    }

    /// Linear memory for one call, in bytes (the host's default is 64 MiB).
    pub fn memory_bytes(mut self, bytes: u64) -> Self {
        self.def.limits.memory_bytes = Some(bytes);
        self
    }

    /// The result's size in characters before the host clips it (default 16384).
    pub fn max_result_chars(mut self, chars: u64) -> Self {
        self.def.limits.max_result_chars = Some(chars);
        self
    }

    /// Reuse results for `ttl_ms` between calls whose arguments hold the same value at
    /// `key_path` (a JSONPath without wildcards: `"$"`, `"$.city"`).
    pub fn cache(mut self, ttl_ms: u64, key_path: &str) -> Self {
        self.def.cache = Some(types::CachePolicy {
            ttl_ms,
            key_path: key_path.to_owned(),
        });
        self
    }

    /// The tenant configuration keys this tool reads with [`config::get`].
    pub fn config(mut self, keys: &[&str]) -> Self {
        self.def.config = keys.iter().map(|k| k.to_string()).collect();
        self
    }

    /// Every call waits until the embedding app approves it.
    pub fn needs_approval(mut self) -> Self {
        self.def.needs_approval = true;
        self
    }

    /// Running a call twice has the same effect as once; with `retries > 0`, a call that
    /// timed out is run again up to `retries` times (at most 5).
    pub fn idempotent(mut self, retries_on_stall: u32) -> Self {
        self.def.idempotent = true;
        self.def.retry_count_on_stall = retries_on_stall;
        self
    }
}

/// Outbound HTTP through `wasi:http` (the `http` feature). The host sends a request only to
/// destinations the tenant granted this tool; any other gets an error that says it was denied.
#[cfg(feature = "http")]
pub use toolhost_guest_http as http;

/// Other tools of the same tenant, called through the host's whole pipeline (validation,
/// policy, limits), within this call's remaining time and fuel.
pub mod tools {
    use super::Value;

    /// The tool's JSON result, or `code: message` (for example `not_found: no tool named …`).
    pub fn call(name: &str, arguments: &Value) -> Result<Value, String> {
        let text =
            super::bindings::toolhost::plugin::tools::call_tool(name, &arguments.to_string())?;
        serde_json::from_str(&text).map_err(|e| format!("invalid_output: {e}"))
    }
}

/// A key-value store private to this tool and tenant that persists across calls.
pub mod kv {
    use super::helpers;

    pub fn get(key: &str) -> Result<Option<Vec<u8>>, String> {
        helpers::kv_get(key)
    }

    pub fn set(key: &str, value: &[u8]) -> Result<(), String> {
        helpers::kv_set(key, value)
    }

    /// Whether the key existed.
    pub fn delete(key: &str) -> Result<bool, String> {
        helpers::kv_delete(key)
    }
}

/// The tenant's configuration: keys the tool declared with [`Tool::config`].
pub mod config {
    pub fn get(key: &str) -> Result<Option<String>, String> {
        super::helpers::config_get(key)
    }
}

/// The JSON Schema of `A`, inlined (no `$ref`s), as models read it best.
pub fn schema_of<A: JsonSchema>() -> Value {
    let settings = schemars::generate::SchemaSettings::draft2020_12().with(|s| {
        s.inline_subschemas = true;
        s.meta_schema = None;
    });
    let mut schema = settings
        .into_generator()
        .into_root_schema_for::<A>()
        .to_value();
    if let Some(map) = schema.as_object_mut() {
        map.remove("title");
    }
    schema
}

/// Log lines that the host returns with the call's result.
pub mod log {
    use super::helpers::{Level, log};

    pub fn debug(message: &str) {
        log(Level::Debug, message);
    }
    pub fn info(message: &str) {
        log(Level::Info, message);
    }
    pub fn warn(message: &str) {
        log(Level::Warn, message);
    }
    pub fn error(message: &str) {
        log(Level::Error, message);
    }
}

#[doc(hidden)]
pub mod __private {
    use super::*;

    pub fn list_tools(tools: Vec<Tool>) -> Vec<types::ToolDef> {
        tools
            .into_iter()
            .map(|tool| types::ToolDef {
                parameters: (tool.parameters)().to_string(),
                output_schema: tool.output_schema.map(|schema| schema().to_string()),
                ..tool.def
            })
            .collect()
    }

    pub fn call(
        tools: Vec<Tool>,
        name: String,
        args: String,
        ctx: types::CallContext,
    ) -> Result<String, types::ToolError> {
        let tool = tools
            .iter()
            .find(|tool| tool.def.name == name)
            .ok_or_else(|| {
                types::ToolError::Failed(format!("this component has no tool named `{name}`"))
            })?;
        let ctx = Context {
            tenant: ctx.tenant,
            call_id: ctx.call_id,
            tool: ctx.tool,
            data: serde_json::from_str(&ctx.data).unwrap_or(Value::Null),
        };
        (tool.run)(&args, &ctx).map_err(|e| match e {
            ToolError::InvalidArgs(m) => types::ToolError::InvalidArgs(m),
            ToolError::Failed(m) => types::ToolError::Failed(m),
        })
    }
}

/// Exports one or several tools as this component's tools.
///
/// ```ignore
/// toolhost_sdk::export_tools!(
///     Tool::new("add", "Adds two numbers.", add),
///     Tool::new("mul", "Multiplies two numbers.", mul).strict(),
/// );
/// ```
#[macro_export]
macro_rules! export_tools {
    ($($tool:expr),+ $(,)?) => {
        fn __toolhost_tools() -> ::std::vec::Vec<$crate::Tool> {
            ::std::vec![$($tool),+]
        }

        struct __ToolhostPlugin;

        impl $crate::bindings::Guest for __ToolhostPlugin {
            fn list_tools() -> ::std::vec::Vec<$crate::bindings::ToolDef> {
                $crate::__private::list_tools(__toolhost_tools())
            }

            fn call(
                tool: ::std::string::String,
                args: ::std::string::String,
                ctx: $crate::bindings::CallContext,
            ) -> ::std::result::Result<::std::string::String, $crate::bindings::ToolError> {
                $crate::__private::call(__toolhost_tools(), tool, args, ctx)
            }
        }

        $crate::bindings::__export_plugin!(__ToolhostPlugin);
    };
}
