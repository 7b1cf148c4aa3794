//! Bounds on what one session update carries, so that it always fits an
//! MQTT packet.
//!
//! A session update that a broker refuses is worse than lost: the broker
//! drops the connection, the update stays queued and is sent again after
//! every reconnect, and the bench is cut off for good. So before an update
//! is queued ([`bound_envelope`]):
//!
//! - `error_message` is cut to [`MAX_ERROR_MESSAGE_CHARS`] characters;
//! - if the envelope is still larger than [`MAX_SESSION_UPDATE_BYTES`], an
//!   oversized `result_summary` is replaced by
//!   `{"truncated": true, "original_size_bytes": N}` and then
//!   `error_message` is cut further, to [`SHORT_ERROR_MESSAGE_CHARS`].
//!
//! The status, the session and capability ids, the time and the artifact
//! metadata are never changed or dropped.

use serde_json::{json, Value};
use shared_protocol::mqtt::{Envelope, SessionUpdate};

/// Largest encoded envelope of a session update, bytes (256 KiB). Far
/// below the edge's own packet limit ([`crate::link::MAX_PACKET_BYTES`])
/// and below the registry's embedded broker's limit with its default
/// `http.body_limit_bytes` (1 MiB). A broker must accept packets of at
/// least this size (plus topic and header) from providers.
pub const MAX_SESSION_UPDATE_BYTES: usize = 256 * 1024;

/// Longest `error_message` an update carries, characters.
pub const MAX_ERROR_MESSAGE_CHARS: usize = 2000;

/// Length `error_message` is cut to when the update is still too large
/// after its `result_summary` was replaced, characters.
pub const SHORT_ERROR_MESSAGE_CHARS: usize = 200;

/// A `result_summary` that encodes to more than this many bytes is the
/// one replaced when an update is too large.
const SMALL_SUMMARY_BYTES: usize = 1024;

/// `message` cut to `max_chars` characters (on a character boundary) and
/// followed by "… (N more characters)" when it was longer; unchanged
/// otherwise.
pub fn cut_message(message: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    match message.char_indices().nth(max_chars) {
        None => message.into(),
        Some((cut, _)) => {
            let more = message[cut..].chars().count();
            format!("{}… ({more} more characters)", &message[..cut]).into()
        }
    }
}

/// Shorten `update` in place until `envelope` (its MQTT envelope, with
/// `update` as body) encodes to at most `max_bytes`, following the steps in
/// the module documentation. Returns the encoded envelope, which may still
/// be larger than `max_bytes` if the artifact metadata alone is (the caller
/// decides what to do then).
pub fn bound_envelope(
    envelope: &mut Envelope,
    update: &mut SessionUpdate,
    max_bytes: usize,
) -> Vec<u8> {
    let mut changed = false;
    if let Some(m) = &update.error_message {
        if let std::borrow::Cow::Owned(cut) = cut_message(m, MAX_ERROR_MESSAGE_CHARS) {
            update.error_message = Some(cut);
            changed = true;
        }
    }
    let encode = |envelope: &mut Envelope, update: &SessionUpdate| {
        envelope.body = serde_json::to_value(update).unwrap_or(Value::Null);
        envelope.to_bytes()
    };
    let mut bytes = if changed {
        encode(envelope, update)
    } else {
        envelope.to_bytes()
    };
    if bytes.len() <= max_bytes {
        return bytes;
    }
    if let Some(summary) = &update.result_summary {
        let size = serde_json::to_vec(summary).map(|v| v.len()).unwrap_or(0);
        if size > SMALL_SUMMARY_BYTES {
            update.result_summary = Some(json!({
                "truncated": true,
                "original_size_bytes": size,
            }));
            bytes = encode(envelope, update);
            if bytes.len() <= max_bytes {
                return bytes;
            }
        }
    }
    if let Some(m) = &update.error_message {
        if let std::borrow::Cow::Owned(cut) = cut_message(m, SHORT_ERROR_MESSAGE_CHARS) {
            update.error_message = Some(cut);
            bytes = encode(envelope, update);
        }
    }
    bytes
}

/// A queued envelope (bytes) larger than `max_bytes`, shortened as
/// [`bound_envelope`] does, keeping its `message_id` (receivers
/// de-duplicate by it). `None` if it is not a session update this version
/// can read, or if it is still too large.
pub fn shrink_queued(payload: &[u8], max_bytes: usize) -> Option<Vec<u8>> {
    let mut envelope = Envelope::parse(payload).ok()?;
    let mut update: SessionUpdate = serde_json::from_value(envelope.body.clone()).ok()?;
    let bytes = bound_envelope(&mut envelope, &mut update, max_bytes);
    (bytes.len() <= max_bytes).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use shared_protocol::mqtt::MessageType;
    use shared_protocol::session::SessionStatus;

    fn update(error: Option<String>, summary: Option<Value>) -> SessionUpdate {
        SessionUpdate {
            session_id: "sess_1".into(),
            capability_id: "dut-console-01".into(),
            status: SessionStatus::Failed,
            result_summary: summary,
            error_message: error,
            artifacts: Vec::new(),
            occurred_at: Utc::now(),
            started_at: None,
            refused: None,
        }
    }

    /// The envelope the link would send `u` in.
    fn envelope_of(u: &SessionUpdate) -> Envelope {
        Envelope::new(
            MessageType::SessionUpdate,
            "msg-test".into(),
            chrono::Utc::now(),
            u,
        )
        .unwrap()
    }

    fn bounded(mut u: SessionUpdate, max: usize) -> (SessionUpdate, Vec<u8>) {
        let mut env = envelope_of(&u);
        let bytes = bound_envelope(&mut env, &mut u, max);
        let parsed: SessionUpdate =
            serde_json::from_value(Envelope::parse(&bytes).unwrap().body).unwrap();
        assert_eq!(parsed, u, "the bytes carry the bounded update");
        (u, bytes)
    }

    #[test]
    fn a_long_error_message_is_cut_on_a_character_boundary_with_a_marker() {
        let long = "é".repeat(2500);
        let (u, _) = bounded(update(Some(long), None), MAX_SESSION_UPDATE_BYTES);
        let m = u.error_message.unwrap();
        assert_eq!(m, format!("{}… (500 more characters)", "é".repeat(2000)));
        let short = "unknown parameter `x`".to_string();
        let (u, _) = bounded(update(Some(short.clone()), None), MAX_SESSION_UPDATE_BYTES);
        assert_eq!(u.error_message, Some(short));
    }

    #[test]
    fn an_oversized_result_summary_is_replaced_by_its_size_and_the_status_stays() {
        let summary = json!({ "lines": "x".repeat(300_000) });
        let size = serde_json::to_vec(&summary).unwrap().len();
        let (u, bytes) = bounded(
            update(Some("bad".into()), Some(summary)),
            MAX_SESSION_UPDATE_BYTES,
        );
        assert!(bytes.len() <= MAX_SESSION_UPDATE_BYTES, "{}", bytes.len());
        assert_eq!(
            u.result_summary,
            Some(json!({ "truncated": true, "original_size_bytes": size }))
        );
        assert_eq!(u.status, SessionStatus::Failed);
        assert_eq!(u.error_message.as_deref(), Some("bad"));
    }

    #[test]
    fn a_queued_update_too_large_is_rewritten_with_its_message_id() {
        let u = update(Some("K".repeat(2_000_000)), None);
        let env = envelope_of(&u);
        let payload = env.to_bytes();
        assert!(payload.len() > MAX_SESSION_UPDATE_BYTES);
        let again = shrink_queued(&payload, MAX_SESSION_UPDATE_BYTES).expect("rewritten");
        assert!(again.len() <= MAX_SESSION_UPDATE_BYTES);
        let parsed = Envelope::parse(&again).unwrap();
        assert_eq!(parsed.message_id, env.message_id);
        let body: SessionUpdate = serde_json::from_value(parsed.body).unwrap();
        assert_eq!(body.status, SessionStatus::Failed);
        assert!(body
            .error_message
            .unwrap()
            .ends_with("… (1998000 more characters)"));
        assert_eq!(shrink_queued(b"not an envelope", 1024), None);
    }
}
