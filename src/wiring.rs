//! Builds the runtime's pieces from a [`Config`]: the LLM client, the tool registry, the
//! agent, the store and the session manager. Kept apart from `main` so the tests build
//! exactly what the binary builds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use parlor_bot::agent::{Agent, AgentConfig, ImageOptions, PromptSize, VisionModel};
use parlor_bot::llm::{
    AnthropicClient, AnthropicConfig, Embedder, EmbedderConfig, Failover, Link, LlmBackend,
    OpenAiClient, OpenAiConfig, OpenAiEmbedder, RetryPolicy,
};
use parlor_bot::platform::Platform;
use parlor_bot::session::{SessionConfig, SessionManager, SystemReceiver, system_inputs};
use parlor_bot::store::{MemoryStore, PgStore, SledStore, Store, StoreOptions};
use parlor_bot::time::WallTime;
use parlor_bot::tool::{ToolProfile, ToolRegistry, ToolSet};
use parlor_toolsets::clock::{ClockChatHook, ClockHandle, ClockOptions, ClockService};
use parlor_toolsets::mcp::{McpOptions, McpService};
use parlor_toolsets::skill::{SkillLibrary, SkillOptions, skill_toolset};
use parlor_toolsets::subagent::{SubagentOptions, SubagentService, subagent_toolset};
use parlor_toolsets::terminal::{
    Notifier, Policy, Sandbox, TerminalConfig, TerminalService, terminal_toolset,
};
use parlor_toolsets::web::search::Provider;
use parlor_toolsets::{MemoryChatHook, PromptToolset, TodoChatHook, TodoList, time};
use parlor_toolsets::{MemoryOptions, MemoryToolset, MessageOptions, message_toolset};
use parlor_toolsets::{WebOptions, web_toolset};

use tokio_util::sync::CancellationToken;

use crate::config::{CacheTtl, Config, SandboxKind, StoreBackend, TerminalPolicy, WebProvider};

/// The services toolsets are built over, each present when its toolset is enabled.
#[derive(Clone)]
pub struct Services {
    /// The terminal (`[terminal] enabled`).
    pub terminal: Option<Arc<TerminalService>>,
    /// The clock tasks (`clock`).
    pub clock: Option<ClockHandle>,
    /// The sub-agents (`subagent`); `None` where notices have nowhere to go (`ask`).
    pub subagents: Option<Arc<SubagentService>>,
    /// The skills (`skill` with `dirs`).
    pub skills: Option<Arc<SkillLibrary>>,
    /// The MCP servers' connections, started by [`mcp`] (async, before the sessions).
    pub mcp: Option<Arc<McpService>>,
    /// Where the services and the toolsets built here read wall time: the sessions' in the
    /// daemon, so that all of them agree.
    pub wall_time: WallTime,
}

impl Default for Services {
    fn default() -> Self {
        Services {
            terminal: None,
            clock: None,
            subagents: None,
            skills: None,
            mcp: None,
            wall_time: WallTime::system(),
        }
    }
}

impl Services {
    /// The services of `config` over `store`, posting notices through `notifier`, reading
    /// wall time from `wall_time`; the terminal works under `data_dir`.
    pub fn new(
        config: &Config,
        store: &Arc<dyn Store>,
        notifier: Arc<dyn Notifier>,
        data_dir: PathBuf,
        wall_time: WallTime,
    ) -> anyhow::Result<Services> {
        Ok(Services {
            terminal: terminal(
                config,
                Arc::clone(store),
                Arc::clone(&notifier),
                data_dir,
                wall_time.clone(),
            ),
            clock: clock_handle(config, Arc::clone(store), wall_time.clone())?,
            subagents: subagents(config, Arc::clone(store), notifier, wall_time.clone()),
            skills: skills(config),
            mcp: None,
            wall_time,
        })
    }
}

/// The tool registry this configuration describes, names and schemas checked. Toolsets
/// that keep state in the store (message log, memory) use `store`; those over a service
/// (terminal, clock, sub-agents, skills, MCP servers) are registered when `services` has it.
pub fn registry(
    config: &Config,
    store: Arc<dyn Store>,
    services: &Services,
) -> anyhow::Result<ToolRegistry> {
    let clock = services.clock.as_ref();
    let mut toolsets: Vec<Arc<dyn ToolSet>> = Vec::new();
    let profile = config.llm.tool_profile;
    for name in
        config.toolsets.enabled.iter().filter(|name| {
            profile == ToolProfile::Full || COMPACT_TOOLSETS.contains(&name.as_str())
        })
    {
        match name.as_str() {
            "todo_list" => toolsets.push(Arc::new(TodoList::stored(Arc::clone(&store)))),
            "message" => toolsets.push(
                message_toolset(
                    Arc::clone(&store),
                    MessageOptions {
                        // load_image is offered when images can be seen or described.
                        vision: config.llm.vision || !config.llm.vision_models.is_empty(),
                        bot_name: config.bot.name.clone(),
                        context_scan_limit: config.bot.max_messages_per_chat,
                        url_guard: config.url_guard()?,
                        // A group may choose auto-chat when `[groups.auto_chat]` gives it a budget.
                        auto_chat_turns: !config.bot.auto_chat.is_empty()
                            || config.groups.auto_chat.is_some(),
                        ..MessageOptions::default()
                    },
                )
                .context("cannot build the message toolset")?,
            ),
            "clock" => {
                // The handle exists whenever "clock" is enabled (see `clock_handle`).
                if let Some(handle) = clock {
                    toolsets.push(Arc::new(
                        parlor_toolsets::clock::toolset(handle.clone())
                            .context("cannot build the clock toolset")?,
                    ));
                }
            }
            "memory" => {
                let memory = MemoryToolset::with_wall_time(
                    Arc::clone(&store),
                    MemoryOptions {
                        max_entries: config.toolsets.memory.max_entries,
                        max_entry_chars: config.toolsets.memory.max_entry_chars,
                        ..MemoryOptions::default()
                    },
                    services.wall_time.clone(),
                );
                let memory = match embedder(config)? {
                    Some(embedder) => memory.with_embedder(embedder),
                    None => memory,
                };
                toolsets.push(Arc::new(memory));
            }
            "time" => {
                let tz = time::parse_timezone(&config.toolsets.time.default_timezone)
                    .map_err(|why| anyhow::anyhow!("toolsets.time.default_timezone: {why}"))?;
                toolsets.push(Arc::new(time::time_toolset(tz)?));
            }
            "web" => toolsets
                .push(web_toolset(web_options(config)?).context("cannot build the web toolset")?),
            "subagent" => {
                if let Some(service) = &services.subagents {
                    toolsets.push(Arc::new(subagent_toolset(Arc::clone(service))));
                }
            }
            "skill" => {
                if let Some(library) = &services.skills {
                    toolsets.push(Arc::new(skill_toolset(Arc::clone(library))));
                }
            }
            other => anyhow::bail!("unknown toolset {other:?}"),
        }
    }
    if let Some(terminal) = &services.terminal {
        toolsets.push(Arc::new(terminal_toolset(Arc::clone(terminal))));
    }
    for toolset in services
        .mcp
        .as_deref()
        .map(McpService::toolsets)
        .unwrap_or_default()
    {
        toolsets.push(Arc::new(toolset) as Arc<dyn ToolSet>);
    }
    for p in &config.toolsets.prompt {
        toolsets.push(Arc::new(PromptToolset::new(&p.name, &p.prompt)));
    }
    Ok(ToolRegistry::with_profile(toolsets, profile)
        .context("the toolsets cannot be registered")?
        .with_approvals(config.approvals()))
}

/// The built-in toolsets the compact tool profile keeps of `toolsets.enabled`: what a small
/// model needs in a group. The terminal and MCP servers, which the operator turns on one by
/// one, stay when configured.
pub const COMPACT_TOOLSETS: [&str; 5] = ["message", "memory", "clock", "time", "todo_list"];

/// The configured MCP servers, started: each connected with its tools listed, or logged as
/// failed and retried in the background. `None` when no server is enabled. Must run inside
/// the Tokio runtime that will own their supervisors.
pub async fn mcp(config: &Config) -> anyhow::Result<Option<Arc<McpService>>> {
    let servers = config.mcp_servers();
    if servers.is_empty() {
        return Ok(None);
    }
    let service = McpService::new(
        servers,
        McpOptions {
            vision: config.llm.vision,
            ..McpOptions::default()
        },
    )
    .context("the [[mcp.servers]] cannot be set up")?;
    if let Err(e) = service.start().await {
        service.shutdown().await;
        return Err(e).context("an MCP server offers tools parlor cannot register");
    }
    Ok(Some(Arc::new(service)))
}

/// The web toolset's options from `[toolsets.web]`. The Brave key is empty when secrets
/// were not resolved (the catalog), where no search runs.
fn web_options(config: &Config) -> anyhow::Result<WebOptions> {
    let web = &config.toolsets.web;
    let provider = match web.provider {
        WebProvider::Duckduckgo => Provider::DuckDuckGo {
            base_url: web.duckduckgo_url.clone(),
        },
        WebProvider::Searxng => Provider::Searxng {
            // `check` refuses searxng without a URL.
            base_url: web.searxng_url.clone().unwrap_or_default(),
        },
        WebProvider::Brave => Provider::Brave {
            base_url: web.brave_url.clone(),
            api_key: config
                .brave_api_key()
                .map(|k| k.expose().to_owned())
                .unwrap_or_default(),
        },
    };
    Ok(WebOptions {
        provider,
        guard: config.url_guard()?,
        fetch_timeout: Duration::from_secs(web.fetch_timeout_secs),
        search_timeout: Duration::from_secs(web.search_timeout_secs),
        max_fetch_bytes: web.max_fetch_bytes,
        page_chars: web.page_chars,
        calls_per_minute: web.calls_per_minute,
        cache_ttl: Duration::from_secs(web.cache_secs),
        ..WebOptions::default()
    })
}

/// The tool registry for the catalog (`parlor tools`, `check-config`, `ask`): the same
/// toolsets, over an in-memory store, with a terminal service (when enabled) that works in a
/// scratch directory, so a running daemon's files are never touched.
pub fn catalog_registry(
    config: &Config,
    mcp: Option<Arc<McpService>>,
) -> anyhow::Result<ToolRegistry> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let scratch = std::env::temp_dir().join(format!("parlor-catalog-{}", std::process::id()));
    // Nobody serves this channel: a notice from the catalog's services is refused at once.
    let (inputs, _) = parlor_bot::session::system_inputs();
    let mut services = Services::new(
        config,
        &store,
        Arc::new(inputs),
        scratch,
        WallTime::system(),
    )?;
    services.mcp = mcp;
    registry(config, store, &services)
}

/// The fixed part of every request of this configuration (its system prompt with the
/// toolsets' prompts, and the tools' schemas), as `registry` offers them: what
/// `check-config` prints. Builds the agent, which connects to nothing.
pub fn prompt_size(config: &Config, registry: ToolRegistry) -> anyhow::Result<PromptSize> {
    let llm = llm_client(config, config.llm.provider, config.base_url(), None)?;
    let prompt = format!(
        "{}\n\n{}",
        config.bot.system_prompt.trim_end(),
        parlor_bot::session::ATTRIBUTION_PROMPT
    );
    Ok(Agent::new(llm, registry, &prompt, AgentConfig::default()).prompt_size())
}

/// The sub-agents when `toolsets.enabled` names `subagent`, on `wall_time`; their agent is
/// set by [`agent`].
pub fn subagents(
    config: &Config,
    store: Arc<dyn Store>,
    notifier: Arc<dyn Notifier>,
    wall_time: WallTime,
) -> Option<Arc<SubagentService>> {
    if !config.toolset_enabled("subagent") {
        return None;
    }
    let s = &config.toolsets.subagent;
    Some(SubagentService::new(
        store,
        notifier,
        SubagentOptions {
            max_iterations: s.max_iterations,
            max_tokens: s.max_tokens,
            max_wall: Duration::from_secs(s.max_wall_secs),
            max_per_session: s.max_per_chat,
            max_total: s.max_total,
            wall_time,
            ..SubagentOptions::default()
        },
    ))
}

/// The skills when `skill` is enabled and `[toolsets.skill] dirs` names folders (read now;
/// what cannot be read is logged and skipped).
pub fn skills(config: &Config) -> Option<Arc<SkillLibrary>> {
    let dirs = config.skill_dirs();
    if !config.toolset_enabled("skill") || dirs.is_empty() {
        return None;
    }
    Some(SkillLibrary::new(SkillOptions {
        chats: config.toolsets.skill.chats.clone(),
        ..SkillOptions::new(dirs)
    }))
}

/// The clock tasks over `store`, on `wall_time`, when the `clock` toolset is enabled.
pub fn clock_handle(
    config: &Config,
    store: Arc<dyn Store>,
    wall_time: WallTime,
) -> anyhow::Result<Option<ClockHandle>> {
    if !config.toolsets.enabled.iter().any(|t| t == "clock") {
        return Ok(None);
    }
    let default_timezone = time::parse_timezone(&config.toolsets.time.default_timezone)
        .map_err(|why| anyhow::anyhow!("toolsets.time.default_timezone: {why}"))?;
    let c = &config.toolsets.clock;
    Ok(Some(ClockHandle::new(
        store,
        ClockOptions {
            default_timezone,
            max_tasks_per_chat: c.max_tasks_per_chat,
            min_interval: Duration::from_secs(c.min_interval_secs),
            run_timeout: Duration::from_secs(c.run_timeout_secs),
            wall_time,
            // Tasks another daemon made fire here too should that one stop.
            reread_every: config.cluster.enabled.then_some(CLOCK_REREAD),
            ..ClockOptions::default()
        },
    )))
}

/// The terminal service when `[terminal] enabled`, working under `data_dir`, posting its
/// completion notices through `notifier`, on `wall_time`.
pub fn terminal(
    config: &Config,
    store: Arc<dyn Store>,
    notifier: Arc<dyn Notifier>,
    data_dir: PathBuf,
    wall_time: WallTime,
) -> Option<Arc<TerminalService>> {
    let t = &config.terminal;
    if !t.enabled {
        return None;
    }
    let policy = |p: TerminalPolicy| match p {
        TerminalPolicy::Operators => Policy::Operators,
        TerminalPolicy::Off => Policy::Off,
    };
    let sandbox = match t.sandbox {
        Some(SandboxKind::Bwrap) => Sandbox::Bwrap {
            network: t.sandbox_network,
            hide: sandbox_hidden(config, &data_dir),
        },
        // `check` refuses an enabled terminal without a sandbox setting.
        Some(SandboxKind::None) | None => Sandbox::None,
    };
    let defaults = TerminalConfig::default();
    let mut env_allow = defaults.env_allow.clone();
    env_allow.extend(t.extra_env.iter().cloned());
    Some(TerminalService::new(
        store,
        notifier,
        TerminalConfig {
            enabled: true,
            policy: policy(t.policy),
            chat_policies: t
                .chat_policies
                .iter()
                .map(|(chat, p)| (chat.clone(), policy(*p)))
                .collect(),
            data_dir,
            foreground_timeout: Duration::from_secs(t.timeout_secs),
            max_foreground_timeout: Duration::from_secs(t.max_timeout_secs),
            max_background_per_session: t.max_background_per_session,
            max_background_total: t.max_background_total,
            max_task_runtime: Duration::from_secs(t.max_task_hours * 3600),
            env_allow,
            sandbox,
            wall_time,
            ..defaults
        },
    ))
}

/// What the bubblewrap sandbox must hide even where it shows the host (`/etc`): the data
/// directory and every file holding or naming a secret.
fn sandbox_hidden(config: &Config, data_dir: &std::path::Path) -> Vec<PathBuf> {
    let mut hide = vec![data_dir.to_owned()];
    hide.extend(config.secret_paths());
    hide
}

/// Limit for one request to the embeddings endpoint.
const EMBEDDINGS_TIMEOUT: Duration = Duration::from_secs(20);

/// The memory's embedding client, when `[toolsets.memory] embeddings` names a model: the
/// `[llm]` endpoint with its key, or `embeddings_base_url` with the key of
/// `embeddings_api_key_env` (never the `[llm]` key).
fn embedder(config: &Config) -> anyhow::Result<Option<Arc<dyn Embedder>>> {
    let memory = &config.toolsets.memory;
    let Some(model) = &memory.embeddings else {
        return Ok(None);
    };
    let (base_url, api_key) = match &memory.embeddings_base_url {
        Some(url) => {
            let key = match &memory.embeddings_api_key_env {
                Some(var) => Some(std::env::var(var).with_context(|| {
                    format!("toolsets.memory.embeddings_api_key_env: {var} is not set")
                })?),
                None => None,
            };
            (url.clone(), key.map(Into::into))
        }
        None => (
            config.base_url(),
            config.api_key().map(|k| k.expose().into()),
        ),
    };
    let embedder = OpenAiEmbedder::new(EmbedderConfig {
        base_url,
        api_key,
        model: model.trim().to_owned(),
        timeout: EMBEDDINGS_TIMEOUT,
    })
    .context("cannot build the embeddings client")?;
    Ok(Some(Arc::new(embedder)))
}

/// A client of an endpoint speaking `provider`, with the `[llm]` limits and retries.
fn llm_client(
    config: &Config,
    provider: crate::config::Provider,
    base_url: String,
    api_key: Option<&crate::secrets::Secret>,
) -> anyhow::Result<Arc<dyn LlmBackend>> {
    let retry = RetryPolicy {
        max_retries: config.llm.max_retries,
        ..RetryPolicy::default()
    };
    let api_key = api_key.map(|k| k.expose().into());
    let connect_timeout = Duration::from_secs(config.llm.connect_timeout_secs);
    let idle_timeout = Duration::from_secs(config.llm.idle_timeout_secs);
    Ok(match provider {
        crate::config::Provider::Openai => Arc::new(OpenAiClient::with_retries(OpenAiConfig {
            base_url,
            api_key,
            request_timeout: config.request_timeout(),
            first_byte_timeout: config.llm.first_token_timeout_secs.map(Duration::from_secs),
            connect_timeout,
            idle_timeout,
            retry,
            ..OpenAiConfig::default()
        })?),
        crate::config::Provider::Anthropic => {
            Arc::new(AnthropicClient::with_retries(AnthropicConfig {
                base_url,
                api_key,
                request_timeout: config.request_timeout(),
                connect_timeout,
                idle_timeout,
                retry,
                cache_ttl: match config.llm.cache_ttl {
                    CacheTtl::FiveMinutes => parlor_bot::llm::CacheTtl::FiveMinutes,
                    CacheTtl::OneHour => parlor_bot::llm::CacheTtl::OneHour,
                },
                ..AnthropicConfig::default()
            })?)
        }
    })
}

/// The main endpoint's client, or, with `[[llm.fallbacks]]`, the chain of it and them
/// ([`Failover`]): whatever asks the agent's model (turns, clock fires, sub-agents,
/// summaries) fails over alike.
fn llm_chain(config: &Config) -> anyhow::Result<Arc<dyn LlmBackend>> {
    let primary = llm_client(
        config,
        config.llm.provider,
        config.base_url(),
        config.api_key(),
    )
    .context("cannot build the LLM client")?;
    if config.llm.fallbacks.is_empty() {
        return Ok(primary);
    }
    let mut links = vec![Link {
        name: config.model(),
        model: None,
        llm: primary,
    }];
    for (i, fallback) in config.llm.fallbacks.iter().enumerate() {
        let model = fallback.model.trim().to_owned();
        let base_url = fallback
            .base_url
            .clone()
            .unwrap_or_else(|| config.base_url());
        links.push(Link {
            name: model.clone(),
            model: Some(model),
            llm: llm_client(
                config,
                fallback.provider.unwrap_or(config.llm.provider),
                base_url,
                config.fallback_api_key(i),
            )
            .with_context(|| format!("cannot build the client of fallback {}", fallback.model))?,
        });
    }
    Ok(Arc::new(Failover::new(links)))
}

/// The models groups may choose (`[[llm.models]]`), each with the main chain behind it,
/// so a group whose choice fails is still answered.
pub fn group_models(config: &Config) -> anyhow::Result<Vec<parlor_bot::session::GroupModel>> {
    if config.llm.models.is_empty() {
        return Ok(Vec::new());
    }
    let main = llm_chain(config)?;
    let names = config.group_model_names();
    let mut models = Vec::new();
    for (i, (entry, name)) in config.llm.models.iter().zip(names).enumerate() {
        let model = entry.model.trim().to_owned();
        let client = llm_client(
            config,
            entry.provider.unwrap_or(config.llm.provider),
            entry.base_url.clone().unwrap_or_else(|| config.base_url()),
            config.model_api_key(i),
        )
        .with_context(|| format!("cannot build the client of model {name}"))?;
        let chain = Failover::new(vec![
            Link {
                name: model.clone(),
                model: Some(model.clone()),
                llm: client,
            },
            Link {
                name: config.model(),
                model: Some(config.model()),
                llm: Arc::clone(&main),
            },
        ]);
        models.push(parlor_bot::session::GroupModel {
            name,
            model,
            llm: Arc::new(chain),
        });
    }
    Ok(models)
}

/// The agent this configuration describes, talking to the configured endpoint.
///
/// With sub-agents, their agent is built here too and handed to the service: the same
/// client and toolsets, without `subagent` (no nesting), under their own model and step
/// limit, and with the message toolset naming what they post as theirs in the chat log.
pub fn agent(config: &Config, store: Arc<dyn Store>, services: &Services) -> anyhow::Result<Agent> {
    let llm = llm_chain(config)?;
    let mut vision_models = Vec::new();
    for (i, vision) in config.llm.vision_models.iter().enumerate() {
        let base_url = vision.base_url.clone().unwrap_or_else(|| config.base_url());
        vision_models.push(VisionModel {
            model: vision.model.trim().to_owned(),
            llm: llm_client(
                config,
                vision.provider.unwrap_or(config.llm.provider),
                base_url,
                config.vision_api_key(i),
            )
            .with_context(|| format!("cannot build the client of vision model {}", vision.model))?,
        });
    }
    let terminal = services.terminal.as_ref();
    let agent_config = AgentConfig {
        model: config.model(),
        max_iterations: config.llm.max_iterations,
        max_concurrent_tool_calls: config.llm.max_concurrent_tool_calls,
        // A shell command may run up to its own limit; the agent's limit must not cut it first
        // (the terminal returns the partial output itself).
        tool_timeout: Duration::from_secs(config.llm.tool_timeout_secs.max(
            if terminal.is_some() {
                config.terminal.max_timeout_secs + 10
            } else {
                0
            },
        ))
        // Likewise an MCP server's own timeout answers TIMEOUT itself.
        .max(
            services
                .mcp
                .as_ref()
                .map(|m| m.longest_timeout() + Duration::from_secs(5))
                .unwrap_or_default(),
        ),
        tool_result_max_chars: config.llm.tool_result_max_chars,
        temperature: config.llm.temperature,
        parallel_tool_calls: config.llm.parallel_tool_calls,
        max_identical_tool_calls: config.llm.max_identical_tool_calls,
        // Half the context, at about four characters a token.
        summary_input_chars: config.llm.context_window * 2,
        images: ImageOptions {
            vision: config.llm.vision,
            ..ImageOptions::default()
        },
    };
    // How input lines are attributed is the session layer's, so it goes with every prompt.
    let prompt = format!(
        "{}\n\n{}",
        config.bot.system_prompt.trim_end(),
        parlor_bot::session::ATTRIBUTION_PROMPT
    );
    let mut main_config = agent_config.clone();
    // A call waiting for a person's yes must not be cut by the tool's own limit first.
    if !config.approvals().is_empty() {
        main_config.tool_timeout += Duration::from_secs(config.approvals.timeout_secs);
    }
    // Built before the main registry, given its observer after (the metrics label tools by
    // the main registry's names, a superset of the sub-agents').
    let mut sub_agent = None;
    if let Some(service) = &services.subagents {
        let mut sub = config.clone();
        sub.toolsets.enabled.retain(|t| t != "subagent");
        sub.bot.name = format!("{} (sub-agent)", config.bot.name);
        let sub_services = Services {
            subagents: None,
            ..services.clone()
        };
        let model = &config.toolsets.subagent.model;
        let sub_prompt = format!(
            "{}\n\n{}",
            config.bot.system_prompt.trim_end(),
            parlor_toolsets::subagent::SUBAGENT_PROMPT
        );
        sub_agent = Some((
            Arc::clone(service),
            Agent::new(
                Arc::clone(&llm),
                registry(&sub, Arc::clone(&store), &sub_services)
                    .context("the sub-agents' toolsets cannot be registered")?,
                &sub_prompt,
                AgentConfig {
                    model: if model.trim().is_empty() {
                        config.model()
                    } else {
                        model.trim().to_owned()
                    },
                    max_iterations: config.toolsets.subagent.max_iterations,
                    ..agent_config
                },
            )
            .with_vision_models(vision_models.clone()),
        ));
        // A sub-agent in the foreground is one tool call: the agent's limit must not cut it
        // before its own wall-time budget does.
        main_config.tool_timeout = main_config.tool_timeout.max(Duration::from_secs(
            config.toolsets.subagent.max_wall_secs + 10,
        ));
    }
    let tools = registry(config, store, services)?;
    // Tool names label metrics only when the registry knows them.
    let metrics = parlor_bot::metrics::MetricsObserver::new(config.model())
        .with_models(
            config
                .llm
                .fallbacks
                .iter()
                .chain(&config.llm.models)
                .map(|f| f.model.clone()),
            config.llm.prices.clone(),
        )
        .with_tools(tools.clone());
    let metrics: Arc<dyn parlor_bot::agent::AgentObserver> = Arc::new(metrics);
    if let Some((service, agent)) = sub_agent {
        service.set_agent(agent.with_observer(Arc::clone(&metrics)));
    }
    Ok(Agent::new(llm, tools, &prompt, main_config)
        .with_vision_models(vision_models)
        .with_observer(metrics))
}

/// Opens the store `[store]` names: sled under the data directory (failing clearly when
/// another parlor holds it), or the PostgreSQL database (failing clearly when it cannot be
/// reached; its schema is brought up to date).
pub fn store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let options = StoreOptions {
        max_messages_per_chat: config.bot.max_messages_per_chat,
        ..StoreOptions::default()
    };
    if config.store.backend == StoreBackend::Postgres {
        let url = config.database_url().with_context(|| {
            format!(
                "store.backend = \"postgres\" but no database URL was read (set {})",
                config.store.url_env
            )
        })?;
        let store =
            PgStore::open(url.expose(), options).context("cannot open the PostgreSQL store")?;
        tracing::info!(server = store.server(), "store: PostgreSQL");
        return Ok(Arc::new(store));
    }
    let dir = config.data_dir();
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    let store = SledStore::open(&dir.join("db"), options)
        .with_context(|| format!("cannot open the store in {}", dir.display()))?;
    Ok(Arc::new(store))
}

/// What `parlor check-config` says of the store: which backend, and where.
pub fn store_line(config: &Config) -> String {
    let line = store_backend_line(config);
    if config.cluster.enabled {
        format!(
            "{line}, shared with other daemons (cluster: leases of {} s)",
            config.cluster.lease_ttl_secs
        )
    } else {
        line
    }
}

fn store_backend_line(config: &Config) -> String {
    match config.store.backend {
        StoreBackend::Sled => format!("store: sled in {}", config.data_dir().join("db").display()),
        StoreBackend::Postgres => match config
            .database_url()
            .map(|url| PgStore::describe_url(url.expose()))
        {
            Some(Ok(server)) => format!("store: postgres at {server}"),
            Some(Err(e)) => format!("store: postgres, but {e}"),
            None => "store: postgres, but no database URL was read".to_owned(),
        },
    }
}

/// The running runtime: sessions, and the services that live beside them.
pub struct Runtime {
    /// The session layer (the adapters' inbox).
    pub sessions: SessionManager,
    /// The terminal service, when enabled.
    pub terminal: Option<Arc<TerminalService>>,
    /// The MCP servers' connections (their stdio children end with them).
    pub mcp: Option<Arc<McpService>>,
    /// The sub-agents, when enabled.
    pub subagents: Option<Arc<SubagentService>>,
    /// The clock tasks, when the clock is enabled (the console pauses and resumes them).
    pub clock_tasks: Option<ClockHandle>,
    /// The clock service, until [`Runtime::resume`] starts it.
    clock_service: std::sync::Mutex<Option<ClockService>>,
    /// The clock service's task, once started; it stops with `clock_stop`.
    clock: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    clock_stop: CancellationToken,
    /// The system inputs' receiving side, until [`Runtime::resume`] serves it.
    system: std::sync::Mutex<Option<SystemReceiver>>,
    /// With `[cluster]`: this daemon's instance id.
    instance: Option<String>,
    /// With `[cluster]`: how often the background jobs of daemons that died are looked for
    /// (a lease's life).
    recover_every: Duration,
    /// The loop that looks for them; it stops with `clock_stop`.
    recovery: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Runtime {
    /// Starts the runtime, in the one order that queues each input once: first what the
    /// store holds (pending input re-queued, unsent replies resent), then the system inputs
    /// (notices and clock fires, stored and queued as they come), then the services that
    /// send them (terminal tasks and sub-agents a crash interrupted are told; the clock
    /// fires what is due). Call once, before the adapters start.
    pub async fn resume(&self) -> anyhow::Result<()> {
        self.sessions
            .resume()
            .await
            .context("cannot resume from the store")?;
        let receiver = self.system.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(receiver) = receiver {
            self.sessions.serve_system(receiver);
        }
        if let Some(instance) = &self.instance {
            // Before recovering: rows of daemons still alive are theirs.
            if let Some(subagents) = &self.subagents {
                subagents.run_as(instance);
            }
            if let Some(terminal) = &self.terminal {
                terminal.run_as(instance);
            }
        }
        if let Some(subagents) = &self.subagents {
            subagents
                .recover()
                .await
                .context("cannot recover sub-agents")?;
        }
        if let Some(terminal) = &self.terminal {
            terminal
                .recover()
                .await
                .context("cannot recover terminal tasks")?;
            // Not fatal: the chats still work, and each shell call says why it cannot run.
            if let Err(why) = terminal.check_sandbox().await {
                tracing::error!(
                    error = %why,
                    "the terminal's bubblewrap sandbox does not work on this host; shell \
                     commands will fail until it does"
                );
            }
        }
        if self.instance.is_some() {
            let task = tokio::spawn(recover_dead_daemons_jobs(
                self.terminal.clone(),
                self.subagents.clone(),
                self.recover_every,
                self.clock_stop.clone(),
            ));
            *self.recovery.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        }
        let service = self
            .clock_service
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(service) = service {
            let task = tokio::spawn(service.run(self.clock_stop.clone()));
            *self.clock.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        }
        Ok(())
    }

    /// Drains: terminal processes are killed and sub-agents stopped first (nothing outlives
    /// the daemon), then the sessions get `grace` to finish their turns.
    pub async fn shutdown(&self, grace: Duration) {
        if let Some(terminal) = &self.terminal {
            terminal.shutdown().await;
        }
        // Background sub-agents end `interrupted` (told after the next start); a foreground
        // one answers its turn CANCELLED, and that turn may still finish.
        if let Some(subagents) = &self.subagents {
            subagents.shutdown().await;
        }
        // No new fires; a fire already waiting on its turn logs how that turn ended.
        self.clock_stop.cancel();
        self.sessions.shutdown(grace).await;
        // After the sessions: a turn finishing within the grace may still call a server.
        if let Some(mcp) = &self.mcp {
            mcp.shutdown().await;
        }
        let clock = self.clock.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = clock
            && let Err(e) = task.await
        {
            tracing::error!(error = %e, "the clock service failed");
        }
        let recovery = self
            .recovery
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = recovery
            && let Err(e) = task.await
        {
            tracing::error!(error = %e, "the recovery of other daemons' jobs failed");
        }
    }
}

/// With `[cluster]`: every `every`, the background commands and sub-agents of daemons that
/// stopped renewing their lease (died, or paused past it) become `interrupted` and their
/// chats are told, each once whichever daemon gets there first (the rows change on
/// condition). Without this they would wait for some daemon's next start.
async fn recover_dead_daemons_jobs(
    terminal: Option<Arc<TerminalService>>,
    subagents: Option<Arc<SubagentService>>,
    every: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
        if let Some(terminal) = &terminal
            && let Err(e) = terminal.recover().await
        {
            tracing::warn!(error = %e, "cannot recover other daemons' terminal tasks; trying again");
        }
        if let Some(subagents) = &subagents
            && let Err(e) = subagents.recover().await
        {
            tracing::warn!(error = %e, "cannot recover other daemons' sub-agents; trying again");
        }
    }
}

/// The runtime over `platforms`, with its store and the started MCP servers.
pub fn runtime(
    config: &Config,
    store: Arc<dyn Store>,
    platforms: Vec<Arc<dyn Platform>>,
    mcp: Option<Arc<McpService>>,
) -> anyhow::Result<Runtime> {
    let session_config = SessionConfig {
        bot_name: config.bot.name.clone(),
        admins: config.bot.admins.clone(),
        allowed_chats: config.bot.allowed_chats.clone(),
        allowed_users: config.bot.allowed_users.clone(),
        ignore_bots: config.bot.ignore_bots,
        queue_capacity: config.bot.queue_capacity,
        turns_per_minute: config.bot.turns_per_minute,
        commands_per_member_per_minute: config.bot.commands_per_member_per_minute,
        commands_per_chat_per_minute: config.bot.commands_per_chat_per_minute,
        // With compaction on, the trim is only the safety net behind it.
        history_tokens: config.llm.context_window
            * if config.bot.compact_ratio > 0.0 {
                85
            } else {
                60
            }
            / 100,
        context_window: config.llm.context_window,
        compact_ratio: config.bot.compact_ratio,
        compact_keep_turns: config.bot.compact_keep_turns,
        idle_timeout: Duration::from_secs(config.bot.idle_minutes * 60),
        daily_tokens_per_chat: config.bot.daily_tokens_per_chat,
        daily_tokens_per_member: config.bot.daily_tokens_per_member,
        prices: config.llm.prices.clone(),
        auto_chat: config
            .bot
            .auto_chat
            .iter()
            .map(|a| a.to_runtime())
            .collect(),
        cluster: config.cluster.enabled.then(|| {
            let mut cluster = parlor_bot::session::Cluster::new(instance_id(config));
            cluster.lease_ttl = Duration::from_secs(config.cluster.lease_ttl_secs);
            cluster.sweep_every = Duration::from_millis(config.cluster.sweep_interval_ms);
            tracing::info!(instance = %cluster.instance, "sharing the store with other daemons; chats are held by lease");
            cluster
        }),
        groups: config.group_policy(),
        group_models: group_models(config)?,
        approval_timeout: Duration::from_secs(config.approvals.timeout_secs),
        ..SessionConfig::default()
    };
    // Made first: the terminal, the sub-agents and the clock send on it, and the sessions
    // (which need their toolsets) serve it once they exist and have resumed.
    let (inputs, system) = system_inputs();
    let mut services = Services::new(
        config,
        &store,
        Arc::new(inputs.clone()) as Arc<dyn Notifier>,
        config.data_dir(),
        session_config.wall_time.clone(),
    )?;
    services.mcp = mcp;
    if services.terminal.is_some() && config.terminal.sandbox == Some(SandboxKind::None) {
        // Said at every start: an operator who chose this should not forget it.
        tracing::warn!(
            "[terminal] sandbox = \"none\": shell commands run as parlor's own user and can \
             reach everything it can: the store with every chat's history, other chats' \
             workspaces, the config file and secret files, the network. Use sandbox = \"bwrap\" \
             unless every operator is trusted with all of that"
        );
    }
    let sessions = SessionManager::new(
        Arc::clone(&store),
        agent(config, store, &services)?,
        platforms,
        session_config,
    );
    let Services {
        terminal,
        clock,
        subagents,
        mcp,
        ..
    } = services;
    // What the toolsets keep about a chat follows it when it moves or the bot leaves.
    sessions.add_chat_hook(Arc::new(MemoryChatHook));
    if config.toolsets.enabled.iter().any(|t| t == "memory") {
        sessions.add_chat_command(Arc::new(parlor_toolsets::memory::MemoryCommand::List));
        sessions.add_chat_command(Arc::new(parlor_toolsets::memory::MemoryCommand::Forget));
    }
    sessions.add_chat_hook(Arc::new(TodoChatHook));
    if let Some(handle) = &clock {
        sessions.add_chat_hook(Arc::new(ClockChatHook::new(handle.clone())));
    }
    // Started by `resume`, after what the store held is queued: a due time that fires
    // at the start is then a new input, never one the resume queues again.
    let clock_tasks = clock.clone();
    let clock_service = clock.map(|handle| ClockService::with_handle(handle, inputs));
    Ok(Runtime {
        sessions,
        terminal,
        mcp,
        subagents,
        clock_tasks,
        clock_service: std::sync::Mutex::new(clock_service),
        clock: std::sync::Mutex::new(None),
        clock_stop: CancellationToken::new(),
        system: std::sync::Mutex::new(Some(system)),
        instance: config.cluster.enabled.then(|| instance_id(config)),
        recover_every: Duration::from_secs(config.cluster.lease_ttl_secs.max(1)),
        recovery: std::sync::Mutex::new(None),
    })
}

/// With `[cluster]`: how often the clock reads its tasks again from the shared store.
const CLOCK_REREAD: Duration = Duration::from_secs(30);

/// This run's instance id, the same for every part of the daemon: `cluster.instance` (else
/// the host name) and a random part, so a restarted daemon never takes its predecessor's
/// leases for its own.
pub fn instance_id(config: &Config) -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| new_instance_id(config)).clone()
}

fn new_instance_id(config: &Config) -> String {
    let name = config.cluster.instance.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "parlor".to_owned())
    });
    let mut bytes = [0u8; 4];
    // Without randomness, the process id and the time keep starts apart.
    if getrandom::fill(&mut bytes).is_err() {
        let seed = std::process::id()
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
        bytes = seed.to_be_bytes();
    }
    format!("{name}-{:08x}", u32::from_be_bytes(bytes))
}

/// With `[cluster]`: the lease only whose holder long-polls Telegram for bot `token`'s
/// updates (the bot id, the part of the token before `:`, names it; it is public).
pub fn telegram_poll_lease(
    config: &Config,
    store: &Arc<dyn Store>,
    token: &str,
) -> Option<Arc<parlor_bot::session::lease::Keeper>> {
    if config.telegram_webhook().is_some() {
        return None;
    }
    let bot = token.split(':').next().unwrap_or_default();
    connection_lease(config, store, &format!("telegram:poll:{bot}"))
}

/// With `[cluster]`: one lease per shard of the Discord gateway of bot `bot` (the token's
/// public first part), spread across the daemons: one takes a shard while it holds fewer
/// than its share (the shards over the live daemons, rounded up) and lets one go when it
/// holds more, for a daemon that started later.
pub fn discord_shard_leases(
    config: &Config,
    store: &Arc<dyn Store>,
    bot: &str,
) -> Vec<Arc<parlor_bot::session::lease::Keeper>> {
    let shards = config.discord.shards.max(1);
    if !config.cluster.enabled {
        return Vec::new();
    }
    let all: Arc<std::sync::OnceLock<Vec<Arc<parlor_bot::session::lease::Keeper>>>> =
        Arc::default();
    let keepers: Vec<_> = (0..shards)
        .map(|shard| {
            let (all, shared) = (Arc::clone(&all), Arc::clone(store));
            let wall = parlor_bot::time::WallTime::system();
            let gate: parlor_bot::session::lease::Gate = Arc::new(move |holding: bool| {
                let held = all
                    .get()
                    .map_or(0, |all| all.iter().filter(|k| k.is_held()).count());
                let live =
                    parlor_bot::session::cluster::live_instances(shared.as_ref(), wall.now());
                let share = (shards as usize).div_ceil(live);
                if holding { held <= share } else { held < share }
            });
            Arc::new(
                parlor_bot::session::lease::Keeper::new(
                    Arc::clone(store),
                    &format!("discord:gateway:{bot}:shard:{shard}/{shards}"),
                    &instance_id(config),
                    Duration::from_secs(config.cluster.lease_ttl_secs),
                    parlor_bot::time::WallTime::system(),
                )
                .with_gate(gate),
            )
        })
        .collect();
    let _ = all.set(keepers.clone());
    keepers
}

/// With `[cluster]`: a lease only whose holder keeps connection `name` (a platform allows
/// one per bot); `None` for a single daemon.
pub fn connection_lease(
    config: &Config,
    store: &Arc<dyn Store>,
    name: &str,
) -> Option<Arc<parlor_bot::session::lease::Keeper>> {
    config.cluster.enabled.then(|| {
        Arc::new(parlor_bot::session::lease::Keeper::new(
            Arc::clone(store),
            name,
            &instance_id(config),
            Duration::from_secs(config.cluster.lease_ttl_secs),
            parlor_bot::time::WallTime::system(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registry compiles a schema at the tool's first call, and the toolset builders
    /// check only what the wire can carry: every built-in schema must compile, so that no
    /// tool fails at its first call for its own schema.
    #[tokio::test]
    async fn every_built_in_tools_schema_compiles() {
        let mut enabled: Vec<&str> = crate::config::KNOWN_TOOLSETS.to_vec();
        enabled.extend(crate::config::OPT_IN_TOOLSETS);
        let text = format!(
            "[toolsets]\nenabled = {enabled:?}\n[terminal]\nenabled = true\nsandbox = \"none\"\n"
        );
        let config = Config::parse(&text).expect("config");
        let registry = catalog_registry(&config, None).expect("registry");
        let defs = registry.defs();
        assert!(defs.len() > 20, "{} tools", defs.len());
        for def in defs.iter() {
            let name = &def.function.name;
            parlor_bot::tool::validate::ArgValidator::new(&def.function.parameters)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}
