//! The JavaScript runtime for stored-source JS tools: QuickJS (through rquickjs) in one
//! component that takes a tool's source at call time, so a new JS tool needs no compilation.
//!
//! A tool is an ES module whose default export is `(args, ctx) => result` (or a promise of
//! one). Globals: the host's helpers (`toolhost`, `console`, in `toolhost_api`) and the web
//! platform's minimum common API (`fetch`, timers, encoders, `URL`, `crypto`, …, in `web`).
//!
//! `init` evaluates a tool's module ahead of time so the host can snapshot this instance's
//! memory (wasmtime-wizer): a call that starts from the snapshot finds the module ready and
//! only runs its handler.

use std::cell::RefCell;

use rquickjs::{
    CaughtError, Context, Ctx, Exception, Function, Module, Object, Persistent, Runtime, Value,
};

mod toolhost_api;
mod web;

mod bindings {
    #![allow(clippy::too_many_arguments)] // generated code
    wit_bindgen::generate!({
        path: "../wit",
        world: "toolhost:plugin/js-runtime@0.2.0",
    });
}

use bindings::toolhost::plugin::types::{CallContext, ToolError};
use bindings::{Guest, export};

/// The module name errors and stacks show.
const MODULE: &str = "tool.js";

/// A tool's module, evaluated, with the runtime that holds it.
struct Loaded {
    source: String,
    handler: Persistent<Function<'static>>,
    event_loop: Persistent<Object<'static>>,
    // Dropped last: the persistent values above live in it.
    context: Context,
    runtime: Runtime,
}

thread_local! {
    /// Set by `init`, so it is in the snapshot; a call of the same source starts from it.
    static LOADED: RefCell<Option<Loaded>> = const { RefCell::new(None) };
}

struct JsRuntime;

impl Guest for JsRuntime {
    fn describe(source: String) -> Result<String, String> {
        let (_runtime, context) = start()?;
        context.with(|ctx| {
            let caught = |e| describe(&CaughtError::from_error(&ctx, e));
            web::begin_call();
            install_globals(&ctx).map_err(caught)?;
            let module = evaluate(&ctx, source).map_err(caught)?;
            let missing = || "the module has no `spec` export: `export const spec = {name, description, parameters}`";
            let spec: Value = module.get("spec").map_err(|_| missing().to_owned())?;
            if spec.is_undefined() {
                return Err(missing().into());
            }
            match ctx.json_stringify(spec).map_err(caught)? {
                Some(text) => text.to_string().map_err(caught),
                None => Err("`spec` has no JSON form".into()),
            }
        })
    }

    fn init(source: String) -> Result<(), String> {
        web::begin_call();
        let message = |e| match e {
            ToolError::Failed(message) | ToolError::InvalidArgs(message) => message,
        };
        let loaded = load(source).map_err(message)?;
        // Ready in the snapshot: the web platform, and a heap just collected, so a call does
        // not start with a collection of everything `init` left.
        loaded.context.with(|ctx| {
            let caught = |e| describe(&CaughtError::from_error(&ctx, e));
            let event_loop = loaded.event_loop.clone().restore(&ctx).map_err(caught)?;
            let load_web: Function = event_loop.get("load").map_err(caught)?;
            load_web.call::<_, Value>(()).map_err(caught)?;
            Ok::<_, String>(())
        })?;
        loaded.runtime.run_gc();
        LOADED.with(|slot| *slot.borrow_mut() = Some(loaded));
        Ok(())
    }

    fn run(source: String, args: String, call: CallContext) -> Result<String, ToolError> {
        web::begin_call();
        let loaded = match LOADED.with(|slot| slot.borrow_mut().take()) {
            Some(loaded) if loaded.source == source => loaded,
            _ => load(source)?,
        };
        let context = loaded.context.clone();
        let result = context.with(|ctx| {
            let caught = |e| ToolError::Failed(describe(&CaughtError::from_error(&ctx, e)));
            let handler = loaded.handler.clone().restore(&ctx).map_err(caught)?;
            let event_loop = loaded.event_loop.clone().restore(&ctx).map_err(caught)?;
            let args = ctx.json_parse(args).map_err(caught)?;
            let call_ctx = Object::new(ctx.clone()).map_err(caught)?;
            call_ctx.set("tenant", call.tenant).map_err(caught)?;
            call_ctx.set("callId", call.call_id).map_err(caught)?;
            call_ctx.set("tool", call.tool).map_err(caught)?;
            let data = ctx.json_parse(call.data).map_err(caught)?;
            call_ctx.set("data", data).map_err(caught)?;
            let result: Value = handler.call((args, call_ctx)).map_err(caught)?;
            let result = settle(&ctx, &event_loop, result).map_err(caught)?;
            match ctx.json_stringify(result).map_err(caught)? {
                Some(text) => text.to_string().map_err(caught),
                // `undefined` (or a function) has no JSON form.
                None => Ok("null".to_owned()),
            }
        });
        // Kept rather than freed: tearing QuickJS down costs more than the call, and the
        // instance ends with the call anyway.
        LOADED.with(|slot| *slot.borrow_mut() = Some(loaded));
        result
    }
}

/// A fresh QuickJS runtime and context.
fn start() -> Result<(Runtime, Context), String> {
    let runtime = Runtime::new().map_err(|e| format!("starting QuickJS: {e}"))?;
    let context = Context::full(&runtime).map_err(|e| format!("starting QuickJS: {e}"))?;
    Ok((runtime, context))
}

/// A runtime with the globals installed and `source` evaluated.
fn load(source: String) -> Result<Loaded, ToolError> {
    let (runtime, context) = start().map_err(ToolError::Failed)?;
    let (handler, event_loop) = context.with(|ctx| {
        let caught = |e| ToolError::Failed(describe(&CaughtError::from_error(&ctx, e)));
        let event_loop = install_globals(&ctx).map_err(caught)?;
        let module = evaluate(&ctx, source.clone()).map_err(caught)?;
        let handler: Function = module.get("default").map_err(|_| {
            ToolError::Failed(
                "the module has no default export: `export default (args, ctx) => …`".into(),
            )
        })?;
        Ok::<_, ToolError>((
            Persistent::save(&ctx, handler),
            Persistent::save(&ctx, event_loop),
        ))
    })?;
    Ok(Loaded {
        source,
        handler,
        event_loop,
        context,
        runtime,
    })
}

/// The host's helpers and the web platform; returns the event loop's hooks.
fn install_globals<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Object<'js>> {
    toolhost_api::install(ctx)?;
    web::install(ctx)
}

/// Declares and evaluates the tool's module, running its top-level `await`s to the end.
fn evaluate<'js>(
    ctx: &Ctx<'js>,
    source: String,
) -> rquickjs::Result<Module<'js, rquickjs::module::Evaluated>> {
    let module = Module::declare(ctx.clone(), MODULE, source)?;
    let (module, evaluated) = module.eval()?;
    evaluated.finish::<()>()?;
    Ok(module)
}

/// The value a handler's promise settles to: runs queued jobs, and sleeps until the next
/// timer while the promise waits on one. The host's deadline bounds the whole wait.
fn settle<'js>(
    ctx: &Ctx<'js>,
    event_loop: &Object<'js>,
    value: Value<'js>,
) -> rquickjs::Result<Value<'js>> {
    let Some(promise) = value.as_promise().cloned() else {
        return Ok(value);
    };
    let next: Function = event_loop.get("next")?;
    let fire: Function = event_loop.get("fire")?;
    loop {
        while ctx.execute_pending_job() {}
        if let Some(result) = promise.result::<Value>() {
            return result;
        }
        match next.call::<_, Option<f64>>(())? {
            Some(wait_ms) => {
                web::sleep_ms(wait_ms);
                fire.call::<_, ()>(())?;
            }
            None => {
                return Err(Exception::throw_message(
                    ctx,
                    "the handler's promise never settles: no timer or other pending work is left that could settle it",
                ));
            }
        }
    }
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
        CaughtError::Value(value) => format!("uncaught: {}", toolhost_api::display(value)),
        CaughtError::Error(error) => error.to_string(),
    }
}

export!(JsRuntime with_types_in bindings);
