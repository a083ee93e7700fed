//! The operator's commands (tenants, keys, configuration, policies, installs and removals),
//! run either on a host the CLI opened itself or, while `toolhost serve` or `toolhost mcp`
//! owns the data directory, on that process's host through a Unix socket in that directory.
//! One implementation, two ways in: an install made while an agent is connected reaches it.
//!
//! The socket speaks one JSON [`AdminCommand`] line in, one JSON [`AdminReply`] line out. It
//! is created owner-only (0600): whoever may read the data directory's files may run these.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use toolhost::{Host, InstallError, ManageError, Role, TenantPolicy, ToolSpec};

fn agent() -> Role {
    Role::Agent
}

/// The socket's name in the data directory.
pub const SOCKET: &str = "admin.sock";
/// A request line longer than this is refused (a policy is the largest command).
const MAX_REQUEST_BYTES: usize = 4 << 20;

/// One command over the admin socket, as the CLI sends it (a JSON line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum AdminCommand {
    /// Records a tenant.
    TenantCreate {
        /// The tenant id.
        tenant: String,
    },
    /// Lists the tenants.
    TenantList,
    /// Makes an API key.
    KeyCreate {
        /// Whose key.
        tenant: String,
        /// What it may do (default: agent).
        #[serde(default = "agent")]
        role: Role,
    },
    /// Lists keys: every tenant's when `tenant` is `None`.
    KeyList {
        /// Whose keys.
        tenant: Option<String>,
    },
    /// Revokes a key.
    KeyRevoke {
        /// The key's public id.
        id: String,
    },
    /// Sets a configuration value.
    ConfigSet {
        /// Whose.
        tenant: String,
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// Never shown again, sealed at rest.
        secret: bool,
    },
    /// Lists a tenant's configuration, secrets hidden.
    ConfigList {
        /// Whose.
        tenant: String,
    },
    /// Deletes a configuration value.
    ConfigRemove {
        /// Whose.
        tenant: String,
        /// The key.
        key: String,
    },
    /// Shows a tenant's policy.
    PolicyShow {
        /// Whose.
        tenant: String,
    },
    /// Replaces a tenant's policy.
    PolicySet {
        /// Whose.
        tenant: String,
        /// The new policy.
        policy: TenantPolicy,
    },
    /// Shows what a tenant keeps on disk against each of its quotas.
    Usage {
        /// Whose.
        tenant: String,
    },
    /// Installs a component (`.wasm`), a JavaScript tool (`.js`, `.mjs`) or an HTTP tool
    /// (JSON), read from `file` by the process that owns the store.
    Install {
        /// Whose.
        tenant: String,
        /// An absolute path.
        file: PathBuf,
    },
    /// Removes a tool and all its versions.
    Remove {
        /// Whose.
        tenant: String,
        /// The tool.
        tool: String,
    },
}

/// What a command printed, or why it failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdminReply {
    /// It ran.
    Done {
        /// What to print.
        stdout: String,
        /// What to print as a note.
        stderr: String,
    },
    /// It was refused, in words: the command's fault (exit code 2).
    Failed(String),
    /// The host could not do it now (a full or failing disk, a limit of the tenant's), in
    /// words: not the command's fault (exit code 1).
    Unavailable(String),
}

impl AdminCommand {
    /// Runs the command on `host`.
    pub async fn execute(self, host: &Host) -> AdminReply {
        match self.run(host).await {
            Ok((stdout, stderr)) => AdminReply::Done { stdout, stderr },
            Err(failed) => failed,
        }
    }

    async fn run(self, host: &Host) -> Result<(String, String), AdminReply> {
        let fail = |e: ManageError| match e {
            ManageError::Store(_) => AdminReply::Unavailable(e.to_string()),
            refused => AdminReply::Failed(refused.to_string()),
        };
        let out = |text: String| Ok((text, String::new()));
        match self {
            AdminCommand::TenantCreate { tenant } => {
                let created = host.create_tenant(&tenant).await.map_err(fail)?;
                out(format!(
                    "{} tenant {tenant}\n",
                    if created { "created" } else { "existing" }
                ))
            }
            AdminCommand::TenantList => {
                let tenants = host.tenants().await.map_err(fail)?;
                out(tenants.iter().map(|t| format!("{t}\n")).collect())
            }
            AdminCommand::KeyCreate { tenant, role } => {
                let key = host.create_key(&tenant, role).await.map_err(fail)?;
                Ok((
                    format!("{}\n", key.secret),
                    format!(
                        "{} key {} for tenant {tenant}: store it now, it is not shown again\n",
                        role.name(),
                        key.record.id
                    ),
                ))
            }
            AdminCommand::KeyList { tenant } => {
                let keys = host.keys(tenant.as_deref()).await.map_err(fail)?;
                out(keys
                    .iter()
                    .map(|k| {
                        format!(
                            "{}  {}  {}  created {}\n",
                            k.id,
                            k.tenant,
                            k.role.name(),
                            rfc3339(k.created_at_ms)
                        )
                    })
                    .collect())
            }
            AdminCommand::KeyRevoke { id } => {
                if !host.revoke_key(&id).await.map_err(fail)? {
                    return Err(AdminReply::Failed(format!("no key with id `{id}`")));
                }
                out(format!("revoked {id}\n"))
            }
            AdminCommand::ConfigSet {
                tenant,
                key,
                value,
                secret,
            } => {
                host.set_config(&tenant, &key, &value, secret)
                    .await
                    .map_err(fail)?;
                out(format!(
                    "set {key}{}\n",
                    if secret { " (secret)" } else { "" }
                ))
            }
            AdminCommand::ConfigList { tenant } => {
                let entries = host.config(&tenant).await.map_err(fail)?;
                out(entries
                    .into_iter()
                    .map(|(k, v)| format!("{k} = {}\n", v.unwrap_or_else(|| "(secret)".into())))
                    .collect())
            }
            AdminCommand::ConfigRemove { tenant, key } => {
                if !host.remove_config(&tenant, &key).await.map_err(fail)? {
                    return Err(AdminReply::Failed(format!("no config key `{key}`")));
                }
                out(format!("removed {key}\n"))
            }
            AdminCommand::PolicyShow { tenant } => {
                let policy = host.policy(&tenant).await;
                out(format!(
                    "{}\n",
                    serde_json::to_string_pretty(&*policy).expect("a policy serializes")
                ))
            }
            AdminCommand::PolicySet { tenant, policy } => {
                host.set_policy(&tenant, policy).await.map_err(fail)?;
                out(format!("policy set for {tenant}\n"))
            }
            AdminCommand::Usage { tenant } => {
                let usage = host
                    .disk_usage(&tenant)
                    .await
                    .map_err(|e| AdminReply::Unavailable(e.to_string()))?;
                out([
                    ("files", usage.files, "files_quota_bytes"),
                    ("data", usage.data, "data_quota_bytes"),
                    ("code", usage.code, "code_quota_bytes"),
                ]
                .iter()
                .map(|(what, usage, field)| {
                    format!(
                        "{what:<6}{:>12} of {:>12}  ({field})\n",
                        human_bytes(usage.used_bytes),
                        human_bytes(usage.quota_bytes)
                    )
                })
                .collect())
            }
            AdminCommand::Install { tenant, file } => {
                let specs = install(host, &tenant, &file).await?;
                out(specs
                    .iter()
                    .map(|spec| format!("installed {}\n", spec.name))
                    .collect())
            }
            AdminCommand::Remove { tenant, tool } => {
                let removed = host
                    .remove(&tenant, &tool)
                    .await
                    .map_err(|e| AdminReply::Unavailable(e.to_string()))?;
                if !removed {
                    return Err(AdminReply::Failed(format!("no tool named `{tool}`")));
                }
                out(format!("removed {tool}\n"))
            }
        }
    }
}

/// `file`'s bytes, if it is a regular file of at most `limit` bytes: a FIFO or a device says
/// it holds nothing and gives without end, and a file may grow after it was measured.
async fn read_within(file: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let opened = tokio::fs::File::open(file).await?;
    let meta = opened.metadata().await?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let too_large =
        |size: u64| std::io::Error::other(format!("{size} bytes, over the {limit} a tool may be"));
    if meta.len() > limit {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    opened.take(limit + 1).read_to_end(&mut bytes).await?;
    match bytes.len() as u64 {
        read if read > limit => Err(too_large(read)),
        _ => Ok(bytes),
    }
}

/// Installs what `file` holds, by its kind: JavaScript source by its extension, an HTTP tool
/// definition by a leading `{`, else a component.
async fn install(host: &Host, tenant: &str, file: &Path) -> Result<Vec<ToolSpec>, AdminReply> {
    let named = |e: &dyn std::fmt::Display| AdminReply::Failed(format!("{}: {e}", file.display()));
    // Read off the async workers (under `toolhost mcp` there is one), and no more than any
    // component may be.
    let limit = host.max_component_bytes() as u64;
    let bytes = read_within(file, limit).await.map_err(|e| named(&e))?;
    let refused = |error: InstallError| match error {
        InstallError::Store(_) | InstallError::Admission { .. } => {
            AdminReply::Unavailable(error.to_string())
        }
        refused => AdminReply::Failed(refused.to_string()),
    };
    if file.extension().is_some_and(|e| e == "js" || e == "mjs") {
        let source = String::from_utf8(bytes).map_err(|_| named(&"not UTF-8"))?;
        Ok(vec![
            host.install_js(tenant, &source).await.map_err(refused)?,
        ])
    } else if bytes.trim_ascii_start().starts_with(b"{") {
        let def = serde_json::from_slice(&bytes)
            .map_err(|e| named(&format!("not an HTTP tool definition: {e}")))?;
        Ok(vec![host.install_http(tenant, def).await.map_err(refused)?])
    } else {
        host.install(tenant, bytes).await.map_err(refused)
    }
}

/// Serves admin commands on `data_dir/admin.sock` until the task is dropped. A stale socket
/// file from a process that died is replaced: the data directory's lock says this one owns it.
pub async fn serve(host: Arc<Host>, data_dir: &Path) -> std::io::Result<()> {
    let path = data_dir.join(SOCKET);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    loop {
        let (stream, _) = listener.accept().await?;
        let host = host.clone();
        tokio::spawn(async move {
            if let Err(error) = answer(&host, stream).await {
                tracing::warn!(%error, "admin connection failed");
            }
        });
    }
}

/// How long a command may take to arrive.
const COMMAND_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

async fn answer(host: &Host, stream: UnixStream) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(MAX_REQUEST_BYTES as u64));
    // A client that connects and sends nothing holds a task no longer than this.
    let read = tokio::time::timeout(COMMAND_READ_TIMEOUT, reader.read_line(&mut line)).await;
    read.map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let reply = match serde_json::from_str::<AdminCommand>(&line) {
        Ok(command) => command.execute(host).await,
        Err(e) => AdminReply::Failed(format!("not an admin command: {e}")),
    };
    let mut text = serde_json::to_string(&reply).expect("a reply serializes");
    text.push('\n');
    write.write_all(text.as_bytes()).await
}

/// Sends `command` to the server that owns `data_dir`.
pub async fn send(data_dir: &Path, command: &AdminCommand) -> std::io::Result<AdminReply> {
    let path = data_dir.join(SOCKET);
    let stream = UnixStream::connect(&path).await?;
    let (read, mut write) = stream.into_split();
    let mut text = serde_json::to_string(command).expect("a command serializes");
    text.push('\n');
    write.write_all(text.as_bytes()).await?;
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await?;
    serde_json::from_str(&line).map_err(std::io::Error::other)
}

/// `YYYY-MM-DDTHH:MM:SSZ` from Unix milliseconds.
pub fn rfc3339(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(ms / 1000);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// `1536` → `1.5 KiB`: bytes as people read them.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    /// A file past the component limit was read whole into memory before the install refused
    /// it.
    #[tokio::test]
    async fn a_file_larger_than_any_tool_may_be_is_not_read() {
        let sandbox = toolhost::SandboxConfig {
            max_component_bytes: 1024,
            ..Default::default()
        };
        let config = toolhost::HostConfig {
            sandbox,
            ..Default::default()
        };
        let host = toolhost::Host::open(config).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("big.wasm");
        std::fs::write(&file, vec![0u8; 1025]).unwrap();
        let refused = super::install(&host, "acme", &file).await.err().unwrap();
        let message = format!("{refused:?}");
        assert!(message.contains("1025 bytes, over the 1024"), "{message}");
        // A FIFO says it holds nothing: refused, not read for as long as a writer gives.
        let fifo = dir.path().join("pipe.wasm");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        // A writer that gives without end, as `/dev/zero` would.
        let writer = std::thread::spawn({
            let fifo = fifo.clone();
            move || {
                use std::io::Write;
                let mut pipe = std::fs::OpenOptions::new().write(true).open(fifo)?;
                loop {
                    pipe.write_all(&[0u8; 4096])?;
                }
            }
        });
        let refused = super::install(&host, "acme", &fifo).await.err().unwrap();
        let message = format!("{refused:?}");
        assert!(message.contains("not a regular file"), "{message}");
        // Its reader gone, the writer's next write fails.
        let ended: std::io::Result<()> = writer.join().unwrap();
        assert!(ended.is_err());
    }

    #[test]
    fn timestamps_are_rfc3339_in_utc() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_825_599_999), "2000-02-29T11:59:59Z");
    }

    #[test]
    fn bytes_read_as_people_read_them() {
        let read = |n| super::human_bytes(n);
        assert_eq!(read(0), "0 B");
        assert_eq!(read(1023), "1023 B");
        assert_eq!(read(1536), "1.5 KiB");
        assert_eq!(read(100 << 20), "100.0 MiB");
        assert_eq!(read(1 << 30), "1.0 GiB");
        assert_eq!(read(u64::MAX), "16777216.0 TiB");
    }
}
