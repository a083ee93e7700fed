//! MCP round trips as one client sees them, printed as numbers:
//! `cargo bench -p toolhost-cli --bench mcp`.
//!
//! The real binary on a fresh data directory, `text_stats` installed for one tenant. One
//! client sends one request after another: over stdio (`toolhost mcp`) a `ping` and a
//! `tools/call` of `text_stats`; over Streamable HTTP (`toolhost serve`, one kept-alive
//! connection, an initialized session) the same two, and the same call on the REST route, the
//! peer an MCP call is held to. Printed: p50 and p99 of each, and call − ping per transport.
//!
//! With `TOOLHOST_BENCH_WASSETTE` (a `wassette` binary) and
//! `TOOLHOST_BENCH_WASSETTE_COMPONENT` (the same logic as a WASI component), the same stdio
//! client also times Microsoft Wassette in the same run: `peers/wassette/run` sets both.

#[path = "support/client.rs"]
#[allow(dead_code)] // GET is the cluster bench's
mod client;
#[path = "../../../tests/it/plugins.rs"]
#[allow(dead_code)] // not every user of the helpers needs all of them
mod plugins;
#[path = "../../../tests/it/process.rs"]
#[allow(dead_code)]
mod process;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const WARMUP: usize = 500;
const ROUNDS: usize = 5_000;
const TEXT: &str = "The quick brown fox jumps over the lazy dog. Twice!";

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = process::tenant(&data, "acme", "{}", &["text_stats"]);
    println!("{ROUNDS} requests one after another, after {WARMUP} warm-up, one client");
    println!("{:<34} {:>9} {:>9}", "", "p50 µs", "p99 µs");
    let toolhost = process::cli(&data, &["--tenant", "acme", "mcp"]);
    let (ping, call) = stdio(toolhost, "text_stats");
    row("stdio    ping", &ping);
    row("stdio    tools/call", &call);
    difference("stdio    call − ping", &call, &ping);
    wassette(dir.path(), &call);
    // The server opens the data directory the stdio process just let go of.
    let server = process::Server::start(&data, plugins::artifact_dir(), &[]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let [ping, call, modern, rest] = runtime.block_on(http(server.addr, &key));
    row("HTTP     ping", &ping);
    row("HTTP     tools/call", &call);
    row("HTTP     tools/call, 2026-07-28", &modern);
    row("HTTP     REST call (peer)", &rest);
    difference("HTTP     call − ping", &call, &ping);
    difference("HTTP     MCP call − REST call", &call, &rest);
    difference("HTTP     2026-07-28 call − REST", &modern, &rest);
    server.stop();
}

/// The same stdio rounds against Wassette, when the bench is given it; its call beside ours.
fn wassette(dir: &std::path::Path, toolhost_call: &[Duration]) {
    let (Some(binary), Some(component)) = (
        std::env::var_os("TOOLHOST_BENCH_WASSETTE"),
        std::env::var_os("TOOLHOST_BENCH_WASSETTE_COMPONENT"),
    ) else {
        println!("stdio    Wassette: not measured (run peers/wassette/run)");
        return;
    };
    // Wassette names a tool after the component's exported function, `text-stats`, and loads
    // every component in its plugin directory at start.
    let home = dir.join("wassette");
    let plugins = home.join("components");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(&component, plugins.join("text_stats.wasm")).unwrap();
    let mut server = std::process::Command::new(binary);
    server
        .args(["serve", "--stdio", "--plugin-dir"])
        .arg(&plugins)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env("WASETTE_CONFIG_FILE", home.join("none.toml"))
        .env("RUST_LOG", "warn")
        .stderr(Stdio::null());
    let (ping, call) = stdio(server, "text-stats");
    row("stdio    Wassette ping (peer)", &ping);
    row("stdio    Wassette tools/call (peer)", &call);
    difference("stdio    Wassette call − ping", &call, &ping);
    println!(
        "{:<34} {:>9.2}x",
        "stdio    call, Wassette / toolhost",
        p50(&call) / p50(toolhost_call)
    );
}

/// `ping` and `tools/call` of `tool` over a stdio server's pipes; notifications it sends are
/// skipped.
fn stdio(mut server: std::process::Command, tool: &str) -> (Vec<Duration>, Vec<Duration>) {
    let mut child = server
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut output = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut ask = |message: &Value| -> Value {
        writeln!(input, "{message}").unwrap();
        if message.get("id").is_none() {
            return Value::Null;
        }
        loop {
            line.clear();
            output.read_line(&mut line).unwrap();
            let answer: Value = serde_json::from_str(&line).expect(&line);
            if answer.get("id").is_some() {
                let result = answer.get("result").expect(&line);
                assert_ne!(result["isError"], true, "{line}");
                return answer;
            }
        }
    };
    ask(&serde_json::from_str(&client::initialize()).unwrap());
    ask(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let list = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"});
    let tools = ask(&list);
    assert!(
        tools.to_string().contains(&format!("\"{tool}\"")),
        "{tools}"
    );
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
    let call = call_request(tool);
    let ping = timed(|| {
        ask(&ping);
    });
    let call = timed(|| {
        ask(&call);
    });
    // toolhost ends at the end of its input; Wassette does not, and is stopped.
    drop(input);
    let deadline = Instant::now() + Duration::from_secs(5);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (ping, call)
}

/// `ping` and `tools/call` on one MCP session (2025-06-18), `tools/call` without a session
/// (2026-07-28, answered as JSON), and the REST call, on one connection.
async fn http(addr: SocketAddr, key: &str) -> [Vec<Duration>; 4] {
    let mut conn = client::connect(addr).await;
    let (status, headers, _) =
        client::post(&mut conn, "/mcp", key, &[], &client::initialize()).await;
    assert_eq!(status, 200);
    let session = headers["mcp-session-id"].to_str().unwrap().to_owned();
    let session = [("mcp-session-id", session.as_str())];
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    client::post(&mut conn, "/mcp", key, &session, &initialized.to_string()).await;
    let mut rounds = async |path: &str, head: &[(&str, &str)], body: String| {
        let mut samples = Vec::new();
        for round in 0..WARMUP + ROUNDS {
            let start = Instant::now();
            let (status, _, answer) = client::post(&mut conn, path, key, head, &body).await;
            let elapsed = start.elapsed();
            assert!(status == 200 && !answer.contains("\"error\""), "{answer}");
            if round >= WARMUP {
                samples.push(elapsed);
            }
        }
        samples
    };
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}).to_string();
    let ping = rounds("/mcp", &session, ping).await;
    let call = rounds("/mcp", &session, call_request("text_stats").to_string()).await;
    // Each request of 2026-07-28 says its version and method itself: no session.
    let mut modern = call_request("text_stats");
    modern["params"]["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let head = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "text_stats"),
    ];
    let modern = rounds("/mcp", &head, modern.to_string()).await;
    let rest = json!({"arguments": {"text": TEXT}}).to_string();
    let rest = rounds("/v1/tools/text_stats/call", &[], rest).await;
    [ping, call, modern, rest]
}

fn call_request(tool: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": tool, "arguments": {"text": TEXT}}})
}

fn timed(mut round_trip: impl FnMut()) -> Vec<Duration> {
    (0..WARMUP).for_each(|_| round_trip());
    (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            round_trip();
            start.elapsed()
        })
        .collect()
}

fn percentile(samples: &[Duration], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[((sorted.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6
}

fn p50(samples: &[Duration]) -> f64 {
    percentile(samples, 0.5)
}

/// The p50 of `a` less that of `b`.
fn difference(name: &str, a: &[Duration], b: &[Duration]) {
    println!("{name:<34} {:>9.1}", p50(a) - p50(b));
}

fn row(name: &str, samples: &[Duration]) {
    println!(
        "{name:<34} {:>9.1} {:>9.1}",
        p50(samples),
        percentile(samples, 0.99)
    );
}
