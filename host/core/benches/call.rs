//! Per-call latency, end to end, printed as numbers: `cargo bench -p toolhost --bench call`.
//!
//! Rows, measured side by side in one run on one thread:
//! - `wasm   Host::call`: validate + fresh pooled instance + call + drop + parse + clip;
//! - `wasm   sandbox only`: fresh instance + call + drop, with toolhost's limits and pool;
//! - `wasm   bare wasmtime (peer)`: the same tool on wasmtime as its docs set it up, with
//!   nothing of toolhost's (`call/bare_wasmtime.rs`);
//! - `wasm   sandbox only, reused` and `wasm   Host::call, reused`: the same, with the tool
//!   opted into instance reuse (by the tenant's policy: one kept instance serves up to
//!   100 000 calls);
//! - `wasm   Host::call, 100 µs apart`: the same, the thread asleep 100 µs before each call, as
//!   a server is between one client's requests (what an idle core costs the next call);
//! - `wasm   Host::call, 100 µs spun`: the same wait spent spinning, so the core never idles;
//! - `wasm   Host::call, 4 MiB written`: the thread writes over 4 MiB (twice the L2 cache)
//!   before each call, as a client sharing the core would: what cold data caches cost;
//! - `native Host::call`: the same tool logic as a native Rust tool, through the same pipeline;
//! - `… no history`: the same on a host that keeps no call history (what the console's
//!   recent calls and per-minute figures cost a call).
//!
//! Then the cost of a first call: compiling a component, versus loading its stored artifact
//! after a restart; and calls per second on one and on two worker threads, through
//! `Host::call`, through the sandbox alone and on bare wasmtime.

#[path = "call/bare_wasmtime.rs"]
mod bare_wasmtime;
#[path = "../../../tests/it/plugins.rs"]
#[allow(dead_code)] // not every user of the helpers needs all of them
mod plugins;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bare_wasmtime::BareWasmtime;
use serde_json::{Value, json};
use toolhost::sandbox::{Entry, Prepared, Sandbox};
use toolhost::{CallContext, Caller, Helpers, Host, HostConfig, Limits, SandboxConfig, ToolSpec};

const WARMUP: usize = 2_000;
const CALLS: usize = 20_000;

/// The same logic as `plugins/text-stats`'s `text_stats`, as a native tool.
fn text_stats(args: Value) -> Value {
    let text = args["text"].as_str().unwrap_or_default();
    let words: Vec<&str> = text.split_whitespace().collect();
    let word_chars: usize = words.iter().map(|w| w.chars().count()).sum();
    json!({
        "chars": text.chars().count(),
        "bytes": text.len(),
        "words": words.len(),
        "lines": text.lines().count(),
        "sentences": text.split(['.', '!', '?']).filter(|s| s.chars().any(char::is_alphanumeric)).count(),
        "avg_word_len": if words.is_empty() { 0.0 } else { (word_chars as f64 / words.len() as f64 * 100.0).round() / 100.0 },
    })
}

struct Summary {
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

async fn measure<F: AsyncFnMut()>(f: F) -> Summary {
    measure_apart(Gap::Spin(Duration::ZERO), f).await
}

/// What the thread does between two timed calls.
#[derive(Clone, Copy)]
enum Gap {
    /// Sleeps, as a server between one client's requests: the CPU may go idle.
    Sleep(Duration),
    /// Spins, keeping the CPU busy: the same wait without the idle.
    Spin(Duration),
    /// Writes over this many bytes, as another process on the core would between two
    /// requests: the call starts with the core's caches holding none of its memory.
    Evict(usize),
}

/// As `measure`, with `gap` before each timed call.
async fn measure_apart<F: AsyncFnMut()>(gap: Gap, mut f: F) -> Summary {
    for _ in 0..WARMUP {
        f().await;
    }
    let mut samples = Vec::with_capacity(CALLS);
    let mut scratch = Vec::new();
    for _ in 0..CALLS {
        match gap {
            Gap::Sleep(gap) => std::thread::sleep(gap),
            Gap::Spin(gap) => {
                let start = Instant::now();
                while start.elapsed() < gap {
                    std::hint::spin_loop();
                }
            }
            Gap::Evict(bytes) => {
                if scratch.len() < bytes {
                    scratch = vec![0u8; bytes];
                }
                for line in scratch[..bytes].chunks_mut(64) {
                    line[0] = line[0].wrapping_add(1);
                }
                std::hint::black_box(&scratch);
            }
        }
        let start = Instant::now();
        f().await;
        samples.push(start.elapsed());
    }
    samples.sort();
    Summary {
        p50: samples[CALLS / 2],
        p99: samples[CALLS * 99 / 100],
        mean: samples.iter().sum::<Duration>() / CALLS as u32,
    }
}

fn row(name: &str, s: &Summary) {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "{name:<32} {:>9.1} {:>9.1} {:>9.1}",
        us(s.p50),
        us(s.p99),
        us(s.mean)
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run());

    let wasm = plugins::plugin("text_stats");
    let args = json!({"text": "The quick brown fox jumps over the lazy dog. Twice!"});
    println!("\ncalls/s, {THROUGHPUT_CALLS} calls back to back per worker thread (one task each)");
    println!(
        "{:<28} {:>9} {:>9} {:>7}",
        "", "1 thread", "2 threads", "2 / 1"
    );
    for (name, via) in [
        ("wasm   Host::call", Via::Host { history: true }),
        (
            "wasm   Host::call, no history",
            Via::Host { history: false },
        ),
        ("wasm   sandbox only", Via::Sandbox),
        ("wasm   bare wasmtime (peer)", Via::Bare),
    ] {
        let one = throughput(&wasm, &args, 1, via);
        let two = throughput(&wasm, &args, 2, via);
        println!("{name:<28} {one:>9.0} {two:>9.0} {:>6.2}x", two / one);
    }
}

const THROUGHPUT_CALLS: usize = 20_000;

/// Calls per second of `text_stats` with `workers` tokio worker threads, each running a task
/// that calls back to back: how the host scales with cores. The sandbox alone instantiates,
/// calls and drops without the host's pipeline, to tell the pipeline's share from wasmtime's;
/// bare wasmtime is the peer.
fn throughput(wasm: &[u8], args: &Value, workers: usize, via: Via) -> f64 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let target = match via {
            Via::Host { history } => {
                let call_history = match history {
                    true => HostConfig::default().call_history,
                    false => 0,
                };
                let config = HostConfig {
                    call_history,
                    ..HostConfig::default()
                };
                let host = Host::open(config).await.unwrap();
                host.install("bench", wasm.to_vec()).await.unwrap();
                Target::Host(Arc::new(host))
            }
            Via::Sandbox => {
                let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
                let prepared = sandbox.prepare(wasm).unwrap();
                Target::Sandbox(Arc::new((sandbox, prepared)))
            }
            Via::Bare => Target::Bare(Arc::new(BareWasmtime::new(wasm))),
        };
        let caller = Throughput {
            target,
            args: args.clone(),
        };
        for _ in 0..WARMUP {
            caller.call().await;
        }
        let start = Instant::now();
        let tasks: Vec<_> = (0..workers)
            .map(|_| {
                let caller = caller.clone();
                tokio::spawn(async move {
                    for _ in 0..THROUGHPUT_CALLS {
                        caller.call().await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        (workers * THROUGHPUT_CALLS) as f64 / start.elapsed().as_secs_f64()
    })
}

/// What a throughput call goes through.
#[derive(Debug, Clone, Copy)]
enum Via {
    /// `Host::call`, with or without the call history.
    Host { history: bool },
    /// The sandbox alone.
    Sandbox,
    /// wasmtime with nothing of toolhost's: the peer.
    Bare,
}

/// What a throughput call runs on, built for its `Via`.
#[derive(Clone)]
enum Target {
    Host(Arc<Host>),
    Sandbox(Arc<(Sandbox, Prepared)>),
    Bare(Arc<BareWasmtime>),
}

/// One throughput call of `text_stats`.
#[derive(Clone)]
struct Throughput {
    target: Target,
    args: Value,
}

impl Throughput {
    async fn call(&self) {
        let (sandbox, prepared) = match &self.target {
            Target::Host(host) => {
                let caller = Caller::tenant("bench");
                let out = host.call(&caller, "text_stats", self.args.clone()).await;
                assert!(out.result.is_ok());
                return;
            }
            Target::Bare(bare) => {
                bare.call("text_stats", &self.args.to_string()).await;
                return;
            }
            Target::Sandbox(sandbox) => &**sandbox,
        };
        let ctx = CallContext {
            tenant: "bench".into(),
            call_id: "1".into(),
            tool: "text_stats".into(),
            data: Value::Null,
        };
        let args = self.args.to_string();
        let limits = Limits::default();
        let entry = Entry::Tool { args: &args };
        let run = sandbox
            .call(
                prepared,
                &limits,
                Helpers::default(),
                &Default::default(),
                entry,
                &ctx,
            )
            .await;
        assert!(matches!(run.result, Ok(Ok(_))));
    }
}

async fn run() {
    let wasm = plugins::plugin("text_stats");
    let args = json!({"text": "The quick brown fox jumps over the lazy dog. Twice!"});
    let caller = Caller::tenant("bench");

    let host = Host::open(HostConfig::default()).await.unwrap();
    host.install("bench", wasm.clone()).await.unwrap();
    let schema = host
        .describe("bench", "text_stats")
        .unwrap()
        .spec
        .parameters;
    host.natives()
        .register(
            ToolSpec::new("text_stats_native", "Native text stats.", schema),
            |args, _, _| async move { Ok(text_stats(args)) },
        )
        .unwrap();
    let expected = host
        .call(&caller, "text_stats", args.clone())
        .await
        .result
        .unwrap();
    let native = host
        .call(&caller, "text_stats_native", args.clone())
        .await
        .result
        .unwrap();
    assert_eq!(expected, native, "both tools compute the same thing");

    println!("per-call latency, {CALLS} sequential calls after {WARMUP} warm-up, one thread");
    println!(
        "{:<32} {:>9} {:>9} {:>9}",
        "", "p50 µs", "p99 µs", "mean µs"
    );
    let apart = Duration::from_micros(100);
    for (name, gap) in [
        ("wasm   Host::call", Gap::Spin(Duration::ZERO)),
        ("wasm   Host::call, 100 µs apart", Gap::Sleep(apart)),
        ("wasm   Host::call, 100 µs spun", Gap::Spin(apart)),
        ("wasm   Host::call, 4 MiB written", Gap::Evict(4 << 20)),
    ] {
        let timed = measure_apart(gap, async || {
            let out = host.call(&caller, "text_stats", args.clone()).await;
            assert!(out.result.is_ok());
        })
        .await;
        row(name, &timed);
    }

    // What keeping the call history (for the console) costs a call: a host that keeps none.
    let no_history = Host::open(HostConfig {
        call_history: 0,
        ..HostConfig::default()
    })
    .await
    .unwrap();
    no_history.install("bench", wasm.clone()).await.unwrap();
    let native_spec = host.describe("bench", "text_stats_native").unwrap().spec;
    no_history
        .natives()
        .register(
            native_spec,
            |args, _, _| async move { Ok(text_stats(args)) },
        )
        .unwrap();
    let wasm_no_history = measure(async || {
        let out = no_history.call(&caller, "text_stats", args.clone()).await;
        assert!(out.result.is_ok());
    })
    .await;
    row("wasm   Host::call, no history", &wasm_no_history);

    let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
    let prepared = sandbox.prepare(&wasm).unwrap();
    let limits = Limits::default();
    let ctx = CallContext {
        tenant: "bench".into(),
        call_id: "1".into(),
        tool: "text_stats".into(),
        data: Value::Null,
    };
    let args_text = args.to_string();
    let wasm_sandbox = measure(async || {
        let run = sandbox
            .call(
                &prepared,
                &limits,
                Helpers::default(),
                &Default::default(),
                Entry::Tool { args: &args_text },
                &ctx,
            )
            .await;
        assert!(matches!(run.result, Ok(Ok(_))));
    })
    .await;
    row("wasm   sandbox only", &wasm_sandbox);

    let bare = BareWasmtime::new(&wasm);
    let answer: Value = serde_json::from_str(&bare.call("text_stats", &args_text).await).unwrap();
    assert_eq!(
        answer, expected,
        "bare wasmtime runs the same tool to the same answer"
    );
    let wasm_bare = measure(async || {
        bare.call("text_stats", &args_text).await;
    })
    .await;
    row("wasm   bare wasmtime (peer)", &wasm_bare);

    let reusing = toolhost::sandbox::Permissions {
        reuse: Some(toolhost::sandbox::ReusePolicy {
            key: "bench text_stats".into(),
            max_calls: 100_000,
            max_age: std::time::Duration::from_secs(600),
        }),
        ..Default::default()
    };
    let sandbox_reused = measure(async || {
        let run = sandbox
            .call(
                &prepared,
                &limits,
                Helpers::default(),
                &reusing,
                Entry::Tool { args: &args_text },
                &ctx,
            )
            .await;
        assert!(matches!(run.result, Ok(Ok(_))));
    })
    .await;
    row("wasm   sandbox only, reused", &sandbox_reused);

    let reuse =
        json!({"grants": {"text_stats": {"reuse": {"max_calls": 100_000, "max_age_ms": 600_000}}}});
    host.set_policy("bench", serde_json::from_value(reuse).unwrap())
        .await
        .unwrap();
    let wasm_reused = measure(async || {
        let out = host.call(&caller, "text_stats", args.clone()).await;
        assert!(out.result.is_ok());
    })
    .await;
    row("wasm   Host::call, reused", &wasm_reused);
    host.set_policy("bench", Default::default()).await.unwrap();

    let native = measure(async || {
        let out = host.call(&caller, "text_stats_native", args.clone()).await;
        assert!(out.result.is_ok());
    })
    .await;
    row("native Host::call", &native);

    let native_no_history = measure(async || {
        let out = no_history
            .call(&caller, "text_stats_native", args.clone())
            .await;
        assert!(out.result.is_ok());
    })
    .await;
    row("native Host::call, no history", &native_no_history);

    first_call(&wasm, &args).await;
}

/// Compile-on-install versus first call after a restart (artifact loaded from the store).
async fn first_call(wasm: &[u8], args: &Value) {
    const ROUNDS: usize = 20;
    let caller = Caller::tenant("bench");
    let mut install = Vec::new();
    let mut restart = Vec::new();
    let mut open = Vec::new();
    for _ in 0..ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        let config = HostConfig {
            data_dir: Some(dir.path().to_owned()),
            ..HostConfig::default()
        };
        {
            let host = Host::open(config.clone()).await.unwrap();
            let start = Instant::now();
            host.install("bench", wasm.to_vec()).await.unwrap();
            install.push(start.elapsed());
        }
        // A restart is a new process: let the old engine's teardown (its epoch thread unmaps
        // the pool) end first, rather than time the new one against it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let start = Instant::now();
        let host = Host::open(config).await.unwrap();
        open.push(start.elapsed());
        let start = Instant::now();
        let out = host.call(&caller, "text_stats", args.clone()).await;
        restart.push(start.elapsed());
        assert!(out.result.is_ok());
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    println!();
    println!(
        "first call, median of {ROUNDS}, {} KB component",
        wasm.len() / 1000
    );
    println!(
        "{:<28} {:>9.2} ms",
        "install (compile + store)",
        median(install)
    );
    println!(
        "{:<28} {:>9.2} ms",
        "Host::open after restart",
        median(open)
    );
    println!(
        "{:<28} {:>9.2} ms",
        "first call after restart",
        median(restart)
    );
}
