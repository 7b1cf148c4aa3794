//! Every JSON example printed in the two seeds parses into the protocol types
//! and serializes back with no field lost or changed.

use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;
use shared_protocol::agent::AgentMessage;
use shared_protocol::audit::AuditTaskRequest;
use shared_protocol::capability::{CapabilityBatchRegisterRequest, CapabilityRequirement};
use shared_protocol::earth::{EarthAction, EarthCommandRequest, EarthCommandResponse};
use shared_protocol::lease::LeaseRequest;
use shared_protocol::provider::{ProviderRegisterRequest, ProviderRegisterResponse};
use shared_protocol::speech::SpeechTranscriptionResponse;
use shared_protocol::{parse_json, Validate};

fn example(name: &str) -> Value {
    let path = format!(
        "{}/tests/seed_examples/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    benchlink_testkit::read_json(path)
}

/// Every key and value of `original` is present and equal in `back`
/// (`back` may add defaulted fields, never drop or alter one).
fn assert_no_field_lost(original: &Value, back: &Value, path: &str) {
    match (original, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => assert_no_field_lost(v, w, &format!("{path}.{k}")),
                    None if v.is_null() => {}
                    None => panic!("field {path}.{k} lost in the round trip"),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "array {path} changed length");
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                assert_no_field_lost(v, w, &format!("{path}[{i}]"));
            }
        }
        (Value::Number(a), Value::Number(b)) => {
            assert_eq!(a.as_f64(), b.as_f64(), "number {path} changed");
        }
        (a, b) => assert_eq!(a, b, "value {path} changed"),
    }
}

fn round_trip<T: DeserializeOwned + Serialize>(name: &str) -> T {
    let original = example(name);
    let bytes = serde_json::to_vec(&original).unwrap();
    let parsed: T = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("seed example {name} does not parse: {e}"));
    let back = serde_json::to_value(&parsed).unwrap();
    assert_no_field_lost(&original, &back, name);
    // A second trip is exact.
    let again: T = serde_json::from_value(back.clone()).unwrap();
    assert_eq!(serde_json::to_value(&again).unwrap(), back);
    parsed
}

fn round_trip_valid<T: DeserializeOwned + Serialize + Validate>(name: &str) -> T {
    let t: T = round_trip(name);
    let bytes = serde_json::to_vec(&example(name)).unwrap();
    parse_json::<T>(&bytes).unwrap_or_else(|e| panic!("seed example {name} is refused: {e}"));
    t
}

#[test]
fn provider_register_request_and_response_round_trip() {
    let req: ProviderRegisterRequest = round_trip_valid("001_s4.1_provider_register_request");
    assert_eq!(req.provider_id, "provider-winlab-01");
    assert_eq!(req.labels, ["lab", "gpu", "hardware-test"]);
    let resp: ProviderRegisterResponse = round_trip("001_s4.1_provider_register_response");
    assert!(resp.accepted);
    assert_eq!(resp.heartbeat_interval_seconds, 10);
}

#[test]
fn capability_batch_round_trips_with_typed_actions() {
    let batch: CapabilityBatchRegisterRequest = round_trip_valid("001_s4.2_capability_batch");
    assert_eq!(batch.capabilities.len(), 2);
    let cam = &batch.capabilities[0];
    assert_eq!(cam.capability_type.as_str(), "camera");
    assert_eq!(cam.supported_actions.len(), 4);
    assert_eq!(
        cam.metadata_json.as_ref().unwrap()["resolution_options"][0],
        "1920x1080"
    );
    assert!(!batch.capabilities[1].preemptible);
}

#[test]
fn lease_request_round_trips() {
    let req: LeaseRequest = round_trip_valid("001_s5.1_lease_request");
    assert_eq!(req.priority, 75);
    assert_eq!(req.requested_duration_seconds, 120);
    assert!(req.preempt_if_needed);
    assert_eq!(req.holder_type.as_str(), "audit_agent");
}

#[test]
fn audit_task_request_round_trips() {
    let req: AuditTaskRequest = round_trip_valid("001_s8.1_audit_task_request");
    assert_eq!(req.audit_type.as_str(), "multimodal");
    assert_eq!(req.capability_requirements.len(), 4);
    assert_eq!(req.acceptance_criteria.len(), 4);
    assert_eq!(req.time_budget_seconds, 300);
}

#[test]
fn capability_requirement_list_round_trips() {
    let reqs: Vec<CapabilityRequirement> = round_trip("001_s13_capability_requirements");
    assert_eq!(reqs[0].min_duration_seconds, Some(90));
    assert_eq!(reqs[0].preferred_node_tags, ["lab", "device-station-a"]);
    assert!(reqs[0].fallback_allowed && reqs[0].preempt_if_needed);
}

#[test]
fn tool_call_and_final_messages_round_trip() {
    match round_trip::<AgentMessage>("000_tool_call") {
        AgentMessage::ToolCall(call) => {
            assert_eq!(call.tool, "earth.find_entities");
            assert_eq!(call.arguments["filters"]["constellation"], "beidou");
        }
        other => panic!("expected a tool call, got {other:?}"),
    }
    match round_trip::<AgentMessage>("000_final") {
        AgentMessage::Final(f) => assert_eq!(f.summary, "已找到并高亮北斗卫星。"),
        other => panic!("expected a final message, got {other:?}"),
    }
}

#[test]
fn earth_command_request_and_response_round_trip() {
    let req: EarthCommandRequest = round_trip_valid("000_earth_command_request");
    assert_eq!(req.input_text, "高亮所有北斗卫星");
    assert_eq!(req.client_context.locale.as_deref(), Some("zh-CN"));
    let resp: EarthCommandResponse = round_trip("000_earth_command_response");
    assert_eq!(resp.actions.len(), 3);
    assert!(matches!(
        resp.actions[0],
        EarthAction::ShowLayer { enabled: true, .. }
    ));
}

#[test]
fn earth_action_example_round_trips() {
    let action: EarthAction = round_trip("000_earth_action");
    let EarthAction::HighlightEntities {
        entity_ids, style, ..
    } = action
    else {
        panic!("expected highlight_entities");
    };
    assert_eq!(entity_ids, ["satellite:norad:12345"]);
    assert!(style.unwrap().color_is_valid());
}

#[test]
fn speech_response_round_trips() {
    let resp: SpeechTranscriptionResponse = round_trip("000_speech_response");
    assert_eq!(resp.duration_ms, 1234);
    assert_eq!(resp.confidence, None);
}
