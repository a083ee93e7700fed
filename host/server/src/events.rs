//! The recent events of every MCP stream, so that a client that reconnects with
//! `Last-Event-ID` gets what it missed, including a result that finished while it was away.
//!
//! rmcp's sessions keep a request's stream only until its response is sent, so a response sent
//! to a client that had just dropped its connection was lost. With this store rmcp replays
//! from here instead. Bounded by bytes in all: the oldest events go first.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use rmcp::transport::common::server_side_http::ServerSseMessage;
use rmcp::transport::streamable_http_server::session::store::{
    EventId, EventStore, EventStoreError, EventStream,
};

/// The default budget for the events of all sessions together.
pub const DEFAULT_EVENT_BYTES: usize = 32 << 20;

/// Recent events by stream, within a byte budget. An event id is `stream/sequence`: the
/// stream ids rmcp makes are random UUIDs (a request's) or the session's id (its common
/// stream), so an id is known only to the client it was sent to.
pub struct RecentEvents {
    budget: usize,
    inner: Mutex<Events>,
}

#[derive(Default)]
struct Events {
    next: u64,
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
}

impl RecentEvents {
    /// Keeps at most `budget` bytes of events (as JSON).
    pub fn new(budget: usize) -> Self {
        RecentEvents {
            budget,
            inner: Mutex::new(Events::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Events> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait::async_trait]
impl EventStore for RecentEvents {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<EventId, EventStoreError> {
        let bytes = stream_id.len()
            + event
                .message
                .as_ref()
                .map_or(0, |m| serde_json::to_vec(&**m).map_or(0, |json| json.len()));
        let mut events = self.lock();
        let sequence = events.next;
        events.next += 1;
        let id = format!("{stream_id}/{sequence}");
        let mut kept = event.clone();
        kept.event_id = Some(id.clone());
        events
            .by_stream
            .entry(stream_id.to_owned())
            .or_default()
            .kept
            .push_back((sequence, kept));
        events
            .order
            .push_back((stream_id.to_owned(), sequence, bytes));
        events.bytes += bytes;
        while events.bytes > self.budget {
            let Some((stream, dropped, size)) = events.order.pop_front() else {
                break;
            };
            events.bytes -= size;
            // The oldest event overall is the oldest of its stream.
            if let Some(kept) = events.by_stream.get_mut(&stream) {
                kept.kept.pop_front();
                kept.dropped_through = Some(dropped);
                if kept.kept.is_empty() {
                    events.by_stream.remove(&stream);
                }
            }
        }
        Ok(id)
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        let (stream, sequence) = last_event_id
            .rsplit_once('/')
            .and_then(|(stream, seq)| Some((stream, seq.parse::<u64>().ok()?)))
            .ok_or("not an event id of this server")?;
        let events = self.lock();
        let kept = events
            .by_stream
            .get(stream)
            .filter(|kept| {
                kept.dropped_through
                    .is_none_or(|dropped| dropped <= sequence)
            })
            .ok_or("the events after this one are no longer kept")?;
        let after: Vec<ServerSseMessage> = kept
            .kept
            .iter()
            .filter(|(seq, _)| *seq > sequence)
            .map(|(_, event)| event.clone())
            .collect();
        Ok(Box::pin(futures::stream::iter(after)))
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

    async fn replay(events: &RecentEvents, after: &str) -> Result<Vec<String>, String> {
        let stream = events
            .replay_events_after(after)
            .await
            .map_err(|e| e.to_string())?;
        Ok(stream.map(|e| e.event_id.unwrap()).collect().await)
    }

    #[tokio::test]
    async fn a_stream_replays_what_followed_an_event_and_nothing_of_another_stream() {
        let events = RecentEvents::new(1 << 20);
        let a0 = events.store_event("a", &event("1")).await.unwrap();
        let b0 = events.store_event("b", &event("2")).await.unwrap();
        let a1 = events.store_event("a", &event("3")).await.unwrap();
        assert!(replay(&events, &a1).await.unwrap().is_empty());
        assert_eq!(replay(&events, &a0).await.unwrap(), [a1]);
        assert!(replay(&events, &b0).await.unwrap().is_empty());
        assert!(replay(&events, "a/x").await.is_err());
        assert!(replay(&events, "c/0").await.is_err(), "an unknown stream");
    }

    #[tokio::test]
    async fn the_oldest_events_go_first_and_a_replay_past_them_is_refused() {
        let one = 1 + serde_json::to_vec(&*event("1").message.unwrap())
            .unwrap()
            .len();
        let events = RecentEvents::new(2 * one);
        let mut ids = Vec::new();
        for text in ["0", "1", "2", "3"] {
            ids.push(events.store_event("a", &event(text)).await.unwrap());
        }
        assert_eq!(events.lock().bytes, 2 * one, "within the budget");
        assert!(
            replay(&events, &ids[0]).await.is_err(),
            "the event after the first is gone: a gap is not replayed as if whole"
        );
        assert_eq!(replay(&events, &ids[1]).await.unwrap(), ids[2..]);
        assert_eq!(replay(&events, &ids[2]).await.unwrap(), ids[3..]);
    }
}
