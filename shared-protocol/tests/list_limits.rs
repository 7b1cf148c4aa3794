//! Every list a client sends has a size limit: at the limit the request is
//! accepted, one entry over it is refused naming the field and the limit.

use benchlink_testkit::{read_json, with_at};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use shared_protocol::audit::{AuditTaskRequest, AuditTaskResult};
use shared_protocol::capability::CapabilityBatchRegisterRequest;
use shared_protocol::earth::EarthCommandRequest;
use shared_protocol::lease::{LeaseGroupRequest, LeaseRequest};
use shared_protocol::mqtt::{RegisterBody, SessionUpdate};
use shared_protocol::provider::{HeartbeatRequest, ProviderRegisterRequest};
use shared_protocol::session::ActionInvokeRequest;
use shared_protocol::validate::limits::*;
use shared_protocol::{parse_json, Validate};

fn seed(name: &str) -> Value {
    read_json(format!(
        "{}/tests/seed_examples/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    ))
}

/// `n` distinct strings.
fn strings(n: usize) -> Value {
    Value::Array((0..n).map(|i| json!(format!("t{i}"))).collect())
}

/// An object of `n` entries.
fn object(n: usize) -> Value {
    Value::Object((0..n).map(|i| (format!("k{i}"), json!(i))).collect())
}

/// `make(max)` parses; `make(max + 1)` is refused at `field`, with a
/// message naming `max`.
fn limit_holds<T: DeserializeOwned + Validate + std::fmt::Debug>(
    field: &str,
    max: usize,
    make: impl Fn(usize) -> Value,
) {
    let ok = serde_json::to_vec(&make(max)).unwrap();
    if let Err(e) = parse_json::<T>(&ok) {
        panic!("{field} with {max} entries refused: {e}");
    }
    let over = serde_json::to_vec(&make(max + 1)).unwrap();
    let err = parse_json::<T>(&over).expect_err(field);
    assert_eq!(err.field(), Some(field), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("at most {max} ")),
        "{field}: the message does not name the limit: {text}"
    );
}

#[test]
fn provider_labels_and_heartbeat_lists_are_bounded() {
    let provider = seed("001_s4.1_provider_register_request");
    limit_holds::<ProviderRegisterRequest>("labels", MAX_PROVIDER_LABELS, |n| {
        with_at(provider.clone(), "labels", strings(n))
    });
    let report = |i: usize| json!({"capability_id": format!("c{i}"), "health_status": "healthy"});
    let beat = json!({"provider_id": "bench-1"});
    limit_holds::<HeartbeatRequest>("capabilities", MAX_HEARTBEAT_ENTRIES, |n| {
        with_at(beat.clone(), "capabilities", (0..n).map(report).collect())
    });
    let running = |i: usize| {
        json!({"session_id": format!("s{i}"), "lease_id": "l", "capability_id": "c",
               "action": "snapshot", "started_at": "2026-01-01T00:00:00Z"})
    };
    limit_holds::<HeartbeatRequest>("running_sessions", MAX_HEARTBEAT_ENTRIES, |n| {
        with_at(
            beat.clone(),
            "running_sessions",
            (0..n).map(running).collect(),
        )
    });
    let fault = |_| json!({"code": "x", "message": "y", "occurred_at": "2026-01-01T00:00:00Z"});
    limit_holds::<HeartbeatRequest>("faults", MAX_FAULTS, |n| {
        with_at(beat.clone(), "faults", (0..n).map(fault).collect())
    });
    limit_holds::<HeartbeatRequest>("capabilities[0].metrics", MAX_OBJECT_ENTRIES, |n| {
        let mut r = report(0);
        r["metrics"] = object(n);
        with_at(beat.clone(), "capabilities", json!([r]))
    });
}

#[test]
fn capability_lists_are_bounded_over_http_and_mqtt() {
    let batch = seed("001_s4.2_capability_batch");
    limit_holds::<CapabilityBatchRegisterRequest>("capabilities[0].tags", MAX_TAGS, |n| {
        with_at(batch.clone(), "capabilities[0].tags", strings(n))
    });
    limit_holds::<CapabilityBatchRegisterRequest>(
        "capabilities[0].supported_actions",
        MAX_SUPPORTED_ACTIONS,
        |n| {
            // Repeating an action the type has keeps each entry valid.
            let first = batch["capabilities"][0]["supported_actions"][0].clone();
            with_at(
                batch.clone(),
                "capabilities[0].supported_actions",
                Value::Array(vec![first; n]),
            )
        },
    );
    limit_holds::<CapabilityBatchRegisterRequest>(
        "capabilities[0].evidence_modes",
        MAX_EVIDENCE_MODES,
        |n| {
            with_at(
                batch.clone(),
                "capabilities[0].evidence_modes",
                Value::Array(vec![json!("image"); n]),
            )
        },
    );
    for field in ["metadata_json", "constraints_json"] {
        limit_holds::<CapabilityBatchRegisterRequest>(
            &format!("capabilities[0].{field}"),
            MAX_OBJECT_ENTRIES,
            |n| {
                with_at(
                    batch.clone(),
                    &format!("capabilities[0].{field}"),
                    object(n),
                )
            },
        );
    }
    let one = batch["capabilities"][0].clone();
    let many = |n: usize| -> Value {
        (0..n)
            .map(|i| with_at(one.clone(), "capability_id", json!(format!("cap-{i}"))))
            .collect()
    };
    limit_holds::<CapabilityBatchRegisterRequest>(
        "capabilities",
        MAX_CAPABILITIES_PER_BATCH,
        |n| with_at(batch.clone(), "capabilities", many(n)),
    );
    let register = json!({"provider": seed("001_s4.1_provider_register_request")});
    limit_holds::<RegisterBody>("capabilities", MAX_CAPABILITIES_PER_BATCH, |n| {
        with_at(register.clone(), "capabilities", many(n))
    });
    limit_holds::<RegisterBody>("provider.labels", MAX_PROVIDER_LABELS, |n| {
        with_at(
            with_at(register.clone(), "capabilities", many(1)),
            "provider.labels",
            strings(n),
        )
    });
}

#[test]
fn selectors_groups_and_requirements_are_bounded() {
    let lease = seed("001_s5.1_lease_request");
    let by_selector = |n: usize| {
        let mut v = lease.clone();
        v.as_object_mut().unwrap().remove("capability_id");
        v["capability_selector"] = json!({"capability_type": "camera", "tags": strings(n)});
        v
    };
    limit_holds::<LeaseRequest>("capability_selector.tags", MAX_TAGS, by_selector);
    let group = json!({
        "holder_type": "audit_agent", "holder_ref": "audit:a", "project_id": "p",
        "purpose": "group", "priority": 50, "requested_duration_seconds": 60
    });
    let ids = |n: usize| -> Value { (0..n).map(|i| json!(format!("cap-{i}"))).collect() };
    limit_holds::<LeaseGroupRequest>("capability_ids", MAX_GROUP_MEMBERS, |n| {
        with_at(group.clone(), "capability_ids", ids(n))
    });
    let requirement = seed("001_s13_capability_requirements")[0].clone();
    limit_holds::<LeaseGroupRequest>("requirements", MAX_GROUP_MEMBERS, |n| {
        with_at(
            group.clone(),
            "requirements",
            Value::Array(vec![requirement.clone(); n]),
        )
    });
    limit_holds::<LeaseGroupRequest>("requirements[0].preferred_node_tags", MAX_TAGS, |n| {
        let r = with_at(requirement.clone(), "preferred_node_tags", strings(n));
        with_at(group.clone(), "requirements", json!([r]))
    });
}

#[test]
fn audit_requests_and_results_are_bounded() {
    let request = seed("001_s8.1_audit_task_request");
    let requirement = seed("001_s13_capability_requirements")[0].clone();
    limit_holds::<AuditTaskRequest>("capability_requirements", MAX_GROUP_MEMBERS, |n| {
        with_at(
            request.clone(),
            "capability_requirements",
            Value::Array(vec![requirement.clone(); n]),
        )
    });
    for field in [
        "acceptance_criteria",
        "evidence_refs",
        "artifact_refs",
        "frame_refs",
    ] {
        limit_holds::<AuditTaskRequest>(field, MAX_AUDIT_LIST_ITEMS, |n| {
            with_at(request.clone(), field, strings(n))
        });
    }
    limit_holds::<AuditTaskRequest>("metadata_json", MAX_OBJECT_ENTRIES, |n| {
        with_at(request.clone(), "metadata_json", object(n))
    });
    let result = json!({
        "protocol_version": "1.0", "audit_request_id": "ar-1", "audit_type": "software",
        "status": "completed", "decision": "pass", "confidence": 0.9, "summary": "ok",
        "findings": [], "required_actions": [], "used_capabilities": [], "artifact_refs": [],
        "timeline": [], "duration_ms": 1000, "completed_at": "2026-01-01T00:00:00Z"
    });
    if let Err(e) = parse_json::<AuditTaskResult>(&serde_json::to_vec(&result).unwrap()) {
        panic!("the base audit result does not parse: {e}");
    }
    for field in [
        "required_actions",
        "used_capabilities",
        "artifact_refs",
        "release_blockers",
    ] {
        limit_holds::<AuditTaskResult>(field, MAX_AUDIT_LIST_ITEMS, |n| {
            with_at(result.clone(), field, strings(n))
        });
    }
    let finding = |i: usize| json!({"finding_id": format!("f{i}"), "severity": "low", "title": "t", "description": "d"});
    limit_holds::<AuditTaskResult>("findings", MAX_AUDIT_LIST_ITEMS, |n| {
        with_at(result.clone(), "findings", (0..n).map(finding).collect())
    });
    limit_holds::<AuditTaskResult>("findings[0].evidence_ref_ids", MAX_AUDIT_LIST_ITEMS, |n| {
        let f = with_at(finding(0), "evidence_ref_ids", strings(n));
        with_at(result.clone(), "findings", json!([f]))
    });
}

#[test]
fn session_updates_and_earth_commands_are_bounded_action_params_are_not() {
    // An action's params are bounded in bytes only (body and MQTT packet
    // limits): many small entries still parse.
    let params = json!({"action": "snapshot", "params": object(20_000)});
    parse_json::<ActionInvokeRequest>(&serde_json::to_vec(&params).unwrap()).unwrap();
    let artifact = |i: usize| {
        json!({"artifact_id": format!("a{i}"), "session_id": "s1", "artifact_type": "image",
               "storage_uri": "edge-outbox://bench-1/a", "content_type": "image/jpeg",
               "captured_at": "2026-01-01T00:00:00Z", "duration_ms": null,
               "checksum": "0".repeat(64), "size_bytes": 1, "metadata_json": {}})
    };
    let update = json!({"session_id": "s1", "capability_id": "c1", "status": "completed",
                        "occurred_at": "2026-01-01T00:00:00Z"});
    limit_holds::<SessionUpdate>("artifacts", MAX_ARTIFACTS_PER_UPDATE, |n| {
        with_at(update.clone(), "artifacts", (0..n).map(artifact).collect())
    });
    limit_holds::<SessionUpdate>("artifacts[0].metadata_json", MAX_OBJECT_ENTRIES, |n| {
        let a = with_at(artifact(0), "metadata_json", object(n));
        with_at(update.clone(), "artifacts", json!([a]))
    });
    let earth = seed("000_earth_command_request");
    limit_holds::<EarthCommandRequest>("client_context.visible_layers", MAX_VISIBLE_LAYERS, |n| {
        with_at(
            earth.clone(),
            "client_context.visible_layers",
            Value::Array(vec![json!("satellites"); n]),
        )
    });
}
