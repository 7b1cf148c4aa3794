//! Benchlink cloud registry: providers, capabilities, leases with preemption,
//! the event stream, audit tasks and the agent runtime behind the Earth command.

pub mod agents;
