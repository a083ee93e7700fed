//! Each tenant's recent calls, for the people who watch them (the console): a bounded ring
//! of full call records, and per tool, calls, errors and latency per minute over the last
//! hour. Kept in memory on the node that ran the calls; a restart starts it empty.
//!
//! Every part is bounded whatever a tenant does: records by count and bytes (an oversized
//! argument object or result is kept as a note of its size, and error texts are counted),
//! series by tool count and age, and tenants by number (the one whose last call is oldest
//! gives way). Only calls of tools that exist are kept, so made-up tool names cannot grow it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use toolhost_spec::call::{CallError, CallOutcome};
use toolhost_spec::clip::held_bytes;

/// The per-minute series cover this many minutes.
pub const HISTORY_MINUTES: u64 = 60;
/// A tenant's records take at most this many bytes of memory (their arguments, results and
/// logs).
pub const MAX_HISTORY_BYTES_PER_TENANT: usize = 1 << 20;
/// An argument object or a result taking more memory than this is kept as a note of its size.
const MAX_KEPT_VALUE_BYTES: usize = 16 * 1024;
/// Series kept per tenant; the tool called least recently gives way to a new one.
const MAX_SERIES_PER_TENANT: usize = 64;
/// Tenants with a history on this node (each within about 2 MiB: its records and series);
/// the one whose last call is oldest gives way to a new one.
pub const MAX_TENANTS_WITH_HISTORY: usize = 256;
/// Latency buckets: bucket `i` holds calls under 2^((i+1)/2) µs; the last, everything
/// longer (past 2^26 µs, about 67 s).
const LATENCY_BUCKETS: usize = 52;
const MINUTE_MS: u64 = 60_000;

/// One call as the history keeps it.
#[derive(Debug)]
pub struct CallRecord {
    /// When it ended (Unix milliseconds).
    pub at_ms: u64,
    /// The tool version that answered, if it was a tenant's tool.
    pub version: Option<u32>,
    /// The arguments as the caller passed them.
    pub arguments: Value,
    /// Everything it produced.
    pub outcome: CallOutcome,
}

impl CallRecord {
    /// The record as the HTTP API answers it: the outcome's JSON with `at_ms`, `version`
    /// and `arguments` beside it.
    pub fn to_json(&self) -> Value {
        let mut body = self.outcome.to_json();
        body["at_ms"] = self.at_ms.into();
        body["version"] = self.version.into();
        body["arguments"] = self.arguments.clone();
        body
    }

    /// `outcome` as the history keeps it: an argument object or result over
    /// [`MAX_KEPT_VALUE_BYTES`] is a note of its size (see [`kept`]).
    pub(crate) fn of(
        outcome: &CallOutcome,
        arguments: Value,
        at_ms: u64,
        version: Option<u32>,
    ) -> Self {
        let outcome = CallOutcome {
            call_id: outcome.call_id.clone(),
            tool: outcome.tool.clone(),
            result: match &outcome.result {
                Ok(value) => Ok(kept(value)),
                Err(error) => Err(error.clone()),
            },
            log: outcome.log.clone(),
            ..*outcome
        };
        CallRecord {
            at_ms,
            version,
            arguments,
            outcome,
        }
    }

    /// About how many bytes the record holds, error texts included.
    fn bytes(&self) -> usize {
        let log = &self.outcome.log;
        let lines: usize = log.lines.iter().map(|l| l.message.len() + 16).sum();
        let log = lines + log.stdout.len() + log.stderr.len();
        let result = match &self.outcome.result {
            Ok(value) => held_bytes(value),
            // Each message is in the JSON twice: in `message` and in `errors`.
            Err(CallError::InvalidArgs { errors }) => (errors.iter())
                .map(|e| 2 * e.message.len() + e.path.len() + 32)
                .sum(),
            Err(error) => error.to_string().len(),
        };
        256 + held_bytes(&self.arguments) + result + log
    }
}

/// `value`, or a note of its size when it is over [`MAX_KEPT_VALUE_BYTES`]: measured before
/// anything is copied.
pub(crate) fn kept(value: &Value) -> Value {
    let bytes = held_bytes(value);
    if bytes <= MAX_KEPT_VALUE_BYTES {
        return value.clone();
    }
    Value::String(format!(
        "({bytes} bytes in memory: too large for the call history)"
    ))
}

/// Which records [`History::recent`] returns.
#[derive(Debug, Clone, Default)]
pub struct CallFilter {
    /// Only this tool's.
    pub tool: Option<String>,
    /// Only this outcome's: `ok` or an error code (`invalid_args`, `timeout`, …).
    pub outcome: Option<String>,
    /// At most this many, newest first.
    pub limit: usize,
}

/// One minute of one tool's calls.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatsPoint {
    /// The minute's start (Unix milliseconds).
    pub at_ms: u64,
    /// Calls that ended in it.
    pub calls: u32,
    /// Of those, the ones that failed (a call held for approval has not failed).
    pub errors: u32,
    /// Median latency: the upper bound of its bucket (up to 41 % above the true value);
    /// none when no call ran.
    pub p50_ms: Option<f64>,
    /// 99th percentile latency, to the bucket.
    pub p99_ms: Option<f64>,
}

/// A tool's minutes that had calls, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolStats {
    /// The tool's name.
    pub tool: String,
    /// Its minutes with calls.
    pub points: Vec<StatsPoint>,
}

/// Every tenant's history on this node.
pub(crate) struct History {
    records_per_tenant: usize,
    tenants: RwLock<HashMap<String, Arc<Mutex<TenantHistory>>>>,
}

#[derive(Default)]
struct TenantHistory {
    /// Each with about how many bytes it holds; shared with readers, so a read copies none.
    records: VecDeque<(Arc<CallRecord>, usize)>,
    bytes: usize,
    series: HashMap<String, Series>,
    last_ms: u64,
}

#[derive(Default)]
struct Series {
    minutes: VecDeque<Minute>,
}

struct Minute {
    start_ms: u64,
    calls: u32,
    errors: u32,
    latency: [u32; LATENCY_BUCKETS],
}

impl History {
    /// Keeps up to `records_per_tenant` records for each tenant (0: none, and no series).
    pub fn new(records_per_tenant: usize) -> Self {
        History {
            records_per_tenant,
            tenants: RwLock::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.records_per_tenant > 0
    }

    /// Adds a call of a tool that exists (made by [`CallRecord::of`]).
    pub fn record(&self, tenant: &str, record: CallRecord) {
        if !self.enabled() {
            return;
        }
        let bytes = record.bytes();
        // Allocated before the lock, and what it pushes out freed after it: a tenant's calls
        // on other cores wait for the lock only while the ring is updated.
        let record = Arc::new(record);
        let history = self.tenant(tenant);
        let mut pushed_out = Vec::new();
        {
            let mut history = history.lock().unwrap_or_else(|p| p.into_inner());
            history.count(&record);
            history.last_ms = history.last_ms.max(record.at_ms);
            history.bytes += bytes;
            history.records.push_back((record, bytes));
            while history.records.len() > self.records_per_tenant
                || history.bytes > MAX_HISTORY_BYTES_PER_TENANT
            {
                let Some((record, bytes)) = history.records.pop_front() else {
                    break;
                };
                history.bytes -= bytes;
                pushed_out.push(record);
            }
        }
        drop(pushed_out);
    }

    /// The tenant's records that pass `filter`, newest first.
    pub fn recent(&self, tenant: &str, filter: &CallFilter) -> Vec<Arc<CallRecord>> {
        let Some(history) = self.existing(tenant) else {
            return Vec::new();
        };
        let history = history.lock().unwrap_or_else(|p| p.into_inner());
        history
            .records
            .iter()
            .rev()
            .map(|(record, _)| record)
            .filter(|r| filter.tool.as_ref().is_none_or(|t| *t == r.outcome.tool))
            .filter(|r| {
                filter
                    .outcome
                    .as_ref()
                    .is_none_or(|o| o == r.outcome.code())
            })
            .take(filter.limit)
            .cloned()
            .collect()
    }

    /// Per tool, the minutes with calls among the last `minutes` (1 to [`HISTORY_MINUTES`];
    /// the minute of `now_ms` is the last), tools by name.
    pub fn stats(&self, tenant: &str, minutes: u64, now_ms: u64) -> Vec<ToolStats> {
        let Some(history) = self.existing(tenant) else {
            return Vec::new();
        };
        let minutes = minutes.clamp(1, HISTORY_MINUTES);
        let since = (now_ms - now_ms % MINUTE_MS).saturating_sub((minutes - 1) * MINUTE_MS);
        let history = history.lock().unwrap_or_else(|p| p.into_inner());
        let mut stats: Vec<ToolStats> = history
            .series
            .iter()
            .map(|(tool, series)| ToolStats {
                tool: tool.clone(),
                points: (series.minutes.iter())
                    .filter(|m| m.start_ms >= since)
                    .map(Minute::point)
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        stats.sort_by(|a, b| a.tool.cmp(&b.tool));
        stats
    }

    fn existing(&self, tenant: &str) -> Option<Arc<Mutex<TenantHistory>>> {
        let tenants = self.tenants.read().unwrap_or_else(|p| p.into_inner());
        tenants.get(tenant).cloned()
    }

    fn tenant(&self, tenant: &str) -> Arc<Mutex<TenantHistory>> {
        if let Some(history) = self.existing(tenant) {
            return history;
        }
        let mut tenants = self.tenants.write().unwrap_or_else(|p| p.into_inner());
        if !tenants.contains_key(tenant) && tenants.len() >= MAX_TENANTS_WITH_HISTORY {
            let stalest = (tenants.iter())
                .min_by_key(|(_, h)| h.lock().unwrap_or_else(|p| p.into_inner()).last_ms)
                .map(|(tenant, _)| tenant.clone());
            if let Some(stalest) = stalest {
                tenants.remove(&stalest);
            }
        }
        tenants.entry(tenant.to_owned()).or_default().clone()
    }
}

impl TenantHistory {
    fn count(&mut self, record: &CallRecord) {
        let outcome = &record.outcome;
        // Looked up before inserting: a call of a known tool allocates no name.
        if !self.series.contains_key(&outcome.tool) {
            if self.series.len() >= MAX_SERIES_PER_TENANT {
                let stalest = (self.series.iter())
                    .min_by_key(|(_, s)| s.minutes.back().map_or(0, |m| m.start_ms))
                    .map(|(tool, _)| tool.clone());
                if let Some(tool) = stalest {
                    self.series.remove(&tool);
                }
            }
            self.series.insert(outcome.tool.clone(), Series::default());
        }
        let series = self.series.get_mut(&outcome.tool).expect("inserted above");
        let start_ms = record.at_ms - record.at_ms % MINUTE_MS;
        if series.minutes.back().is_none_or(|m| m.start_ms < start_ms) {
            series.minutes.push_back(Minute {
                start_ms,
                calls: 0,
                errors: 0,
                latency: [0; LATENCY_BUCKETS],
            });
        }
        while (series.minutes.front())
            .is_some_and(|m| m.start_ms + HISTORY_MINUTES * MINUTE_MS <= start_ms)
        {
            series.minutes.pop_front();
        }
        // A clock stepped back lands in the newest minute.
        let minute = series.minutes.back_mut().expect("pushed above");
        minute.calls += 1;
        match &outcome.result {
            // Neither ran, so neither has a latency; a rejection is still an error.
            Err(CallError::ApprovalRequired { .. }) => return,
            Err(CallError::Rejected { .. }) => {
                minute.errors += 1;
                return;
            }
            Err(_) => minute.errors += 1,
            Ok(_) => {}
        }
        minute.latency[latency_bucket(outcome.duration)] += 1;
    }
}

impl Minute {
    fn point(&self) -> StatsPoint {
        StatsPoint {
            at_ms: self.start_ms,
            calls: self.calls,
            errors: self.errors,
            p50_ms: self.quantile(0.50),
            p99_ms: self.quantile(0.99),
        }
    }

    /// The upper bound of the bucket holding the `q` quantile, in milliseconds: never below
    /// the true value, at most √2 above it (past 67 s, the last bucket reads 67 s).
    fn quantile(&self, q: f64) -> Option<f64> {
        let ran: u32 = self.latency.iter().sum();
        if ran == 0 {
            return None;
        }
        let rank = ((f64::from(ran) * q).ceil() as u32).max(1);
        let mut seen = 0;
        let bucket = self.latency.iter().position(|&n| {
            seen += n;
            seen >= rank
        })?;
        let upper_us = 2f64.powf((bucket as f64 + 1.0) / 2.0);
        // In milliseconds, to the microsecond.
        Some(upper_us.round() / 1e3)
    }
}

fn latency_bucket(duration: Duration) -> usize {
    let micros = duration.as_micros().max(1) as f64;
    ((micros.log2() * 2.0).floor() as usize).min(LATENCY_BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(tool: &str, at_ms: u64, ms: u64, result: Result<Value, CallError>) -> CallRecord {
        let mut outcome = CallOutcome::new(format!("c{at_ms}"), tool.to_owned());
        outcome.result = result;
        outcome.duration = Duration::from_millis(ms);
        CallRecord::of(&outcome, kept(&json!({"n": at_ms})), at_ms, Some(1))
    }

    fn all(limit: usize) -> CallFilter {
        CallFilter {
            limit,
            ..CallFilter::default()
        }
    }

    #[test]
    fn keeps_the_newest_records_of_each_tenant_only() {
        let history = History::new(3);
        for at in 0..5 {
            history.record("acme", call("a", at, 1, Ok(json!(at))));
        }
        history.record("globex", call("g", 9, 1, Ok(json!(9))));
        let kept: Vec<u64> = (history.recent("acme", &all(10)).iter())
            .map(|r| r.at_ms)
            .collect();
        assert_eq!(kept, [4, 3, 2]);
        assert_eq!(history.recent("globex", &all(10)).len(), 1);
        assert!(history.recent("initech", &all(10)).is_empty());
    }

    #[test]
    fn filters_by_tool_and_outcome() {
        let history = History::new(10);
        history.record("acme", call("a", 1, 1, Ok(json!(1))));
        let timeout = CallError::Timeout { limit_ms: 5 };
        history.record("acme", call("a", 2, 5, Err(timeout)));
        history.record("acme", call("b", 3, 1, Ok(json!(3))));
        let only = |tool: Option<&str>, outcome: Option<&str>| {
            let filter = CallFilter {
                tool: tool.map(Into::into),
                outcome: outcome.map(Into::into),
                limit: 10,
            };
            (history.recent("acme", &filter).iter())
                .map(|r| r.at_ms)
                .collect::<Vec<_>>()
        };
        assert_eq!(only(Some("a"), None), [2, 1]);
        assert_eq!(only(None, Some("timeout")), [2]);
        assert_eq!(only(Some("b"), Some("ok")), [3]);
        assert_eq!(history.recent("acme", &all(1)).len(), 1);
    }

    #[test]
    fn a_tenant_s_records_stay_under_its_byte_budget() {
        let history = History::new(10_000);
        let big = "x".repeat(MAX_KEPT_VALUE_BYTES - 100);
        for at in 0..200 {
            history.record("acme", call("a", at, 1, Ok(json!(big))));
        }
        let kept = history.recent("acme", &all(10_000));
        let bytes: usize = kept.iter().map(|r| r.bytes()).sum();
        assert!(bytes <= MAX_HISTORY_BYTES_PER_TENANT, "{bytes}");
        assert!(kept.len() > 10 && kept.len() < 200, "{}", kept.len());
        // Past the per-value cap, a value is kept as a note of its size.
        history.record("acme", call("a", 300, 1, Ok(json!("y".repeat(100_000)))));
        let newest = &history.recent("acme", &all(1))[0];
        let note = newest.outcome.result.as_ref().unwrap().as_str().unwrap();
        let held = 100_000 + size_of::<Value>();
        assert!(
            note.starts_with(&format!("({held} bytes in memory")),
            "{note}"
        );
    }

    #[test]
    fn a_value_is_measured_by_the_memory_it_holds_not_its_json() {
        // 3 KiB of JSON (13.5 KiB as the history once counted it), 48 KiB of `Value`s.
        let zeros = Value::Array(vec![json!(0); 1500]);
        const { assert!(9 * 1500 < MAX_KEPT_VALUE_BYTES) };
        let note = kept(&zeros);
        assert!(note.is_string(), "kept as a note of its size: {note}");
        // Within the cap, a value is kept as it is.
        let few = Value::Array(vec![json!(0); 100]);
        assert_eq!(kept(&few), few);
    }

    #[test]
    fn a_tenant_flooding_its_history_leaves_another_s_alone() {
        let history = History::new(200);
        history.record("globex", call("g", 1, 1, Ok(json!("kept"))));
        let big = "x".repeat(MAX_KEPT_VALUE_BYTES - 100);
        for at in 0..10_000 {
            history.record("acme", call("a", 2 + at, 1, Ok(json!(big))));
        }
        let theirs = history.recent("globex", &all(10));
        assert_eq!(theirs.len(), 1);
        assert_eq!(theirs[0].outcome.result, Ok(json!("kept")));
        assert_eq!(history.stats("globex", 60, 1)[0].points[0].calls, 1);
    }

    #[test]
    fn error_texts_count_against_the_budget() {
        let history = History::new(10_000);
        let message = "z".repeat(8 * 1024);
        let errors = vec![
            toolhost_spec::schema::ArgError {
                path: "/n".into(),
                message,
            };
            20
        ];
        for at in 0..100 {
            let invalid = CallError::InvalidArgs {
                errors: errors.clone(),
            };
            history.record("acme", call("a", at, 1, Err(invalid)));
        }
        let kept = history.recent("acme", &all(10_000));
        let bytes: usize = kept.iter().map(|r| r.bytes()).sum();
        assert!(bytes > 20 * 8 * 1024 * kept.len(), "{bytes}");
        assert!(bytes <= MAX_HISTORY_BYTES_PER_TENANT, "{bytes}");
        assert!(kept.len() < 100, "{}", kept.len());
    }

    #[test]
    fn a_bounded_number_of_tenants_keep_a_history() {
        let history = History::new(10);
        for t in 0..MAX_TENANTS_WITH_HISTORY as u64 + 5 {
            history.record(&format!("t{t}"), call("a", 1_000 + t, 1, Ok(json!(t))));
        }
        let tenants = history.tenants.read().unwrap().len();
        assert_eq!(tenants, MAX_TENANTS_WITH_HISTORY);
        assert!(
            history.recent("t0", &all(10)).is_empty(),
            "the stalest gave way"
        );
        let newest = format!("t{}", MAX_TENANTS_WITH_HISTORY + 4);
        assert_eq!(history.recent(&newest, &all(10)).len(), 1);
    }

    #[test]
    fn a_window_of_n_minutes_has_at_most_n_minutes() {
        let history = History::new(100);
        for m in 0..10 {
            history.record("acme", call("a", m * MINUTE_MS + 5, 1, Ok(json!(m))));
        }
        // Mid-minute 9: the last 3 minutes are 7, 8 and 9.
        let stats = history.stats("acme", 3, 9 * MINUTE_MS + 30_000);
        let starts: Vec<u64> = stats[0]
            .points
            .iter()
            .map(|p| p.at_ms / MINUTE_MS)
            .collect();
        assert_eq!(starts, [7, 8, 9]);
        assert_eq!(history.stats("acme", 0, 9 * MINUTE_MS)[0].points.len(), 1);
    }

    #[test]
    fn counts_each_minute_with_its_errors_and_latency() {
        let history = History::new(100);
        let minute = 1_700_000_040_000 - 1_700_000_040_000 % MINUTE_MS;
        for i in 0..99 {
            history.record("acme", call("a", minute + i, 1, Ok(json!(i))));
        }
        let trap = CallError::Trap {
            message: "boom".into(),
        };
        history.record("acme", call("a", minute + 500, 900, Err(trap)));
        let held = CallError::ApprovalRequired {
            call_id: "c".into(),
        };
        history.record("acme", call("a", minute + MINUTE_MS, 0, Err(held)));
        let rejected = CallError::Rejected {
            reason: "no".into(),
        };
        history.record("acme", call("a", minute + MINUTE_MS, 0, Err(rejected)));
        let stats = history.stats("acme", 60, minute + 2 * MINUTE_MS);
        assert_eq!(stats.len(), 1);
        let [first, second] = &stats[0].points[..] else {
            panic!("{stats:?}")
        };
        assert_eq!((first.at_ms, first.calls, first.errors), (minute, 100, 1));
        // 1 ms is in the bucket up to 2^10 µs; 900 ms in the one up to 2^20 µs.
        assert_eq!(first.p50_ms, Some(1.024));
        assert_eq!(first.p99_ms, Some(1.024));
        assert_eq!(history.stats("acme", 60, minute).len(), 1);
        // A held call counts as a call, not an error; a rejected one as an error; neither
        // ran, so neither has a latency.
        assert_eq!((second.calls, second.errors, second.p50_ms), (2, 1, None));
        // An hour later the minutes are out of the window.
        assert!(
            history
                .stats("acme", 60, minute + 62 * MINUTE_MS)
                .is_empty()
        );
    }

    #[test]
    fn keeps_one_hour_of_minutes_and_a_bounded_number_of_series() {
        let history = History::new(10);
        for m in 0..200 {
            history.record("acme", call("a", m * MINUTE_MS, 1, Ok(json!(m))));
        }
        let stats = history.stats("acme", 60, 199 * MINUTE_MS);
        assert_eq!(stats[0].points.len(), 60);
        for t in 0..MAX_SERIES_PER_TENANT + 10 {
            history.record(
                "acme",
                call(&format!("t{t}"), 300 * MINUTE_MS, 1, Ok(json!(t))),
            );
        }
        let stats = history.stats("acme", 60, 300 * MINUTE_MS);
        assert_eq!(stats.len(), MAX_SERIES_PER_TENANT);
        assert!(stats.iter().all(|s| s.tool != "a"), "the stalest gave way");
    }

    #[test]
    fn none_is_kept_when_disabled() {
        let history = History::new(0);
        history.record("acme", call("a", 1, 1, Ok(json!(1))));
        assert!(history.recent("acme", &all(10)).is_empty());
        assert!(history.stats("acme", 60, 1).is_empty());
    }
}
