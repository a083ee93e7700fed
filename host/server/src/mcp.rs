//! The MCP server: a tenant's visible tools over the Model Context Protocol (rmcp), on
//! Streamable HTTP at `/mcp` (tenant from the API key) or on stdio (tenant fixed at start).
//!
//! Tool failures are results with `isError: true`; JSON-RPC errors are kept for malformed
//! requests (an unknown tool, a bad cursor). A JSON result is returned as text and as
//! `structuredContent` (wrapped as `{"result": ...}` when it is not an object, as MCP requires
//! an object there).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rmcp::model::SubscriptionFilter;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    Implementation, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::transport::streamable_http_server::session::SessionId;
use rmcp::{RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::sync::broadcast::Receiver;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use toolhost::export::{self, Format};
use toolhost::{Caller, Host};

use crate::bridges::{Disclosure, DisclosureConfig, TOOL_CALL, TOOL_DESCRIBE, TOOL_SEARCH};
use crate::direct_requests::DirectSessions;

/// Tools per `tools/list` page.
pub const PAGE_SIZE: usize = 50;

/// The tenant of an HTTP request, set by the server's authentication before MCP sees it.
#[derive(Debug, Clone)]
pub struct McpTenant(pub String);

/// The MCP server (rmcp): tools/list, tools/call and change notifications, per tenant.
#[derive(Clone)]
pub struct McpServer {
    host: Arc<Host>,
    /// What the agent is shown: every tool, or the search bridges for a large catalog.
    disclosure: Arc<Disclosure>,
    /// Each tenant's listing as MCP tools, shared by every session.
    listings: Arc<Listings>,
    /// Fixed for stdio; `None` takes it from each HTTP request's [`McpTenant`].
    tenant: Option<String>,
    /// Whether this session's `list_changed` watch, started at `notifications/initialized`,
    /// runs: one per session, however often a client sends the notification (rmcp makes one
    /// server per session).
    watching: Arc<AtomicBool>,
    /// Every tenant's open `subscriptions/listen` streams.
    listens: Arc<Listens>,
    /// Over HTTP, the tenant's sessions, which answer an initialized session's calls,
    /// listings and pings with this server (weak: the sessions hold their servers).
    direct: Option<Weak<DirectSessions>>,
}

/// The most `subscriptions/listen` streams one tenant keeps open.
pub const MAX_LISTENS_PER_TENANT: usize = 64;
/// The most the server keeps open.
pub const MAX_LISTENS: usize = 4096;

/// Open `subscriptions/listen` streams by tenant. A listen runs until its client cancels it,
/// and on 2026-07-28 rmcp keeps it running after its client has gone (it may be resumed), so
/// a tenant keeps at most [`MAX_LISTENS_PER_TENANT`] and the server [`MAX_LISTENS`]: a new
/// listen past either ends the oldest of its tenant, or of the tenant holding the most, so
/// that streams left behind never lock a client out.
#[derive(Default)]
pub struct Listens(Mutex<ListensState>);

#[derive(Default)]
struct ListensState {
    by_tenant: HashMap<String, BTreeMap<u64, CancellationToken>>,
    next: u64,
}

/// One open listen; `ended` is cancelled when a newer one takes its place.
struct Listen {
    listens: Arc<Listens>,
    tenant: String,
    id: u64,
    ended: CancellationToken,
}

impl Listens {
    fn open(self: &Arc<Self>, tenant: &str) -> Listen {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let own = state.by_tenant.get(tenant).map_or(0, BTreeMap::len);
        let all: usize = state.by_tenant.values().map(BTreeMap::len).sum();
        let give_up = if own >= MAX_LISTENS_PER_TENANT {
            Some(tenant.to_owned())
        } else if all >= MAX_LISTENS {
            let busiest = state.by_tenant.iter().max_by_key(|(_, open)| open.len());
            busiest.map(|(tenant, _)| tenant.clone())
        } else {
            None
        };
        if let Some(oldest) = give_up.and_then(|t| state.by_tenant.get_mut(&t)?.pop_first()) {
            oldest.1.cancel();
        }
        state.next += 1;
        let (id, ended) = (state.next, CancellationToken::new());
        let open = state.by_tenant.entry(tenant.to_owned()).or_default();
        open.insert(id, ended.clone());
        Listen {
            listens: self.clone(),
            tenant: tenant.to_owned(),
            id,
            ended,
        }
    }
}

impl Drop for Listen {
    fn drop(&mut self) {
        let mut state = (self.listens.0).lock().unwrap_or_else(|p| p.into_inner());
        if let Some(open) = state.by_tenant.get_mut(&self.tenant) {
            open.remove(&self.id);
            if open.is_empty() {
                state.by_tenant.remove(&self.tenant);
            }
        }
    }
}

impl McpServer {
    /// For `toolhost mcp`: one tenant, over stdio.
    pub fn stdio(host: Arc<Host>, disclosure: DisclosureConfig, tenant: String) -> Self {
        McpServer {
            disclosure: Arc::new(Disclosure::new(host.clone(), disclosure)),
            listings: Arc::default(),
            host,
            tenant: Some(tenant),
            watching: Arc::default(),
            listens: Arc::default(),
            direct: None,
        }
    }

    /// For `/mcp`: the tenant of each request's key.
    pub fn http(
        host: Arc<Host>,
        disclosure: Arc<Disclosure>,
        listings: Arc<Listings>,
        listens: Arc<Listens>,
    ) -> Self {
        McpServer {
            host,
            disclosure,
            listings,
            tenant: None,
            watching: Arc::default(),
            listens,
            direct: None,
        }
    }

    /// Once its session is initialized, `sessions` answers the session's calls, listings and
    /// pings with this server, in the task that reads each request.
    pub(crate) fn answered_in_place_by(mut self, sessions: Weak<DirectSessions>) -> Self {
        self.direct = Some(sessions);
        self
    }

    /// The tenant's listing as MCP tools, converted again only when its tools (or the
    /// natives) changed.
    fn listing(&self, tenant: &str) -> Result<Arc<Listing>, ErrorData> {
        let generation = self.host.generation(tenant);
        if let Some(listing) = self.listings.cache.get(tenant)
            && listing.generation == generation
        {
            return Ok(listing);
        }
        let mut json_bytes = 0;
        let tools = (self.disclosure.listing(tenant).iter())
            .map(|spec| {
                let tool = export::tool(spec, Format::Mcp);
                json_bytes += toolhost::clip::json_bytes(&tool);
                serde_json::from_value::<Tool>(tool)
            })
            .collect::<Result<_, _>>()
            .map_err(|e| ErrorData::internal_error(format!("a tool did not convert: {e}"), None))?;
        let listing = Arc::new(Listing {
            generation,
            tools,
            json_bytes,
        });
        self.listings
            .cache
            .insert(tenant.to_owned(), listing.clone());
        Ok(listing)
    }

    fn tenant(&self, extensions: &rmcp::model::Extensions) -> Result<String, ErrorData> {
        if let Some(tenant) = &self.tenant {
            return Ok(tenant.clone());
        }
        extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<McpTenant>())
            .map(|t| t.0.clone())
            .ok_or_else(|| ErrorData::invalid_request("no tenant for this request", None))
    }
}

/// Bytes of JSON of the listings kept: a listing converts every spec twice (the export, then
/// rmcp's types), which costs several times what sending it does.
const LISTINGS_JSON_BYTES: u64 = 8 << 20;

/// Each tenant's `tools/list` as MCP tools, the least used giving way past
/// [`LISTINGS_JSON_BYTES`]; a listing larger than a share of that is converted every time.
pub struct Listings {
    cache: quick_cache::sync::Cache<String, Arc<Listing>, ByJsonBytes>,
}

impl Default for Listings {
    fn default() -> Self {
        Listings {
            cache: quick_cache::sync::Cache::with_weighter(256, LISTINGS_JSON_BYTES, ByJsonBytes),
        }
    }
}

/// A tenant's listing, at the tenant's generation it was built at.
struct Listing {
    generation: (u64, u64),
    tools: Vec<Tool>,
    json_bytes: u64,
}

#[derive(Clone)]
struct ByJsonBytes;

impl quick_cache::Weighter<String, Arc<Listing>> for ByJsonBytes {
    fn weight(&self, tenant: &String, listing: &Arc<Listing>) -> u64 {
        (tenant.len() as u64 + listing.json_bytes).max(1)
    }
}

/// Serves MCP on stdin/stdout for `tenant` until the client disconnects.
pub async fn serve_stdio(
    host: Arc<Host>,
    disclosure: DisclosureConfig,
    tenant: String,
) -> Result<(), String> {
    use rmcp::ServiceExt;
    let running = McpServer::stdio(host, disclosure, tenant)
        .serve(crate::stdio::transport())
        .await
        .map_err(|e| e.to_string())?;
    running
        .waiting()
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        let server: Implementation = serde_json::from_value(json!({
            "name": "toolhost",
            "version": env!("CARGO_PKG_VERSION"),
        }))
        .expect("a valid implementation record");
        ServerConfig::new(capabilities).with_server_info(server)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tenant = self.tenant(&context.extensions)?;
        let start = match request.and_then(|r| r.cursor) {
            None => 0,
            Some(cursor) => cursor.parse::<usize>().map_err(|_| {
                // The client's text, quoted back (and logged by rmcp) only in part.
                let cursor: String = cursor.chars().take(64).collect();
                ErrorData::invalid_params(format!("invalid cursor `{cursor}`"), None)
            })?,
        };
        let listed = self.listing(&tenant)?;
        let mut tools: Vec<Tool> = listed
            .tools
            .iter()
            .skip(start)
            .take(PAGE_SIZE)
            .cloned()
            .collect();
        if !knows_structured_output(&context) {
            tools.iter_mut().for_each(|tool| tool.output_schema = None);
        }
        // `result_type` is set: required from 2026-07-28, dropped by rmcp for earlier peers.
        let mut result = ListToolsResult::with_all_items(tools);
        // A cursor is the client's text: one past the end gets an empty page, never a wrap.
        let next = start.saturating_add(PAGE_SIZE);
        result.next_cursor = (next < listed.tools.len()).then(|| next.to_string());
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tenant = self.tenant(&context.extensions)?;
        let name = request.name.to_string();
        // Callable: any visible tool (found through search or listed), and the bridges when
        // they are listed. Private tools are the host's: an agent cannot call them by name
        // either. Looked up by name: building the whole listing per call is O(catalog).
        let visible = self.host.is_visible(&tenant, &name);
        let bridge = [TOOL_SEARCH, TOOL_DESCRIBE, TOOL_CALL].contains(&name.as_str())
            && (self.listing(&tenant)?.tools.iter()).any(|tool| tool.name == name);
        if !visible && !bridge {
            let name: String = name.chars().take(128).collect();
            return Err(ErrorData::invalid_params(
                format!("no tool named `{name}`"),
                None,
            ));
        }
        let args = Value::Object(request.arguments.unwrap_or_default());
        let structured_known = knows_structured_output(&context);
        let result = match self
            .disclosure
            .call_cancellable(&Caller::tenant(tenant), &name, args, &context.ct)
            .await
        {
            Ok(value) => {
                let mut result =
                    CallToolResult::success(vec![ContentBlock::text(value.to_string())]);
                if structured_known {
                    result.structured_content = Some(match value {
                        Value::Object(_) => value,
                        value => json!({"result": value}),
                    });
                }
                result
            }
            Err(error) => CallToolResult::error(vec![ContentBlock::text(format!(
                "error[{}]: {error}",
                error.code()
            ))]),
        };
        Ok(result.into())
    }

    /// Over HTTP, hands this session's calls to be answered in place. Up to 2025-11-25: tells
    /// this session's client when its tenant's tools change, until the session ends.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let Ok(tenant) = self.tenant(&context.extensions) else {
            return;
        };
        if let Some(sessions) = self.direct.as_ref().and_then(Weak::upgrade)
            && let Some(id) = session_id(&context.extensions)
        {
            sessions
                .register(id, self.clone(), context.peer.clone())
                .await;
        }
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut changes = self.host.subscribe_changes();
        let peer = context.peer;
        tokio::spawn(async move {
            loop {
                let changed = tokio::select! {
                    changed = tenant_changed(&mut changes, &tenant) => changed,
                    // A session that ends without a change must not keep this task alive.
                    _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {
                        if peer.is_transport_closed() { return; }
                        continue;
                    }
                };
                if changed.is_none() || peer.notify_tool_list_changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// From 2026-07-28 a client asks for change notifications with `subscriptions/listen`;
    /// this server offers the one it has.
    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(SubscriptionFilter::builder().tools_list_changed().build())
    }

    /// One `subscriptions/listen` stream: the tenant's tool changes, until it is cancelled.
    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), ErrorData> {
        let tenant = self.tenant(&subscription.request_context().extensions)?;
        let listen = self.listens.open(&tenant);
        let mut changes = self.host.subscribe_changes();
        loop {
            tokio::select! {
                _ = subscription.cancelled() => return Ok(()),
                _ = listen.ended.cancelled() => return Ok(()),
                changed = tenant_changed(&mut changes, &tenant) => {
                    let sent = match changed {
                        Some(()) => subscription.sink().notify_tool_list_changed().await,
                        None => return Ok(()),
                    };
                    if sent.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// The session an HTTP request names.
fn session_id(extensions: &rmcp::model::Extensions) -> Option<SessionId> {
    let parts = extensions.get::<axum::http::request::Parts>()?;
    let id = parts.headers.get("mcp-session-id")?.to_str().ok()?;
    Some(id.into())
}

/// Waits for a change of `tenant`'s tools (a lag counts as one); `None` once the host is gone.
async fn tenant_changed(changes: &mut Receiver<String>, tenant: &str) -> Option<()> {
    loop {
        match changes.recv().await {
            Ok(changed) if changed == tenant => return Some(()),
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => return Some(()),
            Err(RecvError::Closed) => return None,
        }
    }
}

/// `structuredContent` and `outputSchema` came with 2025-06-18: earlier clients get the text
/// alone, and tools without output schemas.
fn knows_structured_output(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_none_or(|version| version.as_str() >= "2025-06-18")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{host_where_acme_has_a_tool, http_tool};

    fn listing(json_bytes: u64) -> Arc<Listing> {
        Arc::new(Listing {
            generation: (0, 0),
            tools: Vec::new(),
            json_bytes,
        })
    }

    #[tokio::test]
    async fn only_a_change_of_its_own_tools_or_the_natives_converts_a_listing_again() {
        let host = host_where_acme_has_a_tool().await;
        let disclosure = Arc::new(Disclosure::new(host.clone(), Default::default()));
        let server = McpServer::http(
            host.clone(),
            disclosure,
            Default::default(),
            Default::default(),
        );
        let converted = server.listing("acme").unwrap();

        host.install_http("globex", http_tool("forecast"))
            .await
            .unwrap();
        assert!(Arc::ptr_eq(&converted, &server.listing("acme").unwrap()));

        let native = toolhost::ToolSpec::new("clock", "Tells the time.", json!({"type": "object"}));
        (host
            .natives()
            .register(native, |_, _, _| async { Ok(Value::Null) }))
        .unwrap();
        let with_native = server.listing("acme").unwrap();
        assert_eq!(with_native.tools.len(), 2);

        host.install_http("acme", http_tool("forecast"))
            .await
            .unwrap();
        assert_eq!(server.listing("acme").unwrap().tools.len(), 3);
    }

    #[test]
    fn a_listen_past_a_cap_ends_the_oldest_of_its_tenant_or_of_the_busiest() {
        let listens = Arc::new(Listens::default());
        let open = |tenant: &str, n: usize| -> Vec<Listen> {
            (0..n).map(|_| listens.open(tenant)).collect()
        };
        let ended = |listens: &[Listen]| listens.iter().filter(|l| l.ended.is_cancelled()).count();
        let mut a = open("a", MAX_LISTENS_PER_TENANT);
        a.push(listens.open("a"));
        assert!(a[0].ended.is_cancelled(), "the oldest gave way");
        assert_eq!(ended(&a), 1);
        // Other tenants fill the server, a little below a's share each.
        let each = MAX_LISTENS_PER_TENANT - 1;
        let others: Vec<_> = (0..(MAX_LISTENS - MAX_LISTENS_PER_TENANT) / each)
            .map(|t| open(&format!("t{t}"), each))
            .collect();
        let newest = listens.open("z");
        assert!(
            a[1].ended.is_cancelled(),
            "a holds the most: its oldest gave way"
        );
        assert!(others.iter().all(|t| ended(t) == 0) && !newest.ended.is_cancelled());
        drop((a, others, newest));
        assert!(listens.0.lock().unwrap().by_tenant.is_empty(), "each left");
    }

    #[test]
    fn a_tenant_with_a_huge_listing_does_not_push_out_the_others() {
        let listings = Listings::default();
        for tenant in 0..100 {
            listings
                .cache
                .insert(format!("small-{tenant}"), listing(10_000));
        }
        listings
            .cache
            .insert("huge".into(), listing(LISTINGS_JSON_BYTES));
        assert!(
            listings.cache.get("huge").is_none(),
            "over the bound: not kept"
        );
        let kept = (0..100).filter(|t| listings.cache.get(&format!("small-{t}")).is_some());
        assert_eq!(kept.count(), 100);
        assert!(listings.cache.weight() <= LISTINGS_JSON_BYTES);
    }
}
