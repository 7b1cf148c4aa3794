//! `backend = "cpal"`: a microphone through cpal (PulseAudio when a server
//! is reachable from the daemon's environment, ALSA otherwise).
//!
//! Settings (all optional):
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `device` | `default` | cpal device id or name (`edge-agent devices` lists them), or `default` |
//! | `sample_rate` | device default | Hz |
//! | `channels` | device default | |
//! | `max_duration_ms` | `60000` | longest `record_audio` |
//! | `ring_seconds` | `30` | length of the stream ring |
//! | `capture_timeout_ms` | `2000` | no audio callback for this long = device gone |
//! | `vad_threshold_dbfs` | `-40` | voice-activity threshold |
//! | `noise_profile` | none | registration metadata |
//!
//! The sample format is whatever the device supports (its default format
//! when it offers the wanted rate and channels in it, else the first
//! convertible one); samples are converted to `f32` in the callback and
//! written to WAV as 16-bit PCM.

use std::sync::Arc;
use std::time::Duration;

use cpal::traits::{DeviceTrait, StreamTrait};
use cpal::{FromSample, SampleFormat, SizedSample};
use serde::Deserialize;

use super::capture::CaptureBuffer;
use super::{AudioInput, AudioRequest, CommonMicToml, MicrophoneDriver, OpenCapture};
use crate::devices::{device_name, find_audio_device, summarize_ranges};
use crate::drivers::{Defaults, Driver, DriverConfigError, DriverError, DriverSpec};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct CpalToml {
    device: String,
    sample_rate: Option<u32>,
    channels: Option<u16>,
    max_duration_ms: u64,
    ring_seconds: u32,
    capture_timeout_ms: u64,
    vad_threshold_dbfs: f32,
    noise_profile: Option<String>,
}

impl Default for CpalToml {
    /// `device = "default"`, the rest shared ([`CommonMicToml`]).
    fn default() -> Self {
        let c = CommonMicToml::default();
        Self {
            device: "default".into(),
            sample_rate: c.sample_rate,
            channels: c.channels,
            max_duration_ms: c.max_duration_ms,
            ring_seconds: c.ring_seconds,
            capture_timeout_ms: c.capture_timeout_ms,
            vad_threshold_dbfs: c.vad_threshold_dbfs,
            noise_profile: c.noise_profile,
        }
    }
}

impl Defaults for CpalToml {}

/// Build a cpal microphone driver. Does not open the device.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    let t: CpalToml = spec.parse()?;
    let settings = CommonMicToml {
        sample_rate: t.sample_rate,
        channels: t.channels,
        max_duration_ms: t.max_duration_ms,
        ring_seconds: t.ring_seconds,
        capture_timeout_ms: t.capture_timeout_ms,
        vad_threshold_dbfs: t.vad_threshold_dbfs,
        noise_profile: t.noise_profile,
    }
    .check(spec)?;
    Ok(Box::new(MicrophoneDriver::new(
        &spec.capability_id,
        "cpal",
        Arc::new(CpalInput { device: t.device }),
        settings,
    )))
}

/// A cpal input device, looked up by name each time it is opened (so a
/// re-plugged device is found again).
pub struct CpalInput {
    device: String,
}

/// Sample formats the callback converts, in order of preference when the
/// device's default format cannot be used.
const CONVERTIBLE: [SampleFormat; 12] = [
    SampleFormat::F32,
    SampleFormat::I16,
    SampleFormat::I32,
    SampleFormat::I24,
    SampleFormat::U16,
    SampleFormat::I8,
    SampleFormat::U8,
    SampleFormat::F64,
    SampleFormat::I64,
    SampleFormat::U24,
    SampleFormat::U32,
    SampleFormat::U64,
];

impl CpalInput {
    fn label_for(name: &str) -> String {
        if name == "default" || name.is_empty() {
            "default input".into()
        } else {
            format!("\"{name}\"")
        }
    }

    fn device(&self) -> Result<cpal::Device, String> {
        find_audio_device(&cpal::default_host(), &self.device, true)
    }
}

impl AudioInput for CpalInput {
    fn label(&self) -> String {
        Self::label_for(&self.device)
    }

    fn probe(&self) -> Result<(), String> {
        let d = self.device()?;
        d.supported_input_configs()
            .map_err(|e| format!("audio input {}: {e}", self.label()))
            .map(|_| ())
    }

    fn open(&self, want: AudioRequest, capacity: Duration) -> Result<OpenCapture, DriverError> {
        let device = self.device().map_err(DriverError::Unavailable)?;
        let name = device_name(&device);
        let default = device.default_input_config().ok();
        let ranges: Vec<cpal::SupportedStreamConfigRange> = device
            .supported_input_configs()
            .map_err(|e| DriverError::Unavailable(format!("audio input {name}: {e}")))?
            .collect();
        let channels = want
            .channels
            .or(default.as_ref().map(|d| d.channels()))
            .unwrap_or(1);
        let rate = want
            .sample_rate
            .or(default.as_ref().map(|d| d.sample_rate()))
            .unwrap_or(48_000);
        let fits = |r: &&cpal::SupportedStreamConfigRange| {
            r.channels() == channels
                && r.min_sample_rate() <= rate
                && rate <= r.max_sample_rate()
                && CONVERTIBLE.contains(&r.sample_format())
        };
        let preferred = default.as_ref().map(|d| d.sample_format());
        let chosen = ranges
            .iter()
            .filter(fits)
            .find(|r| Some(r.sample_format()) == preferred)
            .or_else(|| {
                CONVERTIBLE
                    .iter()
                    .find_map(|f| ranges.iter().filter(fits).find(|r| r.sample_format() == *f))
            })
            .ok_or_else(|| {
                let rows: Vec<(String, u16, u32, u32)> = ranges
                    .iter()
                    .map(|r| {
                        (
                            r.sample_format().to_string(),
                            r.channels(),
                            r.min_sample_rate(),
                            r.max_sample_rate(),
                        )
                    })
                    .collect();
                let offers: Vec<String> = summarize_ranges(&rows)
                    .iter()
                    .map(|r| {
                        format!(
                            "{} {:?} ch {}..{} Hz",
                            r.sample_format, r.channels, r.min_sample_rate, r.max_sample_rate
                        )
                    })
                    .collect();
                DriverError::Device(format!(
                    "audio input {name} cannot record {channels} channel(s) at {rate} Hz; it offers: {}",
                    if offers.is_empty() { "nothing".to_string() } else { offers.join("; ") }
                ))
            })?;
        let format = chosen.sample_format();
        let config = cpal::StreamConfig {
            channels,
            sample_rate: rate,
            buffer_size: cpal::BufferSize::Default,
        };
        let frames = (capacity.as_secs_f64() * f64::from(rate)).ceil() as usize;
        let buffer = Arc::new(CaptureBuffer::new(channels, rate, frames));
        let data_buf = buffer.clone();
        let err_buf = buffer.clone();
        let err_name = name.clone();
        let stream = device
            .build_input_stream_raw(
                config,
                format,
                move |data: &cpal::Data, _: &cpal::InputCallbackInfo| {
                    push_converted(data, &data_buf)
                },
                move |e: cpal::Error| {
                    tracing::warn!(device = %err_name, error = %e, "audio input error");
                    if is_fatal(&e) {
                        err_buf.fail(format!("audio input {err_name} failed: {e}"));
                    }
                },
                Some(Duration::from_secs(3)),
            )
            .map_err(|e| {
                DriverError::Unavailable(format!("cannot open audio input {name}: {e}"))
            })?;
        stream.play().map_err(|e| {
            DriverError::Unavailable(format!("cannot start audio input {name}: {e}"))
        })?;
        Ok(OpenCapture {
            buffer,
            device_name: name,
            device_sample_format: format.to_string(),
            keepalive: Box::new(stream),
        })
    }

    fn sample_rate_options(&self) -> Vec<u32> {
        let Ok(d) = self.device() else {
            return Vec::new();
        };
        let Ok(ranges) = d.supported_input_configs() else {
            return Vec::new();
        };
        let ranges: Vec<_> = ranges.collect();
        [8_000, 16_000, 22_050, 44_100, 48_000, 96_000]
            .into_iter()
            .filter(|r| {
                ranges
                    .iter()
                    .any(|c| c.min_sample_rate() <= *r && *r <= c.max_sample_rate())
            })
            .collect()
    }
}

/// Errors after which the stream delivers nothing more.
fn is_fatal(e: &cpal::Error) -> bool {
    !matches!(
        e.kind(),
        cpal::ErrorKind::Xrun | cpal::ErrorKind::DeviceChanged | cpal::ErrorKind::RealtimeDenied
    )
}

fn push_converted(data: &cpal::Data, buf: &CaptureBuffer) {
    let converted = match data.sample_format() {
        SampleFormat::F32 => data.as_slice::<f32>().map(<[f32]>::to_vec),
        SampleFormat::I16 => convert::<i16>(data),
        SampleFormat::I32 => convert::<i32>(data),
        SampleFormat::I24 => convert::<cpal::I24>(data),
        SampleFormat::U16 => convert::<u16>(data),
        SampleFormat::I8 => convert::<i8>(data),
        SampleFormat::U8 => convert::<u8>(data),
        SampleFormat::F64 => convert::<f64>(data),
        SampleFormat::I64 => convert::<i64>(data),
        SampleFormat::U24 => convert::<cpal::U24>(data),
        SampleFormat::U32 => convert::<u32>(data),
        SampleFormat::U64 => convert::<u64>(data),
        other => {
            buf.fail(format!("sample format {other} cannot be converted"));
            None
        }
    };
    if let Some(samples) = converted {
        buf.push(&samples);
    }
}

fn convert<T>(data: &cpal::Data) -> Option<Vec<f32>>
where
    T: SizedSample,
    f32: FromSample<T>,
{
    data.as_slice::<T>()
        .map(|s| s.iter().map(|x| f32::from_sample_(*x)).collect())
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// What a table with only its required keys means; the expected text
    /// was taken from the code before the defaults moved into `Default`.
    #[test]
    fn a_minimal_table_takes_the_documented_defaults() {
        crate::drivers::defaults_pin::check::<CpalToml>(
            serde_json::json!({}),
            "CpalToml { device: \"default\", sample_rate: None, channels: None, max_duration_ms: 60000, ring_seconds: 30, capture_timeout_ms: 2000, vad_threshold_dbfs: -40.0, noise_profile: None }",
        );
    }
}
