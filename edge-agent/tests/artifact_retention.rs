//! The edge keeps an artifact's file until the registry has both its bytes
//! (HTTP PUT confirmed) and its metadata (the session update carrying it
//! acknowledged by the broker): the daemon in-process, a real HTTP server
//! standing in for the registry's content endpoint, and the real Mosquitto
//! at 127.0.0.1:1883 for the second half.
//!
//! Without a reachable Mosquitto the broker half is skipped with a printed
//! reason, except under `CI=true`, where it fails.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use benchlink_testkit::{free_port, mosquitto, sha256_hex};
use edge_agent::config::EdgeConfig;
use edge_agent::daemon::Daemon;
use edge_agent::link::envelope;
use edge_agent::outbox::{Outbox, UploadState};
use serde_json::json;

use shared_protocol::mqtt::MessageType;

/// Artifact ids the fake content endpoint stored, with the sha256 of the
/// bytes it received.
type Stored = Arc<Mutex<Vec<(String, String)>>>;

/// `PUT /api/v1/artifacts/{id}/content`: hashes the body and answers `201`
/// with the checksum, as the registry does. It never sees the metadata
/// (MQTT): the first PUT of an id is answered like bytes the registry holds
/// unbound (`"metadata_received": false`), later ones like bound bytes. One
/// request per connection.
fn content_endpoint() -> (u16, Stored) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let stored: Stored = Arc::default();
    let keep = stored.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let stored = keep.clone();
            std::thread::spawn(move || serve(stream, &stored));
        }
    });
    (port, stored)
}

fn serve(mut stream: TcpStream, stored: &Stored) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("");
    let id = path
        .strip_prefix("/api/v1/artifacts/")
        .and_then(|p| p.strip_suffix("/content"))
        .unwrap_or("")
        .to_string();
    let sum = sha256_hex(&body);
    let first = {
        let mut stored = stored.lock().unwrap();
        let first = !stored.iter().any(|(i, _)| *i == id);
        stored.push((id.clone(), sum.clone()));
        first
    };
    let reply = if first {
        json!({"artifact_id": id, "checksum": sum, "uploaded": true, "metadata_received": false})
    } else {
        json!({"artifact_id": id, "checksum": sum, "uploaded": true})
    }
    .to_string();
    let _ = write!(
        stream,
        "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
        reply.len()
    );
}

fn write_config(dir: &Path, provider_id: &str, mqtt_port: u16, http_port: u16) -> PathBuf {
    let text = format!(
        r#"state_dir = "{state}"

[provider]
provider_id = "{provider_id}"
node_id = "test-node"

[registry]
mqtt_host = "127.0.0.1"
mqtt_port = {mqtt_port}
topic_prefix = "benchlink-test/{provider_id}"
base_url = "http://127.0.0.1:{http_port}"
token = "test-token"
mqtt_keep_alive_seconds = 5

[[capabilities]]
id = "cam-test-01"
type = "camera"
[capabilities.driver]
backend = "sim"
resolution = "320x240"
"#,
        state = dir.join("state").display(),
    );
    let path = dir.join("edge-agent.toml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

/// Poll `check` every 100 ms until it is true or `timeout` passed.
async fn wait_for(timeout: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < until, "{what} within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uploaded_file_stays_until_the_update_with_its_metadata_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let provider_id = format!("prov-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let (http_port, stored) = content_endpoint();

    // The registry's HTTP side answers; the broker is unreachable, so the
    // session update carrying the artifact's metadata stays queued.
    let config = write_config(dir.path(), &provider_id, free_port(), http_port);
    let daemon = Daemon::start(EdgeConfig::load(&config).unwrap())
        .await
        .expect("daemon starts without a broker");
    assert!(daemon.submit(envelope(
        MessageType::ActionInvoke,
        &json!({
            "session_id": "sess-keep-1",
            "lease_id": "lease-test",
            "capability_id": "cam-test-01",
            "action": "snapshot",
            "params": {},
            "timeout_ms": 10000,
            "lease_generation": 1,
            "lease_mode": "exclusive",
            "not_after": (chrono::Utc::now() + chrono::Duration::minutes(10)).to_rfc3339(),
        }),
    )));
    let outbox = daemon.outbox().clone();
    let o = outbox.clone();
    // The artifact's id and sha256 as its (queued) metadata names them.
    let (artifact_id, checksum) = {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let o = o.clone();
            let queued = blocking(move || o.queued_updates(10).unwrap()).await;
            let completed = queued.iter().find_map(|q| {
                let env = shared_protocol::mqtt::Envelope::parse(&q.payload).ok()?;
                if env.body["status"] != "completed" {
                    return None;
                }
                let a = &env.body["artifacts"][0];
                Some((
                    a["artifact_id"].as_str()?.to_string(),
                    a["checksum"].as_str()?.to_string(),
                ))
            });
            if let Some(found) = completed {
                break found;
            }
            assert!(Instant::now() < until, "no completed update queued");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let path = outbox.file_path(&artifact_id);

    // The registry confirmed the bytes...
    wait_for(Duration::from_secs(20), "the upload", || {
        stored
            .lock()
            .unwrap()
            .iter()
            .any(|(id, sum)| *id == artifact_id && *sum == checksum)
    })
    .await;
    let state = |o: &Outbox, id: &str| o.artifact(id).unwrap().unwrap();
    wait_for(Duration::from_secs(10), "the row marked uploaded", || {
        state(&outbox, &artifact_id).state == UploadState::Uploaded
    })
    .await;
    // ...but its metadata has not reached the registry: the file stays.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        path.exists(),
        "the file must outlive an upload whose metadata is still queued"
    );
    assert!(!state(&outbox, &artifact_id).metadata_acked);
    daemon.shutdown().await;
    drop(outbox);

    // Restart with the same state against the broker: the queued update
    // is acknowledged and the file goes.
    if !mosquitto() {
        return;
    }
    let config = write_config(dir.path(), &provider_id, 1883, http_port);
    let cfg = EdgeConfig::load(&config).unwrap();
    {
        let cfg = cfg.clone();
        let id = provider_id.clone();
        let (o, _) = blocking(move || Outbox::open(&cfg.outbox, &id).unwrap()).await;
        assert!(path.exists(), "a start keeps the unacknowledged file");
        drop(o);
    }
    let daemon = Daemon::start(cfg).await.expect("daemon starts");
    let outbox = daemon.outbox().clone();
    wait_for(
        Duration::from_secs(20),
        "the file removed after the acknowledgment",
        || !path.exists(),
    )
    .await;
    let o = outbox.clone();
    let stats = blocking(move || o.stats().unwrap()).await;
    assert_eq!(stats.queued_updates, 0, "{stats:?}");
    let rec = state(&outbox, &artifact_id);
    assert_eq!(rec.state, UploadState::Uploaded);
    assert!(rec.metadata_acked);
    // The registry had held the first copy unbound: the file went only
    // after a second upload, made once the metadata was acknowledged.
    let puts = stored
        .lock()
        .unwrap()
        .iter()
        .filter(|(id, sum)| *id == artifact_id && *sum == checksum)
        .count();
    assert_eq!(puts, 2);
    daemon.shutdown().await;
    clear_retained_status(&provider_id).await;
}

/// Remove the retained status the daemon left on the shared broker.
async fn clear_retained_status(provider_id: &str) {
    let opts = rumqttc::MqttOptions::new(format!("clean-{provider_id}"), "127.0.0.1", 1883);
    let (client, mut eventloop) = rumqttc::AsyncClient::new(opts, 8);
    let topic = format!("benchlink-test/{provider_id}/providers/{provider_id}/status");
    client
        .publish(topic, rumqttc::QoS::AtLeastOnce, true, Vec::<u8>::new())
        .await
        .unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            match eventloop.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
}
