//! The HTTP request rate limit per principal (docs/policy.md "Rate
//! limit"): a keyed GCRA limiter from the `governor` crate in front of
//! every authenticated route. A request over the limit gets 429
//! `rate_limited` with `Retry-After` and never reaches its handler.

use std::num::NonZeroU32;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota};
use serde::{Deserialize, Serialize};
use serde_json::json;
use shared_protocol::api::Role;

use crate::auth::{bearer_token, Authenticator};
use crate::error::ApiError;

/// The `[policy.rate_limit]` table. Without `requests_per_minute` (the
/// default) there is no limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Sustained requests per minute one principal may make (at least 1).
    pub requests_per_minute: Option<u32>,
    /// Requests a principal may make at once after a quiet spell (at least
    /// 1). Default: `requests_per_minute`.
    pub burst: Option<u32>,
    /// Roles the limit does not apply to (`["provider"]`: an edge
    /// uploading a backlog of evidence after an outage must not be held
    /// back).
    pub exempt_roles: Vec<Role>,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            requests_per_minute: None,
            burst: None,
            exempt_roles: vec![Role::Provider],
        }
    }
}

impl RateLimitConfig {
    /// Problems of the table, as `(dotted key, message)`.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (key, v) in [
            ("requests_per_minute", self.requests_per_minute),
            ("burst", self.burst),
        ] {
            if v == Some(0) {
                out.push((
                    format!("policy.rate_limit.{key}"),
                    "must be at least 1 (leave it out for no limit)".to_string(),
                ));
            }
        }
        out
    }
}

/// Requests per principal; build with [`RateLimiter::new`], put in front
/// of the routes with [`RateLimiter::middleware`].
pub struct RateLimiter {
    limiter: DefaultKeyedRateLimiter<String>,
    exempt: Vec<Role>,
    per_minute: u32,
}

impl RateLimiter {
    /// The limiter of `cfg`; `None` when it sets no limit.
    pub fn new(cfg: &RateLimitConfig) -> Option<Arc<Self>> {
        let per_minute = NonZeroU32::new(cfg.requests_per_minute?)?;
        let burst = cfg.burst.and_then(NonZeroU32::new).unwrap_or(per_minute);
        Some(Arc::new(Self {
            limiter: DefaultKeyedRateLimiter::keyed(
                Quota::per_minute(per_minute).allow_burst(burst),
            ),
            exempt: cfg.exempt_roles.clone(),
            per_minute: per_minute.get(),
        }))
    }

    /// Count one request by `principal`; `Err(seconds)` (at least 1) when
    /// it is over the limit.
    pub fn check(&self, principal: &str) -> Result<(), u64> {
        // The principal's name is the key: its tokens share one limit.
        match self.limiter.check_key(&principal.to_string()) {
            Ok(()) => Ok(()),
            Err(not_until) => {
                let wait = not_until.wait_time_from(self.limiter.clock().now());
                Err((wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1))
            }
        }
    }

    /// The axum middleware (`axum::middleware::from_fn_with_state(limiter,
    /// RateLimiter::middleware)`), under the `Extension(Arc<Authenticator>)`
    /// layer. Requests without a known token pass on (their handler answers
    /// 401); tokens are looked up in the authenticator's cache only.
    pub async fn middleware(State(me): State<Arc<Self>>, req: Request, next: Next) -> Response {
        let principal = req
            .extensions()
            .get::<Arc<Authenticator>>()
            .zip(bearer_token(req.headers()).ok())
            .and_then(|(auth, token)| auth.authenticate(token));
        if let Some(p) = principal.filter(|p| !me.exempt.contains(&p.role)) {
            if let Err(retry) = me.check(&p.name) {
                return ApiError::new(
                    axum::http::StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    format!(
                        "principal `{}` is over the request rate limit of {} requests per minute; retry in {retry} s",
                        p.name, me.per_minute
                    ),
                )
                .with_details(json!({
                    "limit": "policy.rate_limit.requests_per_minute",
                    "requests_per_minute": me.per_minute,
                    "principal": p.name,
                    "retry_after_seconds": retry,
                }))
                .into_response();
            }
        }
        next.run(req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_and_the_next_request_waits_for_its_share() {
        let lim = RateLimiter::new(&RateLimitConfig {
            requests_per_minute: Some(6),
            burst: Some(2),
            ..Default::default()
        })
        .unwrap();
        assert!(lim.check("a").is_ok());
        assert!(lim.check("a").is_ok());
        // 6 per minute: one every 10 s.
        let retry = lim.check("a").unwrap_err();
        assert!((9..=10).contains(&retry), "retry after {retry} s");
        assert!(lim.check("b").is_ok(), "another principal has its own");
    }

    #[test]
    fn no_rate_means_no_limiter() {
        assert!(RateLimiter::new(&RateLimitConfig::default()).is_none());
    }
}
