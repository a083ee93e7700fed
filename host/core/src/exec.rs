//! Running one resolved tool once under its (narrowed) limits: a component or JS source in a
//! fresh sandboxed instance, an HTTP tool's request, or a native handler in its own task.
//! Every failure becomes a [`CallError`].

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;
use toolhost_sandbox::egress::EgressConfig;
use toolhost_sandbox::{Entry, Fault, GuestToolError, Helpers, NestedCall, ReusePolicy};
use toolhost_spec::call::{CallContext, CallError, ToolError};
use toolhost_spec::clip::{MAX_PARSED_VALUES, json_values};
use toolhost_spec::policy::TenantPolicy;
use toolhost_spec::spec::Limits;
use toolhost_store::{SourceKind, Store};

use crate::catalog::JsSource;
use crate::components::Components;
use crate::grants::{self, TenantFiles};
use crate::http_tool::HttpRequestDef;
use crate::js_snapshots::JsSnapshots;
use crate::metrics::{ComponentSource, Metrics};
use crate::registry::{NativeTool, TenantTool};

/// A tool's own error message is cut to this many characters.
pub(crate) const MAX_ERROR_CHARS: usize = 4096;
/// A guest's result text over this is refused before it is parsed: parsed JSON takes many
/// times its text in memory, and `max_result_chars` (at most 1 Mi) clips anything larger.
pub const MAX_RESULT_BYTES: usize = 8 << 20;

pub(crate) struct Executors {
    components: Arc<Components>,
    store: Arc<dyn Store>,
    egress: Arc<EgressConfig>,
    /// Tenants' granted directories, and their budgets; `None` for an in-memory host.
    files: Option<TenantFiles>,
    /// Parsed HTTP request definitions by blob sha256; small, and shared by versions.
    http_requests: ParsedBlobs<HttpRequestDef>,
    /// Stored JS sources by blob sha256.
    js_sources: ParsedBlobs<JsSource>,
    /// JS tools pre-initialised on this node.
    js_snapshots: JsSnapshots,
    metrics: Arc<Metrics>,
}

impl Executors {
    pub fn new(
        components: Arc<Components>,
        store: Arc<dyn Store>,
        egress: EgressConfig,
        files_dir: Option<PathBuf>,
        js_snapshots: (usize, usize),
        metrics: Arc<Metrics>,
    ) -> Self {
        Executors {
            js_snapshots: JsSnapshots::new(components.sandbox_arc(), store.clone(), js_snapshots),
            components,
            store,
            egress: Arc::new(egress),
            files: files_dir.map(TenantFiles::new),
            http_requests: ParsedBlobs::new(),
            js_sources: ParsedBlobs::new(),
            metrics,
        }
    }

    /// Starts pre-initialising a JS tool on this node (see [`JsSnapshots`]).
    pub async fn pre_initialize(&self, tool: &TenantTool) {
        if tool.version.kind != SourceKind::Js {
            return;
        }
        let sha = &tool.version.component;
        if let Ok(js) = self.parsed_blob(&self.js_sources, sha, "JS source").await {
            let limits = tool.spec().limits;
            self.js_snapshots
                .request(&tool.tenant, sha, js, limits)
                .await;
        }
    }

    pub fn tenant_files(&self, tenant: &str) -> Option<PathBuf> {
        Some(self.files.as_ref()?.root(tenant))
    }

    /// Bytes the tenant's files hold, as its budget counts them (0 without a files
    /// directory).
    pub async fn files_used(&self, tenant: &str, policy: &TenantPolicy) -> Result<u64, String> {
        match &self.files {
            Some(files) => Ok(files.budget(tenant, policy).await?.used()),
            None => Ok(0),
        }
    }

    /// An HTTP tool: its stored request, within the call's deadline.
    pub async fn run_http(
        &self,
        tool: &TenantTool,
        limits: &Limits,
        args: &Value,
        helpers: &Helpers,
    ) -> Result<Value, CallError> {
        let request = self
            .parsed_blob(
                &self.http_requests,
                &tool.version.component,
                "request definition",
            )
            .await
            .map_err(|message| CallError::Internal { message })?;
        let deadline = tokio::time::Instant::now() + limits.timeout();
        let call = crate::http_tool::call(&request, args, helpers, &self.egress, deadline);
        match tokio::time::timeout_at(deadline, call).await {
            Ok(result) => result.map_err(CallError::Tool),
            Err(_elapsed) => Err(CallError::Timeout {
                limit_ms: limits.timeout_ms,
            }),
        }
    }

    /// A component, or JS source on the runtime it was installed on, in a fresh instance;
    /// the fuel it used. The guest's `call-tool` requests go to `serve_nested` while it waits.
    pub async fn run_wasm<F, Fut>(
        &self,
        tool: &TenantTool,
        limits: &Limits,
        args: &Value,
        (helpers, ctx, policy): (&Helpers, &CallContext, &TenantPolicy),
        serve_nested: F,
    ) -> (Result<Value, CallError>, Option<u64>)
    where
        F: Fn(NestedCall) -> Fut,
        Fut: Future<Output = ()>,
    {
        let internal = |message| (Err(CallError::Internal { message }), None);
        let js = match tool.version.kind {
            SourceKind::Js => {
                let sha = &tool.version.component;
                match self.parsed_blob(&self.js_sources, sha, "JS source").await {
                    Ok(js) => Some(js),
                    Err(message) => return internal(message),
                }
            }
            _ => None,
        };
        let component = js
            .as_ref()
            .map_or(&tool.version.component, |js| &js.runtime);
        // The JS runtime is every JS tool's: no tenant's share of the loaded components.
        let charged_to = js.is_none().then_some(&*ctx.tenant);
        let snapshot = match &js {
            Some(js) => {
                let (tenant, sha) = (&tool.tenant, &tool.version.component);
                let ready = self.js_snapshots.ready(tenant, sha);
                if ready.is_none() {
                    let limits = tool.spec().limits;
                    self.js_snapshots
                        .request(tenant, sha, js.clone(), limits)
                        .await;
                }
                ready
            }
            None => None,
        };
        let prepared = match snapshot {
            Some(prepared) => {
                self.metrics.component_loaded(ComponentSource::Snapshot);
                prepared
            }
            None => match self.components.prepared(charged_to, component).await {
                Ok(prepared) => prepared,
                Err(message) => return internal(message),
            },
        };
        let args = args.to_string();
        let entry = match &js {
            Some(js) => Entry::Js {
                source: &js.source,
                args: &args,
            },
            None => Entry::Tool { args: &args },
        };
        let call = (&*ctx.tenant, &*ctx.tool);
        let permissions = grants::permissions(policy, call, self.files.as_ref(), &self.egress);
        let mut permissions = match permissions.await {
            Ok(permissions) => permissions,
            Err(message) => return internal(message),
        };
        let (tools, mut nested_calls) = tokio::sync::mpsc::channel(1);
        permissions.tools = Some(tools);
        // Opted in by the tenant's policy: one tenant's one tool of one component, under one
        // memory cap (a kept instance holds that much of the memory budget).
        if js.is_none()
            && let Some(reuse) = policy.grants_for(&ctx.tool).reuse
        {
            let (tenant, name, sha) = (&ctx.tenant, &ctx.tool, &tool.version.component);
            permissions.reuse = Some(ReusePolicy {
                key: format!("{tenant}\0{name}\0{sha}\0{}", limits.memory_bytes),
                max_calls: reuse.max_calls,
                max_age: std::time::Duration::from_millis(reuse.max_age_ms),
            });
        }
        let _live = self.metrics.instance();
        let sandbox = self.components.sandbox();
        let run = sandbox.call(&prepared, limits, helpers.clone(), &permissions, entry, ctx);
        tokio::pin!(run);
        // The guest waits in `call-tool` while its nested call runs here.
        let run = loop {
            tokio::select! {
                run = &mut run => break run,
                Some(nested) = nested_calls.recv() => serve_nested(nested).await,
            }
        };
        let result = match run.result {
            Ok(Ok(text)) if text.len() > MAX_RESULT_BYTES => Err(CallError::InvalidOutput {
                reason: format!(
                    "the result is {} bytes of text; results over {MAX_RESULT_BYTES} bytes are refused unread",
                    text.len()
                ),
            }),
            Ok(Ok(text)) if json_values(&text) > MAX_PARSED_VALUES => {
                Err(CallError::InvalidOutput {
                    reason: format!(
                        "the result holds more than {MAX_PARSED_VALUES} JSON values; results \
                         with more are refused unread"
                    ),
                })
            }
            Ok(Ok(text)) => serde_json::from_str(&text).map_err(|e| CallError::InvalidOutput {
                reason: format!("not JSON ({e}): {}", truncate(&text, 80)),
            }),
            Ok(Err(GuestToolError::InvalidArgs(m))) => {
                Err(ToolError::InvalidArgs(truncate(&m, MAX_ERROR_CHARS)).into())
            }
            Ok(Err(GuestToolError::Failed(m))) => {
                Err(ToolError::Failed(truncate(&m, MAX_ERROR_CHARS)).into())
            }
            Err(fault) => Err(fault_to_error(fault, limits, helpers)),
        };
        (result, Some(run.fuel_used))
    }

    /// A stored JSON blob (an HTTP request definition, a JS source), parsed once and kept:
    /// blobs are content-addressed, so a parsed one never goes stale.
    async fn parsed_blob<T: DeserializeOwned>(
        &self,
        cache: &ParsedBlobs<T>,
        sha: &str,
        what: &str,
    ) -> Result<Arc<T>, String> {
        if let Some((parsed, _)) = cache.0.get(sha) {
            return Ok(parsed);
        }
        let bytes = self
            .store
            .blob(sha)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{what} {sha} is missing from the store"))?;
        let parsed: Arc<T> = Arc::new(
            serde_json::from_slice(&bytes)
                .map_err(|e| format!("{what} {sha} is unreadable: {e}"))?,
        );
        cache
            .0
            .insert(sha.to_owned(), (parsed.clone(), bytes.len() as u64));
        Ok(parsed)
    }
}

/// The text of the parsed blobs each cache keeps, all tenants together: a removed version's
/// is never asked for again, and gives way to those in use.
const PARSED_BLOB_BYTES: u64 = 64 << 20;

/// Parsed blobs by sha256, with the length of their text, least used first out.
struct ParsedBlobs<T>(quick_cache::sync::Cache<String, (Arc<T>, u64), ByTextBytes>);

impl<T> ParsedBlobs<T> {
    fn new() -> Self {
        let cache = quick_cache::sync::Cache::with_weighter(1024, PARSED_BLOB_BYTES, ByTextBytes);
        ParsedBlobs(cache)
    }
}

#[derive(Clone)]
struct ByTextBytes;

impl<T> quick_cache::Weighter<String, (Arc<T>, u64)> for ByTextBytes {
    fn weight(&self, _: &String, (_, bytes): &(Arc<T>, u64)) -> u64 {
        (*bytes).max(1)
    }
}

/// A native handler in its own task, so that a panic in it stays in that task.
pub(crate) async fn run_native(
    tool: &NativeTool,
    limits: &Limits,
    args: Value,
    helpers: Helpers,
    ctx: CallContext,
) -> Result<Value, CallError> {
    let mut task = tokio::spawn((tool.handler)(args, helpers, ctx));
    match tokio::time::timeout(limits.timeout(), &mut task).await {
        Err(_elapsed) => {
            task.abort();
            Err(CallError::Timeout {
                limit_ms: limits.timeout_ms,
            })
        }
        Ok(Ok(result)) => result.map_err(CallError::Tool),
        Ok(Err(join)) => Err(CallError::Trap {
            message: match join.try_into_panic() {
                Ok(payload) => panic_message(payload.as_ref()),
                Err(cancelled) => cancelled.to_string(),
            },
        }),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    format!("native tool panicked: {text}")
}

fn fault_to_error(fault: Fault, limits: &Limits, helpers: &Helpers) -> CallError {
    match fault {
        Fault::Timeout => CallError::Timeout {
            limit_ms: limits.timeout_ms,
        },
        Fault::OutOfFuel => CallError::OutOfFuel { limit: limits.fuel },
        Fault::MemoryLimit => CallError::MemoryLimit {
            limit_bytes: limits.memory_bytes,
        },
        Fault::Trap(trap) => {
            let message = match helpers.snapshot().guest_panic() {
                Some(panic) => format!(
                    "{trap}; the guest panicked: {}",
                    truncate(panic, MAX_ERROR_CHARS)
                ),
                None => trap,
            };
            CallError::Trap { message }
        }
        Fault::Host(message) => CallError::Internal { message },
    }
}

/// A tool's own words may quote a secret it read: never pass one on.
pub(crate) fn redact_error(error: CallError, helpers: &Helpers) -> CallError {
    match error {
        CallError::Tool(ToolError::Failed(m)) => ToolError::Failed(helpers.redact(&m)).into(),
        CallError::Tool(ToolError::InvalidArgs(m)) => {
            ToolError::InvalidArgs(helpers.redact(&m)).into()
        }
        CallError::Trap { message } => CallError::Trap {
            message: helpers.redact(&message),
        },
        CallError::InvalidOutput { reason } => CallError::InvalidOutput {
            reason: helpers.redact(&reason),
        },
        other => other,
    }
}

pub(crate) fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsed_blobs_keep_a_bounded_amount_of_text() {
        let blobs = ParsedBlobs::<String>::new();
        for n in 0..200 {
            let sha = format!("{n:064x}");
            blobs.0.insert(sha, (Arc::new(String::new()), 1 << 20));
        }
        assert!(blobs.0.weight() <= PARSED_BLOB_BYTES);
        assert!(blobs.0.len() < 200);
    }
}
