//! Request extractors: `ValidJson<T>` parses a body with the protocol's
//! field-naming validation instead of axum's generic JSON errors.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use serde::de::DeserializeOwned;
use shared_protocol::Validate;

use crate::error::ApiError;

/// A JSON body parsed with [`shared_protocol::parse_json`]: malformed JSON is
/// 400 `malformed_json`, a bad field is 422 `invalid_field` with
/// `details.field`, a body over the router's limit is 413 `body_too_large`.
pub struct ValidJson<T>(pub T);

impl<S, T> FromRequest<S> for ValidJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Validate,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.starts_with("application/json"))
            .unwrap_or(false);
        if !is_json {
            return Err(ApiError::new(
                axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "expected `Content-Type: application/json`",
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            let status = e.status();
            if status == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(status, "body_too_large", e.body_text())
            } else {
                ApiError::bad_request(e.body_text())
            }
        })?;
        Ok(ValidJson(shared_protocol::parse_json(&bytes)?))
    }
}
