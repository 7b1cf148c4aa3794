//! `sim` backend: an in-process relay board. Each switch takes the relay's
//! operate time (`operate_ms`), and its state reads back. A channel listed
//! in `power_rails` connects a `rail_volts` supply to that simulated rail
//! while closed, so a `sim` serial console on the rail boots when the relay
//! switches on (see [`crate::drivers::serial::sim`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::{Channels, RelayBoard};
use crate::drivers::serial::sim::{power_rail, PowerRail};
use crate::drivers::transport::{bad_setting, Transcript};
use crate::drivers::{Defaults, DriverConfigError, DriverError, DriverHealth, DriverSpec};

/// Bench TOML settings of `backend = "sim"` for a relay.
///
/// ```toml
/// channels = 4          # 1..=32
/// channel = 1           # default channel for actions
/// operate_ms = 10       # 0..=1000, switching time
/// rail_volts = 5.0      # voltage a closed channel puts on its rail
/// [capabilities.driver.power_rails]
/// 1 = "dut-main"        # channel -> rail name
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimRelaySettings {
    pub channels: u8,
    pub channel: u8,
    pub operate_ms: u64,
    pub power_rails: HashMap<String, String>,
    pub rail_volts: f64,
}

impl Default for SimRelaySettings {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            channels: 0,
            channel: 1,
            operate_ms: 10,
            power_rails: HashMap::new(),
            rail_volts: 5.0,
        }
    }
}

impl Defaults for SimRelaySettings {
    const REQUIRED: &'static [&'static str] = &["channels"];
}

/// The simulated board.
pub struct SimRelay {
    relays: Vec<bool>,
    operate: Duration,
    rails: HashMap<u8, Arc<PowerRail>>,
    rail_volts: f64,
    transcript: Transcript,
}

impl SimRelay {
    /// Parses and checks the settings.
    pub fn from_spec(spec: &DriverSpec) -> Result<(Self, Channels), DriverConfigError> {
        let s: SimRelaySettings = spec.parse()?;
        let allowed: Vec<u8> = (1..=32).collect();
        let channels = Channels::checked(spec, s.channels, s.channel, &allowed)?;
        if s.operate_ms > 1000 {
            return Err(bad_setting(
                spec,
                "operate_ms",
                format!("{} is outside 0..=1000", s.operate_ms),
            ));
        }
        if !(s.rail_volts.is_finite() && s.rail_volts > 0.0) {
            return Err(bad_setting(
                spec,
                "rail_volts",
                "must be a positive number of volts",
            ));
        }
        let mut rails = HashMap::new();
        for (ch, rail) in &s.power_rails {
            let n = ch
                .parse::<u8>()
                .ok()
                .filter(|n| (1..=s.channels).contains(n))
                .ok_or_else(|| {
                    bad_setting(
                        spec,
                        "power_rails",
                        format!("`{ch}` is not a channel in 1..={}", s.channels),
                    )
                })?;
            rails.insert(n, power_rail(rail));
        }
        Ok((
            SimRelay {
                relays: vec![false; usize::from(s.channels)],
                operate: Duration::from_millis(s.operate_ms),
                rails,
                rail_volts: s.rail_volts,
                transcript: Transcript::new(),
            },
            channels,
        ))
    }
}

impl RelayBoard for SimRelay {
    fn port_name(&self) -> String {
        "sim://relay".into()
    }

    fn set(&mut self, channel: u8, on: bool) -> Result<(), DriverError> {
        let slot = self
            .relays
            .get_mut(usize::from(channel).wrapping_sub(1))
            .ok_or_else(|| {
                DriverError::Device(format!("simulated board has no relay {channel}"))
            })?;
        self.transcript
            .tx(format!("relay {} {channel}", if on { "on" } else { "off" }));
        std::thread::sleep(self.operate);
        *slot = on;
        if let Some(rail) = self.rails.get(&channel) {
            rail.set_volts(if on { self.rail_volts } else { 0.0 });
        }
        Ok(())
    }

    fn get(&mut self, channel: u8) -> Result<Option<bool>, DriverError> {
        Ok(self
            .relays
            .get(usize::from(channel).wrapping_sub(1))
            .copied())
    }

    fn health(&mut self) -> DriverHealth {
        DriverHealth::healthy()
    }

    fn transcript(&mut self) -> &mut Transcript {
        &mut self.transcript
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// What a table with only its required keys means; the expected text
    /// was taken from the code before the defaults moved into `Default`.
    #[test]
    fn a_minimal_table_takes_the_documented_defaults() {
        crate::drivers::defaults_pin::check::<SimRelaySettings>(
            serde_json::json!({"channels": 2}),
            "SimRelaySettings { channels: 2, channel: 1, operate_ms: 10, power_rails: {}, rail_volts: 5.0 }",
        );
    }
}
