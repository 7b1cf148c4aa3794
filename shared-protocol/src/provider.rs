//! Capability providers: the bench computers (seed 001 §2.2.1, §4.1, §4.3).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::capability::{CapabilityAction, HealthStatus};
use crate::validate::limits::{
    MAX_FAULTS, MAX_HEARTBEAT_ENTRIES, MAX_OBJECT_ENTRIES, MAX_PROVIDER_LABELS,
};
use crate::validate::{check_count, check_id, Validate, ValidationError};
use crate::Timestamp;

wire_enum! {
    /// Whether a provider is connected (seed 001 §2.2.1 `online_status`).
    pub enum OnlineStatus {
        Online = "online",
        Offline = "offline",
    }
}

/// `POST /api/v1/capability-providers/register` body (seed 001 §4.1), also
/// the `provider` part of the MQTT `register` message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProviderRegisterRequest {
    pub provider_id: String,
    pub node_id: String,
    pub hostname: String,
    /// `linux`, `windows`, `macos`, ...
    pub platform: String,
    /// Version of the edge software, e.g. `0.1.0`.
    pub gateway_version: String,
    /// e.g. `lan`.
    pub network_zone: String,
    /// At most [`MAX_PROVIDER_LABELS`].
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_display_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_mode: Option<String>,
    /// Random id chosen at each start of the edge daemon, so the registry
    /// tells a restart (new boot id: old sessions are reconciled) from a
    /// reconnect (same boot id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

impl Validate for ProviderRegisterRequest {
    fn validate(&self) -> Result<(), ValidationError> {
        check_id("provider_id", &self.provider_id)?;
        check_id("node_id", &self.node_id)?;
        if self.hostname.trim().is_empty() {
            return Err(ValidationError::new("hostname", "must not be empty"));
        }
        if let Some(name) = &self.owner_display_name {
            crate::validate::check_display_text("owner_display_name", name)?;
        }
        crate::validate::check_display_text("hostname", &self.hostname)?;
        check_count("labels", self.labels.len(), MAX_PROVIDER_LABELS)
    }

    fn normalize(&mut self) {
        crate::validate::nfc_all(&mut self.labels);
    }
}

/// Answer to a provider registration (seed 001 §4.1 response example).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProviderRegisterResponse {
    pub provider_id: String,
    pub accepted: bool,
    /// How often the provider must send a heartbeat, seconds.
    pub heartbeat_interval_seconds: u32,
}

/// A provider as the registry stores and returns it (seed 001 §2.2.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CapabilityProvider {
    pub provider_id: String,
    pub node_id: String,
    pub hostname: String,
    pub platform: String,
    pub gateway_version: String,
    pub online_status: OnlineStatus,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_heartbeat_at: Option<Timestamp>,
    pub network_zone: String,
    pub owner_type: Option<String>,
    pub owner_display_name: Option<String>,
    pub auth_mode: Option<String>,
    pub labels: Vec<String>,
    /// The boot id of the last registration.
    pub boot_id: Option<String>,
}

/// Health of one capability in a heartbeat (seed 001 §4.3 "更新能力健康状态").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CapabilityHealthReport {
    pub capability_id: String,
    pub health_status: HealthStatus,
    /// Why it is not healthy, e.g. `serial port /dev/ttyUSB0 vanished`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Readings worth keeping in the health history (e.g. `output_voltage_v`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Map<String, Value>>,
}

/// A session the provider is executing right now (seed 001 §4.3
/// "上报正在执行的租约").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunningSession {
    pub session_id: String,
    pub lease_id: String,
    pub capability_id: String,
    pub action: CapabilityAction,
    #[schema(value_type = String, format = DateTime)]
    pub started_at: Timestamp,
    /// True while the action is inside a non-interruptible window (§6.4).
    #[serde(default)]
    pub non_interruptible: bool,
}

/// A local fault the provider reports (seed 001 §4.3 "上报本地错误或故障").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProviderFault {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_id: Option<String>,
    /// Short machine-readable code, e.g. `serial_disconnected`.
    pub code: String,
    pub message: String,
    #[schema(value_type = String, format = DateTime)]
    pub occurred_at: Timestamp,
}

/// `POST /api/v1/capabilities/heartbeat` body and the MQTT `heartbeat`
/// message (seed 001 §4.3). At most [`MAX_HEARTBEAT_ENTRIES`] health
/// reports and running sessions, [`MAX_FAULTS`] faults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HeartbeatRequest {
    pub provider_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    #[serde(default)]
    pub capabilities: Vec<CapabilityHealthReport>,
    #[serde(default)]
    pub running_sessions: Vec<RunningSession>,
    #[serde(default)]
    pub faults: Vec<ProviderFault>,
}

impl Validate for HeartbeatRequest {
    fn validate(&self) -> Result<(), ValidationError> {
        check_id("provider_id", &self.provider_id)?;
        check_count(
            "capabilities",
            self.capabilities.len(),
            MAX_HEARTBEAT_ENTRIES,
        )?;
        check_count(
            "running_sessions",
            self.running_sessions.len(),
            MAX_HEARTBEAT_ENTRIES,
        )?;
        check_count("faults", self.faults.len(), MAX_FAULTS)?;
        for (i, c) in self.capabilities.iter().enumerate() {
            check_id(
                &format!("capabilities[{i}].capability_id"),
                &c.capability_id,
            )?;
            if let Some(m) = &c.metrics {
                check_count(
                    &format!("capabilities[{i}].metrics"),
                    m.len(),
                    MAX_OBJECT_ENTRIES,
                )?;
            }
        }
        Ok(())
    }
}

/// Answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HeartbeatResponse {
    pub accepted: bool,
    /// Seconds until the next heartbeat is due.
    pub heartbeat_interval_seconds: u32,
    #[schema(value_type = String, format = DateTime)]
    pub server_time: Timestamp,
}
