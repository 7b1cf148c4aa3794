//! Committed provider and capability rows kept in memory, so the hot paths
//! (invoking an action, taking a session update from MQTT) look a
//! capability and its provider up without a database round trip.
//!
//! A store fills the cache on a read miss and calls [`RowCache::forget`]
//! for a provider after every write that touched it, on the thread that
//! committed the write (so a caller that stopped waiting cannot skip it).
//! A fill that started before such a `forget` is dropped instead of stored
//! (every `forget` moves a generation counter on), so a row read before a
//! commit can never outlive it in the cache.
//!
//! Misses (unknown ids) are not cached. Size: one entry per provider and
//! per capability that has been read, the registered ones at most.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use shared_protocol::capability::Capability;
use shared_protocol::provider::CapabilityProvider;

#[derive(Default)]
struct Rows {
    generation: u64,
    providers: HashMap<String, CapabilityProvider>,
    capabilities: HashMap<String, Capability>,
    /// Cached capability ids per provider id, so forgetting a provider
    /// does not scan every cached capability (it runs on each heartbeat).
    by_provider: HashMap<String, HashSet<String>>,
}

/// The shared cache; clones share it.
#[derive(Clone, Default)]
pub struct RowCache {
    rows: Arc<Mutex<Rows>>,
}

/// Where a fill started: the generation seen at the miss.
#[derive(Debug, Clone, Copy)]
pub struct FillTicket(u64);

impl RowCache {
    fn lock(&self) -> MutexGuard<'_, Rows> {
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached provider, or a ticket to fill it with after reading.
    pub fn provider(&self, provider_id: &str) -> Result<CapabilityProvider, FillTicket> {
        let rows = self.lock();
        rows.providers
            .get(provider_id)
            .cloned()
            .ok_or(FillTicket(rows.generation))
    }

    /// The cached capability, or a ticket to fill it with after reading.
    pub fn capability(&self, capability_id: &str) -> Result<Capability, FillTicket> {
        let rows = self.lock();
        rows.capabilities
            .get(capability_id)
            .cloned()
            .ok_or(FillTicket(rows.generation))
    }

    /// Keep `provider` as read under `ticket`, unless a write was
    /// committed since.
    pub fn fill_provider(&self, ticket: FillTicket, provider: &CapabilityProvider) {
        let mut rows = self.lock();
        if rows.generation == ticket.0 {
            rows.providers
                .insert(provider.provider_id.clone(), provider.clone());
        }
    }

    /// Keep `capability` as read under `ticket`, unless a write was
    /// committed since.
    pub fn fill_capability(&self, ticket: FillTicket, capability: &Capability) {
        let mut rows = self.lock();
        if rows.generation == ticket.0 {
            rows.by_provider
                .entry(capability.provider_id.clone())
                .or_default()
                .insert(capability.capability_id.clone());
            rows.capabilities
                .insert(capability.capability_id.clone(), capability.clone());
        }
    }

    /// A write touching `provider_id` (its row or any of its capabilities)
    /// was committed: drop them, and every fill in progress.
    pub fn forget(&self, provider_id: &str) {
        let mut rows = self.lock();
        rows.generation += 1;
        rows.providers.remove(provider_id);
        for id in rows.by_provider.remove(provider_id).unwrap_or_default() {
            rows.capabilities.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn provider(id: &str, boot: &str) -> CapabilityProvider {
        serde_json::from_value(json!({
            "provider_id": id, "node_id": "n", "hostname": "bench", "platform": "linux",
            "gateway_version": "1", "online_status": "online", "last_heartbeat_at": null,
            "network_zone": "lab", "owner_type": null, "owner_display_name": null,
            "auth_mode": null, "labels": [], "boot_id": boot
        }))
        .unwrap()
    }

    fn capability(id: &str, provider_id: &str) -> Capability {
        serde_json::from_value(json!({
            "capability_id": id, "provider_id": provider_id, "node_id": "n",
            "capability_type": "camera", "display_name": id, "status": "available",
            "health_status": "healthy", "lease_mode": "exclusive", "preemptible": true,
            "default_priority": 50, "safety_locked": false, "tags": [],
            "location_label": null, "metadata_json": {}, "constraints_json": {},
            "supported_actions": ["snapshot"], "evidence_modes": ["image"],
            "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"
        }))
        .unwrap()
    }

    #[test]
    fn a_filled_row_is_served_until_its_provider_is_written() {
        let cache = RowCache::default();
        let t = cache.provider("p1").unwrap_err();
        cache.fill_provider(t, &provider("p1", "b1"));
        let t = cache.capability("cam").unwrap_err();
        cache.fill_capability(t, &capability("cam", "p1"));
        let t = cache.capability("mic").unwrap_err();
        cache.fill_capability(t, &capability("mic", "p2"));
        assert_eq!(cache.provider("p1").unwrap().boot_id.as_deref(), Some("b1"));
        assert!(cache.capability("cam").is_ok());

        cache.forget("p1");
        assert!(cache.provider("p1").is_err());
        assert!(cache.capability("cam").is_err());
        // Another provider's rows stay.
        assert!(cache.capability("mic").is_ok());
    }

    #[test]
    fn a_fill_that_started_before_a_write_is_not_kept() {
        let cache = RowCache::default();
        let before = cache.provider("p1").unwrap_err();
        // The write commits and forgets while the read is in flight.
        cache.forget("p1");
        cache.fill_provider(before, &provider("p1", "old-boot"));
        assert!(cache.provider("p1").is_err(), "the stale read was kept");
        let after = cache.provider("p1").unwrap_err();
        cache.fill_provider(after, &provider("p1", "new-boot"));
        assert_eq!(
            cache.provider("p1").unwrap().boot_id.as_deref(),
            Some("new-boot")
        );
    }
}
