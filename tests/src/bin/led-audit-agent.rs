//! `led-audit-agent`: an example audit agent for the LED-validation task of
//! seed 001 §8.1 ("after wake-up, do screen, LED and voice follow the
//! interaction script?"). It uses only the registry's public HTTP API:
//!
//! 1. (`--create`) registers the source thread and creates the seed's
//!    request (an existing one is fine);
//! 2. claims a `multimodal` audit request; the claim comes with one lease
//!    each on a camera, a speaker, a microphone and a thumb robot;
//! 3. keeps the claim alive (`POST …/extend`) while it works;
//! 4. runs the wake script through
//!    `POST /api/v1/capability-leases/{lease_id}/actions`: the camera
//!    streams while the microphone records, the robot taps the wake button
//!    and the speaker says the wake phrase; a snapshot from the stream
//!    `--led-deadline-ms` after the tap; stopping the stream keeps its
//!    keyframes as evidence of the press;
//! 5. judges the acceptance criteria from the sessions' `result_summary`
//!    (keys such as `led_color`, `ocr_text`, `transcript`, `peak_dbfs`)
//!    and posts an `AuditTaskResult` with findings, the artifacts as
//!    evidence, and the multimodal outputs (§11.2). A criterion the
//!    drivers give no data for is reported as not verified, and the result
//!    asks for human review instead of guessing.
//!
//! ```text
//! led-audit-agent --base-url http://127.0.0.1:8080 --token "$TOKEN" \
//!     --agent-ref audit:multimodal-auditor-01 --create --wait-ms 30000
//! ```
//! `--base-url`, `--token`, `--agent-ref` may also come from
//! `BENCHLINK_URL`, `BENCHLINK_TOKEN`, `BENCHLINK_AGENT_REF`. The token's
//! role must be `audit_agent`, and `--agent-ref` its principal name (or
//! `<principal>:<instance>`).
//!
//! Exit status: 0 result posted; 3 nothing claimable within `--wait-ms`;
//! 4 the claimed task is not an LED-validation task (given back); 1 any
//! other error (the claim is given back when there is one).

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use reqwest::StatusCode;
use serde_json::{json, Map, Value};

/// Command line (see the module doc).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "led-audit-agent",
    about = "Example multimodal audit agent: the LED validation of docs/audit-protocol.md"
)]
struct Args {
    /// Registry base URL (without `/api/v1`).
    #[arg(long, env = "BENCHLINK_URL", default_value = "http://127.0.0.1:8080")]
    base_url: String,
    /// Bearer token of an `audit_agent` principal.
    #[arg(long, env = "BENCHLINK_TOKEN", hide_env_values = true)]
    token: String,
    /// The agent's ref: its principal name or `<principal>:<instance>`.
    #[arg(
        long,
        env = "BENCHLINK_AGENT_REF",
        default_value = "audit:multimodal-auditor-01"
    )]
    agent_ref: String,
    /// Create the seed's LED-validation request (and its source thread)
    /// before claiming.
    #[arg(long)]
    create: bool,
    /// `audit_request_id` used by `--create`.
    #[arg(long, default_value = "auditreq_001")]
    audit_request_id: String,
    /// `source_thread_ref` used by `--create` (registered if needed).
    #[arg(long, default_value = "mac-01:thread-ui-22")]
    source_thread_ref: String,
    /// How long the claim may wait for work, milliseconds.
    #[arg(long, default_value_t = 30_000)]
    wait_ms: u64,
    /// Robot tap position of the wake button, x, mm.
    #[arg(long, default_value_t = 20.0)]
    tap_x_mm: f64,
    /// Robot tap position of the wake button, y, mm.
    #[arg(long, default_value_t = 35.0)]
    tap_y_mm: f64,
    /// What the speaker says to wake the device.
    #[arg(long, default_value = "你好，小助手")]
    wake_phrase: String,
    /// The greeting the device should answer with.
    #[arg(long, default_value = "欢迎")]
    greeting: String,
    /// Length of the audio recording, milliseconds.
    #[arg(long, default_value_t = 5000)]
    record_ms: u64,
    /// The LED must be blue this long after the tap, milliseconds.
    #[arg(long, default_value_t = 2000)]
    led_deadline_ms: u64,
}

/// The registry's HTTP API, authenticated.
struct Client {
    http: reqwest::Client,
    api: String,
    token: String,
}

impl Client {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value)> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.api))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, value))
    }

    async fn post(&self, path: &str, body: &Value) -> Result<(StatusCode, Value)> {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }
}

/// The seed's §8.1 request under `id`, from `source`.
fn seed_request(id: &str, source: &str) -> Value {
    json!({
        "protocol_version": "1.0",
        "audit_request_id": id,
        "project_id": "proj_device_assistant",
        "task_id": "task_led_validation",
        "source_thread_ref": source,
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

async fn create(c: &Client, args: &Args) -> Result<()> {
    let node = args
        .source_thread_ref
        .split_once(':')
        .map(|(n, _)| n)
        .unwrap_or(&args.source_thread_ref);
    let (s, body) = c
        .post(
            "/threads",
            &json!({ "thread_ref": args.source_thread_ref, "node_id": node, "role": "worker" }),
        )
        .await?;
    if !s.is_success() {
        bail!("registering thread {}: {s} {body}", args.source_thread_ref);
    }
    let (s, body) = c
        .post(
            "/audit-requests",
            &seed_request(&args.audit_request_id, &args.source_thread_ref),
        )
        .await?;
    match s {
        StatusCode::CREATED => eprintln!("created audit request {}", args.audit_request_id),
        StatusCode::CONFLICT => eprintln!("audit request {} exists already", args.audit_request_id),
        _ => bail!("creating the audit request: {s} {body}"),
    }
    Ok(())
}

/// One lease of the claim.
#[derive(Debug, Clone)]
struct Held {
    lease_id: String,
    capability_id: String,
}

/// What one action gave.
#[derive(Debug, Clone)]
struct Step {
    label: &'static str,
    capability_id: String,
    action: &'static str,
    /// The session (when the registry answered with one).
    session: Option<Value>,
    /// The HTTP error or session error.
    error: Option<String>,
    started_ms: u64,
}

impl Step {
    fn completed(&self) -> bool {
        self.error.is_none()
            && self
                .session
                .as_ref()
                .is_some_and(|s| s["status"] == "completed")
    }

    fn summary(&self) -> Map<String, Value> {
        self.session
            .as_ref()
            .and_then(|s| s["result_summary"].as_object().cloned())
            .unwrap_or_default()
    }

    fn artifacts(&self) -> Vec<String> {
        self.session
            .as_ref()
            .and_then(|s| s["artifact_refs"].as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect()
    }
}

/// Run `action` on `lease` and wait up to `wait_ms` for its session.
async fn act(
    c: &Client,
    t0: Instant,
    label: &'static str,
    lease: &Held,
    action: &'static str,
    params: Value,
    wait_ms: u64,
) -> Step {
    let started_ms = t0.elapsed().as_millis() as u64;
    let body = json!({
        "action": action,
        "params": params,
        "capability_id": lease.capability_id,
        "wait_ms": wait_ms,
    });
    let path = format!("/capability-leases/{}/actions", lease.lease_id);
    let (session, error) = match c.post(&path, &body).await {
        Ok((s, v)) if s.is_success() => {
            let error = match v["status"].as_str() {
                Some("completed") => None,
                Some(other) => Some(format!(
                    "session ended `{other}`: {}",
                    v["error_message"].as_str().unwrap_or("no message")
                )),
                None => Some("no session status in the answer".to_string()),
            };
            (Some(v), error)
        }
        Ok((s, v)) => (None, Some(format!("{s}: {v}"))),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    Step {
        label,
        capability_id: lease.capability_id.clone(),
        action,
        session,
        error,
        started_ms,
    }
}

/// Verdict on one acceptance criterion.
enum Verdict {
    Met(String),
    NotMet(String),
    NotVerified(String),
}

/// Any string value of `summary` under one of `keys`, lowercased.
fn text_of(summary: &Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| summary.get(*k)).map(|v| match v {
        Value::String(s) => s.to_lowercase(),
        other => other.to_string().to_lowercase(),
    })
}

fn judge_led(step: &Step, deadline_ms: u64) -> Verdict {
    if !step.completed() {
        return Verdict::NotMet(format!(
            "no frame at {deadline_ms} ms: {}",
            step.error.clone().unwrap_or_default()
        ));
    }
    match text_of(&step.summary(), &["led_color", "dominant_color", "color"]) {
        Some(c) if c.contains("blue") || c.contains('蓝') => {
            Verdict::Met(format!("LED blue within {deadline_ms} ms"))
        }
        Some(c) => Verdict::NotMet(format!("LED `{c}` at {deadline_ms} ms, expected blue")),
        None => Verdict::NotVerified("the camera reported no LED colour; check the frame".into()),
    }
}

fn judge_screen(step: &Step) -> Verdict {
    if !step.completed() {
        return Verdict::NotMet(format!(
            "no frame: {}",
            step.error.clone().unwrap_or_default()
        ));
    }
    match text_of(&step.summary(), &["ocr_text", "screen_state", "text"]) {
        Some(t) if t.contains("listening") => Verdict::Met("screen shows `listening`".into()),
        Some(t) => Verdict::NotMet(format!("screen text `{t}` has no `listening`")),
        None => Verdict::NotVerified("no OCR text from the camera; check the frame".into()),
    }
}

fn judge_greeting(step: &Step, greeting: &str) -> Verdict {
    if !step.completed() {
        return Verdict::NotMet(format!(
            "no recording: {}",
            step.error.clone().unwrap_or_default()
        ));
    }
    let summary = step.summary();
    if let Some(t) = text_of(&summary, &["transcript", "text"]) {
        return if t.contains(&greeting.to_lowercase()) {
            Verdict::Met(format!("greeting heard: `{t}`"))
        } else {
            Verdict::NotMet(format!("heard `{t}`, expected `{greeting}`"))
        };
    }
    match summary.get("peak_dbfs").and_then(Value::as_f64) {
        Some(p) if p > -50.0 => Verdict::NotVerified(format!(
            "sound at {p:.1} dBFS but no transcript; listen to the recording"
        )),
        Some(p) => Verdict::NotMet(format!("silence: peak {p:.1} dBFS")),
        None => Verdict::NotVerified("the microphone reported no level or transcript".into()),
    }
}

fn judge_motion(tap: &Step, clip: &Step) -> Verdict {
    match (tap.completed(), clip.completed()) {
        (true, true) if !clip.artifacts().is_empty() => {
            Verdict::Met("tap completed and recorded on the clip".into())
        }
        (true, true) => Verdict::NotVerified("tap completed but the clip has no artifact".into()),
        (false, _) => Verdict::NotMet(format!(
            "tap failed: {}",
            tap.error.clone().unwrap_or_default()
        )),
        (true, false) => Verdict::NotMet(format!(
            "clip failed: {}",
            clip.error.clone().unwrap_or_default()
        )),
    }
}

/// Keep the claim alive: extend every third of its visibility timeout.
fn heartbeat(
    api: String,
    token: String,
    id: String,
    visibility_s: u64,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        let every = Duration::from_secs((visibility_s / 3).max(1));
        loop {
            tokio::time::sleep(every).await;
            let sent = http
                .post(format!("{api}/audit-requests/{id}/extend"))
                .bearer_auth(&token)
                .json(&json!({}))
                .send()
                .await;
            match sent {
                Ok(r) if r.status().is_success() => {}
                Ok(r) => eprintln!("extend answered {}", r.status()),
                Err(e) => eprintln!("extend failed: {e}"),
            }
        }
    })
}

async fn run_script(c: &Client, args: &Args, leases: &[(String, Held)]) -> Result<Value> {
    let lease = |t: &str| -> Result<Held> {
        leases
            .iter()
            .find(|(ty, _)| ty == t)
            .map(|(_, h)| h.clone())
            .ok_or_else(|| anyhow!("the claim has no {t} lease"))
    };
    let (camera, speaker, mic, robot) = (
        lease("camera")?,
        lease("speaker")?,
        lease("microphone")?,
        lease("thumb_robot")?,
    );
    let t0 = Instant::now();
    let record_wait = args.record_ms + 15_000;
    // The camera streams through the whole wake-up: the LED frame is a
    // snapshot from the stream, and stopping it keeps the keyframes as
    // evidence of the robot's press.
    let stream = act(
        c,
        t0,
        "camera stream on",
        &camera,
        "start_stream",
        json!({}),
        15_000,
    )
    .await;
    if let Some(e) = &stream.error {
        bail!("the camera stream did not start: {e}");
    }
    let audio = act(
        c,
        t0,
        "audio of the greeting",
        &mic,
        "record_audio",
        json!({ "duration_ms": args.record_ms }),
        record_wait,
    );
    let wake = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let tap = act(
            c,
            t0,
            "wake tap",
            &robot,
            "tap",
            json!({ "x_mm": args.tap_x_mm, "y_mm": args.tap_y_mm }),
            15_000,
        )
        .await;
        let tapped_at = Instant::now();
        let speak = act(
            c,
            t0,
            "wake phrase",
            &speaker,
            "play_tts",
            json!({ "text": args.wake_phrase }),
            15_000,
        )
        .await;
        tokio::time::sleep(
            Duration::from_millis(args.led_deadline_ms).saturating_sub(tapped_at.elapsed()),
        )
        .await;
        let led = act(
            c,
            t0,
            "frame at the LED deadline",
            &camera,
            "snapshot",
            json!({}),
            15_000,
        )
        .await;
        (tap, speak, led)
    };
    let (audio, (tap, speak, led)) = tokio::join!(audio, wake);
    let clip = act(
        c,
        t0,
        "keyframes of the wake-up",
        &camera,
        "stop_stream",
        json!({ "keep": "keyframes" }),
        30_000,
    )
    .await;
    let steps = [
        stream,
        audio.clone(),
        tap.clone(),
        speak,
        led.clone(),
        clip.clone(),
    ];

    let criteria = [
        (
            "LED 在 2 秒内变蓝",
            judge_led(&led, args.led_deadline_ms),
            "visual",
        ),
        ("屏幕切换到 listening 状态", judge_screen(&led), "visual"),
        (
            "扬声器播报欢迎语",
            judge_greeting(&audio, &args.greeting),
            "audio",
        ),
        (
            "摄像头观测到机械动作完成",
            judge_motion(&tap, &clip),
            "interaction",
        ),
    ];
    let mut findings = Vec::new();
    let (mut visual, mut audio_mm, mut interaction, mut unverified) =
        (vec![], vec![], vec![], vec![]);
    for (i, (criterion, verdict, kind)) in criteria.iter().enumerate() {
        match verdict {
            Verdict::Met(_) => {}
            Verdict::NotMet(why) => {
                findings.push(json!({
                    "finding_id": format!("f-criterion-{}", i + 1),
                    "severity": "high",
                    "title": format!("not met: {criterion}"),
                    "description": why,
                    "evidence_ref_ids": steps.iter().flat_map(Step::artifacts).collect::<Vec<_>>(),
                }));
                match *kind {
                    "visual" => visual.push(why.clone()),
                    "audio" => audio_mm.push(why.clone()),
                    _ => interaction.push(why.clone()),
                }
            }
            Verdict::NotVerified(why) => {
                unverified.push(format!("{criterion}: {why}"));
                findings.push(json!({
                    "finding_id": format!("f-criterion-{}", i + 1),
                    "severity": "low",
                    "title": format!("not verified automatically: {criterion}"),
                    "description": why,
                    "evidence_ref_ids": steps.iter().flat_map(Step::artifacts).collect::<Vec<_>>(),
                    "suggested_fix": "review the recorded evidence",
                }));
            }
        }
    }
    for s in steps.iter().filter(|s| s.error.is_some()) {
        findings.push(json!({
            "finding_id": format!("f-action-{}-{}", s.action, s.started_ms),
            "severity": "medium",
            "title": format!("{} ({} on {}) did not complete", s.label, s.action, s.capability_id),
            "description": s.error.clone().unwrap_or_default(),
            "evidence_ref_ids": s.artifacts(),
        }));
    }
    let failed = criteria
        .iter()
        .any(|(_, v, _)| matches!(v, Verdict::NotMet(_)));
    let (status, decision) = if failed {
        ("completed", "fail")
    } else if !unverified.is_empty() {
        ("needs_human_review", "inconclusive")
    } else {
        ("completed", "pass")
    };
    let met = criteria
        .iter()
        .filter(|(_, v, _)| matches!(v, Verdict::Met(_)))
        .count();
    let mut artifact_refs: Vec<String> = Vec::new();
    for a in steps.iter().flat_map(Step::artifacts) {
        if !artifact_refs.contains(&a) {
            artifact_refs.push(a);
        }
    }
    let timeline: Vec<Value> = steps
        .iter()
        .map(|s| {
            json!({
                "t_ms": s.started_ms,
                "step": s.label,
                "action": s.action,
                "capability_id": s.capability_id,
                "session_id": s.session.as_ref().map(|x| x["session_id"].clone()),
                "status": s.session.as_ref().map(|x| x["status"].clone()),
                "error": s.error,
            })
        })
        .collect();
    Ok(json!({
        "audit_type": "multimodal",
        "status": status,
        "decision": decision,
        "confidence": if decision == "inconclusive" { 0.3 } else { 0.5 + 0.1 * met as f64 },
        "summary": format!("{met} of 4 acceptance criteria met; {} not verified automatically", unverified.len()),
        "findings": findings,
        "required_actions": if failed { vec!["fix the failed criteria and run the audit again"] } else { vec![] },
        "used_capabilities": leases.iter().map(|(_, h)| h.capability_id.clone()).collect::<Vec<_>>(),
        "artifact_refs": artifact_refs,
        "timeline": timeline,
        "duration_ms": t0.elapsed().as_millis() as u64,
        "completed_at": chrono::Utc::now(),
        "observed_timeline": timeline,
        "visual_mismatches": visual,
        "audio_mismatches": audio_mm,
        "interaction_failures": interaction,
        "perceptual_verdict": criteria.iter().map(|(c, v, _)| match v {
            Verdict::Met(w) => format!("{c}: met ({w})"),
            Verdict::NotMet(w) => format!("{c}: NOT met ({w})"),
            Verdict::NotVerified(w) => format!("{c}: not verified ({w})"),
        }).collect::<Vec<_>>().join("; "),
        "needs_human_review_reason": if unverified.is_empty() { Value::Null } else { json!(unverified.join("; ")) },
    }))
}

async fn run(args: Args) -> Result<i32> {
    let c = Client {
        http: reqwest::Client::new(),
        api: format!("{}/api/v1", args.base_url.trim_end_matches('/')),
        token: args.token.clone(),
    };
    if args.create {
        create(&c, &args).await?;
    }
    let (s, task) = c
        .post(
            "/audit-requests/claim",
            &json!({ "audit_types": ["multimodal"], "agent_ref": args.agent_ref, "wait_ms": args.wait_ms }),
        )
        .await?;
    match s {
        StatusCode::OK => {}
        StatusCode::NO_CONTENT => {
            eprintln!("nothing to claim within {} ms", args.wait_ms);
            return Ok(3);
        }
        _ => bail!("claim answered {s}: {task}"),
    }
    let id = task["request"]["audit_request_id"]
        .as_str()
        .ok_or_else(|| anyhow!("claim answer without request id: {task}"))?
        .to_string();
    let attempt = task["claim"]["attempt"].as_u64().unwrap_or(1);
    eprintln!("claimed {id} (attempt {attempt})");
    let leases: Vec<(String, Held)> = task["assignments"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|a| {
            Some((
                a["capability_type"].as_str()?.to_string(),
                Held {
                    lease_id: a["lease_id"].as_str()?.to_string(),
                    capability_id: a["capability_id"].as_str()?.to_string(),
                },
            ))
        })
        .collect();
    let release = |reason: String| {
        let c = &c;
        let id = id.clone();
        async move {
            match c
                .post(
                    &format!("/audit-requests/{id}/release"),
                    &json!({ "reason": reason }),
                )
                .await
            {
                Ok((s, _)) if s.is_success() => eprintln!("gave {id} back: {reason}"),
                Ok((s, v)) => eprintln!("release of {id} answered {s}: {v}"),
                Err(e) => eprintln!("release of {id} failed: {e:#}"),
            }
        }
    };
    let needed = ["camera", "speaker", "microphone", "thumb_robot"];
    if !needed.iter().all(|t| leases.iter().any(|(ty, _)| ty == t)) {
        release(
            "not an LED-validation task: it lacks camera, speaker, microphone or thumb_robot"
                .into(),
        )
        .await;
        return Ok(4);
    }
    let visibility = task["claim"]["visibility_timeout_seconds"]
        .as_u64()
        .unwrap_or(30);
    let beat = heartbeat(c.api.clone(), c.token.clone(), id.clone(), visibility);
    let outcome = run_script(&c, &args, &leases).await;
    beat.abort();
    let mut result = match outcome {
        Ok(r) => r,
        Err(e) => {
            release(format!("{e:#}")).await;
            return Err(e);
        }
    };
    result["audit_request_id"] = json!(id);
    let (s, body) = c
        .post(&format!("/audit-requests/{id}/result"), &result)
        .await?;
    if !s.is_success() {
        release(format!("result refused: {s}")).await;
        bail!("result for {id} refused: {s} {body}");
    }
    println!("{}", serde_json::to_string_pretty(&result)?);
    eprintln!(
        "posted result for {id}: {} / {}",
        result["status"].as_str().unwrap_or("?"),
        result["decision"].as_str().unwrap_or("?")
    );
    Ok(0)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let code = match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("led-audit-agent: {e:#}");
            1
        }
    };
    std::process::exit(code);
}
