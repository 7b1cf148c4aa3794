//! Request extractors: `ValidJson<T>` parses a body with the protocol's
//! field-naming validation instead of axum's generic JSON errors.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;
use shared_protocol::Validate;

use crate::error::ApiError;

/// A JSON body parsed with [`shared_protocol::parse_json`]: malformed JSON
/// (not JSON, or cut short) is 400 `malformed_json`, a body that is not a
/// JSON object is 400 `invalid_request`, a bad field (missing, unknown
/// value, wrong JSON type, out of range) is 422 `invalid_field` with
/// `details.field`, a body over the router's limit is 413 `body_too_large`,
/// a body that stalls is 408 `body_read_timeout`,
/// a `Content-Type` other than JSON (see [`is_json_content_type`]) is 415
/// `unsupported_media_type`.
pub struct ValidJson<T>(pub T);

/// The router's body limit in bytes (`http.body_limit_bytes`), as a
/// request extension, so a refusal can say what it is.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// 413 `body_too_large` naming the limit when the router has one.
pub fn body_too_large(limit: Option<BodyLimit>) -> ApiError {
    let message = match limit {
        Some(BodyLimit(n)) => format!(
            "the request body is larger than the registry accepts ({n} bytes, `http.body_limit_bytes`)"
        ),
        None => "the request body is larger than the registry accepts".to_string(),
    };
    ApiError::new(
        axum::http::StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        message,
    )
}

/// The answer to a request body that could not be read: 413
/// `body_too_large` over the limit, 408 `body_read_timeout` when the client
/// paused longer than `http.body_read_timeout_ms`, 400 otherwise.
pub fn body_read_error(e: BytesRejection, limit: Option<BodyLimit>) -> ApiError {
    if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        return body_too_large(limit);
    }
    if crate::http_server::is_body_timeout(&e) {
        return ApiError::new(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            "body_read_timeout",
            "the request body stopped arriving for longer than the registry waits \
             (`http.body_read_timeout_ms`)",
        );
    }
    ApiError::bad_request(e.body_text())
}

/// True when `headers` declare a JSON body: the media type of
/// `Content-Type` is `application/json` in any letter case, with or without
/// parameters (`application/json; charset=utf-8`), or a structured
/// `+json` type such as `application/merge-patch+json`.
pub fn is_json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let media_type = value.split(';').next().unwrap_or("").trim();
    let Some((kind, subtype)) = media_type.split_once('/') else {
        return false;
    };
    let subtype = subtype.to_ascii_lowercase();
    kind.trim().eq_ignore_ascii_case("application")
        && (subtype == "json" || (subtype.len() > 5 && subtype.ends_with("+json")))
}

impl<S, T> FromRequest<S> for ValidJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Validate,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json_content_type(req.headers()) {
            return Err(ApiError::new(
                axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "expected `Content-Type: application/json`",
            ));
        }
        let limit = req.extensions().get::<BodyLimit>().copied();
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| body_read_error(e, limit))?;
        Ok(ValidJson(parse_object(&bytes)?))
    }
}

/// Parse a request body that must be a JSON object into `T` with
/// [`shared_protocol::parse_json`]. A well-formed body that is not an
/// object (`[]`, `"x"`, `42`, `null`) is 400 `invalid_request` "request
/// body must be a JSON object" (serde would otherwise accept an array of
/// the fields, or answer with its own type names); other errors as
/// [`ApiError`]'s `From<ParseError>`.
pub fn parse_object<T: DeserializeOwned + Validate>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        // Malformed JSON keeps its own answer.
        serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
            .map_err(|e| ApiError::from(shared_protocol::ParseError::Syntax(e.to_string())))?;
        return Err(not_an_object());
    }
    Ok(shared_protocol::parse_json(bytes)?)
}

/// 400 `invalid_request`: the body is JSON but not an object.
pub fn not_an_object() -> ApiError {
    ApiError::bad_request("request body must be a JSON object")
        .with_details(serde_json::json!({ "field": "" }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, value.parse().unwrap());
        h
    }

    #[test]
    fn json_content_types_match_in_any_case_and_with_parameters() {
        for ok in [
            "application/json",
            "APPLICATION/JSON",
            "Application/Json",
            "application/json; charset=utf-8",
            "application/json;charset=UTF-8",
            " application/json ",
            "application/merge-patch+json",
        ] {
            assert!(is_json_content_type(&with(ok)), "{ok}");
        }
        for bad in [
            "text/plain",
            "application/jsonx",
            "application/x-www-form-urlencoded",
            "application/+json",
            "json",
            "",
        ] {
            assert!(!is_json_content_type(&with(bad)), "{bad}");
        }
        assert!(!is_json_content_type(&HeaderMap::new()));
    }
}
