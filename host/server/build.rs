//! The web console's files are embedded from `console/dist` (`scripts/build-console`).

fn main() {
    let dist = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../console/dist");
    // rust-embed resolves the folder when this crate compiles, and a debug build then reads
    // files beneath it: it must exist (empty until the console is built) for a console
    // built later to be found.
    let _ = std::fs::create_dir_all(&dist);
    // A rebuilt console (new hashed file names) is embedded again in a release build.
    println!("cargo:rerun-if-changed={}", dist.display());
}
