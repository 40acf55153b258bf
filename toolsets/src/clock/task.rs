//! The stored records: [`ClockTask`] (space `clocks`, key = task id) and [`ClockRun`] (space
//! `clock_runs`, key = `{task_id}\u{1}{run id, 20 digits}`), each as versioned JSON
//! `{"v":1,...}`.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use parlor_bot::platform::ChatRef;
use parlor_bot::tool::Caller;

/// The schema version written with every record.
pub const RECORD_VERSION: u32 = 1;

/// What happens to due times that passed while the daemon was down (longer ago than
/// [`ClockOptions::late_tolerance`](super::ClockOptions::late_tolerance)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MissedPolicy {
    /// Log one `skipped` run (with the number of missed due times) and wait for the next
    /// due time.
    #[default]
    Skip,
    /// Run once at startup, however many due times were missed.
    CatchUp,
}

impl MissedPolicy {
    /// `skip` or `catch_up`.
    pub fn as_str(self) -> &'static str {
        match self {
            MissedPolicy::Skip => "skip",
            MissedPolicy::CatchUp => "catch_up",
        }
    }
}

/// A clock task as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClockTask {
    /// Unique, assigned in creation order; the model and the log refer to it.
    pub id: u64,
    /// A short name for people ("standup").
    pub name: String,
    /// The schedule text as given (cron, date-time or `every ...`).
    pub schedule: String,
    /// IANA time zone the schedule is read in.
    pub timezone: String,
    /// What the target session is told when the task fires.
    pub content: String,
    /// The chat it fires into.
    pub target: ChatRef,
    /// Who created it (named in the fired text).
    pub creator: Caller,
    /// Session key of the chat it was created in; that chat sees it too.
    pub created_in: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// Start of an `every` schedule: set whenever the schedule changes.
    pub anchor: DateTime<Utc>,
    /// Policy for due times missed while the daemon was down.
    #[serde(default)]
    pub missed: MissedPolicy,
    /// Whether it fires; a one-shot task is disabled after its fire.
    pub enabled: bool,
    /// The next due time; `None` when disabled or finished. Advanced (and flushed) before
    /// each fire is handed to the session: a due time fires at most once.
    pub next_fire: Option<DateTime<Utc>>,
    /// The due time of the latest fire or skip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fire: Option<DateTime<Utc>>,
    /// The status of the latest run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<RunStatus>,
    /// When it was last changed by a tool.
    pub updated_at: DateTime<Utc>,
    /// Why it was paused by something other than a tool (the bot was removed from the
    /// target chat); cleared when it is enabled again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_reason: Option<String>,
}

impl ClockTask {
    /// Whether the chat with session key `session` may see (and its admins change) this
    /// task: it was created there or fires there.
    pub fn visible_from(&self, session: &str) -> bool {
        self.created_in == session || self.target.session_key() == session
    }
}

/// How a run ended (or that it has not yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Handed to the session; no outcome yet. Left behind by a crash, it becomes
    /// `cancelled` at the next start.
    Started,
    /// The reply was posted: the run carries the platform's message ids.
    Ok,
    /// The turn ran but nothing was posted (the model or the platform failed, the queue
    /// was full); `error` says why.
    Failed,
    /// No outcome within the run timeout (the turn may still post later).
    TimedOut,
    /// Due times missed while the daemon was down, not run (policy `skip`).
    Skipped,
    /// Interrupted: shutdown, a crash, or `/stop` in the chat.
    Cancelled,
    /// Several daemons on one store: the chat is held by another daemon, which runs the
    /// fire; its outcome is in that chat, not here.
    HandedOver,
}

impl RunStatus {
    /// The lowercase name used in the log and the tools.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Started => "started",
            RunStatus::Ok => "ok",
            RunStatus::Failed => "failed",
            RunStatus::TimedOut => "timed_out",
            RunStatus::Skipped => "skipped",
            RunStatus::Cancelled => "cancelled",
            RunStatus::HandedOver => "handed_over",
        }
    }
}

/// One entry of a task's run log (the last [`RUNS_KEPT`](super::RUNS_KEPT) are kept).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClockRun {
    /// Unique across tasks, increasing; orders the log.
    pub run: u64,
    /// The task.
    pub task: u64,
    /// Session key of the chat it fired into.
    pub chat: String,
    /// The due time this run is for: for a fire, the latest one due (when several were
    /// missed); for `skipped`, the first one passed over (`missed` says how many).
    pub due: DateTime<Utc>,
    /// When it was handed to the session (or, for `skipped`, recorded).
    pub started: DateTime<Utc>,
    /// When the outcome was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<DateTime<Utc>>,
    /// How it went.
    pub status: RunStatus,
    /// Why it failed, timed out, was skipped or cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The platform's ids of the posted reply: present exactly when `status` is `ok`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub message_ids: Vec<String>,
    /// How many due times this entry stands for beyond one fire: the number skipped
    /// (`skipped`), or caught up by one run (`catch_up`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub missed: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A record with its schema version, as read: `{"v":1, ...fields}`.
#[derive(Deserialize)]
pub(crate) struct Versioned<T> {
    pub(crate) v: u32,
    #[serde(flatten)]
    pub(crate) data: T,
}
