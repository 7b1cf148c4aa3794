//! The live view's way out of the drivers: a camera stream offers a frame
//! now and then ([`offer`]); the MQTT link publishes it on the `frames`
//! topic (QoS 0, not retained) or drops it. Process-wide, set once by the
//! daemon ([`set_sink`]); without a sink (tests, `edge-agent probe`)
//! frames go nowhere.

use std::sync::OnceLock;

use shared_protocol::mqtt::LiveFrame;
use tokio::sync::mpsc;

/// One frame (or a stream's end) for the `frames` topic.
#[derive(Debug)]
pub struct LiveMessage {
    pub header: LiveFrame,
    /// Empty for an end.
    pub jpeg: Vec<u8>,
}

static SINK: OnceLock<mpsc::Sender<LiveMessage>> = OnceLock::new();

/// Where offered frames go from now on. Only the first call counts.
pub fn set_sink(tx: mpsc::Sender<LiveMessage>) {
    let _ = SINK.set(tx);
}

/// Hand `msg` to the link without waiting; false when it was dropped (no
/// sink, or the link is behind: a live view wants the newest frame, not a
/// queue).
pub fn offer(msg: LiveMessage) -> bool {
    SINK.get().is_some_and(|tx| tx.try_send(msg).is_ok())
}
