//! Test support for the agent runtime and Earth command tests: the agent
//! routes served over real HTTP on 127.0.0.1 with a real Authenticator on a
//! temporary SQLite file, and a fake OpenAI-compatible vendor (chat
//! completions and audio transcriptions over real HTTP, speaking the
//! vendor's wire formats) that records every request it receives.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::extract::{Multipart, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Extension, Json, Router};
use cloud_registry::agents::config::{AgentsConfig, NativeTools};
use cloud_registry::agents::earth::entities::{EarthDataConfig, EntityCatalog, SHIPPED_DATA_DIR};
use cloud_registry::agents::{self, AgentService};
use cloud_registry::auth::{self, Authenticator};
use cloud_registry::db::Db;
use serde_json::{json, Value};
use shared_protocol::api::Role;
use tempfile::TempDir;

/// The shipped entity catalog, loaded once per test binary.
pub fn catalog() -> Arc<EntityCatalog> {
    static CATALOG: OnceLock<Arc<EntityCatalog>> = OnceLock::new();
    CATALOG
        .get_or_init(|| {
            Arc::new(
                EntityCatalog::load(&EarthDataConfig::shipped(SHIPPED_DATA_DIR))
                    .expect("shipped data loads"),
            )
        })
        .clone()
}

/// A shipped data file.
pub fn data_file(rel: &str) -> PathBuf {
    PathBuf::from(SHIPPED_DATA_DIR).join(rel)
}

/// NORAD ids of every TLE entry whose name line contains `needle`, read
/// straight from the shipped CelesTrak file (3-line format).
pub fn tle_norad_ids(needle: &str) -> Vec<String> {
    let text =
        std::fs::read_to_string(data_file("satellites/celestrak_active_2020-10-26.txt")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for w in lines.windows(2) {
        let (name, l1) = (w[0], w[1]);
        if l1.starts_with("1 ")
            && !name.starts_with("1 ")
            && !name.starts_with("2 ")
            && name.contains(needle)
        {
            out.push(format!("satellite:norad:{}", l1[2..7].trim()));
        }
    }
    out
}

/// The agent routes on a real socket.
pub struct Harness {
    /// `http://127.0.0.1:PORT/api/v1/agents`
    pub base: String,
    /// `http://127.0.0.1:PORT/api/v1/visualization/geo`
    pub geo_base: String,
    pub http: reqwest::Client,
    pub tokens: HashMap<Role, String>,
    pub svc: Arc<AgentService>,
    _dir: TempDir,
}

impl Harness {
    /// Serve the agent routes with `config` over the shipped catalog.
    pub async fn start(config: AgentsConfig) -> Harness {
        Self::start_with_catalog(config, catalog()).await
    }

    /// Serve the agent routes with `config` over `catalog`.
    pub async fn start_with_catalog(config: AgentsConfig, catalog: Arc<EntityCatalog>) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("registry.sqlite3"), |c| {
            auth::migrate(c)?;
            agents::migrate(c)
        })
        .unwrap();
        let authenticator = Authenticator::load(db.clone()).await.unwrap();
        let mut tokens = HashMap::new();
        for (role, name) in [
            (Role::SuperAdmin, "root"),
            (Role::Admin, "alice-admin"),
            (Role::Operator, "oscar-operator"),
            (Role::Viewer, "vera-viewer"),
            (Role::Provider, "bench-01"),
        ] {
            tokens.insert(role, authenticator.create_token(role, name).await.unwrap());
        }
        let svc = Arc::new(AgentService::new(db, catalog, config).await.unwrap());
        let app = Router::new()
            .nest(
                "/api/v1/agents",
                axum::Router::from(agents::router(Arc::clone(&svc))),
            )
            .nest(
                "/api/v1/visualization/geo",
                axum::Router::from(agents::geo_router(Arc::clone(&svc))),
            )
            .layer(Extension(authenticator));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Harness {
            base: format!("http://{addr}/api/v1/agents"),
            geo_base: format!("http://{addr}/api/v1/visualization/geo"),
            http: reqwest::Client::new(),
            tokens,
            svc,
            _dir: dir,
        }
    }

    async fn decode(resp: reqwest::Response) -> (StatusCode, Value) {
        let status = StatusCode::from_u16(resp.status().as_u16()).unwrap();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// POST JSON as `role`.
    pub async fn post(&self, role: Role, path: &str, body: Value) -> (StatusCode, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.tokens[&role])
            .json(&body)
            .send()
            .await
            .unwrap();
        Self::decode(resp).await
    }

    /// `POST /proposals/{id}/{verb}` as `role`, for `verb` `apply` or
    /// `reject`.
    pub async fn proposal(
        &self,
        role: Role,
        id: i64,
        verb: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        self.post(role, &format!("/proposals/{id}/{verb}"), body)
            .await
    }

    /// GET as `role`.
    pub async fn get(&self, role: Role, path: &str) -> (StatusCode, Value) {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.tokens[&role])
            .send()
            .await
            .unwrap();
        Self::decode(resp).await
    }

    /// `GET /api/v1/visualization/geo/{layer_and_query}` as `role`: status,
    /// headers and the parsed body.
    pub async fn geo(
        &self,
        role: Role,
        layer_and_query: &str,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let resp = self
            .http
            .get(format!("{}/{layer_and_query}", self.geo_base))
            .bearer_auth(&self.tokens[&role])
            .send()
            .await
            .unwrap();
        let headers = resp.headers().clone();
        let (status, body) = Self::decode(resp).await;
        (status, headers, body)
    }

    /// POST a multipart form as `role`.
    pub async fn post_multipart(
        &self,
        role: Role,
        path: &str,
        form: reqwest::multipart::Form,
    ) -> (StatusCode, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.tokens[&role])
            .multipart(form)
            .send()
            .await
            .unwrap();
        Self::decode(resp).await
    }

    /// `POST /earth/command` with a text command, as an operator.
    pub async fn command(&self, text: &str) -> Value {
        let (status, body) = self
            .post(
                Role::Operator,
                "/earth/command",
                json!({"input_text": text, "source": "text", "client_context": {"locale": "zh-CN"}}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    /// `GET /runs/{id}` as a viewer.
    pub async fn run(&self, run_id: &str) -> Value {
        let (status, body) = self.get(Role::Viewer, &format!("/runs/{run_id}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }
}

/// A scripted reply of the fake chat model: reads the request, returns
/// (HTTP status, JSON body).
pub type Responder = Box<dyn FnOnce(&Value) -> (u16, Value) + Send>;
type AlwaysFn = Arc<dyn Fn(&Value) -> (u16, Value) + Send + Sync>;

/// One `/audio/transcriptions` request as the vendor saw it.
#[derive(Debug, Clone, Default)]
pub struct AudioRequest {
    pub authorization: Option<String>,
    pub fields: HashMap<String, String>,
    pub file_name: Option<String>,
    pub file_content_type: Option<String>,
    pub file_bytes: Vec<u8>,
}

#[derive(Default)]
struct FakeState {
    chat_script: Mutex<VecDeque<Responder>>,
    chat_always: Mutex<Option<AlwaysFn>>,
    chat_requests: Mutex<Vec<Value>>,
    chat_auth: Mutex<Vec<Option<String>>>,
    chat_delay: Mutex<Option<Duration>>,
    audio_replies: Mutex<VecDeque<(u16, Value)>>,
    audio_requests: Mutex<Vec<AudioRequest>>,
}

/// A fake OpenAI-compatible vendor on 127.0.0.1.
#[derive(Clone)]
pub struct FakeVendor {
    /// `http://127.0.0.1:PORT/v1`
    pub base_url: String,
    state: Arc<FakeState>,
}

async fn chat_handler(
    State(state): State<Arc<FakeState>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    state.chat_requests.lock().unwrap().push(body.clone());
    state.chat_auth.lock().unwrap().push(
        headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    );
    let delay = *state.chat_delay.lock().unwrap();
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let next = state.chat_script.lock().unwrap().pop_front();
    let (status, reply) = match next {
        Some(f) => f(&body),
        None => match state.chat_always.lock().unwrap().clone() {
            Some(f) => f(&body),
            None => (
                500,
                json!({"error": {"message": "fake vendor: chat script exhausted"}}),
            ),
        },
    };
    (StatusCode::from_u16(status).unwrap(), Json(reply))
}

async fn audio_handler(
    State(state): State<Arc<FakeState>>,
    headers: HeaderMap,
    mut multipart: Multipart,
) -> (StatusCode, Json<Value>) {
    let mut req = AudioRequest {
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        ..Default::default()
    };
    while let Ok(Some(field)) = multipart.next_field().await {
        let name = field.name().unwrap_or_default().to_string();
        if name == "file" {
            req.file_name = field.file_name().map(str::to_string);
            req.file_content_type = field.content_type().map(str::to_string);
            req.file_bytes = field.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
        } else {
            let v = field.text().await.unwrap_or_default();
            req.fields.insert(name, v);
        }
    }
    state.audio_requests.lock().unwrap().push(req);
    let (status, reply) = state.audio_replies.lock().unwrap().pop_front().unwrap_or((
        500,
        json!({"error": {"message": "fake vendor: audio script exhausted"}}),
    ));
    (StatusCode::from_u16(status).unwrap(), Json(reply))
}

impl FakeVendor {
    /// Start the fake vendor.
    pub async fn start() -> FakeVendor {
        let state = Arc::new(FakeState::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(chat_handler))
            .route("/v1/audio/transcriptions", post(audio_handler))
            .layer(axum::extract::DefaultBodyLimit::max(64 * 1024 * 1024))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeVendor {
            base_url: format!("http://{addr}/v1"),
            state,
        }
    }

    /// Queue one chat reply.
    pub fn then(&self, f: impl FnOnce(&Value) -> (u16, Value) + Send + 'static) -> &Self {
        self.state
            .chat_script
            .lock()
            .unwrap()
            .push_back(Box::new(f));
        self
    }

    /// Queue a 200 completion whose message content is `content`.
    pub fn then_content(&self, content: &str) -> &Self {
        let c = content.to_string();
        self.then(move |_| (200, completion_text(&c)))
    }

    /// The reply used once the queue is empty.
    pub fn always(&self, f: impl Fn(&Value) -> (u16, Value) + Send + Sync + 'static) {
        *self.state.chat_always.lock().unwrap() = Some(Arc::new(f));
    }

    /// Delay every chat reply.
    pub fn delay_chat(&self, d: Duration) {
        *self.state.chat_delay.lock().unwrap() = Some(d);
    }

    /// Queue one audio reply.
    pub fn then_audio(&self, status: u16, body: Value) {
        self.state
            .audio_replies
            .lock()
            .unwrap()
            .push_back((status, body));
    }

    /// Every chat request body received, in order.
    pub fn chat_requests(&self) -> Vec<Value> {
        self.state.chat_requests.lock().unwrap().clone()
    }

    /// The Authorization header of every chat request.
    pub fn chat_auth(&self) -> Vec<Option<String>> {
        self.state.chat_auth.lock().unwrap().clone()
    }

    /// Every audio request received.
    pub fn audio_requests(&self) -> Vec<AudioRequest> {
        self.state.audio_requests.lock().unwrap().clone()
    }

    /// An `[agents]` config using this vendor as the chat model.
    pub fn model_config(&self, native: NativeTools) -> AgentsConfig {
        let mut cfg = AgentsConfig::default();
        cfg.model.base_url = Some(self.base_url.clone());
        cfg.model.model = Some("fake-chat-1".into());
        cfg.model.api_key = Some("sk-test-chat".into());
        cfg.model.native_tools = native;
        cfg.model.timeout_seconds = 30;
        cfg
    }
}

/// A chat completion whose assistant message is `content`.
pub fn completion_text(content: &str) -> Value {
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_764_000_000,
        "model": "fake-chat-1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 812, "completion_tokens": 64, "total_tokens": 876}
    })
}

/// A chat completion with provider-native tool calls `(name, arguments)`.
pub fn completion_tool_calls(calls: &[(&str, Value)]) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": format!("call_{i}"), "type": "function",
                   "function": {"name": name, "arguments": args.to_string()}})
        })
        .collect();
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_764_000_000,
        "model": "fake-chat-1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": calls},
                     "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 700, "completion_tokens": 20, "total_tokens": 720}
    })
}

/// A JSON-protocol tool call as a model would write it.
pub fn json_tool_call(tool: &str, arguments: Value) -> String {
    json!({"type": "tool_call", "tool": tool, "arguments": arguments}).to_string()
}

/// The last tool result the model was given: a `tool` message (native) or
/// a `TOOL_RESULT name:` user message (JSON protocol), parsed.
pub fn last_tool_result(req: &Value) -> Option<Value> {
    let msgs = req["messages"].as_array()?;
    for m in msgs.iter().rev() {
        let content = m["content"].as_str().unwrap_or("");
        if m["role"] == "tool" {
            return serde_json::from_str(content).ok();
        }
        if m["role"] == "user" {
            if let Some(rest) = content.strip_prefix("TOOL_RESULT ") {
                let json_start = rest.find('\n')?;
                return serde_json::from_str(&rest[json_start + 1..]).ok();
            }
        }
    }
    None
}

/// Entity ids in an `earth.find_entities` result.
pub fn result_ids(result: &Value) -> Vec<String> {
    result["entities"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["entity_id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A final answer highlighting `ids` in `domain`, as JSON text.
pub fn final_highlight(summary: &str, domain: &str, ids: &[String]) -> String {
    json!({
        "type": "final",
        "summary": summary,
        "result": {
            "actions": [
                {"type": "show_layer", "layer": domain, "enabled": true},
                {"type": "highlight_entities", "domain": domain, "entity_ids": ids,
                 "style": {"color": "#7dd3fc", "mode": "glow"}, "reason": "operator request"}
            ],
            "confidence": 0.9,
            "missing_data": []
        }
    })
    .to_string()
}

/// The `highlight_entities` ids of a response.
pub fn highlighted(resp: &Value) -> Vec<String> {
    resp["actions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["type"] == "highlight_entities")
        .flat_map(|a| {
            a["entity_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
        })
        .collect()
}

/// Steps of a run detail as `(step_type, name, status)`.
pub fn steps(detail: &Value) -> Vec<(String, String, String)> {
    detail["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["step_type"].as_str().unwrap().to_string(),
                s["name"].as_str().unwrap().to_string(),
                s["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}
