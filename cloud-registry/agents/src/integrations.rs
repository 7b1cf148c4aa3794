//! The external services the registry calls, as `external_integration`
//! proposals name them (docs/earth-command.md, "Integrations by proposal"):
//! `model` (the chat-completions gateway), `speech` (the transcription
//! gateway) and `web_search`. An applied setting changes `enabled`,
//! `base_url` and `timeout_seconds` for the calls that follow; keys stay in
//! the configuration (the policy refuses secret fields in proposals).

use std::sync::Arc;

use serde_json::Value;

use crate::config::{unknown_integration, IntegrationSettings};
use crate::model::ModelGateway;
use crate::speech::SpeechGateway;
use crate::websearch::WebSearch;

/// The clients an applied `external_integration` setting reaches.
#[derive(Debug, Clone)]
pub struct Integrations {
    pub model: Arc<ModelGateway>,
    pub speech: Arc<SpeechGateway>,
    pub web: Arc<WebSearch>,
}

impl Integrations {
    /// Puts the setting `value` of integration `id` in force. Errors: `id`
    /// is none of [`crate::config::INTEGRATION_IDS`] (the sentence lists them).
    pub fn apply(&self, id: &str, value: &Value) -> Result<(), String> {
        let s = IntegrationSettings::from_setting(value);
        match id {
            "model" => self.model.apply_integration(&s),
            "speech" => self.speech.apply_integration(&s),
            "web_search" => self.web.apply_integration(&s),
            other => return Err(unknown_integration(other)),
        }
        Ok(())
    }
}
