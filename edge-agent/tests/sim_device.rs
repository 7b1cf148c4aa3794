//! The simulated DUT of the shipped `config/edge-agent.sim.toml`, through
//! its real drivers: the sim thumb robot taps the wake button, the sim
//! camera's device scene shows the LED, display and stylus in the regions
//! the file declares (read back by measuring the JPEG and by running
//! `tesseract` on the display), and the sim microphone hears the welcome
//! line.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use edge_agent::config::EdgeConfig;
use edge_agent::drivers::{ActionRequest, CancelToken, Driver};
use serde_json::{json, Map, Value};
use shared_protocol::capability::{CapabilityAction, CapabilityType};
use shared_protocol::regions::{self, Region};

fn repo_file(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// Panics when `program` is missing under CI=true; false (skip) otherwise.
fn have(program: &str) -> bool {
    let ok = Command::new(program).arg("--version").output().is_ok();
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{program} is not installed (needed by this test)"
        );
        eprintln!("skipping: {program} is not installed");
    }
    ok
}

/// The shipped sim bench with its state in `dir` and `edit` applied to the
/// text; its drivers, built, and the camera's regions.
fn bench(dir: &Path, edit: &dyn Fn(String) -> String) -> (EdgeConfig, Vec<Box<dyn Driver>>) {
    let text = std::fs::read_to_string(repo_file("config/edge-agent.sim.toml")).unwrap();
    let text = text.replace(
        "state_dir = \"var/edge-sim\"",
        &format!("state_dir = \"{}\"", dir.display()),
    );
    let cfg = EdgeConfig::parse(
        &edit(text),
        &dir.join("edge.toml"),
        Some("bl_test_token"),
        None,
    )
    .expect("the shipped sim config parses");
    let drivers = cfg.build_drivers().expect("its drivers build");
    (cfg, drivers)
}

fn index_of(cfg: &EdgeConfig, kind: CapabilityType) -> usize {
    cfg.capabilities
        .iter()
        .position(|c| c.capability_type == kind)
        .unwrap()
}

fn act(
    d: &mut dyn Driver,
    action: CapabilityAction,
    params: Value,
) -> edge_agent::drivers::ActionOutcome {
    d.execute(&ActionRequest {
        session_id: "sess-dut".into(),
        action,
        params: params.as_object().cloned().unwrap_or_else(Map::new),
        deadline: Instant::now() + Duration::from_secs(60),
        cancel: CancelToken::new(),
    })
    .unwrap_or_else(|e| panic!("{action:?}: {e}"))
}

fn snapshot(cam: &mut dyn Driver) -> image::RgbImage {
    let out = act(cam, CapabilityAction::Snapshot, json!({}));
    image::load_from_memory(&out.artifacts[0].bytes)
        .expect("the snapshot decodes")
        .to_rgb8()
}

fn mean_rgb(img: &image::RgbImage, r: &Region) -> [f64; 3] {
    let (x, y, w, h) = r.pixels(img.width(), img.height());
    let mut sum = [0.0; 3];
    for yy in y..y + h {
        for xx in x..x + w {
            let p = img.get_pixel(xx, yy).0;
            for c in 0..3 {
                sum[c] += f64::from(p[c]);
            }
        }
    }
    let n = f64::from(w * h);
    [sum[0] / n, sum[1] / n, sum[2] / n]
}

fn near(got: [f64; 3], want: [u8; 3]) -> bool {
    (0..3).all(|c| (got[c] - f64::from(want[c])).abs() < 30.0)
}

fn ocr(img: &image::RgbImage, r: &Region, dir: &Path, name: &str) -> String {
    let (x, y, w, h) = r.pixels(img.width(), img.height());
    let crop = image::imageops::crop_imm(img, x, y, w, h).to_image();
    let path = dir.join(format!("{name}.png"));
    crop.save(&path).unwrap();
    let out = Command::new("tesseract")
        .arg(&path)
        .args(["stdout", "--psm", "6"])
        .output()
        .expect("run tesseract");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn camera_regions(cfg: &EdgeConfig) -> Vec<Region> {
    let cam = &cfg.capabilities[index_of(cfg, CapabilityType::Camera)];
    let mut meta = Map::new();
    meta.insert("regions".into(), Value::Object(cam.regions.clone()));
    regions::parse(&meta).unwrap()
}

fn region<'a>(all: &'a [Region], name: &str) -> &'a Region {
    all.iter().find(|r| r.name == name).unwrap()
}

const RED: [u8; 3] = [230, 30, 30];
const BLUE: [u8; 3] = [30, 70, 235];
const WHITE: [u8; 3] = [235, 235, 235];
const FINGER: [u8; 3] = [20, 20, 20];

#[test]
fn a_tap_on_the_wake_button_turns_the_led_blue_and_the_display_to_listening() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, mut drivers) = bench(dir.path(), &|t| t);
    let regions = camera_regions(&cfg);
    let (cam_i, robot_i) = (
        index_of(&cfg, CapabilityType::Camera),
        index_of(&cfg, CapabilityType::ThumbRobot),
    );

    let before = snapshot(drivers[cam_i].as_mut());
    assert!(near(mean_rgb(&before, region(&regions, "led")), RED));
    assert!(near(mean_rgb(&before, region(&regions, "button")), WHITE));
    if have("tesseract") {
        let text = ocr(&before, region(&regions, "display"), dir.path(), "idle");
        assert!(
            text.to_uppercase().contains("STANDBY"),
            "idle display read as {text:?}"
        );
    }

    act(
        drivers[robot_i].as_mut(),
        CapabilityAction::Tap,
        json!({ "x_mm": 20.0, "y_mm": 35.0 }),
    );
    let tapped = Instant::now();
    let soon = snapshot(drivers[cam_i].as_mut());
    assert!(
        near(mean_rgb(&soon, region(&regions, "button")), FINGER),
        "the stylus over the button: {:?}",
        mean_rgb(&soon, region(&regions, "button"))
    );
    std::thread::sleep(Duration::from_millis(1500).saturating_sub(tapped.elapsed()));
    let awake = snapshot(drivers[cam_i].as_mut());
    let led = mean_rgb(&awake, region(&regions, "led"));
    assert!(near(led, BLUE), "LED {led:?}");
    if have("tesseract") {
        let text = ocr(&awake, region(&regions, "display"), dir.path(), "awake");
        assert!(
            text.to_uppercase().contains("LISTENING"),
            "awake display read as {text:?}"
        );
    }
}

#[test]
fn a_tap_beside_the_button_leaves_it_asleep_and_a_red_led_fault_stays_red() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, mut drivers) = bench(dir.path(), &|t| t);
    let regions = camera_regions(&cfg);
    let (cam_i, robot_i) = (
        index_of(&cfg, CapabilityType::Camera),
        index_of(&cfg, CapabilityType::ThumbRobot),
    );
    act(
        drivers[robot_i].as_mut(),
        CapabilityAction::Tap,
        json!({ "x_mm": 40.0, "y_mm": 80.0 }),
    );
    std::thread::sleep(Duration::from_millis(1200));
    let img = snapshot(drivers[cam_i].as_mut());
    assert!(near(mean_rgb(&img, region(&regions, "led")), RED));
    assert!(near(mean_rgb(&img, region(&regions, "button")), WHITE));

    let dir = tempfile::tempdir().unwrap();
    let (cfg, mut drivers) = bench(dir.path(), &|t| {
        t.replace("led_awake = \"blue\"", "led_awake = \"red\"")
    });
    let (cam_i, robot_i) = (
        index_of(&cfg, CapabilityType::Camera),
        index_of(&cfg, CapabilityType::ThumbRobot),
    );
    act(
        drivers[robot_i].as_mut(),
        CapabilityAction::PressHardwareButton,
        json!({ "button": "wake" }),
    );
    std::thread::sleep(Duration::from_millis(1200));
    let img = snapshot(drivers[cam_i].as_mut());
    assert!(
        near(mean_rgb(&img, region(&regions, "led")), RED),
        "the fault keeps it red"
    );
    if have("tesseract") {
        let text = ocr(&img, region(&regions, "display"), dir.path(), "fault");
        assert!(
            text.to_uppercase().contains("LISTENING"),
            "woken all the same: {text:?}"
        );
    }
}

#[test]
fn the_microphone_hears_the_welcome_line_after_the_wake() {
    if !have("espeak-ng") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (cfg, mut drivers) = bench(dir.path(), &|t| t);
    let (mic_i, robot_i) = (
        index_of(&cfg, CapabilityType::Microphone),
        index_of(&cfg, CapabilityType::ThumbRobot),
    );
    let quiet = act(
        drivers[mic_i].as_mut(),
        CapabilityAction::RecordAudio,
        json!({ "duration_ms": 1000 }),
    );
    act(
        drivers[robot_i].as_mut(),
        CapabilityAction::Tap,
        json!({ "x_mm": 20.0, "y_mm": 35.0 }),
    );
    let heard = act(
        drivers[mic_i].as_mut(),
        CapabilityAction::RecordAudio,
        json!({ "duration_ms": 4000 }),
    );
    let peak =
        |o: &edge_agent::drivers::ActionOutcome| o.result_summary["peak_dbfs"].as_f64().unwrap();
    assert!(
        peak(&quiet) < -45.0,
        "the room's noise floor before: {}",
        peak(&quiet)
    );
    assert!(peak(&heard) > -30.0, "the welcome line: {}", peak(&heard));
}
