//! Live view of running camera streams (docs/http-api.md "Live view"):
//! the latest frame per capability, in memory only, fed from the
//! providers' `frames` topic by [`crate::mqtt`], and
//! `GET /api/v1/capabilities/{capability_id}/live`, a
//! `multipart/x-mixed-replace` MJPEG stream for the lease holders.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;
use tokio::sync::watch;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::leases::{LeaseEngine, LeaseFilter};
use crate::providers::Providers;

/// A frame older than this means the stream is gone (the edge sends
/// 2–4 per second while it runs).
pub const STALE_AFTER: Duration = Duration::from_secs(2);
/// How often a live response checks that its viewer still holds a lease.
const LEASE_CHECK: Duration = Duration::from_millis(250);
/// The multipart boundary of every live response.
pub const BOUNDARY: &str = "benchlink-live-frame";

/// One relayed JPEG.
#[derive(Debug)]
pub struct Frame {
    /// The edge's counter, from 1 per stream.
    pub seq: u64,
    /// When the edge captured it (the edge's clock).
    pub captured_at: chrono::DateTime<chrono::Utc>,
    pub jpeg: Bytes,
    pub received: Instant,
}

type Slot = watch::Sender<Option<Arc<Frame>>>;

/// The latest frame of each capability whose stream is live.
#[derive(Default)]
pub struct LiveFrames {
    slots: Mutex<HashMap<String, Slot>>,
}

impl LiveFrames {
    fn slot(&self, capability_id: &str) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .entry(capability_id.to_string())
            .or_insert_with(|| watch::channel(None).0)
            .clone()
    }

    /// Keep `jpeg` as the capability's latest frame and wake its viewers.
    pub fn put(
        &self,
        capability_id: &str,
        seq: u64,
        captured_at: chrono::DateTime<chrono::Utc>,
        jpeg: Bytes,
    ) {
        self.slot(capability_id).send_replace(Some(Arc::new(Frame {
            seq,
            captured_at,
            jpeg,
            received: Instant::now(),
        })));
    }

    /// The capability's stream stopped: its viewers' responses end.
    pub fn end(&self, capability_id: &str) {
        self.slot(capability_id).send_replace(None);
    }

    /// Follow the capability's latest frame.
    pub fn subscribe(&self, capability_id: &str) -> watch::Receiver<Option<Arc<Frame>>> {
        self.slot(capability_id).subscribe()
    }
}

/// What the live route reads.
#[derive(Clone)]
pub struct LiveApi {
    pub frames: Arc<LiveFrames>,
    pub providers: Arc<Providers>,
    pub leases: Arc<LeaseEngine>,
    pub shutdown: watch::Receiver<bool>,
}

/// `GET /capabilities/{capability_id}/live` (relative to `/api/v1`).
pub fn routes(state: LiveApi) -> OpenApiRouter {
    OpenApiRouter::new().routes(routes!(live)).with_state(state)
}

async fn holds(leases: &LeaseEngine, who: &Principal, capability_id: &str) -> bool {
    if who.is_admin() {
        return true;
    }
    leases
        .list(LeaseFilter {
            capability_id: Some(capability_id.to_string()),
            principal: Some(who.name.clone()),
            active_only: true,
            ..LeaseFilter::default()
        })
        .await
        .into_iter()
        .next()
        .is_some()
}

fn fresh(f: &Option<Arc<Frame>>) -> Option<Arc<Frame>> {
    f.as_ref()
        .filter(|f| f.received.elapsed() < STALE_AFTER)
        .cloned()
}

fn part(f: &Frame) -> Bytes {
    let mut out = format!(
        "--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {}\r\nX-Frame-Seq: {}\r\nX-Captured-At: {}\r\n\r\n",
        f.jpeg.len(),
        f.seq,
        f.captured_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    )
    .into_bytes();
    out.extend_from_slice(&f.jpeg);
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

/// 200 `multipart/x-mixed-replace` with one `image/jpeg` part per new
/// frame, ending (closing boundary) when the stream stops, its frames go
/// stale for [`STALE_AFTER`], or the viewer no longer holds a lease.
/// 404 `not_found` for an unknown capability, 403 `not_lease_holder` for a
/// principal without a lease on it (admins may always watch), 409
/// `no_live_stream` when no stream runs.
#[utoipa::path(get, path = "/capabilities/{capability_id}/live", tag = "capabilities",
    params(("capability_id" = String, Path)),
    responses(
        (status = 200, description = "MJPEG: `multipart/x-mixed-replace; boundary=benchlink-live-frame`, one `image/jpeg` part per frame, until the stream or the lease ends", content_type = "multipart/x-mixed-replace", body = crate::openapi::Binary),
        (status = 403, description = "`not_lease_holder`: the caller holds no lease on the capability", body = shared_protocol::api::ErrorBody),
        (status = 404, description = "`not_found`: no such capability", body = shared_protocol::api::ErrorBody),
        (status = 409, description = "`no_live_stream`: no stream runs on the capability", body = shared_protocol::api::ErrorBody),
    ))]
async fn live(
    State(st): State<LiveApi>,
    who: Principal,
    Path(capability_id): Path<String>,
) -> ApiResult<Response> {
    let known = st
        .providers
        .store()
        .get_capability(&capability_id)
        .await
        .map_err(ApiError::from)?;
    if known.is_none() {
        return Err(ApiError::not_found("capability", &capability_id));
    }
    if !holds(&st.leases, &who, &capability_id).await {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "not_lease_holder",
            format!("`{}` holds no lease on `{capability_id}`", who.name),
        )
        .with_details(json!({ "capability_id": capability_id })));
    }
    let mut rx = st.frames.subscribe(&capability_id);
    let Some(first) = fresh(&rx.borrow_and_update()) else {
        return Err(ApiError::conflict(
            "no_live_stream",
            format!("no stream runs on `{capability_id}` (call start_stream first)"),
        )
        .with_details(json!({ "capability_id": capability_id })));
    };
    let leases = st.leases.clone();
    let mut shutdown = st.shutdown.clone();
    let stream = async_stream(move |tx| async move {
        let mut last_seq = first.seq;
        if tx.send(part(&first)).await.is_err() {
            return;
        }
        let mut check = tokio::time::interval(LEASE_CHECK);
        loop {
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let Some(f) = rx.borrow_and_update().clone() else { break };
                    if f.seq != last_seq {
                        last_seq = f.seq;
                        if tx.send(part(&f)).await.is_err() {
                            return;
                        }
                    }
                }
                _ = check.tick() => {
                    if fresh(&rx.borrow()).is_none() || !holds(&leases, &who, &capability_id).await {
                        break;
                    }
                }
                _ = shutdown.changed() => break,
            }
        }
        let _ = tx.send(Bytes::from(format!("--{BOUNDARY}--\r\n"))).await;
    });
    Ok((
        [
            (
                header::CONTENT_TYPE,
                format!("multipart/x-mixed-replace; boundary={BOUNDARY}"),
            ),
            (header::CACHE_CONTROL, "no-store".to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// A body stream fed by a task through a small channel (the task ends
/// when the client goes away: its send fails).
fn async_stream<F, Fut>(f: F) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::spawn(f(tx));
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_carries_its_jpeg_between_headers_and_crlf() {
        let p = part(&Frame {
            seq: 3,
            captured_at: chrono::Utc::now(),
            jpeg: Bytes::from_static(b"\xff\xd8xy\xff\xd9"),
            received: Instant::now(),
        });
        let text = String::from_utf8_lossy(&p);
        assert!(text.starts_with(
            "--benchlink-live-frame\r\nContent-Type: image/jpeg\r\nContent-Length: 6\r\n"
        ));
        assert!(p.ends_with(b"\xff\xd8xy\xff\xd9\r\n"));
    }

    #[tokio::test]
    async fn an_ended_stream_has_no_frame_and_a_stale_one_is_not_fresh() {
        let frames = LiveFrames::default();
        let rx = frames.subscribe("cam");
        frames.put("cam", 1, chrono::Utc::now(), Bytes::from_static(b"j"));
        assert_eq!(fresh(&rx.borrow()).map(|f| f.seq), Some(1));
        frames.end("cam");
        assert!(fresh(&rx.borrow()).is_none());
    }
}
