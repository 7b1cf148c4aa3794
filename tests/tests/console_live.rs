//! The console's live view of a running camera stream
//! (tests/browser/live.spec.mjs in a real Chromium) against a whole
//! simulated lab: frames relayed edge → registry → browser, the view ends
//! when the lease does; and the HTTP answers of
//! `GET /api/v1/capabilities/{id}/live` for a non-holder (403) and for no
//! stream (409).
//!
//! Needs node, /usr/bin/chromium and tests/browser/node_modules
//! (scripts/setup.sh); with CI=true a missing one fails the test.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT};
use benchlink_e2e::browser::{self, run_spec};
use benchlink_e2e::client::Agent;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// `GET path` with `token`: status, content type, and the first bytes of
/// the body (a live answer does not end by itself).
async fn peek(base: &str, path: &str, token: &str) -> Result<(StatusCode, String, Vec<u8>)> {
    let resp = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await?;
    let status = resp.status();
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let mut body = Vec::new();
    let mut resp = resp;
    let deadline = Instant::now() + Duration::from_secs(5);
    while body.len() < 4096 && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(5), resp.chunk()).await {
            Ok(Ok(Some(c))) => body.extend_from_slice(&c),
            _ => break,
        }
    }
    Ok((status, ct, body))
}

/// Read the live answer for `span`: for each part, how far behind the
/// capture it arrived (ms, `X-Captured-At` to now; edge and registry
/// share this machine's clock).
async fn lags(base: &str, path: &str, token: &str, span: Duration) -> Result<Vec<i64>> {
    let mut resp = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await?;
    let mut text = String::new();
    let mut out = Vec::new();
    let end = tokio::time::Instant::now() + span;
    while let Ok(Ok(Some(c))) = tokio::time::timeout_at(end, resp.chunk()).await {
        let now = chrono::Utc::now();
        text.push_str(&String::from_utf8_lossy(&c));
        while let Some(i) = text.find("X-Captured-At: ") {
            let rest = &text[i + 15..];
            let Some(e) = rest.find('\r') else { break };
            let at = chrono::DateTime::parse_from_rfc3339(&rest[..e])?;
            out.push((now - at.with_timezone(&chrono::Utc)).num_milliseconds());
            text = rest[e..].to_string();
        }
    }
    Ok(out)
}

fn code(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_watches_a_running_stream_live_until_the_lease_ends() -> Result<()> {
    if !browser::ready() {
        return Ok(());
    }
    let lab = Lab::start(LabOptions::default()).await?;
    let base = lab.base_url.clone();
    let hw = Agent::new(&base, HW_AGENT, &lab.hw_token);
    let live_path = format!("/api/v1/capabilities/{}/live", caps::CAMERA);

    let cam = hw.lease_ok(caps::CAMERA, "live view").await?;
    let (status, _, body) = peek(&base, &live_path, &lab.hw_token).await?;
    assert_eq!(status, StatusCode::CONFLICT, "before start_stream");
    assert_eq!(code(&body), "no_live_stream");

    hw.act_ok(&cam, "start_stream", json!({"fps": 10})).await?;

    // A non-holder is refused, whatever runs.
    let (status, _, body) = peek(&base, &live_path, &lab.chief_token).await?;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(code(&body), "not_lease_holder");

    // The holder gets MJPEG parts (the first frame may take a moment).
    let t0 = Instant::now();
    let (status, ct, body) = loop {
        let got = peek(&base, &live_path, &lab.hw_token).await?;
        if got.0 == StatusCode::OK || t0.elapsed() > Duration::from_secs(10) {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if status != StatusCode::OK {
        bail!(
            "no live stream: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }
    assert!(
        ct.starts_with("multipart/x-mixed-replace; boundary="),
        "{ct}"
    );
    assert!(
        body.windows(2).any(|w| w == [0xFF, 0xD8]),
        "no JPEG in the first part"
    );

    let lag = lags(&base, &live_path, &lab.hw_token, Duration::from_secs(3)).await?;
    println!("live frames in 3 s: {}, lag ms: {lag:?}", lag.len());
    assert!(lag.len() >= 6, "too few frames in 3 s: {lag:?}");
    assert!(
        lag.iter().all(|l| *l < 1000),
        "a frame arrived 1 s or more after its capture: {lag:?}"
    );

    run_spec(
        "live.spec.mjs",
        &[
            ("BENCHLINK_URL", base.clone()),
            ("LIVE_TOKEN", lab.hw_token.clone()),
            ("LIVE_LEASE", cam.clone()),
            ("LIVE_CAPABILITY", caps::CAMERA.to_string()),
        ],
    );

    // The lease is gone: the former holder is refused too.
    let (status, _, _) = peek(&base, &live_path, &lab.hw_token).await?;
    assert_eq!(status, StatusCode::FORBIDDEN);
    Ok(())
}
