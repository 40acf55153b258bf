//! Schema generation (one snapshot per rule of docs/contract.md, "Tools") and argument validation.

#![allow(dead_code)] // The argument types only exist for their schemas.

use std::collections::{BTreeMap, HashMap};

use expect_test::{Expect, expect};
use parlor_bot::tool::schema::{check_parameters, normalize, schema_for};
use parlor_bot::tool::validate::{ArgValidator, drop_optional_nulls, parse_arguments};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

/// Asserts that no schema object anywhere (keys at any depth, not only schema positions)
/// holds a reference or a definitions table, or schemars noise.
fn assert_self_contained(value: &Value) {
    match value {
        Value::Object(map) => {
            for key in [
                "$ref",
                "$defs",
                "definitions",
                "$schema",
                "title",
                "$dynamicRef",
            ] {
                assert!(!map.contains_key(key), "`{key}` in {value}");
            }
            map.values().for_each(assert_self_contained);
        }
        Value::Array(items) => items.iter().for_each(assert_self_contained),
        _ => {}
    }
}

/// The normalized schema of `T`, checked and compiled, against a snapshot.
fn check<T: JsonSchema>(expected: Expect) {
    let schema = schema_for::<T>();
    assert_self_contained(&schema);
    check_parameters(&schema).expect("self-contained object schema");
    ArgValidator::new(&schema).expect("compiles");
    expected.assert_eq(&serde_json::to_string_pretty(&schema).expect("serializable"));
}

// ---- doc comments -> descriptions ----

/// Sends a greeting. (The root's own doc is dropped: the tool description says this.)
#[derive(Deserialize, JsonSchema)]
struct Greet {
    /// Who to greet, by display name.
    name: String,
    /// How many times, 1 to 3.
    times: u8,
}

#[test]
fn doc_comments_become_descriptions() {
    check::<Greet>(expect![[r#"
        {
          "properties": {
            "name": {
              "description": "Who to greet, by display name.",
              "type": "string"
            },
            "times": {
              "description": "How many times, 1 to 3.",
              "maximum": 255,
              "minimum": 0,
              "type": "integer"
            }
          },
          "required": [
            "name",
            "times"
          ],
          "type": "object"
        }"#]]);
}

// ---- serde rename / rename_all / skip ----

#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Renamed {
    chat_id: i64,
    #[serde(rename = "text")]
    body: String,
    #[serde(skip)]
    internal_counter: u32,
}

#[test]
fn serde_renames_and_skips_are_respected() {
    check::<Renamed>(expect![[r#"
        {
          "properties": {
            "chatId": {
              "maximum": 9223372036854775807,
              "minimum": -9223372036854775808,
              "type": "integer"
            },
            "text": {
              "type": "string"
            }
          },
          "required": [
            "chatId",
            "text"
          ],
          "type": "object"
        }"#]]);
}

// ---- Option -> optional and non-nullable ----

#[derive(Deserialize, JsonSchema)]
struct Optionals {
    /// A plain string, required.
    query: String,
    /// At most this many results.
    limit: Option<u32>,
    /// Only in this language.
    lang: Option<String>,
    /// Where to look.
    scope: Option<Scope>,
    /// Tags to match.
    tags: Option<Vec<String>>,
    /// A nested optional struct.
    window: Option<Window>,
}

/// Where to search.
#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Scope {
    ThisChat,
    AllChats,
}

/// A time window.
#[derive(Deserialize, JsonSchema)]
struct Window {
    /// Start, RFC 3339.
    from: String,
    /// End, RFC 3339.
    to: String,
}

#[test]
fn option_is_optional_and_not_nullable() {
    check::<Optionals>(expect![[r#"
        {
          "properties": {
            "lang": {
              "description": "Only in this language.",
              "type": "string"
            },
            "limit": {
              "description": "At most this many results.",
              "maximum": 4294967295,
              "minimum": 0,
              "type": "integer"
            },
            "query": {
              "description": "A plain string, required.",
              "type": "string"
            },
            "scope": {
              "description": "Where to look.",
              "enum": [
                "this_chat",
                "all_chats"
              ],
              "type": "string"
            },
            "tags": {
              "description": "Tags to match.",
              "items": {
                "type": "string"
              },
              "type": "array"
            },
            "window": {
              "description": "A nested optional struct.",
              "properties": {
                "from": {
                  "description": "Start, RFC 3339.",
                  "type": "string"
                },
                "to": {
                  "description": "End, RFC 3339.",
                  "type": "string"
                }
              },
              "required": [
                "from",
                "to"
              ],
              "type": "object"
            }
          },
          "required": [
            "query"
          ],
          "type": "object"
        }"#]]);
    // No "null" anywhere: not in a type, not in an anyOf.
    let text = schema_for::<Optionals>().to_string();
    assert!(!text.contains("null"), "{text}");
}

// ---- #[serde(default)] -> not required ----

#[derive(Deserialize, JsonSchema)]
struct Defaults {
    command: String,
    /// Run it in the background.
    #[serde(default)]
    run_in_background: bool,
    #[serde(default = "default_timeout")]
    timeout_secs: u64,
}

fn default_timeout() -> u64 {
    60
}

#[test]
fn serde_default_is_not_required() {
    check::<Defaults>(expect![[r#"
        {
          "properties": {
            "command": {
              "type": "string"
            },
            "run_in_background": {
              "default": false,
              "description": "Run it in the background.",
              "type": "boolean"
            },
            "timeout_secs": {
              "default": 60,
              "maximum": 18446744073709551615,
              "minimum": 0,
              "type": "integer"
            }
          },
          "required": [
            "command"
          ],
          "type": "object"
        }"#]]);
}

// ---- unit enum -> string enum ----

/// How loud.
#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Volume {
    Quiet,
    RatherLoud,
}

/// A variant-documented enum (schemars makes a `oneOf` of consts of it).
#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Priority {
    /// Whenever.
    Low,
    /// Before anything else.
    VeryHigh,
}

#[derive(Deserialize, JsonSchema)]
struct Enums {
    volume: Volume,
    /// How urgent.
    priority: Priority,
    /// Undocumented field of a documented enum: the type's doc is used.
    fallback: Priority,
}

#[test]
fn unit_enums_are_string_enums() {
    check::<Enums>(expect![[r#"
        {
          "properties": {
            "fallback": {
              "description": "Undocumented field of a documented enum: the type's doc is used.\n`low`: Whenever.\n`very_high`: Before anything else.",
              "enum": [
                "low",
                "very_high"
              ],
              "type": "string"
            },
            "priority": {
              "description": "How urgent.\n`low`: Whenever.\n`very_high`: Before anything else.",
              "enum": [
                "low",
                "very_high"
              ],
              "type": "string"
            },
            "volume": {
              "description": "How loud.",
              "enum": [
                "quiet",
                "rather_loud"
              ],
              "type": "string"
            }
          },
          "required": [
            "volume",
            "priority",
            "fallback"
          ],
          "type": "object"
        }"#]]);
}

// ---- maps and serde_json::Value -> free ----

#[derive(Deserialize, JsonSchema)]
struct Free {
    /// Environment variables.
    env: HashMap<String, String>,
    /// Counts per name.
    counts: BTreeMap<String, Window>,
    /// Anything at all.
    payload: Value,
    /// Anything, optional.
    extra: Option<Value>,
}

#[test]
fn maps_are_free_objects_and_value_is_any() {
    check::<Free>(expect![[r#"
        {
          "properties": {
            "counts": {
              "description": "Counts per name.",
              "type": "object"
            },
            "env": {
              "description": "Environment variables.",
              "type": "object"
            },
            "extra": {
              "description": "Anything, optional."
            },
            "payload": {
              "description": "Anything at all."
            }
          },
          "required": [
            "env",
            "counts",
            "payload"
          ],
          "type": "object"
        }"#]]);
}

// ---- nested structs inlined ----

#[derive(Deserialize, JsonSchema)]
struct Outer {
    /// The target chat.
    target: Target,
    /// Shared type used twice: inlined at both places.
    backup: Target,
}

/// A chat on a platform.
#[derive(Deserialize, JsonSchema)]
struct Target {
    platform: String,
    chat: Chat,
}

/// The chat inside a platform.
#[derive(Deserialize, JsonSchema)]
struct Chat {
    id: i64,
}

#[test]
fn nested_structs_are_inlined() {
    check::<Outer>(expect![[r#"
        {
          "properties": {
            "backup": {
              "description": "Shared type used twice: inlined at both places.",
              "properties": {
                "chat": {
                  "description": "The chat inside a platform.",
                  "properties": {
                    "id": {
                      "maximum": 9223372036854775807,
                      "minimum": -9223372036854775808,
                      "type": "integer"
                    }
                  },
                  "required": [
                    "id"
                  ],
                  "type": "object"
                },
                "platform": {
                  "type": "string"
                }
              },
              "required": [
                "platform",
                "chat"
              ],
              "type": "object"
            },
            "target": {
              "description": "The target chat.",
              "properties": {
                "chat": {
                  "description": "The chat inside a platform.",
                  "properties": {
                    "id": {
                      "maximum": 9223372036854775807,
                      "minimum": -9223372036854775808,
                      "type": "integer"
                    }
                  },
                  "required": [
                    "id"
                  ],
                  "type": "object"
                },
                "platform": {
                  "type": "string"
                }
              },
              "required": [
                "platform",
                "chat"
              ],
              "type": "object"
            }
          },
          "required": [
            "target",
            "backup"
          ],
          "type": "object"
        }"#]]);
}

// ---- Vec<nested struct with enum> (the todo plan) ----

/// Replace the whole plan.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct TodoArgs {
    /// The complete plan, in order.
    plan: Vec<Step>,
}

/// One step of the plan.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Step {
    /// What to do, one line.
    step: String,
    /// Where the step stands.
    status: Status,
}

/// The state of a step.
#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Status {
    Pending,
    InProgress,
    Completed,
}

#[test]
fn vec_of_structs_with_enum_is_inlined() {
    check::<TodoArgs>(expect![[r#"
        {
          "additionalProperties": false,
          "properties": {
            "plan": {
              "description": "The complete plan, in order.",
              "items": {
                "additionalProperties": false,
                "description": "One step of the plan.",
                "properties": {
                  "status": {
                    "description": "Where the step stands.",
                    "enum": [
                      "pending",
                      "in_progress",
                      "completed"
                    ],
                    "type": "string"
                  },
                  "step": {
                    "description": "What to do, one line.",
                    "type": "string"
                  }
                },
                "required": [
                  "step",
                  "status"
                ],
                "type": "object"
              },
              "type": "array"
            }
          },
          "required": [
            "plan"
          ],
          "type": "object"
        }"#]]);
}

// ---- self-recursive types ----

/// A tree node.
#[derive(Deserialize, JsonSchema)]
struct Node {
    name: String,
    children: Vec<Node>,
    /// The parent, if any.
    parent: Option<Box<Node>>,
}

/// Arguments holding a recursive type below the root.
#[derive(Deserialize, JsonSchema)]
struct TreeArgs {
    /// The tree to store.
    tree: Node,
}

#[test]
fn recursion_at_the_root_becomes_any() {
    check::<Node>(expect![[r#"
        {
          "properties": {
            "children": {
              "items": {},
              "type": "array"
            },
            "name": {
              "type": "string"
            },
            "parent": {
              "description": "The parent, if any."
            }
          },
          "required": [
            "name",
            "children"
          ],
          "type": "object"
        }"#]]);
}

#[test]
fn recursion_below_the_root_becomes_any() {
    check::<TreeArgs>(expect![[r#"
        {
          "properties": {
            "tree": {
              "description": "The tree to store.",
              "properties": {
                "children": {
                  "items": {},
                  "type": "array"
                },
                "name": {
                  "type": "string"
                },
                "parent": {
                  "description": "The parent, if any."
                }
              },
              "required": [
                "name",
                "children"
              ],
              "type": "object"
            }
          },
          "required": [
            "tree"
          ],
          "type": "object"
        }"#]]);
}

/// Mutual recursion: A -> B -> A.
#[derive(Deserialize, JsonSchema)]
struct Folder {
    files: Vec<File>,
}

#[derive(Deserialize, JsonSchema)]
struct File {
    name: String,
    inside: Option<Box<Folder>>,
}

#[derive(Deserialize, JsonSchema)]
struct FolderArgs {
    root: Folder,
}

#[test]
fn mutual_recursion_becomes_any() {
    check::<FolderArgs>(expect![[r#"
        {
          "properties": {
            "root": {
              "description": "Mutual recursion: A -> B -> A.",
              "properties": {
                "files": {
                  "items": {
                    "properties": {
                      "inside": {},
                      "name": {
                        "type": "string"
                      }
                    },
                    "required": [
                      "name"
                    ],
                    "type": "object"
                  },
                  "type": "array"
                }
              },
              "required": [
                "files"
              ],
              "type": "object"
            }
          },
          "required": [
            "root"
          ],
          "type": "object"
        }"#]]);
}

// ---- argument-less tools ----

#[derive(Deserialize, JsonSchema)]
struct UnitArgs;

#[derive(Deserialize, JsonSchema)]
struct EmptyArgs {}

#[test]
fn unit_and_empty_structs_are_empty_objects() {
    check::<UnitArgs>(expect![[r#"
        {
          "properties": {},
          "type": "object"
        }"#]]);
    assert_eq!(schema_for::<EmptyArgs>(), schema_for::<UnitArgs>());
    assert_eq!(schema_for::<()>(), schema_for::<UnitArgs>());
}

// ---- normalize / check_parameters on hand-written schemas ----

#[test]
fn normalize_inlines_a_hand_written_schema() {
    let schema = normalize(json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "X",
        "type": "object",
        "properties": {
            "a": {"$ref": "#/definitions/A", "description": "the a"},
            "w": {"$ref": "#/definitions/With~1Slash"}
        },
        "definitions": {
            "A": {"type": ["string", "null"], "format": "uuid"},
            "With/Slash": {"type": "integer", "format": "int64"}
        }
    }));
    expect![[r#"{"properties":{"a":{"description":"the a","format":"uuid","type":"string"},"w":{"maximum":9223372036854775807,"minimum":-9223372036854775808,"type":"integer"}},"type":"object"}"#]]
        .assert_eq(&schema.to_string());
}

#[test]
fn check_parameters_finds_references_anywhere() {
    assert_eq!(
        check_parameters(
            &json!({"type": "object", "properties": {"a": {"items": {"$ref": "#/$defs/X"}}}})
        )
        .map_err(|e| e.to_string()),
        Err(
            "the parameters schema is not self-contained: `$ref` at /properties/a/items".to_owned()
        )
    );
    assert_eq!(
        check_parameters(&json!({"type": "object", "properties": {}, "$defs": {}}))
            .map_err(|e| e.to_string()),
        Err("the parameters schema is not self-contained: `$defs` at /".to_owned())
    );
    assert!(check_parameters(&json!({"type": "string"})).is_err());
    assert!(check_parameters(&json!([])).is_err());
    // A property *named* `$ref`, and a default holding such a key, are not references.
    assert_eq!(
        check_parameters(&json!({
            "type": "object",
            "properties": {"$ref": {"type": "string", "default": {"$ref": "x"}}}
        })),
        Ok(())
    );
}

// ---- validation ----

fn todo_validator() -> ArgValidator {
    ArgValidator::new(&schema_for::<TodoArgs>()).expect("compiles")
}

#[test]
fn valid_arguments_pass() {
    let args = json!({"plan": [{"step": "write", "status": "in_progress"}]});
    assert_eq!(todo_validator().validate(&args), Ok(()));
}

#[test]
fn missing_required_property_is_named() {
    expect![[r#"the arguments do not fit the tool's schema: (top level): missing required property "plan". Fix the arguments and call the tool again."#]]
        .assert_eq(&todo_validator().validate(&json!({})).unwrap_err());
    expect![[r#"the arguments do not fit the tool's schema: /plan/1: missing required property "status". Fix the arguments and call the tool again."#]]
        .assert_eq(
            &todo_validator()
                .validate(&json!({"plan": [
                    {"step": "a", "status": "pending"},
                    {"step": "b"}
                ]}))
                .unwrap_err(),
        );
}

#[test]
fn bad_enum_value_lists_the_allowed_values_at_its_path() {
    let args = json!({"plan": [{"step": "a", "status": "done"}]});
    expect![[r#"the arguments do not fit the tool's schema: /plan/0/status: "done" is not one of "pending", "in_progress", "completed". Fix the arguments and call the tool again."#]]
        .assert_eq(&todo_validator().validate(&args).unwrap_err());
}

#[test]
fn wrong_type_says_what_was_expected() {
    expect![[r#"the arguments do not fit the tool's schema: /plan: expected "array", got string "step one". Fix the arguments and call the tool again."#]]
        .assert_eq(&todo_validator().validate(&json!({"plan": "step one"})).unwrap_err());
    let greet = ArgValidator::new(&schema_for::<Greet>()).expect("compiles");
    expect![[r#"the arguments do not fit the tool's schema: /name: expected "string", got integer 5; /times: 300 is greater than the maximum of 255. Fix the arguments and call the tool again."#]]
        .assert_eq(&greet.validate(&json!({"name": 5, "times": 300})).unwrap_err());
}

#[test]
fn denied_extra_properties_are_named_with_the_allowed_ones() {
    let args = json!({"plan": [{"step": "a", "status": "pending", "note": "x"}], "mode": 1});
    expect![[r#"the arguments do not fit the tool's schema: /plan/0: unexpected property "note" (allowed: "status", "step"); (top level): unexpected property "mode" (allowed: "plan"). Fix the arguments and call the tool again."#]]
        .assert_eq(&todo_validator().validate(&args).unwrap_err());
}

#[test]
fn violations_are_capped() {
    let plan: Vec<Value> = (0..8)
        .map(|i| json!({"step": i, "status": "pending"}))
        .collect();
    let message = todo_validator()
        .validate(&json!({ "plan": plan }))
        .unwrap_err();
    assert_eq!(
        message.matches("expected \"string\"").count(),
        5,
        "{message}"
    );
    assert!(message.contains("; and 3 more."), "{message}");
}

#[test]
fn long_values_are_cut_in_messages() {
    let long = "x".repeat(500);
    let message = todo_validator()
        .validate(&json!({ "plan": long }))
        .unwrap_err();
    assert!(message.len() < 200, "{message}");
    assert!(message.contains('…'), "{message}");
}

#[test]
fn null_for_an_optional_property_is_accepted() {
    let validator = ArgValidator::new(&schema_for::<Optionals>()).expect("compiles");
    let mut args = json!({"query": "x", "limit": null, "window": null, "scope": null});
    assert_eq!(validator.validate(&args), Ok(()));
    // ...but not for a required one.
    expect![[r#"the arguments do not fit the tool's schema: /query: expected "string", got null. Fix the arguments and call the tool again."#]]
        .assert_eq(&validator.validate(&json!({"query": null})).unwrap_err());
    drop_optional_nulls(validator.schema(), &mut args);
    assert_eq!(args, json!({"query": "x"}));
}

// ---- parse_arguments ----

#[test]
fn empty_arguments_are_an_empty_object() {
    assert_eq!(parse_arguments(""), Ok(json!({})));
    assert_eq!(parse_arguments("  \n\t"), Ok(json!({})));
    assert_eq!(parse_arguments("null"), Ok(json!({})));
}

#[test]
fn invalid_json_reports_the_position() {
    expect![[r#"the arguments are not valid JSON (expected `,` or `}` at line 1 column 13; the text up to the error: `{"plan": [] "`). Send the arguments as one JSON object, e.g. {"name": "value"}."#]]
        .assert_eq(&parse_arguments(r#"{"plan": [] "x": 1}"#).unwrap_err());
    expect![[r#"the arguments are not valid JSON (EOF while parsing an object at line 1 column 11; the text up to the error: `{"plan": []`). Send the arguments as one JSON object, e.g. {"name": "value"}."#]]
        .assert_eq(&parse_arguments(r#"{"plan": []"#).unwrap_err());
    // Multi-byte text before the error, on a later line: cut on a char boundary.
    let message =
        parse_arguments("{\n\"a\": \"日本語のテキストです、とても長い説明文がここに続きます\" x}")
            .unwrap_err();
    assert!(message.contains("line 2"), "{message}");
    assert!(message.contains("続きます\" x`"), "{message}");
}

#[test]
fn double_encoded_arguments_are_unwrapped_once() {
    assert_eq!(
        parse_arguments(r#""{\"plan\": []}""#),
        Ok(json!({"plan": []}))
    );
    // Twice encoded is not unwrapped twice.
    let twice = serde_json::to_string(&r#""{\"plan\": []}""#).expect("encodes");
    assert!(parse_arguments(&twice).is_err());
}

#[test]
fn non_object_arguments_are_refused() {
    expect![[r#"the arguments must be a JSON object, got array [1,2]."#]]
        .assert_eq(&parse_arguments("[1, 2]").unwrap_err());
    assert!(parse_arguments(r#""just text""#).is_err());
}
