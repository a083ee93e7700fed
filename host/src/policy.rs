//! What a tenant may call and how often: allow and deny lists, approval lists, and the rate
//! and concurrency gates every call passes before it runs.
//!
//! [`TenantPolicy::decide`] is a pure function of the policy and the tool, so the rules are
//! tested without a host; [`Admission`] holds the per-tenant counters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Calls running at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
}

/// The most patterns a list may hold; each is a tool name or a name prefix and `*`.
pub const MAX_PATTERNS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy: {field}: {rule}")]
pub struct PolicyError {
    pub field: &'static str,
    pub rule: String,
}

/// What the policy says about one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Run,
    NeedsApproval,
    Denied(String),
}

impl TenantPolicy {
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

/// Why a call was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The policy field at fault.
    pub limit: &'static str,
    pub message: String,
    /// When a retry can succeed; `None` for the concurrency limit.
    pub retry_after_ms: Option<u64>,
}

/// Per-tenant rate buckets and running-call counts.
#[derive(Default)]
pub struct Admission {
    buckets: Mutex<HashMap<String, Bucket>>,
    running: Mutex<HashMap<String, Arc<AtomicU32>>>,
}

struct Bucket {
    tokens: f64,
    refilled: Instant,
}

/// Holds one call's concurrency slot; dropping it frees the slot.
pub struct Permit(Option<Arc<AtomicU32>>);

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(running) = &self.0 {
            running.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Admission {
    /// Takes a token and a slot for one call of `tenant`, or says which limit refused it.
    pub fn admit(&self, tenant: &str, policy: &TenantPolicy) -> Result<Permit, Refused> {
        if let Some(per_minute) = policy.calls_per_minute {
            self.take_token(tenant, per_minute, policy.burst.unwrap_or(per_minute))?;
        }
        let Some(max) = policy.max_concurrent else {
            return Ok(Permit(None));
        };
        let running = {
            let mut all = self.running.lock().unwrap_or_else(|p| p.into_inner());
            all.entry(tenant.to_owned()).or_default().clone()
        };
        let taken = running.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        });
        match taken {
            Ok(_) => Ok(Permit(Some(running))),
            Err(_) => Err(Refused {
                limit: "max_concurrent",
                message: format!("tenant already has {max} calls running (max_concurrent)"),
                retry_after_ms: None,
            }),
        }
    }

    fn take_token(&self, tenant: &str, per_minute: u32, burst: u32) -> Result<(), Refused> {
        let now = Instant::now();
        let per_ms = f64::from(per_minute) / 60_000.0;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(tenant.to_owned()).or_insert(Bucket {
            tokens: f64::from(burst),
            refilled: now,
        });
        let elapsed_ms = now.duration_since(bucket.refilled).as_secs_f64() * 1e3;
        bucket.tokens = (bucket.tokens + elapsed_ms * per_ms).min(f64::from(burst));
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait_ms = ((1.0 - bucket.tokens) / per_ms).ceil() as u64;
        Err(Refused {
            limit: "calls_per_minute",
            message: format!(
                "tenant is over its rate of {per_minute} calls per minute (calls_per_minute); retry in {wait_ms} ms"
            ),
            retry_after_ms: Some(wait_ms),
        })
    }
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
        assert!(
            policy(serde_json::json!({"deny": ["*"]}))
                .validate()
                .is_ok()
        );
        assert!(serde_json::from_value::<TenantPolicy>(serde_json::json!({"alow": []})).is_err());
    }

    #[test]
    fn the_rate_limit_refuses_past_the_burst_and_per_tenant() {
        let admission = Admission::default();
        let p = policy(serde_json::json!({"calls_per_minute": 60, "burst": 3}));
        for _ in 0..3 {
            admission.admit("a", &p).unwrap();
        }
        let refused = admission.admit("a", &p).err().unwrap();
        assert_eq!(refused.limit, "calls_per_minute");
        // One token a second: the wait is at most a second.
        assert!(refused.retry_after_ms.unwrap() <= 1000);
        admission
            .admit("b", &p)
            .expect("another tenant has its own bucket");
    }

    #[test]
    fn the_concurrency_limit_frees_slots_on_drop() {
        let admission = Admission::default();
        let p = policy(serde_json::json!({"max_concurrent": 2}));
        let first = admission.admit("a", &p).unwrap();
        let _second = admission.admit("a", &p).unwrap();
        assert_eq!(
            admission.admit("a", &p).err().unwrap().limit,
            "max_concurrent"
        );
        admission
            .admit("b", &p)
            .expect("another tenant has its own slots");
        drop(first);
        admission.admit("a", &p).expect("a slot was freed");
    }
}
