//! Components from bytes to a linked, ready-to-instantiate [`Prepared`]: compiled once per
//! content and engine (the artifact kept in the store), loaded on first use, and held in a
//! bounded cache. Concurrent first calls of one component load it once.

use std::path::Path;
use std::sync::Arc;

use toolhost_sandbox::LoadError;
use toolhost_sandbox::{Prepared, Sandbox};
use toolhost_spec::digest::sha256_hex;
use toolhost_store::{Store, StoreError};

use crate::artifacts::ArtifactDir;
use crate::error::{InstallError, OpenError};
use crate::metrics::{ComponentSource, Metrics};

pub(crate) struct Components {
    sandbox: Arc<Sandbox>,
    store: Arc<dyn Store>,
    /// By component sha256; past the cap the least recently used is dropped.
    loaded: quick_cache::sync::Cache<String, Prepared>,
    /// Artifacts shared on this machine's disk, checked before compiling.
    artifact_dir: Option<ArtifactDir>,
    metrics: Arc<Metrics>,
}

/// A component compiled and linked for install, not yet kept: its tools are checked first.
pub(crate) struct NewComponent {
    pub sha: String,
    pub prepared: Prepared,
    bytes: Vec<u8>,
    /// `None` when the store already holds this artifact (and so the component).
    artifact: Option<Vec<u8>>,
}

impl Components {
    pub fn new(
        sandbox: Arc<Sandbox>,
        store: Arc<dyn Store>,
        max_loaded: usize,
        artifact_dir: Option<&Path>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, OpenError> {
        let artifact_dir = match artifact_dir {
            Some(path) => {
                Some(
                    ArtifactDir::open(path).map_err(|error| OpenError::ArtifactDir {
                        path: path.to_owned(),
                        error,
                    })?,
                )
            }
            None => None,
        };
        Ok(Components {
            sandbox,
            store,
            loaded: quick_cache::sync::Cache::new(max_loaded.max(1)),
            artifact_dir,
            metrics,
        })
    }

    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// Linked components in memory now.
    pub fn loaded(&self) -> usize {
        self.loaded.len()
    }

    /// Compiles (or finds the stored artifact of) an uploaded component and links it.
    pub async fn compile(&self, bytes: Vec<u8>) -> Result<NewComponent, InstallError> {
        let sha = sha256_hex(&bytes);
        let stored = self.store.artifact(&sha, self.sandbox.fingerprint())?;
        let (bytes, artifact, fresh) = match stored {
            Some(artifact) => (bytes, artifact, false),
            None => {
                let (bytes, artifact) = self.compile_blob(&sha, bytes).await?;
                (bytes, artifact, true)
            }
        };
        // SAFETY: the artifact was just compiled here, or came from the store, which returns
        // only artifacts of this fingerprint whose checksum matches.
        let prepared = unsafe { self.sandbox.load(&artifact) }?;
        Ok(NewComponent {
            sha,
            prepared,
            bytes,
            artifact: fresh.then_some(artifact),
        })
    }

    /// Stores a checked component (once per sha256) and keeps it loaded.
    pub fn keep(&self, component: NewComponent) -> Result<(), StoreError> {
        if let Some(artifact) = &component.artifact {
            let fingerprint = self.sandbox.fingerprint();
            self.store
                .put_component(&component.sha, &component.bytes, fingerprint, artifact)?;
        }
        self.loaded.insert(component.sha, component.prepared);
        Ok(())
    }

    /// The linked component for `sha`: from memory, else the stored artifact, else compiled
    /// from the stored blob (and the artifact stored for next time).
    pub async fn prepared(&self, sha: &str) -> Result<Prepared, String> {
        if let Some(prepared) = self.loaded.get(sha) {
            self.metrics.component_loaded(ComponentSource::Memory);
            return Ok(prepared);
        }
        self.loaded.get_or_insert_async(sha, self.load(sha)).await
    }

    async fn load(&self, sha: &str) -> Result<Prepared, String> {
        let fingerprint = self.sandbox.fingerprint();
        let stored = self
            .store
            .artifact(sha, fingerprint)
            .map_err(|e| e.to_string())?;
        let artifact = match stored {
            Some(artifact) => {
                self.metrics.component_loaded(ComponentSource::Artifact);
                artifact
            }
            None => {
                self.metrics.component_loaded(ComponentSource::Compiled);
                let blob = self
                    .store
                    .blob(sha)
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("component {sha} is missing from the store"))?;
                let (_, artifact) = self
                    .compile_blob(sha, blob)
                    .await
                    .map_err(|e| e.to_string())?;
                self.store
                    .put_artifact(sha, fingerprint, &artifact)
                    .map_err(|e| e.to_string())?;
                artifact
            }
        };
        // SAFETY: as in `compile`: compiled here, or checksummed by the store.
        unsafe { self.sandbox.load(&artifact) }.map_err(|e| e.to_string())
    }

    /// Cranelift, off the async workers, unless the artifact directory has it already.
    async fn compile_blob(
        &self,
        sha: &str,
        bytes: Vec<u8>,
    ) -> Result<(Vec<u8>, Vec<u8>), LoadError> {
        let fingerprint = self.sandbox.fingerprint();
        let cached = self
            .artifact_dir
            .as_ref()
            .and_then(|dir| dir.get(sha, fingerprint));
        if let Some(artifact) = cached {
            return Ok((bytes, artifact));
        }
        let sandbox = self.sandbox.clone();
        let (bytes, artifact) = tokio::task::spawn_blocking(move || {
            sandbox.compile(&bytes).map(|artifact| (bytes, artifact))
        })
        .await
        .expect("compilation does not panic")?;
        if let Some(dir) = &self.artifact_dir {
            dir.put(sha, fingerprint, &artifact);
        }
        Ok((bytes, artifact))
    }
}
