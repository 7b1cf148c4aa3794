//! Microphone driver (seed 001 §3.2).

use super::{Driver, DriverConfigError, DriverSpec};

/// Build a Microphone driver from its bench TOML section.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    Err(spec.unknown_backend(&[]))
}
