//! What every feature's HTTP routes share (docs/http-api.md,
//! docs/architecture.md "Registry internals"). Each feature folder owns its
//! handlers, their state and the HTTP mapping of its errors
//! (`providers/api.rs`, `leases/api.rs`, `events/api.rs`, `tokens/api.rs`,
//! `sessions/api.rs`, `audit/api.rs`); `app.rs` merges their routers.
//! - [`query`]: query strings and optional bodies;
//! - [`with_fallbacks`]: the JSON answers for unknown routes, wrong
//!   methods and axum's own rejections.
//!
//! Handlers authenticate with the [`crate::auth::Principal`] extractor,
//! parse bodies with [`crate::extract::ValidJson`] and answer JSON; every
//! error is `{"error": {"code", "message", "details"}}`.

pub mod query;

use axum::http::StatusCode;
use axum::Router;

pub use query::{
    list_limit, parse_in_range, parse_list, parse_one, plain_query_problem, ApiQuery, OptionalJson,
};

use crate::error::ApiError;

async fn no_route() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "route_not_found", "no such endpoint")
}

async fn wrong_method() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this endpoint does not accept that method",
    )
}

/// JSON fallbacks for unknown routes and methods, and JSON for axum's
/// own plain-text 400 rejections (see [`json_rejection`]); apply last.
pub fn with_fallbacks(router: Router) -> Router {
    router
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::middleware::map_response(json_rejection))
}

/// Turns a plain-text 400 answer, which only axum's own extractors give
/// (every handler answers JSON), into the JSON error shape. A path
/// parameter that does not parse (`/agents/proposals/x/apply`, or a
/// percent-encoding that is not UTF-8) is 400 `invalid_path` with the
/// parameter in `details.param` when axum names it: "invalid path
/// parameter `proposal_id`: cannot parse `x` as an integer"; anything else
/// is 400 `invalid_request` with axum's text.
async fn json_rejection(resp: axum::response::Response) -> axum::response::Response {
    let plain = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"));
    if resp.status() != StatusCode::BAD_REQUEST || !plain {
        return resp;
    }
    use axum::response::IntoResponse;
    let text = match axum::body::to_bytes(resp.into_body(), 16 * 1024).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => String::new(),
    };
    path_rejection_error(&text).into_response()
}

/// The JSON error for the text of an axum rejection (see
/// [`json_rejection`]).
fn path_rejection_error(text: &str) -> ApiError {
    let Some(detail) = text.strip_prefix("Invalid URL: ") else {
        return ApiError::bad_request(if text.is_empty() {
            "bad request".to_string()
        } else {
            text.to_string()
        });
    };
    // axum: "Cannot parse `proposal_id` with value `x` to a `i64`" (a
    // named parameter) or "Cannot parse `x` to a `i64`" (a lone one).
    let parsed = detail.strip_prefix("Cannot parse `").and_then(|rest| {
        let (head, ty) = rest.split_once("` to a `")?;
        let ty = ty.trim_end_matches('`');
        Some(match head.split_once("` with value `") {
            Some((param, value)) => (Some(param), value, ty),
            None => (None, head, ty),
        })
    });
    let (message, details) = match parsed {
        Some((param, value, ty)) => {
            let integer = ty.len() > 1
                && (ty.starts_with('i') || ty.starts_with('u'))
                && (ty[1..].bytes().all(|b| b.is_ascii_digit()) || &ty[1..] == "size");
            let kind = if integer { "an integer" } else { ty };
            match param {
                Some(param) => (
                    format!("invalid path parameter `{param}`: cannot parse `{value}` as {kind}"),
                    serde_json::json!({ "param": param }),
                ),
                None => (
                    format!("invalid path parameter: cannot parse `{value}` as {kind}"),
                    serde_json::json!({}),
                ),
            }
        }
        None => (format!("invalid path: {detail}"), serde_json::json!({})),
    };
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", message).with_details(details)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axum_path_rejections_become_invalid_path() {
        let e = path_rejection_error("Invalid URL: Cannot parse `x` to a `u64`");
        assert_eq!(
            (e.status, e.code),
            (StatusCode::BAD_REQUEST, "invalid_path")
        );
        assert_eq!(
            e.message,
            "invalid path parameter: cannot parse `x` as an integer"
        );
        let e = path_rejection_error(
            "Invalid URL: Cannot parse `proposal_id` with value `x` to a `i64`",
        );
        assert_eq!(e.details, serde_json::json!({"param": "proposal_id"}));
        let e = path_rejection_error("Failed to buffer the request body");
        assert_eq!(e.code, "invalid_request");
        assert_eq!(e.message, "Failed to buffer the request body");
    }
}
