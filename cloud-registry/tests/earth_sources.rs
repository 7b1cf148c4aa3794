//! Applied proposals that change what the registry loads and calls
//! (docs/earth-command.md, "Data sources by proposal", "Integrations by
//! proposal"), over real HTTP against an in-process registry: a vessels
//! GeoJSON file served by a local HTTP server becomes the vessels layer
//! and answers the Earth command without a restart; a source that cannot
//! be fetched or parsed fails its proposal and changes nothing; an applied
//! source survives a restart, a disabled one is gone, a refreshed one
//! changes; an applied `speech` integration sends audio to the new base
//! URL (also after a restart); an unknown integration id is refused. Proposals
//! are made by a `config_proposal` run on a stand-in chat model.

mod agents_support;
mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agents_support::{completion_text, json_tool_call, FakeVendor};
use axum::extract::{Path, State};
use axum::http::StatusCode as AxumStatus;
use axum::routing::get;
use axum::Router;
use cloud_registry::agents::config::NativeTools;
use cloud_registry::app::RunningRegistry;
use cloud_registry::config::Config;
use common::{new_token, test_config, Api};
use reqwest::StatusCode;
use serde_json::{json, Value};
use shared_protocol::api::Role;
use tempfile::TempDir;

/// The made-up vessels every test serves.
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/earth/vessels.test.geojson"
);

/// Entity ids of the fixture's vessels (mmsi, else the feature id).
const FIXTURE_IDS: [&str; 4] = [
    "vessel:mmsi:999000101",
    "vessel:mmsi:999000102",
    "vessel:mmsi:999000103",
    "vessel:test-delta",
];

/// Served files: (name, body).
type Files = Arc<Mutex<Vec<(String, String)>>>;
/// Names requested so far, in order.
type Hits = Arc<Mutex<Vec<String>>>;

/// A GeoJSON server on 127.0.0.1: `GET /{name}` answers the body stored
/// under `name` (200, `application/geo+json`), 404 for any other name.
#[derive(Clone)]
struct GeoServer {
    base: String,
    files: Files,
    hits: Hits,
}

impl GeoServer {
    async fn start() -> GeoServer {
        let files: Files = Arc::default();
        let hits: Hits = Arc::default();
        let app = Router::new()
            .route(
                "/{name}",
                get(
                    |State((files, hits)): State<(Files, Hits)>, Path(name): Path<String>| async move {
                        hits.lock().unwrap().push(name.clone());
                        let found = files
                            .lock()
                            .unwrap()
                            .iter()
                            .find(|(n, _)| *n == name)
                            .map(|(_, b)| b.clone());
                        match found {
                            Some(b) => (
                                AxumStatus::OK,
                                [("content-type", "application/geo+json")],
                                b,
                            ),
                            None => (
                                AxumStatus::NOT_FOUND,
                                [("content-type", "text/plain")],
                                "no such file".to_string(),
                            ),
                        }
                    },
                ),
            )
            .with_state((Arc::clone(&files), Arc::clone(&hits)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        GeoServer {
            base: format!("http://{addr}"),
            files,
            hits,
        }
    }

    /// Stop serving `/{name}` (404 from now on).
    fn remove(&self, name: &str) {
        self.files.lock().unwrap().retain(|(n, _)| n != name);
    }

    /// How often `/{name}` was requested.
    fn hits(&self, name: &str) -> usize {
        self.hits
            .lock()
            .unwrap()
            .iter()
            .filter(|n| *n == name)
            .count()
    }

    /// Serve `body` at `/{name}` (replacing what was there).
    fn put(&self, name: &str, body: &str) -> String {
        let mut f = self.files.lock().unwrap();
        f.retain(|(n, _)| n != name);
        f.push((name.to_string(), body.to_string()));
        format!("{}/{name}", self.base)
    }
}

/// A registry on a stand-in chat model, with an admin token.
struct Lab {
    /// The store; lives as long as the lab.
    _dir: TempDir,
    cfg: Config,
    reg: Option<RunningRegistry>,
    api: Api,
    admin: String,
    model: FakeVendor,
}

impl Lab {
    async fn start(tune: impl FnOnce(&mut Config)) -> Lab {
        let model = FakeVendor::start().await;
        let dir = TempDir::new().unwrap();
        let mut cfg = test_config(&dir);
        cfg.agents = model.model_config(NativeTools::Off);
        tune(&mut cfg);
        let reg = common::start(cfg.clone()).await;
        let api = Api::new(&reg.base_url());
        let admin = new_token(&reg, Role::Admin, "alice-admin").await;
        Lab {
            _dir: dir,
            cfg,
            reg: Some(reg),
            api,
            admin,
            model,
        }
    }

    /// Stop the registry and start it again on the same store and config.
    async fn restart(&mut self) {
        self.reg.take().unwrap().shutdown().await;
        let reg = common::start(self.cfg.clone()).await;
        self.api = Api::new(&reg.base_url());
        self.reg = Some(reg);
    }

    /// A `config_proposal` run (as the admin) whose model proposes each of
    /// `drafts`; the proposals it made.
    async fn propose(&self, drafts: Vec<Value>) -> Vec<Value> {
        for d in drafts {
            self.model
                .then_content(&json_tool_call("agents.propose_config", d));
        }
        self.model.then(|_| {
            (
                200,
                completion_text(
                    &json!({"type": "final", "summary": "proposed", "result": {}}).to_string(),
                ),
            )
        });
        let (status, body) = self
            .api
            .post(
                "/api/v1/agents/runs",
                Some(&self.admin),
                &json!({"run_type": "config_proposal", "title": "sources", "objective": "add a source"}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let run_id = body["run"]["run_id"].as_str().unwrap().to_string();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (_, d) = self
                .api
                .get(&format!("/api/v1/agents/runs/{run_id}"), Some(&self.admin))
                .await;
            if !matches!(d["run"]["status"].as_str(), Some("queued" | "running")) {
                return d["proposals"].as_array().cloned().unwrap_or_default();
            }
            assert!(Instant::now() < deadline, "run never settled: {d}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// `POST /proposals/{id}/apply` with `{"confirm": true}` as the admin.
    async fn apply(&self, proposal: &Value) -> (StatusCode, Value) {
        let id = proposal["id"].as_i64().expect("a proposal id");
        self.api
            .post(
                &format!("/api/v1/agents/proposals/{id}/apply"),
                Some(&self.admin),
                &json!({"confirm": true}),
            )
            .await
    }

    /// Propose `draft` and apply it; the apply answer.
    async fn propose_and_apply(&self, draft: Value) -> (StatusCode, Value) {
        let props = self.propose(vec![draft]).await;
        assert_eq!(props[0]["status"], "pending", "{}", props[0]);
        self.apply(&props[0]).await
    }

    /// Entity ids of the vessels layer, sorted.
    async fn vessel_layer(&self) -> Vec<String> {
        let (status, fc) = self
            .api
            .get("/api/v1/visualization/geo/vessels", Some(&self.admin))
            .await;
        assert_eq!(status, StatusCode::OK, "{fc}");
        let mut ids: Vec<String> = fc["features"]
            .as_array()
            .unwrap_or_else(|| panic!("not a FeatureCollection: {fc}"))
            .iter()
            .map(|f| f["properties"]["entity_id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    }

    /// `POST /earth/command` with `text`; the answer.
    async fn command(&self, text: &str) -> Value {
        let (status, body) = self
            .api
            .post(
                "/api/v1/agents/earth/command",
                Some(&self.admin),
                &json!({"input_text": text, "source": "text"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }
}

/// A datasource proposal for the vessels layer at `endpoint`.
fn vessels_source(endpoint: &str) -> Value {
    json!({"proposal_type": "datasource_config", "target": {"datasource_id": "test_ais"},
           "changes": {"name": "test AIS feed", "enabled": true, "endpoint": endpoint,
                       "format": "geojson", "layer": "vessels", "timeout_seconds": 5},
           "rationale": "the vessels layer ships empty"})
}

/// The entity ids a command answer highlighted, sorted.
fn highlighted(resp: &Value) -> Vec<String> {
    let mut ids: Vec<String> = resp["actions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["type"] == "highlight_entities")
        .flat_map(|a| a["entity_ids"].as_array().unwrap().clone())
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

fn fixture() -> String {
    std::fs::read_to_string(FIXTURE).expect("the vessels fixture")
}

#[tokio::test]
async fn an_applied_vessels_source_fills_the_layer_and_the_command_without_a_restart() {
    let geo = GeoServer::start().await;
    let url = geo.put("vessels.geojson", &fixture());
    let lab = Lab::start(|_| {}).await;
    assert!(lab.vessel_layer().await.is_empty(), "vessels ship empty");

    // The same run also turns the chat model off, so the command below is
    // answered by the deterministic resolver.
    let props = lab
        .propose(vec![
            vessels_source(&url),
            json!({"proposal_type": "external_integration", "target": {"integration_id": "model"},
                   "changes": {"enabled": false}, "rationale": "resolver only"}),
        ])
        .await;
    let (status, applied) = lab.apply(&props[0]).await;
    assert_eq!(status, StatusCode::OK, "{applied}");
    assert_eq!(applied["status"], "applied");
    assert_eq!(lab.vessel_layer().await, FIXTURE_IDS);
    let (status, body) = lab.apply(&props[1]).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    for text in ["高亮所有船舶", "highlight all vessels"] {
        let resp = lab.command(text).await;
        assert_eq!(highlighted(&resp), FIXTURE_IDS, "{text}: {resp}");
        assert!(
            !resp
                .to_string()
                .contains("no data source configured for vessels"),
            "{resp}"
        );
    }
    let (_, stats) = lab
        .api
        .get("/api/v1/agents/earth/stats", Some(&lab.admin))
        .await;
    assert_eq!(stats["counts"]["vessels"], 4, "{stats}");
}

#[tokio::test]
async fn a_source_that_cannot_be_fetched_or_parsed_fails_its_proposal_and_keeps_the_layer() {
    let geo = GeoServer::start().await;
    let good = geo.put("vessels.geojson", &fixture());
    let bad_json = geo.put(
        "broken.geojson",
        "{\"type\": \"FeatureCollection\", \"features\": [",
    );
    let lab = Lab::start(|_| {}).await;
    let (status, body) = lab.propose_and_apply(vessels_source(&good)).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    for (endpoint, expect) in [
        (format!("{}/missing.geojson", geo.base), "404"),
        (bad_json, "malformed JSON"),
    ] {
        let (status, err) = lab.propose_and_apply(vessels_source(&endpoint)).await;
        assert_eq!(status, StatusCode::CONFLICT, "{err}");
        assert_eq!(err["error"]["code"], "proposal_apply_failed");
        let p = &err["error"]["details"]["proposal"];
        assert_eq!(p["status"], "failed", "{p}");
        let error = p["error"].as_str().unwrap();
        assert!(
            error.contains("test_ais") && error.contains(expect),
            "{endpoint}: {error}"
        );
        assert_eq!(lab.vessel_layer().await, FIXTURE_IDS, "old layer kept");
    }
    // The setting still holds the source that loaded: a proposal made now
    // starts from it.
    let props = lab
        .propose(vec![json!({"proposal_type": "datasource_config",
            "target": {"datasource_id": "test_ais"}, "changes": {"timeout_seconds": 9},
            "rationale": "slower feed"})])
        .await;
    assert_eq!(props[0]["before_payload"]["endpoint"], good);
}

#[tokio::test]
async fn an_applied_source_is_loaded_again_after_a_restart_and_disabling_removes_it() {
    let geo = GeoServer::start().await;
    let url = geo.put("vessels.geojson", &fixture());
    let mut lab = Lab::start(|_| {}).await;
    let (status, body) = lab.propose_and_apply(vessels_source(&url)).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    lab.restart().await;
    assert_eq!(lab.vessel_layer().await, FIXTURE_IDS);

    let (status, body) = lab
        .propose_and_apply(json!({"proposal_type": "datasource_config",
            "target": {"datasource_id": "test_ais"}, "changes": {"enabled": false},
            "rationale": "feed retired"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(lab.vessel_layer().await.is_empty());
    lab.restart().await;
    assert!(lab.vessel_layer().await.is_empty(), "still disabled");
}

#[tokio::test]
async fn a_source_with_a_refresh_interval_picks_up_new_features_and_survives_a_failed_refresh() {
    let geo = GeoServer::start().await;
    let url = geo.put("vessels.geojson", &fixture());
    let lab = Lab::start(|_| {}).await;
    let mut draft = vessels_source(&url);
    draft["changes"]["refresh_interval_seconds"] = json!(10);
    let (status, body) = lab.propose_and_apply(draft).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(lab.vessel_layer().await.len(), 4);

    let mut fc: Value = serde_json::from_str(&fixture()).unwrap();
    fc["features"].as_array_mut().unwrap().truncate(1);
    geo.put("vessels.geojson", &fc.to_string());
    let deadline = Instant::now() + Duration::from_secs(25);
    while lab.vessel_layer().await.len() != 1 {
        assert!(Instant::now() < deadline, "the source was never refreshed");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(lab.vessel_layer().await, ["vessel:mmsi:999000101"]);

    // A refresh that fails (404) keeps the features in force.
    geo.remove("vessels.geojson");
    let seen = geo.hits("vessels.geojson");
    let deadline = Instant::now() + Duration::from_secs(25);
    while geo.hits("vessels.geojson") == seen {
        assert!(Instant::now() < deadline, "no refresh was tried");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(lab.vessel_layer().await, ["vessel:mmsi:999000101"]);
}

/// `POST /speech/transcriptions` with a small upload as the admin; the
/// status.
async fn transcribe(lab: &Lab) -> StatusCode {
    let form = reqwest::multipart::Form::new()
        .part(
            "file",
            reqwest::multipart::Part::bytes(vec![0u8; 2048])
                .file_name("a.webm")
                .mime_str("audio/webm")
                .unwrap(),
        )
        .text("language", "zh");
    lab.api
        .http
        .post(format!(
            "{}/api/v1/agents/speech/transcriptions",
            lab.api.base
        ))
        .bearer_auth(&lab.admin)
        .multipart(form)
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn an_applied_speech_integration_sends_later_audio_to_its_base_url() {
    let configured = FakeVendor::start().await;
    let proposed = FakeVendor::start().await;
    let configured_url = configured.base_url.clone();
    let mut lab = Lab::start(move |cfg| {
        cfg.agents.speech.base_url = Some(configured_url);
        cfg.agents.speech.api_key = Some("sk-asr-config".into());
    })
    .await;
    let reply = json!({"task": "transcribe", "language": "zh", "duration": 1.0,
                       "text": "显示所有船舶", "segments": []});
    configured.then_audio(200, reply.clone());
    assert_eq!(transcribe(&lab).await, StatusCode::OK);
    assert_eq!(configured.audio_requests().len(), 1);

    let (status, body) = lab
        .propose_and_apply(json!({"proposal_type": "external_integration",
            "target": {"integration_id": "speech"},
            "changes": {"base_url": proposed.base_url, "timeout_seconds": 20},
            "rationale": "move to the new ASR host"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    proposed.then_audio(200, reply.clone());
    assert_eq!(transcribe(&lab).await, StatusCode::OK);
    let got = proposed.audio_requests();
    assert_eq!(got.len(), 1, "the new base URL got the audio");
    assert_eq!(
        got[0].authorization.as_deref(),
        Some("Bearer sk-asr-config"),
        "the key stays the configured one"
    );
    assert_eq!(configured.audio_requests().len(), 1, "the old one nothing");

    // Stored: a restarted registry still uses the applied base URL.
    lab.restart().await;
    proposed.then_audio(200, reply);
    assert_eq!(transcribe(&lab).await, StatusCode::OK);
    assert_eq!(proposed.audio_requests().len(), 2);
    assert_eq!(configured.audio_requests().len(), 1);
}

#[tokio::test]
async fn an_integration_id_that_names_nothing_is_refused() {
    let lab = Lab::start(|_| {}).await;
    let props = lab
        .propose(vec![json!({"proposal_type": "external_integration",
            "target": {"integration_id": "pager_duty"},
            "changes": {"base_url": "https://pager.example/v1"}, "rationale": "alerts"})])
        .await;
    assert_eq!(props[0]["status"], "rejected", "{}", props[0]);
    let error = props[0]["error"].as_str().unwrap();
    assert!(
        error.contains("`pager_duty` names no integration")
            && error.contains("model, speech, web_search"),
        "{error}"
    );
    let (status, err) = lab.apply(&props[0]).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    assert_eq!(err["error"]["code"], "proposal_rejected");
}
