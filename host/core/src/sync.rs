//! Other nodes' changes, applied to this node's memory: the catalog, policies, keys and held
//! calls. A shared store announces each change ([`Store::changes`]); a missed announcement
//! (a dropped connection, a lagging receiver) and the periodic re-sync read everything again.
//!
//! [`Store::changes`]: toolhost_store::Store::changes

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::broadcast::{self, error::RecvError};
use toolhost_store::Change;

use crate::approval::Approvals;
use crate::catalog::Catalog;
use crate::pipeline::Pipeline;
use crate::tenants::Tenants;

/// Follows changes until dropped.
pub(crate) struct Following(tokio::task::JoinHandle<()>);

impl Drop for Following {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a node caches of the shared store, and what wakes its durable-call workers and
/// the readers waiting for a durable call to end.
pub(crate) type Cached = ((Arc<Catalog>, Arc<Tenants>, Arc<Approvals>), DurableWakes);

/// Woken when a durable call is submitted (one worker) and when one ends (every reader).
#[derive(Clone, Default)]
pub(crate) struct DurableWakes {
    pub submitted: Arc<Notify>,
    pub ended: Arc<Notify>,
}

/// Applies `changes` as they come, and everything again every `resync`.
pub(crate) fn follow(
    mut changes: broadcast::Receiver<Change>,
    cached: Cached,
    resync: Duration,
) -> Following {
    Following(tokio::spawn(async move {
        let mut every = tokio::time::interval(resync);
        every.tick().await;
        let retry = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(retry);
        let mut retries = Retries::default();
        loop {
            let change = tokio::select! {
                change = changes.recv() => match change {
                    Ok(change) => change,
                    Err(RecvError::Lagged(_)) => Change::Resync,
                    Err(RecvError::Closed) => return,
                },
                _ = every.tick() => Change::Resync,
                () = &mut retry, if retries.pending => Change::Resync,
            };
            let batch = with_those_waiting(change, &mut changes);
            let mut failed_now = false;
            for change in &batch {
                if let Err(error) = apply(&cached, change).await {
                    // Meanwhile memory serves.
                    tracing::warn!(%error, ?change, "another node's change not applied yet");
                    failed_now = true;
                }
            }
            let read_all = batch.contains(&Change::Resync);
            if let Some(wait) = retries.after(failed_now, read_all, resync) {
                retry.as_mut().reset(tokio::time::Instant::now() + wait);
            }
        }
    }))
}

/// How soon everything is read again after a change could not be applied.
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// Whether everything must be read again because a change could not be applied: soon, not
/// only at the next re-sync (a database that just restarted fails the first reads), then at
/// twice the wait while it keeps failing, up to the re-sync's.
struct Retries {
    pending: bool,
    wait: Duration,
}

impl Default for Retries {
    fn default() -> Self {
        Retries {
            pending: false,
            wait: FIRST_RETRY,
        }
    }
}

impl Retries {
    /// After a batch: how long until everything is read again, if it must be.
    fn after(&mut self, failed: bool, read_all: bool, at_most: Duration) -> Option<Duration> {
        if failed {
            let wait = self.wait;
            (self.pending, self.wait) = (true, (wait * 2).min(at_most));
            return Some(wait);
        }
        // Everything was read: what failed before is read too.
        if read_all {
            *self = Retries::default();
        }
        None
    }
}

/// The most notices applied as one batch.
const MAX_BATCH: usize = 1024;

/// `first` and the notices already waiting behind it, each re-read once: a tenant that holds
/// and rejects calls in a loop on one node sent every other node to read every tenant's held
/// calls once per notice, while they queued; now once per batch. Notices that wake durable
/// workers are kept, one per call.
fn with_those_waiting(first: Change, changes: &mut broadcast::Receiver<Change>) -> Vec<Change> {
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        let next = match changes.try_recv() {
            Ok(next) => next,
            Err(broadcast::error::TryRecvError::Lagged(_)) => Change::Resync,
            Err(_) => break,
        };
        let rereads = !matches!(next, Change::Calls | Change::CallEnded);
        if !(rereads && batch.contains(&next)) {
            batch.push(next);
        }
    }
    batch
}

async fn apply(
    ((catalog, tenants, approvals), wakes): &Cached,
    change: &Change,
) -> Result<(), toolhost_store::StoreError> {
    tenants.forget(change);
    match change {
        Change::Calls => {
            wakes.submitted.notify_one();
            Ok(())
        }
        Change::CallEnded => {
            wakes.ended.notify_waiters();
            Ok(())
        }
        Change::Tools { tenant } => catalog.reload(tenant).await,
        Change::HeldCalls => approvals.reload().await,
        Change::Resync => {
            catalog.reload_all().await?;
            approvals.reload().await
        }
        Change::Policy { .. } | Change::Config { .. } | Change::Keys => Ok(()),
    }
}

/// How often a node says it is alive.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// Beats for `pipeline`'s node until dropped, and sets how many nodes share the limits.
pub(crate) fn heartbeat(pipeline: &Arc<Pipeline>) -> Following {
    let pipeline = Arc::downgrade(pipeline);
    Following(tokio::spawn(async move {
        while let Some(pipeline) = pipeline.upgrade() {
            let beat = pipeline.store.heartbeat(&pipeline.node).await;
            match beat {
                Ok(nodes) => {
                    pipeline.admission.set_nodes(nodes);
                    pipeline.metrics.cluster_nodes(nodes);
                }
                // The last count stands until the store answers again.
                Err(error) => tracing::warn!(%error, "heartbeat not recorded"),
            }
            drop(pipeline);
            tokio::time::sleep(HEARTBEAT).await;
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_notices_are_read_once_each_but_each_durable_call_wakes_a_worker() {
        let (send, mut changes) = broadcast::channel(64);
        let tools = |tenant: &str| Change::Tools {
            tenant: tenant.into(),
        };
        for change in [
            Change::HeldCalls,
            tools("a"),
            Change::Calls,
            Change::HeldCalls,
            tools("b"),
            tools("a"),
            Change::Calls,
        ] {
            send.send(change).unwrap();
        }
        let batch = with_those_waiting(Change::HeldCalls, &mut changes);
        let expected = [
            Change::HeldCalls,
            tools("a"),
            Change::Calls,
            tools("b"),
            Change::Calls,
        ];
        assert_eq!(batch, expected);
        assert!(changes.try_recv().is_err(), "all were taken");
    }

    #[test]
    fn what_failed_is_read_again_soon_then_less_often_until_a_full_read_succeeds() {
        let at_most = Duration::from_secs(30);
        let mut retries = Retries::default();
        let secs = Duration::from_secs;
        assert_eq!(retries.after(false, false, at_most), None);
        assert_eq!(retries.after(true, false, at_most), Some(secs(1)));
        assert_eq!(retries.after(true, true, at_most), Some(secs(2)));
        // A notice applied meanwhile does not read what failed.
        assert_eq!(retries.after(false, false, at_most), None);
        assert!(retries.pending);
        for expected in [4, 8, 16, 30, 30] {
            assert_eq!(retries.after(true, true, at_most), Some(secs(expected)));
        }
        assert_eq!(retries.after(false, true, at_most), None);
        assert!(!retries.pending);
        assert_eq!(retries.after(true, true, at_most), Some(secs(1)));
    }
}
