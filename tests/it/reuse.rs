//! Opt-in instance reuse (a grant's `reuse`): calls of one tenant's one tool may share an
//! instance; never across tenants or tools, and never after a fault or past the policy's
//! count. The probe's `residue` says how many calls its instance served before.

use serde_json::{Value, json};
use toolhost::{Caller, Host, HostConfig, TenantPolicy};

async fn host() -> Host {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    for tenant in ["acme", "globex"] {
        host.install(tenant, crate::plugins::plugin("probe"))
            .await
            .unwrap();
    }
    host
}

async fn set_policy(host: &Host, tenant: &str, grants: Value) {
    let policy: TenantPolicy = serde_json::from_value(json!({ "grants": grants })).unwrap();
    host.set_policy(tenant, policy).await.unwrap();
}

/// How many calls the instance that ran this one served before it.
async fn earlier_calls(host: &Host, tenant: &str, kib: u64) -> Result<u64, String> {
    let out = host
        .call(&Caller::tenant(tenant), "residue", json!({ "kib": kib }))
        .await;
    let code = out.code().to_owned();
    match out.result {
        Ok(value) => Ok(value["earlier_calls"].as_u64().unwrap()),
        Err(error) => Err(format!("{code}: {error}")),
    }
}

#[tokio::test]
async fn instances_are_fresh_unless_the_policy_opts_in_and_then_serve_only_their_tenant() {
    let host = host().await;
    // By default every call gets a fresh instance.
    for _ in 0..3 {
        assert_eq!(earlier_calls(&host, "acme", 1).await, Ok(0));
    }

    let reuse = json!({"residue": {"reuse": {"max_calls": 3, "max_age_ms": 60000}}});
    set_policy(&host, "acme", reuse.clone()).await;
    let served: Vec<_> = served_before(&host, "acme", 7).await;
    // Three calls an instance, then a new one.
    assert_eq!(served, vec![0, 1, 2, 0, 1, 2, 0]);

    // Another tenant with the same policy never gets acme's instance.
    set_policy(&host, "globex", reuse).await;
    assert_eq!(earlier_calls(&host, "globex", 1).await, Ok(0));
    assert_eq!(earlier_calls(&host, "globex", 1).await, Ok(1));
}

async fn served_before(host: &Host, tenant: &str, calls: usize) -> Vec<u64> {
    let mut served = Vec::new();
    for _ in 0..calls {
        served.push(earlier_calls(host, tenant, 1).await.unwrap());
    }
    served
}

#[tokio::test]
async fn a_fault_ends_the_instance_and_the_next_call_starts_afresh() {
    let host = host().await;
    let reuse = json!({"residue": {"reuse": {"max_calls": 100, "max_age_ms": 60000}}});
    set_policy(&host, "acme", reuse).await;
    assert_eq!(earlier_calls(&host, "acme", 1).await, Ok(0));
    assert_eq!(earlier_calls(&host, "acme", 1).await, Ok(1));
    // 1 GiB of heap is past the default memory cap: the call fails, the instance goes.
    let refused = earlier_calls(&host, "acme", 1 << 20).await.unwrap_err();
    assert!(refused.starts_with("memory_limit"), "{refused}");
    assert_eq!(earlier_calls(&host, "acme", 1).await, Ok(0));
}

#[tokio::test]
async fn a_bad_reuse_policy_is_refused_naming_the_field() {
    let host = host().await;
    for (reuse, field) in [
        (
            json!({"max_calls": 0, "max_age_ms": 1000}),
            "grants.reuse.max_calls",
        ),
        (
            json!({"max_calls": 5, "max_age_ms": 0}),
            "grants.reuse.max_age_ms",
        ),
    ] {
        let policy: TenantPolicy =
            serde_json::from_value(json!({"grants": {"residue": {"reuse": reuse}}})).unwrap();
        let error = host.set_policy("acme", policy).await.unwrap_err();
        assert!(error.to_string().contains(field), "{error}");
    }
}

/// Kept instances hold slots; a call of any tenant that needs one takes it back.
#[tokio::test]
async fn kept_instances_give_their_slots_to_other_calls() {
    let host = Host::open(HostConfig {
        sandbox: toolhost::SandboxConfig {
            max_instances: 2,
            ..Default::default()
        },
        ..crate::plugins::config()
    })
    .await
    .unwrap();
    host.install("acme", crate::plugins::plugin("probe"))
        .await
        .unwrap();
    host.install("globex", crate::plugins::plugin("probe"))
        .await
        .unwrap();
    set_policy(
        &host,
        "acme",
        json!({"*": {"reuse": {"max_calls": 100, "max_age_ms": 60000}}}),
    )
    .await;
    // acme keeps an instance of `residue` (the pool keeps one of its two slots idle)...
    assert_eq!(earlier_calls(&host, "acme", 1).await, Ok(0));
    // ...and globex still runs two calls at once: the idle one gives its slot back, so the
    // short call ends while the long one still holds the other slot.
    let caller = Caller::tenant("globex");
    let long = host.call(&caller, "nap", json!({"ms": 3000}));
    tokio::pin!(long);
    let started = crate::plugins::next_call_started(&host);
    let short = async {
        started.await.unwrap();
        while !host
            .metrics()
            .render()
            .contains("toolhost_instances_live 1")
        {
            tokio::task::yield_now().await;
        }
        host.call(&caller, "nap", json!({"ms": 1})).await
    };
    tokio::select! {
        _ = &mut long => panic!("the short call waited for the long call's slot"),
        short = short => assert_eq!(short.result, Ok(json!("rested"))),
    }
}
