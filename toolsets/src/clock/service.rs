//! [`ClockService`]: sleeps until the earliest due time (tokio's timer, so paused time drives
//! the tests), fires what is due, and records each run's outcome.
//!
//! Each fire runs as its own task in a [`JoinSet`] owned by [`ClockService::run`]: a slow
//! turn of one task never delays another. On shutdown the set is drained: a fire still
//! waiting for its turn gets [`ClockOptions::shutdown_grace`](super::ClockOptions), then is
//! logged `cancelled`.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ClockOptions;
use super::handle::{ClockHandle, Fire, MAX_NAME_CHARS, RunEnd};
use super::task::{ClockTask, RunStatus};
use parlor_bot::quote;
use parlor_bot::session::{ScheduledOutcome, SubmitError, SystemInputs};
use parlor_bot::store::Store;
use parlor_bot::tool::{Caller, Role};

/// Longest single sleep: the loop looks at the wall clock again at least this often, so a
/// step of the system clock is followed within a minute.
const MAX_SLEEP: Duration = Duration::from_secs(60);
/// Wait before retrying after the store failed.
const STORE_RETRY: Duration = Duration::from_secs(5);

/// Fires clock tasks into their chats' sessions. See the module docs.
#[derive(Debug)]
pub struct ClockService {
    handle: ClockHandle,
    sessions: SystemInputs,
}

impl ClockService {
    /// A service over the tasks in `store`, firing through `sessions` (the session layer's
    /// system inputs). The tools need the same tasks: take them from
    /// [`ClockService::handle`], or build the [`ClockHandle`] first and use
    /// [`ClockService::with_handle`].
    pub fn new(store: Arc<dyn Store>, sessions: SystemInputs, options: ClockOptions) -> Self {
        Self::with_handle(ClockHandle::new(store, options), sessions)
    }

    /// A service over the tasks of `handle`.
    pub fn with_handle(handle: ClockHandle, sessions: SystemInputs) -> Self {
        ClockService { handle, sessions }
    }

    /// The tasks this service fires (for [`toolset`](super::toolset)).
    pub fn handle(&self) -> ClockHandle {
        self.handle.clone()
    }

    /// Runs until `shutdown` is cancelled, then waits for the fires in flight (see the
    /// module docs). First, runs left `started` by a crash are logged `cancelled`; due times
    /// missed while the daemon was down are handled on the first pass of the loop.
    pub async fn run(self, shutdown: CancellationToken) {
        match self.handle.recover_interrupted() {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                runs = n,
                "clock runs interrupted by the last stop were logged cancelled"
            ),
            Err(e) => tracing::error!(error = %e, "cannot read the clock run log"),
        }
        let mut fires = JoinSet::new();
        // Cancelled when the shutdown grace is over: fires stop waiting for their turns.
        let abort = CancellationToken::new();
        let reread = self.handle.options().reread_every;
        let mut read_at = Instant::now();
        'serve: loop {
            if let Some(every) = reread
                && read_at.elapsed() >= every
            {
                self.handle.reread();
                read_at = Instant::now();
            }
            let wait = match self.handle.take_due(self.handle.now()) {
                Ok(due) => {
                    for fire in due {
                        tracing::info!(clock = fire.task.id, run = fire.run, due = %fire.due, target = %fire.task.target, "clock task fires");
                        fires.spawn(execute(
                            self.handle.clone(),
                            self.sessions.clone(),
                            fire,
                            abort.clone(),
                        ));
                    }
                    match self.handle.earliest() {
                        Some(next) => (next - self.handle.now())
                            .to_std()
                            .unwrap_or(Duration::ZERO)
                            .min(MAX_SLEEP),
                        None => MAX_SLEEP,
                    }
                }
                Err(e) => {
                    // The tasks it could not advance are still due in the index: waiting
                    // for the earliest would spin on the failing store.
                    tracing::error!(error = %e, "cannot advance due clock tasks; retrying");
                    STORE_RETRY
                }
            };
            let wait = reread.map_or(wait, |every| wait.min(every));
            let deadline = Instant::now() + wait;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break 'serve,
                    () = self.handle.changed().notified() => break,
                    () = tokio::time::sleep_until(deadline) => break,
                    Some(joined) = fires.join_next(), if !fires.is_empty() => reap(joined),
                }
            }
        }

        let grace = tokio::time::sleep(self.handle.options().shutdown_grace);
        tokio::pin!(grace);
        let mut aborted = false;
        loop {
            tokio::select! {
                joined = fires.join_next() => match joined {
                    Some(joined) => reap(joined),
                    None => break,
                },
                () = &mut grace, if !aborted => {
                    aborted = true;
                    abort.cancel();
                }
            }
        }
        if let Err(e) = self.handle.store().flush() {
            tracing::error!(error = %e, "cannot flush the clock log on shutdown");
        }
    }
}

fn reap(joined: Result<(), tokio::task::JoinError>) {
    if let Err(e) = joined
        && e.is_panic()
    {
        // Its run stays `started` and is logged `cancelled` at the next start.
        tracing::error!(error = %e, "a clock fire panicked");
    }
}

/// The text the target session is given: a header line the program writes (the task's
/// name and its creator's, cleaned of anything that reads as an attribution), then the
/// content its creator wrote, quoted (every line indented), so that no line of it can pass
/// for someone's message (`parlor_bot::quote`).
pub fn fired_text(task: &ClockTask) -> String {
    let creator = if task.creator.name.trim().is_empty() {
        task.creator.user_id.as_str()
    } else {
        task.creator.name.as_str()
    };
    format!(
        "[Scheduled task \"{}\" (clock {}), created by {}; its content, as they wrote it:]\n{}",
        quote::name(&task.name, MAX_NAME_CHARS),
        task.id,
        quote::name(creator, 64),
        quote::block(&task.content)
    )
}

/// Hands one fire to the target session, waits for the outcome and records it.
async fn execute(
    handle: ClockHandle,
    sessions: SystemInputs,
    fire: Fire,
    abort: CancellationToken,
) {
    let task = &fire.task;
    // The turn runs as the system, not as the creator: it cannot use admin-only tools, and
    // a creator who lost their rights since does not keep them through a task.
    let caller = Caller {
        user_id: String::new(),
        name: format!("clock {}", task.id),
        role: Role::Member,
        grants: Vec::new(),
    };
    let timeout = handle.options().run_timeout;
    let submitted = tokio::select! {
        submitted = sessions.clock_fire(&task.target, fired_text(task), caller) => submitted,
        () = abort.cancelled() => Err(SubmitError::ShuttingDown),
    };
    let end = match submitted {
        Err(SubmitError::ShuttingDown) => RunEnd::not_posted(
            RunStatus::Cancelled,
            "the daemon was shutting down; not fired",
        ),
        Err(e) => RunEnd::not_posted(RunStatus::Failed, format!("not queued: {e}")),
        Ok(outcome) => tokio::select! {
            waited = tokio::time::timeout(timeout, outcome) => match waited {
                Ok(Ok(outcome)) => from_outcome(outcome),
                Ok(Err(_)) => RunEnd::not_posted(
                    RunStatus::Cancelled,
                    "the turn was abandoned by a shutdown",
                ),
                Err(_) => RunEnd::not_posted(
                    RunStatus::TimedOut,
                    format!(
                        "no outcome within {} s; the turn may still post later",
                        timeout.as_secs()
                    ),
                ),
            },
            () = abort.cancelled() => RunEnd::not_posted(
                RunStatus::Cancelled,
                "the daemon shut down before the turn finished",
            ),
        },
    };
    parlor_bot::metrics::global().clock_fire(end.status.as_str());
    match end.status {
        RunStatus::Ok => {
            tracing::info!(clock = task.id, run = fire.run, ids = ?end.message_ids, "clock task posted");
        }
        status => {
            tracing::warn!(clock = task.id, run = fire.run, status = status.as_str(), error = ?end.error, "clock task run did not post");
        }
    }
    if let Err(e) = handle.finish_run(task.id, fire.run, end) {
        tracing::error!(clock = task.id, run = fire.run, error = %e, "cannot record the clock run");
    }
}

/// A run's status from the session's report: `ok` only with message ids.
fn from_outcome(outcome: ScheduledOutcome) -> RunEnd {
    match outcome {
        ScheduledOutcome::Posted(ids) if !ids.is_empty() => RunEnd::posted(ids),
        ScheduledOutcome::Posted(_) => RunEnd::not_posted(
            RunStatus::Failed,
            "the platform reported no message id for the reply",
        ),
        // The manager commits a turn without a reply only when it was stopped.
        ScheduledOutcome::NoReply => RunEnd::not_posted(
            RunStatus::Cancelled,
            "the turn was stopped (/stop or /reset) before it replied; nothing was posted",
        ),
        ScheduledOutcome::NotDelivered(reason) => RunEnd::not_posted(
            RunStatus::Failed,
            format!("the reply could not be posted: {reason}"),
        ),
        ScheduledOutcome::Failed(reason) => RunEnd::not_posted(
            RunStatus::Failed,
            format!("the model could not be reached: {reason}"),
        ),
        ScheduledOutcome::Elsewhere => RunEnd::not_posted(
            RunStatus::HandedOver,
            "another daemon holds the chat and runs the fire there",
        ),
    }
}
