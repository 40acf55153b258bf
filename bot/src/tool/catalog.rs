//! The tool catalog: what `parlor tools` prints and `/help` is made from. Generated from the
//! registry, so it cannot drift from what the model is really offered or from the roles the
//! registry enforces.

use serde_json::{Value, json};

use super::result::codes;
use super::{Offer, Role, ToolRegistry, ToolSpec};

/// Every tool as Markdown: name, toolset, risk, role, description, parameters, result,
/// failure codes. Shared failure codes are listed once at the top.
pub fn to_markdown(registry: &ToolRegistry) -> String {
    let mut out = String::from("# Tools\n\n");
    out.push_str(
        "Every tool answers `{\"success\": true, \"message\", \"data\"}` or \
         `{\"success\": false, \"error_code\", \"message\", \"data\"}`.\n",
    );
    out.push_str(&format!(
        "Any tool may fail with the shared codes: {}.\n\
         Risk: `read` only reads; `write` changes state the bot keeps; `dangerous` reaches \
         the host.\n\
         Role, the least a caller needs (anyone else gets `PERMISSION_DENIED`): `member` is \
         anyone in the chat; `chat_admin` an administrator of the chat, by the platform; \
         `operator` one of the config's `bot.admins`. A chat admin is never an operator. \
         An unattended turn (a clock task firing, a background job's result) runs as a \
         `member` whoever started it, offered only member tools and the grants of its job \
         (reading or stopping that one job), never a `dangerous` tool.\n",
        codes::SHARED
            .iter()
            .map(|c| format!("`{c}`"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let mut any = false;
    for (toolset, spec) in registry.specs() {
        any = true;
        out.push_str(&format!("\n## `{}`\n\n", spec.name));
        out.push_str(&format!(
            "Toolset `{toolset}` · risk `{}` · role `{}`{}{}{}\n\n",
            spec.risk.as_str(),
            spec.role.as_str(),
            match &spec.role_in_chat_arg {
                Some(arg) => format!(" (also in the chat `{arg}` names)"),
                None => String::new(),
            },
            offer_note(spec.offer),
            match registry.approval(&spec.name, &toolset) {
                Some(role) => format!(" · runs only once approved by {}", role.who()),
                None => String::new(),
            },
        ));
        out.push_str(spec.description.trim());
        out.push_str("\n\n");
        let params = parameter_rows(&spec.parameters);
        if params.is_empty() {
            out.push_str("Parameters: none.\n\n");
        } else {
            out.push_str("| parameter | type | required | description |\n|---|---|---|---|\n");
            for row in params {
                out.push_str(&format!(
                    "| `{}` | {} | {} | {} |\n",
                    row.name,
                    row.kind,
                    if row.required { "yes" } else { "no" },
                    row.description
                ));
            }
            out.push('\n');
        }
        out.push_str(&format!("Result: {}\n\n", spec.result.trim()));
        if spec.failure_codes.is_empty() {
            out.push_str("Failure codes: shared only.\n");
        } else {
            out.push_str(&format!(
                "Failure codes: {} and the shared ones.\n",
                spec.failure_codes
                    .iter()
                    .map(|c| format!("`{c}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if !any {
        out.push_str("\nNo tools are enabled.\n");
    }
    out
}

/// The `tools` array sent to the model, pretty-printed, each entry with an `x-parlor` member
/// beside `type` and `function` for what the model is not sent: toolset, risk, role,
/// `role_in_chat_arg`, result and failure codes. Dropping `x-parlor` from every entry gives
/// the exact array of a request.
pub fn to_json(registry: &ToolRegistry) -> String {
    let tools: Vec<Value> = registry
        .specs()
        .map(|(toolset, spec)| {
            let mut def = serde_json::to_value(spec.to_def()).unwrap_or(Value::Null);
            if let Value::Object(entry) = &mut def {
                let mut policy = policy(&toolset, &spec);
                if let (Some(role), Some(map)) = (
                    registry.approval(&spec.name, &toolset),
                    policy.as_object_mut(),
                ) {
                    map.insert("approval".to_owned(), json!(role.as_str()));
                }
                entry.insert("x-parlor".to_owned(), policy);
            }
            def
        })
        .collect();
    serde_json::to_string_pretty(&tools).unwrap_or_else(|_| "[]".to_owned())
}

fn policy(toolset: &str, spec: &ToolSpec) -> Value {
    let mut policy = json!({
        "toolset": toolset,
        "risk": spec.risk.as_str(),
        "role": spec.role.as_str(),
        "role_in_chat_arg": spec.role_in_chat_arg,
        "result": spec.result,
        "failure_codes": spec.failure_codes,
    });
    // Only where it narrows: most tools are offered in every turn.
    let offered = match spec.offer {
        Offer::Always => None,
        Offer::Addressed => Some("addressed"),
        Offer::AutoChat => Some("auto_chat"),
    };
    if let (Some(offered), Some(map)) = (offered, policy.as_object_mut()) {
        map.insert("offered_in".to_owned(), json!(offered));
    }
    policy
}

/// The catalog's note on which turns offer a tool.
fn offer_note(offer: Offer) -> &'static str {
    match offer {
        Offer::Always => "",
        Offer::Addressed => " · not in auto-chat turns",
        Offer::AutoChat => " · only in auto-chat turns",
    }
}

/// A short list for chat (`/help`): one line per tool, with who may use it.
pub fn to_help(registry: &ToolRegistry) -> String {
    registry
        .specs()
        // Nobody asks for these: only the bot's own auto-chat turns call them.
        .filter(|(_, spec)| spec.offer != Offer::AutoChat)
        .map(|(toolset, spec)| {
            let approval = registry
                .approval(&spec.name, &toolset)
                .map(|role| format!("; runs once approved by {}", role.who()))
                .unwrap_or_default();
            let first_sentence = spec
                .description
                .split_inclusive(". ")
                .next()
                .unwrap_or_default()
                .trim();
            format!(
                "• {} — {first_sentence} ({}{approval})",
                spec.name,
                help_label(spec.role)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Who may use a tool, as `/help` says it.
fn help_label(role: Role) -> &'static str {
    match role {
        Role::Member => "everyone",
        Role::ChatAdmin => "chat admins",
        Role::Operator => "operators",
    }
}

struct Row {
    name: String,
    kind: String,
    required: bool,
    description: String,
}

/// One row per top-level property of an object schema.
fn parameter_rows(schema: &Value) -> Vec<Row> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    props
        .iter()
        .map(|(name, prop)| Row {
            name: name.clone(),
            kind: type_label(prop),
            required: required.contains(&name.as_str()),
            description: prop
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("")
                .replace('\n', " ")
                .replace('|', "\\|"),
        })
        .collect()
}

/// A human label for a property's type: `string`, `"a" \| "b"`, `array of object`...
fn type_label(prop: &Value) -> String {
    if let Some(values) = prop.get("enum").and_then(Value::as_array) {
        return values
            .iter()
            .map(|v| format!("`{v}`"))
            .collect::<Vec<_>>()
            .join(" \\| ");
    }
    match prop.get("type") {
        Some(Value::String(t)) if t == "array" => match prop.get("items") {
            Some(items) => format!("array of {}", type_label(items)),
            None => "array".to_owned(),
        },
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any".to_owned(),
    }
}
