//! Programmable power supply driver (seed 001 §3.7).

use super::{Driver, DriverConfigError, DriverSpec};

/// Build a Programmable power supply driver from its bench TOML section.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    Err(spec.unknown_backend(&[]))
}
