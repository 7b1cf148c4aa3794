//! The web console's static assets under `/console/` (issue 17).
//!
//! - `GET /console` redirects (308) to `/console/`.
//! - `GET /console/` is `index.html`; `GET /console/{path}` is the file
//!   `cloud-registry/console/{path}`, embedded in the binary at build time
//!   (every file of that folder, see `build.rs`). An unknown path is 404
//!   `not_found` in the JSON error body.
//! - Every answer carries [`CONTENT_SECURITY_POLICY`],
//!   `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`,
//!   `X-Frame-Options: DENY` and `Cache-Control: no-cache`.
//!
//! The assets need no token: the page signs in with a bearer token it
//! keeps in `sessionStorage` and sends on each API call.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

use crate::error::ApiError;

/// Every embedded file: (path relative to `console/`, bytes).
const ASSETS: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/console_assets.rs"));

/// The console's Content-Security-Policy: only its own origin, no inline
/// script or style, no `eval`, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
style-src 'self'; img-src 'self' blob: data:; media-src 'self' blob:; connect-src 'self'; \
object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

/// The console's routes (full paths).
pub fn router() -> Router {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route("/console/", get(|| async { asset("index.html") }))
        .route(
            "/console/{*path}",
            get(|Path(path): Path<String>| async move { asset(&path) }),
        )
}

/// The embedded file at `path` (relative to `console/`), if any.
pub fn lookup(path: &str) -> Option<&'static [u8]> {
    ASSETS.iter().find(|(p, _)| *p == path).map(|(_, b)| *b)
}

/// Content type by file extension; `application/octet-stream` for others.
pub fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("json") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn asset(path: &str) -> Response {
    let mut resp = match lookup(path) {
        Some(bytes) => {
            let mut r = (StatusCode::OK, bytes).into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(content_type(path)),
            );
            r
        }
        None => ApiError::not_found("console asset", path).into_response(),
    };
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_core_asset_is_embedded() {
        for p in ["index.html", "app.js", "api.js", "dom.js", "style.css"] {
            assert!(lookup(p).is_some(), "{p} not embedded");
        }
        assert_eq!(content_type("app.js"), "text/javascript; charset=utf-8");
        assert_eq!(content_type("x.unknown"), "application/octet-stream");
    }
}
