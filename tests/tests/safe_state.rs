//! Safe state on release across real processes (docs/policy.md "Safe
//! state on release"): a real registry, a real edge agent and the bench
//! simulators on ptys (bench-sim's journal says what reached the Korad PSU
//! and the LCUS relay board, and when).
//!
//! - An admin revokes the PSU's holder while its output is on: the
//!   safe-state holder's `power_off` reaches the PSU before anything of the
//!   next holder, whose first reading sees the output off; the run is a
//!   session of a lease with `holder_type: system`.
//! - A relay lease expires with channel 1 on: `switch_off` reaches the
//!   board before the next holder's first frame.
//! - A preempted robot holder's `on_release` action fails: the capability
//!   is marked unhealthy (`capability_health_changed`), and a request that
//!   will not wait is refused with 503 `capability_unhealthy`.

use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, CHIEF_AGENT, HW_AGENT};
use benchlink_e2e::client::{follow_events, Agent, EventLog};
use benchlink_e2e::eventually;
use chrono::DateTime;
use reqwest::StatusCode;
use serde_json::{json, Value};

const SAFE_STATE_PRINCIPAL: &str = "system:safe-state";

struct Fixture {
    lab: Lab,
    admin: Agent,
    hw: Agent,
    chief: Agent,
    events: EventLog,
}

/// A lab whose capability `cap` has `on_release` (a TOML value).
async fn fixture(cap: &str, on_release: &str) -> Fixture {
    let lab = Lab::start(LabOptions {
        capability_keys: vec![(cap.to_string(), format!("on_release = {on_release}"))],
        ..Default::default()
    })
    .await
    .expect("lab");
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let chief = Agent::new(&lab.base_url, CHIEF_AGENT, &lab.chief_token);
    let (events, _follower) = follow_events(&admin, |_| {});
    Fixture {
        lab,
        admin,
        hw,
        chief,
        events,
    }
}

/// A lease request body for `who` on `cap`.
fn request(who: &str, cap: &str, priority: u8, seconds: u32) -> Value {
    json!({
        "capability_id": cap,
        "holder_type": "audit_agent",
        "holder_ref": who,
        "project_id": "proj_safe_state",
        "purpose": "safe state on release",
        "priority": priority,
        "requested_duration_seconds": seconds,
        "evidence_required": false,
    })
}

impl Fixture {
    /// `agent` asks for `body`'s capability without waiting; returns the
    /// lease as answered.
    async fn ask(&self, agent: &Agent, body: &Value) -> Value {
        let (s, l) = agent
            .post("/api/v1/capability-leases/request?wait_seconds=0", body)
            .await
            .expect("lease request");
        assert!(s.is_success(), "{s}: {l}");
        l
    }

    /// Wait until lease `id` is `granted`.
    async fn granted(&self, id: &str) -> Value {
        eventually(Duration::from_secs(30), "lease granted", || async {
            let l = self
                .admin
                .get_ok(&format!("/api/v1/capability-leases/{id}"))
                .await
                .ok()?;
            (l["status"] == "granted").then_some(l)
        })
        .await
    }

    /// The sessions on `cap`, oldest first.
    async fn sessions(&self, cap: &str) -> Vec<Value> {
        let v = self
            .admin
            .get_ok(&format!("/api/v1/sessions?capability_id={cap}"))
            .await
            .expect("sessions");
        let mut s = v["sessions"].as_array().cloned().unwrap_or_default();
        s.reverse();
        s
    }

    /// The safe-state holder's lease of `session`, checked to be one.
    async fn system_lease_of(&self, session: &Value) -> Value {
        let lease_id = session["lease_id"].as_str().expect("lease_id");
        let lease = self
            .admin
            .get_ok(&format!("/api/v1/capability-leases/{lease_id}"))
            .await
            .expect("system lease");
        assert_eq!(lease["holder_type"], "system", "{lease}");
        assert_eq!(lease["principal"], SAFE_STATE_PRINCIPAL, "{lease}");
        assert_eq!(lease["purpose"], "on_release safe state", "{lease}");
        lease
    }

    /// Position of the first event matching `pred` on the stream.
    fn position(&self, what: &str, pred: impl Fn(&Value) -> bool) -> usize {
        self.events
            .all()
            .iter()
            .position(pred)
            .unwrap_or_else(|| panic!("no {what} event: {:#?}", self.events.all()))
    }
}

fn millis(ts: &Value) -> i64 {
    DateTime::parse_from_rfc3339(ts.as_str().expect("timestamp"))
        .expect("rfc3339")
        .timestamp_millis()
}

#[tokio::test]
async fn a_revoked_holders_psu_is_off_before_the_next_holders_first_action() {
    let f = fixture(caps::PSU, r#"[{ action = "power_off" }]"#).await;
    let a = f.ask(&f.hw, &request(HW_AGENT, caps::PSU, 50, 120)).await;
    assert_eq!(a["status"], "granted", "{a}");
    let a_id = a["lease_id"].as_str().unwrap().to_string();
    let on =
        f.hw.act_ok(&a_id, "power_on", json!({"voltage_v": 5.0}))
            .await
            .expect("power_on");
    assert_eq!(on["result_summary"]["output_on"], true, "{on}");

    let b = f
        .ask(&f.chief, &request(CHIEF_AGENT, caps::PSU, 50, 120))
        .await;
    assert_eq!(b["status"], "requested", "{b}");
    let b_id = b["lease_id"].as_str().unwrap().to_string();

    // The admin takes the PSU away from its holder.
    let (s, revoked) = f
        .admin
        .post(
            &format!("/api/v1/capability-leases/{a_id}/release"),
            &json!({"reason": "operator takes the bench"}),
        )
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK, "{revoked}");

    f.granted(&b_id).await;
    let first = f
        .chief
        .act_ok(&b_id, "measure_output", json!({}))
        .await
        .expect("B's first action");
    assert_eq!(first["result_summary"]["output_on"], false, "{first}");

    // The safe-state run is a session of the system holder's lease.
    let sessions = f.sessions(caps::PSU).await;
    let run = sessions
        .iter()
        .find(|s| s["action"] == "power_off")
        .unwrap_or_else(|| panic!("no power_off session: {sessions:#?}"));
    assert_eq!(run["status"], "completed", "{run}");
    let system = f.system_lease_of(run).await;
    assert_eq!(system["status"], "released", "{system}");
    assert!(millis(&run["ended_at"]) <= millis(&first["started_at"]));

    // The PSU got OUT0 after A's OUT1 and before any command of B's.
    let journal = f.lab.psu_commands();
    let out1 = journal
        .iter()
        .rposition(|c| c["command"] == "OUT1")
        .unwrap_or_else(|| panic!("no OUT1: {journal:#?}"));
    let out0 = journal
        .iter()
        .skip(out1)
        .find(|c| c["command"] == "OUT0")
        .unwrap_or_else(|| panic!("no OUT0 after OUT1: {journal:#?}"));
    let b_started = millis(&first["started_at"]);
    assert!(
        out0["at_unix_ms"].as_i64().unwrap() <= b_started,
        "OUT0 {out0} after B's first action started at {b_started}"
    );

    // Events: A's end, the system lease's grant, the run, its release,
    // then B's grant.
    let system_id = system["lease_id"].as_str().unwrap().to_string();
    let session_id = run["session_id"].as_str().unwrap().to_string();
    f.events
        .wait_for("B granted", Duration::from_secs(5), |e| {
            e["event_type"] == "lease_granted" && e["lease_id"] == b_id.as_str()
        })
        .await
        .unwrap();
    let order = [
        f.position("A released", |e| {
            e["event_type"] == "lease_released" && e["lease_id"] == a_id.as_str()
        }),
        f.position("system granted", |e| {
            e["event_type"] == "lease_granted" && e["lease_id"] == system_id.as_str()
        }),
        f.position("run completed", |e| {
            e["event_type"] == "session_completed" && e["session_id"] == session_id.as_str()
        }),
        f.position("system released", |e| {
            e["event_type"] == "lease_released"
                && e["lease_id"] == system_id.as_str()
                && e["data"]["reason"] == "safe_state_done"
        }),
        f.position("B granted", |e| {
            e["event_type"] == "lease_granted" && e["lease_id"] == b_id.as_str()
        }),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
}

#[tokio::test]
async fn an_expired_relay_lease_is_switched_off_before_the_next_holders_first_frame() {
    let f = fixture(
        caps::RELAY,
        r#"[{ action = "switch_off", params = { channel = 1 } }]"#,
    )
    .await;
    let a = f.ask(&f.hw, &request(HW_AGENT, caps::RELAY, 50, 3)).await;
    assert_eq!(a["status"], "granted", "{a}");
    let a_id = a["lease_id"].as_str().unwrap().to_string();
    f.hw.act_ok(&a_id, "switch_on", json!({"channel": 1}))
        .await
        .expect("switch_on");
    let b = f
        .ask(&f.chief, &request(CHIEF_AGENT, caps::RELAY, 50, 60))
        .await;
    let b_id = b["lease_id"].as_str().unwrap().to_string();

    f.granted(&b_id).await;
    let a_end = f
        .admin
        .get_ok(&format!("/api/v1/capability-leases/{a_id}"))
        .await
        .unwrap();
    assert_eq!(a_end["status"], "expired", "{a_end}");
    f.chief
        .act_ok(&b_id, "switch_on", json!({"channel": 2}))
        .await
        .expect("B's first action");

    let frames = eventually(Duration::from_secs(3), "B's frame journaled", || async {
        let j = f.lab.relay_switches();
        j.iter()
            .any(|s| s["channel"] == 2 && s["on"] == true)
            .then_some(j)
    })
    .await;
    let on = frames
        .iter()
        .position(|s| s["channel"] == 1 && s["on"] == true)
        .expect("A's switch_on");
    let off = frames
        .iter()
        .position(|s| s["channel"] == 1 && s["on"] == false)
        .expect("the safe-state switch_off");
    let b_first = frames
        .iter()
        .position(|s| s["channel"] == 2)
        .expect("B's frame");
    assert!(on < off && off < b_first, "{frames:#?}");

    let sessions = f.sessions(caps::RELAY).await;
    let run = sessions
        .iter()
        .find(|s| s["action"] == "switch_off")
        .unwrap_or_else(|| panic!("no switch_off session: {sessions:#?}"));
    assert_eq!(run["status"], "completed", "{run}");
    f.system_lease_of(run).await;
}

#[tokio::test]
async fn a_failing_on_release_action_marks_the_capability_unhealthy() {
    // The bench's robot has no button `home`: the driver refuses it.
    let f = fixture(
        caps::ROBOT,
        r#"[{ action = "press_hardware_button", params = { button = "home" } }]"#,
    )
    .await;
    let a = f.ask(&f.hw, &request(HW_AGENT, caps::ROBOT, 50, 120)).await;
    assert_eq!(a["status"], "granted", "{a}");
    let a_id = a["lease_id"].as_str().unwrap().to_string();

    // A higher-priority request preempts A; A's grace period runs first.
    let mut preempting = request(CHIEF_AGENT, caps::ROBOT, 90, 60);
    preempting["preempt_if_needed"] = json!(true);
    preempting["preempt_reason"] = json!("safety_stop");
    let b = f.ask(&f.chief, &preempting).await;
    assert_eq!(b["status"], "requested", "{b}");
    let b_id = b["lease_id"].as_str().unwrap().to_string();

    let health = f
        .events
        .wait_for("unhealthy verdict", Duration::from_secs(30), |e| {
            e["event_type"] == "capability_health_changed"
                && e["capability_id"] == caps::ROBOT
                && e["data"]["source"] == "safe_state"
        })
        .await
        .unwrap();
    assert_eq!(health["data"]["health_status"], "unhealthy", "{health}");
    assert_eq!(health["data"]["reason"], "on_release_failed", "{health}");
    let a_end = f
        .admin
        .get_ok(&format!("/api/v1/capability-leases/{a_id}"))
        .await
        .unwrap();
    assert_eq!(a_end["status"], "revoked", "{a_end}");

    let session_id = health["data"]["session_id"].as_str().expect("session_id");
    let run = f
        .admin
        .get_ok(&format!("/api/v1/sessions/{session_id}"))
        .await
        .unwrap();
    assert_eq!(run["status"], "failed", "{run}");
    let system = f.system_lease_of(&run).await;
    let system_id = system["lease_id"].as_str().unwrap().to_string();
    f.events
        .wait_for("system released", Duration::from_secs(5), |e| {
            e["event_type"] == "lease_released"
                && e["lease_id"] == system_id.as_str()
                && e["data"]["reason"] == "on_release_failed"
        })
        .await
        .unwrap();

    // Nobody is granted the unhealthy robot; a request that will not wait
    // is refused.
    let mut now_only = request(HW_AGENT, caps::ROBOT, 50, 60);
    now_only["queue_timeout_seconds"] = json!(0);
    let (s, e) =
        f.hw.post("/api/v1/capability-leases/request", &now_only)
            .await
            .unwrap();
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    assert_eq!(e["error"]["code"], "capability_unhealthy", "{e}");
    let waiting = f
        .admin
        .get_ok(&format!("/api/v1/capability-leases/{b_id}"))
        .await
        .unwrap();
    assert_eq!(waiting["status"], "requested", "{waiting}");
}
