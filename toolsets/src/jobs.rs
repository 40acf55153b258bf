//! Background jobs of one kind (terminal tasks, sub-agents): the machinery every kind shares
//! around its stored rows and [`crate::notice`]. [`Jobs`] owns which jobs this daemon runs
//! (a running slot per job, claimed under limits and released when its end is recorded), the
//! rows lock that orders a job's end against the model reading it, recording an end (the
//! notice and its "told" row in one transaction, through [`notice::tell_once`]), reading a
//! result (which withdraws its notice, [`notice::read_before_told`]), recovery after a
//! restart and shutdown. What a job is (a process in its sandbox, an agent run), its limits
//! and its refusals stay with its service.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::notice::{self, NoticeRow, Notifier, Rows};
use parlor_bot::platform::ChatRef;
use parlor_bot::store::{KvWrite, Store, StoreError};
use parlor_bot::time::WallTime;
use parlor_bot::tool::{Caller, Grant, Role, ToolResult};

/// Where a job stands, as far as the shared machinery cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Still running (or, after a restart, left running by the previous daemon).
    Running,
    /// Ended by itself (well or not): its chat is told.
    Ended,
    /// Stopped on request: nobody is told.
    Stopped,
    /// The daemon stopped while it ran: told after the next start.
    Interrupted,
}

/// A stored row of one kind of background job.
pub(crate) trait JobRow: NoticeRow {
    /// The name a notice about several people's jobs runs under (the system's).
    const SYSTEM_NAME: &'static str;
    /// The note on a row that the last restart interrupted.
    const LOST_NOTE: &'static str;
    /// Whether a row that ended without a chat counts as told at once; otherwise the next
    /// read or restart marks it.
    const TOLD_WITHOUT_CHAT: bool;
    /// Where its notice goes; `None` outside a chat.
    fn chat(&self) -> Option<&ChatRef>;
    /// Where it stands.
    fn phase(&self) -> Phase;
    /// Marks a row the previous daemon left running as interrupted at `at`.
    fn interrupt(&mut self, at: DateTime<Utc>);
    /// Who its notice runs as (its starter, with the grants of that one job).
    fn notice_caller(&self) -> Caller;
    /// Its notice block, with `note` added.
    fn notice_text(&self, note: Option<&str>) -> String;
}

/// A job this daemon runs: its session, how to stop it, when its end is recorded, and what
/// its service keeps of it (`H`: a terminal task's process group).
struct Live<H> {
    session: String,
    stop: CancellationToken,
    done: CancellationToken,
    handle: H,
}

/// A live job as [`Jobs::live`] finds it.
pub(crate) struct LiveJob<H> {
    pub stop: CancellationToken,
    pub done: CancellationToken,
    pub handle: H,
}

/// Why [`Jobs::claim`] gave no slot.
pub(crate) enum Refusal<E> {
    /// The session runs this many jobs already (its limit).
    Session(usize),
    /// The bot runs as many jobs as it may.
    Total,
    /// The job itself could not start.
    Start(E),
}

/// The background jobs of one kind: stored rows, live runs, their tracker.
pub(crate) struct Jobs<R, H> {
    table: Rows<R>,
    notifier: Arc<dyn Notifier>,
    tracker: TaskTracker,
    shutting_down: CancellationToken,
    running: Mutex<HashMap<String, Live<H>>>,
    /// Serializes row updates that race with notices (a job's end vs the model reading it).
    rows: tokio::sync::Mutex<()>,
    /// What time it is (ids, start and end times).
    wall_time: WallTime,
    /// With several daemons on one store: this one's instance id, written into the rows it
    /// starts, so that another daemon's recovery leaves them alone while it lives.
    runner: std::sync::OnceLock<String>,
}

impl<R: JobRow, H: Clone> Jobs<R, H> {
    /// The jobs of kind `R` stored in `store`, telling their chats through `notifier`,
    /// reading the time from `wall_time`.
    pub fn new(store: Arc<dyn Store>, notifier: Arc<dyn Notifier>, wall_time: WallTime) -> Self {
        Jobs {
            table: Rows::new(store),
            notifier,
            tracker: TaskTracker::new(),
            shutting_down: CancellationToken::new(),
            running: Mutex::default(),
            rows: tokio::sync::Mutex::new(()),
            wall_time,
            runner: std::sync::OnceLock::new(),
        }
    }

    /// Marks the rows started from now on as run by instance `id` (cluster mode).
    pub fn set_runner(&self, id: &str) {
        let _ = self.runner.set(id.to_owned());
    }

    /// The instance id rows started here carry (cluster mode).
    pub fn runner(&self) -> Option<String> {
        self.runner.get().cloned()
    }

    /// Whether `row` runs in another daemon that is still alive (cluster mode).
    fn elsewhere(&self, row: &R, now: DateTime<Utc>) -> bool {
        match (row.runner(), self.runner.get()) {
            (Some(runner), Some(me)) if runner != me => {
                parlor_bot::session::cluster::instance_alive(self.table.store(), runner, now)
            }
            _ => false,
        }
    }

    /// What time it is.
    pub fn now(&self) -> DateTime<Utc> {
        self.wall_time.now()
    }

    /// The stored rows.
    pub fn table(&self) -> &Rows<R> {
        &self.table
    }

    /// A list tool's answer: the newest 50 rows of `session`, newest first, each as
    /// `json`, under `key` of its data; the message counts them as `plural` and says how
    /// many still run.
    pub fn list_result(
        &self,
        session: &str,
        plural: &str,
        key: &str,
        json: impl Fn(&R) -> serde_json::Value,
    ) -> ToolResult {
        let mut rows = self.table.list(Some(session));
        rows.reverse();
        rows.truncate(50);
        let running = rows.iter().filter(|r| r.phase() == Phase::Running).count();
        let list: Vec<_> = rows.iter().map(json).collect();
        ToolResult::ok_with(
            format!("{} {plural} ({running} running)", list.len()),
            serde_json::json!({ key: list }),
        )
    }

    /// Cancelled once shutdown begins.
    pub fn shutting_down(&self) -> &CancellationToken {
        &self.shutting_down
    }

    /// Takes the rows lock: what changes a row a job's end may change holds it.
    pub async fn lock_rows(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.rows.lock().await
    }

    /// Runs `run` in the tracker shutdown waits for.
    pub fn spawn(&self, run: impl Future<Output = ()> + Send + 'static) {
        self.tracker.spawn(run);
    }

    fn lock_running(&self) -> MutexGuard<'_, HashMap<String, Live<H>>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Jobs this daemon runs now.
    pub fn running(&self) -> usize {
        self.lock_running().len()
    }

    /// Whether this daemon still runs job `id` or is still recording its end (its notice
    /// included).
    pub fn is_live(&self, id: &str) -> bool {
        self.lock_running().contains_key(id)
    }

    /// The handles of every live job.
    pub fn handles(&self) -> Vec<H> {
        self.lock_running()
            .values()
            .map(|l| l.handle.clone())
            .collect()
    }

    /// Job `id` of `session`, when this daemon runs it.
    pub fn live(&self, session: &str, id: &str) -> Option<LiveJob<H>> {
        self.lock_running()
            .get(id)
            .filter(|l| l.session == session)
            .map(|l| LiveJob {
                stop: l.stop.clone(),
                done: l.done.clone(),
                handle: l.handle.clone(),
            })
    }

    /// Claims a running slot for job `id` of `session` under the limits, with `stop` as its
    /// stop token, until [`Jobs::release`]. `start` runs under the same lock as the count,
    /// so two calls never both take the last slot; it gives the slot's handle and what the
    /// caller keeps.
    pub fn claim<T, E>(
        &self,
        id: &str,
        session: &str,
        per_session: usize,
        total: usize,
        stop: CancellationToken,
        start: impl FnOnce() -> Result<(H, T), E>,
    ) -> Result<T, Refusal<E>> {
        let mut running = self.lock_running();
        let here = running.values().filter(|r| r.session == session).count();
        if here >= per_session {
            return Err(Refusal::Session(here));
        }
        if running.len() >= total {
            return Err(Refusal::Total);
        }
        let (handle, kept) = start().map_err(Refusal::Start)?;
        let done = CancellationToken::new();
        running.insert(
            id.to_owned(),
            Live {
                session: session.to_owned(),
                stop,
                done,
                handle,
            },
        );
        Ok(kept)
    }

    /// Frees job `id`'s slot and says its end is recorded.
    pub fn release(&self, id: &str) {
        if let Some(live) = self.lock_running().remove(id) {
            live.done.cancel();
        }
    }

    /// The row `id` of `session` as the model reads it: an ended job's notice, when queued
    /// and not started, is withdrawn, and the row counts as told.
    pub async fn read(&self, session: &str, id: &str) -> Option<R> {
        let _rows = self.rows.lock().await;
        let mut row = self.table.get(session, id)?;
        if row.phase() != Phase::Running {
            let changed = match row.chat().cloned() {
                Some(chat) => {
                    notice::read_before_told(self.notifier.as_ref(), &chat, &mut row).await
                }
                None => !std::mem::replace(&mut row.told_mut().notified, true),
            };
            if changed {
                self.table.save_logged(&row);
            }
        }
        Some(row)
    }

    /// Records job `id`'s end: `end` writes it into the row and returns what to store with
    /// it in the same transaction (what the job spent); `None`: the row is left as it is.
    /// A stopped job counts as told; one that ended by itself tells its chat (unless the
    /// model already read the result); an interrupted one waits for the next start
    /// ([`Jobs::recover`]).
    pub async fn finish(
        &self,
        session: &str,
        id: &str,
        end: impl FnOnce(&mut R) -> Option<Vec<KvWrite>>,
    ) {
        let _rows = self.rows.lock().await;
        let Some((mut row, was)) = self.table.get_raw(session, id) else {
            tracing::error!(
                kind = R::SYSTEM_NAME,
                id,
                "the row of a finished job is missing"
            );
            return;
        };
        let Some(also) = end(&mut row) else {
            return;
        };
        let chat = row.chat().cloned();
        match (row.phase(), &chat) {
            (Phase::Stopped, _) => row.told_mut().notified = true,
            (Phase::Ended, None) if R::TOLD_WITHOUT_CHAT => row.told_mut().notified = true,
            _ => {}
        }
        // The final status is stored before the notice, so a slow notifier never hides it;
        // only over the row as this daemon left it: a daemon that was paused past its lease
        // may find its job recovered (interrupted and told) by another meanwhile.
        let saved = self
            .table
            .save_if(&row, &was, also)
            .and_then(|saved| self.table.flush().map(|()| saved));
        match saved {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(
                    kind = R::SYSTEM_NAME,
                    id,
                    "another daemon recovered this job meanwhile; its end is not recorded here"
                );
                return;
            }
            Err(e) => {
                tracing::error!(kind = R::SYSTEM_NAME, id, error = %e, "cannot store a row");
            }
        }
        if let (Phase::Ended, Some(chat)) = (row.phase(), chat) {
            let text = row.notice_text(None);
            let caller = row.notice_caller();
            if matches!(
                notice::tell_once(self.notifier.as_ref(), &chat, text, caller, &mut row).await,
                Some(notice::Telling::Queued(_) | notice::Telling::GivenUp)
            ) {
                self.table.save_logged(&row);
            }
        }
    }

    /// After a restart: rows still running and not live here belong to a previous daemon;
    /// `lost` sees each (to end what it left behind), then it becomes interrupted. Each
    /// chat is told once, in one notice, of those and of any job that ended during the last
    /// shutdown and was not told yet. Returns how many rows it marked interrupted.
    pub async fn recover(&self, mut lost: impl FnMut(&R)) -> Result<usize, StoreError> {
        let _rows = self.rows.lock().await;
        let now = self.now();
        let live: Vec<String> = self.lock_running().keys().cloned().collect();
        let mut marked = 0;
        let mut to_tell: BTreeMap<String, (ChatRef, Vec<R>)> = BTreeMap::new();
        for (mut row, was) in self.table.list_raw() {
            if live.iter().any(|id| id == row.id()) || self.elsewhere(&row, now) {
                continue;
            }
            // Each change is conditional on the row as read: another daemon recovering the
            // same dead daemon's rows at the same moment changes it first, and it is theirs.
            if row.phase() == Phase::Running {
                lost(&row);
                row.interrupt(now);
                row.told_mut().notified = false;
                if !self.table.save_if(&row, &was, Vec::new())? {
                    continue;
                }
                marked += 1;
            } else if row.phase() == Phase::Stopped || row.told().notified {
                continue;
            } else if row.write()?.value.as_deref() != Some(was.as_str())
                && !self.table.save_if(&row, &was, Vec::new())?
            {
                // Stored as an older version wrote it: rewritten, so the notice's condition
                // compares like with like.
                continue;
            }
            if row.phase() == Phase::Stopped || row.told().notified {
                continue;
            }
            match row.chat().cloned() {
                Some(chat) => to_tell
                    .entry(chat.session_key())
                    .or_insert_with(|| (chat, Vec::new()))
                    .1
                    .push(row),
                None => {
                    row.told_mut().notified = true;
                    self.table.save(&row)?;
                }
            }
        }
        self.table.flush()?;
        self.table
            .tell_chats(
                self.notifier.as_ref(),
                to_tell,
                |row| {
                    let note = (row.phase() == Phase::Interrupted).then_some(R::LOST_NOTE);
                    row.notice_text(note)
                },
                R::notice_caller,
                R::SYSTEM_NAME,
            )
            .await?;
        Ok(marked)
    }

    /// Begins shutdown (every claim's stop token derived from [`Jobs::shutting_down`] is
    /// cancelled) and waits up to `wait` for the runs; `false` when some still run.
    pub async fn shutdown(&self, wait: Duration) -> bool {
        self.shutting_down.cancel();
        self.tracker.close();
        tokio::time::timeout(wait, self.tracker.wait())
            .await
            .is_ok()
    }

    /// Flushes the store at shutdown; a failure is logged.
    pub fn flush_logged(&self) {
        if let Err(e) = self.table.flush() {
            tracing::error!(kind = R::SYSTEM_NAME, error = %e, "cannot flush the store on shutdown");
        }
    }
}

/// Who started a job, with grants of `tools` (its output and stop tools, each naming the
/// job by `arg` = `id`): what its notice turn may do with that one job.
pub(crate) fn starter(
    user_id: &str,
    name: &str,
    role: Role,
    tools: [&str; 2],
    arg: &str,
    id: &str,
) -> Caller {
    Caller {
        user_id: user_id.to_owned(),
        name: name.to_owned(),
        role,
        grants: tools.iter().map(|tool| Grant::new(tool, arg, id)).collect(),
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A new job id: `prefix`, the milliseconds of `now` and a counter, in hex; the counter
/// keeps ids started in the same millisecond apart.
pub(crate) fn new_id(prefix: &str, now: DateTime<Utc>) -> String {
    let millis = now.timestamp_millis().unsigned_abs();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) & 0xfff;
    format!("{prefix}-{millis:x}{n:03x}")
}

/// Cancels `stop` and waits up to `wait` for `done`; `false` when it timed out.
pub(crate) async fn halt(
    stop: &CancellationToken,
    done: &CancellationToken,
    wait: Duration,
) -> bool {
    stop.cancel();
    tokio::time::timeout(wait, done.cancelled()).await.is_ok()
}

/// Implements [`NoticeRow`] and [`JobRow`] for a row type with the fields every kind has
/// (`id`, `session`, `chat`, `started`, `ended`, `told`, a `status` of the enum named, with
/// `Running`, `Stopped` and `Interrupted`, and a `starter()`), so each kind states only
/// what differs: its space, its system name, its note after a restart, whether a chatless
/// end counts as told, its notice block and which statuses end it by itself.
macro_rules! job_row {
    (
        $row:ty, $status:ident {
            space: $space:expr,
            system_name: $system:expr,
            lost_note: $note:expr,
            told_without_chat: $told:expr,
            notice: $block:path,
            ended: [$($ended:ident),+ $(,)?] $(,)?
        }
    ) => {
        impl $crate::notice::NoticeRow for $row {
            const SPACE: &'static str = $space;
            fn id(&self) -> &str {
                &self.id
            }
            fn session(&self) -> &str {
                &self.session
            }
            fn started(&self) -> chrono::DateTime<chrono::Utc> {
                self.started
            }
            fn told(&self) -> &$crate::notice::Told {
                &self.told
            }
            fn told_mut(&mut self) -> &mut $crate::notice::Told {
                &mut self.told
            }
            fn runner(&self) -> Option<&str> {
                self.runner.as_deref()
            }
        }

        impl $crate::jobs::JobRow for $row {
            const SYSTEM_NAME: &'static str = $system;
            const LOST_NOTE: &'static str = $note;
            const TOLD_WITHOUT_CHAT: bool = $told;
            fn chat(&self) -> Option<&parlor_bot::platform::ChatRef> {
                self.chat.as_ref()
            }
            fn phase(&self) -> $crate::jobs::Phase {
                match self.status {
                    $status::Running => $crate::jobs::Phase::Running,
                    $status::Stopped => $crate::jobs::Phase::Stopped,
                    $status::Interrupted => $crate::jobs::Phase::Interrupted,
                    $($status::$ended)|+ => $crate::jobs::Phase::Ended,
                }
            }
            fn interrupt(&mut self, at: chrono::DateTime<chrono::Utc>) {
                self.status = $status::Interrupted;
                self.ended = Some(at);
            }
            fn notice_caller(&self) -> parlor_bot::tool::Caller {
                self.starter()
            }
            fn notice_text(&self, note: Option<&str>) -> String {
                $block(self, note)
            }
        }
    };
}
pub(crate) use job_row;
