//! The capability event stream (seed 001 §7) as Server-Sent Events:
//! `GET /api/v1/capability-events/stream`, any role.
//!
//! Each event is `id: {event_id}`, `event: {event_type}`,
//! `data: {CapabilityEvent JSON}`.
//!
//! # Resuming
//! With a `Last-Event-ID` header (wins) or `?after=N`, the stream first
//! replays events with `event_id > N` from the append-only `events` table,
//! then continues live, with no gap and no duplicate: the live subscription
//! is taken before the replay, and live events at or below the last id
//! sent are skipped (see [`crate::events::follow`]). Without either, the stream
//! starts at the current end of the log (live only), or, with `?tail=N`
//! (at most [`MAX_TAIL`]), N events before it: the last N events of the
//! log, filtered like the rest, then live.
//!
//! # Slow clients
//! When a client reads so slowly that the live channel drops events for it,
//! it gets one `event: stream_gap` (data: `StreamGap` with the dropped
//! range, no `id:`), and the server then replays that range from the table,
//! so the client still receives every event, in order. Replay from the
//! table is safe because the log is append-only; the client needs to do
//! nothing.
//!
//! # Filters
//! `?types=lease_granted,lease_released` (event types),
//! `?capability_id=`, `?provider_id=`, `?lease_id=`: only matching events
//! are sent. A keep-alive comment goes out every 15 s.
//!
//! # Roles
//! Events only admins may read ([`EventType::admin_only`]: the agent
//! proposals, admin-only in the API) are left out of every other role's
//! stream, in replay and live alike; asking for them by `?types=` gives
//! nothing rather than an error.
//!
//! # Revoked tokens
//! The stream re-checks its token every [`TOKEN_RECHECK_INTERVAL`]
//! through the same lookup the HTTP authentication uses (the in-memory
//! cache; the store is read at most once per
//! [`crate::auth::REVOCATION_CHECK_INTERVAL`] for revocations made by
//! another process), and before each event against the cache. Once the
//! token is revoked (or its principal's role changed) the stream ends,
//! and nothing is sent after that check; a reconnect gets 401.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Deserialize;
use shared_protocol::event::{CapabilityEvent, EventType, StreamGap};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::{parse_list, ApiQuery};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::events::follow::{EventFollower, Followed};
use shared_protocol::api::Role;

/// How often an open stream re-checks its token.
pub const TOKEN_RECHECK_INTERVAL: Duration = Duration::from_secs(1);

/// What the event stream uses.
#[derive(Clone)]
pub struct EventsApi {
    pub auth: std::sync::Arc<crate::auth::Authenticator>,
    pub bus: super::EventBus,
    pub db: crate::db::Db,
    /// Turns true when the registry shuts down (ends the streams).
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// `benchlink_event_stream_subscribers`: up while a stream is open.
    pub subscribers: prometheus::IntGauge,
}

/// Counts one open stream in the subscribers gauge until dropped.
struct Subscribed(prometheus::IntGauge);

impl Subscribed {
    fn new(gauge: prometheus::IntGauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The event stream route (relative to `/api/v1`).
pub fn routes(state: EventsApi) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(stream))
        .with_state(state)
}

/// Which events a client wants.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Empty: every type.
    pub types: Vec<EventType>,
    pub capability_id: Option<String>,
    pub provider_id: Option<String>,
    pub lease_id: Option<String>,
}

impl EventFilter {
    /// True when `ev` passes every given condition.
    pub fn matches(&self, ev: &CapabilityEvent) -> bool {
        (self.types.is_empty() || self.types.contains(&ev.event_type))
            && self
                .capability_id
                .as_ref()
                .is_none_or(|c| ev.capability_id.as_ref() == Some(c))
            && self
                .provider_id
                .as_ref()
                .is_none_or(|p| ev.provider_id.as_ref() == Some(p))
            && self
                .lease_id
                .as_ref()
                .is_none_or(|l| ev.lease_id.as_ref() == Some(l))
    }
}

/// The most events `?tail=` replays.
pub const MAX_TAIL: u64 = 1000;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct StreamQuery {
    /// Replay events with `event_id` above this first (`Last-Event-ID` wins).
    after: Option<u64>,
    /// Without `after` or `Last-Event-ID`: replay the last this many
    /// events of the log first (at most 1000).
    tail: Option<u64>,
    /// Comma-separated event types; empty: every type.
    types: Option<String>,
    capability_id: Option<String>,
    provider_id: Option<String>,
    lease_id: Option<String>,
}

/// One event of the stream as its fields arrive (for the OpenAPI
/// document).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct SseEvent {
    /// The `event_id`; absent on `stream_gap`.
    id: Option<String>,
    /// The event type, or `stream_gap`.
    event: String,
    /// JSON: a `CapabilityEvent`, or a `StreamGap` for `stream_gap`.
    #[schema(content_media_type = "application/json")]
    data: String,
}

fn sse_event(ev: &CapabilityEvent) -> Event {
    Event::default()
        .id(ev.event_id.to_string())
        .event(ev.event_type.as_str())
        .data(serde_json::to_string(ev).unwrap_or_default())
}

/// True when `who` may read `ev` (see "Roles" above).
pub fn may_read(who: &Principal, ev: &CapabilityEvent) -> bool {
    !ev.event_type.admin_only() || who.is_admin()
}

/// Server-Sent Events: `id: {event_id}`, `event: {event_type}`, `data:`
/// a `CapabilityEvent` (or `StreamGap` for `event: stream_gap`). Every
/// role but `provider`.
#[utoipa::path(get, path = "/capability-events/stream", tag = "events",
    params(
        StreamQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event id"),
    ),
    responses((status = 200, description = "An endless `text/event-stream`: one `SseEvent` per event", content_type = "text/event-stream", body = SseEvent)))]
async fn stream(
    State(st): State<EventsApi>,
    who: Principal,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<StreamQuery>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    // The stream names lease holders and audit work: providers (which talk
    // MQTT and only ever see their own commands) may not read it.
    who.require(&[
        Role::Viewer,
        Role::Operator,
        Role::AuditAgent,
        Role::Admin,
        Role::SuperAdmin,
    ])?;
    let last_event_id = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request("Last-Event-ID must be a non-negative integer event id")
                })?,
        ),
        None => None,
    };
    let filter = EventFilter {
        types: match q.types.as_deref() {
            Some(t) => parse_list::<EventType>("types", t)?,
            None => vec![],
        },
        capability_id: q.capability_id.filter(|s| !s.is_empty()),
        provider_id: q.provider_id.filter(|s| !s.is_empty()),
        lease_id: q.lease_id.filter(|s| !s.is_empty()),
    };
    if q.tail.is_some_and(|n| n > MAX_TAIL) {
        return Err(ApiError::invalid_query(
            "tail",
            format!("at most {MAX_TAIL} events"),
        ));
    }
    // Subscribe first, then find where the log ends: nothing committed in
    // between can be missed.
    let mut follower = EventFollower::new(st.bus.clone(), 0);
    let log_end = st.db.read(|c| crate::events::last_id(c)).await??;
    // An id past the end of the log (a client that saw a store that was
    // since restored from a backup) would otherwise wait for ids that are
    // never written: resume from the end instead.
    let after = match last_event_id.or(q.after) {
        Some(n) if n > log_end => {
            tracing::warn!(
                requested = n,
                log_end,
                "SSE resume id past the end of the log; resuming from the end"
            );
            log_end
        }
        Some(n) => n,
        None => log_end.saturating_sub(q.tail.unwrap_or(0)),
    };
    follower.skip_to(after);
    let token = crate::auth::bearer_token(&headers)?.to_string();
    let auth = st.auth.clone();
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(64);
    let mut shutdown = st.shutdown.clone();
    let subscribed = Subscribed::new(st.subscribers.clone());
    tokio::spawn(async move {
        // The task lives as long as the stream: it ends when the client
        // goes away (`tx.closed()`), at shutdown or at a revocation.
        let _subscribed = subscribed;
        let mut recheck = tokio::time::interval(TOKEN_RECHECK_INTERVAL);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if *shutdown.borrow() {
                break;
            }
            let next = tokio::select! {
                n = follower.next() => n,
                _ = shutdown.changed() => break,
                _ = tx.closed() => break,
                // `next` is cancel-safe (a replay page not yet taken is
                // read again; the bus receiver keeps its place).
                _ = recheck.tick() => {
                    if auth.authenticate_fresh(&token).await.as_ref() != Some(&who) {
                        tracing::info!(principal = %who.name, "token revoked; ending its event stream");
                        break;
                    }
                    continue;
                }
            };
            // Revocations through the API drop the token from the cache at
            // once: a revoked token gets no further event.
            if auth.authenticate(&token).as_ref() != Some(&who) {
                tracing::info!(principal = %who.name, "token revoked; ending its event stream");
                break;
            }
            let out = match next {
                Ok(Followed::Event(ev)) if filter.matches(&ev) && may_read(&who, &ev) => {
                    sse_event(&ev)
                }
                Ok(Followed::Event(_)) => continue,
                Ok(Followed::Gap {
                    from_event_id,
                    to_event_id,
                }) => {
                    tracing::warn!(
                        from_event_id,
                        to_event_id,
                        "SSE client fell behind; replaying from the log"
                    );
                    Event::default().event("stream_gap").data(
                        serde_json::to_string(&StreamGap {
                            from_event_id,
                            to_event_id,
                        })
                        .unwrap_or_default(),
                    )
                }
                Ok(Followed::Closed) => break,
                Err(e) => {
                    tracing::error!(error = %e, "SSE replay failed; closing the stream");
                    break;
                }
            };
            if tx.send(Ok(out)).await.is_err() {
                break;
            }
        }
    });
    // A comment first, so that the status line and headers reach the
    // client now, not with the first event or keep-alive (up to 15 s on a
    // quiet lab, longer than many proxies wait).
    let opened = futures::stream::once(async {
        Ok::<_, Infallible>(Event::default().comment("stream open"))
    });
    Ok(
        Sse::new(futures::StreamExt::chain(opened, ReceiverStream::new(rx)))
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(15))),
    )
}
