//! `sim` backend: an in-process XYZ gantry. Each step of a path takes the
//! time the real machine would: distance over the feed rate for `G1`,
//! over `rapid_mm_per_min` for `G0`, the dwell for `G4` (all divided by
//! `speedup`). The transcript shows the same G-code a GRBL controller
//! would get, each line acknowledged when its motion has finished.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::grbl::GrblSettings;
use super::{distance, Bounds, Geometry, Motion, MotionController, Spot};
use crate::drivers::sim_device::{self, SimDevice};
use crate::drivers::transport::{bad_setting, Transcript};
use crate::drivers::{Defaults, DriverConfigError, DriverError, DriverHealth, DriverSpec};

/// Bench TOML settings of `backend = "sim"` for a thumb robot: the same
/// geometry keys as `grbl` (no port), plus `speedup`.
///
/// ```toml
/// bounds_mm = { x_min = 0.0, x_max = 70.0, y_min = 0.0, y_max = 140.0 }
/// safe_z_mm = 10.0
/// press_z_mm = 2.0
/// feed_mm_per_min = 1500.0
/// rapid_mm_per_min = 3000.0
/// speedup = 1.0             # 0.1..=100, simulated time runs this much faster
/// [capabilities.driver.key_map]
/// a = { x_mm = 10.0, y_mm = 100.0 }
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimRobotSettings {
    pub bounds_mm: Bounds,
    pub safe_z_mm: f64,
    pub press_z_mm: f64,
    pub feed_mm_per_min: f64,
    pub rapid_mm_per_min: f64,
    pub speedup: f64,
    pub movement_precision_mm: f64,
    pub robot_model: Option<String>,
    pub key_map: BTreeMap<String, Spot>,
    pub buttons: BTreeMap<String, Spot>,
}

impl Default for SimRobotSettings {
    /// `speedup = 1.0`, the motion defaults of a real gantry
    /// ([`GrblSettings`]); the keys of [`Defaults::REQUIRED`] have none
    /// (placeholders here).
    fn default() -> Self {
        let real = GrblSettings::default();
        Self {
            bounds_mm: real.bounds_mm,
            safe_z_mm: real.safe_z_mm,
            press_z_mm: real.press_z_mm,
            feed_mm_per_min: real.feed_mm_per_min,
            rapid_mm_per_min: real.rapid_mm_per_min,
            speedup: 1.0,
            movement_precision_mm: real.movement_precision_mm,
            robot_model: None,
            key_map: BTreeMap::new(),
            buttons: BTreeMap::new(),
        }
    }
}

impl Defaults for SimRobotSettings {
    const REQUIRED: &'static [&'static str] = &["bounds_mm", "safe_z_mm", "press_z_mm"];
}

/// The simulated gantry. With a simulated DUT on the edge
/// ([`sim_device`]) it reports its stylus position after every step, so
/// a press on the DUT's wake button wakes it.
pub struct SimRobot {
    position: [f64; 3],
    press_z_mm: f64,
    dut: Option<Arc<SimDevice>>,
    rapid_mm_per_min: f64,
    speedup: f64,
    model: String,
    transcript: Transcript,
}

impl SimRobot {
    /// Parses and checks the settings.
    pub fn from_spec(spec: &DriverSpec) -> Result<(Self, Geometry), DriverConfigError> {
        let s: SimRobotSettings = spec.parse()?;
        let geometry = Geometry::checked(
            spec,
            s.bounds_mm,
            s.safe_z_mm,
            s.press_z_mm,
            s.feed_mm_per_min,
            s.key_map,
            s.buttons,
            s.movement_precision_mm,
        )?;
        if !(1.0..=100_000.0).contains(&s.rapid_mm_per_min) {
            return Err(bad_setting(
                spec,
                "rapid_mm_per_min",
                format!("{} is outside 1..=100000", s.rapid_mm_per_min),
            ));
        }
        if !(0.1..=100.0).contains(&s.speedup) {
            return Err(bad_setting(
                spec,
                "speedup",
                format!("{} is outside 0.1..=100", s.speedup),
            ));
        }
        let b = geometry.bounds;
        let position = [b.x_min, b.y_min, geometry.safe_z_mm];
        let dut = sim_device::attached(&spec.state_dir);
        if let Some(d) = &dut {
            d.stylus_at(position, false);
        }
        Ok((
            SimRobot {
                position,
                press_z_mm: geometry.press_z_mm,
                dut,
                rapid_mm_per_min: s.rapid_mm_per_min,
                speedup: s.speedup,
                model: s
                    .robot_model
                    .unwrap_or_else(|| "simulated XYZ gantry".into()),
                transcript: Transcript::new(),
            },
            geometry,
        ))
    }
}

impl MotionController for SimRobot {
    fn port_name(&self) -> String {
        "sim://thumb-robot".into()
    }

    fn model(&self) -> String {
        self.model.clone()
    }

    fn run(&mut self, path: &[Motion]) -> Result<[f64; 3], DriverError> {
        for m in path {
            let to = m.target(self.position);
            let seconds = match m {
                Motion::Rapid { .. } => distance(self.position, to) / self.rapid_mm_per_min * 60.0,
                Motion::Linear {
                    feed_mm_per_min, ..
                } => distance(self.position, to) / feed_mm_per_min * 60.0,
                Motion::Dwell { ms } => *ms as f64 / 1000.0,
            };
            self.transcript.tx(m.gcode());
            std::thread::sleep(Duration::from_secs_f64(seconds / self.speedup));
            self.position = to;
            if let Some(d) = &self.dut {
                d.stylus_at(to, (to[2] - self.press_z_mm).abs() < 1e-6);
            }
            self.transcript.rx("ok");
        }
        Ok(self.position)
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
        crate::drivers::defaults_pin::check::<SimRobotSettings>(
            serde_json::json!({"bounds_mm": {"x_min": 0.0, "x_max": 70.0, "y_min": 0.0, "y_max": 140.0}, "safe_z_mm": 10.0, "press_z_mm": 2.0}),
            "SimRobotSettings { bounds_mm: Bounds { x_min: 0.0, x_max: 70.0, y_min: 0.0, y_max: 140.0 }, safe_z_mm: 10.0, press_z_mm: 2.0, feed_mm_per_min: 1500.0, rapid_mm_per_min: 3000.0, speedup: 1.0, movement_precision_mm: 0.1, robot_model: None, key_map: {}, buttons: {} }",
        );
    }
}
