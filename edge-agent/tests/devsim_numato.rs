//! The Numato relay module simulator, driven with its ASCII commands.

mod devsim_support;

use std::time::Duration;

use devsim_support::{open, query, read_until, send};
use edge_agent::devsim::numato::{NumatoConfig, NumatoSim};

const REPLY: Duration = Duration::from_millis(200);

#[test]
fn relay_on_is_echoed_and_read_back_with_the_prompt() {
    let module = NumatoSim::start(NumatoConfig::default(), None).unwrap();
    let mut port = open(module.path());
    assert_eq!(
        query(port.as_mut(), "relay on 0\r", REPLY),
        "relay on 0\n\r>"
    );
    assert_eq!(
        query(port.as_mut(), "relay read 0\r", REPLY),
        "relay read 0\n\ron\n\r>"
    );
    assert_eq!(
        query(port.as_mut(), "relay read 1\r", REPLY),
        "relay read 1\n\roff\n\r>"
    );
    assert!(module.handle().relay(0));
    send(port.as_mut(), b"relay off 0\r");
    read_until(port.as_mut(), ">", REPLY);
    assert!(!module.handle().relay(0));
    let st = module.handle().snapshot();
    let log: Vec<(u8, bool)> = st.switches.iter().map(|s| (s.channel, s.on)).collect();
    assert_eq!(log, [(0, true), (0, false)]);
}

#[test]
fn ver_reports_the_firmware_version() {
    let module = NumatoSim::start(NumatoConfig::default(), None).unwrap();
    let mut port = open(module.path());
    assert_eq!(query(port.as_mut(), "ver\r", REPLY), "ver\n\r00000008\n\r>");
}

#[test]
fn relays_beyond_the_module_size_are_refused_with_just_a_prompt() {
    let module = NumatoSim::start(
        NumatoConfig {
            channels: 4,
            ..NumatoConfig::default()
        },
        None,
    )
    .unwrap();
    let mut port = open(module.path());
    assert_eq!(
        query(port.as_mut(), "relay on 4\r", REPLY),
        "relay on 4\n\r>"
    );
    assert_eq!(
        query(port.as_mut(), "relay on 3\r", REPLY),
        "relay on 3\n\r>"
    );
    assert_eq!(
        query(port.as_mut(), "relay readall\r", REPLY),
        "relay readall\n\r08\n\r>"
    );
    assert_eq!(
        module.handle().snapshot().relays,
        [false, false, false, true]
    );
}

#[test]
fn sixteen_relay_modules_number_relays_ten_and_up_with_letters() {
    let module = NumatoSim::start(
        NumatoConfig {
            channels: 16,
            ..NumatoConfig::default()
        },
        None,
    )
    .unwrap();
    let mut port = open(module.path());
    send(port.as_mut(), b"relay on A\r");
    read_until(port.as_mut(), ">", REPLY);
    assert_eq!(
        query(port.as_mut(), "relay readall\r", REPLY),
        "relay readall\n\r0400\n\r>"
    );
    assert!(module.handle().relay(10));
}
