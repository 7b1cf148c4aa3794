//! Artifact bytes that no artifact binds, against an in-process registry
//! with its embedded broker: the provider is a real MQTT client answering
//! `action_invoke` with `session_update`s and PUTting bytes over HTTP, as
//! the edge daemon does. Bytes whose metadata never names them are deleted
//! after `sessions.unbound_upload_ttl_seconds`; bytes bound to an artifact
//! (also when they arrived first, and when another upload shares them) stay;
//! `sessions.max_unbound_bytes_per_provider` limits what a provider may hold
//! unbound.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use shared_protocol::api::Role;
use shared_protocol::mqtt::{ActionCommand, MessageType, TopicKind};
use tempfile::TempDir;

const PREFIX: &str = "benchlink/v1";
const PROVIDER: &str = "bench-a";
const AGENT: &str = "audit:hw-01";

/// A registry and one provider with a camera, connected over MQTT.
struct Bench {
    _dir: TempDir,
    reg: cloud_registry::app::RunningRegistry,
    api: Api,
    provider: TestProvider,
    provider_token: String,
    agent: String,
}

impl Bench {
    async fn start(tune: impl FnOnce(&mut cloud_registry::config::Config)) -> Self {
        let dir = TempDir::new().unwrap();
        let mut cfg = test_config(&dir);
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
        let camera = json!([{
            "capability_id": "cam-1",
            "capability_type": "camera",
            "display_name": "bench camera",
            "lease_mode": "exclusive",
            "preemptible": true,
            "supported_actions": ["snapshot", "record_clip"],
            "evidence_modes": ["image", "video_clip"]
        }]);
        provider
            .publish(
                PROVIDER,
                TopicKind::Register,
                MessageType::Register,
                &json!({ "provider": p, "capabilities": camera }),
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
        }
    }

    /// Lease the camera and start a snapshot (the answer comes from the
    /// task once the session ends); returns the command the provider got.
    async fn snapshot(&mut self) -> (ActionCommand, tokio::task::JoinHandle<(StatusCode, Value)>) {
        let (s, lease) = self
            .api
            .post(
                "/api/v1/capability-leases/request",
                Some(&self.agent),
                &json!({
                    "capability_id": "cam-1",
                    "holder_type": "audit_agent",
                    "holder_ref": AGENT,
                    "project_id": "proj_device_assistant",
                    "purpose": "collect evidence",
                    "priority": 50,
                    "requested_duration_seconds": 300,
                    "evidence_required": true
                }),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{lease}");
        let lease_id = lease["lease_id"].as_str().unwrap().to_string();
        let (api, token) = (self.api.clone(), self.agent.clone());
        let call = tokio::spawn(async move {
            api.post(
                &format!("/api/v1/capability-leases/{lease_id}/actions"),
                Some(&token),
                &json!({"action": "snapshot", "wait_ms": 10000}),
            )
            .await
        });
        let env = self
            .provider
            .next_of(MessageType::ActionInvoke, Duration::from_secs(5))
            .await
            .expect("action_invoke on the commands topic");
        (serde_json::from_value(env.body).unwrap(), call)
    }

    /// Publish the session's final `session_update` with `artifacts`.
    async fn complete(&self, cmd: &ActionCommand, artifacts: Vec<Value>) {
        self.provider
            .publish(
                PROVIDER,
                TopicKind::Results,
                MessageType::SessionUpdate,
                &json!({
                    "session_id": cmd.session_id,
                    "capability_id": cmd.capability_id,
                    "status": "completed",
                    "occurred_at": chrono::Utc::now(),
                    "artifacts": artifacts,
                }),
            )
            .await;
    }

    /// PUT `bytes` as the provider, with their sha256 and length.
    async fn put(&self, artifact_id: &str, bytes: &[u8]) -> (StatusCode, Value) {
        let resp = self
            .api
            .http
            .put(format!(
                "{}/api/v1/artifacts/{artifact_id}/content",
                self.api.base
            ))
            .bearer_auth(&self.provider_token)
            .header("X-Checksum-Sha256", sha256_hex(bytes))
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

    /// The bytes of an artifact as a reader downloads them.
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
        self.reg
            .db_path()
            .parent()
            .unwrap()
            .join("artifacts")
            .join("sha256")
            .join(&sum[..2])
            .join(&sum[2..])
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
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
        "metadata_json": {}
    })
}

/// `n` bytes after a JPEG start marker; different `n`, different bytes.
fn jpeg_like(n: usize) -> Vec<u8> {
    let mut v = vec![0xFF, 0xD8, 0xFF, 0xE0];
    v.extend((0..n).map(|i| (i * 7 % 251) as u8));
    v
}

#[tokio::test]
async fn bytes_no_artifact_binds_are_deleted_after_the_grace_time_and_bound_bytes_stay() {
    let mut b = Bench::start(|cfg| cfg.sessions.unbound_upload_ttl_seconds = 3).await;
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
        vec![
            artifact_meta("art-early", &cmd.session_id, &early),
            artifact_meta("art-bound", &cmd.session_id, &bound),
        ],
    )
    .await;
    assert_eq!(call.await.unwrap().1["status"], "completed");
    // `art-early` was bound by its metadata; `art-bound`'s bytes come
    // after it, and share the blob `art-copy` stored.
    let r = b.put("art-bound", &bound).await;
    assert_eq!(r.0, StatusCode::CREATED, "{}", r.1);
    assert_eq!(r.1["uploaded"], true, "{}", r.1);
    let (s, meta) = b
        .api
        .get("/api/v1/artifacts/art-early", Some(&b.agent))
        .await;
    assert_eq!(s, StatusCode::OK, "{meta}");
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
    let r = b.put("art-early", &early).await;
    assert_eq!(r.0, StatusCode::OK, "{}", r.1);
    assert_eq!(r.1["uploaded"], true, "{}", r.1);
    b.reg.shutdown().await;
}

#[tokio::test]
async fn a_provider_holding_too_many_unbound_bytes_is_refused_until_metadata_binds_them() {
    let mut b = Bench::start(|cfg| cfg.sessions.max_unbound_bytes_per_provider = 50_000).await;
    let (cmd, call) = b.snapshot().await;
    let first = jpeg_like(30_000);
    let second = jpeg_like(30_001);
    let big = jpeg_like(60_000);

    let r = b.put("art-1", &first).await;
    assert_eq!(r.0, StatusCode::CREATED, "{}", r.1);
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
    let r = b.put("art-1", &first).await;
    assert_eq!(r.0, StatusCode::OK, "{}", r.1);
    let r = b.put("art-1-copy", &first).await;
    assert_eq!(r.0, StatusCode::CREATED, "{}", r.1);

    // The metadata binds `art-1`; an artifact whose metadata is known is
    // never limited, whatever its size.
    b.complete(
        &cmd,
        vec![
            artifact_meta("art-1", &cmd.session_id, &first),
            artifact_meta("art-big", &cmd.session_id, &big),
        ],
    )
    .await;
    assert_eq!(call.await.unwrap().1["status"], "completed");
    let r = b.put("art-big", &big).await;
    assert_eq!(r.0, StatusCode::CREATED, "{}", r.1);
    assert_eq!(r.1["uploaded"], true, "{}", r.1);

    // `art-1`'s bytes are evidence now and no longer count.
    let r = b.put("art-2", &second).await;
    assert_eq!(r.0, StatusCode::CREATED, "{}", r.1);
    assert_eq!(r.1["metadata_received"], false, "{}", r.1);
    b.reg.shutdown().await;
}
