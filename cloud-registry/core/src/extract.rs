//! Request extractors: `ValidJson<T>` parses a body with the protocol's
//! field-naming validation instead of axum's generic JSON errors;
//! `ApiQuery<T>` does the same for query strings (400 `invalid_query`
//! naming the parameter); [`list_limit`] reads a list's `limit`.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
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
    if is_body_timeout(&e) {
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

/// True when `err` (a body read error, through its sources) is the
/// request-body inactivity timeout of the registry's HTTP listener.
pub fn is_body_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cur = e.source();
    }
    false
}

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
