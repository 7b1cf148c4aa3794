//! `POST /api/v1/agents/earth/command` over real HTTP on the shipped real
//! data (seed 000 "Earth Command", "Earth Action Plan", "Safety Rules"):
//! the deterministic resolver, and the model path against a fake
//! OpenAI-compatible vendor.

mod agents_support;

use std::collections::HashSet;

use agents_support::*;
use benchlink_testkit::find;
use benchlink_testkit::status_is;
use cloud_registry::agents::config::{AgentsConfig, NativeTools};
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use shared_protocol::api::Role;

fn set(v: &[String]) -> HashSet<String> {
    v.iter().cloned().collect()
}

fn action_types(resp: &Value) -> Vec<String> {
    resp["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["type"].as_str().unwrap().to_string())
        .collect()
}

fn missing(resp: &Value) -> String {
    resp["missing_data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn highlight_all_beidou_returns_every_beidou_norad_id_of_the_tle_file_and_no_other() {
    let h = Harness::start(AgentsConfig::default()).await;
    let expected = tle_norad_ids("BEIDOU");
    assert_eq!(expected.len(), 50);
    let resp = h.command("高亮所有北斗卫星").await;

    assert_eq!(
        action_types(&resp),
        ["show_layer", "highlight_entities", "open_result_panel"]
    );
    assert_eq!(
        resp["actions"][0],
        json!({"type": "show_layer", "layer": "satellites", "enabled": true})
    );
    assert_eq!(resp["actions"][1]["domain"], "satellites");
    assert_eq!(set(&highlighted(&resp)), set(&expected));
    assert_eq!(highlighted(&resp).len(), 50, "no duplicates");
    assert_eq!(resp["summary"], "已找到并高亮 50 颗北斗卫星。");
    let panel = &resp["actions"][2];
    assert_eq!(panel["items"].as_array().unwrap().len(), 20);
    assert!(panel["title"].as_str().unwrap().contains("50"), "{panel}");
    assert_eq!(resp["matched_entities"].as_array().unwrap().len(), 50);
    assert!(resp["run_id"].as_str().unwrap().starts_with("agent_"));
    assert_eq!(resp["clarification_needed"], false);
}

#[tokio::test]
async fn mainland_china_compute_centers_exclude_taiwan_and_hong_kong() {
    let h = Harness::start(AgentsConfig::default()).await;
    // Expected rows, straight from the CSVs.
    let mut top500_cn = Vec::new();
    let mut top500_tw = Vec::new();
    let mut rdr = csv::Reader::from_path(data_file("compute_centers/top500_2025-06.csv")).unwrap();
    let headers = rdr.headers().unwrap().clone();
    let country = headers.iter().position(|c| c == "Country").unwrap();
    let system = headers.iter().position(|c| c == "System ID").unwrap();
    for rec in rdr.records() {
        let rec = rec.unwrap();
        let id = format!("compute_center:top500:{}", &rec[system]);
        match &rec[country] {
            "China" => top500_cn.push(id),
            "Taiwan" => top500_tw.push(id),
            _ => {}
        }
    }
    let mut rdr =
        csv::Reader::from_path(data_file("compute_centers/epoch_gpu_clusters.csv")).unwrap();
    let country = rdr
        .headers()
        .unwrap()
        .iter()
        .position(|c| c == "Country")
        .unwrap();
    let epoch_cn = rdr
        .records()
        .filter(|r| &r.as_ref().unwrap()[country] == "China")
        .count();
    let mut rdr =
        csv::Reader::from_path(data_file("compute_centers/epoch_frontier_data_centers.csv"))
            .unwrap();
    let address = rdr
        .headers()
        .unwrap()
        .iter()
        .position(|c| c == "Address")
        .unwrap();
    let frontier_cn = rdr
        .records()
        .filter(|r| {
            r.as_ref().unwrap()[address]
                .split(',')
                .any(|part| part.trim() == "China")
        })
        .count();
    assert_eq!(
        (top500_cn.len(), top500_tw.len(), epoch_cn, frontier_cn),
        (47, 8, 253, 1)
    );

    let resp = h.command("中国大陆的算力中心").await;
    assert_eq!(resp["actions"][0]["layer"], "compute_centers");
    let ids = set(&highlighted(&resp));
    assert_eq!(ids.len(), top500_cn.len() + epoch_cn + frontier_cn);
    for id in &top500_cn {
        assert!(ids.contains(id), "mainland TOP500 system {id} missing");
    }
    for id in &top500_tw {
        assert!(h.svc.catalog().contains(id), "{id} is loaded");
        assert!(
            !ids.contains(id),
            "Taiwan system {id} highlighted as mainland China"
        );
    }
    let hk = h.command("香港的算力中心").await;
    let hk_ids = highlighted(&hk);
    assert_eq!(hk_ids.len(), 4, "{}", hk["summary"]);
    assert!(
        hk_ids.iter().all(|id| !ids.contains(id)),
        "Hong Kong rows in the mainland set"
    );
    for e in resp["matched_entities"].as_array().unwrap() {
        assert_eq!(e["properties"]["country_code"], "CN", "{e}");
    }
    assert!(resp["summary"]
        .as_str()
        .unwrap()
        .contains("中国大陆的算力中心"));
    // Field granularity: most rows only say "China" and sit at its centroid.
    assert!(missing(&resp).contains("centroid"), "{}", missing(&resp));
}

#[tokio::test]
async fn english_commands_get_english_summaries() {
    let h = Harness::start(AgentsConfig::default()).await;
    let resp = h.command("highlight all GPS satellites").await;
    let expected = tle_norad_ids("NAVSTAR");
    assert_eq!(set(&highlighted(&resp)), set(&expected));
    assert_eq!(
        resp["summary"],
        format!("Found and highlighted {} GPS satellites.", expected.len())
    );
}

#[tokio::test]
async fn empty_and_nonsense_commands_ask_for_clarification_and_are_still_runs() {
    let h = Harness::start(AgentsConfig::default()).await;
    for text in ["", "   ", "asdf qwer zxcv", "今天天气怎么样", "高亮"] {
        let resp = h.command(text).await;
        assert_eq!(resp["clarification_needed"], true, "{text}: {resp}");
        assert!(resp["actions"].as_array().unwrap().is_empty(), "{text}");
        assert!(!resp["summary"].as_str().unwrap().is_empty());
        let run = h.run(resp["run_id"].as_str().unwrap()).await;
        assert_eq!(run["run"]["status"], "completed");
        assert_eq!(run["run"]["run_type"], "earth_command");
    }
    let zh = h.command("今天天气怎么样").await;
    assert!(zh["summary"].as_str().unwrap().contains("请说明"));
    let en = h.command("asdf qwer zxcv").await;
    assert!(en["summary"]
        .as_str()
        .unwrap()
        .starts_with("I could not tell"));
}

#[tokio::test]
async fn more_than_500_matches_are_cut_at_500_with_a_note() {
    let h = Harness::start(AgentsConfig::default()).await;
    let starlink = tle_norad_ids("STARLINK");
    assert!(starlink.len() > 500);
    let resp = h.command("高亮所有星链卫星").await;
    let ids = highlighted(&resp);
    assert_eq!(ids.len(), 500);
    assert!(set(&ids).is_subset(&set(&starlink)));
    let summary = resp["summary"].as_str().unwrap();
    assert!(
        summary.contains(&starlink.len().to_string()) && summary.contains("500"),
        "{summary}"
    );
    assert!(
        missing(&resp).contains("only the first 500"),
        "{}",
        missing(&resp)
    );
}

#[tokio::test]
async fn focus_on_a_region_and_on_one_satellite_uses_real_coordinates() {
    let h = Harness::start(AgentsConfig::default()).await;
    let resp = h.command("聚焦中国大陆的算力中心").await;
    let focus = find(&resp["actions"], "type", "focus_view");
    assert_eq!(focus["region"], "CN");
    assert!((focus["lat"].as_f64().unwrap() - 35.0).abs() < 10.0);

    let resp = h.command("聚焦国际空间站").await;
    let focus = find(&resp["actions"], "type", "focus_view");
    assert_eq!(focus["entity_id"], "satellite:norad:25544");
    let (lat, lon) = (
        focus["lat"].as_f64().unwrap(),
        focus["lon"].as_f64().unwrap(),
    );
    // The ISS orbit is inclined 51.6°: an SGP4 position can't be further north or south.
    assert!(lat.abs() <= 52.0 && lon.abs() <= 180.0, "{lat} {lon}");
    assert!(
        missing(&resp).contains("SGP4"),
        "stale TLE note: {}",
        missing(&resp)
    );
}

#[tokio::test]
async fn filter_hide_and_clear_commands() {
    let h = Harness::start(AgentsConfig::default()).await;
    let resp = h.command("筛选日本的超算").await;
    let f = find(&resp["actions"], "type", "filter_entities");
    assert_eq!(f["domain"], "compute_centers");
    assert_eq!(
        f["filters"],
        json!({"country": "JP", "site_type": "supercomputer"})
    );
    assert!(resp["summary"].as_str().unwrap().starts_with("已筛选出"));

    let resp = h.command("隐藏卫星图层").await;
    assert_eq!(
        resp["actions"],
        json!([{"type": "show_layer", "layer": "satellites", "enabled": false}])
    );

    let resp = h.command("清除高亮").await;
    assert_eq!(resp["actions"], json!([{"type": "clear_highlight"}]));
    let resp = h.command("clear the satellite highlights").await;
    assert_eq!(
        resp["actions"],
        json!([{"type": "clear_highlight", "domain": "satellites"}])
    );
}

#[tokio::test]
async fn news_without_a_source_or_web_search_is_missing_data_not_an_error() {
    let h = Harness::start(AgentsConfig::default()).await;
    let resp = h.command("显示中国的新闻").await;
    let m = missing(&resp);
    assert!(m.contains("no data source configured for news"), "{m}");
    assert!(m.contains("web search is not configured"), "{m}");
    assert_eq!(resp["clarification_needed"], false);
}

#[tokio::test]
async fn a_command_run_records_tool_policy_and_action_steps_and_hashed_entity_evidence() {
    let h = Harness::start(AgentsConfig::default()).await;
    let resp = h.command("高亮所有北斗卫星").await;
    let detail = h.run(resp["run_id"].as_str().unwrap()).await;
    assert_eq!(
        steps(&detail),
        vec![
            (
                "tool".into(),
                "earth.find_entities".into(),
                "completed".into()
            ),
            (
                "policy".into(),
                "earth.plan_validation".into(),
                "completed".into()
            ),
            (
                "action".into(),
                "earth.action_plan".into(),
                "completed".into()
            ),
        ]
    );
    for (i, s) in detail["steps"].as_array().unwrap().iter().enumerate() {
        assert_eq!(s["step_index"], i);
        assert!(s["duration_ms"].is_u64());
    }
    assert_eq!(
        detail["steps"][0]["input"]["arguments"]["filters"],
        json!({"constellation": "beidou"})
    );
    let ev = &detail["evidence"][0];
    assert_eq!(ev["evidence_type"], "entity_match");
    assert_eq!(ev["step_id"], detail["steps"][0]["id"]);
    let content = ev["content"].as_str().unwrap();
    assert_eq!(
        ev["content_hash"],
        hex::encode(Sha256::digest(content.as_bytes()))
    );
    for id in tle_norad_ids("BEIDOU") {
        assert!(content.contains(&id), "{id} missing from evidence");
    }
    assert_eq!(detail["run"]["status"], "completed");
    assert_eq!(detail["run"]["result_json"]["summary"], resp["summary"]);
    assert_eq!(detail["steps"][2]["output"]["actions"], resp["actions"]);
}

/// The first whole number in `text` (the count a summary states).
fn first_number(text: &str) -> usize {
    let digits: String = text
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number in {text:?}"))
}

/// The shipped config has no vessels source: asking for vessels says so,
/// instead of claiming that none were found.
#[tokio::test]
async fn vessels_without_a_configured_source_say_the_source_is_missing() {
    let h = Harness::start(AgentsConfig::default()).await;
    let resp = h.command("显示新加坡附近的船只").await;
    let summary = resp["summary"].as_str().unwrap();
    assert!(
        summary.contains("未配置船舶数据源") && !summary.contains("未找到"),
        "{summary}"
    );
    let resp = h.command("Show vessels in Singapore").await;
    let summary = resp["summary"].as_str().unwrap();
    assert!(
        summary.contains("No vessels data source is configured") && !summary.contains("were found"),
        "{summary}"
    );
    assert!(missing(&resp).contains("no data source configured for vessels"));
    assert!(resp["confidence"].as_f64().unwrap() <= 0.3, "{resp}");
}

/// A well-known name is looked up by its catalogue spelling, which the
/// summary never shows: it names the entity as the catalogue displays it.
#[tokio::test]
async fn a_summary_names_the_iss_by_its_display_name_not_the_internal_alias() {
    let h = Harness::start(AgentsConfig::default()).await;
    for text in ["高亮国际空间站", "highlight the ISS", "高亮 ISS"] {
        let resp = h.command(text).await;
        let summary = resp["summary"].as_str().unwrap();
        assert!(!summary.contains("iss (zarya)"), "{text}: {summary}");
        assert!(summary.contains("ISS (ZARYA)"), "{text}: {summary}");
        assert_eq!(highlighted(&resp), ["satellite:norad:25544"], "{text}");
    }
}

/// A filter's `matched_entities` are the entities it selects, as many as
/// its summary says (or, past the listing limit, as many as it says are
/// listed).
#[tokio::test]
async fn a_filters_count_agrees_with_its_matched_entities() {
    let h = Harness::start(AgentsConfig::default()).await;
    for text in [
        "筛选中国的超算",
        "filter GPU clusters in China",
        "筛选新加坡的登陆点",
    ] {
        let resp = h.command(text).await;
        let summary = resp["summary"].as_str().unwrap();
        let matched = resp["matched_entities"].as_array().unwrap();
        assert!(first_number(summary) > 0, "{text}: {summary}");
        assert_eq!(matched.len(), first_number(summary), "{text}: {summary}");
        let f = find(&resp["actions"], "type", "filter_entities");
        assert!(
            matched.iter().all(|e| e["domain"] == f["domain"]),
            "{text}: {resp}"
        );
    }
    let resp = h.command("筛选星链卫星").await;
    let summary = resp["summary"].as_str().unwrap();
    let matched = resp["matched_entities"].as_array().unwrap().len();
    assert!(first_number(summary) > matched, "{summary}");
    assert_eq!(matched, 500);
    assert!(summary.contains("列出前 500 颗"), "{summary}");
}

/// A model's `filter_entities` plan, with no highlight, still lists what
/// the filter selects.
#[tokio::test]
async fn a_models_filter_plan_lists_the_entities_it_selects() {
    let fake = FakeVendor::start().await;
    fake.then(|_| {
        let plan = json!({"type": "final", "summary": "已筛选出日本的超算中心。", "result": {"actions": [
            {"type": "show_layer", "layer": "compute_centers", "enabled": true},
            {"type": "filter_entities", "domain": "compute_centers",
             "filters": {"country": "JP", "site_type": "supercomputer"}}
        ]}});
        (200, completion_text(&plan.to_string()))
    });
    let h = Harness::start(fake.model_config(NativeTools::Off)).await;
    let resp = h.command("筛选日本的超算").await;
    let matched = resp["matched_entities"].as_array().unwrap();
    assert!(!matched.is_empty(), "{resp}");
    for e in matched {
        assert_eq!(e["domain"], "compute_centers", "{e}");
        assert_eq!(e["properties"]["country_code"], "JP", "{e}");
        assert_eq!(e["properties"]["site_type"], "supercomputer", "{e}");
    }
    let deterministic = Harness::start(AgentsConfig::default())
        .await
        .command("筛选日本的超算")
        .await;
    assert_eq!(
        matched.len(),
        first_number(deterministic["summary"].as_str().unwrap())
    );
}

// ---- the model path, against a fake OpenAI-compatible vendor ----

#[tokio::test]
async fn a_model_that_calls_tools_natively_gets_the_beidou_plan() {
    let fake = FakeVendor::start().await;
    fake.then(|req| {
        assert!(req["tools"].is_array());
        (
            200,
            completion_tool_calls(&[(
                "earth.find_entities",
                json!({"domain": "satellites",
            "filters": {"constellation": "beidou"}, "limit": 500}),
            )]),
        )
    })
    .then(|req| {
        let ids = result_ids(&last_tool_result(req).expect("tool result in the conversation"));
        (
            200,
            completion_text(&final_highlight(
                "已找到并高亮 50 颗北斗卫星。",
                "satellites",
                &ids,
            )),
        )
    });
    let h = Harness::start(fake.model_config(NativeTools::On)).await;
    let resp = h.command("高亮所有北斗卫星").await;
    assert_eq!(set(&highlighted(&resp)), set(&tle_norad_ids("BEIDOU")));
    assert_eq!(resp["summary"], "已找到并高亮 50 颗北斗卫星。");
    let detail = h.run(resp["run_id"].as_str().unwrap()).await;
    let kinds: Vec<String> = steps(&detail)
        .into_iter()
        .map(|s| format!("{}:{}", s.0, s.2))
        .collect();
    assert_eq!(
        kinds,
        [
            "llm:completed",
            "tool:completed",
            "llm:completed",
            "policy:completed",
            "action:completed"
        ]
    );
    assert_eq!(detail["steps"][0]["output"]["usage"]["total_tokens"], 720);
    assert_eq!(detail["run"]["model"], "fake-chat-1");
    assert_eq!(fake.chat_auth()[0].as_deref(), Some("Bearer sk-test-chat"));
    // The tool result went back as a `tool` message answering call_0.
    let second = &fake.chat_requests()[1];
    let tool_msg = find(&second["messages"], "role", "tool");
    assert_eq!(tool_msg["tool_call_id"], "call_0");
}

#[tokio::test]
async fn a_model_that_only_speaks_json_tool_calls_works_through_the_json_protocol() {
    let fake = FakeVendor::start().await;
    fake.then(|req| {
        assert!(req.get("tools").is_none(), "native tools are off");
        let system = req["messages"][0]["content"].as_str().unwrap();
        assert!(
            system.contains("earth.find_entities") && system.contains("\"type\": \"tool_call\"")
        );
        let call = json_tool_call(
            "earth.find_entities",
            json!({"domain": "compute_centers", "filters": {"country": "中国大陆"}, "limit": 500}),
        );
        (
            200,
            completion_text(&format!("Let me search.\n```json\n{call}\n```")),
        )
    })
    .then(|req| {
        let ids = result_ids(&last_tool_result(req).unwrap());
        (
            200,
            completion_text(&final_highlight(
                "已高亮中国大陆的算力中心。",
                "compute_centers",
                &ids,
            )),
        )
    });
    let h = Harness::start(fake.model_config(NativeTools::Off)).await;
    let resp = h.command("中国大陆的算力中心").await;
    let ids = highlighted(&resp);
    assert_eq!(ids.len(), 301);
    assert!(ids.iter().all(|id| id.starts_with("compute_center:")));
    assert!(resp["matched_entities"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["country"] == "China"));
}

#[tokio::test]
async fn broken_json_is_retried_once_with_the_error_then_the_resolver_answers() {
    let fake = FakeVendor::start().await;
    fake.then_content(
        "{\"type\": \"tool_call\", \"tool\": \"earth.find_entities\", \"arguments\": {\"domain\": ",
    )
    .then_content("Sure! I will highlight them now.");
    let h = Harness::start(fake.model_config(NativeTools::Off)).await;
    let resp = h.command("高亮所有北斗卫星").await;
    // The retry carried the parse error back to the model.
    let second = &fake.chat_requests()[1];
    let last = second["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap();
    assert!(
        last.contains("invalid tool call") && last.contains("No tool was run"),
        "{last}"
    );
    // Fallback: the deterministic plan, with the model failure noted.
    assert_eq!(set(&highlighted(&resp)), set(&tle_norad_ids("BEIDOU")));
    assert!(
        missing(&resp).contains("not a valid tool call"),
        "{}",
        missing(&resp)
    );
    let detail = h.run(resp["run_id"].as_str().unwrap()).await;
    let s = steps(&detail);
    assert_eq!(
        s[0],
        ("llm".into(), "chat.completions".into(), "failed".into())
    );
    assert_eq!(
        s[1],
        ("llm".into(), "chat.completions".into(), "failed".into())
    );
    assert!(detail["steps"][0]["error"]
        .as_str()
        .unwrap()
        .contains("invalid tool call"));
    assert_eq!(
        s[2].0, "tool",
        "the resolver's query, not a model tool call"
    );
    assert!(detail["run"]["error"]
        .as_str()
        .unwrap()
        .contains("valid tool call"));
}

#[tokio::test]
async fn invented_entity_ids_are_dropped_and_noted() {
    let fake = FakeVendor::start().await;
    fake.then(|_| {
        let call = json_tool_call(
            "earth.find_entities",
            json!({"domain": "satellites", "filters": {"constellation": "beidou"}}),
        );
        (200, completion_text(&call))
    })
    .then(|req| {
        let mut ids = result_ids(&last_tool_result(req).unwrap());
        ids.truncate(3);
        ids.push("satellite:norad:99999999".into());
        ids.push("compute_center:top500:made-up".into());
        (
            200,
            completion_text(&final_highlight("已高亮北斗卫星。", "satellites", &ids)),
        )
    });
    let h = Harness::start(fake.model_config(NativeTools::Off)).await;
    let resp = h.command("高亮三颗北斗卫星").await;
    let ids = highlighted(&resp);
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|id| tle_norad_ids("BEIDOU").contains(id)));
    let m = missing(&resp);
    assert!(
        m.contains("satellite:norad:99999999") && m.contains("does not know"),
        "{m}"
    );
    assert!(resp["confidence"].as_f64().unwrap() <= 0.5);
    let detail = h.run(resp["run_id"].as_str().unwrap()).await;
    let policy = find(&detail["steps"], "step_type", "policy");
    assert_eq!(policy["output"]["rejected_entity_id_count"], 2);
}

#[tokio::test]
async fn a_model_calling_an_unregistered_tool_gets_a_failed_step_and_nothing_runs() {
    let fake = FakeVendor::start().await;
    fake.then_content(&json_tool_call("shell.exec", json!({"cmd": "rm -rf /"})))
        .then(|req| {
            let last = req["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_string();
            assert!(last.starts_with("TOOL_ERROR shell.exec"), "{last}");
            (200, completion_text(r#"{"type":"final","summary":"无法执行该操作。","result":{"actions":[],"clarification_needed":true}}"#))
        });
    let h = Harness::start(fake.model_config(NativeTools::Off)).await;
    let resp = h.command("执行 rm -rf").await;
    assert_eq!(resp["clarification_needed"], true);
    let detail = h.run(resp["run_id"].as_str().unwrap()).await;
    let tool = find(&detail["steps"], "step_type", "tool");
    assert_eq!(tool["name"], "shell.exec");
    assert_eq!(tool["status"], "failed");
    assert!(tool["error"].as_str().unwrap().contains("not registered"));
    assert!(tool["output"].is_null());
    assert!(detail["evidence"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn a_model_that_exceeds_the_tool_step_limit_ends_with_a_partial_plan_and_a_clear_error() {
    let fake = FakeVendor::start().await;
    fake.always(|_| {
        (
            200,
            completion_tool_calls(&[(
                "earth.find_entities",
                json!({"domain": "satellites",
            "filters": {"constellation": "beidou"}}),
            )]),
        )
    });
    let h = Harness::start(fake.model_config(NativeTools::On)).await;
    let resp = h.command("高亮所有北斗卫星").await;
    let detail = h.run(resp["run_id"].as_str().unwrap()).await;
    let s = steps(&detail);
    let tool_steps = s.iter().filter(|x| x.0 == "tool").count();
    assert_eq!(tool_steps, 8, "{s:?}");
    let limit = find(&detail["steps"], "name", "tool_step_limit");
    assert_eq!(limit["status"], "failed");
    assert!(limit["error"].as_str().unwrap().contains("limit of 8"));
    assert!(detail["run"]["error"]
        .as_str()
        .unwrap()
        .contains("tool step limit of 8"));
    assert!(missing(&resp).contains("tool step limit of 8"));
    // Partial plan: the BeiDou ids the model's own queries found.
    assert_eq!(set(&highlighted(&resp)), set(&tle_norad_ids("BEIDOU")));
    // Eight calls ran tools; the ninth asked for one more and was refused.
    assert_eq!(fake.chat_requests().len(), 9);
}

#[tokio::test]
async fn unsafe_text_and_css_from_the_model_never_reach_the_client() {
    let fake = FakeVendor::start().await;
    fake.then(|_| {
        let plan = json!({"type": "final", "summary": "<script>alert(1)</script>", "result": {"actions": [
            {"type": "highlight_entities", "domain": "satellites", "entity_ids": ["satellite:norad:25544"],
             "style": {"color": "red; background: url(http://evil.example/x.png)"}, "reason": "javascript:alert(1)"},
            {"type": "open_result_panel", "title": "a { color: red }", "items": [
                {"entity_id": "satellite:norad:25544", "label": "<img src=x onerror=alert(1)>"}]},
            {"type": "focus_view", "lat": 123.0, "lon": 500.0},
            {"type": "run_javascript", "code": "alert(1)"}
        ]}});
        (200, completion_text(&plan.to_string()))
    });
    let h = Harness::start(fake.model_config(NativeTools::Off)).await;
    let resp = h.command("高亮国际空间站").await;
    let text = resp.to_string().to_lowercase();
    for bad in [
        "<script",
        "javascript:",
        "http://",
        "url(",
        "<img",
        "{ color",
    ] {
        assert!(!text.contains(bad), "`{bad}` leaked: {resp}");
    }
    assert_eq!(
        action_types(&resp),
        ["highlight_entities", "open_result_panel"]
    );
    assert_eq!(resp["actions"][0]["style"]["color"], "#7dd3fc");
    assert_eq!(resp["actions"][1]["items"][0]["label"], "ISS (ZARYA)");
    assert_eq!(resp["summary"], "已高亮 1 个对象。");
    let m = missing(&resp);
    assert!(
        m.contains("focus_view") && m.contains("not an allowed action"),
        "{m}"
    );
}

#[tokio::test]
async fn a_speech_command_without_a_known_transcription_is_refused_before_any_run() {
    let h = Harness::start(AgentsConfig::default()).await;
    let _ = status_is(
        h.post(
            Role::Operator,
            "/earth/command",
            json!({"input_text": "", "source": "speech", "transcription_id": "tr_missing"}),
        )
        .await,
        StatusCode::NOT_FOUND,
    );
    let (_, runs) = h.get(Role::Viewer, "/runs").await;
    assert!(runs["runs"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn opening_the_cables_layer_only_turns_it_on() {
    let h = Harness::start(AgentsConfig::default()).await;
    for text in ["打开海缆图层", "显示海缆图层", "show the cables layer"] {
        let resp = h.command(text).await;
        assert_eq!(
            resp["actions"],
            json!([{"type": "show_layer", "layer": "cables", "enabled": true}]),
            "{text}: {resp}"
        );
        assert!(highlighted(&resp).is_empty(), "{text}");
        assert_eq!(resp["clarification_needed"], false, "{text}");
    }
    // A real filter still highlights.
    let resp = h.command("显示中国的海缆").await;
    assert_eq!(
        action_types(&resp),
        ["show_layer", "highlight_entities", "open_result_panel"],
        "{resp}"
    );
    let ids = highlighted(&resp);
    assert!(!ids.is_empty() && ids.len() < 100, "{} cables", ids.len());
}

#[tokio::test]
async fn empty_matches_name_the_source_that_lacks_the_rows() {
    use cloud_registry::agents::earth::entities::{EarthDataConfig, EntityCatalog};
    let dir = tempfile::tempdir().unwrap();
    // The shipped TLE file without its Starlink sets.
    let text =
        std::fs::read_to_string(data_file("satellites/celestrak_active_2020-10-26.txt")).unwrap();
    let lines: Vec<&str> = text.split("\r\n").collect();
    let mut kept = String::new();
    for set in lines.chunks(3) {
        if set.len() == 3 && !set[0].starts_with("STARLINK") {
            kept.push_str(&set.join("\r\n"));
            kept.push_str("\r\n");
        }
    }
    let tle = dir.path().join("no-starlink.txt");
    std::fs::write(&tle, kept).unwrap();
    let cfg = EarthDataConfig {
        satellites_tle: vec![tle],
        top500_csv: Some(data_file("compute_centers/top500_2025-06.csv")),
        ..EarthDataConfig::default()
    };
    let catalog = std::sync::Arc::new(EntityCatalog::load(&cfg).unwrap());
    let h = Harness::start_with_catalog(AgentsConfig::default(), catalog).await;

    let resp = h.command("starlink").await;
    assert!(highlighted(&resp).is_empty(), "{resp}");
    let notes = missing(&resp);
    assert!(
        notes.contains("satellites source (CelesTrak TLE no-starlink.txt) has no rows")
            && notes.contains("constellation = starlink"),
        "{notes}"
    );

    // TOP500 alone has no Hong Kong rows.
    let resp = h.command("香港的算力中心").await;
    assert!(highlighted(&resp).is_empty(), "{resp}");
    let notes = missing(&resp);
    assert!(
        notes.contains("compute_centers source (TOP500 top500_2025-06.csv) has no rows")
            && notes.contains("HK"),
        "{notes}"
    );
}
