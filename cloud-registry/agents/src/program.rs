//! Running a local program on a file, for the `command` speech provider
//! ([`crate::speech_command`]) and the registry's OCR of derived evidence
//! (docs/audit-trail.md "Derived evidence"): `{input}` in the configured
//! command line is the file, stdin is empty, stdout and stderr are kept up
//! to [`MAX_OUTPUT_BYTES`] each, and the program is killed when it runs
//! past its timeout (tokio::process, so no worker thread waits on it).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

/// Most bytes of a program's stdout (and of its stderr) kept.
pub const MAX_OUTPUT_BYTES: u64 = 1 << 20;

/// Longest end of a failed program's stderr quoted in its error, chars.
pub const STDERR_TAIL_CHARS: usize = 500;

/// Why a program gave no output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgramError {
    /// It could not be started (not installed, not executable), or waiting
    /// for it failed.
    #[error("cannot start `{program}`: {message}")]
    Spawn { program: String, message: String },
    /// It ran past its timeout and was killed.
    #[error("`{program}` did not finish within {seconds} s (killed)")]
    Timeout { program: String, seconds: u64 },
    /// It exited unsuccessfully; `stderr` is the end of what it wrote there.
    #[error("`{program}` exited with {status}: {stderr}")]
    Failed {
        program: String,
        status: String,
        stderr: String,
    },
}

/// `command` with each `{input}` replaced by `input`.
pub fn fill(command: &[String], input: &Path) -> Vec<String> {
    let path = input.to_string_lossy();
    command
        .iter()
        .map(|a| a.replace("{input}", &path))
        .collect()
}

/// Run `command` (`{input}` = `input`), killed after `timeout`; its stdout
/// (lossy UTF-8, at most [`MAX_OUTPUT_BYTES`]) on success.
///
/// Errors: see [`ProgramError`].
pub async fn run(
    command: &[String],
    input: &Path,
    timeout: Duration,
) -> Result<String, ProgramError> {
    let args = fill(command, input);
    let program = args.first().cloned().unwrap_or_default();
    let mut child = tokio::process::Command::new(&program)
        .args(args.get(1..).unwrap_or_default())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ProgramError::Spawn {
            program: program.clone(),
            message: e.to_string(),
        })?;
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let work = async {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let read_out = async {
            if let Some(s) = stdout.as_mut() {
                let _ = s.take(MAX_OUTPUT_BYTES).read_to_end(&mut out).await;
            }
        };
        let read_err = async {
            if let Some(s) = stderr.as_mut() {
                let _ = s.take(MAX_OUTPUT_BYTES).read_to_end(&mut err).await;
            }
        };
        tokio::join!(read_out, read_err);
        (child.wait().await, out, err)
    };
    let (status, out, err) =
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| ProgramError::Timeout {
                program: program.clone(),
                seconds: timeout.as_secs(),
            })?;
    let status = status.map_err(|e| ProgramError::Spawn {
        program: program.clone(),
        message: e.to_string(),
    })?;
    if !status.success() {
        let err = String::from_utf8_lossy(&err);
        let err = err.trim();
        let skip = err.chars().count().saturating_sub(STDERR_TAIL_CHARS);
        return Err(ProgramError::Failed {
            program,
            status: status.to_string(),
            stderr: err.chars().skip(skip).collect(),
        });
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into(), "{input}".into()]
    }

    #[tokio::test]
    async fn runs_on_the_file_and_names_each_way_it_can_fail() {
        let t = Duration::from_secs(5);
        let input = Path::new("/some/file.wav");
        assert_eq!(
            run(&sh("echo \"got $0\""), input, t).await.unwrap(),
            "got /some/file.wav\n"
        );
        match run(&sh("echo bad >&2; exit 3"), input, t).await {
            Err(ProgramError::Failed { status, stderr, .. }) => {
                assert!(status.contains('3'), "{status}");
                assert_eq!(stderr, "bad");
            }
            other => panic!("{other:?}"),
        }
        let missing = vec!["/no/such/recogniser".to_string()];
        assert!(matches!(
            run(&missing, input, t).await,
            Err(ProgramError::Spawn { .. })
        ));
        let slow = run(&sh("sleep 5"), input, Duration::from_millis(200)).await;
        assert!(
            matches!(slow, Err(ProgramError::Timeout { .. })),
            "{slow:?}"
        );
    }
}
