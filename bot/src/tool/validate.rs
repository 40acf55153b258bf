//! Argument validation (docs/contract.md, "Tools"): the model's arguments string becomes JSON
//! ([`parse_arguments`]) and is checked against the tool's schema ([`ArgValidator`]) before
//! any tool code runs. Every error is written for the model: where (a JSON pointer such as
//! `/plan/0/status`) and what was expected, so it can correct the call itself.
//!
//! One deliberate leniency: schemas never say `null` for an `Option<T>` (see
//! [`super::schema`]), yet models often send `"field": null` to mean "not given". An explicit
//! `null` for a property that is not `required` is therefore treated as absent (see
//! [`drop_optional_nulls`]) rather than bounced back to the model.

use std::fmt::Write as _;
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use jsonschema::error::{TypeKind, ValidationErrorKind};
use serde_json::{Map, Value};

/// At most this many violations are listed in one error; the rest are counted.
const MAX_VIOLATIONS: usize = 5;

/// Values quoted in an error are cut to this many characters.
const MAX_VALUE_CHARS: usize = 60;

/// A schema that could not be compiled into a validator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The schema is not a valid JSON Schema (draft 2020-12).
    #[error("invalid JSON Schema: {0}")]
    Invalid(String),
}

/// Why a model's arguments were refused. Each text is written for the model (where, what was
/// expected, what to do) and goes to it verbatim, so the error also reads as that `str`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgumentsError {
    /// The arguments string is not JSON.
    #[error("{0}")]
    NotJson(String),
    /// JSON, but not an object.
    #[error("{0}")]
    NotAnObject(String),
    /// An object the tool's schema does not accept.
    #[error("{0}")]
    Mismatch(String),
    /// Accepted by the schema, yet not readable into the tool's argument type.
    #[error("{0}")]
    Unreadable(String),
}

impl Deref for ArgumentsError {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            ArgumentsError::NotJson(text)
            | ArgumentsError::NotAnObject(text)
            | ArgumentsError::Mismatch(text)
            | ArgumentsError::Unreadable(text) => text,
        }
    }
}

/// A tool's compiled argument schema. Cheap to clone (shared), `Send + Sync`.
#[derive(Debug, Clone)]
pub struct ArgValidator {
    /// Compiled now ([`ArgValidator::new`]) or at the first call ([`ArgValidator::lazy`]);
    /// the error when it does not compile.
    validator: Arc<OnceLock<Result<jsonschema::Validator, String>>>,
    schema: Arc<Value>,
}

impl ArgValidator {
    /// Compiles `schema` (a tool's self-contained `parameters`).
    pub fn new(schema: &Value) -> Result<Self, SchemaError> {
        let validator =
            jsonschema::validator_for(schema).map_err(|e| SchemaError::Invalid(e.to_string()))?;
        Ok(ArgValidator {
            validator: Arc::new(OnceLock::from(Ok(validator))),
            schema: Arc::new(schema.clone()),
        })
    }

    /// The validator of `schema`, compiled when it first checks arguments. The registry's
    /// choice: most tools are never called in a daemon's life, and compiling every schema
    /// was half of the start-up's work (the toolsets' builders compile theirs once, to
    /// refuse a bad one at start). A schema that does not compile fails that tool's calls.
    pub fn lazy(schema: &Value) -> Self {
        ArgValidator {
            validator: Arc::new(OnceLock::new()),
            schema: Arc::new(schema.clone()),
        }
    }

    /// The schema this validator checks against.
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// Checks `args` against the schema. The error lists each violation (at most
    /// five, then how many more) as `<pointer>: <what was expected>`, e.g.
    /// `/plan/0/status: "done" is not one of "pending", "in_progress", "completed"`.
    pub fn validate(&self, args: &Value) -> Result<(), ArgumentsError> {
        let cleaned;
        let args = if contains_null(args) {
            let mut copy = args.clone();
            drop_optional_nulls(&self.schema, &mut copy);
            cleaned = copy;
            &cleaned
        } else {
            args
        };

        let validator = match self
            .validator
            .get_or_init(|| jsonschema::validator_for(&self.schema).map_err(|e| e.to_string()))
        {
            Ok(validator) => validator,
            Err(why) => {
                return Err(ArgumentsError::Unreadable(format!(
                    "this tool's argument schema does not compile ({why}); it cannot be called"
                )));
            }
        };
        let mut lines = Vec::new();
        let mut total = 0usize;
        for error in validator.iter_errors(args) {
            total += 1;
            if lines.len() < MAX_VIOLATIONS {
                lines.push(describe(&error, &self.schema));
            }
        }
        if total == 0 {
            return Ok(());
        }
        let mut message = String::from("the arguments do not fit the tool's schema: ");
        message.push_str(&lines.join("; "));
        if total > lines.len() {
            let _ = write!(message, "; and {} more", total - lines.len());
        }
        message.push_str(". Fix the arguments and call the tool again.");
        Err(ArgumentsError::Mismatch(message))
    }
}

/// One violation as `<where>: <what>`.
fn describe(error: &jsonschema::ValidationError<'_>, schema: &Value) -> String {
    let path = error.instance_path().as_str();
    let at = if path.is_empty() { "(top level)" } else { path };
    let instance = error.instance();
    let what = match error.kind() {
        ValidationErrorKind::Required { property } => {
            format!("missing required property {property}")
        }
        ValidationErrorKind::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(t) => format!("\"{t}\""),
                TypeKind::Multiple(types) => types
                    .iter()
                    .map(|t| format!("\"{t}\""))
                    .collect::<Vec<_>>()
                    .join(" or "),
            };
            format!("expected {expected}, got {}", typed(instance))
        }
        ValidationErrorKind::Enum { options } => {
            let options = match options.as_ref() {
                Value::Array(values) => values.iter().map(short).collect::<Vec<_>>().join(", "),
                other => short(other),
            };
            format!("{} is not one of {options}", short(instance))
        }
        ValidationErrorKind::Constant { expected_value } => {
            format!(
                "expected {}, got {}",
                short(expected_value),
                short(instance)
            )
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            let unexpected = unexpected
                .iter()
                .map(|p| format!("\"{p}\""))
                .collect::<Vec<_>>()
                .join(", ");
            let allowed = allowed_properties(schema, error.schema_path().as_str());
            if allowed.is_empty() {
                format!("unexpected property {unexpected} (this object takes no properties)")
            } else {
                format!("unexpected property {unexpected} (allowed: {allowed})")
            }
        }
        ValidationErrorKind::AnyOf { .. } | ValidationErrorKind::OneOfNotValid { .. } => {
            format!(
                "{} matches none of the allowed shapes (see the schema)",
                short(instance)
            )
        }
        // The library's own wording is clear for the rest (bounds, lengths, patterns...);
        // only its quoting of long values is cut.
        _ => cut(&error.to_string(), 200),
    };
    format!("{at}: {what}")
}

/// The names under `properties` of the object whose `additionalProperties` refused a key,
/// quoted and comma-separated. The schema is self-contained, so the error's schema path is
/// a plain pointer into it.
fn allowed_properties(schema: &Value, schema_path: &str) -> String {
    let parent = schema_path
        .rsplit_once('/')
        .map_or("", |(parent, _keyword)| parent);
    schema
        .pointer(parent)
        .and_then(|object| object.get("properties"))
        .and_then(Value::as_object)
        .map(|properties| {
            properties
                .keys()
                .map(|k| format!("\"{k}\""))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

/// The JSON type name of a value, as the schema spells types.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A value with its type, `string "abc"`; plain `null` for null.
fn typed(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        other => format!("{} {}", json_type(other), short(other)),
    }
}

/// A value as compact JSON, cut to a readable length.
fn short(value: &Value) -> String {
    cut(&value.to_string(), MAX_VALUE_CHARS)
}

/// `text` cut to `max` characters (on a char boundary), marked with `…` when cut.
fn cut(text: &str, max: usize) -> String {
    crate::text::ellipsize(text, max).into_owned()
}

/// Whether a `null` occurs anywhere in `value` (the fast path skips the copy otherwise).
fn contains_null(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.iter().any(contains_null),
        Value::Object(map) => map.values().any(contains_null),
        _ => false,
    }
}

/// Removes every object member whose value is `null` and which the schema does not list as
/// `required`, recursing along `properties` and `items`. Models send `"x": null` for "not
/// given"; for an `Option<T>` that means `None`, and for a `#[serde(default)]` field it
/// means the default, which serde only applies when the member is absent.
pub fn drop_optional_nulls(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(object) => {
            let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
                return;
            };
            let required = required_names(schema);
            object.retain(|key, v| !v.is_null() || required.contains(&key.as_str()));
            for (key, v) in object.iter_mut() {
                if let Some(sub) = properties.get(key) {
                    drop_optional_nulls(sub, v);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items").filter(|s| s.is_object()) {
                for item in items {
                    drop_optional_nulls(item_schema, item);
                }
            }
        }
        _ => {}
    }
}

/// The `required` names of an object schema.
fn required_names(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The model's arguments string as a JSON object.
///
/// - Empty or whitespace-only, or `null`: `{}` — models send that for tools without
///   arguments.
/// - Invalid JSON: an error with the parser's reason, line and column, and the text up to
///   and including the offending character.
/// - A JSON *string* whose content is itself a JSON object (`"{\"a\":1}"`, the arguments
///   encoded twice — some models do this): unwrapped once. Only once: a deeper nesting is
///   not a plausible slip and is reported as not being an object.
/// - Any other non-object (an array, a number...): an error, since arguments are always an
///   object.
pub fn parse_arguments(raw: &str) -> Result<Value, ArgumentsError> {
    if raw.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let value: Value = serde_json::from_str(raw).map_err(|e| {
        let near = text_before(raw, e.line(), e.column());
        let near = if near.is_empty() {
            String::new()
        } else {
            format!("; the text up to the error: `{near}`")
        };
        ArgumentsError::NotJson(format!(
            "the arguments are not valid JSON ({e}{near}). Send the arguments as one JSON \
             object, e.g. {{\"name\": \"value\"}}."
        ))
    })?;
    let value = match value {
        Value::String(inner) => match serde_json::from_str::<Value>(&inner) {
            Ok(object @ Value::Object(_)) => object,
            _ => Value::String(inner),
        },
        other => other,
    };
    match value {
        Value::Object(_) => Ok(value),
        Value::Null => Ok(Value::Object(Map::new())),
        other => Err(ArgumentsError::NotAnObject(format!(
            "the arguments must be a JSON object, got {}.",
            typed(&other)
        ))),
    }
}

/// Up to 30 characters of `raw` ending at the 1-based `line`/`column` serde_json reports
/// (the offending character included; its column counts bytes); empty when unknown.
fn text_before(raw: &str, line: usize, column: usize) -> String {
    if line == 0 {
        return String::new();
    }
    let Some(line_text) = raw.lines().nth(line - 1) else {
        return String::new();
    };
    let before = crate::text::up_to_byte(line_text, column);
    crate::text::last_chars(before, 30).trim_start().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_lazy_validator_compiles_at_its_first_check_and_a_broken_schema_fails_the_call() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        let lazy = ArgValidator::lazy(&schema);
        assert!(
            lazy.validator.get().is_none(),
            "nothing compiled before a call"
        );
        assert!(lazy.validate(&json!({"n": 1})).is_ok());
        assert!(lazy.validator.get().is_some());
        assert!(matches!(
            lazy.validate(&json!({"n": "x"})),
            Err(ArgumentsError::Mismatch(_))
        ));

        let broken = json!({"type": "object", "properties": {"n": {"type": "nope"}}});
        assert!(ArgValidator::new(&broken).is_err());
        let error = ArgValidator::lazy(&broken)
            .validate(&json!({}))
            .unwrap_err();
        assert!(matches!(error, ArgumentsError::Unreadable(_)), "{error:?}");
        assert!(error.contains("does not compile"), "{error}");
    }
}
