//! The main job, as an audit agent does it through the public HTTP API
//! only: lease a camera, the DUT console, the power supply and the thumb
//! robot together; power the DUT, wait for its boot banner, measure, tap,
//! take a snapshot; be preempted on the robot by a higher-priority agent;
//! send an Earth command; collect every session, artifact (verifying the
//! downloaded bytes against the sha256 the edge computed) and the lease
//! timeline. Shared by `benchlink-demo` and the end-to-end tests.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::bench::{caps, DUT_BANNER};
use crate::client::{group_leases, sha256_hex, Agent, EventLog};

/// Output of the scenario for people (the demo prints, tests log).
pub type Say<'a> = &'a (dyn Fn(String) + Send + Sync);

/// An artifact whose downloaded bytes were checked.
#[derive(Debug, Clone)]
pub struct VerifiedArtifact {
    /// The artifact record (seed 001 §2.2.5 + size, uploaded).
    pub artifact: Value,
    /// SHA-256 of the bytes downloaded from the registry.
    pub downloaded_sha256: String,
    pub downloaded_size: usize,
    /// `X-Checksum-Sha256` of the download.
    pub checksum_header: String,
    /// Absolute download URL.
    pub url: String,
}

impl VerifiedArtifact {
    /// True when the downloaded bytes hash to the sha256 the edge computed.
    pub fn intact(&self) -> bool {
        self.artifact["checksum"] == self.downloaded_sha256.as_str()
            && self.checksum_header == self.downloaded_sha256
            && self.artifact["size_bytes"] == self.downloaded_size
    }
}

/// What the Earth command step got.
#[derive(Debug, Clone)]
pub enum EarthOutcome {
    /// The endpoint answered (status, body).
    Answered(u16, Value),
    /// The endpoint is not mounted on this registry.
    Unavailable(String),
}

/// Everything the main job produced.
#[derive(Debug, Clone)]
pub struct MainJobReport {
    /// capability id → the first agent's lease id.
    pub hw_leases: BTreeMap<String, String>,
    /// The preempting agent's robot lease.
    pub chief_robot_lease: String,
    /// Every session of every lease, oldest first.
    pub sessions: Vec<Value>,
    pub artifacts: Vec<VerifiedArtifact>,
    /// Lease events of the job's leases, in event order.
    pub timeline: Vec<Value>,
    /// The old holder's robot action after revocation: (status, body).
    pub refused_after_preemption: (u16, Value),
    /// The new holder's robot session.
    pub new_holder_tap: Value,
    /// The boot banner match.
    pub banner_session: Value,
    /// The output measurement.
    pub measurement: Value,
    pub earth: EarthOutcome,
}

fn summary(session: &Value) -> String {
    let result = session["result_summary"].to_string();
    let mut r = result.chars().take(110).collect::<String>();
    if result.chars().count() > 110 {
        r.push('…');
    }
    r
}

/// Run the main job. `hw` is the first audit agent, `chief` the second
/// (higher priority, whitelisted reason), `earth_caller` sends the Earth
/// command, `events` is a follower of the event stream started before.
pub async fn run_main_job(
    hw: &Agent,
    chief: &Agent,
    earth_caller: &Agent,
    events: &EventLog,
    say: Say<'_>,
) -> Result<MainJobReport> {
    // (1) Lease camera + console + PSU + robot atomically.
    say(format!(
        "[1] {} leases {}, {}, {}, {} as one group (priority 75)",
        hw.name,
        caps::CAMERA,
        caps::CONSOLE,
        caps::PSU,
        caps::ROBOT
    ));
    let group = hw
        .lease_group(
            &[caps::CAMERA, caps::CONSOLE, caps::PSU, caps::ROBOT],
            75,
            "hardware audit: DUT power-up, boot banner, touch",
            10,
        )
        .await?;
    let hw_leases = group_leases(&group);
    say(format!(
        "    granted together: group {} -> {}",
        group["lease_group_id"].as_str().unwrap_or("?"),
        hw_leases
            .iter()
            .map(|(c, l)| format!("{c}={l}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let lease = |c: &str| hw_leases.get(c).cloned().context("lease of the group");
    let (console, psu, robot, camera) = (
        lease(caps::CONSOLE)?,
        lease(caps::PSU)?,
        lease(caps::ROBOT)?,
        lease(caps::CAMERA)?,
    );

    // The grants' events belong to this step: let the stream catch up
    // (an event is printed before it is logged) before the next begins.
    for id in hw_leases.values() {
        events
            .wait_for("lease_granted", Duration::from_secs(10), |e| {
                e["event_type"] == "lease_granted" && e["lease_id"] == id.as_str()
            })
            .await?;
    }

    // (2) Power the DUT, wait for its banner, measure, tap, snapshot.
    say("[2] power-up and observation".into());
    let step = |what: &str, s: &Value| {
        say(format!(
            "    {what:<34} {} {}",
            s["status"].as_str().unwrap_or("?"),
            summary(s)
        ))
    };
    let s = hw.act_ok(&console, "open", json!({})).await?;
    step("console open", &s);
    let s = hw
        .act_ok(&psu, "set_voltage", json!({"voltage_v": 5.0}))
        .await?;
    step("psu set_voltage 5.0 V", &s);
    let s = hw
        .act_ok(&psu, "set_current_limit", json!({"current_limit_a": 0.5}))
        .await?;
    step("psu set_current_limit 0.5 A", &s);
    let s = hw.act_ok(&psu, "power_on", json!({})).await?;
    step("psu power_on", &s);
    let banner_session = hw
        .act_ok(
            &console,
            "expect_pattern",
            json!({"pattern": regex_escape(DUT_BANNER), "timeout_ms": 10000}),
        )
        .await?;
    step("console expect_pattern <banner>", &banner_session);
    let s = hw
        .act_ok(
            &console,
            "capture_log",
            json!({"duration_ms": 300, "since": "all"}),
        )
        .await?;
    step("console capture_log (boot log)", &s);
    let measurement = hw.act_ok(&psu, "measure_output", json!({})).await?;
    step("psu measure_output", &measurement);
    let s = hw
        .act_ok(&robot, "tap", json!({"x_mm": 35.0, "y_mm": 70.0}))
        .await?;
    step("robot tap (35, 70) mm", &s);
    let s = hw.act_ok(&camera, "snapshot", json!({})).await?;
    step("camera snapshot", &s);

    // (3) A second agent preempts the robot.
    say(format!(
        "[3] {} asks for {} at priority 80, preempt_reason chief_audit",
        chief.name,
        caps::ROBOT
    ));
    let chief2 = chief.clone();
    let request = tokio::spawn(async move {
        chief2
            .lease(
                caps::ROBOT,
                80,
                "chief audit: verify the touch response",
                Some("chief_audit"),
                30,
            )
            .await
    });
    let notice = events
        .wait_for("lease_preempt_requested", Duration::from_secs(10), |e| {
            e["event_type"] == "lease_preempt_requested" && e["lease_id"] == robot.as_str()
        })
        .await?;
    say(format!(
        "    stream: lease_preempt_requested for {robot}, grace_until {}",
        notice["data"]["grace_until"].as_str().unwrap_or("?")
    ));
    // Finishing up inside the grace period is allowed.
    let s = hw
        .act_ok(&robot, "tap", json!({"x_mm": 20.0, "y_mm": 100.0}))
        .await?;
    step("old holder: tap during grace", &s);
    let (status, granted) = request.await.context("preempting request task")??;
    if status != StatusCode::CREATED || granted["status"] != "granted" {
        bail!("the preempting request was not granted: {status}: {granted}");
    }
    let chief_robot_lease = granted["lease_id"].as_str().unwrap_or_default().to_string();
    let preempted = events
        .wait_for("lease_preempted", Duration::from_secs(10), |e| {
            e["event_type"] == "lease_preempted" && e["lease_id"] == robot.as_str()
        })
        .await?;
    say(format!(
        "    stream: lease_preempted {robot} ({})",
        preempted["data"]["reason"]
            .as_str()
            .unwrap_or("grace period ended")
    ));
    events
        .wait_for("lease_granted", Duration::from_secs(10), |e| {
            e["event_type"] == "lease_granted" && e["lease_id"] == chief_robot_lease.as_str()
        })
        .await?;
    say(format!(
        "    stream: lease_granted {chief_robot_lease} to {}",
        chief.name
    ));
    let (refused_status, refused) = hw
        .act(&robot, "tap", json!({"x_mm": 35.0, "y_mm": 70.0}), 5000)
        .await?;
    say(format!(
        "    old holder's next tap: {} {} (lease_status {})",
        refused_status.as_u16(),
        refused["error"]["code"].as_str().unwrap_or("?"),
        refused["error"]["details"]["lease_status"]
            .as_str()
            .unwrap_or("?")
    ));
    let new_holder_tap = chief
        .act_ok(
            &chief_robot_lease,
            "tap",
            json!({"x_mm": 35.0, "y_mm": 70.0}),
        )
        .await?;
    step("new holder's tap", &new_holder_tap);

    // (4) Earth command.
    say("[4] Earth command \"高亮所有北斗卫星\"".into());
    let (es, eb) = earth_caller
        .post(
            "/api/v1/agents/earth/command",
            &json!({
                "input_text": "高亮所有北斗卫星",
                "source": "text",
                "client_context": {"locale": "zh-CN"}
            }),
        )
        .await?;
    let earth = if es == StatusCode::NOT_FOUND && eb["error"]["code"] == "route_not_found" {
        say(
            "    the Earth endpoint is unavailable on this registry (agents router not mounted)"
                .into(),
        );
        EarthOutcome::Unavailable(eb.to_string())
    } else {
        say(format!(
            "    {} summary: {} | {} action(s), confidence {}",
            es.as_u16(),
            eb["summary"]
                .as_str()
                .unwrap_or_else(|| eb["error"]["message"].as_str().unwrap_or("?")),
            eb["actions"].as_array().map(|a| a.len()).unwrap_or(0),
            eb["confidence"]
        ));
        EarthOutcome::Answered(es.as_u16(), eb)
    };

    // (5) Power down, give everything back, collect the evidence.
    say("[5] power down and release every lease".into());
    let s = hw.act_ok(&psu, "power_off", json!({})).await?;
    step("psu power_off", &s);
    for l in [&console, &psu, &camera] {
        hw.release(l).await?;
    }
    chief.release(&chief_robot_lease).await?;
    let mut all_leases: Vec<String> = hw_leases.values().cloned().collect();
    all_leases.push(chief_robot_lease.clone());

    let mut sessions = Vec::new();
    for l in &all_leases {
        let v = hw
            .get_ok(&format!("/api/v1/capability-leases/{l}/sessions"))
            .await?;
        sessions.extend(v["sessions"].as_array().cloned().unwrap_or_default());
    }
    sessions.sort_by(|a, b| {
        a["started_at"]
            .as_str()
            .unwrap_or("")
            .cmp(b["started_at"].as_str().unwrap_or(""))
    });
    let uploaded = hw
        .wait_artifacts_uploaded(&all_leases, Duration::from_secs(30))
        .await?;
    let mut artifacts = Vec::new();
    for a in uploaded {
        let id = a["artifact_id"].as_str().unwrap_or_default().to_string();
        let d = hw.download(&id).await?;
        artifacts.push(VerifiedArtifact {
            url: format!("{}/api/v1/artifacts/{id}/content", hw.base_url),
            downloaded_sha256: sha256_hex(&d.bytes),
            downloaded_size: d.bytes.len(),
            checksum_header: d.checksum_header,
            artifact: a,
        });
    }
    let timeline: Vec<Value> = events
        .all()
        .into_iter()
        .filter(|e| {
            e["event_type"]
                .as_str()
                .is_some_and(|t| t.starts_with("lease_"))
                && e["lease_id"]
                    .as_str()
                    .is_some_and(|l| all_leases.iter().any(|x| x == l))
        })
        .collect();
    Ok(MainJobReport {
        hw_leases,
        chief_robot_lease,
        sessions,
        artifacts,
        timeline,
        refused_after_preemption: (refused_status.as_u16(), refused),
        new_holder_tap,
        banner_session,
        measurement,
        earth,
    })
}

/// Escape regex metacharacters in `s`.
pub fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Print the report: sessions, artifacts (sha256, size, URL, verified),
/// and the lease timeline.
pub fn print_report(r: &MainJobReport, say: Say<'_>) {
    say(format!("\nSessions ({}):", r.sessions.len()));
    for s in &r.sessions {
        say(format!(
            "  {:<38} {:<16} {:<18} {:<10} {}",
            s["session_id"].as_str().unwrap_or("?"),
            s["capability_id"].as_str().unwrap_or("?"),
            s["action"].as_str().unwrap_or("?"),
            s["status"].as_str().unwrap_or("?"),
            s["error_message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| summary(s))
        ));
    }
    say(format!("\nArtifacts ({}):", r.artifacts.len()));
    for a in &r.artifacts {
        // Which action made it: its session's capability and action.
        let made_by = r
            .sessions
            .iter()
            .find(|s| s["session_id"] == a.artifact["session_id"])
            .map(|s| {
                format!(
                    "{} {}",
                    s["capability_id"].as_str().unwrap_or("?"),
                    s["action"].as_str().unwrap_or("?")
                )
            })
            .unwrap_or_default();
        say(format!(
            "  {} {:<11} {:>8} B sha256 {} {}\n      from {made_by}: {}",
            a.artifact["artifact_id"].as_str().unwrap_or("?"),
            a.artifact["artifact_type"].as_str().unwrap_or("?"),
            a.downloaded_size,
            a.artifact["checksum"].as_str().unwrap_or("?"),
            if a.intact() { "verified" } else { "MISMATCH" },
            a.url
        ));
    }
    say("\nLease timeline:".into());
    for e in &r.timeline {
        let d = &e["data"];
        say(format!(
            "  #{:<5} {} {:<24} {:<40} {:<16} {} {}",
            e["event_id"],
            e["occurred_at"].as_str().unwrap_or("?"),
            e["event_type"].as_str().unwrap_or("?"),
            e["lease_id"].as_str().unwrap_or("?"),
            d["capability_id"].as_str().unwrap_or(""),
            d["principal"].as_str().unwrap_or(""),
            d["status"].as_str().unwrap_or("")
        ));
    }
}
