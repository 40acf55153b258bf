//! Sessions (docs/contract.md, "A turn"): one agent session per chat, run by one worker
//! with a bounded, typed queue, one item at a time.
//!
//! # The path of a mention
//! ```text
//! adapter ── Inbox::deliver ──▶ inbox.rs       policy, then one store write (log + pending)
//!                                  │
//!                                  ▼
//!                          dispatcher.rs       the chat's session; push; start its worker
//!                                  │
//!                                  ▼
//!                               queue.rs       waits (merged with more input) until taken
//!                                  │
//!                                  ▼
//!                              worker.rs       rate limit, roles (roles.rs), next item
//!                                  │
//!                                  ▼
//!                                turn.rs       the agent's turn; an Outcome, nothing written
//!                                  │
//!                                  ▼
//!                              commit.rs       one transaction, durable; the reply row out
//!                                  │
//!                                  ▼
//!                              outbox.rs       the chat's lane: Platform::send, retried
//! ```
//! What each kind of input may do on that path is one table, [`input`].
//!
//! # Layout, along the path of a message
//! - [`inbox`]: `Inbox::deliver` — allow-lists, then one store transaction that records the
//!   message (the dedupe key) and makes it pending or queues its immediate answer; then the
//!   push onto the session's queue. Nothing in it waits on the network.
//! - [`life`]: `Inbox::chat_event` — the bot added or removed, a chat moved to a new id, an
//!   edit — each one store transaction, with the toolsets' [`ChatHook`]s.
//! - [`policy`]: who is served, what is addressed to the bot, and the attribution of input
//!   lines, which no member's text can forge.
//! - [`commands`]: `/help`, `/status`, `/stop` (answered at intake) and `/reset` (queued).
//! - [`flood`]: how many commands a member and a chat may have answered per minute.
//! - [`input`]: what each kind of input may do — merge, where it waits, whose rights its
//!   turn holds, whether it posts — in one table.
//! - [`queue`]: the stacking queue in front of each session: merging items merge, a pending
//!   input is in it once, a full queue returns the item so the chat is told.
//! - [`system`]: the one bounded channel (256) that clock fires, task notices and
//!   withdrawals come through, served one at a time after [`SessionManager::resume`]; due
//!   fires and notices are queued even past a full queue, a fire's completion sender
//!   travelling with its input and its reply.
//! - [`settings`]: a group's own settings inside the operator's `[groups]` frame; `/set` is
//!   applied by the worker, in the commit that answers it. [`limits`]: turns per member per
//!   hour, checked at intake. [`approvals`]: tool calls waiting for a person's yes, stored
//!   before they are asked, decided by a task of their own. [`chat_commands`]: toolsets'
//!   commands (`/memory`, `/forget`).
//! - [`dispatcher`]: the one owner of the live chats; it starts a chat's worker and lets
//!   the chat leave memory.
//! - [`manager`]: [`SessionManager`], the public entry points (scheduled inputs, notices,
//!   resume, shutdown) and what the stages share.
//! - [`worker`]: the per-chat worker: rate limit, role resolution, back to the dispatcher
//!   when idle.
//! - [`roles`]: operators from the config, chat admins from the platform (cached, with a
//!   timeout), and the [`RoleResolver`](crate::tool::RoleResolver) tools use.
//! - [`turn`]: one item — the agent's turn or `/reset` — run to an outcome that writes
//!   nothing; [`commit`] writes it in one transaction and hands the reply to the outbox.
//! - [`auto_chat`]: unaddressed messages of chosen groups in batches, each one
//!   auto-chat turn that may speak only through `send_message`, within its limits.
//! - [`outbox`]: one lane per chat sending committed replies in order, retrying until the
//!   platform takes them or refuses them for good.
//! - [`usage`]: tokens per chat per day and the daily budget; [`trace`]: each turn's trace
//!   (both committed with the turn); [`view`]: what the operator's console reads and stops.
//!
//! After a crash, [`SessionManager::resume`] re-queues every pending record (its turn never
//! committed) and hands every unsent reply to its lane; [`quarantine`] sets aside an input
//! whose turn stopped the daemon twice instead of replaying it forever.

mod approvals;
pub mod auto_chat;
pub mod chat_commands;
pub mod cluster;
mod commands;
mod commit;
mod compact;
mod dispatcher;
mod flood;
mod inbox;
pub mod input;
pub mod lease;
pub mod life;
mod limits;
pub mod manager;
mod outbox;
pub mod policy;
pub mod quarantine;
pub mod queue;
mod roles;
pub mod settings;
pub mod system;
pub mod trace;
mod turn;
pub mod usage;
mod view;
mod worker;

pub use auto_chat::AutoChat;
pub use chat_commands::{ChatCommand, CommandAnswer};
pub use cluster::Cluster;
pub use life::{ChatHook, Removal, move_record, move_records};
pub use manager::{GroupModel, SessionConfig, SessionManager, SessionStats, SubmitError};
pub use policy::{ATTRIBUTION_PROMPT, attribute};
pub use queue::{QueueItem, ScheduledOutcome, SessionQueue};
pub use settings::{Effective, GroupPolicy, GroupSettings, ReplyMode};
pub use system::{SystemInputs, SystemReceiver, system_inputs};
pub use view::LiveChat;
