//! The host's helpers as JS globals: `toolhost.log/kv/config/callTool` and `console`.

use rquickjs::function::Rest;
use rquickjs::{Ctx, Exception, Function, Object, Value};

use crate::bindings::toolhost::plugin::helpers::{self, Level};
use crate::bindings::toolhost::plugin::tools;

fn throw(ctx: &Ctx<'_>, message: &str) -> rquickjs::Error {
    Exception::throw_message(ctx, message)
}

/// `toolhost.log/kv/config/callTool` and `console.log/info/debug/warn/error`.
pub fn install(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
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

pub fn display(value: &Value<'_>) -> String {
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
