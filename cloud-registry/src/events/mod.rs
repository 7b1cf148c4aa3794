//! The event log: every state change is one row of the append-only `events`
//! table (the audit log) and one message on the live stream (seed 001 §7).
//!
//! Writers append inside the same SQLite transaction as the change they
//! record ([`append`]), so a change and its event commit or roll back
//! together; after the commit they hand the events to [`EventBus::publish`].
//! `event_id` is SQLite's rowid: it only grows, which is what
//! `Last-Event-ID` resumption needs.
//!
//! - [`follow`]: lossless, ordered reading of the log (SSE, the MQTT
//!   command forwarder, the sessions' lease follower);
//! - [`api`]: `GET /api/v1/capability-events/stream` (SSE);
//! - [`agent_sink`]: the agent runtime's run and proposal events;
//! - [`chain`]: the rows' hash chain and its signed checkpoints
//!   (docs/audit-trail.md).

pub mod agent_sink;
pub mod api;
pub mod chain;
pub mod follow;

use std::sync::Arc;

use crate::sql::{params, Connection, OptionalExtension};
use chrono::Utc;
use serde_json::Value;
use shared_protocol::event::{CapabilityEvent, EventType};
use tokio::sync::broadcast;

use crate::db::{Db, DbError};

/// How many events the live channel buffers per subscriber before a slow
/// subscriber is told it missed some (it then replays from the table).
pub const LIVE_BUFFER: usize = 4096;

/// An event about to be appended.
#[derive(Debug, Clone, Default)]
pub struct NewEvent {
    pub event_type: Option<EventType>,
    pub provider_id: Option<String>,
    pub capability_id: Option<String>,
    pub lease_id: Option<String>,
    pub session_id: Option<String>,
    pub artifact_id: Option<String>,
    pub audit_request_id: Option<String>,
    /// The principal whose request caused it (`system` for the sweeper).
    pub actor: String,
    pub data: Value,
    /// `data` already rendered as JSON text, when the caller has it (the
    /// lease engine renders each lease once, off the writer thread);
    /// [`append`] then stores this text instead of rendering `data` again.
    /// It must be the JSON of the same value as `data`.
    pub data_json: Option<String>,
}

impl NewEvent {
    /// An event of `event_type` caused by `actor`, with `data`.
    pub fn new(event_type: EventType, actor: impl Into<String>, data: Value) -> Self {
        Self {
            event_type: Some(event_type),
            actor: actor.into(),
            data,
            ..Default::default()
        }
    }
    pub fn provider(mut self, id: impl Into<String>) -> Self {
        self.provider_id = Some(id.into());
        self
    }
    pub fn capability(mut self, id: impl Into<String>) -> Self {
        self.capability_id = Some(id.into());
        self
    }
    pub fn lease(mut self, id: impl Into<String>) -> Self {
        self.lease_id = Some(id.into());
        self
    }
    pub fn session(mut self, id: impl Into<String>) -> Self {
        self.session_id = Some(id.into());
        self
    }
    pub fn artifact(mut self, id: impl Into<String>) -> Self {
        self.artifact_id = Some(id.into());
        self
    }
    pub fn audit_request(mut self, id: impl Into<String>) -> Self {
        self.audit_request_id = Some(id.into());
        self
    }
    /// Store `json` (the JSON text of `data`) instead of rendering `data`.
    pub fn data_json(mut self, json: String) -> Self {
        self.data_json = Some(json);
        self
    }
}

/// Create the `events` table; UPDATE and DELETE on it are refused by
/// triggers, which makes it the append-only audit log, and each row is
/// chained to the one before ([`chain`]), which makes a change made
/// around the triggers detectable.
///
/// Only the primary key is indexed: every read goes by `event_id` (replay
/// after an id, the last id). The former indexes on `lease_id` and
/// `capability_id` served no query and put each appended event on two
/// more scattered pages; this migration drops them.
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS events (
            event_id         INTEGER PRIMARY KEY AUTOINCREMENT,
            event_type       TEXT NOT NULL,
            occurred_at      TEXT NOT NULL,
            actor            TEXT NOT NULL,
            provider_id      TEXT,
            capability_id    TEXT,
            lease_id         TEXT,
            session_id       TEXT,
            artifact_id      TEXT,
            audit_request_id TEXT,
            data             TEXT NOT NULL,
            prev_hash        TEXT,
            hash             TEXT
        );
        DROP INDEX IF EXISTS events_lease;
        DROP INDEX IF EXISTS events_capability;",
    )?;
    chain::migrate(conn)?;
    conn.append_only("events", "events is append-only")
}

/// Append `ev` using `conn` (normally inside the caller's transaction) and
/// return the stored event with its id: the next after the log's head,
/// chained to it ([`chain::row_hash`]).
pub fn append(conn: &Connection, mut ev: NewEvent) -> rusqlite::Result<CapabilityEvent> {
    let event_type = ev
        .event_type
        .ok_or_else(|| rusqlite::Error::InvalidParameterName("event_type".into()))?;
    let now = Utc::now();
    let data = ev.data_json.take().unwrap_or_else(|| ev.data.to_string());
    let (head_id, prev_hash) = chain::head(conn)?;
    let row = chain::ChainRow {
        event_id: head_id + 1,
        event_type: event_type.as_str().to_string(),
        occurred_at: now.to_rfc3339(),
        actor: std::mem::take(&mut ev.actor),
        provider_id: ev.provider_id,
        capability_id: ev.capability_id,
        lease_id: ev.lease_id,
        session_id: ev.session_id,
        artifact_id: ev.artifact_id,
        audit_request_id: ev.audit_request_id,
        data,
    };
    let hash = chain::row_hash(&prev_hash, &row);
    // Cached: this runs for every state change, on the writer thread.
    let mut stmt = conn.prepare_cached(
        "INSERT INTO events (event_id, event_type, occurred_at, actor, provider_id,
             capability_id, lease_id, session_id, artifact_id, audit_request_id, data,
             prev_hash, hash)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?;
    stmt.execute(params![
        row.event_id as i64,
        row.event_type,
        row.occurred_at,
        row.actor,
        row.provider_id,
        row.capability_id,
        row.lease_id,
        row.session_id,
        row.artifact_id,
        row.audit_request_id,
        row.data,
        prev_hash,
        hash,
    ])?;
    drop(stmt);
    Ok(CapabilityEvent {
        event_id: row.event_id,
        event_type,
        occurred_at: now,
        provider_id: row.provider_id,
        capability_id: row.capability_id,
        lease_id: row.lease_id,
        session_id: row.session_id,
        artifact_id: row.artifact_id,
        audit_request_id: row.audit_request_id,
        data: ev.data,
    })
}

fn row_to_event(r: &crate::sql::Row<'_>) -> rusqlite::Result<CapabilityEvent> {
    let event_type: String = r.get(1)?;
    let occurred_at: String = r.get(2)?;
    let data: String = r.get(9)?;
    Ok(CapabilityEvent {
        event_id: r.get::<_, i64>(0)? as u64,
        event_type: event_type.parse().map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, Box::new(e))
        })?,
        occurred_at: chrono::DateTime::parse_from_rfc3339(&occurred_at)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(
                    2,
                    rusqlite::types::Type::Text,
                    Box::new(e),
                )
            })?,
        provider_id: r.get(3)?,
        capability_id: r.get(4)?,
        lease_id: r.get(5)?,
        session_id: r.get(6)?,
        artifact_id: r.get(7)?,
        audit_request_id: r.get(8)?,
        data: serde_json::from_str(&data).unwrap_or(Value::Null),
    })
}

/// Events with `event_id > after`, oldest first, at most `limit`.
pub fn since(
    conn: &Connection,
    after: u64,
    limit: usize,
) -> rusqlite::Result<Vec<CapabilityEvent>> {
    let mut stmt = conn.prepare_cached(
        "SELECT event_id, event_type, occurred_at, provider_id, capability_id, lease_id,
                session_id, artifact_id, audit_request_id, data
         FROM events WHERE event_id > ?1 ORDER BY event_id LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![after as i64, limit as i64], row_to_event)?;
    rows.collect()
}

/// The highest event id so far (0 when there is none).
pub fn last_id(conn: &Connection) -> rusqlite::Result<u64> {
    let id: Option<i64> = conn
        .query_row("SELECT MAX(event_id) FROM events", [], |r| r.get(0))
        .optional()?
        .flatten();
    Ok(id.unwrap_or(0) as u64)
}

/// Fan-out of committed events to live subscribers (SSE clients, the MQTT
/// bridge, waiters).
///
/// Two channels carry the same events: [`subscribe`](EventBus::subscribe)
/// hands each receiver its own copy (every receive clones the event and its
/// `data` tree), [`subscribe_shared`](EventBus::subscribe_shared) hands out
/// one shared `Arc` per event (a receive is a reference count). Consumers
/// that look at most events and keep few should use the shared one. An
/// event is only put on a channel that has receivers.
#[derive(Clone)]
pub struct EventBus {
    tx: broadcast::Sender<CapabilityEvent>,
    shared: broadcast::Sender<Arc<CapabilityEvent>>,
    db: Db,
}

impl EventBus {
    /// A bus over the events table in `db`.
    pub fn new(db: Db) -> Self {
        let (tx, _) = broadcast::channel(LIVE_BUFFER);
        let (shared, _) = broadcast::channel(LIVE_BUFFER);
        Self { tx, shared, db }
    }

    /// Hand committed events to live subscribers, in id order. Call only
    /// after the transaction that appended them has committed.
    pub fn publish(&self, events: impl IntoIterator<Item = CapabilityEvent>) {
        // No subscriber is fine: the table keeps everything.
        let owned = self.tx.receiver_count() > 0;
        let shared = self.shared.receiver_count() > 0;
        for ev in events {
            match (owned, shared) {
                (true, true) => {
                    let _ = self.shared.send(Arc::new(ev.clone()));
                    let _ = self.tx.send(ev);
                }
                (true, false) => {
                    let _ = self.tx.send(ev);
                }
                (false, true) => {
                    let _ = self.shared.send(Arc::new(ev));
                }
                (false, false) => {}
            }
        }
    }

    /// A live receiver. A receiver that lags gets `RecvError::Lagged(n)`
    /// and should replay from the table with [`EventBus::replay`].
    pub fn subscribe(&self) -> broadcast::Receiver<CapabilityEvent> {
        self.tx.subscribe()
    }

    /// A live receiver of shared events: the same events, in the same
    /// order, as [`subscribe`](Self::subscribe), but a receive does not
    /// copy the event. Lagging works the same way.
    pub fn subscribe_shared(&self) -> broadcast::Receiver<Arc<CapabilityEvent>> {
        self.shared.subscribe()
    }

    /// Events after `after` from the table (read connection), at most `limit`.
    pub async fn replay(&self, after: u64, limit: usize) -> Result<Vec<CapabilityEvent>, DbError> {
        Ok(self.db.read(move |c| since(c, after, limit)).await??)
    }

    /// Append one event in its own transaction and publish it: for changes
    /// that have no other rows to write.
    pub async fn emit(&self, ev: NewEvent) -> Result<CapabilityEvent, DbError> {
        let stored = self.db.write(move |c| append(c, ev)).await??;
        self.publish([stored.clone()]);
        Ok(stored)
    }
}
