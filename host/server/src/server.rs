//! The HTTP API and the MCP endpoint: the host's operations for the caller's tenant, behind
//! API keys. MCP (Streamable HTTP) is at `/mcp`; see [`crate::mcp`].
//!
//! Every route under `/v1` takes `Authorization: Bearer <key>`; the key decides the tenant.
//! Errors have one shape, `{"error": {"code": "...", "message": "..."}}`. Another tenant's
//! tool answers exactly like a tool that does not exist.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{
    DefaultBodyLimit, FromRequest, FromRequestParts, Multipart, Path, Query, Request, State,
};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use toolhost::export::Format;
use toolhost::history::{CallFilter, HISTORY_MINUTES};
use toolhost::http_tool::HttpToolDef;
use toolhost::sandbox::LoadError;
use toolhost::sandbox::places::Places;
use toolhost::{
    Access, ApprovalError, CallError, Caller, Host, InstallError, KeyRecord, MAX_JS_SOURCE_BYTES,
    ManageError, StoreError,
};

use crate::batch;
use crate::bodies::{Bodies, BodyError};
use crate::bridges::{Disclosure, DisclosureConfig, TOOL_SEARCH};
use crate::console;
use crate::direct_requests::DirectSessions;
use crate::events::CannotResume;
use crate::listener::{ConnectionLimits, serve_connections};
use crate::mcp::{Listens, Listings, McpServer, McpTenant};
use crate::per_tenant::TenantSemaphores;
use crate::responses::{Payer, Responses, Unsent};
use crate::sessions::{Refused, SessionLimits, Sessions, StoredSessions};

/// Every request but an upload.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// Room for multipart framing around an upload of the largest allowed component.
const MULTIPART_OVERHEAD: usize = 64 * 1024;

const OPENAPI: &str = include_str!("openapi.json");

#[derive(Clone)]
struct App {
    host: Arc<Host>,
    allowed_origins: Arc<[String]>,
    mcp: Arc<Mcp>,
    stdio_command: Arc<[String]>,
    /// Cancelled when the server starts to stop: `/healthz` answers 503 from then on.
    draining: CancellationToken,
    /// Where uploads are read and installed ([`MAX_UPLOADS`]).
    uploads: Arc<Places>,
    /// Each tenant's request bodies in memory.
    bodies: Arc<Bodies>,
    /// Each tenant's responses not yet taken by their clients.
    responses: Arc<Responses>,
    /// Each tenant's requests in flight on the routes without a bound of their own.
    requests: Arc<TenantSemaphores>,
}

/// What `/mcp` serves each tenant with: rmcp's Streamable HTTP service over that tenant's
/// sessions.
struct Mcp {
    disclosure: Arc<Disclosure>,
    listings: Arc<Listings>,
    listens: Arc<Listens>,
    config: StreamableHttpServerConfig,
    sessions: Arc<Sessions>,
    /// On a store that many nodes share, sessions are kept there too, for any node to
    /// restore.
    shared_sessions: bool,
}

impl Mcp {
    fn service(
        &self,
        host: &Arc<Host>,
        tenant: &str,
    ) -> StreamableHttpService<McpServer, DirectSessions> {
        let mut config = self.config.clone();
        if self.shared_sessions {
            config.session_store = Some(Arc::new(self.stored_sessions(host, tenant)));
        }
        let (host, disclosure) = (host.clone(), self.disclosure.clone());
        let (listings, listens) = (self.listings.clone(), self.listens.clone());
        let sessions = self.sessions.manager(tenant);
        let direct = Arc::downgrade(&sessions);
        StreamableHttpService::new(
            move || {
                let (host, disclosure) = (host.clone(), disclosure.clone());
                let (listings, listens) = (listings.clone(), listens.clone());
                let server = McpServer::http(host, disclosure, listings, listens);
                Ok(server.answered_in_place_by(direct.clone()))
            },
            sessions,
            config,
        )
    }

    fn stored_sessions(&self, host: &Arc<Host>, tenant: &str) -> StoredSessions {
        StoredSessions {
            store: host.store().clone(),
            tenant: tenant.into(),
        }
    }
}

/// How the server presents tools to agents.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// What MCP lists: every tool, or search bridges for large catalogs.
    pub disclosure: DisclosureConfig,
    /// Bounds on connections, before any request is read.
    pub connections: ConnectionLimits,
    /// Origins (`scheme://host[:port]`) whose pages may call `/mcp`, beside the server's own.
    pub allowed_origins: Vec<String>,
    /// Caps on MCP sessions, and when an idle one is closed.
    pub mcp_sessions: SessionLimits,
    /// How an MCP client on this machine starts toolhost over stdio: the program and its
    /// arguments before `--tenant` (the CLI gives its own path and store). Empty: the
    /// console offers only Streamable HTTP.
    pub stdio_command: Vec<String>,
    /// After the shutdown signal, how long requests are still accepted while `/healthz`
    /// answers 503, so that a load balancer stops sending before the listener closes. Zero:
    /// the listener closes at once.
    pub drain: Duration,
    /// Bytes of bodies in memory, all tenants' together.
    pub body_memory: BodyMemory,
}

/// The bytes of request and response bodies all tenants together may hold in memory; past
/// them a request gets 503 `server_memory_full`. One tenant's own are bounded too, by
/// [`crate::bodies::MAX_BODY_BYTES_PER_TENANT`] and
/// [`crate::responses::MAX_RESPONSE_BYTES_PER_TENANT`] (or by these, if smaller).
#[derive(Debug, Clone, Copy)]
pub struct BodyMemory {
    /// Request bodies read or being read.
    pub requests: usize,
    /// Responses ready and not yet taken by their clients.
    pub responses: usize,
}

impl Default for BodyMemory {
    fn default() -> Self {
        BodyMemory {
            requests: crate::bodies::MAX_BODY_BYTES,
            responses: crate::responses::MAX_RESPONSE_BYTES,
        }
    }
}

/// The API's routes over `host`, MCP included.
pub fn router(host: Arc<Host>, options: ServerOptions) -> Router {
    router_with_shutdown(host, options, Stopping::default())
}

/// What the router sees of the server stopping.
#[derive(Default)]
struct Stopping {
    /// Cancelled when the drain begins: `/healthz` fails.
    draining: CancellationToken,
    /// Cancelled when the listener closes: open MCP streams end.
    stopped: CancellationToken,
}

fn router_with_shutdown(host: Arc<Host>, options: ServerOptions, stopping: Stopping) -> Router {
    let max_upload = host.max_component_bytes() + MULTIPART_OVERHEAD;
    let shared_sessions = host.store().changes().is_some();
    let mcp = Mcp {
        disclosure: Arc::new(Disclosure::new(host.clone(), options.disclosure)),
        listings: Arc::default(),
        listens: Arc::default(),
        // rmcp admits only `localhost` hosts by default, against DNS rebinding: here every
        // request needs a key no browser sends by itself, and `check_origin` refuses other
        // sites' pages, so the server answers MCP under any name it is reached by.
        config: StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_cancellation_token(stopping.stopped)
            .with_max_request_body_bytes(MAX_REQUEST_BYTES)
            .with_json_response(true),
        sessions: Arc::new(match shared_sessions {
            true => Sessions::new(options.mcp_sessions).shared_in(host.store().clone()),
            false => Sessions::new(options.mcp_sessions),
        }),
        shared_sessions,
    };
    let app = App {
        host,
        allowed_origins: options.allowed_origins.into(),
        mcp: Arc::new(mcp),
        stdio_command: options.stdio_command.into(),
        draining: stopping.draining,
        uploads: Arc::new(Places::new(MAX_UPLOADS, MAX_UPLOADS_PER_TENANT)),
        bodies: Arc::new(Bodies::new(options.body_memory.requests)),
        responses: Arc::new(Responses::new(options.body_memory.responses)),
        requests: Arc::new(TenantSemaphores::new(MAX_REQUESTS_PER_TENANT)),
    };
    // Routes that no bound of their own covers: each tenant's requests to them go a few at
    // a time. Calls, durable waits and approvals (which run a call) pass their own.
    let within_requests = axum::middleware::from_fn_with_state(app.clone(), within_requests);
    let managing = Router::new()
        .route(
            "/v1/tools",
            get(list)
                .post(install)
                .layer(DefaultBodyLimit::max(max_upload)),
        )
        .route("/v1/tools/{name}", get(describe).delete(remove))
        .route("/v1/tools/{name}/versions", get(versions))
        .route("/v1/tools/{name}/rollback", post(rollback))
        .route("/v1/whoami", get(whoami))
        .route("/v1/search", get(search))
        .route("/v1/calls", get(recent_calls))
        .route("/v1/stats", get(stats))
        .route("/v1/export", get(export))
        .route("/v1/policy", get(policy))
        .route("/v1/usage", get(usage))
        .route("/v1/config", get(config_list))
        .route("/v1/config/{key}", put(config_set).delete(config_remove))
        .route("/v1/approvals", get(approvals))
        .route("/v1/approvals/{call_id}/reject", post(reject))
        .route_layer(within_requests);
    Router::new()
        .route("/mcp", any(mcp_request))
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi))
        .route("/v1/tools/{name}/call", post(call))
        .route("/v1/calls/{call_id}", get(durable_call))
        .route("/v1/approvals/{call_id}/approve", post(approve))
        .route("/metrics", get(metrics))
        .merge(managing)
        .fallback(
            |method: axum::http::Method, uri: axum::http::Uri| async move {
                console::file(&method, &uri).unwrap_or_else(|| {
                    let message = "no such route; see /openapi.json";
                    ApiError::new(StatusCode::NOT_FOUND, "no_route", message).into_response()
                })
            },
        )
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .layer(axum::middleware::from_fn_with_state(app.clone(), finish))
        .with_state(app)
}

/// Every response on its way out, in one middleware (each layer costs a request microseconds):
/// errors in one shape, the bytes charged to the key's tenant until written
/// ([`crate::responses`]), and while the server drains, `Connection: close`, so that a client
/// or balancer that keeps connections alive opens its next one where the port is not about to
/// close.
async fn finish(
    State(app): State<App>,
    mut request: Request,
    next: axum::middleware::Next,
) -> Response {
    let payer = Payer::default();
    request.extensions_mut().insert(payer.clone());
    let response = match encoded_body(&request) {
        Some(refused) => refused.into_response(),
        None => errors_in_one_shape(next.run(request).await).await,
    };
    let mut response = match payer.tenant() {
        Some(tenant) => app
            .responses
            .charge(tenant, response)
            .unwrap_or_else(|unsent| {
                let (status, code) = match unsent {
                    Unsent::TenantFull(_) => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
                    Unsent::ServerFull(_) => {
                        (StatusCode::SERVICE_UNAVAILABLE, "server_memory_full")
                    }
                };
                ApiError::new(status, code, unsent.to_string()).into_response()
            }),
        None => response,
    };
    if app.draining.is_cancelled() {
        let close = header::HeaderValue::from_static("close");
        response.headers_mut().insert(header::CONNECTION, close);
    }
    response
}

/// A body sent compressed (`Content-Encoding`) would be read as if it were not: refused as
/// what it is.
fn encoded_body(request: &Request) -> Option<ApiError> {
    let encoding = request.headers().get(header::CONTENT_ENCODING)?;
    if encoding.as_bytes().eq_ignore_ascii_case(b"identity") {
        return None;
    }
    let encoding: String = String::from_utf8_lossy(encoding.as_bytes())
        .chars()
        .take(64)
        .collect();
    Some(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        format!("request bodies are read as sent: `Content-Encoding: {encoding}` is not supported"),
    ))
}

/// Every error in the one shape, also those that axum's extractors and rmcp write as plain
/// text (a bad query string, a wrong method, a request MCP cannot take). JSON errors (ours,
/// and JSON-RPC's) pass as they are.
async fn errors_in_one_shape(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_owned();
    let code = match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::NOT_ACCEPTABLE => "not_acceptable",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UNPROCESSABLE_ENTITY => "unprocessable",
        StatusCode::CONFLICT => "conflict",
        _ if status.is_server_error() => "internal",
        _ => "bad_request",
    };
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    let mut shaped = ApiError::new(status, code, message).into_response();
    // Keep what the client needs to act on (`Allow`, `Retry-After`, the MCP session id).
    let body_headers = [
        header::CONTENT_TYPE,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
    ];
    for (name, value) in &parts.headers {
        if !body_headers.contains(name) {
            shaped.headers_mut().append(name.clone(), value.clone());
        }
    }
    shaped
}

/// `/mcp` takes the same API keys: the key's tenant picks its sessions, and rides along in
/// the request's extensions.
async fn mcp_request(State(app): State<App>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    if let Err(refused) = check_origin(&parts.headers, &app.allowed_origins) {
        return refused.into_response();
    }
    let tenant = match Key::from_request_parts(&mut parts, &app).await {
        Ok(key) => key.tenant_for(Access::Call),
        Err(error) => Err(error),
    };
    match tenant {
        Ok(tenant) => {
            let session = parts
                .headers
                .get(MCP_SESSION_ID)
                .and_then(|id| id.to_str().ok())
                .map(str::to_owned);
            // `Some(false)`: a session that is not open, or is another tenant's (rmcp answers
            // 404, which tells the client to start a new one).
            let mut open = session
                .as_deref()
                .map(|id| app.mcp.sessions.seen(&tenant, id));
            // Opened on another node: adopted here, counted like one opened here.
            if let (Some(false), Some(id), true) =
                (open, session.as_deref(), app.mcp.shared_sessions)
            {
                let stored = app.mcp.stored_sessions(&app.host, &tenant);
                open = Some(app.mcp.sessions.adopt(&stored, id).await);
            }
            if let Some(refusal) = refuse_before_rmcp(&app, &tenant, &parts, open) {
                return refusal;
            }
            let service = app.mcp.service(&app.host, &tenant);
            accept_what_mcp_sends(&mut parts.headers);
            let json_request = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/json"));
            let terminating = parts.method == axum::http::Method::DELETE;
            parts.extensions.insert(McpTenant(tenant.clone()));
            let (body, opens_session) = if parts.method == axum::http::Method::POST {
                match app.read_body(&tenant, body).await {
                    Ok(bytes) if batch::is_batch(&bytes) => {
                        let service = &service;
                        let one =
                            |request| async move { service.handle(request).await.map(Body::new) };
                        return batch::answer(&parts, &bytes, one).await;
                    }
                    Ok(bytes) => match invalid_params(&bytes) {
                        Some(refusal) => return refusal,
                        None => {
                            let opens = session.is_none() && is_initialize(&bytes);
                            (Body::from(bytes), opens)
                        }
                    },
                    Err(refused) => return refused.into_response(),
                }
            } else {
                (body, false)
            };
            // Only an `initialize` opens a session (a 2026-07-28 request has none): it must
            // fit under the caps.
            let opening = match opens_session {
                true => match app.mcp.sessions.admit(&tenant).await {
                    Ok(opening) => Some(opening),
                    Err(refused) => return sessions_refused(refused).into_response(),
                },
                false => None,
            };
            let request = Request::from_parts(parts, body);
            let mut response = match opening {
                // hyper drops a request's future when its client goes: an `initialize` runs
                // to its end regardless, so that the session rmcp opens is counted.
                Some(opening) => tokio::spawn(async move {
                    let response = service.handle(request).await;
                    if let Some(id) = response.headers().get(MCP_SESSION_ID)
                        && let Ok(id) = id.to_str()
                    {
                        opening.opened(id);
                    }
                    response
                })
                .await
                .unwrap_or_else(|failed| std::panic::resume_unwind(failed.into_panic())),
                None => service.handle(request).await,
            }
            .map(Body::new);
            // rmcp answers 415 for a JSON body that is not a JSON-RPC message: that is a bad
            // request (the media type was right).
            if response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE && json_request {
                *response.status_mut() = StatusCode::BAD_REQUEST;
            }
            if terminating && response.status().is_success() {
                if let Some(id) = &session {
                    app.mcp.sessions.ended(id);
                }
                // rmcp says 202, and clients (the Python SDK) expect 200 or 204 and log
                // anything else as a failed termination.
                if response.status() == StatusCode::ACCEPTED {
                    *response.status_mut() = StatusCode::NO_CONTENT;
                }
            }
            response
        }
        Err(error) => error.into_response(),
    }
}

/// What rmcp would answer wrongly, answered here: a stream asked for without a session, a
/// resume it cannot serve (rmcp sends an
/// empty 200 stream, which a client cannot tell from "nothing was missed": 409), and a
/// DELETE that
/// names no session (405) or one that is not open (202).
fn refuse_before_rmcp(
    app: &App,
    tenant: &str,
    parts: &Parts,
    open: Option<bool>,
) -> Option<Response> {
    let bad = |message| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message);
    let refusal = match (open, &parts.method) {
        (None, &Method::GET) => {
            bad("GET /mcp streams a session's messages: name it in the Mcp-Session-Id header")
        }
        (None, &Method::DELETE) => {
            bad("DELETE /mcp ends the session named by the Mcp-Session-Id header")
        }
        // Not this node's to serve: rmcp would still answer a session being closed as idle,
        // or restore from the shared store one this node could not count. (rmcp answers
        // another method 405.)
        (Some(false), &Method::GET | &Method::POST | &Method::DELETE) => no_such_session(),
        (Some(false), _) => return None,
        (Some(true), _) => {
            let last = parts.headers.get(LAST_EVENT_ID)?;
            let why = (last.to_str().map_err(|_| CannotResume::NotAnEventId))
                .and_then(|last| app.mcp.sessions.check_resume(tenant, last))
                .err()?;
            let message =
                format!("cannot resume after this Last-Event-ID: {why}; send a new request");
            ApiError::new(StatusCode::CONFLICT, "cannot_resume", message)
        }
        (None, _) => return None,
    };
    Some(refusal.into_response())
}

/// 404, which tells an MCP client to start a new session.
fn no_such_session() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such MCP session: it ended, expired, or is another tenant's",
    )
}

/// A client that accepts anything (`*/*`, or no `Accept` at all) accepts the two types an MCP
/// answer comes in; rmcp wants them named, and would answer 406.
fn accept_what_mcp_sends(headers: &mut axum::http::HeaderMap) {
    let any = headers
        .get_all(header::ACCEPT)
        .iter()
        .all(|v| v.to_str().is_ok_and(|v| v.contains("*/*")));
    if any {
        headers.insert(
            header::ACCEPT,
            axum::http::HeaderValue::from_static("application/json, text/event-stream"),
        );
    }
}

const MCP_SESSION_ID: &str = "mcp-session-id";
const LAST_EVENT_ID: &str = "last-event-id";

/// A `tools/call` whose params do not parse gets JSON-RPC's -32602 (invalid params), naming
/// what is wrong. (rmcp cannot tell it from an unknown method and answers -32601.)
pub(crate) fn invalid_params(message: &[u8]) -> Option<Response> {
    // Only a call's message is parsed whole here (rmcp parses every message again).
    if method(message)?.as_ref() != "tools/call" {
        return None;
    }
    let message: Value = serde_json::from_slice(message).ok()?;
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    let error = serde_json::from_value::<rmcp::model::CallToolRequestParams>(params).err()?;
    let reply = json!({"jsonrpc": "2.0", "id": message.get("id").cloned().unwrap_or(Value::Null),
        "error": {"code": -32602, "message": format!("invalid params for tools/call: {error}")}});
    Some(Json(reply).into_response())
}

/// Whether `message` is an `initialize` request, the only one that opens a session.
fn is_initialize(message: &[u8]) -> bool {
    method(message).is_some_and(|method| method == "initialize")
}

/// A JSON-RPC message's `method`, read without building the rest of it.
fn method(message: &[u8]) -> Option<std::borrow::Cow<'_, str>> {
    #[derive(serde::Deserialize)]
    struct Method<'a> {
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_slice::<Method>(message).ok()?.method
}

fn sessions_refused(refused: Refused) -> ApiError {
    match refused {
        Refused::Host(limit) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "mcp_sessions_full",
            format!("the server has {limit} MCP sessions open, its limit; retry later"),
        ),
        Refused::Tenant(limit) => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_mcp_sessions",
            format!(
                "this tenant has {limit} MCP sessions open, its limit: end one (DELETE /mcp) or let idle ones expire"
            ),
        ),
    }
}

/// MCP servers must refuse a request from a web page of another origin: otherwise a page a
/// user opens could reach a server on their machine through DNS rebinding. A request with no
/// `Origin` (not from a browser) or from the server's own origin passes.
fn check_origin(headers: &axum::http::HeaderMap, allowed: &[String]) -> Result<(), ApiError> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or_default();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let own = host.is_some_and(|host| {
        origin
            .split_once("://")
            .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host))
    });
    if own || allowed.iter().any(|a| a.eq_ignore_ascii_case(origin)) {
        return Ok(());
    }
    // Before any key is checked: the log holds only the start of what anyone sent.
    let origin: String = origin.chars().take(256).collect();
    tracing::warn!(origin, "refused an MCP request from another origin");
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden_origin",
        format!(
            "requests from the origin `{origin}` are refused; the operator may allow it (--allow-origin)"
        ),
    ))
}

/// Serves `host` on `listener` until `shutdown` resolves, then lets running requests finish.
pub async fn serve(
    host: Arc<Host>,
    listener: tokio::net::TcpListener,
    options: ServerOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let stopping = Stopping::default();
    let (draining, stopped) = (stopping.draining.clone(), stopping.stopped.clone());
    let (limits, drain) = (options.connections, options.drain);
    let app = router_with_shutdown(host, options, stopping);
    let shutdown = async move {
        shutdown.await;
        if !drain.is_zero() {
            draining.cancel();
            tracing::info!(
                ?drain,
                "draining: /healthz fails, requests are still served"
            );
            tokio::time::sleep(drain).await;
        }
    };
    // Open MCP event streams never end on their own; requests in flight still finish.
    serve_connections(listener, app, limits, shutdown, move || stopped.cancel()).await
}

/// An error as the API returns it.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    fn internal(error: impl std::fmt::Display) -> Self {
        tracing::error!(%error, "request failed in the host");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the host failed; see its log",
        )
    }

    /// The disk refused a write (full, read-only, failing): the operator's to fix, and worth a
    /// retry later. Anything else from the store is the host's fault.
    fn storage(error: &StoreError) -> Self {
        match error {
            StoreError::Backend(reason) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage_unavailable",
                format!("the host cannot write to its storage: {reason}"),
            ),
            other => Self::internal(other),
        }
    }

    fn not_found(name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no tool named `{name}`"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

impl From<InstallError> for ApiError {
    fn from(error: InstallError) -> Self {
        let (status, code) = match &error {
            InstallError::Load(LoadError::TooLarge { .. }) | InstallError::JsTooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, "too_large")
            }
            InstallError::JsSource(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_source"),
            InstallError::NoJsRuntime => (StatusCode::NOT_IMPLEMENTED, "no_js_runtime"),
            InstallError::Load(_)
            | InstallError::ListTools(_)
            | InstallError::NoTools
            | InstallError::TooManyTools { .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, "invalid_component")
            }
            InstallError::Spec(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_spec"),
            InstallError::NativeName(_)
            | InstallError::ReservedName(_)
            | InstallError::CaseConflict { .. } => (StatusCode::CONFLICT, "name_conflict"),
            InstallError::Tenant(_) => (StatusCode::BAD_REQUEST, "invalid_tenant"),
            InstallError::CodeQuota { .. } | InstallError::SpecsTooLarge(_) => {
                (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded")
            }
            InstallError::Admission { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            InstallError::Store(store) => return Self::storage(store),
        };
        Self::new(status, code, error.to_string())
    }
}

impl From<ManageError> for ApiError {
    fn from(error: ManageError) -> Self {
        let (status, code) = match &error {
            ManageError::NotFound(name) => return Self::not_found(name),
            ManageError::NoSuchVersion { .. } | ManageError::NoEarlierVersion(_) => {
                (StatusCode::CONFLICT, "no_such_version")
            }
            ManageError::Store(store) => return Self::storage(store),
            ManageError::Random(_) => return Self::internal(error),
            ManageError::TooManyConfigKeys(_) | ManageError::SpecsTooLarge(_) => {
                (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded")
            }
            _ => (StatusCode::BAD_REQUEST, "bad_request"),
        };
        Self::new(status, code, error.to_string())
    }
}

/// The caller's API key: its tenant and role. Its tenant pays for the response ([`finish`]).
struct Key(KeyRecord);

impl Key {
    /// The key's tenant, if its role grants `access`; else 403 naming both.
    fn tenant_for(self, access: Access) -> Result<String, ApiError> {
        self.may(access)?;
        Ok(self.0.tenant)
    }

    fn may(&self, access: Access) -> Result<(), ApiError> {
        let role = self.0.role;
        if role.may(access) {
            return Ok(());
        }
        tracing::warn!(
            tenant = self.0.tenant,
            key = self.0.id,
            role = role.name(),
            "refused: the key's role may not {}",
            access.what()
        );
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "a key with the role `{}` may not {}",
                role.name(),
                access.what()
            ),
        ))
    }
}

impl FromRequestParts<App> for Key {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, ApiError> {
        let unauthorized = || {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or invalid API key: send `Authorization: Bearer <key>`",
            )
        };
        // Already found by `within_requests`.
        let record = match parts.extensions.get::<KeyRecord>() {
            Some(record) => record.clone(),
            None => {
                let key = bearer(&parts.headers).ok_or_else(unauthorized)?;
                match app.host.authenticate(key).await {
                    Ok(Some(record)) => record,
                    Ok(None) => return Err(unauthorized()),
                    Err(error) => return Err(ApiError::internal(error)),
                }
            }
        };
        if let Some(payer) = parts.extensions.get::<Payer>() {
            payer.is(&record.tenant);
        }
        Ok(Key(record))
    }
}

/// Requests one tenant has in flight on the routes without a bound of their own (listing,
/// export, usage, search, configuration, ...): each may build megabytes of JSON or read the
/// store, and without it 256 connections from each address could do so at once.
const MAX_REQUESTS_PER_TENANT: usize = 4;
/// How long such a request waits for one of its tenant's to end.
const REQUEST_WAIT: Duration = Duration::from_secs(10);

/// Holds one of the key's tenant's request places while the request is answered; the key, once
/// known, is left for [`Key`]. A request without a valid key passes on to be refused.
async fn within_requests(
    State(app): State<App>,
    mut request: Request,
    next: axum::middleware::Next,
) -> Response {
    let key = bearer(request.headers()).map(str::to_owned);
    let record = match key {
        Some(key) => app.host.authenticate(&key).await.ok().flatten(),
        None => None,
    };
    let Some(record) = record else {
        return next.run(request).await;
    };
    let requests = app.requests.of(&record.tenant);
    request.extensions_mut().insert(record);
    match tokio::time::timeout(REQUEST_WAIT, requests.acquire_owned()).await {
        Ok(Ok(_place)) => next.run(request).await,
        _ => {
            let message = format!(
                "this tenant already has {MAX_REQUESTS_PER_TENANT} requests in flight on such \
                 routes, for {} s: retry when one ends",
                REQUEST_WAIT.as_secs()
            );
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", message).into_response()
        }
    }
}

/// The key in `Authorization: Bearer <key>`.
fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    Some(value.strip_prefix("Bearer ")?.trim())
}

/// A JSON body, with every failure in the API's error shape; an empty body is `{}`.
fn json_body<T: serde::de::DeserializeOwned>(bytes: Bytes) -> Result<T, ApiError> {
    let bytes = if bytes.is_empty() {
        Bytes::from_static(b"{}")
    } else {
        bytes
    };
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not valid JSON for this route: {e}"),
        )
    })
}

impl App {
    /// A request's body, read within its time and its tenant's bytes ([`crate::bodies`]).
    async fn read_body(&self, tenant: &str, body: Body) -> Result<Bytes, ApiError> {
        let read = self.bodies.read(tenant, body, MAX_REQUEST_BYTES).await;
        read.map_err(|error| {
            let (status, code) = match error {
                BodyError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
                BodyError::Timeout => (StatusCode::REQUEST_TIMEOUT, "body_timeout"),
                BodyError::TenantFull(_) => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
                BodyError::ServerFull(_) => (StatusCode::SERVICE_UNAVAILABLE, "server_memory_full"),
                BodyError::Failed(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            };
            ApiError::new(status, code, error.to_string())
        })
    }
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
}

async fn list(State(app): State<App>, key: Key) -> Result<Json<Value>, ApiError> {
    let tenant = key.tenant_for(Access::Read)?;
    Ok(Json(json!({"tools": app.host.list(&tenant)})))
}

async fn describe(
    State(app): State<App>,
    key: Key,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tenant = key.tenant_for(Access::Read)?;
    let info = app
        .host
        .describe(&tenant, &name)
        .ok_or_else(|| ApiError::not_found(&name))?;
    Ok(Json(json!(info)))
}

/// Uploads read, and then installed, at once in the server, and for one tenant: each holds
/// up to the largest component in memory (64 MiB by default) before the install is admitted.
const MAX_UPLOADS: usize = 8;
const MAX_UPLOADS_PER_TENANT: usize = 2;
/// How long an upload waits for a place.
const UPLOAD_WAIT: Duration = Duration::from_secs(10);
/// How long an upload's body may take to arrive once it has a place (a slow sender holds the
/// place, and what it sent so far, no longer).
const UPLOAD_READ_TIMEOUT: Duration = Duration::from_secs(120);

/// What `POST /v1/tools` carries, by its content type.
enum Upload {
    Js(String),
    Http(Box<HttpToolDef>),
    Component(Vec<u8>),
}

/// `application/wasm` (or any non-multipart type): the body is the component. Multipart: the
/// field named `component`. `application/javascript`: a JS tool's source. `application/json`:
/// an HTTP tool's definition. Read in one of the tenant's upload places, each type within its
/// own limit.
async fn install(State(app): State<App>, key: Key, request: Request) -> Result<Response, ApiError> {
    let tenant = key.tenant_for(Access::Manage)?;
    let _place = tokio::time::timeout(UPLOAD_WAIT, app.uploads.take(&tenant))
        .await
        .map_err(|_| {
            let message = format!(
                "no upload place came free within {} s: a tenant's uploads are read and installed \
                 {MAX_UPLOADS_PER_TENANT} at a time, {MAX_UPLOADS} in the server; retry when one ends",
                UPLOAD_WAIT.as_secs()
            );
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", message)
        })?;
    let upload = tokio::time::timeout(UPLOAD_READ_TIMEOUT, read_upload(&app, request))
        .await
        .map_err(|_| {
            let message = format!(
                "the upload did not arrive within {} s",
                UPLOAD_READ_TIMEOUT.as_secs()
            );
            ApiError::new(StatusCode::REQUEST_TIMEOUT, "upload_timeout", message)
        })??;
    let installed = match upload {
        Upload::Js(source) => vec![app.host.install_js(&tenant, &source).await?],
        Upload::Http(def) => vec![app.host.install_http(&tenant, *def).await?],
        Upload::Component(component) => app.host.install(&tenant, component).await?,
    };
    Ok((StatusCode::CREATED, Json(json!({"installed": installed}))).into_response())
}

async fn read_upload(app: &App, request: Request) -> Result<Upload, ApiError> {
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let is = |prefix: &str| content_type.starts_with(prefix);
    if is("application/javascript") || is("text/javascript") {
        let source = upload_body(request.into_body(), MAX_JS_SOURCE_BYTES).await?;
        let source = String::from_utf8(source.into()).map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "the source is not UTF-8",
            )
        })?;
        return Ok(Upload::Js(source));
    }
    if is("application/json") {
        // A definition is parsed whole, many times its bytes in memory: no larger than any
        // other request's body.
        let def = upload_body(request.into_body(), MAX_REQUEST_BYTES).await?;
        return Ok(Upload::Http(Box::new(json_body(def)?)));
    }
    if !is("multipart/form-data") {
        let limit = app.host.max_component_bytes();
        let component = upload_body(request.into_body(), limit).await?;
        return Ok(Upload::Component(component.into()));
    }
    let mut form = Multipart::from_request(request, app)
        .await
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.body_text()))?;
    let mut component = None;
    while let Some(field) = form
        .next_field()
        .await
        .map_err(|e| ApiError::new(e.status(), "bad_request", e.body_text()))?
    {
        if field.name() == Some("component") {
            let bytes = field.bytes().await.map_err(|e| match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => too_large(e.body_text()),
                status => ApiError::new(status, "bad_request", e.body_text()),
            })?;
            component = Some(bytes);
        }
    }
    let component = component.ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "no multipart field named `component`",
        )
    })?;
    Ok(Upload::Component(component.into()))
}

fn too_large(message: String) -> ApiError {
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
}

/// An upload's body, if at most `limit` bytes.
async fn upload_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let too_long = || {
        too_large(format!(
            "the upload is larger than {limit} bytes, its limit"
        ))
    };
    // A declared length past the limit is refused before a byte is read or waited for.
    if http_body::Body::size_hint(&body).lower() > limit as u64 {
        return Err(too_long());
    }
    axum::body::to_bytes(body, limit).await.map_err(|error| {
        let error = error.into_inner();
        match error.downcast_ref::<http_body_util::LengthLimitError>() {
            Some(_) => too_long(),
            None => ApiError::new(StatusCode::BAD_REQUEST, "bad_request", error.to_string()),
        }
    })
}

async fn remove(
    State(app): State<App>,
    key: Key,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let tenant = key.tenant_for(Access::Manage)?;
    match app.host.remove(&tenant, &name).await {
        Ok(true) => Ok(StatusCode::NO_CONTENT),
        Ok(false) => Err(ApiError::not_found(&name)),
        Err(error) => Err(ApiError::internal(error)),
    }
}

async fn versions(
    State(app): State<App>,
    key: Key,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tenant = key.tenant_for(Access::Manage)?;
    Ok(Json(json!(app.host.versions(&tenant, &name).await?)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackRequest {
    /// A JSON number: `3.0` is version 3, as JSON Schema's `integer` has it.
    to: Option<serde_json::Number>,
}

async fn rollback(
    State(app): State<App>,
    key: Key,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let tenant = key.tenant_for(Access::Manage)?;
    let request: RollbackRequest = json_body(app.read_body(&tenant, body).await?)?;
    let to = match request.to {
        None => None,
        Some(to) => Some(
            to.as_f64()
                .filter(|v| v.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(v))
                .map(|v| v as u32)
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_json",
                        format!("`to` must be a version number, got {to}"),
                    )
                })?,
        ),
    };
    let version = app.host.rollback(&tenant, &name, to).await?;
    Ok(Json(json!({"current": version})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallRequest {
    #[serde(default = "empty_object")]
    arguments: Value,
    #[serde(default)]
    data: Value,
}

fn empty_object() -> Value {
    json!({})
}

/// 200 with the outcome, failed or not: the call happened. 404 only for a tool that does not
/// exist for this tenant.
#[derive(Deserialize)]
struct CallQuery {
    /// `sync` (the default): the outcome in the response; `async`: 202 and a call id.
    mode: Option<String>,
}

async fn call(
    State(app): State<App>,
    key: Key,
    Path(name): Path<String>,
    Query(query): Query<CallQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let durable = match query.mode.as_deref() {
        None | Some("sync") => false,
        Some("async") => true,
        Some(other) => {
            let message = format!("mode is `sync` or `async`, not `{other}`");
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                message,
            ));
        }
    };
    key.may(Access::Call)?;
    let tenant = key.0.tenant.clone();
    let request: CallRequest = json_body(app.read_body(&tenant, body).await?)?;
    // A private tool is the app's; `data` is what a tool trusts as coming from the app.
    let private = app
        .host
        .describe(&tenant, &name)
        .is_some_and(|t| t.spec.private);
    if private {
        key.may(Access::CallPrivate)?;
    }
    if !request.data.is_null() {
        key.may(Access::SetData)?;
    }
    let caller = Caller::tenant(tenant).with_data(request.data);
    if durable {
        let call_id = app
            .host
            .submit(&caller, &name, request.arguments)
            .await
            .map_err(|error| submit_error(&name, error))?;
        let href = format!("/v1/calls/{call_id}");
        let body = json!({"call_id": call_id, "status": "queued", "href": href});
        return Ok((StatusCode::ACCEPTED, [(header::LOCATION, href)], Json(body)).into_response());
    }
    let outcome = app.host.call(&caller, &name, request.arguments).await;
    if let Err(CallError::NotFound { .. }) = outcome.result {
        return Err(ApiError::not_found(&name));
    }
    Ok(Json(outcome.to_json()).into_response())
}

fn submit_error(name: &str, error: CallError) -> ApiError {
    match error {
        CallError::NotFound { .. } => ApiError::not_found(name),
        CallError::RateLimited { .. } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            error.to_string(),
        ),
        CallError::StorageUnavailable { .. } => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_unavailable",
            error.to_string(),
        ),
        other => ApiError::internal(other),
    }
}

/// The longest a `GET /v1/calls/{id}?wait=` holds the request.
const MAX_WAIT_SECONDS: u64 = 30;

#[derive(Deserialize)]
struct DurableQuery {
    /// Seconds to wait for the call to end, at most [`MAX_WAIT_SECONDS`].
    wait: Option<u64>,
}

/// A durable call's status, and its outcome once it has ended.
async fn durable_call(
    State(app): State<App>,
    key: Key,
    Path(call_id): Path<String>,
    Query(query): Query<DurableQuery>,
) -> Result<Json<Value>, ApiError> {
    key.may(Access::Call)?;
    let wait = Duration::from_secs(query.wait.unwrap_or(0).min(MAX_WAIT_SECONDS));
    let status = app
        .host
        .durable_call(&key.0.tenant, &call_id, wait)
        .await
        .map_err(|e| ApiError::storage(&e))?
        .ok_or_else(|| {
            let message = format!("no call `{}`", call_id.chars().take(64).collect::<String>());
            ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
        })?;
    let mut body = json!({
        "call_id": status.call_id,
        "status": status.status,
        "attempts": status.attempts,
    });
    if let Some(outcome) = status.outcome {
        body["outcome"] = outcome;
    }
    Ok(Json(body))
}

/// The key's tenant and role, what the role may do, and (for a key that may manage tools)
/// how an MCP client on this machine starts toolhost over stdio for the tenant.
async fn whoami(State(app): State<App>, key: Key) -> Result<Json<Value>, ApiError> {
    let KeyRecord { tenant, role, .. } = &key.0;
    let may: Vec<&str> = Access::ALL
        .into_iter()
        .filter(|access| role.may(*access))
        .map(Access::name)
        .collect();
    // The server's paths are for those who run tools on it, not for every agent.
    let stdio_command = match role.may(Access::Manage) {
        true => &app.stdio_command[..],
        false => &[],
    };
    let stdio = stdio_command.split_first().map(|(command, args)| {
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend(["--tenant", tenant, "mcp"]);
        json!({"command": command, "args": args})
    });
    Ok(Json(
        json!({"tenant": tenant, "role": role.name(), "may": may, "stdio": stdio}),
    ))
}

/// The longest search text: a few sentences.
const MAX_SEARCH_QUERY_BYTES: usize = 1000;

#[derive(Deserialize)]
struct SearchQuery {
    q: String,
    limit: Option<u64>,
}

/// The search agents get from `tool_search`, over the tenant's tools.
async fn search(
    State(app): State<App>,
    key: Key,
    Query(query): Query<SearchQuery>,
) -> Result<Json<Value>, ApiError> {
    let tenant = key.tenant_for(Access::Read)?;
    if query.q.is_empty() || query.q.len() > MAX_SEARCH_QUERY_BYTES {
        let message = format!("q must be 1 to {MAX_SEARCH_QUERY_BYTES} bytes");
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            message,
        ));
    }
    let mut args = json!({"query": query.q});
    if let Some(limit) = query.limit {
        args["limit"] = limit.into();
    }
    let caller = Caller::tenant(tenant);
    match app.mcp.disclosure.call(&caller, TOOL_SEARCH, args).await {
        Ok(results) => Ok(Json(results)),
        Err(error @ CallError::InvalidArgs { .. }) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            error.to_string(),
        )),
        Err(error) => Err(ApiError::internal(error)),
    }
}

/// The most records `GET /v1/calls` answers with.
const MAX_CALLS_LISTED: usize = 500;

#[derive(Deserialize)]
struct CallsQuery {
    tool: Option<String>,
    outcome: Option<String>,
    limit: Option<usize>,
}

/// The tenant's recent calls on this node, newest first.
async fn recent_calls(
    State(app): State<App>,
    key: Key,
    Query(query): Query<CallsQuery>,
) -> Result<Json<Value>, ApiError> {
    let tenant = key.tenant_for(Access::Manage)?;
    let filter = CallFilter {
        tool: query.tool,
        outcome: query.outcome,
        limit: query.limit.unwrap_or(100).min(MAX_CALLS_LISTED),
    };
    let calls: Vec<Value> = (app.host.recent_calls(&tenant, &filter).iter())
        .map(|record| record.to_json())
        .collect();
    Ok(Json(json!({ "calls": calls })))
}

#[derive(Deserialize)]
struct StatsQuery {
    minutes: Option<u64>,
}

/// Per tool, calls, errors and p50/p99 latency for each minute with calls, over the last
/// hour at most.
async fn stats(
    State(app): State<App>,
    key: Key,
    Query(query): Query<StatsQuery>,
) -> Result<Json<Value>, ApiError> {
    let tenant = key.tenant_for(Access::Manage)?;
    let minutes = query.minutes.unwrap_or(HISTORY_MINUTES);
    let tools = app.host.call_stats(&tenant, minutes);
    Ok(Json(json!({"bucket_ms": 60_000, "tools": tools})))
}

async fn policy(State(app): State<App>, key: Key) -> Result<Json<Value>, ApiError> {
    let tenant = key.tenant_for(Access::Manage)?;
    Ok(Json(json!(*app.host.policy(&tenant).await)))
}

/// What the tenant keeps on disk against each of its quotas.
async fn usage(State(app): State<App>, key: Key) -> Result<Json<Value>, ApiError> {
    let tenant = key.tenant_for(Access::Manage)?;
    let usage = app
        .host
        .disk_usage(&tenant)
        .await
        .map_err(|e| ApiError::storage(&e))?;
    Ok(Json(json!(usage)))
}

/// The tenant's configuration keys; a secret's value is never shown.
async fn config_list(State(app): State<App>, key: Key) -> Result<Json<Value>, ApiError> {
    let tenant = key.tenant_for(Access::Manage)?;
    let entries: Vec<Value> = app
        .host
        .config(&tenant)
        .await?
        .into_iter()
        .map(|(name, value)| json!({"key": name, "secret": value.is_none(), "value": value}))
        .collect();
    Ok(Json(json!({ "config": entries })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigValueBody {
    value: String,
    #[serde(default)]
    secret: bool,
}

/// Sets a configuration value that the tenant's tools declaring `name` read.
async fn config_set(
    State(app): State<App>,
    key: Key,
    Path(name): Path<String>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let tenant = key.tenant_for(Access::Manage)?;
    let body: ConfigValueBody = json_body(app.read_body(&tenant, body).await?)?;
    app.host
        .set_config(&tenant, &name, &body.value, body.secret)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn config_remove(
    State(app): State<App>,
    key: Key,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let tenant = key.tenant_for(Access::Manage)?;
    if app.host.remove_config(&tenant, &name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no config key `{name}`"),
        ))
    }
}

async fn approvals(State(app): State<App>, key: Key) -> Result<Json<Value>, ApiError> {
    let tenant = key.tenant_for(Access::Decide)?;
    Ok(Json(
        json!({"pending": app.host.pending_approvals(&tenant)}),
    ))
}

/// Runs the waiting call and answers with its outcome, as `/call` would have.
async fn approve(
    State(app): State<App>,
    key: Key,
    Path(call_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tenant = key.tenant_for(Access::Decide)?;
    let outcome = app
        .host
        .approve(&tenant, &call_id)
        .await
        .map_err(approval_error)?;
    Ok(Json(outcome.to_json()))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RejectRequest {
    #[serde(default)]
    reason: Option<String>,
}

async fn reject(
    State(app): State<App>,
    key: Key,
    Path(call_id): Path<String>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let tenant = key.tenant_for(Access::Decide)?;
    let request: RejectRequest = json_body(app.read_body(&tenant, body).await?)?;
    let reason = request
        .reason
        .as_deref()
        .unwrap_or("rejected by the operator");
    let outcome = app
        .host
        .reject(&tenant, &call_id, reason)
        .await
        .map_err(approval_error)?;
    Ok(Json(outcome.to_json()))
}

fn approval_error(error: ApprovalError) -> ApiError {
    match error {
        ApprovalError::Store(store) => ApiError::storage(&store),
        _ => ApiError::new(StatusCode::NOT_FOUND, "not_pending", error.to_string()),
    }
}

/// Health for a load balancer: 200 `ok`; 503 while the server drains before it stops, or
/// when the store cannot write (reads and calls that write nothing are still served).
async fn healthz(State(app): State<App>) -> Response {
    if app.draining.is_cancelled() {
        let message = "this server is stopping; send new requests elsewhere";
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "draining", message).into_response();
    }
    match app.host.storage_health() {
        Ok(()) => "ok".into_response(),
        Err(reason) => ApiError::storage(&StoreError::Backend(reason)).into_response(),
    }
}

/// Prometheus metrics. No key: the page names no tenant and no tool.
async fn metrics(State(app): State<App>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, toolhost::metrics::CONTENT_TYPE)],
        app.host.metrics().render(),
    )
}

#[derive(Deserialize)]
struct ExportQuery {
    format: Option<String>,
}

async fn export(
    State(app): State<App>,
    key: Key,
    Query(query): Query<ExportQuery>,
) -> Result<Json<Value>, ApiError> {
    let tenant = key.tenant_for(Access::Read)?;
    let format: Format = query
        .format
        .as_deref()
        .unwrap_or("openai")
        .parse()
        .map_err(|e: String| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e))?;
    Ok(Json(json!({"tools": app.host.export(&tenant, format)})))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{host_where_acme_has_a_tool, http_tool};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    /// The server of a host where `acme` has a tool, and an admin key of `acme` and of
    /// `globex`.
    async fn router_for_acme_and_globex() -> (Router, String, String) {
        router_for_acme_and_globex_with(Default::default()).await
    }

    async fn router_for_acme_and_globex_with(options: ServerOptions) -> (Router, String, String) {
        let host = host_where_acme_has_a_tool().await;
        let mut keys = Vec::new();
        for tenant in ["acme", "globex"] {
            host.create_tenant(tenant).await.unwrap();
            let key = host.create_key(tenant, toolhost::Role::Admin).await;
            keys.push(key.unwrap().secret);
        }
        let globex = keys.pop().unwrap();
        let acme = keys.pop().unwrap();
        (router(host, options), acme, globex)
    }

    /// An upload whose body is sent, or never arrives (`Err`: the sender is told when the
    /// server first asks for it); its status and error code.
    async fn upload(
        router: &Router,
        key: &str,
        body: Result<Value, tokio::sync::oneshot::Sender<()>>,
    ) -> (StatusCode, String) {
        let body = match body {
            Ok(def) => Body::from(def.to_string()),
            Err(asked) => {
                let mut asked = Some(asked);
                Body::from_stream(futures::stream::poll_fn(move |_| {
                    if let Some(asked) = asked.take() {
                        let _ = asked.send(());
                    }
                    std::task::Poll::<Option<Result<Bytes, std::io::Error>>>::Pending
                }))
            }
        };
        let request = Request::post("/v1/tools")
            .header(header::AUTHORIZATION, format!("Bearer {key}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .unwrap();
        status_and_code(router, request).await
    }

    /// `request`'s answer: its status and error code.
    async fn status_and_code(router: &Router, request: Request) -> (StatusCode, String) {
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&body).unwrap_or_default();
        let code = body["error"]["code"].as_str().unwrap_or_default();
        (status, code.to_owned())
    }

    #[tokio::test]
    async fn a_tenants_uploads_are_read_a_few_at_a_time_and_hold_up_no_other_tenant() {
        let (router, acme, globex) = router_for_acme_and_globex().await;
        let mut stalled = Vec::new();
        for _ in 0..MAX_UPLOADS_PER_TENANT {
            let (router, acme) = (router.clone(), acme.clone());
            let (asked, holds_a_place) = tokio::sync::oneshot::channel();
            stalled.push(tokio::spawn(async move {
                upload(&router, &acme, Err(asked)).await
            }));
            // Its body is asked for once it holds its place.
            holds_a_place.await.unwrap();
        }

        tokio::time::pause();
        let def = |name: &str| Ok(serde_json::to_value(http_tool(name)).unwrap());
        let refused = upload(&router, &acme, def("third")).await;
        assert_eq!(
            refused,
            (StatusCode::TOO_MANY_REQUESTS, "rate_limited".into())
        );
        tokio::time::resume();
        let other = upload(&router, &globex, def("forecast")).await;
        assert_eq!(other.0, StatusCode::CREATED, "{other:?}");

        // A body that never arrives gives its place back when its time is up.
        tokio::time::pause();
        for upload in stalled {
            let timed_out = upload.await.unwrap();
            assert_eq!(
                timed_out,
                (StatusCode::REQUEST_TIMEOUT, "upload_timeout".into())
            );
        }
        tokio::time::resume();
        assert_eq!(
            upload(&router, &acme, def("third")).await.0,
            StatusCode::CREATED
        );
    }

    /// A call to `tool` with `body`; its status and error code.
    async fn call_with(router: &Router, key: &str, tool: &str, body: Body) -> (StatusCode, String) {
        let request = Request::post(format!("/v1/tools/{tool}/call"))
            .header(header::AUTHORIZATION, format!("Bearer {key}"))
            .body(body)
            .unwrap();
        status_and_code(router, request).await
    }

    #[tokio::test]
    async fn a_tenants_request_bodies_hold_a_bounded_number_of_bytes_for_a_bounded_time() {
        let (router, acme, globex) = router_for_acme_and_globex().await;
        // Each sends a megabyte, then nothing: all of acme's room for bodies in memory.
        let mut stalled = Vec::new();
        for _ in 0..crate::bodies::MAX_BODY_BYTES_PER_TENANT / MAX_REQUEST_BYTES {
            let (router, acme) = (router.clone(), acme.clone());
            let (read, first_chunk_read) = tokio::sync::oneshot::channel();
            let body = stalled_body(Bytes::from(vec![b' '; MAX_REQUEST_BYTES]), read);
            stalled.push(tokio::spawn(async move {
                call_with(&router, &acme, "weather", body).await
            }));
            first_chunk_read.await.unwrap();
        }
        let small = || Body::from(r#"{"arguments": {}}"#);
        let refused = call_with(&router, &acme, "none", small()).await;
        assert_eq!(
            refused,
            (StatusCode::TOO_MANY_REQUESTS, "rate_limited".into())
        );
        let initialize = Request::post("/mcp")
            .header(header::AUTHORIZATION, format!("Bearer {acme}"))
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .body(Body::from(
                r#"{"jsonrpc": "2.0", "id": 1, "method": "ping"}"#,
            ))
            .unwrap();
        let mcp = router.clone().oneshot(initialize).await.unwrap();
        assert_eq!(mcp.status(), StatusCode::TOO_MANY_REQUESTS, "/mcp too");
        let other = call_with(&router, &globex, "none", small()).await;
        assert_eq!(other.0, StatusCode::NOT_FOUND, "globex's body is read");

        // A body that stops arriving gives its bytes back when its time is up.
        tokio::time::pause();
        let paused = tokio::time::Instant::now();
        for call in stalled {
            let timed_out = call.await.unwrap();
            assert_eq!(
                timed_out,
                (StatusCode::REQUEST_TIMEOUT, "body_timeout".into())
            );
        }
        // The timer rounds to the millisecond.
        let limit = crate::bodies::BODY_READ_TIMEOUT + Duration::from_secs(1);
        assert!(paused.elapsed() <= limit, "{:?}", paused.elapsed());
        tokio::time::resume();
        let read = call_with(&router, &acme, "none", small()).await;
        assert_eq!(read.0, StatusCode::NOT_FOUND, "acme's bytes are back");
    }

    #[tokio::test]
    async fn a_compressed_body_is_refused_not_misread() {
        let (router, acme, _) = router_for_acme_and_globex().await;
        let call = |encoding: &str| {
            Request::post("/v1/tools/weather/call")
                .header(header::AUTHORIZATION, format!("Bearer {acme}"))
                .header(header::CONTENT_ENCODING, encoding)
                .body(Body::from(r#"{"arguments": {}}"#))
                .unwrap()
        };
        let refused = status_and_code(&router, call("gzip")).await;
        let expected = (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type");
        assert_eq!(refused, (expected.0, expected.1.into()));
        let read = status_and_code(&router, call("identity")).await;
        assert_ne!(read.0, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{read:?}");
    }

    #[tokio::test]
    async fn all_tenants_request_bodies_are_bounded_together() {
        let body_memory = BodyMemory {
            requests: 2 * MAX_REQUEST_BYTES,
            ..Default::default()
        };
        let options = ServerOptions {
            body_memory,
            ..Default::default()
        };
        let (router, acme, globex) = router_for_acme_and_globex_with(options).await;
        // A megabyte each, then nothing: the server's room, each tenant well within its own.
        let mut stalled = Vec::new();
        for key in [&acme, &globex] {
            let (router, key) = (router.clone(), key.clone());
            let (read, first_chunk_read) = tokio::sync::oneshot::channel();
            let body = stalled_body(Bytes::from(vec![b' '; MAX_REQUEST_BYTES]), read);
            stalled.push(tokio::spawn(async move {
                call_with(&router, &key, "weather", body).await
            }));
            first_chunk_read.await.unwrap();
        }
        let small = || Body::from(r#"{"arguments": {}}"#);
        let full = (StatusCode::SERVICE_UNAVAILABLE, "server_memory_full".into());
        assert_eq!(call_with(&router, &globex, "none", small()).await, full);
        tokio::time::pause();
        for call in stalled {
            assert_eq!(call.await.unwrap().0, StatusCode::REQUEST_TIMEOUT);
        }
        tokio::time::resume();
        let read = call_with(&router, &globex, "none", small()).await;
        assert_eq!(read.0, StatusCode::NOT_FOUND, "the server's bytes are back");
    }

    /// A body that sends `first` and then nothing, as a stream; `read` is told when the server
    /// asks for more.
    fn stalled_body(first: Bytes, read: tokio::sync::oneshot::Sender<()>) -> Body {
        let mut state = (Some(first), Some(read));
        Body::from_stream(futures::stream::poll_fn(move |_| {
            if let Some(chunk) = state.0.take() {
                return std::task::Poll::Ready(Some(Ok::<_, std::io::Error>(chunk)));
            }
            if let Some(read) = state.1.take() {
                let _ = read.send(());
            }
            std::task::Poll::Pending
        }))
    }

    #[tokio::test]
    async fn a_tenants_requests_on_unbounded_routes_go_a_few_at_a_time() {
        let (router, acme, globex) = router_for_acme_and_globex().await;
        // Configuration writes whose bodies stop arriving: each holds one of acme's places.
        let mut stalled = Vec::new();
        for n in 0..MAX_REQUESTS_PER_TENANT {
            let (read, first_byte_read) = tokio::sync::oneshot::channel();
            let request = Request::put(format!("/v1/config/K{n}"))
                .header(header::AUTHORIZATION, format!("Bearer {acme}"))
                .body(stalled_body(Bytes::from_static(b"{"), read))
                .unwrap();
            let router = router.clone();
            stalled.push(tokio::spawn(async move {
                status_and_code(&router, request).await
            }));
            first_byte_read.await.unwrap();
        }
        let whoami = |key: &str| {
            let request = Request::get("/v1/whoami")
                .header(header::AUTHORIZATION, format!("Bearer {key}"))
                .body(Body::empty())
                .unwrap();
            status_and_code(&router, request)
        };
        assert_eq!(whoami(&globex).await.0, StatusCode::OK, "globex's own");
        tokio::time::pause();
        let refused = whoami(&acme).await;
        assert_eq!(
            refused,
            (StatusCode::TOO_MANY_REQUESTS, "rate_limited".into())
        );
        for write in stalled {
            let timed_out = write.await.unwrap();
            assert_eq!(timed_out.0, StatusCode::REQUEST_TIMEOUT);
        }
        tokio::time::resume();
        assert_eq!(whoami(&acme).await.0, StatusCode::OK, "its places are back");
        // A request without a valid key is refused as before.
        assert_eq!(whoami("nonsense").await.0, StatusCode::UNAUTHORIZED);
    }

    #[tokio::test]
    async fn each_kind_of_upload_is_read_within_its_own_limit() {
        let host = host_where_acme_has_a_tool().await;
        host.create_tenant("acme").await.unwrap();
        let key = host
            .create_key("acme", toolhost::Role::Admin)
            .await
            .unwrap()
            .secret;
        let router = router(host, Default::default());
        for (content_type, limit) in [
            ("application/json", MAX_REQUEST_BYTES),
            ("application/javascript", MAX_JS_SOURCE_BYTES),
        ] {
            let request = Request::post("/v1/tools")
                .header(header::AUTHORIZATION, format!("Bearer {key}"))
                .header(header::CONTENT_TYPE, content_type)
                .body(Body::from(vec![b' '; limit + 1]))
                .unwrap();
            let response = router.clone().oneshot(request).await.unwrap();
            assert_eq!(
                response.status(),
                StatusCode::PAYLOAD_TOO_LARGE,
                "{content_type}"
            );
        }
    }
}
