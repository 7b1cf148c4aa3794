//! Child processes that never outlive their test.

use std::io::{BufRead, BufReader};
use std::ops::{Deref, DerefMut};
use std::process::Child;
use std::sync::mpsc;

/// A child process killed (SIGKILL) and reaped when dropped, also when the
/// test panics. Derefs to the [`Child`].
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    /// Kill and reap now (dropping does the same).
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Take `child`'s piped stdout and hand over each line it prints on the
/// returned channel (read by a thread of its own, ending with the
/// process's output).
///
/// Panics: stdout was not piped or was taken already.
pub fn stdout_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("stdout piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}
