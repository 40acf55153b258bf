//! JSON Schema from Rust argument types, in the self-contained shape function-calling
//! providers accept (docs/contract.md, "Tools").
//!
//! [`schema_for`] asks schemars for the schema of the argument type, then [`normalize`]
//! rewrites it:
//!
//! - every `$ref` is inlined and `$defs`/`definitions`/`$schema`/`$id`/`title` are removed:
//!   providers reject or silently ignore references, so the model would see a hole;
//! - a type that recurses into itself becomes `{}` ("any value") at the point of recursion
//!   (the reference site's own keywords, such as its `description`, are kept);
//! - `Option<T>` is optional (schemars leaves it out of `required`) and its schema is plain
//!   `T`'s, not `["T","null"]` / `anyOf[T, null]`: providers handle nullable unions badly
//!   (some reject them, some make the model send `null` everywhere). The validator in turn
//!   tolerates an explicit `null` for an optional property, see [`super::validate`];
//! - a unit enum is `{"type":"string","enum":[...]}`; when its variants carry doc comments
//!   (schemars then emits a `oneOf` of consts) those docs are folded into the description as
//!   `` `value`: doc `` lines so they are not lost;
//! - a map is a free object `{"type":"object"}` (its `additionalProperties` schema is
//!   dropped: several providers do not support a schema there); `serde_json::Value` (a `true`
//!   schema) is `{}`, "any JSON value" — not `{"type":"object"}`, because a `Value`
//!   argument really accepts any JSON and the validator must not refuse a string there.
//!   `additionalProperties: false` (from `#[serde(deny_unknown_fields)]`) is kept;
//! - schemars' numeric `format`s (`uint32`, `double`...) are removed; they are not JSON
//!   Schema formats. Standard formats (`date-time`, `uuid`...) stay. `minimum`/`maximum`
//!   bounds stay, they are real constraints, and an integer format's range becomes them
//!   where schemars gave none (`u64`: 0 to 18446744073709551615);
//! - the root is always `{"type":"object","properties":{...}}`; `()` and unit structs (whose
//!   schemars schema is `{"type":"null"}`) become `{"type":"object","properties":{}}`. The
//!   root's own `description` (the argument type's doc comment) is dropped: the tool's
//!   description is what tells the model what the tool does, and a second, usually
//!   "Arguments of X", line would only compete with it.
//!
//! Property order is alphabetical (serde_json's map is sorted in this workspace).

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value};

/// Marker on the ref stack for `"$ref": "#"`, the root schema itself.
const ROOT_REF: &str = "#";

/// Keywords whose value is a single subschema.
const SINGLE_SUBSCHEMA: &[&str] = &[
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "propertyNames",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "contentSchema",
];

/// Keywords whose value is an array of subschemas.
const ARRAY_SUBSCHEMA: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];

/// Keywords whose value maps names to subschemas.
const MAP_SUBSCHEMA: &[&str] = &[
    "properties",
    "patternProperties",
    "dependentSchemas",
    "$defs",
    "definitions",
];

/// Keywords that make a schema depend on something outside itself.
const REFERENCE_KEYWORDS: &[&str] = &[
    "$ref",
    "$dynamicRef",
    "$recursiveRef",
    "$defs",
    "definitions",
];

/// Keywords that are noise for a model (or would change how references resolve). Nested
/// `$defs` go too: after inlining nothing can point into them.
const NOISE_KEYWORDS: &[&str] = &[
    "$defs",
    "definitions",
    "$schema",
    "$id",
    "$anchor",
    "$dynamicAnchor",
    "$recursiveAnchor",
    "$comment",
    "title",
];

/// The self-contained `parameters` schema of argument type `T` (see the module docs for
/// every rule applied).
pub fn schema_for<T: JsonSchema>() -> Value {
    // Draft 2020-12 with references (not schemars' own inlining): inlining ourselves gives
    // one code path for every reference, recursive or not, and for hand-written schemas.
    let settings = SchemaSettings::draft2020_12().with(|s| {
        s.meta_schema = None;
        s.inline_subschemas = false;
    });
    let schema = settings.into_generator().into_root_schema_for::<T>();
    normalize(schema.to_value())
}

/// Rewrites any JSON Schema into the self-contained shape [`schema_for`] produces: references
/// inlined (recursion becomes `{}`), nullable unions made plain, unit enums as string enums,
/// maps as free objects, noise removed, root an object with `properties`. Useful for
/// hand-written or imported schemas, too.
pub fn normalize(schema: Value) -> Value {
    let mut root = match schema {
        Value::Object(map) => map,
        // `true` / `false` / anything else at the root: an argument-less tool.
        _ => Map::new(),
    };
    let mut defs = Map::new();
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(found)) = root.remove(key) {
            defs.extend(found);
        }
    }
    // Root-level definitions are reachable through `#` while the root itself is being
    // inlined, so the root is on the stack from the start.
    let root_for_refs = Value::Object(root.clone());
    let resolver = Resolver {
        defs: &defs,
        root: &root_for_refs,
    };
    let mut stack = vec![ROOT_REF.to_owned()];
    let inlined = resolver.inline(Value::Object(root), &mut stack);
    let mut root = match clean(inlined) {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    finish_root(&mut root);
    Value::Object(root)
}

/// Why a schema cannot be sent to a provider as a tool's `parameters`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnfitSchema {
    /// Not a JSON object at all.
    #[error("the parameters schema must be a JSON object")]
    NotAnObject,
    /// No `"type": "object"` at the root.
    #[error(r#"the parameters schema must have "type": "object" at the root"#)]
    NotObjectTyped,
    /// A reference keyword at the JSON pointer `at`.
    #[error("the parameters schema is not self-contained: `{keyword}` at {at}")]
    Reference {
        /// The keyword (`$ref`, `$defs`...).
        keyword: &'static str,
        /// Where it is, `/` for the root.
        at: String,
    },
}

/// Checks that `schema` can be sent to a provider as a tool's `parameters`: an object with
/// `"type":"object"` at the root, and no `$ref`, `$dynamicRef`, `$recursiveRef`, `$defs` or
/// `definitions` anywhere. The error names the JSON pointer of the first offending keyword.
pub fn check_parameters(schema: &Value) -> Result<(), UnfitSchema> {
    let Some(root) = schema.as_object() else {
        return Err(UnfitSchema::NotAnObject);
    };
    if root.get("type").and_then(Value::as_str) != Some("object") {
        return Err(UnfitSchema::NotObjectTyped);
    }
    find_reference(schema, &mut String::new())
}

/// Depth-first search for a reference keyword, schema-aware: a *property* called `$ref` or a
/// `default` value holding such a key is not a reference.
fn find_reference(schema: &Value, path: &mut String) -> Result<(), UnfitSchema> {
    let Value::Object(map) = schema else {
        return Ok(());
    };
    for keyword in REFERENCE_KEYWORDS {
        if map.contains_key(*keyword) {
            let at = if path.is_empty() { "/" } else { path.as_str() };
            return Err(UnfitSchema::Reference {
                keyword,
                at: at.to_owned(),
            });
        }
    }
    let base = path.len();
    for (suffix, sub) in subschemas(map) {
        path.push_str(&suffix);
        let result = find_reference(sub, path);
        path.truncate(base);
        result?;
    }
    Ok(())
}

/// The direct subschemas of a schema object, each with its JSON pointer suffix.
fn subschemas(map: &Map<String, Value>) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    for (key, value) in map {
        let key_str = key.as_str();
        let array_form = SINGLE_SUBSCHEMA.contains(&key_str) || ARRAY_SUBSCHEMA.contains(&key_str);
        match value {
            // `prefixItems`, `allOf`... and draft 7's tuple form of `items`.
            Value::Array(items) if array_form => {
                for (i, sub) in items.iter().enumerate() {
                    out.push((format!("/{key}/{i}"), sub));
                }
            }
            sub if SINGLE_SUBSCHEMA.contains(&key_str) => out.push((format!("/{key}"), sub)),
            Value::Object(entries) if MAP_SUBSCHEMA.contains(&key_str) => {
                for (name, sub) in entries {
                    out.push((format!("/{key}/{}", escape_pointer(name)), sub));
                }
            }
            _ => {}
        }
    }
    out
}

/// JSON pointer escaping of one segment (RFC 6901).
fn escape_pointer(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// `map` with every direct subschema replaced by `f(subschema)`: the value of a
/// single-subschema keyword (or each of its tuple form), each item of an array keyword, each
/// entry of a map keyword. Everything else stays as it is.
fn map_subschemas(
    map: Map<String, Value>,
    mut f: impl FnMut(Value) -> Value,
) -> Map<String, Value> {
    map.into_iter()
        .map(|(key, value)| {
            let keyword = key.as_str();
            let value = match value {
                Value::Array(items)
                    if SINGLE_SUBSCHEMA.contains(&keyword)
                        || ARRAY_SUBSCHEMA.contains(&keyword) =>
                {
                    Value::Array(items.into_iter().map(&mut f).collect())
                }
                sub if SINGLE_SUBSCHEMA.contains(&keyword) => f(sub),
                Value::Object(entries) if MAP_SUBSCHEMA.contains(&keyword) => Value::Object(
                    entries
                        .into_iter()
                        .map(|(name, sub)| (name, f(sub)))
                        .collect(),
                ),
                other => other,
            };
            (key, value)
        })
        .collect()
}

/// Inlines references against the root's definitions.
struct Resolver<'a> {
    defs: &'a Map<String, Value>,
    root: &'a Value,
}

impl Resolver<'_> {
    /// Returns `node` with every reference replaced by the referenced schema; `stack` holds
    /// the references being inlined above this point, to cut recursion.
    fn inline(&self, node: Value, stack: &mut Vec<String>) -> Value {
        let Value::Object(mut map) = node else {
            return node;
        };
        if let Some(reference) = map.remove("$ref") {
            let siblings = self.inline_children(map, stack);
            let key = reference.as_str().unwrap_or_default().to_owned();
            if stack.contains(&key) {
                // Recursion: "any value" here, keeping the reference site's description.
                return Value::Object(siblings);
            }
            let Some(target) = self.lookup(&key) else {
                tracing::warn!(reference = %key, "unresolvable $ref in a tool schema; using {{}}");
                return Value::Object(siblings);
            };
            stack.push(key);
            let resolved = self.inline(target.clone(), stack);
            stack.pop();
            let mut merged = match resolved {
                Value::Object(resolved) => resolved,
                // `true` (any value) or `false`; `false` would make the field unusable.
                _ => Map::new(),
            };
            // The reference site's keywords win: a field's doc comment beats its type's.
            merged.extend(siblings);
            return Value::Object(merged);
        }
        Value::Object(self.inline_children(map, stack))
    }

    /// Inlines the subschemas of one schema object.
    fn inline_children(
        &self,
        map: Map<String, Value>,
        stack: &mut Vec<String>,
    ) -> Map<String, Value> {
        map_subschemas(map, |sub| self.inline(sub, stack))
    }

    /// The schema a reference points at: `#`, `#/$defs/Name` or `#/definitions/Name`.
    fn lookup(&self, reference: &str) -> Option<&Value> {
        if reference == ROOT_REF {
            return Some(self.root);
        }
        let name = reference
            .strip_prefix("#/$defs/")
            .or_else(|| reference.strip_prefix("#/definitions/"))?;
        self.defs.get(&decode_ref_name(name))
    }
}

/// Undoes schemars' reference-name encoding: percent-encoding (URI fragment), then JSON
/// pointer escapes.
fn decode_ref_name(name: &str) -> String {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(byte) = name
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out)
        .replace("~1", "/")
        .replace("~0", "~")
}

/// The provider-facing cleanup of an inlined schema (nullable unions, enums, maps, noise).
fn clean(node: Value) -> Value {
    let mut map = match node {
        // `true`: any value. Spelled `{}` because some providers reject boolean schemas.
        Value::Bool(true) => return Value::Object(Map::new()),
        Value::Object(map) => map,
        other => return other,
    };

    // Before descending: a nullable union collapses into its one non-null alternative, whose
    // keywords the union's own (a field's description) override. Done first so the field's
    // description is in place when an enum below folds its variant docs into it.
    strip_null(&mut map);

    // `additionalProperties: false` (deny_unknown_fields) passes through `clean` as it is;
    // only `true` is respelled.
    let mut map = map_subschemas(map, clean);
    for keyword in NOISE_KEYWORDS {
        map.remove(*keyword);
    }
    drop_numeric_format(&mut map);
    collapse_unit_enum(&mut map);
    free_map(&mut map);
    Value::Object(map)
}

/// Turns `["T","null"]`, `anyOf/oneOf [T, {"type":"null"}]`, `enum [..., null]` and
/// `default: null` into their non-null form.
fn strip_null(map: &mut Map<String, Value>) {
    if let Some(Value::Array(types)) = map.get_mut("type") {
        if types.len() > 1 {
            types.retain(|t| t != "null");
        }
        if types.len() == 1 {
            let only = types.remove(0);
            map.insert("type".to_owned(), only);
        }
    }
    if let Some(Value::Array(values)) = map.get_mut("enum")
        && values.len() > 1
    {
        values.retain(|v| !v.is_null());
    }
    if map.get("default").is_some_and(Value::is_null) {
        map.remove("default");
    }
    for keyword in ["anyOf", "oneOf"] {
        let Some(Value::Array(alternatives)) = map.get_mut(keyword) else {
            continue;
        };
        let before = alternatives.len();
        alternatives.retain(|alt| !is_null_schema(alt));
        if alternatives.len() == before {
            continue;
        }
        if alternatives.len() == 1 {
            let only = alternatives.remove(0);
            map.remove(keyword);
            if let Value::Object(mut inner) = only {
                // The alternative may itself be nullable (`Option<Option<T>>`).
                strip_null(&mut inner);
                for (key, value) in inner {
                    map.entry(key).or_insert(value);
                }
            }
        } else if alternatives.is_empty() {
            map.remove(keyword);
        }
    }
}

/// `{"type":"null"}` (with nothing else but annotations).
fn is_null_schema(schema: &Value) -> bool {
    let Some(map) = schema.as_object() else {
        return false;
    };
    map.get("type").and_then(Value::as_str) == Some("null")
        && map
            .keys()
            .all(|k| matches!(k.as_str(), "type" | "description" | "title"))
}

/// schemars' `int32`, `uint64`, `double`... are not JSON Schema formats; they only confuse.
/// An integer format's range becomes `minimum`/`maximum` first (where the schema has none):
/// JSON Schema calls `1e300` an integer, and without the bound the validator would accept
/// a value the Rust type cannot hold.
fn drop_numeric_format(map: &mut Map<String, Value>) {
    let numeric = matches!(
        map.get("type").and_then(Value::as_str),
        Some("integer" | "number")
    );
    if !numeric {
        return;
    }
    let range: Option<(Value, Value)> = match map.get("format").and_then(Value::as_str) {
        Some("int8") => Some((i8::MIN.into(), i8::MAX.into())),
        Some("int16") => Some((i16::MIN.into(), i16::MAX.into())),
        Some("int32") => Some((i32::MIN.into(), i32::MAX.into())),
        Some("int64" | "int") => Some((i64::MIN.into(), i64::MAX.into())),
        Some("uint8") => Some((0.into(), u8::MAX.into())),
        Some("uint16") => Some((0.into(), u16::MAX.into())),
        Some("uint32") => Some((0.into(), u32::MAX.into())),
        Some("uint64" | "uint") => Some((0.into(), u64::MAX.into())),
        _ => None,
    };
    if let Some((min, max)) = range {
        if !map.contains_key("minimum") && !map.contains_key("exclusiveMinimum") {
            map.insert("minimum".to_owned(), min);
        }
        if !map.contains_key("maximum") && !map.contains_key("exclusiveMaximum") {
            map.insert("maximum".to_owned(), max);
        }
    }
    map.remove("format");
}

/// A `oneOf` (or `anyOf`) of string consts — a unit enum whose variants have doc comments —
/// becomes `{"type":"string","enum":[...]}`, the variant docs folded into the description.
fn collapse_unit_enum(map: &mut Map<String, Value>) {
    for keyword in ["oneOf", "anyOf"] {
        let Some(Value::Array(alternatives)) = map.get(keyword) else {
            continue;
        };
        let mut values = Vec::new();
        let mut docs = Vec::new();
        for alternative in alternatives {
            let Some((value, doc)) = string_const(alternative) else {
                return;
            };
            if let Some(doc) = doc {
                docs.push(format!("`{value}`: {doc}"));
            }
            values.push(Value::String(value));
        }
        if values.is_empty() {
            return;
        }
        map.remove(keyword);
        map.insert("type".to_owned(), Value::String("string".to_owned()));
        map.insert("enum".to_owned(), Value::Array(values));
        if !docs.is_empty() {
            let mut description = map
                .get("description")
                .and_then(Value::as_str)
                .map(|d| format!("{d}\n"))
                .unwrap_or_default();
            description.push_str(&docs.join("\n"));
            map.insert("description".to_owned(), Value::String(description));
        }
        return;
    }
}

/// `{"type":"string","const":"x","description":"..."}` (or `enum: ["x"]`) -> ("x", doc).
fn string_const(schema: &Value) -> Option<(String, Option<String>)> {
    let map = schema.as_object()?;
    if map
        .keys()
        .any(|k| !matches!(k.as_str(), "type" | "const" | "enum" | "description"))
    {
        return None;
    }
    if map.get("type").is_some_and(|t| t != "string") {
        return None;
    }
    let value = match (map.get("const"), map.get("enum")) {
        (Some(Value::String(v)), None) => v.clone(),
        (None, Some(Value::Array(values))) if values.len() == 1 => values[0].as_str()?.to_owned(),
        _ => return None,
    };
    let doc = map
        .get("description")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Some((value, doc))
}

/// Maps are free objects: a schema under `additionalProperties` (or `propertyNames`) is
/// dropped because several providers support neither; `false` stays (deny_unknown_fields).
fn free_map(map: &mut Map<String, Value>) {
    if map
        .get("additionalProperties")
        .is_some_and(|v| v != &Value::Bool(false))
    {
        map.remove("additionalProperties");
    }
    map.remove("propertyNames");
}

/// The root is `{"type":"object","properties":{...}}` and carries no description of its own.
fn finish_root(root: &mut Map<String, Value>) {
    root.remove("description");
    // `()` and unit structs are `{"type":"null"}`; `serde_json::Value` is `{}`: both mean a
    // free argument object. Anything else keeps its type, and `check_parameters` refuses a
    // non-object root.
    let is_null = root.get("type").and_then(Value::as_str) == Some("null");
    let shapeless = root
        .keys()
        .all(|k| matches!(k.as_str(), "default" | "examples"));
    if is_null || shapeless {
        root.insert("type".to_owned(), Value::String("object".to_owned()));
    }
    if root.get("type").and_then(Value::as_str) == Some("object")
        && !root.contains_key("properties")
    {
        root.insert("properties".to_owned(), Value::Object(Map::new()));
    }
}
