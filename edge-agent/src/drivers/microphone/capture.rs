//! The buffer an audio capture writes into: a ring of interleaved `f32`
//! samples with a running frame count, filled by the device callback and
//! read by the driver.
//!
//! Frame indices are absolute (frame 0 is the first frame the capture
//! delivered), so a reader can ask for "the `n` frames after index `i`"
//! while the ring keeps moving.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Shared between the device callback and the driver.
#[derive(Debug)]
pub struct CaptureBuffer {
    state: Mutex<State>,
    changed: Condvar,
    /// Interleaved channels.
    pub channels: u16,
    /// Hz.
    pub sample_rate: u32,
}

#[derive(Debug)]
struct State {
    samples: VecDeque<f32>,
    capacity_frames: usize,
    /// Frames delivered since the capture began.
    total_frames: u64,
    error: Option<String>,
    last_data: Option<Instant>,
    opened_at: Instant,
}

/// A consistent view of the buffer's counters.
#[derive(Debug, Clone)]
pub struct Status {
    pub total_frames: u64,
    /// Absolute index of the oldest frame still held.
    pub first_frame: u64,
    pub error: Option<String>,
    /// Time since the last delivery (or since opening, if none came).
    pub quiet_for: Duration,
}

impl CaptureBuffer {
    /// A buffer holding at most `capacity_frames` frames.
    pub fn new(channels: u16, sample_rate: u32, capacity_frames: usize) -> Self {
        Self {
            state: Mutex::new(State {
                samples: VecDeque::new(),
                capacity_frames: capacity_frames.max(1),
                total_frames: 0,
                error: None,
                last_data: None,
                opened_at: Instant::now(),
            }),
            changed: Condvar::new(),
            channels: channels.max(1),
            sample_rate,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Append interleaved samples (a partial trailing frame is dropped);
    /// the oldest frames go when the ring is full.
    pub fn push(&self, interleaved: &[f32]) {
        let ch = usize::from(self.channels);
        let whole = interleaved.len() / ch * ch;
        let mut s = self.lock();
        s.samples.extend(&interleaved[..whole]);
        s.total_frames += (whole / ch) as u64;
        let cap = s.capacity_frames * ch;
        if s.samples.len() > cap {
            let excess = s.samples.len() - cap;
            s.samples.drain(..excess);
        }
        s.last_data = Some(Instant::now());
        drop(s);
        self.changed.notify_all();
    }

    /// Record a device error (the stream is dead).
    pub fn fail(&self, message: String) {
        let mut s = self.lock();
        if s.error.is_none() {
            s.error = Some(message);
        }
        drop(s);
        self.changed.notify_all();
    }

    /// Counters now.
    pub fn status(&self) -> Status {
        let s = self.lock();
        let held = (s.samples.len() / usize::from(self.channels)) as u64;
        Status {
            total_frames: s.total_frames,
            first_frame: s.total_frames - held,
            error: s.error.clone(),
            quiet_for: s.last_data.unwrap_or(s.opened_at).elapsed(),
        }
    }

    /// Wait up to `max` for more data or an error.
    pub fn wait(&self, max: Duration) {
        let s = self.lock();
        let _ = self.changed.wait_timeout(s, max);
    }

    /// Copy `count` frames starting at absolute frame `from` (clipped to
    /// what is held).
    pub fn copy_frames(&self, from: u64, count: u64) -> Vec<f32> {
        let s = self.lock();
        let ch = usize::from(self.channels);
        let held = (s.samples.len() / ch) as u64;
        let first = s.total_frames - held;
        let start = from.max(first);
        let end = (from + count).min(s.total_frames);
        if end <= start {
            return Vec::new();
        }
        let a = (start - first) as usize * ch;
        let b = (end - first) as usize * ch;
        s.samples.range(a..b).copied().collect()
    }

    /// Copy everything held, or only the last `last_ms` of it.
    pub fn copy_last(&self, last_ms: Option<u64>) -> Vec<f32> {
        let st = self.status();
        let held = st.total_frames - st.first_frame;
        let want = match last_ms {
            Some(ms) => (ms * u64::from(self.sample_rate) / 1000).min(held),
            None => held,
        };
        self.copy_frames(st.total_frames - want, want)
    }
}

/// Drop `x` on a short-lived helper thread.
///
/// Closing an audio stream whose device or server vanished can block
/// forever inside the audio backend (its worker thread never returns); the
/// driver thread must not be the one waiting. A stream that closes normally
/// is gone a few milliseconds later.
pub fn release_in_background<T: Send + 'static>(x: T) {
    let spawned = std::thread::Builder::new()
        .name("audio-release".into())
        .spawn(move || drop(x));
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a thread to close an audio stream; leaking it");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_frames_with_absolute_indices() {
        let b = CaptureBuffer::new(2, 10, 4);
        b.push(&[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
        b.push(&[4.0, 4.0, 5.0, 5.0, 6.0, 6.0, 9.0]); // trailing half frame dropped
        let st = b.status();
        assert_eq!(st.total_frames, 6);
        assert_eq!(st.first_frame, 2);
        assert_eq!(b.copy_frames(3, 2), vec![4.0, 4.0, 5.0, 5.0]);
        assert_eq!(
            b.copy_frames(0, 3),
            vec![3.0, 3.0],
            "frames 0 and 1 are gone"
        );
        assert_eq!(b.copy_last(Some(200)), vec![5.0, 5.0, 6.0, 6.0]);
    }

    #[test]
    fn an_error_is_kept_and_the_first_one_wins() {
        let b = CaptureBuffer::new(1, 8000, 100);
        b.fail("device gone".into());
        b.fail("later".into());
        assert_eq!(b.status().error.as_deref(), Some("device gone"));
    }
}
