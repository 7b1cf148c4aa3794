//! The registry on PostgreSQL when the server goes away and comes back
//! (docs/scale.md "When a part fails"): requests meanwhile get a JSON
//! error, never a hang or a crash, and once the server answers again the
//! registry serves from the same store without a restart.
//!
//! A registry cut off long enough for another to take its store's lock
//! writes nothing once it is back (docs/scale.md "One leader per schema").
//! A replica whose event-log signing key is not the leader's refuses to
//! stand by, since it could not take over (docs/scale.md "Replicas").
//!
//! The server's connections run through a socat proxy the test stops and
//! starts; it needs PostgreSQL on 127.0.0.1:5432 (or
//! `BENCHLINK_TEST_POSTGRES_URL`) and socat, and fails under CI=true when
//! either is missing.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use benchlink_testkit::eventually;
use cloud_registry::app::{AppError, Registry};
use common::*;
use reqwest::StatusCode;
use tempfile::TempDir;

/// `socat` forwarding `port` to the PostgreSQL server, in a process group
/// of its own so that stopping it ends every forwarded connection.
struct Proxy(Child);

impl Proxy {
    fn start(port: u16, upstream: &str) -> Option<Self> {
        let spawned = Command::new("socat")
            .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"))
            .arg(format!("TCP:{upstream}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        match spawned {
            Ok(child) => Some(Proxy(child)),
            Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
                panic!("socat is required under CI=true: {e}")
            }
            Err(e) => {
                eprintln!("NOT RUN: socat cannot start: {e}");
                None
            }
        }
    }

    fn stop(&mut self) {
        // SAFETY: signals the process group this test started.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn wait_listening(port: u16) {
    eventually(Duration::from_secs(5), "the proxy listens", || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(drop)
    })
    .await;
}

/// A proxy in front of the PostgreSQL server: (server URL, its
/// `host:port`, the proxy's port, the proxy); `None` when socat cannot
/// start outside CI.
async fn proxied_server() -> Option<(String, String, u16, Proxy)> {
    let url = postgres_url();
    let parsed: postgres::Config = url.parse().expect("a PostgreSQL URL");
    let upstream = match (parsed.get_hosts().first(), parsed.get_ports().first()) {
        (Some(postgres::config::Host::Tcp(h)), Some(p)) => format!("{h}:{p}"),
        _ => "127.0.0.1:5432".into(),
    };
    let port = free_port();
    let proxy = Proxy::start(port, &upstream)?;
    wait_listening(port).await;
    Some((url, upstream, port, proxy))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_fail_cleanly_while_postgres_is_away_and_succeed_once_it_is_back() {
    let Some((url, upstream, port, mut proxy)) = proxied_server().await else {
        return;
    };
    let via_proxy = url.replacen(&upstream, &format!("127.0.0.1:{port}"), 1);
    assert_ne!(via_proxy, url, "the URL names {upstream}");

    let dir = TempDir::new().unwrap();
    let mut cfg = test_config(&dir);
    cfg.store.backend = cloud_registry::config::StoreBackend::Postgres;
    cfg.store.url = Some(via_proxy);
    cfg.store.schema = postgres_schema(&dir);
    let reg = start(cfg).await;
    let api = Api::new(&reg.base_url());
    let admin = reg.admin_token.clone().unwrap();
    register_p1(&api, &admin).await;

    proxy.stop();
    // The registry's sessions are cut: a request now is answered with a
    // JSON error (a write and a read).
    let started = std::time::Instant::now();
    let (status, body) = api.register_provider(&admin, &provider_body("p2")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    assert_eq!(body["error"]["details"]["retryable"], true, "{body}");
    let (status, body) = api.get("/api/v1/capability-providers", Some(&admin)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    let _back = Proxy::start(port, &upstream).unwrap();
    wait_listening(port).await;
    // No restart: the next requests open new sessions and see the store
    // as it was, p2's refused registration not in it.
    let listed = eventually(
        Duration::from_secs(10),
        "providers listed again",
        || async {
            let (status, body) = api.get("/api/v1/capability-providers", Some(&admin)).await;
            (status == StatusCode::OK).then_some(body)
        },
    )
    .await;
    let ids: Vec<&str> = listed["providers"]
        .as_array()
        .or(listed.as_array())
        .expect("a list of providers")
        .iter()
        .filter_map(|p| p["provider_id"].as_str())
        .collect();
    assert_eq!(ids, ["p1"], "{listed}");
    let (status, body) = api.register_provider(&admin, &provider_body("p2")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    reg.shutdown().await;
}

/// Take the advisory lock `key` on a session of its own (another
/// registry, for the store), asking for up to 10 s; hold it until the
/// returned sender is dropped. Answers false when it never got it.
fn hold_lock_elsewhere(url: String, key: i64) -> (bool, std::sync::mpsc::Sender<()>) {
    let (got_tx, got_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let got = loop {
            let got: bool = c
                .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
                .and_then(|r| r.try_get(0))
                .expect("try lock");
            if got || std::time::Instant::now() > deadline {
                break got;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let _ = got_tx.send(got);
        let _ = stop_rx.recv();
    });
    (got_rx.recv().unwrap_or(false), stop_tx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_lost_its_lock_while_cut_off_writes_no_more() {
    let Some((url, upstream, port, mut proxy)) = proxied_server().await else {
        return;
    };
    let via_proxy = url.replacen(&upstream, &format!("127.0.0.1:{port}"), 1);

    let dir = TempDir::new().unwrap();
    let mut cfg = test_config(&dir);
    cfg.store.backend = cloud_registry::config::StoreBackend::Postgres;
    cfg.store.url = Some(via_proxy);
    cfg.store.schema = postgres_schema(&dir);
    let key = cloud_registry::app::schema_lock_key(&cfg.store.schema);
    let reg_schema = cfg.store.schema.clone();
    let reg = start(cfg).await;
    let api = Api::new(&reg.base_url());
    let admin = reg.admin_token.clone().unwrap();
    register_p1(&api, &admin).await;
    // Without [cluster] it still leads the schema: replicas forward to it.
    let (leader_url, leader_schema) = (postgres_url(), reg_schema.clone());
    let recorded: String = tokio::task::spawn_blocking(move || {
        let mut c = postgres::Client::connect(&leader_url, postgres::NoTls).expect("connect");
        c.query_one(
            &format!("SELECT url FROM \"{leader_schema}\".cluster_leader WHERE slot = 'leader'"),
            &[],
        )
        .expect("the leader row")
        .get(0)
    })
    .await
    .unwrap();
    assert_eq!(
        recorded,
        reg.base_url(),
        "the lock holder is the recorded leader"
    );

    // Cut off: the server lets the registry's lock go with its sessions,
    // and another registry takes it.
    proxy.stop();
    let elsewhere = url.clone();
    let (got, _held) = tokio::task::spawn_blocking(move || hold_lock_elsewhere(elsewhere, key))
        .await
        .unwrap();
    assert!(got, "the lock is free once the registry's sessions ended");
    let _back = Proxy::start(port, &upstream).unwrap();
    wait_listening(port).await;
    assert!(!reg.lost_store_lock());

    // Back on the network, the registry's writer finds the lock taken: it
    // writes nothing, says so, and tells serve to stop.
    // (The first statement on a session that was cut may only find out
    // that it was: 503 store_unavailable, then the session reopens.)
    let (status, body) = eventually(Duration::from_secs(10), "the writer reopens", || async {
        let (status, body) = api.register_provider(&admin, &provider_body("p2")).await;
        (body["error"]["code"] != "store_unavailable").then_some((status, body))
    })
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "leader_unavailable", "{body}");
    assert_eq!(body["error"]["details"]["retryable"], true, "{body}");
    assert!(reg.lost_store_lock(), "the registry knows it lost its lock");
    let (status, body) = api.register_provider(&admin, &provider_body("p3")).await;
    assert_eq!(
        body["error"]["code"], "leader_unavailable",
        "{status} {body}"
    );
    let (url, schema) = (postgres_url(), reg_schema);
    let stored: Vec<String> = tokio::task::spawn_blocking(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
        c.query(
            &format!(
                "SELECT provider_id FROM \"{schema}\".capability_providers ORDER BY provider_id"
            ),
            &[],
        )
        .expect("providers")
        .iter()
        .map(|r| r.get(0))
        .collect()
    })
    .await
    .unwrap();
    assert_eq!(stored, ["p1"], "nothing written after the lock was lost");
    reg.shutdown().await;
}

/// A directory for a test's store when PostgreSQL answers (else `None`,
/// a failure under CI=true).
fn postgres_up() -> Option<TempDir> {
    let parsed: postgres::Config = postgres_url().parse().expect("a PostgreSQL URL");
    let addr = match (parsed.get_hosts().first(), parsed.get_ports().first()) {
        (Some(postgres::config::Host::Tcp(h)), Some(p)) => format!("{h}:{p}"),
        _ => "127.0.0.1:5432".into(),
    };
    if !benchlink_testkit::reachable(&addr.replace("localhost", "127.0.0.1")) {
        benchlink_testkit::skip_unless_ci(&format!("PostgreSQL is not reachable at {addr}"));
        return None;
    }
    Some(TempDir::new().unwrap())
}

/// [`test_config`] of `dir` as `[cluster]` replica `id` on PostgreSQL, in
/// the schema of `dir`.
fn replica_config(dir: &TempDir, id: &str) -> cloud_registry::config::Config {
    let mut c = test_config(dir);
    c.store.backend = cloud_registry::config::StoreBackend::Postgres;
    c.store.url = Some(postgres_url());
    c.store.schema = postgres_schema(dir);
    c.cluster.enabled = true;
    c.cluster.replica_id = Some(id.into());
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_without_the_leaders_signing_key_refuses_to_stand_by() {
    let Some(dir) = postgres_up() else {
        return;
    };
    let mut a = replica_config(&dir, "a");
    a.audit_log.checkpoint_interval_seconds = 1;
    let leader = Registry::start_replica(a.clone(), Box::new(|_| {}))
        .await
        .expect("a leads");
    // Events for a to sign a checkpoint of within the second.
    let api = Api::new(&leader.base_url());
    register_p1(&api, leader.admin_token.as_deref().expect("admin token")).await;

    // b on the same schema, from a directory of its own: a key of its own.
    let dir_b = TempDir::new().unwrap();
    let mut b = a.clone();
    b.store.path = dir_b.path().join("registry.sqlite3");
    b.auth.bootstrap_admin_token_file = Some(dir_b.path().join("admin.token"));
    b.cluster.replica_id = Some("b".into());
    let refused = tokio::time::timeout(
        Duration::from_secs(10),
        Registry::start_replica(b.clone(), Box::new(|_| {})),
    )
    .await
    .expect("b stops within a poll of a's first checkpoint, not when a dies");
    let err = match refused {
        Err(e) => e,
        Ok(_) => panic!("b stood by with a key a's checkpoints do not verify with"),
    };
    assert!(matches!(err, AppError::ForeignSigningKey { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("signing_key_file") && text.contains("registry.sqlite3.signing-key"),
        "the error names the setting and b's key file: {text}"
    );

    // With a's key file, b stands by and names a.
    b.audit_log.signing_key_file = Some(a.audit_log.key_path(&a.store.path));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let standby = tokio::spawn(Registry::start_replica(
        b,
        Box::new(move |l| {
            let _ = tx.send(l);
        }),
    ));
    let named = tokio::time::timeout(Duration::from_secs(10), rx)
        .await
        .expect("b stands by within 10 s")
        .expect("b's standby line");
    assert_eq!(named.as_deref(), Some(leader.base_url().as_str()));
    standby.abort();
    leader.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_configured_as_the_leader_says_so_and_stops() {
    let Some(dir) = postgres_up() else {
        return;
    };
    let mut a = replica_config(&dir, "a");
    a.cluster.takeover_poll_ms = 200;
    let leader = Registry::start_replica(a.clone(), Box::new(|_| {}))
        .await
        .expect("a leads");

    // b: a's configuration copied, its port changed, its replica_id not.
    let mut b = a.clone();
    b.auth.bootstrap_admin_token_file = None;
    let t0 = std::time::Instant::now();
    let refused = tokio::time::timeout(
        Duration::from_secs(20),
        Registry::start_replica(b, Box::new(|_| {})),
    )
    .await
    .expect("b stops within 20 s");
    let err = match refused {
        Err(e) => e,
        Ok(_) => panic!("b led while a holds the lock"),
    };
    assert!(matches!(err, AppError::SameAsLeader { .. }), "{err}");
    assert!(
        err.to_string().contains("replica_id and advertise_url"),
        "the error says what to change: {err}"
    );
    assert!(
        t0.elapsed() >= Duration::from_secs(5),
        "not before the row has named it for 5 s"
    );
    leader.shutdown().await;
}
