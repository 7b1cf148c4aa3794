//! The test kit: what the tests of every crate (`shared-protocol`,
//! `edge-agent`, `cloud-registry`, the end-to-end `tests/`) would otherwise
//! each write again.
//!
//! | module | what |
//! |---|---|
//! | [`services`] | is Mosquitto, a tool, a tmpfs there? Under `CI=true` a missing one fails the test, elsewhere it is skipped with a printed reason |
//! | [`wait`] | [`eventually`] (async, panics on timeout), [`wait_until`] (blocking, a bool), [`wait_for`] (blocking, a `Result`) |
//! | [`process`] | [`KillOnDrop`]: a child process that does not outlive its test; [`stdout_lines`] |
//! | [`pulse`] | [`PulseServer`]: a private PulseAudio with a null sink, for real speaker and microphone tests |
//! | [`s3`] | [`MotoS3`]: a private `moto_server` (S3 API) on a free port |
//! | this page | [`sha256_hex`], [`free_port`], [`temp_dir`], [`status_is`]; [`strs`], [`find`], [`with_at`] and [`read_json`] for JSON |
//!
//! Registry fixtures (a registry with a provider and tokens) live in
//! `cloud-registry/tests/common`, the lab with simulators in
//! `tests/src` (`benchlink-e2e`); see docs/architecture.md for the parts.

pub mod process;
pub mod pulse;
pub mod s3;
pub mod services;
pub mod wait;

use std::net::TcpListener;

use sha2::{Digest, Sha256};

pub use process::{stdout_lines, KillOnDrop};
pub use pulse::PulseServer;
pub use s3::MotoS3;
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

/// The JSON document in the file at `path`.
///
/// Panics: the file cannot be read or is not JSON (the message names
/// `path`).
pub fn read_json(path: impl AsRef<std::path::Path>) -> serde_json::Value {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `base` with the value at `path` replaced by `value`; `path` names
/// object keys joined by `.`, each optionally indexed (`a.b[0].c`).
///
/// Panics: an index is not a number.
pub fn with_at(
    mut base: serde_json::Value,
    path: &str,
    value: serde_json::Value,
) -> serde_json::Value {
    let mut at = &mut base;
    for part in path.split('.') {
        let (key, index) = match part.split_once('[') {
            Some((k, i)) => (
                k,
                Some(i.trim_end_matches(']').parse::<usize>().expect("index")),
            ),
            None => (part, None),
        };
        at = &mut at[key];
        if let Some(i) = index {
            at = &mut at[i];
        }
    }
    *at = value;
    base
}

/// `answer` (a `(status, body)` pair) after asserting that its status is
/// `status`; the failure shows the body.
#[track_caller]
pub fn status_is<S, B>(answer: (S, B), status: S) -> (S, B)
where
    S: PartialEq + std::fmt::Debug,
    B: std::fmt::Display,
{
    assert_eq!(answer.0, status, "{}", answer.1);
    answer
}
