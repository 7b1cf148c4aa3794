//! The audit-task protocol (seed 001 §8-§14) over real HTTP on 127.0.0.1:0:
//! an axum server built from the audit router and the bearer-token
//! authenticator, a real lease engine, SQLite in a temporary directory.
//! Claiming under concurrency, claims bound to multi-capability leases,
//! visibility timeouts, results and findings, the chief audit, threads,
//! and bad input that must change nothing.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::{Extension, Router};
use benchlink_testkit::status_is;
use benchlink_testkit::strs;
use cloud_registry::audit::{self, AuditConfig, AuditService};
use cloud_registry::auth::{self, Authenticator};
use cloud_registry::db::Db;
use cloud_registry::events::{self, EventBus};
use cloud_registry::leases::{CapabilityInfo, LeaseConfig, LeaseEngine};
use common::audit_request;
use reqwest::StatusCode;
use serde_json::{json, Value};
use shared_protocol::api::Role;
use shared_protocol::audit::{AuditTaskRequest, AuditTaskResult};
use shared_protocol::capability::{CapabilityType, LeaseMode};
use shared_protocol::lease::LeaseStatus;
use tempfile::TempDir;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A registry slice: audit router + authenticator on a real port, the lease
/// engine and the audit service with its sweeper.
struct Bench {
    _dir: TempDir,
    base: String,
    http: reqwest::Client,
    db_path: PathBuf,
    auth: Arc<Authenticator>,
    leases: Arc<LeaseEngine>,
    admin: String,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Bench {
    async fn start(cfg: AuditConfig) -> Self {
        let dir = TempDir::new().unwrap();
        let db_path = dir.path().join("registry.sqlite3");
        let db = Db::open(&db_path, |c| {
            events::migrate(c)?;
            auth::migrate(c)?;
            cloud_registry::sessions::migrate(c)?;
            audit::migrate(c)?;
            // The artifacts the LED results below name, as a session
            // would have reported them.
            for id in [
                "art_clip_wake",
                "art_frame_2700ms",
                "art_audio_greeting",
                "art_1",
            ] {
                c.execute(
                    "INSERT INTO capability_artifacts (artifact_id, session_id, provider_id,
                         artifact_type, storage_uri, content_type, captured_at, checksum,
                         size_bytes, metadata_json, received_at)
                     VALUES (?1, 'sess_led', 'provider-winlab-01', 'video_clip', '', 'video/mp4',
                         '2026-11-30T03:29:00Z', 'sha256:00', 1, '{}', '2026-11-30T03:29:00Z')",
                    [id],
                )?;
            }
            Ok(())
        })
        .unwrap();
        let bus = EventBus::new(db.clone());
        let auth = Authenticator::load(db.clone()).await.unwrap();
        let leases = LeaseEngine::start(
            db.clone(),
            bus.clone(),
            LeaseConfig {
                sweep_interval_ms: 50,
                ..LeaseConfig::default()
            },
        )
        .await
        .unwrap();
        let svc = AuditService::new(db, bus, leases.clone(), cfg);
        let (shutdown, rx) = watch::channel(false);
        let sweeper = svc.spawn_sweeper(rx.clone());
        let app = Router::new()
            .nest("/api/v1", axum::Router::from(audit::router(svc)))
            .layer(Extension(auth.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut stop = rx;
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
                .unwrap();
        });
        let admin = auth.create_token(Role::Admin, "lab-admin").await.unwrap();
        Self {
            _dir: dir,
            base: format!("http://{addr}/api/v1"),
            http: reqwest::Client::new(),
            db_path,
            auth,
            leases,
            admin,
            shutdown,
            tasks: vec![sweeper, server],
        }
    }

    async fn token(&self, role: Role, name: &str) -> String {
        self.auth.create_token(role, name).await.unwrap()
    }

    async fn post(&self, path: &str, token: &str, body: &Value) -> (StatusCode, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn claim(
        &self,
        token: &str,
        agent_ref: &str,
        types: &[&str],
        wait_ms: u64,
    ) -> (StatusCode, Value) {
        self.post(
            "/audit-requests/claim",
            token,
            &json!({ "audit_types": types, "agent_ref": agent_ref, "wait_ms": wait_ms }),
        )
        .await
    }

    /// Rows in `table` (optionally `WHERE where_sql`), read straight from
    /// the SQLite file.
    fn count(&self, table: &str, where_sql: &str) -> i64 {
        let conn = rusqlite::Connection::open(&self.db_path).unwrap();
        let sql = if where_sql.is_empty() {
            format!("SELECT COUNT(*) FROM {table}")
        } else {
            format!("SELECT COUNT(*) FROM {table} WHERE {where_sql}")
        };
        conn.query_row(&sql, [], |r| r.get(0)).unwrap()
    }

    /// `(event_type, audit_request_id, data)` of every audit event, in
    /// log order.
    fn audit_events(&self) -> Vec<(String, String, Value)> {
        let conn = rusqlite::Connection::open(&self.db_path).unwrap();
        let mut stmt = conn
            .prepare(
                "SELECT event_type, audit_request_id, data FROM events
                 WHERE event_type LIKE 'audit_task_%' ORDER BY event_id",
            )
            .unwrap();
        stmt.query_map([], |r| {
            let data: String = r.get(2)?;
            Ok((r.get(0)?, r.get(1)?, serde_json::from_str(&data).unwrap()))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    }

    /// The four capabilities of the seed's LED-validation bench.
    async fn register_led_bench(&self) {
        for (id, t) in [
            ("cam-front-01", CapabilityType::Camera),
            ("spk-01", CapabilityType::Speaker),
            ("mic-01", CapabilityType::Microphone),
            ("thumb-robot-01", CapabilityType::ThumbRobot),
        ] {
            self.leases
                .upsert_capability(CapabilityInfo {
                    capability_id: id.to_string(),
                    provider_id: "provider-winlab-01".to_string(),
                    node_id: "win-gpu-02".to_string(),
                    capability_type: t,
                    tags: vec!["lab".to_string(), "device-station-a".to_string()],
                    lease_mode: LeaseMode::Exclusive,
                    preemptible: true,
                    safety_locked: false,
                    default_priority: 50,
                    online: true,
                    non_interruptible: false,
                    maintenance: None,
                    unhealthy: false,
                    on_release: Vec::new(),
                    check_failed: None,
                })
                .await;
        }
    }

    async fn register_thread(&self, thread_ref: &str, role: &str) {
        let node = thread_ref.split(':').next().unwrap();
        let (s, b) = self
            .post(
                "/threads",
                &self.admin,
                &json!({ "thread_ref": thread_ref, "node_id": node, "role": role, "labels": ["lab"] }),
            )
            .await;
        assert!(s.is_success(), "{s} {b}");
    }

    /// An audit agent's token for principal `name`.
    async fn agent(&self, name: &str) -> String {
        self.token(Role::AuditAgent, name).await
    }

    /// The LED bench ([`Bench::register_led_bench`]), the `ui` thread
    /// `mac-01:thread-ui-22`, and the LED tasks `ids` ([`led_request`] with
    /// `time_budget_seconds`) queued by the admin: each answer 201.
    async fn led_bench_with_tasks(&self, ids: &[&str], time_budget_seconds: u32) {
        self.register_led_bench().await;
        self.register_thread("mac-01:thread-ui-22", "ui").await;
        for id in ids {
            let _ = status_is(
                self.post(
                    "/audit-requests",
                    &self.admin,
                    &led_request(id, time_budget_seconds),
                )
                .await,
                StatusCode::CREATED,
            );
        }
    }

    async fn stop(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            tokio::time::timeout(Duration::from_secs(5), t)
                .await
                .expect("background task stops on shutdown")
                .unwrap();
        }
        self.leases.shutdown().await;
    }
}

/// The seed's §8.1 request example, verbatim.
fn seed_request() -> Value {
    json!({
      "protocol_version": "1.0",
      "audit_request_id": "auditreq_001",
      "project_id": "proj_device_assistant",
      "task_id": "task_led_validation",
      "source_thread_ref": "mac-01:thread-ui-22",
      "trigger": "milestone",
      "audit_type": "multimodal",
      "priority": 70,
      "objective": "验证设备被唤醒后，屏幕、LED、语音播报与交互脚本是否一致",
      "system_context_summary": "设备端已刷入固件 v0.9.2，等待做端到端唤醒测试",
      "acceptance_criteria": [
        "LED 在 2 秒内变蓝",
        "屏幕切换到 listening 状态",
        "扬声器播报欢迎语",
        "摄像头观测到机械动作完成"
      ],
      "evidence_refs": [],
      "artifact_refs": [],
      "capability_requirements": [
        { "capability_type": "camera", "mode": "exclusive" },
        { "capability_type": "speaker", "mode": "exclusive" },
        { "capability_type": "microphone", "mode": "exclusive" },
        { "capability_type": "thumb_robot", "mode": "exclusive" }
      ],
      "time_budget_seconds": 300,
      "response_mode": "structured_json"
    })
}

/// The seed request under another id.
fn led_request(id: &str, time_budget_seconds: u32) -> Value {
    let mut r = seed_request();
    r["audit_request_id"] = json!(id);
    r["time_budget_seconds"] = json!(time_budget_seconds);
    r
}

/// A full multimodal result for the LED task, as an agent would post it.
fn led_result(id: &str, used: &[String]) -> Value {
    json!({
        "audit_request_id": id,
        "audit_type": "multimodal",
        "status": "completed",
        "decision": "fail",
        "confidence": 0.82,
        "summary": "LED turned blue after 2.7 s (limit 2 s); screen and greeting as scripted.",
        "findings": [
            {
                "finding_id": "f-led-latency",
                "severity": "high",
                "title": "LED turns blue too late",
                "description": "Keyframes show the LED blue 2.7 s after the wake tap; the script allows 2 s.",
                "evidence_ref_ids": ["art_clip_wake", "art_frame_2700ms"],
                "suggested_fix": "Start the LED animation before the audio pipeline warms up."
            },
            {
                "finding_id": "f-greeting-volume",
                "severity": "low",
                "title": "Greeting is quiet",
                "description": "The greeting peaks at -31 dBFS at the bench microphone.",
                "evidence_ref_ids": ["art_audio_greeting"]
            }
        ],
        "required_actions": ["fix LED latency before merge"],
        "used_capabilities": used,
        "artifact_refs": ["art_clip_wake", "art_frame_2700ms", "art_audio_greeting"],
        "timeline": [
            {"t_ms": 0, "step": "tap wake button"},
            {"t_ms": 2700, "step": "LED blue"}
        ],
        "duration_ms": 41250,
        "completed_at": "2026-11-30T03:29:22Z",
        "observed_timeline": [
            {"t_ms": 0, "event": "tap"},
            {"t_ms": 900, "event": "screen listening"},
            {"t_ms": 2700, "event": "led blue"},
            {"t_ms": 3100, "event": "greeting played"}
        ],
        "visual_mismatches": ["led_blue_at_2700ms_expected_within_2000ms"],
        "audio_mismatches": [],
        "interaction_failures": [],
        "perceptual_verdict": "LED latency out of spec; other states match the script",
        "needs_human_review_reason": "latency is close to the camera's frame interval"
    })
}

fn lease_ids(claim: &Value) -> Vec<String> {
    claim["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["lease_id"].as_str().unwrap().to_string())
        .collect()
}

async fn lease_status(b: &Bench, lease_id: &str) -> LeaseStatus {
    b.leases
        .get(lease_id)
        .await
        .expect("lease is stored")
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_agents_claiming_at_once_take_each_of_200_tasks_exactly_once_in_priority_order() {
    let b = Bench::start(AuditConfig::default()).await;
    let operator = b.token(Role::Operator, "release-manager").await;
    // Priorities scrambled over creation order, with ties (i·37 mod 101).
    let mut created: HashMap<String, (u8, usize)> = HashMap::new();
    for i in 0..200usize {
        let id = format!("auditreq_sw_{i:03}");
        let priority = ((i * 37) % 101) as u8;
        let _ = status_is(
            b.post(
                "/audit-requests",
                &operator,
                &audit_request(&id, "software", priority),
            )
            .await,
            StatusCode::CREATED,
        );
        created.insert(id, (priority, i));
    }

    let mut agents = Vec::new();
    for a in 0..50 {
        let name = format!("audit:software-auditor-{a:02}");
        let token = b.token(Role::AuditAgent, &name).await;
        let (base, http) = (b.base.clone(), b.http.clone());
        agents.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let resp = http
                    .post(format!("{base}/audit-requests/claim"))
                    .bearer_auth(&token)
                    .json(&json!({ "audit_types": ["software"], "agent_ref": name }))
                    .send()
                    .await
                    .unwrap();
                match resp.status() {
                    StatusCode::NO_CONTENT => break,
                    StatusCode::OK => {
                        let v: Value = resp.json().await.unwrap();
                        assert_eq!(v["claim"]["principal"], json!(name));
                        mine.push(
                            v["request"]["audit_request_id"]
                                .as_str()
                                .unwrap()
                                .to_string(),
                        );
                    }
                    other => panic!("claim answered {other}: {}", resp.text().await.unwrap()),
                }
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for a in agents {
        all.extend(a.await.unwrap());
    }
    let distinct: HashSet<&String> = all.iter().collect();
    assert_eq!(all.len(), 200, "every task claimed once, none twice");
    assert_eq!(distinct.len(), 200);

    // The claim sequence is the commit order of `audit_task_claimed`.
    let sequence: Vec<(u8, usize)> = b
        .audit_events()
        .into_iter()
        .filter(|(t, _, _)| t == "audit_task_claimed")
        .map(|(_, id, _)| created[&id])
        .collect();
    assert_eq!(sequence.len(), 200);
    for pair in sequence.windows(2) {
        let ((p1, age1), (p2, age2)) = (pair[0], pair[1]);
        assert!(
            p1 > p2 || (p1 == p2 && age1 < age2),
            "claimed priority {p1} (created #{age1}) before {p2} (created #{age2})"
        );
    }
    assert_eq!(b.count("audit_requests", "status = 'claimed'"), 200);
    assert_eq!(b.count("audit_claims", ""), 200);
    b.stop().await;
}

#[tokio::test]
async fn a_claimed_multimodal_task_holds_all_four_leases_and_a_second_waits_until_they_free() {
    let b = Bench::start(AuditConfig::default()).await;
    b.led_bench_with_tasks(&["auditreq_001", "auditreq_002"], 300)
        .await;
    let a = b.agent("audit:multimodal-auditor-01").await;
    let c = b.agent("audit:multimodal-auditor-02").await;

    let (_, first) = status_is(
        b.claim(&a, "audit:multimodal-auditor-01", &["multimodal"], 0)
            .await,
        StatusCode::OK,
    );
    assert_eq!(first["request"]["audit_request_id"], "auditreq_001");
    let types = strs(&first["assignments"], "capability_type");
    assert_eq!(types, ["camera", "speaker", "microphone", "thumb_robot"]);
    let caps: HashSet<&str> = first["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["capability_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        caps,
        HashSet::from(["cam-front-01", "spk-01", "mic-01", "thumb-robot-01"])
    );
    let held = lease_ids(&first);
    for l in first["leases"].as_array().unwrap() {
        assert_eq!(l["status"], "granted");
        assert_eq!(l["principal"], "audit:multimodal-auditor-01");
        assert_eq!(l["holder_type"], "audit_agent");
        assert_eq!(l["priority"], 70);
        assert_eq!(l["lease_group_id"], first["claim"]["lease_group_id"]);
    }
    for id in &held {
        assert_eq!(lease_status(&b, id).await, LeaseStatus::Granted);
    }
    assert_eq!(first["claim"]["lease_ids"], json!(held));

    // The second task needs the same four capabilities: not claimable, and
    // its withdrawn lease group leaves nothing waiting in the lease queue.
    let _ = status_is(
        b.claim(&c, "audit:multimodal-auditor-02", &["multimodal"], 0)
            .await,
        StatusCode::NO_CONTENT,
    );
    let (_, second) = b.get("/audit-requests/auditreq_002", &c).await;
    assert_eq!(second["status"], "queued");
    assert_eq!(second["attempts"], 0);
    assert_eq!(b.leases.queue_len(), 0);

    let used: Vec<String> = first["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["capability_id"].as_str().unwrap().to_string())
        .collect();
    let _ = status_is(
        b.post(
            "/audit-requests/auditreq_001/result",
            &a,
            &led_result("auditreq_001", &used),
        )
        .await,
        StatusCode::OK,
    );
    for id in &held {
        assert_eq!(lease_status(&b, id).await, LeaseStatus::Released);
    }

    let (_, next) = status_is(
        b.claim(&c, "audit:multimodal-auditor-02", &["multimodal"], 0)
            .await,
        StatusCode::OK,
    );
    assert_eq!(next["request"]["audit_request_id"], "auditreq_002");
    assert_eq!(next["leases"].as_array().unwrap().len(), 4);
    for id in lease_ids(&next) {
        assert_eq!(lease_status(&b, &id).await, LeaseStatus::Granted);
    }
    b.stop().await;
}

#[tokio::test]
async fn a_waiting_claim_gets_the_task_as_soon_as_its_capabilities_free() {
    let b = Bench::start(AuditConfig::default()).await;
    b.led_bench_with_tasks(&["auditreq_001", "auditreq_002"], 300)
        .await;
    let a = b.agent("audit:multimodal-auditor-01").await;
    let c = b.agent("audit:multimodal-auditor-02").await;
    let _ = status_is(
        b.claim(&a, "audit:multimodal-auditor-01", &["multimodal"], 0)
            .await,
        StatusCode::OK,
    );

    let (base, http) = (b.base.clone(), b.http.clone());
    let started = Instant::now();
    let waiter = tokio::spawn(async move {
        let resp = http
            .post(format!("{base}/audit-requests/claim"))
            .bearer_auth(&c)
            .json(&json!({ "audit_types": ["multimodal"], "agent_ref": "audit:multimodal-auditor-02", "wait_ms": 20000 }))
            .send()
            .await
            .unwrap();
        (
            resp.status(),
            resp.json::<Value>().await.unwrap_or(Value::Null),
            started.elapsed(),
        )
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !waiter.is_finished(),
        "the second claim waits while the bench is busy"
    );
    let _ = status_is(
        b.post(
            "/audit-requests/auditreq_001/release",
            &a,
            &json!({ "reason": "bench needed elsewhere" }),
        )
        .await,
        StatusCode::OK,
    );
    let (s, next, waited) = waiter.await.unwrap();
    assert_eq!(s, StatusCode::OK, "{next}");
    // The waiting claim had reserved auditreq_002 and its lease group was
    // granted the moment the bench freed; auditreq_001 is back in the
    // queue for the next claim.
    assert_eq!(next["request"]["audit_request_id"], "auditreq_002");
    assert_eq!(next["claim"]["attempt"], 1);
    let (_, back) = b.get("/audit-requests/auditreq_001", &a).await;
    assert_eq!(back["status"], "queued");
    assert_eq!(back["attempts"], 1);
    assert!(
        waited < Duration::from_secs(10),
        "woken by the release, not by the wait running out ({waited:?})"
    );
    for id in lease_ids(&next) {
        assert_eq!(lease_status(&b, &id).await, LeaseStatus::Granted);
    }
    b.stop().await;
}

/// Visibility timeout 1 s: budget 1 s × factor 1.0, floor 1 s.
fn fast_timeouts() -> AuditConfig {
    AuditConfig {
        visibility_timeout_factor: 1.0,
        min_visibility_timeout_seconds: 1,
        sweep_interval_ms: 100,
        ..AuditConfig::default()
    }
}

#[tokio::test]
async fn an_agent_that_vanishes_loses_the_task_and_its_leases_after_the_visibility_timeout() {
    let b = Bench::start(fast_timeouts()).await;
    b.led_bench_with_tasks(&["auditreq_001"], 1).await;
    let a = b.agent("audit:multimodal-auditor-01").await;
    let c = b.agent("audit:multimodal-auditor-02").await;
    let (_, first) = status_is(
        b.claim(&a, "audit:multimodal-auditor-01", &["multimodal"], 0)
            .await,
        StatusCode::OK,
    );
    assert_eq!(first["claim"]["visibility_timeout_seconds"], 1);
    let held = lease_ids(&first);

    // The agent goes silent. Within a few sweeps the task is back.
    let deadline = Instant::now() + Duration::from_secs(5);
    let record = loop {
        let (_, r) = b.get("/audit-requests/auditreq_001", &c).await;
        if r["status"] == "queued" {
            break r;
        }
        assert!(Instant::now() < deadline, "task not returned: {r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(record["attempts"], 1);
    assert!(record.get("claim").is_none(), "{record}");
    for id in &held {
        let st = lease_status(&b, id).await;
        assert!(
            matches!(st, LeaseStatus::Released | LeaseStatus::Expired),
            "lease {id} is {st}"
        );
    }
    let released: Vec<Value> = b
        .audit_events()
        .into_iter()
        .filter(|(t, _, _)| t == "audit_task_released")
        .map(|(_, _, d)| d)
        .collect();
    assert_eq!(released.len(), 1);
    assert_eq!(released[0]["reason"], "visibility_timeout");
    assert_eq!(released[0]["request_status"], "queued");

    // Its late result is refused and nothing is stored.
    let used = vec!["cam-front-01".to_string()];
    let (_, err) = status_is(
        b.post(
            "/audit-requests/auditreq_001/result",
            &a,
            &led_result("auditreq_001", &used),
        )
        .await,
        StatusCode::CONFLICT,
    );
    assert_eq!(err["error"]["code"], "claim_expired");
    assert_eq!(b.count("audit_results", ""), 0);
    assert_eq!(b.count("audit_findings", ""), 0);

    // Another agent gets the task and the same bench.
    let (_, next) = status_is(
        b.claim(&c, "audit:multimodal-auditor-02", &["multimodal"], 0)
            .await,
        StatusCode::OK,
    );
    assert_eq!(next["claim"]["attempt"], 2);
    assert_eq!(next["leases"].as_array().unwrap().len(), 4);
    b.stop().await;
}

#[tokio::test]
async fn extending_a_claim_moves_its_deadline_and_renews_its_leases() {
    let b = Bench::start(fast_timeouts()).await;
    b.led_bench_with_tasks(&["auditreq_001"], 1).await;
    let a = b.agent("audit:multimodal-auditor-01").await;
    let (_, first) = status_is(
        b.claim(&a, "audit:multimodal-auditor-01", &["multimodal"], 0)
            .await,
        StatusCode::OK,
    );

    let (_, ext) = status_is(
        b.post(
            "/audit-requests/auditreq_001/extend",
            &a,
            &json!({ "extend_seconds": 30 }),
        )
        .await,
        StatusCode::OK,
    );
    let expires: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(ext["claim"]["expires_at"].clone()).unwrap();
    assert!(expires > chrono::Utc::now() + chrono::TimeDelta::seconds(25));
    for l in ext["leases"].as_array().unwrap() {
        let lease_expiry: chrono::DateTime<chrono::Utc> =
            serde_json::from_value(l["expires_at"].clone()).unwrap();
        assert!(
            lease_expiry > chrono::Utc::now() + chrono::TimeDelta::seconds(25),
            "{l}"
        );
    }
    // Well past the original 1 s timeout the claim still holds.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let (_, r) = b.get("/audit-requests/auditreq_001", &a).await;
    assert_eq!(r["status"], "claimed", "{r}");
    for id in lease_ids(&first) {
        assert!(lease_status(&b, &id).await.holds_capability());
    }
    b.stop().await;
}

#[tokio::test]
async fn the_seed_example_request_and_a_full_result_round_trip_through_the_api() {
    let b = Bench::start(AuditConfig::default()).await;
    b.led_bench_with_tasks(&[], 0).await;
    let a = b.agent("audit:multimodal-auditor-01").await;

    let (_, created) = status_is(
        b.post("/audit-requests", &b.admin, &seed_request()).await,
        StatusCode::CREATED,
    );
    assert_eq!(created["status"], "queued");
    let (_, record) = status_is(
        b.get("/audit-requests/auditreq_001", &a).await,
        StatusCode::OK,
    );
    let posted: AuditTaskRequest = serde_json::from_value(seed_request()).unwrap();
    let mut stored: AuditTaskRequest = serde_json::from_value(record["request"].clone()).unwrap();
    assert!(stored.created_at.is_some(), "created_at is filled in");
    stored.created_at = None;
    assert_eq!(stored, posted);
    assert_eq!(record["request"]["objective"], seed_request()["objective"]);

    let (_, claimed) = status_is(
        b.claim(&a, "audit:multimodal-auditor-01", &["multimodal"], 0)
            .await,
        StatusCode::OK,
    );
    let used: Vec<String> = claimed["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["capability_id"].as_str().unwrap().to_string())
        .collect();
    let body = led_result("auditreq_001", &used);
    let (_, done) = status_is(
        b.post("/audit-requests/auditreq_001/result", &a, &body)
            .await,
        StatusCode::OK,
    );
    assert_eq!(done["status"], "completed");
    assert_eq!(done["result_status"], "completed");
    assert_eq!(done["decision"], "fail");

    let (_, got) = status_is(
        b.get("/audit-requests/auditreq_001/result", &a).await,
        StatusCode::OK,
    );
    let sent: AuditTaskResult = serde_json::from_value(body.clone()).unwrap();
    let got: AuditTaskResult = serde_json::from_value(got).unwrap();
    assert_eq!(got, sent);
    assert_eq!(
        got.findings[0].evidence_ref_ids,
        ["art_clip_wake", "art_frame_2700ms"]
    );

    assert_eq!(
        b.count("audit_findings", "audit_request_id = 'auditreq_001'"),
        2
    );
    assert_eq!(b.count("audit_findings", "severity = 'high'"), 1);
    assert_eq!(b.count("audit_result_capabilities", ""), 4);
    assert_eq!(b.count("audit_result_artifacts", ""), 3);

    let kinds: Vec<String> = b
        .audit_events()
        .into_iter()
        .filter(|(_, id, _)| id == "auditreq_001")
        .map(|(t, _, _)| t)
        .collect();
    assert_eq!(
        kinds,
        [
            "audit_task_created",
            "audit_task_claimed",
            "audit_task_completed"
        ]
    );
    // The thread the request came from is told.
    let (_, inbox) = status_is(
        b.get("/threads/mac-01:thread-ui-22/messages", &a).await,
        StatusCode::OK,
    );
    let msgs = inbox["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0]["kind"], "audit_completed");
    assert_eq!(msgs[0]["body"]["decision"], "fail");
    assert_eq!(msgs[0]["body"]["findings"], 2);

    // A second result for the same claim is refused.
    let (_, err) = status_is(
        b.post("/audit-requests/auditreq_001/result", &a, &body)
            .await,
        StatusCode::CONFLICT,
    );
    assert_eq!(err["error"]["code"], "claim_ended");
    assert_eq!(b.count("audit_results", ""), 1);
    b.stop().await;
}

#[tokio::test]
async fn a_chief_audit_over_three_sub_results_yields_the_decision_the_chief_agent_posted() {
    let b = Bench::start(AuditConfig::default()).await;
    b.register_thread("mac-01:thread-ui-22", "ui").await;
    b.register_thread("mac-02:thread-release-7", "release-manager")
        .await;
    let chief_agent = b.agent("audit:chief-auditor-01").await;
    let worker = b.agent("audit:sub-auditor-01").await;

    let mut sw = audit_request("auditreq_sw", "software", 65);
    sw["repo_ref"] = json!("git@lab:device-assistant.git");
    sw["head_commit"] = json!("9f2c1ab");
    let mut hw = audit_request("auditreq_hw", "hardware", 75);
    hw["firmware_version"] = json!("v0.9.2");
    let mm = audit_request("auditreq_mm", "multimodal", 70);
    for r in [&sw, &hw, &mm] {
        let _ = status_is(
            b.post("/audit-requests", &b.admin, r).await,
            StatusCode::CREATED,
        );
    }
    let mut chief = audit_request("auditreq_chief", "chief", 80);
    chief["source_thread_ref"] = json!("mac-01:thread-ui-22");
    chief["depends_on"] = json!(["auditreq_sw", "auditreq_hw", "auditreq_mm"]);
    chief["human_notes"] = json!("release only if LED latency is fixed");
    let (_, body) = status_is(
        b.post("/audit-requests", &b.admin, &chief).await,
        StatusCode::CREATED,
    );
    assert_eq!(
        body["waiting_on"],
        json!(["auditreq_sw", "auditreq_hw", "auditreq_mm"])
    );

    // Not claimable while its sub-audits have no results.
    let (s, _) = b
        .claim(&chief_agent, "audit:chief-auditor-01", &["chief"], 0)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);

    let mut posted: HashMap<&str, Value> = HashMap::new();
    for (t, extra) in [
        (
            "software",
            json!({"regression_risk_level": "medium", "release_blockers": [], "recommended_owner": "mac-01:thread-ui-22"}),
        ),
        (
            "hardware",
            json!({"device_state_assessment": "boots, state machine reaches idle", "firmware_mismatch": false}),
        ),
        (
            "multimodal",
            json!({"perceptual_verdict": "LED late", "visual_mismatches": ["led_blue_at_2700ms"]}),
        ),
    ] {
        let (_, task) = status_is(
            b.claim(&worker, "audit:sub-auditor-01", &[t], 0).await,
            StatusCode::OK,
        );
        let id = task["request"]["audit_request_id"]
            .as_str()
            .unwrap()
            .to_string();
        let mut result = json!({
            "audit_request_id": id,
            "audit_type": t,
            "status": "completed",
            "decision": if t == "multimodal" { "fail" } else { "pass" },
            "confidence": 0.9,
            "summary": format!("{t} audit done"),
            "findings": [],
            "duration_ms": 1000,
            "completed_at": "2026-11-30T03:29:22Z"
        });
        result
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let _ = status_is(
            b.post(&format!("/audit-requests/{id}/result"), &worker, &result)
                .await,
            StatusCode::OK,
        );
        posted.insert(t, result);
    }

    let (_, task) = status_is(
        b.claim(&chief_agent, "audit:chief-auditor-01", &["chief"], 0)
            .await,
        StatusCode::OK,
    );
    assert_eq!(task["request"]["audit_request_id"], "auditreq_chief");
    let as_result = |v: &Value| serde_json::from_value::<AuditTaskResult>(v.clone()).unwrap();
    assert_eq!(
        as_result(&task["request"]["software_audit_result"]),
        as_result(&posted["software"])
    );
    assert_eq!(
        as_result(&task["request"]["hardware_audit_result"]),
        as_result(&posted["hardware"])
    );
    assert_eq!(
        as_result(&task["request"]["multimodal_audit_result"]),
        as_result(&posted["multimodal"])
    );
    let subs = task["sub_results"].as_array().unwrap();
    assert_eq!(subs.len(), 3);
    assert!(subs.iter().all(|s| s["request_status"] == "completed"));
    assert_eq!(
        task["request"]["human_notes"],
        "release only if LED latency is fixed"
    );

    let verdict = json!({
        "audit_request_id": "auditreq_chief",
        "audit_type": "chief",
        "status": "completed",
        "decision": "fail",
        "confidence": 0.88,
        "summary": "Multimodal audit failed on LED latency; software and hardware pass.",
        "findings": [{
            "finding_id": "f-chief-1", "severity": "high",
            "title": "Release blocked by LED latency",
            "description": "See auditreq_mm.", "evidence_ref_ids": ["auditreq_mm"]
        }],
        "duration_ms": 5000,
        "completed_at": "2026-11-30T03:35:00Z",
        "final_decision": "rejected",
        "overall_risk_level": "high",
        "blocking_reasons": ["LED turns blue after 2.7 s (limit 2 s)"],
        "recommended_next_step": "fix LED timing in firmware v0.9.3 and re-run the multimodal audit",
        "handoff_target": "mac-02:thread-release-7"
    });
    let _ = status_is(
        b.post(
            "/audit-requests/auditreq_chief/result",
            &chief_agent,
            &verdict,
        )
        .await,
        StatusCode::OK,
    );
    let (_, got) = b
        .get("/audit-requests/auditreq_chief/result", &worker)
        .await;
    assert_eq!(got["final_decision"], "rejected");
    assert_eq!(got["overall_risk_level"], "high");
    assert_eq!(got["handoff_target"], "mac-02:thread-release-7");
    assert_eq!(as_result(&got), as_result(&verdict));

    let (_, inbox) = b
        .get("/threads/mac-02:thread-release-7/messages", &worker)
        .await;
    let msgs = inbox["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0]["kind"], "audit_handoff");
    assert_eq!(msgs[0]["body"]["final_decision"], "rejected");
    assert_eq!(msgs[0]["from_thread_ref"], "mac-01:thread-ui-22");
    b.stop().await;
}

#[tokio::test]
async fn bad_input_gets_a_clear_error_and_stores_nothing() {
    let b = Bench::start(AuditConfig::default()).await;
    b.register_thread("mac-01:thread-ui-22", "ui").await;
    let a = b.agent("audit:software-auditor-01").await;
    let other = b.agent("audit:software-auditor-02").await;
    let viewer = b.token(Role::Viewer, "dashboard").await;

    let mut unknown_type = audit_request("auditreq_x", "software", 60);
    unknown_type["audit_type"] = json!("financial");
    let (_, err) = status_is(
        b.post("/audit-requests", &b.admin, &unknown_type).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(err["error"]["code"], "invalid_field");
    assert_eq!(err["error"]["details"]["field"], "audit_type");
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("financial"));

    let mut wrong_section = audit_request("auditreq_x", "software", 60);
    wrong_section["frame_refs"] = json!(["art_1"]);
    let (_, err) = status_is(
        b.post("/audit-requests", &b.admin, &wrong_section).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(err["error"]["details"]["field"], "frame_refs");

    let mut unknown_thread = audit_request("auditreq_x", "software", 60);
    unknown_thread["source_thread_ref"] = json!("mac-09:thread-nobody");
    let (_, err) = status_is(
        b.post("/audit-requests", &b.admin, &unknown_thread).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(err["error"]["details"]["field"], "source_thread_ref");

    let mut chief = audit_request("auditreq_x", "chief", 80);
    chief["depends_on"] = json!(["auditreq_missing"]);
    let (_, err) = status_is(
        b.post("/audit-requests", &b.admin, &chief).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(err["error"]["details"]["field"], "depends_on[0]");

    let _ = status_is(
        b.post(
            "/audit-requests",
            &viewer,
            &audit_request("auditreq_x", "software", 60),
        )
        .await,
        StatusCode::FORBIDDEN,
    );
    assert_eq!(b.count("audit_requests", ""), 0);
    assert_eq!(b.count("events", ""), 0);

    let (s, _) = b
        .post(
            "/audit-requests",
            &b.admin,
            &audit_request("auditreq_sw", "software", 60),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (_, err) = status_is(
        b.post(
            "/audit-requests",
            &b.admin,
            &audit_request("auditreq_sw", "hardware", 60),
        )
        .await,
        StatusCode::CONFLICT,
    );
    assert_eq!(err["error"]["code"], "duplicate_audit_request");
    assert_eq!(b.count("audit_requests", ""), 1);

    let (s, _) = b
        .claim(&a, "audit:software-auditor-01", &["software"], 0)
        .await;
    assert_eq!(s, StatusCode::OK);
    let result = json!({
        "audit_request_id": "auditreq_sw",
        "audit_type": "software",
        "status": "completed",
        "decision": "pass",
        "confidence": 0.9,
        "summary": "ok",
        "findings": [{"finding_id": "f1", "severity": "low", "title": "t", "description": "d"}],
        "duration_ms": 10,
        "completed_at": "2026-11-30T03:29:22Z"
    });
    // Another agent's result for a task it did not claim.
    let (_, err) = status_is(
        b.post("/audit-requests/auditreq_sw/result", &other, &result)
            .await,
        StatusCode::FORBIDDEN,
    );
    assert_eq!(err["error"]["code"], "not_claim_holder");
    // An agent naming someone else as itself.
    let (_, err) = status_is(
        b.claim(&other, "audit:software-auditor-01", &["software"], 0)
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(err["error"]["details"]["field"], "agent_ref");
    // Unknown request.
    let _ = status_is(
        b.post("/audit-requests/auditreq_nope/result", &a, &result)
            .await,
        StatusCode::NOT_FOUND,
    );
    // The wrong audit type, an output of another type, a repeated finding.
    let mut wrong = result.clone();
    wrong["audit_type"] = json!("hardware");
    let (_, err) = status_is(
        b.post("/audit-requests/auditreq_sw/result", &a, &wrong)
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(err["error"]["details"]["field"], "audit_type");
    let mut foreign = result.clone();
    foreign["final_decision"] = json!("approved");
    let (_, err) = status_is(
        b.post("/audit-requests/auditreq_sw/result", &a, &foreign)
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(err["error"]["details"]["field"], "final_decision");
    let mut twice = result.clone();
    twice["findings"] = json!([result["findings"][0], result["findings"][0]]);
    let (_, err) = status_is(
        b.post("/audit-requests/auditreq_sw/result", &a, &twice)
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(err["error"]["details"]["field"], "findings[1].finding_id");
    let mut bad_confidence = result.clone();
    bad_confidence["confidence"] = json!(1.5);
    let (_, err) = status_is(
        b.post("/audit-requests/auditreq_sw/result", &a, &bad_confidence)
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(err["error"]["details"]["field"], "confidence");

    assert_eq!(b.count("audit_results", ""), 0);
    assert_eq!(b.count("audit_findings", ""), 0);
    let (_, r) = b.get("/audit-requests/auditreq_sw", &viewer).await;
    assert_eq!(r["status"], "claimed");
    let (_, err) = status_is(
        b.get("/audit-requests/auditreq_sw/result", &viewer).await,
        StatusCode::NOT_FOUND,
    );
    assert_eq!(err["error"]["code"], "no_result");

    // The holder's valid result is still accepted afterwards.
    let _ = status_is(
        b.post("/audit-requests/auditreq_sw/result", &a, &result)
            .await,
        StatusCode::OK,
    );
    assert_eq!(b.count("audit_results", ""), 1);
    b.stop().await;
}

#[tokio::test]
async fn an_agent_that_gives_up_returns_the_task_and_after_max_attempts_it_fails() {
    let b = Bench::start(AuditConfig {
        max_attempts: 2,
        ..AuditConfig::default()
    })
    .await;
    let a = b.agent("audit:hardware-auditor-01").await;
    let (s, _) = b
        .post(
            "/audit-requests",
            &b.admin,
            &audit_request("auditreq_hw", "hardware", 75),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);

    let (s, _) = b
        .claim(&a, "audit:hardware-auditor-01", &["hardware"], 0)
        .await;
    assert_eq!(s, StatusCode::OK);
    let (_, r) = status_is(
        b.post(
            "/audit-requests/auditreq_hw/release",
            &a,
            &json!({ "reason": "serial console busy" }),
        )
        .await,
        StatusCode::OK,
    );
    assert_eq!(r["status"], "queued");
    assert_eq!(r["attempts"], 1);

    let (_, task) = status_is(
        b.claim(&a, "audit:hardware-auditor-01", &["hardware"], 0)
            .await,
        StatusCode::OK,
    );
    assert_eq!(task["claim"]["attempt"], 2);
    let retry = json!({
        "audit_request_id": "auditreq_hw",
        "audit_type": "hardware",
        "status": "needs_retry",
        "decision": "inconclusive",
        "confidence": 0.2,
        "summary": "device did not enumerate; power cycle needed",
        "duration_ms": 20000,
        "completed_at": "2026-11-30T03:29:22Z"
    });
    let (_, r) = status_is(
        b.post("/audit-requests/auditreq_hw/result", &a, &retry)
            .await,
        StatusCode::OK,
    );
    assert_eq!(r["status"], "failed");
    assert_eq!(r["result_status"], "needs_retry");
    assert!(
        r["failure_reason"].as_str().unwrap().contains("2 attempts"),
        "{r}"
    );

    let (s, _) = b
        .claim(&a, "audit:hardware-auditor-01", &["hardware"], 0)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let reasons: Vec<(String, String)> = b
        .audit_events()
        .into_iter()
        .filter(|(t, _, _)| t == "audit_task_released")
        .map(|(_, _, d)| {
            (
                d["reason"].as_str().unwrap().to_string(),
                d["request_status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [
            ("released_by_agent".to_string(), "queued".to_string()),
            ("needs_retry".to_string(), "failed".to_string())
        ]
    );
    b.stop().await;
}

#[tokio::test]
async fn requests_are_listed_by_filter_in_queue_order_with_pages() {
    let b = Bench::start(AuditConfig::default()).await;
    for (id, t, p) in [
        ("r1", "software", 65),
        ("r2", "hardware", 75),
        ("r3", "software", 90),
        ("r4", "multimodal", 70),
        ("r5", "software", 65),
    ] {
        let (s, _) = b
            .post("/audit-requests", &b.admin, &audit_request(id, t, p))
            .await;
        assert_eq!(s, StatusCode::CREATED);
    }
    let viewer = b.token(Role::Viewer, "dashboard").await;
    let ids = |v: &Value| -> Vec<String> {
        v["audit_requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r["request"]["audit_request_id"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let (_, all) = status_is(b.get("/audit-requests", &viewer).await, StatusCode::OK);
    assert_eq!(ids(&all), ["r3", "r2", "r4", "r1", "r5"]);
    let (_, sw) = b
        .get(
            "/audit-requests?audit_type=software&priority_max=80",
            &viewer,
        )
        .await;
    assert_eq!(ids(&sw), ["r1", "r5"]);
    assert_eq!(sw["total"], 2);
    let (_, page) = b.get("/audit-requests?limit=2&offset=2", &viewer).await;
    assert_eq!(ids(&page), ["r4", "r1"]);
    assert_eq!(page["total"], 5);
    let (_, newest) = b
        .get("/audit-requests?order=newest&priority_min=70", &viewer)
        .await;
    assert_eq!(ids(&newest), ["r4", "r3", "r2"]);
    let _ = status_is(
        b.get("/audit-requests?status=sleeping", &viewer).await,
        StatusCode::BAD_REQUEST,
    );
    let (_, crossed) = status_is(
        b.get("/audit-requests?priority_min=80&priority_max=20", &viewer)
            .await,
        StatusCode::BAD_REQUEST,
    );
    assert_eq!(crossed["error"]["code"], "invalid_query");
    assert_eq!(crossed["error"]["details"]["param"], "priority_min");
    let provider = b.token(Role::Provider, "provider-winlab-01").await;
    let (s, _) = b.get("/audit-requests", &provider).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    b.stop().await;
}

#[tokio::test]
async fn threads_register_once_update_in_place_and_page_their_messages() {
    let b = Bench::start(AuditConfig::default()).await;
    let op = b.token(Role::Operator, "lab-operator").await;
    let reg = json!({ "thread_ref": "mac-01:thread-ui-22", "node_id": "mac-01", "role": "ui", "labels": ["lab"] });
    let _ = status_is(b.post("/threads", &op, &reg).await, StatusCode::CREATED);
    let mut again = reg.clone();
    again["labels"] = json!(["lab", "device-station-a"]);
    let (_, t) = status_is(b.post("/threads", &op, &again).await, StatusCode::OK);
    assert_eq!(t["labels"], json!(["lab", "device-station-a"]));
    let mut wrong_node = reg.clone();
    wrong_node["node_id"] = json!("mac-02");
    let (_, err) = status_is(
        b.post("/threads", &op, &wrong_node).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(err["error"]["details"]["field"], "node_id");
    let (_, listed) = b.get("/threads?label=device-station-a", &op).await;
    assert_eq!(listed["threads"].as_array().unwrap().len(), 1);

    for i in 0..3 {
        let (_, m) = status_is(
            b.post(
                "/threads/mac-01:thread-ui-22/messages",
                &op,
                &json!({ "kind": "note", "body": { "n": i } }),
            )
            .await,
            StatusCode::CREATED,
        );
        assert_eq!(m["sender"], "lab-operator");
    }
    let (_, first) = b
        .get("/threads/mac-01:thread-ui-22/messages?limit=2", &op)
        .await;
    assert_eq!(first["messages"].as_array().unwrap().len(), 2);
    let after = first["next_after"].as_u64().unwrap();
    let (_, rest) = b
        .get(
            &format!("/threads/mac-01:thread-ui-22/messages?after={after}"),
            &op,
        )
        .await;
    let rest = rest["messages"].as_array().unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0]["body"]["n"], 2);
    let (s, _) = b
        .post(
            "/threads/mac-77:ghost/messages",
            &op,
            &json!({ "kind": "note" }),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, err) = status_is(
        b.post(
            "/threads/mac-01:thread-ui-22/messages",
            &op,
            &json!({ "kind": "note", "from_thread_ref": "mac-77:ghost" }),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(err["error"]["details"]["field"], "from_thread_ref");
    assert_eq!(b.count("inter_thread_messages", ""), 3);
    b.stop().await;
}

#[tokio::test]
async fn a_claim_waiting_for_work_answers_no_content_when_the_registry_shuts_down() {
    let b = Bench::start(AuditConfig::default()).await;
    let a = b.agent("audit:software-auditor-01").await;
    let (base, http) = (b.base.clone(), b.http.clone());
    let started = Instant::now();
    let waiting = tokio::spawn(async move {
        let resp = http
            .post(format!("{base}/audit-requests/claim"))
            .bearer_auth(&a)
            .json(&json!({ "audit_types": ["software"], "agent_ref": "audit:software-auditor-01", "wait_ms": 30000 }))
            .send()
            .await
            .unwrap();
        (resp.status(), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the claim waits for work");
    let _ = b.shutdown.send(true);
    let (status, waited) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(
        waited < Duration::from_secs(5),
        "answered at shutdown, not after wait_ms ({waited:?})"
    );
    b.stop().await;
}

#[tokio::test]
async fn a_requirement_no_registered_capability_can_serve_is_refused_at_creation() {
    let b = Bench::start(AuditConfig::default()).await;
    b.register_led_bench().await;
    // The bench's microphone is shared: an exclusive one is never there.
    b.leases
        .upsert_capability(CapabilityInfo {
            capability_id: "mic-01".to_string(),
            provider_id: "provider-winlab-01".to_string(),
            node_id: "win-gpu-02".to_string(),
            capability_type: CapabilityType::Microphone,
            tags: vec!["lab".to_string()],
            lease_mode: LeaseMode::SharedRead,
            preemptible: true,
            safety_locked: false,
            default_priority: 50,
            online: true,
            non_interruptible: false,
            maintenance: None,
            unhealthy: false,
            on_release: Vec::new(),
            check_failed: None,
        })
        .await;
    b.register_thread("mac-01:thread-ui-22", "ui").await;

    let mut req = led_request("auditreq_unmet", 60);
    req["capability_requirements"] = json!([
        { "capability_type": "camera", "mode": "exclusive" },
        { "capability_type": "microphone", "mode": "exclusive" },
        { "capability_type": "screen_capture", "mode": "exclusive" },
        { "capability_type": "speaker", "mode": "exclusive",
          "preferred_node_tags": ["rear"], "fallback_allowed": false }
    ]);
    let (_, body) = status_is(
        b.post("/audit-requests", &b.admin, &req).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(body["error"]["code"], "unsatisfiable_requirement", "{body}");
    let failing = body["error"]["details"]["requirements"].as_array().unwrap();
    let by_index: HashMap<u64, String> = failing
        .iter()
        .map(|f| {
            (
                f["requirement_index"].as_u64().unwrap(),
                f["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(by_index.len(), 3, "{body}");
    assert_eq!(
        by_index[&1],
        "no microphone offers exclusive; mic-01 is shared_read"
    );
    assert_eq!(by_index[&2], "no screen_capture is registered");
    assert!(by_index[&3].contains("[rear]"), "{}", by_index[&3]);
    assert!(by_index[&3].contains("spk-01 has [lab, device-station-a]"));
    // Nothing was stored.
    let (s, _) = b.get("/audit-requests/auditreq_unmet", &b.admin).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(b.audit_events().is_empty());

    // Asking for what the bench has is accepted, even while its provider
    // is offline (it may come back).
    b.leases
        .set_provider_online("provider-winlab-01", false)
        .await;
    req["capability_requirements"][1]["mode"] = json!("shared_read");
    req["capability_requirements"] = json!([req["capability_requirements"][1].clone()]);
    let (_, record) = status_is(
        b.post("/audit-requests", &b.admin, &req).await,
        StatusCode::CREATED,
    );
    assert_eq!(record["status"], "queued", "{record}");
    assert_eq!(
        record["waiting_on"],
        json!(["requirement 0 (microphone, shared_read): mic-01 offline"]),
        "{record}"
    );
    b.stop().await;
}

#[tokio::test]
async fn the_creator_cancels_a_queued_request_and_a_claimed_one_is_refused() {
    let b = Bench::start(AuditConfig::default()).await;
    b.led_bench_with_tasks(&[], 60).await;
    let creator = b.token(Role::Operator, "release-manager").await;
    let other = b.token(Role::Operator, "someone-else").await;
    for id in ["auditreq_cancel", "auditreq_busy"] {
        let _ = status_is(
            b.post("/audit-requests", &creator, &led_request(id, 60))
                .await,
            StatusCode::CREATED,
        );
    }

    // Someone else may not cancel it.
    let (_, body) = status_is(
        b.post("/audit-requests/auditreq_cancel/cancel", &other, &json!({}))
            .await,
        StatusCode::FORBIDDEN,
    );
    assert_eq!(body["error"]["code"], "forbidden", "{body}");

    let (_, record) = status_is(
        b.post(
            "/audit-requests/auditreq_cancel/cancel",
            &creator,
            &json!({ "reason": "firmware withdrawn" }),
        )
        .await,
        StatusCode::OK,
    );
    assert_eq!(record["status"], "failed", "{record}");
    assert_eq!(
        record["failure_reason"],
        "cancelled by release-manager: firmware withdrawn"
    );
    let cancelled: Vec<_> = b
        .audit_events()
        .into_iter()
        .filter(|(t, id, d)| {
            t == "audit_task_released" && id == "auditreq_cancel" && d["reason"] == "cancelled"
        })
        .collect();
    assert_eq!(cancelled.len(), 1, "{:?}", b.audit_events());

    // The cancelled one is never claimed; the other is, and is then not
    // cancellable (its holder or an admin releases it first).
    let agent = b.agent("audit:multimodal-auditor-01").await;
    let (_, claim) = status_is(
        b.post(
            "/audit-requests/claim",
            &agent,
            &json!({ "audit_types": ["multimodal"], "agent_ref": "audit:multimodal-auditor-01", "wait_ms": 0 }),
        )
        .await,
        StatusCode::OK,
    );
    assert_eq!(claim["claim"]["audit_request_id"], "auditreq_busy");
    let (_, body) = status_is(
        b.post("/audit-requests/auditreq_busy/cancel", &b.admin, &json!({}))
            .await,
        StatusCode::CONFLICT,
    );
    assert_eq!(body["error"]["code"], "not_queued", "{body}");
    assert_eq!(body["error"]["details"]["status"], "claimed", "{body}");
    // A final one neither.
    let (_, body) = status_is(
        b.post(
            "/audit-requests/auditreq_cancel/cancel",
            &creator,
            &json!({}),
        )
        .await,
        StatusCode::CONFLICT,
    );
    assert_eq!(body["error"]["details"]["status"], "failed", "{body}");
    b.stop().await;
}

#[tokio::test]
async fn a_queued_request_says_what_each_requirement_waits_on() {
    let b = Bench::start(AuditConfig::default()).await;
    b.led_bench_with_tasks(&["auditreq_a", "auditreq_b"], 60)
        .await;
    let waits = |record: &Value| -> Vec<String> {
        record["waiting_on"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (_, record) = status_is(
        b.get("/audit-requests/auditreq_b", &b.admin).await,
        StatusCode::OK,
    );
    assert_eq!(waits(&record), ["no agent has claimed it yet"], "{record}");

    let agent = b.agent("audit:multimodal-auditor-01").await;
    let (_, claim) = status_is(
        b.post(
            "/audit-requests/claim",
            &agent,
            &json!({ "audit_types": ["multimodal"], "agent_ref": "audit:multimodal-auditor-01", "wait_ms": 0 }),
        )
        .await,
        StatusCode::OK,
    );
    assert_eq!(claim["claim"]["audit_request_id"], "auditreq_a");
    let mic_lease = claim["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["capability_id"] == "mic-01")
        .map(|a| a["lease_id"].as_str().unwrap().to_string())
        .unwrap();
    let (_, record) = status_is(
        b.get("/audit-requests/auditreq_b", &b.admin).await,
        StatusCode::OK,
    );
    let lines = waits(&record);
    assert_eq!(lines.len(), 4, "{record}");
    let mic = lines
        .iter()
        .find(|l| l.starts_with("requirement 2 (microphone, exclusive): mic-01 held by lease "))
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert!(mic.contains(&mic_lease), "{mic}");
    assert!(
        mic.contains("(audit:multimodal-auditor-01) until "),
        "{mic}"
    );
    // The listing says the same.
    let (_, page) = status_is(
        b.get("/audit-requests?status=queued", &b.admin).await,
        StatusCode::OK,
    );
    assert_eq!(waits(&page["audit_requests"][0]), lines, "{page}");

    b.leases
        .set_provider_online("provider-winlab-01", false)
        .await;
    let (_, record) = status_is(
        b.get("/audit-requests/auditreq_b", &b.admin).await,
        StatusCode::OK,
    );
    assert!(
        waits(&record)
            .iter()
            .any(|l| l == "requirement 0 (camera, exclusive): cam-front-01 offline"),
        "{record}"
    );
    b.stop().await;
}

#[tokio::test]
async fn a_result_naming_unknown_artifacts_is_refused_with_every_unknown_id() {
    let b = Bench::start(AuditConfig::default()).await;
    b.led_bench_with_tasks(&["auditreq_art"], 60).await;
    let agent = b.agent("audit:multimodal-auditor-01").await;
    let (_, claim) = status_is(
        b.post(
            "/audit-requests/claim",
            &agent,
            &json!({ "audit_types": ["multimodal"], "agent_ref": "audit:multimodal-auditor-01", "wait_ms": 0 }),
        )
        .await,
        StatusCode::OK,
    );
    let used: Vec<String> = claim["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["capability_id"].as_str().unwrap().to_string())
        .collect();
    let mut result = led_result("auditreq_art", &used);
    result["artifact_refs"] = json!(["art_clip_wake", "art_missing_1"]);
    result["findings"][0]["evidence_ref_ids"] = json!(["art_frame_2700ms", "art_missing_2"]);
    let (_, body) = status_is(
        b.post("/audit-requests/auditreq_art/result", &agent, &result)
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(body["error"]["details"]["field"], "artifact_refs", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("`art_missing_1` (artifact_refs)"),
        "{message}"
    );
    assert!(
        message.contains("`art_missing_2` (findings[0].evidence_ref_ids)"),
        "{message}"
    );
    assert!(!message.contains("art_clip_wake"), "{message}");
    // Nothing stored; the claim still holds and a correct result passes.
    let (s, _) = b.get("/audit-requests/auditreq_art/result", &b.admin).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let _ = status_is(
        b.post(
            "/audit-requests/auditreq_art/result",
            &agent,
            &led_result("auditreq_art", &used),
        )
        .await,
        StatusCode::OK,
    );
    b.stop().await;
}

#[tokio::test]
async fn a_chief_result_with_several_field_errors_gets_them_all_in_one_answer() {
    let b = Bench::start(AuditConfig::default()).await;
    b.led_bench_with_tasks(&["auditreq_dep"], 60).await;
    let mm = b.agent("audit:multimodal-auditor-01").await;
    let (_, claim) = status_is(
        b.post(
            "/audit-requests/claim",
            &mm,
            &json!({ "audit_types": ["multimodal"], "agent_ref": "audit:multimodal-auditor-01", "wait_ms": 0 }),
        )
        .await,
        StatusCode::OK,
    );
    let used: Vec<String> = claim["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["capability_id"].as_str().unwrap().to_string())
        .collect();
    let _ = status_is(
        b.post(
            "/audit-requests/auditreq_dep/result",
            &mm,
            &led_result("auditreq_dep", &used),
        )
        .await,
        StatusCode::OK,
    );
    let mut req = led_request("auditreq_chief_errs", 60);
    req["audit_type"] = json!("chief");
    req["capability_requirements"] = json!([]);
    req["depends_on"] = json!(["auditreq_dep"]);
    let _ = status_is(
        b.post("/audit-requests", &b.admin, &req).await,
        StatusCode::CREATED,
    );
    let chief = b.agent("audit:chief-auditor-01").await;
    let _ = status_is(
        b.post(
            "/audit-requests/claim",
            &chief,
            &json!({ "audit_types": ["chief"], "agent_ref": "audit:chief-auditor-01", "wait_ms": 0 }),
        )
        .await,
        StatusCode::OK,
    );
    let mut result = led_result("auditreq_chief_errs", &[]);
    result["audit_type"] = json!("chief");
    for k in [
        "observed_timeline",
        "visual_mismatches",
        "perceptual_verdict",
        "audio_mismatches",
        "interaction_failures",
        "frame_refs",
        "needs_human_review_reason",
    ] {
        result.as_object_mut().unwrap().remove(k);
    }
    // Three mistakes at once: no final_decision, an unknown handoff
    // target, an artifact nobody uploaded.
    result["overall_risk_level"] = json!("high");
    result["handoff_target"] = json!("mac-02:thread-nowhere");
    result["artifact_refs"] = json!(["art_clip_wake", "art_never_uploaded"]);
    let (_, body) = status_is(
        b.post(
            "/audit-requests/auditreq_chief_errs/result",
            &chief,
            &result,
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(body["error"]["code"], "invalid_field", "{body}");
    let fields: Vec<&str> = body["error"]["details"]["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        ["final_decision", "artifact_refs", "handoff_target"],
        "{body}"
    );
    assert_eq!(body["error"]["details"]["field"], "final_decision");
    // Fixing all three at once is accepted.
    b.register_thread("mac-02:thread-nowhere", "release").await;
    result["final_decision"] = json!("rejected");
    result["artifact_refs"] = json!(["art_clip_wake"]);
    let _ = status_is(
        b.post(
            "/audit-requests/auditreq_chief_errs/result",
            &chief,
            &result,
        )
        .await,
        StatusCode::OK,
    );
    b.stop().await;
}
