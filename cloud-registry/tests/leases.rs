//! The lease engine against a real SQLite file: exclusivity under
//! concurrency (checked on the audit log), preemption's five conditions,
//! grace periods, non-interruptible windows, queue order and timeouts,
//! groups, expiry, restart after a crash, and who may touch a lease.
//!
//! Tests that depend on time use a `ManualClock` and `sweep_now`, so no
//! test sleeps through a TTL or a grace period.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cloud_registry::auth::Principal;
use cloud_registry::db::Db;
use cloud_registry::error::ApiError;
use cloud_registry::events::{self, EventBus};
use cloud_registry::leases::{
    self, CapabilityInfo, LeaseConfig, LeaseEngine, LeaseError, LeaseFilter, ManualClock,
};
use shared_protocol::api::Role;
use shared_protocol::capability::{
    CapabilityRequirement, CapabilitySelector, CapabilityType, LeaseMode, RequirementMode,
};
use shared_protocol::event::{CapabilityEvent, EventType};
use shared_protocol::lease::{
    CapabilityLease, HolderType, LeaseGroup, LeaseGroupRequest, LeaseRenewRequest, LeaseRequest,
    LeaseStatus, PreemptNotice,
};

const LONG_SWEEP_MS: u64 = 3_600_000;

async fn open_db(path: &Path) -> Db {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        Db::open(&path, |c| {
            events::migrate(c)?;
            leases::migrate(c)
        })
    })
    .await
    .expect("open task")
    .expect("open database")
}

struct Lab {
    _dir: tempfile::TempDir,
    path: PathBuf,
    db: Db,
    bus: EventBus,
    engine: Arc<LeaseEngine>,
    clock: Arc<ManualClock>,
}

impl Lab {
    /// An engine on a fresh file with a manual clock; the sweeper only runs
    /// when a test calls `sweep_now`.
    async fn manual(cfg: LeaseConfig) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("registry.sqlite");
        let clock = Arc::new(ManualClock::new());
        let db = open_db(&path).await;
        let bus = EventBus::new(db.clone());
        let engine = LeaseEngine::start_with_clock(
            db.clone(),
            bus.clone(),
            LeaseConfig {
                sweep_interval_ms: LONG_SWEEP_MS,
                ..cfg
            },
            clock.clone(),
        )
        .await
        .expect("start engine");
        Self {
            _dir: dir,
            path,
            db,
            bus,
            engine,
            clock,
        }
    }

    async fn advance(&self, seconds: u64) {
        self.clock.advance(Duration::from_secs(seconds));
        self.engine.sweep_now().await;
    }

    async fn events(&self) -> Vec<CapabilityEvent> {
        self.bus.replay(0, 1_000_000).await.expect("replay events")
    }

    async fn events_of(&self, t: EventType) -> Vec<CapabilityEvent> {
        self.events()
            .await
            .into_iter()
            .filter(|e| e.event_type == t)
            .collect()
    }

    /// `holder` asks for `capability_id` ([`ask`]); the engine must
    /// accept the request (granted or queued).
    async fn ask(
        &self,
        holder: &str,
        capability_id: &str,
        priority: u8,
        seconds: u32,
    ) -> CapabilityLease {
        self.engine
            .request(&who(holder), ask(holder, capability_id, priority, seconds))
            .await
            .unwrap_or_else(|e| panic!("{holder} asking for {capability_id}: {e:?}"))
    }

    /// `holder` asks for the group `ids` ([`group`]); the engine must
    /// accept it.
    async fn group(&self, holder: &str, ids: &[&str], seconds: u32) -> LeaseGroup {
        self.engine
            .request_group(&who(holder), group(holder, ids, seconds))
            .await
            .unwrap_or_else(|e| panic!("{holder} asking for {ids:?}: {e:?}"))
    }

    /// `holder` releases `lease_id` (no reason); the engine must allow it.
    async fn release(&self, holder: &str, lease_id: &str) -> CapabilityLease {
        self.engine
            .release(&who(holder), lease_id, None)
            .await
            .unwrap_or_else(|e| panic!("{holder} releasing {lease_id}: {e:?}"))
    }

    /// The active leases, on `capability_id` when given.
    async fn active(&self, capability_id: Option<&str>) -> Vec<CapabilityLease> {
        self.engine
            .list(LeaseFilter {
                capability_id: capability_id.map(str::to_string),
                active_only: true,
                ..LeaseFilter::default()
            })
            .await
    }

    async fn status(&self, lease_id: &str) -> LeaseStatus {
        self.engine
            .get(lease_id)
            .await
            .expect("lease exists")
            .status
    }
}

fn who(name: &str) -> Principal {
    Principal {
        name: name.to_string(),
        role: Role::AuditAgent,
    }
}

fn admin() -> Principal {
    Principal {
        name: "lab-admin".to_string(),
        role: Role::Admin,
    }
}

fn camera(id: &str) -> CapabilityInfo {
    CapabilityInfo {
        capability_id: id.to_string(),
        provider_id: "bench-a".to_string(),
        node_id: "node-a".to_string(),
        capability_type: CapabilityType::Camera,
        tags: vec!["lab".to_string()],
        lease_mode: LeaseMode::Exclusive,
        preemptible: true,
        safety_locked: false,
        default_priority: 50,
        online: true,
        non_interruptible: false,
        maintenance: None,
        unhealthy: false,
        on_release: Vec::new(),
        check_failed: None,
    }
}

fn ask(holder: &str, capability_id: &str, priority: u8, seconds: u32) -> LeaseRequest {
    LeaseRequest {
        capability_id: Some(capability_id.to_string()),
        capability_selector: None,
        holder_type: HolderType::AuditAgent,
        holder_ref: holder.to_string(),
        project_id: "proj_device_assistant".to_string(),
        purpose: "verify LED and screen".to_string(),
        priority,
        requested_duration_seconds: seconds,
        evidence_required: true,
        preempt_if_needed: false,
        preempt_reason: None,
        mode: None,
        queue_timeout_seconds: None,
    }
}

fn preempting(mut r: LeaseRequest, reason: &str) -> LeaseRequest {
    r.preempt_if_needed = true;
    r.preempt_reason = Some(reason.to_string());
    r
}

fn group(holder: &str, ids: &[&str], seconds: u32) -> LeaseGroupRequest {
    LeaseGroupRequest {
        capability_ids: ids.iter().map(|s| s.to_string()).collect(),
        requirements: Vec::new(),
        holder_type: HolderType::AuditAgent,
        holder_ref: holder.to_string(),
        project_id: "proj_device_assistant".to_string(),
        purpose: "joint camera and serial check".to_string(),
        priority: 50,
        requested_duration_seconds: seconds,
        evidence_required: false,
        preempt_if_needed: false,
        preempt_reason: None,
        queue_timeout_seconds: None,
    }
}

/// Replay the audit log and return, per capability, the largest number of
/// leases holding it at the same time.
fn max_simultaneous_holders(events: &[CapabilityEvent]) -> HashMap<String, usize> {
    let mut holding: HashMap<String, HashSet<String>> = HashMap::new();
    let mut max: HashMap<String, usize> = HashMap::new();
    for ev in events {
        let (Some(cap), Some(lease)) = (&ev.capability_id, &ev.lease_id) else {
            continue;
        };
        let set = holding.entry(cap.clone()).or_default();
        match ev.event_type {
            EventType::LeaseGranted => {
                set.insert(lease.clone());
            }
            EventType::LeaseReleased | EventType::LeaseExpired | EventType::LeasePreempted => {
                set.remove(lease);
            }
            _ => {}
        }
        let m = max.entry(cap.clone()).or_default();
        *m = (*m).max(set.len());
    }
    max
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_requesters_never_hold_one_exclusive_capability_together() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = open_db(&dir.path().join("registry.sqlite")).await;
    let bus = EventBus::new(db.clone());
    let engine = LeaseEngine::start(
        db,
        bus.clone(),
        LeaseConfig {
            sweep_interval_ms: 50,
            ..LeaseConfig::default()
        },
    )
    .await
    .expect("start");
    engine.upsert_capability(camera("cam-front-01")).await;

    let mut tasks = Vec::new();
    for i in 0..200 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let me = who(&format!("audit:worker-{i:03}"));
            let first = engine
                .request(&me, ask(&me.name, "cam-front-01", 50, 120))
                .await
                .expect("request accepted");
            assert!(
                matches!(first.status, LeaseStatus::Granted | LeaseStatus::Requested),
                "a fresh request is granted or queued, got {}",
                first.status
            );
            let lease = engine
                .wait_granted(&first.lease_id, Duration::from_secs(120))
                .await
                .expect("lease known");
            assert_eq!(lease.status, LeaseStatus::Granted, "worker {i} was granted");
            assert_eq!(lease.capability_id, "cam-front-01");
            let acting = engine
                .authorize_action(&me, &lease.lease_id, "cam-front-01")
                .await
                .expect("holder may act");
            assert_eq!(acting.status, LeaseStatus::Active);
            tokio::time::sleep(Duration::from_millis(1)).await;
            let released = engine
                .release(&me, &lease.lease_id, Some("done".to_string()))
                .await
                .expect("holder may release");
            assert_eq!(released.status, LeaseStatus::Released);
            lease.lease_id
        }));
    }
    let mut ids = HashSet::new();
    for t in tasks {
        ids.insert(t.await.expect("worker task"));
    }
    assert_eq!(ids.len(), 200, "every worker got its own lease");

    let log = bus.replay(0, 1_000_000).await.expect("replay");
    let max = max_simultaneous_holders(&log);
    assert_eq!(
        max.get("cam-front-01"),
        Some(&1),
        "audit log shows at most one holder at a time"
    );
    let granted = log
        .iter()
        .filter(|e| e.event_type == EventType::LeaseGranted)
        .count();
    let released = log
        .iter()
        .filter(|e| e.event_type == EventType::LeaseReleased)
        .count();
    assert_eq!((granted, released), (200, 200));
    let still_held = engine
        .list(LeaseFilter {
            capability_id: Some("cam-front-01".to_string()),
            active_only: true,
            ..LeaseFilter::default()
        })
        .await;
    assert!(
        still_held.is_empty(),
        "nothing left holding: {still_held:?}"
    );
    engine.shutdown().await;
}

/// One row of the §6.2 table: the capability, the holder, the request.
struct PreemptionCase {
    scenario: &'static str,
    preemptible: bool,
    safety_locked: bool,
    holder_priority: u8,
    new_priority: u8,
    preempt_if_needed: bool,
    reason: &'static str,
    in_window: bool,
}

const ALL_HOLD: PreemptionCase = PreemptionCase {
    scenario: "all five conditions hold",
    preemptible: true,
    safety_locked: false,
    holder_priority: 50,
    new_priority: 90,
    preempt_if_needed: true,
    reason: "human_operator_override",
    in_window: false,
};

/// Run a case: returns (holder lease, newcomer lease) after the request.
async fn run_case(lab: &Lab, case: &PreemptionCase) -> (CapabilityLease, CapabilityLease) {
    lab.engine
        .upsert_capability(CapabilityInfo {
            preemptible: case.preemptible,
            safety_locked: case.safety_locked,
            ..camera("robot-01")
        })
        .await;
    let holder = lab
        .ask("worker-a", "robot-01", case.holder_priority, 600)
        .await;
    assert_eq!(holder.status, LeaseStatus::Granted);
    if case.in_window {
        lab.engine.set_non_interruptible("robot-01", true).await;
    }
    let mut req = ask("operator-b", "robot-01", case.new_priority, 60);
    req.preempt_if_needed = case.preempt_if_needed;
    req.preempt_reason = Some(case.reason.to_string());
    let newcomer = lab
        .engine
        .request(&who("operator-b"), req)
        .await
        .expect("newcomer request");
    (holder, newcomer)
}

#[tokio::test]
async fn preemption_with_all_five_conditions_starts_a_grace_period() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    let (holder, newcomer) = run_case(&lab, &ALL_HOLD).await;
    assert_eq!(newcomer.status, LeaseStatus::Requested);
    let held = lab
        .engine
        .get(&holder.lease_id)
        .await
        .expect("holder lease");
    assert_eq!(held.status, LeaseStatus::GracePeriod);
    assert_eq!(
        held.preempted_by.as_deref(),
        Some(newcomer.lease_id.as_str())
    );
    assert_eq!(
        held.preempt_reason.as_deref(),
        Some("human_operator_override")
    );
    let grace_until = held.grace_until.expect("grace_until set");
    let grace_ms = (grace_until - lab.clock_wall()).num_milliseconds();
    assert!(
        (9_999..=10_000).contains(&grace_ms),
        "default grace period is 10 s, got {grace_ms} ms"
    );

    let notices = lab.events_of(EventType::LeasePreemptRequested).await;
    assert_eq!(notices.len(), 1);
    let notice: PreemptNotice =
        serde_json::from_value(notices[0].data["notice"].clone()).expect("notice in data");
    assert_eq!(notice.lease_id, holder.lease_id);
    assert_eq!(notice.preempting_lease_id, newcomer.lease_id);
    assert_eq!(notice.capability_id, "robot-01");
    assert_eq!(notice.grace_until, grace_until);
    assert_eq!(notices[0].provider_id.as_deref(), Some("bench-a"));
}

impl Lab {
    fn clock_wall(&self) -> shared_protocol::Timestamp {
        use cloud_registry::leases::LeaseClock;
        self.clock.wall()
    }
}

#[tokio::test]
async fn preemption_is_blocked_when_any_one_of_the_five_conditions_fails() {
    let cases = [
        PreemptionCase {
            scenario: "capability not preemptible",
            preemptible: false,
            ..ALL_HOLD
        },
        PreemptionCase {
            scenario: "capability safety_locked",
            safety_locked: true,
            ..ALL_HOLD
        },
        PreemptionCase {
            scenario: "new priority only equal to the holder's",
            new_priority: 50,
            ..ALL_HOLD
        },
        PreemptionCase {
            scenario: "preempt_reason not on the whitelist",
            reason: "i_am_in_a_hurry",
            ..ALL_HOLD
        },
        PreemptionCase {
            scenario: "preempt_if_needed not set",
            preempt_if_needed: false,
            ..ALL_HOLD
        },
        PreemptionCase {
            scenario: "holder inside a non-interruptible window",
            in_window: true,
            ..ALL_HOLD
        },
    ];
    for case in &cases {
        let lab = Lab::manual(LeaseConfig::default()).await;
        let (holder, newcomer) = run_case(&lab, case).await;
        assert_eq!(
            newcomer.status,
            LeaseStatus::Requested,
            "{}: the newcomer waits",
            case.scenario
        );
        assert_eq!(
            lab.status(&holder.lease_id).await,
            LeaseStatus::Granted,
            "{}: the holder keeps its lease",
            case.scenario
        );
        assert!(
            lab.events_of(EventType::LeasePreemptRequested)
                .await
                .is_empty(),
            "{}: no preemption was requested",
            case.scenario
        );
        // Well past any grace period: still nothing revoked.
        lab.advance(30).await;
        assert_eq!(
            lab.status(&holder.lease_id).await,
            LeaseStatus::Granted,
            "{}: the holder still holds after 30 s",
            case.scenario
        );
        assert_eq!(
            lab.status(&newcomer.lease_id).await,
            LeaseStatus::Requested,
            "{}: the newcomer still waits after 30 s",
            case.scenario
        );
    }
}

#[tokio::test]
async fn grace_period_end_revokes_the_holder_and_grants_the_preemptor() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    let (holder, newcomer) = run_case(&lab, &ALL_HOLD).await;
    lab.advance(9).await;
    assert_eq!(lab.status(&holder.lease_id).await, LeaseStatus::GracePeriod);
    assert_eq!(lab.status(&newcomer.lease_id).await, LeaseStatus::Requested);

    lab.advance(2).await;
    let old = lab.engine.get(&holder.lease_id).await.expect("old lease");
    assert_eq!(old.status, LeaseStatus::Revoked);
    assert!(old.ended_at.is_some());
    let new = lab
        .engine
        .wait_granted(&newcomer.lease_id, Duration::from_secs(5))
        .await
        .expect("new lease");
    assert_eq!(new.status, LeaseStatus::Granted);
    let preempted = lab.events_of(EventType::LeasePreempted).await;
    assert_eq!(preempted.len(), 1);
    assert_eq!(
        preempted[0].lease_id.as_deref(),
        Some(holder.lease_id.as_str())
    );
    assert_eq!(preempted[0].data["status"], "revoked");
    assert_eq!(
        max_simultaneous_holders(&lab.events().await).get("robot-01"),
        Some(&1)
    );
}

#[tokio::test]
async fn early_release_during_grace_period_hands_the_capability_over_at_once() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    let (holder, newcomer) = run_case(&lab, &ALL_HOLD).await;
    lab.clock.advance(Duration::from_secs(2));
    let released = lab
        .engine
        .release(&who("worker-a"), &holder.lease_id, Some("yielding".into()))
        .await
        .expect("release in grace");
    assert_eq!(released.status, LeaseStatus::Released);
    // No sweep, no clock movement: the preemptor already holds it.
    assert_eq!(lab.status(&newcomer.lease_id).await, LeaseStatus::Granted);
    assert!(lab.events_of(EventType::LeasePreempted).await.is_empty());
}

#[tokio::test]
async fn renewing_during_a_grace_period_is_refused() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    let (holder, _) = run_case(&lab, &ALL_HOLD).await;
    let err = lab
        .engine
        .renew(
            &who("worker-a"),
            &holder.lease_id,
            LeaseRenewRequest::default(),
        )
        .await
        .expect_err("renew in grace");
    assert_eq!(err.lease_status(), Some(LeaseStatus::GracePeriod), "{err}");
    assert!(lab.events_of(EventType::LeaseRenewed).await.is_empty());
}

#[tokio::test]
async fn non_interruptible_window_delays_revocation_until_it_closes() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    let (holder, newcomer) = run_case(&lab, &ALL_HOLD).await;
    // The holder starts a press after the preemption request.
    lab.engine.set_non_interruptible("robot-01", true).await;
    lab.advance(15).await;
    assert_eq!(
        lab.status(&holder.lease_id).await,
        LeaseStatus::GracePeriod,
        "grace ended inside the window: not revoked yet"
    );
    assert_eq!(lab.status(&newcomer.lease_id).await, LeaseStatus::Requested);

    // A re-registration of the capability does not close the window.
    lab.engine.upsert_capability(camera("robot-01")).await;
    lab.advance(1).await;
    assert_eq!(lab.status(&holder.lease_id).await, LeaseStatus::GracePeriod);

    lab.engine.set_non_interruptible("robot-01", false).await;
    assert_eq!(lab.status(&holder.lease_id).await, LeaseStatus::Revoked);
    assert_eq!(lab.status(&newcomer.lease_id).await, LeaseStatus::Granted);
}

#[tokio::test]
async fn a_preemption_held_back_by_a_window_starts_when_the_window_closes() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    let case = PreemptionCase {
        scenario: "holder inside a non-interruptible window",
        in_window: true,
        ..ALL_HOLD
    };
    let (holder, newcomer) = run_case(&lab, &case).await;
    assert_eq!(lab.status(&holder.lease_id).await, LeaseStatus::Granted);
    lab.engine.set_non_interruptible("robot-01", false).await;
    let held = lab.engine.get(&holder.lease_id).await.expect("holder");
    assert_eq!(held.status, LeaseStatus::GracePeriod, "{}", case.scenario);
    assert_eq!(
        held.preempted_by.as_deref(),
        Some(newcomer.lease_id.as_str())
    );
}

#[tokio::test]
async fn safety_locked_capability_is_never_preempted_even_for_a_safety_stop() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    let mut psu = camera("psu-01");
    psu.capability_type = CapabilityType::ProgrammablePowerSupply;
    psu.safety_locked = true;
    lab.engine.upsert_capability(psu).await;
    let holder = lab.ask("flasher", "psu-01", 20, 600).await;
    for round in 0..3 {
        let r = lab
            .engine
            .request(
                &who("safety"),
                preempting(ask("safety", "psu-01", 100, 60), "safety_stop"),
            )
            .await
            .expect("safety request");
        assert_eq!(r.status, LeaseStatus::Requested, "round {round}");
        lab.advance(20).await;
    }
    assert_eq!(lab.status(&holder.lease_id).await, LeaseStatus::Granted);
    assert!(lab
        .events_of(EventType::LeasePreemptRequested)
        .await
        .is_empty());
}

#[tokio::test]
async fn queue_grants_by_priority_then_by_age() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let first = lab.ask("h", "cam-01", 50, 600).await;
    let mut waiting = Vec::new();
    for (name, prio) in [
        ("a50", 50),
        ("b70", 70),
        ("c50", 50),
        ("d70", 70),
        ("e20", 20),
    ] {
        let l = lab.ask(name, "cam-01", prio, 600).await;
        assert_eq!(l.status, LeaseStatus::Requested);
        waiting.push((name, l.lease_id));
    }
    let id_of = |n: &str| {
        waiting
            .iter()
            .find(|(w, _)| *w == n)
            .map(|(_, id)| id.clone())
            .expect("known")
    };
    let mut order = Vec::new();
    let (mut holder_name, mut holder_id) = ("h".to_string(), first.lease_id);
    for _ in 0..waiting.len() {
        lab.release(&holder_name, &holder_id).await;
        let mut granted = None;
        for (name, id) in &waiting {
            if lab.status(id).await == LeaseStatus::Granted {
                granted = Some((name.to_string(), id.clone()));
            }
        }
        let (name, id) = granted.expect("someone was granted");
        order.push(name.clone());
        holder_name = name;
        holder_id = id;
    }
    assert_eq!(order, ["b70", "d70", "a50", "c50", "e20"]);
    assert_eq!(lab.status(&id_of("e20")).await, LeaseStatus::Granted);
}

/// Queue aging of 10 points a minute, at most 50.
fn aging() -> LeaseConfig {
    LeaseConfig {
        queue_aging: Some(leases::QueueAging {
            priority_per_minute: 10.0,
            max_boost: 50,
        }),
        ..LeaseConfig::default()
    }
}

/// Release `holder`'s `lease_id` and name who among `waiting` got the
/// capability.
async fn next_granted(
    lab: &Lab,
    holder: &str,
    lease_id: &str,
    waiting: &[(&str, String)],
) -> String {
    lab.release(holder, lease_id).await;
    let mut granted = Vec::new();
    for (name, id) in waiting {
        if lab.status(id).await == LeaseStatus::Granted {
            granted.push(name.to_string());
        }
    }
    assert_eq!(granted.len(), 1, "{granted:?}");
    granted.remove(0)
}

#[tokio::test]
async fn an_aged_request_ranks_by_priority_plus_its_boost_then_by_arrival() {
    let lab = Lab::manual(aging()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let h = lab.ask("h", "cam-01", 50, 600).await;
    let old10 = lab.ask("old10", "cam-01", 10, 600).await;
    // Two minutes: 10 + 20 = 30.
    lab.advance(120).await;
    let new30 = lab.ask("new30", "cam-01", 30, 600).await;
    let new31 = lab.ask("new31", "cam-01", 31, 600).await;
    let new29 = lab.ask("new29", "cam-01", 29, 600).await;
    let waiting = [
        ("old10", old10.lease_id.clone()),
        ("new30", new30.lease_id.clone()),
        ("new31", new31.lease_id.clone()),
        ("new29", new29.lease_id.clone()),
    ];
    let mut order = Vec::new();
    let (mut holder, mut holder_id) = ("h".to_string(), h.lease_id);
    for _ in 0..waiting.len() {
        let name = next_granted(&lab, &holder, &holder_id, &waiting).await;
        holder_id = waiting.iter().find(|(n, _)| *n == name).unwrap().1.clone();
        order.push(name.clone());
        holder = name;
    }
    // 31 beats the aged 30; the aged 30 arrived before the fresh 30.
    assert_eq!(order, ["new31", "old10", "new30", "new29"]);
    // The wire keeps the request's own priority.
    assert_eq!(lab.engine.get(&old10.lease_id).await.unwrap().priority, 10);
}

#[tokio::test]
async fn aging_passes_a_steady_stream_of_higher_requests_within_its_bound() {
    let lab = Lab::manual(aging()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let mut holder = (
        "h0".to_string(),
        lab.ask("h0", "cam-01", 50, 600).await.lease_id,
    );
    let low = lab.ask("low", "cam-01", 10, 600).await;
    // Every 60 s a fresh priority-50 request arrives and the holder
    // releases. The bound: (50 - 10) / 10 = 4 minutes, plus one holding
    // period.
    let mut granted_at = None;
    for t in 1..=10u64 {
        lab.advance(60).await;
        let name = format!("s{t}");
        let fresh = lab.ask(&name, "cam-01", 50, 600).await;
        assert_eq!(fresh.status, LeaseStatus::Requested);
        let waiting = [
            ("low", low.lease_id.clone()),
            (name.as_str(), fresh.lease_id.clone()),
        ];
        let next = next_granted(&lab, &holder.0, &holder.1, &waiting).await;
        if next == "low" {
            granted_at = Some(t * 60);
            break;
        }
        holder = (name, fresh.lease_id);
    }
    let at = granted_at.expect("the low request was granted");
    assert!(at <= 4 * 60 + 60, "granted after {at} s");
    assert!(at >= 4 * 60, "not before its boost reached 50: {at} s");
}

#[tokio::test]
async fn without_aging_the_same_stream_starves_the_low_request() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let mut holder = (
        "h0".to_string(),
        lab.ask("h0", "cam-01", 50, 600).await.lease_id,
    );
    let low = lab.ask("low", "cam-01", 10, 600).await;
    for t in 1..=10u64 {
        lab.advance(60).await;
        let name = format!("s{t}");
        let fresh = lab.ask(&name, "cam-01", 50, 600).await;
        let waiting = [
            ("low", low.lease_id.clone()),
            (name.as_str(), fresh.lease_id.clone()),
        ];
        assert_eq!(
            next_granted(&lab, &holder.0, &holder.1, &waiting).await,
            name
        );
        holder = (name, fresh.lease_id);
    }
    assert_eq!(lab.status(&low.lease_id).await, LeaseStatus::Requested);
}

#[tokio::test]
async fn a_boosted_waiter_never_preempts_a_holder_its_own_priority_does_not_beat() {
    let lab = Lab::manual(aging()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let holder = lab.ask("h", "cam-01", 50, 3600).await;
    let low = lab
        .engine
        .request(
            &who("low"),
            preempting(ask("low", "cam-01", 10, 600), "safety_stop"),
        )
        .await
        .expect("queued");
    assert_eq!(low.status, LeaseStatus::Requested);
    // Ten minutes: boosted to 60, above the holder's 50.
    for _ in 0..10 {
        lab.advance(60).await;
    }
    assert_eq!(lab.status(&holder.lease_id).await, LeaseStatus::Granted);
    assert!(lab
        .events_of(EventType::LeasePreemptRequested)
        .await
        .is_empty());
    // Preemption does work here: a fresh 61, ranked above the aged 60,
    // preempts the holder.
    let high = lab
        .engine
        .request(
            &who("high"),
            preempting(ask("high", "cam-01", 61, 600), "safety_stop"),
        )
        .await
        .expect("queued");
    assert_eq!(high.status, LeaseStatus::Requested);
    let notices = lab.events_of(EventType::LeasePreemptRequested).await;
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0].data["preempted_by"], high.lease_id.as_str());
    lab.release("h", &holder.lease_id).await;
    assert_eq!(lab.status(&high.lease_id).await, LeaseStatus::Granted);
    assert_eq!(lab.status(&low.lease_id).await, LeaseStatus::Requested);
}

#[tokio::test]
async fn a_waiter_aged_past_a_group_takes_the_capability_the_group_reserved() {
    let lab = Lab::manual(aging()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    lab.engine.upsert_capability(camera("cam-02")).await;
    lab.ask("h", "cam-02", 40, 3600).await;
    // The group (40) waits for cam-02 and reserves the free cam-01.
    let mut g = group("g", &["cam-01", "cam-02"], 600);
    g.priority = 40;
    let g = lab
        .engine
        .request_group(&who("g"), g)
        .await
        .expect("queued");
    assert_eq!(g.status, LeaseStatus::Requested);
    lab.advance(60).await;
    let x = lab.ask("x", "cam-01", 45, 600).await;
    assert_eq!(x.status, LeaseStatus::Requested, "behind the reservation");
    // At 5.5 minutes the group is capped at 40 + 50 = 90 and x, 4.5
    // minutes old, has 45 + 45 = 90: the group arrived first.
    lab.advance(270).await;
    assert_eq!(lab.status(&x.lease_id).await, LeaseStatus::Requested);
    // Half a minute later x has 95: it ranks first and the sweep grants
    // it the reserved camera.
    lab.advance(30).await;
    let x = lab.engine.get(&x.lease_id).await.unwrap();
    assert_eq!(x.status, LeaseStatus::Granted);
    assert_eq!(x.capability_id, "cam-01");
    assert_eq!(x.priority, 45);
}

#[tokio::test]
async fn queue_timeout_fails_the_waiting_request() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    lab.ask("h", "cam-01", 50, 600).await;
    let mut req = ask("w", "cam-01", 50, 60);
    req.queue_timeout_seconds = Some(5);
    let waiting = lab.engine.request(&who("w"), req).await.expect("queued");
    assert_eq!(waiting.status, LeaseStatus::Requested);
    lab.advance(4).await;
    assert_eq!(lab.status(&waiting.lease_id).await, LeaseStatus::Requested);
    lab.advance(2).await;
    let failed = lab
        .engine
        .wait_granted(&waiting.lease_id, Duration::from_secs(1))
        .await
        .expect("lease");
    assert_eq!(failed.status, LeaseStatus::Failed);
    let ev = lab.events_of(EventType::LeaseExpired).await;
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].data["reason"], "queue_timeout");
    assert_eq!(ev[0].data["status"], "failed");
    assert_eq!(lab.engine.queue_len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_asking_for_the_same_capabilities_in_opposite_orders_both_complete() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let mut serial = camera("serial-01");
    serial.capability_type = CapabilityType::SerialPort;
    lab.engine.upsert_capability(serial).await;

    let run = |name: &'static str, order: [&'static str; 2]| {
        let engine = lab.engine.clone();
        tokio::spawn(async move {
            let me = who(name);
            for _ in 0..40 {
                let g = engine
                    .request_group(&me, group(name, &order, 60))
                    .await
                    .expect("group request");
                assert_eq!(g.leases.len(), 2);
                assert!(g.leases.iter().all(|l| l.status == g.status));
                for l in &g.leases {
                    let l = engine
                        .wait_granted(&l.lease_id, Duration::from_secs(10))
                        .await
                        .expect("lease");
                    assert_eq!(l.status, LeaseStatus::Granted, "{name} got its group");
                }
                for l in &g.leases {
                    engine
                        .release(&me, &l.lease_id, None)
                        .await
                        .expect("release");
                }
            }
        })
    };
    let a = run("group-a", ["cam-01", "serial-01"]);
    let b = run("group-b", ["serial-01", "cam-01"]);
    tokio::time::timeout(Duration::from_secs(60), async {
        a.await.expect("group a");
        b.await.expect("group b");
    })
    .await
    .expect("both groups finish: no deadlock");
    let max = max_simultaneous_holders(&lab.events().await);
    assert_eq!(max.get("cam-01"), Some(&1));
    assert_eq!(max.get("serial-01"), Some(&1));
}

#[tokio::test]
async fn a_group_waits_as_a_whole_and_holds_nothing_meanwhile() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    lab.engine.upsert_capability(camera("cam-02")).await;
    let holder = lab.ask("h", "cam-01", 50, 600).await;
    let g = lab.group("g", &["cam-01", "cam-02"], 60).await;
    assert_eq!(g.status, LeaseStatus::Requested);
    assert!(g.leases.iter().all(|l| l.status == LeaseStatus::Requested));
    let on_cam2 = lab.active(Some("cam-02")).await;
    assert!(
        on_cam2.is_empty(),
        "the waiting group holds no part: {on_cam2:?}"
    );
    // A later request of the same priority does not overtake the group on
    // the capability the group waits for.
    let later = lab.ask("later", "cam-02", 50, 60).await;
    assert_eq!(later.status, LeaseStatus::Requested);

    lab.release("h", &holder.lease_id).await;
    let mut granted_at = HashSet::new();
    for l in &g.leases {
        let l = lab.engine.get(&l.lease_id).await.expect("member");
        assert_eq!(l.status, LeaseStatus::Granted);
        granted_at.insert(l.granted_at);
    }
    assert_eq!(
        granted_at.len(),
        1,
        "both members granted in one transition"
    );
    assert_eq!(lab.status(&later.lease_id).await, LeaseStatus::Requested);
}

#[tokio::test]
async fn a_lease_whose_holder_vanishes_expires_after_its_ttl_and_the_next_waiter_gets_it() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let gone = lab.ask("gone", "cam-01", 50, 30).await;
    let next = lab.ask("next", "cam-01", 50, 30).await;
    assert_eq!(next.status, LeaseStatus::Requested);
    lab.advance(29).await;
    assert_eq!(lab.status(&gone.lease_id).await, LeaseStatus::Granted);
    lab.advance(2).await;
    assert_eq!(lab.status(&gone.lease_id).await, LeaseStatus::Expired);
    assert_eq!(lab.status(&next.lease_id).await, LeaseStatus::Granted);
    let expired = lab.events_of(EventType::LeaseExpired).await;
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].lease_id.as_deref(), Some(gone.lease_id.as_str()));
    assert_eq!(expired[0].data["reason"], "ttl_elapsed");
}

#[tokio::test]
async fn after_a_crash_every_lease_keeps_its_remaining_time_and_the_queue_survives() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    lab.engine.upsert_capability(camera("cam-02")).await;
    let short = lab.ask("a", "cam-01", 50, 60).await;
    let long = lab.ask("d", "cam-02", 50, 300).await;
    let high = lab.ask("b", "cam-01", 70, 60).await;
    let low = lab.ask("c", "cam-01", 30, 60).await;
    let mut g = group("g", &["cam-01", "cam-02"], 60);
    g.priority = 20;
    let waiting_group = lab
        .engine
        .request_group(&who("g"), g)
        .await
        .expect("group queued");
    assert_eq!(waiting_group.status, LeaseStatus::Requested);
    lab.clock.advance(Duration::from_secs(10));
    let crash_wall = lab.clock_wall();

    // Crash: no shutdown, just drop everything and reopen the file.
    let path = lab.path.clone();
    let Lab {
        engine, bus, _dir, ..
    } = lab;
    drop(engine);
    drop(bus);
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The registry comes back 5 s (wall clock) later.
    let clock = Arc::new(ManualClock::starting_at(
        crash_wall + chrono::TimeDelta::seconds(5),
    ));
    let db = open_db(&path).await;
    let bus = EventBus::new(db.clone());
    let engine = LeaseEngine::start_with_clock(
        db,
        bus.clone(),
        LeaseConfig {
            sweep_interval_ms: LONG_SWEEP_MS,
            ..LeaseConfig::default()
        },
        clock.clone(),
    )
    .await
    .expect("restart");
    engine.upsert_capability(camera("cam-01")).await;
    engine.upsert_capability(camera("cam-02")).await;

    let a = engine.get(&short.lease_id).await.expect("a kept");
    assert_eq!(a.status, LeaseStatus::Granted);
    assert_eq!(a.expires_at, short.expires_at, "same deadline on the wire");
    let d = engine.get(&long.lease_id).await.expect("d kept");
    assert_eq!(d.expires_at, long.expires_at);
    assert_eq!(
        engine.get(&high.lease_id).await.map(|l| l.status),
        Some(LeaseStatus::Requested)
    );
    assert_eq!(
        engine.get(&low.lease_id).await.map(|l| l.status),
        Some(LeaseStatus::Requested)
    );
    assert_eq!(engine.queue_len(), 3);
    for l in &waiting_group.leases {
        let kept = engine.get(&l.lease_id).await.expect("group member kept");
        assert_eq!(kept.status, LeaseStatus::Requested);
        assert_eq!(kept.lease_group_id, waiting_group.leases[0].lease_group_id);
    }

    // 60 s lease, 10 s used before the crash, 5 s down: 45 s left.
    clock.advance(Duration::from_secs(44));
    engine.sweep_now().await;
    assert_eq!(
        engine.get(&short.lease_id).await.map(|l| l.status),
        Some(LeaseStatus::Granted)
    );
    clock.advance(Duration::from_secs(2));
    engine.sweep_now().await;
    assert_eq!(
        engine.get(&short.lease_id).await.map(|l| l.status),
        Some(LeaseStatus::Expired)
    );
    // The queue kept its order: the higher priority waiter is next.
    assert_eq!(
        engine.get(&high.lease_id).await.map(|l| l.status),
        Some(LeaseStatus::Granted)
    );
    assert_eq!(
        engine.get(&low.lease_id).await.map(|l| l.status),
        Some(LeaseStatus::Requested)
    );
    assert_eq!(
        engine.get(&long.lease_id).await.map(|l| l.status),
        Some(LeaseStatus::Granted)
    );
    engine.shutdown().await;
}

#[tokio::test]
async fn another_principal_cannot_renew_or_release_but_an_admin_may_release() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let lease = lab.ask("alice", "cam-01", 50, 60).await;
    let bob = who("bob");
    let renew = lab
        .engine
        .renew(&bob, &lease.lease_id, LeaseRenewRequest::default())
        .await;
    assert!(
        matches!(renew, Err(LeaseError::NotHolder { .. })),
        "{renew:?}"
    );
    let release = lab.engine.release(&bob, &lease.lease_id, None).await;
    assert!(
        matches!(release, Err(LeaseError::NotHolder { .. })),
        "{release:?}"
    );
    let act = lab
        .engine
        .authorize_action(&bob, &lease.lease_id, "cam-01")
        .await;
    assert!(matches!(act, Err(LeaseError::NotHolder { .. })), "{act:?}");
    assert_eq!(lab.status(&lease.lease_id).await, LeaseStatus::Granted);

    let by_admin = lab
        .engine
        .release(&admin(), &lease.lease_id, Some("bench maintenance".into()))
        .await
        .expect("admin release");
    assert_eq!(by_admin.status, LeaseStatus::Released);
    let ev = lab.events_of(EventType::LeaseReleased).await;
    assert_eq!(ev[0].data["reason"], "bench maintenance");
}

#[tokio::test]
async fn renewing_an_expired_lease_is_refused_and_appends_no_event() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let lease = lab.ask("alice", "cam-01", 50, 5).await;
    lab.advance(6).await;
    let before_events = lab.events().await.len();
    let before = lab.engine.get(&lease.lease_id).await.expect("lease");
    assert_eq!(before.status, LeaseStatus::Expired);

    let err = lab
        .engine
        .renew(&who("alice"), &lease.lease_id, LeaseRenewRequest::default())
        .await
        .expect_err("renewing an expired lease");
    assert!(matches!(err, LeaseError::Expired { .. }), "{err:?}");
    assert_eq!(err.lease_status(), Some(LeaseStatus::Expired));
    let api: ApiError = err.into();
    assert_eq!(api.status.as_u16(), 409);
    assert_eq!(api.details["lease_status"], "expired");

    assert_eq!(lab.events().await.len(), before_events, "no event appended");
    assert_eq!(lab.engine.get(&lease.lease_id).await, Some(before));
}

#[tokio::test]
async fn renewal_extends_expiry_up_to_the_maximum_duration() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let lease = lab.ask("alice", "cam-01", 50, 30).await;
    lab.advance(20).await;
    let renewed = lab
        .engine
        .renew(
            &who("alice"),
            &lease.lease_id,
            LeaseRenewRequest {
                requested_duration_seconds: Some(120),
            },
        )
        .await
        .expect("renew");
    let left_ms = (renewed.expires_at.expect("expires_at") - lab.clock_wall()).num_milliseconds();
    assert!((119_999..=120_000).contains(&left_ms), "{left_ms} ms left");
    lab.advance(100).await;
    assert_eq!(lab.status(&lease.lease_id).await, LeaseStatus::Granted);

    let too_long = lab
        .engine
        .renew(
            &who("alice"),
            &lease.lease_id,
            LeaseRenewRequest {
                requested_duration_seconds: Some(7200),
            },
        )
        .await;
    match too_long {
        Err(LeaseError::InvalidRequest { field, .. }) => {
            assert_eq!(field, "requested_duration_seconds")
        }
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
    assert_eq!(lab.events_of(EventType::LeaseRenewed).await.len(), 1);
}

#[tokio::test]
async fn a_selector_request_gets_a_free_matching_capability() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    lab.engine
        .upsert_capability(CapabilityInfo {
            tags: vec!["lab".into(), "device-station-a".into()],
            ..camera("cam-02")
        })
        .await;
    lab.ask("h", "cam-01", 50, 600).await;
    let mut req = ask("s", "unused", 50, 60);
    req.capability_id = None;
    req.capability_selector = Some(CapabilitySelector {
        capability_type: CapabilityType::Camera,
        tags: vec!["lab".into()],
        provider_id: None,
        node_id: None,
    });
    let got = lab
        .engine
        .request(&who("s"), req.clone())
        .await
        .expect("selector");
    assert_eq!(got.status, LeaseStatus::Granted);
    assert_eq!(got.capability_id, "cam-02");

    // Both busy now: a third selector request waits on the set and takes
    // whichever frees first.
    req.holder_ref = "t".into();
    let waiting = lab.engine.request(&who("t"), req).await.expect("queued");
    assert_eq!(waiting.status, LeaseStatus::Requested);
    lab.release("s", &got.lease_id).await;
    let l = lab.engine.get(&waiting.lease_id).await.expect("lease");
    assert_eq!(
        (l.status, l.capability_id.as_str()),
        (LeaseStatus::Granted, "cam-02")
    );

    let mut none = ask("s", "unused", 50, 60);
    none.capability_id = None;
    none.capability_selector = Some(CapabilitySelector {
        capability_type: CapabilityType::Speaker,
        tags: Vec::new(),
        provider_id: None,
        node_id: None,
    });
    let err = lab
        .engine
        .request(&who("s"), none)
        .await
        .expect_err("no speaker");
    assert!(
        matches!(err, LeaseError::NoMatchingCapability { .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_group_requirement_prefers_tagged_capabilities() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    lab.engine
        .upsert_capability(CapabilityInfo {
            tags: vec!["lab".into(), "device-station-a".into()],
            ..camera("cam-09")
        })
        .await;
    let mut req = group("g", &[], 120);
    req.requirements = vec![CapabilityRequirement {
        capability_type: CapabilityType::Camera,
        mode: RequirementMode::Exclusive,
        min_duration_seconds: Some(90),
        preferred_node_tags: vec!["device-station-a".into()],
        fallback_allowed: true,
        preempt_if_needed: false,
        purpose: None,
    }];
    let g = lab
        .engine
        .request_group(&who("g"), req.clone())
        .await
        .expect("group");
    assert_eq!(g.status, LeaseStatus::Granted);
    assert_eq!(g.leases[0].capability_id, "cam-09");

    req.requirements[0].min_duration_seconds = Some(600);
    match lab.engine.request_group(&who("g"), req).await {
        Err(LeaseError::InvalidRequest { field, .. }) => {
            assert_eq!(field, "requirements[0].min_duration_seconds")
        }
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
}

#[tokio::test]
async fn a_shared_capability_has_many_readers_and_refuses_an_exclusive_mode() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine
        .upsert_capability(CapabilityInfo {
            lease_mode: LeaseMode::SharedRead,
            ..camera("cam-feed")
        })
        .await;
    for reader in ["r1", "r2", "r3"] {
        let l = lab.ask(reader, "cam-feed", 50, 60).await;
        assert_eq!(l.status, LeaseStatus::Granted, "{reader}");
        assert_eq!(l.mode, LeaseMode::SharedRead);
    }
    let mut exclusive = ask("w", "cam-feed", 50, 60);
    exclusive.mode = Some(LeaseMode::Exclusive);
    match lab.engine.request(&who("w"), exclusive).await {
        Err(LeaseError::InvalidRequest { field, .. }) => assert_eq!(field, "mode"),
        other => panic!("expected InvalidRequest on mode, got {other:?}"),
    }
}

#[tokio::test]
async fn an_offline_provider_is_refused_new_requests_and_serves_waiters_when_back() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let holder = lab.ask("h", "cam-01", 50, 600).await;
    let waiter = lab.ask("w", "cam-01", 50, 60).await;
    lab.engine.set_provider_online("bench-a", false).await;
    let err = lab
        .engine
        .request(&who("x"), ask("x", "cam-01", 50, 60))
        .await
        .expect_err("offline");
    assert!(
        matches!(err, LeaseError::CapabilityOffline { .. }),
        "{err:?}"
    );
    assert_eq!(ApiError::from(err).status.as_u16(), 503);

    // The holder leaves while the provider is away: nobody is granted.
    lab.release("h", &holder.lease_id).await;
    assert_eq!(lab.status(&waiter.lease_id).await, LeaseStatus::Requested);
    lab.engine.set_provider_online("bench-a", true).await;
    assert_eq!(lab.status(&waiter.lease_id).await, LeaseStatus::Granted);
}

#[tokio::test]
async fn request_checks_holder_ref_duration_and_capability() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let cases: [(&str, LeaseRequest, &str); 3] = [
        (
            "holder_ref of someone else",
            ask("mallory", "cam-01", 50, 60),
            "holder_ref",
        ),
        (
            "duration above the maximum",
            ask("alice", "cam-01", 50, 3601),
            "requested_duration_seconds",
        ),
        (
            "priority above 100",
            ask("alice", "cam-01", 101, 60),
            "priority",
        ),
    ];
    for (scenario, req, field) in cases {
        match lab.engine.request(&who("alice"), req).await {
            Err(LeaseError::InvalidRequest { field: f, .. }) => assert_eq!(f, field, "{scenario}"),
            other => panic!("{scenario}: expected InvalidRequest, got {other:?}"),
        }
    }
    // A duration out of range names the configured maximum, also for 0 and
    // for values above the protocol's 86400.
    for seconds in [0, 3601, 90_000] {
        let err = lab
            .engine
            .request(&who("alice"), ask("alice", "cam-01", 50, seconds))
            .await
            .expect_err("out of range");
        assert_eq!(
            err.to_string(),
            format!(
                "requested_duration_seconds: {seconds} is out of range 1..=3600 (the registry's longest lease)"
            )
        );
    }
    let sub = lab
        .engine
        .request(&who("alice"), ask("alice:thread-abc", "cam-01", 50, 60))
        .await
        .expect("a sub-holder of the caller is fine");
    assert_eq!(sub.principal, "alice");
    let unknown = lab
        .engine
        .request(&who("alice"), ask("alice", "cam-99", 50, 60))
        .await;
    assert!(
        matches!(unknown, Err(LeaseError::UnknownCapability { .. })),
        "{unknown:?}"
    );
    assert!(lab
        .events()
        .await
        .iter()
        .all(|e| e.lease_id.as_deref() == Some(sub.lease_id.as_str())));
}

#[tokio::test]
async fn a_full_queue_refuses_without_changing_anything() {
    let lab = Lab::manual(LeaseConfig {
        max_queue_len: 1,
        ..LeaseConfig::default()
    })
    .await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    lab.engine.upsert_capability(camera("cam-02")).await;
    lab.ask("h", "cam-01", 50, 600).await;
    lab.ask("w1", "cam-01", 50, 60).await;
    let before = lab.events().await.len();
    let full = lab
        .engine
        .request(&who("w2"), ask("w2", "cam-01", 50, 60))
        .await;
    assert!(
        matches!(full, Err(LeaseError::QueueFull { limit: 1 })),
        "{full:?}"
    );
    assert_eq!(lab.events().await.len(), before);
    // A request that is granted at once needs no queue room.
    let free = lab.ask("w3", "cam-02", 50, 60).await;
    assert_eq!(free.status, LeaseStatus::Granted);
}

#[tokio::test]
async fn acting_moves_granted_to_active_and_checks_the_capability() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let lease = lab.ask("alice", "cam-01", 50, 60).await;
    let wrong = lab
        .engine
        .authorize_action(&who("alice"), &lease.lease_id, "cam-02")
        .await;
    assert!(
        matches!(&wrong, Err(LeaseError::InvalidRequest { field, .. }) if field == "capability_id"),
        "{wrong:?}"
    );
    let ok = lab
        .engine
        .authorize_action(&who("alice"), &lease.lease_id, "cam-01")
        .await
        .expect("act");
    assert_eq!(ok.status, LeaseStatus::Active);
    assert_eq!(lab.status(&lease.lease_id).await, LeaseStatus::Active);

    lab.release("alice", &lease.lease_id).await;
    let after = lab
        .engine
        .authorize_action(&who("alice"), &lease.lease_id, "cam-01")
        .await
        .expect_err("released lease");
    assert_eq!(after.lease_status(), Some(LeaseStatus::Released));
    let again = lab.release("alice", &lease.lease_id).await;
    assert_eq!(again.status, LeaseStatus::Released);
    assert_eq!(lab.events_of(EventType::LeaseReleased).await.len(), 1);
}

/// `abandon` gives up what a vanished requester never learned of: a
/// request granted just as its client went away is released (the
/// capability goes to the next waiter), a waiting one is withdrawn; a
/// lease already acted on is left alone.
#[tokio::test]
async fn abandoning_releases_an_unclaimed_grant_and_leaves_a_lease_in_use() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    lab.engine.upsert_capability(camera("cam-02")).await;
    let alice = lab.ask("alice", "cam-01", 50, 60).await;
    let bob = lab.ask("bob", "cam-01", 50, 60).await;
    let carol = lab.ask("carol", "cam-01", 40, 60).await;
    lab.release("alice", &alice.lease_id).await;
    assert_eq!(lab.status(&bob.lease_id).await, LeaseStatus::Granted);

    // Bob's client went away as the grant was made.
    lab.engine
        .abandon(std::slice::from_ref(&bob.lease_id))
        .await
        .expect("abandon");
    assert_eq!(lab.status(&bob.lease_id).await, LeaseStatus::Released);
    assert_eq!(lab.status(&carol.lease_id).await, LeaseStatus::Granted);
    let released = lab.events_of(EventType::LeaseReleased).await;
    let bobs = released
        .iter()
        .find(|e| e.lease_id.as_deref() == Some(bob.lease_id.as_str()))
        .expect("bob's lease_released");
    assert_eq!(bobs.data["reason"], leases::CLIENT_DISCONNECTED);

    // Carol acts on hers: it is in use and stays.
    lab.engine
        .authorize_action(&who("carol"), &carol.lease_id, "cam-01")
        .await
        .expect("act");
    lab.engine
        .abandon(std::slice::from_ref(&carol.lease_id))
        .await
        .expect("abandon");
    assert_eq!(lab.status(&carol.lease_id).await, LeaseStatus::Active);
    // A waiting request is withdrawn; an unknown id is ignored.
    let dave = lab.ask("dave", "cam-01", 50, 60).await;
    lab.engine
        .abandon(&[dave.lease_id.clone(), "lease_unknown".to_string()])
        .await
        .expect("abandon");
    assert_eq!(lab.status(&dave.lease_id).await, LeaseStatus::Released);
    assert_eq!(lab.engine.queue_len(), 0);
}

/// Wait (up to 5 s) until lease `lease_id` is committed in `status`: a
/// give-up by a dropped guard commits in the background.
async fn committed_as(lab: &Lab, lease_id: &str, status: LeaseStatus) {
    for _ in 0..500 {
        if lab.engine.get(lease_id).await.map(|l| l.status) == Some(status) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("lease {lease_id} not {status} within 5 s");
}

/// The leases of `principal`, newest first.
async fn leases_of(lab: &Lab, principal: &str) -> Vec<CapabilityLease> {
    lab.engine
        .list(LeaseFilter {
            principal: Some(principal.to_string()),
            ..LeaseFilter::default()
        })
        .await
}

/// A request whose caller is dropped while the engine commits it (the
/// caller never learned the lease id) is given up: a grant is released
/// and a waiting request withdrawn, with reason `client_disconnected`.
#[tokio::test]
async fn a_request_dropped_while_its_commit_is_in_flight_is_given_up() {
    use futures::FutureExt;
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let pending = lab
        .engine
        .request_unanswered(&who("alice"), ask("alice", "cam-01", 50, 60), None)
        .now_or_never();
    assert!(pending.is_none(), "the commit is still in flight");
    let bob = lab.ask("bob", "cam-01", 50, 60).await;
    // Alice's grant was given up before Bob's request was admitted.
    assert_eq!(bob.status, LeaseStatus::Granted);
    let alice = leases_of(&lab, "alice").await;
    assert_eq!(alice.len(), 1);
    assert_eq!(alice[0].status, LeaseStatus::Released);
    let released = lab.events_of(EventType::LeaseReleased).await;
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].data["reason"], leases::CLIENT_DISCONNECTED);

    // Carol waits behind Bob; dropped in the commit, she leaves the queue.
    let pending = lab
        .engine
        .request_unanswered(&who("carol"), ask("carol", "cam-01", 50, 60), None)
        .now_or_never();
    assert!(pending.is_none());
    assert_eq!(lab.engine.queue_len(), 0);
    let mut carol = Vec::new();
    for _ in 0..500 {
        carol = leases_of(&lab, "carol").await;
        if !carol.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(carol.len(), 1, "carol's request is stored");
    committed_as(&lab, &carol[0].lease_id, LeaseStatus::Released).await;
    let stats = lab.engine.answer_stats();
    assert_eq!(stats.given_up_leases, 2);
    assert!(stats.given_up.contains(&("committing".to_string(), 2)));
}

/// The guard of a committed request gives it up when dropped unanswered
/// and keeps it once answered.
#[tokio::test]
async fn an_unanswered_request_is_given_up_and_an_answered_one_kept() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let dropped = lab
        .engine
        .request_unanswered(&who("alice"), ask("alice", "cam-01", 50, 60), None)
        .await
        .expect("alice");
    let id = dropped.answer.lease_id.clone();
    assert_eq!(dropped.unanswered.lease_ids(), std::slice::from_ref(&id));
    drop(dropped);
    committed_as(&lab, &id, LeaseStatus::Released).await;

    let kept = lab
        .engine
        .request_unanswered(&who("bob"), ask("bob", "cam-01", 50, 60), None)
        .await
        .expect("bob")
        .answered();
    assert_eq!(lab.status(&kept.lease_id).await, LeaseStatus::Granted);
    assert_eq!(lab.engine.answer_stats().answered, 1);
}

/// A retry with the same idempotency key gets the same lease, also when
/// twenty copies arrive at once; another principal's key is its own; the
/// same key with another body is refused; a key whose request was given
/// up is forgotten, so the retry is a new request.
#[tokio::test]
async fn the_same_idempotency_key_gets_the_same_lease() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let key = leases::IdempotencyKey::parse("7d1c1a2e-retry").expect("key");
    let copies = (0..20).map(|_| {
        let engine = lab.engine.clone();
        let key = key.clone();
        async move {
            engine
                .request_unanswered(&who("alice"), ask("alice", "cam-01", 50, 60), Some(&key))
                .await
                .expect("alice")
        }
    });
    let answers = futures::future::join_all(copies).await;
    let ids: HashSet<_> = answers.iter().map(|a| a.answer.lease_id.clone()).collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(answers.iter().filter(|a| !a.replayed).count(), 1);
    assert!(answers
        .iter()
        .all(|a| a.answer.status == LeaseStatus::Granted));
    for a in answers {
        a.answered();
    }
    assert_eq!(leases_of(&lab, "alice").await.len(), 1);

    let bob = lab
        .engine
        .request_unanswered(&who("bob"), ask("bob", "cam-01", 50, 60), Some(&key))
        .await
        .expect("bob");
    assert!(!bob.replayed);
    assert_eq!(bob.answer.status, LeaseStatus::Requested);
    let bob = bob.answered();

    let reused = lab
        .engine
        .request_unanswered(&who("alice"), ask("alice", "cam-01", 60, 60), Some(&key))
        .await;
    assert!(
        matches!(reused, Err(LeaseError::IdempotencyKeyReused { .. })),
        "{:?}",
        reused.map(|r| r.answered())
    );
    assert_eq!(leases_of(&lab, "alice").await.len(), 1);

    // Bob's next request, with a new key, is given up unanswered; its
    // retry with that key is a new request.
    let key2 = leases::IdempotencyKey::parse("bob-2").expect("key");
    let first = lab
        .engine
        .request_unanswered(&who("bob"), ask("bob", "cam-01", 50, 60), Some(&key2))
        .await
        .expect("bob 2");
    let first_id = first.answer.lease_id.clone();
    drop(first);
    let retry = lab
        .engine
        .request_unanswered(&who("bob"), ask("bob", "cam-01", 50, 60), Some(&key2))
        .await
        .expect("bob 2 again")
        .answered();
    assert_ne!(retry.lease_id, first_id);
    committed_as(&lab, &first_id, LeaseStatus::Released).await;
    assert_eq!(lab.status(&retry.lease_id).await, LeaseStatus::Requested);
    assert_eq!(lab.status(&bob.lease_id).await, LeaseStatus::Requested);
}

/// An idempotency key survives a restart of the registry: the retry of a
/// request whose answer was lost just before the restart gets the same
/// lease; a key older than 24 h (on the wall clock) is forgotten.
#[tokio::test]
async fn an_idempotency_key_is_kept_across_a_restart_for_24_hours() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    lab.engine.upsert_capability(camera("cam-02")).await;
    let key = leases::IdempotencyKey::parse("before-restart").expect("key");
    let old_key = leases::IdempotencyKey::parse("a-day-old").expect("key");
    let first = lab
        .engine
        .request_unanswered(&who("alice"), ask("alice", "cam-01", 50, 60), Some(&key))
        .await
        .expect("alice")
        .answered();
    lab.clock.advance(Duration::from_secs(60));
    let _old = lab
        .engine
        .request_unanswered(
            &who("alice"),
            ask("alice", "cam-02", 50, 60),
            Some(&old_key),
        )
        .await
        .expect("alice 2")
        .answered();
    let restart = |wall: chrono::DateTime<chrono::Utc>, path: PathBuf| async move {
        let clock = Arc::new(ManualClock::starting_at(wall));
        let db = open_db(&path).await;
        let bus = EventBus::new(db.clone());
        let engine = LeaseEngine::start_with_clock(
            db,
            bus,
            LeaseConfig {
                sweep_interval_ms: LONG_SWEEP_MS,
                ..LeaseConfig::default()
            },
            clock,
        )
        .await
        .expect("restart");
        engine.upsert_capability(camera("cam-01")).await;
        engine.upsert_capability(camera("cam-02")).await;
        engine
    };
    let wall = lab.clock_wall();
    let path = lab.path.clone();
    lab.engine.shutdown().await;
    let Lab { _dir, .. } = lab;

    let engine = restart(wall + chrono::TimeDelta::seconds(5), path.clone()).await;
    let again = engine
        .request_unanswered(&who("alice"), ask("alice", "cam-01", 50, 60), Some(&key))
        .await
        .expect("retry");
    assert!(again.replayed);
    assert_eq!(again.answer.lease_id, first.lease_id);
    again.answered();
    engine.shutdown().await;
    drop(engine);

    // A day and 30 s after the first request: the first key is past
    // 24 h, the second (made 60 s later) is not.
    let engine = restart(wall + chrono::TimeDelta::seconds(24 * 3600 - 30), path).await;
    let fresh = engine
        .request_unanswered(&who("alice"), ask("alice", "cam-01", 50, 60), Some(&key))
        .await
        .expect("after a day");
    assert!(!fresh.replayed);
    assert_ne!(fresh.answer.lease_id, first.lease_id);
    fresh.answered();
    let kept = engine
        .request_unanswered(
            &who("alice"),
            ask("alice", "cam-02", 50, 60),
            Some(&old_key),
        )
        .await
        .expect("second key");
    assert!(kept.replayed);
    kept.answered();
    engine.shutdown().await;
}

#[tokio::test]
async fn lease_errors_map_to_http_statuses() {
    let cases: Vec<(LeaseError, u16)> = vec![
        (
            LeaseError::NotFound {
                lease_id: "l".into(),
            },
            404,
        ),
        (
            LeaseError::NotHolder {
                lease_id: "l".into(),
                principal: "b".into(),
                holder: "a".into(),
            },
            403,
        ),
        (
            LeaseError::NotUsable {
                lease_id: "l".into(),
                status: LeaseStatus::Revoked,
                operation: "renew",
            },
            409,
        ),
        (
            LeaseError::UnknownCapability {
                capability_id: "c".into(),
            },
            404,
        ),
        (
            LeaseError::CapabilityOffline {
                capability_ids: vec!["c".into()],
            },
            503,
        ),
        (LeaseError::QueueFull { limit: 3 }, 503),
        (
            LeaseError::InvalidRequest {
                field: "priority".into(),
                message: "0 to 100".into(),
            },
            422,
        ),
    ];
    for (err, status) in cases {
        let text = err.to_string();
        let api = ApiError::from(err);
        assert_eq!(api.status.as_u16(), status, "{text}");
        if status == 409 {
            assert_eq!(api.details["lease_status"], "revoked");
        }
        if status == 422 {
            assert_eq!(api.details["field"], "priority");
        }
    }
}

#[tokio::test]
async fn withdrawing_one_waiting_group_member_withdraws_the_whole_group() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    lab.engine.upsert_capability(camera("cam-02")).await;
    let holder = lab.ask("h", "cam-01", 50, 600).await;
    let g = lab.group("g", &["cam-01", "cam-02"], 60).await;
    let withdrawn = lab
        .engine
        .release(
            &who("g"),
            &g.leases[1].lease_id,
            Some("plan changed".into()),
        )
        .await
        .expect("withdraw");
    assert_eq!(withdrawn.status, LeaseStatus::Released);
    for l in &g.leases {
        assert_eq!(lab.status(&l.lease_id).await, LeaseStatus::Released);
    }
    assert_eq!(lab.engine.queue_len(), 0);
    lab.release("h", &holder.lease_id).await;
    assert!(lab.active(None).await.is_empty());
}

#[tokio::test]
async fn a_failed_commit_changes_nothing_and_the_engine_recovers() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    lab.engine.upsert_capability(camera("cam-02")).await;
    let holder = lab.ask("a", "cam-01", 50, 600).await;
    // The disk "fails" for one lease row: its whole transaction rolls back.
    lab.db
        .write(|c| {
            c.execute_batch(
                "CREATE TRIGGER disk_failure BEFORE INSERT ON capability_leases
                 WHEN NEW.purpose = 'doomed'
                 BEGIN SELECT RAISE(ABORT, 'simulated I/O error'); END;",
            )
        })
        .await
        .expect("db thread")
        .expect("trigger");
    let events_before = lab.events().await.len();
    let mut doomed = ask("b", "cam-02", 50, 60);
    doomed.purpose = "doomed".into();
    let err = lab
        .engine
        .request(&who("b"), doomed)
        .await
        .expect_err("commit fails");
    assert!(matches!(err, LeaseError::Unavailable { .. }), "{err:?}");
    assert_eq!(
        lab.events().await.len(),
        events_before,
        "no event of the failed transition"
    );

    // The engine reloads its model from the table and serves again; the
    // failed grant never happened, so cam-02 is free.
    let mut granted = None;
    for _ in 0..100 {
        match lab
            .engine
            .request(&who("c"), ask("c", "cam-02", 50, 60))
            .await
        {
            Ok(l) => {
                granted = Some(l);
                break;
            }
            Err(LeaseError::Unavailable { .. }) => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    let granted = granted.expect("engine recovered");
    assert_eq!(granted.status, LeaseStatus::Granted);
    assert_eq!(lab.status(&holder.lease_id).await, LeaseStatus::Granted);
    let all = lab.engine.list(LeaseFilter::default()).await;
    assert_eq!(all.len(), 2, "only the two committed leases exist: {all:?}");
}

/// A capability whose last lease ending hands it to the safe-state holder
/// (docs/policy.md "Safe state on release").
fn with_on_release(id: &str) -> CapabilityInfo {
    CapabilityInfo {
        on_release: vec![leases::ReleaseAction {
            action: shared_protocol::capability::CapabilityAction::PowerOff,
            params: Default::default(),
        }],
        ..camera(id)
    }
}

/// The live leases of the safe-state holder on `capability_id`.
async fn safe_state_leases(lab: &Lab, capability_id: &str) -> Vec<CapabilityLease> {
    lab.active(Some(capability_id))
        .await
        .into_iter()
        .filter(|l| l.principal == leases::SAFE_STATE_PRINCIPAL)
        .collect()
}

/// A preempted holder keeps its grace period; when it is revoked the
/// capability goes to the safe-state holder, not to the preemptor, in the
/// same commit; the preemptor cannot preempt that lease, and is granted
/// only once it is released.
#[tokio::test]
async fn a_revoked_holder_hands_the_capability_to_the_safe_state_holder_first() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine
        .upsert_capability(with_on_release("psu-01"))
        .await;
    let holder = lab.ask("worker-a", "psu-01", 50, 600).await;
    let newcomer = lab
        .engine
        .request(
            &who("operator-b"),
            preempting(ask("operator-b", "psu-01", 90, 60), "safety_stop"),
        )
        .await
        .expect("newcomer");
    assert_eq!(lab.status(&holder.lease_id).await, LeaseStatus::GracePeriod);
    assert!(
        safe_state_leases(&lab, "psu-01").await.is_empty(),
        "grace first"
    );

    lab.advance(11).await;
    assert_eq!(lab.status(&holder.lease_id).await, LeaseStatus::Revoked);
    assert_eq!(lab.status(&newcomer.lease_id).await, LeaseStatus::Requested);
    let system = safe_state_leases(&lab, "psu-01").await;
    assert_eq!(system.len(), 1, "{system:?}");
    let system = &system[0];
    assert_eq!(system.status, LeaseStatus::Granted);
    assert_eq!(system.holder_type, HolderType::System);
    assert_eq!(system.purpose, leases::SAFE_STATE_PURPOSE);
    assert!(
        system.generation > holder.generation,
        "fences the old holder"
    );
    let pending = lab.engine.pending_safe_states();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].1.len(), 1, "the capability's on_release actions");

    // Nothing preempts it, nor do further sweeps end it.
    let third = lab
        .engine
        .request(
            &who("operator-c"),
            preempting(ask("operator-c", "psu-01", 100, 60), "safety_stop"),
        )
        .await
        .expect("third");
    lab.advance(30).await;
    assert_eq!(lab.status(&system.lease_id).await, LeaseStatus::Granted);
    assert_eq!(lab.status(&third.lease_id).await, LeaseStatus::Requested);

    let ended = lab
        .engine
        .end_safe_state(&system.lease_id, "safe_state_done")
        .await
        .expect("end");
    assert_eq!(ended.status, LeaseStatus::Released);
    // The highest waiter gets it; nothing is handed to a new safe-state run.
    assert_eq!(lab.status(&third.lease_id).await, LeaseStatus::Granted);
    assert_eq!(safe_state_leases(&lab, "psu-01").await.len(), 0);
    assert_eq!(
        max_simultaneous_holders(&lab.events().await).get("psu-01"),
        Some(&1)
    );
}

/// Release and expiry hand over too; a capability without `on_release`
/// goes straight to the next waiter.
#[tokio::test]
async fn release_and_expiry_hand_over_and_plain_capabilities_do_not() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine
        .upsert_capability(with_on_release("psu-01"))
        .await;
    lab.engine.upsert_capability(camera("cam-01")).await;

    let a = lab.ask("worker-a", "psu-01", 50, 600).await;
    let b = lab.ask("worker-b", "psu-01", 50, 5).await;
    lab.release("worker-a", &a.lease_id).await;
    assert_eq!(lab.status(&b.lease_id).await, LeaseStatus::Requested);
    let first = safe_state_leases(&lab, "psu-01").await;
    assert_eq!(first.len(), 1);
    lab.engine
        .end_safe_state(&first[0].lease_id, "safe_state_done")
        .await
        .expect("end");
    assert_eq!(lab.status(&b.lease_id).await, LeaseStatus::Granted);

    lab.advance(6).await;
    assert_eq!(lab.status(&b.lease_id).await, LeaseStatus::Expired);
    assert_eq!(
        safe_state_leases(&lab, "psu-01").await.len(),
        1,
        "after expiry"
    );

    let c = lab.ask("worker-a", "cam-01", 50, 600).await;
    let d = lab.ask("worker-b", "cam-01", 50, 600).await;
    lab.release("worker-a", &c.lease_id).await;
    assert_eq!(lab.status(&d.lease_id).await, LeaseStatus::Granted);
    assert!(safe_state_leases(&lab, "cam-01").await.is_empty());
}

/// The registry's verdict keeps a capability from being granted until it
/// is cleared; heartbeats (the provider's health) do not clear it.
#[tokio::test]
async fn a_check_verdict_gates_grants_until_cleared_and_heartbeats_do_not_clear_it() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    assert!(
        lab.engine
            .set_check_unhealthy("cam-01", true, Some("on_release power_off: failed".into()))
            .await
    );
    let mut now_only = ask("worker-a", "cam-01", 50, 60);
    now_only.queue_timeout_seconds = Some(0);
    match lab.engine.request(&who("worker-a"), now_only.clone()).await {
        Err(LeaseError::CapabilityUnhealthy { capability_ids }) => {
            assert_eq!(capability_ids, vec!["cam-01".to_string()])
        }
        other => panic!("expected capability_unhealthy, got {other:?}"),
    }
    let waiting = lab.ask("worker-b", "cam-01", 50, 60).await;
    assert_eq!(waiting.status, LeaseStatus::Requested);

    lab.engine.set_unhealthy("cam-01", false).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    assert_eq!(lab.status(&waiting.lease_id).await, LeaseStatus::Requested);

    assert!(lab.engine.set_check_unhealthy("cam-01", false, None).await);
    assert_eq!(lab.status(&waiting.lease_id).await, LeaseStatus::Granted);
    lab.release("worker-b", &waiting.lease_id).await;

    // An admin's maintenance round trip (repaired) clears the verdict too.
    lab.engine
        .set_check_unhealthy("cam-01", true, Some("stuck".into()))
        .await;
    let next = lab.ask("worker-a", "cam-01", 50, 60).await;
    assert_eq!(next.status, LeaseStatus::Requested);
    let ids = ["cam-01".to_string()];
    lab.engine
        .set_maintenance(&ids, Some("repair"))
        .await
        .expect("enter");
    assert_eq!(lab.status(&next.lease_id).await, LeaseStatus::Requested);
    lab.engine.set_maintenance(&ids, None).await.expect("leave");
    assert!(lab.engine.check_failures().is_empty());
    assert_eq!(lab.status(&next.lease_id).await, LeaseStatus::Granted);
}

/// A safe-state lease is persisted like any lease: after a restart it
/// still holds the capability and is pending again.
#[tokio::test]
async fn a_pending_safe_state_run_survives_a_restart() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine
        .upsert_capability(with_on_release("psu-01"))
        .await;
    let a = lab.ask("worker-a", "psu-01", 50, 600).await;
    let b = lab.ask("worker-b", "psu-01", 50, 60).await;
    lab.release("worker-a", &a.lease_id).await;
    let system = safe_state_leases(&lab, "psu-01").await;
    assert_eq!(system.len(), 1);
    lab.engine.shutdown().await;

    let db = open_db(&lab.path).await;
    let engine = LeaseEngine::start_with_clock(
        db.clone(),
        EventBus::new(db),
        LeaseConfig {
            sweep_interval_ms: LONG_SWEEP_MS,
            ..LeaseConfig::default()
        },
        lab.clock.clone(),
    )
    .await
    .expect("restart");
    engine.upsert_capability(with_on_release("psu-01")).await;
    engine.sweep_now().await;
    let pending = engine.pending_safe_states();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].0.lease_id, system[0].lease_id);
    assert_eq!(
        engine.get(&b.lease_id).await.map(|l| l.status),
        Some(LeaseStatus::Requested)
    );
    engine
        .end_safe_state(&system[0].lease_id, "safe_state_done")
        .await
        .expect("end");
    assert_eq!(
        engine.get(&b.lease_id).await.map(|l| l.status),
        Some(LeaseStatus::Granted)
    );
}

/// A lease request of the registry's health check on `capability_id`.
fn check_request(capability_id: &str) -> (Principal, LeaseRequest) {
    let who = Principal {
        name: leases::HEALTH_CHECK_PRINCIPAL.to_string(),
        role: Role::Admin,
    };
    let mut req = ask(leases::HEALTH_CHECK_PRINCIPAL, capability_id, 100, 60);
    req.holder_type = HolderType::System;
    req.evidence_required = false;
    (who, req)
}

#[tokio::test]
async fn a_failed_check_holds_a_capability_out_until_a_check_clears_it() {
    let lab = Lab::manual(LeaseConfig::default()).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    lab.engine
        .set_check_unhealthy("cam-01", true, Some("lens covered".into()))
        .await;
    assert_eq!(
        lab.engine
            .check_failures()
            .get("cam-01")
            .map(String::as_str),
        Some("lens covered")
    );

    // Not waiting: refused at once.
    let mut now = ask("worker", "cam-01", 50, 60);
    now.queue_timeout_seconds = Some(0);
    let err = lab.engine.request(&who("worker"), now).await.unwrap_err();
    assert!(
        matches!(&err, LeaseError::CapabilityUnhealthy { capability_ids } if capability_ids == &["cam-01"]),
        "{err:?}"
    );

    // A heartbeat saying healthy (or a re-registration) does not clear it.
    lab.engine.set_unhealthy("cam-01", false).await;
    lab.engine.upsert_capability(camera("cam-01")).await;
    let waiting = lab.ask("worker", "cam-01", 50, 60).await;
    assert_eq!(waiting.status, LeaseStatus::Requested);

    // The health check's own lease is granted, ahead of the waiter; a
    // system lease of another principal is not.
    let (checker, req) = check_request("cam-01");
    let mut other = req.clone();
    other.holder_ref = "lab-admin".into();
    let other = lab.engine.request(&admin(), other).await.unwrap();
    assert_eq!(other.status, LeaseStatus::Requested);
    let check = lab.engine.request(&checker, req).await.unwrap();
    assert_eq!(check.status, LeaseStatus::Granted, "{check:?}");
    lab.engine
        .release(&checker, &check.lease_id, None)
        .await
        .unwrap();
    assert_eq!(lab.status(&waiting.lease_id).await, LeaseStatus::Requested);

    // A passing check lets the queue move.
    lab.engine.set_check_unhealthy("cam-01", false, None).await;
    assert!(lab.engine.check_failures().is_empty());
    // The higher-priority waiter first.
    assert_eq!(lab.status(&other.lease_id).await, LeaseStatus::Granted);
    assert_eq!(lab.status(&waiting.lease_id).await, LeaseStatus::Requested);
}
