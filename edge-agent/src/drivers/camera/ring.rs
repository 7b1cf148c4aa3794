//! The edge ring buffer of a camera stream (preprocess at the
//! edge, upload only key evidence).
//!
//! While a stream runs, every captured frame is pushed here as JPEG; the
//! ring forgets frames older than `ring_seconds` (and the oldest ones when
//! it exceeds its byte budget). Nothing in it is uploaded unless an action
//! asks for it: a snapshot, a clip of the last N ms, or keyframes.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::frames::PixelFormat;

/// One frame kept at the edge, already JPEG-encoded.
#[derive(Debug, Clone)]
pub struct StoredFrame {
    /// When the host received it (ring arithmetic uses this clock).
    pub received: Instant,
    /// Wall-clock capture time (device timestamp when it gives one).
    pub captured_at: DateTime<Utc>,
    pub jpeg: Vec<u8>,
    pub width: u32,
    pub height: u32,
    /// What the device delivered before it became JPEG.
    pub source_format: PixelFormat,
}

/// Frames of the last `max_span`, within `max_bytes`.
#[derive(Debug)]
pub struct FrameRing {
    frames: VecDeque<StoredFrame>,
    max_span: Duration,
    max_bytes: usize,
    bytes: usize,
    evicted: u64,
}

impl FrameRing {
    /// A ring keeping `max_span` of frames and at most `max_bytes` of JPEG.
    pub fn new(max_span: Duration, max_bytes: usize) -> Self {
        Self {
            frames: VecDeque::new(),
            max_span,
            max_bytes,
            bytes: 0,
            evicted: 0,
        }
    }

    /// Append a frame, then forget what is too old or over budget (the
    /// newest frame is always kept).
    pub fn push(&mut self, frame: StoredFrame) {
        self.bytes += frame.jpeg.len();
        let newest = frame.received;
        self.frames.push_back(frame);
        while self.frames.len() > 1 {
            let front = &self.frames[0];
            let too_old = newest.duration_since(front.received) > self.max_span;
            if !(too_old || self.bytes > self.max_bytes) {
                break;
            }
            if let Some(old) = self.frames.pop_front() {
                self.bytes -= old.jpeg.len();
                self.evicted += 1;
            }
        }
    }

    /// Frames held.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// True when no frame is held.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// JPEG bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Frames forgotten since the ring was created.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Milliseconds between the oldest and newest frame held.
    pub fn span_ms(&self) -> u64 {
        match (self.frames.front(), self.frames.back()) {
            (Some(a), Some(b)) => b.received.duration_since(a.received).as_millis() as u64,
            _ => 0,
        }
    }

    /// The newest frame.
    pub fn latest(&self) -> Option<&StoredFrame> {
        self.frames.back()
    }

    /// Take every frame out, or only those of the last `last_ms`
    /// milliseconds (measured back from the newest frame).
    pub fn take(&mut self, last_ms: Option<u64>) -> Vec<StoredFrame> {
        let all: Vec<StoredFrame> = self.frames.drain(..).collect();
        self.bytes = 0;
        match (last_ms, all.last().map(|f| f.received)) {
            (Some(ms), Some(newest)) => {
                let window = Duration::from_millis(ms);
                all.into_iter()
                    .filter(|f| newest.duration_since(f.received) <= window)
                    .collect()
            }
            _ => all,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(at: Instant, size: usize) -> StoredFrame {
        StoredFrame {
            received: at,
            captured_at: Utc::now(),
            jpeg: vec![0; size],
            width: 2,
            height: 2,
            source_format: PixelFormat::Mjpeg,
        }
    }

    #[test]
    fn frames_older_than_the_span_are_forgotten() {
        let t0 = Instant::now();
        let mut ring = FrameRing::new(Duration::from_millis(1000), usize::MAX);
        for i in 0..30 {
            ring.push(frame(t0 + Duration::from_millis(i * 100), 10));
        }
        // 0..=2900 ms pushed; only 1900..=2900 remain.
        assert_eq!(ring.len(), 11);
        assert_eq!(ring.span_ms(), 1000);
        assert_eq!(ring.evicted(), 19);
    }

    #[test]
    fn the_byte_budget_evicts_oldest_first_but_keeps_the_newest() {
        let t0 = Instant::now();
        let mut ring = FrameRing::new(Duration::from_secs(60), 25);
        for i in 0..5 {
            ring.push(frame(t0 + Duration::from_millis(i), 10));
        }
        assert_eq!(ring.len(), 2);
        assert_eq!(ring.bytes(), 20);
        ring.push(frame(t0 + Duration::from_millis(9), 100));
        assert_eq!(ring.len(), 1, "an oversized frame still replaces the rest");
    }

    #[test]
    fn take_last_ms_keeps_only_that_window() {
        let t0 = Instant::now();
        let mut ring = FrameRing::new(Duration::from_secs(10), usize::MAX);
        for i in 0..10 {
            ring.push(frame(t0 + Duration::from_millis(i * 100), 1));
        }
        let kept = ring.take(Some(250));
        assert_eq!(kept.len(), 3, "700, 800 and 900 ms");
        assert!(ring.is_empty());
        assert_eq!(ring.bytes(), 0);
    }
}
