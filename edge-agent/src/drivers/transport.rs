//! Byte links shared by the serial-family drivers (serial console, relay,
//! power supply, thumb robot): a serial port opened with exclusive access,
//! or a raw TCP socket (SCPI instruments on port 5555).
//!
//! A [`Link`] owns one background thread per device. The thread opens the
//! port, reads everything the device sends into a [`Capture`] (a rolling
//! byte log addressed by absolute offsets), and when the device goes away
//! (USB cable pulled: the read fails with a hangup) it marks the link lost
//! and tries to reopen the same path every [`REOPEN_INTERVAL`]. A device
//! that stays open but fails its driver's identity probe
//! [`IDENTITY_FAILURES_BEFORE_REOPEN`] times in a row is closed and its path
//! opened again too ([`Link::identity_failed`]): two adapters swapped and put
//! back leave the old descriptor on the wrong device. Nothing
//! spins: the thread blocks in `poll(2)` for up to [`READ_POLL`] while the
//! port is open and sleeps on a condition variable while it is not, so an
//! unplugged device costs a few wakeups a second.
//!
//! Because the thread reads all the time, output the device prints while
//! no action is waiting for it (a boot banner right after power-on, a GRBL
//! alarm) is kept; a driver reads it later from the offset it last
//! consumed. Drivers never read the port themselves: they write through
//! the link and wait on the capture ([`Capture::wait_for`]).
//!
//! Also here: the serial line settings every serial backend shares
//! ([`SerialLine`]), the command [`Transcript`] that goes into evidence,
//! and small helpers for `sensor_dump` artifacts.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use shared_protocol::artifact::ArtifactType;

use super::{CancelToken, DriverConfigError, DriverError, DriverHealth, DriverSpec, NewArtifact};

/// Longest the link thread blocks in one read; bounds how long dropping a
/// [`Link`] takes (the thread is joined).
pub const READ_POLL: Duration = Duration::from_millis(200);

/// Pause between attempts to (re)open a device that is absent or busy.
pub const REOPEN_INTERVAL: Duration = Duration::from_millis(250);

/// Identity probes in a row that may fail on one connection before the
/// link closes the port and opens its path again (see
/// [`Link::identity_failed`]).
pub const IDENTITY_FAILURES_BEFORE_REOPEN: u32 = 3;

/// How long to wait for a TCP connection to an instrument.
const TCP_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest a single write may block (flow control, full socket buffer).
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// Most entries a [`Transcript`] keeps; older ones are dropped.
const TRANSCRIPT_MAX: usize = 2_000;

/// Parity of a serial line (bench TOML `parity`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Parity {
    #[default]
    None,
    Odd,
    Even,
}

impl Parity {
    /// `none`, `odd` or `even`.
    pub fn as_str(self) -> &'static str {
        match self {
            Parity::None => "none",
            Parity::Odd => "odd",
            Parity::Even => "even",
        }
    }
}

/// Flow control of a serial line (bench TOML `flow_control`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlowControl {
    #[default]
    None,
    /// XON/XOFF.
    Software,
    /// RTS/CTS.
    Hardware,
}

impl FlowControl {
    /// `none`, `software` or `hardware`.
    pub fn as_str(self) -> &'static str {
        match self {
            FlowControl::None => "none",
            FlowControl::Software => "software",
            FlowControl::Hardware => "hardware",
        }
    }
}

/// How to open one serial port: path and line settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SerialLine {
    /// Device path; prefer a stable `/dev/serial/by-id/...` link, which
    /// survives re-plugging and reboots, over `/dev/ttyUSB0`.
    pub port: String,
    /// Bits per second, e.g. 9600, 115200.
    pub baud_rate: u32,
    /// 5, 6, 7 or 8.
    pub data_bits: u8,
    pub parity: Parity,
    /// 1 or 2.
    pub stop_bits: u8,
    pub flow_control: FlowControl,
}

impl SerialLine {
    /// 8 data bits, no parity, 1 stop bit, no flow control (8N1).
    pub fn new(port: impl Into<String>, baud_rate: u32) -> Self {
        Self {
            port: port.into(),
            baud_rate,
            data_bits: 8,
            parity: Parity::None,
            stop_bits: 1,
            flow_control: FlowControl::None,
        }
    }

    /// Checks the settings; the error names the bench TOML key.
    pub fn check(&self, spec: &DriverSpec) -> Result<(), DriverConfigError> {
        if self.port.trim().is_empty() {
            return Err(bad_setting(spec, "port", "must name a serial device path"));
        }
        if !(50..=4_000_000).contains(&self.baud_rate) {
            return Err(bad_setting(
                spec,
                "baud_rate",
                format!("{} is outside 50..=4000000", self.baud_rate),
            ));
        }
        if !(5..=8).contains(&self.data_bits) {
            return Err(bad_setting(
                spec,
                "data_bits",
                format!("{} is not 5, 6, 7 or 8", self.data_bits),
            ));
        }
        if !(1..=2).contains(&self.stop_bits) {
            return Err(bad_setting(
                spec,
                "stop_bits",
                format!("{} is not 1 or 2", self.stop_bits),
            ));
        }
        if self.port.starts_with("/dev/ttyUSB") || self.port.starts_with("/dev/ttyACM") {
            tracing::warn!(
                capability_id = %spec.capability_id,
                port = %self.port,
                "port name may change when devices are re-plugged; prefer /dev/serial/by-id/..."
            );
        }
        Ok(())
    }

    fn builder(&self) -> serialport::SerialPortBuilder {
        let data_bits = match self.data_bits {
            5 => serialport::DataBits::Five,
            6 => serialport::DataBits::Six,
            7 => serialport::DataBits::Seven,
            _ => serialport::DataBits::Eight,
        };
        let parity = match self.parity {
            Parity::None => serialport::Parity::None,
            Parity::Odd => serialport::Parity::Odd,
            Parity::Even => serialport::Parity::Even,
        };
        let stop_bits = match self.stop_bits {
            2 => serialport::StopBits::Two,
            _ => serialport::StopBits::One,
        };
        let flow = match self.flow_control {
            FlowControl::None => serialport::FlowControl::None,
            FlowControl::Software => serialport::FlowControl::Software,
            FlowControl::Hardware => serialport::FlowControl::Hardware,
        };
        serialport::new(&self.port, self.baud_rate)
            .data_bits(data_bits)
            .parity(parity)
            .stop_bits(stop_bits)
            .flow_control(flow)
            .timeout(READ_POLL)
            // TIOCEXCL plus an exclusive flock: a second opener is refused
            // while this driver holds the port.
            .exclusive(true)
    }
}

/// Where a [`Link`] connects.
#[derive(Debug, Clone, PartialEq)]
pub enum Endpoint {
    /// A serial port (USB-serial adapter, CDC device, pty).
    Serial(SerialLine),
    /// A raw TCP socket, `host:port` (e.g. an SCPI instrument on 5555).
    Tcp { address: String },
}

impl Endpoint {
    /// The device path, or `tcp://host:port`.
    pub fn name(&self) -> String {
        match self {
            Endpoint::Serial(line) => line.port.clone(),
            Endpoint::Tcp { address } => format!("tcp://{address}"),
        }
    }
}

/// The connection state of a [`Link`] (or of a simulated device feeding a
/// [`Capture`]).
#[derive(Debug, Clone, PartialEq)]
pub enum LinkState {
    /// Nothing opened yet (drivers open lazily).
    NotStarted,
    /// The first open attempt is under way.
    Connecting,
    /// The device is open and being read.
    Open,
    /// The device was open and went away (why); reopening is retried.
    Lost(String),
    /// The device could not be opened (absent, busy, refused); retried.
    Unavailable(String),
    /// The link was shut down.
    Closed,
}

impl LinkState {
    /// Why the link to `device` is not usable, or `None` when it is open.
    /// (`Lost` and `Unavailable` reasons already name the device.)
    pub fn problem(&self, device: &str) -> Option<String> {
        match self {
            LinkState::Open => None,
            LinkState::NotStarted => Some(format!("{device}: not opened yet")),
            LinkState::Connecting => Some(format!("{device}: still connecting")),
            LinkState::Lost(why) | LinkState::Unavailable(why) => Some(why.clone()),
            LinkState::Closed => Some(format!("{device}: link closed")),
        }
    }
}

/// Why [`Capture::wait_for`] gave up.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitError {
    /// The deadline passed first.
    Timeout,
    /// The action's [`CancelToken`] was cancelled.
    Cancelled,
    /// The device went away (why) or was reconnected while waiting.
    Lost(String),
}

struct CaptureInner {
    bytes: VecDeque<u8>,
    /// Absolute offset of `bytes[0]`.
    start: u64,
    limit: usize,
    state: LinkState,
    /// Incremented on every successful open.
    generation: u64,
    /// Absolute offset at which the current connection was opened.
    open_offset: u64,
    opened_at: Option<Instant>,
}

/// A rolling log of every byte a device sent, addressed by absolute
/// offsets (offset 0 = the first byte ever received), plus the link state.
///
/// At most `limit` bytes are kept; older ones are dropped, but offsets keep
/// counting, so a reader holding an offset learns when it fell behind.
/// Writers ([`Link`]'s thread, a simulated device) append; drivers wait
/// for the bytes they need with [`Capture::wait_for`].
pub struct Capture {
    inner: Mutex<CaptureInner>,
    changed: Condvar,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.lock();
        f.debug_struct("Capture")
            .field("start", &g.start)
            .field("len", &g.bytes.len())
            .field("state", &g.state)
            .finish()
    }
}

impl Capture {
    /// An empty log keeping at most `limit_bytes` (at least 1 KiB).
    pub fn new(limit_bytes: usize) -> Arc<Capture> {
        Arc::new(Capture {
            inner: Mutex::new(CaptureInner {
                bytes: VecDeque::new(),
                start: 0,
                limit: limit_bytes.max(1024),
                state: LinkState::NotStarted,
                generation: 0,
                open_offset: 0,
                opened_at: None,
            }),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, CaptureInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends bytes the device sent and wakes waiters.
    pub fn push(&self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let mut g = self.lock();
        g.bytes.extend(data);
        let excess = g.bytes.len().saturating_sub(g.limit);
        if excess > 0 {
            g.bytes.drain(..excess);
            g.start += excess as u64;
        }
        drop(g);
        self.changed.notify_all();
    }

    /// Offset one past the newest byte.
    pub fn end(&self) -> u64 {
        let g = self.lock();
        g.start + g.bytes.len() as u64
    }

    /// Offset of the oldest byte still kept.
    pub fn start(&self) -> u64 {
        self.lock().start
    }

    /// Offset at which the current (or last) connection was opened.
    pub fn open_offset(&self) -> u64 {
        self.lock().open_offset
    }

    /// How long the current connection has been open.
    pub fn open_for(&self) -> Option<Duration> {
        let g = self.lock();
        match g.state {
            LinkState::Open => g.opened_at.map(|t| t.elapsed()),
            _ => None,
        }
    }

    /// Number of successful opens so far (0 = never opened).
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// The current link state.
    pub fn state(&self) -> LinkState {
        self.lock().state.clone()
    }

    /// Sets the link state and wakes waiters; `Open` starts a new
    /// connection generation at the current end of the log.
    pub fn set_state(&self, state: LinkState) {
        let mut g = self.lock();
        if state == LinkState::Open {
            g.generation += 1;
            g.open_offset = g.start + g.bytes.len() as u64;
            g.opened_at = Some(Instant::now());
        }
        g.state = state;
        drop(g);
        self.changed.notify_all();
    }

    /// Wakes every waiter (used to stop the link thread).
    pub fn notify(&self) {
        self.changed.notify_all();
    }

    /// The bytes from `from` (clamped to the oldest kept) to the end, with
    /// the offset they actually start at.
    pub fn bytes_from(&self, from: u64) -> (u64, Vec<u8>) {
        self.range(from, u64::MAX)
    }

    /// The bytes in `from..to` (clamped to what is kept), with the offset
    /// they actually start at.
    pub fn range(&self, from: u64, to: u64) -> (u64, Vec<u8>) {
        let g = self.lock();
        let end = g.start + g.bytes.len() as u64;
        let begin = from.clamp(g.start, end);
        let stop = to.clamp(begin, end);
        let skip = (begin - g.start) as usize;
        let take = (stop - begin) as usize;
        (
            begin,
            g.bytes.iter().skip(skip).take(take).copied().collect(),
        )
    }

    /// Up to `n` of the newest bytes.
    pub fn tail(&self, n: usize) -> Vec<u8> {
        let end = self.end();
        self.bytes_from(end.saturating_sub(n as u64)).1
    }

    /// Waits until `check` accepts the bytes received from `from` on (it is
    /// called with their start offset and the bytes, first at once and then
    /// after every arrival), the `deadline` passes, `cancel` is set, or the
    /// device goes away or reconnects. Buffered bytes are checked before a
    /// lost link is reported, so output that arrived before an unplug is
    /// still found.
    pub fn wait_for<T>(
        &self,
        from: u64,
        deadline: Instant,
        cancel: Option<&CancelToken>,
        mut check: impl FnMut(u64, &[u8]) -> Option<T>,
    ) -> Result<T, WaitError> {
        let mut g = self.lock();
        let generation = g.generation;
        let mut checked_end = None;
        loop {
            let end = g.start + g.bytes.len() as u64;
            if checked_end != Some(end) {
                checked_end = Some(end);
                let begin = from.clamp(g.start, end);
                let skip = (begin - g.start) as usize;
                let data = &g.bytes.make_contiguous()[skip..];
                if let Some(t) = check(begin, data) {
                    return Ok(t);
                }
            }
            if g.generation != generation {
                return Err(WaitError::Lost("the device was reconnected".into()));
            }
            match &g.state {
                LinkState::Lost(why) | LinkState::Unavailable(why) => {
                    return Err(WaitError::Lost(why.clone()))
                }
                LinkState::Closed => return Err(WaitError::Lost("link closed".into())),
                _ => {}
            }
            if cancel.is_some_and(CancelToken::is_cancelled) {
                return Err(WaitError::Cancelled);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(WaitError::Timeout);
            }
            // Wake at least every 50 ms to look at the cancel token.
            let nap = (deadline - now).min(Duration::from_millis(50));
            g = self
                .changed
                .wait_timeout(g, nap)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Reads one reply burst starting at `from`: waits until `first_by` for
    /// the first byte, then returns once `max_len` bytes are there or the
    /// device has been `quiet` for that long (for protocols whose replies
    /// have no terminator, like the Korad's). Returns the bytes.
    pub fn read_burst(
        &self,
        from: u64,
        first_by: Instant,
        quiet: Duration,
        max_len: Option<usize>,
    ) -> Result<Vec<u8>, WaitError> {
        let full = |n: usize| max_len.is_some_and(|m| n >= m);
        let mut seen = 0usize;
        let mut last: Option<Instant> = None;
        loop {
            let until = match last {
                None => first_by,
                Some(t) => t + quiet,
            };
            match self.wait_for(from, until, None, |_, d| {
                (d.len() > seen).then_some(d.len())
            }) {
                Ok(n) => {
                    seen = n;
                    last = Some(Instant::now());
                    if full(n) {
                        break;
                    }
                }
                Err(WaitError::Timeout) if seen > 0 => break,
                Err(WaitError::Lost(_)) if seen > 0 => break,
                Err(e) => return Err(e),
            }
        }
        let take = max_len.map_or(seen, |m| seen.min(m));
        let (_, bytes) = self.range(from, from + take as u64);
        Ok(bytes)
    }

    /// Waits until the state satisfies `done` or `deadline` passes;
    /// returns the state seen last.
    fn wait_state(&self, deadline: Instant, done: impl Fn(&LinkState) -> bool) -> LinkState {
        let mut g = self.lock();
        loop {
            let now = Instant::now();
            if done(&g.state) || now >= deadline {
                return g.state.clone();
            }
            g = self
                .changed
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sleeps up to `dur`, returning early once `stop` is set (and the
    /// capture notified).
    fn nap(&self, dur: Duration, stop: &AtomicBool) {
        let deadline = Instant::now() + dur;
        let mut g = self.lock();
        while !stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            g = self
                .changed
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

type Writer = Arc<Mutex<Option<Box<dyn Write + Send>>>>;

/// A device connection with its reader thread (see the module docs).
///
/// Created closed; the first [`Link::ensure_open`] or [`Link::health`]
/// starts the thread. Dropping the link stops the thread (joined, within
/// [`READ_POLL`]) and releases the port.
pub struct Link {
    endpoint: Endpoint,
    capture: Arc<Capture>,
    writer: Writer,
    stop: Arc<AtomicBool>,
    /// Set to close the current connection and open the path again.
    reopen: Arc<Mutex<Option<String>>>,
    /// Failed identity probes in a row, and the connection they were on.
    identity_failures: (u64, u32),
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("endpoint", &self.endpoint)
            .field("capture", &self.capture)
            .finish()
    }
}

impl Link {
    /// A link to `endpoint` whose capture keeps `log_limit_bytes`.
    pub fn new(endpoint: Endpoint, log_limit_bytes: usize) -> Link {
        Link {
            endpoint,
            capture: Capture::new(log_limit_bytes),
            writer: Arc::new(Mutex::new(None)),
            stop: Arc::new(AtomicBool::new(false)),
            reopen: Arc::new(Mutex::new(None)),
            identity_failures: (0, 0),
            thread: None,
        }
    }

    /// Where this link connects.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Everything the device sent, and the link state.
    pub fn capture(&self) -> &Arc<Capture> {
        &self.capture
    }

    fn start(&mut self) -> Result<(), DriverError> {
        if self.thread.is_some() {
            return Ok(());
        }
        self.capture.set_state(LinkState::Connecting);
        let endpoint = self.endpoint.clone();
        let capture = self.capture.clone();
        let writer = self.writer.clone();
        let stop = self.stop.clone();
        let reopen = self.reopen.clone();
        let thread = std::thread::Builder::new()
            .name("serial-link".into())
            .spawn(move || run_link(endpoint, capture, writer, stop, reopen))
            .map_err(|e| DriverError::Device(format!("cannot start link thread: {e}")))?;
        self.thread = Some(thread);
        Ok(())
    }

    /// Starts the link if needed and waits up to `wait` for the device to
    /// be open. Returns the connection generation (it changes whenever the
    /// device was reopened, so protocol drivers know to handshake again).
    ///
    /// Errors: [`DriverError::Unavailable`] naming the device and why
    /// (absent, in use by another program, lost).
    pub fn ensure_open(&mut self, wait: Duration) -> Result<u64, DriverError> {
        self.start()?;
        let state = self
            .capture
            .wait_state(Instant::now() + wait, |s| *s == LinkState::Open);
        match state.problem(&self.endpoint.name()) {
            None => Ok(self.capture.generation()),
            Some(why) => Err(DriverError::Unavailable(why)),
        }
    }

    /// Writes all of `bytes` to the device.
    ///
    /// Errors: [`DriverError::Unavailable`] when the device is not open or
    /// the write fails (it went away).
    pub fn write(&self, bytes: &[u8]) -> Result<(), DriverError> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let Some(port) = w.as_mut() else {
            let name = self.endpoint.name();
            let why = self
                .capture
                .state()
                .problem(&name)
                .unwrap_or_else(|| format!("{name}: not open"));
            return Err(DriverError::Unavailable(why));
        };
        port.write_all(bytes)
            .and_then(|()| port.flush())
            .map_err(|e| {
                DriverError::Unavailable(format!("write to {} failed: {e}", self.endpoint.name()))
            })
    }

    /// Records that the device on the current connection failed its
    /// driver's identity probe (`why`: the probe's error). The
    /// [`IDENTITY_FAILURES_BEFORE_REOPEN`]th failure in a row on one
    /// connection closes the port and opens its path again within
    /// [`READ_POLL`] + [`REOPEN_INTERVAL`] (a new connection generation),
    /// so a path that now names another adapter is followed; returns true
    /// then. A probe that passes resets the count
    /// ([`Link::identity_confirmed`]).
    pub fn identity_failed(&mut self, why: &str) -> bool {
        let generation = self.capture.generation();
        let (on, count) = self.identity_failures;
        let count = if on == generation { count + 1 } else { 1 };
        if count < IDENTITY_FAILURES_BEFORE_REOPEN {
            self.identity_failures = (generation, count);
            return false;
        }
        self.identity_failures = (generation, 0);
        let name = self.endpoint.name();
        tracing::warn!(
            device = %name,
            failures = count,
            reason = %why,
            "identity probe failed {count} times in a row; closing the port and opening {name} again (adapters swapped?)"
        );
        *self.reopen.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!(
            "{name}: closed after {count} failed identity probes ({why}); reopening"
        ));
        self.capture.notify();
        true
    }

    /// Records that the device on the current connection answered its
    /// driver's identity probe: the failure count starts again.
    pub fn identity_confirmed(&mut self) {
        self.identity_failures = (self.capture.generation(), 0);
    }

    /// Health from the link state alone: healthy while open. Starts the
    /// link on first use and then waits up to 1 s for the first open
    /// attempt, so the first heartbeat is already accurate.
    pub fn health(&mut self) -> DriverHealth {
        let first = self.thread.is_none();
        if let Err(e) = self.start() {
            return DriverHealth::unhealthy(e.to_string());
        }
        if first {
            self.capture
                .wait_state(Instant::now() + Duration::from_secs(1), |s| {
                    *s != LinkState::Connecting
                });
        }
        match self.capture.state().problem(&self.endpoint.name()) {
            None => DriverHealth::healthy(),
            Some(why) => DriverHealth::unhealthy(why),
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.capture.notify();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type Opened = (Box<dyn Read + Send>, Box<dyn Write + Send>);

/// Opens `endpoint` for reading (with a [`READ_POLL`] timeout) and writing.
fn open_endpoint(endpoint: &Endpoint) -> Result<Opened, String> {
    match endpoint {
        Endpoint::Serial(line) => {
            if let Err(e) = std::fs::metadata(&line.port) {
                return Err(match e.kind() {
                    std::io::ErrorKind::NotFound => {
                        format!("serial port {} is not present", line.port)
                    }
                    _ => format!("serial port {}: {e}", line.port),
                });
            }
            let port = line.builder().open().map_err(|e| match e.kind() {
                serialport::ErrorKind::NoDevice => format!(
                    "serial port {} is in use by another program (exclusive access refused: {e})",
                    line.port
                ),
                _ => format!("cannot open serial port {}: {e}", line.port),
            })?;
            let writer = port
                .try_clone()
                .map_err(|e| format!("cannot clone serial port {}: {e}", line.port))?;
            Ok((Box::new(port), Box::new(writer)))
        }
        Endpoint::Tcp { address } => {
            let addr = address
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve {address}: {e}"))?
                .next()
                .ok_or_else(|| format!("{address} resolves to no address"))?;
            let stream = TcpStream::connect_timeout(&addr, TCP_CONNECT_TIMEOUT)
                .map_err(|e| format!("cannot connect to tcp://{address}: {e}"))?;
            let setup = |s: &TcpStream| -> std::io::Result<()> {
                s.set_read_timeout(Some(READ_POLL))?;
                s.set_write_timeout(Some(WRITE_TIMEOUT))?;
                s.set_nodelay(true)
            };
            setup(&stream).map_err(|e| format!("tcp://{address}: {e}"))?;
            let writer = stream
                .try_clone()
                .map_err(|e| format!("tcp://{address}: {e}"))?;
            Ok((Box::new(stream), Box::new(writer)))
        }
    }
}

/// Why the link thread closed an open connection.
enum Closed {
    /// The read failed or hit end of file (why).
    ByDevice(String),
    /// [`Link::identity_failed`] asked for a reopen (the state message).
    ByDriver(String),
}

/// The link thread: open, read until the device goes away, retry.
fn run_link(
    endpoint: Endpoint,
    capture: Arc<Capture>,
    writer: Writer,
    stop: Arc<AtomicBool>,
    reopen: Arc<Mutex<Option<String>>>,
) {
    let name = endpoint.name();
    let mut buf = vec![0u8; 4096];
    let mut last_problem: Option<String> = None;
    while !stop.load(Ordering::SeqCst) {
        match open_endpoint(&endpoint) {
            Ok((mut reader, w)) => {
                *writer.lock().unwrap_or_else(|e| e.into_inner()) = Some(w);
                capture.set_state(LinkState::Open);
                tracing::info!(device = %name, "device opened");
                last_problem = None;
                // A request from before this connection is stale.
                reopen.lock().unwrap_or_else(|e| e.into_inner()).take();
                let why = loop {
                    if stop.load(Ordering::SeqCst) {
                        break None;
                    }
                    if let Some(msg) = reopen.lock().unwrap_or_else(|e| e.into_inner()).take() {
                        break Some(Closed::ByDriver(msg));
                    }
                    match reader.read(&mut buf) {
                        Ok(0) => {
                            break Some(Closed::ByDevice("the device closed the connection".into()))
                        }
                        Ok(n) => capture.push(&buf[..n]),
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::TimedOut
                                    | std::io::ErrorKind::WouldBlock
                                    | std::io::ErrorKind::Interrupted
                            ) => {}
                        Err(e) => break Some(Closed::ByDevice(e.to_string())),
                    }
                };
                *writer.lock().unwrap_or_else(|e| e.into_inner()) = None;
                drop(reader);
                match why {
                    None => break,
                    Some(Closed::ByDriver(msg)) => capture.set_state(LinkState::Lost(msg)),
                    Some(Closed::ByDevice(why)) => {
                        let msg = format!("{name} vanished ({why}); reopening");
                        tracing::warn!(device = %name, reason = %why, "device lost");
                        capture.set_state(LinkState::Lost(msg));
                    }
                }
            }
            Err(why) => {
                if last_problem.as_deref() != Some(why.as_str()) {
                    tracing::warn!(device = %name, reason = %why, "device unavailable");
                    last_problem = Some(why.clone());
                }
                // Keep a `Lost` state (it says the device was there) until
                // it is back or the reason changes.
                match capture.state() {
                    LinkState::Lost(_) if why.contains("not present") => {}
                    _ => capture.set_state(LinkState::Unavailable(why)),
                }
            }
        }
        capture.nap(REOPEN_INTERVAL, &stop);
    }
    *writer.lock().unwrap_or_else(|e| e.into_inner()) = None;
    capture.set_state(LinkState::Closed);
}

/// Which way a [`TranscriptEntry`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Sent to the device.
    Tx,
    /// Received from the device.
    Rx,
    /// A driver remark (a wait, a retry, a switching instant).
    Note,
}

/// One line of a [`Transcript`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TranscriptEntry {
    /// Milliseconds since the transcript was (re)started, 0.1 ms steps.
    pub t_ms: f64,
    pub dir: Direction,
    /// The bytes as text; non-printable bytes as `\xNN`.
    pub data: String,
}

/// What a driver sent and received during one action, with timings; goes
/// into the action's `sensor_dump` evidence.
#[derive(Debug, Clone)]
pub struct Transcript {
    started: Instant,
    entries: Vec<TranscriptEntry>,
}

impl Default for Transcript {
    fn default() -> Self {
        Self::new()
    }
}

impl Transcript {
    /// An empty transcript whose clock starts now.
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            entries: Vec::new(),
        }
    }

    /// Clears the entries and restarts the clock (at the start of an action).
    pub fn restart(&mut self) {
        self.started = Instant::now();
        self.entries.clear();
    }

    /// When the clock started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Milliseconds from the start to `at`.
    pub fn ms(&self, at: Instant) -> f64 {
        (at.saturating_duration_since(self.started).as_secs_f64() * 10_000.0).round() / 10.0
    }

    /// Records an entry stamped now.
    pub fn record(&mut self, dir: Direction, data: impl AsRef<[u8]>) {
        if self.entries.len() >= TRANSCRIPT_MAX {
            self.entries.remove(0);
        }
        let t_ms = self.ms(Instant::now());
        self.entries.push(TranscriptEntry {
            t_ms,
            dir,
            data: printable(data.as_ref()),
        });
    }

    /// Records bytes sent.
    pub fn tx(&mut self, data: impl AsRef<[u8]>) {
        self.record(Direction::Tx, data);
    }

    /// Records bytes received.
    pub fn rx(&mut self, data: impl AsRef<[u8]>) {
        self.record(Direction::Rx, data);
    }

    /// Records a remark.
    pub fn note(&mut self, text: impl AsRef<str>) {
        self.record(Direction::Note, text.as_ref().as_bytes());
    }

    /// The entries so far.
    pub fn entries(&self) -> &[TranscriptEntry] {
        &self.entries
    }
}

/// Bytes as readable text: printable ASCII as is, `\r`, `\n`, `\t`
/// escaped, everything else as `\xNN`.
pub fn printable(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'\r' => s.push_str("\\r"),
            b'\n' => s.push_str("\\n"),
            b'\t' => s.push_str("\\t"),
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(char::from(b)),
            _ => s.push_str(&format!("\\x{b:02X}")),
        }
    }
    s
}

/// A `sensor_dump` artifact holding `body` as pretty JSON.
pub fn sensor_dump(body: &Value, metadata: Map<String, Value>) -> NewArtifact {
    NewArtifact {
        artifact_type: ArtifactType::SensorDump,
        content_type: "application/json".into(),
        bytes: serde_json::to_vec_pretty(body).unwrap_or_default(),
        duration_ms: None,
        metadata,
    }
}

/// A [`DriverConfigError::Setting`] for `key` of `spec`.
pub fn bad_setting(spec: &DriverSpec, key: &str, message: impl Into<String>) -> DriverConfigError {
    DriverConfigError::Setting {
        capability_id: spec.capability_id.clone(),
        key: key.into(),
        message: message.into(),
    }
}

/// Rounds to `decimals` places, for result summaries (`12.0000001` → `12.0`).
pub fn round(v: f64, decimals: i32) -> f64 {
    let f = 10f64.powi(decimals);
    (v * f).round() / f
}

/// Sleeps until `until` (no-op if it passed).
pub fn sleep_until(until: Instant) {
    let now = Instant::now();
    if until > now {
        std::thread::sleep(until - now);
    }
}

/// The RFC 3339 UTC timestamp of now, millisecond precision.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_drops_the_oldest_bytes_but_keeps_counting_offsets() {
        let c = Capture::new(1024);
        c.push(&[b'a'; 1000]);
        c.push(&[b'b'; 100]);
        assert_eq!(c.end(), 1100);
        assert_eq!(c.start(), 76);
        let (from, bytes) = c.bytes_from(0);
        assert_eq!(from, 76);
        assert_eq!(bytes.len(), 1024);
        assert_eq!(c.range(1000, 1010).1, vec![b'b'; 10]);
    }

    #[test]
    fn wait_for_sees_bytes_that_arrived_before_it_was_called() {
        let c = Capture::new(4096);
        c.set_state(LinkState::Open);
        c.push(b"boot... ready\r\n");
        let deadline = Instant::now() + Duration::from_millis(10);
        let found = c.wait_for(0, deadline, None, |at, data| {
            data.windows(5)
                .position(|w| w == b"ready")
                .map(|i| at + i as u64)
        });
        assert_eq!(found, Ok(8));
    }

    #[test]
    fn wait_for_reports_a_lost_device_instead_of_waiting_out_the_deadline() {
        let c = Capture::new(4096);
        c.set_state(LinkState::Open);
        let c2 = c.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            c2.set_state(LinkState::Lost("pulled".into()));
        });
        let started = Instant::now();
        let r = c.wait_for(0, started + Duration::from_secs(5), None, |_, _| None::<()>);
        assert_eq!(r, Err(WaitError::Lost("pulled".into())));
        assert!(started.elapsed() < Duration::from_secs(1));
        t.join().unwrap();
    }

    /// Waits up to 3 s for the link's connection generation to reach `want`.
    fn wait_generation(link: &Link, want: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(3);
        while link.capture().generation() < want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        link.capture().generation()
    }

    #[test]
    fn repeated_identity_failures_close_the_connection_and_open_the_path_again() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let accepted = std::thread::spawn(move || {
            // Keep every accepted socket open: only the link may close one.
            (0..2)
                .map(|_| listener.accept().unwrap().0)
                .collect::<Vec<_>>()
        });
        let mut link = Link::new(Endpoint::Tcp { address }, 4096);
        assert_eq!(link.ensure_open(Duration::from_secs(2)), Ok(1));

        assert!(!link.identity_failed("no answer to *IDN?"));
        // A probe that passes in between starts the count again.
        link.identity_confirmed();
        assert!(!link.identity_failed("no answer to *IDN?"));
        assert!(!link.identity_failed("no answer to *IDN?"));
        std::thread::sleep(READ_POLL * 2);
        assert_eq!(link.capture().generation(), 1, "reopened too early");

        assert!(link.identity_failed("no answer to *IDN?"));
        assert_eq!(wait_generation(&link, 2), 2, "the link did not reopen");
        assert_eq!(link.ensure_open(Duration::from_secs(2)), Ok(2));
        let sockets = accepted.join().unwrap();
        assert_eq!(sockets.len(), 2, "a second connection was made");

        // The count is per connection: two failures on the new one do not
        // add to the three before.
        assert!(!link.identity_failed("no answer to *IDN?"));
        assert!(!link.identity_failed("no answer to *IDN?"));
    }

    #[test]
    fn printable_escapes_control_and_binary_bytes() {
        assert_eq!(printable(b"ok\r\n\xA0\x01"), "ok\\r\\n\\xA0\\x01");
    }
}
