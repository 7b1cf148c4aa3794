//! Prompt registry (docs/earth-command.md, "Prompt registry"): the eight prompt keys with
//! their default text, overridable in `[agents.prompts]` and by applied
//! `ai_prompt` proposals (stored override > config > default).

use std::collections::BTreeMap;
use std::sync::RwLock;

use serde::{Deserialize, Serialize};

/// `agents.runtime.system`: the base system prompt of every run.
pub const RUNTIME_SYSTEM: &str = "agents.runtime.system";
/// `agents.earth.command`: the Earth command prompt.
pub const EARTH_COMMAND: &str = "agents.earth.command";
/// `agents.situational.assessment`.
pub const SITUATIONAL_ASSESSMENT: &str = "agents.situational.assessment";
/// `agents.config.proposal`.
pub const CONFIG_PROPOSAL: &str = "agents.config.proposal";

/// Every prompt key, in the order of docs/earth-command.md, "Prompt registry".
pub const PROMPT_KEYS: [&str; 8] = [
    RUNTIME_SYSTEM,
    EARTH_COMMAND,
    SITUATIONAL_ASSESSMENT,
    CONFIG_PROPOSAL,
    "agents.roles.network",
    "agents.roles.bgp",
    "agents.roles.platform_ops",
    "agents.roles.business_impact",
];

/// Largest prompt text accepted from config or a proposal, characters.
pub const MAX_PROMPT_CHARS: usize = 20_000;

const DEFAULT_RUNTIME_SYSTEM: &str =
    "You are the Benchlink agent runtime. You act only through the tools \
listed to you; the backend decides whether each tool call runs and records every step for review.
- Tools with side-effect level `read` run directly. `proposal` tools only create proposals that an \
administrator reviews and applies. `write` tools never run during a run.
- Never invent data, entity ids, coordinates, URLs or tool names. When data is missing, say so.
- Never ask for, repeat or output secrets (API keys, passwords, tokens).
- Reply with exactly one JSON object per message, as the protocol below describes.";

const DEFAULT_EARTH_COMMAND: &str = "You turn one operator command for the Earth view into an Earth \
action plan.
Rules:
1. Strict JSON output only: exactly one JSON object, no prose, no Markdown, no code fences.
2. Use only the candidate entities the tools returned (earth.find_entities, earth.get_entity): copy \
their entity_id values exactly.
3. Do not invent objects, ids, coordinates, regions or data sources. If the data cannot answer the \
command, list what is missing in missing_data.
4. Do not return code of any kind: no JavaScript, HTML, CSS, URLs or style rules. A colour is a \
#rrggbb hex value and nothing else.
5. Do not modify business data. The plan only changes what the Earth view shows.
6. When the intent is unclear, return clarification_needed: true, no actions, and a summary that asks \
one short question.
7. Return the action plan in this schema:
{\"type\": \"final\", \"summary\": \"...\", \"result\": {\"actions\": [...], \"confidence\": 0.0-1.0, \
\"missing_data\": [\"...\"], \"clarification_needed\": false}}
Allowed action types (nothing else):
- {\"type\": \"show_layer\", \"layer\": DOMAIN, \"enabled\": true}
- {\"type\": \"highlight_entities\", \"domain\": DOMAIN, \"entity_ids\": [...], \"style\": {\"color\": \
\"#7dd3fc\", \"mode\": \"glow\"}, \"reason\": \"...\"} (at most 500 ids)
- {\"type\": \"filter_entities\", \"domain\": DOMAIN, \"filters\": {the earth.find_entities filters}, \
\"reason\": \"...\"}
- {\"type\": \"focus_view\", \"lat\": -90..90, \"lon\": -180..180, \"altitude_km\": 2000, \"region\": \
\"...\", \"entity_id\": \"...\", \"reason\": \"...\"} (coordinates, a region or a matched entity)
- {\"type\": \"open_result_panel\", \"title\": \"...\", \"items\": [{\"entity_id\": \"...\", \"label\": \
\"...\"}]} (at most 20 items)
- {\"type\": \"clear_highlight\", \"domain\": DOMAIN (optional)}
DOMAIN is one of: satellites, compute_centers, bgp, news, vessels, cables.
8. Write the summary in Chinese when the user wrote Chinese (for example \"已找到并高亮 50 颗北斗卫星。\"), \
otherwise in the user's language.";

const DEFAULT_SITUATIONAL: &str = "You assess a situation from evidence. Gather evidence with the \
read tools, cite each fact's source (tool step or evidence), separate observations from inferences, \
give a confidence for each conclusion and list missing data. Do not propose changes unless asked. \
Final answer: {\"type\": \"final\", \"summary\": \"...\", \"result\": {\"findings\": [...], \
\"missing_data\": [...]}}.";

const DEFAULT_CONFIG_PROPOSAL: &str = "You draft configuration proposals. Use the proposal tool \
agents.propose_config; each proposal changes one datasource_config or ai_prompt target, states a \
rationale and never contains secrets (api_key, password, token, secret and similar fields are \
rejected). Proposals are applied only after an administrator reviews them. Keep each proposal small.";

const DEFAULT_ROLE_NETWORK: &str = "Role: network analyst. Reason about links, submarine cables, \
landing points and data-center connectivity; quantify impact where the data allows.";
const DEFAULT_ROLE_BGP: &str = "Role: BGP analyst. Reason about prefixes, origin ASes, route \
collectors and hijack or leak events; distinguish ongoing from ended events.";
const DEFAULT_ROLE_PLATFORM_OPS: &str = "Role: platform operations. Reason about datasources, \
collectors, refresh intervals and service health; prefer small reversible changes.";
const DEFAULT_ROLE_BUSINESS: &str = "Role: business impact analyst. Translate technical findings \
into affected services, regions and customers; state assumptions.";

/// The default text of a prompt key.
pub fn default_text(key: &str) -> Option<&'static str> {
    Some(match key {
        RUNTIME_SYSTEM => DEFAULT_RUNTIME_SYSTEM,
        EARTH_COMMAND => DEFAULT_EARTH_COMMAND,
        SITUATIONAL_ASSESSMENT => DEFAULT_SITUATIONAL,
        CONFIG_PROPOSAL => DEFAULT_CONFIG_PROPOSAL,
        "agents.roles.network" => DEFAULT_ROLE_NETWORK,
        "agents.roles.bgp" => DEFAULT_ROLE_BGP,
        "agents.roles.platform_ops" => DEFAULT_ROLE_PLATFORM_OPS,
        "agents.roles.business_impact" => DEFAULT_ROLE_BUSINESS,
        _ => return None,
    })
}

/// Where a prompt's current text comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptSource {
    Default,
    /// `[agents.prompts]` in the registry config.
    Config,
    /// An applied `ai_prompt` proposal.
    Override,
}

/// One row of `GET /api/v1/agents/prompts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptEntry {
    pub key: String,
    pub text: String,
    pub source: PromptSource,
    pub default_text: String,
}

/// Why a prompt override was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    #[error("unknown prompt key `{0}`; known keys: {keys}", keys = PROMPT_KEYS.join(", "))]
    UnknownKey(String),
    #[error("prompt `{key}` must be 1 to {MAX_PROMPT_CHARS} characters")]
    BadLength { key: String },
}

/// Check a key and text for an override.
pub fn check_override(key: &str, text: &str) -> Result<(), PromptError> {
    if default_text(key).is_none() {
        return Err(PromptError::UnknownKey(key.to_string()));
    }
    let n = text.trim().chars().count();
    if n == 0 || n > MAX_PROMPT_CHARS {
        return Err(PromptError::BadLength {
            key: key.to_string(),
        });
    }
    Ok(())
}

/// The prompt registry. Reads are lock-free in practice (an uncontended
/// `RwLock`); stored overrides change only when a proposal is applied.
#[derive(Debug)]
pub struct PromptRegistry {
    config: BTreeMap<String, String>,
    stored: RwLock<BTreeMap<String, String>>,
}

impl PromptRegistry {
    /// A registry with `[agents.prompts]` overrides. Errors: an unknown key
    /// or an empty/oversized text.
    pub fn new(config: &BTreeMap<String, String>) -> Result<PromptRegistry, PromptError> {
        for (k, v) in config {
            check_override(k, v)?;
        }
        Ok(PromptRegistry {
            config: config.clone(),
            stored: RwLock::new(BTreeMap::new()),
        })
    }

    /// The current text of `key` (stored override, else config, else default);
    /// empty for an unknown key.
    pub fn get(&self, key: &str) -> String {
        if let Some(t) = self.stored.read().ok().and_then(|m| m.get(key).cloned()) {
            return t;
        }
        if let Some(t) = self.config.get(key) {
            return t.clone();
        }
        default_text(key).unwrap_or_default().to_string()
    }

    /// Every key with its current text and where it comes from.
    pub fn list(&self) -> Vec<PromptEntry> {
        let stored = self.stored.read().map(|m| m.clone()).unwrap_or_default();
        PROMPT_KEYS
            .iter()
            .map(|&key| {
                let default = default_text(key).unwrap_or_default().to_string();
                let (text, source) = if let Some(t) = stored.get(key) {
                    (t.clone(), PromptSource::Override)
                } else if let Some(t) = self.config.get(key) {
                    (t.clone(), PromptSource::Config)
                } else {
                    (default.clone(), PromptSource::Default)
                };
                PromptEntry {
                    key: key.to_string(),
                    text,
                    source,
                    default_text: default,
                }
            })
            .collect()
    }

    /// Install an applied override (from an `ai_prompt` proposal or the
    /// settings table at start).
    pub fn set_override(&self, key: &str, text: &str) -> Result<(), PromptError> {
        check_override(key, text)?;
        if let Ok(mut m) = self.stored.write() {
            m.insert(key.to_string(), text.to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earth_prompt_states_every_rule_of_the_earth_command() {
        let p = default_text(EARTH_COMMAND).unwrap();
        for needle in [
            "Strict JSON",
            "candidate entities",
            "Do not invent",
            "Do not return code",
            "Do not modify business data",
            "clarification_needed",
            "highlight_entities",
            "Chinese",
        ] {
            assert!(p.contains(needle), "missing `{needle}`");
        }
    }

    #[test]
    fn stored_override_beats_config_which_beats_default() {
        let mut cfg = BTreeMap::new();
        cfg.insert(EARTH_COMMAND.to_string(), "from config".to_string());
        let r = PromptRegistry::new(&cfg).unwrap();
        assert_eq!(r.get(EARTH_COMMAND), "from config");
        r.set_override(EARTH_COMMAND, "from proposal").unwrap();
        assert_eq!(r.get(EARTH_COMMAND), "from proposal");
        assert_eq!(r.list().len(), 8);
        assert!(r.set_override("agents.unknown", "x").is_err());
    }
}
