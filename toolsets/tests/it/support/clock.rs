//! Shared by the clock tests: the shared platform double recording every post with its tokio
//! and wall time, the shared model double set to echo (or fail, block, or call scripted
//! tools), and a rig that starts a SessionManager + ClockService on a MemoryStore and can
//! stop or "crash" it.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use parlor_bot::agent::{Agent, AgentConfig};
use parlor_bot::llm::{ChatRequest, Completion, LlmError, Message, ToolCall};
use parlor_bot::platform::{ChatRef, Inbox, Platform, PlatformError};
use parlor_bot::session::{SessionConfig, SessionManager};
use parlor_bot::store::{MemoryStore, Store};
use parlor_bot::testing::{ScriptedLlm, TestPlatform, last_text, message, tool_results};
use parlor_bot::tool::ToolRegistry;
use parlor_toolsets::clock::{self, ClockHandle, ClockOptions, ClockRun, ClockService, WallTime};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

pub fn group_a() -> ChatRef {
    ChatRef::new("test", "-100")
}

pub fn group_b() -> ChatRef {
    ChatRef::new("test", "-200")
}

/// A platform that records every post with its tokio and wall time (`clock`); message ids
/// are `{prefix}-1`, `{prefix}-2`, ..., so two platforms (before and after a restart) differ.
/// Chat administrators are set per chat.
pub fn platform(clock: &WallTime, prefix: &str) -> Arc<TestPlatform> {
    let clock = clock.clone();
    TestPlatform::default()
        .ids(&format!("{prefix}-"), 1)
        .wall_clock(move || clock.now())
        .shared()
}

/// Makes every post fail as refused.
pub fn refuse_sends(platform: &TestPlatform) {
    platform.fail_sends(Some(PlatformError::Refused("chat not found".into())));
}

/// Whether a request ends in a user message that mentions `@parlor`: those take the
/// scripted tool calls.
fn addressed(request: &ChatRequest) -> bool {
    matches!(request.messages.last(), Some(Message::User { .. }))
        && last_text(request).contains("@parlor")
}

/// The echo answer, but to a clock fire `reply: <the fire's text>` (its header line and
/// quoted content), so a post shows which task fired and what it said.
fn echo_fires(request: &ChatRequest) -> Completion {
    let text = last_text(request);
    match text.find("[Scheduled task") {
        Some(at) if matches!(request.messages.last(), Some(Message::User { .. })) => Completion {
            content: format!("reply: {}", &text[at..]),
            ..Completion::default()
        },
        _ => parlor_bot::testing::echo(request),
    }
}

/// A model that answers `reply: <last line of the user's text>` (the whole fire's text to
/// a clock fire) and `done: <result>` to a tool result; a text containing `slow` waits for
/// `release`; scripted tool calls ([`script_tool_call`]) are made in answer to user
/// messages that mention `@parlor`.
pub fn model() -> Arc<ScriptedLlm> {
    ScriptedLlm::answering(|request, _| Ok(echo_fires(request)))
        .gated_on("slow")
        .script_when(addressed)
        .shared()
}

/// [`model`] where every request waits for `release`.
pub fn blocked_model() -> Arc<ScriptedLlm> {
    ScriptedLlm::answering(|request, _| Ok(echo_fires(request)))
        .gated()
        .script_when(addressed)
        .shared()
}

/// A model every request fails, as unreachable.
pub fn failing_model() -> Arc<ScriptedLlm> {
    ScriptedLlm::answering(|_, _| Err(LlmError::Connect("connection refused".into()))).shared()
}

/// The next request that mentions `@parlor` calls `name` with `args`.
pub fn script_tool_call(llm: &ScriptedLlm, name: &str, args: serde_json::Value) {
    llm.push(Ok(Completion {
        tool_calls: vec![ToolCall::new("call-1", name, args.to_string())],
        ..Completion::default()
    }));
}

/// The tool results the model was shown, in order, each once.
pub fn tool_results_seen(llm: &ScriptedLlm) -> Vec<serde_json::Value> {
    let mut seen = Vec::new();
    for request in llm.requests() {
        for (_, result) in tool_results(&request.messages) {
            if !seen.contains(&result) {
                seen.push(result);
            }
        }
    }
    seen
}

/// Clock options for tests: UTC default zone, the given clock.
pub fn options(clock: &WallTime) -> ClockOptions {
    ClockOptions {
        wall_time: clock.clone(),
        ..ClockOptions::default()
    }
}

/// One "life" of the daemon: a session manager and a clock service on a shared store.
pub struct Rig {
    pub store: Arc<MemoryStore>,
    pub platform: Arc<TestPlatform>,
    pub llm: Arc<ScriptedLlm>,
    pub manager: SessionManager,
    pub handle: ClockHandle,
    pub registry: ToolRegistry,
    shutdown: CancellationToken,
    service: JoinHandle<()>,
}

impl Rig {
    /// Starts a life: resumes the session layer, then runs the clock service.
    pub async fn start(
        store: Arc<MemoryStore>,
        platform: Arc<TestPlatform>,
        llm: Arc<ScriptedLlm>,
        options: ClockOptions,
    ) -> Rig {
        Self::start_with(store, platform, llm, options, SessionConfig::default()).await
    }

    /// [`Rig::start`] with the session layer's configuration (its operators, say).
    pub async fn start_with(
        store: Arc<MemoryStore>,
        platform: Arc<TestPlatform>,
        llm: Arc<ScriptedLlm>,
        options: ClockOptions,
        session: SessionConfig,
    ) -> Rig {
        let handle = ClockHandle::new(store.clone() as Arc<dyn Store>, options);
        let tools =
            || ToolRegistry::new(vec![Arc::new(clock::toolset(handle.clone()).unwrap())]).unwrap();
        let registry = tools();
        let agent = Agent::new(llm.clone(), tools(), "test", AgentConfig::default());
        let manager = SessionManager::new(
            store.clone() as Arc<dyn Store>,
            agent,
            vec![platform.clone() as Arc<dyn Platform>],
            session,
        );
        manager.resume().await.unwrap();
        let (inputs, receiver) = parlor_bot::session::system_inputs();
        manager.serve_system(receiver);
        let shutdown = CancellationToken::new();
        let service =
            tokio::spawn(ClockService::with_handle(handle.clone(), inputs).run(shutdown.clone()));
        Rig {
            store,
            platform,
            llm,
            manager,
            handle,
            registry,
            shutdown,
            service,
        }
    }

    /// A clean stop: the clock stops firing, the session layer drains (1 s grace), the
    /// clock records what its fires learned.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.manager.shutdown(Duration::from_secs(1)).await;
        self.service.await.unwrap();
    }

    /// `kill -9`: the clock service is gone mid-flight, nothing is recorded after this
    /// point; the old session actors stay blocked (their model never answers).
    pub fn crash(self) {
        self.service.abort();
    }

    /// Every run of a task, oldest first.
    pub fn runs(&self, task: u64) -> Vec<ClockRun> {
        let mut runs = self.handle.runs(task, 100).unwrap();
        runs.reverse();
        runs
    }

    /// A message from `who` in `chat`, recorded by the session layer (addressed when it
    /// mentions @parlor).
    pub async fn say(&self, chat: &ChatRef, id: u32, who: &str, text: &str) {
        self.manager
            .deliver(message(chat, id, who, text))
            .await
            .unwrap();
    }
}

/// Sleeps (paused time) until `wall` by the clock source.
pub async fn sleep_until_wall(clock: &WallTime, wall: DateTime<Utc>) {
    let left = (wall - clock.now()).to_std().unwrap_or(Duration::ZERO);
    tokio::time::sleep(left).await;
}
