//! The Korad KA3005P simulator, driven through its pty as a driver would.

mod devsim_support;

use std::time::{Duration, Instant};

use devsim_support::{open, query, read_for, send, wait_until};
use edge_agent::devsim::korad::{KoradConfig, KoradOutcome, KoradSim};

/// Ample time for one command's 50 ms processing delay, even on a loaded machine.
const REPLY: Duration = Duration::from_millis(300);

#[test]
fn idn_query_identifies_a_ka3005p() {
    let psu = KoradSim::start(KoradConfig::default(), None).unwrap();
    let mut port = open(psu.path());
    assert_eq!(query(port.as_mut(), "*IDN?", REPLY), "KORADKA3005PV2.0");
}

#[test]
fn setpoints_read_back_in_the_units_fixed_decimal_format() {
    let psu = KoradSim::start(KoradConfig::default(), None).unwrap();
    let mut port = open(psu.path());
    send(port.as_mut(), b"VSET1:12.00");
    assert_eq!(query(port.as_mut(), "VSET1?", REPLY), "12.00");
    // Line terminators are tolerated, short numbers are padded on read-back.
    send(port.as_mut(), b"VSET1:5\r\n");
    assert_eq!(query(port.as_mut(), "VSET1?", REPLY), "05.00");
    send(port.as_mut(), b"ISET1:1.5\n");
    assert_eq!(query(port.as_mut(), "ISET1?", REPLY), "1.500");
    let st = psu.handle().snapshot();
    assert_eq!((st.vset_v, st.iset_a, st.output_on), (5.0, 1.5, false));
}

#[test]
fn output_on_measures_setpoint_voltage_and_load_current() {
    let psu = KoradSim::start(
        KoradConfig {
            load_ohms: Some(100.0),
            ..KoradConfig::default()
        },
        None,
    )
    .unwrap();
    let mut port = open(psu.path());
    send(port.as_mut(), b"VSET1:12.00ISET1:1.000");
    assert_eq!(
        query(port.as_mut(), "VOUT1?", REPLY * 2),
        "00.00",
        "output is off"
    );
    send(port.as_mut(), b"OUT1");
    assert_eq!(query(port.as_mut(), "VOUT1?", REPLY), "12.00");
    assert_eq!(query(port.as_mut(), "IOUT1?", REPLY), "0.120");
    let status = query(port.as_mut(), "STATUS?", REPLY).into_bytes();
    assert_eq!(status.len(), 1);
    assert_ne!(status[0] & 0x40, 0, "bit 6: output on");
    assert_ne!(status[0] & 0x01, 0, "bit 0: constant voltage");

    // A 5 Ω load would draw 2.4 A: the unit current-limits at ISET.
    psu.handle().set_load_ohms(Some(5.0));
    assert_eq!(query(port.as_mut(), "IOUT1?", REPLY), "1.000");
    assert_eq!(query(port.as_mut(), "VOUT1?", REPLY), "05.00");
    let status = query(port.as_mut(), "STATUS?", REPLY).into_bytes();
    assert_eq!(status[0] & 0x01, 0, "bit 0 clear: constant current");

    send(port.as_mut(), b"OUT0");
    assert_eq!(query(port.as_mut(), "IOUT1?", REPLY), "0.000");
    assert!(!psu.handle().snapshot().output_on);
}

#[test]
fn unknown_commands_and_out_of_range_setpoints_are_ignored_without_reply() {
    let psu = KoradSim::start(KoradConfig::default(), None).unwrap();
    let mut port = open(psu.path());
    send(port.as_mut(), b"VSET1:03.30");
    assert_eq!(query(port.as_mut(), "FOO?", REPLY), "");
    send(port.as_mut(), b"VSET1:31.00");
    assert_eq!(query(port.as_mut(), "VSET1?", REPLY), "03.30");
    let st = psu.handle().snapshot();
    let outcomes: Vec<_> = st
        .history
        .iter()
        .map(|c| (c.text.as_str(), &c.outcome))
        .collect();
    assert_eq!(outcomes[1], ("FOO?", &KoradOutcome::Ignored));
    assert_eq!(outcomes[2], ("VSET1:31.00", &KoradOutcome::Ignored));
}

#[test]
fn each_command_is_executed_a_processing_delay_after_it_arrived() {
    let psu = KoradSim::start(KoradConfig::default(), None).unwrap();
    let mut port = open(psu.path());
    // Two commands back to back queue behind each other: the query's
    // reply cannot come before two processing delays have passed.
    let sent = Instant::now();
    assert_eq!(query(port.as_mut(), "OUT1VOUT1?", REPLY * 2), "00.00");
    assert!(
        sent.elapsed() >= Duration::from_millis(100),
        "{:?}",
        sent.elapsed()
    );
    let st = psu.handle().snapshot();
    assert_eq!(st.history.len(), 2);
    let first = st.history[0].executed_at.unwrap();
    let second = st.history[1].executed_at.unwrap();
    assert!(second - first >= Duration::from_millis(50));
}

#[test]
fn an_unpaced_driver_loses_commands_when_the_unit_drops_them_while_busy() {
    let psu = KoradSim::start(
        KoradConfig {
            drop_when_busy: true,
            ..KoradConfig::default()
        },
        None,
    )
    .unwrap();
    let mut port = open(psu.path());
    send(port.as_mut(), b"VSET1:05.00OUT1");
    read_for(port.as_mut(), REPLY);
    let st = psu.handle().snapshot();
    assert_eq!(st.vset_v, 5.0);
    assert!(!st.output_on, "OUT1 arrived while VSET1 was processing");
    assert_eq!(st.history[1].outcome, KoradOutcome::DroppedBusy);
}

#[test]
fn a_port_that_is_only_opened_records_no_commands() {
    let psu = KoradSim::start(KoradConfig::default(), None).unwrap();
    let port = open(psu.path());
    assert!(wait_until(Duration::from_millis(500), || psu.host_connected()));
    std::thread::sleep(Duration::from_millis(60));
    assert!(psu.handle().snapshot().history.is_empty());
    drop(port);
    assert!(wait_until(Duration::from_millis(500), || !psu.host_connected()));
}
