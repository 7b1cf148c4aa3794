//! Capabilities: what a provider exposes (seed 001 §2.2.2, §3, §4.2).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::artifact::ArtifactType;
use crate::validate::limits::{
    MAX_CAPABILITIES_PER_BATCH, MAX_EVIDENCE_MODES, MAX_OBJECT_ENTRIES, MAX_SUPPORTED_ACTIONS,
    MAX_TAGS,
};
use crate::validate::{
    check_count, check_id, check_range, validate_each, Validate, ValidationError,
};
use crate::Timestamp;

wire_enum! {
    /// The eight kinds of capability (seed 001 §3.1-§3.8).
    pub enum CapabilityType {
        Camera = "camera",
        Microphone = "microphone",
        Speaker = "speaker",
        SerialPort = "serial_port",
        Relay = "relay",
        ProgrammablePowerSupply = "programmable_power_supply",
        ThumbRobot = "thumb_robot",
        ScreenCapture = "screen_capture",
    }
}

impl CapabilityType {
    /// The actions the seed lists for this type ("支持动作", §3.x).
    pub fn supported_actions(self) -> &'static [CapabilityAction] {
        use CapabilityAction::*;
        match self {
            CapabilityType::Camera => &[Snapshot, RecordClip, StartStream, StopStream, SetPtz],
            CapabilityType::Microphone => &[RecordAudio, StartAudioStream, StopAudioStream],
            CapabilityType::Speaker => &[PlayTts, PlayAudioFile, SetVolume, StopPlayback],
            CapabilityType::SerialPort => &[Open, Read, Write, ExpectPattern, CaptureLog],
            CapabilityType::ThumbRobot => &[
                Tap,
                DoubleTap,
                LongPress,
                Drag,
                TypeKeys,
                PressHardwareButton,
            ],
            CapabilityType::Relay => &[SwitchOn, SwitchOff, Pulse],
            CapabilityType::ProgrammablePowerSupply => &[
                PowerOn,
                PowerOff,
                SetVoltage,
                SetCurrentLimit,
                MeasureOutput,
            ],
            CapabilityType::ScreenCapture => &[Screenshot, RecordScreenClip, Ocr],
        }
    }

    /// True when `action` is one of [`Self::supported_actions`].
    pub fn supports(self, action: CapabilityAction) -> bool {
        self.supported_actions().contains(&action)
    }
}

wire_enum! {
    /// Every action of seed 001 §3 ("支持动作"). Which type supports which is
    /// [`CapabilityType::supported_actions`].
    pub enum CapabilityAction {
        // §3.1 camera
        Snapshot = "snapshot",
        RecordClip = "record_clip",
        StartStream = "start_stream",
        StopStream = "stop_stream",
        SetPtz = "set_ptz",
        // §3.2 microphone
        RecordAudio = "record_audio",
        StartAudioStream = "start_audio_stream",
        StopAudioStream = "stop_audio_stream",
        // §3.3 speaker
        PlayTts = "play_tts",
        PlayAudioFile = "play_audio_file",
        SetVolume = "set_volume",
        StopPlayback = "stop_playback",
        // §3.4 serial port
        Open = "open",
        Read = "read",
        Write = "write",
        ExpectPattern = "expect_pattern",
        CaptureLog = "capture_log",
        // §3.5 thumb robot
        Tap = "tap",
        DoubleTap = "double_tap",
        LongPress = "long_press",
        Drag = "drag",
        TypeKeys = "type_keys",
        PressHardwareButton = "press_hardware_button",
        // §3.6 relay
        SwitchOn = "switch_on",
        SwitchOff = "switch_off",
        Pulse = "pulse",
        // §3.7 programmable power supply
        PowerOn = "power_on",
        PowerOff = "power_off",
        SetVoltage = "set_voltage",
        SetCurrentLimit = "set_current_limit",
        MeasureOutput = "measure_output",
        // §3.8 screen capture
        Screenshot = "screenshot",
        RecordScreenClip = "record_screen_clip",
        Ocr = "ocr",
    }
}

impl CapabilityAction {
    /// The capability type this action belongs to.
    pub fn capability_type(self) -> CapabilityType {
        // Every action is listed under exactly one type (checked by a test).
        CapabilityType::ALL
            .iter()
            .copied()
            .find(|t| t.supports(self))
            .unwrap_or(CapabilityType::Camera)
    }

    /// Actions that must not be cut by preemption once started (seed 001
    /// §6.4): a robot press or drag, PSU output switching, a relay pulse.
    /// Drivers may report further windows (e.g. firmware flashing) at run time.
    pub fn non_interruptible_by_default(self) -> bool {
        use CapabilityAction::*;
        matches!(
            self,
            Tap | DoubleTap
                | LongPress
                | Drag
                | TypeKeys
                | PressHardwareButton
                | PowerOn
                | PowerOff
                | Pulse
        )
    }

    /// Actions a holder of a `shared_stream` lease may run: captures,
    /// streams and reads, which change nothing the other holders see
    /// (docs/policy.md "Shared stream"). Everything else — `set_ptz`,
    /// `set_volume`, playback, serial `open`/`write`, switching, pressing,
    /// setting a supply — changes the device for every holder and needs
    /// an exclusive lease.
    pub fn allowed_in_shared_stream(self) -> bool {
        use CapabilityAction::*;
        matches!(
            self,
            Snapshot
                | RecordClip
                | StartStream
                | StopStream
                | RecordAudio
                | StartAudioStream
                | StopAudioStream
                | Read
                | ExpectPattern
                | CaptureLog
                | MeasureOutput
                | Screenshot
                | RecordScreenClip
                | Ocr
        )
    }
}

wire_enum! {
    /// How a capability may be shared (seed 001 §2.2.2 `lease_mode`).
    pub enum LeaseMode {
        /// One holder at a time.
        Exclusive = "exclusive",
        /// Many readers at once (e.g. a camera feed watched by several agents).
        SharedRead = "shared_read",
        /// Many consumers of one stream at once.
        SharedStream = "shared_stream",
    }
}

wire_enum! {
    /// Whether a capability can be leased right now (seed 001 §2.2.2 `status`;
    /// the seed names the field, these values are Benchlink's).
    pub enum CapabilityStatus {
        /// Online, no lease.
        Available = "available",
        /// Online, held by at least one granted/active lease.
        Leased = "leased",
        /// Its provider is offline.
        Offline = "offline",
        /// Taken out of service by an admin.
        Maintenance = "maintenance",
    }
}

wire_enum! {
    /// Device health as the provider last reported it (seed 001 §2.2.2
    /// `health_status`, updated by §4.3 heartbeats).
    pub enum HealthStatus {
        Healthy = "healthy",
        Degraded = "degraded",
        Unhealthy = "unhealthy",
        Unknown = "unknown",
    }
}

/// One capability as a provider declares it (an element of seed 001 §4.2
/// `capabilities`). Only the fields the seed's example always carries are
/// required; the rest default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CapabilityRegistration {
    /// Unique across the registry, e.g. `cam-front-01`.
    pub capability_id: String,
    pub capability_type: CapabilityType,
    pub display_name: String,
    pub lease_mode: LeaseMode,
    pub preemptible: bool,
    /// Must be a subset of the type's actions (§3).
    pub supported_actions: Vec<CapabilityAction>,
    #[serde(default)]
    pub evidence_modes: Vec<ArtifactType>,
    /// Type-specific metadata of §3.x ("关键元数据"), e.g. `resolution_options`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_json: Option<Map<String, Value>>,
    /// Limits such as `max_voltage_v`, `bounds_mm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraints_json: Option<Map<String, Value>>,
    /// 0..=100; the priority a lease gets when the request gives none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_priority: Option<u8>,
    /// A safety-locked capability is never preempted (§6.2).
    #[serde(default)]
    pub safety_locked: bool,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location_label: Option<String>,
    /// Defaults to the provider's node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
}

impl Validate for CapabilityRegistration {
    fn normalize(&mut self) {
        crate::validate::nfc_all(&mut self.tags);
    }

    fn validate(&self) -> Result<(), ValidationError> {
        check_id("capability_id", &self.capability_id)?;
        if self.display_name.trim().is_empty() {
            return Err(ValidationError::new("display_name", "must not be empty"));
        }
        crate::validate::check_display_text("display_name", &self.display_name)?;
        if let Some(l) = &self.location_label {
            crate::validate::check_display_text("location_label", l)?;
        }
        for (i, action) in self.supported_actions.iter().enumerate() {
            if !self.capability_type.supports(*action) {
                return Err(ValidationError::new(
                    format!("supported_actions[{i}]"),
                    format!(
                        "`{action}` is not an action of capability type `{}`",
                        self.capability_type
                    ),
                ));
            }
        }
        if let Some(p) = self.default_priority {
            check_range("default_priority", p, 0, 100)?;
        }
        check_count(
            "supported_actions",
            self.supported_actions.len(),
            MAX_SUPPORTED_ACTIONS,
        )?;
        check_count(
            "evidence_modes",
            self.evidence_modes.len(),
            MAX_EVIDENCE_MODES,
        )?;
        check_count("tags", self.tags.len(), MAX_TAGS)?;
        for (field, map) in [
            ("metadata_json", &self.metadata_json),
            ("constraints_json", &self.constraints_json),
        ] {
            if let Some(m) = map {
                check_count(field, m.len(), MAX_OBJECT_ENTRIES)?;
            }
        }
        Ok(())
    }
}

/// `POST /api/v1/capabilities/register` body (seed 001 §4.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CapabilityBatchRegisterRequest {
    pub provider_id: String,
    pub capabilities: Vec<CapabilityRegistration>,
}

impl Validate for CapabilityBatchRegisterRequest {
    fn normalize(&mut self) {
        self.capabilities.iter_mut().for_each(Validate::normalize);
    }

    fn validate(&self) -> Result<(), ValidationError> {
        check_id("provider_id", &self.provider_id)?;
        check_count(
            "capabilities",
            self.capabilities.len(),
            MAX_CAPABILITIES_PER_BATCH,
        )?;
        validate_each("capabilities", &self.capabilities)?;
        let mut seen = std::collections::HashSet::new();
        for (i, c) in self.capabilities.iter().enumerate() {
            if !seen.insert(c.capability_id.as_str()) {
                return Err(ValidationError::new(
                    format!("capabilities[{i}].capability_id"),
                    format!("`{}` appears twice in the batch", c.capability_id),
                ));
            }
        }
        Ok(())
    }
}

/// Answer to [`CapabilityBatchRegisterRequest`]: the ids now registered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CapabilityBatchRegisterResponse {
    pub provider_id: String,
    pub registered: Vec<String>,
}

/// A capability as the registry stores and returns it (seed 001 §2.2.2, all
/// fields).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Capability {
    pub capability_id: String,
    pub provider_id: String,
    pub node_id: String,
    pub capability_type: CapabilityType,
    pub display_name: String,
    pub status: CapabilityStatus,
    /// As its provider last reported it, except while the registry's own
    /// health check holds it out of service: then `unhealthy`, with
    /// `health_check_reason`.
    pub health_status: HealthStatus,
    /// Why the registry's last health check of it failed (docs/policy.md
    /// "Health checks"), e.g. `health check expect_pattern failed:
    /// pattern not seen within 1000 ms`; present only while that failure
    /// holds it out of service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check_reason: Option<String>,
    pub lease_mode: LeaseMode,
    pub preemptible: bool,
    /// 0..=100.
    pub default_priority: u8,
    pub safety_locked: bool,
    pub tags: Vec<String>,
    pub location_label: Option<String>,
    pub metadata_json: Map<String, Value>,
    pub constraints_json: Map<String, Value>,
    pub supported_actions: Vec<CapabilityAction>,
    pub evidence_modes: Vec<ArtifactType>,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
}

/// Pick a capability by what it is rather than by id (seed 001 §5.1
/// `capability_selector`). Every given field must match.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CapabilitySelector {
    pub capability_type: CapabilityType,
    /// The capability must carry all of these tags.
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
}

impl Validate for CapabilitySelector {
    fn normalize(&mut self) {
        crate::validate::nfc_all(&mut self.tags);
    }

    fn validate(&self) -> Result<(), ValidationError> {
        check_count("tags", self.tags.len(), MAX_TAGS)
    }
}

wire_enum! {
    /// The mode a requirement asks for (seed 001 §13 `mode`).
    pub enum RequirementMode {
        Exclusive = "exclusive",
        SharedRead = "shared_read",
    }
}

impl From<RequirementMode> for LeaseMode {
    fn from(m: RequirementMode) -> Self {
        match m {
            RequirementMode::Exclusive => LeaseMode::Exclusive,
            RequirementMode::SharedRead => LeaseMode::SharedRead,
        }
    }
}

/// A declared need for one capability (seed 001 §13).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CapabilityRequirement {
    pub capability_type: CapabilityType,
    pub mode: RequirementMode,
    /// Shortest lease that is useful, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_duration_seconds: Option<u32>,
    /// Prefer capabilities with all of these tags.
    #[serde(default)]
    pub preferred_node_tags: Vec<String>,
    /// When true, a capability without the preferred tags is acceptable.
    #[serde(default)]
    pub fallback_allowed: bool,
    #[serde(default)]
    pub preempt_if_needed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purpose: Option<String>,
}

impl Validate for CapabilityRequirement {
    fn normalize(&mut self) {
        crate::validate::nfc_all(&mut self.preferred_node_tags);
    }

    fn validate(&self) -> Result<(), ValidationError> {
        if let Some(s) = self.min_duration_seconds {
            check_range("min_duration_seconds", s, 1, 86_400)?;
        }
        check_count(
            "preferred_node_tags",
            self.preferred_node_tags.len(),
            MAX_TAGS,
        )
    }
}
