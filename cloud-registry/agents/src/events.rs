//! What the agent runtime tells the registry's event stream: a run created
//! or changed (status, a step added or finished), a proposal created or
//! changed (applied, rejected, a refused apply).
//!
//! The runtime only describes the change ([`AgentEvent`]); the registry
//! implements [`AgentEventSink`] to append it to its event log, which gives
//! it an `event_id`, stores it and streams it like every other event.
//! Payloads are small (ids, status, type, title): a page that shows more
//! fetches the run or proposal.

use serde_json::{json, Value};
use shared_protocol::agent::{AgentProposal, AgentRun, AgentStep};
use shared_protocol::event::EventType;

/// One change of a run or proposal, already committed to the store.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentEvent {
    /// `agent_run_created`, `agent_run_updated`, `agent_proposal_created`
    /// or `agent_proposal_updated`.
    pub event_type: EventType,
    /// The principal whose request caused it.
    pub actor: String,
    /// `{run_id, run_type, status, title, created_by}` for a run, with
    /// `step: {step_id, step_index, step_type, name, status}` when a step
    /// was added or ended; `{proposal_id, run_id, proposal_type, status,
    /// risk_level}` for a proposal.
    pub data: Value,
}

impl AgentEvent {
    /// `agent_run_created` for a run just inserted.
    pub fn run_created(run: &AgentRun) -> AgentEvent {
        AgentEvent {
            event_type: EventType::AgentRunCreated,
            actor: run.created_by.clone(),
            data: run_data(run),
        }
    }

    /// `agent_run_updated`: `run`'s status changed, or `step` was added to
    /// it or ended.
    pub fn run_updated(run: &AgentRun, step: Option<&AgentStep>) -> AgentEvent {
        let mut data = run_data(run);
        if let Some(s) = step {
            data["step"] = json!({
                "step_id": s.id,
                "step_index": s.step_index,
                "step_type": s.step_type,
                "name": s.name,
                "status": s.status,
            });
        }
        AgentEvent {
            event_type: EventType::AgentRunUpdated,
            actor: run.created_by.clone(),
            data,
        }
    }

    /// `agent_proposal_created` (`created`) or `agent_proposal_updated` for
    /// `p` as it now stands, caused by `actor`.
    pub fn proposal(p: &AgentProposal, created: bool, actor: impl Into<String>) -> AgentEvent {
        AgentEvent {
            event_type: if created {
                EventType::AgentProposalCreated
            } else {
                EventType::AgentProposalUpdated
            },
            actor: actor.into(),
            data: json!({
                "proposal_id": p.id,
                "run_id": p.run_id,
                "proposal_type": p.proposal_type,
                "status": p.status,
                "risk_level": p.risk_level,
            }),
        }
    }
}

fn run_data(run: &AgentRun) -> Value {
    json!({
        "run_id": run.public_id,
        "run_type": run.run_type,
        "status": run.status,
        "title": run.title,
        "created_by": run.created_by,
    })
}

/// Where the runtime hands its events, after the change committed. Called
/// on a tokio worker or a store thread: it must not block (queue the event
/// and append it elsewhere). Events of one store are handed over in the
/// order their changes committed.
pub trait AgentEventSink: Send + Sync {
    /// Take one event.
    fn publish(&self, event: AgentEvent);
}

/// The sink of a runtime without an event stream (tools, tests): drops
/// every event.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEvents;

impl AgentEventSink for NoEvents {
    fn publish(&self, _event: AgentEvent) {}
}
