//! The lab's grant rules over real HTTP (docs/policy.md): maintenance of a
//! capability, removal of a retired one, and health gating.

mod common;

use benchlink_testkit::status_is;
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use shared_protocol::api::Role;

fn lease_body(capability_id: &str, holder_ref: &str, queue_timeout: Option<u32>) -> Value {
    let mut b = json!({
        "capability_id": capability_id,
        "holder_type": "audit_agent",
        "holder_ref": holder_ref,
        "project_id": "proj_policy",
        "purpose": "policy test",
        "priority": 50,
        "requested_duration_seconds": 600,
        "evidence_required": false,
        "preempt_if_needed": false
    });
    if let Some(t) = queue_timeout {
        b["queue_timeout_seconds"] = json!(t);
    }
    b
}

async fn delete(api: &Api, path: &str, token: &str) -> (StatusCode, Value) {
    let resp = api
        .http
        .delete(format!("{}{path}", api.base))
        .bearer_auth(token)
        .send()
        .await
        .expect("request sent");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn live_leases(api: &Api, token: &str) -> Vec<Value> {
    let (_, l) = api
        .get(
            "/api/v1/capability-leases?capability_id=cam-front-01&active_only=true",
            Some(token),
        )
        .await;
    l["leases"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn maintenance_tells_the_holder_refuses_new_requests_and_ends_cleanly() {
    let (_dir, reg, api, admin) = registry_with_p1(|_| {}).await;
    let a = new_token(&reg, Role::AuditAgent, "audit:a").await;
    let (_, held) = status_is(
        api.request_lease(&a, &lease_body("cam-front-01", "audit:a", None))
            .await,
        StatusCode::CREATED,
    );
    assert_eq!(held["status"], "granted");

    // Only an admin may do it.
    let (s, _) = api
        .post(
            "/api/v1/capabilities/cam-front-01/maintenance",
            Some(&a),
            &json!({"reason": "lens swap"}),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    let (_, m) = status_is(
        api.post(
            "/api/v1/capabilities/cam-front-01/maintenance",
            Some(&admin),
            &json!({"reason": "lens swap"}),
        )
        .await,
        StatusCode::OK,
    );
    assert_eq!(m["capabilities"][0]["status"], "maintenance");
    let told = &m["notified_leases"][0];
    assert_eq!(told["lease_id"], held["lease_id"]);
    assert_eq!(told["status"], "grace_period");
    assert_eq!(told["preempt_reason"], "maintenance");
    assert!(told["grace_until"].is_string());

    // A new request by id is refused, naming the reason; no row is left.
    let b = new_token(&reg, Role::AuditAgent, "audit:b").await;
    let (s, e) = api
        .request_lease(&b, &lease_body("cam-front-01", "audit:b", None))
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(e["error"]["code"], "capability_in_maintenance");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("lens swap"),
        "{e}"
    );
    assert_eq!(live_leases(&api, &admin).await.len(), 1);

    // Removal is refused while the holder still holds it.
    let (s, e) = delete(&api, "/api/v1/capabilities/cam-front-01", &admin).await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(e["error"]["code"], "capability_leased");

    // The events record the start and the notice.
    let events = reg.bus.replay(0, 1000).await.unwrap();
    let started = events
        .iter()
        .find(|e| e.event_type.as_str() == "capability_maintenance_started")
        .expect("maintenance started event");
    assert_eq!(started.data["reason"], "lens swap");
    assert!(events.iter().any(|e| {
        e.event_type.as_str() == "lease_preempt_requested"
            && e.data["notice"]["preempt_reason"] == "maintenance"
    }));

    // Out of maintenance: grantable again once the holder let go.
    api.lease_post(
        &a,
        held["lease_id"].as_str().unwrap(),
        "release",
        &json!({}),
    )
    .await;
    let (_, m) = status_is(
        delete(
            &api,
            "/api/v1/capabilities/cam-front-01/maintenance",
            &admin,
        )
        .await,
        StatusCode::OK,
    );
    assert_eq!(m["capabilities"][0]["status"], "available");
    let (_, g) = status_is(
        api.request_lease(&b, &lease_body("cam-front-01", "audit:b", None))
            .await,
        StatusCode::CREATED,
    );
    assert_eq!(g["status"], "granted");
    let events = reg.bus.replay(0, 1000).await.unwrap();
    assert!(events
        .iter()
        .any(|e| e.event_type.as_str() == "capability_maintenance_ended"));
    reg.shutdown().await;
}

#[tokio::test]
async fn a_retired_capability_in_maintenance_is_removed() {
    let (_dir, reg, api, admin) = registry_with_p1(|_| {}).await;
    // Not in maintenance: refused, still there.
    let (s, e) = delete(&api, "/api/v1/capabilities/thumb-robot-01", &admin).await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(e["error"]["code"], "capability_not_in_maintenance");
    status_is(
        api.post(
            "/api/v1/capabilities/thumb-robot-01/maintenance",
            Some(&admin),
            &json!({"reason": "retired"}),
        )
        .await,
        StatusCode::OK,
    );
    status_is(
        delete(&api, "/api/v1/capabilities/thumb-robot-01", &admin).await,
        StatusCode::OK,
    );
    let (s, _) = api
        .get("/api/v1/capabilities/thumb-robot-01", Some(&admin))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let events = reg.bus.replay(0, 1000).await.unwrap();
    assert!(events
        .iter()
        .any(|e| e.event_type.as_str() == "capability_removed"));
    reg.shutdown().await;
}

#[tokio::test]
async fn an_unhealthy_capability_is_not_granted_until_healthy_again() {
    let (_dir, reg, api, admin) = registry_with_p1(|_| {}).await;
    let hb = |health: &str| {
        json!({"provider_id": "p1", "boot_id": "boot-1", "capabilities": [
            {"capability_id": "cam-front-01", "health_status": health}
        ]})
    };
    status_is(
        api.heartbeat(&admin, &hb("unhealthy")).await,
        StatusCode::OK,
    );
    let a = new_token(&reg, Role::AuditAgent, "audit:a").await;

    // Asked not to wait: refused with the reason, nothing queued.
    let (s, e) = api
        .request_lease(&a, &lease_body("cam-front-01", "audit:a", Some(0)))
        .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(e["error"]["code"], "capability_unhealthy");
    assert!(live_leases(&api, &admin).await.is_empty());

    // Otherwise it waits, and is granted when the capability is healthy.
    let (_, w) = status_is(
        api.request_lease(&a, &lease_body("cam-front-01", "audit:a", None))
            .await,
        StatusCode::ACCEPTED,
    );
    assert_eq!(w["status"], "requested");
    status_is(api.heartbeat(&admin, &hb("healthy")).await, StatusCode::OK);
    let id = w["lease_id"].as_str().unwrap();
    let mut status = Value::Null;
    for _ in 0..50 {
        let (_, l) = api.lease(&a, id).await;
        status = l["status"].clone();
        if status == "granted" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(status, "granted");
    reg.shutdown().await;
}

/// A lease request body on a selector.
fn selector_body(selector: Value, priority: u8) -> Value {
    let mut b = lease_body("unused", "audit:limited", Some(0));
    b.as_object_mut().unwrap().remove("capability_id");
    b["capability_selector"] = selector;
    b["priority"] = json!(priority);
    b
}

/// The refusal a principal beyond its policy sees: 403 `policy_denied`
/// naming the rule, and no lease left behind.
fn assert_denied(got: &(StatusCode, Value), rule: &str) {
    assert_error(got, StatusCode::FORBIDDEN, "policy_denied");
    assert_eq!(got.1["error"]["details"]["rule"], rule, "{}", got.1);
    let msg = got.1["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains(rule), "the message names the rule: {msg}");
}

#[tokio::test]
async fn principal_policy_refuses_each_rule_with_403_naming_it() {
    let (_dir, reg, api, admin) = registry_with_p1(|cfg| {
        let mut role = cloud_registry::policy::principal::LimitsConfig {
            max_priority: Some(60),
            max_concurrent_leases: Some(1),
            max_lease_seconds: Some(900),
            allowed_capability_types: Some(vec!["camera".parse().unwrap()]),
            allowed_tags: Some(vec!["front".into()]),
            allowed_preempt_reasons: Some(vec!["higher_priority_audit".into()]),
        };
        cfg.policy.roles.insert(Role::AuditAgent, role.clone());
        role = cloud_registry::policy::principal::LimitsConfig {
            max_priority: Some(90),
            ..Default::default()
        };
        cfg.policy.principals.insert("audit:trusted".into(), role);
    })
    .await;
    let limited = new_token(&reg, Role::AuditAgent, "audit:limited").await;
    let trusted = new_token(&reg, Role::AuditAgent, "audit:trusted").await;
    let by_id = |id: &str, priority: u8, seconds: u32| {
        let mut b = lease_body(id, "audit:limited", Some(0));
        b["priority"] = json!(priority);
        b["requested_duration_seconds"] = json!(seconds);
        b
    };

    let got = api
        .request_lease(&limited, &by_id("cam-front-01", 61, 600))
        .await;
    assert_denied(&got, "roles.audit_agent.max_priority");
    assert_eq!(got.1["error"]["details"]["limit"], 60);
    assert_eq!(got.1["error"]["details"]["value"], 61);

    let got = api
        .request_lease(&limited, &by_id("cam-front-01", 50, 901))
        .await;
    assert_denied(&got, "roles.audit_agent.max_lease_seconds");

    let got = api
        .request_lease(&limited, &by_id("thumb-robot-01", 50, 600))
        .await;
    assert_denied(&got, "roles.audit_agent.allowed_capability_types");

    let mut preempting = by_id("cam-front-01", 50, 600);
    preempting["preempt_if_needed"] = json!(true);
    preempting["preempt_reason"] = json!("because");
    let got = api.request_lease(&limited, &preempting).await;
    assert_denied(&got, "roles.audit_agent.allowed_preempt_reasons");

    // A selector must name an allowed tag, so it can only match
    // capabilities the principal may use.
    let got = api
        .request_lease(
            &limited,
            &selector_body(json!({"capability_type": "camera"}), 50),
        )
        .await;
    assert_denied(&got, "roles.audit_agent.allowed_tags");

    // Nothing of the refusals was stored.
    assert!(live_leases(&api, &admin).await.is_empty());

    // Within the policy: granted; a second lease is one too many.
    let (_, held) = status_is(
        api.request_lease(
            &limited,
            &selector_body(json!({"capability_type": "camera", "tags": ["front"]}), 50),
        )
        .await,
        StatusCode::CREATED,
    );
    assert_eq!(held["status"], "granted");
    assert_eq!(held["capability_id"], "cam-front-01");
    let got = api
        .request_lease(&limited, &by_id("cam-front-01", 50, 600))
        .await;
    assert_denied(&got, "roles.audit_agent.max_concurrent_leases");
    assert_eq!(live_leases(&api, &admin).await.len(), 1);

    // Its own table raises the priority ceiling and keeps the role's other
    // rules; an operator has no table and is not limited.
    let mut t = by_id("thumb-robot-01", 85, 600);
    t["holder_ref"] = json!("audit:trusted");
    let got = api.request_lease(&trusted, &t).await;
    assert_denied(&got, "roles.audit_agent.allowed_capability_types");
    let mut t = by_id("cam-front-01", 95, 600);
    t["holder_ref"] = json!("audit:trusted");
    let got = api.request_lease(&trusted, &t).await;
    assert_denied(&got, "principals.\"audit:trusted\".max_priority");
    let op = new_token(&reg, Role::Operator, "op:one").await;
    let mut o = by_id("thumb-robot-01", 100, 3600);
    o["holder_type"] = json!("human_operator");
    o["holder_ref"] = json!("op:one");
    let (_, robot) = status_is(api.request_lease(&op, &o).await, StatusCode::CREATED);
    assert_eq!(robot["status"], "granted");

    // Renewing beyond the longest lease is refused too.
    let lease_id = held["lease_id"].as_str().unwrap();
    let got = api
        .lease_post(
            &limited,
            lease_id,
            "renew",
            &json!({"requested_duration_seconds": 1200}),
        )
        .await;
    assert_denied(&got, "roles.audit_agent.max_lease_seconds");
    // Someone else renewing it is told it is not theirs, not the limit.
    let (_, body) = status_is(
        api.lease_post(
            &trusted,
            lease_id,
            "renew",
            &json!({"requested_duration_seconds": 1200}),
        )
        .await,
        StatusCode::FORBIDDEN,
    );
    assert_eq!(body["error"]["code"], "not_lease_holder", "{body}");
}

#[tokio::test]
async fn a_group_request_is_checked_member_by_member_and_counted_whole() {
    let (_dir, reg, api, admin) = registry_with_p1(|cfg| {
        cfg.policy.roles.insert(
            Role::AuditAgent,
            cloud_registry::policy::principal::LimitsConfig {
                max_concurrent_leases: Some(1),
                allowed_capability_types: Some(vec!["camera".parse().unwrap()]),
                ..Default::default()
            },
        );
    })
    .await;
    let a = new_token(&reg, Role::AuditAgent, "audit:g").await;
    let group = |ids: Value, requirements: Value| {
        json!({
            "capability_ids": ids,
            "requirements": requirements,
            "holder_type": "audit_agent",
            "holder_ref": "audit:g",
            "project_id": "proj_policy",
            "purpose": "group policy test",
            "priority": 50,
            "requested_duration_seconds": 600,
            "evidence_required": false,
            "preempt_if_needed": false,
            "queue_timeout_seconds": 0
        })
    };
    let got = api
        .post(
            "/api/v1/capability-leases/request-group",
            Some(&a),
            &group(
                json!(["cam-front-01"]),
                json!([{"capability_type": "thumb_robot", "mode": "exclusive"}]),
            ),
        )
        .await;
    assert_denied(&got, "roles.audit_agent.allowed_capability_types");
    let got = api
        .post(
            "/api/v1/capability-leases/request-group",
            Some(&a),
            &group(json!(["cam-front-01", "thumb-robot-01"]), json!([])),
        )
        .await;
    assert_denied(&got, "roles.audit_agent.allowed_capability_types");
    // Two cameras' worth of members against a limit of one lease.
    let got = api
        .post(
            "/api/v1/capability-leases/request-group",
            Some(&a),
            &group(
                json!(["cam-front-01"]),
                json!([{"capability_type": "camera", "mode": "exclusive", "fallback_allowed": true}]),
            ),
        )
        .await;
    assert_denied(&got, "roles.audit_agent.max_concurrent_leases");
    assert_eq!(got.1["error"]["details"]["value"], 2);
    assert!(live_leases(&api, &admin).await.is_empty());
}

#[tokio::test]
async fn an_audit_task_beyond_the_claimers_policy_is_refused_and_stays_claimable() {
    let (_dir, reg, api, admin) = registry_with_p1(|cfg| {
        let camera_only = cloud_registry::policy::principal::LimitsConfig {
            allowed_capability_types: Some(vec!["camera".parse().unwrap()]),
            ..Default::default()
        };
        cfg.policy
            .principals
            .insert("audit:camera-only".into(), camera_only);
    })
    .await;
    let limited = new_token(&reg, Role::AuditAgent, "audit:camera-only").await;
    let other = new_token(&reg, Role::AuditAgent, "audit:other").await;
    let mut req = audit_request("audit_policy_001", "software", 50);
    req["capability_requirements"] =
        json!([{ "capability_type": "thumb_robot", "mode": "exclusive" }]);
    status_is(
        api.post("/api/v1/audit-requests", Some(&admin), &req).await,
        StatusCode::CREATED,
    );
    let claim =
        |agent: &str| json!({ "audit_types": ["software"], "agent_ref": agent, "wait_ms": 0 });

    let got = api
        .post(
            "/api/v1/audit-requests/claim",
            Some(&limited),
            &claim("audit:camera-only"),
        )
        .await;
    assert_denied(
        &got,
        "principals.\"audit:camera-only\".allowed_capability_types",
    );
    assert!(live_leases(&api, &admin).await.is_empty());
    let (_, record) = status_is(
        api.get("/api/v1/audit-requests/audit_policy_001", Some(&admin))
            .await,
        StatusCode::OK,
    );
    assert_eq!(record["status"], "queued", "{record}");

    let (_, task) = status_is(
        api.post(
            "/api/v1/audit-requests/claim",
            Some(&other),
            &claim("audit:other"),
        )
        .await,
        StatusCode::OK,
    );
    assert_eq!(
        task["claim"]["audit_request_id"], "audit_policy_001",
        "{task}"
    );
}
