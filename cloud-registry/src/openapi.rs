//! The OpenAPI 3.1 document of the HTTP API, generated from the handlers'
//! `#[utoipa::path]` annotations and the wire types' `ToSchema` derives
//! (docs/http-api.md "OpenAPI document"). Every feature router is an
//! [`OpenApiRouter`] whose routes are added with `routes!()`, so a route
//! is in the document by construction; [`crate::app::Registry::start`]
//! splits the composed router into the axum router and the document and
//! serves it at `GET /api/v1/openapi.json` (no token needed).
//!
//! [`finish`] adds what every operation shares, so the annotations name
//! only each route's own answers: the bearer security scheme (applied to
//! every operation that does not opt out with `security(())`), and the
//! error body ([`ErrorBody`]) for 400 (bad path, query or body), 401
//! (missing or unknown token), 403 (role not allowed), 413/415/422 (JSON
//! bodies) and 500 (internal).

use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use shared_protocol::api::ErrorBody;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{OpenApi as Document, RefOr, ResponseBuilder};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Name of the bearer-token security scheme in `components.securitySchemes`.
pub const BEARER: &str = "bearer";

/// The document's fixed parts: info, the error body and the tags.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Benchlink registry",
        description = "Capability registry, leases, actions and evidence, events, audit tasks, agent runtime and Earth command. Every error is `{\"error\": {\"code\", \"message\", \"details\"}}` (docs/http-api.md \"Errors\"). Authenticate with `Authorization: Bearer <token>`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    components(schemas(ErrorBody))
)]
struct BaseDoc;

/// The base document the composed router's paths are merged into.
pub fn base() -> Document {
    BaseDoc::openapi()
}

/// The error answer for `status`, described by `what`.
fn error_response(what: &str) -> RefOr<utoipa::openapi::Response> {
    RefOr::T(
        ResponseBuilder::new()
            .description(what)
            .content(
                "application/json",
                utoipa::openapi::ContentBuilder::new()
                    .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                        "ErrorBody",
                    ))))
                    .build(),
            )
            .build(),
    )
}

/// Add the bearer scheme and the shared error answers to every operation
/// of `doc` (see the module docs).
pub fn finish(mut doc: Document) -> Document {
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        BEARER,
        SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
    );
    doc.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new(
        BEARER,
        Vec::<String>::new(),
    )]);
    // operationIds are unique in a document: a handler name used by
    // several features (`list`, `get_one`), or a handler served at two
    // mounts (the health routes), gets its tag as a prefix, then a number.
    let mut seen = std::collections::BTreeSet::new();
    for item in doc.paths.paths.values_mut() {
        let ops = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for op in ops.into_iter().flatten() {
            let Some(id) = op.operation_id.clone() else {
                continue;
            };
            let tag = op
                .tags
                .as_ref()
                .and_then(|t| t.first())
                .cloned()
                .unwrap_or_else(|| "api".to_string());
            let mut unique = id.clone();
            let mut n = 1;
            while seen.contains(&unique) {
                unique = if n == 1 {
                    format!("{tag}_{id}")
                } else {
                    format!("{tag}_{id}_{n}")
                };
                n += 1;
            }
            seen.insert(unique.clone());
            op.operation_id = Some(unique);
        }
    }
    for item in doc.paths.paths.values_mut() {
        let ops = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for op in ops.into_iter().flatten() {
            let secured = op.security.is_none();
            let has_params = op.parameters.as_ref().is_some_and(|p| !p.is_empty());
            let json_body = op
                .request_body
                .as_ref()
                .is_some_and(|b| b.content.contains_key("application/json"));
            let body = op.request_body.is_some();
            let mut add = |status: &str, what: &str| {
                op.responses
                    .responses
                    .entry(status.to_string())
                    .or_insert_with(|| error_response(what));
            };
            if has_params || body {
                add(
                    "400",
                    "`invalid_path`, `invalid_query`, `malformed_json` or `invalid_request`: the path, query or body cannot be read",
                );
            }
            if secured {
                add(
                    "401",
                    "`unauthenticated`: no bearer token, or one the registry does not know or has revoked",
                );
                add(
                    "403",
                    "`forbidden`: the token's role may not do this (`details.role`, `details.allowed_roles`)",
                );
            }
            if body {
                add(
                    "413",
                    "`body_too_large`: the body is over `http.body_limit_bytes`",
                );
                add(
                    "415",
                    "`unsupported_media_type`: the body is not of the documented content type",
                );
            }
            if json_body {
                add(
                    "422",
                    "`invalid_field`: a field is missing, of the wrong type or out of range (`details.field`)",
                );
            }
            add(
                "500",
                "`internal`: an unexpected failure, logged by the registry",
            );
        }
    }
    doc
}

/// Serve `GET /api/v1/openapi.json`: the document, filled in once the
/// composed router was split ([`set_document`]).
pub fn router() -> (OpenApiRouter, Arc<OnceLock<String>>) {
    let cell = Arc::new(OnceLock::new());
    let router = OpenApiRouter::new()
        .routes(routes!(openapi_json))
        .with_state(cell.clone());
    (router, cell)
}

/// Store the finished document for [`router`]'s route.
pub fn set_document(cell: &OnceLock<String>, doc: &Document) {
    let json = doc
        .to_pretty_json()
        .expect("an OpenAPI document serializes to JSON");
    let _ = cell.set(json);
}

/// This OpenAPI 3.1 document. No token needed: a client generator reads
/// the contract before it has credentials.
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    tag = "meta",
    security(()),
    responses(
        (status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json", body = serde_json::Value),
    )
)]
async fn openapi_json(State(cell): State<Arc<OnceLock<String>>>) -> Response {
    let body = cell.get().cloned().unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Bytes of any media type (for the OpenAPI document: artifact bytes,
/// live frames, uploads).
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)]
pub struct Binary(Vec<u8>);
