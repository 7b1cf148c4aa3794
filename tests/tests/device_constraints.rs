//! Device constraints across real processes (docs/policy.md "Device
//! constraints"): the edge declares `[capabilities.constraints]`, sends
//! them as the capability's `constraints_json`, and the registry refuses
//! an action outside them with 422 `constraint_violated` before anything
//! is sent: the simulated Korad supply (bench-sim's journal on a real pty)
//! never sees the command, no session is stored and no budget is spent.

use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, CHIEF_AGENT, HW_AGENT};
use benchlink_e2e::client::Agent;
use benchlink_e2e::eventually;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// The setpoint commands (`VSET1:5.00`, `ISET1:1.000`) the supply
/// received so far, queries left out.
fn setpoints(lab: &Lab) -> Vec<String> {
    lab.psu_commands()
        .iter()
        .filter_map(|c| c["command"].as_str())
        .filter(|c| c.starts_with("VSET1:") || c.starts_with("ISET1:"))
        .map(str::to_string)
        .collect()
}

async fn session_count(agent: &Agent, lease: &str) -> usize {
    let sessions = agent
        .get_ok(&format!("/api/v1/capability-leases/{lease}/sessions"))
        .await
        .expect("sessions");
    sessions["sessions"].as_array().map_or(0, Vec::len)
}

/// Asserts `(status, body)` is the 422 of `constraint` on `param`.
fn assert_violation(got: &(StatusCode, Value), constraint: &str, param: &str, value: f64) {
    let (s, body) = got;
    assert_eq!(*s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "constraint_violated", "{body}");
    let d = &body["error"]["details"];
    assert_eq!(d["constraint"], constraint, "{body}");
    assert_eq!(d["param"], param, "{body}");
    assert_eq!(d["value"], value, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(constraint), "{message}");
    assert!(message.contains("nothing was sent"), "{message}");
}

#[tokio::test]
async fn actions_outside_the_declared_constraints_get_422_and_reach_no_device() {
    let lab = Lab::start(LabOptions {
        capability_keys: vec![
            (
                caps::PSU.to_string(),
                "constraints = { max_voltage_v = 6.0, max_current_a = 1.0 }".to_string(),
            ),
            (
                caps::ROBOT.to_string(),
                "constraints = { work_area_mm = { x_min = 10.0, x_max = 60.0, y_min = 10.0, y_max = 130.0 } }"
                    .to_string(),
            ),
        ],
        // One press per lease: a refused tap must not use it up.
        registry_extra_toml: "[policy.budgets.thumb_robot]\nper_lease = 1\n".to_string(),
        ..Default::default()
    })
    .await
    .expect("lab");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);

    // The registry holds what the edge declared.
    let psu_cap = hw.capability(caps::PSU).await;
    assert_eq!(
        psu_cap["constraints_json"]["max_voltage_v"], 6.0,
        "{psu_cap}"
    );
    let robot_cap = hw.capability(caps::ROBOT).await;
    assert_eq!(
        robot_cap["constraints_json"]["work_area_mm"]["x_max"], 60.0,
        "{robot_cap}"
    );

    // PSU: within the ceiling it is set, above it nothing is sent.
    let psu = hw.lease_ok(caps::PSU, "psu constraints").await.unwrap();
    hw.act_ok(&psu, "set_voltage", json!({"voltage_v": 5.0}))
        .await
        .expect("within max_voltage_v");
    let before = eventually(Duration::from_secs(3), "the VSET journaled", || async {
        let s = setpoints(&lab);
        s.iter().any(|c| c == "VSET1:5.00").then_some(s)
    })
    .await;
    let over = hw
        .act(&psu, "set_voltage", json!({"voltage_v": 9.0}), 10_000)
        .await
        .unwrap();
    assert_violation(&over, "max_voltage_v", "voltage_v", 9.0);
    assert_eq!(over.1["error"]["details"]["limit"], 6.0, "{}", over.1);
    let on = hw
        .act(
            &psu,
            "power_on",
            json!({"voltage_v": 5.0, "current_limit_a": 1.5}),
            10_000,
        )
        .await
        .unwrap();
    assert_violation(&on, "max_current_a", "current_limit_a", 1.5);
    assert_eq!(
        session_count(&hw, &psu).await,
        1,
        "no session for a refusal"
    );
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(
        setpoints(&lab),
        before,
        "the supply saw no further setpoint"
    );

    // Robot: a tap outside the work area (inside the robot's bounds) is
    // refused and spends nothing of the one-press budget.
    let robot = hw.lease_ok(caps::ROBOT, "robot constraints").await.unwrap();
    let outside = hw
        .act(&robot, "tap", json!({"x_mm": 65.0, "y_mm": 70.0}), 10_000)
        .await
        .unwrap();
    assert_violation(&outside, "work_area_mm", "x_mm", 65.0);
    assert_eq!(
        outside.1["error"]["details"]["limit"],
        json!({"x_min": 10.0, "x_max": 60.0, "y_min": 10.0, "y_max": 130.0})
    );
    let drag = hw
        .act(
            &robot,
            "drag",
            json!({"x_mm": 35.0, "y_mm": 70.0, "to_x_mm": 35.0, "to_y_mm": 5.0}),
            10_000,
        )
        .await
        .unwrap();
    assert_violation(&drag, "work_area_mm", "to_y_mm", 5.0);
    assert_eq!(session_count(&hw, &robot).await, 0);
    hw.act_ok(&robot, "tap", json!({"x_mm": 35.0, "y_mm": 70.0}))
        .await
        .expect("the budget's one press is still there");

    // Another principal gets the same refusal: the limit is the device's.
    let chief = Agent::new(&lab.base_url, CHIEF_AGENT, &lab.chief_token);
    let (s, _) = hw.release(&psu).await.unwrap();
    assert_eq!(s, StatusCode::OK);
    let psu2 = chief.lease_ok(caps::PSU, "psu constraints").await.unwrap();
    let again = chief
        .act(&psu2, "set_voltage", json!({"voltage_v": 6.5}), 10_000)
        .await
        .unwrap();
    assert_violation(&again, "max_voltage_v", "voltage_v", 6.5);

    // A lease that has ended is refused as such, whatever the action.
    let (s, _) = chief.release(&psu2).await.unwrap();
    assert_eq!(s, StatusCode::OK);
    let (s, body) = chief
        .act(&psu2, "set_voltage", json!({"voltage_v": 9.0}), 10_000)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "lease_not_usable", "{body}");
}
