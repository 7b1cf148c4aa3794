//! Actions on leased hardware, sessions and artifacts against an in-process
//! registry with its embedded broker. The provider side is a real MQTT
//! client: it receives `action_invoke` on its commands topic, answers with
//! `session_update` on its results topic, and PUTs artifact bytes over
//! HTTP, as the edge daemon does.
//!
//! Artifact bytes that no artifact binds are deleted after
//! `sessions.unbound_upload_ttl_seconds`; bytes bound to an artifact (also
//! when they arrived first, and when another upload shares them) stay;
//! `sessions.max_unbound_bytes_per_provider` limits what a provider may
//! hold unbound.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use benchlink_testkit::sha256_hex;
use benchlink_testkit::status_is;
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use shared_protocol::api::Role;
use shared_protocol::mqtt::{ActionCommand, Envelope, MessageType, TopicKind};
use tempfile::TempDir;

const PREFIX: &str = "benchlink/v1";
const PROVIDER: &str = "bench-a";
const AGENT: &str = "audit:hw-01";
const OTHER_AGENT: &str = "audit:hw-02";

/// A registry, one provider connected over MQTT with a camera, a thumb
/// robot and a serial console, and tokens for two audit agents.
struct Bench {
    _dir: TempDir,
    reg: cloud_registry::app::RunningRegistry,
    api: Api,
    provider: TestProvider,
    provider_token: String,
    agent: String,
    other_agent: String,
    admin: String,
}

fn capabilities() -> Value {
    json!([
        {
            "capability_id": "cam-1",
            "capability_type": "camera",
            "display_name": "bench camera",
            "lease_mode": "exclusive",
            "preemptible": true,
            "supported_actions": ["snapshot", "record_clip"],
            "evidence_modes": ["image", "video_clip"]
        },
        {
            "capability_id": "robot-1",
            "capability_type": "thumb_robot",
            "display_name": "thumb robot",
            "lease_mode": "exclusive",
            "preemptible": true,
            "supported_actions": ["tap", "drag"]
        },
        {
            "capability_id": "console-1",
            "capability_type": "serial_port",
            "display_name": "DUT console",
            "lease_mode": "exclusive",
            "preemptible": true,
            "supported_actions": ["write", "expect_pattern", "capture_log"],
            "evidence_modes": ["serial_log"]
        }
    ])
}

impl Bench {
    async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    async fn start_with(tune: impl FnOnce(&mut cloud_registry::config::Config)) -> Self {
        let dir = TempDir::new().unwrap();
        let mut cfg = test_config(&dir);
        cfg.leases.default_grace_period_seconds = 1;
        cfg.leases.sweep_interval_ms = 50;
        tune(&mut cfg);
        let reg = start(cfg).await;
        let api = Api::new(&reg.base_url());
        let provider_token = reg
            .auth
            .create_token(Role::Provider, PROVIDER)
            .await
            .unwrap();
        let agent = reg
            .auth
            .create_token(Role::AuditAgent, AGENT)
            .await
            .unwrap();
        let other_agent = reg
            .auth
            .create_token(Role::AuditAgent, OTHER_AGENT)
            .await
            .unwrap();
        let admin = reg.admin_token.clone().unwrap();
        let addr = reg.mqtt_addr;
        let mut provider = TestProvider::connect(
            &addr.ip().to_string(),
            addr.port(),
            PREFIX,
            PROVIDER,
            PROVIDER,
            Some((PROVIDER, &provider_token)),
        )
        .await;
        let mut p = provider_body(PROVIDER);
        p["boot_id"] = json!("boot-1");
        provider
            .publish(
                PROVIDER,
                TopicKind::Register,
                MessageType::Register,
                &json!({ "provider": p, "capabilities": capabilities() }),
            )
            .await;
        let ack = provider
            .next_of(MessageType::RegisterAck, Duration::from_secs(5))
            .await
            .expect("register_ack");
        assert_eq!(ack.body["accepted"], true, "{}", ack.body);
        Bench {
            _dir: dir,
            reg,
            api,
            provider,
            provider_token,
            agent,
            other_agent,
            admin,
        }
    }

    /// A lease on `capability_id` for `holder` (its token), granted at once.
    async fn lease(&self, token: &str, holder: &str, capability_id: &str, priority: u8) -> String {
        let (_, body) = status_is(
            self.api
                .request_lease(
                    token,
                    &json!({
                        "capability_id": capability_id,
                        "holder_type": "audit_agent",
                        "holder_ref": holder,
                        "project_id": "proj_device_assistant",
                        "purpose": "exercise the bench",
                        "priority": priority,
                        "requested_duration_seconds": 300,
                        "evidence_required": true
                    }),
                )
                .await,
            StatusCode::CREATED,
        );
        body["lease_id"].as_str().unwrap().to_string()
    }

    /// Release `lease_id` as `token`'s holder: 200.
    async fn release(&self, token: &str, lease_id: &str) {
        let _ = status_is(
            self.api
                .lease_post(token, lease_id, "release", &json!({}))
                .await,
            StatusCode::OK,
        );
    }

    /// Invoke an action in the background; the answer comes from the task.
    fn invoke(
        &self,
        token: &str,
        lease_id: &str,
        body: Value,
    ) -> tokio::task::JoinHandle<(StatusCode, Value)> {
        let api = self.api.clone();
        let (token, lease_id) = (token.to_string(), lease_id.to_string());
        tokio::spawn(async move { api.lease_post(&token, &lease_id, "actions", &body).await })
    }

    /// The first agent leases `capability_id` (priority 60) and starts the
    /// action `body` on it in the background: the lease id, the command
    /// the provider got, and the call ([`Bench::invoke`]).
    async fn act(
        &mut self,
        capability_id: &str,
        body: Value,
    ) -> (
        String,
        ActionCommand,
        tokio::task::JoinHandle<(StatusCode, Value)>,
    ) {
        let lease = self.lease(&self.agent, AGENT, capability_id, 60).await;
        let call = self.invoke(&self.agent, &lease, body);
        (lease, self.next_command().await, call)
    }

    /// The next `action_invoke` the provider receives.
    async fn next_command(&mut self) -> ActionCommand {
        let env = self
            .provider
            .next_of(MessageType::ActionInvoke, Duration::from_secs(5))
            .await
            .expect("action_invoke on the commands topic");
        serde_json::from_value(env.body).expect("ActionCommand body")
    }

    /// Publish a `session_update` as the provider.
    async fn report(&self, cmd: &ActionCommand, status: &str, extra: Value) {
        let mut body = json!({
            "session_id": cmd.session_id,
            "capability_id": cmd.capability_id,
            "status": status,
            "occurred_at": chrono::Utc::now(),
        });
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        self.provider
            .publish(
                PROVIDER,
                TopicKind::Results,
                MessageType::SessionUpdate,
                &body,
            )
            .await;
    }

    /// The provider reports `cmd` `completed` with `extra` (e.g. its
    /// `result_summary` and `artifacts`); the action's `call` must answer
    /// a `completed` session, which is returned.
    async fn complete(
        &self,
        cmd: &ActionCommand,
        call: tokio::task::JoinHandle<(StatusCode, Value)>,
        extra: Value,
    ) -> Value {
        self.report(cmd, "completed", extra).await;
        let (_, session) = call.await.unwrap();
        assert_eq!(session["status"], "completed", "{session}");
        session
    }

    async fn put_bytes(
        &self,
        token: &str,
        artifact_id: &str,
        checksum: &str,
        bytes: &[u8],
    ) -> (StatusCode, Value) {
        let resp = self
            .api
            .http
            .put(format!(
                "{}/api/v1/artifacts/{artifact_id}/content",
                self.api.base
            ))
            .bearer_auth(token)
            .header("X-Checksum-Sha256", checksum)
            .header("content-type", "image/jpeg")
            .body(bytes.to_vec())
            .send()
            .await
            .expect("PUT sent");
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Lease the camera and start a snapshot in the background; returns
    /// the command the provider got and the call, which answers once the
    /// session ends.
    async fn snapshot(&mut self) -> (ActionCommand, tokio::task::JoinHandle<(StatusCode, Value)>) {
        let lease = self.lease(&self.agent, AGENT, "cam-1", 50).await;
        let call = self.invoke(
            &self.agent,
            &lease,
            json!({"action": "snapshot", "wait_ms": 10000}),
        );
        (self.next_command().await, call)
    }

    /// PUT `bytes` as the provider, with their sha256.
    async fn put(&self, artifact_id: &str, bytes: &[u8]) -> (StatusCode, Value) {
        self.put_bytes(&self.provider_token, artifact_id, &sha256_hex(bytes), bytes)
            .await
    }

    /// The bytes of an artifact as the first agent downloads them.
    async fn download(&self, artifact_id: &str) -> (StatusCode, Vec<u8>) {
        let resp = self
            .api
            .http
            .get(format!(
                "{}/api/v1/artifacts/{artifact_id}/content",
                self.api.base
            ))
            .bearer_auth(&self.agent)
            .send()
            .await
            .unwrap();
        (resp.status(), resp.bytes().await.unwrap().to_vec())
    }

    /// Where the registry keeps a blob of `bytes` (the default
    /// `artifact_dir`, `artifacts` next to the SQLite file).
    fn blob_file(&self, bytes: &[u8]) -> PathBuf {
        let sum = sha256_hex(bytes);
        self._dir
            .path()
            .join("artifacts")
            .join("sha256")
            .join(&sum[..2])
            .join(&sum[2..])
    }

    /// Wait until `n` upload bodies are being received (staged files in
    /// the artifact store's `staging` directory): their checks have passed.
    async fn wait_staged(&self, n: usize) {
        let dir = self._dir.path().join("artifacts").join("staging");
        for _ in 0..500 {
            let staged = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
            if staged >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no upload body arrived in {}", dir.display());
    }

    async fn sessions_of(&self, lease_id: &str) -> Vec<Value> {
        let (_, body) = status_is(
            self.api
                .get(
                    &format!("/api/v1/capability-leases/{lease_id}/sessions"),
                    Some(&self.admin),
                )
                .await,
            StatusCode::OK,
        );
        body["sessions"].as_array().cloned().unwrap_or_default()
    }

    async fn running_sessions(&self) -> Vec<Value> {
        let (_, body) = status_is(
            self.api
                .get("/api/v1/sessions?status=running", Some(&self.admin))
                .await,
            StatusCode::OK,
        );
        body["sessions"].as_array().cloned().unwrap_or_default()
    }

    async fn session(&self, session_id: &str) -> Value {
        let (_, body) = status_is(
            self.api
                .get(&format!("/api/v1/sessions/{session_id}"), Some(&self.agent))
                .await,
            StatusCode::OK,
        );
        body
    }

    async fn events_of(&self, event_type: &str) -> Vec<Value> {
        self.reg
            .bus
            .replay(0, 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.event_type.as_str() == event_type)
            .map(|e| serde_json::to_value(e).unwrap())
            .collect()
    }
}

/// Artifact metadata as the edge sends it in a session update.
fn artifact_meta(artifact_id: &str, session_id: &str, bytes: &[u8]) -> Value {
    json!({
        "artifact_id": artifact_id,
        "session_id": session_id,
        "artifact_type": "image",
        "storage_uri": format!("edge-outbox://{PROVIDER}/{artifact_id}"),
        "content_type": "image/jpeg",
        "captured_at": chrono::Utc::now(),
        "duration_ms": null,
        "checksum": sha256_hex(bytes),
        "size_bytes": bytes.len(),
        "metadata_json": {"width": 640, "height": 480}
    })
}

/// `n` bytes after a JPEG start marker; different `n`, different bytes.
fn jpeg_like(n: usize) -> Vec<u8> {
    let mut v = vec![0xFF, 0xD8, 0xFF, 0xE0];
    v.extend((0..n).map(|i| (i * 7 % 251) as u8));
    v
}

#[tokio::test]
async fn an_action_on_a_held_lease_completes_with_the_driver_result_and_its_evidence_downloads_intact(
) {
    let mut b = Bench::start().await;
    let (lease, cmd, call) = b
        .act(
            "cam-1",
            json!({"action": "snapshot", "params": {"format": "jpeg"}, "wait_ms": 5000}),
        )
        .await;
    assert_eq!(cmd.lease_id, lease);
    assert_eq!(cmd.capability_id, "cam-1");
    assert_eq!(cmd.params["format"], "jpeg");
    assert_eq!(cmd.timeout_ms, 30_000, "the default driver deadline");

    let bytes = jpeg_like(300_000);
    let artifact_id = format!("art_{}", &cmd.session_id[5..]);
    b.report(&cmd, "running", json!({})).await;
    b.report(
        &cmd,
        "completed",
        json!({
            "result_summary": {"width": 640, "height": 480},
            "artifacts": [artifact_meta(&artifact_id, &cmd.session_id, &bytes)]
        }),
    )
    .await;
    let (_, session) = status_is(call.await.unwrap(), StatusCode::OK);
    assert_eq!(session["status"], "completed");
    assert_eq!(session["result_summary"]["width"], 640);
    assert_eq!(session["input_summary"]["format"], "jpeg");
    assert_eq!(session["artifact_refs"], json!([artifact_id]));
    assert!(session["ended_at"].is_string());
    // The waited answer reads as the stored session does, to the digit
    // (the provider's time has nanoseconds; the store keeps microseconds).
    let stored = b.session(&cmd.session_id).await;
    assert_eq!(stored["started_at"], session["started_at"]);
    assert_eq!(stored["ended_at"], session["ended_at"]);

    // Metadata first, bytes after: the usual order.
    let (_, meta) = status_is(
        b.api
            .get(&format!("/api/v1/artifacts/{artifact_id}"), Some(&b.agent))
            .await,
        StatusCode::OK,
    );
    assert_eq!(meta["uploaded"], false);
    let (_, body) = status_is(
        b.put_bytes(&b.provider_token, &artifact_id, &sha256_hex(&bytes), &bytes)
            .await,
        StatusCode::CREATED,
    );
    assert_eq!(body["checksum"], sha256_hex(&bytes));
    assert_eq!(body["uploaded"], true);
    assert_eq!(
        body["storage_uri"],
        format!("/api/v1/artifacts/{artifact_id}/content")
    );

    let resp = b
        .api
        .http
        .get(format!(
            "{}/api/v1/artifacts/{artifact_id}/content",
            b.api.base
        ))
        .bearer_auth(&b.agent)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "image/jpeg");
    assert_eq!(
        resp.headers()["x-checksum-sha256"],
        sha256_hex(&bytes).as_str()
    );
    assert_eq!(
        resp.headers()["content-length"],
        bytes.len().to_string().as_str()
    );
    let downloaded = resp.bytes().await.unwrap();
    assert_eq!(
        sha256_hex(&downloaded),
        sha256_hex(&bytes),
        "the bytes hash to what the edge computed"
    );

    let started = b.events_of("session_started").await;
    let completed = b.events_of("session_completed").await;
    let uploaded = b.events_of("artifact_uploaded").await;
    assert_eq!(started.len(), 1);
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0]["session_id"], cmd.session_id);
    assert_eq!(uploaded.len(), 1);
    assert_eq!(uploaded[0]["artifact_id"], artifact_id);
    let lease_now = b.api.lease(&b.agent, &lease).await.1;
    assert_eq!(lease_now["status"], "active", "the first action activates");
    b.reg.shutdown().await;
}

#[tokio::test]
async fn an_upload_whose_bytes_do_not_match_the_declared_sha256_is_refused_and_nothing_is_stored() {
    let mut b = Bench::start().await;
    let (_, cmd, call) = b
        .act("cam-1", json!({"action": "snapshot", "wait_ms": 5000}))
        .await;
    let bytes = jpeg_like(10_000);
    b.complete(
        &cmd,
        call,
        json!({"artifacts": [artifact_meta("art-mismatch", &cmd.session_id, &bytes)]}),
    )
    .await;

    // The bytes were damaged on the way: the header says one thing, the
    // body hashes to another.
    let mut damaged = bytes.clone();
    damaged[5000] ^= 0x55;
    let r = b
        .put_bytes(
            &b.provider_token,
            "art-mismatch",
            &sha256_hex(&bytes),
            &damaged,
        )
        .await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "checksum_mismatch");
    assert_eq!(r.1["error"]["details"]["expected"], sha256_hex(&bytes));
    assert_eq!(r.1["error"]["details"]["actual"], sha256_hex(&damaged));

    // A header that disagrees with the recorded metadata is refused too.
    let r = b
        .put_bytes(
            &b.provider_token,
            "art-mismatch",
            &sha256_hex(&damaged),
            &damaged,
        )
        .await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "checksum_mismatch");

    let r = b
        .api
        .get("/api/v1/artifacts/art-mismatch/content", Some(&b.agent))
        .await;
    assert_error(&r, StatusCode::CONFLICT, "artifact_not_uploaded");
    let blobs = b._dir.path().join("artifacts");
    for sum in [sha256_hex(&bytes), sha256_hex(&damaged)] {
        assert!(
            !blobs
                .join("sha256")
                .join(&sum[..2])
                .join(&sum[2..])
                .exists(),
            "nothing stored for {sum}"
        );
    }
    assert_eq!(
        std::fs::read_dir(blobs.join("staging")).unwrap().count(),
        0,
        "no staging leftovers"
    );
    assert!(b.events_of("artifact_uploaded").await.is_empty());
    b.reg.shutdown().await;
}

#[tokio::test]
async fn repeating_an_upload_answers_200_with_the_same_record() {
    let mut b = Bench::start().await;
    let (_, cmd, call) = b
        .act(
            "console-1",
            json!({"action": "capture_log", "params": {"duration_ms": 100}, "wait_ms": 5000}),
        )
        .await;
    let bytes = b"[    0.000000] Booting Linux on physical CPU 0x0\n".repeat(200);
    let mut meta = artifact_meta("art-log-1", &cmd.session_id, &bytes);
    meta["artifact_type"] = json!("serial_log");
    meta["content_type"] = json!("text/plain");
    b.report(&cmd, "completed", json!({"artifacts": [meta]}))
        .await;
    call.await.unwrap();

    let sum = sha256_hex(&bytes);
    let first = b
        .put_bytes(&b.provider_token, "art-log-1", &sum, &bytes)
        .await;
    assert_eq!(first.0, StatusCode::CREATED, "{}", first.1);
    let again = b
        .put_bytes(&b.provider_token, "art-log-1", &sum, &bytes)
        .await;
    assert_eq!(again.0, StatusCode::OK, "{}", again.1);
    assert_eq!(first.1, again.1, "the same record both times");
    assert_eq!(b.events_of("artifact_uploaded").await.len(), 1);

    // Another provider may not upload (or overwrite) this artifact.
    let intruder = b
        .reg
        .auth
        .create_token(Role::Provider, "bench-b")
        .await
        .unwrap();
    let r = b.put_bytes(&intruder, "art-log-1", &sum, &bytes).await;
    assert_error(&r, StatusCode::FORBIDDEN, "not_artifact_owner");
    // And an audit agent token cannot upload at all.
    let r = b.put_bytes(&b.agent, "art-log-1", &sum, &bytes).await;
    assert_error(&r, StatusCode::FORBIDDEN, "forbidden");
    b.reg.shutdown().await;
}

#[tokio::test]
async fn bytes_that_arrive_before_their_metadata_are_bound_when_it_arrives() {
    let mut b = Bench::start().await;
    let (_, cmd, call) = b
        .act("cam-1", json!({"action": "snapshot", "wait_ms": 5000}))
        .await;
    let bytes = jpeg_like(50_000);
    let sum = sha256_hex(&bytes);

    // The upload overtakes the session update.
    let r = status_is(
        b.put_bytes(&b.provider_token, "art-early", &sum, &bytes)
            .await,
        StatusCode::CREATED,
    );
    assert_eq!(r.1["checksum"], sum);
    assert_eq!(r.1["metadata_received"], false);
    let r = b
        .api
        .get("/api/v1/artifacts/art-early", Some(&b.agent))
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, "not_found");

    b.complete(
        &cmd,
        call,
        json!({"artifacts": [artifact_meta("art-early", &cmd.session_id, &bytes)]}),
    )
    .await;
    let meta = eventually(Duration::from_secs(5), "artifact bound", || async {
        let (s, m) = b
            .api
            .get("/api/v1/artifacts/art-early", Some(&b.agent))
            .await;
        (s == StatusCode::OK && m["uploaded"] == true).then_some(m)
    })
    .await;
    assert_eq!(meta["storage_uri"], "/api/v1/artifacts/art-early/content");
    let got = b
        .api
        .http
        .get(format!("{}/api/v1/artifacts/art-early/content", b.api.base))
        .bearer_auth(&b.agent)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(sha256_hex(&got), sum);
    assert_eq!(b.events_of("artifact_uploaded").await.len(), 1);
    b.reg.shutdown().await;
}

#[tokio::test]
async fn an_action_on_a_lease_the_caller_does_not_hold_is_refused_and_starts_nothing() {
    let mut b = Bench::start().await;
    let lease = b.lease(&b.agent, AGENT, "cam-1", 60).await;
    let r = b
        .invoke(
            &b.other_agent,
            &lease,
            json!({"action": "snapshot", "wait_ms": 1000}),
        )
        .await
        .unwrap();
    assert_error(&r, StatusCode::FORBIDDEN, "not_lease_holder");
    assert_eq!(r.1["error"]["details"]["lease_id"], lease);
    assert!(b.sessions_of(&lease).await.is_empty(), "no session stored");
    assert!(
        b.provider
            .next_of(MessageType::ActionInvoke, Duration::from_millis(300))
            .await
            .is_none(),
        "nothing was sent to the provider"
    );
    let r = b
        .invoke(
            &b.agent,
            "lease_does_not_exist",
            json!({"action": "snapshot"}),
        )
        .await
        .unwrap();
    assert_error(&r, StatusCode::NOT_FOUND, "not_found");
    b.reg.shutdown().await;
}

#[tokio::test]
async fn an_unsupported_action_is_refused_naming_the_action_field() {
    let mut b = Bench::start().await;
    let lease = b.lease(&b.agent, AGENT, "cam-1", 60).await;
    // `tap` is a thumb robot's action, not a camera's.
    let r = b
        .invoke(
            &b.agent,
            &lease,
            json!({"action": "tap", "params": {"x_mm": 1}}),
        )
        .await
        .unwrap();
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "unsupported_action");
    assert_eq!(r.1["error"]["details"]["field"], "action");
    assert_eq!(
        r.1["error"]["details"]["supported_actions"],
        json!(["snapshot", "record_clip"])
    );
    // Not an action at all.
    let r = b
        .invoke(&b.agent, &lease, json!({"action": "self_destruct"}))
        .await
        .unwrap();
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert_eq!(r.1["error"]["details"]["field"], "action");
    // A capability the lease does not cover.
    let r = b
        .invoke(
            &b.agent,
            &lease,
            json!({"action": "snapshot", "capability_id": "robot-1"}),
        )
        .await
        .unwrap();
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert_eq!(r.1["error"]["details"]["field"], "capability_id");
    assert!(b.sessions_of(&lease).await.is_empty());
    assert!(b
        .provider
        .next_of(MessageType::ActionInvoke, Duration::from_millis(300))
        .await
        .is_none());
    let lease_now = b.api.lease(&b.agent, &lease).await.1;
    assert_eq!(
        lease_now["status"], "granted",
        "a refused action does not activate"
    );
    b.reg.shutdown().await;
}

#[tokio::test]
async fn an_action_on_an_offline_provider_is_refused_and_leaves_no_session_running() {
    let b = Bench::start().await;
    let lease = b.lease(&b.agent, AGENT, "cam-1", 60).await;
    // The provider's connection dies; its last will marks it offline.
    b.provider
        .publish(
            PROVIDER,
            TopicKind::Status,
            MessageType::Status,
            &json!({"provider_id": PROVIDER, "online_status": "offline", "boot_id": "boot-1"}),
        )
        .await;
    eventually(Duration::from_secs(5), "provider offline", || async {
        let (_, p) = b
            .api
            .get(
                &format!("/api/v1/capability-providers/{PROVIDER}"),
                Some(&b.admin),
            )
            .await;
        (p["online_status"] == "offline").then_some(())
    })
    .await;
    let r = b
        .invoke(
            &b.agent,
            &lease,
            json!({"action": "snapshot", "wait_ms": 2000}),
        )
        .await
        .unwrap();
    assert_error(&r, StatusCode::SERVICE_UNAVAILABLE, "provider_offline");
    assert_eq!(r.1["error"]["details"]["provider_id"], PROVIDER);
    assert!(b.sessions_of(&lease).await.is_empty());
    assert!(b.running_sessions().await.is_empty());
    b.reg.shutdown().await;
}

#[tokio::test]
async fn a_provider_going_offline_mid_session_ends_its_sessions_failed_or_incomplete_evidence() {
    let mut b = Bench::start().await;
    let cam = b.lease(&b.agent, AGENT, "cam-1", 60).await;
    let console = b.lease(&b.agent, AGENT, "console-1", 60).await;
    let robot = b.lease(&b.agent, AGENT, "robot-1", 60).await;

    // 1: a long clip, still running, no evidence reported yet.
    let clip = b.invoke(
        &b.agent,
        &cam,
        json!({"action": "record_clip", "params": {"duration_ms": 60000}}),
    );
    let clip_cmd = b.next_command().await;
    assert_eq!(clip.await.unwrap().0, StatusCode::ACCEPTED);
    b.report(&clip_cmd, "running", json!({})).await;
    // 2: a capture that completed, its log still uploading.
    let log = b.invoke(
        &b.agent,
        &console,
        json!({"action": "capture_log", "wait_ms": 5000}),
    );
    let log_cmd = b.next_command().await;
    let log_bytes = b"login: ".repeat(100);
    b.complete(
        &log_cmd,
        log,
        json!({"artifacts": [artifact_meta("art-log", &log_cmd.session_id, &log_bytes)]}),
    )
    .await;
    // 3: a tap that completed with no evidence: not touched.
    let tap = b.invoke(
        &b.agent,
        &robot,
        json!({"action": "tap", "params": {"x_mm": 10, "y_mm": 20}, "wait_ms": 5000}),
    );
    let tap_cmd = b.next_command().await;
    b.complete(&tap_cmd, tap, json!({"result_summary": {"pressed": true}}))
        .await;

    // The bench drops off the network (its last will).
    b.provider.task.abort();
    let clip_now = eventually(Duration::from_secs(10), "clip session ended", || async {
        let s = b.session(&clip_cmd.session_id).await;
        (s["status"] != "running").then_some(s)
    })
    .await;
    assert_eq!(clip_now["status"], "failed", "{clip_now}");
    assert!(
        clip_now["error_message"]
            .as_str()
            .unwrap()
            .contains("went offline"),
        "{clip_now}"
    );
    let log_now = b.session(&log_cmd.session_id).await;
    assert_eq!(log_now["status"], "incomplete_evidence", "{log_now}");
    assert_eq!(b.session(&tap_cmd.session_id).await["status"], "completed");
    assert!(b.running_sessions().await.is_empty());
    let failed = b.events_of("session_failed").await;
    assert_eq!(failed.len(), 2, "one session_failed each");

    // The bench comes back and its outbox delivers the log: the evidence
    // is complete after all.
    let sum = sha256_hex(&log_bytes);
    let _ = status_is(
        b.put_bytes(&b.provider_token, "art-log", &sum, &log_bytes)
            .await,
        StatusCode::CREATED,
    );
    assert_eq!(b.session(&log_cmd.session_id).await["status"], "completed");
    b.reg.shutdown().await;
}

#[tokio::test]
async fn a_running_session_with_evidence_still_uploading_becomes_incomplete_evidence_on_restart() {
    let mut b = Bench::start().await;
    let (_, cmd, call) = b.act("cam-1", json!({"action": "record_clip"})).await;
    call.await.unwrap();
    let bytes = jpeg_like(1000);
    // Keyframes of the clip are announced while it still records.
    b.report(
        &cmd,
        "running",
        json!({"artifacts": [artifact_meta("art-keyframe", &cmd.session_id, &bytes)]}),
    )
    .await;
    eventually(Duration::from_secs(5), "keyframe metadata", || async {
        let (s, _) = b
            .api
            .get("/api/v1/artifacts/art-keyframe", Some(&b.agent))
            .await;
        (s == StatusCode::OK).then_some(())
    })
    .await;
    // The edge daemon restarts: same provider, new boot id.
    let mut p = provider_body(PROVIDER);
    p["boot_id"] = json!("boot-2");
    b.provider
        .publish(
            PROVIDER,
            TopicKind::Register,
            MessageType::Register,
            &json!({ "provider": p, "capabilities": capabilities() }),
        )
        .await;
    let s = eventually(Duration::from_secs(5), "session ended", || async {
        let s = b.session(&cmd.session_id).await;
        (s["status"] != "running").then_some(s)
    })
    .await;
    assert_eq!(s["status"], "incomplete_evidence", "{s}");
    assert!(s["error_message"].as_str().unwrap().contains("restarted"));
    assert_eq!(s["artifact_refs"], json!(["art-keyframe"]));
    b.reg.shutdown().await;
}

#[tokio::test]
async fn a_session_update_from_another_provider_is_refused() {
    let mut b = Bench::start().await;
    let (_, cmd, call) = b.act("cam-1", json!({"action": "snapshot"})).await;
    call.await.unwrap();

    // A second bench with its own camera claims the session.
    let token = b
        .reg
        .auth
        .create_token(Role::Provider, "bench-b")
        .await
        .unwrap();
    let addr = b.reg.mqtt_addr;
    let mut other = TestProvider::connect(
        &addr.ip().to_string(),
        addr.port(),
        PREFIX,
        "bench-b",
        "bench-b",
        Some(("bench-b", &token)),
    )
    .await;
    let mut p = provider_body("bench-b");
    p["node_id"] = json!("node-b");
    other
        .publish(
            "bench-b",
            TopicKind::Register,
            MessageType::Register,
            &json!({"provider": p, "capabilities": [{
                "capability_id": "cam-b",
                "capability_type": "camera",
                "display_name": "other camera",
                "lease_mode": "exclusive",
                "preemptible": true,
                "supported_actions": ["snapshot"]
            }]}),
        )
        .await;
    other
        .next_of(MessageType::RegisterAck, Duration::from_secs(5))
        .await
        .expect("ack");
    for capability_id in ["cam-b", "cam-1"] {
        other
            .publish(
                "bench-b",
                TopicKind::Results,
                MessageType::SessionUpdate,
                &json!({
                    "session_id": cmd.session_id,
                    "capability_id": capability_id,
                    "status": "completed",
                    "result_summary": {"forged": true},
                    "occurred_at": chrono::Utc::now()
                }),
            )
            .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let s = b.session(&cmd.session_id).await;
    assert_eq!(s["status"], "running", "{s}");
    assert!(s["result_summary"].is_null());
    assert!(b.events_of("session_completed").await.is_empty());

    // An update for a session nobody started is refused as well.
    b.provider
        .publish(
            PROVIDER,
            TopicKind::Results,
            MessageType::SessionUpdate,
            &json!({"session_id": "sess_unknown", "capability_id": "cam-1",
                    "status": "completed", "occurred_at": chrono::Utc::now()}),
        )
        .await;
    // The real provider's report is accepted.
    b.report(&cmd, "completed", json!({"result_summary": {"ok": true}}))
        .await;
    let s = eventually(Duration::from_secs(5), "completed", || async {
        let s = b.session(&cmd.session_id).await;
        (s["status"] == "completed").then_some(s)
    })
    .await;
    assert_eq!(s["result_summary"], json!({"ok": true}));
    let (_, all) = b.api.get("/api/v1/sessions", Some(&b.admin)).await;
    assert_eq!(all["sessions"].as_array().unwrap().len(), 1);
    b.reg.shutdown().await;
}

#[tokio::test]
async fn a_preempted_holders_running_action_is_cancelled_and_its_next_action_refused() {
    let mut b = Bench::start().await;
    let old = b.lease(&b.agent, AGENT, "cam-1", 50).await;
    let clip = b.invoke(
        &b.agent,
        &old,
        json!({"action": "record_clip", "params": {"duration_ms": 60000}, "wait_ms": 20000}),
    );
    let cmd = b.next_command().await;
    b.report(&cmd, "running", json!({})).await;

    // A higher-priority holder with a whitelisted reason preempts.
    let (_, new) = status_is(
        b.api
            .post(
                "/api/v1/capability-leases/request?wait_seconds=10",
                Some(&b.other_agent),
                &json!({
                    "capability_id": "cam-1",
                    "holder_type": "audit_agent",
                    "holder_ref": OTHER_AGENT,
                    "project_id": "proj_device_assistant",
                    "purpose": "safety check",
                    "priority": 90,
                    "requested_duration_seconds": 60,
                    "preempt_if_needed": true,
                    "preempt_reason": "safety_stop"
                }),
            )
            .await,
        StatusCode::CREATED,
    );
    assert_eq!(new["status"], "granted");
    let new_lease = new["lease_id"].as_str().unwrap().to_string();

    // The bench is told: preempt notice, then the revocation and a cancel
    // of the running session, which it honours.
    let mut saw = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !(saw.contains(&"lease_revoked".to_string())
        && saw.contains(&"action_cancel".to_string()))
    {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let (_, payload) = tokio::time::timeout(left, b.provider.incoming.recv())
            .await
            .expect("commands within 5 s")
            .expect("channel open");
        let env = Envelope::parse(&payload).unwrap();
        if env.message_type == MessageType::ActionCancel {
            assert_eq!(env.body["session_id"], cmd.session_id);
        }
        saw.push(env.message_type.as_str().to_string());
    }
    assert!(saw.contains(&"preempt_requested".to_string()), "{saw:?}");
    b.report(
        &cmd,
        "cancelled",
        json!({"error_message": "cancelled: lease revoked"}),
    )
    .await;
    let (_, ended) = status_is(clip.await.unwrap(), StatusCode::OK);
    assert_eq!(ended["status"], "failed");
    let message = ended["error_message"].as_str().unwrap();
    assert!(
        message.starts_with("lease revoked by preemption: safety_stop"),
        "{message}"
    );
    assert!(message.contains(&new_lease), "{message}");

    // The old holder's next action is refused with the lease status...
    let r = b
        .invoke(
            &b.agent,
            &old,
            json!({"action": "snapshot", "wait_ms": 1000}),
        )
        .await
        .unwrap();
    assert_error(&r, StatusCode::CONFLICT, "lease_not_usable");
    assert_eq!(r.1["error"]["details"]["lease_status"], "revoked");
    // ... and the new holder's works.
    let call = b.invoke(
        &b.other_agent,
        &new_lease,
        json!({"action": "snapshot", "wait_ms": 5000}),
    );
    let cmd2 = b.next_command().await;
    assert_eq!(cmd2.lease_id, new_lease);
    b.complete(&cmd2, call, json!({})).await;
    assert!(b.running_sessions().await.is_empty());
    b.reg.shutdown().await;
}

#[tokio::test]
async fn a_session_whose_provider_never_reports_fails_after_its_deadline() {
    let mut b = Bench::start_with(|cfg| cfg.sessions.result_grace_ms = 300).await;
    let (_, cmd, call) = b.act("robot-1", json!({"action": "tap", "params": {"x_mm": 1, "y_mm": 1}, "timeout_ms": 200, "wait_ms": 5000})).await;
    assert_eq!(cmd.timeout_ms, 200);
    let (_, s) = status_is(call.await.unwrap(), StatusCode::OK);
    assert_eq!(s["status"], "failed");
    assert!(
        s["error_message"]
            .as_str()
            .unwrap()
            .contains("did not report"),
        "{s}"
    );
    b.reg.shutdown().await;
}

/// Each `online` status a provider publishes (every reconnection of its
/// edge) is answered with a `session_sync` listing the sessions the
/// registry still holds open on it, then those it ended by presumption,
/// and none the provider ended; the provider's answer ends a session as
/// any report does.
#[tokio::test]
async fn an_online_status_is_answered_with_the_open_sessions_to_report_again() {
    let mut b = Bench::start_with(|cfg| cfg.sessions.result_grace_ms = 300).await;
    let console = b.lease(&b.agent, AGENT, "console-1", 60).await;
    let robot = b.lease(&b.agent, AGENT, "robot-1", 60).await;
    // A session the registry fails for want of a report (its deadline):
    // the report may have been lost, so it is listed too, after the open
    // ones.
    let (_, presumed) = b
        .invoke(
            &b.agent,
            &robot,
            json!({"action": "tap", "params": {"x_mm": 2, "y_mm": 2}, "timeout_ms": 200, "wait_ms": 5000}),
        )
        .await
        .unwrap();
    assert_eq!(presumed["status"], "failed", "{presumed}");
    b.next_command().await;
    let write = json!({"action": "write", "params": {"data": "x"}, "wait_ms": 0});
    let (_, ended) = status_is(
        b.invoke(&b.agent, &console, write.clone()).await.unwrap(),
        StatusCode::ACCEPTED,
    );
    let cmd = b.next_command().await;
    b.report(&cmd, "completed", json!({})).await;
    eventually(Duration::from_secs(5), "first write completed", || async {
        (b.session(&cmd.session_id).await["status"] == "completed").then_some(())
    })
    .await;
    let (_, open1) = b.invoke(&b.agent, &console, write).await.unwrap();
    let (_, open2) = b
        .invoke(
            &b.agent,
            &robot,
            json!({"action": "tap", "params": {"x_mm": 1, "y_mm": 1}, "wait_ms": 0}),
        )
        .await
        .unwrap();
    for _ in 0..2 {
        b.next_command().await;
    }

    b.provider
        .publish(
            PROVIDER,
            TopicKind::Status,
            MessageType::Status,
            &json!({"provider_id": PROVIDER, "online_status": "online", "boot_id": "boot-1"}),
        )
        .await;
    let sync = b
        .provider
        .next_of(MessageType::SessionSync, Duration::from_secs(5))
        .await
        .expect("session_sync on the commands topic");
    let entries = sync.body["sessions"].as_array().unwrap();
    let listed: Vec<(String, String)> = entries
        .iter()
        .map(|s| {
            (
                s["session_id"].as_str().unwrap().to_string(),
                s["capability_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let presumed_flags: Vec<bool> = entries
        .iter()
        .map(|s| s["ended_by_registry"] == true)
        .collect();
    assert_eq!(presumed_flags, [false, false, true], "{sync:?}");
    assert_eq!(
        listed,
        vec![
            (
                open1["session_id"].as_str().unwrap().to_string(),
                "console-1".to_string()
            ),
            (
                open2["session_id"].as_str().unwrap().to_string(),
                "robot-1".to_string()
            ),
            (
                presumed["session_id"].as_str().unwrap().to_string(),
                "robot-1".to_string()
            ),
        ],
        "{sync:?}"
    );
    assert_ne!(open1["session_id"], ended["session_id"]);

    // The bench never got the tap: it says so, and the session fails with
    // its words.
    let lost = ActionCommand {
        session_id: open2["session_id"].as_str().unwrap().to_string(),
        capability_id: "robot-1".into(),
        ..cmd.clone()
    };
    b.report(
        &lost,
        "failed",
        json!({"error_message": "the bench has no record of this session"}),
    )
    .await;
    let failed = eventually(Duration::from_secs(5), "lost tap failed", || async {
        let s = b.session(&lost.session_id).await;
        (s["status"] == "failed").then_some(s)
    })
    .await;
    assert_eq!(
        failed["error_message"],
        "the bench has no record of this session"
    );
    b.reg.shutdown().await;
}

#[tokio::test]
async fn without_wait_the_answer_is_202_with_the_running_session() {
    let mut b = Bench::start().await;
    let lease = b.lease(&b.agent, AGENT, "console-1", 60).await;
    let (_, s) = status_is(
        b.invoke(
            &b.agent,
            &lease,
            json!({"action": "write", "params": {"data": "reboot\n"}}),
        )
        .await
        .unwrap(),
        StatusCode::ACCEPTED,
    );
    assert_eq!(s["status"], "running");
    let cmd = b.next_command().await;
    assert_eq!(cmd.session_id, s["session_id"]);
    b.report(
        &cmd,
        "failed",
        json!({"error_message": "serial port closed"}),
    )
    .await;
    let s = eventually(Duration::from_secs(5), "failed", || async {
        let s = b.session(&cmd.session_id).await;
        (s["status"] == "failed").then_some(s)
    })
    .await;
    assert_eq!(s["error_message"], "serial port closed");
    assert_eq!(b.events_of("session_failed").await.len(), 1);
    b.reg.shutdown().await;
}

#[tokio::test]
async fn artifacts_are_bound_by_their_own_size_limit_not_the_json_body_limit() {
    let mut b = Bench::start_with(|cfg| cfg.sessions.max_artifact_bytes = 4 * 1024 * 1024).await;
    let (_, cmd, call) = b
        .act("cam-1", json!({"action": "record_clip", "wait_ms": 5000}))
        .await;
    let clip = jpeg_like(3 * 1024 * 1024);
    let huge = jpeg_like(5 * 1024 * 1024);
    let mut meta = artifact_meta("art-clip", &cmd.session_id, &clip);
    meta["artifact_type"] = json!("video_clip");
    let mut too_big = artifact_meta("art-huge", &cmd.session_id, &huge);
    too_big["artifact_type"] = json!("video_clip");
    b.report(&cmd, "completed", json!({"artifacts": [meta, too_big]}))
        .await;
    call.await.unwrap();

    // 3 MiB: three times `http.body_limit_bytes`, within the artifact limit.
    let r = status_is(
        b.put_bytes(&b.provider_token, "art-clip", &sha256_hex(&clip), &clip)
            .await,
        StatusCode::CREATED,
    );
    assert_eq!(r.1["size_bytes"], clip.len());
    let r = b
        .put_bytes(&b.provider_token, "art-huge", &sha256_hex(&huge), &huge)
        .await;
    assert_error(&r, StatusCode::PAYLOAD_TOO_LARGE, "body_too_large");
    let r = b
        .api
        .get("/api/v1/artifacts/art-huge/content", Some(&b.agent))
        .await;
    assert_error(&r, StatusCode::CONFLICT, "artifact_not_uploaded");
    b.reg.shutdown().await;
}

#[tokio::test]
async fn a_running_robot_press_holds_off_preemption_until_it_ends() {
    let mut b = Bench::start().await;
    let old = b.lease(&b.agent, AGENT, "robot-1", 50).await;
    let press = b.invoke(
        &b.agent,
        &old,
        json!({"action": "tap", "params": {"x_mm": 5, "y_mm": 5}, "wait_ms": 20000}),
    );
    let cmd = b.next_command().await;
    b.report(&cmd, "running", json!({})).await;

    // A safety stop wants the robot while the press is under way.
    let api = b.api.clone();
    let other = b.other_agent.clone();
    let preempt = tokio::spawn(async move {
        api.post(
            "/api/v1/capability-leases/request?wait_seconds=15",
            Some(&other),
            &json!({
                "capability_id": "robot-1",
                "holder_type": "audit_agent",
                "holder_ref": OTHER_AGENT,
                "project_id": "proj_device_assistant",
                "purpose": "safety stop",
                "priority": 100,
                "requested_duration_seconds": 60,
                "preempt_if_needed": true,
                "preempt_reason": "safety_stop"
            }),
        )
        .await
    });
    // Longer than the 1 s grace period: the press window keeps the holder.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let (_, lease) = b.api.lease(&b.agent, &old).await;
    assert_eq!(
        lease["status"], "active",
        "not preempted mid-press: {lease}"
    );
    assert!(b.events_of("lease_preempt_requested").await.is_empty());

    // The press ends; now the preemption runs its course.
    b.report(&cmd, "completed", json!({"result_summary": {"presses": 1}}))
        .await;
    let (_, session) = status_is(press.await.unwrap(), StatusCode::OK);
    assert_eq!(session["status"], "completed", "{session}");
    let (_, new) = status_is(preempt.await.unwrap(), StatusCode::CREATED);
    assert_eq!(new["status"], "granted");
    let (_, lease) = b.api.lease(&b.agent, &old).await;
    assert_eq!(lease["status"], "revoked", "{lease}");
    assert_eq!(b.events_of("lease_preempt_requested").await.len(), 1);
    b.reg.shutdown().await;
}

#[tokio::test]
async fn an_action_of_the_wrong_json_type_is_422_naming_the_field_and_starts_nothing() {
    let mut b = Bench::start().await;
    let lease = b.lease(&b.agent, AGENT, "cam-1", 60).await;
    for body in [
        json!({"action": 123}),
        json!({"action": null, "params": {}}),
        json!({"action": ["snapshot"]}),
    ] {
        let r = b.invoke(&b.agent, &lease, body.clone()).await.unwrap();
        assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
        assert_eq!(
            r.1["error"]["details"]["field"], "action",
            "{body}: {}",
            r.1
        );
        let message = r.1["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("invalid field `action`: invalid type: "),
            "{message}"
        );
        assert!(
            message.contains("expected one of `snapshot`, `record_clip`"),
            "{message}"
        );
    }
    let r = b
        .invoke(&b.agent, &lease, json!({"action": 123}))
        .await
        .unwrap();
    assert_eq!(
        r.1["error"]["message"]
            .as_str()
            .unwrap()
            .split(", expected")
            .next(),
        Some("invalid field `action`: invalid type: integer `123`")
    );
    // Other fields of the wrong type, as before.
    for (body, field) in [
        (json!({"action": "snapshot", "wait_ms": "soon"}), "wait_ms"),
        (json!({"action": "snapshot", "params": [1]}), "params"),
    ] {
        let r = b.invoke(&b.agent, &lease, body).await.unwrap();
        assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
        assert_eq!(r.1["error"]["details"]["field"], field);
    }
    // A body that is not JSON stays 400.
    let r = b
        .api
        .post_raw(
            &format!("/api/v1/capability-leases/{lease}/actions"),
            Some(&b.agent),
            "{\"action\": snapshot}".into(),
        )
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, "malformed_json");
    assert!(b.sessions_of(&lease).await.is_empty(), "no session stored");
    assert!(b
        .provider
        .next_of(MessageType::ActionInvoke, Duration::from_millis(300))
        .await
        .is_none());
    b.reg.shutdown().await;
}

#[tokio::test]
async fn a_session_cut_by_its_lease_ending_names_the_reason_once() {
    let mut b = Bench::start().await;
    let (lease, cmd, clip) = b
        .act(
            "cam-1",
            json!({"action": "record_clip", "params": {"duration_ms": 60000}, "wait_ms": 20000}),
        )
        .await;
    b.report(&cmd, "running", json!({})).await;
    let _ = status_is(
        b.api
            .lease_post(
                &b.agent,
                &lease,
                "release",
                &json!({"reason": "operator done"}),
            )
            .await,
        StatusCode::OK,
    );

    // The bench is told to cancel, and answers as the edge daemon does:
    // "cancelled: " and the reason it was given.
    let cancel = b
        .provider
        .next_of(MessageType::ActionCancel, Duration::from_secs(5))
        .await
        .expect("action_cancel");
    let reason = cancel.body["reason"].as_str().unwrap().to_string();
    assert_eq!(
        reason,
        "lease released by its holder (operator done) before the action ended"
    );
    b.report(
        &cmd,
        "cancelled",
        json!({"error_message": format!("cancelled: {reason}")}),
    )
    .await;
    let (_, ended) = status_is(clip.await.unwrap(), StatusCode::OK);
    assert_eq!(ended["status"], "failed");
    let expected = "lease released by its holder (operator done) before the action ended \
                    (provider: cancelled)";
    assert_eq!(ended["error_message"], expected);
    assert_eq!(b.session(&cmd.session_id).await["error_message"], expected);

    // A provider message of its own is kept after the reason.
    let (lease, cmd, log) = b
        .act(
            "console-1",
            json!({"action": "capture_log", "params": {"duration_ms": 60000}, "wait_ms": 20000}),
        )
        .await;
    b.report(&cmd, "running", json!({})).await;
    let _ = status_is(
        b.api
            .lease_post(&b.agent, &lease, "release", &json!({}))
            .await,
        StatusCode::OK,
    );
    b.provider
        .next_of(MessageType::ActionCancel, Duration::from_secs(5))
        .await
        .expect("action_cancel");
    b.report(
        &cmd,
        "failed",
        json!({"error_message": "serial port closed"}),
    )
    .await;
    let (_, ended) = log.await.unwrap();
    assert_eq!(
        ended["error_message"],
        "lease released by its holder before the action ended (provider: serial port closed)"
    );
    b.reg.shutdown().await;
}

#[tokio::test]
async fn large_params_reach_the_provider_whole_and_the_session_keeps_a_summary() {
    let mut b = Bench::start().await;
    let lease = b.lease(&b.agent, AGENT, "console-1", 60).await;
    let data = "x".repeat(500_000);
    let params = json!({"data": data, "line_ending": "lf", "echo": false});
    let size = serde_json::to_string(&params).unwrap().len();
    let call = b.invoke(
        &b.agent,
        &lease,
        json!({"action": "write", "params": params, "wait_ms": 5000}),
    );
    let cmd = b.next_command().await;
    assert!(
        Value::Object(cmd.params.clone()) == params,
        "the command carries every parameter"
    );
    b.report(
        &cmd,
        "completed",
        json!({"result_summary": {"bytes_written": 500_000}}),
    )
    .await;
    let (_, session) = status_is(call.await.unwrap(), StatusCode::OK);
    assert_eq!(session["status"], "completed");
    let summary = json!({
        "truncated": true,
        "original_size_bytes": size,
        "key_count": 3,
        "keys": ["data", "echo", "line_ending"]
    });
    // (Compared without printing half a megabyte on a mismatch.)
    let same = |got: &Value| assert!(*got == summary, "input_summary: {:.300}", got.to_string());
    same(&session["input_summary"]);
    same(&b.session(&cmd.session_id).await["input_summary"]);
    let listed = b.sessions_of(&lease).await;
    same(&listed[0]["input_summary"]);
    let started = b.events_of("session_started").await;
    assert_eq!(started.len(), 1);
    same(&started[0]["data"]["input_summary"]);
    assert!(
        serde_json::to_string(&started[0]).unwrap().len() < 8192,
        "the event stays small"
    );

    // Very many keys: as many as fit are listed, and all are counted.
    let many: serde_json::Map<String, Value> = (0..20_000)
        .map(|i| (format!("k{i:05}"), json!(i)))
        .collect();
    let (_, running) = status_is(
        b.invoke(&b.agent, &lease, json!({"action": "write", "params": many}))
            .await
            .unwrap(),
        StatusCode::ACCEPTED,
    );
    let cmd = b.next_command().await;
    assert_eq!(cmd.params.len(), 20_000, "the command carries every key");
    let summary = &running["input_summary"];
    assert_eq!(summary["truncated"], true);
    assert_eq!(summary["key_count"], 20_000);
    let keys = summary["keys"].as_array().unwrap();
    assert!(!keys.is_empty() && keys.len() < 20_000, "{}", keys.len());
    assert_eq!(keys[0], "k00000");
    assert!(
        summary.to_string().len() <= 4096,
        "{}",
        summary.to_string().len()
    );

    // Small parameters are kept as given.
    let call = b.invoke(
        &b.agent,
        &lease,
        json!({"action": "write", "params": {"data": "reboot\n"}}),
    );
    let (_, running) = call.await.unwrap();
    assert_eq!(running["input_summary"], json!({"data": "reboot\n"}));
    b.reg.shutdown().await;
}

#[tokio::test]
async fn bytes_no_artifact_binds_are_deleted_after_the_grace_time_and_bound_bytes_stay() {
    let mut b = Bench::start_with(|cfg| cfg.sessions.unbound_upload_ttl_seconds = 3).await;
    let (cmd, call) = b.snapshot().await;
    let early = jpeg_like(40_000);
    let bound = jpeg_like(20_000);
    let stray = jpeg_like(30_000);
    let replaced = jpeg_like(10_000);
    let replacement = jpeg_like(11_000);

    // Bytes ahead of their metadata; bytes no metadata will name; the
    // bytes of an artifact (`art-bound`, below) under an id nobody names;
    // bytes replaced by other bytes under the same id. The last PUT is the
    // newest upload of all.
    for (id, bytes) in [
        ("art-early", &early),
        ("art-stray", &stray),
        ("art-copy", &bound),
        ("art-twice", &replaced),
        ("art-twice", &replacement),
    ] {
        let r = b.put(id, bytes).await;
        assert_eq!(r.0, StatusCode::CREATED, "{id}: {}", r.1);
        assert_eq!(r.1["metadata_received"], false, "{id}: {}", r.1);
        assert!(b.blob_file(bytes).is_file(), "{id} stored");
    }
    b.complete(
        &cmd,
        call,
        json!({"artifacts": [
            artifact_meta("art-early", &cmd.session_id, &early),
            artifact_meta("art-bound", &cmd.session_id, &bound),
        ]}),
    )
    .await;
    // `art-early` was bound by its metadata; `art-bound`'s bytes come
    // after it, and share the blob `art-copy` stored.
    let r = status_is(b.put("art-bound", &bound).await, StatusCode::CREATED);
    assert_eq!(r.1["uploaded"], true, "{}", r.1);
    let (_, meta) = status_is(
        b.api
            .get("/api/v1/artifacts/art-early", Some(&b.agent))
            .await,
        StatusCode::OK,
    );
    assert_eq!(meta["uploaded"], true, "{meta}");

    // Past the grace time the watchdog deletes what nothing binds.
    eventually(
        Duration::from_secs(30),
        "the unbound blobs to be deleted",
        || async {
            [&stray, &replaced, &replacement]
                .iter()
                .all(|bytes| !b.blob_file(bytes).exists())
                .then_some(())
        },
    )
    .await;

    // Bound bytes stay, also the blob `art-copy` shared with `art-bound`.
    for (id, bytes) in [("art-early", &early), ("art-bound", &bound)] {
        assert!(b.blob_file(bytes).is_file(), "{id} kept");
        let (s, got) = b.download(id).await;
        assert_eq!(s, StatusCode::OK, "{id}");
        assert_eq!(sha256_hex(&got), sha256_hex(bytes), "{id} intact");
    }
    // The held records went with them: the same PUT stores anew (201),
    // where a repeat of held bytes answers 200.
    for (id, bytes) in [("art-stray", &stray), ("art-copy", &bound)] {
        let r = b.put(id, bytes).await;
        assert_eq!(r.0, StatusCode::CREATED, "{id}: {}", r.1);
        assert_eq!(r.1["metadata_received"], false, "{id}: {}", r.1);
    }
    let r = b.put("art-stray", &stray).await;
    assert_eq!(r.0, StatusCode::OK, "held again: {}", r.1);
    // Bound artifacts answer as before.
    let r = status_is(b.put("art-early", &early).await, StatusCode::OK);
    assert_eq!(r.1["uploaded"], true, "{}", r.1);
    b.reg.shutdown().await;
}

#[tokio::test]
async fn a_provider_holding_too_many_unbound_bytes_is_refused_until_metadata_binds_them() {
    let mut b = Bench::start_with(|cfg| cfg.sessions.max_unbound_bytes_per_provider = 50_000).await;
    let (cmd, call) = b.snapshot().await;
    let first = jpeg_like(30_000);
    let second = jpeg_like(30_001);
    let big = jpeg_like(60_000);

    let _ = status_is(b.put("art-1", &first).await, StatusCode::CREATED);
    let r = b.put("art-2", &second).await;
    assert_error(&r, StatusCode::CONFLICT, "unbound_upload_limit");
    let details = &r.1["error"]["details"];
    assert_eq!(details["provider_id"], PROVIDER);
    assert_eq!(details["artifact_id"], "art-2");
    assert_eq!(details["unbound_bytes"], first.len());
    assert_eq!(details["incoming_bytes"], second.len());
    assert_eq!(details["limit_bytes"], 50_000);
    assert!(!b.blob_file(&second).exists(), "nothing stored");

    // Bytes the provider already stored add nothing: a repeat, and the
    // same bytes under another id, pass.
    let _ = status_is(b.put("art-1", &first).await, StatusCode::OK);
    let _ = status_is(b.put("art-1-copy", &first).await, StatusCode::CREATED);

    // The metadata binds `art-1`; an artifact whose metadata is known is
    // never limited, whatever its size.
    b.complete(
        &cmd,
        call,
        json!({"artifacts": [
            artifact_meta("art-1", &cmd.session_id, &first),
            artifact_meta("art-big", &cmd.session_id, &big),
        ]}),
    )
    .await;
    let r = status_is(b.put("art-big", &big).await, StatusCode::CREATED);
    assert_eq!(r.1["uploaded"], true, "{}", r.1);

    // `art-1`'s bytes are evidence now and no longer count.
    let r = status_is(b.put("art-2", &second).await, StatusCode::CREATED);
    assert_eq!(r.1["metadata_received"], false, "{}", r.1);
    b.reg.shutdown().await;
}

/// Chunks of a streamed request body; an `Err` breaks the upload off.
type BodyFeed = tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>;

/// Start a PUT of `bytes` for `artifact_id` whose body the caller feeds
/// through the returned sender (its declared `Content-Length` is the full
/// length); the handle answers with the status once the body ends.
fn put_streamed(
    b: &Bench,
    artifact_id: &str,
    bytes: &[u8],
) -> (
    BodyFeed,
    tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let req = b
        .api
        .http
        .put(format!(
            "{}/api/v1/artifacts/{artifact_id}/content",
            b.api.base
        ))
        .bearer_auth(&b.provider_token)
        .header("X-Checksum-Sha256", sha256_hex(bytes))
        .header("content-type", "image/jpeg")
        .header("content-length", bytes.len())
        .body(reqwest::Body::wrap_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ));
    (tx, tokio::spawn(req.send()))
}

#[tokio::test]
async fn parallel_uploads_of_unknown_artifacts_cannot_pass_the_unbound_limit_together() {
    let b = Bench::start_with(|cfg| cfg.sessions.max_unbound_bytes_per_provider = 50_000).await;
    let first = jpeg_like(30_000);
    let second = jpeg_like(30_001);

    // The first upload's body is still arriving: its declared 30,000
    // bytes count, and a second 30,001 would take the provider over.
    let (tx, first_put) = put_streamed(&b, "art-1", &first);
    tx.send(Ok(first[..10_000].to_vec())).await.unwrap();
    b.wait_staged(1).await;
    let r = b.put("art-2", &second).await;
    assert_error(&r, StatusCode::CONFLICT, "unbound_upload_limit");
    let details = &r.1["error"]["details"];
    assert_eq!(details["unbound_bytes"], 0, "{}", r.1);
    assert_eq!(details["in_flight_bytes"], first.len(), "{}", r.1);
    assert_eq!(details["incoming_bytes"], second.len(), "{}", r.1);
    assert!(!b.blob_file(&second).exists(), "nothing stored");

    // The first completes and is held; its bytes now count as stored.
    tx.send(Ok(first[10_000..].to_vec())).await.unwrap();
    drop(tx);
    let resp = first_put.await.unwrap().unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let r = b.put("art-2", &second).await;
    assert_error(&r, StatusCode::CONFLICT, "unbound_upload_limit");
    assert_eq!(r.1["error"]["details"]["unbound_bytes"], first.len());
    assert_eq!(r.1["error"]["details"]["in_flight_bytes"], 0);

    // An upload that breaks off gives its share back: 19,000 bytes fit
    // beside the 30,000 held once the broken one is gone.
    let third = jpeg_like(19_000);
    let (tx, broken) = put_streamed(&b, "art-3", &third);
    tx.send(Ok(third[..5_000].to_vec())).await.unwrap();
    b.wait_staged(1).await;
    let r = b.put("art-4", &jpeg_like(19_001)).await;
    assert_error(&r, StatusCode::CONFLICT, "unbound_upload_limit");
    tx.send(Err(std::io::Error::other("cable pulled")))
        .await
        .unwrap();
    drop(tx);
    let _ = broken.await;
    assert!(
        !b.blob_file(&third).exists(),
        "the broken upload stored nothing"
    );
    let fourth = jpeg_like(19_002);
    let mut last = (StatusCode::CONFLICT, Value::Null);
    for _ in 0..50 {
        last = b.put("art-4", &fourth).await;
        if last.0 != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(last.0, StatusCode::CREATED, "{}", last.1);

    // A chunked upload (no Content-Length) counts as the largest artifact
    // allowed; the refusal says why and what to do.
    let small = jpeg_like(100);
    let resp = b
        .api
        .http
        .put(format!("{}/api/v1/artifacts/art-5/content", b.api.base))
        .bearer_auth(&b.provider_token)
        .header("X-Checksum-Sha256", sha256_hex(&small))
        .body(reqwest::Body::wrap_stream(futures::stream::iter([Ok::<
            _,
            std::io::Error,
        >(
            small.clone(),
        )])))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let body: Value = resp.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("declared no Content-Length") && message.contains("send Content-Length"),
        "{message}"
    );
    b.reg.shutdown().await;
}

#[tokio::test]
async fn a_command_too_large_for_mqtt_is_refused_with_413_and_starts_nothing() {
    let mut b = Bench::start().await;
    let lease = b.lease(&b.agent, AGENT, "cam-1", 60).await;
    // Under the 1 MiB body limit as sent; each `9e9` is encoded again as
    // `9000000000.0`, so the command would be about three times larger
    // than the registry's MQTT packet limit.
    let n = 259_990;
    let body = format!(
        "{{\"action\":\"snapshot\",\"params\":{{\"a\":[{}]}}}}",
        vec!["9e9"; n].join(",")
    );
    assert!(body.len() < 1024 * 1024, "{}", body.len());
    let got = b
        .api
        .post_raw(
            &format!("/api/v1/capability-leases/{lease}/actions"),
            Some(&b.agent),
            body,
        )
        .await;
    assert_error(&got, StatusCode::PAYLOAD_TOO_LARGE, "command_too_large");
    let details = &got.1["error"]["details"];
    let (size, limit) = (
        details["encoded_bytes"].as_u64().unwrap(),
        details["limit_bytes"].as_u64().unwrap(),
    );
    assert_eq!(limit, 1024 * 1024, "{details}");
    assert!(size > 3_000_000, "{details}");
    assert!(b.sessions_of(&lease).await.is_empty(), "no session");
    assert!(b.events_of("session_started").await.is_empty());
    assert!(
        b.provider
            .next_of(MessageType::ActionInvoke, Duration::from_millis(300))
            .await
            .is_none(),
        "nothing was sent"
    );

    // The link is intact: the next action reaches the provider.
    let call = b.invoke(
        &b.agent,
        &lease,
        json!({"action": "snapshot", "params": {"a": [9e9]}, "wait_ms": 5000}),
    );
    let cmd = b.next_command().await;
    b.report(&cmd, "completed", json!({})).await;
    let (_, session) = status_is(call.await.unwrap(), StatusCode::OK);
    assert_eq!(session["status"], "completed");
    b.reg.shutdown().await;
}

#[tokio::test]
async fn a_providers_long_error_message_is_cut_in_the_session() {
    let mut b = Bench::start().await;
    let (_, cmd, call) = b
        .act(
            "console-1",
            json!({"action": "write", "params": {"data": "x"}, "wait_ms": 5000}),
        )
        .await;
    let long = format!("unknown parameter `{}`", "é".repeat(5000));
    b.report(&cmd, "failed", json!({ "error_message": long }))
        .await;
    let (_, session) = status_is(call.await.unwrap(), StatusCode::OK);
    assert_eq!(session["status"], "failed");
    let expected = format!(
        "{}… ({} more characters)",
        long.chars().take(2000).collect::<String>(),
        long.chars().count() - 2000
    );
    assert_eq!(session["error_message"], expected);
    assert_eq!(b.session(&cmd.session_id).await["error_message"], expected);
    let failed = b.events_of("session_failed").await;
    assert_eq!(failed.len(), 1);
    assert!(
        serde_json::to_string(&failed[0]).unwrap().len() < 8192,
        "the event stays small"
    );
    b.reg.shutdown().await;
}

#[tokio::test]
async fn every_action_invoke_carries_its_lease_fence() {
    let mut b = Bench::start().await;
    let (first, cmd, call) = b
        .act("cam-1", json!({"action": "snapshot", "timeout_ms": 4000}))
        .await;
    let (_, lease) = b.api.lease(&b.admin, &first).await;
    let generation = lease["generation"]
        .as_u64()
        .expect("a granted lease has a generation");
    assert_eq!(cmd.lease_generation, generation);
    assert_eq!(cmd.lease_mode.as_str(), "exclusive");
    // The action's deadline (4 s) comes before the lease's expiry (300 s).
    let sent = chrono::Utc::now();
    let left = (cmd.not_after - sent).num_milliseconds();
    assert!((3_000..=4_000).contains(&left), "not_after {left} ms ahead");
    b.report(&cmd, "completed", json!({})).await;
    assert_eq!(call.await.unwrap().0, StatusCode::ACCEPTED);

    // The next grant of the capability is a later generation, and the
    // bench is told of the end of the first lease and the grant.
    b.release(&b.agent, &first).await;
    let revoked = b
        .provider
        .next_of(MessageType::LeaseRevoked, Duration::from_secs(5))
        .await
        .expect("lease_revoked for a release");
    assert_eq!(revoked.body["lease_id"], first.as_str());
    assert_eq!(revoked.body["lease_generation"], generation);
    let second = b.lease(&b.other_agent, OTHER_AGENT, "cam-1", 60).await;
    let granted = b
        .provider
        .next_of(MessageType::LeaseGranted, Duration::from_secs(5))
        .await
        .expect("lease_granted");
    assert_eq!(granted.body["lease_id"], second.as_str());
    assert!(granted.body["lease_generation"].as_u64() > Some(generation));
}

#[tokio::test]
async fn a_report_of_an_action_started_after_its_lease_ended_is_kept_but_never_applied() {
    let mut b = Bench::start().await;
    let (lease, cmd, call) = b.act("cam-1", json!({"action": "snapshot"})).await;
    assert_eq!(call.await.unwrap().0, StatusCode::ACCEPTED);
    b.release(&b.agent, &lease).await;
    // A bench without a fence ran it anyway, a second after the release.
    let late_start = chrono::Utc::now() + chrono::Duration::seconds(1);
    b.report(
        &cmd,
        "completed",
        json!({"started_at": late_start, "result_summary": {"width": 640}}),
    )
    .await;
    let session = eventually(Duration::from_secs(5), "late report kept", || async {
        let s = b.session(&cmd.session_id).await;
        s.get("late_report").is_some().then_some(s)
    })
    .await;
    assert_eq!(session["status"], "failed", "{session}");
    assert!(
        session["error_message"]
            .as_str()
            .unwrap()
            .contains("after its lease or deadline ended"),
        "{session}"
    );
    assert_eq!(session["late_report"]["status"], "completed");
    assert_eq!(session["late_report"]["result_summary"]["width"], 640);
    assert!(session["result_summary"].is_null(), "{session}");
    let late = b.events_of("session_late_report").await;
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!(late[0]["session_id"], cmd.session_id.as_str());
    assert!(b.events_of("session_completed").await.is_empty());

    // The same report again (QoS 1) changes nothing.
    b.report(&cmd, "completed", json!({"started_at": late_start}))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.events_of("session_late_report").await.len(), 1);
    assert_eq!(b.session(&cmd.session_id).await["status"], "failed");
}

#[tokio::test]
async fn a_report_of_an_action_started_inside_its_fence_completes_the_session() {
    let mut b = Bench::start().await;
    let (_, cmd, call) = b
        .act("cam-1", json!({"action": "snapshot", "wait_ms": 5000}))
        .await;
    b.report(
        &cmd,
        "completed",
        json!({"started_at": chrono::Utc::now(), "result_summary": {"width": 640}}),
    )
    .await;
    let (_, session) = status_is(call.await.unwrap(), StatusCode::OK);
    assert_eq!(session["status"], "completed");
    assert!(session.get("late_report").is_none(), "{session}");
    assert!(b.events_of("session_late_report").await.is_empty());
}

impl Bench {
    /// A ranged PUT of `piece` (bytes `start..` of an upload of `total`
    /// bytes hashing to `sum`). With `cut_after` the body stream fails
    /// after that many bytes, as a dropped connection does.
    async fn put_range(
        &self,
        artifact_id: &str,
        sum: &str,
        start: u64,
        total: u64,
        piece: &[u8],
        cut_after: Option<usize>,
    ) -> Result<(StatusCode, Value), reqwest::Error> {
        let end = start + piece.len() as u64 - 1;
        let body = match cut_after {
            None => reqwest::Body::from(piece.to_vec()),
            Some(n) => {
                let sent = bytes::Bytes::copy_from_slice(&piece[..n]);
                let chunks: Vec<Result<bytes::Bytes, std::io::Error>> =
                    vec![Ok(sent), Err(std::io::Error::other("link dropped"))];
                reqwest::Body::wrap_stream(futures::stream::iter(chunks))
            }
        };
        let resp = self
            .api
            .http
            .put(format!(
                "{}/api/v1/artifacts/{artifact_id}/content",
                self.api.base
            ))
            .bearer_auth(&self.provider_token)
            .header("X-Checksum-Sha256", sum)
            .header("Content-Range", format!("bytes {start}-{end}/{total}"))
            .header("Content-Length", piece.len())
            .body(body)
            .send()
            .await?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    async fn upload_status(&self, artifact_id: &str, sum: &str) -> Value {
        let (_, v) = status_is(
            self.api
                .get(
                    &format!("/api/v1/artifacts/{artifact_id}/content/upload-status?sha256={sum}"),
                    Some(&self.provider_token),
                )
                .await,
            StatusCode::OK,
        );
        v
    }
}

#[tokio::test]
async fn a_resumable_upload_continues_after_a_dropped_connection_and_is_verified_whole() {
    let mut b = Bench::start().await;
    let (cmd, call) = b.snapshot().await;
    let bytes = jpeg_like(3_000_000);
    let sum = sha256_hex(&bytes);
    let total = bytes.len() as u64;
    assert_eq!(b.upload_status("art-big", &sum).await["received_bytes"], 0);

    // A first piece arrives whole: 202 and what is held.
    let r = status_is(
        b.put_range("art-big", &sum, 0, total, &bytes[..1_000_000], None)
            .await
            .expect("sent"),
        StatusCode::ACCEPTED,
    );
    assert_eq!(r.1["received_bytes"], 1_000_000);
    assert_eq!(r.1["complete"], false);

    // The next one breaks off after 400 000 bytes: what reached the
    // registry is kept (a reset connection may lose what was in flight).
    let _ = b
        .put_range(
            "art-big",
            &sum,
            1_000_000,
            total,
            &bytes[1_000_000..],
            Some(400_000),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = b.upload_status("art-big", &sum).await;
    assert_eq!(status["complete"], false, "{status}");
    let held = status["received_bytes"].as_u64().unwrap();
    assert!((1_000_000..=1_400_000).contains(&held), "{status}");

    // A piece that does not start where the held bytes end is refused.
    let r = b
        .put_range("art-big", &sum, 1_000_001, total, &bytes[1_000_001..], None)
        .await
        .expect("sent");
    assert_error(&r, StatusCode::CONFLICT, "upload_offset_mismatch");
    assert_eq!(r.1["error"]["details"]["received_bytes"], held);
    let h = held as usize;
    let r = status_is(
        b.put_range("art-big", &sum, held, total, &bytes[h..h + 10], None)
            .await
            .expect("sent"),
        StatusCode::ACCEPTED,
    );
    assert_eq!(r.1["received_bytes"], held + 10);

    // The rest completes it: stored, verified against the sha256.
    let r = status_is(
        b.put_range("art-big", &sum, held + 10, total, &bytes[h + 10..], None)
            .await
            .expect("sent"),
        StatusCode::CREATED,
    );
    assert_eq!(r.1["checksum"], sum);
    let status = b.upload_status("art-big", &sum).await;
    assert_eq!(status["complete"], true);
    assert_eq!(status["received_bytes"], total);

    b.complete(
        &cmd,
        call,
        json!({"artifacts": [artifact_meta("art-big", &cmd.session_id, &bytes)]}),
    )
    .await;
    let status = b.upload_status("art-big", &sum).await;
    assert_eq!(status["metadata_received"], true);
    let got = b
        .api
        .http
        .get(format!("{}/api/v1/artifacts/art-big/content", b.api.base))
        .bearer_auth(&b.agent)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(sha256_hex(&got), sum);
    b.reg.shutdown().await;
}

#[tokio::test]
async fn a_resumable_upload_whose_bytes_hash_to_another_sha256_is_refused_and_starts_over() {
    let b = Bench::start().await;
    let bytes = jpeg_like(200_000);
    let wrong = sha256_hex(b"other bytes");
    let total = bytes.len() as u64;
    let _ = status_is(
        b.put_range("art-x", &wrong, 0, total, &bytes[..100_000], None)
            .await
            .expect("sent"),
        StatusCode::ACCEPTED,
    );
    let r = b
        .put_range("art-x", &wrong, 100_000, total, &bytes[100_000..], None)
        .await
        .expect("sent");
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "checksum_mismatch");
    assert_eq!(b.upload_status("art-x", &wrong).await["received_bytes"], 0);
    let r = b
        .put_range("art-x", &wrong, 0, 10, &bytes[..20], None)
        .await
        .expect("sent");
    assert_error(&r, StatusCode::BAD_REQUEST, "invalid_content_range");
    b.reg.shutdown().await;
}

/// An uploaded 10 000-byte artifact on `b`, then downloads with `Range`:
/// one range is `206` with exactly its bytes, a start past the end `416`
/// with `bytes */LEN`, several ranges the whole body.
async fn ranged_downloads_answer_the_exact_slice(mut b: Bench) {
    let (_, cmd, call) = b
        .act("cam-1", json!({"action": "snapshot", "wait_ms": 5000}))
        .await;
    let bytes = jpeg_like(9_996);
    let sum = sha256_hex(&bytes);
    b.complete(
        &cmd,
        call,
        json!({"artifacts": [artifact_meta("art-range", &cmd.session_id, &bytes)]}),
    )
    .await;
    status_is(
        b.put_bytes(&b.provider_token, "art-range", &sum, &bytes)
            .await,
        StatusCode::CREATED,
    );
    let get = |range: Option<&'static str>| {
        let mut req = b
            .api
            .http
            .get(format!("{}/api/v1/artifacts/art-range/content", b.api.base))
            .bearer_auth(&b.agent);
        if let Some(r) = range {
            req = req.header("range", r);
        }
        req.send()
    };
    let whole = get(None).await.unwrap();
    assert_eq!(whole.status(), StatusCode::OK);
    assert_eq!(whole.headers()["accept-ranges"], "bytes");
    assert_eq!(sha256_hex(&whole.bytes().await.unwrap()), sum);

    for (range, slice, content_range) in [
        ("bytes=0-99", &bytes[..100], "bytes 0-99/10000"),
        ("bytes=9900-", &bytes[9900..], "bytes 9900-9999/10000"),
        ("bytes=-50", &bytes[9950..], "bytes 9950-9999/10000"),
        (
            "bytes=5000-5000",
            &bytes[5000..5001],
            "bytes 5000-5000/10000",
        ),
        ("bytes=9990-20000", &bytes[9990..], "bytes 9990-9999/10000"),
    ] {
        let resp = get(Some(range)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT, "{range}");
        assert_eq!(resp.headers()["content-range"], content_range, "{range}");
        assert_eq!(
            resp.headers()["content-length"],
            slice.len().to_string().as_str()
        );
        assert_eq!(resp.headers()["x-checksum-sha256"], sum.as_str());
        assert_eq!(resp.bytes().await.unwrap(), slice, "{range}");
    }

    let past = get(Some("bytes=10000-")).await.unwrap();
    assert_eq!(past.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(past.headers()["content-range"], "bytes */10000");
    let body: Value = past.json().await.unwrap();
    assert_eq!(body["error"]["code"], "range_not_satisfiable");

    let several = get(Some("bytes=0-9,20-29")).await.unwrap();
    assert_eq!(
        several.status(),
        StatusCode::OK,
        "several ranges: whole body"
    );
    assert_eq!(sha256_hex(&several.bytes().await.unwrap()), sum);
    b.reg.shutdown().await;
}

#[tokio::test]
async fn ranged_downloads_from_the_artifact_directory_answer_206_and_416() {
    ranged_downloads_answer_the_exact_slice(Bench::start().await).await;
}

#[tokio::test]
async fn ranged_downloads_from_an_s3_bucket_answer_206_and_416() {
    let Some(moto) = benchlink_testkit::MotoS3::start() else {
        return;
    };
    moto.create_bucket("range-bucket").await;
    let blobs: cloud_registry::sessions::BlobsConfig = toml::from_str(
        moto.blobs_toml("range-bucket", Some("lab-a"))
            .trim_start_matches("[blobs]\n"),
    )
    .unwrap();
    let b = Bench::start_with(|cfg| cfg.blobs = blobs).await;
    ranged_downloads_answer_the_exact_slice(b).await;
}

#[tokio::test]
async fn an_upload_while_the_s3_server_is_down_is_503_and_stores_nothing() {
    let Some(moto) = benchlink_testkit::MotoS3::start() else {
        return;
    };
    moto.create_bucket("down-bucket").await;
    let blobs: cloud_registry::sessions::BlobsConfig = toml::from_str(
        moto.blobs_toml("down-bucket", None)
            .trim_start_matches("[blobs]\n"),
    )
    .unwrap();
    let mut b = Bench::start_with(|cfg| cfg.blobs = blobs).await;
    let (_, cmd, call) = b
        .act("cam-1", json!({"action": "snapshot", "wait_ms": 5000}))
        .await;
    let bytes = jpeg_like(20_000);
    let sum = sha256_hex(&bytes);
    b.complete(
        &cmd,
        call,
        json!({"artifacts": [artifact_meta("art-down", &cmd.session_id, &bytes)]}),
    )
    .await;
    drop(moto);
    let r = b
        .put_bytes(&b.provider_token, "art-down", &sum, &bytes)
        .await;
    assert_error(
        &r,
        StatusCode::SERVICE_UNAVAILABLE,
        "blob_store_unavailable",
    );
    let (_, meta) = status_is(
        b.api
            .get("/api/v1/artifacts/art-down", Some(&b.agent))
            .await,
        StatusCode::OK,
    );
    assert_eq!(meta["uploaded"], false, "nothing stored: {meta}");
    b.reg.shutdown().await;
}

#[tokio::test]
async fn a_download_whose_blob_the_store_lost_is_500_artifact_bytes_missing() {
    let mut b = Bench::start().await;
    let (_, cmd, call) = b
        .act("cam-1", json!({"action": "snapshot", "wait_ms": 5000}))
        .await;
    let bytes = jpeg_like(10_000);
    let sum = sha256_hex(&bytes);
    b.complete(
        &cmd,
        call,
        json!({"artifacts": [artifact_meta("art-lost", &cmd.session_id, &bytes)]}),
    )
    .await;
    status_is(
        b.put_bytes(&b.provider_token, "art-lost", &sum, &bytes)
            .await,
        StatusCode::CREATED,
    );
    // Someone removes the file behind the registry's back.
    std::fs::remove_file(b.blob_file(&bytes)).unwrap();
    let r = b
        .api
        .get("/api/v1/artifacts/art-lost/content", Some(&b.agent))
        .await;
    assert_error(
        &r,
        StatusCode::INTERNAL_SERVER_ERROR,
        "artifact_bytes_missing",
    );
    assert_eq!(r.1["error"]["details"]["checksum"], sum.as_str(), "{}", r.1);
    b.reg.shutdown().await;
}
