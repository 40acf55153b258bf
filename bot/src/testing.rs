//! Test doubles shared by every crate's tests, behind the `test-util` feature: one double
//! per trait, so a change to a trait is made once here and not in each test file.
//!
//! - [`ScriptedLlm`]: the model ([`LlmBackend`]): a script of answers, then a fallback
//!   (an error, an echo, or any function of the request), optionally held at a gate.
//! - [`TestPlatform`]: the chat platform ([`Platform`]): records every send, serves images,
//!   fails as told, knows chat admins.
//! - [`CrashStore`]: a [`Store`] that "dies" after a number of writes, and whose flushes can
//!   be watched or made to fail.
//! - [`TestRoles`]: roles in any chat ([`RoleResolver`]): a table, optionally the
//!   platform's admins, chats whose roles cannot be read; counts lookups.
//! - [`TestInbox`]: the adapters' way in ([`Inbox`](crate::platform::Inbox)): records
//!   deliveries and chat events, or holds, refuses or fails them.
//! - [`TestSpeech`]: an auto-chat turn's speech ([`AutoChatSpeech`](crate::tool::AutoChatSpeech)),
//!   recording what it says.
//! - [`TestPost`]: a turn's way to post ([`Post`](crate::tool::Post)), recording what it
//!   posts.
//! - [`PgCluster`] (`testing/pg.rs`): a throwaway PostgreSQL server, one database per test,
//!   for the [`PgStore`](crate::store::PgStore) tests.
//!
//! With them the small builders tests share: completions ([`text`], [`calls`], [`echo`]),
//! a request ([`chat_request`]), an incoming group message ([`message`]), an image
//! ([`PNG_1X1`]), the tests' group ([`group`]), and the tool results of a conversation
//! ([`tool_results`]). The double of parlor-toolsets' `Notifier`, which this crate cannot
//! name, is in that crate's `tests/it/support`.
//!
//! Waiting is on events (a `watch` channel): under paused time a wait lets tokio jump to
//! the next timer, and its bound is tokio time too. [`wait_until`] polls, only for a state
//! no double signals; [`wait_idle`] is the session layer's "settled".
//!
//! Not for production: nothing here has a bound on memory, and locks are unwrapped (a
//! poisoned lock in a test is the test's failure).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod pg;

pub use pg::{PgCluster, REQUIRE_POSTGRES};

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::llm::{ChatRequest, Completion, LlmBackend, LlmError, Message, ToolCall, Usage};
use crate::platform::{
    ChatEvent, ChatKind, ChatRef, ImageRef, Inbox, InboxError, IncomingMessage, Platform,
    PlatformError, Sender, SentMessage,
};
use crate::store::{
    ChatRecord, Edited, GroupCommit, Inbound, Intake, KvWrite, MemoryStore, OutboxEntry,
    PendingItem, Store, StoreError, StoredMessage, TurnCommit,
};
use crate::tool::{Caller, Role, RoleError, RoleResolver, ToolContext};

/// How long a `wait_*` of these doubles waits (tokio time) before it fails the test.
pub const WAIT_LIMIT: Duration = Duration::from_secs(10);

/// Waits until `value` satisfies `done` for at most `limit` of tokio time; `None` when it
/// did not.
async fn wait_for<T: Clone>(
    value: &watch::Sender<T>,
    limit: Duration,
    done: impl FnMut(&T) -> bool,
) -> Option<T> {
    let mut seen = value.subscribe();
    let waited = tokio::time::timeout(limit, seen.wait_for(done)).await;
    match waited {
        Ok(Ok(v)) => Some(v.clone()),
        _ => None,
    }
}

/// Copies directory `from` into `to` (created if missing), subdirectories included: a
/// store's files as they are on disk at this moment, for opening the copy as a restart or
/// a `kill -9` would find them.
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("create the copy's directory");
    for entry in std::fs::read_dir(from).expect("read the directory") {
        let entry = entry.expect("read a directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy a file");
        }
    }
}

/// Polls `done` every 10 ms of tokio time until it holds, for at most `within`; panics
/// naming `what` when it never did. Only for a state no double signals (a child process, a
/// file, a row the code under test writes): a double's `wait_*` waits for the event itself.
pub async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(within, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    if waited.is_err() {
        panic!("{what}: not within {within:?}");
    }
}

/// Waits until `manager` [is idle](SessionManager::is_idle) (nothing queued or running, no
/// input pending, no reply unsent), for at most [`WAIT_LIMIT`]: the sessions settled, where
/// no later message of the chat can serve as a sentinel.
pub async fn wait_idle(manager: &crate::session::SessionManager) {
    wait_until("the sessions settled", WAIT_LIMIT, || manager.is_idle()).await;
}

// ---------------------------------------------------------------------------------------
// The model

type Answer = Box<dyn Fn(&ChatRequest, usize) -> Result<Completion, LlmError> + Send + Sync>;
type RequestTest = Box<dyn Fn(&ChatRequest) -> bool + Send + Sync>;

/// A model that answers from a script and records every request (with when it came).
///
/// Each request is recorded, then waits at the gate when the model is
/// [gated](ScriptedLlm::gated) (until [`release`](ScriptedLlm::release) or cancellation),
/// then takes the next scripted answer (only a request that
/// [`script_when`](ScriptedLlm::script_when) accepts takes one); with the script empty it
/// gets the fallback: "script exhausted" ([`LlmError::Malformed`]) unless built with
/// [`echo`](ScriptedLlm::echo) or [`answering`](ScriptedLlm::answering).
pub struct ScriptedLlm {
    script: Mutex<VecDeque<Result<Completion, LlmError>>>,
    takes_script: Option<RequestTest>,
    answer: Answer,
    gate: Semaphore,
    gated: Option<RequestTest>,
    log: watch::Sender<Vec<(ChatRequest, Instant)>>,
}

impl Default for ScriptedLlm {
    fn default() -> Self {
        ScriptedLlm {
            script: Mutex::default(),
            takes_script: None,
            answer: Box::new(|_, _| Err(LlmError::Malformed("script exhausted".into()))),
            gate: Semaphore::new(0),
            gated: None,
            log: watch::Sender::new(Vec::new()),
        }
    }
}

impl ScriptedLlm {
    /// A model that gives `replies` in order, then fails as malformed.
    pub fn new(replies: Vec<Completion>) -> Arc<Self> {
        Self::results(replies.into_iter().map(Ok).collect()).shared()
    }

    /// A model that gives `results` (answers and errors) in order, then fails as malformed.
    pub fn results(results: Vec<Result<Completion, LlmError>>) -> Self {
        ScriptedLlm {
            script: Mutex::new(results.into()),
            ..ScriptedLlm::default()
        }
    }

    /// A model that answers a user message with `reply: <its last line>` and a tool result
    /// with `done: <the result>` (see [`echo`]).
    pub fn echo() -> Self {
        Self::answering(|request, _| Ok(echo(request)))
    }

    /// A model whose fallback answer is `answer(request, requests so far)`; the count
    /// includes this request and is read once the request has passed the gate.
    pub fn answering(
        answer: impl Fn(&ChatRequest, usize) -> Result<Completion, LlmError> + Send + Sync + 'static,
    ) -> Self {
        ScriptedLlm {
            answer: Box::new(answer),
            ..ScriptedLlm::default()
        }
    }

    /// Every request waits at the gate for a [`release`](ScriptedLlm::release).
    pub fn gated(self) -> Self {
        self.gated_when(|_| true)
    }

    /// The requests whose last message (user text or tool result) contains `word` wait at
    /// the gate.
    pub fn gated_on(self, word: &str) -> Self {
        let word = word.to_owned();
        self.gated_when(move |request| last_text(request).contains(&word))
    }

    /// The requests `test` accepts wait at the gate.
    pub fn gated_when(
        mut self,
        test: impl Fn(&ChatRequest) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.gated = Some(Box::new(test));
        self
    }

    /// Only the requests `test` accepts take a scripted answer; the others get the
    /// fallback.
    pub fn script_when(
        mut self,
        test: impl Fn(&ChatRequest) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.takes_script = Some(Box::new(test));
        self
    }

    pub fn shared(self) -> Arc<Self> {
        Arc::new(self)
    }

    /// Lets `n` more gated requests through.
    pub fn release(&self, n: usize) {
        self.gate.add_permits(n);
    }

    /// Appends an answer to the script.
    pub fn push(&self, result: Result<Completion, LlmError>) {
        self.script.lock().unwrap().push_back(result);
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.log.borrow().iter().map(|(r, _)| r.clone()).collect()
    }

    /// When each request came (tokio time).
    pub fn request_times(&self) -> Vec<Instant> {
        self.log.borrow().iter().map(|(_, at)| *at).collect()
    }

    /// The text of the user message that ends each turn's request (summary requests of
    /// compaction left out); panics when one ends in something else.
    pub fn user_inputs(&self) -> Vec<String> {
        self.log
            .borrow()
            .iter()
            .filter(|(r, _)| !is_summary_request(r))
            .map(|(r, _)| match r.messages.last() {
                Some(Message::User { content }) => content.text(),
                other => panic!("last message is not the user's: {other:?}"),
            })
            .collect()
    }

    /// Waits until `n` requests have come (a gated one is then held at the gate); the
    /// requests so far.
    pub async fn wait_requests(&self, n: usize) -> Vec<ChatRequest> {
        if wait_for(&self.log, WAIT_LIMIT, |log| log.len() >= n)
            .await
            .is_none()
        {
            panic!("expected {n} requests, got {:?}", self.requests());
        }
        self.requests()
    }
}

#[async_trait]
impl LlmBackend for ScriptedLlm {
    async fn stream(
        &self,
        request: &ChatRequest,
        cancel: &CancellationToken,
    ) -> Result<Completion, LlmError> {
        self.log
            .send_modify(|log| log.push((request.clone(), Instant::now())));
        if self.gated.as_ref().is_some_and(|test| test(request)) {
            let permit = tokio::select! {
                p = self.gate.acquire() => p,
                () = cancel.cancelled() => return Err(LlmError::Cancelled),
            };
            permit.expect("gate closed").forget();
        }
        if self.takes_script.as_ref().is_none_or(|test| test(request)) {
            let next = self.script.lock().unwrap().pop_front();
            if let Some(next) = next {
                return next;
            }
        }
        let count = self.log.borrow().len();
        (self.answer)(request, count)
    }
}

/// Whether `request` asks for a compaction summary rather than runs a turn.
pub fn is_summary_request(request: &ChatRequest) -> bool {
    matches!(request.messages.first(), Some(Message::System { content })
        if content.starts_with(crate::agent::compact::SUMMARY_PROMPT))
}

/// The text of a request's last message: a user's text or a tool's result; empty for
/// anything else.
pub fn last_text(request: &ChatRequest) -> String {
    match request.messages.last() {
        Some(Message::User { content }) => content.text(),
        Some(Message::Tool { content, .. }) => content.clone(),
        _ => String::new(),
    }
}

/// The echo answer: `reply: <last line of the user's text>` to a user message,
/// `done: <result>` to a tool result, `reply: ` to anything else. No usage, no finish
/// reason.
pub fn echo(request: &ChatRequest) -> Completion {
    let content = match request.messages.last() {
        Some(Message::Tool { content, .. }) => format!("done: {content}"),
        _ => format!(
            "reply: {}",
            last_text(request).lines().last().unwrap_or_default()
        ),
    };
    Completion {
        content,
        ..Completion::default()
    }
}

/// A request for `model` with `messages` and nothing else (no tools, no sampling settings).
pub fn chat_request(model: &str, messages: Vec<Message>) -> ChatRequest {
    ChatRequest {
        model: model.to_owned(),
        messages,
        tools: Default::default(),
        tool_choice: None,
        parallel_tool_calls: None,
        temperature: None,
        max_completion_tokens: None,
        prompt_cache_key: None,
    }
}

/// A final text answer, with a fixed usage of 10 + 2 tokens.
pub fn text(t: &str) -> Completion {
    Completion {
        content: t.to_owned(),
        finish_reason: Some("stop".into()),
        usage: Some(Usage {
            prompt_tokens: 10,
            completion_tokens: 2,
            total_tokens: 12,
            ..Usage::default()
        }),
        ..Completion::default()
    }
}

/// An answer that calls tools: `(call id, tool name, arguments)`.
pub fn calls(calls: &[(&str, &str, serde_json::Value)]) -> Completion {
    Completion {
        tool_calls: calls
            .iter()
            .map(|(id, name, args)| ToolCall::new(*id, *name, args.to_string()))
            .collect(),
        finish_reason: Some("tool_calls".into()),
        ..Completion::default()
    }
}

/// The tool results among `messages`, as `(call id, parsed JSON)`; a result that is not
/// JSON comes back as a JSON string.
pub fn tool_results(messages: &[Message]) -> Vec<(String, serde_json::Value)> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool {
                tool_call_id,
                content,
            } => Some((
                tool_call_id.clone(),
                serde_json::from_str(content).unwrap_or(serde_json::Value::String(content.clone())),
            )),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// The platform

/// A valid 1×1 PNG.
pub const PNG_1X1: &[u8] = &[
    0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1F, 0x15, 0xC4,
    0x89, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0xF8, 0xCF, 0xC0, 0xF0,
    0x1F, 0x00, 0x05, 0x00, 0x01, 0xFF, 0x89, 0x99, 0x3D, 0x1D, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
];

/// One message a [`TestPlatform`] took.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    pub chat: ChatRef,
    pub text: String,
    pub reply_to: Option<String>,
    /// The id the platform gave it.
    pub id: String,
    /// Tokio's clock when it was sent.
    pub at: Instant,
    /// Wall time when it was sent, by the platform's [wall clock](TestPlatform::wall_clock).
    pub wall: DateTime<Utc>,
}

/// What a [`TestPlatform`] does for one image file id.
#[derive(Debug, Clone)]
enum Image {
    Bytes(Vec<u8>),
    /// Never answers.
    Hangs,
}

type WallClock = Box<dyn Fn() -> DateTime<Utc> + Send + Sync>;
type SendHook = Box<dyn Fn(&ChatRef, &str) + Send + Sync>;

/// A chat platform in memory.
///
/// Sends are recorded ([`sent`](TestPlatform::sent), [`wait_sent`](TestPlatform::wait_sent))
/// with ids `bot-1`, `bot-2`, ... (see [`ids`](TestPlatform::ids)), a text whole or in parts
/// ([`parts_at`](TestPlatform::parts_at)); an attempt may be made
/// to fail: the next ones ([`fail_next`](TestPlatform::fail_next)), every one
/// ([`fail_sends`](TestPlatform::fail_sends)) or those into one chat
/// ([`fail_sends_in`](TestPlatform::fail_sends_in)), checked in that order. Images are
/// served by file id ([`serve`](TestPlatform::serve), [`serve_any`](TestPlatform::serve_any),
/// [`hang`](TestPlatform::hang)), any other is not found. Chat admins are set per chat or
/// for every chat. Its name (the session-key prefix) is `test` unless
/// [`named`](TestPlatform::named).
pub struct TestPlatform {
    name: String,
    id_prefix: String,
    next_id: Mutex<u64>,
    wall: WallClock,
    parts_at: Option<String>,
    on_send: Option<SendHook>,
    sent: watch::Sender<Vec<Sent>>,
    attempts: watch::Sender<usize>,
    typing: AtomicUsize,
    next_failures: Mutex<VecDeque<Option<PlatformError>>>,
    failure: Mutex<Option<PlatformError>>,
    chat_failures: Mutex<HashMap<String, PlatformError>>,
    admins: Mutex<HashMap<String, Vec<String>>>,
    admins_everywhere: Mutex<Vec<String>>,
    admin_lookups: std::sync::atomic::AtomicUsize,
    images: Mutex<HashMap<String, Image>>,
    any_image: Mutex<Option<Vec<u8>>>,
    downloads: Mutex<Vec<String>>,
}

impl Default for TestPlatform {
    fn default() -> Self {
        TestPlatform {
            name: "test".into(),
            id_prefix: "bot-".into(),
            next_id: Mutex::new(1),
            wall: Box::new(Utc::now),
            parts_at: None,
            on_send: None,
            sent: watch::Sender::new(Vec::new()),
            attempts: watch::Sender::new(0),
            typing: AtomicUsize::new(0),
            next_failures: Mutex::default(),
            failure: Mutex::default(),
            chat_failures: Mutex::default(),
            admins: Mutex::default(),
            admins_everywhere: Mutex::default(),
            admin_lookups: Default::default(),
            images: Mutex::default(),
            any_image: Mutex::default(),
            downloads: Mutex::default(),
        }
    }
}

impl TestPlatform {
    /// A platform named `test`, with the defaults.
    pub fn new() -> Arc<Self> {
        TestPlatform::default().shared()
    }

    /// Named `name` (`telegram`, say): the prefix of its chats' session keys.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// Message ids `{prefix}{first}`, `{prefix}{first + 1}`, ...; a failed attempt takes
    /// none.
    pub fn ids(mut self, prefix: &str, first: u64) -> Self {
        self.id_prefix = prefix.to_owned();
        self.next_id = Mutex::new(first);
        self
    }

    /// Where [`Sent::wall`] is read (`Utc::now` unless set).
    pub fn wall_clock(mut self, now: impl Fn() -> DateTime<Utc> + Send + Sync + 'static) -> Self {
        self.wall = Box::new(now);
        self
    }

    /// Sends a text in parts split at `separator`, as an adapter splits a long reply: each
    /// part is one attempt (a failure cuts the reply there, with the parts before it in the
    /// caller's `sent`), and a retry skips the parts in `sent`.
    pub fn parts_at(mut self, separator: &str) -> Self {
        self.parts_at = Some(separator.to_owned());
        self
    }

    /// Runs `hook` on every send attempt, before the attempt is counted or recorded: the
    /// bench renders each reply there as the real adapter would.
    pub fn on_send(mut self, hook: impl Fn(&ChatRef, &str) + Send + Sync + 'static) -> Self {
        self.on_send = Some(Box::new(hook));
        self
    }

    pub fn shared(self) -> Arc<Self> {
        Arc::new(self)
    }

    /// Fails the next send attempt with `error` (each call one more attempt).
    pub fn fail_next(&self, error: PlatformError) {
        self.next_failures.lock().unwrap().push_back(Some(error));
    }

    /// Lets the next `parts` send attempts through (even while [`fail_sends`](Self::fail_sends)
    /// fails the rest) and fails the one after with `error`: with
    /// [`parts_at`](Self::parts_at), a long reply cut after `parts` parts.
    pub fn fail_after(&self, parts: usize, error: PlatformError) {
        let mut next = self.next_failures.lock().unwrap();
        next.extend((0..parts).map(|_| None));
        next.push_back(Some(error));
    }

    /// Fails every send attempt with `error`; `None` takes sends again.
    pub fn fail_sends(&self, error: Option<PlatformError>) {
        *self.failure.lock().unwrap() = error;
    }

    /// Fails every send attempt into `chat` with `error`; `None` takes them again.
    pub fn fail_sends_in(&self, chat: &ChatRef, error: Option<PlatformError>) {
        let mut failures = self.chat_failures.lock().unwrap();
        match error {
            Some(error) => failures.insert(chat.session_key(), error),
            None => failures.remove(&chat.session_key()),
        };
    }

    /// The admins of `chat` (platform-qualified ids).
    pub fn set_admins(&self, chat: &ChatRef, admins: &[&str]) {
        self.admins.lock().unwrap().insert(
            chat.session_key(),
            admins.iter().map(|a| (*a).to_owned()).collect(),
        );
    }

    /// How many times a chat's administrators were asked for.
    pub fn admin_lookups(&self) -> usize {
        self.admin_lookups.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The admins of every chat without its own.
    pub fn set_admins_everywhere(&self, admins: &[&str]) {
        *self.admins_everywhere.lock().unwrap() = admins.iter().map(|a| (*a).to_owned()).collect();
    }

    /// Serves `bytes` for the image `file_id`.
    pub fn serve(&self, file_id: &str, bytes: Vec<u8>) {
        self.images
            .lock()
            .unwrap()
            .insert(file_id.to_owned(), Image::Bytes(bytes));
    }

    /// Serves `bytes` for every image without its own.
    pub fn serve_any(&self, bytes: Vec<u8>) {
        *self.any_image.lock().unwrap() = Some(bytes);
    }

    /// A download of `file_id` never answers.
    pub fn hang(&self, file_id: &str) {
        self.images
            .lock()
            .unwrap()
            .insert(file_id.to_owned(), Image::Hangs);
    }

    /// Every message taken so far, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.sent.borrow().clone()
    }

    /// The messages taken into `chat`.
    pub fn sent_in(&self, chat: &ChatRef) -> Vec<Sent> {
        self.sent
            .borrow()
            .iter()
            .filter(|s| s.chat == *chat)
            .cloned()
            .collect()
    }

    /// Waits until `n` messages were taken, for at most [`WAIT_LIMIT`]; every message so far.
    pub async fn wait_sent(&self, n: usize) -> Vec<Sent> {
        self.wait_sent_within(n, WAIT_LIMIT).await
    }

    /// Waits until `n` messages were taken, for at most `limit` of tokio time (virtual in
    /// paused tests).
    pub async fn wait_sent_within(&self, n: usize, limit: Duration) -> Vec<Sent> {
        match wait_for(&self.sent, limit, |sent| sent.len() >= n).await {
            Some(sent) => sent,
            None => panic!("expected {n} sent messages, got {:?}", self.sent()),
        }
    }

    /// Waits until a message that `this` accepts was taken, for at most [`WAIT_LIMIT`];
    /// every message so far. A later message into the same chat answered (a sentinel) is
    /// how a test knows that nothing else went out before it.
    pub async fn wait_sent_where(&self, this: impl Fn(&Sent) -> bool) -> Vec<Sent> {
        match wait_for(&self.sent, WAIT_LIMIT, |sent| sent.iter().any(&this)).await {
            Some(sent) => sent,
            None => panic!("the awaited message was not sent: {:?}", self.sent()),
        }
    }

    /// How many messages were taken so far, without copying them.
    pub fn taken(&self) -> usize {
        self.sent.borrow().len()
    }

    /// Waits until `n` messages were taken, for at most `limit`; false when they were not.
    /// Unlike [`wait_sent_within`](TestPlatform::wait_sent_within) it neither copies the
    /// messages nor panics: the bench counts many replies and reports a shortfall.
    pub async fn wait_taken(&self, n: usize, limit: Duration) -> bool {
        let mut seen = self.sent.subscribe();
        matches!(
            tokio::time::timeout(limit, seen.wait_for(|sent| sent.len() >= n)).await,
            Ok(Ok(_))
        )
    }

    /// Send attempts so far, taken or failed.
    pub fn attempts(&self) -> usize {
        *self.attempts.borrow()
    }

    /// Waits until `n` send attempts were made (taken or failed), for at most
    /// [`WAIT_LIMIT`].
    pub async fn wait_attempts(&self, n: usize) {
        if wait_for(&self.attempts, WAIT_LIMIT, |made| *made >= n)
            .await
            .is_none()
        {
            panic!("expected {n} send attempts, got {}", self.attempts());
        }
    }

    /// "typing..." calls so far.
    pub fn typing(&self) -> usize {
        self.typing.load(Ordering::SeqCst)
    }

    /// The file ids of every download asked for, in order.
    pub fn downloads(&self) -> Vec<String> {
        self.downloads.lock().unwrap().clone()
    }
}

#[async_trait]
impl Platform for TestPlatform {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send(
        &self,
        chat: &ChatRef,
        text: &str,
        reply_to: Option<&str>,
        _key: Option<&str>,
        sent: &mut Vec<String>,
    ) -> Result<SentMessage, PlatformError> {
        if let Some(hook) = &self.on_send {
            hook(chat, text);
        }
        let parts: Vec<&str> = match &self.parts_at {
            Some(separator) => text.split(separator.as_str()).collect(),
            None => vec![text],
        };
        for part in parts.into_iter().skip(sent.len()) {
            self.attempts.send_modify(|n| *n += 1);
            let next = self.next_failures.lock().unwrap().pop_front();
            match next {
                Some(Some(error)) => return Err(error),
                // Let through by `fail_after`, whatever else fails.
                Some(None) => {}
                None => {
                    if let Some(error) = self.failure.lock().unwrap().as_ref() {
                        return Err(copy_platform_error(error));
                    }
                    let failures = self.chat_failures.lock().unwrap();
                    if let Some(error) = failures.get(&chat.session_key()) {
                        return Err(copy_platform_error(error));
                    }
                }
            }
            let id = {
                let mut next = self.next_id.lock().unwrap();
                let id = format!("{}{next}", self.id_prefix);
                *next += 1;
                id
            };
            let record = Sent {
                chat: chat.clone(),
                text: part.to_owned(),
                reply_to: reply_to.filter(|_| sent.is_empty()).map(str::to_owned),
                id: id.clone(),
                at: Instant::now(),
                wall: (self.wall)(),
            };
            self.sent.send_modify(|all| all.push(record));
            sent.push(id);
        }
        Ok(SentMessage {
            message_ids: sent.clone(),
        })
    }

    async fn send_typing(&self, _chat: &ChatRef) -> Result<(), PlatformError> {
        self.typing.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn chat_admins(&self, chat: &ChatRef) -> Result<Vec<String>, PlatformError> {
        self.admin_lookups
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let own = self
            .admins
            .lock()
            .unwrap()
            .get(&chat.session_key())
            .cloned();
        Ok(own.unwrap_or_else(|| self.admins_everywhere.lock().unwrap().clone()))
    }

    async fn download_image(&self, image: &ImageRef) -> Result<Vec<u8>, PlatformError> {
        self.downloads.lock().unwrap().push(image.file_id.clone());
        let served = self.images.lock().unwrap().get(&image.file_id).cloned();
        match served {
            Some(Image::Bytes(bytes)) => Ok(bytes),
            Some(Image::Hangs) => std::future::pending().await,
            None => self
                .any_image
                .lock()
                .unwrap()
                .clone()
                .ok_or_else(|| PlatformError::NotFound(image.file_id.clone())),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Roles in other chats

/// Roles in any chat ([`RoleResolver`]), as a table the test fills.
///
/// A lookup is counted ([`lookups`](TestRoles::lookups)), then answered by the first that
/// applies: a user's role everywhere ([`everywhere`](TestRoles::everywhere)); an error for a
/// chat made unreadable ([`unreadable`](TestRoles::unreadable)); a role set for the user in
/// that chat ([`set`](TestRoles::set)); chat admin when the chat is on the platform given
/// to [`admins_from`](TestRoles::admins_from) and the platform names the user among its
/// admins; else member.
#[derive(Default)]
pub struct TestRoles {
    everywhere: Mutex<HashMap<String, Role>>,
    in_chat: Mutex<HashMap<(String, String), Role>>,
    unreadable: Mutex<Vec<String>>,
    platform: Option<Arc<TestPlatform>>,
    lookups: AtomicUsize,
}

impl TestRoles {
    pub fn new() -> Self {
        Self::default()
    }

    /// Chat admins as `platform` lists them ([`TestPlatform::set_admins`]), asked at each
    /// lookup, so a later `set_admins` counts.
    pub fn admins_from(mut self, platform: Arc<TestPlatform>) -> Self {
        self.platform = Some(platform);
        self
    }

    /// `user_id` holds `role` in every chat (an operator from the config).
    pub fn everywhere(self, user_id: &str, role: Role) -> Self {
        self.everywhere
            .lock()
            .unwrap()
            .insert(user_id.to_owned(), role);
        self
    }

    /// `user_id` holds `role` in `chat`.
    pub fn set(&self, user_id: &str, chat: &ChatRef, role: Role) {
        self.in_chat
            .lock()
            .unwrap()
            .insert((user_id.to_owned(), chat.session_key()), role);
    }

    /// Whether the roles in `chat` cannot be read (`Unavailable`, "timed out"), for anyone
    /// without a role everywhere.
    pub fn unreadable(&self, chat: &ChatRef, unreadable: bool) {
        let mut chats = self.unreadable.lock().unwrap();
        chats.retain(|c| *c != chat.session_key());
        if unreadable {
            chats.push(chat.session_key());
        }
    }

    /// Lookups so far.
    pub fn lookups(&self) -> usize {
        self.lookups.load(Ordering::SeqCst)
    }

    pub fn shared(self) -> Arc<Self> {
        Arc::new(self)
    }
}

#[async_trait]
impl RoleResolver for TestRoles {
    async fn role_in(&self, user_id: &str, chat: &ChatRef) -> Result<Role, RoleError> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        if let Some(role) = self.everywhere.lock().unwrap().get(user_id) {
            return Ok(*role);
        }
        let key = chat.session_key();
        if self.unreadable.lock().unwrap().contains(&key) {
            return Err(RoleError::Unavailable {
                chat: key,
                reason: "timed out".into(),
            });
        }
        let set = self
            .in_chat
            .lock()
            .unwrap()
            .get(&(user_id.to_owned(), key.clone()))
            .copied();
        if let Some(role) = set {
            return Ok(role);
        }
        let Some(platform) = self.platform.as_ref().filter(|p| chat.platform == p.name()) else {
            return Ok(Role::Member);
        };
        let admins = platform
            .chat_admins(chat)
            .await
            .map_err(|e| RoleError::Unavailable {
                chat: key,
                reason: e.to_string(),
            })?;
        Ok(if admins.iter().any(|a| a == user_id) {
            Role::ChatAdmin
        } else {
            Role::Member
        })
    }
}

// ---------------------------------------------------------------------------------------
// The adapters' way in

/// What a [`TestInbox`] does with a delivery (after any [`fail_next`](TestInbox::fail_next)
/// failures are spent).
pub enum InboxMode {
    Accept,
    /// Waits for a permit before accepting: lets a test look at the world mid-delivery.
    Gate(Semaphore),
    /// Fails every delivery as a store error ("disk full").
    FailStore,
    ShuttingDown,
}

/// An [`Inbox`] that records deliveries and chat events, in the mode the test picks.
/// Its waits are woken by each delivery and bounded by [`WAIT_LIMIT`].
pub struct TestInbox {
    pub mode: InboxMode,
    attempts: AtomicUsize,
    failures_left: Mutex<usize>,
    messages: Mutex<Vec<IncomingMessage>>,
    events: Mutex<Vec<ChatEvent>>,
    delivered: tokio::sync::Notify,
}

impl Default for TestInbox {
    fn default() -> Self {
        TestInbox {
            mode: InboxMode::Accept,
            attempts: AtomicUsize::new(0),
            failures_left: Mutex::new(0),
            messages: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
            delivered: tokio::sync::Notify::new(),
        }
    }
}

impl TestInbox {
    pub fn new(mode: InboxMode) -> Arc<Self> {
        Arc::new(TestInbox {
            mode,
            ..TestInbox::default()
        })
    }

    /// The next `n` deliveries (messages or events) fail as a store error ("disk full"),
    /// whatever the mode.
    pub fn fail_next(self, n: usize) -> Self {
        *self.failures_left.lock().unwrap() = n;
        self
    }

    pub fn shared(self) -> Arc<Self> {
        Arc::new(self)
    }

    /// How many of the [`fail_next`](TestInbox::fail_next) failures are still to come.
    pub fn failures_left(&self) -> usize {
        *self.failures_left.lock().unwrap()
    }

    pub fn messages(&self) -> Vec<IncomingMessage> {
        self.messages.lock().unwrap().clone()
    }

    pub fn events(&self) -> Vec<ChatEvent> {
        self.events.lock().unwrap().clone()
    }

    /// Delivery attempts so far (messages and events), taken or refused.
    pub fn attempts(&self) -> usize {
        self.attempts.load(Ordering::SeqCst)
    }

    /// Waits until `n` messages were taken; every message so far.
    pub async fn wait_for(&self, n: usize) -> Vec<IncomingMessage> {
        self.until_delivered(&format!("{n} delivered message(s)"), || {
            let messages = self.messages();
            (messages.len() >= n).then_some(messages)
        })
        .await
    }

    /// Waits until `n` chat events were taken; every event so far.
    pub async fn wait_for_events(&self, n: usize) -> Vec<ChatEvent> {
        self.until_delivered(&format!("{n} delivered event(s)"), || {
            let events = self.events();
            (events.len() >= n).then_some(events)
        })
        .await
    }

    /// Waits, woken by each delivery, until `check` answers `Some`, for at most
    /// [`WAIT_LIMIT`].
    pub async fn until_delivered<T>(&self, what: &str, check: impl Fn() -> Option<T>) -> T {
        let waiting = async {
            loop {
                // Registered before the check, so a delivery in between still wakes it.
                let delivered = self.delivered.notified();
                if let Some(value) = check() {
                    return value;
                }
                delivered.await;
            }
        };
        tokio::time::timeout(WAIT_LIMIT, waiting)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
    }

    /// Counts an attempt and applies the failures to come, then the mode.
    async fn admit(&self) -> Result<(), InboxError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        {
            let mut left = self.failures_left.lock().unwrap();
            if *left > 0 {
                *left -= 1;
                return Err(InboxError::Store("disk full".to_owned()));
            }
        }
        match &self.mode {
            InboxMode::Accept => Ok(()),
            InboxMode::Gate(gate) => {
                gate.acquire().await.expect("the gate stays open").forget();
                Ok(())
            }
            InboxMode::FailStore => Err(InboxError::Store("disk full".to_owned())),
            InboxMode::ShuttingDown => Err(InboxError::ShuttingDown),
        }
    }
}

#[async_trait]
impl Inbox for TestInbox {
    async fn deliver(&self, message: IncomingMessage) -> Result<(), InboxError> {
        self.admit().await?;
        self.messages.lock().unwrap().push(message);
        self.delivered.notify_waiters();
        Ok(())
    }

    async fn chat_event(&self, event: ChatEvent) -> Result<(), InboxError> {
        self.admit().await?;
        self.events.lock().unwrap().push(event);
        self.delivered.notify_waiters();
        Ok(())
    }
}

/// `PlatformError` is not `Clone` (the adapters' errors need not be); the doubles hand out
/// one copy per failed attempt.
fn copy_platform_error(error: &PlatformError) -> PlatformError {
    match error {
        PlatformError::RateLimited(wait) => PlatformError::RateLimited(*wait),
        PlatformError::Conflict(s) => PlatformError::Conflict(s.clone()),
        PlatformError::Refused(s) => PlatformError::Refused(s.clone()),
        PlatformError::Unavailable(s) => PlatformError::Unavailable(s.clone()),
        PlatformError::Unauthorized => PlatformError::Unauthorized,
        PlatformError::NotFound(s) => PlatformError::NotFound(s.clone()),
    }
}

/// The tests' group chat on the [`TestPlatform`]: `test:-100`.
pub fn group() -> ChatRef {
    ChatRef::new("test", "-100")
}

/// A tool call's context in `chat`, by `user_id` (`platform:name`; named by the part after
/// the colon) with `role` and no grants.
pub fn tool_context(chat: &ChatRef, user_id: &str, role: Role) -> ToolContext {
    let name = user_id.split_once(':').map_or(user_id, |(_, name)| name);
    ToolContext {
        session: chat.session_key(),
        caller: Caller {
            user_id: user_id.to_owned(),
            name: name.to_owned(),
            role,
            grants: Vec::new(),
        },
        chat: Some(chat.clone()),
        ..ToolContext::default()
    }
}

/// A group message `id` from `who` (sender `{platform}:{who}`) in `chat`, sent now;
/// addressed to the bot when the text mentions `@parlor`.
pub fn message(chat: &ChatRef, id: u32, who: &str, text: &str) -> IncomingMessage {
    IncomingMessage {
        chat: chat.clone(),
        kind: ChatKind::Group,
        message_id: id.to_string(),
        sender: Sender {
            id: format!("{}:{who}", chat.platform),
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
    }
}

// ---------------------------------------------------------------------------------------
// The store

/// A session manager over `store` and `platform` whose agent has no tools and the prompt
/// `test`: the session layer's tests' usual rig.
pub fn toolless_manager(
    store: Arc<dyn Store>,
    llm: Arc<dyn LlmBackend>,
    platform: &Arc<TestPlatform>,
    config: crate::session::SessionConfig,
    agent: crate::agent::AgentConfig,
) -> crate::session::SessionManager {
    let registry = crate::tool::ToolRegistry::new(Vec::new())
        .unwrap_or_else(|e| panic!("an empty registry is valid: {e}"));
    let agent = crate::agent::Agent::new(llm, registry, "test", agent);
    manager_with(store, agent, platform, config)
}

/// A session manager over `store` and `platform` running `agent`.
pub fn manager_with(
    store: Arc<dyn Store>,
    agent: crate::agent::Agent,
    platform: &Arc<TestPlatform>,
    config: crate::session::SessionConfig,
) -> crate::session::SessionManager {
    crate::session::SessionManager::new(
        store,
        agent,
        vec![Arc::clone(platform) as Arc<dyn Platform>],
        config,
    )
}

/// A store that "dies" after `limit` writes: every later write fails (as I/O) without a
/// trace, so `inner` holds exactly what a `kill -9` after that many (atomic, flushed)
/// writes would have left on disk. Reads always go through.
///
/// Its waits for durability are grouped like the real stores' ([`GroupCommit`]) and
/// counted ([`Store::flushes`]); a test can run code inside each flush
/// ([`CrashStore::on_flush`]) or make every flush fail ([`CrashStore::fail_flushes`]).
pub struct CrashStore {
    inner: Arc<MemoryStore>,
    limit: usize,
    writes: Mutex<usize>,
    commit: GroupCommit,
    flushes_fail: AtomicBool,
    on_flush: Mutex<Option<FlushHook>>,
    refused: Mutex<Option<String>>,
    after_read: Mutex<Option<(String, FlushHook)>>,
}

type FlushHook = Arc<dyn Fn() + Send + Sync>;

impl CrashStore {
    pub fn new(inner: Arc<MemoryStore>, limit: usize) -> Arc<Self> {
        Arc::new(CrashStore {
            inner,
            limit,
            writes: Mutex::new(0),
            commit: GroupCommit::new(),
            flushes_fail: AtomicBool::new(false),
            on_flush: Mutex::new(None),
            refused: Mutex::new(None),
            after_read: Mutex::new(None),
        })
    }

    /// Runs `hook` once, right after the next read of a record of collection `space`: what
    /// another daemon on the same store does between this one's read and its write.
    pub fn after_next_read(&self, space: &str, hook: impl Fn() + Send + Sync + 'static) {
        *self.after_read.lock().unwrap() = Some((space.to_owned(), Arc::new(hook)));
    }

    /// From now on (until `None`) every [`Store::kv_write`] touching collection `space`
    /// fails as I/O, and nothing of it is written: an instance cut off from one part of the
    /// store (its lease heartbeat, say) while the rest goes on.
    pub fn refuse_space(&self, space: Option<&str>) {
        *self.refused.lock().unwrap() = space.map(str::to_owned);
    }

    /// The writes that went through.
    pub fn writes(&self) -> usize {
        *self.writes.lock().unwrap()
    }

    /// From now on every flush fails, and with it every wait for durability: the writes
    /// are in `inner`, but nothing may be told about them.
    pub fn fail_flushes(&self) {
        self.flushes_fail.store(true, Ordering::SeqCst);
    }

    /// Runs `hook` inside every later flush, before it completes (and so before any waiter
    /// it covers returns): it sees the world as it is while the writes are not yet durable.
    pub fn on_flush(&self, hook: impl Fn() + Send + Sync + 'static) {
        *self.on_flush.lock().unwrap() = Some(Arc::new(hook));
    }

    fn flush_now(&self) -> Result<(), StoreError> {
        if self.flushes_fail.load(Ordering::SeqCst) {
            return Err(StoreError::Io("flush failed".into()));
        }
        let hook = self.on_flush.lock().unwrap().clone();
        if let Some(hook) = hook {
            hook();
        }
        self.inner.flush()
    }

    fn write(&self) -> Result<(), StoreError> {
        let mut writes = self.writes.lock().unwrap();
        if *writes >= self.limit {
            return Err(StoreError::Io("killed".into()));
        }
        *writes += 1;
        Ok(())
    }
}

impl Store for CrashStore {
    fn record_inbound(
        &self,
        session: &str,
        message: &StoredMessage,
        intake: Intake,
    ) -> Result<Inbound, StoreError> {
        self.write()?;
        self.inner.record_inbound(session, message, intake)
    }
    fn get_message(&self, s: &str, id: &str) -> Result<Option<StoredMessage>, StoreError> {
        self.inner.get_message(s, id)
    }
    fn recent_messages(&self, s: &str, n: usize) -> Result<Vec<StoredMessage>, StoreError> {
        self.inner.recent_messages(s, n)
    }
    fn load_history(&self, s: &str) -> Result<Vec<Message>, StoreError> {
        self.inner.load_history(s)
    }
    fn load_summary(&self, s: &str) -> Result<Option<crate::store::Summary>, StoreError> {
        self.inner.load_summary(s)
    }
    fn save_history(&self, s: &str, h: &[Message]) -> Result<(), StoreError> {
        self.write()?;
        self.inner.save_history(s, h)
    }
    fn add_pending_with(&self, item: PendingItem, also: Vec<KvWrite>) -> Result<u64, StoreError> {
        self.write()?;
        self.inner.add_pending_with(item, also)
    }
    fn pending(&self) -> Result<Vec<PendingItem>, StoreError> {
        self.inner.pending()
    }
    fn remove_pending(&self, ids: &[u64]) -> Result<(), StoreError> {
        self.write()?;
        self.inner.remove_pending(ids)
    }
    fn commit_turn(&self, c: TurnCommit) -> Result<Option<u64>, StoreError> {
        self.write()?;
        self.inner.commit_turn(c)
    }
    fn reserve_id(&self) -> Result<u64, StoreError> {
        self.inner.reserve_id()
    }
    fn unsent_outbox(&self) -> Result<Vec<OutboxEntry>, StoreError> {
        self.inner.unsent_outbox()
    }
    fn mark_sent(&self, id: u64, ids: &[String]) -> Result<(), StoreError> {
        self.write()?;
        self.inner.mark_sent(id, ids)
    }
    fn record_sent_parts(&self, id: u64, ids: &[String]) -> Result<(), StoreError> {
        self.write()?;
        self.inner.record_sent_parts(id, ids)
    }
    fn mark_failed(&self, id: u64, why: &str) -> Result<(), StoreError> {
        self.write()?;
        self.inner.mark_failed(id, why)
    }
    fn sent_reply(&self, id: u64) -> Result<Option<OutboxEntry>, StoreError> {
        self.inner.sent_reply(id)
    }
    fn get_meta(&self, k: &str) -> Result<Option<String>, StoreError> {
        self.inner.get_meta(k)
    }
    fn set_meta(&self, k: &str, v: &str) -> Result<(), StoreError> {
        self.write()?;
        self.inner.set_meta(k, v)
    }
    fn kv_get(&self, s: &str, k: &str) -> Result<Option<String>, StoreError> {
        let value = self.inner.kv_get(s, k);
        let hook = {
            let mut slot = self.after_read.lock().unwrap();
            match slot.as_ref() {
                Some((space, _)) if space == s => slot.take().map(|(_, hook)| hook),
                _ => None,
            }
        };
        if let Some(hook) = hook {
            hook();
        }
        value
    }
    fn kv_put(&self, s: &str, k: &str, v: &str) -> Result<(), StoreError> {
        self.write()?;
        self.inner.kv_put(s, k, v)
    }
    fn kv_write(&self, writes: Vec<KvWrite>) -> Result<(), StoreError> {
        if let Some(space) = self.refused.lock().unwrap().as_deref()
            && writes.iter().any(|w| w.space == space)
        {
            return Err(StoreError::Io(format!("writes to {space} refused")));
        }
        self.write()?;
        self.inner.kv_write(writes)
    }
    fn kv_delete(&self, s: &str, k: &str) -> Result<bool, StoreError> {
        self.write()?;
        self.inner.kv_delete(s, k)
    }
    fn kv_scan(&self, s: &str, p: &str) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.kv_scan(s, p)
    }
    fn chat_status(&self, s: &str) -> Result<Option<ChatRecord>, StoreError> {
        self.inner.chat_status(s)
    }
    fn queue_outbox_with(&self, entry: OutboxEntry, also: Vec<KvWrite>) -> Result<u64, StoreError> {
        self.write()?;
        self.inner.queue_outbox_with(entry, also)
    }
    fn set_chat_status(
        &self,
        r: &ChatRecord,
        also: Vec<KvWrite>,
        notices: Vec<OutboxEntry>,
    ) -> Result<Vec<u64>, StoreError> {
        self.write()?;
        self.inner.set_chat_status(r, also, notices)
    }
    fn migrate_session(
        &self,
        from: &ChatRef,
        to: &ChatRef,
        also: Vec<KvWrite>,
    ) -> Result<bool, StoreError> {
        self.write()?;
        self.inner.migrate_session(from, to, also)
    }
    fn migrated_to(&self, s: &str) -> Result<Option<String>, StoreError> {
        self.inner.migrated_to(s)
    }
    fn edit_message(
        &self,
        s: &str,
        m: &StoredMessage,
        p: Option<&str>,
    ) -> Result<Edited, StoreError> {
        self.write()?;
        self.inner.edit_message(s, m, p)
    }
    fn durable(&self) -> futures::future::BoxFuture<'_, Result<(), StoreError>> {
        let ticket = self.commit.ticket();
        Box::pin(self.commit.wait(ticket, || self.flush_now()))
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.commit
            .wait_blocking(self.commit.ticket(), || self.flush_now())
    }
    fn flushes(&self) -> u64 {
        self.commit.flushes()
    }
}

// ---------------------------------------------------------------------------------------
// An auto-chat turn's speech

/// A [`AutoChatSpeech`](crate::tool::AutoChatSpeech) that records what it was asked to say and
/// allows everything: for tests of a tool or the registry outside the session layer (which
/// has the real one, with limits and the outbox).
#[derive(Debug, Default)]
pub struct TestSpeech {
    said: Mutex<Vec<String>>,
}

impl TestSpeech {
    pub fn new() -> Arc<Self> {
        Arc::new(TestSpeech::default())
    }

    /// Everything said so far.
    pub fn said(&self) -> Vec<String> {
        self.said.lock().unwrap().clone()
    }
}

#[async_trait]
impl crate::tool::AutoChatSpeech for TestSpeech {
    async fn say(&self, text: &str) -> Result<crate::tool::Said, crate::tool::ToolError> {
        self.said.lock().unwrap().push(text.to_owned());
        Ok(crate::tool::Said {
            dry_run: false,
            left_in_batch: 1,
            left_this_hour: 1,
        })
    }
}

/// A [`Post`](crate::tool::Post) that records what it was asked to post and answers with
/// made-up message ids (`post-1`, `post-2`...), as a platform that took it would.
#[derive(Default)]
pub struct TestPost {
    posted: Mutex<Vec<String>>,
}

impl TestPost {
    pub fn new() -> Arc<Self> {
        Arc::new(TestPost::default())
    }

    /// Everything posted so far.
    pub fn posted(&self) -> Vec<String> {
        self.posted.lock().unwrap().clone()
    }
}

#[async_trait]
impl crate::tool::Post for TestPost {
    async fn post(
        &self,
        text: &str,
        _reply_to: Option<&str>,
    ) -> Result<crate::tool::Posted, crate::tool::ToolError> {
        let mut posted = self.posted.lock().unwrap();
        posted.push(text.to_owned());
        Ok(crate::tool::Posted::Sent(vec![format!(
            "post-{}",
            posted.len()
        )]))
    }
}

/// splitmix64: a small seeded generator for tests that pick moments and inputs (the chaos
/// run, the quoting properties), so that a failure replays from its seed.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// In `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo).max(1)
    }

    /// In `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.range(0, n as u64) as usize
    }

    /// `true` about `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}
