//! The gates every call passes before it runs: per-tenant token buckets and running-call
//! counters, read from the tenant's [`TenantPolicy`], which refuse; and each tenant's share
//! of the host ([`Shares`]), which queues.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use toolhost_spec::policy::TenantPolicy;

/// Each tenant's share of the host: at most `per_tenant` call trees (a direct call and the
/// calls it nests) run at once, times the weight its policy gives it; its further calls wait
/// in the tenant's own queue, first come first served, within their own timeout. One tenant's flood queues behind itself, never in
/// front of another tenant's calls, and with nesting at most `MAX_NESTING_DEPTH` deep it can
/// never hold every instance slot. The queue is bounded too ([`QUEUED_PER_PLACE`]): a waiting
/// call holds its arguments, and one whose client has gone (an MCP request in a session runs
/// on after its connection closes) would otherwise pile up until its timeout.
pub struct Shares {
    per_tenant: usize,
    tenants: Mutex<HashMap<String, Share>>,
}

/// Calls of a tenant that may wait for a place, per place of its share; past that a call is
/// refused at once.
pub const QUEUED_PER_PLACE: usize = 32;

/// Memory the arguments of one tenant's waiting calls may hold together, measured as parsed
/// values (`clip::held_bytes`); past it a call is refused at once. Without it, 256 waiting
/// calls of a megabyte of small numbers each would hold 9 GiB.
pub const MAX_WAITING_BYTES_PER_TENANT: u64 = 64 << 20;

/// One tenant's queue, the places it holds now, and the calls waiting in it with the bytes
/// their arguments hold.
#[derive(Clone)]
struct Share {
    queue: Arc<Semaphore>,
    places: usize,
    waiting: Arc<AtomicUsize>,
    waiting_bytes: Arc<AtomicU64>,
}

/// Why a call did not get a place in its tenant's share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotEntered {
    /// Its deadline passed while it waited.
    Timeout,
    /// This many of the tenant's calls were already waiting.
    QueueFull(usize),
    /// The tenant's waiting calls' arguments already held this many bytes.
    QueueBytesFull(u64),
}

/// Counts a call, and the bytes its arguments hold, among its tenant's waiting ones while it
/// lives.
pub struct Waiting {
    count: Arc<AtomicUsize>,
    bytes: Option<(Arc<AtomicU64>, u64)>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
        if let Some((bytes, held)) = &self.bytes {
            bytes.fetch_sub(*held, Ordering::AcqRel);
        }
    }
}

impl Shares {
    pub fn new(per_tenant: u32) -> Self {
        Shares {
            per_tenant: per_tenant.max(1) as usize,
            tenants: Mutex::default(),
        }
    }

    /// A place among the tenant's running call trees (`weight` shares of them), waiting for
    /// one until `deadline` unless the tenant's queue is full.
    pub async fn enter(
        &self,
        tenant: &str,
        weight: u32,
        deadline: Instant,
    ) -> Result<OwnedSemaphorePermit, NotEntered> {
        self.enter_holding(tenant, weight, deadline, || 0).await
    }

    /// As [`Shares::enter`], for a call whose arguments hold `held()` bytes (measured only if
    /// it must wait), within [`MAX_WAITING_BYTES_PER_TENANT`] of its tenant's waiting calls.
    pub async fn enter_holding(
        &self,
        tenant: &str,
        weight: u32,
        deadline: Instant,
        held: impl FnOnce() -> u64,
    ) -> Result<OwnedSemaphorePermit, NotEntered> {
        let share = self.share(tenant, weight);
        if let Ok(place) = share.queue.clone().try_acquire_owned() {
            return Ok(place);
        }
        let queue = share.queue.clone();
        let _waiting = share.count_waiting(held())?;
        match tokio::time::timeout_at(deadline.into(), queue.acquire_owned()).await {
            Ok(Ok(place)) => Ok(place),
            // The semaphore is never closed: only the deadline ends the wait.
            _ => Err(NotEntered::Timeout),
        }
    }

    /// Counts a call whose arguments hold `held` bytes among its tenant's waiting calls, for
    /// as long as the returned guard lives, while it waits for something other than its
    /// share (a place to check its arguments): such a wait is bounded by the same queue.
    pub fn wait_elsewhere(
        &self,
        tenant: &str,
        weight: u32,
        held: u64,
    ) -> Result<Waiting, NotEntered> {
        self.share(tenant, weight).count_waiting(held)
    }

    /// The tenant's share, resized to `weight`.
    fn share(&self, tenant: &str, weight: u32) -> Share {
        let places = self.per_tenant * weight.max(1) as usize;
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        let share = tenants.entry(tenant.to_owned()).or_insert_with(|| Share {
            queue: Arc::new(Semaphore::new(places)),
            places,
            waiting: Arc::default(),
            waiting_bytes: Arc::default(),
        });
        // A changed weight resizes the share; places in use are given up as they free.
        if places > share.places {
            share.queue.add_permits(places - share.places);
            share.places = places;
        } else if places < share.places {
            share.places -= share.queue.forget_permits(share.places - places);
        }
        // The queue's bound follows the weight at once, even while places in use free.
        Share {
            places,
            ..share.clone()
        }
    }
}

impl Share {
    /// Counts one more of the tenant's waiting calls, holding `held` bytes, if both its
    /// queue (its places × [`QUEUED_PER_PLACE`]) and its bytes have room.
    fn count_waiting(self, held: u64) -> Result<Waiting, NotEntered> {
        let limit = self.places * QUEUED_PER_PLACE;
        let taken = (self.waiting).fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < limit).then_some(n + 1)
        });
        let mut waiting = match taken {
            Ok(_) => Waiting {
                count: self.waiting,
                bytes: None,
            },
            Err(queued) => return Err(NotEntered::QueueFull(queued)),
        };
        let added = (self.waiting_bytes).fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n.saturating_add(held) <= MAX_WAITING_BYTES_PER_TENANT).then_some(n + held)
        });
        match added {
            Ok(_) => waiting.bytes = Some((self.waiting_bytes, held)),
            Err(holding) => return Err(NotEntered::QueueBytesFull(holding)),
        }
        Ok(waiting)
    }
}

#[cfg(test)]
impl Shares {
    fn waiting(&self, tenant: &str) -> usize {
        let tenants = self.tenants.lock().unwrap();
        tenants[tenant].waiting.load(Ordering::Acquire)
    }
}

/// Why a call was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The policy field at fault.
    pub limit: &'static str,
    pub message: String,
    /// When a retry can succeed; `None` for the concurrency limit.
    pub retry_after_ms: Option<u64>,
}

/// Per-tenant rate buckets and running-call counts. On a cluster each node admits its share
/// of a tenant's limits: the limit divided by the nodes alive (concurrency rounded up), so
/// that calls spread by a balancer stay within the limit across the cluster.
pub struct Admission {
    buckets: Mutex<HashMap<String, Bucket>>,
    running: Mutex<HashMap<String, Arc<AtomicU32>>>,
    /// Nodes sharing the limits, this one included.
    nodes: AtomicU32,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            buckets: Mutex::default(),
            running: Mutex::default(),
            nodes: AtomicU32::new(1),
        }
    }
}

struct Bucket {
    tokens: f64,
    refilled: Instant,
}

/// Holds one call's concurrency slot; dropping it frees the slot.
pub struct Permit(Option<Arc<AtomicU32>>);

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(running) = &self.0 {
            running.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Admission {
    /// How many nodes share the limits from now on (at least 1).
    pub fn set_nodes(&self, nodes: u32) {
        self.nodes.store(nodes.max(1), Ordering::Relaxed);
    }

    /// The nodes sharing the limits.
    pub fn nodes(&self) -> u32 {
        self.nodes.load(Ordering::Relaxed)
    }

    /// Takes a token and a slot for one call of `tenant`, or says which limit refused it.
    pub fn admit(&self, tenant: &str, policy: &TenantPolicy) -> Result<Permit, Refused> {
        let nodes = self.nodes();
        if let Some(per_minute) = policy.calls_per_minute {
            let burst = policy.burst.unwrap_or(per_minute);
            self.take_token(tenant, per_minute, burst, nodes)?;
        }
        let Some(limit) = policy.max_concurrent else {
            return Ok(Permit(None));
        };
        let max = limit.div_ceil(nodes);
        let running = {
            let mut all = self.running.lock().unwrap_or_else(|p| p.into_inner());
            all.entry(tenant.to_owned()).or_default().clone()
        };
        let taken = running.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        });
        match taken {
            Ok(_) => Ok(Permit(Some(running))),
            Err(_) => Err(Refused {
                limit: "max_concurrent",
                message: match nodes {
                    1 => format!("tenant already has {max} calls running (max_concurrent)"),
                    _ => format!(
                        "tenant already has {max} calls running on this node, its share of \
                         max_concurrent {limit} across {nodes} nodes"
                    ),
                },
                retry_after_ms: None,
            }),
        }
    }

    /// A token from the tenant's bucket: this node's share, `1/nodes`, of its rate and burst.
    fn take_token(
        &self,
        tenant: &str,
        per_minute: u32,
        burst: u32,
        nodes: u32,
    ) -> Result<(), Refused> {
        let now = Instant::now();
        let share = f64::from(nodes);
        let per_ms = f64::from(per_minute) / 60_000.0 / share;
        let burst_share = (f64::from(burst) / share).max(1.0);
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(tenant.to_owned()).or_insert(Bucket {
            tokens: burst_share,
            refilled: now,
        });
        let elapsed_ms = now.duration_since(bucket.refilled).as_secs_f64() * 1e3;
        bucket.tokens = (bucket.tokens + elapsed_ms * per_ms).min(burst_share);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait_ms = ((1.0 - bucket.tokens) / per_ms).ceil() as u64;
        Err(Refused {
            limit: "calls_per_minute",
            message: match nodes {
                1 => format!(
                    "tenant is over its rate of {per_minute} calls per minute (calls_per_minute); retry in {wait_ms} ms"
                ),
                _ => format!(
                    "tenant is over this node's share of its rate of {per_minute} calls per \
                     minute across {nodes} nodes (calls_per_minute); retry in {wait_ms} ms"
                ),
            },
            retry_after_ms: Some(wait_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(json: serde_json::Value) -> TenantPolicy {
        serde_json::from_value(json).unwrap()
    }

    #[tokio::test]
    async fn a_tenant_over_its_share_waits_and_other_tenants_do_not() {
        let shares = Shares::new(2);
        let soon = || Instant::now() + std::time::Duration::from_millis(50);
        let first = shares.enter("a", 1, soon()).await.unwrap();
        let _second = shares.enter("a", 1, soon()).await.unwrap();
        assert!(
            shares.enter("a", 1, soon()).await.err() == Some(NotEntered::Timeout),
            "the third waits, then times out"
        );
        assert!(
            shares.enter("b", 1, soon()).await.is_ok(),
            "another tenant has its own"
        );
        drop(first);
        assert!(
            shares.enter("a", 1, soon()).await.is_ok(),
            "a place was freed"
        );
    }

    #[tokio::test]
    async fn a_policy_weight_resizes_the_tenant_share() {
        let shares = Shares::new(2);
        let soon = || Instant::now() + std::time::Duration::from_millis(50);
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(
                shares
                    .enter("a", 2, soon())
                    .await
                    .expect("weight 2: four places"),
            );
        }
        assert!(
            shares.enter("a", 2, soon()).await.err() == Some(NotEntered::Timeout),
            "the fifth waits"
        );
        // Back to weight 1, two places: no new call enters while two of the four still run.
        held.truncate(2);
        assert!(
            shares.enter("a", 1, soon()).await.err() == Some(NotEntered::Timeout),
            "two still run"
        );
        held.truncate(1);
        let _second = shares
            .enter("a", 1, soon())
            .await
            .expect("one runs, one is free");
        assert!(
            shares.enter("a", 1, soon()).await.err() == Some(NotEntered::Timeout),
            "both places are taken"
        );
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once_and_only_its_tenant() {
        let shares = Arc::new(Shares::new(1));
        let far = Instant::now() + std::time::Duration::from_secs(60);
        let running = shares.enter("a", 1, far).await.unwrap();
        let mut waiters: Vec<_> = (0..QUEUED_PER_PLACE)
            .map(|_| {
                let shares = shares.clone();
                tokio::spawn(async move { shares.enter("a", 1, far).await.is_ok() })
            })
            .collect();
        while shares.waiting("a") < QUEUED_PER_PLACE {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            shares.enter("a", 1, far).await.err(),
            Some(NotEntered::QueueFull(QUEUED_PER_PLACE)),
            "refused without waiting for the far deadline"
        );
        let _b = shares
            .enter("b", 1, far)
            .await
            .expect("b has its own queue");
        // A waiter that gives up (its client went) frees its place in the queue.
        waiters[0].abort();
        while shares.waiting("a") == QUEUED_PER_PLACE {
            tokio::task::yield_now().await;
        }
        drop(running);
        let next = waiters.swap_remove(1);
        assert!(next.await.unwrap(), "the first still waiting runs next");
    }

    #[tokio::test]
    async fn a_tenants_waiting_calls_hold_a_bounded_number_of_bytes() {
        let shares = Arc::new(Shares::new(1));
        let far = Instant::now() + std::time::Duration::from_secs(60);
        let running = shares.enter("a", 1, far).await.unwrap();
        let half = MAX_WAITING_BYTES_PER_TENANT / 2;
        let wait = |tenant: &'static str, held: u64| {
            let shares = shares.clone();
            tokio::spawn(async move { shares.enter_holding(tenant, 1, far, || held).await.is_ok() })
        };
        let first = wait("a", half);
        while shares.waiting("a") < 1 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            shares.enter_holding("a", 1, far, || half + 1).await.err(),
            Some(NotEntered::QueueBytesFull(half)),
            "refused at once"
        );
        assert_eq!(shares.waiting("a"), 1, "the refused call is not counted");
        // b's waiting calls hold bytes of their own.
        let _b_runs = shares.enter("b", 1, far).await.unwrap();
        let b = wait("b", half + 1);
        while shares.waiting("b") < 1 {
            tokio::task::yield_now().await;
        }
        b.abort();
        // A waiter that gives up gives its bytes back.
        first.abort();
        while shares.waiting("a") > 0 {
            tokio::task::yield_now().await;
        }
        let second = wait("a", half + 1);
        while shares.waiting("a") < 1 {
            tokio::task::yield_now().await;
        }
        drop(running);
        assert!(second.await.unwrap());
    }

    #[tokio::test]
    async fn a_call_waiting_elsewhere_holds_a_place_in_its_tenants_queue() {
        let shares = Shares::new(1);
        let far = Instant::now() + std::time::Duration::from_secs(60);
        let _running = shares.enter("a", 1, far).await.unwrap();
        let held = MAX_WAITING_BYTES_PER_TENANT / 2;
        let elsewhere: Vec<_> = (0..QUEUED_PER_PLACE - 1)
            .map(|_| shares.wait_elsewhere("a", 1, 1).unwrap())
            .collect();
        let big = shares.wait_elsewhere("a", 1, held).unwrap();
        assert_eq!(shares.waiting("a"), QUEUED_PER_PLACE);
        assert_eq!(
            shares.enter("a", 1, far).await.err(),
            Some(NotEntered::QueueFull(QUEUED_PER_PLACE)),
            "the queue is full of calls waiting elsewhere"
        );
        drop(elsewhere);
        assert_eq!(
            shares.wait_elsewhere("a", 1, held + 1).err(),
            Some(NotEntered::QueueBytesFull(held)),
        );
        drop(big);
        assert_eq!(shares.waiting("a"), 0, "each gave its place back");
        shares.wait_elsewhere("a", 1, held + 1).unwrap();
    }

    #[test]
    fn the_rate_limit_refuses_past_the_burst_and_per_tenant() {
        let admission = Admission::default();
        let p = policy(serde_json::json!({"calls_per_minute": 60, "burst": 3}));
        for _ in 0..3 {
            admission.admit("a", &p).unwrap();
        }
        let refused = admission.admit("a", &p).err().unwrap();
        assert_eq!(refused.limit, "calls_per_minute");
        // One token a second: the wait is at most a second.
        assert!(refused.retry_after_ms.unwrap() <= 1000);
        admission
            .admit("b", &p)
            .expect("another tenant has its own bucket");
    }

    #[test]
    fn the_concurrency_limit_frees_slots_on_drop() {
        let admission = Admission::default();
        let p = policy(serde_json::json!({"max_concurrent": 2}));
        let first = admission.admit("a", &p).unwrap();
        let _second = admission.admit("a", &p).unwrap();
        assert_eq!(
            admission.admit("a", &p).err().unwrap().limit,
            "max_concurrent"
        );
        admission
            .admit("b", &p)
            .expect("another tenant has its own slots");
        drop(first);
        admission.admit("a", &p).expect("a slot was freed");
    }
}
