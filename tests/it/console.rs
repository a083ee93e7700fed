//! The web console in a real browser: `console/tests/console.test.mjs` drives Debian's
//! Chromium with Playwright against a server of ours (sign-in, upload, a call through the
//! generated form, the field at fault marked, rollback, approval, the other pages, a phone
//! viewport, the keyboard). `scripts/test` builds the console and installs both first.

use std::sync::Arc;
use std::time::Duration;

use toolhost::{Host, HostConfig};

use crate::plugins::{config, js_runtime, plugin, root};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_works_in_a_real_browser() {
    let console = root().join("console");
    assert!(
        console.join("dist/index.html").exists(),
        "the console is not built: run scripts/build-console"
    );
    let host = Arc::new(
        Host::open(HostConfig {
            js_runtime: Some(js_runtime()),
            ..config()
        })
        .await
        .unwrap(),
    );
    host.install("acme", plugin("text_stats")).await.unwrap();
    let served = crate::mcp::serve_for_acme(host, toolhost::Role::Admin).await;
    let base = served.url.trim_end_matches("/mcp");
    let mut run = tokio::process::Command::new("npm");
    run.args(["test", "--silent", "--prefix"])
        .arg(&console)
        .env("TOOLHOST_URL", base)
        .env("TOOLHOST_KEY", &served.key)
        .kill_on_drop(true);
    // `TOOLHOST_SCREENSHOTS=docs/console` (from the repository root) refreshes the README's.
    if let Ok(dir) = std::env::var("TOOLHOST_SCREENSHOTS") {
        run.env("TOOLHOST_SCREENSHOTS", root().join(dir));
    }
    let out = tokio::time::timeout(Duration::from_secs(300), run.output())
        .await
        .expect("the browser tests end within 5 minutes")
        .expect("npm is installed");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        report.contains("# fail 0") && !report.contains("# pass 0"),
        "they ran: {report}"
    );
    served.stop.send(()).unwrap();
    served.server.await.unwrap().unwrap();
}
