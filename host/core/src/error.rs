//! What opening a host, installing a tool or managing a tenant can fail with.

use toolhost_sandbox::{Fault, LoadError};
use toolhost_spec::policy::PolicyError;
use toolhost_spec::spec::SpecError;
use toolhost_store::StoreError;

use crate::config::{
    MAX_CONFIG_KEYS, MAX_CONFIG_VALUE_BYTES, MAX_JS_SOURCE_BYTES, MAX_SPEC_BYTES_PER_TENANT,
    MAX_TOOLS_PER_COMPONENT,
};

/// Why [`crate::Host::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The store cannot be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The Wasm engine cannot start (for example, its memory pool cannot be reserved).
    #[error("cannot start the Wasm engine: {0}")]
    Engine(String),
    #[error("cannot open the artifact directory {}: {error}", path.display())]
    /// The shared artifact directory cannot be created or opened.
    ArtifactDir {
        /// The directory.
        path: std::path::PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
}

/// Why an install failed. Nothing was installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The tenant id is not valid.
    #[error("tenant `{0}` is not a valid tenant id (1 to 128 printable characters)")]
    Tenant(String),
    /// The component cannot be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The component's `list-tools` failed.
    #[error("the component's list-tools {0}")]
    ListTools(Fault),
    /// The component's `list-tools` returned nothing.
    #[error("the component offers no tools")]
    NoTools,
    #[error("the component offers {count} tools; the limit is {MAX_TOOLS_PER_COMPONENT}")]
    /// The component offers more tools than one component may.
    TooManyTools {
        /// How many it offers.
        count: usize,
    },
    /// A tool's spec breaks a rule.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A JavaScript tool, and the host has no JS runtime.
    #[error(
        "JavaScript tools need the JS runtime: start the host with one (HostConfig::js_runtime, `--js-runtime`; `scripts/build-js-runtime` builds it)"
    )]
    NoJsRuntime,
    #[error("the JavaScript source is {size} bytes; the limit is {MAX_JS_SOURCE_BYTES}")]
    /// The JavaScript source is over the limit.
    JsTooLarge {
        /// Its size in bytes.
        size: usize,
    },
    /// The module does not compile or run, or has no usable `spec` export.
    #[error("the JavaScript source: {0}")]
    JsSource(String),
    /// Installing runs the component's code, so it passes the same gates as a call.
    #[error("not admitted: {message}")]
    Admission {
        /// The policy field whose limit was hit.
        limit: &'static str,
        /// The limit, in words.
        message: String,
    },
    /// The tenant's kept versions, and the code it let go of not yet collected, would hold
    /// more than its quota.
    #[error(
        "the tenant's tools would hold {used} bytes of code (every kept version's component or \
         source, and those of versions and tools let go of in the last seconds, until they are \
         collected); its quota is {quota} (code_quota_bytes): remove tools or old versions, or \
         retry in a few seconds"
    )]
    CodeQuota {
        /// Bytes the kept versions would hold with this install, and the released ones.
        used: u64,
        /// The quota.
        quota: u64,
    },
    /// The tenant's tools' specs would be over [`MAX_SPEC_BYTES_PER_TENANT`].
    #[error(
        "the tenant's tools' specs would hold {0} bytes of JSON; a tenant's hold at most \
         {MAX_SPEC_BYTES_PER_TENANT} together: remove tools, or make their schemas smaller"
    )]
    SpecsTooLarge(u64),
    /// The name is a native tool's.
    #[error("tool `{0}`: the name belongs to a native tool of this host")]
    NativeName(String),
    /// The name is a bridge's.
    #[error("tool `{0}`: the name is reserved for the host's tool-search bridges")]
    ReservedName(String),
    #[error("tool `{name}`: differs only in case from the existing tool `{existing}`")]
    /// The name differs only in case from another tool of the tenant.
    CaseConflict {
        /// The new name.
        name: String,
        /// The existing tool's name.
        existing: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why managing tools, tenants, keys or configuration failed.
#[derive(Debug, thiserror::Error)]
pub enum ManageError {
    /// No tool of that name.
    #[error("no tool named `{0}`")]
    NotFound(String),
    #[error("tool `{name}` has no version {version}; it has {available:?}")]
    /// The tool has no such version.
    NoSuchVersion {
        /// The tool.
        name: String,
        /// The version asked for.
        version: u32,
        /// The versions kept.
        available: Vec<u32>,
    },
    /// Rollback asked of a tool's first version.
    #[error("tool `{0}` has no earlier version to roll back to")]
    NoEarlierVersion(String),
    /// The tenant id is not valid.
    #[error("tenant `{0}` is not a valid tenant id (1 to 128 printable characters)")]
    Tenant(String),
    /// The tenant does not exist.
    #[error("no tenant `{0}`: create it first")]
    NoTenant(String),
    /// The OS could not supply randomness for a key.
    #[error("no randomness available: {0}")]
    Random(String),
    /// The configuration key is not valid.
    #[error("config key `{0}` must match ^[A-Za-z0-9_.-]{{1,128}}$")]
    ConfigKey(String),
    /// The configuration value is too large.
    #[error("config value is {0} bytes; the limit is {MAX_CONFIG_VALUE_BYTES}")]
    ConfigValue(usize),
    /// The tenant has as many configuration keys as it may.
    #[error(
        "the tenant has {MAX_CONFIG_KEYS} config keys, as many as it may: remove one to add `{0}`"
    )]
    TooManyConfigKeys(String),
    /// The rollback would put the tenant's tools' specs over [`MAX_SPEC_BYTES_PER_TENANT`].
    #[error(
        "with that version current the tenant's tools' specs would hold {0} bytes of JSON; a \
         tenant's hold at most {MAX_SPEC_BYTES_PER_TENANT} together"
    )]
    SpecsTooLarge(u64),
    /// A spec breaks a rule.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The policy breaks a rule.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
