//! Prompt-only toolsets: no tools, just text appended to the system prompt (house rules,
//! a persona, what the group is about). Configured by operators in `[[toolsets.prompt]]`.

use std::sync::Arc;

use async_trait::async_trait;

use parlor_bot::tool::{ToolContext, ToolInvocation, ToolResult, ToolSet, ToolSpec, codes};

/// A toolset that only contributes a static prompt.
#[derive(Debug, Clone)]
pub struct PromptToolset {
    name: String,
    prompt: String,
}

impl PromptToolset {
    /// A prompt-only toolset called `name`.
    pub fn new(name: impl Into<String>, prompt: impl Into<String>) -> Self {
        PromptToolset {
            name: name.into(),
            prompt: prompt.into(),
        }
    }
}

#[async_trait]
impl ToolSet for PromptToolset {
    fn name(&self) -> &str {
        &self.name
    }

    fn tools(&self) -> Vec<ToolSpec> {
        Vec::new()
    }

    async fn invoke(&self, call: ToolInvocation, _cx: ToolContext) -> ToolResult {
        // The registry routes only to declared tools; this answers a direct misuse.
        ToolResult::err(
            codes::TOOL_NOT_FOUND,
            format!("toolset {} has no tool {}", self.name, call.name),
        )
    }

    fn prompt(&self) -> Option<String> {
        Some(self.prompt.clone())
    }

    fn fork(&self) -> Arc<dyn ToolSet> {
        Arc::new(self.clone())
    }
}
