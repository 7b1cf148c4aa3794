//! The bench's Prometheus figures and their local listener (`[metrics]
//! listen`, docs/install-edge-agent.md "Metrics" lists each figure):
//! `GET /metrics` answers Prometheus text format 0.0.4.
//!
//! Nothing here reads SQLite: the outbox figures are the ones the daemon
//! reads for `status.json` every [`crate::status::STATUS_PERIOD`] (on a
//! blocking thread, [`EdgeMetrics::set_outbox`]); the link state and the
//! capabilities' health are read from memory when Prometheus scrapes.
//! Driver errors are counted by the runner threads as they happen
//! ([`EdgeMetrics::driver_error`]).
//!
//! Each daemon has its own [`prometheus::Registry`] (never the crate's
//! global one), so daemons started in one process keep their figures apart.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use shared_protocol::capability::HealthStatus;

use crate::drivers::DriverError;
use crate::link::LinkState;
use crate::outbox::OutboxStats;
use crate::runner::Runners;

/// The `Content-Type` of `GET /metrics`.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every health status a capability can report, one
/// `benchlink_edge_capability_health` series each.
const HEALTH_STATUSES: [HealthStatus; 4] = [
    HealthStatus::Healthy,
    HealthStatus::Degraded,
    HealthStatus::Unhealthy,
    HealthStatus::Unknown,
];

/// One daemon's figures. Cheap to clone (shared handles).
#[derive(Clone)]
pub struct EdgeMetrics {
    registry: Registry,
    mqtt_connected: IntGauge,
    registered: IntGauge,
    mqtt_connects: IntCounter,
    pending_artifacts: IntGauge,
    pending_bytes: IntGauge,
    queued_updates: IntGauge,
    corrupt_artifacts: IntGauge,
    budget_used_bytes: IntGauge,
    budget_bytes: IntGauge,
    upload_lag: Gauge,
    health: IntGaugeVec,
    driver_errors: IntCounterVec,
    /// Serialises scrape-time updates (the connect counter follows the
    /// link's count by increments).
    scrape: Arc<Mutex<()>>,
}

fn gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::new(name, help).expect("a valid gauge definition")
}

impl Default for EdgeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl EdgeMetrics {
    /// A fresh set of figures in a registry of its own.
    pub fn new() -> Self {
        let m = Self {
            registry: Registry::new(),
            mqtt_connected: gauge(
                "benchlink_edge_mqtt_connected",
                "1 while the MQTT link to the broker is connected.",
            ),
            registered: gauge(
                "benchlink_edge_registered",
                "1 while online and register were acknowledged on the current connection.",
            ),
            mqtt_connects: IntCounter::new(
                "benchlink_edge_mqtt_connects_total",
                "MQTT connections made (ConnAcks) since the daemon started.",
            )
            .expect("a valid counter definition"),
            pending_artifacts: gauge(
                "benchlink_edge_outbox_pending_artifacts",
                "Artifact rows in the outbox awaiting upload.",
            ),
            pending_bytes: gauge(
                "benchlink_edge_outbox_pending_bytes",
                "Bytes of artifact files awaiting upload (pending and corrupt).",
            ),
            queued_updates: gauge(
                "benchlink_edge_outbox_queued_updates",
                "Session updates queued until the broker acknowledges them.",
            ),
            corrupt_artifacts: gauge(
                "benchlink_edge_outbox_corrupt_artifacts",
                "Artifacts whose file no longer matches its sha256.",
            ),
            budget_used_bytes: gauge(
                "benchlink_edge_outbox_budget_used_bytes",
                "Bytes counted against the outbox's disk budget.",
            ),
            budget_bytes: gauge(
                "benchlink_edge_outbox_budget_bytes",
                "The outbox's disk budget, bytes.",
            ),
            upload_lag: Gauge::new(
                "benchlink_edge_upload_lag_seconds",
                "Age of the oldest artifact awaiting upload (0 when none waits), seconds.",
            )
            .expect("a valid gauge definition"),
            health: IntGaugeVec::new(
                Opts::new(
                    "benchlink_edge_capability_health",
                    "1 for the capability's current health status, 0 for the others.",
                ),
                &["capability_id", "type", "status"],
            )
            .expect("a valid gauge definition"),
            driver_errors: IntCounterVec::new(
                Opts::new(
                    "benchlink_edge_driver_errors_total",
                    "Actions a driver ended with an error (cancellations not counted), by capability and error kind.",
                ),
                &["capability_id", "type", "kind"],
            )
            .expect("a valid counter definition"),
            scrape: Arc::default(),
        };
        let collectors: [Box<dyn Collector>; 12] = [
            Box::new(m.mqtt_connected.clone()),
            Box::new(m.registered.clone()),
            Box::new(m.mqtt_connects.clone()),
            Box::new(m.pending_artifacts.clone()),
            Box::new(m.pending_bytes.clone()),
            Box::new(m.queued_updates.clone()),
            Box::new(m.corrupt_artifacts.clone()),
            Box::new(m.budget_used_bytes.clone()),
            Box::new(m.budget_bytes.clone()),
            Box::new(m.upload_lag.clone()),
            Box::new(m.health.clone()),
            Box::new(m.driver_errors.clone()),
        ];
        for c in collectors {
            m.registry
                .register(c)
                .expect("distinct metric names in a fresh registry");
        }
        m
    }

    /// The outbox as the daemon last read it (`now`: when, for the upload
    /// lag).
    pub fn set_outbox(&self, stats: &OutboxStats, now: DateTime<Utc>) {
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.pending_artifacts.set(n(stats.pending_artifacts));
        self.pending_bytes.set(n(stats.pending_bytes));
        self.queued_updates.set(n(stats.queued_updates));
        self.corrupt_artifacts.set(n(stats.corrupt_artifacts));
        self.budget_used_bytes.set(n(stats.budget_used_bytes));
        self.budget_bytes.set(n(stats.budget_bytes));
        let lag = stats
            .oldest_pending_captured_at
            .and_then(|t| (now - t).to_std().ok())
            .map_or(0.0, |d| d.as_secs_f64());
        self.upload_lag.set(lag);
    }

    /// A driver ended an action on `capability_id` (of `capability_type`)
    /// with `error`; cancellations are not errors and are not counted.
    pub fn driver_error(&self, capability_id: &str, capability_type: &str, error: &DriverError) {
        let kind = match error {
            DriverError::Cancelled(_) | DriverError::CancelledPartway { .. } => return,
            DriverError::Unsupported { .. } => "unsupported",
            DriverError::InvalidParams { .. } => "invalid_params",
            DriverError::LimitExceeded { .. } => "limit_exceeded",
            DriverError::Unavailable(_) => "unavailable",
            DriverError::Device(_) => "device",
            DriverError::Timeout(_) => "timeout",
        };
        self.driver_errors
            .with_label_values(&[capability_id, capability_type, kind])
            .inc();
    }

    /// Take the link state and every capability's health (`types`:
    /// capability id → type) from memory, then encode everything.
    pub fn render(
        &self,
        link: &LinkState,
        runners: &Runners,
        types: &[(String, String)],
    ) -> String {
        {
            let _one = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
            self.mqtt_connected.set(i64::from(link.is_connected()));
            self.registered.set(i64::from(link.is_registered()));
            let connects = link.connect_count();
            let counted = self.mqtt_connects.get();
            if connects > counted {
                self.mqtt_connects.inc_by(connects - counted);
            }
            for report in runners.health_reports() {
                let kind = types
                    .iter()
                    .find(|(id, _)| *id == report.capability_id)
                    .map_or("", |(_, t)| t.as_str());
                for status in HEALTH_STATUSES {
                    self.health
                        .with_label_values(&[&report.capability_id, kind, status.as_str()])
                        .set(i64::from(report.health_status == status));
                }
            }
        }
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "cannot encode the metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

/// What the `/metrics` handler reads.
#[derive(Clone)]
pub struct Scrape {
    pub metrics: EdgeMetrics,
    pub link: Arc<LinkState>,
    pub runners: Arc<Runners>,
    /// Capability id → type, in configuration order.
    pub types: Arc<Vec<(String, String)>>,
}

/// Bind the metrics listener on `addr`.
///
/// Errors: the address is taken or not this machine's (the caller names
/// `[metrics] listen`).
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Serve `GET /metrics` on `listener` until `stop` turns true (other paths
/// answer 404).
pub async fn serve(
    listener: tokio::net::TcpListener,
    scrape: Scrape,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(metrics))
        .with_state(scrape);
    let stopped = async move {
        while !*stop.borrow() {
            if stop.changed().await.is_err() {
                break;
            }
        }
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stopped)
        .await
    {
        tracing::error!(error = %e, "the metrics listener stopped");
    }
}

async fn metrics(
    axum::extract::State(s): axum::extract::State<Scrape>,
) -> impl axum::response::IntoResponse {
    let text = s.metrics.render(&s.link, &s.runners, &s.types);
    ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], text)
}
