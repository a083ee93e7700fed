//! Storage faults end in clear errors, never in a hang or a lost write: a full disk under
//! the CLI, then space coming back.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
fn plugin_file(name: &str) -> PathBuf {
    crate::plugins::plugins_dir().join(format!("{name}.wasm"))
}

/// Runs the CLI; one that has not ended within 30 s is killed, and says so.
fn toolhost(data: &Path, args: &[&str]) -> (Option<i32>, String, Duration) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolhost"))
        .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            panic!("`toolhost {}` hung for 30 s", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text, started.elapsed())
}

/// The issue: the second install on a 1.5 MB filesystem never returned (sled's close waits
/// forever for a flush that cannot happen). Now it fails in seconds, saying why, and once
/// there is space again the store has every acknowledged write and takes new ones.
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

/// One HTTP/1.1 request to `addr` (the connection closes after it): status and body.
fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    key: &str,
    body: &[u8],
) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let content_type = if path == "/v1/tools" {
        "application/wasm"
    } else {
        "application/json"
    };
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .expect("the server answers within 10 s");
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// `serve` on a disk that fills: writes answer 503 `storage_unavailable` naming the cause,
/// `/healthz` and `/metrics` say the store is down, and everything that needs no write
/// (listing, calling a tool that writes nothing) goes on being served; SIGTERM still stops
/// it promptly. (A process of its own: sled's state is process-wide, and a store abandoned
/// on a failed disk would wedge every other store in the test process.)
#[test]
fn a_server_on_a_full_disk_refuses_writes_clearly_and_serves_reads() {
    let Some(disk) = SmallDisk::mount("1500k") else {
        return;
    };
    let data = disk.dir.join("data");
    let text_stats = plugin_file("text_stats");
    for args in [
        &["tenant", "create", "acme"][..],
        &["--tenant", "acme", "install", text_stats.to_str().unwrap()],
    ] {
        let (code, out, _) = toolhost(&data, args);
        assert_eq!(code, Some(0), "{out}");
    }
    let (code, key, _) = toolhost(
        &data,
        &["--tenant", "acme", "key", "create", "--role", "admin"],
    );
    assert_eq!(code, Some(0), "{key}");
    let key = key.lines().next().unwrap().trim().to_owned();

    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut server = Command::new(env!("CARGO_BIN_EXE_toolhost"))
        .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
        .arg("--data-dir")
        .arg(&data)
        .args(["serve", "--listen", &addr.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            ready.elapsed() < Duration::from_secs(20),
            "serve did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(http(addr, "GET", "/healthz", &key, b"").0, 200);

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
    // Reads and calls that write nothing are served from memory.
    let (status, body) = http(addr, "GET", "/v1/tools", &key, b"");
    assert!(status == 200 && body.contains("text_stats"), "{body}");
    let args = br#"{"arguments": {"text": "still here"}}"#;
    let (status, body) = http(addr, "POST", "/v1/tools/text_stats/call", &key, args);
    assert!(status == 200 && body.contains("\"words\":2"), "{body}");
    // Space comes back: this process takes no more writes (sled could wait forever on
    // one), and says so at once; a restart recovers.
    disk.resize("20m");
    let (status, body) = http(addr, "POST", "/v1/tools", &key, &json_query);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("restart it once the disk is fixed"), "{body}");

    let stopping = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&server),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    while server.try_wait().unwrap().is_none() {
        if stopping.elapsed() > Duration::from_secs(15) {
            server.kill().unwrap();
            panic!("serve on a failed disk did not stop within 15 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
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
