//! The HTTP listener: an accept loop serving the axum router over HTTP/1.1
//! with a header-read timeout (also the idle keep-alive timeout), a
//! request-body inactivity timeout, a cap on concurrent connections,
//! TCP_NODELAY, and graceful shutdown on the registry's shutdown signal.
//! With `[http] tls_cert_file` / `tls_key_file` it serves HTTPS only
//! (docs/install-registry.md "TLS"): the TLS handshake runs in the
//! connection's task, bounded by the header-read timeout, so a client that
//! never finishes one holds its slot no longer than one that never sends
//! a request head.
//!
//! Why its own loop rather than `axum::serve`: that one has no timeouts
//! and no cap, so a thousand clients that open a connection and send half
//! a request head hold a file descriptor each for ever and the process
//! runs out of them (`/healthz` stalls).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use tower_http::timeout::TimeoutBody;

/// At most one "connection cap reached" or accept-error warning per this
/// interval.
const WARN_INTERVAL: Duration = Duration::from_secs(60);

/// Length of the accept backlog asked for (the kernel caps it at
/// `net.core.somaxconn`): a burst of connections, or those waiting beyond
/// `http.max_connections`, queue there instead of having their SYNs
/// dropped and retried a second or more later.
pub const ACCEPT_BACKLOG: u32 = 4096;

/// Listen on `addr` (SO_REUSEADDR, as `TcpListener::bind`) with
/// [`ACCEPT_BACKLOG`].
///
/// Errors: the address is taken or cannot be bound.
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_BACKLOG)
}

/// How long connections may take to finish once the registry stops: then
/// they are closed, whatever they are doing. Without it a client holding
/// half a request head would delay the stop by up to the header-read
/// timeout. Below the 10 s [`crate::app::RunningRegistry::shutdown`] gives
/// the HTTP server.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// How the listener treats its connections (from `[http]`).
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Longest wait for a whole request head, from the accept or the end
    /// of the previous response (so also the idle keep-alive timeout).
    pub header_read_timeout: Duration,
    /// Longest pause between two pieces of a request body while a handler
    /// reads it (inactivity, not total time).
    pub body_read_timeout: Duration,
    /// Most connections served at once; more wait in the accept backlog.
    pub max_connections: usize,
}

/// Serve `app` on `listener` (over TLS when `tls` is given: HTTPS only,
/// a connection that does not complete a handshake within the
/// header-read timeout is closed) until `shutdown` turns true, then stop
/// accepting, let in-flight requests finish (hyper's graceful shutdown:
/// idle connections close at once; any still open [`SHUTDOWN_DRAIN`]
/// later are closed) and return when every connection is closed.
///
/// Never returns an error: a failed accept (out of file descriptors, say)
/// is logged (rate-limited) and retried after 100 ms.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    tls: Option<TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    // Every connection task holds a clone of `open_rx`; `open_tx.closed()`
    // resolves once they all ended.
    let (open_tx, open_rx) = watch::channel(());
    let (mut cap_warned, mut accept_warned) = (None, None);
    loop {
        // Take a slot before accepting: beyond the cap, connections wait
        // in the kernel's backlog instead of holding a descriptor here.
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if warn_due(&mut cap_warned) {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "HTTP connection cap reached (`http.max_connections`); \
                         new connections wait until one closes"
                    );
                }
                tokio::select! {
                    p = slots.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                    _ = shutdown.wait_for(|s| *s) => break,
                }
            }
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|s| *s) => break,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                if !is_connection_error(&e) {
                    if warn_due(&mut accept_warned) {
                        tracing::warn!(error = %e, "cannot accept an HTTP connection; retrying");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
        };
        // Small JSON answers and event-stream lines go out at once instead
        // of waiting for the client's delayed ACK (Nagle).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an HTTP connection");
        }
        let body_timeout = limits.body_read_timeout;
        let service = TowerToHyperService::new(app.clone().map_request(
            move |req: axum::http::Request<Incoming>| {
                req.map(|b| Body::new(TimeoutBody::new(body_timeout, b)))
            },
        ));
        let header_timeout = limits.header_read_timeout;
        let mut stop = shutdown.clone();
        let open = open_rx.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve_connection(tcp, service, header_timeout, &mut stop, peer).await,
                Some(acceptor) => {
                    let handshake = tokio::select! {
                        h = tokio::time::timeout(header_timeout, acceptor.accept(tcp)) => h,
                        _ = stop.wait_for(|s| *s) => Ok(Err(std::io::Error::other("shutting down"))),
                    };
                    match handshake {
                        Ok(Ok(stream)) => {
                            serve_connection(stream, service, header_timeout, &mut stop, peer).await
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed; connection closed");
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "no TLS handshake within the header-read timeout; connection closed");
                        }
                    }
                }
            }
            drop(permit);
            drop(open);
        });
    }
    drop(open_rx);
    drop(listener);
    open_tx.closed().await;
}

/// Serve HTTP/1.1 on one connection (`io`: the TCP stream, or the TLS
/// stream on it) until it ends or, once `stop` turns true, until it
/// finishes gracefully or [`SHUTDOWN_DRAIN`] passes.
async fn serve_connection<I, S>(
    io: I,
    service: S,
    header_timeout: Duration,
    stop: &mut watch::Receiver<bool>,
    peer: std::net::SocketAddr,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<
            axum::http::Request<Incoming>,
            Response = axum::http::Response<Body>,
            Error = std::convert::Infallible,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let conn = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    let mut stopping = false;
    let drain = tokio::time::sleep(Duration::MAX);
    tokio::pin!(drain);
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::trace!(%peer, error = %e, "HTTP connection ended");
                }
                break;
            }
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
                drain.as_mut().reset(tokio::time::Instant::now() + SHUTDOWN_DRAIN);
            }
            _ = &mut drain, if stopping => {
                tracing::debug!(%peer, "HTTP connection closed at the end of the shutdown drain");
                break;
            }
        }
    }
}

/// True when the warning last given at `last` (monotonic clock) is at
/// least [`WARN_INTERVAL`] old, or was never given; then `last` is now.
fn warn_due(last: &mut Option<Instant>) -> bool {
    let now = Instant::now();
    let due = last.is_none_or(|t| now.duration_since(t) >= WARN_INTERVAL);
    if due {
        *last = Some(now);
    }
    due
}

/// Errors of one connection (the client gave up before the accept): not
/// worth a warning nor a pause.
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}
