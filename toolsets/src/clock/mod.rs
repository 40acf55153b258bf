//! Clock tasks (docs/contract.md, "Asynchronous results"): chat admins schedule a text that fires into a chat — a cron
//! expression, a one-shot date-time or `every <duration>`, in an IANA time zone — and the
//! target chat's session runs it as a turn whose reply is posted there.
//!
//! - [`schedule`]: [`Schedule`] parsing and fire times (DST through `croner` + `chrono-tz`).
//! - [`task`]: the stored records, [`ClockTask`] and its run log of [`ClockRun`]s.
//! - [`handle`]: [`ClockHandle`], the tasks in the store (create, update, delete, list, log)
//!   shared by the service and the tools, with an in-memory index of the tasks (the enabled
//!   ones by next fire, every one by target chat) (`index.rs`), so that a pass reads only the due tasks.
//! - [`service`]: [`ClockService`], the loop that sleeps until the earliest due time and
//!   fires tasks through the session layer's [`SystemInputs`](parlor_bot::session::SystemInputs).
//! - [`tools`]: the `clock_*` toolset ([`toolset`]).
//!
//! ## Guarantees
//! - **At most once per due time.** Before a fire is handed to the session, the task's
//!   `next_fire` is advanced past now and a `started` run is logged, and the store is
//!   flushed. A crash after that point cannot fire the same due time again; a crash between
//!   the flush and the session's own pending record loses that one fire, and the next start
//!   logs it `cancelled`.
//! - **"Delivered" means a message id.** A run is `ok` only with the platform's message ids
//!   of the posted reply.
//! - **Missed while down.** A due time at most [`ClockOptions::late_tolerance`] old fires
//!   late (a restart does not skip a task); older ones follow the task's [`MissedPolicy`].
//!
//! ## Decisions
//! - A one-shot task is kept after its fire, disabled (`state: finished`), so `clock_get`
//!   and `clock_log` still show what happened. Every task counts toward the cap, paused and
//!   finished ones too (pausing is no way past it): a finished one keeps its place until
//!   deleted.
//! - A turn stopped by `/stop` (the session reports "no reply") is logged `cancelled`; a
//!   model failure, a refused post or a full queue is `failed`.
//! - The fired turn runs as the system (empty user id, role member), not as its creator:
//!   a scheduled turn cannot use admin-only tools, and a creator who lost their rights
//!   does not keep them through a task. The fired text names the creator.
//!
//! ## Time
//! Waiting is tokio's timer ([`tokio::time::sleep_until`]); wall time comes from
//! [`ClockOptions::wall_time`]: the system clock by default, [`WallTime::tokio_anchored`]
//! under paused time in tests.
//!
//! ## Wiring
//! The system-input channel and the [`ClockHandle`] come first; the service sends on the
//! channel and never sees the sessions:
//! ```text
//! let (inputs, receiver) = parlor_bot::session::system_inputs();
//! let clocks = ClockHandle::new(store.clone(), options);
//! let tools = clock::toolset(clocks.clone())?;            // into the ToolRegistry
//! let sessions = SessionManager::new(store, agent, platforms, config);
//! sessions.resume().await?;                                // what the store held first
//! sessions.serve_system(receiver);                         // then new fires and notices
//! let clock_task = tokio::spawn(ClockService::with_handle(clocks, inputs).run(shutdown.clone()));
//! // shutdown: cancel `shutdown`, then `sessions.shutdown(grace).await`, then await
//! // `clock_task` (runs still waiting get `shutdown_grace`, then are logged cancelled).
//! ```

pub mod handle;
mod index;
pub mod life;
pub mod schedule;
pub mod service;
pub mod task;
pub mod tools;

use std::time::Duration;

use chrono_tz::Tz;

pub use handle::{ClockError, ClockHandle, ClockPatch, NewClock};
pub use life::ClockChatHook;
pub use parlor_bot::time::WallTime;
pub use schedule::{Schedule, ScheduleError, ScheduleKind};
pub use service::{ClockService, fired_text};
pub use task::{ClockRun, ClockTask, MissedPolicy, RunStatus};
pub use tools::toolset;

/// Run log entries kept per task; older ones are dropped.
pub const RUNS_KEPT: usize = 50;

/// Settings of the clock; the defaults suit a group bot.
#[derive(Debug, Clone)]
pub struct ClockOptions {
    /// Time zone of tasks created without one (the operator's zone).
    pub default_timezone: Tz,
    /// Longest a fire waits for its turn's outcome (queue wait included) before it is
    /// logged `timed_out`.
    pub run_timeout: Duration,
    /// Most tasks one chat may have, paused and finished ones included.
    pub max_tasks_per_chat: usize,
    /// Shortest interval between two fires of a task (`every` and cron alike).
    pub min_interval: Duration,
    /// A due time missed by at most this much (a restart, a slow start) still fires, late;
    /// older ones follow the task's [`MissedPolicy`].
    pub late_tolerance: Duration,
    /// After shutdown, how long runs still waiting for their turn are given before they are
    /// logged `cancelled`.
    pub shutdown_grace: Duration,
    /// Where wall time comes from.
    pub wall_time: WallTime,
    /// With several daemons on one store: how often the tasks are read again from the
    /// store, so that a task another daemon created or changed fires here too should that
    /// one stop. Each due time fires once whichever daemon claims it. `None`: one daemon,
    /// whose index is always current.
    pub reread_every: Option<Duration>,
}

impl Default for ClockOptions {
    fn default() -> Self {
        ClockOptions {
            default_timezone: Tz::UTC,
            run_timeout: Duration::from_secs(600),
            max_tasks_per_chat: 20,
            min_interval: Duration::from_secs(60),
            late_tolerance: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(10),
            wall_time: WallTime::system(),
            reread_every: None,
        }
    }
}
