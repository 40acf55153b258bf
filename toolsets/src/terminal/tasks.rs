//! Background tasks: their rows in the store, the watcher of each, completion notices,
//! `task_output` / `task_stop` / `task_list`, recovery after a restart and shutdown.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::output::{Capped, cap_middle, read_log_tail, tail_chars, xml_escape};
use super::{
    ShellArgs, TASKS_SPACE, TaskOutputArgs, TaskStopArgs, TerminalService, codes, create_dir, sys,
};
use crate::jobs::{self, Refusal, halt, job_row, new_id};
use crate::notice::{self, QUOTED, Told};
use crate::support::Outcome;
use parlor_bot::platform::ChatRef;
use parlor_bot::quote;
use parlor_bot::store::StoreError;
use parlor_bot::tool::{Caller, Role, ToolContext, ToolError, ToolResult};

/// Characters of output a completion notice carries.
pub const NOTICE_OUTPUT_CHARS: usize = 2000;

/// The state of a background task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Still running.
    Running,
    /// Ended with exit code 0.
    Completed,
    /// Ended with another exit code, or by a signal.
    Failed,
    /// Killed after the maximum run time.
    TimedOut,
    /// Stopped with `task_stop`.
    Stopped,
    /// The daemon stopped (or crashed) while it ran.
    Interrupted,
}

impl TaskStatus {
    /// The name the model sees.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Running => "running",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::TimedOut => "timed_out",
            TaskStatus::Stopped => "stopped",
            TaskStatus::Interrupted => "interrupted",
        }
    }
}

/// One background task, as stored (`{"v":1,...}` under `<session>|<task_id>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Schema version (1).
    pub v: u32,
    /// The task's id (`task-…`).
    pub id: String,
    /// Session key of the chat that started it.
    pub session: String,
    /// Where its completion notice goes; `None` outside a chat.
    #[serde(default)]
    pub chat: Option<ChatRef>,
    /// The command line.
    pub command: String,
    /// What it does, as the model described it.
    #[serde(default)]
    pub description: Option<String>,
    /// Platform-qualified id of who asked for it.
    pub started_by: String,
    /// Their display name.
    #[serde(default)]
    pub started_by_name: String,
    /// Their role when they started it; its completion notice runs with it. Rows written
    /// before roles were stored read as [`Role::Member`], which may not read them back.
    #[serde(default)]
    pub started_by_role: Role,
    /// Current state.
    pub status: TaskStatus,
    /// Exit code, when it exited normally.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    #[serde(default)]
    pub signal: Option<i32>,
    /// When it started.
    pub started: DateTime<Utc>,
    /// When it ended.
    #[serde(default)]
    pub ended: Option<DateTime<Utc>>,
    /// Its output (stdout and stderr).
    pub log_path: PathBuf,
    /// Its process group (its `bash -c` leader's pid).
    #[serde(default)]
    pub pgid: u32,
    /// Where it stands with its chat: its completion notice's pending id, whether that was
    /// withdrawn (the output read with `task_output` first), whether the chat was told.
    #[serde(flatten)]
    pub told: Told,
    /// The daemon running it, with several on one store (`[cluster]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<String>,
}

job_row!(
    TaskRecord,
    TaskStatus {
        space: TASKS_SPACE,
        system_name: "terminal",
        lost_note: "the bot was restarted while this task ran; the task was stopped and did not \
                finish",
        // A chatless task is marked told when it is read or at the next start.
        told_without_chat: false,
        notice: notice_block,
        ended: [Completed, Failed, TimedOut],
    }
);

/// The whole log, at most `max_chars` characters (its head and tail when longer).
fn read_log_capped(path: &Path, max_chars: usize) -> std::io::Result<Capped> {
    let budget = (max_chars as u64).saturating_mul(4).max(4096);
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    if size <= budget {
        let (text, _) = read_log_tail(path, budget)?;
        return Ok(cap_middle(&text, max_chars));
    }
    let mut head = Vec::new();
    std::fs::File::open(path)?
        .take(budget / 2)
        .read_to_end(&mut head)?;
    let head: String = String::from_utf8_lossy(&head)
        .chars()
        .take(max_chars / 2)
        .collect();
    let (tail, _) = read_log_tail(path, budget / 2)?;
    let (tail, _) = tail_chars(&tail, max_chars / 2);
    let cut = usize::try_from(size)
        .unwrap_or(usize::MAX)
        .saturating_sub(head.len() + tail.len());
    Ok(Capped {
        text: format!("{head}\n[... about {cut} characters cut ...]\n{tail}"),
        total_chars: cut + head.chars().count() + tail.chars().count(),
        cut_chars: cut,
    })
}

/// One `<TERMINAL_TASK_RESULT>` block: the last [`NOTICE_OUTPUT_CHARS`] characters of the
/// output, every value XML-escaped. The description (or the command) and the output are
/// text the program did not write: each is quoted under its own tag line, every line
/// indented, so none can read as someone's message (`parlor_bot::quote`).
pub fn notice_block(row: &TaskRecord, note: Option<&str>) -> String {
    let (text, size) =
        read_log_tail(&row.log_path, (NOTICE_OUTPUT_CHARS as u64) * 4).unwrap_or_default();
    let (output, cut) = tail_chars(&text, NOTICE_OUTPUT_CHARS);
    let block = format!(
        "<TERMINAL_TASK_RESULT>\n  <task_id>{}</task_id><status>{}</status><exit_code>{}</exit_code>\n  <description>\n{}\n  </description>\n  <output>\n{}\n  </output>\n",
        xml_escape(&row.id),
        row.status.as_str(),
        row.exit_code.map(|c| c.to_string()).unwrap_or_default(),
        quote::block_with(
            &xml_escape(row.description.as_deref().unwrap_or(&row.command)),
            QUOTED
        ),
        quote::block_with(&xml_escape(output.trim_end_matches('\n')), QUOTED),
    );
    let mut notes = Vec::new();
    if cut > 0 || size > (NOTICE_OUTPUT_CHARS as u64) * 4 {
        notes.push(format!(
            "only the end of the output is shown (the log has {size} bytes); task_output \
             reads more"
        ));
    }
    if let Some(sig) = row.signal {
        notes.push(format!("ended by signal {sig}"));
    }
    notice::end_block(block, notes, note, "TERMINAL_TASK_RESULT")
}

fn row_json(row: &TaskRecord) -> serde_json::Value {
    json!({
        "task_id": row.id,
        "status": row.status.as_str(),
        "description": row.description,
        "command": row.command,
        "exit_code": row.exit_code,
        "started": row.started.to_rfc3339(),
        "ended": row.ended.map(|t| t.to_rfc3339()),
    })
}

/// How a watched task ended.
enum End {
    Exited(Option<ExitStatus>),
    TimedOut,
    Stopped,
    Shutdown,
}

impl TerminalService {
    /// A task row of `session`.
    pub fn task(&self, session: &str, id: &str) -> Option<TaskRecord> {
        self.jobs.table().get(session, id)
    }

    /// Whether this daemon still runs the task or is still recording its end (its notice
    /// included).
    pub fn is_live(&self, task_id: &str) -> bool {
        self.jobs.is_live(task_id)
    }

    /// Every task row of `session` (or of every session with `None`), oldest first.
    pub fn tasks(&self, session: Option<&str>) -> Vec<TaskRecord> {
        self.jobs.table().list(session)
    }

    /// `shell(run_in_background=true)`: starts the task and its watcher.
    pub(crate) async fn start_background(
        self: &Arc<Self>,
        args: ShellArgs,
        cx: &ToolContext,
    ) -> Outcome {
        let workspace = self.ensure_workspace(&cx.session)?;
        let logs = self.config.data_dir.join("task_logs");
        create_dir(&logs, "the task log directory", "the task could not start")?;
        let id = new_id("task", self.jobs.now());
        let log_path = logs.join(format!("{id}.log"));
        let mut command = self
            .command(&workspace, &[], &["-c", &args.command])
            .map_err(|why| ToolError::unavailable(why.to_string()))?;
        let (out, err) = match std::fs::File::create(&log_path)
            .and_then(|f| f.try_clone().map(|g| (f, g)))
        {
            Ok(files) => files,
            Err(e) => {
                tracing::error!(error = %e, log = %log_path.display(), "cannot create the task log");
                return Err(ToolError::internal("the task could not start"));
            }
        };
        command
            .env("PARLOR_TASK_ID", &id)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(true);
        // Its own stop token, not one under shutdown: the watcher tells a stop from a
        // shutdown by which of the two fired.
        let stop = CancellationToken::new();
        let claimed = self.jobs.claim(
            &id,
            &cx.session,
            self.config.max_background_per_session,
            self.config.max_background_total,
            stop.clone(),
            || -> std::io::Result<_> {
                let child = command.spawn()?;
                let pgid = child.id().unwrap_or(0);
                Ok((pgid, (child, pgid)))
            },
        );
        let (child, pgid) = match claimed {
            Ok(claimed) => claimed,
            Err(Refusal::Session(here)) => {
                return Err(ToolError::new(
                    codes::TASK_LIMIT,
                    format!(
                        "{here} background tasks are already running in this chat (the limit); \
                         wait for one to end or stop one with task_stop"
                    ),
                ));
            }
            Err(Refusal::Total) => {
                return Err(ToolError::new(
                    codes::TASK_LIMIT,
                    "the bot is running as many background tasks as it may; try again later",
                ));
            }
            Err(Refusal::Start(e)) => {
                tracing::error!(error = %e, "cannot start a background task");
                return Err(ToolError::unavailable("the task could not be started"));
            }
        };
        let row = TaskRecord {
            v: 1,
            id: id.clone(),
            session: cx.session.clone(),
            chat: cx.chat.clone(),
            command: args.command.clone(),
            description: args.description.clone().filter(|d| !d.trim().is_empty()),
            started_by: cx.caller.user_id.clone(),
            started_by_name: cx.caller.name.clone(),
            started_by_role: cx.caller.role,
            status: TaskStatus::Running,
            exit_code: None,
            signal: None,
            started: self.jobs.now(),
            ended: None,
            log_path,
            pgid,
            told: Told::default(),
            runner: self.jobs.runner(),
        };
        self.jobs.table().save_logged(&row);
        tracing::info!(task = %id, session = %cx.session, pgid, "background task started");
        let service = Arc::clone(self);
        let watched = id.clone();
        let session = cx.session.clone();
        self.jobs.spawn(async move {
            service.watch(watched, session, child, pgid, stop).await;
        });
        Ok(ToolResult::ok_with(
            format!(
                "started background task {id}; its result will arrive by itself as a \
                 TERMINAL_TASK_RESULT message when it ends"
            ),
            json!({"task_id": id, "status": "running"}),
        ))
    }

    /// Waits for a task's end (exit, maximum run time, stop, shutdown) and records it.
    async fn watch(
        self: Arc<Self>,
        id: String,
        session: String,
        mut child: tokio::process::Child,
        pgid: u32,
        stop: CancellationToken,
    ) {
        let end = tokio::select! {
            status = child.wait() => End::Exited(status.ok()),
            () = tokio::time::sleep(self.config.max_task_runtime) => End::TimedOut,
            () = stop.cancelled() => End::Stopped,
            () = self.jobs.shutting_down().cancelled() => End::Shutdown,
        };
        let (status, exit) = match end {
            End::Exited(exit) => {
                // The task is its `bash -c`; whatever it left running in its group ends too.
                sys::signal_group(pgid, sys::SIGKILL);
                let status = if stop.is_cancelled() {
                    TaskStatus::Stopped
                } else if exit.and_then(|s| s.code()) == Some(0) {
                    TaskStatus::Completed
                } else {
                    TaskStatus::Failed
                };
                (status, exit)
            }
            other => {
                let exit = terminate(&mut child, pgid, self.config.kill_grace).await;
                let status = match other {
                    End::TimedOut => TaskStatus::TimedOut,
                    End::Stopped => TaskStatus::Stopped,
                    _ => TaskStatus::Interrupted,
                };
                (status, exit)
            }
        };
        // Completed, failed and timed-out tasks tell their chat (unless the model already
        // read the output); interrupted ones are told after the next start.
        self.jobs
            .finish(&session, &id, |row| {
                row.status = status;
                row.exit_code = exit.and_then(|s| s.code());
                row.signal = exit.and_then(|s| s.signal());
                row.ended = Some(self.jobs.now());
                tracing::info!(task = id.as_str(), status = status.as_str(), exit_code = ?row.exit_code, "background task ended");
                Some(Vec::new())
            })
            .await;
        self.jobs.release(&id);
    }

    /// `task_output`.
    pub(crate) async fn task_output(&self, args: TaskOutputArgs, cx: &ToolContext) -> ToolResult {
        let Some(row) = self.jobs.read(&cx.session, &args.task_id).await else {
            return not_found(&args.task_id);
        };
        let max = self.config.output_max_chars;
        let read = match args.tail_chars {
            Some(n) => {
                let n = usize::try_from(n).unwrap_or(usize::MAX).min(max);
                read_log_tail(&row.log_path, (n as u64).saturating_mul(4)).map(|(text, size)| {
                    let (tail, cut) = tail_chars(&text, n);
                    let skipped = usize::try_from(size)
                        .unwrap_or(usize::MAX)
                        .saturating_sub(text.len());
                    Capped {
                        total_chars: cut + skipped + tail.chars().count(),
                        cut_chars: cut + skipped,
                        text: tail,
                    }
                })
            }
            None => read_log_capped(&row.log_path, max),
        };
        let out = match read {
            Ok(out) => out,
            Err(e) => {
                tracing::error!(task = %row.id, error = %e, "cannot read the task log");
                return ToolResult::err(
                    parlor_bot::tool::codes::INTERNAL,
                    "the task's output could not be read",
                );
            }
        };
        let mut data = row_json(&row);
        data["output"] = json!(out.text);
        data["cut_chars"] = json!(out.cut_chars);
        let message = match row.status {
            TaskStatus::Running => format!("task {} is still running", row.id),
            status => format!(
                "task {} ended: {}{}",
                row.id,
                status.as_str(),
                row.exit_code
                    .map(|c| format!(" (exit code {c})"))
                    .unwrap_or_default()
            ),
        };
        ToolResult::ok_with(message, data)
    }

    /// `task_stop`.
    pub(crate) async fn task_stop(&self, args: TaskStopArgs, cx: &ToolContext) -> ToolResult {
        match self.stop_task(&cx.session, &args.task_id).await {
            None => not_found(&args.task_id),
            Some((row, false)) => ToolResult::ok_with(
                format!("task {} had already ended: {}", row.id, row.status.as_str()),
                row_json(&row),
            ),
            Some((row, true)) => ToolResult::ok_with(
                format!("task {} stopped; no result message will be sent", row.id),
                row_json(&row),
            ),
        }
    }

    /// Stops `session`'s task `id` (no notice is sent), as `task_stop` and the operator's
    /// console do: its row after, and whether it was still running; `None` when the session
    /// has no such task.
    pub async fn stop_task(&self, session: &str, id: &str) -> Option<(TaskRecord, bool)> {
        let row = self.task(session, id)?;
        let Some(live) = self.jobs.live(session, &row.id) else {
            return Some((row, false));
        };
        let wait = self.config.kill_grace * 2 + Duration::from_secs(5);
        if !halt(&live.stop, &live.done, wait).await {
            sys::signal_group(live.handle, sys::SIGKILL);
            tracing::warn!(task = %row.id, "the task's watcher did not finish in time");
        }
        Some((self.task(session, id).unwrap_or(row), true))
    }

    /// The last `max_chars` characters of a task's output, for the operator's console.
    /// Reading it this way does not count as the chat reading it (its notice still goes).
    pub fn output_tail(&self, row: &TaskRecord, max_chars: usize) -> std::io::Result<String> {
        let (text, _) = read_log_tail(&row.log_path, (max_chars as u64).saturating_mul(4))?;
        Ok(tail_chars(&text, max_chars).0)
    }

    /// `task_list`.
    pub(crate) fn task_list(&self, cx: &ToolContext) -> ToolResult {
        self.jobs
            .list_result(&cx.session, "tasks", "tasks", row_json)
    }

    /// With several daemons on one store: tasks started here carry `instance`, and another
    /// daemon's recovery leaves them (and their processes) alone while this one lives.
    pub fn run_as(&self, instance: &str) {
        self.jobs.set_runner(instance);
    }

    /// After a restart: rows still `running` belong to a previous daemon; their leftover
    /// processes (recognised by `PARLOR_TASK_ID` in their environment) are killed, the rows
    /// become `interrupted`, and each chat is told once, in one notice (with any task that
    /// ended during the last shutdown and was not told yet). Returns how many rows it
    /// marked `interrupted`.
    pub async fn recover(&self) -> Result<usize, StoreError> {
        self.jobs
            .recover(|row| {
                if row.pgid > 1
                    && sys::process_has_env(row.pgid, &format!("PARLOR_TASK_ID={}", row.id))
                {
                    tracing::warn!(task = %row.id, pgid = row.pgid, "killing a task left running by the previous daemon");
                    sys::signal_group(row.pgid, sys::SIGKILL);
                }
            })
            .await
    }

    /// Kills every background task (their rows become `interrupted`, told after the next
    /// start) and every shell, and waits for the watchers. New calls are refused.
    pub async fn shutdown(&self) {
        let wait = self.config.kill_grace * 2 + Duration::from_secs(5);
        if !self.jobs.shutdown(wait).await {
            tracing::warn!("task watchers still running after shutdown; killing their groups");
        }
        for pgid in self.jobs.handles() {
            sys::signal_group(pgid, sys::SIGKILL);
        }
        self.kill_shells();
        self.jobs.flush_logged();
    }
}

/// SIGTERM to the group, SIGKILL after `grace`; the leader's status.
async fn terminate(
    child: &mut tokio::process::Child,
    pgid: u32,
    grace: Duration,
) -> Option<ExitStatus> {
    sys::signal_group(pgid, sys::SIGTERM);
    let first = tokio::time::timeout(grace, child.wait()).await;
    sys::signal_group(pgid, sys::SIGKILL);
    match first {
        Ok(Ok(status)) => Some(status),
        _ => tokio::time::timeout(grace, child.wait())
            .await
            .ok()
            .and_then(Result::ok),
    }
}

impl TaskRecord {
    /// Who started the task, with the grants its notice turn needs: reading and stopping
    /// this one task. The turn itself runs as the system with the least role (the session
    /// queue decides it): nobody watches it, and its input quotes what others wrote.
    pub fn starter(&self) -> Caller {
        jobs::starter(
            &self.started_by,
            &self.started_by_name,
            self.started_by_role,
            ["task_output", "task_stop"],
            "task_id",
            &self.id,
        )
    }
}

fn not_found(id: &str) -> ToolResult {
    ToolResult::err(
        codes::TASK_NOT_FOUND,
        format!("no task {id} in this chat; task_list shows this chat's tasks"),
    )
}
