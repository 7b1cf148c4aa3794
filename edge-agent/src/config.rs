//! The bench TOML: which provider this computer is, how to reach the
//! registry, where evidence waits for upload, and what hardware is attached.
//!
//! ```toml
//! [provider]
//! provider_id = "provider-bench-07"
//! node_id = "bench-07"
//!
//! [registry]
//! mqtt_host = "registry.lab.example"
//! base_url = "https://registry.lab.example"
//! token_file = "/etc/benchlink-edge/token"
//!
//! [[capabilities]]
//! id = "psu-main"
//! type = "programmable_power_supply"
//! [capabilities.driver]
//! backend = "korad"
//! port = "/dev/serial/by-id/usb-Nuvoton_USB_Virtual_COM_A02014090305-if00"
//! ```
//!
//! Every table refuses unknown keys. Every error names the key as a path
//! (`capabilities[3].driver.max_voltage_v`) and the line it is on, so a
//! technician reading `config.toml:42: capabilities[3].driver.max_voltage_v:
//! invalid type: string "12", expected f64` knows what to fix. The
//! `[capabilities.driver]` table is passed to the driver's own parser
//! ([`crate::drivers::build`]); its errors are mapped back to lines too.
//!
//! Relative paths are resolved against the directory of the config file.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};
use shared_protocol::artifact::ArtifactType;
use shared_protocol::capability::{CapabilityAction, CapabilityType, LeaseMode};
use shared_protocol::constraints::Constraints;
use shared_protocol::mqtt::DEFAULT_TOPIC_PREFIX;
use shared_protocol::regions;
use shared_protocol::validate::check_id;
use shared_protocol::validate::limits::{
    MAX_CAPABILITIES_PER_BATCH, MAX_EVIDENCE_MODES, MAX_PROVIDER_LABELS, MAX_TAGS,
};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use crate::drivers::sim_device::{self, SimDeviceSettings};
use crate::drivers::{self, Driver, DriverConfigError, DriverSpec};

/// Where the daemon keeps its state when the file does not say:
/// systemd's `StateDirectory=` (`$STATE_DIRECTORY`), else this.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/benchlink-edge";

/// The config file the CLI reads when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/benchlink-edge/edge-agent.toml";

/// Environment variable consulted for the provider token when neither
/// `registry.token` nor `registry.token_file` is set.
pub const TOKEN_ENV: &str = "BENCHLINK_TOKEN";

/// A loaded, checked bench configuration with every default filled in.
#[derive(Clone)]
pub struct EdgeConfig {
    /// The file it came from (used in error messages).
    pub origin: PathBuf,
    /// Scratch space for drivers and the default home of the outbox.
    pub state_dir: PathBuf,
    pub provider: ProviderConfig,
    pub registry: RegistryConfig,
    pub outbox: OutboxConfig,
    /// `[metrics]`: the local Prometheus listener.
    pub metrics: MetricsConfig,
    pub capabilities: Vec<CapabilityConfig>,
    /// `[simulated_device]`: the simulated DUT the `sim` drivers share
    /// (docs/devices.md "Simulated device under test"); `None` when absent.
    pub simulated_device: Option<SimDeviceSettings>,
    /// The TOML text, kept to map driver errors back to lines.
    source: String,
}

impl fmt::Debug for EdgeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EdgeConfig")
            .field("origin", &self.origin)
            .field("state_dir", &self.state_dir)
            .field("provider", &self.provider)
            .field("registry", &self.registry)
            .field("outbox", &self.outbox)
            .field("metrics", &self.metrics)
            .field("capabilities", &self.capabilities)
            .field("simulated_device", &self.simulated_device)
            .finish()
    }
}

/// `[provider]`: who this bench is (docs/install-edge-agent.md).
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
    /// e.g. `provider-bench-07`; also the MQTT client id and user name.
    pub provider_id: String,
    /// e.g. `bench-07`.
    pub node_id: String,
    /// Defaults to the system hostname.
    pub hostname: String,
    /// Defaults to `linux`.
    pub platform: String,
    /// Defaults to `lan`.
    pub network_zone: String,
    pub labels: Vec<String>,
    /// e.g. `team`, `lab`, `person`.
    pub owner_type: Option<String>,
    pub owner_display_name: Option<String>,
}

/// `[registry]`: the control plane (MQTT) and the artifact endpoint (HTTP).
#[derive(Clone, PartialEq)]
pub struct RegistryConfig {
    pub mqtt_host: String,
    /// Defaults to 1883, or 8883 with `mqtt_tls`.
    pub mqtt_port: u16,
    /// MQTT over TLS, the broker's certificate checked against `ca_file`
    /// (else the system's CAs) for `mqtt_host`. Default false.
    pub mqtt_tls: bool,
    /// PEM file of the CA certificates to trust instead of the system's,
    /// for MQTT over TLS and an `https://` `base_url` (absolute; checked
    /// to hold usable certificates).
    pub ca_file: Option<PathBuf>,
    /// Defaults to `benchlink/v1`.
    pub topic_prefix: String,
    /// e.g. `https://registry.lab.example`; artifacts go to
    /// `{base_url}/api/v1/artifacts/{artifact_id}/content`.
    pub base_url: String,
    /// The provider token (MQTT password, HTTP bearer token). Never logged.
    pub token: String,
    /// Where the token came from, for messages.
    pub token_source: TokenSource,
    /// MQTT keep-alive, seconds (default 15). The broker publishes the
    /// `offline` LWT after 1.5 × this without traffic.
    pub mqtt_keep_alive_seconds: u16,
    /// Heartbeat period until the registry's `register_ack` says otherwise,
    /// seconds (default 10).
    pub heartbeat_interval_seconds: u32,
}

impl fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("mqtt_host", &self.mqtt_host)
            .field("mqtt_port", &self.mqtt_port)
            .field("mqtt_tls", &self.mqtt_tls)
            .field("ca_file", &self.ca_file)
            .field("topic_prefix", &self.topic_prefix)
            .field("base_url", &self.base_url)
            .field("token", &"<redacted>")
            .field("token_source", &self.token_source)
            .field("mqtt_keep_alive_seconds", &self.mqtt_keep_alive_seconds)
            .field(
                "heartbeat_interval_seconds",
                &self.heartbeat_interval_seconds,
            )
            .finish()
    }
}

/// Where the provider token was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `registry.token` in the file.
    Inline,
    /// `registry.token_file`.
    File(PathBuf),
    /// The `BENCHLINK_TOKEN` environment variable.
    Env,
}

/// How hard the outbox works to keep evidence across a power cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Every artifact file is fsync'ed before its row is committed, and
    /// SQLite commits with `synchronous=FULL`: evidence survives a power cut.
    #[default]
    Fsync,
    /// Rely on the OS page cache: evidence survives a crash or kill of the
    /// daemon, not a power cut. For high-rate capture on benches on a UPS.
    Os,
}

/// `[outbox]`: where evidence waits until the registry confirmed it.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxConfig {
    /// Artifact files; default `{state_dir}/outbox`.
    pub dir: PathBuf,
    /// SQLite database; default `{state_dir}/outbox.sqlite3`.
    pub db: PathBuf,
    /// Bytes of not-yet-uploaded files allowed on disk (from `disk_budget_mb`
    /// MiB, default 2048). New captures fail once it is used up; nothing is
    /// ever dropped to make room.
    pub disk_budget_bytes: u64,
    pub durability: Durability,
}

/// `[metrics]`: where the daemon serves `GET /metrics` (Prometheus text,
/// docs/install-edge-agent.md "Metrics").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetricsConfig {
    /// From `listen` (e.g. `127.0.0.1:9187`); `None` when the table is
    /// absent, `listen = ""` or `enabled = false`: no listener.
    pub listen: Option<std::net::SocketAddr>,
}

/// One `[[capabilities]]` entry (docs/devices.md, docs/actions.md).
#[derive(Debug, Clone)]
pub struct CapabilityConfig {
    /// `capability_id`, unique in the registry, e.g. `cam-front-01`.
    pub id: String,
    pub capability_type: CapabilityType,
    /// Defaults to the id.
    pub display_name: String,
    /// Defaults to `exclusive`.
    pub lease_mode: LeaseMode,
    /// Defaults to true.
    pub preemptible: bool,
    /// Defaults to false.
    pub safety_locked: bool,
    /// 0..=100.
    pub default_priority: Option<u8>,
    pub tags: Vec<String>,
    pub location_label: Option<String>,
    /// Defaults to what the type produces (camera: image, video_clip, ...).
    pub evidence_modes: Vec<ArtifactType>,
    /// `[capabilities.constraints]`: limits the registry and the edge
    /// enforce on every action (`shared_protocol::constraints`, checked
    /// at load: known keys only, of the capability's type), sent as the
    /// capability's `constraints_json`; empty when not given.
    pub constraints: Map<String, Value>,
    /// `[capabilities.regions.<name>]`: named regions of a camera's or
    /// screen's view (`{"<name>": {"box": [x, y, w, h], "kind": "colour" |
    /// "text"}}`, fractions of the image; checked at load with
    /// `shared_protocol::regions::parse`), sent as the capability's
    /// `metadata_json.regions` so the registry derives evidence from its
    /// images (docs/audit-trail.md "Derived evidence"); empty when not given.
    pub regions: Map<String, Value>,
    /// `[capabilities.driver]`: backend name and its settings.
    pub driver: DriverSpec,
    /// `on_release`: actions the registry runs whenever a lease on it ends
    /// (docs/policy.md "Safe state on release"); sent at registration as
    /// `metadata_json.on_release`. Empty: none.
    pub on_release: Vec<OnReleaseAction>,
}

/// Most `on_release` actions one capability may list.
pub const MAX_ON_RELEASE_ACTIONS: usize = 8;

/// One `on_release = [{ action = "power_off" }, ...]` entry: an action the
/// capability supports and its parameters (docs/actions.md).
#[derive(Debug, Clone, PartialEq)]
pub struct OnReleaseAction {
    pub action: CapabilityAction,
    /// The action's `params` (a TOML table, as JSON); empty when not given.
    pub params: Map<String, Value>,
}

impl OnReleaseAction {
    /// The registration form: `{"action": "power_off", "params": {...}}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({ "action": self.action, "params": self.params })
    }
}

/// One thing wrong in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// 1-based line of the key (or of the table it is missing from).
    pub line: Option<usize>,
    /// Path of the key, e.g. `capabilities[3].driver.max_voltage_v`.
    pub key: String,
    pub message: String,
}

/// Why a config file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// One or more keys are wrong; `Display` prints one
    /// `file:line: key: message` line per issue.
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
    issues
        .iter()
        .map(|i| match i.line {
            Some(line) => format!("{}:{line}: {}: {}", path.display(), i.key, i.message),
            None => format!("{}: {}: {}", path.display(), i.key, i.message),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------
// Raw TOML shapes.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    state_dir: Option<PathBuf>,
    provider: RawProvider,
    registry: RawRegistry,
    #[serde(default)]
    outbox: RawOutbox,
    #[serde(default)]
    metrics: RawMetrics,
    #[serde(default)]
    capabilities: Vec<RawCapability>,
    #[serde(default)]
    simulated_device: Option<toml::Table>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    provider_id: String,
    node_id: String,
    #[serde(default)]
    hostname: Option<String>,
    #[serde(default)]
    platform: Option<String>,
    #[serde(default)]
    network_zone: Option<String>,
    #[serde(default)]
    labels: Vec<String>,
    #[serde(default)]
    owner_type: Option<String>,
    #[serde(default)]
    owner_display_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRegistry {
    mqtt_host: String,
    #[serde(default)]
    mqtt_port: Option<u16>,
    #[serde(default)]
    mqtt_tls: bool,
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default)]
    topic_prefix: Option<String>,
    base_url: String,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    token_file: Option<PathBuf>,
    #[serde(default)]
    mqtt_keep_alive_seconds: Option<u16>,
    #[serde(default)]
    heartbeat_interval_seconds: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOutbox {
    #[serde(default)]
    dir: Option<PathBuf>,
    #[serde(default)]
    db: Option<PathBuf>,
    #[serde(default)]
    disk_budget_mb: Option<u64>,
    #[serde(default)]
    durability: Option<Durability>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    #[serde(default)]
    listen: Option<String>,
    #[serde(default)]
    enabled: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCapability {
    id: String,
    #[serde(rename = "type")]
    capability_type: CapabilityType,
    #[serde(default)]
    display_name: Option<String>,
    #[serde(default)]
    lease_mode: Option<LeaseMode>,
    #[serde(default)]
    preemptible: Option<bool>,
    #[serde(default)]
    safety_locked: Option<bool>,
    #[serde(default)]
    default_priority: Option<i64>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    location_label: Option<String>,
    #[serde(default)]
    evidence_modes: Option<Vec<ArtifactType>>,
    #[serde(default)]
    constraints: Option<toml::Table>,
    #[serde(default)]
    regions: Option<toml::Table>,
    driver: toml::Table,
    #[serde(default)]
    on_release: Vec<RawOnRelease>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOnRelease {
    action: String,
    #[serde(default)]
    params: Option<toml::Table>,
}

/// Evidence a capability type produces when the file does not list its
/// `evidence_modes` (docs/actions.md).
pub fn default_evidence_modes(kind: CapabilityType) -> Vec<ArtifactType> {
    use ArtifactType::*;
    match kind {
        CapabilityType::Camera => vec![Image, VideoClip],
        CapabilityType::Microphone => vec![AudioClip],
        CapabilityType::Speaker => vec![],
        CapabilityType::SerialPort => vec![SerialLog],
        CapabilityType::Relay => vec![],
        CapabilityType::ProgrammablePowerSupply => vec![SensorDump],
        CapabilityType::ThumbRobot => vec![],
        CapabilityType::ScreenCapture => vec![Image, VideoClip, OcrText],
    }
}

impl EdgeConfig {
    /// Read and check `path`. The token falls back to `$BENCHLINK_TOKEN`.
    /// Drivers are not built here: see [`EdgeConfig::build_drivers`].
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let env_token = std::env::var(TOKEN_ENV).ok();
        let env_state_dir = std::env::var_os("STATE_DIRECTORY").map(PathBuf::from);
        Self::parse(&text, path, env_token.as_deref(), env_state_dir.as_deref())
    }

    /// Parse `text` as if read from `origin`. `env_token` stands in for
    /// `$BENCHLINK_TOKEN`, `env_state_dir` for systemd's `$STATE_DIRECTORY`
    /// (the first of a colon-separated list is used).
    pub fn parse(
        text: &str,
        origin: &Path,
        env_token: Option<&str>,
        env_state_dir: Option<&Path>,
    ) -> Result<Self, ConfigError> {
        let invalid = |issues: Vec<ConfigIssue>| ConfigError::Invalid {
            path: origin.to_path_buf(),
            issues,
        };
        let doc = DeTable::parse(text).map_err(|e| {
            invalid(vec![ConfigIssue {
                line: e.span().map(|s| line_at(text, s.start)),
                key: "syntax".into(),
                message: e.message().trim().to_string(),
            }])
        })?;
        let raw: RawConfig = deserialize_raw(text, &doc).map_err(|i| invalid(vec![i]))?;
        let base_dir = origin
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let mut v = Checker {
            doc: &doc,
            text,
            issues: Vec::new(),
        };
        let cfg = resolve(raw, &base_dir, env_token, env_state_dir, &mut v);
        if !v.issues.is_empty() {
            return Err(invalid(v.issues));
        }
        let mut cfg = cfg.ok_or_else(|| invalid(Vec::new()))?;
        cfg.origin = origin.to_path_buf();
        cfg.source = text.to_string();
        Ok(cfg)
    }

    /// Build every capability's driver (settings are parsed and checked;
    /// no device is opened). Errors name `capabilities[i].driver.<key>` and
    /// its line.
    pub fn build_drivers(&self) -> Result<Vec<Box<dyn Driver>>, ConfigError> {
        let doc = DeTable::parse(&self.source).map_err(|e| ConfigError::Invalid {
            path: self.origin.clone(),
            issues: vec![ConfigIssue {
                line: None,
                key: "syntax".into(),
                message: e.message().to_string(),
            }],
        })?;
        // The simulated DUT first: the `sim` drivers built next share it.
        match &self.simulated_device {
            Some(s) => {
                sim_device::install(&self.state_dir, s.clone()).prerender();
            }
            None => sim_device::remove(&self.state_dir),
        }
        let mut issues = Vec::new();
        let mut built = Vec::new();
        for (i, cap) in self.capabilities.iter().enumerate() {
            match drivers::build(&cap.driver) {
                Ok(d) => built.push(d),
                Err(e) => issues.push(driver_issue(&doc, &self.source, i, &e)),
            }
        }
        if issues.is_empty() {
            Ok(built)
        } else {
            Err(ConfigError::Invalid {
                path: self.origin.clone(),
                issues,
            })
        }
    }

    /// The 1-based line of `key` (a path such as `capabilities[2].driver.port`)
    /// in the source, or of its closest enclosing table.
    pub fn line_of(&self, key: &str) -> Option<usize> {
        let doc = DeTable::parse(&self.source).ok()?;
        line_of_path(&doc, &self.source, &parse_key_path(key))
    }
}

/// Deserialize with key paths (serde_path_to_error) and lines (toml spans).
fn deserialize_raw(text: &str, doc: &Spanned<DeTable<'_>>) -> Result<RawConfig, ConfigIssue> {
    let de = toml::Deserializer::from(doc.clone());
    serde_path_to_error::deserialize::<_, RawConfig>(de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let message = inner.message().trim().to_string();
        let mut key = if path == "." { String::new() } else { path };
        // serde names a missing or unknown key in the message, at its
        // parent's path: put the key itself into the path.
        for prefix in ["missing field `", "unknown field `"] {
            if let Some(name) = message
                .strip_prefix(prefix)
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
        }
        let line = inner
            .span()
            .map(|s| line_at(text, s.start))
            .or_else(|| line_of_path(doc, text, &parse_key_path(&key)));
        ConfigIssue {
            line,
            key: if key.is_empty() {
                "(top level)".into()
            } else {
                key
            },
            message,
        }
    })
}

struct Checker<'a, 'i> {
    doc: &'a Spanned<DeTable<'i>>,
    text: &'a str,
    issues: Vec<ConfigIssue>,
}

impl Checker<'_, '_> {
    fn issue(&mut self, key: impl Into<String>, message: impl Into<String>) {
        let key = key.into();
        let line = line_of_path(self.doc, self.text, &parse_key_path(&key));
        self.issues.push(ConfigIssue {
            line,
            key,
            message: message.into(),
        });
    }

    fn id(&mut self, key: &str, value: &str) {
        if let Err(e) = check_id(key, value) {
            self.issue(key, e.message);
        }
    }
}

/// Check `raw`, fill in every default and make paths absolute against
/// `base_dir`. Every problem goes to `v`, in file order.
fn resolve(
    raw: RawConfig,
    base_dir: &Path,
    env_token: Option<&str>,
    env_state_dir: Option<&Path>,
    v: &mut Checker<'_, '_>,
) -> Option<EdgeConfig> {
    let abs = |p: PathBuf| if p.is_absolute() { p } else { base_dir.join(p) };

    let state_dir = match (raw.state_dir, env_state_dir) {
        (Some(p), _) => abs(p),
        (None, Some(env)) => env
            .to_str()
            .and_then(|s| s.split(':').next())
            .map(PathBuf::from)
            .unwrap_or_else(|| env.to_path_buf()),
        (None, None) => PathBuf::from(DEFAULT_STATE_DIR),
    };

    let provider = resolve_provider(raw.provider, v);
    let registry = resolve_registry(raw.registry, &abs, env_token, v);
    let outbox = resolve_outbox(raw.outbox, &abs, &state_dir, v);
    let metrics = resolve_metrics(raw.metrics, v);
    let capabilities = resolve_capabilities(raw.capabilities, &state_dir, v);
    let simulated_device = raw.simulated_device.as_ref().and_then(|t| {
        SimDeviceSettings::parse(&toml_table_to_json(t))
            .map_err(|(key, message)| {
                let key = key.trim_start_matches('.');
                v.issue(format!("simulated_device.{key}"), message)
            })
            .ok()
    });
    Some(EdgeConfig {
        origin: PathBuf::new(),
        state_dir,
        provider,
        registry,
        outbox,
        metrics,
        capabilities,
        simulated_device,
        source: String::new(),
    })
}

/// `[provider]`; the hostname defaults to the system's.
fn resolve_provider(p: RawProvider, v: &mut Checker<'_, '_>) -> ProviderConfig {
    v.id("provider.provider_id", &p.provider_id);
    v.id("provider.node_id", &p.node_id);
    let hostname = match p.hostname {
        Some(h) if h.trim().is_empty() => {
            v.issue("provider.hostname", "must not be empty");
            h
        }
        Some(h) => h,
        None => system_hostname(),
    };
    // The registry refuses a registration over its list limits: say so
    // here, before the daemon starts.
    if p.labels.len() > MAX_PROVIDER_LABELS {
        v.issue(
            "provider.labels",
            format!(
                "has {} entries; at most {MAX_PROVIDER_LABELS} are allowed",
                p.labels.len()
            ),
        );
    }
    ProviderConfig {
        provider_id: p.provider_id,
        node_id: p.node_id,
        hostname,
        platform: p.platform.unwrap_or_else(|| "linux".into()),
        network_zone: p.network_zone.unwrap_or_else(|| "lan".into()),
        labels: p.labels,
        owner_type: p.owner_type,
        owner_display_name: p.owner_display_name,
    }
}

/// `[registry]`.
fn resolve_registry(
    r: RawRegistry,
    abs: &impl Fn(PathBuf) -> PathBuf,
    env_token: Option<&str>,
    v: &mut Checker<'_, '_>,
) -> RegistryConfig {
    if r.mqtt_host.trim().is_empty() {
        v.issue("registry.mqtt_host", "must not be empty");
    }
    let topic_prefix = r
        .topic_prefix
        .unwrap_or_else(|| DEFAULT_TOPIC_PREFIX.to_string());
    if topic_prefix.is_empty()
        || topic_prefix.starts_with('/')
        || topic_prefix.ends_with('/')
        || topic_prefix.contains(['+', '#', '\0'])
    {
        v.issue(
            "registry.topic_prefix",
            format!("`{topic_prefix}` is not a usable MQTT topic prefix (no wildcards, no leading or trailing `/`)"),
        );
    }
    let mut https = false;
    match reqwest::Url::parse(&r.base_url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {
            https = u.scheme() == "https";
        }
        Ok(u) => v.issue(
            "registry.base_url",
            format!(
                "`{}` must be an http:// or https:// URL with a host (got scheme `{}`)",
                r.base_url,
                u.scheme()
            ),
        ),
        Err(e) => v.issue(
            "registry.base_url",
            format!("`{}` is not a URL: {e}", r.base_url),
        ),
    }
    let ca_file = r.ca_file.map(abs);
    if let Some(ca) = &ca_file {
        if !r.mqtt_tls && !https {
            v.issue(
                "registry.ca_file",
                "is set, but neither registry.mqtt_tls = true nor an https:// registry.base_url uses it",
            );
        } else if let Err(e) = crate::tls::read_ca_file(ca) {
            v.issue("registry.ca_file", e);
        }
    }
    let (token, token_source) = resolve_token(r.token, r.token_file, abs, env_token, v);
    let keep_alive = r.mqtt_keep_alive_seconds.unwrap_or(15);
    if !(5..=600).contains(&keep_alive) {
        v.issue(
            "registry.mqtt_keep_alive_seconds",
            format!("{keep_alive} is out of range 5..=600"),
        );
    }
    let heartbeat = r.heartbeat_interval_seconds.unwrap_or(10);
    if !(1..=3600).contains(&heartbeat) {
        v.issue(
            "registry.heartbeat_interval_seconds",
            format!("{heartbeat} is out of range 1..=3600"),
        );
    }
    RegistryConfig {
        mqtt_host: r.mqtt_host,
        mqtt_port: r.mqtt_port.unwrap_or(if r.mqtt_tls { 8883 } else { 1883 }),
        mqtt_tls: r.mqtt_tls,
        ca_file,
        topic_prefix,
        base_url: r.base_url.trim_end_matches('/').to_string(),
        token,
        token_source,
        mqtt_keep_alive_seconds: keep_alive,
        heartbeat_interval_seconds: heartbeat,
    }
}

/// The provider token: `registry.token` or `registry.token_file` (not
/// both), else `$BENCHLINK_TOKEN` (`env_token`).
fn resolve_token(
    token: Option<String>,
    token_file: Option<PathBuf>,
    abs: &impl Fn(PathBuf) -> PathBuf,
    env_token: Option<&str>,
    v: &mut Checker<'_, '_>,
) -> (String, TokenSource) {
    match (token, token_file) {
        (Some(_), Some(_)) => {
            v.issue(
                "registry.token_file",
                "set either registry.token or registry.token_file, not both",
            );
            (String::new(), TokenSource::Inline)
        }
        (Some(t), None) => {
            if t.trim().is_empty() {
                v.issue("registry.token", "must not be empty");
            }
            (t.trim().to_string(), TokenSource::Inline)
        }
        (None, Some(f)) => {
            let f = abs(f);
            match std::fs::read_to_string(&f) {
                Ok(t) if !t.trim().is_empty() => (t.trim().to_string(), TokenSource::File(f)),
                Ok(_) => {
                    v.issue("registry.token_file", format!("{} is empty", f.display()));
                    (String::new(), TokenSource::File(f))
                }
                Err(e) => {
                    v.issue(
                        "registry.token_file",
                        format!("cannot read {}: {e}", f.display()),
                    );
                    (String::new(), TokenSource::File(f))
                }
            }
        }
        (None, None) => match env_token.map(str::trim) {
            Some(t) if !t.is_empty() => (t.to_string(), TokenSource::Env),
            _ => {
                v.issue(
                    "registry.token",
                    format!("no provider token: set registry.token, registry.token_file or the {TOKEN_ENV} environment variable"),
                );
                (String::new(), TokenSource::Env)
            }
        },
    }
}

/// `[outbox]`; at home in `state_dir` unless it says otherwise.
fn resolve_outbox(
    o: RawOutbox,
    abs: &impl Fn(PathBuf) -> PathBuf,
    state_dir: &Path,
    v: &mut Checker<'_, '_>,
) -> OutboxConfig {
    let budget_mb = o.disk_budget_mb.unwrap_or(2048);
    if budget_mb == 0 || budget_mb > 16 * 1024 * 1024 {
        v.issue(
            "outbox.disk_budget_mb",
            format!("{budget_mb} is out of range 1..=16777216 (MiB)"),
        );
    }
    OutboxConfig {
        dir: o.dir.map(abs).unwrap_or_else(|| state_dir.join("outbox")),
        db: o
            .db
            .map(abs)
            .unwrap_or_else(|| state_dir.join("outbox.sqlite3")),
        disk_budget_bytes: budget_mb.saturating_mul(1024 * 1024),
        durability: o.durability.unwrap_or_default(),
    }
}

/// `[metrics]`: `listen` must be an `ip:port` socket address (a host
/// name is refused: the listener binds exactly what is written); `""` or
/// `enabled = false` turns the listener off.
fn resolve_metrics(m: RawMetrics, v: &mut Checker<'_, '_>) -> MetricsConfig {
    let listen = m.listen.as_deref().map(str::trim).unwrap_or("");
    if m.enabled == Some(false) || listen.is_empty() {
        return MetricsConfig::default();
    }
    match listen.parse::<std::net::SocketAddr>() {
        Ok(addr) => MetricsConfig { listen: Some(addr) },
        Err(_) => {
            v.issue(
                "metrics.listen",
                format!(
                    "`{listen}` is not an ip:port address (e.g. \"127.0.0.1:9187\"); \"\" turns the listener off"
                ),
            );
            MetricsConfig::default()
        }
    }
}

/// `[[capabilities]]`: at most a registration's worth, ids unique.
fn resolve_capabilities(
    raw: Vec<RawCapability>,
    state_dir: &Path,
    v: &mut Checker<'_, '_>,
) -> Vec<CapabilityConfig> {
    if raw.len() > MAX_CAPABILITIES_PER_BATCH {
        v.issue(
            "capabilities",
            format!(
                "has {} entries; at most {MAX_CAPABILITIES_PER_BATCH} are registered at once",
                raw.len()
            ),
        );
    }
    let mut seen = HashSet::new();
    let mut capabilities = Vec::with_capacity(raw.len());
    for (i, c) in raw.into_iter().enumerate() {
        capabilities.push(resolve_capability(i, c, state_dir, &mut seen, v));
    }
    capabilities
}

/// `capabilities[i]`, its defaults filled in from its type; `seen` holds
/// the ids before it.
fn resolve_capability(
    i: usize,
    c: RawCapability,
    state_dir: &Path,
    seen: &mut HashSet<String>,
    v: &mut Checker<'_, '_>,
) -> CapabilityConfig {
    let at = |k: &str| format!("capabilities[{i}].{k}");
    v.id(&at("id"), &c.id);
    if !seen.insert(c.id.clone()) {
        v.issue(at("id"), format!("capability id `{}` is used twice", c.id));
    }
    if c.tags.len() > MAX_TAGS {
        v.issue(
            at("tags"),
            format!(
                "has {} entries; at most {MAX_TAGS} are allowed",
                c.tags.len()
            ),
        );
    }
    if let Some(modes) = &c.evidence_modes {
        if modes.len() > MAX_EVIDENCE_MODES {
            v.issue(
                at("evidence_modes"),
                format!(
                    "has {} entries; at most {MAX_EVIDENCE_MODES} are allowed",
                    modes.len()
                ),
            );
        }
    }
    let default_priority = match c.default_priority {
        None => None,
        Some(p) if (0..=100).contains(&p) => Some(p as u8),
        Some(p) => {
            v.issue(
                at("default_priority"),
                format!("{p} is out of range 0..=100"),
            );
            None
        }
    };
    if let Some(name) = &c.display_name {
        if name.trim().is_empty() {
            v.issue(at("display_name"), "must not be empty");
        }
    }
    let backend = match c.driver.get("backend") {
        Some(toml::Value::String(b)) if !b.trim().is_empty() => b.clone(),
        Some(other) => {
            v.issue(
                at("driver.backend"),
                format!("expected a backend name (string), got {}", other.type_str()),
            );
            String::new()
        }
        None => {
            v.issue(
                at("driver.backend"),
                "missing key `backend` (e.g. backend = \"sim\")",
            );
            String::new()
        }
    };
    let constraints = c
        .constraints
        .as_ref()
        .map(toml_table_to_json)
        .unwrap_or_default();
    if let Err(issues) = Constraints::parse_strict(c.capability_type, &constraints) {
        for (key, message) in issues {
            v.issue(at(&format!("constraints.{key}")), message);
        }
    }
    let regions = c
        .regions
        .as_ref()
        .map(toml_table_to_json)
        .unwrap_or_default();
    if !regions.is_empty() {
        if !matches!(
            c.capability_type,
            CapabilityType::Camera | CapabilityType::ScreenCapture
        ) {
            v.issue(
                at("regions"),
                format!(
                    "regions are for camera and screen_capture images, not {}",
                    c.capability_type
                ),
            );
        }
        let mut meta = Map::new();
        meta.insert(regions::METADATA_KEY.into(), Value::Object(regions.clone()));
        if let Err(e) = regions::parse(&meta) {
            let key = e
                .field
                .strip_prefix("metadata_json.")
                .unwrap_or(&e.field)
                .to_string();
            v.issue(at(&key), e.message);
        }
    }
    let on_release = resolve_on_release(i, c.capability_type, &c.on_release, v);
    let mut settings = toml_table_to_json(&c.driver);
    settings.remove("backend");
    let driver = DriverSpec {
        capability_id: c.id.clone(),
        capability_type: c.capability_type,
        backend,
        settings,
        state_dir: state_dir.to_path_buf(),
    };
    CapabilityConfig {
        display_name: c.display_name.unwrap_or_else(|| c.id.clone()),
        id: c.id,
        capability_type: c.capability_type,
        lease_mode: c.lease_mode.unwrap_or(LeaseMode::Exclusive),
        preemptible: c.preemptible.unwrap_or(true),
        safety_locked: c.safety_locked.unwrap_or(false),
        default_priority,
        tags: c.tags,
        location_label: c.location_label,
        evidence_modes: c
            .evidence_modes
            .unwrap_or_else(|| default_evidence_modes(c.capability_type)),
        constraints,
        regions,
        driver,
        on_release,
    }
}

/// `capabilities[i].on_release`: each action must be one of the type's
/// actions; `params`, when given, a table.
fn resolve_on_release(
    i: usize,
    kind: CapabilityType,
    raw: &[RawOnRelease],
    v: &mut Checker<'_, '_>,
) -> Vec<OnReleaseAction> {
    if raw.len() > MAX_ON_RELEASE_ACTIONS {
        v.issue(
            format!("capabilities[{i}].on_release"),
            format!(
                "has {} entries; at most {MAX_ON_RELEASE_ACTIONS} are allowed",
                raw.len()
            ),
        );
    }
    let mut out = Vec::with_capacity(raw.len());
    for (j, r) in raw.iter().enumerate() {
        let key = format!("capabilities[{i}].on_release[{j}].action");
        let supported = || {
            kind.supported_actions()
                .iter()
                .map(|a| a.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match r.action.parse::<CapabilityAction>() {
            Ok(action) if kind.supports(action) => out.push(OnReleaseAction {
                action,
                params: r
                    .params
                    .as_ref()
                    .map(toml_table_to_json)
                    .unwrap_or_default(),
            }),
            Ok(action) => v.issue(
                key,
                format!(
                    "{kind} does not support `{action}`; supported: {}",
                    supported()
                ),
            ),
            Err(_) => v.issue(
                key,
                format!(
                    "unknown action `{}`; {kind} supports: {}",
                    r.action,
                    supported()
                ),
            ),
        }
    }
    out
}

/// A driver build error as a config issue at `capabilities[i].driver.<key>`.
fn driver_issue(
    doc: &Spanned<DeTable<'_>>,
    text: &str,
    index: usize,
    err: &DriverConfigError,
) -> ConfigIssue {
    let (key, message) = match err {
        DriverConfigError::UnknownBackend {
            capability_id,
            kind,
            backend,
            known,
        } => (
            format!("capabilities[{index}].driver.backend"),
            if known.is_empty() {
                format!("capability `{capability_id}`: no backend for {kind} is available in this build (asked for `{backend}`)")
            } else {
                format!("capability `{capability_id}`: unknown backend `{backend}` for {kind}; known: {known}")
            },
        ),
        DriverConfigError::Setting {
            capability_id,
            key,
            message,
        } => {
            let key = key.trim_start_matches('.');
            let path = if key.is_empty() || key == "driver" {
                format!("capabilities[{index}].driver")
            } else {
                format!("capabilities[{index}].driver.{key}")
            };
            (path, format!("capability `{capability_id}`: {message}"))
        }
    };
    let line = line_of_path(doc, text, &parse_key_path(&key));
    ConfigIssue { line, key, message }
}

/// The system hostname (`/proc/sys/kernel/hostname`, else `gethostname`).
pub fn system_hostname() -> String {
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim();
        if !h.is_empty() {
            return h.to_string();
        }
    }
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most
    // that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        if let Ok(s) = std::str::from_utf8(&buf[..end]) {
            if !s.is_empty() {
                return s.to_string();
            }
        }
    }
    "localhost".to_string()
}

/// A TOML table as a JSON object (datetimes become RFC 3339 strings).
pub fn toml_table_to_json(table: &toml::Table) -> Map<String, Value> {
    table
        .iter()
        .map(|(k, v)| (k.clone(), toml_to_json(v)))
        .collect()
}

fn toml_to_json(v: &toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::String(s.clone()),
        toml::Value::Integer(i) => Value::from(*i),
        toml::Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(Value::Number)
            .unwrap_or(Value::Null),
        toml::Value::Boolean(b) => Value::Bool(*b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => Value::Object(toml_table_to_json(t)),
    }
}

// ---------------------------------------------------------------------------
// Key paths and lines.

#[derive(Debug, Clone, PartialEq)]
enum Seg {
    Key(String),
    Index(usize),
}

/// `capabilities[3].driver.max_voltage_v` → [Key, Index, Key, Key].
fn parse_key_path(path: &str) -> Vec<Seg> {
    let mut segs = Vec::new();
    for part in path.split('.') {
        let mut rest = part;
        if let Some(open) = rest.find('[') {
            let name = &rest[..open];
            if !name.is_empty() {
                segs.push(Seg::Key(name.to_string()));
            }
            rest = &rest[open..];
            while let Some(stripped) = rest.strip_prefix('[') {
                let Some(close) = stripped.find(']') else {
                    break;
                };
                if let Ok(i) = stripped[..close].parse() {
                    segs.push(Seg::Index(i));
                }
                rest = &stripped[close + 1..];
            }
        } else if !rest.is_empty() {
            segs.push(Seg::Key(rest.to_string()));
        }
    }
    segs
}

/// The line of the deepest existing element along `path`: the key itself
/// when present, else the closest enclosing table or array element.
fn line_of_path(doc: &Spanned<DeTable<'_>>, text: &str, path: &[Seg]) -> Option<usize> {
    let mut best = None;
    let mut table: Option<&DeTable<'_>> = Some(doc.get_ref());
    let mut array: Option<&[Spanned<DeValue<'_>>]> = None;
    for seg in path {
        let value: &Spanned<DeValue<'_>> = match (seg, table, array) {
            (Seg::Key(k), Some(t), _) => {
                let Some((key, value)) = t.iter().find(|(key, _)| key.get_ref().as_ref() == k)
                else {
                    break;
                };
                best = Some(key.span().start);
                value
            }
            (Seg::Index(i), _, Some(a)) => {
                let Some(value) = a.get(*i) else { break };
                best = Some(value.span().start);
                value
            }
            _ => break,
        };
        table = None;
        array = None;
        match value.get_ref() {
            DeValue::Table(t) => table = Some(t),
            DeValue::Array(a) => array = Some(a),
            _ => {}
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
    fn key_paths_split_into_keys_and_indexes() {
        assert_eq!(
            parse_key_path("capabilities[3].driver.max_voltage_v"),
            vec![
                Seg::Key("capabilities".into()),
                Seg::Index(3),
                Seg::Key("driver".into()),
                Seg::Key("max_voltage_v".into()),
            ]
        );
    }
}
