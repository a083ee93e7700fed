//! web-platform-tests, run inside a stored-source JS tool with WPT's own testharness.js: the
//! encoding, abort, structured clone, WebCrypto digest, high-resolution time, timers,
//! microtask and URLSearchParams suites, as Debian's
//! `nodejs` source package ships them (`scripts/wpt` fetches it). A subtest that fails must be
//! listed, with the reason, in `wpt-expectations.json`; a listed one that passes fails the
//! test too, so the list stays true. `TOOLHOST_WPT_UPDATE=1` rewrites the list from a run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::json;
use toolhost::{Caller, Host, HostConfig};

/// The WPT files run, relative to WPT's root.
const FILES: &[&str] = &[
    "encoding/api-basics.any.js",
    "encoding/api-surrogates-utf8.any.js",
    "encoding/textdecoder-arguments.any.js",
    "encoding/textdecoder-byte-order-marks.any.js",
    "encoding/textdecoder-copy.any.js",
    "encoding/textdecoder-eof.any.js",
    "encoding/textdecoder-fatal.any.js",
    "encoding/textdecoder-fatal-streaming.any.js",
    "encoding/textdecoder-ignorebom.any.js",
    "encoding/textdecoder-streaming.any.js",
    "encoding/textencoder-constructor-non-utf.any.js",
    "encoding/textencoder-utf16-surrogates.any.js",
    "encoding/encodeInto.any.js",
    "dom/abort/AbortSignal.any.js",
    "dom/abort/event.any.js",
    "dom/abort/abort-signal-any.any.js",
    "html/webappapis/structured-clone/structured-clone.any.js",
    "WebCryptoAPI/digest/digest.https.any.js",
    "hr-time/basic.any.js",
    "hr-time/monotonic-clock.any.js",
    "html/webappapis/microtask-queuing/queue-microtask.any.js",
    "html/webappapis/timers/cleartimeout-clearinterval.any.js",
    "html/webappapis/timers/missing-timeout-setinterval.any.js",
    "html/webappapis/timers/negative-setinterval.any.js",
    "html/webappapis/timers/negative-settimeout.any.js",
    "url/urlsearchparams-append.any.js",
    "url/urlsearchparams-constructor.any.js",
    "url/urlsearchparams-delete.any.js",
    "url/urlsearchparams-foreach.any.js",
    "url/urlsearchparams-get.any.js",
    "url/urlsearchparams-getall.any.js",
    "url/urlsearchparams-has.any.js",
    "url/urlsearchparams-set.any.js",
    "url/urlsearchparams-size.any.js",
    "url/urlsearchparams-sort.any.js",
    "url/urlsearchparams-stringifier.any.js",
];

/// Runs testharness.js, then a file with its `META: script`s (one script, as they share a
/// browser's global lexical scope), and returns the harness's status and every subtest's
/// result. Names and messages are made well-formed, to be JSON.
const RUNNER: &str = r#"
export const spec = {
  name: "wpt", description: "Runs a web-platform-tests file.", parameters: { type: "object" },
  limits: { timeout_ms: 60000, fuel: 100000000000 },
};
export default async function ({ scripts }) {
  globalThis.self = globalThis;
  const results = [];
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const errors = [];
  for (const [i, script] of scripts.entries()) {
    try {
      (0, eval)(script);
    } catch (e) {
      errors.push(`script ${i}: ${e}`);
    }
    if (i === 0) {
      const text = (value) => (value == null ? null : String(value).toWellFormed());
      add_result_callback((t) => results.push({ name: text(t.name), status: t.status, message: text(t.message) }));
      add_completion_callback((_, status) => finish({ status: status.status, message: status.message ?? null }));
    }
  }
  // A test that waits on something we do not provide (MessageChannel, say) would hold the
  // harness forever: past a deadline the harness times the rest out and reports them.
  const stuck = setTimeout(() => timeout(), 20000);
  const harness = await finished;
  clearTimeout(stuck);
  return { harness, errors, results };
}
"#;

fn wpt_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = std::process::Command::new("bash")
            .arg(crate::plugins::root().join("scripts/wpt"))
            .output()
            .expect("running scripts/wpt");
        assert!(
            out.status.success(),
            "fetching web-platform-tests failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// testharness.js, then the file's `// META: script=` dependencies and the file itself.
fn scripts(root: &Path, file: &str) -> [String; 2] {
    let path = root.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let harness = std::fs::read_to_string(root.join("resources/testharness.js")).unwrap();
    let mut scripts = Vec::new();
    for line in text.lines() {
        if let Some(script) = line.strip_prefix("// META: script=") {
            let script = script.trim();
            let at = match script.strip_prefix('/') {
                Some(absolute) => root.join(absolute),
                None => path.parent().unwrap().join(script),
            };
            scripts.push(
                std::fs::read_to_string(&at).unwrap_or_else(|e| panic!("{}: {e}", at.display())),
            );
        }
    }
    scripts.push(text);
    [harness, scripts.join("\n;\n")]
}

#[tokio::test]
async fn the_web_platform_tests_pass_except_where_listed() {
    let root = wpt_dir();
    let host = Host::open(HostConfig {
        js_runtime: Some(crate::plugins::js_runtime()),
        js_snapshots: HostConfig::default().js_snapshots,
        ..crate::plugins::config()
    })
    .await
    .unwrap();
    host.install_js("acme", RUNNER).await.unwrap();
    let expectations: BTreeMap<String, BTreeMap<String, String>> = serde_json::from_str(
        &std::fs::read_to_string(crate::plugins::root().join("tests/it/wpt-expectations.json"))
            .unwrap(),
    )
    .unwrap();
    let mut problems = Vec::new();
    let mut failing: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let (mut passed, mut total) = (0, 0);
    for file in FILES {
        let out = host
            .call(
                &Caller::tenant("acme"),
                "wpt",
                json!({"scripts": scripts(root, file)}),
            )
            .await;
        let report = match out.result {
            Ok(report) => report,
            Err(e) => {
                problems.push(format!("{file}: the run failed: {e}"));
                continue;
            }
        };
        if report["harness"]["status"] != 0 || report["errors"] != json!([]) {
            problems.push(format!(
                "{file}: harness {} {}",
                report["harness"], report["errors"]
            ));
        }
        let expected = expectations.get(*file).cloned().unwrap_or_default();
        let results = report["results"].as_array().unwrap();
        for result in results {
            let name = result["name"].as_str().unwrap();
            let pass = result["status"] == 0;
            total += 1;
            passed += usize::from(pass);
            if !pass {
                let reason: String = result["message"]
                    .as_str()
                    .unwrap_or("")
                    .chars()
                    .take(160)
                    .collect();
                failing
                    .entry(file.to_string())
                    .or_default()
                    .insert(name.to_owned(), reason);
            }
            match (pass, expected.contains_key(name)) {
                (false, false) => {
                    problems.push(format!("{file}: FAIL {name}: {}", result["message"]))
                }
                (true, true) => problems.push(format!("{file}: now passes, unlist it: {name}")),
                _ => {}
            }
        }
        for name in expected.keys() {
            if !results.iter().any(|r| r["name"] == name.as_str()) {
                problems.push(format!("{file}: listed but not run: {name}"));
            }
        }
        if results.is_empty() {
            problems.push(format!("{file}: no subtest ran"));
        }
    }
    println!("web-platform-tests: {passed} of {total} subtests pass");
    if std::env::var_os("TOOLHOST_WPT_UPDATE").is_some() {
        let path = crate::plugins::root().join("tests/it/wpt-expectations.json");
        let text = serde_json::to_string_pretty(&failing).unwrap();
        std::fs::write(path, text + "\n").unwrap();
        return;
    }
    assert!(total > 600, "{total}");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
