//! The clock row: 10,000 one-shot tasks in-process (`parlor_toolsets::clock`), on a
//! `MemoryStore`, fired through a `SessionManager` whose model answers at once and whose
//! platform only counts posts. Lateness is `ClockRun::started - ClockRun::due`: when the
//! service handed the fire to the session, against when it was due. Every task is created
//! through `ClockHandle::create`, each timed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{SecondsFormat, TimeDelta, Utc};
use parlor_bot::agent::{Agent, AgentConfig};
use parlor_bot::llm::Completion;
use parlor_bot::platform::{ChatRef, Platform};
use parlor_bot::session::{SessionConfig, SessionManager};
use parlor_bot::store::{MemoryStore, Store};
use parlor_bot::testing::{ScriptedLlm, TestPlatform};
use parlor_bot::tool::{Caller, Role, ToolRegistry};
use parlor_toolsets::clock::{ClockHandle, ClockOptions, ClockService, MissedPolicy, NewClock};
use tokio_util::sync::CancellationToken;

/// Tasks scheduled.
pub const TASKS: usize = 10_000;
/// Chats they fire into.
const CHATS: usize = 1_000;
/// Due times spread evenly over this window...
const WINDOW: Duration = Duration::from_secs(20);
/// ...which starts this long after the first task is created (creating them all takes well
/// under a second in a release build).
const LEAD: Duration = Duration::from_secs(4);

/// What the clock phase measured.
pub struct ClockFigures {
    /// Tasks in the store.
    pub created: usize,
    /// How long each `create` took, sorted, in ms.
    pub create_ms: Vec<f64>,
    /// How long the last `create` took (9,999 tasks there before it), in ms.
    pub last_create_ms: f64,
    /// Fires handed to sessions before the deadline.
    pub fired: usize,
    /// Lateness of those, sorted, in ms.
    pub lateness_ms: Vec<f64>,
    /// Bench-process RSS growth while the tasks were created (store records and all).
    pub rss_delta: i64,
    /// Posts the sessions made.
    pub posts: usize,
    /// The error, if the phase could not run.
    pub error: Option<String>,
}

/// Runs the clock phase; `rss` reads this process's RSS in bytes.
pub async fn run(rss: impl Fn() -> u64) -> ClockFigures {
    let store = Arc::new(MemoryStore::new());
    let options = ClockOptions {
        max_tasks_per_chat: TASKS,
        ..ClockOptions::default()
    };
    let handle = ClockHandle::new(store.clone() as Arc<dyn Store>, options);
    // The platform only counts posts; the model answers at once.
    let platform = TestPlatform::default().named("bench").shared();
    let registry = match ToolRegistry::new(vec![]) {
        Ok(r) => r,
        Err(e) => return failed(format!("tool registry: {e}")),
    };
    let model = ScriptedLlm::answering(|_, _| {
        Ok(Completion {
            content: "done".into(),
            ..Completion::default()
        })
    });
    let agent = Agent::new(model.shared(), registry, "bench", AgentConfig::default());
    let sessions = SessionManager::new(
        store.clone() as Arc<dyn Store>,
        agent,
        vec![platform.clone() as Arc<dyn Platform>],
        SessionConfig {
            turns_per_minute: 100_000,
            queue_capacity: 64,
            ..SessionConfig::default()
        },
    );

    let rss0 = rss();
    let first_due = Utc::now() + TimeDelta::from_std(LEAD).unwrap_or_default();
    let step = WINDOW.as_secs_f64() / TASKS as f64;
    let due_of = |i: usize| first_due + TimeDelta::microseconds((i as f64 * step * 1e6) as i64);
    let new_task = |i: usize| {
        let chat = ChatRef::new("bench", format!("-{}", 1 + i % CHATS));
        NewClock {
            name: format!("task {i}"),
            schedule: due_of(i).to_rfc3339_opts(SecondsFormat::Micros, true),
            content: format!("scheduled text {i}"),
            timezone: None,
            target: chat.clone(),
            creator: Caller {
                user_id: "bench:admin".into(),
                name: "Admin".into(),
                role: Role::ChatAdmin,
                grants: Vec::new(),
            },
            created_in: chat.session_key(),
            missed: MissedPolicy::Skip,
        }
    };
    let mut create_ms = Vec::with_capacity(TASKS);
    for i in 0..TASKS {
        let task = new_task(i);
        let t0 = Instant::now();
        let made = handle.create(task);
        create_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        if let Err(e) = made {
            return failed(format!("creating task {i}: {e}"));
        }
    }
    let last_create_ms = create_ms.last().copied().unwrap_or(f64::NAN);
    create_ms.sort_by(f64::total_cmp);
    let created = handle.tasks().map(|t| t.len()).unwrap_or_default();
    let rss_delta = rss() as i64 - rss0 as i64;

    let shutdown = CancellationToken::new();
    let (inputs, receiver) = parlor_bot::session::system_inputs();
    sessions.serve_system(receiver);
    let service =
        tokio::spawn(ClockService::with_handle(handle.clone(), inputs).run(shutdown.clone()));
    // Wait for the window to pass, then up to 20 s more for stragglers.
    let end = first_due + TimeDelta::from_std(WINDOW).unwrap_or_default();
    let until_end = (end - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(until_end).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut lateness = Vec::new();
    loop {
        lateness.clear();
        let tasks = handle.tasks().unwrap_or_default();
        for task in &tasks {
            if let Ok(runs) = handle.runs(task.id, 1)
                && let Some(run) = runs.first()
            {
                let late = (run.started - run.due)
                    .num_microseconds()
                    .unwrap_or(i64::MAX);
                lateness.push(late as f64 / 1000.0);
            }
        }
        if lateness.len() >= created || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    lateness.sort_by(f64::total_cmp);
    shutdown.cancel();
    sessions.shutdown(Duration::from_secs(1)).await;
    let _ = tokio::time::timeout(Duration::from_secs(15), service).await;
    ClockFigures {
        created,
        create_ms,
        last_create_ms,
        fired: lateness.len(),
        lateness_ms: lateness,
        rss_delta,
        posts: platform.sent().len(),
        error: None,
    }
}

fn failed(error: String) -> ClockFigures {
    ClockFigures {
        created: 0,
        create_ms: Vec::new(),
        last_create_ms: f64::NAN,
        fired: 0,
        lateness_ms: Vec::new(),
        rss_delta: 0,
        posts: 0,
        error: Some(error),
    }
}
