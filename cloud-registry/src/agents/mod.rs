//! Agent runtime (seed 000): runs, steps, evidence, tools, the Earth command.

pub mod earth;
