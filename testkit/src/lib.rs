//! Test fakes for parlor, and nothing else.
//!
//! This crate owns the in-process stand-ins that parlor's tests talk to
//! instead of real services:
//! - [`llm`]: [`FakeLlm`], a scripted OpenAI-compatible `chat/completions`
//!   server (streaming SSE and plain JSON) that records every request;
//! - [`embeddings`]: [`FakeEmbeddings`], an OpenAI-compatible `embeddings` server whose
//!   vectors are a bag of synonym groups and hashed words, with scripted 500s;
//! - [`anthropic`]: [`FakeAnthropic`], a scripted Anthropic Messages API (`/v1/messages`,
//!   streamed events: text, tool use, thinking with signatures, cache usage, 529s, error
//!   events, cut streams) that records every request;
//! - [`telegram`]: [`FakeTelegram`], a fake Bot API (long polling with
//!   offsets, webhooks set and delivered to, sending, files, administrators,
//!   scripted 429/409 failures) that the real teloxide client can talk to;
//! - [`discord`]: [`FakeDiscord`], a fake Discord REST API (`/api/v10/...`) and
//!   gateway WebSocket (Hello, Identify/READY, heartbeats, Resume, scripted
//!   `MESSAGE_CREATE`s and button presses, disconnects, scripted 429s) that serenity can
//!   talk to;
//! - [`mcp`]: [`TestMcpServer`], a real MCP server (rmcp's server side) over stdio (the
//!   `parlor-mcp-test-server` binary) and streamable HTTP on loopback ([`McpHttpServer`]);
//! - [`web`]: [`FakeWeb`], scripted web pages on a loopback address (127.0.0.1 or another
//!   of 127.0.0.0/8), and the answers of SearXNG, Brave Search and DuckDuckGo's HTML page;
//! - [`onebot`]: [`FakeOneBot`], a fake OneBot v11 implementation (NapCat's stand-in)
//!   speaking forward and reverse WebSocket: group and private messages as segments or
//!   CQ strings, notices, heartbeats, `echo`ed answers, scripted `retcode`s and dropped
//!   connections, images over HTTP;
//! - [`process`]: [`DaemonProcess`], a daemon under test as a child process, ready once it
//!   polls the fake Telegram (or sets its webhook), its stderr collected.
//!
//! What the fakes have in common (a loopback server that stops with the fake,
//! the state lock, bounded waits and their [`WaitTimeout`]) lives once, in the
//! private `server` module.
//!
//! Rules for this crate:
//! - It is only ever a **dev-dependency**. Non-test code must never depend on
//!   it.
//! - It must not depend on any of parlor's own crates (`parlor`,
//!   `parlor-bot`, `parlor-adapters`, `parlor-toolsets`, ...), so that every
//!   crate in the workspace can dev-depend on it without cycles. It speaks the
//!   wire protocols (HTTP + JSON) only.
//! - Every wait inside a fake is bounded or cancellable, so a misbehaving test
//!   fails instead of hanging.
#![warn(missing_docs)]

pub mod anthropic;
pub mod discord;
pub mod embeddings;
pub mod llm;
pub mod mcp;
pub mod onebot;
pub mod process;
pub mod telegram;
pub mod web;

mod server;

pub use server::WaitTimeout;

pub use anthropic::{AnthropicReply, AnthropicRequest, AnthropicUsage, BlockSpec, FakeAnthropic};
pub use discord::{
    DEFAULT_GUILD_ID, DiscordButton, DiscordFailure, DiscordFollowup, DiscordInteraction,
    DiscordInteractionBuilder, DiscordInteractionCallback, DiscordMessageBuilder, DiscordRequest,
    DiscordSent, DiscordTyping, DiscordUser, FakeDiscord, discord_fixture,
};
pub use embeddings::FakeEmbeddings;
pub use llm::{FakeLlm, RecordedRequest, Reply, ToolCallSpec, last_user_text};
pub use mcp::{McpHttpServer, TestMcpServer, mcp_server_bin};
pub use onebot::{DialError, FakeOneBot, OneBotFailure, OneBotMessageBuilder, OneBotSent};
pub use process::DaemonProcess;
pub use telegram::{
    CallbackAnswer, CallbackQueryBuilder, ChatAction, EditedMessage, Failure, FakeTelegram,
    GetUpdatesCall, InlineButton, MessageBuilder, RecordedCall, SentMessage, TgUser, Webhook,
    WebhookError, teloxide_fixture, utf16_len,
};
pub use web::{
    FakePage, FakeWeb, SearchHit, WebRequest, brave_json, duckduckgo_html, searxng_json,
};
