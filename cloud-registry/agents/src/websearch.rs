//! Optional web search for the `web.search` tool: a SearxNG-compatible JSON
//! API (`GET {base_url}/search?q=...&format=json`, answering
//! `{"results": [{"title", "url", "content"}]}`). Not configured is a
//! normal state: the tool then answers with a missing-data note.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::WebSearchConfig;

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

/// The web search client.
#[derive(Debug)]
pub struct WebSearch {
    http: reqwest::Client,
    cfg: WebSearchConfig,
}

impl WebSearch {
    /// A client for `cfg`.
    pub fn new(cfg: &WebSearchConfig) -> WebSearch {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(cfg.timeout_seconds.max(1)))
            .build()
            .unwrap_or_default();
        WebSearch {
            http,
            cfg: cfg.clone(),
        }
    }

    /// True when a base URL is set.
    pub fn is_configured(&self) -> bool {
        self.cfg
            .base_url
            .as_deref()
            .is_some_and(|u| !u.trim().is_empty())
    }

    /// Search; at most `limit` (capped by `max_results`) hits. Errors name
    /// the URL and the HTTP status or transport problem.
    pub async fn search(&self, query: &str, limit: usize) -> Result<Vec<WebResult>, String> {
        let base = self.cfg.base_url.as_deref().ok_or(NOT_CONFIGURED_NOTE)?;
        let url = format!("{}/search", base.trim_end_matches('/'));
        let full = reqwest::Url::parse_with_params(&url, &[("q", query), ("format", "json")])
            .map_err(|e| format!("web search URL {url}: {e}"))?;
        let resp = self
            .http
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
        let n = limit.min(self.cfg.max_results).max(1);
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
