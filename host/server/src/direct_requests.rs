//! `tools/call`, `tools/list` and `ping` in an open MCP session, answered in the task that
//! reads the HTTP request.
//!
//! rmcp passes each request of a session from that task to the session's worker, on to its
//! service loop and to a task of the request's own, and the answer back the same way: about
//! nine hand-offs between tasks, which made an MCP call cost 91–130 µs more than the same
//! call on the REST route, and 36–63 µs without them (BENCHMARKS.md). A request needs none of
//! them, as its answer goes on a stream of its own. So this session manager answers those
//! three itself, through the same `handle_request` and with the same context rmcp builds (the
//! session's peer, the request's metadata and HTTP parts), keeps its events for a resume as
//! rmcp does, and hands every other message to rmcp's [`LocalSessionManager`]. A session's
//! handler registers here once the session is initialized; until then, for a request id
//! already in flight, and once in half rmcp's idle time, requests take rmcp's way.
//!
//! Not kept from rmcp's way: a request the handler sent to the client during a call would go
//! on the session's standalone stream rather than the call's (SEP-2260). toolhost's handler
//! sends none.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, GetExtensions, GetMeta, RequestId,
    ServerJsonRpcMessage,
};
use rmcp::service::RequestContext;
use rmcp::transport::common::server_side_http::ServerSseMessage;
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, SessionError,
};
use rmcp::transport::streamable_http_server::session::{EventStore, RestoreOutcome, SessionId};
use rmcp::{Peer, RoleServer, Service};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::mcp::McpServer;

/// One tenant's MCP sessions: rmcp's, with calls, listings and pings answered in place.
pub(crate) struct DirectSessions {
    rmcp: LocalSessionManager,
    handlers: Arc<Handlers>,
}

type Handlers = Mutex<HashMap<SessionId, Handler>>;

fn lock(handlers: &Handlers) -> std::sync::MutexGuard<'_, HashMap<SessionId, Handler>> {
    handlers.lock().unwrap_or_else(|p| p.into_inner())
}

/// What answers a session's requests here.
struct Handler {
    server: McpServer,
    peer: Peer<RoleServer>,
    /// Requests answered here and not yet finished, for `notifications/cancelled`.
    in_flight: HashMap<RequestId, CancellationToken>,
    /// When rmcp's worker last saw a request of this session: its idle timer closes a session
    /// it has not seen for `keep_alive`, so a request takes rmcp's way after half of that.
    rmcp_saw: Instant,
}

impl DirectSessions {
    pub(crate) fn new(rmcp: LocalSessionManager) -> Self {
        DirectSessions {
            rmcp,
            handlers: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Handler>> {
        lock(&self.handlers)
    }

    /// Session `id` is initialized: its requests are answered by `server` with `peer` from now.
    pub(crate) fn register(&self, id: SessionId, server: McpServer, peer: Peer<RoleServer>) {
        let handler = Handler {
            server,
            peer,
            in_flight: HashMap::new(),
            rmcp_saw: Instant::now(),
        };
        self.lock().insert(id, handler);
    }

    /// rmcp's worker of session `id` is about to see a message.
    fn to_rmcp(&self, id: &SessionId) {
        if let Some(handler) = self.lock().get_mut(id) {
            handler.rmcp_saw = Instant::now();
        }
    }

    /// The server, the context and the place of a request of session `id` answered here; `None`
    /// when it takes rmcp's way.
    fn take_request(
        &self,
        id: &SessionId,
        request_id: &RequestId,
    ) -> Option<(McpServer, RequestContext<RoleServer>, InFlight)> {
        let rmcp_idle = self.rmcp.session_config.keep_alive.map(|idle| idle / 2);
        let mut handlers = self.lock();
        let handler = handlers.get_mut(id)?;
        if handler.in_flight.contains_key(request_id)
            || rmcp_idle.is_some_and(|idle| handler.rmcp_saw.elapsed() >= idle)
        {
            return None;
        }
        let mut context = RequestContext::new(request_id.clone(), handler.peer.clone());
        handler
            .in_flight
            .insert(request_id.clone(), context.ct.clone());
        let in_flight = InFlight {
            handlers: self.handlers.clone(),
            session: id.clone(),
            request: request_id.clone(),
        };
        context.ct = context.ct.child_token();
        Some((handler.server.clone(), context, in_flight))
    }

    /// The events of a request's stream: a priming event first (an id to resume from, as rmcp
    /// sends), and its answer; each kept in the event store, as rmcp keeps them, so that a
    /// client that lost the stream gets the answer with `Last-Event-ID`.
    async fn stored(
        events: Option<Arc<dyn EventStore>>,
        stream: &str,
        mut event: ServerSseMessage,
    ) -> Result<ServerSseMessage, LocalSessionManagerError> {
        if let Some(events) = events {
            let id = (events.store_event(stream, &event).await)
                .map_err(|e| LocalSessionManagerError::SessionError(SessionError::EventStore(e)))?;
            event.event_id = Some(id);
        }
        Ok(event)
    }
}

/// A request answered here, until it finishes or its stream is dropped.
struct InFlight {
    handlers: Arc<Handlers>,
    session: SessionId,
    request: RequestId,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(handler) = lock(&self.handlers).get_mut(&self.session) {
            handler.in_flight.remove(&self.request);
        }
    }
}

impl SessionManager for DirectSessions {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.rmcp.create_session().await
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.rmcp.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.rmcp.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        // As rmcp ends its requests with the session.
        if let Some(handler) = self.lock().remove(id) {
            handler
                .in_flight
                .values()
                .for_each(CancellationToken::cancel);
        }
        self.rmcp.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let ClientJsonRpcMessage::Request(mut request) = message else {
            self.to_rmcp(id);
            return Ok(self.rmcp.create_stream(id, message).await?.left_stream());
        };
        let answered_here = matches!(
            request.request,
            ClientRequest::CallToolRequest(_)
                | ClientRequest::ListToolsRequest(_)
                | ClientRequest::PingRequest(_)
        );
        let taken = answered_here
            .then(|| self.take_request(id, &request.id))
            .flatten();
        let Some((server, mut context, in_flight)) = taken else {
            self.to_rmcp(id);
            let message = ClientJsonRpcMessage::Request(request);
            return Ok(self.rmcp.create_stream(id, message).await?.left_stream());
        };
        // As rmcp's service loop builds a request's context.
        std::mem::swap(&mut context.meta, request.request.get_meta_mut());
        std::mem::swap(&mut context.extensions, request.request.extensions_mut());
        let stream = random_stream_id();
        let retry = self.rmcp.session_config.sse_retry;
        let priming = match retry {
            Some(retry) => {
                let priming = ServerSseMessage::retry(retry);
                Some(Self::stored(self.rmcp.event_store(), &stream, priming).await?)
            }
            None => None,
        };
        let events = self.rmcp.event_store();
        let answer = async move {
            let request_id = context.id.clone();
            let answer = match server.handle_request(request.request, context).await {
                Ok(result) => ServerJsonRpcMessage::response(result, request_id),
                Err(error) => ServerJsonRpcMessage::error(error, Some(request_id)),
            };
            drop(in_flight);
            let answer = ServerSseMessage::from_message(answer);
            match Self::stored(events, &stream, answer.clone()).await {
                Ok(stored) => stored,
                Err(error) => {
                    tracing::warn!(%error, "an MCP answer not kept for resumption");
                    answer
                }
            }
        };
        // rmcp's HTTP service asks a stream to be `Sync`; the request is polled by one task only.
        let answer = futures::stream::once(Detaching(Some(Box::pin(answer))));
        let answer = sync_wrapper::SyncStream::new(answer);
        Ok(futures::stream::iter(priming).chain(answer).right_stream())
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        if let ClientJsonRpcMessage::Notification(notification) = &message
            && let ClientNotification::CancelledNotification(cancelled) = &notification.notification
            && let Some(request) = &cancelled.params.request_id
            && let Some(handler) = self.lock().get(id)
            && let Some(call) = handler.in_flight.get(request)
        {
            call.cancel();
        }
        self.to_rmcp(id);
        self.rmcp.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.to_rmcp(id);
        self.rmcp.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.rmcp.resume(id, last_event_id).await
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.rmcp.restore_session(id).await
    }

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.rmcp.event_store()
    }
}

/// A request that finishes even when its client goes away: its answer is kept for a resume, as
/// rmcp's task per request keeps running. Dropped unfinished, it moves to a task of its own.
struct Detaching<F: Future<Output = ServerSseMessage> + Send + 'static>(Option<Pin<Box<F>>>);

impl<F: Future<Output = ServerSseMessage> + Send + 'static> Future for Detaching<F> {
    type Output = ServerSseMessage;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ServerSseMessage> {
        let call = self.0.as_mut().expect("polled after it finished");
        let answer = std::task::ready!(call.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(answer)
    }
}

impl<F: Future<Output = ServerSseMessage> + Send + 'static> Drop for Detaching<F> {
    fn drop(&mut self) {
        if let Some(call) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(call);
        }
    }
}

/// A stream id no client can guess, as rmcp's are (a random UUID): event ids name it, and a
/// resume is looked up by it.
fn random_stream_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS gives random bytes");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
