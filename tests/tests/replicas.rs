//! Registry replicas on one PostgreSQL schema and one Mosquitto
//! (docs/scale.md "Replicas"):
//! - two replicas serve one API: a lease taken on the leader is released
//!   through the standby, a group lease asked of the standby is held on the
//!   leader, and the event stream of either carries every event;
//! - failover: 200 clients lease and release through both replicas while
//!   the leader is killed with SIGKILL; the standby takes over within 5 s,
//!   and the store afterwards shows no lease granted twice, every
//!   acknowledged grant and release kept, and nothing left queued or held;
//! - a session in flight when the leader is killed ends on the new leader
//!   (completed with its artifact, or reconciled as never received), and
//!   its lease is held across the takeover.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use benchlink_e2e::bench::{
    bench_speaker, caps, unique_topic_prefix, Broker, Lab, LabOptions, HW_AGENT,
};
use benchlink_e2e::client::{follow_events, group_leases, Agent};
use benchlink_e2e::pg::PgSchema;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// The `[cluster]` table of replica `id`; the lab's first registry is `a`.
fn cluster_toml(id: &str) -> String {
    format!("\n[cluster]\nenabled = true\nreplica_id = \"{id}\"\ntakeover_poll_ms = 200\n")
}

/// The lab's options for replicas on `pg`, with `speakers` extra speakers.
fn replica_lab(pg: &PgSchema, speakers: usize) -> LabOptions {
    LabOptions {
        broker: Broker::External {
            host: "127.0.0.1".into(),
            port: 1883,
        },
        topic_prefix: unique_topic_prefix(),
        registry_store_toml: pg.store_toml(),
        registry_extra_toml: cluster_toml("a"),
        extra_speakers: speakers,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_serve_one_api_and_one_event_stream() {
    if !benchlink_testkit::mosquitto() {
        return;
    }
    let Some(pg) = PgSchema::fresh("two") else {
        return;
    };
    let lab = Lab::start(replica_lab(&pg, 0)).await.expect("lab");
    let b_port = benchlink_testkit::free_port();
    let b_config = lab.replica_config(b_port, "b").expect("replica config");
    let (mut b, line) = lab.start_replica(&b_config, "b").expect("replica b");
    assert_eq!(
        line["event"], "standby",
        "b stands by while a leads: {line}"
    );
    assert_eq!(line["leader"], lab.base_url.as_str(), "{line}");
    let b_url = format!("http://127.0.0.1:{b_port}");

    let on_a = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let on_b = Agent::new(&b_url, HW_AGENT, &lab.hw_token);
    let (events_a, follow_a) = follow_events(&on_a, |_| {});
    let (events_b, follow_b) = follow_events(&on_b, |_| {});

    // Lease on A, release on B.
    let lease = on_a
        .lease_ok(caps::RELAY, "lease on a, release on b")
        .await
        .expect("lease on a");
    let (s, v) = on_b.release(&lease).await.expect("release through b");
    assert_eq!(s, StatusCode::OK, "release through b: {v}");
    assert_eq!(v["status"], "released", "{v}");
    let seen = on_a
        .get_ok(&format!("/api/v1/capability-leases/{lease}"))
        .await
        .expect("lease read on a");
    assert_eq!(seen["status"], "released", "a sees b's release: {seen}");

    // The standby says who answered; its own errors are the registry's.
    let answer = on_b
        .http()
        .get(format!("{b_url}/api/v1/capability-leases/{lease}"))
        .bearer_auth(&lab.hw_token)
        .send()
        .await
        .expect("read through b");
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(
        answer
            .headers()
            .get("x-benchlink-served-by")
            .and_then(|v| v.to_str().ok()),
        Some("a"),
        "b names the leader that answered"
    );
    let (s, v) = on_b
        .get("/api/v1/capability-leases/lease-that-is-not-there")
        .await
        .expect("unknown lease through b");
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["error"]["code"], "not_found", "{v}");

    // Each replica answers `/healthz` about itself (a load balancer asks
    // every one): b stands by and names a, a leads.
    for (url, role) in [(&b_url, "standby"), (&lab.base_url, "leader")] {
        let answer = on_b
            .http()
            .get(format!("{url}/healthz"))
            .send()
            .await
            .expect("healthz");
        assert_eq!(answer.status(), StatusCode::OK, "{url}/healthz");
        assert!(
            answer.headers().get("x-benchlink-served-by").is_none(),
            "{url}/healthz is answered by the replica asked"
        );
        let health: Value = answer.json().await.expect("healthz JSON");
        assert_eq!(health["cluster"]["role"], role, "{url}: {health}");
        if role == "standby" {
            assert_eq!(health["status"], "standby", "{health}");
            assert_eq!(health["cluster"]["replica"], "b", "{health}");
            assert_eq!(health["cluster"]["leader"]["replica"], "a", "{health}");
        } else {
            assert_eq!(health["status"], "ok", "{health}");
            assert_eq!(health["cluster"]["replica"], "a", "{health}");
            assert_eq!(health["cluster"]["epoch"], 1, "{health}");
        }
    }

    // A group lease asked of B is held on A, and released there.
    let group = on_b
        .lease_group(&[caps::PSU, caps::CONSOLE], 50, "group through b", 10)
        .await
        .expect("group lease through b");
    let members = group_leases(&group);
    assert_eq!(members.len(), 2, "{group}");
    for (cap, id) in &members {
        let held = on_a.capability(cap).await;
        assert_eq!(held["status"], "leased", "{cap} is leased on a: {held}");
        let (s, v) = on_a.release(id).await.expect("release on a");
        assert_eq!(s, StatusCode::OK, "{v}");
    }

    // Both streams carry every event, in one order.
    let released = |id: &str| {
        let id = id.to_string();
        move |e: &Value| e["event_type"] == "lease_released" && e["lease_id"] == id.as_str()
    };
    let last = members.values().last().cloned().expect("a member");
    for (name, log) in [("a", &events_a), ("b", &events_b)] {
        log.wait_for(
            "lease_released of the last group member",
            Duration::from_secs(10),
            released(&last),
        )
        .await
        .unwrap_or_else(|e| panic!("stream of {name}: {e}"));
        let all = log.all();
        let granted = all
            .iter()
            .any(|e| e["event_type"] == "lease_granted" && e["lease_id"] == lease.as_str());
        let freed = all.iter().any(released(&lease));
        assert!(
            granted && freed,
            "stream of {name} shows the grant on a and the release on b"
        );
    }
    let ids = |log: &benchlink_e2e::client::EventLog| -> Vec<u64> {
        log.all()
            .iter()
            .filter_map(|e| e["event_id"].as_u64())
            .collect()
    };
    let (from_a, from_b) = (ids(&events_a), ids(&events_b));
    let common = from_a.len().min(from_b.len());
    assert!(common > 0);
    assert_eq!(
        from_a[..common],
        from_b[..common],
        "one global order of events"
    );
    follow_a.abort();
    follow_b.abort();

    // Told to stop, a standby stops cleanly (status 0), and a leads on.
    assert_eq!(
        b.terminate(Duration::from_secs(10)),
        Some(0),
        "SIGTERM stops a standby with status 0"
    );
    let (s, v) = on_a
        .get("/api/v1/capabilities")
        .await
        .expect("a after b stopped");
    assert_eq!(s, StatusCode::OK, "{v}");
}

/// What the failover clients saw.
#[derive(Default)]
struct Ledger {
    /// Acknowledged grants: lease id → capability.
    granted: HashMap<String, String>,
    /// Acknowledged releases.
    released: Vec<String>,
    /// Answers that were neither success nor retryable: `status: body`.
    wrong: Vec<String>,
    /// Retryable failures (connection refused or reset, 503).
    retried: u64,
    /// Completed lease → release cycles.
    cycles: u64,
}

/// What every failover client shares.
struct Clients {
    http: reqwest::Client,
    urls: Vec<String>,
    token: String,
    ledger: Mutex<Ledger>,
}

impl Clients {
    /// One retrying call: `POST path` with `body` and `key` as its
    /// `Idempotency-Key`, alternating between the replicas from `start`
    /// on until an answer that is not retryable comes (or 60 s pass).
    async fn call(
        &self,
        start: usize,
        path: &str,
        body: &Value,
        key: &str,
    ) -> Option<(StatusCode, Value)> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut i = start;
        while Instant::now() < deadline {
            let url = &self.urls[i % self.urls.len()];
            i += 1;
            let sent = self
                .http
                .post(format!("{url}{path}"))
                .bearer_auth(&self.token)
                .header("Idempotency-Key", key)
                .json(body)
                .send()
                .await;
            match sent {
                Ok(r) if r.status() != StatusCode::SERVICE_UNAVAILABLE => {
                    let s = r.status();
                    let v = r.json::<Value>().await.unwrap_or(Value::Null);
                    return Some((s, v));
                }
                _ => {
                    self.ledger().retried += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        self.wrong(format!("{path}: no answer within 60 s"));
        None
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap()
    }

    fn wrong(&self, what: String) {
        self.ledger().wrong.push(what);
    }
}

/// One failover client: lease `cap`, release it, again, until `stop`.
async fn client(n: usize, cap: String, all: Arc<Clients>, stop: Arc<AtomicBool>) {
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let key = format!("failover-{n}-{round}");
        let body = json!({
            "capability_id": cap,
            "holder_type": "audit_agent",
            "holder_ref": format!("{HW_AGENT}:client-{n}"),
            "project_id": "failover",
            "purpose": format!("failover client {n} round {round}"),
            "priority": 50,
            "requested_duration_seconds": 120,
            "evidence_required": false,
        });
        let path = "/api/v1/capability-leases/request?wait_seconds=20";
        let Some((s, v)) = all.call(n + round as usize, path, &body, &key).await else {
            return;
        };
        let Some(id) = v["lease_id"].as_str().map(str::to_string) else {
            all.wrong(format!("request: {s}: {v}"));
            return;
        };
        let path = format!("/api/v1/capability-leases/{id}/release");
        if s == StatusCode::ACCEPTED {
            // Still queued after 20 s: give the request up.
            let body = json!({"reason": "gave up"});
            let _ = all.call(n, &path, &body, &format!("{key}-cancel")).await;
            continue;
        }
        if s != StatusCode::CREATED {
            all.wrong(format!("request: {s}: {v}"));
            return;
        }
        all.ledger().granted.insert(id.clone(), cap.clone());
        tokio::time::sleep(Duration::from_millis(5)).await;
        let body = json!({"reason": "failover cycle done"});
        let Some((s, v)) = all
            .call(n + 1, &path, &body, &format!("{key}-release"))
            .await
        else {
            return;
        };
        // A retried release whose first answer was lost finds the lease
        // released already.
        let done = s == StatusCode::OK
            || (s == StatusCode::CONFLICT && v["error"]["details"]["status"] == "released");
        if !done {
            all.wrong(format!("release {id}: {s}: {v}"));
            return;
        }
        let mut l = all.ledger();
        l.released.push(id);
        l.cycles += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_leader_under_200_clients_loses_nothing_and_grants_nothing_twice() {
    if !benchlink_testkit::mosquitto() {
        return;
    }
    let Some(pg) = PgSchema::fresh("failover") else {
        return;
    };
    const SPEAKERS: usize = 40;
    const CLIENTS: usize = 200;
    let mut lab = Lab::start(replica_lab(&pg, SPEAKERS)).await.expect("lab");
    let b_port = benchlink_testkit::free_port();
    let b_config = lab.replica_config(b_port, "b").expect("replica config");
    let (b, line) = lab.start_replica(&b_config, "b").expect("replica b");
    assert_eq!(line["event"], "standby", "{line}");
    let urls = Arc::new(vec![
        lab.base_url.clone(),
        format!("http://127.0.0.1:{b_port}"),
    ]);

    let stop = Arc::new(AtomicBool::new(false));
    let all = Arc::new(Clients {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("http client"),
        urls: urls.to_vec(),
        token: lab.hw_token.clone(),
        ledger: Mutex::new(Ledger::default()),
    });
    let ledger = || all.ledger();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|n| {
            tokio::spawn(client(
                n,
                bench_speaker(n % SPEAKERS + 1),
                all.clone(),
                stop.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = ledger().cycles;
    assert!(
        before > 0,
        "the clients lease and release before the failover: {:?}",
        &ledger().wrong[..]
    );

    // SIGKILL the leader (nothing of it gets to run), twice: a takes the
    // lead back from b once it stands by again.
    let mut leader = lab.registry.take().expect("leader a");
    let mut standby = b;
    let mut at_takeover = 0;
    for (round, (next, epoch)) in [("b", 2), ("a", 3)].into_iter().enumerate() {
        let killed = Instant::now();
        leader.kill();
        let rx = standby.stdout_rx.take().expect("the standby's stdout");
        let took_over = tokio::task::spawn_blocking(move || loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(l) if l.contains("\"event\":\"ready\"") => return Some((killed.elapsed(), l)),
                Ok(_) => continue,
                Err(_) => return None,
            }
        })
        .await
        .expect("reader");
        let (takeover, ready) = took_over.expect("the standby takes over within 30 s");
        let ready: Value = serde_json::from_str(&ready).expect("ready line");
        assert_eq!(ready["replica"], next, "{ready}");
        assert_eq!(
            ready["epoch"], epoch,
            "leader number {epoch} of the store: {ready}"
        );
        eprintln!(
            "failover {}: {next} took over {} ms after SIGKILL",
            round + 1,
            takeover.as_millis()
        );
        assert!(
            takeover < Duration::from_secs(5),
            "takeover took {takeover:?}"
        );
        at_takeover = ledger().cycles;
        tokio::time::sleep(Duration::from_secs(2)).await;
        leader = standby;
        if round == 0 {
            // The killed replica comes back, and stands by.
            let (again, line) = lab
                .start_replica(lab.registry_config(), "a-again")
                .expect("a restarts");
            assert_eq!(line["event"], "standby", "{line}");
            standby = again;
        } else {
            standby = leader;
            break;
        }
    }
    let _keep = standby;

    // The clients go on through the last leader for a while.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("client task");
    }
    let ledger = std::mem::take(&mut *ledger());
    eprintln!(
        "cycles {} ({before} before the first kill, {at_takeover} at the last takeover), retried {}",
        ledger.cycles, ledger.retried
    );
    assert!(
        ledger.wrong.is_empty(),
        "clients saw only retryable errors: {:?}",
        &ledger.wrong[..ledger.wrong.len().min(5)]
    );
    assert!(
        ledger.cycles > at_takeover,
        "cycles go on after the takeover"
    );

    // The store's own account.
    let rows = pg
        .rows(
            "SELECT lease_id, capability_id, status, granted_at, ended_at FROM capability_leases \
             WHERE project_id = 'failover' ORDER BY capability_id, granted_at",
        )
        .expect("leases in the store");
    let col = |r: &Vec<Option<String>>, i: usize| r[i].clone().unwrap_or_default();
    let stored: BTreeMap<String, (String, String)> = rows
        .iter()
        .map(|r| (col(r, 0), (col(r, 1), col(r, 2))))
        .collect();
    for (id, cap) in &ledger.granted {
        let (c, _) = stored
            .get(id)
            .unwrap_or_else(|| panic!("acknowledged grant {id} is in the store"));
        assert_eq!(c, cap);
    }
    for id in &ledger.released {
        assert_eq!(
            stored[id].1, "released",
            "acknowledged release of {id} kept"
        );
    }
    let live: Vec<_> = rows
        .iter()
        .filter(|r| matches!(col(r, 2).as_str(), "requested" | "granted" | "active"))
        .collect();
    assert!(live.is_empty(), "nothing left queued or held: {live:?}");
    // No two grants of one speaker overlap.
    let mut overlaps = Vec::new();
    for pair in rows.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if col(a, 1) != col(b, 1) || a[3].is_none() || b[3].is_none() {
            continue;
        }
        if a[4].is_none() || col(a, 4) > col(b, 3) {
            overlaps.push(format!("{} and {} on {}", col(a, 0), col(b, 0), col(a, 1)));
        }
    }
    assert!(overlaps.is_empty(), "a lease granted twice: {overlaps:?}");
    let events = pg
        .rows("SELECT count(*)::text FROM events")
        .expect("events in the store");
    eprintln!(
        "{} leases and {} events in the store",
        rows.len(),
        col(&events[0], 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_in_flight_when_the_leader_dies_ends_on_the_new_leader() {
    if !benchlink_testkit::mosquitto() {
        return;
    }
    let Some(pg) = PgSchema::fresh("inflight") else {
        return;
    };
    let mut lab = Lab::start(replica_lab(&pg, 0)).await.expect("lab");
    let b_port = benchlink_testkit::free_port();
    let b_config = lab.replica_config(b_port, "b").expect("replica config");
    let (mut b, line) = lab.start_replica(&b_config, "b").expect("replica b");
    assert_eq!(line["event"], "standby", "{line}");
    let b_url = format!("http://127.0.0.1:{b_port}");
    let on_a = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let on_b = Agent::new(&b_url, HW_AGENT, &lab.hw_token);

    // A 4 s capture of the DUT console, started on the leader.
    let lease = on_a
        .lease_ok(caps::CONSOLE, "capture across a takeover")
        .await
        .expect("console lease");
    let (s, v) = on_a
        .post(
            &format!("/api/v1/capability-leases/{lease}/actions"),
            &json!({"action": "capture_log", "params": {"duration_ms": 4000}, "wait_ms": 0}),
        )
        .await
        .expect("start the capture");
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let session_id = v["session_id"].as_str().expect("session id").to_string();
    tokio::time::sleep(Duration::from_millis(1000)).await;

    // SIGKILL the leader mid-capture; b takes over.
    lab.registry.take().expect("leader a").kill();
    let rx = b.stdout_rx.take().expect("b's stdout");
    let ready = tokio::task::spawn_blocking(move || loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) if l.contains("\"event\":\"ready\"") => return Some(l),
            Ok(_) => continue,
            Err(_) => return None,
        }
    })
    .await
    .expect("reader")
    .expect("b takes over within 30 s");
    let ready: Value = serde_json::from_str(&ready).expect("ready line");
    assert_eq!(ready["replica"], "b", "{ready}");
    // a comes back and stands by: the bench's uploads, sent to a's URL,
    // reach b through it (a load balancer's part in a deployment).
    let (_a_again, line) = lab
        .start_replica(lab.registry_config(), "a-again")
        .expect("a restarts");
    assert_eq!(line["event"], "standby", "{line}");

    // The session ends on b, never left running: completed with its
    // artifact when the bench got the command (it reports to whoever
    // leads), or failed as never received when the command was still in
    // a's MQTT queue at the kill (a 202 answers once the command is handed
    // to the MQTT client, not once the broker has it).
    let session = benchlink_e2e::eventually(
        Duration::from_secs(60),
        "the capture ends on the new leader",
        || async {
            let s = on_b
                .get_ok(&format!("/api/v1/sessions/{session_id}"))
                .await
                .ok()?;
            (s["status"] != "running").then_some(s)
        },
    )
    .await;
    match session["status"].as_str() {
        Some("completed") => {
            let artifacts = session["artifact_refs"].as_array().expect("artifact_refs");
            assert!(!artifacts.is_empty(), "the log capture is kept: {session}");
        }
        Some("failed") => assert!(
            session["error_message"]
                .as_str()
                .is_some_and(|m| m.contains("never reached it")),
            "failed only because the bench never got the command: {session}"
        ),
        _ => panic!("the session ends completed or reconciled: {session}"),
    }
    eprintln!("session after the takeover: {}", session["status"]);
    let held = on_b
        .get_ok(&format!("/api/v1/capability-leases/{lease}"))
        .await
        .expect("the lease on b");
    assert_eq!(
        held["status"], "active",
        "the lease, active since its first action, outlives the takeover: {held}"
    );
    let (s, v) = on_b.release(&lease).await.expect("release on b");
    assert_eq!(s, StatusCode::OK, "{v}");
}
