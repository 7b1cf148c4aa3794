//! Child processes that never outlive their test.

use std::ops::{Deref, DerefMut};
use std::process::Child;

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
