//! The example plugins, built once per process by the same script the README uses.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
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

/// The bytes of `plugins/<name>` (underscores: `text_stats`).
pub fn plugin(name: &str) -> Vec<u8> {
    std::fs::read(plugins_dir().join(format!("{name}.wasm"))).unwrap()
}

/// The JavaScript runtime component, built once per process by `scripts/build-js-runtime`.
pub fn js_runtime() -> Vec<u8> {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    let path = PATH.get_or_init(|| {
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
    });
    std::fs::read(path).unwrap()
}

/// `plugins/js-component/word_count.ts` built into a component by the JS SDK's
/// `toolhost-js build`, once per process (installing the SDK's npm packages if needed).
pub fn js_component() -> Vec<u8> {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    let path = PATH.get_or_init(|| {
        let sdk = root().join("guest-sdk/js");
        if !sdk.join("node_modules").exists() {
            let status = Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--prefix"])
                .arg(&sdk)
                .status()
                .expect("running npm ci for guest-sdk/js");
            assert!(status.success(), "npm ci for guest-sdk/js failed");
        }
        let out_dir = root().join("target/plugins/js");
        std::fs::create_dir_all(&out_dir).unwrap();
        let output = out_dir.join("word_count.wasm");
        let out = Command::new("node")
            .arg(sdk.join("bin/toolhost-js.mjs"))
            .arg("build")
            .arg(root().join("plugins/js-component/word_count.ts"))
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
    });
    std::fs::read(path).unwrap()
}
