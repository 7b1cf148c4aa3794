//! Camera, microphone, speaker and screen-capture drivers on a machine with
//! no camera and no sound card: the nokhwa camera path is fed scripted
//! MJPEG, YUYV and corrupt frames through nokhwa's custom capture-backend
//! hook; the simulated backends are exercised end to end; the real audio
//! backends are checked to fail cleanly. (Audio through a real PulseAudio
//! server is in `audio_loopback.rs`.)

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edge_agent::drivers::camera::{clip, nokhwa_backend, pattern};
use edge_agent::drivers::{
    build, ActionOutcome, ActionRequest, CancelToken, Driver, DriverError, DriverSpec,
};
use nokhwa::camera_traits::CaptureBackendTrait;
use nokhwa::utils::{
    ApiBackend, CameraControl, CameraFormat, CameraIndex, CameraInfo, ControlValueSetter,
    FrameFormat, KnownCameraControl, Resolution,
};
use nokhwa::{Buffer, Camera, NokhwaError};
use serde_json::{json, Map, Value};
use shared_protocol::artifact::ArtifactType;
use shared_protocol::capability::{CapabilityAction, CapabilityType, HealthStatus};

// ---------------------------------------------------------------- helpers

fn spec(kind: CapabilityType, backend: &str, settings: Value, state_dir: &Path) -> DriverSpec {
    DriverSpec {
        capability_id: format!("test-{}-{backend}", kind.as_str()),
        capability_type: kind,
        backend: backend.into(),
        settings: settings.as_object().cloned().unwrap_or_default(),
        state_dir: state_dir.to_path_buf(),
    }
}

fn req(action: CapabilityAction, params: Value) -> ActionRequest {
    ActionRequest {
        session_id: "sess-test".into(),
        action,
        params: params.as_object().cloned().unwrap_or_else(Map::new),
        deadline: Instant::now() + Duration::from_secs(60),
        cancel: CancelToken::new(),
    }
}

fn run(
    d: &mut dyn Driver,
    action: CapabilityAction,
    params: Value,
) -> Result<ActionOutcome, DriverError> {
    d.execute(&req(action, params))
}

/// Run `r` on `d`, cancelled `after` into it; the driver must stop within
/// 2.5 s of the cancel and keep what it had recorded. Returns the reason
/// and the partial outcome.
fn cancelled_after(
    d: &mut dyn Driver,
    r: ActionRequest,
    after: Duration,
) -> (String, Box<ActionOutcome>) {
    let cancel = r.cancel.clone();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(after);
        cancel.cancel();
    });
    let t0 = Instant::now();
    let result = d.execute(&r);
    canceller.join().unwrap();
    let took = t0.elapsed();
    assert!(took < after + Duration::from_millis(2500), "{took:?}");
    match result {
        Err(DriverError::CancelledPartway { why, partial }) => (why, partial),
        other => panic!("expected CancelledPartway, got {other:?}"),
    }
}

fn decode_image(bytes: &[u8]) -> image::RgbImage {
    image::load_from_memory(bytes)
        .expect("artifact decodes as an image")
        .to_rgb8()
}

fn jpeg_of(img: &image::RgbImage) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    image::DynamicImage::ImageRgb8(img.clone())
        .write_to(&mut out, image::ImageFormat::Jpeg)
        .unwrap();
    out.into_inner()
}

/// Is a required tool missing? Under CI it must be there: fail loudly
/// (the kit's rule).
fn tool_missing(tool: &str) -> bool {
    !benchlink_testkit::tool_installed(tool)
}

// ------------------------------------------- a scripted nokhwa capture backend

/// What the scripted camera does for one `frame()` call.
#[derive(Clone)]
enum Next {
    Frame(Vec<u8>),
    /// Never return (a camera unplugged mid-read).
    Hang,
}

type Script = Arc<dyn Fn(u64, CameraFormat) -> Next + Send + Sync>;

/// A camera as nokhwa's custom-backend hook sees it: a list of formats,
/// a current format, and frames from a script.
struct ScriptedCamera {
    info: CameraInfo,
    formats: Vec<CameraFormat>,
    current: CameraFormat,
    open: bool,
    script: Script,
    served: Arc<AtomicU64>,
}

impl CaptureBackendTrait for ScriptedCamera {
    fn backend(&self) -> ApiBackend {
        ApiBackend::Auto
    }
    fn camera_info(&self) -> &CameraInfo {
        &self.info
    }
    fn refresh_camera_format(&mut self) -> Result<(), NokhwaError> {
        Ok(())
    }
    fn camera_format(&self) -> CameraFormat {
        self.current
    }
    fn set_camera_format(&mut self, new_fmt: CameraFormat) -> Result<(), NokhwaError> {
        if !self.formats.contains(&new_fmt) {
            return Err(NokhwaError::SetPropertyError {
                property: "CameraFormat".into(),
                value: new_fmt.to_string(),
                error: "not offered".into(),
            });
        }
        self.current = new_fmt;
        Ok(())
    }
    fn compatible_list_by_resolution(
        &mut self,
        fourcc: FrameFormat,
    ) -> Result<HashMap<Resolution, Vec<u32>>, NokhwaError> {
        let mut m: HashMap<Resolution, Vec<u32>> = HashMap::new();
        for f in self.formats.iter().filter(|f| f.format() == fourcc) {
            m.entry(f.resolution()).or_default().push(f.frame_rate());
        }
        Ok(m)
    }
    fn compatible_fourcc(&mut self) -> Result<Vec<FrameFormat>, NokhwaError> {
        let mut v: Vec<FrameFormat> = self.formats.iter().map(|f| f.format()).collect();
        v.sort();
        v.dedup();
        Ok(v)
    }
    fn resolution(&self) -> Resolution {
        self.current.resolution()
    }
    fn set_resolution(&mut self, new_res: Resolution) -> Result<(), NokhwaError> {
        let mut f = self.current;
        f.set_resolution(new_res);
        self.set_camera_format(f)
    }
    fn frame_rate(&self) -> u32 {
        self.current.frame_rate()
    }
    fn set_frame_rate(&mut self, new_fps: u32) -> Result<(), NokhwaError> {
        let mut f = self.current;
        f.set_frame_rate(new_fps);
        self.set_camera_format(f)
    }
    fn frame_format(&self) -> FrameFormat {
        self.current.format()
    }
    fn set_frame_format(&mut self, fourcc: FrameFormat) -> Result<(), NokhwaError> {
        let mut f = self.current;
        f.set_format(fourcc);
        self.set_camera_format(f)
    }
    fn camera_control(&self, _control: KnownCameraControl) -> Result<CameraControl, NokhwaError> {
        Err(NokhwaError::UnsupportedOperationError(ApiBackend::Auto))
    }
    fn camera_controls(&self) -> Result<Vec<CameraControl>, NokhwaError> {
        Ok(Vec::new())
    }
    fn set_camera_control(
        &mut self,
        _id: KnownCameraControl,
        _value: ControlValueSetter,
    ) -> Result<(), NokhwaError> {
        Err(NokhwaError::UnsupportedOperationError(ApiBackend::Auto))
    }
    fn open_stream(&mut self) -> Result<(), NokhwaError> {
        self.open = true;
        Ok(())
    }
    fn is_stream_open(&self) -> bool {
        self.open
    }
    fn frame(&mut self) -> Result<Buffer, NokhwaError> {
        if !self.open {
            return Err(NokhwaError::ReadFrameError("stream not open".into()));
        }
        let n = self.served.fetch_add(1, Ordering::SeqCst);
        match (self.script)(n, self.current) {
            Next::Frame(bytes) => {
                // A camera delivers at its frame rate.
                std::thread::sleep(Duration::from_millis(
                    1000 / u64::from(self.current.frame_rate()),
                ));
                Ok(Buffer::new(
                    self.current.resolution(),
                    &bytes,
                    self.current.format(),
                ))
            }
            Next::Hang => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
        }
    }
    fn frame_raw(&mut self) -> Result<std::borrow::Cow<'_, [u8]>, NokhwaError> {
        self.frame()
            .map(|b| std::borrow::Cow::Owned(b.buffer().to_vec()))
    }
    fn stop_stream(&mut self) -> Result<(), NokhwaError> {
        self.open = false;
        Ok(())
    }
}

/// A nokhwa camera driver whose camera is `ScriptedCamera` offering
/// `formats`, through `Camera::with_custom`.
fn scripted_camera(
    dir: &Path,
    settings: Value,
    formats: Vec<CameraFormat>,
    script: Script,
) -> (Box<dyn Driver>, Arc<AtomicU64>) {
    let served = Arc::new(AtomicU64::new(0));
    let s2 = served.clone();
    let opener: nokhwa_backend::CameraOpener = Arc::new(move |index| {
        let backend = ScriptedCamera {
            info: CameraInfo::new(
                "Scripted UVC",
                "scripted",
                "test",
                CameraIndex::Index(index),
            ),
            current: formats[0],
            formats: formats.clone(),
            open: false,
            script: script.clone(),
            served: s2.clone(),
        };
        Ok(Camera::with_custom(
            CameraIndex::Index(index),
            ApiBackend::Auto,
            Box::new(backend),
        ))
    });
    let d = nokhwa_backend::build_with_opener(
        &spec(CapabilityType::Camera, "nokhwa", settings, dir),
        opener,
    )
    .expect("driver builds");
    (d, served)
}

fn fmt(w: u32, h: u32, f: FrameFormat, fps: u32) -> CameraFormat {
    CameraFormat::new_from(w, h, f, fps)
}

// ------------------------------------------------------------------ camera

#[test]
fn mjpeg_frames_from_a_camera_become_snapshots_that_decode_to_the_negotiated_size() {
    let dir = tempfile::tempdir().unwrap();
    let frame = jpeg_of(&pattern::test_pattern(
        640,
        480,
        3,
        chrono::Utc::now(),
        "UVC",
    ));
    let (mut cam, _) = scripted_camera(
        dir.path(),
        json!({"device": 0, "resolution": "640x480", "fps": 30, "warmup_frames": 2}),
        vec![
            fmt(640, 480, FrameFormat::MJPEG, 30),
            fmt(640, 480, FrameFormat::YUYV, 10),
        ],
        Arc::new(move |_, _| Next::Frame(frame.clone())),
    );
    let out = run(cam.as_mut(), CapabilityAction::Snapshot, json!({})).unwrap();
    assert_eq!(out.artifacts.len(), 1);
    let a = &out.artifacts[0];
    assert_eq!(a.artifact_type, ArtifactType::Image);
    assert_eq!(a.content_type, "image/jpeg");
    assert_eq!(decode_image(&a.bytes).dimensions(), (640, 480));
    assert_eq!(a.metadata["width"], 640);
    assert_eq!(a.metadata["height"], 480);
    assert_eq!(a.metadata["source_format"], "mjpeg");
    assert!(a.metadata["captured_at"].as_str().unwrap().ends_with('Z'));

    let out = run(
        cam.as_mut(),
        CapabilityAction::Snapshot,
        json!({"format": "png"}),
    )
    .unwrap();
    let a = &out.artifacts[0];
    assert_eq!(a.content_type, "image/png");
    assert!(a.bytes.starts_with(b"\x89PNG"));
    assert_eq!(decode_image(&a.bytes).dimensions(), (640, 480));
    assert_eq!(cam.health().status, HealthStatus::Healthy);
}

#[test]
fn yuyv_frames_decode_to_the_colours_the_camera_saw() {
    let dir = tempfile::tempdir().unwrap();
    // Left half red, right half blue, in BT.601 limited-range YUYV.
    let (w, h) = (64u32, 48u32);
    let mut yuyv = Vec::new();
    for _ in 0..h {
        for x in (0..w).step_by(2) {
            if x < w / 2 {
                yuyv.extend_from_slice(&[81, 90, 81, 240]);
            } else {
                yuyv.extend_from_slice(&[41, 240, 41, 110]);
            }
        }
    }
    let (mut cam, _) = scripted_camera(
        dir.path(),
        json!({"device": 0, "format": "yuyv", "resolution": "64x48", "fps": 30}),
        vec![
            fmt(64, 48, FrameFormat::MJPEG, 30),
            fmt(64, 48, FrameFormat::YUYV, 30),
        ],
        Arc::new(move |_, f| {
            assert_eq!(f.format(), FrameFormat::YUYV, "the driver asked for YUYV");
            Next::Frame(yuyv.clone())
        }),
    );
    let out = run(
        cam.as_mut(),
        CapabilityAction::Snapshot,
        json!({"format": "png"}),
    )
    .unwrap();
    let a = &out.artifacts[0];
    assert_eq!(a.metadata["source_format"], "yuyv");
    let img = decode_image(&a.bytes);
    assert_eq!(img.dimensions(), (64, 48));
    let near = |p: &image::Rgb<u8>, want: [u8; 3]| {
        p.0.iter()
            .zip(want)
            .all(|(a, b)| (i32::from(*a) - i32::from(b)).abs() <= 12)
    };
    assert!(
        near(img.get_pixel(5, 20), [255, 0, 0]),
        "{:?}",
        img.get_pixel(5, 20)
    );
    assert!(
        near(img.get_pixel(60, 20), [0, 0, 255]),
        "{:?}",
        img.get_pixel(60, 20)
    );
}

#[test]
fn an_mjpeg_frame_without_a_jpeg_start_marker_is_a_device_error() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cam, _) = scripted_camera(
        dir.path(),
        json!({"device": 0, "resolution": "320x240", "warmup_frames": 0}),
        vec![fmt(320, 240, FrameFormat::MJPEG, 30)],
        Arc::new(|_, _| Next::Frame(vec![0x00, 0x11, 0x22, 0x33, 0xFF, 0xD9])),
    );
    match run(cam.as_mut(), CapabilityAction::Snapshot, json!({})) {
        Err(DriverError::Device(m)) => assert!(m.contains("SOI marker FF D8"), "{m}"),
        other => panic!("expected a device error, got {other:?}"),
    }
}

#[test]
fn a_truncated_mjpeg_frame_is_a_device_error() {
    let dir = tempfile::tempdir().unwrap();
    let good = jpeg_of(&image::RgbImage::from_pixel(
        320,
        240,
        image::Rgb([9, 99, 199]),
    ));
    let cut = good[..good.len() / 3].to_vec();
    let (mut cam, _) = scripted_camera(
        dir.path(),
        json!({"device": 0, "resolution": "320x240", "warmup_frames": 0}),
        vec![fmt(320, 240, FrameFormat::MJPEG, 30)],
        Arc::new(move |_, _| Next::Frame(cut.clone())),
    );
    match run(cam.as_mut(), CapabilityAction::Snapshot, json!({})) {
        Err(DriverError::Device(m)) => assert!(m.contains("truncated"), "{m}"),
        other => panic!("expected a device error, got {other:?}"),
    }
}

#[test]
fn a_yuyv_frame_of_the_wrong_length_is_a_device_error() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cam, _) = scripted_camera(
        dir.path(),
        json!({"device": 0, "format": "yuyv", "resolution": "64x48", "warmup_frames": 0}),
        vec![fmt(64, 48, FrameFormat::YUYV, 30)],
        Arc::new(|_, _| Next::Frame(vec![128; 64 * 48 * 2 - 10])),
    );
    match run(cam.as_mut(), CapabilityAction::Snapshot, json!({})) {
        Err(DriverError::Device(m)) => assert!(m.contains("expected 6144"), "{m}"),
        other => panic!("expected a device error, got {other:?}"),
    }
}

#[test]
fn a_camera_that_stops_delivering_frames_errors_within_the_capture_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let frame = jpeg_of(&image::RgbImage::from_pixel(
        160,
        120,
        image::Rgb([1, 2, 3]),
    ));
    let (mut cam, served) = scripted_camera(
        dir.path(),
        json!({"device": 0, "resolution": "160x120", "warmup_frames": 0, "capture_timeout_ms": 400}),
        vec![fmt(160, 120, FrameFormat::MJPEG, 30)],
        // One good frame, then the camera is gone mid-read.
        Arc::new(move |n, _| {
            if n == 0 {
                Next::Frame(frame.clone())
            } else {
                Next::Hang
            }
        }),
    );
    assert!(run(cam.as_mut(), CapabilityAction::Snapshot, json!({})).is_ok());
    let t0 = Instant::now();
    let e = run(cam.as_mut(), CapabilityAction::Snapshot, json!({})).unwrap_err();
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(1500), "took {took:?}");
    match &e {
        DriverError::Unavailable(m) => assert!(m.contains("400 ms"), "{m}"),
        other => panic!("expected unavailable, got {other:?}"),
    }
    assert!(served.load(Ordering::SeqCst) >= 2);
    let h = cam.health();
    assert_eq!(h.status, HealthStatus::Unhealthy);
    assert!(h.message.unwrap().contains("400 ms"));
}

#[test]
fn negotiation_uses_what_the_camera_offers_and_names_it_when_nothing_fits() {
    let dir = tempfile::tempdir().unwrap();
    let (w, h) = (320u32, 240u32);
    let yuyv = vec![128u8; (w * h * 2) as usize];
    let only_yuyv = vec![
        fmt(w, h, FrameFormat::YUYV, 30),
        fmt(160, 120, FrameFormat::YUYV, 30),
    ];
    let script: Script = Arc::new(move |_, _| Next::Frame(yuyv.clone()));

    // auto + a resolution the camera lacks: nearest size, the format it has.
    let (mut cam, _) = scripted_camera(
        dir.path(),
        json!({"device": 0, "resolution": "1280x720"}),
        only_yuyv.clone(),
        script.clone(),
    );
    let out = run(cam.as_mut(), CapabilityAction::Snapshot, json!({})).unwrap();
    assert_eq!(out.result_summary["source_format"], "yuyv");
    assert_eq!(
        decode_image(&out.artifacts[0].bytes).dimensions(),
        (320, 240)
    );
    assert_eq!(
        cam.metadata()["resolution_options"],
        json!(["160x120", "320x240"])
    );

    // mjpeg demanded from a YUYV-only camera.
    let (mut cam, _) = scripted_camera(
        dir.path(),
        json!({"device": 0, "format": "mjpeg"}),
        only_yuyv,
        script,
    );
    let e = run(cam.as_mut(), CapabilityAction::Snapshot, json!({})).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("no MJPEG mode") && m.contains("YUYV 320x240@30"),
        "{m}"
    );
    assert_eq!(cam.health().status, HealthStatus::Unhealthy);
}

#[test]
fn set_ptz_on_a_fixed_camera_is_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let frame = jpeg_of(&image::RgbImage::new(160, 120));
    let (mut cam, _) = scripted_camera(
        dir.path(),
        json!({"device": 0, "resolution": "160x120", "ptz": true}),
        vec![fmt(160, 120, FrameFormat::MJPEG, 30)],
        Arc::new(move |_, _| Next::Frame(frame.clone())),
    );
    // Declared as PTZ in the bench file, but the opened device has no pan.
    assert!(cam.supported_actions().contains(&CapabilityAction::SetPtz));
    let e = run(cam.as_mut(), CapabilityAction::SetPtz, json!({"pan": 100})).unwrap_err();
    assert!(
        matches!(&e, DriverError::Unsupported { action: CapabilityAction::SetPtz, why, .. } if why.contains("no pan control")),
        "{e:?}"
    );
}

#[test]
fn cameras_without_ptz_do_not_advertise_set_ptz_and_refuse_it() {
    let dir = tempfile::tempdir().unwrap();
    let frame = jpeg_of(&image::RgbImage::new(160, 120));
    let (v4l2, _) = scripted_camera(
        dir.path(),
        json!({"device": 0, "resolution": "160x120"}),
        vec![fmt(160, 120, FrameFormat::MJPEG, 30)],
        Arc::new(move |_, _| Next::Frame(frame.clone())),
    );
    let fixed_sim = sim_camera(dir.path(), json!({}));
    for mut cam in [v4l2, fixed_sim] {
        assert_eq!(cam.metadata()["supports_ptz"], false);
        let actions = cam.supported_actions();
        assert!(actions.contains(&CapabilityAction::Snapshot), "{actions:?}");
        assert!(!actions.contains(&CapabilityAction::SetPtz), "{actions:?}");
        let e = run(cam.as_mut(), CapabilityAction::SetPtz, json!({"pan": 100})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "action `set_ptz` is not supported by this camera: this camera has no pan/tilt/zoom controls (driver setting `ptz` is false)"
        );
    }
    let ptz_sim = sim_camera(dir.path(), json!({"ptz": true}));
    assert!(ptz_sim
        .supported_actions()
        .contains(&CapabilityAction::SetPtz));
    // What the registration carries, before the camera was ever opened.
    assert_eq!(ptz_sim.metadata()["supports_ptz"], true);
}

fn free_video_index() -> u32 {
    (0..64)
        .find(|i| !Path::new(&format!("/dev/video{i}")).exists())
        .unwrap()
}

#[test]
fn without_a_camera_the_v4l2_driver_builds_reports_unhealthy_and_errors_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let i = free_video_index();
    let mut cam = build(&spec(
        CapabilityType::Camera,
        "nokhwa",
        json!({"device": i}),
        dir.path(),
    ))
    .expect("building never opens the device");
    let h = cam.health();
    assert_eq!(h.status, HealthStatus::Unhealthy);
    let why = h.message.unwrap();
    assert!(
        why.starts_with(&format!("no camera at index {i}: /dev/video{i}")),
        "{why}"
    );

    let t0 = Instant::now();
    match run(cam.as_mut(), CapabilityAction::Snapshot, json!({})) {
        // nokhwa's V4L2 open itself fails: the driver got that far.
        Err(DriverError::Unavailable(m)) => {
            assert!(m.contains(&format!("cannot open camera index {i}")), "{m}")
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(3));

    for (device, expect) in [
        (json!("/dev/null"), "not a /dev/video* node"),
        (
            json!("/dev/v4l/by-id/usb-none-video-index0"),
            "no camera at /dev/v4l/by-id",
        ),
        (json!("Bench Cam That Is Not There"), "no camera named"),
    ] {
        let mut cam = build(&spec(
            CapabilityType::Camera,
            "nokhwa",
            json!({"device": device}),
            dir.path(),
        ))
        .unwrap();
        let h = cam.health();
        assert_eq!(h.status, HealthStatus::Unhealthy);
        assert!(h.message.as_deref().unwrap_or("").contains(expect), "{h:?}");
        let e = run(cam.as_mut(), CapabilityAction::Snapshot, json!({})).unwrap_err();
        assert!(e.to_string().contains(expect), "{e}");
    }
}

#[test]
fn bad_camera_settings_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for (settings, key) in [
        (json!({"format": "h264"}), "format"),
        (json!({"resolution": "big"}), "resolution"),
        (json!({"jpeg_quality": 0}), "jpeg_quality"),
        (json!({"colour": "red"}), "colour"),
    ] {
        let e = build(&spec(
            CapabilityType::Camera,
            "nokhwa",
            settings,
            dir.path(),
        ))
        .err()
        .unwrap();
        assert!(e.to_string().contains(&format!("`{key}`")), "{e}");
    }
}

// --------------------------------------------------------- simulated camera

fn sim_camera(dir: &Path, extra: Value) -> Box<dyn Driver> {
    let mut settings = json!({"resolution": "320x240", "fps": 15, "max_fps": 15});
    for (k, v) in extra.as_object().unwrap() {
        settings[k] = v.clone();
    }
    build(&spec(CapabilityType::Camera, "sim", settings, dir)).unwrap()
}

#[test]
fn a_cancelled_clip_keeps_the_frames_recorded_until_then() {
    let dir = tempfile::tempdir().unwrap();
    let mut cam = sim_camera(dir.path(), json!({}));
    let (why, partial) = cancelled_after(
        cam.as_mut(),
        req(
            CapabilityAction::RecordClip,
            json!({"duration_ms": 20_000, "fps": 10}),
        ),
        Duration::from_millis(1500),
    );
    assert!(why.contains("of 20000 ms"), "{why}");
    assert_eq!(partial.result_summary["partial"], true);
    let a = &partial.artifacts[0];
    assert_eq!(a.artifact_type, ArtifactType::VideoClip);
    let parts = clip::read(&a.bytes).expect("the cut clip parses");
    assert!(!parts.is_empty());
    assert_eq!(a.metadata["frame_count"], parts.len());
    // It lasts until its last frame, well short of the 20 s asked for.
    let last = parts.last().unwrap().timestamp_ms;
    assert_eq!(a.duration_ms, Some(last));
    assert!(last < 4000, "{last} ms");
    // The camera records a whole clip again afterwards.
    let out = run(
        cam.as_mut(),
        CapabilityAction::RecordClip,
        json!({"duration_ms": 300, "fps": 10}),
    )
    .unwrap();
    assert_eq!(out.result_summary["partial"], false);
}

#[test]
fn a_simulated_clip_has_the_asked_duration_frame_rate_and_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut cam = sim_camera(dir.path(), json!({}));
    let t0 = Instant::now();
    let out = run(
        cam.as_mut(),
        CapabilityAction::RecordClip,
        json!({"duration_ms": 1000, "fps": 10}),
    )
    .unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(1000),
        "a clip takes real time"
    );
    let a = &out.artifacts[0];
    assert_eq!(a.artifact_type, ArtifactType::VideoClip);
    assert_eq!(a.duration_ms, Some(1000));
    assert!(a
        .content_type
        .starts_with("multipart/x-mixed-replace; boundary="));
    let parts = clip::read(&a.bytes).expect("the clip parses");
    // At most 10 fps (the camera delivers 15); fewer when this machine is
    // too busy to render every frame in time.
    assert!(
        (5..=11).contains(&parts.len()),
        "{} frames at 10 fps in 1 s",
        parts.len()
    );
    assert_eq!(a.metadata["frame_count"], parts.len());
    for w in parts.windows(2) {
        let gap = w[1].timestamp_ms - w[0].timestamp_ms;
        assert!(gap >= 85, "frames {gap} ms apart at 10 fps");
    }
    assert!(parts.last().unwrap().timestamp_ms < 1000);
    for p in &parts {
        assert_eq!(decode_image(&p.jpeg).dimensions(), (320, 240));
    }
}

#[test]
fn a_stream_stays_at_the_edge_and_stop_keeps_only_what_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let mut cam = sim_camera(dir.path(), json!({"ring_seconds": 1}));
    let out = run(cam.as_mut(), CapabilityAction::StartStream, json!({})).unwrap();
    assert_eq!(out.result_summary["streaming"], true);
    assert!(out.artifacts.is_empty());
    std::thread::sleep(Duration::from_millis(1800));

    // A snapshot while streaming comes from the live stream.
    let snap = run(cam.as_mut(), CapabilityAction::Snapshot, json!({})).unwrap();
    assert_eq!(snap.result_summary["from_stream"], true);
    assert_eq!(
        decode_image(&snap.artifacts[0].bytes).dimensions(),
        (320, 240)
    );

    let out = run(
        cam.as_mut(),
        CapabilityAction::StopStream,
        json!({"keep": "clip", "last_ms": 400}),
    )
    .unwrap();
    let s = &out.result_summary;
    let in_ring = s["frames_in_ring"].as_u64().unwrap();
    // At most 1 s of 15 fps (fewer frames on a busy machine).
    assert!(
        (5..=17).contains(&in_ring),
        "1 s of 15 fps in the ring, got {in_ring}"
    );
    assert!(s["ring_span_ms"].as_u64().unwrap() <= 1000);
    assert!(
        s["evicted_frames"].as_u64().unwrap() > 0,
        "older frames were forgotten"
    );
    assert_eq!(out.artifacts.len(), 1);
    let parts = clip::read(&out.artifacts[0].bytes).unwrap();
    // Only the last 400 ms of the ring (frame timing depends on the load).
    assert!(
        parts.len() >= 2 && (parts.len() as u64) < in_ring,
        "{} of {in_ring}",
        parts.len()
    );
    let span = parts.last().unwrap().timestamp_ms - parts[0].timestamp_ms;
    assert!(span <= 400, "kept frames span {span} ms");
    assert_eq!(s["kept_frames"], parts.len());

    // Stopping again: nothing is running.
    let e = run(cam.as_mut(), CapabilityAction::StopStream, json!({})).unwrap_err();
    assert!(matches!(e, DriverError::InvalidParams { .. }), "{e:?}");

    // keep = none uploads nothing; keyframes uploads a few images.
    run(cam.as_mut(), CapabilityAction::StartStream, json!({})).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let out = run(
        cam.as_mut(),
        CapabilityAction::StopStream,
        json!({"keep": "none"}),
    )
    .unwrap();
    assert!(out.artifacts.is_empty());
    assert!(out.result_summary["frames_in_ring"].as_u64().unwrap() > 3);

    run(cam.as_mut(), CapabilityAction::StartStream, json!({})).unwrap();
    std::thread::sleep(Duration::from_millis(900));
    let out = run(
        cam.as_mut(),
        CapabilityAction::StopStream,
        json!({"keep": "keyframes", "max_keyframes": 3, "change_threshold": 0.0}),
    )
    .unwrap();
    assert!(
        (1..=3).contains(&out.artifacts.len()),
        "{}",
        out.artifacts.len()
    );
    for a in &out.artifacts {
        assert_eq!(a.artifact_type, ArtifactType::Image);
        assert_eq!(a.metadata["keyframe"], true);
        assert_eq!(decode_image(&a.bytes).dimensions(), (320, 240));
    }
}

#[test]
fn the_simulated_camera_refuses_a_format_it_lacks_and_can_be_unplugged() {
    let dir = tempfile::tempdir().unwrap();
    let mut cam = sim_camera(
        dir.path(),
        json!({"offered_formats": ["yuyv"], "format": "mjpeg"}),
    );
    let e = run(cam.as_mut(), CapabilityAction::Snapshot, json!({})).unwrap_err();
    assert!(e.to_string().contains("no MJPEG mode"), "{e}");

    let mut cam = sim_camera(dir.path(), json!({"offered_formats": ["yuyv"]}));
    let out = run(cam.as_mut(), CapabilityAction::Snapshot, json!({})).unwrap();
    assert_eq!(out.result_summary["source_format"], "yuyv");

    let mut cam = sim_camera(
        dir.path(),
        json!({"connected": false, "device": "bench-cam"}),
    );
    let h = cam.health();
    assert_eq!(h.status, HealthStatus::Unhealthy);
    assert!(h.message.unwrap().contains("no camera named \"bench-cam\""));
    let e = run(cam.as_mut(), CapabilityAction::Snapshot, json!({})).unwrap_err();
    assert!(matches!(e, DriverError::Unavailable(_)), "{e:?}");
}

#[test]
fn a_ptz_capable_simulated_camera_moves_within_its_range() {
    let dir = tempfile::tempdir().unwrap();
    let mut cam = sim_camera(dir.path(), json!({"ptz": true}));
    let out = run(
        cam.as_mut(),
        CapabilityAction::SetPtz,
        json!({"pan": 3600, "zoom": 200}),
    )
    .unwrap();
    assert_eq!(out.result_summary["pan"], 3600);
    assert_eq!(cam.metadata()["supports_ptz"], true);
    let e = run(
        cam.as_mut(),
        CapabilityAction::SetPtz,
        json!({"zoom": 9000}),
    )
    .unwrap_err();
    assert!(
        matches!(&e, DriverError::InvalidParams { field, .. } if field == "zoom"),
        "{e:?}"
    );
    let e = run(cam.as_mut(), CapabilityAction::SetPtz, json!({})).unwrap_err();
    assert!(matches!(e, DriverError::InvalidParams { .. }));
}

// -------------------------------------------------------------- microphone

fn goertzel(x: &[f32], rate: f32, hz: f32) -> f32 {
    let c = 2.0 * (2.0 * std::f32::consts::PI * hz / rate).cos();
    let (mut s1, mut s2) = (0.0f32, 0.0f32);
    for v in x {
        let s = v + c * s1 - s2;
        s2 = s1;
        s1 = s;
    }
    (s1 * s1 + s2 * s2 - c * s1 * s2) / (x.len() as f32).powi(2)
}

fn wav_mono(bytes: &[u8]) -> (Vec<f32>, hound::WavSpec) {
    let mut r = hound::WavReader::new(std::io::Cursor::new(bytes)).unwrap();
    let spec = r.spec();
    assert_eq!(spec.bits_per_sample, 16);
    let s: Vec<f32> = r
        .samples::<i16>()
        .map(|s| f32::from(s.unwrap()) / 32768.0)
        .collect();
    let ch = usize::from(spec.channels);
    (
        s.chunks(ch)
            .map(|f| f.iter().sum::<f32>() / ch as f32)
            .collect(),
        spec,
    )
}

/// A simulated microphone with driver `settings` (e.g.
/// `{"sample_rate": 16000}`).
fn sim_microphone(dir: &Path, settings: Value) -> Box<dyn Driver> {
    build(&spec(CapabilityType::Microphone, "sim", settings, dir)).unwrap()
}

#[test]
fn a_simulated_recording_takes_real_time_and_is_a_wav_of_that_length_and_pitch() {
    let dir = tempfile::tempdir().unwrap();
    let mut mic = sim_microphone(dir.path(), json!({"sample_rate": 16000}));
    assert_eq!(mic.health().status, HealthStatus::Healthy);
    let t0 = Instant::now();
    let out = run(
        mic.as_mut(),
        CapabilityAction::RecordAudio,
        json!({"duration_ms": 1000}),
    )
    .unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(950));
    let a = &out.artifacts[0];
    assert_eq!(a.artifact_type, ArtifactType::AudioClip);
    assert_eq!(a.content_type, "audio/wav");
    assert_eq!(a.duration_ms, Some(1000));
    assert_eq!(a.metadata["sample_rate"], 16000);
    assert_eq!(a.metadata["channels"], 1);
    let (x, spec) = wav_mono(&a.bytes);
    assert_eq!(spec.sample_rate, 16000);
    assert_eq!(x.len(), 16000);
    let p440 = goertzel(&x, 16000.0, 440.0);
    for other in [330.0, 550.0, 880.0] {
        assert!(
            p440 > 50.0 * goertzel(&x, 16000.0, other),
            "440 Hz dominates {other} Hz"
        );
    }
    // -12 dBFS peak sine = -15 dBFS RMS.
    let rms = out.result_summary["rms_dbfs"].as_f64().unwrap();
    assert!((rms + 15.0).abs() < 0.5, "{rms}");
    // A steady tone is the noise floor, not voice activity.
    assert_eq!(out.result_summary["voice_detected"], false);
}

#[test]
fn a_cancelled_recording_keeps_the_audio_recorded_until_then() {
    let dir = tempfile::tempdir().unwrap();
    let mut mic = sim_microphone(dir.path(), json!({"sample_rate": 16000}));
    let (why, partial) = cancelled_after(
        mic.as_mut(),
        req(
            CapabilityAction::RecordAudio,
            json!({"duration_ms": 20_000}),
        ),
        Duration::from_millis(1200),
    );
    assert!(why.contains("of 20000 ms"), "{why}");
    assert_eq!(partial.result_summary["partial"], true);
    let a = &partial.artifacts[0];
    assert_eq!(a.content_type, "audio/wav");
    let (x, spec) = wav_mono(&a.bytes);
    assert_eq!(spec.sample_rate, 16000);
    // About 1.2 s of the tone, as the summary says.
    let kept_ms = partial.result_summary["duration_ms"].as_u64().unwrap();
    assert!((1100..2500).contains(&kept_ms), "{kept_ms} ms");
    assert_eq!(x.len() as u64 * 1000 / 16000, kept_ms);
    assert_eq!(a.duration_ms, Some(kept_ms));
    assert!(goertzel(&x, 16000.0, 440.0) > 50.0 * goertzel(&x, 16000.0, 880.0));
}

#[test]
fn the_simulated_microphone_refuses_a_rate_it_does_not_have() {
    let dir = tempfile::tempdir().unwrap();
    let mut mic = sim_microphone(dir.path(), json!({"sample_rate": 12345}));
    let e = run(
        mic.as_mut(),
        CapabilityAction::RecordAudio,
        json!({"duration_ms": 100}),
    )
    .unwrap_err();
    assert!(
        matches!(&e, DriverError::Device(m) if m.contains("12345 Hz")),
        "{e:?}"
    );
    let e = run(
        mic.as_mut(),
        CapabilityAction::RecordAudio,
        json!({"duration_ms": 999999}),
    )
    .unwrap_err();
    assert!(matches!(&e, DriverError::InvalidParams { field, .. } if field == "duration_ms"));
}

#[test]
fn voice_activity_segments_follow_the_bursts() {
    let dir = tempfile::tempdir().unwrap();
    let mut mic = sim_microphone(
        dir.path(),
        json!({"sample_rate": 16000, "signal": "speech_bursts"}),
    );
    let out = run(
        mic.as_mut(),
        CapabilityAction::RecordAudio,
        json!({"duration_ms": 2000}),
    )
    .unwrap();
    let vad = &out.artifacts[0].metadata["vad"];
    let segs = vad["segments"].as_array().unwrap();
    assert_eq!(segs.len(), 2, "{vad}");
    for s in segs {
        let len = s["end_ms"].as_u64().unwrap() - s["start_ms"].as_u64().unwrap();
        assert!((200..=450).contains(&len), "{s}");
    }
    let ratio = vad["voice_activity_ratio"].as_f64().unwrap();
    assert!((0.1..=0.45).contains(&ratio), "{ratio}");
}

#[test]
fn an_audio_stream_keeps_its_ring_and_returns_the_excerpt_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let mut mic = sim_microphone(
        dir.path(),
        json!({"sample_rate": 8000, "ring_seconds": 1, "signal": "speech_bursts"}),
    );
    let out = run(mic.as_mut(), CapabilityAction::StartAudioStream, json!({})).unwrap();
    assert!(out.artifacts.is_empty());
    std::thread::sleep(Duration::from_millis(1600));
    let out = run(
        mic.as_mut(),
        CapabilityAction::StopAudioStream,
        json!({"keep": "clip", "last_ms": 500}),
    )
    .unwrap();
    let (x, _) = wav_mono(&out.artifacts[0].bytes);
    assert_eq!(x.len(), 4000, "exactly the last 500 ms");
    assert!(out.result_summary["stream_ms"].as_u64().unwrap() >= 1600);

    run(mic.as_mut(), CapabilityAction::StartAudioStream, json!({})).unwrap();
    std::thread::sleep(Duration::from_millis(1300));
    let out = run(
        mic.as_mut(),
        CapabilityAction::StopAudioStream,
        json!({"keep": "voice"}),
    )
    .unwrap();
    assert_eq!(out.artifacts.len(), 1);
    let ring_ms = out.result_summary["ring_ms"].as_u64().unwrap();
    assert!(
        ring_ms <= 1000,
        "the ring holds at most 1 s, held {ring_ms}"
    );
    let a = &out.artifacts[0];
    assert!(a.duration_ms.unwrap() <= ring_ms);
    assert!(a.metadata.contains_key("excerpt_offset_ms"));
    assert!(!a.metadata["vad"]["segments"].as_array().unwrap().is_empty());

    // Nothing but silence: keep = voice uploads nothing.
    let mut quiet = sim_microphone(
        dir.path(),
        json!({"sample_rate": 8000, "ring_seconds": 1, "signal": "silence"}),
    );
    run(
        quiet.as_mut(),
        CapabilityAction::StartAudioStream,
        json!({}),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let out = run(
        quiet.as_mut(),
        CapabilityAction::StopAudioStream,
        json!({"keep": "voice"}),
    )
    .unwrap();
    assert!(out.artifacts.is_empty());
    assert_eq!(out.result_summary["voice_detected"], false);
}

#[test]
fn with_no_sound_card_the_cpal_microphone_builds_and_reports_why_it_is_unhealthy() {
    let dir = tempfile::tempdir().unwrap();
    let mut mic = build(&spec(
        CapabilityType::Microphone,
        "cpal",
        json!({"device": "benchlink-no-such-input"}),
        dir.path(),
    ))
    .unwrap();
    let h = mic.health();
    assert_eq!(h.status, HealthStatus::Unhealthy);
    assert!(
        h.message.unwrap().starts_with("no audio input device"),
        "reason given"
    );
    let e = run(
        mic.as_mut(),
        CapabilityAction::RecordAudio,
        json!({"duration_ms": 200}),
    )
    .unwrap_err();
    assert!(
        matches!(&e, DriverError::Unavailable(m) if m.contains("benchlink-no-such-input")),
        "{e:?}"
    );

    // This machine has no sound card and no audio server: even the default
    // device is reported as missing (not ALSA's null sink).
    if !Path::new("/dev/snd").exists() && std::env::var_os("PULSE_SERVER").is_none() {
        let mut mic = build(&spec(
            CapabilityType::Microphone,
            "cpal",
            json!({}),
            dir.path(),
        ))
        .unwrap();
        let h = mic.health();
        assert_eq!(h.status, HealthStatus::Unhealthy, "{h:?}");
        assert!(h.message.unwrap().starts_with("no audio input device"));
        assert!(run(
            mic.as_mut(),
            CapabilityAction::RecordAudio,
            json!({"duration_ms": 100})
        )
        .is_err());
    }
}

// ----------------------------------------------------------------- speaker

fn write_tone_wav(path: &Path, ms: u32, rate: u32, hz: f32) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for i in 0..(rate * ms / 1000) {
        let t = i as f32 / rate as f32;
        w.write_sample((0.5 * (2.0 * std::f32::consts::PI * hz * t).sin() * 32767.0) as i16)
            .unwrap();
    }
    w.finalize().unwrap();
}

fn sim_speaker(dir: &Path, library: &Path, extra: Value) -> Box<dyn Driver> {
    let mut settings = json!({"library_dir": library});
    for (k, v) in extra.as_object().unwrap() {
        settings[k] = v.clone();
    }
    build(&spec(CapabilityType::Speaker, "sim", settings, dir)).unwrap()
}

#[test]
fn files_outside_the_speaker_library_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("library");
    std::fs::create_dir(&lib).unwrap();
    write_tone_wav(&dir.path().join("outside.wav"), 100, 8000, 440.0);
    std::os::unix::fs::symlink(dir.path().join("outside.wav"), lib.join("sneaky.wav")).unwrap();
    let mut spk = sim_speaker(dir.path(), &lib, json!({}));
    for name in [
        "../outside.wav",
        "/etc/passwd",
        "sneaky.wav",
        "./../library/../outside.wav",
    ] {
        let e = run(
            spk.as_mut(),
            CapabilityAction::PlayAudioFile,
            json!({"file": name}),
        )
        .unwrap_err();
        assert!(
            matches!(&e, DriverError::InvalidParams { field, .. } if field == "file"),
            "{name}: {e:?}"
        );
    }
    std::fs::write(lib.join("noise.wav"), b"RIFF not really a wav").unwrap();
    let e = run(
        spk.as_mut(),
        CapabilityAction::PlayAudioFile,
        json!({"file": "noise.wav"}),
    )
    .unwrap_err();
    assert!(e.to_string().contains("cannot decode"), "{e}");
}

#[test]
fn the_simulated_speaker_plays_in_real_time_and_stop_playback_cuts_it() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("library");
    std::fs::create_dir(&lib).unwrap();
    write_tone_wav(&lib.join("beep.wav"), 600, 16000, 440.0);
    write_tone_wav(&lib.join("long.wav"), 5000, 8000, 440.0);
    let mut spk = sim_speaker(dir.path(), &lib, json!({"max_volume": 0.5}));

    let t0 = Instant::now();
    let out = run(
        spk.as_mut(),
        CapabilityAction::PlayAudioFile,
        json!({"file": "beep.wav"}),
    )
    .unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(590) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    assert_eq!(out.result_summary["completed"], true);
    assert_eq!(out.result_summary["sound_duration_ms"], 600);
    assert_eq!(out.result_summary["volume"], 0.5, "started at max_volume");

    let out = run(
        spk.as_mut(),
        CapabilityAction::PlayAudioFile,
        json!({"file": "long.wav", "wait": false}),
    )
    .unwrap();
    assert_eq!(out.result_summary["playing"], true);
    std::thread::sleep(Duration::from_millis(300));
    let out = run(spk.as_mut(), CapabilityAction::StopPlayback, json!({})).unwrap();
    assert_eq!(out.result_summary["stopped"], true);
    let pos = out.result_summary["position_ms"].as_u64().unwrap();
    assert!((250..1500).contains(&pos), "{pos}");
    let out = run(spk.as_mut(), CapabilityAction::StopPlayback, json!({})).unwrap();
    assert_eq!(out.result_summary["stopped"], false, "nothing left to stop");

    // A blocking play is cut by the session's cancel token.
    let r = req(CapabilityAction::PlayAudioFile, json!({"file": "long.wav"}));
    let cancel = r.cancel.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        cancel.cancel();
    });
    let t0 = Instant::now();
    let e = spk.execute(&r).unwrap_err();
    t.join().unwrap();
    assert!(matches!(e, DriverError::Cancelled(_)), "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[test]
fn volume_requests_are_capped_at_max_volume() {
    let dir = tempfile::tempdir().unwrap();
    let mut spk = sim_speaker(
        dir.path(),
        dir.path(),
        json!({"max_volume": 0.6, "volume": 0.3}),
    );
    let out = run(
        spk.as_mut(),
        CapabilityAction::SetVolume,
        json!({"volume": 0.9}),
    )
    .unwrap();
    assert_eq!(out.result_summary["volume"], json!(0.6f32));
    assert_eq!(out.result_summary["capped"], true);
    let out = run(
        spk.as_mut(),
        CapabilityAction::SetVolume,
        json!({"volume": 0.2}),
    )
    .unwrap();
    assert_eq!(out.result_summary["capped"], false);
    let e = run(
        spk.as_mut(),
        CapabilityAction::SetVolume,
        json!({"volume": 1.5}),
    )
    .unwrap_err();
    assert!(matches!(&e, DriverError::InvalidParams { field, .. } if field == "volume"));
}

#[test]
fn tts_is_rendered_with_espeak_into_a_wav_artifact_and_played() {
    if tool_missing("espeak-ng") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut spk = sim_speaker(dir.path(), dir.path(), json!({}));
    let t0 = Instant::now();
    let out = run(
        spk.as_mut(),
        CapabilityAction::PlayTts,
        json!({"text": "Bench check, one two three.", "voice": "en", "rate": 200}),
    )
    .unwrap();
    assert_eq!(out.artifacts.len(), 1);
    let a = &out.artifacts[0];
    assert_eq!(a.artifact_type, ArtifactType::AudioClip);
    assert_eq!(a.content_type, "audio/wav");
    let (x, spec) = wav_mono(&a.bytes);
    let ms = x.len() as u64 * 1000 / u64::from(spec.sample_rate);
    assert!(ms > 500, "speech lasts a while: {ms} ms");
    assert_eq!(a.duration_ms, Some(ms));
    assert_eq!(a.metadata["text"], "Bench check, one two three.");
    assert!(x.iter().any(|s| s.abs() > 0.05), "not silence");
    assert!(
        t0.elapsed() >= Duration::from_millis(ms),
        "played for its length"
    );
    assert_eq!(out.result_summary["completed"], true);

    // Text that looks like an option stays text.
    let out = run(
        spk.as_mut(),
        CapabilityAction::PlayTts,
        json!({"text": "--version", "wait": false}),
    )
    .unwrap();
    assert_eq!(out.artifacts.len(), 1);
    let e = run(
        spk.as_mut(),
        CapabilityAction::PlayTts,
        json!({"text": "hi", "voice": "-x /tmp"}),
    )
    .unwrap_err();
    assert!(matches!(&e, DriverError::InvalidParams { field, .. } if field == "voice"));
}

#[test]
fn with_no_sound_card_the_rodio_speaker_builds_and_reports_why_it_is_unhealthy() {
    let dir = tempfile::tempdir().unwrap();
    write_tone_wav(&dir.path().join("beep.wav"), 100, 8000, 440.0);
    let mut spk = build(&spec(
        CapabilityType::Speaker,
        "rodio",
        json!({"device": "benchlink-no-such-output", "library_dir": dir.path()}),
        dir.path(),
    ))
    .unwrap();
    let h = spk.health();
    assert_eq!(h.status, HealthStatus::Unhealthy);
    assert!(h.message.unwrap().starts_with("no audio output device"));
    let e = run(
        spk.as_mut(),
        CapabilityAction::PlayAudioFile,
        json!({"file": "beep.wav"}),
    )
    .unwrap_err();
    assert!(
        matches!(&e, DriverError::Unavailable(m) if m.contains("benchlink-no-such-output")),
        "{e:?}"
    );

    if !Path::new("/dev/snd").exists() && std::env::var_os("PULSE_SERVER").is_none() {
        let mut spk = build(&spec(
            CapabilityType::Speaker,
            "rodio",
            json!({"library_dir": dir.path()}),
            dir.path(),
        ))
        .unwrap();
        let h = spk.health();
        assert_eq!(h.status, HealthStatus::Unhealthy, "{h:?}");
        assert!(h.message.unwrap().starts_with("no audio output device"));
        let e = run(
            spk.as_mut(),
            CapabilityAction::PlayAudioFile,
            json!({"file": "beep.wav"}),
        )
        .unwrap_err();
        assert!(matches!(e, DriverError::Unavailable(_)), "{e:?}");
    }
}

// ------------------------------------------------------------------ screen

#[test]
fn the_simulated_screen_reads_back_the_text_it_shows() {
    let dir = tempfile::tempdir().unwrap();
    let mut scr = build(&spec(
        CapabilityType::ScreenCapture,
        "sim",
        json!({"lines": ["STATUS: READY", "BATTERY 87%"]}),
        dir.path(),
    ))
    .unwrap();
    let out = run(scr.as_mut(), CapabilityAction::Screenshot, json!({})).unwrap();
    assert_eq!(out.artifacts[0].content_type, "image/png");
    assert_eq!(
        decode_image(&out.artifacts[0].bytes).dimensions(),
        (800, 480)
    );

    let out = run(
        scr.as_mut(),
        CapabilityAction::Ocr,
        json!({"expect_text": "battery 87%"}),
    )
    .unwrap();
    assert_eq!(out.result_summary["matched"], true);
    let kinds: Vec<ArtifactType> = out.artifacts.iter().map(|a| a.artifact_type).collect();
    assert_eq!(kinds, vec![ArtifactType::Image, ArtifactType::OcrText]);
    let text = String::from_utf8(out.artifacts[1].bytes.clone()).unwrap();
    assert!(
        text.starts_with("DEVICE UNDER TEST\nSTATUS: READY\nBATTERY 87%\nTIME "),
        "{text}"
    );

    let out = run(
        scr.as_mut(),
        CapabilityAction::RecordScreenClip,
        json!({"duration_ms": 1000}),
    )
    .unwrap();
    assert_eq!(out.artifacts[0].duration_ms, Some(1000));
    let parts = clip::read(&out.artifacts[0].bytes).unwrap();
    // 5 fps, fewer when rendering is slow on a busy machine.
    assert!((2..=6).contains(&parts.len()), "{}", parts.len());
    assert!(parts.iter().all(|p| p.timestamp_ms < 1000));
    assert_eq!(decode_image(&parts[0].jpeg).dimensions(), (800, 480));

    let mut gone = build(&spec(
        CapabilityType::ScreenCapture,
        "sim",
        json!({"connected": false}),
        dir.path(),
    ))
    .unwrap();
    assert_eq!(gone.health().status, HealthStatus::Unhealthy);
    assert!(matches!(
        run(gone.as_mut(), CapabilityAction::Screenshot, json!({})),
        Err(DriverError::Unavailable(_))
    ));
}

fn text_png(path: &Path, lines: &[&str]) {
    let mut img = image::RgbImage::from_pixel(
        900,
        60 + 70 * lines.len() as u32,
        image::Rgb([255, 255, 255]),
    );
    for (i, l) in lines.iter().enumerate() {
        pattern::draw_text(&mut img, 30, 30 + 70 * i as u32, 6, l, [0, 0, 0]);
    }
    img.save(path).unwrap();
}

#[test]
fn the_command_screen_runs_its_tools_without_a_shell_and_reports_their_failures() {
    let dir = tempfile::tempdir().unwrap();
    let shot = dir.path().join("screen.png");
    text_png(&shot, &["PASS 42"]);
    let mut scr = build(&spec(
        CapabilityType::ScreenCapture,
        "command",
        json!({"screenshot_command": format!("cp {} {{out}}", shot.display())}),
        dir.path(),
    ))
    .unwrap();
    assert_eq!(scr.health().status, HealthStatus::Healthy);
    let out = run(scr.as_mut(), CapabilityAction::Screenshot, json!({})).unwrap();
    assert_eq!(out.artifacts[0].content_type, "image/png");
    assert_eq!(out.result_summary["width"], 900);
    let e = run(
        scr.as_mut(),
        CapabilityAction::RecordScreenClip,
        json!({"duration_ms": 500}),
    )
    .unwrap_err();
    assert!(matches!(e, DriverError::Unsupported { .. }), "{e:?}");

    let mut failing = build(&spec(
        CapabilityType::ScreenCapture,
        "command",
        json!({"screenshot_command": "sh -c 'echo cannot open display :0 >&2; exit 1' sh {out}"}),
        dir.path(),
    ))
    .unwrap();
    let e = run(failing.as_mut(), CapabilityAction::Screenshot, json!({})).unwrap_err();
    assert!(e.to_string().contains("cannot open display :0"), "{e}");

    let mut slow = build(&spec(
        CapabilityType::ScreenCapture,
        "command",
        json!({"screenshot_command": "sh -c 'sleep 10' sh {out}", "timeout_ms": 300}),
        dir.path(),
    ))
    .unwrap();
    let t0 = Instant::now();
    let e = run(slow.as_mut(), CapabilityAction::Screenshot, json!({})).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert!(e.to_string().contains("timed out after 300 ms"), "{e}");

    let mut missing = build(&spec(
        CapabilityType::ScreenCapture,
        "command",
        json!({"screenshot_command": "benchlink-no-grabber {out}"}),
        dir.path(),
    ))
    .unwrap();
    let h = missing.health();
    assert_eq!(h.status, HealthStatus::Unhealthy);
    assert!(h.message.unwrap().contains("benchlink-no-grabber"));
}

#[test]
fn ocr_through_tesseract_reads_the_screenshot_text() {
    if tool_missing("tesseract") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let shot = dir.path().join("screen.png");
    text_png(&shot, &["STATUS READY", "TEST 42"]);
    let mut scr = build(&spec(
        CapabilityType::ScreenCapture,
        "command",
        json!({"screenshot_command": format!("cp {} {{out}}", shot.display())}),
        dir.path(),
    ))
    .unwrap();
    let out = run(
        scr.as_mut(),
        CapabilityAction::Ocr,
        json!({"expect_text": "status ready"}),
    )
    .unwrap();
    let ocr = out
        .artifacts
        .iter()
        .find(|a| a.artifact_type == ArtifactType::OcrText)
        .unwrap();
    let text = String::from_utf8_lossy(&ocr.bytes);
    assert_eq!(
        out.result_summary["matched"], true,
        "tesseract read: {text:?}"
    );
    assert!(text.contains("42"), "{text:?}");
    assert_eq!(ocr.metadata["engine"], "tesseract");
}
