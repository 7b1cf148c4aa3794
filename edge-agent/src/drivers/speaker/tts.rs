//! `play_tts` rendering: the configured TTS command writes a WAV file,
//! which becomes an `audio_clip` artifact and is then played.
//!
//! The default command is `espeak-ng -w {out} -v {voice} -s {rate} {text}`.
//! Placeholders: `{out}` (WAV to write), `{text}`, `{voice}`, `{rate}`
//! (words per minute). It runs without a shell (see `screen::exec`): the
//! text is one argument whatever it contains.

use std::path::PathBuf;
use std::time::Duration;

use crate::drivers::microphone::wav;
use crate::drivers::screen::exec::{self, CommandTemplate};
use crate::drivers::{CancelToken, DriverError};

/// The default TTS command.
pub const DEFAULT_TTS_COMMAND: &str = "espeak-ng -w {out} -v {voice} -s {rate} {text}";

/// A rendered utterance.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The WAV file's bytes.
    pub wav: Vec<u8>,
    pub sample_rate: u32,
    pub channels: u16,
    pub duration_ms: u64,
}

/// What to say and how.
#[derive(Debug, Clone)]
pub struct Utterance<'a> {
    pub text: &'a str,
    /// e.g. `en`, `en-us+f3`; `None` = the engine default (`{voice}` gets `en`).
    pub voice: Option<&'a str>,
    /// Words per minute; `None` = 175.
    pub rate: Option<u32>,
}

/// A TTS command with its limits.
#[derive(Debug, Clone)]
pub struct TtsEngine {
    template: CommandTemplate,
    timeout: Duration,
    scratch: PathBuf,
    max_chars: usize,
}

/// Longest text accepted, characters.
pub const MAX_TTS_CHARS: usize = 2000;

impl TtsEngine {
    /// An engine running `template` (must use `{out}` and `{text}`),
    /// writing scratch files under `scratch`.
    pub fn new(template: &str, timeout: Duration, scratch: PathBuf) -> Result<Self, String> {
        let template = CommandTemplate::parse(template)?;
        if !template.uses("out") || !template.uses("text") {
            return Err("must contain {out} and {text}".into());
        }
        Ok(Self {
            template,
            timeout,
            scratch,
            max_chars: MAX_TTS_CHARS,
        })
    }

    /// The program, for metadata and health.
    pub fn program(&self) -> &str {
        self.template.program()
    }

    /// Check an utterance's parameters without running anything.
    pub fn check(&self, u: &Utterance<'_>) -> Result<(), DriverError> {
        let bad = |field: &str, message: String| DriverError::InvalidParams {
            field: field.into(),
            message,
        };
        if u.text.trim().is_empty() {
            return Err(bad("text", "is empty".into()));
        }
        if u.text.chars().count() > self.max_chars {
            return Err(bad(
                "text",
                format!("longer than {} characters", self.max_chars),
            ));
        }
        if u.text.contains('\0') {
            return Err(bad("text", "contains a NUL character".into()));
        }
        if let Some(v) = u.voice {
            let ok = !v.is_empty()
                && v.len() <= 40
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '+' | '/'))
                && !v.starts_with('-');
            if !ok {
                return Err(bad("voice", format!("`{v}` is not a voice name")));
            }
            if !self.template.uses("voice") {
                return Err(bad(
                    "voice",
                    "the configured tts_command has no {voice} placeholder".into(),
                ));
            }
        }
        if let Some(r) = u.rate {
            if !(80..=500).contains(&r) {
                return Err(bad(
                    "rate",
                    format!("{r} words per minute is outside 80..=500"),
                ));
            }
            if !self.template.uses("rate") {
                return Err(bad(
                    "rate",
                    "the configured tts_command has no {rate} placeholder".into(),
                ));
            }
        }
        Ok(())
    }

    /// Render `u` to WAV.
    pub fn render(&self, u: &Utterance<'_>, cancel: &CancelToken) -> Result<Rendered, DriverError> {
        self.check(u)?;
        std::fs::create_dir_all(&self.scratch).map_err(|e| {
            DriverError::Device(format!(
                "cannot create scratch directory {}: {e}",
                self.scratch.display()
            ))
        })?;
        let out = self
            .scratch
            .join(format!("tts-{}.wav", uuid::Uuid::new_v4().simple()));
        let out_s = out.display().to_string();
        let rate = u.rate.unwrap_or(175).to_string();
        let (program, args) = self.template.render(&[
            ("out", &out_s),
            ("text", u.text),
            ("voice", u.voice.unwrap_or("en")),
            ("rate", &rate),
        ]);
        let ran = exec::run(&program, &args, self.timeout, Some(cancel));
        let bytes = std::fs::read(&out);
        let _ = std::fs::remove_file(&out);
        ran?;
        let bytes = bytes.map_err(|e| {
            DriverError::Device(format!(
                "`{}` wrote no WAV file ({e})",
                self.template.as_str()
            ))
        })?;
        let pcm = wav::decode(&bytes).map_err(|e| {
            DriverError::Device(format!(
                "`{}` wrote an unreadable WAV file: {e}",
                self.template.as_str()
            ))
        })?;
        Ok(Rendered {
            sample_rate: pcm.sample_rate,
            channels: pcm.channels,
            duration_ms: pcm.duration_ms(),
            wav: bytes,
        })
    }
}
