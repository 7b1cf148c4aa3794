//! Lease requests whose client goes away before it reads the answer leave
//! nothing behind, across real processes: the real registry with the
//! simulated bench registered, and 200 raw TCP connections per scenario,
//! each sending one complete `POST /api/v1/capability-leases/request` and
//! closing right after it (half-close then drop, or an immediate close
//! with `SO_LINGER` 0, which sends RST). Half of them wait for the grant
//! (`?wait_seconds=30`), half do not.
//!
//! What the registry can prove (docs/http-api.md, "A client that goes
//! away"): a request whose connection ends (FIN or RST) before hyper took
//! the answer is given up; one whose answer was taken first cannot be
//! told from a client that read it. So afterwards every request that
//! reached the lease engine is either given up (`released`) or counted as
//! answered on `/metrics`, exactly the answered ones are still live, and
//! a waiting request (its answer comes only with the grant or after 30 s)
//! is never one of them unless it was granted at once — at most one on a
//! free exclusive capability, none on a busy one.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, CHIEF_AGENT, HW_AGENT};
use benchlink_e2e::client::Agent;
use benchlink_testkit::status_is;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// Connections per scenario.
const CLIENTS: usize = 200;
/// Threads sending them (each holds `CLIENTS / SENDERS` open connections
/// and sends on all of them after a common barrier).
const SENDERS: usize = 8;

/// How a vanished client closes its connection.
#[derive(Debug, Clone, Copy)]
enum Close {
    /// `shutdown(Write)` (FIN) and drop.
    Fin,
    /// `SO_LINGER` 0 and drop: the kernel sends RST at once.
    Rst,
    /// Each sender thread sends all its requests, then half-closes and
    /// drops them one per millisecond: the FIN comes 0 to 25 ms after the
    /// request, while it is committed, waits, or has been answered.
    FinSoon,
}

/// The raw HTTP/1.1 request of client `i`: waiting clients (even `i`)
/// ask `wait_seconds=30`; each purpose names the client and whether it
/// waits.
fn raw_request(port: u16, token: &str, capability_id: &str, i: usize) -> Vec<u8> {
    let waits = i.is_multiple_of(2);
    let body = json!({
        "capability_id": capability_id,
        "holder_type": "audit_agent",
        "holder_ref": HW_AGENT,
        "project_id": "proj_device_assistant",
        "purpose": format!("vanished {} {i}", if waits { "wait" } else { "nowait" }),
        "priority": 50,
        "requested_duration_seconds": 600,
        "evidence_required": false,
    })
    .to_string();
    let query = if waits { "?wait_seconds=30" } else { "" };
    format!(
        "POST /api/v1/capability-leases/request{query} HTTP/1.1\r\n\
         Host: 127.0.0.1:{port}\r\n\
         Authorization: Bearer {token}\r\n\
         Content-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn set_linger_zero(s: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket fd and a correctly sized `linger`.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(
        rc,
        0,
        "setsockopt SO_LINGER: {}",
        std::io::Error::last_os_error()
    );
}

/// Open every connection, then send each request and close at once.
fn vanish(port: u16, token: &str, capability_id: &str, close: Close) {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(SENDERS));
    let threads: Vec<_> = (0..SENDERS)
        .map(|t| {
            let barrier = barrier.clone();
            let token = token.to_string();
            let capability_id = capability_id.to_string();
            std::thread::spawn(move || {
                let mine: Vec<(TcpStream, Vec<u8>)> = (t..CLIENTS)
                    .step_by(SENDERS)
                    .map(|i| {
                        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
                        s.set_nodelay(true).expect("nodelay");
                        (s, raw_request(port, &token, &capability_id, i))
                    })
                    .collect();
                barrier.wait();
                let mut sent = Vec::new();
                for (mut s, req) in mine {
                    s.write_all(&req).expect("send the request");
                    match close {
                        Close::Fin => {
                            let _ = s.shutdown(Shutdown::Write);
                        }
                        Close::Rst => set_linger_zero(&s),
                        Close::FinSoon => {
                            sent.push(s);
                            continue;
                        }
                    }
                    drop(s);
                }
                for s in sent {
                    std::thread::sleep(Duration::from_millis(1));
                    let _ = s.shutdown(Shutdown::Write);
                    drop(s);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("sender thread");
    }
}

/// The registry's counters from `/metrics`: answered requests, and
/// given-up requests by stage.
async fn answer_counters(agent: &Agent) -> (u64, BTreeMap<String, u64>) {
    let text = reqwest::get(format!("{}/metrics", agent.base_url))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    let mut answered = 0;
    let mut given_up = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value: u64 = value.parse().unwrap_or(0);
        if name == "benchlink_lease_requests_answered_total" {
            answered += value;
        } else if let Some(labels) = name.strip_prefix("benchlink_lease_requests_given_up_total{") {
            let stage = labels
                .trim_start_matches("stage=\"")
                .trim_end_matches("\"}");
            given_up.insert(stage.to_string(), value);
        }
    }
    (answered, given_up)
}

/// The vanished clients' leases on `capability_id`.
async fn vanished_leases(agent: &Agent, capability_id: &str) -> Vec<Value> {
    let v = agent
        .get_ok(&format!(
            "/api/v1/capability-leases?capability_id={capability_id}&principal={HW_AGENT}&limit=1000"
        ))
        .await
        .expect("list leases");
    v["leases"].as_array().cloned().unwrap_or_default()
}

/// What a scenario left behind.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    /// Leases the engine admitted for the vanished clients.
    admitted: usize,
    released: usize,
    requested: usize,
    granted: usize,
    /// `requested` or `granted` leases of clients that waited.
    waiting_left: usize,
    answered: u64,
    given_up: u64,
    /// Given-up requests by the stage they were in.
    stages: BTreeMap<String, u64>,
}

fn outcome(leases: &[Value], answered: u64, stages: BTreeMap<String, u64>) -> Outcome {
    let count = |s: &str| leases.iter().filter(|l| l["status"] == s).count();
    Outcome {
        admitted: leases.len(),
        released: count("released"),
        requested: count("requested"),
        granted: count("granted"),
        waiting_left: leases
            .iter()
            .filter(|l| l["purpose"].as_str().is_some_and(|p| p.contains(" wait ")))
            .filter(|l| l["status"] == "requested" || l["status"] == "granted")
            .count(),
        answered,
        given_up: stages.values().sum(),
        stages,
    }
}

/// Run one scenario on `capability_id` and check what is left. `busy`:
/// another principal holds the capability throughout.
async fn scenario(lab: &Lab, capability_id: &str, close: Close, busy: bool) {
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    if busy {
        let chief = Agent::new(&lab.base_url, CHIEF_AGENT, &lab.chief_token);
        let _ = status_is(
            chief
                .lease(capability_id, 80, "holds it meanwhile", None, 5)
                .await
                .expect("lease for the other principal"),
            StatusCode::CREATED,
        );
    }
    let (answered_before, given_up_before) = answer_counters(&hw).await;
    let started = std::time::Instant::now();
    let (port, token, cap) = (
        lab.http_port,
        lab.hw_token.clone(),
        capability_id.to_string(),
    );
    tokio::task::spawn_blocking(move || vanish(port, &token, &cap, close))
        .await
        .expect("senders");
    // Settled: every admitted request is answered or given up, and that
    // stays so for half a second.
    let mut last: Option<Outcome> = None;
    let settled = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (a, g) = answer_counters(&hw).await;
        let stages = g
            .iter()
            .map(|(k, n)| (k.clone(), n - given_up_before.get(k).copied().unwrap_or(0)))
            .collect();
        let now = outcome(
            &vanished_leases(&hw, capability_id).await,
            a - answered_before,
            stages,
        );
        let balanced = now.admitted as u64 == now.answered + now.given_up;
        if balanced && last.as_ref() == Some(&now) {
            break now;
        }
        if started.elapsed() > Duration::from_secs(10) {
            panic!("not settled after 10 s ({close:?}, busy: {busy}): {now:?}");
        }
        last = Some(now);
    };
    println!(
        "{capability_id} ({}, {close:?}): {CLIENTS} sent, {} admitted, {} given up {:?}, \
         {} answered; left: {} requested, {} granted ({} of them waiting clients)",
        if busy { "busy" } else { "free" },
        settled.admitted,
        settled.given_up,
        settled.stages,
        settled.answered,
        settled.requested,
        settled.granted,
        settled.waiting_left,
    );
    let o = &settled;
    assert_eq!(
        o.released as u64, o.given_up,
        "every given-up request is released: {o:?}"
    );
    assert_eq!(
        (o.requested + o.granted) as u64,
        o.answered,
        "exactly the answers hyper took are still live: {o:?}"
    );
    assert_eq!(
        o.admitted,
        o.released + o.requested + o.granted,
        "no other status: {o:?}"
    );
    if busy {
        assert_eq!(o.granted, 0, "the other principal holds it: {o:?}");
        assert_eq!(
            o.waiting_left, 0,
            "a waiting request on a busy capability is never answered before its client closed: {o:?}"
        );
    } else {
        assert!(o.granted <= 1, "exclusive: {o:?}");
        assert!(
            o.waiting_left <= o.granted,
            "a waiting client is left only with the grant it got at once: {o:?}"
        );
    }
}

async fn lab() -> Lab {
    Lab::start(LabOptions::default())
        .await
        .expect("start the lab")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_closed_right_after_sending_leave_nothing_behind() {
    let lab = lab().await;
    scenario(&lab, caps::RELAY, Close::Fin, false).await;
    scenario(&lab, caps::PSU, Close::Rst, false).await;
    scenario(&lab, caps::ROBOT, Close::Fin, true).await;
    scenario(&lab, caps::CONSOLE, Close::Rst, true).await;
}

/// The same with clients that close 0 to 25 ms after sending: requests
/// reach the engine and are given up while committed or waiting; the
/// answers hyper wrote before the FIN came (a grant at once, a 202 for a
/// client that did not wait) are the only leases left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_closed_soon_after_sending_leave_only_answered_leases() {
    let lab = lab().await;
    scenario(&lab, caps::RELAY, Close::FinSoon, false).await;
    scenario(&lab, caps::ROBOT, Close::FinSoon, true).await;
}

/// A client that lost its answer sends the request again with the same
/// `Idempotency-Key` and gets the same lease; another principal's request
/// with the same key is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_the_same_idempotency_key_gets_the_same_lease() {
    let lab = lab().await;
    let http = reqwest::Client::new();
    let body = |holder: &str| {
        json!({
            "capability_id": caps::CAMERA,
            "holder_type": "audit_agent",
            "holder_ref": holder,
            "project_id": "proj_device_assistant",
            "purpose": "retry after a lost answer",
            "priority": 50,
            "requested_duration_seconds": 120,
            "evidence_required": false,
        })
    };
    let send = |token: &str, holder: &str, key: &str| {
        http.post(format!("{}/api/v1/capability-leases/request", lab.base_url))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .json(&body(holder))
            .send()
    };
    let first = send(&lab.hw_token, HW_AGENT, "k-7f3a")
        .await
        .expect("first");
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first: Value = first.json().await.expect("json");
    let again = send(&lab.hw_token, HW_AGENT, "k-7f3a")
        .await
        .expect("again");
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(
        again
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    let again: Value = again.json().await.expect("json");
    assert_eq!(again["lease_id"], first["lease_id"]);
    assert_eq!(again["status"], "granted");

    // The chief's request with the same key is a new one: it queues
    // behind the hardware agent's grant.
    let chief = send(&lab.chief_token, CHIEF_AGENT, "k-7f3a")
        .await
        .expect("chief");
    assert_eq!(chief.status(), StatusCode::ACCEPTED);
    let chief: Value = chief.json().await.expect("json");
    assert_ne!(chief["lease_id"], first["lease_id"]);
    assert_eq!(chief["status"], "requested");

    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let mine = hw
        .get_ok(&format!(
            "/api/v1/capability-leases?capability_id={}&principal={HW_AGENT}",
            caps::CAMERA
        ))
        .await
        .expect("list");
    assert_eq!(mine["leases"].as_array().map(Vec::len), Some(1), "{mine}");

    // The same key with another body is refused and requests nothing.
    let mut other = body(HW_AGENT);
    other["priority"] = json!(60);
    let reused = http
        .post(format!("{}/api/v1/capability-leases/request", lab.base_url))
        .bearer_auth(&lab.hw_token)
        .header("Idempotency-Key", "k-7f3a")
        .json(&other)
        .send()
        .await
        .expect("reused");
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let reused: Value = reused.json().await.expect("json");
    assert_eq!(reused["error"]["code"], "idempotency_key_reused");
    let mine = hw
        .get_ok(&format!(
            "/api/v1/capability-leases?capability_id={}&principal={HW_AGENT}",
            caps::CAMERA
        ))
        .await
        .expect("list");
    assert_eq!(mine["leases"].as_array().map(Vec::len), Some(1), "{mine}");
}
