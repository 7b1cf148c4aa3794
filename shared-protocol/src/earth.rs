//! Earth natural-language command wire types (seed 000 "Earth Command",
//! "Earth Action Plan", "Allowed Action Types", "Allowed Domains").

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::validate::limits::{MAX_OBJECT_ENTRIES, MAX_VISIBLE_LAYERS};
use crate::validate::{check_count, Validate, ValidationError};

/// Where an Earth command's text came from (seed 000 "Earth Command",
/// request field `source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EarthCommandSource {
    /// Typed by the operator.
    Text,
    /// Transcribed from speech; `transcription_id` names the transcription.
    Speech,
}

/// The six data domains of the first version (seed 000 "Allowed Domains").
/// Also used as layer names in `show_layer`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum EarthDomain {
    Satellites,
    ComputeCenters,
    Bgp,
    News,
    Vessels,
    Cables,
}

impl EarthDomain {
    /// Every domain, in the seed's order.
    pub const ALL: [EarthDomain; 6] = [
        EarthDomain::Satellites,
        EarthDomain::ComputeCenters,
        EarthDomain::Bgp,
        EarthDomain::News,
        EarthDomain::Vessels,
        EarthDomain::Cables,
    ];

    /// The wire name (`"compute_centers"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EarthDomain::Satellites => "satellites",
            EarthDomain::ComputeCenters => "compute_centers",
            EarthDomain::Bgp => "bgp",
            EarthDomain::News => "news",
            EarthDomain::Vessels => "vessels",
            EarthDomain::Cables => "cables",
        }
    }
}

/// Viewport facts the Earth client sends along (seed 000 request
/// `client_context.viewport`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EarthViewport {
    #[serde(default)]
    pub is_mobile: bool,
    /// Any further viewport fields the client sends are kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// What the Earth client is showing when the command is sent
/// (seed 000 request `client_context`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EarthClientContext {
    #[serde(default)]
    pub visible_layers: Vec<EarthDomain>,
    /// BCP 47 locale, e.g. `zh-CN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locale: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub viewport: Option<EarthViewport>,
}

/// `POST /api/v1/agents/earth/command` body (seed 000 "Earth Command").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EarthCommandRequest {
    /// The natural-language command, at most 2,000 characters.
    pub input_text: String,
    pub source: EarthCommandSource,
    /// Set when `source` is `speech`: the transcription this text came from.
    #[serde(default)]
    pub transcription_id: Option<String>,
    #[serde(default)]
    pub client_context: EarthClientContext,
}

/// Largest `input_text` accepted, in characters.
pub const MAX_COMMAND_CHARS: usize = 2000;

impl Validate for EarthCommandRequest {
    fn validate(&self) -> Result<(), ValidationError> {
        if self.input_text.chars().count() > MAX_COMMAND_CHARS {
            return Err(ValidationError::new(
                "input_text",
                format!("longer than {MAX_COMMAND_CHARS} characters"),
            ));
        }
        let ctx = &self.client_context;
        check_count(
            "client_context.visible_layers",
            ctx.visible_layers.len(),
            MAX_VISIBLE_LAYERS,
        )?;
        if let Some(v) = &ctx.viewport {
            check_count("client_context.viewport", v.extra.len(), MAX_OBJECT_ENTRIES)?;
        }
        Ok(())
    }
}

/// How highlighted entities are drawn (seed 000 EarthAction `style.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HighlightMode {
    Glow,
    Solid,
    Pulse,
}

/// Highlight style: only a `#rrggbb` colour and a mode, never free CSS
/// (seed 000 "Safety Rules").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HighlightStyle {
    /// `#rrggbb` or `#rgb`.
    pub color: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<HighlightMode>,
}

impl HighlightStyle {
    /// True when `color` is `#rgb` or `#rrggbb` hex and nothing else.
    pub fn color_is_valid(&self) -> bool {
        let c = self.color.as_bytes();
        (c.len() == 7 || c.len() == 4)
            && c[0] == b'#'
            && c[1..].iter().all(|b| b.is_ascii_hexdigit())
    }
}

/// One row of the result panel (seed 000 `open_result_panel.items`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResultPanelItem {
    pub entity_id: String,
    pub label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subtitle: Option<String>,
}

/// One step of an Earth action plan (seed 000 "EarthAction Shape"; only the
/// six "Allowed Action Types" exist, so any other `type` fails to parse).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EarthAction {
    /// Turn a layer on or off.
    ShowLayer { layer: EarthDomain, enabled: bool },
    /// Highlight entities by id; ids must come from the entity service and
    /// there are at most [`MAX_HIGHLIGHT_ENTITIES`] of them.
    HighlightEntities {
        domain: EarthDomain,
        entity_ids: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        style: Option<HighlightStyle>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Show only entities matching `filters` (the entity service's filters).
    FilterEntities {
        domain: EarthDomain,
        filters: Map<String, Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Move the camera: needs valid coordinates, a region, or a matched entity.
    FocusView {
        /// Degrees, -90..=90.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lat: Option<f64>,
        /// Degrees, -180..=180.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lon: Option<f64>,
        /// Camera altitude above the surface, km.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        altitude_km: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        region: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        entity_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Open or update the result panel.
    OpenResultPanel {
        title: String,
        #[serde(default)]
        items: Vec<ResultPanelItem>,
    },
    /// Clear earlier AI-command highlights (all domains when `domain` is absent).
    ClearHighlight {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        domain: Option<EarthDomain>,
    },
}

/// Default cap on ids in one `highlight_entities` (seed 000 "Safety Rules").
pub const MAX_HIGHLIGHT_ENTITIES: usize = 500;

/// An entity the entity service matched (seed 000 response `matched_entities`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MatchedEntity {
    /// Stable id, e.g. `satellite:norad:25544`.
    pub entity_id: String,
    pub domain: EarthDomain,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub country: Option<String>,
    /// Degrees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lat: Option<f64>,
    /// Degrees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lon: Option<f64>,
    /// Source-specific fields (e.g. `norad_id`, `source`, `site_type`).
    #[serde(default)]
    pub properties: Map<String, Value>,
}

/// `POST /api/v1/agents/earth/command` response (seed 000 "Response shape").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EarthCommandResponse {
    /// Public id of the persisted agent run, `agent_…`.
    pub run_id: String,
    /// Chinese for Chinese input.
    pub summary: String,
    pub actions: Vec<EarthAction>,
    #[serde(default)]
    pub matched_entities: Vec<MatchedEntity>,
    /// 0.0..=1.0.
    pub confidence: f64,
    #[serde(default)]
    pub missing_data: Vec<String>,
    /// True when the intent was unclear and the plan is empty
    /// (seed 000 prompt rule "Return clarification_needed").
    #[serde(default)]
    pub clarification_needed: bool,
}
