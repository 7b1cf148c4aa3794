//! Following the event log in `event_id` order with nothing lost and
//! nothing twice, for consumers that must see every event: SSE clients and
//! the MQTT command forwarder.
//!
//! The follower subscribes to the live bus *before* reading the table, then
//! hands out events strictly in id order:
//! - a live event at or below the last handed-out id is skipped (it was
//!   replayed already);
//! - a live event further ahead than the next id means an earlier commit
//!   was published late or not seen yet: the missing range is read from the
//!   table first (commits are serialized by the single writer, so it is
//!   there);
//! - a lagged receiver (the bus dropped events for it) yields
//!   [`Followed::Gap`] once, then the missed range is replayed from the
//!   table.

use std::collections::VecDeque;
use std::sync::Arc;

use shared_protocol::event::CapabilityEvent;
use tokio::sync::broadcast::{self, error::RecvError};

use crate::db::DbError;
use crate::events::EventBus;

/// Events read from the table per query.
const PAGE: usize = 500;

/// What [`EventFollower::next`] yields.
#[derive(Debug, Clone)]
pub enum Followed {
    /// The next event in id order (shared: the live bus hands every
    /// follower the same allocation).
    Event(Arc<CapabilityEvent>),
    /// The live channel dropped events for this follower; they will be
    /// replayed from the table next. `to_event_id` is the newest id known
    /// when the gap was noticed.
    Gap {
        from_event_id: u64,
        to_event_id: u64,
    },
    /// The bus is gone (registry shutting down).
    Closed,
}

/// An ordered, lossless reader of the event log starting after an id.
pub struct EventFollower {
    bus: EventBus,
    rx: broadcast::Receiver<Arc<CapabilityEvent>>,
    /// Highest id handed out (or skipped by the caller's filter).
    last: u64,
    /// Replay the table until it returns nothing before reading live.
    catching_up: bool,
    /// Replay until at least this id has been handed out.
    fill_to: u64,
    buffer: VecDeque<CapabilityEvent>,
}

impl EventFollower {
    /// Follow events with `event_id > after`. Subscribes to the bus at
    /// once, so nothing committed from now on can be missed.
    pub fn new(bus: EventBus, after: u64) -> Self {
        let rx = bus.subscribe_shared();
        Self {
            bus,
            rx,
            last: after,
            catching_up: true,
            fill_to: 0,
            buffer: VecDeque::new(),
        }
    }

    /// Start after `after` instead (call before the first [`Self::next`]).
    pub fn skip_to(&mut self, after: u64) {
        self.last = after;
    }

    /// The id of the last event handed out.
    pub fn last_id(&self) -> u64 {
        self.last
    }

    async fn replay_page(&mut self) -> Result<usize, DbError> {
        let page = self.bus.replay(self.last, PAGE).await?;
        let n = page.len();
        self.buffer.extend(page);
        Ok(n)
    }

    fn take_buffered(&mut self) -> Option<Arc<CapabilityEvent>> {
        while let Some(ev) = self.buffer.pop_front() {
            if ev.event_id > self.last {
                self.last = ev.event_id;
                return Some(Arc::new(ev));
            }
        }
        None
    }

    /// The next event in id order (waiting for one), or a gap notice.
    ///
    /// Errors: the table could not be read.
    pub async fn next(&mut self) -> Result<Followed, DbError> {
        loop {
            if let Some(ev) = self.take_buffered() {
                return Ok(Followed::Event(ev));
            }
            if self.catching_up {
                if self.replay_page().await? == 0 {
                    self.catching_up = false;
                }
                continue;
            }
            if self.fill_to > self.last {
                if self.replay_page().await? == 0 {
                    // The range is not in the table (a rolled-back id):
                    // nothing to wait for.
                    self.fill_to = 0;
                }
                continue;
            }
            match self.rx.recv().await {
                Ok(ev) if ev.event_id <= self.last => continue,
                Ok(ev) if ev.event_id == self.last + 1 => {
                    self.last = ev.event_id;
                    return Ok(Followed::Event(ev));
                }
                Ok(ev) => {
                    self.fill_to = ev.event_id;
                    self.buffer.clear();
                }
                Err(RecvError::Lagged(missed)) => {
                    let from = self.last + 1;
                    self.catching_up = true;
                    return Ok(Followed::Gap {
                        from_event_id: from,
                        to_event_id: (self.last + missed).max(from),
                    });
                }
                Err(RecvError::Closed) => return Ok(Followed::Closed),
            }
        }
    }
}
