//! Waiting for something to become true, without sleeping a fixed time.

use std::future::Future;
use std::time::{Duration, Instant};

/// Poll the async `check` every 50 ms until it returns `Some`, for at most
/// `timeout`.
///
/// Errors: `timeout` passed first; the message names `what`.
pub async fn poll_until<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// [`poll_until`] for a test: the value, or a panic naming `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_until(timeout, what, check)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Poll `cond` every 2 ms (blocking the thread) until it holds; false
/// when `timeout` passed first (after one last look).
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    cond()
}

/// Poll `f` every 50 ms (blocking the thread) until it returns `Some`, for
/// at most `timeout`.
///
/// Errors: `timeout` passed first; the message names `what`.
pub fn wait_for<T>(
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
