//! The LCUS relay board simulator, driven with its binary frames.

mod devsim_support;

use std::time::Duration;

use devsim_support::{open, read_reply, send, wait_until};
use edge_agent::devsim::lcus::{frame, LcusConfig, LcusSim};

#[test]
fn a_valid_frame_switches_the_relay_without_any_reply() {
    let board = LcusSim::start(LcusConfig::default(), None).unwrap();
    let mut port = open(board.path());
    send(port.as_mut(), &[0xA0, 0x02, 0x01, 0xA3]);
    assert!(read_reply(port.as_mut(), Duration::from_millis(50)).is_empty());
    assert!(wait_until(Duration::from_millis(500), || board
        .handle()
        .relay(2)));
    assert!(!board.handle().relay(1));
    send(port.as_mut(), &frame(2, false));
    assert!(wait_until(Duration::from_millis(500), || !board
        .handle()
        .relay(2)));
}

#[test]
fn frames_with_bad_checksum_or_channel_are_ignored() {
    let board = LcusSim::start(
        LcusConfig {
            channels: 2,
            ..LcusConfig::default()
        },
        None,
    )
    .unwrap();
    let mut port = open(board.path());
    send(port.as_mut(), &[0xA0, 0x01, 0x01, 0xA3]); // sum should be A2
    send(port.as_mut(), &frame(3, true)); // a 2-relay board has no relay 3
    send(port.as_mut(), &[0xA0, 0x01, 0x02, 0xA3]); // op 02 unknown
    assert!(wait_until(Duration::from_millis(500), || {
        board.handle().snapshot().ignored_frames.len() == 3
    }));
    let st = board.handle().snapshot();
    assert_eq!(st.relays, [false, false]);
    assert!(st.switches.is_empty());
    assert_eq!(st.ignored_frames[0], [0xA0, 0x01, 0x01, 0xA3]);
}

#[test]
fn status_query_lists_every_relay_on_a_multi_channel_board() {
    let board = LcusSim::start(
        LcusConfig {
            channels: 4,
            ..LcusConfig::default()
        },
        None,
    )
    .unwrap();
    let mut port = open(board.path());
    send(port.as_mut(), &frame(2, true));
    send(port.as_mut(), &frame(4, true));
    send(port.as_mut(), &[0xFF]);
    let reply = String::from_utf8(read_reply(port.as_mut(), Duration::from_millis(200))).unwrap();
    assert_eq!(reply, "CH1:OFF\r\nCH2:ON\r\nCH3:OFF\r\nCH4:ON\r\n");
}

#[test]
fn a_single_relay_board_does_not_answer_the_status_query() {
    let board = LcusSim::start(
        LcusConfig {
            channels: 1,
            ..LcusConfig::default()
        },
        None,
    )
    .unwrap();
    let mut port = open(board.path());
    send(port.as_mut(), &[0xFF]);
    assert!(read_reply(port.as_mut(), Duration::from_millis(100)).is_empty());
}

#[test]
fn a_timed_pulse_is_logged_with_its_length() {
    let board = LcusSim::start(LcusConfig::default(), None).unwrap();
    let mut port = open(board.path());
    send(port.as_mut(), &frame(1, true));
    std::thread::sleep(Duration::from_millis(200));
    send(port.as_mut(), &frame(1, false));
    assert!(wait_until(Duration::from_millis(500), || {
        board.handle().snapshot().switches.len() == 2
    }));
    let pulse = board.handle().snapshot().last_pulse(1).unwrap();
    // The log carries the simulator's receive times, so thread scheduling
    // on a busy machine adds some jitter either way.
    assert!(pulse >= Duration::from_millis(120), "{pulse:?}");
    assert!(pulse < Duration::from_millis(600), "{pulse:?}");
}

#[test]
fn an_incomplete_frame_is_dropped_after_the_frame_timeout() {
    let board = LcusSim::start(LcusConfig::default(), None).unwrap();
    let mut port = open(board.path());
    send(port.as_mut(), &[0xA0, 0x01]);
    std::thread::sleep(Duration::from_millis(150));
    // Had the partial frame survived, this would complete it as A0 01 A0 01.
    send(port.as_mut(), &frame(1, true));
    assert!(wait_until(Duration::from_millis(500), || board
        .handle()
        .relay(1)));
    assert_eq!(board.handle().snapshot().ignored_frames, [vec![0xA0, 0x01]]);
}
