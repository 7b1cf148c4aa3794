//! Queue aging across real processes (docs/policy.md "Queue aging"): one
//! camera, held at priority 50 and handed on every `HOLD` to a fresh
//! priority-50 request that arrives just before each release (a holder
//! that releases and leases again), and a priority-10 request waiting. With `[policy.queue_aging]` the low request is granted within
//! the documented bound, (50 − 10) / rate minutes plus one holding period,
//! and its boost (which takes it above the holders' 50) never preempts
//! anybody; without it the low request starves for as long.

use std::time::{Duration, Instant};

use benchlink_e2e::bench::{caps, Lab, LabOptions, CHIEF_AGENT, HW_AGENT};
use benchlink_e2e::client::{follow_events, Agent, EventLog};
use reqwest::StatusCode;
use serde_json::{json, Value};

/// Priority points a waiting request gains per minute: 10 a second.
const RATE_PER_MINUTE: f64 = 600.0;
const MAX_BOOST: u32 = 50;
const HIGH: u8 = 50;
const LOW: u8 = 10;
/// How long each holder keeps the camera before releasing it.
const HOLD: Duration = Duration::from_secs(3);
/// Scheduling, sweeps (100 ms in the lab) and HTTP round trips.
const SLACK: Duration = Duration::from_secs(2);

/// The documented bound: the boost reaches the competing priority after
/// (HIGH − LOW) / rate minutes; the capability frees within one holding
/// period after that.
fn aging_bound() -> Duration {
    Duration::from_secs_f64(f64::from(HIGH - LOW) / RATE_PER_MINUTE * 60.0) + HOLD
}

fn lease_body(holder_ref: &str, priority: u8, preempt: bool) -> Value {
    let mut b = json!({
        "capability_id": caps::CAMERA,
        "holder_type": "audit_agent",
        "holder_ref": holder_ref,
        "project_id": "proj_queue_aging",
        "purpose": "queue aging",
        "priority": priority,
        "requested_duration_seconds": 120,
        "evidence_required": false,
    });
    if preempt {
        // On the default whitelist: this request would preempt if its
        // boost counted.
        b["preempt_if_needed"] = json!(true);
        b["preempt_reason"] = json!("safety_stop");
    }
    b
}

async fn request(agent: &Agent, holder_ref: &str, priority: u8, preempt: bool) -> Value {
    let (s, l) = agent
        .post(
            "/api/v1/capability-leases/request",
            &lease_body(holder_ref, priority, preempt),
        )
        .await
        .expect("lease request");
    let want = if l["status"] == "requested" {
        StatusCode::ACCEPTED
    } else {
        StatusCode::CREATED
    };
    assert_eq!(s, want, "{l}");
    l
}

fn id(lease: &Value) -> String {
    lease["lease_id"].as_str().expect("lease_id").to_string()
}

async fn lease(agent: &Agent, lease_id: &str) -> Value {
    agent
        .get_ok(&format!("/api/v1/capability-leases/{lease_id}"))
        .await
        .expect("GET lease")
}

/// What happened to the low request while the stream ran.
struct Run {
    /// Time from sending the low request to seeing it hold the camera.
    low_granted_after: Option<Duration>,
    /// Priority-50 requests granted while the low one waited.
    high_grants_meanwhile: usize,
    low: String,
}

/// Drive the stream for at most `limit` after the low request arrives.
async fn run_stream(lab: &Lab, limit: Duration) -> Run {
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let chief = Agent::new(&lab.base_url, CHIEF_AGENT, &lab.chief_token);
    let mut n = 0;
    let mut next_ref = || {
        n += 1;
        format!("{HW_AGENT}:s{n}")
    };
    let first = request(&hw, &next_ref(), HIGH, false).await;
    assert_eq!(first["status"], "granted", "{first}");
    let mut holder = id(&first);

    let t0 = Instant::now();
    let low = request(&chief, CHIEF_AGENT, LOW, true).await;
    assert_eq!(low["status"], "requested", "{low}");
    assert_eq!(low["priority"], LOW, "the wire shows the own priority");
    let low = id(&low);

    let mut high_grants = 0;
    let mut low_granted_after = None;
    while t0.elapsed() < limit {
        tokio::time::sleep(HOLD).await;
        // A fresh competitor for every release: one always waits.
        let l = request(&hw, &next_ref(), HIGH, false).await;
        assert_eq!(l["status"], "requested", "{l}");
        let held = lease(&hw, &holder).await;
        assert_eq!(
            held["status"], "granted",
            "the holder keeps its lease until it releases it: {held}"
        );
        let (s, r) = hw.release(&holder).await.expect("release");
        assert_eq!(s, StatusCode::OK, "{r}");
        assert_eq!(r["status"], "released", "{r}");

        let active = hw
            .get_ok(&format!(
                "/api/v1/capability-leases?capability_id={}&active_only=true",
                caps::CAMERA
            ))
            .await
            .expect("list");
        let active = active["leases"].as_array().cloned().unwrap_or_default();
        assert_eq!(
            active.len(),
            1,
            "the next waiter got the camera: {active:?}"
        );
        let next = id(&active[0]);
        if next == low {
            low_granted_after = Some(t0.elapsed());
            break;
        }
        assert_eq!(active[0]["priority"], HIGH, "{active:?}");
        high_grants += 1;
        holder = next;
    }
    Run {
        low_granted_after,
        high_grants_meanwhile: high_grants,
        low,
    }
}

fn assert_nobody_preempted(events: &EventLog) {
    for t in ["lease_preempt_requested", "lease_preempted"] {
        assert!(events.of(t).is_empty(), "{t}: {:?}", events.of(t));
    }
}

async fn lab(extra_toml: &str) -> (Lab, EventLog) {
    let lab = Lab::start(LabOptions {
        registry_extra_toml: extra_toml.to_string(),
        ..Default::default()
    })
    .await
    .expect("lab");
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let (events, _follower) = follow_events(&admin, |_| {});
    (lab, events)
}

#[tokio::test]
async fn a_low_priority_request_is_granted_within_the_aging_bound_and_preempts_nobody() {
    let (lab, events) = lab(&format!(
        "[policy.queue_aging]\npriority_per_minute = {RATE_PER_MINUTE:?}\nmax_boost = {MAX_BOOST}\n"
    ))
    .await;
    let bound = aging_bound();
    let run = run_stream(&lab, bound + SLACK).await;
    let after = run
        .low_granted_after
        .unwrap_or_else(|| panic!("the low request was not granted within {bound:?} + {SLACK:?}"));
    eprintln!(
        "low request granted after {after:?} (bound {bound:?}), {} higher ones granted meanwhile",
        run.high_grants_meanwhile
    );
    assert!(after <= bound + SLACK, "{after:?} > {bound:?} + {SLACK:?}");
    assert!(
        run.high_grants_meanwhile >= 1,
        "the higher stream went first until the boost caught up"
    );
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let low = lease(&hw, &run.low).await;
    assert_eq!(low["status"], "granted", "{low}");
    assert_eq!(
        low["priority"], LOW,
        "the boost is not the lease's priority"
    );

    // Its boost took it above the holders' 50 for a while before the
    // grant (60 at most), and its request may preempt: still nobody was.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !events.of("lease_granted").is_empty(),
        "the stream is followed"
    );
    assert_nobody_preempted(&events);
}

#[tokio::test]
async fn without_aging_a_low_priority_request_starves_as_long() {
    let (lab, events) = lab("").await;
    let limit = aging_bound() + SLACK;
    let run = run_stream(&lab, limit).await;
    assert_eq!(
        run.low_granted_after, None,
        "without aging the stream of priority {HIGH} always goes first"
    );
    assert!(
        run.high_grants_meanwhile >= 2,
        "{}",
        run.high_grants_meanwhile
    );
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let low = lease(&hw, &run.low).await;
    assert_eq!(low["status"], "requested", "still waiting: {low}");
    assert_nobody_preempted(&events);
}
