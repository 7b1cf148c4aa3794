//! Evidence over a bad link, across real processes: the edge's HTTP
//! requests go through a loopback proxy of this test that cuts every
//! connection after [`CUT_AFTER_BYTES`] bytes from the edge or
//! [`CUT_AFTER`], whichever comes first. A large clip must still arrive
//! whole (the registry's sha256 matches) without starting over from byte 0
//! (the bytes sent in all stay well under twice its size), and a snapshot
//! taken after the clip must not wait for it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT};
use benchlink_e2e::client::{sha256_hex, Agent};
use benchlink_testkit::status_is;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Bytes from the edge after which the proxy cuts a connection (256 KiB:
/// a 20 s simulated clip is 1.3 MB and more even on a loaded machine).
const CUT_AFTER_BYTES: u64 = 256 * 1024;
/// Age after which the proxy cuts a connection.
const CUT_AFTER: Duration = Duration::from_millis(2500);

/// What the proxy saw.
#[derive(Default)]
struct ProxyStats {
    /// Bytes from the edge towards the registry, all connections.
    upstream_bytes: AtomicU64,
    /// Connections the proxy cut.
    cuts: AtomicU64,
}

/// A TCP proxy on 127.0.0.1 forwarding to the port set in `target` (once
/// known; connections before that are closed at once).
async fn start_proxy(target: Arc<OnceLock<u16>>, stats: Arc<ProxyStats>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let Some(&to) = target.get() else { continue };
            let stats = stats.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(("127.0.0.1", to)).await else {
                    return;
                };
                relay(client, server, &stats).await;
            });
        }
    });
    port
}

/// Copy both ways until either side closes, `CUT_AFTER_BYTES` came from
/// the client, or the connection is `CUT_AFTER` old; then drop both.
async fn relay(client: TcpStream, server: TcpStream, stats: &ProxyStats) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async {
        let mut sent = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => n,
            };
            let room = (CUT_AFTER_BYTES - sent) as usize;
            let pass = n.min(room);
            if sw.write_all(&buf[..pass]).await.is_err() {
                return false;
            }
            sent += pass as u64;
            stats
                .upstream_bytes
                .fetch_add(pass as u64, Ordering::Relaxed);
            if sent >= CUT_AFTER_BYTES {
                return true;
            }
        }
    };
    let down = async {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
        false
    };
    let cut = tokio::select! {
        c = up => c,
        c = down => c,
        _ = tokio::time::sleep(CUT_AFTER) => true,
    };
    if cut {
        stats.cuts.fetch_add(1, Ordering::Relaxed);
    }
}

/// The session's single artifact (its metadata at the registry).
async fn only_artifact(agent: &Agent, session: &Value) -> Value {
    let refs = session["artifact_refs"].as_array().expect("artifact_refs");
    assert_eq!(refs.len(), 1, "{session}");
    let id = refs[0].as_str().unwrap();
    agent
        .get_ok(&format!("/api/v1/artifacts/{id}"))
        .await
        .expect("artifact metadata")
}

async fn uploaded(agent: &Agent, artifact_id: &str) -> bool {
    match agent.get(&format!("/api/v1/artifacts/{artifact_id}")).await {
        Ok((StatusCode::OK, v)) => v["uploaded"] == true,
        _ => false,
    }
}

#[tokio::test]
async fn a_large_clip_completes_over_a_link_cut_every_256_kib_and_a_later_snapshot_passes_it() {
    let target = Arc::new(OnceLock::new());
    let stats = Arc::new(ProxyStats::default());
    let proxy_port = start_proxy(target.clone(), stats.clone()).await;
    let lab = Lab::start(LabOptions {
        edge_http_port: Some(proxy_port),
        ..Default::default()
    })
    .await
    .expect("lab starts");
    target.set(lab.http_port).unwrap();
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let lease_id = hw
        .lease_ok(caps::CAMERA, "clip over a bad link")
        .await
        .unwrap();

    let (_, clip) = status_is(
        hw.act(
            &lease_id,
            "record_clip",
            json!({"duration_ms": 20_000, "fps": 15}),
            60_000,
        )
        .await
        .unwrap(),
        StatusCode::OK,
    );
    assert_eq!(clip["status"], "completed", "{clip}");
    let clip = only_artifact(&hw, &clip).await;
    let clip_id = clip["artifact_id"].as_str().unwrap().to_string();
    let clip_size = clip["size_bytes"].as_u64().unwrap();
    assert!(
        clip_size >= 4 * CUT_AFTER_BYTES,
        "the clip ({clip_size} bytes) must need several connections"
    );

    let snap = hw
        .act_ok(&lease_id, "snapshot", json!({}))
        .await
        .expect("snapshot");
    let snap = only_artifact(&hw, &snap).await;
    let snap_id = snap["artifact_id"].as_str().unwrap().to_string();

    // Watch both: the snapshot must be stored while the clip is not yet.
    let started = Instant::now();
    let (mut snap_at, mut clip_at) = (None, None);
    while (snap_at.is_none() || clip_at.is_none()) && started.elapsed() < Duration::from_secs(120) {
        if snap_at.is_none() && uploaded(&hw, &snap_id).await {
            snap_at = Some(started.elapsed());
        }
        if clip_at.is_none() && uploaded(&hw, &clip_id).await {
            clip_at = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (Some(snap_at), Some(clip_at)) = (snap_at, clip_at) else {
        panic!(
            "not uploaded within 120 s: snapshot {snap_at:?}, clip {clip_at:?}; edge log: {}",
            lab.root.join("logs/edge.log").display()
        );
    };
    let upstream = stats.upstream_bytes.load(Ordering::Relaxed);
    let cuts = stats.cuts.load(Ordering::Relaxed);
    println!(
        "clip {clip_size} bytes uploaded after {clip_at:?} over {cuts} cut connections; \
         snapshot uploaded after {snap_at:?}; bytes sent through the proxy: {upstream} \
         ({:.2}x the clip)",
        upstream as f64 / clip_size as f64
    );
    assert!(
        snap_at < clip_at,
        "the snapshot ({snap_at:?}) waited for the clip ({clip_at:?})"
    );
    assert!(cuts >= 3, "the link was cut only {cuts} times");
    assert!(
        upstream < clip_size * 3 / 2,
        "{upstream} bytes sent for a {clip_size}-byte clip: uploads restarted from zero"
    );

    let got = hw.download(&clip_id).await.expect("clip downloads");
    assert_eq!(got.bytes.len() as u64, clip_size);
    assert_eq!(sha256_hex(&got.bytes), clip["checksum"].as_str().unwrap());
    assert_eq!(got.checksum_header, clip["checksum"].as_str().unwrap());

    let log = std::fs::read_to_string(lab.root.join("logs/edge.log")).unwrap_or_default();
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("upload attempt failed") && l.contains(&clip_id))
        .collect();
    assert!(
        !failed.is_empty() && failed.iter().all(|l| l.contains("bytes_sent")),
        "each failed attempt is logged with the artifact id and the bytes sent"
    );
}
