//! What each command does: HTTP calls through [`crate::client::Agent`],
//! then a table for people or the registry's JSON (`--json`).

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::cli::{ArtifactCommand, AuditCommand, Command, LeaseArgs, WatchArgs};
use crate::client::{sha256_hex, Agent};
use crate::exit::{Failure, API, CONFLICT};

/// Result of a command.
pub type Outcome = Result<(), Failure>;

/// A connected command context: the client and the output mode.
pub struct Ctx {
    /// The client with the caller's token.
    pub agent: Agent,
    /// `--json`.
    pub json: bool,
}

/// Lease statuses that no longer hold a capability (final).
pub const FINAL_LEASE: [&str; 4] = ["released", "expired", "revoked", "failed"];
/// Session statuses that are final.
pub const FINAL_SESSION: [&str; 4] = ["completed", "failed", "cancelled", "incomplete_evidence"];

impl Ctx {
    /// GET `path`; an answer other than 200 is a [`Failure`].
    pub async fn get(&self, path: &str) -> Result<Value, Failure> {
        let (s, v) = self.agent.get(path).await?;
        if s != StatusCode::OK {
            return Err(Failure::from_answer(&format!("GET {path}"), s, &v));
        }
        Ok(v)
    }

    /// POST `body`; an answer outside `ok` is a [`Failure`].
    pub async fn post(
        &self,
        path: &str,
        body: &Value,
        ok: &[StatusCode],
    ) -> Result<(StatusCode, Value), Failure> {
        let (s, v) = self.agent.post(path, body).await?;
        if !ok.contains(&s) {
            return Err(Failure::from_answer(&format!("POST {path}"), s, &v));
        }
        Ok((s, v))
    }

    /// DELETE `path`; an answer other than 200 is a [`Failure`].
    pub async fn delete(&self, path: &str) -> Result<Value, Failure> {
        let (s, v) = self.agent.delete(path).await?;
        if s != StatusCode::OK {
            return Err(Failure::from_answer(&format!("DELETE {path}"), s, &v));
        }
        Ok(v)
    }

    /// Print `v` as pretty JSON (for `--json`).
    pub(crate) fn print_json(&self, v: &Value) {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    }

    /// The caller's principal and role (`GET /api/v1/auth/whoami`).
    pub async fn whoami(&self) -> Result<(String, String), Failure> {
        let v = self.get("/api/v1/auth/whoami").await?;
        Ok((
            v["principal"].as_str().unwrap_or_default().to_string(),
            v["role"].as_str().unwrap_or_default().to_string(),
        ))
    }
}

/// A JSON field as table text (`-` when absent).
pub(crate) fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_header(header.to_vec());
    t
}

/// Append `key=value` pairs of `pairs` whose value is set as a query.
fn query(path: &str, pairs: &[(&str, Option<&str>)]) -> String {
    let q: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={}", encode(v))))
        .collect();
    if q.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", q.join("&"))
    }
}

/// Percent-encode a query value (everything but unreserved characters).
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b',' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Run one command (not `completions`, `man` or `mcp`, which need no
/// registry).
pub async fn run(ctx: &Ctx, command: Command) -> Outcome {
    match command {
        Command::Caps(a) => caps(ctx, a).await,
        Command::Who => who(ctx).await,
        Command::Lease(a) => lease(ctx, a).await,
        Command::Renew { lease_id, duration } => {
            let body = match duration {
                Some(d) => json!({"requested_duration_seconds": d}),
                None => json!({}),
            };
            let (_, v) = ctx
                .post(
                    &format!("/api/v1/capability-leases/{lease_id}/renew"),
                    &body,
                    &[StatusCode::OK],
                )
                .await?;
            print_lease_line(ctx, "renewed", &v);
            Ok(())
        }
        Command::Release { lease_id, reason } => {
            let (_, v) = ctx
                .post(
                    &format!("/api/v1/capability-leases/{lease_id}/release"),
                    &json!({ "reason": reason }),
                    &[StatusCode::OK],
                )
                .await?;
            print_lease_line(ctx, "released", &v);
            Ok(())
        }
        Command::Act(a) => act(ctx, a).await,
        Command::Session { session_id } => {
            let s = ctx.get(&format!("/api/v1/sessions/{session_id}")).await?;
            if ctx.json {
                ctx.print_json(&s);
            } else {
                print_session(&s);
            }
            Ok(())
        }
        Command::Artifact(ArtifactCommand::Get {
            artifact_id,
            output,
        }) => {
            let out = output.unwrap_or_else(|| artifact_id.clone().into());
            artifact_get(ctx, &artifact_id, &out).await
        }
        Command::Artifact(ArtifactCommand::List {
            session,
            lease,
            derived_from,
        }) => {
            let v = ctx
                .get(&query(
                    "/api/v1/artifacts",
                    &[
                        ("session_id", session.as_deref()),
                        ("lease_id", lease.as_deref()),
                        ("derived_from", derived_from.as_deref()),
                    ],
                ))
                .await?;
            if ctx.json {
                ctx.print_json(&v);
                return Ok(());
            }
            let mut t = table(&[
                "artifact",
                "type",
                "content type",
                "bytes",
                "uploaded",
                "sha256",
            ]);
            for a in v["artifacts"].as_array().into_iter().flatten() {
                t.add_row(vec![
                    cell(&a["artifact_id"]),
                    cell(&a["artifact_type"]),
                    cell(&a["content_type"]),
                    cell(&a["size_bytes"]),
                    cell(&a["uploaded"]),
                    cell(&a["checksum"]),
                ]);
            }
            println!("{t}");
            Ok(())
        }
        Command::Watch(a) => watch(ctx, a).await,
        Command::Audit(a) => audit(ctx, a).await,
        Command::Earth { text } => {
            let (_, v) = ctx
                .post(
                    "/api/v1/agents/earth/command",
                    &json!({"input_text": text, "source": "text"}),
                    &[StatusCode::OK, StatusCode::CREATED],
                )
                .await?;
            if ctx.json {
                ctx.print_json(&v);
                return Ok(());
            }
            println!("{}", cell(&v["summary"]));
            for a in v["actions"].as_array().into_iter().flatten() {
                let n = a["entity_ids"].as_array().map(Vec::len);
                match n {
                    Some(n) => println!("  {} ({n} entities)", cell(&a["type"])),
                    None => println!("  {}", cell(&a["type"])),
                }
            }
            for m in v["missing_data"].as_array().into_iter().flatten() {
                println!("  note: {}", cell(m));
            }
            Ok(())
        }
        Command::Maintenance(m) => crate::maintenance::maintenance(ctx, m).await,
        Command::Capability(c) => crate::maintenance::capability(ctx, c).await,
        Command::Completions { .. }
        | Command::Man
        | Command::Mcp
        | Command::VerifyBundle { .. } => Err(Failure::usage("not a registry command")),
    }
}

async fn caps(ctx: &Ctx, a: crate::cli::CapsArgs) -> Outcome {
    let v = ctx
        .get(&query(
            "/api/v1/capabilities",
            &[
                ("type", a.capability_type.as_deref()),
                ("tag", a.tag.as_deref()),
                ("status", a.status.as_deref()),
            ],
        ))
        .await?;
    if ctx.json {
        ctx.print_json(&v);
        return Ok(());
    }
    let mut t = table(&["capability", "type", "status", "health", "provider", "tags"]);
    for c in v["capabilities"].as_array().into_iter().flatten() {
        t.add_row(vec![
            cell(&c["capability_id"]),
            cell(&c["capability_type"]),
            cell(&c["status"]),
            cell(&c["health_status"]),
            cell(&c["provider_id"]),
            cell(&c["tags"]),
        ]);
    }
    println!("{t}");
    Ok(())
}

async fn who(ctx: &Ctx) -> Outcome {
    let held = ctx
        .get("/api/v1/capability-leases?active_only=true&limit=1000")
        .await?;
    let queued = ctx
        .get("/api/v1/capability-leases?status=requested&limit=1000")
        .await?;
    let held = held["leases"].as_array().cloned().unwrap_or_default();
    let queued = queued["leases"].as_array().cloned().unwrap_or_default();
    let depth = |cap: &Value| queued.iter().filter(|q| &q["capability_id"] == cap).count();
    if ctx.json {
        ctx.print_json(&json!({
            "held": held,
            "queued": queued,
        }));
        return Ok(());
    }
    let mut t = table(&[
        "capability",
        "lease",
        "holder",
        "status",
        "priority",
        "expires",
        "queued",
    ]);
    for l in &held {
        t.add_row(vec![
            cell(&l["capability_id"]),
            cell(&l["lease_id"]),
            cell(&l["holder_ref"]),
            cell(&l["status"]),
            cell(&l["priority"]),
            cell(&l["expires_at"]),
            depth(&l["capability_id"]).to_string(),
        ]);
    }
    println!("{t}");
    let unresolved = queued
        .iter()
        .filter(|q| q["capability_id"].as_str().unwrap_or("").is_empty())
        .count();
    println!(
        "{} held, {} queued{}",
        held.len(),
        queued.len(),
        if unresolved > 0 {
            format!(" ({unresolved} by selector, not yet resolved)")
        } else {
            String::new()
        }
    );
    Ok(())
}

fn holder_type(role: &str) -> &'static str {
    match role {
        "audit_agent" => "audit_agent",
        "operator" => "human_operator",
        _ => "system",
    }
}

/// Parse a `--select` value `TYPE[:TAG,TAG]` into `(type, tags)`.
fn parse_selector(s: &str) -> Result<(String, Vec<String>), Failure> {
    let (ty, tags) = match s.split_once(':') {
        Some((t, tags)) => (t, tags.split(',').filter(|t| !t.is_empty()).collect()),
        None => (s, Vec::new()),
    };
    if ty.is_empty() {
        return Err(Failure::usage(format!(
            "--select {s:?}: no capability type"
        )));
    }
    Ok((
        ty.to_string(),
        tags.into_iter().map(str::to_string).collect(),
    ))
}

/// The lease (or the group's leases) as one status line each.
fn print_lease_line(ctx: &Ctx, what: &str, l: &Value) {
    if ctx.json {
        ctx.print_json(l);
    } else {
        let when = if FINAL_LEASE.contains(&l["status"].as_str().unwrap_or("")) {
            format!("ended {}", cell(&l["ended_at"]))
        } else if l["status"] == "requested" {
            format!("queued since {}", cell(&l["requested_at"]))
        } else {
            format!("expires {}", cell(&l["expires_at"]))
        };
        println!(
            "{what} {} on {} ({}), {when}",
            cell(&l["lease_id"]),
            cell(&l["capability_id"]),
            cell(&l["status"]),
        );
    }
}

async fn lease(ctx: &Ctx, a: LeaseArgs) -> Outcome {
    let selectors: Vec<_> = a
        .selectors
        .iter()
        .map(|s| parse_selector(s))
        .collect::<Result<_, _>>()?;
    let n = a.capability_ids.len() + selectors.len();
    if n == 0 {
        return Err(Failure::usage(
            "name a capability id or a --select TYPE[:TAGS]",
        ));
    }
    let (principal, role) = ctx.whoami().await?;
    let mut body = json!({
        "holder_type": holder_type(&role),
        "holder_ref": principal,
        "project_id": a.project,
        "purpose": a.purpose,
        "priority": a.priority,
        "requested_duration_seconds": a.duration,
        "evidence_required": true,
    });
    if let Some(r) = &a.preempt_reason {
        body["preempt_if_needed"] = json!(true);
        body["preempt_reason"] = json!(r);
    }
    // The API's own wait covers up to 300 s; a longer --wait follows the
    // queued lease by polling it.
    let api_wait = a.wait.min(300);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(a.wait.into());
    let ok = [StatusCode::CREATED, StatusCode::ACCEPTED];
    if n == 1 {
        match a.capability_ids.first() {
            Some(id) => body["capability_id"] = json!(id),
            None => {
                let (ty, tags) = &selectors[0];
                body["capability_selector"] = json!({"capability_type": ty, "tags": tags});
            }
        }
        let (_, mut l) = ctx
            .post(
                &format!("/api/v1/capability-leases/request?wait_seconds={api_wait}"),
                &body,
                &ok,
            )
            .await?;
        while l["status"] == "requested" && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(500)).await;
            l = ctx
                .get(&format!(
                    "/api/v1/capability-leases/{}",
                    cell(&l["lease_id"])
                ))
                .await?;
        }
        let outcome = lease_outcome(ctx, &principal, std::slice::from_mut(&mut l)).await;
        outcome.map_err(|f| f.with_body(&l))?;
        print_lease_line(ctx, "lease", &l);
        return Ok(());
    }
    body["capability_ids"] = json!(a.capability_ids);
    body["requirements"] = json!(selectors
        .iter()
        .map(|(ty, tags)| json!({
            "capability_type": ty,
            "mode": a.mode,
            "preferred_node_tags": tags,
            "fallback_allowed": tags.is_empty(),
        }))
        .collect::<Vec<_>>());
    let (_, mut g) = ctx
        .post(
            &format!("/api/v1/capability-leases/request-group?wait_seconds={api_wait}"),
            &body,
            &ok,
        )
        .await?;
    while g["status"] == "requested" && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let ids: Vec<String> = g["leases"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| cell(&l["lease_id"]))
            .collect();
        let mut leases = Vec::new();
        for id in ids {
            leases.push(ctx.get(&format!("/api/v1/capability-leases/{id}")).await?);
        }
        let all_granted = leases
            .iter()
            .all(|l| !matches!(l["status"].as_str(), Some("requested")));
        g["leases"] = json!(leases);
        if all_granted {
            g["status"] = json!("granted");
        }
    }
    let mut leases = g["leases"].as_array().cloned().unwrap_or_default();
    let outcome = lease_outcome(ctx, &principal, &mut leases).await;
    if outcome.is_err() {
        g["leases"] = json!(leases);
        if let Some(s) = leases.first().map(|l| l["status"].clone()) {
            g["status"] = s;
        }
    }
    outcome.map_err(|f| f.with_body(&g))?;
    if ctx.json {
        ctx.print_json(&g);
    } else {
        println!(
            "group {} ({})",
            cell(&g["lease_group_id"]),
            cell(&g["status"])
        );
        for l in &leases {
            print_lease_line(ctx, "  lease", l);
        }
    }
    Ok(())
}

/// Exit 5 when a lease is still queued after the wait or ended without a
/// grant. Queued requests are withdrawn first (released), so a refused
/// lease or group leaves nothing behind; the message names the current
/// holders (`you` when it is the caller, `principal`). Each withdrawn
/// lease in `leases` is replaced by the registry's answer to the release,
/// so the failure's body shows the final status, not `requested`.
async fn lease_outcome(ctx: &Ctx, principal: &str, leases: &mut [Value]) -> Outcome {
    let waiting: Vec<String> = leases
        .iter()
        .filter(|l| l["status"] == "requested")
        .map(|l| l["capability_id"].as_str().unwrap_or("").to_string())
        .collect();
    if let Some(l) = leases
        .iter()
        .find(|l| FINAL_LEASE.contains(&l["status"].as_str().unwrap_or("")))
    {
        return Err(Failure::new(
            CONFLICT,
            format!(
                "lease {} ended {} without a grant",
                cell(&l["lease_id"]),
                cell(&l["status"])
            ),
        ));
    }
    if waiting.is_empty() {
        return Ok(());
    }
    for l in leases.iter_mut() {
        if let Ok((StatusCode::OK, ended)) = ctx
            .agent
            .post(
                &format!("/api/v1/capability-leases/{}/release", cell(&l["lease_id"])),
                &json!({"reason": "not granted within the wait; withdrawn"}),
            )
            .await
        {
            *l = ended;
        }
    }
    let mut holders = Vec::new();
    for cap in &waiting {
        let cap = cap.as_str();
        if cap.is_empty() {
            continue;
        }
        let before = holders.len();
        if let Ok((StatusCode::OK, v)) = ctx
            .agent
            .get(&format!(
                "/api/v1/capability-leases?capability_id={}&active_only=true",
                encode(cap)
            ))
            .await
        {
            for h in v["leases"].as_array().into_iter().flatten() {
                let holder = cell(&h["holder_ref"]);
                let holder = if holder == principal || cell(&h["principal"]) == principal {
                    format!("you ({holder})")
                } else {
                    holder
                };
                holders.push(format!(
                    "{cap} is held by {holder} (lease {}, priority {}, until {})",
                    cell(&h["lease_id"]),
                    cell(&h["priority"]),
                    cell(&h["expires_at"])
                ));
            }
        }
        if holders.len() == before {
            if let Some(why) = not_grantable_because(ctx, cap).await {
                holders.push(format!("{cap} {why}"));
            }
        }
    }
    if holders.is_empty() {
        holders.push("no matching capability became free".into());
    }
    Err(Failure::new(
        CONFLICT,
        format!(
            "not granted: {}; the request was withdrawn (wait with --wait SECONDS, or preempt with --priority and --preempt-reason)",
            holders.join("; ")
        ),
    ))
}

/// Why nobody holding `capability_id` still left it ungranted, from its
/// registry record: unhealthy (with the health check's reason), in
/// maintenance or offline; `None` when it looks grantable or cannot be
/// read.
async fn not_grantable_because(ctx: &Ctx, capability_id: &str) -> Option<String> {
    let Ok((StatusCode::OK, c)) = ctx
        .agent
        .get(&format!("/api/v1/capabilities/{}", encode(capability_id)))
        .await
    else {
        return None;
    };
    if c["health_status"] == "unhealthy" {
        return Some(match c["health_check_reason"].as_str() {
            Some(r) if !r.is_empty() => format!("is unhealthy ({r})"),
            _ => "is unhealthy".to_string(),
        });
    }
    match c["status"].as_str() {
        Some(s @ ("maintenance" | "offline")) => Some(format!("is {s}")),
        _ => None,
    }
}

/// Parse `key=value` action parameters: JSON values as such, anything
/// else as a string.
pub fn parse_params(pairs: &[String]) -> Result<Value, Failure> {
    let mut m = serde_json::Map::new();
    for p in pairs {
        let Some((k, v)) = p.split_once('=') else {
            return Err(Failure::usage(format!("parameter {p:?} is not KEY=VALUE")));
        };
        if k.is_empty() {
            return Err(Failure::usage(format!("parameter {p:?} has no key")));
        }
        let value = serde_json::from_str::<Value>(v).unwrap_or_else(|_| json!(v));
        m.insert(k.to_string(), value);
    }
    Ok(Value::Object(m))
}

async fn act(ctx: &Ctx, a: crate::cli::ActArgs) -> Outcome {
    let params = parse_params(&a.params)?;
    let mut body = json!({
        "action": a.action,
        "params": params,
        "wait_ms": (u64::from(a.wait) * 1000).min(300_000),
    });
    if let Some(c) = &a.capability {
        body["capability_id"] = json!(c);
    }
    let (_, mut s) = ctx
        .post(
            &format!("/api/v1/capability-leases/{}/actions", a.lease_id),
            &body,
            &[StatusCode::OK, StatusCode::ACCEPTED],
        )
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(a.wait.into());
    while !FINAL_SESSION.contains(&s["status"].as_str().unwrap_or(""))
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(300)).await;
        s = ctx
            .get(&format!("/api/v1/sessions/{}", cell(&s["session_id"])))
            .await?;
    }
    if ctx.json {
        ctx.print_json(&s);
    } else {
        print_session(&s);
    }
    match s["status"].as_str() {
        Some("completed") => Ok(()),
        Some(st) if FINAL_SESSION.contains(&st) => Err(Failure::new(
            API,
            format!("{} ended {st}: {}", a.action, cell(&s["error_message"])),
        )),
        _ => Err(Failure::new(
            API,
            format!(
                "{} still running after {} s: benchlink session {}",
                a.action,
                a.wait,
                cell(&s["session_id"])
            ),
        )),
    }
}

fn print_session(s: &Value) {
    println!(
        "session {}  {} {} on {}",
        cell(&s["session_id"]),
        cell(&s["action"]),
        cell(&s["status"]),
        cell(&s["capability_id"])
    );
    if let Some(e) = s["error_message"].as_str().filter(|e| !e.is_empty()) {
        println!("  error: {e}");
    }
    if let Some(r) = s["result_summary"].as_object() {
        for (k, v) in r {
            println!("  {k}: {}", cell(v));
        }
    }
    for a in s["artifact_refs"].as_array().into_iter().flatten() {
        println!("  artifact {}", cell(a));
    }
}

/// `GET path` (relative to the registry) for a download whose body is
/// streamed: the answer when it is 200.
///
/// Errors: the request failed, or the registry answered otherwise (its
/// error body mapped as every command's).
async fn get_download(ctx: &Ctx, path: &str) -> Result<reqwest::Response, Failure> {
    let resp = ctx
        .agent
        .http()
        .get(format!("{}{path}", ctx.agent.base_url))
        .bearer_auth(ctx.agent.token())
        .send()
        .await
        .map_err(|e| Failure::from(anyhow::Error::new(e).context(format!("GET {path}"))))?;
    let status = resp.status();
    if status != StatusCode::OK {
        let text = resp.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        return Err(Failure::from_answer(&format!("GET {path}"), status, &body));
    }
    Ok(resp)
}

/// Download `artifact_id` to `out`, streaming, with a progress bar above
/// 1 MiB (on a terminal), and check its sha256 against the artifact's
/// stored checksum. The file is written as `{out}.partial` and renamed only
/// when the checksum matches.
async fn artifact_get(ctx: &Ctx, artifact_id: &str, out: &Path) -> Outcome {
    let meta = ctx.get(&format!("/api/v1/artifacts/{artifact_id}")).await?;
    let expected = meta["checksum"].as_str().unwrap_or_default().to_string();
    let path = format!("/api/v1/artifacts/{artifact_id}/content");
    let resp = get_download(ctx, &path).await?;
    let total = resp.content_length().unwrap_or(0);
    let bar = (total > 1024 * 1024 && !ctx.json).then(|| {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let partial = partial_path(out);
    let io_err = |e: std::io::Error| Failure::new(API, format!("{}: {e}", partial.display()));
    let mut file = std::fs::File::create(&partial).map_err(io_err)?;
    let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
    let mut stream = resp.bytes_stream();
    let mut written: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| Failure::from(anyhow::Error::new(e).context(format!("GET {path}"))))?;
        sha2::Digest::update(&mut hasher, &chunk);
        file.write_all(&chunk).map_err(io_err)?;
        written += chunk.len() as u64;
        if let Some(b) = &bar {
            b.set_position(written);
        }
    }
    file.sync_all().map_err(io_err)?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let got = hex::encode(sha2::Digest::finalize(hasher));
    if got != expected {
        let _ = std::fs::remove_file(&partial);
        return Err(Failure::new(
            API,
            format!("artifact {artifact_id}: the bytes hash to {got}, the bench computed {expected}; nothing written"),
        ));
    }
    std::fs::rename(&partial, out).map_err(io_err)?;
    let v = json!({
        "artifact_id": artifact_id,
        "path": out.display().to_string(),
        "size_bytes": written,
        "sha256": got,
        "verified": true,
        "content_type": meta["content_type"],
    });
    if ctx.json {
        ctx.print_json(&v);
    } else {
        println!(
            "{} → {} ({written} bytes, sha256 {got} verified)",
            artifact_id,
            out.display()
        );
    }
    Ok(())
}

/// One event as a line for people.
fn event_line(e: &Value) -> String {
    let d = &e["data"];
    let mut parts = vec![
        format!("#{}", cell(&e["event_id"])),
        cell(&e["created_at"]),
        cell(&e["event_type"]),
    ];
    for (k, v) in [
        ("capability", &e["capability_id"]),
        ("lease", &e["lease_id"]),
        ("session", &e["session_id"]),
        ("by", &d["notice"]["preempting_lease_id"]),
        ("reason", &d["reason"]),
        ("reason", &d["notice"]["preempt_reason"]),
        ("grace_until", &d["notice"]["grace_until"]),
    ] {
        if !v.is_null() && v.as_str() != Some("") {
            parts.push(format!("{k}={}", cell(v)));
        }
    }
    parts.join(" ")
}

/// Follow the event stream; reconnects with `Last-Event-ID` after a
/// dropped connection, so no event is lost or repeated. A 4xx answer
/// (401 after a revocation, 400 for bad filters) ends it.
async fn watch(ctx: &Ctx, a: WatchArgs) -> Outcome {
    let mut last_id = a.after;
    let mut seen: u64 = 0;
    let filters = [
        ("types", a.types.as_deref()),
        ("capability_id", a.capability.as_deref()),
        ("lease_id", a.lease.as_deref()),
    ];
    let http = ctx.agent.stream_http().clone();
    let mut out = std::io::stdout();
    loop {
        let path = query("/api/v1/capability-events/stream", &filters);
        let mut req = http
            .get(format!("{}{path}", ctx.agent.base_url))
            .bearer_auth(ctx.agent.token());
        if let Some(id) = last_id {
            req = req.header("Last-Event-ID", id.to_string());
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("benchlink watch: {e}; reconnecting");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let status = resp.status();
        if status.is_client_error() {
            let text = resp.text().await.unwrap_or_default();
            let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
            return Err(Failure::from_answer(&format!("GET {path}"), status, &body));
        }
        if status != StatusCode::OK {
            eprintln!("benchlink watch: {status}; reconnecting");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        let mut stream = std::pin::pin!(crate::client::stream_events(resp));
        while let Some(ev) = stream.next().await {
            let Some(id) = ev["event_id"].as_u64() else {
                continue;
            };
            if last_id.is_some_and(|l| id <= l) {
                continue;
            }
            last_id = Some(id);
            let line = if ctx.json {
                ev.to_string()
            } else {
                event_line(&ev)
            };
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
            seen += 1;
            if a.count.is_some_and(|c| seen >= c) {
                return Ok(());
            }
        }
        eprintln!(
            "benchlink watch: the stream ended; resuming after event {}",
            last_id.map(|i| i.to_string()).unwrap_or("-".into())
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Read a JSON document from `file` (`-`: stdin).
fn read_json(file: &Path) -> Result<Value, Failure> {
    let text = if file == Path::new("-") {
        std::io::read_to_string(std::io::stdin())
            .map_err(|e| Failure::usage(format!("stdin: {e}")))?
    } else {
        std::fs::read_to_string(file)
            .map_err(|e| Failure::usage(format!("{}: {e}", file.display())))?
    };
    serde_json::from_str(&text).map_err(|e| Failure::usage(format!("{}: {e}", file.display())))
}

async fn audit(ctx: &Ctx, a: AuditCommand) -> Outcome {
    match a {
        AuditCommand::Bundle {
            audit_request_id,
            output,
        } => return audit_bundle(ctx, &audit_request_id, &output).await,
        AuditCommand::Submit { file } => {
            let body = read_json(&file)?;
            let (_, v) = ctx
                .post("/api/v1/audit-requests", &body, &[StatusCode::CREATED])
                .await?;
            if ctx.json {
                ctx.print_json(&v);
            } else {
                // The answer is an `AuditRequestRecord`: the request inside.
                println!(
                    "audit request {} {}",
                    cell(&v["request"]["audit_request_id"]),
                    cell(&v["status"])
                );
            }
        }
        AuditCommand::Claim {
            audit_types,
            agent_ref,
            wait_ms,
        } => {
            let agent_ref = match agent_ref {
                Some(r) => r,
                None => ctx.whoami().await?.0,
            };
            let (s, v) = ctx
                .post(
                    "/api/v1/audit-requests/claim",
                    &json!({"audit_types": audit_types, "agent_ref": agent_ref, "wait_ms": wait_ms}),
                    &[StatusCode::OK, StatusCode::NO_CONTENT],
                )
                .await?;
            if s == StatusCode::NO_CONTENT {
                if ctx.json {
                    ctx.print_json(&json!({"claimed": null}));
                } else {
                    println!("no audit task waiting");
                }
                return Ok(());
            }
            if ctx.json {
                ctx.print_json(&v);
            } else {
                let r = if v["request"].is_object() {
                    &v["request"]
                } else {
                    &v
                };
                println!(
                    "claimed {} ({}): {}",
                    cell(&r["audit_request_id"]),
                    cell(&r["audit_type"]),
                    cell(&r["objective"])
                );
                for l in v["leases"].as_array().into_iter().flatten() {
                    println!(
                        "  lease {} on {}",
                        cell(&l["lease_id"]),
                        cell(&l["capability_id"])
                    );
                }
            }
        }
        AuditCommand::Result {
            audit_request_id,
            file,
        } => {
            let body = read_json(&file)?;
            let (_, v) = ctx
                .post(
                    &format!("/api/v1/audit-requests/{audit_request_id}/result"),
                    &body,
                    &[StatusCode::OK, StatusCode::CREATED],
                )
                .await?;
            if ctx.json {
                ctx.print_json(&v);
            } else {
                println!(
                    "audit request {} {}",
                    cell(&v["audit_request_id"]),
                    cell(&v["status"])
                );
            }
        }
    }
    Ok(())
}

/// Where a download into `out` is written until complete: `out` with
/// `.partial` appended (`x.tar` → `x.tar.partial`).
fn partial_path(out: &Path) -> std::path::PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".partial");
    std::path::PathBuf::from(name)
}

/// `audit bundle`: stream `GET /audit-requests/{id}/bundle` into
/// `{out}.partial`, then rename it to `out`.
async fn audit_bundle(ctx: &Ctx, id: &str, out: &Path) -> Outcome {
    let path = format!("/api/v1/audit-requests/{}/bundle", encode(id));
    let resp = get_download(ctx, &path).await?;
    let partial = partial_path(out);
    let io_err = |e: std::io::Error| Failure::new(API, format!("{}: {e}", partial.display()));
    let mut file = std::fs::File::create(&partial).map_err(io_err)?;
    let mut stream = resp.bytes_stream();
    let mut written: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_file(&partial);
                return Err(Failure::from(
                    anyhow::Error::new(e).context(format!("GET {path}")),
                ));
            }
        };
        file.write_all(&chunk).map_err(io_err)?;
        written += chunk.len() as u64;
    }
    file.sync_all().map_err(io_err)?;
    std::fs::rename(&partial, out).map_err(io_err)?;
    let v = json!({
        "audit_request_id": id,
        "path": out.display().to_string(),
        "size_bytes": written,
    });
    if ctx.json {
        ctx.print_json(&v);
    } else {
        println!(
            "audit bundle of {id} → {} ({written} bytes); check it with `benchlink verify-bundle`",
            out.display()
        );
    }
    Ok(())
}

/// `sha256_hex` of a file's bytes (for callers checking a download).
pub fn file_sha256(path: &Path) -> std::io::Result<String> {
    Ok(sha256_hex(&std::fs::read(path)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_json_when_they_parse_and_strings_otherwise() {
        let p = parse_params(&[
            "voltage_v=5.0".into(),
            "wait=false".into(),
            "text=help me".into(),
            "quoted=\"5\"".into(),
            "obj={\"a\":1}".into(),
            "eq=a=b".into(),
        ])
        .unwrap();
        assert_eq!(
            p,
            json!({"voltage_v": 5.0, "wait": false, "text": "help me", "quoted": "5",
                   "obj": {"a": 1}, "eq": "a=b"})
        );
        assert_eq!(parse_params(&["novalue".into()]).unwrap_err().code, 2);
        assert_eq!(parse_params(&["=x".into()]).unwrap_err().code, 2);
    }

    #[test]
    fn selectors_are_a_type_and_optional_tags() {
        assert_eq!(parse_selector("camera").unwrap(), ("camera".into(), vec![]));
        assert_eq!(
            parse_selector("camera:front,sim").unwrap(),
            (
                "camera".into(),
                vec!["front".to_string(), "sim".to_string()]
            )
        );
        assert_eq!(parse_selector(":front").unwrap_err().code, 2);
    }
}
