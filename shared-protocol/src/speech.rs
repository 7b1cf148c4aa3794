//! Speech transcription (seed 000 "Speech / ASR").

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `POST /api/v1/agents/speech/transcriptions` response (seed 000).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SpeechTranscriptionResponse {
    pub text: String,
    /// e.g. `openai_compatible`.
    pub provider: String,
    /// e.g. `whisper-1`.
    pub model: String,
    /// Length of the audio, milliseconds (the seed's example: 1234).
    pub duration_ms: u64,
    /// 0.0..=1.0 when the provider gives one.
    pub confidence: Option<f64>,
    #[serde(default)]
    pub metadata: Map<String, Value>,
}
