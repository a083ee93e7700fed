//! MCP, driven by the official TypeScript SDK client (`tests/mcp-client`, installed by
//! `npm ci` in scripts/test): Streamable HTTP with API keys, pagination, tool results and
//! errors, `tools/list_changed`, and stdio.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use crate::plugins::{plugin, root};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use toolhost::{Host, HostConfig, ToolSpec};

fn client_dir() -> PathBuf {
    let dir = root().join("tests/mcp-client");
    assert!(
        dir.join("node_modules/@modelcontextprotocol/sdk").exists(),
        "run `npm ci --prefix tests/mcp-client` first (scripts/test does)"
    );
    dir
}

async fn next_step(lines: &mut Lines<BufReader<ChildStdout>>, step: &str) -> Value {
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("no `{step}` from the MCP client within 60 s"))
        .unwrap()
        .unwrap_or_else(|| panic!("the MCP client exited before `{step}`"));
    let value: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"));
    assert_eq!(value["step"], step, "{value}");
    value
}

/// The next message `toolhost mcp` writes, within 30 s.
async fn next_message(lines: &mut Lines<BufReader<ChildStdout>>) -> Value {
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("toolhost mcp answers within 30 s")
        .unwrap()
        .expect("toolhost mcp is still running");
    serde_json::from_str(&line).unwrap()
}

/// A host served on a loopback port until `stop` is sent, with a key of `acme`'s and the MCP
/// URL.
pub(crate) struct Served {
    pub(crate) host: Arc<Host>,
    pub(crate) key: String,
    pub(crate) url: String,
    pub(crate) stop: tokio::sync::oneshot::Sender<()>,
    pub(crate) server: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// A host with `text_stats` installed for `acme`, served with an agent key.
async fn served() -> Served {
    let host = Arc::new(Host::open(crate::plugins::config()).await.unwrap());
    host.install("acme", plugin("text_stats")).await.unwrap();
    serve_for_acme(host, toolhost::Role::Agent).await
}

/// Serves `host` with a new key of `acme`'s in `role`.
pub(crate) async fn serve_for_acme(host: Arc<Host>, role: toolhost::Role) -> Served {
    host.create_tenant("acme").await.unwrap();
    let key = host.create_key("acme", role).await.unwrap().secret;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(toolhost_server::server::serve(
        host.clone(),
        listener,
        Default::default(),
        async {
            let _ = stopped.await;
        },
    ));
    Served {
        host,
        key,
        url,
        stop,
        server,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_client_lists_pages_calls_and_hears_of_changes_over_http() {
    let Served {
        host,
        key,
        url,
        stop,
        server,
    } = served().await;
    // 60 natives (visible to every tenant) push the listing past one page.
    for i in 0..60 {
        let spec = ToolSpec::new(
            format!("native_{i:02}"),
            "A native tool.",
            json!({"type": "object"}),
        );
        host.natives()
            .register(spec, |_, _, _| async { Ok(json!(null)) })
            .unwrap();
    }

    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let request =
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
    tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut response)
        .await
        .unwrap();
    assert!(
        response.starts_with("HTTP/1.1 401"),
        "MCP without a key: {response}"
    );
    assert!(response.contains("\"unauthorized\""), "{response}");

    let mut child = Command::new("node")
        .arg("client.mjs")
        .args(["http", &url, &key])
        .current_dir(client_dir())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node is installed");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();

    let init = next_step(&mut lines, "initialized").await;
    assert_eq!(init["server"]["name"], "toolhost");
    assert_eq!(init["capabilities"]["tools"]["listChanged"], true);

    let listed = next_step(&mut lines, "listed").await;
    assert_eq!(listed["pages"], 2, "62 tools at 50 a page");
    assert_eq!(listed["names"].as_array().unwrap().len(), 62);
    let text_stats = listed["names"]
        .as_array()
        .unwrap()
        .iter()
        .position(|n| n == "text_stats");
    assert!(text_stats.is_some(), "{listed}");

    let called = next_step(&mut lines, "called").await;
    let result = &called["result"];
    assert_eq!(result["isError"], false);
    assert_eq!(result["structuredContent"]["words"], 3);
    let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text, result["structuredContent"]);

    // Nagle's algorithm against a client's delayed ACK costs >= 40 ms on every request of a
    // kept-alive connection unless the server sets TCP_NODELAY: even the fastest of five
    // pings would be that slow. Python's http.client is such a client (Node's fetch sets
    // TCP_NODELAY on its own side, which hides the problem).
    let keepalive = Command::new("python3")
        .arg(client_dir().join("keepalive.py"))
        .args([&addr, &key])
        .output()
        .await
        .expect("python3 is installed");
    let stdout = String::from_utf8_lossy(&keepalive.stdout);
    assert!(
        keepalive.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&keepalive.stderr)
    );
    let fastest: f64 = stdout.trim().parse().unwrap();
    assert!(
        fastest < 20.0,
        "fastest MCP ping on a kept-alive connection: {fastest} ms"
    );

    let bad = next_step(&mut lines, "bad_args").await;
    assert_eq!(bad["result"]["isError"], true);
    assert!(
        bad["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("error[invalid_args]")
    );

    let unknown = next_step(&mut lines, "unknown").await;
    assert_eq!(
        unknown["threw"], true,
        "an unknown tool is a JSON-RPC error: {unknown}"
    );
    assert!(
        unknown["message"].as_str().unwrap().contains("-32602"),
        "{unknown}"
    );

    next_step(&mut lines, "waiting").await;
    host.install("globex", plugin("unit_convert"))
        .await
        .unwrap(); // not acme's: no notice
    host.install("acme", plugin("unit_convert")).await.unwrap();
    let changed = next_step(&mut lines, "changed").await;
    assert_eq!(changed["count"], 63);
    next_step(&mut lines, "closed").await;
    assert!(child.wait().await.unwrap().success());

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server stops even with MCP sessions open")
        .unwrap()
        .unwrap();
}

/// A data directory where tenant `acme` has `tool` installed, under `policy` if one is
/// given; no host holds it open, so `toolhost mcp` can.
async fn acme_data_dir(tool: &str, policy: Option<Value>) -> tempfile::TempDir {
    let data = tempfile::tempdir().unwrap();
    let host = Host::open(HostConfig {
        data_dir: Some(data.path().to_owned()),
        ..crate::plugins::config()
    })
    .await
    .unwrap();
    host.install("acme", plugin(tool)).await.unwrap();
    if let Some(policy) = policy {
        let policy = serde_json::from_value(policy).unwrap();
        host.set_policy("acme", policy).await.unwrap();
    }
    data
}

/// `toolhost mcp` for tenant `acme` on `data`, its stdin and stdout piped to the test.
fn toolhost_mcp(data: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_toolhost"))
        .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
        .arg("--data-dir")
        .arg(data)
        .arg("--js-runtime")
        .arg(crate::plugins::js_runtime_path())
        .args(["--tenant", "acme", "mcp"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// `toolhost mcp` for tenant `acme` (with `text_stats` installed), driven by the official
/// client over stdio; the data directory lives as long as the returned guard.
async fn stdio_client(
    extra: &[&str],
    wait_for_change: bool,
) -> (tempfile::TempDir, Child, Lines<BufReader<ChildStdout>>) {
    let data = acme_data_dir("text_stats", None).await;
    let mut client = Command::new("node");
    if wait_for_change {
        client.env("WAIT_FOR_CHANGE", "1");
    }
    let mut child = client
        .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
        .arg("client.mjs")
        .args([
            "stdio",
            env!("CARGO_BIN_EXE_toolhost"),
            data.path().to_str().unwrap(),
            "acme",
        ])
        .args(extra)
        .current_dir(client_dir())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node is installed");
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (data, child, lines)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_client_talks_to_toolhost_mcp_over_stdio() {
    let (data, mut child, mut lines) = stdio_client(&[], true).await;
    next_step(&mut lines, "initialized").await;
    let listed = next_step(&mut lines, "listed").await;
    assert_eq!(listed["names"], json!(["text_stats", "word_frequency"]));
    assert_eq!(listed["first"]["_meta"]["toolhost/group"], "text");
    let called = next_step(&mut lines, "called").await;
    assert_eq!(called["result"]["structuredContent"]["words"], 3);
    assert_eq!(
        next_step(&mut lines, "bad_args").await["result"]["isError"],
        true
    );
    assert_eq!(next_step(&mut lines, "unknown").await["threw"], true);
    // `toolhost mcp` owns the data directory: the CLI's install reaches it through its admin
    // socket, and the client hears of it.
    next_step(&mut lines, "waiting").await;
    let component = crate::plugins::plugins_dir().join("unit_convert.wasm");
    let installed = Command::new(env!("CARGO_BIN_EXE_toolhost"))
        .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
        .arg("--data-dir")
        .arg(data.path())
        .args(["--tenant", "acme", "install"])
        .arg(component)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&installed.stdout);
    assert!(
        installed.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&installed.stderr)
    );
    assert_eq!(stdout, "installed convert_units\n");
    assert_eq!(next_step(&mut lines, "changed").await["count"], 3);
    next_step(&mut lines, "closed").await;
    assert!(child.wait().await.unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_disclosure_on_the_client_sees_the_bridges_and_can_still_call_found_tools() {
    let (_data, mut child, mut lines) = stdio_client(&["--disclosure", "on"], false).await;
    next_step(&mut lines, "initialized").await;
    let listed = next_step(&mut lines, "listed").await;
    assert_eq!(
        listed["names"],
        json!(["tool_search", "tool_describe", "tool_call"])
    );
    let called = next_step(&mut lines, "called").await;
    assert_eq!(
        called["result"]["structuredContent"]["words"], 3,
        "{called}"
    );
    next_step(&mut lines, "bad_args").await;
    assert_eq!(next_step(&mut lines, "unknown").await["threw"], true);
    next_step(&mut lines, "closed").await;
    assert!(child.wait().await.unwrap().success());
}

/// The official Python SDK's default `Client`, in its `auto` mode (which negotiates the
/// newest version, 2026-07-28) and its `legacy` mode, over Streamable HTTP: it lists, calls,
/// and hears of its tenant's changes (`subscriptions/listen` on 2026-07-28, the
/// `list_changed` notification before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_lists_calls_and_hears_of_changes_in_every_mode_over_http() {
    for (mode, newest) in [("auto", true), ("legacy", false)] {
        let Served {
            host,
            key,
            url,
            stop,
            server,
        } = served().await;
        let mut child = Command::new("python3")
            .arg(client_dir().join("python_client.py"))
            .args([mode, "http", &url, &key])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 is installed");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();

        let init = next_step(&mut lines, "initialized").await;
        let protocol = init["protocol"].as_str().unwrap().to_owned();
        assert_eq!(protocol == "2026-07-28", newest, "{mode}: {protocol}");
        let listed = next_step(&mut lines, "listed").await;
        assert_eq!(listed["names"], json!(["text_stats", "word_frequency"]));
        let called = next_step(&mut lines, "called").await;
        assert_eq!(
            called["result"]["structuredContent"]["words"], 3,
            "{called}"
        );
        let bad = next_step(&mut lines, "bad_args").await;
        assert_eq!(bad["result"]["isError"], true, "{bad}");

        next_step(&mut lines, "listening").await;
        host.install("globex", plugin("unit_convert"))
            .await
            .unwrap(); // not acme's
        host.install("acme", plugin("unit_convert")).await.unwrap();
        let changed = next_step(&mut lines, "changed").await;
        assert_eq!(changed["count"], 3, "{mode}: {changed}");
        next_step(&mut lines, "closed").await;
        let mut stderr = String::new();
        use tokio::io::AsyncReadExt;
        let mut pipe = child.stderr.take().unwrap();
        pipe.read_to_string(&mut stderr).await.unwrap();
        assert!(child.wait().await.unwrap().success(), "{mode}: {stderr}");
        // Ending the session is a success to the client (rmcp's 202 was logged as a failure).
        assert!(!stderr.contains("termination failed"), "{mode}: {stderr}");
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}

/// The same client over stdio (`toolhost mcp`), on the newest version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_lists_and_calls_over_stdio() {
    let data = acme_data_dir("text_stats", None).await;
    let mut child = Command::new("python3")
        .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
        .arg(client_dir().join("python_client.py"))
        .args(["auto", "stdio", env!("CARGO_BIN_EXE_toolhost")])
        .arg(data.path())
        .arg("acme")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 is installed");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let init = next_step(&mut lines, "initialized").await;
    assert_eq!(init["protocol"], "2026-07-28");
    let listed = next_step(&mut lines, "listed").await;
    assert_eq!(listed["names"], json!(["text_stats", "word_frequency"]));
    let called = next_step(&mut lines, "called").await;
    assert_eq!(
        called["result"]["structuredContent"]["words"], 3,
        "{called}"
    );
    assert_eq!(
        next_step(&mut lines, "bad_args").await["result"]["isError"],
        true
    );
    next_step(&mut lines, "closed").await;
    assert!(child.wait().await.unwrap().success());
}

/// `notifications/cancelled`, sent by the official client when its call is aborted, stops the
/// running call: its outcome is `cancelled`, and with `max_concurrent: 1` the tenant's next
/// call runs at once, which it could not while the first (20 s of busy work) still ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_client_cancels_stops_running() {
    let Served {
        host,
        key,
        url,
        stop,
        server,
    } = served().await;
    host.install("acme", plugin("probe")).await.unwrap();
    let policy = serde_json::from_value(json!({"max_concurrent": 1})).unwrap();
    host.set_policy("acme", policy).await.unwrap();
    let out = Command::new("node")
        .arg("cancel.mjs")
        .args([&url, &key])
        .current_dir(client_dir())
        .output()
        .await
        .expect("node is installed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(report["aborted"].is_string(), "{report}");
    assert_eq!(report["next"]["isError"], false, "{report}");
    assert!(report["nextAfterMs"].as_u64().unwrap() < 10_000, "{report}");
    let metrics = host.metrics().render();
    assert!(
        metrics.contains("toolhost_calls_total{outcome=\"cancelled\"} 1\n"),
        "{metrics}"
    );
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// `toolhost mcp` answers its client on one thread, yet a call busy for 20 s holds up
/// neither the client's `ping` (the guest yields to other requests at each epoch) nor, once
/// the client cancels it, the tenant's one concurrent place (`max_concurrent: 1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_stdio_a_long_call_holds_up_neither_a_ping_nor_the_next_call_after_its_cancel() {
    use tokio::io::AsyncWriteExt;
    let data = acme_data_dir("probe", Some(json!({"max_concurrent": 1}))).await;
    let mut child = toolhost_mcp(data.path());
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = async |message: Value| {
        let line = format!("{message}\n");
        stdin.write_all(line.as_bytes()).await.unwrap();
    };
    // The next response, whichever request it answers.
    let mut next_response = async || loop {
        let reply = next_message(&mut lines).await;
        if reply.get("id").is_some() {
            return reply;
        }
    };
    let busy = |id: u64, ms: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "busy", "arguments": {"ms": ms}}})
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "by-hand", "version": "1"}}}),
    )
    .await;
    assert_eq!(next_response().await["id"], 1);
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    send(busy(2, 20_000)).await;
    send(json!({"jsonrpc": "2.0", "id": 3, "method": "ping"})).await;
    let first = next_response().await;
    assert_eq!(first["id"], 3, "the ping waited for the call: {first}");
    send(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 2, "reason": "the user stopped it"}}),
    )
    .await;
    // The cancel and the next call travel separately: retry while the first is being
    // stopped. Had it not been, its place would stay taken for 20 s.
    let cancelled_at = std::time::Instant::now();
    for id in 4.. {
        send(busy(id, 1)).await;
        let reply = match next_response().await {
            reply if reply["id"] == 2 => next_response().await,
            reply => reply,
        };
        assert_eq!(reply["id"], id, "{reply}");
        if reply["result"]["isError"] == false {
            break;
        }
        assert!(
            cancelled_at.elapsed() < Duration::from_secs(10),
            "the cancelled call still holds the tenant's place: {reply}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(stdin);
    let status = child.wait().await.unwrap();
    assert!(status.success(), "{status}");
}

/// One HTTP/1.1 request to the MCP endpoint at `url`, read until the server closes or `until`
/// appears in what was read (then the connection is dropped, as a client that goes away).
/// Protocol 2025-11-25 unless `head` names another (or none, with an empty value).
async fn mcp_raw(url: &str, key: &str, head: &[(&str, &str)], body: &str, until: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://").trim_end_matches("/mcp");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let method = if body.is_empty() { "GET" } else { "POST" };
    let mut request = format!(
        "{method} /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Connection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !head
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("mcp-protocol-version"))
    {
        request.push_str("MCP-Protocol-Version: 2025-11-25\r\n");
    }
    for (name, value) in head.iter().filter(|(_, value)| !value.is_empty()) {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut read = Vec::new();
    let mut buffer = [0; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .expect("the server answers within 10 s")
            .unwrap();
        read.extend_from_slice(&buffer[..n]);
        if n == 0 || String::from_utf8_lossy(&read).contains(until) {
            return String::from_utf8_lossy(&read).into_owned();
        }
    }
}

/// The id of the first event in `stream`: where a resume starts from.
fn first_event_id(stream: &str) -> String {
    let id = stream.lines().find_map(|l| l.strip_prefix("id: "));
    id.unwrap_or_else(|| panic!("no event id: {stream}"))
        .trim()
        .to_owned()
}

/// A 2026-07-28 request (no session) whose answer is one message gets it as plain JSON, the
/// cheaper of the two answers the protocol allows; a 2025 session still gets an event stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessionless_call_is_answered_as_json() {
    let Served {
        key,
        url,
        stop,
        server,
        ..
    } = served().await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
    "name": "text_stats", "arguments": {"text": "One two three."},
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }}});
    let head = [
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "text_stats"),
    ];
    let answer = mcp_raw(&url, &key, &head, &call.to_string(), "\"words\":3").await;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{answer}"
    );
    let body: Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(body["id"], 7, "{body}");
    assert_eq!(body["result"]["structuredContent"]["words"], 3, "{body}");
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "sessions", "version": "1"}}});
    let answer = mcp_raw(&url, &key, &[], &initialize.to_string(), "\"result\"").await;
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("content-type: text/event-stream"),
        "{answer}"
    );
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// A client that loses its connection while its call runs reconnects with `Last-Event-ID`
/// and gets the result that finished while it was away (before, it was lost); another
/// tenant's key cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_that_finished_while_the_client_was_away_is_replayed() {
    let Served {
        host,
        key,
        url,
        stop,
        server,
    } = served().await;
    host.install("acme", plugin("probe")).await.unwrap();
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "away", "version": "1"}}});
    let answer = mcp_raw(&url, &key, &[], &initialize.to_string(), "\"result\"").await;
    let session = answer
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("mcp-session-id: ")
                .map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("no session: {answer}"));
    let in_session = [("Mcp-Session-Id", session.trim())];
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    mcp_raw(
        &url,
        &key,
        &in_session,
        &initialized.to_string(),
        "\r\n\r\n",
    )
    .await;

    // The call's stream opens with a priming event: its id is where to resume from. Then
    // the client goes away.
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "busy", "arguments": {"ms": 300}}});
    let primed = mcp_raw(&url, &key, &in_session, &call.to_string(), "retry:").await;
    let last = first_event_id(&primed);
    assert!(
        !primed.contains("\"done\""),
        "it had not finished: {primed}"
    );

    // Reconnect only once the call has finished, and its answer has gone to the stream that
    // nobody reads any more.
    let started = std::time::Instant::now();
    while !host
        .metrics()
        .render()
        .contains("toolhost_calls_total{outcome=\"ok\"} 1\n")
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the call never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resume = [("Mcp-Session-Id", session.trim()), ("Last-Event-ID", &last)];
    // Another tenant's key finds neither the session nor its events.
    host.create_tenant("globex").await.unwrap();
    let other = host
        .create_key("globex", toolhost::Role::Agent)
        .await
        .unwrap();
    let refused = mcp_raw(&url, &other.secret, &resume, "", "\r\n\r\n").await;
    assert!(refused.starts_with("HTTP/1.1 404"), "{refused}");
    assert!(!refused.contains("done"), "{refused}");
    let replayed = mcp_raw(&url, &key, &resume, "", "\"done\"").await;
    assert!(replayed.contains("\"id\":7"), "{replayed}");
    assert!(replayed.contains("\"isError\":false"), "{replayed}");
    // Resumed before the call has finished, the stream waits for its answer.
    let call = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
        "params": {"name": "busy", "arguments": {"ms": 1000}}});
    let primed = mcp_raw(&url, &key, &in_session, &call.to_string(), "retry:").await;
    let early = first_event_id(&primed);
    let resume = [
        ("Mcp-Session-Id", session.trim()),
        ("Last-Event-ID", &early),
    ];
    let awaited = mcp_raw(&url, &key, &resume, "", "\"done\"").await;
    assert!(awaited.contains("\"id\":8"), "{awaited}");
    // A resume that cannot be served says so, rather than an empty stream.
    for (unknown, status, code) in [
        ("nope", "409", "not an event id"),
        ("unknown-stream/0", "409", "no longer kept"),
        (&format!("{early}0"), "409", "not an event id"),
    ] {
        let resume = [
            ("Mcp-Session-Id", session.trim()),
            ("Last-Event-ID", unknown),
        ];
        let refused = mcp_raw(&url, &key, &resume, "", "\r\n\r\n{").await;
        assert!(
            refused.starts_with(&format!("HTTP/1.1 {status}")),
            "{refused}"
        );
        assert!(refused.contains(code), "{refused}");
    }
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// The tools `scripts/demo` installs, what each is asked, and what its answer must hold (a
/// JSON pointer into the JSON text of its result, and the value there).
fn example_calls() -> Vec<(&'static str, Value, &'static str, Value)> {
    vec![
        (
            "text_stats",
            json!({"text": "The cat sat."}),
            "/words",
            json!(3),
        ),
        (
            "word_frequency",
            json!({"text": "b a b"}),
            "/0/word",
            json!("b"),
        ),
        (
            "json_query",
            json!({"document": r#"{"a": [1, 2]}"#, "path": "$.a[1]"}),
            "/matches/0",
            json!(2),
        ),
        (
            "convert_units",
            json!({"value": 5, "from": "km", "to": "m"}),
            "/value",
            json!(5000.0),
        ),
        (
            "js_word_count",
            json!({"text": "a b a"}),
            "/words",
            json!(3),
        ),
    ]
}

/// The example tools of `acme`, served with an agent key; the data directory lives as long
/// as the returned guard.
async fn examples_served() -> (tempfile::TempDir, Served) {
    let data = examples_installed().await;
    let host = Arc::new(examples_host(data.path()).await);
    (data, serve_for_acme(host, toolhost::Role::Agent).await)
}

/// A data directory where `acme` has the example tools, as `scripts/demo` installs them.
async fn examples_installed() -> tempfile::TempDir {
    let data = tempfile::tempdir().unwrap();
    let host = examples_host(data.path()).await;
    for name in ["text_stats", "json_query", "unit_convert"] {
        host.install("acme", plugin(name)).await.unwrap();
    }
    let source = std::fs::read_to_string(root().join("plugins/js-source/word_count.js")).unwrap();
    host.install_js("acme", &source).await.unwrap();
    data
}

async fn examples_host(data: &std::path::Path) -> Host {
    Host::open(HostConfig {
        data_dir: Some(data.to_owned()),
        js_runtime: Some(crate::plugins::js_runtime()),
        ..crate::plugins::config()
    })
    .await
    .unwrap()
}

/// The example tools' names, sorted.
fn example_names() -> Vec<&'static str> {
    let mut names: Vec<&str> = example_calls().iter().map(|c| c.0).collect();
    names.sort_unstable();
    names
}

/// The names in a listing (of names, or of tools), sorted.
fn sorted_names(listed: &Value) -> Vec<&str> {
    let mut names: Vec<&str> = listed
        .as_array()
        .unwrap_or_else(|| panic!("not a listing: {listed}"))
        .iter()
        .map(|item| item.as_str().or(item["name"].as_str()).unwrap())
        .collect();
    names.sort_unstable();
    names
}

/// Checks one `tools/call` result against what the example must answer.
fn assert_example_answer(result: &Value, tool: &str, pointer: &str, expected: &Value, how: &str) {
    assert_eq!(result["isError"], false, "{how}: {tool}: {result}");
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    let answer: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    assert_eq!(
        answer.pointer(pointer),
        Some(expected),
        "{how}: {tool}: {result}"
    );
}

/// MCP Inspector's CLI (`@modelcontextprotocol/inspector` 2.12, the same client as its web UI
/// and TUI) in each of its protocol eras: the result of `method` on `target`.
async fn inspector(era: &str, target: &[&str], method: &[&str]) -> Value {
    let launcher = client_dir()
        .join("node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js");
    let out = Command::new("node")
        .arg(launcher)
        .args(["--cli", "--protocol-era", era, "--format", "json", "-q"])
        .args(method)
        .args(target)
        .env("HOME", root().join("target"))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("Inspector answers within 60 s")
        .expect("node is installed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{era} {method:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reply: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    reply["result"].clone()
}

/// MCP Inspector, in each protocol era it offers (`legacy`: 2025-11-25 with `initialize`;
/// `auto` and `modern`: 2026-07-28), over Streamable HTTP and over stdio (`toolhost mcp`),
/// lists the example tools and calls each of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_inspector_lists_and_calls_every_example_tool_in_every_era_on_both_transports() {
    let (_data, served) = examples_served().await;
    let bearer = format!("Authorization: Bearer {}", served.key);
    let http = [
        "--server-url",
        served.url.as_str(),
        "--header",
        bearer.as_str(),
    ];
    // `toolhost mcp` opens a data directory of its own.
    let own = examples_installed().await;
    let data_dir = own.path().to_str().unwrap().to_owned();
    let artifacts = format!(
        "TOOLHOST_ARTIFACT_DIR={}",
        crate::plugins::artifact_dir().display()
    );
    let js_runtime = crate::plugins::js_runtime_path()
        .to_str()
        .unwrap()
        .to_owned();
    let stdio = [
        "--transport",
        "stdio",
        "-e",
        artifacts.as_str(),
        "--",
        env!("CARGO_BIN_EXE_toolhost"),
        "--data-dir",
        data_dir.as_str(),
        "--tenant",
        "acme",
        "--js-runtime",
        js_runtime.as_str(),
        "mcp",
    ];
    inspect_examples(&http, "Streamable HTTP").await;
    served.stop.send(()).unwrap();
    served.server.await.unwrap().unwrap();
    inspect_examples(&stdio, "stdio").await;
}

/// Inspector, in each era, lists the example tools on `target` and calls each of them.
async fn inspect_examples(target: &[&str], transport: &str) {
    let calls = example_calls();
    for era in ["legacy", "auto", "modern"] {
        let how = format!("{era} over {transport}");
        let listed = inspector(era, target, &["--method", "tools/list"]).await;
        assert_eq!(sorted_names(&listed["tools"]), example_names(), "{how}");
        for (tool, args, pointer, answer) in &calls {
            let args = args.to_string();
            let call = [
                "--method",
                "tools/call",
                "--tool-name",
                tool,
                "--tool-args-json",
                &args,
            ];
            let result = inspector(era, target, &call).await;
            assert_example_answer(&result, tool, pointer, answer, &how);
        }
    }
}

/// One MCP session held by hand, over either transport, so that any protocol version can be
/// asked for.
enum RawSession {
    Http {
        url: String,
        key: String,
        head: Vec<(&'static str, String)>,
    },
    Stdio {
        child: Box<Child>,
        lines: Lines<BufReader<ChildStdout>>,
    },
}

impl RawSession {
    /// Ends the session: `toolhost mcp` exits at the end of its input, and lets go of its
    /// data directory before the next one opens it.
    async fn close(self) {
        if let RawSession::Stdio { mut child, .. } = self {
            drop(child.stdin.take());
            let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .expect("toolhost mcp exits when its input ends")
                .unwrap();
            assert!(status.success(), "{status}");
        }
    }

    /// Sends `message`; for a request, returns its response.
    async fn send(&mut self, message: Value) -> Option<Value> {
        let id = message.get("id").cloned();
        match self {
            RawSession::Http { url, key, head } => {
                let head: Vec<(&str, &str)> = head.iter().map(|(n, v)| (*n, v.as_str())).collect();
                // Read to the end: the server closes a request's stream after its response.
                let answer = mcp_raw(url, key, &head, &message.to_string(), "\u{0}").await;
                let id = id?;
                answer
                    .lines()
                    .filter_map(|l| {
                        serde_json::from_str::<Value>(l.strip_prefix("data: ").unwrap_or(l)).ok()
                    })
                    .find(|m| m["id"] == id)
                    .or_else(|| panic!("no response to {message}: {answer}"))
            }
            RawSession::Stdio { child, lines } => {
                use tokio::io::AsyncWriteExt;
                let stdin = child.stdin.as_mut().unwrap();
                stdin
                    .write_all(format!("{message}\n").as_bytes())
                    .await
                    .unwrap();
                let id = id?;
                loop {
                    let reply = next_message(lines).await;
                    if reply["id"] == id {
                        return Some(reply);
                    }
                }
            }
        }
    }
}

/// Each protocol version before 2026-07-28 (that one is driven by the Python SDK and
/// Inspector above), asked for by hand over Streamable HTTP and over stdio: `initialize`
/// settles on it, every example tool is listed and answers, and results carry
/// `structuredContent` (and listings `outputSchema`) from 2025-06-18 on, as that version's
/// schema has it; JSON-RPC batches are answered before 2025-06-18 and refused from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_protocol_version_lists_and_calls_every_example_tool_on_both_transports() {
    let (_data, served) = examples_served().await;
    let own = examples_installed().await;
    for version in ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"] {
        // The header came with 2025-06-18: clients of earlier versions do not send it.
        let header = if version >= "2025-06-18" { version } else { "" };
        let http = RawSession::Http {
            url: served.url.clone(),
            key: served.key.clone(),
            head: vec![("MCP-Protocol-Version", header.to_owned())],
        };
        let mut child = toolhost_mcp(own.path());
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let stdio = RawSession::Stdio {
            child: Box::new(child),
            lines,
        };
        for (transport, mut session) in [("Streamable HTTP", http), ("stdio", stdio)] {
            let how = format!("{version} over {transport}");
            let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": version, "capabilities": {},
                "clientInfo": {"name": "by-hand", "version": "1"}}});
            if let RawSession::Http { head, .. } = &mut session {
                let version_header = [("MCP-Protocol-Version", header)];
                let answer = mcp_raw(
                    &served.url,
                    &served.key,
                    &version_header,
                    &initialize.to_string(),
                    "\u{0}",
                )
                .await;
                let id = answer
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("mcp-session-id: ")
                            .map(str::to_owned)
                    })
                    .unwrap_or_else(|| panic!("{how}: no session: {answer}"));
                assert!(
                    answer.contains(&format!("\"protocolVersion\":\"{version}\"")),
                    "{how}: {answer}"
                );
                head.push(("Mcp-Session-Id", id.trim().to_owned()));
            } else {
                let reply = session.send(initialize).await.unwrap();
                assert_eq!(
                    reply["result"]["protocolVersion"], version,
                    "{how}: {reply}"
                );
            }
            session
                .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
                .await;
            let listed = session
                .send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
                .await
                .unwrap();
            let tools = &listed["result"]["tools"];
            assert_eq!(sorted_names(tools), example_names(), "{how}: {listed}");
            // A cursor is the client's text: past the end is an empty last page.
            let past_end = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list",
                "params": {"cursor": usize::MAX.to_string()}});
            let page = session.send(past_end).await.unwrap();
            assert_eq!(page["result"]["tools"], json!([]), "{how}: {page}");
            assert!(page["result"].get("nextCursor").is_none(), "{how}: {page}");
            let tools = tools.as_array().unwrap();
            let calls = example_calls();
            assert!(
                tools.iter().all(|t| t["inputSchema"]["type"] == "object"),
                "{how}"
            );
            // These declare their output (a stored JS tool and a component); clients before
            // 2025-06-18 do not see it.
            for name in ["js_word_count", "text_stats"] {
                let tool = tools.iter().find(|t| t["name"] == name).unwrap();
                assert_eq!(
                    tool.get("outputSchema").is_some(),
                    version >= "2025-06-18",
                    "{how}: {tool}"
                );
            }
            for (n, (tool, args, pointer, answer)) in calls.iter().enumerate() {
                let call = json!({"jsonrpc": "2.0", "id": 10 + n, "method": "tools/call",
                    "params": {"name": tool, "arguments": args}});
                let reply = session.send(call).await.unwrap();
                let result = &reply["result"];
                assert_example_answer(result, tool, pointer, answer, &how);
                let structured = version >= "2025-06-18";
                assert_eq!(
                    result.get("structuredContent").is_some(),
                    structured,
                    "{how}: {tool}: {result}"
                );
            }
            if let RawSession::Http { head, .. } = &session {
                assert_batches(&served.url, &served.key, head, version, &how).await;
            }
            session.close().await;
        }
    }
    served.stop.send(()).unwrap();
    served.server.await.unwrap().unwrap();
}

/// A JSON-RPC batch: answered as one array in request order on versions that have batches
/// (before 2025-06-18), refused as an invalid request on the others.
async fn assert_batches(url: &str, key: &str, head: &[(&str, String)], version: &str, how: &str) {
    let batch = json!([
        {"jsonrpc": "2.0", "id": 100, "method": "tools/call",
         "params": {"name": "text_stats", "arguments": {"text": "One two three."}}},
        {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},
        {"jsonrpc": "2.0", "id": 101, "method": "tools/call",
         "params": {"name": "text_stats", "arguments": {"txt": "wrong"}}},
        {"jsonrpc": "2.0", "id": 102, "method": "tools/call", "params": {"nom": "x"}},
    ]);
    let head: Vec<(&str, &str)> = head.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let answer = mcp_raw(url, key, &head, &batch.to_string(), "\u{0}").await;
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let reply: Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{how}: {e}: {answer}"));
    if version >= "2025-06-18" {
        assert!(answer.starts_with("HTTP/1.1 400"), "{how}: {answer}");
        assert_eq!(reply["error"]["code"], -32600, "{how}: {reply}");
        return;
    }
    assert!(answer.starts_with("HTTP/1.1 200"), "{how}: {answer}");
    let ids: Vec<&Value> = reply.as_array().unwrap().iter().map(|a| &a["id"]).collect();
    assert_eq!(
        ids,
        [&json!(100), &json!(101), &json!(102)],
        "{how}: {reply}"
    );
    let words = reply[0]["result"]["content"][0]["text"].as_str().unwrap();
    assert!(words.contains("\"words\":3"), "{how}: {reply}");
    assert_eq!(reply[1]["result"]["isError"], true, "{how}: {reply}");
    assert_eq!(reply[2]["error"]["code"], -32602, "{how}: {reply}");
}

/// The official TypeScript SDK client and the Python SDK's default `Client` (modes `auto` and
/// `legacy`), over Streamable HTTP and over stdio, list the example tools and call each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_call_every_example_tool_on_both_transports() {
    let (_data, served) = examples_served().await;
    let own = examples_installed().await;
    let own = own.path().to_str().unwrap();
    let toolhost = env!("CARGO_BIN_EXE_toolhost");
    let calls = example_calls();
    let asked: Vec<(&str, &Value)> = calls.iter().map(|(name, args, ..)| (*name, args)).collect();
    let asked = serde_json::to_string(&asked).unwrap();
    let python = client_dir().join("python_client.py");
    let python = python.to_str().unwrap();
    let runs: [(&str, Vec<&str>); 6] = [
        ("node", vec!["client.mjs", "http", &served.url, &served.key]),
        ("node", vec!["client.mjs", "stdio", toolhost, own, "acme"]),
        (
            "python3",
            vec![python, "auto", "http", &served.url, &served.key],
        ),
        (
            "python3",
            vec![python, "legacy", "http", &served.url, &served.key],
        ),
        (
            "python3",
            vec![python, "auto", "stdio", toolhost, own, "acme"],
        ),
        (
            "python3",
            vec![python, "legacy", "stdio", toolhost, own, "acme"],
        ),
    ];
    for (program, args) in runs {
        let how = format!("{program} {}", args[1..3].join(" "));
        let mut child = Command::new(program)
            .args(&args)
            .env("EXAMPLE_CALLS", &asked)
            .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
            .env("TOOLHOST_JS_RUNTIME", crate::plugins::js_runtime_path())
            .current_dir(client_dir())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{how}: {e}"));
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        next_step(&mut lines, "initialized").await;
        let listed = next_step(&mut lines, "listed").await;
        assert_eq!(sorted_names(&listed["names"]), example_names(), "{how}");
        for (tool, _, pointer, answer) in &calls {
            let example = next_step(&mut lines, "example").await;
            assert_eq!(example["name"], *tool, "{how}");
            assert_example_answer(&example["result"], tool, pointer, answer, &how);
        }
        next_step(&mut lines, "closed").await;
        assert!(child.wait().await.unwrap().success(), "{how}");
    }
    served.stop.send(()).unwrap();
    served.server.await.unwrap().unwrap();
}
