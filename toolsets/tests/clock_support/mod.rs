//! Shared by the clock tests: a platform that records every post with its tokio and wall
//! time, a model that echoes (or fails, blocks, or calls scripted tools), and a rig that
//! starts a SessionManager + ClockService on a MemoryStore and can stop or "crash" it.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use parlor_bot::agent::{Agent, AgentConfig};
use parlor_bot::llm::{ChatRequest, Completion, LlmBackend, LlmError, Message, ToolCall};
use parlor_bot::platform::{
    ChatKind, ChatRef, ImageRef, Inbox, IncomingMessage, Platform, PlatformError, Sender,
    SentMessage,
};
use parlor_bot::session::{SessionConfig, SessionManager};
use parlor_bot::store::{MemoryStore, Store};
use parlor_bot::tool::ToolRegistry;
use parlor_toolsets::clock::{self, ClockHandle, ClockOptions, ClockRun, ClockService, WallTime};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;
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

/// One message the bot posted.
#[derive(Debug, Clone)]
pub struct Post {
    pub chat: ChatRef,
    pub text: String,
    pub id: String,
    /// Tokio's clock when it was posted.
    pub at: Instant,
    /// Wall time (the clock source) when it was posted.
    pub wall: DateTime<Utc>,
}

/// A platform that records posts; chat administrators are set per chat.
pub struct TestPlatform {
    posts: Mutex<Vec<Post>>,
    admins: Mutex<HashMap<String, Vec<String>>>,
    next_id: Mutex<u64>,
    refuse: Mutex<bool>,
    clock: WallTime,
    /// Prefix of the message ids, so two platforms (before and after a restart) differ.
    prefix: String,
}

impl TestPlatform {
    pub fn new(clock: WallTime, prefix: &str) -> Arc<Self> {
        Arc::new(TestPlatform {
            posts: Mutex::default(),
            admins: Mutex::default(),
            next_id: Mutex::new(0),
            refuse: Mutex::new(false),
            clock,
            prefix: prefix.to_owned(),
        })
    }
    pub fn set_admins(&self, chat: &ChatRef, admins: &[&str]) {
        self.admins.lock().unwrap().insert(
            chat.session_key(),
            admins.iter().map(|a| a.to_string()).collect(),
        );
    }
    pub fn refuse_sends(&self, refuse: bool) {
        *self.refuse.lock().unwrap() = refuse;
    }
    pub fn posts(&self) -> Vec<Post> {
        self.posts.lock().unwrap().clone()
    }
    pub fn posts_in(&self, chat: &ChatRef) -> Vec<Post> {
        self.posts()
            .into_iter()
            .filter(|p| p.chat == *chat)
            .collect()
    }
}

#[async_trait]
impl Platform for TestPlatform {
    fn name(&self) -> &str {
        "test"
    }
    async fn send_message(
        &self,
        chat: &ChatRef,
        text: &str,
        _reply_to: Option<&str>,
    ) -> Result<SentMessage, PlatformError> {
        if *self.refuse.lock().unwrap() {
            return Err(PlatformError::Refused("chat not found".into()));
        }
        let id = {
            let mut n = self.next_id.lock().unwrap();
            *n += 1;
            format!("{}-{n}", self.prefix)
        };
        self.posts.lock().unwrap().push(Post {
            chat: chat.clone(),
            text: text.to_owned(),
            id: id.clone(),
            at: Instant::now(),
            wall: self.clock.now(),
        });
        Ok(SentMessage {
            message_ids: vec![id],
        })
    }
    async fn send_typing(&self, _: &ChatRef) -> Result<(), PlatformError> {
        Ok(())
    }
    async fn chat_admins(&self, chat: &ChatRef) -> Result<Vec<String>, PlatformError> {
        Ok(self
            .admins
            .lock()
            .unwrap()
            .get(&chat.session_key())
            .cloned()
            .unwrap_or_default())
    }
    async fn download_image(&self, _: &ImageRef) -> Result<Vec<u8>, PlatformError> {
        Err(PlatformError::NotFound("no images here".into()))
    }
}

/// A model that answers `reply: <last line of the user's text>`. A text containing `slow`
/// waits for `release`; `fail` makes every request fail; scripted tool calls are made in
/// answer to user messages that mention `@parlor`.
pub struct TestLlm {
    gate: Semaphore,
    failing: Mutex<bool>,
    block_all: Mutex<bool>,
    script: Mutex<VecDeque<(String, serde_json::Value)>>,
    requests: Mutex<Vec<ChatRequest>>,
}

impl Default for TestLlm {
    fn default() -> Self {
        TestLlm {
            gate: Semaphore::new(0),
            failing: Mutex::default(),
            block_all: Mutex::default(),
            script: Mutex::default(),
            requests: Mutex::default(),
        }
    }
}

impl TestLlm {
    pub fn new() -> Arc<Self> {
        Arc::new(TestLlm::default())
    }
    pub fn failing() -> Arc<Self> {
        let llm = TestLlm::default();
        *llm.failing.lock().unwrap() = true;
        Arc::new(llm)
    }
    /// Every request waits for `release`.
    pub fn blocked() -> Arc<Self> {
        let llm = TestLlm::default();
        *llm.block_all.lock().unwrap() = true;
        Arc::new(llm)
    }
    pub fn release(&self, n: usize) {
        self.gate.add_permits(n);
    }
    pub fn script_tool_call(&self, name: &str, args: serde_json::Value) {
        self.script
            .lock()
            .unwrap()
            .push_back((name.to_owned(), args));
    }
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.requests.lock().unwrap().clone()
    }
    /// The tool results the model was shown, in order.
    pub fn tool_results(&self) -> Vec<serde_json::Value> {
        let mut seen = Vec::new();
        for r in self.requests() {
            for m in &r.messages {
                if let Message::Tool { content, .. } = m {
                    let v: serde_json::Value = serde_json::from_str(content).unwrap();
                    if !seen.contains(&v) {
                        seen.push(v);
                    }
                }
            }
        }
        seen
    }
}

#[async_trait]
impl LlmBackend for TestLlm {
    async fn stream(
        &self,
        request: &ChatRequest,
        cancel: &CancellationToken,
    ) -> Result<Completion, LlmError> {
        self.requests.lock().unwrap().push(request.clone());
        if *self.failing.lock().unwrap() {
            return Err(LlmError::Connect("connection refused".into()));
        }
        let (last, from_user) = match request.messages.last() {
            Some(Message::User { content }) => (content.text(), true),
            Some(Message::Tool { content, .. }) => (content.clone(), false),
            _ => (String::new(), false),
        };
        if *self.block_all.lock().unwrap() || last.contains("slow") {
            let permit = tokio::select! {
                p = self.gate.acquire() => p,
                () = cancel.cancelled() => return Err(LlmError::Cancelled),
            };
            permit.expect("gate closed").forget();
        }
        if from_user && last.contains("@parlor") {
            let next = self.script.lock().unwrap().pop_front();
            if let Some((name, args)) = next {
                return Ok(Completion {
                    tool_calls: vec![ToolCall::new("call-1", name, args.to_string())],
                    ..Completion::default()
                });
            }
        }
        let content = if from_user {
            format!("reply: {}", last.lines().last().unwrap_or_default())
        } else {
            format!("done: {last}")
        };
        Ok(Completion {
            content,
            ..Completion::default()
        })
    }
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
    pub llm: Arc<TestLlm>,
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
        llm: Arc<TestLlm>,
        options: ClockOptions,
    ) -> Rig {
        Self::start_with(store, platform, llm, options, SessionConfig::default()).await
    }

    /// [`Rig::start`] with the session layer's configuration (its operators, say).
    pub async fn start_with(
        store: Arc<MemoryStore>,
        platform: Arc<TestPlatform>,
        llm: Arc<TestLlm>,
        options: ClockOptions,
        session: SessionConfig,
    ) -> Rig {
        let handle = ClockHandle::new(store.clone() as Arc<dyn Store>, options);
        let registry =
            ToolRegistry::new(vec![Arc::new(clock::toolset(handle.clone()).unwrap())]).unwrap();
        let agent = Agent::new(
            llm.clone(),
            ToolRegistry::new(vec![Arc::new(clock::toolset(handle.clone()).unwrap())]).unwrap(),
            "test",
            AgentConfig::default(),
        );
        let manager = SessionManager::new(
            store.clone() as Arc<dyn Store>,
            agent,
            vec![platform.clone() as Arc<dyn Platform>],
            session,
        );
        manager.resume().await.unwrap();
        let shutdown = CancellationToken::new();
        let service = tokio::spawn(
            ClockService::with_handle(handle.clone(), manager.clone()).run(shutdown.clone()),
        );
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
            .deliver(IncomingMessage {
                chat: chat.clone(),
                kind: ChatKind::Group,
                message_id: id.to_string(),
                sender: Sender {
                    id: format!("test:{who}"),
                    name: who.to_owned(),
                    username: None,
                    is_bot: false,
                },
                text: text.to_owned(),
                time: Utc::now(),
                reply_to: None,
                reply_to_bot: false,
                mentions_bot: text.contains("@parlor"),
                images: vec![],
            })
            .await
            .unwrap();
    }
}

/// Sleeps (paused time) until `wall` by the clock source.
pub async fn sleep_until_wall(clock: &WallTime, wall: DateTime<Utc>) {
    let left = (wall - clock.now()).to_std().unwrap_or(Duration::ZERO);
    tokio::time::sleep(left).await;
}
