//! The `clock` toolset: `clock_create`, `clock_list`, `clock_get`, `clock_update`,
//! `clock_delete`, `clock_log`.
//!
//! Policy, enforced by the program and not left to the model:
//! - Roles are data in the specs, checked by the registry: create, update and delete need
//!   [`Role::ChatAdmin`] in this chat; list, get and log are open to every member. Create
//!   and update name `target_chat` as their `role_in_chat_arg`, so a task can only be aimed
//!   at another chat by someone who administers that chat too (an operator administers
//!   every chat). Changing a task that already fires into another chat needs the same
//!   there ([`ToolContext::require_role_in`], as only the task says where it fires);
//!   deleting one only needs an admin here.
//! - A task may fire into another chat only when the bot knows that chat (it was added
//!   there, or has recorded messages or history there) and has not been removed from it:
//!   `UNKNOWN_CHAT` otherwise, whatever the caller's role.
//! - A chat sees the tasks created in it or firing into it; any other id is
//!   `CLOCK_NOT_FOUND`.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::handle::{ClockError, ClockHandle, ClockPatch, NewClock};
use super::schedule::format_in;
use super::task::{ClockRun, ClockTask, MissedPolicy};
use parlor_bot::platform::ChatRef;
use parlor_bot::tool::bridge::{BridgeError, ToolError};
use parlor_bot::tool::{Offer, Risk, Role, ToolContext, ToolResult, ToolSetBridge};

use crate::support::finish;
use crate::time::{UNKNOWN_TIMEZONE, parse_timezone};

/// The role that may create, change and delete clock tasks (here, and in a target chat).
const CHANGE_ROLE: Role = Role::ChatAdmin;

/// A schedule that cannot be used; the message says why.
pub const BAD_SCHEDULE: &str = "BAD_SCHEDULE";
/// No clock task with this id is visible from this chat.
pub const CLOCK_NOT_FOUND: &str = "CLOCK_NOT_FOUND";
/// The target chat has as many tasks as allowed (paused and finished ones count).
pub const CLOCK_LIMIT: &str = "CLOCK_LIMIT";
/// The target chat is not a chat the bot knows.
pub const UNKNOWN_CHAT: &str = "UNKNOWN_CHAT";

/// Log entries `clock_log` returns by default, and at most.
const LOG_DEFAULT: usize = 10;
const LOG_MAX: usize = 50;

/// Arguments of `clock_create`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateArgs {
    /// A short name for people, e.g. "standup".
    pub name: String,
    /// When it fires: a cron expression (5 fields "minute hour day-of-month month
    /// day-of-week", e.g. "0 9 * * 1-5", or 6 with seconds first), a date-time for a
    /// one-shot task ("2026-12-24T09:00:00+01:00", or "2026-12-24T09:00" in the task's time
    /// zone), or "every" and a duration ("every 90s", "every 15m", "every 2h", "every 1d").
    pub schedule: String,
    /// What this chat's assistant is told when the task fires: an instruction to carry out
    /// then, e.g. "Remind everyone of the stand-up and ask for their status."
    pub content: String,
    /// IANA time zone the schedule is read in, e.g. "Europe/Berlin"; the operator's default
    /// zone when omitted.
    pub timezone: Option<String>,
    /// The chat to fire into, as a session key like "telegram:-100123"; this chat when
    /// omitted. Another chat must be one the bot is in and you administer.
    pub target_chat: Option<String>,
    /// Due times missed while the bot was down: "skip" (default, logged as skipped) or
    /// "catch_up" (run once when the bot is back).
    pub missed: Option<MissedPolicy>,
}

/// Arguments of `clock_list` (none).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListArgs {}

/// Arguments of `clock_get` and `clock_delete`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct IdArgs {
    /// The clock task's id.
    pub id: u64,
}

/// Arguments of `clock_update`; omitted fields stay as they are.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct UpdateArgs {
    /// The clock task's id.
    pub id: u64,
    /// New name.
    pub name: Option<String>,
    /// New schedule (same forms as in clock_create); an interval restarts from now.
    pub schedule: Option<String>,
    /// New content.
    pub content: Option<String>,
    /// New IANA time zone.
    pub timezone: Option<String>,
    /// New target chat (session key); the same rules as in clock_create.
    pub target_chat: Option<String>,
    /// New missed-run policy: "skip" or "catch_up".
    pub missed: Option<MissedPolicy>,
    /// false pauses the task, true resumes it (from the next due time after now).
    pub enabled: Option<bool>,
}

/// Arguments of `clock_log`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct LogArgs {
    /// One task's log; every task of this chat when omitted.
    pub id: Option<u64>,
    /// Most entries, newest first (default 10, at most 50).
    pub limit: Option<u32>,
}

/// The `clock` toolset over `handle`'s tasks.
pub fn toolset(handle: ClockHandle) -> Result<ToolSetBridge, BridgeError> {
    let tz = handle.options().default_timezone;
    ToolSetBridge::builder_with_state("clock", Arc::new(handle))
        .prompt(prompt(tz))
        .add_function_with_state(
            "clock_create",
            "Schedule a clock task: at the given times, the content is given to the assistant \
             of the target chat (this one by default) as a scheduled task, and its reply is \
             posted there. Chat admins only, and another target chat needs its admin too. \
             Returns the task with its next three fire times in its time zone: check them \
             against what was asked.",
            |h: Arc<ClockHandle>, args: CreateArgs, cx: ToolContext| async move {
                finish(create(&h, args, &cx).await)
            },
        )
        .risk(Risk::Write)
        .role(CHANGE_ROLE)
        .role_in_chat_arg("target_chat")
        // It posts later: never from an auto-chat turn, whose answer is not meant to be posted.
        .offer(Offer::Addressed)
        .failure_codes(&[BAD_SCHEDULE, UNKNOWN_TIMEZONE, CLOCK_LIMIT, UNKNOWN_CHAT])
        .result_doc(
            "`data`: the task (`id`, `name`, `schedule`, `timezone`, `content`, \
             `target_chat`, `state`, `next_fires` as RFC 3339 in its zone...) and `now`.",
        )
        .add_function_with_state(
            "clock_list",
            "List the clock tasks of this chat: those created here and those firing into it, \
             with their next fire times.",
            |h: Arc<ClockHandle>, _: ListArgs, cx: ToolContext| async move {
                finish(list(&h, &cx))
            },
        )
        .risk(Risk::Read)
        .result_doc("`data.clocks`: the tasks, as clock_create returns them; `data.now`.")
        .add_function_with_state(
            "clock_get",
            "Show one clock task of this chat with its five latest runs.",
            |h: Arc<ClockHandle>, args: IdArgs, cx: ToolContext| async move {
                finish(get(&h, args.id, &cx))
            },
        )
        .risk(Risk::Read)
        .failure_codes(&[CLOCK_NOT_FOUND])
        .result_doc("`data`: the task, plus `runs` (newest first).")
        .add_function_with_state(
            "clock_update",
            "Change a clock task of this chat: name, schedule, content, time zone, target \
             chat, missed-run policy, or pause/resume it with enabled. Chat admins only; a \
             task firing into another chat, or a new target chat, needs that chat's admin \
             too. Returns the task with its next three fire times.",
            |h: Arc<ClockHandle>, args: UpdateArgs, cx: ToolContext| async move {
                finish(update(&h, args, &cx).await)
            },
        )
        .risk(Risk::Write)
        .role(CHANGE_ROLE)
        .role_in_chat_arg("target_chat")
        // It posts later: never from an auto-chat turn, whose answer is not meant to be posted.
        .offer(Offer::Addressed)
        .failure_codes(&[
            CLOCK_NOT_FOUND,
            BAD_SCHEDULE,
            UNKNOWN_TIMEZONE,
            CLOCK_LIMIT,
            UNKNOWN_CHAT,
        ])
        .result_doc("`data`: the task as clock_create returns it, and `now`.")
        .add_function_with_state(
            "clock_delete",
            "Delete a clock task of this chat and its run log. Chat admins only.",
            |h: Arc<ClockHandle>, args: IdArgs, cx: ToolContext| async move {
                finish(delete(&h, args.id, &cx))
            },
        )
        .risk(Risk::Write)
        .role(CHANGE_ROLE)
        .failure_codes(&[CLOCK_NOT_FOUND])
        .result_doc("`data`: `id` and `name` of the deleted task.")
        .add_function_with_state(
            "clock_log",
            "Show the run log of one clock task, or of every task of this chat: due time, \
             status (ok = posted, with the message ids; failed, timed_out, skipped, \
             cancelled, handed_over = run by another daemon of the bot) and the error.",
            |h: Arc<ClockHandle>, args: LogArgs, cx: ToolContext| async move {
                finish(log(&h, args, &cx))
            },
        )
        .risk(Risk::Read)
        .failure_codes(&[CLOCK_NOT_FOUND])
        .result_doc(
            "`data.runs`: newest first, each `run`, `clock`, `due`, `started`, `ended`, \
             `status`, `error`, `message_ids`, `missed`, `chat`.",
        )
        .build()
}

/// The static prompt of the toolset.
fn prompt(tz: Tz) -> String {
    format!(
        "Clock tasks: with clock_create you can schedule something to happen in a chat later: \
         once (a date-time), on a calendar (a cron expression) or every fixed interval \
         (\"every 15m\"). Use it when someone asks for a reminder, a recurring post or a report \
         at a set time. Cron times and date-times without an offset are read in the task's \
         time zone ({} unless you pass timezone); when unsure of today's date, look it up \
         first. The result shows the next three fire times in that zone: check them against \
         what was asked and fix the task if they are wrong. Only chat admins may create, change \
         or delete clock tasks. A message starting with \"[Scheduled task\" is a clock task \
         firing: carry out its text; your reply is posted in this chat.",
        tz.name()
    )
}

fn clock_error(e: ClockError) -> ToolError {
    match e {
        ClockError::BadSchedule(why) => ToolError::new(BAD_SCHEDULE, why),
        ClockError::BadTimezone(why) => ToolError::new(UNKNOWN_TIMEZONE, why.to_string()),
        ClockError::Invalid(why) => ToolError::invalid_arguments(why),
        ClockError::Limit(why) => ToolError::new(CLOCK_LIMIT, why),
        ClockError::NotFound(id) => not_found(id),
        ClockError::Store(e) => {
            tracing::error!(error = %e, "clock store failed");
            ToolError::internal("the clock store failed; the error was logged")
        }
    }
}

fn not_found(id: u64) -> ToolError {
    ToolError::new(
        CLOCK_NOT_FOUND,
        format!("there is no clock task {id} in this chat; clock_list shows them"),
    )
}

fn current_chat(cx: &ToolContext) -> Result<ChatRef, ToolError> {
    cx.chat.clone().ok_or_else(|| {
        ToolError::unavailable("clock tasks belong to a chat, and this conversation has none")
    })
}

/// The task `id` if this chat may see it.
fn visible(handle: &ClockHandle, id: u64, here: &ChatRef) -> Result<ClockTask, ToolError> {
    match handle.task(id).map_err(clock_error)? {
        Some(task) if task.visible_from(&here.session_key()) => Ok(task),
        _ => Err(not_found(id)),
    }
}

/// The chat a task should fire into: `key`, or this chat. Another chat must be known to
/// the bot; the caller's role there was checked by the registry (`role_in_chat_arg`).
fn resolve_target(
    handle: &ClockHandle,
    key: Option<&str>,
    here: &ChatRef,
) -> Result<ChatRef, ToolError> {
    let Some(key) = key.map(str::trim).filter(|k| !k.is_empty()) else {
        return Ok(here.clone());
    };
    let Some(target) = ChatRef::parse_session_key(key) else {
        return Err(ToolError::invalid_arguments(format!(
            "{key:?} is not a chat key; write it like \"telegram:-100123\" (platform:chat id)"
        )));
    };
    if target == *here {
        return Ok(target);
    }
    let session = target.session_key();
    let store = handle.store();
    let record = store
        // The bot joins and leaves a whole chat, topics and all.
        .chat_status(&ChatRef::new(&target.platform, &target.chat_id).session_key())
        .map_err(|e| clock_error(e.into()))?;
    if let Some(record) = record.as_ref().filter(|r| !r.present) {
        return Err(ToolError::new(
            UNKNOWN_CHAT,
            format!(
                "the bot is no longer in chat {session} ({}); it can only fire into chats it is in",
                record.status
            ),
        ));
    }
    let known = record.is_some()
        || !store
            .recent_messages(&session, 1)
            .map_err(|e| clock_error(e.into()))?
            .is_empty()
        || !store
            .load_history(&session)
            .map_err(|e| clock_error(e.into()))?
            .is_empty();
    if !known {
        return Err(ToolError::new(
            UNKNOWN_CHAT,
            format!(
                "the bot has no record of chat {session}; it can only fire into chats it is in"
            ),
        ));
    }
    Ok(target)
}

async fn create(
    handle: &ClockHandle,
    args: CreateArgs,
    cx: &ToolContext,
) -> Result<ToolResult, ToolError> {
    let here = current_chat(cx)?;
    let target = resolve_target(handle, args.target_chat.as_deref(), &here)?;
    let task = handle
        .create(NewClock {
            name: args.name,
            schedule: args.schedule,
            content: args.content,
            timezone: args.timezone,
            target,
            creator: cx.caller.clone(),
            created_in: here.session_key(),
            missed: args.missed.unwrap_or_default(),
        })
        .map_err(clock_error)?;
    let view = with_now(handle, task_view(handle, &task));
    Ok(ToolResult::ok_with(
        format!(
            "clock task {} \"{}\" created; it fires into {} next at {}",
            task.id,
            task.name,
            task.target,
            first_fire_text(&view)
        ),
        view,
    ))
}

fn list(handle: &ClockHandle, cx: &ToolContext) -> Result<ToolResult, ToolError> {
    let here = current_chat(cx)?.session_key();
    let clocks: Vec<Value> = handle
        .tasks()
        .map_err(clock_error)?
        .iter()
        .filter(|t| t.visible_from(&here))
        .map(|t| task_view(handle, t))
        .collect();
    let message = match clocks.len() {
        0 => "no clock tasks in this chat".to_owned(),
        1 => "1 clock task".to_owned(),
        n => format!("{n} clock tasks"),
    };
    Ok(ToolResult::ok_with(
        message,
        with_now(handle, json!({ "clocks": clocks })),
    ))
}

fn get(handle: &ClockHandle, id: u64, cx: &ToolContext) -> Result<ToolResult, ToolError> {
    let here = current_chat(cx)?;
    let task = visible(handle, id, &here)?;
    let tz = task_tz(handle, &task);
    let runs: Vec<Value> = handle
        .runs(id, 5)
        .map_err(clock_error)?
        .iter()
        .map(|r| run_view(r, tz))
        .collect();
    let mut view = task_view(handle, &task);
    view["runs"] = Value::Array(runs);
    Ok(ToolResult::ok_with(
        format!("clock task {} \"{}\"", task.id, task.name),
        with_now(handle, view),
    ))
}

async fn update(
    handle: &ClockHandle,
    args: UpdateArgs,
    cx: &ToolContext,
) -> Result<ToolResult, ToolError> {
    let here = current_chat(cx)?;
    let task = visible(handle, args.id, &here)?;
    // Changing what is posted into another chat needs the same role there; only the task
    // knows that chat, so the registry cannot check it.
    cx.require_role_in(&task.target, CHANGE_ROLE).await?;
    let target = match args.target_chat.as_deref() {
        Some(key) => Some(resolve_target(handle, Some(key), &here)?),
        None => None,
    };
    let task = handle
        .update(
            args.id,
            ClockPatch {
                name: args.name,
                schedule: args.schedule,
                content: args.content,
                timezone: args.timezone,
                target,
                missed: args.missed,
                enabled: args.enabled,
            },
        )
        .map_err(clock_error)?;
    let view = with_now(handle, task_view(handle, &task));
    let message = if task.enabled {
        format!(
            "clock task {} updated; it fires into {} next at {}",
            task.id,
            task.target,
            first_fire_text(&view)
        )
    } else {
        format!("clock task {} updated; it is paused", task.id)
    };
    Ok(ToolResult::ok_with(message, view))
}

fn delete(handle: &ClockHandle, id: u64, cx: &ToolContext) -> Result<ToolResult, ToolError> {
    let here = current_chat(cx)?;
    let task = visible(handle, id, &here)?;
    handle.delete(id).map_err(clock_error)?;
    Ok(ToolResult::ok_with(
        format!("clock task {} \"{}\" deleted", task.id, task.name),
        json!({ "id": task.id, "name": task.name }),
    ))
}

fn log(handle: &ClockHandle, args: LogArgs, cx: &ToolContext) -> Result<ToolResult, ToolError> {
    let here = current_chat(cx)?;
    let limit = args
        .limit
        .map_or(LOG_DEFAULT, |n| n as usize)
        .clamp(1, LOG_MAX);
    let tasks: Vec<ClockTask> = match args.id {
        Some(id) => vec![visible(handle, id, &here)?],
        None => handle
            .tasks()
            .map_err(clock_error)?
            .into_iter()
            .filter(|t| t.visible_from(&here.session_key()))
            .collect(),
    };
    let mut runs: Vec<(ClockRun, Tz)> = Vec::new();
    for task in &tasks {
        let tz = task_tz(handle, task);
        runs.extend(
            handle
                .runs(task.id, limit)
                .map_err(clock_error)?
                .into_iter()
                .map(|r| (r, tz)),
        );
    }
    runs.sort_by_key(|(r, _)| std::cmp::Reverse(r.run));
    runs.truncate(limit);
    let views: Vec<Value> = runs.iter().map(|(r, tz)| run_view(r, *tz)).collect();
    Ok(ToolResult::ok_with(
        format!("{} run(s), newest first", views.len()),
        json!({ "runs": views }),
    ))
}

fn task_tz(handle: &ClockHandle, task: &ClockTask) -> Tz {
    parse_timezone(&task.timezone).unwrap_or(handle.options().default_timezone)
}

fn with_now(handle: &ClockHandle, mut view: Value) -> Value {
    let tz = view["timezone"]
        .as_str()
        .and_then(|name| parse_timezone(name).ok())
        .unwrap_or(handle.options().default_timezone);
    view["now"] = json!(format_in(handle.now(), tz));
    view
}

fn first_fire_text(view: &Value) -> String {
    view["next_fires"][0]
        .as_str()
        .unwrap_or("(never)")
        .to_owned()
}

/// A task as the tools show it; times are RFC 3339 in the task's zone.
pub fn task_view(handle: &ClockHandle, task: &ClockTask) -> Value {
    let tz = task_tz(handle, task);
    let one_shot = handle
        .schedule_of(task)
        .map(|s| s.is_one_shot())
        .unwrap_or(false);
    let state = if task.enabled {
        "scheduled"
    } else if one_shot && task.last_fire.is_some() {
        "finished"
    } else {
        "paused"
    };
    let at = |t: DateTime<Utc>| format_in(t, tz);
    json!({
        "id": task.id,
        "name": task.name,
        "schedule": task.schedule,
        "timezone": task.timezone,
        "content": task.content,
        "target_chat": task.target.session_key(),
        "created_in": task.created_in,
        "created_by": if task.creator.name.is_empty() { &task.creator.user_id } else { &task.creator.name },
        "missed": task.missed.as_str(),
        "state": state,
        "next_fires": handle.upcoming(task, 3).into_iter().map(at).collect::<Vec<_>>(),
        "last_fire": task.last_fire.map(at),
        "last_status": task.last_status.map(|s| s.as_str()),
        "paused_reason": task.paused_reason,
    })
}

/// A run as the tools show it.
pub fn run_view(run: &ClockRun, tz: Tz) -> Value {
    let at = |t: DateTime<Utc>| format_in(t, tz);
    json!({
        "run": run.run,
        "clock": run.task,
        "chat": run.chat,
        "due": at(run.due),
        "started": at(run.started),
        "ended": run.ended.map(at),
        "status": run.status.as_str(),
        "error": run.error,
        "message_ids": run.message_ids,
        "missed": run.missed,
    })
}
