//! JavaScript tools, printed as numbers: `cargo bench -p toolhost --bench js`.
//!
//! Side by side in one run: per-call latency and the time from upload to a first result for
//! stored-source JS tools (pre-initialised, and on the shared QuickJS runtime as before
//! their snapshot is ready), a JS component built by the JS SDK (ComponentizeJS,
//! StarlingMonkey), and, as the peer, a Rust component. The same text-stats
//! logic runs as JS source and as Rust; the word-count example runs as JS source and as a JS
//! component.

#[path = "../../../tests/it/plugins.rs"]
#[allow(dead_code)] // not every user of the helpers needs all of them
mod plugins;

use std::time::{Duration, Instant};

use serde_json::json;
use toolhost::{Caller, Host, HostConfig};

const WARMUP: usize = 200;
const CALLS: usize = 3_000;
const UPLOADS: usize = 50;

/// `plugins/text-stats`'s `text_stats`, in JavaScript.
fn text_stats_js(name: &str) -> String {
    format!(
        r#"export const spec = {{
  name: "{name}",
  description: "Counts characters, bytes, words, lines and sentences in a text.",
  parameters: {{ type: "object", required: ["text"], properties: {{ text: {{ type: "string" }} }} }},
}};
export default function ({{ text }}) {{
  const words = text.split(/\s+/).filter((w) => w.length > 0);
  const wordChars = words.reduce((n, w) => n + [...w].length, 0);
  return {{
    chars: [...text].length,
    bytes: unescape(encodeURIComponent(text)).length,
    words: words.length,
    lines: text.length === 0 ? 0 : text.split("\n").length - (text.endsWith("\n") ? 1 : 0),
    sentences: text.split(/[.!?]/).filter((s) => /[\p{{L}}\p{{N}}]/u.test(s)).length,
    avg_word_len: words.length === 0 ? 0 : Math.round((wordChars / words.length) * 100) / 100,
  }};
}}
"#
    )
}

/// Calls `tool` until a call starts from its snapshot; how long that took.
async fn until_pre_initialised(host: &Host, tool: &str, args: &serde_json::Value) -> Duration {
    let start = Instant::now();
    let caller = Caller::tenant("bench");
    loop {
        let before = plugins::snapshot_calls(host);
        assert!(host.call(&caller, tool, args.clone()).await.result.is_ok());
        if plugins::snapshot_calls(host) > before {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{tool}: no snapshot"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn percentile(sorted: &[Duration], p: usize) -> f64 {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)].as_secs_f64() * 1e3
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run());
}

async fn run() {
    let js_runtime = plugins::js_runtime();
    let wasm = plugins::plugin("text_stats");
    let js_component = plugins::js_component();
    let word_count_js =
        std::fs::read_to_string(plugins::root().join("plugins/js-source/word_count.js")).unwrap();
    let args = json!({"text": "The quick brown fox jumps over the lazy dog. Twice!"});
    let caller = Caller::tenant("bench");
    let config = || HostConfig {
        js_runtime: Some(js_runtime.clone()),
        ..HostConfig::default()
    };
    // The same tools with pre-initialisation off: every call starts QuickJS and evaluates
    // the module, as a call does before its snapshot is ready.
    let shared = Host::open(HostConfig {
        js_snapshots: 0,
        ..config()
    })
    .await
    .unwrap();

    // The runtime compiles once per host (its artifact is then stored, like any component's).
    let host = Host::open(config()).await.unwrap();
    let start = Instant::now();
    host.install_js("bench", &text_stats_js("text_stats_js"))
        .await
        .unwrap();
    let runtime_compile = start.elapsed();
    host.install("bench", wasm.clone()).await.unwrap();
    host.install_js("bench", &word_count_js).await.unwrap();
    let start = Instant::now();
    host.install("bench", js_component.clone()).await.unwrap();
    let component_compile = start.elapsed();
    shared
        .install_js("bench", &text_stats_js("text_stats_js"))
        .await
        .unwrap();
    shared.install_js("bench", &word_count_js).await.unwrap();
    let words = json!({"text": "the cat and the hat sat on the mat"});
    until_pre_initialised(&host, "text_stats_js", &args).await;
    until_pre_initialised(&host, "js_word_count", &words).await;
    let js_result = host.call(&caller, "text_stats_js", args.clone()).await;
    let rust_result = host.call(&caller, "text_stats", args.clone()).await;
    assert_eq!(
        js_result.result, rust_result.result,
        "both compute the same"
    );

    println!("per-call latency, {CALLS} sequential calls after {WARMUP} warm-up, one thread (ms)");
    println!("{:<44} {:>8} {:>8}", "", "p50", "p99");
    for (label, host, tool, args) in [
        (
            "JS source, pre-initialised: text_stats",
            &host,
            "text_stats_js",
            &args,
        ),
        (
            "JS source, shared runtime: text_stats",
            &shared,
            "text_stats_js",
            &args,
        ),
        (
            "peer: Rust component: text_stats",
            &host,
            "text_stats",
            &args,
        ),
        (
            "JS source, pre-initialised: word_count",
            &host,
            "js_word_count",
            &words,
        ),
        (
            "JS source, shared runtime: word_count",
            &shared,
            "js_word_count",
            &words,
        ),
        (
            "JS component: word_count",
            &host,
            "js_component_word_count",
            &words,
        ),
    ] {
        for _ in 0..WARMUP {
            host.call(&caller, tool, args.clone()).await;
        }
        let mut samples = Vec::with_capacity(CALLS);
        for _ in 0..CALLS {
            let start = Instant::now();
            let out = host.call(&caller, tool, args.clone()).await;
            samples.push(start.elapsed());
            assert!(out.result.is_ok());
        }
        samples.sort();
        println!(
            "{label:<44} {:>8.3} {:>8.3}",
            percentile(&samples, 50),
            percentile(&samples, 99)
        );
    }

    // Upload to first result: a new tool each time, on a host that has run JS before.
    let mut js_uploads = Vec::with_capacity(UPLOADS);
    for i in 0..UPLOADS {
        let name = format!("fresh_{i}");
        let source = text_stats_js(&name);
        let start = Instant::now();
        host.install_js("bench", &source).await.unwrap();
        let out = host.call(&caller, &name, args.clone()).await;
        js_uploads.push(start.elapsed());
        assert!(out.result.is_ok());
    }
    js_uploads.sort();
    // Upload to the first call that starts from the tool's snapshot.
    let source = text_stats_js("pre_initialised");
    let start = Instant::now();
    host.install_js("bench", &source).await.unwrap();
    until_pre_initialised(&host, "pre_initialised", &args).await;
    let to_snapshot = start.elapsed();
    // A JS component: compiled on upload (measured above), loaded from its artifact after.
    let dir = tempfile::tempdir().unwrap();
    let stored = || HostConfig {
        data_dir: Some(dir.path().to_owned()),
        ..HostConfig::default()
    };
    {
        let host = Host::open(stored()).await.unwrap();
        host.install("bench", js_component.clone()).await.unwrap();
    }
    let host = Host::open(stored()).await.unwrap();
    let start = Instant::now();
    let out = host
        .call(&caller, "js_component_word_count", words.clone())
        .await;
    let component_restart = start.elapsed();
    assert!(out.result.is_ok());
    // The peer: a Rust component, compiled on upload; a fresh host each time so nothing is cached.
    let mut rust_uploads = Vec::new();
    for _ in 0..5 {
        let host = Host::open(HostConfig::default()).await.unwrap();
        let start = Instant::now();
        host.install("bench", wasm.clone()).await.unwrap();
        let out = host.call(&caller, "text_stats", args.clone()).await;
        rust_uploads.push(start.elapsed());
        assert!(out.result.is_ok());
    }
    rust_uploads.sort();
    println!();
    println!("upload to first result (ms)");
    println!("{:<36} {:>8} {:>8}", "", "p50", "max");
    println!(
        "{:<36} {:>8.2} {:>8.2}",
        format!("JS source ({UPLOADS} uploads)"),
        percentile(&js_uploads, 50),
        percentile(&js_uploads, 100)
    );
    println!(
        "{:<36} {:>8.2}",
        "JS source, to its first snapshot call",
        to_snapshot.as_secs_f64() * 1e3
    );
    println!(
        "{:<36} {:>8.2} {:>8.2}",
        "peer: Rust component (5, compiled)",
        percentile(&rust_uploads, 50),
        percentile(&rust_uploads, 100)
    );
    println!(
        "{:<36} {:>8.2}",
        format!(
            "JS component ({:.1} MB), compiled",
            js_component.len() as f64 / 1e6
        ),
        component_compile.as_secs_f64() * 1e3
    );
    println!(
        "{:<36} {:>8.2}",
        "JS component, first call on restart",
        component_restart.as_secs_f64() * 1e3
    );
    println!();
    println!(
        "the QuickJS runtime itself ({} KB): compiled once per store in {:.0} ms",
        js_runtime.len() / 1000,
        runtime_compile.as_secs_f64() * 1e3
    );
}
