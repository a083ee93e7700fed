//! What a tenant's policy grants one tool, as the sandbox's [`Permissions`]: HTTP
//! destinations, and directories under the tenant's files root, whose writes are charged to
//! the tenant's files budget.
//!
//! A granted directory is opened beneath the tenant's root one component at a time, never
//! following a symlink, and handed to the sandbox as that open handle. A tool can plant
//! symlinks and rename directories inside its writable grants; neither can point another
//! grant (a nested one, or the next call's) outside the tenant's root.
//!
//! The budget counts the tenant's files once, then every write the sandbox charges and every
//! directory this module makes on the way to a grant (a tool may rename one away, and the
//! next call would make it again). Deletes the sandbox cannot see are found by a recount,
//! which runs when the budget wants one: a write was refused, or removals gave back their
//! most, since the last.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};

use toolhost_sandbox::egress::EgressConfig;
use toolhost_sandbox::{FilesBudget, FilesCount, Permissions, Preopen};
use toolhost_spec::digest::sha256_hex;
use toolhost_spec::policy::{DirGrant, TenantPolicy};

/// A tenant refused a write recounts its files at most this often, however often it calls.
const RECOUNT_AFTER_REFUSAL: Duration = Duration::from_secs(1);

/// The directory that holds `tenant`'s granted directories under `files_dir`. Tenant ids may
/// hold any printable character, so one is never a path component as is.
pub fn tenant_dir(files_dir: &Path, tenant: &str) -> PathBuf {
    files_dir.join(&sha256_hex(tenant.as_bytes())[..32])
}

/// The sandbox's view of `grants` under the tenant's `root`: pure, so the mapping is tested
/// without a sandbox.
pub fn preopens(grants: &[DirGrant], root: &Path) -> Vec<Preopen> {
    grants
        .iter()
        .map(|grant| Preopen {
            host: root.join(&grant.dir),
            guest: grant.guest.clone(),
            write: grant.write,
            handle: None,
        })
        .collect()
}

/// Every tenant's files, under one directory, with each tenant's budget.
pub(crate) struct TenantFiles {
    dir: PathBuf,
    budgets: Mutex<HashMap<String, Counted>>,
}

#[derive(Clone)]
struct Counted {
    budget: Arc<FilesBudget>,
    at: Instant,
}

impl TenantFiles {
    pub fn new(dir: PathBuf) -> Self {
        TenantFiles {
            dir,
            budgets: Mutex::default(),
        }
    }

    pub fn root(&self, tenant: &str) -> PathBuf {
        tenant_dir(&self.dir, tenant)
    }

    /// The tenant's budget, with its quota as the policy now sets it: counted from the
    /// tenant's files the first time, and again when the budget wants it
    /// ([`FilesBudget::wants_recount`]).
    pub async fn budget(
        &self,
        tenant: &str,
        policy: &TenantPolicy,
    ) -> Result<Arc<FilesBudget>, String> {
        let quota = policy.files_quota();
        let known = self.lock().get(tenant).cloned();
        if let Some(counted) = &known {
            counted.budget.set_quota(quota);
            let recount =
                counted.budget.wants_recount() && counted.at.elapsed() >= RECOUNT_AFTER_REFUSAL;
            if !recount {
                return Ok(counted.budget.clone());
            }
        }
        let root = self.root(tenant);
        let held = tokio::task::spawn_blocking(move || count_under(&root))
            .await
            .map_err(|e| e.to_string())?;
        let budget = match known {
            Some(counted) => {
                counted.budget.recounted(held);
                counted.budget
            }
            None => Arc::new(FilesBudget::new(quota, held)),
        };
        let counted = Counted {
            budget: budget.clone(),
            at: Instant::now(),
        };
        self.lock().insert(tenant.to_owned(), counted);
        Ok(budget)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Counted>> {
        self.budgets.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The permissions of one call of `tool` for `tenant`; `files` is `None` for an in-memory
/// host.
pub async fn permissions(
    policy: &TenantPolicy,
    (tenant, tool): (&str, &str),
    files: Option<&TenantFiles>,
    egress: &Arc<EgressConfig>,
) -> Result<Permissions, String> {
    let grants = policy.grants_for(tool);
    let mut permissions = Permissions {
        network: grants.network,
        egress: egress.clone(),
        dirs: Vec::new(),
        tools: None,
        files: None,
        reuse: None,
    };
    if grants.filesystem.is_empty() {
        return Ok(permissions);
    }
    let files = files.ok_or("filesystem grants need a data directory (HostConfig::data_dir)")?;
    let budget = files.budget(tenant, policy).await?;
    let (root, dirs) = (files.root(tenant), grants.filesystem);
    let counted = budget.clone();
    permissions.dirs = tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&root)
            .map_err(|e| format!("cannot create the tenant's files directory: {e}"))?;
        let mut opened = preopens(&dirs, &root);
        for (preopen, grant) in opened.iter_mut().zip(&dirs) {
            let handle = open_beneath(&root, &grant.dir, &counted)
                .map_err(|e| format!("cannot open the granted directory {}: {e}", grant.dir))?;
            preopen.handle = Some(Arc::new(handle));
        }
        Ok::<_, String>(opened)
    })
    .await
    .map_err(|e| e.to_string())??;
    permissions.files = Some(budget);
    Ok(permissions)
}

/// Opens (creating as needed) `relative` beneath `root`, refusing a symlink at every step.
/// Each directory it makes counts as one of the tenant's entries in `budget`.
fn open_beneath(root: &Path, relative: &str, budget: &FilesBudget) -> std::io::Result<OwnedFd> {
    let mut dir = rustix::fs::open(root, DIR_FLAGS, Mode::empty())?;
    for component in Path::new(relative).components() {
        // The policy allows plain names only; anything else is refused here too.
        let Component::Normal(name) = component else {
            return Err(std::io::Error::other("not a plain relative path"));
        };
        dir = match rustix::fs::openat(&dir, name, DIR_FLAGS, Mode::empty()) {
            Err(rustix::io::Errno::NOENT) => made_beneath(&dir, name, budget)?,
            opened => opened?,
        };
    }
    Ok(dir)
}

const DIR_FLAGS: OFlags = OFlags::DIRECTORY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC)
    .union(OFlags::RDONLY);

/// Makes the directory `name` in `dir`, counted in `budget` (at the most, it is not made),
/// and opens it.
fn made_beneath(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    budget: &FilesBudget,
) -> std::io::Result<OwnedFd> {
    budget.add_entry().map_err(|held| {
        std::io::Error::other(format!(
            "not made: the tenant's files hold {held} files, directories and links, its most"
        ))
    })?;
    match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700)) {
        Ok(()) => {}
        // Made meanwhile by another call, which counted it.
        Err(rustix::io::Errno::EXIST) => budget.remove_entry(),
        Err(error) => {
            budget.remove_entry();
            return Err(error.into());
        }
    }
    Ok(rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty())?)
}

/// Bytes of the regular files under `root`, and every file, directory and link beneath it
/// (those the host made on the way to a grant too, as it counts them when it makes them).
fn count_under(root: &Path) -> FilesCount {
    let mut count = FilesCount::default();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            count.entries += 1;
            match entry.metadata() {
                Ok(meta) if meta.is_dir() => pending.push(entry.path()),
                Ok(meta) if meta.is_file() => count.bytes += meta.len(),
                _ => {}
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_map_under_the_tenant_root() {
        let grants = [
            DirGrant {
                dir: "notes".into(),
                guest: "/notes".into(),
                write: true,
            },
            DirGrant {
                dir: "shared/ro".into(),
                guest: "/ro".into(),
                write: false,
            },
        ];
        let root = Path::new("/files/abc");
        let open = preopens(&grants, root);
        assert_eq!(open[0].host, Path::new("/files/abc/notes"));
        assert_eq!((open[0].write, open[1].write), (true, false));
        assert_eq!(open[1].guest, "/ro");
    }

    #[test]
    fn a_grant_never_resolves_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        std::fs::create_dir_all(root.join("data")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let budget = FilesBudget::new(0, FilesCount::default());
        assert!(
            open_beneath(&root, "data/new/deeper", &budget).is_ok(),
            "created as needed"
        );
        assert!(root.join("data/new/deeper").is_dir());
        std::os::unix::fs::symlink(&outside, root.join("data/link")).unwrap();
        // `O_NOFOLLOW | O_DIRECTORY` on a symlink: ENOTDIR on Linux, ELOOP elsewhere.
        let refusals =
            [rustix::io::Errno::NOTDIR, rustix::io::Errno::LOOP].map(|e| e.raw_os_error());
        for through in ["data/link", "data/link/sub"] {
            let error = open_beneath(&root, through, &budget).unwrap_err();
            assert!(
                refusals.contains(&error.raw_os_error().unwrap()),
                "{through}: {error}"
            );
        }
        assert!(!outside.join("sub").exists(), "nothing was created outside");
    }

    #[test]
    fn every_entry_beneath_the_root_counts_and_every_files_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        open_beneath(root, "a/b/c", &FilesBudget::new(0, FilesCount::default())).unwrap();
        std::fs::create_dir_all(root.join("a/made/deeper")).unwrap();
        std::fs::write(root.join("a/b/c/file"), "12345").unwrap();
        std::fs::write(root.join("a/b/file"), "678").unwrap();
        // a, b, c, made, deeper and the two files.
        let count = count_under(root);
        assert_eq!(
            count,
            FilesCount {
                bytes: 8,
                entries: 7
            }
        );
    }

    /// A tool may rename a granted directory away (or remove it); the next call makes it
    /// again, and that counts, so renaming cannot make entries without end.
    #[test]
    fn each_directory_made_on_the_way_to_a_grant_counts_as_an_entry() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let held = FilesCount {
            bytes: 0,
            entries: toolhost_sandbox::MAX_FILE_ENTRIES - 3,
        };
        let budget = FilesBudget::new(0, held);
        open_beneath(root, "a/b", &budget).unwrap();
        assert_eq!(budget.entries(), held.entries + 2);
        open_beneath(root, "a/b", &budget).unwrap();
        assert_eq!(budget.entries(), held.entries + 2, "opened again, not made");
        std::fs::rename(root.join("a/b"), root.join("a/away")).unwrap();
        open_beneath(root, "a/b", &budget).unwrap();
        assert_eq!(budget.entries(), toolhost_sandbox::MAX_FILE_ENTRIES);
        std::fs::rename(root.join("a/b"), root.join("a/again")).unwrap();
        let refused = open_beneath(root, "a/b", &budget).unwrap_err();
        assert!(refused.to_string().contains("its most"), "{refused}");
        assert!(!root.join("a/b").exists());
    }

    #[test]
    fn a_tenant_id_never_becomes_a_path_component() {
        let dir = tenant_dir(Path::new("/files"), "../../etc");
        assert_eq!(dir.parent(), Some(Path::new("/files")));
        assert_eq!(dir.file_name().unwrap().len(), 32);
    }
}
