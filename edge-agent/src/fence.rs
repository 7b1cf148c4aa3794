//! What this bench knows of the leases on its capabilities, which decides
//! whether a command may still act (docs/architecture.md "Fencing").
//!
//! The registry numbers every grant (`lease_generation`, increasing). The
//! bench learns generations from `lease_granted`, `action_invoke` and
//! `lease_revoked`, and refuses a command
//! - of a lease it was told has ended ([`FenceRefusal::LeaseEnded`]);
//! - of a lease a newer one supersedes ([`FenceRefusal::LeaseSuperseded`]):
//!   an exclusive lease supersedes every older lease of the capability, a
//!   shared one every older exclusive one (they cannot coexist);
//! - whose `not_after` may have passed on the registry's clock
//!   ([`FenceRefusal::NotAfterPassed`], judged by the caller with
//!   [`crate::clock::RegistryClock`]).
//!
//! Memory only: a restarted daemon has a new boot id, which makes the
//! registry end every session of the old one.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use shared_protocol::capability::LeaseMode;
use shared_protocol::mqtt::FenceRefusal;

/// Ended lease ids remembered per capability (older ones are refused by
/// generation once a newer lease is known).
pub const ENDED_KEPT: usize = 1024;

#[derive(Default)]
struct CapFence {
    /// Largest generation known on this capability, and largest of an
    /// exclusive lease.
    max_generation: u64,
    max_exclusive_generation: u64,
    /// Leases known and not ended: generation → (lease id, mode).
    live: BTreeMap<u64, (String, LeaseMode)>,
    ended: HashSet<String>,
    ended_order: VecDeque<String>,
}

/// A refusal: why, and a sentence for the session's `error_message`.
pub type Refused = (FenceRefusal, String);

/// Lease knowledge per capability. Owned by the command dispatcher (one
/// task), so no lock.
#[derive(Default)]
pub struct Fences {
    caps: HashMap<String, CapFence>,
}

impl Fences {
    /// May a command of lease `lease_id` (generation `generation`, held in
    /// `mode`) act on `capability_id`? Errors name the refusal.
    pub fn check(
        &self,
        capability_id: &str,
        lease_id: &str,
        generation: u64,
        mode: LeaseMode,
    ) -> Result<(), Refused> {
        let Some(c) = self.caps.get(capability_id) else {
            return Ok(());
        };
        if c.ended.contains(lease_id) {
            return Err((
                FenceRefusal::LeaseEnded,
                format!(
                    "lease `{lease_id}` on `{capability_id}` has ended (lease_revoked received)"
                ),
            ));
        }
        let newer = if mode == LeaseMode::Exclusive {
            c.max_generation
        } else {
            c.max_exclusive_generation
        };
        if newer > generation {
            let by = c
                .live
                .get(&newer)
                .map(|(id, m)| format!("lease `{id}` ({m})"))
                .unwrap_or_else(|| "a newer lease".to_string());
            return Err((
                FenceRefusal::LeaseSuperseded,
                format!(
                    "lease `{lease_id}` (generation {generation}) on `{capability_id}` was superseded by {by}, generation {newer}"
                ),
            ));
        }
        Ok(())
    }

    /// Note lease `lease_id` (from a grant or a command). Returns the live
    /// leases it supersedes (their queued and running sessions must stop),
    /// which are forgotten.
    pub fn note_lease(
        &mut self,
        capability_id: &str,
        lease_id: &str,
        generation: u64,
        mode: LeaseMode,
    ) -> Vec<String> {
        let c = self.caps.entry(capability_id.to_string()).or_default();
        if c.ended.contains(lease_id) {
            return Vec::new();
        }
        c.max_generation = c.max_generation.max(generation);
        if mode == LeaseMode::Exclusive {
            c.max_exclusive_generation = c.max_exclusive_generation.max(generation);
        }
        c.live.insert(generation, (lease_id.to_string(), mode));
        let superseded: Vec<u64> = c
            .live
            .range(..generation)
            .filter(|(_, (_, m))| mode == LeaseMode::Exclusive || *m == LeaseMode::Exclusive)
            .map(|(g, _)| *g)
            .collect();
        superseded
            .into_iter()
            .filter_map(|g| c.live.remove(&g).map(|(id, _)| id))
            .collect()
    }

    /// Lease `lease_id` ended (`lease_revoked`): its commands are refused
    /// from now on.
    pub fn note_ended(&mut self, capability_id: &str, lease_id: &str, generation: u64) {
        let c = self.caps.entry(capability_id.to_string()).or_default();
        c.live.retain(|_, (id, _)| id != lease_id);
        c.max_generation = c.max_generation.max(generation);
        if c.ended.insert(lease_id.to_string()) {
            c.ended_order.push_back(lease_id.to_string());
            if c.ended_order.len() > ENDED_KEPT {
                if let Some(old) = c.ended_order.pop_front() {
                    c.ended.remove(&old);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LeaseMode::*;

    #[test]
    fn an_ended_lease_is_refused() {
        let mut f = Fences::default();
        f.note_lease("relay-1", "lease-a", 1, Exclusive);
        assert!(f.check("relay-1", "lease-a", 1, Exclusive).is_ok());
        f.note_ended("relay-1", "lease-a", 1);
        let (why, msg) = f.check("relay-1", "lease-a", 1, Exclusive).unwrap_err();
        assert_eq!(why, FenceRefusal::LeaseEnded);
        assert!(msg.contains("lease-a"), "{msg}");
        // Another capability knows nothing of it.
        assert!(f.check("relay-2", "lease-a", 1, Exclusive).is_ok());
    }

    #[test]
    fn a_newer_exclusive_lease_supersedes_every_older_one() {
        let mut f = Fences::default();
        assert!(f.note_lease("cam", "old-shared", 3, SharedRead).is_empty());
        assert!(f.note_lease("cam", "old-excl", 2, Exclusive).is_empty());
        let superseded = f.note_lease("cam", "new", 5, Exclusive);
        assert_eq!(superseded.len(), 2, "{superseded:?}");
        for (id, g, m) in [("old-shared", 3, SharedRead), ("old-excl", 2, Exclusive)] {
            let (why, msg) = f.check("cam", id, g, m).unwrap_err();
            assert_eq!(why, FenceRefusal::LeaseSuperseded);
            assert!(
                msg.contains("`new`") && msg.contains("generation 5"),
                "{msg}"
            );
        }
        assert!(f.check("cam", "new", 5, Exclusive).is_ok());
    }

    #[test]
    fn shared_leases_coexist_but_supersede_an_older_exclusive_one() {
        let mut f = Fences::default();
        f.note_lease("cam", "excl", 1, Exclusive);
        let gone = f.note_lease("cam", "reader-a", 2, SharedRead);
        assert_eq!(gone, vec!["excl".to_string()]);
        f.note_lease("cam", "reader-b", 3, SharedRead);
        assert!(f.check("cam", "reader-a", 2, SharedRead).is_ok());
        assert!(f.check("cam", "reader-b", 3, SharedRead).is_ok());
        assert_eq!(
            f.check("cam", "excl", 1, Exclusive).unwrap_err().0,
            FenceRefusal::LeaseSuperseded
        );
    }

    #[test]
    fn a_command_of_an_older_exclusive_lease_arriving_after_a_grant_is_refused() {
        let mut f = Fences::default();
        // The grant of the second holder arrives before the first holder's
        // stale command (which was never noted).
        f.note_lease("relay-1", "second", 8, Exclusive);
        assert_eq!(
            f.check("relay-1", "first", 7, Exclusive).unwrap_err().0,
            FenceRefusal::LeaseSuperseded
        );
    }

    #[test]
    fn ended_ids_are_bounded() {
        let mut f = Fences::default();
        for g in 0..(ENDED_KEPT as u64 + 10) {
            f.note_ended("relay-1", &format!("l{g}"), g + 1);
        }
        let c = &f.caps["relay-1"];
        assert_eq!(c.ended.len(), ENDED_KEPT);
        // Forgotten ones are still refused by generation.
        assert!(f.check("relay-1", "l0", 1, Exclusive).is_err());
    }
}
