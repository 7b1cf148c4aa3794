//! A long reader on the registry's store, and a backup of a running
//! registry, across real processes (`bench-sim`, `cloud-registry`,
//! `edge-agent`, and a second SQLite connection of this test on the real
//! store file): while the reader holds one read transaction and leases
//! are written, the registry warns that checkpoints cannot keep up and
//! `/metrics` shows it; `cloud-registry backup` copies the store meanwhile
//! into a database that opens and holds the leases.

use std::process::Command;
use std::time::{Duration, Instant};

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT};
use benchlink_e2e::client::Agent;
use benchlink_e2e::workspace_bin;
use benchlink_testkit::status_is;
use reqwest::StatusCode;
use serde_json::Value;

/// One lease requested and released: a few writes.
async fn lease_cycle(hw: &Agent) -> String {
    let (_, v) = status_is(
        hw.lease(caps::SPEAKER, 10, "wal growth", None, 5)
            .await
            .unwrap(),
        StatusCode::CREATED,
    );
    let id = v["lease_id"].as_str().unwrap().to_string();
    let _ = status_is(hw.release(&id).await.unwrap(), StatusCode::OK);
    id
}

fn registry_log(lab: &Lab) -> String {
    std::fs::read_to_string(lab.root.join("logs/registry.log")).unwrap_or_default()
}

async fn metric(lab: &Lab, line_start: &str) -> Option<f64> {
    let text = reqwest::get(format!("{}/metrics", lab.base_url))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.starts_with(line_start))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_reader_is_warned_about_and_a_backup_does_not_need_one() {
    let lab = Lab::start(LabOptions::default()).await.expect("lab starts");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    for _ in 0..20 {
        lease_cycle(&hw).await;
    }
    assert!(!registry_log(&lab).contains("WAL checkpoints cannot keep up"));

    // An operator's shell inside a read transaction.
    let reader = rusqlite::Connection::open_with_flags(
        &lab.store_path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let held: i64 = reader
        .query_row("SELECT COUNT(*) FROM capability_leases", [], |r| r.get(0))
        .unwrap();
    assert!(held >= 20);

    let started = Instant::now();
    let mut warned = false;
    while started.elapsed() < Duration::from_secs(30) {
        for _ in 0..10 {
            lease_cycle(&hw).await;
        }
        if registry_log(&lab).contains("WAL checkpoints cannot keep up") {
            warned = true;
            break;
        }
    }
    assert!(
        warned,
        "no warning while a reader held its snapshot for 30 s"
    );
    let lag = metric(&lab, "benchlink_store_checkpoint_lag_frames ")
        .await
        .unwrap();
    assert!(lag > 256.0, "lag {lag} frames");
    let behind = metric(&lab, "benchlink_store_checkpoint_behind_seconds ")
        .await
        .unwrap();
    assert!(behind >= 5.0, "behind for {behind} s");
    let incomplete = metric(
        &lab,
        "benchlink_store_checkpoints_total{result=\"incomplete\"}",
    )
    .await
    .unwrap();
    assert!(incomplete > 0.0);
    let wal_bytes = metric(&lab, "benchlink_store_wal_bytes ").await.unwrap();
    assert!(wal_bytes > 0.0);
    eprintln!(
        "warned after {:.1} s: lag {lag} frames, WAL {wal_bytes} bytes",
        started.elapsed().as_secs_f64()
    );

    // The reader goes: checkpoints catch up.
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    benchlink_e2e::poll_until(Duration::from_secs(10), "checkpoints keep up", || async {
        registry_log(&lab)
            .contains("WAL checkpoints keep up again")
            .then_some(())
    })
    .await
    .unwrap();

    // A backup while the registry runs and writes.
    let last = lease_cycle(&hw).await;
    let scratch = tempfile::tempdir().unwrap();
    let copy = scratch.path().join("backup.sqlite3");
    let writer = {
        let hw = hw.clone();
        tokio::spawn(async move {
            for _ in 0..20 {
                lease_cycle(&hw).await;
            }
        })
    };
    let out = Command::new(workspace_bin("cloud-registry"))
        .args(["backup", "--config"])
        .arg(lab.registry_config())
        .arg("--to")
        .arg(&copy)
        .args(["--pages-per-step", "16"])
        .output()
        .unwrap();
    writer.await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["path"], copy.display().to_string(), "{report}");
    assert!(report["pages"].as_u64().unwrap() > 0, "{report}");
    let db = rusqlite::Connection::open(&copy).unwrap();
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let (leases, has_last): (i64, bool) = db
        .query_row(
            "SELECT COUNT(*), SUM(lease_id = ?1) > 0 FROM capability_leases",
            [&last],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(leases > held, "{leases} leases in the copy");
    assert!(has_last, "the lease released before the backup is in it");
    assert!(
        !scratch.path().join("backup.sqlite3.partial").exists(),
        "the partial copy is gone"
    );
}
