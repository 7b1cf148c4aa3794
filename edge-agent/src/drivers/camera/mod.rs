//! Camera driver (seed 001 §3.1).

use super::{Driver, DriverConfigError, DriverSpec};

/// Build a Camera driver from its bench TOML section.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    Err(spec.unknown_backend(&[]))
}
