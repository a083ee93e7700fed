//! `toolhost` as an operator runs it: the CLI and `toolhost serve` as processes, and a
//! plain HTTP/1.1 client. Shared by the tests that need a real process (faults) and by the
//! load benchmark.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// An example plugin's built component.
pub fn plugin_file(name: &str) -> PathBuf {
    crate::plugins::plugins_dir().join(format!("{name}.wasm"))
}

/// The CLI on `data`, with the tests' shared compiled artifacts.
pub fn cli(data: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolhost"));
    command
        .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
        .arg("--data-dir")
        .arg(data)
        .args(args);
    command
}

/// Runs the CLI; one that has not ended within 30 s is killed, and says so.
pub fn toolhost(data: &Path, args: &[&str]) -> (Option<i32>, String, Duration) {
    run(cli(data, args))
}

/// Runs `command` to its end (killed, and the test failed, after 30 s): its exit code, its
/// stdout and stderr, and how long it took.
pub fn run(mut command: Command) -> (Option<i32>, String, Duration) {
    let started = Instant::now();
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            panic!("`{command:?}` hung for 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text, started.elapsed())
}

/// One HTTP/1.1 request to `addr` (the connection closes after it): status and body.
pub fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    key: &str,
    body: &[u8],
) -> (u16, String) {
    try_http(addr, method, path, key, body).expect("the server answers within 10 s")
}

/// As [`http`], failing rather than panicking when the server cannot be reached or does not
/// answer.
pub fn try_http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    key: &str,
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
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
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
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
    Ok((status, body))
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_addr() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// `toolhost serve` on `data`, its compiled artifacts in `artifacts`, on a free port.
pub struct Server {
    pub child: std::process::Child,
    pub addr: std::net::SocketAddr,
}

impl Server {
    pub fn start(data: &Path, artifacts: &Path, envs: &[(&str, &std::ffi::OsStr)]) -> Server {
        Self::start_under(&[], data, artifacts, envs).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`Server::start`], run by the command `prefix` (such as `fiu-run` and its options);
    /// a server that exits before it listens is an error with its exit status and log.
    pub fn start_under(
        prefix: &[String],
        data: &Path,
        artifacts: &Path,
        envs: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Server, String> {
        Self::launch(prefix, free_addr(), data, artifacts, envs)
    }

    /// As [`Server::start`], on `addr` (a node restarted where its balancer expects it).
    pub fn start_at(
        addr: std::net::SocketAddr,
        data: &Path,
        artifacts: &Path,
        envs: &[(&str, &std::ffi::OsStr)],
    ) -> Server {
        Self::launch(&[], addr, data, artifacts, envs).unwrap_or_else(|e| panic!("{e}"))
    }

    fn launch(
        prefix: &[String],
        addr: std::net::SocketAddr,
        data: &Path,
        artifacts: &Path,
        envs: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Server, String> {
        let toolhost = env!("CARGO_BIN_EXE_toolhost").to_owned();
        let (program, args) = match prefix.split_first() {
            Some((program, args)) => (program, [args, &[toolhost]].concat()),
            None => (&toolhost, vec![]),
        };
        let log_path = data.with_extension("serve.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let mut child = Command::new(program)
            .args(args)
            .env("TOOLHOST_ARTIFACT_DIR", artifacts)
            .envs(envs.iter().copied())
            .arg("--data-dir")
            .arg(data)
            .args(["serve", "--listen", &addr.to_string()])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let ready = Instant::now();
        while std::net::TcpStream::connect(addr).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                return Err(format!("serve exited ({status}) before it listened: {log}"));
            }
            assert!(
                ready.elapsed() < Duration::from_secs(20),
                "serve did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Server { child, addr })
    }

    /// Stops it with SIGTERM, as an operator would; it must be gone within 15 s, and exit by
    /// itself with status 0: a signal handled, not one that killed it.
    pub fn stop(mut self) {
        self.terminate();
        let status = self.wait_exit();
        assert_eq!(
            status.code(),
            Some(0),
            "serve stops cleanly on SIGTERM: {status}"
        );
    }

    /// Sends SIGTERM and returns at once.
    pub fn terminate(&self) {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        )
        .unwrap();
    }

    /// Waits for it to exit after [`Server::terminate`], 15 s at most.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let stopping = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if stopping.elapsed() > Duration::from_secs(15) {
                self.child.kill().unwrap();
                panic!("serve did not stop within 15 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A server a failing test did not stop is killed, not left running.
impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Calls `tool` over HTTP: the outcome (a 200).
pub fn call(addr: std::net::SocketAddr, key: &str, tool: &str, args: &str) -> serde_json::Value {
    let body = format!(r#"{{"arguments": {args}}}"#);
    let path = format!("/v1/tools/{tool}/call");
    let (status, body) = http(addr, "POST", &path, key, body.as_bytes());
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Creates `tenant` with `policy`, installs `plugins` for it, and returns an admin key.
pub fn tenant(data: &Path, tenant: &str, policy: &str, plugins: &[&str]) -> String {
    let policy_file = data.with_file_name(format!("{tenant}.policy.json"));
    std::fs::write(&policy_file, policy).unwrap();
    let mut commands = vec![
        vec!["tenant", "create", tenant],
        vec![
            "--tenant",
            tenant,
            "policy",
            "set",
            policy_file.to_str().unwrap(),
        ],
    ];
    let files: Vec<_> = plugins.iter().map(|p| plugin_file(p)).collect();
    for file in &files {
        commands.push(vec!["--tenant", tenant, "install", file.to_str().unwrap()]);
    }
    for args in commands {
        let (code, out, _) = toolhost(data, &args);
        assert_eq!(code, Some(0), "{out}");
    }
    let (code, key, _) = toolhost(
        data,
        &["--tenant", tenant, "key", "create", "--role", "admin"],
    );
    assert_eq!(code, Some(0), "{key}");
    key.lines().next().unwrap().trim().to_owned()
}
