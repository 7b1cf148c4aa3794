//! Device simulators that speak real wire protocols on pseudo-terminals.
