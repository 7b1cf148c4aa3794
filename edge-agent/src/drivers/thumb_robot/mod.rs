//! Thumb robot driver (seed 001 §3.5).

use super::{Driver, DriverConfigError, DriverSpec};

/// Build a Thumb robot driver from its bench TOML section.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    Err(spec.unknown_backend(&[]))
}
