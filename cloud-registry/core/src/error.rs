//! The one error type HTTP handlers return: JSON
//! `{"error": {"code", "message", "details"}}` with the right status.

use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use shared_protocol::api::{ErrorBody, ErrorDetail};
use shared_protocol::ParseError;

/// An HTTP error: status, stable `code`, message for a person, details.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Value,
}

impl ApiError {
    /// Any status and code.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: Value::Null,
        }
    }

    /// Attach structured details (e.g. `{"lease_status": "revoked"}`).
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    /// 400 `invalid_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// 422 `invalid_field` naming `field`.
    pub fn invalid_field(field: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", message)
            .with_details(json!({ "field": field }))
    }

    /// 400 `invalid_query` about query parameter `param`: message
    /// "query parameter `{param}`: {problem}", `details.param`.
    pub fn invalid_query(param: &str, problem: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("query parameter `{param}`: {problem}"),
        )
        .with_details(json!({ "param": param }))
    }

    /// 404 `not_found` for `kind` `id` (e.g. `lease`, `lease_123`).
    pub fn not_found(kind: &str, id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{kind} `{id}` not found"),
        )
        .with_details(json!({ "kind": kind, "id": id }))
    }

    /// 401 `unauthenticated`.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthenticated", message)
    }

    /// 403 `forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// 409 with a specific `code`.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    /// 500 `internal`: the detail is logged, the client gets a generic
    /// message. An error saying the disk is full is
    /// [`ApiError::storage_full`] instead.
    pub fn internal(err: impl std::fmt::Display) -> Self {
        if crate::storage::is_full(&err) {
            return Self::storage_full(&err);
        }
        if err.to_string().contains(crate::sql::pg::FENCED) {
            tracing::error!(error = %err, "store fenced");
            return Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "leader_unavailable",
                "this registry lost its store's lock to another replica and stops; nothing of the request was stored: retry (another replica leads)",
            )
            .with_details(json!({ "retryable": true }));
        }
        if crate::storage::is_unreachable(&err) {
            tracing::warn!(error = %err, "store unreachable");
            return Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "the registry cannot reach its store (PostgreSQL); nothing of the request was stored: retry",
            )
            .with_details(json!({ "retryable": true }));
        }
        tracing::error!(error = %err, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; see the registry log",
        )
    }

    /// 507 `storage_full`: a write failed because the store's disk is
    /// full; nothing of the request was stored and it may be retried once
    /// space is freed. `details`: `{"path"}` (the store's directory),
    /// `{"retryable": true}`. Marks the store not writable (`/healthz`).
    pub fn storage_full(err: &(impl std::fmt::Display + ?Sized)) -> Self {
        crate::storage::note_full("http request", err);
        let dir = crate::storage::store_dir();
        Self::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "storage_full",
            format!(
                "the registry's store at {} is full (no space left on the device); nothing was stored: retry once space is freed",
                dir.display()
            ),
        )
        .with_details(json!({ "path": dir.display().to_string(), "retryable": true }))
    }

    /// 503 `unavailable`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

/// The JSON error body; a 429 whose `details.retry_after_seconds` is a
/// whole number also gets a `Retry-After` header with it.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
                details: self.details,
            },
        };
        let retry_after = (self.status == StatusCode::TOO_MANY_REQUESTS)
            .then(|| body.error.details.get("retry_after_seconds"))
            .flatten()
            .and_then(Value::as_u64);
        let mut resp = (self.status, axum::Json(body)).into_response();
        // A 429 tells when to come back (RFC 9110 §10.2.3, whole seconds).
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        resp
    }
}

impl From<ParseError> for ApiError {
    /// Malformed JSON (not JSON, or cut short) is 400 `malformed_json`; a
    /// body that is not a JSON object (`[]`, `"x"`, `42`, `null`) is 400
    /// `invalid_request` "request body must be a JSON object"; a bad field
    /// (a value of the wrong JSON type included) is 422 `invalid_field`
    /// with `details.field`. Messages speak of JSON
    /// (object, array, string, integer), never of the server's type names.
    fn from(e: ParseError) -> Self {
        match e {
            ParseError::Syntax(m) => Self::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                format!("malformed JSON: {m}"),
            ),
            ParseError::Field { field, message } => {
                let message = plain_json_message(&message);
                if field.is_empty() && message.starts_with("invalid type:") {
                    let expected = message
                        .split_once(", expected ")
                        .map_or("a JSON object", |(_, e)| e);
                    let message = if expected == "a JSON object" {
                        "request body must be a JSON object".to_string()
                    } else {
                        format!("request body must be {expected}")
                    };
                    return Self::bad_request(message).with_details(json!({ "field": "" }));
                }
                let text = if field.is_empty() {
                    message
                } else {
                    format!("invalid field `{field}`: {message}")
                };
                Self::invalid_field(&field, text)
            }
            ParseError::Invalid(v) => Self::invalid_field(&v.field, v.to_string()),
        }
    }
}

/// Rewrite a serde error message so it describes JSON instead of naming
/// Rust types: `invalid type: sequence, expected struct LeaseRequest`
/// becomes `invalid type: array, expected a JSON object`, `expected u8`
/// becomes `expected an integer from 0 to 255`.
pub fn plain_json_message(message: &str) -> String {
    use std::sync::LazyLock;
    static RULES: LazyLock<Vec<(regex::Regex, &'static str)>> = LazyLock::new(|| {
        [
            // What was found.
            (r"invalid type: sequence", "invalid type: array"),
            (r"invalid type: map", "invalid type: object"),
            (r"invalid type: unit value", "invalid type: null"),
            // serde lets a struct be written as an array of its fields.
            (
                r"invalid length \d+, expected (?:struct|tuple struct) \w+ with \d+ elements?",
                "invalid type: array, expected a JSON object",
            ),
            // What was expected.
            (
                r"data did not match any variant of untagged enum \w+",
                "does not match any accepted form",
            ),
            (
                r"(?:internally|adjacently) tagged enum \w+",
                "a JSON object",
            ),
            (r"\benum \w+", "one of the allowed values"),
            (r"\b(?:tuple struct|tuple variant) [\w:]+", "a JSON array"),
            (r"\bunit (?:struct|variant) [\w:]+", "null"),
            (r"\b(?:struct variant |struct )[\w:]+", "a JSON object"),
            (r"expected a sequence", "expected a JSON array"),
            (r"expected a map", "expected a JSON object"),
            (r"expected u8\b", "expected an integer from 0 to 255"),
            (r"expected u16\b", "expected an integer from 0 to 65535"),
            (
                r"expected u32\b",
                "expected an integer from 0 to 4294967295",
            ),
            (
                r"expected (?:u64|u128|usize)\b",
                "expected a non-negative integer",
            ),
            (r"expected i8\b", "expected an integer from -128 to 127"),
            (
                r"expected i16\b",
                "expected an integer from -32768 to 32767",
            ),
            (r"expected (?:i32|i64|i128|isize)\b", "expected an integer"),
            (r"expected (?:f32|f64)\b", "expected a number"),
            (r"expected a borrowed string", "expected a string"),
            (r"expected char\b", "expected a single character"),
        ]
        .into_iter()
        .map(|(re, to)| (regex::Regex::new(re).expect("valid pattern"), to))
        .collect()
    });
    let mut out = message.to_string();
    for (re, to) in RULES.iter() {
        if re.is_match(&out) {
            out = re.replace_all(&out, *to).into_owned();
        }
    }
    out
}

impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> Self {
        let status = e.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "body_too_large"
        } else if status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
            "unsupported_media_type"
        } else {
            "malformed_json"
        };
        Self::new(status, code, plain_json_message(&e.body_text()))
    }
}

impl From<crate::db::DbError> for ApiError {
    fn from(e: crate::db::DbError) -> Self {
        Self::internal(e)
    }
}

impl From<rusqlite::Error> for ApiError {
    fn from(e: rusqlite::Error) -> Self {
        Self::internal(e)
    }
}

/// Result type of handlers.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_messages_are_rewritten_in_json_terms() {
        for (from, to) in [
            (
                "invalid type: sequence, expected struct LeaseRequest",
                "invalid type: array, expected a JSON object",
            ),
            (
                "invalid type: map, expected a sequence",
                "invalid type: object, expected a JSON array",
            ),
            (
                "invalid length 2, expected struct Capability with 9 elements",
                "invalid type: array, expected a JSON object",
            ),
            (
                "invalid value: integer `300`, expected u8",
                "invalid value: integer `300`, expected an integer from 0 to 255",
            ),
            (
                "invalid type: string \"x\", expected internally tagged enum Action",
                "invalid type: string \"x\", expected a JSON object",
            ),
            (
                "data did not match any variant of untagged enum Selector",
                "does not match any accepted form",
            ),
            (
                "invalid type: integer `1`, expected enum Role",
                "invalid type: integer `1`, expected one of the allowed values",
            ),
            (
                "unknown variant `toaster`, expected one of `camera`, `relay`",
                "unknown variant `toaster`, expected one of `camera`, `relay`",
            ),
        ] {
            assert_eq!(plain_json_message(from), to);
        }
    }

    #[test]
    fn a_top_level_type_error_is_a_400_about_the_body() {
        let e = ApiError::from(ParseError::Field {
            field: String::new(),
            message: "invalid type: integer `42`, expected struct TokenCreateRequest".into(),
        });
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.code, "invalid_request");
        assert_eq!(e.message, "request body must be a JSON object");
        let e = ApiError::from(ParseError::Field {
            field: "capabilities[1]".into(),
            message: "invalid type: string \"x\", expected struct CapabilityRegistration".into(),
        });
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            e.message,
            "invalid field `capabilities[1]`: invalid type: string \"x\", expected a JSON object"
        );
        assert_eq!(e.details, json!({"field": "capabilities[1]"}));
    }
}
