//! Counters for an operator, rendered in the Prometheus text format. Labels never carry
//! tenant or tool names, so the page leaks nothing about who uses the host.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the call latency histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

/// Where a call found its compiled component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComponentSource {
    /// Already linked in memory.
    Memory,
    /// Loaded from the stored compiled artifact.
    Artifact,
    /// Compiled from the stored component.
    Compiled,
}

#[derive(Default)]
pub struct Metrics {
    /// (outcome code, count), in first-seen order.
    calls: Mutex<Vec<(&'static str, u64)>>,
    buckets: [AtomicU64; BUCKETS.len()],
    duration_micros: AtomicU64,
    call_count: AtomicU64,
    instances_live: AtomicI64,
    retries: AtomicU64,
    component_loads: [AtomicU64; 3],
}

/// Counts a live instance until dropped.
pub struct LiveInstance<'a>(&'a Metrics);

impl Drop for LiveInstance<'_> {
    fn drop(&mut self) {
        self.0.instances_live.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    pub fn record_call(&self, outcome: &'static str, duration: Duration, retries: u32) {
        {
            let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
            match calls.iter_mut().find(|(code, _)| *code == outcome) {
                Some((_, n)) => *n += 1,
                None => calls.push((outcome, 1)),
            }
        }
        let seconds = duration.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|&bound| seconds <= bound) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.duration_micros
            .fetch_add(duration.as_micros() as u64, Ordering::Relaxed);
        self.call_count.fetch_add(1, Ordering::Relaxed);
        self.retries
            .fetch_add(u64::from(retries), Ordering::Relaxed);
    }

    pub fn instance(&self) -> LiveInstance<'_> {
        self.instances_live.fetch_add(1, Ordering::Relaxed);
        LiveInstance(self)
    }

    pub fn component_loaded(&self, source: ComponentSource) {
        self.component_loads[source as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition format, version 0.0.4.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP toolhost_calls_total Calls by outcome.\n");
        out.push_str("# TYPE toolhost_calls_total counter\n");
        let calls = self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (code, n) in calls {
            out.push_str(&format!("toolhost_calls_total{{outcome=\"{code}\"}} {n}\n"));
        }
        out.push_str("# HELP toolhost_call_duration_seconds Time from call to outcome.\n");
        out.push_str("# TYPE toolhost_call_duration_seconds histogram\n");
        let mut cumulative = 0;
        for (bound, count) in BUCKETS.iter().zip(&self.buckets) {
            cumulative += count.load(Ordering::Relaxed);
            out.push_str(&format!(
                "toolhost_call_duration_seconds_bucket{{le=\"{bound}\"}} {cumulative}\n"
            ));
        }
        let count = self.call_count.load(Ordering::Relaxed);
        let sum = self.duration_micros.load(Ordering::Relaxed) as f64 / 1e6;
        out.push_str(&format!(
            "toolhost_call_duration_seconds_bucket{{le=\"+Inf\"}} {count}\n\
             toolhost_call_duration_seconds_sum {sum}\n\
             toolhost_call_duration_seconds_count {count}\n"
        ));
        out.push_str("# HELP toolhost_call_retries_total Stall retries of idempotent tools.\n");
        out.push_str("# TYPE toolhost_call_retries_total counter\n");
        out.push_str(&format!(
            "toolhost_call_retries_total {}\n",
            self.retries.load(Ordering::Relaxed)
        ));
        out.push_str("# HELP toolhost_instances_live Wasm instances running now.\n");
        out.push_str("# TYPE toolhost_instances_live gauge\n");
        out.push_str(&format!(
            "toolhost_instances_live {}\n",
            self.instances_live.load(Ordering::Relaxed)
        ));
        out.push_str("# HELP toolhost_component_loads_total Where calls found their compiled component: memory and artifact are compile cache hits.\n");
        out.push_str("# TYPE toolhost_component_loads_total counter\n");
        for (source, n) in ["memory", "artifact", "compiled"]
            .iter()
            .zip(&self.component_loads)
        {
            out.push_str(&format!(
                "toolhost_component_loads_total{{source=\"{source}\"}} {}\n",
                n.load(Ordering::Relaxed)
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_buckets_and_gauges() {
        let m = Metrics::default();
        m.record_call("ok", Duration::from_micros(300), 0);
        m.record_call("ok", Duration::from_millis(20), 0);
        m.record_call("timeout", Duration::from_secs(2), 2);
        m.component_loaded(ComponentSource::Artifact);
        let live = m.instance();
        let text = m.render();
        assert!(text.contains("toolhost_calls_total{outcome=\"ok\"} 2\n"));
        assert!(text.contains("toolhost_calls_total{outcome=\"timeout\"} 1\n"));
        assert!(text.contains("toolhost_call_duration_seconds_bucket{le=\"0.0005\"} 1\n"));
        assert!(text.contains("toolhost_call_duration_seconds_bucket{le=\"0.025\"} 2\n"));
        assert!(text.contains("toolhost_call_duration_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("toolhost_call_retries_total 2\n"));
        assert!(text.contains("toolhost_instances_live 1\n"));
        assert!(text.contains("toolhost_component_loads_total{source=\"artifact\"} 1\n"));
        drop(live);
        assert!(m.render().contains("toolhost_instances_live 0\n"));
    }
}
