//! Liveness and metrics, no authentication (for load balancers and
//! Prometheus), served at the root and under `/api/v1`:
//! - `GET /healthz`: `{"status": "ok"|"degraded", "store": {...},
//!   "mqtt": {"mode", "addr", "connected"}}`; 200 when the store answers and
//!   the MQTT client is connected, else 503;
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
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use shared_protocol::api::RegistryTime;

use super::ApiState;

pub(super) fn routes() -> axum::Router<ApiState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/time", get(time))
}

/// The registry's wall clock, read as late as possible so that the
/// sampler's round trip brackets it tightly.
async fn time() -> Response {
    let now = chrono::Utc::now();
    let body = RegistryTime {
        now,
        unix_ms: now.timestamp_millis(),
    };
    ([(header::CACHE_CONTROL, "no-store")], Json(body)).into_response()
}

async fn healthz(State(st): State<ApiState>) -> Response {
    let store = st.registry.store().ping().await;
    let connected = (st.mqtt.connected)();
    let ok = store.is_ok() && connected;
    let body = json!({
        "status": if ok { "ok" } else { "degraded" },
        "store": match &store {
            Ok(()) => json!({ "status": "ok" }),
            Err(e) => json!({ "status": "error", "error": e.to_string() }),
        },
        "mqtt": {
            "mode": st.mqtt.mode,
            "addr": st.mqtt.addr,
            "connected": connected,
        },
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

async fn metrics(State(st): State<ApiState>) -> Response {
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
    if let Ok(c) = st.registry.store().counts().await {
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
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}
