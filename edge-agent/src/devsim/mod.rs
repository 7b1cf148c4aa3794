//! Device simulators that speak real wire protocols on pseudo-terminals.
//!
//! Each simulator owns the master end of a pty and runs on its own std
//! thread; a driver opens the slave end (or a stable symlink to it, like a
//! `/dev/serial/by-id/…` name) with `serialport::new(path, baud).open()`
//! exactly as it would open the real device. Nothing here needs tokio.
//!
//! | module | device | wire format |
//! |---|---|---|
//! | [`korad`] | Korad KA3005P-family PSU | unterminated ASCII, `VSET1:12.00` |
//! | [`scpi_psu`] | Rigol DP800-type SCPI PSU | `\n`-terminated SCPI |
//! | [`lcus`] | LCUS-type USB relay board | 4-byte hex frames `A0 ch op sum` |
//! | [`numato`] | Numato-type USB relay module | `relay on 0\r`, echo, `>` prompt |
//! | [`grbl`] | GRBL 1.1 controller (thumb robot) | G-code lines, `ok` / `error:N` |
//! | [`dut_console`] | device-under-test serial console | boot log, `login:`, shell |
//!
//! Every simulator is a [`Simulator<H>`]: `path()` to open, `handle()` for
//! state snapshots, [`Simulator::vanish`] / [`Simulator::reappear`] to pull
//! and replug the USB cable, [`Simulator::stop`] (or drop) to end it. The
//! `bench-sim` binary starts any set of them from the command line.

pub mod dut_console;
pub mod grbl;
pub mod korad;
pub mod lcus;
pub mod numato;
pub mod port;
pub mod pty;
pub mod scpi_psu;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

pub use port::{Device, Simulator, SimulatorControl};

/// Reads the voltage (V) a simulated supply currently delivers to a load;
/// used to power a simulated DUT from a simulated PSU.
pub type PowerSense = Arc<dyn Fn() -> f64 + Send + Sync>;

/// Why a simulator could not start, unplug or replug.
#[derive(Debug, thiserror::Error)]
pub enum DevSimError {
    /// The kernel would not give us a pseudo-terminal pair.
    #[error("cannot open a pty pair: {source}")]
    Pty {
        /// The underlying serialport error.
        source: serialport::Error,
    },
    /// Creating or replacing the stable symlink failed.
    #[error("cannot create device link {}: {source}", path.display())]
    Link {
        /// The symlink path that was requested.
        path: PathBuf,
        /// The filesystem error.
        source: std::io::Error,
    },
    /// The requested link path exists and is not a symlink; it is left alone.
    #[error("device link path {} exists and is not a symlink", path.display())]
    LinkOccupied {
        /// The symlink path that was requested.
        path: PathBuf,
    },
    /// The simulator thread could not be started.
    #[error("cannot start simulator thread for {name}: {source}")]
    Thread {
        /// Simulator name, e.g. `korad`.
        name: String,
        /// The spawn error.
        source: std::io::Error,
    },
    /// The simulator thread is gone (stopped or panicked).
    #[error("simulator {name} is not running")]
    Stopped {
        /// Simulator name, e.g. `korad`.
        name: String,
    },
    /// A configuration value is out of its allowed range.
    #[error("invalid simulator config {field}: {reason}")]
    Config {
        /// The offending field, e.g. `channels`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// Locks a state mutex, recovering the data if a holder panicked (a
/// snapshot of a half-updated simulator is still better than a panic).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
