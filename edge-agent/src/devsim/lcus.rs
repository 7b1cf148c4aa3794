//! LCUS-type USB relay board (CH340 USB-serial, 1, 2, 4 or 8 relays).
//!
//! Wire format, 9600 8N1, binary frames of 4 bytes:
//!
//! ```text
//!   A0  <channel 01..n>  <op 00 = off, 01 = on>  <checksum = (A0 + channel + op) & FF>
//!   A0 01 01 A2   relay 1 on
//!   A0 01 00 A1   relay 1 off
//!   A0 02 01 A3   relay 2 on
//! ```
//!
//! The board never answers a switch frame. A frame with a wrong checksum,
//! a channel outside `1..=n` or an unknown op is ignored silently, and so
//! is a frame that stays incomplete for [`LcusConfig::frame_timeout`].
//! A stray byte that is not `A0` is skipped (the board resynchronises on
//! the next `A0`).
//!
//! Status query (boards with 2 or more relays): send the single byte `FF`;
//! the board answers one line per relay, e.g. `CH1:OFF\r\nCH2:ON\r\n`.
//! Single-relay boards do not answer it.
//!
//! The board is USB-powered: when it vanishes
//! ([`super::Simulator::vanish`]) every relay drops to off.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{lock, DevSimError, Device, PowerSense, Simulator};

/// First byte of every switch frame.
pub const FRAME_START: u8 = 0xA0;
/// The status query byte.
pub const STATUS_QUERY: u8 = 0xFF;

/// Builds the 4-byte frame that switches `channel` (1-based) on or off.
pub fn frame(channel: u8, on: bool) -> [u8; 4] {
    let op = u8::from(on);
    [
        FRAME_START,
        channel,
        op,
        FRAME_START.wrapping_add(channel).wrapping_add(op),
    ]
}

/// Settings of a simulated LCUS board.
#[derive(Debug, Clone)]
pub struct LcusConfig {
    /// Number of relays: 1, 2, 4 or 8.
    pub channels: u8,
    /// An incomplete frame older than this is discarded (default 100 ms).
    pub frame_timeout: Duration,
}

impl Default for LcusConfig {
    fn default() -> Self {
        LcusConfig {
            channels: 4,
            frame_timeout: Duration::from_millis(100),
        }
    }
}

/// One accepted switch command.
#[derive(Debug, Clone, PartialEq)]
pub struct RelaySwitch {
    /// When the frame was complete.
    pub at: Instant,
    /// Relay number, 1-based as on the wire.
    pub channel: u8,
    /// Commanded state.
    pub on: bool,
    /// False when the relay already was in that state.
    pub changed: bool,
}

/// Snapshot of a simulated LCUS board.
#[derive(Debug, Clone, PartialEq)]
pub struct LcusState {
    /// Relay states, index 0 = channel 1.
    pub relays: Vec<bool>,
    /// Every accepted switch frame, oldest first.
    pub switches: Vec<RelaySwitch>,
    /// Frames dropped for bad checksum, channel, op or timeout, as raw bytes.
    pub ignored_frames: Vec<Vec<u8>>,
    /// Status queries (`FF`) answered.
    pub status_queries: u32,
}

impl LcusState {
    /// How long `channel` (1-based) was on in its most recent completed
    /// on→off pulse, from the switch log.
    pub fn last_pulse(&self, channel: u8) -> Option<Duration> {
        let changes: Vec<&RelaySwitch> = self
            .switches
            .iter()
            .filter(|s| s.channel == channel && s.changed)
            .collect();
        let off = changes.iter().rposition(|s| !s.on)?;
        let on = changes[..off].iter().rposition(|s| s.on)?;
        Some(changes[off].at.duration_since(changes[on].at))
    }
}

/// Shared view of a running LCUS simulator.
#[derive(Debug, Clone)]
pub struct LcusHandle {
    state: Arc<Mutex<LcusState>>,
}

impl LcusHandle {
    /// A copy of the current state.
    pub fn snapshot(&self) -> LcusState {
        lock(&self.state).clone()
    }

    /// Whether relay `channel` (1-based) is on; false when out of range.
    pub fn relay(&self, channel: u8) -> bool {
        lock(&self.state)
            .relays
            .get(usize::from(channel).wrapping_sub(1))
            .copied()
            .unwrap_or(false)
    }

    /// A [`PowerSense`] giving `volts` while relay `channel` (1-based) is
    /// closed and 0 V otherwise, to power a simulated DUT through the relay.
    pub fn power_sense(&self, channel: u8, volts: f64) -> PowerSense {
        let handle = self.clone();
        Arc::new(move || if handle.relay(channel) { volts } else { 0.0 })
    }
}

/// A running LCUS simulator.
pub type LcusSim = Simulator<LcusHandle>;

impl Simulator<LcusHandle> {
    /// Starts an LCUS board (all relays off) on a new pty.
    ///
    /// Errors: [`DevSimError::Config`] (`channels`) unless 1, 2, 4 or 8;
    /// otherwise see [`Simulator::spawn`].
    pub fn start(
        config: LcusConfig,
        link: Option<&std::path::Path>,
    ) -> Result<LcusSim, DevSimError> {
        if ![1, 2, 4, 8].contains(&config.channels) {
            return Err(DevSimError::Config {
                field: "channels",
                reason: format!(
                    "LCUS boards have 1, 2, 4 or 8 relays, not {}",
                    config.channels
                ),
            });
        }
        let state = Arc::new(Mutex::new(LcusState {
            relays: vec![false; usize::from(config.channels)],
            switches: Vec::new(),
            ignored_frames: Vec::new(),
            status_queries: 0,
        }));
        let device = Lcus {
            config,
            state: state.clone(),
            pending: Vec::new(),
            pending_since: None,
            reply: Vec::new(),
        };
        Simulator::spawn("lcus", device, LcusHandle { state }, link)
    }
}

struct Lcus {
    config: LcusConfig,
    state: Arc<Mutex<LcusState>>,
    pending: Vec<u8>,
    pending_since: Option<Instant>,
    reply: Vec<u8>,
}

impl Device for Lcus {
    fn receive(&mut self, bytes: &[u8], now: Instant) {
        for &b in bytes {
            if self.pending.is_empty() {
                match b {
                    FRAME_START => {
                        self.pending.push(b);
                        self.pending_since = Some(now);
                    }
                    STATUS_QUERY => self.status(),
                    _ => {}
                }
                continue;
            }
            self.pending.push(b);
            if self.pending.len() == 4 {
                let frame = std::mem::take(&mut self.pending);
                self.switch(&frame, now);
            }
        }
    }

    fn poll(&mut self, now: Instant, out: &mut Vec<u8>) -> Option<Instant> {
        out.append(&mut self.reply);
        let since = self.pending_since.filter(|_| !self.pending.is_empty())?;
        let expires = since + self.config.frame_timeout;
        if now >= expires {
            let partial = std::mem::take(&mut self.pending);
            lock(&self.state).ignored_frames.push(partial);
            return None;
        }
        Some(expires)
    }

    fn unplugged(&mut self, _now: Instant) {
        // USB-powered: the coils drop when the cable is pulled.
        let mut st = lock(&self.state);
        st.relays.iter_mut().for_each(|r| *r = false);
        self.pending.clear();
    }
}

impl Lcus {
    fn switch(&mut self, frame: &[u8], now: Instant) {
        let mut st = lock(&self.state);
        let [start, channel, op, sum] = [frame[0], frame[1], frame[2], frame[3]];
        let valid_sum = start.wrapping_add(channel).wrapping_add(op) == sum;
        let index = usize::from(channel).wrapping_sub(1);
        if !valid_sum || op > 1 || index >= st.relays.len() {
            st.ignored_frames.push(frame.to_vec());
            return;
        }
        let on = op == 1;
        let changed = st.relays[index] != on;
        st.relays[index] = on;
        st.switches.push(RelaySwitch {
            at: now,
            channel,
            on,
            changed,
        });
    }

    fn status(&mut self) {
        let mut st = lock(&self.state);
        if st.relays.len() < 2 {
            return;
        }
        st.status_queries += 1;
        for (i, on) in st.relays.iter().enumerate() {
            let line = format!("CH{}:{}\r\n", i + 1, if *on { "ON" } else { "OFF" });
            self.reply.extend_from_slice(line.as_bytes());
        }
    }
}
