//! The HTTP access log and request ids (docs/install-registry.md
//! "Logs"): every request gets an id, kept from the client's
//! `x-request-id` when it is a plain token and made (a UUID v4) otherwise;
//! the answer carries it back in `x-request-id`, and one log line per
//! answered request, target `benchlink::access`, gives `request_id`,
//! `method`, `route` (the route's pattern, e.g.
//! `/api/v1/capability-leases/{lease_id}/release`, or `-` when none
//! matched), `path`, `status` and `latency_ms` (until the response head,
//! monotonic). Liveness and metrics scrapes (`/healthz`, `/metrics`,
//! `/time`) log at DEBUG, everything else at INFO;
//! `RUST_LOG=info,benchlink::access=off` turns the log off.
//!
//! The same latency goes to `benchlink_http_request_duration_seconds`
//! ([`crate::metrics::HttpMetrics`]), labelled by method, route pattern
//! (`unmatched` when none matched: never the raw path, whose values have
//! no bound) and status.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

/// The header that carries the request id, both ways.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Longest request id taken from a client, bytes.
pub const MAX_CLIENT_ID_LEN: usize = 64;

/// The request's id: the client's `x-request-id` when it is 1 to
/// [`MAX_CLIENT_ID_LEN`] of `[A-Za-z0-9._:-]`, else a new UUID v4 (32 hex
/// digits), so a log line can neither be forged into two nor grow without
/// bound.
pub fn request_id(given: Option<&HeaderValue>) -> HeaderValue {
    if let Some(given) = given.filter(|v| is_plain_id(v.as_bytes())) {
        return given.clone();
    }
    HeaderValue::from_str(&uuid::Uuid::new_v4().simple().to_string())
        .expect("hex digits are a header value")
}

/// True for 1 to [`MAX_CLIENT_ID_LEN`] bytes of `[A-Za-z0-9._:-]`.
pub fn is_plain_id(id: &[u8]) -> bool {
    !id.is_empty()
        && id.len() <= MAX_CLIENT_ID_LEN
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// Wrap `router` in the request id, the access log and the request
/// duration histogram (`http`): the id is set on the request before
/// anything else sees it and copied onto every answer, the fallbacks' and
/// the body limit's included.
pub fn layer(router: axum::Router, http: crate::metrics::HttpMetrics) -> axum::Router {
    router.layer(axum::middleware::from_fn_with_state(http, log))
}

/// The access-log middleware (see the module doc).
async fn log(
    State(http): State<crate::metrics::HttpMetrics>,
    mut request: Request,
    next: Next,
) -> Response {
    let start = Instant::now();
    let header = HeaderName::from_static(REQUEST_ID_HEADER);
    let id = request_id(request.headers().get(&header));
    request.headers_mut().insert(header.clone(), id.clone());
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let mut response = next.run(request).await;
    let elapsed = start.elapsed();
    let latency_ms = elapsed.as_secs_f64() * 1000.0;
    http.observe(
        &method,
        matched.as_ref().map_or("unmatched", |m| m.as_str()),
        response.status(),
        elapsed,
    );
    let status = response.status().as_u16();
    let route = matched.as_ref().map_or("-", |m| m.as_str());
    let shown = id.to_str().unwrap_or("-");
    if matches!(
        path.as_str(),
        "/healthz" | "/metrics" | "/time" | "/api/v1/healthz" | "/api/v1/metrics" | "/api/v1/time"
    ) {
        tracing::debug!(target: "benchlink::access", request_id = shown, %method, route, path, status, latency_ms = format_args!("{latency_ms:.2}"), "http");
    } else {
        tracing::info!(target: "benchlink::access", request_id = shown, %method, route, path, status, latency_ms = format_args!("{latency_ms:.2}"), "http");
    }
    response.headers_mut().insert(header, id);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_client_ids_are_kept_and_others_replaced() {
        assert!(is_plain_id(b"req-42.a_b:c"));
        assert!(!is_plain_id(b""));
        assert!(!is_plain_id(b"two words"));
        assert!(!is_plain_id(b"line\nbreak"));
        assert!(!is_plain_id(&[b'a'; MAX_CLIENT_ID_LEN + 1]));
        let kept = HeaderValue::from_static("abc-1");
        assert_eq!(request_id(Some(&kept)), "abc-1");
        let made = request_id(Some(&HeaderValue::from_static("x y")));
        let made = made.to_str().unwrap();
        assert_eq!(made.len(), 32, "{made}");
        assert!(is_plain_id(made.as_bytes()));
        assert_ne!(request_id(None), request_id(None));
    }
}
