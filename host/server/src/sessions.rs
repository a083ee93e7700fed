//! Bounds on MCP sessions. Each session holds memory until it ends (20,000 took 1.1 GiB), so
//! there is a cap in all and one per tenant, and a session with no request for `idle` is
//! closed (within a quarter more; never while a call answered in place runs, as rmcp's way
//! sees none of them). A refused `initialize` is a clear error; a client whose session was
//! closed gets 404 and starts a new one, as the protocol says.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    SessionId, SessionState, SessionStore, SessionStoreError,
};
use tokio::time::Instant;
use toolhost::Store;

use crate::direct_requests::DirectSessions;
use crate::events::{DEFAULT_EVENT_BYTES, RecentEvents};

/// Bounds on MCP sessions over HTTP.
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    /// Sessions open at once, over all tenants.
    pub max_sessions: usize,
    /// Sessions one tenant may have open at once.
    pub max_per_tenant: usize,
    /// A session with no request for this long is closed.
    pub idle: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_sessions: 4096,
            max_per_tenant: 256,
            idle: Duration::from_secs(300),
        }
    }
}

/// Why a new session was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The host holds [`SessionLimits::max_sessions`].
    Host(usize),
    /// The tenant holds [`SessionLimits::max_per_tenant`].
    Tenant(usize),
}

struct Session {
    tenant: Arc<str>,
    last_seen: Instant,
    /// When this node opened or took up the session (Unix ms), at or after it kept it in a
    /// shared store: another node that takes it up later keeps it again, after this.
    kept_at_ms: u64,
}

#[derive(Default)]
struct Open {
    sessions: HashMap<SessionId, Session>,
    /// `initialize` requests admitted and not yet answered, in all and by tenant.
    opening: usize,
    opening_by_tenant: HashMap<Arc<str>, usize>,
}

/// The sessions rmcp serves, counted by tenant. Each tenant's are kept by a session manager
/// of its own, so a session id is found only with its tenant's key, and each replays events
/// from its tenant's share of one budget.
pub(crate) struct Sessions {
    managers: Mutex<HashMap<Arc<str>, Arc<DirectSessions>>>,
    events: Arc<RecentEvents>,
    limits: SessionLimits,
    open: Mutex<Open>,
    /// The shared store sessions are also kept in, if any: an idle one closed here is
    /// forgotten there too.
    shared: Option<Arc<dyn Store>>,
    /// Whether a task closes idle sessions (from the first session on).
    sweeping: AtomicBool,
}

/// A place held for one `initialize` until its answer names the session (or it fails).
pub(crate) struct Opening {
    sessions: Arc<Sessions>,
    tenant: Arc<str>,
}

impl Sessions {
    pub(crate) fn new(limits: SessionLimits) -> Self {
        Sessions {
            managers: Mutex::default(),
            events: RecentEvents::new(DEFAULT_EVENT_BYTES),
            limits,
            open: Mutex::new(Open::default()),
            shared: None,
            sweeping: AtomicBool::new(false),
        }
    }

    /// Sessions also kept in `store`, which many nodes share.
    pub(crate) fn shared_in(mut self, store: Arc<dyn Store>) -> Self {
        self.shared = Some(store);
        self
    }

    /// The session manager of `tenant`'s sessions.
    pub(crate) fn manager(&self, tenant: &str) -> Arc<DirectSessions> {
        let mut managers = self.managers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(manager) = managers.get(tenant) {
            return manager.clone();
        }
        let tenant: Arc<str> = tenant.into();
        let events = Arc::new(self.events.of_tenant(tenant.clone()));
        let mut manager = LocalSessionManager::default().with_event_store(events.clone());
        // rmcp's worker does not see the requests answered in place, so its idle timer would
        // close busy sessions: `close_idle` closes them instead.
        manager.session_config.keep_alive = None;
        let manager = Arc::new(DirectSessions::new(manager, Some(events)));
        managers.insert(tenant, manager.clone());
        manager
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the sessions with no request for the idle time. A session with a call answered
    /// in place still running is in use: it counts as seen now.
    async fn close_idle(&self) {
        let idle: Vec<(SessionId, Arc<str>, u64)> = {
            let mut open = self.lock();
            let now = Instant::now();
            let mut idle = Vec::new();
            for (id, session) in &mut open.sessions {
                if now.duration_since(session.last_seen) < self.limits.idle {
                    continue;
                }
                if self.manager(&session.tenant).busy(id) {
                    session.last_seen = now;
                } else {
                    idle.push((id.clone(), session.tenant.clone(), session.kept_at_ms));
                }
            }
            for (id, _, _) in &idle {
                open.sessions.remove(id);
            }
            idle
        };
        for (id, tenant, kept_at_ms) in idle {
            // Already gone (ended by the client or by rmcp) is fine.
            let _ = self.manager(&tenant).close_session(&id).await;
            // Idle here only, if another node took it up since: kept for that node.
            let forgotten = (self.shared.as_ref())
                .map(|store| store.remove_mcp_session_untouched_since(&id, kept_at_ms));
            if let Some(forgotten) = forgotten
                && let Err(error) = forgotten.await
            {
                tracing::warn!(%error, "an idle MCP session not forgotten by the store");
            }
        }
    }

    /// From the first session on, a task closes idle sessions every quarter of the idle time,
    /// until these sessions are dropped.
    fn sweep_in_background(self: &Arc<Self>) {
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let sessions = Arc::downgrade(self);
        let every = (self.limits.idle / 4).max(Duration::from_millis(10));
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(sessions) = Weak::upgrade(&sessions) else {
                    return;
                };
                sessions.close_idle().await;
            }
        });
    }

    /// Holds a place for a new session of `tenant`, after closing the idle ones.
    pub(crate) async fn admit(self: &Arc<Self>, tenant: &str) -> Result<Opening, Refused> {
        self.sweep_in_background();
        self.close_idle().await;
        let mut open = self.lock();
        let tenant: Arc<str> = tenant.into();
        if open.sessions.len() + open.opening >= self.limits.max_sessions {
            return Err(Refused::Host(self.limits.max_sessions));
        }
        let of_tenant = open
            .sessions
            .values()
            .filter(|s| s.tenant == tenant)
            .count()
            + open.opening_by_tenant.get(&tenant).copied().unwrap_or(0);
        if of_tenant >= self.limits.max_per_tenant {
            return Err(Refused::Tenant(self.limits.max_per_tenant));
        }
        open.opening += 1;
        *open.opening_by_tenant.entry(tenant.clone()).or_default() += 1;
        Ok(Opening {
            sessions: self.clone(),
            tenant,
        })
    }

    /// Whether `tenant`'s client can resume after `last_event_id`; else why not.
    pub(crate) fn check_resume(
        &self,
        tenant: &str,
        last_event_id: &str,
    ) -> Result<(), crate::events::CannotResume> {
        self.events.check_resume(tenant, last_event_id)
    }

    /// A request of `tenant` in session `id`: it is not idle. False for a session not open,
    /// or another tenant's.
    pub(crate) fn seen(&self, tenant: &str, id: &str) -> bool {
        let mut open = self.lock();
        let Some(session) = open.sessions.get_mut(id).filter(|s| &*s.tenant == tenant) else {
            return false;
        };
        session.last_seen = Instant::now();
        true
    }

    /// Session `id` ended at the client's request.
    pub(crate) fn ended(&self, id: &str) {
        self.lock().sessions.remove(id);
    }
}

impl Opening {
    /// The answer named the new session `id`.
    pub(crate) fn opened(self, id: &str) {
        let session = Session {
            tenant: self.tenant.clone(),
            last_seen: Instant::now(),
            kept_at_ms: toolhost::store::now_ms(),
        };
        self.sessions.lock().sessions.insert(id.into(), session);
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        let mut open = self.sessions.lock();
        open.opening -= 1;
        if let Some(n) = open.opening_by_tenant.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                open.opening_by_tenant.remove(&self.tenant);
            }
        }
    }
}

/// The largest session state (its `initialize` parameters) shared with other nodes.
const MAX_STORED_SESSION_BYTES: usize = 64 * 1024;

/// One tenant's MCP sessions in the host's shared store, as rmcp's session store: a node
/// that does not hold a session restores it from its `initialize` parameters, so a client's
/// requests may reach any node. Another tenant's session is as absent as one never opened.
pub(crate) struct StoredSessions {
    pub store: Arc<dyn Store>,
    pub tenant: Arc<str>,
}

#[async_trait::async_trait]
impl SessionStore for StoredSessions {
    async fn load(&self, id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        match self.store.mcp_session(id).await? {
            Some((tenant, state)) if *tenant == *self.tenant => {
                Ok(Some(serde_json::from_str(&state)?))
            }
            _ => Ok(None),
        }
    }

    async fn store(&self, id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let state = serde_json::to_string(state)?;
        if state.len() > MAX_STORED_SESSION_BYTES {
            // Served by this node only: another node answers 404 and the client starts over.
            tracing::warn!(
                bytes = state.len(),
                "MCP session too large to share with other nodes"
            );
            return Ok(());
        }
        let now = toolhost::store::now_ms();
        Ok(self
            .store
            .put_mcp_session(id, &self.tenant, &state, now)
            .await?)
    }

    async fn delete(&self, id: &str) -> Result<(), SessionStoreError> {
        Ok(self.store.remove_mcp_session(id).await?)
    }
}

impl Sessions {
    /// Takes a session that another node opened (it is in `stored`) into this node's count,
    /// under the same caps as a new one; whether it is the tenant's and fits.
    pub(crate) async fn adopt(self: &Arc<Self>, stored: &StoredSessions, id: &str) -> bool {
        let Some(state) = stored.load(id).await.ok().flatten() else {
            return false;
        };
        // In use: kept another day from now.
        if let Err(error) = stored.store(id, &state).await {
            tracing::warn!(%error, "an adopted MCP session not touched in the store");
        }
        match self.admit(&stored.tenant).await {
            Ok(opening) => {
                opening.opened(id);
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_sessions: usize, max_per_tenant: usize) -> SessionLimits {
        SessionLimits {
            max_sessions,
            max_per_tenant,
            idle: Duration::from_secs(60),
        }
    }

    #[tokio::test]
    async fn caps_hold_per_tenant_and_in_all_counting_sessions_being_opened() {
        let sessions = Arc::new(Sessions::new(limits(3, 2)));
        let a1 = sessions.admit("a").await.unwrap();
        let a2 = sessions.admit("a").await.unwrap();
        assert_eq!(sessions.admit("a").await.err(), Some(Refused::Tenant(2)));
        a1.opened("s1");
        drop(a2); // its initialize failed: the place is free again
        sessions.admit("a").await.unwrap().opened("s2");
        sessions.admit("b").await.unwrap().opened("s3");
        assert_eq!(sessions.admit("c").await.err(), Some(Refused::Host(3)));
        sessions.ended("s1");
        sessions.admit("c").await.unwrap().opened("s4");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_sessions_are_closed_and_free_their_place() {
        let sessions = Arc::new(Sessions::new(limits(1, 1)));
        sessions.admit("a").await.unwrap().opened("s1");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(sessions.seen("a", "s1"));
        assert!(!sessions.seen("b", "s1"), "another tenant's session");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(sessions.admit("b").await.err(), Some(Refused::Host(1)));
        tokio::time::advance(Duration::from_secs(2)).await;
        sessions.admit("b").await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn idle_sessions_are_closed_without_a_new_session_coming() {
        let sessions = Arc::new(Sessions::new(limits(10, 10)));
        sessions.admit("a").await.unwrap().opened("s1");
        sessions.admit("a").await.unwrap().opened("s2");
        // s2 is in use until 70 s; s1 is not after 0 s.
        for _ in 0..7 {
            tokio::time::sleep(Duration::from_secs(10)).await;
            assert!(sessions.seen("a", "s2"));
        }
        assert!(!sessions.seen("a", "s1"), "closed within 75 s");
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(sessions.seen("a", "s2"));
        tokio::time::sleep(Duration::from_secs(76)).await;
        assert!(!sessions.seen("a", "s2"));
    }
}
