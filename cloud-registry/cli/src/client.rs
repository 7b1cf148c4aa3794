//! A small client of the registry's public HTTP API, as an audit agent
//! uses it: leases, actions, sessions, artifacts, and the capability event
//! stream (SSE). The `benchlink` commands and the e2e tests share it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// An API client with one bearer token (one principal).
#[derive(Clone)]
pub struct Agent {
    /// The token's principal, e.g. `audit:hw-auditor-01`.
    pub name: String,
    pub base_url: String,
    token: String,
    http: reqwest::Client,
    /// Without the per-request timeout: event streams stay open.
    stream_http: reqwest::Client,
}

/// Lower-case hex SHA-256 of `bytes` (64 characters), as artifacts'
/// `checksum` and `X-Checksum-Sha256` carry it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// Poll `check` every 50 ms until it answers `Some`, for at most `timeout`.
///
/// Errors: `timeout` passed first; the message names `what`.
pub async fn poll_until<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The string `key` of the JSON object `v`.
///
/// Errors: `v` has no string `key` (the message shows `v`).
fn string_at(v: &Value, key: &str) -> Result<String> {
    v[key]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("no {key} in {v}"))
}

/// Capability id → lease id of a lease group answer
/// ([`Agent::lease_group`]).
pub fn group_leases(group: &Value) -> BTreeMap<String, String> {
    group["leases"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            (
                l["capability_id"].as_str().unwrap_or_default().to_string(),
                l["lease_id"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// A downloaded artifact.
#[derive(Debug, Clone)]
pub struct Download {
    pub bytes: Vec<u8>,
    pub content_type: String,
    /// The `X-Checksum-Sha256` header.
    pub checksum_header: String,
}

impl Agent {
    /// A client for `base_url` acting as `name` with `token`.
    pub fn new(base_url: &str, name: &str, token: &str) -> Self {
        Self::trusting(base_url, name, token, None)
    }

    /// [`Agent::new`] for an `https://` registry signed by a private CA:
    /// only the certificates of the PEM file `ca_file` are trusted (the
    /// system's CAs when `None`).
    ///
    /// Errors: the file cannot be read or holds no PEM certificate; the
    /// message names it.
    pub fn with_ca_file(
        base_url: &str,
        name: &str,
        token: &str,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Self, String> {
        let certs = match ca_file {
            None => None,
            Some(path) => {
                let pem =
                    std::fs::read(path).map_err(|e| format!("CA file {}: {e}", path.display()))?;
                let certs = reqwest::Certificate::from_pem_bundle(&pem)
                    .map_err(|e| format!("CA file {}: {e}", path.display()))?;
                if certs.is_empty() {
                    return Err(format!(
                        "CA file {} holds no PEM certificate",
                        path.display()
                    ));
                }
                Some(certs)
            }
        };
        Ok(Self::trusting(base_url, name, token, certs))
    }

    /// A client trusting only `certs` when given.
    fn trusting(
        base_url: &str,
        name: &str,
        token: &str,
        certs: Option<Vec<reqwest::Certificate>>,
    ) -> Self {
        let builder = || {
            let b = reqwest::Client::builder();
            match &certs {
                Some(c) => b.tls_certs_only(c.clone()),
                None => b,
            }
        };
        Self {
            name: name.to_string(),
            base_url: base_url.trim_end_matches('/').to_string(),
            token: token.to_string(),
            http: builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap_or_default(),
            stream_http: builder().build().unwrap_or_default(),
        }
    }

    /// The bearer token this client sends.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The underlying HTTP client (120 s timeout per request).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The HTTP client for event streams: as [`Agent::http`], without the
    /// per-request timeout.
    pub fn stream_http(&self) -> &reqwest::Client {
        &self.stream_http
    }

    async fn answer(resp: reqwest::Response) -> Result<(StatusCode, Value)> {
        let status = resp.status();
        let text = resp.text().await.context("read the response body")?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, body))
    }

    /// GET `path` (e.g. `/api/v1/sessions`).
    pub async fn get(&self, path: &str) -> Result<(StatusCode, Value)> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base_url))
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        Self::answer(resp).await
    }

    /// POST `body` as JSON to `path`.
    pub async fn post(&self, path: &str, body: &Value) -> Result<(StatusCode, Value)> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base_url))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await
            .with_context(|| format!("POST {path}"))?;
        Self::answer(resp).await
    }

    /// DELETE `path` (no body).
    pub async fn delete(&self, path: &str) -> Result<(StatusCode, Value)> {
        let resp = self
            .http
            .delete(format!("{}{path}", self.base_url))
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("DELETE {path}"))?;
        Self::answer(resp).await
    }

    /// GET that must answer 200.
    pub async fn get_ok(&self, path: &str) -> Result<Value> {
        let (s, v) = self.get(path).await?;
        if s != StatusCode::OK {
            bail!("GET {path}: {s}: {v}");
        }
        Ok(v)
    }

    /// The capability as the registry shows it now (`health_status`,
    /// `status`, ...); panics when it is not there.
    pub async fn capability(&self, capability_id: &str) -> Value {
        self.get_ok(&format!("/api/v1/capabilities/{capability_id}"))
            .await
            .expect("capability")
    }

    fn lease_body(&self, priority: u8, purpose: &str, seconds: u32) -> Value {
        json!({
            "holder_type": "audit_agent",
            "holder_ref": self.name,
            "project_id": "proj_device_assistant",
            "purpose": purpose,
            "priority": priority,
            "requested_duration_seconds": seconds,
            "evidence_required": true,
        })
    }

    /// Lease several capabilities atomically (`request-group`), waiting up
    /// to `wait_seconds` for the grant. Returns the group answer.
    pub async fn lease_group(
        &self,
        capability_ids: &[&str],
        priority: u8,
        purpose: &str,
        wait_seconds: u32,
    ) -> Result<Value> {
        let mut body = self.lease_body(priority, purpose, 300);
        body["capability_ids"] = json!(capability_ids);
        let (s, v) = self
            .post(
                &format!("/api/v1/capability-leases/request-group?wait_seconds={wait_seconds}"),
                &body,
            )
            .await?;
        if s != StatusCode::CREATED || v["status"] != "granted" {
            bail!("lease group {capability_ids:?} not granted: {s}: {v}");
        }
        Ok(v)
    }

    /// Lease one capability; with `preempt_reason`, preempt a lower-priority
    /// holder if needed. Answers `(status, lease)`.
    pub async fn lease(
        &self,
        capability_id: &str,
        priority: u8,
        purpose: &str,
        preempt_reason: Option<&str>,
        wait_seconds: u32,
    ) -> Result<(StatusCode, Value)> {
        let mut body = self.lease_body(priority, purpose, 120);
        body["capability_id"] = json!(capability_id);
        if let Some(r) = preempt_reason {
            body["preempt_if_needed"] = json!(true);
            body["preempt_reason"] = json!(r);
        }
        self.post(
            &format!("/api/v1/capability-leases/request?wait_seconds={wait_seconds}"),
            &body,
        )
        .await
    }

    /// [`Agent::lease`] at priority 50, without preempting and waiting up
    /// to 10 s, that must be granted (201); returns the lease id.
    ///
    /// Errors: the request failed or was answered otherwise.
    pub async fn lease_ok(&self, capability_id: &str, purpose: &str) -> Result<String> {
        let (s, lease) = self.lease(capability_id, 50, purpose, None, 10).await?;
        if s != StatusCode::CREATED {
            bail!("lease of {capability_id}: {s}: {lease}");
        }
        string_at(&lease, "lease_id")
    }

    /// Start `body` (an action request) under `lease_id`; it must be
    /// accepted (202, the caller does not wait). Returns the session id.
    ///
    /// Errors: the request failed or was answered otherwise.
    pub async fn start_action(&self, lease_id: &str, body: &Value) -> Result<String> {
        let (s, v) = self
            .post(
                &format!("/api/v1/capability-leases/{lease_id}/actions"),
                body,
            )
            .await?;
        if s != StatusCode::ACCEPTED {
            bail!("action on lease {lease_id}: {s}: {v}");
        }
        string_at(&v, "session_id")
    }

    /// Renew a lease.
    pub async fn renew(&self, lease_id: &str) -> Result<(StatusCode, Value)> {
        self.post(
            &format!("/api/v1/capability-leases/{lease_id}/renew"),
            &json!({}),
        )
        .await
    }

    /// Release a lease.
    pub async fn release(&self, lease_id: &str) -> Result<(StatusCode, Value)> {
        self.post(
            &format!("/api/v1/capability-leases/{lease_id}/release"),
            &json!({"reason": "audit step done"}),
        )
        .await
    }

    /// Invoke `action` under `lease_id`, waiting up to `wait_ms` for the
    /// session to end. Answers `(status, session or error)`.
    pub async fn act(
        &self,
        lease_id: &str,
        action: &str,
        params: Value,
        wait_ms: u32,
    ) -> Result<(StatusCode, Value)> {
        self.post(
            &format!("/api/v1/capability-leases/{lease_id}/actions"),
            &json!({ "action": action, "params": params, "wait_ms": wait_ms }),
        )
        .await
    }

    /// [`Agent::act`] that must end `completed` within 30 s; returns the
    /// session.
    pub async fn act_ok(&self, lease_id: &str, action: &str, params: Value) -> Result<Value> {
        let (s, v) = self.act(lease_id, action, params, 30_000).await?;
        if s != StatusCode::OK || v["status"] != "completed" {
            bail!("{action} on lease {lease_id}: {s}: {v}");
        }
        Ok(v)
    }

    /// Download an artifact's bytes.
    pub async fn download(&self, artifact_id: &str) -> Result<Download> {
        let resp = self
            .http
            .get(format!(
                "{}/api/v1/artifacts/{artifact_id}/content",
                self.base_url
            ))
            .bearer_auth(&self.token)
            .send()
            .await?;
        if resp.status() != StatusCode::OK {
            let s = resp.status();
            bail!(
                "download {artifact_id}: {s}: {}",
                resp.text().await.unwrap_or_default()
            );
        }
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let content_type = header("content-type");
        let checksum_header = header("x-checksum-sha256");
        let bytes = resp.bytes().await?.to_vec();
        Ok(Download {
            bytes,
            content_type,
            checksum_header,
        })
    }

    /// Wait until every artifact of `lease_ids` has its bytes uploaded;
    /// returns them all.
    pub async fn wait_artifacts_uploaded(
        &self,
        lease_ids: &[String],
        timeout: Duration,
    ) -> Result<Vec<Value>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let mut all = Vec::new();
            for l in lease_ids {
                let v = self
                    .get_ok(&format!("/api/v1/artifacts?lease_id={l}&limit=10000"))
                    .await?;
                all.extend(v["artifacts"].as_array().cloned().unwrap_or_default());
            }
            let waiting: Vec<&Value> = all.iter().filter(|a| a["uploaded"] != true).collect();
            if waiting.is_empty() {
                return Ok(all);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "{} artifact(s) still not uploaded after {timeout:?}: {:?}",
                    waiting.len(),
                    waiting
                        .iter()
                        .map(|a| &a["artifact_id"])
                        .collect::<Vec<_>>()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Wait until `GET /healthz` answers 503: the registry has lost its
    /// MQTT link.
    ///
    /// Errors: still not 503 after `timeout`.
    pub async fn wait_mqtt_down(&self, timeout: Duration) -> Result<()> {
        poll_until(timeout, "registry sees the broker gone", || async {
            let (s, _) = self.get("/healthz").await.ok()?;
            (s == StatusCode::SERVICE_UNAVAILABLE).then_some(())
        })
        .await
    }

    /// Wait until the registry's MQTT link is up and `provider_id` is
    /// online with a heartbeat later than `since`: both ends are connected
    /// again. Needs a token that may read providers.
    ///
    /// Errors: not so after `timeout`.
    pub async fn wait_reconnected(
        &self,
        provider_id: &str,
        since: DateTime<Utc>,
        timeout: Duration,
    ) -> Result<()> {
        poll_until(timeout, "both ends reconnected", || async {
            let h = self.get_ok("/healthz").await.ok()?;
            let p = self
                .get_ok(&format!("/api/v1/capability-providers/{provider_id}"))
                .await
                .ok()?;
            let beat = p["last_heartbeat_at"]
                .as_str()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())?;
            (h["mqtt"]["connected"] == true && p["online_status"] == "online" && beat > since)
                .then_some(())
        })
        .await
    }
}

/// Events received on the SSE stream so far, shared with the follower task.
#[derive(Clone, Default)]
pub struct EventLog {
    events: Arc<Mutex<Vec<Value>>>,
}

impl EventLog {
    /// Every event so far (CapabilityEvent JSON), in order.
    pub fn all(&self) -> Vec<Value> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Events of one type.
    pub fn of(&self, event_type: &str) -> Vec<Value> {
        self.all()
            .into_iter()
            .filter(|e| e["event_type"] == event_type)
            .collect()
    }

    /// Wait until an event matching `pred` has arrived; returns it.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.all().into_iter().find(|e| pred(e)) {
                return Ok(e);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(anyhow!(
                    "no `{what}` event on the stream within {timeout:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Follow `GET /api/v1/capability-events/stream?after=0` in a task,
/// collecting every event into the returned log and handing each to
/// `on_event` (for printing). Reconnects with `Last-Event-ID` after a
/// dropped connection. The task ends when the returned handle is aborted.
pub fn follow_events(
    agent: &Agent,
    on_event: impl Fn(&Value) + Send + Sync + 'static,
) -> (EventLog, tokio::task::JoinHandle<()>) {
    let log = EventLog::default();
    let events = log.events.clone();
    let url = format!("{}/api/v1/capability-events/stream", agent.base_url);
    let token = agent.token.clone();
    let http = agent.stream_http.clone();
    let task = tokio::spawn(async move {
        let mut last_id: u64 = 0;
        loop {
            let resp = http
                .get(format!("{url}?after={last_id}"))
                .bearer_auth(&token)
                .header("Last-Event-ID", last_id.to_string())
                .send()
                .await;
            let Ok(resp) = resp else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let mut stream = std::pin::pin!(stream_events(resp));
            while let Some(ev) = stream.next().await {
                let Some(id) = ev["event_id"].as_u64() else {
                    continue;
                };
                if id <= last_id {
                    continue;
                }
                last_id = id;
                on_event(&ev);
                if let Ok(mut e) = events.lock() {
                    e.push(ev);
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    (log, task)
}

/// The JSON events of an SSE answer (`text/event-stream`), in order: each
/// event's `data` parsed as JSON. Events whose data is not JSON (comments,
/// keep-alives) are skipped. The stream ends when the connection does or
/// breaks; UTF-8 split across network chunks is reassembled.
pub fn stream_events(resp: reqwest::Response) -> impl futures::Stream<Item = Value> {
    use eventsource_stream::Eventsource;
    resp.bytes_stream()
        .eventsource()
        .take_while(|r| std::future::ready(r.is_ok()))
        .filter_map(|r| std::future::ready(r.ok().and_then(|e| serde_json::from_str(&e.data).ok())))
}
