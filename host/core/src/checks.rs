//! Checking a call's arguments, or its result, against its tool's schema. Most checks take
//! microseconds and run where the call is. One that may match many bytes against patterns
//! (see [`ArgsValidator::checks_inline`]) can take seconds whatever its time limit, since a
//! match cannot be stopped: it runs on a thread of its own at the lowest CPU priority, in one
//! of its tenant's places, and the call waits for it no longer than its time limit. The
//! thread may run on after that, holding only its tenant's places and idle CPU.

use std::sync::LazyLock;

use serde_json::Value;
use tokio::time::{Instant, timeout_at};
use toolhost_sandbox::places::Places;
use toolhost_spec::call::CallError;
use toolhost_spec::schema::{ArgError, ArgsValidator};

use crate::catalog::Resolved;

/// Checks off the async workers at once in the process.
pub const MAX_CHECKS: usize = 16;
/// Checks off the async workers at once for one tenant.
pub const MAX_CHECKS_PER_TENANT: usize = 2;

static CHECKS: LazyLock<Places> = LazyLock::new(|| Places::new(MAX_CHECKS, MAX_CHECKS_PER_TENANT));

/// Which of a tool's schemas a value is checked against.
#[derive(Clone, Copy)]
pub(crate) enum Against {
    Args,
    Output,
}

impl Against {
    fn validator(self, tool: &Resolved) -> Option<&ArgsValidator> {
        let schemas = tool.schemas().ok()?;
        match self {
            Against::Args => Some(&schemas.args),
            Against::Output => schemas.output.as_ref(),
        }
    }
}

/// `value` checked against `tool`'s schema: `Err` is the call's error when the check did not
/// end by `deadline` (a timeout naming the call's `limit_ms`), or could not start, or when
/// `waiting` refused to count the call among its tenant's waiting ones. `waiting` is asked
/// only of a check that must leave the async worker, and what it returns is held while the
/// call waits for a place: without it, calls whose clients went could pile up there, each
/// holding its arguments. A tool whose schemas do not compile, or that has no such schema,
/// passes: its caller reports the first.
pub(crate) async fn check<W>(
    tenant: &str,
    tool: &Resolved,
    against: Against,
    value: &mut Value,
    (deadline, limit_ms): (std::time::Instant, u64),
    waiting: impl FnOnce(&Value) -> Result<W, CallError>,
) -> Result<Result<(), Vec<ArgError>>, CallError> {
    let Some(validator) = against.validator(tool) else {
        return Ok(Ok(()));
    };
    if validator.checks_inline(value) {
        return Ok(validator.validate(value));
    }
    let deadline = Instant::from_std(deadline);
    let timed_out = || CallError::Timeout { limit_ms };
    let waiting = waiting(value)?;
    let place = (timeout_at(deadline, CHECKS.take(tenant)).await).map_err(|_| timed_out())?;
    drop(waiting);
    let (tool, taken) = (tool.clone(), std::mem::take(value));
    let (send, checked) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("toolhost-check".into())
        .spawn(move || {
            let _place = place;
            // Lowest priority: the thread gets only CPU no one else wants.
            let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 19);
            let result = against
                .validator(&tool)
                .map_or(Ok(()), |v| v.validate(&taken));
            let _ = send.send((taken, result));
        })
        .map_err(|error| CallError::Internal {
            message: format!("could not start a thread to check the call: {error}"),
        })?;
    match timeout_at(deadline, checked).await {
        Ok(Ok((taken, result))) => {
            *value = taken;
            Ok(result)
        }
        Ok(Err(_)) => Err(CallError::Internal {
            message: "checking the call against its schema failed".into(),
        }),
        Err(_) => Err(timed_out()),
    }
}
