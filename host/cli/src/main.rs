//! `toolhost`: install, list, describe, call and remove tools on a local data directory.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde_json::Value;
use toolhost::{Caller, Host, HostConfig, OpenError, Source, StoreError};
use toolhost_server::admin::{AdminCommand, AdminReply};
use toolhost_server::sessions::SessionLimits;

/// Async workers per core (see `main`).
const WORKERS_PER_CORE: usize = 8;

#[derive(Parser)]
#[command(
    name = "toolhost",
    version,
    about = "A sandboxed host for tools that AI agents call"
)]
struct Cli {
    /// Where installed tools are kept [default: $XDG_DATA_HOME/toolhost or ~/.local/share/toolhost]
    #[arg(long, env = "TOOLHOST_DATA_DIR", global = true)]
    data_dir: Option<PathBuf>,
    /// Keep tenants, tools, keys, policies and data in this PostgreSQL database
    /// (`postgres://user@host:port/db`), which many `toolhost serve` nodes share; the data
    /// directory then keeps only this node's compiled artifacts and granted files
    /// [default: the data directory]
    #[arg(long, env = "TOOLHOST_STORE", global = true)]
    store: Option<String>,
    /// The tenant to act for.
    #[arg(
        long,
        env = "TOOLHOST_TENANT",
        default_value = "default",
        global = true
    )]
    tenant: String,
    /// Non-public addresses (IP or CIDR, comma-separated) that HTTP tools may reach, such as
    /// `127.0.0.1` for a service on this machine. Public addresses need no grant.
    #[arg(
        long,
        env = "TOOLHOST_ALLOW_PRIVATE",
        value_delimiter = ',',
        global = true
    )]
    allow_private: Vec<toolhost::egress::Cidr>,
    /// New outbound connections (HTTP tools' and guests' requests) one tenant may open a
    /// second, after a burst of as many; past that each waits its turn within its call's
    /// deadline
    #[arg(long, env = "TOOLHOST_NEW_CONNECTIONS_PER_SECOND", global = true, default_value_t = toolhost::egress::NEW_CONNECTIONS_PER_SECOND)]
    new_connections_per_second: std::num::NonZeroU32,
    /// Guests that run past their first 5 ms at once; while more want to, they take turns
    /// round the tenants [default: one per core]
    #[arg(long, env = "TOOLHOST_CPU_TURNS", global = true)]
    cpu_turns: Option<usize>,
    /// The JavaScript runtime component that runs JS tools (`scripts/build-js-runtime` builds
    /// it) [default: js_runtime.wasm next to this executable, if there is one]
    #[arg(long, env = "TOOLHOST_JS_RUNTIME", global = true)]
    js_runtime: Option<PathBuf>,
    /// JS tools this node keeps pre-initialised (a snapshot with the module evaluated, built
    /// in the background, ~5 MB each in memory; at most 8 per tenant); 0 turns it off
    #[arg(long, env = "TOOLHOST_JS_SNAPSHOTS", global = true, default_value_t = HostConfig::default().js_snapshots)]
    js_snapshots: usize,
    /// A directory where compiled components are shared by every toolhost on this machine
    /// that names it, so each compiles once [default: only the data directory's store]
    #[arg(long, env = "TOOLHOST_ARTIFACT_DIR", global = true)]
    artifact_dir: Option<PathBuf>,
    /// A file holding the key that seals secret configuration values at rest: 32 bytes, or
    /// 64 hex digits (`openssl rand -hex 32`). Keep it outside the data directory
    #[arg(long, env = "TOOLHOST_SECRETS_KEY_FILE", global = true)]
    secrets_key_file: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install every tool a component (.wasm) offers, a JavaScript tool (.js: exports `spec`
    /// and a default handler), or an HTTP tool (.json: {spec, request}).
    Install { file: PathBuf },
    /// List the tools an agent of the tenant sees.
    List {
        /// Print the specs as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a tool's spec and source as JSON.
    Describe { tool: String },
    /// Call a tool with JSON arguments and print its JSON result.
    Call {
        tool: String,
        /// The arguments, a JSON object.
        #[arg(default_value = "{}")]
        args: String,
        /// JSON handed to the tool as its context's `data`.
        #[arg(long)]
        data: Option<String>,
        /// Also print the call's log, duration and fuel to stderr.
        #[arg(long, short)]
        verbose: bool,
    },
    /// Remove a tool and all its versions.
    Remove { tool: String },
    /// List a tool's kept versions; `*` marks the one that answers calls.
    Versions { tool: String },
    /// Make an earlier version answer calls: the one before the current, or --to N.
    Rollback {
        tool: String,
        #[arg(long)]
        to: Option<u32>,
    },
    /// Serve the HTTP API until SIGINT or SIGTERM; running requests finish first (a second
    /// signal stops at once).
    Serve {
        #[arg(long, default_value = "127.0.0.1:8080", env = "TOOLHOST_LISTEN")]
        listen: std::net::SocketAddr,
        /// An origin (`https://console.example.com`) whose web pages may call `/mcp`, beside
        /// the server's own; repeat or comma-separate for more. Others get 403.
        #[arg(long, env = "TOOLHOST_ALLOW_ORIGIN", value_delimiter = ',')]
        allow_origin: Vec<String>,
        /// MCP sessions open at once, over all tenants; more get 503.
        #[arg(long, env = "TOOLHOST_MCP_MAX_SESSIONS", default_value_t = SessionLimits::default().max_sessions)]
        mcp_max_sessions: usize,
        /// MCP sessions one tenant may have open at once; more get 429.
        #[arg(long, env = "TOOLHOST_MCP_MAX_SESSIONS_PER_TENANT", default_value_t = SessionLimits::default().max_per_tenant)]
        mcp_max_sessions_per_tenant: usize,
        /// Seconds after which an MCP session with no request is closed.
        #[arg(long, env = "TOOLHOST_MCP_SESSION_IDLE_SECS", default_value_t = SessionLimits::default().idle.as_secs())]
        mcp_session_idle_secs: u64,
        /// On SIGTERM, keep serving this long while /healthz answers 503, so a load
        /// balancer stops sending here before the port closes: longer than it takes to drop
        /// a node (check interval × failures). 0: close at once.
        #[arg(long, default_value_t = 0, env = "TOOLHOST_SHUTDOWN_DRAIN_MS")]
        shutdown_drain_ms: u64,
        /// Async worker threads. Fewer answer an MCP request in a session with fewer thread
        /// hand-offs, but guests stuck in one long instruction (a `memory.fill` of hundreds of
        /// MiB) can then hold up other tenants' requests: keep the default with untrusted
        /// tenants [default: 8 per core]
        #[arg(long, env = "TOOLHOST_ASYNC_WORKERS")]
        async_workers: Option<std::num::NonZeroUsize>,
        #[command(flatten)]
        disclosure: DisclosureArgs,
    },
    /// Serve MCP on stdin/stdout for --tenant (for clients that spawn their servers).
    Mcp {
        #[command(flatten)]
        disclosure: DisclosureArgs,
    },
    /// Tenants, which API keys belong to.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// API keys for the HTTP API (while `serve` runs, it carries the command out).
    #[command(subcommand)]
    Key(KeyCommand),
    /// Print the tools an agent sees as JSON tool specs for an LLM API.
    Export {
        /// openai, anthropic or mcp
        #[arg(long, default_value = "openai")]
        format: String,
    },
    /// The tenant's configuration, which tools read with `config-get`.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// The tenant's policy: allow, deny and approval lists, rate and concurrency limits.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// What the tenant keeps on disk (granted files, KV and cached results, tool code), each
    /// against its quota.
    Usage,
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Print the policy in force as JSON.
    Show,
    /// Replace the policy with JSON from FILE (`-` for stdin), for example
    /// `{"deny": ["admin_*"], "calls_per_minute": 600, "max_concurrent": 8}`.
    Set { file: PathBuf },
}

/// What MCP clients are shown.
#[derive(clap::Args)]
struct DisclosureArgs {
    /// off: list every tool; on: list tool_search, tool_describe and tool_call instead; auto:
    /// on when the listing would pass half of 8000 tokens.
    #[arg(long, default_value = "auto", value_parser = ["off", "on", "auto"])]
    disclosure: String,
    /// Rank tool_search with this contextual model (config.json and model.safetensors of
    /// all-MiniLM-L6-v2; `scripts/fetch-search-model` fetches it): recall@5 0.96 instead of
    /// 0.86, about 0.9 ms a search over 10 000 tools instead of 0.1 (9 ms without AVX-512 VNNI).
    #[arg(long, env = "TOOLHOST_SEARCH_MODEL", value_name = "DIR")]
    search_model: Option<PathBuf>,
}

impl DisclosureArgs {
    fn config(&self) -> Result<toolhost_server::bridges::DisclosureConfig, Failure> {
        use toolhost_server::bridges::Mode;
        let enabled = match self.disclosure.as_str() {
            "off" => Mode::Off,
            "on" => Mode::On,
            _ => Mode::Auto,
        };
        let search_model = match &self.search_model {
            Some(dir) => Some(std::sync::Arc::new(
                toolhost_search::encoder::SentenceEncoder::load(dir).map_err(usage)?,
            )),
            None => None,
        };
        Ok(toolhost_server::bridges::DisclosureConfig {
            enabled,
            search_model,
            ..Default::default()
        })
    }
}

#[derive(Subcommand)]
enum TenantCommand {
    /// Create a tenant (its id: 1 to 128 printable characters).
    Create {
        name: String,
    },
    List,
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Create a key for --tenant and print it: it is shown only this once.
    Create {
        /// What it may do: `agent` (list and call tools), `developer` (also install, remove,
        /// roll back), `approver` (decide held calls), `admin` (all, and pass `data`)
        #[arg(long, default_value = "agent")]
        role: toolhost::Role,
    },
    /// List keys (ids, never secrets); all tenants' with --all.
    List {
        #[arg(long)]
        all: bool,
    },
    /// Revoke a key by its id.
    Revoke { id: String },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Set KEY. Without VALUE, reads it from stdin (keeps secrets out of shell history).
    Set {
        key: String,
        value: Option<String>,
        /// Never show the value again: not in listings, logs or error messages.
        #[arg(long)]
        secret: bool,
    },
    /// List keys, with values except secrets.
    List,
    /// Remove KEY.
    Remove { key: String },
}

/// A failure shown to the user, with the exit code it maps to.
struct Failure(u8, String);

fn main() -> ExitCode {
    // Everything this process creates (the store's files, the admin socket) is the owner's.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    // Connections, and guests' files and connections, are each a descriptor, and the usual
    // soft limit of 1 024 is below what the host's own bounds allow: raised to the hard
    // limit, as Go's runtime does.
    let descriptors = rustix::process::Resource::Nofile;
    let mut limit = rustix::process::getrlimit(descriptors);
    limit.current = limit.maximum;
    let _ = rustix::process::setrlimit(descriptors, limit);
    // rmcp warns of each request it answers with an error, quoting the client's request id:
    // the client's doing, and as long as a client likes, so only its errors by default.
    let default_filter = || "warn,rmcp=error".into();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let mut runtime = match cli.command {
        // One client of one tenant: on one thread a request is never handed from worker to
        // worker (a stdio call on one core: 35 µs, 43 µs on 16 workers; BENCHMARKS.md).
        Command::Mcp { .. } => tokio::runtime::Builder::new_current_thread(),
        // More workers than a tenant's share of call trees: a guest in one long,
        // uninterruptible instruction (a `memory.fill` of hundreds of MiB) holds its worker,
        // and other tenants' requests must still find one. BENCHMARKS.md has the figures.
        ref command => {
            let workers = match command {
                Command::Serve {
                    async_workers: Some(workers),
                    ..
                } => workers.get(),
                _ => WORKERS_PER_CORE * std::thread::available_parallelism().map_or(1, |n| n.get()),
            };
            let mut runtime = tokio::runtime::Builder::new_multi_thread();
            runtime.worker_threads(workers);
            runtime
        }
    };
    let runtime = runtime
        .enable_all()
        .build()
        .expect("starting the tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, message)) => {
            eprintln!("{message}");
            ExitCode::from(code)
        }
    }
}

fn usage(message: impl std::fmt::Display) -> Failure {
    Failure(2, format!("error: {message}"))
}

/// A failing store is not the input's fault (1); anything else refused is (2).
fn manage_error(error: toolhost::ManageError) -> Failure {
    match error {
        toolhost::ManageError::Store(_) => Failure(1, format!("error: {error}")),
        refused => usage(refused),
    }
}

fn default_data_dir() -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/share")));
    base.map_or_else(|| PathBuf::from(".toolhost"), |base| base.join("toolhost"))
}

/// The operator's commands, as the admin module runs them, reading stdin or files first.
fn admin_command(command: &Command, tenant: &str) -> Result<Option<AdminCommand>, Failure> {
    let tenant = tenant.to_owned();
    let read_stdin = |what: &str| {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| usage(format!("reading {what} from stdin: {e}")))
            .map(|_| text)
    };
    Ok(Some(match command {
        Command::Tenant(TenantCommand::Create { name }) => AdminCommand::TenantCreate {
            tenant: name.clone(),
        },
        Command::Tenant(TenantCommand::List) => AdminCommand::TenantList,
        Command::Key(KeyCommand::Create { role }) => AdminCommand::KeyCreate {
            tenant,
            role: *role,
        },
        Command::Key(KeyCommand::List { all }) => AdminCommand::KeyList {
            tenant: (!all).then_some(tenant),
        },
        Command::Key(KeyCommand::Revoke { id }) => AdminCommand::KeyRevoke { id: id.clone() },
        Command::Config(ConfigCommand::Set { key, value, secret }) => AdminCommand::ConfigSet {
            tenant,
            key: key.clone(),
            value: match value {
                Some(value) => value.clone(),
                None => read_stdin("the value")?
                    .trim_end_matches(['\n', '\r'])
                    .to_owned(),
            },
            secret: *secret,
        },
        Command::Config(ConfigCommand::List) => AdminCommand::ConfigList { tenant },
        Command::Config(ConfigCommand::Remove { key }) => AdminCommand::ConfigRemove {
            tenant,
            key: key.clone(),
        },
        Command::Install { file } => AdminCommand::Install {
            tenant,
            file: std::path::absolute(file)
                .map_err(|e| usage(format!("{}: {e}", file.display())))?,
        },
        Command::Remove { tool } => AdminCommand::Remove {
            tenant,
            tool: tool.clone(),
        },
        Command::Policy(PolicyCommand::Show) => AdminCommand::PolicyShow { tenant },
        Command::Usage => AdminCommand::Usage { tenant },
        Command::Policy(PolicyCommand::Set { file }) => {
            let text = if file.as_os_str() == "-" {
                read_stdin("the policy")?
            } else {
                std::fs::read_to_string(file)
                    .map_err(|e| usage(format!("reading {}: {e}", file.display())))?
            };
            let policy = serde_json::from_str(&text)
                .map_err(|e| usage(format!("the policy is not valid: {e}")))?;
            AdminCommand::PolicySet { tenant, policy }
        }
        _ => return Ok(None),
    }))
}

fn print_reply(reply: AdminReply) -> Result<(), Failure> {
    match reply {
        AdminReply::Done { stdout, stderr } => {
            eprint!("{stderr}");
            print!("{stdout}");
            Ok(())
        }
        AdminReply::Failed(message) => Err(usage(message)),
        AdminReply::Unavailable(message) => Err(Failure(1, format!("error: {message}"))),
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let data_dir = cli.data_dir.unwrap_or_else(default_data_dir);
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| usage(format!("cannot create {}: {e}", data_dir.display())))?;
    let admin = admin_command(&cli.command, &cli.tenant)?;
    let js_runtime_path = cli.js_runtime.clone().or_else(|| {
        let beside = std::env::current_exe()
            .ok()?
            .with_file_name("js_runtime.wasm");
        beside.exists().then_some(beside)
    });
    let js_runtime = match &js_runtime_path {
        Some(path) => Some(
            std::fs::read(path)
                .map_err(|e| usage(format!("--js-runtime {}: {e}", path.display())))?,
        ),
        None => None,
    };
    // How an MCP client on this machine starts toolhost over stdio on this data directory
    // (the console shows it). Not offered on a shared database: its URL may hold a password.
    let stdio_command: Vec<String> = match (&cli.store, std::env::current_exe()) {
        (None, Ok(exe)) => {
            let mut command = vec![exe.display().to_string(), "--data-dir".into()];
            command.push(data_dir.display().to_string());
            if let Some(runtime) = &js_runtime_path {
                command.extend(["--js-runtime".into(), runtime.display().to_string()]);
            }
            command
        }
        _ => Vec::new(),
    };
    let database = match &cli.store {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            Some(toolhost::PgOptions::new(url))
        }
        Some(other) => {
            return Err(usage(format!(
                "--store {other}: a store is a PostgreSQL URL, postgres://user@host:port/database"
            )));
        }
        None => None,
    };
    // A node of a cluster keeps its compiled artifacts on its own disk.
    let artifact_dir = (cli.artifact_dir.clone())
        .or_else(|| database.as_ref().map(|_| data_dir.join("artifacts")));
    // Only a server is a node: it runs durable calls (a one-shot command would leave them to
    // their leases) and takes a share of each tenant's limits.
    let serves = matches!(cli.command, Command::Serve { .. });
    let durable = toolhost::DurableConfig {
        workers: if serves {
            toolhost::DurableConfig::default().workers
        } else {
            0
        },
        ..Default::default()
    };
    let host = Host::open(HostConfig {
        data_dir: Some(data_dir.clone()),
        database,
        serves,
        durable,
        js_runtime,
        // A one-shot command calls nothing twice: no snapshot would pay for itself.
        js_snapshots: match cli.command {
            Command::Serve { .. } | Command::Mcp { .. } => cli.js_snapshots,
            _ => 0,
        },
        egress: toolhost::egress::EgressConfig {
            allow_private: cli.allow_private,
            new_connections_per_second: cli.new_connections_per_second,
        },
        artifact_dir,
        sandbox: toolhost::SandboxConfig {
            cpu_turns: cli
                .cpu_turns
                .unwrap_or(toolhost::SandboxConfig::default().cpu_turns),
            ..Default::default()
        },
        secrets_key: match &cli.secrets_key_file {
            Some(path) => Some(toolhost::SecretsKey::from_file(path).map_err(usage)?),
            None => None,
        },
        ..HostConfig::default()
    })
    .await;
    let host = match (host, admin) {
        // A running server owns the data directory: it runs the command for us.
        (Err(OpenError::Store(StoreError::Locked { .. })), Some(command)) => {
            let reply = toolhost_server::admin::send(&data_dir, &command)
                .await
                .map_err(|e| {
                    usage(format!(
                        "the data directory is in use and its server did not answer on {}: {e}",
                        data_dir.join(toolhost_server::admin::SOCKET).display()
                    ))
                })?;
            return print_reply(reply);
        }
        (Ok(host), Some(command)) => return print_reply(command.execute(&host).await),
        (Err(error), _) => return Err(Failure(1, format!("error: {error}"))),
        (Ok(host), None) => host,
    };
    let tenant = cli.tenant;
    match cli.command {
        Command::List { json } => {
            let tools = host.list(&tenant);
            if json {
                let specs: Vec<_> = tools.iter().map(|t| &t.spec).collect();
                println!("{}", pretty(&specs));
            }
            for tool in tools.iter().filter(|_| !json) {
                let kind = match tool.source {
                    Source::Native => "native",
                    Source::Wasm { .. } => "wasm",
                    Source::Http { .. } => "http",
                    Source::Js { .. } => "js",
                };
                let summary = tool.spec.description.lines().next().unwrap_or_default();
                println!("{:<24} {kind:<6} {summary}", tool.spec.name);
            }
        }
        Command::Describe { tool } => {
            let info = host
                .describe(&tenant, &tool)
                .ok_or_else(|| usage(format!("no tool named `{tool}`")))?;
            println!("{}", pretty(&info));
        }
        Command::Call {
            tool,
            args,
            data,
            verbose,
        } => {
            let args: Value = serde_json::from_str(&args)
                .map_err(|e| usage(format!("args are not JSON: {e}")))?;
            let data = match data {
                Some(data) => serde_json::from_str(&data)
                    .map_err(|e| usage(format!("--data is not JSON: {e}")))?,
                None => Value::Null,
            };
            let outcome = host
                .call(&Caller::tenant(tenant).with_data(data), &tool, args)
                .await;
            if verbose {
                eprintln!(
                    "call {} took {:.2} ms, fuel {}",
                    outcome.call_id,
                    outcome.duration.as_secs_f64() * 1e3,
                    outcome.fuel_used.map_or("-".into(), |f| f.to_string())
                );
                eprintln!("log: {}", pretty(&outcome.log));
            }
            if let Some(clipped) = outcome.clipped {
                eprintln!(
                    "note: the result was {} characters; clipped to {} (limits.max_result_chars)",
                    clipped.original_chars, clipped.returned_chars
                );
            }
            match outcome.result {
                Ok(value) => println!("{}", pretty(&value)),
                Err(error) => return Err(Failure(1, format!("error[{}]: {error}", error.code()))),
            }
        }
        Command::Versions { tool } => {
            let entry = host.versions(&tenant, &tool).await.map_err(manage_error)?;
            for v in entry.versions.iter().rev() {
                let mark = if v.version == entry.current { "*" } else { " " };
                let sha = &v.component[..12];
                println!(
                    "{mark} {:>3}  {sha}  installed {}",
                    v.version,
                    toolhost_server::admin::rfc3339(v.installed_at_ms)
                );
            }
        }
        Command::Rollback { tool, to } => {
            let version = host
                .rollback(&tenant, &tool, to)
                .await
                .map_err(manage_error)?;
            println!("{tool} is now at version {version}");
        }
        Command::Serve {
            listen,
            allow_origin,
            mcp_max_sessions,
            mcp_max_sessions_per_tenant,
            mcp_session_idle_secs,
            shutdown_drain_ms,
            disclosure,
            async_workers: _, // the runtime's, in `main`
        } => {
            // The search model loads (or fails) before the port opens.
            let options = toolhost_server::server::ServerOptions {
                disclosure: disclosure.config()?,
                allowed_origins: allow_origin,
                mcp_sessions: SessionLimits {
                    max_sessions: mcp_max_sessions,
                    max_per_tenant: mcp_max_sessions_per_tenant,
                    idle: std::time::Duration::from_secs(mcp_session_idle_secs),
                },
                stdio_command,
                drain: std::time::Duration::from_millis(shutdown_drain_ms),
                ..Default::default()
            };
            // Handlers first: a SIGTERM as soon as the port opens must drain, not kill.
            let stopping = shutdown_signal(options.drain);
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .map_err(|e| usage(format!("cannot listen on {listen}: {e}")))?;
            let workers = tokio::runtime::Handle::current().metrics().num_workers();
            eprintln!(
                "toolhost listening on http://{listen} (console: /, API: /openapi.json, \
                 async workers: {workers})"
            );
            let host = std::sync::Arc::new(host);
            let admin = serve_admin(&host, &data_dir);
            let served =
                toolhost_server::server::serve(host.clone(), listener, options, stopping).await;
            // The durable calls this node runs end here, or are left to their leases.
            if !host.drain(DURABLE_GRACE).await {
                eprintln!(
                    "durable calls still running after {DURABLE_GRACE:?}: left to their leases"
                );
            }
            stop_admin(admin, &data_dir);
            served.map_err(|e| Failure(1, format!("error: serving: {e}")))?;
        }
        Command::Mcp { disclosure } => {
            let host = std::sync::Arc::new(host);
            let admin = serve_admin(&host, &data_dir);
            let served =
                toolhost_server::mcp::serve_stdio(host, disclosure.config()?, tenant).await;
            stop_admin(admin, &data_dir);
            served.map_err(|e| Failure(1, format!("error: mcp: {e}")))?;
        }
        Command::Install { .. }
        | Command::Remove { .. }
        | Command::Tenant(_)
        | Command::Key(_)
        | Command::Config(_)
        | Command::Policy(_)
        | Command::Usage => unreachable!("admin commands are run above"),
        Command::Export { format } => {
            let format = format.parse().map_err(usage)?;
            println!("{}", pretty(&host.export(&tenant, format)));
        }
    }
    Ok(())
}

/// While this process owns the data directory, the CLI's installs, removals, tenants, keys,
/// configuration and policies reach its host through the admin socket.
fn serve_admin(
    host: &std::sync::Arc<Host>,
    data_dir: &std::path::Path,
) -> tokio::task::JoinHandle<()> {
    let (host, data_dir) = (host.clone(), data_dir.to_owned());
    tokio::spawn(async move {
        if let Err(e) = toolhost_server::admin::serve(host, &data_dir).await {
            eprintln!(
                "toolhost: warning: no admin socket in {} ({e}); stop this process to install tools or run tenant, key, config and policy commands",
                data_dir.display()
            );
        }
    })
}

fn stop_admin(admin: tokio::task::JoinHandle<()>, data_dir: &std::path::Path) {
    admin.abort();
    let _ = std::fs::remove_file(data_dir.join(toolhost_server::admin::SOCKET));
}

/// How long a stopping server lets the durable calls it runs finish.
const DURABLE_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Installs the SIGINT and SIGTERM handlers now; the future resolves on the first signal, and
/// the server then drains for `drain` and lets running requests and durable calls finish. A
/// second signal stops the process at once.
fn shutdown_signal(drain: std::time::Duration) -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    let mut terminate = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    // The exit status of a process a signal ended: 128 + its number.
    let mut next = async move || {
        tokio::select! {
            _ = interrupt.recv() => 130,
            _ = terminate.recv() => 143,
        }
    };
    async move {
        next().await;
        match drain.is_zero() {
            true => eprintln!("toolhost: shutting down after running requests finish"),
            false => eprintln!(
                "toolhost: draining for {drain:?} (/healthz answers 503), then shutting down after running requests finish"
            ),
        }
        tokio::spawn(async move {
            let status = next().await;
            eprintln!(
                "toolhost: stopping now; running requests are cut off and durable calls left to their leases"
            );
            std::process::exit(status);
        });
    }
}

fn pretty(value: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(value).expect("JSON values serialize")
}
