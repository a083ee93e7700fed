//! What a tenant may call and how often: allow and deny lists, approval lists, rates,
//! concurrency and grants, as data.
//!
//! [`TenantPolicy::decide`] is a pure function of the policy and the tool, so the rules are
//! tested without a host; the host's admission gate keeps the per-tenant counters.

use std::collections::BTreeMap;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A tenant's rules. Tool patterns are exact names, or a prefix followed by `*`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantPolicy {
    /// When set, only these tools may be called.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    /// Never callable, even when allowed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    /// Calls wait for approval, as if the tool declared `needs_approval`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub needs_approval: Vec<String>,
    /// Calls per minute, with bursts of up to `burst` (default: the per-minute figure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls_per_minute: Option<u32>,
    /// Calls allowed at once above the steady rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Calls running at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    /// What tools may reach beyond the sandbox, by tool pattern. A tool gets the grants of
    /// every pattern it matches; without one it has no network and no filesystem.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub grants: BTreeMap<String, Grants>,
    /// The tenant's share of the host in multiples of the default share (the host's
    /// `tenant_share` call trees running at once): 1 to [`MAX_SHARE_WEIGHT`]. Default 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_weight: Option<u32>,
    /// Bytes the tenant's granted directories may hold. Checked when a call starts: a tenant
    /// at or over it gets its directories read-only. Default [`DEFAULT_FILES_QUOTA_BYTES`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files_quota_bytes: Option<u64>,
    /// Bytes of data the tenant's tools keep in the store: KV keys and values, and cached
    /// results. A KV write past it fails (the tool gets an error naming it); a result past it
    /// is not cached. Default [`DEFAULT_DATA_QUOTA_BYTES`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_quota_bytes: Option<u64>,
    /// Bytes of code the tenant's kept tool versions hold: components, JS source and HTTP
    /// definitions, each distinct one counted once. An install past it is refused. Default
    /// [`DEFAULT_CODE_QUOTA_BYTES`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code_quota_bytes: Option<u64>,
}

/// The largest `share_weight`.
pub const MAX_SHARE_WEIGHT: u32 = 8;

/// The tenant's files quota when its policy sets none.
pub const DEFAULT_FILES_QUOTA_BYTES: u64 = 100 << 20;
/// The tenant's data quota (KV and cached results) when its policy sets none.
pub const DEFAULT_DATA_QUOTA_BYTES: u64 = 256 << 20;
/// The tenant's code quota (kept versions' components and sources) when its policy sets none.
pub const DEFAULT_CODE_QUOTA_BYTES: u64 = 1 << 30;

impl TenantPolicy {
    /// `files_quota_bytes`, or its default.
    pub fn files_quota(&self) -> u64 {
        self.files_quota_bytes.unwrap_or(DEFAULT_FILES_QUOTA_BYTES)
    }

    /// `data_quota_bytes`, or its default.
    pub fn data_quota(&self) -> u64 {
        self.data_quota_bytes.unwrap_or(DEFAULT_DATA_QUOTA_BYTES)
    }

    /// `code_quota_bytes`, or its default.
    pub fn code_quota(&self) -> u64 {
        self.code_quota_bytes.unwrap_or(DEFAULT_CODE_QUOTA_BYTES)
    }
}

/// What a tenant keeps on disk against each of its quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskUsage {
    /// Its granted directories (`files_quota_bytes`).
    pub files: Usage,
    /// Its tools' KV data and cached results (`data_quota_bytes`).
    pub data: Usage,
    /// Its kept versions' code (`code_quota_bytes`).
    pub code: Usage,
}

/// Bytes held, and the quota they count against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Bytes held now.
    pub used_bytes: u64,
    /// The quota.
    pub quota_bytes: u64,
}

impl Usage {
    /// `used_bytes` of `quota_bytes`.
    pub fn new(used_bytes: u64, quota_bytes: u64) -> Self {
        Usage {
            used_bytes,
            quota_bytes,
        }
    }
}

/// Capabilities granted to a tool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Grants {
    /// Where `wasi:http` requests may go: `[scheme://]host[:port]`. The scheme defaults to
    /// https and the port to the scheme's; `*.example.com` matches its subdomains and `:*`
    /// any port. A name never reaches a non-public address unless the operator allows it
    /// (`egress.allow_private`); an IP literal granted here is allowed even if non-public.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub network: Vec<NetworkRule>,
    /// Directories of the tenant's files the tool may open.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub filesystem: Vec<DirGrant>,
    /// Lets one instance of the tool serve several of this tenant's calls of it, instead of
    /// a fresh instance for each: what a call leaves in the instance's memory, the next one
    /// sees. Never across tenants or tools, never for a tool with `filesystem` or `network`
    /// grants. Applies if any grant matching the tool sets it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reuse: Option<Reuse>,
}

/// How long one instance may serve calls (see [`Grants::reuse`]). It is dropped after a
/// fault of any kind (a trap, a timeout, fuel or memory running out) as well.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reuse {
    /// Calls one instance serves, 1 to [`MAX_REUSE_CALLS`].
    pub max_calls: u32,
    /// Milliseconds from an instance's first call to its last, 1 to [`MAX_REUSE_AGE_MS`].
    pub max_age_ms: u64,
}

/// The most calls [`Reuse::max_calls`] allows.
pub const MAX_REUSE_CALLS: u32 = 100_000;
/// The longest [`Reuse::max_age_ms`] allows: ten minutes.
pub const MAX_REUSE_AGE_MS: u64 = 600_000;

/// A directory of the tenant's files, mapped into the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirGrant {
    /// Relative to the tenant's files root: plain names only, no `..`.
    pub dir: String,
    /// Where the guest sees it: an absolute path such as `/data`.
    pub guest: String,
    /// Whether the guest may write there (default: read only).
    #[serde(default)]
    pub write: bool,
}

/// One allowed destination, parsed from `[scheme://]host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkRule {
    /// `https` or `http`.
    pub scheme: String,
    /// Lower case; a leading `*.` matches any subdomain.
    pub host: String,
    /// `None`: any port.
    pub port: Option<u16>,
}

impl FromStr for NetworkRule {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("`{text}`: {why}");
        let (scheme, rest) = match text.split_once("://") {
            Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
            None => ("https".to_owned(), text),
        };
        let default_port = match scheme.as_str() {
            "https" => 443,
            "http" => 80,
            _ => return Err(bad("the scheme must be http or https")),
        };
        let (host, port) = match rest.strip_prefix('[') {
            Some(bracketed) => {
                let (inside, after) = bracketed
                    .split_once(']')
                    .ok_or_else(|| bad("missing `]`"))?;
                (&rest[..inside.len() + 2], after.strip_prefix(':'))
            }
            None if rest.matches(':').count() == 1 => {
                let (host, port) = rest.split_once(':').expect("one colon");
                (host, Some(port))
            }
            None => (rest, None),
        };
        let port = match port {
            None => Some(default_port),
            Some("*") => None,
            Some(p) => Some(
                p.parse::<u16>()
                    .map_err(|_| bad("the port must be 0 to 65535 or *"))?,
            ),
        };
        let host = host.to_ascii_lowercase();
        let name = host.strip_prefix("*.").unwrap_or(&host);
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        let valid_name = !name.is_empty()
            && name.split('.').all(|l| {
                !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if bare.parse::<std::net::IpAddr>().is_err() && !valid_name {
            return Err(bad(
                "the host must be a name, `*.` and a name, or an IP address",
            ));
        }
        Ok(NetworkRule { scheme, host, port })
    }
}

impl std::fmt::Display for NetworkRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}://{}:{port}", self.scheme, self.host),
            None => write!(f, "{}://{}:*", self.scheme, self.host),
        }
    }
}

impl Serialize for NetworkRule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NetworkRule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl NetworkRule {
    /// Whether a request to `scheme://host:port` is allowed by this rule.
    pub fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        let host = host.to_ascii_lowercase();
        let host_matches = match self.host.strip_prefix("*.") {
            Some(domain) => host
                .strip_suffix(domain)
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            None => host == self.host,
        };
        scheme.eq_ignore_ascii_case(&self.scheme)
            && host_matches
            && self.port.is_none_or(|p| p == port)
    }

    /// The address this rule names, if its host is an IP literal: granting it is explicit.
    pub fn ip(&self) -> Option<std::net::IpAddr> {
        self.host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .ok()
    }
}

impl TenantPolicy {
    /// Every grant whose pattern matches `tool`, merged.
    pub fn grants_for(&self, tool: &str) -> Grants {
        let mut merged = Grants::default();
        for (pattern, grants) in &self.grants {
            if matches_any(std::slice::from_ref(pattern), tool) {
                merged.network.extend(grants.network.iter().cloned());
                merged.filesystem.extend(grants.filesystem.iter().cloned());
                // Reuse applies if any matching grant sets it; with several, the smallest
                // count and age.
                merged.reuse = match (merged.reuse, grants.reuse) {
                    (Some(a), Some(b)) => Some(Reuse {
                        max_calls: a.max_calls.min(b.max_calls),
                        max_age_ms: a.max_age_ms.min(b.max_age_ms),
                    }),
                    (a, b) => a.or(b),
                };
            }
        }
        merged
    }
}

/// Whether `dir` is a plain relative path (`reports`, `a/b`) that stays under its root.
pub fn is_plain_relative(dir: &str) -> bool {
    !dir.is_empty()
        && std::path::Path::new(dir)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// The most patterns a list may hold; each is a tool name or a name prefix and `*`.
pub const MAX_PATTERNS: usize = 1024;

/// A policy that breaks a rule: names the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy: {field}: {rule}")]
pub struct PolicyError {
    /// The policy field at fault.
    pub field: &'static str,
    /// What it must be.
    pub rule: String,
}

/// What the policy says about one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The call may run.
    Run,
    /// The call waits for an approver.
    NeedsApproval,
    /// The call is refused, for this reason.
    Denied(String),
}

impl TenantPolicy {
    /// Checks every field against its rule.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let lists = [
            ("allow", self.allow.as_deref().unwrap_or_default()),
            ("deny", &self.deny[..]),
            ("needs_approval", &self.needs_approval[..]),
        ];
        for (field, list) in lists {
            if list.len() > MAX_PATTERNS {
                let rule = format!("at most {MAX_PATTERNS} patterns, got {}", list.len());
                return Err(PolicyError { field, rule });
            }
            if let Some(bad) = list.iter().find(|p| !is_valid_pattern(p)) {
                let bad: String = bad.chars().take(80).collect();
                let rule = format!("`{bad}` is not a tool name or a name prefix followed by `*`");
                return Err(PolicyError { field, rule });
            }
        }
        for (pattern, grants) in &self.grants {
            if !is_valid_pattern(pattern) {
                let rule =
                    format!("`{pattern}` is not a tool name or a name prefix followed by `*`");
                return Err(PolicyError {
                    field: "grants",
                    rule,
                });
            }
            if let Some(reuse) = grants.reuse {
                if !(1..=MAX_REUSE_CALLS).contains(&reuse.max_calls) {
                    let rule = format!("must be 1 to {MAX_REUSE_CALLS}");
                    let field = "grants.reuse.max_calls";
                    return Err(PolicyError { field, rule });
                }
                if !(1..=MAX_REUSE_AGE_MS).contains(&reuse.max_age_ms) {
                    let rule = format!("must be 1 to {MAX_REUSE_AGE_MS}");
                    let field = "grants.reuse.max_age_ms";
                    return Err(PolicyError { field, rule });
                }
            }
            for dir in &grants.filesystem {
                if !is_plain_relative(&dir.dir) {
                    let rule = format!("`{}` must be a relative path without `..`", dir.dir);
                    return Err(PolicyError {
                        field: "grants.filesystem.dir",
                        rule,
                    });
                }
                if !dir.guest.starts_with('/') || dir.guest.split('/').any(|c| c == "..") {
                    let rule = format!("`{}` must be an absolute path without `..`", dir.guest);
                    return Err(PolicyError {
                        field: "grants.filesystem.guest",
                        rule,
                    });
                }
            }
        }
        for (field, value) in [
            ("calls_per_minute", self.calls_per_minute),
            ("burst", self.burst),
            ("max_concurrent", self.max_concurrent),
        ] {
            if value == Some(0) {
                let rule = "must be at least 1 (leave it out for no limit)".to_owned();
                return Err(PolicyError { field, rule });
            }
        }
        if let Some(weight) = self.share_weight
            && !(1..=MAX_SHARE_WEIGHT).contains(&weight)
        {
            return Err(PolicyError {
                field: "share_weight",
                rule: format!("must be 1 to {MAX_SHARE_WEIGHT}, got {weight}"),
            });
        }
        Ok(())
    }

    /// Whether a call of `tool` (which declares `needs_approval` or not) may run.
    pub fn decide(&self, tool: &str, declared_needs_approval: bool) -> Decision {
        if let Some(allow) = &self.allow
            && !matches_any(allow, tool)
        {
            return Decision::Denied(format!("tool `{tool}` is not in this tenant's allow list"));
        }
        if matches_any(&self.deny, tool) {
            return Decision::Denied(format!("tool `{tool}` is in this tenant's deny list"));
        }
        if declared_needs_approval || matches_any(&self.needs_approval, tool) {
            return Decision::NeedsApproval;
        }
        Decision::Run
    }
}

fn is_valid_pattern(pattern: &str) -> bool {
    let name = pattern.strip_suffix('*').unwrap_or(pattern);
    (name.is_empty() && pattern == "*") || crate::spec::is_valid_name(name)
}

fn matches_any(patterns: &[String], tool: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => tool.starts_with(prefix),
        None => p == tool,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(json: serde_json::Value) -> TenantPolicy {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn allow_deny_and_approval_lists_decide() {
        let p = policy(serde_json::json!({
            "allow": ["weather_*", "convert"],
            "deny": ["weather_admin"],
            "needs_approval": ["weather_alerts"]
        }));
        assert_eq!(p.decide("weather_now", false), Decision::Run);
        assert_eq!(p.decide("convert", false), Decision::Run);
        assert_eq!(p.decide("convert", true), Decision::NeedsApproval);
        assert_eq!(p.decide("weather_alerts", false), Decision::NeedsApproval);
        assert!(
            matches!(p.decide("weather_admin", false), Decision::Denied(m) if m.contains("deny list"))
        );
        assert!(
            matches!(p.decide("converter", false), Decision::Denied(m) if m.contains("allow list"))
        );
        assert_eq!(
            TenantPolicy::default().decide("anything", false),
            Decision::Run
        );
    }

    #[test]
    fn bad_policies_name_the_field() {
        let bad = |json| policy(json).validate().unwrap_err().field;
        assert_eq!(bad(serde_json::json!({"deny": ["a b"]})), "deny");
        assert_eq!(bad(serde_json::json!({"allow": ["x*y"]})), "allow");
        assert_eq!(
            bad(serde_json::json!({"max_concurrent": 0})),
            "max_concurrent"
        );
        assert_eq!(bad(serde_json::json!({"share_weight": 9})), "share_weight");
        assert!(
            policy(serde_json::json!({"deny": ["*"]}))
                .validate()
                .is_ok()
        );
        assert!(serde_json::from_value::<TenantPolicy>(serde_json::json!({"alow": []})).is_err());
    }

    #[test]
    fn network_rules_parse_and_match_scheme_host_and_port() {
        let rule = |t: &str| t.parse::<NetworkRule>().unwrap();
        let api = rule("api.example.com");
        assert!(api.allows("https", "API.example.com", 443));
        assert!(!api.allows("http", "api.example.com", 80));
        assert!(!api.allows("https", "api.example.com", 8443));
        assert!(!api.allows("https", "evil-api.example.com", 443));
        let wild = rule("*.example.org");
        assert!(wild.allows("https", "a.b.example.org", 443));
        assert!(!wild.allows("https", "example.org", 443));
        assert!(!wild.allows("https", "badexample.org", 443));
        let local = rule("http://127.0.0.1:8080");
        assert!(local.allows("http", "127.0.0.1", 8080));
        assert_eq!(local.ip(), Some("127.0.0.1".parse().unwrap()));
        assert!(rule("http://localhost:*").allows("http", "localhost", 1234));
        assert!(rule("http://[::1]:81").allows("http", "[::1]", 81));
        for bad in ["ftp://a.com", "a.com:99999", "", "a..com", "http://a b"] {
            assert!(bad.parse::<NetworkRule>().is_err(), "{bad}");
        }
        assert_eq!(rule("a.com").to_string(), "https://a.com:443");
    }

    #[test]
    fn grants_merge_by_pattern_and_directories_stay_relative() {
        let p = policy(serde_json::json!({"grants": {
            "fetch*": {"network": ["api.example.com"]},
            "fetch_files": {"filesystem": [{"dir": "reports", "guest": "/data"}]}
        }}));
        p.validate().unwrap();
        let g = p.grants_for("fetch_files");
        assert_eq!((g.network.len(), g.filesystem.len()), (1, 1));
        assert_eq!(p.grants_for("other"), Grants::default());
        for (dir, guest, field) in [
            ("../x", "/d", "grants.filesystem.dir"),
            ("/etc", "/d", "grants.filesystem.dir"),
            ("a/../../b", "/d", "grants.filesystem.dir"),
            ("ok", "relative", "grants.filesystem.guest"),
        ] {
            let bad = policy(serde_json::json!({"grants": {"t": {"filesystem": [
                {"dir": dir, "guest": guest}
            ]}}}));
            assert_eq!(bad.validate().unwrap_err().field, field, "{dir} {guest}");
        }
    }
}
