//! Microphone driver (docs/actions.md, "microphone"): `record_audio`,
//! `start_audio_stream` / `stop_audio_stream`.
//!
//! Backends: `cpal` ([`cpal_backend`]: PulseAudio when a server is
//! reachable, ALSA otherwise) and `sim` ([`sim`]: a generated signal in
//! real time). A backend only opens a capture into a [`CaptureBuffer`];
//! recording, the stream ring, voice-activity detection ([`vad`]) and the
//! WAV evidence ([`wav`], always 16-bit PCM whatever the device's sample
//! format) are shared.

pub mod capture;
pub mod cpal_backend;
pub mod sim;
pub mod vad;
pub mod wav;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use shared_protocol::artifact::ArtifactType;
use shared_protocol::capability::{CapabilityAction, CapabilityType};

use self::capture::{release_in_background, CaptureBuffer};
use self::vad::{VadConfig, VadReport};
use super::camera::rfc3339;
use super::{
    parse_params, unsupported, ActionOutcome, ActionRequest, Driver, DriverConfigError,
    DriverError, DriverHealth, DriverSpec, NewArtifact,
};
use crate::devices::{ProbeCache, HEALTH_PROBE_TTL};

/// What the driver asks the device for; `None` means the device default.
#[derive(Debug, Clone, Copy, Default)]
pub struct AudioRequest {
    /// Hz.
    pub sample_rate: Option<u32>,
    pub channels: Option<u16>,
}

/// A running capture. Dropping it stops the device stream.
pub struct OpenCapture {
    pub buffer: Arc<CaptureBuffer>,
    /// The device's name as the host reports it.
    pub device_name: String,
    /// The format the device delivers (`f32`, `i16`, ...), before the
    /// conversion to `f32`.
    pub device_sample_format: String,
    /// Keeps the device stream alive.
    pub keepalive: Box<dyn Send>,
}

/// A microphone backend.
pub trait AudioInput: Send + Sync {
    /// e.g. `default input`, `"vsink.monitor"`.
    fn label(&self) -> String;
    /// Cheap presence check; `Err` says why not (`no audio input device: ...`).
    fn probe(&self) -> Result<(), String>;
    /// Start capturing into a new buffer that holds `capacity` of audio.
    fn open(&self, want: AudioRequest, capacity: Duration) -> Result<OpenCapture, DriverError>;
    /// Sample rates to advertise at registration.
    fn sample_rate_options(&self) -> Vec<u32>;
}

/// Settings every microphone backend shares.
#[derive(Debug, Clone)]
pub struct MicSettings {
    pub request: AudioRequest,
    /// Longest `record_audio`, milliseconds.
    pub max_duration_ms: u64,
    /// Length of the stream ring.
    pub ring_seconds: u32,
    /// Longest silence from the device (no callbacks at all) before it is
    /// declared gone.
    pub capture_timeout: Duration,
    pub vad: VadConfig,
    /// Registration metadata (`noise_profile`).
    pub noise_profile: Option<String>,
}

impl Default for CommonMicToml {
    /// The defaults every microphone backend shares.
    fn default() -> Self {
        Self {
            sample_rate: None,
            channels: None,
            max_duration_ms: 60_000,
            ring_seconds: 30,
            capture_timeout_ms: 2_000,
            vad_threshold_dbfs: -40.0,
            noise_profile: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct CommonMicToml {
    pub sample_rate: Option<u32>,
    pub channels: Option<u16>,
    pub max_duration_ms: u64,
    pub ring_seconds: u32,
    pub capture_timeout_ms: u64,
    pub vad_threshold_dbfs: f32,
    pub noise_profile: Option<String>,
}

impl CommonMicToml {
    pub(crate) fn check(&self, spec: &DriverSpec) -> Result<MicSettings, DriverConfigError> {
        let bad = |key: &str, message: String| DriverConfigError::Setting {
            capability_id: spec.capability_id.clone(),
            key: key.into(),
            message,
        };
        if let Some(r) = self.sample_rate {
            if !(1_000..=384_000).contains(&r) {
                return Err(bad(
                    "sample_rate",
                    format!("{r} Hz is outside 1000..=384000"),
                ));
            }
        }
        if let Some(c) = self.channels {
            if !(1..=32).contains(&c) {
                return Err(bad("channels", format!("{c} is outside 1..=32")));
            }
        }
        if !(100..=3_600_000).contains(&self.max_duration_ms) {
            return Err(bad(
                "max_duration_ms",
                format!("{} is outside 100..=3600000", self.max_duration_ms),
            ));
        }
        if !(1..=3600).contains(&self.ring_seconds) {
            return Err(bad(
                "ring_seconds",
                format!("{} is outside 1..=3600", self.ring_seconds),
            ));
        }
        if !(100..=60_000).contains(&self.capture_timeout_ms) {
            return Err(bad(
                "capture_timeout_ms",
                format!("{} is outside 100..=60000", self.capture_timeout_ms),
            ));
        }
        if !(-120.0..=0.0).contains(&self.vad_threshold_dbfs) {
            return Err(bad(
                "vad_threshold_dbfs",
                format!("{} is outside -120..=0", self.vad_threshold_dbfs),
            ));
        }
        Ok(MicSettings {
            request: AudioRequest {
                sample_rate: self.sample_rate,
                channels: self.channels,
            },
            max_duration_ms: self.max_duration_ms,
            ring_seconds: self.ring_seconds,
            capture_timeout: Duration::from_millis(self.capture_timeout_ms),
            vad: VadConfig {
                threshold_dbfs: self.vad_threshold_dbfs,
                ..VadConfig::default()
            },
            noise_profile: self.noise_profile.clone(),
        })
    }
}

/// Build a Microphone driver from its bench TOML section (`backend =
/// "cpal"` or `"sim"`).
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    match spec.backend.as_str() {
        "cpal" => cpal_backend::build(spec),
        "sim" => sim::build(spec),
        _ => Err(spec.unknown_backend(&["cpal", "sim"])),
    }
}

struct Stream {
    capture: OpenCapture,
    started: Instant,
}

/// The microphone driver.
pub struct MicrophoneDriver {
    capability_id: String,
    backend_name: &'static str,
    input: Arc<dyn AudioInput>,
    settings: MicSettings,
    stream: Option<Stream>,
    probe: ProbeCache,
    last_failure: Option<(Instant, String)>,
}

impl MicrophoneDriver {
    /// A driver around `input` (called by the backends' `build`).
    pub fn new(
        capability_id: &str,
        backend_name: &'static str,
        input: Arc<dyn AudioInput>,
        settings: MicSettings,
    ) -> Self {
        Self {
            capability_id: capability_id.to_string(),
            backend_name,
            input,
            settings,
            stream: None,
            probe: ProbeCache::new(HEALTH_PROBE_TTL),
            last_failure: None,
        }
    }

    fn open(&mut self, capacity: Duration) -> Result<OpenCapture, DriverError> {
        match self.input.open(self.settings.request, capacity) {
            Ok(c) => {
                self.last_failure = None;
                self.probe.invalidate();
                Ok(c)
            }
            Err(e) => {
                self.note_failure(&e);
                Err(e)
            }
        }
    }

    fn note_failure(&mut self, e: &DriverError) {
        if matches!(e, DriverError::Unavailable(_)) {
            self.last_failure = Some((Instant::now(), e.to_string()));
        }
    }

    /// Wait until `buffer` holds absolute frames up to `until`.
    fn wait_for(
        &self,
        buffer: &CaptureBuffer,
        until: u64,
        req: &ActionRequest,
    ) -> Result<(), DriverError> {
        let entered = Instant::now();
        loop {
            let st = buffer.status();
            if st.total_frames >= until {
                return Ok(());
            }
            if let Some(e) = st.error {
                return Err(DriverError::Unavailable(format!(
                    "microphone {}: {e}",
                    self.input.label()
                )));
            }
            if st.quiet_for > self.settings.capture_timeout {
                return Err(DriverError::Unavailable(format!(
                    "microphone {} delivered no audio for {} ms (unplugged or audio server gone?)",
                    self.input.label(),
                    st.quiet_for.as_millis()
                )));
            }
            if req.cancel.is_cancelled() {
                return Err(DriverError::Cancelled("while recording audio".into()));
            }
            let now = Instant::now();
            if now >= req.deadline {
                return Err(DriverError::Timeout(
                    req.deadline.saturating_duration_since(entered).as_millis() as u64,
                ));
            }
            buffer.wait(Duration::from_millis(20));
        }
    }

    fn record_audio(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            duration_ms: u64,
            #[serde(default)]
            vad: Option<bool>,
        }
        let p: P = parse_params(&req.params)?;
        if p.duration_ms == 0 || p.duration_ms > self.settings.max_duration_ms {
            return Err(DriverError::InvalidParams {
                field: "duration_ms".into(),
                message: format!(
                    "{} is outside 1..={} (max_duration_ms)",
                    p.duration_ms, self.settings.max_duration_ms
                ),
            });
        }
        let started_at = Utc::now();
        // While a stream runs, record from it (the device is already open).
        let (buffer, from, owned, device_name, device_format) = match &self.stream {
            Some(s) => {
                if p.duration_ms > u64::from(self.settings.ring_seconds) * 1000 {
                    return Err(DriverError::InvalidParams {
                        field: "duration_ms".into(),
                        message: format!(
                            "longer than the running stream's ring ({} s); stop the stream first",
                            self.settings.ring_seconds
                        ),
                    });
                }
                (
                    s.capture.buffer.clone(),
                    s.capture.buffer.status().total_frames,
                    None,
                    s.capture.device_name.clone(),
                    s.capture.device_sample_format.clone(),
                )
            }
            None => {
                let c = self.open(Duration::from_millis(p.duration_ms + 500))?;
                (
                    c.buffer.clone(),
                    0,
                    Some(c.keepalive),
                    c.device_name,
                    c.device_sample_format,
                )
            }
        };
        let needed = p.duration_ms * u64::from(buffer.sample_rate) / 1000;
        let waited = self.wait_for(&buffer, from + needed, req);
        if let Some(k) = owned {
            release_in_background(k);
        }
        // A cancelled recording keeps the audio recorded until then.
        let (frames, cancelled) = match waited {
            Ok(()) => (needed, None),
            Err(DriverError::Cancelled(why)) => {
                let got = buffer.status().total_frames.saturating_sub(from);
                if got == 0 {
                    return Err(DriverError::Cancelled(why));
                }
                (got.min(needed), Some(why))
            }
            Err(e) => {
                self.note_failure(&e);
                if matches!(e, DriverError::Unavailable(_)) {
                    if let Some(s) = self.stream.take() {
                        release_in_background(s.capture.keepalive);
                    }
                }
                return Err(e);
            }
        };
        let samples = buffer.copy_frames(from, frames);
        let mut outcome = self.audio_evidence(
            &samples,
            &buffer,
            p.vad.unwrap_or(true),
            started_at,
            &device_name,
            &device_format,
        )?;
        outcome.result_summary.insert(
            "from_stream".into(),
            json!(from > 0 || self.stream.is_some()),
        );
        outcome
            .result_summary
            .insert("partial".into(), json!(cancelled.is_some()));
        match cancelled {
            None => Ok(outcome),
            Some(why) => Err(DriverError::CancelledPartway {
                why: format!(
                    "record_audio cancelled after {} of {} ms ({why}); the audio recorded until then is kept",
                    outcome.result_summary["duration_ms"], p.duration_ms
                ),
                partial: Box::new(outcome),
            }),
        }
    }

    /// A WAV artifact (plus VAD metadata) for `samples`.
    fn audio_evidence(
        &self,
        samples: &[f32],
        buffer: &CaptureBuffer,
        run_vad: bool,
        captured_at: chrono::DateTime<Utc>,
        device_name: &str,
        device_format: &str,
    ) -> Result<ActionOutcome, DriverError> {
        let channels = buffer.channels;
        let rate = buffer.sample_rate;
        let frames = samples.len() / usize::from(channels);
        let duration_ms = frames as u64 * 1000 / u64::from(rate.max(1));
        let bytes = wav::encode_i16(samples, channels, rate)?;
        let mono = wav::to_mono(samples, channels);
        let report = vad::analyze(&mono, rate, &self.settings.vad);
        let mut metadata = Map::new();
        metadata.insert("sample_rate".into(), json!(rate));
        metadata.insert("channels".into(), json!(channels));
        metadata.insert("duration_ms".into(), json!(duration_ms));
        metadata.insert("bits_per_sample".into(), json!(16));
        metadata.insert("device".into(), json!(device_name));
        metadata.insert("device_sample_format".into(), json!(device_format));
        metadata.insert("captured_at".into(), json!(rfc3339(captured_at)));
        metadata.insert("rms_dbfs".into(), json!(round1(report.rms_dbfs)));
        metadata.insert("peak_dbfs".into(), json!(round1(report.peak_dbfs)));
        if run_vad {
            metadata.insert("vad".into(), vad_json(&report));
        }
        let mut summary = Map::new();
        summary.insert("duration_ms".into(), json!(duration_ms));
        summary.insert("sample_rate".into(), json!(rate));
        summary.insert("channels".into(), json!(channels));
        summary.insert("frames".into(), json!(frames));
        summary.insert("rms_dbfs".into(), json!(round1(report.rms_dbfs)));
        summary.insert("peak_dbfs".into(), json!(round1(report.peak_dbfs)));
        summary.insert("device".into(), json!(device_name));
        if run_vad {
            summary.insert(
                "voice_activity_ratio".into(),
                json!(round3(report.voice_activity_ratio)),
            );
            summary.insert("voice_detected".into(), json!(!report.segments.is_empty()));
        }
        Ok(ActionOutcome {
            result_summary: summary,
            artifacts: vec![NewArtifact {
                artifact_type: ArtifactType::AudioClip,
                content_type: "audio/wav".into(),
                bytes,
                duration_ms: Some(duration_ms),
                metadata,
            }],
        })
    }

    fn start_audio_stream(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {}
        let _: P = parse_params(&req.params)?;
        let already = self.stream.is_some();
        if !already {
            let ring = Duration::from_secs(u64::from(self.settings.ring_seconds));
            let capture = self.open(ring)?;
            self.stream = Some(Stream {
                capture,
                started: Instant::now(),
            });
        }
        let Some(s) = &self.stream else {
            return Err(DriverError::Device("stream vanished while starting".into()));
        };
        let mut summary = Map::new();
        summary.insert("streaming".into(), json!(true));
        summary.insert("already_streaming".into(), json!(already));
        summary.insert("sample_rate".into(), json!(s.capture.buffer.sample_rate));
        summary.insert("channels".into(), json!(s.capture.buffer.channels));
        summary.insert("ring_seconds".into(), json!(self.settings.ring_seconds));
        summary.insert("device".into(), json!(s.capture.device_name));
        Ok(ActionOutcome {
            result_summary: summary,
            artifacts: Vec::new(),
        })
    }

    fn stop_audio_stream(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            #[serde(default)]
            keep: Option<String>,
            #[serde(default)]
            last_ms: Option<u64>,
        }
        let p: P = parse_params(&req.params)?;
        let keep = p.keep.as_deref().unwrap_or("clip");
        if !matches!(keep, "none" | "clip" | "voice") {
            return Err(DriverError::InvalidParams {
                field: "keep".into(),
                message: format!("`{keep}` is not one of none, clip, voice"),
            });
        }
        let Some(stream) = self.stream.take() else {
            return Err(DriverError::InvalidParams {
                field: "action".into(),
                message: "no audio stream is running (call start_audio_stream first)".into(),
            });
        };
        let buffer = stream.capture.buffer.clone();
        let device_name = stream.capture.device_name.clone();
        let device_format = stream.capture.device_sample_format.clone();
        let stream_ms = stream.started.elapsed().as_millis() as u64;
        release_in_background(stream.capture.keepalive);
        let st = buffer.status();
        let samples = buffer.copy_last(p.last_ms);
        let rate = buffer.sample_rate;
        let ch = usize::from(buffer.channels);
        let held_ms = (samples.len() / ch) as u64 * 1000 / u64::from(rate.max(1));
        let captured_at = Utc::now() - chrono::Duration::milliseconds(held_ms as i64);
        let mut outcome = match keep {
            "none" => ActionOutcome::default(),
            "clip" if !samples.is_empty() => self.audio_evidence(
                &samples,
                &buffer,
                true,
                captured_at,
                &device_name,
                &device_format,
            )?,
            "voice" if !samples.is_empty() => {
                let mono = wav::to_mono(&samples, buffer.channels);
                let report = vad::analyze(&mono, rate, &self.settings.vad);
                match (report.segments.first(), report.segments.last()) {
                    (Some(first), Some(last)) => {
                        // The excerpt from the first to the last activity,
                        // with 200 ms of context either side.
                        let from_ms = first.start_ms.saturating_sub(200);
                        let to_ms = (last.end_ms + 200).min(held_ms);
                        let a = (from_ms * u64::from(rate) / 1000) as usize * ch;
                        let b = ((to_ms * u64::from(rate) / 1000) as usize * ch).min(samples.len());
                        let mut o = self.audio_evidence(
                            &samples[a..b],
                            &buffer,
                            true,
                            captured_at + chrono::Duration::milliseconds(from_ms as i64),
                            &device_name,
                            &device_format,
                        )?;
                        if let Some(a) = o.artifacts.first_mut() {
                            a.metadata
                                .insert("excerpt_offset_ms".into(), json!(from_ms));
                        }
                        o
                    }
                    _ => {
                        let mut o = ActionOutcome::default();
                        o.result_summary
                            .insert("voice_detected".into(), json!(false));
                        o
                    }
                }
            }
            _ => ActionOutcome::default(),
        };
        let s = &mut outcome.result_summary;
        s.insert("keep".into(), json!(keep));
        s.insert("stream_ms".into(), json!(stream_ms));
        s.insert("ring_ms".into(), json!(held_ms));
        s.insert("total_frames".into(), json!(st.total_frames));
        if let Some(e) = st.error {
            s.insert("stream_error".into(), json!(e));
        }
        Ok(outcome)
    }
}

impl Drop for MicrophoneDriver {
    fn drop(&mut self) {
        if let Some(s) = self.stream.take() {
            release_in_background(s.capture.keepalive);
        }
    }
}

fn vad_json(r: &VadReport) -> Value {
    json!({
        "voice_activity_ratio": round3(r.voice_activity_ratio),
        "segments": r.segments,
        "threshold_dbfs": round1(r.threshold_dbfs),
        "noise_floor_dbfs": round1(r.noise_floor_dbfs),
    })
}

fn round1(x: f32) -> f64 {
    (f64::from(x) * 10.0).round() / 10.0
}

fn round3(x: f32) -> f64 {
    (f64::from(x) * 1000.0).round() / 1000.0
}

impl Driver for MicrophoneDriver {
    fn capability_type(&self) -> CapabilityType {
        CapabilityType::Microphone
    }

    fn metadata(&self) -> Map<String, Value> {
        let mut m = Map::new();
        let rates = match self.settings.request.sample_rate {
            Some(r) => vec![r],
            None => self.input.sample_rate_options(),
        };
        m.insert("sample_rate_options".into(), json!(rates));
        m.insert(
            "channels".into(),
            json!(self.settings.request.channels.unwrap_or(1)),
        );
        if let Some(n) = &self.settings.noise_profile {
            m.insert("noise_profile".into(), json!(n));
        }
        m.insert("supports_vad".into(), json!(true));
        m.insert("device".into(), json!(self.input.label()));
        m.insert("backend".into(), json!(self.backend_name));
        m
    }

    fn health(&mut self) -> DriverHealth {
        if let Some(s) = &self.stream {
            let st = s.capture.buffer.status();
            if let Some(e) = st.error {
                return DriverHealth::unhealthy(format!("microphone {}: {e}", self.input.label()));
            }
            if st.quiet_for > self.settings.capture_timeout {
                return DriverHealth::unhealthy(format!(
                    "microphone {} delivered no audio for {} ms",
                    self.input.label(),
                    st.quiet_for.as_millis()
                ));
            }
            return DriverHealth::healthy();
        }
        if let Some((at, why)) = &self.last_failure {
            if at.elapsed() < HEALTH_PROBE_TTL {
                return DriverHealth::unhealthy(why.clone());
            }
        }
        let input = &self.input;
        match self.probe.get(|| input.probe()) {
            Ok(()) => DriverHealth::healthy(),
            Err(why) => DriverHealth::unhealthy(why),
        }
    }

    fn execute(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        tracing::debug!(capability_id = %self.capability_id, action = %req.action, "microphone action");
        match req.action {
            CapabilityAction::RecordAudio => self.record_audio(req),
            CapabilityAction::StartAudioStream => self.start_audio_stream(req),
            CapabilityAction::StopAudioStream => self.stop_audio_stream(req),
            other => Err(unsupported(
                CapabilityType::Microphone,
                other,
                "not a microphone action",
            )),
        }
    }
}
