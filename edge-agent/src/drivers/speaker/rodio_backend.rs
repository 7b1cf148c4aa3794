//! `backend = "rodio"`: a speaker through rodio (cpal underneath:
//! PulseAudio when a server is reachable, ALSA otherwise). WAV, OGG
//! Vorbis, MP3 and FLAC decode through rodio's default Symphonia features.
//!
//! Settings (all optional):
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `device` | `default` | cpal output device id or name, or `default` |
//! | `library_dir` | none | absolute directory `play_audio_file` may play from |
//! | `tts_command` | `espeak-ng -w {out} -v {voice} -s {rate} {text}` | TTS renderer |
//! | `tts_timeout_ms` | `20000` | |
//! | `max_volume` | `1.0` | cap for every volume request |
//! | `volume` | `max_volume` | volume at start |
//! | `stall_timeout_ms` | `2000` | playback position frozen this long = device gone |
//! | `buffer_ms` | `200` | output buffer (latency vs. robustness against underruns) |
//!
//! The output stream is opened on first use and kept; when the device
//! fails (error callback or a frozen position) it is dropped, the action
//! fails with the reason, and the next action opens the device again, so a
//! speaker that comes back is used again without restarting the daemon.

use std::io::Cursor;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rodio::{DeviceSinkBuilder, MixerDeviceSink, Player, Source};
use serde::Deserialize;

use super::{AudioOutput, CommonSpeakerToml, PlaySource, PlayState, SoundInfo, SpeakerDriver};
use crate::devices::find_audio_device;
use crate::drivers::microphone::capture::release_in_background;
use crate::drivers::{Defaults, Driver, DriverConfigError, DriverError, DriverSpec};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RodioToml {
    device: String,
    library_dir: Option<std::path::PathBuf>,
    tts_command: String,
    tts_timeout_ms: u64,
    max_volume: f32,
    volume: Option<f32>,
    stall_timeout_ms: u64,
    buffer_ms: u32,
}

impl Default for RodioToml {
    /// `device = "default"`, `buffer_ms = 200`, the rest shared
    /// ([`CommonSpeakerToml`]).
    fn default() -> Self {
        let c = CommonSpeakerToml::default();
        Self {
            device: "default".into(),
            library_dir: c.library_dir,
            tts_command: c.tts_command,
            tts_timeout_ms: c.tts_timeout_ms,
            max_volume: c.max_volume,
            volume: c.volume,
            stall_timeout_ms: c.stall_timeout_ms,
            buffer_ms: 200,
        }
    }
}

impl Defaults for RodioToml {}

/// Build a rodio speaker driver. Does not open the device.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    let t: RodioToml = spec.parse()?;
    if !(10..=2000).contains(&t.buffer_ms) {
        return Err(DriverConfigError::Setting {
            capability_id: spec.capability_id.clone(),
            key: "buffer_ms".into(),
            message: format!("{} is outside 10..=2000", t.buffer_ms),
        });
    }
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
        "rodio",
        Box::new(RodioOutput {
            device: t.device,
            buffer_ms: t.buffer_ms,
            sink: None,
            player: None,
        }),
        settings,
    )))
}

struct OpenSink {
    sink: MixerDeviceSink,
    error: Arc<Mutex<Option<String>>>,
}

/// A rodio output device, looked up by name each time it is opened.
pub struct RodioOutput {
    device: String,
    /// Output buffer length, milliseconds.
    buffer_ms: u32,
    sink: Option<OpenSink>,
    player: Option<Player>,
}

impl RodioOutput {
    fn open(&mut self) -> Result<&OpenSink, DriverError> {
        if self.sink.is_none() {
            let device = find_audio_device(&cpal::default_host(), &self.device, false)
                .map_err(DriverError::Unavailable)?;
            let error = Arc::new(Mutex::new(None));
            let e2 = error.clone();
            let rate = cpal::traits::DeviceTrait::default_output_config(&device)
                .map(|c| c.sample_rate())
                .unwrap_or(48_000);
            let builder = DeviceSinkBuilder::from_device(device).map_err(|e| {
                DriverError::Unavailable(format!("cannot open audio output {}: {e}", self.label()))
            })?;
            // A generous buffer: a bench computer is often busy, and an
            // underrun is an audible gap in the evidence.
            let frames = rate * self.buffer_ms / 1000;
            let mut sink = builder
                .with_buffer_size(cpal::BufferSize::Fixed(frames.max(256)))
                .with_error_callback(move |e: cpal::Error| {
                    tracing::warn!(error = %e, "audio output error");
                    if !matches!(
                        e.kind(),
                        cpal::ErrorKind::Xrun
                            | cpal::ErrorKind::DeviceChanged
                            | cpal::ErrorKind::RealtimeDenied
                    ) {
                        let mut slot = e2.lock().unwrap_or_else(|p| p.into_inner());
                        slot.get_or_insert_with(|| e.to_string());
                    }
                })
                .open_stream()
                .map_err(|e| {
                    DriverError::Unavailable(format!(
                        "cannot open audio output {}: {e}{}",
                        self.label(),
                        std::error::Error::source(&e)
                            .map(|s| format!(": {s}"))
                            .unwrap_or_default()
                    ))
                })?;
            sink.log_on_drop(false);
            if let Err(why) = warm_up(&sink, &error) {
                release_in_background(sink);
                return Err(DriverError::Unavailable(format!(
                    "audio output {}: {why}",
                    self.label()
                )));
            }
            self.sink = Some(OpenSink { sink, error });
        }
        self.sink
            .as_ref()
            .ok_or_else(|| DriverError::Device("audio output vanished".into()))
    }
}

impl AudioOutput for RodioOutput {
    fn label(&self) -> String {
        if self.device == "default" || self.device.is_empty() {
            "default output".into()
        } else {
            format!("\"{}\"", self.device)
        }
    }

    fn probe(&self) -> Result<(), String> {
        if self.sink.is_some() {
            return Ok(());
        }
        find_audio_device(&cpal::default_host(), &self.device, false).map(|_| ())
    }

    fn play(&mut self, source: PlaySource, volume: f32) -> Result<SoundInfo, DriverError> {
        if let Some(p) = self.player.take() {
            p.stop();
        }
        let dead = self
            .sink
            .as_ref()
            .is_some_and(|s| s.error.lock().unwrap_or_else(|p| p.into_inner()).is_some());
        if dead {
            self.reset();
        }
        let mixer = self.open()?.sink.mixer().clone();
        let player = Player::connect_new(&mixer);
        player.set_volume(volume);
        let info = match source {
            PlaySource::File(path) => {
                let d = super::decoder(&PlaySource::File(path)).map_err(|e| {
                    DriverError::InvalidParams {
                        field: "file".into(),
                        message: format!("cannot decode the sound: {e}"),
                    }
                })?;
                let info = info_of(&d);
                player.append(d);
                info
            }
            PlaySource::Bytes(bytes) => {
                let d = rodio::Decoder::try_from(Cursor::new(bytes)).map_err(|e| {
                    DriverError::Device(format!("cannot decode the rendered sound: {e}"))
                })?;
                let info = info_of(&d);
                player.append(d);
                info
            }
        };
        self.player = Some(player);
        Ok(info)
    }

    fn state(&mut self) -> PlayState {
        let failed = self
            .sink
            .as_ref()
            .and_then(|s| s.error.lock().unwrap_or_else(|p| p.into_inner()).clone());
        if let Some(why) = failed {
            self.reset();
            return PlayState::Failed(why);
        }
        match &self.player {
            Some(p) if !p.empty() => PlayState::Playing(p.get_pos()),
            _ => PlayState::Idle,
        }
    }

    fn set_volume(&mut self, volume: f32) {
        if let Some(p) = &self.player {
            p.set_volume(volume);
        }
    }

    fn stop(&mut self) -> Option<Duration> {
        let p = self.player.take()?;
        let playing = !p.empty();
        let pos = p.get_pos();
        p.stop();
        playing.then_some(pos)
    }

    fn latency(&self) -> Duration {
        // cpal keeps two buffers of `buffer_ms` queued.
        Duration::from_millis(2 * u64::from(self.buffer_ms))
    }

    fn reset(&mut self) {
        if let Some(p) = self.player.take() {
            p.stop();
        }
        // A stream whose device vanished may block forever when closed.
        if let Some(s) = self.sink.take() {
            release_in_background(s);
        }
    }
}

impl Drop for RodioOutput {
    fn drop(&mut self) {
        self.reset();
    }
}

/// How long a freshly opened output may take to start consuming audio.
const START_TIMEOUT: Duration = Duration::from_secs(5);

/// Play 20 ms of silence and wait until the output has consumed it.
///
/// A new stream first pre-fills the server's buffer (PulseAudio asks for
/// up to two seconds) while the mixer has nothing to play; a sound appended
/// right after opening would start only after that silence. Waiting here
/// makes the first sound start on time, and proves that the device really
/// takes audio.
fn warm_up(sink: &MixerDeviceSink, error: &Mutex<Option<String>>) -> Result<(), String> {
    let cfg = sink.config();
    let probe = Player::connect_new(sink.mixer());
    probe.append(
        rodio::source::Zero::new(cfg.channel_count(), cfg.sample_rate())
            .take_duration(Duration::from_millis(20)),
    );
    let t0 = std::time::Instant::now();
    while !probe.empty() {
        if let Some(e) = error.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Err(e);
        }
        if t0.elapsed() > START_TIMEOUT {
            return Err(format!(
                "accepted the stream but consumed no audio within {} ms",
                START_TIMEOUT.as_millis()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn info_of<S: Source>(s: &S) -> SoundInfo {
    SoundInfo {
        duration: s.total_duration(),
        sample_rate: s.sample_rate().get(),
        channels: s.channels().get(),
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// What a table with only its required keys means; the expected text
    /// was taken from the code before the defaults moved into `Default`.
    #[test]
    fn a_minimal_table_takes_the_documented_defaults() {
        crate::drivers::defaults_pin::check::<RodioToml>(
            serde_json::json!({}),
            "RodioToml { device: \"default\", library_dir: None, tts_command: \"espeak-ng -w {out} -v {voice} -s {rate} {text}\", tts_timeout_ms: 20000, max_volume: 1.0, volume: None, stall_timeout_ms: 2000, buffer_ms: 200 }",
        );
    }
}
