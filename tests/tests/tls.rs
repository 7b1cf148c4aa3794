//! HTTPS and MQTT over TLS (docs/install-registry.md "TLS",
//! docs/install-edge-agent.md "TLS"), across the real processes: a CA and
//! a server certificate for 127.0.0.1 / localhost are made with rcgen for
//! each test; the registry serves HTTPS (and its embedded broker MQTT over
//! TLS, or it connects to a private Mosquitto's TLS listener), the edge on
//! the simulated bench trusts the CA, and a lease → snapshot → upload →
//! download round trip goes over TLS end to end.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use benchlink_e2e::bench::{caps, Broker, Lab, LabOptions, Mosquitto, PROVIDER_ID};
use benchlink_e2e::client::{sha256_hex, Agent};
use benchlink_e2e::pki::Pki;
use benchlink_e2e::workspace_bin;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, TlsConfiguration, Transport};
use serde_json::{json, Value};

static ONE_LAB_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A new CA and a lab on the embedded broker with HTTPS and MQTT over
/// TLS under it (the edge registered over MQTT over TLS).
async fn tls_lab() -> (Pki, Lab) {
    let pki = Pki::new("lab").expect("test PKI");
    let lab = Lab::start(LabOptions {
        tls: Some(pki.lab_tls()),
        ..Default::default()
    })
    .await
    .expect("lab with TLS starts (the edge registered over MQTT over TLS)");
    (pki, lab)
}

/// An admin client of the lab trusting `ca_file` only.
fn admin(lab: &Lab, ca_file: &Path) -> Agent {
    Agent::with_ca_file(
        &lab.base_url,
        "bootstrap-admin",
        &lab.admin_token,
        Some(ca_file),
    )
    .expect("admin client")
}

/// Lease the camera, take a snapshot, wait for the upload and download it:
/// the downloaded bytes hash to the sha256 the edge computed.
async fn snapshot_round_trip(admin: &Agent) {
    let lease = admin
        .lease_ok(caps::CAMERA, "snapshot over TLS")
        .await
        .expect("camera lease");
    let session = admin
        .act_ok(&lease, "snapshot", json!({}))
        .await
        .expect("snapshot");
    assert_eq!(session["status"], "completed", "{session}");
    let artifacts = admin
        .wait_artifacts_uploaded(std::slice::from_ref(&lease), Duration::from_secs(30))
        .await
        .expect("the snapshot is uploaded over HTTPS");
    let image = artifacts
        .iter()
        .find(|a| a["artifact_type"] == "image")
        .unwrap_or_else(|| panic!("no image among {artifacts:?}"));
    let id = image["artifact_id"].as_str().expect("artifact_id");
    let download = admin.download(id).await.expect("download over HTTPS");
    assert!(!download.bytes.is_empty());
    let sha = sha256_hex(&download.bytes);
    assert_eq!(image["checksum"], sha.as_str(), "{image}");
    assert_eq!(download.checksum_header, sha);
    admin.release(&lease).await.expect("release");
}

/// What a plain-text HTTP request to `port` gets back within 3 s (the
/// bytes, possibly none).
fn plain_http_answer(port: u16) -> Vec<u8> {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let _ = tcp.read_to_end(&mut got);
    got
}

/// Whether a provider's MQTT CONNECT to `port` (plain, or over TLS
/// trusting `ca_file`) gets a CONNACK within 5 s; the return code when so.
async fn connack(
    port: u16,
    token: &str,
    ca_file: Option<&Path>,
) -> Option<rumqttc::ConnectReturnCode> {
    let mut opts = MqttOptions::new(PROVIDER_ID, "127.0.0.1", port);
    opts.set_credentials(PROVIDER_ID, token);
    opts.set_keep_alive(Duration::from_secs(5));
    if let Some(ca) = ca_file {
        opts.set_transport(Transport::tls_with_config(TlsConfiguration::Simple {
            ca: std::fs::read(ca).unwrap(),
            alpn: None,
            client_auth: None,
        }));
    }
    let (client, mut events) = AsyncClient::new(opts, 8);
    let got = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(a))) => return Some(a.code),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    })
    .await
    .unwrap_or(None);
    let _ = client.disconnect().await;
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_trusting_the_ca_carries_a_round_trip_over_https_and_mqtt_tls() {
    let _one = ONE_LAB_AT_A_TIME.lock().await;
    let (pki, lab) = tls_lab().await;
    assert!(lab.base_url.starts_with("https://"), "{}", lab.base_url);
    let admin = admin(&lab, &pki.path("ca.pem"));
    let health = admin.get_ok("/healthz").await.expect("healthz over HTTPS");
    assert_eq!(health["http"]["scheme"], "https", "{health}");
    assert_eq!(health["mqtt"]["tls"], true, "{health}");
    assert_eq!(health["mqtt"]["connected"], true, "{health}");
    snapshot_round_trip(&admin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_clients_and_clients_not_trusting_the_ca_get_no_answer() {
    let _one = ONE_LAB_AT_A_TIME.lock().await;
    let (pki, lab) = tls_lab().await;

    // Plain HTTP on the HTTPS port: no HTTP answer.
    let got = plain_http_answer(lab.http_port);
    assert!(
        !got.starts_with(b"HTTP/"),
        "a plain HTTP request got an HTTP answer: {:?}",
        String::from_utf8_lossy(&got)
    );

    // Plain MQTT on the TLS port: no CONNACK. Over TLS with the same
    // login: accepted.
    assert_eq!(
        connack(lab.mqtt_port, &lab.provider_token, None).await,
        None
    );
    assert_eq!(
        connack(
            lab.mqtt_port,
            &lab.provider_token,
            Some(&pki.path("ca.pem"))
        )
        .await,
        Some(rumqttc::ConnectReturnCode::Success)
    );

    // A client trusting another CA fails the handshake, on both ports.
    let other = Pki::new("other").expect("test PKI");
    let stranger = Agent::with_ca_file(
        &lab.base_url,
        "bootstrap-admin",
        &lab.admin_token,
        Some(&other.path("ca.pem")),
    )
    .expect("client");
    let err = stranger
        .get("/healthz")
        .await
        .expect_err("a client that does not trust the CA gets no answer");
    assert!(
        format!("{err:#}").to_lowercase().contains("certificate"),
        "{err:#}"
    );
    assert_eq!(
        connack(
            lab.mqtt_port,
            &lab.provider_token,
            Some(&other.path("ca.pem"))
        )
        .await,
        None
    );
    // The lab's own edge, trusting the CA, is still connected.
    let admin = admin(&lab, &pki.path("ca.pem"));
    let provider: Value = admin
        .get_ok(&format!("/api/v1/capability-providers/{PROVIDER_ID}"))
        .await
        .expect("provider");
    assert_eq!(provider["online_status"], "online", "{provider}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_and_edge_meet_on_an_external_broker_over_tls() {
    if Mosquitto::binary().is_none() {
        benchlink_testkit::skip_unless_ci("mosquitto is not installed");
        return;
    }
    let _one = ONE_LAB_AT_A_TIME.lock().await;
    let pki = Pki::new("broker").expect("test PKI");
    let dir = benchlink_testkit::temp_dir();
    let broker = Mosquitto::start_with(
        dir.path(),
        &format!(
            "certfile {}\nkeyfile {}\n",
            pki.path("server.pem").display(),
            pki.path("server.key").display()
        ),
    )
    .expect("mosquitto with a TLS listener starts");
    let lab = Lab::start(LabOptions {
        broker: Broker::External {
            host: "127.0.0.1".into(),
            port: broker.port,
        },
        topic_prefix: benchlink_e2e::bench::unique_topic_prefix(),
        tls: Some(pki.lab_tls()),
        ..Default::default()
    })
    .await
    .expect("lab on Mosquitto over TLS starts");
    let admin = admin(&lab, &pki.path("ca.pem"));
    let health = admin.get_ok("/healthz").await.expect("healthz");
    assert_eq!(health["mqtt"]["mode"], "external", "{health}");
    assert_eq!(health["mqtt"]["tls"], true, "{health}");
    assert_eq!(health["mqtt"]["connected"], true, "{health}");
    // The broker's listener is TLS only: a plain CONNECT gets nothing.
    assert_eq!(connack(broker.port, "anything", None).await, None);
    snapshot_round_trip(&admin).await;
}

/// `check-config` of `bin` on `toml` (written to `dir`): exit code and
/// stderr.
fn check_config(bin: &str, dir: &Path, toml: &str) -> (Option<i32>, String) {
    let path = dir.join(format!("{bin}.toml"));
    std::fs::write(&path, toml).unwrap();
    let out = Command::new(workspace_bin(bin))
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .expect("run check-config");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_refuses_unusable_tls_files_naming_the_key() {
    let pki = Pki::new("config").expect("test PKI");
    let dir = benchlink_testkit::temp_dir();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let cert = pki.path("server.pem");
    let key = pki.path("server.key");
    let store = dir.path().join("r.sqlite3");
    let registry = |http: String, mqtt: String| {
        format!(
            "[store]\npath = \"{}\"\n[http]\n{http}\n[mqtt]\n{mqtt}\n",
            store.display()
        )
    };
    let ok = registry(
        format!(
            "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
            cert.display(),
            key.display()
        ),
        format!(
            "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
            cert.display(),
            key.display()
        ),
    );
    let (code, err) = check_config("cloud-registry", dir.path(), &ok);
    assert_eq!(code, Some(0), "{err}");
    let (old_cert, old_key) = pki
        .odd_certificate("expired", true)
        .expect("expired certificate");
    let (code, err) = check_config(
        "cloud-registry",
        dir.path(),
        &registry(
            format!(
                "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
                old_cert.display(),
                old_key.display()
            ),
            String::new(),
        ),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("http.tls_cert_file") && err.contains("expired on"),
        "an expired certificate: {err}"
    );
    for (toml, key_named) in [
        (
            registry(
                format!("tls_cert_file = \"{}\"", cert.display()),
                String::new(),
            ),
            "http.tls_key_file",
        ),
        (
            registry(
                format!(
                    "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
                    garbage.display(),
                    key.display()
                ),
                String::new(),
            ),
            "http.tls_cert_file",
        ),
        (
            registry(
                String::new(),
                format!(
                    "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
                    cert.display(),
                    dir.path().join("missing.key").display()
                ),
            ),
            "mqtt.tls_key_file",
        ),
        (
            registry(
                String::new(),
                format!(
                    "mode = \"external\"\ntls = true\nca_file = \"{}\"",
                    garbage.display()
                ),
            ),
            "mqtt.ca_file",
        ),
    ] {
        let (code, err) = check_config("cloud-registry", dir.path(), &toml);
        assert_eq!(code, Some(2), "{toml}\n{err}");
        assert!(err.contains(key_named), "{key_named} not named: {err}");
    }

    let edge = |registry_keys: &str| {
        format!(
            "state_dir = \"{}\"\n[provider]\nprovider_id = \"bench-tls\"\nnode_id = \"n1\"\n\
             [registry]\nmqtt_host = \"127.0.0.1\"\nbase_url = \"https://127.0.0.1:8443\"\n\
             token = \"blk_x\"\n{registry_keys}\n",
            dir.path().join("edge").display()
        )
    };
    let (code, err) = check_config(
        "edge-agent",
        dir.path(),
        &edge(&format!(
            "mqtt_tls = true\nca_file = \"{}\"",
            pki.path("ca.pem").display()
        )),
    );
    assert_eq!(code, Some(0), "{err}");
    let (leaf, _) = pki
        .odd_certificate("leaf", false)
        .expect("leaf certificate");
    for bad in [garbage, dir.path().join("missing.pem"), leaf] {
        let (code, err) = check_config(
            "edge-agent",
            dir.path(),
            &edge(&format!("mqtt_tls = true\nca_file = \"{}\"", bad.display())),
        );
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains("registry.ca_file"), "{err}");
    }
}
