//! The JSON tool-call protocol (docs/earth-command.md, "With a model"): a model
//! without provider-native tools answers with one JSON object,
//! `{"type": "tool_call", "tool": ..., "arguments": {...}}` or
//! `{"type": "final", "summary": ..., "result": {...}}`.
//!
//! Models wrap JSON in prose or Markdown fences, so parsing is forgiving
//! about the wrapping and strict about the object: fences are stripped, the
//! first `{` that starts a complete JSON object is taken, and that object
//! must be a tool call or a final answer.

use serde_json::{json, Map, Value};
use shared_protocol::agent::{AgentMessage, FinalAnswer, ToolCall, ToolDescriptor};

/// Why a model reply is not a protocol message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("the reply is empty")]
    Empty,
    #[error("the reply contains no JSON object")]
    NoJsonObject,
    #[error("the JSON object has no `type`; expected \"tool_call\" or \"final\"")]
    MissingType,
    #[error("unknown `type` `{0}`; expected \"tool_call\" or \"final\"")]
    UnknownType(String),
    #[error("a tool_call needs a non-empty string `tool`")]
    MissingTool,
    #[error("`arguments` must be a JSON object")]
    ArgumentsNotObject,
    #[error("a final answer needs a string `summary`")]
    MissingSummary,
}

/// Remove Markdown code fences (```json ... ```), keeping their content.
fn strip_fences(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The first complete JSON object in `text`, if any.
pub fn first_json_object(text: &str) -> Option<Map<String, Value>> {
    let cleaned = strip_fences(text);
    for (i, _) in cleaned.match_indices('{') {
        let mut stream = serde_json::Deserializer::from_str(&cleaned[i..]).into_iter::<Value>();
        if let Some(Ok(Value::Object(m))) = stream.next() {
            return Some(m);
        }
    }
    None
}

/// Parse a model reply into a protocol message.
pub fn parse_agent_message(text: &str) -> Result<AgentMessage, ProtocolError> {
    if text.trim().is_empty() {
        return Err(ProtocolError::Empty);
    }
    let obj = first_json_object(text).ok_or(ProtocolError::NoJsonObject)?;
    let kind = obj
        .get("type")
        .and_then(Value::as_str)
        .ok_or(ProtocolError::MissingType)?;
    match kind {
        "tool_call" => {
            let tool = obj
                .get("tool")
                .or_else(|| obj.get("name"))
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .ok_or(ProtocolError::MissingTool)?;
            let arguments = match obj.get("arguments") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(m)) => m.clone(),
                // A stringified object is accepted; anything else is not.
                Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                    Ok(Value::Object(m)) => m,
                    _ => return Err(ProtocolError::ArgumentsNotObject),
                },
                Some(_) => return Err(ProtocolError::ArgumentsNotObject),
            };
            Ok(AgentMessage::ToolCall(ToolCall {
                tool: tool.to_string(),
                arguments,
            }))
        }
        "final" => {
            let summary = obj
                .get("summary")
                .and_then(Value::as_str)
                .ok_or(ProtocolError::MissingSummary)?;
            Ok(AgentMessage::Final(FinalAnswer {
                summary: summary.to_string(),
                result: obj.get("result").cloned().unwrap_or(Value::Null),
            }))
        }
        other => Err(ProtocolError::UnknownType(other.to_string())),
    }
}

/// The protocol instructions appended to the system prompt when the JSON
/// protocol is used: the message shapes and every tool with its schema.
pub fn json_protocol_instructions(tools: &[ToolDescriptor]) -> String {
    let listing: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "description": t.description,
                "side_effect_level": t.side_effect_level,
                "input_schema": t.input_schema,
            })
        })
        .collect();
    format!(
        "Protocol: reply with exactly one JSON object and nothing else.\n\
         To call a tool: {{\"type\": \"tool_call\", \"tool\": \"<tool name>\", \"arguments\": {{...}}}}\n\
         When done: {{\"type\": \"final\", \"summary\": \"...\", \"result\": {{...}}}}\n\
         Tool results come back in a user message starting with TOOL_RESULT or TOOL_ERROR.\n\
         Available tools (only these exist):\n{}",
        serde_json::to_string_pretty(&listing).unwrap_or_default()
    )
}

/// The protocol instructions when provider-native tools are used: tools are
/// sent in `tools`; the final answer is still one JSON object.
pub fn native_protocol_instructions() -> &'static str {
    "Protocol: call tools through the provided function-calling interface. When done, reply with \
     exactly one JSON object and nothing else: {\"type\": \"final\", \"summary\": \"...\", \
     \"result\": {...}}."
}

/// OpenAI `tools` entries for the descriptors. Tool names keep their dots
/// (`earth.find_entities`); providers that refuse dots get the JSON
/// protocol through the usual fallback.
pub fn openai_tools(tools: &[ToolDescriptor]) -> Vec<Value> {
    tools
        .iter()
        .map(|t| {
            json!({
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.input_schema,
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fenced_tool_call_with_prose_around_it_parses() {
        let text = "Sure, let me look.\n```json\n{\"type\": \"tool_call\", \"tool\": \"earth.find_entities\", \
                    \"arguments\": {\"domain\": \"satellites\", \"filters\": {\"constellation\": \"beidou\"}, \
                    \"limit\": 500}}\n```\nDone.";
        match parse_agent_message(text).unwrap() {
            AgentMessage::ToolCall(c) => {
                assert_eq!(c.tool, "earth.find_entities");
                assert_eq!(c.arguments["filters"]["constellation"], "beidou");
            }
            other => panic!("expected a tool call, got {other:?}"),
        }
    }

    #[test]
    fn a_final_answer_parses_with_its_result() {
        let m = parse_agent_message(
            r#"{"type":"final","summary":"已找到并高亮北斗卫星。","result":{"actions":[]}}"#,
        )
        .unwrap();
        assert!(matches!(m, AgentMessage::Final(f) if f.result["actions"].is_array()));
    }

    #[test]
    fn broken_json_and_unknown_types_are_errors() {
        assert_eq!(
            parse_agent_message("{\"type\": \"tool_call\", \"tool\": \"x\", ").unwrap_err(),
            ProtocolError::NoJsonObject
        );
        assert_eq!(
            parse_agent_message("{\"type\": \"shell\", \"cmd\": \"rm\"}").unwrap_err(),
            ProtocolError::UnknownType("shell".into())
        );
        assert_eq!(
            parse_agent_message("{\"type\": \"tool_call\", \"tool\": \"x\", \"arguments\": [1]}")
                .unwrap_err(),
            ProtocolError::ArgumentsNotObject
        );
        assert_eq!(parse_agent_message("  ").unwrap_err(), ProtocolError::Empty);
    }

    #[test]
    fn a_nested_brace_in_prose_before_the_object_is_skipped() {
        let m =
            parse_agent_message("set {x} then {\"type\":\"final\",\"summary\":\"ok\"}").unwrap();
        assert!(matches!(m, AgentMessage::Final(_)));
    }
}
