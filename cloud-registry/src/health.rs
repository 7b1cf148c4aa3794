//! Liveness and metrics, no authentication (for load balancers and
//! Prometheus), served at the root and under `/api/v1`:
//! - `GET /healthz`: `{"status": "ok"|"degraded", "store": {"status",
//!   "writable", "path", "full_errors_total", ...}, "mqtt": {"mode", "addr",
//!   "tls", "connected"}, "http": {"scheme"}}`; 200 when the store answers and is writable and the
//!   MQTT client is connected, else 503 (`store.writable` is false from a
//!   write refused for lack of space until space is found again, see
//!   [`crate::storage`]);
//! - `GET /metrics`: Prometheus text format 0.0.4 from [`crate::metrics`]
//!   (each metric in docs/install-registry.md "Metrics"): what the hot
//!   paths record (HTTP, lease and action latencies, event-stream
//!   subscribers, queue depth) and what is read here at scrape time
//!   (leases by status, events, providers, store, MQTT counters);
//! - `GET /time`: the registry's clock ([`RegistryTime`]), which benches
//!   sample to fence commands (docs/architecture.md "Fencing").

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use shared_protocol::api::RegistryTime;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use std::sync::Arc;

use crate::metrics::{Metrics, Sampled};
use crate::mqtt::MqttStats;

/// What `/healthz` reports about MQTT.
#[derive(Clone)]
pub struct MqttHealth {
    /// `embedded` or `external`.
    pub mode: &'static str,
    /// The broker's address.
    pub addr: String,
    /// True when MQTT is over TLS (the embedded broker's public address,
    /// or the connection to an external broker).
    pub tls: bool,
    /// True while the registry's client is connected.
    pub connected: Arc<dyn Fn() -> bool + Send + Sync>,
    pub stats: Arc<MqttStats>,
    /// The embedded broker's gate counters (`None` on an external broker).
    pub gate: Option<Arc<crate::broker::GateStats>>,
}

/// What the health and metrics handlers read.
#[derive(Clone)]
pub struct HealthState {
    /// `http` or `https`: how the API is served.
    pub http_scheme: &'static str,
    pub providers: Arc<crate::providers::Providers>,
    pub leases: Arc<crate::leases::LeaseEngine>,
    pub db: crate::db::Db,
    pub mqtt: MqttHealth,
    /// The figures recorded as the registry runs.
    pub metrics: Metrics,
    /// With `[cluster] enabled`: this replica's id and its epoch (it leads).
    pub cluster: Option<(String, i64)>,
}

/// `/healthz`, `/metrics` and `/time` (merged at the root and under
/// `/api/v1`).
pub fn routes(state: HealthState) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(metrics))
        .routes(routes!(time))
        .with_state(state)
}

/// The shape of `GET /healthz` (for the OpenAPI document).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct Health {
    /// `ok` (200) or `degraded` (503); a replica that stands by answers
    /// `standby` (200) with only `cluster` (docs/scale.md "Replicas").
    #[schema(pattern = "^(ok|degraded|standby)$")]
    status: String,
    /// `{"status": "ok"|"full"|"error", "error"?, "writable", "path",
    /// "full_errors_total", ...}`.
    store: Object,
    /// `{"mode": "embedded"|"external", "addr", "tls", "connected"}`.
    mqtt: Object,
    /// `{"scheme": "http"|"https"}`.
    http: Object,
    /// With `[cluster] enabled`: `{"role": "leader", "replica", "epoch"}`,
    /// or on a standby `{"role": "standby", "replica", "leader":
    /// {"replica", "url", "epoch"} | null}`.
    cluster: Option<Object>,
}

/// A JSON object (for the OpenAPI document).
type Object = serde_json::Map<String, serde_json::Value>;

/// The registry's wall clock, read as late as possible so that the
/// sampler's round trip brackets it tightly.
/// The registry's clock (no token needed).
#[utoipa::path(get, path = "/time", tag = "health", security(()),
    responses((status = 200, body = RegistryTime)))]
async fn time() -> Response {
    let now = chrono::Utc::now();
    let body = RegistryTime {
        now,
        unix_ms: now.timestamp_millis(),
    };
    ([(header::CACHE_CONTROL, "no-store")], Json(body)).into_response()
}

/// Liveness of the store and the MQTT link (no token needed).
#[utoipa::path(get, path = "/healthz", tag = "health", security(()),
    responses(
        (status = 200, description = "Store writable and MQTT connected", body = Health),
        (status = 503, description = "Degraded: the store does not answer or is full, or MQTT is not connected", body = Health),
    ))]
async fn healthz(State(st): State<HealthState>) -> Response {
    let store = st.providers.store().ping().await;
    let connected = (st.mqtt.connected)();
    let disk = crate::storage::snapshot();
    let ok = store.is_ok() && connected && disk.writable;
    let mut store_json = match &store {
        Ok(()) if disk.writable => json!({ "status": "ok" }),
        Ok(()) => json!({ "status": "full" }),
        Err(e) => json!({ "status": "error", "error": e.to_string() }),
    };
    if let (Some(o), Ok(serde_json::Value::Object(d))) =
        (store_json.as_object_mut(), serde_json::to_value(&disk))
    {
        o.extend(d);
    }
    let mut body = json!({
        "status": if ok { "ok" } else { "degraded" },
        "store": store_json,
        "mqtt": {
            "mode": st.mqtt.mode,
            "addr": st.mqtt.addr,
            "tls": st.mqtt.tls,
            "connected": connected,
        },
        "http": { "scheme": st.http_scheme },
    });
    if let Some((replica, epoch)) = &st.cluster {
        body["cluster"] = json!({ "role": "leader", "replica": replica, "epoch": epoch });
    }
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}

/// Prometheus text format 0.0.4 (no token needed).
#[utoipa::path(get, path = "/metrics", tag = "health", security(()),
    responses((status = 200, description = "Prometheus exposition text", content_type = "text/plain; version=0.0.4", body = String)))]
async fn metrics(State(st): State<HealthState>) -> Response {
    let mut s = Sampled::default();
    let leases = st.leases.counts_by_status().await.unwrap_or_default();
    let leases: Vec<(&str, u64)> = leases.iter().map(|(st, n)| (st.as_str(), *n)).collect();
    s.gauge_by("benchlink_leases", "Leases by status.", "status", &leases);
    let answers = st.leases.answer_stats();
    s.counter(
        "benchlink_lease_requests_answered_total",
        "Lease requests whose answer the requester took (for HTTP: hyper took the response body).",
        answers.answered,
    );
    let given_up: Vec<(&str, u64)> = answers
        .given_up
        .iter()
        .map(|(stage, n)| (stage.as_str(), *n))
        .collect();
    s.counter_by(
        "benchlink_lease_requests_given_up_total",
        "Lease requests given up because the requester went away before it took the answer, by stage.",
        "stage",
        &given_up,
    );
    s.counter(
        "benchlink_leases_given_up_total",
        "Leases of those given-up requests (withdrawn or released).",
        answers.given_up_leases,
    );
    if let Ok(Ok(n)) = st.db.read(|c| crate::events::last_id(c)).await {
        s.counter(
            "benchlink_events_total",
            "Events appended to the event log.",
            n,
        );
    }
    if let Ok(c) = st.providers.store().counts().await {
        s.gauge(
            "benchlink_providers_online",
            "Providers online.",
            c.providers_online,
        );
        s.gauge(
            "benchlink_providers",
            "Providers registered.",
            c.providers_total,
        );
        s.gauge(
            "benchlink_capabilities",
            "Capabilities registered.",
            c.capabilities_total,
        );
        s.counter(
            "benchlink_health_snapshots_total",
            "Rows in capability_health_snapshots.",
            c.health_snapshots_total,
        );
    }
    let wal = st.db.wal_stats();
    let load = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    s.gauge(
        "benchlink_store_wal_bytes",
        "Size of the store's WAL file at the last checkpoint, bytes.",
        load(&wal.wal_bytes),
    );
    s.counter_by(
        "benchlink_store_checkpoints_total",
        "WAL checkpoints by result (complete: every frame copied; incomplete: a reader's snapshot or a lock left frames behind).",
        "result",
        &[
            ("complete", load(&wal.checkpoints_complete)),
            ("incomplete", load(&wal.checkpoints_incomplete)),
            ("failed", load(&wal.checkpoints_failed)),
        ],
    );
    s.gauge(
        "benchlink_store_checkpoint_lag_frames",
        "WAL frames the last checkpoint could not copy.",
        load(&wal.lag_frames),
    );
    // Seconds, not ms: Prometheus names carry base units (`promtool check
    // metrics` refuses `_ms`).
    s.gauge_f64(
        "benchlink_store_checkpoint_behind_seconds",
        "How long checkpoints have stayed behind, seconds (0 while they keep up).",
        load(&wal.stalled_ms) as f64 / 1000.0,
    );
    let disk = crate::storage::snapshot();
    s.gauge(
        "benchlink_store_writable",
        "0 from a write refused for lack of space until space is found again.",
        u64::from(disk.writable),
    );
    s.counter(
        "benchlink_store_full_errors_total",
        "Writes refused because the store's disk was full.",
        disk.full_errors_total,
    );
    let m = &st.mqtt.stats;
    s.counter_by(
        "benchlink_mqtt_messages_in_total",
        "MQTT messages received by the registry, by topic kind.",
        "kind",
        &m.messages_in(),
    );
    s.counter_by(
        "benchlink_mqtt_messages_out_total",
        "MQTT messages the registry published, by topic kind (the registry publishes on providers' commands topics only).",
        "kind",
        &[("commands", load(&m.published))],
    );
    s.counter(
        "benchlink_mqtt_messages_rejected_total",
        "MQTT messages refused (topic, envelope or provider mismatch).",
        load(&m.rejected),
    );
    s.counter(
        "benchlink_mqtt_duplicates_total",
        "MQTT messages dropped as repeated message ids.",
        load(&m.duplicates),
    );
    s.counter(
        "benchlink_mqtt_commands_out_total",
        "Commands queued for providers (held while the broker connection is down).",
        load(&m.commands_out),
    );
    s.gauge(
        "benchlink_mqtt_connected",
        "1 while the registry's MQTT client is connected.",
        u64::from((st.mqtt.connected)()),
    );
    if let Some(g) = &st.mqtt.gate {
        s.counter(
            "benchlink_mqtt_gate_connections_total",
            "Connections accepted by the embedded broker's gate.",
            load(&g.connections),
        );
        s.counter_by(
            "benchlink_mqtt_gate_refused_total",
            "What the embedded broker's gate refused: logins, wills, publishes and subscription filters outside a provider's own topics, and connections beyond its client cap.",
            "what",
            &[
                ("login", load(&g.refused_logins)),
                ("will", load(&g.refused_wills)),
                ("publish", load(&g.refused_publishes)),
                ("subscribe", load(&g.refused_subscriptions)),
                ("capacity", load(&g.refused_capacity)),
            ],
        );
    }
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        st.metrics.render(s),
    )
        .into_response()
}
