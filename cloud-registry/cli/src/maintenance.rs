//! `benchlink maintenance start|end` and `benchlink capability remove`:
//! the registry's maintenance endpoints (docs/policy.md "Maintenance",
//! docs/http-api.md), admins only. Each prints one line naming what
//! changed, or the registry's JSON with `--json`.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::cli::{CapabilityCommand, MaintenanceCommand, MaintenanceTarget};
use crate::run::{cell, Ctx, Outcome};

/// The maintenance path of `target`: a capability's or a provider's.
fn maintenance_path(target: &MaintenanceTarget) -> String {
    match (&target.provider, &target.capability_id) {
        (Some(p), _) => format!("/api/v1/capability-providers/{p}/maintenance"),
        (None, Some(c)) => format!("/api/v1/capabilities/{c}/maintenance"),
        // clap requires one of the two.
        (None, None) => String::new(),
    }
}

/// `n` and `one` or `many`, e.g. `1 holder`, `2 holders`.
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The capability ids of a maintenance answer, each with its status
/// when `with_status`.
fn capability_list(answer: &Value, with_status: bool) -> Vec<String> {
    answer["capabilities"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            if with_status {
                format!("{} ({})", cell(&c["capability_id"]), cell(&c["status"]))
            } else {
                cell(&c["capability_id"])
            }
        })
        .collect()
}

/// The line for a maintenance start, e.g. `cam-front-01 is in
/// maintenance (lens swap); 1 holder told to give way: lease_…`.
pub fn started_line(target: &MaintenanceTarget, reason: &str, answer: &Value) -> String {
    let caps = capability_list(answer, false);
    let what = match &target.provider {
        Some(p) => format!(
            "{} of {p} in maintenance ({reason}): {}",
            count(caps.len(), "capability", "capabilities"),
            if caps.is_empty() {
                "-".to_string()
            } else {
                caps.join(", ")
            }
        ),
        None => format!("{} is in maintenance ({reason})", caps.join(", ")),
    };
    let leases: Vec<String> = answer["notified_leases"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| cell(&l["lease_id"]))
        .collect();
    if leases.is_empty() {
        format!("{what}; no holder to tell")
    } else {
        format!(
            "{what}; {} told to give way: {}",
            count(leases.len(), "holder", "holders"),
            leases.join(", ")
        )
    }
}

/// The line for a maintenance end, e.g. `cam-front-01 is out of
/// maintenance: available`.
pub fn ended_line(target: &MaintenanceTarget, answer: &Value) -> String {
    match &target.provider {
        Some(p) => {
            let caps = capability_list(answer, true);
            format!(
                "{} of {p} out of maintenance: {}",
                count(caps.len(), "capability", "capabilities"),
                if caps.is_empty() {
                    "-".to_string()
                } else {
                    caps.join(", ")
                }
            )
        }
        None => {
            let c = &answer["capabilities"][0];
            format!(
                "{} is out of maintenance: {}",
                cell(&c["capability_id"]),
                cell(&c["status"])
            )
        }
    }
}

/// `benchlink maintenance start|end`.
pub async fn maintenance(ctx: &Ctx, m: MaintenanceCommand) -> Outcome {
    let line = match m {
        MaintenanceCommand::Start { target, reason } => {
            let (_, v) = ctx
                .post(
                    &maintenance_path(&target),
                    &json!({ "reason": reason }),
                    &[StatusCode::OK],
                )
                .await?;
            if ctx.json {
                ctx.print_json(&v);
                return Ok(());
            }
            started_line(&target, &reason, &v)
        }
        MaintenanceCommand::End { target } => {
            let v = ctx.delete(&maintenance_path(&target)).await?;
            if ctx.json {
                ctx.print_json(&v);
                return Ok(());
            }
            ended_line(&target, &v)
        }
    };
    println!("{line}");
    Ok(())
}

/// `benchlink capability remove`.
pub async fn capability(ctx: &Ctx, c: CapabilityCommand) -> Outcome {
    match c {
        CapabilityCommand::Remove { capability_id } => {
            let v = ctx
                .delete(&format!("/api/v1/capabilities/{capability_id}"))
                .await?;
            if ctx.json {
                ctx.print_json(&v);
            } else {
                println!("{} removed", cell(&v["capability_id"]));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(cap: Option<&str>, provider: Option<&str>) -> MaintenanceTarget {
        MaintenanceTarget {
            capability_id: cap.map(str::to_string),
            provider: provider.map(str::to_string),
        }
    }

    #[test]
    fn lines_name_what_changed_and_who_was_told() {
        let answer = json!({
            "capabilities": [{"capability_id": "cam-front-01", "status": "maintenance"}],
            "notified_leases": [{"lease_id": "lease_01"}],
        });
        assert_eq!(
            started_line(&target(Some("cam-front-01"), None), "lens swap", &answer),
            "cam-front-01 is in maintenance (lens swap); 1 holder told to give way: lease_01"
        );
        let bench = json!({
            "capabilities": [
                {"capability_id": "a", "status": "available"},
                {"capability_id": "b", "status": "offline"}
            ],
            "notified_leases": [],
        });
        assert_eq!(
            started_line(&target(None, Some("prov")), "rewiring", &bench),
            "2 capabilities of prov in maintenance (rewiring): a, b; no holder to tell"
        );
        assert_eq!(
            ended_line(&target(None, Some("prov")), &bench),
            "2 capabilities of prov out of maintenance: a (available), b (offline)"
        );
        assert_eq!(
            ended_line(&target(Some("a"), None), &bench),
            "a is out of maintenance: available"
        );
    }

    #[test]
    fn a_provider_names_the_provider_path() {
        assert_eq!(
            maintenance_path(&target(None, Some("provider-winlab-01"))),
            "/api/v1/capability-providers/provider-winlab-01/maintenance"
        );
        assert_eq!(
            maintenance_path(&target(Some("cam-front-01"), None)),
            "/api/v1/capabilities/cam-front-01/maintenance"
        );
    }
}
