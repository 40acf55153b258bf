//! [`ClockHandle`]: clock tasks and their run logs in the store. The tools change tasks
//! through it; the service reads due tasks, advances them and records runs through it. One
//! lock serializes every read-modify-write, so a tool's update never races a fire's advance.
//!
//! The same lock guards the [`TaskIndex`] of the tasks (the enabled ones by next fire, every
//! one by target chat), loaded from the store when the handle is built: a pass of the service reads from
//! the store only the tasks the index says are due, the earliest due time and the per-chat
//! cap are lookups. The store stays the truth: a write is filed in the index only after it
//! landed (flushed), and a due entry whose record is gone or changed is re-read and filed
//! anew rather than fired. The chat hooks' writes land in the session layer's transaction,
//! out of the handle's sight; they are noted when answered and re-read until the store
//! holds them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use super::index::TaskIndex;
use super::schedule::{Schedule, format_in};
use super::task::{ClockRun, ClockTask, MissedPolicy, RECORD_VERSION, RunStatus, Versioned};
use super::{ClockOptions, RUNS_KEPT};
use crate::time::{UnknownTimezone, parse_timezone};
use parlor_bot::platform::ChatRef;
use parlor_bot::quote;
use parlor_bot::store::{KvWrite, Store, StoreError};
use parlor_bot::tool::Caller;

/// Store space of the tasks (key = id).
pub const TASKS: &str = "clocks";
/// Store space of the run logs (key = `{task}\u{1}{run:020}`).
pub const RUNS: &str = "clock_runs";
/// Store space of the id counters.
const META: &str = "clock_meta";

/// Longest task name, in characters.
pub const MAX_NAME_CHARS: usize = 80;
/// Longest task content, in characters.
pub const MAX_CONTENT_CHARS: usize = 4000;
/// Fire times sampled to check a cron pattern against the interval floor.
const GAP_SAMPLES: usize = 24;
/// Most missed due times counted one by one after an outage (a per-minute task down for a
/// month would otherwise take a while); past it the count says "at least".
const MAX_MISSED_COUNTED: u64 = 10_000;
/// How long a write a chat hook answered is looked for in the store. The event's transaction
/// lands right after the hook returns, or fails, and then the event comes again and the hook
/// answers again; until then each use of the index re-reads the task.
const HOOK_WRITE_WAIT: TimeDelta = TimeDelta::seconds(60);

/// Why a clock operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClockError {
    /// The schedule cannot be used (the reason is for the model).
    #[error("{0}")]
    BadSchedule(String),
    /// The time zone is not an IANA name.
    #[error(transparent)]
    BadTimezone(#[from] UnknownTimezone),
    /// A name or content is empty or too long.
    #[error("{0}")]
    Invalid(String),
    /// The target chat has as many tasks as allowed (paused ones count).
    #[error("{0}")]
    Limit(String),
    /// No task with this id.
    #[error("there is no clock task {0}")]
    NotFound(u64),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a new task is made of (checked by [`ClockHandle::create`]).
#[derive(Debug, Clone)]
pub struct NewClock {
    /// Short name.
    pub name: String,
    /// Cron, date-time or `every ...`.
    pub schedule: String,
    /// What the target session is told.
    pub content: String,
    /// IANA zone; the default zone when `None`.
    pub timezone: Option<String>,
    /// Where it fires.
    pub target: ChatRef,
    /// Who creates it.
    pub creator: Caller,
    /// Session key of the chat it is created in.
    pub created_in: String,
    /// Missed-run policy.
    pub missed: MissedPolicy,
}

/// Changes to a task; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct ClockPatch {
    /// New name.
    pub name: Option<String>,
    /// New schedule (restarts an `every` schedule from now).
    pub schedule: Option<String>,
    /// New content.
    pub content: Option<String>,
    /// New time zone.
    pub timezone: Option<String>,
    /// New target chat.
    pub target: Option<ChatRef>,
    /// New missed-run policy.
    pub missed: Option<MissedPolicy>,
    /// Pause (`false`) or resume (`true`).
    pub enabled: Option<bool>,
}

/// How a fire ended, for its run entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunEnd {
    pub(crate) status: RunStatus,
    /// Why it was not posted.
    pub(crate) error: Option<String>,
    /// The platform's ids of the posted reply.
    pub(crate) message_ids: Vec<String>,
}

impl RunEnd {
    /// Posted, as the messages `message_ids`.
    pub(crate) fn posted(message_ids: Vec<String>) -> Self {
        RunEnd {
            status: RunStatus::Ok,
            error: None,
            message_ids,
        }
    }

    /// Not posted: `status` (failed, timed out, cancelled), and why.
    pub(crate) fn not_posted(status: RunStatus, why: impl Into<String>) -> Self {
        RunEnd {
            status,
            error: Some(why.into()),
            message_ids: Vec::new(),
        }
    }
}

/// A fire the service must hand to the session: the task as advanced, the `started` run
/// logged for it and the due time it stands for.
#[derive(Debug, Clone)]
pub(crate) struct Fire {
    pub(crate) task: ClockTask,
    pub(crate) run: u64,
    pub(crate) due: DateTime<Utc>,
}

struct Shared {
    store: Arc<dyn Store>,
    options: ClockOptions,
    /// Serializes read-modify-write of tasks, runs and counters, and guards the index that
    /// follows them. Never held across an await.
    state: Mutex<State>,
    /// Wakes the service when a task changed (it recomputes the earliest due time).
    changed: Notify,
}

/// What the handle keeps in memory.
struct State {
    /// `None` until loaded: the load at build failed (it is tried again at each use), or a
    /// panic under the lock may have left it half-changed.
    index: Option<TaskIndex>,
    /// Task records a chat hook answered, not yet seen in the store (see [`HOOK_WRITE_WAIT`]).
    answered: HashMap<u64, Answered>,
}

/// A task record a chat hook answered for an event's transaction.
struct Answered {
    /// The record as the hook wrote it: seen in the store, it has landed.
    value: String,
    /// When it was answered.
    at: DateTime<Utc>,
}

/// The clock's tasks in the store; cheap to clone. See the module docs.
#[derive(Clone)]
pub struct ClockHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ClockHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClockHandle")
            .field("options", &self.shared.options)
            .finish_non_exhaustive()
    }
}

impl ClockHandle {
    /// Clock tasks kept in `store`; their index is loaded from it here (and, should that
    /// fail, at the first use that needs it).
    pub fn new(store: Arc<dyn Store>, options: ClockOptions) -> Self {
        let index = match load(store.as_ref()) {
            Ok(index) => Some(index),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the clock tasks yet; trying again at first use");
                None
            }
        };
        ClockHandle {
            shared: Arc::new(Shared {
                store,
                options,
                state: Mutex::new(State {
                    index,
                    answered: HashMap::new(),
                }),
                changed: Notify::new(),
            }),
        }
    }

    /// The options it was made with.
    pub fn options(&self) -> &ClockOptions {
        &self.shared.options
    }

    /// The store it keeps tasks in.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    /// Wall time, from the options' clock source.
    pub fn now(&self) -> DateTime<Utc> {
        self.shared.options.wall_time.now()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        match self.shared.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => {
                // A panic under the lock may have left the index half-changed; the store
                // has everything that landed, so the index is built again from it.
                self.shared.state.clear_poison();
                let mut guard = poisoned.into_inner();
                guard.index = None;
                guard
            }
        }
    }

    /// Drops the index: the next look reads every task from the store again (another
    /// daemon on the same store may have changed them).
    pub(crate) fn reread(&self) {
        self.lock().index = None;
    }

    /// The index, loaded if it is not yet, with the chat hooks' writes that landed since
    /// filed.
    fn index<'a>(&self, state: &'a mut State) -> Result<&'a mut TaskIndex, ClockError> {
        let State { index, answered } = state;
        let loaded = match index.take() {
            Some(loaded) => loaded,
            None => load(self.shared.store.as_ref())?,
        };
        let index = index.insert(loaded);
        if !answered.is_empty() {
            self.settle(index, answered)?;
        }
        Ok(index)
    }

    /// Files the tasks chat hooks answered as the store now has them; drops the notes of
    /// those that landed (or were waited for long enough).
    fn settle(
        &self,
        index: &mut TaskIndex,
        answered: &mut HashMap<u64, Answered>,
    ) -> Result<(), ClockError> {
        let now = self.now();
        let ids: Vec<u64> = answered.keys().copied().collect();
        for id in ids {
            let key = id.to_string();
            let stored = self.shared.store.kv_get(TASKS, &key)?;
            let landed = answered
                .get(&id)
                .is_some_and(|a| stored.as_deref() == Some(a.value.as_str()));
            self.refile(index, id, stored.as_deref());
            if landed
                || answered
                    .get(&id)
                    .is_some_and(|a| now - a.at > HOOK_WRITE_WAIT)
            {
                answered.remove(&id);
            }
        }
        Ok(())
    }

    /// Files task `id` as the store has it (`stored`, the raw record).
    fn refile(&self, index: &mut TaskIndex, id: u64, stored: Option<&str>) {
        match stored.map(|value| decode::<ClockTask>(&id.to_string(), value)) {
            Some(Ok(task)) => index.put(&task),
            Some(Err(e)) => {
                tracing::error!(clock = id, error = %e, "skipping an unreadable clock record");
                index.remove(id);
            }
            None => index.remove(id),
        }
    }

    /// Every task with its record as read, for a chat hook that rewrites some of them.
    pub(crate) fn tasks_as_read(&self) -> Result<Vec<(ClockTask, String)>, ClockError> {
        let mut tasks: Vec<(ClockTask, String)> = self
            .shared
            .store
            .kv_scan(TASKS, "")?
            .into_iter()
            .filter_map(|(key, value)| match decode::<ClockTask>(&key, &value) {
                Ok(task) => Some((task, value)),
                Err(e) => {
                    tracing::error!(error = %e, "skipping an unreadable clock record");
                    None
                }
            })
            .collect();
        tasks.sort_by_key(|(t, _)| t.id);
        Ok(tasks)
    }

    /// The writes a chat hook answers for `tasks` as changed (each with its record as the
    /// hook read it): they land in the event's transaction, which the session layer
    /// commits after the hook returned, so each is noted here and filed in the index once
    /// the store holds it. Each is conditional on the record read: a fire or a tool's
    /// update landing in between refuses the transaction (the session layer asks the hook
    /// again) rather than be overwritten by the stale copy.
    pub(crate) fn hook_writes(&self, tasks: &[(ClockTask, String)]) -> Vec<KvWrite> {
        let now = self.now();
        let mut state = self.lock();
        tasks
            .iter()
            .map(|(task, read)| {
                let value = encode(task);
                state.answered.insert(
                    task.id,
                    Answered {
                        value: value.clone(),
                        at: now,
                    },
                );
                KvWrite {
                    space: TASKS.to_owned(),
                    key: task.id.to_string(),
                    value: Some(value),
                    if_unchanged: Some(Some(read.clone())),
                }
            })
            .collect()
    }

    /// Where the in-memory index of the tasks differs from the store (each task's
    /// next fire and target chat), one line per difference; empty when they agree. For tests
    /// and diagnostics: it reads every task.
    pub fn index_mismatches(&self) -> Result<Vec<String>, ClockError> {
        let mut state = self.lock();
        let index = self.index(&mut state)?;
        let truth = load(self.shared.store.as_ref())?;
        Ok(index.mismatches(&truth))
    }

    pub(crate) fn changed(&self) -> &Notify {
        &self.shared.changed
    }

    fn notify(&self) {
        // `notify_one` keeps a permit when the service is not waiting yet: no change is lost.
        self.shared.changed.notify_one();
    }

    /// Every task, by id.
    pub fn tasks(&self) -> Result<Vec<ClockTask>, ClockError> {
        let mut tasks: Vec<ClockTask> = decode_all(self.shared.store.kv_scan(TASKS, "")?);
        tasks.sort_by_key(|t| t.id);
        Ok(tasks)
    }

    /// One task.
    pub fn task(&self, id: u64) -> Result<Option<ClockTask>, ClockError> {
        let key = id.to_string();
        match self.shared.store.kv_get(TASKS, &key)? {
            Some(value) => Ok(Some(decode(&key, &value)?)),
            None => Ok(None),
        }
    }

    /// The parsed schedule of a task.
    pub fn schedule_of(&self, task: &ClockTask) -> Result<Schedule, ClockError> {
        let tz = parse_timezone(&task.timezone)?;
        Schedule::parse(&task.schedule, tz, task.anchor)
            .map_err(|e| ClockError::BadSchedule(e.to_string()))
    }

    /// The next `n` fire times of an enabled task, from its stored `next_fire` on.
    pub fn upcoming(&self, task: &ClockTask, n: usize) -> Vec<DateTime<Utc>> {
        let (Some(first), Ok(schedule)) = (task.next_fire, self.schedule_of(task)) else {
            return Vec::new();
        };
        let mut out = vec![first];
        out.extend(schedule.next_n(first, n.saturating_sub(1)));
        out
    }

    /// A task's run log, newest first, at most `limit` entries.
    pub fn runs(&self, task: u64, limit: usize) -> Result<Vec<ClockRun>, ClockError> {
        let mut runs = self.scan_runs(&format!("{task}\u{1}"))?;
        runs.reverse();
        runs.truncate(limit);
        Ok(runs)
    }

    fn scan_runs(&self, prefix: &str) -> Result<Vec<ClockRun>, ClockError> {
        Ok(decode_all(self.shared.store.kv_scan(RUNS, prefix)?))
    }

    /// Creates a task: checks the name, content, time zone, schedule (its next fire must
    /// exist and its fires be at least `min_interval` apart) and the target chat's cap.
    /// Whether the creator may do this is the caller's business (the tools check it).
    pub fn create(&self, new: NewClock) -> Result<ClockTask, ClockError> {
        let name = check_name(&new.name)?;
        let content = check_text("content", &new.content, MAX_CONTENT_CHARS)?;
        let tz = self.timezone(new.timezone.as_deref())?;
        let now = self.now();
        let schedule = self.check_schedule(&new.schedule, tz, now)?;
        let next = first_fire(&schedule, now)?;
        let task = {
            let mut state = self.lock();
            let index = self.index(&mut state)?;
            self.check_cap(index, &new.target, None)?;
            let id = self.next_id("next_task")?;
            let task = ClockTask {
                id,
                name,
                schedule: schedule.text().to_owned(),
                timezone: tz.name().to_owned(),
                content,
                target: new.target,
                creator: new.creator,
                created_in: new.created_in,
                created_at: now,
                anchor: now,
                missed: new.missed,
                enabled: true,
                next_fire: Some(next),
                last_fire: None,
                last_status: None,
                updated_at: now,
                paused_reason: None,
            };
            self.put_task(&task)?;
            self.shared.store.flush()?;
            index.put(&task);
            task
        };
        tracing::info!(clock = task.id, name = %task.name, target = %task.target, next = %next, "clock task created");
        self.notify();
        Ok(task)
    }

    /// Changes a task. A new schedule or time zone restarts it from now; resuming a paused
    /// task computes its next fire from now; moving it to another chat checks that chat's
    /// cap (resuming does not: a paused task already counts).
    pub fn update(&self, id: u64, patch: ClockPatch) -> Result<ClockTask, ClockError> {
        let now = self.now();
        let task = {
            let mut state = self.lock();
            let mut task = self.task(id)?.ok_or(ClockError::NotFound(id))?;
            let was_enabled = task.enabled;
            if let Some(name) = &patch.name {
                task.name = check_name(name)?;
            }
            if let Some(content) = &patch.content {
                task.content = check_text("content", content, MAX_CONTENT_CHARS)?;
            }
            if let Some(missed) = patch.missed {
                task.missed = missed;
            }
            let retimed = patch.schedule.is_some() || patch.timezone.is_some();
            if let Some(tz) = &patch.timezone {
                task.timezone = self.timezone(Some(tz))?.name().to_owned();
            }
            let moved = patch
                .target
                .as_ref()
                .is_some_and(|target| *target != task.target);
            if let Some(target) = patch.target {
                task.target = target;
            }
            let tz = self.timezone(Some(&task.timezone))?;
            let schedule = if retimed {
                let text = patch.schedule.as_deref().unwrap_or(&task.schedule);
                let schedule = self.check_schedule(text, tz, now)?;
                task.schedule = schedule.text().to_owned();
                task.anchor = now;
                schedule
            } else {
                self.schedule_of(&task)?
            };
            task.enabled = patch.enabled.unwrap_or(task.enabled);
            if task.enabled {
                task.paused_reason = None;
                if retimed || !was_enabled || task.next_fire.is_none() {
                    task.next_fire = Some(first_fire(&schedule, now)?);
                }
            } else {
                task.next_fire = None;
            }
            // Every task counts toward its chat's cap, paused or not: resuming one changes
            // no count, moving one does.
            if moved {
                self.check_cap(self.index(&mut state)?, &task.target, Some(id))?;
            }
            task.updated_at = now;
            self.put_task(&task)?;
            self.shared.store.flush()?;
            if let Some(index) = state.index.as_mut() {
                index.put(&task);
            }
            task
        };
        tracing::info!(clock = id, enabled = task.enabled, target = %task.target, "clock task updated");
        self.notify();
        Ok(task)
    }

    /// Deletes a task and its run log; the task as it was.
    pub fn delete(&self, id: u64) -> Result<ClockTask, ClockError> {
        let task = {
            let mut state = self.lock();
            let task = self.task(id)?.ok_or(ClockError::NotFound(id))?;
            let store = &self.shared.store;
            store.kv_delete(TASKS, &id.to_string())?;
            for (key, _) in store.kv_scan(RUNS, &format!("{id}\u{1}"))? {
                store.kv_delete(RUNS, &key)?;
            }
            store.flush()?;
            if let Some(index) = state.index.as_mut() {
                index.remove(id);
            }
            task
        };
        tracing::info!(clock = id, "clock task deleted");
        self.notify();
        Ok(task)
    }

    fn timezone(&self, name: Option<&str>) -> Result<Tz, ClockError> {
        match name.map(str::trim) {
            Some(name) if !name.is_empty() => Ok(parse_timezone(name)?),
            _ => Ok(self.shared.options.default_timezone),
        }
    }

    /// Parses a schedule and holds it to the interval floor.
    fn check_schedule(
        &self,
        text: &str,
        tz: Tz,
        now: DateTime<Utc>,
    ) -> Result<Schedule, ClockError> {
        let schedule =
            Schedule::parse(text, tz, now).map_err(|e| ClockError::BadSchedule(e.to_string()))?;
        let floor = self.shared.options.min_interval;
        let gap = schedule
            .period()
            .or_else(|| schedule.shortest_gap(now, GAP_SAMPLES));
        if let Some(gap) = gap
            && gap < floor
        {
            return Err(ClockError::BadSchedule(format!(
                "{:?} fires every {} s; the shortest interval allowed is {} s",
                schedule.text(),
                gap.as_secs(),
                floor.as_secs()
            )));
        }
        Ok(schedule)
    }

    /// Refuses a task for `target` when that chat already has the most tasks, paused and
    /// finished ones included (`except` is the task being changed).
    fn check_cap(
        &self,
        index: &TaskIndex,
        target: &ChatRef,
        except: Option<u64>,
    ) -> Result<(), ClockError> {
        let max = self.shared.options.max_tasks_per_chat;
        let count = index.tasks_for(target, except);
        if count >= max {
            return Err(ClockError::Limit(format!(
                "{target} already has {count} clock tasks (paused and finished ones count \
                 too), the most allowed; delete one first (clock_list shows them)"
            )));
        }
        Ok(())
    }

    /// The next number of `counter`, taken by compare-and-set: daemons sharing the store
    /// never hand out one twice.
    fn next_id(&self, counter: &str) -> Result<u64, ClockError> {
        let store = &self.shared.store;
        loop {
            let stored = store.kv_get(META, counter)?;
            let current = match &stored {
                Some(text) => text
                    .trim()
                    .parse::<u64>()
                    .map_err(|e| StoreError::Corrupt {
                        key: format!("{META}/{counter}"),
                        reason: e.to_string(),
                    })?,
                None => 0,
            };
            let next = current + 1;
            let taken = store.kv_write(vec![KvWrite {
                space: META.to_owned(),
                key: counter.to_owned(),
                value: Some(next.to_string()),
                if_unchanged: Some(stored),
            }]);
            match taken {
                Ok(()) => return Ok(next),
                // Another daemon took it first: read again.
                Err(StoreError::Changed(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn put_task(&self, task: &ClockTask) -> Result<(), ClockError> {
        self.shared
            .store
            .kv_put(TASKS, &task.id.to_string(), &encode(task))?;
        Ok(())
    }

    /// The writes that append `run` to its task's log (its id assigned here, returned)
    /// and drop the oldest past [`RUNS_KEPT`], for a transaction of the caller's.
    fn run_writes(&self, mut run: ClockRun) -> Result<(u64, Vec<KvWrite>), ClockError> {
        run.run = self.next_id("next_run")?;
        let store = &self.shared.store;
        let mut writes = vec![KvWrite {
            space: RUNS.to_owned(),
            key: run_key(run.task, run.run),
            value: Some(encode(&run)),
            if_unchanged: None,
        }];
        let prefix = format!("{}\u{1}", run.task);
        let keys = store.kv_scan(RUNS, &prefix)?;
        // With the new one, one more than stored.
        if keys.len() + 1 > RUNS_KEPT {
            for (key, _) in &keys[..keys.len() + 1 - RUNS_KEPT] {
                writes.push(KvWrite {
                    space: RUNS.to_owned(),
                    key: key.clone(),
                    value: None,
                    if_unchanged: None,
                });
            }
        }
        Ok((run.run, writes))
    }

    /// At startup: runs left `started` by a crash or a kill become `cancelled`.
    pub(crate) fn recover_interrupted(&self) -> Result<usize, ClockError> {
        let now = self.now();
        let _state = self.lock();
        let mut count = 0;
        for mut run in self.scan_runs("")? {
            if run.status != RunStatus::Started {
                continue;
            }
            run.status = RunStatus::Cancelled;
            run.ended = Some(now);
            run.error = Some(
                "interrupted: the daemon stopped before the run finished; if the text had \
                 reached the chat's queue, the chat answers it after the restart, outside \
                 this log"
                    .to_owned(),
            );
            self.shared
                .store
                .kv_put(RUNS, &run_key(run.task, run.run), &encode(&run))?;
            if let Some(mut task) = self.task(run.task)?
                && task.last_status == Some(RunStatus::Started)
            {
                task.last_status = Some(RunStatus::Cancelled);
                self.put_task(&task)?;
            }
            count += 1;
        }
        if count > 0 {
            self.shared.store.flush()?;
        }
        Ok(count)
    }

    /// Records the outcome of a fire: its run entry and the task's `last_status`.
    pub(crate) fn finish_run(&self, task: u64, run: u64, end: RunEnd) -> Result<(), ClockError> {
        let now = self.now();
        let _state = self.lock();
        self.finish_run_locked(task, run, end, now)?;
        self.shared.store.flush()?;
        Ok(())
    }

    /// [`finish_run`](Self::finish_run) for a caller holding the lock; no flush.
    fn finish_run_locked(
        &self,
        task: u64,
        run: u64,
        end: RunEnd,
        now: DateTime<Utc>,
    ) -> Result<(), ClockError> {
        let RunEnd {
            status,
            error,
            message_ids,
        } = end;
        let key = run_key(task, run);
        let Some(value) = self.shared.store.kv_get(RUNS, &key)? else {
            // The task was deleted meanwhile (its log with it).
            return Ok(());
        };
        let mut entry: ClockRun = decode(&key, &value)?;
        entry.status = status;
        entry.ended = Some(now);
        entry.error = error;
        entry.message_ids = message_ids;
        self.shared.store.kv_put(RUNS, &key, &encode(&entry))?;
        if let Some(mut t) = self.task(task)?
            && t.last_fire == Some(entry.due)
        {
            t.last_status = Some(status);
            self.put_task(&t)?;
        }
        Ok(())
    }

    /// The earliest `next_fire` of the enabled tasks, from the index (`None` while it cannot
    /// be loaded). A chat hook's pause not yet filed can make it early: the pass it causes
    /// re-reads the task and fires nothing.
    pub(crate) fn earliest(&self) -> Option<DateTime<Utc>> {
        self.lock().index.as_ref().and_then(TaskIndex::earliest)
    }

    /// Takes every task due at `now`: advances its `next_fire` past `now`, logs a `started`
    /// run for the fire (and a `skipped` one for due times passed over), flushes — and only
    /// then returns the fires to hand to the sessions. A due time older than the late
    /// tolerance (missed while the daemon was down) follows the task's missed policy.
    ///
    /// Only the tasks the index has due are read. Each is re-read from the store, which is
    /// the truth: one that is gone, unreadable, or no longer due is filed as the store has
    /// it and not fired. The tasks advanced are filed after the flush; should a write or
    /// the flush fail, the index keeps them due and the next pass re-reads them.
    pub(crate) fn take_due(&self, now: DateTime<Utc>) -> Result<Vec<Fire>, ClockError> {
        let tolerance =
            TimeDelta::from_std(self.shared.options.late_tolerance).unwrap_or(TimeDelta::MAX);
        let mut state = self.lock();
        let index = self.index(&mut state)?;
        let mut fires = Vec::new();
        // Every task written by this pass, to be filed once the writes are durable.
        let mut written = Vec::new();
        for id in index.due(now) {
            let key = id.to_string();
            let stored = self.shared.store.kv_get(TASKS, &key)?;
            let Some(Ok(mut task)) = stored.as_deref().map(|v| decode::<ClockTask>(&key, v)) else {
                // Deleted or damaged since it was filed.
                self.refile(index, id, stored.as_deref());
                continue;
            };
            let Some(first) = task.next_fire.filter(|t| task.enabled && *t <= now) else {
                // Changed since it was filed (a chat hook paused it): filed as it is.
                index.put(&task);
                continue;
            };
            let schedule = match self.schedule_of(&task) {
                Ok(s) => s,
                Err(e) => {
                    // Only possible for a record written by hand or a newer version.
                    tracing::error!(clock = task.id, error = %e, "unreadable schedule; disabling the task");
                    task.enabled = false;
                    task.next_fire = None;
                    self.put_task(&task)?;
                    written.push(task);
                    continue;
                }
            };
            // Every due time from `first` up to now.
            let mut latest = first;
            let mut count: u64 = 1;
            while count < MAX_MISSED_COUNTED {
                match schedule.next_after(latest) {
                    Some(next) if next <= now => {
                        latest = next;
                        count += 1;
                    }
                    _ => break,
                }
            }
            let on_time = now - latest <= tolerance;
            let fire = on_time || task.missed == MissedPolicy::CatchUp;
            let chat = task.target.session_key();
            let tz = schedule.timezone();
            let mut claim = Vec::new();
            let skipped = if fire { count - 1 } else { count };
            if task.missed == MissedPolicy::Skip && skipped > 0 {
                let last_skipped = if fire {
                    schedule_before(&schedule, first, latest)
                } else {
                    latest
                };
                let more = if count >= MAX_MISSED_COUNTED {
                    "at least "
                } else {
                    ""
                };
                let (_, skip_writes) = self.run_writes(ClockRun {
                    run: 0,
                    task: task.id,
                    chat: chat.clone(),
                    due: first,
                    started: now,
                    ended: Some(now),
                    status: RunStatus::Skipped,
                    error: Some(format!(
                        "{more}{skipped} due time(s) from {} to {} passed while the daemon was \
                         down; skipped (policy skip)",
                        format_in(first, tz),
                        format_in(last_skipped, tz)
                    )),
                    message_ids: Vec::new(),
                    missed: skipped,
                })?;
                claim.extend(skip_writes);
                task.last_status = Some(RunStatus::Skipped);
            }
            let mut run = None;
            if fire {
                let (id, run_writes) = self.run_writes(ClockRun {
                    run: 0,
                    task: task.id,
                    chat,
                    due: latest,
                    started: now,
                    ended: None,
                    status: RunStatus::Started,
                    error: None,
                    message_ids: Vec::new(),
                    missed: if task.missed == MissedPolicy::CatchUp {
                        count - 1
                    } else {
                        0
                    },
                })?;
                claim.extend(run_writes);
                run = Some(id);
                task.last_status = Some(RunStatus::Started);
            }
            task.last_fire = Some(latest);
            task.next_fire = schedule.next_after(now);
            if task.next_fire.is_none() {
                // A one-shot task after its fire (or skip): kept, disabled, so its log stays
                // readable.
                task.enabled = false;
            }
            // The claim of this due time: the advance, on condition that the task is as
            // read, with its runs, in one transaction. Another daemon on the same store
            // that claimed it first makes this one fail: filed as it now is, not fired.
            claim.push(KvWrite {
                space: TASKS.to_owned(),
                key: key.clone(),
                value: Some(encode(&task)),
                if_unchanged: Some(stored.clone()),
            });
            match self.shared.store.kv_write(claim) {
                Ok(()) => {}
                Err(StoreError::Changed(_)) => {
                    tracing::debug!(clock = task.id, "due time claimed elsewhere");
                    let now_stored = self.shared.store.kv_get(TASKS, &key)?;
                    self.refile(index, id, now_stored.as_deref());
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
            if let Some(run) = run {
                fires.push(Fire {
                    task: task.clone(),
                    run,
                    due: latest,
                });
            }
            written.push(task);
        }
        // The advance is durable before any fire leaves: at most once per due time.
        if let Err(e) = self.shared.store.flush() {
            for fire in &fires {
                let why = format!("not fired: the store could not make the advance durable ({e})");
                let end = RunEnd::not_posted(RunStatus::Failed, why);
                self.finish_run_locked(fire.task.id, fire.run, end, now)?;
            }
            return Err(e.into());
        }
        for task in &written {
            index.put(task);
        }
        Ok(fires)
    }
}

/// The due time before `latest` (for a skipped range ending just before a fire); `first`
/// when there is none in between.
fn schedule_before(
    schedule: &Schedule,
    first: DateTime<Utc>,
    latest: DateTime<Utc>,
) -> DateTime<Utc> {
    let mut cursor = first;
    let mut count = 0;
    while let Some(next) = schedule.next_after(cursor) {
        if next >= latest || count >= MAX_MISSED_COUNTED {
            break;
        }
        cursor = next;
        count += 1;
    }
    cursor
}

/// The first fire after `now`, or why there is none.
fn first_fire(schedule: &Schedule, now: DateTime<Utc>) -> Result<DateTime<Utc>, ClockError> {
    schedule.next_after(now).ok_or_else(|| {
        ClockError::BadSchedule(if schedule.is_one_shot() {
            format!(
                "{} is in the past (it is now {})",
                schedule.text(),
                schedule.local(now)
            )
        } else {
            format!("{:?} never fires after now", schedule.text())
        })
    })
}

fn check_text(what: &str, text: &str, max: usize) -> Result<String, ClockError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(ClockError::Invalid(format!("the {what} is empty")));
    }
    let len = text.chars().count();
    if len > max {
        return Err(ClockError::Invalid(format!(
            "the {what} has {len} characters; at most {max} are allowed"
        )));
    }
    Ok(text.to_owned())
}

/// A task's name is shown on one line of the text it fires with: a line break in it could
/// start a line that reads as someone's message (`parlor_bot::quote`).
fn check_name(name: &str) -> Result<String, ClockError> {
    if quote::has_breaks(name) {
        return Err(ClockError::Invalid(
            "the name contains a line break or another control character; give the task a \
             short one-line name and put the rest in its content"
                .to_owned(),
        ));
    }
    check_text("name", name, MAX_NAME_CHARS)
}

fn run_key(task: u64, run: u64) -> String {
    format!("{task}\u{1}{run:020}")
}

pub(crate) fn encode<T: Serialize>(data: &T) -> String {
    // Records of strings, numbers and dates always serialize to an object.
    let mut value = serde_json::to_value(data).unwrap_or_default();
    if let Some(object) = value.as_object_mut() {
        object.insert("v".to_owned(), RECORD_VERSION.into());
    }
    value.to_string()
}

/// The index of the tasks in `store`.
fn load(store: &dyn Store) -> Result<TaskIndex, ClockError> {
    Ok(TaskIndex::of(decode_all::<ClockTask>(
        store.kv_scan(TASKS, "")?,
    )))
}

/// Every record that decodes; one that does not is logged and left alone, so a damaged
/// record never stops the other tasks.
fn decode_all<T: DeserializeOwned>(records: Vec<(String, String)>) -> Vec<T> {
    records
        .into_iter()
        .filter_map(|(key, value)| match decode(&key, &value) {
            Ok(record) => Some(record),
            Err(e) => {
                tracing::error!(error = %e, "skipping an unreadable clock record");
                None
            }
        })
        .collect()
}

fn decode<T: DeserializeOwned>(key: &str, value: &str) -> Result<T, ClockError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        key: key.replace('\u{1}', "/"),
        reason,
    };
    let record: Versioned<T> = serde_json::from_str(value).map_err(|e| corrupt(e.to_string()))?;
    if record.v != RECORD_VERSION {
        return Err(corrupt(format!(
            "schema version {} (this build reads {RECORD_VERSION})",
            record.v
        ))
        .into());
    }
    Ok(record.data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::WallTime;
    use parlor_bot::store::MemoryStore;
    use parlor_bot::testing::CrashStore;
    use parlor_bot::tool::Role;

    /// Two daemons read a due task at the same moment: the one that writes second finds the
    /// record changed, and neither the fire nor its run is written twice.
    #[test]
    fn a_due_time_read_by_two_daemons_at_once_is_claimed_by_one() {
        let start = "2026-06-01T08:00:00Z".parse::<DateTime<Utc>>().unwrap();
        let clock = WallTime::anchored_at(start);
        let options = ClockOptions {
            wall_time: clock.clone(),
            ..ClockOptions::default()
        };
        let shared = Arc::new(MemoryStore::new());
        let store_a = CrashStore::new(Arc::clone(&shared), usize::MAX);
        let a = ClockHandle::new(store_a.clone() as Arc<dyn Store>, options.clone());
        let b = ClockHandle::new(Arc::clone(&shared) as Arc<dyn Store>, options);
        let target = ChatRef::new("test", "-1");
        let task = a
            .create(NewClock {
                name: "tick".into(),
                schedule: "every 1m".into(),
                content: "tick".into(),
                timezone: None,
                created_in: target.session_key(),
                target,
                creator: Caller {
                    user_id: "test:alice".into(),
                    name: "alice".into(),
                    role: Role::ChatAdmin,
                    grants: Vec::new(),
                },
                missed: MissedPolicy::Skip,
            })
            .unwrap();
        b.reread();
        let due = start + TimeDelta::seconds(61);
        let b2 = b.clone();
        // B claims the due time right after A read the task, before A writes.
        store_a.after_next_read(TASKS, move || {
            assert_eq!(b2.take_due(due).unwrap().len(), 1, "B fires");
        });
        assert!(a.take_due(due).unwrap().is_empty(), "A does not");
        assert_eq!(a.runs(task.id, 10).unwrap().len(), 1);
        // A filed the task as B left it: the next due time, not this one again.
        assert!(a.take_due(due).unwrap().is_empty());
    }
}
