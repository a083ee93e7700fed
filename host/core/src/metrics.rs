//! Counters for an operator, rendered in the Prometheus text format. Labels never carry
//! tenant or tool names, so the page leaks nothing about who uses the host.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds of the call latency histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Where a call found its compiled component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComponentSource {
    /// Already linked in memory.
    Memory,
    /// Loaded from the stored compiled artifact.
    Artifact,
    /// Compiled from the stored component.
    Compiled,
    /// A JS tool's pre-initialised snapshot, in memory.
    Snapshot,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Source {
    source: &'static str,
}

/// The host's counters. An app with its own Prometheus registry adds them with
/// [`Metrics::register`]; [`Metrics::render`] is the host's own page.
pub struct Metrics {
    calls: Family<Outcome, Counter>,
    duration: Histogram,
    retries: Counter,
    instances_live: Gauge,
    storage_up: Gauge,
    cluster_nodes: Gauge,
    component_loads: Family<Source, Counter>,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut metrics = Metrics {
            calls: Family::default(),
            duration: Histogram::new(BUCKETS),
            retries: Counter::default(),
            instances_live: Gauge::default(),
            storage_up: Gauge::default(),
            cluster_nodes: Gauge::default(),
            component_loads: Family::default(),
            registry: Registry::default(),
        };
        // Known label values start at 0, so a rate over them is defined from the start.
        for source in ["memory", "artifact", "compiled", "snapshot"] {
            metrics
                .component_loads
                .get_or_create(&Source { source })
                .inc_by(0);
        }
        metrics.storage_up.set(1);
        metrics.cluster_nodes.set(1);
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.registry = registry;
        metrics
    }
}

/// Counts a live instance until dropped.
pub struct LiveInstance<'a>(&'a Metrics);

impl Drop for LiveInstance<'_> {
    fn drop(&mut self) {
        self.0.instances_live.dec();
    }
}

impl Metrics {
    /// Adds the host's metrics to `registry` (they stay live: the registry holds handles).
    pub fn register(&self, registry: &mut Registry) {
        registry.register("toolhost_calls", "Calls by outcome", self.calls.clone());
        registry.register(
            "toolhost_call_duration_seconds",
            "Time from call to outcome",
            self.duration.clone(),
        );
        registry.register(
            "toolhost_call_retries",
            "Stall retries of idempotent tools",
            self.retries.clone(),
        );
        registry.register(
            "toolhost_instances_live",
            "Wasm instances running now",
            self.instances_live.clone(),
        );
        registry.register(
            "toolhost_storage_up",
            "1 while the store's writes reach its disk, 0 after a write failed (full, read-only or failing disk)",
            self.storage_up.clone(),
        );
        registry.register(
            "toolhost_cluster_nodes",
            "Nodes alive on the shared store, this one included, which share each tenant's limits (1 on a store of its own)",
            self.cluster_nodes.clone(),
        );
        registry.register(
            "toolhost_component_loads",
            "Where calls found their compiled component: memory and artifact are compile cache hits; snapshot is a pre-initialised JS tool",
            self.component_loads.clone(),
        );
    }

    /// Counts a call's outcome, duration and retries.
    pub fn record_call(&self, outcome: &'static str, duration: Duration, retries: u32) {
        self.calls.get_or_create(&Outcome { outcome }).inc();
        self.duration.observe(duration.as_secs_f64());
        self.retries.inc_by(u64::from(retries));
    }

    /// Sets `toolhost_cluster_nodes`.
    pub fn cluster_nodes(&self, nodes: u32) {
        self.cluster_nodes.set(i64::from(nodes));
    }

    /// Sets `toolhost_storage_up`.
    pub fn storage_up(&self, up: bool) {
        self.storage_up.set(i64::from(up));
    }

    /// Counts an instance as live until the guard drops.
    pub fn instance(&self) -> LiveInstance<'_> {
        self.instances_live.inc();
        LiveInstance(self)
    }

    /// Counts where a call found its component.
    pub fn component_loaded(&self, source: ComponentSource) {
        let source = match source {
            ComponentSource::Memory => "memory",
            ComponentSource::Artifact => "artifact",
            ComponentSource::Compiled => "compiled",
            ComponentSource::Snapshot => "snapshot",
        };
        self.component_loads.get_or_create(&Source { source }).inc();
    }

    /// The OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
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
        assert!(text.contains("toolhost_component_loads_total{source=\"compiled\"} 0\n"));
        assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with EOF");
        drop(live);
        assert!(m.render().contains("toolhost_instances_live 0\n"));
    }

    #[test]
    fn an_app_registry_sees_the_live_counters() {
        let m = Metrics::default();
        let mut app = Registry::default();
        m.register(&mut app);
        m.record_call("ok", Duration::from_millis(1), 0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &app).unwrap();
        assert!(
            text.contains("toolhost_calls_total{outcome=\"ok\"} 1\n"),
            "{text}"
        );
    }
}
