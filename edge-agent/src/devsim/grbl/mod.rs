//! GRBL 1.1h motion controller (Arduino + CNC shield) driving a thumb robot.
//!
//! Wire format, 115200 8N1 (the pty ignores the baud rate):
//! - On power-up and whenever a program opens the port (the Arduino resets
//!   on DTR) the controller prints, after [`GrblConfig::boot_delay`],
//!   `\r\nGrbl 1.1h ['$' for help]\r\n`; with homing enabled it starts in
//!   the alarm state and adds `[MSG:'$H'|'$X' to unlock]\r\n`.
//! - Lines end with `\n` (or `\r`). Each line gets exactly one reply line,
//!   `ok\r\n` or `error:N\r\n`. Motion lines are answered as soon as they
//!   are queued in the 15-block planner (before the move ends); `G4` and
//!   `$H` are answered when the dwell or homing has finished, so `G4 P0`
//!   is the way to wait for motion to end.
//! - Real-time bytes act at once, even mid-line: `?` → status report
//!   `<Idle|MPos:10.000,20.000,0.000|FS:0,0>\r\n` (states `Idle`, `Run`,
//!   `Jog`, `Home`, `Alarm`; `FS:` = current feed mm/min, spindle);
//!   `0x18` (Ctrl-X) = soft reset (stops motion, flushes queued lines,
//!   prints the banner; resetting while moving raises `ALARM:3`).
//!   Feed hold `!`, resume `~` and overrides are not simulated.
//!
//! Supported G-code: `G0`, `G1 X.. Y.. Z.. F..` (mm/min), `G4 P<s>`,
//! `G90`/`G91`, `G21`/`G20`, `G53`, `G17`/`G54`/`G94` (defaults), `M0-M9`
//! and `M30` (no effect), words `N`, `S`, `T` (ignored). Arcs, probing,
//! offsets (`G92`) and others get `error:20`. System commands: `$` (help),
//! `$$` (settings), `$N=value` (`$20 $22 $25 $110-$112 $130-$132` change
//! the simulation; the other GRBL 1.1 settings are accepted without
//! effect), `$G`, `$I`, `$H` (homing), `$X` (unlock), `$J=G91 X1 F500`
//! (jog); other `$` commands get `error:3`, and `$` commands while moving
//! `error:8`.
//!
//! Soft limits (`$20=1`): the travel is `travel_min_mm..=travel_max_mm` per
//! axis in machine coordinates. A G0/G1 target outside it raises
//! `ALARM:2` then `[MSG:Reset to continue]`: the line gets no `ok`, all
//! later lines are ignored until a soft reset, after which the controller
//! is in alarm until `$X` or `$H`. A jog outside it only gets `error:15`.
//! In the alarm state G-code and jogs get `error:9`.
//!
//! Timing: a move lasts distance / feed (rapids at the axes' `$110-$112`
//! rates) divided by [`GrblConfig::time_scale`], capped at
//! [`GrblConfig::max_move_time`]; dwells and homing are scaled alike. Every
//! executed move, dwell and homing cycle is recorded ([`GrblMove`]).
//!
//! The Arduino is USB-powered: after [`super::Simulator::vanish`] it boots
//! afresh (position 0, not homed) when it comes back.

mod gcode;

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use self::gcode::*;
use super::{lock, DevSimError, Device, Simulator};

/// The startup banner, with its leading and trailing line breaks.
pub const GRBL_BANNER: &str = "\r\nGrbl 1.1h ['$' for help]\r\n";

/// Planner buffer depth of GRBL 1.1h on an ATmega328p.
const PLANNER_BLOCKS: usize = 15;

/// Lines received and not yet answered beyond which input is dropped (the
/// real controller's 128-byte serial buffer would overflow first).
const RX_LINES_MAX: usize = 64;

/// Settings of a simulated GRBL controller.
#[derive(Debug, Clone)]
pub struct GrblConfig {
    /// Lowest machine coordinate per axis X, Y, Z (mm).
    pub travel_min_mm: [f64; 3],
    /// Highest machine coordinate per axis X, Y, Z (mm).
    pub travel_max_mm: [f64; 3],
    /// `$20`: reject targets outside the travel with `ALARM:2`.
    pub soft_limits: bool,
    /// `$22`: homing cycle enabled; the controller starts locked in alarm.
    pub homing_enabled: bool,
    /// Where `$H` leaves the machine (mm).
    pub home_mm: [f64; 3],
    /// `$25`: homing seek rate (mm/min).
    pub homing_feed_mm_min: f64,
    /// `$110-$112`: maximum rate per axis (mm/min); rapids run at these.
    pub max_rate_mm_min: [f64; 3],
    /// Simulated time runs this many times faster than real time
    /// (1.0 = real time; 20.0 makes a 1 s move take 50 ms). Must be > 0.
    pub time_scale: f64,
    /// Upper bound on one simulated move's duration (after scaling).
    pub max_move_time: Option<Duration>,
    /// Reset (reboot) whenever a program opens the port, like an Arduino
    /// Uno with DTR auto-reset.
    pub reset_on_open: bool,
    /// Time from power-up/reset to the banner (the real bootloader takes
    /// ~1.5 s; default 50 ms).
    pub boot_delay: Duration,
}

impl Default for GrblConfig {
    fn default() -> Self {
        GrblConfig {
            travel_min_mm: [0.0, 0.0, 0.0],
            travel_max_mm: [100.0, 160.0, 20.0],
            soft_limits: true,
            homing_enabled: true,
            home_mm: [0.0, 0.0, 0.0],
            homing_feed_mm_min: 1500.0,
            max_rate_mm_min: [6000.0, 6000.0, 3000.0],
            time_scale: 1.0,
            max_move_time: None,
            reset_on_open: true,
            boot_delay: Duration::from_millis(50),
        }
    }
}

/// GRBL's machine state, as named in `?` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrblStatus {
    /// Nothing moving, ready.
    Idle,
    /// Executing G0/G1 motion.
    Run,
    /// Executing a `$J=` jog.
    Jog,
    /// Running the `$H` homing cycle.
    Home,
    /// Locked: needs `$X`/`$H` (or, after `ALARM:2`, a reset first).
    Alarm,
    /// Between power-up/reset and the banner; input is not read.
    Booting,
}

impl GrblStatus {
    fn report_name(self) -> &'static str {
        match self {
            GrblStatus::Idle | GrblStatus::Booting => "Idle",
            GrblStatus::Run => "Run",
            GrblStatus::Jog => "Jog",
            GrblStatus::Home => "Home",
            GrblStatus::Alarm => "Alarm",
        }
    }
}

/// What kind of motion a [`GrblMove`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveKind {
    /// G0.
    Rapid,
    /// G1.
    Linear,
    /// `$J=` jog.
    Jog,
    /// G4; `from_mm == to_mm`.
    Dwell,
    /// `$H` homing cycle.
    Home,
}

/// One executed motion, dwell or homing cycle.
#[derive(Debug, Clone, PartialEq)]
pub struct GrblMove {
    /// Kind of motion.
    pub kind: MoveKind,
    /// Machine position at the start (mm).
    pub from_mm: [f64; 3],
    /// Machine position at the end (mm).
    pub to_mm: [f64; 3],
    /// Feed rate used (mm/min; 0 for dwells).
    pub feed_mm_min: f64,
    /// Requested dwell (s) for G4; 0 otherwise.
    pub dwell_s: f64,
    /// When the motion started.
    pub started_at: Instant,
    /// When it finished.
    pub finished_at: Instant,
}

/// Snapshot of a simulated GRBL controller.
#[derive(Debug, Clone, PartialEq)]
pub struct GrblState {
    /// Current machine state.
    pub status: GrblStatus,
    /// Machine position (mm), updated while moving.
    pub position_mm: [f64; 3],
    /// A homing cycle has completed since power-up.
    pub homed: bool,
    /// Completed moves, dwells and homing cycles, oldest first.
    pub moves: Vec<GrblMove>,
    /// Every line received (raw, without terminator), oldest first.
    pub lines: Vec<(Instant, String)>,
    /// Alarms raised (`ALARM:N`), oldest first.
    pub alarms: Vec<(Instant, u8)>,
    /// Power-ups and resets (including resets on open).
    pub resets: u32,
}

impl GrblState {
    /// Moves of kind G0/G1/jog only, oldest first.
    pub fn motions(&self) -> impl Iterator<Item = &GrblMove> {
        self.moves
            .iter()
            .filter(|m| matches!(m.kind, MoveKind::Rapid | MoveKind::Linear | MoveKind::Jog))
    }
}

/// Shared view of a running GRBL simulator.
#[derive(Debug, Clone)]
pub struct GrblHandle {
    state: Arc<Mutex<GrblState>>,
}

impl GrblHandle {
    /// A copy of the current state.
    pub fn snapshot(&self) -> GrblState {
        lock(&self.state).clone()
    }
}

/// A running GRBL simulator.
pub type GrblSim = Simulator<GrblHandle>;

impl Simulator<GrblHandle> {
    /// Starts a GRBL controller on a new pty (powered up, banner pending).
    ///
    /// Errors: [`DevSimError::Config`] for a non-positive `time_scale`,
    /// feed or rate, or a travel with min > max; else see [`Simulator::spawn`].
    pub fn start(
        config: GrblConfig,
        link: Option<&std::path::Path>,
    ) -> Result<GrblSim, DevSimError> {
        validate(&config)?;
        let state = Arc::new(Mutex::new(GrblState {
            status: GrblStatus::Booting,
            position_mm: [0.0; 3],
            homed: false,
            moves: Vec::new(),
            lines: Vec::new(),
            alarms: Vec::new(),
            resets: 0,
        }));
        let mut device = Grbl::new(config, state.clone());
        device.power_up(Instant::now());
        Simulator::spawn("grbl", device, GrblHandle { state }, link)
    }
}

fn validate(c: &GrblConfig) -> Result<(), DevSimError> {
    let bad = |field, reason: &str| {
        Err(DevSimError::Config {
            field,
            reason: reason.to_string(),
        })
    };
    if !(c.time_scale > 0.0 && c.time_scale.is_finite()) {
        return bad("time_scale", "must be a positive number");
    }
    let positive = |r: f64| r > 0.0 && r.is_finite();
    if !positive(c.homing_feed_mm_min) || !c.max_rate_mm_min.iter().all(|r| positive(*r)) {
        return bad("max_rate_mm_min", "rates must be positive");
    }
    let ordered = |i: usize| c.travel_min_mm[i] <= c.travel_max_mm[i];
    if !(0..3).all(ordered) {
        return bad("travel_min_mm", "each axis needs min <= max");
    }
    Ok(())
}

/// A queued motion (G0/G1/jog).
struct Planned {
    kind: MoveKind,
    to_mm: [f64; 3],
    feed_mm_min: f64,
    queued_at: Instant,
}

/// The motion executing now.
struct Active {
    kind: MoveKind,
    from_mm: [f64; 3],
    to_mm: [f64; 3],
    feed_mm_min: f64,
    dwell_s: f64,
    started_at: Instant,
    ends_at: Instant,
}

impl Active {
    fn position_at(&self, now: Instant) -> [f64; 3] {
        let total = self.ends_at.duration_since(self.started_at).as_secs_f64();
        let f = if total <= 0.0 {
            1.0
        } else {
            (now.duration_since(self.started_at).as_secs_f64() / total).clamp(0.0, 1.0)
        };
        std::array::from_fn(|i| self.from_mm[i] + (self.to_mm[i] - self.from_mm[i]) * f)
    }
}

struct Grbl {
    config: GrblConfig,
    state: Arc<Mutex<GrblState>>,
    status: GrblStatus,
    /// A soft/hard limit alarm: nothing runs until a reset.
    critical_alarm: bool,
    boot_until: Option<Instant>,
    rx: Vec<u8>,
    lines: VecDeque<String>,
    planner: VecDeque<Planned>,
    active: Option<Active>,
    /// Last motion's end, so back-to-back moves chain without gaps.
    last_end: Option<Instant>,
    /// A G4/`$H` at the head of the line queue has started.
    sync_started: bool,
    position: [f64; 3],
    planned: [f64; 3],
    absolute: bool,
    inches: bool,
    motion: Motion,
    feed: Option<f64>,
    homed: bool,
    report_due: bool,
    out: Vec<u8>,
}

impl Grbl {
    fn new(config: GrblConfig, state: Arc<Mutex<GrblState>>) -> Grbl {
        Grbl {
            config,
            state,
            status: GrblStatus::Booting,
            critical_alarm: false,
            boot_until: None,
            rx: Vec::new(),
            lines: VecDeque::new(),
            planner: VecDeque::new(),
            active: None,
            last_end: None,
            sync_started: false,
            position: [0.0; 3],
            planned: [0.0; 3],
            absolute: true,
            inches: false,
            motion: Motion::Rapid,
            feed: None,
            homed: false,
            report_due: false,
            out: Vec::new(),
        }
    }

    /// Cold boot: position and homing are lost.
    fn power_up(&mut self, now: Instant) {
        self.active = None;
        self.position = [0.0; 3];
        self.homed = false;
        self.critical_alarm = false;
        self.reset(now, true);
    }

    /// Soft reset (Ctrl-X) or reboot; `reboot` waits `boot_delay`.
    fn reset(&mut self, now: Instant, reboot: bool) {
        let moving = self.active.is_some() && !reboot;
        if let Some(a) = self.active.take() {
            self.position = a.position_at(now);
        }
        if moving {
            self.raise_alarm(3, now);
        }
        self.planner.clear();
        self.lines.clear();
        self.rx.clear();
        self.sync_started = false;
        self.last_end = None;
        self.planned = self.position;
        self.absolute = true;
        self.inches = false;
        self.motion = Motion::Rapid;
        self.feed = None;
        self.report_due = false;
        // A soft reset keeps an alarm; only power-up locks for homing
        // (decided when the boot ends, see `poll`).
        let locked = self.critical_alarm || moving || self.status == GrblStatus::Alarm;
        self.critical_alarm = false;
        lock(&self.state).resets += 1;
        if reboot {
            self.status = GrblStatus::Booting;
            self.boot_until = Some(now + self.config.boot_delay);
            self.out.clear();
        } else {
            self.status = if locked {
                GrblStatus::Alarm
            } else {
                GrblStatus::Idle
            };
            self.print_banner();
        }
        self.publish(now);
    }

    fn print_banner(&mut self) {
        self.out.extend_from_slice(GRBL_BANNER.as_bytes());
        if self.status == GrblStatus::Alarm {
            self.out.extend_from_slice(b"[MSG:'$H'|'$X' to unlock]\r\n");
        }
    }

    fn raise_alarm(&mut self, code: u8, now: Instant) {
        self.status = GrblStatus::Alarm;
        let _ = write!(self.out_str(), "ALARM:{code}\r\n");
        lock(&self.state).alarms.push((now, code));
    }

    fn out_str(&mut self) -> OutWriter<'_> {
        OutWriter(&mut self.out)
    }

    fn reply(&mut self, result: Result<(), u8>) {
        match result {
            Ok(()) => self.out.extend_from_slice(b"ok\r\n"),
            Err(code) => {
                let _ = write!(self.out_str(), "error:{code}\r\n");
            }
        }
    }

    /// Simulated duration of `real_s` seconds of machine time, at most a day.
    fn scaled(&self, real_s: f64) -> Duration {
        const DAY_S: f64 = 86_400.0;
        let s = real_s / self.config.time_scale;
        Duration::from_secs_f64(if s.is_finite() {
            s.clamp(0.0, DAY_S)
        } else {
            DAY_S
        })
    }

    fn motion_time(&self, from: [f64; 3], to: [f64; 3], feed: f64) -> Duration {
        let dist = distance(from, to);
        if dist <= 0.0 || feed <= 0.0 {
            return Duration::ZERO;
        }
        let d = self.scaled(dist / feed * 60.0);
        match self.config.max_move_time {
            Some(cap) => d.min(cap),
            None => d,
        }
    }

    /// Feed for a move: the programmed one (or the rapid rate) limited by
    /// each moving axis' maximum rate.
    fn effective_feed(&self, from: [f64; 3], to: [f64; 3], requested: Option<f64>) -> f64 {
        let len = distance(from, to);
        if len <= 0.0 {
            return requested.unwrap_or(0.0);
        }
        let axis_limit = (0..3)
            .filter(|&i| to[i] != from[i])
            .map(|i| self.config.max_rate_mm_min[i] * len / (to[i] - from[i]).abs())
            .fold(f64::INFINITY, f64::min);
        requested.map_or(axis_limit, |f| f.min(axis_limit))
    }

    fn within_travel(&self, t: [f64; 3]) -> bool {
        const EPS: f64 = 1e-6;
        (0..3).all(|i| {
            t[i] >= self.config.travel_min_mm[i] - EPS && t[i] <= self.config.travel_max_mm[i] + EPS
        })
    }

    /// Advances the executing motion, starting queued blocks as slots free.
    fn advance(&mut self, now: Instant) {
        loop {
            if let Some(a) = &self.active {
                if now < a.ends_at {
                    return;
                }
                let done = GrblMove {
                    kind: a.kind,
                    from_mm: a.from_mm,
                    to_mm: a.to_mm,
                    feed_mm_min: a.feed_mm_min,
                    dwell_s: a.dwell_s,
                    started_at: a.started_at,
                    finished_at: a.ends_at,
                };
                self.position = a.to_mm;
                self.last_end = Some(a.ends_at);
                if a.kind == MoveKind::Home {
                    self.homed = true;
                }
                self.active = None;
                lock(&self.state).moves.push(done);
            }
            let Some(p) = self.planner.pop_front() else {
                if matches!(
                    self.status,
                    GrblStatus::Run | GrblStatus::Jog | GrblStatus::Home
                ) {
                    self.status = GrblStatus::Idle;
                }
                return;
            };
            let start = self.last_end.map_or(p.queued_at, |t| t.max(p.queued_at));
            let ends_at = start + self.motion_time(self.position, p.to_mm, p.feed_mm_min);
            self.status = if p.kind == MoveKind::Jog {
                GrblStatus::Jog
            } else {
                GrblStatus::Run
            };
            self.active = Some(Active {
                kind: p.kind,
                from_mm: self.position,
                to_mm: p.to_mm,
                feed_mm_min: p.feed_mm_min,
                dwell_s: 0.0,
                started_at: start,
                ends_at,
            });
        }
    }

    /// Answers queued lines in order until one has to wait.
    fn process_lines(&mut self, now: Instant) {
        while let Some(line) = self.lines.front().cloned() {
            if self.critical_alarm {
                // The real controller stops reading until reset.
                self.lines.clear();
                return;
            }
            match self.line(&line, now) {
                Step::Wait => return,
                Step::Reply(result) => {
                    self.lines.pop_front();
                    self.sync_started = false;
                    self.reply(result);
                }
                Step::Silent => {
                    self.lines.pop_front();
                }
            }
        }
    }

    fn line(&mut self, raw: &str, now: Instant) -> Step {
        let line = clean_line(raw);
        if line.len() > LINE_MAX {
            return Step::Reply(Err(ERR_OVERFLOW));
        }
        if line.is_empty() {
            return Step::Reply(Ok(()));
        }
        if let Some(cmd) = line.strip_prefix('$') {
            return self.system_command(cmd, now);
        }
        if self.status == GrblStatus::Alarm {
            return Step::Reply(Err(ERR_SYSTEM_GC_LOCK));
        }
        let block = match parse_block(&line) {
            Ok(b) => b,
            Err(e) => return Step::Reply(Err(e)),
        };
        if block.dwell {
            return self.dwell(block.p.unwrap_or(0.0), now);
        }
        self.gcode(&block, now)
    }

    fn gcode(&mut self, block: &Block, now: Instant) -> Step {
        let motion = block.motion.unwrap_or(self.motion);
        let feed = block
            .feed
            .map(|f| self.to_mm(f, block.inches))
            .or(self.feed);
        let moves = block.has_axes();
        if moves && motion == Motion::Linear && !feed.is_some_and(|f| f > 0.0) {
            return Step::Reply(Err(ERR_UNDEFINED_FEED_RATE));
        }
        if moves && self.planner.len() >= PLANNER_BLOCKS {
            return Step::Wait;
        }
        let absolute = block.absolute.unwrap_or(self.absolute) || block.machine_coords;
        let target = self.target(block, absolute);
        if moves && self.config.soft_limits && !self.within_travel(target) {
            // GRBL 1.1: soft limit → reset motion, ALARM:2, wait for reset.
            if let Some(a) = self.active.take() {
                self.position = a.position_at(now);
            }
            self.planner.clear();
            self.planned = self.position;
            self.critical_alarm = true;
            self.raise_alarm(2, now);
            self.out.extend_from_slice(b"[MSG:Reset to continue]\r\n");
            return Step::Silent;
        }
        // The line is valid: commit its modal changes.
        self.motion = motion;
        self.feed = feed;
        if let Some(a) = block.absolute {
            self.absolute = a;
        }
        if let Some(i) = block.inches {
            self.inches = i;
        }
        if moves && target != self.planned {
            let kind = match motion {
                Motion::Rapid => MoveKind::Rapid,
                Motion::Linear => MoveKind::Linear,
            };
            let requested = (motion == Motion::Linear).then_some(feed).flatten();
            let feed_mm_min = self.effective_feed(self.planned, target, requested);
            self.queue(kind, target, feed_mm_min, now);
        }
        Step::Reply(Ok(()))
    }

    fn queue(&mut self, kind: MoveKind, to_mm: [f64; 3], feed_mm_min: f64, now: Instant) {
        self.planner.push_back(Planned {
            kind,
            to_mm,
            feed_mm_min,
            queued_at: now,
        });
        self.planned = to_mm;
        self.advance(now);
    }

    /// Unit conversion for a value written in this block's (or the modal) units.
    fn to_mm(&self, v: f64, block_inches: Option<bool>) -> f64 {
        if block_inches.unwrap_or(self.inches) {
            v * 25.4
        } else {
            v
        }
    }

    fn target(&self, block: &Block, absolute: bool) -> [f64; 3] {
        std::array::from_fn(|i| match block.axes[i] {
            Some(v) if absolute => self.to_mm(v, block.inches),
            Some(v) => self.planned[i] + self.to_mm(v, block.inches),
            None => self.planned[i],
        })
    }

    /// G4: wait for the planner to empty, then dwell; `ok` at the end.
    fn dwell(&mut self, seconds: f64, now: Instant) -> Step {
        if !self.sync_started {
            if self.active.is_some() || !self.planner.is_empty() {
                return Step::Wait;
            }
            self.sync_started = true;
            let start = self.last_end.map_or(now, |t| t.max(now));
            self.active = Some(Active {
                kind: MoveKind::Dwell,
                from_mm: self.position,
                to_mm: self.position,
                feed_mm_min: 0.0,
                dwell_s: seconds,
                started_at: start,
                ends_at: start + self.scaled(seconds),
            });
            // Real GRBL reports Idle while dwelling.
            return Step::Wait;
        }
        if self.active.is_some() {
            return Step::Wait;
        }
        Step::Reply(Ok(()))
    }

    fn system_command(&mut self, cmd: &str, now: Instant) -> Step {
        if let Some(jog) = cmd.strip_prefix("J=") {
            return self.jog(jog, now);
        }
        let busy = matches!(
            self.status,
            GrblStatus::Run | GrblStatus::Jog | GrblStatus::Home
        );
        if busy && !(cmd == "H" && self.sync_started) {
            return Step::Reply(Err(ERR_IDLE_ERROR));
        }
        match cmd {
            "" => {
                self.out.extend_from_slice(
                    b"[HLP:$$ $# $G $I $N $x=val $Nx=line $J=line $SLP $C $X $H ~ ! ? ctrl-x]\r\n",
                );
                Step::Reply(Ok(()))
            }
            "$" => {
                self.print_settings();
                Step::Reply(Ok(()))
            }
            "I" => {
                self.out
                    .extend_from_slice(b"[VER:1.1h.20190825:]\r\n[OPT:V,15,128]\r\n");
                Step::Reply(Ok(()))
            }
            "G" => {
                let line = format!(
                    "[GC:G{} G54 G17 G{} G{} G94 M5 M9 T0 F{} S0]\r\n",
                    if self.motion == Motion::Rapid { 0 } else { 1 },
                    if self.inches { 20 } else { 21 },
                    if self.absolute { 90 } else { 91 },
                    self.feed.unwrap_or(0.0)
                );
                self.out.extend_from_slice(line.as_bytes());
                Step::Reply(Ok(()))
            }
            "X" => {
                if self.status == GrblStatus::Alarm {
                    self.status = GrblStatus::Idle;
                    self.out.extend_from_slice(b"[MSG:Caution: Unlocked]\r\n");
                    self.publish(now);
                }
                Step::Reply(Ok(()))
            }
            "H" => self.home(now),
            _ => match cmd.split_once('=') {
                Some((n, v)) => Step::Reply(self.write_setting(n, v)),
                None => Step::Reply(Err(ERR_INVALID_STATEMENT)),
            },
        }
    }

    fn home(&mut self, now: Instant) -> Step {
        if !self.config.homing_enabled {
            return Step::Reply(Err(ERR_HOMING_DISABLED));
        }
        if !self.sync_started {
            self.sync_started = true;
            let home = self.config.home_mm;
            let dur = self
                .motion_time(self.position, home, self.config.homing_feed_mm_min)
                // Seek, pull-off and locate take time even from home.
                .max(self.scaled(0.5));
            self.status = GrblStatus::Home;
            self.active = Some(Active {
                kind: MoveKind::Home,
                from_mm: self.position,
                to_mm: home,
                feed_mm_min: self.config.homing_feed_mm_min,
                dwell_s: 0.0,
                started_at: now,
                ends_at: now + dur,
            });
            self.planned = home;
            return Step::Wait;
        }
        if self.active.is_some() {
            return Step::Wait;
        }
        self.status = GrblStatus::Idle;
        Step::Reply(Ok(()))
    }

    fn jog(&mut self, words: &str, now: Instant) -> Step {
        if self.status == GrblStatus::Alarm {
            return Step::Reply(Err(ERR_SYSTEM_GC_LOCK));
        }
        if !matches!(self.status, GrblStatus::Idle | GrblStatus::Jog) {
            return Step::Reply(Err(ERR_IDLE_ERROR));
        }
        let block = match parse_block(words) {
            Ok(b) => b,
            Err(e) => return Step::Reply(Err(e)),
        };
        if block.motion.is_some() || block.dwell || !block.has_axes() {
            return Step::Reply(Err(ERR_INVALID_JOG));
        }
        let Some(feed) = block
            .feed
            .map(|f| self.to_mm(f, block.inches))
            .filter(|f| *f > 0.0)
        else {
            return Step::Reply(Err(ERR_UNDEFINED_FEED_RATE));
        };
        if self.planner.len() >= PLANNER_BLOCKS {
            return Step::Wait;
        }
        // A jog's G90/G91/G20/G21 apply to the jog line only.
        let absolute = block.absolute.unwrap_or(self.absolute) || block.machine_coords;
        let target = self.target(&block, absolute);
        if self.config.soft_limits && !self.within_travel(target) {
            return Step::Reply(Err(ERR_TRAVEL_EXCEEDED));
        }
        if target != self.planned {
            let f = self.effective_feed(self.planned, target, Some(feed));
            self.queue(MoveKind::Jog, target, f, now);
        }
        Step::Reply(Ok(()))
    }

    fn print_settings(&mut self) {
        let c = &self.config;
        let mut s = String::new();
        let _ = write!(
            s,
            "$20={}\r\n$22={}\r\n$25={:.3}\r\n",
            u8::from(c.soft_limits),
            u8::from(c.homing_enabled),
            c.homing_feed_mm_min
        );
        for (i, r) in c.max_rate_mm_min.iter().enumerate() {
            let _ = write!(s, "$11{i}={r:.3}\r\n");
        }
        for i in 0..3 {
            let travel = c.travel_max_mm[i] - c.travel_min_mm[i];
            let _ = write!(s, "$13{i}={travel:.3}\r\n");
        }
        self.out.extend_from_slice(s.as_bytes());
    }

    fn write_setting(&mut self, n: &str, v: &str) -> Result<(), u8> {
        let value: f64 = v.parse().map_err(|_| ERR_BAD_NUMBER)?;
        if value < 0.0 {
            return Err(ERR_NEGATIVE_VALUE);
        }
        let c = &mut self.config;
        match n {
            "20" => c.soft_limits = value != 0.0,
            "22" => c.homing_enabled = value != 0.0,
            "25" if value > 0.0 => c.homing_feed_mm_min = value,
            "110" | "111" | "112" if value > 0.0 => {
                c.max_rate_mm_min[usize::from(n.as_bytes()[2] - b'0')] = value;
            }
            "130" | "131" | "132" => {
                let i = usize::from(n.as_bytes()[2] - b'0');
                c.travel_max_mm[i] = c.travel_min_mm[i] + value;
            }
            // Step, acceleration and switch settings change nothing simulated.
            "0" | "1" | "2" | "3" | "4" | "5" | "6" | "10" | "11" | "12" | "13" | "21" | "23"
            | "24" | "26" | "27" | "30" | "31" | "32" | "100" | "101" | "102" | "120" | "121"
            | "122" => {}
            _ => return Err(ERR_INVALID_STATEMENT),
        }
        Ok(())
    }

    fn status_report(&mut self, now: Instant) {
        let pos = self
            .active
            .as_ref()
            .map_or(self.position, |a| a.position_at(now));
        let feed = self
            .active
            .as_ref()
            .filter(|a| a.kind != MoveKind::Dwell)
            .map_or(0.0, |a| a.feed_mm_min);
        let line = format!(
            "<{}|MPos:{:.3},{:.3},{:.3}|FS:{:.0},0>\r\n",
            self.status.report_name(),
            pos[0],
            pos[1],
            pos[2],
            feed
        );
        self.out.extend_from_slice(line.as_bytes());
    }

    /// Copies the externally visible state into the shared snapshot.
    fn publish(&self, now: Instant) {
        let mut st = lock(&self.state);
        st.status = self.status;
        st.position_mm = self
            .active
            .as_ref()
            .map_or(self.position, |a| a.position_at(now));
        st.homed = self.homed;
    }
}

enum Step {
    /// The line must wait (planner full, dwell or homing running).
    Wait,
    /// The line is done; send `ok` or `error:N`.
    Reply(Result<(), u8>),
    /// The line is done and gets no reply (soft-limit alarm).
    Silent,
}

struct OutWriter<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for OutWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

fn distance(a: [f64; 3], b: [f64; 3]) -> f64 {
    (0..3).map(|i| (b[i] - a[i]).powi(2)).sum::<f64>().sqrt()
}

impl Device for Grbl {
    fn receive(&mut self, bytes: &[u8], now: Instant) {
        for &b in bytes {
            if self.status == GrblStatus::Booting {
                continue; // the bootloader is running; bytes are lost
            }
            match b {
                b'?' => self.report_due = true,
                0x18 => self.reset(now, false),
                // Feed hold, cycle start and extended real-time bytes.
                b'!' | b'~' | 0x80..=0xff => {}
                b'\n' | b'\r' => {
                    if self.rx.is_empty() {
                        continue; // second half of \r\n
                    }
                    let line = String::from_utf8_lossy(&self.rx).into_owned();
                    self.rx.clear();
                    lock(&self.state).lines.push((now, line.clone()));
                    if self.lines.len() < RX_LINES_MAX {
                        self.lines.push_back(line);
                    }
                }
                _ if self.rx.len() < 256 => self.rx.push(b),
                _ => {}
            }
        }
    }

    fn poll(&mut self, now: Instant, out: &mut Vec<u8>) -> Option<Instant> {
        if let Some(t) = self.boot_until {
            if now < t {
                return Some(t);
            }
            self.boot_until = None;
            if self.status == GrblStatus::Booting {
                self.status = if self.config.homing_enabled {
                    GrblStatus::Alarm
                } else {
                    GrblStatus::Idle
                };
            }
            self.print_banner();
        }
        self.advance(now);
        self.process_lines(now);
        if self.report_due {
            self.report_due = false;
            self.status_report(now);
        }
        self.publish(now);
        out.append(&mut self.out);
        self.active.as_ref().map(|a| a.ends_at)
    }

    fn host_opened(&mut self, now: Instant) {
        if self.config.reset_on_open {
            self.power_up(now);
        }
    }

    fn unplugged(&mut self, now: Instant) {
        self.active = None;
        self.status = GrblStatus::Booting;
        self.boot_until = None;
        self.publish(now);
    }

    fn plugged(&mut self, now: Instant) {
        self.power_up(now);
    }
}
