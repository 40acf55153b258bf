//! [`SessionManager`]: turns platform messages into agent turns, exactly once.
//!
//! The path of a message:
//! 1. [`Inbox::deliver`]: allow-lists, then the message is recorded in the chat's log — the
//!    inbound dedupe (a message already recorded is dropped here). Bot senders, and group
//!    messages that neither mention the bot, reply to it nor are a command, stop here.
//! 2. Commands (`/help`, `/reset`, `/stop`, `/status`) are answered at once.
//! 3. An addressed message is stored as a pending record, then queued on its session (a
//!    burst merges into one item). Only now does `deliver` return, and only now may the
//!    adapter acknowledge the message to the platform.
//! 4. The session actor runs one turn per item (rate-limited per chat) and commits history,
//!    the removal of the pending records and the reply in one store transaction; then it
//!    sends the reply and marks it sent.
//!
//! After a crash, [`SessionManager::resume`] re-queues every pending record (its turn never
//! committed) and resends every committed reply not marked sent.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// tokio's clock, so the rate limit and caches follow paused time in tests.
use tokio::time::Instant;

use async_trait::async_trait;
use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::history::trim_to_budget;
use super::queue::{QueueFull, QueueItem, SessionQueue};
use crate::agent::{Agent, TurnEnd, TurnInput};
use crate::llm::{Content, ContentPart, ImageUrl};
use crate::platform::{ChatKind, ChatRef, Inbox, InboxError, IncomingMessage, Platform, Sender};
use crate::store::{OutboxEntry, PendingItem, PendingKind, Store, StoredMessage, TurnCommit};
use crate::tool::{Caller, Role, catalog};

/// Settings of the session layer; defaults suit a busy group.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// The bot's display name, for its own messages in the log and the console.
    pub bot_name: String,
    /// Platform-qualified ids of admins (`telegram:1001`; `console:*` for every user of a
    /// platform), on top of each chat's own admins.
    pub admins: Vec<String>,
    /// When set, only these chats (session keys or `platform:chat_id`) are served.
    pub allowed_chats: Option<Vec<String>>,
    /// When set, only these users (platform-qualified ids) may address the bot.
    pub allowed_users: Option<Vec<String>>,
    /// Messages from other bots are recorded but never start a turn (bot-to-bot loops).
    pub ignore_bots: bool,
    /// Items a session queue holds (a merged burst counts once).
    pub queue_capacity: usize,
    /// Most turns a chat may start per minute; further input waits (and merges).
    pub turns_per_minute: usize,
    /// History budget in estimated tokens.
    pub history_tokens: usize,
    /// A session actor with nothing to do leaves memory after this long.
    pub idle_timeout: Duration,
    /// How long a chat's administrator list is cached.
    pub admin_cache_ttl: Duration,
    /// Whether images are downloaded and shown to the model.
    pub vision: bool,
    /// Largest input line kept, in characters (longer ones are cut).
    pub max_input_chars: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            bot_name: "parlor".to_owned(),
            admins: Vec::new(),
            allowed_chats: None,
            allowed_users: None,
            ignore_bots: true,
            queue_capacity: 8,
            turns_per_minute: 12,
            history_tokens: 24_000,
            idle_timeout: Duration::from_secs(600),
            admin_cache_ttl: Duration::from_secs(600),
            vision: false,
            max_input_chars: 4000,
        }
    }
}

/// What became of a scheduled input (a clock task firing), as its submitter learns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduledOutcome {
    /// The turn ran and its reply was posted: the platform's message ids. Only this means
    /// "delivered".
    Posted(Vec<String>),
    /// The turn ran but produced nothing to post.
    NoReply,
    /// The turn ran but the platform did not take the reply (the reason).
    NotDelivered(String),
    /// The model could not be reached (the reason); the chat was told.
    Failed(String),
}

/// Why a scheduled input was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The daemon is shutting down.
    #[error("the daemon is shutting down")]
    ShuttingDown,
    /// No adapter serves the target chat's platform.
    #[error("no adapter serves platform {0:?}")]
    NoPlatform(String),
    /// The target chat's queue is full.
    #[error("the chat's queue is full")]
    QueueFull,
    /// The input could not be stored.
    #[error("storage failed: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// A command the runtime answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Help,
    Reset,
    Stop,
    Status,
}

impl Command {
    /// `/help`, `/help@this_bot` (the adapter strips our own suffix) → a command; anything
    /// else (`/help@other_bot`, `/weather`) is not ours.
    fn parse(text: &str) -> Option<Command> {
        let word = text.split_whitespace().next()?;
        match word {
            "/help" | "/start" => Some(Command::Help),
            "/reset" => Some(Command::Reset),
            "/stop" => Some(Command::Stop),
            "/status" => Some(Command::Status),
            _ => None,
        }
    }
}

/// The live part of one session: its queue, its agent (with per-session toolset state) and
/// the running turn's cancel token.
struct Session {
    key: String,
    queue: SessionQueue,
    agent: Agent,
    /// Held for a whole turn (load history → commit); `/reset` takes it to wait for a
    /// cancelled turn to finish committing before it clears the history.
    turn_lock: tokio::sync::Mutex<()>,
    state: Mutex<SessionState>,
}

#[derive(Default)]
struct SessionState {
    /// Whether an actor task is running for this session.
    actor_running: bool,
    /// Cancels the running turn (`/stop`, `/reset`).
    turn_cancel: Option<CancellationToken>,
    /// Start times of recent turns, for the rate limit.
    recent_turns: VecDeque<Instant>,
    /// Turns run since the daemon started.
    turns: u64,
}

impl Session {
    fn state(&self) -> std::sync::MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Inner {
    store: Arc<dyn Store>,
    template: Agent,
    platforms: HashMap<String, Arc<dyn Platform>>,
    config: SessionConfig,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    admin_cache: Mutex<HashMap<String, (Instant, Vec<String>)>>,
    /// Submitters of scheduled inputs waiting for their outcome, by pending id. Not
    /// durable: after a restart the input still runs, but nobody waits for it.
    waiters: Mutex<HashMap<u64, tokio::sync::oneshot::Sender<ScheduledOutcome>>>,
    tracker: TaskTracker,
    /// Cancelled when shutdown begins: no new input, no new turns.
    draining: CancellationToken,
    /// Cancelled when the grace period is over: running turns stop, uncommitted.
    abort: CancellationToken,
    started: Instant,
}

/// The runtime's session layer; cheap to clone. See the module docs for the message path.
#[derive(Clone)]
pub struct SessionManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SessionManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionManager")
            .field("sessions", &self.lock_sessions().len())
            .finish_non_exhaustive()
    }
}

impl SessionManager {
    /// A manager serving `platforms` with forks of `agent`, persisting in `store`.
    pub fn new(
        store: Arc<dyn Store>,
        agent: Agent,
        platforms: Vec<Arc<dyn Platform>>,
        config: SessionConfig,
    ) -> Self {
        SessionManager {
            inner: Arc::new(Inner {
                store,
                template: agent,
                platforms: platforms
                    .into_iter()
                    .map(|p| (p.name().to_owned(), p))
                    .collect(),
                config,
                sessions: Mutex::new(HashMap::new()),
                admin_cache: Mutex::new(HashMap::new()),
                waiters: Mutex::new(HashMap::new()),
                tracker: TaskTracker::new(),
                draining: CancellationToken::new(),
                abort: CancellationToken::new(),
                started: Instant::now(),
            }),
        }
    }

    fn lock_sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// After a restart: re-queues every pending input (its turn never committed) and resends
    /// every committed reply that was not marked sent. Call before the adapters start.
    pub async fn resume(&self) -> Result<(), crate::store::StoreError> {
        for entry in self.inner.store.unsent_outbox()? {
            tracing::info!(session = %entry.session, outbox = entry.id, "resending a reply from before the restart");
            // Whatever happens is logged inside; the restart path has nobody to tell.
            let _ = self.send_outbox(&entry).await;
        }
        let pending = self.inner.store.pending()?;
        if !pending.is_empty() {
            tracing::info!(
                count = pending.len(),
                "resuming inputs from before the restart"
            );
        }
        for item in pending {
            let queued = QueueItem {
                kind: item.kind,
                chat: item.chat.clone(),
                lines: vec![item.text],
                pending_ids: vec![item.id],
                reply_to: item.reply_to,
                callers: vec![item.caller],
                images: item.images,
            };
            let session = self.session(&item.chat);
            if let Err(QueueFull(dropped)) = session.queue.push(queued) {
                // Only possible when more items were pending than a queue holds: keep the
                // record for the next start rather than drop it.
                tracing::warn!(session = %session.key, ids = ?dropped.pending_ids, "queue full while resuming; kept for later");
            }
            self.ensure_actor(&session);
        }
        Ok(())
    }

    /// Makes every store write so far durable. Called at the points where a crash would
    /// otherwise lose or repeat something: before an addressed message is acknowledged to
    /// the platform, before a committed reply is sent, and after it is marked sent. sled
    /// only writes to disk every few hundred milliseconds on its own; `kill -9` loses what
    /// it has not written.
    async fn durable(&self) -> Result<(), crate::store::StoreError> {
        // Inline, not on the blocking pool: with a flush after every addressed message the
        // pending data is a few KB and the flush takes about 0.3 ms (bot/benches/store.rs),
        // less than a hop to another thread and back.
        self.inner.store.flush()
    }

    /// Stores a system input for `chat` as pending (flushed) and returns its session and
    /// the queue item to push: the common first half of scheduled inputs and notices.
    async fn store_input(
        &self,
        chat: &ChatRef,
        kind: PendingKind,
        text: String,
        caller: Caller,
    ) -> Result<(Arc<Session>, QueueItem), SubmitError> {
        if self.inner.draining.is_cancelled() {
            return Err(SubmitError::ShuttingDown);
        }
        if self.platform(chat).is_none() {
            return Err(SubmitError::NoPlatform(chat.platform.clone()));
        }
        let session = self.session(chat);
        let id = self.inner.store.add_pending(PendingItem {
            id: 0,
            session: session.key.clone(),
            chat: chat.clone(),
            kind,
            caller: caller.clone(),
            text: text.clone(),
            reply_to: None,
            images: Vec::new(),
            received: Utc::now(),
        })?;
        self.durable().await?;
        let item = QueueItem {
            kind,
            chat: chat.clone(),
            lines: vec![text],
            pending_ids: vec![id],
            reply_to: None,
            callers: vec![caller],
            images: Vec::new(),
        };
        Ok((session, item))
    }

    /// Queues a scheduled input (a clock task) for `chat` as its own item — never merged
    /// with other input — and returns where its outcome will arrive. The input is stored as
    /// pending first, so a crash before its turn commits runs it after the restart. The
    /// receiver errs when the turn is abandoned (shutdown).
    pub async fn submit_scheduled(
        &self,
        chat: &ChatRef,
        text: String,
        caller: Caller,
    ) -> Result<tokio::sync::oneshot::Receiver<ScheduledOutcome>, SubmitError> {
        let (session, item) = self
            .store_input(chat, PendingKind::ClockFire, text, caller)
            .await?;
        let id = item.pending_ids[0];
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.lock_waiters().insert(id, tx);
        if session.queue.push(item).is_err() {
            self.lock_waiters().remove(&id);
            self.inner.store.remove_pending(&[id])?;
            return Err(SubmitError::QueueFull);
        }
        self.ensure_actor(&session);
        Ok(rx)
    }

    /// Queues a notice for `chat` (a background task's result) as a stackable
    /// `task_result` item: several notices while the session is busy merge into one turn.
    /// Stored as pending first, so it survives a crash. Returns the pending id, which
    /// [`SessionManager::withdraw`] takes.
    pub async fn submit_notice(
        &self,
        chat: &ChatRef,
        text: String,
        caller: Caller,
    ) -> Result<u64, SubmitError> {
        let (session, item) = self
            .store_input(chat, PendingKind::TaskResult, text, caller)
            .await?;
        let id = item.pending_ids[0];
        if session.queue.push(item).is_err() {
            // The record stays pending: the notice is delivered at the next start rather
            // than lost.
            tracing::warn!(session = %session.key, pending = id, "queue full; the notice waits for the next start");
            return Err(SubmitError::QueueFull);
        }
        self.ensure_actor(&session);
        Ok(id)
    }

    /// Withdraws a queued input that has not started its turn yet (a task notice whose
    /// result the model already read). `true` when it was withdrawn; `false` when it already
    /// ran or is running (then it is delivered once, as usual).
    pub fn withdraw(&self, chat: &ChatRef, pending_id: u64) -> Result<bool, SubmitError> {
        let session = self.session(chat);
        if !session.queue.withdraw(pending_id) {
            return Ok(false);
        }
        self.inner.store.remove_pending(&[pending_id])?;
        Ok(true)
    }

    fn lock_waiters(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<u64, tokio::sync::oneshot::Sender<ScheduledOutcome>>>
    {
        self.inner.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of sessions in memory.
    pub fn live_sessions(&self) -> usize {
        self.lock_sessions().len()
    }

    /// Whether nothing is queued or running and no reply waits to be sent: what `parlor
    /// chat` waits for after its input ends.
    pub fn is_idle(&self) -> bool {
        let busy = self
            .lock_sessions()
            .values()
            .any(|s| !s.queue.is_empty() || s.state().turn_cancel.is_some());
        !busy
            && self.inner.store.pending().is_ok_and(|p| p.is_empty())
            && self.inner.store.unsent_outbox().is_ok_and(|o| o.is_empty())
    }

    /// Stops intake, lets running turns finish for up to `grace`, then cancels them (they
    /// stay pending and resume after the next start), waits for every actor and flushes.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.draining.cancel();
        self.inner.tracker.close();
        if tokio::time::timeout(grace, self.inner.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                ?grace,
                "turns still running after the grace period; cancelling them"
            );
            self.inner.abort.cancel();
            self.inner.tracker.wait().await;
        }
        if let Err(e) = self.inner.store.flush() {
            tracing::error!(error = %e, "could not flush the store on shutdown");
        }
    }

    /// The session of `chat`, created on first use.
    fn session(&self, chat: &ChatRef) -> Arc<Session> {
        let key = chat.session_key();
        let mut sessions = self.lock_sessions();
        Arc::clone(sessions.entry(key.clone()).or_insert_with(|| {
            Arc::new(Session {
                key,
                queue: SessionQueue::new(self.inner.config.queue_capacity),
                agent: self.inner.template.fork(),
                turn_lock: tokio::sync::Mutex::new(()),
                state: Mutex::new(SessionState::default()),
            })
        }))
    }

    /// Starts the session's actor unless one is running.
    fn ensure_actor(&self, session: &Arc<Session>) {
        {
            let mut state = session.state();
            if state.actor_running || self.inner.draining.is_cancelled() {
                return;
            }
            state.actor_running = true;
        }
        let manager = self.clone();
        let session = Arc::clone(session);
        self.inner
            .tracker
            .spawn(async move { manager.actor(session).await });
    }

    fn platform(&self, chat: &ChatRef) -> Option<&Arc<dyn Platform>> {
        self.inner.platforms.get(&chat.platform)
    }

    fn allowed(&self, message: &IncomingMessage) -> bool {
        let config = &self.inner.config;
        if let Some(chats) = &config.allowed_chats {
            let key = message.chat.session_key();
            let plain = format!("{}:{}", message.chat.platform, message.chat.chat_id);
            if !chats.iter().any(|c| *c == key || *c == plain) {
                return false;
            }
        }
        if let Some(users) = &config.allowed_users
            && !users.contains(&message.sender.id)
            && !self.is_config_admin(&message.sender.id)
        {
            return false;
        }
        true
    }

    /// Whether the config names `user_id` an admin, directly or by `platform:*`.
    fn is_config_admin(&self, user_id: &str) -> bool {
        let platform = user_id.split(':').next().unwrap_or_default();
        self.inner
            .config
            .admins
            .iter()
            .any(|a| a == user_id || a.strip_suffix(":*") == Some(platform))
    }

    /// The sender's role: config admins, then the chat's own administrators (cached).
    async fn role_of(&self, sender: &Sender, chat: &ChatRef, kind: ChatKind) -> Role {
        if self.is_config_admin(&sender.id) {
            return Role::Operator;
        }
        if kind == ChatKind::Private {
            return Role::Member;
        }
        let key = format!("{}:{}", chat.platform, chat.chat_id);
        let cached = {
            let cache = self
                .inner
                .admin_cache
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            cache
                .get(&key)
                .filter(|(at, _)| at.elapsed() < self.inner.config.admin_cache_ttl)
                .map(|(_, ids)| ids.contains(&sender.id))
        };
        if let Some(is_admin) = cached {
            return if is_admin {
                Role::ChatAdmin
            } else {
                Role::Member
            };
        }
        let Some(platform) = self.platform(chat) else {
            return Role::Member;
        };
        match tokio::time::timeout(Duration::from_secs(10), platform.chat_admins(chat)).await {
            Ok(Ok(ids)) => {
                let is_admin = ids.contains(&sender.id);
                self.inner
                    .admin_cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, (Instant::now(), ids));
                if is_admin {
                    Role::ChatAdmin
                } else {
                    Role::Member
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(chat = %chat, error = %e, "cannot read the chat's administrators; treating the sender as a member");
                Role::Member
            }
            Err(_) => {
                tracing::warn!(chat = %chat, "reading the chat's administrators timed out");
                Role::Member
            }
        }
    }

    /// Sends a notice straight to a chat (commands, overflow); failures are logged only.
    async fn notify(&self, chat: &ChatRef, text: &str, reply_to: Option<&str>) {
        let Some(platform) = self.platform(chat) else {
            tracing::error!(chat = %chat, "no adapter for this chat's platform");
            return;
        };
        match platform.send_message(chat, text, reply_to).await {
            Ok(sent) => self.record_own(chat, text, reply_to, &sent.message_ids),
            Err(e) => tracing::warn!(chat = %chat, error = %e, "could not send a notice"),
        }
    }

    /// Records the bot's own message in the chat log, so context shows both sides.
    fn record_own(&self, chat: &ChatRef, text: &str, reply_to: Option<&str>, ids: &[String]) {
        let Some(first) = ids.first() else { return };
        let message = StoredMessage::from_bot(
            &chat.platform,
            &self.inner.config.bot_name,
            first,
            text,
            reply_to,
        );
        if let Err(e) = self
            .inner
            .store
            .record_message(&chat.session_key(), &message)
        {
            tracing::warn!(chat = %chat, error = %e, "could not record the bot's own message");
        }
    }

    async fn command(&self, command: Command, message: &IncomingMessage, role: Role) {
        let chat = &message.chat;
        let reply_to = Some(message.message_id.as_str());
        let session = self.session(chat);
        let text = match command {
            Command::Help => {
                let tools = catalog::to_help(session.agent.tools());
                format!(
                    "Mention me or reply to one of my messages to talk to me.\n\n\
                     Commands:\n/help — this text\n/status — what I am doing\n\
                     /stop — stop my current answer\n/reset — forget this chat's conversation \
                     and plan; its memory stays (admins in groups)\n\nTools I can use:\n{}",
                    if tools.is_empty() {
                        "none".to_owned()
                    } else {
                        tools
                    }
                )
            }
            Command::Stop => {
                let cancel = session.state().turn_cancel.clone();
                match cancel {
                    Some(token) => {
                        token.cancel();
                        "Stopped.".to_owned()
                    }
                    None => "I am not working on anything.".to_owned(),
                }
            }
            Command::Reset => {
                if message.kind == ChatKind::Group && role < Role::ChatAdmin {
                    "Only an admin can reset this chat.".to_owned()
                } else {
                    match self.reset(&session).await {
                        Ok(()) => "Done: I forgot this chat's conversation and plans.".to_owned(),
                        Err(e) => {
                            tracing::error!(session = %session.key, error = %e, "reset failed");
                            "The reset failed; the operator can see why in the log.".to_owned()
                        }
                    }
                }
            }
            Command::Status => {
                let (running, turns) = {
                    let state = session.state();
                    (state.turn_cancel.is_some(), state.turns)
                };
                let history = self
                    .inner
                    .store
                    .load_history(&session.key)
                    .map(|h| h.len())
                    .unwrap_or(0);
                format!(
                    "Session {}\n{}\nQueued: {}\nHistory: {history} messages\nTurns since start: {turns}\n\
                     Model: {}\nTools: {}\nUp for {} min",
                    session.key,
                    if running {
                        "Working on an answer."
                    } else {
                        "Idle."
                    },
                    session.queue.len(),
                    session.agent.config().model,
                    session.agent.tools().names().len(),
                    self.inner.started.elapsed().as_secs() / 60
                )
            }
        };
        self.notify(chat, &text, reply_to).await;
    }

    /// `/reset`: stop the running turn, wait for it to commit, then clear history, queue,
    /// pending records and toolset state.
    async fn reset(&self, session: &Session) -> Result<(), crate::store::StoreError> {
        let dropped = session.queue.clear();
        if let Some(token) = session.state().turn_cancel.clone() {
            token.cancel();
        }
        let _turn = session.turn_lock.lock().await;
        session.agent.tools().reset();
        self.inner.store.save_history(&session.key, &[])?;
        let mut ids: Vec<u64> = dropped.into_iter().flat_map(|i| i.pending_ids).collect();
        ids.extend(
            self.inner
                .store
                .pending()?
                .into_iter()
                .filter(|p| p.session == session.key)
                .map(|p| p.id),
        );
        self.inner.store.remove_pending(&ids)
    }

    /// The actor: runs queued items one at a time until the queue stays empty for
    /// `idle_timeout` or shutdown begins.
    async fn actor(self, session: Arc<Session>) {
        loop {
            if self.inner.draining.is_cancelled() {
                break;
            }
            let Some(item) = session.queue.pop() else {
                let idle = tokio::time::sleep(self.inner.config.idle_timeout);
                tokio::select! {
                    () = session.queue.notified() => continue,
                    () = idle => {}
                    () = self.inner.draining.cancelled() => break,
                }
                // Leave memory only if nothing arrived meanwhile; the check and the flag
                // change happen under the state lock that `ensure_actor` takes too.
                let mut state = session.state();
                if session.queue.is_empty() {
                    state.actor_running = false;
                    drop(state);
                    self.evict_if_idle(&session);
                    return;
                }
                continue;
            };
            if !self.rate_limit(&session).await {
                // Shutdown while waiting: the item stays pending in the store.
                break;
            }
            self.run_item(&session, item).await;
        }
        session.state().actor_running = false;
    }

    /// Drops an idle session from memory; its history and log stay in the store.
    fn evict_if_idle(&self, session: &Arc<Session>) {
        let mut sessions = self.lock_sessions();
        let state = session.state();
        if !state.actor_running && session.queue.is_empty() && state.turn_cancel.is_none() {
            // Toolset state that is not in the store (the todo plan) would be lost with the
            // session, so such a session stays.
            if !session.agent.tools().holds_session_state() {
                sessions.remove(&session.key);
            }
        }
    }

    /// Waits until the chat may start another turn; `false` when shutdown began meanwhile.
    async fn rate_limit(&self, session: &Session) -> bool {
        let per_minute = self.inner.config.turns_per_minute.max(1);
        loop {
            let wait = {
                let mut state = session.state();
                let now = Instant::now();
                while state
                    .recent_turns
                    .front()
                    .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(60))
                {
                    state.recent_turns.pop_front();
                }
                if state.recent_turns.len() < per_minute {
                    state.recent_turns.push_back(now);
                    return true;
                }
                let oldest = state.recent_turns.front().copied().unwrap_or(now);
                Duration::from_secs(60).saturating_sub(now.duration_since(oldest))
            };
            tracing::info!(session = %session.key, ?wait, "rate limit: waiting before the next turn");
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.inner.draining.cancelled() => return false,
            }
        }
    }

    /// The turn's input content: the text, plus images when vision is on.
    async fn input_content(&self, item: &QueueItem) -> Content {
        let text = item.text();
        if item.images.is_empty() {
            return Content::Text(text);
        }
        if !self.inner.config.vision {
            // The model should know a picture was part of the message, even unseen.
            let n = item.images.len();
            return Content::Text(format!(
                "{text}\n[{n} image{} attached; this model cannot see images]",
                if n == 1 { "" } else { "s" }
            ));
        }
        let Some(platform) = self.platform(&item.chat) else {
            return Content::Text(text);
        };
        let mut parts = vec![ContentPart::Text { text }];
        for image in item.images.iter().take(4) {
            match tokio::time::timeout(Duration::from_secs(60), platform.download_image(image))
                .await
            {
                Ok(Ok(bytes)) => {
                    let mime = image.mime_type.as_deref().unwrap_or("image/jpeg");
                    parts.push(ContentPart::ImageUrl {
                        image_url: ImageUrl {
                            url: format!("data:{mime};base64,{}", base64_encode(&bytes)),
                            detail: None,
                        },
                    });
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, file = %image.file_id, "image download failed");
                    parts.push(ContentPart::Text {
                        text: "[an attached image could not be loaded]".to_owned(),
                    });
                }
                Err(_) => parts.push(ContentPart::Text {
                    text: "[an attached image took too long to load]".to_owned(),
                }),
            }
        }
        Content::Parts(parts)
    }

    async fn run_item(&self, session: &Session, item: QueueItem) {
        let _turn = session.turn_lock.lock().await;
        let cancel = self.inner.abort.child_token();
        {
            let mut state = session.state();
            state.turn_cancel = Some(cancel.clone());
            state.turns += 1;
        }
        let outcome = self.turn(session, &item, &cancel).await;
        session.state().turn_cancel = None;
        let report = match outcome {
            TurnOutcome::Reply {
                entry,
                model_failed,
            } => {
                let sent = self.send_outbox(&entry).await;
                Some(match (sent, model_failed) {
                    (_, Some(reason)) => ScheduledOutcome::Failed(reason),
                    (Ok(ids), None) => ScheduledOutcome::Posted(ids),
                    (Err(reason), None) => ScheduledOutcome::NotDelivered(reason),
                })
            }
            TurnOutcome::NoReply => Some(ScheduledOutcome::NoReply),
            // Abandoned: the waiter is dropped and its submitter sees the turn cancelled.
            TurnOutcome::Abandoned => None,
        };
        for id in &item.pending_ids {
            let waiter = self.lock_waiters().remove(id);
            if let (Some(waiter), Some(report)) = (waiter, report.clone()) {
                // The submitter may have given up waiting; nothing to do then.
                let _ = waiter.send(report);
            }
        }
    }

    /// Runs one turn and commits it; returns the reply to send.
    async fn turn(
        &self,
        session: &Session,
        item: &QueueItem,
        cancel: &CancellationToken,
    ) -> TurnOutcome {
        let store = &self.inner.store;
        let history = match store.load_history(&session.key) {
            Ok(h) => h,
            Err(e) => {
                tracing::error!(session = %session.key, error = %e, "cannot load history; starting fresh for this turn");
                Vec::new()
            }
        };
        let input = TurnInput {
            session: session.key.clone(),
            caller: item.caller(),
            content: self.input_content(item).await,
            chat: Some(item.chat.clone()),
            platform: self.platform(&item.chat).cloned(),
            roles: None,
        };
        let platform = self.platform(&item.chat).cloned();
        let chat = item.chat.clone();
        let typing = async move {
            let Some(platform) = platform else {
                return std::future::pending::<()>().await;
            };
            loop {
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), platform.send_typing(&chat)).await;
                tokio::time::sleep(Duration::from_secs(4)).await;
            }
        };
        let result = tokio::select! {
            result = session.agent.run_turn(&history, input, cancel.clone()) => result,
            () = typing => unreachable_typing(),
        };

        let (new_messages, reply, model_failed) = match result {
            Ok(turn) if turn.end == TurnEnd::Cancelled && self.inner.abort.is_cancelled() => {
                // Shutdown: nothing is committed, the input stays pending and is answered
                // after the restart.
                tracing::info!(session = %session.key, "turn cancelled by shutdown; it resumes after restart");
                return TurnOutcome::Abandoned;
            }
            Ok(turn) => {
                let reply = match turn.end {
                    TurnEnd::Cancelled => None,
                    _ if turn.reply.trim().is_empty() => {
                        Some("(I have no answer to that.)".to_owned())
                    }
                    _ => Some(turn.reply),
                };
                (turn.messages, reply, None)
            }
            Err(e) => {
                tracing::error!(session = %session.key, error = %e, "turn failed");
                let reason = short_reason(&e.to_string());
                (
                    Vec::new(),
                    Some(format!(
                        "Sorry, I could not reach the language model ({reason}). Please try again later."
                    )),
                    Some(reason),
                )
            }
        };
        let mut history = history;
        history.extend(new_messages);
        trim_to_budget(&mut history, self.inner.config.history_tokens);
        let commit = TurnCommit {
            session: session.key.clone(),
            history,
            answered: item.pending_ids.clone(),
            reply: reply.map(|text| OutboxEntry {
                id: 0,
                session: session.key.clone(),
                chat: item.chat.clone(),
                text,
                reply_to: item.reply_to.clone(),
                created: Utc::now(),
            }),
        };
        let mut outbox = commit.reply.clone();
        match store.commit_turn(commit) {
            Ok(id) => {
                if let (Some(entry), Some(id)) = (outbox.as_mut(), id) {
                    entry.id = id;
                }
                if let Err(e) = self.durable().await {
                    // Sending now could answer twice after a crash; the outbox sends it at
                    // the next start instead.
                    tracing::error!(session = %session.key, error = %e, "cannot flush the committed turn");
                    return TurnOutcome::Abandoned;
                }
                match outbox {
                    Some(entry) => TurnOutcome::Reply {
                        entry,
                        model_failed,
                    },
                    None => TurnOutcome::NoReply,
                }
            }
            Err(e) => {
                // The input stays pending and is retried after a restart.
                tracing::error!(session = %session.key, error = %e, "cannot commit the turn");
                TurnOutcome::Abandoned
            }
        }
    }

    /// Sends a committed reply and marks it sent. A refused reply is dropped with a log line
    /// (retrying cannot help); an unreachable platform leaves it for the next start.
    async fn send_outbox(&self, entry: &OutboxEntry) -> Result<Vec<String>, String> {
        let Some(platform) = self.platform(&entry.chat) else {
            tracing::error!(chat = %entry.chat, "no adapter for this reply's platform; it stays in the outbox");
            return Err(format!("no adapter for {}", entry.chat.platform));
        };
        match platform
            .send_message(&entry.chat, &entry.text, entry.reply_to.as_deref())
            .await
        {
            Ok(sent) => {
                let marked = self.inner.store.mark_sent(entry.id, &sent.message_ids);
                if let Err(e) = match marked {
                    Ok(()) => self.durable().await,
                    Err(e) => Err(e),
                } {
                    tracing::error!(outbox = entry.id, error = %e, "reply sent but not marked; it may be sent again after a restart");
                }
                self.record_own(
                    &entry.chat,
                    &entry.text,
                    entry.reply_to.as_deref(),
                    &sent.message_ids,
                );
                Ok(sent.message_ids)
            }
            Err(crate::platform::PlatformError::Unavailable(e)) => {
                tracing::warn!(outbox = entry.id, error = %e, "platform unreachable; the reply stays in the outbox for the next start");
                Err(format!("platform unreachable: {e}"))
            }
            Err(e) => {
                tracing::error!(outbox = entry.id, chat = %entry.chat, error = %e, "the platform refused the reply; dropping it");
                if let Err(e) = self.inner.store.mark_sent(entry.id, &[]) {
                    tracing::error!(outbox = entry.id, error = %e, "cannot drop the refused reply");
                }
                Err(e.to_string())
            }
        }
    }
}

/// How a turn ended, for the actor.
enum TurnOutcome {
    /// Committed with a reply to send; `model_failed` holds the reason when the reply is
    /// the "could not reach the model" notice.
    Reply {
        entry: OutboxEntry,
        model_failed: Option<String>,
    },
    /// Committed without a reply (stopped).
    NoReply,
    /// Nothing committed (shutdown, store failure): the input stays pending.
    Abandoned,
}

fn unreachable_typing() -> Result<crate::agent::Turn, crate::agent::AgentError> {
    // The typing loop never ends; `select!` needs a value of the same type for its arm.
    Err(crate::agent::AgentError::Llm(
        crate::llm::LlmError::Cancelled,
    ))
}

/// The first line of an error, capped, for a chat notice (the full error is in the log).
fn short_reason(error: &str) -> String {
    let line = error.lines().next().unwrap_or("unknown error");
    let mut out: String = line.chars().take(160).collect();
    if line.chars().count() > 160 {
        out.push('…');
    }
    out
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}… [cut]", &text[..i]),
        None => text.to_owned(),
    }
}

#[async_trait]
impl Inbox for SessionManager {
    async fn deliver(&self, message: IncomingMessage) -> Result<(), InboxError> {
        if self.inner.draining.is_cancelled() {
            return Err(InboxError::ShuttingDown);
        }
        if !self.allowed(&message) {
            tracing::debug!(chat = %message.chat, sender = %message.sender.id, "message outside the allow-lists ignored");
            return Ok(());
        }
        let session_key = message.chat.session_key();
        let stored = StoredMessage {
            message_id: message.message_id.clone(),
            sender: message.sender.clone(),
            text: message.text.clone(),
            time: message.time,
            reply_to: message.reply_to.clone(),
            images: message.images.clone(),
            from_self: false,
        };
        let fresh = self
            .inner
            .store
            .record_message(&session_key, &stored)
            .map_err(|e| InboxError::Store(e.to_string()))?;
        if !fresh {
            tracing::debug!(session = %session_key, message = %message.message_id, "duplicate delivery ignored");
            return Ok(());
        }
        if message.sender.is_bot && self.inner.config.ignore_bots {
            return Ok(());
        }
        let command = Command::parse(&message.text);
        let addressed = message.kind == ChatKind::Private
            || message.mentions_bot
            || message.reply_to_bot
            || command.is_some();
        if !addressed {
            return Ok(());
        }
        let role = self
            .role_of(&message.sender, &message.chat, message.kind)
            .await;
        if let Some(command) = command {
            self.command(command, &message, role).await;
            return Ok(());
        }

        let caller = Caller {
            user_id: message.sender.id.clone(),
            name: message.sender.name.clone(),
            role,
        };
        let text = format!(
            "{}: {}",
            message.sender.name,
            truncate_chars(message.text.trim(), self.inner.config.max_input_chars)
        );
        let pending = PendingItem {
            id: 0,
            session: session_key,
            chat: message.chat.clone(),
            kind: PendingKind::UserMessage,
            caller: caller.clone(),
            text: text.clone(),
            reply_to: Some(message.message_id.clone()),
            images: message.images.clone(),
            received: Utc::now(),
        };
        let id = self
            .inner
            .store
            .add_pending(pending)
            .map_err(|e| InboxError::Store(e.to_string()))?;
        self.durable()
            .await
            .map_err(|e| InboxError::Store(e.to_string()))?;
        let session = self.session(&message.chat);
        let item = QueueItem {
            kind: PendingKind::UserMessage,
            chat: message.chat.clone(),
            lines: vec![text],
            pending_ids: vec![id],
            reply_to: Some(message.message_id.clone()),
            callers: vec![caller],
            images: message.images.clone(),
        };
        if let Err(QueueFull(item)) = session.queue.push(item) {
            // Told, not dropped: the sender learns to ask again, and the record goes.
            let _ = self.inner.store.remove_pending(&item.pending_ids);
            self.notify(
                &message.chat,
                "I have too many messages waiting in this chat; please ask again in a minute.",
                Some(&message.message_id),
            )
            .await;
            return Ok(());
        }
        self.ensure_actor(&session);
        Ok(())
    }
}
