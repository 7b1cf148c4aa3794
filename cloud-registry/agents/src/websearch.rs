//! Optional web search for the `web.search` tool: a SearxNG-compatible JSON
//! API (`GET {base_url}/search?q=...&format=json`, answering
//! `{"results": [{"title", "url", "content"}]}`). Not configured is a
//! normal state: the tool then answers with a missing-data note.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::{IntegrationSettings, WebSearchConfig};

/// The note recorded when web search is not configured.
pub const NOT_CONFIGURED_NOTE: &str =
    "web search is not configured (agents.web_search.base_url); no web sources were consulted";

/// One search hit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebResult {
    pub title: String,
    pub url: String,
    pub snippet: String,
}

/// The web search client. Its settings can change while it serves (an
/// applied `external_integration` proposal for `web_search`).
#[derive(Debug)]
pub struct WebSearch {
    /// The `[agents.web_search]` configuration, before any applied setting.
    base: WebSearchConfig,
    state: RwLock<Arc<(reqwest::Client, WebSearchConfig)>>,
}

fn client(cfg: &WebSearchConfig) -> reqwest::Client {
    crate::http_client::build("web_search", || {
        reqwest::Client::builder().timeout(Duration::from_secs(cfg.timeout_seconds.max(1)))
    })
}

impl WebSearch {
    /// A client for `cfg`.
    pub fn new(cfg: &WebSearchConfig) -> WebSearch {
        WebSearch {
            base: cfg.clone(),
            state: RwLock::new(Arc::new((client(cfg), cfg.clone()))),
        }
    }

    fn current(&self) -> Arc<(reqwest::Client, WebSearchConfig)> {
        Arc::clone(&self.state.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Puts `s` in force over the configuration for later searches:
    /// `base_url` and `timeout_seconds` replace the configured ones;
    /// `enabled: false` makes search not configured.
    pub fn apply_integration(&self, s: &IntegrationSettings) {
        let mut cfg = self.base.clone();
        if let Some(u) = &s.base_url {
            cfg.base_url = Some(u.clone());
        }
        if let Some(t) = s.timeout_seconds {
            cfg.timeout_seconds = t;
        }
        if s.enabled == Some(false) {
            cfg.base_url = None;
        }
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = Arc::new((client(&cfg), cfg));
    }

    /// True when a base URL is set.
    pub fn is_configured(&self) -> bool {
        self.current()
            .1
            .base_url
            .as_deref()
            .is_some_and(|u| !u.trim().is_empty())
    }

    /// Search; at most `limit` (capped by `max_results`) hits. Errors name
    /// the URL and the HTTP status or transport problem.
    pub async fn search(&self, query: &str, limit: usize) -> Result<Vec<WebResult>, String> {
        let st = self.current();
        let (http, cfg) = (&st.0, &st.1);
        let base = cfg.base_url.as_deref().ok_or(NOT_CONFIGURED_NOTE)?;
        let url = format!("{}/search", base.trim_end_matches('/'));
        let full = reqwest::Url::parse_with_params(&url, &[("q", query), ("format", "json")])
            .map_err(|e| format!("web search URL {url}: {e}"))?;
        let resp = http
            .get(full)
            .send()
            .await
            .map_err(|e| format!("web search at {url} failed: {e}"))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(format!(
                "web search at {url} answered HTTP {}",
                status.as_u16()
            ));
        }
        let v: Value = resp
            .json()
            .await
            .map_err(|e| format!("web search at {url} returned no JSON: {e}"))?;
        let n = limit.min(cfg.max_results).max(1);
        Ok(v.get("results")
            .and_then(Value::as_array)
            .map(|rs| {
                rs.iter()
                    .filter_map(|r| {
                        let url = r.get("url")?.as_str()?.to_string();
                        Some(WebResult {
                            title: r
                                .get("title")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string(),
                            url,
                            snippet: r
                                .get("content")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string(),
                        })
                    })
                    .take(n)
                    .collect()
            })
            .unwrap_or_default())
    }
}
