//! The agent runtime over real HTTP (seed 000 "Agent Runs", "Agent Tool
//! Protocol", "Policy", "Speech / ASR", "Prompt Registry"): runs and steps,
//! the tool protocol against a fake OpenAI-compatible vendor, proposal
//! policy, speech transcription.

mod agents_support;

use std::time::{Duration, Instant};

use agents_support::*;
use benchlink_testkit::status_is;
use benchlink_testkit::{find, strs};
use cloud_registry::agents::config::{AgentsConfig, NativeTools};
use cloud_registry::agents::prompts::{default_text, PROMPT_KEYS};
use reqwest::multipart::{Form, Part};
use reqwest::StatusCode;
use serde_json::{json, Value};
use shared_protocol::api::Role;

/// Poll a run until it leaves `queued`/`running` (or `want` holds).
async fn wait_run(h: &Harness, run_id: &str, want: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let d = h.run(run_id).await;
        if want(&d) {
            return d;
        }
        assert!(
            Instant::now() < deadline,
            "run {run_id} never got there: {d}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn settled(d: &Value) -> bool {
    !matches!(
        d["run"]["status"].as_str(),
        Some("queued") | Some("running")
    )
}

async fn start_run(h: &Harness, role: Role, run_type: &str, objective: &str) -> String {
    let (_, body) = status_is(
        h.post(
            role,
            "/runs",
            json!({"run_type": run_type, "title": "test run", "objective": objective}),
        )
        .await,
        StatusCode::CREATED,
    );
    body["run"]["run_id"].as_str().unwrap().to_string()
}

fn final_text(summary: &str) -> String {
    json!({"type": "final", "summary": summary, "result": {}}).to_string()
}

#[tokio::test]
async fn creating_a_run_persists_it_with_ordered_steps_and_lists_it() {
    let h = Harness::start(AgentsConfig::default()).await;
    let (_, body) = status_is(
        h.post(
            Role::Viewer,
            "/runs",
            json!({"run_type": "earth_command", "title": "北斗", "objective": "高亮所有北斗卫星"}),
        )
        .await,
        StatusCode::CREATED,
    );
    assert_eq!(body["run"]["status"], "completed");
    assert_eq!(body["run"]["created_by"], "vera-viewer");
    let indexes: Vec<u64> = body["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step_index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, (0..indexes.len() as u64).collect::<Vec<_>>());
    let times = strs(&body["steps"], "started_at");
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    let run_id = body["run"]["run_id"].as_str().unwrap();

    let (_, list) = status_is(
        h.get(
            Role::Viewer,
            "/runs?run_type=earth_command&status=completed",
        )
        .await,
        StatusCode::OK,
    );
    assert_eq!(list["runs"][0]["run_id"], run_id);
    let (_, err) = status_is(
        h.get(Role::Viewer, "/runs?status=sleeping").await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(err["error"]["details"]["field"], "status");
    let (status, _) = h.get(Role::Viewer, "/runs/agent_nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A run is `run_id` in every answer that names it: the Earth command's,
/// the run itself (detail, list, stop), its steps and its evidence;
/// never `public_id` and never the store's integer key.
#[tokio::test]
async fn a_run_is_run_id_in_every_answer() {
    let h = Harness::start(AgentsConfig::default()).await;
    let (_, resp) = status_is(
        h.post(
            Role::Viewer,
            "/earth/command",
            json!({"input_text": "高亮所有北斗卫星", "source": "text"}),
        )
        .await,
        StatusCode::OK,
    );
    let run_id = resp["run_id"].as_str().unwrap().to_string();
    assert!(run_id.starts_with("agent_"), "{resp}");

    let detail = h.run(&run_id).await;
    assert_eq!(
        detail["run"]["run_id"],
        run_id.as_str(),
        "{}",
        detail["run"]
    );
    assert!(
        detail["run"].get("public_id").is_none(),
        "{}",
        detail["run"]
    );
    for part in ["steps", "evidence"] {
        let items = detail[part].as_array().unwrap();
        assert!(!items.is_empty(), "{part}: {detail}");
        for item in items {
            assert_eq!(item["run_id"], run_id.as_str(), "{part}: {item}");
        }
    }
    let (_, list) = status_is(h.get(Role::Viewer, "/runs").await, StatusCode::OK);
    assert_eq!(list["runs"][0]["run_id"], run_id.as_str());
    assert!(!list.to_string().contains("public_id"), "{list}");
}

#[tokio::test]
async fn roles_are_checked_and_other_run_types_need_a_model() {
    let h = Harness::start(AgentsConfig::default()).await;
    let (status, _) = h
        .post(
            Role::Provider,
            "/earth/command",
            json!({"input_text": "高亮北斗卫星", "source": "text"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = h
        .post(
            Role::Viewer,
            "/runs",
            json!({"run_type": "config_proposal", "title": "t", "objective": "o"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (_, body) = status_is(
        h.post(
            Role::Operator,
            "/runs",
            json!({"run_type": "diagnostic", "title": "t", "objective": "o"}),
        )
        .await,
        StatusCode::SERVICE_UNAVAILABLE,
    );
    assert_eq!(body["error"]["code"], "model_not_configured");
    let resp = h
        .http
        .post(format!("{}/earth/command", h.base))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
}

#[tokio::test]
async fn stopping_a_running_run_stops_it_and_stopping_a_finished_run_is_a_conflict() {
    let fake = FakeVendor::start().await;
    fake.delay_chat(Duration::from_secs(20));
    fake.always(|_| (200, completion_text(&final_text("late"))));
    let h = Harness::start(fake.model_config(NativeTools::Off)).await;
    let run_id = start_run(
        &h,
        Role::Operator,
        "diagnostic",
        "check the Earth data sources",
    )
    .await;
    wait_run(&h, &run_id, |d| {
        d["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["step_type"] == "llm" && s["status"] == "running")
    })
    .await;

    let (status, _) = h
        .post(Role::Viewer, &format!("/runs/{run_id}/stop"), json!({}))
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a viewer may not stop someone else's run"
    );
    let (_, stopped) = status_is(
        h.post(Role::Operator, &format!("/runs/{run_id}/stop"), json!({}))
            .await,
        StatusCode::OK,
    );
    assert_eq!(stopped["run"]["status"], "stopped");
    assert!(stopped["run"]["completed_at"].is_string());
    let llm = &stopped["steps"][0];
    assert_eq!(
        (llm["step_type"].as_str(), llm["status"].as_str()),
        (Some("llm"), Some("failed"))
    );
    assert_eq!(llm["error"], "run stopped by oscar-operator");

    let (_, err) = status_is(
        h.post(Role::Operator, &format!("/runs/{run_id}/stop"), json!({}))
            .await,
        StatusCode::CONFLICT,
    );
    assert_eq!(err["error"]["code"], "run_already_final");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = h.run(&run_id).await;
    assert_eq!(after["run"]["status"], "stopped");
    assert_eq!(
        after["steps"].as_array().unwrap().len(),
        1,
        "the loop recorded nothing after the stop"
    );

    fake.delay_chat(Duration::ZERO);
    let done = h.command("高亮所有北斗卫星").await;
    let (status, _) = h
        .post(
            Role::Operator,
            &format!("/runs/{}/stop", done["run_id"].as_str().unwrap()),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn a_valid_json_tool_call_runs_the_tool_and_the_final_answer_completes_the_run() {
    let fake = FakeVendor::start().await;
    fake.then_content(&json_tool_call("earth.list_domains", json!({})))
        .then(|req| {
            let r = last_tool_result(req).unwrap();
            assert_eq!(r["domains"].as_array().unwrap().len(), 6);
            (
                200,
                completion_text(&final_text("Six domains; news and vessels have no data.")),
            )
        });
    let h = Harness::start(fake.model_config(NativeTools::Off)).await;
    let run_id = start_run(
        &h,
        Role::Operator,
        "diagnostic",
        "Which Earth domains have data?",
    )
    .await;
    let d = wait_run(&h, &run_id, settled).await;
    assert_eq!(d["run"]["status"], "completed", "{d}");
    assert_eq!(
        steps(&d),
        vec![
            ("llm".into(), "chat.completions".into(), "completed".into()),
            (
                "tool".into(),
                "earth.list_domains".into(),
                "completed".into()
            ),
            ("llm".into(), "chat.completions".into(), "completed".into()),
        ]
    );
    let sat = d["steps"][1]["output"]["domains"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["domain"] == "satellites")
        .unwrap()
        .clone();
    assert_eq!(sat["count"], 3159);
    assert!(d["run"]["result_markdown"]
        .as_str()
        .unwrap()
        .starts_with("Six domains"));
}

#[tokio::test]
async fn invalid_tool_arguments_and_broken_json_are_failed_steps_and_execute_nothing() {
    let fake = FakeVendor::start().await;
    fake.then_content(&json_tool_call(
        "earth.find_entities",
        json!({"domain": "satellites", "filters": {"constellation": "martian"}}),
    ))
    .then_content(&json_tool_call(
        "earth.find_entities",
        json!({"domain": "weather"}),
    ))
    .then_content(&json_tool_call(
        "earth.find_entities",
        json!({"domain": "bgp", "filters": {"constellation": "gps"}}),
    ))
    .then_content("{\"type\": \"tool_call\", \"tool\": \"earth.find_entities\"")
    .then_content("still not JSON");
    let h = Harness::start(fake.model_config(NativeTools::Off)).await;
    let run_id = start_run(&h, Role::Operator, "diagnostic", "list satellites").await;
    let d = wait_run(&h, &run_id, settled).await;
    assert_eq!(d["run"]["status"], "failed");
    assert!(d["run"]["error"]
        .as_str()
        .unwrap()
        .contains("not a valid tool call"));
    let tools: Vec<&Value> = d["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step_type"] == "tool")
        .collect();
    assert_eq!(tools.len(), 3);
    for t in &tools {
        assert_eq!(t["status"], "failed");
        assert!(
            t["error"].as_str().unwrap().contains("invalid arguments"),
            "{t}"
        );
        assert!(t["output"].is_null());
    }
    assert!(tools[2]["error"]
        .as_str()
        .unwrap()
        .contains("does not apply to domain bgp"));
    let llm_failed = d["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step_type"] == "llm" && s["status"] == "failed")
        .count();
    assert_eq!(llm_failed, 2, "broken reply and its one retry");
    assert!(
        d["evidence"].as_array().unwrap().is_empty(),
        "no tool produced evidence"
    );
}

#[tokio::test]
async fn native_tool_fields_are_sent_as_configured() {
    let fake = FakeVendor::start().await;
    fake.then_content(&final_text("done"));
    let h = Harness::start(fake.model_config(NativeTools::On)).await;
    let run_id = start_run(&h, Role::Operator, "diagnostic", "nothing to do").await;
    wait_run(&h, &run_id, settled).await;
    let req = &fake.chat_requests()[0];
    assert_eq!(req["model"], "fake-chat-1");
    assert_eq!(req["tool_choice"], "auto");
    let tools = req["tools"].as_array().unwrap();
    let names: Vec<&str> = tools
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"earth.find_entities") && names.contains(&"web.search"),
        "{names:?}"
    );
    assert!(
        !names.contains(&"agents.apply_setting"),
        "write tools are never offered"
    );
    assert!(
        !names.contains(&"agents.propose_config"),
        "an operator may not propose"
    );
    let find = tools
        .iter()
        .find(|t| t["function"]["name"] == "earth.find_entities")
        .unwrap();
    assert_eq!(find["type"], "function");
    assert_eq!(
        find["function"]["parameters"]["required"],
        json!(["domain"])
    );
    assert!(
        find["function"]["parameters"]["properties"]["filters"]["properties"]["constellation"]
            ["enum"]
            .as_array()
            .unwrap()
            .contains(&json!("beidou"))
    );

    let off = FakeVendor::start().await;
    off.then_content(&final_text("done"));
    let h = Harness::start(off.model_config(NativeTools::Off)).await;
    let run_id = start_run(&h, Role::Operator, "diagnostic", "nothing to do").await;
    wait_run(&h, &run_id, settled).await;
    assert!(off.chat_requests()[0].get("tools").is_none());
}

#[tokio::test]
async fn a_provider_refusing_native_tools_is_answered_with_the_json_protocol() {
    let fake = FakeVendor::start().await;
    let refuse = |req: &Value| -> Option<(u16, Value)> {
        req.get("tools").map(|_| {
            (400, json!({"error": {"message": "'tools' is not supported by this model", "type": "invalid_request_error"}}))
        })
    };
    fake.then(move |req| refuse(req).unwrap())
        .then(|req| {
            assert!(req.get("tools").is_none());
            let call = json_tool_call("earth.find_entities", json!({"domain": "satellites", "filters": {"constellation": "beidou"}}));
            (200, completion_text(&call))
        })
        .then(|req| {
            let ids = result_ids(&last_tool_result(req).unwrap());
            (200, completion_text(&final_highlight("已找到并高亮 50 颗北斗卫星。", "satellites", &ids)))
        })
        .then(|req| {
            assert!(req.get("tools").is_none(), "auto mode remembers the refusal");
            (200, completion_text(r#"{"type":"final","summary":"已清除高亮。","result":{"actions":[{"type":"clear_highlight"}]}}"#))
        });
    let h = Harness::start(fake.model_config(NativeTools::Auto)).await;
    let resp = h.command("高亮所有北斗卫星").await;
    assert_eq!(highlighted(&resp).len(), 50);
    let reqs = fake.chat_requests();
    assert!(reqs[0]["tools"].is_array());
    let system = reqs[1]["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("Protocol: reply with exactly one JSON object"));
    let d = h.run(resp["run_id"].as_str().unwrap()).await;
    assert_eq!(d["steps"][0]["status"], "failed");
    assert!(d["steps"][0]["error"]
        .as_str()
        .unwrap()
        .contains("switching to the JSON tool-call protocol"));

    let resp = h.command("清除高亮").await;
    assert_eq!(resp["actions"], json!([{"type": "clear_highlight"}]));
}

#[tokio::test]
async fn web_search_not_configured_is_missing_data_and_the_command_still_works() {
    let fake = FakeVendor::start().await;
    fake.then_content(&json_tool_call(
        "web.search",
        json!({"query": "北斗 最新 发射"}),
    ))
    .then(|req| {
        let r = last_tool_result(req).unwrap();
        assert_eq!(r["configured"], false);
        (
            200,
            completion_text(&json_tool_call(
                "earth.find_entities",
                json!({"domain": "satellites", "filters": {"constellation": "beidou"}}),
            )),
        )
    })
    .then(|req| {
        let ids = result_ids(&last_tool_result(req).unwrap());
        (
            200,
            completion_text(&final_highlight(
                "已找到并高亮 50 颗北斗卫星。",
                "satellites",
                &ids,
            )),
        )
    });
    let h = Harness::start(fake.model_config(NativeTools::Off)).await;
    let resp = h.command("高亮最新发射的北斗卫星").await;
    assert_eq!(highlighted(&resp).len(), 50);
    let missing: Vec<&str> = resp["missing_data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        missing
            .iter()
            .any(|m| m.contains("web search is not configured")),
        "{missing:?}"
    );
    let d = h.run(resp["run_id"].as_str().unwrap()).await;
    let ws = find(&d["steps"], "name", "web.search");
    assert_eq!(ws["status"], "completed");
    assert_eq!(d["run"]["status"], "completed");
}

fn audio_form(bytes: Vec<u8>) -> Form {
    Form::new()
        .part(
            "file",
            Part::bytes(bytes)
                .file_name("command.webm")
                .mime_str("audio/webm")
                .unwrap(),
        )
        .text("language", "zh")
}

#[tokio::test]
async fn speech_without_asr_configured_is_a_clear_503() {
    let h = Harness::start(AgentsConfig::default()).await;
    let (_, body) = status_is(
        h.post_multipart(
            Role::Operator,
            "/speech/transcriptions",
            audio_form(vec![1, 2, 3]),
        )
        .await,
        StatusCode::SERVICE_UNAVAILABLE,
    );
    assert_eq!(body["error"]["code"], "asr_not_configured");
    assert_eq!(
        body["error"]["message"],
        "语音识别未配置 (speech recognition is not configured)"
    );
    // Text commands keep working.
    assert_eq!(highlighted(&h.command("高亮所有北斗卫星").await).len(), 50);
}

fn speech_config(fake: &FakeVendor, max_mb: u64) -> AgentsConfig {
    let mut cfg = AgentsConfig::default();
    cfg.speech.base_url = Some(fake.base_url.clone());
    cfg.speech.api_key = Some("sk-test-asr".into());
    cfg.speech.max_audio_size_mb = max_mb;
    cfg
}

#[tokio::test]
async fn a_transcription_is_returned_stored_and_shown_in_the_earth_command_run() {
    let fake = FakeVendor::start().await;
    fake.then_audio(
        200,
        json!({"task": "transcribe", "language": "chinese", "duration": 1.234, "text": "高亮所有北斗卫星",
               "segments": [{"id": 0, "start": 0.0, "end": 1.234, "text": "高亮所有北斗卫星", "avg_logprob": -0.12}]}),
    );
    let h = Harness::start(speech_config(&fake, 25)).await;
    let audio: Vec<u8> = (0..48_000u32).map(|i| (i % 251) as u8).collect();
    let (_, t) = status_is(
        h.post_multipart(
            Role::Operator,
            "/speech/transcriptions",
            audio_form(audio.clone()),
        )
        .await,
        StatusCode::OK,
    );
    assert_eq!(t["text"], "高亮所有北斗卫星");
    assert_eq!(t["provider"], "openai_compatible");
    assert_eq!(t["model"], "whisper-1");
    assert_eq!(t["duration_ms"], 1234);
    assert!((t["confidence"].as_f64().unwrap() - (-0.12f64).exp()).abs() < 1e-6);

    let got = &fake.audio_requests()[0];
    assert_eq!(got.file_bytes, audio);
    assert_eq!(got.file_name.as_deref(), Some("command.webm"));
    assert_eq!(got.file_content_type.as_deref(), Some("audio/webm"));
    assert_eq!(got.fields["model"], "whisper-1");
    assert_eq!(got.fields["language"], "zh");
    assert_eq!(got.fields["response_format"], "verbose_json");
    assert_eq!(got.authorization.as_deref(), Some("Bearer sk-test-asr"));

    let tid = t["metadata"]["transcription_id"].as_str().unwrap();
    let (_, resp) = status_is(
        h.post(
            Role::Operator,
            "/earth/command",
            json!({"input_text": t["text"], "source": "speech", "transcription_id": tid}),
        )
        .await,
        StatusCode::OK,
    );
    assert_eq!(highlighted(&resp).len(), 50);
    let d = h.run(resp["run_id"].as_str().unwrap()).await;
    assert_eq!(d["steps"][0]["step_type"], "transcription");
    assert_eq!(d["steps"][0]["output"]["text"], "高亮所有北斗卫星");
    assert_eq!(d["run"]["input"]["transcription_id"], tid);
    let ev = find(&d["evidence"], "evidence_type", "transcription");
    assert_eq!(ev["content"], "高亮所有北斗卫星");
    assert_eq!(ev["metadata"]["audio"]["size_bytes"], 48_000);
}

#[tokio::test]
async fn audio_over_the_size_limit_is_413_and_never_reaches_the_provider() {
    let fake = FakeVendor::start().await;
    let h = Harness::start(speech_config(&fake, 1)).await;
    let (status, body) = h
        .post_multipart(
            Role::Operator,
            "/speech/transcriptions",
            audio_form(vec![7u8; 1024 * 1024 + 200 * 1024]),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["error"]["code"], "audio_too_large");
    assert!(fake.audio_requests().is_empty());
}

#[tokio::test]
async fn a_failing_speech_provider_is_a_bad_gateway_error() {
    let fake = FakeVendor::start().await;
    fake.then_audio(500, json!({"error": {"message": "model overloaded"}}));
    let h = Harness::start(speech_config(&fake, 25)).await;
    let (status, body) = h
        .post_multipart(
            Role::Operator,
            "/speech/transcriptions",
            audio_form(vec![1; 100]),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error"]["code"], "asr_provider_error");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("model overloaded"));
}

// ---- proposals ----

/// A config_proposal run by `role` whose model proposes each of `drafts`
/// (arguments of agents.propose_config), then finishes.
async fn propose(h: &Harness, fake: &FakeVendor, role: Role, drafts: Vec<Value>) -> Value {
    for d in drafts {
        fake.then_content(&json_tool_call("agents.propose_config", d));
    }
    fake.then_content(&final_text("proposed"));
    let run_id = start_run(h, role, "config_proposal", "tune the BGP role prompt").await;
    wait_run(h, &run_id, settled).await
}

/// A harness on a fake model (native tools off) and a config_proposal
/// run by `role` that proposed each of `drafts` ([`propose`]): the model,
/// the harness and the settled run.
async fn proposed(role: Role, drafts: Vec<Value>) -> (FakeVendor, Harness, Value) {
    let fake = FakeVendor::start().await;
    let h = Harness::start(fake.model_config(NativeTools::Off)).await;
    let d = propose(&h, &fake, role, drafts).await;
    (fake, h, d)
}

fn prompt_draft(text: &str) -> Value {
    json!({"proposal_type": "ai_prompt", "target": {"prompt_key": "agents.roles.bgp"},
           "changes": {"text": text}, "rationale": "name the collectors we use"})
}

async fn prompt_text(h: &Harness, key: &str) -> (String, String) {
    let (_, body) = h.get(Role::Viewer, "/prompts").await;
    let p = body["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["key"] == key)
        .unwrap()
        .clone();
    (
        p["text"].as_str().unwrap().to_string(),
        p["source"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn a_normal_admin_cannot_auto_apply_and_must_confirm() {
    let (_fake, h, d) = proposed(
        Role::Admin,
        vec![prompt_draft("Role: BGP analyst. Use RIPE RIS rrc00.")],
    )
    .await;
    assert_eq!(d["run"]["status"], "waiting_approval");
    let p = &d["proposals"][0];
    assert_eq!(
        (p["status"].as_str(), p["risk_level"].as_str()),
        (Some("pending"), Some("low"))
    );
    assert_eq!(
        p["before_payload"]["text"],
        default_text("agents.roles.bgp").unwrap()
    );
    let id = p["id"].as_i64().unwrap();

    let (_, err) = status_is(
        h.proposal(Role::Admin, id, "apply", json!({})).await,
        StatusCode::FORBIDDEN,
    );
    assert_eq!(err["error"]["code"], "confirmation_required");
    let (_, list) = h.get(Role::Admin, "/proposals?status=pending").await;
    assert_eq!(
        list["proposals"][0]["policy_result"]["last_refusal"]["by"],
        "alice-admin"
    );
    assert_eq!(prompt_text(&h, "agents.roles.bgp").await.1, "default");

    let (status, _) = h
        .proposal(Role::Operator, id, "apply", json!({"confirm": true}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let (_, applied) = status_is(
        h.proposal(Role::Admin, id, "apply", json!({"confirm": true}))
            .await,
        StatusCode::OK,
    );
    assert_eq!(applied["status"], "applied");
    assert_eq!(applied["applied_by"], "alice-admin");
    assert_eq!(applied["policy_result"]["applied_mode"], "manual");
    assert_eq!(
        prompt_text(&h, "agents.roles.bgp").await,
        (
            "Role: BGP analyst. Use RIPE RIS rrc00.".to_string(),
            "override".to_string()
        )
    );
}

#[tokio::test]
async fn a_super_admin_applies_a_low_risk_proposal_without_confirmation() {
    let (_fake, h, d) = proposed(
        Role::SuperAdmin,
        vec![prompt_draft("Role: BGP analyst v2.")],
    )
    .await;
    let id = d["proposals"][0]["id"].as_i64().unwrap();
    // An empty body is `{"confirm": false}`.
    let resp = h
        .http
        .post(format!("{}/proposals/{id}/apply", h.base))
        .bearer_auth(&h.tokens[&Role::SuperAdmin])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let applied: Value = resp.json().await.unwrap();
    assert_eq!(applied["status"], "applied");
    assert_eq!(applied["policy_result"]["applied_mode"], "auto");
    assert!(applied["applied_at"].is_string());
    assert_eq!(
        prompt_text(&h, "agents.roles.bgp").await.0,
        "Role: BGP analyst v2."
    );
    let (_, err) = status_is(
        h.proposal(Role::SuperAdmin, id, "apply", json!({})).await,
        StatusCode::CONFLICT,
    );
    assert_eq!(err["error"]["code"], "proposal_not_pending");
}

#[tokio::test]
async fn high_risk_proposals_always_need_manual_confirmation() {
    let fake = FakeVendor::start().await;
    let h = Harness::start(fake.model_config(NativeTools::Off)).await;
    let mut draft = prompt_draft("Role: BGP analyst, high stakes.");
    draft["risk_level"] = json!("high");
    let d = propose(&h, &fake, Role::SuperAdmin, vec![draft]).await;
    let id = d["proposals"][0]["id"].as_i64().unwrap();
    assert_eq!(d["proposals"][0]["risk_level"], "high");
    let (_, err) = status_is(
        h.proposal(Role::SuperAdmin, id, "apply", json!({})).await,
        StatusCode::FORBIDDEN,
    );
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("high-risk"));
    let _ = status_is(
        h.proposal(Role::SuperAdmin, id, "apply", json!({"confirm": true}))
            .await,
        StatusCode::OK,
    );
}

#[tokio::test]
async fn secret_field_and_schema_breaking_proposals_are_rejected_and_the_secret_is_not_stored() {
    let (_fake, h, d) = proposed(Role::Admin, vec![
            json!({"proposal_type": "datasource_config", "target": {"datasource_id": "celestrak_active"},
                   "changes": {"endpoint": "https://celestrak.org/NORAD/elements/active.txt", "api_key": "sk-live-123"},
                   "rationale": "use the live feed"}),
            json!({"proposal_type": "datasource_config", "target": {"datasource_id": "celestrak_active"},
                   "changes": {"refresh_interval_seconds": 1}, "rationale": "refresh constantly"}),
        ]).await;
    let props = d["proposals"].as_array().unwrap();
    assert_eq!(props.len(), 2);
    assert_eq!(props[0]["status"], "rejected");
    assert!(props[0]["error"]
        .as_str()
        .unwrap()
        .contains("secret fields: api_key"));
    assert_eq!(props[0]["after_payload"]["api_key"], "***");
    assert_eq!(props[1]["status"], "rejected");
    assert!(
        props[1]["error"]
            .as_str()
            .unwrap()
            .contains("refresh_interval_seconds"),
        "{}",
        props[1]
    );
    assert!(
        !d.to_string().contains("sk-live-123"),
        "the secret was stored: {d}"
    );
    let tool_steps: Vec<&Value> = d["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step_type"] == "tool")
        .collect();
    assert!(tool_steps.iter().all(|s| s["status"] == "failed"));
    assert!(tool_steps[0]["error"]
        .as_str()
        .unwrap()
        .contains("rejected by policy"));

    let id = props[0]["id"].as_i64().unwrap();
    let (_, err) = status_is(
        h.proposal(Role::SuperAdmin, id, "apply", json!({"confirm": true}))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    assert_eq!(err["error"]["code"], "proposal_rejected");
}

#[tokio::test]
async fn a_proposal_whose_target_changed_fails_with_the_error_saved() {
    let (_fake, h, d) = proposed(
        Role::Admin,
        vec![prompt_draft("first"), prompt_draft("second")],
    )
    .await;
    let ids: Vec<i64> = d["proposals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_i64().unwrap())
        .collect();
    let (status, _) = h
        .post(
            Role::SuperAdmin,
            &format!("/proposals/{}/apply", ids[0]),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, err) = status_is(
        h.post(
            Role::SuperAdmin,
            &format!("/proposals/{}/apply", ids[1]),
            json!({}),
        )
        .await,
        StatusCode::CONFLICT,
    );
    assert_eq!(err["error"]["code"], "proposal_apply_failed");
    let (_, list) = h.get(Role::Admin, "/proposals?status=failed").await;
    let failed = &list["proposals"][0];
    assert_eq!(failed["id"], ids[1]);
    assert!(failed["error"]
        .as_str()
        .unwrap()
        .contains("changed after the proposal was made"));
    assert_eq!(prompt_text(&h, "agents.roles.bgp").await.0, "first");
}

#[tokio::test]
async fn write_tools_are_denied_inside_runs_and_auto_apply_needs_a_super_admin_run() {
    let fake = FakeVendor::start().await;
    let mut cfg = fake.model_config(NativeTools::Off);
    cfg.proposals.auto_apply_low_risk = true;
    let h = Harness::start(cfg).await;

    fake.then_content(&json_tool_call(
        "agents.apply_setting",
        json!({"proposal_id": 1, "mode": "auto"}),
    ));
    let d = propose(
        &h,
        &fake,
        Role::SuperAdmin,
        vec![prompt_draft("auto applied")],
    )
    .await;
    let denied = find(&d["steps"], "name", "agents.apply_setting");
    assert_eq!(denied["status"], "failed");
    assert!(denied["error"]
        .as_str()
        .unwrap()
        .contains("write tools run only while an administrator applies"));
    let auto = find(&d["steps"], "name", "proposal.auto_apply");
    assert_eq!(
        (auto["step_type"].as_str(), auto["status"].as_str()),
        (Some("policy"), Some("completed"))
    );
    assert_eq!(d["proposals"][0]["status"], "applied");
    assert_eq!(d["proposals"][0]["applied_by"], "root");
    assert_eq!(d["run"]["status"], "completed");
    assert_eq!(prompt_text(&h, "agents.roles.bgp").await.0, "auto applied");

    let d = propose(&h, &fake, Role::Admin, vec![prompt_draft("admin run")]).await;
    assert_eq!(
        d["proposals"][0]["status"], "pending",
        "an admin's run is never auto-applied"
    );
    assert_eq!(d["run"]["status"], "waiting_approval");
}

#[tokio::test]
async fn prompts_and_tools_are_listed_with_their_contracts() {
    let h = Harness::start(AgentsConfig::default()).await;
    let (_, body) = status_is(h.get(Role::Viewer, "/prompts").await, StatusCode::OK);
    let keys = strs(&body["prompts"], "key");
    assert_eq!(keys, PROMPT_KEYS);
    let (_, body) = h.get(Role::Viewer, "/tools").await;
    for t in body["tools"].as_array().unwrap() {
        assert!(
            t["input_schema"].is_object() && t["output_schema"].is_object(),
            "{t}"
        );
        assert!(t["permission"].is_string() && t["description"].is_string());
    }
    let level = |name: &str| {
        body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap()["side_effect_level"]
            .clone()
    };
    assert_eq!(level("earth.find_entities"), "read");
    assert_eq!(level("agents.propose_config"), "proposal");
    assert_eq!(level("agents.apply_setting"), "write");
}
