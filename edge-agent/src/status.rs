//! What `edge-agent status` shows: the running daemon writes a
//! [`DaemonStatus`] to `<state_dir>/status.json` every
//! [`STATUS_PERIOD`] (atomically: a temporary file renamed over it), and
//! the command reads it, with no lease, no token and no curl. See
//! docs/install-edge-agent.md ("Is it working?").

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use shared_protocol::capability::HealthStatus;

/// How often the daemon rewrites the status file.
pub const STATUS_PERIOD: Duration = Duration::from_secs(2);

/// A status file older than this is from a daemon that stopped (or hangs).
pub const STALE_AFTER: Duration = Duration::from_secs(10);

/// The file name under the bench's `state_dir`.
pub const STATUS_FILE: &str = "status.json";

/// Where the daemon of a bench whose `state_dir` is `state_dir` keeps its
/// status.
pub fn status_path(state_dir: &Path) -> PathBuf {
    state_dir.join(STATUS_FILE)
}

/// One snapshot of a running daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DaemonStatus {
    /// When the daemon wrote it (its wall clock).
    pub written_at: DateTime<Utc>,
    pub pid: u32,
    pub version: String,
    pub provider_id: String,
    pub node_id: String,
    pub boot_id: String,
    pub started_at: DateTime<Utc>,
    pub broker: BrokerStatus,
    pub registry: RegistryStatus,
    pub outbox: OutboxStatus,
    pub capabilities: Vec<CapabilityStatus>,
}

/// The MQTT link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerStatus {
    /// `host:port`.
    pub address: String,
    pub connected: bool,
    /// ConnAcks since the daemon started (1 = never reconnected).
    pub connects: u64,
}

/// The registry as the bench sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegistryStatus {
    pub base_url: String,
    /// `online` and `register` were acknowledged on the current connection.
    pub registered: bool,
}

/// Evidence not yet in the registry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OutboxStatus {
    pub pending_artifacts: u64,
    /// Bytes of files awaiting upload.
    pub pending_bytes: u64,
    pub queued_updates: u64,
    pub corrupt_artifacts: u64,
    /// Bytes counted against the disk budget, and the budget.
    pub budget_used_bytes: u64,
    pub budget_bytes: u64,
}

/// One capability's health, and the last problem it had.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapabilityStatus {
    pub capability_id: String,
    pub capability_type: String,
    pub health_status: HealthStatus,
    /// Why it is not healthy (the driver's words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The last time it was not healthy, and why: kept after it recovered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<LastError>,
}

/// A problem seen earlier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastError {
    pub at: DateTime<Utc>,
    pub message: String,
}

/// Remembers each capability's last problem between two snapshots.
#[derive(Debug, Default)]
pub struct ErrorMemory {
    last: BTreeMap<String, LastError>,
}

impl ErrorMemory {
    /// Fills in `last_error` of every capability from what was seen before,
    /// and notes the problems of this snapshot.
    pub fn apply(&mut self, now: DateTime<Utc>, caps: &mut [CapabilityStatus]) {
        for c in caps {
            if c.health_status != HealthStatus::Healthy {
                if let Some(m) = &c.message {
                    let same = self
                        .last
                        .get(&c.capability_id)
                        .is_some_and(|l| &l.message == m);
                    if !same {
                        self.last.insert(
                            c.capability_id.clone(),
                            LastError {
                                at: now,
                                message: m.clone(),
                            },
                        );
                    }
                }
            }
            c.last_error = self.last.get(&c.capability_id).cloned();
        }
    }
}

impl DaemonStatus {
    /// Writes the snapshot to `path` atomically (temporary file, rename).
    ///
    /// Errors: the directory is not writable, or the disk is full.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("json.tmp");
        let body = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, body)?;
        std::fs::rename(&tmp, path)
    }

    /// Reads a snapshot.
    ///
    /// Errors: [`std::io::ErrorKind::NotFound`] when no daemon has written
    /// one; `InvalidData` for a file that is not a status.
    pub fn read(path: &Path) -> std::io::Result<DaemonStatus> {
        let body = std::fs::read(path)?;
        serde_json::from_slice(&body)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    /// How old the snapshot is at `now` (zero if written "later").
    pub fn age(&self, now: DateTime<Utc>) -> Duration {
        (now - self.written_at).to_std().unwrap_or_default()
    }

    /// True when the daemon that wrote it looks alive: the snapshot is
    /// recent and its process exists.
    pub fn is_live(&self, now: DateTime<Utc>) -> bool {
        self.age(now) <= STALE_AFTER && process_exists(self.pid)
    }

    /// Everything that is wrong, one line each (empty: all well).
    pub fn problems(&self, now: DateTime<Utc>) -> Vec<String> {
        let mut out = Vec::new();
        if !self.is_live(now) {
            out.push(format!(
                "the daemon is not running (pid {}, last status {} ago)",
                self.pid,
                human(self.age(now))
            ));
            return out;
        }
        if !self.broker.connected {
            out.push(format!(
                "broker {} unreachable (see the daemon's log for why)",
                self.broker.address
            ));
        } else if !self.registry.registered {
            out.push("connected, not registered yet".into());
        }
        for c in &self.capabilities {
            if c.health_status != HealthStatus::Healthy {
                out.push(format!(
                    "{} {}: {}",
                    c.capability_id,
                    c.health_status,
                    c.message.as_deref().unwrap_or("no reason given")
                ));
            }
        }
        out
    }

    /// The table `edge-agent status` prints.
    pub fn render(&self, now: DateTime<Utc>) -> String {
        let mut out = String::new();
        let live = self.is_live(now);
        let _ = writeln!(
            out,
            "edge-agent {} (provider {}, node {}): {}",
            self.version,
            self.provider_id,
            self.node_id,
            if live {
                format!(
                    "running, pid {}, up {}",
                    self.pid,
                    human((now - self.started_at).to_std().unwrap_or_default())
                )
            } else {
                format!(
                    "NOT RUNNING (pid {}; this status is {} old)",
                    self.pid,
                    human(self.age(now))
                )
            }
        );
        let _ = writeln!(
            out,
            "  broker    {:<28} {}",
            self.broker.address,
            if self.broker.connected {
                format!("connected ({} connects since start)", self.broker.connects)
            } else {
                "unreachable".to_string()
            }
        );
        let _ = writeln!(
            out,
            "  registry  {:<28} {}",
            self.registry.base_url,
            if self.registry.registered {
                "registered"
            } else {
                "not registered"
            }
        );
        let o = &self.outbox;
        let _ = writeln!(
            out,
            "  outbox    {} artifacts ({}) awaiting upload, {} session updates queued, {} corrupt; budget {} of {} used",
            o.pending_artifacts,
            bytes(o.pending_bytes),
            o.queued_updates,
            o.corrupt_artifacts,
            bytes(o.budget_used_bytes),
            bytes(o.budget_bytes)
        );
        let width = self
            .capabilities
            .iter()
            .map(|c| c.capability_id.len())
            .max()
            .unwrap_or(10)
            .max(10);
        let _ = writeln!(
            out,
            "  {:<width$}  {:<26} {:<10} PROBLEM",
            "CAPABILITY", "TYPE", "HEALTH"
        );
        for c in &self.capabilities {
            let problem = match (&c.message, &c.last_error) {
                (Some(m), _) => m.clone(),
                (None, Some(l)) => format!(
                    "last: {} ({} ago)",
                    l.message,
                    human((now - l.at).to_std().unwrap_or_default())
                ),
                (None, None) => String::new(),
            };
            let _ = writeln!(
                out,
                "  {:<width$}  {:<26} {:<10} {problem}",
                c.capability_id,
                c.capability_type,
                c.health_status.to_string()
            );
        }
        out
    }
}

/// True when a process with this id exists (signal 0).
fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// `850 ms`, `12 s`, `5 min`, `3 h`, `2 d`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{} ms", d.as_millis()),
        1..=119 => format!("{s} s"),
        120..=7_199 => format!("{} min", s / 60),
        7_200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// `512 B`, `3.2 KiB`, `1.5 MiB`, `2.0 GiB`.
pub fn bytes(n: u64) -> String {
    const K: f64 = 1024.0;
    let f = n as f64;
    if f < K {
        format!("{n} B")
    } else if f < K * K {
        format!("{:.1} KiB", f / K)
    } else if f < K * K * K {
        format!("{:.1} MiB", f / (K * K))
    } else {
        format!("{:.1} GiB", f / (K * K * K))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(id: &str, health: HealthStatus, message: Option<&str>) -> CapabilityStatus {
        CapabilityStatus {
            capability_id: id.into(),
            capability_type: "relay".into(),
            health_status: health,
            message: message.map(String::from),
            last_error: None,
        }
    }

    #[test]
    fn a_problem_is_remembered_after_the_capability_recovers() {
        let mut memory = ErrorMemory::default();
        let t0 = Utc::now();
        let mut caps = vec![cap("relay-1", HealthStatus::Unhealthy, Some("port gone"))];
        memory.apply(t0, &mut caps);
        assert_eq!(caps[0].last_error.as_ref().unwrap().message, "port gone");
        let mut caps = vec![cap("relay-1", HealthStatus::Healthy, None)];
        memory.apply(t0 + chrono::Duration::seconds(5), &mut caps);
        let last = caps[0].last_error.as_ref().expect("still remembered");
        assert_eq!((last.message.as_str(), last.at), ("port gone", t0));
    }

    #[test]
    fn a_status_from_a_dead_process_says_not_running() {
        let now = Utc::now();
        let s = DaemonStatus {
            written_at: now - chrono::Duration::seconds(60),
            pid: std::process::id(),
            version: "0.1.0".into(),
            provider_id: "p".into(),
            node_id: "n".into(),
            boot_id: "b".into(),
            started_at: now - chrono::Duration::seconds(120),
            broker: BrokerStatus {
                address: "127.0.0.1:1883".into(),
                connected: true,
                connects: 1,
            },
            registry: RegistryStatus {
                base_url: "http://127.0.0.1:8080".into(),
                registered: true,
            },
            outbox: OutboxStatus::default(),
            capabilities: vec![cap("relay-1", HealthStatus::Healthy, None)],
        };
        assert!(!s.is_live(now), "60 s old");
        assert!(s.render(now).contains("NOT RUNNING"));
        assert_eq!(s.problems(now).len(), 1);
        let fresh = DaemonStatus {
            written_at: now,
            ..s
        };
        assert!(fresh.is_live(now));
        assert!(fresh.problems(now).is_empty(), "{:?}", fresh.problems(now));
        assert!(fresh.render(now).contains("running, pid"));
    }

    #[test]
    fn sizes_and_ages_read_as_a_person_would_say_them() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * 1024 * 1024 / 2), "1.5 MiB");
        assert_eq!(human(Duration::from_millis(850)), "850 ms");
        assert_eq!(human(Duration::from_secs(300)), "5 min");
    }
}
