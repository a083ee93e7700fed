//! One call's types: who calls, how it ended, and what it logged.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clip::Clipped;
use crate::schema::ArgError;

/// Who is calling: the embedding application says this, never the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Caller {
    /// The tenant the call is for: it sees only its own tools, data and limits.
    pub tenant: String,
    /// Opaque JSON handed to the tool as `ctx.data` (`null` if none).
    #[serde(default)]
    pub data: Value,
}

impl Caller {
    /// A caller for `tenant`, with no data.
    pub fn tenant(tenant: impl Into<String>) -> Self {
        Caller {
            tenant: tenant.into(),
            data: Value::Null,
        }
    }

    /// Adds the opaque `data` the tool sees as `ctx.data`.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = data;
        self
    }
}

/// What a tool sees of its call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallContext {
    /// The calling tenant.
    pub tenant: String,
    /// This call's id, as in its outcome and log.
    pub call_id: String,
    /// The tool's name.
    pub tool: String,
    /// The caller's `data` (`null` if none).
    pub data: Value,
}

/// A failure the tool reports itself (as opposed to a limit the host enforced).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The arguments passed the schema but the tool cannot use them.
    #[error("invalid arguments: {0}")]
    InvalidArgs(String),
    /// The tool failed, in its own words.
    #[error("{0}")]
    Failed(String),
}

impl ToolError {
    /// A [`ToolError::Failed`] with `message`.
    pub fn failed(message: impl fmt::Display) -> Self {
        ToolError::Failed(message.to_string())
    }

    /// A [`ToolError::InvalidArgs`] with `message`.
    pub fn invalid_args(message: impl fmt::Display) -> Self {
        ToolError::InvalidArgs(message.to_string())
    }
}

/// How a call failed. Each limit has its own variant, so an operator can tell which one a
/// tool hit; [`CallError::code`] is the stable name for each.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CallError {
    /// No tool of that name for this tenant. Says the same whether or not another tenant has
    /// one, so existence does not leak.
    #[error("no tool named `{name}`")]
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// The arguments do not match the tool's parameter schema.
    #[error("invalid arguments: {}", list(errors))]
    InvalidArgs {
        /// Each violation, with the path of the argument at fault.
        errors: Vec<ArgError>,
    },
    /// The tool ran and reported a failure of its own.
    #[error("tool error: {0}")]
    Tool(#[from] ToolError),
    /// The call ran past its deadline (`limits.timeout_ms`), waiting included.
    #[error("timed out after {limit_ms} ms (limits.timeout_ms)")]
    Timeout {
        /// The deadline, in milliseconds.
        limit_ms: u64,
    },
    /// The guest burned all its fuel (`limits.fuel`).
    #[error("ran out of fuel after {limit} units (limits.fuel)")]
    OutOfFuel {
        /// The fuel it had.
        limit: u64,
    },
    /// The guest tried to grow its memory past `limits.memory_bytes`.
    #[error("exceeded its memory limit of {limit_bytes} bytes (limits.memory_bytes)")]
    MemoryLimit {
        /// The cap, in bytes.
        limit_bytes: u64,
    },
    /// The guest crashed: a Wasm trap, with the guest's own message where it left one.
    #[error("trapped: {message}")]
    Trap {
        /// The trap, and the guest's panic message if it left one.
        message: String,
    },
    /// The tool returned something that is not JSON.
    #[error("returned invalid output: {reason}")]
    InvalidOutput {
        /// What is wrong with it.
        reason: String,
    },
    /// The host could not run the call (for example, its stored component is missing).
    #[error("host error: {message}")]
    Internal {
        /// What went wrong, for the operator.
        message: String,
    },
    /// The call needed a write that the host's storage refused (a full or failing disk): the
    /// operator's to fix, and worth a retry later.
    #[error("storage unavailable: {message}")]
    StorageUnavailable {
        /// The write that failed, and why.
        message: String,
    },
    /// The tenant's policy or a hook of the embedding app refused the call.
    #[error("denied: {reason}")]
    Denied {
        /// Which rule refused it.
        reason: String,
    },
    /// The call waits for the embedding app to approve or reject it, by this call id.
    #[error("call `{call_id}` needs approval before it runs")]
    ApprovalRequired {
        /// The held call's id, to approve or reject.
        call_id: String,
    },
    /// The embedding app rejected the call.
    #[error("rejected: {reason}")]
    Rejected {
        /// The approver's reason.
        reason: String,
    },
    /// The caller cancelled the call (an MCP `notifications/cancelled`): it was stopped
    /// where it was, its instance dropped.
    #[error("cancelled by the caller")]
    Cancelled,
    /// A durable call's node stopped answering while it ran, and the tool is not idempotent,
    /// so it is not run again: whether it took effect is unknown.
    #[error("the node running the call was lost: {message}")]
    NodeLost {
        /// Which node, and when.
        message: String,
    },
    /// The tenant is over a rate or concurrency limit of its policy, or has as many calls
    /// waiting as its share of the host queues; other tenants are not.
    #[error("rate limited: {message}")]
    RateLimited {
        /// The policy field whose limit was hit, such as `rate.per_minute`.
        limit: &'static str,
        /// The limit, in words.
        message: String,
        /// When a retry may succeed, where known.
        retry_after_ms: Option<u64>,
    },
}

fn list(errors: &[ArgError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl CallError {
    /// A stable, machine-readable name for the outcome.
    pub fn code(&self) -> &'static str {
        match self {
            CallError::NotFound { .. } => "not_found",
            CallError::InvalidArgs { .. } => "invalid_args",
            CallError::Tool(_) => "tool_error",
            CallError::Timeout { .. } => "timeout",
            CallError::OutOfFuel { .. } => "out_of_fuel",
            CallError::MemoryLimit { .. } => "memory_limit",
            CallError::Trap { .. } => "trap",
            CallError::InvalidOutput { .. } => "invalid_output",
            CallError::Internal { .. } => "internal",
            CallError::StorageUnavailable { .. } => "storage_unavailable",
            CallError::Denied { .. } => "denied",
            CallError::ApprovalRequired { .. } => "approval_required",
            CallError::Rejected { .. } => "rejected",
            CallError::Cancelled => "cancelled",
            CallError::NodeLost { .. } => "node_lost",
            CallError::RateLimited { .. } => "rate_limited",
        }
    }
}

/// Everything one call produced.
#[derive(Debug, Clone)]
pub struct CallOutcome {
    /// The call's id.
    pub call_id: String,
    /// The tool's name, as called.
    pub tool: String,
    /// The tool's JSON result, or why there is none.
    pub result: Result<Value, CallError>,
    /// Set when the result was over `max_result_chars` and was clipped to fit.
    pub clipped: Option<Clipped>,
    /// The result came from the result cache; the tool did not run.
    pub cache_hit: bool,
    /// What the call logged.
    pub log: CallLog,
    /// From the call to its outcome, queueing and retries included.
    pub duration: Duration,
    /// Fuel the guest burned (Wasm tools only), over every attempt.
    pub fuel_used: Option<u64>,
    /// Times the call was run again after a timeout (`retry_count_on_stall`).
    pub retries: u32,
    /// How long it waited for its tenant's share of the host; part of its `duration` and
    /// of its first attempt's timeout.
    pub queued: Duration,
}

impl CallOutcome {
    /// An outcome not yet decided: `not_found` until a step says otherwise.
    pub fn new(call_id: String, tool: String) -> Self {
        CallOutcome {
            result: Err(CallError::NotFound { name: tool.clone() }),
            call_id,
            tool,
            clipped: None,
            cache_hit: false,
            log: CallLog::default(),
            duration: Duration::default(),
            fuel_used: None,
            retries: 0,
            queued: Duration::default(),
        }
    }

    /// `"ok"` or the error's [`CallError::code`].
    pub fn code(&self) -> &'static str {
        self.result.as_ref().map_or_else(CallError::code, |_| "ok")
    }

    /// The outcome as the HTTP API answers it and a durable call keeps it: `ok`, then the
    /// `result` or the `error` (its `code` and `message`), and what the call used.
    pub fn to_json(&self) -> Value {
        let mut body = serde_json::json!({
            "call_id": self.call_id,
            "tool": self.tool,
            "ok": self.result.is_ok(),
            "clipped": self.clipped,
            "cache_hit": self.cache_hit,
            "retries": self.retries,
            "duration_ms": self.duration.as_secs_f64() * 1e3,
            "queued_ms": self.queued.as_secs_f64() * 1e3,
            "fuel_used": self.fuel_used,
            "log": self.log,
        });
        match &self.result {
            Ok(value) => body["result"] = value.clone(),
            Err(error) => {
                let mut detail =
                    serde_json::json!({"code": error.code(), "message": error.to_string()});
                match error {
                    CallError::RateLimited {
                        retry_after_ms: Some(ms),
                        ..
                    } => detail["retry_after_ms"] = serde_json::json!(ms),
                    // Each violation with the JSON Pointer of the argument at fault.
                    CallError::InvalidArgs { errors } => {
                        detail["errors"] = serde_json::json!(errors)
                    }
                    _ => {}
                }
                body["error"] = detail;
            }
        }
        body
    }
}

/// The level of a line a tool logs through the `log` helper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Finest detail.
    Trace,
    /// For the tool's developer.
    Debug,
    /// Normal operation.
    Info,
    /// Something to look at.
    Warn,
    /// A failure.
    Error,
}

/// One line a tool logged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogLine {
    /// Its level.
    pub level: Level,
    /// Its text.
    pub message: String,
}

/// What a call logged: helper log lines and the guest's stdout and stderr, each capped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CallLog {
    /// Lines from the `log` helper, in order.
    pub lines: Vec<LogLine>,
    /// The guest's stdout.
    pub stdout: String,
    /// The guest's stderr.
    pub stderr: String,
    /// Bytes past the caps, counted and dropped.
    pub dropped_bytes: u64,
}

impl CallLog {
    /// The message of a Rust panic in the guest's stderr, if it left one.
    pub fn guest_panic(&self) -> Option<&str> {
        let after = self.stderr.split_once(" panicked at ")?.1;
        let message = after.split_once('\n')?.1;
        let end = message.find("\nnote: ").unwrap_or(message.len());
        Some(message[..end].trim()).filter(|m| !m.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_panic_is_read_from_stderr() {
        let log = CallLog {
            stderr: "\nthread '<unnamed>' panicked at src/lib.rs:51:5:\nboom: it broke\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n".into(),
            ..CallLog::default()
        };
        assert_eq!(log.guest_panic(), Some("boom: it broke"));
        assert_eq!(CallLog::default().guest_panic(), None);
    }
}
