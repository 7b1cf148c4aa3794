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
//! 5. waits (`--derive-wait-ms`) for the evidence the registry derives
//!    from the script's images and recording (docs/audit-trail.md
//!    "Derived evidence", listed by `GET /api/v1/artifacts?derived_from=`):
//!    `detection_json` of the `led` and `button` regions, `ocr_text` of the
//!    `display` region, the recording's `transcript`;
//! 6. judges each acceptance criterion from it (docs/audit-protocol.md
//!    "Example agent"), one finding per criterion citing the derived
//!    artifact and its source, and posts an `AuditTaskResult` with the
//!    multimodal outputs (§11.2). The verdict is pass only when all four
//!    are met; a criterion without derived evidence is reported as not
//!    verified, and the result asks for human review instead of guessing.
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
use chrono::{DateTime, Utc};
use clap::Parser;
use reqwest::StatusCode;
use serde_json::{json, Value};

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
    /// The welcome line the device should say (the simulated DUT's
    /// default `welcome_line`).
    #[arg(long, default_value = "welcome how can i help you today")]
    welcome_line: String,
    /// Share (0..1) of the welcome line's distinct words the transcript
    /// must have.
    #[arg(long, default_value_t = 0.6)]
    welcome_min_share: f64,
    /// Colour name the `button` region has while the robot's stylus is
    /// over it.
    #[arg(long, default_value = "black")]
    finger_colour: String,
    /// How long to wait for the registry's derived evidence of the
    /// script's images and recording, milliseconds.
    #[arg(long, default_value_t = 60_000)]
    derive_wait_ms: u64,
    /// Length of the audio recording, milliseconds.
    #[arg(long, default_value_t = 7000)]
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

/// Verdict on one acceptance criterion, with the artifacts it rests on
/// (each derived artifact and its source).
enum Verdict {
    Met(String, Vec<String>),
    NotMet(String, Vec<String>),
    NotVerified(String, Vec<String>),
}

impl Verdict {
    fn evidence(&self) -> &[String] {
        match self {
            Verdict::Met(_, e) | Verdict::NotMet(_, e) | Verdict::NotVerified(_, e) => e,
        }
    }
    fn why(&self) -> &str {
        match self {
            Verdict::Met(w, _) | Verdict::NotMet(w, _) | Verdict::NotVerified(w, _) => w,
        }
    }
}

/// An artifact timestamp: `metadata_json.captured_at` (a camera frame's
/// own time) when present, else the record's `captured_at`.
fn captured_at(a: &Value) -> Option<DateTime<Utc>> {
    let text = a["metadata_json"]["captured_at"]
        .as_str()
        .or_else(|| a["captured_at"].as_str())?;
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn session_time(step: &Step, key: &str) -> Option<DateTime<Utc>> {
    let text = step.session.as_ref()?[key].as_str()?.to_string();
    DateTime::parse_from_rfc3339(&text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// One camera image and what the registry derived from it.
#[derive(Debug, Clone)]
struct Image {
    artifact_id: String,
    /// `keyframe` (of the stream) or `snapshot`.
    origin: &'static str,
    at: DateTime<Utc>,
    /// `detection_json` record.
    detection: Option<Value>,
    /// `ocr_text` record.
    ocr: Option<Value>,
}

impl Image {
    /// The colour name the detection gives region `name`.
    fn colour(&self, name: &str) -> Option<(String, String)> {
        let d = self.detection.as_ref()?;
        let region = d["metadata_json"]["regions"]
            .as_array()?
            .iter()
            .find(|r| r["name"] == name)?;
        Some((
            region["colour"].as_str()?.to_string(),
            d["artifact_id"].as_str()?.to_string(),
        ))
    }

    /// The text OCR read in region `name` (lowercased).
    fn text(&self, name: &str) -> Option<(String, String)> {
        let o = self.ocr.as_ref()?;
        let m = &o["metadata_json"];
        let t = m["regions_text"][name]
            .as_str()
            .or_else(|| m["text"].as_str())?;
        Some((t.to_lowercase(), o["artifact_id"].as_str()?.to_string()))
    }

    fn ms_after(&self, t: DateTime<Utc>) -> i64 {
        (self.at - t).num_milliseconds()
    }
}

/// The derived evidence the judges read.
struct Evidence {
    /// Images of the camera, in capture order.
    images: Vec<Image>,
    /// The microphone clip and its `transcript` record, when derived.
    audio: Option<(String, Option<Value>)>,
}

/// The artifact records of `ids`, with the registry's derived artifacts
/// of each, waiting up to `wait_ms` for the derivers: images until they
/// have a `detection_json` and an `ocr_text`, audio clips until they have a
/// `transcript`.
async fn gather(
    c: &Client,
    ids: &[(String, &'static str)],
    wait_ms: u64,
) -> Result<Vec<(Value, &'static str, Vec<Value>)>> {
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let mut records = Vec::new();
    for (id, origin) in ids {
        let (s, a) = c
            .call(reqwest::Method::GET, &format!("/artifacts/{id}"), None)
            .await?;
        if !s.is_success() {
            bail!("artifact {id}: {s} {a}");
        }
        records.push((a, *origin, Vec::new()));
    }
    loop {
        let mut missing = 0;
        for (a, _, derived) in records.iter_mut() {
            let want: &[&str] = match a["artifact_type"].as_str() {
                Some("image") => &["detection_json", "ocr_text"],
                Some("audio_clip") => &["transcript"],
                _ => &[],
            };
            let has = |d: &[Value], t: &str| d.iter().any(|x| x["artifact_type"] == t);
            if want.iter().all(|t| has(derived, t)) {
                continue;
            }
            let id = a["artifact_id"].as_str().unwrap_or_default();
            let (s, list) = c
                .call(
                    reqwest::Method::GET,
                    &format!("/artifacts?derived_from={id}"),
                    None,
                )
                .await?;
            if s.is_success() {
                *derived = list["artifacts"].as_array().cloned().unwrap_or_default();
            }
            if !want.iter().all(|t| has(derived, t)) {
                missing += 1;
            }
        }
        if missing == 0 || Instant::now() >= deadline {
            if missing > 0 {
                eprintln!("{missing} artifact(s) still lack derived evidence after {wait_ms} ms");
            }
            return Ok(records);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn evidence_of(records: Vec<(Value, &'static str, Vec<Value>)>) -> Evidence {
    let mut images = Vec::new();
    let mut audio = None;
    for (a, origin, derived) in records {
        let id = a["artifact_id"].as_str().unwrap_or_default().to_string();
        let of = |t: &str| derived.iter().find(|d| d["artifact_type"] == t).cloned();
        match a["artifact_type"].as_str() {
            Some("image") => {
                if let Some(at) = captured_at(&a) {
                    images.push(Image {
                        artifact_id: id,
                        origin,
                        at,
                        detection: of("detection_json"),
                        ocr: of("ocr_text"),
                    });
                }
            }
            Some("audio_clip") if audio.is_none() => audio = Some((id, of("transcript"))),
            _ => {}
        }
    }
    images.sort_by_key(|i| i.at);
    Evidence { images, audio }
}

/// LED: the first image after the tap started whose `led` region is
/// `blue` must be captured at most `deadline_ms` after the tap's session
/// ended.
fn judge_led(tap: &Step, ev: &Evidence, deadline_ms: u64) -> Verdict {
    let (Some(start), Some(end)) = (
        session_time(tap, "started_at"),
        session_time(tap, "ended_at"),
    ) else {
        return Verdict::NotMet(
            format!(
                "the tap did not complete: {}",
                tap.error.clone().unwrap_or_default()
            ),
            tap.artifacts(),
        );
    };
    let seen: Vec<(&Image, String, String)> = ev
        .images
        .iter()
        .filter(|i| i.at >= start)
        .filter_map(|i| i.colour("led").map(|(c, d)| (i, c, d)))
        .collect();
    if seen.is_empty() {
        return Verdict::NotVerified(
            "no colour detection of the `led` region after the tap; check the frames".into(),
            vec![],
        );
    }
    if let Some((img, _, det)) = seen.iter().find(|(_, c, _)| c == "blue") {
        let after = img.ms_after(end);
        let ids = vec![det.clone(), img.artifact_id.clone()];
        return if after <= deadline_ms as i64 {
            Verdict::Met(
                format!(
                    "LED blue {after} ms after the tap ended (a {} image)",
                    img.origin
                ),
                ids,
            )
        } else {
            Verdict::NotMet(format!("LED first blue {after} ms after the tap ended (a {} image), later than {deadline_ms} ms", img.origin), ids)
        };
    }
    let (last, colour, det) = seen.last().expect("not empty");
    let covered = last.ms_after(end);
    let ids = vec![det.clone(), last.artifact_id.clone()];
    if covered >= deadline_ms as i64 {
        Verdict::NotMet(
            format!(
                "LED `{colour}`, never blue, in {} images up to {covered} ms after the tap ended",
                seen.len()
            ),
            ids,
        )
    } else {
        Verdict::NotVerified(
            format!("LED `{colour}` and no image {deadline_ms} ms after the tap; check the frames"),
            ids,
        )
    }
}

/// Screen: an `ocr_text` of the `display` region after the tap started
/// containing `listening`.
fn judge_screen(tap: &Step, ev: &Evidence) -> Verdict {
    let start = session_time(tap, "started_at").unwrap_or(DateTime::<Utc>::MIN_UTC);
    let read: Vec<(&Image, String, String)> = ev
        .images
        .iter()
        .filter(|i| i.at >= start)
        .filter_map(|i| i.text("display").map(|(t, d)| (i, t, d)))
        .collect();
    if let Some((img, t, ocr)) = read.iter().find(|(_, t, _)| t.contains("listening")) {
        return Verdict::Met(
            format!("display reads `{}` (a {} image)", t.trim(), img.origin),
            vec![ocr.clone(), img.artifact_id.clone()],
        );
    }
    match read.last() {
        Some((img, t, ocr)) => Verdict::NotMet(
            format!(
                "display reads `{}`, no `listening`, in {} images",
                t.trim(),
                read.len()
            ),
            vec![ocr.clone(), img.artifact_id.clone()],
        ),
        None => Verdict::NotVerified(
            "no OCR of the `display` region after the tap; check the frames".into(),
            vec![],
        ),
    }
}

/// Lowercase words of `text` (letters, digits and apostrophes).
fn words(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// Welcome line: the share of the expected line's distinct words that the
/// clip's `transcript` has must reach `min_share`.
fn judge_welcome(audio_step: &Step, ev: &Evidence, expected: &str, min_share: f64) -> Verdict {
    let Some((clip, transcript)) = &ev.audio else {
        return Verdict::NotMet(
            format!(
                "no recording: {}",
                audio_step.error.clone().unwrap_or_default()
            ),
            vec![],
        );
    };
    let Some(t) = transcript else {
        return Verdict::NotVerified(
            "no transcript of the recording; listen to it".into(),
            vec![clip.clone()],
        );
    };
    let ids = vec![
        t["artifact_id"].as_str().unwrap_or_default().to_string(),
        clip.clone(),
    ];
    let heard_text = t["metadata_json"]["text"].as_str().unwrap_or_default();
    let heard = words(heard_text);
    let mut want = words(expected);
    want.sort();
    want.dedup();
    if want.is_empty() {
        return Verdict::NotVerified("the expected welcome line has no words".into(), ids);
    }
    let found = want.iter().filter(|w| heard.contains(w)).count();
    let share = found as f64 / want.len() as f64;
    let why = format!(
        "heard `{heard_text}`: {found} of {} words of `{expected}` ({:.0} %, at least {:.0} % needed)",
        want.len(),
        share * 100.0,
        min_share * 100.0
    );
    if share + 1e-9 >= min_share {
        Verdict::Met(why, ids)
    } else {
        Verdict::NotMet(why, ids)
    }
}

/// Press: an image during or after the tap whose `button` region shows
/// the robot's stylus (`finger_colour`).
fn judge_press(tap: &Step, ev: &Evidence, finger_colour: &str) -> Verdict {
    let Some(start) = session_time(tap, "started_at").filter(|_| tap.completed()) else {
        return Verdict::NotMet(
            format!("tap failed: {}", tap.error.clone().unwrap_or_default()),
            vec![],
        );
    };
    let seen: Vec<(&Image, String, String)> = ev
        .images
        .iter()
        .filter(|i| i.at >= start)
        .filter_map(|i| i.colour("button").map(|(c, d)| (i, c, d)))
        .collect();
    if let Some((img, _, det)) = seen.iter().find(|(_, c, _)| c == finger_colour) {
        return Verdict::Met(
            format!("the stylus ({finger_colour}) covers the button {} ms after the tap started (a {} image)", img.ms_after(start), img.origin),
            vec![det.clone(), img.artifact_id.clone()],
        );
    }
    match seen.last() {
        Some((img, c, det)) => Verdict::NotMet(
            format!(
                "the button region stays `{c}` in {} images: no stylus seen",
                seen.len()
            ),
            vec![det.clone(), img.artifact_id.clone()],
        ),
        None => Verdict::NotVerified(
            "no colour detection of the `button` region; check the frames".into(),
            vec![],
        ),
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
        // The wake phrase plays while the deadline frame waits for its time.
        let speak = act(
            c,
            t0,
            "wake phrase",
            &speaker,
            "play_tts",
            json!({ "text": args.wake_phrase }),
            15_000,
        );
        let led = async {
            tokio::time::sleep(
                Duration::from_millis(args.led_deadline_ms).saturating_sub(tapped_at.elapsed()),
            )
            .await;
            act(
                c,
                t0,
                "frame at the LED deadline",
                &camera,
                "snapshot",
                json!({}),
                15_000,
            )
            .await
        };
        let (speak, led) = tokio::join!(speak, led);
        (tap, speak, led)
    };
    let (audio, (tap, speak, led)) = tokio::join!(audio, wake);
    let clip = act(
        c,
        t0,
        "keyframes of the wake-up",
        &camera,
        "stop_stream",
        // Every frame that differs from the previous keyframe, at most
        // two a second: the robot's stylus arriving, the display and the
        // LED changing.
        json!({ "keep": "keyframes", "change_threshold": 0.0, "min_interval_ms": 500, "max_keyframes": 30 }),
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

    // The images (the stream's keyframes and the snapshot at the LED
    // deadline) and the recording, with what the registry derived.
    let mut sources: Vec<(String, &'static str)> = Vec::new();
    for id in clip.artifacts() {
        sources.push((id, "keyframe"));
    }
    for id in led.artifacts() {
        sources.push((id, "snapshot"));
    }
    for id in audio.artifacts() {
        sources.push((id, "recording"));
    }
    let ev = evidence_of(gather(c, &sources, args.derive_wait_ms).await?);

    let criteria = [
        (
            "LED 在 2 秒内变蓝",
            judge_led(&tap, &ev, args.led_deadline_ms),
            "visual",
        ),
        (
            "屏幕切换到 listening 状态",
            judge_screen(&tap, &ev),
            "visual",
        ),
        (
            "扬声器播报欢迎语",
            judge_welcome(&audio, &ev, &args.welcome_line, args.welcome_min_share),
            "audio",
        ),
        (
            "摄像头观测到机械动作完成",
            judge_press(&tap, &ev, &args.finger_colour),
            "interaction",
        ),
    ];
    let mut findings = Vec::new();
    let (mut visual, mut audio_mm, mut interaction, mut unverified) =
        (vec![], vec![], vec![], vec![]);
    for (i, (criterion, verdict, kind)) in criteria.iter().enumerate() {
        let (severity, title) = match verdict {
            Verdict::Met(..) => ("low", format!("met: {criterion}")),
            Verdict::NotMet(why, _) => {
                match *kind {
                    "visual" => visual.push(why.clone()),
                    "audio" => audio_mm.push(why.clone()),
                    _ => interaction.push(why.clone()),
                }
                ("high", format!("not met: {criterion}"))
            }
            Verdict::NotVerified(why, _) => {
                unverified.push(format!("{criterion}: {why}"));
                ("low", format!("not verified automatically: {criterion}"))
            }
        };
        let mut finding = json!({
            "finding_id": format!("f-criterion-{}", i + 1),
            "severity": severity,
            "title": title,
            "description": verdict.why(),
            "evidence_ref_ids": verdict.evidence(),
        });
        if matches!(verdict, Verdict::NotVerified(..)) {
            finding["suggested_fix"] = json!("review the recorded evidence");
        }
        findings.push(finding);
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
        .any(|(_, v, _)| matches!(v, Verdict::NotMet(..)));
    let (status, decision) = if failed {
        ("completed", "fail")
    } else if !unverified.is_empty() {
        ("needs_human_review", "inconclusive")
    } else {
        ("completed", "pass")
    };
    let met = criteria
        .iter()
        .filter(|(_, v, _)| matches!(v, Verdict::Met(..)))
        .count();
    let mut artifact_refs: Vec<String> = Vec::new();
    let cited = criteria.iter().flat_map(|(_, v, _)| v.evidence().to_vec());
    for a in steps.iter().flat_map(Step::artifacts).chain(cited) {
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
            Verdict::Met(w, _) => format!("{c}: met ({w})"),
            Verdict::NotMet(w, _) => format!("{c}: NOT met ({w})"),
            Verdict::NotVerified(w, _) => format!("{c}: not verified ({w})"),
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
