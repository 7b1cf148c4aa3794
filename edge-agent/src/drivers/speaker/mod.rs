//! Speaker driver (seed 001 §3.3).

use super::{Driver, DriverConfigError, DriverSpec};

/// Build a Speaker driver from its bench TOML section.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    Err(spec.unknown_backend(&[]))
}
