//! Components from bytes to a linked, ready-to-instantiate [`Prepared`]: compiled once per
//! content and engine (the artifact kept, sealed, in the store and the artifact directory),
//! loaded on first use, and held in a bounded cache, of which each tenant's calls hold at
//! most a share. Concurrent first calls of one component load it once.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use toolhost_sandbox::{LoadError, Prepared, Sandbox};
use toolhost_spec::digest::sha256_hex;
use toolhost_store::{Store, StoreError};

use crate::artifacts::{ArtifactDir, Seal};
use crate::error::{InstallError, OpenError};
use crate::metrics::{ComponentSource, Metrics};

pub(crate) struct Components {
    sandbox: Arc<Sandbox>,
    store: Arc<dyn Store>,
    /// By component sha256, weighed by its code; past the cap the least recently used is
    /// dropped.
    loaded: quick_cache::sync::Cache<String, Loaded, ByCode, RandomState, ForgetEvicted>,
    /// Whose calls loaded what is in `loaded`; never locked while calling into it.
    loaded_by: Arc<Mutex<LoadedBy>>,
    /// Numbers each entry of `loaded`, so a charge is never mistaken for a later load's.
    next_load: AtomicU64,
    weigher: ByCode,
    /// What `loaded` weighs at most.
    capacity: u64,
    /// What one tenant's components may weigh in `loaded`.
    tenant_share: u64,
    /// Artifacts shared on this machine's disk, checked before compiling.
    artifact_dir: Option<ArtifactDir>,
    /// Only artifacts sealed with this key are ever deserialized.
    seal: Arc<Seal>,
    metrics: Arc<Metrics>,
    /// The JS runtime this host was started with, and its sha256: put back in the store when
    /// missing (on a shared store, a node on another runtime collects it while no tool names it).
    carried: Option<(String, Vec<u8>)>,
}

/// A component compiled and linked for install, not yet kept: its tools are checked first.
pub(crate) struct NewComponent {
    pub sha: String,
    pub prepared: Prepared,
    pub bytes: Vec<u8>,
    /// The sealed artifact, or `None` when the store already holds it (and the component).
    sealed: Option<Vec<u8>>,
}

/// A loaded component weighs its compiled code, and at least `floor`: at most
/// `max_loaded_components` fit, however small.
#[derive(Clone)]
struct ByCode {
    floor: u64,
}

impl ByCode {
    fn of(&self, prepared: &Prepared) -> u64 {
        (prepared.bytes() as u64).max(self.floor)
    }
}

impl quick_cache::Weighter<String, Loaded> for ByCode {
    fn weight(&self, _sha: &String, loaded: &Loaded) -> u64 {
        self.of(&loaded.prepared)
    }
}

/// One load of a component, numbered.
#[derive(Clone)]
struct Loaded {
    id: u64,
    prepared: Prepared,
}

/// The loaded components each tenant holds at most: a quarter of the cache, so that one
/// tenant calling many large components drops its own, not every other tenant's.
const TENANT_SHARE_OF_LOADED: u64 = 4;

type RandomState = std::hash::RandomState;

/// Which tenant's call loaded each entry of the cache, oldest first. A component two
/// tenants call is charged to the one that loaded it; the JS runtime, which every JS tool
/// runs on, to none (see [`Components::prepared`]).
#[derive(Default)]
struct LoadedBy {
    /// By sha256: the tenant and the load's number.
    tenant_of: HashMap<String, (String, u64)>,
    tenants: HashMap<String, TenantLoaded>,
}

/// One load charged: its sha256, number and weight.
type Charge = (String, u64, u64);

#[derive(Default)]
struct TenantLoaded {
    /// Oldest first.
    loads: VecDeque<Charge>,
    weight: u64,
}

impl LoadedBy {
    /// Charges a load (about to enter the cache) to `tenant`, and returns the tenant's oldest
    /// loads (sha256 and number) to drop to stay within `share`. The newest stays, however
    /// heavy: it runs the call that loaded it.
    fn charge(
        &mut self,
        tenant: &str,
        (sha, id, weight): Charge,
        share: u64,
    ) -> Vec<(String, u64)> {
        // A sha charged still is an earlier load that left the cache unseen.
        if let Some(&(_, earlier)) = self.tenant_of.get(&sha) {
            self.forget(&sha, earlier);
        }
        self.tenant_of.insert(sha.clone(), (tenant.to_owned(), id));
        let held = self.tenants.entry(tenant.to_owned()).or_default();
        held.loads.push_back((sha, id, weight));
        held.weight += weight;
        let mut over = Vec::new();
        while held.weight > share && held.loads.len() > 1 {
            let Some((oldest, id, weight)) = held.loads.pop_front() else {
                break;
            };
            held.weight -= weight;
            self.tenant_of.remove(&oldest);
            over.push((oldest, id));
        }
        over
    }

    /// Load `id` of `sha` left the cache.
    fn forget(&mut self, sha: &str, id: u64) {
        if self
            .tenant_of
            .get(sha)
            .is_none_or(|&(_, charged)| charged != id)
        {
            return;
        }
        let Some((tenant, _)) = self.tenant_of.remove(sha) else {
            return;
        };
        let Some(held) = self.tenants.get_mut(&tenant) else {
            return;
        };
        if let Some(at) = held.loads.iter().position(|&(_, charged, _)| charged == id) {
            let (_, _, weight) = held.loads.remove(at).expect("found just now");
            held.weight -= weight;
        }
        if held.loads.is_empty() {
            self.tenants.remove(&tenant);
        }
    }
}

/// Keeps [`LoadedBy`] in step with the cache's own evictions.
#[derive(Clone)]
struct ForgetEvicted(Arc<Mutex<LoadedBy>>);

impl quick_cache::Lifecycle<String, Loaded> for ForgetEvicted {
    /// The evicted, dropped once the cache's lock is released: dropping one may unmap code.
    type RequestState = Vec<Loaded>;

    fn on_evict(&self, evicted: &mut Vec<Loaded>, sha: String, loaded: Loaded) {
        lock(&self.0).forget(&sha, loaded.id);
        evicted.push(loaded);
    }
}

fn lock(loaded_by: &Mutex<LoadedBy>) -> std::sync::MutexGuard<'_, LoadedBy> {
    loaded_by
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Components {
    /// The key is the artifact directory's, else the data directory's, else this process's.
    pub fn new(
        sandbox: Arc<Sandbox>,
        store: Arc<dyn Store>,
        (max_loaded, max_loaded_bytes): (usize, u64),
        (artifact_dir, data_dir): (Option<&Path>, Option<&Path>),
        metrics: Arc<Metrics>,
    ) -> Result<Self, OpenError> {
        let fail = |path: &Path| {
            let path = path.to_owned();
            move |error| OpenError::ArtifactDir { path, error }
        };
        let (artifact_dir, seal) = match (artifact_dir, data_dir) {
            (Some(path), _) => {
                let (dir, seal) = ArtifactDir::open(path).map_err(fail(path))?;
                (Some(dir), seal)
            }
            (None, Some(path)) => (None, Seal::in_dir(path).map_err(fail(path))?),
            (None, None) => (None, Seal::ephemeral().map_err(fail(Path::new("")))?),
        };
        let max_loaded = max_loaded.max(1);
        let weigher = ByCode {
            floor: (max_loaded_bytes / max_loaded as u64).max(1),
        };
        // One shard: each shard holds its share of the bytes, and a large component must fit.
        // All of it hot: a cold part would refuse what weighs more than the hot part, so
        // `max_loaded_components` of at least the floor's weight would not all fit.
        let options = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity(max_loaded)
            .weight_capacity(max_loaded_bytes)
            .hot_allocation(1.0)
            .shards(1)
            .build()
            .expect("capacities are set");
        let loaded_by = Arc::new(Mutex::new(LoadedBy::default()));
        let forget = ForgetEvicted(loaded_by.clone());
        let loaded = quick_cache::sync::Cache::with_options(
            options,
            weigher.clone(),
            RandomState::new(),
            forget,
        );
        Ok(Components {
            sandbox,
            store,
            loaded,
            loaded_by,
            next_load: AtomicU64::new(0),
            weigher,
            capacity: max_loaded_bytes,
            tenant_share: max_loaded_bytes / TENANT_SHARE_OF_LOADED,
            artifact_dir,
            seal: Arc::new(seal),
            metrics,
            carried: None,
        })
    }

    /// Carries `blob` (sha256, bytes) to put back in the store whenever it is missing there.
    pub fn carrying(self, blob: Option<(String, Vec<u8>)>) -> Self {
        Components {
            carried: blob,
            ..self
        }
    }

    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    pub fn sandbox_arc(&self) -> Arc<Sandbox> {
        self.sandbox.clone()
    }

    /// Linked components in memory now.
    pub fn loaded(&self) -> usize {
        self.loaded.len()
    }

    /// What they weigh (see [`ByCode`]).
    pub fn loaded_bytes(&self) -> u64 {
        self.loaded.weight()
    }

    /// Compiles (or finds the stored artifact of) a component `tenant` uploaded and links it.
    pub async fn compile(
        &self,
        tenant: &str,
        bytes: Vec<u8>,
    ) -> Result<NewComponent, InstallError> {
        let sha = sha256_hex(&bytes);
        if let Some(prepared) = self.load_stored(&sha).await? {
            return Ok(NewComponent {
                sha,
                prepared,
                bytes,
                sealed: None,
            });
        }
        let (bytes, artifact) = self.compile_blob(tenant, &sha, bytes).await?;
        let sealed = self.seal.seal(&self.name(&sha), &artifact);
        // SAFETY: compiled here just now.
        let prepared = unsafe { self.sandbox.load(&artifact) }?;
        Ok(NewComponent {
            sha,
            prepared,
            bytes,
            sealed: Some(sealed),
        })
    }

    /// Stores a checked component (once per sha256) and keeps it loaded, charged to `tenant`.
    pub async fn keep(&self, tenant: &str, component: NewComponent) -> Result<(), StoreError> {
        match &component.sealed {
            Some(sealed) => {
                let fingerprint = self.sandbox.fingerprint();
                self.store
                    .put_component(&component.sha, &component.bytes, fingerprint, sealed)
                    .await?;
            }
            // Found stored when compiled, and collected since if no tool named it (a version
            // let go of, installed again): put back.
            None if !self.store.has_blob(&component.sha).await? => {
                (self.store)
                    .put_blob(&component.sha, &component.bytes)
                    .await?;
            }
            None => {}
        }
        // Only into an empty place: replacing an entry would evict, and forget, its charge.
        if let Err(place) = self.loaded.get_value_or_guard_async(&component.sha).await {
            let loaded = self.charge(tenant, &component.sha, component.prepared);
            let _ = place.insert(loaded);
        }
        Ok(())
    }

    /// The linked component for `sha`: from memory, else the stored artifact, else compiled
    /// from the stored blob (and the artifact stored for next time), charged to `tenant` if
    /// it is one tenant's.
    pub async fn prepared(&self, tenant: Option<&str>, sha: &str) -> Result<Prepared, String> {
        if let Some(loaded) = self.loaded.get(sha) {
            self.metrics.component_loaded(ComponentSource::Memory);
            return Ok(loaded.prepared);
        }
        let load = async {
            // The JS runtime is the host's own: compiled in its place.
            let prepared = self.load(tenant.unwrap_or_default(), sha).await?;
            Ok::<_, String>(match tenant {
                Some(tenant) => self.charge(tenant, sha, prepared),
                None => self.number(prepared),
            })
        };
        let loaded = self.loaded.get_or_insert_async(sha, load).await?;
        Ok(loaded.prepared)
    }

    fn number(&self, prepared: Prepared) -> Loaded {
        let id = self.next_load.fetch_add(1, Ordering::Relaxed);
        Loaded { id, prepared }
    }

    /// Numbers a load of `sha` that is about to enter the cache and charges it to `tenant`,
    /// dropping the tenant's oldest past its share.
    fn charge(&self, tenant: &str, sha: &str, prepared: Prepared) -> Loaded {
        let loaded = self.number(prepared);
        let weight = self.weigher.of(&loaded.prepared);
        if weight > self.capacity {
            return loaded; // refused by the cache: it must not push out the tenant's others
        }
        let charge = (sha.to_owned(), loaded.id, weight);
        let over = lock(&self.loaded_by).charge(tenant, charge, self.tenant_share);
        for (sha, id) in over {
            self.loaded.remove_if(&sha, |dropped| dropped.id == id);
        }
        loaded
    }

    /// What an artifact of `sha` is sealed as: it and the engine it was compiled for.
    fn name(&self, sha: &str) -> String {
        format!("{sha}:{}", self.sandbox.fingerprint())
    }

    /// The store's artifact for `sha`, loaded, if this host sealed it. Checking the seal
    /// hashes every byte of it and loading copies them, megabytes: off the async workers.
    async fn load_stored(&self, sha: &str) -> Result<Option<Prepared>, InstallError> {
        let fingerprint = self.sandbox.fingerprint();
        let Some(sealed) = self.store.artifact(sha, fingerprint).await? else {
            return Ok(None);
        };
        let (seal, sandbox, name) = (self.seal.clone(), self.sandbox.clone(), self.name(sha));
        let loaded = tokio::task::spawn_blocking(move || {
            let opened = seal.open(&name, sealed)?;
            // SAFETY: sealed by this host.
            Some(unsafe { sandbox.load(opened.artifact()) })
        })
        .await
        .expect("loading an artifact does not panic");
        if loaded.is_none() {
            tracing::warn!(
                sha,
                "stored artifact not sealed by this host; compiling again"
            );
        }
        Ok(loaded.transpose()?)
    }

    async fn load(&self, tenant: &str, sha: &str) -> Result<Prepared, String> {
        if let Some(prepared) = self.load_stored(sha).await.map_err(|e| e.to_string())? {
            self.metrics.component_loaded(ComponentSource::Artifact);
            return Ok(prepared);
        }
        self.metrics.component_loaded(ComponentSource::Compiled);
        let blob = match self.store.blob(sha).await.map_err(|e| e.to_string())? {
            Some(blob) => blob,
            None => self.put_back(sha).await?,
        };
        let (_, artifact) = self
            .compile_blob(tenant, sha, blob)
            .await
            .map_err(|e| e.to_string())?;
        let sealed = self.seal.seal(&self.name(sha), &artifact);
        // A cache: on a failing disk the call runs anyway, compiled again next time.
        let fingerprint = self.sandbox.fingerprint();
        if let Err(error) = self.store.put_artifact(sha, fingerprint, &sealed).await {
            tracing::warn!(%error, sha, "compiled artifact not stored");
        }
        // SAFETY: compiled here just now.
        unsafe { self.sandbox.load(&artifact) }.map_err(|e| e.to_string())
    }

    /// Puts the carried blob back in the store if it is `sha` and missing: a JS tool installed
    /// on this host's runtime names it, and another node (on another runtime, in a rolling
    /// upgrade) may have collected it while no tool did.
    pub async fn keep_carried(&self, sha: &str) -> Result<(), StoreError> {
        let carried = self.carried.as_ref().filter(|(carried, _)| carried == sha);
        // Touched even when there: on a shared store, an old blob no tool names may be
        // collected by another node before this install's entry names it.
        if let Some((_, blob)) = carried
            && !self.store.touch_blob(sha).await?
        {
            self.store.put_blob(sha, blob).await?;
        }
        Ok(())
    }

    /// The carried blob `sha`, put back in the store; any other missing blob is an error.
    async fn put_back(&self, sha: &str) -> Result<Vec<u8>, String> {
        let Some((_, blob)) = self.carried.as_ref().filter(|(carried, _)| carried == sha) else {
            return Err(format!("component {sha} is missing from the store"));
        };
        tracing::warn!(
            sha,
            "this host's JS runtime was missing from the store: put back"
        );
        self.store
            .put_blob(sha, blob)
            .await
            .map_err(|e| e.to_string())?;
        Ok(blob.clone())
    }

    /// Cranelift, in one of `tenant`'s compile places, unless the artifact directory has it
    /// already.
    async fn compile_blob(
        &self,
        tenant: &str,
        sha: &str,
        bytes: Vec<u8>,
    ) -> Result<(Vec<u8>, Vec<u8>), LoadError> {
        let fingerprint = self.sandbox.fingerprint();
        let shared = self
            .artifact_dir
            .as_ref()
            .and_then(|dir| dir.get(sha, fingerprint));
        if let Some(opened) = shared.and_then(|sealed| self.seal.open(&self.name(sha), sealed)) {
            return Ok((bytes, opened.into_artifact()));
        }
        let (bytes, artifact) = self.sandbox.compile_in(tenant, bytes).await;
        let artifact = artifact?;
        if let Some(dir) = &self.artifact_dir {
            dir.put(
                sha,
                fingerprint,
                &self.seal.seal(&self.name(sha), &artifact),
            );
        }
        Ok((bytes, artifact))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(sha: &str, id: u64, weight: u64) -> Charge {
        (sha.to_owned(), id, weight)
    }

    fn shas(over: Vec<(String, u64)>) -> Vec<String> {
        over.into_iter().map(|(sha, _)| sha).collect()
    }

    #[test]
    fn a_tenant_past_its_share_drops_its_own_oldest() {
        let mut by = LoadedBy::default();
        assert!(by.charge("acme", load("a1", 1, 10), 25).is_empty());
        assert!(by.charge("globex", load("g1", 2, 10), 25).is_empty());
        assert!(by.charge("acme", load("a2", 3, 10), 25).is_empty());
        assert_eq!(by.charge("acme", load("a3", 4, 10), 25), [("a1".into(), 1)]);
        assert_eq!(by.tenant_of["g1"].0, "globex");
        // The newest stays, however heavy.
        assert_eq!(
            shas(by.charge("acme", load("huge", 5, 100), 25)),
            ["a2", "a3"]
        );
        assert_eq!(by.tenants["acme"].weight, 100);
    }

    #[test]
    fn only_the_load_that_left_the_cache_is_forgotten() {
        let mut by = LoadedBy::default();
        by.charge("acme", load("a1", 1, 10), 25);
        by.charge("acme", load("a2", 2, 10), 25);
        by.forget("a1", 1);
        assert!(by.charge("acme", load("a3", 3, 10), 25).is_empty());
        // A later load of a2, charged to globex: the earlier one's eviction leaves it be.
        by.charge("globex", load("a2", 4, 10), 25);
        by.forget("a2", 2);
        assert_eq!(by.tenant_of["a2"], ("globex".into(), 4));
        assert_eq!(
            by.tenants["acme"].weight, 10,
            "a2's earlier load is no longer acme's"
        );
        by.forget("a2", 4);
        by.forget("a3", 3);
        assert!(by.tenants.is_empty() && by.tenant_of.is_empty());
        by.forget("never charged", 9);
    }
}
