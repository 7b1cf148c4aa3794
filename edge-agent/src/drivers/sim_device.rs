//! The simulated device under test (DUT) of a simulated bench
//! (docs/devices.md "Simulated device under test"): one per edge, shared by
//! its `sim` drivers. The `sim` thumb robot reports where its stylus is;
//! the `sim` camera with `scene = "device"` draws the DUT's LED, display,
//! wake button and the stylus; the `sim` microphone hears what the DUT
//! says.
//!
//! The DUT wakes when the stylus presses inside its wake button (a circle
//! in the robot's mm frame, so a `tap` there or a `press_hardware_button`
//! whose spot lies in it both work). From then on, on the monotonic clock:
//! after `led_delay_ms` the LED turns `led_awake`, after
//! `display_delay_ms` the display shows `display_awake`, after
//! `welcome_delay_ms` it says `welcome_line` (rendered once by
//! `espeak-ng --stdout` on a thread of its own); `awake_ms` after waking
//! it goes back to idle. Faults are configuration: `led_awake = "red"`,
//! another `welcome_line`.
//!
//! ```toml
//! [simulated_device]
//! wake_button = { x_mm = 20.0, y_mm = 35.0, radius_mm = 6.0 }
//! led_idle = "red"
//! led_awake = "blue"
//! led_delay_ms = 800
//! display_idle = ["STANDBY"]
//! display_awake = ["LISTENING"]
//! display_delay_ms = 500
//! welcome_line = "welcome how can i help you today"
//! welcome_delay_ms = 1000
//! awake_ms = 30000
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Map, Value};

use super::{parse_params_with_defaults, Defaults, DriverError};

/// Width and height of the DUT's face in the robot's frame (mm): the
/// camera scene maps robot `(0, 0)`..`(70, 140)` onto the face.
pub const FACE_MM: (f64, f64) = (70.0, 140.0);

/// LED colours a `[simulated_device]` may name, and their RGB.
pub const LED_COLOURS: [(&str, [u8; 3]); 6] = [
    ("red", [230, 30, 30]),
    ("green", [30, 200, 60]),
    ("blue", [30, 70, 235]),
    ("yellow", [230, 210, 30]),
    ("white", [240, 240, 240]),
    ("off", [15, 15, 15]),
];

/// The wake button: a circle in the robot's frame (mm).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WakeButton {
    pub x_mm: f64,
    pub y_mm: f64,
    pub radius_mm: f64,
}

/// The `[simulated_device]` table (see the module doc for an example).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimDeviceSettings {
    pub wake_button: WakeButton,
    /// One of [`LED_COLOURS`].
    pub led_idle: String,
    /// One of [`LED_COLOURS`]; `"red"` simulates an LED that never changes.
    pub led_awake: String,
    /// Wake to LED change, ms.
    pub led_delay_ms: u64,
    /// Display lines while idle (1..=4 lines of at most 16 drawable
    /// characters).
    pub display_idle: Vec<String>,
    /// Display lines once awake.
    pub display_awake: Vec<String>,
    /// Wake to display change, ms.
    pub display_delay_ms: u64,
    /// What the DUT says once awake (English, for espeak-ng).
    pub welcome_line: String,
    /// Wake to the start of the welcome line, ms.
    pub welcome_delay_ms: u64,
    /// espeak-ng voice and rate (words per minute).
    pub voice: String,
    pub speech_rate_wpm: u32,
    /// Wake to idle again, ms (0: stays awake).
    pub awake_ms: u64,
}

impl Default for SimDeviceSettings {
    fn default() -> Self {
        Self {
            wake_button: WakeButton {
                x_mm: 20.0,
                y_mm: 35.0,
                radius_mm: 6.0,
            },
            led_idle: "red".into(),
            led_awake: "blue".into(),
            led_delay_ms: 800,
            display_idle: vec!["STANDBY".into()],
            display_awake: vec!["LISTENING".into()],
            display_delay_ms: 500,
            welcome_line: "welcome how can i help you today".into(),
            welcome_delay_ms: 1000,
            voice: "en".into(),
            speech_rate_wpm: 140,
            awake_ms: 30_000,
        }
    }
}

impl Defaults for SimDeviceSettings {}

impl SimDeviceSettings {
    /// Parse and check a `[simulated_device]` table (as JSON).
    ///
    /// # Errors
    /// `(key, message)`: an unknown key, a bad type, an unknown colour, a
    /// display line that cannot be drawn, a delay above 60000 ms, an empty
    /// welcome line, a button outside the face.
    pub fn parse(table: &Map<String, Value>) -> Result<Self, (String, String)> {
        let s: SimDeviceSettings = parse_params_with_defaults(table).map_err(|e| match e {
            DriverError::InvalidParams { field, message } => (field, message),
            other => ("simulated_device".into(), other.to_string()),
        })?;
        s.check()?;
        Ok(s)
    }

    fn check(&self) -> Result<(), (String, String)> {
        let bad = |k: &str, m: String| Err((k.to_string(), m));
        for (key, c) in [("led_idle", &self.led_idle), ("led_awake", &self.led_awake)] {
            if led_rgb(c).is_none() {
                let known: Vec<&str> = LED_COLOURS.iter().map(|(n, _)| *n).collect();
                return bad(key, format!("`{c}` is not one of {}", known.join(", ")));
            }
        }
        for (key, lines) in [
            ("display_idle", &self.display_idle),
            ("display_awake", &self.display_awake),
        ] {
            if lines.is_empty() || lines.len() > 4 {
                return bad(key, format!("has {} lines; 1..=4 are allowed", lines.len()));
            }
            for l in lines {
                if l.chars().count() > 16 || !super::camera::pattern::is_drawable(l) {
                    return bad(
                        key,
                        format!(
                            "`{l}`: at most 16 characters of A-Z, 0-9, space and .,:-_/%=+()#!?"
                        ),
                    );
                }
            }
        }
        for (key, v) in [
            ("led_delay_ms", self.led_delay_ms),
            ("display_delay_ms", self.display_delay_ms),
            ("welcome_delay_ms", self.welcome_delay_ms),
        ] {
            if v > 60_000 {
                return bad(key, format!("{v} is above 60000 (ms)"));
            }
        }
        if self.awake_ms > 3_600_000 {
            return bad(
                "awake_ms",
                format!("{} is above 3600000 (ms)", self.awake_ms),
            );
        }
        if self.welcome_line.trim().is_empty() || self.welcome_line.len() > 200 {
            return bad("welcome_line", "must be 1..=200 bytes of text".into());
        }
        if self.voice.is_empty()
            || !self
                .voice
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_+".contains(&b))
        {
            return bad(
                "voice",
                format!("`{}` is not an espeak-ng voice name", self.voice),
            );
        }
        if !(80..=450).contains(&self.speech_rate_wpm) {
            return bad(
                "speech_rate_wpm",
                format!("{} is outside 80..=450", self.speech_rate_wpm),
            );
        }
        let b = self.wake_button;
        let inside = b.x_mm.is_finite()
            && b.y_mm.is_finite()
            && (0.0..=FACE_MM.0).contains(&b.x_mm)
            && (0.0..=FACE_MM.1).contains(&b.y_mm);
        if !inside || !(1.0..=20.0).contains(&b.radius_mm) {
            return bad(
                "wake_button",
                format!(
                    "x_mm 0..={}, y_mm 0..={} and radius_mm 1..=20 are allowed",
                    FACE_MM.0, FACE_MM.1
                ),
            );
        }
        Ok(())
    }
}

/// RGB of an LED colour name of [`LED_COLOURS`].
pub fn led_rgb(name: &str) -> Option<[u8; 3]> {
    LED_COLOURS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, rgb)| *rgb)
}

/// The welcome line as the microphone hears it: mono samples (-1..1) at
/// `rate_hz`, starting at `start`.
#[derive(Debug, Clone)]
pub struct Utterance {
    pub start: Instant,
    pub samples: Arc<Vec<f32>>,
    pub rate_hz: u32,
}

impl Utterance {
    /// The sample heard at `at` (linear interpolation between the
    /// rendered samples, so any microphone rate works); 0 outside it.
    pub fn sample_at(&self, at: Instant) -> f32 {
        let Some(dt) = at.checked_duration_since(self.start) else {
            return 0.0;
        };
        let pos = dt.as_secs_f64() * f64::from(self.rate_hz);
        let i = pos.floor() as usize;
        let (Some(a), b) = (self.samples.get(i), self.samples.get(i + 1)) else {
            return 0.0;
        };
        let frac = (pos - i as f64) as f32;
        a + (b.copied().unwrap_or(0.0) - a) * frac
    }
}

/// What the DUT shows at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Look {
    pub led_rgb: [u8; 3],
    pub display: Vec<String>,
    /// Stylus position (x, y, z mm) when the robot reported one.
    pub stylus_mm: Option<[f64; 3]>,
    /// The stylus is down at press height.
    pub touching: bool,
}

#[derive(Debug, Default)]
struct State {
    stylus: Option<[f64; 3]>,
    touching: bool,
    woke_at: Option<Instant>,
    wakes: u64,
    speech: Option<Utterance>,
}

/// One simulated DUT.
#[derive(Debug)]
pub struct SimDevice {
    settings: SimDeviceSettings,
    state: Mutex<State>,
    /// The rendered welcome line (22050 Hz from espeak-ng), once rendered.
    voice: Mutex<Option<Arc<Vec<f32>>>>,
}

impl SimDevice {
    /// A DUT with checked `settings`, idle.
    pub fn new(settings: SimDeviceSettings) -> Self {
        Self {
            settings,
            state: Mutex::new(State::default()),
            voice: Mutex::new(None),
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &SimDeviceSettings {
        &self.settings
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The robot's stylus is at `pos` (x, y, z mm); `touching` when it is
    /// down at press height. A touch inside the wake button of an idle DUT
    /// wakes it.
    pub fn stylus_at(self: &Arc<Self>, pos: [f64; 3], touching: bool) {
        let now = Instant::now();
        let mut st = self.lock();
        let was = st.touching;
        st.stylus = Some(pos);
        st.touching = touching;
        if !touching || was || !self.over_button(pos) || self.awake_at(&st, now) {
            return;
        }
        st.woke_at = Some(now);
        st.wakes += 1;
        st.speech = None;
        let wake_no = st.wakes;
        drop(st);
        tracing::info!("simulated DUT woken by a press on its wake button");
        let dev = self.clone();
        let spawned = std::thread::Builder::new()
            .name("sim-dut-voice".into())
            .spawn(move || dev.speak(now, wake_no));
        if let Err(e) = spawned {
            tracing::warn!("simulated DUT cannot start its voice thread: {e}");
        }
    }

    fn over_button(&self, pos: [f64; 3]) -> bool {
        let b = self.settings.wake_button;
        ((pos[0] - b.x_mm).powi(2) + (pos[1] - b.y_mm).powi(2)).sqrt() <= b.radius_mm
    }

    fn awake_at(&self, st: &State, now: Instant) -> bool {
        st.woke_at.is_some_and(|w| {
            self.settings.awake_ms == 0
                || now.duration_since(w) < Duration::from_millis(self.settings.awake_ms)
        })
    }

    /// Render (once) and schedule the welcome line of wake number `wake_no`.
    fn speak(&self, woke_at: Instant, wake_no: u64) {
        let cached = self.voice.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let samples = match cached {
            Some(s) => s,
            None => match render_speech(
                &self.settings.welcome_line,
                &self.settings.voice,
                self.settings.speech_rate_wpm,
            ) {
                Ok(s) => {
                    let s = Arc::new(s);
                    *self.voice.lock().unwrap_or_else(|p| p.into_inner()) = Some(s.clone());
                    s
                }
                Err(e) => {
                    tracing::warn!("simulated DUT stays silent: {e}");
                    return;
                }
            },
        };
        let due = woke_at + Duration::from_millis(self.settings.welcome_delay_ms);
        let mut st = self.lock();
        if st.wakes == wake_no {
            st.speech = Some(Utterance {
                start: due.max(Instant::now()),
                samples,
                rate_hz: ESPEAK_RATE_HZ,
            });
        }
    }

    /// Render the welcome line now (e.g. at start-up, so the first wake
    /// speaks on time); a failure is logged and retried at the next wake.
    pub fn prerender(self: &Arc<Self>) {
        let dev = self.clone();
        let _ = std::thread::Builder::new()
            .name("sim-dut-render".into())
            .spawn(move || {
                match render_speech(
                    &dev.settings.welcome_line,
                    &dev.settings.voice,
                    dev.settings.speech_rate_wpm,
                ) {
                    Ok(s) => {
                        *dev.voice.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(s))
                    }
                    Err(e) => tracing::warn!("simulated DUT: {e}"),
                }
            });
    }

    /// What the DUT shows at `now`.
    pub fn look(&self, now: Instant) -> Look {
        let st = self.lock();
        let s = &self.settings;
        let since = st
            .woke_at
            .filter(|_| self.awake_at(&st, now))
            .map(|w| now.saturating_duration_since(w));
        let after = |ms: u64| since.is_some_and(|d| d >= Duration::from_millis(ms));
        let colour = if after(s.led_delay_ms) {
            &s.led_awake
        } else {
            &s.led_idle
        };
        Look {
            led_rgb: led_rgb(colour).unwrap_or([0, 0, 0]),
            display: if after(s.display_delay_ms) {
                s.display_awake.clone()
            } else {
                s.display_idle.clone()
            },
            stylus_mm: st.stylus,
            touching: st.touching,
        }
    }

    /// The welcome line being (or to be) said, once rendered.
    pub fn utterance(&self) -> Option<Utterance> {
        let now = Instant::now();
        let st = self.lock();
        if !self.awake_at(&st, now) {
            return None;
        }
        st.speech.clone()
    }

    /// How many times it was woken.
    pub fn wakes(&self) -> u64 {
        self.lock().wakes
    }
}

/// espeak-ng's output rate (Hz).
pub const ESPEAK_RATE_HZ: u32 = 22_050;

/// `espeak-ng --stdout` of `text`: mono samples at [`ESPEAK_RATE_HZ`].
///
/// # Errors
/// espeak-ng is missing, fails, or writes something that is not 16-bit
/// mono WAV.
pub fn render_speech(text: &str, voice: &str, rate_wpm: u32) -> Result<Vec<f32>, String> {
    let out = Command::new("espeak-ng")
        .args(["--stdout", "-v", voice, "-s", &rate_wpm.to_string(), "--"])
        .arg(text)
        .output()
        .map_err(|e| format!("cannot run espeak-ng (is it installed?): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "espeak-ng failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let wav = out.stdout;
    // espeak-ng streams: its RIFF sizes may be placeholders, so find the
    // `data` chunk and read to the end.
    if wav.len() < 44 || &wav[0..4] != b"RIFF" || &wav[8..12] != b"WAVE" {
        return Err("espeak-ng wrote no WAV".into());
    }
    let mut at = 12;
    while at + 8 <= wav.len() {
        let id = &wav[at..at + 4];
        let size =
            u32::from_le_bytes([wav[at + 4], wav[at + 5], wav[at + 6], wav[at + 7]]) as usize;
        if id == b"fmt " && at + 24 <= wav.len() {
            let channels = u16::from_le_bytes([wav[at + 10], wav[at + 11]]);
            let bits = u16::from_le_bytes([wav[at + 22], wav[at + 23]]);
            if channels != 1 || bits != 16 {
                return Err(format!(
                    "espeak-ng wrote {channels} channel(s) of {bits} bits"
                ));
            }
        }
        if id == b"data" {
            let body = &wav[at + 8..];
            return Ok(body
                .chunks_exact(2)
                .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32768.0)
                .collect());
        }
        at += 8 + size + (size & 1);
    }
    Err("espeak-ng's WAV has no data chunk".into())
}

fn devices() -> &'static Mutex<HashMap<PathBuf, Arc<SimDevice>>> {
    static DEVICES: OnceLock<Mutex<HashMap<PathBuf, Arc<SimDevice>>>> = OnceLock::new();
    DEVICES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Make `settings` the simulated DUT of the edge whose state directory is
/// `state_dir` (the drivers built next find it with [`attached`]); an
/// existing one with the same settings is kept, so rebuilding drivers does
/// not reset it.
pub fn install(state_dir: &Path, settings: SimDeviceSettings) -> Arc<SimDevice> {
    let mut map = devices().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = map.get(state_dir) {
        if d.settings == settings {
            return d.clone();
        }
    }
    let dev = Arc::new(SimDevice::new(settings));
    map.insert(state_dir.to_path_buf(), dev.clone());
    dev
}

/// Forget the simulated DUT of `state_dir` (an edge without a
/// `[simulated_device]` table).
pub fn remove(state_dir: &Path) {
    devices()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(state_dir);
}

/// The simulated DUT of the edge with `state_dir`, when it has one.
pub fn attached(state_dir: &Path) -> Option<Arc<SimDevice>> {
    devices()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(state_dir)
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn settings(extra: Value) -> SimDeviceSettings {
        let mut table =
            json!({ "led_delay_ms": 200, "display_delay_ms": 100, "welcome_delay_ms": 50 });
        for (k, v) in extra.as_object().unwrap() {
            table[k] = v.clone();
        }
        SimDeviceSettings::parse(table.as_object().unwrap()).unwrap()
    }

    const RED: [u8; 3] = [230, 30, 30];
    const BLUE: [u8; 3] = [30, 70, 235];

    #[test]
    fn a_press_on_the_wake_button_wakes_it_and_the_led_follows_the_delay() {
        let dev = Arc::new(SimDevice::new(settings(json!({}))));
        let t0 = Instant::now();
        assert_eq!(dev.look(t0).led_rgb, RED);
        assert_eq!(dev.look(t0).display, ["STANDBY"]);
        dev.stylus_at([21.0, 34.0, 10.0], false);
        assert_eq!(dev.wakes(), 0, "hovering does not press");
        dev.stylus_at([21.0, 34.0, 2.0], true);
        let woke = Instant::now();
        assert_eq!(dev.wakes(), 1);
        assert_eq!(dev.look(woke + Duration::from_millis(150)).led_rgb, RED);
        assert_eq!(
            dev.look(woke + Duration::from_millis(150)).display,
            ["LISTENING"]
        );
        assert_eq!(dev.look(woke + Duration::from_millis(250)).led_rgb, BLUE);
        // Pressing again while awake does not start another wake-up.
        dev.stylus_at([21.0, 34.0, 10.0], false);
        dev.stylus_at([21.0, 34.0, 2.0], true);
        assert_eq!(dev.wakes(), 1);
    }

    #[test]
    fn a_press_elsewhere_does_not_wake_it() {
        let dev = Arc::new(SimDevice::new(settings(json!({}))));
        dev.stylus_at([40.0, 35.0, 2.0], true);
        dev.stylus_at([40.0, 35.0, 10.0], false);
        dev.stylus_at([20.0, 42.5, 2.0], true);
        assert_eq!(dev.wakes(), 0);
        let later = Instant::now() + Duration::from_secs(2);
        assert_eq!(dev.look(later).led_rgb, RED);
        assert_eq!(dev.look(later).display, ["STANDBY"]);
        assert!(dev.utterance().is_none());
    }

    #[test]
    fn faults_are_configuration_and_it_sleeps_again() {
        let dev = Arc::new(SimDevice::new(settings(
            json!({ "led_awake": "red", "awake_ms": 500 }),
        )));
        dev.stylus_at([20.0, 35.0, 2.0], true);
        let woke = Instant::now();
        assert_eq!(dev.look(woke + Duration::from_millis(300)).led_rgb, RED);
        assert_eq!(
            dev.look(woke + Duration::from_millis(300)).display,
            ["LISTENING"]
        );
        assert_eq!(
            dev.look(woke + Duration::from_millis(700)).display,
            ["STANDBY"],
            "idle again after awake_ms"
        );
    }

    #[test]
    fn bad_settings_name_their_key() {
        let parse = |v: Value| {
            SimDeviceSettings::parse(v.as_object().unwrap())
                .unwrap_err()
                .0
        };
        assert_eq!(parse(json!({ "led_awake": "purple" })), "led_awake");
        assert_eq!(
            parse(json!({ "display_awake": ["naïve"] })),
            "display_awake"
        );
        assert_eq!(parse(json!({ "led_delay_ms": 70_000 })), "led_delay_ms");
        assert_eq!(parse(json!({ "welcome_line": " " })), "welcome_line");
        assert_eq!(
            parse(json!({ "wake_button": { "x_mm": 90.0, "y_mm": 1.0, "radius_mm": 5.0 } })),
            "wake_button"
        );
        assert_eq!(parse(json!({ "colour": "blue" })), "colour");
    }

    #[test]
    fn the_welcome_line_is_rendered_and_scheduled_after_the_wake() {
        if Command::new("espeak-ng").arg("--version").output().is_err() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "espeak-ng is missing (needed to render the DUT's voice)"
            );
            return;
        }
        let dev = Arc::new(SimDevice::new(settings(json!({}))));
        let woke = Instant::now();
        dev.stylus_at([20.0, 35.0, 2.0], true);
        let deadline = woke + Duration::from_secs(20);
        let u = loop {
            if let Some(u) = dev.utterance() {
                break u;
            }
            assert!(Instant::now() < deadline, "no utterance within 20 s");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(u.start >= woke + Duration::from_millis(50));
        let secs = u.samples.len() as f64 / f64::from(u.rate_hz);
        assert!((0.8..10.0).contains(&secs), "{secs} s of speech");
        let peak = u.samples.iter().fold(0f32, |m, s| m.max(s.abs()));
        assert!(peak > 0.05, "peak {peak}");
        assert_eq!(u.sample_at(u.start - Duration::from_millis(1)), 0.0);
    }
}
