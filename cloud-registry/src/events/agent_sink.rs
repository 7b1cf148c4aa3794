//! The agent runtime's events into the event log: [`AgentEventLog`]
//! implements [`AgentEventSink`] by queueing each event and appending it
//! (in order, one transaction each) from its own task, so they get ids, are
//! stored and streamed like the others.

use registry_agents::events::{AgentEvent, AgentEventSink};
use tokio::sync::mpsc;

use super::{EventBus, NewEvent};

/// An [`AgentEventSink`] over the registry's [`EventBus`]. `publish` never
/// blocks: it queues the event; a task appends the queue in order.
#[derive(Clone)]
pub struct AgentEventLog {
    tx: mpsc::UnboundedSender<AgentEvent>,
}

impl AgentEventLog {
    /// Start the appending task (call inside the runtime). It ends when
    /// every handle is dropped, after appending what was queued.
    pub fn start(bus: EventBus) -> AgentEventLog {
        let (tx, mut rx) = mpsc::unbounded_channel::<AgentEvent>();
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                let event_type = ev.event_type;
                if let Err(e) = bus
                    .emit(NewEvent::new(ev.event_type, ev.actor, ev.data))
                    .await
                {
                    tracing::error!(%event_type, error = %e, "agent event not recorded");
                }
            }
        });
        AgentEventLog { tx }
    }
}

impl AgentEventSink for AgentEventLog {
    fn publish(&self, event: AgentEvent) {
        if self.tx.send(event).is_err() {
            tracing::warn!("agent event dropped: the event log is shut down");
        }
    }
}
