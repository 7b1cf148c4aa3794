//! The web console's serving: assets under `/console/` with their content
//! types and security headers, the redirect, 404 for an unknown asset, and
//! `GET /api/v1/auth/whoami`.

mod common;

use common::*;
use reqwest::redirect::Policy;
use reqwest::StatusCode;
use shared_protocol::api::Role;

const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
img-src 'self' blob: data:; media-src 'self' blob:; connect-src 'self'; \
object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

fn assert_security_headers(resp: &reqwest::Response) {
    let h = resp.headers();
    let csp = h["content-security-policy"].to_str().unwrap();
    assert_eq!(csp, CSP, "{}", resp.url());
    assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"));
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["referrer-policy"], "no-referrer");
    assert_eq!(h["x-frame-options"], "DENY");
}

#[tokio::test]
async fn the_console_is_served_with_its_types_and_security_headers() {
    let (_dir, reg, _api, _admin) = registry().await;
    let base = reg.base_url();
    let http = reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap();

    let r = http.get(format!("{base}/console")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(r.headers()["location"], "/console/");

    let r = http.get(format!("{base}/console/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_security_headers(&r);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    let html = r.text().await.unwrap();
    assert!(html.contains(r#"<script type="module" src="/console/app.js">"#));
    assert!(!html.contains("<script>"), "no inline script");

    for (path, ty) in [
        ("app.js", "text/javascript; charset=utf-8"),
        ("api.js", "text/javascript; charset=utf-8"),
        ("dom.js", "text/javascript; charset=utf-8"),
        ("pages/lab.js", "text/javascript; charset=utf-8"),
        ("style.css", "text/css; charset=utf-8"),
    ] {
        let r = http
            .get(format!("{base}/console/{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        assert_security_headers(&r);
        assert_eq!(r.headers()["content-type"], ty, "{path}");
        let body = r.bytes().await.unwrap();
        let on_disk =
            std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/console/").to_string() + path)
                .unwrap();
        assert_eq!(body.as_ref(), on_disk.as_slice(), "{path} is the file");
    }

    for path in ["nope.js", "pages/", "pages/missing.js", "..%2fCargo.toml"] {
        let r = http
            .get(format!("{base}/console/{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path}");
        assert_security_headers(&r);
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "not_found", "{path}");
    }
}

#[tokio::test]
async fn whoami_names_the_tokens_principal_and_role() {
    let (_dir, reg, api, admin) = registry().await;
    let viewer = new_token(&reg, Role::Viewer, "lab-viewer").await;

    let (s, v) = api.get("/api/v1/auth/whoami", Some(&admin)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["role"], "super_admin");
    assert_eq!(v["principal"], "bootstrap-admin");

    let (s, v) = api.get("/api/v1/auth/whoami", Some(&viewer)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        v,
        serde_json::json!({"principal": "lab-viewer", "role": "viewer"})
    );

    let got = api.get("/api/v1/auth/whoami", None).await;
    assert_error(&got, StatusCode::UNAUTHORIZED, "unauthenticated");
    let got = api.get("/api/v1/auth/whoami", Some("not-a-token")).await;
    assert_error(&got, StatusCode::UNAUTHORIZED, "unauthenticated");
}
