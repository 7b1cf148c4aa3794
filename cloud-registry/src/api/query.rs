//! Query strings and optional bodies: [`ApiQuery`] (a JSON 400
//! `invalid_query` naming the parameter), [`OptionalJson`], and the
//! parsers of list, range and wire-name parameters every feature's
//! handlers share (docs/http-api.md "Errors").

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use shared_protocol::Validate;

use crate::error::ApiError;

/// `Query<T>` whose rejection is a JSON 400 `invalid_query` naming the
/// parameter in `details.param` (when the parameter is known) and saying
/// in plain words what was expected: "query parameter `limit`: expected a
/// whole number, got `ten`".
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| ApiQuery(v))
            .map_err(|e| query_error(&parts.uri, &e))
    }
}

/// What axum's `Query` wraps its deserialization error in.
type QueryPathError = serde_path_to_error::Error<serde::de::value::Error>;

/// The 400 `invalid_query` for a query string that `Query` refused: the
/// parameter from the deserializer's path (or from a "missing field" /
/// "duplicate field" message), the problem from [`plain_query_problem`].
fn query_error(uri: &axum::http::Uri, rejection: &QueryRejection) -> ApiError {
    let mut source = std::error::Error::source(rejection);
    let found = loop {
        match source {
            None => break None,
            Some(e) => match e.downcast_ref::<QueryPathError>() {
                Some(e) => break Some(e),
                None => source = e.source(),
            },
        }
    };
    let Some(e) = found else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("invalid query string: {}", rejection.body_text()),
        );
    };
    let inner = e.inner().to_string();
    let named = |prefix: &str| {
        inner
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('`'))
            .and_then(|rest| rest.strip_suffix('`'))
            .map(str::to_string)
    };
    let path = e.path().to_string();
    let param = if !path.is_empty() && !path.starts_with(['.', '?']) {
        Some(path)
    } else {
        named("missing field ").or_else(|| named("duplicate field "))
    };
    let Some(param) = param else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!(
                "invalid query string: {}",
                plain_query_problem(&inner, None)
            ),
        );
    };
    let value = Query::<Vec<(String, String)>>::try_from_uri(uri)
        .ok()
        .and_then(|Query(pairs)| pairs.into_iter().find(|(k, _)| *k == param))
        .map(|(_, v)| v);
    ApiError::invalid_query(&param, plain_query_problem(&inner, value.as_deref()))
}

/// Say in plain words what is wrong with a query parameter's `value`, from
/// the query deserializer's `message` (Rust's number parsing and serde's
/// wording): `invalid digit found in string` becomes "expected a whole
/// number, got `ten`".
pub fn plain_query_problem(message: &str, value: Option<&str>) -> String {
    let got = value.map(|v| format!(", got `{v}`")).unwrap_or_default();
    let negative = value.is_some_and(|v| {
        v.strip_prefix('-')
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
    });
    match message {
        "invalid digit found in string" if negative => {
            format!("expected a whole number of 0 or more{got}")
        }
        "invalid digit found in string" => format!("expected a whole number{got}"),
        "cannot parse integer from empty string" => {
            "expected a whole number, got an empty value".to_string()
        }
        "number too large to fit in target type" => match value {
            Some(v) => format!("`{v}` is too large"),
            None => "the number is too large".to_string(),
        },
        "number too small to fit in target type" => match value {
            Some(v) => format!("`{v}` is too small"),
            None => "the number is too small".to_string(),
        },
        "invalid float literal" | "cannot parse float from empty string" => {
            format!("expected a number{got}")
        }
        "provided string was not `true` or `false`" => {
            format!("expected `true` or `false`{got}")
        }
        m if m.starts_with("missing field ") => "missing; it is required".to_string(),
        m if m.starts_with("duplicate field ") => "given more than once".to_string(),
        m => crate::error::plain_json_message(m),
    }
}

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

/// A list's `limit` query parameter: `default` when absent, at most `max`
/// (more is cut to `max`), 0 refused with 400 `invalid_query`.
pub fn list_limit(limit: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    match limit {
        None => Ok(default.min(max)),
        Some(0) => Err(ApiError::invalid_query(
            "limit",
            format!("0 is out of range 1..={max}"),
        )),
        Some(n) => Ok(n.min(max)),
    }
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
