//! Compiled artifacts kept on this machine's disk, beside any store: every host that shares
//! the directory compiles a component once per engine. A file is `<sha>-<fingerprint>` and
//! holds the artifact's sha256, then the artifact; a file whose checksum fails is ignored
//! and replaced. Writes go to a temporary file renamed into place, so readers never see half
//! of one. The directory is created owner-only: the host runs what it loads from here.

use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub(crate) struct ArtifactDir {
    dir: PathBuf,
}

impl ArtifactDir {
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        Ok(ArtifactDir {
            dir: dir.to_owned(),
        })
    }

    fn path(&self, sha: &str, fingerprint: &str) -> PathBuf {
        self.dir.join(format!("{sha}-{fingerprint}"))
    }

    /// The artifact, if present and whole.
    pub fn get(&self, sha: &str, fingerprint: &str) -> Option<Vec<u8>> {
        let mut stored = std::fs::read(self.path(sha, fingerprint)).ok()?;
        if stored.len() < 32 || Sha256::digest(&stored[32..])[..] != stored[..32] {
            tracing::warn!(sha, "cached artifact fails its checksum; compiling again");
            return None;
        }
        Some(stored.split_off(32))
    }

    /// Best effort: a failure only means compiling again next time.
    pub fn put(&self, sha: &str, fingerprint: &str, artifact: &[u8]) {
        let write = || -> std::io::Result<()> {
            let mut file = tempfile::NamedTempFile::new_in(&self.dir)?;
            file.write_all(&Sha256::digest(artifact))?;
            file.write_all(artifact)?;
            file.persist(self.path(sha, fingerprint))?;
            Ok(())
        };
        if let Err(error) = write() {
            tracing::warn!(sha, %error, "compiled artifact not cached on disk");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_artifact_comes_back_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ArtifactDir::open(&dir.path().join("artifacts")).unwrap();
        assert_eq!(cache.get("abc", "fp"), None);
        cache.put("abc", "fp", b"compiled code");
        assert_eq!(
            cache.get("abc", "fp").as_deref(),
            Some(&b"compiled code"[..])
        );
        assert_eq!(cache.get("abc", "other-engine"), None);
        let path = cache.path("abc", "fp");
        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(cache.get("abc", "fp"), None, "a flipped bit is refused");
    }
}
