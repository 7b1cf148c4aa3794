//! The command line's definitions (clap derive); the man page and the
//! shell completions are generated from them.

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand};

/// Lease lab test hardware from a Benchlink registry and drive it.
#[derive(Debug, Parser)]
#[command(name = "benchlink", version, after_help = crate::exit::TABLE, after_long_help = crate::exit::TABLE)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes.
#[derive(Debug, Args)]
pub struct Global {
    /// The registry's base URL, e.g. http://127.0.0.1:8080.
    /// An empty value (e.g. `BENCHLINK_URL=`) counts as not given.
    #[arg(long, env = "BENCHLINK_URL", global = true, value_name = "URL")]
    pub url: Option<String>,
    /// Bearer token (prefer --token-file: a flag shows in `ps`).
    #[arg(
        long,
        env = "BENCHLINK_TOKEN",
        global = true,
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// File holding the bearer token; must be mode 0600.
    #[arg(long, env = "BENCHLINK_TOKEN_FILE", global = true, value_name = "FILE")]
    pub token_file: Option<String>,
    /// PEM file of the CA certificates an https:// registry is signed by
    /// (a private CA); only those are trusted then. Default: the system's.
    #[arg(long, env = "BENCHLINK_CA_FILE", global = true, value_name = "FILE")]
    pub ca_file: Option<String>,
    /// Config file (TOML: `url`, `token_file`); default
    /// ~/.config/benchlink/config.toml.
    #[arg(long, env = "BENCHLINK_CONFIG", global = true, value_name = "FILE")]
    pub config: Option<String>,
    /// Print the registry's JSON instead of tables (one JSON document per
    /// command; `watch` prints one event per line).
    #[arg(long, global = true)]
    pub json: bool,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List capabilities (devices) with their status and health.
    Caps(CapsArgs),
    /// Who holds what: active leases per capability and queue depth.
    Who,
    /// Lease one capability or a group (all or none), by id or selector.
    Lease(LeaseArgs),
    /// Renew a lease you hold.
    Renew {
        /// The lease id.
        lease_id: String,
        /// New duration from now, seconds.
        #[arg(long)]
        duration: Option<u32>,
    },
    /// Release a lease (the holder, or an admin).
    Release {
        /// The lease id.
        lease_id: String,
        /// Why, recorded with the release.
        #[arg(long, default_value = "released with benchlink")]
        reason: String,
    },
    /// Run an action on the leased hardware and wait for its result.
    ///
    /// Parameters are key=value; a value that parses as JSON (5.0, true,
    /// {"a":1}) is sent as such, anything else as a string. This moves
    /// real hardware: a PSU's output, a relay, a robot arm.
    Act(ActArgs),
    /// Show a session (an action's run): status, result, artifacts.
    Session {
        /// The session id.
        session_id: String,
    },
    /// Artifacts: the evidence sessions produced.
    #[command(subcommand)]
    Artifact(ArtifactCommand),
    /// Follow the event stream, resuming after a dropped connection.
    Watch(WatchArgs),
    /// Audit requests: submit, claim, post a result.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Check an audit bundle offline (no registry needed): every file's
    /// SHA-256, the event chain, the checkpoint's signature, the artifacts'
    /// bytes and the records against their events. Prints the audit's
    /// timeline; exit 1 names the first failure (docs/audit-trail.md
    /// "Audit bundles").
    VerifyBundle {
        /// The bundle (a tar from `benchlink audit bundle`).
        file: PathBuf,
        /// The registry's Ed25519 public key, 64 hex digits, obtained apart
        /// from the bundle (`cloud-registry audit-log public-key`).
        #[arg(long, value_name = "HEX")]
        public_key: String,
    },
    /// Run an Earth command (natural language), e.g. "高亮所有北斗卫星".
    Earth {
        /// The command text.
        text: String,
    },
    /// Take a capability, or a whole bench, out of service and back
    /// (admin; docs/policy.md "Maintenance").
    #[command(subcommand)]
    Maintenance(MaintenanceCommand),
    /// Manage capabilities (admin): remove a retired one.
    #[command(subcommand)]
    Capability(CapabilityCommand),
    /// Print shell completions (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) on stdout.
    Man,
    /// Serve MCP (Model Context Protocol) on stdio for an agent host.
    Mcp,
}

/// `caps` filters (all optional, ANDed).
#[derive(Debug, Args)]
pub struct CapsArgs {
    /// Capability type, e.g. camera, serial_port, power_supply.
    #[arg(long = "type")]
    pub capability_type: Option<String>,
    /// A tag the capability must carry.
    #[arg(long)]
    pub tag: Option<String>,
    /// Lease status: available, leased, ...
    #[arg(long)]
    pub status: Option<String>,
}

/// `lease` arguments.
#[derive(Debug, Args)]
pub struct LeaseArgs {
    /// Capability ids; several make a group lease (all or none).
    pub capability_ids: Vec<String>,
    /// A selector instead of an id: TYPE or TYPE:TAG,TAG (repeatable;
    /// each adds one capability to the group).
    #[arg(long = "select", value_name = "TYPE[:TAGS]")]
    pub selectors: Vec<String>,
    /// How long, seconds.
    #[arg(long, default_value_t = 300)]
    pub duration: u32,
    /// 0..=100; higher may preempt with --preempt-reason.
    #[arg(long, default_value_t = 50)]
    pub priority: u8,
    /// What the lease is for (shown to other users).
    #[arg(long, default_value = "benchlink lease")]
    pub purpose: String,
    /// Project the work belongs to.
    #[arg(long, default_value = "benchlink-cli")]
    pub project: String,
    /// Wait up to this many seconds for the grant (0: answer at once,
    /// a queued request stays queued).
    #[arg(long, default_value_t = 0)]
    pub wait: u32,
    /// Preempt a lower-priority holder, with a whitelisted reason
    /// (e.g. chief_audit, safety_stop).
    #[arg(long)]
    pub preempt_reason: Option<String>,
    /// Lease mode of selector requirements in a group (exclusive,
    /// shared_read).
    #[arg(long, default_value = "exclusive")]
    pub mode: String,
}

/// `act` arguments.
#[derive(Debug, Args)]
pub struct ActArgs {
    /// The lease id.
    pub lease_id: String,
    /// The action, e.g. snapshot, read, write, set_voltage.
    pub action: String,
    /// Parameters, key=value.
    #[arg(value_name = "KEY=VALUE")]
    pub params: Vec<String>,
    /// The capability to act on, when the lease covers several.
    #[arg(long)]
    pub capability: Option<String>,
    /// Longest wait for the result, seconds.
    #[arg(long, default_value_t = 60)]
    pub wait: u32,
}

/// `artifact` subcommands.
#[derive(Debug, Subcommand)]
pub enum ArtifactCommand {
    /// Download an artifact's bytes to a file, checking its sha256.
    Get {
        /// The artifact id.
        artifact_id: String,
        /// Output file (default: the artifact id in the current directory).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// List artifacts of a session or a lease.
    List {
        /// Of this session.
        #[arg(long)]
        session: Option<String>,
        /// Of this lease.
        #[arg(long)]
        lease: Option<String>,
        /// Only the evidence the registry derived from this artifact
        /// (detection_json, ocr_text, transcript).
        #[arg(long)]
        derived_from: Option<String>,
    },
}

/// `watch` arguments.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Event types, comma-separated (lease_granted,lease_preempted,...).
    #[arg(long)]
    pub types: Option<String>,
    /// Only events of this capability.
    #[arg(long)]
    pub capability: Option<String>,
    /// Only events of this lease.
    #[arg(long)]
    pub lease: Option<String>,
    /// Start after this event id (replays the log from there); default:
    /// only new events.
    #[arg(long)]
    pub after: Option<u64>,
    /// Stop after this many events.
    #[arg(long)]
    pub count: Option<u64>,
}

/// `audit` subcommands.
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Submit an audit request (a JSON file, `-` for stdin).
    Submit {
        /// The AuditTaskRequest JSON.
        file: PathBuf,
    },
    /// Claim the next audit task of the given types (audit_agent).
    Claim {
        /// Audit types, e.g. hardware.
        #[arg(long = "type", required = true)]
        audit_types: Vec<String>,
        /// Your agent ref (default: your principal).
        #[arg(long)]
        agent_ref: Option<String>,
        /// Wait up to this long for a task, ms.
        #[arg(long, default_value_t = 0)]
        wait_ms: u64,
    },
    /// Post the result of a claimed task (a JSON file, `-` for stdin).
    Result {
        /// The audit request id.
        audit_request_id: String,
        /// The AuditTaskResult JSON.
        file: PathBuf,
    },
    /// Download the audit bundle of a request (a tar: records, the event
    /// chain segment with its signed checkpoint, the artifacts' bytes);
    /// check it with `benchlink verify-bundle`.
    Bundle {
        /// The audit request id.
        audit_request_id: String,
        /// Where to write it.
        #[arg(short = 'o', long, value_name = "FILE")]
        output: PathBuf,
    },
}

/// What a maintenance change applies to: one capability, or every
/// capability of a provider (exactly one of the two).
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("target").required(true).args(["capability_id", "provider"])))]
pub struct MaintenanceTarget {
    /// The capability id.
    pub capability_id: Option<String>,
    /// Every capability of this provider (a whole bench) instead.
    #[arg(long, value_name = "PROVIDER_ID")]
    pub provider: Option<String>,
}

/// `maintenance` subcommands.
#[derive(Debug, Subcommand)]
pub enum MaintenanceCommand {
    /// Put it into maintenance: nothing more is granted on it, and its
    /// holders are told to give way (they keep the grace period).
    Start {
        #[command(flatten)]
        target: MaintenanceTarget,
        /// Why (1..=500 characters; shown to holders and in refusals).
        #[arg(long, required = true)]
        reason: String,
    },
    /// Take it out of maintenance: back to `available` (or `offline`
    /// when its provider is).
    End {
        #[command(flatten)]
        target: MaintenanceTarget,
    },
}

/// `capability` subcommands.
#[derive(Debug, Subcommand)]
pub enum CapabilityCommand {
    /// Remove a retired capability; it must be in maintenance and neither
    /// held nor waited for (else 409, exit 5).
    Remove {
        /// The capability id.
        capability_id: String,
    },
}
