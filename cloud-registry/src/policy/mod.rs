//! The lab's rules on who is granted what (docs/policy.md): maintenance
//! (`maintenance.rs`: an admin takes a capability or a provider out of
//! service and back, and removes retired capabilities). Health gating
//! lives in the lease engine's directory ([`crate::leases::CapabilityInfo`]
//! `unhealthy`, `maintenance`), fed by heartbeats. Principal policy
//! (`principal.rs`: per role and principal limits on lease requests) is
//! checked by the lease engine at admission. Health checks
//! (`health_check.rs`: a per type action the registry runs under a system
//! lease; a failure holds the capability out until a check passes).

pub mod health_check;
pub mod maintenance;
pub mod principal;
