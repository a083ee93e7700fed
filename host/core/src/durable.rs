//! Durable calls: submitted now, run later by whichever node claims them, their outcome kept
//! in the store. A node leases each call it runs and renews the lease while the call runs;
//! when a node dies its leases run out, and another node runs an idempotent call again
//! (up to its `retry_count_on_stall`, at least once) or ends any other `node_lost`: a call
//! that may have taken effect never runs twice unasked.

use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use toolhost_sandbox::places::Places;
use toolhost_spec::call::{CallError, Caller};
use toolhost_store::{DurableCall, DurableState, StoreError, now_ms};

use crate::config::DurableConfig;
use crate::pipeline::{Budget, Pipeline};

/// Durable calls of one tenant not yet ended; past this, a submission is `rate_limited`.
/// With the ended calls kept (`toolhost_store::MAX_ENDED_KEPT`, `MAX_ENDED_BYTES`) and the
/// arguments' cap, this bounds what one tenant's durable calls hold in the store.
pub const MAX_UNENDED_PER_TENANT: usize = 1000;
/// The largest arguments of a durable call, and the largest caller `data`, each as JSON: they
/// are kept until the call is forgotten.
pub const MAX_DURABLE_ARGS_BYTES: usize = 64 * 1024;
/// Reads that wait for a durable call to end, in the process: each reads the call again
/// whenever any call ends. Past these, a read answers at once.
pub const MAX_DURABLE_WAITS: usize = 256;
/// Reads that wait for a durable call to end, of one tenant (see [`MAX_DURABLE_WAITS`]).
pub const MAX_DURABLE_WAITS_PER_TENANT: usize = 16;
static WAITS: LazyLock<Places> =
    LazyLock::new(|| Places::new(MAX_DURABLE_WAITS, MAX_DURABLE_WAITS_PER_TENANT));
/// Submits in the process at once, one per tenant: a submit counts the tenant's unended
/// calls and then writes, so a tenant's concurrent submits would all pass one count.
static SUBMITS: LazyLock<Places> = LazyLock::new(|| Places::new(8, 1));
/// Ended calls are kept this long for their callers to read, then forgotten.
const KEEP_ENDED: Duration = Duration::from_secs(24 * 3600);
/// On a shared store, idle workers look for work this often even unwoken: another node's
/// lease may run out, and a notice from another node may be missed.
const POLL: Duration = Duration::from_millis(500);

/// A durable call as its caller sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct DurableStatus {
    /// The call id.
    pub call_id: String,
    /// `queued`, `running`, `done` or `lost`.
    pub status: &'static str,
    /// Runs started so far.
    pub attempts: u32,
    /// Once it has ended: its outcome, as `CallOutcome::to_json` renders it (a lost call's is
    /// a `node_lost` error).
    pub outcome: Option<Value>,
}

impl DurableStatus {
    fn of(call: DurableCall) -> Self {
        let outcome = match &call.state {
            DurableState::Done { outcome, .. } => Some(outcome.clone()),
            DurableState::Lost { node, .. } => {
                let error = CallError::NodeLost {
                    message: format!(
                        "node {node} stopped while it ran the call, and `{}` is not \
                         idempotent, so it was not run again",
                        call.tool
                    ),
                };
                let mut outcome =
                    toolhost_spec::call::CallOutcome::new(call.id.clone(), call.tool.clone());
                outcome.result = Err(error);
                Some(outcome.to_json())
            }
            DurableState::Queued | DurableState::Running { .. } => None,
        };
        DurableStatus {
            status: call.state.status(),
            call_id: call.id,
            attempts: call.attempts,
            outcome,
        }
    }

    /// Whether it has ended.
    pub fn ended(&self) -> bool {
        self.outcome.is_some()
    }
}

/// The node's durable-call workers. [`Workers::drain`] stops them between calls; dropping
/// them stops them at once (a call they were running is left to its lease, as if the node
/// had died).
pub(crate) struct Workers {
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    stop: CancellationToken,
}

impl Workers {
    /// Stops claiming calls and waits up to `grace` for the running ones to end; whether they
    /// all did. Those still running are then stopped, left to their leases; when this returns,
    /// no worker holds any part of the host.
    pub async fn drain(&self, grace: Duration) -> bool {
        self.stop.cancel();
        let mut running =
            std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        let deadline = tokio::time::Instant::now() + grace;
        while let Some(task) = running.first_mut() {
            // A worker's call runs in the pipeline, which turns every fault into an outcome.
            match tokio::time::timeout_at(deadline, task).await {
                Ok(_) => drop(running.remove(0)),
                Err(_) => break,
            }
        }
        let ended = running.is_empty();
        running.iter().for_each(tokio::task::JoinHandle::abort);
        for task in running {
            // An aborted task ends at its next await.
            let _ = task.await;
        }
        ended
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(|p| p.into_inner());
        tasks.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

/// Starts `config.workers` workers for `pipeline`, woken by `wake` when a call is submitted.
pub(crate) fn start(pipeline: Arc<Pipeline>, config: DurableConfig) -> Workers {
    let wake = pipeline.durable_wakes.submitted.clone();
    let stop = CancellationToken::new();
    // Workers hold the pipeline only while they claim and run: an idle one keeps no part of
    // the host alive, so dropping the host closes its store at once.
    let weak = Arc::downgrade(&pipeline);
    let mut tasks: Vec<_> = (0..config.workers)
        .map(|_| {
            let (weak, wake, stop) = (weak.clone(), wake.clone(), stop.clone());
            tokio::spawn(work(weak, wake, config.lease, stop))
        })
        .collect();
    if config.workers > 0 {
        // Idle workers look again: on a shared store, often (another node's lease may run
        // out, a notice may be missed); on a store of its own, once a lease after start,
        // for the calls a previous run of this host left running.
        let shared = pipeline.store.changes().is_some();
        let (stopped, lease) = (stop.clone(), config.lease);
        tasks.push(tokio::spawn(async move {
            // Cancellable, or stopping an idle node would wait out the sleep.
            let mut wait = if shared { POLL } else { lease + POLL };
            loop {
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = stopped.cancelled() => return,
                }
                wake.notify_one();
                if !shared {
                    return;
                }
                wait = POLL;
            }
        }));
        let stopped = stop.clone();
        tasks.push(tokio::spawn(async move {
            tokio::select! {
                () = purge(weak) => {}
                () = stopped.cancelled() => {}
            }
        }));
    }
    Workers {
        tasks: std::sync::Mutex::new(tasks),
        stop,
    }
}

async fn work(
    pipeline: Weak<Pipeline>,
    wake: Arc<Notify>,
    lease: Duration,
    stop: CancellationToken,
) {
    // Nothing to do until a call is submitted or the poll says to look.
    tokio::select! {
        () = wake.notified() => {}
        () = stop.cancelled() => return,
    }
    while !stop.is_cancelled() {
        let Some(pipeline) = pipeline.upgrade() else {
            return;
        };
        let now = now_ms();
        let lease_until = now + lease.as_millis() as u64;
        match pipeline
            .store
            .durable_claim(&pipeline.node, now, lease_until)
            .await
        {
            Ok(Some(call)) => {
                // There may be more: another idle worker looks too.
                wake.notify_one();
                run(&pipeline, call, lease).await;
            }
            Ok(None) => {
                drop(pipeline);
                tokio::select! {
                    () = wake.notified() => {}
                    () = stop.cancelled() => {}
                }
            }
            Err(error) => {
                drop(pipeline);
                tracing::warn!(%error, "cannot claim durable calls; trying again");
                tokio::select! {
                    () = tokio::time::sleep(POLL * 2) => {}
                    () = stop.cancelled() => {}
                }
            }
        }
    }
}

/// Runs a claimed call while renewing its lease; records the outcome if the call is still
/// this node's when it ends.
async fn run(pipeline: &Pipeline, call: DurableCall, lease: Duration) {
    let (store, node) = (&pipeline.store, &pipeline.node);
    let renew = async {
        loop {
            tokio::time::sleep(lease / 3).await;
            let until = now_ms() + lease.as_millis() as u64;
            match store.durable_renew(&call.id, node, until).await {
                Ok(true) => {}
                // Another node has it now: this run's outcome would not count.
                Ok(false) => return,
                Err(error) => tracing::warn!(%error, call = call.id, "lease not renewed"),
            }
        }
    };
    let caller = &call.caller;
    let running = pipeline.call(
        caller,
        &call.tool,
        call.args.clone(),
        Some(&call.id),
        Budget::TOP,
        None,
    );
    let outcome = tokio::select! {
        outcome = running => outcome,
        () = renew => return,
    };
    let outcome = outcome.to_json();
    // A failing store gets until the lease ends; then the call is another node's to decide.
    for _ in 0..3 {
        match store.durable_finish(&call.id, node, &outcome).await {
            Ok(_) => {
                pipeline.durable_wakes.ended.notify_waiters();
                return;
            }
            Err(error) => {
                tracing::warn!(%error, call = call.id, "outcome not recorded; retrying");
                tokio::time::sleep(lease / 4).await;
            }
        }
    }
}

/// Forgets ended calls past [`KEEP_ENDED`], every ten minutes.
async fn purge(pipeline: Weak<Pipeline>) {
    loop {
        tokio::time::sleep(Duration::from_secs(600)).await;
        let Some(pipeline) = pipeline.upgrade() else {
            return;
        };
        let before = now_ms().saturating_sub(KEEP_ENDED.as_millis() as u64);
        if let Err(error) = pipeline.store.durable_purge(before).await {
            tracing::warn!(%error, "ended durable calls not purged");
        }
    }
}

impl Pipeline {
    /// Queues a call of `name` for any node to run; its call id.
    pub async fn submit(
        &self,
        caller: &Caller,
        name: &str,
        args: Value,
    ) -> Result<String, CallError> {
        let tool =
            self.catalog
                .resolve(&caller.tenant, name)
                .ok_or_else(|| CallError::NotFound {
                    name: name.to_owned(),
                })?;
        let unavailable = |error: StoreError| CallError::StorageUnavailable {
            message: format!("the call was not queued: {error}"),
        };
        let _submitting = SUBMITS.take(&caller.tenant).await;
        let unended = self
            .store
            .durable_unfinished(&caller.tenant)
            .await
            .map_err(unavailable)?;
        if unended >= MAX_UNENDED_PER_TENANT {
            return Err(CallError::RateLimited {
                limit: "durable calls",
                message: format!(
                    "the tenant has {MAX_UNENDED_PER_TENANT} durable calls that have not ended"
                ),
                retry_after_ms: None,
            });
        }
        use toolhost_spec::clip::{MAX_STORED_DEPTH, json_depth};
        for (what, value) in [("arguments", &args), ("caller data", &caller.data)] {
            let size = toolhost_spec::clip::json_bytes(value);
            let refused = if size > MAX_DURABLE_ARGS_BYTES as u64 {
                format!(
                    "a durable call's {what} are at most {MAX_DURABLE_ARGS_BYTES} bytes of JSON; \
                     these are {size}"
                )
            } else if json_depth(value) > MAX_STORED_DEPTH {
                format!(
                    "a durable call's {what} nest at most {MAX_STORED_DEPTH} levels of arrays \
                     and objects; these nest {}",
                    json_depth(value)
                )
            } else {
                continue;
            };
            return Err(CallError::InvalidArgs {
                errors: vec![toolhost_spec::schema::ArgError {
                    path: String::new(),
                    message: refused,
                }],
            });
        }
        let spec = tool.spec();
        let call = DurableCall {
            id: self.call_ids.next(),
            caller: caller.clone(),
            tool: name.to_owned(),
            args,
            // A node's death is no fault of the tool: an idempotent one runs again at least once.
            retries_left: match spec.idempotent {
                true => spec.retry_count_on_stall.max(1),
                false => 0,
            },
            attempts: 0,
            created_at_ms: now_ms(),
            state: DurableState::Queued,
        };
        self.store.durable_put(&call).await.map_err(unavailable)?;
        self.durable_wakes.submitted.notify_one();
        Ok(call.id)
    }

    /// The tenant's durable call `id`, waiting up to `wait` for it to end, if the tenant has
    /// fewer than [`MAX_DURABLE_WAITS_PER_TENANT`] reads waiting (else it answers at once).
    pub async fn durable(
        &self,
        tenant: &str,
        id: &str,
        wait: Duration,
    ) -> Result<Option<DurableStatus>, StoreError> {
        // Call ids are printable: no such call, and a database would refuse some (a NUL).
        if id.is_empty() || id.len() > 128 || id.chars().any(char::is_control) {
            return Ok(None);
        }
        let waiting = (!wait.is_zero()).then(|| WAITS.try_take(tenant)).flatten();
        let wait = if waiting.is_some() {
            wait
        } else {
            Duration::ZERO
        };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before the read, so an end between the two is not missed.
            let ended = self.durable_wakes.ended.notified();
            let call = self.store.durable_get(id).await?;
            // Another tenant's call is as absent as one that never was.
            let Some(call) = call.filter(|call| call.caller.tenant == tenant) else {
                return Ok(None);
            };
            let status = DurableStatus::of(call);
            if status.ended() || tokio::time::Instant::now() >= deadline {
                return Ok(Some(status));
            }
            // Woken when a call ends on this node or another; a missed notice costs 100 ms.
            let next = tokio::time::Instant::now() + Duration::from_millis(100);
            tokio::select! {
                () = ended => {}
                () = tokio::time::sleep_until(next.min(deadline)) => {}
            }
        }
    }
}
