//! Sync retention: the last final update of each session the broker
//! acknowledged is kept (for [`SENT_UPDATE_RETENTION`], at most
//! [`SENT_UPDATE_MAX_ROWS`]), since the broker's acknowledgement does not
//! prove the registry received it; a `session_sync` from the registry can
//! have it sent again ([`Outbox::resend_for_sync`]; docs/architecture.md,
//! "Control plane (MQTT)").

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension};

use super::handle::{lock, Outbox, OutboxError};
use super::updates::UpdateKind;

/// How long the last acknowledged update of each session is kept, so a
/// `session_sync` can have it sent again ([`Outbox::resend_for_sync`]).
/// A sync follows a reconnection within seconds; this leaves ample room.
pub const SENT_UPDATE_RETENTION: Duration = Duration::from_secs(3600);

/// At most this many acknowledged updates are kept (the newest).
pub const SENT_UPDATE_MAX_ROWS: i64 = 10_000;

/// How often acknowledging updates also prunes the kept ones.
const SENT_PRUNE_EVERY: Duration = Duration::from_secs(60);

/// What [`Outbox::resend_for_sync`] found for a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncAnswer {
    /// An update of the session is still queued: it will be sent anyway.
    StillQueued,
    /// Its last acknowledged update was queued again.
    Requeued,
    /// The outbox has no update of this session (none was ever queued, or
    /// it was pruned).
    NoRecord,
}

/// Delete the acknowledged updates older than [`SENT_UPDATE_RETENTION`]
/// at `now_ms`, and all but the newest [`SENT_UPDATE_MAX_ROWS`].
pub(super) fn prune_sent(c: &Connection, now_ms: i64) -> rusqlite::Result<usize> {
    let cutoff = now_ms - SENT_UPDATE_RETENTION.as_millis() as i64;
    let old = c
        .prepare_cached("DELETE FROM sent_updates WHERE acked_at_ms < ?1")?
        .execute([cutoff])?;
    let surplus = c
        .prepare_cached(
            "DELETE FROM sent_updates WHERE seq <
                (SELECT seq FROM sent_updates ORDER BY seq DESC LIMIT 1 OFFSET ?1 - 1)",
        )?
        .execute([SENT_UPDATE_MAX_ROWS])?;
    Ok(old + surplus)
}

impl Outbox {
    /// Answer a `session_sync` entry for `session_id`. When its final
    /// update is still queued, it goes out anyway; if it is already on its
    /// way to the broker (published, not yet acknowledged), it is queued
    /// once more after its acknowledgement, since it may have gone out
    /// before the registry subscribed. When the final update was
    /// acknowledged (and kept, see [`SENT_UPDATE_RETENTION`]), it is queued
    /// again now, with its own message id. The broker's acknowledgement
    /// does not prove the registry received it.
    pub fn resend_for_sync(&self, session_id: &str) -> Result<SyncAnswer, OutboxError> {
        self.with_conn_unsynced(|c| {
            let queued: bool = c
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM pending_updates
                                    WHERE session_id = ?1 AND final = 1)",
                )?
                .query_row([session_id], |r| r.get(0))?;
            if queued {
                lock(&self.inner.resend_after_ack).insert(session_id.to_string());
                return Ok(SyncAnswer::StillQueued);
            }
            let sent: Option<(String, Vec<u8>)> = c
                .prepare_cached(
                    "SELECT message_id, payload FROM sent_updates WHERE session_id = ?1",
                )?
                .query_row([session_id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            match sent {
                Some((message_id, payload)) => {
                    self.queue_in(c, &message_id, session_id, &payload, &[], UpdateKind::Final)?;
                    Ok(SyncAnswer::Requeued)
                }
                None => Ok(SyncAnswer::NoRecord),
            }
        })
    }

    /// Of the final updates being acknowledged (`seqs`), queue again
    /// those a `session_sync` asked for while they were on their way (see
    /// [`Self::resend_for_sync`]), each once.
    pub(super) fn queue_again_after_ack(
        &self,
        c: &Connection,
        seqs: &[i64],
    ) -> rusqlite::Result<usize> {
        let mut again = Vec::new();
        {
            let mut waiting = lock(&self.inner.resend_after_ack);
            let mut stmt = c.prepare_cached(
                "SELECT session_id, message_id, payload FROM pending_updates
                 WHERE seq = ?1 AND final = 1",
            )?;
            for seq in seqs {
                let row: Option<(String, String, Vec<u8>)> = stmt
                    .query_row([seq], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()?;
                if let Some((session_id, message_id, payload)) = row {
                    if waiting.remove(&session_id) {
                        again.push((session_id, message_id, payload));
                    }
                }
            }
        }
        let queued = again.len();
        for (session_id, message_id, payload) in again {
            // The acknowledged row goes below, in the same lock: a fresh
            // message id keeps the copy from being taken for it.
            let copy = format!("{message_id}.sync");
            self.queue_in(c, &copy, &session_id, &payload, &[], UpdateKind::Final)?;
        }
        Ok(queued)
    }

    /// True (and the clock restarted) when acknowledged updates were last
    /// pruned [`SENT_PRUNE_EVERY`] ago or never.
    pub(super) fn sent_prune_due(&self) -> bool {
        let mut at = lock(&self.inner.sent_pruned_at);
        let due = at.is_none_or(|t| t.elapsed() >= SENT_PRUNE_EVERY);
        if due {
            *at = Some(std::time::Instant::now());
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::params;

    use super::super::db::SCHEMA;
    use super::*;

    fn kept(c: &Connection) -> Vec<String> {
        let mut stmt = c
            .prepare("SELECT session_id FROM sent_updates ORDER BY seq")
            .unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.collect::<rusqlite::Result<_>>().unwrap()
    }

    #[test]
    fn acknowledged_updates_are_pruned_by_age_and_by_count() {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(SCHEMA).unwrap();
        let now = 10_000_000_000_i64;
        let hour = SENT_UPDATE_RETENTION.as_millis() as i64;
        let mut insert = c
            .prepare(
                "INSERT INTO sent_updates (session_id, seq, message_id, payload, acked_at_ms)
                 VALUES (?1, ?2, ?1, x'00', ?3)",
            )
            .unwrap();
        insert.execute(params!["old", 1, now - hour - 1]).unwrap();
        insert.execute(params!["edge", 2, now - hour]).unwrap();
        insert.execute(params!["new", 3, now]).unwrap();
        assert_eq!(prune_sent(&c, now).unwrap(), 1);
        assert_eq!(kept(&c), vec!["edge", "new"]);

        // Past the row cap, the oldest go ("edge" and "new").
        for seq in 4..(SENT_UPDATE_MAX_ROWS + 4) {
            insert
                .execute(params![format!("s-{seq}"), seq, now])
                .unwrap();
        }
        assert_eq!(prune_sent(&c, now).unwrap(), 2);
        let left = kept(&c);
        assert_eq!(left.len() as i64, SENT_UPDATE_MAX_ROWS);
        assert_eq!(left.first().unwrap(), "s-4");
        assert_eq!(
            left.last().unwrap(),
            &format!("s-{}", SENT_UPDATE_MAX_ROWS + 3)
        );
        // Nothing more to prune.
        assert_eq!(prune_sent(&c, now).unwrap(), 0);
    }
}
