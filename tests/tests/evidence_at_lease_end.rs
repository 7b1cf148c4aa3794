//! Evidence at lease end across real processes (seed 001 §5.4,
//! docs/policy.md "Evidence at lease end"): the edge's HTTP requests go
//! through a gate of this test; while it is shut, a snapshot's bytes
//! cannot reach the registry. A lease with `evidence_required` released
//! with that evidence missing leaves its session `incomplete_evidence`
//! once `sessions.evidence_grace_ms` has passed; when the gate opens and
//! the bytes arrive the session is `completed` again. A lease without
//! `evidence_required` is not judged.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT};
use benchlink_e2e::client::{follow_events, Agent};
use benchlink_e2e::eventually;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The registry's `sessions.evidence_grace_ms` in this lab.
const EVIDENCE_GRACE_MS: u64 = 2_000;

/// A TCP gate on 127.0.0.1 in front of the port set in `target`: while
/// `open` is false it closes new connections at once and cuts the ones it
/// relays (the edge's pooled keep-alive connections too).
async fn start_gate(target: Arc<OnceLock<u16>>, open: watch::Receiver<bool>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind gate");
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let mut open = open.clone();
            let (Some(&to), true) = (target.get(), *open.borrow()) else {
                continue;
            };
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(("127.0.0.1", to)).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    _ = open.wait_for(|o| !*o) => {}
                }
            });
        }
    });
    port
}

async fn session(agent: &Agent, session_id: &str) -> Value {
    agent
        .get_ok(&format!("/api/v1/sessions/{session_id}"))
        .await
        .expect("session")
}

/// Take a snapshot under a new camera lease (`evidence_required` as
/// given) with the gate shut, then release the lease. Returns the
/// session id and the moment of the release.
async fn snapshot_and_release(agent: &Agent, evidence_required: bool) -> (String, Instant) {
    let (s, lease) = agent
        .post(
            "/api/v1/capability-leases/request?wait_seconds=10",
            &json!({
                "capability_id": caps::CAMERA,
                "holder_type": "audit_agent",
                "holder_ref": HW_AGENT,
                "project_id": "proj_evidence",
                "purpose": "evidence at lease end",
                "priority": 50,
                "requested_duration_seconds": 60,
                "evidence_required": evidence_required,
            }),
        )
        .await
        .expect("lease request");
    assert!(
        s.is_success() && lease["status"] == "granted",
        "{s}: {lease}"
    );
    let lease_id = lease["lease_id"].as_str().unwrap();
    let snap = agent
        .act_ok(lease_id, "snapshot", json!({}))
        .await
        .expect("snapshot");
    assert_eq!(snap["status"], "completed", "{snap}");
    assert_eq!(
        snap["artifact_refs"].as_array().map(Vec::len),
        Some(1),
        "{snap}"
    );
    let (s, released) = agent.release(lease_id).await.expect("release");
    assert!(s.is_success(), "{s}: {released}");
    (
        snap["session_id"].as_str().unwrap().to_string(),
        Instant::now(),
    )
}

#[tokio::test]
async fn a_lease_ended_without_its_evidence_marks_the_session_until_the_bytes_arrive() {
    let target = Arc::new(OnceLock::new());
    let (gate, open) = watch::channel(true);
    let gate_port = start_gate(target.clone(), open).await;
    let lab = Lab::start(LabOptions {
        edge_http_port: Some(gate_port),
        registry_extra_toml: format!("evidence_grace_ms = {EVIDENCE_GRACE_MS}\n"),
        ..Default::default()
    })
    .await
    .expect("lab");
    target.set(lab.http_port).unwrap();
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let (events, _follower) = follow_events(&hw, |_| {});

    gate.send_replace(false);
    let (required, released_at) = snapshot_and_release(&hw, true).await;
    let (optional, _) = snapshot_and_release(&hw, false).await;

    // Within the grace the session stays completed, after it it is marked.
    let early = session(&hw, &required).await;
    if released_at.elapsed() < Duration::from_millis(EVIDENCE_GRACE_MS) {
        assert_eq!(
            early["status"], "completed",
            "marked before the grace: {early}"
        );
    }
    let marked = eventually(
        Duration::from_millis(EVIDENCE_GRACE_MS + 10_000),
        "session marked incomplete_evidence",
        || async {
            let s = session(&hw, &required).await;
            (s["status"] == "incomplete_evidence").then_some(s)
        },
    )
    .await;
    assert!(
        released_at.elapsed() >= Duration::from_millis(EVIDENCE_GRACE_MS),
        "marked {:?} after the release, before the {EVIDENCE_GRACE_MS} ms grace",
        released_at.elapsed()
    );
    let why = marked["error_message"].as_str().unwrap_or_default();
    assert!(
        why.contains("requires evidence") && why.contains("1 artifact(s)"),
        "{marked}"
    );
    // The lease that did not require evidence is left completed.
    assert_eq!(session(&hw, &optional).await["status"], "completed");
    events
        .wait_for(
            "session_failed (incomplete_evidence)",
            Duration::from_secs(5),
            |e| {
                e["event_type"] == "session_failed"
                    && e["session_id"] == required.as_str()
                    && e["data"]["status"] == "incomplete_evidence"
            },
        )
        .await
        .expect("the mark is announced");

    // The gate opens: the edge's retry brings the bytes, the mark goes.
    gate.send_replace(true);
    let restored = eventually(
        Duration::from_secs(90),
        "session completed again once its bytes arrived",
        || async {
            let s = session(&hw, &required).await;
            (s["status"] == "completed").then_some(s)
        },
    )
    .await;
    assert!(restored["error_message"].is_null(), "{restored}");
    events
        .wait_for("session_completed again", Duration::from_secs(5), |e| {
            e["event_type"] == "session_completed" && e["session_id"] == required.as_str()
        })
        .await
        .expect("the return is announced");
    let artifact = &restored["artifact_refs"][0];
    let meta = hw
        .get_ok(&format!("/api/v1/artifacts/{}", artifact.as_str().unwrap()))
        .await
        .expect("artifact");
    assert_eq!(meta["uploaded"], true, "{meta}");
}
