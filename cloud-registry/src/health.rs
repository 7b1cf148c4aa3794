//! Liveness and metrics, no authentication (for load balancers and
//! Prometheus), served at the root and under `/api/v1`:
//! - `GET /healthz`: `{"status": "ok"|"degraded", "store": {"status",
//!   "writable", "path", "full_errors_total", ...}, "mqtt": {"mode", "addr",
//!   "tls", "connected"}, "http": {"scheme"}}`; 200 when the store answers and is writable and the
//!   MQTT client is connected, else 503 (`store.writable` is false from a
//!   write refused for lack of space until space is found again, see
//!   [`crate::storage`]);
//! - `GET /metrics`: Prometheus text format 0.0.4 (leases by status, events
//!   total, providers online, MQTT messages in by topic kind, ...);
//! - `GET /time`: the registry's clock ([`RegistryTime`]), which benches
//!   sample to fence commands (docs/architecture.md "Fencing").
//!
//! The exposition text is written by hand: a handful of gauges and counters
//! does not justify a metrics registry crate.

use std::fmt::Write;
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
    /// `ok` (200) or `degraded` (503).
    #[schema(pattern = "^(ok|degraded)$")]
    status: String,
    /// `{"status": "ok"|"full"|"error", "error"?, "writable", "path",
    /// "full_errors_total", ...}`.
    store: Object,
    /// `{"mode": "embedded"|"external", "addr", "tls", "connected"}`.
    mqtt: Object,
    /// `{"scheme": "http"|"https"}`.
    http: Object,
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
    let body = json!({
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
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, v) in samples {
        let _ = writeln!(out, "{name}{labels} {v}");
    }
}

/// Prometheus text format 0.0.4 (no token needed).
#[utoipa::path(get, path = "/metrics", tag = "health", security(()),
    responses((status = 200, description = "Prometheus exposition text", content_type = "text/plain; version=0.0.4", body = String)))]
async fn metrics(State(st): State<HealthState>) -> Response {
    let mut out = String::new();
    let leases = st.leases.counts_by_status().await.unwrap_or_default();
    metric(
        &mut out,
        "benchlink_leases",
        "gauge",
        "Leases by status.",
        &leases
            .iter()
            .map(|(s, n)| (format!("{{status=\"{s}\"}}"), *n))
            .collect::<Vec<_>>(),
    );
    let answers = st.leases.answer_stats();
    metric(
        &mut out,
        "benchlink_lease_requests_answered_total",
        "counter",
        "Lease requests whose answer the requester took (for HTTP: hyper took the response body).",
        &[(String::new(), answers.answered)],
    );
    metric(
        &mut out,
        "benchlink_lease_requests_given_up_total",
        "counter",
        "Lease requests given up because the requester went away before it took the answer, by stage.",
        &answers
            .given_up
            .iter()
            .map(|(stage, n)| (format!("{{stage=\"{stage}\"}}"), *n))
            .collect::<Vec<_>>(),
    );
    metric(
        &mut out,
        "benchlink_leases_given_up_total",
        "counter",
        "Leases of those given-up requests (withdrawn or released).",
        &[(String::new(), answers.given_up_leases)],
    );
    let events = st.db.read(|c| crate::events::last_id(c)).await;
    if let Ok(Ok(n)) = events {
        metric(
            &mut out,
            "benchlink_events_total",
            "counter",
            "Events appended to the event log.",
            &[(String::new(), n)],
        );
    }
    if let Ok(c) = st.providers.store().counts().await {
        metric(
            &mut out,
            "benchlink_providers_online",
            "gauge",
            "Providers online.",
            &[(String::new(), c.providers_online)],
        );
        metric(
            &mut out,
            "benchlink_providers",
            "gauge",
            "Providers registered.",
            &[(String::new(), c.providers_total)],
        );
        metric(
            &mut out,
            "benchlink_capabilities",
            "gauge",
            "Capabilities registered.",
            &[(String::new(), c.capabilities_total)],
        );
        metric(
            &mut out,
            "benchlink_health_snapshots_total",
            "counter",
            "Rows in capability_health_snapshots.",
            &[(String::new(), c.health_snapshots_total)],
        );
    }
    let wal = st.db.wal_stats();
    let load = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    metric(
        &mut out,
        "benchlink_store_wal_bytes",
        "gauge",
        "Size of the store's WAL file at the last checkpoint, bytes.",
        &[(String::new(), load(&wal.wal_bytes))],
    );
    metric(
        &mut out,
        "benchlink_store_checkpoints_total",
        "counter",
        "WAL checkpoints by result (complete: every frame copied; incomplete: a reader's snapshot or a lock left frames behind).",
        &[
            ("{result=\"complete\"}".to_string(), load(&wal.checkpoints_complete)),
            ("{result=\"incomplete\"}".to_string(), load(&wal.checkpoints_incomplete)),
            ("{result=\"failed\"}".to_string(), load(&wal.checkpoints_failed)),
        ],
    );
    metric(
        &mut out,
        "benchlink_store_checkpoint_lag_frames",
        "gauge",
        "WAL frames the last checkpoint could not copy.",
        &[(String::new(), load(&wal.lag_frames))],
    );
    metric(
        &mut out,
        "benchlink_store_checkpoint_behind_ms",
        "gauge",
        "How long checkpoints have stayed behind, ms (0 while they keep up).",
        &[(String::new(), load(&wal.stalled_ms))],
    );
    let disk = crate::storage::snapshot();
    metric(
        &mut out,
        "benchlink_store_writable",
        "gauge",
        "0 from a write refused for lack of space until space is found again.",
        &[(String::new(), u64::from(disk.writable))],
    );
    metric(
        &mut out,
        "benchlink_store_full_errors_total",
        "counter",
        "Writes refused because the store's disk was full.",
        &[(String::new(), disk.full_errors_total)],
    );
    let s = &st.mqtt.stats;
    metric(
        &mut out,
        "benchlink_mqtt_messages_in_total",
        "counter",
        "MQTT messages received by the registry, by topic kind.",
        &s.messages_in()
            .iter()
            .map(|(k, n)| (format!("{{kind=\"{k}\"}}"), *n))
            .collect::<Vec<_>>(),
    );
    let one = |v: &std::sync::atomic::AtomicU64| vec![(String::new(), v.load(Ordering::Relaxed))];
    metric(
        &mut out,
        "benchlink_mqtt_messages_rejected_total",
        "counter",
        "MQTT messages refused (topic, envelope or provider mismatch).",
        &one(&s.rejected),
    );
    metric(
        &mut out,
        "benchlink_mqtt_duplicates_total",
        "counter",
        "MQTT messages dropped as repeated message ids.",
        &one(&s.duplicates),
    );
    metric(
        &mut out,
        "benchlink_mqtt_commands_out_total",
        "counter",
        "Commands published to providers.",
        &one(&s.commands_out),
    );
    metric(
        &mut out,
        "benchlink_mqtt_connected",
        "gauge",
        "1 while the registry's MQTT client is connected.",
        &[(String::new(), u64::from((st.mqtt.connected)()))],
    );
    if let Some(g) = &st.mqtt.gate {
        metric(
            &mut out,
            "benchlink_mqtt_gate_connections_total",
            "counter",
            "Connections accepted by the embedded broker's gate.",
            &one(&g.connections),
        );
        metric(
            &mut out,
            "benchlink_mqtt_gate_refused_total",
            "counter",
            "What the embedded broker's gate refused: logins, wills, publishes and subscription filters outside a provider's own topics.",
            &[
                ("login", &g.refused_logins),
                ("will", &g.refused_wills),
                ("publish", &g.refused_publishes),
                ("subscribe", &g.refused_subscriptions),
            ]
            .map(|(what, n)| (format!("{{what=\"{what}\"}}"), n.load(Ordering::Relaxed))),
        );
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}
