//! The DUT serial console simulator, powered manually or from the Korad PSU.

mod devsim_support;

use std::time::Duration;

use devsim_support::{open, query, read_for, read_until, send, wait_until};
use edge_agent::devsim::dut_console::{DutConsoleConfig, DutConsoleSim, DutPhase, DutPower};
use edge_agent::devsim::korad::{KoradConfig, KoradSim};

const BOOT: Duration = Duration::from_millis(1500);
const REPLY: Duration = Duration::from_millis(300);

fn quick(power: DutPower) -> DutConsoleConfig {
    DutConsoleConfig {
        pace: 0.2,
        power,
        ..DutConsoleConfig::default()
    }
}

#[test]
fn the_dut_boots_only_once_the_psu_output_is_on_above_threshold() {
    let psu = KoradSim::start(KoradConfig::default(), None).unwrap();
    let dut = DutConsoleSim::start(
        quick(DutPower::Sense {
            sense: psu.handle().power_sense(),
            threshold_v: 3.0,
        }),
        None,
    )
    .unwrap();
    let mut console = open(dut.path());
    let mut psu_port = open(psu.path());

    send(psu_port.as_mut(), b"VSET1:02.00");
    send(psu_port.as_mut(), b"OUT1");
    assert!(wait_until(REPLY, || psu.handle().snapshot().output_on));
    assert!(
        read_for(console.as_mut(), Duration::from_millis(100)).is_empty(),
        "2 V is too low"
    );
    assert_eq!(dut.handle().snapshot().phase, DutPhase::Off);

    send(psu_port.as_mut(), b"VSET1:05.00");
    let log = read_until(console.as_mut(), "benchlink-dut login: ", BOOT);
    let order = [
        "U-Boot SPL",
        "Starting kernel ...",
        "Booting Linux",
        "Benchlink DUT v0.9.2 ready",
    ];
    let found: Vec<usize> = order.iter().map(|s| log.find(s).unwrap()).collect();
    assert!(found.windows(2).all(|w| w[0] < w[1]), "{log}");
    let lines: Vec<&str> = log.split('\n').collect();
    assert!(
        lines[..lines.len() - 1].iter().all(|l| l.ends_with('\r')),
        "CRLF line ends"
    );
    assert_eq!(dut.handle().snapshot().phase, DutPhase::Login);
}

#[test]
fn the_console_goes_silent_when_the_psu_turns_off_and_reboots_when_on_again() {
    let psu = KoradSim::start(KoradConfig::default(), None).unwrap();
    let dut = DutConsoleSim::start(
        quick(DutPower::Sense {
            sense: psu.handle().power_sense(),
            threshold_v: 3.0,
        }),
        None,
    )
    .unwrap();
    let mut console = open(dut.path());
    let mut psu_port = open(psu.path());
    send(psu_port.as_mut(), b"VSET1:05.00");
    send(psu_port.as_mut(), b"OUT1");
    // Cut power in the middle of the boot log.
    read_until(console.as_mut(), "Starting kernel", BOOT);
    send(psu_port.as_mut(), b"OUT0");
    assert!(wait_until(REPLY, || dut.handle().snapshot().phase == DutPhase::Off));
    // Drain lines that were on the wire before the cut, then expect silence.
    read_for(console.as_mut(), Duration::from_millis(30));
    let printed = dut.handle().snapshot().printed.len();
    assert!(read_for(console.as_mut(), Duration::from_millis(200)).is_empty());
    assert_eq!(dut.handle().snapshot().printed.len(), printed);

    send(psu_port.as_mut(), b"OUT1");
    let log = read_until(console.as_mut(), "login: ", BOOT);
    assert!(log.contains("U-Boot SPL"), "a fresh boot: {log}");
    assert_eq!(dut.handle().snapshot().boots, 2);
}

#[test]
fn after_login_the_shell_answers_uname_and_version() {
    let dut = DutConsoleSim::start(
        DutConsoleConfig {
            baud: 57_600,
            ..quick(DutPower::Manual)
        },
        None,
    )
    .unwrap();
    let mut console = open(dut.path());
    dut.handle().set_power(true);
    read_until(console.as_mut(), "login: ", BOOT);
    assert_eq!(
        query(console.as_mut(), "root\r", REPLY),
        "root\r\nroot@benchlink-dut:~# "
    );
    let uname = query(console.as_mut(), "uname -a\r", REPLY);
    assert!(
        uname.starts_with("uname -a\r\nLinux benchlink-dut 5.15.92-benchlink #1 SMP"),
        "{uname:?}"
    );
    assert_eq!(
        query(console.as_mut(), "cat /etc/version\r\n", REPLY),
        "cat /etc/version\r\n0.9.2\r\nroot@benchlink-dut:~# "
    );
    assert_eq!(
        query(console.as_mut(), "fw_update\r", REPLY),
        "fw_update\r\n-sh: fw_update: not found\r\nroot@benchlink-dut:~# "
    );
    let st = dut.handle().snapshot();
    assert_eq!(st.baud, 57_600);
    assert_eq!(st.commands.len(), 3);
}

#[test]
fn a_boot_log_printed_while_nobody_listens_is_lost() {
    let dut = DutConsoleSim::start(quick(DutPower::Manual), None).unwrap();
    dut.handle().set_power(true);
    assert!(wait_until(BOOT, || dut.handle().snapshot().phase == DutPhase::Login));
    let mut console = open(dut.path());
    assert!(read_for(console.as_mut(), Duration::from_millis(100)).is_empty());
    assert_eq!(
        query(console.as_mut(), "\r", REPLY),
        "\r\nbenchlink-dut login: "
    );
    assert!(
        dut.handle().snapshot().printed.len() > 30,
        "the log was printed"
    );
}
