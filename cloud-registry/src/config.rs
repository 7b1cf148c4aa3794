//! The registry's TOML configuration (`cloud-registry serve --config FILE`).
//!
//! Every key has a default, so an empty file is a working single-machine
//! setup: HTTP on 127.0.0.1:8080, the embedded MQTT broker on
//! 127.0.0.1:18830 (away from a Mosquitto on 1883), SQLite in
//! `cloud-registry.sqlite3`. Unknown keys are refused with an error that
//! names the key and its line. `config/cloud-registry.toml` documents every
//! key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Syntax error, unknown key or wrong type; `message` is toml's, which
    /// names the key and shows the line.
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// Parsed, but a value breaks a rule; `key` is the dotted key.
    #[error("config key `{key}`: {message}")]
    Invalid { key: &'static str, message: String },
}

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
    /// `revoke_grace_ms`.
    pub sessions: crate::sessions::SessionsConfig,
    /// `[audit]`: audit-task claiming (see `crate::audit::AuditConfig`).
    pub audit: crate::audit::AuditConfig,
    /// `[agents]`: agent runtime, model and speech gateways, Earth data
    /// sources (see `crate::agents::AgentsConfig`).
    pub agents: crate::agents::AgentsConfig,
    pub heartbeat: HeartbeatConfig,
    pub health: HealthConfig,
    pub log: LogConfig,
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
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            body_limit_bytes: 1024 * 1024,
        }
    }
}

/// `[store]`: where the registry keeps its state.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// SQLite database file (created with its directory when missing).
    /// A relative path is relative to the working directory.
    pub path: PathBuf,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("cloud-registry.sqlite3"),
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
    /// `serve --bootstrap-admin-token-file` overrides it.
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
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        Self {
            interval_seconds: 10,
            offline_after_missed: 3,
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
    /// Errors: unreadable file, TOML syntax, unknown key or wrong type (the
    /// message names the key and line), or a value out of range.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    /// Parse and check TOML text (the path in errors is empty).
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        cfg.check()?;
        Ok(cfg)
    }

    /// Value rules serde cannot express.
    pub fn check(&self) -> Result<(), ConfigError> {
        let invalid = |key, message: &str| {
            Err(ConfigError::Invalid {
                key,
                message: message.to_string(),
            })
        };
        if self.http.body_limit_bytes < 1024 {
            return invalid("http.body_limit_bytes", "must be at least 1024");
        }
        if self.heartbeat.interval_seconds == 0 {
            return invalid("heartbeat.interval_seconds", "must be at least 1");
        }
        if self.heartbeat.offline_after_missed == 0 {
            return invalid("heartbeat.offline_after_missed", "must be at least 1");
        }
        if self.leases.max_duration_seconds == 0 {
            return invalid("leases.max_duration_seconds", "must be at least 1");
        }
        if self.leases.max_queue_len == 0 {
            return invalid("leases.max_queue_len", "must be at least 1");
        }
        if self.leases.sweep_interval_ms == 0 {
            return invalid("leases.sweep_interval_ms", "must be at least 1");
        }
        if self.sessions.max_artifact_bytes == 0 {
            return invalid("sessions.max_artifact_bytes", "must be at least 1");
        }
        if self.mqtt.keep_alive_seconds < 2 {
            return invalid("mqtt.keep_alive_seconds", "must be at least 2");
        }
        let prefix = &self.mqtt.topic_prefix;
        if prefix.is_empty()
            || prefix.starts_with('/')
            || prefix.ends_with('/')
            || prefix.contains(['+', '#'])
        {
            return invalid(
                "mqtt.topic_prefix",
                "must be non-empty, without wildcards and without a leading or trailing `/`",
            );
        }
        if self.mqtt.client_id.is_empty() {
            return invalid("mqtt.client_id", "must not be empty");
        }
        if self.mqtt.mode == MqttMode::External && self.mqtt.host.is_empty() {
            return invalid("mqtt.host", "is required when mqtt.mode = \"external\"");
        }
        if self.mqtt.mode == MqttMode::External && self.mqtt.port == 0 {
            return invalid("mqtt.port", "must not be 0 when mqtt.mode = \"external\"");
        }
        if self.mqtt.password.is_some() && self.mqtt.username.is_none() {
            return invalid("mqtt.username", "is required when mqtt.password is set");
        }
        Ok(())
    }
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
    fn the_shipped_example_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/cloud-registry.toml");
        Config::load(&path).unwrap();
    }
}
