//! The one message of the embedded broker's own log the registry keeps at
//! its default log level: a client's packet over the size limit.
//!
//! rumqttd's log is off unless `RUST_LOG` names it (see `main.rs`): it
//! reports ordinary disconnects as errors. But when a client sends a
//! packet over `max_payload_size`, rumqttd only logs
//! `error = Network(Protocol(PayloadSizeLimitExceeded(N)))`, "disconnected"
//! inside its `remote_link` span (which holds the client id) and closes
//! the connection. [`OversizedPacketLayer`] watches for exactly that event
//! and hands it, with the span's client id, to a thread that logs it as a
//! registry `WARN` (target `cloud_registry::broker`). Logging from that
//! thread, not from inside the layer's callback, keeps the subscriber from
//! being entered again while it dispatches.

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The embedded broker's packet limit, bytes (0 until it starts).
static BROKER_PACKET_LIMIT: AtomicUsize = AtomicUsize::new(0);

/// Record the embedded broker's `max_payload_size`, bytes, for the log.
pub fn set_broker_packet_limit(bytes: usize) {
    BROKER_PACKET_LIMIT.store(bytes, Ordering::Relaxed);
}

/// One packet rumqttd refused for its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OversizedPacket {
    /// The MQTT client id of the connection that sent it (`None` when the
    /// packet came before the CONNECT was read).
    pub client_id: Option<String>,
    /// The packet's remaining length as its fixed header declared it, bytes.
    pub packet_bytes: Option<usize>,
}

/// A tracing layer that reports rumqttd's "packet over the size limit"
/// disconnects (see the module docs). Put it on the registry's subscriber
/// with [`OversizedPacketLayer::filter`] as its per-layer filter.
pub struct OversizedPacketLayer {
    tx: mpsc::Sender<OversizedPacket>,
}

/// The client id recorded on a rumqttd `remote_link` span.
struct LinkClient(Option<String>);

impl OversizedPacketLayer {
    /// The layer and the receiving end of its reports.
    pub fn new() -> (Self, mpsc::Receiver<OversizedPacket>) {
        let (tx, rx) = mpsc::channel();
        (Self { tx }, rx)
    }

    /// The layer and a thread that logs each report as a `WARN` naming
    /// the client, the packet's size and the limit (bytes).
    pub fn with_log_thread() -> Self {
        let (layer, rx) = Self::new();
        let spawned = std::thread::Builder::new()
            .name("broker-log".into())
            .spawn(move || {
                for p in rx {
                    tracing::warn!(
                        target: "cloud_registry::broker",
                        client_id = p.client_id.as_deref().unwrap_or("(not connected yet)"),
                        packet_bytes = p.packet_bytes,
                        limit_bytes = BROKER_PACKET_LIMIT.load(Ordering::Relaxed),
                        "MQTT packet over the size limit; the embedded broker closed the client's connection"
                    );
                }
            });
        if let Err(e) = spawned {
            eprintln!("cannot start the broker-log thread: {e}");
        }
        layer
    }

    /// What the layer needs to see: rumqttd's `remote_link` spans (one per
    /// connection) and its error events. Nothing else of rumqttd is
    /// enabled for it (its per-packet spans stay off).
    pub fn filter<S>() -> impl tracing_subscriber::layer::Filter<S> {
        tracing_subscriber::filter::filter_fn(|meta: &Metadata<'_>| {
            meta.target().starts_with("rumqttd")
                && if meta.is_span() {
                    meta.name() == "remote_link"
                } else {
                    *meta.level() == Level::ERROR
                }
        })
    }
}

/// Collects the `client_id`, `error` and `message` fields.
#[derive(Default)]
struct Fields {
    client_id: Option<String>,
    error: Option<String>,
    message: Option<String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field, value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.set(field, format!("{value:?}"));
    }
}

impl Fields {
    fn set(&mut self, field: &Field, value: String) {
        match field.name() {
            "client_id" => self.client_id = Some(value.trim_matches('"').to_string()),
            "error" => self.error = Some(value),
            "message" => self.message = Some(value),
            _ => {}
        }
    }
}

/// The declared size in `...PayloadSizeLimitExceeded(N)...`, or `None`
/// when `error` is not that error. rumqttd 0.20 has no other report of it.
fn oversized_bytes(error: &str) -> Option<Option<usize>> {
    const TAG: &str = "PayloadSizeLimitExceeded(";
    let at = error.find(TAG)? + TAG.len();
    let digits: String = error[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some(digits.parse().ok())
}

impl<S> Layer<S> for OversizedPacketLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != "remote_link" {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(LinkClient(fields.client_id));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        values.record(&mut fields);
        if fields.client_id.is_none() {
            return;
        }
        if let Some(span) = ctx.span(id) {
            if let Some(link) = span.extensions_mut().get_mut::<LinkClient>() {
                link.0 = fields.client_id;
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let Some(packet_bytes) = fields.error.as_deref().and_then(oversized_bytes) else {
            return;
        };
        let client_id = ctx.event_scope(event).and_then(|scope| {
            scope
                .into_iter()
                .find_map(|span| span.extensions().get::<LinkClient>().map(|l| l.0.clone()))
                .flatten()
        });
        let _ = self.tx.send(OversizedPacket {
            client_id,
            packet_bytes,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn the_size_is_read_from_rumqttds_error() {
        assert_eq!(
            oversized_bytes("Network(Protocol(PayloadSizeLimitExceeded(400017)))"),
            Some(Some(400017))
        );
        assert_eq!(oversized_bytes("Network(Io(Kind(ConnectionReset)))"), None);
    }

    #[test]
    fn an_oversized_packet_event_is_reported_with_the_spans_client_id() {
        let (layer, rx) = OversizedPacketLayer::new();
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::error_span!(
                target: "rumqttd::server::broker",
                "remote_link",
                client_id = tracing::field::Empty
            );
            let _in = span.enter();
            span.record("client_id", "bench-7");
            tracing::error!(target: "rumqttd::server::broker", error = ?"Io(ConnectionAborted)", "disconnected");
            tracing::error!(
                target: "rumqttd::server::broker",
                error = ?"Network(Protocol(PayloadSizeLimitExceeded(400017)))",
                "disconnected"
            );
        });
        let got: Vec<OversizedPacket> = rx.try_iter().collect();
        assert_eq!(
            got,
            [OversizedPacket {
                client_id: Some("bench-7".into()),
                packet_bytes: Some(400017),
            }]
        );
    }
}
