//! `cloud-registry serve` under systemd's notify protocol: READY, watchdog
//! pings while healthy, none while the store's writer is stuck, STOPPING
//! (systemd/cloud-registry.service, `cloud_registry::notify`).

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

fn write_config(dir: &TempDir) -> PathBuf {
    let path = dir.path().join("registry.toml");
    std::fs::write(
        &path,
        format!(
            "[store]\npath = {:?}\n[http]\nlisten = \"127.0.0.1:0\"\n[mqtt]\nlisten = \"127.0.0.1:0\"\n",
            dir.path().join("registry.sqlite3")
        ),
    )
    .unwrap();
    path
}

/// The datagrams a service sends to `$NOTIFY_SOCKET`, as systemd gets them.
struct NotifySocket {
    sock: UnixDatagram,
    messages: Vec<(Instant, String)>,
}

impl NotifySocket {
    fn bind(path: &Path) -> Self {
        let sock = UnixDatagram::bind(path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        Self {
            sock,
            messages: Vec::new(),
        }
    }

    /// Collect until `done` holds on what arrived, or `limit` passes.
    fn collect_until(&mut self, limit: Duration, done: impl Fn(&[(Instant, String)]) -> bool) {
        let until = Instant::now() + limit;
        let mut buf = [0u8; 4096];
        while Instant::now() < until && !done(&self.messages) {
            if let Ok(n) = self.sock.recv(&mut buf) {
                self.messages.push((
                    Instant::now(),
                    String::from_utf8_lossy(&buf[..n]).into_owned(),
                ));
            }
        }
    }

    fn pings_since(&self, t: Instant) -> usize {
        self.messages
            .iter()
            .filter(|(at, m)| *at >= t && m.contains("WATCHDOG=1"))
            .count()
    }

    fn any(&self, needle: &str) -> bool {
        self.messages.iter().any(|(_, m)| m.contains(needle))
    }
}

/// `serve` started as systemd starts a `Type=notify` service with
/// `WatchdogSec=2s`: `$WATCHDOG_PID` is the service's pid (the shell's,
/// which `exec` hands over), pings are due every second.
fn serve(config: &Path, sock: &Path) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg("WATCHDOG_PID=$$ exec \"$0\" serve --config \"$1\"")
        .arg(env!("CARGO_BIN_EXE_cloud-registry"))
        .arg(config)
        .env("NOTIFY_SOCKET", sock)
        .env("WATCHDOG_USEC", "2000000")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_stuck_store_writer_withholds_the_watchdog_ping_until_it_answers() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&dir);
    let sock_path = dir.path().join("notify.sock");
    let mut notify = NotifySocket::bind(&sock_path);
    let mut child = serve(&config, &sock_path);

    let start = Instant::now();
    notify.collect_until(Duration::from_secs(30), |m| {
        m.iter().filter(|(_, s)| s.contains("WATCHDOG=1")).count() >= 2
    });
    assert!(notify.any("READY=1"), "{:?}", notify.messages);
    assert!(
        notify.pings_since(start) >= 2,
        "pings while healthy: {:?}",
        notify.messages
    );

    // Another process takes the store's write lock and keeps it: the
    // registry's writer cannot write, and systemd must hear nothing.
    let other = rusqlite::Connection::open(dir.path().join("registry.sqlite3")).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    // A ping already on its way may still land in the first second.
    std::thread::sleep(Duration::from_millis(1500));
    let locked_at = Instant::now();
    notify.collect_until(Duration::from_secs(5), |_| false);
    assert_eq!(
        notify.pings_since(locked_at),
        0,
        "no watchdog ping while the writer is stuck: {:?}",
        notify.messages
    );
    assert!(
        notify.any("STATUS=unhealthy: the store"),
        "the status line says why: {:?}",
        notify.messages
    );

    // Let go: the pings come back.
    other.execute_batch("ROLLBACK").unwrap();
    let released_at = Instant::now();
    notify.collect_until(Duration::from_secs(10), |m| {
        m.iter()
            .any(|(at, s)| *at >= released_at && s.contains("WATCHDOG=1"))
    });
    assert!(
        notify.pings_since(released_at) >= 1,
        "pings resume: {:?}",
        notify.messages
    );

    // SAFETY: a plain syscall on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    notify.collect_until(Duration::from_secs(15), |m| {
        m.iter().any(|(_, s)| s.contains("STOPPING=1"))
    });
    let until = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("serve did not stop within 15 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(notify.any("STOPPING=1"), "{:?}", notify.messages);
    assert_eq!(status.code(), Some(0));
}
