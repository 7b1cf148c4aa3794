//! `backend = "sim"`: a simulated speaker. It decodes the sound for real
//! (so a corrupt or unsupported file fails as it would on a device),
//! "plays" it for its real duration on the wall clock, and honours volume
//! and `stop_playback`. TTS is rendered by the configured command exactly
//! as with a real speaker.
//!
//! Settings: the rodio ones (`device` is just a name here, default
//! `sim-speaker`) plus `connected` (default `true`; `false` simulates an
//! unplugged speaker).

use std::time::{Duration, Instant};

use serde::Deserialize;

use super::{
    probe_sound, AudioOutput, CommonSpeakerToml, PlaySource, PlayState, SoundInfo, SpeakerDriver,
};
use crate::drivers::{Defaults, Driver, DriverConfigError, DriverError, DriverSpec};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct SimToml {
    device: String,
    library_dir: Option<std::path::PathBuf>,
    tts_command: String,
    tts_timeout_ms: u64,
    max_volume: f32,
    volume: Option<f32>,
    stall_timeout_ms: u64,
    connected: bool,
}

impl Default for SimToml {
    /// `device = "sim-speaker"`, `connected = true`, the rest shared
    /// ([`CommonSpeakerToml`]).
    fn default() -> Self {
        let c = CommonSpeakerToml::default();
        Self {
            device: "sim-speaker".into(),
            library_dir: c.library_dir,
            tts_command: c.tts_command,
            tts_timeout_ms: c.tts_timeout_ms,
            max_volume: c.max_volume,
            volume: c.volume,
            stall_timeout_ms: c.stall_timeout_ms,
            connected: true,
        }
    }
}

impl Defaults for SimToml {}

/// Build a simulated speaker driver.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    let t: SimToml = spec.parse()?;
    let settings = CommonSpeakerToml {
        library_dir: t.library_dir,
        tts_command: t.tts_command,
        tts_timeout_ms: t.tts_timeout_ms,
        max_volume: t.max_volume,
        volume: t.volume,
        stall_timeout_ms: t.stall_timeout_ms,
    }
    .check(spec)?;
    Ok(Box::new(SpeakerDriver::new(
        &spec.capability_id,
        "sim",
        Box::new(SimOutput {
            name: t.device,
            connected: t.connected,
            current: None,
            volume: settings.volume,
        }),
        settings,
    )))
}

struct Current {
    started: Instant,
    duration: Duration,
}

/// The simulated output.
pub struct SimOutput {
    name: String,
    connected: bool,
    current: Option<Current>,
    volume: f32,
}

impl AudioOutput for SimOutput {
    fn label(&self) -> String {
        format!("sim speaker \"{}\"", self.name)
    }

    fn probe(&self) -> Result<(), String> {
        if self.connected {
            Ok(())
        } else {
            Err(format!(
                "no audio output device named \"{}\": simulated as unplugged",
                self.name
            ))
        }
    }

    fn play(&mut self, source: PlaySource, volume: f32) -> Result<SoundInfo, DriverError> {
        self.probe().map_err(DriverError::Unavailable)?;
        let info = probe_sound(&source, "file")?;
        self.volume = volume;
        self.current = Some(Current {
            started: Instant::now(),
            duration: info.duration.unwrap_or_default(),
        });
        Ok(info)
    }

    fn state(&mut self) -> PlayState {
        match &self.current {
            Some(c) if c.started.elapsed() < c.duration => PlayState::Playing(c.started.elapsed()),
            _ => {
                self.current = None;
                PlayState::Idle
            }
        }
    }

    fn set_volume(&mut self, volume: f32) {
        self.volume = volume;
    }

    fn stop(&mut self) -> Option<Duration> {
        let c = self.current.take()?;
        let pos = c.started.elapsed();
        (pos < c.duration).then_some(pos)
    }

    fn reset(&mut self) {
        self.current = None;
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
            "SimToml { device: \"sim-speaker\", library_dir: None, tts_command: \"espeak-ng -w {out} -v {voice} -s {rate} {text}\", tts_timeout_ms: 20000, max_volume: 1.0, volume: None, stall_timeout_ms: 2000, connected: true }",
        );
    }
}
