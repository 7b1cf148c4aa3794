//! The registry's shared core: what both the bench side (`cloud-registry`)
//! and the agent runtime (`registry-agents`) stand on, and nothing of
//! either (see docs/architecture.md, "Registry crates").
//!
//! - [`auth`]: bearer tokens, roles and the [`auth::Principal`] extractor;
//! - [`db`]: SQLite on dedicated threads (one writer, readers);
//! - [`error`]: the JSON error body ([`error::ApiError`]);
//! - [`extract`]: validated JSON bodies and query strings;
//! - [`ids`]: time-ordered row ids;
//! - [`sql`]: one SQL interface over SQLite and PostgreSQL;
//! - [`storage`]: the store's disk (full or writable).

pub mod auth;
pub mod db;
pub mod error;
pub mod extract;
pub mod ids;
pub mod sql;
pub mod storage;
