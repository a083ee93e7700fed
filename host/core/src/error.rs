//! What opening a host, installing a tool or managing a tenant can fail with.

use toolhost_sandbox::{Fault, LoadError};
use toolhost_spec::policy::PolicyError;
use toolhost_spec::spec::SpecError;
use toolhost_store::StoreError;

use crate::config::{MAX_CONFIG_VALUE_BYTES, MAX_JS_SOURCE_BYTES, MAX_TOOLS_PER_COMPONENT};

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot start the Wasm engine: {0}")]
    Engine(String),
    #[error("cannot open the artifact directory {}: {error}", path.display())]
    ArtifactDir {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("tenant `{0}` is not a valid tenant id (1 to 128 printable characters)")]
    Tenant(String),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("the component's list-tools {0}")]
    ListTools(Fault),
    #[error("the component offers no tools")]
    NoTools,
    #[error("the component offers {count} tools; the limit is {MAX_TOOLS_PER_COMPONENT}")]
    TooManyTools { count: usize },
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(
        "JavaScript tools need the JS runtime: start the host with one (HostConfig::js_runtime, `--js-runtime`; `scripts/build-js-runtime` builds it)"
    )]
    NoJsRuntime,
    #[error("the JavaScript source is {size} bytes; the limit is {MAX_JS_SOURCE_BYTES}")]
    JsTooLarge { size: usize },
    /// The module does not compile or run, or has no usable `spec` export.
    #[error("the JavaScript source: {0}")]
    JsSource(String),
    /// Installing runs the component's code, so it passes the same gates as a call.
    #[error("not admitted: {message}")]
    Admission {
        limit: &'static str,
        message: String,
    },
    #[error("tool `{0}`: the name belongs to a native tool of this host")]
    NativeName(String),
    #[error("tool `{0}`: the name is reserved for the host's tool-search bridges")]
    ReservedName(String),
    #[error("tool `{name}`: differs only in case from the existing tool `{existing}`")]
    CaseConflict { name: String, existing: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, thiserror::Error)]
pub enum ManageError {
    #[error("no tool named `{0}`")]
    NotFound(String),
    #[error("tool `{name}` has no version {version}; it has {available:?}")]
    NoSuchVersion {
        name: String,
        version: u32,
        available: Vec<u32>,
    },
    #[error("tool `{0}` has no earlier version to roll back to")]
    NoEarlierVersion(String),
    #[error("tenant `{0}` is not a valid tenant id (1 to 128 printable characters)")]
    Tenant(String),
    #[error("no tenant `{0}`: create it first")]
    NoTenant(String),
    #[error("no randomness available: {0}")]
    Random(String),
    #[error("config key `{0}` must match ^[A-Za-z0-9_.-]{{1,128}}$")]
    ConfigKey(String),
    #[error("config value is {0} bytes; the limit is {MAX_CONFIG_VALUE_BYTES}")]
    ConfigValue(usize),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Store(#[from] StoreError),
}
