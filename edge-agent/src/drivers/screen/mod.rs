//! Screen capture driver (seed 001 §3.8).

use super::{Driver, DriverConfigError, DriverSpec};

/// Build a Screen capture driver from its bench TOML section.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    Err(spec.unknown_backend(&[]))
}
