//! `sim` backend: an in-process power supply that behaves like a Korad
//! KA3005P: every command takes `command_ms` (50 ms by default), setpoints
//! outside the unit's rating are ignored (reported as a device error, since
//! a real unit would silently not take them and the read-back would
//! differ), and the output follows a resistive `load_ohms`: constant
//! voltage until VSET / R exceeds the current limit, then constant current.
//! After switching on, the output ramps up over `ramp_ms`.
//!
//! With `power_rail = "<name>"` the output voltage drives that simulated
//! rail, so a `sim` serial console on the same rail boots when this supply
//! is switched on (see [`crate::drivers::serial::sim`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{check_settle, Limits, Measurement, PowerSupply, Regulation};
use crate::drivers::serial::sim::{power_rail, PowerRail};
use crate::drivers::transport::{bad_setting, Transcript};
use crate::drivers::{Defaults, DriverConfigError, DriverError, DriverHealth, DriverSpec};

/// Bench TOML settings of `backend = "sim"` for a power supply.
///
/// ```toml
/// max_voltage_v = 12.0     # required safety limit (V)
/// max_current_a = 2.0      # required safety limit (A)
/// rated_voltage_v = 30.0   # what the simulated unit can do
/// rated_current_a = 5.0
/// load_ohms = 100.0        # resistive load on the output (> 0)
/// command_ms = 50          # 0..=1000, time per command
/// ramp_ms = 20             # 0..=5000, output rise time after switching on
/// settle_ms = 100          # 0..=10000, driver wait before measuring
/// power_rail = "dut-main"  # optional
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimPsuSettings {
    pub max_voltage_v: f64,
    pub max_current_a: f64,
    pub rated_voltage_v: f64,
    pub rated_current_a: f64,
    pub load_ohms: f64,
    pub command_ms: u64,
    pub ramp_ms: u64,
    pub settle_ms: u64,
    pub power_rail: Option<String>,
}

impl Default for SimPsuSettings {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            max_voltage_v: 0.0,
            max_current_a: 0.0,
            rated_voltage_v: 30.0,
            rated_current_a: 5.0,
            load_ohms: 100.0,
            command_ms: 50,
            ramp_ms: 20,
            settle_ms: 100,
            power_rail: None,
        }
    }
}

impl Defaults for SimPsuSettings {
    const REQUIRED: &'static [&'static str] = &["max_voltage_v", "max_current_a"];
}

/// The simulated supply.
pub struct SimPsu {
    settings: SimPsuSettings,
    vset_v: f64,
    iset_a: f64,
    output_on: bool,
    switched_on_at: Option<Instant>,
    rail: Option<Arc<PowerRail>>,
    transcript: Transcript,
}

impl SimPsu {
    /// Parses and checks the settings; returns the backend, its limits and
    /// the settle time.
    pub fn from_spec(spec: &DriverSpec) -> Result<(Self, Limits, Duration), DriverConfigError> {
        let s: SimPsuSettings = spec.parse()?;
        let limits = Limits::checked(spec, s.max_voltage_v, s.max_current_a)?;
        for (key, v) in [
            ("rated_voltage_v", s.rated_voltage_v),
            ("rated_current_a", s.rated_current_a),
            ("load_ohms", s.load_ohms),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad_setting(spec, key, "must be a positive number"));
            }
        }
        if s.command_ms > 1000 {
            return Err(bad_setting(
                spec,
                "command_ms",
                format!("{} is outside 0..=1000", s.command_ms),
            ));
        }
        if s.ramp_ms > 5000 {
            return Err(bad_setting(
                spec,
                "ramp_ms",
                format!("{} is outside 0..=5000", s.ramp_ms),
            ));
        }
        let settle = check_settle(spec, s.settle_ms)?;
        let rail = s.power_rail.as_deref().map(power_rail);
        Ok((
            SimPsu {
                settings: s,
                vset_v: 0.0,
                iset_a: 0.0,
                output_on: false,
                switched_on_at: None,
                rail,
                transcript: Transcript::new(),
            },
            limits,
            settle,
        ))
    }

    /// One command's processing time, recorded like a Korad command.
    fn command(&mut self, text: &str) {
        self.transcript.tx(text);
        std::thread::sleep(Duration::from_millis(self.settings.command_ms));
    }

    /// Terminal voltage (V), current (A) and mode right now.
    fn output(&self) -> (f64, f64, Regulation) {
        if !self.output_on {
            return (0.0, 0.0, Regulation::ConstantVoltage);
        }
        let ramp = Duration::from_millis(self.settings.ramp_ms);
        let rise = match self.switched_on_at {
            Some(t) if !ramp.is_zero() => (t.elapsed().as_secs_f64() / ramp.as_secs_f64()).min(1.0),
            _ => 1.0,
        };
        let r = self.settings.load_ohms;
        let v = self.vset_v * rise;
        if v / r > self.iset_a {
            (self.iset_a * r, self.iset_a, Regulation::ConstantCurrent)
        } else {
            (v, v / r, Regulation::ConstantVoltage)
        }
    }

    fn publish(&self) {
        if let Some(rail) = &self.rail {
            // The rail sees the settled value; the ramp is too short to matter.
            let r = self.settings.load_ohms;
            let v = if !self.output_on {
                0.0
            } else if self.vset_v / r > self.iset_a {
                self.iset_a * r
            } else {
                self.vset_v
            };
            rail.set_volts(v);
        }
    }
}

impl PowerSupply for SimPsu {
    fn port_name(&self) -> String {
        "sim://psu".into()
    }

    fn metadata(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("channel".into(), json!(1));
        m.insert("load_ohms".into(), json!(self.settings.load_ohms));
        m
    }

    fn identify(&mut self) -> Result<String, DriverError> {
        self.command("*IDN?");
        Ok("BENCHLINK SIMPSU V1.0".into())
    }

    fn set_voltage(&mut self, volts: f64) -> Result<(), DriverError> {
        let v = (volts * 100.0).round() / 100.0;
        self.command(&format!("VSET1:{v:.2}"));
        if v > self.settings.rated_voltage_v {
            return Err(DriverError::Device(format!(
                "simulated supply did not take VSET1:{v:.2}: outside its 0..={} V rating",
                self.settings.rated_voltage_v
            )));
        }
        self.vset_v = v;
        self.publish();
        Ok(())
    }

    fn set_current_limit(&mut self, amps: f64) -> Result<(), DriverError> {
        let a = (amps * 1000.0).round() / 1000.0;
        self.command(&format!("ISET1:{a:.3}"));
        if a > self.settings.rated_current_a {
            return Err(DriverError::Device(format!(
                "simulated supply did not take ISET1:{a:.3}: outside its 0..={} A rating",
                self.settings.rated_current_a
            )));
        }
        self.iset_a = a;
        self.publish();
        Ok(())
    }

    fn set_output(&mut self, on: bool) -> Result<(), DriverError> {
        self.command(if on { "OUT1" } else { "OUT0" });
        if on && !self.output_on {
            self.switched_on_at = Some(Instant::now());
        }
        self.output_on = on;
        self.publish();
        Ok(())
    }

    fn measure(&mut self) -> Result<Measurement, DriverError> {
        self.command("VOUT1?");
        let (v, _, _) = self.output();
        self.transcript.rx(format!("{v:05.2}"));
        self.command("IOUT1?");
        let (_, a, mode) = self.output();
        self.transcript.rx(format!("{a:.3}"));
        Ok(Measurement {
            voltage_v: (v * 100.0).round() / 100.0,
            current_a: (a * 1000.0).round() / 1000.0,
            output_on: Some(self.output_on),
            mode: Some(mode),
        })
    }

    fn health(&mut self) -> DriverHealth {
        DriverHealth::healthy()
    }

    fn transcript(&mut self) -> &mut Transcript {
        &mut self.transcript
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// What a table with only its required keys means; the expected text
    /// was taken from the code before the defaults moved into `Default`.
    #[test]
    fn a_minimal_table_takes_the_documented_defaults() {
        crate::drivers::defaults_pin::check::<SimPsuSettings>(
            serde_json::json!({"max_voltage_v": 12.0, "max_current_a": 2.0}),
            "SimPsuSettings { max_voltage_v: 12.0, max_current_a: 2.0, rated_voltage_v: 30.0, rated_current_a: 5.0, load_ohms: 100.0, command_ms: 50, ramp_ms: 20, settle_ms: 100, power_rail: None }",
        );
    }
}
