//! The registry's TOML configuration (`cloud-registry serve --config FILE`).
//!
//! Every key has a default, so an empty file is a working single-machine
//! setup: HTTP on 127.0.0.1:8080, the embedded MQTT broker on
//! 127.0.0.1:18830 (away from a Mosquitto on 1883), SQLite in
//! `cloud-registry.sqlite3`. Unknown keys are refused with an error that
//! names the key and its line; `cloud-registry check-config` and `serve`
//! report every problem found at once (see [`Config::parse`]). `config/cloud-registry.toml` documents every
//! key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::de::{DeString, DeTable, DeValue};
use toml::Spanned;

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// 1-based line of the key (or of the table it belongs to), when the
    /// key is in the file.
    pub line: Option<usize>,
    /// Dotted key, e.g. `leases.preempt_reason_whitelist[2]`; `syntax` for
    /// a TOML syntax error.
    pub key: String,
    pub message: String,
}

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Every problem found: syntax, unknown keys and wrong types (the first
    /// of each table), and values that break a rule. `Display` prints one
    /// `file:line: key: message` line per issue (`file: key: message`
    /// when the key is not in the file).
    #[error("{}", render_issues(path, issues))]
    Invalid {
        path: PathBuf,
        issues: Vec<ConfigIssue>,
    },
}

impl ConfigError {
    /// The issues (empty for a read error).
    pub fn issues(&self) -> &[ConfigIssue] {
        match self {
            ConfigError::Read { .. } => &[],
            ConfigError::Invalid { issues, .. } => issues,
        }
    }
}

fn render_issues(path: &Path, issues: &[ConfigIssue]) -> String {
    let file = if path.as_os_str().is_empty() {
        "config".to_string()
    } else {
        path.display().to_string()
    };
    issues
        .iter()
        .map(|i| match i.line {
            Some(line) => format!("{file}:{line}: {}: {}", i.key, i.message),
            None => format!("{file}: {}: {}", i.key, i.message),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Longest lease the protocol lets a request ask for, seconds (the cap on
/// `requested_duration_seconds` in `shared_protocol::lease`).
pub const PROTOCOL_MAX_LEASE_SECONDS: u32 = 86_400;

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub http: HttpConfig,
    pub store: StoreConfig,
    pub auth: AuthConfig,
    pub mqtt: MqttConfig,
    /// `[leases]`: the lease engine's own settings (seed 001 §5, §6):
    /// `max_duration_seconds`, `default_grace_period_seconds`,
    /// `preempt_reason_whitelist`, `sweep_interval_ms`, `max_queue_len`.
    pub leases: crate::leases::LeaseConfig,
    /// `[sessions]`: actions and artifacts: `artifact_dir`,
    /// `max_artifact_bytes`, `default_timeout_ms`, `result_grace_ms`,
    /// `revoke_grace_ms`, `unbound_upload_ttl_seconds`,
    /// `max_unbound_bytes_per_provider`.
    pub sessions: crate::sessions::SessionsConfig,
    /// `[blobs]`: where artifact bytes are kept: `backend` (`fs`, `s3`),
    /// `bucket`, `endpoint`, `region`, `prefix`, `access_key_id`,
    /// `secret_access_key`, `allow_http` (see
    /// `crate::sessions::BlobsConfig`).
    pub blobs: crate::sessions::BlobsConfig,
    /// `[audit]`: audit-task claiming (see `crate::audit::AuditConfig`).
    pub audit: crate::audit::AuditConfig,
    /// `[agents]`: agent runtime, model and speech gateways, Earth data
    /// sources (see `crate::agents::AgentsConfig`).
    pub agents: crate::agents::AgentsConfig,
    pub heartbeat: HeartbeatConfig,
    pub health: HealthConfig,
    pub log: LogConfig,
    /// `[audit_log]`: the event log's signing key and checkpoints
    /// (`signing_key_file`, `checkpoint_interval_seconds`,
    /// `verify_at_start`, `accept_broken_chain`; see
    /// `crate::events::chain::AuditLogConfig`, docs/audit-trail.md).
    pub audit_log: crate::events::chain::AuditLogConfig,
    /// `[policy]`: the lab's rules (docs/policy.md).
    pub policy: PolicyConfig,
    /// `[derived_evidence]`: what the registry derives from uploaded
    /// artifacts (`enabled`, `ocr_command`, `timeout_seconds`,
    /// `max_concurrent_jobs`, `queue_capacity`, `feeds`; see
    /// `crate::derive::DeriveConfig`, docs/audit-trail.md "Derived
    /// evidence").
    pub derived_evidence: crate::derive::DeriveConfig,
    /// `[cluster]`: one of several replicas on one PostgreSQL schema
    /// (`enabled`, `replica_id`, `advertise_url`, `takeover_poll_ms`,
    /// `forward_connect_timeout_ms`; see `crate::cluster::ClusterConfig`,
    /// docs/scale.md "Replicas").
    pub cluster: crate::cluster::ClusterConfig,
}

/// `[policy]`: the lab's rules on how the bench may be driven
/// (docs/policy.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// `[policy.budgets]`: actuator actions per lease and per principal
    /// (see `crate::budgets::BudgetsConfig`).
    pub budgets: crate::budgets::BudgetsConfig,
    /// `[policy.rate_limit]`: HTTP requests per principal (see
    /// `crate::budgets::RateLimitConfig`).
    pub rate_limit: crate::budgets::RateLimitConfig,
    /// `[policy.roles.<role>]`: lease limits for every principal of a role
    /// (see `crate::policy::principal::LimitsConfig`).
    pub roles: std::collections::BTreeMap<
        shared_protocol::api::Role,
        crate::policy::principal::LimitsConfig,
    >,
    /// `[policy.principals."<name>"]`: one principal's limits, overriding
    /// its role's field by field.
    pub principals: std::collections::BTreeMap<String, crate::policy::principal::LimitsConfig>,
    /// `[policy.queue_aging]`: a waiting request's priority rises with its
    /// age (`priority_per_minute`, `max_boost`; see
    /// `crate::leases::QueueAging`). Absent: no aging.
    pub queue_aging: Option<crate::leases::QueueAging>,
    /// `[policy.health_checks.<capability_type>]`: the check the registry
    /// runs on each capability of that type under a system lease (see
    /// `crate::policy::health_check::HealthCheckConfig`).
    pub health_checks: std::collections::BTreeMap<
        shared_protocol::capability::CapabilityType,
        crate::policy::health_check::HealthCheckConfig,
    >,
}

/// `[http]`: the API listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address to listen on; port 0 picks a free port (printed in the ready
    /// line). Default `127.0.0.1:8080`.
    pub listen: SocketAddr,
    /// Largest accepted request body, bytes; larger bodies get
    /// 413 `body_too_large`. Default 1 MiB.
    pub body_limit_bytes: usize,
    /// Longest wait for a request head (request line and headers), ms,
    /// counted from when the registry starts reading it: on a new
    /// connection from its accept, on a kept-alive one from the end of the
    /// previous response, so it is also the idle keep-alive timeout. A
    /// client that has not sent a whole head by then is disconnected
    /// without an answer. Default 10 000; 100 to 3 600 000.
    pub header_read_timeout_ms: u64,
    /// Longest pause in a request body, ms: a body that sends nothing for
    /// this long while the registry waits for it is refused (JSON bodies:
    /// 408 `body_read_timeout`; artifact uploads: the upload fails as cut
    /// short) and the connection closed. It measures inactivity, not the
    /// whole body: an artifact upload of any length runs as long as bytes
    /// keep coming. Default 30 000; 100 to 3 600 000.
    pub body_read_timeout_ms: u64,
    /// Most HTTP connections served at once. Further connections wait in
    /// the kernel's accept backlog until one closes (a warning is logged
    /// at most once a minute while the cap is reached). Each connection
    /// holds one file descriptor: keep this below the process's
    /// `RLIMIT_NOFILE` (the registry raises its soft limit to the hard one
    /// at start and logs both figures), leaving room for SQLite (a few per
    /// store), the artifact files being written, the embedded broker's
    /// listener and one per MQTT client (every provider), and the Earth
    /// data: when the limit is under `max_connections` + [`FD_RESERVE`],
    /// the registry serves at most limit − [`FD_RESERVE`] connections and
    /// logs a warning saying so. Default 4 096; 1 to 1 000 000.
    pub max_connections: usize,
    /// PEM certificate chain (the server's certificate first) for HTTPS.
    /// With [`HttpConfig::tls_key_file`], the listener serves HTTPS only;
    /// set both or neither. Relative to the config file's directory.
    /// Read at start: a new certificate needs a restart.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
}

/// File descriptors kept free beyond `http.max_connections` for SQLite,
/// artifact files, the broker and the providers' MQTT connections.
pub const FD_RESERVE: u64 = 1024;

/// Largest `http.max_connections`.
const MAX_CONNECTIONS_BOUND: usize = 1_000_000;

/// Bounds of `http.header_read_timeout_ms` and `http.body_read_timeout_ms`, ms.
const HTTP_TIMEOUT_RANGE_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            body_limit_bytes: 1024 * 1024,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            max_connections: 4096,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

/// `[store] backend`: the database engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreBackend {
    /// One SQLite file (`path`), one registry process.
    #[default]
    Sqlite,
    /// A PostgreSQL database (`url`, `schema`).
    Postgres,
}

/// `[store]`: where the registry keeps its state (docs/scale.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `sqlite` (default) or `postgres`.
    pub backend: StoreBackend,
    /// SQLite database file (created with its directory when missing).
    /// A relative path is relative to the directory of the config file
    /// ([`Config::load`]), whatever the working directory. On PostgreSQL
    /// its directory is where the registry keeps its files (the audit-log
    /// signing key).
    pub path: PathBuf,
    /// PostgreSQL only: the connection URL,
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE` (libpq's form;
    /// `?sslmode=` is not supported).
    pub url: Option<String>,
    /// PostgreSQL only: the schema the registry's tables live in (created
    /// when missing). Default `public`.
    pub schema: String,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: StoreBackend::Sqlite,
            path: PathBuf::from("cloud-registry.sqlite3"),
            url: None,
            schema: "public".into(),
        }
    }
}

impl StoreConfig {
    /// How logs and errors name the store: the file, or the URL without
    /// its password and the schema.
    pub fn describe(&self) -> String {
        match (self.backend, &self.url) {
            (StoreBackend::Postgres, Some(url)) => {
                format!("{} (schema {})", crate::db::redact_url(url), self.schema)
            }
            (StoreBackend::Postgres, None) => "postgres (no store.url)".into(),
            (StoreBackend::Sqlite, _) => self.path.display().to_string(),
        }
    }
}

/// `[auth]`: bearer tokens.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// When set, `serve` makes sure this file holds a valid `super_admin`
    /// token for principal `bootstrap-admin`: it reuses the token already in
    /// the file, or creates one and writes it with mode 0600. Lets a demo or
    /// a test get an admin token without a separate `token create` step.
    /// `serve --bootstrap-admin-token-file` overrides it. Relative to the
    /// config file's directory.
    pub bootstrap_admin_token_file: Option<PathBuf>,
}

/// How the registry reaches MQTT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MqttMode {
    /// Run rumqttd inside the registry process (one machine, one lab).
    Embedded,
    /// Connect to an external broker (Mosquitto, EMQX) at `host:port`.
    External,
}

/// `[mqtt]`: the control plane.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttConfig {
    /// `embedded` (default) or `external`.
    pub mode: MqttMode,
    /// Embedded only: where the broker listens. Default `127.0.0.1:18830`;
    /// port 0 picks a free port (printed in the ready line).
    pub listen: SocketAddr,
    /// External only: broker host.
    pub host: String,
    /// External only: broker port.
    pub port: u16,
    /// External only: the registry's MQTT user name (it needs read/write on
    /// `{topic_prefix}/#`, see `config/mosquitto/`).
    pub username: Option<String>,
    /// External only: the registry's MQTT password.
    pub password: Option<String>,
    /// The registry's MQTT client id (and, embedded, its user name).
    pub client_id: String,
    /// Topic prefix; topics are `{topic_prefix}/providers/{provider_id}/{kind}`.
    pub topic_prefix: String,
    /// MQTT keep-alive of the registry's client, seconds.
    pub keep_alive_seconds: u16,
    /// Embedded only: PEM certificate chain of the broker's public
    /// address. With [`MqttConfig::tls_key_file`], the broker accepts
    /// MQTT over TLS only there; set both or neither.
    pub tls_cert_file: Option<PathBuf>,
    /// Embedded only: PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
    /// External only: connect to the broker over TLS (its certificate
    /// checked against [`MqttConfig::ca_file`], else the system's CAs).
    pub tls: bool,
    /// External only, with `tls = true`: PEM file of the CA certificates
    /// to trust instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// Embedded only: most MQTT clients (benches, admins) connected at
    /// once; a client beyond it gets CONNACK 3 (server unavailable) and is
    /// disconnected, so that the file descriptors HTTP and SQLite need
    /// stay free. `None` (default): what the descriptor limit leaves (see
    /// [`gate_client_cap`]); a set value is still lowered to that. 1 to
    /// [`EMBEDDED_BROKER_MAX_CONNECTIONS`].
    pub max_clients: Option<usize>,
}

/// rumqttd's connection limit in the embedded broker (the gate's relayed
/// clients, the registry's own client and the revocation kicks).
pub const EMBEDDED_BROKER_MAX_CONNECTIONS: usize = 10_000;

/// Descriptors one gate client holds in the registry process: its socket
/// to the gate, the gate's socket to rumqttd and rumqttd's end of that.
pub const FDS_PER_GATE_CLIENT: u64 = 3;

/// The most clients the embedded broker's gate admits at once, for a
/// descriptor limit of `nofile` (`RLIMIT_NOFILE` after raising it) and
/// `http_max_connections` HTTP connections: what is left after
/// [`FD_RESERVE`] and HTTP's share (itself capped at `nofile` −
/// [`FD_RESERVE`]), [`FDS_PER_GATE_CLIENT`] each, at most
/// [`EMBEDDED_BROKER_MAX_CONNECTIONS`] − 16 (room for the registry's own
/// connections), at most `configured` when set, at least 1.
pub fn gate_client_cap(
    nofile: u64,
    http_max_connections: usize,
    configured: Option<usize>,
) -> usize {
    let room = nofile.saturating_sub(FD_RESERVE);
    let http = (http_max_connections as u64).min(room);
    let by_fds = (room - http) / FDS_PER_GATE_CLIENT;
    let cap = by_fds.min((EMBEDDED_BROKER_MAX_CONNECTIONS - 16) as u64) as usize;
    configured.map_or(cap, |c| c.min(cap)).max(1)
}

impl Default for MqttConfig {
    fn default() -> Self {
        Self {
            mode: MqttMode::Embedded,
            listen: SocketAddr::from(([127, 0, 0, 1], 18830)),
            host: "127.0.0.1".into(),
            port: 1883,
            username: None,
            password: None,
            client_id: "benchlink-registry".into(),
            topic_prefix: shared_protocol::mqtt::DEFAULT_TOPIC_PREFIX.into(),
            keep_alive_seconds: 10,
            tls_cert_file: None,
            tls_key_file: None,
            tls: false,
            ca_file: None,
            max_clients: None,
        }
    }
}

/// `[heartbeat]`: provider liveness (seed 001 §4.3).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HeartbeatConfig {
    /// Interval providers are told to heartbeat at, seconds. Default 10.
    pub interval_seconds: u32,
    /// A provider is marked offline after this many intervals without a
    /// heartbeat. Default 3.
    pub offline_after_missed: u32,
    /// A provider heard from two instances at once (a copied bench
    /// configuration) stays in conflict until only one of them was heard
    /// for this long, seconds. Default 90; keep it above the edge's
    /// longest wait between takeovers (30 s). See docs/architecture.md
    /// "Twin benches".
    pub conflict_clear_seconds: u32,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        Self {
            interval_seconds: 10,
            offline_after_missed: 3,
            conflict_clear_seconds: 90,
        }
    }
}

impl HeartbeatConfig {
    /// Silence after which a provider counts as offline.
    pub fn offline_after(&self) -> Duration {
        Duration::from_secs(u64::from(self.interval_seconds) * u64::from(self.offline_after_missed))
    }
}

/// `[health]`: the health history.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// At most one `capability_health_snapshots` row per capability per this
    /// many seconds, unless its health or status changed. Default 60.
    pub snapshot_min_interval_seconds: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            snapshot_min_interval_seconds: 60,
        }
    }
}

/// `[log]`: tracing output (stderr; stdout carries only the ready line).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// One JSON object per log line instead of text. Filter with `RUST_LOG`.
    pub json: bool,
}

impl Config {
    /// Read and check the file at `path`.
    ///
    /// Errors: unreadable file, or [`ConfigError::Invalid`] with every
    /// problem found (see [`Config::parse`]).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let dir = path.parent().unwrap_or(Path::new(""));
        Self::parse_in(&text, dir).map_err(|e| match e {
            ConfigError::Invalid { issues, .. } => ConfigError::Invalid {
                path: path.to_path_buf(),
                issues,
            },
            other => other,
        })
    }

    /// Joins the relative file paths of the file (`store.path`,
    /// `auth.bootstrap_admin_token_file`, the TLS files) onto `dir`, the config file's
    /// directory, so that a command run from elsewhere (`token create`
    /// from another directory) opens the same store as `serve`.
    fn resolve_relative_to(&mut self, dir: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() && !dir.as_os_str().is_empty() {
                *p = dir.join(&*p);
            }
        };
        fix(&mut self.store.path);
        if let Some(p) = self.auth.bootstrap_admin_token_file.as_mut() {
            fix(p);
        }
        for p in [
            &mut self.audit_log.signing_key_file,
            &mut self.http.tls_cert_file,
            &mut self.http.tls_key_file,
            &mut self.mqtt.tls_cert_file,
            &mut self.mqtt.tls_key_file,
            &mut self.mqtt.ca_file,
        ]
        .into_iter()
        .flatten()
        {
            fix(p);
        }
    }

    /// Parse and check TOML text (the path in errors is empty).
    ///
    /// Reports as much as it can at once: a syntax error alone (nothing
    /// else can be read), else the first unknown key or wrong type of each
    /// top-level table, and every rule of [`Config::problems`] broken by
    /// the tables that did parse. Each issue names its dotted key and, when
    /// the key is in the text, its line.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        Self::parse_in(text, Path::new(""))
    }

    /// [`Config::parse`] for a file in `dir`: its relative paths are
    /// joined onto `dir` before the rules (which open the TLS files) run.
    fn parse_in(text: &str, dir: &Path) -> Result<Self, ConfigError> {
        let invalid = |issues| ConfigError::Invalid {
            path: PathBuf::new(),
            issues,
        };
        let doc = DeTable::parse(text).map_err(|e| {
            invalid(vec![ConfigIssue {
                line: e.span().map(|s| line_at(text, s.start)),
                key: "syntax".into(),
                message: e.message().trim().to_string(),
            }])
        })?;
        let (mut cfg, mut issues, failed_tables) = match deserialize(text, &doc, doc.clone()) {
            Ok(cfg) => (cfg, Vec::new(), Vec::new()),
            Err(first) => {
                // Key by key, so every bad key shows, not only the first.
                let mut issues = Vec::new();
                let mut failed = Vec::new();
                let good = keep_good(text, &doc, &[], doc.get_ref(), &mut issues, &mut failed);
                if issues.is_empty() {
                    failed.push(first.key.clone());
                    issues.push(first);
                }
                match deserialize(text, &doc, Spanned::new(doc.span(), good)) {
                    Ok(cfg) => (cfg, issues, failed),
                    Err(_) => return Err(invalid(issues)),
                }
            }
        };
        cfg.resolve_relative_to(dir);
        for (key, message) in cfg.problems() {
            // A key that did not parse was checked with its default: only
            // its parse error is worth showing.
            if failed_tables.iter().any(|f| {
                key == *f || key.starts_with(&format!("{f}.")) || key.starts_with(&format!("{f}["))
            }) {
                continue;
            }
            issues.push(ConfigIssue {
                line: line_of_key(&doc, text, &key),
                key,
                message,
            });
        }
        if issues.is_empty() {
            Ok(cfg)
        } else {
            issues.sort_by_key(|i| i.line.unwrap_or(usize::MAX));
            Err(invalid(issues))
        }
    }

    /// Value rules serde cannot express: `Err` with every broken rule.
    pub fn check(&self) -> Result<(), ConfigError> {
        let issues: Vec<ConfigIssue> = self
            .problems()
            .into_iter()
            .map(|(key, message)| ConfigIssue {
                line: None,
                key,
                message,
            })
            .collect();
        if issues.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                path: PathBuf::new(),
                issues,
            })
        }
    }

    /// Every broken value rule as `(dotted key, message)`, in file order.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        let mut bad = |key: &str, message: String| out.push((key.to_string(), message));
        self.http_problems(&mut bad);
        self.mqtt_problems(&mut bad);
        self.lease_problems(&mut bad);
        self.session_problems(&mut bad);
        self.heartbeat_problems(&mut bad);
        if !(1..=86_400).contains(&self.audit_log.checkpoint_interval_seconds) {
            bad(
                "audit_log.checkpoint_interval_seconds",
                "must be 1 to 86400 seconds".into(),
            );
        }
        out.extend(self.policy.budgets.problems());
        out.extend(self.policy.rate_limit.problems());
        let tables = self
            .policy
            .roles
            .iter()
            .map(|(role, l)| (format!("policy.roles.{role}"), l))
            .chain(
                self.policy
                    .principals
                    .iter()
                    .map(|(name, l)| (format!("policy.principals.\"{name}\""), l)),
            );
        for (prefix, l) in tables {
            out.extend(l.problems(&prefix));
            // A policy narrows `[leases]`; a wider value would never apply.
            let max = self.leases.max_duration_seconds;
            if l.max_lease_seconds.is_some_and(|s| s > max) {
                out.push((
                    format!("{prefix}.max_lease_seconds"),
                    format!("must not exceed leases.max_duration_seconds ({max})"),
                ));
            }
            let whitelist = &self.leases.preempt_reason_whitelist;
            for r in l.allowed_preempt_reasons.iter().flatten() {
                if !whitelist.contains(r) {
                    out.push((
                        format!("{prefix}.allowed_preempt_reasons"),
                        format!(
                            "`{r}` is not in leases.preempt_reason_whitelist, so it never applies"
                        ),
                    ));
                }
            }
        }
        if let Some(aging) = &self.policy.queue_aging {
            out.extend(aging.problems());
        }
        out.extend(crate::policy::health_check::problems(
            &self.policy.health_checks,
        ));
        out.extend(self.derived_evidence.problems());
        out.extend(self.blobs.problems());
        self.cluster_problems(&mut |k: &str, m: String| out.push((k.to_string(), m)));
        out
    }

    /// The problems of `[cluster]` (see [`Config::problems`]).
    fn cluster_problems(&self, bad: &mut impl FnMut(&str, String)) {
        let c = &self.cluster;
        if !(50..=10_000).contains(&c.takeover_poll_ms) {
            bad(
                "cluster.takeover_poll_ms",
                "must be from 50 to 10000 (ms)".into(),
            );
        }
        if !(50..=30_000).contains(&c.forward_connect_timeout_ms) {
            bad(
                "cluster.forward_connect_timeout_ms",
                "must be from 50 to 30000 (ms)".into(),
            );
        }
        if let Some(id) = &c.replica_id {
            let ok = (1..=64).contains(&id.len())
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !ok {
                bad(
                    "cluster.replica_id",
                    "must be 1 to 64 of A-Z, a-z, 0-9, '.', '_' and '-'".into(),
                );
            }
        }
        if let Some(u) = &c.advertise_url {
            let ok = reqwest::Url::parse(u).is_ok_and(|p| {
                matches!(p.scheme(), "http" | "https") && p.host().is_some() && p.path() == "/"
            });
            if !ok {
                bad(
                    "cluster.advertise_url",
                    "must be an http:// or https:// URL with a host and no path, like http://10.0.0.5:8080".into(),
                );
            }
        }
        if !c.enabled {
            return;
        }
        if self.store.backend != StoreBackend::Postgres {
            bad(
                "cluster.enabled",
                "replicas share one PostgreSQL store: set [store] backend = \"postgres\"".into(),
            );
        }
        if self.mqtt.mode != MqttMode::External {
            bad(
                "cluster.enabled",
                "replicas share one broker: set [mqtt] mode = \"external\" (each replica's embedded broker would have benches of its own)".into(),
            );
        }
        if c.advertise_url.is_none() && self.http.listen.ip().is_unspecified() {
            bad(
                "cluster.advertise_url",
                format!(
                    "required when [http] listen is {} (a wildcard address): the URL the other replicas reach this one at",
                    self.http.listen
                ),
            );
        }
    }

    /// The problems of `[http]`, `[store]` and `[auth]` (see [`Config::problems`]).
    fn http_problems(&self, bad: &mut impl FnMut(&str, String)) {
        // [http]
        if self.http.body_limit_bytes < 1024 {
            bad("http.body_limit_bytes", "must be at least 1024".into());
        }
        for (key, v) in [
            (
                "http.header_read_timeout_ms",
                self.http.header_read_timeout_ms,
            ),
            ("http.body_read_timeout_ms", self.http.body_read_timeout_ms),
        ] {
            if !HTTP_TIMEOUT_RANGE_MS.contains(&v) {
                bad(
                    key,
                    format!(
                        "must be from {} to {} (ms)",
                        HTTP_TIMEOUT_RANGE_MS.start(),
                        HTTP_TIMEOUT_RANGE_MS.end()
                    ),
                );
            }
        }
        if !(1..=MAX_CONNECTIONS_BOUND).contains(&self.http.max_connections) {
            bad(
                "http.max_connections",
                format!("must be from 1 to {MAX_CONNECTIONS_BOUND}"),
            );
        }
        tls_server_problems(
            bad,
            ("http.tls_cert_file", self.http.tls_cert_file.as_deref()),
            ("http.tls_key_file", self.http.tls_key_file.as_deref()),
            b"http/1.1",
        );
        // [store]
        check_path(bad, "store.path", Some(&self.store.path), PathKind::File);
        match (self.store.backend, self.store.url.as_deref()) {
            (StoreBackend::Postgres, None) => bad(
                "store.url",
                "required with backend = \"postgres\": postgres://USER@HOST:5432/DATABASE".into(),
            ),
            (StoreBackend::Postgres, Some(url)) => {
                if let Err(e) = url.parse::<postgres::Config>() {
                    bad("store.url", format!("not a PostgreSQL URL: {e}"));
                } else if url.contains("sslmode=") {
                    bad("store.url", "sslmode is not supported: connect on a trusted network or through a TLS tunnel".into());
                }
                let schema_ok = !self.store.schema.is_empty()
                    && self.store.schema.len() <= 63
                    && self
                        .store
                        .schema
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
                if !schema_ok {
                    bad("store.schema", "must be 1 to 63 of a-z, 0-9 and _".into());
                }
            }
            (StoreBackend::Sqlite, Some(_)) => bad(
                "store.url",
                "only with backend = \"postgres\" (the SQLite store is store.path)".into(),
            ),
            (StoreBackend::Sqlite, None) => {}
        }
        // [auth]
        check_path(
            bad,
            "auth.bootstrap_admin_token_file",
            self.auth.bootstrap_admin_token_file.as_deref(),
            PathKind::File,
        );
    }

    /// The problems of `[mqtt]` (see [`Config::problems`]).
    fn mqtt_problems(&self, bad: &mut impl FnMut(&str, String)) {
        // [mqtt]
        let m = &self.mqtt;
        if m.mode == MqttMode::Embedded
            && m.listen.port() != 0
            && m.listen.port() == self.http.listen.port()
            && (m.listen.ip() == self.http.listen.ip()
                || m.listen.ip().is_unspecified()
                || self.http.listen.ip().is_unspecified())
        {
            bad(
                "mqtt.listen",
                format!(
                    "port {} is also http.listen's; give the broker its own port",
                    m.listen.port()
                ),
            );
        }
        if m.mode == MqttMode::External && m.host.trim().is_empty() {
            bad(
                "mqtt.host",
                "is required when mqtt.mode = \"external\"".into(),
            );
        }
        if m.mode == MqttMode::External && m.port == 0 {
            bad(
                "mqtt.port",
                "must be 1 to 65535 when mqtt.mode = \"external\"".into(),
            );
        }
        if m.password.is_some() && m.username.is_none() {
            bad(
                "mqtt.username",
                "is required when mqtt.password is set".into(),
            );
        }
        if m.client_id.is_empty() {
            bad("mqtt.client_id", "must not be empty".into());
        }
        let prefix = &m.topic_prefix;
        if prefix.is_empty()
            || prefix.starts_with('/')
            || prefix.ends_with('/')
            || prefix.contains(['+', '#'])
        {
            bad(
                "mqtt.topic_prefix",
                "must be non-empty, without wildcards and without a leading or trailing `/`".into(),
            );
        }
        if m.keep_alive_seconds < 2 {
            bad("mqtt.keep_alive_seconds", "must be at least 2".into());
        }
        self.mqtt_tls_problems(bad);
        match (self.mqtt.max_clients, self.mqtt.mode) {
            (Some(_), MqttMode::External) => bad(
                "mqtt.max_clients",
                "is for mqtt.mode = \"embedded\"; an external broker's limit is configured on the broker".into(),
            ),
            (Some(n), MqttMode::Embedded) if n == 0 || n > EMBEDDED_BROKER_MAX_CONNECTIONS => bad(
                "mqtt.max_clients",
                format!("must be 1 to {EMBEDDED_BROKER_MAX_CONNECTIONS}, got {n}"),
            ),
            _ => {}
        }
    }

    /// The TLS keys of `[mqtt]`: the gate's certificate in embedded mode,
    /// `tls` and `ca_file` in external mode.
    fn mqtt_tls_problems(&self, bad: &mut impl FnMut(&str, String)) {
        let m = &self.mqtt;
        match m.mode {
            MqttMode::Embedded => {
                tls_server_problems(
                    bad,
                    ("mqtt.tls_cert_file", m.tls_cert_file.as_deref()),
                    ("mqtt.tls_key_file", m.tls_key_file.as_deref()),
                    b"",
                );
                if m.tls {
                    bad(
                        "mqtt.tls",
                        "is for mqtt.mode = \"external\"; the embedded broker uses TLS when mqtt.tls_cert_file and mqtt.tls_key_file are set".into(),
                    );
                }
                if m.ca_file.is_some() {
                    bad(
                        "mqtt.ca_file",
                        "is for mqtt.mode = \"external\" with mqtt.tls = true".into(),
                    );
                }
            }
            MqttMode::External => {
                for (key, set) in [
                    ("mqtt.tls_cert_file", m.tls_cert_file.is_some()),
                    ("mqtt.tls_key_file", m.tls_key_file.is_some()),
                ] {
                    if set {
                        bad(
                            key,
                            "is for mqtt.mode = \"embedded\"; an external broker's certificate is configured on the broker".into(),
                        );
                    }
                }
                match (&m.ca_file, m.tls) {
                    (Some(_), false) => bad(
                        "mqtt.ca_file",
                        "is set but mqtt.tls is false; set mqtt.tls = true to use it".into(),
                    ),
                    (Some(ca), true) => {
                        if let Err(e) = crate::tls::client_config(Some(ca)) {
                            bad("mqtt.ca_file", e.to_string());
                        }
                    }
                    (None, _) => {}
                }
            }
        }
    }

    /// The problems of `[leases]` (see [`Config::problems`]).
    fn lease_problems(&self, bad: &mut impl FnMut(&str, String)) {
        // [leases]
        let l = &self.leases;
        if !(1..=PROTOCOL_MAX_LEASE_SECONDS).contains(&l.max_duration_seconds) {
            bad(
                "leases.max_duration_seconds",
                format!(
                    "{} is out of range 1..={PROTOCOL_MAX_LEASE_SECONDS} (no request may ask for more than {PROTOCOL_MAX_LEASE_SECONDS} s)",
                    l.max_duration_seconds
                ),
            );
        }
        if l.default_grace_period_seconds > PROTOCOL_MAX_LEASE_SECONDS {
            bad(
                "leases.default_grace_period_seconds",
                format!(
                    "{} is out of range 0..={PROTOCOL_MAX_LEASE_SECONDS}",
                    l.default_grace_period_seconds
                ),
            );
        }
        for (i, reason) in l.preempt_reason_whitelist.iter().enumerate() {
            let key = format!("leases.preempt_reason_whitelist[{i}]");
            if reason.trim().is_empty() {
                bad(&key, "must not be empty".into());
            } else if reason.trim() != reason {
                bad(&key, format!("`{reason}` has leading or trailing spaces"));
            } else if reason.len() > 128 {
                bad(&key, "must be at most 128 characters".into());
            } else if let Some(j) = l.preempt_reason_whitelist[..i]
                .iter()
                .position(|r| r == reason)
            {
                bad(&key, format!("`{reason}` is already listed at [{j}]"));
            }
        }
        if l.sweep_interval_ms == 0 {
            bad("leases.sweep_interval_ms", "must be at least 1".into());
        }
        if l.max_queue_len == 0 {
            bad("leases.max_queue_len", "must be at least 1".into());
        }
    }

    /// The problems of `[sessions]` and `[audit]` (see [`Config::problems`]).
    fn session_problems(&self, bad: &mut impl FnMut(&str, String)) {
        // [sessions]
        let se = &self.sessions;
        check_path(
            bad,
            "sessions.artifact_dir",
            se.artifact_dir.as_deref(),
            PathKind::Dir,
        );
        if se.max_artifact_bytes == 0 {
            bad("sessions.max_artifact_bytes", "must be at least 1".into());
        }
        if se.default_timeout_ms == 0 {
            bad("sessions.default_timeout_ms", "must be at least 1".into());
        }
        if se.unbound_upload_ttl_seconds == 0 {
            bad(
                "sessions.unbound_upload_ttl_seconds",
                "must be at least 1: bytes uploaded before their metadata need time to be bound"
                    .into(),
            );
        }
        // [audit]
        let mut audit = self.audit.clone();
        let defaults = crate::audit::AuditConfig::default();
        for _ in 0..8 {
            let Err(e) = audit.validate() else { break };
            bad(&format!("audit.{}", e.key), e.message.clone());
            match e.key {
                "visibility_timeout_factor" => {
                    audit.visibility_timeout_factor = defaults.visibility_timeout_factor
                }
                "min_visibility_timeout_seconds" => {
                    audit.min_visibility_timeout_seconds = defaults.min_visibility_timeout_seconds
                }
                "max_attempts" => audit.max_attempts = defaults.max_attempts,
                "sweep_interval_ms" => audit.sweep_interval_ms = defaults.sweep_interval_ms,
                "claim_poll_interval_ms" => {
                    audit.claim_poll_interval_ms = defaults.claim_poll_interval_ms
                }
                _ => break,
            }
        }
        let reasons = &self.audit.preempt_reasons;
        for (name, reason) in [
            ("software", &reasons.software),
            ("hardware", &reasons.hardware),
            ("multimodal", &reasons.multimodal),
            ("chief", &reasons.chief),
        ] {
            if let Some(r) = reason.as_deref().filter(|r| !r.is_empty()) {
                if !self.leases.preempt_reason_whitelist.iter().any(|w| w == r) {
                    bad(
                        &format!("audit.preempt_reasons.{name}"),
                        format!(
                            "`{r}` is not on leases.preempt_reason_whitelist, so these audits could never preempt; add it there or set \"\""
                        ),
                    );
                }
            }
        }
    }

    /// The problems of `[heartbeat]` (see [`Config::problems`]).
    fn heartbeat_problems(&self, bad: &mut impl FnMut(&str, String)) {
        // [heartbeat]
        let h = &self.heartbeat;
        if h.interval_seconds == 0 {
            bad("heartbeat.interval_seconds", "must be at least 1".into());
        } else if h.interval_seconds > 3600 {
            bad(
                "heartbeat.interval_seconds",
                format!("{} is out of range 1..=3600", h.interval_seconds),
            );
        }
        if h.conflict_clear_seconds < 1 {
            bad(
                "heartbeat.conflict_clear_seconds",
                "must be at least 1".into(),
            );
        }
        if h.offline_after_missed < 2 {
            bad(
                "heartbeat.offline_after_missed",
                format!(
                    "must be at least 2: the offline timeout (interval_seconds × this = {} s) must be longer than the heartbeat interval ({} s)",
                    u64::from(h.interval_seconds) * u64::from(h.offline_after_missed),
                    h.interval_seconds
                ),
            );
        }
    }
}

/// What a configured path must be.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PathKind {
    File,
    Dir,
}

/// A configured path must not be empty, and when it exists it must be of
/// the right kind (missing files and directories are created at start).
fn check_path(bad: &mut impl FnMut(&str, String), key: &str, path: Option<&Path>, kind: PathKind) {
    let Some(path) = path else { return };
    if path.as_os_str().is_empty() {
        bad(key, "must not be empty".into());
    } else if kind == PathKind::File && path.is_dir() {
        bad(
            key,
            format!("{} is a directory; give a file's path", path.display()),
        );
    } else if kind == PathKind::Dir && path.exists() && !path.is_dir() {
        bad(key, format!("{} is not a directory", path.display()));
    }
}

/// A certificate and key pair of a TLS listener: both set or neither, and
/// when set, readable PEM files that go together (`alpn` as the listener
/// offers it).
fn tls_server_problems(
    bad: &mut impl FnMut(&str, String),
    (cert_key, cert): (&str, Option<&Path>),
    (key_key, key): (&str, Option<&Path>),
    alpn: &[u8],
) {
    match (cert, key) {
        (None, None) => {}
        (Some(_), None) => bad(key_key, format!("is required when {cert_key} is set")),
        (None, Some(_)) => bad(cert_key, format!("is required when {key_key} is set")),
        (Some(c), Some(k)) => {
            let alpn: Vec<&[u8]> = if alpn.is_empty() { vec![] } else { vec![alpn] };
            if let Err(e) = crate::tls::server_config(c, k, &alpn) {
                let at = match e {
                    crate::tls::TlsFileError::NoKey { .. } => key_key,
                    crate::tls::TlsFileError::Read { ref path, .. } if Path::new(path) == k => {
                        key_key
                    }
                    _ => cert_key,
                };
                bad(at, e.to_string());
            }
        }
    }
}

/// The top-level tables of the file.
const SECTIONS: &[&str] = &[
    "http",
    "store",
    "auth",
    "mqtt",
    "leases",
    "sessions",
    "audit",
    "agents",
    "heartbeat",
    "health",
    "log",
];

/// A key's path from the top: each enclosing key and its value's span.
type KeyPath<'i> = [(Spanned<DeString<'i>>, std::ops::Range<usize>)];

/// `table` (found at `prefix` in `doc`) without the keys that do not
/// deserialize on their own; each of those is an issue. Tables are looked
/// into, so a bad key deep inside does not hide its good neighbours.
fn keep_good<'i>(
    text: &str,
    doc: &Spanned<DeTable<'i>>,
    prefix: &KeyPath<'i>,
    table: &DeTable<'i>,
    issues: &mut Vec<ConfigIssue>,
    failed: &mut Vec<String>,
) -> DeTable<'i> {
    let mut good = DeTable::new();
    for (k, v) in table {
        if prefix.is_empty()
            && SECTIONS.contains(&k.get_ref().as_ref())
            && !matches!(v.get_ref(), DeValue::Table(_))
        {
            failed.push(k.get_ref().to_string());
            issues.push(ConfigIssue {
                line: Some(line_at(text, k.span().start)),
                key: k.get_ref().to_string(),
                message: format!("must be a table: `[{}]`", k.get_ref()),
            });
            continue;
        }
        let mut one = DeTable::new();
        one.insert(k.clone(), v.clone());
        let Err(issue) = deserialize(text, doc, nest(prefix, one, doc.span())) else {
            good.insert(k.clone(), v.clone());
            continue;
        };
        if let (DeValue::Table(inner), true) = (v.get_ref(), prefix.len() < 4) {
            let before = issues.len();
            let mut path = prefix.to_vec();
            path.push((k.clone(), v.span()));
            let sub = keep_good(text, doc, &path, inner, issues, failed);
            if issues.len() > before {
                good.insert(k.clone(), Spanned::new(v.span(), DeValue::Table(sub)));
                continue;
            }
        }
        failed.push(issue.key.clone());
        issues.push(issue);
    }
    good
}

/// A document holding only `table`, nested under `prefix`.
fn nest<'i>(
    prefix: &KeyPath<'i>,
    table: DeTable<'i>,
    span: std::ops::Range<usize>,
) -> Spanned<DeTable<'i>> {
    let mut t = table;
    for (k, value_span) in prefix.iter().rev() {
        let mut outer = DeTable::new();
        outer.insert(
            k.clone(),
            Spanned::new(value_span.clone(), DeValue::Table(t)),
        );
        t = outer;
    }
    Spanned::new(span, t)
}

/// Deserialize `table` (all or part of `doc`) into a [`Config`]; an error
/// names the dotted key (found from the error's position) and its line.
fn deserialize(
    text: &str,
    doc: &Spanned<DeTable<'_>>,
    table: Spanned<DeTable<'_>>,
) -> Result<Config, ConfigIssue> {
    Config::deserialize(toml::Deserializer::from(table)).map_err(|e| {
        let message = plain_toml_message(e.message().trim());
        let at = e.span().map(|s| s.start);
        let mut key = at.map(|o| key_at(doc.get_ref(), o)).unwrap_or_default();
        // An unknown key's position is the table it is in on some inputs:
        // name the key itself.
        if let Some(name) = message
            .strip_prefix("unknown field `")
            .and_then(|r| r.split('`').next())
        {
            if !key.ends_with(name) {
                key = if key.is_empty() {
                    name.to_string()
                } else {
                    format!("{key}.{name}")
                };
            }
        }
        ConfigIssue {
            line: at.map(|o| line_at(text, o)),
            key: if key.is_empty() {
                "(top level)".into()
            } else {
                key
            },
            message,
        }
    })
}

/// The dotted key whose key or value holds byte `offset` (the deepest
/// one; a table's own span may cover only its header, so every table is
/// searched).
fn key_at(table: &DeTable<'_>, offset: usize) -> String {
    fn search(table: &DeTable<'_>, offset: usize, prefix: &str, best: &mut Option<String>) {
        for (k, v) in table {
            let path = if prefix.is_empty() {
                k.get_ref().to_string()
            } else {
                format!("{prefix}.{}", k.get_ref())
            };
            if k.span().contains(&offset) || v.span().contains(&offset) {
                *best = Some(path.clone());
            }
            search_value(v.get_ref(), offset, &path, best);
        }
    }
    fn search_value(value: &DeValue<'_>, offset: usize, path: &str, best: &mut Option<String>) {
        match value {
            DeValue::Table(t) => search(t, offset, path, best),
            DeValue::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    let item = format!("{path}[{i}]");
                    if v.span().contains(&offset) {
                        *best = Some(item.clone());
                    }
                    search_value(v.get_ref(), offset, &item, best);
                }
            }
            _ => {}
        }
    }
    let mut best = None;
    search(table, offset, "", &mut best);
    best.unwrap_or_default()
}

/// Say TOML where serde says Rust: `expected u16` is `expected an integer
/// from 0 to 65535`, `struct HttpConfig` is `a table`.
fn plain_toml_message(message: &str) -> String {
    let mut out = message.to_string();
    for (from, to) in [
        ("invalid type: map", "invalid type: table"),
        ("invalid type: sequence", "invalid type: array"),
        ("expected a sequence", "expected an array"),
        ("expected a map", "expected a table"),
        ("expected u8", "expected an integer from 0 to 255"),
        ("expected u16", "expected an integer from 0 to 65535"),
        ("expected u32", "expected an integer from 0 to 4294967295"),
        ("expected u64", "expected a non-negative integer"),
        ("expected usize", "expected a non-negative integer"),
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
    ] {
        out = out.replace(from, to);
    }
    if let Some(i) = out.find("expected struct ") {
        let rest = &out[i + "expected struct ".len()..];
        let end = rest
            .find(|c: char| !c.is_alphanumeric() && c != '_')
            .unwrap_or(rest.len());
        out = format!("{}expected a table{}", &out[..i], &rest[end..]);
    }
    out
}

/// The line of `key` (`a.b[2]`) in the text, or of the deepest part of it
/// that is there.
fn line_of_key(doc: &Spanned<DeTable<'_>>, text: &str, key: &str) -> Option<usize> {
    let mut best = None;
    let mut value: Option<&DeValue<'_>> = None;
    for part in key.split('.') {
        let (name, index) = match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        let table = match value {
            None => doc.get_ref(),
            Some(DeValue::Table(t)) => t,
            Some(_) => break,
        };
        let Some((k, v)) = table.iter().find(|(k, _)| k.get_ref().as_ref() == name) else {
            break;
        };
        best = Some(k.span().start);
        value = Some(v.get_ref());
        if let (Some(i), Some(DeValue::Array(a))) = (index, value) {
            let Some(item) = a.get(i) else { break };
            best = Some(item.span().start);
            value = Some(item.get_ref());
        }
    }
    best.map(|offset| line_at(text, offset))
}

/// 1-based line number of byte `offset` in `text`.
fn line_at(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_gives_the_documented_defaults() {
        let cfg = Config::parse("").unwrap();
        assert_eq!(cfg.http.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(cfg.http.body_limit_bytes, 1024 * 1024);
        assert_eq!(cfg.mqtt.mode, MqttMode::Embedded);
        assert_eq!(cfg.mqtt.listen.to_string(), "127.0.0.1:18830");
        assert_eq!(cfg.heartbeat.interval_seconds, 10);
        assert_eq!(cfg.heartbeat.offline_after_missed, 3);
        assert_eq!(cfg.sessions.unbound_upload_ttl_seconds, 604_800);
        assert_eq!(cfg.sessions.max_unbound_bytes_per_provider, 1 << 30);
    }

    #[test]
    fn unbound_bytes_need_a_grace_time_and_their_limit_may_be_off() {
        assert_eq!(
            keys("[sessions]\nmax_artifact_bytes = 1024\nunbound_upload_ttl_seconds = 0\n"),
            [(Some(3), "sessions.unbound_upload_ttl_seconds".to_string())]
        );
        let cfg = Config::parse(
            "[sessions]\nunbound_upload_ttl_seconds = 1\nmax_unbound_bytes_per_provider = 0\n",
        )
        .unwrap();
        assert_eq!(cfg.sessions.unbound_upload_ttl_seconds, 1);
        assert_eq!(cfg.sessions.max_unbound_bytes_per_provider, 0);
    }

    #[test]
    fn an_unknown_key_is_refused_naming_it() {
        let err = Config::parse("[http]\nlisen = \"127.0.0.1:1\"\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("lisen"), "{msg}");
    }

    #[test]
    fn a_bad_value_names_the_dotted_key() {
        let err = Config::parse("[heartbeat]\ninterval_seconds = 0\n").unwrap_err();
        assert!(
            err.to_string().contains("heartbeat.interval_seconds"),
            "{err}"
        );
        let err = Config::parse("[mqtt]\nmode = \"cloud\"\n").unwrap_err();
        assert!(err.to_string().contains("mode"), "{err}");
    }

    #[test]
    fn health_checks_are_checked_by_dotted_key() {
        let cfg = Config::parse(
            "[policy.health_checks.programmable_power_supply]\naction = \"measure_output\"\ninterval_seconds = 60\n",
        )
        .unwrap();
        let c = &cfg.policy.health_checks
            [&shared_protocol::capability::CapabilityType::ProgrammablePowerSupply];
        assert_eq!(c.timeout_seconds, 30);
        assert!(c.params.is_empty());
        let err = Config::parse(
            "[policy.health_checks.camera]\naction = \"measure_output\"\ninterval_seconds = 0\n\
             after_failed_sessions = 0\ntimeout_seconds = 0\n\
             [policy.health_checks.relay]\naction = \"switch_on\"\n",
        )
        .unwrap_err();
        let keys: Vec<String> = err.issues().iter().map(|i| i.key.clone()).collect();
        for want in [
            "policy.health_checks.camera.action",
            "policy.health_checks.camera.interval_seconds",
            "policy.health_checks.camera.after_failed_sessions",
            "policy.health_checks.camera.timeout_seconds",
            "policy.health_checks.relay",
        ] {
            assert!(keys.iter().any(|k| k == want), "{want} not in {keys:?}");
        }
        let err = Config::parse("[policy.health_checks.toaster]\naction = \"measure_output\"\n")
            .unwrap_err();
        assert!(err.to_string().contains("toaster"), "{err}");
    }

    fn keys(text: &str) -> Vec<(Option<usize>, String)> {
        Config::parse(text)
            .unwrap_err()
            .issues()
            .iter()
            .map(|i| (i.line, i.key.clone()))
            .collect()
    }

    #[test]
    fn every_problem_is_reported_at_once_with_its_line() {
        let text = "\
[http]
body_limit_bytes = 10
colour = true
[mqtt]
mode = \"cloud\"
port = 70000
keep_alive_seconds = 1
[leases]
max_duration_seconds = 90000
preempt_reason_whitelist = [\"safety_stop\", \"\", \"safety_stop\", \"chief_audit\"]
[heartbeat]
offline_after_missed = 1
[audit.preempt_reasons]
hardware = \"not_listed\"
";
        assert_eq!(
            keys(text),
            [
                (Some(2), "http.body_limit_bytes".to_string()),
                (Some(3), "http.colour".into()),
                (Some(5), "mqtt.mode".into()),
                (Some(6), "mqtt.port".into()),
                (Some(7), "mqtt.keep_alive_seconds".into()),
                (Some(9), "leases.max_duration_seconds".into()),
                (Some(10), "leases.preempt_reason_whitelist[1]".into()),
                (Some(10), "leases.preempt_reason_whitelist[2]".into()),
                (Some(12), "heartbeat.offline_after_missed".into()),
                (Some(14), "audit.preempt_reasons.hardware".into()),
            ]
        );
        let msg = Config::parse(text).unwrap_err().to_string();
        assert!(msg.contains("config:6: mqtt.port: invalid value: integer `70000`, expected an integer from 0 to 65535"), "{msg}");
        assert!(!msg.contains("u16"), "{msg}");
    }

    #[test]
    fn a_syntax_error_is_reported_alone_and_a_non_table_section_is_named() {
        assert_eq!(
            keys("[http\nlisten = 1\n"),
            [(Some(1), "syntax".to_string())]
        );
        assert_eq!(
            keys("http = 5\n[[leases]]\nx = 1\n"),
            [(Some(1), "http".to_string()), (Some(2), "leases".into())]
        );
    }

    #[test]
    fn lease_duration_is_capped_by_the_protocol_and_offline_comes_after_a_heartbeat() {
        assert!(Config::parse("[leases]\nmax_duration_seconds = 86400\n").is_ok());
        assert_eq!(
            keys("[leases]\nmax_duration_seconds = 86401\n"),
            [(Some(2), "leases.max_duration_seconds".to_string())]
        );
        assert!(
            Config::parse("[heartbeat]\ninterval_seconds = 5\noffline_after_missed = 2\n").is_ok()
        );
        let mut cfg = Config::default();
        cfg.heartbeat.offline_after_missed = 1;
        cfg.store.path = PathBuf::new();
        let keys: Vec<String> = cfg.problems().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["store.path", "heartbeat.offline_after_missed"]);
    }

    #[test]
    fn a_replica_needs_postgres_an_external_broker_and_a_reachable_url() {
        let pg = "[store]\nbackend = \"postgres\"\nurl = \"postgres://u@127.0.0.1:5432/db\"\n";
        let ext = "[mqtt]\nmode = \"external\"\n";
        let ok = format!("{pg}{ext}[cluster]\nenabled = true\nreplica_id = \"reg-a\"\n");
        assert!(Config::parse(&ok).is_ok());
        let found =
            |text: &str| -> Vec<String> { keys(text).into_iter().map(|(_, k)| k).collect() };
        // On SQLite with the embedded broker: both refused.
        assert_eq!(
            found("[cluster]\nenabled = true\n"),
            ["cluster.enabled", "cluster.enabled"]
        );
        let msg = Config::parse("[cluster]\nenabled = true\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("backend = \"postgres\"") && msg.contains("mode = \"external\""),
            "{msg}"
        );
        // A wildcard listen needs an advertise URL; bad values are named.
        let wild =
            format!("[http]\nlisten = \"0.0.0.0:8080\"\n{pg}{ext}[cluster]\nenabled = true\n");
        assert_eq!(found(&wild), ["cluster.advertise_url"]);
        let bad = format!(
            "{pg}{ext}[cluster]\nenabled = true\nreplica_id = \"a b\"\nadvertise_url = \"ftp://h/x\"\ntakeover_poll_ms = 10\n"
        );
        let mut got = found(&bad);
        got.sort();
        assert_eq!(
            got,
            [
                "cluster.advertise_url",
                "cluster.replica_id",
                "cluster.takeover_poll_ms"
            ]
        );
        // Off, [cluster] changes nothing.
        assert!(Config::parse("[cluster]\nenabled = false\n").is_ok());
    }

    #[test]
    fn a_postgres_store_needs_a_url_and_a_plain_schema_name() {
        let ok = "[store]\nbackend = \"postgres\"\nurl = \"postgres://u@127.0.0.1:5432/db\"\nschema = \"lab_a\"\n";
        assert!(Config::parse(ok).is_ok());
        let missing = "[store]\nbackend = \"postgres\"\n";
        assert_eq!(keys(missing), [(Some(1), "store.url".to_string())]);
        let msg = Config::parse(missing).unwrap_err().to_string();
        assert!(msg.contains("required with backend"), "{msg}");
        let bad = "[store]\nbackend = \"postgres\"\nurl = \"postgres://u@h/db?sslmode=require\"\nschema = \"Lab-A\"\n";
        let found: Vec<String> = keys(bad).into_iter().map(|(_, k)| k).collect();
        assert_eq!(found, ["store.url", "store.schema"]);
        let stray = "[store]\nurl = \"postgres://u@h/db\"\n";
        let msg = Config::parse(stray).unwrap_err().to_string();
        assert!(
            msg.contains("store.url") && msg.contains("only with backend"),
            "{msg}"
        );
        let cfg =
            Config::parse("[store]\nbackend = \"postgres\"\nurl = \"postgres://u:secret@h/db\"\n")
                .unwrap();
        assert_eq!(
            cfg.store.describe(),
            "postgres://u:***@h/db (schema public)"
        );
    }

    #[test]
    fn http_timeouts_and_the_connection_cap_are_bounded() {
        let cfg = Config::parse(
            "[http]\nheader_read_timeout_ms = 2000\nbody_read_timeout_ms = 100\nmax_connections = 1\n",
        )
        .unwrap();
        assert_eq!(cfg.http.header_read_timeout_ms, 2000);
        assert_eq!(cfg.http.max_connections, 1);
        assert_eq!(
            keys("[http]\nheader_read_timeout_ms = 99\nbody_read_timeout_ms = 3600001\nmax_connections = 0\n"),
            [
                (Some(2), "http.header_read_timeout_ms".to_string()),
                (Some(3), "http.body_read_timeout_ms".into()),
                (Some(4), "http.max_connections".into()),
            ]
        );
    }

    #[test]
    fn the_shipped_example_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/cloud-registry.toml");
        Config::load(&path).unwrap();
    }

    #[test]
    fn the_gate_cap_leaves_the_reserve_and_https_share_three_descriptors_per_client() {
        // 20 000 descriptors, 4 096 for HTTP: (20 000 − 1 024 − 4 096) / 3.
        assert_eq!(gate_client_cap(20_000, 4_096, None), 4_960);
        assert_eq!(gate_client_cap(20_000, 4_096, Some(100)), 100);
        assert_eq!(gate_client_cap(20_000, 4_096, Some(9_000)), 4_960);
        // The shipped unit's LimitNOFILE: rumqttd's own limit is reached first.
        assert_eq!(
            gate_client_cap(65_536, 4_096, None),
            EMBEDDED_BROKER_MAX_CONNECTIONS - 16
        );
        // Less than the reserve: still one client.
        assert_eq!(gate_client_cap(512, 4_096, None), 1);
    }

    #[test]
    fn max_clients_is_refused_outside_its_range_and_with_an_external_broker() {
        let mut c = Config::default();
        c.mqtt.max_clients = Some(0);
        assert!(
            c.problems().iter().any(|(k, _)| k == "mqtt.max_clients"),
            "{:?}",
            c.problems()
        );
        c.mqtt.max_clients = Some(10);
        assert!(!c.problems().iter().any(|(k, _)| k == "mqtt.max_clients"));
        c.mqtt.mode = MqttMode::External;
        assert!(c.problems().iter().any(|(k, _)| k == "mqtt.max_clients"));
    }
}
