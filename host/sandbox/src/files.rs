//! The tenant's files quota inside a call. Every write that can grow a file in a granted
//! directory (`write`, `set-size`, and the streams of `write-via-stream` and
//! `append-via-stream`) is charged to the tenant's [`FilesBudget`] before it reaches the disk,
//! and refused with `insufficient-space` once the budget is spent. Unlinking a file,
//! truncating it on open and shrinking it give its bytes back (when no other link holds them);
//! anything else that frees bytes (a rename over a file, removing a hard link's last other
//! name) is found when the budget's owner recounts the tenant's files. What a removal gives
//! back is read just before it, so calls racing on one file can give back more than the disk
//! freed: between two recounts removals give back at most the quota (or
//! [`MIN_FREED_BETWEEN_RECOUNTS`], if more) and [`MAX_FILE_ENTRIES`], and past that ask for a
//! recount instead, so racing calls cannot wear the count down without end.
//! Each new file,
//! directory or link is counted too, up to [`MAX_FILE_ENTRIES`]: empty files cost no bytes,
//! but each takes an inode, and a disk out of inodes refuses every tenant's writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    DescriptorFlags, DescriptorType, ErrorCode, Host, HostDescriptor, OpenFlags, PathFlags,
};
use wasmtime_wasi::p2::{DynOutputStream, FsResult, OutputStream, Pollable, StreamError};

use crate::sandbox::CallState;
use toolhost_spec::call::Level;

/// The interface whose functions are wrapped: the version wasmtime-wasi links.
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// What a refused stream write reports, which the guest reads as `insufficient-space`.
const ENOSPC: i32 = 28;

/// Files, directories and links one tenant may keep, whatever their size.
pub const MAX_FILE_ENTRIES: u64 = 10_000;

/// Bytes removals may give back between two recounts when the quota is smaller: a tool that
/// rewrites a file near its quota several times a second is not refused for want of one.
pub const MIN_FREED_BETWEEN_RECOUNTS: u64 = 64 << 20;

/// What a tenant's files hold, as counted by walking them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilesCount {
    /// Bytes of regular files.
    pub bytes: u64,
    /// Files, directories and links.
    pub entries: u64,
}

/// Bytes and entries a tenant's files hold and may hold, shared by all its calls at once.
#[derive(Debug)]
pub struct FilesBudget {
    quota: AtomicU64,
    used: AtomicU64,
    entries: AtomicU64,
    /// Bytes and entries removals gave back since the last recount.
    freed: (AtomicU64, AtomicU64),
    /// A write was refused, or removals gave back their most, since the last recount.
    wants_recount: AtomicBool,
}

impl FilesBudget {
    /// A budget of `quota` bytes, with what the tenant's files hold now.
    pub fn new(quota: u64, held: FilesCount) -> Self {
        FilesBudget {
            quota: AtomicU64::new(quota),
            used: AtomicU64::new(held.bytes),
            entries: AtomicU64::new(held.entries),
            freed: (AtomicU64::new(0), AtomicU64::new(0)),
            wants_recount: AtomicBool::new(false),
        }
    }

    /// The quota, in bytes.
    pub fn quota(&self) -> u64 {
        self.quota.load(Ordering::Acquire)
    }

    /// Changes the quota (the tenant's policy changed); bytes held stay held.
    pub fn set_quota(&self, quota: u64) {
        self.quota.store(quota, Ordering::Release);
    }

    /// Bytes held as counted: the last recount plus every write charged since.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Charges `bytes`, unless that would pass the quota; `Err` holds the bytes held.
    pub fn charge(&self, bytes: u64) -> Result<(), u64> {
        if bytes == 0 {
            return Ok(());
        }
        let quota = self.quota();
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= quota)
            })
            .map(drop)
            .inspect_err(|_| self.wants_recount.store(true, Ordering::Release))
    }

    /// Gives back bytes charged for a write that did not happen.
    fn refund(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
    }

    /// Gives back the bytes of a file removed or shrunk, up to the quota (or
    /// [`MIN_FREED_BETWEEN_RECOUNTS`]) since the last recount; past it, asks for a recount
    /// instead.
    fn freed(&self, bytes: u64) {
        let most = self.quota().max(MIN_FREED_BETWEEN_RECOUNTS);
        if bytes > 0 && self.within_freeing(&self.freed.0, bytes, most) {
            self.refund(bytes);
        }
    }

    /// Adds `amount` to `freed` if it stays within `most`; else asks for a recount.
    fn within_freeing(&self, freed: &AtomicU64, amount: u64, most: u64) -> bool {
        let within = freed.fetch_update(Ordering::AcqRel, Ordering::Acquire, |freed| {
            freed.checked_add(amount).filter(|&total| total <= most)
        });
        within
            .inspect_err(|_| self.wants_recount.store(true, Ordering::Release))
            .is_ok()
    }

    /// Files, directories and links held as counted.
    pub fn entries(&self) -> u64 {
        self.entries.load(Ordering::Acquire)
    }

    /// Counts a new file, directory or link, unless the tenant holds its most; `Err` holds
    /// how many it holds.
    pub fn add_entry(&self) -> Result<(), u64> {
        self.entries
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < MAX_FILE_ENTRIES).then_some(held + 1)
            })
            .map(drop)
            .inspect_err(|_| self.wants_recount.store(true, Ordering::Release))
    }

    /// Gives back an entry that was counted and not made.
    pub fn remove_entry(&self) {
        let _ = (self.entries).fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            Some(held.saturating_sub(1))
        });
    }

    /// Gives back an entry that was removed, up to [`MAX_FILE_ENTRIES`] since the last
    /// recount; past it, asks for a recount instead.
    fn entry_removed(&self) {
        if self.within_freeing(&self.freed.1, 1, MAX_FILE_ENTRIES) {
            self.remove_entry();
        }
    }

    /// Whether the tenant's files should be counted again: a write was refused (files deleted
    /// since may have made room), or removals gave back their most.
    pub fn wants_recount(&self) -> bool {
        self.wants_recount.load(Ordering::Acquire)
    }

    /// Sets the count from a recount of the tenant's files.
    pub fn recounted(&self, held: FilesCount) {
        self.used.store(held.bytes, Ordering::Release);
        self.entries.store(held.entries, Ordering::Release);
        self.freed.0.store(0, Ordering::Release);
        self.freed.1.store(0, Ordering::Release);
        self.wants_recount.store(false, Ordering::Release);
    }
}

/// Files and directories one call may hold open at once: each is a file descriptor of the
/// host's, and a process has a bounded number of them for every call and connection.
pub const MAX_OPEN_FILES: usize = 256;

/// What a call holds open through `open-at`, each kept until the guest drops it and its
/// streams.
#[derive(Default)]
pub(crate) struct OpenFiles(Vec<std::sync::Weak<std::fs::File>>);

impl OpenFiles {
    fn has_room(&mut self) -> bool {
        self.0.retain(|file| file.strong_count() > 0);
        self.0.len() < MAX_OPEN_FILES
    }
}

/// One call's side of the budget: refusals are logged to the call.
#[derive(Clone)]
pub(crate) struct FilesQuota {
    pub budget: Arc<FilesBudget>,
    pub helpers: crate::Helpers,
}

impl FilesQuota {
    /// Counts the new entry `path`, or logs why not.
    fn add_entry(&self, path: &str) -> FsResult<()> {
        match self.budget.add_entry() {
            Ok(()) => Ok(()),
            Err(_) => self.refused_entry(path),
        }
    }

    /// Logs that `path` was not made, and says so to the guest.
    fn refused_entry<T>(&self, path: &str) -> FsResult<T> {
        let held = self.budget.entries();
        self.helpers.log(
            Level::Warn,
            &format!(
                "files: `{path}` was not created: the tenant's files hold {held} files, \
                 directories and links, its most"
            ),
        );
        Err(ErrorCode::Quota.into())
    }

    fn charge(&self, bytes: u64) -> bool {
        match self.budget.charge(bytes) {
            Ok(()) => true,
            Err(used) => {
                let quota = self.budget.quota();
                self.helpers.log(
                    Level::Warn,
                    &format!(
                        "files: a write of {bytes} bytes was refused: the tenant's files hold \
                         {used} bytes of its quota of {quota} (files_quota_bytes)"
                    ),
                );
                false
            }
        }
    }
}

/// Wraps the growing functions of `wasi:filesystem/types` so that they charge the call's
/// files quota first; a call without one writes as wasmtime-wasi does.
pub(crate) fn add_to_linker(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    types.func_wrap_async(
        "[method]descriptor.write",
        |mut store, (fd, buf, offset): (Resource<Descriptor>, Vec<u8>, u64)| {
            Box::new(async move {
                let (quota, mut view) = filesystem(store.data_mut());
                let growth = match &quota {
                    Some(_) => {
                        let end = offset.saturating_add(buf.len() as u64);
                        end.saturating_sub(size(&mut view, &fd).await)
                    }
                    None => 0,
                };
                if let Some(quota) = &quota
                    && !quota.charge(growth)
                {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let written = HostDescriptor::write(&mut view, fd, buf, offset).await;
                if let (Some(quota), Err(_)) = (&quota, &written) {
                    quota.budget.refund(growth);
                }
                Ok((error_code(&mut view, written)?,))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.set-size",
        |mut store, (fd, new_size): (Resource<Descriptor>, u64)| {
            Box::new(async move {
                let (quota, mut view) = filesystem(store.data_mut());
                let old_size = match &quota {
                    Some(_) => size(&mut view, &fd).await,
                    None => 0,
                };
                let growth = new_size.saturating_sub(old_size);
                if let Some(quota) = &quota
                    && !quota.charge(growth)
                {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let resized = HostDescriptor::set_size(&mut view, fd, new_size).await;
                if let Some(quota) = &quota {
                    match &resized {
                        Err(_) => quota.budget.refund(growth),
                        Ok(()) => quota.budget.freed(old_size.saturating_sub(new_size)),
                    }
                }
                Ok((error_code(&mut view, resized)?,))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.write-via-stream",
        |mut store, (fd, offset): (Resource<Descriptor>, u64)| {
            Box::new(async move {
                let (quota, mut view) = filesystem(store.data_mut());
                let file = match view.table.get(&fd) {
                    Ok(Descriptor::File(file)) => Some(file.file.clone()),
                    _ => None,
                };
                let stream = HostDescriptor::write_via_stream(&mut view, fd, offset);
                let stream = charged(&mut view, stream, quota, file.map(|file| (offset, file)))?;
                Ok((error_code(&mut view, stream)?,))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.append-via-stream",
        |mut store, (fd,): (Resource<Descriptor>,)| {
            Box::new(async move {
                let (quota, mut view) = filesystem(store.data_mut());
                let stream = HostDescriptor::append_via_stream(&mut view, fd);
                let stream = charged(&mut view, stream, quota, None)?;
                Ok((error_code(&mut view, stream)?,))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.open-at",
        |mut store,
         (fd, path_flags, path, open_flags, flags): (
            Resource<Descriptor>,
            PathFlags,
            String,
            OpenFlags,
            DescriptorFlags,
        )| {
            Box::new(async move {
                let state = store.data_mut();
                if !state.open_files.has_room() {
                    let refused = format!(
                        "files: `{path}` not opened: a call may hold at most {MAX_OPEN_FILES} files open"
                    );
                    state.helpers.log(Level::Warn, &refused);
                    return Ok((Err(ErrorCode::Quota),));
                }
                let (quota, mut view) = filesystem(state);
                let truncated = match &quota {
                    Some(_) if open_flags.contains(OpenFlags::TRUNCATE) => {
                        sole_file_size(&mut view, &fd, path_flags, &path).await
                    }
                    _ => 0,
                };
                let opened = match &quota {
                    Some(quota) if open_flags.contains(OpenFlags::CREATE) => {
                        let how = (path_flags, path.as_str(), open_flags, flags);
                        open_counting(&mut view, quota, &fd, how).await?
                    }
                    _ => {
                        HostDescriptor::open_at(&mut view, fd, path_flags, path, open_flags, flags)
                            .await
                    }
                };
                if let (Some(quota), Ok(_)) = (&quota, &opened) {
                    quota.budget.freed(truncated);
                }
                let held = match opened.as_ref().map(|fd| view.table.get(fd)) {
                    Ok(Ok(Descriptor::File(file))) => Some(Arc::downgrade(&file.file)),
                    Ok(Ok(Descriptor::Dir(dir))) => Some(Arc::downgrade(&dir.dir)),
                    _ => None,
                };
                let opened = error_code(&mut view, opened)?;
                store.data_mut().open_files.0.extend(held);
                Ok((opened,))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.unlink-file-at",
        |mut store, (fd, path): (Resource<Descriptor>, String)| {
            Box::new(async move {
                let (quota, mut view) = filesystem(store.data_mut());
                let freed = match &quota {
                    Some(_) => sole_file_size(&mut view, &fd, PathFlags::empty(), &path).await,
                    None => 0,
                };
                let unlinked = HostDescriptor::unlink_file_at(&mut view, fd, path).await;
                if let (Some(quota), Ok(())) = (&quota, &unlinked) {
                    quota.budget.freed(freed);
                    quota.budget.entry_removed();
                }
                Ok((error_code(&mut view, unlinked)?,))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.create-directory-at",
        |mut store, (fd, path): (Resource<Descriptor>, String)| {
            Box::new(async move {
                let (quota, mut view) = filesystem(store.data_mut());
                let made = entry_made(quota.as_ref(), &path, async {
                    HostDescriptor::create_directory_at(&mut view, fd, path.clone()).await
                });
                let made = made.await;
                Ok((error_code(&mut view, made)?,))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.symlink-at",
        |mut store, (fd, target, path): (Resource<Descriptor>, String, String)| {
            Box::new(async move {
                let (quota, mut view) = filesystem(store.data_mut());
                let made = entry_made(quota.as_ref(), &path, async {
                    HostDescriptor::symlink_at(&mut view, fd, target, path.clone()).await
                });
                let made = made.await;
                Ok((error_code(&mut view, made)?,))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.link-at",
        |mut store,
         (fd, old_flags, old_path, new_fd, path): (
            Resource<Descriptor>,
            PathFlags,
            String,
            Resource<Descriptor>,
            String,
        )| {
            Box::new(async move {
                let (quota, mut view) = filesystem(store.data_mut());
                let made = entry_made(quota.as_ref(), &path, async {
                    let (view, path) = (&mut view, path.clone());
                    HostDescriptor::link_at(view, fd, old_flags, old_path, new_fd, path).await
                });
                let made = made.await;
                Ok((error_code(&mut view, made)?,))
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.remove-directory-at",
        |mut store, (fd, path): (Resource<Descriptor>, String)| {
            Box::new(async move {
                let (quota, mut view) = filesystem(store.data_mut());
                let removed = HostDescriptor::remove_directory_at(&mut view, fd, path).await;
                if let (Some(quota), Ok(())) = (&quota, &removed) {
                    quota.budget.entry_removed();
                }
                Ok((error_code(&mut view, removed)?,))
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The size of the regular file at `path` under `dir` if no other link holds its bytes
/// (what removing or truncating it frees); else 0.
async fn sole_file_size(
    view: &mut WasiFilesystemCtxView<'_>,
    dir: &Resource<Descriptor>,
    path_flags: PathFlags,
    path: &str,
) -> u64 {
    let borrowed = Resource::new_borrow(dir.rep());
    match HostDescriptor::stat_at(view, borrowed, path_flags, path.to_owned()).await {
        Ok(stat) if stat.type_ == DescriptorType::RegularFile && stat.link_count == 1 => stat.size,
        _ => 0,
    }
}

/// `open-at` with `create`, counting an entry only for a file it made: it asks for a new
/// file first (`exclusive`), and if one is there opens that instead, asking again if it was
/// removed in between. Looking before opening would let a removal between the two go
/// uncounted, and the count drift down. At the most entries, an existing file still opens.
async fn open_counting(
    view: &mut WasiFilesystemCtxView<'_>,
    quota: &FilesQuota,
    dir: &Resource<Descriptor>,
    (path_flags, path, open_flags, flags): (PathFlags, &str, OpenFlags, DescriptorFlags),
) -> wasmtime::Result<FsResult<Resource<Descriptor>>> {
    let at = || Resource::new_borrow(dir.rep());
    let only_new = open_flags.contains(OpenFlags::EXCLUSIVE);
    for _ in 0..3 {
        // Not logged yet: at the most, an existing file still opens.
        let counted = quota.budget.add_entry().is_ok();
        if counted {
            let new = open_flags | OpenFlags::EXCLUSIVE;
            let opened = HostDescriptor::open_at(view, at(), path_flags, path.into(), new, flags);
            let error = match opened.await {
                Ok(made) => return Ok(Ok(made)),
                Err(error) => Host::convert_error_code(view, error)?,
            };
            quota.budget.remove_entry();
            if error != ErrorCode::Exist || only_new {
                return Ok(Err(error.into()));
            }
        } else if only_new {
            return Ok(quota.refused_entry(path));
        }
        let existing = open_flags & !OpenFlags::CREATE;
        match HostDescriptor::open_at(view, at(), path_flags, path.into(), existing, flags).await {
            Err(error) => match Host::convert_error_code(view, error)? {
                ErrorCode::NoEntry if counted => continue,
                ErrorCode::NoEntry => return Ok(quota.refused_entry(path)),
                error => return Ok(Err(error.into())),
            },
            found => return Ok(found),
        }
    }
    // Made and removed by others three times over while this call looked.
    Ok(Err(ErrorCode::Busy.into()))
}

/// Runs `make`, which makes the entry `path`, once the quota has counted it; a failed
/// `make` gives the count back.
async fn entry_made(
    quota: Option<&FilesQuota>,
    path: &str,
    make: impl Future<Output = FsResult<()>>,
) -> FsResult<()> {
    if let Some(quota) = quota {
        quota.add_entry(path)?;
    }
    let made = make.await;
    if let (Some(quota), Err(_)) = (quota, &made) {
        quota.budget.remove_entry();
    }
    made
}

/// The call's files quota, if any, and wasmtime-wasi's view of its filesystem.
fn filesystem(state: &mut CallState) -> (Option<FilesQuota>, WasiFilesystemCtxView<'_>) {
    let view = WasiFilesystemCtxView {
        ctx: state.wasi.filesystem(),
        table: &mut state.table,
    };
    (state.files.clone(), view)
}

/// The file's size; 0 if it cannot be read, which charges a write in full.
async fn size(view: &mut WasiFilesystemCtxView<'_>, fd: &Resource<Descriptor>) -> u64 {
    let borrowed = Resource::new_borrow(fd.rep());
    HostDescriptor::stat(view, borrowed)
        .await
        .map_or(0, |stat| stat.size)
}

/// What the guest gets: the value, or the error code (anything else traps, as in
/// wasmtime-wasi's own bindings).
fn error_code<T>(
    view: &mut WasiFilesystemCtxView<'_>,
    result: FsResult<T>,
) -> wasmtime::Result<Result<T, ErrorCode>> {
    match result {
        Ok(value) => Ok(Ok(value)),
        Err(error) => Ok(Err(Host::convert_error_code(view, error)?)),
    }
}

/// Replaces a new file stream with one that charges what it writes.
fn charged(
    view: &mut WasiFilesystemCtxView<'_>,
    stream: FsResult<Resource<DynOutputStream>>,
    quota: Option<FilesQuota>,
    position: Option<(u64, Arc<std::fs::File>)>,
) -> wasmtime::Result<FsResult<Resource<DynOutputStream>>> {
    let (Ok(stream), Some(quota)) = (&stream, quota) else {
        return Ok(stream);
    };
    let inner = view
        .table
        .delete(Resource::<DynOutputStream>::new_own(stream.rep()))?;
    let wrapped: DynOutputStream = Box::new(ChargedStream {
        inner,
        quota,
        position,
    });
    Ok(Ok(view.table.push(wrapped)?))
}

/// A file's output stream whose writes are charged to the files quota first.
struct ChargedStream {
    inner: DynOutputStream,
    quota: FilesQuota,
    /// Where the next write lands, in which file; `None`: appending.
    position: Option<(u64, Arc<std::fs::File>)>,
}

impl ChargedStream {
    /// Bytes a write of `len` adds to the file. Its size is read at each write: it may have
    /// shrunk through another handle, and been refunded, since the stream was opened.
    fn growth(&self, len: u64) -> u64 {
        match &self.position {
            Some((at, file)) => {
                let size = file.metadata().map_or(0, |m| m.len());
                at.saturating_add(len).saturating_sub(size)
            }
            None => len,
        }
    }

    fn advance(&mut self, len: u64) {
        if let Some((at, _)) = &mut self.position {
            *at = at.saturating_add(len);
        }
    }

    fn charged(
        &mut self,
        len: u64,
        write: impl FnOnce(&mut DynOutputStream) -> Result<(), StreamError>,
    ) -> Result<(), StreamError> {
        let growth = self.growth(len);
        if !self.quota.charge(growth) {
            let refused = std::io::Error::from_raw_os_error(ENOSPC);
            return Err(StreamError::LastOperationFailed(refused.into()));
        }
        match write(&mut self.inner) {
            Ok(()) => {
                self.advance(len);
                Ok(())
            }
            Err(error) => {
                self.quota.budget.refund(growth);
                Err(error)
            }
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for ChargedStream {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for ChargedStream {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.charged(bytes.len() as u64, |inner| inner.write(bytes))
    }

    fn write_zeroes(&mut self, count: usize) -> Result<(), StreamError> {
        self.charged(count as u64, |inner| inner.write_zeroes(count))
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        self.inner.check_write()
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(bytes: u64, entries: u64) -> FilesCount {
        FilesCount { bytes, entries }
    }

    #[test]
    fn a_budget_charges_up_to_its_quota_and_a_recount_resets_it() {
        let budget = FilesBudget::new(100, held(40, 1));
        assert_eq!(budget.charge(60), Ok(()));
        assert!(!budget.wants_recount());
        assert_eq!(budget.charge(1), Err(100));
        assert!(budget.wants_recount());
        assert_eq!(
            budget.charge(0),
            Ok(()),
            "a write that adds nothing is never refused"
        );
        budget.refund(30);
        assert_eq!(budget.used(), 70);
        budget.recounted(held(10, 1));
        assert!(!budget.wants_recount());
        assert_eq!(budget.charge(90), Ok(()));
    }

    /// Two calls truncating one file both read its size first: what removals give back
    /// between recounts is capped, so such races cannot wear the count down without end.
    #[test]
    fn removals_give_back_a_bounded_amount_between_recounts() {
        const MOST: u64 = MIN_FREED_BETWEEN_RECOUNTS;
        let budget = FilesBudget::new(100, held(100, 2));
        budget.freed(60);
        assert_eq!(budget.used(), 40);
        budget.charge(60).unwrap();
        budget.freed(MOST - 60);
        assert_eq!(budget.used(), 0);
        assert!(!budget.wants_recount());
        budget.charge(100).unwrap();
        budget.freed(1);
        assert_eq!(
            budget.used(),
            100,
            "past the most freed, nothing is given back"
        );
        assert!(budget.wants_recount());
        budget.recounted(held(100, 2));
        budget.freed(100);
        assert_eq!(budget.used(), 0, "a recount starts again");
        let large = FilesBudget::new(2 * MOST, held(2 * MOST, 0));
        large.freed(2 * MOST);
        assert_eq!(large.used(), 0, "a larger quota gives back as much");
        let budget = FilesBudget::new(100, held(0, MAX_FILE_ENTRIES));
        (0..MAX_FILE_ENTRIES).for_each(|_| budget.entry_removed());
        assert_eq!(budget.entries(), 0);
        assert!(!budget.wants_recount());
        budget.recounted(held(0, 5));
        (0..MAX_FILE_ENTRIES + 1).for_each(|_| budget.entry_removed());
        assert!(budget.wants_recount());
        budget.recounted(held(0, 5));
        budget.add_entry().unwrap();
        budget.entry_removed();
        assert_eq!(budget.entries(), 5);
    }

    #[test]
    fn a_budget_counts_entries_up_to_its_most() {
        let budget = FilesBudget::new(100, held(0, MAX_FILE_ENTRIES - 1));
        assert_eq!(budget.add_entry(), Ok(()));
        assert_eq!(budget.add_entry(), Err(MAX_FILE_ENTRIES));
        assert!(budget.wants_recount());
        budget.remove_entry();
        assert_eq!(budget.add_entry(), Ok(()));
        budget.recounted(held(0, 3));
        assert_eq!(budget.entries(), 3);
    }

    /// Writes through to a file at a position, as wasmtime-wasi's file stream does.
    struct FileAt(Arc<std::fs::File>, u64);

    #[wasmtime_wasi::async_trait]
    impl Pollable for FileAt {
        async fn ready(&mut self) {}
    }

    #[wasmtime_wasi::async_trait]
    impl OutputStream for FileAt {
        fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
            use std::os::unix::fs::FileExt;
            let failed = |e: std::io::Error| StreamError::LastOperationFailed(e.into());
            self.0.write_all_at(&bytes, self.1).map_err(failed)?;
            self.1 += bytes.len() as u64;
            Ok(())
        }
        fn flush(&mut self) -> Result<(), StreamError> {
            Ok(())
        }
        fn check_write(&mut self) -> Result<usize, StreamError> {
            Ok(usize::MAX)
        }
    }

    /// A stream opened on a full file, which then shrank through `set-size` (and was
    /// refunded), must charge what it writes back: the file's size is read at each write.
    #[test]
    fn a_stream_charges_growth_from_the_files_size_at_each_write() {
        const SIZE: u64 = 4096;
        let file = Arc::new(tempfile::tempfile().unwrap());
        file.set_len(SIZE).unwrap();
        let budget = Arc::new(FilesBudget::new(10 * SIZE, held(SIZE, 1)));
        let quota = FilesQuota {
            budget: budget.clone(),
            helpers: crate::Helpers::default(),
        };
        let mut stream = ChargedStream {
            inner: Box::new(FileAt(file.clone(), 0)),
            quota,
            position: Some((0, file.clone())),
        };
        stream.write(Bytes::from(vec![1; 100])).unwrap();
        assert_eq!(budget.used(), SIZE, "an overwrite adds nothing");
        file.set_len(0).unwrap();
        budget.refund(SIZE);
        stream.write(Bytes::from(vec![2; SIZE as usize])).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 100 + SIZE);
        assert_eq!(budget.used(), 100 + SIZE, "the bytes on disk, all charged");
    }
}
