//! Programmable power supply driver (docs/actions.md): `power_on`,
//! `power_off`, `set_voltage`, `set_current_limit`, `measure_output`.
//!
//! Backends, each one small file behind [`PowerSupply`]:
//! - `korad` ([`korad`]): Korad KA3005P family (Tenma 72-2540, RND 320)
//!   over USB serial: unterminated ASCII, ~50 ms per command;
//! - `scpi` ([`scpi`]): Rigol DP800-type SCPI instruments over serial or a
//!   raw TCP socket (`host:5555`), with the error queue checked after every
//!   setting;
//! - `sim` ([`sim`]): an in-process supply that behaves like a Korad
//!   (command time, settling, constant-current mode under its load) and can
//!   power a simulated serial console through a named rail.
//!
//! This module does what is the same for every supply: typed parameters,
//! the configured safety limits (`max_voltage_v`, `max_current_a`: a request
//! above them is refused with [`DriverError::LimitExceeded`] before a byte
//! is sent), output switching as a non-interruptible window (docs/actions.md),
//! settling before the measurement that follows a switch or a setting, and
//! `sensor_dump` evidence of every action (measurement plus the command
//! transcript with timings).

pub mod korad;
pub mod scpi;
pub mod sim;

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Map, Value};
use shared_protocol::capability::{CapabilityAction, CapabilityType};

use super::transport::{bad_setting, now_rfc3339, round, sensor_dump, Transcript};
use super::{
    parse_params, unsupported, ActionOutcome, ActionRequest, Driver, DriverConfigError,
    DriverError, DriverHealth, DriverSpec,
};

/// Longest an action waits for the supply's port to (re)open.
pub(crate) const OPEN_WAIT: Duration = Duration::from_secs(2);

/// Regulation mode of the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Regulation {
    /// Constant voltage: the output is at the voltage setpoint.
    ConstantVoltage,
    /// Constant current: the load would draw more than the current limit.
    ConstantCurrent,
}

impl Regulation {
    /// `cv` or `cc`.
    pub fn as_str(self) -> &'static str {
        match self {
            Regulation::ConstantVoltage => "cv",
            Regulation::ConstantCurrent => "cc",
        }
    }
}

/// What the supply measured at its output terminals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    /// Volts.
    pub voltage_v: f64,
    /// Amperes.
    pub current_a: f64,
    /// Whether the output is on, when the supply reports it.
    pub output_on: Option<bool>,
    /// Regulation mode, when the supply reports it.
    pub mode: Option<Regulation>,
}

/// One power supply output, as a vendor backend drives it. Calls block;
/// each sends what it needs and verifies the supply took it.
pub trait PowerSupply: Send {
    /// Where it is attached, e.g. `/dev/serial/by-id/...` or `tcp://10.0.0.5:5555`.
    fn port_name(&self) -> String;
    /// Backend-specific registration metadata (e.g. `channel`).
    fn metadata(&self) -> Map<String, Value> {
        Map::new()
    }
    /// The identity string (`*IDN?`). Errors: [`DriverError::Unavailable`],
    /// [`DriverError::Device`] (no or bad answer).
    fn identify(&mut self) -> Result<String, DriverError>;
    /// Sets the voltage setpoint (V).
    fn set_voltage(&mut self, volts: f64) -> Result<(), DriverError>;
    /// Sets the current limit (A).
    fn set_current_limit(&mut self, amps: f64) -> Result<(), DriverError>;
    /// Switches the output on or off.
    fn set_output(&mut self, on: bool) -> Result<(), DriverError>;
    /// Measures the output.
    fn measure(&mut self) -> Result<Measurement, DriverError>;
    /// The port is present and open, and the supply answered its identity
    /// query since it was (re)connected.
    fn health(&mut self) -> DriverHealth;
    /// The commands sent and replies received (restarted per action).
    fn transcript(&mut self) -> &mut Transcript;
}

/// Safety limits every supply section of the bench TOML must give.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Highest voltage setpoint a user may request (V).
    pub max_voltage_v: f64,
    /// Highest current limit a user may request (A).
    pub max_current_a: f64,
}

impl Limits {
    /// Checks both limits are positive, finite numbers.
    pub fn checked(spec: &DriverSpec, v: f64, a: f64) -> Result<Limits, DriverConfigError> {
        if !(v.is_finite() && v > 0.0) {
            return Err(bad_setting(
                spec,
                "max_voltage_v",
                "must be a positive number of volts",
            ));
        }
        if !(a.is_finite() && a > 0.0) {
            return Err(bad_setting(
                spec,
                "max_current_a",
                "must be a positive number of amperes",
            ));
        }
        Ok(Limits {
            max_voltage_v: v,
            max_current_a: a,
        })
    }
}

/// Checks a `settle_ms` setting (0..=10000).
pub(crate) fn check_settle(
    spec: &DriverSpec,
    settle_ms: u64,
) -> Result<Duration, DriverConfigError> {
    if settle_ms > 10_000 {
        return Err(bad_setting(
            spec,
            "settle_ms",
            format!("{settle_ms} is outside 0..=10000"),
        ));
    }
    Ok(Duration::from_millis(settle_ms))
}

/// Build a power supply driver from its bench TOML section: `backend =
/// "korad"` ([`korad::KoradSettings`]), `"scpi"` ([`scpi::ScpiSettings`])
/// or `"sim"` ([`sim::SimPsuSettings`]).
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    let (psu, limits, settle): (Box<dyn PowerSupply>, Limits, Duration) =
        match spec.backend.as_str() {
            "korad" => {
                let (p, l, s) = korad::Korad::from_spec(spec)?;
                (Box::new(p), l, s)
            }
            "scpi" => {
                let (p, l, s) = scpi::Scpi::from_spec(spec)?;
                (Box::new(p), l, s)
            }
            "sim" => {
                let (p, l, s) = sim::SimPsu::from_spec(spec)?;
                (Box::new(p), l, s)
            }
            _ => return Err(spec.unknown_backend(&["korad", "scpi", "sim"])),
        };
    Ok(Box::new(PsuDriver {
        capability_id: spec.capability_id.clone(),
        backend: spec.backend.clone(),
        psu,
        limits,
        settle,
    }))
}

/// The programmable_power_supply capability over any [`PowerSupply`].
pub struct PsuDriver {
    capability_id: String,
    backend: String,
    psu: Box<dyn PowerSupply>,
    limits: Limits,
    /// Wait after switching before measuring.
    settle: Duration,
}

/// `set_voltage` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetVoltageParams {
    /// Volts, 0..=max_voltage_v.
    voltage_v: f64,
}

/// `set_current_limit` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetCurrentParams {
    /// Amperes, 0..=max_current_a.
    current_limit_a: f64,
}

/// `power_on` parameters: optional setpoints applied before switching on.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PowerOnParams {
    voltage_v: Option<f64>,
    current_limit_a: Option<f64>,
}

/// Parameters of actions that take none.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

impl PsuDriver {
    fn check_voltage(&self, field: &str, v: f64) -> Result<f64, DriverError> {
        if !(v.is_finite() && v >= 0.0) {
            return Err(DriverError::InvalidParams {
                field: field.into(),
                message: format!("{v} is not a non-negative number of volts"),
            });
        }
        if v > self.limits.max_voltage_v {
            return Err(DriverError::LimitExceeded {
                field: field.into(),
                message: format!(
                    "{v} V is above this supply's configured max_voltage_v of {} V",
                    self.limits.max_voltage_v
                ),
            });
        }
        Ok(v)
    }

    fn check_current(&self, field: &str, a: f64) -> Result<f64, DriverError> {
        if !(a.is_finite() && a >= 0.0) {
            return Err(DriverError::InvalidParams {
                field: field.into(),
                message: format!("{a} is not a non-negative number of amperes"),
            });
        }
        if a > self.limits.max_current_a {
            return Err(DriverError::LimitExceeded {
                field: field.into(),
                message: format!(
                    "{a} A is above this supply's configured max_current_a of {} A",
                    self.limits.max_current_a
                ),
            });
        }
        Ok(a)
    }

    /// The `sensor_dump` evidence of one action.
    fn evidence(
        &mut self,
        action: CapabilityAction,
        started_at: &str,
        m: Option<&Measurement>,
    ) -> super::NewArtifact {
        let transcript = self.psu.transcript().entries().to_vec();
        let body = json!({
            "capability_id": self.capability_id,
            "capability_type": CapabilityType::ProgrammablePowerSupply,
            "backend": self.backend,
            "port_name": self.psu.port_name(),
            "action": action,
            "started_at": started_at,
            "limits": {
                "max_voltage_v": self.limits.max_voltage_v,
                "max_current_a": self.limits.max_current_a,
            },
            "measurement": m.map(measurement_json),
            "transcript": transcript,
        });
        let mut meta = Map::new();
        meta.insert("action".into(), json!(action));
        meta.insert("backend".into(), json!(self.backend));
        sensor_dump(&body, meta)
    }

    fn switch(&mut self, req: &ActionRequest, on: bool) -> Result<ActionOutcome, DriverError> {
        let (voltage, current) = if on {
            let p: PowerOnParams = parse_params(&req.params)?;
            (
                p.voltage_v
                    .map(|v| self.check_voltage("voltage_v", v))
                    .transpose()?,
                p.current_limit_a
                    .map(|a| self.check_current("current_limit_a", a))
                    .transpose()?,
            )
        } else {
            let _: NoParams = parse_params(&req.params)?;
            (None, None)
        };
        if req.cancel.is_cancelled() {
            return Err(DriverError::Cancelled("cancelled before switching".into()));
        }
        let started_at = now_rfc3339();
        self.psu.transcript().restart();
        // From here the switching window is non-interruptible: the
        // cancel token is not looked at until the output has settled.
        if let Some(a) = current {
            self.psu.set_current_limit(a)?;
        }
        if let Some(v) = voltage {
            self.psu.set_voltage(v)?;
        }
        self.psu.set_output(on)?;
        let switched = Instant::now();
        self.psu.transcript().note(format!(
            "output {}; settling {} ms",
            if on { "on" } else { "off" },
            self.settle.as_millis()
        ));
        super::transport::sleep_until(switched + self.settle);
        let m = self.psu.measure()?;
        let mut summary = measurement_json(&m);
        if let Value::Object(s) = &mut summary {
            s.insert("output_on".into(), json!(on));
            if let Some(v) = voltage {
                s.insert("voltage_set_v".into(), json!(v));
            }
            if let Some(a) = current {
                s.insert("current_limit_a".into(), json!(a));
            }
        }
        let artifact = self.evidence(req.action, &started_at, Some(&m));
        Ok(ActionOutcome {
            result_summary: object(summary),
            artifacts: vec![artifact],
        })
    }

    /// `set_voltage` / `set_current_limit`: send `value` with `set`, wait
    /// the `settle_ms` setting (never past the action's deadline) and read
    /// the output back, like the switching actions. Result summary: `key`
    /// (the value set), the measurement keys and `settled` (false when the
    /// deadline cut the wait short: the reading may predate the output's
    /// settling); one `sensor_dump`.
    fn setting(
        &mut self,
        req: &ActionRequest,
        key: &str,
        value: f64,
        set: impl FnOnce(&mut dyn PowerSupply, f64) -> Result<(), DriverError>,
    ) -> Result<ActionOutcome, DriverError> {
        if req.cancel.is_cancelled() {
            return Err(DriverError::Cancelled("cancelled before sending".into()));
        }
        let started_at = now_rfc3339();
        self.psu.transcript().restart();
        set(self.psu.as_mut(), value)?;
        let sent = Instant::now();
        let settled = sent + self.settle <= req.deadline;
        let until = (sent + self.settle).min(req.deadline);
        self.psu.transcript().note(format!(
            "{key} {value}; settling {} ms",
            until.saturating_duration_since(sent).as_millis()
        ));
        super::transport::sleep_until(until);
        let m = self.psu.measure()?;
        let mut summary = measurement_json(&m);
        if let Value::Object(s) = &mut summary {
            s.insert(key.into(), json!(value));
            s.insert("settled".into(), json!(settled));
        }
        let artifact = self.evidence(req.action, &started_at, Some(&m));
        Ok(ActionOutcome {
            result_summary: object(summary),
            artifacts: vec![artifact],
        })
    }
}

fn measurement_json(m: &Measurement) -> Value {
    json!({
        "voltage_v": round(m.voltage_v, 4),
        "current_a": round(m.current_a, 4),
        "power_w": round(m.voltage_v * m.current_a, 4),
        "mode": m.mode.map(Regulation::as_str),
        "output_on": m.output_on,
    })
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

impl Driver for PsuDriver {
    fn capability_type(&self) -> CapabilityType {
        CapabilityType::ProgrammablePowerSupply
    }

    fn metadata(&self) -> Map<String, Value> {
        let mut m = self.psu.metadata();
        m.insert("backend".into(), json!(self.backend));
        m.insert("port_name".into(), json!(self.psu.port_name()));
        m.insert("max_voltage_v".into(), json!(self.limits.max_voltage_v));
        m.insert("max_current_a".into(), json!(self.limits.max_current_a));
        m
    }

    fn health(&mut self) -> DriverHealth {
        self.psu.health()
    }

    fn execute(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        tracing::debug!(capability_id = %self.capability_id, action = %req.action, "psu action");
        match req.action {
            CapabilityAction::SetVoltage => {
                let p: SetVoltageParams = parse_params(&req.params)?;
                let v = self.check_voltage("voltage_v", p.voltage_v)?;
                self.setting(req, "voltage_set_v", v, |psu, v| psu.set_voltage(v))
            }
            CapabilityAction::SetCurrentLimit => {
                let p: SetCurrentParams = parse_params(&req.params)?;
                let a = self.check_current("current_limit_a", p.current_limit_a)?;
                self.setting(req, "current_limit_a", a, |psu, a| psu.set_current_limit(a))
            }
            CapabilityAction::PowerOn => self.switch(req, true),
            CapabilityAction::PowerOff => self.switch(req, false),
            CapabilityAction::MeasureOutput => {
                let _: NoParams = parse_params(&req.params)?;
                let started_at = now_rfc3339();
                self.psu.transcript().restart();
                let m = self.psu.measure()?;
                let artifact = self.evidence(req.action, &started_at, Some(&m));
                Ok(ActionOutcome {
                    result_summary: object(measurement_json(&m)),
                    artifacts: vec![artifact],
                })
            }
            other => Err(unsupported(
                CapabilityType::ProgrammablePowerSupply,
                other,
                "not a power supply action",
            )),
        }
    }
}
