//! Relay driver (seed 001 §3.6).

use super::{Driver, DriverConfigError, DriverSpec};

/// Build a Relay driver from its bench TOML section.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    Err(spec.unknown_backend(&[]))
}
