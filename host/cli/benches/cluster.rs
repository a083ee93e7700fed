//! Scale-out, measured: `cargo bench -p toolhost-cli --bench cluster`. Real processes: the
//! release `toolhost serve`, a private PostgreSQL (`scripts/postgres`) and HAProxy. Printed:
//!
//! 1. a synchronous `text_stats` call over HTTP on one kept-alive connection, a node on its
//!    own redb store against a node on PostgreSQL (the peer: the same binary, same machine);
//! 2. install on node A until node B answers the tool, ten times;
//! 3. a durable call (`?mode=async`, then `GET /v1/calls/{id}?wait=`) against a synchronous one;
//! 4. calls/s through HAProxy with one node and with three, 16 connections.

#[path = "support/client.rs"]
#[allow(dead_code)] // the MCP request is the other benches'
mod client;
#[path = "../../../tests/it/cluster.rs"]
#[allow(dead_code, unused_imports)] // the tests' own helpers are not all used here
mod cluster;
#[path = "../../../tests/it/plugins.rs"]
#[allow(dead_code)]
mod plugins;
#[path = "../../../tests/it/process.rs"]
#[allow(dead_code)]
mod process;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use client::{connect, get, post};
use cluster::{Balancer, Database, PrivateServer, node, within};
use process::{Server, http, plugin_file};

const CALL: &str = r#"{"arguments": {"text": "The quick brown fox jumps over the lazy dog."}}"#;
const WINDOW: Duration = Duration::from_secs(5);

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let pg = PrivateServer::start();
    let db = Database {
        url: pg.url.clone(),
    };
    let dir = tempfile::tempdir().unwrap();
    let key = db.tenant(dir.path(), "acme", "{}", "admin");
    let (a, b) = (node(&db, dir.path(), "a"), node(&db, dir.path(), "b"));
    install(&a, &key, "text_stats");

    // 1. The store's cost on the hot path.
    let local = dir.path().join("local");
    let local_key = process::tenant(&local, "acme", "{}", &["text_stats"]);
    let redb = Server::start(&local, plugins::artifact_dir(), &[]);
    println!("1. synchronous text_stats over HTTP, one connection, {WINDOW:?} each");
    println!(
        "{:<26} {:>8} {:>8} {:>9}",
        "store", "p50 µs", "p99 µs", "calls/s"
    );
    for round in 0..2 {
        for (name, addr, key) in [
            ("redb (peer)", redb.addr, &local_key),
            ("PostgreSQL", a.addr, &key),
        ] {
            let (p50, p99, rate) = runtime.block_on(sync_calls(addr, key));
            if round == 1 {
                println!("{name:<26} {p50:>8.0} {p99:>8.0} {rate:>9.0}");
            }
        }
    }
    redb.stop();

    // 2. Install on one node, callable on another.
    let mut took = Vec::new();
    for _ in 0..10 {
        let (status, body) = http(a.addr, "DELETE", "/v1/tools/text_stats", &key, b"");
        assert!(status < 300, "{status} {body}");
        within(Duration::from_secs(2), "removed on b", || {
            call_status(b.addr, &key) == 404
        });
        install(&a, &key, "text_stats");
        let installed = Instant::now();
        within(Duration::from_secs(2), "callable on b", || {
            call_status(b.addr, &key) == 200
        });
        took.push(installed.elapsed());
    }
    took.sort();
    println!("\n2. install on node A until node B answers the tool (10 times)");
    println!("median {:.1} ms, max {:.1} ms", ms(took[4]), ms(took[9]));

    // 3. A durable call's overhead.
    let (sync_p50, _, _) = runtime.block_on(sync_calls(a.addr, &key));
    let durable = runtime.block_on(durable_calls(a.addr, &key));
    println!("\n3. durable call (submit, then wait for its outcome) against a synchronous call");
    println!(
        "synchronous p50 {sync_p50:.0} µs; durable p50 {:.0} µs, p99 {:.0} µs",
        durable.0, durable.1
    );

    // 4. Through the balancer.
    let c = node(&db, dir.path(), "c");
    println!("\n4. calls/s through HAProxy, 16 connections, {WINDOW:?}");
    for (label, nodes) in [
        ("one node", vec![a.addr]),
        ("three nodes", vec![a.addr, b.addr, c.addr]),
    ] {
        let balancer = Balancer::start(dir.path(), &nodes);
        let rate = runtime.block_on(throughput(balancer.addr, &key, 16));
        println!("{label:<12} {rate:>8.0} calls/s");
    }
    for server in [a, b, c] {
        server.stop();
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

fn install(node: &Server, key: &str, plugin: &str) {
    let component = std::fs::read(plugin_file(plugin)).unwrap();
    let (status, body) = http(node.addr, "POST", "/v1/tools", key, &component);
    assert!(status < 300, "{status} {body}");
}

fn call_status(addr: SocketAddr, key: &str) -> u16 {
    http(
        addr,
        "POST",
        "/v1/tools/text_stats/call",
        key,
        CALL.as_bytes(),
    )
    .0
}

/// p50 and p99 in µs, and calls/s, of sequential calls for [`WINDOW`].
async fn sync_calls(addr: SocketAddr, key: &str) -> (f64, f64, f64) {
    let mut conn = connect(addr).await;
    let mut took = Vec::new();
    let started = Instant::now();
    while started.elapsed() < WINDOW {
        let call = Instant::now();
        let (status, _, body) = post(&mut conn, "/v1/tools/text_stats/call", key, &[], CALL).await;
        assert_eq!(status, 200, "{body}");
        took.push(call.elapsed());
    }
    let rate = took.len() as f64 / started.elapsed().as_secs_f64();
    let (p50, p99) = percentiles(&mut took);
    (p50, p99, rate)
}

/// p50 and p99 in µs of submit-then-wait durable calls, for [`WINDOW`].
async fn durable_calls(addr: SocketAddr, key: &str) -> (f64, f64) {
    let mut conn = connect(addr).await;
    let mut took = Vec::new();
    let started = Instant::now();
    while started.elapsed() < WINDOW {
        let call = Instant::now();
        let path = "/v1/tools/text_stats/call?mode=async";
        let (status, _, body) = post(&mut conn, path, key, &[], CALL).await;
        assert_eq!(status, 202, "{body}");
        let queued: serde_json::Value = serde_json::from_str(&body).unwrap();
        let path = format!("/v1/calls/{}?wait=10", queued["call_id"].as_str().unwrap());
        let (status, body) = get(&mut conn, &path, key).await;
        assert!(
            status == 200 && body.contains(r#""status":"done""#),
            "{body}"
        );
        took.push(call.elapsed());
    }
    percentiles(&mut took)
}

fn percentiles(took: &mut [Duration]) -> (f64, f64) {
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    (at(0.5), at(0.99))
}

/// Calls/s from `connections` clients calling one after another for [`WINDOW`].
async fn throughput(addr: SocketAddr, key: &str, connections: usize) -> f64 {
    let started = Instant::now();
    let clients: Vec<_> = (0..connections)
        .map(|_| {
            let key = key.to_owned();
            tokio::spawn(async move {
                let mut conn = connect(addr).await;
                let mut calls = 0u64;
                while started.elapsed() < WINDOW {
                    let (status, _, body) =
                        post(&mut conn, "/v1/tools/text_stats/call", &key, &[], CALL).await;
                    assert_eq!(status, 200, "{body}");
                    calls += 1;
                }
                calls
            })
        })
        .collect();
    let mut calls = 0;
    for client in clients {
        calls += client.await.unwrap();
    }
    calls as f64 / started.elapsed().as_secs_f64()
}
