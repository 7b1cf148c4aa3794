//! Connection hygiene of the registry's HTTP listener, against the real
//! `cloud-registry` binary over real TCP: half-sent request heads neither
//! exhaust its file descriptors nor stall `/healthz`, and are closed by the
//! header-read timeout; a stalled body is refused with 408; the connection
//! cap holds; an event stream outlives every timeout. And the embedded
//! broker's one hygiene message kept at the default log level: a client's
//! packet over the size limit, with its client id.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use benchlink_e2e::bench::child_command;
use benchlink_e2e::{free_port, wait_for, Proc};

/// One `cloud-registry serve` with its own directory and `[http]` lines.
struct Registry {
    proc: Proc,
    addr: SocketAddr,
    mqtt: SocketAddr,
    log: PathBuf,
    admin_token: String,
    _dir: tempfile::TempDir,
}

impl Registry {
    fn start(http_lines: &str) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let port = free_port();
        let config = root.join("cloud-registry.toml");
        std::fs::write(
            &config,
            format!(
                "[http]\nlisten = \"127.0.0.1:{port}\"\n{http_lines}\n\
                 [store]\npath = \"{store}\"\n\n\
                 [auth]\nbootstrap_admin_token_file = \"{admin}\"\n\n\
                 [mqtt]\nmode = \"embedded\"\nlisten = \"127.0.0.1:{mqtt}\"\n",
                store = root.join("registry.sqlite3").display(),
                admin = root.join("admin.token").display(),
                mqtt = free_port(),
            ),
        )
        .unwrap();
        let log = root.join("registry.log");
        let mut cmd = child_command("cloud-registry", &log).unwrap();
        // The default log level, whatever the test's environment says.
        cmd.env_remove("RUST_LOG");
        cmd.args(["serve", "--config"]).arg(&config);
        let (proc, ready) =
            Proc::start_ready("cloud-registry", cmd, Duration::from_secs(30)).unwrap();
        let addr: SocketAddr = ready["http"].as_str().unwrap().parse().unwrap();
        let mqtt: SocketAddr = ready["mqtt"].as_str().unwrap().parse().unwrap();
        let admin_token = std::fs::read_to_string(root.join("admin.token"))
            .unwrap()
            .trim()
            .to_string();
        Registry {
            proc,
            addr,
            mqtt,
            log,
            admin_token,
            _dir: dir,
        }
    }

    /// Open file descriptors of the registry process.
    fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.proc.pid()))
            .expect("/proc/PID/fd of the registry")
            .count()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Raise this process's soft RLIMIT_NOFILE to at least `need` (the
/// registry child inherits it). Fails when the hard limit is lower.
fn raise_nofile(need: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    assert!(
        lim.rlim_max >= need,
        "this test needs RLIMIT_NOFILE of {need}; the hard limit is {}",
        lim.rlim_max
    );
    if lim.rlim_cur < need {
        lim.rlim_cur = need;
        // SAFETY: valid rlimit, soft at most hard.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    }
}

/// Read what the peer sends until it closes or `timeout` passes without
/// a byte. Returns the bytes and whether the peer closed.
fn read_until_close(s: &mut TcpStream, timeout: Duration) -> (Vec<u8>, bool) {
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return (out, true),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return (out, false)
            }
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// `GET /healthz` on a fresh connection; returns the status line and how
/// long the whole answer took (connect to close).
fn healthz(addr: SocketAddr, timeout: Duration) -> (String, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, timeout).expect("connect for /healthz");
    s.set_nodelay(true).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: registry\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (bytes, closed) = read_until_close(&mut s, timeout);
    let took = started.elapsed();
    assert!(closed, "/healthz did not answer within {timeout:?}");
    let text = String::from_utf8_lossy(&bytes);
    (text.lines().next().unwrap_or("").to_string(), took)
}

/// Open `n` connections that each send a request head without its final
/// empty line.
fn half_sent_heads(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let mut s =
                TcpStream::connect(addr).unwrap_or_else(|e| panic!("connection {i} of {n}: {e}"));
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s
        })
        .collect()
}

fn wait_log(reg: &Registry, what: &str, f: impl Fn(&str) -> bool) -> String {
    wait_for(Duration::from_secs(10), what, || {
        let text = reg.log_text();
        text.lines().find(|l| f(l)).map(str::to_string)
    })
    .unwrap_or_else(|e| panic!("{e}; registry log:\n{}", reg.log_text()))
}

#[test]
fn two_thousand_half_sent_heads_leave_healthz_fast_and_are_closed_by_the_header_timeout() {
    const HALF_OPEN: usize = 2000;
    const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
    raise_nofile(HALF_OPEN as u64 + 2048);
    let reg = Registry::start(&format!(
        "header_read_timeout_ms = {}\n",
        HEADER_TIMEOUT.as_millis()
    ));
    let line = wait_log(&reg, "the file-descriptor limit logged", |l| {
        l.contains("RLIMIT_NOFILE") && l.contains("nofile=")
    });
    println!("registry: {line}");
    let baseline = reg.open_fds();

    let opened_at = Instant::now();
    let conns = half_sent_heads(reg.addr, HALF_OPEN);
    println!(
        "{HALF_OPEN} half-sent heads open after {:?}",
        opened_at.elapsed()
    );
    // The registry holds every one of them (it accepted them).
    wait_for(
        Duration::from_secs(8),
        "the registry to accept them all",
        || (reg.open_fds() >= baseline + HALF_OPEN).then_some(()),
    )
    .unwrap();

    let mut times = Vec::new();
    for _ in 0..20 {
        let (status, took) = healthz(reg.addr, Duration::from_secs(5));
        assert_eq!(status, "HTTP/1.1 200 OK");
        times.push(took);
    }
    let held = reg.open_fds();
    let elapsed = opened_at.elapsed();
    times.sort();
    println!(
        "/healthz with {HALF_OPEN} half-open connections: min {:?}, median {:?}, max {:?}; registry fds {held} (baseline {baseline})",
        times[0],
        times[times.len() / 2],
        times[times.len() - 1]
    );
    assert!(
        elapsed < HEADER_TIMEOUT,
        "the measurement ran past the header timeout ({elapsed:?}): the half-open connections may already be closed"
    );
    assert!(
        held >= baseline + HALF_OPEN,
        "the half-open connections were still open during the measurement: fds {held}, baseline {baseline}"
    );
    for t in &times {
        assert!(
            *t < Duration::from_millis(100),
            "/healthz took {t:?} (all: {times:?})"
        );
    }

    // The header-read timeout closes every one of them.
    let closed_by = wait_for(
        HEADER_TIMEOUT + Duration::from_secs(10),
        "the registry's descriptors to come back down",
        || (reg.open_fds() <= baseline + 10).then(|| opened_at.elapsed()),
    )
    .unwrap();
    println!(
        "registry fds back to {} (baseline {baseline}) {closed_by:?} after the first was opened",
        reg.open_fds()
    );
    assert!(
        closed_by >= HEADER_TIMEOUT,
        "closed before the header timeout"
    );
    for (i, mut c) in conns.into_iter().enumerate() {
        let (bytes, closed) = read_until_close(&mut c, Duration::from_secs(2));
        assert!(closed, "connection {i} is still open");
        assert!(
            bytes.is_empty(),
            "connection {i} got an answer to half a head: {}",
            String::from_utf8_lossy(&bytes)
        );
    }
    let (status, _) = healthz(reg.addr, Duration::from_secs(5));
    assert_eq!(status, "HTTP/1.1 200 OK");
}

#[test]
fn connections_beyond_the_cap_wait_until_one_closes() {
    let reg = Registry::start("max_connections = 4\nheader_read_timeout_ms = 60000\n");
    let mut held = half_sent_heads(reg.addr, 4);
    // A fifth connection is taken by the kernel's backlog but not served.
    let mut waiting = TcpStream::connect(reg.addr).unwrap();
    waiting
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: registry\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (bytes, closed) = read_until_close(&mut waiting, Duration::from_millis(1500));
    assert!(
        bytes.is_empty() && !closed,
        "served beyond the cap: {}",
        String::from_utf8_lossy(&bytes)
    );
    wait_log(&reg, "the cap warning", |l| {
        l.contains("WARN") && l.contains("connection cap reached")
    });
    // One slot frees: the waiting request is answered.
    let freed_at = Instant::now();
    drop(held.pop());
    let (bytes, closed) = read_until_close(&mut waiting, Duration::from_secs(5));
    let text = String::from_utf8_lossy(&bytes);
    assert!(closed, "no answer once a slot freed: {text}");
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    println!("answered {:?} after a slot freed", freed_at.elapsed());
}

#[test]
fn a_stalled_body_gets_408_and_an_event_stream_outlives_the_timeouts() {
    let reg = Registry::start("header_read_timeout_ms = 1000\nbody_read_timeout_ms = 1000\n");
    let mut stream = TcpStream::connect(reg.addr).unwrap();
    write!(
        stream,
        "GET /api/v1/capability-events/stream HTTP/1.1\r\nHost: registry\r\n\
         Authorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
        reg.admin_token
    )
    .unwrap();
    let (head, closed) = read_until_close(&mut stream, Duration::from_millis(500));
    let head = String::from_utf8_lossy(&head).to_string();
    assert!(!closed && head.starts_with("HTTP/1.1 200 OK"), "{head}");

    // A body that stops after 10 of its 100 bytes.
    let started = Instant::now();
    let mut post = TcpStream::connect(reg.addr).unwrap();
    write!(
        post,
        "POST /api/v1/capability-providers/register HTTP/1.1\r\nHost: registry\r\n\
         Authorization: Bearer {}\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{\"provide",
        reg.admin_token
    )
    .unwrap();
    let (bytes, _) = read_until_close(&mut post, Duration::from_secs(5));
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"body_read_timeout\""), "{text}");
    assert!(took >= Duration::from_millis(900), "refused after {took:?}");
    println!("stalled body refused after {took:?}");

    // Three header timeouts later the stream is still open: a new event
    // (a provider registering) arrives on it.
    std::thread::sleep(Duration::from_secs(2));
    let body = r#"{"provider_id":"bench-hygiene","node_id":"node-1","hostname":"bench","platform":"linux","gateway_version":"0.1.0","network_zone":"lan"}"#;
    let mut reg_req = TcpStream::connect(reg.addr).unwrap();
    write!(
        reg_req,
        "POST /api/v1/capability-providers/register HTTP/1.1\r\nHost: registry\r\n\
         Authorization: Bearer {}\r\nContent-Type: application/json\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        reg.admin_token,
        body.len()
    )
    .unwrap();
    let (answer, _) = read_until_close(&mut reg_req, Duration::from_secs(5));
    let answer = String::from_utf8_lossy(&answer).to_string();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let (events, closed) = read_until_close(&mut stream, Duration::from_secs(3));
    let events = String::from_utf8_lossy(&events);
    assert!(!closed, "the event stream was closed");
    assert!(
        events.contains("bench-hygiene"),
        "no event on the stream: {events}"
    );
}

#[test]
fn a_packet_over_the_broker_limit_is_logged_with_the_client_id() {
    const CLIENT_ID: &str = "oversized-sender-7";
    let reg = Registry::start("");
    let mut opts = rumqttc::MqttOptions::new(CLIENT_ID, reg.mqtt.ip().to_string(), reg.mqtt.port());
    opts.set_credentials("bootstrap-admin", reg.admin_token.clone());
    opts.set_max_packet_size(64 * 1024, 8 * 1024 * 1024);
    let (client, mut connection) = rumqttc::Client::new(opts, 10);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for ev in connection.iter() {
            let end = ev.is_err();
            if tx.send(format!("{ev:?}")).is_err() || end {
                break;
            }
        }
    });
    let connack = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(connack.contains("ConnAck"), "{connack}");
    // Over the broker's limit: http.body_limit_bytes, 1 MiB by default.
    client
        .publish(
            "benchlink/v1/providers/oversized-sender-7/results",
            rumqttc::QoS::AtLeastOnce,
            false,
            vec![b'x'; 1024 * 1024 + 100],
        )
        .unwrap();
    let line = wait_log(&reg, "the oversized packet's warning", |l| {
        l.contains("WARN") && l.contains("over the size limit")
    });
    println!("{line}");
    assert!(
        line.contains(&format!("client_id=\"{CLIENT_ID}\""))
            || line.contains(&format!("client_id={CLIENT_ID}")),
        "{line}"
    );
    assert!(line.contains("limit_bytes=1048576"), "{line}");
    // The broker closed the sender's connection.
    let closed = wait_for(
        Duration::from_secs(10),
        "the sender to be disconnected",
        || rx.try_iter().find(|e| e.starts_with("Err")),
    )
    .unwrap();
    println!("sender: {closed}");
    // rumqttd's other messages stay out of the log.
    assert!(
        !reg.log_text().contains("rumqttd"),
        "the broker's own log leaked: {}",
        reg.log_text()
    );
}

#[test]
fn a_half_sent_head_does_not_hold_up_the_registrys_stop() {
    let mut reg = Registry::start("header_read_timeout_ms = 60000\n");
    let _held = half_sent_heads(reg.addr, 3);
    let (status, _) = healthz(reg.addr, Duration::from_secs(5));
    assert_eq!(status, "HTTP/1.1 200 OK");
    let started = Instant::now();
    let code = reg.proc.terminate(Duration::from_secs(20));
    let took = started.elapsed();
    println!("stopped {took:?} after SIGTERM with 3 half-sent heads open");
    assert_eq!(code, Some(0), "the registry did not exit by itself");
    // The shutdown drain (5 s) closes them, not the 60 s header timeout.
    assert!(took < Duration::from_secs(9), "stop took {took:?}");
    assert!(
        !reg.log_text().contains("did not finish"),
        "{}",
        reg.log_text()
    );
}
