//! The registry's Prometheus figures (docs/install-registry.md "Metrics"
//! lists each one): the histograms and gauges the hot paths record into,
//! and [`Metrics::render`], which `GET /metrics` ([`crate::health`]) calls
//! with the figures read at scrape time (store counts, MQTT and WAL
//! counters kept elsewhere as atomics).
//!
//! Each registry has its own [`Metrics`] with its own
//! [`prometheus::Registry`], never the crate's process-global default one:
//! two registries started in one process (as the tests do) keep their
//! figures apart.
//!
//! Recording is a few atomic operations: a labelled series is looked up by
//! hashing the `&'static str` or borrowed label values (no allocation once
//! the series exists), and nothing here is ever held across an `.await`.

use std::time::Duration;

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// The `Content-Type` of [`Metrics::render`]'s text:
/// `text/plain; version=0.0.4; charset=utf-8`.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Buckets of `benchlink_http_request_duration_seconds`, seconds (1 ms
/// to 10 s).
pub const HTTP_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Buckets of `benchlink_action_round_trip_seconds`, seconds (5 ms to
/// 5 min: a relay switch to a long capture).
pub const ACTION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Buckets of `benchlink_lease_wait_seconds`, seconds (an immediate grant
/// lands in the first, 1 ms; up to an hour in the queue).
pub const LEASE_WAIT_BUCKETS: &[f64] = &[
    0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0,
];

/// Buckets of `benchlink_lease_hold_seconds`, seconds (1 s to a day).
pub const LEASE_HOLD_BUCKETS: &[f64] = &[
    1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0,
];

/// Every figure one registry records as it runs. Cheap to clone (the
/// metrics are shared handles).
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// HTTP request durations.
    pub http: HttpMetrics,
    /// Lease wait, hold and queue depth.
    pub leases: LeaseMetrics,
    /// Action round trips.
    pub actions: ActionMetrics,
    /// `benchlink_event_stream_subscribers`: open SSE streams of
    /// `GET /api/v1/capability-events/stream`.
    pub event_subscribers: IntGauge,
}

/// `benchlink_http_request_duration_seconds{method, route, status}`.
#[derive(Clone)]
pub struct HttpMetrics {
    duration: HistogramVec,
}

/// The lease engine's figures (`crate::leases` records them).
#[derive(Clone)]
pub struct LeaseMetrics {
    wait: HistogramVec,
    hold: HistogramVec,
    queue_depth: IntGauge,
}

/// `benchlink_action_round_trip_seconds{type, action, status}`.
#[derive(Clone)]
pub struct ActionMetrics {
    round_trip: HistogramVec,
}

fn histogram(name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("a valid histogram definition")
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh set of figures in a registry of its own.
    pub fn new() -> Self {
        let registry = Registry::new();
        let http = HttpMetrics {
            duration: histogram(
                "benchlink_http_request_duration_seconds",
                "HTTP requests by method, route pattern and status, from arrival to the response head, seconds.",
                &["method", "route", "status"],
                HTTP_BUCKETS,
            ),
        };
        let leases = LeaseMetrics {
            wait: histogram(
                "benchlink_lease_wait_seconds",
                "Time from a lease request to its grant (immediate grants included), by capability type and holder type, seconds.",
                &["type", "holder_type"],
                LEASE_WAIT_BUCKETS,
            ),
            hold: histogram(
                "benchlink_lease_hold_seconds",
                "Time from a lease's grant to its end, by capability type, holder type and final status, seconds.",
                &["type", "holder_type", "end"],
                LEASE_HOLD_BUCKETS,
            ),
            queue_depth: IntGauge::new(
                "benchlink_lease_queue_depth",
                "Lease requests waiting in the queue (a group counts once).",
            )
            .expect("a valid gauge definition"),
        };
        let actions = ActionMetrics {
            round_trip: histogram(
                "benchlink_action_round_trip_seconds",
                "Time from an action's command leaving the registry to the provider's final result, by capability type, action and session status, seconds.",
                &["type", "action", "status"],
                ACTION_BUCKETS,
            ),
        };
        let event_subscribers = IntGauge::new(
            "benchlink_event_stream_subscribers",
            "Open streams of GET /api/v1/capability-events/stream.",
        )
        .expect("a valid gauge definition");
        let collectors: [Box<dyn Collector>; 6] = [
            Box::new(http.duration.clone()),
            Box::new(leases.wait.clone()),
            Box::new(leases.hold.clone()),
            Box::new(leases.queue_depth.clone()),
            Box::new(actions.round_trip.clone()),
            Box::new(event_subscribers.clone()),
        ];
        for c in collectors {
            registry
                .register(c)
                .expect("distinct metric names in a fresh registry");
        }
        Self {
            registry,
            http,
            leases,
            actions,
            event_subscribers,
        }
    }

    /// The exposition text (Prometheus text format 0.0.4, [`CONTENT_TYPE`]):
    /// every recorded figure plus `sampled` (figures read at scrape time,
    /// see [`Sampled`]), families sorted by name.
    pub fn render(&self, sampled: Sampled) -> String {
        let mut families = self.registry.gather();
        families.extend(sampled.families);
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&families, &mut out) {
            tracing::error!(error = %e, "cannot encode the metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

impl HttpMetrics {
    /// One answered request: `route` is the route's pattern (e.g.
    /// `/api/v1/capability-leases/{lease_id}`), `unmatched` when none
    /// matched; a method outside the standard ones counts as `other`.
    pub fn observe(
        &self,
        method: &axum::http::Method,
        route: &str,
        status: axum::http::StatusCode,
        elapsed: Duration,
    ) {
        use axum::http::Method;
        let method = match *method {
            Method::GET => "GET",
            Method::POST => "POST",
            Method::PUT => "PUT",
            Method::DELETE => "DELETE",
            Method::PATCH => "PATCH",
            Method::HEAD => "HEAD",
            Method::OPTIONS => "OPTIONS",
            _ => "other",
        };
        self.duration
            .with_label_values(&[method, route, status.as_str()])
            .observe(elapsed.as_secs_f64());
    }
}

impl LeaseMetrics {
    /// A lease was granted after waiting `waited` (zero for an immediate
    /// grant).
    pub fn granted(&self, capability_type: &str, holder_type: &str, waited: Duration) {
        self.wait
            .with_label_values(&[capability_type, holder_type])
            .observe(waited.as_secs_f64());
    }

    /// A granted lease ended with status `end` (`released`, `expired`,
    /// `revoked`, ...) after being held for `held`.
    pub fn ended(&self, capability_type: &str, holder_type: &str, end: &str, held: Duration) {
        self.hold
            .with_label_values(&[capability_type, holder_type, end])
            .observe(held.as_secs_f64());
    }

    /// `waiting` requests are in the queue now.
    pub fn set_queue_depth(&self, waiting: usize) {
        self.queue_depth
            .set(i64::try_from(waiting).unwrap_or(i64::MAX));
    }
}

impl ActionMetrics {
    /// The final result of an action sent `elapsed` ago arrived.
    pub fn observe(&self, capability_type: &str, action: &str, status: &str, elapsed: Duration) {
        self.round_trip
            .with_label_values(&[capability_type, action, status])
            .observe(elapsed.as_secs_f64());
    }
}

/// Figures read at scrape time from where they are kept (the store, the
/// MQTT client's and the broker gate's atomics), as metric families for
/// [`Metrics::render`]. A figure whose name or labels the client library
/// refuses is left out (and logged).
#[derive(Default)]
pub struct Sampled {
    families: Vec<MetricFamily>,
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Sampled {
    fn add(&mut self, name: &str, made: prometheus::Result<Vec<MetricFamily>>) {
        match made {
            Ok(f) => self.families.extend(f),
            Err(e) => tracing::error!(metric = name, error = %e, "metric left out"),
        }
    }

    /// A counter with no labels.
    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        let made = IntCounter::new(name, help).map(|c| {
            c.inc_by(value);
            c.collect()
        });
        self.add(name, made);
    }

    /// A gauge with no labels.
    pub fn gauge(&mut self, name: &str, help: &str, value: u64) {
        let made = IntGauge::new(name, help).map(|g| {
            g.set(to_i64(value));
            g.collect()
        });
        self.add(name, made);
    }

    /// A gauge with no labels and a fractional value.
    pub fn gauge_f64(&mut self, name: &str, help: &str, value: f64) {
        let made = prometheus::Gauge::new(name, help).map(|g| {
            g.set(value);
            g.collect()
        });
        self.add(name, made);
    }

    /// A counter with one label: one series per `(label value, value)`.
    pub fn counter_by(&mut self, name: &str, help: &str, label: &str, values: &[(&str, u64)]) {
        let made = IntCounterVec::new(Opts::new(name, help), &[label]).map(|c| {
            for (l, v) in values {
                c.with_label_values(&[*l]).inc_by(*v);
            }
            c.collect()
        });
        self.add(name, made);
    }

    /// A gauge with one label: one series per `(label value, value)`.
    pub fn gauge_by(&mut self, name: &str, help: &str, label: &str, values: &[(&str, u64)]) {
        let made = IntGaugeVec::new(Opts::new(name, help), &[label]).map(|g| {
            for (l, v) in values {
                g.with_label_values(&[*l]).set(to_i64(*v));
            }
            g.collect()
        });
        self.add(name, made);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_registries_keep_their_figures_apart() {
        let a = Metrics::new();
        let b = Metrics::new();
        a.actions
            .observe("relay", "switch_on", "completed", Duration::from_millis(20));
        a.event_subscribers.inc();
        let text_a = a.render(Sampled::default());
        let text_b = b.render(Sampled::default());
        assert!(text_a.contains(
            "benchlink_action_round_trip_seconds_count{action=\"switch_on\",status=\"completed\",type=\"relay\"} 1"
        ), "{text_a}");
        assert!(
            text_a.contains("benchlink_event_stream_subscribers 1"),
            "{text_a}"
        );
        assert!(!text_b.contains("switch_on"), "{text_b}");
        assert!(
            text_b.contains("benchlink_event_stream_subscribers 0"),
            "{text_b}"
        );
    }

    #[test]
    fn sampled_figures_join_the_recorded_ones_in_name_order() {
        let m = Metrics::new();
        let mut s = Sampled::default();
        s.counter("benchlink_events_total", "Events.", 7);
        s.gauge_by("benchlink_leases", "Leases.", "status", &[("granted", 2)]);
        let text = m.render(s);
        assert!(
            text.contains("# TYPE benchlink_events_total counter\nbenchlink_events_total 7\n"),
            "{text}"
        );
        assert!(
            text.contains("benchlink_leases{status=\"granted\"} 2"),
            "{text}"
        );
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
    }
}
