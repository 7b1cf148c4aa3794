//! Relay driver (docs/actions.md, "relay"): `switch_on`, `switch_off`, `pulse`.
//!
//! Backends, each one small file behind [`RelayBoard`]:
//! - `lcus` ([`lcus`]): LCUS-type USB relay boards, 4-byte hex frames
//!   `A0 <ch> <op> <sum>`, state read back with the `FF` status query on
//!   boards with two or more relays;
//! - `numato` ([`numato`]): Numato Lab-type USB relay modules, ASCII
//!   `relay on N\r`, read back with `relay read N`;
//! - `sim` ([`sim`]): an in-process board with a switching time that can
//!   drive simulated power rails.
//!
//! Channels are numbered `1..=channels` for every backend (on a Numato
//! module channel 1 is its relay `0`). An action's `channel` parameter
//! defaults to the section's `channel` setting.
//!
//! A `pulse` is non-interruptible (docs/actions.md): once the relay has switched,
//! it switches back after `duration_ms` whatever happens to the lease.
//! Every action returns a `sensor_dump` artifact with the switching
//! timeline (when each switch was commanded and confirmed) and the command
//! transcript.

pub mod lcus;
pub mod numato;
pub mod sim;

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Map, Value};
use shared_protocol::capability::{CapabilityAction, CapabilityType};

use super::transport::{bad_setting, now_rfc3339, sensor_dump, sleep_until, Transcript};
use super::{
    parse_params, parse_params_with_defaults, unsupported, ActionOutcome, ActionRequest, Defaults,
    Driver, DriverConfigError, DriverError, DriverHealth, DriverSpec,
};

/// Longest an action waits for the board's port to (re)open.
pub(crate) const OPEN_WAIT: Duration = Duration::from_secs(2);

/// Allowed `pulse` `duration_ms`.
pub const PULSE_RANGE_MS: std::ops::RangeInclusive<u64> = 10..=60_000;

/// A relay board, as a vendor backend drives it. Channels are 1-based.
pub trait RelayBoard: Send {
    /// Where it is attached, e.g. `/dev/serial/by-id/...`.
    fn port_name(&self) -> String;
    /// Switches `channel` on or off; returns once the board took it (and,
    /// where the board can tell, confirmed it).
    fn set(&mut self, channel: u8, on: bool) -> Result<(), DriverError>;
    /// Reads a channel's state back; `None` when the board cannot report it.
    fn get(&mut self, channel: u8) -> Result<Option<bool>, DriverError>;
    /// The port is present and open (and the board answers, where it can).
    fn health(&mut self) -> DriverHealth;
    /// The commands sent and replies received (restarted per action).
    fn transcript(&mut self) -> &mut Transcript;
}

/// Settings every relay backend shares: `channels` and the default `channel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Channels {
    /// Relays on the board.
    pub count: u8,
    /// The channel actions use when they name none.
    pub default: u8,
}

impl Channels {
    /// Checks `default` is within `1..=count` and `count` is one of `allowed`.
    pub fn checked(
        spec: &DriverSpec,
        count: u8,
        default: u8,
        allowed: &[u8],
    ) -> Result<Channels, DriverConfigError> {
        if !allowed.contains(&count) {
            return Err(bad_setting(
                spec,
                "channels",
                format!("{count} is not one of {allowed:?}"),
            ));
        }
        if !(1..=count).contains(&default) {
            return Err(bad_setting(
                spec,
                "channel",
                format!("{default} is outside 1..={count}"),
            ));
        }
        Ok(Channels { count, default })
    }
}

/// Checks a `settle_ms` setting (0..=1000).
pub(crate) fn check_settle(
    spec: &DriverSpec,
    settle_ms: u64,
) -> Result<Duration, DriverConfigError> {
    if settle_ms > 1000 {
        return Err(bad_setting(
            spec,
            "settle_ms",
            format!("{settle_ms} is outside 0..=1000"),
        ));
    }
    Ok(Duration::from_millis(settle_ms))
}

/// Build a relay driver from its bench TOML section: `backend = "lcus"`
/// ([`lcus::LcusSettings`]), `"numato"` ([`numato::NumatoSettings`]) or
/// `"sim"` ([`sim::SimRelaySettings`]).
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    let (board, channels): (Box<dyn RelayBoard>, Channels) = match spec.backend.as_str() {
        "lcus" => {
            let (b, c) = lcus::Lcus::from_spec(spec)?;
            (Box::new(b), c)
        }
        "numato" => {
            let (b, c) = numato::Numato::from_spec(spec)?;
            (Box::new(b), c)
        }
        "sim" => {
            let (b, c) = sim::SimRelay::from_spec(spec)?;
            (Box::new(b), c)
        }
        _ => return Err(spec.unknown_backend(&["lcus", "numato", "sim"])),
    };
    Ok(Box::new(RelayDriver {
        capability_id: spec.capability_id.clone(),
        backend: spec.backend.clone(),
        board,
        channels,
    }))
}

/// The relay capability over any [`RelayBoard`].
pub struct RelayDriver {
    capability_id: String,
    backend: String,
    board: Box<dyn RelayBoard>,
    channels: Channels,
}

/// `switch_on` / `switch_off` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SwitchParams {
    /// 1..=channels; default: the `channel` setting.
    channel: Option<u8>,
}

/// Which level a pulse drives the relay to (it returns to the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Level {
    On,
    Off,
}

/// `pulse` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct PulseParams {
    channel: Option<u8>,
    /// 10..=60000.
    duration_ms: u64,
    /// `on` (default: on, wait, off) or `off` (off, wait, on: a power cycle
    /// through a normally-on relay).
    level: Level,
}

impl Default for PulseParams {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            channel: None,
            duration_ms: 0,
            level: Level::On,
        }
    }
}

impl Defaults for PulseParams {
    const REQUIRED: &'static [&'static str] = &["duration_ms"];
}

/// One switching instant for the evidence timeline.
struct Switch {
    channel: u8,
    on: bool,
    commanded_ms: f64,
    confirmed_ms: f64,
}

impl RelayDriver {
    fn channel(&self, requested: Option<u8>) -> Result<u8, DriverError> {
        let ch = requested.unwrap_or(self.channels.default);
        if !(1..=self.channels.count).contains(&ch) {
            return Err(DriverError::InvalidParams {
                field: "channel".into(),
                message: format!("{ch} is outside 1..={}", self.channels.count),
            });
        }
        Ok(ch)
    }

    fn switch(
        &mut self,
        channel: u8,
        on: bool,
        timeline: &mut Vec<Switch>,
    ) -> Result<(), DriverError> {
        let commanded_ms = self.board.transcript().ms(Instant::now());
        self.board.set(channel, on)?;
        let confirmed_ms = self.board.transcript().ms(Instant::now());
        timeline.push(Switch {
            channel,
            on,
            commanded_ms,
            confirmed_ms,
        });
        Ok(())
    }

    fn outcome(
        &mut self,
        action: CapabilityAction,
        started_at: &str,
        timeline: &[Switch],
        summary: Value,
    ) -> ActionOutcome {
        let transcript = self.board.transcript().entries().to_vec();
        let events: Vec<Value> = timeline
            .iter()
            .map(|s| {
                json!({
                    "channel": s.channel,
                    "state": if s.on { "on" } else { "off" },
                    "commanded_ms": s.commanded_ms,
                    "confirmed_ms": s.confirmed_ms,
                })
            })
            .collect();
        let body = json!({
            "capability_id": self.capability_id,
            "capability_type": CapabilityType::Relay,
            "backend": self.backend,
            "port_name": self.board.port_name(),
            "action": action,
            "started_at": started_at,
            "timeline": events,
            "transcript": transcript,
        });
        let mut meta = Map::new();
        meta.insert("action".into(), json!(action));
        meta.insert("backend".into(), json!(self.backend));
        ActionOutcome {
            result_summary: match summary {
                Value::Object(m) => m,
                _ => Map::new(),
            },
            artifacts: vec![sensor_dump(&body, meta)],
        }
    }

    fn switch_action(
        &mut self,
        req: &ActionRequest,
        on: bool,
    ) -> Result<ActionOutcome, DriverError> {
        let p: SwitchParams = parse_params(&req.params)?;
        let channel = self.channel(p.channel)?;
        if req.cancel.is_cancelled() {
            return Err(DriverError::Cancelled("cancelled before switching".into()));
        }
        let started_at = now_rfc3339();
        self.board.transcript().restart();
        let mut timeline = Vec::new();
        self.switch(channel, on, &mut timeline)?;
        let verified = self.board.get(channel)?;
        if verified.is_some_and(|state| state != on) {
            return Err(DriverError::Device(format!(
                "relay {channel} on {} reads back {} after switching it {}",
                self.board.port_name(),
                if on { "off" } else { "on" },
                if on { "on" } else { "off" },
            )));
        }
        let summary = json!({
            "channel": channel,
            "state": if on { "on" } else { "off" },
            "verified": verified.is_some(),
        });
        Ok(self.outcome(req.action, &started_at, &timeline, summary))
    }

    fn pulse(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        let p: PulseParams = parse_params_with_defaults(&req.params)?;
        let channel = self.channel(p.channel)?;
        if !PULSE_RANGE_MS.contains(&p.duration_ms) {
            return Err(DriverError::InvalidParams {
                field: "duration_ms".into(),
                message: format!("{} is outside 10..=60000", p.duration_ms),
            });
        }
        let left = req.deadline.saturating_duration_since(Instant::now());
        if Duration::from_millis(p.duration_ms) >= left {
            return Err(DriverError::InvalidParams {
                field: "duration_ms".into(),
                message: format!(
                    "{} ms does not fit in the {} ms left before the action deadline",
                    p.duration_ms,
                    left.as_millis()
                ),
            });
        }
        if req.cancel.is_cancelled() {
            return Err(DriverError::Cancelled(
                "cancelled before the pulse started".into(),
            ));
        }
        let level = p.level == Level::On;
        let started_at = now_rfc3339();
        self.board.transcript().restart();
        let mut timeline = Vec::new();
        // Non-interruptible from here: the cancel token is not
        // consulted until the relay is back.
        self.switch(channel, level, &mut timeline)?;
        let switched = Instant::now();
        sleep_until(switched + Duration::from_millis(p.duration_ms));
        if let Err(e) = self.switch(channel, !level, &mut timeline) {
            return Err(DriverError::Device(format!(
                "relay {channel} left {} after a pulse: {e}",
                if level { "ON" } else { "OFF" }
            )));
        }
        // Whole milliseconds, like every `*_ms` of a result summary (the
        // timeline in the evidence keeps the fractions).
        let actual = timeline.get(1).zip(timeline.first()).map_or(0, |(b, a)| {
            (b.confirmed_ms - a.confirmed_ms).max(0.0).round() as u64
        });
        let summary = json!({
            "channel": channel,
            "level": if level { "on" } else { "off" },
            "duration_ms": p.duration_ms,
            "actual_duration_ms": actual,
            "state": if level { "off" } else { "on" },
        });
        Ok(self.outcome(req.action, &started_at, &timeline, summary))
    }
}

impl Driver for RelayDriver {
    fn capability_type(&self) -> CapabilityType {
        CapabilityType::Relay
    }

    fn metadata(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("backend".into(), json!(self.backend));
        m.insert("port_name".into(), json!(self.board.port_name()));
        m.insert("channels".into(), json!(self.channels.count));
        m.insert("default_channel".into(), json!(self.channels.default));
        m
    }

    fn health(&mut self) -> DriverHealth {
        self.board.health()
    }

    fn execute(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        tracing::debug!(capability_id = %self.capability_id, action = %req.action, "relay action");
        match req.action {
            CapabilityAction::SwitchOn => self.switch_action(req, true),
            CapabilityAction::SwitchOff => self.switch_action(req, false),
            CapabilityAction::Pulse => self.pulse(req),
            other => Err(unsupported(
                CapabilityType::Relay,
                other,
                "not a relay action",
            )),
        }
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// What a table with only its required keys means; the expected text
    /// was taken from the code before the defaults moved into `Default`.
    #[test]
    fn a_minimal_table_takes_the_documented_defaults() {
        crate::drivers::defaults_pin::check::<PulseParams>(
            serde_json::json!({"duration_ms": 100}),
            "PulseParams { channel: None, duration_ms: 100, level: On }",
        );
    }
}
