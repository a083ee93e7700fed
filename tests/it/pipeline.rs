//! The preflight pipeline every call passes, direct or through `tool_call`: tenant policies,
//! the app's hooks, approvals, stall retries, rate and concurrency limits, and the metrics.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolhost::{
    ApprovalError, CallError, CallHook, CallOutcome, Caller, HookCall, Host, HostConfig,
    TenantPolicy, ToolSpec,
};
use toolhost_server::bridges::{Disclosure, DisclosureConfig, TOOL_CALL};

fn object() -> Value {
    json!({"type": "object", "properties": {"n": {"type": "integer"}}})
}

/// A host with `echo` (returns its args) and a counter of how often it ran.
async fn host_with_echo() -> (Arc<Host>, Arc<AtomicU32>) {
    let host = Arc::new(Host::open(crate::plugins::config()).await.unwrap());
    let runs = Arc::new(AtomicU32::new(0));
    let counter = runs.clone();
    host.natives()
        .register(
            ToolSpec::new("echo", "Returns its arguments.", object()),
            move |args, _, _| {
                counter.fetch_add(1, Ordering::SeqCst);
                async move { Ok(args) }
            },
        )
        .unwrap();
    (host, runs)
}

async fn call(host: &Host, tenant: &str, tool: &str, args: Value) -> CallOutcome {
    host.call(&Caller::tenant(tenant), tool, args).await
}

fn policy(json: Value) -> TenantPolicy {
    serde_json::from_value(json).unwrap()
}

#[tokio::test]
async fn a_call_waiting_for_approval_survives_a_restart_and_is_decided_once() {
    let dir = tempfile::tempdir().unwrap();
    // The embedding app registers its tools at every start; the held calls come from the store.
    let open = async |runs: Arc<AtomicU32>| {
        let host = Host::open(HostConfig {
            data_dir: Some(dir.path().to_owned()),
            ..crate::plugins::config()
        })
        .await
        .unwrap();
        let mut guarded = ToolSpec::new("wire_money", "Moves money.", object());
        guarded.needs_approval = true;
        host.natives()
            .register(guarded, move |args, _, _| {
                runs.fetch_add(1, Ordering::SeqCst);
                async move { Ok(json!({"wired": args["n"]})) }
            })
            .unwrap();
        host
    };
    let runs = Arc::new(AtomicU32::new(0));
    let (approve_id, reject_id) = {
        let host = open(runs.clone()).await;
        let first = call(&host, "acme", "wire_money", json!({"n": 100})).await;
        let second = call(&host, "acme", "wire_money", json!({"n": 7})).await;
        assert_eq!(first.code(), "approval_required");
        (first.call_id, second.call_id)
    };

    let host = open(runs.clone()).await;
    let mut pending: Vec<(String, Value)> = host
        .pending_approvals("acme")
        .into_iter()
        .map(|p| (p.call_id, p.args))
        .collect();
    pending.sort_by(|a, b| a.0.cmp(&b.0));
    let mut expected = vec![
        (approve_id.clone(), json!({"n": 100})),
        (reject_id.clone(), json!({"n": 7})),
    ];
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(pending, expected);
    assert!(host.pending_approvals("globex").is_empty());
    let approved = host.approve("acme", &approve_id).await.unwrap();
    assert_eq!(approved.result, Ok(json!({"wired": 100})));
    host.reject("acme", &reject_id, "no").await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    drop(host);

    // Decided before the restart: neither can be decided again after it.
    let host = open(runs.clone()).await;
    assert!(host.pending_approvals("acme").is_empty());
    assert!(host.approve("acme", &approve_id).await.is_err());
    assert!(host.approve("acme", &reject_id).await.is_err());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn allow_and_deny_lists_apply_per_tenant_and_persist() {
    let dir = tempfile::tempdir().unwrap();
    let config = || HostConfig {
        data_dir: Some(dir.path().to_owned()),
        ..crate::plugins::config()
    };
    {
        let host = Host::open(config()).await.unwrap();
        host.set_policy("acme", policy(json!({"deny": ["ec*"]})))
            .await
            .unwrap();
    }
    let host = Host::open(config()).await.unwrap();
    host.natives()
        .register(ToolSpec::new("echo", "Echo.", object()), |a, _, _| async {
            Ok(a)
        })
        .unwrap();
    let denied = call(&host, "acme", "echo", json!({})).await;
    assert!(
        matches!(&denied.result, Err(CallError::Denied { reason }) if reason.contains("deny list")),
        "{:?}",
        denied.result
    );
    assert_eq!(
        call(&host, "globex", "echo", json!({})).await.result,
        Ok(json!({}))
    );

    host.set_policy("globex", policy(json!({"allow": ["other"]})))
        .await
        .unwrap();
    let denied = call(&host, "globex", "echo", json!({})).await;
    assert!(
        matches!(&denied.result, Err(CallError::Denied { reason }) if reason.contains("allow list"))
    );

    let bad = host
        .set_policy("acme", policy(json!({"deny": ["no spaces"]})))
        .await;
    assert!(bad.unwrap_err().to_string().contains("deny"));
    assert_eq!(*host.policy("acme").await, policy(json!({"deny": ["ec*"]})));
}

#[tokio::test]
async fn hooks_see_valid_calls_and_can_refuse_them() {
    #[derive(Default)]
    struct Audit {
        seen: Mutex<Vec<String>>,
    }
    impl CallHook for Audit {
        fn before(&self, call: &HookCall<'_>) -> Result<(), String> {
            self.seen
                .lock()
                .unwrap()
                .push(format!("before {}", call.args));
            if call.args["n"] == 13 {
                return Err("13 is unlucky".into());
            }
            Ok(())
        }
        fn after(&self, call: &HookCall<'_>, outcome: &CallOutcome) {
            let line = format!("after {} {}", call.args, outcome.code());
            self.seen.lock().unwrap().push(line);
        }
    }
    let (host, runs) = host_with_echo().await;
    let audit = Arc::new(Audit::default());
    host.add_hook(audit.clone());

    assert!(
        call(&host, "acme", "echo", json!({"n": 1}))
            .await
            .result
            .is_ok()
    );
    let refused = call(&host, "acme", "echo", json!({"n": 13})).await;
    assert_eq!(
        refused.result,
        Err(CallError::Denied {
            reason: "13 is unlucky".into()
        })
    );
    // Arguments that fail the schema never reach the hooks.
    let invalid = call(&host, "acme", "echo", json!({"n": "x"})).await;
    assert_eq!(invalid.code(), "invalid_args");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        *audit.seen.lock().unwrap(),
        [
            r#"before {"n":1}"#,
            r#"after {"n":1} ok"#,
            r#"before {"n":13}"#,
            r#"after {"n":13} denied"#,
        ]
    );
}

#[tokio::test]
async fn a_call_that_needs_approval_runs_only_once_approved() {
    let (host, runs) = host_with_echo().await;
    let mut guarded = ToolSpec::new("wire_money", "Moves money.", object());
    guarded.needs_approval = true;
    let wired = Arc::new(AtomicU32::new(0));
    let counter = wired.clone();
    host.natives()
        .register(guarded, move |args, _, _| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move { Ok(json!({"wired": args["n"]})) }
        })
        .unwrap();

    let waiting = call(&host, "acme", "wire_money", json!({"n": 100})).await;
    let Err(CallError::ApprovalRequired { call_id }) = &waiting.result else {
        panic!("expected approval_required, got {:?}", waiting.result);
    };
    assert_eq!(call_id, &waiting.call_id);
    assert_eq!(
        wired.load(Ordering::SeqCst),
        0,
        "nothing ran before approval"
    );
    let pending = host.pending_approvals("acme");
    assert_eq!(pending.len(), 1);
    assert_eq!(
        (&pending[0].tool, &pending[0].args),
        (&"wire_money".to_owned(), &json!({"n": 100}))
    );
    assert!(host.pending_approvals("globex").is_empty());

    // Another tenant cannot decide it, and cannot tell it exists.
    let foreign = host.approve("globex", call_id).await.unwrap_err();
    assert!(
        matches!(&foreign, ApprovalError::NotPending(id) if id == call_id),
        "{foreign:?}"
    );

    // Held calls stay in memory and in the store for an hour: their arguments are bounded.
    let huge = call(
        &host,
        "acme",
        "wire_money",
        json!({"memo": "m".repeat(70_000)}),
    )
    .await;
    assert_eq!(huge.code(), "invalid_args", "{:?}", huge.result);
    let refusal = huge.result.unwrap_err().to_string();
    assert!(refusal.contains("65536 bytes"), "{refusal}");
    assert_eq!(host.pending_approvals("acme").len(), 1, "not held");

    let approved = host.approve("acme", call_id).await.unwrap();
    assert_eq!(approved.result, Ok(json!({"wired": 100})));
    assert_eq!(&approved.call_id, call_id);
    assert_eq!(wired.load(Ordering::SeqCst), 1);
    assert!(host.approve("acme", call_id).await.is_err(), "decided once");

    // Rejected: never runs. The tenant's policy can require approval of any tool.
    host.set_policy("acme", policy(json!({"needs_approval": ["echo"]})))
        .await
        .unwrap();
    let waiting = call(&host, "acme", "echo", json!({"n": 1})).await;
    assert_eq!(waiting.code(), "approval_required");
    let rejected = host
        .reject("acme", &waiting.call_id, "not today")
        .await
        .unwrap();
    assert_eq!(
        rejected.result,
        Err(CallError::Rejected {
            reason: "not today".into()
        })
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(host.pending_approvals("acme").is_empty());
}

#[tokio::test]
async fn only_idempotent_tools_are_retried_after_a_stall() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    // Stalls on its first `stalls` attempts, then answers.
    let register = |name: &str, idempotent: bool, retries: u32, stalls: u32| {
        let mut spec = ToolSpec::new(name, "Flaky.", object());
        spec.limits.timeout_ms = 30;
        spec.idempotent = idempotent;
        spec.retry_count_on_stall = retries;
        let attempts = Arc::new(AtomicU32::new(0));
        let counter = attempts.clone();
        host.natives()
            .register(spec, move |_, _, _| {
                let attempt = counter.fetch_add(1, Ordering::SeqCst);
                async move {
                    if attempt < stalls {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                    Ok(json!(attempt))
                }
            })
            .unwrap();
        attempts
    };
    let recovers = register("recovers", true, 2, 2);
    let gives_up = register("gives_up", true, 1, 5);
    let not_idempotent = register("not_idempotent", false, 0, 1);

    let out = call(&host, "acme", "recovers", json!({})).await;
    assert_eq!((out.result, out.retries), (Ok(json!(2)), 2));
    assert_eq!(recovers.load(Ordering::SeqCst), 3);

    let out = call(&host, "acme", "gives_up", json!({})).await;
    assert_eq!(out.result, Err(CallError::Timeout { limit_ms: 30 }));
    assert_eq!((out.retries, gives_up.load(Ordering::SeqCst)), (1, 2));

    let out = call(&host, "acme", "not_idempotent", json!({})).await;
    assert_eq!((out.code(), out.retries), ("timeout", 0));
    assert_eq!(not_idempotent.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_tenant_over_its_rate_is_refused_and_others_are_not() {
    let (host, runs) = host_with_echo().await;
    host.set_policy("acme", policy(json!({"calls_per_minute": 60, "burst": 2})))
        .await
        .unwrap();
    for _ in 0..2 {
        assert!(call(&host, "acme", "echo", json!({})).await.result.is_ok());
    }
    let refused = call(&host, "acme", "echo", json!({})).await;
    let Err(CallError::RateLimited {
        limit,
        retry_after_ms,
        ..
    }) = refused.result
    else {
        panic!("expected rate_limited, got {:?}", refused.result);
    };
    assert_eq!(limit, "calls_per_minute");
    assert!(retry_after_ms.is_some_and(|ms| (1..=1000).contains(&ms)));
    for _ in 0..5 {
        assert!(
            call(&host, "globex", "echo", json!({}))
                .await
                .result
                .is_ok()
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 7);
}

#[tokio::test]
async fn a_tenant_at_its_concurrency_limit_is_refused_until_a_call_ends() {
    let host = Arc::new(Host::open(crate::plugins::config()).await.unwrap());
    let release = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let (r, s) = (release.clone(), started.clone());
    host.natives()
        .register(ToolSpec::new("hold", "Waits.", object()), move |_, _, _| {
            let (release, started) = (r.clone(), s.clone());
            async move {
                started.notify_one();
                release.notified().await;
                Ok(json!("done"))
            }
        })
        .unwrap();
    host.set_policy("acme", policy(json!({"max_concurrent": 1})))
        .await
        .unwrap();

    let first = tokio::spawn({
        let host = host.clone();
        async move { call(&host, "acme", "hold", json!({})).await }
    });
    started.notified().await;
    let refused = call(&host, "acme", "hold", json!({})).await;
    assert!(
        matches!(
            &refused.result,
            Err(CallError::RateLimited {
                limit: "max_concurrent",
                ..
            })
        ),
        "{:?}",
        refused.result
    );
    // Another tenant is not held back by acme's running call.
    let other = tokio::spawn({
        let host = host.clone();
        async move { call(&host, "globex", "hold", json!({})).await }
    });
    started.notified().await;
    release.notify_one();
    release.notify_one();
    assert_eq!(first.await.unwrap().result, Ok(json!("done")));
    assert_eq!(other.await.unwrap().result, Ok(json!("done")));

    let again = tokio::spawn({
        let host = host.clone();
        async move { call(&host, "acme", "hold", json!({})).await }
    });
    started.notified().await;
    release.notify_one();
    assert_eq!(again.await.unwrap().result, Ok(json!("done")));
}

#[tokio::test]
async fn tool_call_passes_the_same_preflight() {
    let (host, runs) = host_with_echo().await;
    host.set_policy("acme", policy(json!({"deny": ["echo"]})))
        .await
        .unwrap();
    let disclosure = Disclosure::new(host.clone(), DisclosureConfig::default());
    let bridged = disclosure
        .call(
            &Caller::tenant("acme"),
            TOOL_CALL,
            json!({"name": "echo", "arguments": {}}),
        )
        .await;
    assert!(
        matches!(&bridged, Err(CallError::Denied { .. })),
        "{bridged:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn metrics_count_outcomes_instances_and_compile_cache_hits() {
    let (host, _) = host_with_echo().await;
    host.install("acme", crate::plugins::plugin("text_stats"))
        .await
        .unwrap();
    call(&host, "acme", "echo", json!({})).await;
    call(&host, "acme", "echo", json!({"n": "bad"})).await;
    for _ in 0..2 {
        let out = call(&host, "acme", "text_stats", json!({"text": "a b"})).await;
        assert!(out.result.is_ok(), "{:?}", out.result);
    }
    let text = host.metrics().render();
    let value = |series: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value(r#"toolhost_calls_total{outcome="ok"}"#), 3.0);
    assert_eq!(
        value(r#"toolhost_calls_total{outcome="invalid_args"}"#),
        1.0
    );
    assert_eq!(value("toolhost_call_duration_seconds_count"), 4.0);
    assert_eq!(value("toolhost_instances_live"), 0.0);
    // Install compiled it and linked it: both calls found it in memory.
    assert_eq!(
        value(r#"toolhost_component_loads_total{source="memory"}"#),
        2.0
    );
}

// ---- nested calls: the `call-tool` helper ----

async fn probe_host() -> Arc<Host> {
    let host = Arc::new(Host::open(crate::plugins::config()).await.unwrap());
    host.install("acme", crate::plugins::plugin("probe"))
        .await
        .unwrap();
    host.install("globex", crate::plugins::plugin("text_stats"))
        .await
        .unwrap();
    host
}

/// What `probe`'s `call_tool` answers for `acme` when it calls `name` with `arguments`.
async fn nested_call(host: &Host, name: &str, arguments: Value) -> Result<Value, CallError> {
    let args = json!({"name": name, "arguments": arguments});
    call(host, "acme", "call_tool", args).await.result
}

/// The error a nested call reported to its caller.
async fn nested_error(host: &Host, name: &str, arguments: Value) -> String {
    let value = nested_call(host, name, arguments).await.unwrap();
    value["error"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_guest_calls_another_tool_of_its_tenant_through_the_pipeline() {
    let host = probe_host().await;
    let out = nested_call(&host, "count", json!({"key": "k"})).await;
    assert_eq!(out, Ok(json!({"ok": 1})));
    // Another tenant's tool does not exist from here; bad arguments are caught by the schema.
    let error = nested_error(&host, "text_stats", json!({"text": "a"})).await;
    assert!(error.starts_with("not_found: "), "{error}");
    let error = nested_error(&host, "count", json!({"key": 5})).await;
    assert!(error.starts_with("invalid_args: "), "{error}");
    // The tenant's policy applies to nested calls too.
    host.set_policy("acme", policy(json!({"deny": ["count"]})))
        .await
        .unwrap();
    let error = nested_error(&host, "count", json!({"key": "k"})).await;
    assert!(error.starts_with("denied: "), "{error}");
}

/// Parsed JSON takes many times its text: a guest's arguments for another tool are bounded
/// as its result is, and refused unread past that.
#[tokio::test]
async fn a_nested_calls_arguments_past_the_result_bound_are_refused_unread() {
    let host = probe_host().await;
    let over = "k".repeat(toolhost::MAX_RESULT_BYTES);
    let error = nested_error(&host, "count", json!({ "key": over })).await;
    assert!(
        error.starts_with("invalid_args: ") && error.contains("refused unread"),
        "{error}"
    );
}

#[tokio::test]
async fn nested_calls_stop_at_the_depth_limit() {
    let host = probe_host().await;
    let out = call(&host, "acme", "recurse", json!({"depth": 0})).await;
    let value = out.result.unwrap();
    assert_eq!(value["deepest"], toolhost::MAX_NESTING_DEPTH);
    assert!(
        value["error"]
            .as_str()
            .unwrap()
            .contains("nest at most 4 deep"),
        "{value}"
    );
}

#[tokio::test]
async fn a_nested_call_runs_within_its_callers_time_and_fuel() {
    let host = probe_host().await;
    let busy = json!({"name": "busy", "arguments": {"ms": 10_000}});

    // The caller has 500 ms; the callee's own limit is 30 s. Both end at the caller's.
    let started = std::time::Instant::now();
    let out = call(&host, "acme", "call_tool_short", busy.clone()).await;
    // Generous: the callee alone would run 10 s (its own limit 30 s).
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    // The caller may still answer (with the callee's timeout) or run out of time itself.
    match &out.result {
        Ok(value) => {
            let error = value["error"].as_str().unwrap();
            let limit: u64 = error
                .strip_prefix("timeout: timed out after ")
                .and_then(|rest| rest.split(' ').next())
                .and_then(|ms| ms.parse().ok())
                .unwrap_or_else(|| panic!("{error}"));
            assert!(limit <= 500, "{error}");
        }
        Err(CallError::Timeout { limit_ms: 500 }) => {}
        other => panic!("{other:?}"),
    }

    // The caller has 100 M fuel: the callee may not burn more, and what it burns is the
    // caller's, which leaves the caller itself without fuel.
    let out = call(&host, "acme", "call_tool_lean", busy).await;
    assert_eq!(out.code(), "out_of_fuel", "{:?}", out.result);
    assert!(out.fuel_used.unwrap() <= 100_000_000);
}

/// Every call leaves one `call` event with the fields an operator filters on.
#[tokio::test]
async fn every_call_emits_one_structured_event() {
    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Default, Clone)]
    struct Events(Arc<Mutex<Vec<std::collections::BTreeMap<String, String>>>>);
    struct Fields<'a>(&'a mut std::collections::BTreeMap<String, String>);
    impl tracing::field::Visit for Fields<'_> {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.insert(field.name().to_owned(), format!("{value:?}"));
        }
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Events {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut fields = std::collections::BTreeMap::new();
            event.record(&mut Fields(&mut fields));
            if fields.get("message").map(String::as_str) == Some("call") {
                self.0.lock().unwrap().push(fields);
            }
        }
    }

    let events = Events::default();
    let subscriber = tracing_subscriber::registry().with(events.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    let (host, _) = host_with_echo().await;
    call(&host, "acme", "echo", json!({"n": 1})).await;
    call(&host, "acme", "nope", json!({})).await;

    let events = events.0.lock().unwrap();
    assert_eq!(events.len(), 2, "{events:?}");
    let first = &events[0];
    for field in [
        "tenant",
        "tool",
        "version",
        "call_id",
        "outcome",
        "ms",
        "fuel",
        "cache_hit",
        "retries",
    ] {
        assert!(first.contains_key(field), "no {field} in {first:?}");
    }
    assert_eq!(first["tenant"], "\"acme\"");
    assert_eq!(first["outcome"], "\"ok\"");
    assert_eq!(events[1]["outcome"], "\"not_found\"");
}

/// On a host of its own (redb), a durable call runs on this host and its outcome is kept; a
/// call the host left running when it stopped is taken up by its next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_call_runs_on_one_node_and_one_left_running_is_taken_up_at_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = || HostConfig {
        data_dir: Some(dir.path().to_owned()),
        durable: toolhost::DurableConfig {
            workers: 2,
            lease: Duration::from_millis(300),
        },
        ..crate::plugins::config()
    };
    let acme = Caller::tenant("acme");
    let left_running;
    {
        let host = Host::open(config()).await.unwrap();
        host.install("acme", crate::plugins::plugin("probe"))
            .await
            .unwrap();
        let missing = host.submit(&acme, "nothing", json!({})).await;
        assert!(
            matches!(missing, Err(CallError::NotFound { .. })),
            "{missing:?}"
        );
        let huge = json!({"ms": 1, "pad": "p".repeat(70_000)});
        let refused = host.submit(&acme, "nap", huge).await;
        assert!(
            matches!(&refused, Err(CallError::InvalidArgs { errors })
                if errors[0].message.contains("at most 65536 bytes")),
            "{refused:?}"
        );
        let heavy = acme.clone().with_data(json!({"pad": "p".repeat(70_000)}));
        let refused = host.submit(&heavy, "nap", json!({"ms": 1})).await;
        assert!(
            matches!(&refused, Err(CallError::InvalidArgs { errors })
                if errors[0].message.contains("caller data are at most 65536 bytes")),
            "{refused:?}"
        );
        // Deeper than the store reads back: refused, not queued to head every claim.
        let mut deep = json!(null);
        for _ in 0..100 {
            deep = json!([deep]);
        }
        let deep = acme.clone().with_data(deep);
        let refused = host.submit(&deep, "nap", json!({"ms": 1})).await;
        assert!(
            matches!(&refused, Err(CallError::InvalidArgs { errors })
                if errors[0].message.contains("nest at most 64 levels")),
            "{refused:?}"
        );
        let id = host.submit(&acme, "nap", json!({"ms": 10})).await.unwrap();
        let wait = Duration::from_secs(10);
        let done = host.durable_call("acme", &id, wait).await.unwrap().unwrap();
        assert_eq!(done.status, "done");
        assert_eq!(done.outcome.unwrap()["result"], "rested");
        assert_eq!(
            host.durable_call("globex", &id, wait).await.unwrap(),
            None,
            "its own tenant's only"
        );
        left_running = host
            .submit(&acme, "nap_idempotent", json!({"ms": 1500}))
            .await
            .unwrap();
        let started = host.durable_call("acme", &left_running, Duration::from_millis(200));
        assert_eq!(started.await.unwrap().unwrap().status, "running");
        // Stopped mid-call without a grace, as by a crash: the call is left to its lease.
        assert!(!host.drain(Duration::ZERO).await);
    }
    // The stopped call's instance is dropped on a blocking thread, which lets go of the data
    // directory a moment after the host.
    let mut reopened = Host::open(config()).await;
    for _ in 0..100 {
        if !matches!(
            reopened,
            Err(toolhost::OpenError::Store(
                toolhost::StoreError::Locked { .. }
            ))
        ) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        reopened = Host::open(config()).await;
    }
    let host = reopened.unwrap();
    let status = host
        .durable_call("acme", &left_running, Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.status, "done", "{status:?}");
    assert_eq!(
        status.attempts, 2,
        "run again by the next start: {status:?}"
    );
}

/// A read that waits for a durable call holds one of its tenant's few places: past them a
/// read answers at once, and another tenant's reads still wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_reads_waiting_on_durable_calls_are_bounded() {
    // Names of their own: the places are the process's, and other tests wait too.
    let (acme, globex) = ("waits-acme", "waits-globex");
    let no_workers = toolhost::DurableConfig {
        workers: 0,
        ..Default::default()
    };
    let host = Host::open(HostConfig {
        durable: no_workers,
        ..crate::plugins::config()
    })
    .await
    .unwrap();
    let host = Arc::new(host);
    let mut queued = Vec::new();
    for tenant in [acme, globex] {
        host.install(tenant, crate::plugins::plugin("probe"))
            .await
            .unwrap();
        let caller = Caller::tenant(tenant);
        queued.push(host.submit(&caller, "nap", json!({"ms": 1})).await.unwrap());
    }
    let read = |tenant: &'static str, id: &str, wait: Duration| {
        let (host, id) = (host.clone(), id.to_owned());
        async move {
            let start = Instant::now();
            let status = host.durable_call(tenant, &id, wait).await.unwrap().unwrap();
            assert_eq!(status.status, "queued", "no worker runs it");
            start.elapsed()
        }
    };
    let waiting: Vec<_> = (0..toolhost::MAX_DURABLE_WAITS_PER_TENANT)
        .map(|_| tokio::spawn(read(acme, &queued[0], Duration::from_secs(30))))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(waiting.iter().all(|read| !read.is_finished()));
    let at_once = read(acme, &queued[0], Duration::from_secs(30)).await;
    assert!(
        at_once < Duration::from_secs(5),
        "answered at once: {at_once:?}"
    );
    let waited = read(globex, &queued[1], Duration::from_millis(500)).await;
    assert!(
        waited >= Duration::from_millis(500),
        "globex waited: {waited:?}"
    );
    for read in waiting {
        read.abort();
    }
}

/// The worst tenant fills its queue of durable calls; it is refused past the cap, naming the
/// limit, and another tenant's calls are still queued and run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_flooding_durable_calls_is_capped_and_another_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let config = |workers| HostConfig {
        data_dir: Some(dir.path().to_owned()),
        durable: toolhost::DurableConfig {
            workers,
            ..Default::default()
        },
        ..crate::plugins::config()
    };
    let (acme, globex) = (Caller::tenant("acme"), Caller::tenant("globex"));
    {
        // No workers: every call stays queued.
        let host = Host::open(config(0)).await.unwrap();
        for tenant in ["acme", "globex"] {
            host.install(tenant, crate::plugins::plugin("probe"))
                .await
                .unwrap();
        }
        for _ in 0..toolhost::MAX_UNENDED_PER_TENANT {
            host.submit(&acme, "nap", json!({"ms": 1})).await.unwrap();
        }
        let refused = host.submit(&acme, "nap", json!({"ms": 1})).await;
        assert!(
            matches!(
                refused,
                Err(CallError::RateLimited {
                    limit: "durable calls",
                    ..
                })
            ),
            "{refused:?}"
        );
        let huge = json!({"ms": 1, "pad": "x".repeat(70_000)});
        let refused = host.submit(&globex, "nap", huge).await;
        assert!(
            matches!(refused, Err(CallError::InvalidArgs { .. })),
            "{refused:?}"
        );
        host.submit(&globex, "nap", json!({"ms": 1})).await.unwrap();
    }
    // With workers, globex's call runs before acme's thousand older ones are done.
    let host = Host::open(config(2)).await.unwrap();
    let id = host.submit(&globex, "nap", json!({"ms": 1})).await.unwrap();
    let done = host
        .durable_call("globex", &id, Duration::from_secs(20))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, "done", "{done:?}");
}

/// A configuration write and a durable submit each count the tenant's keys or calls and then
/// write: concurrent ones all passed one count, past the bound. Each tenant's now go one at a
/// time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_stay_within_the_tenants_bounds() {
    let config = HostConfig {
        durable: toolhost::DurableConfig {
            workers: 0,
            ..Default::default()
        },
        ..crate::plugins::config()
    };
    let host = Arc::new(Host::open(config).await.unwrap());
    host.install("acme", crate::plugins::plugin("probe"))
        .await
        .unwrap();
    let writes = toolhost::MAX_CONFIG_KEYS + 64;
    let set: Vec<_> = (0..writes)
        .map(|n| {
            let host = host.clone();
            tokio::spawn(async move { host.set_config("acme", &format!("K{n}"), "v", false).await })
        })
        .collect();
    let mut set_ok = 0;
    for write in set {
        set_ok += write.await.unwrap().is_ok() as usize;
    }
    assert_eq!(set_ok, toolhost::MAX_CONFIG_KEYS);
    assert_eq!(
        host.config("acme").await.unwrap().len(),
        toolhost::MAX_CONFIG_KEYS
    );

    let submits = toolhost::MAX_UNENDED_PER_TENANT + 64;
    let submitted: Vec<_> = (0..submits)
        .map(|_| {
            let host = host.clone();
            tokio::spawn(async move {
                let args = json!({"ms": 1});
                host.submit(&Caller::tenant("acme"), "nap", args).await
            })
        })
        .collect();
    let mut queued = 0;
    for submit in submitted {
        queued += submit.await.unwrap().is_ok() as usize;
    }
    assert_eq!(queued, toolhost::MAX_UNENDED_PER_TENANT);
}
