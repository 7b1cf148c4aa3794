//! The audit-agent task protocol (seed 001 §8-§12): requests, results,
//! findings, and the software / hardware / multimodal / chief extensions.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::capability::CapabilityRequirement;
use crate::validate::limits::{MAX_AUDIT_LIST_ITEMS, MAX_GROUP_MEMBERS, MAX_OBJECT_ENTRIES};
use crate::validate::{
    check_count, check_id, check_opt_count, check_range, validate_each, Validate, ValidationError,
};
use crate::Timestamp;

wire_enum! {
    /// What triggered an audit (seed 001 §8.1 `trigger`).
    pub enum AuditTrigger {
        Milestone = "milestone",
        MergeCandidate = "merge_candidate",
        FailureEscalation = "failure_escalation",
        ScheduledCheck = "scheduled_check",
        HumanRequest = "human_request",
    }
}

wire_enum! {
    /// Kind of audit (seed 001 §8.1 `audit_type`).
    pub enum AuditType {
        Software = "software",
        Hardware = "hardware",
        Multimodal = "multimodal",
        Chief = "chief",
    }
}

wire_enum! {
    /// Outcome of running an audit (seed 001 §8.2 `status`).
    pub enum AuditResultStatus {
        Completed = "completed",
        Failed = "failed",
        NeedsRetry = "needs_retry",
        NeedsHumanReview = "needs_human_review",
    }
}

wire_enum! {
    /// The audit's verdict (seed 001 §8.2 `decision`).
    pub enum AuditDecision {
        Pass = "pass",
        Fail = "fail",
        Warning = "warning",
        Inconclusive = "inconclusive",
    }
}

wire_enum! {
    /// Finding severity (seed 001 §9.3).
    pub enum FindingSeverity {
        Critical = "critical",
        High = "high",
        Medium = "medium",
        Low = "low",
    }
}

wire_enum! {
    /// The chief audit's decision (seed 001 §12.2 `final_decision`).
    pub enum FinalDecision {
        Approved = "approved",
        Rejected = "rejected",
        NeedsHumanReview = "needs_human_review",
        PartialPass = "partial_pass",
    }
}

wire_enum! {
    /// Risk levels used by `regression_risk_level` (§9.2) and
    /// `overall_risk_level` (§12.2); the seed names the fields, these values
    /// follow the finding severities.
    pub enum RiskLevel {
        Low = "low",
        Medium = "medium",
        High = "high",
        Critical = "critical",
    }
}

wire_enum! {
    /// Lifecycle of an audit request in the registry's queue.
    pub enum AuditRequestStatus {
        /// Waiting to be claimed (or waiting for its sub-requests, for chief).
        Queued = "queued",
        /// Claimed by an audit agent, within its visibility timeout.
        Claimed = "claimed",
        /// A result was accepted.
        Completed = "completed",
        /// Given up on after too many attempts.
        Failed = "failed",
    }
}

/// Software audit input (seed 001 §9.1), added to the common request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SoftwareAuditInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_ref: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_commit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_commit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_files: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_refs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_results: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_results: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage_summary: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_logs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_contract_refs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_notes_draft: Option<String>,
}

/// Hardware audit input (seed 001 §10.1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HardwareAuditInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_topology: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_revision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_log_refs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensor_snapshots: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ota_result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_state_machine: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_test_steps: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_capabilities: Option<Vec<String>>,
}

/// Multimodal audit input (seed 001 §11.1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MultimodalAuditInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame_refs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub video_clip_refs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio_clip_refs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screen_capture_refs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ocr_text_refs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detector_output_refs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interaction_script: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_visual_states: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_audio_states: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_actuator_states: Option<Value>,
}

/// Chief audit input (seed 001 §12.1): the other audits' results, not raw
/// data. `depends_on` names the sub-requests whose results fill the first
/// three fields; the request becomes claimable when they all have results.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChiefAuditInput {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub software_audit_result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_audit_result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multimodal_audit_result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules_audit_summary: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub human_notes: Option<String>,
}

/// The common audit task request (seed 001 §8.1), with the extension of its
/// `audit_type` flattened in (§9.1, §10.1, §11.1, §12.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditTaskRequest {
    /// `"1.0"`.
    pub protocol_version: String,
    pub audit_request_id: String,
    pub project_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_name: Option<String>,
    pub task_id: String,
    /// A registered worker thread, e.g. `mac-01:thread-ui-22`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_thread_ref: Option<String>,
    pub trigger: AuditTrigger,
    pub audit_type: AuditType,
    /// 0..=100 (§6.1 suggests 80 chief, 75 hardware, 70 multimodal, 65 software).
    pub priority: u8,
    pub objective: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_context_summary: Option<String>,
    #[serde(default)]
    pub acceptance_criteria: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk_focus: Option<Vec<String>>,
    #[serde(default)]
    pub evidence_refs: Vec<String>,
    #[serde(default)]
    pub artifact_refs: Vec<String>,
    #[serde(default)]
    pub capability_requirements: Vec<CapabilityRequirement>,
    /// Time the agent has, seconds; the claim's visibility timeout derives
    /// from it.
    pub time_budget_seconds: u32,
    /// `structured_json`.
    pub response_mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub created_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_json: Option<Map<String, Value>>,
    #[serde(flatten)]
    pub software: SoftwareAuditInput,
    #[serde(flatten)]
    pub hardware: HardwareAuditInput,
    #[serde(flatten)]
    pub multimodal: MultimodalAuditInput,
    #[serde(flatten)]
    pub chief: ChiefAuditInput,
}

impl Validate for AuditTaskRequest {
    fn normalize(&mut self) {
        self.capability_requirements
            .iter_mut()
            .for_each(Validate::normalize);
    }

    fn validate(&self) -> Result<(), ValidationError> {
        check_id("audit_request_id", &self.audit_request_id)?;
        check_id("project_id", &self.project_id)?;
        check_id("task_id", &self.task_id)?;
        check_range("priority", self.priority, 0, 100)?;
        check_range("time_budget_seconds", self.time_budget_seconds, 1, 86_400)?;
        if self.objective.trim().is_empty() {
            return Err(ValidationError::new("objective", "must not be empty"));
        }
        check_count(
            "capability_requirements",
            self.capability_requirements.len(),
            MAX_GROUP_MEMBERS,
        )?;
        validate_each("capability_requirements", &self.capability_requirements)?;
        let max = MAX_AUDIT_LIST_ITEMS;
        for (field, len) in [
            ("acceptance_criteria", self.acceptance_criteria.len()),
            ("evidence_refs", self.evidence_refs.len()),
            ("artifact_refs", self.artifact_refs.len()),
            ("depends_on", self.chief.depends_on.len()),
        ] {
            check_count(field, len, max)?;
        }
        let (sw, hw, mm) = (&self.software, &self.hardware, &self.multimodal);
        for (field, list) in [
            ("risk_focus", self.risk_focus.as_deref()),
            ("changed_files", sw.changed_files.as_deref()),
            ("diff_refs", sw.diff_refs.as_deref()),
            ("runtime_logs", sw.runtime_logs.as_deref()),
            ("api_contract_refs", sw.api_contract_refs.as_deref()),
            ("serial_log_refs", hw.serial_log_refs.as_deref()),
            ("required_capabilities", hw.required_capabilities.as_deref()),
            ("frame_refs", mm.frame_refs.as_deref()),
            ("video_clip_refs", mm.video_clip_refs.as_deref()),
            ("audio_clip_refs", mm.audio_clip_refs.as_deref()),
            ("screen_capture_refs", mm.screen_capture_refs.as_deref()),
            ("ocr_text_refs", mm.ocr_text_refs.as_deref()),
            ("detector_output_refs", mm.detector_output_refs.as_deref()),
        ] {
            check_opt_count(field, list, max)?;
        }
        check_opt_count(
            "hardware_test_steps",
            hw.hardware_test_steps.as_deref(),
            max,
        )?;
        if let Some(m) = &self.metadata_json {
            check_count("metadata_json", m.len(), MAX_OBJECT_ENTRIES)?;
        }
        if self.audit_type == AuditType::Chief && self.chief.depends_on.is_empty() {
            return Err(ValidationError::new(
                "depends_on",
                "a chief audit names the sub-requests it depends on",
            ));
        }
        Ok(())
    }
}

/// One finding (seed 001 §9.3; used by every audit type).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Finding {
    pub finding_id: String,
    pub severity: FindingSeverity,
    pub title: String,
    pub description: String,
    #[serde(default)]
    pub evidence_ref_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suggested_fix: Option<String>,
}

impl Validate for Finding {
    fn validate(&self) -> Result<(), ValidationError> {
        check_id("finding_id", &self.finding_id)?;
        if self.title.trim().is_empty() {
            return Err(ValidationError::new("title", "must not be empty"));
        }
        check_count(
            "evidence_ref_ids",
            self.evidence_ref_ids.len(),
            MAX_AUDIT_LIST_ITEMS,
        )
    }
}

/// Software audit output (seed 001 §9.2).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SoftwareAuditOutput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regression_risk_level: Option<RiskLevel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage_gap_summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_blockers: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract_breaking_changes: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_anomalies: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommended_owner: Option<String>,
}

/// Hardware audit output (seed 001 §10.2).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HardwareAuditOutput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_state_assessment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware_mismatch: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensor_anomalies: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_log_findings: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_blockers: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_actions: Option<Vec<String>>,
}

/// Multimodal audit output (seed 001 §11.2).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MultimodalAuditOutput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_timeline: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visual_mismatches: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio_mismatches: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interaction_failures: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perceptual_verdict: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs_human_review_reason: Option<String>,
}

/// Chief audit output (seed 001 §12.2).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChiefAuditOutput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_decision: Option<FinalDecision>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overall_risk_level: Option<RiskLevel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocking_reasons: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommended_next_step: Option<String>,
    /// A registered thread, e.g. `mac-01:thread-ui-22`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff_target: Option<String>,
}

/// The common audit task result (seed 001 §8.2), with the outputs of its
/// `audit_type` flattened in (§9.2, §10.2, §11.2, §12.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditTaskResult {
    pub audit_request_id: String,
    pub audit_type: AuditType,
    pub status: AuditResultStatus,
    pub decision: AuditDecision,
    /// 0.0..=1.0.
    pub confidence: f64,
    pub summary: String,
    #[serde(default)]
    pub findings: Vec<Finding>,
    #[serde(default)]
    pub required_actions: Vec<String>,
    /// Capability ids used.
    #[serde(default)]
    pub used_capabilities: Vec<String>,
    #[serde(default)]
    pub artifact_refs: Vec<String>,
    /// Ordered steps as the agent saw them.
    #[serde(default)]
    pub timeline: Vec<Value>,
    /// Wall time the audit took, milliseconds.
    pub duration_ms: u64,
    #[schema(value_type = String, format = DateTime)]
    pub completed_at: Timestamp,
    #[serde(flatten)]
    pub software: SoftwareAuditOutput,
    #[serde(flatten)]
    pub hardware: HardwareAuditOutput,
    #[serde(flatten)]
    pub multimodal: MultimodalAuditOutput,
    #[serde(flatten)]
    pub chief: ChiefAuditOutput,
}

impl Validate for AuditTaskResult {
    fn validate(&self) -> Result<(), ValidationError> {
        check_id("audit_request_id", &self.audit_request_id)?;
        if !(0.0..=1.0).contains(&self.confidence) || self.confidence.is_nan() {
            return Err(ValidationError::new(
                "confidence",
                format!("{} is out of range 0.0..=1.0", self.confidence),
            ));
        }
        let max = MAX_AUDIT_LIST_ITEMS;
        for (field, len) in [
            ("findings", self.findings.len()),
            ("required_actions", self.required_actions.len()),
            ("used_capabilities", self.used_capabilities.len()),
            ("artifact_refs", self.artifact_refs.len()),
            ("timeline", self.timeline.len()),
        ] {
            check_count(field, len, max)?;
        }
        let (sw, hw, mm, chief) = (
            &self.software,
            &self.hardware,
            &self.multimodal,
            &self.chief,
        );
        for (field, list) in [
            ("release_blockers", sw.release_blockers.as_deref()),
            (
                "contract_breaking_changes",
                sw.contract_breaking_changes.as_deref(),
            ),
            ("log_anomalies", sw.log_anomalies.as_deref()),
            ("sensor_anomalies", hw.sensor_anomalies.as_deref()),
            ("serial_log_findings", hw.serial_log_findings.as_deref()),
            ("hardware_blockers", hw.hardware_blockers.as_deref()),
            ("recovery_actions", hw.recovery_actions.as_deref()),
            ("visual_mismatches", mm.visual_mismatches.as_deref()),
            ("audio_mismatches", mm.audio_mismatches.as_deref()),
            ("interaction_failures", mm.interaction_failures.as_deref()),
            ("blocking_reasons", chief.blocking_reasons.as_deref()),
        ] {
            check_opt_count(field, list, max)?;
        }
        check_opt_count("observed_timeline", mm.observed_timeline.as_deref(), max)?;
        validate_each("findings", &self.findings)?;
        // A chief result's required `final_decision` is checked by the
        // registry together with its other field rules, so that one answer
        // lists every mistake.
        Ok(())
    }
}
