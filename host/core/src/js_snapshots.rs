//! Pre-initialised JS tools: a JS tool's module evaluated once in the runtime and the
//! instance snapshotted into a component of its own (see `toolhost_sandbox::snapshot`), so a
//! call starts from a ready heap instead of starting QuickJS and evaluating the module.
//!
//! Built in the background after install or a tool's first call on this node; until then,
//! and whenever one cannot be made, calls run on the shared runtime as before. Snapshots are
//! a per-node cache in memory, bounded in number and bytes, in all and per tenant, built one
//! at a time.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use toolhost_sandbox::snapshot::{self, describe_failure};
use toolhost_sandbox::{Fault, Prepared, Sandbox};
use toolhost_spec::spec::Limits;
use toolhost_store::Store;

use crate::catalog::JsSource;

/// Failed snapshots (and when tenants may build next) remembered; past this the memory is
/// cleared.
const MAX_REMEMBERED: usize = 4096;
/// After a build, its tenant starts no other for this long, or for as long as the build
/// took if longer: one tenant calling many tools in turn (or tools whose top-level code
/// runs until the build times out) holds the one builder at most half of the time.
const BUILD_COOLDOWN: Duration = Duration::from_secs(5);
/// A snapshot that failed in a way that may pass (its build timed out, the host was short
/// of memory) is not tried again for this long.
const RETRY_AFTER: Duration = Duration::from_secs(600);
/// Bytes the ready snapshots of all tenants may hold together: each holds its heap as the
/// module left it (about 4 MB; as much as the tool's memory cap, up to 512 MiB, if its
/// top-level code fills it), and its code.
pub const MAX_SNAPSHOT_BYTES: u64 = 512 << 20;
/// The part of [`MAX_SNAPSHOT_BYTES`] one tenant's snapshots may hold: a quarter.
pub const MAX_SNAPSHOT_BYTES_PER_TENANT: u64 = MAX_SNAPSHOT_BYTES / 4;

pub(crate) struct JsSnapshots {
    /// Read here, in the caller's task: a build in the background never holds the store, so
    /// a dropped host lets go of it at once.
    store: Arc<dyn Store>,
    shared: Arc<Shared>,
}

struct Shared {
    sandbox: Arc<Sandbox>,
    /// Snapshots one tenant's tools may hold, so no tenant crowds out the others.
    per_tenant: usize,
    /// Ready snapshots by [`key`], with their tenant.
    ready: quick_cache::sync::Cache<String, (Prepared, Arc<str>), SnapshotWeight>,
    /// Being built, or failed.
    tried: Mutex<Tried>,
    /// One build at a time: Cranelift takes a core for about a second per snapshot.
    building: Arc<tokio::sync::Semaphore>,
    /// Per runtime sha256: its bytes, and the runtime instrumented and loaded once built.
    runtimes: tokio::sync::Mutex<HashMap<String, Runtime>>,
}

/// A snapshot weighs its bytes, and at least its part of the count: `floor` is
/// [`MAX_SNAPSHOT_BYTES`] over the number of snapshots a node keeps.
#[derive(Clone)]
struct SnapshotWeight {
    floor: u64,
}

impl quick_cache::Weighter<String, (Prepared, Arc<str>)> for SnapshotWeight {
    fn weight(&self, _key: &String, (prepared, _): &(Prepared, Arc<str>)) -> u64 {
        (prepared.bytes() as u64).max(self.floor)
    }
}

#[derive(Default)]
struct Tried {
    /// Snapshots being built, by [`key`].
    building: HashSet<String>,
    /// Snapshots that cannot be made, by [`key`].
    failed: HashSet<String>,
    /// Snapshots not to try again before a time, by [`key`] ([`RETRY_AFTER`]).
    retry_at: HashMap<String, Instant>,
    /// When each tenant may start its next build ([`BUILD_COOLDOWN`]).
    next_build: HashMap<String, Instant>,
}

impl Tried {
    /// Whether `tenant` may start building snapshot `key` at `now`; if so, it is marked as
    /// being built.
    fn start(&mut self, tenant: &str, key: &str, now: Instant) -> bool {
        let not_before = |at: Option<&Instant>| at.is_some_and(|at| now < *at);
        if not_before(self.next_build.get(tenant))
            || not_before(self.retry_at.get(key))
            || self.failed.contains(key)
            || self.building.contains(key)
        {
            return false;
        }
        for times in [&mut self.next_build, &mut self.retry_at] {
            if times.len() >= MAX_REMEMBERED {
                times.retain(|_, at| now < *at);
            }
            if times.len() >= MAX_REMEMBERED {
                times.clear();
            }
        }
        self.next_build
            .insert(tenant.to_owned(), now + BUILD_COOLDOWN);
        self.building.insert(key.to_owned());
        true
    }

    /// After the build of `key` that ran from `started` to `ended`: `failed` is `Some(true)`
    /// if it failed for good, `Some(false)` if it may pass.
    fn end(
        &mut self,
        tenant: &str,
        key: &str,
        (started, ended): (Instant, Instant),
        failed: Option<bool>,
    ) {
        self.building.remove(key);
        let spacing = (ended - started).max(BUILD_COOLDOWN);
        self.next_build.insert(tenant.to_owned(), ended + spacing);
        match failed {
            None => {}
            Some(true) => {
                if self.failed.len() >= MAX_REMEMBERED {
                    self.failed.clear();
                }
                self.failed.insert(key.to_owned());
            }
            Some(false) => {
                self.retry_at.insert(key.to_owned(), ended + RETRY_AFTER);
            }
        }
    }
}

/// How many of a tenant's snapshots, of `held` bytes each (the last goes first), make room
/// for a new one of `new` bytes within `per_tenant` snapshots and
/// [`MAX_SNAPSHOT_BYTES_PER_TENANT`].
fn evictions(held: &[u64], new: u64, per_tenant: usize) -> usize {
    let mut bytes = new + held.iter().sum::<u64>();
    let mut kept = held.len();
    while kept > 0 && (kept >= per_tenant || bytes > MAX_SNAPSHOT_BYTES_PER_TENANT) {
        kept -= 1;
        bytes -= held[kept];
    }
    held.len() - kept
}

/// A snapshot's key: its tenant and its JS source blob's sha256.
fn key(tenant: &str, sha: &str) -> String {
    format!("{tenant}\0{sha}")
}

#[derive(Clone)]
struct Runtime {
    bytes: Arc<[u8]>,
    instrumented: Option<Prepared>,
}

impl JsSnapshots {
    /// `capacity` snapshots at most on this node, `per_tenant` of one tenant's tools; 0
    /// turns pre-initialisation off.
    pub fn new(
        sandbox: Arc<Sandbox>,
        store: Arc<dyn Store>,
        (capacity, per_tenant): (usize, usize),
    ) -> Self {
        let capacity = if per_tenant == 0 { 0 } else { capacity };
        let floor = MAX_SNAPSHOT_BYTES / capacity.max(1) as u64;
        let weight = SnapshotWeight { floor };
        // One shard: the cache splits its weight among its shards, and silently refuses an
        // entry heavier than a shard's share, which would then be rebuilt at every call.
        let options = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity(capacity.max(1))
            .weight_capacity(MAX_SNAPSHOT_BYTES)
            .shards(1)
            .build()
            .expect("valid cache options");
        let ready = quick_cache::sync::Cache::with_options(
            options,
            weight,
            Default::default(),
            Default::default(),
        );
        JsSnapshots {
            store,
            shared: Arc::new(Shared {
                sandbox,
                per_tenant,
                ready,
                tried: Mutex::default(),
                building: Arc::new(tokio::sync::Semaphore::new(usize::from(capacity > 0))),
                runtimes: tokio::sync::Mutex::default(),
            }),
        }
    }

    /// The snapshot of `tenant`'s JS source blob `sha`, if one is ready. Snapshots are never
    /// shared between tenants: top-level code (a random key, say) ran once in each.
    pub fn ready(&self, tenant: &str, sha: &str) -> Option<Prepared> {
        let key = key(tenant, sha);
        self.shared.ready.get(&key).map(|(prepared, _)| prepared)
    }

    /// Starts building the snapshot of `tenant`'s `js` (blob `sha`), under the tool's
    /// `limits`, unless it exists, is being built, failed (for good, or within
    /// [`RETRY_AFTER`]), the tenant's last build ended within [`BUILD_COOLDOWN`] (or its own
    /// length), or another build is running (a later call asks again).
    pub async fn request(&self, tenant: &str, sha: &str, js: Arc<JsSource>, limits: Limits) {
        let shared = &self.shared;
        let key = key(tenant, sha);
        if shared.ready.get(&key).is_some() {
            return;
        }
        let Ok(permit) = shared.building.clone().try_acquire_owned() else {
            return;
        };
        // Read before anything is marked: a call cancelled here leaves nothing behind.
        let runtime = match self.runtime(&js.runtime).await {
            Ok(runtime) => runtime,
            Err(error) => {
                tracing::warn!(%error, "the JS runtime is unreadable; JS tools are not pre-initialised");
                return;
            }
        };
        {
            let mut tried = shared.tried.lock().unwrap_or_else(|p| p.into_inner());
            if !tried.start(tenant, &key, Instant::now()) {
                return;
            }
        }
        let shared = shared.clone();
        let tenant: Arc<str> = tenant.into();
        tokio::spawn(async move {
            let _permit = permit;
            let started = Instant::now();
            let built = shared.build(&tenant, &js, runtime, &limits).await;
            let mut tried = shared.tried.lock().unwrap_or_else(|p| p.into_inner());
            let built = built.and_then(|prepared| match prepared.bytes() as u64 {
                bytes if bytes > MAX_SNAPSHOT_BYTES_PER_TENANT => Err(Failure::ForGood(format!(
                    "its snapshot holds {bytes} bytes, more than a tenant's snapshots may \
                     ({MAX_SNAPSHOT_BYTES_PER_TENANT})"
                ))),
                _ => Ok(prepared),
            });
            let failed = match &built {
                Ok(_) => None,
                Err(Failure::ForGood(_)) => Some(true),
                Err(Failure::ForNow(_)) => Some(false),
            };
            tried.end(&tenant, &key, (started, Instant::now()), failed);
            match built {
                Ok(prepared) => shared.keep(key, prepared, tenant),
                Err(Failure::ForGood(reason)) => {
                    tracing::info!(%tenant, %reason, "JS tool not pre-initialised; it runs on the shared runtime");
                }
                Err(Failure::ForNow(reason)) => {
                    tracing::debug!(%tenant, %reason, "JS tool not pre-initialised yet");
                }
            }
        });
    }

    /// The runtime `sha`'s bytes, read from the store once.
    async fn runtime(&self, sha: &str) -> Result<Runtime, String> {
        if let Some(found) = self.shared.runtimes.lock().await.get(sha) {
            return Ok(found.clone());
        }
        let bytes = self
            .store
            .blob(sha)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("the JS runtime {sha} is missing from the store"))?;
        let runtime = Runtime {
            bytes: bytes.into(),
            instrumented: None,
        };
        let mut runtimes = self.shared.runtimes.lock().await;
        Ok(runtimes.entry(sha.to_owned()).or_insert(runtime).clone())
    }
}

/// Why a snapshot was not made.
enum Failure {
    /// The module fails in `init`, runs out of fuel or memory, or does not compile.
    ForGood(String),
    /// A timeout or a fault of the host, which may pass.
    ForNow(String),
}

impl Shared {
    /// Keeps `tenant`'s new snapshot. At its share in number or bytes, a tenant's new one
    /// (say, of a tool's new version) replaces its own, never another tenant's.
    fn keep(&self, key: String, prepared: Prepared, tenant: Arc<str>) {
        let (keys, weights): (Vec<String>, Vec<u64>) = (self.ready.iter())
            .filter(|(_, (_, owner))| *owner == tenant)
            .map(|(key, (prepared, _))| (key, prepared.bytes() as u64))
            .unzip();
        let evicted = evictions(&weights, prepared.bytes() as u64, self.per_tenant);
        for key in keys.iter().rev().take(evicted) {
            self.ready.remove(key);
        }
        self.ready.insert(key, (prepared, tenant));
    }

    async fn build(
        &self,
        tenant: &str,
        js: &JsSource,
        runtime: Runtime,
        limits: &Limits,
    ) -> Result<Prepared, Failure> {
        let instrumented = self
            .instrumented(&js.runtime, &runtime.bytes)
            .await
            .map_err(Failure::ForNow)?;
        // Under the tool's own limits: a snapshot whose heap outgrew its memory cap could not
        // serve a single call.
        let run = self
            .sandbox
            .snapshot_js(runtime.bytes, &instrumented, &js.source, limits)
            .await;
        if let Some(reason) = describe_failure(&run) {
            return Err(match run.result {
                Err(Fault::Timeout | Fault::Host(_)) => Failure::ForNow(reason),
                _ => Failure::ForGood(reason),
            });
        }
        let Ok(Ok(bytes)) = run.result else {
            unreachable!("describe_failure saw no failure")
        };
        // Kept in memory only: a snapshot is cheap to make again, and a tenant's many tools
        // must not fill the disk.
        self.compile(tenant, bytes).await.map_err(Failure::ForGood)
    }

    /// The runtime `sha` instrumented for snapshots, compiled once per node.
    async fn instrumented(&self, sha: &str, runtime: &[u8]) -> Result<Prepared, String> {
        if let Some(Some(found)) = self
            .runtimes
            .lock()
            .await
            .get(sha)
            .map(|r| r.instrumented.clone())
        {
            return Ok(found);
        }
        let instrumented = snapshot::instrument_js_runtime(runtime).map_err(|e| e.to_string())?;
        // The host's own: compiled in its place, once per node.
        let prepared = self.compile("", instrumented).await?;
        if let Some(entry) = self.runtimes.lock().await.get_mut(sha) {
            entry.instrumented = Some(prepared.clone());
        }
        Ok(prepared)
    }

    /// Cranelift, in one of `tenant`'s compile places.
    async fn compile(&self, tenant: &str, bytes: Vec<u8>) -> Result<Prepared, String> {
        let (_, artifact) = self.sandbox.compile_in(tenant, bytes).await;
        let artifact = artifact.map_err(|e| e.to_string())?;
        // SAFETY: compiled just now by this sandbox.
        unsafe { self.sandbox.load(&artifact) }.map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_new_snapshot_replaces_its_own_past_its_count_or_bytes() {
        const MB: u64 = 1 << 20;
        assert_eq!(evictions(&[4 * MB, 4 * MB], 4 * MB, 8), 0, "room for it");
        assert_eq!(evictions(&[4 * MB; 8], 4 * MB, 8), 1, "at its count");
        let half = MAX_SNAPSHOT_BYTES_PER_TENANT / 2;
        assert_eq!(evictions(&[half, half], MB, 8), 1, "at its bytes");
        assert_eq!(evictions(&[MB, half, half], half, 8), 2);
        assert_eq!(evictions(&[], MAX_SNAPSHOT_BYTES_PER_TENANT, 8), 0);
    }

    #[test]
    fn a_tenant_holds_the_builder_at_most_half_the_time_and_a_timed_out_build_waits() {
        let mut tried = Tried::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(tried.start("acme", "acme/a", at(0)));
        assert!(
            !tried.start("acme", "acme/b", at(1)),
            "one build of a tenant's at a time"
        );
        // The build ran until its timeout, 60 s: acme waits as long before its next.
        tried.end("acme", "acme/a", (at(0), at(60)), Some(false));
        assert!(!tried.start("acme", "acme/b", at(100)));
        assert!(
            tried.start("globex", "globex/a", at(100)),
            "another tenant builds"
        );
        tried.end("globex", "globex/a", (at(100), at(101)), None);
        assert!(tried.start("acme", "acme/b", at(120)));
        tried.end("acme", "acme/b", (at(120), at(121)), None);
        // The timed-out one is not tried again until RETRY_AFTER has passed.
        assert!(!tried.start("acme", "acme/a", at(200)));
        assert!(tried.start("acme", "acme/a", at(60 + RETRY_AFTER.as_secs())));
        // A quick build still spaces its tenant's next by BUILD_COOLDOWN.
        tried.end("acme", "acme/a", (at(700), at(701)), Some(true));
        assert!(!tried.start("acme", "acme/c", at(702)));
        assert!(tried.start("acme", "acme/c", at(701 + BUILD_COOLDOWN.as_secs())));
        assert!(
            !tried.start("acme", "acme/a", at(10_000)),
            "failed for good"
        );
    }
}
