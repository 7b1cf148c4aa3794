//! `grbl` backend: a GRBL 1.1 motion controller (Arduino + stepper shield)
//! over serial G-code.
//!
//! Getting ready, once per connection: wait for the `Grbl 1.1` banner the
//! controller prints after the port opens (the Arduino resets on DTR; a
//! soft reset, Ctrl-X, is sent if no banner comes), unlock with `$X` (or
//! home with `$H`, `home_on_connect = true`) when it reports the alarm
//! state, select millimetres and absolute coordinates (`G21 G90`) and lift
//! the stylus to the safe height.
//!
//! Running a path: one line at a time, each answered `ok` before the next
//! is sent; then `G4 P0` (answered only once every queued move has
//! finished) and `?` status polls until the report says `<Idle|...>`.
//! `error:N` and `ALARM:N` fail the action with GRBL's meaning of the code;
//! after an alarm the next action soft-resets and unlocks first.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::{path_seconds, Bounds, Geometry, Motion, MotionController, Spot};
use crate::drivers::transport::{
    bad_setting, printable, Endpoint, Link, SerialLine, Transcript, WaitError,
};
use crate::drivers::{Defaults, DriverConfigError, DriverError, DriverHealth, DriverSpec};

/// Bench TOML settings of `backend = "grbl"`.
///
/// ```toml
/// port = "/dev/serial/by-id/usb-1a86_USB2.0-Serial-if00-port0"
/// baud_rate = 115200
/// bounds_mm = { x_min = 0.0, x_max = 70.0, y_min = 0.0, y_max = 140.0 }
/// safe_z_mm = 10.0          # stylus clear of the screen
/// press_z_mm = 2.0          # stylus pressing
/// feed_mm_per_min = 1500.0  # 1..=50000, press and drag speed
/// rapid_mm_per_min = 3000.0 # the machine's G0 rate, for timeouts
/// boot_timeout_ms = 3000    # 200..=30000, wait for the banner
/// home_on_connect = false   # `$H` instead of `$X` when locked
/// movement_precision_mm = 0.1
/// robot_model = "Benchlink thumb v2"
/// [capabilities.driver.key_map]
/// a = { x_mm = 10.0, y_mm = 100.0 }
/// space = { x_mm = 35.0, y_mm = 120.0 }
/// [capabilities.driver.buttons]
/// power = { x_mm = 68.0, y_mm = 40.0 }
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrblSettings {
    pub port: String,
    pub baud_rate: u32,
    pub bounds_mm: Bounds,
    pub safe_z_mm: f64,
    pub press_z_mm: f64,
    pub feed_mm_per_min: f64,
    pub rapid_mm_per_min: f64,
    pub boot_timeout_ms: u64,
    pub home_on_connect: bool,
    pub movement_precision_mm: f64,
    pub robot_model: Option<String>,
    pub key_map: BTreeMap<String, Spot>,
    pub buttons: BTreeMap<String, Spot>,
}

impl Default for GrblSettings {
    /// The documented defaults (the simulator shares its motion ones); the
    /// keys of [`Defaults::REQUIRED`] have none (placeholders here).
    fn default() -> Self {
        Self {
            port: String::new(),
            baud_rate: 115_200,
            bounds_mm: Bounds::UNSET,
            safe_z_mm: 0.0,
            press_z_mm: 0.0,
            feed_mm_per_min: 1500.0,
            rapid_mm_per_min: 3000.0,
            boot_timeout_ms: 3000,
            home_on_connect: false,
            movement_precision_mm: 0.1,
            robot_model: None,
            key_map: BTreeMap::new(),
            buttons: BTreeMap::new(),
        }
    }
}

impl Defaults for GrblSettings {
    const REQUIRED: &'static [&'static str] = &["port", "bounds_mm", "safe_z_mm", "press_z_mm"];
}

/// Longest an action waits for the port to (re)open.
const OPEN_WAIT: Duration = Duration::from_secs(2);
/// How long a `$`-command or mode line may take to be acknowledged.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a `$H` homing cycle may take.
const HOMING_TIMEOUT: Duration = Duration::from_secs(60);
/// Slack on top of a path's computed duration before giving up on it.
const PATH_SLACK: Duration = Duration::from_secs(5);
/// Pause between `?` status polls.
const STATUS_POLL: Duration = Duration::from_millis(20);

/// GRBL 1.1's meaning of `error:N`.
pub fn error_meaning(code: u32) -> &'static str {
    match code {
        1 => "G-code words must start with a letter",
        2 => "missing or malformed number",
        3 => "unrecognised '$' system command",
        4 => "negative value where a positive one is required",
        5 => "homing cycle is not enabled",
        6 => "step pulse time must be at least 3 microseconds",
        7 => "EEPROM read failed; settings restored to defaults",
        8 => "'$' command needs the controller to be idle",
        9 => "G-code is locked out in the alarm or jog state",
        10 => "soft limits need homing to be enabled",
        11 => "line too long",
        12 => "setting exceeds the maximum step rate",
        13 => "safety door is open",
        14 => "build info or startup line too long for EEPROM",
        15 => "jog target exceeds the machine travel",
        16 => "invalid jog command",
        17 => "laser mode needs PWM output",
        20 => "unsupported or invalid G-code command",
        21 => "two commands of the same modal group in one line",
        22 => "feed rate not set",
        23 => "command needs an integer value",
        24 => "two commands in one line need axis words",
        25 => "G-code word repeated in the line",
        26 => "no axis words in a command that needs them",
        27 => "invalid line number",
        28 => "command is missing a required value word",
        29 => "G59.x work coordinate systems are not supported",
        30 => "G53 is only allowed with G0 and G1",
        31 => "axis words in a block where no command uses them",
        32 => "arc needs an in-plane axis word",
        33 => "motion target is invalid",
        34 => "arc radius is invalid",
        35 => "arc needs an in-plane offset word",
        36 => "unused value words in the block",
        37 => "tool length offset is not on the tool length axis",
        38 => "tool number too large",
        _ => "unknown error code",
    }
}

/// GRBL 1.1's meaning of `ALARM:N`.
pub fn alarm_meaning(code: u32) -> &'static str {
    match code {
        1 => "hard limit switch triggered; position lost",
        2 => "soft limit: motion target exceeds the machine travel",
        3 => "reset while in motion; position lost",
        4 => "probe was not in the expected state before probing",
        5 => "probe did not make contact",
        6 => "homing failed: reset during the homing cycle",
        7 => "homing failed: safety door opened during homing",
        8 => "homing failed: pull-off did not clear the limit switch",
        9 => "homing failed: limit switch not found",
        _ => "unknown alarm code",
    }
}

/// A complete reply line of interest.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    Ok,
    Error(u32),
    Alarm(u32),
    /// The startup banner: the controller reset.
    Banner,
}

/// The first `ok` / `error:N` / `ALARM:N` / banner among the complete lines
/// of `d`, with the raw line. Status reports and `[...]` messages are skipped.
fn first_reply(d: &[u8]) -> Option<(Reply, Vec<u8>)> {
    let complete = d.iter().rposition(|&b| b == b'\n')?;
    for raw in d[..complete].split(|&b| b == b'\n') {
        let line = String::from_utf8_lossy(raw);
        let line = line.trim();
        let reply = if line == "ok" {
            Reply::Ok
        } else if let Some(n) = line.strip_prefix("error:") {
            Reply::Error(n.trim().parse().unwrap_or(0))
        } else if let Some(n) = line.strip_prefix("ALARM:") {
            Reply::Alarm(n.trim().parse().unwrap_or(0))
        } else if line.starts_with("Grbl ") {
            Reply::Banner
        } else {
            continue;
        };
        return Some((reply, raw.to_vec()));
    }
    None
}

/// Parses a status report `<Idle|MPos:1.000,2.000,3.000|FS:0,0>` into the
/// state name (`Idle`, `Run`, `Alarm`, `Hold`, ...) and the position.
fn parse_status(line: &str) -> Option<(String, Option<[f64; 3]>)> {
    let inner = line.trim().strip_prefix('<')?.strip_suffix('>')?;
    let mut fields = inner.split('|');
    let state = fields.next()?.split(':').next()?.to_string();
    let pos = fields
        .filter_map(|f| f.strip_prefix("MPos:").or_else(|| f.strip_prefix("WPos:")))
        .find_map(|p| {
            let v: Vec<f64> = p.split(',').filter_map(|n| n.parse().ok()).collect();
            (v.len() >= 3).then(|| [v[0], v[1], v[2]])
        });
    Some((state, pos))
}

/// A GRBL controller on a serial [`Link`].
#[derive(Debug)]
pub struct Grbl {
    link: Link,
    port: String,
    geometry: Geometry,
    rapid_mm_per_min: f64,
    boot_timeout: Duration,
    home_on_connect: bool,
    model: String,
    transcript: Transcript,
    /// Connection generation that was prepared for motion.
    ready: u64,
    /// An alarm or lost acknowledgement: soft-reset before the next motion.
    needs_reset: bool,
    /// Last reported position (mm).
    position: Option<[f64; 3]>,
}

impl Grbl {
    /// Parses and checks the settings; does not open the port.
    pub fn from_spec(spec: &DriverSpec) -> Result<(Self, Geometry), DriverConfigError> {
        let s: GrblSettings = spec.parse()?;
        let line = SerialLine::new(s.port.clone(), s.baud_rate);
        line.check(spec)?;
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
        if !(200..=30_000).contains(&s.boot_timeout_ms) {
            return Err(bad_setting(
                spec,
                "boot_timeout_ms",
                format!("{} is outside 200..=30000", s.boot_timeout_ms),
            ));
        }
        Ok((
            Grbl {
                link: Link::new(Endpoint::Serial(line), 64 * 1024),
                port: s.port,
                geometry: geometry.clone(),
                rapid_mm_per_min: s.rapid_mm_per_min,
                boot_timeout: Duration::from_millis(s.boot_timeout_ms),
                home_on_connect: s.home_on_connect,
                model: s
                    .robot_model
                    .unwrap_or_else(|| "GRBL 1.1 XYZ gantry".to_string()),
                transcript: Transcript::new(),
                ready: 0,
                needs_reset: false,
                position: None,
            },
            geometry,
        ))
    }

    /// Sends one line and waits for its `ok` (until `deadline`).
    fn send_line(&mut self, line: &str, deadline: Instant) -> Result<(), DriverError> {
        let capture = self.link.capture().clone();
        let from = capture.end();
        self.link.write(format!("{line}\n").as_bytes())?;
        self.transcript.tx(line);
        match capture.wait_for(from, deadline, None, |_, d| first_reply(d)) {
            Ok((reply, raw)) => {
                self.transcript.rx(raw.trim_ascii_end());
                match reply {
                    Reply::Ok => Ok(()),
                    Reply::Error(n) => Err(DriverError::Device(format!(
                        "GRBL on {} answered `{line}` with error:{n} ({})",
                        self.port,
                        error_meaning(n)
                    ))),
                    Reply::Alarm(n) => {
                        self.needs_reset = true;
                        Err(DriverError::Device(format!(
                            "GRBL on {} raised ALARM:{n} ({}) on `{line}`; it is locked until reset",
                            self.port,
                            alarm_meaning(n)
                        )))
                    }
                    Reply::Banner => {
                        self.ready = 0;
                        Err(DriverError::Device(format!(
                            "GRBL on {} reset itself while running `{line}`",
                            self.port
                        )))
                    }
                }
            }
            Err(WaitError::Timeout) => {
                self.needs_reset = true;
                let (_, got) = capture.bytes_from(from);
                Err(DriverError::Device(format!(
                    "GRBL on {} did not acknowledge `{line}` (got \"{}\")",
                    self.port,
                    printable(&got)
                )))
            }
            Err(WaitError::Lost(why)) => Err(DriverError::Unavailable(why)),
            Err(WaitError::Cancelled) => Err(DriverError::Cancelled(line.into())),
        }
    }

    /// Sends the `?` real-time query and parses the status report.
    fn status(&mut self) -> Result<(String, Option<[f64; 3]>), DriverError> {
        let capture = self.link.capture().clone();
        let from = capture.end();
        self.link.write(b"?")?;
        let found = capture.wait_for(from, Instant::now() + COMMAND_TIMEOUT, None, |_, d| {
            let complete = d.iter().rposition(|&b| b == b'\n')?;
            d[..complete].split(|&b| b == b'\n').find_map(|raw| {
                let line = String::from_utf8_lossy(raw);
                parse_status(&line).map(|s| (s, raw.to_vec()))
            })
        });
        match found {
            Ok((status, raw)) => {
                self.transcript.tx("?");
                self.transcript.rx(raw.trim_ascii_end());
                Ok(status)
            }
            Err(WaitError::Timeout) => Err(DriverError::Device(format!(
                "GRBL on {} sent no status report for `?`",
                self.port
            ))),
            Err(WaitError::Lost(why)) => Err(DriverError::Unavailable(why)),
            Err(WaitError::Cancelled) => Err(DriverError::Cancelled("status".into())),
        }
    }

    /// Polls `?` until the controller reports `Idle`; returns the position.
    fn wait_idle(&mut self, deadline: Instant) -> Result<[f64; 3], DriverError> {
        loop {
            let (state, pos) = self.status()?;
            if state == "Idle" {
                return pos.ok_or_else(|| {
                    DriverError::Device(format!("GRBL on {} reported no position", self.port))
                });
            }
            if state == "Alarm" {
                self.needs_reset = true;
                return Err(DriverError::Device(format!(
                    "GRBL on {} is in the alarm state",
                    self.port
                )));
            }
            if Instant::now() >= deadline {
                return Err(DriverError::Device(format!(
                    "GRBL on {} still `{state}` when the move should have ended",
                    self.port
                )));
            }
            std::thread::sleep(STATUS_POLL);
        }
    }

    /// Waits for the banner from `from`; returns false on timeout.
    fn await_banner(&mut self, from: u64) -> Result<bool, DriverError> {
        let capture = self.link.capture().clone();
        let deadline = Instant::now() + self.boot_timeout;
        let found = capture.wait_for(from, deadline, None, |_, d| {
            let at = d.windows(8).position(|w| w == b"Grbl 1.1")?;
            let end = d[at..].iter().position(|&b| b == b'\n').map(|e| at + e)?;
            Some(d[at..end].to_vec())
        });
        match found {
            Ok(banner) => {
                self.transcript.rx(banner.trim_ascii_end());
                Ok(true)
            }
            Err(WaitError::Timeout) => Ok(false),
            Err(WaitError::Lost(why)) => Err(DriverError::Unavailable(why)),
            Err(WaitError::Cancelled) => Err(DriverError::Cancelled("banner".into())),
        }
    }

    fn soft_reset(&mut self) -> Result<u64, DriverError> {
        let from = self.link.capture().end();
        self.link.write(&[0x18])?;
        self.transcript.tx([0x18]);
        Ok(from)
    }

    /// Makes the controller ready for motion (see the module docs).
    fn prepare(&mut self) -> Result<(), DriverError> {
        let generation = self.link.ensure_open(OPEN_WAIT)?;
        if generation == self.ready && !self.needs_reset {
            return Ok(());
        }
        self.transcript.note("preparing the controller");
        let mut reset_sent = false;
        let from = if self.needs_reset {
            reset_sent = true;
            self.soft_reset()?
        } else {
            // The banner printed when the port opened (DTR reset).
            self.link.capture().open_offset()
        };
        if !self.await_banner(from)? {
            if reset_sent {
                let why = format!(
                    "no `Grbl 1.1` banner from {} within {} ms of a soft reset",
                    self.port,
                    self.boot_timeout.as_millis()
                );
                self.link.identity_failed(&why);
                return Err(DriverError::Unavailable(why));
            }
            self.transcript
                .note("no banner after opening; sending a soft reset");
            let from = self.soft_reset()?;
            if !self.await_banner(from)? {
                let why = format!(
                    "no `Grbl 1.1` banner from {} (is it a GRBL 1.1 controller at this baud rate?)",
                    self.port
                );
                self.link.identity_failed(&why);
                return Err(DriverError::Unavailable(why));
            }
        }
        self.link.identity_confirmed();
        self.needs_reset = false;
        let (state, _) = self.status()?;
        if state == "Alarm" {
            if self.home_on_connect {
                self.send_line("$H", Instant::now() + HOMING_TIMEOUT)?;
            } else {
                self.send_line("$X", Instant::now() + COMMAND_TIMEOUT)?;
            }
        }
        self.send_line("G21 G90", Instant::now() + COMMAND_TIMEOUT)?;
        let lift = Motion::Rapid {
            x: None,
            y: None,
            z: Some(self.geometry.safe_z_mm),
        };
        let deadline = Instant::now() + PATH_SLACK;
        self.send_line(&lift.gcode(), deadline)?;
        self.send_line("G4 P0", deadline)?;
        self.position = Some(self.wait_idle(deadline)?);
        self.ready = generation;
        Ok(())
    }
}

impl MotionController for Grbl {
    fn port_name(&self) -> String {
        self.port.clone()
    }

    fn model(&self) -> String {
        self.model.clone()
    }

    fn run(&mut self, path: &[Motion]) -> Result<[f64; 3], DriverError> {
        self.prepare()?;
        let b = self.geometry.bounds;
        let start = self
            .position
            .unwrap_or([b.x_min, b.y_min, self.geometry.safe_z_mm]);
        let seconds = path_seconds(path, start, self.rapid_mm_per_min);
        // The path is never abandoned half-way for the action's deadline: the
        // stylus must come up. This bound only catches a stalled controller.
        let deadline = Instant::now() + Duration::from_secs_f64(seconds * 2.0) + PATH_SLACK;
        for m in path {
            if let Err(e) = self.send_line(&m.gcode(), deadline) {
                if !self.needs_reset && matches!(e, DriverError::Device(_)) {
                    // A rejected line must not leave the stylus down.
                    self.transcript.note("lifting the stylus after the error");
                    let lift = Motion::Rapid {
                        x: None,
                        y: None,
                        z: Some(self.geometry.safe_z_mm),
                    };
                    let _ = self.send_line(&lift.gcode(), deadline);
                }
                return Err(e);
            }
        }
        self.send_line("G4 P0", deadline)?;
        let pos = self.wait_idle(deadline)?;
        self.position = Some(pos);
        Ok(pos)
    }

    fn health(&mut self) -> DriverHealth {
        let h = self.link.health();
        if h != DriverHealth::healthy() {
            return h;
        }
        if self.ready != self.link.capture().generation() || self.needs_reset {
            if let Err(e) = self.prepare() {
                return DriverHealth::unhealthy(format!("{}: {e}", self.port));
            }
        }
        DriverHealth::healthy()
    }

    fn transcript(&mut self) -> &mut Transcript {
        &mut self.transcript
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_reports_parse_into_state_and_position() {
        assert_eq!(
            parse_status("<Idle|MPos:10.000,20.500,3.000|FS:0,0>"),
            Some(("Idle".to_string(), Some([10.0, 20.5, 3.0])))
        );
        assert_eq!(
            parse_status("<Hold:0|WPos:1,2,3|FS:0,0>").map(|s| s.0),
            Some("Hold".to_string())
        );
        assert_eq!(parse_status("ok"), None);
    }

    #[test]
    fn replies_skip_status_reports_and_messages() {
        let d = b"<Run|MPos:0,0,0|FS:0,0>\r\n[MSG:Caution: Unlocked]\r\nok\r\n";
        assert_eq!(first_reply(d).map(|r| r.0), Some(Reply::Ok));
        assert_eq!(
            first_reply(b"error:9\r\n").map(|r| r.0),
            Some(Reply::Error(9))
        );
        assert_eq!(
            first_reply(b"ok"),
            None,
            "an unterminated line is not a reply yet"
        );
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// What a table with only its required keys means; the expected text
    /// was taken from the code before the defaults moved into `Default`.
    #[test]
    fn a_minimal_table_takes_the_documented_defaults() {
        crate::drivers::defaults_pin::check::<GrblSettings>(
            serde_json::json!({"port": "/dev/ttyUSB0", "bounds_mm": {"x_min": 0.0, "x_max": 70.0, "y_min": 0.0, "y_max": 140.0}, "safe_z_mm": 10.0, "press_z_mm": 2.0}),
            "GrblSettings { port: \"/dev/ttyUSB0\", baud_rate: 115200, bounds_mm: Bounds { x_min: 0.0, x_max: 70.0, y_min: 0.0, y_max: 140.0 }, safe_z_mm: 10.0, press_z_mm: 2.0, feed_mm_per_min: 1500.0, rapid_mm_per_min: 3000.0, boot_timeout_ms: 3000, home_on_connect: false, movement_precision_mm: 0.1, robot_model: None, key_map: {}, buttons: {} }",
        );
    }
}
