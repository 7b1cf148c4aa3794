//! Thumb robot driver (docs/actions.md, "thumb_robot"): `tap`, `double_tap`, `long_press`,
//! `drag`, `type_keys`, `press_hardware_button`.
//!
//! A thumb robot is a small XYZ gantry with a stylus: X/Y position it over
//! the device, Z presses. Every gesture is a *path* of [`Motion`]s (rapid
//! moves, feed moves, dwells) in millimetres, built here the same way for
//! every backend:
//!
//! ```text
//! press(x, y, hold) = G0 Z<safe>   G0 X<x> Y<y>   G1 Z<press> F<feed>   G4 P<hold>   G0 Z<safe>
//! ```
//!
//! Backends, behind [`MotionController`]:
//! - `grbl` ([`grbl`]): a GRBL 1.1 controller over serial G-code;
//! - `sim` ([`sim`]): an in-process gantry with motion times from the feed
//!   and rapid rates.
//!
//! Coordinates outside the configured `bounds_mm` are refused with
//! [`DriverError::LimitExceeded`] before anything moves. A path runs to the
//! end once started: the stylus is never left down (docs/actions.md), and the
//! action deadline is only looked at between paths. `type_keys` presses one
//! key per path and checks cancellation between keys, so it reports itself
//! interruptible ([`Driver::is_non_interruptible`] is false for it): a
//! preemption stops it after the key being pressed. Evidence: a
//! `sensor_dump` with every press, the executed G-code and its timings.

pub mod grbl;
pub mod sim;

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Deserialize;
use serde_json::{json, Map, Value};
use shared_protocol::capability::{CapabilityAction, CapabilityType};

use super::transport::{bad_setting, now_rfc3339, round, sensor_dump, Transcript};
use super::{
    parse_params_with_defaults, unsupported, ActionOutcome, ActionRequest, Defaults, Driver,
    DriverConfigError, DriverError, DriverHealth, DriverSpec,
};

/// One step of a path, in millimetres and mm/min.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Motion {
    /// `G0`: move as fast as the machine can; `None` axes stay.
    Rapid {
        x: Option<f64>,
        y: Option<f64>,
        z: Option<f64>,
    },
    /// `G1`: move at `feed_mm_per_min`.
    Linear {
        x: Option<f64>,
        y: Option<f64>,
        z: Option<f64>,
        feed_mm_per_min: f64,
    },
    /// `G4`: wait `ms` milliseconds once the moves before it finished.
    Dwell { ms: u64 },
}

impl Motion {
    /// The G-code line for this step, e.g. `G0 X12.500 Y30.000`,
    /// `G1 Z2.000 F1500`, `G4 P0.250`.
    pub fn gcode(&self) -> String {
        fn axes(x: &Option<f64>, y: &Option<f64>, z: &Option<f64>) -> String {
            let mut s = String::new();
            for (name, v) in [("X", x), ("Y", y), ("Z", z)] {
                if let Some(v) = v {
                    s.push_str(&format!(" {name}{v:.3}"));
                }
            }
            s
        }
        match self {
            Motion::Rapid { x, y, z } => format!("G0{}", axes(x, y, z)),
            Motion::Linear {
                x,
                y,
                z,
                feed_mm_per_min,
            } => format!("G1{} F{feed_mm_per_min:.0}", axes(x, y, z)),
            Motion::Dwell { ms } => format!("G4 P{:.3}", *ms as f64 / 1000.0),
        }
    }

    /// Where this step ends, from `from` (mm).
    pub fn target(&self, from: [f64; 3]) -> [f64; 3] {
        match self {
            Motion::Rapid { x, y, z } | Motion::Linear { x, y, z, .. } => [
                x.unwrap_or(from[0]),
                y.unwrap_or(from[1]),
                z.unwrap_or(from[2]),
            ],
            Motion::Dwell { .. } => from,
        }
    }
}

/// Straight-line distance between two points (mm).
pub fn distance(a: [f64; 3], b: [f64; 3]) -> f64 {
    (0..3).map(|i| (b[i] - a[i]).powi(2)).sum::<f64>().sqrt()
}

/// Seconds `path` takes from `from` at `rapid` mm/min for `G0` moves.
pub fn path_seconds(path: &[Motion], from: [f64; 3], rapid_mm_per_min: f64) -> f64 {
    let mut at = from;
    let mut s = 0.0;
    for m in path {
        let to = m.target(at);
        s += match m {
            Motion::Rapid { .. } => distance(at, to) / rapid_mm_per_min * 60.0,
            Motion::Linear {
                feed_mm_per_min, ..
            } => distance(at, to) / feed_mm_per_min * 60.0,
            Motion::Dwell { ms } => *ms as f64 / 1000.0,
        };
        at = to;
    }
    s
}

/// A motion controller, as a vendor backend drives it.
pub trait MotionController: Send {
    /// Where it is attached, e.g. `/dev/serial/by-id/usb-Arduino...`.
    fn port_name(&self) -> String;
    /// `robot_model` metadata, e.g. `GRBL 1.1 gantry`.
    fn model(&self) -> String;
    /// Runs `path` to the end and returns once the machine is idle, with
    /// its final position (mm). Errors: [`DriverError::Unavailable`] (gone),
    /// [`DriverError::Device`] (an `error:N` or `ALARM:N` with its meaning).
    fn run(&mut self, path: &[Motion]) -> Result<[f64; 3], DriverError>;
    /// Port open and controller ready for motion.
    fn health(&mut self) -> DriverHealth;
    /// Every G-code line sent and reply received (restarted per action).
    fn transcript(&mut self) -> &mut Transcript;
}

/// `bounds_mm` in the bench TOML: the reachable rectangle over the device.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bounds {
    pub x_min: f64,
    pub x_max: f64,
    pub y_min: f64,
    pub y_max: f64,
}

impl Bounds {
    /// All zero: the placeholder of a required `bounds_mm` in a settings
    /// struct's `Default` (never used, see [`crate::drivers::Defaults`]).
    pub(crate) const UNSET: Bounds = Bounds {
        x_min: 0.0,
        x_max: 0.0,
        y_min: 0.0,
        y_max: 0.0,
    };
}

/// A named spot (a key of `key_map`, a hardware button), mm.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spot {
    pub x_mm: f64,
    pub y_mm: f64,
}

/// What every robot backend is configured with.
#[derive(Debug, Clone, PartialEq)]
pub struct Geometry {
    pub bounds: Bounds,
    /// Stylus height clear of the device (mm).
    pub safe_z_mm: f64,
    /// Stylus height that presses (mm).
    pub press_z_mm: f64,
    /// Feed for pressing and dragging (mm/min).
    pub feed_mm_per_min: f64,
    pub key_map: BTreeMap<String, Spot>,
    pub buttons: BTreeMap<String, Spot>,
    /// `movement_precision_mm` metadata.
    pub precision_mm: f64,
}

impl Geometry {
    /// Checks the geometry; errors name the bench TOML key.
    #[allow(clippy::too_many_arguments)]
    pub fn checked(
        spec: &DriverSpec,
        bounds: Bounds,
        safe_z_mm: f64,
        press_z_mm: f64,
        feed_mm_per_min: f64,
        key_map: BTreeMap<String, Spot>,
        buttons: BTreeMap<String, Spot>,
        precision_mm: f64,
    ) -> Result<Geometry, DriverConfigError> {
        let b = bounds;
        let finite = [b.x_min, b.x_max, b.y_min, b.y_max]
            .iter()
            .all(|v| v.is_finite());
        if !finite || b.x_min >= b.x_max || b.y_min >= b.y_max {
            return Err(bad_setting(
                spec,
                "bounds_mm",
                "needs finite x_min < x_max and y_min < y_max",
            ));
        }
        if !(safe_z_mm.is_finite() && press_z_mm.is_finite()) || safe_z_mm == press_z_mm {
            return Err(bad_setting(
                spec,
                "press_z_mm",
                "safe_z_mm and press_z_mm must be different finite heights",
            ));
        }
        if !(1.0..=50_000.0).contains(&feed_mm_per_min) {
            return Err(bad_setting(
                spec,
                "feed_mm_per_min",
                format!("{feed_mm_per_min} is outside 1..=50000"),
            ));
        }
        if !(precision_mm.is_finite() && precision_mm > 0.0) {
            return Err(bad_setting(
                spec,
                "movement_precision_mm",
                "must be a positive number",
            ));
        }
        let g = Geometry {
            bounds,
            safe_z_mm,
            press_z_mm,
            feed_mm_per_min,
            key_map,
            buttons,
            precision_mm,
        };
        for (table, map) in [("key_map", &g.key_map), ("buttons", &g.buttons)] {
            for (name, spot) in map {
                if name.is_empty() || g.check_xy("", "", spot.x_mm, spot.y_mm).is_err() {
                    return Err(bad_setting(
                        spec,
                        table,
                        format!(
                            "`{name}` at ({}, {}) mm is outside bounds_mm",
                            spot.x_mm, spot.y_mm
                        ),
                    ));
                }
            }
        }
        Ok(g)
    }

    /// Refuses a point outside the bounds, naming the parameter.
    fn check_xy(&self, fx: &str, fy: &str, x: f64, y: f64) -> Result<(), DriverError> {
        let b = &self.bounds;
        for (field, v, lo, hi) in [(fx, x, b.x_min, b.x_max), (fy, y, b.y_min, b.y_max)] {
            if !v.is_finite() {
                return Err(DriverError::InvalidParams {
                    field: field.into(),
                    message: format!("{v} is not a number of millimetres"),
                });
            }
            if !(lo..=hi).contains(&v) {
                return Err(DriverError::LimitExceeded {
                    field: field.into(),
                    message: format!("{v} mm is outside the robot's bounds {lo}..={hi} mm"),
                });
            }
        }
        Ok(())
    }

    /// The path of one press at (x, y) held `hold_ms`.
    pub fn press(&self, x: f64, y: f64, hold_ms: u64) -> Vec<Motion> {
        vec![
            Motion::Rapid {
                x: None,
                y: None,
                z: Some(self.safe_z_mm),
            },
            Motion::Rapid {
                x: Some(x),
                y: Some(y),
                z: None,
            },
            Motion::Linear {
                x: None,
                y: None,
                z: Some(self.press_z_mm),
                feed_mm_per_min: self.feed_mm_per_min,
            },
            Motion::Dwell { ms: hold_ms },
            Motion::Rapid {
                x: None,
                y: None,
                z: Some(self.safe_z_mm),
            },
        ]
    }
}

/// Build a thumb robot driver from its bench TOML section: `backend =
/// "grbl"` ([`grbl::GrblSettings`]) or `"sim"` ([`sim::SimRobotSettings`]).
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    let (controller, geometry): (Box<dyn MotionController>, Geometry) = match spec.backend.as_str()
    {
        "grbl" => {
            let (c, g) = grbl::Grbl::from_spec(spec)?;
            (Box::new(c), g)
        }
        "sim" => {
            let (c, g) = sim::SimRobot::from_spec(spec)?;
            (Box::new(c), g)
        }
        _ => return Err(spec.unknown_backend(&["grbl", "sim"])),
    };
    Ok(Box::new(RobotDriver {
        capability_id: spec.capability_id.clone(),
        backend: spec.backend.clone(),
        controller,
        geometry,
    }))
}

/// The thumb_robot capability over any [`MotionController`].
pub struct RobotDriver {
    capability_id: String,
    backend: String,
    controller: Box<dyn MotionController>,
    geometry: Geometry,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct TapParams {
    x_mm: f64,
    y_mm: f64,
    /// 0..=5000, default 100.
    hold_ms: u64,
}

impl Default for TapParams {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            x_mm: 0.0,
            y_mm: 0.0,
            hold_ms: 100,
        }
    }
}

impl Defaults for TapParams {
    const REQUIRED: &'static [&'static str] = &["x_mm", "y_mm"];
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct DoubleTapParams {
    x_mm: f64,
    y_mm: f64,
    /// 0..=5000, default 80.
    hold_ms: u64,
    /// 0..=2000, default 150: from lifting to pressing again.
    interval_ms: u64,
}

impl Default for DoubleTapParams {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            x_mm: 0.0,
            y_mm: 0.0,
            hold_ms: 80,
            interval_ms: 150,
        }
    }
}

impl Defaults for DoubleTapParams {
    const REQUIRED: &'static [&'static str] = &["x_mm", "y_mm"];
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct LongPressParams {
    x_mm: f64,
    y_mm: f64,
    /// 100..=60000, default 1000.
    hold_ms: u64,
}

impl Default for LongPressParams {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            x_mm: 0.0,
            y_mm: 0.0,
            hold_ms: 1000,
        }
    }
}

impl Defaults for LongPressParams {
    const REQUIRED: &'static [&'static str] = &["x_mm", "y_mm"];
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct DragParams {
    x_mm: f64,
    y_mm: f64,
    to_x_mm: f64,
    to_y_mm: f64,
    /// 0..=5000, default 100: pressed before moving.
    hold_ms: u64,
    /// 1..=50000; default: the `feed_mm_per_min` setting.
    speed_mm_per_min: Option<f64>,
}

impl Default for DragParams {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            x_mm: 0.0,
            y_mm: 0.0,
            to_x_mm: 0.0,
            to_y_mm: 0.0,
            hold_ms: 100,
            speed_mm_per_min: None,
        }
    }
}

impl Defaults for DragParams {
    const REQUIRED: &'static [&'static str] = &["x_mm", "y_mm", "to_x_mm", "to_y_mm"];
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct TypeKeysParams {
    /// Key names of `key_map`, pressed in order.
    keys: Option<Vec<String>>,
    /// Each character is a key name (` ` may be `space`, newline `enter`).
    text: Option<String>,
    /// 0..=5000, default 80.
    hold_ms: u64,
    /// 0..=5000, default 100: pause between keys.
    interval_ms: u64,
}

impl Default for TypeKeysParams {
    /// The documented defaults.
    fn default() -> Self {
        Self {
            keys: None,
            text: None,
            hold_ms: 80,
            interval_ms: 100,
        }
    }
}

impl Defaults for TypeKeysParams {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ButtonParams {
    /// A name of the `buttons` table.
    button: String,
    /// 0..=60000, default 200.
    hold_ms: u64,
}

impl Default for ButtonParams {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            button: String::new(),
            hold_ms: 200,
        }
    }
}

impl Defaults for ButtonParams {
    const REQUIRED: &'static [&'static str] = &["button"];
}

/// Most keys one `type_keys` may press.
const MAX_KEYS: usize = 500;

fn check_ms(field: &str, v: u64, lo: u64, hi: u64) -> Result<u64, DriverError> {
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(DriverError::InvalidParams {
            field: field.into(),
            message: format!("{v} is outside {lo}..={hi}"),
        })
    }
}

/// One executed press (or drag) for the evidence.
struct Press {
    label: String,
    x_mm: f64,
    y_mm: f64,
    started_ms: f64,
    finished_ms: f64,
}

impl RobotDriver {
    /// Runs one path, recording it as a press for the evidence.
    fn run(
        &mut self,
        label: String,
        x: f64,
        y: f64,
        path: &[Motion],
        presses: &mut Vec<Press>,
    ) -> Result<[f64; 3], DriverError> {
        let started_ms = self.controller.transcript().ms(Instant::now());
        let pos = self.controller.run(path)?;
        let finished_ms = self.controller.transcript().ms(Instant::now());
        presses.push(Press {
            label,
            x_mm: x,
            y_mm: y,
            started_ms,
            finished_ms,
        });
        Ok(pos)
    }

    fn outcome(
        &mut self,
        action: CapabilityAction,
        started_at: &str,
        presses: &[Press],
        position: Option<[f64; 3]>,
        summary: Value,
    ) -> ActionOutcome {
        let transcript = self.controller.transcript().entries().to_vec();
        let gcode: Vec<&str> = transcript
            .iter()
            .filter(|e| e.dir == super::transport::Direction::Tx)
            .map(|e| e.data.as_str())
            .collect();
        let press_list: Vec<Value> = presses
            .iter()
            .map(|p| {
                json!({
                    "target": p.label,
                    "x_mm": p.x_mm,
                    "y_mm": p.y_mm,
                    "started_ms": p.started_ms,
                    "finished_ms": p.finished_ms,
                })
            })
            .collect();
        let body = json!({
            "capability_id": self.capability_id,
            "capability_type": CapabilityType::ThumbRobot,
            "backend": self.backend,
            "port_name": self.controller.port_name(),
            "action": action,
            "started_at": started_at,
            "safe_z_mm": self.geometry.safe_z_mm,
            "press_z_mm": self.geometry.press_z_mm,
            "feed_mm_per_min": self.geometry.feed_mm_per_min,
            "presses": press_list,
            "final_position_mm": position.map(|p| p.map(|v| round(v, 3))),
            "gcode": gcode,
            "transcript": transcript,
        });
        let mut meta = Map::new();
        meta.insert("action".into(), json!(action));
        meta.insert("backend".into(), json!(self.backend));
        let mut result = match summary {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        result.insert("presses".into(), json!(presses.len()));
        result.insert("duration_ms".into(), json!(span_ms(presses)));
        ActionOutcome {
            result_summary: result,
            artifacts: vec![sensor_dump(&body, meta)],
        }
    }

    fn tap_like(
        &mut self,
        req: &ActionRequest,
        x: f64,
        y: f64,
        path: Vec<Motion>,
        summary: Value,
    ) -> Result<ActionOutcome, DriverError> {
        if req.cancel.is_cancelled() {
            return Err(DriverError::Cancelled("cancelled before moving".into()));
        }
        let started_at = now_rfc3339();
        self.controller.transcript().restart();
        let mut presses = Vec::new();
        let pos = self.run(req.action.to_string(), x, y, &path, &mut presses)?;
        Ok(self.outcome(req.action, &started_at, &presses, Some(pos), summary))
    }

    fn type_keys(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        let p: TypeKeysParams = parse_params_with_defaults(&req.params)?;
        let hold = check_ms("hold_ms", p.hold_ms, 0, 5000)?;
        let interval = check_ms("interval_ms", p.interval_ms, 0, 5000)?;
        let (field, names): (&str, Vec<String>) = match (p.keys, p.text) {
            (Some(keys), None) => ("keys", keys),
            (None, Some(text)) => ("text", text.chars().map(String::from).collect()),
            (Some(_), Some(_)) => {
                return Err(DriverError::InvalidParams {
                    field: "keys".into(),
                    message: "give either `keys` or `text`, not both".into(),
                })
            }
            (None, None) => {
                return Err(DriverError::InvalidParams {
                    field: "keys".into(),
                    message: "missing field `keys` (or `text`)".into(),
                })
            }
        };
        if names.is_empty() || names.len() > MAX_KEYS {
            return Err(DriverError::InvalidParams {
                field: field.into(),
                message: format!("{} keys; 1..={MAX_KEYS} allowed", names.len()),
            });
        }
        // Resolve every key before the first press.
        let mut spots = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            let alias = match name.as_str() {
                " " => Some("space"),
                "\n" | "\r" => Some("enter"),
                "\t" => Some("tab"),
                _ => None,
            };
            let spot = self
                .geometry
                .key_map
                .get(name)
                .or_else(|| alias.and_then(|a| self.geometry.key_map.get(a)))
                .copied()
                .ok_or_else(|| DriverError::InvalidParams {
                    field: if field == "keys" {
                        format!("keys[{i}]")
                    } else {
                        "text".into()
                    },
                    message: format!("no key `{}` in this robot's key_map", name.escape_debug()),
                })?;
            spots.push((name.clone(), spot));
        }
        if req.cancel.is_cancelled() {
            return Err(DriverError::Cancelled(
                "cancelled before the first key".into(),
            ));
        }
        let started = Instant::now();
        let started_at = now_rfc3339();
        self.controller.transcript().restart();
        let mut presses = Vec::new();
        let mut pos = None;
        let total = spots.len();
        for (i, (name, spot)) in spots.into_iter().enumerate() {
            if i > 0 {
                // Between presses: the only place this action may stop.
                if req.cancel.is_cancelled() {
                    return Err(DriverError::Cancelled(format!(
                        "type_keys cancelled after {i} of {total} keys"
                    )));
                }
                if Instant::now() >= req.deadline {
                    return Err(DriverError::Timeout(started.elapsed().as_millis() as u64));
                }
            }
            let mut path = Vec::new();
            if i > 0 && interval > 0 {
                path.push(Motion::Dwell { ms: interval });
            }
            path.extend(self.geometry.press(spot.x_mm, spot.y_mm, hold));
            pos = Some(self.run(name, spot.x_mm, spot.y_mm, &path, &mut presses)?);
        }
        let summary = json!({ "keys_pressed": total, "hold_ms": hold, "interval_ms": interval });
        Ok(self.outcome(req.action, &started_at, &presses, pos, summary))
    }
}

/// Milliseconds from the first press's start to the last one's end.
fn span_ms(presses: &[Press]) -> f64 {
    match (presses.first(), presses.last()) {
        (Some(a), Some(b)) => round(b.finished_ms - a.started_ms, 1),
        _ => 0.0,
    }
}

impl Driver for RobotDriver {
    fn capability_type(&self) -> CapabilityType {
        CapabilityType::ThumbRobot
    }

    fn supported_actions(&self) -> Vec<CapabilityAction> {
        CapabilityType::ThumbRobot
            .supported_actions()
            .iter()
            .copied()
            .filter(|a| match a {
                CapabilityAction::TypeKeys => !self.geometry.key_map.is_empty(),
                CapabilityAction::PressHardwareButton => !self.geometry.buttons.is_empty(),
                _ => true,
            })
            .collect()
    }

    fn metadata(&self) -> Map<String, Value> {
        let mut targets = vec!["touchscreen"];
        if !self.geometry.buttons.is_empty() {
            targets.push("physical_button");
        }
        if !self.geometry.key_map.is_empty() {
            targets.push("keyboard");
        }
        let b = self.geometry.bounds;
        match json!({
            "robot_model": self.controller.model(),
            "axis_count": 3,
            "supported_targets": targets,
            "movement_precision_mm": self.geometry.precision_mm,
            "supports_long_press": true,
            "supports_drag": true,
            "bounds_mm": { "x_min": b.x_min, "x_max": b.x_max, "y_min": b.y_min, "y_max": b.y_max },
            "keys": self.geometry.key_map.keys().collect::<Vec<_>>(),
            "buttons": self.geometry.buttons.keys().collect::<Vec<_>>(),
            "backend": self.backend,
            "port_name": self.controller.port_name(),
        }) {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    fn health(&mut self) -> DriverHealth {
        self.controller.health()
    }

    /// Every gesture is non-interruptible except `type_keys`, which stops
    /// cleanly between two key presses.
    fn is_non_interruptible(&self, action: CapabilityAction, _params: &Map<String, Value>) -> bool {
        action != CapabilityAction::TypeKeys && action.non_interruptible_by_default()
    }

    fn execute(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        tracing::debug!(capability_id = %self.capability_id, action = %req.action, "robot action");
        let g = self.geometry.clone();
        match req.action {
            CapabilityAction::Tap => {
                let p: TapParams = parse_params_with_defaults(&req.params)?;
                g.check_xy("x_mm", "y_mm", p.x_mm, p.y_mm)?;
                let hold = check_ms("hold_ms", p.hold_ms, 0, 5000)?;
                let path = g.press(p.x_mm, p.y_mm, hold);
                let summary = json!({ "x_mm": p.x_mm, "y_mm": p.y_mm, "hold_ms": hold });
                self.tap_like(req, p.x_mm, p.y_mm, path, summary)
            }
            CapabilityAction::DoubleTap => {
                let p: DoubleTapParams = parse_params_with_defaults(&req.params)?;
                g.check_xy("x_mm", "y_mm", p.x_mm, p.y_mm)?;
                let hold = check_ms("hold_ms", p.hold_ms, 0, 5000)?;
                let interval = check_ms("interval_ms", p.interval_ms, 0, 2000)?;
                let mut path = g.press(p.x_mm, p.y_mm, hold);
                path.push(Motion::Dwell { ms: interval });
                path.extend(g.press(p.x_mm, p.y_mm, hold));
                let summary = json!({
                    "x_mm": p.x_mm, "y_mm": p.y_mm, "hold_ms": hold, "interval_ms": interval,
                });
                self.tap_like(req, p.x_mm, p.y_mm, path, summary)
            }
            CapabilityAction::LongPress => {
                let p: LongPressParams = parse_params_with_defaults(&req.params)?;
                g.check_xy("x_mm", "y_mm", p.x_mm, p.y_mm)?;
                let hold = check_ms("hold_ms", p.hold_ms, 100, 60_000)?;
                let path = g.press(p.x_mm, p.y_mm, hold);
                let summary = json!({ "x_mm": p.x_mm, "y_mm": p.y_mm, "hold_ms": hold });
                self.tap_like(req, p.x_mm, p.y_mm, path, summary)
            }
            CapabilityAction::Drag => {
                let p: DragParams = parse_params_with_defaults(&req.params)?;
                g.check_xy("x_mm", "y_mm", p.x_mm, p.y_mm)?;
                g.check_xy("to_x_mm", "to_y_mm", p.to_x_mm, p.to_y_mm)?;
                let hold = check_ms("hold_ms", p.hold_ms, 0, 5000)?;
                let speed = p.speed_mm_per_min.unwrap_or(g.feed_mm_per_min);
                if !(1.0..=50_000.0).contains(&speed) {
                    return Err(DriverError::InvalidParams {
                        field: "speed_mm_per_min".into(),
                        message: format!("{speed} is outside 1..=50000"),
                    });
                }
                let mut path = g.press(p.x_mm, p.y_mm, hold);
                let lift = path.pop();
                path.push(Motion::Linear {
                    x: Some(p.to_x_mm),
                    y: Some(p.to_y_mm),
                    z: None,
                    feed_mm_per_min: speed,
                });
                path.extend(lift);
                let summary = json!({
                    "x_mm": p.x_mm, "y_mm": p.y_mm, "to_x_mm": p.to_x_mm, "to_y_mm": p.to_y_mm,
                    "hold_ms": hold, "speed_mm_per_min": speed,
                    "distance_mm": round(((p.to_x_mm - p.x_mm).powi(2) + (p.to_y_mm - p.y_mm).powi(2)).sqrt(), 3),
                });
                self.tap_like(req, p.x_mm, p.y_mm, path, summary)
            }
            CapabilityAction::TypeKeys => {
                if g.key_map.is_empty() {
                    return Err(unsupported(
                        CapabilityType::ThumbRobot,
                        req.action,
                        "no key_map is configured for this robot",
                    ));
                }
                self.type_keys(req)
            }
            CapabilityAction::PressHardwareButton => {
                if g.buttons.is_empty() {
                    return Err(unsupported(
                        CapabilityType::ThumbRobot,
                        req.action,
                        "no buttons are configured for this robot",
                    ));
                }
                let p: ButtonParams = parse_params_with_defaults(&req.params)?;
                let spot = g.buttons.get(&p.button).copied().ok_or_else(|| {
                    DriverError::InvalidParams {
                        field: "button".into(),
                        message: format!(
                            "no button `{}`; configured: {}",
                            p.button,
                            g.buttons.keys().cloned().collect::<Vec<_>>().join(", ")
                        ),
                    }
                })?;
                let hold = check_ms("hold_ms", p.hold_ms, 0, 60_000)?;
                let path = g.press(spot.x_mm, spot.y_mm, hold);
                let summary = json!({
                    "button": p.button, "x_mm": spot.x_mm, "y_mm": spot.y_mm, "hold_ms": hold,
                });
                if req.cancel.is_cancelled() {
                    return Err(DriverError::Cancelled("cancelled before moving".into()));
                }
                let started_at = now_rfc3339();
                self.controller.transcript().restart();
                let mut presses = Vec::new();
                let pos = self.run(p.button.clone(), spot.x_mm, spot.y_mm, &path, &mut presses)?;
                Ok(self.outcome(req.action, &started_at, &presses, Some(pos), summary))
            }
            other => Err(unsupported(
                CapabilityType::ThumbRobot,
                other,
                "not a thumb robot action",
            )),
        }
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// What a table with only its required keys means; the expected text
    /// was taken from the code before the defaults moved into `Default`.
    #[test]
    fn a_minimal_table_takes_the_documented_defaults() {
        crate::drivers::defaults_pin::check::<TapParams>(
            serde_json::json!({"x_mm": 1.0, "y_mm": 2.0}),
            "TapParams { x_mm: 1.0, y_mm: 2.0, hold_ms: 100 }",
        );
        crate::drivers::defaults_pin::check::<DoubleTapParams>(
            serde_json::json!({"x_mm": 1.0, "y_mm": 2.0}),
            "DoubleTapParams { x_mm: 1.0, y_mm: 2.0, hold_ms: 80, interval_ms: 150 }",
        );
        crate::drivers::defaults_pin::check::<LongPressParams>(
            serde_json::json!({"x_mm": 1.0, "y_mm": 2.0}),
            "LongPressParams { x_mm: 1.0, y_mm: 2.0, hold_ms: 1000 }",
        );
        crate::drivers::defaults_pin::check::<DragParams>(
            serde_json::json!({"x_mm": 1.0, "y_mm": 2.0, "to_x_mm": 3.0, "to_y_mm": 4.0}),
            "DragParams { x_mm: 1.0, y_mm: 2.0, to_x_mm: 3.0, to_y_mm: 4.0, hold_ms: 100, speed_mm_per_min: None }",
        );
        crate::drivers::defaults_pin::check::<TypeKeysParams>(
            serde_json::json!({}),
            "TypeKeysParams { keys: None, text: None, hold_ms: 80, interval_ms: 100 }",
        );
        crate::drivers::defaults_pin::check::<ButtonParams>(
            serde_json::json!({"button": "power"}),
            "ButtonParams { button: \"power\", hold_ms: 200 }",
        );
    }
}
