//! Pre-initialised JS tools: a JS tool's module evaluated once in the runtime and the
//! instance snapshotted into a component of its own (see `toolhost_sandbox::snapshot`), so a
//! call starts from a ready heap instead of starting QuickJS and evaluating the module.
//!
//! Built in the background after install or a tool's first call on this node; until then,
//! and whenever one cannot be made, calls run on the shared runtime as before. Snapshots are
//! a per-node cache in memory, bounded in number and per tenant, built one at a time.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use toolhost_sandbox::snapshot::{self, describe_failure};
use toolhost_sandbox::{LoadError, Prepared};
use toolhost_spec::spec::Limits;
use toolhost_store::Store;

use crate::catalog::JsSource;
use crate::components::Components;

/// Snapshots one tenant's tools may hold on a node, so no tenant crowds out the others.
pub const MAX_JS_SNAPSHOTS_PER_TENANT: usize = 8;
/// Sources whose snapshot failed, remembered so they are not tried again; past this the
/// memory is cleared (each is then tried once more).
const MAX_FAILED_REMEMBERED: usize = 4096;

pub(crate) struct JsSnapshots {
    components: Arc<Components>,
    store: Arc<dyn Store>,
    /// Ready snapshots by JS source blob sha256, with the tenant whose tool asked for it.
    ready: quick_cache::sync::Cache<String, (Prepared, Arc<str>)>,
    /// Being built, or failed.
    tried: Mutex<Tried>,
    /// One build at a time: Cranelift takes a core for about a second per snapshot.
    building: Arc<tokio::sync::Semaphore>,
    /// Per runtime sha256: its bytes and the instrumented runtime, loaded.
    runtimes: tokio::sync::Mutex<HashMap<String, Instrumented>>,
}

#[derive(Default)]
struct Tried {
    /// Source sha256 → its tenant, while building.
    building: HashMap<String, Arc<str>>,
    failed: HashSet<String>,
}

#[derive(Clone)]
struct Instrumented {
    runtime: Arc<[u8]>,
    prepared: Prepared,
}

impl JsSnapshots {
    /// `capacity` snapshots at most on this node; 0 turns pre-initialisation off.
    pub fn new(components: Arc<Components>, store: Arc<dyn Store>, capacity: usize) -> Self {
        JsSnapshots {
            components,
            store,
            ready: quick_cache::sync::Cache::new(capacity.max(1)),
            tried: Mutex::default(),
            building: Arc::new(tokio::sync::Semaphore::new(usize::from(capacity > 0))),
            runtimes: tokio::sync::Mutex::default(),
        }
    }

    /// The snapshot of the JS source blob `sha`, if one is ready.
    pub fn ready(&self, sha: &str) -> Option<Prepared> {
        self.ready.get(sha).map(|(prepared, _)| prepared)
    }

    /// Starts building the snapshot of `js` (blob `sha`) for `tenant` unless it exists, is
    /// being built, failed before, the tenant holds its share, or another build is running
    /// (a later call asks again).
    pub fn request(self: &Arc<Self>, tenant: &str, sha: &str, js: Arc<JsSource>) {
        if self.ready.get(sha).is_some() {
            return;
        }
        let Ok(permit) = self.building.clone().try_acquire_owned() else {
            return;
        };
        {
            let mut tried = self.tried.lock().unwrap_or_else(|p| p.into_inner());
            let held = self
                .ready
                .iter()
                .filter(|(_, (_, owner))| &**owner == tenant)
                .count();
            if tried.failed.contains(sha)
                || tried.building.contains_key(sha)
                || held >= MAX_JS_SNAPSHOTS_PER_TENANT
            {
                return;
            }
            tried.building.insert(sha.to_owned(), tenant.into());
        }
        let this = self.clone();
        let (tenant, sha): (Arc<str>, String) = (tenant.into(), sha.to_owned());
        tokio::spawn(async move {
            let _permit = permit;
            let built = this.build(&js).await;
            let mut tried = this.tried.lock().unwrap_or_else(|p| p.into_inner());
            tried.building.remove(&sha);
            match built {
                Ok(prepared) => this.ready.insert(sha, (prepared, tenant)),
                Err(reason) => {
                    tracing::info!(%tenant, sha, %reason, "JS tool not pre-initialised; it runs on the shared runtime");
                    if tried.failed.len() >= MAX_FAILED_REMEMBERED {
                        tried.failed.clear();
                    }
                    tried.failed.insert(sha);
                }
            }
        });
    }

    async fn build(&self, js: &JsSource) -> Result<Prepared, String> {
        let runtime = self.instrumented(&js.runtime).await?;
        let sandbox = self.components.sandbox_arc();
        let run = sandbox
            .snapshot_js(
                runtime.runtime,
                &runtime.prepared,
                &js.source,
                &Limits::default(),
            )
            .await;
        if let Some(reason) = describe_failure(&run) {
            return Err(reason);
        }
        let Ok(Ok(bytes)) = run.result else {
            unreachable!("describe_failure saw no failure")
        };
        // Compiled here and kept in memory only: a snapshot is cheap to make again, and a
        // tenant's many tools must not fill the disk.
        let artifact = tokio::task::spawn_blocking({
            let sandbox = sandbox.clone();
            move || sandbox.compile(&bytes)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e: LoadError| e.to_string())?;
        // SAFETY: compiled just now by this sandbox.
        unsafe { sandbox.load(&artifact) }.map_err(|e| e.to_string())
    }

    /// The runtime `sha` instrumented for snapshots, compiled once per node (and its
    /// artifact kept like any component's).
    async fn instrumented(&self, sha: &str) -> Result<Instrumented, String> {
        let mut runtimes = self.runtimes.lock().await;
        if let Some(found) = runtimes.get(sha) {
            return Ok(found.clone());
        }
        let bytes = self
            .store
            .blob(sha)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("the JS runtime {sha} is missing from the store"))?;
        let instrumented = snapshot::instrument_js_runtime(&bytes).map_err(|e| e.to_string())?;
        let compiled = self
            .components
            .compile(instrumented)
            .await
            .map_err(|e| e.to_string())?;
        let found = Instrumented {
            runtime: bytes.into(),
            prepared: compiled.prepared,
        };
        runtimes.insert(sha.to_owned(), found.clone());
        Ok(found)
    }
}
