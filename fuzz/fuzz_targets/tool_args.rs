//! Tool-argument validation against every built-in tool's schema: the registry's path
//! (`parse_arguments`, `drop_optional_nulls`, `ArgValidator::validate`) never panics, and
//! whatever the schema accepts reads into the tool's argument type
//! (`ToolSetBridge::read_arguments`), so a call the gate lets through never fails on its
//! arguments afterwards.
//!
//! The toolsets are built as `parlor tools` builds them for a config enabling everything
//! (`src/wiring.rs`), over an in-memory store; nothing is ever run.
//!
//! Input: a byte choosing the tool, a byte choosing the mode, then either the arguments
//! as text (mode even: what a model sends, garbage included) or the bytes a generator
//! walks the tool's schema with (mode odd: mostly well-typed values with edge cases —
//! large and negative numbers, fractions, missing and extra properties, nulls — so that
//! the accepted side is reached as often as the refused one).
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use parlor_bot::store::{MemoryStore, Store};
use parlor_bot::tool::validate::{ArgValidator, drop_optional_nulls, parse_arguments};
use parlor_bot::tool::{Bridged, ToolSet, ToolSetBridge};
use parlor_toolsets::clock::{ClockHandle, ClockOptions};
use parlor_toolsets::terminal::{LateNotifier, TerminalConfig, TerminalService, terminal_toolset};
use parlor_toolsets::{
    MemoryOptions, MemoryToolset, MessageOptions, MessageToolset, PromptToolset, TodoList, time,
};
use serde_json::{Map, Value, json};

/// One tool: its name, its compiled schema and the bridge that reads its arguments.
struct Tool {
    name: String,
    validator: ArgValidator,
    bridge: ToolSetBridge,
}

fn tools() -> &'static [Tool] {
    static TOOLS: OnceLock<Vec<Tool>> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let terminal = TerminalService::new(
            Arc::clone(&store),
            Arc::new(LateNotifier::new()),
            TerminalConfig {
                enabled: true,
                data_dir: std::env::temp_dir().join("parlor-fuzz-terminal"),
                ..TerminalConfig::default()
            },
        );
        let bridges: Vec<ToolSetBridge> = vec![
            TodoList::stored(Arc::clone(&store)).bridge().clone(),
            MessageToolset::new(
                Arc::clone(&store),
                MessageOptions {
                    vision: true,
                    ..MessageOptions::default()
                },
            )
            .expect("message toolset")
            .bridge()
            .clone(),
            parlor_toolsets::clock::toolset(ClockHandle::new(
                Arc::clone(&store),
                ClockOptions::default(),
            ))
            .expect("clock toolset"),
            MemoryToolset::new(Arc::clone(&store), MemoryOptions::default())
                .bridge()
                .clone(),
            time::time_toolset(chrono_tz::UTC).expect("time toolset"),
            terminal_toolset(terminal).bridge().clone(),
            PromptToolset::new("fuzz_prompt", "A prompt.")
                .bridge()
                .clone(),
        ];
        let mut tools = Vec::new();
        for bridge in bridges {
            for spec in bridge.tools() {
                tools.push(Tool {
                    validator: ArgValidator::new(&spec.parameters).expect("schema compiles"),
                    name: spec.name,
                    bridge: bridge.clone(),
                });
            }
        }
        assert!(
            tools.len() >= 10,
            "expected every built-in tool, got {}",
            tools.len()
        );
        tools
    })
}

fuzz_target!(|data: &[u8]| {
    let tools = tools();
    let [which, mode, rest @ ..] = data else {
        return;
    };
    let tool = &tools[usize::from(*which) % tools.len()];
    let mut arguments = if mode % 2 == 0 {
        let Ok(raw) = std::str::from_utf8(rest) else {
            return;
        };
        match parse_arguments(raw) {
            Ok(value) => value,
            Err(_) => return,
        }
    } else {
        match generate(&mut Unstructured::new(rest), tool.validator.schema(), 0) {
            Ok(value) => value,
            Err(_) => return,
        }
    };
    drop_optional_nulls(tool.validator.schema(), &mut arguments);
    if tool.validator.validate(&arguments).is_err() {
        return;
    }
    match tool.bridge.read_arguments(&tool.name, arguments.clone()) {
        Some(Ok(())) => {}
        Some(Err(why)) => panic!(
            "{}: the schema accepts {arguments} but it does not read: {why}",
            tool.name
        ),
        None => panic!("{}: the bridge does not know its own tool", tool.name),
    }
});

/// Integers at the edges of every Rust integer type a schema may come from.
const INTEGERS: &[i128] = &[
    0,
    1,
    -1,
    2,
    255,
    256,
    -128,
    -129,
    65_535,
    65_536,
    2_147_483_647,
    2_147_483_648,
    -2_147_483_648,
    -2_147_483_649,
    4_294_967_295,
    4_294_967_296,
    9_007_199_254_740_993,
    9_223_372_036_854_775_807,
    -9_223_372_036_854_775_808,
    18_446_744_073_709_551_615,
];

/// Strings that often mean something to a tool.
const STRINGS: &[&str] = &[
    "",
    " ",
    "a",
    "telegram:1",
    "telegram:-100123:7",
    "discord:1:2",
    "UTC",
    "Europe/Paris",
    "Mars/Olympus",
    "0 9 * * *",
    "* * * * * *",
    "@hourly",
    "2026-01-01T00:00:00Z",
    "2026-13-40T25:61:61Z",
    "1h",
    "-1",
    "1e3",
    "in 5 minutes",
    "pending",
    "in_progress",
    "completed",
    "http://127.0.0.1/",
    "😀",
    "\u{0}",
    "a\nb",
];

fn number(u: &mut Unstructured, schema: &Value, integer: bool) -> Result<Value> {
    let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
    Ok(match u.int_in_range(0..=5)? {
        0 => json!(*u.choose(INTEGERS)?),
        1 => {
            // Around the schema's own bounds.
            let b = bound("minimum")
                .or(bound("maximum"))
                .or(bound("exclusiveMinimum"))
                .or(bound("exclusiveMaximum"))
                .unwrap_or(0.0);
            let delta = f64::from(u.int_in_range(-2i8..=2)?);
            number_value(b + delta)
        }
        2 => json!(f64::from(u.int_in_range(-1000i32..=1000)?) / 4.0),
        3 => number_value(*u.choose(&[1e300, -1e300, 1e20, 0.5, -0.0, 3.0, f64::MIN_POSITIVE])?),
        4 if integer => json!(u.arbitrary::<i64>()?),
        _ => json!(u.arbitrary::<u32>()?),
    })
}

fn number_value(f: f64) -> Value {
    serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
}

fn any_value(u: &mut Unstructured, depth: usize) -> Result<Value> {
    Ok(match u.int_in_range(0..=6)? {
        0 => Value::Null,
        1 => json!(u.arbitrary::<bool>()?),
        2 => json!(*u.choose(INTEGERS)?),
        3 => json!(*u.choose(STRINGS)?),
        4 => json!(u.arbitrary::<String>()?),
        5 if depth < 3 => {
            let n = u.int_in_range(0..=3)?;
            Value::Array(
                (0..n)
                    .map(|_| any_value(u, depth + 1))
                    .collect::<Result<_>>()?,
            )
        }
        _ => json!({}),
    })
}

/// A value walking `schema`: usually of the type it asks for, sometimes anything.
fn generate(u: &mut Unstructured, schema: &Value, depth: usize) -> Result<Value> {
    if depth > 6 || u.ratio(1, 16)? {
        return any_value(u, depth);
    }
    if let Some(Value::Array(options)) = schema.get("enum")
        && !options.is_empty()
        && u.ratio(7, 8)?
    {
        return Ok(u.choose(options)?.clone());
    }
    if let Some(value) = schema.get("const")
        && u.ratio(7, 8)?
    {
        return Ok(value.clone());
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = schema.get(key)
            && !branches.is_empty()
        {
            let branch = u.choose(branches)?;
            return generate(u, branch, depth + 1);
        }
    }
    let ty = match schema.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(types)) if !types.is_empty() => {
            u.choose(types)?.as_str().unwrap_or("null").to_owned()
        }
        _ if schema.get("properties").is_some() => "object".to_owned(),
        _ => return any_value(u, depth),
    };
    Ok(match ty.as_str() {
        "object" => {
            let mut map = Map::new();
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if let Some(Value::Object(properties)) = schema.get("properties") {
                for (name, sub) in properties {
                    let want = if required.contains(&name.as_str()) {
                        u.ratio(15, 16)?
                    } else {
                        u.ratio(1, 2)?
                    };
                    if want {
                        let value = if u.ratio(1, 10)? {
                            Value::Null
                        } else {
                            generate(u, sub, depth + 1)?
                        };
                        map.insert(name.clone(), value);
                    }
                }
            }
            if u.ratio(1, 10)? {
                let value = match schema.get("additionalProperties") {
                    Some(sub @ Value::Object(_)) => generate(u, sub, depth + 1)?,
                    _ => any_value(u, depth + 1)?,
                };
                let key = if u.arbitrary()? {
                    u.choose(STRINGS)?.to_string()
                } else {
                    u.arbitrary::<String>()?
                };
                map.insert(key, value);
            }
            Value::Object(map)
        }
        "array" => {
            let n = u.int_in_range(0..=4)?;
            let items = schema.get("items").cloned().unwrap_or(json!({}));
            Value::Array(
                (0..n)
                    .map(|_| generate(u, &items, depth + 1))
                    .collect::<Result<_>>()?,
            )
        }
        "string" => {
            if u.arbitrary()? {
                json!(*u.choose(STRINGS)?)
            } else {
                json!(u.arbitrary::<String>()?)
            }
        }
        "integer" => number(u, schema, true)?,
        "number" => number(u, schema, false)?,
        "boolean" => json!(u.arbitrary::<bool>()?),
        "null" => Value::Null,
        _ => any_value(u, depth)?,
    })
}
