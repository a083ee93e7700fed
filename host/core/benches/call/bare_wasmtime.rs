//! The peer: wasmtime 48 with nothing of toolhost's, as an embedder gets it from the docs:
//! the default pooling allocator, no fuel, no epoch deadline, no memory cap. Each call is a
//! fresh store with an empty WASI context, instantiate, `call`, drop. toolhost's imports
//! (`helpers`, `tools`) trap if called; `text_stats` calls none of them.

use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, InstancePre, Linker, ResourceTable, Val};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

struct State {
    wasi: WasiCtx,
    table: ResourceTable,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

pub struct BareWasmtime {
    engine: Engine,
    pre: InstancePre<State>,
}

impl BareWasmtime {
    pub fn new(wasm: &[u8]) -> Self {
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .allocation_strategy(InstanceAllocationStrategy::pooling());
        let engine = Engine::new(&config).unwrap();
        let component = Component::new(&engine, wasm).unwrap();
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
        trap_toolhost_imports(&engine, &component, &mut linker);
        let pre = linker.instantiate_pre(&component).unwrap();
        Self { engine, pre }
    }

    /// Runs `tool` with `args` (JSON text) in a fresh instance; returns its JSON result text.
    pub async fn call(&self, tool: &str, args: &str) -> String {
        let state = State {
            wasi: WasiCtx::builder().build(),
            table: ResourceTable::new(),
        };
        let mut store = Store::new(&self.engine, state);
        let instance = self.pre.instantiate_async(&mut store).await.unwrap();
        let call = instance.get_func(&mut store, "call").unwrap();
        let text = |s: &str| Val::String(s.into());
        let context = Val::Record(vec![
            ("tenant".into(), text("bench")),
            ("call-id".into(), text("1")),
            ("tool".into(), text(tool)),
            ("data".into(), text("null")),
        ]);
        let mut results = [Val::Bool(false)];
        call.call_async(&mut store, &[text(tool), text(args), context], &mut results)
            .await
            .unwrap();
        match results {
            [Val::Result(Ok(Some(out)))] => match *out {
                Val::String(json) => json,
                other => panic!("`call` returned {other:?}"),
            },
            other => panic!("`call` failed: {other:?}"),
        }
    }
}

/// Each function of the component's `toolhost:` imports, as a trap. (wasmtime's
/// `define_unknown_imports_as_traps` would also stub WASI interfaces the guest imports at a
/// newer patch version than wasmtime-wasi names, whose resource types then do not match.)
fn trap_toolhost_imports(engine: &Engine, component: &Component, linker: &mut Linker<State>) {
    for (name, item) in component.component_type().imports(engine) {
        let ComponentItem::ComponentInstance(instance) = item.ty else {
            continue;
        };
        if !name.starts_with("toolhost:") {
            continue;
        }
        let mut stubs = linker.instance(name).unwrap();
        for (export, item) in instance.exports(engine) {
            if let ComponentItem::ComponentFunc(_) = item.ty {
                stubs
                    .func_new(export, |_, _, _, _| {
                        Err(wasmtime::format_err!("toolhost's imports are not linked"))
                    })
                    .unwrap();
            }
        }
    }
}
