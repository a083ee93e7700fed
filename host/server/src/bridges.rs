//! Progressive disclosure: for large catalogs an agent sees `tool_search`, `tool_describe` and
//! `tool_call` instead of every schema, and finds tools by ranked search (`toolhost-search`).
//!
//! `tool_call` goes through [`Host::call`], so validation, limits and every other step of the
//! pipeline apply exactly as to a direct call.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use toolhost::sandbox::places::Places;
use toolhost::schema::{ArgError, ArgsValidator};
use toolhost::{CallError, CallOutcome, Caller, Host, Store, ToolSpec};
use toolhost_search::{Index, SentenceEncoder, ToolVectors, VectorCache};

pub use toolhost::spec::{TOOL_CALL, TOOL_DESCRIBE, TOOL_SEARCH};

/// Whether agents see every tool or the search bridges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every tool, always.
    Off,
    /// The bridges, always.
    On,
    /// On when the full listing would exceed `threshold_pct` of `listing_max_tokens`.
    Auto,
}

/// Progressive disclosure: when and how agents search the catalog instead of listing it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct DisclosureConfig {
    /// Off, on, or auto.
    pub enabled: Mode,
    /// In auto mode, the share of `listing_max_tokens` past which the bridges are shown.
    pub threshold_pct: u32,
    /// The token budget of a tool listing.
    pub listing_max_tokens: usize,
    /// Hits a search returns when the agent asks for no number.
    pub search_default_limit: usize,
    /// The most hits a search returns.
    pub max_search_limit: usize,
    /// The top hits carry their full input schema, so the agent can call at once.
    pub search_inline_schema_max: usize,
    /// Offer `tool_call`; without it the agent calls found tools by name.
    pub call_bridge: bool,
    /// Listed in full even when disclosure is on.
    pub eager_tools: Vec<String>,
    /// Never listed in full: only found through search (turns the bridges on).
    pub defer_tools: Vec<String>,
    /// Rank with this contextual encoder instead of the static embeddings: better recall,
    /// milliseconds per query (`toolhost serve --search-model DIR`).
    #[serde(skip)]
    pub search_model: Option<Arc<SentenceEncoder>>,
}

impl Default for DisclosureConfig {
    fn default() -> Self {
        DisclosureConfig {
            enabled: Mode::Auto,
            threshold_pct: 50,
            listing_max_tokens: 8_000,
            search_default_limit: 5,
            max_search_limit: 20,
            search_inline_schema_max: 5,
            call_bridge: true,
            eager_tools: Vec::new(),
            defer_tools: Vec::new(),
            search_model: None,
        }
    }
}

/// What an agent is shown, and the bridge calls that serve it.
pub struct Disclosure {
    host: Arc<Host>,
    config: DisclosureConfig,
    /// Each tenant's search index, with the tenant's generation it was built at; at most
    /// [`INDEXED_TOOLS`] tools in all, the least used giving way, and a tenant's only while
    /// it weighs at most a quarter of that ([`TENANT_SHARE_OF_INDEXED`]).
    indexes: quick_cache::sync::Cache<String, Arc<TenantIndex>, ByTools>,
    /// Where indexes are built: one build of a tenant's at a time, [`INDEX_BUILDS`] in all,
    /// so a tenant whose index is not kept, searching again and again, holds one place.
    builds: Places,
    /// With a search model: its vectors of tool texts, kept in memory and in the store.
    tool_vectors: Option<Arc<ToolVectors>>,
    /// Each bridge's own input schema, compiled once: a bridge checks its arguments as any
    /// tool does.
    bridge_args: HashMap<String, ArgsValidator>,
}

struct TenantIndex {
    generation: (u64, u64),
    specs: Vec<ToolSpec>,
    index: Index,
}

impl TenantIndex {
    /// Its tools, counted against [`INDEXED_TOOLS`].
    fn weight(&self) -> u64 {
        self.specs.len() as u64 + 1
    }
}

/// The longest query `tool_search` takes: a query is encoded whole, on the caller's time but
/// not in a sandbox (a megabyte took 40–160 ms).
pub const MAX_QUERY_CHARS: usize = 1000;

/// Tools in the search indexes kept for all tenants together (a few KiB each: its spec, its
/// postings and its vector). A tenant whose index gave way builds it again at its next search.
const INDEXED_TOOLS: u64 = 50_000;

/// One tenant's index is kept while it weighs at most [`INDEXED_TOOLS`] divided by this (a
/// quarter): a larger one is built for each search, by that tenant's searches alone, rather
/// than push every other tenant's out.
const TENANT_SHARE_OF_INDEXED: u64 = 4;

/// Index builds at once in the process (a build with a search model takes a core for
/// seconds).
const INDEX_BUILDS: usize = 2;

#[derive(Clone)]
struct ByTools;

impl quick_cache::Weighter<String, Arc<TenantIndex>> for ByTools {
    fn weight(&self, _tenant: &String, index: &Arc<TenantIndex>) -> u64 {
        index.weight()
    }
}

/// How often the stored search vectors of texts no tool has any more are removed.
const COLLECT_VECTORS_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes the stored vectors of `vectors`' model whose text no tool has now: each changed
/// description leaves one behind, and nothing else would ever remove it. How many.
async fn collect_vectors(
    host: &Host,
    vectors: &ToolVectors,
) -> Result<usize, toolhost::StoreError> {
    let mut keep = HashSet::new();
    // The natives are in every tenant's list, and alone in that of a tenant with no tools.
    for tenant in host
        .tenants_with_tools()
        .iter()
        .map(String::as_str)
        .chain([""])
    {
        keep.extend(host.list(tenant).iter().map(|tool| vectors.key(&tool.spec)));
    }
    host.store()
        .retain_search_vectors(&vectors.prefix(), &keep)
        .await
}

impl Disclosure {
    /// Disclosure of `host`'s catalogs under `config`; with a search model, its stored
    /// vectors are collected every hour.
    pub fn new(host: Arc<Host>, config: DisclosureConfig) -> Self {
        Self::with_index_room(host, config, INDEXED_TOOLS)
    }

    /// As [`Disclosure::new`], with room for `indexed_tools` in the search indexes.
    fn with_index_room(host: Arc<Host>, config: DisclosureConfig, indexed_tools: u64) -> Self {
        let tool_vectors = config.search_model.clone().map(|encoder| {
            let store = host.store().clone();
            let cache: Arc<dyn VectorCache> = Arc::new(StoreVectors(store, Handle::current()));
            Arc::new(ToolVectors::new(encoder, Some(cache)))
        });
        if let Some(vectors) = &tool_vectors {
            // Held weakly: the task must not keep the host, or its store, open.
            let (host, vectors) = (Arc::downgrade(&host), Arc::downgrade(vectors));
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(COLLECT_VECTORS_EVERY).await;
                    let (Some(host), Some(vectors)) = (host.upgrade(), vectors.upgrade()) else {
                        return;
                    };
                    match collect_vectors(&host, &vectors).await {
                        Ok(removed) => tracing::debug!(removed, "search vectors collected"),
                        Err(error) => tracing::warn!(%error, "search vectors not collected"),
                    }
                }
            });
        }
        let bridge_args = bridges(&config)
            .into_iter()
            .map(|spec| {
                let schemas = spec.validate().expect("the bridges' schemas are valid");
                (spec.name, schemas.args)
            })
            .collect();
        Disclosure {
            host,
            config,
            indexes: quick_cache::sync::Cache::with_options(
                // One shard: each shard holds its share of the room, and a tenant's share must fit.
                (quick_cache::OptionsBuilder::new())
                    .estimated_items_capacity(256)
                    .weight_capacity(indexed_tools)
                    .shards(1)
                    .build()
                    .expect("capacities are set"),
                ByTools,
                Default::default(),
                Default::default(),
            ),
            builds: Places::new(INDEX_BUILDS, 1),
            tool_vectors,
            bridge_args,
        }
    }

    /// Removes the stored search vectors that no tool's text needs now (done every hour
    /// with a search model); how many.
    pub async fn collect_vectors(&self) -> Result<usize, toolhost::StoreError> {
        match &self.tool_vectors {
            Some(vectors) => collect_vectors(&self.host, vectors).await,
            None => Ok(0),
        }
    }

    /// The tenant's index, rebuilt only when its tools (or the natives) changed since.
    async fn index(&self, tenant: &str) -> Arc<TenantIndex> {
        let current = |generation| {
            (self.indexes.get(tenant)).filter(|cached| cached.generation == generation)
        };
        if let Some(cached) = current(self.host.generation(tenant)) {
            return cached;
        }
        let place = self.builds.take(tenant).await;
        // Another search of the tenant's may have built it while this one waited.
        let generation = self.host.generation(tenant);
        if let Some(cached) = current(generation) {
            return cached;
        }
        // Built outside the cache and off the async workers: with a contextual encoder a build
        // takes seconds, and other tenants' searches and calls must not wait for it.
        let specs: Vec<ToolSpec> = self.host.list(tenant).into_iter().map(|t| t.spec).collect();
        let (vectors, listed) = (self.tool_vectors.clone(), specs.clone());
        let index = tokio::task::spawn_blocking(move || {
            let _place = place;
            match &vectors {
                Some(vectors) => Index::build_contextual(&listed, vectors),
                None => Index::build(&listed),
            }
        })
        .await
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()));
        let built = Arc::new(TenantIndex {
            generation,
            specs,
            index,
        });
        let room = self.indexes.capacity();
        match built.weight() <= room / TENANT_SHARE_OF_INDEXED {
            true => self.indexes.insert(tenant.to_owned(), built.clone()),
            false => drop(self.indexes.remove(tenant)),
        }
        built
    }

    /// The tools to list to an agent of `tenant`: all of them, or the eager ones and the
    /// bridges.
    pub fn listing(&self, tenant: &str) -> Vec<ToolSpec> {
        let visible: Vec<ToolSpec> = self.host.list(tenant).into_iter().map(|t| t.spec).collect();
        if !self.active(&visible) {
            return visible;
        }
        let eager = |s: &ToolSpec| {
            self.config.enabled == Mode::Off && !self.config.defer_tools.contains(&s.name)
                || self.config.eager_tools.contains(&s.name)
        };
        let mut listing: Vec<ToolSpec> = visible.into_iter().filter(eager).collect();
        listing.extend(bridges(&self.config));
        listing
    }

    fn active(&self, visible: &[ToolSpec]) -> bool {
        let deferred = visible
            .iter()
            .any(|s| self.config.defer_tools.contains(&s.name));
        deferred
            || match self.config.enabled {
                Mode::Off => false,
                Mode::On => true,
                Mode::Auto => {
                    let chars: usize = visible
                        .iter()
                        .map(|s| serde_json::to_string(s).map_or(0, |j| j.len()))
                        .sum();
                    // About four characters a token for JSON tool specs.
                    let tokens = chars / 4;
                    tokens * 100
                        > self.config.listing_max_tokens * self.config.threshold_pct as usize
                }
            }
    }

    /// Calls `name`: a bridge, or any tool through the host.
    pub async fn call(&self, caller: &Caller, name: &str, args: Value) -> Result<Value, CallError> {
        self.call_cancellable(caller, name, args, &CancellationToken::new())
            .await
    }

    /// As [`Disclosure::call`], until `cancel` fires: the tool call stops where it is and
    /// ends [`CallError::Cancelled`].
    pub async fn call_cancellable(
        &self,
        caller: &Caller,
        name: &str,
        args: Value,
        cancel: &CancellationToken,
    ) -> Result<Value, CallError> {
        if let Some(validator) = self.bridge_args.get(name) {
            validator
                .validate(&args)
                .map_err(|errors| CallError::InvalidArgs { errors })?;
        }
        match name {
            TOOL_SEARCH => {
                let query = args["query"]
                    .as_str()
                    .ok_or_else(|| bad("query must be a string"))?;
                let limit = args["limit"]
                    .as_u64()
                    .map_or(self.config.search_default_limit, |l| l as usize);
                let limit = limit.clamp(1, self.config.max_search_limit);
                let cached = self.index(&caller.tenant).await;
                let inline = self.config.search_inline_schema_max;
                let search = || search(&cached, query, limit, inline);
                let multi_thread = tokio::runtime::Handle::try_current().is_ok_and(|h| {
                    h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
                });
                // The contextual encoder holds the thread for milliseconds (seconds when a
                // catalog changed): let the runtime move other tasks off this worker.
                Ok(if self.config.search_model.is_some() && multi_thread {
                    tokio::task::block_in_place(search)
                } else {
                    search()
                })
            }
            TOOL_DESCRIBE => {
                let wanted = args["name"]
                    .as_str()
                    .ok_or_else(|| bad("name must be a string"))?;
                // One spec copied, not the tenant's every one; a private tool stays unseen.
                let info = (self.host.is_visible(&caller.tenant, wanted))
                    .then(|| self.host.describe(&caller.tenant, wanted))
                    .flatten();
                let spec = info
                    .ok_or_else(|| CallError::NotFound {
                        name: wanted.to_owned(),
                    })?
                    .spec;
                Ok(
                    json!({"name": spec.name, "description": spec.description, "parameters": spec.parameters}),
                )
            }
            TOOL_CALL if self.config.call_bridge => {
                let target = args["name"]
                    .as_str()
                    .ok_or_else(|| bad("name must be a string"))?;
                if [TOOL_SEARCH, TOOL_DESCRIBE, TOOL_CALL].contains(&target) {
                    return Err(bad("tool_call calls tools, not the bridges"));
                }
                // Only what this tenant's agent may see: private tools stay the host's.
                if !self.host.is_visible(&caller.tenant, target) {
                    return Err(CallError::NotFound {
                        name: target.to_owned(),
                    });
                }
                let outcome: CallOutcome = self
                    .host
                    .call_cancellable(caller, target, args["arguments"].clone(), cancel)
                    .await;
                outcome.result
            }
            _ => {
                let outcome = self.host.call_cancellable(caller, name, args, cancel);
                outcome.await.result
            }
        }
    }
}

/// The best `limit` tools of `cached` for `query`, the first `inline_schemas` with their
/// parameters.
fn search(cached: &TenantIndex, query: &str, limit: usize, inline_schemas: usize) -> Value {
    let visible = &cached.specs;
    let hits: Vec<Value> = cached
        .index
        .search(query, limit)
        .into_iter()
        .enumerate()
        .map(|(rank, (i, score))| {
            let spec = &visible[i];
            let mut hit = json!({"name": spec.name, "description": spec.description, "score": (f64::from(score) * 1000.0).round() / 1000.0});
            if rank < inline_schemas {
                hit["parameters"] = spec.parameters.clone();
            }
            hit
        })
        .collect();
    json!({"results": hits})
}

fn bad(message: &str) -> CallError {
    CallError::InvalidArgs {
        errors: vec![ArgError {
            path: String::new(),
            message: message.to_owned(),
        }],
    }
}

/// Search vectors kept in the host's store beside the catalog. Used from the blocking
/// thread an index is built on, which may wait for the runtime's store futures.
struct StoreVectors(Arc<dyn Store>, Handle);

impl VectorCache for StoreVectors {
    fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.1
            .block_on(self.0.search_vector(key))
            .inspect_err(|error| tracing::warn!(%error, "search vector unreadable; encoding"))
            .ok()
            .flatten()
    }

    fn put(&self, key: &str, vector: &[u8]) {
        if let Err(error) = self.1.block_on(self.0.put_search_vector(key, vector)) {
            tracing::warn!(%error, "search vector not stored");
        }
    }
}

/// The bridges' specs under `config`.
fn bridges(config: &DisclosureConfig) -> Vec<ToolSpec> {
    let max = config.max_search_limit;
    let mut bridges = vec![
        ToolSpec::new(
            TOOL_SEARCH,
            "Searches the available tools by what they do. Returns the best matches with their descriptions; the top ones include their input schema.",
            json!({"type": "object", "required": ["query"], "properties": {
                "query": {"type": "string", "maxLength": MAX_QUERY_CHARS,
                    "description": "What the tool should do, in a few words."},
                "limit": {"type": "integer", "minimum": 1, "maximum": max, "description": "How many tools to return."}
            }}),
        ),
        ToolSpec::new(
            TOOL_DESCRIBE,
            "Returns a tool's full description and input schema, by name.",
            json!({"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string", "description": "The tool's exact name."}
            }}),
        ),
    ];
    if config.call_bridge {
        bridges.push(ToolSpec::new(
            TOOL_CALL,
            "Calls a tool found with tool_search, by name, with its arguments.",
            json!({"type": "object", "required": ["name", "arguments"], "properties": {
                "name": {"type": "string"},
                "arguments": {"type": "object", "description": "Arguments matching the tool's input schema."}
            }}),
        ));
    }
    bridges
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{host_where_acme_has_a_tool, http_tool};

    /// With a search model a build takes seconds: another tenant's install must not cost one.
    #[tokio::test]
    async fn only_a_change_of_its_own_tools_rebuilds_a_tenants_index() {
        let host = host_where_acme_has_a_tool().await;
        let disclosure = Disclosure::new(host.clone(), DisclosureConfig::default());
        let built = disclosure.index("acme").await;

        host.install_http("globex", http_tool("forecast"))
            .await
            .unwrap();
        assert!(Arc::ptr_eq(&built, &disclosure.index("acme").await));

        host.install_http("acme", http_tool("forecast"))
            .await
            .unwrap();
        let rebuilt = disclosure.index("acme").await;
        assert!(!Arc::ptr_eq(&built, &rebuilt));
        assert_eq!(rebuilt.specs.len(), 2);
    }

    #[tokio::test]
    async fn a_tenants_index_past_its_share_of_the_room_is_not_kept_and_pushes_out_no_other() {
        let host = host_where_acme_has_a_tool().await;
        // Room for 16 tools: a tenant's index is kept while it weighs at most 4.
        let disclosure = Disclosure::with_index_room(host.clone(), Default::default(), 16);
        let acme = disclosure.index("acme").await;
        assert!(acme.weight() <= 4, "{}", acme.weight());
        for name in ["a", "b", "c", "d"] {
            host.install_http("globex", http_tool(name)).await.unwrap();
        }
        let globex = disclosure.index("globex").await;
        assert!(globex.weight() > 4);
        assert!(!Arc::ptr_eq(&globex, &disclosure.index("globex").await));
        assert!(Arc::ptr_eq(&acme, &disclosure.index("acme").await));
    }
}
