//! Speech gateway (docs/earth-command.md, "Speech"): forwards one audio upload to an
//! OpenAI-compatible `POST {base_url}/audio/transcriptions` (multipart:
//! `file`, `model`, `language`, `response_format`) and normalizes the answer.
//!
//! With `verbose_json` the provider returns `duration` (seconds), `language`
//! and `segments[].avg_logprob`; the confidence is exp(mean avg_logprob)
//! weighted by segment length, clamped to 0..1. With `json` only `text` comes
//! back and duration/confidence stay unknown.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::config::{IntegrationSettings, SpeechConfig, SpeechProvider};
use crate::speech_command;

/// Why a transcription failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SpeechError {
    /// Speech is disabled or has no endpoint/key.
    #[error("语音识别未配置 (speech recognition is not configured)")]
    NotConfigured,
    #[error("audio is {size} bytes; the limit is {limit} bytes (agents.speech.max_audio_size_mb)")]
    TooLarge { size: usize, limit: usize },
    #[error("transcription timed out after {0} ms")]
    Timeout(u64),
    #[error("cannot reach the speech provider at {url}: {message}")]
    Transport { url: String, message: String },
    #[error("speech provider answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("speech provider answer is not a transcription: {0}")]
    Decode(String),
    /// The audio cannot be given to the `command` provider (not WAV).
    #[error("{0}")]
    Audio(String),
    /// The `command` provider's program failed.
    #[error("speech command: {0}")]
    Command(String),
}

/// A transcription as the provider gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcript {
    pub text: String,
    /// Audio length, ms (0 when unknown).
    pub audio_duration_ms: u64,
    /// Language the provider detected or used.
    pub language: Option<String>,
    pub confidence: Option<f64>,
    /// Wall time of the provider call, ms.
    pub request_ms: u64,
    /// Provider fields worth keeping (segment count, response format).
    pub metadata: Map<String, Value>,
}

/// The uploaded audio.
#[derive(Debug, Clone)]
pub struct AudioUpload {
    pub bytes: bytes::Bytes,
    pub file_name: Option<String>,
    pub content_type: Option<String>,
}

/// The ASR client. Its settings can change while it serves (an applied
/// `external_integration` proposal for `speech`); a call uses the settings
/// in force when it starts.
#[derive(Debug)]
pub struct SpeechGateway {
    /// The `[agents.speech]` configuration, before any applied setting.
    base: SpeechConfig,
    state: RwLock<Arc<SpeechState>>,
}

/// The client and settings of one generation.
#[derive(Debug)]
struct SpeechState {
    http: reqwest::Client,
    cfg: SpeechConfig,
    base_url: Option<String>,
    api_key: Option<String>,
}

impl SpeechState {
    fn new(cfg: &SpeechConfig) -> SpeechState {
        let http = crate::http_client::build("speech", || {
            reqwest::Client::builder()
                .timeout(Duration::from_secs(cfg.timeout_seconds.max(1)))
                .connect_timeout(Duration::from_secs(10))
        });
        SpeechState {
            http,
            base_url: cfg.effective_base_url(),
            api_key: cfg.effective_api_key(),
            cfg: cfg.clone(),
        }
    }
}

impl SpeechGateway {
    /// A gateway for `cfg` (base URL and key resolved now, with the env
    /// fallback `ASR_API_KEY`, `OPENAI_API_KEY`).
    pub fn new(cfg: &SpeechConfig) -> SpeechGateway {
        SpeechGateway {
            base: cfg.clone(),
            state: RwLock::new(Arc::new(SpeechState::new(cfg))),
        }
    }

    fn current(&self) -> Arc<SpeechState> {
        Arc::clone(&self.state.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Puts `s` in force over the configuration for later calls: `enabled`,
    /// `base_url` and `timeout_seconds` replace the configured ones; the key
    /// stays the configured one.
    pub fn apply_integration(&self, s: &IntegrationSettings) {
        let mut cfg = self.base.clone();
        if let Some(e) = s.enabled {
            cfg.enabled = e;
        }
        if let Some(u) = &s.base_url {
            cfg.base_url = Some(u.clone());
        }
        if let Some(t) = s.timeout_seconds {
            cfg.timeout_seconds = t;
        }
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(SpeechState::new(&cfg));
    }

    /// True when transcriptions can be requested.
    pub fn is_configured(&self) -> bool {
        let st = self.current();
        st.base_url.is_some() || st.cfg.effective_command().is_some()
    }

    /// The configuration in force (with applied settings).
    pub fn config(&self) -> SpeechConfig {
        self.current().cfg.clone()
    }

    /// Transcribe `audio` in `language` (ISO 639-1, e.g. `zh`).
    pub async fn transcribe(
        &self,
        audio: AudioUpload,
        language: &str,
    ) -> Result<Transcript, SpeechError> {
        let st = self.current();
        let limit = st.cfg.max_audio_bytes();
        if audio.bytes.len() > limit {
            return Err(SpeechError::TooLarge {
                size: audio.bytes.len(),
                limit,
            });
        }
        if st.cfg.provider == SpeechProvider::Command {
            let command = st
                .cfg
                .effective_command()
                .ok_or(SpeechError::NotConfigured)?
                .to_vec();
            return transcribe_with_command(&command, audio, language, st.cfg.timeout_seconds)
                .await;
        }
        let base = st.base_url.as_deref().ok_or(SpeechError::NotConfigured)?;
        let url = format!("{}/audio/transcriptions", base.trim_end_matches('/'));
        let file_name = audio
            .file_name
            .clone()
            .unwrap_or_else(|| "audio.webm".into());
        let mut part = reqwest::multipart::Part::stream(reqwest::Body::from(audio.bytes.clone()))
            .file_name(file_name);
        if let Some(ct) = &audio.content_type {
            part = part
                .mime_str(ct)
                .map_err(|e| SpeechError::Decode(format!("content type `{ct}`: {e}")))?;
        }
        let format = st.cfg.response_format.as_str();
        let form = reqwest::multipart::Form::new()
            .part("file", part)
            .text("model", st.cfg.model.clone())
            .text("language", language.to_string())
            .text("response_format", format.to_string());
        let mut req = st.http.post(&url).multipart(form);
        if let Some(k) = &st.api_key {
            req = req.bearer_auth(k);
        }
        let started = Instant::now();
        let timeout_ms = st.cfg.timeout_seconds.max(1) * 1000;
        let map_err = |e: reqwest::Error| {
            if e.is_timeout() {
                SpeechError::Timeout(timeout_ms)
            } else {
                SpeechError::Transport {
                    url: url.clone(),
                    message: e.to_string(),
                }
            }
        };
        let resp = req.send().await.map_err(map_err)?;
        let status = resp.status();
        let body = resp.text().await.map_err(map_err)?;
        let request_ms = started.elapsed().as_millis() as u64;
        if !status.is_success() {
            return Err(SpeechError::Status {
                status: status.as_u16(),
                body: body.chars().take(2000).collect(),
            });
        }
        let mut t = parse_transcription(&body)?;
        t.request_ms = request_ms;
        t.metadata.insert("response_format".into(), json!(format));
        Ok(t)
    }
}

/// The `command` provider: convert `audio` to a 16 kHz mono WAV in a
/// temporary file (off the async workers), run `command` on it, killed
/// after `timeout_seconds`.
async fn transcribe_with_command(
    command: &[String],
    audio: AudioUpload,
    language: &str,
    timeout_seconds: u64,
) -> Result<Transcript, SpeechError> {
    let started = Instant::now();
    let (file, duration_ms) = tokio::task::spawn_blocking(move || {
        let c = speech_command::to_16k_mono_wav(&audio.bytes).map_err(SpeechError::Audio)?;
        let mut f = tempfile::Builder::new()
            .prefix("speech-")
            .suffix(".wav")
            .tempfile()
            .map_err(|e| SpeechError::Command(format!("cannot write the audio: {e}")))?;
        std::io::Write::write_all(&mut f, &c.wav)
            .map_err(|e| SpeechError::Command(format!("cannot write the audio: {e}")))?;
        Ok::<_, SpeechError>((f.into_temp_path(), c.duration_ms))
    })
    .await
    .map_err(|e| SpeechError::Command(e.to_string()))??;
    let timeout = Duration::from_secs(timeout_seconds.max(1));
    let text = speech_command::run(command, &file, timeout)
        .await
        .map_err(|e| match e {
            crate::program::ProgramError::Timeout { .. } => {
                SpeechError::Timeout(timeout.as_millis() as u64)
            }
            other => SpeechError::Command(other.to_string()),
        })?;
    drop(file);
    let mut metadata = Map::new();
    metadata.insert("provider".into(), json!("command"));
    Ok(Transcript {
        text,
        audio_duration_ms: duration_ms,
        language: Some(language.to_string()),
        confidence: None,
        request_ms: started.elapsed().as_millis() as u64,
        metadata,
    })
}

/// Parse a `/audio/transcriptions` JSON body (`json` or `verbose_json`).
pub fn parse_transcription(body: &str) -> Result<Transcript, SpeechError> {
    let v: Value = serde_json::from_str(body).map_err(|e| SpeechError::Decode(e.to_string()))?;
    let text = v
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| SpeechError::Decode("no `text` field".into()))?
        .trim()
        .to_string();
    let duration_ms = v
        .get("duration")
        .and_then(Value::as_f64)
        .filter(|d| d.is_finite() && *d >= 0.0)
        .map(|d| (d * 1000.0).round() as u64)
        .unwrap_or(0);
    let language = v
        .get("language")
        .and_then(Value::as_str)
        .map(str::to_string);
    let mut metadata = Map::new();
    let mut confidence = None;
    if let Some(segs) = v.get("segments").and_then(Value::as_array) {
        metadata.insert("segments".into(), json!(segs.len()));
        let (mut weighted, mut total) = (0.0f64, 0.0f64);
        for s in segs {
            let Some(lp) = s.get("avg_logprob").and_then(Value::as_f64) else {
                continue;
            };
            let len = match (
                s.get("start").and_then(Value::as_f64),
                s.get("end").and_then(Value::as_f64),
            ) {
                (Some(a), Some(b)) if b > a => b - a,
                _ => 1.0,
            };
            weighted += lp * len;
            total += len;
        }
        if total > 0.0 {
            confidence = Some((weighted / total).exp().clamp(0.0, 1.0));
        }
    }
    Ok(Transcript {
        text,
        audio_duration_ms: duration_ms,
        language,
        confidence,
        request_ms: 0,
        metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbose_json_gives_duration_language_and_a_confidence() {
        let t = parse_transcription(
            r#"{"text":" 高亮所有北斗卫星 ","duration":1.234,"language":"chinese",
                "segments":[{"start":0.0,"end":1.234,"avg_logprob":-0.1}]}"#,
        )
        .unwrap();
        assert_eq!(t.text, "高亮所有北斗卫星");
        assert_eq!(t.audio_duration_ms, 1234);
        let c = t.confidence.unwrap();
        assert!((c - (-0.1f64).exp()).abs() < 1e-9);
    }

    #[test]
    fn plain_json_has_text_only() {
        let t = parse_transcription(r#"{"text":"hello"}"#).unwrap();
        assert_eq!((t.audio_duration_ms, t.confidence), (0, None));
        assert!(parse_transcription("{}").is_err());
    }
}
