//! Calls waiting for the embedding app to approve or reject them.
//!
//! Written through to the store, so a restart keeps them: the app can still decide a call it
//! was asked about before the restart. Each tenant holds at most [`MAX_PENDING_PER_TENANT`],
//! each for at most [`PENDING_TTL`] and with at most [`MAX_HELD_ARGS_BYTES`] of arguments,
//! and at most [`MAX_HELD_BYTES_PER_TENANT`] of memory for arguments and caller data together.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use toolhost_spec::call::Caller;
use toolhost_store::{HeldCall, Store, StoreError, now_ms};

/// Calls one tenant may have waiting at once.
pub const MAX_PENDING_PER_TENANT: usize = 1000;
/// A held call's arguments, as JSON, are at most this many bytes: a tenant's held calls
/// stay in memory and in the store for up to [`PENDING_TTL`].
pub const MAX_HELD_ARGS_BYTES: u64 = 64 * 1024;
/// A tenant's held calls' arguments and caller data hold at most this many bytes of memory
/// together, as parsed values (an array of small numbers holds 36 times its JSON).
pub const MAX_HELD_BYTES_PER_TENANT: u64 = 4 << 20;
/// A call not decided within this is dropped.
pub const PENDING_TTL: Duration = Duration::from_secs(3600);

/// A call waiting for a decision, as the app sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingCall {
    /// Its id, to approve or reject it by.
    pub call_id: String,
    /// The tool, by name.
    pub tool: String,
    /// The validated arguments.
    pub args: Value,
    /// Milliseconds it has waited.
    pub waiting_ms: u64,
}

/// Why an approval or rejection failed.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    /// Unknown, expired, already decided, or another tenant's: all look the same.
    #[error("no call `{0}` is waiting for approval")]
    NotPending(String),
    /// The tenant has [`MAX_PENDING_PER_TENANT`] calls waiting.
    #[error("tenant already has {MAX_PENDING_PER_TENANT} calls waiting for approval")]
    TooMany,
    /// The tenant's held calls would hold over [`MAX_HELD_BYTES_PER_TENANT`].
    #[error(
        "a tenant's calls held for approval hold at most {MAX_HELD_BYTES_PER_TENANT} bytes of \
         memory for their arguments and caller data together; with this call they would hold {0}"
    )]
    TooMuchHeld(u64),
    /// The call's arguments are over [`MAX_HELD_ARGS_BYTES`] of JSON.
    #[error(
        "a call held for approval has at most {MAX_HELD_ARGS_BYTES} bytes of arguments as JSON; these are {0}"
    )]
    ArgsTooLarge(u64),
    /// The call's arguments or caller data nest deeper than the store reads back.
    #[error(
        "a call held for approval has arguments and caller data that nest at most {most} levels of arrays and objects; these nest {0}",
        most = toolhost_spec::clip::MAX_STORED_DEPTH
    )]
    TooDeep(usize),
    /// The decision was not recorded, so the call stays pending.
    #[error("storage: {0}")]
    Store(#[from] StoreError),
}

/// A held call, and the memory its arguments and its caller's data hold. Shared, so that a
/// listing copies it after letting go of the lock every tenant's holds take.
struct Held {
    call: Arc<HeldCall>,
    bytes: u64,
}

impl Held {
    fn new(call: HeldCall) -> Self {
        let held_bytes = |value| toolhost_spec::clip::held_bytes(value) as u64;
        let bytes = held_bytes(&call.args) + held_bytes(&call.caller.data);
        let call = Arc::new(call);
        Held { call, bytes }
    }
}

/// Past its TTL, or held further in the future than the TTL (the wall clock went back more
/// than that): a jump back neither expires a call early nor keeps one forever.
fn expired(held: &HeldCall, now_ms: u64) -> bool {
    let ttl = PENDING_TTL.as_millis() as u64;
    held.waiting_ms(now_ms) >= ttl || held.held_at_ms.saturating_sub(now_ms) > ttl
}

/// A tenant's turn to hold or decide a call.
struct Writing<'a> {
    _tenant: tokio::sync::OwnedMutexGuard<()>,
    _reload: tokio::sync::RwLockReadGuard<'a, ()>,
}

pub(crate) struct Approvals {
    store: Arc<dyn Store>,
    /// By tenant, then call id; the same as the store's records, read at start and again
    /// when another node holds or decides one.
    pending: Mutex<HashMap<String, HashMap<String, Held>>>,
    /// One hold or decision of a tenant at a time, so its count holds; each waits on its own
    /// tenant's only (a store write each), never on another tenant's. One entry per tenant
    /// that ever held a call.
    writing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// A reload replaces every tenant's calls: it waits for the holds and decisions under way.
    reloading: tokio::sync::RwLock<()>,
}

impl Approvals {
    /// The calls the store holds, less those that expired while the host was down.
    pub async fn load(store: Arc<dyn Store>) -> Result<Self, StoreError> {
        let approvals = Approvals {
            store,
            pending: Mutex::default(),
            writing: Mutex::default(),
            reloading: tokio::sync::RwLock::new(()),
        };
        approvals.reload().await?;
        Ok(approvals)
    }

    /// Reads the held calls again (another node held or decided one).
    pub async fn reload(&self) -> Result<(), StoreError> {
        let _reloading = self.reloading.write().await;
        let now = now_ms();
        let mut pending: HashMap<String, HashMap<String, Held>> = HashMap::new();
        for (call_id, held) in self.store.held_calls().await? {
            if expired(&held, now) {
                self.store.held_call_remove(&call_id).await?;
            } else {
                let tenant = pending.entry(held.caller.tenant.clone()).or_default();
                tenant.insert(call_id, Held::new(held));
            }
        }
        *self.lock() = pending;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<String, Held>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for `tenant`'s turn to hold or decide a call, and for no reload to be under way.
    async fn writing(&self, tenant: &str) -> Writing<'_> {
        let reload = self.reloading.read().await;
        let of_tenant = {
            let mut writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
            writing.entry(tenant.to_owned()).or_default().clone()
        };
        Writing {
            _tenant: of_tenant.lock_owned().await,
            _reload: reload,
        }
    }

    /// Drops `call_id` of `tenant` from memory, and the tenant's entry once it holds none.
    fn forget(&self, tenant: &str, call_id: &str) {
        let mut pending = self.lock();
        if let Some(held) = pending.get_mut(tenant) {
            held.remove(call_id);
            if held.is_empty() {
                pending.remove(tenant);
            }
        }
    }

    pub async fn hold(
        &self,
        call_id: &str,
        caller: &Caller,
        tool: &str,
        args: Value,
    ) -> Result<(), ApprovalError> {
        let size = toolhost_spec::clip::json_bytes(&args);
        if size > MAX_HELD_ARGS_BYTES {
            return Err(ApprovalError::ArgsTooLarge(size));
        }
        let depth = toolhost_spec::clip::json_depth(&args)
            .max(toolhost_spec::clip::json_depth(&caller.data));
        if depth > toolhost_spec::clip::MAX_STORED_DEPTH {
            return Err(ApprovalError::TooDeep(depth));
        }
        let _writing = self.writing(&caller.tenant).await;
        let now = now_ms();
        // Only the tenant's own: another tenant's thousand expired calls are not this call's
        // to remove (a reload drops them).
        let tenant = &caller.tenant;
        let expired: Vec<String> = match self.lock().get(tenant) {
            Some(of_tenant) => (of_tenant.iter())
                .filter(|(_, held)| expired(&held.call, now))
                .map(|(id, _)| id.clone())
                .collect(),
            None => Vec::new(),
        };
        for id in expired {
            // Dropped from memory only once the store has let go, so the two stay the same.
            self.store.held_call_remove(&id).await?;
            self.forget(tenant, &id);
        }
        let held = Held::new(HeldCall {
            caller: caller.clone(),
            tool: tool.to_owned(),
            args,
            held_at_ms: now,
        });
        let (count, bytes) = match self.lock().get(&caller.tenant) {
            Some(of_tenant) => (of_tenant.len(), of_tenant.values().map(|h| h.bytes).sum()),
            None => (0, 0),
        };
        if count >= MAX_PENDING_PER_TENANT {
            return Err(ApprovalError::TooMany);
        }
        if bytes + held.bytes > MAX_HELD_BYTES_PER_TENANT {
            return Err(ApprovalError::TooMuchHeld(bytes + held.bytes));
        }
        self.store.held_call_put(call_id, &held.call).await?;
        let mut pending = self.lock();
        let of_tenant = pending.entry(caller.tenant.clone()).or_default();
        of_tenant.insert(call_id.to_owned(), held);
        Ok(())
    }

    /// Removes the call, so that it is decided at most once, also across a restart and
    /// across nodes: only the caller whose removal took it from the store gets it.
    pub async fn take(&self, tenant: &str, call_id: &str) -> Result<HeldCall, ApprovalError> {
        let _writing = self.writing(tenant).await;
        let now = now_ms();
        let held = (self.lock().get(tenant))
            .and_then(|of_tenant| of_tenant.get(call_id))
            .filter(|held| !expired(&held.call, now))
            .map(|held| held.call.clone());
        let not_pending = || ApprovalError::NotPending(call_id.to_owned());
        let held = held.ok_or_else(not_pending)?;
        let taken = self.store.held_call_remove(call_id).await?;
        self.forget(tenant, call_id);
        let held = Arc::unwrap_or_clone(held);
        taken.then_some(held).ok_or_else(not_pending)
    }

    pub fn list(&self, tenant: &str) -> Vec<PendingCall> {
        let now = now_ms();
        let held: Vec<(String, Arc<HeldCall>)> = match self.lock().get(tenant) {
            Some(of_tenant) => (of_tenant.iter())
                .filter(|(_, held)| !expired(&held.call, now))
                .map(|(id, held)| (id.clone(), held.call.clone()))
                .collect(),
            None => return Vec::new(),
        };
        let mut calls: Vec<PendingCall> = held
            .into_iter()
            .map(|(call_id, held)| PendingCall {
                call_id,
                tool: held.tool.clone(),
                args: held.args.clone(),
                waiting_ms: held.waiting_ms(now),
            })
            .collect();
        calls.sort_by(|a, b| {
            b.waiting_ms
                .cmp(&a.waiting_ms)
                .then(a.call_id.cmp(&b.call_id))
        });
        calls
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toolhost_store::RedbStore;

    #[test]
    fn a_clock_jump_neither_expires_a_held_call_early_nor_keeps_it_forever() {
        let t = 1_900_000_000_000_u64;
        let ttl = PENDING_TTL.as_millis() as u64;
        let held = HeldCall {
            caller: Caller::tenant("acme"),
            tool: "wire_money".into(),
            args: Value::Null,
            held_at_ms: t,
        };
        assert!(!expired(&held, t + ttl - 1), "within its TTL");
        assert!(!expired(&held, t - ttl / 2), "half a TTL back: still held");
        assert!(expired(&held, t + ttl), "at its TTL");
        assert!(
            expired(&held, t - 2 * ttl),
            "two TTLs back: its age is unknown"
        );
        assert!(expired(&held, 0), "the clock at the epoch: no overflow");
    }

    /// Holds calls of `caller` with `args` (as `tenant-N`) until one is refused: how many
    /// were held, and why the next was not.
    async fn hold_until_refused(
        approvals: &Approvals,
        caller: &Caller,
        args: &Value,
    ) -> (u64, ApprovalError) {
        let mut held = 0;
        loop {
            let id = format!("{}-{held}", caller.tenant);
            match approvals.hold(&id, caller, "wire", args.clone()).await {
                Ok(()) => held += 1,
                Err(error) => return (held, error),
            }
        }
    }

    #[tokio::test]
    async fn a_tenants_held_calls_hold_a_bounded_number_of_bytes() {
        let store: Arc<dyn Store> = Arc::new(RedbStore::temporary().unwrap());
        let approvals = Approvals::load(store).await.unwrap();
        let args = json!({"pad": "x".repeat(60_000)});
        let (acme, globex) = (Caller::tenant("acme"), Caller::tenant("globex"));
        let (held, refused) = hold_until_refused(&approvals, &acme, &args).await;
        let held_bytes = |value| toolhost_spec::clip::held_bytes(value) as u64;
        let each = held_bytes(&args) + held_bytes(&Value::Null); // and no caller data
        assert_eq!(held, MAX_HELD_BYTES_PER_TENANT / each);
        assert!(
            matches!(refused, ApprovalError::TooMuchHeld(bytes) if bytes > MAX_HELD_BYTES_PER_TENANT),
            "{refused}"
        );
        // The caller's data counts too.
        let with_data = globex.clone().with_data(json!("y".repeat(5 << 20)));
        let refused = approvals
            .hold("globex-0", &with_data, "wire", json!({}))
            .await;
        assert!(matches!(refused, Err(ApprovalError::TooMuchHeld(_))));
        approvals
            .hold("globex-1", &globex, "wire", args.clone())
            .await
            .unwrap();
        // Measured as the memory it holds: 20 KB of JSON, 10 001 `Value`s.
        let zeros = json!(vec![0; 10_000]);
        let initech = Caller::tenant("initech");
        let (zeros_held, refused) = hold_until_refused(&approvals, &initech, &zeros).await;
        assert!(
            matches!(refused, ApprovalError::TooMuchHeld(_)),
            "{refused}"
        );
        let each = held_bytes(&zeros) + held_bytes(&Value::Null);
        assert_eq!(zeros_held, MAX_HELD_BYTES_PER_TENANT / each);
        assert!(
            zeros_held < 100,
            "JSON would have let {} in",
            (4 << 20) / 20_000
        );
        // A decision makes room.
        approvals.take("acme", "acme-0").await.unwrap();
        approvals
            .hold("acme-again", &acme, "wire", args)
            .await
            .unwrap();
        assert_eq!(approvals.list("acme").len() as u64, held);
    }

    /// Holds and decisions went one at a time for all tenants, each with its store write: one
    /// tenant's stream of them kept another's approval-gated calls waiting.
    /// Held calls are stored: one nesting deeper than the store reads back is refused.
    #[tokio::test]
    async fn a_call_too_deep_to_read_back_is_not_held() {
        let store: Arc<dyn Store> = Arc::new(RedbStore::temporary().unwrap());
        let approvals = Approvals::load(store).await.unwrap();
        let mut deep = json!(null);
        for _ in 0..100 {
            deep = json!([deep]);
        }
        let acme = Caller::tenant("acme");
        let refused = approvals.hold("a", &acme, "wire", deep.clone()).await;
        assert!(
            matches!(refused, Err(ApprovalError::TooDeep(100))),
            "{refused:?}"
        );
        let refused = approvals
            .hold("b", &acme.with_data(deep), "wire", json!({}))
            .await;
        assert!(
            matches!(refused, Err(ApprovalError::TooDeep(100))),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn a_hold_waits_for_its_own_tenants_holds_only() {
        let store: Arc<dyn Store> = Arc::new(RedbStore::temporary().unwrap());
        let approvals = Approvals::load(store).await.unwrap();
        let (acme, globex) = (Caller::tenant("acme"), Caller::tenant("globex"));
        let acme_writing = approvals.writing("acme").await; // as if acme's store write were slow
        let hold = |id, caller| approvals.hold(id, caller, "wire", json!({}));
        let wait = std::time::Duration::from_millis(200);
        let globex_held = tokio::time::timeout(wait * 10, hold("g", &globex)).await;
        assert!(matches!(globex_held, Ok(Ok(()))), "globex waited on acme");
        let acme_held = tokio::time::timeout(wait, hold("a", &acme)).await;
        assert!(acme_held.is_err(), "acme's next hold waits for acme's turn");
        drop(acme_writing);
        hold("a", &acme).await.unwrap();
        assert_eq!(approvals.take("globex", "g").await.unwrap().tool, "wire");
    }

    /// A hold removed every tenant's expired calls, one store write each, holding the lock
    /// every hold takes: a tenant's thousand expired calls slowed another's next hold.
    #[tokio::test]
    async fn a_hold_removes_only_its_own_tenants_expired_calls() {
        let store: Arc<dyn Store> = Arc::new(RedbStore::temporary().unwrap());
        let approvals = Approvals::load(store.clone()).await.unwrap();
        let stale = HeldCall {
            caller: Caller::tenant("acme"),
            tool: "wire_money".into(),
            args: Value::Null,
            held_at_ms: now_ms() - PENDING_TTL.as_millis() as u64 - 1,
        };
        store.held_call_put("stale", &stale).await.unwrap();
        let of_acme = HashMap::from([("stale".to_owned(), Held::new(stale))]);
        approvals.lock().insert("acme".into(), of_acme);
        let stored = async || -> Vec<String> {
            let held = store.held_calls().await.unwrap();
            let mut ids: Vec<String> = held.into_iter().map(|(id, _)| id).collect();
            ids.sort();
            ids
        };
        let (acme, globex) = (Caller::tenant("acme"), Caller::tenant("globex"));
        approvals
            .hold("g", &globex, "wire", json!({}))
            .await
            .unwrap();
        assert_eq!(stored().await, ["g", "stale"], "not globex's to remove");
        approvals.hold("a", &acme, "wire", json!({})).await.unwrap();
        assert_eq!(stored().await, ["a", "g"]);
    }

    #[tokio::test]
    async fn calls_that_expired_while_the_host_was_down_are_dropped_at_load() {
        let store: Arc<dyn Store> = Arc::new(RedbStore::temporary().unwrap());
        let held = |age: Duration| HeldCall {
            caller: Caller::tenant("acme"),
            tool: "wire_money".into(),
            args: Value::Null,
            held_at_ms: now_ms() - age.as_millis() as u64,
        };
        store
            .held_call_put("old", &held(PENDING_TTL + Duration::from_secs(1)))
            .await
            .unwrap();
        store
            .held_call_put("fresh", &held(Duration::from_secs(60)))
            .await
            .unwrap();
        let approvals = Approvals::load(store.clone()).await.unwrap();
        let listed: Vec<String> = approvals
            .list("acme")
            .into_iter()
            .map(|p| p.call_id)
            .collect();
        assert_eq!(listed, ["fresh"]);
        let stored: Vec<String> = store
            .held_calls()
            .await
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(
            stored,
            ["fresh"],
            "the expired record is gone from the store too"
        );
        assert!(matches!(
            approvals.take("acme", "old").await,
            Err(ApprovalError::NotPending(_))
        ));
    }
}
