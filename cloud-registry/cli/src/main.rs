//! `benchlink`: the registry's command-line client (see docs/cli.md).

use std::process::ExitCode;

use benchlink::cli::{Cli, Command};
use benchlink::client::Agent;
use benchlink::config::Given;
use benchlink::exit::{Failure, OK};
use benchlink::run::{run, Ctx};
use clap::{CommandFactory, Parser};

fn main() -> ExitCode {
    // Rust ignores SIGPIPE, so a reader that stops early (`| head`) would
    // make every later `println!` panic; like other Unix tools, end
    // quietly instead.
    // SAFETY: called before any thread starts; SIG_DFL is a valid action.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    let json = cli.global.json;
    match execute(cli) {
        Ok(()) => ExitCode::from(OK),
        Err(f) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"error": {"exit_code": f.code, "message": f.message, "answer": f.body}})
                );
            }
            eprintln!("benchlink: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// Write `bytes` to stdout; a reader that stopped early (`| head`) is
/// not an error.
fn print_all(bytes: &[u8]) -> Result<(), Failure> {
    use std::io::Write;
    match std::io::stdout().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Failure::new(benchlink::exit::API, format!("stdout: {e}")))
        }
        _ => Ok(()),
    }
}

/// `verify-bundle`: offline, so before any settings are read. Exit 1
/// (with `{"ok": false, "file", "error"}` under `--json`) on a failed check.
fn verify_bundle(file: &std::path::Path, public_key: &str, json: bool) -> Result<(), Failure> {
    let f = std::fs::File::open(file)
        .map_err(|e| Failure::usage(format!("{}: {e}", file.display())))?;
    match benchlink::bundle::verify(std::io::BufReader::new(f), public_key) {
        Ok(v) => {
            let text = if json {
                let mut doc = serde_json::json!({"ok": true});
                doc["verified"] = serde_json::to_value(&v).unwrap_or_default();
                format!("{doc}\n")
            } else {
                v.render()
            };
            print_all(text.as_bytes())
        }
        Err(e) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"ok": false, "file": e.file, "error": e.reason})
                );
                // The one JSON document is printed: only the exit code and
                // stderr's line remain.
                eprintln!("benchlink: bundle does not verify: {e}");
                std::process::exit(i32::from(benchlink::exit::INVALID));
            }
            Err(Failure::new(
                benchlink::exit::INVALID,
                format!("bundle does not verify: {e}"),
            ))
        }
    }
}

fn execute(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Completions { shell } => {
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "benchlink", &mut buf);
            return print_all(&buf);
        }
        Command::Man => {
            let mut buf = Vec::new();
            clap_mangen::Man::new(Cli::command())
                .render(&mut buf)
                .map_err(|e| Failure::new(benchlink::exit::API, format!("man page: {e}")))?;
            return print_all(&buf);
        }
        Command::VerifyBundle { file, public_key } => {
            return verify_bundle(&file, &public_key, cli.global.json);
        }
        _ => {}
    }
    let g = cli.global;
    let mut given = Given::from_values(g.url, g.token, g.token_file, g.config);
    given.ca_file = g
        .ca_file
        .filter(|f| !f.trim().is_empty())
        .map(std::path::PathBuf::from);
    let settings = given.resolve()?;
    let agent = Agent::with_ca_file(
        &settings.url,
        "",
        &settings.token,
        settings.ca_file.as_deref(),
    )
    .map_err(Failure::usage)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(benchlink::exit::API, format!("tokio runtime: {e}")))?;
    rt.block_on(async move {
        if let Command::Mcp = cli.command {
            return benchlink::mcp::serve_stdio(agent).await;
        }
        run(
            &Ctx {
                agent,
                json: g.json,
            },
            cli.command,
        )
        .await
    })
}
