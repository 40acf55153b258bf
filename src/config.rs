//! The daemon's configuration: a TOML file (see `config.example.toml`), every field with a
//! default, unknown keys refused so a typo is an error and not a silently ignored setting.
//!
//! Resolution order for each setting: the file, then the environment (`OPENAI_API_KEY`,
//! `OPENAI_BASE_URL`, `PARLOR_MODEL`, `TELEGRAM_BOT_TOKEN`, `DISCORD_BOT_TOKEN`,
//! `ONEBOT_ACCESS_TOKEN`,
//! `PARLOR_DATA_DIR`), then the built-in default — so `parlor chat` runs with nothing but an
//! LLM endpoint in the environment.
//!
//! Secrets (the API key, the bot tokens) are resolved once, at start
//! ([`Config::resolve_secrets`]): a `*_file` key, then the value in the file, then a systemd
//! credential (`$CREDENTIALS_DIRECTORY/llm_api_key`, `telegram_token`,
//! `telegram_webhook_secret`, `discord_token`, `onebot_token`, `database_url`),
//! then the environment. Then `main` scrubs them out of the process environment
//! ([`Config::secret_env_names`]). They are [`Secret`]s, so `Debug` of a config never shows
//! them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::secrets::{self, Secret};
use parlor_bot::platform::ChatRef;

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[bot]`: identity, storage, policy.
    pub bot: BotConfig,
    /// `[llm]`: the OpenAI-compatible endpoint and the agent loop's limits.
    pub llm: LlmConfig,
    /// `[telegram]`: the Telegram adapter.
    pub telegram: TelegramSection,
    /// `[discord]`: the Discord adapter.
    pub discord: DiscordSection,
    /// `[onebot]`: QQ through a OneBot v11 implementation (NapCat...).
    pub onebot: OneBotSection,
    /// `[terminal]`: the shell toolset (off by default).
    pub terminal: TerminalSection,
    /// `[toolsets]`: which toolsets are on, and their settings.
    pub toolsets: ToolsetsConfig,
    /// `[mcp]`: Model Context Protocol servers whose tools the agent gets.
    pub mcp: McpSection,
    /// `[http]`: `/healthz`, `/readyz`, `/metrics` and the console (off unless `listen`
    /// is set).
    pub http: HttpSection,
    /// `[store]`: where the daemon keeps its state (sled under `data_dir`, or PostgreSQL).
    pub store: StoreSection,
    /// `[cluster]`: several daemons on one PostgreSQL store, chats held by lease.
    pub cluster: ClusterSection,
    /// `[groups]`: what a group's own admins may change from the chat, and the defaults.
    pub groups: GroupsSection,
    /// `[approvals]`: tools that run only after a person says yes.
    pub approvals: ApprovalsSection,
    /// The file this configuration came from (the sandbox hides it).
    #[serde(skip)]
    pub path: Option<PathBuf>,
    /// The secrets as [`Config::resolve_secrets`] found them.
    #[serde(skip)]
    secrets: Secrets,
}

/// The secrets in effect, from wherever they came.
#[derive(Debug, Clone, Default)]
struct Secrets {
    api_key: Option<Secret>,
    telegram_token: Option<Secret>,
    /// The secret token of `telegram.webhook_url`.
    telegram_webhook_secret: Option<Secret>,
    discord_token: Option<Secret>,
    /// Per MCP server (by name): each environment variable it names, read at start.
    mcp: std::collections::BTreeMap<String, std::collections::BTreeMap<String, Secret>>,
    brave_api_key: Option<Secret>,
    onebot_token: Option<Secret>,
    /// Per `[[llm.vision_models]]` entry (in order): its own key, when it names one.
    vision_keys: Vec<Option<Secret>>,
    /// Per `[[llm.fallbacks]]` entry (in order): its own key, when it names one.
    fallback_keys: Vec<Option<Secret>>,
    /// Per `[[llm.models]]` entry (in order): its own key, when it names one.
    model_keys: Vec<Option<Secret>>,
    /// The console's token (`http.token_env`).
    http_token: Option<Secret>,
    /// The PostgreSQL URL (`store.url_env`, `store.url_file`), with `backend = "postgres"`.
    database_url: Option<Secret>,
}

/// Names of the systemd credentials parlor reads (`LoadCredential=<name>:<path>`).
pub const CREDENTIAL_API_KEY: &str = "llm_api_key";
/// See [`CREDENTIAL_API_KEY`].
pub const CREDENTIAL_TELEGRAM: &str = "telegram_token";
/// See [`CREDENTIAL_API_KEY`].
pub const CREDENTIAL_TELEGRAM_WEBHOOK: &str = "telegram_webhook_secret";
/// See [`CREDENTIAL_API_KEY`].
pub const CREDENTIAL_DISCORD: &str = "discord_token";
/// See [`CREDENTIAL_API_KEY`].
pub const CREDENTIAL_ONEBOT: &str = "onebot_token";
/// See [`CREDENTIAL_API_KEY`]: the PostgreSQL URL (it may hold a password).
pub const CREDENTIAL_DATABASE_URL: &str = "database_url";

/// `[bot]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BotConfig {
    /// The bot's name in the console and in its own recorded messages.
    pub name: String,
    /// Where the database lives; `PARLOR_DATA_DIR`, systemd's `STATE_DIRECTORY`, or
    /// `$XDG_DATA_HOME/parlor` (`~/.local/share/parlor`) when unset.
    pub data_dir: Option<PathBuf>,
    /// The operators: platform-qualified user ids (`telegram:1001`, `console:*` for a whole
    /// platform) who run the bot, may reach the host (the terminal) and hold every role in
    /// every chat.
    pub admins: Vec<String>,
    /// The base system prompt; toolset prompts are appended to it.
    pub system_prompt: String,
    /// When set, only these chats are served (`telegram:-100123`).
    pub allowed_chats: Option<Vec<String>>,
    /// When set, only these users may address the bot (operators, `admins`, always may).
    pub allowed_users: Option<Vec<String>>,
    /// Messages from other bots never start a turn (prevents bot-to-bot loops).
    pub ignore_bots: bool,
    /// Items each chat's queue holds; a burst that arrives during a turn merges into one.
    pub queue_capacity: usize,
    /// Most turns a chat may start per minute; more input waits and merges.
    pub turns_per_minute: usize,
    /// Most commands (`/help`, `/status`...) one member may have answered per minute in a
    /// chat; past it, one notice, then they are only recorded. Operators are not limited.
    pub commands_per_member_per_minute: usize,
    /// Most commands a whole chat may have answered per minute.
    pub commands_per_chat_per_minute: usize,
    /// Idle sessions leave memory after this many minutes (the store keeps them).
    pub idle_minutes: u64,
    /// On SIGTERM, running turns get this long to finish before they are cancelled (and
    /// resumed after the restart).
    pub shutdown_grace_secs: u64,
    /// Messages kept per chat in the message log.
    pub max_messages_per_chat: usize,
    /// When set, a chat that used this many tokens today (UTC) gets no more turns that
    /// day; it is told once.
    pub daily_tokens_per_chat: Option<u64>,
    /// When set, a member who used this many tokens today (UTC, in every chat) is not
    /// answered again that day; told once per chat.
    pub daily_tokens_per_member: Option<u64>,
    /// When a turn's last request (prompt + completion) reaches the fixed part of every
    /// request (system prompt, tool schemas) plus this share of what `llm.context_window`
    /// leaves after it, the older turns are summarized; 0 turns compaction off (the history
    /// is then only trimmed).
    pub compact_ratio: f64,
    /// Newest turns a compaction keeps word for word.
    pub compact_keep_turns: usize,
    /// Groups the bot runs auto-chat in (`[[bot.auto_chat]]`): off unless listed.
    pub auto_chat: Vec<AutoChatConfig>,
}

/// `[[bot.auto_chat]]`: a group where the bot also reads unaddressed messages, in batches,
/// each one auto-chat turn that may speak only through `send_message`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoChatConfig {
    /// The chat as a session key: `telegram:-100123`, `telegram:-100123/topic:7`,
    /// `discord:<channel id>`, `qq:group:<id>`.
    pub chat: String,
    /// A batch is read when it holds this many messages…
    #[serde(default = "AutoChatConfig::default_batch_messages")]
    pub batch_messages: usize,
    /// …or this many seconds after its first message, whichever comes first.
    #[serde(default = "AutoChatConfig::default_batch_seconds")]
    pub batch_seconds: u64,
    /// Most `send_message` calls per batch.
    #[serde(default = "AutoChatConfig::default_max_sends_per_batch")]
    pub max_sends_per_batch: u32,
    /// Most `send_message` calls per hour in this chat.
    #[serde(default = "AutoChatConfig::default_max_sends_per_hour")]
    pub max_sends_per_hour: u32,
    /// Log (INFO) what the bot would have said instead of posting it.
    #[serde(default)]
    pub dry_run: bool,
}

impl AutoChatConfig {
    fn default_batch_messages() -> usize {
        parlor_bot::session::AutoChat::new("").batch_messages
    }
    fn default_batch_seconds() -> u64 {
        parlor_bot::session::AutoChat::new("").batch_wait.as_secs()
    }
    fn default_max_sends_per_batch() -> u32 {
        parlor_bot::session::AutoChat::new("").max_sends_per_batch
    }
    fn default_max_sends_per_hour() -> u32 {
        parlor_bot::session::AutoChat::new("").max_sends_per_hour
    }

    /// The session layer's form.
    pub fn to_runtime(&self) -> parlor_bot::session::AutoChat {
        parlor_bot::session::AutoChat {
            chat: self.chat.trim().to_owned(),
            batch_messages: self.batch_messages,
            batch_wait: Duration::from_secs(self.batch_seconds),
            max_sends_per_batch: self.max_sends_per_batch,
            max_sends_per_hour: self.max_sends_per_hour,
            dry_run: self.dry_run,
        }
    }

    /// What `check` refuses: a chat that is no session key, zero or oversized values.
    fn check(&self, i: usize) -> anyhow::Result<()> {
        let Some(chat) = ChatRef::parse_session_key(&self.chat) else {
            bail!(
                "bot.auto_chat[{i}]: chat {:?} is not a session key such as \"telegram:-100123\" (platform:chat_id, optionally /topic:<id>)",
                self.chat
            );
        };
        if !KNOWN_PLATFORMS.contains(&chat.platform.as_str()) {
            bail!(
                "bot.auto_chat[{i}]: chat {:?} names an unknown platform {:?} (known: {})",
                self.chat,
                chat.platform,
                KNOWN_PLATFORMS.join(", ")
            );
        }
        for (name, value) in [
            ("batch_messages", self.batch_messages as u64),
            ("batch_seconds", self.batch_seconds),
            ("max_sends_per_batch", u64::from(self.max_sends_per_batch)),
            ("max_sends_per_hour", u64::from(self.max_sends_per_hour)),
        ] {
            if value == 0 {
                bail!(
                    "bot.auto_chat[{i}] ({}): {name} must be at least 1",
                    self.chat
                );
            }
        }
        let most = parlor_bot::session::queue::MAX_LINES_PER_ITEM;
        if self.batch_messages > most {
            bail!(
                "bot.auto_chat[{i}] ({}): batch_messages must be at most {most}, got {}",
                self.chat,
                self.batch_messages
            );
        }
        Ok(())
    }
}

/// The platforms whose session keys `bot.auto_chat` may name.
const KNOWN_PLATFORMS: &[&str] = &["telegram", "discord", "qq", "console"];

/// The default base prompt.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are parlor, an assistant in a group chat. Several \
people may talk to you; each message starts with the name of who wrote it. Answer the person \
who addressed you, briefly and in their language. Use your tools when they help, and say \
plainly when something failed.";

impl Default for BotConfig {
    /// The session layer's and the store's defaults: each defined once, in its library.
    fn default() -> Self {
        let session = parlor_bot::session::SessionConfig::default();
        let store = parlor_bot::store::StoreOptions::default();
        BotConfig {
            name: session.bot_name,
            data_dir: None,
            admins: session.admins,
            system_prompt: DEFAULT_SYSTEM_PROMPT.to_owned(),
            allowed_chats: session.allowed_chats,
            allowed_users: session.allowed_users,
            ignore_bots: session.ignore_bots,
            queue_capacity: session.queue_capacity,
            turns_per_minute: session.turns_per_minute,
            commands_per_member_per_minute: session.commands_per_member_per_minute,
            commands_per_chat_per_minute: session.commands_per_chat_per_minute,
            idle_minutes: session.idle_timeout.as_secs() / 60,
            shutdown_grace_secs: 20,
            max_messages_per_chat: store.max_messages_per_chat,
            daily_tokens_per_chat: session.daily_tokens_per_chat,
            daily_tokens_per_member: session.daily_tokens_per_member,
            compact_ratio: session.compact_ratio,
            compact_keep_turns: session.compact_keep_turns,
            auto_chat: Vec::new(),
        }
    }
}

/// `[llm]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// Which API the endpoint speaks: `openai` (chat completions, and every compatible
    /// server) or `anthropic` (the Messages API, natively).
    pub provider: Provider,
    /// Base URL of the API: for `openai` up to and including `/v1` (`OPENAI_BASE_URL` or
    /// OpenAI's when unset), for `anthropic` its root (Anthropic's when unset).
    pub base_url: Option<String>,
    /// How long the provider keeps the cached prompt prefix (`anthropic`): `5m` or `1h`.
    pub cache_ttl: CacheTtl,
    /// The API key. Prefer a systemd credential, `api_key_env` or `api_key_file` to keep it
    /// out of the file.
    pub api_key: Option<Secret>,
    /// Environment variable holding the API key.
    pub api_key_env: String,
    /// File holding the API key (a systemd credential, say).
    pub api_key_file: Option<PathBuf>,
    /// Model name as the provider spells it; `PARLOR_MODEL` or `gpt-4o-mini`
    /// (`claude-haiku-4-5` for `anthropic`) when unset.
    pub model: Option<String>,
    /// Whether the model sees images (downloaded and sent as content parts).
    pub vision: bool,
    /// Tool calls of one response running at once.
    pub max_concurrent_tool_calls: usize,
    /// Longest tool result kept, in characters.
    pub tool_result_max_chars: usize,
    /// The model's context window in tokens: compaction starts at `bot.compact_ratio` of
    /// what the fixed prompt leaves of it, and history is trimmed to about 85% of it (60% with compaction off).
    #[serde(alias = "context_tokens")]
    pub context_window: usize,
    /// Most model calls in one turn.
    pub max_iterations: usize,
    /// How often one turn may call the same tool with the same arguments before it is
    /// stopped.
    pub max_identical_tool_calls: usize,
    /// Limit for one tool call.
    pub tool_timeout_secs: u64,
    /// Whether the model may call several tools per response.
    pub parallel_tool_calls: bool,
    /// How the tools are described to the model: `full`, or `compact` for small models with
    /// small windows (first sentences only, and of the built-in toolsets only message,
    /// memory, clock, time and todo_list).
    pub tool_profile: parlor_bot::tool::ToolProfile,
    /// Sampling temperature; the provider's default when unset.
    pub temperature: Option<f32>,
    /// Limit for the answer once it has begun, stream included.
    pub request_timeout_secs: u64,
    /// Longest wait for the answer to begin (the model reads the prompt first). Unset: 600 s
    /// for a server on this machine or network, `idle_timeout_secs` for others. A local
    /// server that has not begun is not asked again (that would start its reading over).
    pub first_token_timeout_secs: Option<u64>,
    /// TCP/TLS connect limit.
    pub connect_timeout_secs: u64,
    /// Longest silence inside a stream.
    pub idle_timeout_secs: u64,
    /// Retries after the first attempt on connect errors, timeouts, 429 and 5xx.
    pub max_retries: u32,
    /// `[[llm.vision_models]]`: models that describe images when `vision` is off, tried in
    /// order.
    pub vision_models: Vec<ModelEndpoint>,
    /// `[[llm.fallbacks]]`: providers tried in order when the main one fails after its
    /// retries (down, overloaded, rate limited, model gone, key refused, quota spent).
    pub fallbacks: Vec<ModelEndpoint>,
    /// `[[llm.models]]`: models a group may choose by name (`[groups] models`).
    pub models: Vec<ModelEndpoint>,
    /// `[llm.prices."<model>"]`: USD per million tokens (`input`, `output`, optional
    /// `cache_read`, `cache_write`), for the cost shown beside the tokens.
    pub prices: parlor_bot::llm::Prices,
}

/// The API an endpoint speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// OpenAI chat completions, and every server compatible with it.
    #[default]
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
}

/// `llm.cache_ttl`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum CacheTtl {
    /// Five minutes: a cache write costs 1.25 input tokens.
    #[default]
    #[serde(rename = "5m")]
    FiveMinutes,
    /// One hour: a write costs 2 input tokens, worth it in groups quieter than every five
    /// minutes.
    #[serde(rename = "1h")]
    OneHour,
}

/// The environment variable the main key is read from unless `api_key_env` names another.
const DEFAULT_KEY_ENV: &str = "OPENAI_API_KEY";

/// A model at an endpoint with its own key: an entry of `[[llm.vision_models]]` (a model
/// that can see, asked to describe images for the main one) or of `[[llm.fallbacks]]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelEndpoint {
    /// Only in `[[llm.models]]`: the name a group chooses it by (`/set model <name>`); the
    /// model's own name when unset.
    pub name: Option<String>,
    /// The API it speaks; the main endpoint's (`llm.provider`) when unset.
    pub provider: Option<Provider>,
    /// Model name as its provider spells it.
    pub model: String,
    /// Its endpoint; the main model's (`llm.base_url`) when unset.
    pub base_url: Option<String>,
    /// Environment variable holding its API key. With neither this nor `api_key_file` it
    /// gets the main model's key only when it uses the main endpoint (no `base_url`, or the
    /// same one), and no key otherwise: the main key never goes to another host.
    pub api_key_env: Option<String>,
    /// File holding its API key (a systemd credential's path, say); read before
    /// `api_key_env`.
    pub api_key_file: Option<PathBuf>,
}

impl LlmConfig {
    /// The lists of models at their own endpoints, with their section names.
    fn endpoints(&self) -> [(&'static str, &[ModelEndpoint]); 3] {
        [
            ("vision_models", &self.vision_models),
            ("fallbacks", &self.fallbacks),
            ("models", &self.models),
        ]
    }
}

/// The keys `entries` (of `[[llm.{section}]]`) name themselves, in order; `None` for an
/// entry that names none.
fn endpoint_keys(entries: &[ModelEndpoint], section: &str) -> anyhow::Result<Vec<Option<Secret>>> {
    let mut keys = Vec::new();
    for entry in entries {
        keys.push(match (&entry.api_key_file, &entry.api_key_env) {
            (Some(path), _) => Some(secrets::read_file(
                path,
                &format!("llm.{section}.api_key_file"),
            )?),
            (None, Some(name)) => Some(secrets::from_env(name).ok_or_else(|| {
                anyhow::anyhow!(
                    "llm.{section} ({}) reads its API key from {name}, which is not set",
                    entry.model
                )
            })?),
            (None, None) => None,
        });
    }
    Ok(keys)
}

impl Default for LlmConfig {
    /// The agent's, the client's and the session's defaults: each defined once.
    fn default() -> Self {
        let agent = parlor_bot::agent::AgentConfig::default();
        let client = parlor_bot::llm::OpenAiConfig::default();
        let session = parlor_bot::session::SessionConfig::default();
        LlmConfig {
            base_url: None,
            api_key: None,
            api_key_env: DEFAULT_KEY_ENV.to_owned(),
            provider: Provider::default(),
            cache_ttl: CacheTtl::default(),
            api_key_file: None,
            model: None,
            vision: false,
            max_concurrent_tool_calls: agent.max_concurrent_tool_calls,
            tool_result_max_chars: agent.tool_result_max_chars,
            context_window: session.context_window,
            max_iterations: agent.max_iterations,
            max_identical_tool_calls: agent.max_identical_tool_calls,
            tool_timeout_secs: agent.tool_timeout.as_secs(),
            parallel_tool_calls: agent.parallel_tool_calls,
            temperature: agent.temperature,
            request_timeout_secs: client.request_timeout.as_secs(),
            first_token_timeout_secs: client.first_byte_timeout.map(|t| t.as_secs()),
            tool_profile: parlor_bot::tool::ToolProfile::Full,
            connect_timeout_secs: client.connect_timeout.as_secs(),
            idle_timeout_secs: client.idle_timeout.as_secs(),
            max_retries: client.retry.max_retries,
            vision_models: Vec::new(),
            fallbacks: Vec::new(),
            models: Vec::new(),
            prices: parlor_bot::llm::Prices::default(),
        }
    }
}

/// `[telegram]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelegramSection {
    /// The bot token from @BotFather; the `telegram_token` credential or
    /// `TELEGRAM_BOT_TOKEN` when unset. Prefer those or `token_file`.
    pub token: Option<Secret>,
    /// File holding the token.
    pub token_file: Option<PathBuf>,
    /// Bot API server (a self-hosted `telegram-bot-api`, say).
    pub api_url: String,
    /// Long-poll timeout of `getUpdates`.
    pub poll_timeout_secs: u32,
    /// Webhook mode when set: the public HTTPS URL Telegram posts updates to, whose last
    /// path segment is a random path secret. Served by `[http] listen` at the URL's path.
    /// Unset: long polling.
    pub webhook_url: Option<String>,
    /// File holding the webhook's secret token (Telegram sends it back in
    /// `X-Telegram-Bot-Api-Secret-Token`).
    pub webhook_secret_file: Option<PathBuf>,
    /// The environment variable holding the webhook's secret token, when neither
    /// `webhook_secret_file` nor the `telegram_webhook_secret` credential gives it.
    pub webhook_secret_env: String,
}

impl Default for TelegramSection {
    fn default() -> Self {
        TelegramSection {
            token: None,
            token_file: None,
            api_url: "https://api.telegram.org".to_owned(),
            poll_timeout_secs: 30,
            webhook_url: None,
            webhook_secret_file: None,
            webhook_secret_env: "TELEGRAM_WEBHOOK_SECRET".to_owned(),
        }
    }
}

impl TelegramSection {
    /// Checks `webhook_url` (see [`check_url`](parlor_adapters::telegram::webhook::check_url))
    /// and that `[http] listen` is there to serve it.
    fn check_webhook(&self, http: &HttpSection) -> anyhow::Result<()> {
        let Some(url) = &self.webhook_url else {
            return Ok(());
        };
        if let Err(error) = parlor_adapters::telegram::webhook::check_url(url) {
            bail!("telegram.webhook_url {error}; got {url:?}");
        }
        if http.listen.is_none() {
            bail!(
                "telegram.webhook_url needs [http] listen: Telegram's updates come in through \
                 that listener (put a TLS proxy in front and list the webhook's host in \
                 http.allowed_hosts)"
            );
        }
        Ok(())
    }
}

/// `[discord]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscordSection {
    /// The bot token from the Developer Portal; the `discord_token` credential or
    /// `DISCORD_BOT_TOKEN` when unset. Prefer those or `token_file`.
    pub token: Option<Secret>,
    /// File holding the token.
    pub token_file: Option<PathBuf>,
    /// Base URL REST calls go to instead of Discord's (a proxy, or tests); the gateway URL
    /// is then asked from it too.
    pub api_url: Option<String>,
    /// Whether replies may ping `@everyone`, `@here` and roles.
    pub allow_mass_mentions: bool,
    /// How many shards the gateway is split into (0 or 1: one connection). With
    /// `[cluster]` the shards are spread across the daemons, one lease each.
    pub shards: u32,
}

/// `[cluster]`: several daemons sharing one PostgreSQL store. Each chat runs in one of
/// them at a time, held by a lease it renews (`parlor_bot::session::cluster`).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// Whether this daemon shares its store with others.
    pub enabled: bool,
    /// Its name in logs and leases (a random part is added at each start); the host name
    /// when unset.
    pub instance: Option<String>,
    /// How long a lease lasts unrenewed: how long the chats of a daemon killed without
    /// letting them go wait for another (2 to 300).
    pub lease_ttl_secs: u64,
    /// How often a daemon looks for input other daemons took for chats it holds, and for
    /// chats nobody holds (50 to 60000).
    pub sweep_interval_ms: u64,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            enabled: false,
            instance: None,
            lease_ttl_secs: 10,
            sweep_interval_ms: 1000,
        }
    }
}

/// `[store]`: which store backend keeps the daemon's state.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSection {
    /// `sled` (the default: an embedded database under `data_dir`) or `postgres`.
    pub backend: StoreBackend,
    /// With `postgres`: the environment variable holding the connection URL
    /// (`postgresql://user:password@host:5432/parlor`), read at start and then scrubbed
    /// from the environment like the other secrets.
    pub url_env: String,
    /// With `postgres`: a file holding the URL instead (it wins over `url_env`).
    pub url_file: Option<PathBuf>,
}

impl Default for StoreSection {
    fn default() -> Self {
        StoreSection {
            backend: StoreBackend::Sled,
            url_env: DEFAULT_DATABASE_URL_ENV.to_owned(),
            url_file: None,
        }
    }
}

/// The environment variable the PostgreSQL URL is read from unless `store.url_env` names
/// another.
pub const DEFAULT_DATABASE_URL_ENV: &str = "PARLOR_DATABASE_URL";

/// `store.backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// sled under `data_dir`.
    Sled,
    /// A PostgreSQL database.
    Postgres,
}

/// `[http]`: the operator's listener.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSection {
    /// Where to serve `/healthz`, `/readyz` and `/metrics`, `127.0.0.1:9464`; unset: off.
    pub listen: Option<String>,
    /// The environment variable holding the operator's console token (read at start, then
    /// scrubbed from the environment); unset: no console, only the three probes.
    pub token_env: Option<String>,
    /// Host names answered besides the loopback ones (`localhost`, `127.0.0.1`, `[::1]`):
    /// the name a reverse proxy passes on. Any other `Host` gets 421 (DNS rebinding).
    pub allowed_hosts: Vec<String>,
}

impl HttpSection {
    /// The parsed `listen` address, if set.
    pub fn listen_addr(&self) -> anyhow::Result<Option<std::net::SocketAddr>> {
        self.listen
            .as_deref()
            .map(|listen| {
                listen.parse().with_context(|| {
                    format!("http.listen must be an address and port like 127.0.0.1:9464, got {listen:?}")
                })
            })
            .transpose()
    }
}

/// `[onebot]`: one of `url` (forward: parlor connects) and `listen` (reverse: the
/// implementation connects) turns the adapter on.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OneBotSection {
    /// Forward WebSocket: the implementation's server, `ws://127.0.0.1:3001` for NapCat.
    pub url: Option<String>,
    /// Reverse WebSocket: where parlor listens for the implementation (`127.0.0.1:6700`);
    /// needs an access token.
    pub listen: Option<String>,
    /// The access token both sides share; the `onebot_token` credential or
    /// `ONEBOT_ACCESS_TOKEN` when unset. Prefer those or `access_token_file`. Required
    /// with `listen`.
    pub access_token: Option<Secret>,
    /// File holding the access token.
    pub access_token_file: Option<PathBuf>,
    /// The least time between two posts into one chat (QQ bans accounts that post fast).
    pub min_send_interval_ms: u64,
    /// The longest text part of a reply, in characters; longer replies are split.
    pub max_message_chars: usize,
    /// The limit on each action.
    pub request_timeout_secs: u64,
}

impl Default for OneBotSection {
    fn default() -> Self {
        OneBotSection {
            url: None,
            listen: None,
            access_token: None,
            access_token_file: None,
            min_send_interval_ms: 1000,
            max_message_chars: 3000,
            request_timeout_secs: 30,
        }
    }
}

impl OneBotSection {
    /// Whether `[onebot]` turns the adapter on.
    pub fn enabled(&self) -> bool {
        self.url.is_some() || self.listen.is_some()
    }

    /// `listen` as an address, when set.
    pub fn listen_addr(&self) -> anyhow::Result<Option<std::net::SocketAddr>> {
        self.listen
            .as_deref()
            .map(|listen| {
                listen.trim().parse().with_context(|| {
                    format!("onebot.listen must be an address with a port, like 127.0.0.1:6700; got {listen:?}")
                })
            })
            .transpose()
    }
}

/// `[terminal]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TerminalSection {
    /// Whether the `shell` / `task_*` tools exist at all.
    pub enabled: bool,
    /// `operators` (open to `bot.admins`) or `off`.
    pub policy: TerminalPolicy,
    /// Per-chat overrides, by session key (`telegram:-100123`).
    pub chat_policies: std::collections::BTreeMap<String, TerminalPolicy>,
    /// Default limit of a foreground command.
    pub timeout_secs: u64,
    /// Longest limit the model may ask for a foreground command.
    pub max_timeout_secs: u64,
    /// Background tasks running at once per chat.
    pub max_background_per_session: usize,
    /// Background tasks running at once in total.
    pub max_background_total: usize,
    /// A background task running longer is killed (`timed_out`).
    pub max_task_hours: u64,
    /// `bwrap` (bubblewrap: read-only system, only the own workspace writable, no view of
    /// the data directory or the daemon) or `none` (commands reach all the daemon's user
    /// can). No default: an enabled terminal must say which.
    pub sandbox: Option<SandboxKind>,
    /// With `bwrap`: whether commands may use the network.
    pub sandbox_network: bool,
    /// Environment variables passed to commands besides PATH, HOME, LANG, LC_ALL, TERM, TZ,
    /// USER, LOGNAME. Never put a secret's name here.
    pub extra_env: Vec<String>,
}

/// Whether the terminal is open. Only operators (`bot.admins`) ever use it; the policy can
/// only switch it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum TerminalPolicy {
    /// Open to operators.
    Operators,
    /// Nobody.
    Off,
}

impl TryFrom<String> for TerminalPolicy {
    type Error = String;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        match value.as_str() {
            "operators" => Ok(TerminalPolicy::Operators),
            "off" => Ok(TerminalPolicy::Off),
            // Old values are refused rather than mapped: "admins" once let a chat's own
            // admins in, and quietly narrowing or widening it would surprise the operator.
            "admins" | "everyone" => Err(format!(
                "terminal policy {value:?} is no longer supported: the terminal reaches the \
                 host, so only operators (bot.admins) may use it, never a chat's own admins \
                 (anyone can create a group and be its admin) or its members; use \
                 \"operators\" or \"off\""
            )),
            other => Err(format!(
                "unknown terminal policy {other:?}; use \"operators\" or \"off\""
            )),
        }
    }
}

/// How commands are isolated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxKind {
    /// Plain processes.
    None,
    /// bubblewrap.
    Bwrap,
}

impl Default for TerminalSection {
    fn default() -> Self {
        let d = parlor_toolsets::terminal::TerminalConfig::default();
        TerminalSection {
            enabled: false,
            policy: TerminalPolicy::Operators,
            chat_policies: Default::default(),
            timeout_secs: d.foreground_timeout.as_secs(),
            max_timeout_secs: d.max_foreground_timeout.as_secs(),
            max_background_per_session: d.max_background_per_session,
            max_background_total: d.max_background_total,
            max_task_hours: d.max_task_runtime.as_secs() / 3600,
            sandbox: None,
            sandbox_network: false,
            extra_env: Vec::new(),
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
    /// `[toolsets.memory]`
    pub memory: MemoryConfig,
    /// `[toolsets.clock]`
    pub clock: ClockConfig,
    /// `[toolsets.web]`
    pub web: WebConfig,
    /// `[[toolsets.prompt]]`: prompt-only toolsets.
    pub prompt: Vec<PromptConfig>,
    /// `[toolsets.subagent]`
    pub subagent: SubagentConfig,
    /// `[toolsets.skill]`
    pub skill: SkillConfig,
}

/// Toolsets this build knows and enables by default (`skill` only registers when its
/// `dirs` name folders).
pub const KNOWN_TOOLSETS: &[&str] = &[
    "todo_list",
    "time",
    "message",
    "memory",
    "clock",
    "web",
    "skill",
];

/// Toolsets this build knows that run only when `toolsets.enabled` names them: each
/// `subagent` call is a whole agent run, paid in tokens.
pub const OPT_IN_TOOLSETS: &[&str] = &["subagent"];

/// `[toolsets.subagent]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubagentConfig {
    /// Model of the sub-agents (a cheaper one, say); `llm.model` when empty.
    pub model: String,
    /// Most LLM calls of one sub-agent.
    pub max_iterations: usize,
    /// Most tokens of one sub-agent, over all its calls.
    pub max_tokens: u64,
    /// Longest one sub-agent may run, in seconds.
    pub max_wall_secs: u64,
    /// Most sub-agents running at once in one chat.
    pub max_per_chat: usize,
    /// Most sub-agents running at once in the whole bot.
    pub max_total: usize,
}

impl Default for SubagentConfig {
    fn default() -> Self {
        let d = parlor_toolsets::subagent::SubagentOptions::default();
        SubagentConfig {
            model: String::new(),
            max_iterations: d.max_iterations,
            max_tokens: d.max_tokens,
            max_wall_secs: d.max_wall.as_secs(),
            max_per_chat: d.max_per_session,
            max_total: d.max_total,
        }
    }
}

/// `[toolsets.skill]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SkillConfig {
    /// Folders holding one folder per skill (each with a `SKILL.md`); relative ones are
    /// relative to the config file's folder.
    pub dirs: Vec<PathBuf>,
    /// Skills offered only in some chats: skill name → session keys
    /// (`deploy = ["telegram:-100123"]`); every other skill is offered everywhere.
    pub chats: std::collections::BTreeMap<String, Vec<String>>,
}

impl Default for ToolsetsConfig {
    fn default() -> Self {
        ToolsetsConfig {
            enabled: KNOWN_TOOLSETS.iter().map(|s| s.to_string()).collect(),
            time: TimeConfig::default(),
            memory: MemoryConfig::default(),
            clock: ClockConfig::default(),
            web: WebConfig::default(),
            prompt: Vec::new(),
            subagent: SubagentConfig::default(),
            skill: SkillConfig::default(),
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

/// `[toolsets.clock]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClockConfig {
    /// Clock tasks one chat may have, paused and finished ones included.
    pub max_tasks_per_chat: usize,
    /// Shortest interval between two fires of a task, in seconds.
    pub min_interval_secs: u64,
    /// A fire whose turn has not posted within this long is logged `timed_out`.
    pub run_timeout_secs: u64,
}

impl Default for ClockConfig {
    fn default() -> Self {
        let d = parlor_toolsets::clock::ClockOptions::default();
        ClockConfig {
            max_tasks_per_chat: d.max_tasks_per_chat,
            min_interval_secs: d.min_interval.as_secs(),
            run_timeout_secs: d.run_timeout.as_secs(),
        }
    }
}

/// `[toolsets.web]`: the search provider, the URL guard (which `load_image` uses too) and
/// the limits of `web_search` / `web_fetch`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebConfig {
    /// `duckduckgo` (keyless, the default), `searxng` or `brave`.
    pub provider: WebProvider,
    /// Base URL of a SearXNG instance whose JSON API is on; needed with `searxng`.
    pub searxng_url: Option<String>,
    /// Base URL of the Brave Search API.
    pub brave_url: String,
    /// Environment variable holding the Brave Search API key.
    pub brave_api_key_env: String,
    /// File holding the Brave Search API key.
    pub brave_api_key_file: Option<PathBuf>,
    /// Base URL of DuckDuckGo's HTML endpoint.
    pub duckduckgo_url: String,
    /// Networks (CIDRs) fetches may reach although they are not public, e.g. an intranet.
    pub allow_networks: Vec<String>,
    /// What fetches never reach, even in `allow_networks`: host names (with their
    /// subdomains), IP addresses and CIDRs (compared with every address a name resolves
    /// to). A bad entry is a config error.
    pub deny_hosts: Vec<String>,
    /// One fetch, redirects and body included.
    pub fetch_timeout_secs: u64,
    /// One search.
    pub search_timeout_secs: u64,
    /// Most bytes of a page downloaded; a longer page is cut there.
    pub max_fetch_bytes: u64,
    /// Characters of page text per `web_fetch` result unless the model asks for fewer.
    pub page_chars: usize,
    /// `web_search` and `web_fetch` calls per chat and minute, together.
    pub calls_per_minute: usize,
    /// How long a fetched page is kept for paging and repeated reads (0: not kept).
    pub cache_secs: u64,
}

/// Who answers `web_search`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebProvider {
    /// DuckDuckGo's HTML page; no key.
    Duckduckgo,
    /// A SearXNG instance's JSON API.
    Searxng,
    /// The Brave Search API; needs a key.
    Brave,
}

/// The name of the systemd credential holding the Brave Search API key.
pub const CREDENTIAL_BRAVE: &str = "brave_api_key";

impl Default for WebConfig {
    fn default() -> Self {
        WebConfig {
            provider: WebProvider::Duckduckgo,
            searxng_url: None,
            brave_url: parlor_toolsets::web::search::BRAVE_URL.to_owned(),
            brave_api_key_env: "BRAVE_API_KEY".to_owned(),
            brave_api_key_file: None,
            duckduckgo_url: parlor_toolsets::web::search::DUCKDUCKGO_URL.to_owned(),
            allow_networks: Vec::new(),
            deny_hosts: Vec::new(),
            fetch_timeout_secs: 20,
            search_timeout_secs: 15,
            max_fetch_bytes: 2 * 1024 * 1024,
            page_chars: 5000,
            calls_per_minute: 20,
            cache_secs: 300,
        }
    }
}

/// `[toolsets.memory]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Most entries one chat may keep.
    pub max_entries: usize,
    /// Longest entry, in characters.
    pub max_entry_chars: usize,
    /// An embedding model (`text-embedding-3-small`, `nomic-embed-text`): when set,
    /// `memory_search` also ranks entries by meaning, from the vectors of the
    /// OpenAI-compatible `/embeddings` endpoint, fused with the word ranking.
    pub embeddings: Option<String>,
    /// The endpoint's API root (up to and including `/v1`); the `[llm]` endpoint when
    /// unset, which then must speak `openai`.
    pub embeddings_base_url: Option<String>,
    /// Environment variable holding the key of `embeddings_base_url`; without it that
    /// endpoint gets no key (the `[llm]` key goes only to the `[llm]` endpoint).
    pub embeddings_api_key_env: Option<String>,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            max_entries: 200,
            max_entry_chars: 4000,
            embeddings: None,
            embeddings_base_url: None,
            embeddings_api_key_env: None,
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

/// `[mcp]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpSection {
    /// `[[mcp.servers]]`, in order.
    pub servers: Vec<McpServerSection>,
}

/// One `[[mcp.servers]]`: `command` (+ `args`, `env`) for a stdio child, or `url` for
/// streamable HTTP.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpServerSection {
    /// Its name: tools become `<name>__<tool>`.
    pub name: String,
    /// Off skips it entirely.
    pub enabled: bool,
    /// The program of a stdio server.
    pub command: Option<PathBuf>,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables set for the child, on top of the allow-list (PATH, HOME, LANG...).
    pub env: std::collections::BTreeMap<String, String>,
    /// Variables of parlor's own environment passed on to the child under the same name
    /// (read at start, then scrubbed from parlor's environment): how a token reaches it.
    pub pass_env: Vec<String>,
    /// The child's working directory.
    pub cwd: Option<PathBuf>,
    /// The endpoint of a streamable-HTTP server.
    pub url: Option<String>,
    /// Headers sent as written (no secrets here).
    pub headers: std::collections::BTreeMap<String, String>,
    /// Headers whose values come from environment variables: header name → variable.
    pub header_env: std::collections::BTreeMap<String, String>,
    /// Environment variable holding a bearer token for `Authorization`.
    pub bearer_token_env: Option<String>,
    /// Only these of its tools (by the server's names); all when unset.
    pub tools: Option<Vec<String>>,
    /// Never these.
    pub disabled_tools: Vec<String>,
    /// The risk of its tools: `read` (anyone), `write` (chat admins), `dangerous`
    /// (operators). Unset: `dangerous`. A tool the server calls destructive is always
    /// `dangerous`.
    pub risk: Option<parlor_bot::tool::Risk>,
    /// Risk per tool, by the server's tool name.
    pub tool_risk: std::collections::BTreeMap<String, parlor_bot::tool::Risk>,
    /// Who must say yes before any tool of this server runs (`"chat_admin"`,
    /// `"operator"`); unset: nobody is asked.
    pub approval: Option<ApprovalRole>,
    /// The same per tool (its name as the server gives it), over `approval`.
    pub tool_approval: std::collections::BTreeMap<String, ApprovalRole>,
    /// Limit of one call, of connecting and of listing.
    pub timeout_secs: u64,
    /// When set, the only chats (session keys, `telegram:-100123`) its tools run in.
    pub chats: Option<Vec<String>>,
}

impl Default for McpServerSection {
    fn default() -> Self {
        McpServerSection {
            name: String::new(),
            enabled: true,
            command: None,
            args: Vec::new(),
            env: Default::default(),
            pass_env: Vec::new(),
            cwd: None,
            url: None,
            headers: Default::default(),
            header_env: Default::default(),
            bearer_token_env: None,
            tools: None,
            disabled_tools: Vec::new(),
            risk: None,
            tool_risk: Default::default(),
            approval: None,
            tool_approval: Default::default(),
            timeout_secs: 30,
            chats: None,
        }
    }
}

impl McpServerSection {
    /// Every environment variable this server reads a secret from.
    fn secret_env(&self) -> impl Iterator<Item = &String> {
        self.pass_env
            .iter()
            .chain(self.header_env.values())
            .chain(self.bearer_token_env.iter())
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

impl Config {
    /// Reads and checks a config file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        let mut config = Self::parse(&text)
            .with_context(|| format!("config file {} is invalid", path.display()))?;
        config.path = Some(std::path::absolute(path).unwrap_or_else(|_| path.to_owned()));
        Ok(config)
    }

    /// Parses and checks config text.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let config: Config = toml::from_str(text)?;
        config.check()?;
        Ok(config)
    }

    /// Checks values a type cannot: ranges, names, time zones, URLs. Each error names the key.
    pub fn check(&self) -> anyhow::Result<()> {
        self.check_cluster()?;
        let base_url = self.base_url();
        if !base_url.starts_with("http://") && !base_url.starts_with("https://") {
            bail!("llm.base_url must start with http:// or https://, got {base_url:?}");
        }
        if self.model().trim().is_empty() {
            bail!("llm.model must not be empty");
        }
        for (model, price) in &self.llm.prices.0 {
            if !price.is_valid() {
                bail!(
                    "llm.prices.\"{model}\": every price must be a number of US dollars per \
                     million tokens, 0 or more"
                );
            }
        }
        for (section, entries) in self.llm.endpoints() {
            for (i, entry) in entries.iter().enumerate() {
                if entry.model.trim().is_empty() {
                    bail!("llm.{section}[{i}]: model must be set");
                }
                if let Some(url) = &entry.base_url
                    && !url.starts_with("http://")
                    && !url.starts_with("https://")
                {
                    bail!(
                        "llm.{section}[{i}] ({}): base_url must start with http:// or https://, got {url:?}",
                        entry.model
                    );
                }
            }
        }
        self.check_groups()?;
        let api_url = &self.telegram.api_url;
        if !api_url.starts_with("http://") && !api_url.starts_with("https://") {
            bail!("telegram.api_url must start with http:// or https://, got {api_url:?}");
        }
        if let Some(api_url) = &self.discord.api_url
            && !api_url.starts_with("http://")
            && !api_url.starts_with("https://")
        {
            bail!("discord.api_url must start with http:// or https://, got {api_url:?}");
        }
        self.http.listen_addr()?;
        self.telegram.check_webhook(&self.http)?;
        let mut auto_chats = std::collections::HashSet::new();
        for (i, auto) in self.bot.auto_chat.iter().enumerate() {
            auto.check(i)?;
            if !auto_chats.insert(auto.chat.trim()) {
                bail!("bot.auto_chat[{i}]: chat {:?} is listed twice", auto.chat);
            }
        }
        if self.onebot.url.is_some() && self.onebot.listen.is_some() {
            bail!(
                "[onebot] takes url (forward: parlor connects) or listen (reverse: the implementation connects), not both"
            );
        }
        if let Some(url) = &self.onebot.url
            && !url.starts_with("ws://")
            && !url.starts_with("wss://")
        {
            bail!("onebot.url must start with ws:// or wss://, got {url:?}");
        }
        self.onebot.listen_addr()?;
        for (name, value) in [
            (
                "onebot.request_timeout_secs",
                self.onebot.request_timeout_secs,
            ),
            (
                "onebot.max_message_chars",
                self.onebot.max_message_chars as u64,
            ),
            ("llm.request_timeout_secs", self.llm.request_timeout_secs),
            (
                "llm.first_token_timeout_secs",
                self.llm.first_token_timeout_secs.unwrap_or(1),
            ),
            ("llm.connect_timeout_secs", self.llm.connect_timeout_secs),
            ("llm.idle_timeout_secs", self.llm.idle_timeout_secs),
            ("llm.tool_timeout_secs", self.llm.tool_timeout_secs),
            ("llm.max_iterations", self.llm.max_iterations as u64),
            (
                "llm.max_identical_tool_calls",
                self.llm.max_identical_tool_calls as u64,
            ),
            (
                "llm.max_concurrent_tool_calls",
                self.llm.max_concurrent_tool_calls as u64,
            ),
            ("bot.queue_capacity", self.bot.queue_capacity as u64),
            ("bot.turns_per_minute", self.bot.turns_per_minute as u64),
            (
                "bot.commands_per_member_per_minute",
                self.bot.commands_per_member_per_minute as u64,
            ),
            (
                "bot.commands_per_chat_per_minute",
                self.bot.commands_per_chat_per_minute as u64,
            ),
            ("bot.idle_minutes", self.bot.idle_minutes),
            ("bot.compact_keep_turns", self.bot.compact_keep_turns as u64),
            (
                "bot.max_messages_per_chat",
                self.bot.max_messages_per_chat as u64,
            ),
            (
                "bot.daily_tokens_per_chat",
                self.bot.daily_tokens_per_chat.unwrap_or(1),
            ),
            (
                "bot.daily_tokens_per_member",
                self.bot.daily_tokens_per_member.unwrap_or(1),
            ),
            (
                "telegram.poll_timeout_secs",
                u64::from(self.telegram.poll_timeout_secs),
            ),
            ("terminal.timeout_secs", self.terminal.timeout_secs),
            (
                "toolsets.clock.max_tasks_per_chat",
                self.toolsets.clock.max_tasks_per_chat as u64,
            ),
            (
                "toolsets.clock.min_interval_secs",
                self.toolsets.clock.min_interval_secs,
            ),
            (
                "toolsets.clock.run_timeout_secs",
                self.toolsets.clock.run_timeout_secs,
            ),
            ("terminal.max_timeout_secs", self.terminal.max_timeout_secs),
            ("terminal.max_task_hours", self.terminal.max_task_hours),
            (
                "toolsets.web.fetch_timeout_secs",
                self.toolsets.web.fetch_timeout_secs,
            ),
            (
                "toolsets.web.search_timeout_secs",
                self.toolsets.web.search_timeout_secs,
            ),
            (
                "toolsets.web.max_fetch_bytes",
                self.toolsets.web.max_fetch_bytes,
            ),
            (
                "toolsets.web.calls_per_minute",
                self.toolsets.web.calls_per_minute as u64,
            ),
            (
                "toolsets.memory.max_entries",
                self.toolsets.memory.max_entries as u64,
            ),
            (
                "toolsets.memory.max_entry_chars",
                self.toolsets.memory.max_entry_chars as u64,
            ),
        ] {
            if value == 0 {
                bail!("{name} must be at least 1");
            }
        }
        let memory = &self.toolsets.memory;
        if let Some(model) = &memory.embeddings {
            if model.trim().is_empty() {
                bail!(
                    "toolsets.memory.embeddings is empty: name an embedding model, or leave it out"
                );
            }
            if memory.embeddings_base_url.is_none() && self.llm.provider == Provider::Anthropic {
                bail!(
                    "toolsets.memory.embeddings needs an OpenAI-compatible /embeddings endpoint, \
                     which Anthropic's API has not: set toolsets.memory.embeddings_base_url"
                );
            }
        }
        if let Some(url) = &memory.embeddings_base_url
            && reqwest::Url::parse(url).is_err()
        {
            bail!("toolsets.memory.embeddings_base_url {url:?} is not a URL");
        }
        if self.terminal.enabled && self.terminal.sandbox.is_none() {
            bail!(
                "[terminal] enabled = true needs an explicit sandbox: sandbox = \"bwrap\" runs \
                 every command in bubblewrap (installed separately), seeing the system read-only \
                 and only its chat's workspace, never the store or the daemon; sandbox = \"none\" \
                 runs commands as parlor's own user, able to read and change everything that user \
                 can (the store with every chat's history, other chats' workspaces, secret files)"
            );
        }
        if self.terminal.timeout_secs > self.terminal.max_timeout_secs {
            bail!("terminal.timeout_secs must not exceed terminal.max_timeout_secs");
        }
        for name in &self.terminal.extra_env {
            let upper = name.to_uppercase();
            if ["KEY", "TOKEN", "SECRET", "PASSWORD"]
                .iter()
                .any(|s| upper.contains(s))
            {
                bail!(
                    "terminal.extra_env must not pass secrets to commands; {name:?} looks like one"
                );
            }
        }
        if self.llm.tool_result_max_chars < 200 {
            bail!("llm.tool_result_max_chars must be at least 200");
        }
        if self.llm.context_window < 2000 {
            bail!("llm.context_window must be at least 2000");
        }
        if !(0.0..=0.95).contains(&self.bot.compact_ratio) {
            bail!(
                "bot.compact_ratio must be between 0 (compaction off) and 0.95, got {}",
                self.bot.compact_ratio
            );
        }
        if self.telegram.poll_timeout_secs > 50 {
            bail!("telegram.poll_timeout_secs must be at most 50 (Telegram's own limit)");
        }
        for name in &self.toolsets.enabled {
            if !KNOWN_TOOLSETS.contains(&name.as_str()) && !OPT_IN_TOOLSETS.contains(&name.as_str())
            {
                bail!(
                    "toolsets.enabled names unknown toolset {name:?}; known: {}, {}",
                    KNOWN_TOOLSETS.join(", "),
                    OPT_IN_TOOLSETS.join(", ")
                );
            }
        }
        let s = &self.toolsets.subagent;
        for (name, value) in [
            ("toolsets.subagent.max_iterations", s.max_iterations as u64),
            ("toolsets.subagent.max_tokens", s.max_tokens),
            ("toolsets.subagent.max_wall_secs", s.max_wall_secs),
            ("toolsets.subagent.max_per_chat", s.max_per_chat as u64),
            ("toolsets.subagent.max_total", s.max_total as u64),
        ] {
            if value == 0 {
                bail!("{name} must be at least 1");
            }
        }
        for (skill, chats) in &self.toolsets.skill.chats {
            if !parlor_toolsets::skill::is_valid_name(skill) {
                bail!(
                    "toolsets.skill.chats names {skill:?}, which is not a skill name (lowercase \
                     letters, digits and hyphens)"
                );
            }
            if let Some(chat) = chats.iter().find(|c| !c.contains(':')) {
                bail!(
                    "toolsets.skill.chats.{skill} lists {chat:?}; chats are session keys, like \
                     \"telegram:-100123\""
                );
            }
        }
        if let Err(why) =
            parlor_toolsets::time::parse_timezone(&self.toolsets.time.default_timezone)
        {
            bail!("toolsets.time.default_timezone: {why}");
        }
        self.check_web()?;
        for p in &self.toolsets.prompt {
            if p.name.trim().is_empty() || p.prompt.trim().is_empty() {
                bail!("every [[toolsets.prompt]] needs a non-empty name and prompt");
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for server in &self.mcp.servers {
            let name = &server.name;
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                bail!(
                    "every [[mcp.servers]] needs a name of letters, digits, '_' or '-'; got {name:?}"
                );
            }
            if !names.insert(name.clone()) {
                bail!("[[mcp.servers]] name {name:?} is used twice");
            }
            match (&server.command, &server.url) {
                (Some(_), None) => {
                    if !server.headers.is_empty()
                        || !server.header_env.is_empty()
                        || server.bearer_token_env.is_some()
                    {
                        bail!("mcp server {name:?}: headers are for url servers, not command ones");
                    }
                }
                (None, Some(url)) => {
                    if !url.starts_with("http://") && !url.starts_with("https://") {
                        bail!(
                            "mcp server {name:?}: url must start with http:// or https://, got {url:?}"
                        );
                    }
                    if !server.args.is_empty()
                        || !server.env.is_empty()
                        || !server.pass_env.is_empty()
                    {
                        bail!(
                            "mcp server {name:?}: args, env and pass_env are for command servers"
                        );
                    }
                }
                _ => bail!("mcp server {name:?} needs exactly one of command and url"),
            }
            if server.timeout_secs == 0 {
                bail!("mcp server {name:?}: timeout_secs must be at least 1");
            }
        }
        for id in self
            .bot
            .admins
            .iter()
            .chain(self.bot.allowed_users.iter().flatten())
        {
            if !id.contains(':') {
                bail!(
                    "bot.admins / bot.allowed_users entries are platform-qualified, like \"telegram:1001\"; got {id:?}"
                );
            }
        }
        Ok(())
    }

    /// `[toolsets.web]`: URLs, networks, the page size.
    fn check_cluster(&self) -> anyhow::Result<()> {
        let c = &self.cluster;
        if !c.enabled {
            return Ok(());
        }
        if self.store.backend != StoreBackend::Postgres {
            bail!(
                "cluster.enabled needs store.backend = \"postgres\": sled is one daemon's \
                 store"
            );
        }
        if !(2..=300).contains(&c.lease_ttl_secs) {
            bail!(
                "cluster.lease_ttl_secs must be 2 to 300, got {}",
                c.lease_ttl_secs
            );
        }
        if !(50..=60_000).contains(&c.sweep_interval_ms) {
            bail!(
                "cluster.sweep_interval_ms must be 50 to 60000, got {}",
                c.sweep_interval_ms
            );
        }
        if let Some(name) = &c.instance
            && (name.is_empty()
                || name.len() > 64
                || !name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.')))
        {
            bail!(
                "cluster.instance must be 1 to 64 letters, digits, '-', '_' or '.', got {name:?}"
            );
        }
        Ok(())
    }

    fn check_web(&self) -> anyhow::Result<()> {
        let web = &self.toolsets.web;
        self.url_guard()?;
        for (key, url) in [
            ("toolsets.web.brave_url", Some(&web.brave_url)),
            ("toolsets.web.duckduckgo_url", Some(&web.duckduckgo_url)),
            ("toolsets.web.searxng_url", web.searxng_url.as_ref()),
        ] {
            if let Some(url) = url
                && !url.starts_with("http://")
                && !url.starts_with("https://")
            {
                bail!("{key} must start with http:// or https://, got {url:?}");
            }
        }
        if web.provider == WebProvider::Searxng && web.searxng_url.is_none() {
            bail!(
                "toolsets.web.provider = \"searxng\" needs toolsets.web.searxng_url (the base URL \
                 of the instance, with format = json enabled in its settings)"
            );
        }
        let max = parlor_toolsets::web::MAX_PAGE_CHARS;
        if !(100..=max).contains(&web.page_chars) {
            bail!("toolsets.web.page_chars must be between 100 and {max}");
        }
        Ok(())
    }

    /// The LLM endpoint: file, `OPENAI_BASE_URL`, OpenAI.
    pub fn base_url(&self) -> String {
        match self.llm.provider {
            Provider::Openai => self
                .llm
                .base_url
                .clone()
                .or_else(|| env("OPENAI_BASE_URL"))
                .unwrap_or_else(|| "https://api.openai.com/v1".to_owned()),
            Provider::Anthropic => self
                .llm
                .base_url
                .clone()
                .unwrap_or_else(|| "https://api.anthropic.com".to_owned()),
        }
    }

    /// The environment variable holding the main key: `api_key_env`, or with
    /// `provider = "anthropic"` and `api_key_env` left alone, `ANTHROPIC_API_KEY`.
    pub fn api_key_env(&self) -> &str {
        match self.llm.provider {
            Provider::Anthropic if self.llm.api_key_env == DEFAULT_KEY_ENV => "ANTHROPIC_API_KEY",
            _ => &self.llm.api_key_env,
        }
    }

    /// The model: file, `PARLOR_MODEL`, `gpt-4o-mini` (`claude-haiku-4-5` with
    /// `provider = "anthropic"`).
    pub fn model(&self) -> String {
        self.llm
            .model
            .clone()
            .or_else(|| env("PARLOR_MODEL"))
            .unwrap_or_else(|| match self.llm.provider {
                Provider::Openai => "gpt-4o-mini".to_owned(),
                Provider::Anthropic => "claude-haiku-4-5".to_owned(),
            })
    }

    /// Finds every secret, in order: the `*_file` key, the value in the file, the systemd
    /// credential, the environment. Run once at start, before [`Config::secret_env_names`]
    /// are scrubbed from the environment; until then the accessors return `None`.
    pub fn resolve_secrets(&mut self) -> anyhow::Result<()> {
        let api_key = resolve(
            self.llm.api_key_file.as_deref(),
            "llm.api_key_file",
            self.llm.api_key.as_ref(),
            CREDENTIAL_API_KEY,
            self.api_key_env(),
        )?;
        let telegram_token = resolve(
            self.telegram.token_file.as_deref(),
            "telegram.token_file",
            self.telegram.token.as_ref(),
            CREDENTIAL_TELEGRAM,
            "TELEGRAM_BOT_TOKEN",
        )?;
        let telegram_webhook_secret = match &self.telegram.webhook_url {
            Some(_) => Some(self.webhook_secret()?),
            None => None,
        };
        let discord_token = resolve(
            self.discord.token_file.as_deref(),
            "discord.token_file",
            self.discord.token.as_ref(),
            CREDENTIAL_DISCORD,
            "DISCORD_BOT_TOKEN",
        )?;
        let mut mcp = std::collections::BTreeMap::new();
        for server in self.mcp.servers.iter().filter(|s| s.enabled) {
            let mut found = std::collections::BTreeMap::new();
            for name in server.secret_env() {
                let Some(secret) = secrets::from_env(name) else {
                    bail!(
                        "mcp server {:?} reads the environment variable {name}, which is not set",
                        server.name
                    );
                };
                found.insert(name.clone(), secret);
            }
            mcp.insert(server.name.clone(), found);
        }
        let brave_api_key = resolve(
            self.toolsets.web.brave_api_key_file.as_deref(),
            "toolsets.web.brave_api_key_file",
            None,
            CREDENTIAL_BRAVE,
            &self.toolsets.web.brave_api_key_env,
        )?;
        if self.web_enabled()
            && self.toolsets.web.provider == WebProvider::Brave
            && brave_api_key.is_none()
        {
            bail!(
                "toolsets.web.provider = \"brave\" needs a Brave Search API key: set {} (or \
                 toolsets.web.brave_api_key_file, or the systemd credential {CREDENTIAL_BRAVE})",
                self.toolsets.web.brave_api_key_env
            );
        }
        let onebot_token = resolve(
            self.onebot.access_token_file.as_deref(),
            "onebot.access_token_file",
            self.onebot.access_token.as_ref(),
            CREDENTIAL_ONEBOT,
            "ONEBOT_ACCESS_TOKEN",
        )?;
        // Without a token any local process, or a web page the host's browser opens, could
        // connect and speak as the QQ account, operators' numbers included.
        if self.onebot.listen.is_some() && onebot_token.is_none() {
            bail!(
                "onebot.listen needs an access token, which the OneBot implementation must \
                 present: set ONEBOT_ACCESS_TOKEN, onebot.access_token_file, \
                 onebot.access_token or the systemd credential {CREDENTIAL_ONEBOT} (and the \
                 same token in the implementation's WebSocket client settings)"
            );
        }
        let vision_keys = endpoint_keys(&self.llm.vision_models, "vision_models")?;
        let fallback_keys = endpoint_keys(&self.llm.fallbacks, "fallbacks")?;
        let model_keys = endpoint_keys(&self.llm.models, "models")?;
        let http_token = match &self.http.token_env {
            Some(name) => {
                let token = secrets::from_env(name).ok_or_else(|| {
                    anyhow::anyhow!(
                        "http.token_env names {name}, which is not set: the console needs its token"
                    )
                })?;
                // Guessable tokens make the login form a door.
                if token.expose().chars().count() < 16 {
                    bail!("the console token in {name} is shorter than 16 characters");
                }
                Some(token)
            }
            None => None,
        };
        let database_url = match self.store.backend {
            StoreBackend::Postgres => Some(
                resolve(
                    self.store.url_file.as_deref(),
                    "store.url_file",
                    None,
                    CREDENTIAL_DATABASE_URL,
                    &self.store.url_env,
                )?
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "store.backend = \"postgres\" needs the database URL: set {} (or \
                         store.url_file, or the systemd credential {CREDENTIAL_DATABASE_URL})",
                        self.store.url_env
                    )
                })?,
            ),
            StoreBackend::Sled => None,
        };
        self.secrets = Secrets {
            database_url,
            http_token,
            api_key,
            telegram_token,
            telegram_webhook_secret,
            discord_token,
            mcp,
            brave_api_key,
            onebot_token,
            vision_keys,
            fallback_keys,
            model_keys,
        };
        Ok(())
    }

    /// The webhook's secret token: `webhook_secret_file`, the systemd credential, the
    /// environment; required, and checked against Telegram's rule.
    fn webhook_secret(&self) -> anyhow::Result<Secret> {
        let section = &self.telegram;
        let secret = resolve(
            section.webhook_secret_file.as_deref(),
            "telegram.webhook_secret_file",
            None,
            CREDENTIAL_TELEGRAM_WEBHOOK,
            &section.webhook_secret_env,
        )?;
        // Without it anyone who learns the URL could post updates as any member.
        let Some(secret) = secret else {
            bail!(
                "telegram.webhook_url needs a secret token: set {} (or \
                 telegram.webhook_secret_file, or the systemd credential \
                 {CREDENTIAL_TELEGRAM_WEBHOOK}) to 1-256 characters of A-Z a-z 0-9 _ -",
                section.webhook_secret_env
            );
        };
        if !parlor_adapters::telegram::webhook::valid_secret_token(secret.expose()) {
            bail!(
                "the Telegram webhook secret token must be 1-256 characters of A-Z a-z 0-9 _ - \
                 (Telegram's rule)"
            );
        }
        Ok(secret)
    }

    /// Environment variables that hold (or may hold) secrets: the ones parlor reads, and
    /// `OPENAI_API_KEY` also when `api_key_env` names another.
    pub fn secret_env_names(&self) -> Vec<String> {
        let mut names = vec![self.api_key_env().to_owned()];
        for name in [
            "OPENAI_API_KEY",
            "TELEGRAM_BOT_TOKEN",
            self.telegram.webhook_secret_env.as_str(),
            "DISCORD_BOT_TOKEN",
            self.toolsets.web.brave_api_key_env.as_str(),
            "ONEBOT_ACCESS_TOKEN",
            self.store.url_env.as_str(),
        ] {
            if !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
        for name in self
            .llm
            .endpoints()
            .into_iter()
            .flat_map(|(_, entries)| entries)
            .filter_map(|v| v.api_key_env.as_ref())
        {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        for name in self.mcp.servers.iter().flat_map(|s| s.secret_env()) {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        if let Some(name) = &self.http.token_env
            && !names.contains(name)
        {
            names.push(name.clone());
        }
        names
    }

    /// Files holding secrets or naming them, for the sandbox to hide: the config file and,
    /// when it has a directory of its own (`/etc/parlor/`), that directory (an
    /// `EnvironmentFile=` usually sits beside it), and the `*_file`s.
    pub fn secret_paths(&self) -> Vec<PathBuf> {
        let mut paths = Vec::new();
        if let Some(path) = &self.path {
            paths.push(path.clone());
            if let Some(dir) = path.parent()
                && dir.components().count() > 2
            {
                paths.push(dir.to_owned());
            }
        }
        paths.extend(
            [
                &self.llm.api_key_file,
                &self.telegram.token_file,
                &self.telegram.webhook_secret_file,
                &self.discord.token_file,
                &self.toolsets.web.brave_api_key_file,
                &self.onebot.access_token_file,
                &self.store.url_file,
            ]
            .into_iter()
            .flatten()
            .cloned(),
        );
        paths.extend(
            self.llm
                .endpoints()
                .into_iter()
                .flat_map(|(_, entries)| entries)
                .filter_map(|v| v.api_key_file.clone()),
        );
        paths
    }

    /// The LLM API key, once resolved; `None` when there is none (local servers such as
    /// Ollama need none).
    pub fn api_key(&self) -> Option<&Secret> {
        self.secrets.api_key.as_ref()
    }

    /// The API key of `[[llm.vision_models]]` entry `index`, once resolved: its own; else
    /// the main model's when it uses the main endpoint; else none, so that naming another
    /// `base_url` never sends the main key there.
    pub fn vision_api_key(&self, index: usize) -> Option<&Secret> {
        self.endpoint_key(
            self.llm.vision_models.get(index)?,
            self.secrets.vision_keys.get(index),
        )
    }

    /// The API key of `[[llm.models]]` entry `index`, by the rule of
    /// [`Config::vision_api_key`].
    pub fn model_api_key(&self, index: usize) -> Option<&Secret> {
        self.endpoint_key(
            self.llm.models.get(index)?,
            self.secrets.model_keys.get(index),
        )
    }

    /// The API key of `[[llm.fallbacks]]` entry `index`, by the rule of
    /// [`Config::vision_api_key`].
    pub fn fallback_api_key(&self, index: usize) -> Option<&Secret> {
        self.endpoint_key(
            self.llm.fallbacks.get(index)?,
            self.secrets.fallback_keys.get(index),
        )
    }

    /// The key of `entry`: `own` when it named one; else the main key when it uses the
    /// main endpoint; else none.
    fn endpoint_key<'a>(
        &'a self,
        entry: &ModelEndpoint,
        own: Option<&'a Option<Secret>>,
    ) -> Option<&'a Secret> {
        if let Some(Some(key)) = own {
            return Some(key);
        }
        let main = self.base_url();
        let same = |url: &str| url.trim_end_matches('/') == main.trim_end_matches('/');
        if entry.base_url.as_deref().is_none_or(same) {
            self.api_key()
        } else {
            None
        }
    }

    /// The PostgreSQL URL, once resolved (with `store.backend = "postgres"` only).
    pub fn database_url(&self) -> Option<&Secret> {
        self.secrets.database_url.as_ref()
    }

    /// The Telegram token, once resolved.
    pub fn telegram_token(&self) -> Option<&Secret> {
        self.secrets.telegram_token.as_ref()
    }

    /// Webhook mode's settings for the adapter, once the secret is resolved; `None` in
    /// polling mode.
    pub fn telegram_webhook(&self) -> Option<parlor_adapters::telegram::WebhookConfig> {
        let url = self.telegram.webhook_url.as_ref()?;
        let secret = self.secrets.telegram_webhook_secret.as_ref()?;
        Some(parlor_adapters::telegram::WebhookConfig {
            url: url.trim().to_owned(),
            secret_token: secret.expose().to_owned().into(),
        })
    }

    /// The Discord token, once resolved.
    pub fn discord_token(&self) -> Option<&Secret> {
        self.secrets.discord_token.as_ref()
    }

    /// The enabled MCP servers as the toolset takes them, their secrets filled in from
    /// what [`Config::resolve_secrets`] read (missing before it ran: `parlor tools` then
    /// connects without them).
    pub fn mcp_servers(&self) -> Vec<parlor_toolsets::mcp::McpServerConfig> {
        use parlor_toolsets::mcp::{McpServerConfig, McpTransport};
        let none = std::collections::BTreeMap::new();
        self.mcp
            .servers
            .iter()
            .filter(|s| s.enabled)
            .map(|s| {
                let found = self.secrets.mcp.get(&s.name).unwrap_or(&none);
                let secret = |name: &String| found.get(name).map(|v| v.expose().to_owned());
                let transport = match (&s.command, &s.url) {
                    (Some(command), _) => {
                        let mut env = s.env.clone();
                        for name in &s.pass_env {
                            if let Some(value) = secret(name) {
                                env.insert(name.clone(), value);
                            }
                        }
                        McpTransport::Stdio {
                            command: command.clone(),
                            args: s.args.clone(),
                            env,
                            cwd: s.cwd.clone(),
                        }
                    }
                    (None, url) => {
                        let mut headers = s.headers.clone();
                        for (header, name) in &s.header_env {
                            if let Some(value) = secret(name) {
                                headers.insert(header.clone(), value);
                            }
                        }
                        McpTransport::Http {
                            url: url.clone().unwrap_or_default(),
                            headers,
                            bearer_token: s.bearer_token_env.as_ref().and_then(secret),
                        }
                    }
                };
                McpServerConfig {
                    name: s.name.clone(),
                    transport,
                    tools: s.tools.clone(),
                    disabled_tools: s.disabled_tools.clone(),
                    risk: s.risk,
                    tool_risk: s.tool_risk.clone(),
                    timeout: Duration::from_secs(s.timeout_secs),
                    chats: s.chats.clone(),
                }
            })
            .collect()
    }

    /// The Brave Search API key, once resolved.
    pub fn brave_api_key(&self) -> Option<&Secret> {
        self.secrets.brave_api_key.as_ref()
    }

    /// Whether the `web` toolset is enabled.
    pub fn web_enabled(&self) -> bool {
        self.toolsets.enabled.iter().any(|t| t == "web")
    }

    /// The URL guard of `[toolsets.web]`, for `web_fetch` and `load_image` alike.
    pub fn url_guard(&self) -> anyhow::Result<parlor_toolsets::net::Guard> {
        let web = &self.toolsets.web;
        parlor_toolsets::net::Guard::new(&web.allow_networks, &web.deny_hosts)
            .context("toolsets.web.allow_networks / deny_hosts")
    }

    /// The OneBot access token, once resolved.
    pub fn onebot_token(&self) -> Option<&Secret> {
        self.secrets.onebot_token.as_ref()
    }

    /// The operator console's token (`http.token_env`), once resolved.
    pub fn http_token(&self) -> Option<&Secret> {
        self.secrets.http_token.as_ref()
    }

    /// Where the database lives.
    pub fn data_dir(&self) -> PathBuf {
        if let Some(dir) = &self.bot.data_dir {
            return dir.clone();
        }
        if let Some(dir) = env("PARLOR_DATA_DIR") {
            return PathBuf::from(dir);
        }
        // systemd's StateDirectory= sets this.
        if let Some(dir) = env("STATE_DIRECTORY") {
            return PathBuf::from(dir);
        }
        if let Some(dir) = env("XDG_DATA_HOME") {
            return PathBuf::from(dir).join("parlor");
        }
        if let Some(home) = env("HOME") {
            return PathBuf::from(home).join(".local/share/parlor");
        }
        PathBuf::from("parlor-data")
    }

    /// The skill folders, relative ones resolved against the config file's folder.
    pub fn skill_dirs(&self) -> Vec<PathBuf> {
        let base = self
            .path
            .as_deref()
            .and_then(Path::parent)
            .map(Path::to_owned)
            .unwrap_or_default();
        self.toolsets
            .skill
            .dirs
            .iter()
            .map(|d| {
                if d.is_absolute() {
                    d.clone()
                } else {
                    base.join(d)
                }
            })
            .collect()
    }

    /// Whether `toolsets.enabled` names `name`.
    pub fn toolset_enabled(&self, name: &str) -> bool {
        self.toolsets.enabled.iter().any(|t| t == name)
    }

    /// Request timeout as a duration.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.llm.request_timeout_secs)
    }
}

/// One secret: `file` (a `*_file` key), `inline` (in the config file), the systemd
/// credential `credential`, the environment variable `env`.
fn resolve(
    file: Option<&Path>,
    file_key: &str,
    inline: Option<&Secret>,
    credential: &str,
    env: &str,
) -> anyhow::Result<Option<Secret>> {
    if let Some(path) = file {
        return secrets::read_file(path, file_key).map(Some);
    }
    if let Some(secret) = inline.filter(|s| !s.expose().is_empty()) {
        return Ok(Some(secret.clone()));
    }
    if let Some((path, secret)) = secrets::credential(credential)? {
        tracing::debug!(credential, path = %path.display(), "secret from a systemd credential");
        return Ok(Some(secret));
    }
    Ok(secrets::from_env(env))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_parses_and_says_the_defaults() {
        let example = Config::parse(include_str!("../config.example.toml")).unwrap();
        let defaults = Config::default();
        assert_eq!(example.toolsets.enabled, defaults.toolsets.enabled);
        assert_eq!(
            example.toolsets.subagent.max_tokens,
            defaults.toolsets.subagent.max_tokens
        );
        assert!(example.toolsets.skill.dirs.is_empty());
    }

    #[test]
    fn the_groups_frame_is_checked_at_load_with_the_key_named() {
        let refused = |text: &str| {
            let error = Config::parse(text)
                .and_then(|config| config.check())
                .unwrap_err();
            format!("{error:#}")
        };
        let said = refused("[groups]\nmodels = [\"smart\"]\n");
        assert!(said.contains("\"smart\" is not one"), "{said}");
        let said = refused("[groups]\nlocked = [\"colour\"]\n");
        assert!(
            said.contains("groups.locked: \"colour\" is not a setting"),
            "{said}"
        );
        let said =
            refused("[groups]\nmember_turns_per_hour = 50\nmax_member_turns_per_hour = 20\n");
        assert!(
            said.contains("is over groups.max_member_turns_per_hour"),
            "{said}"
        );
        let said = refused("[groups]\nreply_mode = \"auto\"\n");
        assert!(said.contains("needs a [groups.auto_chat] budget"), "{said}");
        let said = refused("[groups]\nlanguage = \"fr\"\n");
        assert!(said.contains("groups.language must be en or zh"), "{said}");

        let config = Config::parse(
            "[[llm.models]]\nname = \"smart\"\nmodel = \"gpt-4o\"\n\
             [groups]\nmodels = [\"smart\"]\nlocked = [\"persona\"]\nlanguage = \"zh\"\n\
             [approvals]\ntools = { web_fetch = \"chat_admin\" }\n\
             [[mcp.servers]]\nname = \"gh\"\nurl = \"http://127.0.0.1:1/mcp\"\napproval = \"operator\"\n\
             tool_approval = { create_issue = \"chat_admin\" }\n",
        )
        .unwrap();
        config.check().unwrap();
        let policy = config.group_policy();
        assert_eq!(policy.models, ["smart"]);
        assert_eq!(policy.defaults.language, Some(parlor_bot::lang::Lang::Zh));
        let approvals = config.approvals();
        use parlor_bot::tool::Role;
        assert_eq!(approvals.get("web_fetch"), Some(&Role::ChatAdmin));
        assert_eq!(approvals.get("mcp:gh"), Some(&Role::Operator));
        assert_eq!(approvals.get("gh__create_issue"), Some(&Role::ChatAdmin));
    }

    #[test]
    fn debug_never_prints_a_secret() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("key");
        std::fs::write(&key_file, "sk-from-a-file-31337\n").unwrap();
        let url_file = dir.path().join("database_url");
        std::fs::write(&url_file, "postgresql://parlor:db-secret-555@db/parlor\n").unwrap();
        let mut config = Config::parse(&format!(
            r#"
[llm]
api_key = "sk-inline-4242"
api_key_file = "{}"
[telegram]
token = "123:telegram-secret-777"
[discord]
token = "discord-secret-888"
[onebot]
url = "ws://127.0.0.1:3001"
access_token = "onebot-secret-999"
[store]
backend = "postgres"
url_file = "{}"
"#,
            key_file.display(),
            url_file.display()
        ))
        .unwrap();
        config.resolve_secrets().unwrap();
        assert_eq!(
            config.api_key().map(Secret::expose),
            Some("sk-from-a-file-31337"),
            "the file wins over the inline value"
        );
        assert_eq!(
            config.telegram_token().map(Secret::expose),
            Some("123:telegram-secret-777")
        );
        assert_eq!(
            config.database_url().map(Secret::expose),
            Some("postgresql://parlor:db-secret-555@db/parlor")
        );
        let debug = format!("{config:?}");
        let pretty = format!("{config:#?}");
        for secret in [
            "sk-inline-4242",
            "sk-from-a-file-31337",
            "telegram-secret-777",
            "discord-secret-888",
            "onebot-secret-999",
            "db-secret-555",
        ] {
            assert!(!debug.contains(secret), "{secret} in {debug}");
            assert!(!pretty.contains(secret), "{secret} in {pretty}");
        }
        assert!(debug.contains("[redacted]"), "{debug}");
        assert_eq!(
            config.onebot_token().map(Secret::expose),
            Some("onebot-secret-999")
        );
    }

    #[test]
    fn auto_chat_is_off_by_default_and_checked() {
        assert!(Config::parse("").unwrap().bot.auto_chat.is_empty());
        let config = Config::parse(
            "[[bot.auto_chat]]\nchat = \"telegram:-100123\"\n\
             [[bot.auto_chat]]\nchat = \"qq:group:5/topic:1\"\nbatch_messages = 3\n\
             batch_seconds = 5\nmax_sends_per_batch = 2\nmax_sends_per_hour = 4\ndry_run = true\n",
        )
        .unwrap();
        let first = config.bot.auto_chat[0].to_runtime();
        assert_eq!(
            first,
            parlor_bot::session::AutoChat::new("telegram:-100123")
        );
        let second = config.bot.auto_chat[1].to_runtime();
        assert_eq!((second.batch_messages, second.batch_wait.as_secs()), (3, 5));
        assert_eq!(
            (
                second.max_sends_per_batch,
                second.max_sends_per_hour,
                second.dry_run
            ),
            (2, 4, true)
        );
        for (table, wanted) in [
            ("chat = \"-100123\"", "not a session key"),
            ("chat = \"telegram: -1\"", "not a session key"),
            ("chat = \"matrix:!room\"", "unknown platform"),
            (
                "chat = \"telegram:-1\"\nbatch_messages = 0",
                "batch_messages must be at least 1",
            ),
            (
                "chat = \"telegram:-1\"\nbatch_seconds = 0",
                "batch_seconds must be at least 1",
            ),
            (
                "chat = \"telegram:-1\"\nmax_sends_per_batch = 0",
                "max_sends_per_batch must be",
            ),
            (
                "chat = \"telegram:-1\"\nmax_sends_per_hour = 0",
                "max_sends_per_hour must be",
            ),
            ("chat = \"telegram:-1\"\nbatch_messages = 51", "at most 50"),
            ("chat = \"telegram:-1\"\nbatch = 3", "unknown field"),
        ] {
            let e = Config::parse(&format!("[[bot.auto_chat]]\n{table}\n")).unwrap_err();
            assert!(format!("{e:#}").contains(wanted), "{table}: {e:#}");
        }
        let twice = "[[bot.auto_chat]]\nchat = \"telegram:-1\"\n[[bot.auto_chat]]\nchat = \"telegram:-1\"\n";
        assert!(format!("{:#}", Config::parse(twice).unwrap_err()).contains("listed twice"));
    }

    #[test]
    fn memory_embeddings_need_an_openai_endpoint_and_a_model() {
        let ok = Config::parse("[toolsets.memory]\nembeddings = \"nomic-embed-text\"\n").unwrap();
        assert_eq!(
            ok.toolsets.memory.embeddings.as_deref(),
            Some("nomic-embed-text")
        );
        for (text, wanted) in [
            (
                "[llm]\nprovider = \"anthropic\"\n[toolsets.memory]\nembeddings = \"e\"\n",
                "Anthropic's API has not",
            ),
            (
                "[toolsets.memory]\nembeddings = \" \"\n",
                "embeddings is empty",
            ),
            (
                "[toolsets.memory]\nembeddings = \"e\"\nembeddings_base_url = \"not a url\"\n",
                "is not a URL",
            ),
        ] {
            let e = Config::parse(text).unwrap_err();
            assert!(format!("{e:#}").contains(wanted), "{text}: {e:#}");
        }
        let own = "[llm]\nprovider = \"anthropic\"\n[toolsets.memory]\nembeddings = \"e\"\n\
                   embeddings_base_url = \"http://127.0.0.1:11434/v1\"\n";
        assert!(Config::parse(own).is_ok());
    }

    #[test]
    fn onebot_takes_one_transport_with_a_valid_address() {
        let forward = Config::parse("[onebot]\nurl = \"ws://127.0.0.1:3001\"\n").unwrap();
        assert!(forward.onebot.enabled());
        assert_eq!(forward.onebot.min_send_interval_ms, 1000);
        let reverse = Config::parse("[onebot]\nlisten = \"127.0.0.1:6700\"\n").unwrap();
        assert_eq!(
            reverse.onebot.listen_addr().unwrap(),
            Some("127.0.0.1:6700".parse().unwrap())
        );
        assert!(!Config::default().onebot.enabled());
        for (bad, says) in [
            ("url = \"ws://a:1\"\nlisten = \"127.0.0.1:1\"", "not both"),
            ("url = \"http://a:1\"", "ws://"),
            ("listen = \"localhost\"", "onebot.listen"),
            (
                "url = \"ws://a:1\"\nmax_message_chars = 0",
                "onebot.max_message_chars",
            ),
        ] {
            let error = Config::parse(&format!("[onebot]\n{bad}\n")).unwrap_err();
            assert!(format!("{error:#}").contains(says), "{bad}: {error:#}");
        }
    }

    const WEBHOOK: &str = "https://bot.example.com/telegram/3f9c2a7d0b6e41c8a5d2";

    #[test]
    fn telegram_polls_unless_a_webhook_url_is_set_and_served() {
        let polling = Config::parse("").unwrap();
        assert_eq!(polling.telegram.webhook_url, None);
        assert_eq!(polling.telegram_webhook().map(|w| w.url), None);
        let listen = "[http]\nlisten = \"127.0.0.1:9464\"\n";
        Config::parse(&format!(
            "[telegram]\nwebhook_url = \"{WEBHOOK}\"\n{listen}"
        ))
        .unwrap();
        Config::parse(&format!(
            "[telegram]\nwebhook_url = \"http://127.0.0.1:8443/3f9c2a7d0b6e41c8a5d2\"\n{listen}"
        ))
        .unwrap();
        for (url, http, says) in [
            (WEBHOOK, "", "needs [http] listen"),
            (
                "http://bot.example.com/telegram/3f9c2a7d0b6e41c8a5d2",
                listen,
                "https://",
            ),
            ("https://bot.example.com/telegram", listen, "path secret"),
            ("bot.example.com/x", listen, "is not a URL"),
            (
                "https://bot.example.com/3f9c2a7d0b6e41c8a5d2?x=1",
                listen,
                "query",
            ),
        ] {
            let error =
                Config::parse(&format!("[telegram]\nwebhook_url = \"{url}\"\n{http}")).unwrap_err();
            let said = format!("{error:#}");
            assert!(said.contains(says), "{url}: {said}");
            assert!(said.contains("telegram.webhook_url"), "{said}");
        }
    }

    #[test]
    fn a_webhook_needs_a_secret_token_of_telegrams_alphabet() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        let config = |extra: &str| {
            Config::parse(&format!(
                "[telegram]\nwebhook_url = \"{WEBHOOK}\"\n{extra}\n[http]\nlisten = \"127.0.0.1:9464\"\n"
            ))
            .unwrap()
        };
        let with_file = format!("webhook_secret_file = \"{}\"", file.display());

        std::fs::write(&file, "s3cret_TOKEN-1\n").unwrap();
        let mut good = config(&with_file);
        good.resolve_secrets().unwrap();
        let webhook = good.telegram_webhook().unwrap();
        assert_eq!(webhook.url, WEBHOOK);
        assert_eq!(
            good.secrets
                .telegram_webhook_secret
                .as_ref()
                .map(Secret::expose),
            Some("s3cret_TOKEN-1")
        );
        assert!(good.secret_paths().contains(&file));
        assert!(
            good.secret_env_names()
                .contains(&"TELEGRAM_WEBHOOK_SECRET".to_owned())
        );

        for bad in ["has space", "semi;colon", &"a".repeat(257)] {
            std::fs::write(&file, bad).unwrap();
            let error = config(&with_file).resolve_secrets().unwrap_err();
            assert!(
                format!("{error:#}").contains("1-256 characters"),
                "{bad}: {error:#}"
            );
        }

        let mut missing =
            config("webhook_secret_env = \"PARLOR_TEST_WEBHOOK_SECRET_THAT_IS_NEVER_SET\"");
        let error = missing.resolve_secrets().unwrap_err();
        let said = format!("{error:#}");
        assert!(said.contains("needs a secret token"), "{said}");
        assert!(
            said.contains("PARLOR_TEST_WEBHOOK_SECRET_THAT_IS_NEVER_SET"),
            "{said}"
        );
    }

    #[test]
    fn an_enabled_terminal_must_name_its_sandbox() {
        let e = Config::parse("[terminal]\nenabled = true\n").unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains(r#"sandbox = "bwrap""#) && e.contains(r#"sandbox = "none""#),
            "{e}"
        );
        for sandbox in ["none", "bwrap"] {
            let config = Config::parse(&format!(
                "[terminal]\nenabled = true\nsandbox = \"{sandbox}\"\n"
            ))
            .unwrap();
            assert!(config.terminal.sandbox.is_some());
        }
        // A terminal that is off needs no choice.
        Config::parse("[terminal]\nenabled = false\n").unwrap();
        assert!(Config::parse("[terminal]\nsandbox = \"chroot\"\n").is_err());
    }

    #[test]
    fn the_config_directory_and_secret_files_are_named_for_the_sandbox() {
        let mut config = Config::parse(
            "[telegram]\ntoken_file = \"/run/credentials/parlor.service/telegram_token\"\n",
        )
        .unwrap();
        config.path = Some("/etc/parlor/config.toml".into());
        let paths = config.secret_paths();
        for want in [
            "/etc/parlor/config.toml",
            "/etc/parlor",
            "/run/credentials/parlor.service/telegram_token",
        ] {
            assert!(paths.contains(&PathBuf::from(want)), "{want}: {paths:?}");
        }
        // A config directly in /etc: the file, never all of /etc.
        config.path = Some("/etc/parlor.toml".into());
        assert!(!config.secret_paths().contains(&PathBuf::from("/etc")));
    }

    #[test]
    fn secret_variables_include_the_configured_one_and_the_usual_ones() {
        let config = Config::parse("[llm]\napi_key_env = \"MY_LLM_KEY\"\n").unwrap();
        assert_eq!(
            config.secret_env_names(),
            [
                "MY_LLM_KEY",
                "OPENAI_API_KEY",
                "TELEGRAM_BOT_TOKEN",
                "TELEGRAM_WEBHOOK_SECRET",
                "DISCORD_BOT_TOKEN",
                "BRAVE_API_KEY",
                "ONEBOT_ACCESS_TOKEN",
                "PARLOR_DATABASE_URL"
            ]
        );
        let config =
            Config::parse("[store]\nbackend = \"postgres\"\nurl_env = \"MY_DB\"\n").unwrap();
        assert!(config.secret_env_names().contains(&"MY_DB".to_owned()));
    }

    #[test]
    fn a_vision_model_on_another_endpoint_gets_only_its_own_key() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("eyes_key");
        std::fs::write(&key_file, "sk-eyes-file\n").unwrap();
        let mut config = Config::parse(&format!(
            r#"
[llm]
base_url = "https://llm.example/v1"
api_key = "sk-main"
[[llm.vision_models]]
model = "main-endpoint"
[[llm.vision_models]]
model = "main-endpoint-spelled-out"
base_url = "https://llm.example/v1/"
[[llm.vision_models]]
model = "elsewhere"
base_url = "https://eyes.example/v1"
[[llm.vision_models]]
model = "elsewhere-with-its-key"
base_url = "https://eyes.example/v1"
api_key_file = "{}"
"#,
            key_file.display()
        ))
        .unwrap();
        config.resolve_secrets().unwrap();
        let keys: Vec<Option<&str>> = (0..4)
            .map(|i| config.vision_api_key(i).map(Secret::expose))
            .collect();
        assert_eq!(
            keys,
            [Some("sk-main"), Some("sk-main"), None, Some("sk-eyes-file")]
        );
        assert!(config.secret_paths().contains(&key_file));
    }

    #[test]
    fn a_cluster_needs_postgres_and_sane_timing() {
        let parse = |extra: &str| Config::parse(&format!("[llm]\nmodel = \"m\"\n{extra}"));
        let sled = parse("[cluster]\nenabled = true\n")
            .unwrap_err()
            .to_string();
        assert!(sled.contains("store.backend = \"postgres\""), "{sled}");
        let pg = "[store]\nbackend = \"postgres\"\n[cluster]\nenabled = true\n";
        let config = parse(pg).unwrap();
        assert_eq!(
            (
                config.cluster.lease_ttl_secs,
                config.cluster.sweep_interval_ms
            ),
            (10, 1000)
        );
        for (bad, key) in [
            ("lease_ttl_secs = 1", "cluster.lease_ttl_secs"),
            ("sweep_interval_ms = 10", "cluster.sweep_interval_ms"),
            ("instance = \"a b\"", "cluster.instance"),
        ] {
            let e = parse(&format!("{pg}{bad}\n")).unwrap_err().to_string();
            assert!(e.contains(key), "{bad}: {e}");
        }
        // Off, nothing is checked: the defaults of a single daemon.
        parse("[cluster]\nlease_ttl_secs = 1\n").unwrap();
    }

    #[test]
    fn a_fallback_gets_its_own_key_or_the_main_one_on_the_main_endpoint() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("backup_key");
        std::fs::write(&key_file, "sk-backup-file\n").unwrap();
        let mut config = Config::parse(&format!(
            r#"
[llm]
base_url = "https://llm.example/v1"
api_key = "sk-main"
[[llm.fallbacks]]
model = "smaller-model"
[[llm.fallbacks]]
model = "elsewhere"
base_url = "https://backup.example/v1"
[[llm.fallbacks]]
model = "elsewhere-with-its-key"
base_url = "https://backup.example/v1"
api_key_file = "{}"
"#,
            key_file.display()
        ))
        .unwrap();
        config.resolve_secrets().unwrap();
        let keys: Vec<Option<&str>> = (0..3)
            .map(|i| config.fallback_api_key(i).map(Secret::expose))
            .collect();
        assert_eq!(keys, [Some("sk-main"), None, Some("sk-backup-file")]);
        assert!(config.secret_paths().contains(&key_file));
        let error = Config::parse("[[llm.fallbacks]]\nmodel = \" \"\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("llm.fallbacks[0]: model must be set"),
            "{error}"
        );
    }

    #[test]
    fn the_web_section_is_checked() {
        let config = Config::parse(
            "[toolsets.web]\nprovider = \"searxng\"\nsearxng_url = \"http://10.0.0.2:8888\"\nallow_networks = [\"10.1.2.0/24\", \"127.0.0.2\"]\n",
        )
        .unwrap();
        assert_eq!(config.url_guard().unwrap().allow_networks().len(), 2);
        let config = Config::parse(
            "[toolsets.web]\ndeny_hosts = [\"127.1\", \"[::1]\", \"10.9.0.0/16\", \"Wiki.Example.\"]\n",
        )
        .unwrap();
        let denied: Vec<String> = config
            .url_guard()
            .unwrap()
            .deny_hosts()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(denied, ["127.0.0.1", "::1", "10.9.0.0/16", "wiki.example"]);
        for (text, key) in [
            ("[toolsets.web]\nprovider = \"searxng\"\n", "searxng_url"),
            (
                "[toolsets.web]\nallow_networks = [\"10.0.0.0/40\"]\n",
                "allow_networks",
            ),
            (
                "[toolsets.web]\ndeny_hosts = [\"10.0.0.0/40\"]\n",
                "deny_hosts",
            ),
            (
                "[toolsets.web]\ndeny_hosts = [\"http://intranet.example\"]\n",
                "deny_hosts",
            ),
            (
                "[toolsets.web]\ndeny_hosts = [\"*.example\"]\n",
                "deny_hosts",
            ),
            ("[toolsets.web]\nbrave_url = \"ftp://x\"\n", "brave_url"),
            ("[toolsets.web]\npage_chars = 9000\n", "page_chars"),
            ("[toolsets.web]\nprovider = \"bing\"\n", "provider"),
        ] {
            let e = format!("{:#}", Config::parse(text).unwrap_err());
            assert!(e.contains(key), "{text}: {e}");
        }
    }
}

/// `[groups]`: the frame of a group's own settings (docs/governance.md). The operator's
/// defaults hold until a chat admin changes a key with `/set`; `locked` keys cannot be
/// changed; the caps bound what a group may set.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GroupsSection {
    /// Names of `[[llm.models]]` a group may choose; empty: none (the main model only).
    pub models: Vec<String>,
    /// The model a group starts with (a name of `models`); unset: the main model.
    pub default_model: Option<String>,
    /// Toolsets a group may switch on and off; empty: every enabled toolset.
    pub toolsets: Vec<String>,
    /// `mention`, `all` or `auto` (auto-chat with the `[groups.auto_chat]` budget).
    pub reply_mode: String,
    /// `en` or `zh`: the language of parlor's own notices.
    pub language: String,
    /// The persona a group starts with (empty: none).
    pub persona: String,
    /// Longest persona a group may set, in characters.
    pub max_persona_chars: usize,
    /// Turns one member may start per hour in a group, by default (unset: no limit).
    pub member_turns_per_hour: Option<u32>,
    /// The highest `member_turns_per_hour` a group may set (unset: any).
    pub max_member_turns_per_hour: Option<u32>,
    /// Tokens one member may use per day in a group, by default (unset: no limit).
    pub member_daily_tokens: Option<u64>,
    /// The highest `member_daily_tokens` a group may set (unset: any).
    pub max_member_daily_tokens: Option<u64>,
    /// Keys no group may change: `model`, `persona`, `toolsets`, `reply_mode`, `language`,
    /// `member_turns_per_hour`, `member_daily_tokens`.
    pub locked: Vec<String>,
    /// The budget of a group that chooses `reply_mode = auto`; unset: groups may not.
    pub auto_chat: Option<GroupAutoChat>,
}

impl Default for GroupsSection {
    fn default() -> Self {
        GroupsSection {
            models: Vec::new(),
            default_model: None,
            toolsets: Vec::new(),
            reply_mode: "mention".to_owned(),
            language: "en".to_owned(),
            persona: String::new(),
            max_persona_chars: 1000,
            member_turns_per_hour: None,
            max_member_turns_per_hour: None,
            member_daily_tokens: None,
            max_member_daily_tokens: None,
            locked: Vec::new(),
            auto_chat: None,
        }
    }
}

/// `[groups.auto_chat]`: the auto-chat budget of a group that chooses it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupAutoChat {
    /// As in `[[bot.auto_chat]]`.
    #[serde(default = "AutoChatConfig::default_batch_messages")]
    pub batch_messages: usize,
    #[allow(missing_docs)]
    #[serde(default = "AutoChatConfig::default_batch_seconds")]
    pub batch_seconds: u64,
    #[allow(missing_docs)]
    #[serde(default = "AutoChatConfig::default_max_sends_per_batch")]
    pub max_sends_per_batch: u32,
    #[allow(missing_docs)]
    #[serde(default = "AutoChatConfig::default_max_sends_per_hour")]
    pub max_sends_per_hour: u32,
}

/// `[approvals]`: tools that wait for a person's yes before they run.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApprovalsSection {
    /// Tool or toolset name → who must say yes: `"chat_admin"` or `"operator"`.
    pub tools: std::collections::BTreeMap<String, ApprovalRole>,
    /// How long a call waits; no decision by then is a no.
    pub timeout_secs: u64,
}

impl Default for ApprovalsSection {
    fn default() -> Self {
        ApprovalsSection {
            tools: std::collections::BTreeMap::new(),
            timeout_secs: 600,
        }
    }
}

/// Who may approve a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalRole {
    /// An admin of the chat (or an operator).
    ChatAdmin,
    /// An operator (`bot.admins`).
    Operator,
}

impl ApprovalRole {
    /// The role the registry checks.
    pub fn role(self) -> parlor_bot::tool::Role {
        match self {
            ApprovalRole::ChatAdmin => parlor_bot::tool::Role::ChatAdmin,
            ApprovalRole::Operator => parlor_bot::tool::Role::Operator,
        }
    }
}

impl Config {
    /// Who must approve which tool (by tool or toolset name): `[approvals] tools` and each
    /// MCP server's `approval` / `tool_approval`.
    pub fn approvals(&self) -> std::collections::HashMap<String, parlor_bot::tool::Role> {
        let mut map: std::collections::HashMap<String, parlor_bot::tool::Role> = self
            .approvals
            .tools
            .iter()
            .map(|(name, role)| (name.clone(), role.role()))
            .collect();
        for server in &self.mcp.servers {
            if let Some(role) = server.approval {
                map.insert(format!("mcp:{}", server.name), role.role());
            }
            for (tool, role) in &server.tool_approval {
                map.insert(format!("{}__{tool}", server.name), role.role());
            }
        }
        map
    }

    /// The names groups choose `[[llm.models]]` by, in order.
    pub fn group_model_names(&self) -> Vec<String> {
        self.llm
            .models
            .iter()
            .map(|m| {
                m.name
                    .clone()
                    .unwrap_or_else(|| m.model.clone())
                    .trim()
                    .to_owned()
            })
            .collect()
    }

    fn check_groups(&self) -> anyhow::Result<()> {
        let g = &self.groups;
        let names = self.group_model_names();
        for (i, name) in names.iter().enumerate() {
            if name.is_empty() || name.contains(char::is_whitespace) || name.len() > 40 {
                bail!(
                    "llm.models[{i}]: name must be one word of at most 40 characters, got {name:?}"
                );
            }
            if names[..i].contains(name) {
                bail!("llm.models: the name {name:?} is used twice");
            }
        }
        for model in g.models.iter().chain(g.default_model.iter()) {
            if !names.contains(model) {
                bail!(
                    "groups.models and groups.default_model name models of [[llm.models]]; {model:?} is not one (they are: {})",
                    if names.is_empty() {
                        "none".to_owned()
                    } else {
                        names.join(", ")
                    }
                );
            }
        }
        if parlor_bot::session::settings::ReplyMode::parse_config(&g.reply_mode).is_none() {
            bail!(
                "groups.reply_mode must be mention, all or auto, got {:?}",
                g.reply_mode
            );
        }
        if g.reply_mode == "auto" && g.auto_chat.is_none() {
            bail!("groups.reply_mode = \"auto\" needs a [groups.auto_chat] budget");
        }
        if parlor_bot::lang::Lang::parse(&g.language).is_none() {
            bail!("groups.language must be en or zh, got {:?}", g.language);
        }
        for key in &g.locked {
            if parlor_bot::session::settings::Key::parse(key).is_none() {
                bail!(
                    "groups.locked: {key:?} is not a setting (model, persona, toolsets, reply_mode, language, member_turns_per_hour, member_daily_tokens)"
                );
            }
        }
        if let (Some(v), Some(cap)) = (g.member_turns_per_hour, g.max_member_turns_per_hour)
            && v > cap
        {
            bail!(
                "groups.member_turns_per_hour ({v}) is over groups.max_member_turns_per_hour ({cap})"
            );
        }
        if let (Some(v), Some(cap)) = (g.member_daily_tokens, g.max_member_daily_tokens)
            && v > cap
        {
            bail!(
                "groups.member_daily_tokens ({v}) is over groups.max_member_daily_tokens ({cap})"
            );
        }
        if g.member_turns_per_hour == Some(0) || g.max_member_turns_per_hour == Some(0) {
            bail!(
                "groups.member_turns_per_hour and its cap must be 1 or more (leave them unset for no limit)"
            );
        }
        if self.approvals.timeout_secs == 0 {
            bail!("approvals.timeout_secs must be 1 or more");
        }
        Ok(())
    }

    /// The session layer's frame of the groups' settings.
    pub fn group_policy(&self) -> parlor_bot::session::GroupPolicy {
        use parlor_bot::session::settings::{GroupSettings, Key, ReplyMode};
        let g = &self.groups;
        parlor_bot::session::GroupPolicy {
            defaults: GroupSettings {
                v: 1,
                model: g.default_model.clone(),
                persona: Some(g.persona.trim().to_owned()).filter(|p| !p.is_empty()),
                toolsets: None,
                reply_mode: ReplyMode::parse_config(&g.reply_mode)
                    .filter(|m| *m != ReplyMode::Mention),
                language: parlor_bot::lang::Lang::parse(&g.language),
                member_turns_per_hour: g.member_turns_per_hour,
                member_daily_tokens: g.member_daily_tokens,
            },
            models: g.models.clone(),
            toolsets: g.toolsets.clone(),
            max_member_turns_per_hour: g.max_member_turns_per_hour,
            max_member_daily_tokens: g.max_member_daily_tokens,
            max_persona_chars: g.max_persona_chars,
            locked: g.locked.iter().filter_map(|k| Key::parse(k)).collect(),
            auto_chat: g.auto_chat.as_ref().map(|a| parlor_bot::session::AutoChat {
                chat: String::new(),
                batch_messages: a.batch_messages,
                batch_wait: Duration::from_secs(a.batch_seconds),
                max_sends_per_batch: a.max_sends_per_batch,
                max_sends_per_hour: a.max_sends_per_hour,
                dry_run: false,
            }),
        }
    }
}
