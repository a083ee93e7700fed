//! MCP round trips as one client sees them, printed as numbers:
//! `cargo bench -p toolhost-cli --bench mcp`.
//!
//! The real binary on a fresh data directory, `text_stats` installed for one tenant. One
//! client sends one request after another: over stdio (`toolhost mcp`) a `ping`, a
//! `tools/call` of `text_stats` and a `tools/list`; over Streamable HTTP (`toolhost serve`, one
//! kept-alive connection, an initialized session) the ping and the call, and the same call on
//! the REST route, the peer an MCP call is held to. Printed: p50 and p99 of each; per request, the server's context
//! switches (its threads' hand-offs, which this VM's timings hide in noise) and the CPU time its
//! threads ran (the rest of a round trip is the client, the kernel and waiting to be woken);
//! and call − ping per transport, for each placement of the client and the servers (one core,
//! two cores, the scheduler's).
//!
//! With `TOOLHOST_BENCH_WASSETTE` (a `wassette` binary) and
//! `TOOLHOST_BENCH_WASSETTE_COMPONENT` (the same logic as a WASI component), the same stdio
//! client also times Microsoft Wassette in the same run: `peers/wassette/run` sets both.

#[path = "support/client.rs"]
#[allow(dead_code)] // GET is the cluster bench's
mod client;
#[path = "../../../tests/it/plugins.rs"]
#[allow(dead_code)] // not every user of the helpers needs all of them
mod plugins;
#[path = "../../../tests/it/process.rs"]
#[allow(dead_code)]
mod process;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rustix::thread::CpuSet;
use serde_json::{Value, json};

const WARMUP: usize = 500;
const ROUNDS: usize = 5_000;
/// Requests of one kind to one stdio server before the next kind or server.
const BLOCK: usize = 100;
const TEXT: &str = "The quick brown fox jumps over the lazy dog. Twice!";

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = process::tenant(&data, "acme", "{}", &["text_stats"]);
    println!("{ROUNDS} requests one after another, after {WARMUP} warm-up, one client");
    println!(
        "{:<38} {:>9} {:>9} {:>9} {:>9}",
        "", "p50 µs", "p99 µs", "switches", "CPU µs"
    );
    // `cargo bench -p toolhost-cli --bench mcp -- stdio` (or `http`) times one transport.
    let only = std::env::args().skip(1).find(|arg| !arg.starts_with("--"));
    let times = |transport: &str| only.as_deref().is_none_or(|only| only == transport);
    for placement in Placement::all() {
        println!("{placement}");
        if times("stdio") {
            stdio(dir.path(), &data, &placement);
        }
        if times("http") {
            http(&data, &key, &placement);
        }
    }
}

/// Where the client and the servers run. On this VM a wake-up that crosses cores costs tens of
/// µs each way, and where the scheduler puts a client and its server is chance: one core, two
/// cores (client on one, servers on the other) and the scheduler's choice are timed apart.
struct Placement {
    name: &'static str,
    /// The client's CPU and the servers'; `None` leaves both to the scheduler.
    cpus: Option<(usize, usize)>,
    allowed: CpuSet,
}

impl Placement {
    fn all() -> Vec<Placement> {
        let allowed = rustix::thread::sched_getaffinity(None).unwrap();
        let ids: Vec<usize> = (0..CpuSet::MAX_CPU)
            .filter(|&c| allowed.is_set(c))
            .collect();
        let (first, last) = (ids[0], ids[ids.len() - 1]);
        let two_cores = (first != last).then_some(("two cores", Some((first, last))));
        [("one core", Some((first, first)))]
            .into_iter()
            .chain(two_cores)
            .chain([("as scheduled", None)])
            .map(|(name, cpus)| Placement {
                name,
                cpus,
                allowed,
            })
            .collect()
    }

    /// Starts servers on the servers' CPU (a child keeps the affinity of the thread that
    /// started it), then moves this thread, the client, to its own.
    fn start<T>(&self, servers: impl FnOnce() -> T) -> T {
        self.pin(self.cpus.map(|(_, server)| server));
        let started = servers();
        self.pin(self.cpus.map(|(client, _)| client));
        started
    }

    fn pin(&self, cpu: Option<usize>) {
        let only = cpu.map_or(self.allowed, |cpu| {
            let mut only = CpuSet::new();
            only.set(cpu);
            only
        });
        rustix::thread::sched_setaffinity(None, &only).unwrap();
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cpus {
            Some((client, server)) => {
                write!(
                    f,
                    "{}: client on CPU {client}, servers on CPU {server}",
                    self.name
                )
            }
            None => write!(f, "{}", self.name),
        }
    }
}

/// toolhost and, when the bench is given it, Wassette over stdio.
fn stdio(dir: &std::path::Path, data: &std::path::Path, placement: &Placement) {
    let mut servers = placement.start(|| {
        let toolhost = process::cli(data, &["--tenant", "acme", "mcp"]);
        let mut servers = vec![Stdio::start(toolhost, "text_stats")];
        servers.extend(wassette(dir));
        servers
    });
    // Short blocks of each server in turn: the machine's drift falls on every row alike, and
    // each server is timed warm, one request after another.
    let [ping, call, list, peer_ping, peer_call, peer_list] = stdio_rounds(&mut servers);
    servers.into_iter().for_each(Stdio::stop);
    row("  stdio    ping", &ping);
    row("  stdio    tools/call", &call);
    row("  stdio    tools/list", &list);
    difference("  stdio    call − ping", &call, &ping);
    if peer_call.samples.is_empty() {
        println!("  stdio    Wassette: not measured (run peers/wassette/run)");
        return;
    }
    row("  stdio    Wassette ping (peer)", &peer_ping);
    row("  stdio    Wassette tools/call (peer)", &peer_call);
    row("  stdio    Wassette tools/list (peer)", &peer_list);
    difference("  stdio    Wassette call − ping", &peer_call, &peer_ping);
    let ratio = p50(&peer_call.samples) / p50(&call.samples);
    println!(
        "{:<38} {ratio:>9.2}x",
        "  stdio    call, Wassette / toolhost"
    );
}

/// `toolhost serve` on the data directory the stdio process has let go of.
fn http(data: &std::path::Path, key: &str, placement: &Placement) {
    let server = placement.start(|| process::Server::start(data, plugins::artifact_dir(), &[]));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pid = server.child.id();
    let [ping, call, modern, rest] = runtime.block_on(http_rounds(server.addr, pid, key));
    server.stop();
    row("  HTTP     ping", &ping);
    row("  HTTP     tools/call", &call);
    row("  HTTP     tools/call, 2026-07-28", &modern);
    row("  HTTP     REST call (peer)", &rest);
    difference("  HTTP     call − ping", &call, &ping);
    difference("  HTTP     MCP call − REST call", &call, &rest);
    difference("  HTTP     2026-07-28 call − REST", &modern, &rest);
}

/// Wassette on the same stdio client, when the bench is given it.
fn wassette(dir: &std::path::Path) -> Option<Stdio> {
    let binary = std::env::var_os("TOOLHOST_BENCH_WASSETTE")?;
    let component = std::env::var_os("TOOLHOST_BENCH_WASSETTE_COMPONENT")?;
    // Wassette names a tool after the component's exported function, `text-stats`, and loads
    // every component in its plugin directory at start.
    let home = dir.join("wassette");
    let plugins = home.join("components");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(&component, plugins.join("text_stats.wasm")).unwrap();
    let mut server = std::process::Command::new(binary);
    server
        .args(["serve", "--stdio", "--plugin-dir"])
        .arg(&plugins)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env("WASETTE_CONFIG_FILE", home.join("none.toml"))
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::null());
    Some(Stdio::start(server, "text-stats"))
}

/// `[ping, call, list]` of the first server then of the second (empty without one), in
/// blocks of `BLOCK` of each, one server's blocks after the other's.
fn stdio_rounds(servers: &mut [Stdio]) -> [Timed; 6] {
    let mut timed: [Timed; 6] = Default::default();
    let requests = [Request::Ping, Request::Call, Request::List];
    for block in 0..(WARMUP + ROUNDS) / BLOCK {
        for (server, timed) in servers.iter_mut().zip(timed.chunks_mut(requests.len())) {
            for (request, timed) in requests.iter().zip(timed) {
                let before = Counters::of(server.child.id());
                let samples = (0..BLOCK).map(|_| server.timed(request));
                match block >= WARMUP / BLOCK {
                    true => {
                        timed.samples.extend(samples);
                        timed.server += Counters::of(server.child.id()) - before;
                    }
                    false => samples.for_each(drop),
                }
            }
        }
    }
    timed
}

/// One kind of request's round trips, and what the server's threads did while it answered
/// them.
#[derive(Default)]
struct Timed {
    samples: Vec<Duration>,
    server: Counters,
}

impl Timed {
    fn switches_per_request(&self) -> f64 {
        self.server.switches as f64 / self.samples.len() as f64
    }

    fn cpu_us_per_request(&self) -> f64 {
        self.server.cpu_ns as f64 / 1e3 / self.samples.len() as f64
    }
}

/// A process's context switches and CPU time so far, summed over its threads.
#[derive(Default, Clone, Copy)]
struct Counters {
    switches: u64,
    cpu_ns: u64,
}

impl Counters {
    /// From `/proc/<pid>/task/*/`: `status` has each thread's switches, `schedstat` begins
    /// with its nanoseconds on a CPU.
    fn of(pid: u32) -> Counters {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        let read = |task: &std::path::Path, file: &str| std::fs::read_to_string(task.join(file));
        let thread = |task: std::path::PathBuf| -> Option<Counters> {
            let status = read(&task, "status").ok()?;
            let switches = (status.lines())
                .filter(|line| line.contains("ctxt_switches:"))
                .filter_map(|line| line.split_whitespace().last()?.parse::<u64>().ok())
                .sum();
            let schedstat = read(&task, "schedstat").ok()?;
            let cpu_ns = schedstat.split_whitespace().next()?.parse().ok()?;
            Some(Counters { switches, cpu_ns })
        };
        let threads = tasks.filter_map(|task| thread(task.ok()?.path()));
        threads.fold(Counters::default(), |mut sum, thread| {
            sum += thread;
            sum
        })
    }
}

/// A difference of two readings. A thread that exits takes its counts along: never below 0.
impl std::ops::Sub for Counters {
    type Output = Counters;
    fn sub(self, before: Counters) -> Counters {
        Counters {
            switches: self.switches.saturating_sub(before.switches),
            cpu_ns: self.cpu_ns.saturating_sub(before.cpu_ns),
        }
    }
}

impl std::ops::AddAssign for Counters {
    fn add_assign(&mut self, other: Counters) {
        self.switches += other.switches;
        self.cpu_ns += other.cpu_ns;
    }
}

enum Request {
    Ping,
    Call,
    List,
}

/// An initialized MCP session with a stdio server; notifications it sends are skipped.
struct Stdio {
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: BufReader<std::process::ChildStdout>,
    line: String,
    ping: String,
    call: String,
    list: String,
}

impl Stdio {
    fn start(mut server: std::process::Command, tool: &str) -> Self {
        use std::process::Stdio as Pipe;
        let mut child = server
            .stdin(Pipe::piped())
            .stdout(Pipe::piped())
            .spawn()
            .unwrap();
        let mut session = Stdio {
            input: child.stdin.take().unwrap(),
            output: BufReader::new(child.stdout.take().unwrap()),
            child,
            line: String::new(),
            ping: json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}).to_string(),
            call: call_request(tool).to_string(),
            list: json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}).to_string(),
        };
        session.ask(&client::initialize());
        session.ask(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string());
        let tools =
            session.ask(&json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}).to_string());
        assert!(
            tools.to_string().contains(&format!("\"{tool}\"")),
            "{tools}"
        );
        session
    }

    fn timed(&mut self, request: &Request) -> Duration {
        let message = match request {
            Request::Ping => self.ping.clone(),
            Request::Call => self.call.clone(),
            Request::List => self.list.clone(),
        };
        let start = Instant::now();
        self.ask(&message);
        start.elapsed()
    }

    fn ask(&mut self, message: &str) -> Value {
        writeln!(self.input, "{message}").unwrap();
        if !message.contains("\"id\"") {
            return Value::Null;
        }
        loop {
            self.line.clear();
            self.output.read_line(&mut self.line).unwrap();
            let answer: Value = serde_json::from_str(&self.line).expect(&self.line);
            if answer.get("id").is_some() {
                let result = answer.get("result").expect(&self.line);
                assert_ne!(result["isError"], true, "{}", self.line);
                return answer;
            }
        }
    }

    /// toolhost ends at the end of its input; Wassette does not, and is stopped.
    fn stop(self) {
        let Stdio {
            mut child, input, ..
        } = self;
        drop(input);
        let deadline = Instant::now() + Duration::from_secs(5);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                child.kill().unwrap();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// `ping` and `tools/call` on one MCP session (2025-06-18), `tools/call` without a session
/// (2026-07-28, answered as JSON), and the REST call, on one connection.
async fn http_rounds(addr: SocketAddr, server: u32, key: &str) -> [Timed; 4] {
    let mut conn = client::connect(addr).await;
    let (status, headers, _) =
        client::post(&mut conn, "/mcp", key, &[], &client::initialize()).await;
    assert_eq!(status, 200);
    let session = headers["mcp-session-id"].to_str().unwrap().to_owned();
    let session = [("mcp-session-id", session.as_str())];
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    client::post(&mut conn, "/mcp", key, &session, &initialized.to_string()).await;
    let mut rounds = async |path: &str, head: &[(&str, &str)], body: String| {
        let mut timed = Timed::default();
        let mut before = Counters::default();
        for round in 0..WARMUP + ROUNDS {
            if round == WARMUP {
                before = Counters::of(server);
            }
            let start = Instant::now();
            let (status, _, answer) = client::post(&mut conn, path, key, head, &body).await;
            let elapsed = start.elapsed();
            assert!(status == 200 && !answer.contains("\"error\""), "{answer}");
            if round >= WARMUP {
                timed.samples.push(elapsed);
            }
        }
        timed.server = Counters::of(server) - before;
        timed
    };
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}).to_string();
    let ping = rounds("/mcp", &session, ping).await;
    let call = rounds("/mcp", &session, call_request("text_stats").to_string()).await;
    // Each request of 2026-07-28 says its version and method itself: no session.
    let mut modern = call_request("text_stats");
    modern["params"]["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let head = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "text_stats"),
    ];
    let modern = rounds("/mcp", &head, modern.to_string()).await;
    let rest = json!({"arguments": {"text": TEXT}}).to_string();
    let rest = rounds("/v1/tools/text_stats/call", &[], rest).await;
    [ping, call, modern, rest]
}

fn call_request(tool: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": tool, "arguments": {"text": TEXT}}})
}

fn percentile(samples: &[Duration], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[((sorted.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6
}

fn p50(samples: &[Duration]) -> f64 {
    percentile(samples, 0.5)
}

/// The p50 of `a` less that of `b`, and the same of their switches and CPU per request.
fn difference(name: &str, a: &Timed, b: &Timed) {
    let (a_p50, b_p50) = (p50(&a.samples), p50(&b.samples));
    let switches = a.switches_per_request() - b.switches_per_request();
    let cpu = a.cpu_us_per_request() - b.cpu_us_per_request();
    println!(
        "{name:<38} {:>9.1} {:>9} {switches:>9.2} {cpu:>9.1}",
        a_p50 - b_p50,
        ""
    );
}

fn row(name: &str, timed: &Timed) {
    println!(
        "{name:<38} {:>9.1} {:>9.1} {:>9.2} {:>9.1}",
        p50(&timed.samples),
        percentile(&timed.samples, 0.99),
        timed.switches_per_request(),
        timed.cpu_us_per_request()
    );
}
