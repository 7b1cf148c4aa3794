//! A serial console unplugged while a `read` waits on it, and plugged back.
//!
//! This is its own test binary with a single test so the CPU time of the
//! process measured while the device is gone is the driver's (plus the one
//! simulator thread), not other tests'.

use std::path::Path;
use std::time::{Duration, Instant};

use edge_agent::devsim::dut_console::{DutConsoleConfig, DutConsoleSim, DutPower};
use edge_agent::drivers::{build, ActionRequest, CancelToken, Driver, DriverError, DriverSpec};
use serde_json::{json, Value};
use shared_protocol::capability::{CapabilityAction, CapabilityType, HealthStatus};

/// User + system CPU time this process has used so far.
fn process_cpu() -> Duration {
    // SAFETY: `getrusage` only writes into the zeroed struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(rc, 0, "getrusage failed");
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn request(action: CapabilityAction, params: Value) -> ActionRequest {
    ActionRequest {
        session_id: "sess-unplug".into(),
        action,
        params: params.as_object().cloned().unwrap_or_default(),
        deadline: Instant::now() + Duration::from_secs(30),
        cancel: CancelToken::new(),
    }
}

fn serial_driver(path: &Path) -> Box<dyn Driver> {
    build(&DriverSpec {
        capability_id: "dut-console".into(),
        capability_type: CapabilityType::SerialPort,
        backend: "serialport".into(),
        settings: json!({ "port": path.to_string_lossy() })
            .as_object()
            .cloned()
            .unwrap_or_default(),
        state_dir: std::env::temp_dir(),
    })
    .expect("build")
}

#[test]
fn an_unplugged_console_turns_unhealthy_within_a_second_stays_idle_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("usb-FTDI_FT232R_USB_UART_DUT0-if00-port0");
    let mut console = DutConsoleSim::start(
        DutConsoleConfig {
            power: DutPower::Manual,
            pace: 0.1,
            ..DutConsoleConfig::default()
        },
        Some(&link),
    )
    .unwrap();
    let mut d = serial_driver(&link);
    d.execute(&request(CapabilityAction::Open, json!({})))
        .expect("open");
    assert_eq!(d.health().status, HealthStatus::Healthy);

    // A read is waiting (10 s timeout) when the cable is pulled.
    let reader = std::thread::spawn(move || {
        let r = d.execute(&request(
            CapabilityAction::Read,
            json!({ "timeout_ms": 10_000 }),
        ));
        (d, r, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(300));
    console.vanish().unwrap();
    let pulled = Instant::now();
    let (mut d, read, returned) = reader.join().unwrap();
    match read {
        Err(DriverError::Unavailable(why)) => assert!(why.contains("vanished"), "{why}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let noticed = returned.saturating_duration_since(pulled);
    assert!(
        noticed < Duration::from_secs(1),
        "read returned {noticed:?} after the unplug"
    );
    let h = d.health();
    assert_eq!(h.status, HealthStatus::Unhealthy);
    println!(
        "unplugged: read returned after {noticed:?}; health: {:?}",
        h.message
    );

    // Two seconds unplugged, with heartbeats: the process must stay idle.
    let cpu_before = process_cpu();
    let wall_before = Instant::now();
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(d.health().status, HealthStatus::Unhealthy);
    }
    let cpu = process_cpu() - cpu_before;
    let wall = wall_before.elapsed();
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    println!(
        "unplugged for {wall:?}: {cpu:?} CPU ({:.2} % of one core)",
        share * 100.0
    );
    assert!(share < 0.05, "{:.1} % CPU while unplugged", share * 100.0);
    assert!(matches!(
        d.execute(&request(
            CapabilityAction::Read,
            json!({ "timeout_ms": 100 })
        )),
        Err(DriverError::Unavailable(_))
    ));

    // Plugged back in at the same path (a new pty behind it): reopened.
    console.reappear().unwrap();
    let replugged = Instant::now();
    let mut healthy = false;
    while replugged.elapsed() < Duration::from_secs(3) {
        if d.health().status == HealthStatus::Healthy {
            healthy = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(healthy, "not reopened within 3 s");
    println!("reopened {:?} after the replug", replugged.elapsed());
    d.execute(&request(CapabilityAction::Open, json!({})))
        .expect("open");
    console.handle().set_power(true);
    let m = d
        .execute(&request(
            CapabilityAction::ExpectPattern,
            json!({ "pattern": "DUT v0.9.2 ready", "timeout_ms": 3000 }),
        ))
        .expect("the reopened port carries the boot log");
    assert_eq!(m.result_summary["matched"], json!(true));
}
