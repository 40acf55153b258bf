//! The tool contract: how a toolset describes its tools to the model, how a call reaches it,
//! and what comes back.
//!
//! - [`ToolSet`]: the trait every toolset implements (schemas, invoke, the static prompt, the
//!   per-turn injection, `fork` for per-session state, `reset`).
//! - [`schema`]: JSON Schema from Rust argument types, post-processed to the self-contained
//!   shape providers accept (no `$ref`, no `$defs`).
//! - [`validate`]: argument validation against that schema, with errors the model can act on.
//! - [`bridge`]: [`ToolSetBridge`], typed async functions as tools, with state and the hooks
//!   of the rest of this contract: how the built-in toolsets implement [`ToolSet`].
//! - [`registry`]: [`ToolRegistry`], every toolset of a session, name checks at startup, and
//!   the policy gate every call passes (exists, caller holds the tool's [`Role`], arguments
//!   fit, caller holds that role in a chat the arguments name).
//! - [`catalog`]: the tool catalog as Markdown and as the exact `tools` JSON.
//! - [`result`]: [`ToolResult`], the stable result JSON, and the shared error codes.

pub mod approval;
pub mod bridge;
pub mod catalog;
pub mod registry;
pub mod result;
pub mod schema;
pub mod validate;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::llm::{Message, Spend, ToolDef, Usage};
use crate::platform::{ChatRef, Platform};

pub use bridge::{Bridged, ToolError, ToolSetBridge, ToolSetBridgeBuilder};
pub use registry::{RegistryError, ToolRegistry};
pub use result::{ToolResult, codes};

/// How much harm a tool can do: documentation for the catalog and the operator. Who may call
/// a tool is its [`ToolSpec::role`]; the one link between the two is checked when a
/// registry is built: a `Dangerous` tool must need [`Role::Operator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Risk {
    /// Only reads state.
    Read,
    /// Changes state the bot keeps (a plan, a memory, a clock task, a message).
    Write,
    /// Reaches the host the bot runs on (runs commands, touches its files or network).
    Dangerous,
}

impl Risk {
    /// The lowercase name used in the catalog.
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Read => "read",
            Risk::Write => "write",
            Risk::Dangerous => "dangerous",
        }
    }
}

/// Everything about one tool that the model and the catalog see.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Wire name, `^[a-zA-Z0-9_-]{1,64}$`, unique across a registry.
    pub name: String,
    /// What the tool does and really allows, for the model.
    pub description: String,
    /// Self-contained JSON Schema object of the arguments.
    pub parameters: serde_json::Value,
    /// One line describing the `data` of a successful result, for the catalog.
    pub result: String,
    /// How much harm a call can do.
    pub risk: Risk,
    /// The least role a caller needs in this chat; [`ToolRegistry::call`] refuses anyone
    /// below it with `PERMISSION_DENIED`.
    pub role: Role,
    /// The argument that may name another chat the call acts on (a session key such as
    /// `telegram:-100123`): when it does, the caller must hold [`ToolSpec::role`] in that
    /// chat too ([`ToolContext::require_role_in`]). Absent, empty or naming this chat, only
    /// the caller's role here counts.
    pub role_in_chat_arg: Option<String>,
    /// Error codes this tool may return besides the shared ones.
    pub failure_codes: Vec<String>,
    /// Which turns offer the tool: the registry leaves it out of the others' `tools` and
    /// refuses it there like an unknown tool.
    pub offer: Offer,
}

/// Which turns offer a tool. An auto-chat turn (auto-chat: the bot reading unaddressed messages in a group,
/// answering nobody) may speak only through `send_message`, within its limits; a tool that
/// posts by itself would be a way around them, and `send_message` has no business in a
/// turn whose answer is posted anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Offer {
    /// Every turn (most tools).
    #[default]
    Always,
    /// Only turns that answer someone (tools that post: `send_markdown`).
    Addressed,
    /// Only auto-chat turns (`send_message`).
    AutoChat,
}

impl Offer {
    /// Whether an auto-chat turn (or not) offers the tool.
    pub fn includes(self, auto_chat: bool) -> bool {
        match self {
            Offer::Always => true,
            Offer::Addressed => !auto_chat,
            Offer::AutoChat => auto_chat,
        }
    }
}

/// How an auto-chat turn speaks ([`ToolContext::auto_chat`]): implemented by the session layer,
/// which owns the limits per batch and per hour, the dry run and the outbox, so the tool
/// that calls it knows none of them.
#[async_trait]
pub trait AutoChatSpeech: Send + Sync {
    /// Posts `text` in the turn's chat (through its outbox), or says why not: a limit is
    /// `RATE_LIMITED`, a store failure `UNAVAILABLE`.
    async fn say(&self, text: &str) -> Result<Said, bridge::ToolError>;
}

/// How a tool posts into its turn's chat ([`ToolContext::post`]): implemented by the
/// session layer, which writes the text as an outbox row (durable, sent in order with the
/// chat's other replies, retried, recorded as the bot's own message) and waits a while for
/// the platform to take it.
#[async_trait]
pub trait Post: Send + Sync {
    /// Posts `text`, threaded to `reply_to`: [`Posted::Sent`] once the platform took it,
    /// [`Posted::Queued`] when it has not yet (it is sent later, also after a restart). A
    /// platform's refusal for good is `UNAVAILABLE`; a store failure too.
    async fn post(&self, text: &str, reply_to: Option<&str>) -> Result<Posted, bridge::ToolError>;
}

/// What [`Post::post`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Posted {
    /// The platform took it: its message ids (a long text may be several messages).
    Sent(Vec<String>),
    /// In the outbox, not taken yet: the chat's lane sends it as soon as it can.
    Queued,
}

/// What [`AutoChatSpeech::say`] did, for the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Said {
    /// Nothing was posted: the chat is in dry run and the text went to the log.
    pub dry_run: bool,
    /// Messages this batch may still send.
    pub left_in_batch: u32,
    /// Messages this chat may still send within the hour.
    pub left_this_hour: u32,
}

/// How the tools are described to the model (`llm.tool_profile`). The contract is the
/// same in both: names, arguments, validation, roles and results.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolProfile {
    /// Every description in full.
    #[default]
    Full,
    /// For small models with small windows: each tool's description cut to its first
    /// sentence, the arguments without theirs.
    Compact,
}

/// The longest description a compact tool keeps.
const COMPACT_DESCRIPTION_CHARS: usize = 160;

impl ToolSpec {
    /// The OpenAI `tools` entry for this tool.
    pub fn to_def(&self) -> ToolDef {
        ToolDef::function(&self.name, &self.description, self.parameters.clone())
    }

    /// The `tools` entry for this tool as `profile` describes it.
    pub fn to_def_as(&self, profile: ToolProfile) -> ToolDef {
        match profile {
            ToolProfile::Full => self.to_def(),
            ToolProfile::Compact => {
                let mut parameters = self.parameters.clone();
                strip_descriptions(&mut parameters);
                ToolDef::function(&self.name, first_sentence(&self.description), parameters)
            }
        }
    }
}

/// `text` up to the end of its first sentence (or line), at most
/// [`COMPACT_DESCRIPTION_CHARS`] characters.
fn first_sentence(text: &str) -> String {
    let text = text.trim();
    let end = text
        .char_indices()
        .find(|&(i, c)| c == '\n' || (c == '.' && text[i + 1..].starts_with(char::is_whitespace)))
        .map_or(text.len(), |(i, c)| if c == '.' { i + 1 } else { i });
    crate::text::ellipsize(&text[..end], COMPACT_DESCRIPTION_CHARS).into_owned()
}

/// Removes the `description` keyword from a JSON Schema and the schemas inside it, never a
/// property that happens to be named `description`.
fn strip_descriptions(schema: &mut serde_json::Value) {
    let serde_json::Value::Object(map) = schema else {
        return;
    };
    map.remove("description");
    for (key, value) in map.iter_mut() {
        match (key.as_str(), value) {
            ("properties" | "$defs" | "definitions", serde_json::Value::Object(properties)) => {
                properties.values_mut().for_each(strip_descriptions);
            }
            ("items" | "additionalProperties" | "not", value @ serde_json::Value::Object(_)) => {
                strip_descriptions(value);
            }
            ("anyOf" | "oneOf" | "allOf" | "prefixItems", serde_json::Value::Array(schemas)) => {
                schemas.iter_mut().for_each(strip_descriptions);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod profile_tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_compact_description_is_the_first_sentence_and_arguments_lose_theirs() {
        assert_eq!(
            first_sentence("Schedules a task. It runs later, e.g. at 9.30 daily.\nMore."),
            "Schedules a task."
        );
        assert_eq!(
            first_sentence("Reads v1.2 notes\nthen more"),
            "Reads v1.2 notes"
        );
        let mut schema = json!({
            "type": "object",
            "description": "top",
            "properties": {
                "description": {"type": "string", "description": "what the task does"},
                "when": {"anyOf": [{"type": "string", "description": "cron"}]},
                "tags": {"type": "array", "items": {"type": "string", "description": "tag"}}
            },
            "required": ["description"]
        });
        strip_descriptions(&mut schema);
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {
                    "description": {"type": "string"},
                    "when": {"anyOf": [{"type": "string"}]},
                    "tags": {"type": "array", "items": {"type": "string"}}
                },
                "required": ["description"]
            })
        );
    }
}

/// A tool call on its way to a toolset: the id and name the model gave, and the parsed
/// (and already validated) arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInvocation {
    /// The model's id for this call.
    pub id: String,
    /// The tool's wire name.
    pub name: String,
    /// Arguments, validated against the tool's schema.
    pub arguments: serde_json::Value,
}

/// The caller's standing, as data: a tool's spec names the least role it needs and
/// [`ToolRegistry::call`] compares. Ordered: `Member < ChatAdmin < Operator`.
///
/// Anyone can create a group, add the bot and be that group's admin, so a chat admin is
/// never an operator: only the config's `bot.admins` are.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A member of the chat.
    #[default]
    Member,
    /// An administrator of this chat by the platform's word; rights in this chat only.
    /// (`admin` is how records written before roles were split name it.)
    #[serde(alias = "admin")]
    ChatAdmin,
    /// One of the config's `bot.admins`: runs the daemon and may reach the host.
    Operator,
}

impl Role {
    /// The snake_case name used in the catalog, `/help` and the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Member => "member",
            Role::ChatAdmin => "chat_admin",
            Role::Operator => "operator",
        }
    }

    /// Who holds this role (or more), in words for people and the model:
    /// `"a member of the chat"`, `"an admin of the chat"`, `"an operator of the bot"`.
    pub fn who(self) -> &'static str {
        match self {
            Role::Member => "a member of the chat",
            Role::ChatAdmin => "an admin of the chat",
            Role::Operator => "an operator of the bot",
        }
    }
}

/// Why a role could not be resolved.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RoleError {
    /// The platform could not say (unreachable, timed out); try again later.
    #[error("the platform could not tell who administers {chat}: {reason}")]
    Unavailable {
        /// The chat asked about.
        chat: String,
        /// What went wrong.
        reason: String,
    },
}

/// Resolves a user's role in any chat: operators from the config, chat admins from the
/// platform (cached, with a timeout). The session layer implements it; the registry asks it
/// when a tool acts on another chat than the caller's.
#[async_trait]
pub trait RoleResolver: Send + Sync {
    /// The role of `user_id` (platform-qualified) in `chat`.
    async fn role_in(&self, user_id: &str, chat: &ChatRef) -> Result<Role, RoleError>;
}

/// Who is talking to the agent in this turn.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Caller {
    /// Platform-qualified user id (`telegram:12345`, `console:alice`); empty for the system
    /// itself (clock tasks, background results).
    pub user_id: String,
    /// Display name.
    pub name: String,
    /// Their role in this session's chat.
    pub role: Role,
    /// What this turn may do beyond `role`: an unattended turn (a background task's
    /// notice) holds the least role plus a grant of exactly the calls it needs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<Grant>,
}

impl Caller {
    /// Whether this is the system rather than a person (no user id): a clock fire, a
    /// background result, unaddressed chatter. Its role is never looked up on the platform,
    /// and it is offered only the tools its role and grants allow.
    pub fn is_system(&self) -> bool {
        self.user_id.is_empty()
    }

    /// Whether a grant lets this caller call `tool` with `arguments` (validated JSON).
    pub fn granted(&self, tool: &str, arguments: &serde_json::Value) -> bool {
        self.grants.iter().any(|g| g.allows(tool, arguments))
    }
}

/// A right beyond a caller's role: calling one tool with one argument set to one value
/// (`task_output` with `task_id` = `task-3`). The registry honours it for tools that are
/// not [`Risk::Dangerous`] only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The tool's wire name.
    pub tool: String,
    /// The argument that must hold `value`.
    pub argument: String,
    /// Its value.
    pub value: String,
}

impl Grant {
    /// A grant of `tool` with `argument` = `value`.
    pub fn new(tool: &str, argument: &str, value: &str) -> Self {
        Grant {
            tool: tool.to_owned(),
            argument: argument.to_owned(),
            value: value.to_owned(),
        }
    }

    /// Whether this grant covers `tool` called with `arguments`.
    pub fn allows(&self, tool: &str, arguments: &serde_json::Value) -> bool {
        self.tool == tool
            && arguments.get(&self.argument).and_then(|v| v.as_str()) == Some(self.value.as_str())
    }
}

/// What a tool adds to the turn beyond its result: messages after the tool results of its
/// batch (an image loaded for a vision model, say), and tokens it spent on a model of its
/// own (a sub-agent it waited for), which count toward the turn like the turn's own. Shared
/// by the calls of one batch; the agent drains it.
#[derive(Debug, Clone, Default)]
pub struct MessageAppender {
    inner: Arc<Mutex<Vec<Message>>>,
    spend: Arc<Mutex<Spend>>,
}

impl MessageAppender {
    /// Counts tokens the tool spent (one request answered by `model`) toward the turn.
    pub fn spent(&self, model: &str, usage: &Usage) {
        // A poisoned lock only means a tool panicked mid-add; the sums are still sound.
        self.spend
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(model, usage);
    }

    /// Takes the tokens counted so far.
    pub fn drain_spend(&self) -> Spend {
        std::mem::take(&mut *self.spend.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Queues a message to be appended after this batch's tool results.
    pub fn push(&self, message: Message) {
        self.lock().push(message);
    }

    /// Takes every queued message, in the order they were pushed.
    pub fn drain(&self) -> Vec<Message> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Message>> {
        // A poisoned lock only means a tool panicked mid-push; the Vec is still sound.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a tool knows about the call beyond its arguments.
#[derive(Clone, Default)]
pub struct ToolContext {
    /// The session this call belongs to (`telegram:-100123`, `console:local`).
    pub session: String,
    /// Who is talking to the agent.
    pub caller: Caller,
    /// Cancelled by `/stop`, shutdown, a reset, or this call's timeout.
    pub cancel: CancellationToken,
    /// Where a tool puts messages it adds to the conversation.
    pub appender: MessageAppender,
    /// The chat of this session; `None` outside a chat (`parlor ask`).
    pub chat: Option<ChatRef>,
    /// The platform of that chat, for tools that post or fetch; `None` outside a chat.
    pub platform: Option<Arc<dyn Platform>>,
    /// Resolves the caller's role in other chats (a clock task firing elsewhere); `None`
    /// outside the daemon, where only the caller's own role is known.
    pub roles: Option<Arc<dyn RoleResolver>>,
    /// Set only in an auto-chat turn: how `send_message` speaks. Its presence makes
    /// it an auto-chat turn for the registry (see [`Offer`]).
    pub auto_chat: Option<Arc<dyn AutoChatSpeech>>,
    /// How a tool posts into [`ToolContext::chat`] through the outbox; `None` outside a
    /// session (a toolset's own tests), where a tool posts through `platform` directly.
    pub post: Option<Arc<dyn Post>>,
    /// The toolsets the chat's settings offer; `None`: every one.
    pub toolsets: Option<Arc<[String]>>,
    /// Who is asked when a tool needs approval; `None`: such a tool cannot run here.
    pub approver: Option<Arc<dyn approval::Approver>>,
    /// The platform id of the member's message the turn answers; `None` in a turn nobody
    /// asked for (a clock fire, a task's result, auto-chat).
    pub answering: Option<String>,
}

impl ToolContext {
    /// Whether the caller holds `role` in `chat`: the one place a toolset asks about roles
    /// (the registry uses it for [`ToolSpec::role_in_chat_arg`]; a toolset for a target
    /// known only from its data, such as the chat an existing clock task fires into).
    ///
    /// In this session's chat (any thread of it: admins are per chat) the caller's role
    /// decides. An operator holds every role everywhere. Elsewhere [`ToolContext::roles`]
    /// is asked; without a resolver, or for the system caller (no user id), the answer is
    /// no. Refusals are `PERMISSION_DENIED`; a resolver that cannot tell is `UNAVAILABLE`.
    pub async fn require_role_in(&self, chat: &ChatRef, role: Role) -> Result<(), ToolError> {
        let here = self
            .chat
            .as_ref()
            .is_some_and(|c| c.platform == chat.platform && c.chat_id == chat.chat_id);
        if here || self.caller.role == Role::Operator {
            let mine = if here && self.caller.role < role {
                self.role_here().await
            } else {
                self.caller.role
            };
            return if mine >= role {
                Ok(())
            } else {
                Err(ToolError::permission_denied(format!(
                    "only {} may do this, and {} is not; tell them so instead of trying again",
                    role.who(),
                    self.caller_name()
                )))
            };
        }
        let denied = || {
            ToolError::permission_denied(format!(
                "only {} may do this in {chat}, and {} is not one there; tell them so \
                 instead of trying again",
                role.who(),
                self.caller_name()
            ))
        };
        let Some(roles) = self
            .roles
            .as_ref()
            .filter(|_| !self.caller.user_id.is_empty())
        else {
            return Err(denied());
        };
        match roles.role_in(&self.caller.user_id, chat).await {
            Ok(there) if there >= role => Ok(()),
            Ok(_) => Err(denied()),
            Err(e) => {
                tracing::warn!(chat = %chat, user = %self.caller.user_id, error = %e, "cannot resolve a role in another chat");
                Err(ToolError::unavailable(format!(
                    "could not check the caller's role in {chat} right now; try again later"
                )))
            }
        }
    }

    /// The caller's role in this session's chat. The session layer does not look a chat
    /// admin up before a turn (a platform round trip most turns do not need), so a caller
    /// known only as a member is asked about through [`ToolContext::roles`] here, when a
    /// tool needs more; a lookup that fails leaves the role known so far.
    pub async fn role_here(&self) -> Role {
        let known = self.caller.role;
        if known >= Role::ChatAdmin || self.caller.is_system() {
            return known;
        }
        let (Some(chat), Some(roles)) = (&self.chat, &self.roles) else {
            return known;
        };
        match roles.role_in(&self.caller.user_id, chat).await {
            Ok(role) => role.max(known),
            Err(e) => {
                tracing::warn!(chat = %chat, user = %self.caller.user_id, error = %e, "cannot resolve the caller's role; treating them as a member");
                known
            }
        }
    }

    /// The caller's name for a refusal.
    pub(crate) fn caller_name(&self) -> &str {
        if self.caller.name.is_empty() {
            "the sender"
        } else {
            &self.caller.name
        }
    }
}

impl std::fmt::Debug for ToolContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolContext")
            .field("session", &self.session)
            .field("caller", &self.caller)
            .field("chat", &self.chat)
            .field(
                "platform",
                &self.platform.as_ref().map(|p| p.name().to_owned()),
            )
            .field("quiet", &self.auto_chat.is_some())
            .finish_non_exhaustive()
    }
}

/// A set of tools sharing state and prompts. See docs/contract.md, "Prompt paths" for the
/// three prompt paths.
///
/// The built-in toolsets implement it through [`ToolSetBridge`] (directly, or as a type of
/// their own that is [`Bridged`]); a hand-written implementation is for what the bridge cannot
/// express.
#[async_trait]
pub trait ToolSet: Send + Sync {
    /// The toolset's name (`todo_list`, `time`...), as the config and the catalog know it.
    fn name(&self) -> &str;

    /// The tools this set offers; sent as schemas with every request.
    fn tools(&self) -> Vec<ToolSpec>;

    /// A number that changes whenever [`ToolSet::tools`] would answer differently (an MCP
    /// server announced a new tool list). The registry reads it on every request and
    /// rebuilds its definitions when it moved; a toolset whose tools never change keeps
    /// the default, 0.
    fn generation(&self) -> u64 {
        0
    }

    /// Runs one call. Arguments are already validated against the tool's schema; a failure
    /// is a [`ToolResult`] with an error code, never a panic.
    async fn invoke(&self, call: ToolInvocation, cx: ToolContext) -> ToolResult;

    /// Text appended to the system prompt, at construction and again whenever
    /// [`ToolSet::prompt_version`] changes (never within a turn: the prompt stays one stable
    /// prefix for the provider's cache).
    fn prompt(&self) -> Option<String> {
        None
    }

    /// A number that changes whenever [`ToolSet::prompt`] would give another text (the
    /// skills re-read from their folders); the agent rebuilds its system prompt when the
    /// sum over its toolsets changes. Constant for a prompt fixed in code.
    fn prompt_version(&self) -> u64 {
        0
    }

    /// Re-reads what this toolset loads from outside the program (`/reload` by an operator,
    /// SIGHUP): a line for the operator saying what it found, or `None` when it loads
    /// nothing.
    fn reload(&self) -> Option<String> {
        None
    }

    /// Text prepended to this turn's user message in `session` and persisted with it. A
    /// toolset shared by every session (one that keeps its state in the store) uses
    /// `session` to find that session's state.
    fn iteration_prompt_injection(&self, session: &str) -> Option<String> {
        let _ = session;
        None
    }

    /// A copy for a new session: fresh per-session state, shared configuration. A stateless
    /// toolset may return a clone of the same `Arc`.
    fn fork(&self) -> Arc<dyn ToolSet>;

    /// Forgets the per-session state of `session` (`/reset`).
    fn reset(&self, session: &str) {
        let _ = session;
    }

    /// Whether this (forked) toolset holds session state that lives only in memory (a todo
    /// plan). Such a session is kept in memory when idle; everything else is reloaded from
    /// the store when the session wakes up.
    fn holds_session_state(&self) -> bool {
        false
    }
}
