//! `cloud-registry`: the Benchlink registry binary.
//!
//! - `cloud-registry serve --config FILE [--bootstrap-admin-token-file PATH]`
//!   runs the HTTP API and MQTT; prints one JSON line on stdout when ready:
//!   `{"event":"ready","http":"127.0.0.1:8080","http_scheme":"http",...}`;
//!   stops cleanly on SIGINT / SIGTERM.
//! - `cloud-registry token create --config FILE --role ROLE --name NAME
//!   [--create-store]` prints a new bearer token once (only its SHA-256 is
//!   stored).
//! - `cloud-registry token list --config FILE [--json]` lists the tokens
//!   (name, role, created_at, revoked), never a secret.
//! - `cloud-registry token revoke --config FILE --name NAME` revokes every
//!   token of a principal; exit 1 when no token has that name. Works while
//!   the registry runs (it notices within a second).
//!
//! The token commands never create the store by accident: when the file
//! named by `store.path` does not exist (a wrong `--config`, or a registry
//! that has never run) they exit 2 with its path. `serve` creates it;
//! `token create --create-store` creates it on purpose (a bench's token
//! made before the registry's first start).
//! - `cloud-registry backup --config FILE --to COPY` copies the store,
//!   running registry or not, with SQLite's online backup in short steps
//!   (checkpoints carry on between them); prints one JSON line
//!   `{"path","pages","bytes","restarts","elapsed_ms"}`.
//! - `cloud-registry check-config --config FILE` checks the file and prints
//!   every problem on stderr, one `file:line: key: message` per line (no
//!   line when the key is not in the file); exit 0 when usable, 2 when not.
//!
//! Logs go to stderr (`RUST_LOG`, default `info`; the embedded broker's own
//! log only when `RUST_LOG` names `rumqttd`; JSON lines
//! with `[log] json = true`). Text logs are coloured only when stderr is a
//! terminal and `NO_COLOR` is unset or empty, so journald and log files get
//! plain text.
//!
//! Output into a closed pipe (`cloud-registry check-config ... | head -1`)
//! is not an error: the command ends quietly with its usual exit status.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use cloud_registry::app::{self, Registry};
use cloud_registry::auth::Revoked;
use cloud_registry::config::Config;
use shared_protocol::api::Role;

#[derive(Parser)]
#[command(
    name = "cloud-registry",
    version,
    about = "Benchlink capability registry"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the registry.
    Serve {
        /// The TOML configuration file.
        #[arg(long)]
        config: PathBuf,
        /// Keep a super_admin token in this file (created with mode 0600;
        /// reused across restarts). Overrides `auth.bootstrap_admin_token_file`.
        #[arg(long)]
        bootstrap_admin_token_file: Option<PathBuf>,
        /// Start even when the event log's hash chain is broken, and
        /// extend it (this once; `audit_log.accept_broken_chain` always).
        #[arg(long)]
        accept_broken_chain: bool,
    },
    /// The event log's hash chain and signed checkpoints
    /// (docs/audit-trail.md).
    #[command(subcommand)]
    AuditLog(AuditLogCommand),
    /// Manage bearer tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Copy the store (while the registry runs, too) with SQLite's online
    /// backup, in short steps that let checkpoints run between them.
    Backup {
        #[arg(long)]
        config: PathBuf,
        /// The copy to write (replaced once complete).
        #[arg(long)]
        to: PathBuf,
        /// Pages (4 KiB) copied per step.
        #[arg(long, default_value_t = 256)]
        pages_per_step: i32,
        /// Pause between two steps, ms.
        #[arg(long, default_value_t = 10)]
        pause_ms: u64,
    },
    /// Check a configuration file: prints every problem as
    /// `file:line: key: message`; exit status 0 when usable, 2 when not.
    CheckConfig {
        #[arg(long)]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum AuditLogCommand {
    /// Walk the whole chain from event 1 and check every checkpoint's
    /// signature; exit 0 when sound, 1 naming the first bad event. Works
    /// while the registry runs (it only reads).
    Verify {
        #[arg(long)]
        config: PathBuf,
        /// The registry's public key (64 hex digits); default: the
        /// `.pub` file beside the signing key. An auditor passes the key
        /// they were given, not the one in the store's directory.
        #[arg(long)]
        public_key: Option<String>,
        /// Checkpoints kept apart from the store (JSON of `audit-log
        /// checkpoint`), also checked: they catch events cut off the end
        /// together with the store's own checkpoints.
        #[arg(long)]
        checkpoint: Vec<PathBuf>,
        /// One JSON document instead of a sentence.
        #[arg(long)]
        json: bool,
    },
    /// Print the newest signed checkpoint as JSON, to keep apart from the
    /// store.
    Checkpoint {
        #[arg(long)]
        config: PathBuf,
    },
    /// Print the registry's public key (hex).
    PublicKey {
        #[arg(long)]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a token and print it (shown only this once).
    Create {
        #[arg(long)]
        config: PathBuf,
        /// super_admin, admin, operator, audit_agent, provider or viewer.
        #[arg(long)]
        role: Role,
        /// The principal: a provider id for `provider`, e.g.
        /// `audit:hardware-auditor-01` for an audit agent.
        #[arg(long)]
        name: String,
        /// Create the store when it does not exist yet (otherwise a
        /// missing store is refused with exit status 2).
        #[arg(long)]
        create_store: bool,
    },
    /// List the stored tokens: name, role, created_at, revoked (never the
    /// secret).
    List {
        #[arg(long)]
        config: PathBuf,
        /// One JSON document (`{"tokens": [...]}`) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke every token of a principal. A running registry refuses them
    /// within a second.
    Revoke {
        #[arg(long)]
        config: PathBuf,
        /// The principal whose tokens to revoke.
        #[arg(long)]
        name: String,
    },
}

/// A token command found no store at the configured path: exit status 2,
/// like a configuration `check-config` refuses.
#[derive(Debug, thiserror::Error)]
#[error(
    "store {store} does not exist (store.path of {config}); \
     `cloud-registry serve --config {config}` creates it{hint}"
)]
struct StoreMissing {
    store: String,
    config: String,
    /// What else the command offers, e.g. `--create-store`.
    hint: &'static str,
}

/// Refuse a token command when the store named by `cfg` does not exist:
/// opening it would make a new, empty store (a typo in `--config` would
/// then mint tokens no registry knows of, or list none).
fn require_store(config: &std::path::Path, cfg: &Config, hint: &'static str) -> anyhow::Result<()> {
    if cfg.store.backend == cloud_registry::config::StoreBackend::Postgres
        || cfg.store.path.exists()
    {
        return Ok(());
    }
    Err(StoreMissing {
        store: cfg.store.path.display().to_string(),
        config: config.display().to_string(),
        hint,
    }
    .into())
}

/// Open the configured store for `token list` / `token revoke`; unlike
/// `serve`, a missing store file is [`StoreMissing`] rather than a new
/// empty store.
fn open_existing_store(
    config: &std::path::Path,
    cfg: &Config,
) -> anyhow::Result<cloud_registry::db::Db> {
    require_store(config, cfg, "")?;
    app::open_store(&cfg.store).with_context(|| format!("opening store {}", cfg.store.describe()))
}

/// The tokens as a table for a person: NAME, ROLE, CREATED_AT and REVOKED
/// (when, or `no`), each column as wide as its widest cell and two spaces
/// from the next, so that the columns line up whatever the lengths of the
/// names.
fn token_table(tokens: &[cloud_registry::auth::TokenInfo]) -> String {
    let header = ["NAME", "ROLE", "CREATED_AT", "REVOKED"];
    let rows: Vec<[&str; 4]> = tokens
        .iter()
        .map(|t| {
            [
                t.name.as_str(),
                t.role.as_str(),
                t.created_at.as_str(),
                t.revoked_at.as_deref().unwrap_or("no"),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(header).chain(rows) {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Colours in log lines: only on a terminal, and never with `NO_COLOR` set
/// to a non-empty value (<https://no-color.org>).
fn log_ansi(stream_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stream_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Whether a span or event may reach the log: not the broker's spans.
///
/// rumqttd opens `error`-level spans around every packet it routes, with
/// the topic formatted into a field, so they pass any filter that keeps
/// its errors; the log formatter then renders each one (a measurable part
/// of the broker's CPU per message) only to use it as context. Its events
/// (warnings, errors) still pass, without that context.
///
/// Once the registry is stopping ([`STOPPING`]), the broker's events are
/// dropped too: rumqttd reports each connection the stop closes (the
/// registry's own client first) as an `ERROR`, which would end every clean
/// shutdown's log with errors that are none.
fn keep_in_log(meta: &tracing::Metadata<'_>) -> bool {
    if !meta.target().starts_with("rumqttd") {
        return true;
    }
    !meta.is_span() && !STOPPING.load(std::sync::atomic::Ordering::Relaxed)
}

/// The log filter without `RUST_LOG`. The embedded broker's own log
/// (rumqttd) is off: it reports connections it closes as a client leaves
/// (the registry's own at a stop) and client-id takeovers after a
/// reconnect as `ERROR`s, which would fill a lab's journal with errors
/// that are none. The registry logs what matters
/// of it itself (refused logins, provider status changes, its own link).
const DEFAULT_LOG_FILTER: &str = "info,rumqttd=off";

/// The filter directives for `RUST_LOG` = `rust_log`: as given, with the
/// broker's log off unless they name `rumqttd` themselves
/// (`RUST_LOG=info,rumqttd=warn` shows its messages again).
fn log_filter(rust_log: Option<&str>) -> String {
    match rust_log.map(str::trim).filter(|s| !s.is_empty()) {
        None => DEFAULT_LOG_FILTER.to_string(),
        Some(s) if s.contains("rumqttd") => s.to_string(),
        Some(s) => format!("{s},rumqttd=off"),
    }
}

/// Set when the shutdown signal arrives; see [`keep_in_log`].
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, leave the embedded broker's complaints about closing
/// connections out of the log (the filter's verdicts are cached per
/// call site, so they are asked again).
fn quiet_broker_for_shutdown() {
    STOPPING.store(true, std::sync::atomic::Ordering::Relaxed);
    tracing::callsite::rebuild_interest_cache();
}

fn init_logging(json: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_new(log_filter(
        std::env::var("RUST_LOG").ok().as_deref(),
    ))
    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let ansi = log_ansi(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR"),
    );
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let layer = if json {
        layer.json().boxed()
    } else {
        layer.boxed()
    };
    use cloud_registry::broker_log::OversizedPacketLayer;
    use tracing_subscriber::filter::FilterExt;
    // Per-layer filters: the broker's oversized-packet report is seen by
    // its own layer even while rumqttd's log is off (see broker_log).
    tracing_subscriber::registry()
        .with(layer.with_filter(filter.and(tracing_subscriber::filter::filter_fn(keep_in_log))))
        .with(OversizedPacketLayer::with_log_thread().with_filter(OversizedPacketLayer::filter()))
        .init();
}

/// A future that resolves on SIGINT or SIGTERM. The handlers are installed
/// when this is called, not when the future is first polled, so a signal
/// sent right after the ready line is printed is not the default
/// disposition (which would kill the process without a clean stop).
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate()).ok();
        let int = signal(SignalKind::interrupt()).ok();
        async move {
            match (term, int) {
                (Some(mut term), Some(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn serve(
    config: PathBuf,
    token_file: Option<PathBuf>,
    accept_broken_chain: bool,
) -> anyhow::Result<()> {
    let mut cfg = Config::load(&config)?;
    init_logging(cfg.log.json);
    if let Some(p) = token_file {
        cfg.auth.bootstrap_admin_token_file = Some(p);
    }
    cfg.audit_log.accept_broken_chain |= accept_broken_chain;
    let watchdog = cloud_registry::notify::Watchdog::from_env();
    // A standby is up (it forwards requests) while it waits to lead.
    let standby_pings = std::sync::Arc::new(std::sync::Mutex::new(None));
    let on_standby = {
        let (watchdog, pings) = (watchdog.clone(), standby_pings.clone());
        let http = cfg.http.listen;
        Box::new(move |leader: Option<String>| {
            let line =
                serde_json::json!({"event": "standby", "http": http.to_string(), "leader": leader});
            if let Err(e) = print_out(&line.to_string()) {
                tracing::warn!(error = %e, "cannot write the standby line to stdout");
            }
            watchdog.ready(&format!(
                "standing by; forwarding HTTP to the leader {}",
                leader.as_deref().unwrap_or("(none yet)")
            ));
            let w = watchdog.clone();
            if let Ok(mut p) = pings.lock() {
                *p = Some(tokio::spawn(async move { w.keep_alive().await }));
            }
        }) as Box<dyn FnOnce(Option<String>) + Send>
    };
    // From here on: a standby (or a registry still starting) that is told
    // to stop does so with a log line and status 0, not by the signal's
    // default disposition.
    let stop = shutdown_signal();
    tokio::pin!(stop);
    let started = tokio::select! {
        s = Registry::start_replica(cfg, on_standby) => s,
        _ = &mut stop => {
            watchdog.stopping("stopping before leading");
            tracing::info!("shutdown signal received while starting or standing by; stopping");
            return Ok(());
        }
    };
    if let Some(p) = standby_pings.lock().ok().and_then(|mut p| p.take()) {
        p.abort();
    }
    let running = started.context("starting the registry")?;
    // Nobody reading the ready line is no reason to stop serving.
    if let Err(e) = print_out(&running.ready_line()) {
        tracing::warn!(error = %e, "cannot write the ready line to stdout");
    }
    watchdog.ready(&format!("serving HTTP on {}", running.http_addr));
    let fenced = async {
        while !running.lost_store_lock() {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    };
    let mut lost_lock = false;
    tokio::select! {
        _ = &mut stop => {}
        _ = watchdog.run(&running) => {}
        _ = fenced => lost_lock = true,
    }
    if lost_lock {
        tracing::error!("another registry took this store's lock: stopping (exit 75)");
        watchdog.stopping("lost the store's lock to another registry");
        quiet_broker_for_shutdown();
        running.shutdown().await;
        std::process::exit(75);
    }
    watchdog.stopping("stopping: finishing HTTP requests and lease commits");
    tracing::info!("shutdown signal received");
    quiet_broker_for_shutdown();
    running.shutdown().await;
    Ok(())
}

/// `cloud-registry audit-log ...`: read the store without migrating it
/// (a read-only connection, beside a running registry too).
fn audit_log(cmd: AuditLogCommand) -> anyhow::Result<std::process::ExitCode> {
    use cloud_registry::events::chain::{self, Checkpoint, SigningKeyFile};
    use cloud_registry::sql::Connection;
    let open = |config: &std::path::Path| -> anyhow::Result<(Config, Connection)> {
        let cfg = Config::load(config)?;
        require_store(config, &cfg, "")?;
        let conn = match (cfg.store.backend, cfg.store.url.as_deref()) {
            (cloud_registry::config::StoreBackend::Postgres, Some(url)) => {
                cloud_registry::sql::pg::PgConn::connect(url, &cfg.store.schema)
                    .map(Connection::postgres)
            }
            _ => Connection::open_read_only(&cfg.store.path),
        }
        .with_context(|| format!("opening store {}", cfg.store.describe()))?;
        Ok((cfg, conn))
    };
    let stored_public = |cfg: &Config| -> anyhow::Result<String> {
        let p = SigningKeyFile::public_path(&cfg.audit_log.key_path(&cfg.store.path));
        let text = std::fs::read_to_string(&p).with_context(|| {
            format!(
                "reading the public key {} (or pass --public-key)",
                p.display()
            )
        })?;
        Ok(text.trim().to_string())
    };
    match cmd {
        AuditLogCommand::Verify {
            config,
            public_key,
            checkpoint,
            json,
        } => {
            let (cfg, conn) = open(&config)?;
            let public_key = match public_key {
                Some(k) => k,
                None => stored_public(&cfg)?,
            };
            chain::parse_public_key(&public_key).map_err(anyhow::Error::msg)?;
            let mut extra = Vec::new();
            for f in &checkpoint {
                let text = std::fs::read_to_string(f)
                    .with_context(|| format!("reading checkpoint {}", f.display()))?;
                extra.push(
                    serde_json::from_str::<Checkpoint>(&text)
                        .with_context(|| format!("checkpoint {}", f.display()))?,
                );
            }
            let t0 = std::time::Instant::now();
            let outcome = chain::verify(&conn, 0, Some(&public_key), &extra);
            let ms = t0.elapsed().as_millis() as u64;
            let (text, code) = match outcome {
                Ok(v) if json => (
                    serde_json::json!({"ok": true, "verified": v, "ms": ms}).to_string(),
                    std::process::ExitCode::SUCCESS,
                ),
                Ok(v) => (
                    format!(
                        "ok: events {}..{} chained, head {}; {} checkpoint(s) signed by {} verified{} ({ms} ms)",
                        v.first,
                        v.last,
                        v.head_hash,
                        v.checkpoints,
                        public_key,
                        v.newest_checkpoint
                            .map(|c| format!(", the newest at event {c}"))
                            .unwrap_or_default()
                    ),
                    std::process::ExitCode::SUCCESS,
                ),
                Err(e) if json => (
                    serde_json::json!({"ok": false, "event_id": e.event_id(), "error": e.to_string()})
                        .to_string(),
                    std::process::ExitCode::FAILURE,
                ),
                Err(e) => (format!("broken: {e}"), std::process::ExitCode::FAILURE),
            };
            print_out(&text).context("writing to stdout")?;
            Ok(code)
        }
        AuditLogCommand::Checkpoint { config } => {
            let (_, conn) = open(&config)?;
            let Some(c) = chain::latest_checkpoint(&conn)? else {
                anyhow::bail!("the store has no checkpoint yet (the registry signs one at start and every audit_log.checkpoint_interval_seconds)");
            };
            print_out(&serde_json::to_string_pretty(&c)?).context("writing to stdout")?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        AuditLogCommand::PublicKey { config } => {
            let cfg = Config::load(&config)?;
            print_out(&stored_public(&cfg)?).context("writing to stdout")?;
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}

/// Write `line` and a newline to stdout and flush. A reader that went away
/// (`| head -1`) is not an error: the rest of the output is not wanted.
fn print_out(line: &str) -> std::io::Result<()> {
    write_quietly(&mut std::io::stdout().lock(), &format!("{line}\n"))
}

/// Write `text` to `w` and flush, treating a closed pipe as success.
fn write_quietly(w: &mut impl std::io::Write, text: &str) -> std::io::Result<()> {
    match w.write_all(text.as_bytes()).and_then(|()| w.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// `check-config`: 0 when usable, 2 with every problem on stderr.
fn check_config(path: &std::path::Path) -> std::process::ExitCode {
    match Config::load(path) {
        Ok(_) => match print_out(&format!("{} is valid", path.display())) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cloud-registry: writing to stdout: {e}");
                std::process::ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::from(2)
        }
    }
}

/// `e` and its causes joined with ": ", leaving out a cause whose text
/// the message before it already ends with (error types that print their
/// source themselves would otherwise show it twice).
fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cloud-registry: {}", describe(&e));
            if e.is::<StoreMissing>() {
                std::process::ExitCode::from(2)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<std::process::ExitCode> {
    let ok = |()| std::process::ExitCode::SUCCESS;
    match cli.command {
        Command::Serve {
            config,
            bootstrap_admin_token_file,
            accept_broken_chain,
        } => tokio::runtime::Runtime::new()
            .context("starting the async runtime")?
            .block_on(serve(
                config,
                bootstrap_admin_token_file,
                accept_broken_chain,
            ))
            .map(ok),
        Command::AuditLog(cmd) => audit_log(cmd),
        Command::Token {
            command:
                TokenCommand::Create {
                    config,
                    role,
                    name,
                    create_store,
                },
        } => {
            let cfg = Config::load(&config)?;
            shared_protocol::validate::check_id("name", &name)?;
            if !create_store {
                require_store(
                    &config,
                    &cfg,
                    ", or `token create --create-store` creates it now",
                )?;
            }
            let token = app::create_token_offline(&cfg, role, &name)?;
            print_out(&token)
                .context("writing the token to stdout")
                .map(ok)
        }
        Command::Token {
            command: TokenCommand::List { config, json },
        } => {
            let cfg = Config::load(&config)?;
            let db = open_existing_store(&config, &cfg)?;
            let tokens = db.write_blocking(|c| cloud_registry::auth::list_tokens_sync(c))??;
            let text = if json {
                format!("{}\n", serde_json::json!({ "tokens": tokens }))
            } else {
                token_table(&tokens)
            };
            write_quietly(&mut std::io::stdout().lock(), &text)
                .context("writing to stdout")
                .map(ok)
        }
        Command::Token {
            command: TokenCommand::Revoke { config, name },
        } => {
            let cfg = Config::load(&config)?;
            shared_protocol::validate::check_id("name", &name)?;
            let db = open_existing_store(&config, &cfg)?;
            let who = name.clone();
            match db
                .write_blocking(move |c| cloud_registry::auth::revoke_tokens_sync(c, &who))??
            {
                Revoked::UnknownName => anyhow::bail!("no token named `{name}`"),
                Revoked::Tokens(n) => print_out(&format!("revoked {n} token(s) of `{name}`"))
                    .context("writing to stdout")
                    .map(ok),
            }
        }
        Command::Backup {
            config,
            to,
            pages_per_step,
            pause_ms,
        } => {
            let cfg = Config::load(&config)?;
            anyhow::ensure!(
                cfg.store.backend == cloud_registry::config::StoreBackend::Sqlite,
                "backup copies a SQLite store; back a PostgreSQL store up with pg_dump or the server's base backups (docs/scale.md)"
            );
            let from = &cfg.store.path;
            anyhow::ensure!(
                from.exists(),
                "store {} does not exist (check store.path in the config)",
                from.display()
            );
            anyhow::ensure!(pages_per_step > 0, "--pages-per-step must be at least 1");
            let report = cloud_registry::db::backup(
                from,
                &to,
                pages_per_step,
                std::time::Duration::from_millis(pause_ms),
            )
            .with_context(|| format!("backing up {} to {}", from.display(), to.display()))?;
            print_out(&serde_json::to_string(&report)?)
                .context("writing to stdout")
                .map(ok)
        }
        Command::CheckConfig { config } => Ok(check_config(&config)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_broker_log_is_off_unless_rust_log_names_it() {
        assert_eq!(log_filter(None), "info,rumqttd=off");
        assert_eq!(log_filter(Some(" ")), "info,rumqttd=off");
        assert_eq!(log_filter(Some("warn")), "warn,rumqttd=off");
        assert_eq!(log_filter(Some("debug,rumqttd=warn")), "debug,rumqttd=warn");
    }

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(log_ansi(true, None));
        assert!(log_ansi(true, Some("".into())));
        assert!(!log_ansi(true, Some("1".into())));
        assert!(!log_ansi(false, None));
    }
}
