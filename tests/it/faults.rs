//! Storage faults end in clear errors, never in a hang or a lost write: a full disk under
//! the CLI, then space coming back.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::{Server, call, cli, http, plugin_file, run, tenant, toolhost};

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop. Mounting needs root:
/// under CI its absence fails the test; elsewhere the test says it is skipped.
struct SmallDisk {
    dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> Option<SmallDisk> {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("disk");
        std::fs::create_dir(&dir).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .output();
        match mounted {
            Ok(out) if out.status.success() => Some(SmallDisk {
                dir,
                _parent: parent,
            }),
            other if std::env::var_os("CI").is_some() => {
                panic!("CI must mount a small tmpfs (as root): {other:?}")
            }
            other => {
                eprintln!("skipped: cannot mount a tmpfs (needs root): {other:?}");
                None
            }
        }
    }

    fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.dir)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazily: a store abandoned on a failed disk may still hold files open there.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// The built component of the example or test plugin `name`.
/// The issue: the second install on a 1.5 MB filesystem never returned (the store of then
/// waited forever to close). Now it fails in seconds, saying why, and once there is space
/// again the store has every acknowledged write and takes new ones.
#[test]
fn a_full_disk_fails_an_install_fast_and_clearly_and_loses_nothing() {
    let Some(disk) = SmallDisk::mount("1500k") else {
        return;
    };
    let data = disk.dir.join("data");
    let text_stats = plugin_file("text_stats");
    let (code, out, _) = toolhost(&data, &["install", text_stats.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");

    let json_query = plugin_file("json_query");
    let (code, out, took) = toolhost(&data, &["install", json_query.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("No space left on device"), "{out}");
    assert!(took < Duration::from_secs(5), "took {took:?}");

    disk.resize("20m");
    let (code, out, _) = toolhost(&data, &["call", "text_stats", r#"{"text": "still here"}"#]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("\"words\": 2"), "{out}");
    let (code, out, _) = toolhost(&data, &["install", json_query.to_str().unwrap()]);
    assert_eq!(code, Some(0), "space came back, writes succeed: {out}");
}

/// Fills the filesystem holding `dir` to the brim with a file of zeros; returns it.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let ballast = dir.join("ballast");
    let mut file = std::fs::File::create(&ballast).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    while file.write_all(&chunk).is_ok() {}
    while file.write_all(&chunk[..512]).is_ok() {}
    ballast
}

/// `serve` on a disk that fills: each kind of write answers with a typed error naming the
/// cause (an install 503 `storage_unavailable`, a call held for approval
/// `storage_unavailable`, a KV write the tool's own error), `/healthz` and `/metrics` say the
/// store is down, and everything that needs no write goes on being served (listing, calls,
/// calls whose result cannot be cached, a component whose compiled artifact cannot be
/// stored); SIGTERM still stops it promptly, and a restart finds every acknowledged write.
#[test]
fn a_server_on_a_full_disk_refuses_writes_clearly_and_serves_reads() {
    let Some(disk) = SmallDisk::mount("32m") else {
        return;
    };
    let data = disk.dir.join("data");
    let key = tenant(
        &data,
        "acme",
        r#"{"needs_approval": ["busy"]}"#,
        &["probe", "text_stats"],
    );
    // Artifacts sealed with another key than the store's: every component is compiled again
    // on its first call, and storing the new artifact is a write.
    let fresh_artifacts = tempfile::tempdir().unwrap();
    let server = Server::start(&data, fresh_artifacts.path(), &[]);
    let addr = server.addr;
    assert_eq!(http(addr, "GET", "/healthz", &key, b"").0, 200);
    assert_eq!(call(addr, &key, "count", r#"{"key": "k"}"#)["result"], 1);

    let ballast = fill(&disk.dir);
    let json_query = std::fs::read(plugin_file("json_query")).unwrap();
    let (status, body) = http(addr, "POST", "/v1/tools", &key, &json_query);
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("storage_unavailable") && body.contains("No space left"),
        "{body}"
    );
    let (status, body) = http(addr, "GET", "/healthz", &key, b"");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("storage_unavailable"), "{body}");
    let (_, metrics) = http(addr, "GET", "/metrics", &key, b"");
    assert!(metrics.contains("toolhost_storage_up 0\n"), "{metrics}");

    // Reads, and calls that need no write, are served from memory.
    let (status, body) = http(addr, "GET", "/v1/tools", &key, b"");
    assert!(status == 200 && body.contains("text_stats"), "{body}");
    let words = call(addr, &key, "text_stats", r#"{"text": "still here"}"#);
    assert_eq!(words["result"]["words"], 2, "not compiled before: {words}");
    for _ in 0..2 {
        let echoed = call(addr, &key, "echo_cached", r#"{"key": "hi"}"#);
        assert_eq!(echoed["result"], "hi", "{echoed}");
        assert_eq!(
            echoed["cache_hit"], false,
            "the cache takes no writes: {echoed}"
        );
    }
    // Writes a call needs fail with a typed error.
    let held = call(addr, &key, "busy", r#"{"ms": 1}"#);
    assert_eq!(held["error"]["code"], "storage_unavailable", "{held}");
    let counted = call(addr, &key, "count", r#"{"key": "k"}"#);
    assert_eq!(counted["error"]["code"], "tool_error", "{counted}");
    assert!(
        counted["error"]["message"]
            .as_str()
            .unwrap()
            .contains("storage is unavailable"),
        "{counted}"
    );

    // Space comes back: this process takes no more writes (the store needs reopening after
    // a failed commit), and says so at once; a restart recovers, with every acknowledged write.
    std::fs::remove_file(ballast).unwrap();
    let (status, body) = http(addr, "POST", "/v1/tools", &key, &json_query);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("restart it once the disk is fixed"), "{body}");
    server.stop();

    let server = Server::start(&data, fresh_artifacts.path(), &[]);
    let addr = server.addr;
    assert_eq!(http(addr, "GET", "/healthz", &key, b"").0, 200);
    assert_eq!(call(addr, &key, "count", r#"{"key": "k"}"#)["result"], 2);
    let (status, body) = http(addr, "POST", "/v1/tools", &key, &json_query);
    assert_eq!(status, 201, "space came back, writes succeed: {body}");
    server.stop();
}

/// Runs the CLI with the wall clock at `at` (Debian's `faketime`); under CI its absence fails.
fn toolhost_at(at: &str, data: &Path, args: &[&str]) -> Option<(Option<i32>, String)> {
    let out = Command::new("faketime")
        .arg(at)
        .arg(env!("CARGO_BIN_EXE_toolhost"))
        .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .output();
    match out {
        Ok(out) => Some((
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )),
        Err(e) if std::env::var_os("CI").is_some() => panic!("CI must have faketime: {e}"),
        Err(e) => {
            eprintln!("skipped: no faketime ({e})");
            None
        }
    }
}

/// The wall clock jumps between processes, across a cached result's 60 s TTL: forwards, a
/// result expires when it should; back a little, it does not expire early and still expires
/// at its time; back further than any TTL, it expires (it cannot live forever); nothing
/// panics on a negative duration.
#[test]
fn clock_jumps_neither_expire_cached_results_early_nor_keep_them_forever() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let probe = plugin_file("probe");
    let (code, out, _) = toolhost(&data, &["tenant", "create", "acme"]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out, _) = toolhost(
        &data,
        &["--tenant", "acme", "install", probe.to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{out}");
    // `count_cached` counts its calls in KV; a cached answer repeats the count it cached.
    let count_at = |at: &str| {
        let args = [
            "--tenant",
            "acme",
            "call",
            "count_cached",
            r#"{"key": "k"}"#,
        ];
        let (code, out) = toolhost_at(at, &data, &args)?;
        assert_eq!(code, Some(0), "at {at}: {out}");
        let count = out.lines().next().unwrap().trim().parse::<u64>();
        Some(count.unwrap_or_else(|_| panic!("at {at}: {out}")))
    };
    let Some(first) = count_at("2030-01-01 00:00:00") else {
        return;
    };
    assert_eq!(first, 1);
    assert_eq!(count_at("2030-01-01 00:00:30"), Some(1), "within the TTL");
    assert_eq!(
        count_at("2029-12-31 23:00:00"),
        Some(1),
        "an hour back: not expired early"
    );
    assert_eq!(
        count_at("2030-01-01 00:01:01"),
        Some(2),
        "past the TTL: run again"
    );
    assert_eq!(count_at("2031-06-01 00:00:00"), Some(3), "a year on");
    assert_eq!(count_at("2031-06-01 00:00:10"), Some(3), "and cached again");
    // Back two years: the entry claims to live longer than any TTL, so its age is unknown.
    assert_eq!(count_at("2029-06-01 00:00:00"), Some(4), "not kept forever");
}

/// `fiu-run` (Debian's `fiu-utils`) failing each of the store's reads, writes and syncs with
/// `probability`, as a command prefix; `None` where it is missing (under CI, the test fails).
fn fiu_run(probability: f64) -> Option<Vec<String>> {
    if let Err(e) = Command::new("fiu-run").arg("-h").output() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must have fiu-run: {e}"
        );
        eprintln!("skipped: no fiu-run ({e})");
        return None;
    }
    let mut prefix = vec!["fiu-run".to_owned(), "-x".to_owned()];
    for point in [
        "posix/io/rw/pread*",
        "posix/io/rw/pwrite*",
        "posix/io/sync/*",
    ] {
        prefix.push("-c".to_owned());
        prefix.push(format!(
            "enable_random name={point},probability={probability}"
        ));
    }
    Some(prefix)
}

/// The CLI under [`fiu_run`].
fn toolhost_with_io_errors(
    probability: f64,
    data: &Path,
    args: &[&str],
) -> Option<(Option<i32>, String, Duration)> {
    let prefix = fiu_run(probability)?;
    let cli = cli(data, args);
    let mut command = Command::new(&prefix[0]);
    command
        .args(&prefix[1..])
        .arg(cli.get_program())
        .args(cli.get_args())
        .envs(cli.get_envs().filter_map(|(k, v)| Some((k, v?))));
    Some(run(command))
}

/// Random I/O errors (libfiu) under a run of mixed writes, a process each: every command
/// ends within its bound, succeeds or says the store failed (exit code 1), never panics; a
/// run without faults then finds every acknowledged write.
#[test]
fn random_io_errors_never_hang_crash_or_lose_an_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let probe = plugin_file("probe");
    let (code, out, _) = toolhost(&data, &["install", probe.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");

    // Each component, and a tool it installs.
    let installs = [
        ("text_stats", "text_stats"),
        ("json_query", "json_query"),
        ("unit_convert", "convert_units"),
    ];
    let (mut acknowledged_keys, mut acknowledged_tools) = (Vec::new(), Vec::new());
    let (mut acknowledged_count, mut failures) = (0, 0);
    for i in 0..24 {
        let key = format!("K{i}");
        let value = format!("v{i}");
        let (component, tool) = installs[i / 3 % 3];
        let file = plugin_file(component);
        let install = file.to_str().unwrap();
        let args: &[&str] = match i % 3 {
            0 => &["config", "set", &key, &value],
            1 => &["call", "count", r#"{"key": "c"}"#],
            _ => &["install", install],
        };
        let Some((code, out, took)) = toolhost_with_io_errors(0.02, &data, args) else {
            return;
        };
        let op = args.join(" ");
        assert!(took < Duration::from_secs(10), "`{op}` took {took:?}");
        assert!(!out.contains("panicked"), "`{op}` panicked: {out}");
        match code {
            Some(0) => match i % 3 {
                0 => acknowledged_keys.push(format!("{key} = {value}")),
                1 => acknowledged_count = out.trim().parse::<u64>().unwrap(),
                _ => acknowledged_tools.push(tool),
            },
            Some(1) => failures += 1,
            other => panic!("`{op}` exited with {other:?}: {out}"),
        }
    }
    eprintln!("{failures} of 24 commands failed on an injected I/O error");

    let (code, listed, _) = toolhost(&data, &["config", "list"]);
    assert_eq!(code, Some(0), "{listed}");
    for key in &acknowledged_keys {
        assert!(listed.lines().any(|l| l == key), "{key} lost: {listed}");
    }
    let (code, tools, _) = toolhost(&data, &["list"]);
    assert_eq!(code, Some(0), "{tools}");
    for tool in acknowledged_tools {
        assert!(tools.contains(tool), "{tool} lost: {tools}");
    }
    let (code, out, _) = toolhost(&data, &["call", "count", r#"{"key": "c"}"#]);
    assert_eq!(code, Some(0), "{out}");
    let count = out.trim().parse::<u64>().unwrap();
    assert!(
        count > acknowledged_count,
        "{count} after {acknowledged_count}"
    );
}

/// `serve` under libfaketime, its wall clock offset by what `offset` writes (seconds, read
/// at every clock read; the monotonic clock is left alone, as NTP leaves it); `None` where
/// libfaketime is missing (under CI, the test fails instead).
fn faketime_env(offset: &Path) -> Option<Vec<(&'static str, std::ffi::OsString)>> {
    let lib = Path::new("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1");
    if !lib.exists() {
        assert!(std::env::var_os("CI").is_none(), "CI must have faketime");
        eprintln!("skipped: no libfaketime");
        return None;
    }
    std::fs::write(offset, "+0").unwrap();
    Some(vec![
        ("LD_PRELOAD", lib.into()),
        ("FAKETIME_TIMESTAMP_FILE", offset.into()),
        ("FAKETIME_NO_CACHE", "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
    ])
}

/// The wall clock jumps under a running server: rate-limit windows go by the monotonic
/// clock and do not notice; a call held for approval is not expired early by a jump back,
/// expires when a jump forward passes its hour, and cannot be kept forever by a jump back
/// further than its hour. Nothing panics on a negative duration.
#[test]
fn clock_jumps_under_a_running_server_expire_nothing_early_and_keep_nothing_forever() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let offset = dir.path().join("clock-offset");
    let Some(env) = faketime_env(&offset) else {
        return;
    };
    let acme = tenant(&data, "acme", r#"{"needs_approval": ["busy"]}"#, &["probe"]);
    let metered = r#"{"calls_per_minute": 2, "burst": 2}"#;
    let metered = tenant(&data, "metered", metered, &["probe"]);
    let env: Vec<_> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let server = Server::start(&data, crate::plugins::artifact_dir(), &env);
    let addr = server.addr;
    let jump = |seconds: i64| std::fs::write(&offset, format!("{seconds:+}")).unwrap();

    for _ in 0..2 {
        assert_eq!(call(addr, &metered, "busy", r#"{"ms": 1}"#)["ok"], true);
    }
    for seconds in [0, 2 * 3600, -365 * 86400] {
        jump(seconds);
        let limited = call(addr, &metered, "busy", r#"{"ms": 1}"#);
        assert_eq!(
            limited["error"]["code"], "rate_limited",
            "at {seconds:+} s: {limited}"
        );
        let retry = limited["error"]["retry_after_ms"].as_u64().unwrap();
        assert!(retry <= 60_000, "at {seconds:+} s: retry in {retry} ms");
    }

    let hold = || {
        let held = call(addr, &acme, "busy", r#"{"ms": 1}"#);
        assert_eq!(held["error"]["code"], "approval_required", "{held}");
        held["call_id"].as_str().unwrap().to_owned()
    };
    let pending = |id: &str| {
        let (status, body) = http(addr, "GET", "/v1/approvals", &acme, b"");
        assert_eq!(status, 200, "{body}");
        body.contains(id)
    };
    jump(0);
    let first = hold();
    jump(1800);
    assert!(pending(&first), "half an hour on: still held");
    jump(-1800);
    assert!(pending(&first), "half an hour back: not expired early");
    jump(2 * 3600);
    assert!(!pending(&first), "two hours on: expired");
    let path = format!("/v1/approvals/{first}/approve");
    let (status, body) = http(addr, "POST", &path, &acme, b"");
    assert_eq!(status, 404, "an expired call does not run: {body}");

    let second = hold();
    jump(3600 + 1800);
    assert!(
        pending(&second),
        "held at +2 h, the clock back to +1.5 h: still held"
    );
    jump(-2 * 3600);
    assert!(
        !pending(&second),
        "back four hours, more than its hour: not kept forever"
    );
    server.stop();
}

/// The data directory is removed under a running server (an operator's slip, or its disk
/// unmounted): writes are refused with the reason instead of going to a file that no restart
/// will find, `/healthz` says so at once, and calls go on.
#[test]
fn a_server_whose_data_directory_is_removed_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = tenant(&data, "acme", "{}", &["probe"]);
    let server = Server::start(&data, crate::plugins::artifact_dir(), &[]);
    let addr = server.addr;
    std::fs::remove_dir_all(&data).unwrap();
    let (status, body) = http(addr, "GET", "/healthz", &key, b"");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("was removed"), "{body}");
    let (status, body) = http(
        addr,
        "PUT",
        "/v1/config/REGION",
        &key,
        br#"{"value": "eu"}"#,
    );
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("storage_unavailable"), "{body}");
    let echoed = call(addr, &key, "echo_cached", r#"{"key": "hi"}"#);
    assert_eq!(echoed["result"], "hi", "{echoed}");
    server.stop();
}

/// `serve` under random I/O errors (2 % of the store's reads, writes and syncs failing):
/// every request is answered in time with success or a typed 503, the server lives on and
/// stops on SIGTERM, and a restart finds every acknowledged configuration value.
#[test]
fn a_server_under_random_io_errors_answers_every_request_and_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = tenant(&data, "acme", "{}", &["probe"]);
    let Some(prefix) = fiu_run(0.02) else {
        return;
    };
    // Opening can fail on an injected read error too: that is an error exit, said clearly.
    let server = (0..10)
        .find_map(|_| {
            Server::start_under(&prefix, &data, crate::plugins::artifact_dir(), &[])
                .inspect_err(|e| {
                    assert!(e.contains("exit status: 1") && e.contains("error: "), "{e}")
                })
                .ok()
        })
        .expect("serve starts within 10 tries");
    let addr = server.addr;
    let (mut acknowledged, mut refused) = (Vec::new(), 0);
    for i in 0..40 {
        let (path, body) = if i % 2 == 0 {
            let body = format!(r#"{{"value": "v{i}"}}"#);
            (format!("/v1/config/K{i}"), body)
        } else {
            let body = format!(r#"{{"arguments": {{"key": "k{i}"}}}}"#);
            ("/v1/tools/echo_cached/call".to_owned(), body)
        };
        let method = if i % 2 == 0 { "PUT" } else { "POST" };
        let (status, answer) = http(addr, method, &path, &key, body.as_bytes());
        match status {
            204 => acknowledged.push(format!(r#""key":"K{i}""#)),
            200 => assert!(answer.contains(&format!(r#""result":"k{i}""#)), "{answer}"),
            503 => {
                assert!(answer.contains("storage_unavailable"), "{answer}");
                refused += 1;
            }
            _ => panic!("`{method} {path}` answered {status}: {answer}"),
        }
    }
    eprintln!("{refused} of 40 requests refused on an injected I/O error");
    server.stop();

    let server = Server::start(&data, crate::plugins::artifact_dir(), &[]);
    let (status, listed) = http(server.addr, "GET", "/v1/config", &key, b"");
    assert_eq!(status, 200, "{listed}");
    for value in &acknowledged {
        assert!(listed.contains(value.as_str()), "{value} lost: {listed}");
    }
    server.stop();
}
