//! The capture thread: owns the opened camera (nokhwa's `Camera` is not
//! `Send`, and V4L2 reads block), captures frames, keeps the stream's ring
//! buffer, and answers the driver's commands between frames.
//!
//! The driver never blocks on the device itself: it waits for replies with
//! a deadline and watches [`Progress`], which says how long the thread has
//! been stuck in a device call. A thread stuck past `capture_timeout_ms`
//! (camera unplugged mid-read) is abandoned; it exits on its own if the
//! call ever returns.

use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shared_protocol::capability::{CapabilityAction, CapabilityType};

use super::frames::{self, negotiate, CaptureMode, FormatPreference, RawFrame};
use super::ring::{FrameRing, StoredFrame};
use super::{CameraBackend, FrameSource, PtzAxis};
use crate::drivers::live::{self, LiveMessage};
use crate::drivers::{unsupported, DriverError};
use shared_protocol::mqtt::{LiveFrame, MAX_LIVE_FRAME_BYTES};

/// Least spacing of a stream's live frames (at most ~3 per second).
const LIVE_EVERY: Duration = Duration::from_millis(300);

/// What the thread is blocked in, and since when; plus the stream's last
/// error. Shared with the driver for stall detection and health.
#[derive(Debug, Default)]
pub struct Progress {
    blocked: Mutex<Option<(Instant, &'static str)>>,
    stream_error: Mutex<Option<String>>,
}

impl Progress {
    /// `(since, what)` while a device call is in progress.
    pub fn blocked(&self) -> Option<(Instant, &'static str)> {
        *self.blocked.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// The error that ended a stream, if one did.
    pub fn stream_error(&self) -> Option<String> {
        self.stream_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    fn set_blocked(&self, what: Option<&'static str>) {
        *self.blocked.lock().unwrap_or_else(|p| p.into_inner()) = what.map(|w| (Instant::now(), w));
    }
    fn set_stream_error(&self, e: Option<String>) {
        *self.stream_error.lock().unwrap_or_else(|p| p.into_inner()) = e;
    }
}

/// What the device agreed to, reported once after opening.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The mode the device actually delivers (read back after setting it).
    pub mode: CaptureMode,
    /// Every usable mode the device offers.
    pub offered: Vec<CaptureMode>,
    pub ptz: Vec<PtzAxis>,
}

/// How the thread should open and run the camera.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Names the stream's live frames.
    pub capability_id: String,
    pub preference: FormatPreference,
    pub resolution: (u32, u32),
    pub fps: u32,
    pub jpeg_quality: u8,
    /// Frames thrown away after the stream starts (auto-exposure settles).
    pub warmup_frames: u32,
    pub ring_span: Duration,
    pub ring_max_bytes: usize,
}

/// A finished clip.
#[derive(Debug)]
pub struct ClipResult {
    pub parts: Vec<super::clip::ClipPart>,
    /// Frames that failed verification and were left out.
    pub dropped_frames: u64,
    pub mode: CaptureMode,
}

/// What `stop_stream` gets back.
#[derive(Debug)]
pub struct StreamTake {
    pub frames: Vec<StoredFrame>,
    pub frames_in_ring: usize,
    pub ring_span_ms: u64,
    pub dropped_frames: u64,
    pub evicted_frames: u64,
    pub stream_ms: u64,
    pub error: Option<String>,
}

/// What `start_stream` gets back.
#[derive(Debug, Clone, Copy)]
pub struct StreamInfo {
    pub mode: CaptureMode,
    pub fps: u32,
    pub already_streaming: bool,
}

type Reply<T> = Sender<Result<T, DriverError>>;

/// Requests from the driver.
pub enum Command {
    /// The next good frame (after warm-up when the stream was idle).
    Snapshot {
        reply: Reply<RawFrame>,
    },
    /// Frames for `duration`, at most `fps` per second.
    Clip {
        duration: Duration,
        fps: u32,
        reply: Reply<ClipResult>,
    },
    /// Give up the clip in progress (past its deadline, or failed).
    AbortClip,
    /// End the clip in progress now (cancelled): its reply gets the frames
    /// kept so far, or `Cancelled` when there are none.
    CutClip,
    StartStream {
        fps: u32,
        reply: Reply<StreamInfo>,
    },
    /// End the stream; return the ring's frames (all or the last `last_ms`).
    StopStream {
        last_ms: Option<u64>,
        reply: Reply<StreamTake>,
    },
    SetPtz {
        values: Vec<(PtzAxis, i64)>,
        reply: Reply<()>,
    },
}

/// The driver's end of a capture thread.
pub struct WorkerHandle {
    pub tx: Sender<Command>,
    pub opened_rx: Receiver<Result<Opened, DriverError>>,
    pub opened: Option<Opened>,
    pub progress: Arc<Progress>,
    pub streaming: bool,
}

/// Start a capture thread that opens the camera through `backend`.
pub fn spawn(
    backend: Arc<dyn CameraBackend>,
    cfg: WorkerConfig,
) -> Result<WorkerHandle, DriverError> {
    let (tx, rx) = mpsc::channel();
    let (opened_tx, opened_rx) = mpsc::channel();
    let progress = Arc::new(Progress::default());
    let p = progress.clone();
    std::thread::Builder::new()
        .name("camera-capture".into())
        .spawn(move || run(backend, cfg, rx, opened_tx, p))
        .map_err(|e| DriverError::Device(format!("cannot start the capture thread: {e}")))?;
    Ok(WorkerHandle {
        tx,
        opened_rx,
        opened: None,
        progress,
        streaming: false,
    })
}

fn run(
    backend: Arc<dyn CameraBackend>,
    cfg: WorkerConfig,
    rx: Receiver<Command>,
    opened_tx: Sender<Result<Opened, DriverError>>,
    progress: Arc<Progress>,
) {
    progress.set_blocked(Some("opening the camera"));
    let opened = open(backend.as_ref(), &cfg);
    progress.set_blocked(None);
    let (source, info) = match opened {
        Ok(x) => x,
        Err(e) => {
            let _ = opened_tx.send(Err(e));
            return;
        }
    };
    if opened_tx.send(Ok(info.clone())).is_err() {
        return;
    }
    let mut w = Worker {
        source,
        mode: info.mode,
        ptz: info.ptz,
        cfg,
        started: false,
        snapshots: Vec::new(),
        clip: None,
        stream: None,
        progress,
    };
    w.serve(&rx);
    let _ = w.source.stop();
}

fn open(
    backend: &dyn CameraBackend,
    cfg: &WorkerConfig,
) -> Result<(Box<dyn FrameSource>, Opened), DriverError> {
    let mut source = backend.open()?;
    let offered = source.modes()?;
    let chosen = negotiate(cfg.preference, cfg.resolution, cfg.fps, &offered)?;
    let mode = source.set_mode(chosen)?;
    if let FormatPreference::Only(f) = cfg.preference {
        if mode.format != f {
            return Err(DriverError::Device(format!(
                "asked the camera for {chosen} but it switched to {mode}"
            )));
        }
    }
    let ptz = source.ptz_axes();
    Ok((source, Opened { mode, offered, ptz }))
}

struct PendingSnapshot {
    reply: Reply<RawFrame>,
    skip: u32,
}

struct ClipJob {
    duration: Duration,
    every: Duration,
    start: Option<Instant>,
    last_kept: Option<Instant>,
    parts: Vec<super::clip::ClipPart>,
    dropped: u64,
    reply: Reply<ClipResult>,
}

impl ClipJob {
    /// Answer the clip's waiting reply with the frames kept, recorded in
    /// `mode`; with `if_empty(self)` when there are none.
    fn finish(self, mode: CaptureMode, if_empty: impl FnOnce(&ClipJob) -> DriverError) {
        let result = if self.parts.is_empty() {
            Err(if_empty(&self))
        } else {
            Ok(ClipResult {
                parts: self.parts,
                dropped_frames: self.dropped,
                mode,
            })
        };
        let _ = self.reply.send(result);
    }
}

struct StreamState {
    ring: FrameRing,
    every: Duration,
    last_kept: Option<Instant>,
    dropped: u64,
    consecutive_errors: u32,
    started_at: Instant,
    error: Option<String>,
    /// Live frames offered so far.
    live_seq: u64,
    last_live: Option<Instant>,
}

struct Worker {
    source: Box<dyn FrameSource>,
    mode: CaptureMode,
    ptz: Vec<PtzAxis>,
    cfg: WorkerConfig,
    started: bool,
    snapshots: Vec<PendingSnapshot>,
    clip: Option<ClipJob>,
    stream: Option<StreamState>,
    progress: Arc<Progress>,
}

/// Consecutive read errors after which a stream is declared dead.
const STREAM_ERROR_LIMIT: u32 = 3;

impl Worker {
    fn active(&self) -> bool {
        !self.snapshots.is_empty()
            || self.clip.is_some()
            || self.stream.as_ref().is_some_and(|s| s.error.is_none())
    }

    fn serve(&mut self, rx: &Receiver<Command>) {
        loop {
            let cmd = if self.active() {
                match rx.try_recv() {
                    Ok(c) => Some(c),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => return,
                }
            } else {
                if self.started {
                    let _ = self.source.stop();
                    self.started = false;
                }
                match rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                }
            };
            match cmd {
                Some(c) => self.handle(c),
                None => self.capture_one(),
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Snapshot { reply } => {
                let skip = if self.started {
                    0
                } else {
                    self.cfg.warmup_frames
                };
                self.snapshots.push(PendingSnapshot { reply, skip });
            }
            Command::Clip {
                duration,
                fps,
                reply,
            } => {
                if self.clip.is_some() {
                    let _ = reply.send(Err(DriverError::Device(
                        "a clip is already being recorded".into(),
                    )));
                    return;
                }
                self.clip = Some(ClipJob {
                    duration,
                    every: frame_interval(fps, self.mode.fps),
                    start: None,
                    last_kept: None,
                    parts: Vec::new(),
                    dropped: 0,
                    reply,
                });
            }
            Command::AbortClip => self.clip = None,
            Command::CutClip => {
                if let Some(c) = self.clip.take() {
                    c.finish(self.mode, |_| {
                        DriverError::Cancelled("before the clip's first frame".into())
                    });
                }
            }
            Command::StartStream { fps, reply } => {
                let fps = fps.min(self.mode.fps).max(1);
                if let Some(s) = &self.stream {
                    if s.error.is_none() {
                        let _ = reply.send(Ok(StreamInfo {
                            mode: self.mode,
                            fps,
                            already_streaming: true,
                        }));
                        return;
                    }
                }
                self.progress.set_stream_error(None);
                self.stream = Some(StreamState {
                    ring: FrameRing::new(self.cfg.ring_span, self.cfg.ring_max_bytes),
                    every: frame_interval(fps, self.mode.fps),
                    last_kept: None,
                    dropped: 0,
                    consecutive_errors: 0,
                    started_at: Instant::now(),
                    error: None,
                    live_seq: 0,
                    last_live: None,
                });
                let _ = reply.send(Ok(StreamInfo {
                    mode: self.mode,
                    fps,
                    already_streaming: false,
                }));
            }
            Command::StopStream { last_ms, reply } => {
                let Some(mut s) = self.stream.take() else {
                    let _ = reply.send(Err(DriverError::InvalidParams {
                        field: "action".into(),
                        message: "no stream is running (call start_stream first)".into(),
                    }));
                    return;
                };
                self.progress.set_stream_error(None);
                live::offer(LiveMessage {
                    header: LiveFrame {
                        capability_id: self.cfg.capability_id.clone(),
                        seq: s.live_seq + 1,
                        captured_at: chrono::Utc::now(),
                        end: true,
                    },
                    jpeg: Vec::new(),
                });
                let frames_in_ring = s.ring.len();
                let ring_span_ms = s.ring.span_ms();
                let evicted = s.ring.evicted();
                let frames = s.ring.take(last_ms);
                let _ = reply.send(Ok(StreamTake {
                    frames,
                    frames_in_ring,
                    ring_span_ms,
                    dropped_frames: s.dropped,
                    evicted_frames: evicted,
                    stream_ms: s.started_at.elapsed().as_millis() as u64,
                    error: s.error,
                }));
            }
            Command::SetPtz { values, reply } => {
                let result = self.set_ptz(&values);
                let _ = reply.send(result);
            }
        }
    }

    fn set_ptz(&mut self, values: &[(PtzAxis, i64)]) -> Result<(), DriverError> {
        for (axis, _) in values {
            if !self.ptz.contains(axis) {
                let have = if self.ptz.is_empty() {
                    "it has no pan/tilt/zoom controls".to_string()
                } else {
                    format!(
                        "it only has {}",
                        self.ptz
                            .iter()
                            .map(|a| a.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                return Err(unsupported(
                    CapabilityType::Camera,
                    CapabilityAction::SetPtz,
                    &format!("this camera has no {} control; {have}", axis.as_str()),
                ));
            }
        }
        for (axis, value) in values {
            self.progress
                .set_blocked(Some("setting a pan/tilt/zoom control"));
            let r = self.source.set_ptz(*axis, *value);
            self.progress.set_blocked(None);
            r?;
        }
        Ok(())
    }

    fn capture_one(&mut self) {
        if !self.started {
            self.progress.set_blocked(Some("starting the stream"));
            let r = self.source.start();
            self.progress.set_blocked(None);
            if let Err(e) = r {
                self.fail_all(e);
                return;
            }
            self.started = true;
        }
        self.progress.set_blocked(Some("capturing a frame"));
        let frame = self.source.next_frame();
        self.progress.set_blocked(None);
        match frame {
            Ok(f) => self.on_frame(f),
            Err(e) => self.on_error(e),
        }
    }

    /// A read failed: the waiting snapshot and clip fail; the stream counts
    /// it and ends after a few in a row.
    fn on_error(&mut self, e: DriverError) {
        for s in self.snapshots.drain(..) {
            let _ = s.reply.send(Err(e.clone()));
        }
        if let Some(c) = self.clip.take() {
            let _ = c.reply.send(Err(e.clone()));
        }
        if let Some(s) = &mut self.stream {
            s.consecutive_errors += 1;
            if s.consecutive_errors >= STREAM_ERROR_LIMIT {
                let msg = format!("stream stopped after {STREAM_ERROR_LIMIT} failed reads: {e}");
                self.progress.set_stream_error(Some(msg.clone()));
                s.error = Some(msg);
            }
        }
        // A device that errors at once must not spin this thread.
        std::thread::sleep(Duration::from_millis(50));
    }

    fn fail_all(&mut self, e: DriverError) {
        for s in self.snapshots.drain(..) {
            let _ = s.reply.send(Err(e.clone()));
        }
        if let Some(c) = self.clip.take() {
            let _ = c.reply.send(Err(e.clone()));
        }
        if let Some(s) = &mut self.stream {
            let msg = e.to_string();
            self.progress.set_stream_error(Some(msg.clone()));
            s.error = Some(msg);
        }
    }

    fn on_frame(&mut self, frame: RawFrame) {
        let now = Instant::now();
        let verified = frames::verify(&frame);

        let mut still_waiting = Vec::new();
        for mut s in self.snapshots.drain(..) {
            if s.skip > 0 {
                s.skip -= 1;
                still_waiting.push(s);
                continue;
            }
            let _ = s.reply.send(verified.clone().map(|_| frame.clone()));
        }
        self.snapshots = still_waiting;

        let mut jpeg: Option<Result<Vec<u8>, DriverError>> = None;
        let quality = self.cfg.jpeg_quality;
        let mut encoded = |f: &RawFrame| {
            jpeg.get_or_insert_with(|| frames::to_jpeg(f, quality))
                .clone()
        };

        if let Some(c) = &mut self.clip {
            let start = *c.start.get_or_insert(now);
            if now.duration_since(start) >= c.duration {
                if let Some(c) = self.clip.take() {
                    c.finish(self.mode, |c| {
                        DriverError::Device(format!(
                            "no usable frame in {} ms ({} failed verification)",
                            c.duration.as_millis(),
                            c.dropped
                        ))
                    });
                }
            } else if c.last_kept.is_none_or(|t| now.duration_since(t) >= c.every) {
                match encoded(&frame) {
                    Ok(j) => {
                        c.last_kept = Some(now);
                        c.parts.push(super::clip::ClipPart {
                            timestamp_ms: now.duration_since(start).as_millis() as u64,
                            captured_at: Some(frame.captured_at),
                            jpeg: j,
                        });
                    }
                    Err(e) => {
                        c.dropped += 1;
                        tracing::warn!(error = %e, "camera frame left out of the clip");
                    }
                }
            }
        }

        if let Some(s) = &mut self.stream {
            if s.error.is_some() {
                return;
            }
            s.consecutive_errors = 0;
            if s.last_kept.is_none_or(|t| now.duration_since(t) >= s.every) {
                match encoded(&frame) {
                    Ok(j) => {
                        s.last_kept = Some(now);
                        if s.last_live
                            .is_none_or(|t| now.duration_since(t) >= LIVE_EVERY)
                            && j.len() <= MAX_LIVE_FRAME_BYTES
                        {
                            s.last_live = Some(now);
                            s.live_seq += 1;
                            live::offer(LiveMessage {
                                header: LiveFrame {
                                    capability_id: self.cfg.capability_id.clone(),
                                    seq: s.live_seq,
                                    captured_at: frame.captured_at,
                                    end: false,
                                },
                                jpeg: j.clone(),
                            });
                        }
                        s.ring.push(StoredFrame {
                            received: now,
                            captured_at: frame.captured_at,
                            jpeg: j,
                            width: frame.width,
                            height: frame.height,
                            source_format: frame.format,
                        });
                    }
                    Err(e) => {
                        s.dropped += 1;
                        tracing::warn!(error = %e, "camera frame left out of the stream ring");
                    }
                }
            }
        }
    }
}

/// The minimum spacing between kept frames for `want` fps out of a device
/// delivering `device_fps`, with a little slack so that jitter does not
/// drop every other frame when both are equal.
fn frame_interval(want: u32, device_fps: u32) -> Duration {
    if want >= device_fps {
        return Duration::ZERO;
    }
    let nominal = Duration::from_secs_f64(1.0 / f64::from(want.max(1)));
    nominal.mul_f64(0.9)
}
