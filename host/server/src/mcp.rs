//! The MCP server: a tenant's visible tools over the Model Context Protocol (rmcp), on
//! Streamable HTTP at `/mcp` (tenant from the API key) or on stdio (tenant fixed at start).
//!
//! Tool failures are results with `isError: true`; JSON-RPC errors are kept for malformed
//! requests (an unknown tool, a bad cursor). A JSON result is returned as text and as
//! `structuredContent` (wrapped as `{"result": ...}` when it is not an object, as MCP requires
//! an object there).

use std::sync::Arc;

use rmcp::model::SubscriptionFilter;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    Implementation, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::sync::broadcast::Receiver;
use tokio::sync::broadcast::error::RecvError;

use toolhost::export::{self, Format};
use toolhost::{Caller, Host};

use crate::bridges::{Disclosure, DisclosureConfig, TOOL_CALL, TOOL_DESCRIBE, TOOL_SEARCH};

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
}

impl McpServer {
    /// For `toolhost mcp`: one tenant, over stdio.
    pub fn stdio(host: Arc<Host>, disclosure: DisclosureConfig, tenant: String) -> Self {
        McpServer {
            disclosure: Arc::new(Disclosure::new(host.clone(), disclosure)),
            listings: Arc::default(),
            host,
            tenant: Some(tenant),
        }
    }

    /// For `/mcp`: the tenant of each request's key.
    pub fn http(host: Arc<Host>, disclosure: Arc<Disclosure>, listings: Arc<Listings>) -> Self {
        McpServer {
            host,
            disclosure,
            listings,
            tenant: None,
        }
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
        .serve(stdio())
        .await
        .map_err(|e| e.to_string())?;
    running
        .waiting()
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

type Reader = std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>>;
type Writer = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// stdin and stdout as non-blocking pipes where they are pipes (as an MCP client that spawns
/// its server connects them), so each read and write waits in epoll rather than being handed
/// to a thread of tokio's blocking pool and back; tokio's `stdin`/`stdout` otherwise.
fn stdio() -> (Reader, Writer) {
    use std::os::fd::AsFd;
    use tokio::net::unix::pipe;
    let own = |fd: std::os::fd::BorrowedFd<'_>| fd.try_clone_to_owned().ok();
    let reader: Reader = match own(std::io::stdin().as_fd()).map(pipe::Receiver::from_owned_fd) {
        Some(Ok(pipe)) => Box::pin(pipe),
        _ => Box::pin(tokio::io::stdin()),
    };
    let writer: Writer = match own(std::io::stdout().as_fd()).map(pipe::Sender::from_owned_fd) {
        Some(Ok(pipe)) => Box::pin(pipe),
        _ => Box::pin(tokio::io::stdout()),
    };
    (reader, writer)
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

    /// Up to 2025-11-25: tells this session's client when its tenant's tools change, until
    /// the session ends.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let Ok(tenant) = self.tenant(&context.extensions) else {
            return;
        };
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
        let mut changes = self.host.subscribe_changes();
        loop {
            tokio::select! {
                _ = subscription.cancelled() => return Ok(()),
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
        let server = McpServer::http(host.clone(), disclosure, Default::default());
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
