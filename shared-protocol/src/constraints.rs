//! Device constraints: the limits an edge declares for a capability in its
//! `constraints_json` (docs/policy.md "Device constraints"), and the check
//! of an action's params against them. The registry runs the check before
//! it sends a command; the edge runs it again before its driver sees one.
//!
//! | key | type | applies to | checked params |
//! |---|---|---|---|
//! | `max_voltage_v` | number, V | `programmable_power_supply` | `voltage_v` of `set_voltage`, `power_on` |
//! | `max_current_a` | number, A | `programmable_power_supply` | `current_limit_a` of `set_current_limit`, `power_on` |
//! | `work_area_mm` | `{x_min, x_max, y_min, y_max}`, mm | `thumb_robot` | `x_mm`, `y_mm` (and `to_x_mm`, `to_y_mm` of `drag`) of `tap`, `double_tap`, `long_press`, `drag`, `press_hardware_button` |

use serde_json::{json, Map, Value};

use crate::capability::{CapabilityAction, CapabilityType};

/// Every constraint key this version knows, with the capability type it
/// applies to.
pub const KNOWN: [(&str, CapabilityType); 3] = [
    ("max_voltage_v", CapabilityType::ProgrammablePowerSupply),
    ("max_current_a", CapabilityType::ProgrammablePowerSupply),
    ("work_area_mm", CapabilityType::ThumbRobot),
];

/// A rectangle in the robot's frame, millimetres; both ends included.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkArea {
    pub x_min: f64,
    pub x_max: f64,
    pub y_min: f64,
    pub y_max: f64,
}

impl WorkArea {
    fn to_json(self) -> Value {
        json!({"x_min": self.x_min, "x_max": self.x_max, "y_min": self.y_min, "y_max": self.y_max})
    }
}

/// The known constraints of one capability; `None` is "no such limit".
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Constraints {
    /// Highest `voltage_v` a PSU may be set to, V.
    pub max_voltage_v: Option<f64>,
    /// Highest `current_limit_a` a PSU may be set to, A.
    pub max_current_a: Option<f64>,
    /// Where a thumb robot may press, mm.
    pub work_area_mm: Option<WorkArea>,
}

/// One action param outside one constraint. `Display` is the message a
/// caller sees, naming the constraint.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{param}` = {value} is outside the capability's constraint `{constraint}` ({}); nothing was sent", limit_text(.limit))]
pub struct ConstraintViolation {
    /// The constraint key, e.g. `max_voltage_v`.
    pub constraint: &'static str,
    /// The constraint's value: a number, or the work area object.
    pub limit: Value,
    /// The offending param's value.
    pub value: f64,
    /// The offending param, e.g. `voltage_v`.
    pub param: String,
}

fn limit_text(limit: &Value) -> String {
    match limit {
        Value::Object(m) => format!(
            "x {}..={}, y {}..={}",
            m.get("x_min").unwrap_or(&Value::Null),
            m.get("x_max").unwrap_or(&Value::Null),
            m.get("y_min").unwrap_or(&Value::Null),
            m.get("y_max").unwrap_or(&Value::Null)
        ),
        other => format!("at most {other}"),
    }
}

/// A finite, non-negative number, or why not.
fn limit_number(v: &Value) -> Result<f64, String> {
    match v.as_f64() {
        Some(n) if n.is_finite() && n >= 0.0 => Ok(n),
        Some(n) => Err(format!("must be a number >= 0, got {n}")),
        None => Err(format!("expected a number, got {v}")),
    }
}

fn work_area(v: &Value) -> Result<WorkArea, String> {
    let Some(m) = v.as_object() else {
        return Err(format!(
            "expected a table {{x_min, x_max, y_min, y_max}} in mm, got {v}"
        ));
    };
    if let Some(k) = m
        .keys()
        .find(|k| !["x_min", "x_max", "y_min", "y_max"].contains(&k.as_str()))
    {
        return Err(format!(
            "unknown key `{k}`; expected x_min, x_max, y_min, y_max"
        ));
    }
    let get = |k: &str| match m.get(k).and_then(Value::as_f64) {
        Some(n) if n.is_finite() => Ok(n),
        _ => Err(format!("`{k}` must be a number (mm)")),
    };
    let a = WorkArea {
        x_min: get("x_min")?,
        x_max: get("x_max")?,
        y_min: get("y_min")?,
        y_max: get("y_max")?,
    };
    if a.x_min > a.x_max || a.y_min > a.y_max {
        return Err("x_min must be <= x_max and y_min <= y_max".into());
    }
    Ok(a)
}

impl Constraints {
    /// The known constraints in `json` (a capability's `constraints_json`).
    /// Unknown keys, and known keys whose value has the wrong shape, are
    /// ignored: a newer edge may declare limits this version does not know.
    pub fn from_json(json: &Map<String, Value>) -> Self {
        Self {
            max_voltage_v: json.get("max_voltage_v").and_then(|v| limit_number(v).ok()),
            max_current_a: json.get("max_current_a").and_then(|v| limit_number(v).ok()),
            work_area_mm: json.get("work_area_mm").and_then(|v| work_area(v).ok()),
        }
    }

    /// The constraints of `json` declared for a capability of type `kind`,
    /// strictly: every key must be one of [`KNOWN`], apply to `kind` and
    /// have its shape.
    ///
    /// Errors: one `(key, message)` per wrong key.
    pub fn parse_strict(
        kind: CapabilityType,
        json: &Map<String, Value>,
    ) -> Result<Self, Vec<(String, String)>> {
        let mut issues = Vec::new();
        for (key, value) in json {
            let Some((_, applies)) = KNOWN.iter().find(|(k, _)| k == key) else {
                issues.push((
                    key.clone(),
                    format!(
                        "unknown constraint; known: {}",
                        KNOWN.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
                    ),
                ));
                continue;
            };
            if *applies != kind {
                issues.push((
                    key.clone(),
                    format!("applies to {applies} capabilities, not to {kind}"),
                ));
                continue;
            }
            let checked = match key.as_str() {
                "work_area_mm" => work_area(value).map(|_| ()),
                _ => limit_number(value).map(|_| ()),
            };
            if let Err(m) = checked {
                issues.push((key.clone(), m));
            }
        }
        if issues.is_empty() {
            Ok(Self::from_json(json))
        } else {
            Err(issues)
        }
    }

    /// True when no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Check `action` with `params` against these limits. A param that is
    /// absent or not a number is not checked here (the driver refuses a
    /// wrong type).
    ///
    /// Errors: the first param outside a limit.
    pub fn check(
        &self,
        action: CapabilityAction,
        params: &Map<String, Value>,
    ) -> Result<(), ConstraintViolation> {
        use CapabilityAction::*;
        let num = |k: &str| params.get(k).and_then(Value::as_f64);
        let at_most =
            |constraint: &'static str, limit: Option<f64>, param: &str| match (limit, num(param)) {
                (Some(limit), Some(value)) if value > limit => Err(ConstraintViolation {
                    constraint,
                    limit: json!(limit),
                    value,
                    param: param.to_string(),
                }),
                _ => Ok(()),
            };
        match action {
            SetVoltage => at_most("max_voltage_v", self.max_voltage_v, "voltage_v"),
            SetCurrentLimit => at_most("max_current_a", self.max_current_a, "current_limit_a"),
            PowerOn => {
                at_most("max_voltage_v", self.max_voltage_v, "voltage_v")?;
                at_most("max_current_a", self.max_current_a, "current_limit_a")
            }
            Tap | DoubleTap | LongPress | Drag | PressHardwareButton => {
                let Some(area) = self.work_area_mm else {
                    return Ok(());
                };
                let axes: &[(&str, f64, f64)] = &[
                    ("x_mm", area.x_min, area.x_max),
                    ("y_mm", area.y_min, area.y_max),
                    ("to_x_mm", area.x_min, area.x_max),
                    ("to_y_mm", area.y_min, area.y_max),
                ];
                for &(param, lo, hi) in axes {
                    if let Some(value) = num(param) {
                        if value < lo || value > hi {
                            return Err(ConstraintViolation {
                                constraint: "work_area_mm",
                                limit: area.to_json(),
                                value,
                                param: param.to_string(),
                            });
                        }
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn a_voltage_above_the_ceiling_names_the_constraint() {
        let c = Constraints::from_json(&map(json!({"max_voltage_v": 5.5, "future_key": 1})));
        let params = map(json!({"voltage_v": 9.0}));
        let err = c.check(CapabilityAction::SetVoltage, &params).unwrap_err();
        assert_eq!(err.constraint, "max_voltage_v");
        assert_eq!(err.param, "voltage_v");
        assert_eq!(err.value, 9.0);
        assert_eq!(err.limit, json!(5.5));
        assert!(err.to_string().contains("max_voltage_v"), "{err}");
        assert!(c
            .check(
                CapabilityAction::SetVoltage,
                &map(json!({"voltage_v": 5.5}))
            )
            .is_ok());
        let on = map(json!({"voltage_v": 6.0}));
        assert!(c.check(CapabilityAction::PowerOn, &on).is_err());
        // Reads are never checked.
        assert!(c.check(CapabilityAction::MeasureOutput, &on).is_ok());
    }

    #[test]
    fn a_press_outside_the_work_area_is_refused_on_any_axis() {
        let c = Constraints::from_json(&map(
            json!({"work_area_mm": {"x_min": 10.0, "x_max": 60.0, "y_min": 0.0, "y_max": 100.0}}),
        ));
        assert!(c
            .check(
                CapabilityAction::Tap,
                &map(json!({"x_mm": 35.0, "y_mm": 70.0}))
            )
            .is_ok());
        let err = c
            .check(
                CapabilityAction::Tap,
                &map(json!({"x_mm": 5.0, "y_mm": 70.0})),
            )
            .unwrap_err();
        assert_eq!(
            (err.constraint, err.param.as_str()),
            ("work_area_mm", "x_mm")
        );
        let drag = map(json!({"x_mm": 35.0, "y_mm": 70.0, "to_x_mm": 35.0, "to_y_mm": 120.0}));
        let err = c.check(CapabilityAction::Drag, &drag).unwrap_err();
        assert_eq!(err.param, "to_y_mm");
    }

    #[test]
    fn the_strict_parse_refuses_unknown_misplaced_and_malformed_keys() {
        let psu = CapabilityType::ProgrammablePowerSupply;
        assert!(Constraints::parse_strict(psu, &map(json!({"max_voltage_v": 5}))).is_ok());
        let issues = Constraints::parse_strict(
            psu,
            &map(json!({"max_volts": 5, "work_area_mm": {}, "max_current_a": -1})),
        )
        .unwrap_err();
        let keys: Vec<&str> = issues.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["max_current_a", "max_volts", "work_area_mm"],
            "{issues:?}"
        );
        let robot = CapabilityType::ThumbRobot;
        let bad =
            map(json!({"work_area_mm": {"x_min": 5.0, "x_max": 1.0, "y_min": 0.0, "y_max": 1.0}}));
        assert!(Constraints::parse_strict(robot, &bad).is_err());
        // The registry's lenient read ignores what it cannot use.
        assert!(Constraints::from_json(&bad).is_empty());
    }
}
