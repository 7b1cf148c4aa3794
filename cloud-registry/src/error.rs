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

    /// 500 `internal`: the detail is logged, the client gets a generic message.
    pub fn internal(err: impl std::fmt::Display) -> Self {
        tracing::error!(error = %err, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; see the registry log",
        )
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
                details: self.details,
            },
        };
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<ParseError> for ApiError {
    fn from(e: ParseError) -> Self {
        match &e {
            ParseError::Syntax(m) => Self::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                format!("malformed JSON: {m}"),
            ),
            ParseError::Field { field, .. } => Self::invalid_field(field, e.to_string()),
            ParseError::Invalid(v) => Self::invalid_field(&v.field, e.to_string()),
        }
    }
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
        Self::new(status, code, e.body_text())
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
