//! The recent events of every MCP stream, so that a client that reconnects with
//! `Last-Event-ID` gets what it missed, including a result that finished while it was away.
//!
//! rmcp's sessions keep a request's stream only until its response is sent, so a response sent
//! to a client that had just dropped its connection was lost. With this store rmcp replays
//! from here instead. Bounded by bytes in all, and fair between tenants: when the budget is
//! full, the oldest event of the tenant keeping the most goes, so a tenant can push out
//! another's events only while that one keeps more than it does.
//!
//! rmcp answers every resume from here, so a stream whose answer is still to come (a request
//! answered in place, marked [`TenantStore::awaiting`]) is replayed and then followed until
//! its answer is kept, or for [`RESUME_WAIT`] at most.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::StreamExt;

use rmcp::transport::common::server_side_http::ServerSseMessage;
use rmcp::transport::streamable_http_server::session::store::{
    EventId, EventStore, EventStoreError, EventStream,
};

/// The default budget for the events of all sessions together.
pub const DEFAULT_EVENT_BYTES: usize = 32 << 20;

/// The longest a resumed stream waits for its answer: a call's longest timeout.
pub const RESUME_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Recent events of all tenants, within a byte budget. Each tenant's sessions see them
/// through [`RecentEvents::of_tenant`].
pub struct RecentEvents {
    budget: usize,
    inner: Mutex<Events>,
}

#[derive(Default)]
struct Events {
    bytes: usize,
    tenants: HashMap<Arc<str>, TenantEvents>,
    /// Each tenant's next event's sequence: its own, from a random start, so that the gaps
    /// between its ids tell it nothing of other tenants' events; kept when the tenant's
    /// events all go, so that an id sent before never names a later event.
    next: HashMap<Arc<str>, u64>,
}

/// One tenant's events by stream. An event id is `stream/sequence`: the stream ids rmcp
/// makes are random UUIDs (a request's) or the session's id (its common stream), so an id is
/// known only to the client it was sent to, and it is looked up among its tenant's only.
#[derive(Default)]
struct TenantEvents {
    bytes: usize,
    by_stream: HashMap<String, Stream>,
    /// Every kept event, oldest first: (stream, sequence, bytes).
    order: VecDeque<(String, u64, usize)>,
}

#[derive(Default)]
struct Stream {
    kept: VecDeque<(u64, ServerSseMessage)>,
    /// The newest of its events dropped for the budget: a replay from before it has a gap.
    dropped_through: Option<u64>,
    /// Woken at each event kept, while the stream's answer is still to come.
    awaiting: Option<Arc<tokio::sync::Notify>>,
}

impl RecentEvents {
    /// Keeps at most `budget` bytes of events (as JSON).
    pub fn new(budget: usize) -> Arc<Self> {
        Arc::new(RecentEvents {
            budget,
            inner: Mutex::new(Events::default()),
        })
    }

    /// The event store of `tenant`'s sessions.
    pub fn of_tenant(self: &Arc<Self>, tenant: Arc<str>) -> TenantStore {
        TenantStore {
            events: self.clone(),
            tenant,
        }
    }

    /// Whether `tenant`'s client can resume after `last_event_id`; else why not.
    pub fn check_resume(&self, tenant: &str, last_event_id: &str) -> Result<(), CannotResume> {
        self.lock().stream_after(tenant, last_event_id).map(drop)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Events> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Events {
    /// The stream of `last_event_id` and its sequence number, if all that followed it is kept.
    fn stream_after(
        &self,
        tenant: &str,
        last_event_id: &str,
    ) -> Result<(&Stream, u64), CannotResume> {
        let (stream, sequence) = last_event_id
            .rsplit_once('/')
            .and_then(|(stream, seq)| Some((stream, seq.parse::<u64>().ok()?)))
            .ok_or(CannotResume::NotAnEventId)?;
        let kept = self
            .tenants
            .get(tenant)
            .and_then(|events| events.by_stream.get(stream))
            .filter(|kept| {
                kept.dropped_through
                    .is_none_or(|dropped| dropped <= sequence)
            })
            .ok_or(CannotResume::NotKept)?;
        // A stream's events are kept in the order they were sent: past its newest, never sent.
        let newest = kept.kept.back().map_or(0, |(newest, _)| *newest);
        if sequence > newest {
            return Err(CannotResume::NotAnEventId);
        }
        Ok((kept, sequence))
    }

    /// Drops the oldest event of the tenant keeping the most bytes.
    fn drop_one(&mut self) -> bool {
        let Some(tenant) = self
            .tenants
            .iter()
            .max_by_key(|(_, events)| events.bytes)
            .map(|(tenant, _)| tenant.clone())
        else {
            return false;
        };
        let events = self.tenants.get_mut(&tenant).expect("just found");
        let Some((stream, dropped, size)) = events.order.pop_front() else {
            self.tenants.remove(&tenant);
            return true;
        };
        events.bytes -= size;
        self.bytes -= size;
        // A tenant's oldest event is the oldest of its stream.
        if let Some(kept) = events.by_stream.get_mut(&stream) {
            kept.kept.pop_front();
            kept.dropped_through = Some(dropped);
            if kept.kept.is_empty()
                && let Some(gone) = events.by_stream.remove(&stream)
                && let Some(awaiting) = gone.awaiting
            {
                // A resume following it cannot go on: what it missed is gone.
                awaiting.notify_waiters();
            }
        }
        if events.order.is_empty() {
            self.tenants.remove(&tenant);
        }
        true
    }
}

/// What one kept event holds besides its message: its sequence, the event, its id, and its
/// place in the tenant's order (about 200 bytes on a 64-bit build). Counted so that events
/// without a message (a stream's priming event) are not free.
const EVENT_BOOKKEEPING_BYTES: usize = 256;

/// The bytes one event counts against the budget: its bookkeeping, its stream's id (kept
/// twice: in the stream's key and in the order) and its message as JSON.
fn event_bytes(stream_id: &str, event: &ServerSseMessage) -> usize {
    let message = (event.message.as_ref()).map_or(0, |m| toolhost::clip::json_bytes(&**m));
    EVENT_BOOKKEEPING_BYTES + 2 * stream_id.len() + message as usize
}

/// Why a client cannot resume after an event id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CannotResume {
    /// Not of the form this server gives (`stream/sequence`).
    #[error("not an event id of this server")]
    NotAnEventId,
    /// Unknown to this tenant, or what followed it is no longer kept.
    #[error("the events after this one are no longer kept")]
    NotKept,
}

/// One tenant's view of [`RecentEvents`]: what rmcp's sessions of that tenant store and
/// replay.
pub struct TenantStore {
    events: Arc<RecentEvents>,
    tenant: Arc<str>,
}

#[async_trait::async_trait]
impl EventStore for TenantStore {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<EventId, EventStoreError> {
        let bytes = event_bytes(stream_id, event);
        let mut all = self.events.lock();
        let next = all.next.entry(self.tenant.clone()).or_insert_with(|| {
            use std::hash::BuildHasher;
            std::hash::RandomState::new().hash_one(0u8) >> 32
        });
        let sequence = *next;
        *next += 1;
        let events = all.tenants.entry(self.tenant.clone()).or_default();
        let id = format!("{stream_id}/{sequence}");
        let mut kept = event.clone();
        kept.event_id = Some(id.clone());
        let stream = events.by_stream.entry(stream_id.to_owned()).or_default();
        stream.kept.push_back((sequence, kept));
        if let Some(awaiting) = &stream.awaiting {
            awaiting.notify_waiters();
        }
        events
            .order
            .push_back((stream_id.to_owned(), sequence, bytes));
        events.bytes += bytes;
        all.bytes += bytes;
        while all.bytes > self.events.budget && all.drop_one() {}
        Ok(id)
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        let (stream, sequence) = {
            let all = self.events.lock();
            let (_, sequence) = all.stream_after(&self.tenant, last_event_id)?;
            let stream = last_event_id.rsplit_once('/').map(|(stream, _)| stream);
            (stream.unwrap_or_default().to_owned(), sequence)
        };
        let follow = Follow {
            events: self.events.clone(),
            tenant: self.tenant.clone(),
            stream,
            after: sequence,
            until: tokio::time::Instant::now() + RESUME_WAIT,
        };
        let events = futures::stream::unfold(follow, Follow::next).flat_map(futures::stream::iter);
        Ok(Box::pin(sync_wrapper::SyncStream::new(events)))
    }
}

impl TenantStore {
    /// `stream`'s answer is still to come: a resume follows it until [`TenantStore::answered`].
    pub fn awaiting(&self, stream: &str) {
        let mut all = self.events.lock();
        let kept = (all.tenants.get_mut(&self.tenant)).and_then(|t| t.by_stream.get_mut(stream));
        if let Some(kept) = kept {
            kept.awaiting = Some(Arc::default());
        }
    }

    /// `stream` will have no more events: resumes following it end.
    pub fn answered(&self, stream: &str) {
        let mut all = self.events.lock();
        let kept = (all.tenants.get_mut(&self.tenant)).and_then(|t| t.by_stream.get_mut(stream));
        if let Some(awaiting) = kept.and_then(|kept| kept.awaiting.take()) {
            awaiting.notify_waiters();
        }
    }
}

/// A resumed stream: what it kept after `after`, then what comes while it awaits its answer.
struct Follow {
    events: Arc<RecentEvents>,
    tenant: Arc<str>,
    stream: String,
    after: u64,
    until: tokio::time::Instant,
}

impl Follow {
    /// The stream's next events, once there are some; `None` once it has no more to come.
    async fn next(mut self) -> Option<(Vec<ServerSseMessage>, Self)> {
        loop {
            let (events, awaiting) = {
                let all = self.events.lock();
                let Ok((kept, _)) = all.stream_after(&self.tenant, &self.last_event_id()) else {
                    return None;
                };
                let events: Vec<(u64, ServerSseMessage)> = (kept.kept.iter())
                    .filter(|(seq, _)| *seq > self.after)
                    .cloned()
                    .collect();
                // Registered under the lock: an event kept after it is not missed.
                let awaiting = kept.awaiting.clone().map(|notify| {
                    let mut notified = Box::pin(notify.notified_owned());
                    notified.as_mut().enable();
                    notified
                });
                (events, awaiting)
            };
            if let Some((newest, _)) = events.last() {
                self.after = *newest;
                return Some((events.into_iter().map(|(_, e)| e).collect(), self));
            }
            let awaiting = awaiting?;
            tokio::time::timeout_at(self.until, awaiting).await.ok()?;
        }
    }

    fn last_event_id(&self) -> String {
        format!("{}/{}", self.stream, self.after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use rmcp::model::{ServerJsonRpcMessage, ServerResult};

    fn event(text: &str) -> ServerSseMessage {
        let message = ServerJsonRpcMessage::response(
            ServerResult::empty(()),
            rmcp::model::NumberOrString::String(text.into()),
        );
        ServerSseMessage::from_message(message)
    }

    async fn replay(events: &TenantStore, after: &str) -> Result<Vec<String>, String> {
        let stream = events
            .replay_events_after(after)
            .await
            .map_err(|e| e.to_string())?;
        Ok(stream.map(|e| e.event_id.unwrap()).collect().await)
    }

    #[tokio::test]
    async fn a_stream_replays_what_followed_an_event_and_nothing_of_another_stream() {
        let events = RecentEvents::new(1 << 20).of_tenant("t".into());
        let a0 = events.store_event("a", &event("1")).await.unwrap();
        let b0 = events.store_event("b", &event("2")).await.unwrap();
        let a1 = events.store_event("a", &event("3")).await.unwrap();
        assert!(replay(&events, &a1).await.unwrap().is_empty());
        assert_eq!(replay(&events, &a0).await.unwrap(), [a1]);
        assert!(replay(&events, &b0).await.unwrap().is_empty());
        assert!(replay(&events, "a/x").await.is_err());
        assert!(replay(&events, "c/0").await.is_err(), "an unknown stream");
        let (_, newest) = b0.rsplit_once('/').unwrap();
        let never = format!("b/{}", newest.parse::<u64>().unwrap() + 1);
        assert!(
            replay(&events, &never).await.is_err(),
            "an event never sent"
        );
        assert!(replay(&events, &format!("b/{}", u64::MAX)).await.is_err());
    }

    /// A request answered in place may be resumed before its answer: the resume waits for
    /// it, and ends once no more is to come.
    #[tokio::test]
    async fn a_resumed_stream_awaiting_its_answer_gets_it_once_kept() {
        let events = Arc::new(RecentEvents::new(1 << 20).of_tenant("t".into()));
        let priming = events.store_event("s", &event("p")).await.unwrap();
        events.awaiting("s");
        let resumed = tokio::spawn({
            let (events, priming) = (events.clone(), priming.clone());
            async move { replay(&events, &priming).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!resumed.is_finished(), "the answer is still to come");
        let answer = events.store_event("s", &event("a")).await.unwrap();
        events.answered("s");
        assert_eq!(resumed.await.unwrap().unwrap(), [answer]);
        // A request cancelled before its answer: the resume ends with what was kept.
        let priming = events.store_event("c", &event("p")).await.unwrap();
        events.awaiting("c");
        events.answered("c");
        assert!(replay(&events, &priming).await.unwrap().is_empty());
    }

    /// Event ids tell a tenant nothing of another's events: each counts its own.
    #[tokio::test]
    async fn a_tenants_event_ids_count_its_own_events_only() {
        let all = RecentEvents::new(1 << 20);
        let (one, other) = (all.of_tenant("one".into()), all.of_tenant("other".into()));
        let sequence = |id: String| id.rsplit_once('/').unwrap().1.parse::<u64>().unwrap();
        let first = sequence(one.store_event("s", &event("1")).await.unwrap());
        for text in ["2", "3", "4"] {
            other.store_event("o", &event(text)).await.unwrap();
        }
        let second = sequence(one.store_event("s", &event("5")).await.unwrap());
        assert_eq!(second, first + 1);
    }

    #[tokio::test]
    async fn the_oldest_events_go_first_and_a_replay_past_them_is_refused() {
        let one = event_bytes("a", &event("1"));
        let all = RecentEvents::new(2 * one);
        let events = all.of_tenant("t".into());
        let mut ids = Vec::new();
        for text in ["0", "1", "2", "3"] {
            ids.push(events.store_event("a", &event(text)).await.unwrap());
        }
        assert_eq!(all.lock().bytes, 2 * one, "within the budget");
        assert!(
            replay(&events, &ids[0]).await.is_err(),
            "the event after the first is gone: a gap is not replayed as if whole"
        );
        assert_eq!(replay(&events, &ids[1]).await.unwrap(), ids[2..]);
        assert_eq!(replay(&events, &ids[2]).await.unwrap(), ids[3..]);
    }

    #[tokio::test]
    async fn events_without_a_message_count_against_the_budget() {
        let all = RecentEvents::new(64 << 10);
        let events = all.of_tenant("t".into());
        for n in 0..10_000 {
            let priming = ServerSseMessage::priming(format!("p{n}"), Default::default());
            events.store_event("s", &priming).await.unwrap();
        }
        let kept = all.lock().tenants["t"].order.len();
        assert!(kept <= (64 << 10) / EVENT_BOOKKEEPING_BYTES, "{kept} kept");
        assert!(all.lock().bytes <= 64 << 10);
    }

    #[tokio::test]
    async fn a_tenant_that_floods_pushes_out_its_own_events_not_anothers() {
        let one = event_bytes("a", &event("1"));
        let all = RecentEvents::new(4 * one);
        let (quiet, noisy) = (all.of_tenant("quiet".into()), all.of_tenant("noisy".into()));
        let first = quiet.store_event("q", &event("0")).await.unwrap();
        let kept = quiet.store_event("q", &event("1")).await.unwrap();
        for text in ["2", "3", "4", "5", "6", "7"] {
            noisy.store_event("n", &event(text)).await.unwrap();
        }
        assert_eq!(all.lock().bytes, 4 * one, "within the budget");
        assert_eq!(
            replay(&quiet, &first).await.unwrap(),
            std::slice::from_ref(&kept)
        );
        // Another tenant's stream is not found through this one's store, even by its id.
        assert!(replay(&noisy, &first).await.is_err());
        // Once the quiet tenant keeps more than the noisy one, its own oldest goes.
        for text in ["8", "9"] {
            quiet.store_event("q", &event(text)).await.unwrap();
        }
        assert!(replay(&quiet, &first).await.is_err(), "a gap is refused");
    }
}
