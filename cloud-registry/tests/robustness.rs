//! What a client sees when its request is slightly off: content types in
//! other letter cases or with parameters, bodies of the wrong JSON shape,
//! and text fields past their size limits. Every refusal is
//! `{"error": {"code", "message", "details"}}` and speaks of JSON, not of
//! the server's internal type names.

mod common;

use benchlink_testkit::status_is;
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use shared_protocol::api::Role;

/// POST `body` with an explicit `Content-Type`.
async fn post_with_type(
    api: &Api,
    path: &str,
    token: &str,
    content_type: &str,
    body: String,
) -> (StatusCode, Value) {
    let resp = api
        .http
        .post(format!("{}{path}", api.base))
        .bearer_auth(token)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("POST sent");
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The error envelope has exactly `code`, `message` and `details`.
fn assert_envelope(got: &(StatusCode, Value)) {
    let error = got.1["error"].as_object().expect("an error object");
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["code", "details", "message"], "{}", got.1);
}

/// No Rust type or serde vocabulary in a message meant for a client.
fn assert_plain(message: &str) {
    for word in [
        "struct",
        "enum ",
        "sequence",
        "LeaseRequest",
        "Capability",
        " u8",
        " u32",
        "Rust",
    ] {
        assert!(
            !message.contains(word),
            "`{word}` in a client message: {message}"
        );
    }
}

#[tokio::test]
async fn json_content_type_matches_in_any_letter_case_and_with_parameters() {
    let (_dir, reg, api, _) = registry().await;
    let p1 = reg.auth.create_token(Role::Provider, "p1").await.unwrap();
    let body = provider_body("p1").to_string();
    let path = "/api/v1/capability-providers/register";

    for content_type in [
        "APPLICATION/JSON",
        "application/json; charset=utf-8",
        "Application/Json;Charset=UTF-8",
        "application/json",
    ] {
        let r = post_with_type(&api, path, &p1, content_type, body.clone()).await;
        assert_eq!(r.0, StatusCode::OK, "{content_type}: {}", r.1);
        assert_eq!(r.1["accepted"], true, "{content_type}: {}", r.1);
    }
    for content_type in [
        "text/plain",
        "application/jsonp",
        "application/x-www-form-urlencoded",
    ] {
        let r = post_with_type(&api, path, &p1, content_type, body.clone()).await;
        assert_error(
            &r,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        );
        assert_envelope(&r);
    }
    reg.shutdown().await;
}

#[tokio::test]
async fn a_body_that_is_not_an_object_is_a_plain_400() {
    let (_dir, reg, api, admin) = registry().await;

    for (path, body) in [
        ("/api/v1/capability-leases/request", "[]"),
        ("/api/v1/capability-leases/request", "\"x\""),
        ("/api/v1/capability-leases/request", "42"),
        ("/api/v1/capability-leases/request", "null"),
        ("/api/v1/capability-leases/request", "true"),
        ("/api/v1/capability-providers/register", "[1, 2]"),
        ("/api/v1/auth/tokens", "\"viewer\""),
    ] {
        let r = api.post_raw(path, Some(&admin), body.into()).await;
        assert_error(&r, StatusCode::BAD_REQUEST, "invalid_request");
        assert_envelope(&r);
        assert_eq!(
            r.1["error"]["message"], "request body must be a JSON object",
            "{path} {body}: {}",
            r.1
        );
    }
    // Truncated JSON is still `malformed_json`.
    let r = api
        .post_raw(
            "/api/v1/capability-leases/request",
            Some(&admin),
            "{\"a\":".into(),
        )
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, "malformed_json");
    assert_envelope(&r);
    reg.shutdown().await;
}

#[tokio::test]
async fn field_errors_keep_their_path_but_name_no_server_types() {
    let (_dir, reg, api, _) = registry().await;
    let p1 = reg.auth.create_token(Role::Provider, "p1").await.unwrap();
    let admin = reg.admin_token.clone().unwrap();
    let _ = status_is(
        api.register_provider(&p1, &provider_body("p1")).await,
        StatusCode::OK,
    );

    // An unknown enum value: the path and the allowed values.
    let mut bad = capabilities_body("p1", "");
    bad["capabilities"][1]["capability_type"] = json!("toaster");
    let r = api.register_capabilities(&p1, &bad).await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert_envelope(&r);
    assert_eq!(
        r.1["error"]["details"]["field"],
        "capabilities[1].capability_type"
    );
    let message = r.1["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("capabilities[1].capability_type"),
        "{message}"
    );
    assert!(message.contains("unknown variant `toaster`"), "{message}");
    assert_plain(message);

    // A list element of the wrong shape.
    let mut bad = capabilities_body("p1", "");
    bad["capabilities"][1] = json!("thumb");
    let r = api.register_capabilities(&p1, &bad).await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert_eq!(r.1["error"]["details"]["field"], "capabilities[1]");
    let message = r.1["error"]["message"].as_str().unwrap();
    assert!(message.contains("expected a JSON object"), "{message}");
    assert_plain(message);

    // A list where an array is wanted, and a number out of its range.
    let mut bad = capabilities_body("p1", "");
    bad["capabilities"] = json!({"a": 1});
    let r = api.register_capabilities(&p1, &bad).await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    let message = r.1["error"]["message"].as_str().unwrap();
    assert!(message.contains("expected a JSON array"), "{message}");
    assert!(message.contains("invalid type: object"), "{message}");
    assert_plain(message);

    let lease = json!({
        "capability_id": "cam-front-01",
        "holder_type": "audit_agent",
        "holder_ref": "audit:a",
        "project_id": "p",
        "purpose": "x",
        "priority": 300,
        "requested_duration_seconds": 60
    });
    let r = api.request_lease(&admin, &lease).await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert_eq!(r.1["error"]["details"]["field"], "priority");
    let message = r.1["error"]["message"].as_str().unwrap();
    // The range the registry enforces, not the one of the wire type.
    assert_eq!(message, "priority: 300 is out of range 0..=100");
    assert_plain(message);

    // Free text that would travel in every lease listing and event: a
    // purpose past its limit, control characters, an oversized reason.
    let mut long = lease.clone();
    long["priority"] = json!(50);
    long["purpose"] = json!("p".repeat(1_001));
    let mut control = long.clone();
    control["purpose"] = json!("calibrate\u{1b}[2J the camera");
    let mut reason = long.clone();
    reason["purpose"] = json!("x");
    reason["preempt_reason"] = json!("r".repeat(129));
    for (body, field, says) in [
        (&long, "purpose", "1001 characters long; at most 1000"),
        (&control, "purpose", "control characters"),
        (&reason, "preempt_reason", "at most 128"),
    ] {
        let r = api.request_lease(&admin, body).await;
        assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
        assert_eq!(r.1["error"]["details"]["field"], field, "{}", r.1);
        let message = r.1["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    let leases = api.get("/api/v1/capability-leases", Some(&admin)).await;
    assert_eq!(leases.0, StatusCode::OK);
    assert_eq!(
        leases.1["leases"],
        json!([]),
        "nothing was queued or granted"
    );
    reg.shutdown().await;
}

/// A known field with a value of the wrong JSON type where a fixed set of
/// values belongs (a number, `null`, an array): 422 `invalid_field` naming
/// the field and the accepted values, on every endpoint with a JSON body,
/// like an unknown value; only a body that is not JSON is 400.
#[tokio::test]
async fn a_wrong_json_type_for_a_field_with_fixed_values_is_422_naming_the_field_everywhere() {
    let (_dir, reg, api, _) = registry().await;
    let p1 = reg.auth.create_token(Role::Provider, "p1").await.unwrap();
    let admin = reg.admin_token.clone().unwrap();
    let _ = status_is(
        api.register_provider(&p1, &provider_body("p1")).await,
        StatusCode::OK,
    );

    let mut caps = capabilities_body("p1", "");
    caps["capabilities"][0]["capability_type"] = json!(5);
    let mut lease = json!({
        "capability_id": "cam-front-01",
        "holder_type": null,
        "holder_ref": "audit:a",
        "project_id": "p",
        "purpose": "x",
        "priority": 50,
        "requested_duration_seconds": 60
    });
    let mut audit = audit_request("ar-type", "software", 50);
    audit["audit_type"] = json!(["software"]);
    for (path, token, body, field, found) in [
        (
            "/api/v1/auth/tokens",
            &admin,
            json!({"role": 3, "name": "v1"}),
            "role",
            "integer `3`",
        ),
        (
            "/api/v1/capabilities/register",
            &p1,
            caps,
            "capabilities[0].capability_type",
            "integer `5`",
        ),
        (
            "/api/v1/capability-leases/request",
            &admin,
            lease.take(),
            "holder_type",
            "null",
        ),
        (
            "/api/v1/audit-requests",
            &admin,
            audit,
            "audit_type",
            "array",
        ),
    ] {
        let r = api.post(path, Some(token), &body).await;
        assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
        assert_envelope(&r);
        assert_eq!(r.1["error"]["details"]["field"], field, "{path}: {}", r.1);
        let message = r.1["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!(
                "invalid field `{field}`: invalid type: {found}, expected one of `"
            )),
            "{path}: {message}"
        );
        assert_plain(message);
    }
    // Not JSON: still 400 `malformed_json`.
    let r = api
        .post_raw("/api/v1/auth/tokens", Some(&admin), "{\"role\": vi".into())
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, "malformed_json");
    let (_, tokens) = api.get("/api/v1/tokens", Some(&admin)).await;
    assert!(
        !tokens.to_string().contains("\"v1\""),
        "no token was made: {tokens}"
    );
    reg.shutdown().await;
}

#[tokio::test]
async fn audit_text_past_its_limit_is_refused_naming_the_field_and_stores_nothing() {
    let (_dir, reg, api, admin) = registry().await;

    let cases: Vec<(&str, Value, &str)> = vec![
        ("objective", json!("o".repeat(10_001)), "objective"),
        ("project_name", json!("p".repeat(201)), "project_name"),
        (
            "acceptance_criteria",
            json!(vec!["works"; 501]),
            "acceptance_criteria",
        ),
        (
            "acceptance_criteria",
            json!(["fine", "c".repeat(10_001)]),
            "acceptance_criteria[1]",
        ),
        (
            "metadata_json",
            json!({"notes": {"text": "n".repeat(10_001)}}),
            "metadata_json.notes.text",
        ),
    ];
    for (i, (key, value, field)) in cases.into_iter().enumerate() {
        let mut body = audit_request(&format!("ar-big-{i}"), "software", 50);
        body[key] = value;
        let r = api
            .post("/api/v1/audit-requests", Some(&admin), &body)
            .await;
        assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
        assert_envelope(&r);
        assert_eq!(r.1["error"]["details"]["field"], field, "{}", r.1);
        let message = r.1["error"]["message"].as_str().unwrap();
        assert!(message.contains("at most"), "{message}");
    }
    let (_, page) = api.get("/api/v1/audit-requests", Some(&admin)).await;
    assert_eq!(page["audit_requests"], json!([]), "nothing stored: {page}");

    // At the limits: accepted.
    let mut body = audit_request("ar-at-limit", "software", 50);
    body["objective"] = json!("o".repeat(10_000));
    body["project_name"] = json!("名".repeat(200));
    body["acceptance_criteria"] = json!(vec!["works"; 500]);
    let _ = status_is(
        api.post("/api/v1/audit-requests", Some(&admin), &body)
            .await,
        StatusCode::CREATED,
    );

    // Threads: too many labels, an over-long display name.
    let thread = json!({
        "thread_ref": "mac-01:thread-ui-22",
        "node_id": "mac-01",
        "role": "worker",
        "labels": vec!["ui"; 501]
    });
    let r = api.post("/api/v1/threads", Some(&admin), &thread).await;
    assert_error(&r, StatusCode::UNPROCESSABLE_ENTITY, "invalid_field");
    assert_eq!(r.1["error"]["details"]["field"], "labels");
    reg.shutdown().await;
}
