//! Model gateway: an OpenAI-compatible chat-completions client
//! (`POST {base_url}/chat/completions`). It only moves messages; tools,
//! policy and storage live in the runtime (docs/earth-command.md, "With a model").
//!
//! Provider-native tool calling sends `tools` + `tool_choice: "auto"` and
//! reads `choices[0].message.tool_calls[].function.{name, arguments}`. A
//! provider that refuses `tools` (HTTP 400 mentioning tools) or returns
//! malformed `tool_calls` is reported as such so the runtime can switch to
//! the JSON tool-call protocol.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::config::{IntegrationSettings, ModelConfig, NativeTools};

/// Why a chat call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ModelError {
    #[error("no model is configured (set agents.model.base_url and agents.model.model)")]
    NotConfigured,
    #[error("model request timed out after {0} ms")]
    Timeout(u64),
    #[error("cannot reach the model at {url}: {message}")]
    Transport { url: String, message: String },
    /// A non-2xx answer; `body` is the first 2,000 characters.
    #[error("model answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("model answer is not a chat completion: {0}")]
    Decode(String),
    /// `tool_calls` present but unusable (no name, arguments not JSON).
    #[error("model returned malformed tool_calls: {0}")]
    MalformedToolCalls(String),
}

impl ModelError {
    /// True when the provider refused provider-native tools: HTTP 400 whose
    /// body mentions tools or functions, or malformed `tool_calls`.
    pub fn rejects_native_tools(&self) -> bool {
        match self {
            ModelError::Status { status: 400, body } => {
                let b = body.to_lowercase();
                b.contains("tool") || b.contains("function")
            }
            ModelError::MalformedToolCalls(_) => true,
            _ => false,
        }
    }
}

/// One provider-native tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NativeToolCall {
    /// The provider's call id, echoed in the `tool` message answering it.
    pub id: String,
    pub name: String,
    /// Parsed `function.arguments` (a JSON object).
    pub arguments: Map<String, Value>,
}

/// Token counts when the provider reports them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub total_tokens: Option<u64>,
}

/// A chat completion's first choice.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatReply {
    pub content: Option<String>,
    pub tool_calls: Vec<NativeToolCall>,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    /// The assistant message as received (to append to the conversation).
    pub message: Value,
    /// The model id the provider reports.
    pub model: Option<String>,
}

/// The chat-completions client. Cheap to share (`Arc`). Its settings can
/// change while it serves (an applied `external_integration` proposal for
/// `model`); a call uses the settings in force when it starts.
#[derive(Debug)]
pub struct ModelGateway {
    /// The `[agents.model]` configuration, before any applied setting.
    base: ModelConfig,
    state: RwLock<Arc<ModelState>>,
    /// Set once a provider refused native tools under `native_tools = auto`.
    native_refused: AtomicBool,
}

/// The client and settings of one generation.
#[derive(Debug)]
struct ModelState {
    http: reqwest::Client,
    cfg: ModelConfig,
    api_key: Option<String>,
    /// False when an applied setting turned the model off.
    enabled: bool,
}

impl ModelState {
    fn new(cfg: &ModelConfig, enabled: bool) -> ModelState {
        let http = crate::http_client::build("model", || {
            reqwest::Client::builder()
                .timeout(cfg.timeout())
                .connect_timeout(Duration::from_secs(10))
        });
        ModelState {
            http,
            cfg: cfg.clone(),
            api_key: cfg.effective_api_key(),
            enabled,
        }
    }
}

impl ModelGateway {
    /// A gateway for `cfg` (the API key is resolved now, from config or env).
    pub fn new(cfg: &ModelConfig) -> ModelGateway {
        ModelGateway {
            base: cfg.clone(),
            state: RwLock::new(Arc::new(ModelState::new(cfg, true))),
            native_refused: AtomicBool::new(false),
        }
    }

    fn current(&self) -> Arc<ModelState> {
        Arc::clone(&self.state.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Puts `s` in force over the configuration for later calls:
    /// `base_url` and `timeout_seconds` replace the configured ones,
    /// `enabled: false` makes the gateway not configured (the deterministic
    /// resolver answers Earth commands). The key stays the configured one.
    pub fn apply_integration(&self, s: &IntegrationSettings) {
        let mut cfg = self.base.clone();
        if let Some(u) = &s.base_url {
            cfg.base_url = Some(u.clone());
        }
        if let Some(t) = s.timeout_seconds {
            cfg.timeout_seconds = t;
        }
        let state = ModelState::new(&cfg, s.enabled != Some(false));
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(state);
    }

    /// True when enabled and `base_url` and `model` are set.
    pub fn is_configured(&self) -> bool {
        let st = self.current();
        st.enabled && st.cfg.is_configured()
    }

    /// The configured model id.
    pub fn model(&self) -> Option<String> {
        self.current().cfg.model.clone()
    }

    /// The provider label recorded on runs.
    pub fn provider(&self) -> String {
        self.current().cfg.provider.clone()
    }

    /// Whether a new run should start with provider-native tools.
    pub fn starts_native(&self) -> bool {
        match self.base.native_tools {
            NativeTools::Off => false,
            NativeTools::On => true,
            NativeTools::Auto => !self.native_refused.load(Ordering::Relaxed),
        }
    }

    /// Remember that the provider refused native tools (only under `auto`).
    pub fn note_native_refused(&self) {
        if self.base.native_tools == NativeTools::Auto {
            self.native_refused.store(true, Ordering::Relaxed);
        }
    }

    fn endpoint(cfg: &ModelConfig) -> Result<String, ModelError> {
        let base = cfg.base_url.as_deref().ok_or(ModelError::NotConfigured)?;
        Ok(format!("{}/chat/completions", base.trim_end_matches('/')))
    }

    /// The request body for `messages` (and `tools` when given).
    pub fn request_body(&self, messages: &[Value], tools: Option<&[Value]>) -> Value {
        Self::body_for(&self.current().cfg, messages, tools)
    }

    fn body_for(cfg: &ModelConfig, messages: &[Value], tools: Option<&[Value]>) -> Value {
        let mut body = json!({
            "model": cfg.model.clone().unwrap_or_default(),
            "messages": messages,
        });
        if let Some(t) = cfg.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(m) = cfg.max_tokens {
            body["max_tokens"] = json!(m);
        }
        if let Some(tools) = tools.filter(|t| !t.is_empty()) {
            body["tools"] = json!(tools);
            body["tool_choice"] = json!("auto");
        }
        body
    }

    /// One chat completion. Errors: [`ModelError`]; malformed `tool_calls`
    /// are [`ModelError::MalformedToolCalls`].
    pub async fn chat(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
    ) -> Result<ChatReply, ModelError> {
        let st = self.current();
        if !(st.enabled && st.cfg.is_configured()) {
            return Err(ModelError::NotConfigured);
        }
        let url = Self::endpoint(&st.cfg)?;
        let body = Self::body_for(&st.cfg, messages, tools);
        let mut req = st.http.post(&url).json(&body);
        if let Some(key) = &st.api_key {
            req = req.bearer_auth(key);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| classify(&url, e, st.cfg.timeout()))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| classify(&url, e, st.cfg.timeout()))?;
        if !status.is_success() {
            return Err(ModelError::Status {
                status: status.as_u16(),
                body: text.chars().take(2000).collect(),
            });
        }
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::Decode(format!("{e}; body starts {:?}", head(&text))))?;
        parse_completion(&v)
    }
}

fn head(s: &str) -> String {
    s.chars().take(200).collect()
}

fn classify(url: &str, e: reqwest::Error, timeout: Duration) -> ModelError {
    if e.is_timeout() {
        ModelError::Timeout(timeout.as_millis() as u64)
    } else {
        ModelError::Transport {
            url: url.to_string(),
            message: e.to_string(),
        }
    }
}

/// Parse a chat-completions response body.
pub fn parse_completion(v: &Value) -> Result<ChatReply, ModelError> {
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| ModelError::Decode("no choices[0]".into()))?;
    let message = choice
        .get("message")
        .cloned()
        .ok_or_else(|| ModelError::Decode("no choices[0].message".into()))?;
    let content = match message.get("content") {
        Some(Value::String(s)) => Some(s.clone()),
        // Some providers send content parts: [{"type":"text","text":"..."}].
        Some(Value::Array(parts)) => {
            let text: String = parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            Some(text)
        }
        _ => None,
    };
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").filter(|c| !c.is_null()) {
        let calls = calls
            .as_array()
            .ok_or_else(|| ModelError::MalformedToolCalls("tool_calls is not an array".into()))?;
        for (i, c) in calls.iter().enumerate() {
            let f = c.get("function").ok_or_else(|| {
                ModelError::MalformedToolCalls(format!("tool_calls[{i}] has no function"))
            })?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    ModelError::MalformedToolCalls(format!("tool_calls[{i}].function has no name"))
                })?;
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(m)) => m.clone(),
                Some(Value::String(s)) if s.trim().is_empty() => Map::new(),
                Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                    Ok(Value::Object(m)) => m,
                    Ok(_) => {
                        return Err(ModelError::MalformedToolCalls(format!(
                            "tool_calls[{i}].function.arguments is not a JSON object"
                        )))
                    }
                    Err(e) => {
                        return Err(ModelError::MalformedToolCalls(format!(
                            "tool_calls[{i}].function.arguments is not JSON: {e}"
                        )))
                    }
                },
                Some(_) => {
                    return Err(ModelError::MalformedToolCalls(format!(
                        "tool_calls[{i}].function.arguments is neither a string nor an object"
                    )))
                }
            };
            let id = c
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| format!("call_{i}"));
            tool_calls.push(NativeToolCall {
                id,
                name: name.to_string(),
                arguments,
            });
        }
    }
    let usage = v.get("usage").map(|u| Usage {
        prompt_tokens: u.get("prompt_tokens").and_then(Value::as_u64),
        completion_tokens: u.get("completion_tokens").and_then(Value::as_u64),
        total_tokens: u.get("total_tokens").and_then(Value::as_u64),
    });
    Ok(ChatReply {
        content,
        tool_calls,
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_string),
        usage,
        message,
        model: v.get("model").and_then(Value::as_str).map(str::to_string),
    })
}

/// A `{"role": ..., "content": ...}` message.
pub fn message(role: &str, content: impl Into<String>) -> Value {
    json!({"role": role, "content": content.into()})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_tool_calls_are_read_from_the_first_choice() {
        let v = json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "earth.find_entities",
             "arguments": "{\"domain\":\"satellites\"}"}}]}, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}});
        let r = parse_completion(&v).unwrap();
        assert_eq!(r.tool_calls[0].name, "earth.find_entities");
        assert_eq!(r.tool_calls[0].arguments["domain"], "satellites");
        assert_eq!(r.usage.unwrap().total_tokens, Some(15));
    }

    #[test]
    fn arguments_that_are_not_json_make_the_tool_calls_malformed() {
        let v = json!({"choices": [{"message": {"tool_calls": [
            {"id": "c1", "function": {"name": "x", "arguments": "{domain: sat"}}]}}]});
        let e = parse_completion(&v).unwrap_err();
        assert!(e.rejects_native_tools());
    }

    #[test]
    fn a_400_about_tools_means_native_tools_are_unsupported() {
        let e = ModelError::Status {
            status: 400,
            body: "{\"error\":{\"message\":\"tools is not supported\"}}".into(),
        };
        assert!(e.rejects_native_tools());
        let other = ModelError::Status {
            status: 400,
            body: "bad model".into(),
        };
        assert!(!other.rejects_native_tools());
    }
}
