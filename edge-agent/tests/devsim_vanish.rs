//! Unplugging and replugging simulated devices, and what a driver sees.

mod devsim_support;

use std::io::{ErrorKind, Read, Write};
use std::time::Duration;

use devsim_support::{open, query, read_until, send, wait_until};
use edge_agent::devsim::grbl::{GrblConfig, GrblSim};
use edge_agent::devsim::korad::{KoradConfig, KoradSim};
use edge_agent::devsim::lcus::{frame, LcusConfig, LcusSim};
use edge_agent::devsim::DevSimError;

const REPLY: Duration = Duration::from_millis(200);

#[test]
fn a_driver_holding_the_port_gets_broken_pipe_once_the_device_vanishes() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("usb-Korad_KA3005P-if00");
    let mut psu = KoradSim::start(KoradConfig::default(), Some(&link)).unwrap();
    let mut port = open(&link);
    assert_eq!(query(port.as_mut(), "*IDN?", REPLY), "KORADKA3005PV2.0");
    let old_pty = psu.pty_path().to_path_buf();

    psu.vanish().unwrap();
    assert!(!psu.is_present());
    let mut buf = [0u8; 16];
    let read = port.read(&mut buf).unwrap_err();
    assert_eq!(read.kind(), ErrorKind::BrokenPipe);
    let write = port.write(b"VOUT1?").unwrap_err();
    assert_eq!(write.kind(), ErrorKind::BrokenPipe);
    assert!(std::fs::symlink_metadata(&link).is_err(), "link removed");
    assert!(!old_pty.exists(), "{} removed", old_pty.display());
}

#[test]
fn raw_reads_return_end_of_file_and_writes_fail_with_eio_after_a_vanish() {
    let mut psu = KoradSim::start(KoradConfig::default(), None).unwrap();
    let mut slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(psu.pty_path())
        .unwrap();
    psu.vanish().unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(slave.read(&mut buf).unwrap(), 0);
    assert_eq!(slave.read(&mut buf).unwrap(), 0, "and stays at end of file");
    let err = slave.write(b"OUT1").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
}

#[test]
fn a_returning_device_is_reopened_through_the_same_link_with_its_state_kept() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("korad");
    let mut psu = KoradSim::start(KoradConfig::default(), Some(&link)).unwrap();
    let mut port = open(&link);
    send(port.as_mut(), b"VSET1:05.00OUT1");
    assert!(wait_until(REPLY, || psu.handle().snapshot().output_on));
    psu.vanish().unwrap();
    drop(port);

    let new_pty = psu.reappear().unwrap();
    assert_eq!(std::fs::read_link(&link).unwrap(), new_pty);
    assert!(psu.is_present());
    let mut port = open(&link);
    // The PSU is mains-powered: losing USB did not switch its output off.
    assert_eq!(query(port.as_mut(), "VOUT1?", REPLY), "05.00");
}

#[test]
fn a_usb_powered_relay_board_comes_back_with_all_relays_off() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("lcus");
    let mut board = LcusSim::start(LcusConfig::default(), Some(&link)).unwrap();
    let mut port = open(&link);
    send(port.as_mut(), &frame(3, true));
    assert!(wait_until(REPLY, || board.handle().relay(3)));
    board.vanish().unwrap();
    assert!(!board.handle().relay(3));
    board.reappear().unwrap();
    let mut port = open(&link);
    send(port.as_mut(), &[0xFF]);
    let status = read_until(port.as_mut(), "CH4", REPLY);
    assert!(status.contains("CH3:OFF"), "{status:?}");
}

#[test]
fn a_replugged_grbl_boots_afresh_and_must_be_homed_again() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("grbl");
    let config = GrblConfig {
        time_scale: 20.0,
        ..GrblConfig::default()
    };
    let mut robot = GrblSim::start(config, Some(&link)).unwrap();
    let mut port = open(&link);
    read_until(port.as_mut(), "to unlock]\r\n", REPLY);
    send(port.as_mut(), b"$H\n");
    read_until(port.as_mut(), "ok\r\n", Duration::from_secs(1));
    assert!(robot.handle().snapshot().homed);
    robot.vanish().unwrap();
    robot.reappear().unwrap();
    let mut port = open(&link);
    read_until(port.as_mut(), "[MSG:'$H'|'$X' to unlock]\r\n", REPLY);
    assert!(!robot.handle().snapshot().homed);
}

#[test]
fn stopping_a_simulator_removes_its_link() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("by-id").join("usb-Korad_KA3005P-if00");
    let psu = KoradSim::start(KoradConfig::default(), Some(&link)).unwrap();
    assert!(std::fs::read_link(&link).unwrap().starts_with("/dev/pts"));
    psu.stop().unwrap();
    assert!(std::fs::symlink_metadata(&link).is_err());
}

#[test]
fn a_stale_link_is_replaced_but_a_regular_file_is_never_clobbered() {
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join("korad");
    std::os::unix::fs::symlink("/dev/pts/does-not-exist", &stale).unwrap();
    let psu = KoradSim::start(KoradConfig::default(), Some(&stale)).unwrap();
    assert_eq!(std::fs::read_link(&stale).unwrap(), psu.pty_path());

    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "keep me").unwrap();
    let err = KoradSim::start(KoradConfig::default(), Some(&file)).unwrap_err();
    assert!(matches!(err, DevSimError::LinkOccupied { .. }), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}
