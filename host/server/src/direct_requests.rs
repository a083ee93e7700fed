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
//! handler registers here once the session is initialized; until then, and for a request id
//! already in flight, requests take rmcp's way. rmcp's worker sees too few requests to judge a
//! session idle, so its idle timer is off and [`crate::sessions`] closes idle sessions.
//!
//! Not kept from rmcp's way: a request the handler sent to the client during a call would go
//! on the session's standalone stream rather than the call's (SEP-2260); toolhost's handler
//! sends none. And a cancelled request's stream ends when its handler returns, not at once:
//! a call follows its cancellation token, and a listing or a ping is over sooner.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, GetExtensions, GetMeta,
    JsonRpcRequest, RequestId, ServerJsonRpcMessage,
};
use rmcp::service::RequestContext;
use rmcp::transport::common::server_side_http::ServerSseMessage;
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, SessionError,
};
use rmcp::transport::streamable_http_server::session::{EventStore, RestoreOutcome, SessionId};
use rmcp::{Peer, RoleServer, Service};
use tokio_util::sync::CancellationToken;

use crate::events::TenantStore;
use crate::mcp::McpServer;

/// One tenant's MCP sessions: rmcp's, with calls, listings and pings answered in place.
pub(crate) struct DirectSessions {
    rmcp: LocalSessionManager,
    handlers: Arc<Handlers>,
    /// The event store rmcp was given, told which streams still await their answer.
    events: Option<Arc<TenantStore>>,
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
}

impl DirectSessions {
    /// Around `rmcp`, whose event store is `events`, if it has one.
    pub(crate) fn new(rmcp: LocalSessionManager, events: Option<Arc<TenantStore>>) -> Self {
        DirectSessions {
            rmcp,
            handlers: Arc::default(),
            events,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Handler>> {
        lock(&self.handlers)
    }

    /// Session `id` is initialized: its requests are answered by `server` with `peer` from now.
    /// Said again, it keeps the requests in flight.
    pub(crate) async fn register(&self, id: SessionId, server: McpServer, peer: Peer<RoleServer>) {
        match self.lock().entry(id.clone()) {
            Entry::Occupied(mut handler) => {
                let handler = handler.get_mut();
                (handler.server, handler.peer) = (server, peer);
            }
            Entry::Vacant(place) => {
                let in_flight = HashMap::new();
                place.insert(Handler {
                    server,
                    peer,
                    in_flight,
                });
            }
        }
        // Closed meanwhile (a `DELETE` may come before this): `close_session` ends rmcp's
        // session before it forgets the handler, so one of the two forgets it.
        if !self.rmcp.has_session(&id).await.unwrap_or(false) {
            self.lock().remove(&id);
        }
    }

    /// Whether session `id` has a request answered here still running.
    pub(crate) fn busy(&self, id: &SessionId) -> bool {
        self.lock()
            .get(id)
            .is_some_and(|handler| !handler.in_flight.is_empty())
    }

    /// The server, the context and the place of a request of session `id` answered here; `None`
    /// when it takes rmcp's way.
    fn take_request(
        &self,
        id: &SessionId,
        request_id: &RequestId,
    ) -> Option<(McpServer, RequestContext<RoleServer>, InFlight)> {
        let mut handlers = self.lock();
        let handler = handlers.get_mut(id)?;
        if handler.in_flight.contains_key(request_id) || handler.peer.is_transport_closed() {
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
            token: context.ct.clone(),
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

    /// The stream of a request answered here: a priming event, if rmcp sends one, and the
    /// answer, unless the client cancelled the request (rmcp sends none then either).
    async fn answer(
        &self,
        mut request: JsonRpcRequest<ClientRequest>,
        (server, mut context, in_flight): (McpServer, RequestContext<RoleServer>, InFlight),
    ) -> Result<
        impl Stream<Item = ServerSseMessage> + Send + Sync + 'static,
        LocalSessionManagerError,
    > {
        // As rmcp's service loop builds a request's context.
        std::mem::swap(&mut context.meta, request.request.get_meta_mut());
        std::mem::swap(&mut context.extensions, request.request.extensions_mut());
        let stream = random_stream_id();
        let events = self.rmcp.event_store();
        let priming = match self.rmcp.session_config.sse_retry {
            Some(retry) => {
                let priming = ServerSseMessage::retry(retry);
                Some(Self::stored(events.clone(), &stream, priming).await?)
            }
            None => None,
        };
        // Until the answer is kept (or will never be), a resume of this stream waits for it.
        let awaiting = self.events.clone().map(|store| {
            store.awaiting(&stream);
            Awaiting(store, stream.clone())
        });
        let answer = async move {
            let _awaiting = awaiting;
            let request_id = context.id.clone();
            let answer = match server.handle_request(request.request, context).await {
                Ok(result) => ServerJsonRpcMessage::response(result, request_id),
                Err(error) => ServerJsonRpcMessage::error(error, Some(request_id)),
            };
            if in_flight.token.is_cancelled() {
                return None;
            }
            drop(in_flight);
            let answer = ServerSseMessage::from_message(answer);
            match Self::stored(events, &stream, answer.clone()).await {
                Ok(stored) => Some(stored),
                Err(error) => {
                    tracing::warn!(%error, "an MCP answer not kept for resumption");
                    Some(answer)
                }
            }
        };
        // rmcp's HTTP service asks a stream to be `Sync`; the request is polled by one task only.
        let answer =
            futures::stream::once(Detaching(Some(Box::pin(answer)))).filter_map(std::future::ready);
        let answer = sync_wrapper::SyncStream::new(answer);
        Ok(futures::stream::iter(priming).chain(answer))
    }
}

/// Whether a request of this kind is answered here once its session is initialized.
fn answered_here(request: &ClientRequest) -> bool {
    matches!(
        request,
        ClientRequest::CallToolRequest(_)
            | ClientRequest::ListToolsRequest(_)
            | ClientRequest::PingRequest(_)
    )
}

/// A request answered here, until it finishes or its stream is dropped.
struct InFlight {
    handlers: Arc<Handlers>,
    session: SessionId,
    request: RequestId,
    /// Cancelled by the client's `notifications/cancelled` or by the session's end.
    token: CancellationToken,
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
        // rmcp's first: a `register` after this finds no session (see there).
        let closed = self.rmcp.close_session(id).await;
        // As rmcp ends its requests with the session.
        if let Some(handler) = self.lock().remove(id) {
            handler
                .in_flight
                .values()
                .for_each(CancellationToken::cancel);
        }
        closed
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let message = match message {
            ClientJsonRpcMessage::Request(request) if answered_here(&request.request) => {
                match self.take_request(id, &request.id) {
                    Some(taken) => return Ok(self.answer(request, taken).await?.right_stream()),
                    None => ClientJsonRpcMessage::Request(request),
                }
            }
            message => message,
        };
        Ok(self.rmcp.create_stream(id, message).await?.left_stream())
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
        self.rmcp.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
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
struct Detaching<F: Future<Output = Answer> + Send + 'static>(Option<Pin<Box<F>>>);

/// A request's answer; none when the client cancelled it.
type Answer = Option<ServerSseMessage>;

impl<F: Future<Output = Answer> + Send + 'static> Future for Detaching<F> {
    type Output = Answer;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        // Out while it runs: a call that panics is not run again by `drop`.
        let mut call = self.0.take().expect("polled after it finished");
        let answer = call.as_mut().poll(cx);
        if answer.is_pending() {
            self.0 = Some(call);
        }
        answer
    }
}

impl<F: Future<Output = Answer> + Send + 'static> Drop for Detaching<F> {
    fn drop(&mut self) {
        if let Some(call) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(call);
        }
    }
}

/// A stream whose answer is still to come; when dropped, none is to come any more.
struct Awaiting(Arc<TenantStore>, String);

impl Drop for Awaiting {
    fn drop(&mut self) {
        self.0.answered(&self.1);
    }
}

/// A stream id no client can guess, as rmcp's are (a random UUID): event ids name it, and a
/// resume is looked up by it.
fn random_stream_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS gives random bytes");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridges::Disclosure;
    use crate::mcp::McpTenant;
    use crate::testing::host_where_acme_has_a_tool;
    use axum::body::Body;
    use rmcp::model::NumberOrString;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    use serde_json::{Value, json};
    use std::time::Duration;

    /// `acme`'s MCP sessions over HTTP, as the server serves them.
    struct Served {
        sessions: Arc<DirectSessions>,
        service: StreamableHttpService<McpServer, DirectSessions>,
    }

    impl Served {
        async fn new() -> Self {
            let host = host_where_acme_has_a_tool().await;
            let disclosure = Arc::new(Disclosure::new(host.clone(), Default::default()));
            let sessions = Arc::new(DirectSessions::new(LocalSessionManager::default(), None));
            let direct = Arc::downgrade(&sessions);
            let new_server = move || {
                let (host, disclosure) = (host.clone(), disclosure.clone());
                let server =
                    McpServer::http(host, disclosure, Default::default(), Default::default());
                Ok(server.answered_in_place_by(direct.clone()))
            };
            let config = StreamableHttpServerConfig::default();
            let service = StreamableHttpService::new(new_server, sessions.clone(), config);
            Served { sessions, service }
        }

        /// Sends `body`; the session the answer names, if any.
        async fn send(&self, method: &str, session: Option<&str>, body: Value) -> Option<String> {
            let mut request = axum::http::Request::builder()
                .method(method)
                .uri("/mcp")
                .header("host", "127.0.0.1")
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2025-06-18");
            if let Some(session) = session {
                request = request.header("mcp-session-id", session);
            }
            let mut request = request.body(Body::from(body.to_string())).unwrap();
            request.extensions_mut().insert(McpTenant("acme".into()));
            let response = self.service.handle(request).await;
            let session = response.headers().get("mcp-session-id");
            session.map(|id| id.to_str().unwrap().to_owned())
        }

        /// A new session, once it has said `notifications/initialized`.
        async fn initialized(&self) -> SessionId {
            let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "quick", "version": "1"}}});
            let session = self.send("POST", None, initialize).await.unwrap();
            self.send("POST", Some(&session), initialized()).await;
            session.into()
        }
    }

    fn initialized() -> Value {
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    }

    /// A client may end its session right after it says it is initialized, before the
    /// session's task has handled that: each time, no handler is left behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_ended_as_it_is_initialized_leaves_no_handler() {
        let served = Served::new().await;
        for _ in 0..200 {
            let session = served.initialized().await;
            served.send("DELETE", Some(&session), Value::Null).await;
        }
        // Each session's task has finished with its notification.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(served.sessions.lock().len(), 0);
    }

    /// `notifications/initialized` said again keeps the session's calls in flight, and
    /// `notifications/cancelled` still reaches them.
    #[tokio::test]
    async fn initialized_said_again_keeps_the_calls_in_flight() {
        let served = Served::new().await;
        let session = served.initialized().await;
        let registered = async {
            loop {
                if let Some(handler) = served.sessions.lock().get(&session) {
                    break (handler.server.clone(), handler.peer.clone());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let registered = tokio::time::timeout(Duration::from_secs(10), registered).await;
        let (server, peer) = registered.expect("the session's handler registers");
        let call = NumberOrString::Number(7);
        let (_, _, in_flight) = served.sessions.take_request(&session, &call).unwrap();
        served
            .sessions
            .register(session.clone(), server, peer)
            .await;
        assert!(served.sessions.busy(&session));
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 7}});
        served.send("POST", Some(&session), cancel).await;
        assert!(in_flight.token.is_cancelled());
        drop(in_flight);
        assert!(!served.sessions.busy(&session));
    }

    /// A call that panics fails its request only: it is not run again as one detached.
    #[tokio::test]
    async fn a_call_that_panics_is_not_run_again() {
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = runs.clone();
        let call = std::future::poll_fn(move |_| -> Poll<Answer> {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            panic!("a bug in a handler")
        });
        let failed = tokio::spawn(Detaching(Some(Box::pin(call)))).await;
        assert!(failed.unwrap_err().is_panic());
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
