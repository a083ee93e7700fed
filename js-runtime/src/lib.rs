//! The JavaScript runtime for stored-source JS tools: QuickJS (through rquickjs) in one
//! component that takes a tool's source at call time, so a new JS tool needs no compilation.
//!
//! A tool is an ES module whose default export is `(args, ctx) => result` (or a promise of
//! one). A global `toolhost` object carries the host's helpers.

use rquickjs::function::Rest;
use rquickjs::{CaughtError, Context, Ctx, Exception, Function, Module, Object, Runtime, Value};

mod bindings {
    #![allow(clippy::too_many_arguments)] // generated code
    wit_bindgen::generate!({
        path: "../wit",
        world: "toolhost:plugin/js-runtime@0.2.0",
    });
}

use bindings::toolhost::plugin::helpers::{self, Level};
use bindings::toolhost::plugin::tools;
use bindings::toolhost::plugin::types::{CallContext, ToolError};
use bindings::{Guest, export};

/// The module name errors and stacks show.
const MODULE: &str = "tool.js";

struct JsRuntime;

impl Guest for JsRuntime {
    fn describe(source: String) -> Result<String, String> {
        with_context(
            |e| e,
            |ctx| {
                let caught = |e| describe(&CaughtError::from_error(&ctx, e));
                install_globals(&ctx).map_err(caught)?;
                let module = Module::declare(ctx.clone(), MODULE, source).map_err(caught)?;
                let (module, evaluated) = module.eval().map_err(caught)?;
                evaluated.finish::<()>().map_err(caught)?;
                let missing = || "the module has no `spec` export: `export const spec = {name, description, parameters}`";
                let spec: Value = module.get("spec").map_err(|_| missing().to_owned())?;
                if spec.is_undefined() {
                    return Err(missing().into());
                }
                match ctx.json_stringify(spec).map_err(caught)? {
                    Some(text) => text.to_string().map_err(caught),
                    None => Err("`spec` has no JSON form".into()),
                }
            },
        )
    }

    fn run(source: String, args: String, call: CallContext) -> Result<String, ToolError> {
        with_context(ToolError::Failed, |ctx| {
            let caught = |e| ToolError::Failed(describe(&CaughtError::from_error(&ctx, e)));
            install_globals(&ctx).map_err(caught)?;
            let module = Module::declare(ctx.clone(), MODULE, source).map_err(caught)?;
            let (module, evaluated) = module.eval().map_err(caught)?;
            evaluated.finish::<()>().map_err(caught)?;
            let handler: Function = module.get("default").map_err(|_| {
                ToolError::Failed(
                    "the module has no default export: `export default (args, ctx) => …`".into(),
                )
            })?;
            let args = ctx.json_parse(args).map_err(caught)?;
            let call_ctx = Object::new(ctx.clone()).map_err(caught)?;
            call_ctx.set("tenant", call.tenant).map_err(caught)?;
            call_ctx.set("callId", call.call_id).map_err(caught)?;
            call_ctx.set("tool", call.tool).map_err(caught)?;
            let data = ctx.json_parse(call.data).map_err(caught)?;
            call_ctx.set("data", data).map_err(caught)?;
            let mut result: Value = handler.call((args, call_ctx)).map_err(caught)?;
            if let Some(promise) = result.as_promise() {
                result = promise.finish::<Value>().map_err(caught)?;
            }
            match ctx.json_stringify(result).map_err(caught)? {
                Some(text) => text.to_string().map_err(caught),
                // `undefined` (or a function) has no JSON form.
                None => Ok("null".to_owned()),
            }
        })
    }
}

/// A fresh QuickJS runtime and context for one call (the instance is fresh anyway).
fn with_context<T, E>(
    fail: impl Fn(String) -> E,
    f: impl FnOnce(Ctx<'_>) -> Result<T, E>,
) -> Result<T, E> {
    let runtime = Runtime::new().map_err(|e| fail(format!("starting QuickJS: {e}")))?;
    let context = Context::full(&runtime).map_err(|e| fail(format!("starting QuickJS: {e}")))?;
    context.with(f)
}

/// `Name: message` and the stack, with the line and column of `tool.js` where there is one.
fn describe(error: &CaughtError<'_>) -> String {
    match error {
        CaughtError::Exception(exception) => {
            let name: String = exception
                .get::<_, String>("name")
                .unwrap_or_else(|_| "Error".into());
            let message = exception.message().unwrap_or_default();
            let stack = exception.stack().unwrap_or_default();
            let at = stack
                .lines()
                .find_map(|line| line.trim().strip_prefix(&format!("at {MODULE}:")))
                .or_else(|| {
                    stack
                        .split(&format!("{MODULE}:"))
                        .nth(1)
                        .map(|rest| rest.trim_end_matches(')'))
                })
                .and_then(|pos| {
                    let mut parts = pos.split(':');
                    Some((
                        parts.next()?.trim().to_owned(),
                        parts.next()?.trim().to_owned(),
                    ))
                });
            let mut text = format!("{name}: {message}");
            if let Some((line, column)) = at {
                let column = column.trim_end_matches(')');
                text.push_str(&format!(" (line {line}, column {column})"));
            }
            if !stack.trim().is_empty() {
                text.push('\n');
                text.push_str(stack.trim_end());
            }
            text
        }
        CaughtError::Value(value) => format!("uncaught: {value:?}"),
        CaughtError::Error(error) => error.to_string(),
    }
}

fn throw(ctx: &Ctx<'_>, message: &str) -> rquickjs::Error {
    Exception::throw_message(ctx, message)
}

/// `toolhost.log/kv/config/callTool` and `console.log`.
fn install_globals(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    let host = Object::new(ctx.clone())?;
    host.set("log", Function::new(ctx.clone(), log)?)?;
    let kv = Object::new(ctx.clone())?;
    kv.set("get", Function::new(ctx.clone(), kv_get)?)?;
    kv.set("set", Function::new(ctx.clone(), kv_set)?)?;
    kv.set("delete", Function::new(ctx.clone(), kv_delete)?)?;
    host.set("kv", kv)?;
    let config = Object::new(ctx.clone())?;
    config.set("get", Function::new(ctx.clone(), config_get)?)?;
    host.set("config", config)?;
    host.set("callTool", Function::new(ctx.clone(), call_tool)?)?;
    ctx.globals().set("toolhost", host)?;

    let console = Object::new(ctx.clone())?;
    console.set("log", Function::new(ctx.clone(), console_info)?)?;
    console.set("info", Function::new(ctx.clone(), console_info)?)?;
    console.set("debug", Function::new(ctx.clone(), console_debug)?)?;
    console.set("warn", Function::new(ctx.clone(), console_warn)?)?;
    console.set("error", Function::new(ctx.clone(), console_error)?)?;
    ctx.globals().set("console", console)?;
    Ok(())
}

fn log(level: String, message: String) {
    helpers::log(level_of(&level), &message);
}

fn kv_get(ctx: Ctx<'_>, key: String) -> rquickjs::Result<Option<String>> {
    match helpers::kv_get(&key) {
        Ok(value) => Ok(value.map(|bytes| String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) => Err(throw(&ctx, &e)),
    }
}

fn kv_set(ctx: Ctx<'_>, key: String, value: String) -> rquickjs::Result<()> {
    helpers::kv_set(&key, value.as_bytes()).map_err(|e| throw(&ctx, &e))
}

fn kv_delete(ctx: Ctx<'_>, key: String) -> rquickjs::Result<bool> {
    helpers::kv_delete(&key).map_err(|e| throw(&ctx, &e))
}

fn config_get(ctx: Ctx<'_>, key: String) -> rquickjs::Result<Option<String>> {
    helpers::config_get(&key).map_err(|e| throw(&ctx, &e))
}

/// The other tool's result, or a thrown `Error("code: message")`.
fn call_tool<'js>(ctx: Ctx<'js>, name: String, args: Value<'js>) -> rquickjs::Result<Value<'js>> {
    let text = ctx
        .json_stringify(args)?
        .map_or_else(|| Ok("{}".to_owned()), |s| s.to_string())?;
    match tools::call_tool(&name, &text) {
        Ok(result) => ctx.json_parse(result),
        Err(e) => Err(throw(&ctx, &e)),
    }
}

fn console_line(level: Level, parts: Rest<Value<'_>>) {
    let line: Vec<String> = parts.0.iter().map(display).collect();
    helpers::log(level, &line.join(" "));
}

fn console_info(parts: Rest<Value<'_>>) {
    console_line(Level::Info, parts);
}

fn console_debug(parts: Rest<Value<'_>>) {
    console_line(Level::Debug, parts);
}

fn console_warn(parts: Rest<Value<'_>>) {
    console_line(Level::Warn, parts);
}

fn console_error(parts: Rest<Value<'_>>) {
    console_line(Level::Error, parts);
}

fn display(value: &Value<'_>) -> String {
    if let Some(s) = value.as_string() {
        return s.to_string().unwrap_or_default();
    }
    value
        .ctx()
        .json_stringify(value.clone())
        .ok()
        .flatten()
        .and_then(|s| s.to_string().ok())
        .unwrap_or_else(|| format!("{value:?}"))
}

fn level_of(level: &str) -> Level {
    match level {
        "trace" => Level::Trace,
        "debug" => Level::Debug,
        "warn" => Level::Warn,
        "error" => Level::Error,
        _ => Level::Info,
    }
}

export!(JsRuntime with_types_in bindings);
