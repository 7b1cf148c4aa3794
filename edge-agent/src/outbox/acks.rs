//! The broker acknowledged session updates: they leave the queue, final
//! ones are kept for a `session_sync` (`sync.rs`), the metadata of the
//! artifacts they carry counts as acknowledged, and the files whose bytes
//! the registry already confirmed are deleted (docs/architecture.md,
//! "Artifact bytes (HTTP)").

use chrono::Utc;
use rusqlite::params;

use super::handle::{lock, Outbox, OutboxError};
use super::sync::prune_sent;

impl Outbox {
    /// The broker acknowledged queued update `seq`.
    pub fn remove_update(&self, seq: i64) -> Result<(), OutboxError> {
        self.remove_updates(&[seq]).map(|_| ())
    }

    /// The broker acknowledged the queued updates `seqs`: delete them in
    /// one transaction (no fsync: a delete lost to a power cut only means
    /// the update is sent again, and receivers de-duplicate by message id),
    /// record that the metadata of the artifacts they carry was
    /// acknowledged, and delete the files of those whose bytes the registry
    /// already confirmed (the others go at [`Self::mark_uploaded`]).
    ///
    /// Returns how many final updates were queued again because the
    /// registry asked for them (`session_sync`) while they were in flight:
    /// the caller wakes the publisher for those.
    pub fn remove_updates(&self, seqs: &[i64]) -> Result<usize, OutboxError> {
        if seqs.is_empty() {
            return Ok(0);
        }
        let resync_waiting = !lock(&self.inner.resend_after_ack).is_empty();
        let (done, confirming, requeued): (Vec<(String, i64)>, usize, usize) = self
            .with_conn_unsynced(|c| {
                let requeued = if resync_waiting {
                    self.queue_again_after_ack(c, seqs)?
                } else {
                    0
                };
                let tx = c.unchecked_transaction()?;
                let mut done = Vec::new();
                let mut confirming = 0;
                {
                    let mut select = tx.prepare_cached(
                        "SELECT artifact_id, size_bytes FROM artifacts
                     WHERE metadata_seq = ?1 AND metadata_acked = 0 AND upload_state = 'uploaded'
                       AND bytes_bound = 1",
                    )?;
                    // Bytes the registry held unbound: upload again to confirm
                    // they are bound (or to replace them if swept).
                    let mut confirm = tx.prepare_cached(
                        "UPDATE artifacts SET upload_state = 'pending', next_attempt_at_ms = 0
                     WHERE metadata_seq = ?1 AND metadata_acked = 0 AND upload_state = 'uploaded'
                       AND bytes_bound = 0",
                    )?;
                    let mut ack = tx.prepare_cached(
                        "UPDATE artifacts SET metadata_acked = 1
                     WHERE metadata_seq = ?1 AND metadata_acked = 0",
                    )?;
                    // The newest acknowledged update of each session is kept
                    // for a `session_sync` (the broker's PUBACK does not prove
                    // the registry was subscribed).
                    let mut keep = tx.prepare_cached(
                    "INSERT INTO sent_updates (session_id, seq, message_id, payload, acked_at_ms)
                     SELECT session_id, seq, message_id, payload, ?2 FROM pending_updates
                     WHERE seq = ?1 AND final = 1
                     ON CONFLICT (session_id) DO UPDATE SET
                        seq = excluded.seq, message_id = excluded.message_id,
                        payload = excluded.payload, acked_at_ms = excluded.acked_at_ms
                     WHERE excluded.seq > sent_updates.seq",
                )?;
                    let now_ms = Utc::now().timestamp_millis();
                    let mut delete =
                        tx.prepare_cached("DELETE FROM pending_updates WHERE seq = ?1")?;
                    for seq in seqs {
                        keep.execute(params![seq, now_ms])?;
                        let rows = select
                            .query_map([seq], |r| Ok((r.get(0)?, r.get(1)?)))?
                            .collect::<Result<Vec<(String, i64)>, _>>()?;
                        done.extend(rows);
                        confirming += confirm.execute([seq])?;
                        ack.execute([seq])?;
                        delete.execute([seq])?;
                    }
                }
                if self.sent_prune_due() {
                    prune_sent(&tx, Utc::now().timestamp_millis())?;
                }
                tx.commit()?;
                Ok((done, confirming, requeued))
            })?;
        if confirming > 0 {
            self.inner.due_again.notify_one();
        }
        let mut first_error = None;
        for (artifact_id, size) in done {
            match self.remove_file(&artifact_id) {
                Ok(()) => {
                    tracing::info!(
                        %artifact_id,
                        "outbox: artifact metadata acknowledged, local copy removed"
                    );
                }
                // The next start removes it.
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
            self.release(size.max(0) as u64, 1);
        }
        first_error.map_or(Ok(requeued), Err)
    }
}
