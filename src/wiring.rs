//! Builds the runtime's pieces from a [`Config`]: the LLM client, the tool registry, the
//! agent, the store and the session manager. Kept apart from `main` so the tests build
//! exactly what the binary builds.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use parlor_bot::agent::{Agent, AgentConfig};
use parlor_bot::llm::{OpenAiClient, OpenAiConfig, RetryPolicy};
use parlor_bot::platform::Platform;
use parlor_bot::session::{SessionConfig, SessionManager};
use parlor_bot::store::{SledStore, Store, StoreOptions};
use parlor_bot::tool::{ToolRegistry, ToolSet};
use parlor_bot::tools::{PromptToolset, TodoList, time};
use parlor_plugins::{MemoryOptions, MessageOptions, memory_toolset, message_toolset};

use crate::config::Config;

/// The tool registry this configuration describes, names and schemas checked. Toolsets
/// that keep state in the store (message log, memory) use `store`.
pub fn registry(config: &Config, store: Arc<dyn Store>) -> anyhow::Result<ToolRegistry> {
    let mut toolsets: Vec<Arc<dyn ToolSet>> = Vec::new();
    for name in &config.toolsets.enabled {
        match name.as_str() {
            "todo_list" => toolsets.push(Arc::new(TodoList::new())),
            "message" => toolsets.push(
                message_toolset(
                    Arc::clone(&store),
                    MessageOptions {
                        vision: config.llm.vision,
                        bot_name: config.bot.name.clone(),
                        context_scan_limit: config.bot.max_messages_per_chat,
                        ..MessageOptions::default()
                    },
                )
                .context("cannot build the message toolset")?,
            ),
            "memory" => toolsets.push(memory_toolset(
                Arc::clone(&store),
                MemoryOptions {
                    max_entries: config.toolsets.memory.max_entries,
                    max_entry_chars: config.toolsets.memory.max_entry_chars,
                    ..MemoryOptions::default()
                },
            )),
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
pub fn agent(config: &Config, store: Arc<dyn Store>) -> anyhow::Result<Agent> {
    let llm = OpenAiClient::with_retries(OpenAiConfig {
        base_url: config.base_url(),
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
        model: config.model(),
        max_iterations: config.llm.max_iterations,
        max_concurrent_tool_calls: config.llm.max_concurrent_tool_calls,
        tool_timeout: Duration::from_secs(config.llm.tool_timeout_secs),
        tool_result_max_chars: config.llm.tool_result_max_chars,
        temperature: config.llm.temperature,
        parallel_tool_calls: config.llm.parallel_tool_calls,
    };
    Ok(Agent::new(
        Arc::new(llm),
        registry(config, store)?,
        &config.bot.system_prompt,
        agent_config,
    ))
}

/// Opens the store under the data directory; fails clearly when another parlor holds it.
pub fn store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let dir = config.data_dir();
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    let store = SledStore::open(
        &dir.join("db"),
        StoreOptions {
            max_messages_per_chat: config.bot.max_messages_per_chat,
            ..StoreOptions::default()
        },
    )
    .with_context(|| format!("cannot open the store in {}", dir.display()))?;
    Ok(Arc::new(store))
}

/// The session layer over `platforms`.
pub fn sessions(
    config: &Config,
    store: Arc<dyn Store>,
    platforms: Vec<Arc<dyn Platform>>,
) -> anyhow::Result<SessionManager> {
    let session_config = SessionConfig {
        bot_name: config.bot.name.clone(),
        admins: config.bot.admins.clone(),
        allowed_chats: config.bot.allowed_chats.clone(),
        allowed_users: config.bot.allowed_users.clone(),
        ignore_bots: config.bot.ignore_bots,
        queue_capacity: config.bot.queue_capacity,
        turns_per_minute: config.bot.turns_per_minute,
        history_tokens: config.llm.context_tokens * 6 / 10,
        idle_timeout: Duration::from_secs(config.bot.idle_minutes * 60),
        vision: config.llm.vision,
        ..SessionConfig::default()
    };
    Ok(SessionManager::new(
        Arc::clone(&store),
        agent(config, store)?,
        platforms,
        session_config,
    ))
}
