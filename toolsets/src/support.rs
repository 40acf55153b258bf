//! Small helpers both toolsets share: tool specs from argument types, argument reading, the
//! mapping of store failures to tool results, and char-safe clipping.

use parlor_bot::store::StoreError;
use parlor_bot::tool::bridge::ToolError;
use parlor_bot::tool::schema::schema_for;
use parlor_bot::tool::{Risk, Role, ToolResult, ToolSetBridge, ToolSetBridgeBuilder, ToolSpec};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What a tool handler answers: a success with its own message, or a failure.
pub(crate) type Outcome = Result<ToolResult, ToolError>;

/// Turns a handler's outcome into the result sent to the model.
pub(crate) fn finish(outcome: Outcome) -> ToolResult {
    outcome.unwrap_or_else(ToolResult::from)
}

/// The spec of a tool whose arguments are `A`. Every tool of these toolsets acts on the
/// caller's own chat only, so each is open to every member ([`Role::Member`]) and names no
/// other chat.
pub(crate) fn spec<A: JsonSchema>(
    name: &str,
    description: &str,
    result: &str,
    risk: Risk,
    failure_codes: &[&str],
) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        parameters: schema_for::<A>(),
        result: result.to_owned(),
        risk,
        role: Role::Member,
        role_in_chat_arg: None,
        failure_codes: failure_codes.iter().map(|c| (*c).to_owned()).collect(),
    }
}

/// Reads validated arguments into `A`. The registry checked them against the schema already;
/// this is the backstop for what a schema cannot say.
pub(crate) fn read_args<A: DeserializeOwned>(tool: &str, arguments: Value) -> Result<A, ToolError> {
    serde_json::from_value(arguments).map_err(|error| {
        ToolError::invalid_arguments(format!("{tool}: the arguments could not be read: {error}"))
    })
}

/// The bridge of a built-in toolset. Its tools are fixed in code (names, descriptions, argument
/// types), so a build error is a bug that every test of the toolset meets, not an input to
/// handle.
pub(crate) fn built<S: Send + Sync + 'static>(builder: ToolSetBridgeBuilder<S>) -> ToolSetBridge {
    match builder.build() {
        Ok(bridge) => bridge,
        Err(error) => panic!("a built-in toolset is malformed: {error}"),
    }
}

/// A store failure, for the model: `UNAVAILABLE` in general terms; the details go to the log.
pub(crate) fn store_failure(tool: &str, error: &StoreError) -> ToolError {
    tracing::error!(tool, %error, "store call failed");
    ToolError::unavailable("the bot's storage could not be read or written; try again later")
}

/// `text` cut to at most `max` characters (on a char boundary), saying how much was cut.
pub(crate) fn clip(text: &str, max: usize) -> String {
    parlor_bot::text::clip_with(text, max, |rest| {
        format!("… [+{} chars]", rest.chars().count())
    })
    .into_owned()
}

#[cfg(test)]
mod tests {
    use super::clip;

    #[test]
    fn clip_cuts_on_a_char_boundary_and_says_how_much() {
        assert_eq!(clip("héllo", 10), "héllo");
        assert_eq!(clip("héllo", 5), "héllo");
        assert_eq!(clip("héllo wörld", 5), "héllo… [+6 chars]");
        assert_eq!(clip("", 0), "");
    }
}
