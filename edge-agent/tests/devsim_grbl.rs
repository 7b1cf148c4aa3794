//! The GRBL 1.1 simulator, driven with G-code lines through its pty.

mod devsim_support;

use std::time::Duration;

use devsim_support::{open, query, read_reply, read_until, send};
use edge_agent::devsim::grbl::{GrblConfig, GrblSim, GrblStatus, MoveKind};
use serialport::SerialPort;

const REPLY: Duration = Duration::from_millis(500);

/// Opens the port and waits for the banner the reset-on-open prints.
fn connect(sim: &GrblSim) -> Box<dyn SerialPort> {
    let mut port = open(sim.path());
    read_until(port.as_mut(), "Grbl 1.1h ['$' for help]\r\n", REPLY);
    port
}

/// Sends one line and returns its reply line(s).
fn line(port: &mut dyn SerialPort, text: &str) -> String {
    send(port, format!("{text}\n").as_bytes());
    let reply = read_until(port, "\r\n", REPLY);
    if reply.contains("ok\r\n") || reply.contains("error:") {
        return reply;
    }
    reply + &read_until(port, "\r\n", REPLY)
}

fn fast() -> GrblConfig {
    GrblConfig {
        time_scale: 10.0,
        ..GrblConfig::default()
    }
}

#[test]
fn opening_the_port_prints_the_banner_and_locks_until_homed_or_unlocked() {
    let sim = GrblSim::start(fast(), None).unwrap();
    let mut port = open(sim.path());
    let banner = read_until(port.as_mut(), "to unlock]\r\n", REPLY);
    assert_eq!(
        banner,
        "\r\nGrbl 1.1h ['$' for help]\r\n[MSG:'$H'|'$X' to unlock]\r\n"
    );
    assert_eq!(line(port.as_mut(), "G0 X1"), "error:9\r\n");
    assert_eq!(
        line(port.as_mut(), "$X"),
        "[MSG:Caution: Unlocked]\r\nok\r\n"
    );
    assert_eq!(line(port.as_mut(), "G0 X1"), "ok\r\n");
}

#[test]
fn homing_answers_ok_when_done_and_leaves_the_machine_idle_at_home() {
    let sim = GrblSim::start(fast(), None).unwrap();
    let mut port = connect(&sim);
    assert_eq!(line(port.as_mut(), "$H"), "ok\r\n");
    assert_eq!(
        query(port.as_mut(), "?", REPLY),
        "<Idle|MPos:0.000,0.000,0.000|FS:0,0>\r\n"
    );
    let st = sim.handle().snapshot();
    assert!(st.homed);
    assert_eq!(st.moves.last().map(|m| m.kind), Some(MoveKind::Home));
}

#[test]
fn a_tap_is_recorded_as_down_dwell_up_at_the_commanded_coordinates() {
    let sim = GrblSim::start(fast(), None).unwrap();
    let mut port = connect(&sim);
    line(port.as_mut(), "$X");
    for l in [
        "G21 G90",
        "G0 X50 Y80",
        "G1 Z15 F3000",
        "G4 P0.2",
        "G0 Z0",
        "G4 P0",
    ] {
        assert_eq!(line(port.as_mut(), l), "ok\r\n", "{l}");
    }
    let st = sim.handle().snapshot();
    let steps: Vec<_> = st.moves.iter().map(|m| (m.kind, m.to_mm)).collect();
    assert_eq!(
        steps,
        [
            (MoveKind::Rapid, [50.0, 80.0, 0.0]),
            (MoveKind::Linear, [50.0, 80.0, 15.0]),
            (MoveKind::Dwell, [50.0, 80.0, 15.0]),
            (MoveKind::Rapid, [50.0, 80.0, 0.0]),
            (MoveKind::Dwell, [50.0, 80.0, 0.0]),
        ]
    );
    let (down, dwell, up) = (&st.moves[1], &st.moves[2], &st.moves[3]);
    assert_eq!(down.feed_mm_min, 3000.0);
    assert_eq!(dwell.dwell_s, 0.2);
    assert!(dwell.started_at >= down.finished_at && up.started_at >= dwell.finished_at);
    // 0.2 s of machine time at a time scale of 10.
    let held = dwell.finished_at - dwell.started_at;
    assert_eq!(held, Duration::from_millis(20));
    assert_eq!(st.status, GrblStatus::Idle);
}

#[test]
fn a_motion_line_is_acknowledged_before_it_ends_and_g4_after() {
    let sim = GrblSim::start(
        GrblConfig {
            time_scale: 1.0,
            homing_enabled: false,
            ..GrblConfig::default()
        },
        None,
    )
    .unwrap();
    let mut port = connect(&sim);
    // 10 mm at 3000 mm/min: 200 ms.
    assert_eq!(line(port.as_mut(), "G1 X10 F3000"), "ok\r\n");
    assert!(
        sim.handle().snapshot().moves.is_empty(),
        "ok came while still moving"
    );
    assert!(query(port.as_mut(), "?", REPLY).starts_with("<Run|MPos:"));
    assert_eq!(line(port.as_mut(), "G4 P0"), "ok\r\n");
    let st = sim.handle().snapshot();
    assert_eq!(st.motions().count(), 1);
    assert_eq!(st.position_mm, [10.0, 0.0, 0.0]);
}

#[test]
fn an_out_of_bounds_move_raises_alarm_2_and_needs_reset_and_unlock() {
    let sim = GrblSim::start(fast(), None).unwrap();
    let mut port = connect(&sim);
    line(port.as_mut(), "$X");
    send(port.as_mut(), b"G0 X150\n");
    let alarm = read_until(port.as_mut(), "Reset to continue]\r\n", REPLY);
    assert_eq!(alarm, "ALARM:2\r\n[MSG:Reset to continue]\r\n");
    // Until a reset the controller reads nothing.
    send(port.as_mut(), b"G0 X10\n");
    assert!(read_reply(port.as_mut(), Duration::from_millis(100)).is_empty());
    send(port.as_mut(), &[0x18]);
    let banner = read_until(port.as_mut(), "to unlock]\r\n", REPLY);
    assert!(banner.starts_with("\r\nGrbl 1.1h"), "{banner:?}");
    assert_eq!(line(port.as_mut(), "G0 X10"), "error:9\r\n");
    line(port.as_mut(), "$X");
    assert_eq!(line(port.as_mut(), "G0 X10"), "ok\r\n");
    assert_eq!(line(port.as_mut(), "G4 P0"), "ok\r\n");
    let st = sim.handle().snapshot();
    let targets: Vec<_> = st.motions().map(|m| m.to_mm).collect();
    assert_eq!(
        targets,
        [[10.0, 0.0, 0.0]],
        "the out-of-bounds move never ran"
    );
    assert_eq!(st.alarms.iter().map(|a| a.1).collect::<Vec<_>>(), [2]);
}

#[test]
fn a_jog_past_the_travel_is_refused_without_an_alarm() {
    let sim = GrblSim::start(fast(), None).unwrap();
    let mut port = connect(&sim);
    line(port.as_mut(), "$X");
    assert_eq!(line(port.as_mut(), "$J=G91 Y200 F1000"), "error:15\r\n");
    assert_eq!(line(port.as_mut(), "$J=G91 Y20 F6000"), "ok\r\n");
    assert_eq!(line(port.as_mut(), "G4 P0"), "ok\r\n");
    let st = sim.handle().snapshot();
    assert_eq!(st.position_mm, [0.0, 20.0, 0.0]);
    assert!(st.alarms.is_empty());
}

#[test]
fn a_soft_reset_while_moving_raises_alarm_3() {
    let sim = GrblSim::start(
        GrblConfig {
            homing_enabled: false,
            ..GrblConfig::default()
        },
        None,
    )
    .unwrap();
    let mut port = connect(&sim);
    assert_eq!(line(port.as_mut(), "G1 X100 F6000"), "ok\r\n");
    std::thread::sleep(Duration::from_millis(100));
    send(port.as_mut(), &[0x18]);
    let out = read_until(port.as_mut(), "to unlock]\r\n", REPLY);
    assert!(out.starts_with("ALARM:3\r\n\r\nGrbl 1.1h"), "{out:?}");
    let st = sim.handle().snapshot();
    assert_eq!(st.status, GrblStatus::Alarm);
    assert!(
        st.position_mm[0] > 0.0 && st.position_mm[0] < 100.0,
        "{:?}",
        st.position_mm
    );
}

#[test]
fn malformed_and_unsupported_lines_get_grbl_error_numbers() {
    let sim = GrblSim::start(fast(), None).unwrap();
    let mut port = connect(&sim);
    line(port.as_mut(), "$X");
    assert_eq!(line(port.as_mut(), "G1 X1..2 F100"), "error:2\r\n");
    assert_eq!(line(port.as_mut(), "G2 X1 Y1 I1"), "error:20\r\n");
    assert_eq!(
        line(port.as_mut(), "G1 X10"),
        "error:22\r\n",
        "no feed rate yet"
    );
    assert_eq!(line(port.as_mut(), "$Z"), "error:3\r\n");
    assert!(sim.handle().snapshot().moves.is_empty());
}
