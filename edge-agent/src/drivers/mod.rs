//! Drivers: one per capability type, behind one trait.
//!
//! The split follows labgrid: the *configuration* says what is attached
//! (data, in the bench TOML); a *kind trait* per capability type says what
//! such a device can do (e.g. a power supply sets a voltage); a *vendor
//! backend* is one small module that speaks one device's wire protocol; and
//! [`Driver`] is the common face the daemon uses for every capability:
//! execute a typed action, report health, say whether an action is
//! non-interruptible.
//!
//! Drivers are blocking: the daemon runs each capability on its own OS
//! thread, so serial, audio and camera I/O never block the async runtime and
//! actions on one capability run one at a time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use shared_protocol::artifact::ArtifactType;
use shared_protocol::capability::{CapabilityAction, CapabilityType, HealthStatus};

/// Cooperative cancellation of a running action (preemption at the end of
/// a grace period, or the holder's stop). Drivers check it between steps;
/// a non-interruptible step finishes before the driver looks.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }
    /// Ask the action to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    /// True once [`CancelToken::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// One action to execute.
#[derive(Debug, Clone)]
pub struct ActionRequest {
    pub session_id: String,
    pub action: CapabilityAction,
    /// Raw parameters; parse them with [`parse_params`].
    pub params: Map<String, Value>,
    /// The driver must return by then ([`DriverError::Timeout`] otherwise).
    pub deadline: Instant,
    pub cancel: CancelToken,
}

/// Evidence a driver produced; the daemon writes it to the outbox (file,
/// sha256, SQLite row) before anything else happens to it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewArtifact {
    pub artifact_type: ArtifactType,
    /// MIME type, e.g. `image/jpeg`, `audio/wav`, `text/plain`.
    pub content_type: String,
    pub bytes: Vec<u8>,
    /// Length of audio/video, milliseconds.
    pub duration_ms: Option<u64>,
    /// e.g. `{"width": 1280, "height": 720}`.
    pub metadata: Map<String, Value>,
}

/// What an action returns: a structured summary (units in the key names,
/// e.g. `voltage_v`, `current_a`) and any evidence.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActionOutcome {
    pub result_summary: Map<String, Value>,
    pub artifacts: Vec<NewArtifact>,
}

/// Health as reported in heartbeats (docs/architecture.md, "Control plane (MQTT)").
#[derive(Debug, Clone, PartialEq)]
pub struct DriverHealth {
    pub status: HealthStatus,
    /// Why, when not healthy (e.g. `serial port /dev/ttyUSB0 vanished`).
    pub message: Option<String>,
}

impl DriverHealth {
    /// Healthy, no message.
    pub fn healthy() -> Self {
        Self {
            status: HealthStatus::Healthy,
            message: None,
        }
    }
    /// Unhealthy because of `why`.
    pub fn unhealthy(why: impl Into<String>) -> Self {
        Self {
            status: HealthStatus::Unhealthy,
            message: Some(why.into()),
        }
    }
}

/// Why an action failed. Each variant maps to a clear session error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DriverError {
    /// The capability type has no such action, or this device lacks it
    /// (e.g. `set_ptz` on a fixed camera).
    #[error("action `{action}` is not supported by this {kind}: {why}")]
    Unsupported {
        action: CapabilityAction,
        kind: CapabilityType,
        why: String,
    },
    /// A parameter is missing, malformed or out of range; nothing was sent
    /// to the device.
    #[error("invalid parameter `{field}`: {message}")]
    InvalidParams { field: String, message: String },
    /// A configured safety limit would be exceeded (e.g. PSU max voltage);
    /// nothing was sent to the device.
    #[error("limit exceeded for `{field}`: {message}")]
    LimitExceeded { field: String, message: String },
    /// The device is absent or not answering.
    #[error("device unavailable: {0}")]
    Unavailable(String),
    /// The device answered wrongly or an I/O call failed.
    #[error("device error: {0}")]
    Device(String),
    /// The action's deadline passed; milliseconds the driver measured
    /// (what it had left when it started, or how long it ran). The session
    /// reports the deadline its command gave instead.
    #[error("timed out after {0} ms")]
    Timeout(u64),
    /// Cancelled (preemption or stop) before it finished.
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// Cancelled (preemption or stop) part way through a capture, with
    /// what was captured until then (`partial`: its summary describes the
    /// part kept, its artifacts are evidence like any other). The runner
    /// keeps the artifacts and reports the session as for
    /// [`DriverError::Cancelled`] with `why`.
    #[error("cancelled: {why}")]
    CancelledPartway {
        why: String,
        partial: Box<ActionOutcome>,
    },
}

/// The face of every capability.
pub trait Driver: Send {
    /// What this capability is.
    fn capability_type(&self) -> CapabilityType;

    /// Actions this device really supports (a subset of the type's, docs/actions.md).
    fn supported_actions(&self) -> Vec<CapabilityAction> {
        self.capability_type().supported_actions().to_vec()
    }

    /// Type metadata for registration, e.g.
    /// `{"port_name": "/dev/ttyUSB0", "baud_rates": [115200]}`.
    fn metadata(&self) -> Map<String, Value> {
        Map::new()
    }

    /// Current health; cheap, called for every heartbeat.
    fn health(&mut self) -> DriverHealth;

    /// True when `action` with `params` must not be cut once started
    /// (docs/actions.md, "What every action has in common"). Defaults to the protocol's list.
    fn is_non_interruptible(&self, action: CapabilityAction, _params: &Map<String, Value>) -> bool {
        action.non_interruptible_by_default()
    }

    /// Run one action to completion (blocking). Parameters are validated
    /// and limits checked before any byte reaches the device.
    fn execute(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError>;
}

/// Parse `params` into a typed parameter struct (use
/// `#[serde(deny_unknown_fields)]` on it), naming the bad field on error.
pub fn parse_params<T: DeserializeOwned>(params: &Map<String, Value>) -> Result<T, DriverError> {
    serde_path_to_error::deserialize(Value::Object(params.clone())).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let field = match inner
            .strip_prefix("missing field `")
            .and_then(|r| r.split('`').next())
        {
            Some(name) => name.to_string(),
            None if path == "." => "params".to_string(),
            None => path,
        };
        DriverError::InvalidParams {
            field,
            message: inner,
        }
    })
}

/// A backend's settings (or an action's params) read with
/// `#[serde(deny_unknown_fields, default)]`: a key the table leaves out
/// takes its value from the struct's `Default`, the one place that states
/// its defaults. [`Self::REQUIRED`] names the keys without a default: a
/// table lacking one is refused with serde's own error (``missing field
/// `port` ``), after the keys it has were checked, as without `default`.
pub trait Defaults: Default + DeserializeOwned {
    /// Top-level keys that must be present, in declaration order.
    const REQUIRED: &'static [&'static str] = &[];
}

/// [`parse_params`] for a [`Defaults`] struct: also refuses `params`
/// lacking one of its [`Defaults::REQUIRED`] keys.
pub fn parse_params_with_defaults<T: Defaults>(
    params: &Map<String, Value>,
) -> Result<T, DriverError> {
    let parsed = parse_params(params)?;
    match T::REQUIRED.iter().find(|k| !params.contains_key(**k)) {
        Some(key) => Err(DriverError::InvalidParams {
            field: key.to_string(),
            message: format!("missing field `{key}`"),
        }),
        None => Ok(parsed),
    }
}

/// An [`DriverError::Unsupported`] for `action` on `kind`.
pub fn unsupported(kind: CapabilityType, action: CapabilityAction, why: &str) -> DriverError {
    DriverError::Unsupported {
        action,
        kind,
        why: why.to_string(),
    }
}

pub mod camera;
pub mod live;
pub mod microphone;
pub mod psu;
pub mod relay;
pub mod screen;
pub mod serial;
pub mod sim_device;
pub mod speaker;
pub mod thumb_robot;
pub mod transport;

/// What the bench TOML says about one capability's driver: the backend
/// name (`korad`, `scpi`, `lcus`, `grbl`, `nokhwa`, `sim`, ...) and its
/// settings table, converted to JSON so kind modules parse it with serde.
#[derive(Debug, Clone)]
pub struct DriverSpec {
    pub capability_id: String,
    pub capability_type: CapabilityType,
    pub backend: String,
    pub settings: Map<String, Value>,
    /// Directory the driver may write scratch files to (the daemon's state
    /// directory, e.g. /var/lib/benchlink-edge).
    pub state_dir: std::path::PathBuf,
}

/// A driver section of the bench TOML that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DriverConfigError {
    #[error(
        "capability `{capability_id}`: unknown backend `{backend}` for {kind}; known: {known}"
    )]
    UnknownBackend {
        capability_id: String,
        kind: CapabilityType,
        backend: String,
        known: String,
    },
    /// `key` is the setting's name inside the driver table.
    #[error("capability `{capability_id}`: driver setting `{key}`: {message}")]
    Setting {
        capability_id: String,
        key: String,
        message: String,
    },
}

impl DriverSpec {
    /// Parse this spec's settings into a backend's typed settings struct
    /// (a [`Defaults`] struct), naming the bad key.
    pub fn parse<T: Defaults>(&self) -> Result<T, DriverConfigError> {
        let mut settings = self.settings.clone();
        settings.remove("backend");
        parse_params_with_defaults(&settings).map_err(|e| match e {
            DriverError::InvalidParams { field, message } => DriverConfigError::Setting {
                capability_id: self.capability_id.clone(),
                key: field,
                message,
            },
            other => DriverConfigError::Setting {
                capability_id: self.capability_id.clone(),
                key: "driver".into(),
                message: other.to_string(),
            },
        })
    }

    /// The error for a backend name this kind does not know.
    pub fn unknown_backend(&self, known: &[&str]) -> DriverConfigError {
        DriverConfigError::UnknownBackend {
            capability_id: self.capability_id.clone(),
            kind: self.capability_type,
            backend: self.backend.clone(),
            known: known.join(", "),
        }
    }
}

/// Build the driver for `spec`. Building parses and checks settings but
/// does not open the device: a bench whose camera is unplugged still starts
/// and reports that capability unhealthy.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    match spec.capability_type {
        CapabilityType::Camera => camera::build(spec),
        CapabilityType::Microphone => microphone::build(spec),
        CapabilityType::Speaker => speaker::build(spec),
        CapabilityType::SerialPort => serial::build(spec),
        CapabilityType::Relay => relay::build(spec),
        CapabilityType::ProgrammablePowerSupply => psu::build(spec),
        CapabilityType::ThumbRobot => thumb_robot::build(spec),
        CapabilityType::ScreenCapture => screen::build(spec),
    }
}

#[cfg(test)]
pub(crate) mod defaults_pin {
    //! Pins what a table with only the required keys parses to.

    /// Parse `table` as driver settings or action params are parsed and
    /// compare the result's `Debug` form with `expected`.
    pub(crate) fn check<T: serde::de::DeserializeOwned + std::fmt::Debug>(
        table: serde_json::Value,
        expected: &str,
    ) {
        let serde_json::Value::Object(map) = table else {
            panic!("not a table: {table}");
        };
        let parsed: T = super::parse_params(&map).expect("a minimal table parses");
        let got = format!("{parsed:?}");
        assert_eq!(got, expected);
    }

    /// A [`super::Defaults`] struct still refuses a table without a
    /// required key, with serde's error, but only after the keys present
    /// were checked (as without `#[serde(default)]`).
    #[test]
    fn required_keys_are_still_required() {
        #[derive(Debug, Default, serde::Deserialize)]
        #[serde(deny_unknown_fields, default)]
        #[allow(dead_code)]
        struct Settings {
            port: String,
            baud_rate: u32,
            max_voltage_v: f64,
        }
        impl super::Defaults for Settings {
            const REQUIRED: &'static [&'static str] = &["port", "max_voltage_v"];
        }
        let parse = |v: serde_json::Value| match v {
            serde_json::Value::Object(m) => super::parse_params_with_defaults::<Settings>(&m),
            _ => unreachable!(),
        };
        match parse(serde_json::json!({"port": "/dev/ttyUSB0"})).unwrap_err() {
            super::DriverError::InvalidParams { field, message } => {
                assert_eq!(field, "max_voltage_v");
                assert_eq!(message, "missing field `max_voltage_v`");
            }
            other => panic!("unexpected {other:?}"),
        }
        match parse(serde_json::json!({"baud_rate": "fast"})).unwrap_err() {
            super::DriverError::InvalidParams { field, .. } => assert_eq!(field, "baud_rate"),
            other => panic!("unexpected {other:?}"),
        }
        assert!(parse(serde_json::json!({"port": "p", "max_voltage_v": 5.0})).is_ok());
    }
}
