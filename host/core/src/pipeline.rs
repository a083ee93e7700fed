//! One call, from a name and JSON to a clipped, typed outcome: resolve, policy, admission,
//! argument validation, hooks, approval, result cache, execution (again after a timeout for
//! an idempotent tool), clipping, caching, and one recorded event. A guest's nested
//! `call-tool` re-enters here, one level deeper, within what its caller has left.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use serde_json::Value;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use toolhost_sandbox::{Helpers, NestedCall, NestedReply};
use toolhost_spec::call::{CallContext, CallError, CallOutcome, Caller};
use toolhost_spec::clip::clip;
use toolhost_spec::keypath::{self, KeyPath};
use toolhost_spec::policy::{Decision, TenantPolicy};
use toolhost_spec::spec::Limits;
use toolhost_spec::strict;
use toolhost_store::{SourceKind, Store, now_ms};

use crate::admission::{Admission, NotEntered, Permit, Shares};
use crate::approval::{ApprovalError, Approvals, PendingCall};
use crate::catalog::{Catalog, Resolved};
use crate::checks::{self, Against};
use crate::config::MAX_NESTING_DEPTH;
use crate::error::InstallError;
use crate::exec::{self, Executors, MAX_ERROR_CHARS, MAX_RESULT_BYTES, truncate};
use crate::history::{CallRecord, History, kept};
use crate::hooks::{CallHook, HookCall};
use crate::metrics::Metrics;
use crate::tenants::Tenants;

/// What a call may spend: its depth of nesting, and for a nested call what its caller has
/// left, which narrows the callee's own limits. An approved call has spent its approval.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    depth: u32,
    deadline: Option<Instant>,
    fuel: Option<u64>,
    approved: bool,
}

impl Budget {
    pub const TOP: Budget = Budget {
        depth: 0,
        deadline: None,
        fuel: None,
        approved: false,
    };

    fn narrow(&self, limits: &Limits) -> Limits {
        let mut narrowed = *limits;
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            narrowed.timeout_ms = narrowed.timeout_ms.min(left.as_millis() as u64).max(1);
        }
        if let Some(fuel) = self.fuel {
            narrowed.fuel = narrowed.fuel.min(fuel).max(1);
        }
        narrowed
    }
}

pub(crate) struct Pipeline {
    pub catalog: Arc<Catalog>,
    pub tenants: Arc<Tenants>,
    pub exec: Executors,
    pub store: Arc<dyn Store>,
    pub admission: Admission,
    pub shares: Shares,
    pub hooks: RwLock<Vec<Arc<dyn CallHook>>>,
    pub approvals: Arc<Approvals>,
    pub metrics: Arc<Metrics>,
    pub history: History,
    pub call_ids: CallIds,
    /// This node's name in the leases of the durable calls it runs.
    pub node: String,
    /// Wakes this node's durable-call workers (a call was submitted) and readers (one ended).
    pub durable_wakes: crate::sync::DurableWakes,
}

impl Pipeline {
    /// Runs a held call with its approval spent; it passes every other step again.
    pub async fn approve(&self, tenant: &str, call_id: &str) -> Result<CallOutcome, ApprovalError> {
        let pending = self.approvals.take(tenant, call_id).await?;
        let approved = Budget {
            approved: true,
            ..Budget::TOP
        };
        let (caller, tool) = (&pending.caller, &pending.tool);
        Ok(self
            .call(caller, tool, pending.args, Some(call_id), approved, None)
            .await)
    }

    pub async fn reject(
        &self,
        tenant: &str,
        call_id: &str,
        reason: &str,
    ) -> Result<CallOutcome, ApprovalError> {
        let pending = self.approvals.take(tenant, call_id).await?;
        let mut outcome = CallOutcome::new(call_id.to_owned(), pending.tool);
        outcome.result = Err(CallError::Rejected {
            reason: truncate(reason, MAX_ERROR_CHARS),
        });
        self.record(tenant, None, Some(kept(&pending.args)), &outcome);
        Ok(outcome)
    }

    pub fn pending_approvals(&self, tenant: &str) -> Vec<PendingCall> {
        self.approvals.list(tenant)
    }

    pub fn add_hook(&self, hook: Arc<dyn CallHook>) {
        self.hooks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(hook);
    }

    pub async fn call(
        &self,
        caller: &Caller,
        name: &str,
        args: Value,
        call_id: Option<&str>,
        budget: Budget,
        cancel: Option<&CancellationToken>,
    ) -> CallOutcome {
        let started = Instant::now();
        let ctx = CallContext {
            tenant: caller.tenant.clone(),
            call_id: call_id.map_or_else(|| self.call_ids.next(), str::to_owned),
            tool: name.to_owned(),
            data: caller.data.clone(),
        };
        let resolved = self.catalog.resolve(&caller.tenant, name);
        let config_keys = resolved.as_ref().map_or(&[][..], |r| &r.spec().config[..]);
        let policy = self.tenants.policy(&ctx.tenant).await;
        let helpers = Helpers::for_call(
            self.store.clone(),
            &ctx.tenant,
            name,
            config_keys,
            policy.data_quota(),
        );
        let mut outcome = CallOutcome::new(ctx.call_id.clone(), ctx.tool.clone());
        // Only calls of tools that exist are kept, so made-up names cannot grow the history.
        let mut kept_args = None;
        if let Some(tool) = &resolved {
            kept_args = self.history.enabled().then(|| kept(&args));
            let run = (budget, cancel, &*policy);
            self.admit_and_run(tool, args, &helpers, &ctx, run, &mut outcome)
                .await;
        }
        outcome.log = helpers.snapshot();
        outcome.duration = started.elapsed();
        let version = resolved.as_ref().map(Resolved::version);
        self.record(&ctx.tenant, version, kept_args, &outcome);
        outcome
    }

    /// One structured event and the metrics, for every outcome; and the tenant's call
    /// history, for a call of a tool that exists (`kept_args`).
    fn record(
        &self,
        tenant: &str,
        version: Option<u32>,
        kept_args: Option<Value>,
        outcome: &CallOutcome,
    ) {
        if let Some(args) = kept_args {
            // A native tool (version 0) has no versions.
            let kept_version = version.filter(|&v| v > 0);
            let record = CallRecord::of(outcome, args, now_ms(), kept_version);
            self.history.record(tenant, record);
        }
        self.metrics
            .record_call(outcome.code(), outcome.duration, outcome.retries);
        // Every field always present (0 when it does not apply), so queries need no cases. The
        // name is the caller's, also when no tool has it: only its start is logged.
        tracing::info!(
            tenant,
            tool = truncate(&outcome.tool, 128),
            version = version.unwrap_or(0),
            call_id = outcome.call_id,
            outcome = outcome.code(),
            ms = outcome.duration.as_secs_f64() * 1e3,
            fuel = outcome.fuel_used.unwrap_or(0),
            cache_hit = outcome.cache_hit,
            retries = outcome.retries,
            clipped = outcome.clipped.is_some(),
            "call"
        );
    }

    /// The preflight steps, in order: policy, rate and concurrency, arguments, hooks,
    /// approval; then the call itself, and the hooks that see its outcome.
    async fn admit_and_run(
        &self,
        tool: &Resolved,
        args: Value,
        helpers: &Helpers,
        ctx: &CallContext,
        (budget, cancel, policy): (Budget, Option<&CancellationToken>, &TenantPolicy),
        outcome: &mut CallOutcome,
    ) {
        let spec = tool.spec();
        let needs_approval = match policy.decide(&spec.name, spec.needs_approval) {
            Decision::Denied(reason) => {
                outcome.result = Err(CallError::Denied { reason });
                return;
            }
            Decision::NeedsApproval => !budget.approved,
            Decision::Run => false,
        };
        let _permit = match self.admission.admit(&ctx.tenant, policy) {
            Ok(permit) => permit,
            Err(refused) => {
                outcome.result = Err(CallError::RateLimited {
                    limit: refused.limit,
                    message: refused.message,
                    retry_after_ms: refused.retry_after_ms,
                });
                return;
            }
        };
        let mut args = args;
        if spec.strict {
            strict::nulls_as_absent(&spec.parameters, &mut args);
        }
        if let Err(error) = tool.schemas() {
            tracing::error!(tenant = ctx.tenant, %error, "stored spec no longer compiles");
            let message = format!("the stored spec no longer compiles: {error}");
            outcome.result = Err(CallError::Internal { message });
            return;
        }
        // The call's timeout counts from here: its check, its wait for a place, its run.
        let checked_at = Instant::now();
        let limits = budget.narrow(&spec.limits);
        let within = (checked_at + limits.timeout(), limits.timeout_ms);
        // A direct call waiting for a place to check its arguments is one of its tenant's
        // waiting calls, as one waiting for its share; a nested call runs in its caller's.
        let weight = policy.share_weight.unwrap_or(1);
        let waiting = |args: &Value| {
            if budget.depth > 0 {
                return Ok(None);
            }
            let held = toolhost_spec::clip::held_bytes(args) as u64;
            let waiting = self.shares.wait_elsewhere(&ctx.tenant, weight, held);
            waiting.map(Some).map_err(share_refused)
        };
        let checked = checks::check(&ctx.tenant, tool, Against::Args, &mut args, within, waiting);
        match checked.await {
            Ok(Ok(())) => {}
            Ok(Err(errors)) => {
                outcome.result = Err(CallError::InvalidArgs { errors });
                return;
            }
            Err(error) => {
                outcome.result = Err(error);
                return;
            }
        }
        let hooks = self.hooks.read().unwrap_or_else(|p| p.into_inner()).clone();
        let hook_call = HookCall {
            tenant: &ctx.tenant,
            tool: &spec.name,
            version: tool.version(),
            call_id: &ctx.call_id,
            args: &args,
            data: &ctx.data,
        };
        let refusal = hooks.iter().find_map(|hook| hook.before(&hook_call).err());
        if let Some(reason) = refusal {
            outcome.result = Err(CallError::Denied {
                reason: truncate(&reason, MAX_ERROR_CHARS),
            });
        } else if needs_approval {
            outcome.result = Err(self.hold(ctx, &spec.name, args.clone()).await);
        } else {
            let run = async {
                if let Some((first, _place)) = self
                    .enter_share(
                        (tool, &args),
                        ctx,
                        (policy.share_weight, checked_at),
                        budget,
                        outcome,
                    )
                    .await
                {
                    // `_place` holds the call tree's place in its tenant's share until the
                    // run ends.
                    let call = (helpers, ctx, policy);
                    self.run(tool, args.clone(), call, (first, budget), outcome)
                        .await;
                }
            };
            // Cancelled, the run is dropped where it is: its instance with it.
            let cancelled = match cancel {
                Some(cancel) => tokio::select! {
                    () = run => false,
                    () = cancel.cancelled() => true,
                },
                None => {
                    run.await;
                    false
                }
            };
            if cancelled {
                outcome.result = Err(CallError::Cancelled);
            }
        }
        for hook in &hooks {
            hook.after(&hook_call, outcome);
        }
    }

    /// A direct call waits for a place in its tenant's share, within its timeout; a nested
    /// call runs in its caller's. The budget of the first attempt (its timeout counts the
    /// wait), or `None` with the outcome set to `timeout`.
    async fn enter_share(
        &self,
        (tool, args): (&Resolved, &Value),
        ctx: &CallContext,
        (weight, since): (Option<u32>, Instant),
        budget: Budget,
        outcome: &mut CallOutcome,
    ) -> Option<(Budget, Option<OwnedSemaphorePermit>)> {
        if budget.depth > 0 {
            return Some((budget, None));
        }
        let limits = &tool.spec().limits;
        let queued = Instant::now();
        let deadline = since + limits.timeout();
        let weight = weight.unwrap_or(1);
        let held = || toolhost_spec::clip::held_bytes(args) as u64;
        let entered = (self
            .shares
            .enter_holding(&ctx.tenant, weight, deadline, held))
        .await;
        outcome.queued = queued.elapsed();
        let place = match entered {
            Ok(place) => place,
            Err(NotEntered::Timeout) => {
                outcome.result = Err(CallError::Timeout {
                    limit_ms: limits.timeout_ms,
                });
                return None;
            }
            Err(refused) => {
                outcome.result = Err(share_refused(refused));
                return None;
            }
        };
        let first = Budget {
            deadline: Some(deadline),
            ..budget
        };
        Some((first, Some(place)))
    }

    /// An install runs guest code (`list-tools`, or a JS module's evaluation): it passes the
    /// tenant's rate and concurrency limits and waits for a place in its share, as a call.
    pub async fn admit_install(
        &self,
        tenant: &str,
    ) -> Result<(Permit, OwnedSemaphorePermit), InstallError> {
        let policy = self.tenants.policy(tenant).await;
        let permit =
            self.admission
                .admit(tenant, &policy)
                .map_err(|refused| InstallError::Admission {
                    limit: refused.limit,
                    message: refused.message,
                })?;
        let deadline = Instant::now() + Limits::default().timeout();
        let place = self
            .shares
            .enter(tenant, policy.share_weight.unwrap_or(1), deadline)
            .await
            .map_err(|refused| InstallError::Admission {
                limit: "tenant_share",
                message: not_entered(refused),
            })?;
        Ok((permit, place))
    }

    /// Holds a call for approval: the error the caller gets now.
    async fn hold(&self, ctx: &CallContext, tool: &str, args: Value) -> CallError {
        let caller = Caller {
            tenant: ctx.tenant.clone(),
            data: ctx.data.clone(),
        };
        match self.approvals.hold(&ctx.call_id, &caller, tool, args).await {
            Ok(()) => CallError::ApprovalRequired {
                call_id: ctx.call_id.clone(),
            },
            Err(ApprovalError::Store(error)) => CallError::StorageUnavailable {
                message: format!("could not hold the call for approval: {error}"),
            },
            Err(error @ (ApprovalError::ArgsTooLarge(_) | ApprovalError::TooDeep(_))) => {
                CallError::InvalidArgs {
                    errors: vec![toolhost_spec::schema::ArgError {
                        path: String::new(),
                        message: error.to_string(),
                    }],
                }
            }
            Err(error) => CallError::RateLimited {
                limit: "pending approvals",
                message: error.to_string(),
                retry_after_ms: None,
            },
        }
    }

    /// Cache, execute (again after a timeout, for an idempotent tool), clip, cache.
    async fn run(
        &self,
        tool: &Resolved,
        args: Value,
        (helpers, ctx, policy): (&Helpers, &CallContext, &TenantPolicy),
        // The first attempt's budget (its timeout counts the queueing), then the call's.
        (first, budget): (Budget, Budget),
        outcome: &mut CallOutcome,
    ) {
        let spec = tool.spec();
        let cache_key = spec.cache.as_ref().map(|cache| {
            // The spec was validated, so its key path parses.
            let path = KeyPath::parse(&cache.key_path);
            let selected = path
                .as_ref()
                .map_or(&Value::Null, |path| path.select(&args));
            keypath::key(
                &ctx.tenant,
                &spec.name,
                tool.version(),
                tool.content(),
                selected,
            )
        });
        if let Some(key) = &cache_key {
            match self.store.cache_get(&ctx.tenant, key, now_ms()).await {
                Ok(Some(value)) => {
                    outcome.result = Ok(value);
                    outcome.cache_hit = true;
                    return;
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "result cache unreadable; running the tool"),
            }
        }
        let retries = if spec.idempotent {
            spec.retry_count_on_stall
        } else {
            0
        };
        let mut result = Err(CallError::Timeout { limit_ms: 0 });
        // The last attempt's: the result's check counts against it too.
        let mut deadline = Instant::now();
        for attempt in 0..=retries {
            outcome.retries = attempt;
            // Narrowed again on each attempt: a nested call stays within its caller's time,
            // and a first attempt within what queueing left of its timeout.
            let limits = if attempt == 0 { first } else { budget }.narrow(&spec.limits);
            deadline = Instant::now() + limits.timeout();
            // A timeout names the limit the call had, not what queueing left of it.
            let limit_ms = budget.narrow(&spec.limits).timeout_ms;
            result = match tool {
                Resolved::Native(native) => {
                    let (args, helpers) = (args.clone(), helpers.clone());
                    exec::run_native(native, &limits, args, helpers, ctx.clone()).await
                }
                Resolved::Tenant(http) if http.version.kind == SourceKind::Http => {
                    self.exec.run_http(http, &limits, &args, helpers).await
                }
                Resolved::Tenant(wasm) => {
                    let serve = |nested| self.serve_nested(ctx, budget, nested);
                    let call = (helpers, ctx, policy);
                    let run = self.exec.run_wasm(wasm, &limits, &args, call, serve);
                    let (result, fuel) = run.await;
                    if let Some(fuel) = fuel {
                        *outcome.fuel_used.get_or_insert(0) += fuel;
                    }
                    result
                }
            };
            match &mut result {
                Err(CallError::Timeout { limit_ms: named }) => *named = limit_ms,
                _ => break,
            }
        }
        if let Ok(value) = &mut result {
            let within = (deadline, budget.narrow(&spec.limits).timeout_ms);
            // The call holds its place: its result's check waits in it.
            let in_place = |_: &Value| Ok(());
            match checks::check(&ctx.tenant, tool, Against::Output, value, within, in_place).await {
                Ok(Ok(())) => {}
                Ok(Err(errors)) => {
                    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
                    result = Err(CallError::InvalidOutput {
                        reason: format!(
                            "the result does not meet its output_schema: {}",
                            errors.join("; ")
                        ),
                    });
                }
                Err(error) => result = Err(error),
            }
        }
        outcome.result = match result {
            Ok(value) => {
                let (value, clipped) = clip(value, spec.limits.max_result_chars as usize);
                outcome.clipped = clipped;
                if let (Some(key), Some(cache)) = (&cache_key, &spec.cache) {
                    let expires_at_ms = now_ms() + cache.ttl_ms;
                    let quota = policy.data_quota();
                    let stored = self
                        .store
                        .cache_put(&ctx.tenant, key, expires_at_ms, &value, quota)
                        .await;
                    if let Err(error) = stored {
                        tracing::warn!(%error, "result not cached");
                    }
                }
                Ok(value)
            }
            Err(error) => Err(exec::redact_error(error, helpers)),
        };
    }

    /// Answers a guest's `call-tool` with the whole pipeline, one level deeper.
    async fn serve_nested(&self, parent: &CallContext, budget: Budget, nested: NestedCall) {
        let reply = self.call_nested(parent, budget, &nested).await;
        // The guest may have ended meanwhile: nobody to answer.
        let _ = nested.reply.send(reply);
    }

    /// Boxed: the pipeline calls itself through here.
    fn call_nested<'a>(
        &'a self,
        parent: &'a CallContext,
        budget: Budget,
        nested: &'a NestedCall,
    ) -> Pin<Box<dyn Future<Output = NestedReply> + Send + 'a>> {
        Box::pin(async move {
            let refuse = |message: String| NestedReply {
                result: Err(message),
                fuel_used: 0,
            };
            if budget.depth >= MAX_NESTING_DEPTH {
                return refuse(format!(
                    "denied: calls nest at most {MAX_NESTING_DEPTH} deep"
                ));
            }
            // Parsed JSON takes many times its text: bounded as a result is, which is often
            // what one tool passes another.
            if nested.args.len() > MAX_RESULT_BYTES {
                return refuse(format!(
                    "invalid_args: the arguments are {} bytes of text; a nested call's over \
                     {MAX_RESULT_BYTES} bytes are refused unread",
                    nested.args.len()
                ));
            }
            let Ok(args) = serde_json::from_str::<Value>(&nested.args) else {
                return refuse("invalid_args: the arguments are not JSON".into());
            };
            let caller = Caller {
                tenant: parent.tenant.clone(),
                data: parent.data.clone(),
            };
            let inner = Budget {
                depth: budget.depth + 1,
                deadline: Some(nested.deadline),
                fuel: Some(nested.fuel),
                approved: false,
            };
            // A cancelled parent drops this call with it.
            let outcome = self
                .call(&caller, &nested.tool, args, None, inner, None)
                .await;
            NestedReply {
                result: match outcome.result {
                    Ok(value) => Ok(value.to_string()),
                    Err(error) => Err(format!("{}: {error}", error.code())),
                },
                fuel_used: outcome.fuel_used.unwrap_or(0),
            }
        })
    }
}

/// Unique call ids: a random per-process prefix and a counter.
pub(crate) struct CallIds {
    prefix: u64,
    next: AtomicU64,
    /// Keys the permutation that hides the counter: every tenant's calls take one, so
    /// consecutive ids would tell a tenant how many calls the others made in between.
    key: RandomState,
}

impl Default for CallIds {
    fn default() -> Self {
        CallIds {
            prefix: RandomState::new().hash_one(now_ms()),
            next: AtomicU64::new(1),
            key: RandomState::new(),
        }
    }
}

impl CallIds {
    /// The random part of this process's call ids: its name as a node.
    pub fn node(&self) -> String {
        format!("{:016x}", self.prefix)
    }

    /// A new id: the node, and the next count put through a keyed permutation (unique, as
    /// the count is, and in no order a caller can read).
    pub fn next(&self) -> String {
        let count = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}-{:016x}", self.prefix, self.permuted(count))
    }

    /// A four-round Feistel network over the count's two halves, each round keyed by
    /// `key`: a bijection of u64, so distinct counts give distinct ids.
    fn permuted(&self, count: u64) -> u64 {
        let (mut left, mut right) = ((count >> 32) as u32, count as u32);
        for round in 0..4u32 {
            let mixed = self.key.hash_one((round, right)) as u32;
            (left, right) = (right, left ^ mixed);
        }
        (u64::from(left) << 32) | u64::from(right)
    }
}

/// A call refused a place in its tenant's share, or in its queue
/// ([`crate::admission::QUEUED_PER_PLACE`], [`crate::admission::MAX_WAITING_BYTES_PER_TENANT`]).
fn share_refused(refused: NotEntered) -> CallError {
    CallError::RateLimited {
        limit: "tenant_share",
        message: not_entered(refused),
        retry_after_ms: None,
    }
}

/// Why a call got no place in its tenant's share of the host.
fn not_entered(refused: NotEntered) -> String {
    match refused {
        NotEntered::QueueFull(waiting) => {
            format!("the tenant already has {waiting} calls waiting for its share of the host")
        }
        NotEntered::QueueBytesFull(bytes) => format!(
            "the tenant's calls waiting for its share of the host already hold {bytes} bytes of arguments in memory"
        ),
        NotEntered::Timeout => {
            "the tenant's share of the host stayed busy for the whole timeout".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Call ids are unique, yet tell a tenant nothing of how many calls came between its own.
    #[test]
    fn call_ids_are_unique_and_out_of_order() {
        let ids = CallIds::default();
        let taken: Vec<String> = (0..10_000).map(|_| ids.next()).collect();
        let distinct: std::collections::HashSet<&String> = taken.iter().collect();
        assert_eq!(distinct.len(), taken.len());
        let ascending = taken.windows(2).filter(|pair| pair[0] < pair[1]).count();
        assert!(
            (3_000..7_000).contains(&ascending),
            "{ascending} of 9 999 in order"
        );
        assert!(taken.iter().all(|id| id.starts_with(&ids.node())));
    }
}
