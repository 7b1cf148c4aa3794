//! Bad input is refused with an error that names the field.

use serde_json::{json, Value};
use shared_protocol::audit::{AuditTaskRequest, AuditTaskResult};
use shared_protocol::capability::{
    CapabilityAction, CapabilityBatchRegisterRequest, CapabilityType,
};
use shared_protocol::earth::EarthAction;
use shared_protocol::lease::LeaseRequest;
use shared_protocol::mqtt::{parse_topic, topic, Envelope, MessageType, SessionSync, TopicKind};
use shared_protocol::session::ActionInvokeRequest;
use shared_protocol::{parse_json, ParseError};

fn lease_request() -> Value {
    json!({
        "capability_id": "cam-front-01",
        "holder_type": "audit_agent",
        "holder_ref": "audit:multimodal-auditor-01",
        "project_id": "proj_device_assistant",
        "purpose": "LED check",
        "priority": 75,
        "requested_duration_seconds": 120
    })
}

fn field_of(err: ParseError) -> String {
    err.field()
        .unwrap_or_else(|| panic!("error names no field: {err}"))
        .to_string()
}

fn field_of_ref(err: &ParseError) -> String {
    err.field()
        .unwrap_or_else(|| panic!("error names no field: {err}"))
        .to_string()
}

fn parse_lease(v: Value) -> Result<LeaseRequest, ParseError> {
    parse_json(&serde_json::to_vec(&v).unwrap())
}

#[test]
fn unknown_holder_type_names_the_field() {
    let mut v = lease_request();
    v["holder_type"] = json!("robot_overlord");
    let err = parse_lease(v).unwrap_err();
    assert_eq!(field_of(err), "holder_type");
}

#[test]
fn unknown_capability_type_in_a_batch_names_its_path() {
    let v = json!({"provider_id": "p1", "capabilities": [
        {"capability_id": "c1", "capability_type": "camera", "display_name": "c",
         "lease_mode": "exclusive", "preemptible": true, "supported_actions": ["snapshot"]},
        {"capability_id": "c2", "capability_type": "toaster", "display_name": "t",
         "lease_mode": "exclusive", "preemptible": true, "supported_actions": []}
    ]});
    let err =
        parse_json::<CapabilityBatchRegisterRequest>(&serde_json::to_vec(&v).unwrap()).unwrap_err();
    assert_eq!(field_of(err), "capabilities[1].capability_type");
}

#[test]
fn missing_required_field_is_named() {
    let mut v = lease_request();
    v.as_object_mut().unwrap().remove("holder_ref");
    let err = parse_lease(v).unwrap_err();
    assert_eq!(field_of(err), "holder_ref");
}

#[test]
fn priority_above_100_is_out_of_range() {
    let mut v = lease_request();
    v["priority"] = json!(101);
    let err = parse_lease(v).unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    assert_eq!(field_of(err), "priority");
}

#[test]
fn negative_and_huge_numbers_are_refused_with_the_field() {
    let mut v = lease_request();
    v["priority"] = json!(-1);
    assert_eq!(field_of(parse_lease(v).unwrap_err()), "priority");
    let mut v = lease_request();
    v["requested_duration_seconds"] = json!(0);
    assert_eq!(
        field_of(parse_lease(v).unwrap_err()),
        "requested_duration_seconds"
    );
}

#[test]
fn an_action_the_type_does_not_support_is_refused() {
    let v = json!({"provider_id": "p1", "capabilities": [
        {"capability_id": "relay-1", "capability_type": "relay", "display_name": "r",
         "lease_mode": "exclusive", "preemptible": true,
         "supported_actions": ["switch_on", "snapshot"]}
    ]});
    let err =
        parse_json::<CapabilityBatchRegisterRequest>(&serde_json::to_vec(&v).unwrap()).unwrap_err();
    assert_eq!(field_of(err), "capabilities[0].supported_actions[1]");
}

#[test]
fn lease_request_needs_exactly_one_target() {
    let mut v = lease_request();
    v.as_object_mut().unwrap().remove("capability_id");
    assert_eq!(field_of(parse_lease(v).unwrap_err()), "capability_id");
}

#[test]
fn malformed_json_is_a_syntax_error() {
    let err = parse_json::<LeaseRequest>(b"{\"capability_id\": ").unwrap_err();
    assert!(matches!(err, ParseError::Syntax(_)), "{err}");
}

#[test]
fn a_wrong_json_type_where_an_enum_belongs_is_a_field_error_not_a_syntax_error() {
    let err = parse_json::<ActionInvokeRequest>(br#"{"action": 123}"#).unwrap_err();
    let ParseError::Field { field, message } = &err else {
        panic!("not a field error: {err:?}");
    };
    assert_eq!(field, "action");
    assert!(
        message
            .starts_with("invalid type: integer `123`, expected one of `snapshot`, `record_clip`,"),
        "{message}"
    );
    for body in [
        &br#"{"action": null}"#[..],
        br#"{"action": ["snapshot"]}"#,
        br#"{"action": true, "wait_ms": 10}"#,
    ] {
        let err = parse_json::<ActionInvokeRequest>(body).unwrap_err();
        assert_eq!(field_of(err), "action");
    }
    // Deeper down, the path names the element.
    let v = json!({"provider_id": "p1", "capabilities": [
        {"capability_id": "c1", "capability_type": "camera", "display_name": "c",
         "lease_mode": "exclusive", "preemptible": true, "supported_actions": ["snapshot", 7]}
    ]});
    let err =
        parse_json::<CapabilityBatchRegisterRequest>(&serde_json::to_vec(&v).unwrap()).unwrap_err();
    assert!(
        err.to_string().contains("invalid type: integer `7`"),
        "{err}"
    );
    assert_eq!(field_of(err), "capabilities[0].supported_actions[1]");
    // A body cut short, or not JSON, is still a syntax error.
    for body in [&br#"{"action": 12"#[..], br#"{"action": snapshot}"#] {
        let err = parse_json::<ActionInvokeRequest>(body).unwrap_err();
        assert!(matches!(err, ParseError::Syntax(_)), "{err:?}");
    }
}

#[test]
fn audit_result_confidence_outside_0_1_is_refused() {
    let v = json!({
        "audit_request_id": "auditreq_001", "audit_type": "software", "status": "completed",
        "decision": "pass", "confidence": 1.5, "summary": "ok", "duration_ms": 10,
        "completed_at": "2026-11-30T00:00:00Z"
    });
    let err = parse_json::<AuditTaskResult>(&serde_json::to_vec(&v).unwrap()).unwrap_err();
    assert_eq!(field_of(err), "confidence");
}

#[test]
fn unknown_audit_type_is_refused() {
    let mut v: Value = serde_json::from_str(include_str!(
        "seed_examples/001_s8.1_audit_task_request.json"
    ))
    .unwrap();
    v["audit_type"] = json!("astrology");
    let err = parse_json::<AuditTaskRequest>(&serde_json::to_vec(&v).unwrap()).unwrap_err();
    assert_eq!(field_of(err), "audit_type");
}

#[test]
fn an_earth_action_outside_the_six_types_does_not_parse() {
    let v = json!({"type": "run_script", "code": "alert(1)"});
    assert!(serde_json::from_value::<EarthAction>(v).is_err());
}

#[test]
fn every_action_belongs_to_exactly_one_capability_type() {
    for action in CapabilityAction::ALL {
        let owners: Vec<_> = CapabilityType::ALL
            .iter()
            .filter(|t| t.supports(*action))
            .collect();
        assert_eq!(owners.len(), 1, "{action} owned by {owners:?}");
        assert_eq!(*owners[0], action.capability_type());
    }
    assert_eq!(CapabilityAction::ALL.len(), 34);
}

#[test]
fn topics_build_and_parse_back() {
    let t = topic("benchlink/v1", "bench-a", TopicKind::Heartbeat);
    assert_eq!(t, "benchlink/v1/providers/bench-a/heartbeat");
    assert_eq!(
        parse_topic("benchlink/v1", &t).unwrap(),
        ("bench-a", TopicKind::Heartbeat)
    );
    assert!(parse_topic("benchlink/v1", "benchlink/v1/providers/bench-a/reboot").is_err());
    assert!(parse_topic("benchlink/v1", "other/providers/bench-a/status").is_err());
    assert!(parse_topic("benchlink/v1", "benchlink/v1/providers/a/b/status").is_err());
}

#[test]
fn envelope_of_another_major_version_is_refused() {
    let env = Envelope::new(
        MessageType::Status,
        "m1".into(),
        chrono::Utc::now(),
        &json!({}),
    )
    .unwrap();
    let mut v = serde_json::to_value(&env).unwrap();
    assert!(Envelope::parse(&serde_json::to_vec(&v).unwrap()).is_ok());
    v["protocol_version"] = json!("2.0");
    assert!(Envelope::parse(&serde_json::to_vec(&v).unwrap()).is_err());
}

#[test]
fn an_unknown_field_of_a_request_is_refused_and_named() {
    let body = br#"{"action":"snapshot","bogus":1}"#;
    let err = parse_json::<ActionInvokeRequest>(body).unwrap_err();
    assert_eq!(field_of_ref(&err), "bogus", "{err}");
    assert!(err.to_string().contains("`wait_ms`"), "{err}");

    let typo = br#"{"action":"snapshot","wait_msec":100}"#;
    let err = parse_json::<ActionInvokeRequest>(typo).unwrap_err();
    assert_eq!(field_of(err), "wait_msec");
}

#[test]
fn an_unknown_field_of_a_group_requirement_is_named_by_its_path() {
    let mut v = lease_request();
    v.as_object_mut().unwrap().remove("capability_id");
    v["requirements"] = json!([
        {"capability_type": "camera", "mode": "exclusive"},
        {"capability_type": "camera", "capability_id": "cam-fake-01", "mode": "exclusive"}
    ]);
    let err =
        parse_json::<shared_protocol::lease::LeaseGroupRequest>(&serde_json::to_vec(&v).unwrap())
            .unwrap_err();
    assert_eq!(field_of(err), "requirements[1].capability_id");

    let mut v = lease_request();
    v.as_object_mut().unwrap().remove("capability_id");
    v["capability_selector"] = json!({"capability_type": "camera", "capabilty_id": "x"});
    assert_eq!(
        field_of(parse_lease(v).unwrap_err()),
        "capability_selector.capabilty_id"
    );
}

#[test]
fn an_audit_requests_requirement_refuses_unknown_fields_but_its_top_level_does_not() {
    let seed: Value = serde_json::from_str(include_str!(
        "seed_examples/001_s8.1_audit_task_request.json"
    ))
    .unwrap();
    let mut v = seed.clone();
    v["capability_requirements"] =
        json!([{"capability_type": "camera", "mode": "exclusive", "capability_id": "cam-1"}]);
    let err = parse_json::<AuditTaskRequest>(&serde_json::to_vec(&v).unwrap()).unwrap_err();
    assert_eq!(field_of(err), "capability_requirements[0].capability_id");

    let mut v = seed;
    v["x_extension"] = json!(1);
    parse_json::<AuditTaskRequest>(&serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn a_wait_or_timeout_of_the_wrong_type_names_the_range_in_force() {
    for (body, field, message) in [
        (
            r#"{"action":"snapshot","wait_ms":"soon"}"#,
            "wait_ms",
            "invalid type: string \"soon\", expected an integer from 0 to 300000",
        ),
        (
            r#"{"action":"snapshot","wait_ms":-1}"#,
            "wait_ms",
            "invalid value: integer `-1`, expected an integer from 0 to 300000",
        ),
        (
            r#"{"action":"snapshot","timeout_ms":1.5}"#,
            "timeout_ms",
            "invalid type: floating point `1.5`, expected an integer from 1 to 600000",
        ),
        (
            r#"{"action":"snapshot","timeout_ms":5000000000}"#,
            "timeout_ms",
            "invalid value: integer `5000000000`, expected an integer from 1 to 600000",
        ),
    ] {
        let err = parse_json::<ActionInvokeRequest>(body.as_bytes()).unwrap_err();
        match err {
            ParseError::Field {
                field: f,
                message: m,
            } => {
                assert_eq!((f.as_str(), m.as_str()), (field, message), "{body}")
            }
            other => panic!("{body}: {other}"),
        }
    }
    // Within u32 but out of range: the range check names it.
    let err = parse_json::<ActionInvokeRequest>(br#"{"action":"snapshot","wait_ms":400000}"#)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "wait_ms: 400000 is out of range 0..=300000"
    );
    let ok = parse_json::<ActionInvokeRequest>(
        br#"{"action":"snapshot","wait_ms":300000,"timeout_ms":null}"#,
    )
    .unwrap();
    assert_eq!((ok.wait_ms, ok.timeout_ms), (300_000, None));
}

#[test]
fn a_duplicate_field_is_named() {
    let err =
        parse_json::<ActionInvokeRequest>(br#"{"action":"snapshot","action":"tap"}"#).unwrap_err();
    assert_eq!(field_of_ref(&err), "action", "{err}");
    let mut v = lease_request();
    v.as_object_mut().unwrap().remove("capability_id");
    let body = serde_json::to_string(&v).unwrap().replacen(
        '{',
        r#"{"capability_selector":{"capability_type":"camera","tags":[],"tags":[]},"#,
        1,
    );
    let err = parse_json::<LeaseRequest>(body.as_bytes()).unwrap_err();
    assert_eq!(field_of(err), "capability_selector.tags");
}

#[test]
fn a_session_sync_with_a_bad_session_id_or_too_many_sessions_is_refused() {
    let sync = |sessions: Value| {
        Envelope::new(
            MessageType::SessionSync,
            "m1".into(),
            chrono::Utc::now(),
            &json!({ "sessions": sessions }),
        )
        .unwrap()
    };
    let one = json!([{"session_id": "sess-1", "capability_id": "cam-01"}]);
    let ok: SessionSync = sync(one).body_as(MessageType::SessionSync).unwrap();
    assert_eq!(ok.sessions[0].session_id, "sess-1");

    let bad = json!([{"session_id": "no spaces", "capability_id": "cam-01"}]);
    let err = sync(bad)
        .body_as::<SessionSync>(MessageType::SessionSync)
        .unwrap_err();
    assert!(err.to_string().contains("sessions[0].session_id"), "{err}");

    let many: Vec<Value> = (0..=SessionSync::MAX_SESSIONS)
        .map(|i| json!({"session_id": format!("s-{i}"), "capability_id": "cam-01"}))
        .collect();
    let err = sync(Value::Array(many))
        .body_as::<SessionSync>(MessageType::SessionSync)
        .unwrap_err();
    assert!(err.to_string().contains("at most 1000"), "{err}");
}

#[test]
fn an_nfd_tag_is_stored_and_matched_as_its_nfc_spelling() {
    use shared_protocol::capability::{CapabilityRegistration, CapabilitySelector};
    // "café" with a combining acute accent (NFD) and precomposed (NFC).
    let nfd = "cafe\u{301}";
    let nfc = "caf\u{e9}";
    let reg: CapabilityRegistration = shared_protocol::parse_json(
        format!(
            r#"{{"capability_id":"cam-1","capability_type":"camera","display_name":"Cam",
               "lease_mode":"exclusive","preemptible":true,"supported_actions":["snapshot"],
               "evidence_modes":["image"],"tags":["{nfd}"]}}"#
        )
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(reg.tags, vec![nfc.to_string()]);
    let sel: CapabilitySelector = shared_protocol::parse_value(serde_json::json!({
        "capability_type": "camera", "tags": [nfd]
    }))
    .unwrap();
    assert_eq!(sel.tags, reg.tags, "one spelling, one device");
}

#[test]
fn a_display_name_with_a_bidi_override_or_a_control_character_is_refused() {
    use shared_protocol::capability::CapabilityRegistration;
    for (name, code) in [("Cam\u{202E}gnp.exe", "U+202E"), ("Cam\u{7}", "U+0007")] {
        let body = serde_json::json!({
            "capability_id": "cam-1", "capability_type": "camera", "display_name": name,
            "lease_mode": "exclusive", "preemptible": true,
            "supported_actions": ["snapshot"], "evidence_modes": ["image"]
        });
        let err = shared_protocol::parse_value::<CapabilityRegistration>(body)
            .unwrap_err()
            .to_string();
        assert!(err.contains("display_name") && err.contains(code), "{err}");
    }
}
