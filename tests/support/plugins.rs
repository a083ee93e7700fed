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
