//! A whole simulated lab in a temporary directory, made of the real
//! binaries: `bench-sim` (Korad PSU, LCUS relay, GRBL thumb robot and a DUT
//! console powered from the Korad output, on pseudo-terminals),
//! `cloud-registry serve` (embedded broker on a free port, or an external
//! broker) and `edge-agent run` with a generated bench TOML: simulated
//! camera, microphone, speaker and screen capture plus the real `korad`,
//! `lcus`, `grbl` and `serialport` drivers on the simulator's ptys. The
//! registry and the edge come from the workspace's target dir, or from
//! [`LabOptions::bin_dir`] (an older build, for before/after benchmarks).
//!
//! Every process is a [`Proc`]: killed when the [`Lab`] is dropped (also on
//! a panic), and, on Linux, killed by the kernel if the process that
//! started it dies (`PR_SET_PDEATHSIG`), so nothing outlives a demo or a
//! test even after a `kill -9`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use tempfile::TempDir;

use crate::{free_port, workspace_bin, Proc};

/// The bench's provider id.
pub const PROVIDER_ID: &str = "provider-demo-01";
/// The first audit agent (hardware audit, priority 75).
pub const HW_AGENT: &str = "audit:hw-auditor-01";
/// The second audit agent (chief audit, priority 80).
pub const CHIEF_AGENT: &str = "audit:chief-auditor-01";
/// Boot banner of the simulated DUT.
pub const DUT_BANNER: &str = "Benchlink DUT v0.9.2 ready";

/// Capability ids of the generated bench TOML.
pub mod caps {
    pub const CAMERA: &str = "cam-front-01";
    pub const MICROPHONE: &str = "mic-01";
    pub const SPEAKER: &str = "spk-01";
    pub const SCREEN: &str = "screen-01";
    pub const PSU: &str = "psu-korad-01";
    pub const RELAY: &str = "relay-lcus-01";
    pub const ROBOT: &str = "thumb-robot-01";
    pub const CONSOLE: &str = "dut-console-01";
    /// All eight.
    pub const ALL: [&str; 8] = [
        CAMERA, MICROPHONE, SPEAKER, SCREEN, PSU, RELAY, ROBOT, CONSOLE,
    ];
}

/// Which MQTT broker the registry and the edge use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broker {
    /// The registry's embedded broker, on a free port.
    Embedded,
    /// An external broker (Mosquitto) at `host:port`.
    External { host: String, port: u16 },
}

/// TLS for the whole lab (docs/install-registry.md "TLS"): the registry
/// serves HTTPS and, on the embedded broker, MQTT over TLS with this
/// certificate; on an external broker it connects with `mqtt.tls = true`
/// trusting `ca_file`; the edge uses `mqtt_tls = true`, an `https://`
/// `base_url` and `ca_file`.
#[derive(Debug, Clone)]
pub struct LabTls {
    /// PEM certificate of the registry (and embedded broker) for
    /// 127.0.0.1.
    pub cert_file: PathBuf,
    /// Its PEM private key.
    pub key_file: PathBuf,
    /// PEM certificate of the CA that signed it.
    pub ca_file: PathBuf,
}

/// How to build the lab.
#[derive(Debug, Clone)]
pub struct LabOptions {
    pub broker: Broker,
    /// MQTT topic prefix (unique per run on a shared broker).
    pub topic_prefix: String,
    /// Grace period of a preempted lease, seconds.
    pub grace_period_seconds: u32,
    /// Heartbeat interval the registry asks providers for, seconds (a
    /// short one reports non-interruptible windows promptly).
    pub heartbeat_interval_seconds: u32,
    /// Heartbeats missed before a provider counts as offline.
    pub offline_after_missed: u32,
    /// Keep the directory (logs, databases, configs) after the lab stops
    /// (default: when `BENCHLINK_KEEP_LAB` is set).
    pub keep: bool,
    /// Where to put the directory (default: the system temp dir).
    pub parent_dir: Option<PathBuf>,
    /// Extra simulated speakers `spk-bench-01`… (for load tests: one
    /// capability, hence one runner thread, per concurrent caller).
    pub extra_speakers: usize,
    /// The outbox's `durability` (`fsync` when `None`).
    pub outbox_durability: Option<String>,
    /// The registry's `sessions.result_grace_ms` (its default when `None`).
    pub result_grace_ms: Option<u64>,
    /// The registry's `heartbeat.conflict_clear_seconds` (its default when
    /// `None`).
    pub conflict_clear_seconds: Option<u32>,
    /// Extra environment of the edge daemon (e.g. libfaketime's, to run
    /// its clock off).
    pub edge_env: Vec<(String, String)>,
    /// Extra environment variables of the `cloud-registry serve` process
    /// (e.g. `LD_PRELOAD` of libfaketime, to step its wall clock).
    pub registry_env: Vec<(String, String)>,
    /// Run `cloud-registry` (also its `token create`) and `edge-agent`
    /// from this directory instead of the workspace's target dir, e.g. an
    /// older build to compare against. `bench-sim` always comes from the
    /// workspace: it is not under test, and the lab passes it flags older
    /// builds may lack.
    pub bin_dir: Option<PathBuf>,
    /// Port on 127.0.0.1 the edge sends its HTTP requests to instead of
    /// the registry's (a proxy of the test's in between); `None`: the
    /// registry's own port.
    pub edge_http_port: Option<u16>,
    /// The edge's `state_dir` (outbox database and files), e.g. on a small
    /// file system the test mounted; `None`: `edge/state` in the lab.
    pub edge_state_dir: Option<PathBuf>,
    /// Directory of the registry's store (its SQLite file, WAL and
    /// artifacts), e.g. a small file system a test fills (default:
    /// `registry/` in the lab directory).
    pub registry_store_dir: Option<PathBuf>,
    /// Run this edge TOML (e.g. the shipped `config/edge-agent.sim.toml`)
    /// instead of the generated bench: its capabilities exactly as
    /// written, with only the lab's provider id, state dir and registry
    /// connection put in (see [`adapt_edge_config`]). It must declare
    /// eight capabilities, like the generated bench.
    pub edge_config_template: Option<PathBuf>,
    /// TOML appended to the registry's configuration (e.g. `[policy]`
    /// tables).
    pub registry_extra_toml: String,
    /// Further lines of the registry's `[store]` table (after `path`),
    /// e.g. `backend = "postgres"` with its `url` and `schema`.
    pub registry_store_toml: String,
    /// Keys put into a capability's table of the generated bench, as
    /// (capability id, TOML lines), e.g. `(caps::PSU, "constraints = {
    /// max_voltage_v = 6.0 }")`.
    pub capability_keys: Vec<(String, String)>,
    /// Further `[[capabilities]]` entries appended to the bench TOML (one
    /// complete entry each, driver table included); the lab waits for
    /// them to register too.
    pub extra_capabilities: Vec<String>,
    /// Serve the edge's `[metrics]` listener on a free port
    /// ([`Lab::edge_metrics_url`]); off by default, so that several edges
    /// of one lab (a copied bench) never fight over a port.
    pub edge_metrics: bool,
    /// HTTPS and MQTT over TLS everywhere; `None`: plain.
    pub tls: Option<LabTls>,
}

impl Default for LabOptions {
    fn default() -> Self {
        Self {
            broker: Broker::Embedded,
            topic_prefix: shared_protocol::mqtt::DEFAULT_TOPIC_PREFIX.to_string(),
            grace_period_seconds: 3,
            heartbeat_interval_seconds: 1,
            offline_after_missed: 5,
            // For looking at a failed test's logs and databases.
            keep: std::env::var_os("BENCHLINK_KEEP_LAB").is_some(),
            parent_dir: None,
            extra_speakers: 0,
            outbox_durability: None,
            result_grace_ms: None,
            conflict_clear_seconds: None,
            edge_env: Vec::new(),
            registry_env: Vec::new(),
            bin_dir: None,
            capability_keys: Vec::new(),
            extra_capabilities: Vec::new(),
            edge_http_port: None,
            edge_state_dir: None,
            registry_store_dir: None,
            edge_config_template: None,
            registry_extra_toml: String::new(),
            registry_store_toml: String::new(),
            edge_metrics: false,
            tls: None,
        }
    }
}

/// A `Command` for a workspace binary whose stderr goes to `log` and which
/// dies with the thread that starts it (Linux `PR_SET_PDEATHSIG`).
pub fn child_command(bin: &str, log: &Path) -> Result<Command> {
    program_command(&workspace_bin(bin), log)
}

/// [`child_command`] for any program (e.g. `mosquitto`).
pub fn program_command(program: &Path, log: &Path) -> Result<Command> {
    let mut cmd = Command::new(program);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("open log {}", log.display()))?;
    cmd.stderr(Stdio::from(file)).env("NO_COLOR", "1");
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe; nothing else runs between
        // fork and exec here.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    Ok(cmd)
}

/// `text` with its `replica_id = "…"` line naming `replica_id` instead.
fn with_replica_id(text: &str, replica_id: &str) -> String {
    text.lines()
        .map(|l| {
            if l.trim_start().starts_with("replica_id") {
                format!("replica_id = \"{replica_id}\"")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Path of the lab's binary `name` (`cloud-registry`, `edge-agent`): in
/// `bin_dir` when set, else the workspace's target dir.
///
/// Errors: `bin_dir` is set and holds no file `name`.
fn lab_bin(bin_dir: Option<&Path>, name: &str) -> Result<PathBuf> {
    match bin_dir {
        None => Ok(workspace_bin(name)),
        Some(dir) => {
            let path = dir.join(name);
            if !path.is_file() {
                bail!("{} is missing (LabOptions.bin_dir)", path.display());
            }
            Ok(path)
        }
    }
}

/// The running lab. Dropping it kills every process and removes the
/// directory (unless `keep`).
pub struct Lab {
    pub opts: LabOptions,
    /// The lab directory (configs, databases, outbox, logs).
    pub root: PathBuf,
    dir: Option<TempDir>,
    pub sim: Proc,
    pub registry: Option<Proc>,
    pub edge: Option<Proc>,
    /// `http://127.0.0.1:{port}` (`https://` with [`LabOptions::tls`]).
    pub base_url: String,
    pub http_port: u16,
    /// The port the edge connects to.
    pub mqtt_port: u16,
    pub admin_token: String,
    pub provider_token: String,
    /// Tokens of [`HW_AGENT`] and [`CHIEF_AGENT`].
    pub hw_token: String,
    pub chief_token: String,
    /// Simulator name → stable path of its pty (`korad`, `lcus`, `grbl`,
    /// `dut_console`).
    pub devices: BTreeMap<String, String>,
    /// The registry's SQLite file.
    pub store_path: PathBuf,
    /// The edge's `[metrics] listen` port, when [`LabOptions::edge_metrics`].
    pub edge_metrics_port: Option<u16>,
    registry_config: PathBuf,
    edge_config: PathBuf,
}

fn read_token(path: &Path) -> Result<String> {
    Ok(crate::read_to_string(path)?.trim().to_string())
}

impl Lab {
    /// Build and start everything, and wait until the provider and its 8
    /// capabilities are registered and online.
    ///
    /// Errors: a binary is missing or does not become ready in time; the
    /// message names which and where its log is.
    pub async fn start(opts: LabOptions) -> Result<Lab> {
        let dir = match &opts.parent_dir {
            Some(p) => tempfile::Builder::new()
                .prefix("benchlink-lab-")
                .tempdir_in(p)?,
            None => tempfile::Builder::new()
                .prefix("benchlink-lab-")
                .tempdir()?,
        };
        let root = dir.path().to_path_buf();
        for d in ["logs", "registry", "edge", "sim"] {
            std::fs::create_dir_all(root.join(d))?;
        }
        let logs = root.join("logs");

        // Device simulators on ptys.
        let mut cmd = child_command("bench-sim", &logs.join("bench-sim.log"))?;
        cmd.args([
            "--json",
            "--korad",
            "--lcus",
            "4",
            "--grbl",
            "--grbl-no-homing",
        ])
        .args([
            "--grbl-time-scale",
            "4",
            "--dut-console",
            "--link-dut-to-korad",
        ])
        .arg("--journal")
        .arg(root.join("sim/journal.jsonl"))
        .arg("--dir")
        .arg(root.join("sim"));
        let (sim, devices_line) =
            Proc::start_until("bench-sim", cmd, Duration::from_secs(15), |v| {
                v.get("devices").is_some()
            })?;
        let mut devices = BTreeMap::new();
        for d in devices_line["devices"].as_array().into_iter().flatten() {
            if let (Some(n), Some(p)) = (d["name"].as_str(), d["path"].as_str()) {
                devices.insert(n.to_string(), p.to_string());
            }
        }
        for need in ["korad", "lcus", "grbl", "dut_console"] {
            if !devices.contains_key(need) {
                bail!("bench-sim did not start `{need}`: {devices_line}");
            }
        }

        // Registry config and tokens (created before it starts).
        let http_port = free_port();
        let (mqtt_host, mqtt_port, mut mqtt_section) = match &opts.broker {
            Broker::Embedded => {
                let port = free_port();
                (
                    "127.0.0.1".to_string(),
                    port,
                    format!("mode = \"embedded\"\nlisten = \"127.0.0.1:{port}\"\n"),
                )
            }
            Broker::External { host, port } => (
                host.clone(),
                *port,
                format!(
                    "mode = \"external\"\nhost = \"{host}\"\nport = {port}\nclient_id = \"benchlink-registry-{}\"\n",
                    uuid_like()
                ),
            ),
        };
        let mut http_tls = String::new();
        if let Some(tls) = &opts.tls {
            http_tls = format!(
                "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
                tls.cert_file.display(),
                tls.key_file.display()
            );
            mqtt_section.push_str(&match opts.broker {
                Broker::Embedded => http_tls.clone(),
                Broker::External { .. } => {
                    format!("tls = true\nca_file = \"{}\"\n", tls.ca_file.display())
                }
            });
        }
        let registry_config = root.join("registry/cloud-registry.toml");
        let store_path = opts
            .registry_store_dir
            .clone()
            .unwrap_or_else(|| root.join("registry"))
            .join("registry.sqlite3");
        std::fs::write(
            &registry_config,
            format!(
                "[http]\nlisten = \"127.0.0.1:{http_port}\"\n{http_tls}\n\
                 [store]\npath = \"{store}\"\n{store_extra}\n\
                 [auth]\nbootstrap_admin_token_file = \"{admin}\"\n\n\
                 [mqtt]\n{mqtt_section}topic_prefix = \"{prefix}\"\nkeep_alive_seconds = 5\n\n\
                 [leases]\ndefault_grace_period_seconds = {grace}\nsweep_interval_ms = 100\n\n\
                 [heartbeat]\ninterval_seconds = {hb}\noffline_after_missed = {missed}\n{clear}\n\
                 [sessions]\n{result_grace}\n{extra}",
                store = store_path.display(),
                store_extra = opts.registry_store_toml,
                admin = root.join("registry/admin.token").display(),
                prefix = opts.topic_prefix,
                grace = opts.grace_period_seconds,
                hb = opts.heartbeat_interval_seconds,
                missed = opts.offline_after_missed,
                clear = opts
                    .conflict_clear_seconds
                    .map(|s| format!("conflict_clear_seconds = {s}\n"))
                    .unwrap_or_default(),
                result_grace = opts
                    .result_grace_ms
                    .map(|ms| format!("result_grace_ms = {ms}\n"))
                    .unwrap_or_default(),
                extra = opts.registry_extra_toml,
            ),
        )?;
        let registry_bin = lab_bin(opts.bin_dir.as_deref(), "cloud-registry")?;
        let token = |role: &str, name: &str| -> Result<String> {
            let create = |create_store: bool| {
                let mut cmd = Command::new(&registry_bin);
                cmd.args(["token", "create", "--config"])
                    .arg(&registry_config)
                    .args(["--role", role, "--name", name]);
                // The registry has not run yet: the tokens make its store,
                // which its first start then finds.
                if create_store {
                    cmd.arg("--create-store");
                }
                cmd.output().context("run cloud-registry token create")
            };
            let mut out = create(true)?;
            // An older build (`bin_dir`) has no such flag and creates
            // the store unasked.
            if String::from_utf8_lossy(&out.stderr).contains("unexpected argument '--create-store'")
            {
                out = create(false)?;
            }
            if !out.status.success() {
                bail!(
                    "cloud-registry token create --role {role} --name {name}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        };
        let provider_token = token("provider", PROVIDER_ID)?;
        let hw_token = token("audit_agent", HW_AGENT)?;
        let chief_token = token("audit_agent", CHIEF_AGENT)?;

        // Bench TOML.
        let edge_config = root.join("edge/edge-agent.toml");
        let edge_state = opts
            .edge_state_dir
            .clone()
            .unwrap_or_else(|| root.join("edge/state"));
        let edge_http_port = opts.edge_http_port.unwrap_or(http_port);
        let mut toml = match &opts.edge_config_template {
            Some(template) => adapt_edge_config(
                &crate::read_to_string(template)?,
                &edge_state,
                &mqtt_host,
                mqtt_port,
                &opts.topic_prefix,
                edge_http_port,
                &provider_token,
            ),
            None => edge_toml(
                &edge_state,
                &mqtt_host,
                mqtt_port,
                &opts.topic_prefix,
                edge_http_port,
                &provider_token,
                &devices,
            ),
        };
        if let Some(tls) = &opts.tls {
            toml = toml.replace(
                "base_url = \"http://",
                &format!(
                    "mqtt_tls = true\nca_file = \"{}\"\nbase_url = \"https://",
                    tls.ca_file.display()
                ),
            );
        }
        if let Some(d) = &opts.outbox_durability {
            toml = toml.replace("[outbox]\n", &format!("[outbox]\ndurability = \"{d}\"\n"));
        }
        for (id, keys) in &opts.capability_keys {
            let line = format!("id = \"{id}\"\n");
            if !toml.contains(&line) {
                bail!("LabOptions.capability_keys: no capability `{id}` in the bench");
            }
            toml = toml.replacen(&line, &format!("{line}{keys}\n"), 1);
        }
        for entry in &opts.extra_capabilities {
            toml.push('\n');
            toml.push_str(entry);
            toml.push('\n');
        }
        for i in 1..=opts.extra_speakers {
            toml.push_str(&format!(
                "\n[[capabilities]]\nid = \"{}\"\ntype = \"speaker\"\n[capabilities.driver]\nbackend = \"sim\"\n",
                bench_speaker(i)
            ));
        }
        let edge_metrics_port = opts.edge_metrics.then(free_port);
        let listen = edge_metrics_port
            .map(|p| format!("127.0.0.1:{p}"))
            .unwrap_or_default();
        if edge_metrics_port.is_some() || toml.contains("\n[metrics]") {
            toml = with_metrics_listen(&toml, &listen);
        }
        std::fs::write(&edge_config, toml)?;

        let scheme = if opts.tls.is_some() { "https" } else { "http" };
        let mut lab = Lab {
            opts,
            root,
            dir: Some(dir),
            sim,
            registry: None,
            edge: None,
            base_url: format!("{scheme}://127.0.0.1:{http_port}"),
            http_port,
            mqtt_port,
            admin_token: String::new(),
            provider_token,
            hw_token,
            chief_token,
            devices,
            store_path,
            edge_metrics_port,
            registry_config,
            edge_config,
        };
        lab.start_registry()?;
        lab.admin_token = read_token(&lab.root.join("registry/admin.token"))?;
        lab.start_edge()?;
        lab.wait_registered(Duration::from_secs(30)).await?;
        Ok(lab)
    }

    /// `http://127.0.0.1:{port}/metrics` of the edge, when
    /// [`LabOptions::edge_metrics`].
    pub fn edge_metrics_url(&self) -> Option<String> {
        self.edge_metrics_port
            .map(|p| format!("http://127.0.0.1:{p}/metrics"))
    }

    /// Start (or restart) `cloud-registry serve`.
    pub fn start_registry(&mut self) -> Result<()> {
        let bin = lab_bin(self.opts.bin_dir.as_deref(), "cloud-registry")?;
        let mut cmd = program_command(&bin, &self.root.join("logs/registry.log"))?;
        cmd.args(["serve", "--config"])
            .arg(&self.registry_config)
            .envs(self.opts.registry_env.iter().map(|(k, v)| (k, v)));
        let (p, _) = Proc::start_ready("cloud-registry", cmd, Duration::from_secs(20))
            .with_context(|| self.log_hint("registry"))?;
        self.registry = Some(p);
        Ok(())
    }

    /// Write the config of another replica of this lab's registry: the
    /// same file with `[http] listen` on `http_port` and `replica_id =
    /// "{replica_id}"` in place of the first's (whose `[cluster]` table
    /// the test put in [`LabOptions::registry_extra_toml`]). Returns its
    /// path.
    ///
    /// Errors: the lab's config cannot be read or the new one written.
    pub fn replica_config(&self, http_port: u16, replica_id: &str) -> Result<PathBuf> {
        let text = crate::read_to_string(&self.registry_config)?;
        let text = text.replacen(
            &format!("listen = \"127.0.0.1:{}\"", self.http_port),
            &format!("listen = \"127.0.0.1:{http_port}\""),
            1,
        );
        let text = with_replica_id(&text, replica_id);
        let path = self
            .root
            .join(format!("registry/replica-{replica_id}.toml"));
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// Start `cloud-registry serve --config config` as another replica
    /// and wait until it prints its standby line (`{"event":"standby"}`;
    /// or its ready line, should it lead at once). Its log is
    /// `logs/registry-{name}.log`.
    ///
    /// Errors: it does not start within 20 s.
    pub fn start_replica(&self, config: &Path, name: &str) -> Result<(Proc, Value)> {
        let bin = lab_bin(self.opts.bin_dir.as_deref(), "cloud-registry")?;
        let mut cmd = program_command(&bin, &self.root.join(format!("logs/registry-{name}.log")))?;
        cmd.args(["serve", "--config"]).arg(config);
        Proc::start_until(
            "cloud-registry replica",
            cmd,
            Duration::from_secs(20),
            |v| matches!(v["event"].as_str(), Some("standby" | "ready")),
        )
        .with_context(|| format!("replica {name}; see logs/registry-{name}.log"))
    }

    /// Start (or restart) `edge-agent run`.
    pub fn start_edge(&mut self) -> Result<()> {
        let bin = lab_bin(self.opts.bin_dir.as_deref(), "edge-agent")?;
        let mut cmd = program_command(&bin, &self.root.join("logs/edge.log"))?;
        cmd.args(["run", "--config"]).arg(&self.edge_config);
        cmd.envs(self.opts.edge_env.iter().map(|(k, v)| (k, v)));
        let (p, _) = Proc::start_ready("edge-agent", cmd, Duration::from_secs(30))
            .with_context(|| self.log_hint("edge"))?;
        self.edge = Some(p);
        Ok(())
    }

    /// Every relay switch frame the simulated LCUS board accepted so far
    /// (bench-sim's `--journal`), oldest first: `{"channel", "on",
    /// "changed", "at_unix_ms"}`.
    pub fn relay_switches(&self) -> Vec<Value> {
        self.journal("lcus")
    }

    /// Every command the simulated Korad supply received so far
    /// (bench-sim's `--journal`), oldest first, queries included:
    /// `{"command": "VSET1:05.00", "at_unix_ms"}`.
    pub fn psu_commands(&self) -> Vec<Value> {
        self.journal("korad")
    }

    /// The journal lines of simulator `device`, oldest first.
    fn journal(&self, device: &str) -> Vec<Value> {
        std::fs::read_to_string(self.root.join("sim/journal.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["device"] == device)
            .collect()
    }

    /// The registry's TOML configuration.
    pub fn registry_config(&self) -> &Path {
        &self.registry_config
    }

    /// Run `cloud-registry audit-log verify` on the lab's registry: the
    /// event log's hash chain must verify.
    ///
    /// Errors: the program cannot run, or it reports a break (its output
    /// in the message).
    pub async fn verify_audit_log(&self) -> Result<()> {
        let out =
            tokio::process::Command::new(lab_bin(self.opts.bin_dir.as_deref(), "cloud-registry")?)
                .args(["audit-log", "verify", "--config"])
                .arg(self.registry_config())
                .output()
                .await?;
        if !out.status.success() {
            bail!(
                "audit-log verify: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// The bench TOML the edge runs with.
    pub fn edge_config(&self) -> &Path {
        &self.edge_config
    }

    /// The edge daemon's process id (0 when it is not running).
    pub fn edge_pid(&self) -> u32 {
        self.edge.as_ref().map(Proc::pid).unwrap_or(0)
    }

    /// Kill the edge daemon with SIGKILL (no clean shutdown, no DISCONNECT).
    pub fn kill_edge(&mut self) {
        if let Some(mut p) = self.edge.take() {
            p.kill();
        }
    }

    /// Stop the registry with SIGTERM (clean) and wait for it.
    pub fn stop_registry(&mut self) {
        if let Some(mut p) = self.registry.take() {
            p.terminate(Duration::from_secs(15));
        }
    }

    fn log_hint(&self, which: &str) -> String {
        format!(
            "{which} did not start; see {}",
            self.root.join(format!("logs/{which}.log")).display()
        )
    }

    /// Wait until the provider is online with all 8 capabilities online.
    pub async fn wait_registered(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let url = format!(
            "{}/api/v1/capabilities?provider_id={PROVIDER_ID}",
            self.base_url
        );
        let mut http = reqwest::Client::builder();
        if let Some(tls) = &self.opts.tls {
            let pem = crate::read_to_string(&tls.ca_file)?;
            http = http.tls_certs_only(reqwest::Certificate::from_pem_bundle(pem.as_bytes())?);
        }
        let http = http.build()?;
        loop {
            let got: Option<Value> =
                match http.get(&url).bearer_auth(&self.admin_token).send().await {
                    Ok(r) => r.json().await.ok(),
                    Err(_) => None,
                };
            let ok = got.is_some_and(|v| {
                let caps = v["capabilities"].as_array().cloned().unwrap_or_default();
                caps.len()
                    == caps::ALL.len()
                        + self.opts.extra_speakers
                        + self.opts.extra_capabilities.len()
                    && caps
                        .iter()
                        .all(|c| c["status"] == "available" || c["status"] == "leased")
            });
            if ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(anyhow!(
                    "provider {PROVIDER_ID} and its 8 capabilities were not online within {timeout:?}; see {}",
                    self.root.join("logs").display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// [`Lab::start`] for a test that stops and restarts the broker: on a
    /// private [`Mosquitto`] in a new temporary directory, with a
    /// [`unique_topic_prefix`] (they replace `opts`' broker and topic
    /// prefix). Returns the directory (hold it as long as the broker), the
    /// broker and the lab. Where `mosquitto` is not installed: `None` with
    /// a printed reason (the test skips), or a panic under `CI=true`.
    ///
    /// Panics: the broker or the lab does not start.
    pub async fn start_on_private_mosquitto(opts: LabOptions) -> Option<(TempDir, Mosquitto, Lab)> {
        if Mosquitto::binary().is_none() {
            benchlink_testkit::skip_unless_ci("mosquitto is not installed");
            return None;
        }
        let dir = tempfile::tempdir().expect("temporary directory");
        let broker = Mosquitto::start(dir.path()).expect("private mosquitto starts");
        let lab = Lab::start(LabOptions {
            broker: Broker::External {
                host: "127.0.0.1".into(),
                port: broker.port,
            },
            topic_prefix: unique_topic_prefix(),
            ..opts
        })
        .await
        .expect("lab");
        Some((dir, broker, lab))
    }

    /// Keep the directory after the lab stops; returns its path.
    pub fn keep(&mut self) -> PathBuf {
        if let Some(d) = self.dir.take() {
            return d.keep();
        }
        self.root.clone()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Stop the edge first so it does not fight a vanished registry.
        if let Some(mut e) = self.edge.take() {
            e.terminate(Duration::from_secs(5));
        }
        if let Some(mut r) = self.registry.take() {
            r.terminate(Duration::from_secs(5));
        }
        self.sim.terminate(Duration::from_secs(3));
        if self.opts.keep {
            let path = self.keep();
            eprintln!("lab directory kept: {}", path.display());
        }
    }
}

/// Id of the `i`-th extra speaker (1-based): `spk-bench-01`.
pub fn bench_speaker(i: usize) -> String {
    format!("spk-bench-{i:02}")
}

/// A short random suffix.
pub fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}{:x}", std::process::id(), nanos & 0xffff_ffff)
}

/// A topic prefix of its own for one test's lab on a shared broker:
/// `benchlink-e2e-{random}/v1`.
pub fn unique_topic_prefix() -> String {
    format!("benchlink-e2e-{}/v1", uuid_like())
}

/// An edge TOML (`text`, e.g. the shipped `config/edge-agent.sim.toml`)
/// made to run in a lab: its `state_dir`, `provider_id` and the
/// `[registry]` connection (`mqtt_host`, `mqtt_port`, `topic_prefix`,
/// `base_url`, plus the provider `token` and a 1 s heartbeat) are replaced
/// by the lab's; everything else, the capabilities above all, is kept as
/// written. Works line by line on `key = value` lines.
pub fn adapt_edge_config(
    text: &str,
    state_dir: &Path,
    mqtt_host: &str,
    mqtt_port: u16,
    topic_prefix: &str,
    http_port: u16,
    token: &str,
) -> String {
    let mut out = String::new();
    let mut section = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            section = trimmed.to_string();
        }
        let key = trimmed
            .split_once('=')
            .map(|(k, _)| k.trim())
            .unwrap_or_default();
        let replaced = match (section.as_str(), key) {
            ("", "state_dir") => Some(format!("state_dir = \"{}\"", state_dir.display())),
            ("[provider]", "provider_id") => Some(format!("provider_id = \"{PROVIDER_ID}\"")),
            ("[registry]", "mqtt_host") => Some(format!("mqtt_host = \"{mqtt_host}\"")),
            ("[registry]", "mqtt_port") => Some(format!("mqtt_port = {mqtt_port}")),
            ("[registry]", "topic_prefix") => Some(format!("topic_prefix = \"{topic_prefix}\"")),
            ("[registry]", "base_url") => Some(format!(
                "base_url = \"http://127.0.0.1:{http_port}\"\n\
                 token = \"{token}\"\n\
                 mqtt_keep_alive_seconds = 5\n\
                 heartbeat_interval_seconds = 1"
            )),
            _ => None,
        };
        out.push_str(replaced.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// `toml` with its `[metrics]` table's `listen` set to `listen` (`""`:
/// off), the table appended when it has none.
pub fn with_metrics_listen(toml: &str, listen: &str) -> String {
    let mut out = String::new();
    let mut section = String::new();
    let mut done = false;
    for line in toml.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            section = trimmed.to_string();
        }
        let key = trimmed.split_once('=').map(|(k, _)| k.trim());
        if section == "[metrics]" && key == Some("listen") {
            out.push_str(&format!("listen = \"{listen}\"\n"));
            done = true;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !done {
        out.push_str(&format!("\n[metrics]\nlisten = \"{listen}\"\n"));
    }
    out
}

/// Registry TOML (for [`LabOptions::registry_extra_toml`]) that turns on
/// the local recogniser the registry transcribes audio clips with:
/// `pocketsphinx_continuous` with the word-loop grammar of the lab's
/// spoken scripts (`config/speech/bench-words.gram`), `provider =
/// "command"` of `[agents.speech]`.
pub fn local_speech_toml() -> String {
    let grammar = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/speech/bench-words.gram");
    format!(
        "\n[agents.speech]\nenabled = true\nprovider = \"command\"\n\
         command = [\"pocketsphinx_continuous\", \"-infile\", \"{{input}}\", \"-jsgf\", \"{}\", \
         \"-wip\", \"1e-2\", \"-logfn\", \"/dev/null\"]\n",
        grammar.display()
    )
}

/// The bench TOML: four simulated media capabilities and four real serial
/// drivers on the simulator's ptys.
pub fn edge_toml(
    state_dir: &Path,
    mqtt_host: &str,
    mqtt_port: u16,
    topic_prefix: &str,
    http_port: u16,
    token: &str,
    devices: &BTreeMap<String, String>,
) -> String {
    let dev = |n: &str| devices.get(n).cloned().unwrap_or_default();
    format!(
        r#"# Generated by the Benchlink demo harness.
state_dir = "{state}"

[provider]
provider_id = "{PROVIDER_ID}"
node_id = "demo-bench-01"
labels = ["demo", "sim"]
owner_type = "team"
owner_display_name = "Benchlink demo"

[registry]
mqtt_host = "{mqtt_host}"
mqtt_port = {mqtt_port}
topic_prefix = "{topic_prefix}"
base_url = "http://127.0.0.1:{http_port}"
token = "{token}"
mqtt_keep_alive_seconds = 5
heartbeat_interval_seconds = 1

[outbox]
disk_budget_mb = 256

[[capabilities]]
id = "{cam}"
type = "camera"
display_name = "Front camera (simulated)"
tags = ["front"]
[capabilities.driver]
backend = "sim"
resolution = "640x480"
fps = 15

[[capabilities]]
id = "{mic}"
type = "microphone"
display_name = "Bench microphone (simulated)"
[capabilities.driver]
backend = "sim"

[[capabilities]]
id = "{spk}"
type = "speaker"
display_name = "Bench speaker (simulated)"
[capabilities.driver]
backend = "sim"

[[capabilities]]
id = "{screen}"
type = "screen_capture"
display_name = "DUT screen capture (simulated)"
[capabilities.driver]
backend = "sim"

[[capabilities]]
id = "{psu}"
type = "programmable_power_supply"
display_name = "DUT supply (Korad KA3005P on a pty)"
preemptible = false
tags = ["power"]
[capabilities.driver]
backend = "korad"
port = "{korad}"
max_voltage_v = 12.0
max_current_a = 2.0
command_gap_ms = 50
settle_ms = 50

[[capabilities]]
id = "{relay}"
type = "relay"
display_name = "DUT relays (LCUS-4 on a pty)"
preemptible = false
[capabilities.driver]
backend = "lcus"
port = "{lcus}"
channels = 4
channel = 1

[[capabilities]]
id = "{robot}"
type = "thumb_robot"
display_name = "Thumb robot (GRBL on a pty)"
tags = ["touch"]
[capabilities.driver]
backend = "grbl"
port = "{grbl}"
bounds_mm = {{ x_min = 0.0, x_max = 70.0, y_min = 0.0, y_max = 140.0 }}
safe_z_mm = 10.0
press_z_mm = 2.0
feed_mm_per_min = 3000.0
rapid_mm_per_min = 6000.0
[capabilities.driver.buttons]
power = {{ x_mm = 68.0, y_mm = 40.0 }}

[[capabilities]]
id = "{console}"
type = "serial_port"
display_name = "DUT serial console (pty)"
tags = ["dut"]
[capabilities.driver]
backend = "serialport"
port = "{dut}"
baud_rate = 115200
"#,
        state = state_dir.display(),
        cam = caps::CAMERA,
        mic = caps::MICROPHONE,
        spk = caps::SPEAKER,
        screen = caps::SCREEN,
        psu = caps::PSU,
        relay = caps::RELAY,
        robot = caps::ROBOT,
        console = caps::CONSOLE,
        korad = dev("korad"),
        lcus = dev("lcus"),
        grbl = dev("grbl"),
        dut = dev("dut_console"),
    )
}

/// A private Mosquitto on its own port, which a test can stop and start
/// again (the shared one on 1883 must not be touched).
pub struct Mosquitto {
    pub port: u16,
    conf: PathBuf,
    log: PathBuf,
    proc: Option<Proc>,
}

impl Mosquitto {
    /// The broker's process id while it runs (0 when stopped).
    pub fn pid(&self) -> u32 {
        self.proc.as_ref().map(Proc::pid).unwrap_or(0)
    }

    /// The `mosquitto` binary, when installed.
    pub fn binary() -> Option<PathBuf> {
        [
            "/usr/sbin/mosquitto",
            "/usr/bin/mosquitto",
            "/usr/local/sbin/mosquitto",
        ]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
    }

    /// Write a config (127.0.0.1 on a free port, anonymous, no
    /// persistence) into `dir` and start the broker.
    pub fn start(dir: &Path) -> Result<Mosquitto> {
        Self::start_with(dir, "")
    }

    /// [`Mosquitto::start`] with more configuration lines (e.g.
    /// `set_tcp_nodelay true`).
    pub fn start_with(dir: &Path, extra_conf: &str) -> Result<Mosquitto> {
        let port = free_port();
        let conf = dir.join(format!("mosquitto-{port}.conf"));
        std::fs::write(
            &conf,
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n{extra_conf}\n"
            ),
        )?;
        let mut m = Mosquitto {
            port,
            conf,
            log: dir.join(format!("mosquitto-{port}.log")),
            proc: None,
        };
        m.resume()?;
        Ok(m)
    }

    /// Start the broker again on the same port.
    pub fn resume(&mut self) -> Result<()> {
        let bin = Self::binary().ok_or_else(|| anyhow!("mosquitto is not installed"))?;
        let mut cmd = program_command(&bin, &self.log)?;
        cmd.arg("-c").arg(&self.conf).stdout(Stdio::null());
        self.proc = Some(Proc::start("mosquitto", cmd)?);
        let addr = format!("127.0.0.1:{}", self.port);
        crate::wait_for(Duration::from_secs(10), "mosquitto listening", || {
            crate::reachable(&addr).then_some(())
        })
    }

    /// Stop the broker with SIGTERM, as `systemctl restart mosquitto`
    /// does: it closes every client's connection itself (and publishes
    /// their last wills) before it exits.
    pub fn terminate(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.terminate(Duration::from_secs(10));
        }
    }

    /// Kill the broker (every client loses its connection at once).
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }
}
