//! Opt-in instance reuse: calls with the same [`ReusePolicy::key`] (one tenant's one tool of
//! one component) may run in an instance an earlier call left, instead of a fresh one. Each
//! call still gets its own fuel, deadline, CPU turn, log, nested-call channel, network rules
//! and memory cap; the instance keeps its memory, so what a call leaves there the next sees.
//!
//! An instance is dropped after a fault of any kind, after `max_calls` calls or `max_age`,
//! and whenever a call of any tenant needs its slot or memory: idle instances never make
//! another call wait.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use wasmtime::Store;

use crate::Helpers;
use crate::sandbox::{
    Admitted, CallState, GuestToolError, Permissions, PluginPre, ReusePolicy, Run, Sandbox, arm,
    bindings, classify, ended, new_store, release, v0_1,
};
use toolhost_spec::spec::Limits;

/// Idle instances one tenant may keep, so one tenant's tools do not hold every idle place.
const IDLE_PER_TENANT: usize = 2;

/// A live instance of a tool component, of the world version it was built against.
enum Plugin {
    Current(bindings::Plugin),
    V0_1(v0_1::Plugin),
}

/// An instance between calls, with what it holds.
struct Kept {
    key: String,
    tenant: String,
    store: Store<CallState>,
    plugin: Plugin,
    admitted: Admitted,
    calls: u32,
    born: Instant,
    max_calls: u32,
    max_age: std::time::Duration,
}

impl Kept {
    fn expired(&self) -> bool {
        self.calls >= self.max_calls || self.born.elapsed() >= self.max_age
    }
}

/// The instances kept between calls: at most an eighth of the slots.
pub(crate) struct Idle {
    kept: Mutex<Vec<Kept>>,
    capacity: usize,
    /// Calls waiting for a slot or memory now.
    waiters: AtomicUsize,
}

/// Counts a waiting call while it lives.
pub(crate) struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Idle {
    pub fn new(max_instances: u32) -> Self {
        Idle {
            kept: Mutex::default(),
            capacity: (max_instances as usize / 8).max(1),
            waiters: AtomicUsize::new(0),
        }
    }

    /// Marks a call as waiting for a slot or memory until the guard drops.
    pub fn waiting(&self) -> Waiting<'_> {
        self.waiters.fetch_add(1, Ordering::Relaxed);
        Waiting(&self.waiters)
    }

    /// Drops the instances past their age or count. Called on the epoch ticker's thread:
    /// dropping an instance that grew large takes milliseconds of `madvise`, during which no
    /// guest anywhere would see a tick (no deadline, no turn handed on), so they are dropped
    /// on a thread of their own.
    pub fn expire(&self) {
        let expired = extract(&mut self.lock(), Kept::expired);
        if expired.is_empty() {
            return;
        }
        let release = std::thread::Builder::new().name("toolhost-release".into());
        // If no thread can start, the instances are dropped here: late ticks, not a leak.
        let _ = release.spawn(move || drop(expired));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Kept>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A kept instance for `key`, if one is still good; expired ones are dropped on the way.
    fn take(&self, key: &str) -> Option<Kept> {
        let (found, expired) = {
            let mut kept = self.lock();
            let expired: Vec<Kept> = extract(&mut kept, Kept::expired);
            let found = kept
                .iter()
                .position(|k| k.key == key)
                .map(|at| kept.remove(at));
            (found, expired)
        };
        expired.into_iter().for_each(Kept::drop_now);
        found
    }

    /// Keeps `instance` for the next call of its key, unless there is no room or a call is
    /// waiting for what it holds.
    fn put(&self, instance: Kept) {
        let mut kept = self.lock();
        let tenant_holds = kept.iter().filter(|k| k.tenant == instance.tenant).count();
        if kept.len() >= self.capacity
            || tenant_holds >= IDLE_PER_TENANT
            || self.waiters.load(Ordering::Relaxed) > 0
        {
            drop(kept);
            instance.drop_now();
            return;
        }
        kept.push(instance);
    }

    /// Drops every kept instance, giving back their slots and memory.
    pub fn clear(&self) {
        let all = std::mem::take(&mut *self.lock());
        all.into_iter().for_each(Kept::drop_now);
    }

    /// Drops `tenant`'s kept instances, giving back its part of the memory budget.
    pub fn clear_tenant(&self, tenant: &str) {
        let own = extract(&mut self.lock(), |kept| kept.tenant == tenant);
        own.into_iter().for_each(Kept::drop_now);
    }
}

impl Kept {
    fn drop_now(self) {
        release(self.store, self.admitted);
    }
}

/// `Vec::extract_if`, kept simple: the elements matching `pick`, removed.
fn extract(items: &mut Vec<Kept>, pick: impl Fn(&Kept) -> bool) -> Vec<Kept> {
    let (picked, kept): (Vec<Kept>, Vec<Kept>) = std::mem::take(items).into_iter().partition(pick);
    *items = kept;
    picked
}

impl Sandbox {
    /// One call of a tool component under `reuse`: in a kept instance for its key if there is
    /// one, else in a new one; the instance is kept afterwards unless the call faulted or the
    /// policy says it has served enough.
    pub(crate) async fn call_reusing(
        &self,
        tenant: &str,
        pre: PluginPre,
        reuse: &ReusePolicy,
        (limits, helpers, permissions, tool, args, ctx): (
            &Limits,
            Helpers,
            &Permissions,
            &str,
            &str,
            &bindings::toolhost::plugin::types::CallContext,
        ),
    ) -> Run<Result<String, GuestToolError>> {
        let deadline = Instant::now() + limits.timeout();
        let call = (
            limits,
            helpers,
            permissions,
            deadline,
            self.turns.guest(tenant),
        );
        // A kept instance that holds more than this call's cap cannot serve it.
        let kept = self.idle.take(&reuse.key).and_then(|kept| {
            if kept.store.data().memory_used() <= limits.memory_bytes as usize {
                return Some(kept);
            }
            kept.drop_now();
            None
        });
        let mut instance = match kept {
            Some(mut kept) => {
                kept.store.data_mut().rebind(call);
                if let Err(error) = kept.store.set_fuel(limits.fuel) {
                    kept.drop_now();
                    return Run::host_fault(&error.to_string());
                }
                arm(&mut kept.store, deadline);
                kept
            }
            None => {
                let admitted = match self.admit(tenant, limits, deadline).await {
                    Ok(admitted) => admitted,
                    Err(fault) => {
                        return Run {
                            result: Err(fault),
                            fuel_used: 0,
                        };
                    }
                };
                let mut store = match new_store(&self.engine, call) {
                    Ok(store) => store,
                    Err(message) => return Run::host_fault(&message),
                };
                let plugin = match &pre {
                    PluginPre::Current(pre) => {
                        pre.instantiate_async(&mut store).await.map(Plugin::Current)
                    }
                    PluginPre::V0_1(pre) => {
                        pre.instantiate_async(&mut store).await.map(Plugin::V0_1)
                    }
                };
                let plugin = match plugin {
                    Ok(plugin) => plugin,
                    Err(error) => {
                        let fault = classify(store.data(), &error);
                        release(store, admitted);
                        return Run {
                            result: Err(fault),
                            fuel_used: 0,
                        };
                    }
                };
                Kept {
                    key: reuse.key.clone(),
                    tenant: tenant.to_owned(),
                    store,
                    plugin,
                    admitted,
                    calls: 0,
                    born: Instant::now(),
                    max_calls: reuse.max_calls,
                    max_age: reuse.max_age,
                }
            }
        };
        let execution = async {
            let store = &mut instance.store;
            match &instance.plugin {
                Plugin::Current(plugin) => plugin.call_call(store, tool, args, ctx).await,
                Plugin::V0_1(plugin) => {
                    let ctx = ctx.into();
                    let result = plugin.call_call(store, tool, args, &ctx).await?;
                    Ok(result.map_err(Into::into))
                }
            }
        };
        // The epoch deadline stops guest code; this stops a guest blocked in a host call.
        let outcome = tokio::time::timeout_at(deadline.into(), execution).await;
        let run = ended(&instance.store, limits, outcome);
        instance.calls += 1;
        match run.result {
            Ok(_) if !instance.expired() => {
                instance.store.data_mut().set_turn(self.turns.guest(tenant));
                self.idle.put(instance);
            }
            _ => instance.drop_now(),
        }
        run
    }
}
