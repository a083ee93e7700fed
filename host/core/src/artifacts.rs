//! Compiled artifacts are native code the host will run, so it trusts only artifacts it
//! sealed itself: each is stored as an HMAC-SHA256 tag, under a key only the host holds, of
//! the name it is stored under (component sha256 and engine fingerprint) and the artifact,
//! then the artifact. So a stored artifact cannot be swapped for another one either. A `Store` (any implementation) or a shared directory can lose or damage
//! an artifact, which is then compiled again, but can never hand the host code to run.
//!
//! [`ArtifactDir`] keeps sealed artifacts on this machine's disk, beside any store: every
//! host that shares the directory (and its key) compiles a component once per engine.

use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

const TAG: usize = 32;
const KEY_FILE: &str = "artifacts.key";

/// The host's key for sealing artifacts.
pub(crate) struct Seal {
    key: [u8; 32],
}

impl Seal {
    /// The key in `dir/artifacts.key` (owner-only), made on first use. Whoever could write
    /// `dir` or read the key could seal code for the host to run: both must be this user's,
    /// and no one else's to write (the key: to read either).
    pub fn in_dir(dir: &Path) -> std::io::Result<Self> {
        private(dir, 0o022)?;
        let path = dir.join(KEY_FILE);
        if path.exists() {
            private(&path, 0o077)?;
        }
        if let Some(seal) = Self::read(&path) {
            return Ok(seal);
        }
        let seal = Self::ephemeral()?;
        let mut file = tempfile::NamedTempFile::new_in(dir)?;
        file.write_all(&seal.key)?;
        match file.persist_noclobber(&path) {
            Ok(_) => Ok(seal),
            // Another host made one at the same moment: both use the first to land.
            Err(lost) => Self::read(&path).ok_or(lost.error),
        }
    }

    fn read(path: &Path) -> Option<Self> {
        let key = <[u8; 32]>::try_from(std::fs::read(path).ok()?.as_slice()).ok()?;
        Some(Seal { key })
    }

    /// A key for this host alone: nothing sealed with it outlives the process.
    pub fn ephemeral() -> std::io::Result<Self> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Seal { key })
    }

    fn tag(&self, name: &str, artifact: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        mac.update(name.as_bytes());
        mac.update(&[0]);
        mac.update(artifact);
        mac
    }

    /// `name`: what the artifact is of (`sha:fingerprint`).
    pub fn seal(&self, name: &str, artifact: &[u8]) -> Vec<u8> {
        let tag = self.tag(name, artifact).finalize().into_bytes();
        [&tag[..], artifact].concat()
    }

    /// The artifact, if this host sealed exactly these bytes under `name`.
    pub fn open(&self, name: &str, sealed: Vec<u8>) -> Option<Opened> {
        let (tag, artifact) = sealed.split_at_checked(TAG)?;
        // Constant time, so the tag cannot be guessed byte by byte.
        self.tag(name, artifact).verify_slice(tag).ok()?;
        Some(Opened(sealed))
    }
}

/// An artifact whose seal this host checked, read in place behind its tag: an artifact is
/// megabytes, and a call that loads one should not copy it again.
pub(crate) struct Opened(Vec<u8>);

impl Opened {
    pub fn artifact(&self) -> &[u8] {
        &self.0[TAG..]
    }

    pub fn into_artifact(mut self) -> Vec<u8> {
        self.0.drain(..TAG);
        self.0
    }
}

/// `path` is this user's, with none of the `forbidden` mode bits (group and other access).
fn private(path: &Path, forbidden: u32) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)?;
    let refuse = |why: &str| {
        Err(std::io::Error::other(format!(
            "{} {why}: whoever can write it could have the host run their code",
            path.display()
        )))
    };
    if meta.uid() != rustix::process::geteuid().as_raw() {
        return refuse("is not this user's");
    }
    if meta.mode() & forbidden != 0 {
        return refuse(&format!(
            "is open to others (mode {:o})",
            meta.mode() & 0o777
        ));
    }
    Ok(())
}

pub(crate) struct ArtifactDir {
    dir: PathBuf,
}

impl ArtifactDir {
    /// The directory, created owner-only, and the key its artifacts are sealed with.
    pub fn open(dir: &Path) -> std::io::Result<(Self, Seal)> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let seal = Seal::in_dir(dir)?;
        Ok((
            ArtifactDir {
                dir: dir.to_owned(),
            },
            seal,
        ))
    }

    fn path(&self, sha: &str, fingerprint: &str) -> PathBuf {
        self.dir.join(format!("{sha}-{fingerprint}"))
    }

    /// The sealed artifact, if present.
    pub fn get(&self, sha: &str, fingerprint: &str) -> Option<Vec<u8>> {
        std::fs::read(self.path(sha, fingerprint)).ok()
    }

    /// Best effort: a failure only means compiling again next time. Written to a temporary
    /// file renamed into place, so readers never see half of one.
    pub fn put(&self, sha: &str, fingerprint: &str, sealed: &[u8]) {
        let write = || -> std::io::Result<()> {
            let mut file = tempfile::NamedTempFile::new_in(&self.dir)?;
            file.write_all(sealed)?;
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
    fn only_what_this_key_sealed_opens() {
        let seal = Seal::ephemeral().unwrap();
        let sealed = seal.seal("a:fp", b"machine code");
        let opened = seal.open("a:fp", sealed.clone()).unwrap();
        assert_eq!(opened.artifact(), b"machine code");
        assert_eq!(opened.into_artifact(), b"machine code");
        let mut flipped = sealed.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(seal.open("a:fp", flipped).is_none(), "a flipped bit");
        assert!(
            seal.open("b:fp", sealed.clone()).is_none(),
            "another component's artifact"
        );
        let other_host = Seal::ephemeral().unwrap();
        assert!(
            other_host.open("a:fp", sealed).is_none(),
            "another host's key"
        );
        assert!(seal.open("a:fp", b"short".to_vec()).is_none());
    }

    #[test]
    fn hosts_sharing_a_directory_share_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, seal) = ArtifactDir::open(&dir.path().join("artifacts")).unwrap();
        let (_, same) = ArtifactDir::open(&dir.path().join("artifacts")).unwrap();
        cache.put("abc", "fp", &seal.seal("abc:fp", b"compiled code"));
        let stored = cache.get("abc", "fp").unwrap();
        assert_eq!(
            same.open("abc:fp", stored).unwrap().artifact(),
            b"compiled code"
        );
        assert_eq!(cache.get("abc", "other-engine"), None);
        use std::os::unix::fs::PermissionsExt;
        let key = std::fs::metadata(dir.path().join("artifacts").join(KEY_FILE)).unwrap();
        assert_eq!(key.permissions().mode() & 0o777, 0o600);
    }

    /// A directory made by someone else, or open to others, is not trusted: they could have
    /// chosen the key, or could swap in code sealed with it.
    #[test]
    fn a_directory_or_key_others_can_reach_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let set = |path: &Path, mode| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let artifacts = dir.path().join("artifacts");
        ArtifactDir::open(&artifacts).unwrap();
        let key = artifacts.join(KEY_FILE);
        set(&artifacts, 0o777);
        let refused = ArtifactDir::open(&artifacts).err().unwrap().to_string();
        assert!(refused.contains("open to others"), "{refused}");
        set(&artifacts, 0o700);
        set(&key, 0o644);
        assert!(
            ArtifactDir::open(&artifacts).is_err(),
            "a key others can read"
        );
        set(&key, 0o600);
        assert!(ArtifactDir::open(&artifacts).is_ok());
        // Another user's key (root can give it away; others cannot test this).
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(&key, Some(65534), None).unwrap();
            let refused = ArtifactDir::open(&artifacts).err().unwrap().to_string();
            assert!(refused.contains("not this user's"), "{refused}");
        }
    }
}
