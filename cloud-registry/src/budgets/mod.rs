//! Lab limits on how hard a caller may drive the bench (docs/policy.md
//! "Action budgets", "Rate limit"):
//! - [`ActionBudgets`]: actuator actions (relay switching, PSU output
//!   switching, robot presses) per lease and per principal in a sliding
//!   window, checked by `Sessions::invoke` before anything is sent;
//! - [`rate_limit`]: HTTP requests per principal (GCRA, the `governor`
//!   crate), an axum middleware.
//!
//! Both answer 429 with `Retry-After` (seconds) and
//! `details.retry_after_seconds`.

pub mod rate_limit;

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shared_protocol::capability::{CapabilityAction, CapabilityType};

pub use rate_limit::{RateLimitConfig, RateLimiter};

/// One capability type's budget: most actuator actions per window, under
/// one lease and by one principal over all its leases. `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ActuatorBudget {
    /// Most actuator actions under one lease per window (at least 1).
    pub per_lease: Option<u32>,
    /// Most actuator actions by one principal, all its leases together,
    /// per window (at least 1).
    pub per_principal: Option<u32>,
}

/// The `[policy.budgets]` table: per capability type, how many actuator
/// actions ([`counted`]) a lease and a principal may run in any
/// `window_seconds`. Empty (the default): no budgets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetsConfig {
    /// Length of the sliding window, seconds (60). At least 1.
    pub window_seconds: u32,
    /// `switch_on`, `switch_off`, `pulse`.
    pub relay: ActuatorBudget,
    /// `power_on`, `power_off`.
    pub programmable_power_supply: ActuatorBudget,
    /// `tap`, `double_tap`, `long_press`, `drag`, `type_keys`,
    /// `press_hardware_button`.
    pub thumb_robot: ActuatorBudget,
}

impl Default for BudgetsConfig {
    fn default() -> Self {
        Self {
            window_seconds: 60,
            relay: ActuatorBudget::default(),
            programmable_power_supply: ActuatorBudget::default(),
            thumb_robot: ActuatorBudget::default(),
        }
    }
}

impl BudgetsConfig {
    /// The budget of capability type `t`, if it has one.
    pub fn of(&self, t: CapabilityType) -> Option<ActuatorBudget> {
        match t {
            CapabilityType::Relay => Some(self.relay),
            CapabilityType::ProgrammablePowerSupply => Some(self.programmable_power_supply),
            CapabilityType::ThumbRobot => Some(self.thumb_robot),
            _ => None,
        }
    }

    /// Problems of the table, as `(dotted key, message)`.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.window_seconds == 0 {
            out.push((
                "policy.budgets.window_seconds".to_string(),
                "must be at least 1".to_string(),
            ));
        }
        for (name, b) in [
            ("relay", self.relay),
            ("programmable_power_supply", self.programmable_power_supply),
            ("thumb_robot", self.thumb_robot),
        ] {
            for (field, v) in [
                ("per_lease", b.per_lease),
                ("per_principal", b.per_principal),
            ] {
                if v == Some(0) {
                    out.push((
                        format!("policy.budgets.{name}.{field}"),
                        "must be at least 1 (leave it out for no limit)".to_string(),
                    ));
                }
            }
        }
        out
    }
}

/// Whether `action` counts against its type's budget: the actions that
/// move or switch something on the bench.
pub fn counted(action: CapabilityAction) -> bool {
    use CapabilityAction::*;
    matches!(
        action,
        SwitchOn
            | SwitchOff
            | Pulse
            | PowerOn
            | PowerOff
            | Tap
            | DoubleTap
            | LongPress
            | Drag
            | TypeKeys
            | PressHardwareButton
    )
}

/// An action refused by a budget: nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{action} on a {capability_type} is over the budget `{budget}`: {limit} actions per {window_seconds} s; nothing was sent; retry in {retry_after_seconds} s")]
pub struct BudgetExceeded {
    /// The budget's dotted name, e.g. `relay.per_lease`.
    pub budget: String,
    pub capability_type: CapabilityType,
    pub action: CapabilityAction,
    /// Actions allowed per window.
    pub limit: u32,
    pub window_seconds: u32,
    /// Whole seconds until one more action fits (at least 1).
    pub retry_after_seconds: u64,
}

/// The instants of actions counted against one key, oldest first.
type Window = VecDeque<Instant>;

/// Which counter a key belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Lease(String),
    Principal(CapabilityType, String),
}

/// How many checks between sweeps of windows that went quiet.
const SWEEP_EVERY: u32 = 1024;

/// Sliding-window counters of actuator actions per lease and per
/// principal. A check counts the action against both counters or
/// neither, so a refusal by one budget spends nothing of the other.
pub struct ActionBudgets {
    cfg: BudgetsConfig,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    windows: HashMap<Key, Window>,
    checks: u32,
}

/// An action counted by [`ActionBudgets::spend`]; give it back with
/// [`ActionBudgets::refund`] when the action is not sent after all.
#[derive(Debug)]
#[must_use]
pub struct Spent {
    keys: Vec<Key>,
    at: Instant,
}

impl ActionBudgets {
    /// Counters for `cfg`.
    pub fn new(cfg: BudgetsConfig) -> Self {
        Self {
            cfg,
            state: Mutex::new(State::default()),
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &BudgetsConfig {
        &self.cfg
    }

    /// Count `action` on a capability of type `t` under `lease_id` by
    /// `principal`, now. Actions that are not [`counted`], and types
    /// without a budget, pass and count nothing (`Ok(None)`).
    ///
    /// Errors: [`BudgetExceeded`] naming the first budget (the lease's,
    /// then the principal's) with no room; nothing is counted then.
    pub fn spend(
        &self,
        t: CapabilityType,
        action: CapabilityAction,
        lease_id: &str,
        principal: &str,
    ) -> Result<Option<Spent>, BudgetExceeded> {
        self.spend_at(t, action, lease_id, principal, Instant::now())
    }

    fn spend_at(
        &self,
        t: CapabilityType,
        action: CapabilityAction,
        lease_id: &str,
        principal: &str,
        now: Instant,
    ) -> Result<Option<Spent>, BudgetExceeded> {
        let Some(budget) = self.cfg.of(t).filter(|_| counted(action)) else {
            return Ok(None);
        };
        let window = Duration::from_secs(u64::from(self.cfg.window_seconds.max(1)));
        let limits = [
            (
                budget.per_lease,
                Key::Lease(lease_id.to_string()),
                "per_lease",
            ),
            (
                budget.per_principal,
                Key::Principal(t, principal.to_string()),
                "per_principal",
            ),
        ];
        let mut state = crate::leases::lock(&self.state);
        state.checks = state.checks.wrapping_add(1);
        if state.checks.is_multiple_of(SWEEP_EVERY) {
            state.windows.retain(|_, w| {
                w.back()
                    .is_some_and(|last| now.saturating_duration_since(*last) < window)
            });
        }
        let mut keys = Vec::new();
        for (limit, key, name) in limits {
            let Some(limit) = limit else { continue };
            let w = state.windows.entry(key.clone()).or_default();
            while w
                .front()
                .is_some_and(|t0| now.saturating_duration_since(*t0) >= window)
            {
                w.pop_front();
            }
            if w.len() >= limit as usize {
                // Room comes back when the oldest counted action leaves the
                // window: the `len - limit + 1`-th oldest, here the first.
                let oldest = w.front().copied().unwrap_or(now);
                let wait = (oldest + window).saturating_duration_since(now);
                let retry = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                return Err(BudgetExceeded {
                    budget: format!("{}.{name}", t.as_str()),
                    capability_type: t,
                    action,
                    limit,
                    window_seconds: self.cfg.window_seconds,
                    retry_after_seconds: retry.max(1),
                });
            }
            keys.push(key);
        }
        if keys.is_empty() {
            return Ok(None);
        }
        for key in &keys {
            state.windows.entry(key.clone()).or_default().push_back(now);
        }
        Ok(Some(Spent { keys, at: now }))
    }

    /// Give back an action counted by [`ActionBudgets::spend`] that was
    /// not sent (a later check refused it).
    pub fn refund(&self, spent: Spent) {
        let mut state = crate::leases::lock(&self.state);
        for key in spent.keys {
            if let Some(w) = state.windows.get_mut(&key) {
                if let Some(i) = w.iter().rposition(|t| *t == spent.at) {
                    w.remove(i);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CapabilityAction::*;
    use CapabilityType::*;

    fn budgets(per_lease: Option<u32>, per_principal: Option<u32>) -> ActionBudgets {
        ActionBudgets::new(BudgetsConfig {
            window_seconds: 60,
            relay: ActuatorBudget {
                per_lease,
                per_principal,
            },
            ..Default::default()
        })
    }

    #[test]
    fn a_lease_over_its_budget_is_refused_until_the_oldest_action_leaves_the_window() {
        let b = budgets(Some(2), None);
        let t0 = Instant::now();
        assert!(b
            .spend_at(Relay, SwitchOn, "l1", "a", t0)
            .unwrap()
            .is_some());
        let t1 = t0 + Duration::from_secs(10);
        assert!(b.spend_at(Relay, SwitchOff, "l1", "a", t1).is_ok());
        let e = b
            .spend_at(Relay, Pulse, "l1", "a", t0 + Duration::from_millis(20_500))
            .unwrap_err();
        assert_eq!(e.budget, "relay.per_lease");
        assert_eq!(e.limit, 2);
        // The first action leaves the window at t0 + 60 s: 39.5 s, rounded up.
        assert_eq!(e.retry_after_seconds, 40);
        // Another lease of the same principal has its own budget.
        assert!(b.spend_at(Relay, SwitchOn, "l2", "a", t1).is_ok());
        assert!(b
            .spend_at(Relay, SwitchOn, "l1", "a", t0 + Duration::from_secs(60))
            .is_ok());
    }

    #[test]
    fn the_principal_budget_spans_its_leases_and_a_refusal_spends_nothing() {
        let b = budgets(Some(2), Some(3));
        let t = Instant::now();
        for lease in ["l1", "l1", "l2"] {
            b.spend_at(Relay, SwitchOn, lease, "a", t).unwrap();
        }
        let e = b.spend_at(Relay, SwitchOn, "l2", "a", t).unwrap_err();
        assert_eq!(e.budget, "relay.per_principal");
        // The refusal did not count against l2: another principal's l2
        // action (its own principal budget) still fits l2's lease budget.
        assert!(b.spend_at(Relay, SwitchOn, "l2", "b", t).is_ok());
        assert_eq!(
            b.spend_at(Relay, SwitchOn, "l2", "b", t)
                .unwrap_err()
                .budget,
            "relay.per_lease"
        );
    }

    #[test]
    fn reads_and_types_without_a_budget_are_not_counted() {
        let b = budgets(Some(1), Some(1));
        let t = Instant::now();
        assert!(b
            .spend_at(ProgrammablePowerSupply, PowerOn, "l1", "a", t)
            .unwrap()
            .is_none());
        assert!(b
            .spend_at(Camera, Snapshot, "l1", "a", t)
            .unwrap()
            .is_none());
        b.spend_at(Relay, SwitchOn, "l1", "a", t).unwrap();
        assert!(b.spend_at(Relay, SwitchOn, "l1", "a", t).is_err());
    }

    #[test]
    fn a_refunded_action_frees_its_room() {
        let b = budgets(Some(1), None);
        let t = Instant::now();
        let spent = b.spend_at(Relay, SwitchOn, "l1", "a", t).unwrap().unwrap();
        b.refund(spent);
        assert!(b.spend_at(Relay, SwitchOn, "l1", "a", t).is_ok());
    }

    #[test]
    fn zero_limits_and_windows_are_reported() {
        let cfg = BudgetsConfig {
            window_seconds: 0,
            thumb_robot: ActuatorBudget {
                per_lease: Some(0),
                per_principal: None,
            },
            ..Default::default()
        };
        let keys: Vec<String> = cfg.problems().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "policy.budgets.window_seconds",
                "policy.budgets.thumb_robot.per_lease"
            ]
        );
    }
}
