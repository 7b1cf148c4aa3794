//! Audit bundles across real processes: the `led-audit-agent` completes
//! the seed's LED audit on a real lab (registry + simulated bench), the
//! bundle is downloaded over HTTP with `benchlink audit bundle`, and
//! `benchlink verify-bundle` (a separate process, no registry) accepts it
//! and prints the sessions of the audit; one changed byte in an artifact,
//! in `events.jsonl` or in `sessions.json`, or another public key, makes
//! it exit 1 naming the file that failed.

use std::process::Stdio;
use std::time::Duration;

use benchlink_e2e::bench::{local_speech_toml, Lab, LabOptions};
use benchlink_e2e::client::{sha256_hex, Agent};
use benchlink_e2e::workspace_bin;
use reqwest::StatusCode;
use serde_json::{json, Value};

const LED_AGENT: &str = "audit:multimodal-auditor-01";
const REQUEST_ID: &str = "auditreq_001";
/// RFC 8032 test vector 1's public key: valid, but not the registry's.
const OTHER_KEY: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut c = tokio::process::Command::new(workspace_bin(program));
    c.args(args)
        .env_remove("BENCHLINK_URL")
        .env_remove("BENCHLINK_TOKEN")
        .env_remove("BENCHLINK_CONFIG")
        .env_remove("BENCHLINK_TOKEN_FILE")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(120), c.output())
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} ends within 120 s"))
        .expect("run the program");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `(path, content offset, size)` of every file of a ustar archive.
fn tar_entries(t: &[u8]) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 512 <= t.len() && t[at] != 0 {
        let h = &t[at..at + 512];
        let field = |r: std::ops::Range<usize>| {
            String::from_utf8_lossy(&h[r])
                .trim_end_matches('\0')
                .trim()
                .to_string()
        };
        let name = field(0..100);
        let prefix = field(345..500);
        let path = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let size = usize::from_str_radix(field(124..136).trim_end_matches('\0'), 8).unwrap();
        out.push((path, at + 512, size));
        at += 512 + size.div_ceil(512) * 512;
    }
    out
}

fn content<'a>(t: &'a [u8], path: &str) -> (usize, &'a [u8]) {
    let (_, at, size) = tar_entries(t)
        .into_iter()
        .find(|(p, _, _)| p == path)
        .unwrap_or_else(|| panic!("{path} in the bundle"));
    (at, &t[at..at + size])
}

/// Change file `path` of the archive in place with `f` (its length stays)
/// and, when `fix_manifest`, its SHA-256 in `manifest.json` too, so only
/// the deeper checks can catch the change.
fn tamper_with(t: &[u8], path: &str, fix_manifest: bool, f: impl FnOnce(&mut [u8])) -> Vec<u8> {
    let mut t = t.to_vec();
    let (at, old) = content(&t, path);
    let (old_sha, size) = (sha256_hex(old), old.len());
    f(&mut t[at..at + size]);
    if fix_manifest {
        let new_sha = sha256_hex(content(&t, path).1);
        let (m_at, manifest) = content(&t, "manifest.json");
        // The `sha256` field, not an artifact's path (which holds the
        // same digits).
        let field = format!("\"sha256\": \"{old_sha}\"");
        let p = manifest
            .windows(field.len())
            .position(|w| w == field.as_bytes())
            .expect("the file's sha256 in the manifest")
            + field.len()
            - 65;
        t[m_at + p..m_at + p + 64].copy_from_slice(new_sha.as_bytes());
    }
    t
}

/// [`tamper_with`] replacing the first `from` by `to` (same length).
fn tamper(t: &[u8], path: &str, from: &str, to: &str, fix_manifest: bool) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    tamper_with(t, path, fix_manifest, |c| {
        let pos = c
            .windows(from.len())
            .position(|w| w == from.as_bytes())
            .unwrap_or_else(|| panic!("{from} in {path}"));
        c[pos..pos + to.len()].copy_from_slice(to.as_bytes());
    })
}

/// Flip the middle byte of a file.
fn flip(c: &mut [u8]) {
    let mid = c.len() / 2;
    c[mid] ^= 0x01;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_of_a_real_audit_verifies_offline_and_any_changed_byte_fails_it() {
    // The shipped sim bench (its simulated device and camera regions) and
    // the local recogniser, so the audit's derived evidence (detections,
    // OCR, the transcript) is in the bundle too.
    let lab = Lab::start(LabOptions {
        edge_config_template: Some(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/edge-agent.sim.toml"),
        ),
        registry_extra_toml: local_speech_toml(),
        ..LabOptions::default()
    })
    .await
    .expect("lab starts");
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let (s, minted) = admin
        .post(
            "/api/v1/auth/tokens",
            &json!({ "role": "audit_agent", "name": LED_AGENT }),
        )
        .await
        .expect("mint a token");
    assert_eq!(s, StatusCode::CREATED, "token answer: {minted}");
    let token = minted["token"].as_str().expect("token").to_string();
    let agent = run(
        "led-audit-agent",
        &[
            "--base-url",
            &lab.base_url,
            "--token",
            &token,
            "--agent-ref",
            LED_AGENT,
            "--create",
            "--audit-request-id",
            REQUEST_ID,
            "--wait-ms",
            "10000",
        ],
        &[],
    )
    .await;
    assert_eq!(
        agent.code, 0,
        "led-audit-agent: {}\n{}",
        agent.stdout, agent.stderr
    );
    let result = admin
        .get_ok(&format!("/api/v1/audit-requests/{REQUEST_ID}/result"))
        .await
        .expect("the result");
    let mut sessions = Vec::new();
    let mut artifacts = Vec::new();
    for id in result["artifact_refs"].as_array().into_iter().flatten() {
        let id = id.as_str().unwrap();
        let meta = admin
            .get_ok(&format!("/api/v1/artifacts/{id}"))
            .await
            .expect("artifact metadata");
        sessions.push(meta["session_id"].as_str().unwrap().to_string());
        artifacts.push((
            id.to_string(),
            meta["checksum"].as_str().unwrap().to_string(),
        ));
    }
    assert!(!artifacts.is_empty(), "the audit cites artifacts: {result}");

    // The route: headers, 404, the provider's 403.
    let url = format!("{}/api/v1/audit-requests/{REQUEST_ID}/bundle", lab.base_url);
    let resp = admin
        .http()
        .get(&url)
        .bearer_auth(&lab.admin_token)
        .send()
        .await
        .expect("GET bundle");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/x-tar");
    let disposition = resp.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(
        disposition,
        format!("attachment; filename=\"audit-bundle-{REQUEST_ID}.tar\"")
    );
    let over_http = resp.bytes().await.expect("bundle bytes");
    assert!(tar_entries(&over_http)
        .iter()
        .any(|(p, _, _)| p == "manifest.json"));
    let (s, body) = admin
        .get("/api/v1/audit-requests/auditreq_nope/bundle")
        .await
        .expect("GET unknown bundle");
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
    let provider = Agent::new(&lab.base_url, "provider", &lab.provider_token);
    let (s, body) = provider
        .get(&format!("/api/v1/audit-requests/{REQUEST_ID}/bundle"))
        .await
        .expect("GET bundle as provider");
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");

    // The CLI downloads it; verify-bundle needs no registry.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bundle.tar");
    let file_s = file.to_str().unwrap().to_string();
    let got = run(
        "benchlink",
        &["audit", "bundle", REQUEST_ID, "-o", &file_s],
        &[
            ("BENCHLINK_URL", &lab.base_url),
            ("BENCHLINK_TOKEN", &lab.admin_token),
        ],
    )
    .await;
    assert_eq!(got.code, 0, "audit bundle: {}\n{}", got.stdout, got.stderr);
    let bundle = std::fs::read(&file).unwrap();
    println!(
        "bundle: {} bytes, {} files, {} artifact(s)",
        bundle.len(),
        tar_entries(&bundle).len(),
        artifacts.len()
    );
    for (_, sha) in &artifacts {
        content(&bundle, &format!("artifacts/{sha}"));
    }
    let key = run(
        "cloud-registry",
        &[
            "audit-log",
            "public-key",
            "--config",
            lab.registry_config().to_str().unwrap(),
        ],
        &[],
    )
    .await;
    assert_eq!(key.code, 0, "public-key: {}", key.stderr);
    let key = key.stdout.trim().to_string();

    let ok = run(
        "benchlink",
        &["verify-bundle", &file_s, "--public-key", &key],
        &[],
    )
    .await;
    assert_eq!(ok.code, 0, "verify-bundle: {}\n{}", ok.stdout, ok.stderr);
    assert!(
        ok.stdout.starts_with("ok: audit request auditreq_001"),
        "{}",
        ok.stdout
    );
    for s in &sessions {
        assert!(
            ok.stdout.contains(&format!("session={s}")),
            "{s} in\n{}",
            ok.stdout
        );
    }
    for (a, _) in &artifacts {
        assert!(
            ok.stdout.contains(&format!("artifact={a}")),
            "{a} in\n{}",
            ok.stdout
        );
    }
    assert!(ok.stdout.contains("audit_task_completed"), "{}", ok.stdout);
    let ok_json = run(
        "benchlink",
        &["verify-bundle", &file_s, "--public-key", &key, "--json"],
        &[],
    )
    .await;
    assert_eq!(ok_json.code, 0, "{}", ok_json.stderr);
    let v: Value = serde_json::from_str(&ok_json.stdout).expect("JSON");
    assert_eq!(v["ok"], true);
    // Every cited artifact's bytes, and also those the result does not
    // cite (derived evidence, the speaker's clip) of the same sessions.
    assert!(
        v["verified"]["artifacts"].as_u64().unwrap() >= artifacts.len() as u64,
        "{v}"
    );
    let entries: Vec<String> = tar_entries(&bundle)
        .into_iter()
        .map(|(p, _, _)| p)
        .collect();
    for (id, sha) in &artifacts {
        assert!(
            entries.contains(&format!("artifacts/{sha}")),
            "cited artifact {id} in the bundle: {entries:?}"
        );
    }

    let first_artifact = format!("artifacts/{}", artifacts[0].1);
    let events = content(&bundle, "events.jsonl").1;
    let year = String::from_utf8_lossy(events)
        .split("\"occurred_at\":\"")
        .nth(1)
        .map(|s| s[..4].to_string())
        .expect("an occurred_at");
    let other_year = if year == "2099" { "2098" } else { "2099" };
    let result_file = tar_entries(&bundle)
        .into_iter()
        .map(|(p, _, _)| p)
        .find(|p| p.starts_with("results/"))
        .expect("a result in the bundle");
    // One letter of a finding's title changes case: a field no event
    // carries whole, covered by the completed event's result_sha256.
    let retitled = tamper_with(&bundle, &result_file, true, |c| {
        let key = b"\"title\": \"";
        let at = c
            .windows(key.len())
            .position(|w| w == key)
            .expect("a finding title")
            + key.len();
        assert!(
            c[at].is_ascii_alphabetic(),
            "a title starting with a letter"
        );
        c[at] ^= 0x20;
    });
    let cases: Vec<(&str, Vec<u8>, String, &str, &str)> = vec![
        (
            "a flipped byte in an artifact",
            tamper_with(&bundle, &first_artifact, false, flip),
            key.clone(),
            first_artifact.as_str(),
            "the file was changed",
        ),
        (
            "a changed byte in events.jsonl",
            tamper(
                &bundle,
                "events.jsonl",
                &format!("\"occurred_at\":\"{year}"),
                &format!("\"occurred_at\":\"{other_year}"),
                false,
            ),
            key.clone(),
            "events.jsonl",
            "the file was changed",
        ),
        (
            "a changed event with its manifest entry fixed",
            tamper(
                &bundle,
                "events.jsonl",
                &format!("\"occurred_at\":\"{year}"),
                &format!("\"occurred_at\":\"{other_year}"),
                true,
            ),
            key.clone(),
            "events.jsonl",
            "its hash does not match its contents",
        ),
        (
            "a changed session record with its manifest entry fixed",
            tamper(
                &bundle,
                "sessions.json",
                "\"status\": \"completed\"",
                "\"status\": \"cancelled\"",
                true,
            ),
            key.clone(),
            "sessions.json",
            "`status` differs from event",
        ),
        (
            "a changed derived colour with its manifest entry fixed",
            tamper_with(&bundle, "artifacts.json", true, |c| {
                let key = b"\"colour\": \"";
                let at = c
                    .windows(key.len())
                    .position(|w| w == key)
                    .expect("a derived detection's colour in artifacts.json")
                    + key.len();
                c[at] ^= 0x20;
            }),
            key.clone(),
            "artifacts.json",
            "`metadata_json` differs from its artifact_uploaded event",
        ),
        (
            "a changed acceptance criterion with its manifest entry fixed",
            tamper(&bundle, "request.json", "\"LED ", "\"XYZ ", true),
            key.clone(),
            "request.json",
            "differs from the one event",
        ),
        (
            "a changed finding with its manifest entry fixed",
            retitled,
            key.clone(),
            result_file.as_str(),
            "result_sha256",
        ),
        (
            "a changed artifact with its manifest entry fixed",
            tamper_with(&bundle, &first_artifact, true, flip),
            key.clone(),
            first_artifact.as_str(),
            "not the one it is named by",
        ),
        (
            "another public key",
            bundle.clone(),
            OTHER_KEY.to_string(),
            "checkpoint.json",
            "does not verify with the registry's public key",
        ),
    ];
    for (what, bytes, key, file_named, reason) in cases {
        let bad = dir.path().join("bad.tar");
        std::fs::write(&bad, &bytes).unwrap();
        let bad_s = bad.to_str().unwrap();
        let r = run(
            "benchlink",
            &["verify-bundle", bad_s, "--public-key", &key, "--json"],
            &[],
        )
        .await;
        assert_eq!(r.code, 1, "{what}: exit 1\n{}\n{}", r.stdout, r.stderr);
        let v: Value = serde_json::from_str(&r.stdout)
            .unwrap_or_else(|e| panic!("{what}: JSON ({e}): {}", r.stdout));
        assert_eq!(v["ok"], false, "{what}: {v}");
        assert_eq!(v["file"], file_named, "{what}: {v}");
        assert!(
            v["error"].as_str().unwrap_or_default().contains(reason),
            "{what}: `{reason}` in {v}"
        );
        let text = run(
            "benchlink",
            &["verify-bundle", bad_s, "--public-key", &key],
            &[],
        )
        .await;
        assert_eq!(text.code, 1, "{what}: {}", text.stderr);
        assert!(
            text.stderr
                .contains(&format!("bundle does not verify: {file_named}: ")),
            "{what}: {}",
            text.stderr
        );
    }
}
