//! Serial port driver (seed 001 §3.4).

use super::{Driver, DriverConfigError, DriverSpec};

/// Build a Serial port driver from its bench TOML section.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    Err(spec.unknown_backend(&[]))
}
