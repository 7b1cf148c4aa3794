//! A standby's proxy: every request goes to the leader as it came
//! (method, path and query, headers but the hop-by-hop ones, the body as a
//! stream) and the leader's answer comes back the same way, event streams
//! included. Without a reachable leader the answer is 503
//! `leader_unavailable` with `Retry-After: 1`. `/healthz` is answered
//! here: a load balancer asks each replica about itself.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::json;

use super::Leader;
use crate::error::ApiError;

/// Request header a standby adds: its replica id. A request that already
/// carries it is not forwarded again (two standbys that each think the
/// other leads answer 503 instead of passing it back and forth).
pub const FORWARDED_BY: &str = "x-benchlink-forwarded-by";

/// Response header a standby adds: the replica id of the leader that
/// answered.
pub const SERVED_BY: &str = "x-benchlink-served-by";

/// Headers of one connection, not of the request (RFC 9110 §7.6.1), and
/// those the proxy sets itself.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

/// The proxy's state.
#[derive(Clone)]
pub struct Forwarder {
    leader: Arc<RwLock<Option<Leader>>>,
    replica: HeaderValue,
    own_url: String,
    client: reqwest::Client,
}

impl Forwarder {
    /// Forward to whoever `leader` names (updated by the standby loop),
    /// never to `own_url`.
    pub fn new(
        leader: Arc<RwLock<Option<Leader>>>,
        replica: String,
        own_url: String,
        connect_timeout: Duration,
    ) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Self {
            leader,
            replica: HeaderValue::from_str(&replica)
                .unwrap_or_else(|_| HeaderValue::from_static("standby")),
            own_url,
            client,
        }
    }
}

/// `GET /healthz` (and `/api/v1/healthz`) answered by the standby itself;
/// every other path and method forwarded.
pub fn router(forwarder: Forwarder) -> Router {
    Router::new()
        .route("/healthz", axum::routing::get(healthz))
        .route("/api/v1/healthz", axum::routing::get(healthz))
        .fallback(forward)
        .with_state(forwarder)
}

/// 200 `{"status": "standby", "cluster": {"role": "standby", "replica",
/// "leader": {"replica", "url", "epoch"} | null}}`: the standby runs and
/// forwards (or, with `leader` null, answers 503 until one leads).
async fn healthz(State(f): State<Forwarder>) -> Response {
    let leader = f.leader.read().ok().and_then(|l| l.clone());
    let body = json!({
        "status": "standby",
        "cluster": {
            "role": "standby",
            "replica": f.replica.to_str().unwrap_or("standby"),
            "leader": leader.map(|l| json!({"replica": l.replica, "url": l.url, "epoch": l.epoch})),
        },
    });
    ([(header::CACHE_CONTROL, "no-store")], axum::Json(body)).into_response()
}

/// 503 `leader_unavailable`; `details.outcome` is `not_forwarded`
/// (nothing reached the leader: nothing was done) or `unknown` (the leader
/// went away after it got the request).
fn unavailable(message: String, leader: Option<&Leader>, outcome: &str) -> Response {
    let mut resp = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "leader_unavailable",
        message,
    )
    .with_details(json!({
        "retryable": true,
        "outcome": outcome,
        "leader": leader.map(|l| json!({"replica": l.replica, "url": l.url, "epoch": l.epoch})),
    }))
    .into_response();
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

fn copy_headers(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            to.append(name.clone(), value.clone());
        }
    }
}

async fn forward(State(f): State<Forwarder>, req: Request) -> Response {
    let leader = f.leader.read().ok().and_then(|l| l.clone());
    let Some(leader) = leader.filter(|l| l.url != f.own_url) else {
        return unavailable(
            "this replica stands by and no other replica leads yet: retry".into(),
            None,
            "not_forwarded",
        );
    };
    if req.headers().contains_key(FORWARDED_BY) {
        return unavailable(
            format!(
                "the request carries {FORWARDED_BY}: another standby forwarded it here, so the \
                 two name each other as leader until one takes over (retry); a client must not \
                 send this header"
            ),
            Some(&leader),
            "not_forwarded",
        );
    }
    let (parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut headers = HeaderMap::new();
    copy_headers(&parts.headers, &mut headers);
    headers.insert(HeaderName::from_static(FORWARDED_BY), f.replica.clone());
    let sent = f
        .client
        .request(parts.method, format!("{}{path}", leader.url))
        .headers(headers)
        .body(reqwest::Body::wrap_stream(body.into_data_stream()))
        .send()
        .await;
    let answer = match sent {
        Ok(a) => a,
        Err(e) if e.is_connect() => {
            tracing::debug!(leader = %leader.url, error = %e, "cannot forward a request to the leader");
            return unavailable(
                format!(
                    "the leader ({}) does not answer; a standby takes over within seconds: retry",
                    leader.replica
                ),
                Some(&leader),
                "not_forwarded",
            );
        }
        Err(e) => {
            // Sent, but the answer never came: the leader may have done it.
            tracing::debug!(leader = %leader.url, error = %e, "the leader went away before answering a forwarded request");
            return unavailable(
                format!(
                    "the leader ({}) went away before it answered; it may have done the request \
                     (a lease request may be stored and granted later): retry with the same \
                     Idempotency-Key to get its outcome",
                    leader.replica
                ),
                Some(&leader),
                "unknown",
            );
        }
    };
    let status = answer.status();
    let mut headers = HeaderMap::new();
    copy_headers(answer.headers(), &mut headers);
    let mut resp = Response::new(Body::from_stream(answer.bytes_stream()));
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    if let Ok(v) = HeaderValue::from_str(&leader.replica) {
        resp.headers_mut()
            .insert(HeaderName::from_static(SERVED_BY), v);
    }
    resp
}
