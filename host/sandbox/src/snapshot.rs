//! Pre-initialised JavaScript tools. The JS runtime evaluates a tool's module once (its
//! `init` export); wasmtime-wizer then snapshots that instance into a component of its own,
//! whose memory starts with the module ready, so a call from it only runs the handler.
//!
//! `init` runs as an install does: no helpers, no grants. What its top-level code reads from
//! the clock at that moment is what every call from the snapshot sees.

use wasmtime::Store;
use wasmtime::component::{ComponentNamedList, Instance, Lift, WasmList};
use wasmtime_wizer::{ComponentInstanceState, Wizer};

use crate::sandbox::{CallState, INSTALLS, LoadError, Permissions, Prepared, Run, Sandbox};
use crate::{Fault, Helpers};
use toolhost_spec::spec::Limits;

/// The JS runtime instrumented for snapshots. Compile and load it once (like any component)
/// and hand it to [`Sandbox::snapshot_js`] with the runtime it came from.
pub fn instrument_js_runtime(runtime: &[u8]) -> Result<Vec<u8>, LoadError> {
    let (_, instrumented) = Wizer::new()
        .instrument_component(runtime)
        .map_err(|e| LoadError::Compile(format!("instrumenting the JS runtime: {e:#}")))?;
    Ok(instrumented)
}

impl Sandbox {
    /// A component of the JS `runtime` with the module `source` evaluated in its memory, as
    /// bytes to compile. `instrumented` is the runtime after [`instrument_js_runtime`],
    /// loaded. `Ok(Err(message))` when the module itself fails to evaluate.
    pub async fn snapshot_js(
        &self,
        runtime: std::sync::Arc<[u8]>,
        instrumented: &Prepared,
        source: &str,
        limits: &Limits,
    ) -> Run<Result<Vec<u8>, String>> {
        let Some(pre) = instrumented.js.clone() else {
            return Run::host_fault("not the instrumented JavaScript runtime");
        };
        let source = source.to_owned();
        let nothing = Permissions::default();
        self.run(INSTALLS, limits, Helpers::default(), &nothing, |store| {
            Box::pin(async move {
                let wizer = Wizer::new();
                let (cx, _) = wizer.instrument_component(&runtime)?;
                let instance = pre.instance_pre().instantiate_async(&mut *store).await?;
                let js = crate::sandbox::JsRuntime::new(&mut *store, &instance)?;
                if let Err(message) = js.call_init(&mut *store, &source).await? {
                    return Ok(Err(message));
                }
                // Reading the state back is the host's work, not the guest's: not metered.
                let fuel = store.get_fuel()?;
                store.set_fuel(1 << 50)?;
                store.set_epoch_deadline(1 << 40);
                let mut access = Access {
                    store,
                    instance,
                    failed: None,
                };
                let snapshot = wizer.snapshot_component(&cx, &mut access).await?;
                let failed = access.failed.take();
                access.store.set_fuel(fuel)?;
                match failed {
                    Some(error) => Err(error),
                    None => Ok(Ok(snapshot)),
                }
            })
        })
        .await
    }
}

/// What wizer reads the instance's memories and globals through: the accessors its
/// instrumentation exported. An error is kept (the trait cannot return one) and reported
/// once the snapshot is done.
struct Access<'a> {
    store: &'a mut Store<CallState>,
    instance: Instance,
    failed: Option<wasmtime::Error>,
}

impl Access<'_> {
    async fn call<R>(&mut self, instance: &str, func: &str) -> Option<R>
    where
        (R,): ComponentNamedList + Lift + Send + Sync + 'static,
        R: Send + Sync,
    {
        if self.failed.is_some() {
            return None;
        }
        let result = async {
            let missing =
                || wasmtime::format_err!("the snapshot accessor {instance}#{func} is missing");
            let (_, exports) = self
                .instance
                .get_export(&mut *self.store, None, instance)
                .ok_or_else(missing)?;
            let (_, export) = self
                .instance
                .get_export(&mut *self.store, Some(&exports), func)
                .ok_or_else(missing)?;
            let func = self
                .instance
                .get_typed_func::<(), (R,)>(&mut *self.store, export)?;
            let (value,) = func.call_async(&mut *self.store, ()).await?;
            Ok::<_, wasmtime::Error>(value)
        }
        .await;
        match result {
            Ok(value) => Some(value),
            Err(error) => {
                self.failed = Some(error);
                None
            }
        }
    }
}

impl ComponentInstanceState for Access<'_> {
    async fn call_func_ret_list_u8(
        &mut self,
        instance: &str,
        func: &str,
        contents: impl FnOnce(&[u8]) + Send,
    ) {
        match self.call::<WasmList<u8>>(instance, func).await {
            Some(list) => contents(list.as_le_slice(&*self.store)),
            None => contents(&[]),
        }
    }

    async fn call_func_ret_s32(&mut self, instance: &str, func: &str) -> i32 {
        self.call(instance, func).await.unwrap_or_default()
    }

    async fn call_func_ret_s64(&mut self, instance: &str, func: &str) -> i64 {
        self.call(instance, func).await.unwrap_or_default()
    }

    async fn call_func_ret_f32(&mut self, instance: &str, func: &str) -> u32 {
        self.call::<f32>(instance, func)
            .await
            .map_or(0, f32::to_bits)
    }

    async fn call_func_ret_f64(&mut self, instance: &str, func: &str) -> u64 {
        self.call::<f64>(instance, func)
            .await
            .map_or(0, f64::to_bits)
    }
}

/// Why a snapshot could not be made, for the log (calls go on without one).
pub fn describe_failure(run: &Run<Result<Vec<u8>, String>>) -> Option<String> {
    match &run.result {
        Ok(Ok(_)) => None,
        Ok(Err(message)) => Some(format!("the module failed in init: {message}")),
        Err(Fault::Host(message)) => Some(message.clone()),
        Err(fault) => Some(format!("init {fault}")),
    }
}
