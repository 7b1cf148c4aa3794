//! The thread that connects one device model to its pty, and the handle
//! ([`Simulator`]) tests and `bench-sim` hold to stop, unplug and replug it.
//!
//! Each simulator runs on its own std thread with blocking I/O: it waits on
//! the pty master for at most [`MAX_WAIT`] (less when the device asked to be
//! woken sooner), hands received bytes to the [`Device`], lets the device
//! advance its clock, and writes what the device produced.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::pty::{MasterRead, PtyMaster, StableLink};
use super::DevSimError;

/// Longest the runner sleeps between device polls, and so the worst-case
/// latency of `stop`/`vanish` and of noticing a program opening the port.
pub const MAX_WAIT: Duration = Duration::from_millis(5);

/// How long a write towards the host may wait for room in the pty buffer
/// before the rest of the output is dropped (nobody is reading).
const WRITE_TIMEOUT: Duration = Duration::from_millis(50);

/// A device model: bytes in from the host, bytes out on its own clock.
///
/// Implementations keep their observable state behind an `Arc<Mutex<_>>` so
/// tests can take snapshots while the runner thread owns the model.
pub trait Device: Send + 'static {
    /// Bytes the host wrote, as they arrived (any split, any length).
    fn receive(&mut self, bytes: &[u8], now: Instant);

    /// Advances the device to `now`, appending bytes for the host to `out`.
    /// Returns when the device next needs a poll (`None`: only on input).
    fn poll(&mut self, now: Instant, out: &mut Vec<u8>) -> Option<Instant>;

    /// A program opened the port (e.g. GRBL's Arduino resets on DTR).
    fn host_opened(&mut self, _now: Instant) {}

    /// The last program holding the port closed it.
    fn host_closed(&mut self, _now: Instant) {}

    /// The USB link went away (cable pulled, see [`Simulator::vanish`]).
    /// USB-powered devices lose their state here.
    fn unplugged(&mut self, _now: Instant) {}

    /// The USB link came back.
    fn plugged(&mut self, _now: Instant) {}
}

enum Control {
    Detach(Sender<()>),
    Attach(Box<PtyMaster>, Sender<()>),
    Stop,
}

/// A running device simulator on a pty, with the device's handle `H`
/// (e.g. [`super::korad::KoradHandle`]) for state snapshots.
///
/// Dropping it stops the thread (joined) and removes the symlink.
pub struct Simulator<H> {
    name: String,
    link_path: Option<PathBuf>,
    link: Option<StableLink>,
    pty_path: PathBuf,
    present: bool,
    host_open: Arc<AtomicBool>,
    ctl: Sender<Control>,
    thread: Option<JoinHandle<()>>,
    handle: H,
}

impl<H> Simulator<H> {
    /// Starts `device` on a new pty; `link`, if given, is a symlink path
    /// created to point at the pty slave (replacing a stale symlink).
    ///
    /// `name` is for logs and errors (e.g. `korad`). Errors:
    /// [`DevSimError::Pty`], [`DevSimError::Link`],
    /// [`DevSimError::LinkOccupied`], [`DevSimError::Thread`].
    pub fn spawn<D: Device>(
        name: &str,
        device: D,
        handle: H,
        link: Option<&Path>,
    ) -> Result<Simulator<H>, DevSimError> {
        let master = PtyMaster::open()?;
        let pty_path = master.slave_path().to_path_buf();
        let stable = link.map(|p| StableLink::create(p, &pty_path)).transpose()?;
        let (ctl, ctl_rx) = mpsc::channel();
        let host_open = Arc::new(AtomicBool::new(false));
        let runner = Runner {
            device,
            master: Some(master),
            host_open: host_open.clone(),
            ctl: ctl_rx,
            out: Vec::with_capacity(256),
        };
        let thread = std::thread::Builder::new()
            .name(format!("devsim-{name}"))
            .spawn(move || runner.run())
            .map_err(|source| DevSimError::Thread {
                name: name.to_string(),
                source,
            })?;
        tracing::debug!(device = name, pty = %pty_path.display(), "device simulator started");
        Ok(Simulator {
            name: name.to_string(),
            link_path: link.map(Path::to_path_buf),
            link: stable,
            pty_path,
            present: true,
            host_open,
            ctl,
            thread: Some(thread),
            handle,
        })
    }

    /// The simulator's name, e.g. `korad`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The path a driver should open: the symlink if one was requested,
    /// else the current pty slave.
    pub fn path(&self) -> &Path {
        self.link_path.as_deref().unwrap_or(&self.pty_path)
    }

    /// The pty slave currently (or, while vanished, last) serving the device,
    /// e.g. `/dev/pts/7`. Changes on every [`Simulator::reappear`].
    pub fn pty_path(&self) -> &Path {
        &self.pty_path
    }

    /// The requested symlink path, if any.
    pub fn link_path(&self) -> Option<&Path> {
        self.link_path.as_deref()
    }

    /// False between [`Simulator::vanish`] and [`Simulator::reappear`].
    pub fn is_present(&self) -> bool {
        self.present
    }

    /// Whether a program has the port open, as last seen by the runner
    /// (updated within [`MAX_WAIT`]).
    pub fn host_connected(&self) -> bool {
        self.present && self.host_open.load(Ordering::Relaxed)
    }

    /// The device handle, for state snapshots and device-specific controls.
    pub fn handle(&self) -> &H {
        &self.handle
    }

    /// Unplugs the device: closes the pty master (a driver holding the port
    /// sees a hangup) and then removes the symlink. The device model keeps
    /// running (a PSU keeps its output) unless it is USB-powered.
    ///
    /// No-op when already vanished. Errors: [`DevSimError::Stopped`].
    pub fn vanish(&mut self) -> Result<(), DevSimError> {
        if !self.present {
            return Ok(());
        }
        let (ack, done) = mpsc::channel();
        self.send(Control::Detach(ack))?;
        done.recv().map_err(|_| self.stopped())?;
        self.link = None;
        self.present = false;
        tracing::debug!(device = %self.name, "device vanished");
        Ok(())
    }

    /// Plugs the device back in on a new pty and re-creates the symlink at
    /// the same path. Returns the new pty slave path. No-op (returning the
    /// current path) when present.
    ///
    /// Errors: [`DevSimError::Pty`], [`DevSimError::Link`],
    /// [`DevSimError::LinkOccupied`], [`DevSimError::Stopped`].
    pub fn reappear(&mut self) -> Result<PathBuf, DevSimError> {
        if self.present {
            return Ok(self.pty_path.clone());
        }
        let master = PtyMaster::open()?;
        let pty_path = master.slave_path().to_path_buf();
        // Link before attaching, so a driver that finds the link finds a
        // live device behind it.
        let link = self
            .link_path
            .as_deref()
            .map(|p| StableLink::create(p, &pty_path))
            .transpose()?;
        let (ack, done) = mpsc::channel();
        self.send(Control::Attach(Box::new(master), ack))?;
        done.recv().map_err(|_| self.stopped())?;
        self.link = link;
        self.pty_path = pty_path.clone();
        self.present = true;
        tracing::debug!(device = %self.name, pty = %pty_path.display(), "device reappeared");
        Ok(pty_path)
    }

    /// Stops the device thread (joined), closes the pty and removes the
    /// symlink. Errors: [`DevSimError::Stopped`] if the thread had panicked.
    pub fn stop(mut self) -> Result<(), DevSimError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), DevSimError> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        let _ = self.ctl.send(Control::Stop);
        let joined = thread.join();
        self.link = None;
        self.present = false;
        joined.map_err(|_| self.stopped())
    }

    fn send(&self, msg: Control) -> Result<(), DevSimError> {
        self.ctl.send(msg).map_err(|_| self.stopped())
    }

    fn stopped(&self) -> DevSimError {
        DevSimError::Stopped {
            name: self.name.clone(),
        }
    }
}

/// The device-independent controls of a [`Simulator`], so simulators of
/// different devices can be kept in one list (`Box<dyn SimulatorControl>`).
pub trait SimulatorControl: Send {
    /// See [`Simulator::name`].
    fn name(&self) -> &str;
    /// See [`Simulator::path`].
    fn path(&self) -> &Path;
    /// See [`Simulator::pty_path`].
    fn pty_path(&self) -> &Path;
    /// See [`Simulator::is_present`].
    fn is_present(&self) -> bool;
    /// See [`Simulator::vanish`].
    fn vanish(&mut self) -> Result<(), DevSimError>;
    /// See [`Simulator::reappear`].
    fn reappear(&mut self) -> Result<PathBuf, DevSimError>;
}

impl<H: Send> SimulatorControl for Simulator<H> {
    fn name(&self) -> &str {
        Simulator::name(self)
    }
    fn path(&self) -> &Path {
        Simulator::path(self)
    }
    fn pty_path(&self) -> &Path {
        Simulator::pty_path(self)
    }
    fn is_present(&self) -> bool {
        Simulator::is_present(self)
    }
    fn vanish(&mut self) -> Result<(), DevSimError> {
        Simulator::vanish(self)
    }
    fn reappear(&mut self) -> Result<PathBuf, DevSimError> {
        Simulator::reappear(self)
    }
}

impl<H> Drop for Simulator<H> {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

impl<H> std::fmt::Debug for Simulator<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulator")
            .field("name", &self.name)
            .field("path", &self.path())
            .field("pty_path", &self.pty_path)
            .field("present", &self.present)
            .finish_non_exhaustive()
    }
}

struct Runner<D> {
    device: D,
    master: Option<PtyMaster>,
    host_open: Arc<AtomicBool>,
    ctl: Receiver<Control>,
    out: Vec<u8>,
}

impl<D: Device> Runner<D> {
    fn run(mut self) {
        let mut buf = [0u8; 512];
        loop {
            match self.ctl.try_recv() {
                Ok(msg) => {
                    if !self.control(msg) {
                        return;
                    }
                    continue;
                }
                Err(TryRecvError::Disconnected) => return,
                Err(TryRecvError::Empty) => {}
            }
            let now = Instant::now();
            self.out.clear();
            let wake = self.device.poll(now, &mut self.out);
            self.flush();
            let wait = wake
                .map(|t| t.saturating_duration_since(Instant::now()))
                .unwrap_or(MAX_WAIT)
                .min(MAX_WAIT);
            let Some(master) = self.master.as_mut() else {
                // Unplugged: keep the device's clock running, wait for control.
                match self.ctl.recv_timeout(wait) {
                    Ok(msg) => {
                        if !self.control(msg) {
                            return;
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
                continue;
            };
            match master.read_timeout(&mut buf, wait) {
                Ok(MasterRead::Bytes(n)) => {
                    let now = Instant::now();
                    self.set_host_open(true, now);
                    self.device.receive(&buf[..n], now);
                }
                Ok(MasterRead::Idle) => self.set_host_open(true, Instant::now()),
                Ok(MasterRead::HostClosed) => {
                    self.set_host_open(false, Instant::now());
                    // poll returns at once while nobody has the port open.
                    std::thread::sleep(wait.max(Duration::from_millis(1)));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pty master read failed");
                    std::thread::sleep(wait.max(Duration::from_millis(1)));
                }
            }
        }
    }

    /// Applies one control message; false means stop.
    fn control(&mut self, msg: Control) -> bool {
        let now = Instant::now();
        match msg {
            Control::Detach(ack) => {
                self.master = None;
                self.set_host_open(false, now);
                self.device.unplugged(now);
                let _ = ack.send(());
                true
            }
            Control::Attach(master, ack) => {
                self.master = Some(*master);
                self.device.plugged(now);
                let _ = ack.send(());
                true
            }
            Control::Stop => false,
        }
    }

    fn set_host_open(&mut self, open: bool, now: Instant) {
        if self.host_open.swap(open, Ordering::Relaxed) == open {
            return;
        }
        if open {
            self.device.host_opened(now);
        } else {
            self.device.host_closed(now);
        }
    }

    /// Sends the device's output if a program has the port open; a real
    /// adapter with the port closed drops it too.
    fn flush(&mut self) {
        if self.out.is_empty() || !self.host_open.load(Ordering::Relaxed) {
            return;
        }
        if let Some(master) = self.master.as_mut() {
            match master.write_timeout(&self.out, WRITE_TIMEOUT) {
                Ok(n) if n < self.out.len() => {
                    tracing::debug!(
                        dropped = self.out.len() - n,
                        "host not reading; output dropped"
                    );
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "pty master write failed"),
            }
        }
    }
}
