//! The example plugins, built once per process by the same script the README uses.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use toolhost::HostConfig;

/// The repository: the tests belong to `host/cli`.
pub fn root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .canonicalize()
            .unwrap()
    })
}

pub fn plugins_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new("bash")
            .arg(root().join("scripts/build-plugins"))
            .output()
            .expect("running scripts/build-plugins");
        assert!(
            out.status.success(),
            "building plugins failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// Where every host of this test run shares compiled components, so each plugin (and the
/// JS runtime) goes through Cranelift once per run rather than once per test. CLI processes
/// the tests start are given it as `TOOLHOST_ARTIFACT_DIR`.
pub fn artifact_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| root().join("target/test-artifacts"))
}

/// The host settings every test starts from: the defaults, with the shared artifacts.
pub fn config() -> HostConfig {
    HostConfig {
        artifact_dir: Some(artifact_dir().to_owned()),
        // Snapshots are a cache that takes a core for a second or two per JS tool: on for the
        // tests of JS tools (`js_platform`, `js_wpt`), which run on them and without them.
        js_snapshots: 0,
        ..HostConfig::default()
    }
}

/// The bytes of `plugins/<name>` (underscores: `text_stats`).
pub fn plugin(name: &str) -> Vec<u8> {
    std::fs::read(plugins_dir().join(format!("{name}.wasm"))).unwrap()
}

/// The same component with a custom section appended: other bytes, other sha256, same tools.
pub fn variant(name: &str, tag: &str) -> Vec<u8> {
    let mut bytes = plugin(name);
    let payload = [&[tag.len() as u8][..], tag.as_bytes()].concat();
    bytes.push(0); // custom section id
    bytes.push(payload.len() as u8);
    bytes.extend(payload);
    bytes
}

/// The JavaScript runtime component, built once per process by `scripts/build-js-runtime`.
pub fn js_runtime() -> Vec<u8> {
    std::fs::read(js_runtime_path()).unwrap()
}

/// Where [`js_runtime`] is.
pub fn js_runtime_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let out = Command::new("bash")
            .arg(root().join("scripts/build-js-runtime"))
            .output()
            .expect("running scripts/build-js-runtime");
        assert!(
            out.status.success(),
            "building the JS runtime failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// `plugins/js-component/word_count.ts` built into a component by the JS SDK's
/// `toolhost-js build`, once per process (installing the SDK's npm packages if needed).
pub fn js_component() -> Vec<u8> {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    std::fs::read(PATH.get_or_init(|| build_js_component("word_count"))).unwrap()
}

/// `plugins/js-component/weather.ts`, which calls an HTTP API with `fetch`, built likewise.
pub fn js_weather_component() -> Vec<u8> {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    std::fs::read(PATH.get_or_init(|| build_js_component("weather"))).unwrap()
}

fn build_js_component(name: &str) -> PathBuf {
    // One `npm ci` for every build in this process.
    static SDK: OnceLock<PathBuf> = OnceLock::new();
    let sdk = SDK.get_or_init(|| {
        let sdk = root().join("guest-sdk/js");
        if !sdk.join("node_modules").exists() {
            let status = Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--prefix"])
                .arg(&sdk)
                .status()
                .expect("running npm ci for guest-sdk/js");
            assert!(status.success(), "npm ci for guest-sdk/js failed");
        }
        sdk
    });
    let out_dir = root().join("target/plugins/js");
    std::fs::create_dir_all(&out_dir).unwrap();
    let output = out_dir.join(format!("{name}.wasm"));
    let out = Command::new("node")
        .arg(sdk.join("bin/toolhost-js.mjs"))
        .arg("build")
        .arg(root().join(format!("plugins/js-component/{name}.ts")))
        .arg("-o")
        .arg(&output)
        .output()
        .expect("running toolhost-js build");
    assert!(
        out.status.success(),
        "toolhost-js build failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    output
}

/// Fires once, when the next call on `host` has resolved its tool and passed its preflight:
/// an event to wait on instead of sleeping until a call is surely running.
pub fn next_call_started(host: &toolhost::Host) -> tokio::sync::oneshot::Receiver<()> {
    struct Started(std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>);
    impl toolhost::CallHook for Started {
        fn before(&self, _call: &toolhost::HookCall) -> Result<(), String> {
            if let Some(started) = self.0.lock().unwrap().take() {
                let _ = started.send(());
            }
            Ok(())
        }
    }
    let (started, receiver) = tokio::sync::oneshot::channel();
    host.add_hook(std::sync::Arc::new(Started(std::sync::Mutex::new(Some(
        started,
    )))));
    receiver
}

/// The search model's directory (`scripts/fetch-search-model`). Under CI its absence fails
/// the test; elsewhere the test says it is skipped.
pub fn search_model() -> Option<PathBuf> {
    match std::env::var_os("TOOLHOST_SEARCH_MODEL") {
        Some(dir) => Some(dir.into()),
        None if std::env::var_os("CI").is_some() => {
            panic!("TOOLHOST_SEARCH_MODEL is not set under CI (scripts/test sets it)")
        }
        None => {
            eprintln!("skipped: TOOLHOST_SEARCH_MODEL is not set (see scripts/fetch-search-model)");
            None
        }
    }
}

/// Calls that started from a pre-initialised snapshot, from the host's metrics.
pub fn snapshot_calls(host: &toolhost::Host) -> u64 {
    let text = host.metrics().render();
    let line = text
        .lines()
        .find(|l| l.starts_with("toolhost_component_loads_total{source=\"snapshot\"}"))
        .unwrap();
    line.rsplit(' ').next().unwrap().parse().unwrap()
}
