//! Helpers shared by the registry's integration tests: an in-process
//! registry on free ports with its SQLite file in a temporary directory, a
//! small JSON HTTP client, MQTT test providers, and the seed 001 §4 example
//! registration.

#![allow(dead_code)]

use std::time::Duration;

use cloud_registry::app::{Registry, RunningRegistry};
use cloud_registry::config::Config;
use reqwest::StatusCode;
use rumqttc::{AsyncClient, Event, LastWill, MqttOptions, Packet, QoS};
use serde_json::{json, Value};
use shared_protocol::api::Role;
use shared_protocol::mqtt::{topic, Envelope, MessageType, TopicKind};
use tempfile::TempDir;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Whether this run stores in PostgreSQL (`BENCHLINK_TEST_STORE=postgres`,
/// the second pass of `scripts/test.sh`) rather than SQLite.
pub fn on_postgres() -> bool {
    std::env::var("BENCHLINK_TEST_STORE").as_deref() == Ok("postgres")
}

/// The PostgreSQL server of the PostgreSQL pass:
/// `BENCHLINK_TEST_POSTGRES_URL`, by default the lab's 127.0.0.1:5432,
/// database `test`.
pub fn postgres_url() -> String {
    std::env::var("BENCHLINK_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A schema of its own for the store of the test that owns `dir`
/// (`bl_test_` and the directory's name).
pub fn postgres_schema(dir: &TempDir) -> String {
    let name = dir.path().file_name().unwrap().to_string_lossy();
    let tail: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    format!("bl_test_{}_{tail}", std::process::id())
}

/// A connection of its own to the store of the [`test_config`] of `dir`
/// (what a CLI command beside the registry opens). Blocking.
pub fn store_connection(dir: &TempDir) -> cloud_registry::sql::Connection {
    let store = test_config(dir).store;
    match store.url {
        Some(url) => cloud_registry::sql::Connection::postgres(
            cloud_registry::sql::pg::PgConn::connect(&url, &store.schema).expect("connect"),
        ),
        None => cloud_registry::sql::Connection::open(&store.path).expect("open the store"),
    }
}

/// The `[store]` table of the [`test_config`] of `dir`, as TOML (for a
/// config file a CLI command reads).
pub fn store_toml(dir: &TempDir) -> String {
    let store = test_config(dir).store;
    let mut t = format!("[store]\npath = {:?}\n", store.path.display().to_string());
    if let Some(url) = &store.url {
        t.push_str(&format!(
            "backend = \"postgres\"\nurl = {url:?}\nschema = {:?}\n",
            store.schema
        ));
    }
    t
}

/// Drops the append-only triggers of `tables` on the store of `dir` (what
/// someone with the file, or the database's owner, can do).
pub fn drop_append_only(conn: &cloud_registry::sql::Connection, tables: &[&str]) {
    for t in tables {
        let sql = match conn.backend() {
            cloud_registry::sql::Backend::Sqlite => {
                format!(
                    "DROP TRIGGER IF EXISTS {t}_no_update; DROP TRIGGER IF EXISTS {t}_no_delete;"
                )
            }
            cloud_registry::sql::Backend::Postgres => {
                format!("DROP TRIGGER IF EXISTS {t}_append_only ON {t};")
            }
        };
        conn.execute_batch(&sql).unwrap();
    }
}

/// A config on free ports, storing under `dir` (on the PostgreSQL pass,
/// in a schema of its own), with an admin token file.
pub fn test_config(dir: &TempDir) -> Config {
    let mut cfg = Config::default();
    cfg.http.listen = "127.0.0.1:0".parse().unwrap();
    cfg.mqtt.listen = "127.0.0.1:0".parse().unwrap();
    cfg.store.path = dir.path().join("registry.sqlite3");
    if on_postgres() {
        cfg.store.backend = cloud_registry::config::StoreBackend::Postgres;
        cfg.store.url = Some(postgres_url());
        cfg.store.schema = postgres_schema(dir);
    }
    cfg.auth.bootstrap_admin_token_file = Some(dir.path().join("admin.token"));
    cfg
}

/// Start an in-process registry with `cfg`.
pub async fn start(cfg: Config) -> RunningRegistry {
    Registry::start(cfg).await.expect("registry starts")
}

/// A registry on [`test_config`] changed by `tune`: its directory (hold it
/// as long as the registry), the registry, a client for it and the
/// bootstrap admin token.
pub async fn registry_with(
    tune: impl FnOnce(&mut Config),
) -> (TempDir, RunningRegistry, Api, String) {
    let dir = TempDir::new().expect("temporary directory");
    let mut cfg = test_config(&dir);
    tune(&mut cfg);
    let reg = start(cfg).await;
    let api = Api::new(&reg.base_url());
    let admin = reg.admin_token.clone().expect("bootstrap admin token");
    (dir, reg, api, admin)
}

/// [`registry_with`] on the plain [`test_config`].
pub async fn registry() -> (TempDir, RunningRegistry, Api, String) {
    registry_with(|_| {}).await
}

/// [`registry_with`], then provider `p1` and its capabilities
/// ([`register_p1`]) registered with the admin token.
pub async fn registry_with_p1(
    tune: impl FnOnce(&mut Config),
) -> (TempDir, RunningRegistry, Api, String) {
    let (dir, reg, api, admin) = registry_with(tune).await;
    register_p1(&api, &admin).await;
    (dir, reg, api, admin)
}

/// Register provider `p1` ([`provider_body`]) and its capabilities
/// `cam-front-01` and `thumb-robot-01` ([`capabilities_body`]) with
/// `token`; each answer must be 200.
pub async fn register_p1(api: &Api, token: &str) {
    let r = api.register_provider(token, &provider_body("p1")).await;
    assert_eq!(r.0, StatusCode::OK, "register p1: {}", r.1);
    let r = api
        .register_capabilities(token, &capabilities_body("p1", ""))
        .await;
    assert_eq!(r.0, StatusCode::OK, "register p1's capabilities: {}", r.1);
}

/// The events [`register_p1`] appends, in order.
pub const P1_REGISTERED: [&str; 3] = [
    "provider_registered",
    "capability_registered",
    "capability_registered",
];

/// A new token for principal `name` with `role` on `reg`.
pub async fn new_token(reg: &RunningRegistry, role: Role, name: &str) -> String {
    reg.auth
        .create_token(role, name)
        .await
        .expect("token created")
}

/// The `lease_id` of a lease answer.
///
/// Panics: the answer holds no `lease_id` (the body is in the message).
pub fn lease_id(answer: &(StatusCode, Value)) -> String {
    answer.1["lease_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no lease_id ({}): {}", answer.0, answer.1))
        .to_string()
}

/// A JSON client bound to one registry.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

impl Api {
    pub fn new(base: &str) -> Self {
        Self {
            base: base.to_string(),
            http: reqwest::Client::new(),
        }
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> (StatusCode, Value) {
        Self::send(self.http.get(format!("{}{path}", self.base)), token).await
    }

    pub async fn post(&self, path: &str, token: Option<&str>, body: &Value) -> (StatusCode, Value) {
        self.post_raw(path, token, body.to_string()).await
    }

    pub async fn post_raw(
        &self,
        path: &str,
        token: Option<&str>,
        body: String,
    ) -> (StatusCode, Value) {
        let req = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body);
        Self::send(req, token).await
    }

    /// Send `req` with `token` (if any): the status and the body as JSON
    /// (a JSON string when it is not JSON).
    async fn send(mut req: reqwest::RequestBuilder, token: Option<&str>) -> (StatusCode, Value) {
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.expect("request sent");
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// `POST /api/v1/capability-providers/register` with `token`.
    pub async fn register_provider(&self, token: &str, body: &Value) -> (StatusCode, Value) {
        self.post("/api/v1/capability-providers/register", Some(token), body)
            .await
    }

    /// `GET /api/v1/capability-leases/{lease_id}` with `token`.
    pub async fn lease(&self, token: &str, lease_id: &str) -> (StatusCode, Value) {
        self.get(
            &format!("/api/v1/capability-leases/{lease_id}"),
            Some(token),
        )
        .await
    }

    /// `POST /api/v1/capabilities/register` with `token`.
    pub async fn register_capabilities(&self, token: &str, body: &Value) -> (StatusCode, Value) {
        self.post("/api/v1/capabilities/register", Some(token), body)
            .await
    }

    /// `POST /api/v1/capability-leases/{lease_id}/{op}` with `token`, for
    /// `op` one of `renew`, `release`, `actions`.
    pub async fn lease_post(
        &self,
        token: &str,
        lease_id: &str,
        op: &str,
        body: &Value,
    ) -> (StatusCode, Value) {
        self.post(
            &format!("/api/v1/capability-leases/{lease_id}/{op}"),
            Some(token),
            body,
        )
        .await
    }

    /// `POST /api/v1/capabilities/heartbeat` with `token`.
    pub async fn heartbeat(&self, token: &str, body: &Value) -> (StatusCode, Value) {
        self.post("/api/v1/capabilities/heartbeat", Some(token), body)
            .await
    }

    /// `POST /api/v1/capability-leases/request` with `token`.
    pub async fn request_lease(&self, token: &str, body: &Value) -> (StatusCode, Value) {
        self.post("/api/v1/capability-leases/request", Some(token), body)
            .await
    }

    /// `benchlink_events_total` from `/metrics`.
    pub async fn metric(&self, name_and_labels: &str) -> u64 {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name_and_labels)
                    .and_then(|r| r.strip_prefix(' '))
            })
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// Assert an error answer: status and `error.code`.
pub fn assert_error(got: &(StatusCode, Value), status: StatusCode, code: &str) {
    assert_eq!(got.0, status, "body: {}", got.1);
    assert_eq!(got.1["error"]["code"], code, "body: {}", got.1);
    assert!(got.1["error"]["message"].is_string(), "body: {}", got.1);
}

/// Seed 001 §4.1's provider example with `provider_id`.
pub fn provider_body(provider_id: &str) -> Value {
    json!({
        "provider_id": provider_id,
        "node_id": "win-gpu-02",
        "hostname": "win-gpu-02.local",
        "platform": "windows",
        "gateway_version": "0.1.0",
        "network_zone": "lan",
        "labels": ["lab", "gpu", "hardware-test"],
        "boot_id": "boot-1"
    })
}

/// Seed 001 §4.2's capability batch (ids suffixed with `suffix`).
pub fn capabilities_body(provider_id: &str, suffix: &str) -> Value {
    json!({
        "provider_id": provider_id,
        "capabilities": [
            {
                "capability_id": format!("cam-front-01{suffix}"),
                "capability_type": "camera",
                "display_name": "前置观察摄像头",
                "lease_mode": "exclusive",
                "preemptible": true,
                "supported_actions": ["snapshot", "record_clip", "start_stream", "stop_stream"],
                "evidence_modes": ["image", "video_clip", "ocr_text"],
                "metadata_json": {"resolution_options": ["1920x1080"], "max_fps": 30},
                "tags": ["front"]
            },
            {
                "capability_id": format!("thumb-robot-01{suffix}"),
                "capability_type": "thumb_robot",
                "display_name": "拇指机器人 1 号",
                "lease_mode": "exclusive",
                "preemptible": false,
                "supported_actions": ["tap", "long_press", "drag"]
            }
        ]
    })
}

#[allow(unused_imports)]
pub use benchlink_testkit::eventually;

/// An MQTT client acting as a provider; its event loop runs in a task, and
/// everything arriving on subscribed topics is handed over as
/// `(topic, payload)`.
pub struct TestProvider {
    pub provider_id: String,
    pub prefix: String,
    pub client: AsyncClient,
    pub incoming: mpsc::UnboundedReceiver<(String, Vec<u8>)>,
    pub task: JoinHandle<()>,
}

impl TestProvider {
    /// Connect as `client_id` with optional login, an LWT `offline` status
    /// (retained) for `provider_id`, and subscribe to its commands topic.
    pub async fn connect(
        host: &str,
        port: u16,
        prefix: &str,
        provider_id: &str,
        client_id: &str,
        login: Option<(&str, &str)>,
    ) -> Self {
        Self::try_connect(host, port, prefix, provider_id, client_id, login)
            .await
            .expect("MQTT connection accepted")
    }

    /// [`Self::connect`], returning the connection error instead.
    pub async fn try_connect(
        host: &str,
        port: u16,
        prefix: &str,
        provider_id: &str,
        client_id: &str,
        login: Option<(&str, &str)>,
    ) -> Result<Self, String> {
        let mut opts = MqttOptions::new(client_id, host, port);
        opts.set_keep_alive(Duration::from_secs(5))
            .set_max_packet_size(1 << 20, 1 << 20);
        if let Some((u, p)) = login {
            opts.set_credentials(u, p);
        }
        let will = envelope(
            MessageType::Status,
            &json!({"provider_id": provider_id, "online_status": "offline", "boot_id": "boot-1"}),
        );
        opts.set_last_will(LastWill::new(
            topic(prefix, provider_id, TopicKind::Status),
            will,
            QoS::AtLeastOnce,
            true,
        ));
        let (client, mut eventloop) = AsyncClient::new(opts, 64);
        let (tx, rx) = mpsc::unbounded_channel();
        let (conn_tx, mut conn_rx) = mpsc::unbounded_channel::<Result<(), String>>();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let _ = conn_tx.send(Ok(()));
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send((p.topic.clone(), p.payload.to_vec()));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = conn_tx.send(Err(e.to_string()));
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
        let first = tokio::time::timeout(Duration::from_secs(5), conn_rx.recv())
            .await
            .map_err(|_| "no answer to CONNECT within 5 s".to_string())?
            .ok_or_else(|| "event loop ended".to_string())?;
        if let Err(e) = first {
            task.abort();
            return Err(e);
        }
        client
            .subscribe(
                topic(prefix, provider_id, TopicKind::Commands),
                QoS::AtLeastOnce,
            )
            .await
            .expect("subscribe");
        // Let the SUBACK arrive before anything is published to us.
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(Self {
            provider_id: provider_id.to_string(),
            prefix: prefix.to_string(),
            client,
            incoming: rx,
            task,
        })
    }

    /// Publish `body` as a `message_type` envelope on this provider's
    /// `kind` topic (or another provider's, with `as_provider`).
    pub async fn publish(
        &self,
        as_provider: &str,
        kind: TopicKind,
        message_type: MessageType,
        body: &Value,
    ) {
        let qos = if kind == TopicKind::Heartbeat {
            QoS::AtMostOnce
        } else {
            QoS::AtLeastOnce
        };
        self.client
            .publish(
                topic(&self.prefix, as_provider, kind),
                qos,
                kind == TopicKind::Status,
                envelope(message_type, body),
            )
            .await
            .expect("publish queued");
    }

    /// Wait for the next envelope of `message_type` on a subscribed topic.
    pub async fn next_of(
        &mut self,
        message_type: MessageType,
        timeout: Duration,
    ) -> Option<Envelope> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let (_, payload) = tokio::time::timeout(left, self.incoming.recv())
                .await
                .ok()??;
            if let Ok(env) = Envelope::parse(&payload) {
                if env.message_type == message_type {
                    return Some(env);
                }
            }
        }
    }
}

/// An envelope's bytes with a fresh message id.
pub fn envelope(message_type: MessageType, body: &Value) -> Vec<u8> {
    Envelope::new(
        message_type,
        uuid::Uuid::new_v4().to_string(),
        chrono::Utc::now(),
        body,
    )
    .expect("envelope")
    .to_bytes()
}

/// A small audit request `id` of `audit_type` at `priority`, without
/// capability requirements.
pub fn audit_request(id: &str, audit_type: &str, priority: u8) -> Value {
    json!({
        "protocol_version": "1.0",
        "audit_request_id": id,
        "project_id": "proj_device_assistant",
        "task_id": "task_release_0_9_2",
        "trigger": "merge_candidate",
        "audit_type": audit_type,
        "priority": priority,
        "objective": format!("{audit_type} audit of release candidate 0.9.2"),
        "time_budget_seconds": 120,
        "response_mode": "structured_json"
    })
}

/// Remove the keys that hold times (they differ between two registrations).
pub fn without_times(mut v: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for k in [
                    "created_at",
                    "updated_at",
                    "last_heartbeat_at",
                    "registered_at",
                ] {
                    map.remove(k);
                }
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}
