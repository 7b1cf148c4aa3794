//! Size limits on the free text of audit requests, results, threads and
//! messages, so one client cannot fill the store or every reader's screen.
//!
//! The body is walked as JSON, so every string and list is covered,
//! including those in free-form `metadata_json` and message `body`:
//!
//! | what | limit |
//! |---|---|
//! | titles and names (`title`, `name`, `display_name`, `project_name`, `recommended_owner`, `role`, `kind`, `response_mode`) | [`MAX_NAME_CHARS`] characters |
//! | any other string (descriptions, notes, objectives, summaries) | [`MAX_TEXT_CHARS`] characters |
//! | any list (findings, criteria, references, labels) | [`MAX_LIST_ITEMS`] items |
//! | nesting of free-form JSON | [`MAX_DEPTH`] levels |
//!
//! A broken limit is 422 `invalid_field` with `details.field` the path of
//! the offending value (`findings[3].title`).

use serde::Serialize;
use serde_json::Value;
use shared_protocol::validate::ValidationError;

use crate::error::ApiError;

/// Longest title or name, characters.
pub const MAX_NAME_CHARS: usize = 200;
/// Longest description, note or other free text, characters.
pub const MAX_TEXT_CHARS: usize = 10_000;
/// Most items in one list.
pub const MAX_LIST_ITEMS: usize = 500;
/// Deepest nesting of objects and lists.
pub const MAX_DEPTH: usize = 16;

/// Keys whose string values are titles or names.
const NAME_KEYS: &[&str] = &[
    "title",
    "name",
    "display_name",
    "project_name",
    "recommended_owner",
    "role",
    "kind",
    "response_mode",
];

/// Check every string and list of `value` against the limits above.
///
/// Errors: the first value over its limit, naming its path.
pub fn check_value(value: &Value) -> Result<(), ValidationError> {
    walk(value, "", None, 0)
}

/// [`check_value`] on a typed body; a broken limit is 422 `invalid_field`.
pub fn check<T: Serialize>(body: &T) -> Result<(), ApiError> {
    let value = serde_json::to_value(body).map_err(ApiError::internal)?;
    check_value(&value).map_err(|e| ApiError::from(shared_protocol::ParseError::Invalid(e)))
}

fn walk(value: &Value, path: &str, key: Option<&str>, depth: usize) -> Result<(), ValidationError> {
    if depth > MAX_DEPTH {
        return Err(ValidationError::new(
            path,
            format!("nested more than {MAX_DEPTH} levels deep"),
        ));
    }
    match value {
        Value::String(s) => {
            let max = if key.is_some_and(|k| NAME_KEYS.contains(&k)) {
                MAX_NAME_CHARS
            } else {
                MAX_TEXT_CHARS
            };
            let n = s.chars().count();
            if n > max {
                return Err(ValidationError::new(
                    path,
                    format!("is {n} characters long; at most {max} are allowed"),
                ));
            }
        }
        Value::Array(items) => {
            if items.len() > MAX_LIST_ITEMS {
                return Err(ValidationError::new(
                    path,
                    format!(
                        "has {} items; at most {MAX_LIST_ITEMS} are allowed",
                        items.len()
                    ),
                ));
            }
            for (i, item) in items.iter().enumerate() {
                walk(item, &format!("{path}[{i}]"), key, depth + 1)?;
            }
        }
        Value::Object(map) => {
            for (k, v) in map {
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(v, &child, Some(k), depth + 1)?;
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn limits_name_the_offending_field() {
        assert!(
            check_value(&json!({"title": "x".repeat(200), "description": "y".repeat(10_000)}))
                .is_ok()
        );
        let e = check_value(&json!({"findings": [{"title": "ok"}, {"title": "x".repeat(201)}]}))
            .unwrap_err();
        assert_eq!(e.field, "findings[1].title");
        let e =
            check_value(&json!({"findings": [{"description": "é".repeat(10_001)}]})).unwrap_err();
        assert_eq!(e.field, "findings[0].description");
        let e = check_value(&json!({"acceptance_criteria": vec!["a"; 501]})).unwrap_err();
        assert_eq!(e.field, "acceptance_criteria");
        let mut deep = json!(1);
        for _ in 0..20 {
            deep = json!([deep]);
        }
        assert!(check_value(&json!({ "metadata_json": deep })).is_err());
    }
}
