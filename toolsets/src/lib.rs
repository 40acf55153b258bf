//! # parlor-toolsets — every built-in toolset
//!
//! The abilities the agent gets from parlor itself, one module a toolset. Each implements
//! [`ToolSet`](parlor_bot::tool::ToolSet) through the typed
//! [`ToolSetBridge`](parlor_bot::tool::ToolSetBridge) (its tools as typed functions over the
//! toolset's state, its prompt, injection, fork and reset as the bridge's hooks), directly or
//! as a type of its own that is [`Bridged`](parlor_bot::tool::Bridged), and passes the one
//! gate of
//! [`ToolRegistry::call`](parlor_bot::tool::ToolRegistry::call): the tool exists, its
//! arguments fit its schema, the caller's [`Role`](parlor_bot::tool::Role) is enough.
//!
//! **Invariant:** this crate depends on `parlor-bot` only. It never imports a platform SDK
//! (teloxide, serenity) and never `parlor-adapters`: it meets the adapters at
//! [`parlor_bot::platform`], whose `Platform` trait every adapter implements. Everything a
//! tool reaches is scoped to the calling session by construction (the session key of the
//! call's context), never by an argument the model could change. No toolset checks a role
//! itself: roles are data on its [`ToolSpec`](parlor_bot::tool::ToolSpec)s.
//!
//! **Deliberately absent:** the agent loop, sessions, the store and the LLM client (those
//! are `parlor-bot`'s); configuration parsing (the binary's `config.rs` builds each
//! toolset's options).
//!
//! ## Layout
//! - [`message`] — `get_message`, `get_group_context`, `send_markdown`, and `load_image`
//!   when the model has vision. Images go through the runtime's pipeline
//!   ([`parlor_bot::image`]); `message/fetch.rs` fetches image URLs through [`net`] with a
//!   streaming size cap.
//! - [`web`] — `web_search` (SearXNG, Brave, DuckDuckGo) and `web_fetch` (pages as Markdown,
//!   paged, fenced as untrusted content).
//! - [`net`] — the one SSRF guard every URL tool fetches through: refused ranges, allowed
//!   networks, denied hosts, pinned addresses, redirects vetted hop by hop, no proxy.
//! - [`memory`] — per-session notes that survive restarts and `/reset` (`memory_write`,
//!   `memory_read`, `memory_search`, `memory_delete`).
//! - [`clock`] — scheduled tasks (cron, one-shot, interval): the store records, the
//!   [`ClockService`](clock::ClockService) firing them into sessions, and the `clock_*` tools.
//! - [`terminal`] — operator-only `shell` and `task_*`: one persistent shell per chat,
//!   background tasks, the bubblewrap sandbox.
//! - [`mcp`] — the tools of configured MCP servers (stdio children, streamable HTTP) through
//!   rmcp, one toolset per server, risk as role, restarted with backoff.
//! - [`todo`] — `todo_list`, the per-session plan the agent keeps (the reference stateful
//!   toolset: a per-turn injection and a `/reset` hook).
//! - [`time`] — `time`: the current time in a time zone.
//! - [`notice`] — how background work (terminal tasks, sub-agents) tells its chat that it
//!   ended, exactly once: the [`Notifier`](notice::Notifier) and the "told" state of a row.
//! - [`subagent`] — `subagent`, `subagent_output`, `subagent_stop`, `subagent_list`: work
//!   handed to a fresh agent with budgets, in the foreground or in the background (rows in
//!   the store, a notice when it ends).
//! - [`skill`] — `skill`, `skill_read`: procedures operators write as `SKILL.md` folders,
//!   listed in the system prompt, loaded on demand, re-read on `/reload` and SIGHUP.
//! - [`prompt`] — prompt-only toolsets: text for the system prompt, no tools.
//!
//! ## Where a new toolset goes
//! A module here (`src/<name>.rs` or `src/<name>/`), its tests in `tests/<name>.rs`, its
//! options built in the binary's `config.rs` and registered in `wiring.rs`.

pub mod clock;
mod jobs;
pub mod mcp;
pub mod memory;
pub mod message;
pub mod net;
pub mod notice;
pub mod prompt;
pub mod skill;
pub mod subagent;
mod support;
pub mod terminal;
pub mod time;
pub mod todo;
pub mod web;

pub use memory::{
    MemoryChatHook, MemoryOptions, MemoryToolset, memory_toolset, memory_toolset_with_wall_time,
};
pub use message::{MessageOptions, MessageToolset, MessageToolsetError, message_toolset};
pub use prompt::PromptToolset;
pub use todo::{TodoChatHook, TodoList};
pub use web::{WebOptions, WebToolset, WebToolsetError, web_toolset};
