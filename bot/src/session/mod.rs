//! Sessions (DESIGN.md §4): one agent session per chat, each an actor with a bounded, typed
//! queue, running one turn at a time.
//!
//! - [`queue`]: the stacking queue in front of each session.
//! - [`history`]: the token-budget trim by whole turns.
//! - [`manager`]: [`SessionManager`], the runtime's [`Inbox`](crate::platform::Inbox):
//!   group policy, commands, admins, the per-chat rate limit, exactly-once delivery through
//!   the store's pending records and outbox, resume after a restart, and draining shutdown.

pub mod history;
pub mod manager;
pub mod queue;

pub use manager::{ScheduledOutcome, SessionConfig, SessionManager, SubmitError};
pub use queue::{QueueItem, SessionQueue};
