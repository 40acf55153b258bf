//! Prompt-only toolsets: no tools, just text appended to the system prompt (house rules,
//! a persona, what the group is about). Configured by operators in `[[toolsets.prompt]]`.

use parlor_bot::tool::{Bridged, ToolSetBridge};

use crate::support::built;

/// A toolset that only contributes a static prompt.
#[derive(Debug, Clone)]
pub struct PromptToolset {
    bridge: ToolSetBridge,
}

impl PromptToolset {
    /// A prompt-only toolset called `name`.
    pub fn new(name: impl Into<String>, prompt: impl Into<String>) -> Self {
        PromptToolset {
            bridge: built(ToolSetBridge::builder(&name.into()).prompt(prompt)),
        }
    }
}

impl Bridged for PromptToolset {
    fn bridge(&self) -> &ToolSetBridge {
        &self.bridge
    }
}
