//! Extism 1.30 running the same `text_stats` logic as toolhost's call bench, printed in the
//! same shape: a fresh plugin instance per call (compiled once), and one plugin reused for
//! every call, on one thread; then calls/s of fresh instances on one and on two threads.
//! `scripts/bench-peers` builds the plugin and runs this right after toolhost's bench.

use std::time::{Duration, Instant};

use extism::{CompiledPlugin, Manifest, Plugin, PluginBuilder, Wasm};

const WARMUP: usize = 2_000;
const CALLS: usize = 20_000;
const INPUT: &str = r#"{"text": "The quick brown fox jumps over the lazy dog. Twice!"}"#;

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("the plugin's .wasm as the first argument");
    let manifest = Manifest::new([Wasm::data(std::fs::read(path).unwrap())]);
    let compiled = CompiledPlugin::new(PluginBuilder::new(manifest)).unwrap();
    let call = |plugin: &mut Plugin| {
        let out: String = plugin.call("text_stats", INPUT).unwrap();
        assert!(out.contains("\"words\":10"), "{out}");
    };
    println!("per-call latency, {CALLS} sequential calls after {WARMUP} warm-up, one thread");
    println!("{:<28} {:>9} {:>9}", "", "p50 µs", "p99 µs");
    let fresh = measure(|| call(&mut Plugin::new_from_compiled(&compiled).unwrap()));
    row("extism fresh instance", &fresh);
    let mut plugin = Plugin::new_from_compiled(&compiled).unwrap();
    let reused = measure(|| call(&mut plugin));
    row("extism reused plugin", &reused);

    println!("\ncalls/s, {CALLS} fresh-instance calls back to back per thread");
    let per_second = |threads: usize| {
        let start = Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    for _ in 0..CALLS {
                        call(&mut Plugin::new_from_compiled(&compiled).unwrap());
                    }
                });
            }
        });
        (threads * CALLS) as f64 / start.elapsed().as_secs_f64()
    };
    let (one, two) = (per_second(1), per_second(2));
    println!(
        "{:<28} {:>9} {:>9} {:>7}",
        "", "1 thread", "2 threads", "2 / 1"
    );
    println!(
        "{:<28} {one:>9.0} {two:>9.0} {:>6.2}x",
        "extism fresh instance",
        two / one
    );
}

fn measure(mut call: impl FnMut()) -> Vec<Duration> {
    (0..WARMUP).for_each(|_| call());
    let mut samples: Vec<Duration> = (0..CALLS)
        .map(|_| {
            let start = Instant::now();
            call();
            start.elapsed()
        })
        .collect();
    samples.sort();
    samples
}

fn row(name: &str, sorted: &[Duration]) {
    let at = |p: f64| sorted[((sorted.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
    println!("{name:<28} {:>9.1} {:>9.1}", at(0.5), at(0.99));
}
