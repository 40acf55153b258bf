//! The daemon's configuration: a TOML file (see `config.example.toml`), every field with a
//! default, unknown keys refused so a typo is an error and not a silently ignored setting.
//! Secrets are never in the file: the API key comes from an environment variable or a file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The OpenAI-compatible endpoint.
    pub llm: LlmConfig,
    /// Limits of the agent loop.
    pub agent: AgentSection,
    /// Which toolsets are on, and their settings.
    pub toolsets: ToolsetsConfig,
}

/// `[llm]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// Base URL of the chat-completions API, up to and including `/v1`.
    pub base_url: String,
    /// Model name as the provider spells it.
    pub model: String,
    /// Environment variable holding the API key.
    pub api_key_env: String,
    /// File holding the API key (systemd credentials, say); wins over `api_key_env`.
    pub api_key_file: Option<PathBuf>,
    /// Whole-request limit, stream included.
    pub request_timeout_secs: u64,
    /// TCP/TLS connect limit.
    pub connect_timeout_secs: u64,
    /// Longest silence inside a stream.
    pub idle_timeout_secs: u64,
    /// Retries after the first attempt on connect errors, timeouts, 429 and 5xx.
    pub max_retries: u32,
    /// Sampling temperature; the provider's default when unset.
    pub temperature: Option<f32>,
}

impl Default for LlmConfig {
    fn default() -> Self {
        LlmConfig {
            base_url: "https://api.openai.com/v1".to_owned(),
            model: "gpt-4o-mini".to_owned(),
            api_key_env: "OPENAI_API_KEY".to_owned(),
            api_key_file: None,
            request_timeout_secs: 120,
            connect_timeout_secs: 10,
            idle_timeout_secs: 60,
            max_retries: 3,
            temperature: None,
        }
    }
}

/// `[agent]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentSection {
    /// The base system prompt; toolset prompts are appended to it.
    pub system_prompt: String,
    /// Most LLM calls per turn.
    pub max_iterations: usize,
    /// Most tool calls running at once within one response.
    pub max_concurrent_tool_calls: usize,
    /// Limit for one tool call.
    pub tool_timeout_secs: u64,
    /// Longest tool result kept, in characters.
    pub tool_result_max_chars: usize,
    /// Whether the model may call several tools per response.
    pub parallel_tool_calls: bool,
}

/// The default base prompt.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are parlor, an assistant in a group chat. Several \
people may talk to you; each message says who wrote it. Answer the person who addressed you, \
briefly and in their language. Use your tools when they help, and say plainly when something \
failed.";

impl Default for AgentSection {
    fn default() -> Self {
        AgentSection {
            system_prompt: DEFAULT_SYSTEM_PROMPT.to_owned(),
            max_iterations: 10,
            max_concurrent_tool_calls: 4,
            tool_timeout_secs: 60,
            tool_result_max_chars: 8000,
            parallel_tool_calls: true,
        }
    }
}

/// `[toolsets]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsetsConfig {
    /// Built-in toolsets to register, in this order.
    pub enabled: Vec<String>,
    /// `[toolsets.time]`
    pub time: TimeConfig,
    /// `[[toolsets.prompt]]`: prompt-only toolsets.
    pub prompt: Vec<PromptConfig>,
}

/// Built-in toolsets this build knows.
pub const KNOWN_TOOLSETS: &[&str] = &["todo_list", "time"];

impl Default for ToolsetsConfig {
    fn default() -> Self {
        ToolsetsConfig {
            enabled: KNOWN_TOOLSETS.iter().map(|s| s.to_string()).collect(),
            time: TimeConfig::default(),
            prompt: Vec::new(),
        }
    }
}

/// `[toolsets.time]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimeConfig {
    /// IANA time zone used when the model names none.
    pub default_timezone: String,
}

impl Default for TimeConfig {
    fn default() -> Self {
        TimeConfig {
            default_timezone: "UTC".to_owned(),
        }
    }
}

/// `[[toolsets.prompt]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptConfig {
    /// Name shown in the catalog.
    pub name: String,
    /// Text appended to the system prompt.
    pub prompt: String,
}

impl Config {
    /// Reads and checks a config file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("config file {} is invalid", path.display()))
    }

    /// Parses and checks config text.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let config: Config = toml::from_str(text)?;
        config.check()?;
        Ok(config)
    }

    /// Checks values a type cannot: ranges, names, time zones.
    pub fn check(&self) -> anyhow::Result<()> {
        if !self.llm.base_url.starts_with("http://") && !self.llm.base_url.starts_with("https://") {
            bail!(
                "llm.base_url must start with http:// or https://, got {:?}",
                self.llm.base_url
            );
        }
        if self.llm.model.trim().is_empty() {
            bail!("llm.model must not be empty");
        }
        for (name, value) in [
            ("llm.request_timeout_secs", self.llm.request_timeout_secs),
            ("llm.connect_timeout_secs", self.llm.connect_timeout_secs),
            ("llm.idle_timeout_secs", self.llm.idle_timeout_secs),
            ("agent.tool_timeout_secs", self.agent.tool_timeout_secs),
        ] {
            if value == 0 {
                bail!("{name} must be at least 1");
            }
        }
        if self.agent.max_iterations == 0 {
            bail!("agent.max_iterations must be at least 1");
        }
        if self.agent.max_concurrent_tool_calls == 0 {
            bail!("agent.max_concurrent_tool_calls must be at least 1");
        }
        if self.agent.tool_result_max_chars < 200 {
            bail!("agent.tool_result_max_chars must be at least 200");
        }
        for name in &self.toolsets.enabled {
            if !KNOWN_TOOLSETS.contains(&name.as_str()) {
                bail!(
                    "toolsets.enabled names unknown toolset {name:?}; known: {}",
                    KNOWN_TOOLSETS.join(", ")
                );
            }
        }
        if parlor_bot::tools::time::parse_timezone(&self.toolsets.time.default_timezone).is_err() {
            bail!(
                "toolsets.time.default_timezone {:?} is not an IANA time zone (like \"Europe/Berlin\")",
                self.toolsets.time.default_timezone
            );
        }
        for p in &self.toolsets.prompt {
            if p.name.trim().is_empty() || p.prompt.trim().is_empty() {
                bail!("every [[toolsets.prompt]] needs a non-empty name and prompt");
            }
        }
        Ok(())
    }

    /// The API key from `api_key_file` or `api_key_env`; `None` when neither is set (local
    /// servers such as Ollama need none).
    pub fn api_key(&self) -> anyhow::Result<Option<String>> {
        if let Some(path) = &self.llm.api_key_file {
            let key = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read llm.api_key_file {}", path.display()))?;
            return Ok(Some(key.trim().to_owned()));
        }
        Ok(std::env::var(&self.llm.api_key_env)
            .ok()
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty()))
    }

    /// Request timeout as a duration.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.llm.request_timeout_secs)
    }
}
