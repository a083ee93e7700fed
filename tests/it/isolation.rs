//! What one tenant can do to another: a flood of calls, nested calls that could wedge the
//! instance pool, and schemas built to be costly. The worst tenant plays against a
//! well-behaved one, which must keep being served.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use toolhost::{Caller, Host, HostConfig, InstallError};

fn js_tool(name: &str, timeout_ms: u64, body: &str) -> String {
    format!(
        "export const spec = {{ name: {name:?}, description: 'A test tool.', \
         parameters: {{ type: 'object' }}, limits: {{ timeout_ms: {timeout_ms} }} }};\n\
         export default function (args, ctx) {{\n{body}\n}}\n"
    )
}

/// The burst: 100 concurrent calls of a tool that works for a second and then calls
/// another tool. Each holds an instance while its nested call needs another; once every
/// slot was held by a caller, nothing ran again (and other tenants hung with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_nested_calls_ends_in_time_and_other_tenants_are_served_throughout() {
    let host = Arc::new(
        Host::open(HostConfig {
            js_runtime: Some(crate::plugins::js_runtime()),
            ..crate::plugins::config()
        })
        .await
        .unwrap(),
    );
    let inner = js_tool("inner", 3000, "return { ok: 1 };");
    let outer = js_tool(
        "outer",
        3000,
        "const t = Date.now(); while (Date.now() - t < 1000) {} return toolhost.callTool('inner', {});",
    );
    host.install_js("acme", &inner).await.unwrap();
    host.install_js("acme", &outer).await.unwrap();
    host.install("globex", crate::plugins::plugin("text_stats"))
        .await
        .unwrap();

    let burst: Vec<_> = (0..100)
        .map(|_| {
            let host = host.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let out = host.call(&Caller::tenant("acme"), "outer", json!({})).await;
                (out, started.elapsed())
            })
        })
        .collect();
    // The other tenant calls all through the burst; every call must be answered.
    let mut answered = 0;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let out = host
            .call(
                &Caller::tenant("globex"),
                "text_stats",
                json!({"text": "still here"}),
            )
            .await;
        assert_eq!(
            out.code(),
            "ok",
            "globex during acme's burst: {:?}",
            out.result
        );
        answered += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(answered > 10, "{answered}");
    let (mut ok, mut timed_out) = (0, 0);
    for call in burst {
        let (out, took) = call.await.unwrap();
        assert!(
            took < Duration::from_secs(4),
            "a call took {took:?}: its timeout is 3 s"
        );
        match out.code() {
            "ok" => ok += 1,
            "timeout" => timed_out += 1,
            other => panic!("{other}: {:?}", out.result),
        }
    }
    // Some ran to the end (the queue moves), the rest ended at their deadline.
    assert!(ok > 0, "ok {ok}, timeout {timed_out}");
}

/// A 1 KB schema whose check costs 2^20 subschemas once took seconds and gigabytes per call;
/// with `$refs` that double, a 47-byte call grew memory until the host aborted.
#[tokio::test]
async fn schemas_too_costly_to_check_are_refused_at_install_naming_the_rule() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    let mut branch = json!({"type": "string", "minLength": 3});
    for _ in 0..20 {
        branch = json!({"anyOf": [{"type": "integer"}, branch]});
    }
    assert!(branch.to_string().len() < 1024);
    let spec = json!({"name": "costly", "description": "An exponential schema.",
                      "parameters": {"type": "object", "properties": {"a": branch}}});
    let def =
        json!({"spec": spec, "request": {"method": "get", "url": "https://api.example.com/"}});
    let error = host
        .install_http("acme", serde_json::from_value(def).unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, InstallError::Spec(e) if e.to_string().contains("too costly")),
        "{error}"
    );
    assert!(host.list("acme").is_empty());
}

/// Two recursive branches that meet at one value cost little to check but double the error
/// report at each level: 80 bytes of arguments took a worker for days and its memory.
#[tokio::test]
async fn a_deep_call_of_a_branching_recursive_schema_fails_at_once() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    let branch = json!({"type": "array", "items": {"$ref": "#/$defs/n"}});
    let spec = json!({"name": "nested", "description": "Recursive arrays, two ways.",
        "parameters": {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}},
                       "$defs": {"n": {"anyOf": [branch, branch]}}}});
    let def = json!({"spec": spec, "request": {"method": "get", "url": "http://127.0.0.1:9/"}});
    (host
        .install_http("acme", serde_json::from_value(def).unwrap())
        .await)
        .unwrap();
    let deep = (0..40).fold(json!("x"), |inner, _| json!([inner]));
    let out = host
        .call(&Caller::tenant("acme"), "nested", json!({ "a": deep }))
        .await;
    let error = out.result.unwrap_err();
    assert_eq!(error.code(), "invalid_args", "{error}");
    assert!(error.to_string().contains("nested 41 deep"), "{error}");
}

/// `n` bytes of a and b, in no order a pattern could shortcut.
fn scrambled_ab(n: usize) -> String {
    let mut x: u64 = 88_172_645_463_325_252;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x & 1 == 0 { 'a' } else { 'b' }
        })
        .collect()
}

/// Matching a pattern cannot be stopped and can cost microseconds a byte: `a[ab]{1000}c`
/// against 1 MiB of arguments took a worker for seconds, past any time limit. Such a check
/// now runs on its own thread in one of its tenant's two places, and the call waits for it
/// no longer than its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_check_outlasts_its_time_limit_ends_at_the_limit() {
    let host = Arc::new(Host::open(crate::plugins::config()).await.unwrap());
    let tool = |timeout_ms: u64| {
        let spec = json!({"name": "matched", "description": "A costly pattern.",
            "limits": {"timeout_ms": timeout_ms},
            "parameters": {"type": "object", "properties": {
                "text": {"type": "string", "pattern": "a[ab]{1000}c"}}}});
        let def = json!({"spec": spec, "request": {"method": "get", "url": "http://127.0.0.1:9/"}});
        serde_json::from_value(def).unwrap()
    };
    host.install_http("acme", tool(300)).await.unwrap();
    host.install_http("globex", tool(20_000)).await.unwrap();
    let (acme, globex) = (Caller::tenant("acme"), Caller::tenant("globex"));
    let long = json!({ "text": scrambled_ab(1 << 20) });
    let started = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..3 {
        let (host, long) = (host.clone(), long.clone());
        calls.spawn(async move { host.call(&Caller::tenant("acme"), "matched", long).await });
    }
    for out in calls.join_all().await {
        assert_eq!(out.code(), "timeout", "{:?}", out.result);
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // acme's two checks run on, in its places: its next one waits, globex's does not.
    let short = json!({ "text": scrambled_ab(8 << 10) });
    let out = host.call(&acme, "matched", short.clone()).await;
    assert_eq!(out.code(), "timeout", "{:?}", out.result);
    let out = host.call(&globex, "matched", short).await;
    assert_eq!(out.code(), "invalid_args", "{:?}", out.result);
    let inline = host.call(&acme, "matched", json!({"text": "abc"})).await;
    assert_eq!(inline.code(), "invalid_args", "{:?}", inline.result);
}

/// A result is checked against its `output_schema` the same way: 1 MiB against a costly
/// pattern ends at the call's limit, which counts the run before it, not seconds later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_whose_check_outlasts_its_time_limit_ends_at_the_limit() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    let spec = json!({"name": "long_text", "description": "Returns a long text.",
        "limits": {"timeout_ms": 1000}, "parameters": {"type": "object"},
        "output_schema": {"type": "object", "properties": {
            "text": {"type": "string", "pattern": "a[ab]{1000}c"}}}});
    let text = scrambled_ab(1 << 20);
    (host.natives())
        .register(serde_json::from_value(spec).unwrap(), move |_, _, _| {
            let text = text.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(700)).await;
                Ok(json!({ "text": text }))
            }
        })
        .unwrap();
    let started = Instant::now();
    let out = host
        .call(&Caller::tenant("acme"), "long_text", json!({}))
        .await;
    assert_eq!(out.code(), "timeout", "{:?}", out.result.map(|_| ()));
    // The check had what the run left of the second, not a second of its own.
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1500), "{took:?}");
}

/// A component of 64 MiB compiles to hundreds of MiB: the components kept loaded are bounded
/// by the bytes of their code, not only by their number. One too heavy to keep still runs.
#[tokio::test]
async fn loaded_components_are_bounded_by_the_bytes_of_their_code() {
    // So many allowed that each component weighs its own code (see `max_loaded_component_bytes`).
    let open = |bytes: u64| {
        Host::open(HostConfig {
            max_loaded_components: 1 << 20,
            max_loaded_component_bytes: bytes,
            ..crate::plugins::config()
        })
    };
    let install_and_call = async |host: &Host| {
        for plugin in ["text_stats", "probe"] {
            host.install("acme", crate::plugins::plugin(plugin))
                .await
                .unwrap();
        }
        let acme = Caller::tenant("acme");
        let stats = host.call(&acme, "text_stats", json!({"text": "a b"})).await;
        assert!(stats.result.is_ok(), "{:?}", stats.result);
        let nap = host.call(&acme, "nap", json!({"ms": 0})).await;
        assert!(nap.result.is_ok(), "{:?}", nap.result);
    };
    let roomy = open(HostConfig::default().max_loaded_component_bytes)
        .await
        .unwrap();
    install_and_call(&roomy).await;
    assert_eq!(roomy.loaded_components(), 2);
    let both = roomy.loaded_component_bytes();
    let snug = open(both - 1).await.unwrap();
    install_and_call(&snug).await;
    assert_eq!(snug.loaded_components(), 1);
    assert!(snug.loaded_component_bytes() < both);
    let none = open(1).await.unwrap();
    install_and_call(&none).await;
    assert_eq!(none.loaded_components(), 0);
}

/// One tenant installing and calling many components drops its own loaded ones, not the
/// others': each tenant's hold at most a quarter of the cache.
#[tokio::test]
async fn a_tenant_with_many_components_drops_its_own_not_the_others() {
    // Four places of 64 MiB, which weighs more than these plugins' code: one per tenant.
    let host = Host::open(HostConfig {
        max_loaded_components: 4,
        max_loaded_component_bytes: 4 * (64 << 20),
        ..crate::plugins::config()
    })
    .await
    .unwrap();
    let loads_from_storage = || {
        let text = host.metrics().render();
        let count = |source: &str| {
            let series = format!("toolhost_component_loads_total{{source=\"{source}\"}} ");
            let line = text.lines().find(|l| l.starts_with(&series));
            line.map_or(0, |l| l[series.len()..].parse::<u64>().unwrap())
        };
        count("artifact") + count("compiled")
    };
    host.install("acme", crate::plugins::plugin("text_stats"))
        .await
        .unwrap();
    let acme = Caller::tenant("acme");
    let stats = host.call(&acme, "text_stats", json!({"text": "a b"})).await;
    assert!(stats.result.is_ok(), "{:?}", stats.result);
    let globex = Caller::tenant("globex");
    for round in 0..8 {
        let variant = crate::plugins::variant("legacy_v0_1", &format!("round-{round}"));
        // Twice: installing what is loaded already keeps it charged to globex.
        for _ in 0..2 {
            host.install("globex", variant.clone()).await.unwrap();
        }
        // Called again and again, so that the cache holds them as dearly as acme's (each
        // call fails at its nested call, after the component is found).
        for _ in 0..3 {
            host.call(&globex, "legacy_echo", json!({"text": "a"}))
                .await;
        }
        assert!(host.loaded_components() <= 2, "acme's and globex's newest");
    }
    let before = loads_from_storage();
    let stats = host.call(&acme, "text_stats", json!({"text": "a b"})).await;
    assert!(stats.result.is_ok(), "{:?}", stats.result);
    assert_eq!(
        loads_from_storage(),
        before,
        "acme's component stayed loaded"
    );
}

/// A result is parsed before it is clipped, and parsed JSON takes many times its text: a
/// 100 MiB array once cost the host 5.4 GiB. Text over `MAX_RESULT_BYTES` is refused unread.
#[tokio::test]
async fn a_result_too_large_to_parse_is_refused_unread() {
    let host = Host::open(HostConfig {
        js_runtime: Some(crate::plugins::js_runtime()),
        ..crate::plugins::config()
    })
    .await
    .unwrap();
    let huge = "export const spec = { name: 'huge', description: 'A test tool.', \
                parameters: { type: 'object' }, limits: { memory_bytes: 268435456 } };\n\
                export default function () { return new Array(2000000).fill(12345); }\n";
    host.install_js("acme", huge).await.unwrap();
    let out = host.call(&Caller::tenant("acme"), "huge", json!({})).await;
    assert_eq!(out.code(), "invalid_output", "{:?}", out.result);
    let message = out.result.unwrap_err().to_string();
    assert!(
        message.contains(&toolhost::MAX_RESULT_BYTES.to_string()),
        "{message}"
    );
    // Within the bytes, a text of small values parses to hundreds of MiB: refused too.
    let many = "export const spec = { name: 'many', description: 'A test tool.', \
                parameters: { type: 'object' }, limits: { memory_bytes: 268435456 } };\n\
                export default function () { return new Array(1500000).fill(0); }\n";
    host.install_js("acme", many).await.unwrap();
    let out = host.call(&Caller::tenant("acme"), "many", json!({})).await;
    assert_eq!(out.code(), "invalid_output", "{:?}", out.result);
    let message = out.result.unwrap_err().to_string();
    assert!(message.contains("1000000 JSON values"), "{message}");
}

/// Installing runs the component's code in the shared instance slots, so it passes the
/// tenant's gates as a call does: `max_concurrent: 1` once could be bypassed by installing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_passes_the_tenants_gates_like_a_call() {
    let host = Arc::new(Host::open(crate::plugins::config()).await.unwrap());
    host.install("acme", crate::plugins::plugin("probe"))
        .await
        .unwrap();
    let policy = serde_json::from_value(json!({"max_concurrent": 1})).unwrap();
    host.set_policy("acme", policy).await.unwrap();
    let started = crate::plugins::next_call_started(&host);
    let busy = {
        let host = host.clone();
        tokio::spawn(async move {
            host.call(&Caller::tenant("acme"), "busy", json!({"ms": 1500}))
                .await
        })
    };
    started.await.unwrap();
    let refused = host
        .install("acme", crate::plugins::plugin("text_stats"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &refused,
            InstallError::Admission {
                limit: "max_concurrent",
                ..
            }
        ),
        "{refused}"
    );
    assert_eq!(busy.await.unwrap().code(), "ok");
    host.install("acme", crate::plugins::plugin("text_stats"))
        .await
        .expect("admitted once the call ended");
}

/// The code a tenant's kept versions hold is capped: each distinct component once (with each
/// version's spec), so a new version of the same component adds only its specs, and removing
/// tools makes room.
#[tokio::test]
async fn installs_stop_at_the_tenants_code_quota() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    let (small, large) = (
        crate::plugins::plugin("text_stats"),
        crate::plugins::plugin("probe"),
    );
    assert!(small.len() < large.len());
    let quota = (small.len() + large.len() / 2) as u64;
    let policy = serde_json::from_value(json!({ "code_quota_bytes": quota })).unwrap();
    host.set_policy("acme", policy).await.unwrap();

    host.install("acme", small.clone()).await.unwrap();
    host.install("acme", small.clone())
        .await
        .expect("a second version of the same component adds only its specs");
    let refused = host.install("acme", large.clone()).await.unwrap_err();
    assert!(
        matches!(refused, InstallError::CodeQuota { used, quota: q } if q == quota && used > quota),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("code_quota_bytes"),
        "{refused}"
    );
    assert!(
        host.describe("acme", "fs_write").is_none(),
        "nothing of it installed"
    );
    host.install("globex", large.clone())
        .await
        .expect("another tenant has its own quota");

    for tool in ["text_stats", "word_frequency"] {
        assert!(host.remove("acme", tool).await.unwrap());
    }
    host.install("acme", large)
        .await
        .expect("removing the tool made room");
}

/// Code let go of (a version past the kept ones, a removed tool) is collected while the host
/// runs: it was collected only as a host opened, so a tenant churning versions could fill the
/// disk between restarts. Until then it counts against the tenant's code quota.
#[tokio::test]
async fn code_let_go_of_is_collected_while_the_host_runs() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    let def = |n: usize| -> toolhost::http_tool::HttpToolDef {
        serde_json::from_value(json!({
            "spec": {"name": "churn", "description": "Churns.", "parameters": {"type": "object"}},
            "request": {"method": "get", "url": format!("https://example.com/v{n}")}
        }))
        .unwrap()
    };
    let definition = |host: &Host| match host.describe("acme", "churn").unwrap().source {
        toolhost::Source::Http { definition, .. } => definition,
        other => panic!("{other:?}"),
    };
    let gone = async |host: &Host, sha: &str| {
        let started = Instant::now();
        while host.store().has_blob(sha).await.unwrap() {
            assert!(started.elapsed() < Duration::from_secs(20), "{sha} kept");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    host.install_http("acme", def(0)).await.unwrap();
    let first = definition(&host);
    for n in 1..=toolhost_store::MAX_VERSIONS_KEPT + 1 {
        host.install_http("acme", def(n)).await.unwrap();
    }
    gone(&host, &first).await;
    let last = definition(&host);
    assert!(
        host.store().has_blob(&last).await.unwrap(),
        "a kept version's"
    );
    assert!(host.remove("acme", "churn").await.unwrap());
    gone(&host, &last).await;
}

/// Specs count against the code quota too: HTTP tools that share one request definition
/// (stored once) were free, so a tenant could add any number of them.
#[tokio::test]
async fn http_tools_over_one_request_stop_at_the_code_quota() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    let policy = serde_json::from_value(json!({ "code_quota_bytes": 64 * 1024 })).unwrap();
    host.set_policy("acme", policy).await.unwrap();
    let def = |name: String| {
        serde_json::from_value::<toolhost::http_tool::HttpToolDef>(json!({
            "spec": {"name": name, "description": "d".repeat(1000), "parameters": {"type": "object"}},
            "request": {"method": "get", "url": "http://example.com/"}
        }))
        .unwrap()
    };
    let mut installed = 0;
    let refused = loop {
        match host
            .install_http("acme", def(format!("t{installed}")))
            .await
        {
            Ok(_) => installed += 1,
            Err(refused) => break refused,
        }
        assert!(installed < 1000, "never refused");
    };
    assert!(
        matches!(refused, InstallError::CodeQuota { quota, .. } if quota == 64 * 1024),
        "{refused}"
    );
    // Each spec is a little over 1 KB of JSON.
    assert!((40..64).contains(&installed), "{installed} installed");
    host.install_http("globex", def("t0".into()))
        .await
        .expect("another tenant has its own quota");
}

/// Every node holds each tenant's current specs in memory, as parsed values: however large
/// its code quota, a tenant's specs are bounded in bytes.
#[tokio::test]
async fn a_tenants_specs_are_bounded_in_bytes() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    let sized = |name: &str, pad: usize| {
        let parameters = json!({"type": "object", "description": "p".repeat(pad)});
        serde_json::from_value::<toolhost::http_tool::HttpToolDef>(json!({
            "spec": {"name": name, "description": "A tool.", "parameters": parameters},
            "request": {"method": "get", "url": "http://example.com/"}
        }))
        .unwrap()
    };
    let def = |name: &str| sized(name, 60_000);
    let mut installed = 0;
    let refused = loop {
        match host
            .install_http("acme", def(&format!("t{installed}")))
            .await
        {
            Ok(_) => installed += 1,
            Err(refused) => break refused,
        }
        assert!(installed < 1000, "never refused");
    };
    assert!(
        matches!(refused, InstallError::SpecsTooLarge(bytes) if bytes > toolhost::MAX_SPEC_BYTES_PER_TENANT),
        "{refused}"
    );
    let most = toolhost::MAX_SPEC_BYTES_PER_TENANT / 60_000;
    assert!(
        (most - 5..=most).contains(&installed),
        "{installed} installed"
    );
    // A new version no larger, another tenant, and room made by a removal are not refused.
    host.install_http("acme", def("t0")).await.unwrap();
    host.install_http("globex", def("t0")).await.unwrap();
    assert!(host.remove("acme", "t1").await.unwrap());
    host.install_http("acme", def("again")).await.unwrap();
    // Nor does a rollback get around it: a small version of t2 makes room, which another
    // tool takes; t2's large version back would pass the bound.
    host.install_http("acme", sized("t2", 10)).await.unwrap();
    host.install_http("acme", def("took")).await.unwrap();
    let refused = host.rollback("acme", "t2", None).await.unwrap_err();
    assert!(
        matches!(refused, toolhost::ManageError::SpecsTooLarge(_)),
        "{refused}"
    );
}

/// Live instances never hold more than the host's memory budget together: calls past it wait
/// for it (within their deadline) instead of running, and none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_past_the_memory_budget_wait_for_it() {
    let sandbox = toolhost::SandboxConfig {
        memory_budget_bytes: 1 << 30,
        ..Default::default()
    };
    let config = HostConfig {
        sandbox,
        ..crate::plugins::config()
    };
    let host = Arc::new(Host::open(config).await.unwrap());
    host.install("acme", crate::plugins::plugin("probe"))
        .await
        .unwrap();
    let started = Instant::now();
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let host = host.clone();
            let args = json!({"mib": 300, "ms": 400});
            tokio::spawn(async move {
                host.call(&Caller::tenant("acme"), "hold_memory", args)
                    .await
            })
        })
        .collect();
    for call in calls {
        let out = call.await.unwrap();
        assert_eq!(out.code(), "ok", "{:?}", out.result);
    }
    // Each holds its `memory_bytes` (512 MiB) of the budget: two run at a time, in two rounds.
    assert!(started.elapsed() >= Duration::from_millis(800));
}

/// A tenant's calls waiting for its share hold a bounded amount of memory in their
/// arguments: past it a call is refused at once, not queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_waiting_calls_hold_a_bounded_number_of_bytes() {
    let config = HostConfig {
        tenant_share: 1,
        ..crate::plugins::config()
    };
    let host = Arc::new(Host::open(config).await.unwrap());
    host.install("acme", crate::plugins::plugin("probe"))
        .await
        .unwrap();
    let acme = Caller::tenant("acme");
    let running = {
        let (host, acme) = (host.clone(), acme.clone());
        tokio::spawn(async move { host.call(&acme, "nap", json!({"ms": 3000})).await })
    };
    // Until the nap runs: then acme's one place is taken, and its next calls wait.
    let naps = || {
        host.metrics()
            .render()
            .contains("toolhost_instances_live 1")
    };
    let started = Instant::now();
    while !naps() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the nap never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Past the 64 MiB a tenant's waiting calls may hold (one long string: its check is quick,
    // so what refuses it is the bound, not a check starved of CPU).
    let large = json!({"ms": 1, "pad": "x".repeat(65 << 20)});
    let refused = host.call(&acme, "nap", large).await;
    assert_eq!(refused.code(), "rate_limited", "{:?}", refused.result);
    let message = format!("{:?}", refused.result);
    assert!(message.contains("bytes of arguments"), "{message}");
    let small = host.call(&acme, "nap", json!({"ms": 1})).await;
    assert_eq!(small.code(), "ok", "a small call waits, and runs");
    assert_eq!(running.await.unwrap().code(), "ok");
}

/// A call waiting for a place to check its arguments is one of its tenant's waiting calls:
/// MCP calls run on after their client goes, so without the bound a tenant could pile up
/// calls there without end, each holding its arguments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_waiting_to_be_checked_count_among_the_tenants_waiting_calls() {
    let config = HostConfig {
        tenant_share: 1,
        ..crate::plugins::config()
    };
    let host = Arc::new(Host::open(config).await.unwrap());
    let spec = json!({"name": "matched", "description": "A costly pattern.",
        "limits": {"timeout_ms": 3000},
        "parameters": {"type": "object", "properties": {
            "text": {"type": "string", "pattern": "a[ab]{1000}c"}}}});
    let def = json!({"spec": spec, "request": {"method": "get", "url": "http://127.0.0.1:9/"}});
    host.install_http("acme", serde_json::from_value(def).unwrap())
        .await
        .unwrap();
    // Each check takes a tenth of a second or more: two run, the rest wait for them.
    let text = json!({ "text": scrambled_ab(64 << 10) });
    let queue = toolhost::QUEUED_PER_PLACE;
    let calls = toolhost::MAX_CHECKS_PER_TENANT + queue + 6;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..calls {
        let (host, text) = (host.clone(), text.clone());
        set.spawn(async move { host.call(&Caller::tenant("acme"), "matched", text).await });
    }
    let outcomes = set.join_all().await;
    let refused: Vec<_> = outcomes
        .iter()
        .filter(|out| out.code() == "rate_limited")
        .collect();
    assert!(refused.len() >= 6, "{} of {calls} refused", refused.len());
    let message = format!("{:?}", refused[0].result);
    assert!(
        message.contains(&format!("{queue} calls waiting")),
        "{message}"
    );
}

/// A tenant's live instances hold at most its part of the memory budget: past it its calls
/// wait, holding none of the rest, and another tenant's call runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_instances_hold_only_its_part_of_the_memory_budget() {
    let sandbox = toolhost::SandboxConfig {
        memory_budget_bytes: 2 << 30,
        memory_budget_per_tenant_bytes: 1 << 30,
        ..Default::default()
    };
    let config = HostConfig {
        sandbox,
        ..crate::plugins::config()
    };
    let host = Arc::new(Host::open(config).await.unwrap());
    for tenant in ["acme", "globex"] {
        (host.install(tenant, crate::plugins::plugin("probe")).await).unwrap();
    }
    let hold = |tenant: &'static str, ms: u64| {
        let host = host.clone();
        tokio::spawn(async move {
            let args = json!({"mib": 10, "ms": ms});
            let out = (host.call(&Caller::tenant(tenant), "hold_memory", args)).await;
            assert_eq!(out.code(), "ok", "{:?}", out.result);
            Instant::now()
        })
    };
    // Four of acme's at 512 MiB each: the whole budget, were it not for acme's part.
    let acme: Vec<_> = (0..4).map(|_| hold("acme", 400)).collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let globex = hold("globex", 1).await.unwrap();
    let mut ends = Vec::new();
    for call in acme {
        ends.push(call.await.unwrap());
    }
    assert!(
        globex < *ends.iter().min().unwrap(),
        "globex waited for acme"
    );
    ends.sort();
    // Two of acme's at a time, in two rounds.
    assert!(ends[3] - ends[0] >= Duration::from_millis(300), "{ends:?}");
}
