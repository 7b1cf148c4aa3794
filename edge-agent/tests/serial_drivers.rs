//! The serial-family drivers (serial port, relay, power supply, thumb robot)
//! driven exactly as the daemon drives them, `drivers::build(spec)` then
//! `execute`, against device simulators on pseudo-terminals and against
//! the in-process `sim` backends.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use benchlink_testkit::wait_until;
use edge_agent::devsim::dut_console::{DutConsoleConfig, DutConsoleSim, DutPhase, DutPower};
use edge_agent::devsim::grbl::{GrblConfig, GrblSim, MoveKind};
use edge_agent::devsim::korad::{KoradConfig, KoradOutcome, KoradSim};
use edge_agent::devsim::lcus::{LcusConfig, LcusSim};
use edge_agent::devsim::numato::{NumatoConfig, NumatoSim};
use edge_agent::devsim::scpi_psu::{ScpiPsuConfig, ScpiPsuSim};
use edge_agent::drivers::{
    build, ActionOutcome, ActionRequest, CancelToken, Driver, DriverError, DriverSpec,
};
use serde_json::{json, Map, Value};
use serialport::SerialPort;
use shared_protocol::artifact::ArtifactType;
use shared_protocol::capability::{CapabilityAction, CapabilityType, HealthStatus};

// ---------------------------------------------------------------- helpers

fn spec(kind: CapabilityType, backend: &str, settings: Value) -> DriverSpec {
    DriverSpec {
        capability_id: format!("{kind}-under-test"),
        capability_type: kind,
        backend: backend.into(),
        settings: settings.as_object().cloned().unwrap_or_default(),
        state_dir: std::env::temp_dir(),
    }
}

fn driver(kind: CapabilityType, backend: &str, settings: Value) -> Box<dyn Driver> {
    build(&spec(kind, backend, settings)).unwrap_or_else(|e| panic!("build: {e}"))
}

fn request(action: CapabilityAction, params: Value) -> ActionRequest {
    ActionRequest {
        session_id: "sess-test".into(),
        action,
        params: params.as_object().cloned().unwrap_or_default(),
        deadline: Instant::now() + Duration::from_secs(30),
        cancel: CancelToken::new(),
    }
}

/// What a driver answers to one action.
type Outcome = Result<ActionOutcome, DriverError>;

fn run(d: &mut dyn Driver, action: CapabilityAction, params: Value) -> Outcome {
    d.execute(&request(action, params))
}

fn ok(d: &mut dyn Driver, action: CapabilityAction, params: Value) -> ActionOutcome {
    run(d, action, params).unwrap_or_else(|e| panic!("{action}: {e}"))
}

/// Each `(action, params, field)`: the driver refuses `params` as
/// invalid ([`DriverError::InvalidParams`]), naming `field`.
fn assert_refused_invalid(d: &mut dyn Driver, cases: Vec<(CapabilityAction, Value, &str)>) {
    for (action, params, field) in cases {
        let shown = params.to_string();
        assert_eq!(
            invalid_field(run(d, action, params)),
            field,
            "{action} {shown}"
        );
    }
}

/// Each `(action, params, field)`: the driver refuses `params` as over a
/// limit ([`DriverError::LimitExceeded`]), naming `field`.
fn assert_refused_limit(d: &mut dyn Driver, cases: Vec<(CapabilityAction, Value, &str)>) {
    for (action, params, field) in cases {
        let shown = params.to_string();
        assert_eq!(
            limit_field(run(d, action, params)),
            field,
            "{action} {shown}"
        );
    }
}

fn port(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn invalid_field(r: Outcome) -> String {
    match r {
        Err(DriverError::InvalidParams { field, .. }) => field,
        other => panic!("expected InvalidParams, got {other:?}"),
    }
}

fn limit_field(r: Outcome) -> String {
    match r {
        Err(DriverError::LimitExceeded { field, .. }) => field,
        other => panic!("expected LimitExceeded, got {other:?}"),
    }
}

/// The one `sensor_dump` artifact of an outcome, parsed.
fn dump(o: &ActionOutcome) -> Value {
    assert_eq!(o.artifacts.len(), 1, "one evidence artifact");
    let a = &o.artifacts[0];
    assert_eq!(a.artifact_type, ArtifactType::SensorDump);
    assert_eq!(a.content_type, "application/json");
    serde_json::from_slice(&a.bytes).expect("sensor_dump is JSON")
}

fn f(o: &ActionOutcome, key: &str) -> f64 {
    o.result_summary
        .get(key)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number `{key}` in {:?}", o.result_summary))
}

fn s<'a>(o: &'a ActionOutcome, key: &str) -> &'a str {
    o.result_summary
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string `{key}` in {:?}", o.result_summary))
}

fn dut(power: DutPower, pace: f64) -> DutConsoleSim {
    DutConsoleSim::start(
        DutConsoleConfig {
            power,
            pace,
            ..DutConsoleConfig::default()
        },
        None,
    )
    .unwrap()
}

fn serial_driver(path: &Path) -> Box<dyn Driver> {
    driver(
        CapabilityType::SerialPort,
        "serialport",
        json!({ "port": port(path), "baud_rate": 115200 }),
    )
}

fn korad_driver(path: &Path) -> Box<dyn Driver> {
    driver(
        CapabilityType::ProgrammablePowerSupply,
        "korad",
        json!({ "port": port(path), "max_voltage_v": 12.0, "max_current_a": 2.0, "settle_ms": 50 }),
    )
}

// ------------------------------------------------------------ serial_port

#[test]
fn open_takes_exclusive_access_so_a_second_opener_is_refused() {
    let console = dut(DutPower::Manual, 0.1);
    let mut d = serial_driver(console.path());
    let o = ok(d.as_mut(), CapabilityAction::Open, json!({}));
    assert_eq!(s(&o, "port_name"), port(console.path()));

    // Another program (even as root) cannot open it while the driver holds it.
    let second = serialport::new(port(console.path()), 115200).open();
    assert!(second.is_err(), "second open must be refused");

    // Nor can a second driver configured for the same port.
    let mut other = serial_driver(console.path());
    match run(other.as_mut(), CapabilityAction::Open, json!({})) {
        Err(DriverError::Unavailable(why)) => assert!(why.contains("in use"), "{why}"),
        r => panic!("expected Unavailable, got {r:?}"),
    }
    assert_eq!(other.health().status, HealthStatus::Unhealthy);
    assert_eq!(d.health().status, HealthStatus::Healthy);
}

#[test]
fn a_boot_banner_printed_before_expect_pattern_was_called_is_still_found() {
    // The demo: the PSU powers the DUT, the console waits for its banner.
    let psu = KoradSim::start(KoradConfig::default(), None).unwrap();
    let console = dut(
        DutPower::Sense {
            sense: psu.handle().power_sense(),
            threshold_v: 3.0,
        },
        0.1,
    );
    let mut serial = serial_driver(console.path());
    let mut supply = korad_driver(psu.path());
    ok(serial.as_mut(), CapabilityAction::Open, json!({}));
    let on = ok(
        supply.as_mut(),
        CapabilityAction::PowerOn,
        json!({ "voltage_v": 5.0, "current_limit_a": 1.0 }),
    );
    assert_eq!(f(&on, "voltage_v"), 5.0);
    // Make sure the banner is out before anybody asks for it.
    assert!(wait_until(Duration::from_secs(3), || {
        console.handle().snapshot().phase == DutPhase::Login
    }));
    let started = Instant::now();
    let m = ok(
        serial.as_mut(),
        CapabilityAction::ExpectPattern,
        json!({ "pattern": r"Benchlink DUT v(?P<version>\d+\.\d+\.\d+) ready", "timeout_ms": 2000 }),
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "found in the buffer, not waited for"
    );
    assert_eq!(s(&m, "match"), "Benchlink DUT v0.9.2 ready");
    assert_eq!(m.result_summary["captures"], json!(["0.9.2"]));
    assert_eq!(m.result_summary["named"], json!({ "version": "0.9.2" }));
    assert!(s(&m, "log_excerpt").contains("Starting network: OK"));
    // The cursor moved past the banner: it is not matched twice.
    let again = run(
        serial.as_mut(),
        CapabilityAction::ExpectPattern,
        json!({ "pattern": "ready", "timeout_ms": 300 }),
    );
    assert!(matches!(again, Err(DriverError::Device(_))), "{again:?}");
}

#[test]
fn write_then_read_returns_the_console_reply_as_text_and_hex() {
    let console = dut(DutPower::Manual, 0.05);
    let mut d = serial_driver(console.path());
    ok(d.as_mut(), CapabilityAction::Open, json!({}));
    console.handle().set_power(true);
    ok(
        d.as_mut(),
        CapabilityAction::ExpectPattern,
        json!({ "pattern": "login: $", "timeout_ms": 3000 }),
    );
    let w = ok(
        d.as_mut(),
        CapabilityAction::Write,
        json!({ "text": "root", "line_ending": "crlf" }),
    );
    assert_eq!(w.result_summary["bytes_written"], json!(6));
    ok(
        d.as_mut(),
        CapabilityAction::ExpectPattern,
        json!({ "pattern": "# $", "timeout_ms": 2000 }),
    );
    ok(
        d.as_mut(),
        CapabilityAction::Write,
        json!({ "text": "uname -r", "line_ending": "lf" }),
    );
    let r = ok(
        d.as_mut(),
        CapabilityAction::Read,
        json!({ "max_bytes": 4096, "timeout_ms": 2000, "idle_ms": 100 }),
    );
    let text = s(&r, "text").to_string();
    assert!(text.contains("5.15.92-benchlink"), "{text:?}");
    assert_eq!(s(&r, "hex"), hex::encode_upper(text.as_bytes()));
    assert_eq!(r.result_summary["binary"], json!(false));
    assert_eq!(
        console
            .handle()
            .snapshot()
            .commands
            .last()
            .map(|c| c.1.clone()),
        Some("uname -r".to_string())
    );
}

#[test]
fn read_returns_binary_bytes_as_hex_and_flags_them() {
    // A bare pty pair: the test plays a device that sends binary frames.
    let (mut master, slave) = serialport::TTYPort::pair().unwrap();
    let path = slave.name().unwrap();
    drop(slave);
    let mut d = driver(
        CapabilityType::SerialPort,
        "serialport",
        json!({ "port": path }),
    );
    ok(d.as_mut(), CapabilityAction::Open, json!({}));
    master.write_all(&[0xA0, 0x01, 0x00, 0xA1, 0xFF]).unwrap();
    let r = ok(
        d.as_mut(),
        CapabilityAction::Read,
        json!({ "max_bytes": 4, "timeout_ms": 2000 }),
    );
    assert_eq!(s(&r, "hex"), "A00100A1");
    assert_eq!(r.result_summary["bytes_read"], json!(4));
    assert_eq!(r.result_summary["binary"], json!(true));
    // The fifth byte is still unread.
    let rest = ok(
        d.as_mut(),
        CapabilityAction::Read,
        json!({ "timeout_ms": 500 }),
    );
    assert_eq!(s(&rest, "hex"), "FF");
    // Writing hex sends exactly those bytes.
    ok(
        d.as_mut(),
        CapabilityAction::Write,
        json!({ "hex": "A0 01 01 A2" }),
    );
    let mut got = [0u8; 4];
    master.set_timeout(Duration::from_secs(2)).unwrap();
    master.read_exact(&mut got).unwrap();
    assert_eq!(got, [0xA0, 0x01, 0x01, 0xA2]);
}

#[test]
fn expect_pattern_timeout_fails_with_the_tail_of_the_log() {
    let console = dut(DutPower::Manual, 0.05);
    let mut d = serial_driver(console.path());
    ok(d.as_mut(), CapabilityAction::Open, json!({}));
    console.handle().set_power(true);
    let started = Instant::now();
    let r = run(
        d.as_mut(),
        CapabilityAction::ExpectPattern,
        json!({ "pattern": "Kernel panic", "timeout_ms": 1000 }),
    );
    let elapsed = started.elapsed();
    match r {
        Err(DriverError::Device(msg)) => {
            assert!(
                msg.contains("`Kernel panic` not seen within 1000 ms"),
                "{msg}"
            );
            assert!(msg.contains("benchlink-dut login: "), "tail missing: {msg}");
        }
        other => panic!("expected a Device error, got {other:?}"),
    }
    assert!(elapsed >= Duration::from_millis(1000) && elapsed < Duration::from_millis(2000));
}

#[test]
fn capture_log_returns_the_boot_as_a_serial_log_artifact() {
    let console = dut(DutPower::Manual, 0.5);
    let mut d = serial_driver(console.path());
    ok(d.as_mut(), CapabilityAction::Open, json!({}));
    console.handle().set_power(true);
    let o = ok(
        d.as_mut(),
        CapabilityAction::CaptureLog,
        json!({ "duration_ms": 900 }),
    );
    assert_eq!(o.artifacts.len(), 1);
    let a = &o.artifacts[0];
    assert_eq!(a.artifact_type, ArtifactType::SerialLog);
    assert_eq!(a.content_type, "text/plain");
    let text = String::from_utf8_lossy(&a.bytes);
    assert!(text.contains("Starting kernel ..."), "{text}");
    assert!(text.contains("Benchlink DUT v0.9.2 ready"), "{text}");
    assert!(a.duration_ms.unwrap() >= 900);
    assert!(f(&o, "lines") >= 30.0);
    assert_eq!(f(&o, "bytes_captured") as usize, a.bytes.len());
    // Capturing does not consume: the banner is still there to expect.
    ok(
        d.as_mut(),
        CapabilityAction::ExpectPattern,
        json!({ "pattern": "DUT v0.9.2 ready", "timeout_ms": 100 }),
    );
}

#[test]
fn a_cancelled_capture_log_keeps_the_log_captured_until_then() {
    let console = dut(DutPower::Manual, 0.5);
    let mut d = serial_driver(console.path());
    ok(d.as_mut(), CapabilityAction::Open, json!({}));
    console.handle().set_power(true);
    let req = request(
        CapabilityAction::CaptureLog,
        json!({ "duration_ms": 20_000 }),
    );
    let cancel = req.cancel.clone();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        cancel.cancel();
    });
    let started = Instant::now();
    let result = d.execute(&req);
    let elapsed = started.elapsed();
    canceller.join().unwrap();
    assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
    let Err(DriverError::CancelledPartway { why, partial }) = result else {
        panic!("expected CancelledPartway, got {result:?}");
    };
    assert!(why.contains("of 20000 ms"), "{why}");
    assert_eq!(partial.result_summary["partial"], json!(true));
    assert_eq!(partial.artifacts.len(), 1);
    let a = &partial.artifacts[0];
    assert_eq!(a.artifact_type, ArtifactType::SerialLog);
    let text = String::from_utf8_lossy(&a.bytes);
    assert!(text.contains("Starting kernel ..."), "{text}");
    assert_eq!(f(&partial, "bytes_captured") as usize, a.bytes.len());
    let kept = f(&partial, "duration_ms");
    assert!((1400.0..3000.0).contains(&kept), "duration_ms {kept}");
    assert_eq!(a.duration_ms, Some(kept as u64));
}

#[test]
fn bad_serial_params_are_refused_naming_the_field_and_nothing_is_sent() {
    let console = dut(DutPower::Manual, 0.05);
    let mut d = serial_driver(console.path());
    ok(d.as_mut(), CapabilityAction::Open, json!({}));
    console.handle().set_power(true);
    ok(
        d.as_mut(),
        CapabilityAction::ExpectPattern,
        json!({ "pattern": "login: ", "timeout_ms": 3000 }),
    );
    let w = CapabilityAction::Write;
    let e = CapabilityAction::ExpectPattern;
    let r = CapabilityAction::Read;
    let c = CapabilityAction::CaptureLog;
    assert_refused_invalid(
        d.as_mut(),
        vec![
            (w, json!({ "text": "root\r", "bogus": 1 }), "bogus"),
            (w, json!({ "text": "a", "hex": "00" }), "text"),
            (w, json!({}), "text"),
            (w, json!({ "hex": "zz" }), "hex"),
            (
                w,
                json!({ "text": "x", "line_ending": "lfcr" }),
                "line_ending",
            ),
            (e, json!({ "timeout_ms": 10 }), "pattern"),
            (e, json!({ "pattern": "(unclosed" }), "pattern"),
            (e, json!({ "pattern": "x", "timeout_ms": 0 }), "timeout_ms"),
            (e, json!({ "pattern": "x", "since": "yesterday" }), "since"),
            (r, json!({ "max_bytes": 0 }), "max_bytes"),
            (r, json!({ "max_bytes": "many" }), "max_bytes"),
            (c, json!({}), "duration_ms"),
            (c, json!({ "duration_ms": 700000 }), "duration_ms"),
        ],
    );
    // None of that reached the board: it never logged in.
    std::thread::sleep(Duration::from_millis(100));
    let st = console.handle().snapshot();
    assert_eq!(st.phase, DutPhase::Login);
    assert!(st.commands.is_empty());
    // Another type's action is not a serial action.
    assert!(matches!(
        run(d.as_mut(), CapabilityAction::Tap, json!({})),
        Err(DriverError::Unsupported { .. })
    ));
}

#[test]
fn an_absent_port_is_unhealthy_and_actions_fail_as_unavailable() {
    let mut d = driver(
        CapabilityType::SerialPort,
        "serialport",
        json!({ "port": "/dev/serial/by-id/usb-nothing-here-if00" }),
    );
    let h = d.health();
    assert_eq!(h.status, HealthStatus::Unhealthy);
    assert!(h.message.unwrap().contains("not present"));
    assert!(matches!(
        run(d.as_mut(), CapabilityAction::Open, json!({})),
        Err(DriverError::Unavailable(_))
    ));
}

#[test]
fn bad_settings_are_refused_at_build_naming_the_key() {
    let key = |kind, backend: &str, settings: Value| match build(&spec(kind, backend, settings)) {
        Err(edge_agent::drivers::DriverConfigError::Setting { key, .. }) => key,
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("built"),
    };
    let serial = CapabilityType::SerialPort;
    assert_eq!(
        key(
            serial,
            "serialport",
            json!({ "port": "/dev/x", "parity": "mark" })
        ),
        "parity"
    );
    assert_eq!(
        key(
            serial,
            "serialport",
            json!({ "port": "/dev/x", "data_bits": 9 })
        ),
        "data_bits"
    );
    assert_eq!(
        key(
            serial,
            "serialport",
            json!({ "port": "/dev/x", "baud": 9600 })
        ),
        "baud"
    );
    assert_eq!(
        key(serial, "serialport", json!({ "baud_rate": 9600 })),
        "port"
    );
    let psu = CapabilityType::ProgrammablePowerSupply;
    assert_eq!(
        key(
            psu,
            "korad",
            json!({ "port": "/dev/x", "max_voltage_v": 5.0 })
        ),
        "max_current_a"
    );
    assert_eq!(
        key(
            psu,
            "scpi",
            json!({ "max_voltage_v": 5.0, "max_current_a": 1.0 })
        ),
        "port"
    );
    let relay = CapabilityType::Relay;
    assert_eq!(
        key(relay, "lcus", json!({ "port": "/dev/x", "channels": 3 })),
        "channels"
    );
    assert_eq!(
        key(
            relay,
            "numato",
            json!({ "port": "/dev/x", "channels": 8, "channel": 9 })
        ),
        "channel"
    );
    let robot = CapabilityType::ThumbRobot;
    assert_eq!(
        key(
            robot,
            "grbl",
            json!({ "port": "/dev/x", "bounds_mm": { "x_min": 0, "x_max": 50, "y_min": 0, "y_max": 50 },
                    "safe_z_mm": 10, "press_z_mm": 2,
                    "key_map": { "a": { "x_mm": 80, "y_mm": 10 } } })
        ),
        "key_map"
    );
    assert!(matches!(
        build(&spec(serial, "ftdi", json!({}))),
        Err(edge_agent::drivers::DriverConfigError::UnknownBackend { .. })
    ));
}

#[test]
fn sim_console_boots_when_the_sim_psu_powers_its_rail() {
    let mut console = driver(
        CapabilityType::SerialPort,
        "sim",
        json!({ "power_rail": "rail-sim-console-test", "boot_ms": 200, "banner": "SIM DUT ready" }),
    );
    let mut supply = driver(
        CapabilityType::ProgrammablePowerSupply,
        "sim",
        json!({ "max_voltage_v": 12.0, "max_current_a": 2.0, "power_rail": "rail-sim-console-test",
                "command_ms": 5, "settle_ms": 10 }),
    );
    ok(console.as_mut(), CapabilityAction::Open, json!({}));
    // Unpowered: silent.
    let quiet = ok(
        console.as_mut(),
        CapabilityAction::Read,
        json!({ "timeout_ms": 300 }),
    );
    assert_eq!(quiet.result_summary["bytes_read"], json!(0));
    ok(
        supply.as_mut(),
        CapabilityAction::PowerOn,
        json!({ "voltage_v": 5.0, "current_limit_a": 1.0 }),
    );
    let m = ok(
        console.as_mut(),
        CapabilityAction::ExpectPattern,
        json!({ "pattern": "SIM DUT ready", "timeout_ms": 2000, "context_bytes": 2048 }),
    );
    assert!(s(&m, "log_excerpt").contains("Starting kernel"));
    ok(
        console.as_mut(),
        CapabilityAction::ExpectPattern,
        json!({ "pattern": "login: ", "timeout_ms": 1000 }),
    );
    ok(
        console.as_mut(),
        CapabilityAction::Write,
        json!({ "text": "root\r" }),
    );
    ok(
        console.as_mut(),
        CapabilityAction::Write,
        json!({ "text": "echo hello\r" }),
    );
    ok(
        console.as_mut(),
        CapabilityAction::ExpectPattern,
        json!({ "pattern": "\r\nhello\r\n", "timeout_ms": 1000 }),
    );
    // Power off: the board goes quiet and boots again on the next power-on.
    ok(supply.as_mut(), CapabilityAction::PowerOff, json!({}));
    ok(supply.as_mut(), CapabilityAction::PowerOn, json!({}));
    ok(
        console.as_mut(),
        CapabilityAction::ExpectPattern,
        json!({ "pattern": "U-Boot SPL", "timeout_ms": 2000 }),
    );
}

// ------------------------------------------------------------------ relay

#[test]
fn lcus_switches_a_channel_and_confirms_it_with_the_status_query() {
    let board = LcusSim::start(LcusConfig::default(), None).unwrap();
    let mut d = driver(
        CapabilityType::Relay,
        "lcus",
        json!({ "port": port(board.path()), "channels": 4, "channel": 1 }),
    );
    assert_eq!(d.health().status, HealthStatus::Healthy);
    let on = ok(
        d.as_mut(),
        CapabilityAction::SwitchOn,
        json!({ "channel": 3 }),
    );
    assert!(board.handle().relay(3));
    assert_eq!(s(&on, "state"), "on");
    assert_eq!(on.result_summary["verified"], json!(true));
    let evidence = dump(&on);
    assert_eq!(evidence["timeline"][0]["channel"], json!(3));
    assert_eq!(evidence["timeline"][0]["state"], json!("on"));
    // The frame on the wire: A0 03 01 A4.
    assert_eq!(
        evidence["transcript"][0]["data"],
        json!("\\xA0\\x03\\x01\\xA4")
    );

    ok(d.as_mut(), CapabilityAction::SwitchOn, json!({}));
    assert!(board.handle().relay(1), "default channel from the settings");
    ok(
        d.as_mut(),
        CapabilityAction::SwitchOff,
        json!({ "channel": 3 }),
    );
    assert!(!board.handle().relay(3));
    assert!(board.handle().snapshot().ignored_frames.is_empty());
}

#[test]
fn a_pulse_holds_the_relay_for_its_duration_and_cannot_be_cut() {
    let board = LcusSim::start(LcusConfig::default(), None).unwrap();
    let mut d = driver(
        CapabilityType::Relay,
        "lcus",
        json!({ "port": port(board.path()), "channels": 4, "settle_ms": 5 }),
    );
    let req = request(
        CapabilityAction::Pulse,
        json!({ "channel": 2, "duration_ms": 250 }),
    );
    assert!(d.is_non_interruptible(req.action, &req.params));
    // A cancel arriving mid-pulse does not leave the relay on.
    let cancel = req.cancel.clone();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(60));
        cancel.cancel();
    });
    let o = d.execute(&req).expect("pulse");
    canceller.join().unwrap();
    assert!(!board.handle().relay(2));
    let held = board
        .handle()
        .snapshot()
        .last_pulse(2)
        .expect("a completed pulse");
    assert!(
        held >= Duration::from_millis(250) && held < Duration::from_millis(450),
        "{held:?}"
    );
    // Whole milliseconds: the timeline's span, rounded.
    let actual = o.result_summary["actual_duration_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("not a whole number of ms: {:?}", o.result_summary));
    assert!((250..450).contains(&actual), "{actual}");
    let evidence = dump(&o);
    let timeline = evidence["timeline"].as_array().unwrap();
    assert_eq!(timeline.len(), 2);
    let span = timeline[1]["confirmed_ms"].as_f64().unwrap()
        - timeline[0]["confirmed_ms"].as_f64().unwrap();
    assert_eq!(actual, span.round() as u64, "{timeline:?}");
    assert_eq!(timeline[0]["state"], json!("on"));
    assert_eq!(timeline[1]["state"], json!("off"));
}

#[test]
fn numato_uses_zero_based_relay_names_and_reads_each_switch_back() {
    let module = NumatoSim::start(NumatoConfig::default(), None).unwrap();
    let mut d = driver(
        CapabilityType::Relay,
        "numato",
        json!({ "port": port(module.path()), "channels": 8, "channel": 1, "settle_ms": 5 }),
    );
    assert_eq!(d.health().status, HealthStatus::Healthy);
    let on = ok(d.as_mut(), CapabilityAction::SwitchOn, json!({}));
    assert!(
        module.handle().relay(0),
        "channel 1 is the module's relay 0"
    );
    assert_eq!(on.result_summary["verified"], json!(true));
    // A power cycle through a normally-on relay: off, wait, on.
    ok(
        d.as_mut(),
        CapabilityAction::SwitchOn,
        json!({ "channel": 8 }),
    );
    let p = ok(
        d.as_mut(),
        CapabilityAction::Pulse,
        json!({ "channel": 8, "duration_ms": 100, "level": "off" }),
    );
    assert_eq!(s(&p, "state"), "on");
    assert!(module.handle().relay(7));
    let commands: Vec<String> = module
        .handle()
        .snapshot()
        .commands
        .into_iter()
        .map(|c| c.1)
        .collect();
    for expected in [
        "ver",
        "relay on 0",
        "relay read 0",
        "relay on 7",
        "relay off 7",
    ] {
        assert!(
            commands.iter().any(|c| c == expected),
            "{expected} missing in {commands:?}"
        );
    }
}

#[test]
fn bad_relay_params_are_refused_before_any_byte_is_sent() {
    let board = LcusSim::start(LcusConfig::default(), None).unwrap();
    let mut d = driver(
        CapabilityType::Relay,
        "lcus",
        json!({ "port": port(board.path()), "channels": 4 }),
    );
    let p = CapabilityAction::Pulse;
    let on = CapabilityAction::SwitchOn;
    assert_refused_invalid(
        d.as_mut(),
        vec![
            (p, json!({ "duration_ms": 5 }), "duration_ms"),
            (p, json!({ "duration_ms": 60001 }), "duration_ms"),
            (p, json!({}), "duration_ms"),
            (p, json!({ "duration_ms": 100, "level": "half" }), "level"),
            (on, json!({ "channel": 5 }), "channel"),
            (on, json!({ "channel": 0 }), "channel"),
            (on, json!({ "channel": 1, "pin": 2 }), "pin"),
        ],
    );
    // A pulse that cannot finish before the action deadline never starts.
    let mut short = request(p, json!({ "duration_ms": 5000 }));
    short.deadline = Instant::now() + Duration::from_millis(1000);
    assert!(matches!(
        d.execute(&short),
        Err(DriverError::InvalidParams { .. })
    ));
    std::thread::sleep(Duration::from_millis(50));
    let st = board.handle().snapshot();
    assert!(st.switches.is_empty() && st.ignored_frames.is_empty());
    assert_eq!(st.status_queries, 0);
}

#[test]
fn sim_relay_takes_its_operate_time_and_drives_its_rail() {
    let mut d = driver(
        CapabilityType::Relay,
        "sim",
        json!({ "channels": 2, "operate_ms": 30, "power_rails": { "2": "rail-sim-relay-test" } }),
    );
    let rail = edge_agent::drivers::serial::sim::power_rail("rail-sim-relay-test");
    let started = Instant::now();
    let o = ok(
        d.as_mut(),
        CapabilityAction::SwitchOn,
        json!({ "channel": 2 }),
    );
    assert!(started.elapsed() >= Duration::from_millis(30));
    assert_eq!(o.result_summary["verified"], json!(true));
    assert_eq!(rail.volts(), 5.0);
    let p = ok(
        d.as_mut(),
        CapabilityAction::Pulse,
        json!({ "channel": 2, "duration_ms": 50, "level": "off" }),
    );
    assert!(f(&p, "actual_duration_ms") >= 50.0);
    assert_eq!(rail.volts(), 5.0, "back on after the off-pulse");
    assert_eq!(
        invalid_field(run(
            d.as_mut(),
            CapabilityAction::SwitchOn,
            json!({ "channel": 3 })
        )),
        "channel"
    );
}

// ------------------------------------------------------------------- PSU

#[test]
fn korad_power_on_applies_setpoints_and_measures_constant_voltage_output() {
    // A unit that drops commands sent while it is busy: pacing must hold.
    let psu = KoradSim::start(
        KoradConfig {
            drop_when_busy: true,
            load_ohms: Some(100.0),
            ..KoradConfig::default()
        },
        None,
    )
    .unwrap();
    let mut d = korad_driver(psu.path());
    assert_eq!(d.health().status, HealthStatus::Healthy);
    let v = ok(
        d.as_mut(),
        CapabilityAction::SetVoltage,
        json!({ "voltage_v": 12.0 }),
    );
    assert_eq!(f(&v, "voltage_set_v"), 12.0);
    ok(
        d.as_mut(),
        CapabilityAction::SetCurrentLimit,
        json!({ "current_limit_a": 1.5 }),
    );
    let on = ok(d.as_mut(), CapabilityAction::PowerOn, json!({}));
    assert_eq!(on.result_summary["output_on"], json!(true));
    assert_eq!(f(&on, "voltage_v"), 12.0);
    assert_eq!(f(&on, "current_a"), 0.12);
    assert!((f(&on, "power_w") - 1.44).abs() < 1e-9);
    assert_eq!(s(&on, "mode"), "cv");
    let st = psu.handle().snapshot();
    assert!((st.output_on, st.vset_v, st.iset_a) == (true, 12.0, 1.5));
    let dropped: Vec<_> = st
        .history
        .iter()
        .filter(|c| c.outcome == KoradOutcome::DroppedBusy)
        .map(|c| c.text.clone())
        .collect();
    assert!(dropped.is_empty(), "commands dropped: {dropped:?}");
    let evidence = dump(&on);
    let sent: Vec<&str> = evidence["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["dir"] == "tx")
        .filter_map(|e| e["data"].as_str())
        .collect();
    assert_eq!(sent, ["OUT1", "STATUS?", "VOUT1?", "IOUT1?", "STATUS?"]);

    let off = ok(d.as_mut(), CapabilityAction::PowerOff, json!({}));
    assert_eq!(f(&off, "voltage_v"), 0.0);
    assert!(!psu.handle().snapshot().output_on);
}

#[test]
fn korad_measure_output_reports_constant_current_under_a_heavy_load() {
    let psu = KoradSim::start(
        KoradConfig {
            load_ohms: Some(5.0),
            ..KoradConfig::default()
        },
        None,
    )
    .unwrap();
    let mut d = korad_driver(psu.path());
    ok(
        d.as_mut(),
        CapabilityAction::PowerOn,
        json!({ "voltage_v": 12.0, "current_limit_a": 1.0 }),
    );
    let m = ok(d.as_mut(), CapabilityAction::MeasureOutput, json!({}));
    assert_eq!(s(&m, "mode"), "cc");
    assert_eq!(f(&m, "current_a"), 1.0);
    assert_eq!(f(&m, "voltage_v"), 5.0);
    assert_eq!(f(&m, "power_w"), 5.0);
    let evidence = dump(&m);
    assert_eq!(evidence["measurement"]["mode"], json!("cc"));
    assert_eq!(evidence["limits"]["max_voltage_v"], json!(12.0));
}

/// Settings leave the same evidence as the other PSU actions: the output
/// measured after the setting, limits and transcript as one `sensor_dump`.
#[test]
fn korad_settings_read_the_output_back_as_sensor_dump_evidence() {
    let psu = KoradSim::start(
        KoradConfig {
            load_ohms: Some(100.0),
            ..KoradConfig::default()
        },
        None,
    )
    .unwrap();
    let mut d = korad_driver(psu.path());

    // Output off: the setting is sent and read back, the output measures 0.
    let v = ok(
        d.as_mut(),
        CapabilityAction::SetVoltage,
        json!({ "voltage_v": 5.0 }),
    );
    assert_eq!(f(&v, "voltage_set_v"), 5.0);
    assert_eq!(v.result_summary["output_on"], json!(false));
    assert_eq!(f(&v, "voltage_v"), 0.0);
    let evidence = dump(&v);
    assert_eq!(evidence["action"], json!("set_voltage"));
    assert_eq!(evidence["measurement"]["output_on"], json!(false));
    let sent: Vec<&str> = evidence["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["dir"] == "tx")
        .filter_map(|e| e["data"].as_str())
        .collect();
    assert_eq!(sent.first(), Some(&"VSET1:5.00"), "{sent:?}");
    assert!(
        sent.contains(&"VOUT1?") && sent.contains(&"IOUT1?"),
        "{sent:?}"
    );

    // Output on: the new setpoint is what the output measures.
    ok(
        d.as_mut(),
        CapabilityAction::PowerOn,
        json!({ "current_limit_a": 1.0 }),
    );
    let v = ok(
        d.as_mut(),
        CapabilityAction::SetVoltage,
        json!({ "voltage_v": 10.0 }),
    );
    assert_eq!(f(&v, "voltage_v"), 10.0);
    assert_eq!(f(&v, "current_a"), 0.1);
    assert_eq!(dump(&v)["measurement"]["voltage_v"], json!(10.0));
    assert_eq!(v.result_summary["settled"], json!(true));
    // A deadline shorter than settle_ms (50) cuts the wait: the reading
    // says it may predate the settling.
    let mut hurried = request(CapabilityAction::SetVoltage, json!({ "voltage_v": 9.0 }));
    hurried.deadline = Instant::now() + Duration::from_millis(20);
    let h = d.execute(&hurried).unwrap();
    assert_eq!(h.result_summary["settled"], json!(false));
    let c = ok(
        d.as_mut(),
        CapabilityAction::SetCurrentLimit,
        json!({ "current_limit_a": 0.05 }),
    );
    assert_eq!(f(&c, "current_limit_a"), 0.05);
    // 10 V into 100 ohm wants 0.1 A: limited to 0.05 A, constant current.
    assert_eq!(s(&c, "mode"), "cc");
    assert_eq!(f(&c, "current_a"), 0.05);
    let evidence = dump(&c);
    assert_eq!(evidence["action"], json!("set_current_limit"));
    assert_eq!(evidence["measurement"]["mode"], json!("cc"));
    assert_eq!(evidence["limits"]["max_current_a"], json!(2.0));
}

#[test]
fn a_setpoint_above_the_safety_limit_is_refused_before_any_byte_is_sent() {
    let psu = KoradSim::start(KoradConfig::default(), None).unwrap();
    let mut d = korad_driver(psu.path());
    assert_refused_limit(
        d.as_mut(),
        vec![
            (
                CapabilityAction::SetVoltage,
                json!({ "voltage_v": 12.5 }),
                "voltage_v",
            ),
            (
                CapabilityAction::SetCurrentLimit,
                json!({ "current_limit_a": 2.01 }),
                "current_limit_a",
            ),
            (
                CapabilityAction::PowerOn,
                json!({ "voltage_v": 5.0, "current_limit_a": 3.0 }),
                "current_limit_a",
            ),
        ],
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        psu.handle().snapshot().history.is_empty(),
        "the supply received nothing"
    );
    assert!(!psu.handle().snapshot().output_on);
}

#[test]
fn bad_psu_params_are_refused_naming_the_field() {
    let psu = KoradSim::start(KoradConfig::default(), None).unwrap();
    let mut d = korad_driver(psu.path());
    let sv = CapabilityAction::SetVoltage;
    assert_refused_invalid(
        d.as_mut(),
        vec![
            (sv, json!({}), "voltage_v"),
            (sv, json!({ "voltage_v": "12" }), "voltage_v"),
            (sv, json!({ "voltage_v": -1.0 }), "voltage_v"),
            (sv, json!({ "voltage_v": 5.0, "volts": 5 }), "volts"),
            (CapabilityAction::PowerOff, json!({ "now": true }), "now"),
            (CapabilityAction::MeasureOutput, json!({ "x": 1 }), "x"),
        ],
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(psu.handle().snapshot().history.is_empty());
}

#[test]
fn power_switching_finishes_even_when_cancelled_mid_way() {
    let psu = KoradSim::start(KoradConfig::default(), None).unwrap();
    let mut d = korad_driver(psu.path());
    let req = request(CapabilityAction::PowerOn, json!({ "voltage_v": 3.3 }));
    assert!(d.is_non_interruptible(req.action, &req.params));
    let cancel = req.cancel.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        cancel.cancel();
    });
    let o = d.execute(&req).expect("switching is not cut");
    t.join().unwrap();
    assert_eq!(f(&o, "voltage_v"), 3.3);
    assert!(psu.handle().snapshot().output_on);
    // A cancel that arrived before the action started stops it cleanly.
    let early = request(CapabilityAction::PowerOff, json!({}));
    early.cancel.cancel();
    assert!(matches!(d.execute(&early), Err(DriverError::Cancelled(_))));
    assert!(psu.handle().snapshot().output_on);
}

#[test]
fn scpi_over_serial_selects_the_channel_and_checks_the_error_queue() {
    let psu = ScpiPsuSim::start(ScpiPsuConfig::default(), None).unwrap();
    let mut d = driver(
        CapabilityType::ProgrammablePowerSupply,
        "scpi",
        json!({ "port": port(psu.path()), "channel": 2, "max_voltage_v": 24.0, "max_current_a": 1.0,
                "settle_ms": 20 }),
    );
    assert_eq!(d.health().status, HealthStatus::Healthy);
    let v = ok(
        d.as_mut(),
        CapabilityAction::SetVoltage,
        json!({ "voltage_v": 5.0 }),
    );
    // The readback after a setting is evidence on SCPI supplies too.
    assert_eq!(v.result_summary["output_on"], json!(false));
    assert_eq!(dump(&v)["measurement"]["voltage_v"], json!(0.0));
    let c = ok(
        d.as_mut(),
        CapabilityAction::SetCurrentLimit,
        json!({ "current_limit_a": 0.5 }),
    );
    assert_eq!(dump(&c)["action"], json!("set_current_limit"));
    let on = ok(d.as_mut(), CapabilityAction::PowerOn, json!({}));
    assert_eq!(f(&on, "voltage_v"), 5.0);
    assert_eq!(f(&on, "current_a"), 0.05);
    let st = psu.handle().snapshot();
    assert!(st.channels[1].output_on && !st.channels[0].output_on);
    assert_eq!((st.channels[1].vset_v, st.channels[1].iset_a), (5.0, 0.5));
    let texts: Vec<&str> = st.history.iter().map(|c| c.text.as_str()).collect();
    for expected in [
        "*CLS",
        "*IDN?",
        ":INST CH2",
        ":VOLT 5.000",
        ":CURR 0.500",
        ":SYST:ERR?",
        ":OUTP CH2,ON",
    ] {
        assert!(
            texts.contains(&expected),
            "{expected} missing from {texts:?}"
        );
    }
    assert!(
        st.history.iter().all(|c| c.error.is_none()),
        "no command raised an error"
    );
}

#[test]
fn an_scpi_error_fails_the_action_with_the_instruments_code_and_message() {
    let psu = ScpiPsuSim::start(ScpiPsuConfig::default(), None).unwrap();
    // CH3 of a DP832 is rated 5 V; the bench limit is set higher by mistake.
    let mut d = driver(
        CapabilityType::ProgrammablePowerSupply,
        "scpi",
        json!({ "port": port(psu.path()), "channel": 3, "max_voltage_v": 12.0, "max_current_a": 1.0 }),
    );
    match run(
        d.as_mut(),
        CapabilityAction::SetVoltage,
        json!({ "voltage_v": 8.0 }),
    ) {
        Err(DriverError::Device(msg)) => {
            assert!(
                msg.contains("-222") && msg.contains("Data out of range"),
                "{msg}"
            );
            assert!(msg.contains(":VOLT 8.000"), "{msg}");
        }
        other => panic!("expected a Device error, got {other:?}"),
    }
    assert_eq!(psu.handle().snapshot().channels[2].vset_v, 0.0);
    assert!(
        psu.handle().snapshot().errors.is_empty(),
        "the queue was read out"
    );
}

/// Serves one TCP connection by copying bytes to and from the simulator's
/// pty: an SCPI instrument's raw socket (port 5555) in miniature.
fn tcp_bridge(pty: &Path) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let pty = port(pty);
    std::thread::spawn(move || {
        let Ok((sock, _)) = listener.accept() else {
            return;
        };
        let mut serial = serialport::new(pty, 9600)
            .timeout(Duration::from_millis(20))
            .open()
            .unwrap();
        let mut serial_w = serial.try_clone().unwrap();
        let mut sock_r = sock.try_clone().unwrap();
        let mut sock_w = sock;
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok(n) = sock_r.read(&mut buf) {
                if n == 0 || serial_w.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
        let mut buf = [0u8; 512];
        loop {
            match serial.read(&mut buf) {
                Ok(n) => {
                    if sock_w.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break,
            }
        }
    });
    addr
}

#[test]
fn scpi_over_tcp_drives_the_instrument_through_a_raw_socket() {
    let psu = ScpiPsuSim::start(ScpiPsuConfig::default(), None).unwrap();
    let addr = tcp_bridge(psu.path());
    let mut d = driver(
        CapabilityType::ProgrammablePowerSupply,
        "scpi",
        json!({ "tcp_address": addr, "max_voltage_v": 12.0, "max_current_a": 1.0, "settle_ms": 20 }),
    );
    assert_eq!(d.health().status, HealthStatus::Healthy);
    assert_eq!(d.metadata()["port_name"], json!(format!("tcp://{addr}")));
    let on = ok(
        d.as_mut(),
        CapabilityAction::PowerOn,
        json!({ "voltage_v": 3.3, "current_limit_a": 0.2 }),
    );
    assert_eq!(f(&on, "voltage_v"), 3.3);
    assert_eq!(f(&on, "current_a"), 0.033);
    let m = ok(d.as_mut(), CapabilityAction::MeasureOutput, json!({}));
    assert_eq!(m.result_summary["output_on"], json!(true));
    assert!(psu.handle().snapshot().channels[0].output_on);
    assert_eq!(
        limit_field(run(
            d.as_mut(),
            CapabilityAction::SetVoltage,
            json!({ "voltage_v": 13.0 })
        )),
        "voltage_v"
    );
}

#[test]
fn a_psu_unplugged_and_replugged_is_unhealthy_then_answers_again() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("usb-Korad_KA3005P-if00");
    let mut psu = KoradSim::start(KoradConfig::default(), Some(&link)).unwrap();
    let mut d = korad_driver(&link);
    ok(
        d.as_mut(),
        CapabilityAction::PowerOn,
        json!({ "voltage_v": 5.0 }),
    );
    psu.vanish().unwrap();
    // Noticed by the link's reader within a few read polls; the bound is
    // generous because the suite shares two cores with other tests.
    assert!(wait_until(Duration::from_secs(5), || d.health().status
        == HealthStatus::Unhealthy));
    assert!(matches!(
        run(d.as_mut(), CapabilityAction::MeasureOutput, json!({})),
        Err(DriverError::Unavailable(_))
    ));
    psu.reappear().unwrap();
    assert!(wait_until(Duration::from_secs(3), || d.health().status
        == HealthStatus::Healthy));
    // Mains-powered: the output stayed on through the USB unplug.
    let m = ok(d.as_mut(), CapabilityAction::MeasureOutput, json!({}));
    assert_eq!(f(&m, "voltage_v"), 5.0);
}

#[test]
fn sim_psu_settles_and_limits_current_like_a_korad() {
    let mut d = driver(
        CapabilityType::ProgrammablePowerSupply,
        "sim",
        json!({ "max_voltage_v": 24.0, "max_current_a": 3.0, "load_ohms": 4.0, "command_ms": 20,
                "settle_ms": 60, "rated_voltage_v": 20.0 }),
    );
    let started = Instant::now();
    let on = ok(
        d.as_mut(),
        CapabilityAction::PowerOn,
        json!({ "voltage_v": 12.0, "current_limit_a": 2.0 }),
    );
    // Three commands, the settle wait and two measuring commands.
    assert!(started.elapsed() >= Duration::from_millis(3 * 20 + 60 + 2 * 20));
    assert_eq!(s(&on, "mode"), "cc");
    assert_eq!(f(&on, "current_a"), 2.0);
    assert_eq!(f(&on, "voltage_v"), 8.0);
    match run(
        d.as_mut(),
        CapabilityAction::SetVoltage,
        json!({ "voltage_v": 22.0 }),
    ) {
        Err(DriverError::Device(msg)) => assert!(msg.contains("rating"), "{msg}"),
        other => panic!("expected the simulated unit to refuse, got {other:?}"),
    }
    assert_eq!(
        limit_field(run(
            d.as_mut(),
            CapabilityAction::SetVoltage,
            json!({ "voltage_v": 25.0 })
        )),
        "voltage_v"
    );
}

// ------------------------------------------------------------ thumb robot

fn grbl(config: GrblConfig) -> GrblSim {
    GrblSim::start(
        GrblConfig {
            time_scale: 4.0,
            ..config
        },
        None,
    )
    .unwrap()
}

fn robot_settings(path: &Path) -> Value {
    json!({
        "port": port(path),
        "bounds_mm": { "x_min": 0.0, "x_max": 90.0, "y_min": 0.0, "y_max": 150.0 },
        "safe_z_mm": 10.0,
        "press_z_mm": 2.0,
        "feed_mm_per_min": 1500.0,
        "key_map": {
            "a": { "x_mm": 10.0, "y_mm": 100.0 },
            "b": { "x_mm": 20.0, "y_mm": 100.0 },
            "c": { "x_mm": 30.0, "y_mm": 100.0 },
            "space": { "x_mm": 40.0, "y_mm": 120.0 }
        },
        "buttons": { "power": { "x_mm": 85.0, "y_mm": 40.0 } }
    })
}

fn robot(path: &Path) -> Box<dyn Driver> {
    driver(CapabilityType::ThumbRobot, "grbl", robot_settings(path))
}

/// Where the stylus went down (Z at the press height), in order.
fn presses(sim: &GrblSim) -> Vec<[f64; 2]> {
    sim.handle()
        .snapshot()
        .motions()
        .filter(|m| {
            m.kind == MoveKind::Linear && (m.to_mm[2] - 2.0).abs() < 1e-6 && m.from_mm[2] > 2.0
        })
        .map(|m| [m.to_mm[0], m.to_mm[1]])
        .collect()
}

fn lines(sim: &GrblSim) -> Vec<String> {
    sim.handle()
        .snapshot()
        .lines
        .into_iter()
        .map(|l| l.1)
        .collect()
}

#[test]
fn grbl_tap_waits_for_the_banner_unlocks_and_presses_at_the_target() {
    let sim = grbl(GrblConfig::default());
    let mut d = robot(sim.path());
    let o = ok(
        d.as_mut(),
        CapabilityAction::Tap,
        json!({ "x_mm": 30.0, "y_mm": 40.0, "hold_ms": 100 }),
    );
    assert_eq!(presses(&sim), vec![[30.0, 40.0]]);
    let st = sim.handle().snapshot();
    assert_eq!(
        st.position_mm,
        [30.0, 40.0, 10.0],
        "stylus back up at the safe height"
    );
    let sent = lines(&sim);
    assert_eq!(
        &sent[..2],
        ["$X", "G21 G90"],
        "unlocked the alarm, mm + absolute"
    );
    for expected in [
        "G0 X30.000 Y40.000",
        "G1 Z2.000 F1500",
        "G4 P0.100",
        "G4 P0",
    ] {
        assert!(
            sent.iter().any(|l| l == expected),
            "{expected} missing from {sent:?}"
        );
    }
    let dwell = st
        .moves
        .iter()
        .find(|m| m.kind == MoveKind::Dwell && m.dwell_s > 0.0)
        .unwrap();
    assert_eq!(dwell.dwell_s, 0.1);
    let evidence = dump(&o);
    assert_eq!(evidence["presses"][0]["x_mm"], json!(30.0));
    assert_eq!(evidence["final_position_mm"], json!([30.0, 40.0, 10.0]));
    assert!(evidence["gcode"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l == "G1 Z2.000 F1500"));
    assert!(evidence["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["data"].as_str().is_some_and(|d| d.starts_with("<Idle|"))));
    assert_eq!(o.result_summary["presses"], json!(1));
}

#[test]
fn grbl_double_tap_long_press_drag_and_button_make_the_right_moves() {
    let sim = grbl(GrblConfig::default());
    let mut d = robot(sim.path());
    ok(
        d.as_mut(),
        CapabilityAction::DoubleTap,
        json!({ "x_mm": 50.0, "y_mm": 60.0, "interval_ms": 50 }),
    );
    assert_eq!(presses(&sim), vec![[50.0, 60.0], [50.0, 60.0]]);

    let o = ok(
        d.as_mut(),
        CapabilityAction::LongPress,
        json!({ "x_mm": 10.0, "y_mm": 20.0, "hold_ms": 1200 }),
    );
    assert!(
        f(&o, "duration_ms") >= 1200.0 / 4.0,
        "the dwell is {} ms of machine time",
        1200
    );
    let st = sim.handle().snapshot();
    assert!(st
        .moves
        .iter()
        .any(|m| m.kind == MoveKind::Dwell && m.dwell_s == 1.2));

    ok(
        d.as_mut(),
        CapabilityAction::Drag,
        json!({ "x_mm": 10.0, "y_mm": 10.0, "to_x_mm": 70.0, "to_y_mm": 90.0, "speed_mm_per_min": 2000.0 }),
    );
    let st = sim.handle().snapshot();
    let drag = st
        .motions()
        .find(|m| m.kind == MoveKind::Linear && m.from_mm == [10.0, 10.0, 2.0])
        .expect("a pressed move");
    assert_eq!(drag.to_mm, [70.0, 90.0, 2.0]);
    assert_eq!(drag.feed_mm_min, 2000.0);

    let b = ok(
        d.as_mut(),
        CapabilityAction::PressHardwareButton,
        json!({ "button": "power" }),
    );
    assert_eq!(presses(&sim).last(), Some(&[85.0, 40.0]));
    assert_eq!(s(&b, "button"), "power");
    assert_eq!(
        invalid_field(run(
            d.as_mut(),
            CapabilityAction::PressHardwareButton,
            json!({ "button": "reset" })
        )),
        "button"
    );
}

#[test]
fn type_keys_presses_each_key_and_stops_between_keys_when_cancelled() {
    let sim = grbl(GrblConfig::default());
    let mut d = robot(sim.path());
    let o = ok(
        d.as_mut(),
        CapabilityAction::TypeKeys,
        json!({ "text": "ab c", "interval_ms": 20 }),
    );
    assert_eq!(
        presses(&sim),
        vec![[10.0, 100.0], [20.0, 100.0], [40.0, 120.0], [30.0, 100.0]]
    );
    assert_eq!(o.result_summary["keys_pressed"], json!(4));
    assert_eq!(dump(&o)["presses"].as_array().unwrap().len(), 4);

    let req = request(
        CapabilityAction::TypeKeys,
        json!({ "keys": ["a", "b", "c", "a", "b", "c", "a", "b"] }),
    );
    assert!(
        !d.is_non_interruptible(req.action, &req.params),
        "interruptible between keys"
    );
    assert!(d.is_non_interruptible(CapabilityAction::Tap, &Map::new()));
    let cancel = req.cancel.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        cancel.cancel();
    });
    let before = presses(&sim).len();
    let r = d.execute(&req);
    t.join().unwrap();
    match r {
        Err(DriverError::Cancelled(msg)) => assert!(msg.contains("of 8 keys"), "{msg}"),
        other => panic!("expected Cancelled, got {other:?}"),
    }
    let done = presses(&sim).len() - before;
    assert!((1..8).contains(&done), "{done} keys pressed");
    assert_eq!(
        sim.handle().snapshot().position_mm[2],
        10.0,
        "stylus up after the last press"
    );
}

#[test]
fn coordinates_outside_the_bounds_are_refused_before_anything_is_sent() {
    let sim = grbl(GrblConfig::default());
    let mut d = robot(sim.path());
    assert_refused_limit(
        d.as_mut(),
        vec![
            (
                CapabilityAction::Tap,
                json!({ "x_mm": 95.0, "y_mm": 10.0 }),
                "x_mm",
            ),
            (
                CapabilityAction::Tap,
                json!({ "x_mm": 5.0, "y_mm": -1.0 }),
                "y_mm",
            ),
            (
                CapabilityAction::Drag,
                json!({ "x_mm": 5.0, "y_mm": 5.0, "to_x_mm": 5.0, "to_y_mm": 151.0 }),
                "to_y_mm",
            ),
        ],
    );
    let t = CapabilityAction::Tap;
    assert_refused_invalid(
        d.as_mut(),
        vec![
            (t, json!({ "x_mm": 5.0 }), "y_mm"),
            (t, json!({ "x_mm": 5.0, "y_mm": 5.0, "z_mm": 1.0 }), "z_mm"),
            (
                t,
                json!({ "x_mm": 5.0, "y_mm": 5.0, "hold_ms": 9000 }),
                "hold_ms",
            ),
            (
                CapabilityAction::TypeKeys,
                json!({ "keys": ["a", "q"] }),
                "keys[1]",
            ),
            (CapabilityAction::TypeKeys, json!({ "text": "abz" }), "text"),
            (
                CapabilityAction::DoubleTap,
                json!({ "x_mm": 5.0, "y_mm": 5.0, "interval_ms": 2500 }),
                "interval_ms",
            ),
        ],
    );
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        lines(&sim).is_empty(),
        "nothing was sent: {:?}",
        lines(&sim)
    );
}

#[test]
fn a_grbl_alarm_fails_the_action_with_its_meaning_and_the_next_action_recovers() {
    // The bench says X reaches 90 mm; this machine's travel ends at 60.
    let sim = grbl(GrblConfig {
        travel_max_mm: [60.0, 160.0, 20.0],
        ..GrblConfig::default()
    });
    let mut d = robot(sim.path());
    match run(
        d.as_mut(),
        CapabilityAction::Tap,
        json!({ "x_mm": 80.0, "y_mm": 10.0 }),
    ) {
        Err(DriverError::Device(msg)) => {
            assert!(
                msg.contains("ALARM:2") && msg.contains("soft limit"),
                "{msg}"
            )
        }
        other => panic!("expected the alarm as a Device error, got {other:?}"),
    }
    assert_eq!(sim.handle().snapshot().alarms.last().map(|a| a.1), Some(2));
    // The next action soft-resets, unlocks and works.
    ok(
        d.as_mut(),
        CapabilityAction::Tap,
        json!({ "x_mm": 40.0, "y_mm": 10.0 }),
    );
    assert_eq!(presses(&sim).last(), Some(&[40.0, 10.0]));
    assert_eq!(d.health().status, HealthStatus::Healthy);
}

#[test]
fn a_grbl_controller_replugged_is_prepared_again_before_moving() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("usb-Arduino_Uno-if00");
    let mut sim = GrblSim::start(
        GrblConfig {
            time_scale: 4.0,
            ..GrblConfig::default()
        },
        Some(&link),
    )
    .unwrap();
    let mut d = robot(&link);
    assert_eq!(d.health().status, HealthStatus::Healthy);
    sim.vanish().unwrap();
    assert!(wait_until(Duration::from_secs(1), || d.health().status
        == HealthStatus::Unhealthy));
    sim.reappear().unwrap();
    assert!(wait_until(Duration::from_secs(3), || d.health().status
        == HealthStatus::Healthy));
    ok(
        d.as_mut(),
        CapabilityAction::Tap,
        json!({ "x_mm": 20.0, "y_mm": 30.0 }),
    );
    let sent = lines(&sim);
    assert_eq!(
        sent.iter().filter(|l| *l == "$X").count(),
        2,
        "unlocked after each power-up"
    );
    assert_eq!(presses(&sim).last(), Some(&[20.0, 30.0]));
}

#[test]
fn sim_robot_moves_take_the_time_the_feed_rate_implies() {
    let mut d = driver(
        CapabilityType::ThumbRobot,
        "sim",
        json!({
            "bounds_mm": { "x_min": 0.0, "x_max": 100.0, "y_min": 0.0, "y_max": 100.0 },
            "safe_z_mm": 10.0, "press_z_mm": 4.0,
            "feed_mm_per_min": 600.0, "rapid_mm_per_min": 6000.0, "speedup": 2.0
        }),
    );
    // From (0, 0, 10): rapid 50 mm (0.5 s), press 6 mm at 600 mm/min
    // (0.6 s), hold 0.2 s, lift 6 mm rapid (0.06 s): 1.36 s, halved.
    let started = Instant::now();
    let o = ok(
        d.as_mut(),
        CapabilityAction::Tap,
        json!({ "x_mm": 30.0, "y_mm": 40.0, "hold_ms": 200 }),
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(680) && took < Duration::from_millis(1200),
        "{took:?}"
    );
    let evidence = dump(&o);
    assert_eq!(evidence["final_position_mm"], json!([30.0, 40.0, 10.0]));
    assert_eq!(
        evidence["gcode"],
        json!([
            "G0 Z10.000",
            "G0 X30.000 Y40.000",
            "G1 Z4.000 F600",
            "G4 P0.200",
            "G0 Z10.000"
        ])
    );
    let meta = d.metadata();
    assert_eq!(meta["supported_targets"], json!(["touchscreen"]));
    assert!(!d.supported_actions().contains(&CapabilityAction::TypeKeys));
    assert!(matches!(
        run(
            d.as_mut(),
            CapabilityAction::TypeKeys,
            json!({ "text": "a" })
        ),
        Err(DriverError::Unsupported { .. })
    ));
}
