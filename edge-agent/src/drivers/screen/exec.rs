//! Running a configured external tool (screenshot grabber, screen
//! recorder, OCR engine, TTS engine) safely: no shell, arguments templated
//! one by one, a timeout, and stderr in the error.
//!
//! A template such as `espeak-ng -w {out} {text}` is split into words once
//! (double or single quotes group words; no other shell syntax exists).
//! Placeholders are substituted *inside* each word, so a value can never
//! become extra arguments, pipes or redirections. A value that starts with
//! `-` gets a leading space so that the tool cannot read it as an option.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::drivers::{CancelToken, DriverError};

/// A parsed command template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandTemplate {
    /// The words; the first is the program.
    words: Vec<String>,
    source: String,
}

impl CommandTemplate {
    /// Split `template` into words. Errors on an empty template or an
    /// unclosed quote.
    pub fn parse(template: &str) -> Result<Self, String> {
        let mut words = Vec::new();
        let mut cur = String::new();
        let mut in_word = false;
        let mut quote: Option<char> = None;
        for c in template.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), c) => cur.push(c),
                (None, '"' | '\'') => {
                    quote = Some(c);
                    in_word = true;
                }
                (None, c) if c.is_whitespace() => {
                    if in_word {
                        words.push(std::mem::take(&mut cur));
                        in_word = false;
                    }
                }
                (None, c) => {
                    cur.push(c);
                    in_word = true;
                }
            }
        }
        if quote.is_some() {
            return Err(format!("unclosed quote in `{template}`"));
        }
        if in_word {
            words.push(cur);
        }
        if words.is_empty() {
            return Err("empty command".into());
        }
        Ok(Self {
            words,
            source: template.to_string(),
        })
    }

    /// The program (first word).
    pub fn program(&self) -> &str {
        &self.words[0]
    }

    /// True when some word contains `{name}`.
    pub fn uses(&self, name: &str) -> bool {
        let p = format!("{{{name}}}");
        self.words.iter().any(|w| w.contains(&p))
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Substitute `{name}` placeholders; returns program and arguments.
    pub fn render(&self, vars: &[(&str, &str)]) -> (String, Vec<String>) {
        let mut out: Vec<String> = self
            .words
            .iter()
            .map(|w| {
                let mut w = w.clone();
                for (name, value) in vars {
                    let p = format!("{{{name}}}");
                    if w.contains(&p) {
                        let v = if value.starts_with('-') {
                            format!(" {value}")
                        } else {
                            value.to_string()
                        };
                        w = w.replace(&p, &v);
                    }
                }
                w
            })
            .collect();
        let program = out.remove(0);
        (program, out)
    }
}

/// What a finished command produced.
#[derive(Debug, Clone)]
pub struct CommandOutput {
    pub stdout: Vec<u8>,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Longest stderr excerpt carried in an error.
const STDERR_EXCERPT: usize = 2000;

fn excerpt(stderr: &str) -> String {
    let t = stderr.trim();
    if t.len() <= STDERR_EXCERPT {
        return t.to_string();
    }
    let mut start = t.len() - STDERR_EXCERPT;
    while !t.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &t[start..])
}

/// Run `program args` without a shell, stdin closed, waiting at most
/// `timeout` (the child is killed past it) and stopping early when
/// `cancel` fires. A non-zero exit is an error carrying stderr.
pub fn run(
    program: &str,
    args: &[String],
    timeout: Duration,
    cancel: Option<&CancelToken>,
) -> Result<CommandOutput, DriverError> {
    let started = Instant::now();
    let shown = std::iter::once(program.to_string())
        .chain(args.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = Command::new(program)
        .args(args)
        // Its own process group, so that a timeout also ends whatever the
        // tool started (ffmpeg helpers, shell wrappers).
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| DriverError::Unavailable(format!("cannot run `{program}`: {e}")))?;
    // Drain both pipes on threads so a chatty tool cannot block on a full
    // pipe while we wait for it.
    let mut out_pipe = child.stdout.take();
    let mut err_pipe = child.stderr.take();
    let (out_tx, out_rx) = mpsc::channel();
    let (err_tx, err_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(p) = out_pipe.as_mut() {
            let _ = p.read_to_end(&mut v);
        }
        let _ = out_tx.send(v);
    });
    std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(p) = err_pipe.as_mut() {
            let _ = p.read_to_end(&mut v);
        }
        let _ = err_tx.send(String::from_utf8_lossy(&v).into_owned());
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Ok(s),
            Ok(None) => {}
            Err(e) => break Err(format!("waiting for `{shown}` failed: {e}")),
        }
        let why = if started.elapsed() >= timeout {
            Some(format!(
                "timed out after {} ms (killed)",
                timeout.as_millis()
            ))
        } else if cancel.is_some_and(|c| c.is_cancelled()) {
            Some("cancelled (killed)".to_string())
        } else {
            None
        };
        if let Some(why) = why {
            kill_group(&mut child);
            break Err(why);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // A leftover grandchild may hold the pipes open; do not wait for it.
    let stdout = out_rx.recv_timeout(PIPE_GRACE).unwrap_or_default();
    let stderr = err_rx.recv_timeout(PIPE_GRACE).unwrap_or_default();
    match status {
        Ok(s) if s.success() => Ok(CommandOutput {
            stdout,
            stderr,
            elapsed: started.elapsed(),
        }),
        Ok(s) => Err(DriverError::Device(format!(
            "`{shown}` failed ({s}); stderr: {}",
            excerpt(&stderr)
        ))),
        Err(why) if why.starts_with("cancelled") => {
            Err(DriverError::Cancelled(format!("`{shown}` {why}")))
        }
        Err(why) => Err(DriverError::Device(format!(
            "`{shown}` {why}; stderr: {}",
            excerpt(&stderr)
        ))),
    }
}

/// How long output is still collected after the tool exited.
const PIPE_GRACE: Duration = Duration::from_secs(1);

fn kill_group(child: &mut std::process::Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) with a negative pid signals the process group we
        // created for this child; it touches no memory.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// True when `program` can be started: an existing path, or a name found
/// in `PATH`.
pub fn program_exists(program: &str) -> bool {
    if program.contains('/') {
        return std::path::Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_split_on_spaces_and_respect_quotes() {
        let t = CommandTemplate::parse(r#"ffmpeg -f x11grab -i ":0.0" -t {duration_s} "{out}""#)
            .unwrap();
        assert_eq!(t.program(), "ffmpeg");
        let (p, args) = t.render(&[("duration_s", "2.5"), ("out", "/tmp/a b.mp4")]);
        assert_eq!(p, "ffmpeg");
        assert_eq!(
            args,
            vec!["-f", "x11grab", "-i", ":0.0", "-t", "2.5", "/tmp/a b.mp4"]
        );
        assert!(CommandTemplate::parse("say 'unclosed").is_err());
        assert!(CommandTemplate::parse("   ").is_err());
    }

    #[test]
    fn a_value_cannot_become_an_option_or_extra_arguments() {
        let t = CommandTemplate::parse("espeak-ng -w {out} {text}").unwrap();
        let (_, args) = t.render(&[("out", "/tmp/x.wav"), ("text", "-w /etc/passwd; rm -rf /")]);
        assert_eq!(args.len(), 3);
        assert_eq!(args[2], " -w /etc/passwd; rm -rf /");
    }

    #[test]
    fn a_failing_command_reports_its_stderr() {
        let e = run(
            "sh",
            &["-c".into(), "echo boom >&2; exit 3".into()],
            Duration::from_secs(5),
            None,
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("boom") && msg.contains("3"), "{msg}");
    }

    #[test]
    fn a_slow_command_and_its_children_are_killed_at_its_timeout() {
        let t0 = Instant::now();
        let e = run(
            "sh",
            &["-c".into(), "sleep 5; echo late".into()],
            Duration::from_millis(200),
            None,
        )
        .unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert!(e.to_string().contains("timed out after 200 ms"), "{e}");
    }

    #[test]
    fn a_missing_program_is_unavailable() {
        let e = run("no-such-tool-xyz", &[], Duration::from_secs(1), None).unwrap_err();
        assert!(matches!(e, DriverError::Unavailable(_)), "{e:?}");
        assert!(!program_exists("no-such-tool-xyz"));
        assert!(program_exists("sh"));
    }
}
