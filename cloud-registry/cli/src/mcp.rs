//! `benchlink mcp`: an MCP server on stdio (rmcp) for agent hosts. Every
//! tool is one or a few calls of the registry's HTTP API with the token
//! the server was started with, so the caller's role, its leases and
//! preemption apply exactly as for any other client. Leases taken through
//! the server are released when the MCP client disconnects (stdin closed)
//! or the server is stopped (SIGTERM, SIGINT).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use reqwest::StatusCode;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::client::Agent;
use crate::exit::{Failure, API};
use crate::run::FINAL_SESSION;

/// Largest artifact returned inline (bytes); larger ones are described,
/// not sent.
pub const MAX_INLINE_BYTES: u64 = 8 * 1024 * 1024;

/// How long `fetch_artifact` waits for the bench to upload an artifact's
/// bytes (its metadata arrives with the session, the bytes just after).
pub const UPLOAD_WAIT: Duration = Duration::from_secs(20);

/// The MCP server: one registry client and the leases it took.
#[derive(Clone)]
pub struct BenchServer {
    agent: Agent,
    taken: Arc<Mutex<BTreeSet<String>>>,
    tool_router: ToolRouter<Self>,
}

/// `list_capabilities` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListArgs {
    /// Only this capability type, e.g. camera, serial_port, power_supply.
    pub capability_type: Option<String>,
    /// Only capabilities carrying this tag.
    pub tag: Option<String>,
}

/// `lease` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct LeaseArgs {
    /// The capability id to lease (or give capability_type instead).
    pub capability_id: Option<String>,
    /// Lease any capability of this type (when no capability_id).
    pub capability_type: Option<String>,
    /// How long to hold it, seconds (default 300).
    pub duration_seconds: Option<u32>,
    /// 0..=100, default 50. A higher priority may preempt a lower holder
    /// only with preempt_reason.
    pub priority: Option<u8>,
    /// What the lease is for; other users see it.
    pub purpose: Option<String>,
    /// Preempt a lower-priority holder for this whitelisted reason (e.g.
    /// chief_audit); that holder gets a grace period, then loses the
    /// hardware.
    pub preempt_reason: Option<String>,
    /// Wait up to this many seconds in the queue (default 30, at most 300).
    pub wait_seconds: Option<u32>,
}

/// `act` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ActArgs {
    /// The lease id from `lease`.
    pub lease_id: String,
    /// The action, e.g. snapshot (camera), read / write (serial_port),
    /// set_voltage / power_on (power_supply), tap (robot).
    pub action: String,
    /// The action's parameters as a JSON object, e.g. {"text": "help",
    /// "line_ending": "lf"}; default {}.
    pub params: Option<Value>,
    /// The capability, when the lease covers several.
    pub capability_id: Option<String>,
    /// Longest wait for the result, seconds (default 60, at most 300).
    pub wait_seconds: Option<u32>,
}

/// An id argument.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct LeaseIdArg {
    /// The lease id.
    pub lease_id: String,
}

/// An id argument.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SessionIdArg {
    /// The session id (from `act`).
    pub session_id: String,
}

/// An id argument.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ArtifactIdArg {
    /// The artifact id (from a session's artifact_refs).
    pub artifact_id: String,
}

/// `earth_command` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct EarthArgs {
    /// The command in natural language, e.g. "高亮所有北斗卫星".
    pub text: String,
}

fn text_result(v: &Value) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(
        serde_json::to_string_pretty(v).unwrap_or_default(),
    )])
}

fn failed(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

impl BenchServer {
    /// A server acting with `agent`'s token.
    pub fn new(agent: Agent) -> Self {
        Self {
            agent,
            taken: Arc::default(),
            tool_router: Self::tool_router(),
        }
    }

    /// GET `path` → the body, or a tool error naming the API's answer.
    async fn get(&self, path: &str) -> Result<Value, CallToolResult> {
        match self.agent.get(path).await {
            Ok((StatusCode::OK, v)) => Ok(v),
            Ok((s, v)) => Err(failed(
                Failure::from_answer(&format!("GET {path}"), s, &v).message,
            )),
            Err(e) => Err(failed(format!("GET {path}: {e:#}"))),
        }
    }

    async fn post(
        &self,
        path: &str,
        body: &Value,
        ok: &[StatusCode],
    ) -> Result<Value, CallToolResult> {
        match self.agent.post(path, body).await {
            Ok((s, v)) if ok.contains(&s) => Ok(v),
            Ok((s, v)) => Err(failed(
                Failure::from_answer(&format!("POST {path}"), s, &v).message,
            )),
            Err(e) => Err(failed(format!("POST {path}: {e:#}"))),
        }
    }

    /// A sentence on the lease's preemption, when it was preempted.
    async fn preemption_note(&self, lease_id: &str) -> Option<String> {
        let (s, l) = self
            .agent
            .get(&format!("/api/v1/capability-leases/{lease_id}"))
            .await
            .ok()?;
        if s != StatusCode::OK {
            return None;
        }
        let by = l["preempted_by"].as_str().unwrap_or("another lease");
        let reason = l["preempt_reason"].as_str().unwrap_or("unknown");
        match l["status"].as_str()? {
            "grace_period" => Some(format!(
                "PREEMPTED: lease {lease_id} was preempted by {by} (reason {reason}); it stays usable only until {} (grace period): finish, then release it",
                l["grace_until"].as_str().unwrap_or("?")
            )),
            "revoked" => Some(format!(
                "PREEMPTED: lease {lease_id} was preempted by {by} (reason {reason}) and is revoked; the hardware is no longer yours"
            )),
            "expired" => Some(format!("lease {lease_id} expired (not renewed in time)")),
            "released" => Some(format!("lease {lease_id} is released")),
            _ => None,
        }
    }

    async fn with_note(&self, lease_id: &str, mut r: CallToolResult) -> CallToolResult {
        if let Some(n) = self.preemption_note(lease_id).await {
            r.content.push(ContentBlock::text(n));
        }
        r
    }

    /// Release every lease this server took and still holds; returns
    /// how many were released.
    pub async fn release_taken(&self, reason: &str) -> usize {
        let ids: Vec<String> = match self.taken.lock() {
            Ok(mut t) => std::mem::take(&mut *t).into_iter().collect(),
            Err(_) => return 0,
        };
        let mut n = 0;
        for id in ids {
            if let Ok((StatusCode::OK, _)) = self
                .agent
                .post(
                    &format!("/api/v1/capability-leases/{id}/release"),
                    &json!({ "reason": reason }),
                )
                .await
            {
                n += 1;
            }
        }
        n
    }
}

#[tool_router]
impl BenchServer {
    /// List capabilities.
    #[tool(
        description = "List the lab's capabilities (cameras, serial consoles, power supplies, relays, robots, audio): id, type, status (available or leased), health and supported actions. Read only; touches no hardware."
    )]
    async fn list_capabilities(
        &self,
        Parameters(a): Parameters<ListArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let mut q = Vec::new();
        if let Some(t) = &a.capability_type {
            q.push(format!("type={t}"));
        }
        if let Some(t) = &a.tag {
            q.push(format!("tag={t}"));
        }
        let path = if q.is_empty() {
            "/api/v1/capabilities".to_string()
        } else {
            format!("/api/v1/capabilities?{}", q.join("&"))
        };
        Ok(match self.get(&path).await {
            Ok(v) => {
                let caps: Vec<Value> = v["capabilities"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        json!({
                            "capability_id": c["capability_id"],
                            "capability_type": c["capability_type"],
                            "display_name": c["display_name"],
                            "status": c["status"],
                            "health_status": c["health_status"],
                            "supported_actions": c["supported_actions"],
                            "tags": c["tags"],
                        })
                    })
                    .collect();
                text_result(&json!({ "capabilities": caps }))
            }
            Err(e) => e,
        })
    }

    /// Lease a capability.
    #[tool(
        description = "Lease a real piece of lab hardware for exclusive use (by capability_id, or any of a capability_type) for duration_seconds. While you hold it nobody else can drive it; a higher-priority user may preempt you (you get a grace period, then lose it). Returns the lease (lease_id, status, expires_at). Release it when done; leases taken here are released when this MCP connection closes."
    )]
    async fn lease(
        &self,
        Parameters(a): Parameters<LeaseArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let who = match self.get("/api/v1/auth/whoami").await {
            Ok(v) => v,
            Err(e) => return Ok(e),
        };
        let holder_type = match who["role"].as_str() {
            Some("audit_agent") => "audit_agent",
            Some("operator") => "human_operator",
            _ => "system",
        };
        let mut body = json!({
            "holder_type": holder_type,
            "holder_ref": who["principal"],
            "project_id": "benchlink-mcp",
            "purpose": a.purpose.unwrap_or_else(|| "agent task over MCP".into()),
            "priority": a.priority.unwrap_or(50),
            "requested_duration_seconds": a.duration_seconds.unwrap_or(300),
            "evidence_required": true,
        });
        match (&a.capability_id, &a.capability_type) {
            (Some(id), _) => body["capability_id"] = json!(id),
            (None, Some(t)) => body["capability_selector"] = json!({"capability_type": t}),
            (None, None) => return Ok(failed("give capability_id or capability_type")),
        }
        if let Some(r) = &a.preempt_reason {
            body["preempt_if_needed"] = json!(true);
            body["preempt_reason"] = json!(r);
        }
        let wait = a.wait_seconds.unwrap_or(30).min(300);
        let l = match self
            .post(
                &format!("/api/v1/capability-leases/request?wait_seconds={wait}"),
                &body,
                &[StatusCode::CREATED, StatusCode::ACCEPTED],
            )
            .await
        {
            Ok(l) => l,
            Err(e) => return Ok(e),
        };
        let id = l["lease_id"].as_str().unwrap_or_default().to_string();
        if let Ok(mut t) = self.taken.lock() {
            t.insert(id.clone());
        }
        if l["status"] == "requested" {
            let mut r = text_result(&l);
            r.content.push(ContentBlock::text(format!(
                "not granted yet: lease {id} is queued behind the current holder; call lease_status later, or release it to leave the queue"
            )));
            return Ok(r);
        }
        Ok(text_result(&l))
    }

    /// A lease's status.
    #[tool(
        description = "Show one of your leases: status (granted, active, grace_period when preempted, revoked, released, expired), expires_at, and who preempted it. Read only."
    )]
    async fn lease_status(
        &self,
        Parameters(a): Parameters<LeaseIdArg>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(
            match self
                .get(&format!("/api/v1/capability-leases/{}", a.lease_id))
                .await
            {
                Ok(v) => self.with_note(&a.lease_id, text_result(&v)).await,
                Err(e) => e,
            },
        )
    }

    /// Run an action.
    #[tool(
        description = "Run an action on leased hardware and wait for its result: this MOVES OR CHANGES REAL DEVICES (switches a power supply's output, toggles relays, moves a robot, sends bytes to a device's serial console) or records evidence (camera snapshot, audio). Needs a lease you hold. Returns the session (status, result_summary, artifact_refs); fetch artifacts with fetch_artifact."
    )]
    async fn act(&self, Parameters(a): Parameters<ActArgs>) -> Result<CallToolResult, ErrorData> {
        let wait = a.wait_seconds.unwrap_or(60).min(300);
        let mut body = json!({
            "action": a.action,
            "params": a.params.unwrap_or_else(|| json!({})),
            "wait_ms": wait * 1000,
        });
        if let Some(c) = &a.capability_id {
            body["capability_id"] = json!(c);
        }
        let mut s = match self
            .post(
                &format!("/api/v1/capability-leases/{}/actions", a.lease_id),
                &body,
                &[StatusCode::OK, StatusCode::ACCEPTED],
            )
            .await
        {
            Ok(s) => s,
            Err(e) => return Ok(self.with_note(&a.lease_id, e).await),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(wait.into());
        while !FINAL_SESSION.contains(&s["status"].as_str().unwrap_or(""))
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(300)).await;
            match self
                .get(&format!(
                    "/api/v1/sessions/{}",
                    s["session_id"].as_str().unwrap_or_default()
                ))
                .await
            {
                Ok(v) => s = v,
                Err(e) => return Ok(e),
            }
        }
        let mut r = if s["status"] == "completed" {
            text_result(&s)
        } else {
            let mut r = text_result(&s);
            r.is_error = Some(true);
            r
        };
        if let Some(n) = self.preemption_note(&a.lease_id).await {
            r.content.push(ContentBlock::text(n));
        }
        Ok(r)
    }

    /// Read a session.
    #[tool(
        description = "Read a session (one run of an action): status, input, result_summary, error and artifact ids. Read only."
    )]
    async fn read_session(
        &self,
        Parameters(a): Parameters<SessionIdArg>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(
            match self
                .get(&format!("/api/v1/sessions/{}", a.session_id))
                .await
            {
                Ok(v) => text_result(&v),
                Err(e) => e,
            },
        )
    }

    /// Fetch an artifact.
    #[tool(
        description = "Fetch an artifact (evidence a session recorded): images (camera snapshots, screen captures) come back as images you can look at, logs and transcripts as text, other files as a description with size and sha256. The bytes are checked against the sha256 the bench computed. Read only."
    )]
    async fn fetch_artifact(
        &self,
        Parameters(a): Parameters<ArtifactIdArg>,
    ) -> Result<CallToolResult, ErrorData> {
        // A session completes with its artifacts' metadata; the bytes
        // follow from the bench's outbox, so wait for them a while.
        let deadline = tokio::time::Instant::now() + UPLOAD_WAIT;
        let meta = loop {
            let meta = match self
                .get(&format!("/api/v1/artifacts/{}", a.artifact_id))
                .await
            {
                Ok(m) => m,
                Err(e) => return Ok(e),
            };
            if meta["uploaded"] != Value::Bool(false) {
                break meta;
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(text_result(&json!({
                    "artifact": meta,
                    "note": format!(
                        "the bench has not uploaded this artifact's bytes yet ({} s waited); fetch it again later",
                        UPLOAD_WAIT.as_secs()
                    ),
                })));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let size = meta["size_bytes"].as_u64().unwrap_or(0);
        let ct = meta["content_type"].as_str().unwrap_or("").to_string();
        let inline = ct.starts_with("image/") || ct.starts_with("text/") || ct.contains("json");
        if !inline || size > MAX_INLINE_BYTES {
            return Ok(text_result(&json!({
                "artifact": meta,
                "note": "not returned inline (binary or too large); download it with `benchlink artifact get`",
            })));
        }
        let d = match self.agent.download(&a.artifact_id).await {
            Ok(d) => d,
            Err(e) => return Ok(failed(format!("download {}: {e:#}", a.artifact_id))),
        };
        let got = crate::client::sha256_hex(&d.bytes);
        if meta["checksum"].as_str() != Some(got.as_str()) {
            return Ok(failed(format!(
                "artifact {}: the bytes hash to {got}, the bench computed {}",
                a.artifact_id, meta["checksum"]
            )));
        }
        let about = ContentBlock::text(format!(
            "artifact {} ({ct}, {size} bytes, sha256 {got} verified)",
            a.artifact_id
        ));
        let body = if ct.starts_with("image/") {
            ContentBlock::image(
                base64::engine::general_purpose::STANDARD.encode(&d.bytes),
                ct.split(';').next().unwrap_or(&ct).trim(),
            )
        } else {
            ContentBlock::text(String::from_utf8_lossy(&d.bytes).into_owned())
        };
        Ok(CallToolResult::success(vec![about, body]))
    }

    /// Release a lease.
    #[tool(
        description = "Release a lease: the hardware goes back to the pool (the next queued user gets it). Do this as soon as you are done."
    )]
    async fn release(
        &self,
        Parameters(a): Parameters<LeaseIdArg>,
    ) -> Result<CallToolResult, ErrorData> {
        let r = self
            .post(
                &format!("/api/v1/capability-leases/{}/release", a.lease_id),
                &json!({"reason": "released by the agent over MCP"}),
                &[StatusCode::OK],
            )
            .await;
        if let Ok(mut t) = self.taken.lock() {
            t.remove(&a.lease_id);
        }
        Ok(match r {
            Ok(v) => text_result(&v),
            Err(e) => e,
        })
    }

    /// Run an Earth command.
    #[tool(
        description = "Run an Earth command in natural language (e.g. \"高亮所有北斗卫星\", highlight all BeiDou satellites): returns the resolved plan (layers, highlighted entities, summary). Changes the Earth view only; touches no lab hardware."
    )]
    async fn earth_command(
        &self,
        Parameters(a): Parameters<EarthArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(
            match self
                .post(
                    "/api/v1/agents/earth/command",
                    &json!({"input_text": a.text, "source": "text"}),
                    &[StatusCode::OK, StatusCode::CREATED],
                )
                .await
            {
                Ok(v) => text_result(&v),
                Err(e) => e,
            },
        )
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for BenchServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_instructions(
            "Benchlink: lease real lab test hardware and drive it. list_capabilities, then lease, act, fetch_artifact, release. Every call goes through the registry with your token: roles, leases and preemption apply.",
        )
    }
}

/// Serve MCP on stdin/stdout until the client disconnects or the process
/// gets SIGTERM/SIGINT, then release the leases taken meanwhile.
///
/// Errors: the MCP handshake failed (exit 6).
pub async fn serve_stdio(agent: Agent) -> Result<(), Failure> {
    let server = BenchServer::new(agent);
    let keeper = server.clone();
    let service = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| Failure::new(API, format!("MCP handshake: {e}")))?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Failure::new(API, format!("SIGTERM handler: {e}")))?;
    tokio::select! {
        _ = service.waiting() => {}
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    let n = keeper
        .release_taken("client_disconnected: MCP session ended")
        .await;
    if n > 0 {
        eprintln!("benchlink mcp: the client went away; released {n} lease(s) it held");
    }
    Ok(())
}
