//! The Earth natural-language command (seed 000 "Earth Command").

pub mod entities;
