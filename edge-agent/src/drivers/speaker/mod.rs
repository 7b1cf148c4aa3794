//! Speaker driver (docs/actions.md, "speaker"): `play_audio_file`, `play_tts`,
//! `set_volume`, `stop_playback`.
//!
//! Backends: `rodio` ([`rodio_backend`]) and `sim` ([`sim`]: "plays" in
//! real time without a device). A backend only starts, reports and stops
//! playback of one sound; file access rules, TTS rendering ([`tts`]),
//! volume limits, waiting with cancellation and stall detection are shared.
//!
//! Files are played only from `library_dir`: a name with `..`, an absolute
//! path, or a symlink that resolves outside the directory is refused.
//! Playback waits for the end by default (`wait: true`); with `wait:
//! false` the action returns at once and `stop_playback` ends the sound.

pub mod rodio_backend;
pub mod sim;
pub mod tts;

use std::io::{BufReader, Cursor};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Map, Value};
use shared_protocol::artifact::ArtifactType;
use shared_protocol::capability::{CapabilityAction, CapabilityType};

use self::tts::{TtsEngine, Utterance, DEFAULT_TTS_COMMAND};
use super::{
    parse_params, unsupported, ActionOutcome, ActionRequest, Driver, DriverConfigError,
    DriverError, DriverHealth, DriverSpec, NewArtifact,
};
use crate::devices::{ProbeCache, HEALTH_PROBE_TTL};

/// What to play.
#[derive(Debug, Clone)]
pub enum PlaySource {
    /// A file already checked to be inside the library.
    File(PathBuf),
    /// An encoded sound in memory (e.g. a rendered TTS WAV).
    Bytes(Vec<u8>),
}

/// Facts about a sound that started playing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoundInfo {
    /// Length when the decoder knows it.
    pub duration: Option<Duration>,
    pub sample_rate: u32,
    pub channels: u16,
}

/// What the output is doing.
#[derive(Debug, Clone, PartialEq)]
pub enum PlayState {
    Idle,
    /// Position in the current sound.
    Playing(Duration),
    /// The device failed; the backend has released it and will reopen it
    /// on the next `play`.
    Failed(String),
}

/// A speaker backend.
pub trait AudioOutput: Send {
    /// e.g. `default output`, `"vsink"`.
    fn label(&self) -> String;
    /// Cheap presence check; `Err` says why not (`no audio output device: ...`).
    fn probe(&self) -> Result<(), String>;
    /// Decode `source` and start playing it at `volume` (0.0..=1.0),
    /// replacing whatever was playing. Opens the device if needed.
    fn play(&mut self, source: PlaySource, volume: f32) -> Result<SoundInfo, DriverError>;
    /// Current state.
    fn state(&mut self) -> PlayState;
    /// Change the volume of the current and later sounds.
    fn set_volume(&mut self, volume: f32);
    /// Stop the current sound; its position, or `None` if nothing played.
    fn stop(&mut self) -> Option<Duration>;
    /// Forget the device (after a stall), so the next `play` reopens it.
    fn reset(&mut self);
    /// How long audio takes from the backend to the speaker (output
    /// buffering); a blocking play waits this long after the last sample.
    fn latency(&self) -> Duration {
        Duration::ZERO
    }
}

/// Decode `source` just far enough to learn its format and length.
/// Unsupported or corrupt data is an `InvalidParams` on `field`.
pub fn probe_sound(source: &PlaySource, field: &str) -> Result<SoundInfo, DriverError> {
    use rodio::Source;
    let bad = |e: String| DriverError::InvalidParams {
        field: field.into(),
        message: format!("cannot decode the sound: {e}"),
    };
    fn info<S: Source>(s: S) -> SoundInfo {
        let sample_rate = s.sample_rate().get();
        let channels = s.channels().get();
        let duration = s.total_duration().or_else(|| {
            let frames = s.count() as u64 / u64::from(channels.max(1));
            Some(Duration::from_secs_f64(
                frames as f64 / f64::from(sample_rate.max(1)),
            ))
        });
        SoundInfo {
            duration,
            sample_rate,
            channels,
        }
    }
    match source {
        PlaySource::File(p) => {
            let f = std::fs::File::open(p).map_err(|e| bad(e.to_string()))?;
            rodio::Decoder::try_from(f)
                .map(info)
                .map_err(|e| bad(e.to_string()))
        }
        PlaySource::Bytes(b) => rodio::Decoder::try_from(Cursor::new(b.clone()))
            .map(info)
            .map_err(|e| bad(e.to_string())),
    }
}

/// Open a decoder for `source` (used by backends that really play).
pub fn decoder(source: &PlaySource) -> Result<rodio::Decoder<BufReader<std::fs::File>>, String> {
    match source {
        PlaySource::File(p) => {
            let f = std::fs::File::open(p).map_err(|e| e.to_string())?;
            rodio::Decoder::try_from(f).map_err(|e| e.to_string())
        }
        PlaySource::Bytes(_) => Err("in-memory sound; use a Cursor decoder".into()),
    }
}

/// Resolve `name` inside `library_dir`, refusing anything that could reach
/// outside it: empty names, absolute paths, `..`, and symlinks whose
/// target lies outside. Errors are `InvalidParams` on `field`.
pub fn resolve_library_file(
    library_dir: &Path,
    name: &str,
    field: &str,
) -> Result<PathBuf, DriverError> {
    let bad = |message: String| DriverError::InvalidParams {
        field: field.into(),
        message,
    };
    if name.trim().is_empty() {
        return Err(bad("is empty".into()));
    }
    if name.contains('\0') {
        return Err(bad("contains a NUL character".into()));
    }
    let rel = Path::new(name);
    for c in rel.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => return Err(bad(format!("`{name}` contains `..`"))),
            Component::RootDir | Component::Prefix(_) => {
                return Err(bad(format!(
                    "`{name}` is an absolute path; give a name inside library_dir"
                )))
            }
        }
    }
    let base = library_dir.canonicalize().map_err(|e| {
        DriverError::Device(format!(
            "library_dir {} is not usable: {e}",
            library_dir.display()
        ))
    })?;
    let full = base
        .join(rel)
        .canonicalize()
        .map_err(|e| bad(format!("`{name}` is not in library_dir ({e})")))?;
    if !full.starts_with(&base) {
        return Err(bad(format!(
            "`{name}` resolves outside library_dir (symlink to {})",
            full.display()
        )));
    }
    if !full.is_file() {
        return Err(bad(format!("`{name}` is not a regular file")));
    }
    Ok(full)
}

/// Settings every speaker backend shares.
#[derive(Debug, Clone)]
pub struct SpeakerSettings {
    pub library_dir: Option<PathBuf>,
    pub tts: TtsEngine,
    /// 0.0..=1.0; requests above are capped.
    pub max_volume: f32,
    /// Volume at start, 0.0..=max_volume.
    pub volume: f32,
    /// Position not advancing for this long while playing = device gone.
    pub stall_timeout: Duration,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct CommonSpeakerToml {
    pub library_dir: Option<PathBuf>,
    pub tts_command: String,
    pub tts_timeout_ms: u64,
    pub max_volume: f32,
    pub volume: Option<f32>,
    pub stall_timeout_ms: u64,
}

impl Default for CommonSpeakerToml {
    /// The defaults every speaker backend shares.
    fn default() -> Self {
        Self {
            library_dir: None,
            tts_command: DEFAULT_TTS_COMMAND.into(),
            tts_timeout_ms: 20_000,
            max_volume: 1.0,
            volume: None,
            stall_timeout_ms: 2_000,
        }
    }
}

impl CommonSpeakerToml {
    pub(crate) fn check(&self, spec: &DriverSpec) -> Result<SpeakerSettings, DriverConfigError> {
        let bad = |key: &str, message: String| DriverConfigError::Setting {
            capability_id: spec.capability_id.clone(),
            key: key.into(),
            message,
        };
        if !(0.0..=1.0).contains(&self.max_volume) {
            return Err(bad(
                "max_volume",
                format!("{} is outside 0.0..=1.0", self.max_volume),
            ));
        }
        let volume = self.volume.unwrap_or(self.max_volume);
        if !(0.0..=self.max_volume).contains(&volume) {
            return Err(bad(
                "volume",
                format!("{volume} is outside 0.0..=max_volume ({})", self.max_volume),
            ));
        }
        if !(100..=600_000).contains(&self.tts_timeout_ms) {
            return Err(bad(
                "tts_timeout_ms",
                format!("{} is outside 100..=600000", self.tts_timeout_ms),
            ));
        }
        if !(200..=60_000).contains(&self.stall_timeout_ms) {
            return Err(bad(
                "stall_timeout_ms",
                format!("{} is outside 200..=60000", self.stall_timeout_ms),
            ));
        }
        if let Some(dir) = &self.library_dir {
            if !dir.is_absolute() {
                return Err(bad(
                    "library_dir",
                    format!("`{}` must be an absolute path", dir.display()),
                ));
            }
        }
        let tts = TtsEngine::new(
            &self.tts_command,
            Duration::from_millis(self.tts_timeout_ms),
            spec.state_dir.join("tts"),
        )
        .map_err(|e| bad("tts_command", e))?;
        Ok(SpeakerSettings {
            library_dir: self.library_dir.clone(),
            tts,
            max_volume: self.max_volume,
            volume,
            stall_timeout: Duration::from_millis(self.stall_timeout_ms),
        })
    }
}

/// Build a Speaker driver from its bench TOML section (`backend = "rodio"`
/// or `"sim"`).
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    match spec.backend.as_str() {
        "rodio" => rodio_backend::build(spec),
        "sim" => sim::build(spec),
        _ => Err(spec.unknown_backend(&["rodio", "sim"])),
    }
}

/// How a blocking playback ended.
#[derive(Debug, Clone, Copy)]
struct Played {
    played: Duration,
}

/// The speaker driver.
pub struct SpeakerDriver {
    capability_id: String,
    backend_name: &'static str,
    output: Box<dyn AudioOutput>,
    settings: SpeakerSettings,
    volume: f32,
    probe: ProbeCache,
    last_failure: Option<(Instant, String)>,
}

impl SpeakerDriver {
    /// A driver around `output`.
    pub fn new(
        capability_id: &str,
        backend_name: &'static str,
        output: Box<dyn AudioOutput>,
        settings: SpeakerSettings,
    ) -> Self {
        Self {
            capability_id: capability_id.to_string(),
            backend_name,
            volume: settings.volume,
            output,
            settings,
            probe: ProbeCache::new(HEALTH_PROBE_TTL),
            last_failure: None,
        }
    }

    fn fail(&mut self, why: String) -> DriverError {
        self.last_failure = Some((Instant::now(), why.clone()));
        DriverError::Unavailable(why)
    }

    fn start(&mut self, source: PlaySource, volume: f32) -> Result<SoundInfo, DriverError> {
        match self.output.play(source, volume) {
            Ok(i) => {
                self.last_failure = None;
                self.probe.invalidate();
                Ok(i)
            }
            Err(DriverError::Unavailable(m)) => Err(self.fail(m)),
            Err(e) => Err(e),
        }
    }

    /// Wait for the current sound to end, honouring cancel and deadline,
    /// and failing when the device errors or stops consuming audio.
    fn wait_playback(&mut self, req: &ActionRequest) -> Result<Played, DriverError> {
        let started = Instant::now();
        let mut last_pos = Duration::ZERO;
        let mut last_move = Instant::now();
        loop {
            match self.output.state() {
                PlayState::Idle => {
                    let played = started.elapsed();
                    // The last samples are still in the output buffer.
                    let drain_until = Instant::now() + self.output.latency();
                    while Instant::now() < drain_until && !req.cancel.is_cancelled() {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    return Ok(Played { played });
                }
                PlayState::Failed(m) => {
                    return Err(self.fail(format!(
                        "speaker {}: playback failed: {m}",
                        self.output.label()
                    )))
                }
                PlayState::Playing(pos) => {
                    if pos != last_pos {
                        last_pos = pos;
                        last_move = Instant::now();
                    } else if last_move.elapsed() > self.settings.stall_timeout {
                        self.output.stop();
                        self.output.reset();
                        return Err(self.fail(format!(
                            "speaker {} stopped consuming audio for {} ms (device gone?)",
                            self.output.label(),
                            last_move.elapsed().as_millis()
                        )));
                    }
                }
            }
            if req.cancel.is_cancelled() {
                self.output.stop();
                return Err(DriverError::Cancelled(format!(
                    "playback stopped after {} ms",
                    started.elapsed().as_millis()
                )));
            }
            if Instant::now() >= req.deadline {
                self.output.stop();
                return Err(DriverError::Timeout(started.elapsed().as_millis() as u64));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn play_and_report(
        &mut self,
        req: &ActionRequest,
        source: PlaySource,
        wait: bool,
        volume: Option<f32>,
        mut summary: Map<String, Value>,
    ) -> Result<Map<String, Value>, DriverError> {
        let (volume, capped) = self.cap_volume(volume)?;
        let info = self.start(source, volume)?;
        if let Some(d) = info.duration {
            summary.insert("sound_duration_ms".into(), json!(d.as_millis() as u64));
        }
        summary.insert("sample_rate".into(), json!(info.sample_rate));
        summary.insert("channels".into(), json!(info.channels));
        summary.insert("volume".into(), json!(volume));
        summary.insert("volume_capped".into(), json!(capped));
        summary.insert("device".into(), json!(self.output.label()));
        if wait {
            let played = self.wait_playback(req)?;
            summary.insert("played_ms".into(), json!(played.played.as_millis() as u64));
            summary.insert("completed".into(), json!(true));
        } else {
            summary.insert("playing".into(), json!(true));
        }
        Ok(summary)
    }

    /// A per-call volume (or the current one), capped at `max_volume`.
    fn cap_volume(&self, v: Option<f32>) -> Result<(f32, bool), DriverError> {
        let v = v.unwrap_or(self.volume);
        if !(0.0..=1.0).contains(&v) {
            return Err(DriverError::InvalidParams {
                field: "volume".into(),
                message: format!("{v} is outside 0.0..=1.0"),
            });
        }
        Ok((
            v.min(self.settings.max_volume),
            v > self.settings.max_volume,
        ))
    }

    fn play_audio_file(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            file: String,
            #[serde(default)]
            wait: Option<bool>,
            #[serde(default)]
            volume: Option<f32>,
        }
        let p: P = parse_params(&req.params)?;
        let Some(dir) = self.settings.library_dir.clone() else {
            return Err(unsupported(
                CapabilityType::Speaker,
                CapabilityAction::PlayAudioFile,
                "no library_dir is configured for this speaker",
            ));
        };
        let path = resolve_library_file(&dir, &p.file, "file")?;
        let source = PlaySource::File(path);
        probe_sound(&source, "file")?;
        let mut summary = Map::new();
        summary.insert("file".into(), json!(p.file));
        let summary =
            self.play_and_report(req, source, p.wait.unwrap_or(true), p.volume, summary)?;
        Ok(ActionOutcome {
            result_summary: summary,
            artifacts: Vec::new(),
        })
    }

    fn play_tts(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            text: String,
            #[serde(default)]
            voice: Option<String>,
            #[serde(default)]
            rate: Option<u32>,
            #[serde(default)]
            wait: Option<bool>,
            #[serde(default)]
            volume: Option<f32>,
        }
        let p: P = parse_params(&req.params)?;
        let u = Utterance {
            text: &p.text,
            voice: p.voice.as_deref(),
            rate: p.rate,
        };
        self.settings.tts.check(&u)?;
        self.cap_volume(p.volume)?;
        let rendered = self.settings.tts.render(&u, &req.cancel)?;
        let mut metadata = Map::new();
        metadata.insert("text".into(), json!(p.text));
        metadata.insert("voice".into(), json!(p.voice.as_deref().unwrap_or("en")));
        metadata.insert("rate".into(), json!(p.rate.unwrap_or(175)));
        metadata.insert("engine".into(), json!(self.settings.tts.program()));
        metadata.insert("sample_rate".into(), json!(rendered.sample_rate));
        metadata.insert("channels".into(), json!(rendered.channels));
        metadata.insert("duration_ms".into(), json!(rendered.duration_ms));
        let artifact = NewArtifact {
            artifact_type: ArtifactType::AudioClip,
            content_type: "audio/wav".into(),
            bytes: rendered.wav.clone(),
            duration_ms: Some(rendered.duration_ms),
            metadata,
        };
        let mut summary = Map::new();
        summary.insert("characters".into(), json!(p.text.chars().count()));
        summary.insert("tts_duration_ms".into(), json!(rendered.duration_ms));
        let summary = self.play_and_report(
            req,
            PlaySource::Bytes(rendered.wav),
            p.wait.unwrap_or(true),
            p.volume,
            summary,
        )?;
        Ok(ActionOutcome {
            result_summary: summary,
            artifacts: vec![artifact],
        })
    }

    fn set_volume(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            volume: f32,
        }
        let p: P = parse_params(&req.params)?;
        let (v, capped) = self.cap_volume(Some(p.volume))?;
        self.volume = v;
        self.output.set_volume(v);
        let mut summary = Map::new();
        summary.insert("volume".into(), json!(v));
        summary.insert("requested_volume".into(), json!(p.volume));
        summary.insert("capped".into(), json!(capped));
        summary.insert("max_volume".into(), json!(self.settings.max_volume));
        Ok(ActionOutcome {
            result_summary: summary,
            artifacts: Vec::new(),
        })
    }

    fn stop_playback(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {}
        let _: P = parse_params(&req.params)?;
        let was = self.output.stop();
        let mut summary = Map::new();
        summary.insert("stopped".into(), json!(was.is_some()));
        if let Some(pos) = was {
            summary.insert("position_ms".into(), json!(pos.as_millis() as u64));
        }
        Ok(ActionOutcome {
            result_summary: summary,
            artifacts: Vec::new(),
        })
    }
}

impl Driver for SpeakerDriver {
    fn capability_type(&self) -> CapabilityType {
        CapabilityType::Speaker
    }

    fn supported_actions(&self) -> Vec<CapabilityAction> {
        let mut a = vec![
            CapabilityAction::PlayTts,
            CapabilityAction::SetVolume,
            CapabilityAction::StopPlayback,
        ];
        if self.settings.library_dir.is_some() {
            a.insert(1, CapabilityAction::PlayAudioFile);
        }
        a
    }

    fn metadata(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("output_device_id".into(), json!(self.output.label()));
        m.insert(
            "supported_formats".into(),
            json!(["wav", "ogg", "mp3", "flac"]),
        );
        m.insert("max_volume".into(), json!(self.settings.max_volume));
        m.insert("tts_engine".into(), json!(self.settings.tts.program()));
        m.insert("backend".into(), json!(self.backend_name));
        m
    }

    fn health(&mut self) -> DriverHealth {
        if let Some((at, why)) = &self.last_failure {
            if at.elapsed() < HEALTH_PROBE_TTL {
                return DriverHealth::unhealthy(why.clone());
            }
        }
        let output = &self.output;
        match self.probe.get(|| output.probe()) {
            Ok(()) => DriverHealth::healthy(),
            Err(why) => DriverHealth::unhealthy(why),
        }
    }

    fn execute(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        tracing::debug!(capability_id = %self.capability_id, action = %req.action, "speaker action");
        match req.action {
            CapabilityAction::PlayAudioFile => self.play_audio_file(req),
            CapabilityAction::PlayTts => self.play_tts(req),
            CapabilityAction::SetVolume => self.set_volume(req),
            CapabilityAction::StopPlayback => self.stop_playback(req),
            other => Err(unsupported(
                CapabilityType::Speaker,
                other,
                "not a speaker action",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names_cannot_escape_the_directory() {
        let root = tempfile::tempdir().unwrap();
        let lib = root.path().join("lib");
        std::fs::create_dir(&lib).unwrap();
        std::fs::write(lib.join("ok.wav"), b"x").unwrap();
        std::fs::create_dir(lib.join("sub")).unwrap();
        std::fs::write(lib.join("sub/deep.wav"), b"x").unwrap();
        std::fs::write(root.path().join("secret.wav"), b"x").unwrap();
        std::os::unix::fs::symlink(root.path().join("secret.wav"), lib.join("link.wav")).unwrap();
        std::os::unix::fs::symlink(lib.join("ok.wav"), lib.join("inside.wav")).unwrap();

        assert!(resolve_library_file(&lib, "ok.wav", "file").is_ok());
        assert!(resolve_library_file(&lib, "sub/deep.wav", "file").is_ok());
        assert!(resolve_library_file(&lib, "inside.wav", "file").is_ok());
        for bad in [
            "../secret.wav",
            "sub/../../secret.wav",
            "/etc/passwd",
            "link.wav",
            "",
            "missing.wav",
            "sub",
        ] {
            let e = resolve_library_file(&lib, bad, "file").unwrap_err();
            assert!(
                matches!(&e, DriverError::InvalidParams { field, .. } if field == "file"),
                "{bad}: {e:?}"
            );
        }
    }
}
