//! The web platform in stored-source JS tools: `fetch` under the tenant's network grant, and
//! the rest of the minimum common API (timers, encoders, URL, crypto, structuredClone, …),
//! tested by our own cases and by web-platform-tests data that registry packages ship.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};
use toolhost::egress::EgressConfig;
use toolhost::{CallOutcome, Caller, Host, HostConfig, TenantPolicy};

async fn host(egress: EgressConfig) -> Arc<Host> {
    let host = Host::open(HostConfig {
        js_runtime: Some(crate::plugins::js_runtime()),
        js_snapshots: HostConfig::default().js_snapshots,
        egress,
        ..crate::plugins::config()
    })
    .await
    .unwrap();
    Arc::new(host)
}

/// Installs a tool named `name` whose async handler body is `body`.
async fn install(host: &Host, name: &str, body: &str) {
    let source = format!(
        "export const spec = {{ name: {name:?}, description: 'A test tool.', \
         parameters: {{ type: 'object' }}, config: ['TOKEN', 'BASE'] }};\n\
         export default async function (args, ctx) {{\n{body}\n}}\n"
    );
    host.install_js("acme", &source).await.unwrap();
}

async fn call(host: &Host, name: &str, args: Value) -> CallOutcome {
    host.call(&Caller::tenant("acme"), name, args).await
}

/// Some line of the call's log says `text`.
fn assert_logged(log: &toolhost::CallLog, text: &str) {
    let lines = &log.lines;
    assert!(lines.iter().any(|l| l.message.contains(text)), "{lines:?}");
}

async fn result(host: &Host, name: &str, args: Value) -> Value {
    let out = call(host, name, args).await;
    out.result
        .unwrap_or_else(|e| panic!("{name}: {e}\nlog: {:?}", out.log.lines))
}

#[tokio::test]
async fn every_promised_global_exists() {
    let host = host(EgressConfig::default()).await;
    install(
        &host,
        "globals",
        "return Object.fromEntries(args.names.map((n) => [n, typeof globalThis[n]]));",
    )
    .await;
    let names = [
        "fetch",
        "Request",
        "Response",
        "Headers",
        "AbortController",
        "AbortSignal",
        "setTimeout",
        "clearTimeout",
        "setInterval",
        "clearInterval",
        "queueMicrotask",
        "TextEncoder",
        "TextDecoder",
        "URL",
        "URLSearchParams",
        "crypto",
        "structuredClone",
        "performance",
        "atob",
        "btoa",
        "DOMException",
        "Event",
        "EventTarget",
        "console",
        "toolhost",
    ];
    let kinds = result(&host, "globals", json!({ "names": names })).await;
    for name in names {
        let kind = kinds[name].as_str().unwrap();
        assert!(kind == "function" || kind == "object", "{name} is {kind}");
    }
}

#[tokio::test]
async fn encoders_urls_crypto_clones_and_clocks_behave() {
    let host = host(EgressConfig::default()).await;
    install(
        &host,
        "platform",
        r#"
        const hex = (buffer) => [...new Uint8Array(buffer)].map((b) => b.toString(16).padStart(2, "0")).join("");
        const bytes = new TextEncoder().encode("héllo \u{1F600}");
        const url = new URL("../b?x=1&y=two#top", "https://user@example.com:8443/a/c");
        url.searchParams.append("z", "a b");
        const original = { when: new Date(0), tags: new Set(["a"]), map: new Map([[1, { deep: [1, 2] }]]) };
        original.self = original;
        const copy = structuredClone(original);
        let notCloned = null;
        try { structuredClone(() => 1); } catch (e) { notCloned = `${e.name}`; }
        const random = crypto.getRandomValues(new Uint32Array(4));
        const t0 = performance.now();
        const order = [];
        queueMicrotask(() => order.push("microtask"));
        // Far enough apart that a slow machine between the two calls cannot swap them.
        setTimeout(() => order.push("timer 2"), 15);
        setTimeout(() => order.push("timer 1"), 1);
        const cancelled = setTimeout(() => order.push("cancelled"), 0);
        clearTimeout(cancelled);
        await new Promise((resolve) => setTimeout(resolve, 40));
        const controller = new AbortController();
        controller.abort();
        return {
          bytes: [...bytes],
          text: new TextDecoder().decode(bytes),
          replaced: new TextDecoder().decode(new Uint8Array([0x61, 0xff, 0x62])),
          fatal: (() => { try { new TextDecoder("utf-8", { fatal: true }).decode(new Uint8Array([0xff])); return "decoded"; } catch (e) { return e.name; } })(),
          href: url.href,
          parts: [url.protocol, url.username, url.host, url.port, url.pathname, url.search, url.hash],
          query: [...new URLSearchParams("a=1&b=%20c&a=3").getAll("a"), new URLSearchParams({ q: "x y" }).toString()],
          badUrl: URL.canParse("not a url"),
          sha256: hex(await crypto.subtle.digest("SHA-256", new TextEncoder().encode("abc"))),
          sha1: hex(await crypto.subtle.digest({ name: "SHA-1" }, new TextEncoder().encode("abc"))),
          uuid: crypto.randomUUID(),
          random: random.some((n) => n !== 0),
          clone: [copy !== original, copy.self === copy, copy.when.getTime(), [...copy.tags], copy.map.get(1).deep],
          notCloned,
          waited: performance.now() - t0 >= 20,
          order,
          aborted: [controller.signal.aborted, controller.signal.reason.name],
          mathRandom: Math.random() !== Math.random(),
        };
        "#,
    )
    .await;
    let out = result(&host, "platform", json!({})).await;
    assert_eq!(
        out["bytes"],
        json!([104, 195, 169, 108, 108, 111, 32, 240, 159, 152, 128])
    );
    assert_eq!(out["text"], "héllo \u{1F600}");
    assert_eq!(out["replaced"], "a\u{FFFD}b");
    assert_eq!(out["fatal"], "TypeError");
    assert_eq!(
        out["href"],
        "https://user@example.com:8443/b?x=1&y=two&z=a+b#top"
    );
    assert_eq!(
        out["parts"],
        json!([
            "https:",
            "user",
            "example.com:8443",
            "8443",
            "/b",
            "?x=1&y=two&z=a+b",
            "#top"
        ])
    );
    assert_eq!(out["query"], json!(["1", "3", "q=x+y"]));
    assert_eq!(out["badUrl"], false);
    assert_eq!(
        out["sha256"],
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(out["sha1"], "a9993e364706816aba3e25717850c26c9cd0d89d");
    let uuid = out["uuid"].as_str().unwrap();
    assert_eq!(uuid.len(), 36);
    assert_eq!(&uuid[14..15], "4", "{uuid}");
    assert_eq!(out["random"], true);
    assert_eq!(out["clone"], json!([true, true, 0, ["a"], [1, 2]]));
    assert_eq!(out["notCloned"], "DataCloneError");
    assert_eq!(out["waited"], true);
    assert_eq!(out["order"], json!(["microtask", "timer 1", "timer 2"]));
    assert_eq!(out["aborted"], json!([true, "AbortError"]));
    assert_eq!(out["mathRandom"], true);
}

#[tokio::test]
async fn a_promise_nothing_can_settle_fails_and_an_endless_timer_times_out() {
    let host = host(EgressConfig::default()).await;
    install(&host, "forever", "return new Promise(() => {});").await;
    let out = call(&host, "forever", json!({})).await;
    let error = out.result.unwrap_err().to_string();
    assert!(error.contains("never settles"), "{error}");

    let source = "export const spec = { name: 'ticking', description: 'A test tool.', \
                  parameters: { type: 'object' }, limits: { timeout_ms: 300 } };\n\
                  export default () => new Promise(() => setInterval(() => {}, 10));";
    host.install_js("acme", source).await.unwrap();
    let out = call(&host, "ticking", json!({})).await;
    assert_eq!(out.code(), "timeout", "{:?}", out.result);
}

/// A local API: JSON weather, an echo of the request, and a redirect to the weather.
async fn api_server() -> SocketAddr {
    use axum::routing::{any, get};
    async fn echo(
        method: axum::http::Method,
        headers: axum::http::HeaderMap,
        body: String,
    ) -> axum::Json<Value> {
        let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
        axum::Json(json!({
            "method": method.as_str(),
            "authorization": header("authorization"),
            "content_type": header("content-type"),
            "body": body,
        }))
    }
    let app = axum::Router::new()
        .route(
            "/v1/current/{city}",
            get(
                |axum::extract::Path(city): axum::extract::Path<String>,
                 axum::extract::RawQuery(query): axum::extract::RawQuery| async move {
                    axum::Json(json!({"city": city, "query": query, "temp_c": 24.5, "conditions": "clear"}))
                },
            ),
        )
        .route("/echo", any(echo))
        .route(
            "/moved",
            get(|| async { axum::response::Redirect::to("/v1/current/Oslo") }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn grant(host: &Host, network: Value) {
    let policy = json!({ "grants": { "*": { "network": network } } });
    let policy: TenantPolicy = serde_json::from_value(policy).unwrap();
    host.set_policy("acme", policy).await.unwrap();
}

#[tokio::test]
async fn the_weather_example_fetches_json_under_a_grant() {
    let addr = api_server().await;
    let host = host(EgressConfig::default()).await;
    let example = crate::plugins::root().join("plugins/js-source/weather.js");
    let spec = host
        .install_js("acme", &std::fs::read_to_string(example).unwrap())
        .await
        .unwrap();
    let base = format!("http://127.0.0.1:{}", addr.port());
    host.set_config("acme", "WEATHER_URL", &base, false)
        .await
        .unwrap();
    host.set_config("acme", "WEATHER_TOKEN", "hunter2", true)
        .await
        .unwrap();

    // Without a grant, the request never leaves: a TypeError, and the reason in the log.
    let out = call(&host, &spec.name, json!({"city": "São Paulo"})).await;
    let error = out.result.unwrap_err().to_string();
    assert!(error.contains("TypeError: fetch"), "{error}");
    assert_logged(&out.log, "not in this tool's network grant");

    grant(&host, json!([base])).await;
    let weather = result(&host, &spec.name, json!({"city": "São Paulo"})).await;
    assert_eq!(
        weather,
        json!({"city": "São Paulo", "query": "units=metric", "temp_c": 24.5, "conditions": "clear"})
    );
}

/// The same tool built into a component by the JS SDK (StarlingMonkey's own `fetch`, over
/// the same `wasi:http` and grants).
#[tokio::test]
async fn the_weather_component_fetches_json_under_a_grant() {
    let addr = api_server().await;
    let host = host(EgressConfig::default()).await;
    let specs = host
        .install("acme", crate::plugins::js_weather_component())
        .await
        .unwrap();
    assert_eq!(specs[0].name, "js_component_weather_now");
    let base = format!("http://127.0.0.1:{}", addr.port());
    host.set_config("acme", "WEATHER_URL", &base, false)
        .await
        .unwrap();
    let args = json!({"city": "Oslo", "units": "imperial"});
    let out = call(&host, "js_component_weather_now", args.clone()).await;
    assert!(out.result.is_err(), "{:?}", out.result);
    assert_logged(&out.log, "not in this tool's network grant");
    grant(&host, json!([base])).await;
    let weather = result(&host, "js_component_weather_now", args).await;
    assert_eq!(
        weather,
        json!({"city": "Oslo", "query": "units=imperial", "temp_c": 24.5, "conditions": "clear"})
    );
}

#[tokio::test]
async fn fetch_sends_methods_headers_and_bodies_follows_redirects_and_keeps_secrets_out_of_the_log()
{
    let addr = api_server().await;
    let host = host(EgressConfig::default()).await;
    let base = format!("http://127.0.0.1:{}", addr.port());
    host.set_config("acme", "BASE", &base, false).await.unwrap();
    host.set_config("acme", "TOKEN", "hunter2", true)
        .await
        .unwrap();
    grant(&host, json!([base])).await;
    install(
        &host,
        "requests",
        r#"
        const base = toolhost.config.get("BASE");
        const token = toolhost.config.get("TOKEN");
        console.log(`calling with ${token}`);
        const posted = await fetch(`${base}/echo`, {
          method: "post",
          headers: new Headers({ Authorization: `Bearer ${token}`, "Content-Type": "application/json" }),
          body: JSON.stringify({ a: 1 }),
        });
        const form = await fetch(new Request(`${base}/echo`, { method: "PUT", body: new URLSearchParams({ q: "x y" }) }));
        const moved = await fetch(`${base}/moved`);
        const manual = await fetch(`${base}/moved`, { redirect: "manual" });
        const aborted = await fetch(`${base}/echo`, { signal: AbortSignal.abort() }).then(() => "sent", (e) => e.name);
        return {
          posted: [posted.status, posted.ok, posted.headers.get("content-type"), await posted.json()],
          form: (await form.json()),
          moved: [moved.redirected, moved.url, (await moved.json()).city],
          manual: [manual.status, manual.headers.get("location")],
          aborted,
          used: await posted.text().then(() => "read twice", (e) => e.name),
        };
        "#,
    )
    .await;
    let out = call(&host, "requests", json!({})).await;
    let value = out.result.unwrap();
    assert_eq!(
        value["posted"],
        json!([200, true, "application/json", {
            "method": "POST", "authorization": "Bearer hunter2",
            "content_type": "application/json", "body": "{\"a\":1}"
        }])
    );
    assert_eq!(value["form"]["method"], "PUT");
    assert_eq!(value["form"]["body"], "q=x+y");
    assert_eq!(
        value["form"]["content_type"],
        "application/x-www-form-urlencoded;charset=UTF-8"
    );
    assert_eq!(
        value["moved"],
        json!([true, format!("{base}/v1/current/Oslo"), "Oslo"])
    );
    assert_eq!(value["manual"], json!([303, "/v1/current/Oslo"]));
    assert_eq!(value["aborted"], "AbortError");
    assert_eq!(value["used"], "TypeError");
    // The secret reached the server; the log never shows it.
    assert_eq!(out.log.lines[0].message, "calling with [redacted]");
}

#[tokio::test]
async fn fetch_to_a_non_public_address_is_refused_after_resolution() {
    let addr = api_server().await;
    let host = host(EgressConfig::default()).await;
    // `localhost` is granted by name, but resolves to loopback, which the operator did not allow.
    let base = format!("http://localhost:{}", addr.port());
    host.set_config("acme", "BASE", &base, false).await.unwrap();
    grant(&host, json!([base])).await;
    install(
        &host,
        "local",
        "return await fetch(`${toolhost.config.get('BASE')}/echo`).then((r) => r.status, (e) => `${e.name}: ${e.message}`);",
    )
    .await;
    let out = call(&host, "local", json!({})).await;
    let refused = out.result.unwrap();
    assert!(
        refused.as_str().unwrap().starts_with("TypeError: fetch"),
        "{refused}"
    );
    assert_logged(&out.log, "non-public address");
}

/// Where a registry package's sources are, from `cargo metadata` (the package is a
/// dependency of this workspace, so it is in the lockfile). Only this platform's packages:
/// a fresh machine has downloaded no others, and the test reaches no network.
fn package_dir(name: &str) -> PathBuf {
    let host = std::process::Command::new("rustc")
        .args(["--print", "host-tuple"])
        .output()
        .unwrap();
    let host = String::from_utf8(host.stdout).unwrap();
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", host.trim()])
        .current_dir(crate::plugins::root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Value = serde_json::from_slice(&out.stdout).unwrap();
    let package = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not in the lockfile"));
    PathBuf::from(package["manifest_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_owned()
}

/// web-platform-tests' URL parsing and setter data, as the `url` crate vendors it (and the
/// cases that crate lists as its own known failures), run through our `URL` class.
#[tokio::test]
async fn url_passes_the_web_platform_tests_that_the_url_crate_passes() {
    let dir = package_dir("url").join("tests");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
    let parsing: Vec<Value> = serde_json::from_str(&read("urltestdata.json")).unwrap();
    let setters: Value = serde_json::from_str(&read("setters_tests.json")).unwrap();
    let expected_failures = read("expected_failures.txt");
    let host = host(EgressConfig::default()).await;
    install(
        &host,
        "wpt_url",
        r#"
        const PARTS = ["href", "origin", "protocol", "username", "password", "host", "hostname", "port", "pathname", "search", "hash"];
        const failures = [];
        for (const t of args.parsing) {
          if (typeof t === "string") continue;
          const fail = (why) => failures.push({ input: t.input, base: t.base, why });
          let url;
          try {
            url = t.base === null || t.base === undefined ? new URL(t.input) : new URL(t.input, t.base);
          } catch (e) {
            if (!t.failure) fail(`threw ${e}`);
            else if (!(e instanceof TypeError)) fail(`threw ${e.name}, not TypeError`);
            continue;
          }
          if (t.failure) { fail(`parsed as ${url.href}`); continue; }
          const wrong = PARTS.filter((p) => p in t && url[p] !== t[p]).map((p) => `${p}: ${url[p]} != ${t[p]}`);
          if (url.toString() !== t.href) wrong.push("toString");
          if (wrong.length) fail(wrong.join("; "));
        }
        let ran = 0;
        for (const [setter, cases] of Object.entries(args.setters)) {
          if (setter === "comment") continue;
          for (const t of cases) {
            ran++;
            const url = new URL(t.href);
            try { url[setter] = t.new_value; } catch (e) { if (setter !== "href") { failures.push({ href: t.href, setter, new_value: t.new_value, why: `threw ${e}` }); continue; } }
            const wrong = Object.entries(t.expected).filter(([p, v]) => url[p] !== v).map(([p, v]) => `${p}: ${url[p]} != ${v}`);
            if (wrong.length) failures.push({ href: t.href, setter, new_value: t.new_value, why: wrong.join("; ") });
          }
        }
        return { failures, setters: ran };
        "#,
    )
    .await;
    let out = result(
        &host,
        "wpt_url",
        json!({"parsing": parsing, "setters": setters}),
    )
    .await;
    assert!(out["setters"].as_u64().unwrap() > 200, "{}", out["setters"]);
    // Named as the url crate's harness names them, to match its list.
    let name = |f: &Value| match f.get("setter") {
        Some(setter) => format!(
            "<{}> set {} to <{}>",
            f["href"].as_str().unwrap().escape_default(),
            setter.as_str().unwrap(),
            f["new_value"].as_str().unwrap().escape_default()
        ),
        None => {
            let mut name = format!("<{}>", f["input"].as_str().unwrap().escape_default());
            if let Some(base) = f["base"].as_str() {
                name.push_str(&format!(" against <{}>", base.escape_default()));
            }
            name
        }
    };
    let unexpected: Vec<String> = out["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| !expected_failures.lines().any(|known| known == name(f)))
        .map(|f| format!("{}: {}", name(f), f["why"]))
        .collect();
    let cases = parsing.iter().filter(|t| t.is_object()).count();
    assert!(cases > 800, "{cases}");
    assert!(
        unexpected.is_empty(),
        "{} of {cases} cases fail beyond the url crate's own known failures:\n{}",
        unexpected.len(),
        unexpected.join("\n")
    );
}

/// Calls `tenant`'s `tool` (with no arguments) until a call starts from its snapshot.
async fn until_pre_initialised(host: &Host, tenant: &str, tool: &str) {
    until_pre_initialised_with(host, tenant, tool, json!({})).await
}

async fn until_pre_initialised_with(host: &Host, tenant: &str, tool: &str, args: Value) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let before = crate::plugins::snapshot_calls(host);
        let out = host.call(&Caller::tenant(tenant), tool, args.clone()).await;
        assert!(out.result.is_ok(), "{tool}: {:?}", out.result);
        if crate::plugins::snapshot_calls(host) > before {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{tool}: no snapshot");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_tenant_holds_its_share_of_snapshots_and_never_takes_another_tenants() {
    let host = Host::open(HostConfig {
        js_runtime: Some(crate::plugins::js_runtime()),
        js_snapshots: 2,
        js_snapshots_per_tenant: 1,
        ..crate::plugins::config()
    })
    .await
    .unwrap();
    let tool = |name: &str| {
        format!(
            "export const spec = {{ name: '{name}', description: 'A test tool.', parameters: {{ type: 'object' }} }};\n\
             export default () => '{name}';"
        )
    };
    host.install_js("globex", &tool("theirs")).await.unwrap();
    until_pre_initialised(&host, "globex", "theirs").await;
    for name in ["one", "two"] {
        host.install_js("acme", &tool(name)).await.unwrap();
        until_pre_initialised(&host, "acme", name).await;
    }
    // acme's second snapshot replaced its first...
    let before = crate::plugins::snapshot_calls(&host);
    let out = host.call(&Caller::tenant("acme"), "one", json!({})).await;
    assert_eq!(out.result, Ok(json!("one")));
    assert_eq!(
        crate::plugins::snapshot_calls(&host),
        before,
        "`one` ran from a snapshot"
    );
    // ...and globex's stayed.
    let out = host
        .call(&Caller::tenant("globex"), "theirs", json!({}))
        .await;
    assert_eq!(out.result, Ok(json!("theirs")));
    assert_eq!(crate::plugins::snapshot_calls(&host), before + 1);
}

#[tokio::test]
async fn a_js_tool_is_pre_initialised_and_answers_from_its_snapshot_with_fresh_state() {
    let host = host(EgressConfig::default()).await;
    let source = "const loadedAt = Date.now(); let calls = 0;\n\
                  export const spec = { name: 'fresh', description: 'A test tool.', parameters: { type: 'object' } };\n\
                  export default () => ({ loadedAt, calls: ++calls, random: Math.random(), uuid: crypto.randomUUID(), \
                  now: performance.now(), origin: performance.timeOrigin });";
    host.install_js("acme", source).await.unwrap();
    let example = crate::plugins::root().join("plugins/js-source/word_count.js");
    host.install_js("acme", &std::fs::read_to_string(example).unwrap())
        .await
        .unwrap();
    // Snapshots are built in the background, one at a time; calls meanwhile run as before.
    until_pre_initialised(&host, "acme", "fresh").await;
    until_pre_initialised_with(&host, "acme", "js_word_count", json!({"text": "a b a"})).await;
    let before = crate::plugins::snapshot_calls(&host);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64;
    let one = result(&host, "fresh", json!({})).await;
    let two = result(&host, "fresh", json!({})).await;
    assert_eq!(crate::plugins::snapshot_calls(&host), before + 2);
    // Top-level code ran once, in the snapshot; each call starts from it afresh...
    assert_eq!(one["loadedAt"], two["loadedAt"]);
    assert_eq!(
        (one["calls"].clone(), two["calls"].clone()),
        (json!(1), json!(1))
    );
    // ...with its own randomness and clocks.
    assert_ne!(one["random"], two["random"]);
    assert_ne!(one["uuid"], two["uuid"]);
    assert!(one["now"].as_f64().unwrap() < 1_000.0, "{one}");
    assert!(
        two["origin"].as_f64().unwrap() >= started,
        "{two} vs {started}"
    );
    assert_eq!(
        result(
            &host,
            "js_word_count",
            json!({"text": "the cat and the hat"})
        )
        .await,
        json!({"words": 5, "distinct": 4, "most_frequent": {"word": "the", "count": 2}})
    );
}

/// Two tenants with the same source get snapshots of their own: top-level code (here a
/// random id) ran once for each, never once for both.
#[tokio::test]
async fn tenants_with_the_same_source_never_share_a_snapshot() {
    let host = host(EgressConfig::default()).await;
    let source = "const id = crypto.randomUUID();\n\
                  export const spec = { name: 'ident', description: 'A test tool.', parameters: { type: 'object' } };\n\
                  export default () => id;";
    let mut ids = Vec::new();
    for tenant in ["acme", "globex"] {
        host.install_js(tenant, source).await.unwrap();
        until_pre_initialised(&host, tenant, "ident").await;
        let out = host.call(&Caller::tenant(tenant), "ident", json!({})).await;
        ids.push(out.result.unwrap());
    }
    assert_ne!(ids[0], ids[1]);
}
