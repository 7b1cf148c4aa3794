//! The registry's HTTP API end to end: real HTTP on 127.0.0.1:0, SQLite in
//! a temporary directory, the embedded broker running. Covers provider and
//! capability registration, filters, error answers (and that they change
//! nothing), and the SSE event stream with resumption.

mod common;

use std::time::Duration;

use benchlink_testkit::status_is;
use benchlink_testkit::{find, strs};
use common::*;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};
use shared_protocol::api::Role;
use tempfile::TempDir;

#[tokio::test]
async fn a_provider_registers_over_http_and_is_listed_with_its_capabilities() {
    let (_dir, reg, api, _) = registry().await;
    let token = new_token(&reg, Role::Provider, "provider-winlab-01").await;

    let r = status_is(
        api.register_provider(&token, &provider_body("provider-winlab-01"))
            .await,
        StatusCode::OK,
    );
    assert_eq!(
        r.1,
        json!({"provider_id": "provider-winlab-01", "accepted": true, "heartbeat_interval_seconds": 10})
    );
    let r = status_is(
        api.register_capabilities(&token, &capabilities_body("provider-winlab-01", ""))
            .await,
        StatusCode::OK,
    );
    assert_eq!(r.1["registered"], json!(["cam-front-01", "thumb-robot-01"]));

    let (_, p) = status_is(
        api.get(
            "/api/v1/capability-providers/provider-winlab-01",
            Some(&token),
        )
        .await,
        StatusCode::OK,
    );
    assert_eq!(p["online_status"], "online");
    assert_eq!(p["labels"], json!(["lab", "gpu", "hardware-test"]));

    let (_, cam) = api
        .get("/api/v1/capabilities/cam-front-01", Some(&token))
        .await;
    assert_eq!(cam["status"], "available");
    assert_eq!(cam["health_status"], "unknown");
    assert_eq!(
        cam["node_id"], "win-gpu-02",
        "node defaults to the provider's"
    );
    assert_eq!(cam["metadata_json"]["max_fps"], 30);
    assert_eq!(cam["default_priority"], 50);

    // Filters.
    let (_, by_type) = api
        .get("/api/v1/capabilities?type=thumb_robot", Some(&token))
        .await;
    let ids = strs(&by_type["capabilities"], "capability_id");
    assert_eq!(ids, ["thumb-robot-01"]);
    let (_, by_tag) = api
        .get("/api/v1/capabilities?tag=front", Some(&token))
        .await;
    assert_eq!(by_tag["capabilities"].as_array().unwrap().len(), 1);
    let (_, by_status) = api
        .get("/api/v1/capabilities?status=offline", Some(&token))
        .await;
    assert_eq!(by_status["capabilities"], json!([]));
    let (_, by_provider) = api
        .get(
            "/api/v1/capabilities?provider_id=provider-winlab-01&status=available",
            Some(&token),
        )
        .await;
    assert_eq!(by_provider["capabilities"].as_array().unwrap().len(), 2);

    // The log holds one provider_registered and two capability_registered.
    let events = reg.bus.replay(0, 100).await.unwrap();
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, P1_REGISTERED);
    reg.shutdown().await;
}

#[tokio::test]
async fn heartbeats_record_health_changes_and_history() {
    let (_dir, reg, api, admin) = registry_with_p1(|_| {}).await;

    let hb = |health: &str| {
        json!({"provider_id": "p1", "boot_id": "boot-1", "capabilities": [
            {"capability_id": "cam-front-01", "health_status": health, "message": "lens", "metrics": {"fps": 29}}
        ]})
    };
    let r = status_is(api.heartbeat(&admin, &hb("healthy")).await, StatusCode::OK);
    assert_eq!(r.1["accepted"], true);
    api.heartbeat(&admin, &hb("healthy")).await;
    api.heartbeat(&admin, &hb("degraded")).await;

    let (_, cam) = api
        .get("/api/v1/capabilities/cam-front-01", Some(&admin))
        .await;
    assert_eq!(cam["health_status"], "degraded");
    let (_, p) = api
        .get("/api/v1/capability-providers/p1", Some(&admin))
        .await;
    assert!(p["last_heartbeat_at"].is_string());

    // unknown→healthy and healthy→degraded are events; the repeat is not.
    let changes: Vec<Value> = reg
        .bus
        .replay(0, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_type.as_str() == "capability_health_changed")
        .map(|e| e.data)
        .collect();
    assert_eq!(changes.len(), 2);
    assert_eq!(changes[1]["previous_health_status"], "healthy");
    assert_eq!(changes[1]["health_status"], "degraded");

    // Two snapshots (both changes); the repeat inside the minimum interval
    // wrote none. Newest first.
    let (_, h) = status_is(
        api.get(
            "/api/v1/capabilities/cam-front-01/health-history",
            Some(&admin),
        )
        .await,
        StatusCode::OK,
    );
    let snaps = h["snapshots"].as_array().unwrap();
    assert_eq!(snaps.len(), 2, "{h}");
    assert_eq!(snaps[0]["health_status"], "degraded");
    assert_eq!(snaps[0]["metrics"]["fps"], 29);
    assert_eq!(snaps[1]["health_status"], "healthy");
    reg.shutdown().await;
}

/// Everything a client can observe of the registry's state.
async fn observable_state(api: &Api, token: &str) -> (u64, Value, Value) {
    let events = api.metric("benchlink_events_total").await;
    let (_, providers) = api.get("/api/v1/capability-providers", Some(token)).await;
    let (_, caps) = api.get("/api/v1/capabilities", Some(token)).await;
    (events, providers, caps)
}

#[tokio::test]
async fn bad_requests_get_json_errors_and_change_nothing() {
    let (_dir, reg, api, admin) = registry_with(|cfg| cfg.http.body_limit_bytes = 4096).await;
    let p1 = new_token(&reg, Role::Provider, "p1").await;
    let viewer = new_token(&reg, Role::Viewer, "viewer-1").await;
    register_p1(&api, &p1).await;
    let before = observable_state(&api, &admin).await;
    assert!(before.0 >= 3);

    // Malformed JSON: 400.
    let r = api
        .post_raw(
            "/api/v1/capability-providers/register",
            Some(&p1),
            "{\"provider_id\": ".into(),
        )
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, "malformed_json");
    // A field of the wrong kind: 422 naming the field.
    let mut bad = capabilities_body("p1", "-x");
    bad["capabilities"][0]["capability_type"] = json!("toaster");
    let r = api.register_capabilities(&p1, &bad).await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert_eq!(
        r.1["error"]["details"]["field"],
        "capabilities[0].capability_type"
    );
    // Unknown ids: 404.
    let r = api
        .get("/api/v1/capabilities/no-such-cap", Some(&viewer))
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, "not_found");
    let r = api
        .get(
            "/api/v1/capability-providers/no-such-provider",
            Some(&viewer),
        )
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, "not_found");
    let r = api
        .get(
            "/api/v1/capabilities/no-such-cap/health-history",
            Some(&viewer),
        )
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, "not_found");
    let r = api
        .heartbeat(&admin, &json!({"provider_id": "ghost", "capabilities": []}))
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, "not_found");
    let r = api
        .register_capabilities(&admin, &capabilities_body("ghost", "-g"))
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, "not_found");
    // Wrong role: 403.
    let r = api
        .register_provider(&viewer, &provider_body("viewer-1"))
        .await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    // A provider acting for another provider: 403.
    let r = api.register_provider(&p1, &provider_body("p2")).await;
    assert_error(&r, StatusCode::FORBIDDEN, "provider_mismatch");
    let r = api
        .heartbeat(&p1, &json!({"provider_id": "p2", "capabilities": []}))
        .await;
    assert_error(&r, StatusCode::FORBIDDEN, "provider_mismatch");
    // A capability id that belongs to another provider: 409.
    api.register_provider(&admin, &provider_body("p2")).await;
    let after_p2 = observable_state(&api, &admin).await;
    let r = api
        .register_capabilities(&admin, &capabilities_body("p2", ""))
        .await;
    assert_error(
        &r,
        StatusCode::CONFLICT,
        "capability_owned_by_other_provider",
    );
    assert_eq!(
        observable_state(&api, &admin).await,
        after_p2,
        "the 409 wrote nothing"
    );
    // Oversized body: 413.
    let mut big = provider_body("p1");
    big["labels"] = json!(vec!["x".repeat(100); 100]);
    let r = api.register_provider(&p1, &big).await;
    assert_error(&r, StatusCode::PAYLOAD_TOO_LARGE, "body_too_large");
    let message = r.1["error"]["message"].as_str().unwrap();
    assert!(message.contains("4096 bytes"), "names the limit: {message}");
    // Missing or unknown token: 401.
    let r = api.get("/api/v1/capabilities", None).await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "unauthenticated");
    let r = api
        .register_provider("blk_nope", &provider_body("p1"))
        .await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "unauthenticated");
    // The scheme name in any letter case; another scheme is refused.
    for (header, status) in [
        (format!("bearer {viewer}"), StatusCode::OK),
        (format!("BEARER {viewer}"), StatusCode::OK),
        (format!("Basic {viewer}"), StatusCode::UNAUTHORIZED),
        (viewer.clone(), StatusCode::UNAUTHORIZED),
    ] {
        let got = api
            .http
            .get(format!("{}/api/v1/capabilities", api.base))
            .header("Authorization", header.as_str())
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(got, status, "{header}");
    }
    // A bad query parameter: 400 naming it, in words a person reads.
    let r = api
        .get("/api/v1/capabilities?type=toaster", Some(&viewer))
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, "invalid_query");
    assert_eq!(r.1["error"]["details"]["param"], "type", "{}", r.1);
    // A list of at most zero items is a mistake, not an empty answer.
    for path in [
        "/api/v1/capability-leases?limit=0",
        "/api/v1/sessions?limit=0",
    ] {
        let r = api.get(path, Some(&viewer)).await;
        assert_error(&r, StatusCode::BAD_REQUEST, "invalid_query");
        assert_eq!(r.1["error"]["details"]["param"], "limit", "{}", r.1);
        let message = r.1["error"]["message"].as_str().unwrap();
        assert!(message.contains("0 is out of range 1..="), "{message}");
    }
    let message = r.1["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("query parameter `type`: ") && message.contains("toaster"),
        "{message}"
    );
    for (path, param, message) in [
        (
            "/api/v1/capabilities/cam-front-01/health-history?limit=ten",
            "limit",
            "query parameter `limit`: expected a whole number, got `ten`",
        ),
        (
            "/api/v1/capability-leases?limit=-3",
            "limit",
            "query parameter `limit`: expected a whole number of 0 or more, got `-3`",
        ),
        (
            "/api/v1/capability-leases?active_only=yes",
            "active_only",
            "query parameter `active_only`: expected `true` or `false`, got `yes`",
        ),
        (
            "/api/v1/capability-leases?limit=1&limit=2",
            "limit",
            "query parameter `limit`: given more than once",
        ),
        (
            "/api/v1/capability-events/stream?after=99999999999999999999999",
            "after",
            "query parameter `after`: `99999999999999999999999` is too large",
        ),
        (
            "/api/v1/agents/runs?limit=many",
            "limit",
            "query parameter `limit`: expected a whole number, got `many`",
        ),
        (
            "/api/v1/capability-providers?online_status=sometimes",
            "online_status",
            "",
        ),
    ] {
        let r = api.get(path, Some(&admin)).await;
        assert_error(&r, StatusCode::BAD_REQUEST, "invalid_query");
        assert_eq!(r.1["error"]["details"]["param"], param, "{path}: {}", r.1);
        let got = r.1["error"]["message"].as_str().unwrap();
        if message.is_empty() {
            assert!(
                got.starts_with(&format!("query parameter `{param}`: ")),
                "{path}: {got}"
            );
        } else {
            assert_eq!(got, message, "{path}");
        }
    }
    // Unknown route: JSON 404.
    let r = api.get("/api/v1/nothing-here", Some(&viewer)).await;
    assert_error(&r, StatusCode::NOT_FOUND, "route_not_found");

    let after = observable_state(&api, &admin).await;
    let mut expected = before.clone();
    // The only accepted change: p2's registration (one event, one provider).
    expected.0 += 1;
    assert_eq!(after.0, expected.0, "event count");
    assert_eq!(after.2, before.2, "capabilities unchanged");
    let ids = strs(&after.1["providers"], "provider_id");
    assert_eq!(ids, ["p1", "p2"]);
    let p1_now = after.1["providers"][0].clone();
    assert_eq!(
        without_times(p1_now),
        without_times(before.1["providers"][0].clone())
    );
    reg.shutdown().await;
}

#[tokio::test]
async fn healthz_reports_store_and_broker_without_a_token_and_metrics_count() {
    let (_dir, reg, api, _) = registry().await;
    let (_, h) = status_is(api.get("/healthz", None).await, StatusCode::OK);
    assert_eq!(h["status"], "ok");
    assert_eq!(h["store"]["status"], "ok");
    assert_eq!(h["mqtt"]["mode"], "embedded");
    assert_eq!(h["mqtt"]["connected"], true);
    assert_eq!(h["mqtt"]["addr"], reg.mqtt_addr.to_string());
    let (s, _) = api.get("/api/v1/healthz", None).await;
    assert_eq!(s, StatusCode::OK);

    let admin = reg.admin_token.clone().unwrap();
    api.register_provider(&admin, &provider_body("p1")).await;
    assert_eq!(api.metric("benchlink_providers_online").await, 1);
    assert_eq!(api.metric("benchlink_events_total").await, 1);
    assert_eq!(api.metric("benchlink_mqtt_connected").await, 1);
    assert_eq!(api.metric("benchlink_leases{status=\"granted\"}").await, 0);
    reg.shutdown().await;
}

#[tokio::test]
async fn the_bootstrap_admin_token_file_is_private_and_reused_after_restart() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new().unwrap();
    let reg = start(test_config(&dir)).await;
    let token = reg.admin_token.clone().unwrap();
    let file = dir.path().join("admin.token");
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), token);
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // The token can mint tokens that work at once.
    let api = Api::new(&reg.base_url());
    let r = status_is(
        api.post(
            "/api/v1/auth/tokens",
            Some(&token),
            &json!({"role": "viewer", "name": "v1"}),
        )
        .await,
        StatusCode::CREATED,
    );
    let viewer = r.1["token"].as_str().unwrap().to_string();
    assert_eq!(
        api.get("/api/v1/capabilities", Some(&viewer)).await.0,
        StatusCode::OK
    );
    let r = api
        .post(
            "/api/v1/auth/tokens",
            Some(&viewer),
            &json!({"role": "admin", "name": "x"}),
        )
        .await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    reg.shutdown().await;

    let reg = start(test_config(&dir)).await;
    assert_eq!(reg.admin_token.as_deref(), Some(token.as_str()));
    reg.shutdown().await;
}

// ---------------------------------------------------------------- SSE ----

/// One parsed SSE event.
#[derive(Debug, Clone)]
struct SseEvent {
    id: Option<u64>,
    event: String,
    data: Value,
}

/// Reads SSE events from a streaming response.
struct SseReader {
    stream: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: String,
}

impl SseReader {
    async fn open(api: &Api, path: &str, token: &str, last_event_id: Option<u64>) -> Self {
        let mut req = api
            .http
            .get(format!("{}{path}", api.base))
            .bearer_auth(token);
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id.to_string());
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        Self {
            stream: resp.bytes_stream().boxed(),
            buf: String::new(),
        }
    }

    async fn next(&mut self, timeout: Duration) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (None, String::from("message"), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim().parse().ok();
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue; // keep-alive comment
                }
                return Some(SseEvent {
                    id,
                    event,
                    data: serde_json::from_str(&data).unwrap(),
                });
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let chunk = tokio::time::timeout(left, self.stream.next())
                .await
                .ok()??
                .ok()?;
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

async fn flip_health(api: &Api, token: &str, n: usize) {
    for i in 0..n {
        let health = if i % 2 == 0 { "degraded" } else { "healthy" };
        let r = api
            .heartbeat(
                token,
                &json!({"provider_id": "p1", "capabilities": [
                    {"capability_id": "cam-front-01", "health_status": health}
                ]}),
            )
            .await;
        assert_eq!(r.0, StatusCode::OK);
    }
}

#[tokio::test]
async fn sse_resume_with_last_event_id_loses_nothing_and_repeats_nothing() {
    let (_dir, reg, api, admin) = registry_with_p1(|_| {}).await;
    flip_health(&api, &admin, 4).await;

    // First connection: replay from the start, then live events.
    let mut sse = SseReader::open(
        &api,
        "/api/v1/capability-events/stream?after=0",
        &admin,
        None,
    )
    .await;
    let mut seen = Vec::new();
    for _ in 0..7 {
        let ev = sse
            .next(Duration::from_secs(5))
            .await
            .expect("replayed event");
        assert_eq!(ev.data["event_id"].as_u64(), ev.id, "id: matches the body");
        assert_eq!(ev.data["event_type"], ev.event.as_str());
        seen.push(ev.id.unwrap());
    }
    assert_eq!(seen, (1..=7).collect::<Vec<_>>());
    flip_health(&api, &admin, 2).await;
    for _ in 0..2 {
        seen.push(
            sse.next(Duration::from_secs(5))
                .await
                .expect("live event")
                .id
                .unwrap(),
        );
    }
    assert_eq!(seen, (1..=9).collect::<Vec<_>>());
    drop(sse);

    // Disconnected: more events happen.
    flip_health(&api, &admin, 5).await;

    // Reconnect with Last-Event-ID while events keep coming.
    let writer = {
        let api = api.clone();
        let admin = admin.clone();
        tokio::spawn(async move { flip_health(&api, &admin, 20).await })
    };
    let mut sse = SseReader::open(&api, "/api/v1/capability-events/stream", &admin, Some(9)).await;
    writer.await.unwrap();
    let total = reg.bus.replay(0, 10_000).await.unwrap().len() as u64;
    assert!(
        total > 9 + 5 + 10,
        "events were generated while away and during the resume"
    );
    let mut resumed = Vec::new();
    while (resumed.len() as u64) < total - 9 {
        let ev = sse
            .next(Duration::from_secs(5))
            .await
            .expect("resumed event");
        resumed.push(ev.id.unwrap());
    }
    assert_eq!(resumed, (10..=total).collect::<Vec<_>>());
    assert!(
        sse.next(Duration::from_millis(300)).await.is_none(),
        "nothing after the end"
    );
    reg.shutdown().await;
}

#[tokio::test]
async fn sse_tail_replays_the_last_events_then_goes_live() {
    let (_dir, reg, api, admin) = registry_with_p1(|_| {}).await;
    flip_health(&api, &admin, 4).await;
    let total = reg.bus.replay(0, 10_000).await.unwrap().len() as u64;
    assert!(total > 3, "{total} events to tail");
    let mut sse = SseReader::open(
        &api,
        "/api/v1/capability-events/stream?tail=3",
        &admin,
        None,
    )
    .await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(
            sse.next(Duration::from_secs(5))
                .await
                .expect("tail")
                .id
                .unwrap(),
        );
    }
    assert_eq!(seen, (total - 2..=total).collect::<Vec<_>>());
    assert!(sse.next(Duration::from_millis(300)).await.is_none());
    flip_health(&api, &admin, 1).await;
    let live = sse.next(Duration::from_secs(5)).await.expect("live").id;
    assert_eq!(live, Some(total + 1));
    drop(sse);
    let r = api
        .get("/api/v1/capability-events/stream?tail=1001", Some(&admin))
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, "invalid_query");
    reg.shutdown().await;
}

#[tokio::test]
async fn sse_filters_by_type_and_capability() {
    let (_dir, reg, api, admin) = registry_with_p1(|_| {}).await;
    let mut sse = SseReader::open(
        &api,
        "/api/v1/capability-events/stream?after=0&types=capability_registered&capability_id=thumb-robot-01",
        &admin,
        None,
    )
    .await;
    let ev = sse.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(ev.event, "capability_registered");
    assert_eq!(ev.data["capability_id"], "thumb-robot-01");
    assert!(sse.next(Duration::from_millis(300)).await.is_none());
    let r = api
        .get("/api/v1/capability-events/stream?types=bogus", Some(&admin))
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, "invalid_query");
    reg.shutdown().await;
}

#[tokio::test]
async fn a_slow_sse_client_is_told_of_the_gap_and_still_gets_every_event() {
    use cloud_registry::events::{NewEvent, LIVE_BUFFER};
    use shared_protocol::event::EventType;
    let (_dir, reg, api, admin) = registry().await;
    // Connect live, then stop reading while far more events than the live
    // buffer holds are published; each carries 2 KiB so socket buffers
    // cannot absorb the backlog either.
    let padding = "x".repeat(2048);
    let mut sse = SseReader::open(
        &api,
        "/api/v1/capability-events/stream?after=0",
        &admin,
        None,
    )
    .await;
    let n = (LIVE_BUFFER * 2 + 500) as u64;
    for i in 0..n {
        reg.bus
            .emit(
                NewEvent::new(
                    EventType::ArtifactUploaded,
                    "test",
                    json!({"i": i, "padding": padding}),
                )
                .artifact(format!("a{i}")),
            )
            .await
            .unwrap();
    }
    let mut ids = Vec::new();
    let mut gaps = 0;
    while (ids.len() as u64) < n {
        let ev = sse.next(Duration::from_secs(10)).await.expect("event");
        if ev.event == "stream_gap" {
            gaps += 1;
            assert!(ev.id.is_none());
            assert!(
                ev.data["from_event_id"].as_u64().unwrap()
                    <= ev.data["to_event_id"].as_u64().unwrap()
            );
            continue;
        }
        ids.push(ev.id.unwrap());
    }
    assert!(gaps >= 1, "the lag was reported");
    assert_eq!(
        ids,
        (1..=n).collect::<Vec<_>>(),
        "every event once, in order"
    );
    reg.shutdown().await;
}

// ------------------------------------------------------------- leases ----

fn lease_body(capability_id: &str, holder_ref: &str, priority: u8, seconds: u32) -> Value {
    json!({
        "capability_id": capability_id,
        "holder_type": "audit_agent",
        "holder_ref": holder_ref,
        "project_id": "proj_device_assistant",
        "purpose": "验证设备 LED 与屏幕切换是否符合交互脚本",
        "priority": priority,
        "requested_duration_seconds": seconds,
        "evidence_required": true,
        "preempt_if_needed": false
    })
}

/// `POST /api/v1/capability-leases/request` with `token` for
/// [`lease_body`]`(capability_id, holder_ref, priority, seconds)`.
async fn ask(
    api: &Api,
    token: &str,
    capability_id: &str,
    holder_ref: &str,
    priority: u8,
    seconds: u32,
) -> (StatusCode, Value) {
    api.request_lease(
        token,
        &lease_body(capability_id, holder_ref, priority, seconds),
    )
    .await
}

#[tokio::test]
async fn a_lease_is_requested_held_renewed_released_and_passed_to_the_next_in_queue() {
    let (_dir, reg, api, _) = registry_with_p1(|_| {}).await;
    let a = new_token(&reg, Role::AuditAgent, "audit:hw-01").await;
    let b = new_token(&reg, Role::Operator, "op-7").await;

    let r = status_is(
        api.request_lease(
            &a,
            &lease_body("cam-front-01", "audit:hw-01:thread-1", 75, 120),
        )
        .await,
        StatusCode::CREATED,
    );
    assert_eq!(r.1["status"], "granted");
    assert_eq!(r.1["principal"], "audit:hw-01");
    let lease_a = lease_id(&r);
    let (_, cam) = api.get("/api/v1/capabilities/cam-front-01", Some(&b)).await;
    assert_eq!(cam["status"], "leased");
    let (_, leased) = api
        .get("/api/v1/capabilities?status=leased", Some(&b))
        .await;
    assert_eq!(leased["capabilities"].as_array().unwrap().len(), 1);

    // B waits in the queue.
    let r = status_is(
        ask(&api, &b, "cam-front-01", "op-7", 60, 60).await,
        StatusCode::ACCEPTED,
    );
    assert_eq!(r.1["status"], "requested");
    let lease_b = lease_id(&r);

    let _ = status_is(
        api.lease_post(
            &a,
            &lease_a,
            "renew",
            &json!({"requested_duration_seconds": 300}),
        )
        .await,
        StatusCode::OK,
    );
    let r = api
        .post_raw(
            &format!("/api/v1/capability-leases/{lease_a}/renew"),
            Some(&a),
            String::new(),
        )
        .await;
    assert_eq!(
        r.0,
        StatusCode::OK,
        "an empty renew body is allowed: {}",
        r.1
    );

    let (_, list) = api
        .get(
            "/api/v1/capability-leases?capability_id=cam-front-01&active_only=true",
            Some(&b),
        )
        .await;
    let ids = strs(&list["leases"], "lease_id");
    assert_eq!(ids, [lease_a.as_str()]);

    let r = status_is(
        api.lease_post(&a, &lease_a, "release", &json!({"reason": "done"}))
            .await,
        StatusCode::OK,
    );
    assert_eq!(r.1["status"], "released");
    let (_, lb) = api.lease(&b, &lease_b).await;
    assert_eq!(
        lb["status"], "granted",
        "the capability went to the waiting request"
    );

    let types: Vec<String> = reg
        .bus
        .replay(0, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.lease_id.is_some())
        .map(|e| e.event_type.as_str().to_string())
        .collect();
    for t in [
        "lease_requested",
        "lease_granted",
        "lease_renewed",
        "lease_release_requested",
        "lease_released",
    ] {
        assert!(types.iter().any(|x| x == t), "{t} in {types:?}");
    }
    reg.shutdown().await;
}

#[tokio::test]
async fn lease_errors_are_json_with_the_right_status_and_change_nothing() {
    let (_dir, reg, api, admin) = registry_with_p1(|_| {}).await;
    let a = new_token(&reg, Role::AuditAgent, "audit:hw-01").await;
    let other = new_token(&reg, Role::AuditAgent, "audit:sw-01").await;
    let viewer = new_token(&reg, Role::Viewer, "viewer-1").await;
    let provider = new_token(&reg, Role::Provider, "p1").await;

    let r = ask(&api, &a, "cam-front-01", "audit:hw-01", 75, 120).await;
    let held = lease_id(&r);
    let r = ask(&api, &a, "thumb-robot-01", "audit:hw-01", 75, 1).await;
    let short = lease_id(&r);
    // Let the one-second lease expire (the sweeper runs every 250 ms).
    eventually(Duration::from_secs(5), "lease expired", || async {
        let (_, l) = api.lease(&a, &short).await;
        (l["status"] == "expired").then_some(())
    })
    .await;

    let state = || async {
        let events = api.metric("benchlink_events_total").await;
        let (_, leases) = api.get("/api/v1/capability-leases", Some(&admin)).await;
        (events, leases)
    };
    let before = state().await;

    let r = ask(&api, &provider, "thumb-robot-01", "p1", 50, 60).await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    let r = ask(&api, &viewer, "thumb-robot-01", "viewer-1", 50, 60).await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    let r = api.get("/api/v1/capability-leases", Some(&provider)).await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    assert_eq!(
        api.get("/api/v1/capability-leases", Some(&viewer)).await.0,
        StatusCode::OK
    );
    let r = ask(&api, &other, "thumb-robot-01", "audit:hw-01", 50, 60).await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert_eq!(r.1["error"]["details"]["field"], "holder_ref");
    let r = ask(&api, &a, "no-such-cap", "audit:hw-01", 50, 60).await;
    assert_error(&r, StatusCode::NOT_FOUND, "not_found");
    let r = api
        .post_raw(
            "/api/v1/capability-leases/request",
            Some(&a),
            "{\"capability_id\" \"cam-front-01\"}".into(),
        )
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, "malformed_json");
    let r = api
        .get("/api/v1/capability-leases/lease-nope", Some(&a))
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, "not_found");
    let r = api
        .post(
            "/api/v1/capability-leases/lease-nope/renew",
            Some(&a),
            &json!({}),
        )
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, "not_found");
    // Another holder's lease.
    let r = api.lease_post(&other, &held, "release", &json!({})).await;
    assert_error(&r, StatusCode::FORBIDDEN, "not_lease_holder");
    let r = api.lease_post(&other, &held, "renew", &json!({})).await;
    assert_error(&r, StatusCode::FORBIDDEN, "not_lease_holder");
    // Renewing an expired lease: 409 with its status.
    let r = api.lease_post(&a, &short, "renew", &json!({})).await;
    assert_error(&r, StatusCode::CONFLICT, "lease_expired");
    assert_eq!(r.1["error"]["details"]["lease_status"], "expired");
    // A wait above the 300 s maximum is refused before anything is
    // requested, naming the parameter and the range.
    for (path, wait, message) in [
        (
            "request",
            "301",
            "query parameter `wait_seconds`: 301 is out of range 0..=300",
        ),
        (
            "request-group",
            "301",
            "query parameter `wait_seconds`: 301 is out of range 0..=300",
        ),
        (
            "request",
            "-5",
            "query parameter `wait_seconds`: -5 is out of range 0..=300",
        ),
        (
            "request",
            "184467440737095516160",
            "query parameter `wait_seconds`: 184467440737095516160 is out of range 0..=300",
        ),
        (
            "request",
            "soon",
            "query parameter `wait_seconds`: expected a whole number from 0 to 300, got `soon`",
        ),
    ] {
        let mut body = lease_body("thumb-robot-01", "audit:hw-01", 50, 60);
        if path == "request-group" {
            body.as_object_mut().unwrap().remove("capability_id");
            body["capability_ids"] = json!(["thumb-robot-01"]);
        }
        let r = api
            .post(
                &format!("/api/v1/capability-leases/{path}?wait_seconds={wait}"),
                Some(&a),
                &body,
            )
            .await;
        assert_error(&r, StatusCode::BAD_REQUEST, "invalid_query");
        assert_eq!(r.1["error"]["message"], message, "{}", r.1);
        assert_eq!(r.1["error"]["details"]["param"], "wait_seconds");
    }
    // No token.
    let r = api
        .post(
            "/api/v1/capability-leases/request",
            None,
            &lease_body("cam-front-01", "x", 50, 60),
        )
        .await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "unauthenticated");

    assert_eq!(
        state().await,
        before,
        "no error changed a lease or appended an event"
    );
    reg.shutdown().await;
}

/// Every number of a lease request, group or renewal that is out of range
/// is refused with 422 `invalid_field` naming the field and the range the
/// registry enforces: the configured `leases.max_duration_seconds` for
/// durations (not the protocol's 86400), 0..=100 for a priority (not a
/// byte's 0..=255), whatever the value's size or sign.
#[tokio::test]
async fn out_of_range_lease_numbers_name_the_range_in_force() {
    let (_dir, reg, api, _) = registry_with_p1(|cfg| cfg.leases.max_duration_seconds = 600).await;
    let a = new_token(&reg, Role::AuditAgent, "audit:hw-01").await;
    let r = status_is(
        ask(&api, &a, "cam-front-01", "audit:hw-01", 50, 60).await,
        StatusCode::CREATED,
    );
    let held = lease_id(&r);
    let before = api.metric("benchlink_events_total").await;

    let duration = |v: &str| {
        format!("requested_duration_seconds: {v} is out of range 1..=600 (the registry's longest lease)")
    };
    let single = |field: &str, value: Value| {
        let mut b = lease_body("thumb-robot-01", "audit:hw-01", 50, 60);
        b[field] = value;
        b
    };
    let group = |duration: Value, min: Value| {
        let mut b = lease_body("x", "audit:hw-01", 50, 60);
        b.as_object_mut().unwrap().remove("capability_id");
        b["requested_duration_seconds"] = duration;
        b["requirements"] = json!([
            {"capability_type": "camera", "mode": "exclusive"},
            {"capability_type": "thumb_robot", "mode": "exclusive", "min_duration_seconds": min}
        ]);
        b
    };
    let renew = format!("/api/v1/capability-leases/{held}/renew");
    let cases: Vec<(&str, Value, &str, String)> = vec![
        ("request", single("priority", json!(101)), "priority", "priority: 101 is out of range 0..=100".into()),
        ("request", single("priority", json!(300)), "priority", "priority: 300 is out of range 0..=100".into()),
        ("request", single("priority", json!(-1)), "priority", "priority: -1 is out of range 0..=100".into()),
        (
            "request",
            single("priority", json!("high")),
            "priority",
            "priority: expected a whole number from 0 to 100, got \"high\"".into(),
        ),
        (
            "request",
            single("priority", json!(1.5)),
            "priority",
            "priority: expected a whole number from 0 to 100, got 1.5".into(),
        ),
        ("request", single("requested_duration_seconds", json!(0)), "requested_duration_seconds", duration("0")),
        ("request", single("requested_duration_seconds", json!(601)), "requested_duration_seconds", duration("601")),
        ("request", single("requested_duration_seconds", json!(90000)), "requested_duration_seconds", duration("90000")),
        ("request", single("requested_duration_seconds", json!(-5)), "requested_duration_seconds", duration("-5")),
        (
            "request",
            single("requested_duration_seconds", json!(5_000_000_000u64)),
            "requested_duration_seconds",
            duration("5000000000"),
        ),
        (
            "request",
            single("queue_timeout_seconds", json!(-1)),
            "queue_timeout_seconds",
            "queue_timeout_seconds: -1 is out of range 0..=4294967295".into(),
        ),
        ("request-group", group(json!(601), json!(30)), "requested_duration_seconds", duration("601")),
        (
            "request-group",
            group(json!(60), json!(120)),
            "requirements[1].min_duration_seconds",
            "requirements[1].min_duration_seconds: 120 is out of range 1..=60 (at most the requested_duration_seconds)".into(),
        ),
        (
            "request-group",
            group(json!(60), json!(0)),
            "requirements[1].min_duration_seconds",
            "requirements[1].min_duration_seconds: 0 is out of range 1..=60 (at most the requested_duration_seconds)".into(),
        ),
        ("renew", json!({"requested_duration_seconds": 601}), "requested_duration_seconds", duration("601")),
        ("renew", json!({"requested_duration_seconds": 0}), "requested_duration_seconds", duration("0")),
    ];
    for (what, body, field, message) in cases {
        let path = if what == "renew" {
            renew.clone()
        } else {
            format!("/api/v1/capability-leases/{what}")
        };
        let r = api.post(&path, Some(&a), &body).await;
        assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
        assert_eq!(r.1["error"]["details"]["field"], field, "{what}: {}", r.1);
        assert_eq!(r.1["error"]["message"], message.as_str(), "{what}: {body}");
    }
    assert_eq!(
        api.metric("benchlink_events_total").await,
        before,
        "no refusal appended an event"
    );
    // In range, the same bodies are accepted.
    let _ = status_is(
        api.post(
            &renew,
            Some(&a),
            &json!({"requested_duration_seconds": 600}),
        )
        .await,
        StatusCode::OK,
    );
    let _ = status_is(
        api.request_lease(&a, &single("priority", json!(100))).await,
        StatusCode::CREATED,
    );
    reg.shutdown().await;
}

/// `Idempotency-Key` over HTTP: a malformed key is 400 `invalid_header`
/// and requests nothing; a group retried with its key gets the same
/// group (`Idempotent-Replayed: true`); a single request with that key
/// is another request and is refused.
#[tokio::test]
async fn an_idempotency_key_replays_a_group_and_a_bad_key_requests_nothing() {
    let (_dir, reg, api, _) = registry_with_p1(|_| {}).await;
    let op = new_token(&reg, Role::Operator, "op-9").await;
    let post = |path: &str, key: &str, body: &Value| {
        api.http
            .post(format!("{}{path}", api.base))
            .bearer_auth(&op)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
    };
    let single = lease_body("cam-front-01", "op-9", 50, 60);
    for bad in ["", "has space", &"k".repeat(256)] {
        let r = post("/api/v1/capability-leases/request", bad, &single)
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_header", "{v}");
        assert_eq!(v["error"]["details"]["header"], "Idempotency-Key");
    }
    let (_, list) = api
        .get("/api/v1/capability-leases?principal=op-9", Some(&op))
        .await;
    assert_eq!(list["leases"].as_array().unwrap().len(), 0, "{list}");

    let mut group = lease_body("x", "op-9", 50, 60);
    group.as_object_mut().unwrap().remove("capability_id");
    group["capability_ids"] = json!(["cam-front-01", "thumb-robot-01"]);
    let path = "/api/v1/capability-leases/request-group";
    let first = post(path, "grp-1", &group).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    let again = post(path, "grp-1", &group).await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["lease_group_id"], first["lease_group_id"]);
    assert_eq!(again["leases"], first["leases"]);
    let other = post("/api/v1/capability-leases/request", "grp-1", &single)
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let other: Value = other.json().await.unwrap();
    assert_eq!(other["error"]["code"], "idempotency_key_reused", "{other}");
    let (_, list) = api
        .get("/api/v1/capability-leases?principal=op-9", Some(&op))
        .await;
    assert_eq!(list["leases"].as_array().unwrap().len(), 2, "{list}");
    reg.shutdown().await;
}

/// A client that disconnects while its request waits for a grant
/// (`?wait_seconds=N`) never learns its lease id; the registry gives the
/// request up (`released`, reason `client_disconnected`) instead of later
/// granting a capability to nobody, and the next requester gets the
/// capability when the holder releases it.
#[tokio::test]
async fn a_waiting_request_whose_client_disconnects_leaves_the_queue() {
    let (_dir, reg, api, _) = registry_with_p1(|_| {}).await;
    let holder = new_token(&reg, Role::AuditAgent, "audit:hw-01").await;
    let gone = new_token(&reg, Role::Operator, "op-7").await;
    let next = new_token(&reg, Role::Operator, "op-8").await;

    let r = status_is(
        ask(&api, &holder, "cam-front-01", "audit:hw-01", 50, 600).await,
        StatusCode::CREATED,
    );
    let held = lease_id(&r);

    // op-7 waits up to 30 s for the camera, but gives up after 1 s: the
    // client-side timeout closes the connection.
    for path in [
        "/api/v1/capability-leases/request?wait_seconds=30",
        "/api/v1/capability-leases/request-group?wait_seconds=30",
    ] {
        let body = if path.contains("group") {
            let mut b = lease_body("x", "op-7", 60, 60);
            b.as_object_mut().unwrap().remove("capability_id");
            b["capability_ids"] = json!(["cam-front-01", "thumb-robot-01"]);
            b
        } else {
            lease_body("cam-front-01", "op-7", 60, 60)
        };
        let impatient = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let sent = impatient
            .post(format!("{}{path}", api.base))
            .bearer_auth(&gone)
            .json(&body)
            .send()
            .await;
        assert!(sent.is_err(), "{path}: the client gave up before an answer");
    }
    let released = eventually(
        Duration::from_secs(10),
        "op-7's requests given up",
        || async {
            let (_, list) = api
                .get("/api/v1/capability-leases?principal=op-7", Some(&gone))
                .await;
            let leases = list["leases"].as_array()?.clone();
            (leases.len() == 3 && leases.iter().all(|l| l["status"] == "released"))
                .then_some(leases)
        },
    )
    .await;
    let events = reg.bus.replay(0, 1000).await.unwrap();
    for lease in &released {
        let id = lease["lease_id"].as_str().unwrap();
        let ev = events
            .iter()
            .find(|e| {
                e.lease_id.as_deref() == Some(id) && e.event_type.as_str() == "lease_released"
            })
            .unwrap_or_else(|| panic!("lease_released for {id}"));
        assert_eq!(ev.data["reason"], "client_disconnected", "{:?}", ev.data);
    }
    let (_, cam) = api
        .get(
            "/api/v1/capability-leases?capability_id=cam-front-01&active_only=true",
            Some(&gone),
        )
        .await;
    assert_eq!(cam["leases"].as_array().unwrap().len(), 1, "{cam}");
    assert_eq!(cam["leases"][0]["lease_id"], held.as_str());

    // The next requester queues and gets the camera on release.
    let r = status_is(
        ask(&api, &next, "cam-front-01", "op-8", 40, 60).await,
        StatusCode::ACCEPTED,
    );
    let waiting = lease_id(&r);
    let _ = status_is(
        api.lease_post(&holder, &held, "release", &json!({})).await,
        StatusCode::OK,
    );
    let (_, l) = api.lease(&next, &waiting).await;
    assert_eq!(l["status"], "granted", "{l}");
    reg.shutdown().await;
}

#[tokio::test]
async fn a_group_request_grants_all_capabilities_together() {
    let (_dir, reg, api, _) = registry_with_p1(|_| {}).await;
    let a = new_token(&reg, Role::AuditAgent, "audit:mm-01").await;
    let mut body = lease_body("x", "audit:mm-01", 70, 60);
    body.as_object_mut().unwrap().remove("capability_id");
    body["capability_ids"] = json!(["cam-front-01", "thumb-robot-01"]);
    let r = status_is(
        api.post("/api/v1/capability-leases/request-group", Some(&a), &body)
            .await,
        StatusCode::CREATED,
    );
    assert_eq!(r.1["status"], "granted");
    let leases = r.1["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 2);
    assert!(leases
        .iter()
        .all(|l| l["lease_group_id"] == r.1["lease_group_id"]));
    reg.shutdown().await;
}

// ------------------------------------------------ the real binary ----

struct Served {
    child: std::process::Child,
    http: String,
    /// The embedded broker's `host:port`.
    mqtt: String,
}

impl Served {
    /// SIGTERM, then wait up to 10 s for the process to exit by itself.
    fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let ok = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -TERM");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Write a `cloud-registry serve` configuration into `dir` (HTTP and the
/// embedded broker on free ports, the store in `dir`); returns its path.
fn serve_config(dir: &std::path::Path) -> std::path::PathBuf {
    let config = dir.join("registry.toml");
    std::fs::write(
        &config,
        format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n[mqtt]\nlisten = \"127.0.0.1:0\"\n[store]\npath = \"{}\"\n",
            dir.join("registry.sqlite3").display()
        ),
    )
    .unwrap();
    config
}

/// Start `cloud-registry serve` and wait for its ready line.
fn serve(config: &std::path::Path, token_file: &std::path::Path) -> Served {
    serve_logging_to(config, token_file, std::process::Stdio::inherit())
}

/// [`serve`] with the registry's log (stderr) going to `log`.
fn serve_logging_to(
    config: &std::path::Path,
    token_file: &std::path::Path,
    log: std::process::Stdio,
) -> Served {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cloud-registry"))
        .arg("serve")
        .arg("--config")
        .arg(config)
        .arg("--bootstrap-admin-token-file")
        .arg(token_file)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn cloud-registry");
    let rx = benchlink_testkit::stdout_lines(&mut child);
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("ready line within 30 s");
    let ready: Value = serde_json::from_str(&line).expect("ready line is JSON");
    assert_eq!(ready["event"], "ready");
    assert!(ready["mqtt"].as_str().unwrap().starts_with("127.0.0.1:"));
    Served {
        child,
        http: format!("http://{}", ready["http"].as_str().unwrap()),
        mqtt: ready["mqtt"].as_str().unwrap().to_string(),
    }
}

#[tokio::test]
async fn the_binary_keeps_a_lease_with_its_remaining_time_across_sigkill() {
    let dir = TempDir::new().unwrap();
    let config = serve_config(dir.path());
    let token_file = dir.path().join("admin.token");
    let first = serve(&config, &token_file);
    let admin = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_string();
    let api = Api::new(&first.http);
    register_p1(&api, &admin).await;
    let r = api
        .post(
            "/api/v1/auth/tokens",
            Some(&admin),
            &json!({"role": "audit_agent", "name": "audit:hw-01"}),
        )
        .await;
    let audit = r.1["token"].as_str().unwrap().to_string();
    let r = status_is(
        ask(&api, &audit, "cam-front-01", "audit:hw-01", 75, 600).await,
        StatusCode::CREATED,
    );
    let lease_id = lease_id(&r);
    let r = status_is(
        api.lease_post(
            &audit,
            &lease_id,
            "renew",
            &json!({"requested_duration_seconds": 900}),
        )
        .await,
        StatusCode::OK,
    );
    let before = r.1.clone();
    drop(first); // SIGKILL, no shutdown.

    let second = serve(&config, &token_file);
    assert_eq!(
        std::fs::read_to_string(&token_file).unwrap().trim(),
        admin,
        "the admin token is reused"
    );
    let api = Api::new(&second.http);
    let (_, after) = status_is(api.lease(&audit, &lease_id).await, StatusCode::OK);
    assert_eq!(after["status"], "granted");
    let expires: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(after["expires_at"].clone()).unwrap();
    let expires_before: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(before["expires_at"].clone()).unwrap();
    assert!(
        (expires - expires_before).num_milliseconds().abs() <= 1,
        "the deadline survives the kill: {expires} vs {expires_before}"
    );
    let remaining = (expires - chrono::Utc::now()).num_seconds();
    assert!(
        (850..=900).contains(&remaining),
        "remaining {remaining} s of 900"
    );
    // The embedded broker restarted with the registry: p1 is offline
    // until it is heard again, here by a heartbeat over HTTP.
    let (_, cam) = api
        .get("/api/v1/capabilities/cam-front-01", Some(&audit))
        .await;
    assert_eq!(cam["status"], "offline");
    let _ = status_is(
        api.heartbeat(&admin, &json!({"provider_id": "p1", "boot_id": "boot-1"}))
            .await,
        StatusCode::OK,
    );
    let (_, cam) = api
        .get("/api/v1/capabilities/cam-front-01", Some(&audit))
        .await;
    assert_eq!(cam["status"], "leased");
    // The holder can still use it after the restart.
    let r = status_is(
        api.lease_post(&audit, &lease_id, "release", &json!({}))
            .await,
        StatusCode::OK,
    );
    assert_eq!(r.1["status"], "released");

    // SIGTERM: a clean stop with exit status 0.
    let mut second = second;
    let status = second.terminate().expect("exits within 10 s of SIGTERM");
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn a_clean_stop_with_the_embedded_broker_logs_no_error() {
    let dir = TempDir::new().unwrap();
    let config = serve_config(dir.path());
    let log_path = dir.path().join("registry.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let token_file = dir.path().join("admin.token");
    let mut served = serve_logging_to(&config, &token_file, log.into());
    // The HTTP side answers: the registry and its broker are up.
    let (status, _) = Api::new(&served.http).get("/healthz", None).await;
    assert_eq!(status, StatusCode::OK);
    // A client comes and goes cleanly (an edge-agent stopped with
    // `systemctl stop`): nothing to report as an error either.
    let admin = std::fs::read_to_string(&token_file).unwrap();
    let (host, port) = served.mqtt.rsplit_once(':').unwrap();
    let p = TestProvider::connect(
        host,
        port.parse().unwrap(),
        "benchlink/v1",
        "bootstrap-admin",
        "bootstrap-admin",
        Some(("bootstrap-admin", admin.trim())),
    )
    .await;
    p.client.disconnect().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = served.terminate().expect("exits within 10 s of SIGTERM");
    assert!(status.success(), "{status:?}");
    let log = std::fs::read_to_string(&log_path).unwrap();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.is_empty(), "a clean stop logged errors: {errors:#?}");
}

#[tokio::test]
async fn a_non_interruptible_window_from_heartbeats_holds_off_preemption_until_it_closes() {
    let (_dir, reg, api, admin) = registry_with_p1(|_| {}).await;
    let mut rear = capabilities_body("p1", "");
    rear["capabilities"] = json!([rear["capabilities"][0].clone()]);
    rear["capabilities"][0]["capability_id"] = json!("cam-rear-01");
    api.register_capabilities(&admin, &rear).await;
    api.register_provider(&admin, &provider_body("p2")).await;
    let a = new_token(&reg, Role::AuditAgent, "audit:sw-01").await;
    let op = new_token(&reg, Role::Operator, "op-1").await;
    let mut held = Vec::new();
    for cap in ["cam-front-01", "cam-rear-01"] {
        let r = status_is(
            ask(&api, &a, cap, "audit:sw-01", 65, 300).await,
            StatusCode::CREATED,
        );
        held.push(lease_id(&r));
    }
    let window = |provider: &str, capability: Option<&str>| {
        let sessions = match capability {
            Some(c) => json!([{
                "session_id": "s-1", "lease_id": "l", "capability_id": c,
                "action": "record_clip", "started_at": "2026-11-30T03:29:22Z",
                "non_interruptible": true
            }]),
            None => json!([]),
        };
        json!({"provider_id": provider, "running_sessions": sessions})
    };
    // p1 opens a window on its front camera; p2 claims one on p1's rear
    // camera, which is not p2's to claim.
    let _ = status_is(
        api.heartbeat(&admin, &window("p1", Some("cam-front-01")))
            .await,
        StatusCode::OK,
    );
    let _ = status_is(
        api.heartbeat(&admin, &window("p2", Some("cam-rear-01")))
            .await,
        StatusCode::OK,
    );

    let preempting = |cap: &str| {
        let mut body = lease_body(cap, "op-1", 90, 60);
        body["preempt_if_needed"] = json!(true);
        body["preempt_reason"] = json!("human_operator_override");
        body
    };
    for cap in ["cam-front-01", "cam-rear-01"] {
        let _ = status_is(
            api.request_lease(&op, &preempting(cap)).await,
            StatusCode::ACCEPTED,
        );
    }
    let status = |id: String| {
        let api = api.clone();
        let a = a.clone();
        async move {
            let (_, l) = api.lease(&a, &id).await;
            l["status"].as_str().unwrap_or_default().to_string()
        }
    };
    let being_preempted = |s: &str| matches!(s, "preempt_requested" | "grace_period");
    eventually(
        Duration::from_secs(5),
        "rear camera preempted (p2's claim ignored)",
        || async { being_preempted(&status(held[1].clone()).await).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        status(held[0].clone()).await,
        "granted",
        "no preemption inside the window"
    );

    // The window closes: preemption starts.
    api.heartbeat(&admin, &window("p1", None)).await;
    eventually(
        Duration::from_secs(5),
        "front camera preempted after the window",
        || async { being_preempted(&status(held[0].clone()).await).then_some(()) },
    )
    .await;
    reg.shutdown().await;
}

#[tokio::test]
async fn a_second_registry_on_the_same_store_refuses_to_start() {
    let dir = TempDir::new().unwrap();
    let first = start(test_config(&dir)).await;
    let second = cloud_registry::app::Registry::start(test_config(&dir)).await;
    match second {
        Err(cloud_registry::app::AppError::StoreInUse(store)) => {
            assert_eq!(store, test_config(&dir).store.describe())
        }
        Err(other) => panic!("expected StoreInUse, got {other}"),
        Ok(_) => panic!("a second registry started on a store in use"),
    }
    // Once the first is stopped, the store can be opened again.
    first.shutdown().await;
    let again = start(test_config(&dir)).await;
    again.shutdown().await;
}

#[tokio::test]
async fn a_provider_token_cannot_read_the_event_stream() {
    let (_dir, reg, _, admin) = registry().await;
    let provider = new_token(&reg, Role::Provider, "provider-a").await;
    let http = reqwest::Client::new();
    let url = format!("{}/api/v1/capability-events/stream", reg.base_url());
    let refused = http.get(&url).bearer_auth(&provider).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "forbidden");
    let allowed = http.get(&url).bearer_auth(&admin).send().await.unwrap();
    assert_eq!(allowed.status(), StatusCode::OK);
    drop(allowed);
    reg.shutdown().await;
}

async fn delete(api: &Api, path: &str, token: &str) -> (StatusCode, Value) {
    let resp = api
        .http
        .delete(format!("{}{path}", api.base))
        .bearer_auth(token)
        .send()
        .await
        .expect("DELETE sent");
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test]
async fn an_admin_lists_and_revokes_tokens_and_a_revoked_token_is_refused_at_once() {
    let (_dir, reg, api, root) = registry().await;
    let admin = new_token(&reg, Role::Admin, "admin-1").await;
    let viewer = new_token(&reg, Role::Viewer, "viewer-1").await;

    // Minted over HTTP, used (and so cached) before it is revoked.
    let r = status_is(
        api.post(
            "/api/v1/auth/tokens",
            Some(&admin),
            &json!({"role": "operator", "name": "op-1"}),
        )
        .await,
        StatusCode::CREATED,
    );
    let op = r.1["token"].as_str().unwrap().to_string();
    let _ = status_is(
        api.get("/api/v1/capabilities", Some(&op)).await,
        StatusCode::OK,
    );

    let (_, list) = status_is(
        api.get("/api/v1/tokens", Some(&admin)).await,
        StatusCode::OK,
    );
    let names = strs(&list["tokens"], "name");
    for name in ["bootstrap-admin", "admin-1", "viewer-1", "op-1"] {
        assert!(names.contains(&name), "{name} in {list}");
    }
    let entry = find(&list["tokens"], "name", "op-1");
    assert_eq!(entry["role"], "operator");
    assert_eq!(entry["revoked"], false);
    assert!(entry["created_at"].is_string(), "{entry}");
    let text = list.to_string();
    for secret in [&root, &admin, &viewer, &op] {
        assert!(!text.contains(secret.as_str()), "a secret in the list");
    }
    assert!(!text.contains("token_hash"), "{text}");

    // Not for everyone.
    let r = api.get("/api/v1/tokens", Some(&viewer)).await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    let r = delete(&api, "/api/v1/tokens/op-1", &viewer).await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    let r = delete(&api, "/api/v1/tokens/bootstrap-admin", &admin).await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    assert_eq!(
        r.1["error"]["message"],
        "only a super_admin may revoke the tokens of `bootstrap-admin`, which is a `super_admin`"
    );
    assert_eq!(
        r.1["error"]["details"]["allowed_roles"],
        json!(["super_admin"])
    );
    assert_eq!(r.1["error"]["details"]["role"], "admin");
    new_token(&reg, Role::Admin, "admin-2").await;
    let r = delete(&api, "/api/v1/tokens/admin-2", &admin).await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    assert_eq!(
        r.1["error"]["message"],
        "only a super_admin may revoke the tokens of `admin-2`, which is an `admin`"
    );
    let r = api
        .post(
            "/api/v1/auth/tokens",
            Some(&admin),
            &json!({"role": "super_admin", "name": "root-2"}),
        )
        .await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    assert_eq!(
        r.1["error"]["message"],
        "only a super_admin may create `super_admin` tokens"
    );
    assert_eq!(
        r.1["error"]["details"]["allowed_roles"],
        json!(["super_admin"])
    );
    let r = delete(&api, "/api/v1/tokens/nobody", &admin).await;
    assert_error(&r, StatusCode::NOT_FOUND, "not_found");

    let r = status_is(
        delete(&api, "/api/v1/tokens/op-1", &admin).await,
        StatusCode::OK,
    );
    assert_eq!(r.1, json!({"name": "op-1", "revoked_tokens": 1}));
    // The very next request: refused, although the token was cached.
    let r = api.get("/api/v1/capabilities", Some(&op)).await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "unauthenticated");
    // Revoking again changes nothing.
    let r = delete(&api, "/api/v1/tokens/op-1", &admin).await;
    assert_eq!(r.1, json!({"name": "op-1", "revoked_tokens": 0}));

    let (_, list) = api.get("/api/v1/tokens", Some(&root)).await;
    let entry = find(&list["tokens"], "name", "op-1");
    assert_eq!(entry["revoked"], true);
    assert!(entry["revoked_at"].is_string(), "{entry}");
    // Other tokens still work; a super_admin may revoke an admin.
    let r = api.get("/api/v1/capabilities", Some(&viewer)).await;
    assert_eq!(r.0, StatusCode::OK);
    let _ = status_is(
        delete(&api, "/api/v1/tokens/admin-1", &root).await,
        StatusCode::OK,
    );
    let r = api.get("/api/v1/tokens", Some(&admin)).await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "unauthenticated");
    reg.shutdown().await;
}

/// A principal keeps one role: an admin cannot mint a token of another
/// role under an existing name (it would act as that principal and hold
/// its leases), also after that name's tokens were revoked; a second token
/// of the same role (rotation) is fine.
#[tokio::test]
async fn a_token_of_another_role_under_an_existing_principal_is_refused() {
    let (_dir, reg, api, _) = registry().await;
    let admin = new_token(&reg, Role::Admin, "admin-2").await;
    reg.auth
        .create_token(Role::AuditAgent, "audit:hw-1")
        .await
        .unwrap();
    let events_before = observable_state(&api, &admin).await.0;

    for (name, role) in [
        ("bootstrap-admin", "operator"),
        ("admin-2", "viewer"),
        ("audit:hw-1", "operator"),
    ] {
        let r = api
            .post(
                "/api/v1/auth/tokens",
                Some(&admin),
                &json!({"role": role, "name": name}),
            )
            .await;
        assert_error(&r, StatusCode::CONFLICT, "principal_role_conflict");
        assert!(
            r.1["error"]["message"].as_str().unwrap().contains(name),
            "{}",
            r.1
        );
    }
    // Revoked, the name still belongs to its role.
    let _ = status_is(
        delete(&api, "/api/v1/tokens/audit:hw-1", &admin).await,
        StatusCode::OK,
    );
    let r = api
        .post(
            "/api/v1/auth/tokens",
            Some(&admin),
            &json!({"role": "operator", "name": "audit:hw-1"}),
        )
        .await;
    assert_error(&r, StatusCode::CONFLICT, "principal_role_conflict");

    // Same role: a second (rotated) token for the principal.
    let r = status_is(
        api.post(
            "/api/v1/auth/tokens",
            Some(&admin),
            &json!({"role": "audit_agent", "name": "audit:hw-1"}),
        )
        .await,
        StatusCode::CREATED,
    );
    let fresh = r.1["token"].as_str().unwrap().to_string();
    let _ = status_is(
        api.get("/api/v1/capabilities", Some(&fresh)).await,
        StatusCode::OK,
    );
    assert_eq!(
        observable_state(&api, &admin).await.0,
        events_before,
        "refusals change nothing"
    );
}

/// An unknown field in a request body is refused with 422 `invalid_field`
/// naming it, rather than being ignored: a requirement's `capability_id`
/// (requirements have none) must not lease some other camera.
#[tokio::test]
async fn unknown_fields_in_request_bodies_are_refused_and_named() {
    let (_dir, reg, api, admin) = registry_with_p1(|_| {}).await;
    let a = new_token(&reg, Role::AuditAgent, "audit:hw-01").await;

    let mut group = lease_body("cam-front-01", "audit:hw-01", 50, 60);
    group.as_object_mut().unwrap().remove("capability_id");
    group["requirements"] = json!([{
        "capability_type": "camera",
        "capability_id": "cam-fake-01",
        "mode": "exclusive"
    }]);
    let r = api
        .post("/api/v1/capability-leases/request-group", Some(&a), &group)
        .await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert_eq!(
        r.1["error"]["details"]["field"],
        "requirements[0].capability_id"
    );
    let msg = r.1["error"]["message"].as_str().unwrap();
    assert!(msg.contains("unknown field `capability_id`"), "{msg}");
    assert!(msg.contains("`capability_type`"), "{msg}");
    let (_, leases) = api.get("/api/v1/capability-leases", Some(&admin)).await;
    assert_eq!(leases["leases"], json!([]), "nothing was leased");

    let mut body = lease_body("cam-front-01", "audit:hw-01", 50, 60);
    body["priorty"] = json!(90);
    let r = api.request_lease(&a, &body).await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert_eq!(r.1["error"]["details"]["field"], "priorty");

    let r = status_is(
        ask(&api, &a, "cam-front-01", "audit:hw-01", 50, 60).await,
        StatusCode::CREATED,
    );
    let lease = lease_id(&r);
    for (path, body, field) in [
        (
            format!("/api/v1/capability-leases/{lease}/actions"),
            json!({"action": "snapshot", "bogus": 1}),
            "bogus",
        ),
        (
            format!("/api/v1/capability-leases/{lease}/actions"),
            json!({"action": "snapshot", "wait_msec": 100}),
            "wait_msec",
        ),
        (
            format!("/api/v1/capability-leases/{lease}/renew"),
            json!({"duration_seconds": 30}),
            "duration_seconds",
        ),
        (
            format!("/api/v1/capability-leases/{lease}/release"),
            json!({"reason": "done", "force": true}),
            "force",
        ),
        (
            "/api/v1/auth/tokens".to_string(),
            json!({"role": "viewer", "name": "v-1", "expires": 60}),
            "expires",
        ),
    ] {
        let token = if path.starts_with("/api/v1/auth") {
            &admin
        } else {
            &a
        };
        let r = api.post(&path, Some(token), &body).await;
        assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
        assert_eq!(r.1["error"]["details"]["field"], field, "{path}: {}", r.1);
    }
    let r = api
        .lease_post(
            &a,
            &lease,
            "actions",
            &json!({"action": "snapshot", "wait_msec": 100}),
        )
        .await;
    assert_eq!(
        r.1["error"]["message"],
        "invalid field `wait_msec`: unknown field `wait_msec`, expected one of \
         `action`, `params`, `wait_ms`, `capability_id`, `timeout_ms`"
    );
    let (_, l) = api.lease(&a, &lease).await;
    assert_eq!(l["status"], "granted", "the lease was not touched: {l}");
    let (_, sessions) = api
        .get(
            &format!("/api/v1/capability-leases/{lease}/sessions"),
            Some(&a),
        )
        .await;
    assert_eq!(sessions["sessions"], json!([]), "no session was started");
    reg.shutdown().await;
}

// ------------------------------------------ revoked tokens and SSE ----

/// Reads `sse` until its response ends, at most `timeout`: the events it
/// still delivered, or `Err` with them when it was still open.
async fn read_until_end(
    sse: &mut SseReader,
    timeout: Duration,
) -> Result<Vec<SseEvent>, Vec<SseEvent>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, sse.stream.next()).await {
            Ok(Some(Ok(chunk))) => sse.buf.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(_) => break,
            Err(_) => {
                let mut events = Vec::new();
                while let Some(ev) = sse.next(Duration::from_millis(1)).await {
                    events.push(ev);
                }
                return Err(events);
            }
        }
    }
    let mut events = Vec::new();
    while let Some(ev) = sse.next(Duration::from_millis(1)).await {
        events.push(ev);
    }
    Ok(events)
}

async fn viewer_stream(api: &Api, admin: &str) -> (String, SseReader) {
    let (_, minted) = status_is(
        api.post(
            "/api/v1/auth/tokens",
            Some(admin),
            &json!({"role": "viewer", "name": "viewer-sse"}),
        )
        .await,
        StatusCode::CREATED,
    );
    let viewer = minted["token"].as_str().unwrap().to_string();
    let mut sse = SseReader::open(api, "/api/v1/capability-events/stream", &viewer, None).await;
    flip_health(api, admin, 1).await;
    let ev = sse
        .next(Duration::from_secs(5))
        .await
        .expect("a live event");
    assert_eq!(ev.event, "capability_health_changed");
    (viewer, sse)
}

#[tokio::test]
async fn an_open_event_stream_ends_when_its_token_is_revoked_over_http() {
    let (_dir, reg, api, admin) = registry_with_p1(|_| {}).await;
    let (viewer, mut sse) = viewer_stream(&api, &admin).await;

    let _ = status_is(
        delete(&api, "/api/v1/tokens/viewer-sse", &admin).await,
        StatusCode::OK,
    );
    // Events published after the revocation reach nobody holding it.
    flip_health(&api, &admin, 3).await;
    let after = read_until_end(&mut sse, Duration::from_secs(5))
        .await
        .unwrap_or_else(|evs| panic!("the stream is still open; it sent {}", evs.len()));
    assert!(
        after.is_empty(),
        "events after the revocation: {:?}",
        after.iter().map(|e| e.id).collect::<Vec<_>>()
    );
    let r = api
        .get("/api/v1/capability-events/stream", Some(&viewer))
        .await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "unauthenticated");
    reg.shutdown().await;
}

#[tokio::test]
async fn an_open_event_stream_ends_when_another_process_revokes_its_token() {
    let (dir, reg, api, admin) = registry_with_p1(|_| {}).await;
    let dir = std::sync::Arc::new(dir);
    let (_viewer, mut sse) = viewer_stream(&api, &admin).await;

    // What `cloud-registry token revoke` does: a write to the store the
    // running registry learns of only by reading it.
    let for_cli = dir.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = store_connection(&for_cli);
        cloud_registry::auth::revoke_tokens_sync(&mut conn, "viewer-sse").unwrap();
    })
    .await
    .unwrap();
    // No request of that token comes to refresh the cache: the stream
    // has to notice by itself, within a few seconds.
    let ended = read_until_end(&mut sse, Duration::from_secs(5)).await;
    assert!(ended.is_ok(), "the stream is still open");
    // It stays ended: later events go nowhere.
    flip_health(&api, &admin, 2).await;
    assert!(sse.next(Duration::from_millis(500)).await.is_none());
    reg.shutdown().await;
}

/// A path parameter that does not parse is a JSON error like any other,
/// not axum's plain text.
#[tokio::test]
async fn a_path_parameter_that_does_not_parse_is_a_json_400() {
    let (_dir, reg, api, admin) = registry().await;
    for verb in ["apply", "reject"] {
        let r = api
            .post(
                &format!("/api/v1/agents/proposals/x/{verb}"),
                Some(&admin),
                &json!({}),
            )
            .await;
        assert_error(&r, StatusCode::BAD_REQUEST, "invalid_path");
        assert_eq!(r.1["error"]["details"]["param"], "proposal_id", "{}", r.1);
        assert_eq!(
            r.1["error"]["message"],
            "invalid path parameter `proposal_id`: cannot parse `x` as an integer"
        );
    }
    // Not UTF-8 once percent-decoded.
    let r = api.get("/api/v1/capabilities/%FF", Some(&admin)).await;
    assert_error(&r, StatusCode::BAD_REQUEST, "invalid_path");
    reg.shutdown().await;
}

/// A provider with 10,000 labels, or a capability with 10,000 tags, is
/// refused with 422 naming the list and its limit, and nothing of the
/// request is stored (not the provider, not the batch's other capability).
#[tokio::test]
async fn ten_thousand_labels_or_tags_are_refused_and_nothing_is_stored() {
    let (_dir, reg, api, _) = registry().await;
    let token = new_token(&reg, Role::Provider, "provider-big-01").await;
    let many: Vec<String> = (0..10_000).map(|i| format!("t{i}")).collect();

    let mut provider = provider_body("provider-big-01");
    provider["labels"] = json!(many);
    let r = api.register_provider(&token, &provider).await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert_eq!(r.1["error"]["details"]["field"], "labels", "{}", r.1);
    let message = r.1["error"]["message"].as_str().unwrap();
    assert!(message.contains("at most 64"), "{message}");
    let r = api
        .get("/api/v1/capability-providers/provider-big-01", Some(&token))
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, "not_found");

    let _ = status_is(
        api.register_provider(&token, &provider_body("provider-big-01"))
            .await,
        StatusCode::OK,
    );
    let mut batch = capabilities_body("provider-big-01", "");
    batch["capabilities"][0]["tags"] = json!(many);
    let r = api.register_capabilities(&token, &batch).await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert_eq!(
        r.1["error"]["details"]["field"], "capabilities[0].tags",
        "{}",
        r.1
    );
    let message = r.1["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("tags") && message.contains("at most 64"),
        "{message}"
    );
    for id in ["cam-front-01", "thumb-robot-01"] {
        let r = api
            .get(&format!("/api/v1/capabilities/{id}"), Some(&token))
            .await;
        assert_error(&r, StatusCode::NOT_FOUND, "not_found");
    }
    let (_, list) = status_is(
        api.get("/api/v1/capabilities", Some(&token)).await,
        StatusCode::OK,
    );
    assert_eq!(list["capabilities"], json!([]), "{list}");
}

#[tokio::test]
async fn an_nfd_and_an_nfc_spelling_of_one_tag_select_the_same_device() {
    let (_dir, reg, api, admin) = registry_with_p1(|_| {}).await;
    // Registered with "café" decomposed (NFD: e + combining acute).
    let mut caps = capabilities_body("p1", "-cafe");
    caps["capabilities"][0]["tags"] = json!(["cafe\u{301}"]);
    let _ = status_is(
        api.register_capabilities(&admin, &caps).await,
        StatusCode::OK,
    );
    let (_, cam) = api
        .get("/api/v1/capabilities/cam-front-01-cafe", Some(&admin))
        .await;
    assert_eq!(cam["tags"], json!(["caf\u{e9}"]), "stored in NFC");
    // A listing by either spelling finds it.
    for tag in ["caf%C3%A9", "cafe%CC%81"] {
        let (_, l) = api
            .get(&format!("/api/v1/capabilities?tag={tag}"), Some(&admin))
            .await;
        let ids: Vec<&str> = l["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["capability_id"].as_str())
            .collect();
        assert_eq!(ids, vec!["cam-front-01-cafe"], "tag={tag}: {l}");
    }
    // A selector with the composed spelling is granted it.
    let agent = new_token(&reg, Role::AuditAgent, "audit:nfc").await;
    let mut body = lease_body("", "audit:nfc", 50, 60);
    body.as_object_mut().unwrap().remove("capability_id");
    body["capability_selector"] = json!({"capability_type": "camera", "tags": ["caf\u{e9}"]});
    let (_, l) = status_is(api.request_lease(&agent, &body).await, StatusCode::CREATED);
    assert_eq!(l["capability_id"], "cam-front-01-cafe");
    // A display name that would read backwards is refused, nothing stored.
    let mut bad = capabilities_body("p1", "-rtl");
    bad["capabilities"][0]["display_name"] = json!("cam\u{202E}gnp.exe");
    let (_, v) = status_is(
        api.register_capabilities(&admin, &bad).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert!(
        v["error"]["message"].as_str().unwrap().contains("U+202E"),
        "{v}"
    );
    let (s, _) = api
        .get("/api/v1/capabilities/cam-front-01-rtl", Some(&admin))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// The stream's status line and headers arrive at once on a quiet
/// registry, not with the first event or keep-alive (15 s), which a proxy
/// or client with a shorter timeout would give up on.
#[tokio::test]
async fn an_event_stream_with_nothing_to_send_answers_at_once() {
    let (_dir, _reg, api, admin) = registry().await;
    let t0 = std::time::Instant::now();
    let resp = tokio::time::timeout(
        Duration::from_secs(3),
        api.http
            .get(format!("{}/api/v1/capability-events/stream", api.base))
            .bearer_auth(&admin)
            .send(),
    )
    .await
    .expect("headers within 3 s")
    .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    eprintln!("stream answered in {} ms", t0.elapsed().as_millis());
}
