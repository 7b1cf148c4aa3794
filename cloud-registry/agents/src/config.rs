//! The `[agents]` table of the registry configuration: model gateway, speech
//! gateway, web search, limits, proposal policy, prompt overrides and the
//! Earth data sources.
//!
//! ```toml
//! [agents.model]
//! base_url = "http://127.0.0.1:8000/v1"   # OpenAI-compatible; unset = deterministic resolver only
//! model = "qwen2.5-7b-instruct"
//! native_tools = "auto"                    # auto | on | off
//! timeout_seconds = 60
//!
//! [agents.speech]
//! provider = "openai_compatible"           # openai_whisper | openai_compatible | local_whisper
//! base_url = "http://127.0.0.1:9000/v1"
//! model = "whisper-1"
//! language = "zh"
//! max_audio_size_mb = 25
//!
//! [agents.limits]
//! max_tool_steps = 8
//! tool_timeout_ms = 30000
//!
//! [agents.prompts]
//! "agents.earth.command" = "..."           # overrides a default prompt
//!
//! [agents.earth]                           # unset = the data shipped in cloud-registry/data/earth
//! satellites_tle = ["data/earth/satellites/celestrak_active_2020-10-26.txt"]
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::earth::entities::{EarthDataConfig, SHIPPED_DATA_DIR};

/// Environment variables read, in order, when `agents.model.api_key` is unset.
pub const MODEL_API_KEY_ENV: [&str; 2] = ["BENCHLINK_MODEL_API_KEY", "OPENAI_API_KEY"];
/// Environment variables read, in order, when `agents.speech.api_key` is unset
/// (docs/earth-command.md, "Speech").
pub const ASR_API_KEY_ENV: [&str; 2] = ["ASR_API_KEY", "OPENAI_API_KEY"];
/// Base URL used by the `openai_whisper` speech provider when none is set.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// Everything under `[agents]`. Every key is optional; the defaults give a
/// working Earth command on the shipped data with no model and no speech.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentsConfig {
    /// The OpenAI-compatible chat-completions gateway.
    pub model: ModelConfig,
    /// The OpenAI-compatible `/audio/transcriptions` gateway.
    pub speech: SpeechConfig,
    /// Optional web search (a SearxNG-style JSON API).
    pub web_search: WebSearchConfig,
    /// Run limits (docs/earth-command.md, "With a model", limits).
    pub limits: LimitsConfig,
    /// Proposal policy switches (docs/earth-command.md, "Proposal policy").
    pub proposals: ProposalConfig,
    /// Prompt text by prompt key (one of [`crate::prompts::PROMPT_KEYS`]);
    /// replaces the default. An applied `ai_prompt` proposal wins over this.
    pub prompts: BTreeMap<String, String>,
    /// Earth entity data sources; `None` means the data shipped with the
    /// crate ([`SHIPPED_DATA_DIR`]).
    pub earth: Option<EarthDataConfig>,
}

impl AgentsConfig {
    /// The Earth data sources to load: the configured ones, or the shipped
    /// data when `[agents.earth]` is absent.
    pub fn earth_data(&self) -> EarthDataConfig {
        self.earth
            .clone()
            .unwrap_or_else(|| EarthDataConfig::shipped(SHIPPED_DATA_DIR))
    }
}

/// Whether chat requests carry provider-native `tools` (docs/earth-command.md, "With a
/// model").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NativeTools {
    /// Send `tools`; when the provider refuses them (HTTP 400 mentioning
    /// tools, or malformed `tool_calls`) use the JSON tool-call protocol for
    /// the rest of the run and for every later run of this process.
    #[default]
    Auto,
    /// Send `tools` on every run; a refusal falls back to the JSON protocol
    /// for that run only.
    On,
    /// Never send `tools`: JSON tool-call protocol only.
    Off,
}

/// `[agents.model]`: an OpenAI-compatible chat-completions endpoint. The
/// gateway is configured when both `base_url` and `model` are set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Provider label recorded on runs, e.g. `openai_compatible`, `deepseek`.
    pub provider: String,
    /// Base URL including the version prefix, e.g. `https://api.openai.com/v1`;
    /// requests go to `{base_url}/chat/completions`.
    pub base_url: Option<String>,
    /// Bearer key; when unset, `BENCHLINK_MODEL_API_KEY` then `OPENAI_API_KEY`.
    pub api_key: Option<String>,
    /// Model id, e.g. `gpt-4o-mini`.
    pub model: Option<String>,
    /// Whole-request timeout, seconds.
    pub timeout_seconds: u64,
    pub native_tools: NativeTools,
    /// Sampling temperature sent with every request (0 keeps plans stable).
    pub temperature: Option<f64>,
    /// `max_tokens` sent with every request, when set.
    pub max_tokens: Option<u32>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            provider: "openai_compatible".into(),
            base_url: None,
            api_key: None,
            model: None,
            timeout_seconds: 60,
            native_tools: NativeTools::Auto,
            temperature: Some(0.0),
            max_tokens: None,
        }
    }
}

impl ModelConfig {
    /// True when a chat model can be called.
    pub fn is_configured(&self) -> bool {
        self.base_url
            .as_deref()
            .is_some_and(|u| !u.trim().is_empty())
            && self.model.as_deref().is_some_and(|m| !m.trim().is_empty())
    }

    /// The configured key, else the first set environment variable of
    /// [`MODEL_API_KEY_ENV`].
    pub fn effective_api_key(&self) -> Option<String> {
        key_or_env(&self.api_key, &MODEL_API_KEY_ENV)
    }

    /// Request timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_seconds.max(1))
    }
}

/// Speech-to-text providers of the first version (docs/earth-command.md,
/// "Speech"). All three speak the OpenAI `/audio/transcriptions` API;
/// `local_whisper` is a local server with that API (faster-whisper-server,
/// LocalAI, whisper.cpp behind an OpenAI-compatible proxy).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpeechProvider {
    /// OpenAI's hosted Whisper; `base_url` defaults to [`OPENAI_BASE_URL`].
    OpenaiWhisper,
    #[default]
    OpenaiCompatible,
    LocalWhisper,
    /// A local recogniser program (`command`), e.g. pocketsphinx: no
    /// network; WAV audio only.
    Command,
}

impl SpeechProvider {
    /// The wire name, e.g. `openai_compatible`.
    pub fn as_str(self) -> &'static str {
        match self {
            SpeechProvider::OpenaiWhisper => "openai_whisper",
            SpeechProvider::OpenaiCompatible => "openai_compatible",
            SpeechProvider::LocalWhisper => "local_whisper",
            SpeechProvider::Command => "command",
        }
    }
}

/// `response_format` asked of the transcription API.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TranscriptionFormat {
    /// Text plus duration, language and segments (with log-probabilities
    /// from which a confidence is derived).
    #[default]
    VerboseJson,
    /// Text only.
    Json,
}

impl TranscriptionFormat {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TranscriptionFormat::VerboseJson => "verbose_json",
            TranscriptionFormat::Json => "json",
        }
    }
}

/// `[agents.speech]` (docs/earth-command.md, "Speech": enabled, provider,
/// base_url, api_key, model, language, timeout_seconds, max_audio_size_mb).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpeechConfig {
    pub enabled: bool,
    pub provider: SpeechProvider,
    /// e.g. `http://127.0.0.1:9000/v1`; requests go to
    /// `{base_url}/audio/transcriptions`.
    pub base_url: Option<String>,
    /// Bearer key; when unset, `ASR_API_KEY` then `OPENAI_API_KEY`.
    pub api_key: Option<String>,
    pub model: String,
    /// Default language (ISO 639-1) when the request gives none.
    pub language: String,
    pub timeout_seconds: u64,
    /// Largest accepted upload, MiB; larger uploads get 413.
    pub max_audio_size_mb: u64,
    pub response_format: TranscriptionFormat,
    /// For `provider = "command"`: the program and its arguments; `{input}`
    /// is replaced by the path of a 16 kHz mono 16-bit WAV, and its trimmed
    /// stdout is the transcript, e.g. `["pocketsphinx_continuous",
    /// "-infile", "{input}", "-jsgf", "config/speech/bench-words.gram",
    /// "-wip", "1e-2", "-logfn", "/dev/null"]`. It is killed after
    /// `timeout_seconds`.
    pub command: Vec<String>,
}

impl Default for SpeechConfig {
    fn default() -> Self {
        SpeechConfig {
            enabled: true,
            provider: SpeechProvider::OpenaiCompatible,
            base_url: None,
            api_key: None,
            model: "whisper-1".into(),
            language: "zh".into(),
            timeout_seconds: 60,
            max_audio_size_mb: 25,
            response_format: TranscriptionFormat::VerboseJson,
            command: Vec::new(),
        }
    }
}

impl SpeechConfig {
    /// The base URL requests go to, when speech is usable: `enabled`, and
    /// `base_url` set (or the provider is `openai_whisper` with a key).
    pub fn effective_base_url(&self) -> Option<String> {
        if !self.enabled {
            return None;
        }
        match (&self.base_url, self.provider) {
            (Some(u), _) if !u.trim().is_empty() => Some(u.trim().to_string()),
            (_, SpeechProvider::OpenaiWhisper) if self.effective_api_key().is_some() => {
                Some(OPENAI_BASE_URL.to_string())
            }
            _ => None,
        }
    }

    /// For the `command` provider, when speech is usable: `enabled` and a
    /// program named.
    pub fn effective_command(&self) -> Option<&[String]> {
        (self.enabled
            && self.provider == SpeechProvider::Command
            && self.command.first().is_some_and(|p| !p.trim().is_empty()))
        .then_some(self.command.as_slice())
    }

    /// The configured key, else the first set variable of [`ASR_API_KEY_ENV`].
    pub fn effective_api_key(&self) -> Option<String> {
        key_or_env(&self.api_key, &ASR_API_KEY_ENV)
    }

    /// Largest upload, bytes.
    pub fn max_audio_bytes(&self) -> usize {
        (self.max_audio_size_mb.max(1) as usize).saturating_mul(1024 * 1024)
    }
}

/// `[agents.web_search]`: a SearxNG-compatible search API
/// (`GET {base_url}/search?q=...&format=json`). Unset means web search is
/// not configured: the `web.search` tool answers with a missing-data note.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebSearchConfig {
    pub base_url: Option<String>,
    pub timeout_seconds: u64,
    /// Most results returned to the model.
    pub max_results: usize,
}

impl Default for WebSearchConfig {
    fn default() -> Self {
        WebSearchConfig {
            base_url: None,
            timeout_seconds: 10,
            max_results: 5,
        }
    }
}

/// `[agents.limits]` (docs/earth-command.md, "With a model", limits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Most tool steps in one run (default 8).
    pub max_tool_steps: u32,
    /// Timeout of one tool call, ms (default 30,000).
    pub tool_timeout_ms: u64,
    /// Most model calls in one run, including retries (default 12).
    pub max_llm_calls: u32,
    /// Most ids in one `highlight_entities` (default 500).
    pub max_highlight_entities: usize,
    /// Rows in the result panel (default 20).
    pub result_panel_items: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_tool_steps: 8,
            tool_timeout_ms: 30_000,
            max_llm_calls: 12,
            max_highlight_entities: shared_protocol::earth::MAX_HIGHLIGHT_ENTITIES,
            result_panel_items: 20,
        }
    }
}

/// `[agents.proposals]` (docs/earth-command.md, "Proposal policy").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProposalConfig {
    /// When true, low-risk proposals made by a run a `super_admin` started
    /// are applied as soon as they are made ("super_admin may enable
    /// automatic application for low-risk proposals").
    pub auto_apply_low_risk: bool,
}

/// Every `integration_id` an `external_integration` proposal may target.
pub const INTEGRATION_IDS: [&str; 3] = ["model", "speech", "web_search"];

/// The fields of an `external_integration` value the registry uses; each
/// `None` keeps the configured value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IntegrationSettings {
    pub enabled: Option<bool>,
    pub base_url: Option<String>,
    /// Whole-request timeout, seconds.
    pub timeout_seconds: Option<u64>,
}

impl IntegrationSettings {
    /// Reads a stored or proposed value (`name` and `options` are kept for
    /// people and not used).
    pub fn from_setting(value: &Value) -> IntegrationSettings {
        IntegrationSettings {
            enabled: value.get("enabled").and_then(Value::as_bool),
            base_url: value
                .get("base_url")
                .and_then(Value::as_str)
                .map(|u| u.trim().to_string())
                .filter(|u| !u.is_empty()),
            timeout_seconds: value
                .get("timeout_seconds")
                .and_then(Value::as_u64)
                .map(|t| t.max(1)),
        }
    }
}

/// The error for an `integration_id` that names nothing the registry calls.
pub fn unknown_integration(id: &str) -> String {
    format!(
        "integration_id `{id}` names no integration; the registry has {}",
        INTEGRATION_IDS.join(", ")
    )
}

fn key_or_env(configured: &Option<String>, vars: &[&str]) -> Option<String> {
    if let Some(k) = configured
        .as_deref()
        .map(str::trim)
        .filter(|k| !k.is_empty())
    {
        return Some(k.to_string());
    }
    vars.iter()
        .filter_map(|v| std::env::var(v).ok())
        .map(|v| v.trim().to_string())
        .find(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_table_parses_with_every_section() {
        let cfg: AgentsConfig = toml::from_str(
            r#"
            [model]
            base_url = "http://127.0.0.1:8000/v1"
            model = "m"
            native_tools = "off"
            [speech]
            base_url = "http://127.0.0.1:9000/v1"
            max_audio_size_mb = 2
            [limits]
            max_tool_steps = 3
            [prompts]
            "agents.earth.command" = "x"
            [earth]
            top500_csv = "a.csv"
            "#,
        )
        .unwrap();
        assert!(cfg.model.is_configured());
        assert_eq!(cfg.model.native_tools, NativeTools::Off);
        assert_eq!(cfg.speech.max_audio_bytes(), 2 * 1024 * 1024);
        assert_eq!(cfg.limits.max_tool_steps, 3);
        assert_eq!(cfg.limits.tool_timeout_ms, 30_000);
        assert_eq!(cfg.prompts["agents.earth.command"], "x");
        assert!(cfg.earth_data().satellites_tle.is_empty());
    }

    #[test]
    fn empty_agents_table_means_no_model_and_the_shipped_data() {
        let cfg: AgentsConfig = toml::from_str("").unwrap();
        assert!(!cfg.model.is_configured());
        assert_eq!(cfg.limits.max_tool_steps, 8);
        assert_eq!(cfg.earth_data().satellites_tle.len(), 1);
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = toml::from_str::<AgentsConfig>("[model]\nbaseurl = \"x\"").unwrap_err();
        assert!(err.to_string().contains("baseurl"), "{err}");
    }
}
