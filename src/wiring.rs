//! Builds the runtime's pieces from a [`Config`]: the LLM client, the tool registry and the
//! agent. Kept apart from `main` so the tests build exactly what the binary builds.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use parlor_bot::agent::{Agent, AgentConfig};
use parlor_bot::llm::{OpenAiClient, OpenAiConfig, RetryPolicy};
use parlor_bot::tool::{ToolRegistry, ToolSet};
use parlor_bot::tools::{PromptToolset, TodoList, time};

use crate::config::Config;

/// The tool registry this configuration describes, names and schemas checked.
pub fn registry(config: &Config) -> anyhow::Result<ToolRegistry> {
    let mut toolsets: Vec<Arc<dyn ToolSet>> = Vec::new();
    for name in &config.toolsets.enabled {
        match name.as_str() {
            "todo_list" => toolsets.push(Arc::new(TodoList::new())),
            "time" => {
                let tz = time::parse_timezone(&config.toolsets.time.default_timezone)
                    .map_err(|why| anyhow::anyhow!("toolsets.time.default_timezone: {why}"))?;
                toolsets.push(Arc::new(time::time_toolset(tz)?));
            }
            other => anyhow::bail!("unknown toolset {other:?}"),
        }
    }
    for p in &config.toolsets.prompt {
        toolsets.push(Arc::new(PromptToolset::new(&p.name, &p.prompt)));
    }
    ToolRegistry::new(toolsets).context("the toolsets cannot be registered")
}

/// The agent this configuration describes, talking to the configured endpoint.
pub fn agent(config: &Config) -> anyhow::Result<Agent> {
    let llm = OpenAiClient::with_retries(OpenAiConfig {
        base_url: config.llm.base_url.clone(),
        api_key: config.api_key()?,
        request_timeout: config.request_timeout(),
        connect_timeout: Duration::from_secs(config.llm.connect_timeout_secs),
        idle_timeout: Duration::from_secs(config.llm.idle_timeout_secs),
        retry: RetryPolicy {
            max_retries: config.llm.max_retries,
            ..RetryPolicy::default()
        },
        ..OpenAiConfig::default()
    })
    .context("cannot build the LLM client")?;
    let agent_config = AgentConfig {
        model: config.llm.model.clone(),
        max_iterations: config.agent.max_iterations,
        max_concurrent_tool_calls: config.agent.max_concurrent_tool_calls,
        tool_timeout: Duration::from_secs(config.agent.tool_timeout_secs),
        tool_result_max_chars: config.agent.tool_result_max_chars,
        temperature: config.llm.temperature,
        parallel_tool_calls: config.agent.parallel_tool_calls,
    };
    Ok(Agent::new(
        Arc::new(llm),
        registry(config)?,
        &config.agent.system_prompt,
        agent_config,
    ))
}
