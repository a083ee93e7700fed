//! Crash safety: the CLI is killed (SIGKILL) at varied moments of installs, removals and calls
//! that write the cache and KV; after each kill a new process must open the store and serve,
//! and every tool must be whole: a pack's tools all at the same version, each callable.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use toolhost::{Caller, Host, HostConfig, Source};

fn toolhost(data: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolhost"));
    command
        .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
        .env("TOOLHOST_DATA_DIR", data)
        .env("TOOLHOST_TENANT", "acme")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// Another build of a plugin: same tools, other bytes (a custom section), so installs write.
fn variant(dir: &Path, name: &str, round: usize) -> String {
    let bytes = crate::plugins::variant(name, &format!("round-{round}"));
    let path = dir.join(format!("{name}-{round}.wasm"));
    std::fs::write(&path, bytes).unwrap();
    path.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_killed_process_leaves_every_tool_whole_or_absent() {
    let data = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let ok = toolhost(data.path())
        .args(["install", &variant(files.path(), "probe", 0)])
        .status()
        .unwrap();
    assert!(ok.success());

    for round in 1..=30 {
        // Each operation with the span its kills are spread over: start-up, compilation and
        // the writes that follow (an install takes ~300 ms here, a call or removal ~15 ms).
        let (args, span_ms): (Vec<String>, u64) = match round % 5 {
            0 | 1 => (
                vec!["install".into(), variant(files.path(), "text_stats", round)],
                400,
            ),
            2 => (
                vec!["install".into(), variant(files.path(), "probe", round)],
                400,
            ),
            3 => (
                vec![
                    "call".into(),
                    "count_cached".into(),
                    json!({"key": round}).to_string(),
                ],
                20,
            ),
            _ => (vec!["remove".into(), "count".into()], 20),
        };
        let mut child = toolhost(data.path()).args(&args).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(round as u64 * 37 % span_ms));
        child.kill().unwrap(); // SIGKILL: no destructor, no flush
        child.wait().unwrap();

        let listed = toolhost(data.path()).arg("list").output().unwrap();
        assert!(
            listed.status.success(),
            "round {round} ({args:?}): the store did not reopen: {}",
            String::from_utf8_lossy(&listed.stderr)
        );
    }

    let host = Host::open(HostConfig {
        data_dir: Some(data.path().to_owned()),
        ..crate::plugins::config()
    })
    .await
    .unwrap();
    let component = |tool: &str| match host.describe("acme", tool).map(|t| t.source) {
        Some(Source::Wasm { component, .. }) => Some(component),
        _ => None,
    };
    // The two tools of one pack are written in one batch: never one without the other, never
    // at different builds.
    assert_eq!(component("text_stats"), component("word_frequency"));
    let acme = Caller::tenant("acme");
    for info in host.list("acme") {
        let args = match info.spec.name.as_str() {
            "text_stats" | "word_frequency" => json!({"text": "still here"}),
            "count" | "count_cached" => json!({"key": "after"}),
            "busy" => json!({"ms": 1}),
            _ => continue,
        };
        let out = host.call(&acme, &info.spec.name, args).await;
        assert!(out.result.is_ok(), "{}: {:?}", info.spec.name, out.result);
    }
}
