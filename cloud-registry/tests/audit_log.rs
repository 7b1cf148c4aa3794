//! The event log's hash chain as an auditor meets it: a registry writes
//! events and signs checkpoints; `cloud-registry audit-log verify` (the
//! real binary) passes on the untouched store and names the first bad
//! event when one row is changed, deleted, moved, cut off the end or the
//! chain rewritten after a change; the registry refuses to start on a
//! broken chain unless told (docs/audit-trail.md).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cloud_registry::app::{AppError, Registry};
use cloud_registry::events::chain;
use cloud_registry::sql::{params, Connection};
use common::*;
use serde_json::Value;
use tempfile::TempDir;

/// A registry that ran, registered p1, flipped a capability's health a
/// few times and stopped (signing its last checkpoint): its directory and
/// a config file naming its store.
async fn used_store() -> (TempDir, PathBuf, u64) {
    let (dir, reg, api, admin) = registry_with_p1(|_| {}).await;
    for i in 0..6 {
        let health = if i % 2 == 0 { "degraded" } else { "healthy" };
        let r = api
            .heartbeat(
                &admin,
                &serde_json::json!({"provider_id": "p1", "capabilities": [
                    {"capability_id": "cam-front-01", "health_status": health}
                ]}),
            )
            .await;
        assert_eq!(r.0, reqwest::StatusCode::OK);
    }
    let last = cloud_registry::app::last_event_id(&reg.db).await.unwrap();
    assert!(last >= 8, "{last} events");
    reg.shutdown().await;
    let config = dir.path().join("registry.toml");
    std::fs::write(&config, store_toml(&dir)).unwrap();
    (dir, config, last)
}

fn verify(config: &Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cloud-registry"))
        .args(["audit-log", "verify", "--config"])
        .arg(config)
        .args(extra)
        .output()
        .expect("cloud-registry runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("panicked"), "{text}");
    (out.status.success(), text)
}

/// Change the store at `config` with `sql` after dropping the
/// append-only triggers (what someone with the file can do).
///
/// On a thread of its own: a store connection blocks, which must not
/// happen on the test's runtime thread.
fn tamper(dir: &TempDir, f: impl FnOnce(&Connection) + Send) {
    std::thread::scope(|s| {
        s.spawn(|| {
            let conn = store_connection(dir);
            drop_append_only(&conn, &["events", "event_checkpoints"]);
            f(&conn);
        })
        .join()
        .unwrap()
    });
}

#[tokio::test]
async fn an_untouched_log_verifies_and_its_checkpoint_names_the_head() {
    let (dir, config, last) = used_store().await;
    let (ok, text) = verify(&config, &[]);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!("events 1..{last} chained")),
        "{text}"
    );
    let (ok, json) = verify(&config, &["--json"]);
    assert!(ok, "{json}");
    let v: Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(v["verified"]["last"], last);
    assert_eq!(
        v["verified"]["newest_checkpoint"], last,
        "shutdown signs the head"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_cloud-registry"))
        .args(["audit-log", "checkpoint", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success());
    let c: chain::Checkpoint = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(c.event_id, last);
    let key = std::fs::read_to_string(dir.path().join("registry.sqlite3.signing-key.pub")).unwrap();
    c.check_signature(key.trim()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("registry.sqlite3.signing-key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "the signing key is private");

    // Another key than the registry's: its checkpoints do not verify.
    let other = hex::encode(
        ed25519_dalek::SigningKey::from_bytes(&[9; 32])
            .verifying_key()
            .as_bytes(),
    );
    let (ok, text) = verify(&config, &["--public-key", &other]);
    assert!(!ok && text.contains("does not verify"), "{text}");
}

#[tokio::test]
async fn a_changed_row_fails_at_that_row() {
    let (dir, config, _) = used_store().await;
    tamper(&dir, |c| {
        c.execute(
            "UPDATE events SET data = '{\"health_status\":\"healthy\"}' WHERE event_id = 5",
            [],
        )
        .unwrap();
    });
    let (ok, text) = verify(&config, &["--json"]);
    assert!(!ok, "{text}");
    let v: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["event_id"], 5, "{v}");
    assert!(v["error"].as_str().unwrap().contains("was changed"), "{v}");
}

#[tokio::test]
async fn a_deleted_row_fails_where_it_is_missing() {
    let (dir, config, _) = used_store().await;
    tamper(&dir, |c| {
        c.execute("DELETE FROM events WHERE event_id = 4", [])
            .unwrap();
    });
    let (ok, text) = verify(&config, &[]);
    assert!(!ok, "{text}");
    assert!(text.contains("event 4: missing"), "{text}");
}

#[tokio::test]
async fn two_rows_swapped_fail_at_the_first() {
    let (dir, config, _) = used_store().await;
    tamper(&dir, |c| {
        let cols = "event_type, occurred_at, actor, provider_id, capability_id, lease_id, \
                    session_id, artifact_id, audit_request_id, data";
        c.execute_batch(&format!(
            "CREATE TEMP TABLE t AS SELECT event_id, {cols} FROM events WHERE event_id IN (3, 6);
             UPDATE events SET ({cols}) = (SELECT {cols} FROM t WHERE t.event_id = 6) WHERE event_id = 3;
             UPDATE events SET ({cols}) = (SELECT {cols} FROM t WHERE t.event_id = 3) WHERE event_id = 6;"
        ))
        .unwrap();
    });
    let (ok, text) = verify(&config, &["--json"]);
    assert!(!ok, "{text}");
    let v: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["event_id"], 3, "{v}");
}

#[tokio::test]
async fn events_cut_off_the_end_are_caught_by_a_checkpoint() {
    let (dir, config, last) = used_store().await;
    // An auditor kept the newest checkpoint apart from the store.
    let kept = dir.path().join("kept-checkpoint.json");
    let out = Command::new(env!("CARGO_BIN_EXE_cloud-registry"))
        .args(["audit-log", "checkpoint", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    std::fs::write(&kept, &out.stdout).unwrap();
    tamper(&dir, |c| {
        c.execute(
            "DELETE FROM events WHERE event_id > ?1",
            params![(last - 2) as i64],
        )
        .unwrap();
    });
    let (ok, text) = verify(&config, &[]);
    assert!(!ok, "{text}");
    assert!(text.contains("cut off the end"), "{text}");
    // The store's checkpoints removed as well: the kept one still tells.
    tamper_checkpoints_away(&dir);
    let (ok, text) = verify(&config, &[]);
    assert!(
        ok,
        "without any checkpoint the shortened chain is sound: {text}"
    );
    let (ok, text) = verify(&config, &["--checkpoint", kept.to_str().unwrap()]);
    assert!(!ok && text.contains("cut off the end"), "{text}");
}

fn tamper_checkpoints_away(dir: &TempDir) {
    std::thread::scope(|s| {
        s.spawn(|| {
            let conn = store_connection(dir);
            drop_append_only(&conn, &["event_checkpoints"]);
            conn.execute_batch("DELETE FROM event_checkpoints").unwrap();
        })
        .join()
        .unwrap()
    });
}

#[tokio::test]
async fn a_chain_rewritten_after_a_change_contradicts_the_signed_checkpoint() {
    let (dir, config, _) = used_store().await;
    // Change event 5 and compute every later hash again, as someone who
    // knows the scheme but not the key would.
    tamper(&dir, |c| {
        c.execute(
            "UPDATE events SET actor = 'someone-else' WHERE event_id = 5",
            [],
        )
        .unwrap();
        let rows: Vec<(i64, String)> = {
            let mut s = c
                .prepare("SELECT event_id, prev_hash FROM events ORDER BY event_id")
                .unwrap();
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        let mut prev = rows[0].1.clone();
        for (id, _) in rows {
            let row: chain::ChainRow = c
                .query_row(
                    "SELECT event_type, occurred_at, actor, provider_id, capability_id, lease_id,
                            session_id, artifact_id, audit_request_id, data FROM events WHERE event_id = ?1",
                    params![id],
                    |r| {
                        Ok(chain::ChainRow {
                            event_id: id as u64,
                            event_type: r.get(0)?,
                            occurred_at: r.get(1)?,
                            actor: r.get(2)?,
                            provider_id: r.get(3)?,
                            capability_id: r.get(4)?,
                            lease_id: r.get(5)?,
                            session_id: r.get(6)?,
                            artifact_id: r.get(7)?,
                            audit_request_id: r.get(8)?,
                            data: r.get(9)?,
                        })
                    },
                )
                .unwrap();
            let hash = chain::row_hash(&prev, &row);
            c.execute(
                "UPDATE events SET prev_hash = ?1, hash = ?2 WHERE event_id = ?3",
                params![prev, hash, id],
            )
            .unwrap();
            prev = hash;
        }
    });
    let (ok, text) = verify(&config, &[]);
    assert!(!ok, "{text}");
    assert!(text.contains("the log was rewritten"), "{text}");
}

#[tokio::test]
async fn the_registry_refuses_a_broken_chain_unless_told() {
    let (dir, _config, last) = used_store().await;
    tamper(&dir, |c| {
        c.execute("UPDATE events SET actor = 'x' WHERE event_id = 2", [])
            .unwrap();
    });
    let mut cfg = test_config(&dir);
    cfg.auth.bootstrap_admin_token_file = None;
    let err = match Registry::start(cfg.clone()).await {
        Err(e) => e,
        Ok(_) => panic!("a registry started on a broken chain"),
    };
    assert!(matches!(err, AppError::ChainBroken(_)), "{err}");
    assert!(err.to_string().contains("event 2"), "{err}");

    cfg.audit_log.accept_broken_chain = true;
    let reg = Registry::start(cfg).await.expect("starts when told");
    let api = Api::new(&reg.base_url());
    // Events go on from the old head.
    let admin = new_token(&reg, shared_protocol::api::Role::Admin, "after-break").await;
    let r = api.get("/api/v1/capabilities", Some(&admin)).await;
    assert_eq!(r.0, reqwest::StatusCode::OK);
    register_p1(&api, &admin).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let now = cloud_registry::app::last_event_id(&reg.db).await.unwrap();
    assert!(now > last, "{now} > {last}");
    reg.shutdown().await;
}
