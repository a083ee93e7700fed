//! Blobs a tenant's installs and removals let go of (a version past the kept ones, a removed
//! tool) until they are collected. Without this, blobs were collected only as a host opened,
//! so a tenant churning versions could fill the disk between restarts; now a collection runs
//! in the background a few seconds after a release, and meanwhile each released blob counts
//! against its tenant's code quota (at least [`MIN_RELEASED_WEIGHT`]), so a tenant can hold
//! at most its quota of them. On a shared store a blob younger than its grace is kept (an
//! install on another node may be about to name it): it counts until a later collection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// What a released blob counts at least: tiny ones churned by the thousand are bounded too.
pub const MIN_RELEASED_WEIGHT: u64 = 64 << 10;

/// How long after a release a collection starts: installs in a burst share one.
pub(crate) const COLLECT_AFTER: Duration = Duration::from_secs(5);

/// How often an install past its quota may collect at once.
const COLLECT_AT_ONCE_EVERY: Duration = Duration::from_secs(1);

/// How often a collection runs without a release: blobs too young before may be collected.
pub(crate) const COLLECT_AGAIN_AFTER: Duration = Duration::from_secs(300);

#[derive(Default)]
pub(crate) struct Released {
    /// By tenant: each released blob's sha256 and bytes.
    pending: Mutex<HashMap<String, HashMap<String, u64>>>,
    /// Held shared by each install from storing its blob to storing its entries, and alone
    /// by a collection: a collection never reads the entries between an install's two writes.
    collecting: RwLock<()>,
    /// Woken by each release.
    soon: Arc<Notify>,
    /// When an install last collected at once, to make room.
    collected_at_once: Mutex<Option<Instant>>,
}

impl Released {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<String, u64>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What `tenant`'s released blobs count against its code quota.
    pub fn weight(&self, tenant: &str) -> u64 {
        self.lock().get(tenant).map_or(0, |blobs| {
            blobs.values().map(|&b| b.max(MIN_RELEASED_WEIGHT)).sum()
        })
    }

    /// `tenant` let go of `blobs` (sha256, bytes): they count until collected.
    pub fn release(&self, tenant: &str, blobs: impl IntoIterator<Item = (String, u64)>) {
        let mut released = blobs.into_iter().peekable();
        if released.peek().is_none() {
            return;
        }
        self.lock()
            .entry(tenant.to_owned())
            .or_default()
            .extend(released);
        self.soon.notify_one();
    }

    /// Held by an install while it stores its blob and then its entries.
    pub async fn installing(&self) -> RwLockReadGuard<'_, ()> {
        self.collecting.read().await
    }

    /// Held by a collection while it reads the entries and removes blobs.
    pub async fn collecting(&self) -> RwLockWriteGuard<'_, ()> {
        self.collecting.write().await
    }

    /// Every released blob, with its tenant.
    pub fn all(&self) -> Vec<(String, String)> {
        let pending = self.lock();
        let each = pending
            .iter()
            .flat_map(|(tenant, blobs)| blobs.keys().map(move |sha| (tenant.clone(), sha.clone())));
        each.collect()
    }

    /// `sha` of `tenant` is no longer released: collected, or named by a tool again.
    pub fn settled(&self, tenant: &str, sha: &str) {
        let mut pending = self.lock();
        if let Some(blobs) = pending.get_mut(tenant) {
            blobs.remove(sha);
            if blobs.is_empty() {
                pending.remove(tenant);
            }
        }
    }

    /// Whether an install may collect at once to make room: once a second at most, since a
    /// collection reads every tool.
    pub fn may_collect_now(&self) -> bool {
        let mut last = self
            .collected_at_once
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < COLLECT_AT_ONCE_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// Woken by each release.
    pub fn waiter(&self) -> Arc<Notify> {
        self.soon.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_blobs_count_against_their_tenant_until_settled() {
        let released = Released::default();
        released.release("acme", [("a".to_owned(), 10 << 20), ("b".to_owned(), 1)]);
        assert_eq!(released.weight("acme"), (10 << 20) + MIN_RELEASED_WEIGHT);
        assert_eq!(released.weight("globex"), 0);
        released.settled("acme", "a");
        assert_eq!(released.weight("acme"), MIN_RELEASED_WEIGHT);
        released.settled("acme", "b");
        assert!(released.all().is_empty());
    }
}
