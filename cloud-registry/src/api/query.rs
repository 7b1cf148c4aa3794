//! Query strings and optional bodies: [`ApiQuery`] (a JSON 400
//! `invalid_query` naming the parameter), [`OptionalJson`], and the
//! parsers of list, range and wire-name parameters every feature's
//! handlers share (docs/http-api.md "Errors").

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use shared_protocol::Validate;

use crate::error::ApiError;

pub use crate::extract::{list_limit, plain_query_problem, ApiQuery};

/// A JSON body that may be absent: an empty body gives `T::default()`;
/// otherwise as [`crate::extract::ValidJson`] (400 `malformed_json`, 422
/// `invalid_field`, 413 `body_too_large`, 415 without a JSON content type).
pub struct OptionalJson<T>(pub T);

impl<S, T> FromRequest<S> for OptionalJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Validate + Default,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = crate::extract::is_json_content_type(req.headers());
        let limit = req.extensions().get::<crate::extract::BodyLimit>().copied();
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| crate::extract::body_read_error(e, limit))?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(T::default()));
        }
        if !is_json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "expected `Content-Type: application/json`",
            ));
        }
        Ok(OptionalJson(crate::extract::parse_object(&bytes)?))
    }
}

/// Parse a comma-separated list of wire names (`?types=a,b`); a bad one is
/// 400 `invalid_query` "query parameter `types`: ..." with `details.param`.
pub fn parse_list<T: std::str::FromStr>(param: &str, raw: &str) -> Result<Vec<T>, ApiError>
where
    T::Err: std::fmt::Display,
{
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<T>()
                .map_err(|e| ApiError::invalid_query(param, e))
        })
        .collect()
}

/// Parse query parameter `param` as a whole number in `min..=max`
/// (absent or empty: `None`). Anything else is 400 `invalid_query` naming
/// the parameter and the range: "query parameter `wait_seconds`: 301 is
/// out of range 0..=300", also for negative numbers and numbers too large
/// for any integer type.
pub fn parse_in_range(
    param: &str,
    raw: Option<&str>,
    min: u64,
    max: u64,
) -> Result<Option<u64>, ApiError> {
    let Some(s) = raw.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ApiError::invalid_query(
            param,
            format!("expected a whole number from {min} to {max}, got `{s}`"),
        ));
    }
    match s.parse::<u64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(Some(v)),
        _ => Err(ApiError::invalid_query(
            param,
            format!("{s} is out of range {min}..={max}"),
        )),
    }
}

/// Parse one wire name of a query parameter (absent or empty: `None`); a
/// bad one is 400 `invalid_query` as for [`parse_list`].
pub fn parse_one<T: std::str::FromStr>(
    param: &str,
    raw: Option<&str>,
) -> Result<Option<T>, ApiError>
where
    T::Err: std::fmt::Display,
{
    match raw {
        None | Some("") => Ok(None),
        Some(s) => s
            .parse::<T>()
            .map(Some)
            .map_err(|e| ApiError::invalid_query(param, e)),
    }
}
