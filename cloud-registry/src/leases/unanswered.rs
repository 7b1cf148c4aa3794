//! Leases whose requester has not taken its answer yet, and what happens
//! to them when it never will.
//!
//! ```text
//!   submitted ──(answer taken)──► answered: the requester knows the ids
//!       │
//!       └──(guard dropped first)──► given up: withdrawn if `requested`,
//!                                   released if `granted`
//! ```
//!
//! [`Unanswered`] is created in the same critical section that admits a
//! request, before any `.await`, so a caller whose future is dropped at
//! any point afterwards (while the commit is in flight, while it waits for
//! the grant, while its answer waits to be taken by the connection) gives
//! the leases up: nobody else could ever name them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::LeaseEngine;

/// Where a request was when its requester went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The request was admitted; its commit was in flight.
    Committing,
    /// Committed `requested`; the caller was waiting for the grant.
    WaitingForGrant,
    /// The answer was ready but the transport never took it (e.g. HTTP
    /// connection closed before the response body was polled).
    AnswerNotTaken,
}

impl Stage {
    /// As logged and in metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Committing => "committing",
            Stage::WaitingForGrant => "waiting_for_grant",
            Stage::AnswerNotTaken => "answer_not_taken",
        }
    }

    const ALL: [Stage; 3] = [
        Stage::Committing,
        Stage::WaitingForGrant,
        Stage::AnswerNotTaken,
    ];

    fn index(self) -> usize {
        match self {
            Stage::Committing => 0,
            Stage::WaitingForGrant => 1,
            Stage::AnswerNotTaken => 2,
        }
    }
}

/// Counters of answered and given-up requests since the engine started.
#[derive(Debug, Default)]
pub(crate) struct AnswerCounters {
    answered: AtomicU64,
    given_up: [AtomicU64; 3],
    given_up_leases: AtomicU64,
}

/// What [`LeaseEngine::answer_stats`] reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerStats {
    /// Requests (single or group) whose answer was taken by the requester.
    pub answered: u64,
    /// Requests given up because the requester went away first, by
    /// [`Stage`] (`committing`, `waiting_for_grant`, `answer_not_taken`).
    pub given_up: Vec<(String, u64)>,
    /// Leases those given-up requests held or waited for.
    pub given_up_leases: u64,
}

impl AnswerCounters {
    pub(crate) fn stats(&self) -> AnswerStats {
        AnswerStats {
            answered: self.answered.load(Ordering::Relaxed),
            given_up: Stage::ALL
                .iter()
                .map(|s| {
                    (
                        s.as_str().to_string(),
                        self.given_up[s.index()].load(Ordering::Relaxed),
                    )
                })
                .collect(),
            given_up_leases: self.given_up_leases.load(Ordering::Relaxed),
        }
    }
}

/// The leases of one request until its requester has taken the answer.
/// Dropped before [`answered`](Self::answered), it gives them up through
/// [`LeaseEngine::abandon`]'s rules (withdraw `requested`, release
/// `granted`, leave anything else) synchronously, in the drop, and logs
/// the give-up at info with the lease ids and the [`Stage`].
///
/// An empty guard (a replayed idempotent request: the first answer was
/// taken already) does nothing.
#[must_use = "dropping it gives the leases up"]
pub struct Unanswered {
    engine: Arc<LeaseEngine>,
    lease_ids: Vec<String>,
    stage: Stage,
}

impl Unanswered {
    pub(crate) fn new(engine: Arc<LeaseEngine>, lease_ids: Vec<String>) -> Self {
        Self {
            engine,
            lease_ids,
            stage: Stage::Committing,
        }
    }

    /// The lease ids it would give up (empty for a replay).
    pub fn lease_ids(&self) -> &[String] {
        &self.lease_ids
    }

    /// Record where the request is now (for the log and the metrics).
    pub fn set_stage(&mut self, stage: Stage) {
        self.stage = stage;
    }

    /// The requester has the answer: keep the leases.
    pub fn answered(mut self) {
        if !self.lease_ids.is_empty() {
            self.engine.answers.answered.fetch_add(1, Ordering::Relaxed);
        }
        self.lease_ids.clear();
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if self.lease_ids.is_empty() {
            return;
        }
        let lease_ids = std::mem::take(&mut self.lease_ids);
        let stage = self.stage.as_str();
        let counters = &self.engine.answers;
        counters.given_up[self.stage.index()].fetch_add(1, Ordering::Relaxed);
        counters
            .given_up_leases
            .fetch_add(lease_ids.len() as u64, Ordering::Relaxed);
        let rx = match self.engine.give_up(&lease_ids) {
            Ok(rx) => rx,
            Err(e) => {
                tracing::warn!(?lease_ids, stage, error = %e,
                    "requester went away before its answer; could not give its leases up");
                return;
            }
        };
        tracing::info!(
            ?lease_ids,
            stage,
            "requester went away before it took its answer; its leases are given up"
        );
        // The model already changed; only the commit's outcome is left to
        // report.
        if let (Some(rx), Ok(runtime)) = (rx, tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move {
                if let Err(e) = super::committed(Some(rx)).await {
                    tracing::warn!(?lease_ids, error = %e,
                        "the give-up of an unanswered lease request was not committed");
                }
            });
        }
    }
}
