//! Validation of untrusted input: parse errors that name the field, and
//! range / consistency checks that serde alone cannot express.

use serde::de::DeserializeOwned;

/// A value that parsed but breaks a rule of the protocol (a range, a
/// combination of fields, an action the capability type does not support).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    /// Dotted path of the offending field, e.g. `capabilities[1].priority`.
    pub field: String,
    pub message: String,
}

impl ValidationError {
    /// An error about `field` (a dotted path) with a human-readable message.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The same error nested under `parent` (`parent.field`, or `parent[i].field`
    /// when `parent` already ends in an index).
    pub fn within(mut self, parent: &str) -> Self {
        self.field = if self.field.is_empty() {
            parent.to_string()
        } else {
            format!("{parent}.{}", self.field)
        };
        self
    }
}

/// Rules a wire value must satisfy beyond its shape.
pub trait Validate {
    /// `Ok(())` when every rule holds; otherwise the first broken rule.
    fn validate(&self) -> Result<(), ValidationError>;
}

/// Why untrusted JSON was refused.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not JSON at all, or truncated.
    #[error("malformed JSON: {0}")]
    Syntax(String),
    /// JSON, but a field is missing, unknown (for closed enums), or of the wrong
    /// type. `field` is the path (`capabilities[0].capability_type`), empty
    /// for the top level.
    #[error("invalid field `{field}`: {message}")]
    Field { field: String, message: String },
    /// Parsed, but a protocol rule is broken.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
}

impl ParseError {
    /// The offending field's path, when there is one.
    pub fn field(&self) -> Option<&str> {
        match self {
            ParseError::Syntax(_) => None,
            ParseError::Field { field, .. } => Some(field),
            ParseError::Invalid(v) => Some(&v.field),
        }
    }
}

fn from_path_error(err: serde_path_to_error::Error<serde_json::Error>) -> ParseError {
    let field = err.path().to_string();
    let inner = err.into_inner();
    let field = if field == "." { String::new() } else { field };
    match inner.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            ParseError::Syntax(inner.to_string())
        }
        _ => {
            // serde reports a missing field at its parent's path; put the
            // field's own name into the path so the caller sees it.
            let msg = inner.to_string();
            let missing = msg
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split('`').next())
                .map(str::to_string);
            let field = match missing {
                Some(name) if field.is_empty() => name,
                Some(name) => format!("{field}.{name}"),
                None => field,
            };
            ParseError::Field {
                field,
                message: strip_position(&msg),
            }
        }
    }
}

fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

/// Parse untrusted JSON bytes into `T` and validate it.
///
/// Errors: [`ParseError::Syntax`] for malformed JSON, [`ParseError::Field`]
/// naming the field for a missing field, an unknown enum value or a wrong
/// type, [`ParseError::Invalid`] for a broken [`Validate`] rule.
pub fn parse_json<T: DeserializeOwned + Validate>(bytes: &[u8]) -> Result<T, ParseError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(de).map_err(from_path_error)?;
    value.validate()?;
    Ok(value)
}

/// [`parse_json`] for an already parsed JSON value (e.g. an MQTT envelope's
/// `body`).
pub fn parse_value<T: DeserializeOwned + Validate>(
    value: serde_json::Value,
) -> Result<T, ParseError> {
    let value: T = serde_path_to_error::deserialize(value).map_err(from_path_error)?;
    value.validate()?;
    Ok(value)
}

/// Check `value` lies in `range`, naming `field` otherwise.
pub fn check_range<T: PartialOrd + std::fmt::Display + Copy>(
    field: &str,
    value: T,
    min: T,
    max: T,
) -> Result<(), ValidationError> {
    if value < min || value > max {
        return Err(ValidationError::new(
            field,
            format!("{value} is out of range {min}..={max}"),
        ));
    }
    Ok(())
}

/// Check a free-text identifier: 1..=128 characters of `[A-Za-z0-9._:-]`.
/// Identifiers end up in MQTT topics and file names, so nothing else is let in.
pub fn check_id(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.is_empty() || value.len() > 128 {
        return Err(ValidationError::new(field, "must be 1 to 128 characters"));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
    {
        return Err(ValidationError::new(
            field,
            format!("`{value}` may only contain ASCII letters and digits and . _ : -"),
        ));
    }
    Ok(())
}

/// Validate each element of a list, naming `field[i]` on failure.
pub fn validate_each<T: Validate>(field: &str, items: &[T]) -> Result<(), ValidationError> {
    for (i, item) in items.iter().enumerate() {
        item.validate()
            .map_err(|e| e.within(&format!("{field}[{i}]")))?;
    }
    Ok(())
}
