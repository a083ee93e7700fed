//! What a tenant's policy grants one tool, as the sandbox's [`Permissions`]: HTTP
//! destinations, and directories under the tenant's files root, whose writes are charged to
//! the tenant's files budget.
//!
//! A granted directory is opened beneath the tenant's root one component at a time, never
//! following a symlink, and handed to the sandbox as that open handle. A tool can plant
//! symlinks and rename directories inside its writable grants; neither can point another
//! grant (a nested one, or the next call's) outside the tenant's root.
//!
//! The budget counts the tenant's files once, then every write the sandbox charges. Deletes
//! are found by a recount, which runs when a write was refused since the last one.

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
    /// tenant's files the first time, and again if a write was refused since the last count
    /// (deletes may have made room).
    pub async fn budget(
        &self,
        tenant: &str,
        policy: &TenantPolicy,
    ) -> Result<Arc<FilesBudget>, String> {
        let quota = policy.files_quota();
        let known = self.lock().get(tenant).cloned();
        if let Some(counted) = &known {
            counted.budget.set_quota(quota);
            let recount = counted.budget.refused_since_recount()
                && counted.at.elapsed() >= RECOUNT_AFTER_REFUSAL;
            if !recount {
                return Ok(counted.budget.clone());
            }
        }
        let root = self.root(tenant);
        let granted = granted_dirs(policy);
        let held = tokio::task::spawn_blocking(move || count_under(&root, &granted))
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
    permissions.dirs = tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&root)
            .map_err(|e| format!("cannot create the tenant's files directory: {e}"))?;
        let mut opened = preopens(&dirs, &root);
        for (preopen, grant) in opened.iter_mut().zip(&dirs) {
            let handle = open_beneath(&root, &grant.dir)
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
fn open_beneath(root: &Path, relative: &str) -> std::io::Result<OwnedFd> {
    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY;
    let mut dir = rustix::fs::open(root, flags, Mode::empty())?;
    for component in Path::new(relative).components() {
        // The policy allows plain names only; anything else is refused here too.
        let Component::Normal(name) = component else {
            return Err(std::io::Error::other("not a plain relative path"));
        };
        match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(error) => return Err(error.into()),
        }
        dir = rustix::fs::openat(&dir, name, flags, Mode::empty())?;
    }
    Ok(dir)
}

/// Every directory the policy grants, relative to the tenant's root.
fn granted_dirs(policy: &TenantPolicy) -> Vec<PathBuf> {
    let grants = policy.grants.values().flat_map(|g| &g.filesystem);
    grants.map(|grant| PathBuf::from(&grant.dir)).collect()
}

/// Bytes of the regular files under `root`, and the entries the tenant's tools made: all
/// but the top level and the directories on the way to a `granted` one, which the host made.
fn count_under(root: &Path, granted: &[PathBuf]) -> FilesCount {
    let mut count = FilesCount::default();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let top_level = dir == *root;
        for entry in entries.flatten() {
            let path = entry.path();
            let made_by_host = top_level
                || path
                    .strip_prefix(root)
                    .is_ok_and(|relative| granted.iter().any(|grant| grant.starts_with(relative)));
            count.entries += u64::from(!made_by_host);
            match entry.metadata() {
                Ok(meta) if meta.is_dir() => pending.push(path),
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
        assert!(
            open_beneath(&root, "data/new/deeper").is_ok(),
            "created as needed"
        );
        assert!(root.join("data/new/deeper").is_dir());
        std::os::unix::fs::symlink(&outside, root.join("data/link")).unwrap();
        // `O_NOFOLLOW | O_DIRECTORY` on a symlink: ENOTDIR on Linux, ELOOP elsewhere.
        let refusals =
            [rustix::io::Errno::NOTDIR, rustix::io::Errno::LOOP].map(|e| e.raw_os_error());
        for through in ["data/link", "data/link/sub"] {
            let error = open_beneath(&root, through).unwrap_err();
            assert!(
                refusals.contains(&error.raw_os_error().unwrap()),
                "{through}: {error}"
            );
        }
        assert!(!outside.join("sub").exists(), "nothing was created outside");
    }

    #[test]
    fn the_directories_on_the_way_to_a_grant_are_not_the_tenants_entries() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        open_beneath(root, "a/b/c").unwrap();
        std::fs::create_dir_all(root.join("a/made/deeper")).unwrap();
        std::fs::write(root.join("a/b/c/file"), "12345").unwrap();
        std::fs::write(root.join("a/b/file"), "678").unwrap();
        let count = count_under(root, &[PathBuf::from("a/b/c")]);
        // made, deeper, and the two files: not a, b or c.
        assert_eq!(
            count,
            FilesCount {
                bytes: 8,
                entries: 4
            }
        );
    }

    #[test]
    fn a_tenant_id_never_becomes_a_path_component() {
        let dir = tenant_dir(Path::new("/files"), "../../etc");
        assert_eq!(dir.parent(), Some(Path::new("/files")));
        assert_eq!(dir.file_name().unwrap().len(), 32);
    }
}
