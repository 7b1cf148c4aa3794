//! [`ProviderStore`] on SQLite through [`crate::db::Db`]: writes run on the writer
//! thread inside one transaction each, reads on the reader thread.
//!
//! Times are stored as RFC 3339 UTC with microseconds and a `Z`, so text
//! order is time order (the overdue query compares them as text). JSON
//! columns (`labels`, `tags`, `metadata_json`, ...) hold JSON text.

use std::str::FromStr;
use std::time::Duration;

use crate::sql::types::Type;
use crate::sql::{params, Connection, OptionalExtension, Row, Transaction};
use chrono::{SecondsFormat, Utc};
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};
use shared_protocol::capability::{
    Capability, CapabilityRegistration, CapabilityStatus, HealthStatus,
};
use shared_protocol::event::{CapabilityEvent, EventType};
use shared_protocol::provider::{
    CapabilityHealthReport, CapabilityProvider, HeartbeatRequest, OnlineStatus,
    ProviderRegisterRequest,
};
use shared_protocol::Timestamp;

use super::cache::RowCache;
use super::store::{
    CapabilitiesRegistered, CapabilityFilter, HealthChange, HealthSnapshot, HeartbeatRecorded,
    MaintenanceChange, OnlineTransition, ProviderFilter, ProviderRegistered, ProviderStore,
    StoreCounts, StoreError, StoreResult,
};
use crate::db::Db;
use crate::events::{self, NewEvent};

/// Priority a lease gets on a capability that declared none (seed 001 §6.1:
/// 50 = ordinary worker thread).
pub const DEFAULT_PRIORITY: u8 = 50;

/// Create the three tables (idempotent).
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS capability_providers (
            provider_id        TEXT PRIMARY KEY,
            node_id            TEXT NOT NULL,
            hostname           TEXT NOT NULL,
            platform           TEXT NOT NULL,
            gateway_version    TEXT NOT NULL,
            online_status      TEXT NOT NULL,
            last_heartbeat_at  TEXT,
            network_zone       TEXT NOT NULL,
            owner_type         TEXT,
            owner_display_name TEXT,
            auth_mode          TEXT,
            labels             TEXT NOT NULL,
            boot_id            TEXT,
            registered_at      TEXT NOT NULL,
            updated_at         TEXT NOT NULL,
            last_seen_at       TEXT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS capabilities (
            capability_id     TEXT PRIMARY KEY,
            provider_id       TEXT NOT NULL REFERENCES capability_providers(provider_id),
            node_id           TEXT NOT NULL,
            capability_type   TEXT NOT NULL,
            display_name      TEXT NOT NULL,
            status            TEXT NOT NULL,
            health_status     TEXT NOT NULL,
            lease_mode        TEXT NOT NULL,
            preemptible       INTEGER NOT NULL,
            default_priority  INTEGER NOT NULL,
            safety_locked     INTEGER NOT NULL,
            tags              TEXT NOT NULL,
            location_label    TEXT,
            metadata_json     TEXT NOT NULL,
            constraints_json  TEXT NOT NULL,
            supported_actions TEXT NOT NULL,
            evidence_modes    TEXT NOT NULL,
            created_at        TEXT NOT NULL,
            updated_at        TEXT NOT NULL,
            health_message    TEXT,
            last_snapshot_at  TEXT
        );
        CREATE INDEX IF NOT EXISTS capabilities_provider ON capabilities(provider_id);
        CREATE TABLE IF NOT EXISTS capability_health_snapshots (
            snapshot_id    INTEGER PRIMARY KEY AUTOINCREMENT,
            capability_id  TEXT NOT NULL,
            provider_id    TEXT NOT NULL,
            health_status  TEXT NOT NULL,
            status         TEXT NOT NULL,
            message        TEXT,
            metrics        TEXT,
            recorded_at    TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS health_snapshots_capability
            ON capability_health_snapshots(capability_id, snapshot_id);",
    )
}

/// The SQLite store. Cheap to clone (clones share the row cache).
///
/// `get_provider` and `get_capability` answer from a [`RowCache`] of
/// committed rows; each write forgets the provider it touched on the
/// writer thread, right after its commit.
#[derive(Clone)]
pub struct SqliteProviderStore {
    db: Db,
    cache: RowCache,
}

impl SqliteProviderStore {
    /// A store over `db`, whose tables [`migrate`] has created.
    pub fn new(db: Db) -> Self {
        Self {
            db,
            cache: RowCache::default(),
        }
    }
}

fn ts(t: Timestamp) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn conversion_err(
    idx: usize,
    e: impl std::error::Error + Send + Sync + 'static,
) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e))
}

fn get_parsed<T>(r: &Row<'_>, idx: usize) -> rusqlite::Result<T>
where
    T: FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let s: String = r.get(idx)?;
    s.parse().map_err(|e| conversion_err(idx, e))
}

fn get_time(r: &Row<'_>, idx: usize) -> rusqlite::Result<Timestamp> {
    let s: String = r.get(idx)?;
    chrono::DateTime::parse_from_rfc3339(&s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| conversion_err(idx, e))
}

fn get_opt_time(r: &Row<'_>, idx: usize) -> rusqlite::Result<Option<Timestamp>> {
    let s: Option<String> = r.get(idx)?;
    s.map(|s| {
        chrono::DateTime::parse_from_rfc3339(&s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| conversion_err(idx, e))
    })
    .transpose()
}

fn get_json<T: DeserializeOwned>(r: &Row<'_>, idx: usize) -> rusqlite::Result<T> {
    let s: String = r.get(idx)?;
    serde_json::from_str(&s).map_err(|e| conversion_err(idx, e))
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    // Values here are plain data (strings, maps, enums): serialization
    // cannot fail.
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

const PROVIDER_COLUMNS: &str = "provider_id, node_id, hostname, platform, gateway_version,
    online_status, last_heartbeat_at, network_zone, owner_type, owner_display_name, auth_mode,
    labels, boot_id";

fn row_to_provider(r: &Row<'_>) -> rusqlite::Result<CapabilityProvider> {
    Ok(CapabilityProvider {
        provider_id: r.get(0)?,
        node_id: r.get(1)?,
        hostname: r.get(2)?,
        platform: r.get(3)?,
        gateway_version: r.get(4)?,
        online_status: get_parsed(r, 5)?,
        last_heartbeat_at: get_opt_time(r, 6)?,
        network_zone: r.get(7)?,
        owner_type: r.get(8)?,
        owner_display_name: r.get(9)?,
        auth_mode: r.get(10)?,
        labels: get_json(r, 11)?,
        boot_id: r.get(12)?,
    })
}

const CAPABILITY_COLUMNS: &str = "capability_id, provider_id, node_id, capability_type,
    display_name, status, health_status, lease_mode, preemptible, default_priority,
    safety_locked, tags, location_label, metadata_json, constraints_json, supported_actions,
    evidence_modes, created_at, updated_at";

fn row_to_capability(r: &Row<'_>) -> rusqlite::Result<Capability> {
    Ok(Capability {
        capability_id: r.get(0)?,
        provider_id: r.get(1)?,
        node_id: r.get(2)?,
        capability_type: get_parsed(r, 3)?,
        display_name: r.get(4)?,
        status: get_parsed(r, 5)?,
        health_status: get_parsed(r, 6)?,
        health_check_reason: None,
        lease_mode: get_parsed(r, 7)?,
        preemptible: r.get(8)?,
        default_priority: r.get(9)?,
        safety_locked: r.get(10)?,
        tags: get_json(r, 11)?,
        location_label: r.get(12)?,
        metadata_json: get_json(r, 13)?,
        constraints_json: get_json(r, 14)?,
        supported_actions: get_json(r, 15)?,
        evidence_modes: get_json(r, 16)?,
        created_at: get_time(r, 17)?,
        updated_at: get_time(r, 18)?,
    })
}

fn load_provider(conn: &Connection, id: &str) -> rusqlite::Result<Option<CapabilityProvider>> {
    conn.prepare_cached(&format!(
        "SELECT {PROVIDER_COLUMNS} FROM capability_providers WHERE provider_id = ?1"
    ))?
    .query_row([id], row_to_provider)
    .optional()
}

fn load_capability(conn: &Connection, id: &str) -> rusqlite::Result<Option<Capability>> {
    conn.prepare_cached(&format!(
        "SELECT {CAPABILITY_COLUMNS} FROM capabilities WHERE capability_id = ?1"
    ))?
    .query_row([id], row_to_capability)
    .optional()
}

/// (capability_id, status, health_status, last_snapshot_at) of a provider.
type CapState = (String, CapabilityStatus, HealthStatus, Option<Timestamp>);

fn capability_states(conn: &Connection, provider_id: &str) -> rusqlite::Result<Vec<CapState>> {
    let mut stmt = conn.prepare_cached(
        "SELECT capability_id, status, health_status, last_snapshot_at
         FROM capabilities WHERE provider_id = ?1 ORDER BY capability_id",
    )?;
    let rows = stmt.query_map([provider_id], |r| {
        Ok((
            r.get(0)?,
            get_parsed(r, 1)?,
            get_parsed(r, 2)?,
            get_opt_time(r, 3)?,
        ))
    })?;
    rows.collect()
}

struct SnapshotRow<'a> {
    capability_id: &'a str,
    provider_id: &'a str,
    health_status: HealthStatus,
    status: CapabilityStatus,
    message: Option<&'a str>,
    metrics: Option<&'a Map<String, Value>>,
    now: Timestamp,
}

fn write_snapshot(tx: &Transaction<'_>, s: SnapshotRow<'_>) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO capability_health_snapshots
            (capability_id, provider_id, health_status, status, message, metrics, recorded_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            s.capability_id,
            s.provider_id,
            s.health_status.as_str(),
            s.status.as_str(),
            s.message,
            s.metrics.map(to_json),
            ts(s.now)
        ],
    )?;
    tx.execute(
        "UPDATE capabilities SET last_snapshot_at = ?2 WHERE capability_id = ?1",
        params![s.capability_id, ts(s.now)],
    )?;
    Ok(())
}

fn health_event(
    tx: &Transaction<'_>,
    actor: &str,
    provider_id: &str,
    change: &HealthChange,
    message: Option<&str>,
    reason: &str,
) -> rusqlite::Result<CapabilityEvent> {
    events::append(
        tx,
        NewEvent::new(
            EventType::CapabilityHealthChanged,
            actor,
            json!({
                "capability_id": change.capability_id,
                "provider_id": provider_id,
                "previous_health_status": change.previous_health_status,
                "health_status": change.health_status,
                "previous_status": change.previous_status,
                "status": change.status,
                "message": message,
                "reason": reason,
            }),
        )
        .provider(provider_id)
        .capability(change.capability_id.clone()),
    )
}

/// Move every capability of `provider_id` to the status that follows from
/// the provider being `online`; writes a snapshot and an event per change.
/// Going offline, a capability's health also becomes `unknown`: nobody
/// reports it any more (the next heartbeat after the return tells it
/// again).
fn apply_provider_status(
    tx: &Transaction<'_>,
    actor: &str,
    provider_id: &str,
    online: bool,
    reason: &str,
    now: Timestamp,
) -> rusqlite::Result<(Vec<String>, Vec<HealthChange>, Vec<CapabilityEvent>)> {
    let mut ids = Vec::new();
    let mut changes = Vec::new();
    let mut evs = Vec::new();
    for (id, status, health, _) in capability_states(tx, provider_id)? {
        ids.push(id.clone());
        let next = match (online, status) {
            (_, CapabilityStatus::Maintenance) => CapabilityStatus::Maintenance,
            (false, _) => CapabilityStatus::Offline,
            (true, CapabilityStatus::Offline) => CapabilityStatus::Available,
            (true, s) => s,
        };
        let next_health = if online {
            health
        } else {
            HealthStatus::Unknown
        };
        if next == status && next_health == health {
            continue;
        }
        tx.execute(
            "UPDATE capabilities SET status = ?2, health_status = ?3, updated_at = ?4
             WHERE capability_id = ?1",
            params![id, next.as_str(), next_health.as_str(), ts(now)],
        )?;
        let change = HealthChange {
            capability_id: id.clone(),
            previous_health_status: health,
            health_status: next_health,
            previous_status: status,
            status: next,
        };
        write_snapshot(
            tx,
            SnapshotRow {
                capability_id: &id,
                provider_id,
                health_status: next_health,
                status: next,
                message: Some(reason),
                metrics: None,
                now,
            },
        )?;
        evs.push(health_event(tx, actor, provider_id, &change, None, reason)?);
        changes.push(change);
    }
    Ok((ids, changes, evs))
}

fn register_provider_tx(
    conn: &mut Connection,
    actor: &str,
    req: &ProviderRegisterRequest,
    now: Timestamp,
) -> rusqlite::Result<ProviderRegistered> {
    let tx = conn.transaction()?;
    let previous = load_provider(&tx, &req.provider_id)?;
    let was_known = previous.is_some();
    let previous_boot_id = previous.as_ref().and_then(|p| p.boot_id.clone());
    let came_online = previous
        .as_ref()
        .map(|p| p.online_status == OnlineStatus::Offline)
        .unwrap_or(true);
    // A registration without a boot id keeps the stored one.
    let boot_id = req.boot_id.clone().or(previous_boot_id.clone());
    tx.execute(
        "INSERT INTO capability_providers (provider_id, node_id, hostname, platform,
            gateway_version, online_status, last_heartbeat_at, network_zone, owner_type,
            owner_display_name, auth_mode, labels, boot_id, registered_at, updated_at,
            last_seen_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'online', NULL, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?12, ?12)
         ON CONFLICT(provider_id) DO UPDATE SET
            node_id = excluded.node_id, hostname = excluded.hostname,
            platform = excluded.platform, gateway_version = excluded.gateway_version,
            online_status = 'online', network_zone = excluded.network_zone,
            owner_type = excluded.owner_type, owner_display_name = excluded.owner_display_name,
            auth_mode = excluded.auth_mode, labels = excluded.labels,
            boot_id = excluded.boot_id, updated_at = excluded.updated_at,
            last_seen_at = excluded.last_seen_at",
        params![
            req.provider_id,
            req.node_id,
            req.hostname,
            req.platform,
            req.gateway_version,
            req.network_zone,
            req.owner_type,
            req.owner_display_name,
            req.auth_mode,
            to_json(&req.labels),
            boot_id,
            ts(now),
        ],
    )?;
    let provider =
        load_provider(&tx, &req.provider_id)?.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
    let restarted =
        super::store::boot_changed(previous_boot_id.as_deref(), provider.boot_id.as_deref());
    let mut evs = vec![events::append(
        &tx,
        NewEvent::new(
            EventType::ProviderRegistered,
            actor,
            json!({ "provider": provider, "first_registration": !was_known, "restarted": restarted }),
        )
        .provider(req.provider_id.clone()),
    )?];
    let (_, changes, more) = apply_provider_status(
        &tx,
        actor,
        &req.provider_id,
        true,
        "provider registered",
        now,
    )?;
    evs.extend(more);
    tx.commit()?;
    Ok(ProviderRegistered {
        provider,
        was_known,
        previous_boot_id,
        came_online,
        changes,
        events: evs,
    })
}

fn register_capabilities_tx(
    conn: &mut Connection,
    actor: &str,
    provider_id: &str,
    caps: &[CapabilityRegistration],
    now: Timestamp,
) -> StoreResult<CapabilitiesRegistered> {
    let tx = conn.transaction()?;
    let provider = load_provider(&tx, provider_id)?.ok_or_else(|| StoreError::NotFound {
        kind: "provider",
        id: provider_id.to_string(),
    })?;
    let online = provider.online_status == OnlineStatus::Online;
    let mut stored = Vec::with_capacity(caps.len());
    let mut evs = Vec::with_capacity(caps.len());
    for c in caps {
        let existing = load_capability(&tx, &c.capability_id)?;
        if let Some(e) = &existing {
            if e.provider_id != provider_id {
                return Err(StoreError::Conflict {
                    code: "capability_owned_by_other_provider",
                    message: format!(
                        "capability `{}` belongs to provider `{}`",
                        c.capability_id, e.provider_id
                    ),
                    details: json!({ "capability_id": c.capability_id, "provider_id": e.provider_id }),
                });
            }
        }
        let status = match (&existing, online) {
            (Some(e), _) if e.status == CapabilityStatus::Maintenance => {
                CapabilityStatus::Maintenance
            }
            (_, true) => CapabilityStatus::Available,
            (_, false) => CapabilityStatus::Offline,
        };
        let health = existing
            .as_ref()
            .map(|e| e.health_status)
            .unwrap_or(HealthStatus::Unknown);
        tx.execute(
            "INSERT INTO capabilities (capability_id, provider_id, node_id, capability_type,
                display_name, status, health_status, lease_mode, preemptible, default_priority,
                safety_locked, tags, location_label, metadata_json, constraints_json,
                supported_actions, evidence_modes, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                ?17, ?18, ?18)
             ON CONFLICT(capability_id) DO UPDATE SET
                node_id = excluded.node_id, capability_type = excluded.capability_type,
                display_name = excluded.display_name, status = excluded.status,
                lease_mode = excluded.lease_mode, preemptible = excluded.preemptible,
                default_priority = excluded.default_priority,
                safety_locked = excluded.safety_locked, tags = excluded.tags,
                location_label = excluded.location_label,
                metadata_json = excluded.metadata_json,
                constraints_json = excluded.constraints_json,
                supported_actions = excluded.supported_actions,
                evidence_modes = excluded.evidence_modes, updated_at = excluded.updated_at",
            params![
                c.capability_id,
                provider_id,
                c.node_id.as_deref().unwrap_or(&provider.node_id),
                c.capability_type.as_str(),
                c.display_name,
                status.as_str(),
                health.as_str(),
                c.lease_mode.as_str(),
                c.preemptible,
                c.default_priority.unwrap_or(DEFAULT_PRIORITY),
                c.safety_locked,
                to_json(&c.tags),
                c.location_label,
                to_json(&c.metadata_json.clone().unwrap_or_default()),
                to_json(&c.constraints_json.clone().unwrap_or_default()),
                to_json(&c.supported_actions),
                to_json(&c.evidence_modes),
                ts(now),
            ],
        )?;
        let cap =
            load_capability(&tx, &c.capability_id)?.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
        evs.push(events::append(
            &tx,
            NewEvent::new(
                EventType::CapabilityRegistered,
                actor,
                json!({ "capability": cap, "updated": existing.is_some() }),
            )
            .provider(provider_id)
            .capability(c.capability_id.clone()),
        )?);
        stored.push(cap);
    }
    tx.commit()?;
    Ok(CapabilitiesRegistered {
        capabilities: stored,
        provider_online: online,
        events: evs,
    })
}

fn record_heartbeat_tx(
    conn: &mut Connection,
    actor: &str,
    hb: &HeartbeatRequest,
    now: Timestamp,
    min_interval: Duration,
) -> StoreResult<HeartbeatRecorded> {
    let tx = conn.transaction()?;
    let provider = load_provider(&tx, &hb.provider_id)?.ok_or_else(|| StoreError::NotFound {
        kind: "provider",
        id: hb.provider_id.clone(),
    })?;
    let came_online = provider.online_status == OnlineStatus::Offline;
    let boot_id = hb.boot_id.clone().or(provider.boot_id.clone());
    tx.execute(
        "UPDATE capability_providers SET online_status = 'online', last_heartbeat_at = ?2,
            last_seen_at = ?2, boot_id = ?3
         WHERE provider_id = ?1",
        params![hb.provider_id, ts(now), boot_id],
    )?;
    let mut evs = Vec::new();
    let mut changes = Vec::new();
    if came_online {
        let (_, c, e) =
            apply_provider_status(&tx, actor, &hb.provider_id, true, "heartbeat received", now)?;
        changes.extend(c);
        evs.extend(e);
    }
    let states = capability_states(&tx, &hb.provider_id)?;
    let mut snapshots_written = 0;
    let mut unknown = Vec::new();
    let min_interval = chrono::Duration::from_std(min_interval).unwrap_or(chrono::Duration::MAX);
    for report in &hb.capabilities {
        let CapabilityHealthReport {
            capability_id,
            health_status,
            message,
            metrics,
        } = report;
        let Some((_, status, previous_health, last_snapshot)) =
            states.iter().find(|s| &s.0 == capability_id)
        else {
            unknown.push(capability_id.clone());
            continue;
        };
        let changed = health_status != previous_health;
        let due = last_snapshot
            .map(|t| now - t >= min_interval)
            .unwrap_or(true);
        if changed {
            tx.execute(
                "UPDATE capabilities SET health_status = ?2, health_message = ?3, updated_at = ?4
                 WHERE capability_id = ?1",
                params![capability_id, health_status.as_str(), message, ts(now)],
            )?;
            let change = HealthChange {
                capability_id: capability_id.clone(),
                previous_health_status: *previous_health,
                health_status: *health_status,
                previous_status: *status,
                status: *status,
            };
            evs.push(health_event(
                &tx,
                actor,
                &hb.provider_id,
                &change,
                message.as_deref(),
                "heartbeat",
            )?);
            changes.push(change);
        }
        if changed || due {
            write_snapshot(
                &tx,
                SnapshotRow {
                    capability_id,
                    provider_id: &hb.provider_id,
                    health_status: *health_status,
                    status: *status,
                    message: message.as_deref(),
                    metrics: metrics.as_ref(),
                    now,
                },
            )?;
            snapshots_written += 1;
        }
    }
    tx.commit()?;
    Ok(HeartbeatRecorded {
        provider_id: hb.provider_id.clone(),
        came_online,
        previous_boot_id: provider.boot_id,
        boot_id,
        changes,
        snapshots_written,
        unknown_capabilities: unknown,
        capability_ids: states.into_iter().map(|s| s.0).collect(),
        events: evs,
    })
}

fn set_online_tx(
    conn: &mut Connection,
    actor: &str,
    provider_id: &str,
    online: bool,
    boot_id: Option<String>,
    reason: &str,
    now: Timestamp,
) -> StoreResult<OnlineTransition> {
    let tx = conn.transaction()?;
    let provider = load_provider(&tx, provider_id)?.ok_or_else(|| StoreError::NotFound {
        kind: "provider",
        id: provider_id.to_string(),
    })?;
    let target = if online {
        OnlineStatus::Online
    } else {
        OnlineStatus::Offline
    };
    let changed = provider.online_status != target;
    let new_boot = boot_id.or(provider.boot_id.clone());
    if online {
        tx.execute(
            "UPDATE capability_providers SET online_status = ?2, boot_id = ?3, last_seen_at = ?4
             WHERE provider_id = ?1",
            params![provider_id, target.as_str(), new_boot, ts(now)],
        )?;
    } else {
        tx.execute(
            "UPDATE capability_providers SET online_status = ?2, boot_id = ?3
             WHERE provider_id = ?1",
            params![provider_id, target.as_str(), new_boot],
        )?;
    }
    let (ids, changes, evs) = apply_provider_status(&tx, actor, provider_id, online, reason, now)?;
    tx.commit()?;
    Ok(OnlineTransition {
        provider_id: provider_id.to_string(),
        changed,
        previous_boot_id: provider.boot_id,
        capability_ids: ids,
        changes,
        events: evs,
    })
}

fn set_maintenance_tx(
    conn: &mut Connection,
    actor: &str,
    capability_ids: &[String],
    reason: Option<&str>,
    now: Timestamp,
) -> StoreResult<(MaintenanceChange, Vec<String>)> {
    let tx = conn.transaction()?;
    let mut caps = Vec::with_capacity(capability_ids.len());
    let mut evs = Vec::new();
    let mut providers = Vec::new();
    for id in capability_ids {
        let c = load_capability(&tx, id)?.ok_or_else(|| StoreError::NotFound {
            kind: "capability",
            id: id.clone(),
        })?;
        providers.push(c.provider_id.clone());
        let next = match reason {
            Some(_) => CapabilityStatus::Maintenance,
            None if c.status != CapabilityStatus::Maintenance => c.status,
            None => {
                let online = load_provider(&tx, &c.provider_id)?
                    .is_some_and(|p| p.online_status == OnlineStatus::Online);
                if online {
                    CapabilityStatus::Available
                } else {
                    CapabilityStatus::Offline
                }
            }
        };
        if next == c.status {
            caps.push(c);
            continue;
        }
        tx.execute(
            "UPDATE capabilities SET status = ?2, updated_at = ?3 WHERE capability_id = ?1",
            params![id, next.as_str(), ts(now)],
        )?;
        write_snapshot(
            &tx,
            SnapshotRow {
                capability_id: id,
                provider_id: &c.provider_id,
                health_status: c.health_status,
                status: next,
                message: reason,
                metrics: None,
                now,
            },
        )?;
        let event_type = if reason.is_some() {
            EventType::CapabilityMaintenanceStarted
        } else {
            EventType::CapabilityMaintenanceEnded
        };
        evs.push(events::append(
            &tx,
            NewEvent::new(
                event_type,
                actor,
                json!({
                    "capability_id": id,
                    "provider_id": c.provider_id,
                    "reason": reason,
                    "previous_status": c.status,
                    "status": next,
                }),
            )
            .provider(c.provider_id.clone())
            .capability(id.clone()),
        )?);
        caps.push(load_capability(&tx, id)?.unwrap_or(c));
    }
    tx.commit()?;
    Ok((
        MaintenanceChange {
            capabilities: caps,
            events: evs,
        },
        providers,
    ))
}

fn remove_capability_tx(
    conn: &mut Connection,
    actor: &str,
    capability_id: &str,
) -> StoreResult<(CapabilityEvent, String)> {
    let tx = conn.transaction()?;
    let c = load_capability(&tx, capability_id)?.ok_or_else(|| StoreError::NotFound {
        kind: "capability",
        id: capability_id.to_string(),
    })?;
    if c.status != CapabilityStatus::Maintenance {
        return Err(StoreError::Conflict {
            code: "capability_not_in_maintenance",
            message: format!(
                "capability `{capability_id}` is `{}`: put it into maintenance before removing it",
                c.status
            ),
            details: json!({ "capability_id": capability_id, "status": c.status }),
        });
    }
    tx.execute(
        "DELETE FROM capabilities WHERE capability_id = ?1",
        [capability_id],
    )?;
    let ev = events::append(
        &tx,
        NewEvent::new(EventType::CapabilityRemoved, actor, json!(c))
            .provider(c.provider_id.clone())
            .capability(capability_id.to_string()),
    )?;
    tx.commit()?;
    Ok((ev, c.provider_id))
}

#[async_trait::async_trait]
impl ProviderStore for SqliteProviderStore {
    async fn set_maintenance(
        &self,
        actor: &str,
        capability_ids: Vec<String>,
        reason: Option<String>,
        now: Timestamp,
    ) -> StoreResult<MaintenanceChange> {
        let actor = actor.to_string();
        let cache = self.cache.clone();
        self.db
            .write(move |c| {
                let done = set_maintenance_tx(c, &actor, &capability_ids, reason.as_deref(), now);
                if let Ok((_, providers)) = &done {
                    for p in providers {
                        cache.forget(p);
                    }
                }
                done.map(|(change, _)| change)
            })
            .await?
    }

    async fn remove_capability(
        &self,
        actor: &str,
        capability_id: &str,
        _now: Timestamp,
    ) -> StoreResult<CapabilityEvent> {
        let actor = actor.to_string();
        let id = capability_id.to_string();
        let cache = self.cache.clone();
        self.db
            .write(move |c| {
                let done = remove_capability_tx(c, &actor, &id);
                if let Ok((_, provider_id)) = &done {
                    cache.forget(provider_id);
                }
                done.map(|(ev, _)| ev)
            })
            .await?
    }

    async fn ping(&self) -> StoreResult<()> {
        self.db
            .read(|c| c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)))
            .await??;
        Ok(())
    }

    async fn register_provider(
        &self,
        actor: &str,
        req: ProviderRegisterRequest,
        now: Timestamp,
    ) -> StoreResult<ProviderRegistered> {
        let actor = actor.to_string();
        let cache = self.cache.clone();
        Ok(self
            .db
            .write(move |c| {
                let done = register_provider_tx(c, &actor, &req, now);
                cache.forget(&req.provider_id);
                done
            })
            .await??)
    }

    async fn register_capabilities(
        &self,
        actor: &str,
        provider_id: &str,
        capabilities: Vec<CapabilityRegistration>,
        now: Timestamp,
    ) -> StoreResult<CapabilitiesRegistered> {
        let actor = actor.to_string();
        let provider_id = provider_id.to_string();
        let cache = self.cache.clone();
        self.db
            .write(move |c| {
                let done = register_capabilities_tx(c, &actor, &provider_id, &capabilities, now);
                cache.forget(&provider_id);
                done
            })
            .await?
    }

    async fn record_heartbeat(
        &self,
        actor: &str,
        heartbeat: HeartbeatRequest,
        now: Timestamp,
        snapshot_min_interval: Duration,
    ) -> StoreResult<HeartbeatRecorded> {
        let actor = actor.to_string();
        let cache = self.cache.clone();
        self.db
            .write(move |c| {
                let done = record_heartbeat_tx(c, &actor, &heartbeat, now, snapshot_min_interval);
                cache.forget(&heartbeat.provider_id);
                done
            })
            .await?
    }

    async fn set_provider_online(
        &self,
        actor: &str,
        provider_id: &str,
        online: bool,
        boot_id: Option<String>,
        reason: &str,
        now: Timestamp,
    ) -> StoreResult<OnlineTransition> {
        let actor = actor.to_string();
        let provider_id = provider_id.to_string();
        let reason = reason.to_string();
        let cache = self.cache.clone();
        self.db
            .write(move |c| {
                let done = set_online_tx(c, &actor, &provider_id, online, boot_id, &reason, now);
                cache.forget(&provider_id);
                done
            })
            .await?
    }

    async fn get_provider(&self, provider_id: &str) -> StoreResult<Option<CapabilityProvider>> {
        let ticket = match self.cache.provider(provider_id) {
            Ok(p) => return Ok(Some(p)),
            Err(ticket) => ticket,
        };
        let id = provider_id.to_string();
        let found = self.db.read(move |c| load_provider(c, &id)).await??;
        if let Some(p) = &found {
            self.cache.fill_provider(ticket, p);
        }
        Ok(found)
    }

    async fn list_providers(&self, filter: ProviderFilter) -> StoreResult<Vec<CapabilityProvider>> {
        Ok(self
            .db
            .read(move |c| -> rusqlite::Result<Vec<CapabilityProvider>> {
                let mut stmt = c.prepare_cached(&format!(
                    "SELECT {PROVIDER_COLUMNS} FROM capability_providers
                     WHERE (?1 IS NULL OR online_status = ?1) ORDER BY provider_id"
                ))?;
                let rows =
                    stmt.query_map([filter.online_status.map(|s| s.as_str())], row_to_provider)?;
                rows.collect()
            })
            .await??)
    }

    async fn get_capability(&self, capability_id: &str) -> StoreResult<Option<Capability>> {
        let ticket = match self.cache.capability(capability_id) {
            Ok(c) => return Ok(Some(c)),
            Err(ticket) => ticket,
        };
        let id = capability_id.to_string();
        let found = self.db.read(move |c| load_capability(c, &id)).await??;
        if let Some(c) = &found {
            self.cache.fill_capability(ticket, c);
        }
        Ok(found)
    }

    async fn list_capabilities(&self, filter: CapabilityFilter) -> StoreResult<Vec<Capability>> {
        Ok(self
            .db
            .read(move |c| -> rusqlite::Result<Vec<Capability>> {
                let tags = c.json_texts("capabilities.tags");
                let mut stmt = c.prepare_cached(&format!(
                    "SELECT {CAPABILITY_COLUMNS} FROM capabilities
                     WHERE (?1 IS NULL OR capability_type = ?1)
                       AND (?2 IS NULL OR provider_id = ?2)
                       AND (?3 IS NULL OR status = ?3)
                       AND (?4 IS NULL OR EXISTS
                            (SELECT 1 FROM {tags} WHERE value = ?4))
                     ORDER BY capability_id"
                ))?;
                let rows = stmt.query_map(
                    params![
                        filter.capability_type.map(|t| t.as_str()),
                        filter.provider_id,
                        filter.status.map(|s| s.as_str()),
                        filter.tag,
                    ],
                    row_to_capability,
                )?;
                rows.collect()
            })
            .await??)
    }

    async fn health_history(
        &self,
        capability_id: &str,
        limit: usize,
    ) -> StoreResult<Vec<HealthSnapshot>> {
        let id = capability_id.to_string();
        Ok(self
            .db
            .read(move |c| -> rusqlite::Result<Vec<HealthSnapshot>> {
                let mut stmt = c.prepare_cached(
                    "SELECT snapshot_id, capability_id, provider_id, health_status, status,
                            message, metrics, recorded_at
                     FROM capability_health_snapshots WHERE capability_id = ?1
                     ORDER BY snapshot_id DESC LIMIT ?2",
                )?;
                let rows = stmt.query_map(params![id, limit as i64], |r| {
                    let metrics: Option<String> = r.get(6)?;
                    Ok(HealthSnapshot {
                        snapshot_id: r.get::<_, i64>(0)? as u64,
                        capability_id: r.get(1)?,
                        provider_id: r.get(2)?,
                        health_status: get_parsed(r, 3)?,
                        status: get_parsed(r, 4)?,
                        message: r.get(5)?,
                        metrics: metrics
                            .map(|m| serde_json::from_str(&m).map_err(|e| conversion_err(6, e)))
                            .transpose()?,
                        recorded_at: get_time(r, 7)?,
                    })
                })?;
                rows.collect()
            })
            .await??)
    }

    async fn counts(&self) -> StoreResult<StoreCounts> {
        Ok(self
            .db
            .read(|c| -> rusqlite::Result<StoreCounts> {
                let count = |sql: &str| {
                    c.query_row(sql, [], |r| r.get::<_, i64>(0))
                        .map(|n| n as u64)
                };
                Ok(StoreCounts {
                    providers_total: count("SELECT COUNT(*) FROM capability_providers")?,
                    providers_online: count(
                        "SELECT COUNT(*) FROM capability_providers WHERE online_status = 'online'",
                    )?,
                    capabilities_total: count("SELECT COUNT(*) FROM capabilities")?,
                    health_snapshots_total: count(
                        "SELECT COUNT(*) FROM capability_health_snapshots",
                    )?,
                })
            })
            .await??)
    }
}
