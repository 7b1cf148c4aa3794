//! Benchlink edge agent: the daemon that runs on each bench computer.
//!
//! It describes the attached hardware (from one TOML file), drives it through
//! one driver per capability type, keeps evidence in a SQLite outbox and talks
//! to the registry over MQTT (control) and HTTP (artifact bytes).

pub mod clock;
pub mod config;
pub mod daemon;
pub mod devices;
pub mod devsim;
pub mod drivers;
pub mod fence;
pub mod link;
pub mod metrics;
pub mod notify;
pub mod outbox;
pub mod runner;
pub mod status;
pub mod tls;
pub mod update_size;
pub mod uploader;
