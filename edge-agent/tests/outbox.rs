//! The evidence outbox on real files and a real SQLite database: ingest,
//! sha256, rows, the disk budget, crash recovery and queued session updates.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use benchlink_testkit::Tmpfs;
use edge_agent::config::{Durability, OutboxConfig};
use edge_agent::drivers::NewArtifact;
use edge_agent::outbox::{
    Outbox, OutboxError, RecoveryReport, SyncAnswer, UpdateKind, UploadState,
};
use serde_json::{json, Map};
use shared_protocol::artifact::ArtifactType;

const MIB: u64 = 1024 * 1024;

/// Queue a final `completed` session update `message_id` for `session_id`
/// naming `artifact_ids`; its queue sequence number.
fn queue_final(outbox: &Outbox, message_id: &str, session_id: &str, artifact_ids: &[&str]) -> i64 {
    outbox
        .queue_update_with_artifacts(
            message_id,
            session_id,
            b"completed",
            artifact_ids,
            UpdateKind::Final,
        )
        .unwrap()
}

fn config(dir: &Path, budget_bytes: u64) -> OutboxConfig {
    OutboxConfig {
        dir: dir.join("outbox"),
        db: dir.join("outbox.sqlite3"),
        disk_budget_bytes: budget_bytes,
        durability: Durability::Fsync,
    }
}

/// Deterministic non-repeating bytes (xorshift64*), so each artifact differs.
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn artifact(len: usize, seed: u64) -> NewArtifact {
    let mut metadata = Map::new();
    metadata.insert("width".into(), json!(1280));
    NewArtifact {
        artifact_type: ArtifactType::Image,
        content_type: "image/jpeg".into(),
        bytes: bytes(len, seed),
        duration_ms: None,
        metadata,
    }
}

/// sha256 of files by the system's `sha256sum` (an implementation
/// independent of the one under test).
fn sha256sum(paths: &[PathBuf]) -> HashMap<PathBuf, String> {
    let out = Command::new("sha256sum")
        .args(paths)
        .output()
        .expect("sha256sum is installed");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (sum, path) = l.split_once("  ").expect("sha256sum output");
            (PathBuf::from(path), sum.to_string())
        })
        .collect()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn ingest_writes_the_file_records_its_sha256_and_a_pending_row() {
    let tmp = tempfile::tempdir().unwrap();
    let (outbox, report) =
        Outbox::open(&config(tmp.path(), 64 * MIB), "provider-bench-07").unwrap();
    assert_eq!(report, RecoveryReport::default());

    let input = artifact(1_000_003, 1);
    let expected_bytes = input.bytes.clone();
    let art = outbox.ingest("sess-001", input).unwrap();

    assert!(art.artifact_id.starts_with("art-"));
    assert_eq!(art.session_id, "sess-001");
    assert_eq!(art.size_bytes, 1_000_003);
    assert_eq!(art.content_type, "image/jpeg");
    assert_eq!(
        art.storage_uri,
        format!("edge-outbox://provider-bench-07/{}", art.artifact_id)
    );
    assert_eq!(art.metadata_json["width"], json!(1280));
    assert!(!art.uploaded);

    let path = outbox.file_path(&art.artifact_id);
    assert_eq!(std::fs::read(&path).unwrap(), expected_bytes);
    let sums = sha256sum(std::slice::from_ref(&path));
    assert_eq!(
        sums[&path], art.checksum,
        "recorded sha256 = sha256sum of the file"
    );

    let row = outbox.artifact(&art.artifact_id).unwrap().expect("row");
    assert_eq!(row.state, UploadState::Pending);
    assert_eq!(row.artifact, art, "the row holds exactly what was returned");
    assert_eq!(
        files_in(outbox.dir()),
        vec![art.artifact_id.clone()],
        "no temp files left"
    );

    let stats = outbox.stats().unwrap();
    assert_eq!(stats.pending_artifacts, 1);
    assert_eq!(stats.pending_bytes, 1_000_003);
}

#[test]
fn a_batch_gets_one_row_and_one_file_per_artifact() {
    let tmp = tempfile::tempdir().unwrap();
    let (outbox, _) = Outbox::open(&config(tmp.path(), 64 * MIB), "p").unwrap();
    let arts = outbox
        .ingest_batch(
            "sess-batch",
            (0..20)
                .map(|i| artifact(65_536 + i, 100 + i as u64))
                .collect(),
        )
        .unwrap();
    assert_eq!(arts.len(), 20);
    let paths: Vec<PathBuf> = arts
        .iter()
        .map(|a| outbox.file_path(&a.artifact_id))
        .collect();
    let sums = sha256sum(&paths);
    for a in &arts {
        assert_eq!(sums[&outbox.file_path(&a.artifact_id)], a.checksum);
        assert_eq!(
            outbox.artifact(&a.artifact_id).unwrap().unwrap().state,
            UploadState::Pending
        );
    }
    assert_eq!(outbox.stats().unwrap().pending_artifacts, 20);
}

#[test]
fn the_disk_budget_refuses_new_captures_and_never_drops_pending_evidence() {
    let tmp = tempfile::tempdir().unwrap();
    let (outbox, _) = Outbox::open(&config(tmp.path(), MIB), "p").unwrap();
    let first = outbox.ingest("sess-1", artifact(600 * 1024, 1)).unwrap();

    let err = outbox
        .ingest("sess-2", artifact(600 * 1024, 2))
        .expect_err("over budget");
    assert!(matches!(err, OutboxError::BudgetExhausted { .. }));
    assert_eq!(
        err.to_string(),
        "outbox disk budget of 1 MiB exhausted: 1 pending artifacts await upload"
    );
    assert_eq!(
        files_in(outbox.dir()),
        vec![first.artifact_id.clone()],
        "nothing written for the refused capture, nothing deleted"
    );
    assert_eq!(
        outbox.artifact(&first.artifact_id).unwrap().unwrap().state,
        UploadState::Pending
    );

    // The budget survives a restart.
    drop(outbox);
    let (outbox, _) = Outbox::open(&config(tmp.path(), MIB), "p").unwrap();
    assert!(matches!(
        outbox.ingest("sess-2", artifact(600 * 1024, 2)),
        Err(OutboxError::BudgetExhausted {
            pending_artifacts: 1,
            ..
        })
    ));

    // Bytes confirmed but metadata not yet acknowledged: the file is still
    // the evidence and still counts.
    let seq = queue_final(&outbox, "m-1", "sess-1", &[&first.artifact_id]);
    outbox.mark_uploaded(&first.artifact_id).unwrap();
    assert!(outbox.file_path(&first.artifact_id).exists());
    assert!(matches!(
        outbox.ingest("sess-2", artifact(600 * 1024, 2)),
        Err(OutboxError::BudgetExhausted { .. })
    ));

    // Once the registry has both, there is room again.
    outbox.remove_updates(&[seq]).unwrap();
    assert!(!outbox.file_path(&first.artifact_id).exists());
    assert_eq!(
        outbox.artifact(&first.artifact_id).unwrap().unwrap().state,
        UploadState::Uploaded
    );
    outbox.ingest("sess-2", artifact(600 * 1024, 2)).unwrap();
}

#[test]
fn an_artifact_larger_than_the_whole_budget_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (outbox, _) = Outbox::open(&config(tmp.path(), MIB), "p").unwrap();
    let err = outbox
        .ingest("sess-1", artifact(2 * MIB as usize, 1))
        .expect_err("too big");
    assert_eq!(
        err.to_string(),
        "outbox disk budget of 1 MiB exhausted: 0 pending artifacts await upload"
    );
    assert!(files_in(outbox.dir()).is_empty());
}

#[test]
fn an_invalid_session_id_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let (outbox, _) = Outbox::open(&config(tmp.path(), MIB), "p").unwrap();
    let err = outbox
        .ingest("../etc", artifact(10, 1))
        .expect_err("refused");
    assert!(matches!(err, OutboxError::Invalid(_)), "{err}");
    assert!(files_in(outbox.dir()).is_empty());
}

#[test]
fn start_up_removes_temp_files_and_quarantines_files_without_a_row() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 64 * MIB);
    let (outbox, _) = Outbox::open(&cfg, "p").unwrap();
    let kept = outbox.ingest("sess-1", artifact(1000, 1)).unwrap();
    drop(outbox);

    // What a crash leaves: a half-written temp file and a renamed file
    // whose row was never committed.
    std::fs::write(cfg.dir.join(".art-half-written.part"), b"partial").unwrap();
    std::fs::write(cfg.dir.join("art-never-committed"), b"complete bytes").unwrap();

    let (outbox, report) = Outbox::open(&cfg, "p").unwrap();
    assert_eq!(report.temp_files_removed, 1);
    assert_eq!(report.orphans_quarantined, 1);
    assert_eq!(files_in(&cfg.dir), vec![kept.artifact_id.clone()]);
    assert_eq!(
        std::fs::read(cfg.dir.join("orphaned/art-never-committed")).unwrap(),
        b"complete bytes"
    );
    assert_eq!(
        outbox.artifact(&kept.artifact_id).unwrap().unwrap().state,
        UploadState::Pending
    );
}

#[test]
fn a_committed_artifact_whose_rename_was_lost_is_restored_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 64 * MIB);
    let (outbox, _) = Outbox::open(&cfg, "p").unwrap();
    let art = outbox.ingest("sess-1", artifact(5000, 7)).unwrap();
    drop(outbox);
    // A power cut can lose the rename while the row (fsync'ed later) stays.
    let fin = cfg.dir.join(&art.artifact_id);
    std::fs::rename(&fin, cfg.dir.join(format!(".{}.part", art.artifact_id))).unwrap();

    let (outbox, report) = Outbox::open(&cfg, "p").unwrap();
    assert_eq!(report.temp_files_promoted, 1);
    assert_eq!(sha256sum(std::slice::from_ref(&fin))[&fin], art.checksum);
    assert_eq!(
        outbox.artifact(&art.artifact_id).unwrap().unwrap().state,
        UploadState::Pending
    );
}

#[test]
fn a_pending_row_whose_file_vanished_is_marked_lost_and_frees_the_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), MIB);
    let (outbox, _) = Outbox::open(&cfg, "p").unwrap();
    let art = outbox.ingest("sess-1", artifact(900 * 1024, 1)).unwrap();
    drop(outbox);
    std::fs::remove_file(cfg.dir.join(&art.artifact_id)).unwrap();

    let (outbox, report) = Outbox::open(&cfg, "p").unwrap();
    assert_eq!(report.rows_lost, 1);
    assert_eq!(
        outbox.artifact(&art.artifact_id).unwrap().unwrap().state,
        UploadState::Lost
    );
    outbox.ingest("sess-2", artifact(900 * 1024, 2)).unwrap();
}

#[test]
fn a_corrupted_local_file_is_detected_by_rehashing_and_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let (outbox, _) = Outbox::open(&config(tmp.path(), 64 * MIB), "p").unwrap();
    let art = outbox.ingest("sess-1", artifact(4096, 3)).unwrap();
    assert_eq!(outbox.rehash(&art.artifact_id).unwrap(), art.checksum);
    let path = outbox.file_path(&art.artifact_id);
    let mut damaged = std::fs::read(&path).unwrap();
    damaged[100] ^= 0xff;
    std::fs::write(&path, damaged).unwrap();
    assert_ne!(outbox.rehash(&art.artifact_id).unwrap(), art.checksum);
    outbox
        .mark_corrupt(&art.artifact_id, "disk corruption")
        .unwrap();
    let row = outbox.artifact(&art.artifact_id).unwrap().unwrap();
    assert_eq!(row.state, UploadState::Corrupt);
    assert!(path.exists(), "a corrupt artifact is kept for inspection");
    assert!(
        outbox.due_uploads(10).unwrap().is_empty(),
        "and not retried"
    );
}

#[test]
fn failed_uploads_back_off_per_artifact_without_blocking_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let (outbox, _) = Outbox::open(&config(tmp.path(), 64 * MIB), "p").unwrap();
    let a = outbox.ingest("sess-1", artifact(100, 1)).unwrap();
    let b = outbox.ingest("sess-1", artifact(100, 2)).unwrap();
    let due: Vec<String> = outbox
        .due_uploads(10)
        .unwrap()
        .into_iter()
        .map(|p| p.artifact_id)
        .collect();
    assert_eq!(
        due,
        vec![a.artifact_id.clone(), b.artifact_id.clone()],
        "oldest first"
    );

    outbox
        .record_upload_failure(
            &a.artifact_id,
            "413 Payload Too Large",
            Duration::from_secs(600),
        )
        .unwrap();
    let due: Vec<String> = outbox
        .due_uploads(10)
        .unwrap()
        .into_iter()
        .map(|p| p.artifact_id)
        .collect();
    assert_eq!(due, vec![b.artifact_id.clone()]);
    let row = outbox.artifact(&a.artifact_id).unwrap().unwrap();
    assert_eq!(row.attempts, 1);
    assert_eq!(row.last_error.as_deref(), Some("413 Payload Too Large"));
}

#[test]
fn queued_session_updates_survive_a_restart_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 64 * MIB);
    let (outbox, _) = Outbox::open(&cfg, "p").unwrap();
    outbox.queue_update("m-1", "sess-1", b"running").unwrap();
    outbox.queue_update("m-2", "sess-1", b"completed").unwrap();
    // The same message queued twice is kept once.
    outbox.queue_update("m-2", "sess-1", b"completed").unwrap();
    drop(outbox);

    let (outbox, _) = Outbox::open(&cfg, "p").unwrap();
    let queued = outbox.queued_updates(10).unwrap();
    let ids: Vec<&str> = queued.iter().map(|q| q.message_id.as_str()).collect();
    assert_eq!(ids, vec!["m-1", "m-2"]);
    assert_eq!(queued[1].payload, b"completed");
    outbox.remove_update(queued[0].seq).unwrap();
    assert_eq!(outbox.queued_updates(10).unwrap().len(), 1);
}

/// A session_sync after the broker acknowledged a session's updates: its
/// final one is queued again, under the same message id, and survives a
/// restart (a progress update acknowledged after it does not take its
/// place); a session still queued, or never seen, is told apart.
#[test]
fn an_acknowledged_final_update_is_queued_again_for_a_session_sync() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 64 * MIB);
    let (outbox, _) = Outbox::open(&cfg, "p").unwrap();
    outbox
        .queue_update("m-end", "sess-1", b"completed")
        .unwrap();
    // A late `running` report queued after the final one.
    outbox
        .queue_update_with_artifacts("m-run", "sess-1", b"running", &[], UpdateKind::Progress)
        .unwrap();
    outbox
        .queue_update_with_artifacts("m-other", "sess-2", b"running", &[], UpdateKind::Progress)
        .unwrap();
    let seqs: Vec<i64> = outbox
        .queued_updates(10)
        .unwrap()
        .iter()
        .filter(|q| q.session_id == "sess-1")
        .map(|q| q.seq)
        .collect();
    outbox.remove_updates(&seqs).unwrap();
    drop(outbox);

    let (outbox, _) = Outbox::open(&cfg, "p").unwrap();
    assert_eq!(
        outbox.resend_for_sync("sess-1").unwrap(),
        SyncAnswer::Requeued
    );
    let queued = outbox.queued_updates(10).unwrap();
    let again: Vec<(&str, &[u8])> = queued
        .iter()
        .filter(|q| q.session_id == "sess-1")
        .map(|q| (q.message_id.as_str(), q.payload.as_slice()))
        .collect();
    assert_eq!(again, vec![("m-end", b"completed".as_slice())]);
    // Only a progress update queued: nothing final to send again.
    assert_eq!(
        outbox.resend_for_sync("sess-2").unwrap(),
        SyncAnswer::NoRecord
    );
    assert_eq!(
        outbox.resend_for_sync("sess-9").unwrap(),
        SyncAnswer::NoRecord
    );

    // Asked again while the copy is queued (it may be on its way already):
    // once acknowledged, it is queued once more, under a message id of its
    // own, and only once.
    assert_eq!(
        outbox.resend_for_sync("sess-1").unwrap(),
        SyncAnswer::StillQueued
    );
    let seq = queued.iter().find(|q| q.message_id == "m-end").unwrap().seq;
    assert_eq!(
        outbox.remove_updates(&[seq]).unwrap(),
        1,
        "the caller is told a copy was queued again, to wake the publisher"
    );
    let after: Vec<String> = outbox
        .queued_updates(10)
        .unwrap()
        .into_iter()
        .filter(|q| q.session_id == "sess-1")
        .map(|q| {
            assert_eq!(q.payload, b"completed");
            q.message_id
        })
        .collect();
    assert_eq!(after, vec!["m-end.sync".to_string()]);
    let seq = outbox
        .queued_updates(10)
        .unwrap()
        .iter()
        .find(|q| q.session_id == "sess-1")
        .unwrap()
        .seq;
    assert_eq!(
        outbox.remove_updates(&[seq]).unwrap(),
        0,
        "asked once, sent once"
    );
    assert!(outbox
        .queued_updates(10)
        .unwrap()
        .iter()
        .all(|q| q.session_id != "sess-1"));
}

/// The publisher's memory of updates queued since it read the table to its
/// end: every one, once, in queue order; nothing before such a read; and a
/// fall-back to the table once more were queued than memory keeps.
#[test]
fn updates_queued_after_a_full_read_are_followed_in_order_until_memory_overflows() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 64 * MIB);
    let (outbox, _) = Outbox::open(&cfg, "p").unwrap();
    let ids = |v: &[edge_agent::outbox::QueuedUpdate]| -> Vec<String> {
        v.iter().map(|q| q.message_id.clone()).collect()
    };
    outbox.queue_update("m-1", "s-1", b"one").unwrap();
    // No read yet: memory cannot vouch for what is queued.
    assert_eq!(outbox.followed_updates(0, 10), None);

    // A read cut short by its limit does not follow either.
    outbox.queue_update("m-2", "s-1", b"two").unwrap();
    assert_eq!(ids(&outbox.follow_updates_after(0, 1).unwrap()), ["m-1"]);
    assert_eq!(outbox.followed_updates(1, 10), None);

    // A read to the end does; what is queued next comes from memory.
    let all = outbox.follow_updates_after(0, 10).unwrap();
    assert_eq!(ids(&all), ["m-1", "m-2"]);
    let last = all[1].seq;
    assert_eq!(outbox.followed_updates(last, 10), Some(vec![]));
    outbox.queue_update("m-3", "s-2", b"three").unwrap();
    outbox.queue_update("m-3", "s-2", b"three").unwrap(); // a repeat: kept once
    outbox.queue_update("m-4", "s-2", b"four").unwrap();
    let got = outbox.followed_updates(last, 1).unwrap();
    assert_eq!(ids(&got), ["m-3"]);
    assert_eq!(got[0].payload, b"three");
    let rest = outbox.followed_updates(got[0].seq, 10).unwrap();
    assert_eq!(ids(&rest), ["m-4"]);
    // The same rows as the table holds.
    assert_eq!(
        outbox.queued_updates_after(last, 10).unwrap(),
        [got, rest].concat()
    );

    // More than memory keeps: back to the table, which has them all.
    for i in 0..300 {
        outbox
            .queue_update(&format!("bulk-{i}"), "s-3", b"x")
            .unwrap();
    }
    assert_eq!(outbox.followed_updates(0, 10), None);
    assert_eq!(outbox.queued_updates(1_000).unwrap().len(), 304);
}

// ---------------------------------------------------------------------------
// SIGKILL in the middle of ingesting.

const CHILD_DIR_ENV: &str = "EDGE_OUTBOX_KILL_TEST_DIR";

/// Runs only as the child of `every_ingest_that_returned_survives_sigkill`:
/// ingests artifacts forever, printing each id once `ingest` returned.
#[test]
#[ignore = "child process of every_ingest_that_returned_survives_sigkill"]
fn child_ingests_until_killed() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let (outbox, _) = Outbox::open(&config(Path::new(&dir), 1024 * MIB), "p").unwrap();
    for i in 0.. {
        let art = outbox
            .ingest("sess-kill", artifact(256 * 1024 + i, i as u64))
            .unwrap();
        println!("INGESTED {} {}", art.artifact_id, art.checksum);
    }
}

#[test]
fn every_ingest_that_returned_survives_sigkill() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_ingests_until_killed",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_ENV, tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut acknowledged: Vec<(String, String)> = Vec::new();
    let until = Instant::now() + Duration::from_secs(30);
    while acknowledged.len() < 25 && Instant::now() < until {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            if let Some(rest) = line.strip_prefix("INGESTED ") {
                let (id, sum) = rest.split_once(' ').unwrap();
                acknowledged.push((id.to_string(), sum.to_string()));
            }
        }
    }
    assert!(acknowledged.len() >= 25, "the child ingested too little");
    // SAFETY: plain syscall on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    // Lines printed just before the kill.
    while let Ok(line) = rx.try_recv() {
        if let Some(rest) = line.strip_prefix("INGESTED ") {
            let (id, sum) = rest.split_once(' ').unwrap();
            acknowledged.push((id.to_string(), sum.to_string()));
        }
    }

    let cfg = config(tmp.path(), 1024 * MIB);
    let (outbox, report) = Outbox::open(&cfg, "p").unwrap();
    assert!(report.temp_files_removed <= 1, "{report:?}");
    assert!(
        files_in(&cfg.dir).iter().all(|n| !n.ends_with(".part")),
        "no temp file survives start-up"
    );
    for (id, sum) in &acknowledged {
        let row = outbox
            .artifact(id)
            .unwrap()
            .unwrap_or_else(|| panic!("acknowledged artifact {id} has no row"));
        assert_eq!(row.state, UploadState::Pending);
        assert_eq!(&row.artifact.checksum, sum);
    }
    // Every row (including one committed right before the kill) has its file
    // with the recorded sha256 and size.
    let due = outbox.due_uploads(10_000).unwrap();
    assert!(due.len() >= acknowledged.len());
    let paths: Vec<PathBuf> = due.iter().map(|p| p.path.clone()).collect();
    let sums = sha256sum(&paths);
    for p in &due {
        assert_eq!(
            sums[&p.path], p.sha256,
            "file of {} matches its row",
            p.artifact_id
        );
        assert_eq!(std::fs::metadata(&p.path).unwrap().len(), p.size_bytes);
    }
}

/// The registry may drop bytes it cannot bind to metadata: a file stays
/// after its bytes were confirmed until the session update carrying its
/// metadata was acknowledged, in either order, and across a restart.
#[test]
fn a_file_is_kept_until_both_its_bytes_and_its_metadata_are_acknowledged() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 64 * MIB);
    let (outbox, _) = Outbox::open(&cfg, "p").unwrap();

    // Bytes first, metadata later.
    let a = outbox.ingest("sess-1", artifact(1000, 1)).unwrap();
    let seq_a = queue_final(&outbox, "m-a", "sess-1", &[&a.artifact_id]);
    outbox.mark_uploaded(&a.artifact_id).unwrap();
    assert!(
        outbox.file_path(&a.artifact_id).exists(),
        "metadata not acknowledged yet"
    );
    let rec = outbox.artifact(&a.artifact_id).unwrap().unwrap();
    assert_eq!(rec.state, UploadState::Uploaded);
    assert!(!rec.metadata_acked);
    let stats = outbox.stats().unwrap();
    assert_eq!(stats.pending_bytes, 0, "nothing awaits upload");
    assert_eq!(
        stats.budget_used_bytes, rec.artifact.size_bytes,
        "the kept file still fills the budget"
    );

    // A restart in this state keeps the file.
    drop(outbox);
    let (outbox, report) = Outbox::open(&cfg, "p").unwrap();
    assert_eq!(report, RecoveryReport::default());
    assert!(
        outbox.file_path(&a.artifact_id).exists(),
        "kept across a restart"
    );
    assert_eq!(outbox.queued_updates(10).unwrap().len(), 1);

    outbox.remove_updates(&[seq_a]).unwrap();
    assert!(
        !outbox.file_path(&a.artifact_id).exists(),
        "both acknowledged"
    );
    assert_eq!(outbox.stats().unwrap().budget_used_bytes, 0);
    assert!(
        outbox
            .artifact(&a.artifact_id)
            .unwrap()
            .unwrap()
            .metadata_acked
    );

    // Metadata first, bytes later.
    let b = outbox.ingest("sess-2", artifact(1000, 2)).unwrap();
    let seq_b = queue_final(&outbox, "m-b", "sess-2", &[&b.artifact_id]);
    outbox.remove_updates(&[seq_b]).unwrap();
    assert!(
        outbox.file_path(&b.artifact_id).exists(),
        "bytes not uploaded yet"
    );
    outbox.mark_uploaded(&b.artifact_id).unwrap();
    assert!(!outbox.file_path(&b.artifact_id).exists());

    // An update dropped without acknowledgment does not free the file.
    let c = outbox.ingest("sess-3", artifact(1000, 3)).unwrap();
    let seq_c = queue_final(&outbox, "m-c", "sess-3", &[&c.artifact_id]);
    outbox.drop_update(seq_c).unwrap();
    outbox.mark_uploaded(&c.artifact_id).unwrap();
    assert!(outbox.file_path(&c.artifact_id).exists());

    // A crash between acknowledgment and delete: the next start removes
    // the file of an artifact whose bytes and metadata were acknowledged.
    let kept = std::fs::read(outbox.file_path(&c.artifact_id)).unwrap();
    std::fs::write(outbox.file_path(&a.artifact_id), &kept).unwrap();
    drop(outbox);
    let (outbox, _) = Outbox::open(&cfg, "p").unwrap();
    assert!(
        !outbox.file_path(&a.artifact_id).exists(),
        "cleaned at start"
    );
    assert!(
        outbox.file_path(&c.artifact_id).exists(),
        "still unacknowledged"
    );
    assert_eq!(outbox.stats().unwrap().queued_updates, 0);
}

/// A database from before artifacts were tied to their session update
/// opens; its artifacts keep the former rule (the file goes once the
/// registry confirmed the bytes), since which queued update carries their
/// metadata was never recorded.
#[test]
fn a_database_without_metadata_columns_is_migrated_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 64 * MIB);
    let (outbox, _) = Outbox::open(&cfg, "p").unwrap();
    let a = outbox.ingest("sess-1", artifact(1000, 1)).unwrap();
    drop(outbox);
    let db = rusqlite::Connection::open(&cfg.db).unwrap();
    db.execute_batch(
        "DROP INDEX artifacts_by_metadata_seq;
         ALTER TABLE artifacts DROP COLUMN metadata_seq;
         ALTER TABLE artifacts DROP COLUMN metadata_acked;",
    )
    .unwrap();
    drop(db);

    let (outbox, report) = Outbox::open(&cfg, "p").unwrap();
    assert_eq!(report, RecoveryReport::default());
    let rec = outbox.artifact(&a.artifact_id).unwrap().unwrap();
    assert_eq!(rec.state, UploadState::Pending);
    assert!(rec.metadata_acked);
    outbox.mark_uploaded(&a.artifact_id).unwrap();
    assert!(!outbox.file_path(&a.artifact_id).exists());
    // New artifacts follow the new rule.
    let b = outbox.ingest("sess-2", artifact(1000, 2)).unwrap();
    outbox.mark_uploaded(&b.artifact_id).unwrap();
    assert!(outbox.file_path(&b.artifact_id).exists());
}

/// Bytes the registry held without their metadata (it may sweep them) are
/// sent once more after the metadata was acknowledged; only a confirmation
/// of bound bytes lets the file go.
#[test]
fn bytes_held_unbound_are_confirmed_by_another_upload_after_the_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), 64 * MIB);
    let (outbox, _) = Outbox::open(&cfg, "p").unwrap();
    let a = outbox.ingest("sess-1", artifact(1000, 1)).unwrap();
    let seq = queue_final(&outbox, "m-a", "sess-1", &[&a.artifact_id]);
    outbox
        .mark_uploaded_unbound(&a.artifact_id, Duration::ZERO)
        .unwrap();
    assert!(outbox.due_uploads(10).unwrap().is_empty());
    assert_eq!(
        outbox.artifact(&a.artifact_id).unwrap().unwrap().state,
        UploadState::Uploaded
    );

    // The metadata is acknowledged: the artifact is due again, file kept.
    outbox.remove_updates(&[seq]).unwrap();
    assert!(outbox.file_path(&a.artifact_id).exists());
    let due = outbox.due_uploads(10).unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].artifact_id, a.artifact_id);

    // A restart keeps it too.
    drop(outbox);
    let (outbox, _) = Outbox::open(&cfg, "p").unwrap();
    assert!(outbox.file_path(&a.artifact_id).exists());

    // The registry has not bound it yet: still kept, retried later.
    outbox
        .mark_uploaded_unbound(&a.artifact_id, Duration::from_secs(3600))
        .unwrap();
    assert!(outbox.file_path(&a.artifact_id).exists());
    assert!(outbox.due_uploads(10).unwrap().is_empty());
    assert_eq!(
        outbox.artifact(&a.artifact_id).unwrap().unwrap().state,
        UploadState::Pending
    );

    // Bound bytes confirmed: now it goes, and the budget is free again.
    outbox.mark_uploaded(&a.artifact_id).unwrap();
    assert!(!outbox.file_path(&a.artifact_id).exists());
    assert_eq!(outbox.stats().unwrap().pending_artifacts, 0);
}

#[test]
fn on_a_full_disk_bookkeeping_still_fits_new_evidence_is_refused_and_room_brings_it_back() {
    let Some(fs) = Tmpfs::mount_temp("benchlink-outbox-", "3m") else {
        return;
    };
    let root = fs.path();
    let (outbox, _) = Outbox::open(&config(root, 64 * MIB), "bench-1").unwrap();
    assert!(outbox.disk_problem().is_none());
    let kept = outbox.ingest("sess-1", artifact(100_000, 1)).unwrap();

    // Fill the file system to the last byte.
    let filler = root.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 16 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let small = [0u8; 512];
        while f.write_all(&small).is_ok() {}
    }

    // Session updates (the failure reports among them) are still queued:
    // the reserve makes room for them.
    let payload = vec![b'x'; 4096];
    for i in 0..100 {
        outbox
            .queue_update(&format!("m-{i}"), "sess-2", &payload)
            .unwrap_or_else(|e| panic!("update {i} not queued on a full disk: {e}"));
    }
    let problem = outbox.disk_problem().expect("the full disk is noticed");
    assert!(problem.contains("disk is full"), "{problem}");
    assert_eq!(outbox.queued_updates(1000).unwrap().len(), 100);

    // New evidence is refused with a clear error, nothing left behind.
    let before = files_in(&root.join("outbox"));
    match outbox.ingest("sess-2", artifact(50_000, 2)) {
        Err(e @ OutboxError::DiskFull { .. }) => {
            assert!(e.to_string().contains("cannot be kept"), "{e}")
        }
        other => panic!("expected DiskFull, got {other:?}"),
    }
    assert_eq!(files_in(&root.join("outbox")), before);
    assert!(!outbox.restore_reserve(), "still no room");

    // Evidence taken before is intact.
    let rec = outbox.artifact(&kept.artifact_id).unwrap().expect("kept");
    assert_eq!(rec.artifact.checksum, kept.checksum);
    assert_eq!(outbox.rehash(&kept.artifact_id).unwrap(), kept.checksum);

    // Room again: the reserve comes back and evidence is taken in.
    std::fs::remove_file(&filler).unwrap();
    assert!(outbox.restore_reserve());
    assert!(outbox.disk_problem().is_none());
    outbox.ingest("sess-3", artifact(50_000, 3)).unwrap();
    drop(outbox);
}
