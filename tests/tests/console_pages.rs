//! The console's Sessions & evidence, Audit tasks, Agent runs and
//! Proposals pages in a real Chromium (tests/browser/{evidence,audits,runs}.spec.mjs
//! driven by playwright-core), against a whole simulated lab: the state
//! each spec looks at is made here through the HTTP API (snapshot, audio
//! clip, serial log with the DUT's boot banner, an artifact whose stored
//! bytes are then altered on disk, an audit request claimed and answered,
//! Earth commands, and config proposals from a scripted model).
//!
//! Needs node, /usr/bin/chromium and tests/browser/node_modules
//! (scripts/setup.sh); with CI=true a missing one fails the test.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use benchlink_e2e::bench::{caps, Lab, LabOptions, DUT_BANNER, HW_AGENT};
use benchlink_e2e::browser::{self, run_spec};
use benchlink_e2e::client::{follow_events, Agent};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What user-supplied fields carry: markup and a `javascript:` link.
const MARKUP: &str = "<img src=x onerror=alert(1)> javascript:alert(1)";

/// A scripted OpenAI-compatible chat-completions server: each request gets
/// the next queued message content (then a final answer), over HTTP/1.1,
/// after the delay queued with it.
struct FakeModel {
    url: String,
    queue: Arc<Mutex<VecDeque<(Duration, String)>>>,
}

impl FakeModel {
    async fn start() -> FakeModel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let queue: Arc<Mutex<VecDeque<(Duration, String)>>> = Arc::default();
        let q = queue.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let q = q.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 8192];
                    loop {
                        let Ok(n) = sock.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).to_string();
                        if let Some(end) = text.find("\r\n\r\n") {
                            let len = text[..end]
                                .lines()
                                .find_map(|l| {
                                    let (k, v) = l.split_once(':')?;
                                    k.eq_ignore_ascii_case("content-length")
                                        .then(|| v.trim().parse::<usize>().ok())?
                                })
                                .unwrap_or(0);
                            if buf.len() >= end + 4 + len {
                                break;
                            }
                        }
                    }
                    let next = q.lock().unwrap().pop_front();
                    let (delay, content) = next.unwrap_or_else(|| {
                        let done = json!({"type": "final", "summary": "done", "result": {}});
                        (Duration::ZERO, done.to_string())
                    });
                    tokio::time::sleep(delay).await;
                    let body = json!({
                        "id": "chatcmpl-1", "object": "chat.completion", "model": "fake-chat-1",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
                    })
                    .to_string();
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                });
            }
        });
        FakeModel { url, queue }
    }

    fn then(&self, content: Value) {
        self.then_after(Duration::ZERO, content);
    }

    /// Answer the next request with `content`, `delay` after it arrived.
    fn then_after(&self, delay: Duration, content: Value) {
        self.queue
            .lock()
            .unwrap()
            .push_back((delay, content.to_string()));
    }
}

fn str_at(v: &Value, key: &str) -> String {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("no `{key}` in {v}"))
        .to_string()
}

/// The single artifact of `session` once its bytes are uploaded.
async fn uploaded_artifact(agent: &Agent, session: &str) -> Result<Value> {
    for _ in 0..150 {
        let v = agent
            .get_ok(&format!("/api/v1/artifacts?session_id={session}"))
            .await?;
        if let Some(a) = v["artifacts"].as_array().and_then(|a| a.first()) {
            if a["uploaded"] == true {
                return Ok(a.clone());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("session {session}: no uploaded artifact after 30 s")
}

async fn post_ok(agent: &Agent, path: &str, body: Value, want: StatusCode) -> Result<Value> {
    let (s, v) = agent.post(path, &body).await?;
    if s != want {
        bail!("POST {path}: {s}: {v}");
    }
    Ok(v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_audit_run_and_proposal_pages_show_what_the_api_holds() -> Result<()> {
    if !browser::ready() {
        return Ok(());
    }
    let mut lab = Lab::start(LabOptions::default()).await?;
    let base = lab.base_url.clone();
    let hw = Agent::new(&base, HW_AGENT, &lab.hw_token);
    let root = Agent::new(&base, "root", &lab.admin_token);

    // Evidence: a snapshot, an audio clip, the DUT's serial log.
    let cam = hw.lease_ok(caps::CAMERA, "console evidence").await?;
    let image = hw.act_ok(&cam, "snapshot", json!({})).await?;
    let tampered = hw.act_ok(&cam, "snapshot", json!({})).await?;
    let clip = hw
        .act_ok(&cam, "record_clip", json!({"duration_ms": 1000, "fps": 5}))
        .await?;
    let mic = hw.lease_ok(caps::MICROPHONE, "console evidence").await?;
    let audio = hw
        .act_ok(&mic, "record_audio", json!({"duration_ms": 1500}))
        .await?;
    let console = hw.lease_ok(caps::CONSOLE, "console evidence").await?;
    let psu = hw.lease_ok(caps::PSU, "console evidence").await?;
    hw.act_ok(&console, "open", json!({})).await?;
    hw.act_ok(&psu, "set_voltage", json!({"voltage_v": 5.0}))
        .await?;
    hw.act_ok(&psu, "power_on", json!({})).await?;
    let banner_re = DUT_BANNER.replace('.', "\\.");
    hw.act_ok(
        &console,
        "expect_pattern",
        json!({"pattern": banner_re, "timeout_ms": 10000}),
    )
    .await?;
    let log = hw
        .act_ok(
            &console,
            "capture_log",
            json!({"duration_ms": 300, "since": "all"}),
        )
        .await?;
    let clip_s = str_at(&clip, "session_id");
    uploaded_artifact(&hw, &clip_s).await?;
    let (image_s, tampered_s, audio_s, log_s) = (
        str_at(&image, "session_id"),
        str_at(&tampered, "session_id"),
        str_at(&audio, "session_id"),
        str_at(&log, "session_id"),
    );
    let image_a = uploaded_artifact(&hw, &image_s).await?;
    let tampered_a = uploaded_artifact(&hw, &tampered_s).await?;
    uploaded_artifact(&hw, &audio_s).await?;
    uploaded_artifact(&hw, &log_s).await?;
    hw.release(&cam).await?;
    hw.release(&mic).await?;

    // Alter the second snapshot's stored bytes (same length) on disk.
    let sha = str_at(&tampered_a, "checksum");
    assert_ne!(
        sha,
        str_at(&image_a, "checksum"),
        "the two snapshots share one blob: altering one would alter both"
    );
    let blob = lab
        .store_path
        .parent()
        .unwrap()
        .join("artifacts/sha256")
        .join(&sha[..2])
        .join(&sha[2..]);
    let mut bytes = std::fs::read(&blob).with_context(|| format!("read {}", blob.display()))?;
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&blob, &bytes)?;

    // An audit request citing the image, claimed with a camera lease and
    // answered with findings (markup in the objective and a title).
    let audit_id = "auditreq_console_01";
    let mut req = json!({
        "protocol_version": "1.0", "audit_request_id": audit_id,
        "project_id": "proj_device_assistant", "task_id": "task_console",
        "trigger": "human_request", "audit_type": "hardware", "priority": 60,
        "objective": format!("check the camera view {MARKUP}"),
        "time_budget_seconds": 120, "response_mode": "structured_json",
        "acceptance_criteria": ["the DUT's screen is lit"],
        "capability_requirements": [{"capability_type": "camera", "mode": "exclusive"}],
    });
    req["artifact_refs"] = json!([str_at(&image_a, "artifact_id")]);
    post_ok(&hw, "/api/v1/audit-requests", req, StatusCode::CREATED).await?;
    let claim = post_ok(
        &hw,
        "/api/v1/audit-requests/claim",
        json!({"audit_types": ["hardware"], "agent_ref": HW_AGENT, "wait_ms": 10000}),
        StatusCode::OK,
    )
    .await?;
    let audit_lease = claim["claim"]["lease_ids"][0]
        .as_str()
        .or_else(|| claim["leases"][0]["lease_id"].as_str())
        .unwrap_or_else(|| panic!("no lease in the claim: {claim}"))
        .to_string();
    let image_id = str_at(&image_a, "artifact_id");
    post_ok(
        &hw,
        &format!("/api/v1/audit-requests/{audit_id}/result"),
        json!({
            "audit_request_id": audit_id, "audit_type": "hardware", "status": "completed",
            "decision": "fail", "confidence": 0.82,
            "summary": "The screen stays dark after boot.",
            "findings": [
                {"finding_id": "f-low", "severity": "low", "title": "Banner is slow",
                 "description": "The banner took 400 ms.", "evidence_ref_ids": []},
                {"finding_id": "f-dark", "severity": "critical", "title": format!("Screen dark {MARKUP}"),
                 "description": format!("The snapshot shows no backlight. {MARKUP}"),
                 "evidence_ref_ids": [image_id], "suggested_fix": "check the backlight rail"}
            ],
            "required_actions": ["fix the backlight"],
            "used_capabilities": [caps::CAMERA],
            "artifact_refs": [image_id],
            "timeline": [{"t_ms": 0, "step": "snapshot"}],
            "duration_ms": 4200, "completed_at": "2026-12-01T10:00:00Z"
        }),
        StatusCode::OK,
    )
    .await?;

    // Earth commands (deterministic resolver: no model yet).
    let earth_text = "highlight all BeiDou satellites";
    let earth = post_ok(
        &root,
        "/api/v1/agents/earth/command",
        json!({"input_text": earth_text, "source": "text"}),
        StatusCode::OK,
    )
    .await?;
    let markup_run = post_ok(
        &root,
        "/api/v1/agents/earth/command",
        json!({"input_text": MARKUP, "source": "text"}),
        StatusCode::OK,
    )
    .await?;

    // Restart the registry with a scripted model, for config proposals.
    let model = FakeModel::start().await;
    lab.stop_registry();
    let mut cfg = std::fs::read_to_string(lab.registry_config())?;
    cfg.push_str(&format!(
        "\n[agents.model]\nbase_url = \"{}\"\nmodel = \"fake-chat-1\"\napi_key = \"sk-test\"\nnative_tools = \"off\"\n",
        model.url
    ));
    std::fs::write(lab.registry_config(), cfg)?;
    lab.start_registry()?;
    let call = |args: Value| json!({"type": "tool_call", "tool": "agents.propose_config", "arguments": args});
    model.then(call(
        json!({"proposal_type": "ai_prompt", "target": {"prompt_key": "agents.roles.bgp"},
        "changes": {"text": "Role: BGP analyst. Use RIPE RIS rrc00."},
        "rationale": format!("name the collectors {MARKUP}")}),
    ));
    model.then(call(
        json!({"proposal_type": "ai_prompt", "target": {"prompt_key": "agents.roles.network"},
        "changes": {"text": "Role: network analyst, v2."}, "rationale": "shorter"}),
    ));
    model.then(call(json!({"proposal_type": "datasource_config", "target": {"datasource_id": "celestrak_active"},
        "changes": {"endpoint": "https://celestrak.org/NORAD/elements/active.txt", "api_key": "sk-live-123"},
        "rationale": "use the live feed"})));
    model.then(call(
        json!({"proposal_type": "ai_prompt", "target": {"prompt_key": "agents.roles.platform_ops"},
        "changes": {"text": "Role: platform operations, terse."}, "rationale": "fewer words"}),
    ));
    model.then(json!({"type": "final", "summary": "four proposals", "result": {}}));
    let created = post_ok(
        &root,
        "/api/v1/agents/runs",
        json!({"run_type": "config_proposal", "title": format!("tune prompts {MARKUP}"),
               "objective": "tune the role prompts"}),
        StatusCode::CREATED,
    )
    .await?;
    let prop_run = str_at(&created["run"], "run_id");
    let detail = benchlink_e2e::poll_until(Duration::from_secs(30), "proposal run settles", || {
        let root = &root;
        let prop_run = &prop_run;
        async move {
            let d = root
                .get_ok(&format!("/api/v1/agents/runs/{prop_run}"))
                .await
                .ok()?;
            matches!(
                d["run"]["status"].as_str(),
                Some("waiting_approval" | "completed" | "failed")
            )
            .then_some(d)
        }
    })
    .await?;
    let props = detail["proposals"].as_array().cloned().unwrap_or_default();
    assert_eq!(props.len(), 4, "{detail}");
    let pid = |i: usize| props[i]["id"].as_i64().unwrap().to_string();
    assert_eq!(props[2]["status"], "rejected", "{}", props[2]);
    assert_eq!(props[3]["status"], "pending", "{}", props[3]);

    // A normal admin.
    let ada = post_ok(
        &root,
        "/api/v1/auth/tokens",
        json!({"role": "admin", "name": "ada-admin"}),
        StatusCode::CREATED,
    )
    .await?;
    let vic = post_ok(
        &root,
        "/api/v1/auth/tokens",
        json!({"role": "viewer", "name": "vic-viewer"}),
        StatusCode::CREATED,
    )
    .await?;
    // Proposals are admin-only: a viewer's event stream carries the runs'
    // events but none of the proposals'; an admin's carries both.
    let viewer = Agent::new(&base, "vic-viewer", &str_at(&vic, "token"));
    let (viewer_log, viewer_follow) = follow_events(&viewer, |_| {});
    let (admin_log, admin_follow) = follow_events(&root, |_| {});
    let proposal_ids: Vec<i64> = props.iter().filter_map(|p| p["id"].as_i64()).collect();
    let mut last_proposal_event = 0;
    for id in &proposal_ids {
        let ev = admin_log
            .wait_for("agent_proposal_created", Duration::from_secs(10), |e| {
                e["event_type"] == "agent_proposal_created" && e["data"]["proposal_id"] == *id
            })
            .await?;
        assert_eq!(ev["data"]["run_id"], prop_run.as_str(), "{ev}");
        last_proposal_event = last_proposal_event.max(ev["event_id"].as_u64().unwrap());
    }
    // The run's last update comes after its proposals: once the viewer has
    // it, its stream has gone past every proposal event.
    viewer_log
        .wait_for("the proposal run's events", Duration::from_secs(10), |e| {
            e["event_type"] == "agent_run_updated"
                && e["data"]["run_id"] == prop_run.as_str()
                && e["event_id"].as_u64() > Some(last_proposal_event)
        })
        .await?;
    assert_viewer_has_no_proposal_events(&viewer_log);
    // Asking for them by type gives nothing either.
    let (status, typed) = sse_for(
        &base,
        &str_at(&vic, "token"),
        "?after=0&types=agent_proposal_created,agent_proposal_updated,agent_run_created",
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    assert!(typed.contains("event: agent_run_created"), "{typed}");
    assert!(!typed.contains("agent_proposal"), "{typed}");

    // The console lease again for the live check (it outlived the restart).
    hw.renew(&console).await?;

    let common = [
        ("BENCHLINK_URL", base.clone()),
        ("BENCHLINK_TOKEN", lab.admin_token.clone()),
        ("MARKUP", MARKUP.to_string()),
    ];
    let with = |extra: Vec<(&'static str, String)>| {
        let mut v: Vec<(&str, String)> = common.to_vec();
        v.extend(extra);
        v
    };
    run_spec(
        "evidence.spec.mjs",
        &with(vec![
            ("IMAGE_SESSION", image_s.clone()),
            ("AUDIO_SESSION", audio_s),
            ("LOG_SESSION", log_s),
            ("CLIP_SESSION", clip_s),
            ("TAMPERED_SESSION", tampered_s),
            ("TAMPERED_ARTIFACT", str_at(&tampered_a, "artifact_id")),
            ("DUT_BANNER", DUT_BANNER.to_string()),
            ("LIVE_LEASE", console.clone()),
            ("LIVE_TOKEN", lab.hw_token.clone()),
        ]),
    );
    run_spec(
        "audits.spec.mjs",
        &with(vec![
            ("AUDIT_ID", audit_id.to_string()),
            ("AUDIT_LEASE", audit_lease),
            ("IMAGE_ARTIFACT", image_id.clone()),
            ("IMAGE_SESSION", image_s),
        ]),
    );
    // The Earth command the runs spec posts: the model answers it after
    // 4 s, so the spec sees the run running, then completed.
    model.then_after(
        Duration::from_secs(4),
        json!({"type": "final", "summary": "BeiDou highlighted", "result": {}}),
    );
    run_spec(
        "runs.spec.mjs",
        &with(vec![
            ("ADMIN_TOKEN", str_at(&ada, "token")),
            ("VIEWER_TOKEN", str_at(&vic, "token")),
            ("EARTH_RUN", str_at(&earth, "run_id")),
            ("EARTH_TEXT", earth_text.to_string()),
            ("MARKUP_RUN", str_at(&markup_run, "run_id")),
            ("PROPOSAL_RUN", prop_run),
            ("PROPOSAL_AUTO", pid(0)),
            ("PROPOSAL_CONFIRM", pid(1)),
            ("PROPOSAL_SECRET", pid(2)),
            ("PROPOSAL_REJECT", pid(3)),
            (
                "LIVE_EARTH_TEXT",
                "highlight all GPS satellites".to_string(),
            ),
        ]),
    );
    // The applies and the rejection reached the admin's stream, not the
    // viewer's: once the viewer has a run created after them, its stream
    // has gone past them all.
    for i in [0, 1, 3] {
        let id = props[i]["id"].as_i64().unwrap();
        admin_log
            .wait_for("agent_proposal_updated", Duration::from_secs(5), |e| {
                e["event_type"] == "agent_proposal_updated" && e["data"]["proposal_id"] == id
            })
            .await?;
    }
    let after = post_ok(
        &root,
        "/api/v1/agents/earth/command",
        json!({"input_text": earth_text, "source": "text"}),
        StatusCode::OK,
    )
    .await?;
    let after_run = str_at(&after, "run_id");
    viewer_log
        .wait_for("the last Earth command", Duration::from_secs(5), |e| {
            e["event_type"] == "agent_run_created" && e["data"]["run_id"] == after_run.as_str()
        })
        .await?;
    assert_viewer_has_no_proposal_events(&viewer_log);
    viewer_follow.abort();
    admin_follow.abort();
    Ok(())
}

fn assert_viewer_has_no_proposal_events(log: &benchlink_e2e::client::EventLog) {
    let leaked: Vec<Value> = log
        .all()
        .into_iter()
        .filter(|e| {
            e["event_type"]
                .as_str()
                .is_some_and(|t| t.starts_with("agent_proposal_"))
        })
        .collect();
    assert!(
        leaked.is_empty(),
        "a viewer got proposal events: {leaked:?}"
    );
}

/// The event stream's body as `token` reads it with `query` for 1.5 s.
async fn sse_for(base: &str, token: &str, query: &str) -> Result<(StatusCode, String)> {
    let resp = reqwest::Client::new()
        .get(format!("{base}/api/v1/capability-events/stream{query}"))
        .bearer_auth(token)
        .send()
        .await?;
    let status = resp.status();
    let mut body = String::new();
    let mut stream = resp.bytes_stream();
    let until = tokio::time::Instant::now() + Duration::from_millis(1500);
    while let Ok(Some(chunk)) = tokio::time::timeout_at(until, stream.next()).await {
        body.push_str(&String::from_utf8_lossy(&chunk?));
    }
    Ok((status, body))
}
