//! Small helpers the toolsets share: finishing a handler's outcome, building a bridge whose
//! tools are fixed in code, the mapping of store failures to tool results, and char-safe
//! clipping.

use parlor_bot::store::StoreError;
use parlor_bot::tool::bridge::ToolError;
use parlor_bot::tool::{ToolResult, ToolSetBridge, ToolSetBridgeBuilder};

/// What a tool handler answers: a success with its own message, or a failure.
pub(crate) type Outcome = Result<ToolResult, ToolError>;

/// Turns a handler's outcome into the result sent to the model.
pub(crate) fn finish(outcome: Outcome) -> ToolResult {
    outcome.unwrap_or_else(ToolResult::from)
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

/// Replaces the `<` of every `<tag` or `</tag` (any case) in `text` with `‹`, so quoted
/// content cannot close or open the fence `<tag>` it is shown in.
pub(crate) fn defuse_fence(text: &str, tag: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('<') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let name = after.strip_prefix('/').unwrap_or(after);
        let is_tag = name
            .get(..tag.len())
            .is_some_and(|n| n.eq_ignore_ascii_case(tag));
        out.push(if is_tag { '‹' } else { '<' });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// A value safe inside a double-quoted attribute of a fence tag.
pub(crate) fn attribute(value: &str) -> String {
    value
        .chars()
        .filter(|c| !c.is_control() && !matches!(c, '"' | '<' | '>'))
        .collect()
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
