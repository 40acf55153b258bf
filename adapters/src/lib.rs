//! # parlor-adapters — the platform adapters
//!
//! Owns the code that speaks a chat platform's protocol: as a [`Receiver`] it turns the
//! platform's updates into [`parlor_bot::platform::IncomingMessage`]s for the runtime's
//! [`Inbox`], and it implements [`Platform`](parlor_bot::platform::Platform) so the runtime
//! and the toolsets can answer.
//!
//! **Invariant:** only this crate touches platform SDKs (teloxide-core, serenity, tokio-tungstenite for OneBot); it depends
//! on `parlor-bot` for the normalized types and `parlor-render` for replies, never on
//! `parlor-toolsets` — adapters and toolsets meet at `parlor_bot::platform`, never directly.
//!
//! **Deliberately absent:** sessions, policy (who is addressed, who may do what: the
//! adapter reports the platform's facts, the runtime decides), storage beyond what
//! `Inbox::deliver` does.
//!
//! ## Layout
//! - [`telegram`] — the Telegram Bot API adapter: long polling with acknowledgement after
//!   durable delivery, or a webhook whose receiver the binary's HTTP listener mounts
//!   ([`telegram::webhook`]), message normalization (topics, mentions, commands, images), sending
//!   with splitting and bounded retries.
//! - [`discord`] — the Discord adapter (serenity): gateway with resume, normalization (one
//!   session per channel/thread/DM, mentions, replies, commands, images), sending in parts of
//!   at most 2000 characters with explicit `allowed_mentions`, paced per channel and honouring
//!   429s, admins from role permissions.
//! - [`onebot`] — QQ through a OneBot v11 implementation (NapCat...): forward or reverse
//!   WebSocket with the access token, events as segments or CQ codes ([`onebot::cq`]),
//!   actions answered by `echo`, plain-text replies split and paced per chat, admins from
//!   `sender.role`.
//! - [`console`] — the local terminal adapter behind `parlor chat`.
//! - `common` (private) — what Telegram and Discord share: bounded retries around a call,
//!   the bot token kept secret and scrubbed from error texts, the cap on image downloads,
//!   the checks a send starts with. A new adapter uses these, never a copy.

#![warn(missing_docs)]

mod common;
pub mod console;
pub mod discord;
pub mod onebot;
pub mod telegram;

use std::future::Future;
use std::sync::Arc;

use parlor_bot::platform::{Inbox, PlatformError};
use tokio_util::sync::CancellationToken;

/// The receiving side of a platform adapter ([`Platform`](parlor_bot::platform::Platform) is
/// the answering side): what the platform sends goes to an inbox until shutdown.
pub trait Receiver {
    /// Receives and delivers every message to `inbox` until `shutdown` is cancelled, then
    /// returns `Ok(())`; an `Err` means the adapter cannot go on (a rejected token). `ready`
    /// is called once, when messages start to flow: the daemon's systemd `READY=1` hangs on
    /// it. What is retried, and how, is each adapter's own (see its implementation).
    fn run_with_ready<R>(
        &self,
        inbox: Arc<dyn Inbox>,
        shutdown: CancellationToken,
        ready: R,
    ) -> impl Future<Output = Result<(), PlatformError>> + Send
    where
        R: FnOnce() + Send;

    /// [`run_with_ready`](Self::run_with_ready) without a ready callback.
    fn run(
        &self,
        inbox: Arc<dyn Inbox>,
        shutdown: CancellationToken,
    ) -> impl Future<Output = Result<(), PlatformError>> + Send {
        self.run_with_ready(inbox, shutdown, || {})
    }
}
