//! Which tools exist: the embedding app's trusted native tools, and each tenant's installed
//! Wasm tools. Both in memory; the tenant catalog is rebuilt from the store at start.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use serde_json::Value;

use toolhost_sandbox::helpers::Helpers;
use toolhost_spec::call::{CallContext, ToolError};
use toolhost_spec::spec::{Schemas, SpecError, ToolSpec};
use toolhost_store::{SharedSpecs, ToolVersion};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Handler =
    Arc<dyn Fn(Value, Helpers, CallContext) -> BoxFuture<Result<Value, ToolError>> + Send + Sync>;

/// A trusted Rust tool of the embedding application.
pub struct NativeTool {
    /// Its spec, as agents see it.
    pub spec: ToolSpec,
    pub(crate) schemas: Schemas,
    pub(crate) handler: Handler,
}

/// A tenant's tool at the version that answers calls: a stored component, or a stored HTTP
/// request definition.
pub struct TenantTool {
    /// The tenant that owns it.
    pub tenant: String,
    /// The version that answers calls.
    pub version: ToolVersion,
    /// Compiled on the first call of a tool read back from the store: a restart compiles none.
    pub(crate) schemas: OnceLock<Result<Schemas, SpecError>>,
}

impl TenantTool {
    /// The current version's spec.
    pub fn spec(&self) -> &ToolSpec {
        &self.version.spec
    }

    /// Its compiled schemas; an error if the stored spec's no longer compile.
    pub(crate) fn schemas(&self) -> Result<&Schemas, &SpecError> {
        self.schemas
            .get_or_init(|| self.version.spec.compile_schemas())
            .as_ref()
    }
}

/// Why a native tool could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// Its spec breaks a rule.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// Another native tool has the name.
    #[error("a native tool named `{0}` is already registered")]
    Duplicate(String),
}

/// The embedding app's own tools: trusted, never persisted, visible to every tenant, and never
/// shadowed by a tenant's tool.
#[derive(Default)]
pub struct NativeRegistry {
    tools: RwLock<BTreeMap<String, Arc<NativeTool>>>,
    /// Bumped on every registration, so caches of listings know to rebuild.
    generation: std::sync::atomic::AtomicU64,
}

impl NativeRegistry {
    /// Registers `handler` under `spec`. It runs under the spec's timeout; a panic in it
    /// becomes that call's `trap` outcome.
    pub fn register<F, Fut>(&self, spec: ToolSpec, handler: F) -> Result<(), RegisterError>
    where
        F: Fn(Value, Helpers, CallContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        let schemas = spec.validate()?;
        let mut tools = self.tools.write().unwrap_or_else(|p| p.into_inner());
        if tools.contains_key(&spec.name) {
            return Err(RegisterError::Duplicate(spec.name));
        }
        let handler: Handler =
            Arc::new(move |args, helpers, ctx| Box::pin(handler(args, helpers, ctx)));
        tools.insert(
            spec.name.clone(),
            Arc::new(NativeTool {
                spec,
                schemas,
                handler,
            }),
        );
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// The native tool named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<NativeTool>> {
        self.tools
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// Changes whenever a tool is registered.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The native tool whose name equals `name` but for case, if any.
    pub fn case_twin(&self, name: &str) -> Option<String> {
        let tools = self.tools.read().unwrap_or_else(|p| p.into_inner());
        tools
            .keys()
            .find(|k| k.as_str() != name && k.eq_ignore_ascii_case(name))
            .cloned()
    }

    /// Every native tool, by name.
    pub fn all(&self) -> Vec<Arc<NativeTool>> {
        self.tools
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

/// Every tenant's installed Wasm tools, by tenant then name.
#[derive(Default)]
pub(crate) struct TenantTools {
    tenants: RwLock<HashMap<String, BTreeMap<String, Arc<TenantTool>>>>,
    /// Tenants that installed the same code hold one copy of its specs.
    specs: Mutex<SharedSpecs>,
}

impl TenantTools {
    pub fn get(&self, tenant: &str, name: &str) -> Option<Arc<TenantTool>> {
        let tenants = self.tenants.read().unwrap_or_else(|p| p.into_inner());
        tenants.get(tenant)?.get(name).cloned()
    }

    pub fn tenant_tools(&self, tenant: &str) -> Vec<Arc<TenantTool>> {
        let tenants = self.tenants.read().unwrap_or_else(|p| p.into_inner());
        tenants
            .get(tenant)
            .map(|tools| tools.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn insert(&self, tool: TenantTool) {
        let tool = self.shared(tool);
        let mut tenants = self.tenants.write().unwrap_or_else(|p| p.into_inner());
        tenants
            .entry(tool.tenant.clone())
            .or_default()
            .insert(tool.spec().name.clone(), Arc::new(tool));
    }

    /// A tool of `tenant` whose name equals `name` but for case, if any.
    pub fn case_twin(&self, tenant: &str, name: &str) -> Option<String> {
        let tenants = self.tenants.read().unwrap_or_else(|p| p.into_inner());
        tenants
            .get(tenant)?
            .keys()
            .find(|existing| existing.as_str() != name && existing.eq_ignore_ascii_case(name))
            .cloned()
    }

    pub fn remove(&self, tenant: &str, name: &str) -> bool {
        let mut tenants = self.tenants.write().unwrap_or_else(|p| p.into_inner());
        tenants
            .get_mut(tenant)
            .is_some_and(|tools| tools.remove(name).is_some())
    }

    /// Every tenant with a tool.
    pub fn tenants(&self) -> Vec<String> {
        let tenants = self.tenants.read().unwrap_or_else(|p| p.into_inner());
        tenants.keys().cloned().collect()
    }

    /// Makes `tools` all of `tenant`'s tools.
    pub fn replace_tenant(&self, tenant: &str, tools: Vec<TenantTool>) {
        let by_name = tools
            .into_iter()
            .map(|tool| (tool.spec().name.clone(), Arc::new(self.shared(tool))))
            .collect();
        let mut tenants = self.tenants.write().unwrap_or_else(|p| p.into_inner());
        tenants.insert(tenant.to_owned(), by_name);
    }

    /// Whether `tools` are not exactly `tenant`'s tools as served now.
    pub fn differs(&self, tenant: &str, tools: &[TenantTool]) -> bool {
        let tenants = self.tenants.read().unwrap_or_else(|p| p.into_inner());
        let served = tenants.get(tenant);
        served.map_or(0, BTreeMap::len) != tools.len()
            || tools.iter().any(|tool| {
                served
                    .and_then(|served| served.get(&tool.spec().name))
                    .is_none_or(|served| served.version != tool.version)
            })
    }

    /// `tool`, its spec the one already held for its code if that is equal.
    fn shared(&self, mut tool: TenantTool) -> TenantTool {
        let mut specs = self.specs.lock().unwrap_or_else(|p| p.into_inner());
        specs.share_spec(&tool.version.component, &mut tool.version.spec);
        tool
    }
}

/// Tenant ids come from the embedding app: any 1 to 128 printable characters.
pub fn is_valid_tenant(tenant: &str) -> bool {
    (1..=128).contains(&tenant.len()) && !tenant.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolhost_store::SourceKind;

    fn tool(tenant: &str, component: &str, description: &str) -> TenantTool {
        let spec = ToolSpec::new("t", description, serde_json::json!({"type": "object"}));
        TenantTool {
            tenant: tenant.into(),
            version: ToolVersion {
                version: 1,
                kind: SourceKind::Wasm,
                spec: Arc::new(spec),
                component: component.into(),
                runtime: None,
                bytes: 10,
                spec_json_bytes: 0,
                installed_at_ms: 1,
            },
            schemas: OnceLock::new(),
        }
    }

    #[test]
    fn tenants_serving_the_same_code_hold_one_copy_of_its_spec() {
        let tools = TenantTools::default();
        tools.insert(tool("a", "sha1", "d"));
        tools.replace_tenant("b", vec![tool("b", "sha1", "d")]);
        tools.insert(tool("c", "sha1", "edited"));
        tools.insert(tool("d", "sha2", "d"));
        let spec = |tenant: &str| tools.get(tenant, "t").unwrap().version.spec.clone();
        assert!(Arc::ptr_eq(&spec("a"), &spec("b")));
        assert!(!Arc::ptr_eq(&spec("a"), &spec("c")), "another spec");
        assert!(!Arc::ptr_eq(&spec("a"), &spec("d")), "other code");
        assert_eq!(spec("c").description, "edited");
    }
}
