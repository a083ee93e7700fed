//! One tenant against another, printed as numbers: `cargo bench -p toolhost --bench contention`.
//!
//! Tenant B (`globex`) calls `text_stats` one call after another. Each phase, tenant A
//! (`acme`) keeps `FLOOD` calls in flight of one kind: none (quiet), busy guests (`busy`, CPU
//! for 250 ms), sleeping guests (`sleep`, blocked in a WASI sleep until their 300 ms timeout),
//! or nested calls (`call_tool` calling `busy`). Printed per phase: B's p50 and p99, their
//! ratio to the quiet phase, B's failed calls, A's calls by outcome, and whether B's p99 is
//! within the bound: twice the quiet p99, with a floor of 50 ms. The host runs on a
//! two-worker runtime, as `toolhost serve` does on this machine.

#[path = "../../../tests/it/plugins.rs"]
#[allow(dead_code)] // not every user of the helpers needs all of them
mod plugins;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolhost::{Caller, Host, HostConfig};

/// How long B is measured in each phase.
const PHASE: Duration = Duration::from_secs(8);
/// A's calls in flight.
const FLOOD: usize = 80;

struct Latency {
    p50: Duration,
    p99: Duration,
    calls: usize,
    failed: usize,
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run());
}

async fn run() {
    let host = Arc::new(
        Host::open(HostConfig {
            artifact_dir: Some(plugins::artifact_dir().to_owned()),
            ..HostConfig::default()
        })
        .await
        .unwrap(),
    );
    host.install("globex", plugins::plugin("text_stats"))
        .await
        .unwrap();
    host.install("acme", plugins::plugin("probe"))
        .await
        .unwrap();
    host.install("acme", plugins::plugin("hostile"))
        .await
        .unwrap();

    let busy = json!({"ms": 250});
    let phases: [(&str, Option<(&str, Value)>); 4] = [
        ("quiet", None),
        ("A busy x80", Some(("busy", busy.clone()))),
        ("A sleeping x80", Some(("sleep", json!({})))),
        (
            "A nested x80",
            Some(("call_tool", json!({"name": "busy", "arguments": busy}))),
        ),
    ];
    println!(
        "tenant B's text_stats while tenant A keeps {FLOOD} calls in flight; {} s per phase, 2 workers",
        PHASE.as_secs()
    );
    println!(
        "{:<16} {:>9} {:>9} {:>8} {:>8} {:>7} {:>7} {:>6}  A's outcomes",
        "phase", "p50 ms", "p99 ms", "p50 ×", "p99 ×", "B calls", "B fail", "bound"
    );
    let mut quiet: Option<(Duration, Duration)> = None;
    for (name, flood) in phases {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let flooders: Vec<_> = flood
            .iter()
            .flat_map(|(tool, args)| (0..FLOOD).map(move |_| (tool.to_string(), args.clone())))
            .map(|(tool, args)| {
                let (host, mut stopped) = (host.clone(), stopped.clone());
                tokio::spawn(async move {
                    let mut outcomes = BTreeMap::<&'static str, usize>::new();
                    let caller = Caller::tenant("acme");
                    loop {
                        // A call still running at the end of the phase is dropped, which ends it.
                        tokio::select! {
                            out = host.call(&caller, &tool, args.clone()) => {
                                *outcomes.entry(out.code()).or_default() += 1;
                            }
                            _ = stopped.changed() => break outcomes,
                        }
                    }
                })
            })
            .collect();
        if !flooders.is_empty() {
            // Let the flood fill the host before B is measured.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let latency = measure_b(&host).await;
        stop.send(true).unwrap();
        let mut outcomes = BTreeMap::new();
        for flooder in flooders {
            for (code, n) in flooder.await.unwrap() {
                *outcomes.entry(code).or_insert(0) += n;
            }
        }
        let (q50, q99) = *quiet.get_or_insert((latency.p50, latency.p99));
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let bound = (2 * q99).max(Duration::from_millis(50));
        let within = latency.p99 <= bound && latency.failed == 0;
        println!(
            "{name:<16} {:>9.2} {:>9.2} {:>8.1} {:>8.1} {:>7} {:>7} {:>6}  {outcomes:?}",
            ms(latency.p50),
            ms(latency.p99),
            ms(latency.p50) / ms(q50),
            ms(latency.p99) / ms(q99),
            latency.calls,
            latency.failed,
            if within { "met" } else { "MISSED" },
        );
    }
}

async fn measure_b(host: &Host) -> Latency {
    let caller = Caller::tenant("globex");
    let args = json!({"text": "The quick brown fox jumps over the lazy dog. Twice!"});
    let mut samples = Vec::new();
    let mut failed = 0;
    let until = Instant::now() + PHASE;
    while Instant::now() < until {
        let start = Instant::now();
        let out = host.call(&caller, "text_stats", args.clone()).await;
        samples.push(start.elapsed());
        failed += usize::from(out.result.is_err());
    }
    samples.sort();
    Latency {
        p50: samples[samples.len() / 2],
        p99: samples[samples.len() * 99 / 100],
        calls: samples.len(),
        failed,
    }
}
