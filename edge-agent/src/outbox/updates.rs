//! The session-update queue: updates that still have to reach the registry
//! ([`Outbox::queue_update`]), so a restart loses none, read by the one
//! publisher in queue order, from memory when it can
//! ([`Outbox::followed_updates`]). What an acknowledgement does is in
//! `acks.rs` (docs/architecture.md, "Control plane (MQTT)").

use rusqlite::{params, Connection};

use super::db::now_text;
use super::handle::{lock, Follow, Outbox, OutboxError, QueuedUpdate, FOLLOW_MAX};

/// Whether a queued session update ends its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateKind {
    /// `running`, or progress: the session goes on.
    Progress,
    /// `completed`, `failed`, `cancelled`: the session's last word, kept
    /// after its acknowledgement for a `session_sync`.
    Final,
}

/// Up to `limit` rows of `pending_updates` with `seq > after`, by `seq`.
fn select_updates_after(
    c: &Connection,
    after: i64,
    limit: usize,
) -> rusqlite::Result<Vec<QueuedUpdate>> {
    let mut stmt = c.prepare_cached(
        "SELECT seq, message_id, session_id, payload FROM pending_updates
         WHERE seq > ?1 ORDER BY seq LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![after, limit as i64], |r| {
        Ok(QueuedUpdate {
            seq: r.get(0)?,
            message_id: r.get(1)?,
            session_id: r.get(2)?,
            payload: r.get(3)?,
        })
    })?;
    rows.collect()
}

impl Outbox {
    /// Keep a final session update (an MQTT envelope's bytes) until it has
    /// been published; returns its queue position. For a progress update,
    /// or one that carries artifact metadata, use
    /// [`Self::queue_update_with_artifacts`].
    pub fn queue_update(
        &self,
        message_id: &str,
        session_id: &str,
        payload: &[u8],
    ) -> Result<i64, OutboxError> {
        self.queue_update_with_artifacts(message_id, session_id, payload, &[], UpdateKind::Final)
    }

    /// [`Self::queue_update`] for an update that carries the metadata of
    /// `artifact_ids` (rows of this outbox): their files are kept until the
    /// broker acknowledged this update ([`Self::remove_updates`]) and the
    /// registry confirmed their bytes ([`Self::mark_uploaded`]). Ids without
    /// a row are ignored. Returns the update's queue position.
    pub fn queue_update_with_artifacts(
        &self,
        message_id: &str,
        session_id: &str,
        payload: &[u8],
        artifact_ids: &[&str],
        kind: UpdateKind,
    ) -> Result<i64, OutboxError> {
        self.with_conn_unsynced(|c| {
            self.queue_in(c, message_id, session_id, payload, artifact_ids, kind)
        })
    }

    /// [`Self::queue_update_with_artifacts`] on the locked connection.
    pub(super) fn queue_in(
        &self,
        c: &Connection,
        message_id: &str,
        session_id: &str,
        payload: &[u8],
        artifact_ids: &[&str],
        kind: UpdateKind,
    ) -> rusqlite::Result<i64> {
        let tx = c.unchecked_transaction()?;
        let inserted = c
            .prepare_cached(
                "INSERT OR IGNORE INTO pending_updates
                    (message_id, session_id, payload, queued_at, final)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                message_id,
                session_id,
                payload,
                now_text(),
                kind == UpdateKind::Final
            ])?;
        let seq = if inserted == 0 {
            // Queued before (same message id): its position.
            c.prepare_cached("SELECT seq FROM pending_updates WHERE message_id = ?1")?
                .query_row([message_id], |r| r.get(0))?
        } else {
            c.last_insert_rowid()
        };
        if !artifact_ids.is_empty() {
            let mut stmt = c.prepare_cached(
                "UPDATE artifacts SET metadata_seq = ?2
                 WHERE artifact_id = ?1 AND metadata_acked = 0",
            )?;
            for id in artifact_ids {
                stmt.execute(params![id, seq])?;
            }
        }
        tx.commit()?;
        if inserted > 0 {
            // Still under the connection lock: rows reach `follow` in
            // the order of their `seq`.
            let mut follow = lock(&self.inner.follow);
            if follow.on && follow.rows.len() < FOLLOW_MAX {
                follow.rows.push_back(QueuedUpdate {
                    seq,
                    message_id: message_id.to_string(),
                    session_id: session_id.to_string(),
                    payload: payload.to_vec(),
                });
            } else {
                *follow = Follow::default();
            }
        }
        Ok(seq)
    }

    /// [`Self::queued_updates_after`] for the one publisher: when it read
    /// the table to its end (fewer than `limit` rows), updates queued from
    /// now on are also kept in memory for [`Self::followed_updates`].
    pub fn follow_updates_after(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<QueuedUpdate>, OutboxError> {
        self.with_conn(|c| {
            let rows = select_updates_after(c, after, limit)?;
            // Under the connection lock: no update can be queued between
            // the read and this.
            let mut follow = lock(&self.inner.follow);
            *follow = Follow {
                on: rows.len() < limit,
                rows: Default::default(),
            };
            Ok(rows)
        })
    }

    /// Up to `limit` updates with `seq > after` queued since the last
    /// [`Self::follow_updates_after`] that read the table to its end, taken
    /// from memory (never waits for SQLite). `None` when that is not known
    /// (no such read yet, or more were queued than memory keeps): read the
    /// table instead.
    pub fn followed_updates(&self, after: i64, limit: usize) -> Option<Vec<QueuedUpdate>> {
        let mut follow = lock(&self.inner.follow);
        if !follow.on {
            return None;
        }
        while follow.rows.front().is_some_and(|u| u.seq <= after) {
            follow.rows.pop_front();
        }
        let n = limit.min(follow.rows.len());
        Some(follow.rows.drain(..n).collect())
    }

    /// Up to `limit` queued session updates, oldest first.
    pub fn queued_updates(&self, limit: usize) -> Result<Vec<QueuedUpdate>, OutboxError> {
        self.queued_updates_after(0, limit)
    }

    /// Up to `limit` queued session updates with `seq > after`, oldest first.
    pub fn queued_updates_after(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<QueuedUpdate>, OutboxError> {
        self.with_conn(|c| select_updates_after(c, after, limit))
    }

    /// Replace the payload of queued update `seq` (kept at its place in the
    /// queue), e.g. with a shortened envelope of the same message id. A row
    /// no longer queued is left alone.
    pub fn replace_update_payload(&self, seq: i64, payload: &[u8]) -> Result<(), OutboxError> {
        self.with_conn_unsynced(|c| {
            c.prepare_cached("UPDATE pending_updates SET payload = ?2 WHERE seq = ?1")?
                .execute(params![seq, payload])
                .map(|_| ())
        })?;
        let mut follow = lock(&self.inner.follow);
        for row in follow.rows.iter_mut().filter(|r| r.seq == seq) {
            row.payload = payload.to_vec();
        }
        Ok(())
    }

    /// Delete queued update `seq` although the broker never acknowledged it
    /// (it can never be sent). The artifacts it carries keep their files:
    /// their metadata did not reach the registry.
    pub fn drop_update(&self, seq: i64) -> Result<(), OutboxError> {
        self.with_conn_unsynced(|c| {
            c.prepare_cached("DELETE FROM pending_updates WHERE seq = ?1")?
                .execute([seq])
                .map(|_| ())
        })
    }
}
