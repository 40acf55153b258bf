//! # parlor-bot — the agent runtime
//!
//! Owns everything an agent session needs that is not tied to a chat platform: the
//! OpenAI-compatible LLM client, the tool contract, the agent loop, sessions (intake, the
//! per-chat worker, the outbox), the store and the platform traits. The toolsets themselves
//! live in `parlor-toolsets`.
//!
//! **Invariant:** this crate knows no platform SDK (no teloxide, no serenity) and no
//! adapter or plugin crate; they depend on it, never the other way round.
//!
//! ## Layout
//! - [`llm`] — wire types (OpenAI shape), the [`llm::LlmBackend`] trait, the streaming
//!   client with SSE framing, tool-call assembly and retries.
//! - [`tool`] — the [`tool::ToolSet`] trait, the [`tool::ToolSetBridge`] that turns typed
//!   async functions into tools, schema generation and argument validation, the stable
//!   [`tool::ToolResult`] JSON, the registry and the catalog.
//! - [`image`] — the image pipeline: format sniffing, bounded decoding, downscaling, limits
//!   and `data:` URLs, for attached photos and `load_image` alike.
//! - [`text`] — character-safe cutting, the one place text is bounded.
//! - [`quote`] — the one rule for text the program did not write: quoted blocks, one-line
//!   fields, names that cannot pose as an attribution.
//! - [`ratelimit`] — the sliding-window limit for turns and sends.
//! - [`backoff`] — exponential backoff with jitter for every retrying client.
//! - [`agent`] — prompt assembly (static prompt, per-turn injections, schemas) and the
//!   iteration loop that runs tool calls concurrently, bounded and in order.

pub mod agent;
pub mod backoff;
pub mod health;
pub mod image;
pub mod lang;
pub mod llm;
pub mod metrics;
pub mod net;
pub mod platform;
pub mod quote;
pub mod ratelimit;
pub mod session;
pub mod store;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod text;
pub mod time;
pub mod tool;
