//! Two live instances of one provider (a copied bench configuration): the
//! same provider id and token on two hosts. They take over each other's
//! MQTT session, and actions would land on either bench
//! (docs/architecture.md "Twin benches").
//!
//! A restart of a bench gives it a new boot id that never comes back; two
//! instances alternate between two boot ids. So a provider is *in
//! conflict* once it has come back to a boot id it had left less than
//! [`TwinSettings::window`] ago, [`RETURNS_TO_CONFLICT`] times. While in
//! conflict its actions are refused (409 `provider_conflict`), the
//! messages of both instances change nothing in the store, and both are
//! told (`provider_conflict` on their commands topic). The conflict ends
//! once only one boot id has been heard for [`TwinSettings::clear_after`].
//!
//! Memory only, monotonic clock; a registry restart forgets (the next
//! alternation is detected again within seconds).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// Returns to an earlier boot id, within the window, that make a conflict
/// (one return could be a late message of an instance that just stopped).
pub const RETURNS_TO_CONFLICT: u32 = 2;

/// Timing of twin detection.
#[derive(Debug, Clone, Copy)]
pub struct TwinSettings {
    /// A boot id heard again within this long of being left counts as a
    /// return (300 s).
    pub window: Duration,
    /// A conflict ends once only one boot id was heard for this long
    /// (90 s; longer than the edge's longest wait between takeovers,
    /// 30 s).
    pub clear_after: Duration,
}

impl Default for TwinSettings {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(300),
            clear_after: Duration::from_secs(90),
        }
    }
}

/// One instance of a provider, as last heard.
pub type Instance = shared_protocol::mqtt::ProviderInstance;

#[derive(Debug, Clone)]
struct Seen {
    hostname: String,
    node_id: String,
    last_heard: Instant,
    last_notified: Option<Instant>,
}

#[derive(Debug, Default)]
struct ProviderTwins {
    current: Option<String>,
    instances: HashMap<String, Seen>,
    returns: u32,
    in_conflict: bool,
}

/// What hearing a provider's boot id means.
#[derive(Debug, Clone, PartialEq)]
pub enum Heard {
    /// One instance, as far as the registry can tell.
    Alone,
    /// This message made the provider conflicted: the instances.
    ConflictStarted(Vec<Instance>),
    /// Still in conflict; `notify` when this instance was not told within
    /// [`NOTICE_PERIOD`] (it is probably the one connected now: tell it).
    InConflict { notify: bool },
}

/// How often one instance is told of the conflict at most.
pub const NOTICE_PERIOD: Duration = Duration::from_secs(5);

/// Twin detection for every provider. Share it (`Arc`).
#[derive(Debug, Default)]
pub struct TwinWatch {
    settings: TwinSettings,
    providers: Mutex<HashMap<String, ProviderTwins>>,
}

fn instances_of(p: &ProviderTwins, now: Instant) -> Vec<Instance> {
    let mut v: Vec<Instance> = p
        .instances
        .iter()
        .map(|(boot_id, s)| Instance {
            boot_id: boot_id.clone(),
            hostname: s.hostname.clone(),
            node_id: s.node_id.clone(),
            last_heard_ms_ago: now.saturating_duration_since(s.last_heard).as_millis() as u64,
        })
        .collect();
    v.sort_by_key(|i| i.last_heard_ms_ago);
    v
}

impl TwinWatch {
    /// Detection with `settings`.
    pub fn new(settings: TwinSettings) -> Self {
        Self {
            settings,
            providers: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, ProviderTwins>> {
        self.providers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `provider_id` was heard with `boot_id` (an `online` status, a
    /// registration, a heartbeat); `host` is `(hostname, node_id)` when
    /// the message names them (a registration).
    pub fn heard(&self, provider_id: &str, boot_id: &str, host: Option<(&str, &str)>) -> Heard {
        let now = Instant::now();
        let mut all = self.lock();
        let p = all.entry(provider_id.to_string()).or_default();
        let window = self.settings.window;
        p.instances
            .retain(|_, s| now.saturating_duration_since(s.last_heard) <= window);
        let returning =
            p.current.as_deref().is_some_and(|c| c != boot_id) && p.instances.contains_key(boot_id);
        let seen = p.instances.entry(boot_id.to_string()).or_insert(Seen {
            hostname: String::new(),
            node_id: String::new(),
            last_heard: now,
            last_notified: None,
        });
        seen.last_heard = now;
        if let Some((h, n)) = host {
            seen.hostname = h.to_string();
            seen.node_id = n.to_string();
        }
        let notify = seen
            .last_notified
            .is_none_or(|t| now.saturating_duration_since(t) >= NOTICE_PERIOD);
        p.current = Some(boot_id.to_string());
        if p.in_conflict {
            if notify {
                if let Some(s) = p.instances.get_mut(boot_id) {
                    s.last_notified = Some(now);
                }
            }
            return Heard::InConflict { notify };
        }
        if returning {
            p.returns += 1;
        }
        if p.returns >= RETURNS_TO_CONFLICT && p.instances.len() > 1 {
            p.in_conflict = true;
            if let Some(s) = p.instances.get_mut(boot_id) {
                s.last_notified = Some(now);
            }
            return Heard::ConflictStarted(instances_of(p, now));
        }
        Heard::Alone
    }

    /// The instances of `provider_id` while it is in conflict.
    pub fn conflict(&self, provider_id: &str) -> Option<Vec<Instance>> {
        let now = Instant::now();
        let all = self.lock();
        all.get(provider_id)
            .filter(|p| p.in_conflict)
            .map(|p| instances_of(p, now))
    }

    /// Every provider in conflict, with its instances.
    pub fn conflicted(&self) -> Vec<(String, Vec<Instance>)> {
        let now = Instant::now();
        self.lock()
            .iter()
            .filter(|(_, p)| p.in_conflict)
            .map(|(id, p)| (id.clone(), instances_of(p, now)))
            .collect()
    }

    /// End the conflicts in which only one boot id was heard for
    /// `clear_after`; returns each such provider with the instance left.
    pub fn settle(&self) -> Vec<(String, Instance)> {
        let now = Instant::now();
        let clear = self.settings.clear_after;
        let mut ended = Vec::new();
        for (id, p) in self.lock().iter_mut() {
            if !p.in_conflict {
                continue;
            }
            let live: Vec<&String> = p
                .instances
                .iter()
                .filter(|(_, s)| now.saturating_duration_since(s.last_heard) < clear)
                .map(|(b, _)| b)
                .collect();
            if live.len() <= 1 {
                let keep = live.first().map(|b| (*b).clone());
                p.instances.retain(|b, _| Some(b) == keep.as_ref());
                p.in_conflict = false;
                p.returns = 0;
                if let Some(i) = instances_of(p, now).into_iter().next() {
                    ended.push((id.clone(), i));
                }
            }
        }
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch() -> TwinWatch {
        TwinWatch::new(TwinSettings {
            window: Duration::from_secs(60),
            clear_after: Duration::from_millis(200),
        })
    }

    #[test]
    fn a_restart_is_not_a_twin() {
        let w = watch();
        for boot in ["a", "a", "b", "b", "c"] {
            assert_eq!(w.heard("p", boot, None), Heard::Alone);
        }
        assert!(w.conflict("p").is_none());
    }

    #[test]
    fn two_instances_alternating_are_a_conflict_naming_both_hosts() {
        let w = watch();
        assert_eq!(w.heard("p", "a", Some(("bench-a", "node-a"))), Heard::Alone);
        assert_eq!(w.heard("p", "b", Some(("bench-b", "node-b"))), Heard::Alone);
        // One return: perhaps a late message of a stopped instance.
        assert_eq!(w.heard("p", "a", None), Heard::Alone);
        let Heard::ConflictStarted(inst) = w.heard("p", "b", None) else {
            panic!("second return is a conflict");
        };
        let hosts: Vec<&str> = inst.iter().map(|i| i.hostname.as_str()).collect();
        assert!(
            hosts.contains(&"bench-a") && hosts.contains(&"bench-b"),
            "{inst:?}"
        );
        // The other instance is told when next heard; then not again
        // within the notice period.
        assert_eq!(w.heard("p", "a", None), Heard::InConflict { notify: true });
        assert_eq!(w.heard("p", "a", None), Heard::InConflict { notify: false });
        assert_eq!(w.conflict("p").unwrap().len(), 2);
        // Another provider is untouched.
        assert_eq!(w.heard("q", "x", None), Heard::Alone);
    }

    #[tokio::test]
    async fn the_conflict_ends_once_one_instance_was_alone_long_enough() {
        let w = watch();
        for boot in ["a", "b", "a", "b"] {
            w.heard("p", boot, None);
        }
        assert!(w.conflict("p").is_some());
        assert!(w.settle().is_empty(), "both heard just now");
        tokio::time::sleep(Duration::from_millis(120)).await;
        w.heard("p", "a", None);
        tokio::time::sleep(Duration::from_millis(120)).await;
        w.heard("p", "a", None);
        let ended = w.settle();
        assert_eq!(ended.len(), 1, "{ended:?}");
        assert_eq!(ended[0].1.boot_id, "a");
        assert!(w.conflict("p").is_none());
        assert_eq!(w.heard("p", "a", None), Heard::Alone);
    }
}
