//! The Mosquitto the link tests publish through (127.0.0.1:1883): whether
//! it is there, failing loudly under `CI=true` when it is not.

use std::net::TcpStream;
use std::time::Duration;

/// Where the tests expect Mosquitto.
const BROKER: &str = "127.0.0.1:1883";

/// True when Mosquitto accepts a TCP connection at [`BROKER`]. Without
/// it: a panic when `CI=true` (a test must not pass by skipping there),
/// otherwise a `SKIPPED` line and false.
pub fn broker_available() -> bool {
    let reachable = BROKER
        .parse()
        .ok()
        .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_millis(500)).ok())
        .is_some();
    if reachable {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("Mosquitto is not reachable at {BROKER} and CI=true: start it (mosquitto -d)");
    }
    eprintln!("SKIPPED: Mosquitto is not reachable at {BROKER}");
    false
}
