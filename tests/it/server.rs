//! The HTTP API: keys, tenants, every route, limits, the error shape, graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use crate::plugins::plugin;
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use toolhost::{Host, ToolSpec};
use toolhost_server::server::{MAX_REQUEST_BYTES, router};

struct Api {
    router: Router,
    host: Arc<Host>,
    acme: String,
    globex: String,
}

async fn api() -> Api {
    let host = Arc::new(Host::open(crate::plugins::config()).await.unwrap());
    let mut keys = Vec::new();
    for tenant in ["acme", "globex"] {
        host.create_tenant(tenant).await.unwrap();
        keys.push(
            host.create_key(tenant, toolhost::Role::Admin)
                .await
                .unwrap()
                .secret,
        );
    }
    let globex = keys.pop().unwrap();
    let acme = keys.pop().unwrap();
    Api {
        router: router(host.clone(), Default::default()),
        host,
        acme,
        globex,
    }
}

async fn send(
    api: &Api,
    method: &str,
    path: &str,
    key: Option<&str>,
    content_type: &str,
    body: Vec<u8>,
) -> (StatusCode, Value) {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type);
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let response =
        tower::ServiceExt::oneshot(api.router.clone(), request.body(Body::from(body)).unwrap())
            .await
            .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
}

async fn get(api: &Api, path: &str, key: &str) -> (StatusCode, Value) {
    send(api, "GET", path, Some(key), "application/json", vec![]).await
}

async fn post_json(api: &Api, path: &str, key: &str, body: Value) -> (StatusCode, Value) {
    send(
        api,
        "POST",
        path,
        Some(key),
        "application/json",
        body.to_string().into_bytes(),
    )
    .await
}

async fn install(api: &Api, key: &str, name: &str) -> (StatusCode, Value) {
    send(
        api,
        "POST",
        "/v1/tools",
        Some(key),
        "application/wasm",
        plugin(name),
    )
    .await
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error body: {body}"))
}

#[tokio::test]
async fn keys_decide_the_tenant_and_anything_else_is_401() {
    let api = api().await;
    for key in [None, Some("thk_00000000_nope"), Some("")] {
        let (status, body) = send(&api, "GET", "/v1/tools", key, "application/json", vec![]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(error_code(&body), "unauthorized");
    }
    let (status, _) = get(&api, "/v1/tools", &api.acme).await;
    assert_eq!(status, StatusCode::OK);
    let id = &api.host.keys(Some("acme")).await.unwrap()[0].id;
    assert!(api.host.revoke_key(id).await.unwrap());
    assert_eq!(
        get(&api, "/v1/tools", &api.acme).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get(&api, "/v1/tools", &api.globex).await.0,
        StatusCode::OK,
        "other keys live on"
    );
}

#[tokio::test]
async fn a_tool_is_installed_called_versioned_and_removed_over_http() {
    let api = api().await;
    let (status, body) = install(&api, &api.acme, "text_stats").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["installed"].as_array().unwrap().len(), 2);

    let (_, body) = get(&api, "/v1/tools", &api.acme).await;
    let names: Vec<&str> = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["spec"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["text_stats", "word_frequency"]);
    let (status, body) = get(&api, "/v1/tools/text_stats", &api.acme).await;
    assert_eq!(
        (status, body["source"]["version"].as_u64()),
        (StatusCode::OK, Some(1))
    );

    let (status, body) = post_json(
        &api,
        "/v1/tools/text_stats/call",
        &api.acme,
        json!({"arguments": {"text": "one two three"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (body["ok"].as_bool(), body["result"]["words"].as_u64()),
        (Some(true), Some(3)),
        "{body}"
    );
    assert!(body["call_id"].is_string() && body["fuel_used"].as_u64().unwrap() > 0);

    let (status, body) = post_json(
        &api,
        "/v1/tools/text_stats/call",
        &api.acme,
        json!({"arguments": {"text": 1}}),
    )
    .await;
    assert_eq!(
        (status, body["ok"].as_bool()),
        (StatusCode::OK, Some(false))
    );
    assert_eq!(error_code(&body), "invalid_args");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("/text"),
        "{body}"
    );

    let (status, body) = get(&api, "/v1/tools/text_stats/versions", &api.acme).await;
    assert_eq!(
        (status, body["current"].as_u64()),
        (StatusCode::OK, Some(1))
    );
    let (status, body) =
        post_json(&api, "/v1/tools/text_stats/rollback", &api.acme, json!({})).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::CONFLICT, "no_such_version")
    );

    let (status, _) = send(
        &api,
        "DELETE",
        "/v1/tools/text_stats",
        Some(&api.acme),
        "",
        vec![],
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = post_json(&api, "/v1/tools/text_stats/call", &api.acme, json!({})).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::NOT_FOUND, "not_found")
    );
}

#[tokio::test]
async fn a_component_installs_from_a_multipart_form() {
    let api = api().await;
    let boundary = "toolhost-boundary";
    let mut form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"component\"; filename=\"u.wasm\"\r\nContent-Type: application/wasm\r\n\r\n"
    )
    .into_bytes();
    form.extend(plugin("unit_convert"));
    form.extend(format!("\r\n--{boundary}--\r\n").into_bytes());
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let (status, body) = send(
        &api,
        "POST",
        "/v1/tools",
        Some(&api.acme),
        &content_type,
        form,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["installed"][0]["name"], "convert_units");
}

#[tokio::test]
async fn another_tenants_tool_answers_exactly_like_a_missing_one() {
    let api = api().await;
    let probes = [
        ("GET", "/v1/tools/word_frequency", json!(null)),
        (
            "POST",
            "/v1/tools/word_frequency/call",
            json!({"arguments": {"text": "x"}}),
        ),
        ("GET", "/v1/tools/word_frequency/versions", json!(null)),
        (
            "POST",
            "/v1/tools/word_frequency/rollback",
            json!({"to": 1}),
        ),
        ("DELETE", "/v1/tools/word_frequency", json!(null)),
    ];
    let mut before = Vec::new();
    for (method, path, body) in &probes {
        before.push(
            send(
                &api,
                method,
                path,
                Some(&api.globex),
                "application/json",
                body.to_string().into_bytes(),
            )
            .await,
        );
    }
    install(&api, &api.acme, "text_stats").await;
    for ((method, path, body), expected) in probes.iter().zip(before) {
        let after = send(
            &api,
            method,
            path,
            Some(&api.globex),
            "application/json",
            body.to_string().into_bytes(),
        )
        .await;
        assert_eq!(after, expected, "{method} {path}");
        assert_eq!(after.0, StatusCode::NOT_FOUND, "{method} {path}");
    }
    let (_, body) = get(&api, "/v1/tools", &api.globex).await;
    assert_eq!(body["tools"], json!([]));
    let (status, _) = get(&api, "/v1/tools/word_frequency", &api.acme).await;
    assert_eq!(status, StatusCode::OK, "acme's tool is untouched");
}

/// Sends as acme and checks the error shape: status and code; returns the message.
async fn expect_error(
    api: &Api,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    status: StatusCode,
    code: &str,
) -> String {
    let (got, body) = send(api, method, path, Some(&api.acme), content_type, body).await;
    assert_eq!(
        (got, error_code(&body)),
        (status, code),
        "{method} {path}: {body}"
    );
    body["error"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn oversized_and_malformed_requests_get_the_error_shape() {
    let api = api().await;
    install(&api, &api.acme, "text_stats").await;
    let call = "/v1/tools/text_stats/call";
    let huge = json!({"arguments": {"text": "x".repeat(MAX_REQUEST_BYTES)}})
        .to_string()
        .into_bytes();
    expect_error(
        &api,
        "POST",
        call,
        "application/json",
        huge,
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
    )
    .await;
    let not_json = b"{not json".to_vec();
    expect_error(
        &api,
        "POST",
        call,
        "application/json",
        not_json,
        StatusCode::BAD_REQUEST,
        "invalid_json",
    )
    .await;

    // What axum's own extractors and router refuse comes in the one shape too.
    let message = expect_error(
        &api,
        "GET",
        "/v1/export?format=openai&format=mcp",
        "",
        vec![],
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    assert!(message.contains("duplicate field `format`"), "{message}");
    expect_error(
        &api,
        "PUT",
        "/v1/tools",
        "",
        vec![],
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    )
    .await;

    let wasm = "application/wasm";
    let too_big = vec![0u8; api.host.max_component_bytes() + 1];
    expect_error(
        &api,
        "POST",
        "/v1/tools",
        wasm,
        too_big,
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
    )
    .await;
    let garbage = b"garbage".to_vec();
    let message = expect_error(
        &api,
        "POST",
        "/v1/tools",
        wasm,
        garbage,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_component",
    )
    .await;
    assert!(message.contains("not WebAssembly"), "{message}");
    let bad_spec = plugin("bad_spec");
    expect_error(
        &api,
        "POST",
        "/v1/tools",
        wasm,
        bad_spec,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_spec",
    )
    .await;
    // A tenant tool may not take a bridge's name: MCP would list it and call the bridge.
    let shadow = json!({
        "spec": {"name": "tool_search", "description": "Shadows the bridge.",
                 "parameters": {"type": "object"}},
        "request": {"method": "get", "url": "https://api.example.com/"}
    });
    let message = expect_error(
        &api,
        "POST",
        "/v1/tools",
        "application/json",
        shadow.to_string().into_bytes(),
        StatusCode::CONFLICT,
        "name_conflict",
    )
    .await;
    assert!(
        message.contains("`tool_search`") && message.contains("reserved"),
        "{message}"
    );
    expect_error(
        &api,
        "GET",
        "/v2/nothing",
        "",
        vec![],
        StatusCode::NOT_FOUND,
        "no_route",
    )
    .await;
}

#[tokio::test]
async fn every_documented_route_exists() {
    let api = api().await;
    let (status, doc) = send(&api, "GET", "/openapi.json", None, "", vec![]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 8);
    for (path, methods) in paths {
        for method in methods.as_object().unwrap().keys() {
            let concrete = path
                .replace("{name}", "nothing_here")
                .replace("{call_id}", "no_such_call");
            let (status, body) = send(
                &api,
                &method.to_uppercase(),
                &concrete,
                Some(&api.acme),
                "application/json",
                vec![],
            )
            .await;
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            assert!(
                body["error"]["code"] != "no_route",
                "{method} {path} is documented but not routed"
            );
        }
    }
}

#[tokio::test]
async fn an_http_tool_installs_from_json() {
    let api = api().await;
    let def = |url: &str| {
        json!({
            "spec": {"name": "status", "description": "Service status.",
                     "parameters": {"type": "object"}},
            "request": {"method": "get", "url": url}
        })
    };
    let (status, body) = post_json(&api, "/v1/tools", &api.acme, def("gopher://x/")).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_spec")
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("request.url")
    );
    let (status, body) = post_json(&api, "/v1/tools", &api.acme, json!({"spec": {}})).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_json")
    );

    let (status, body) = post_json(
        &api,
        "/v1/tools",
        &api.acme,
        def("http://127.0.0.1:9/status"),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["installed"][0]["name"], "status");
    // No grant for loopback in this host: the call is refused before anything is sent.
    let (status, body) = post_json(
        &api,
        "/v1/tools/status/call",
        &api.acme,
        json!({"arguments": {}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(error_code(&body), "tool_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("egress.allow_private")
    );
    assert_eq!(
        get(&api, "/v1/tools/status", &api.globex).await.0,
        StatusCode::NOT_FOUND
    );
}

/// A tenant sees what it keeps on disk against each quota, and only its own.
#[tokio::test]
async fn usage_shows_each_quota_and_what_counts_against_it() {
    let api = api().await;
    let specs = api.host.install("acme", plugin("probe")).await.unwrap();
    let spec_bytes: usize = specs.iter().map(|s| json!(s).to_string().len()).sum();
    let (status, _) = post_json(
        &api,
        "/v1/tools/count/call",
        &api.acme,
        json!({"arguments": {"key": "k"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, usage) = get(&api, "/v1/usage", &api.acme).await;
    assert_eq!(status, StatusCode::OK, "{usage}");
    // The component once, and each of its tools' specs.
    let code_bytes = plugin("probe").len() + spec_bytes;
    assert_eq!(usage["code"]["used_bytes"], code_bytes as u64);
    assert_eq!(usage["code"]["quota_bytes"], 1u64 << 30);
    assert!(usage["data"]["used_bytes"].as_u64().unwrap() > 0, "{usage}");
    assert_eq!(usage["data"]["quota_bytes"], 256u64 << 20);
    assert_eq!(usage["files"]["used_bytes"], 0);
    let (_, other) = get(&api, "/v1/usage", &api.globex).await;
    assert_eq!(other["code"]["used_bytes"], 0);
    assert_eq!(other["data"]["used_bytes"], 0);
}

#[tokio::test]
async fn approvals_policy_and_metrics_over_http() {
    let api = api().await;
    let mut guarded = ToolSpec::new("wire_money", "Moves money.", json!({"type": "object"}));
    guarded.needs_approval = true;
    api.host
        .natives()
        .register(guarded, |_, _, _| async { Ok(json!("wired")) })
        .unwrap();
    let policy = serde_json::from_value(json!({"calls_per_minute": 600, "deny": ["admin_*"]}));
    api.host.set_policy("acme", policy.unwrap()).await.unwrap();
    let (status, body) = get(&api, "/v1/policy", &api.acme).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"calls_per_minute": 600, "deny": ["admin_*"]}));
    assert_eq!(get(&api, "/v1/policy", &api.globex).await.1, json!({}));

    let call = "/v1/tools/wire_money/call";
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, body) = post_json(&api, call, &api.acme, json!({"arguments": {}})).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(error_code(&body), "approval_required");
        ids.push(body["call_id"].as_str().unwrap().to_owned());
    }
    let (_, pending) = get(&api, "/v1/approvals", &api.acme).await;
    assert_eq!(pending["pending"].as_array().unwrap().len(), 2);
    assert_eq!(
        get(&api, "/v1/approvals", &api.globex).await.1["pending"],
        json!([])
    );

    let approve = format!("/v1/approvals/{}/approve", ids[0]);
    let (status, body) = post_json(&api, &approve, &api.globex, json!({})).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::NOT_FOUND, "not_pending")
    );
    let (status, body) = post_json(&api, &approve, &api.acme, json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&body["result"], &body["call_id"]),
        (&json!("wired"), &json!(ids[0]))
    );
    assert_eq!(
        post_json(&api, &approve, &api.acme, json!({})).await.0,
        StatusCode::NOT_FOUND
    );

    let reject = format!("/v1/approvals/{}/reject", ids[1]);
    let (status, body) = post_json(&api, &reject, &api.acme, json!({"reason": "no"})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["error"],
        json!({"code": "rejected", "message": "rejected: no"})
    );

    let (status, text) = send(&api, "GET", "/metrics", None, "", vec![]).await;
    assert_eq!(status, StatusCode::OK);
    let text = text.as_str().unwrap();
    assert!(
        text.contains("toolhost_calls_total{outcome=\"approval_required\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains("toolhost_calls_total{outcome=\"rejected\"} 1\n"),
        "{text}"
    );
    assert!(
        !text.contains("acme") && !text.contains("wire_money"),
        "names nobody"
    );
}

#[tokio::test]
async fn export_follows_each_formats_rules_and_hides_private_tools() {
    let api = api().await;
    install(&api, &api.acme, "unit_convert").await;
    let mut private = ToolSpec::new("internal_audit", "Host only.", json!({"type": "object"}));
    private.private = true;
    api.host
        .natives()
        .register(private, |_, _, _| async { Ok(Value::Null) })
        .unwrap();

    let (_, openai) = get(&api, "/v1/export?format=openai", &api.acme).await;
    let tools = openai["tools"].as_array().unwrap();
    assert_eq!(
        tools.len(),
        1,
        "the private native is not exported: {openai}"
    );
    let function = &tools[0]["function"];
    assert_eq!(
        (tools[0]["type"].as_str(), function["strict"].as_bool()),
        (Some("function"), Some(true))
    );
    assert_eq!(function["parameters"]["additionalProperties"], false);
    assert_eq!(
        function["parameters"]["required"],
        json!(["value", "from", "to"])
    );

    let (_, anthropic) = get(&api, "/v1/export?format=anthropic", &api.acme).await;
    let tool = &anthropic["tools"][0];
    let keys: Vec<&String> = tool.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["name", "description", "input_schema", "strict"]);
    assert_eq!(tool["strict"], true, "unit_convert is strict");
    assert_eq!(tool["input_schema"]["type"], "object");
    assert_eq!(tool["input_schema"]["additionalProperties"], false);

    let (_, mcp) = get(&api, "/v1/export?format=mcp", &api.acme).await;
    assert_eq!(mcp["tools"][0]["inputSchema"]["type"], "object");

    let (status, body) = get(&api, "/v1/export?format=xml", &api.acme).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::BAD_REQUEST, "bad_request")
    );
}

/// A minimal HTTP/1.1 exchange over a real socket: (status, body).
async fn http(addr: std::net::SocketAddr, request: String) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_running_calls_finish_and_refuses_new_ones() {
    let api = api().await;
    api.host.install("acme", plugin("probe")).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(toolhost_server::server::serve(
        api.host.clone(),
        listener,
        Default::default(),
        async {
            let _ = stopped.await;
        },
    ));
    let body = json!({"arguments": {"ms": 600}}).to_string();
    let request = format!(
        "POST /v1/tools/busy/call HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        api.acme,
        body.len()
    );
    let started = crate::plugins::next_call_started(&api.host);
    let running = tokio::spawn(http(addr, request));
    started.await.unwrap();
    stop.send(()).unwrap();
    let (status, body) = running.await.unwrap().unwrap();
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (body["ok"].as_bool(), body["result"].as_str()),
        (Some(true), Some("done"))
    );
    server.await.unwrap().unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}

/// `toolhost serve` owns its data directory; the CLI's operator commands reach it through the
/// admin socket, and take effect at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_manages_tenants_keys_and_policies_while_the_server_runs() {
    use std::os::unix::fs::PermissionsExt;
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().unwrap();
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_toolhost"))
            .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
            .arg("--data-dir")
            .arg(dir.path())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let addr = crate::process::free_addr();
    let mut server = Command::new(env!("CARGO_BIN_EXE_toolhost"))
        .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
        .arg("--data-dir")
        .arg(dir.path())
        .args(["serve", "--listen", &addr.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let socket = dir.path().join(toolhost_server::admin::SOCKET);
    for _ in 0..200 {
        if socket.exists() && tokio::net::TcpStream::connect(addr).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "owner-only");

    assert_eq!(
        cli(&["tenant", "create", "acme"]),
        (Some(0), "created tenant acme\n".into(), String::new())
    );
    let (code, secret, notice) = cli(&["--tenant", "acme", "key", "create", "--role", "developer"]);
    assert_eq!(code, Some(0), "{notice}");
    assert!(notice.contains("not shown again"));
    let key = secret.trim();
    let tools = |key: String| {
        http(
            addr,
            format!(
                "GET /v1/tools HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    assert_eq!(
        tools(key.into()).await.unwrap().0,
        200,
        "the new key works at once"
    );

    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, r#"{"deny": ["admin_*"]}"#).unwrap();
    let (code, _, _) = cli(&[
        "--tenant",
        "acme",
        "policy",
        "set",
        policy.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0));
    let (status, body) = http(
        addr,
        format!("GET /v1/policy HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"),
    )
    .await
    .unwrap();
    assert_eq!((status, body.as_str()), (200, r#"{"deny":["admin_*"]}"#));
    let (code, usage, stderr) = cli(&["--tenant", "acme", "usage"]);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<Vec<&str>> = usage
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines,
        [
            [
                "files",
                "0",
                "B",
                "of",
                "100.0",
                "MiB",
                "(files_quota_bytes)"
            ],
            ["data", "0", "B", "of", "256.0", "MiB", "(data_quota_bytes)"],
            ["code", "0", "B", "of", "1.0", "GiB", "(code_quota_bytes)"],
        ]
    );

    // Errors come back as the CLI's own; a command that needs the store itself says why.
    let (code, _, stderr) = cli(&["key", "revoke", "nope"]);
    assert_eq!(
        (code, stderr.trim()),
        (Some(2), "error: no key with id `nope`")
    );
    let (code, _, stderr) = cli(&["list"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("in use"), "{stderr}");

    let (_, list, _) = cli(&["--tenant", "acme", "key", "list"]);
    let id = list.split_whitespace().next().unwrap().to_owned();
    assert_eq!(cli(&["key", "revoke", &id]).0, Some(0));
    assert_eq!(tools(key.into()).await.unwrap().0, 401, "revoked at once");

    // SIGTERM: the server stops and takes its socket with it.
    let term = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    assert!(server.wait().unwrap().success());
    assert!(!socket.exists());
    assert_eq!(
        cli(&["tenant", "list"]).1,
        "acme\n",
        "and the CLI opens the store itself again"
    );
}

/// A search model that cannot load stops `serve` before it listens, naming the file at fault.
#[test]
fn serve_refuses_a_search_model_it_cannot_load() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    std::fs::write(model.join("config.json"), r#"{"model_type": "gpt2"}"#).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolhost"))
        .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["serve", "--listen", "127.0.0.1:0", "--search-model"])
        .arg(&model)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("search model: config.json"), "{stderr}");
}

/// `serve` runs eight async workers per core unless told otherwise, and refuses a count of 0.
#[test]
fn serve_runs_the_async_workers_it_is_told_to() {
    let started_with = |envs: &[(&str, &std::ffi::OsStr)]| {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let server = crate::process::Server::start(&data, crate::plugins::artifact_dir(), envs);
        server.stop();
        let log = std::fs::read_to_string(data.with_extension("serve.log")).unwrap();
        let line = log.lines().find(|l| l.starts_with("toolhost listening"));
        line.unwrap_or_else(|| panic!("no listening line: {log}"))
            .to_owned()
    };
    let cores = std::thread::available_parallelism().unwrap().get();
    let default = started_with(&[]);
    assert!(
        default.ends_with(&format!(", async workers: {})", 8 * cores)),
        "{default}"
    );
    let one = started_with(&[("TOOLHOST_ASYNC_WORKERS", "1".as_ref())]);
    assert!(one.ends_with(", async workers: 1)"), "{one}");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolhost"))
        .args(["serve", "--listen", "127.0.0.1:0", "--async-workers", "0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--async-workers"), "{stderr}");
}

/// Connections and guests' files are each a descriptor: started under the usual soft limit,
/// the server raises it to the hard one.
#[test]
fn serve_raises_its_descriptor_limit_to_the_hard_limit() {
    let dir = tempfile::tempdir().unwrap();
    let under = ["prlimit".to_owned(), "--nofile=512:".to_owned()];
    let artifacts = crate::plugins::artifact_dir();
    let server =
        crate::process::Server::start_under(&under, &dir.path().join("data"), artifacts, &[]);
    let server = server.unwrap();
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", server.child.id())).unwrap();
    server.stop();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (soft, hard) = (fields[3], fields[4]);
    assert_ne!(soft, "512", "{line}");
    assert_eq!(soft, hard, "{line}");
}

/// A server of `host` on a free port with `limits` on its connections: its address and its
/// task.
async fn serve_with(
    host: Arc<Host>,
    limits: toolhost_server::listener::ConnectionLimits,
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let options = toolhost_server::ServerOptions {
        connections: limits,
        ..Default::default()
    };
    serve_with_options(host, options).await
}

/// A server of `host` on a free port with `options`: its address and its task.
async fn serve_with_options(
    host: Arc<Host>,
    options: toolhost_server::ServerOptions,
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(toolhost_server::serve(
        host,
        listener,
        options,
        std::future::pending(),
    ));
    (addr, server)
}

/// A connection to `addr` from the loopback address `ip`.
async fn connect_from(ip: &str, addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind((ip.parse::<std::net::IpAddr>().unwrap(), 0).into())
        .unwrap();
    socket.connect(addr).await.unwrap()
}

/// The answer to `GET /healthz` on `stream`, which must come within `wait`.
async fn healthz_within(stream: &mut tokio::net::TcpStream, wait: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    stream.write_all(request).await.unwrap();
    let mut response = String::new();
    let read = tokio::time::timeout(wait, stream.read_to_string(&mut response));
    read.await.expect("answered in time").unwrap();
    response
}

/// Whether the server has closed `stream` (EOF or reset) within `wait`.
async fn closed_within(stream: &mut tokio::net::TcpStream, wait: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(wait, stream.read(&mut byte)).await;
    matches!(read, Ok(Ok(0)) | Ok(Err(_)))
}

/// Without a key, anyone could hold the listener's every connection: idle or slow ones are
/// closed, and one address can hold only its share, while others are still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_one_address_cannot_take_them_all() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (addr, server) = serve_with(
        api().await.host,
        toolhost_server::listener::ConnectionLimits {
            max_per_peer: 4,
            header_timeout: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .await;
    let from = |ip: &'static str| connect_from(ip, addr);
    let closed = |stream| closed_within(stream, Duration::from_secs(10));
    async fn healthz(stream: &mut tokio::net::TcpStream) -> String {
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    // A connection that never sends a request is closed after the header timeout.
    let mut idle = from("127.0.0.1").await;
    assert!(closed(&mut idle).await, "an idle connection stays open");

    // One address holds four; its fifth is closed at once, another address is served.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(from("127.0.0.1").await);
    }
    let mut fifth = from("127.0.0.1").await;
    assert!(
        closed(&mut fifth).await,
        "a fifth connection from one address is refused"
    );
    let mut other = from("127.0.0.2").await;
    assert!(healthz(&mut other).await.starts_with("HTTP/1.1 200"));
    drop(held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut again = from("127.0.0.1").await;
    assert!(
        healthz(&mut again).await.starts_with("HTTP/1.1 200"),
        "slots come back"
    );
    server.abort();
}

/// Connections held open cannot lock new clients out: at the cap, the address holding the
/// most gives up its oldest (at once, as it is idle), and the new client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_the_busiest_address_makes_room_for_a_new_client() {
    let (addr, server) = serve_with(
        api().await.host,
        toolhost_server::listener::ConnectionLimits {
            max_connections: 4,
            max_per_peer: 3,
            header_timeout: Duration::from_secs(60),
            ..Default::default()
        },
    )
    .await;
    let from = |ip: &'static str| connect_from(ip, addr);
    let mut busiest = Vec::new();
    for _ in 0..3 {
        busiest.push(from("127.0.0.2").await);
    }
    let mut other = from("127.0.0.3").await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let response = healthz_within(&mut from("127.0.0.4").await, Duration::from_secs(5)).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");

    let short = Duration::from_millis(300);
    assert!(
        closed_within(&mut busiest[0], short).await,
        "the busiest address's oldest"
    );
    for stream in &mut busiest[1..] {
        assert!(!closed_within(stream, short).await);
    }
    assert!(
        !closed_within(&mut other, short).await,
        "the other address keeps its one"
    );
    server.abort();
}

/// A connection serving a request never ended by itself when asked to make room at the cap
/// (a body still arriving, an MCP event stream): it is now closed after its grace, and the
/// new client gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_a_busy_connection_makes_room_within_its_grace() {
    use tokio::io::AsyncWriteExt;
    let api = api().await;
    let limits = toolhost_server::listener::ConnectionLimits {
        max_connections: 2,
        header_timeout: Duration::from_secs(60),
        evicted_grace: Duration::from_millis(300),
        ..Default::default()
    };
    let (addr, server) = serve_with(api.host.clone(), limits).await;
    // Two calls whose bodies are still on their way: each connection is serving a request.
    let mut busy = Vec::new();
    for ip in ["127.0.0.2", "127.0.0.2"] {
        let mut stream = connect_from(ip, addr).await;
        let head = format!(
            "POST /v1/tools/none/call HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{",
            api.acme
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        busy.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut newcomer = connect_from("127.0.0.3", addr).await;
    let response = healthz_within(&mut newcomer, Duration::from_secs(5)).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response:?}");
    assert!(closed_within(&mut busy[0], Duration::from_secs(1)).await);
    server.abort();
}

/// A client that asks for large responses and never reads them held the connection and the
/// responses in memory for as long as it liked: it is now closed once the client has taken
/// nothing for `write_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_responses_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let limits = toolhost_server::listener::ConnectionLimits {
        write_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let (addr, server) = serve_with(api().await.host, limits).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    // Far more than the server's socket buffer (4 MiB at most here) holds: its writes wait.
    let requests = 200;
    let one = b"GET /openapi.json HTTP/1.1\r\nHost: t\r\n\r\n";
    stream.write_all(&one.repeat(requests)).await.unwrap();
    // Not reading, past the write timeout; then what is left arrives, and no more.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut received = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut received));
    let _ = read.await.expect("the server closed the connection");
    let answered = received
        .windows(15)
        .filter(|w| w == b"HTTP/1.1 200 OK")
        .count();
    assert!(answered < requests, "{answered} of {requests} answered");
    server.abort();
}

/// A client could ask for large answers on many connections and read none of them: each held
/// its answer in the host's memory until the connection's write timeout, or forever if it read
/// a byte now and then. One tenant's unread answers now hold at most
/// `MAX_RESPONSE_BYTES_PER_TENANT`; past it its next answer is refused, and another tenant's
/// is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_unread_answers_are_bounded_and_another_tenants_are_served() {
    use toolhost_server::responses::MAX_RESPONSE_BYTES_PER_TENANT;
    let api = api().await;
    register_large_tool(&api.host);
    let (addr, server) = serve_with(api.host.clone(), Default::default()).await;
    let ask = |key: String| ask_for_large_unread(addr, key);
    let room_for = MAX_RESPONSE_BYTES_PER_TENANT / 4_000_000;
    let mut unread = Vec::new();
    let refused = loop {
        let (status, stream) = ask(api.acme.clone()).await;
        if status != "HTTP/1.1 200" || unread.len() > 2 * room_for {
            break (status, stream);
        }
        unread.push(stream);
    };
    let (status, mut stream) = refused;
    assert_eq!(
        status,
        "HTTP/1.1 429",
        "after {} unread answers",
        unread.len()
    );
    assert!(
        unread.len() >= room_for / 2,
        "{} unread answers",
        unread.len()
    );
    let mut body = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut body));
    read.await.expect("the refusal arrives").unwrap();
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.contains("rate_limited") && body.contains("MiB, its limit"),
        "{body}"
    );
    // globex's own answer is served whole.
    let (status, mut stream) = ask(api.globex.clone()).await;
    assert_eq!(status, "HTTP/1.1 200");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer));
    read.await.expect("globex's answer arrives").unwrap();
    assert!(answer.len() > 4_000_000, "{} bytes", answer.len());
    assert!(answer.ends_with(b"}"), "globex's answer was cut short");
    // Once acme's clients go, so do their answers, and acme is served again.
    drop(unread);
    let served = async {
        loop {
            if ask(api.acme.clone()).await.0 == "HTTP/1.1 200" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("acme is served once its unread answers are gone");
    server.abort();
}

/// `large`'s answer's status line, read from a client that takes only that much of it.
async fn ask_for_large_unread(
    addr: std::net::SocketAddr,
    key: String,
) -> (String, tokio::net::TcpStream) {
    let call = format!(
        "POST /v1/tools/large/call HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    stream.write_all(call.as_bytes()).await.unwrap();
    let mut status = [0; 12];
    stream.read_exact(&mut status).await.unwrap();
    (String::from_utf8_lossy(&status).into_owned(), stream)
}

/// Each tenant within its own bound, all together still hold at most what the server was
/// given: past it any tenant's next answer gets 503, and all are served once it is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_tenants_unread_answers_are_bounded_together() {
    let api = api().await;
    register_large_tool(&api.host);
    let body_memory = toolhost_server::BodyMemory {
        responses: 10_000_000,
        ..Default::default()
    };
    let options = toolhost_server::ServerOptions {
        body_memory,
        ..Default::default()
    };
    let (addr, server) = serve_with_options(api.host.clone(), options).await;
    let ask = |key: &String| ask_for_large_unread(addr, key.clone());
    // Two answers of 4 MB each, unread: acme is within its own 128 MiB.
    let (first, first_stream) = ask(&api.acme).await;
    let (second, second_stream) = ask(&api.acme).await;
    assert_eq!(
        (first.as_str(), second.as_str()),
        ("HTTP/1.1 200", "HTTP/1.1 200")
    );
    let (status, mut refused) = ask(&api.globex).await;
    assert_eq!(
        status, "HTTP/1.1 503",
        "globex's answer does not fit the server's room"
    );
    let mut body = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), refused.read_to_end(&mut body));
    read.await.expect("the refusal arrives").unwrap();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("server_memory_full"), "{body}");
    drop((first_stream, second_stream));
    let served = async {
        while ask(&api.globex).await.0 != "HTTP/1.1 200" {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("globex is served once acme's answers are gone");
    server.abort();
}

/// Each key has a role, and each route needs one: an agent's key cannot approve its own held
/// call or install tools, nor reach private tools or pass the app's `data`.
#[tokio::test]
async fn each_key_role_reaches_exactly_its_routes() {
    use toolhost::Role;
    let api = api().await;
    let key = async |role| api.host.create_key("acme", role).await.unwrap().secret;
    let (agent, developer, approver, admin) = (
        key(Role::Agent).await,
        key(Role::Developer).await,
        key(Role::Approver).await,
        key(Role::Admin).await,
    );
    let http_tool = |name: &str, extra: Value| {
        let mut spec = json!({"name": name, "description": "A test tool.",
                              "parameters": {"type": "object"}});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"spec": spec, "request": {"method": "get", "url": "http://127.0.0.1:9/"}})
    };
    let forbidden = |(status, body): (StatusCode, Value)| {
        status == StatusCode::FORBIDDEN && error_code(&body) == "forbidden"
    };

    // Installing: developers and admins.
    for (who, allowed) in [(&agent, false), (&approver, false), (&developer, true)] {
        let def = http_tool(&format!("t{}", &who[4..8]), json!({}));
        let got = post_json(&api, "/v1/tools", who, def).await;
        assert_eq!(forbidden(got.clone()), !allowed, "{got:?}");
    }
    let hidden = http_tool("hidden", json!({"private": true}));
    assert!(!forbidden(
        post_json(&api, "/v1/tools", &admin, hidden).await
    ));
    let held = http_tool("wire", json!({"needs_approval": true}));
    assert!(!forbidden(post_json(&api, "/v1/tools", &admin, held).await));

    // Calling: not approvers; private tools and `data` need more than an agent.
    let call = |tool: &str| format!("/v1/tools/{tool}/call");
    assert!(forbidden(
        post_json(&api, &call("wire"), &approver, json!({})).await
    ));
    let (status, body) = post_json(&api, &call("wire"), &agent, json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["error"]["code"], "approval_required", "{body}");
    let call_id = body["call_id"].as_str().unwrap().to_owned();
    assert!(forbidden(
        post_json(&api, &call("hidden"), &agent, json!({})).await
    ));
    assert!(!forbidden(
        post_json(&api, &call("hidden"), &developer, json!({})).await
    ));
    let with_data = json!({"arguments": {}, "data": {"user": "root"}});
    assert!(forbidden(
        post_json(&api, &call("hidden"), &developer, with_data.clone()).await
    ));
    assert!(!forbidden(
        post_json(&api, &call("hidden"), &admin, with_data).await
    ));

    // Deciding: approvers and admins; the agent cannot approve the call it made.
    let approve = format!("/v1/approvals/{call_id}/approve");
    for who in [&agent, &developer] {
        assert!(forbidden(get(&api, "/v1/approvals", who).await));
        assert!(forbidden(post_json(&api, &approve, who, json!({})).await));
    }
    let (status, pending) = get(&api, "/v1/approvals", &approver).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(pending["pending"][0]["call_id"], call_id.as_str());
    let (status, _) = post_json(&api, &approve, &approver, json!({})).await;
    assert_eq!(status, StatusCode::OK);

    // MCP is for calling tools: an approver's key is refused there too.
    let mcp = send(
        &api,
        "POST",
        "/mcp",
        Some(&approver),
        "application/json",
        b"{}".to_vec(),
    )
    .await;
    assert!(forbidden(mcp.clone()), "{mcp:?}");
}

/// A web page of another origin must not reach `/mcp` (DNS rebinding): 403, unless the
/// operator allowed that origin. Requests without `Origin` (not from a browser) and from the
/// server's own origin pass, under whatever name the server is reached by.
#[tokio::test]
async fn mcp_refuses_requests_from_other_origins() {
    let api = api().await;
    let options = toolhost_server::ServerOptions {
        allowed_origins: vec!["https://console.example.com".into()],
        ..Default::default()
    };
    let router = router(api.host.clone(), options);
    let mcp = |host: &str, origin: Option<&str>| {
        let mut request = Request::builder()
            .method("POST")
            .uri("/mcp")
            .header("host", host)
            .header("authorization", format!("Bearer {}", api.acme))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        let body = initialize_message("origins").to_string();
        tower::ServiceExt::oneshot(router.clone(), request.body(Body::from(body)).unwrap())
    };
    let refused = mcp("127.0.0.1:8080", Some("http://rebound.example:8080"));
    let refused = refused.await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error_code(&body), "forbidden_origin");
    for passes in [
        ("127.0.0.1:8080", None),
        ("127.0.0.1:8080", Some("http://127.0.0.1:8080")),
        ("127.0.0.1:8080", Some("https://console.example.com")),
        ("tools.example.com", None),
        ("10.0.0.5:8080", Some("http://10.0.0.5:8080")),
    ] {
        let response = mcp(passes.0, passes.1).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{passes:?}");
    }
}

fn session_caps(max_sessions: usize, max_per_tenant: usize) -> toolhost_server::ServerOptions {
    toolhost_server::ServerOptions {
        mcp_sessions: toolhost_server::sessions::SessionLimits {
            max_sessions,
            max_per_tenant,
            idle: Duration::from_secs(60),
        },
        ..Default::default()
    }
}

/// Each MCP session holds memory until it ends (20,000 once took 1.1 GiB): a tenant may open
/// only its share, the server only so many, and a session ended by its client frees its place.
#[tokio::test]
async fn mcp_sessions_are_capped_per_tenant_and_in_all() {
    let api = api().await;
    let router = router(api.host.clone(), session_caps(3, 2));
    let initialize = initialize_message("cap-test");
    let open = async |key: &str| mcp_send(&router, "POST", key, None, initialize.clone()).await;
    let (status, first, body) = open(&api.acme).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let first = first.expect("an initialize names its session");
    assert_eq!(open(&api.acme).await.0, StatusCode::OK);
    let (status, _, body) = open(&api.acme).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(body.contains("too_many_mcp_sessions"), "{body}");
    // A 2026-07-28 request opens no session: the caps do not hold it back.
    let list = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}}}});
    let mut sessionless = mcp_request("POST", &api.acme, None, list);
    let headers = sessionless.headers_mut();
    headers.insert("mcp-protocol-version", "2026-07-28".parse().unwrap());
    headers.insert("mcp-method", "tools/list".parse().unwrap());
    let listed = tower::ServiceExt::oneshot(router.clone(), sessionless);
    let listed = listed.await.unwrap();
    assert_eq!(listed.status(), StatusCode::OK);
    let body = listed.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("\"tools\""),
        "{body:?}"
    );
    // Another tenant still gets its own, until the server is full.
    assert_eq!(open(&api.globex).await.0, StatusCode::OK);
    let (status, _, body) = open(&api.globex).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("mcp_sessions_full"), "{body}");
    // Open sessions keep working; ending one frees its place.
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
    let (status, _, body) = mcp_send(&router, "POST", &api.acme, Some(&first), ping).await;
    assert!(status.is_success(), "{status} {body}");
    let ended = mcp_send(&router, "DELETE", &api.acme, Some(&first), json!(null)).await;
    assert_eq!(ended.0, StatusCode::NO_CONTENT);
    assert_eq!(open(&api.acme).await.0, StatusCode::OK);
}

/// A session's calls are answered in the task that reads the request, past rmcp's session
/// worker, whose idle timer would close a session it has not seen: a session in use with
/// calls alone stays open for the idle time after its last one, and then closes.
#[tokio::test]
async fn a_session_used_for_calls_alone_stays_open_for_the_idle_time_after_its_last() {
    let api = api().await;
    let clock = ToolSpec::new("clock", "Tells the time.", json!({"type": "object"}));
    (api.host.natives())
        .register(clock, |_, _, _| async { Ok(json!(42)) })
        .unwrap();
    let mut options = session_caps(10, 10);
    options.mcp_sessions.idle = Duration::from_secs(1);
    let router = router(api.host.clone(), options);
    let session = initialized_session(&router, &api.acme, "busy").await;
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "clock", "arguments": {}}});
    let call = async || mcp_send(&router, "POST", &api.acme, Some(&session), call.clone()).await;
    let started = std::time::Instant::now();
    let answered = |(status, _, body): (StatusCode, Option<String>, String)| {
        assert_eq!(
            status,
            StatusCode::OK,
            "after {:?}: {body}",
            started.elapsed()
        );
        assert!(
            body.contains("\"structuredContent\":{\"result\":42}"),
            "{body}"
        );
    };
    while started.elapsed() < Duration::from_millis(2500) {
        answered(call().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Silent for most of the idle time: still open.
    tokio::time::sleep(Duration::from_millis(700)).await;
    answered(call().await);
    // Silent past the idle time and a quarter more: closed, and the client told to start over.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let (status, _, body) = call().await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

/// Once a session is initialized, its calls run in the task that reads the request: rmcp's
/// way runs each in a task of its own (BENCHMARKS.md, "A session's requests answered in the
/// request's own task").
#[tokio::test]
async fn an_initialized_sessions_calls_run_without_a_task_of_their_own() {
    let api = api().await;
    register_slow_tool(&api.host, Duration::from_millis(600), "done");
    let router = router(api.host.clone(), session_caps(10, 10));
    let initialize = initialize_message("counted");
    let (status, session, body) = mcp_send(&router, "POST", &api.acme, None, initialize).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let session = session.unwrap();
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    // The tasks alive while a call runs, beyond those alive before it.
    let tasks_of_a_call = async || {
        let call = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": "slow", "arguments": {}}});
        let before = tasks();
        let ((status, _, body), during) = tokio::join!(
            mcp_send(&router, "POST", &api.acme, Some(&session), call),
            async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                tasks()
            }
        );
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body.contains("done"), "{body}");
        during - before
    };
    // Before `notifications/initialized`, a call takes rmcp's way.
    let by_rmcp = tasks_of_a_call().await;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let sent = mcp_send(&router, "POST", &api.acme, Some(&session), initialized).await;
    assert_eq!(sent.0, StatusCode::ACCEPTED);
    // As in `initialized_session`: in practice, the handler has registered once this is answered.
    let ping = json!({"jsonrpc": "2.0", "id": 6, "method": "ping"});
    assert_eq!(
        mcp_send(&router, "POST", &api.acme, Some(&session), ping)
            .await
            .0,
        StatusCode::OK
    );
    let in_place = tasks_of_a_call().await;
    assert!(
        in_place < by_rmcp,
        "{in_place} tasks in place, {by_rmcp} by rmcp"
    );
}

/// A call the client cancels with `notifications/cancelled` gets no answer, as the protocol
/// asks; the session's next call is answered.
#[tokio::test]
async fn a_cancelled_call_gets_no_answer() {
    let api = api().await;
    register_slow_tool(&api.host, Duration::from_millis(1000), "late");
    let router = router(api.host.clone(), session_caps(10, 10));
    let session = initialized_session(&router, &api.acme, "cancels").await;
    let call = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "slow", "arguments": {}}})
    };
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 7, "reason": "the user gave up"}});
    let ((status, _, body), cancelled) = tokio::join!(
        mcp_send(&router, "POST", &api.acme, Some(&session), call(7)),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            mcp_send(&router, "POST", &api.acme, Some(&session), cancel).await
        }
    );
    assert_eq!(cancelled.0, StatusCode::ACCEPTED, "{cancelled:?}");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        !body.contains("\"id\":7"),
        "an answer to a cancelled call: {body}"
    );
    let (status, _, body) = mcp_send(&router, "POST", &api.acme, Some(&session), call(8)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("late") && body.contains("\"id\":8"), "{body}");
}

/// Registers the native tool `slow`, which answers `result` after `taking`.
fn register_slow_tool(host: &Host, taking: Duration, result: &'static str) {
    let slow = ToolSpec::new("slow", "Takes a while.", json!({"type": "object"}));
    (host.natives())
        .register(slow, move |_, _, _| async move {
            tokio::time::sleep(taking).await;
            Ok(json!(result))
        })
        .unwrap();
}

/// Registers the native tool `large`, which answers 4 MB of text in one JSON answer: more
/// than the host's socket buffer takes at once.
fn register_large_tool(host: &Host) {
    let mut large = ToolSpec::new("large", "Answers 4 MB.", json!({"type": "object"}));
    large.limits.max_result_chars = 1 << 20;
    let text = "\u{1D11E}".repeat(1_000_000);
    (host.natives())
        .register(large, move |_, _, _| {
            let text = text.clone();
            async move { Ok(json!(text)) }
        })
        .unwrap();
}

/// An MCP answer in a session's stream is charged as it goes out: with its tenant's room full
/// of unread answers, the stream ends before the answer, and carries it once they are read.
#[tokio::test]
async fn an_mcp_answer_past_its_tenants_room_ends_its_stream() {
    let api = api().await;
    register_large_tool(&api.host);
    let session = initialized_session(&api.router, &api.acme, "full").await;
    let rest_call = || {
        Request::post("/v1/tools/large/call")
            .header("authorization", format!("Bearer {}", api.acme))
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .unwrap()
    };
    // Answers handed back and never read, as from clients that read none.
    let mut unread = Vec::new();
    loop {
        let answer = tower::ServiceExt::oneshot(api.router.clone(), rest_call());
        let answer = answer.await.unwrap();
        if answer.status() == StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        assert_eq!(answer.status(), StatusCode::OK);
        unread.push(answer);
        assert!(unread.len() < 100, "no answer is refused");
    }
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "large", "arguments": {}}});
    let request = mcp_request("POST", &api.acme, Some(&session), call.clone());
    let answer = tower::ServiceExt::oneshot(api.router.clone(), request);
    let answer = answer.await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let cut = answer.into_body().collect().await;
    assert!(cut.is_err(), "the stream ended before its answer");
    drop(unread);
    let (status, _, body) = mcp_send(&api.router, "POST", &api.acme, Some(&session), call).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("\u{1D11E}\u{1D11E}"),
        "{}",
        &body[..body.len().min(300)]
    );
}

/// A session initialized (`initialize`, then `notifications/initialized`) for `key`.
async fn initialized_session(router: &Router, key: &str, client: &str) -> String {
    let initialize = initialize_message(client);
    let (status, session, body) = mcp_send(router, "POST", key, None, initialize).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let session = session.unwrap();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let sent = mcp_send(router, "POST", key, Some(&session), initialized).await;
    assert_eq!(sent.0, StatusCode::ACCEPTED);
    // rmcp handles the notification in a task of its own, after its 202; the handler registers
    // before its first await, and this ping, taking rmcp's way, comes after that in practice.
    let ping = json!({"jsonrpc": "2.0", "id": 0, "method": "ping"});
    let pong = mcp_send(router, "POST", key, Some(&session), ping).await;
    assert_eq!(pong.0, StatusCode::OK, "{pong:?}");
    session
}

/// Each `notifications/initialized` started a task that watched the tenant's tools until the
/// session ended, and a client may send it again and again: one session now has one watch.
#[tokio::test]
async fn a_session_watches_its_tenants_tools_once_however_often_it_says_initialized() {
    let api = api().await;
    let router = router(api.host.clone(), session_caps(10, 10));
    let initialize = initialize_message("chatty");
    let (status, session, body) = mcp_send(&router, "POST", &api.acme, None, initialize).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let session = session.unwrap();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let say_initialized = async |times: usize| {
        for _ in 0..times {
            let sent = mcp_send(
                &router,
                "POST",
                &api.acme,
                Some(&session),
                initialized.clone(),
            );
            assert_eq!(sent.await.0, StatusCode::ACCEPTED);
        }
        // The session's task handles each notification after its 202.
        let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
        let pong = mcp_send(&router, "POST", &api.acme, Some(&session), ping).await;
        assert!(pong.0.is_success(), "{pong:?}");
    };
    say_initialized(1).await;
    let watching = tasks();
    say_initialized(50).await;
    assert!(
        tasks() <= watching + 2,
        "{watching} tasks, then {}",
        tasks()
    );
}

/// An unknown tool's name or a bad cursor was quoted back whole in the error, which rmcp also
/// logs: a megabyte of log for each request a client liked to send. Only their start is.
#[tokio::test]
async fn mcp_errors_quote_only_the_start_of_what_the_client_sent() {
    let api = api().await;
    let router = router(api.host.clone(), session_caps(10, 10));
    let initialize = initialize_message("long");
    let (_, session, _) = mcp_send(&router, "POST", &api.acme, None, initialize).await;
    let long = "x".repeat(100_000);
    for (method, params) in [
        ("tools/call", json!({"name": long, "arguments": {}})),
        ("tools/list", json!({"cursor": long})),
    ] {
        let request = json!({"jsonrpc": "2.0", "id": 2, "method": method, "params": params});
        let (_, _, body) = mcp_send(&router, "POST", &api.acme, session.as_deref(), request).await;
        assert!(body.contains("-32602"), "{method}: {body}");
        assert!(body.len() < 1000, "{method}: {} bytes", body.len());
    }
}

/// hyper drops a request's future when its client goes. An `initialize` dropped while rmcp
/// answers it still has the session rmcp opened counted under the caps: it was not, so a
/// client that hung up at that moment opened sessions past them.
#[tokio::test]
async fn a_session_whose_client_went_during_initialize_still_counts() {
    let api = api().await;
    let router = router(api.host.clone(), session_caps(10, 1));
    let initialize = initialize_message("gone");
    // The key is known from here on: the request reaches rmcp in its first poll.
    assert_eq!(get(&api, "/v1/whoami", &api.acme).await.0, StatusCode::OK);
    let request = mcp_request("POST", &api.acme, None, initialize.clone());
    let mut gone = Box::pin(tower::ServiceExt::oneshot(router.clone(), request));
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(gone.as_mut().poll(cx))).await;
    assert!(first.is_pending(), "dropped before it was answered");
    drop(gone);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, _, body) = mcp_send(&router, "POST", &api.acme, None, initialize).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(body.contains("too_many_mcp_sessions"), "{body}");
}

/// Every keyed route of the OpenAPI document against every role: a route answers 403
/// `forbidden` exactly when the role lacks the access the route needs. A route added to the
/// document without an entry here fails the test, so the table stays complete.
#[tokio::test]
async fn every_keyed_route_checks_the_role_it_needs() {
    use toolhost::{Access, Role};
    let api = api().await;
    let needs: std::collections::BTreeMap<(&str, &str), Access> = [
        (("GET", "/v1/tools"), Access::Read),
        (("POST", "/v1/tools"), Access::Manage),
        (("GET", "/v1/tools/{name}"), Access::Read),
        (("DELETE", "/v1/tools/{name}"), Access::Manage),
        (("GET", "/v1/tools/{name}/versions"), Access::Manage),
        (("POST", "/v1/tools/{name}/rollback"), Access::Manage),
        (("POST", "/v1/tools/{name}/call"), Access::Call),
        (("GET", "/v1/whoami"), Access::Read),
        (("GET", "/v1/search"), Access::Read),
        (("GET", "/v1/calls"), Access::Manage),
        (("GET", "/v1/calls/{call_id}"), Access::Call),
        (("GET", "/v1/stats"), Access::Manage),
        (("GET", "/v1/export"), Access::Read),
        (("GET", "/v1/policy"), Access::Manage),
        (("GET", "/v1/usage"), Access::Manage),
        (("GET", "/v1/config"), Access::Manage),
        (("PUT", "/v1/config/{key}"), Access::Manage),
        (("DELETE", "/v1/config/{key}"), Access::Manage),
        (("GET", "/v1/approvals"), Access::Decide),
        (("POST", "/v1/approvals/{call_id}/approve"), Access::Decide),
        (("POST", "/v1/approvals/{call_id}/reject"), Access::Decide),
        (("POST", "/mcp"), Access::Call),
        (("GET", "/mcp"), Access::Call),
        (("DELETE", "/mcp"), Access::Call),
    ]
    .into_iter()
    .collect();
    let (_, document) = send(&api, "GET", "/openapi.json", None, "", vec![]).await;
    let mut keyed = Vec::new();
    for (path, operations) in document["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            if operation["security"][0].get("apiKey").is_some() {
                keyed.push((method.to_uppercase(), path.clone()));
            }
        }
    }
    let listed: Vec<(String, String)> = needs
        .keys()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    keyed.sort();
    let mut expected = listed.clone();
    expected.sort();
    assert_eq!(keyed, expected, "the table must cover every keyed route");

    for role in [Role::Agent, Role::Developer, Role::Approver, Role::Admin] {
        let key = api.host.create_key("acme", role).await.unwrap().secret;
        for ((method, path), access) in &needs {
            let uri = path
                .replace("{name}", "nothing")
                .replace("{call_id}", "c1")
                .replace("{key}", "NOTHING");
            let (status, body) = send(
                &api,
                method,
                &uri,
                Some(&key),
                "application/json",
                b"{}".to_vec(),
            )
            .await;
            let forbidden = status == StatusCode::FORBIDDEN && error_code(&body) == "forbidden";
            assert_eq!(
                forbidden,
                !role.may(*access),
                "{role:?} {method} {path}: {status} {body}"
            );
        }
    }
}

/// A `tools/call` whose params are malformed is JSON-RPC's -32602 (invalid params), naming
/// what is wrong; rmcp alone answered -32601 (method not found). A well-formed call still
/// reaches the tool.
#[tokio::test]
async fn malformed_tools_call_params_are_invalid_params() {
    let api = api().await;
    api.host
        .install("acme", crate::plugins::plugin("text_stats"))
        .await
        .unwrap();
    let router = router(api.host.clone(), Default::default());
    let mcp = async |session: Option<&str>, body: Value| {
        let (_, session, body) = mcp_send(&router, "POST", &api.acme, session, body).await;
        (session, body)
    };
    let session = mcp(None, initialize_message("params-test"))
        .await
        .0
        .unwrap();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    mcp(Some(&session), initialized).await;
    for (params, says) in [
        (json!({"name": 5}), "invalid type"),
        (json!({"arguments": {}}), "missing field `name`"),
        (
            json!({"name": "text_stats", "arguments": [1]}),
            "invalid type",
        ),
    ] {
        let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params});
        let (_, body) = mcp(Some(&session), call).await;
        let reply: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{body}"));
        assert_eq!(reply["id"], 7, "{body}");
        assert_eq!(reply["error"]["code"], -32602, "{body}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    let call = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                      "params": {"name": "text_stats", "arguments": {"text": "a b"}}});
    let (_, body) = mcp(Some(&session), call).await;
    assert!(
        body.contains(r#"\"words\": 2"#) || body.contains(r#"\"words\":2"#),
        "{body}"
    );
}

/// An MCP `initialize` from a client named `client`.
fn initialize_message(client: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": client, "version": "1"}}})
}

/// One request to `/mcp` with `key`, in `session` if given: the status, the session the
/// answer names, and the whole body.
async fn mcp_send(
    router: &Router,
    method: &str,
    key: &str,
    session: Option<&str>,
    body: Value,
) -> (StatusCode, Option<String>, String) {
    let request = mcp_request(method, key, session, body);
    let response = tower::ServiceExt::oneshot(router.clone(), request)
        .await
        .unwrap();
    let status = response.status();
    let session = response
        .headers()
        .get("mcp-session-id")
        .map(|id| id.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, session, String::from_utf8_lossy(&body).into_owned())
}

fn mcp_request(method: &str, key: &str, session: Option<&str>, body: Value) -> Request<Body> {
    let mut request = Request::builder()
        .method(method)
        .uri("/mcp")
        .header("host", "127.0.0.1:8080")
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18");
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    request.body(Body::from(body.to_string())).unwrap()
}

/// A developer's key sets its tenant's configuration over HTTP; a secret is never shown
/// again, and another tenant's configuration is out of reach.
#[tokio::test]
async fn developers_set_their_tenants_configuration_over_http() {
    let api = api().await;
    let developer = api
        .host
        .create_key("acme", toolhost::Role::Developer)
        .await
        .unwrap()
        .secret;
    let put = async |key: &str, body: Value| {
        let path = format!("/v1/config/{key}");
        let body = body.to_string().into_bytes();
        send(
            &api,
            "PUT",
            &path,
            Some(&developer),
            "application/json",
            body,
        )
        .await
    };
    assert_eq!(
        put("REGION", json!({"value": "eu"})).await.0,
        StatusCode::NO_CONTENT
    );
    let secret = json!({"value": "s3cr3t-token", "secret": true});
    assert_eq!(put("API_TOKEN", secret).await.0, StatusCode::NO_CONTENT);
    let (status, body) = put("bad%20key!", json!({"value": "x"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, listed) = get(&api, "/v1/config", &developer).await;
    assert_eq!(status, StatusCode::OK);
    let text = listed.to_string();
    assert!(!text.contains("s3cr3t-token"), "{text}");
    assert!(
        text.contains(r#"{"key":"REGION","secret":false,"value":"eu"}"#),
        "{text}"
    );
    assert!(
        text.contains(r#"{"key":"API_TOKEN","secret":true,"value":null}"#),
        "{text}"
    );
    // Another tenant's key sees only its own.
    let (_, theirs) = get(&api, "/v1/config", &api.globex).await;
    assert_eq!(theirs["config"], json!([]));
    // Keys are bounded: past the last, a new one is refused and a set one still changes.
    for n in 2..toolhost::MAX_CONFIG_KEYS {
        let key = format!("K{n}");
        api.host.set_config("acme", &key, "v", false).await.unwrap();
    }
    let (status, body) = put("ONE_MORE", json!({"value": "x"})).await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    assert_eq!(
        put("REGION", json!({"value": "us"})).await.0,
        StatusCode::NO_CONTENT
    );
    let delete = || {
        send(
            &api,
            "DELETE",
            "/v1/config/REGION",
            Some(&developer),
            "application/json",
            vec![],
        )
    };
    assert_eq!(delete().await.0, StatusCode::NO_CONTENT);
    assert_eq!(delete().await.0, StatusCode::NOT_FOUND);
}

/// Schemathesis (`tests/openapi`) runs every operation of the served OpenAPI document, `/mcp`
/// included, with generated requests (valid ones, invalid ones, and sequences of them), and
/// checks each answer against the document: status, content type, headers and body schema,
/// every error in the one error shape, no 5xx, invalid input refused, valid input taken.
/// A fixed seed keeps the run the same from one CI run to the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_answers_as_the_openapi_document_says() {
    let data = tempfile::tempdir().unwrap();
    let host = Arc::new(
        Host::open(toolhost::HostConfig {
            data_dir: Some(data.path().to_owned()),
            ..crate::plugins::config()
        })
        .await
        .unwrap(),
    );
    for name in ["text_stats", "unit_convert"] {
        host.install("acme", plugin(name)).await.unwrap();
    }
    let served = crate::mcp::serve_for_acme(host, toolhost::Role::Admin).await;
    let base = served.url.trim_end_matches("/mcp");
    let root = crate::plugins::root();
    let run = tokio::process::Command::new("python3")
        .args([
            "-c",
            "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())",
        ])
        .arg("--config-file")
        .arg(root.join("tests/openapi/schemathesis.toml"))
        .args(["--no-color", "run", &format!("{base}/openapi.json")])
        .args(["--header", &format!("Authorization: Bearer {}", served.key)])
        .args(["--seed", "20261201"])
        .current_dir(data.path())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("schemathesis ends within 5 minutes")
        .expect("python3 is installed");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains(" passed"), "it ran: {report}");
    served.stop.send(()).unwrap();
    served.server.await.unwrap().unwrap();
}

/// What the console reads: who the key is, the agents' search, the recent calls with their
/// arguments and typed errors, and the per-minute figures; each only of the key's tenant.
#[tokio::test]
async fn the_console_routes_answer_for_the_key_s_tenant_only() {
    let api = api().await;
    api.host
        .install("acme", plugin("text_stats"))
        .await
        .unwrap();
    api.host
        .install("globex", plugin("unit_convert"))
        .await
        .unwrap();

    let (status, me) = get(&api, "/v1/whoami", &api.acme).await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(
        (me["tenant"].as_str(), me["role"].as_str()),
        (Some("acme"), Some("admin"))
    );
    assert_eq!(me["may"].as_array().unwrap().len(), 6, "{me}");
    assert!(
        me["stdio"].is_null(),
        "no stdio command was configured: {me}"
    );
    let agent = api
        .host
        .create_key("acme", toolhost::Role::Agent)
        .await
        .unwrap()
        .secret;
    let (_, me) = get(&api, "/v1/whoami", &agent).await;
    assert_eq!(me["may"], json!(["read", "call"]));

    let (status, found) = get(&api, "/v1/search?q=count%20the%20words&limit=3", &api.acme).await;
    assert_eq!(status, StatusCode::OK, "{found}");
    let names: Vec<&str> = found["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"text_stats"), "{found}");
    assert!(
        !names.iter().any(|n| n.contains("convert")),
        "globex's tools stay out: {found}"
    );
    assert_eq!(
        get(&api, "/v1/search?q=", &api.acme).await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        get(&api, "/v1/search?q=x&limit=0", &api.acme).await.0,
        StatusCode::BAD_REQUEST
    );

    let call = |args: Value| {
        post_json(
            &api,
            "/v1/tools/text_stats/call",
            &api.acme,
            json!({"arguments": args}),
        )
    };
    let (_, ok) = call(json!({"text": "one two"})).await;
    assert_eq!(ok["ok"], true, "{ok}");
    let (_, bad) = call(json!({"text": 5})).await;
    assert_eq!(bad["error"]["code"], "invalid_args");
    assert_eq!(
        bad["error"]["errors"][0]["path"], "/text",
        "the field at fault: {bad}"
    );
    post_json(&api, "/v1/tools/nothing/call", &api.acme, json!({})).await;

    let (status, calls) = get(&api, "/v1/calls", &api.acme).await;
    assert_eq!(status, StatusCode::OK, "{calls}");
    let calls = calls["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "a made-up tool is not kept: {calls:?}");
    assert_eq!(calls[0]["arguments"], json!({"text": 5}), "newest first");
    assert_eq!(calls[0]["version"], 1);
    assert_eq!(calls[1]["result"], ok["result"]);
    assert!(calls[1]["at_ms"].as_u64().unwrap() > 0);
    let (_, only) = get(&api, "/v1/calls?outcome=invalid_args", &api.acme).await;
    assert_eq!(only["calls"].as_array().unwrap().len(), 1);
    let (_, none) = get(&api, "/v1/calls?tool=unit_convert", &api.acme).await;
    assert_eq!(none["calls"], json!([]));
    let (_, theirs) = get(&api, "/v1/calls", &api.globex).await;
    assert_eq!(
        theirs["calls"],
        json!([]),
        "globex sees none of acme's calls"
    );

    let (status, stats) = get(&api, "/v1/stats?minutes=5", &api.acme).await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    assert_eq!(stats["tools"][0]["tool"], "text_stats", "{stats}");
    let points = stats["tools"][0]["points"].as_array().unwrap();
    let calls: u64 = points.iter().map(|p| p["calls"].as_u64().unwrap()).sum();
    let errors: u64 = points.iter().map(|p| p["errors"].as_u64().unwrap()).sum();
    assert_eq!((calls, errors), (2, 1), "{stats}");
    assert!(points[0]["p99_ms"].as_f64().unwrap() > 0.0);
    let (_, theirs) = get(&api, "/v1/stats", &api.globex).await;
    assert_eq!(theirs["tools"], json!([]));
}

/// The console is served at `/` with a policy that keeps its page to this server, or, in a
/// build without it, a page that says how to build it; other paths stay the API's 404.
#[tokio::test]
async fn the_console_is_served_at_the_root() {
    let api = api().await;
    let request = Request::get("/").body(Body::empty()).unwrap();
    let response = tower::ServiceExt::oneshot(api.router.clone(), request)
        .await
        .unwrap();
    let built = crate::plugins::root()
        .join("console/dist/index.html")
        .exists();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    if built {
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(
            headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("default-src 'self'") && csp.contains("frame-ancestors 'none'"),
            "{csp}"
        );
        assert!(body.contains("<script"), "{body}");
    } else {
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("scripts/build-console"), "{body}");
    }
    let (status, body) = get(&api, "/nothing/here", &api.acme).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "no_route");
    let (status, _) = send(&api, "POST", "/", None, "text/plain", vec![]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
