//! The uploader against a registry stand-in on a real TCP port: bytes the
//! registry already holds whole are not sent again, and a 503 answered
//! after a whole body makes the uploader back off.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edge_agent::config::{Durability, OutboxConfig};
use edge_agent::drivers::NewArtifact;
use edge_agent::outbox::{Outbox, UploadState};
use edge_agent::uploader::Uploader;
use serde_json::Map;
use shared_protocol::artifact::{ArtifactType, CapabilityArtifact};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

fn config(dir: &Path) -> OutboxConfig {
    OutboxConfig {
        dir: dir.join("outbox"),
        db: dir.join("outbox.sqlite3"),
        disk_budget_bytes: 64 * 1024 * 1024,
        durability: Durability::Os,
    }
}

/// An outbox under `dir` holding one image artifact of `bytes`, and its
/// record.
fn outbox_holding(dir: &Path, bytes: Vec<u8>) -> (Outbox, CapabilityArtifact) {
    let (outbox, _) = Outbox::open(&config(dir), "bench-1").unwrap();
    let meta = outbox
        .ingest(
            "sess-1",
            NewArtifact {
                artifact_type: ArtifactType::Image,
                content_type: "image/jpeg".into(),
                bytes,
                duration_ms: None,
                metadata: Map::new(),
            },
        )
        .unwrap();
    (outbox, meta)
}

/// An uploader of `outbox` to the stand-in on `port`.
fn uploader(outbox: &Outbox, port: u16) -> Uploader {
    Uploader::new(
        outbox.clone(),
        &format!("http://127.0.0.1:{port}"),
        "token",
        Arc::new(Notify::new()),
        None,
    )
    .unwrap()
}

/// Write a JSON answer with `status` (e.g. `200 OK`) and `body`, then
/// close.
async fn answer(s: &mut tokio::net::TcpStream, status: &str, body: &str) {
    let resp = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(resp.as_bytes()).await;
}

/// Answers `upload-status` with `complete: true` for `sha256`, and
/// anything else (a PUT) with 500; returns the port and the request lines.
async fn registry_holding(sha256: String) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let log = log.clone();
            let sha256 = sha256.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let line = head.lines().next().unwrap_or_default().to_string();
                log.lock().unwrap().push(line.clone());
                let (status, body) = if line.starts_with("GET ") && line.contains("/upload-status")
                {
                    (
                        "200 OK",
                        format!(
                            r#"{{"artifact_id":"a","checksum":"{sha256}","complete":true,"received_bytes":5,"metadata_received":true}}"#
                        ),
                    )
                } else {
                    (
                        "500 Internal Server Error",
                        r#"{"error":{"code":"x","message":"no","details":{}}}"#.to_string(),
                    )
                };
                answer(&mut s, status, &body).await;
            });
        }
    });
    (port, seen)
}

#[tokio::test]
async fn an_artifact_sent_before_that_the_registry_holds_whole_is_not_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let (outbox, meta) = outbox_holding(dir.path(), b"hello".to_vec());
    // An earlier attempt reached the registry, but its answer was lost.
    outbox
        .record_upload_failure(&meta.artifact_id, "connection reset", Duration::ZERO)
        .unwrap();
    let (port, seen) = registry_holding(meta.checksum.clone()).await;
    let up = uploader(&outbox, port);
    let report = up.drain_once().await;
    assert_eq!(report.uploaded, 1, "{report:?}");
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|l| !l.starts_with("PUT ")),
        "bytes sent again: {seen:?}"
    );
    assert!(
        seen.iter().any(|l| l.contains("/upload-status")),
        "{seen:?}"
    );
    let rec = outbox.artifact(&meta.artifact_id).unwrap().unwrap();
    assert_eq!(rec.state, UploadState::Uploaded);
}

/// Reads each request whole (head and a `content-length` body), then
/// answers 503 `blob_store_unavailable`, as a registry whose S3 bucket is
/// down does; returns the port and the request lines.
async fn registry_whose_store_is_down() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let log = log.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = vec![0u8; 64 * 1024];
                let head_end = loop {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                    if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&got[..head_end]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while got.len() < head_end + length {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                let line = head.lines().next().unwrap_or_default().to_uppercase();
                log.lock().unwrap().push(line);
                let body = r#"{"error":{"code":"blob_store_unavailable","message":"the artifact store cannot be reached; try again later","details":{}}}"#;
                answer(&mut s, "503 Service Unavailable", body).await;
            });
        }
    });
    (port, seen)
}

#[tokio::test]
async fn a_503_after_the_whole_body_backs_off_instead_of_resuming_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (outbox, meta) = outbox_holding(dir.path(), vec![7u8; 4096]);
    let (port, seen) = registry_whose_store_is_down().await;
    let up = uploader(&outbox, port);
    let report = up.drain_once().await;
    let seen = seen.lock().unwrap().clone();
    assert!(seen.iter().any(|l| l.starts_with("PUT ")), "{seen:?}");
    assert!(report.registry_unavailable, "{report:?}");
    // The body went out whole, but the registry kept nothing: no quick
    // resume, the lane backs off (1 s doubling to 60 s).
    assert!(!report.progressed, "{report:?}");
    let rec = outbox.artifact(&meta.artifact_id).unwrap().unwrap();
    assert_ne!(
        rec.state,
        UploadState::Uploaded,
        "nothing lost, nothing confirmed"
    );
}
