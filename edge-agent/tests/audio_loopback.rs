//! Speaker and microphone drivers end to end through a real audio server:
//! a user-level PulseAudio with a null sink, started by each test in its own
//! HOME and XDG_RUNTIME_DIR and stopped when the test ends (also on panic).
//! The speaker (rodio) plays into the sink; the microphone (cpal) records
//! the sink's monitor source.
//!
//! Without `pulseaudio` these tests skip, except under `CI=true`, where a
//! server that cannot start is a failure.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use edge_agent::drivers::{
    build, ActionOutcome, ActionRequest, CancelToken, Driver, DriverError, DriverSpec,
};
use serde_json::{json, Map, Value};
use shared_protocol::capability::{CapabilityAction, CapabilityType, HealthStatus};

/// One PulseAudio server at a time: the process environment points cpal at it.
static SERIAL: Mutex<()> = Mutex::new(());

/// A private PulseAudio server ([`benchlink_testkit::PulseServer`]) this
/// process's audio clients (cpal, rodio) use while the guard lives.
struct PulseServer(benchlink_testkit::PulseServer);

impl PulseServer {
    /// Start the server and point this process at it, or `None` (skip)
    /// when pulseaudio is unavailable outside CI.
    fn start() -> Option<Self> {
        let server = match benchlink_testkit::PulseServer::start() {
            Ok(s) => s,
            Err(why) => {
                benchlink_testkit::skip_unless_ci(&why);
                return None;
            }
        };
        for (k, v) in server.env() {
            std::env::set_var(k, v);
        }
        Some(PulseServer(server))
    }

    fn pactl(&self, args: &[&str]) -> String {
        self.0.pactl(args).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Drop for PulseServer {
    fn drop(&mut self) {
        std::env::remove_var("PULSE_SERVER");
        std::env::remove_var("PULSE_COOKIE");
    }
}

fn spec(kind: CapabilityType, backend: &str, settings: Value, dir: &Path) -> DriverSpec {
    DriverSpec {
        capability_id: format!("loop-{}", kind.as_str()),
        capability_type: kind,
        backend: backend.into(),
        settings: settings.as_object().cloned().unwrap_or_default(),
        state_dir: dir.to_path_buf(),
    }
}

fn run(
    d: &mut dyn Driver,
    action: CapabilityAction,
    params: Value,
) -> Result<ActionOutcome, DriverError> {
    d.execute(&ActionRequest {
        session_id: "sess-loop".into(),
        action,
        params: params.as_object().cloned().unwrap_or_else(Map::new),
        deadline: Instant::now() + Duration::from_secs(60),
        cancel: CancelToken::new(),
    })
}

fn write_tone(path: &Path, ms: u32, hz: f32) {
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: 48_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for i in 0..(48 * ms) {
        let t = i as f32 / 48_000.0;
        let s = (0.5 * (2.0 * std::f32::consts::PI * hz * t).sin() * 32767.0) as i16;
        w.write_sample(s).unwrap();
        w.write_sample(s).unwrap();
    }
    w.finalize().unwrap();
}

/// Mono samples and sample rate of a WAV artifact.
fn mono(bytes: &[u8]) -> (Vec<f32>, u32) {
    let mut r = hound::WavReader::new(std::io::Cursor::new(bytes)).unwrap();
    let spec = r.spec();
    let s: Vec<f32> = r
        .samples::<i16>()
        .map(|s| f32::from(s.unwrap()) / 32768.0)
        .collect();
    let ch = usize::from(spec.channels);
    (
        s.chunks(ch)
            .map(|f| f.iter().sum::<f32>() / ch as f32)
            .collect(),
        spec.sample_rate,
    )
}

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

/// The voice-activity segments in an audio artifact's metadata, ms.
fn segments(out: &ActionOutcome) -> Vec<(u64, u64)> {
    out.artifacts[0].metadata["vad"]["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["start_ms"].as_u64().unwrap(),
                s["end_ms"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn mic(dir: &Path) -> Box<dyn Driver> {
    build(&spec(
        CapabilityType::Microphone,
        "cpal",
        json!({"device": "vsink.monitor", "sample_rate": 48000, "channels": 1}),
        dir,
    ))
    .unwrap()
}

fn speaker(dir: &Path, library: &Path) -> Box<dyn Driver> {
    build(&spec(
        CapabilityType::Speaker,
        "rodio",
        json!({"library_dir": library, "stall_timeout_ms": 1000}),
        dir,
    ))
    .unwrap()
}

#[test]
fn a_tone_played_through_the_speaker_is_recorded_from_the_sink_monitor_at_its_pitch_and_length() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(_pulse) = PulseServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_tone(&dir.path().join("tone440.wav"), 1000, 440.0);
    write_tone(&dir.path().join("click.wav"), 50, 1000.0);
    let mut mic = mic(dir.path());
    let mut spk = speaker(dir.path(), dir.path());
    assert_eq!(
        mic.health().status,
        HealthStatus::Healthy,
        "{:?}",
        mic.health()
    );
    assert_eq!(
        spk.health().status,
        HealthStatus::Healthy,
        "{:?}",
        spk.health()
    );
    // Opening the output waits out the server's initial buffering; do it
    // before the recording starts so the tone plays on time.
    run(
        spk.as_mut(),
        CapabilityAction::PlayAudioFile,
        json!({"file": "click.wav"}),
    )
    .unwrap();

    let recorder = std::thread::spawn(move || {
        let out = run(
            mic.as_mut(),
            CapabilityAction::RecordAudio,
            json!({"duration_ms": 2500}),
        );
        (out, mic)
    });
    std::thread::sleep(Duration::from_millis(600));
    let t0 = Instant::now();
    let played = run(
        spk.as_mut(),
        CapabilityAction::PlayAudioFile,
        json!({"file": "tone440.wav"}),
    )
    .unwrap();
    let play_time = t0.elapsed();
    let (recorded, _mic) = recorder.join().unwrap();
    let recorded = recorded.unwrap();

    assert_eq!(played.result_summary["completed"], true);
    let played_ms = played.result_summary["played_ms"].as_u64().unwrap();
    assert!((950..1500).contains(&played_ms), "{played_ms}");
    assert!(
        play_time >= Duration::from_millis(950) && play_time < Duration::from_millis(1800),
        "played for {play_time:?}"
    );
    let a = &recorded.artifacts[0];
    assert_eq!(a.duration_ms, Some(2500));
    assert_eq!(a.metadata["sample_rate"], 48000);
    let (x, rate) = mono(&a.bytes);
    assert_eq!(rate, 48_000);
    assert_eq!(x.len(), 120_000, "2.5 s at 48 kHz");

    let segs = segments(&recorded);
    assert_eq!(segs.len(), 1, "one burst of sound: {segs:?}");
    let (start, end) = segs[0];
    let len = end - start;
    assert!(
        (900..=1100).contains(&len),
        "the tone lasted {len} ms in the recording"
    );

    // Pitch: within the burst, 440 Hz dominates its neighbours, and the
    // zero-crossing rate is twice the frequency.
    let a_i = (start as usize + 100) * 48;
    let b_i = (end as usize - 100) * 48;
    let burst = &x[a_i..b_i];
    let p440 = goertzel(burst, 48_000.0, 440.0);
    for other in [330.0, 400.0, 480.0, 550.0, 880.0] {
        let p = goertzel(burst, 48_000.0, other);
        assert!(p440 > 30.0 * p, "440 Hz ({p440}) vs {other} Hz ({p})");
    }
    let crossings = burst
        .windows(2)
        .filter(|w| (w[0] < 0.0) != (w[1] < 0.0))
        .count();
    let hz = crossings as f32 / 2.0 / (burst.len() as f32 / 48_000.0);
    assert!((hz - 440.0).abs() < 5.0, "zero crossings say {hz} Hz");
}

#[test]
fn spoken_tts_reaches_the_sink_and_a_stream_returns_the_voiced_excerpt() {
    if !benchlink_testkit::tool_installed("espeak-ng") {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(_pulse) = PulseServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut mic = mic(dir.path());
    let mut spk = speaker(dir.path(), dir.path());

    let out = run(mic.as_mut(), CapabilityAction::StartAudioStream, json!({})).unwrap();
    assert_eq!(out.result_summary["sample_rate"], 48000);
    std::thread::sleep(Duration::from_millis(700));
    let spoken = run(
        spk.as_mut(),
        CapabilityAction::PlayTts,
        json!({"text": "Audit bench check. One, two, three.", "rate": 190}),
    )
    .unwrap();
    let tts_ms = spoken.artifacts[0].duration_ms.unwrap();
    assert!(tts_ms > 1000, "{tts_ms}");
    std::thread::sleep(Duration::from_millis(700));
    let out = run(
        mic.as_mut(),
        CapabilityAction::StopAudioStream,
        json!({"keep": "voice"}),
    )
    .unwrap();
    assert_eq!(
        out.artifacts.len(),
        1,
        "speech was heard: {:?}",
        out.result_summary
    );
    let excerpt_ms = out.artifacts[0].duration_ms.unwrap();
    let ring_ms = out.result_summary["ring_ms"].as_u64().unwrap();
    assert!(
        excerpt_ms < ring_ms,
        "silence before and after was cut ({excerpt_ms} of {ring_ms} ms)"
    );
    assert!(
        excerpt_ms + 150 >= tts_ms && excerpt_ms <= tts_ms + 700,
        "excerpt {excerpt_ms} ms for {tts_ms} ms of speech"
    );
}

#[test]
fn a_sink_that_disappears_mid_playback_fails_the_action_and_the_speaker_recovers_when_it_returns() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(pulse) = PulseServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_tone(&dir.path().join("long.wav"), 5000, 440.0);
    write_tone(&dir.path().join("short.wav"), 300, 660.0);
    let mut spk = speaker(dir.path(), dir.path());
    run(
        spk.as_mut(),
        CapabilityAction::PlayAudioFile,
        json!({"file": "short.wav"}),
    )
    .unwrap();

    let module = pulse
        .pactl(&["list", "short", "modules"])
        .lines()
        .find(|l| l.contains("module-null-sink"))
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .expect("the null sink module is loaded");
    let player = std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = run(
            spk.as_mut(),
            CapabilityAction::PlayAudioFile,
            json!({"file": "long.wav"}),
        );
        (r, t0.elapsed(), spk)
    });
    std::thread::sleep(Duration::from_millis(800));
    pulse.pactl(&["unload-module", &module]);
    let (r, took, mut spk) = player.join().unwrap();
    match r {
        Err(DriverError::Unavailable(m)) => assert!(m.contains("speaker"), "{m}"),
        other => panic!("expected the playback to fail, got {other:?}"),
    }
    assert!(
        took < Duration::from_millis(4500),
        "failed after {took:?}, before the 5 s sound ended"
    );
    let h = spk.health();
    assert_eq!(h.status, HealthStatus::Unhealthy);

    // The sink comes back: the next action reopens the output and plays.
    pulse.pactl(&[
        "load-module",
        "module-null-sink",
        "sink_name=vsink",
        "rate=48000",
        "channels=2",
    ]);
    pulse.pactl(&["set-default-sink", "vsink"]);
    let out = run(
        spk.as_mut(),
        CapabilityAction::PlayAudioFile,
        json!({"file": "short.wav"}),
    )
    .unwrap();
    assert_eq!(out.result_summary["completed"], true);
    std::thread::sleep(Duration::from_millis(3100));
    assert_eq!(
        spk.health().status,
        HealthStatus::Healthy,
        "{:?}",
        spk.health()
    );
}
