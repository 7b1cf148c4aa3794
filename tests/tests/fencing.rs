//! Fencing across real processes (docs/architecture.md "Fencing"): the
//! bench never acts on a command whose lease has ended, however late the
//! command reaches it. The relay is the simulated LCUS board on a
//! pseudo-terminal; its journal (bench-sim `--journal`) says when a switch
//! frame reached the hardware.
//!
//! Three stale-command scenarios, each with the edge's clock right, 5 s
//! ahead and 5 s behind (libfaketime preloaded into the real `edge-agent`;
//! under `CI=true` a missing libfaketime fails the test):
//! - the edge frozen (SIGSTOP) with switch commands already in its socket,
//!   until after the lease expired;
//! - the same while a second holder was granted the relay (the first
//!   holder released its lease during the freeze);
//! - the broker (a private Mosquitto) frozen just after the commands were
//!   accepted, until after the lease expired.
//!
//! Each ends with no frame on the first holder's relay channel after the
//! freeze began, every stale session `failed` as refused by the bench, and
//! no `session_completed` for any of them.

use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, CHIEF_AGENT, HW_AGENT};
use benchlink_e2e::client::{follow_events, Agent, EventLog};
use benchlink_e2e::{eventually, Paused};
use chrono::Utc;
use reqwest::StatusCode;
use serde_json::{json, Value};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// Lease of the first holder, seconds.
const TTL_S: u32 = 3;
/// Driver deadline of each stale command, milliseconds.
const ACTION_TIMEOUT_MS: u32 = 1_500;
/// How long the edge or broker is held stopped: past the lease's expiry
/// and the commands' deadlines, short of the broker's keep-alive limit
/// (1.5 × the edge's 5 s).
const FREEZE: Duration = Duration::from_millis(5_000);

/// The edge's environment for a clock `offset` ("+5", "-5" seconds) from
/// the machine's; `None` when libfaketime is missing (skip) outside CI.
fn skewed(offset: Option<&str>) -> Option<Vec<(String, String)>> {
    let Some(offset) = offset else {
        return Some(Vec::new());
    };
    if !std::path::Path::new(LIBFAKETIME).exists() {
        benchlink_testkit::skip_unless_ci(&format!(
            "{LIBFAKETIME} is missing (apt-get install faketime)"
        ));
        return None;
    }
    Some(
        [
            ("LD_PRELOAD", LIBFAKETIME),
            ("FAKETIME", offset),
            // A wall clock that is off, as on a bench without NTP; its
            // monotonic clock runs true.
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    )
}

fn options(edge_env: Vec<(String, String)>) -> LabOptions {
    LabOptions {
        // The provider stays online through the freeze: the sessions fail
        // by their deadline (1.5 s + 1 s grace), as when a bench is slow.
        offline_after_missed: 12,
        result_grace_ms: Some(1_000),
        edge_env,
        ..Default::default()
    }
}

struct Fixture {
    lab: Lab,
    admin: Agent,
    hw: Agent,
    chief: Agent,
    events: EventLog,
}

async fn fixture(lab: Lab) -> Fixture {
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let chief = Agent::new(&lab.base_url, CHIEF_AGENT, &lab.chief_token);
    let (events, _follower) = follow_events(&admin, |_| {});
    let f = Fixture {
        lab,
        admin,
        hw,
        chief,
        events,
    };
    f.wait_clock_sampled().await;
    f
}

impl Fixture {
    /// The edge logs its first sample of the registry's clock.
    async fn wait_clock_sampled(&self) {
        let log = self.lab.root.join("logs/edge.log");
        eventually(
            Duration::from_secs(10),
            "edge sampled the registry clock",
            || async {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                (text.contains("registry clock sampled")
                    || text.contains("commands are fenced by the registry's clock"))
                .then_some(())
            },
        )
        .await;
    }

    /// Lease the relay for `who`, `seconds` long, waiting up to
    /// `wait_seconds` for the grant.
    async fn lease_relay(
        &self,
        who: &Agent,
        seconds: u32,
        wait_seconds: u32,
    ) -> (StatusCode, Value) {
        who.post(
            &format!("/api/v1/capability-leases/request?wait_seconds={wait_seconds}"),
            &json!({
                "capability_id": caps::RELAY,
                "holder_type": "audit_agent",
                "holder_ref": who.name,
                "project_id": "proj_fencing",
                "purpose": "relay fencing",
                "priority": 50,
                "requested_duration_seconds": seconds,
                "evidence_required": false,
            }),
        )
        .await
        .expect("lease request")
    }

    async fn granted_relay(&self, who: &Agent, seconds: u32) -> String {
        let (s, l) = self.lease_relay(who, seconds, 10).await;
        assert!(
            s.is_success() && l["status"] == "granted",
            "relay lease for {}: {s}: {l}",
            who.name
        );
        assert!(
            l["generation"].as_u64().is_some(),
            "a granted lease has a generation: {l}"
        );
        l["lease_id"].as_str().unwrap().to_string()
    }

    /// Send `switch_on` of `channel` under `lease` without waiting: 202.
    async fn switch_on_later(&self, who: &Agent, lease: &str, channel: u8) -> String {
        let (s, v) = who
            .post(
                &format!("/api/v1/capability-leases/{lease}/actions"),
                &json!({"action": "switch_on", "params": {"channel": channel},
                        "timeout_ms": ACTION_TIMEOUT_MS}),
            )
            .await
            .expect("invoke");
        assert_eq!(s, StatusCode::ACCEPTED, "switch_on accepted: {v}");
        v["session_id"].as_str().unwrap().to_string()
    }

    async fn lease(&self, id: &str) -> Value {
        self.admin
            .get_ok(&format!("/api/v1/capability-leases/{id}"))
            .await
            .expect("lease")
    }

    async fn session(&self, id: &str) -> Value {
        self.admin
            .get_ok(&format!("/api/v1/sessions/{id}"))
            .await
            .expect("session")
    }

    /// Wait until lease `id` is in a final status; returns it.
    async fn ended(&self, id: &str) -> Value {
        eventually(Duration::from_secs(20), "lease ended", || async {
            let l = self.lease(id).await;
            matches!(
                l["status"].as_str(),
                Some("released" | "expired" | "revoked" | "failed")
            )
            .then_some(l)
        })
        .await
    }

    /// A working relay first: on and off under a lease of its own, so the
    /// journal is known to record what reaches the board.
    async fn relay_works(&self) {
        let lease = self.granted_relay(&self.hw, 30).await;
        let before = self.lab.relay_switches().len();
        for action in ["switch_on", "switch_off"] {
            self.hw
                .act_ok(&lease, action, json!({"channel": 1}))
                .await
                .expect("relay acts");
        }
        eventually(
            Duration::from_secs(3),
            "journal has both frames",
            || async { (self.lab.relay_switches().len() >= before + 2).then_some(()) },
        )
        .await;
        let (s, _) = self.hw.release(&lease).await.unwrap();
        assert_eq!(s, StatusCode::OK);
    }

    /// Frames on relay `channel` since `since_ms` (Unix ms).
    fn frames_on(&self, channel: u8, since_ms: i64) -> Vec<Value> {
        self.lab
            .relay_switches()
            .into_iter()
            .filter(|f| f["channel"] == channel && f["at_unix_ms"].as_i64() >= Some(since_ms))
            .collect()
    }

    /// Every stale session ends `failed`, refused by the bench, and never
    /// `completed` on the event stream.
    async fn refused(&self, sessions: &[String]) {
        for id in sessions {
            let s = eventually(
                Duration::from_secs(20),
                "stale session refused by the bench",
                || async {
                    let s = self.session(id).await;
                    let msg = s["error_message"].as_str().unwrap_or("");
                    (s["status"] == "failed" && msg.contains("refused by the bench")).then_some(s)
                },
            )
            .await;
            assert!(s.get("late_report").is_none(), "{s}");
        }
        // A moment for anything late to show.
        tokio::time::sleep(Duration::from_millis(500)).await;
        for id in sessions {
            let completed: Vec<Value> = self
                .events
                .of("session_completed")
                .into_iter()
                .filter(|e| e["session_id"] == id.as_str())
                .collect();
            assert!(completed.is_empty(), "{id} completed: {completed:?}");
            assert_eq!(self.session(id).await["status"], "failed");
        }
    }

    /// Send `count` stale `switch_on`s under a short lease while `pid` is
    /// held stopped, until the lease expired and [`FREEZE`] passed; then
    /// let it run and check the bench refused them all and the relay saw
    /// no frame since the freeze began.
    async fn stale_switch_ons_while_stopped(&self, pid: u32, count: usize) {
        let lease = self.granted_relay(&self.hw, TTL_S).await;
        let frozen_at = Utc::now().timestamp_millis();
        let frozen = Paused::pause(pid);
        let mut sessions = Vec::new();
        for _ in 0..count {
            sessions.push(self.switch_on_later(&self.hw, &lease, 1).await);
        }
        let ended = self.ended(&lease).await;
        assert_eq!(ended["status"], "expired", "{ended}");
        let held = (Utc::now().timestamp_millis() - frozen_at).max(0) as u64;
        tokio::time::sleep(FREEZE.saturating_sub(Duration::from_millis(held))).await;
        drop(frozen);

        self.refused(&sessions).await;
        let late = self.frames_on(1, frozen_at);
        assert!(late.is_empty(), "relay frames after the freeze: {late:?}");
    }
}

/// The edge is frozen with three `switch_on`s in its socket until after
/// the lease expired: on waking it refuses all three.
async fn frozen_edge_with_an_expired_lease(offset: Option<&str>) {
    let Some(env) = skewed(offset) else { return };
    let f = fixture(Lab::start(options(env)).await.expect("lab")).await;
    f.relay_works().await;
    f.stale_switch_ons_while_stopped(f.lab.edge_pid(), 3).await;
}

/// The first holder's `switch_on` waits in the frozen edge's socket while
/// it releases the relay and a second holder is granted it: on waking the
/// edge refuses the stale command and serves the second holder.
async fn frozen_edge_with_a_second_holder(offset: Option<&str>) {
    let Some(env) = skewed(offset) else { return };
    let f = fixture(Lab::start(options(env)).await.expect("lab")).await;
    f.relay_works().await;

    // A long lease: only the release ends it, so `not_after` alone would
    // not stop the stale command.
    let first = f.granted_relay(&f.hw, 60).await;
    let frozen_at = Utc::now().timestamp_millis();
    let frozen = Paused::pause(f.lab.edge_pid());
    let stale = f.switch_on_later(&f.hw, &first, 1).await;
    let (s, _) = f.hw.release(&first).await.unwrap();
    assert_eq!(s, StatusCode::OK);
    let second = f.granted_relay(&f.chief, 30).await;
    assert!(
        f.lease(&second).await["generation"].as_u64()
            > f.lease(&first).await["generation"].as_u64()
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    drop(frozen);

    // The second holder is served.
    let served = f
        .chief
        .act_ok(&second, "switch_on", json!({"channel": 2}))
        .await
        .expect("second holder's switch_on");
    assert_eq!(served["status"], "completed");
    eventually(Duration::from_secs(3), "second holder's frame", || async {
        (!f.frames_on(2, frozen_at).is_empty()).then_some(())
    })
    .await;
    f.refused(std::slice::from_ref(&stale)).await;
    let late = f.frames_on(1, frozen_at);
    assert!(
        late.is_empty(),
        "first holder's frames after its release: {late:?}"
    );
    let (s, _) = f.chief.release(&second).await.unwrap();
    assert_eq!(s, StatusCode::OK);
}

/// The broker is frozen just after two `switch_on`s were accepted, until
/// the lease expired: when it resumes and delivers them, the edge refuses
/// both.
async fn frozen_broker(offset: Option<&str>) {
    let Some(env) = skewed(offset) else { return };
    let Some((_dir, broker, lab)) = Lab::start_on_private_mosquitto(options(env)).await else {
        return;
    };
    let f = fixture(lab).await;
    f.relay_works().await;
    f.stale_switch_ons_while_stopped(broker.pid(), 2).await;
    drop(broker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_edge_refuses_the_commands_of_an_expired_lease() {
    frozen_edge_with_an_expired_lease(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_edge_5_s_ahead_refuses_the_commands_of_an_expired_lease() {
    frozen_edge_with_an_expired_lease(Some("+5")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_edge_5_s_behind_refuses_the_commands_of_an_expired_lease() {
    frozen_edge_with_an_expired_lease(Some("-5")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_command_never_runs_in_the_second_holders_lease() {
    frozen_edge_with_a_second_holder(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_command_never_runs_in_the_second_holders_lease_5_s_ahead() {
    frozen_edge_with_a_second_holder(Some("+5")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_command_never_runs_in_the_second_holders_lease_5_s_behind() {
    frozen_edge_with_a_second_holder(Some("-5")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_broker_delivers_stale_commands_that_the_edge_refuses() {
    frozen_broker(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_broker_delivers_stale_commands_that_an_edge_5_s_ahead_refuses() {
    frozen_broker(Some("+5")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_broker_delivers_stale_commands_that_an_edge_5_s_behind_refuses() {
    frozen_broker(Some("-5")).await;
}
