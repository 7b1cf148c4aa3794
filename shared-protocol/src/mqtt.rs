//! The MQTT control plane (DESIGN.md "Control plane: MQTT"): topics, QoS,
//! and the JSON envelope every message travels in.
//!
//! | topic | direction | QoS | retained |
//! |---|---|---|---|
//! | `{prefix}/providers/{p}/status` | edge→cloud | 1 | yes; LWT `offline` |
//! | `{prefix}/providers/{p}/register` | edge→cloud | 1 | no |
//! | `{prefix}/providers/{p}/heartbeat` | edge→cloud | 0 | no |
//! | `{prefix}/providers/{p}/commands` | cloud→edge | 1 | no |
//! | `{prefix}/providers/{p}/results` | edge→cloud | 1 | no |
//! | `{prefix}/providers/{p}/frames` | edge→cloud | 0 | no |
//!
//! `frames` carries a running camera stream's live view, not an
//! [`Envelope`]: see [`LiveFrame`].
//!
//! A QoS 1 acknowledgement comes from the broker, not from the registry:
//! an update the broker accepted while the registry was not subscribed
//! (both reconnecting after a broker that lost its state) reaches nobody.
//! [`SessionSync`] closes that gap.

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::Value;

use crate::artifact::CapabilityArtifact;
use crate::capability::{CapabilityAction, CapabilityRegistration, LeaseMode};
use crate::lease::PreemptNotice;
use crate::provider::{OnlineStatus, ProviderRegisterRequest};
use crate::session::SessionStatus;
use crate::validate::limits::{MAX_ARTIFACTS_PER_UPDATE, MAX_CAPABILITIES_PER_BATCH};
use crate::validate::{check_count, check_id, Validate, ValidationError};
use crate::{Timestamp, PROTOCOL_VERSION};

/// Default topic prefix.
pub const DEFAULT_TOPIC_PREFIX: &str = "benchlink/v1";

wire_enum! {
    /// The six per-provider topics.
    pub enum TopicKind {
        Status = "status",
        Register = "register",
        Heartbeat = "heartbeat",
        Commands = "commands",
        Results = "results",
        /// Live frames of running camera streams ([`LiveFrame`]).
        Frames = "frames",
    }
}

/// MQTT QoS level as a plain number (0, 1, 2).
pub type QosLevel = u8;

impl TopicKind {
    /// The QoS messages on this topic are published with.
    pub fn qos(self) -> QosLevel {
        match self {
            TopicKind::Heartbeat | TopicKind::Frames => 0,
            _ => 1,
        }
    }

    /// Whether messages on this topic are retained (only `status`).
    pub fn retained(self) -> bool {
        self == TopicKind::Status
    }
}

/// A topic that is not one of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("topic `{topic}` is not a Benchlink provider topic under `{prefix}`: {reason}")]
pub struct TopicError {
    pub topic: String,
    pub prefix: String,
    pub reason: &'static str,
}

/// Build `{prefix}/providers/{provider_id}/{kind}`.
pub fn topic(prefix: &str, provider_id: &str, kind: TopicKind) -> String {
    format!("{prefix}/providers/{provider_id}/{}", kind.as_str())
}

/// A subscription filter for `kind` of every provider:
/// `{prefix}/providers/+/{kind}`.
pub fn topic_filter_all(prefix: &str, kind: TopicKind) -> String {
    format!("{prefix}/providers/+/{}", kind.as_str())
}

/// Split a topic built by [`topic`] into its provider id and kind.
///
/// Errors: wrong prefix, wrong shape, an invalid provider id, or an unknown
/// kind.
pub fn parse_topic<'a>(prefix: &str, topic: &'a str) -> Result<(&'a str, TopicKind), TopicError> {
    let err = |reason| TopicError {
        topic: topic.to_string(),
        prefix: prefix.to_string(),
        reason,
    };
    let rest = topic
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix("/providers/"))
        .ok_or_else(|| err("wrong prefix"))?;
    let mut parts = rest.split('/');
    let (Some(provider), Some(kind), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(err("expected providers/{provider_id}/{kind}"));
    };
    check_id("provider_id", provider).map_err(|_| err("invalid provider id"))?;
    let kind = kind.parse::<TopicKind>().map_err(|_| err("unknown kind"))?;
    Ok((provider, kind))
}

/// Every MQTT message: `protocol_version`, `message_id` (de-duplication:
/// QoS 1 delivers at least once), `sent_at`, `type`, `body`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Envelope {
    pub protocol_version: String,
    /// Unique per message; a receiver drops a second copy of the same id.
    pub message_id: String,
    #[schema(value_type = String, format = DateTime)]
    pub sent_at: Timestamp,
    #[serde(rename = "type")]
    pub message_type: MessageType,
    pub body: Value,
}

/// Why an envelope was refused.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    #[error("malformed envelope: {0}")]
    Malformed(#[from] crate::ParseError),
    #[error("protocol_version `{0}` is not supported (this side speaks {PROTOCOL_VERSION})")]
    Version(String),
    #[error("expected a `{expected}` message, got `{got}`")]
    WrongType {
        expected: MessageType,
        got: MessageType,
    },
}

impl Validate for Envelope {
    fn validate(&self) -> Result<(), ValidationError> {
        if self.message_id.is_empty() || self.message_id.len() > 128 {
            return Err(ValidationError::new(
                "message_id",
                "must be 1 to 128 characters",
            ));
        }
        Ok(())
    }
}

impl Envelope {
    /// Wrap `body` with a fresh `message_id` and `sent_at`.
    pub fn new<T: Serialize>(
        message_type: MessageType,
        message_id: String,
        sent_at: Timestamp,
        body: &T,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self {
            protocol_version: PROTOCOL_VERSION.to_string(),
            message_id,
            sent_at,
            message_type,
            body: serde_json::to_value(body)?,
        })
    }

    /// Parse and check an envelope from payload bytes. A different major
    /// protocol version is refused.
    pub fn parse(payload: &[u8]) -> Result<Self, EnvelopeError> {
        let env: Envelope = crate::parse_json(payload)?;
        let major = env.protocol_version.split('.').next().unwrap_or("");
        if major != PROTOCOL_VERSION.split('.').next().unwrap_or("1") {
            return Err(EnvelopeError::Version(env.protocol_version));
        }
        Ok(env)
    }

    /// The body as `T`, when `type` is `expected`.
    pub fn body_as<T: DeserializeOwned + Validate>(
        &self,
        expected: MessageType,
    ) -> Result<T, EnvelopeError> {
        if self.message_type != expected {
            return Err(EnvelopeError::WrongType {
                expected,
                got: self.message_type,
            });
        }
        Ok(crate::parse_value(self.body.clone())?)
    }

    /// Serialize to payload bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        // An Envelope holds only JSON values and strings: serialization
        // cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

wire_enum! {
    /// The `type` of an envelope, and the topic it travels on.
    pub enum MessageType {
        /// `status` topic: [`StatusBody`].
        Status = "status",
        /// `register` topic: [`RegisterBody`].
        Register = "register",
        /// `heartbeat` topic: [`crate::provider::HeartbeatRequest`].
        Heartbeat = "heartbeat",
        /// `commands` topic: [`RegisterAck`].
        RegisterAck = "register_ack",
        /// `commands` topic: [`ActionCommand`].
        ActionInvoke = "action_invoke",
        /// `commands` topic: [`ActionCancel`].
        ActionCancel = "action_cancel",
        /// `commands` topic: [`PreemptNotice`].
        PreemptRequested = "preempt_requested",
        /// `commands` topic: [`LeaseRevoked`].
        LeaseRevoked = "lease_revoked",
        /// `commands` topic: [`LeaseGranted`].
        LeaseGranted = "lease_granted",
        /// `commands` topic: [`ProviderConflict`].
        ProviderConflict = "provider_conflict",
        /// `commands` topic: [`SessionSync`].
        SessionSync = "session_sync",
        /// `results` topic: [`SessionUpdate`].
        SessionUpdate = "session_update",
    }
}

/// Largest JPEG a [`LiveFrame`] carries, bytes; an edge skips a larger
/// frame rather than sending it.
pub const MAX_LIVE_FRAME_BYTES: usize = 192 * 1024;

/// The header of a message on the `frames` topic.
///
/// Payload: this header as one line of JSON, a `\n`, then the JPEG bytes
/// (no base64). `end: true` with no JPEG says the stream stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LiveFrame {
    pub capability_id: String,
    /// Counts from 1 per stream.
    pub seq: u64,
    #[schema(value_type = String, format = DateTime)]
    pub captured_at: Timestamp,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub end: bool,
}

impl Validate for LiveFrame {
    fn validate(&self) -> Result<(), ValidationError> {
        check_id("capability_id", &self.capability_id)
    }
}

impl LiveFrame {
    /// The payload: header line, `\n`, `jpeg`.
    pub fn encode(&self, jpeg: &[u8]) -> Vec<u8> {
        let mut out = serde_json::to_vec(self).unwrap_or_default();
        out.push(b'\n');
        out.extend_from_slice(jpeg);
        out
    }

    /// Split a payload built by [`Self::encode`] into header and JPEG.
    ///
    /// Errors: no header line, a header that does not parse or validate,
    /// or a JPEG over [`MAX_LIVE_FRAME_BYTES`].
    pub fn decode(payload: &[u8]) -> Result<(LiveFrame, &[u8]), ValidationError> {
        let nl = payload
            .iter()
            .take(1024)
            .position(|b| *b == b'\n')
            .ok_or_else(|| ValidationError::new("payload", "no header line"))?;
        let header: LiveFrame = crate::parse_json(&payload[..nl])
            .map_err(|e| ValidationError::new("header", e.to_string()))?;
        let jpeg = &payload[nl + 1..];
        if jpeg.len() > MAX_LIVE_FRAME_BYTES {
            return Err(ValidationError::new(
                "jpeg",
                format!("{} bytes, over {MAX_LIVE_FRAME_BYTES}", jpeg.len()),
            ));
        }
        Ok((header, jpeg))
    }
}

/// Retained provider status; the LWT carries `offline` with the same boot id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StatusBody {
    pub provider_id: String,
    pub online_status: OnlineStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

impl Validate for StatusBody {
    fn validate(&self) -> Result<(), ValidationError> {
        check_id("provider_id", &self.provider_id)
    }
}

/// Provider and capability batch in one message (seed 001 §4.1 + §4.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RegisterBody {
    pub provider: ProviderRegisterRequest,
    pub capabilities: Vec<CapabilityRegistration>,
}

impl Validate for RegisterBody {
    fn normalize(&mut self) {
        self.provider.normalize();
        self.capabilities.iter_mut().for_each(Validate::normalize);
    }

    fn validate(&self) -> Result<(), ValidationError> {
        self.provider.validate().map_err(|e| e.within("provider"))?;
        check_count(
            "capabilities",
            self.capabilities.len(),
            MAX_CAPABILITIES_PER_BATCH,
        )?;
        crate::validate::validate_each("capabilities", &self.capabilities)
    }
}

/// The registry's answer to a `register` message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RegisterAck {
    pub provider_id: String,
    pub accepted: bool,
    pub heartbeat_interval_seconds: u32,
    /// Capability ids stored.
    pub registered: Vec<String>,
    /// Why not accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Validate for RegisterAck {
    fn validate(&self) -> Result<(), ValidationError> {
        Ok(())
    }
}

/// Run `action` on `capability_id` for session `session_id`.
///
/// Every command is *fenced* to its lease (docs/architecture.md
/// "Fencing"): the bench refuses it, and reports it refused, when its
/// `not_after` has (possibly) passed on the registry's clock, when it knows
/// the lease ended (a `lease_revoked` for it arrived), or when it knows a
/// newer lease of the capability (a larger `lease_generation`: exclusive
/// after anything older, shared after an older exclusive one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ActionCommand {
    pub session_id: String,
    pub lease_id: String,
    pub capability_id: String,
    pub action: CapabilityAction,
    pub params: serde_json::Map<String, Value>,
    /// The driver must finish within this many milliseconds of the
    /// command reaching the bench.
    pub timeout_ms: u32,
    /// The lease's place in the registry's grant order (the lease's
    /// `generation`): every grant on the registry takes the next number.
    pub lease_generation: u64,
    /// The mode the lease holds the capability in.
    pub lease_mode: LeaseMode,
    /// On the registry's clock: the earlier of the lease's `expires_at` and
    /// the action's deadline (sent time + `timeout_ms`). The bench starts
    /// nothing for this command once this instant may have passed.
    #[schema(value_type = String, format = DateTime)]
    pub not_after: Timestamp,
}

impl Validate for ActionCommand {
    fn validate(&self) -> Result<(), ValidationError> {
        check_id("session_id", &self.session_id)?;
        check_id("capability_id", &self.capability_id)?;
        if self.lease_generation == 0 {
            return Err(ValidationError::new(
                "lease_generation",
                "must be at least 1 (the lease's generation)",
            ));
        }
        Ok(())
    }
}

wire_enum! {
    /// Why the bench refused a fenced command ([`SessionUpdate::refused`]).
    pub enum FenceRefusal {
        /// Its `not_after` had passed (or may have, within the bench's
        /// clock uncertainty) when it reached the bench or its turn came.
        NotAfterPassed = "not_after_passed",
        /// The bench had been told the lease ended (`lease_revoked`).
        LeaseEnded = "lease_ended",
        /// The bench knew a newer lease of the capability.
        LeaseSuperseded = "lease_superseded",
    }
}

/// Cancel a running session (preemption at grace end, or the holder's stop).
/// A non-interruptible action finishes first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ActionCancel {
    pub session_id: String,
    pub reason: String,
}

impl Validate for ActionCancel {
    fn validate(&self) -> Result<(), ValidationError> {
        check_id("session_id", &self.session_id)
    }
}

impl Validate for PreemptNotice {
    fn validate(&self) -> Result<(), ValidationError> {
        Ok(())
    }
}

/// A lease ended (released, expired, or revoked after preemption): the
/// provider cancels what still runs or waits under it, and refuses any
/// command for it that arrives later.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LeaseRevoked {
    pub lease_id: String,
    pub capability_id: String,
    pub reason: String,
    /// The ended lease's generation (0: not known).
    #[serde(default)]
    pub lease_generation: u64,
}

impl Validate for LeaseRevoked {
    fn validate(&self) -> Result<(), ValidationError> {
        Ok(())
    }
}

/// A lease was granted on one of the provider's capabilities: from now on
/// the bench refuses commands of older leases this one supersedes
/// ([`ActionCommand`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LeaseGranted {
    pub lease_id: String,
    pub capability_id: String,
    pub lease_generation: u64,
    pub lease_mode: LeaseMode,
    /// The lease's expiry on the registry's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub expires_at: Option<Timestamp>,
}

impl Validate for LeaseGranted {
    fn validate(&self) -> Result<(), ValidationError> {
        check_id("capability_id", &self.capability_id)
    }
}

/// One running instance of a provider, as the registry heard it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProviderInstance {
    pub boot_id: String,
    /// From its registration (empty until one arrived).
    pub hostname: String,
    pub node_id: String,
    /// Milliseconds since the registry last heard it.
    pub last_heard_ms_ago: u64,
}

/// Sent to a provider the registry hears from two instances at once (the
/// same provider id and token on two benches: a copied configuration).
/// While `resolved` is false the registry refuses actions on it; each
/// instance logs the others. `resolved: true` says only one instance is
/// left (`instances`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProviderConflict {
    pub provider_id: String,
    pub instances: Vec<ProviderInstance>,
    #[serde(default)]
    pub resolved: bool,
}

impl Validate for ProviderConflict {
    fn validate(&self) -> Result<(), ValidationError> {
        check_id("provider_id", &self.provider_id)
    }
}

/// Progress or end of a session, with metadata of the artifacts it made
/// (their bytes follow over HTTP).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionUpdate {
    pub session_id: String,
    pub capability_id: String,
    pub status: SessionStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_summary: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    #[serde(default)]
    pub artifacts: Vec<CapabilityArtifact>,
    #[schema(value_type = String, format = DateTime)]
    pub occurred_at: Timestamp,
    /// When the driver was given the action, on the registry's clock as
    /// the bench estimates it (absent when it never started, or from an
    /// older bench). The registry compares it with the lease's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub started_at: Option<Timestamp>,
    /// Set when the bench refused the command by its fence (the update is
    /// then `failed`, and the action never ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<FenceRefusal>,
}

impl Validate for SessionUpdate {
    fn validate(&self) -> Result<(), ValidationError> {
        check_id("session_id", &self.session_id)?;
        check_count("artifacts", self.artifacts.len(), MAX_ARTIFACTS_PER_UPDATE)?;
        crate::validate::validate_each("artifacts", &self.artifacts)
    }
}

/// One session a [`SessionSync`] asks about: still open (`running`) at
/// the registry, or ended by the registry's presumption.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OpenSession {
    pub session_id: String,
    pub capability_id: String,
    /// True when the registry ended the session itself (provider offline,
    /// deadline) without its report: the provider sends its final update
    /// again if it still has it, and otherwise says nothing (the session
    /// may belong to an earlier run of its daemon).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ended_by_registry: bool,
}

/// Sent by the registry each time it hears a provider announce itself
/// `online` (after every (re)connection of the edge, and when the registry
/// subscribes and receives the retained status): the sessions it still
/// holds open on that provider, then those it ended by presumption in the
/// last hour, at most [`SessionSync::MAX_SESSIONS`] per message.
///
/// The provider answers on its `results` topic: a session it still runs
/// needs nothing (its final update follows); one it has ended gets its
/// final `session_update` again, even if the broker acknowledged it before
/// (it may have reached the broker while the registry was not subscribed);
/// an open one it has no record of (its `action_invoke` was lost) is
/// reported `failed`. Repeats are harmless: the registry drops a repeated
/// `message_id`, and a repeated final update changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionSync {
    pub sessions: Vec<OpenSession>,
}

impl SessionSync {
    /// Most sessions listed in one message (about 100 bytes each, far
    /// below any broker's packet limit).
    pub const MAX_SESSIONS: usize = 1000;
}

impl Validate for SessionSync {
    fn validate(&self) -> Result<(), ValidationError> {
        if self.sessions.len() > Self::MAX_SESSIONS {
            return Err(ValidationError::new(
                "sessions",
                format!("at most {} per message", Self::MAX_SESSIONS),
            ));
        }
        for (i, s) in self.sessions.iter().enumerate() {
            check_id(&format!("sessions[{i}].session_id"), &s.session_id)?;
            check_id(&format!("sessions[{i}].capability_id"), &s.capability_id)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod live_frame_tests {
    use super::*;

    #[test]
    fn a_live_frame_payload_splits_back_into_header_and_jpeg() {
        let h = LiveFrame {
            capability_id: "cam-1".into(),
            seq: 7,
            captured_at: chrono::Utc::now(),
            end: false,
        };
        let jpeg = [0xFF, 0xD8, b'\n', 0x00, 0xFF, 0xD9];
        let payload = h.encode(&jpeg);
        let (back, body) = LiveFrame::decode(&payload).unwrap();
        assert_eq!(back, h);
        assert_eq!(body, jpeg);
        assert!(LiveFrame::decode(b"no header").is_err());
        let big = h.encode(&vec![0; MAX_LIVE_FRAME_BYTES + 1]);
        assert!(LiveFrame::decode(&big).is_err());
        assert_eq!(TopicKind::Frames.qos(), 0);
        assert!(!TopicKind::Frames.retained());
    }
}
