//! Calls waiting for the embedding app to approve or reject them.
//!
//! Held in memory: a restart drops pending calls, and their callers must ask again. Each
//! tenant holds at most [`MAX_PENDING_PER_TENANT`], each for at most [`PENDING_TTL`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::call::Caller;

pub const MAX_PENDING_PER_TENANT: usize = 1000;
pub const PENDING_TTL: Duration = Duration::from_secs(3600);

/// A call waiting for a decision, as the app sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingCall {
    pub call_id: String,
    pub tool: String,
    pub args: Value,
    /// Milliseconds it has waited.
    pub waiting_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    /// Unknown, expired, already decided, or another tenant's: all look the same.
    #[error("no call `{0}` is waiting for approval")]
    NotPending(String),
    #[error("tenant already has {MAX_PENDING_PER_TENANT} calls waiting for approval")]
    TooMany,
}

pub(crate) struct Pending {
    pub caller: Caller,
    pub tool: String,
    pub args: Value,
    since: Instant,
}

#[derive(Default)]
pub(crate) struct Approvals {
    /// By call id.
    pending: Mutex<HashMap<String, Pending>>,
}

impl Approvals {
    pub fn hold(
        &self,
        call_id: &str,
        caller: &Caller,
        tool: &str,
        args: Value,
    ) -> Result<(), ApprovalError> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.retain(|_, p| p.since.elapsed() < PENDING_TTL);
        let of_tenant = pending
            .values()
            .filter(|p| p.caller.tenant == caller.tenant)
            .count();
        if of_tenant >= MAX_PENDING_PER_TENANT {
            return Err(ApprovalError::TooMany);
        }
        pending.insert(
            call_id.to_owned(),
            Pending {
                caller: caller.clone(),
                tool: tool.to_owned(),
                args,
                since: Instant::now(),
            },
        );
        Ok(())
    }

    /// Removes the call, so that it is decided at most once.
    pub fn take(&self, tenant: &str, call_id: &str) -> Result<Pending, ApprovalError> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let owned = pending
            .get(call_id)
            .is_some_and(|p| p.caller.tenant == tenant && p.since.elapsed() < PENDING_TTL);
        match owned.then(|| pending.remove(call_id)).flatten() {
            Some(p) => Ok(p),
            None => Err(ApprovalError::NotPending(call_id.to_owned())),
        }
    }

    pub fn list(&self, tenant: &str) -> Vec<PendingCall> {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let mut calls: Vec<PendingCall> = pending
            .iter()
            .filter(|(_, p)| p.caller.tenant == tenant && p.since.elapsed() < PENDING_TTL)
            .map(|(id, p)| PendingCall {
                call_id: id.clone(),
                tool: p.tool.clone(),
                args: p.args.clone(),
                waiting_ms: p.since.elapsed().as_millis() as u64,
            })
            .collect();
        calls.sort_by_key(|c| std::cmp::Reverse(c.waiting_ms));
        calls
    }
}
