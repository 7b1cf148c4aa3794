//! The Rigol DP800-type SCPI PSU simulator, driven through its pty.

mod devsim_support;

use std::time::Duration;

use devsim_support::{open, query, read_reply, send};
use edge_agent::devsim::scpi_psu::{ScpiPsuConfig, ScpiPsuSim};

const REPLY: Duration = Duration::from_millis(200);

#[test]
fn idn_query_identifies_a_dp832_with_a_newline_terminated_reply() {
    let psu = ScpiPsuSim::start(ScpiPsuConfig::default(), None).unwrap();
    let mut port = open(psu.path());
    assert_eq!(
        query(port.as_mut(), "*IDN?\n", REPLY),
        "RIGOL TECHNOLOGIES,DP832,DP8C000000001,00.01.16\n"
    );
}

#[test]
fn voltage_set_on_the_selected_channel_reads_back_there_only() {
    let psu = ScpiPsuSim::start(ScpiPsuConfig::default(), None).unwrap();
    let mut port = open(psu.path());
    send(port.as_mut(), b":INST CH2\n:VOLT 12.5\n:CURR 0.25\r\n");
    assert_eq!(query(port.as_mut(), ":VOLT?\n", REPLY), "12.500\n");
    assert_eq!(query(port.as_mut(), ":inst:nsel?\n", REPLY), "2\n");
    assert_eq!(
        query(port.as_mut(), ":INSTrument CH1;:VOLTage?\n", REPLY),
        "0.000\n"
    );
    let st = psu.handle().snapshot();
    assert_eq!((st.channels[1].vset_v, st.channels[1].iset_a), (12.5, 0.25));
    assert_eq!(st.channels[0].vset_v, 0.0);
}

#[test]
fn apply_and_output_on_give_measured_values_from_the_load() {
    let psu = ScpiPsuSim::start(ScpiPsuConfig::default(), None).unwrap();
    let mut port = open(psu.path());
    send(port.as_mut(), b":APPL CH1,5,1\n");
    assert_eq!(
        query(port.as_mut(), ":APPL? CH1\n", REPLY),
        "CH1:30V/3A,5.000,1.000\n"
    );
    assert_eq!(query(port.as_mut(), ":OUTP? CH1\n", REPLY), "OFF\n");
    assert_eq!(query(port.as_mut(), ":MEAS:VOLT? CH1\n", REPLY), "0.0000\n");
    send(port.as_mut(), b":OUTP CH1,ON\n");
    assert_eq!(query(port.as_mut(), ":OUTP? CH1\n", REPLY), "ON\n");
    // 5 V into the default 100 Ω load.
    assert_eq!(query(port.as_mut(), ":MEAS:VOLT? CH1\n", REPLY), "5.0000\n");
    assert_eq!(query(port.as_mut(), ":MEAS:CURR? CH1\n", REPLY), "0.0500\n");
    assert_eq!(
        query(port.as_mut(), ":MEAS:ALL? CH1\n", REPLY),
        "5.0000,0.0500,0.2500\n"
    );
    send(port.as_mut(), b":OUTP CH1,OFF\n");
    assert_eq!(query(port.as_mut(), ":MEAS:CURR? CH1\n", REPLY), "0.0000\n");
}

#[test]
fn errors_queue_up_and_are_read_oldest_first_by_syst_err() {
    let psu = ScpiPsuSim::start(ScpiPsuConfig::default(), None).unwrap();
    let mut port = open(psu.path());
    assert_eq!(
        query(port.as_mut(), ":SYST:ERR?\n", REPLY),
        "0,\"No error\"\n"
    );
    send(port.as_mut(), b":FOO 1\n:VOLT 99\n:OUTP CH7,ON\n");
    // Commands in error get no reply at all.
    assert!(read_reply(port.as_mut(), Duration::from_millis(60)).is_empty());
    assert_eq!(
        query(port.as_mut(), ":SYST:ERR?\n", REPLY),
        "-113,\"Undefined header\"\n"
    );
    assert_eq!(
        query(port.as_mut(), ":SYST:ERR?\n", REPLY),
        "-222,\"Data out of range\"\n"
    );
    assert_eq!(
        query(port.as_mut(), ":SYST:ERR?\n", REPLY),
        "-224,\"Illegal parameter value\"\n"
    );
    assert_eq!(
        query(port.as_mut(), ":SYST:ERR?\n", REPLY),
        "0,\"No error\"\n"
    );
    let st = psu.handle().snapshot();
    assert!(st.channels.iter().all(|c| c.vset_v == 0.0 && !c.output_on));
}
