//! Validation of untrusted input: parse errors that name the field, and
//! range / consistency checks that serde alone cannot express.

use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_path_to_error::Segment;

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

/// Most entries of each list (and free-form object) a client may send, so
/// that one request cannot make the registry store, index and return
/// thousands of tags or labels. A list over its limit is refused with
/// [`ValidationError`] naming the field and the limit (HTTP 422
/// `invalid_field`). Counts are entries, not bytes (bytes are bounded by
/// `http.body_limit_bytes` and the MQTT packet limit).
pub mod limits {
    /// `labels` of a provider registration.
    pub const MAX_PROVIDER_LABELS: usize = 64;
    /// `tags` of a capability, of a `capability_selector`, and a
    /// requirement's `preferred_node_tags`.
    pub const MAX_TAGS: usize = 64;
    /// `supported_actions` of a capability (a type has at most a dozen).
    pub const MAX_SUPPORTED_ACTIONS: usize = 64;
    /// `evidence_modes` of a capability.
    pub const MAX_EVIDENCE_MODES: usize = 32;
    /// `capabilities` of one registration batch (HTTP or MQTT `register`).
    pub const MAX_CAPABILITIES_PER_BATCH: usize = 256;
    /// `capabilities` (health reports) and `running_sessions` of one
    /// heartbeat.
    pub const MAX_HEARTBEAT_ENTRIES: usize = 256;
    /// `faults` of one heartbeat.
    pub const MAX_FAULTS: usize = 64;
    /// `capability_ids` and `requirements` of a lease group, and an audit
    /// task's `capability_requirements`: the registry leases at most 32
    /// capabilities together.
    pub const MAX_GROUP_MEMBERS: usize = 32;
    /// Top-level entries of a free-form object: `metadata_json`,
    /// `constraints_json`, health `metrics`, an Earth viewport's extra
    /// fields. (An action's `params` is bounded in bytes instead: the body
    /// limit and the MQTT packet limit of its command.)
    pub const MAX_OBJECT_ENTRIES: usize = 256;
    /// `artifacts` of one session update (an edge's update is at most
    /// 256 KiB, a few hundred artifacts).
    pub const MAX_ARTIFACTS_PER_UPDATE: usize = 1000;
    /// `client_context.visible_layers` of an Earth command.
    pub const MAX_VISIBLE_LAYERS: usize = 32;
    /// Lists of audit requests and results (criteria, references,
    /// findings, required actions, timeline), as the registry's audit
    /// limits.
    pub const MAX_AUDIT_LIST_ITEMS: usize = 500;
}

/// `field` has at most `max` entries (`len` of them).
///
/// Errors: "has 10000 entries; at most 64 are allowed".
pub fn check_count(field: &str, len: usize, max: usize) -> Result<(), ValidationError> {
    if len > max {
        return Err(ValidationError::new(
            field,
            format!("has {len} entries; at most {max} are allowed"),
        ));
    }
    Ok(())
}

/// [`check_count`] for an optional list.
pub fn check_opt_count<T>(
    field: &str,
    list: Option<&[T]>,
    max: usize,
) -> Result<(), ValidationError> {
    check_count(field, list.map_or(0, <[T]>::len), max)
}

/// Rules a wire value must satisfy beyond its shape.
pub trait Validate {
    /// `Ok(())` when every rule holds; otherwise the first broken rule.
    fn validate(&self) -> Result<(), ValidationError>;

    /// Bring what is matched later (tags, labels) to one spelling (Unicode
    /// NFC), so that an NFC and an NFD spelling of one tag select the same
    /// devices. [`parse_json`] and [`parse_value`] call it before
    /// [`Validate::validate`]. Nothing by default.
    fn normalize(&mut self) {}
}

/// `s` in Unicode normalization form C (composed), unchanged when it
/// already is (the common case costs one scan).
pub fn nfc(s: &mut String) {
    use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};
    if is_nfc_quick(s.chars()) != IsNormalized::Yes {
        *s = s.nfc().collect();
    }
}

/// [`nfc`] on every string of `list`.
pub fn nfc_all(list: &mut [String]) {
    list.iter_mut().for_each(nfc);
}

/// True for a character that must not appear in text shown to people:
/// control characters (C0, DEL, C1) and the bidirectional formatting
/// characters that can make a name display as another (U+061C, U+200E,
/// U+200F, U+202A..=U+202E, U+2066..=U+2069).
pub fn is_hidden_control(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
        )
}

/// Refuse `value` of `field` (a display name, a location) when it holds a
/// control or bidirectional formatting character ([`is_hidden_control`]),
/// naming the character's code point.
pub fn check_display_text(field: &str, value: &str) -> Result<(), ValidationError> {
    match value.chars().find(|c| is_hidden_control(*c)) {
        Some(c) => Err(ValidationError::new(
            field,
            format!(
                "must not contain control or bidirectional formatting characters (found U+{:04X})",
                c as u32
            ),
        )),
        None => Ok(()),
    }
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
            // serde reports a missing or a duplicate field at its parent's
            // path; put the field's own name into the path so the caller
            // sees it.
            let msg = inner.to_string();
            let missing = msg
                .strip_prefix("missing field `")
                .or_else(|| msg.strip_prefix("duplicate field `"))
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
/// Errors: [`ParseError::Syntax`] for malformed JSON (not JSON at all, or
/// cut short), [`ParseError::Field`] naming the field for a missing field,
/// an unknown enum value or a wrong type (`{"action": 123}` included),
/// [`ParseError::Invalid`] for a broken [`Validate`] rule.
pub fn parse_json<T: DeserializeOwned + Validate>(bytes: &[u8]) -> Result<T, ParseError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let value: T = match serde_path_to_error::deserialize(de) {
        Ok(v) => v,
        Err(e) if e.inner().classify() == serde_json::error::Category::Syntax => {
            return Err(syntax_or_type_error::<T>(bytes, e));
        }
        Err(e) => return Err(from_path_error(e)),
    };
    let mut value = value;
    value.normalize();
    value.validate()?;
    Ok(value)
}

/// [`parse_json`] for an already parsed JSON value (e.g. an MQTT envelope's
/// `body`); the same errors, except that it cannot meet malformed JSON.
pub fn parse_value<T: DeserializeOwned + Validate>(value: Value) -> Result<T, ParseError> {
    // By reference, so that an error can look at the value it is about.
    let value: T = match serde_path_to_error::deserialize(&value) {
        Ok(v) => v,
        Err(e) if e.inner().to_string().ends_with(", expected string or map") => {
            // serde_json's words for a wrong type where an enum belongs.
            return Err(enum_type_error::<T>(&value, &e).unwrap_or_else(|| from_path_error(e)));
        }
        Err(e) => return Err(from_path_error(e)),
    };
    let mut value = value;
    value.normalize();
    value.validate()?;
    Ok(value)
}

/// A syntax error of the streaming parser, told apart from a wrong type.
///
/// Where an enum is expected, serde_json answers a value that is neither a
/// string nor an object (`{"action": 123}`, `null`, `[]`) with "expected
/// value at line 1 column 12", classified as a syntax error although the
/// document is well-formed. In a well-formed document that is a
/// [`ParseError::Field`] at that path (see [`enum_type_error`]); a
/// document that does not parse stays [`ParseError::Syntax`].
fn syntax_or_type_error<T: DeserializeOwned>(
    bytes: &[u8],
    err: serde_path_to_error::Error<serde_json::Error>,
) -> ParseError {
    let Ok(doc) = serde_json::from_slice::<Value>(bytes) else {
        return from_path_error(err);
    };
    if let Some(e) = enum_type_error::<T>(&doc, &err) {
        return e;
    }
    ParseError::Field {
        field: field_path(err.path()),
        message: strip_position(&err.into_inner().to_string()),
    }
}

/// A field error for the value at `err`'s path in `doc` when it is not a
/// string or an object, where an enum of `T` belongs: "invalid type:
/// integer `123`, expected one of `snapshot`, `record_clip`, ..." (without
/// the list when the accepted values cannot be found). `None` when the path
/// does not lead to such a value.
fn enum_type_error<T: DeserializeOwned>(
    doc: &Value,
    err: &serde_path_to_error::Error<serde_json::Error>,
) -> Option<ParseError> {
    let segments: Vec<Segment> = err.path().iter().cloned().collect();
    let found = value_at(doc, &segments)?;
    if matches!(found, Value::String(_) | Value::Object(_)) {
        return None;
    }
    let field = field_path(err.path());
    let found = unexpected(found);
    let message = match accepted_values::<T>(doc, &segments, err.path()) {
        Some(expected) => format!("invalid type: {found}, expected {expected}"),
        None => format!("invalid type: {found}"),
    };
    Some(ParseError::Field { field, message })
}

/// A path as errors name it: `capabilities[1].capability_type`, empty for
/// the top level.
fn field_path(path: &serde_path_to_error::Path) -> String {
    let p = path.to_string();
    if p == "." {
        String::new()
    } else {
        p
    }
}

/// The value at `path` in `doc`, when every step is a key or an index.
fn value_at<'a>(doc: &'a Value, path: &[Segment]) -> Option<&'a Value> {
    path.iter().try_fold(doc, |v, seg| match seg {
        Segment::Map { key } => v.get(key.as_str()),
        Segment::Seq { index } => v.get(*index),
        _ => None,
    })
}

/// How serde names a JSON value in "invalid type: ..." messages.
fn unexpected(v: &Value) -> String {
    use serde::de::Unexpected;
    match v {
        Value::Null => Unexpected::Unit.to_string(),
        Value::Bool(b) => Unexpected::Bool(*b).to_string(),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => Unexpected::Unsigned(u).to_string(),
            (_, Some(i), _) => Unexpected::Signed(i).to_string(),
            (_, _, Some(f)) => Unexpected::Float(f).to_string(),
            _ => "number".to_string(),
        },
        Value::String(s) => Unexpected::Str(s).to_string(),
        Value::Array(_) => Unexpected::Seq.to_string(),
        Value::Object(_) => Unexpected::Map.to_string(),
    }
}

/// What the enum at `path` accepts ("one of `a`, `b`"), found by putting a
/// string no enum accepts there and reading serde's "unknown variant"
/// message. `None` unless that fails there in that way.
fn accepted_values<T: DeserializeOwned>(
    doc: &Value,
    path: &[Segment],
    at: &serde_path_to_error::Path,
) -> Option<String> {
    const PROBE: &str = "\u{1}not-a-value";
    let mut probe = doc.clone();
    let slot = path.iter().try_fold(&mut probe, |v, seg| match seg {
        Segment::Map { key } => v.get_mut(key.as_str()),
        Segment::Seq { index } => v.get_mut(*index),
        _ => None,
    })?;
    *slot = Value::String(PROBE.to_string());
    let err = serde_path_to_error::deserialize::<_, T>(&probe).err()?;
    if err.path().to_string() != at.to_string() {
        return None;
    }
    err.into_inner()
        .to_string()
        .strip_prefix(&format!("unknown variant `{PROBE}`, expected "))
        .map(str::to_string)
}

/// `#[serde(deserialize_with = "u32_in::<MIN, MAX, _>")]` for a `u32`
/// field whose rules allow `MIN..=MAX`: a value of another type, or a whole
/// number outside `u32`, is refused with "expected an integer from MIN to
/// MAX" (the range in force, not the type's). A `u32` outside the range
/// still parses, for [`check_range`] to name it in [`Validate`].
pub fn u32_in<'de, const MIN: u32, const MAX: u32, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<u32, D::Error> {
    d.deserialize_u32(RangeVisitor::<MIN, MAX>)
}

/// [`u32_in`] for an optional field (`null` is absent).
pub fn opt_u32_in<'de, const MIN: u32, const MAX: u32, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<u32>, D::Error> {
    struct In<const MIN: u32, const MAX: u32>(u32);
    impl<'de, const MIN: u32, const MAX: u32> serde::Deserialize<'de> for In<MIN, MAX> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            u32_in::<MIN, MAX, D>(d).map(In)
        }
    }
    Ok(<Option<In<MIN, MAX>> as serde::Deserialize>::deserialize(d)?.map(|v| v.0))
}

struct RangeVisitor<const MIN: u32, const MAX: u32>;

impl<const MIN: u32, const MAX: u32> serde::de::Visitor<'_> for RangeVisitor<MIN, MAX> {
    type Value = u32;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "an integer from {MIN} to {MAX}")
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u32, E> {
        u32::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u32, E> {
        u32::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
    }
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
