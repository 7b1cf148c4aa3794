//! Exit codes and the error every command ends with.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done |
//! | 1 | `verify-bundle`: the bundle does not verify |
//! | 2 | usage: a bad flag or argument, a missing URL or token, a token file others may read |
//! | 3 | refused: 401 `unauthenticated` or 403 (`forbidden`, `not_lease_holder`, ...) |
//! | 4 | not found: 404 |
//! | 5 | conflict: 409 (a held capability, a lease no longer usable, removing a capability not in maintenance, ...) |
//! | 6 | any other API error (4xx/5xx), or an action that ended `failed` |
//! | 7 | the registry could not be reached |

use reqwest::StatusCode;
use serde_json::Value;

/// Done.
pub const OK: u8 = 0;
/// `verify-bundle`: the bundle failed a check.
pub const INVALID: u8 = 1;
/// A bad flag or argument, or missing settings (clap's own code too).
pub const USAGE: u8 = 2;
/// 401 or 403.
pub const REFUSED: u8 = 3;
/// 404.
pub const NOT_FOUND: u8 = 4;
/// 409.
pub const CONFLICT: u8 = 5;
/// Any other error answer, or an action whose session ended `failed`.
pub const API: u8 = 6;
/// The registry did not answer (refused connection, timeout, DNS).
pub const CONNECTION: u8 = 7;

/// The exit-code table as `--help` shows it.
pub const TABLE: &str = "Exit codes:
  0  done
  1  verify-bundle: the bundle does not verify
  2  usage: bad arguments, no URL or token, a token file others may read
  3  refused: 401 unauthenticated or 403 forbidden (e.g. not an admin) / not_lease_holder
  4  not found (404)
  5  conflict (409): e.g. the capability is held by someone else, or
     capability_not_in_maintenance
  6  other API error, or an action that ended failed
  7  the registry could not be reached";

/// Why a command failed: the exit code and a one-line message for stderr.
#[derive(Debug)]
pub struct Failure {
    /// One of the constants above.
    pub code: u8,
    /// What went wrong, for a person.
    pub message: String,
    /// The registry's error body, when there was one (`--json` prints it).
    pub body: Option<Value>,
}

impl Failure {
    /// A usage error (exit 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: USAGE,
            message: message.into(),
            body: None,
        }
    }

    /// A failure with `code`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            body: None,
        }
    }

    /// The same failure carrying `body` (what the registry answered), for
    /// `--json`.
    pub fn with_body(mut self, body: &Value) -> Self {
        self.body = Some(body.clone());
        self
    }

    /// The failure for an error answer `status` with body `body` to
    /// `what` (e.g. `POST /api/v1/capability-leases/request`): the code by
    /// status, the message `what: 409 lease_not_usable: ...`.
    pub fn from_answer(what: &str, status: StatusCode, body: &Value) -> Self {
        let code = match status.as_u16() {
            401 | 403 => REFUSED,
            404 => NOT_FOUND,
            409 => CONFLICT,
            _ => API,
        };
        let err = &body["error"];
        let text = match (err["code"].as_str(), err["message"].as_str()) {
            (Some(c), Some(m)) => format!("{c}: {m}"),
            _ => body
                .as_str()
                .map(str::to_string)
                .unwrap_or(body.to_string()),
        };
        Self {
            code,
            message: format!("{what}: {} {text}", status.as_u16()),
            body: Some(body.clone()),
        }
    }
}

impl From<anyhow::Error> for Failure {
    /// A transport error is [`CONNECTION`]; anything else [`API`].
    fn from(e: anyhow::Error) -> Self {
        let connection = e.chain().any(|c| {
            c.downcast_ref::<reqwest::Error>()
                .is_some_and(|r| r.is_connect() || r.is_timeout() || r.is_request())
        });
        Self {
            code: if connection { CONNECTION } else { API },
            message: format!("{e:#}"),
            body: None,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}
