//! # parlor-plugins — toolsets bound to a platform or to storage
//!
//! The tools through which the agent sees and speaks in its chat, and remembers what the chat
//! told it. They need more than their arguments: the message log and collections of the
//! [`Store`](parlor_bot::store::Store), and the chat's
//! [`Platform`](parlor_bot::platform::Platform) handle from the
//! [`ToolContext`](parlor_bot::tool::ToolContext) of each call.
//!
//! **Invariant:** this crate depends on `parlor-bot` only. It never imports a platform SDK
//! (teloxide, serenity) and never `parlor-adapters`: it meets the adapters at
//! [`parlor_bot::platform`], whose `Platform` trait every adapter implements. Everything a
//! tool reaches is scoped to the calling session by construction (the session key of the
//! call's context), never by an argument the model could change.
//!
//! ## Layout
//! - [`message`] — the `message` toolset: `get_message`, `get_group_context`,
//!   `send_markdown`, and `load_image` when the model has vision. Images go through the
//!   runtime's pipeline ([`parlor_bot::image`]: checks, decoding, downscaling);
//!   `message/fetch.rs` fetches image URLs with a timeout, a streaming size cap and a guard
//!   against private addresses.
//! - [`memory`] — the `memory` toolset: per-session notes that survive restarts and `/reset`
//!   (`memory_write`, `memory_read`, `memory_search`, `memory_delete`).

pub mod memory;
pub mod message;
mod support;

pub use memory::{MemoryOptions, MemoryToolset, memory_toolset};
pub use message::{MessageOptions, MessageToolset, MessageToolsetError, message_toolset};
