//! `backend = "sim"`: a simulated microphone.
//!
//! A generator thread delivers audio in real time (10 ms blocks, like a
//! sound card callback) into the same capture buffer a real device fills,
//! so recordings take as long as they last and streams fill their ring at
//! the sample rate.
//!
//! Settings: the cpal ones (`device` is just a name here, default
//! `sim-microphone`; `sample_rate` defaults to 48000 and `channels` to 1),
//! plus
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `signal` | `tone` | `tone`, `noise`, `speech_bursts` (400 ms bursts every second) or `silence` |
//! | `tone_hz` | `440` | frequency of `tone` |
//! | `level_dbfs` | `-12` | signal level |
//! | `supported_sample_rates` | `[8000, 16000, 22050, 44100, 48000]` | others are refused like a device would |
//! | `max_channels` | `2` | |
//! | `connected` | `true` | `false` simulates an unplugged microphone |
//!
//! On an edge with a simulated DUT ([`crate::drivers::sim_device`]) the
//! microphone also hears the DUT's welcome line, mixed into `signal` in
//! real time while it is said (over a quiet `signal = "noise"` floor,
//! recognisers hear it best).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::capture::CaptureBuffer;
use super::{AudioInput, AudioRequest, CommonMicToml, MicrophoneDriver, OpenCapture};
use crate::drivers::sim_device::{self, SimDevice};
use crate::drivers::{Defaults, Driver, DriverConfigError, DriverError, DriverSpec};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct SimToml {
    device: String,
    sample_rate: Option<u32>,
    channels: Option<u16>,
    max_duration_ms: u64,
    ring_seconds: u32,
    capture_timeout_ms: u64,
    vad_threshold_dbfs: f32,
    noise_profile: Option<String>,
    signal: String,
    tone_hz: f32,
    level_dbfs: f32,
    supported_sample_rates: Vec<u32>,
    max_channels: u16,
    connected: bool,
}

impl Default for SimToml {
    /// The simulator's own keys' defaults, the rest shared
    /// ([`CommonMicToml`]).
    fn default() -> Self {
        let c = CommonMicToml::default();
        Self {
            device: "sim-microphone".into(),
            sample_rate: c.sample_rate,
            channels: c.channels,
            max_duration_ms: c.max_duration_ms,
            ring_seconds: c.ring_seconds,
            capture_timeout_ms: c.capture_timeout_ms,
            vad_threshold_dbfs: c.vad_threshold_dbfs,
            noise_profile: c.noise_profile,
            signal: "tone".into(),
            tone_hz: 440.0,
            level_dbfs: -12.0,
            supported_sample_rates: vec![8_000, 16_000, 22_050, 44_100, 48_000],
            max_channels: 2,
            connected: true,
        }
    }
}

impl Defaults for SimToml {}

/// What the simulated microphone hears.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Signal {
    Tone,
    Noise,
    SpeechBursts,
    Silence,
}

/// Build a simulated microphone driver.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    let t: SimToml = spec.parse()?;
    let bad = |key: &str, message: String| DriverConfigError::Setting {
        capability_id: spec.capability_id.clone(),
        key: key.into(),
        message,
    };
    let signal = match t.signal.as_str() {
        "tone" => Signal::Tone,
        "noise" => Signal::Noise,
        "speech_bursts" => Signal::SpeechBursts,
        "silence" => Signal::Silence,
        other => {
            return Err(bad(
                "signal",
                format!("`{other}` is not one of tone, noise, speech_bursts, silence"),
            ))
        }
    };
    if !(20.0..=20_000.0).contains(&t.tone_hz) {
        return Err(bad(
            "tone_hz",
            format!("{} is outside 20..=20000", t.tone_hz),
        ));
    }
    if !(-120.0..=0.0).contains(&t.level_dbfs) {
        return Err(bad(
            "level_dbfs",
            format!("{} is outside -120..=0", t.level_dbfs),
        ));
    }
    if t.supported_sample_rates.is_empty() {
        return Err(bad("supported_sample_rates", "must not be empty".into()));
    }
    if !(1..=32).contains(&t.max_channels) {
        return Err(bad(
            "max_channels",
            format!("{} is outside 1..=32", t.max_channels),
        ));
    }
    let settings = CommonMicToml {
        sample_rate: Some(t.sample_rate.unwrap_or(48_000)),
        channels: Some(t.channels.unwrap_or(1)),
        max_duration_ms: t.max_duration_ms,
        ring_seconds: t.ring_seconds,
        capture_timeout_ms: t.capture_timeout_ms,
        vad_threshold_dbfs: t.vad_threshold_dbfs,
        noise_profile: t.noise_profile,
    }
    .check(spec)?;
    let input = SimInput {
        name: t.device,
        signal,
        tone_hz: t.tone_hz,
        amplitude: 10f32.powf(t.level_dbfs / 20.0),
        rates: t.supported_sample_rates,
        max_channels: t.max_channels,
        connected: t.connected,
        dut: sim_device::attached(&spec.state_dir),
    };
    Ok(Box::new(MicrophoneDriver::new(
        &spec.capability_id,
        "sim",
        Arc::new(input),
        settings,
    )))
}

/// The simulated microphone.
pub struct SimInput {
    name: String,
    signal: Signal,
    tone_hz: f32,
    /// Linear peak amplitude.
    amplitude: f32,
    rates: Vec<u32>,
    max_channels: u16,
    connected: bool,
    /// The simulated DUT whose voice it hears.
    dut: Option<Arc<SimDevice>>,
}

struct Stop(Arc<AtomicBool>);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl AudioInput for SimInput {
    fn label(&self) -> String {
        format!("sim microphone \"{}\"", self.name)
    }

    fn probe(&self) -> Result<(), String> {
        if self.connected {
            Ok(())
        } else {
            Err(format!(
                "no audio input device named \"{}\": simulated as unplugged",
                self.name
            ))
        }
    }

    fn open(&self, want: AudioRequest, capacity: Duration) -> Result<OpenCapture, DriverError> {
        self.probe().map_err(DriverError::Unavailable)?;
        let rate = want.sample_rate.unwrap_or(48_000);
        let channels = want.channels.unwrap_or(1);
        if !self.rates.contains(&rate) {
            return Err(DriverError::Device(format!(
                "{} cannot record at {rate} Hz; it offers {:?} Hz",
                self.label(),
                self.rates
            )));
        }
        if channels == 0 || channels > self.max_channels {
            return Err(DriverError::Device(format!(
                "{} cannot record {channels} channel(s); it has {}",
                self.label(),
                self.max_channels
            )));
        }
        let frames = (capacity.as_secs_f64() * f64::from(rate)).ceil() as usize;
        let buffer = Arc::new(CaptureBuffer::new(channels, rate, frames));
        let stop = Arc::new(AtomicBool::new(false));
        let gen = Generator {
            signal: self.signal,
            tone_hz: self.tone_hz,
            amplitude: self.amplitude,
            rate,
            channels,
            frame: 0,
            noise_state: 0x2545_F491_4F6C_DD1D,
            dut: self.dut.clone(),
        };
        let (b, s) = (buffer.clone(), stop.clone());
        std::thread::Builder::new()
            .name("sim-microphone".into())
            .spawn(move || gen.run(&b, &s))
            .map_err(|e| DriverError::Device(format!("cannot start the sim microphone: {e}")))?;
        Ok(OpenCapture {
            buffer,
            device_name: self.name.clone(),
            device_sample_format: "f32".into(),
            keepalive: Box::new(Stop(stop)),
        })
    }

    fn sample_rate_options(&self) -> Vec<u32> {
        self.rates.clone()
    }
}

struct Generator {
    signal: Signal,
    tone_hz: f32,
    amplitude: f32,
    rate: u32,
    channels: u16,
    frame: u64,
    noise_state: u64,
    dut: Option<Arc<SimDevice>>,
}

impl Generator {
    fn run(mut self, buffer: &CaptureBuffer, stop: &AtomicBool) {
        let t0 = Instant::now();
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
            let due = (t0.elapsed().as_secs_f64() * f64::from(self.rate)) as u64;
            let mut block =
                Vec::with_capacity(((due - self.frame) * u64::from(self.channels)) as usize);
            let voice = self.dut.as_ref().and_then(|d| d.utterance());
            while self.frame < due {
                let mut s = self.sample();
                if let Some(v) = &voice {
                    let at = t0 + Duration::from_secs_f64(self.frame as f64 / f64::from(self.rate));
                    s = (s + v.sample_at(at)).clamp(-1.0, 1.0);
                }
                for _ in 0..self.channels {
                    block.push(s);
                }
                self.frame += 1;
            }
            buffer.push(&block);
        }
    }

    fn noise(&mut self) -> f32 {
        // xorshift64*: deterministic, good enough for a noise floor.
        let mut x = self.noise_state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.noise_state = x;
        let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        (v as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn sample(&mut self) -> f32 {
        let t = self.frame as f32 / self.rate as f32;
        let tau = 2.0 * std::f32::consts::PI;
        match self.signal {
            Signal::Tone => self.amplitude * (tau * self.tone_hz * t).sin(),
            Signal::Noise => self.amplitude * self.noise(),
            Signal::Silence => 3e-5 * self.noise(),
            Signal::SpeechBursts => {
                let floor = 3e-4 * self.noise();
                let phase = self.frame % u64::from(self.rate);
                let burst = u64::from(self.rate) * 2 / 5;
                if phase < burst {
                    // A voiced sound: 150 Hz fundamental with harmonics,
                    // raised-cosine envelope.
                    let env = 0.5 - 0.5 * (tau * phase as f32 / burst as f32).cos();
                    let voice = (tau * 150.0 * t).sin()
                        + 0.5 * (tau * 300.0 * t).sin()
                        + 0.25 * (tau * 450.0 * t).sin();
                    floor + self.amplitude * env * voice / 1.75
                } else {
                    floor
                }
            }
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
        crate::drivers::defaults_pin::check::<SimToml>(
            serde_json::json!({}),
            "SimToml { device: \"sim-microphone\", sample_rate: None, channels: None, max_duration_ms: 60000, ring_seconds: 30, capture_timeout_ms: 2000, vad_threshold_dbfs: -40.0, noise_profile: None, signal: \"tone\", tone_hz: 440.0, level_dbfs: -12.0, supported_sample_rates: [8000, 16000, 22050, 44100, 48000], max_channels: 2, connected: true }",
        );
    }
}
