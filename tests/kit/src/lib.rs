//! The test kit: what the tests of every crate (`shared-protocol`,
//! `edge-agent`, `cloud-registry`, the end-to-end `tests/`) would otherwise
//! each write again.
//!
//! | module | what |
//! |---|---|
//! | [`services`] | is Mosquitto, a tool, a tmpfs there? Under `CI=true` a missing one fails the test, elsewhere it is skipped with a printed reason |
//! | [`wait`] | [`eventually`] (async, panics on timeout), [`wait_until`] (blocking, a bool), [`wait_for`] (blocking, a `Result`) |
//! | [`process`] | [`KillOnDrop`]: a child process that does not outlive its test |
//! | this page | [`sha256_hex`], [`free_port`], [`temp_dir`]; [`strs`] and [`find`] over JSON arrays |
//!
//! Registry fixtures (a registry with a provider and tokens) live in
//! `cloud-registry/tests/common`, the lab with simulators in
//! `tests/src` (`benchlink-e2e`); see docs/architecture.md for the parts.

pub mod process;
pub mod services;
pub mod wait;

use std::net::TcpListener;

use sha2::{Digest, Sha256};

pub use process::KillOnDrop;
pub use services::{in_ci, mosquitto, reachable, skip_unless_ci, tool_installed, Tmpfs, MOSQUITTO};
pub use wait::{eventually, poll_until, wait_for, wait_until};

/// Lowercase hex SHA-256 of `bytes` (64 characters), as artifacts carry it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
///
/// Panics: 127.0.0.1:0 cannot be bound.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// A fresh temporary directory, removed when dropped.
///
/// Panics: the directory cannot be made.
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary directory")
}

/// The string field `key` of each item of the JSON array `list`, in order.
///
/// Panics: `list` is not an array, or an item has no string `key` (the
/// message shows `list`).
pub fn strs<'a>(list: &'a serde_json::Value, key: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap_or_else(|| panic!("not an array: {list}"))
        .iter()
        .map(|item| {
            item[key]
                .as_str()
                .unwrap_or_else(|| panic!("no string `{key}` in {item}"))
        })
        .collect()
}

/// The first item of the JSON array `list` whose `key` equals `value`.
///
/// Panics: `list` is not an array, or no item matches (the message shows
/// `list`).
pub fn find<'a>(list: &'a serde_json::Value, key: &str, value: &str) -> &'a serde_json::Value {
    list.as_array()
        .unwrap_or_else(|| panic!("not an array: {list}"))
        .iter()
        .find(|item| item[key] == value)
        .unwrap_or_else(|| panic!("no item with {key} = {value:?} in {list}"))
}
