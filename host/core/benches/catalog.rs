//! Memory with a large catalog: `cargo bench -p toolhost --bench catalog`.
//!
//! 1 000 tenants over 103 distinct components: every tenant installs `json_query`,
//! `unit_convert` and `probe` (shared) and one of 100 builds of `text_stats`, so each has as
//! many tools as those components offer (the bench prints the total). Then, in a fresh process
//! per row (so that memory freed by the install phase does not count), the store is opened and
//! one tool of every tenant is called: with 16 loaded components and a 16 MiB store cache,
//! and, as the peer, with neither capped (the store's cache at 1 GiB). The rows are printed as
//! the Markdown table in BENCHMARKS.md.

#[path = "../../../tests/it/plugins.rs"]
#[allow(dead_code)] // not every user of the helpers needs all of them
mod plugins;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde_json::json;
use toolhost::{Caller, Host, HostConfig};

const TENANTS: usize = 1_000;
const TEXT_STATS_BUILDS: usize = 100;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// The same component with a custom section appended: other bytes, other sha256, same tools.
fn variant(bytes: &[u8], i: usize) -> Vec<u8> {
    let tag = format!("build-{i}");
    let mut out = bytes.to_vec();
    out.extend([0, tag.len() as u8 + 1, tag.len() as u8]);
    out.extend(tag.as_bytes());
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    if let Some(at) = args.iter().position(|a| a == "--measure") {
        let dir = Path::new(&args[at + 1]);
        let cap: usize = args[at + 2].parse().unwrap();
        runtime.block_on(measure(dir, cap));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(populate(dir.path()));
    // Markdown, as BENCHMARKS.md shows it.
    println!("| moment | RSS MiB | components loaded | ms |\n| --- | --- | --- | --- |");
    for cap in [16, 100_000] {
        let out = Command::new(std::env::current_exe().unwrap())
            .arg("--measure")
            .arg(dir.path())
            .arg(cap.to_string())
            .output()
            .unwrap();
        print!("{}", String::from_utf8_lossy(&out.stdout));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
    }
}

async fn populate(dir: &Path) {
    let host = Host::open(HostConfig {
        data_dir: Some(dir.to_owned()),
        ..HostConfig::default()
    })
    .await
    .unwrap();
    let shared = ["json_query", "unit_convert", "probe"].map(plugins::plugin);
    let text_stats = plugins::plugin("text_stats");
    let start = Instant::now();
    for index in 0..TENANTS {
        let tenant = format!("tenant-{index:04}");
        for component in &shared {
            host.install(&tenant, component.clone()).await.unwrap();
        }
        let build = variant(&text_stats, index % TEXT_STATS_BUILDS);
        host.install(&tenant, build).await.unwrap();
    }
    let tools: usize = (0..TENANTS)
        .map(|t| host.list(&format!("tenant-{t:04}")).len())
        .sum();
    println!(
        "{tools} tools for {TENANTS} tenants installed in {:.1} s ({} distinct components)\n",
        start.elapsed().as_secs_f64(),
        TEXT_STATS_BUILDS + shared.len()
    );
}

async fn measure(dir: &Path, cap: usize) {
    let before = rss_mib();
    let start = Instant::now();
    let host = Host::open(HostConfig {
        data_dir: Some(dir.to_owned()),
        max_loaded_components: cap,
        store_cache_bytes: if cap > TENANTS { 1 << 30 } else { 16 << 20 },
        ..HostConfig::default()
    })
    .await
    .unwrap();
    let open_ms = start.elapsed().as_secs_f64() * 1e3;
    let label = if cap > TENANTS {
        "peer, same run: no cap, store cache 1 GiB".to_string()
    } else {
        format!("cap {cap} loaded components, store cache 16 MiB")
    };
    let after_open = rss_mib();
    let tools: usize = (0..TENANTS)
        .map(|t| host.list(&format!("tenant-{t:04}")).len())
        .sum();
    println!("| {label}: process before opening the store | {before:.1} | – | – |");
    println!(
        "| {label}: after open, {tools} tools in the catalog | {after_open:.1} | {} | {open_ms:.0} |",
        host.loaded_components(),
    );
    for pass in ["first", "second"] {
        let start = Instant::now();
        for tenant in 0..TENANTS {
            let caller = Caller::tenant(format!("tenant-{tenant:04}"));
            let out = host
                .call(&caller, "text_stats", json!({"text": "a b c"}))
                .await;
            assert!(out.result.is_ok(), "{:?}", out.result);
        }
        let ms = start.elapsed().as_secs_f64() * 1e3;
        println!(
            "| {label}: {pass} call in each tenant | {:.1} | {} | {ms:.0} |",
            rss_mib(),
            host.loaded_components(),
        );
    }
}
