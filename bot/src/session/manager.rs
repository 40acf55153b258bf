//! [`SessionManager`]: the public face of the session layer (scheduled inputs, notices,
//! resume, shutdown) and what its stages share: the store, the agent template, the
//! platforms, the config and the shutdown tokens, each read through an accessor here. The
//! chats that run, and their workers, belong to the [`Dispatcher`](super::dispatcher).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

// tokio's clock, so the rate limit and caches follow paused time in tests.
use tokio::time::Instant;

use chrono::Utc;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::dispatcher::{Chats, Dispatcher};
use super::input::Wait;
use super::outbox::Lanes;
use super::queue::{QueueItem, ScheduledOutcome, SessionQueue, Waiter};
use crate::agent::Agent;
use crate::platform::{ChatRef, Platform};
use crate::store::{KvWrite, PendingItem, PendingKind, Store, StoreError};
use crate::tool::Caller;

/// Settings of the session layer; defaults suit a busy group.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// The bot's display name, for its own messages in the log and the console.
    pub bot_name: String,
    /// Platform-qualified ids of the operators (`telegram:1001`; `console:*` for every
    /// user of a platform): the config's `bot.admins`, the only ones who may reach the host.
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
    /// History budget in estimated tokens: the trim that keeps every request within the
    /// model's context even when compaction is off or fails.
    pub history_tokens: usize,
    /// The model's context window in tokens (`llm.context_window`).
    pub context_window: usize,
    /// Compaction starts when a turn's last request (prompt + completion) reaches the
    /// agent's fixed prompt plus this share of what `context_window` leaves after it
    /// (`session/compact.rs`); 0 turns compaction off.
    pub compact_ratio: f64,
    /// Newest turns a compaction keeps word for word.
    pub compact_keep_turns: usize,
    /// A chat worker with nothing to do leaves memory after this long.
    pub idle_timeout: Duration,
    /// How long a chat's administrator list is cached.
    pub admin_cache_ttl: Duration,
    /// Largest input line kept, in characters (longer ones are cut).
    pub max_input_chars: usize,
    /// When set, a chat whose tokens today (UTC) reach this runs no more turns that day,
    /// and is told so once (`session/usage.rs`).
    pub daily_tokens_per_chat: Option<u64>,
    /// When set, a member whose tokens today (UTC, across chats) reach this is not answered
    /// again that day, and is told so once in each chat (`session/usage.rs`).
    pub daily_tokens_per_member: Option<u64>,
    /// `[llm.prices]`: what each model's tokens cost, for the cost kept beside the tokens.
    pub prices: crate::llm::Prices,
    /// The groups the bot runs auto-chat in ([`super::auto_chat`]); empty: none.
    pub auto_chat: Vec<super::AutoChat>,
    /// Most commands (`/help`, `/status`...) one member may have answered per minute in a
    /// chat; past it, one notice, then they are only recorded. Operators are not limited.
    pub commands_per_member_per_minute: usize,
    /// The same for a whole chat.
    pub commands_per_chat_per_minute: usize,
    /// Where the sessions read wall time (arrival times, the day usage counts in, auto-chat's
    /// hourly limit, traces): the system clock; tests anchor it to paused tokio time.
    pub wall_time: crate::time::WallTime,
    /// Several daemons on one store: this instance's id and its leases' timing
    /// ([`super::cluster`]); `None`: this daemon runs every chat.
    pub cluster: Option<super::cluster::Cluster>,
    /// The operator's frame for the groups' own settings ([`super::settings`]).
    pub groups: super::settings::GroupPolicy,
    /// The models a group may choose by name (`[[llm.models]]`), with their clients.
    pub group_models: Vec<GroupModel>,
    /// How long a tool call waits for approval before it counts as denied.
    pub approval_timeout: Duration,
}

/// A model a group may choose: its name in `/set model`, the model asked for and the
/// client (with the main model behind it, so a failing choice still answers).
#[derive(Clone)]
pub struct GroupModel {
    /// The name groups choose it by.
    pub name: String,
    /// The model sent in requests.
    pub model: String,
    /// Its client.
    pub llm: Arc<dyn crate::llm::LlmBackend>,
}

impl std::fmt::Debug for GroupModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupModel")
            .field("name", &self.name)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
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
            context_window: 32_000,
            compact_ratio: 0.7,
            compact_keep_turns: 4,
            idle_timeout: Duration::from_secs(600),
            admin_cache_ttl: Duration::from_secs(600),
            max_input_chars: 4000,
            daily_tokens_per_chat: None,
            daily_tokens_per_member: None,
            prices: crate::llm::Prices::default(),
            auto_chat: Vec::new(),
            commands_per_member_per_minute: 3,
            commands_per_chat_per_minute: 10,
            wall_time: crate::time::WallTime::system(),
            cluster: None,
            groups: super::settings::GroupPolicy::default(),
            group_models: Vec::new(),
            approval_timeout: Duration::from_secs(600),
        }
    }
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
    Store(#[from] StoreError),
}

/// Counters of the session layer, for tests and the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionStats {
    /// Chat workers started since the daemon started.
    pub actors_started: u64,
    /// Chat workers running now.
    pub actors_running: usize,
    /// Sessions that left memory after idling, since the daemon started.
    pub evictions: u64,
    /// Sessions in memory.
    pub live_sessions: usize,
    /// Cluster mode: chat leases held now.
    pub leases_held: usize,
    /// Cluster mode: chats taken over from another instance since the start.
    pub takeovers: u64,
    /// Cluster mode: leases lost to another instance since the start.
    pub leases_lost: u64,
}

/// The live part of one chat, shared by the stages that reach it: its queue (intake
/// pushes, the worker takes), its auto-chat batch (the same, for auto-chat), its agent
/// (with per-session toolset state), and what `/stop`, `/status` and the console see of
/// its work. Each is reached through a method here.
pub(super) struct Session {
    key: String,
    queue: SessionQueue,
    agent: Agent,
    batch: Mutex<super::auto_chat::Batch>,
    status: Mutex<Status>,
    /// Cluster mode: the pending ids its worker took ([`super::cluster::Handled`]).
    handled: Mutex<super::cluster::Handled>,
}

/// What others see of a chat's work, written by its worker.
#[derive(Default)]
struct Status {
    /// Cancels the running turn or compaction (`/stop`).
    cancel: Option<CancellationToken>,
    /// Turns run since the daemon started.
    turns: u64,
    /// The running item's start and input, for the operator's console.
    current: Option<(chrono::DateTime<chrono::Utc>, String)>,
    /// Bumped by every change to the stored history other than a turn's (a compaction, a
    /// chat moving in), so that the worker forgets the copy it keeps
    /// ([`ChatWorker`](super::worker)) and a turn running meanwhile does not keep one it
    /// read before.
    history_changes: u64,
}

/// A chat's work as `/status` and the console see it.
pub(super) struct Seen {
    pub running: bool,
    pub turns: u64,
    pub current: Option<(chrono::DateTime<chrono::Utc>, String)>,
}

impl Session {
    pub(super) fn key(&self) -> &str {
        &self.key
    }

    pub(super) fn queue(&self) -> &SessionQueue {
        &self.queue
    }

    pub(super) fn agent(&self) -> &Agent {
        &self.agent
    }

    /// The unaddressed messages waiting for their auto-chat turn (`auto_chat.rs`).
    pub(super) fn batch(&self) -> MutexGuard<'_, super::auto_chat::Batch> {
        self.batch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pending ids its worker took (kept in cluster mode only).
    pub(super) fn handled(&self) -> MutexGuard<'_, super::cluster::Handled> {
        self.handled.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn status(&self) -> MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether anything waits to run: a queued item or unaddressed messages.
    pub(super) fn has_work(&self) -> bool {
        !self.queue.is_empty() || !self.batch().is_empty()
    }

    /// The worker starts an item (`input` shown to the console); `cancel` stops it. Returns
    /// the count of history changes so far.
    pub(super) fn item_started(
        &self,
        cancel: &CancellationToken,
        at: chrono::DateTime<chrono::Utc>,
        input: String,
    ) -> u64 {
        let mut status = self.status();
        status.cancel = Some(cancel.clone());
        status.current = Some((at, input));
        status.turns += 1;
        status.history_changes
    }

    /// The worker's item (or compaction) ended.
    pub(super) fn item_ended(&self) {
        let mut status = self.status();
        status.cancel = None;
        status.current = None;
    }

    /// The worker compacts between items; `cancel` stops it (`/stop`).
    pub(super) fn compacting(&self, cancel: &CancellationToken) {
        self.status().cancel = Some(cancel.clone());
    }

    /// The token that stops the running item, if one runs.
    pub(super) fn running(&self) -> Option<CancellationToken> {
        self.status().cancel.clone()
    }

    /// The stored history changed other than through a turn: the kept copy is stale.
    pub(super) fn history_changed(&self) {
        let mut status = self.status();
        status.history_changes = status.history_changes.wrapping_add(1);
    }

    /// How many times the stored history changed other than through a turn.
    pub(super) fn history_changes(&self) -> u64 {
        self.status().history_changes
    }

    /// What `/status` and the console show of its work.
    pub(super) fn seen(&self) -> Seen {
        let status = self.status();
        Seen {
            running: status.cancel.is_some(),
            turns: status.turns,
            current: status.current.clone(),
        }
    }
}

/// What the stages share, read through the accessors of [`SessionManager`].
struct Inner {
    store: Arc<dyn Store>,
    template: Agent,
    platforms: HashMap<String, Arc<dyn Platform>>,
    config: SessionConfig,
    /// The chats that run here and their workers.
    dispatcher: Dispatcher,
    admin_cache: Mutex<HashMap<String, (Instant, Vec<String>)>>,
    /// The outbox lanes, one per chat with replies to send.
    lanes: Lanes,
    tracker: TaskTracker,
    /// Cancelled when shutdown begins: no new input, no new turns.
    draining: CancellationToken,
    /// Cancelled when the grace period is over: running turns stop uncommitted, outbox
    /// lanes stop (their replies are sent after the next start).
    abort: CancellationToken,
    started: Instant,
    /// The toolsets' parts in a chat's life (see [`super::life`]).
    hooks: std::sync::RwLock<Vec<Arc<dyn super::life::ChatHook>>>,
    /// Commands answered per member and per chat ([`super::flood`]).
    command_limits: Mutex<super::flood::CommandLimits>,
    /// The groups' stored settings, as intake reads them ([`super::settings`]).
    settings: super::settings::Cache,
    /// Turns each member started per chat in the last hour ([`super::limits`]).
    member_turns: Mutex<super::limits::MemberTurns>,
    /// The turns of this daemon waiting for an approval ([`super::approvals`]).
    approval_waiters: super::approvals::Waiters,
    /// Bounds the approval decisions being checked at once.
    deciding: Arc<tokio::sync::Semaphore>,
    /// The toolsets' commands ([`super::chat_commands`]).
    chat_commands: std::sync::RwLock<Vec<Arc<dyn super::ChatCommand>>>,
}

/// The runtime's session layer; cheap to clone. See the module docs of
/// [`crate::session`] for the path of a message.
#[derive(Clone)]
pub struct SessionManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SessionManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionManager")
            .field("sessions", &self.inner.dispatcher.len())
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
                dispatcher: Dispatcher::default(),
                admin_cache: Mutex::new(HashMap::new()),
                lanes: Lanes::default(),
                tracker: TaskTracker::new(),
                draining: CancellationToken::new(),
                abort: CancellationToken::new(),
                started: Instant::now(),
                // A group's settings move with it like the toolsets' records.
                hooks: std::sync::RwLock::new(vec![Arc::new(super::settings::SettingsHook)]),
                command_limits: Mutex::default(),
                settings: super::settings::Cache::default(),
                member_turns: Mutex::default(),
                approval_waiters: super::approvals::Waiters::default(),
                deciding: super::approvals::deciding(),
                chat_commands: std::sync::RwLock::default(),
            }),
        }
    }

    /// A new session of `key`, for the dispatcher.
    pub(super) fn new_session(&self, key: &str) -> Session {
        Session {
            key: key.to_owned(),
            queue: SessionQueue::new(self.inner.config.queue_capacity),
            agent: self.inner.template.fork(),
            batch: Mutex::default(),
            status: Mutex::default(),
            handled: Mutex::default(),
        }
    }

    /// The chats that run here.
    pub(super) fn dispatcher(&self) -> &Dispatcher {
        &self.inner.dispatcher
    }

    /// The locked map of live chats ([`Chats`]): letting it go starts the worker the
    /// session it handed out last needs.
    pub(super) fn chats(&self) -> Chats<'_> {
        self.inner.dispatcher.lock(self)
    }

    /// The live session of `key`, if any (never creates one).
    pub(super) fn live_session(&self, key: &str) -> Option<Arc<Session>> {
        self.inner.dispatcher.live(key)
    }

    /// The store the sessions write to.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    pub(super) fn config(&self) -> &SessionConfig {
        &self.inner.config
    }

    /// The agent every session forks.
    pub(super) fn template(&self) -> &Agent {
        &self.inner.template
    }

    /// Cancelled when shutdown begins: no new input, no new turns.
    pub(super) fn draining(&self) -> &CancellationToken {
        &self.inner.draining
    }

    /// Cancelled when the grace period is over.
    pub(super) fn abort(&self) -> &CancellationToken {
        &self.inner.abort
    }

    /// Owns every task of the session layer (workers, lanes, the system inputs).
    pub(super) fn tracker(&self) -> &TaskTracker {
        &self.inner.tracker
    }

    pub(super) fn lanes(&self) -> &Lanes {
        &self.inner.lanes
    }

    /// When the daemon started, for `/status`.
    pub(super) fn started(&self) -> Instant {
        self.inner.started
    }

    pub(super) fn admin_cache(&self) -> &Mutex<HashMap<String, (Instant, Vec<String>)>> {
        &self.inner.admin_cache
    }

    pub(super) fn command_limits(&self) -> &Mutex<super::flood::CommandLimits> {
        &self.inner.command_limits
    }

    /// Registers a toolset's [`ChatHook`](super::ChatHook); call before the adapters start.
    pub fn add_chat_hook(&self, hook: Arc<dyn super::ChatHook>) {
        self.inner
            .hooks
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(hook);
    }

    /// What holds in the chat of `session` now: the operator's frame and the group's
    /// choices ([`super::settings`]).
    pub fn effective(&self, session: &str) -> super::settings::Effective {
        let config = self.config();
        let stored = self.inner.settings.get(
            self.store().as_ref(),
            super::settings::chat_key(session),
            config.cluster.is_some(),
        );
        let listed = super::auto_chat::listed(config, session);
        config.groups.effective(&stored, listed)
    }

    /// What `/settings` says of the chat of `session`, and its last changes, newest first
    /// (the operator's console).
    pub fn settings_view(
        &self,
        session: &str,
    ) -> Result<(String, Vec<super::settings::Change>), StoreError> {
        let effective = self.effective(session);
        let text = super::settings::settings_text(&self.config().groups, &effective);
        let changes = super::settings::log(
            self.store().as_ref(),
            super::settings::chat_key(session),
            20,
        )?;
        Ok((text, changes))
    }

    /// Forgets the cached settings of `session` (changed, or moved).
    pub(super) fn settings_changed(&self, session: &str) {
        self.inner
            .settings
            .forget(super::settings::chat_key(session));
    }

    /// The members' turns in the last hour, per chat.
    pub(super) fn member_turns(&self) -> MutexGuard<'_, super::limits::MemberTurns> {
        self.inner
            .member_turns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// What a turn waiting on approval record `key` is woken by.
    pub(super) fn approval_waiter(&self, key: &str) -> Arc<tokio::sync::Notify> {
        self.inner.approval_waiters.waiter(key)
    }

    /// The turn waiting on `key` is answered.
    pub(super) fn approval_done(&self, key: &str) {
        self.inner.approval_waiters.done(key);
    }

    /// `key` was decided: its turn, when it waits here, reads it now.
    pub(super) fn approval_decided(&self, key: &str) {
        self.inner.approval_waiters.wake(key);
    }

    /// The permits of approval decisions being checked.
    pub(super) fn deciding(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.inner.deciding
    }

    /// The named model `name` a group may choose, if the operator offers it.
    pub(super) fn group_model(&self, name: &str) -> Option<&GroupModel> {
        self.config().group_models.iter().find(|m| m.name == name)
    }

    /// Adds a toolset's command (`/memory`); a word already taken (ours or another's) is
    /// refused with a warning.
    pub fn add_chat_command(&self, command: Arc<dyn super::ChatCommand>) {
        let word = command.word();
        if super::commands::Command::parse(word).is_some() || self.chat_command(word).is_some() {
            tracing::warn!(word, "a chat command's word is taken; it is not added");
            return;
        }
        self.inner
            .chat_commands
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(command);
    }

    /// The toolset command of `word`, if one is registered.
    pub(super) fn chat_command(&self, word: &str) -> Option<Arc<dyn super::ChatCommand>> {
        self.inner
            .chat_commands
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|c| c.word() == word)
            .cloned()
    }

    /// Every toolset command, for `/help`.
    pub(super) fn chat_commands(&self) -> Vec<Arc<dyn super::ChatCommand>> {
        self.inner
            .chat_commands
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) fn hooks(&self) -> Vec<Arc<dyn super::ChatHook>> {
        self.inner
            .hooks
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What time it is, by [`SessionConfig::wall_time`].
    pub(super) fn now(&self) -> chrono::DateTime<Utc> {
        self.inner.config.wall_time.now()
    }

    pub(super) fn platform(&self, chat: &ChatRef) -> Option<&Arc<dyn Platform>> {
        self.inner.platforms.get(&chat.platform)
    }

    /// Waits until every store write so far is durable ([`Store::durable`]), sharing the
    /// flush with every chat waiting at the same moment. Called where a crash would
    /// otherwise lose or repeat something: before an addressed message is acknowledged to
    /// the platform, before a committed reply is sent, and after it is marked sent. Never
    /// with a lock held that intake or a turn needs. The flush runs inline in whichever
    /// waiter starts it, not on the blocking pool: a flush takes about 0.3 ms
    /// (bot/benches/store.rs), less than a hop to another thread and back.
    pub(super) async fn durable(&self) -> Result<(), StoreError> {
        self.inner.store.durable().await
    }

    /// After a restart: hands every committed reply not marked sent to the outbox and
    /// re-queues every pending input (its turn never committed). Call before the adapters
    /// start.
    pub async fn resume(&self) -> Result<(), StoreError> {
        if let Some(cluster) = &self.inner.config.cluster {
            // Chats are taken one by one, by lease, with their inputs and replies.
            super::cluster::spawn(self, cluster);
            return Ok(());
        }
        for entry in self.inner.store.unsent_outbox()? {
            tracing::info!(session = %entry.session, outbox = entry.id, "resending a reply from before the restart");
            self.enqueue_reply(entry, Vec::new());
        }
        let (pending, notices) = super::quarantine::set_aside(
            self.inner.store.as_ref(),
            self.inner.store.pending()?,
            self.now(),
            &|session| self.effective(session).language,
        )?;
        if !notices.is_empty() {
            self.durable().await?;
            for notice in notices {
                self.enqueue_reply(notice, Vec::new());
            }
        }
        if !pending.is_empty() {
            tracing::info!(
                count = pending.len(),
                "resuming inputs from before the restart"
            );
        }
        let mut chats = self.chats();
        let mut unheard = Vec::new();
        for item in pending {
            let session = chats.session(&item.session);
            if item.kind.rules().waits == Wait::Batch {
                let id = item.id;
                if !super::auto_chat::restore(self, &session, item) {
                    unheard.push(id);
                }
                continue;
            }
            let item = QueueItem::from_pending(item);
            if let Err(full) = session.queue.push(item) {
                // Only possible when more items were pending than a queue holds: keep the
                // record for the next start rather than drop it.
                tracing::warn!(session = %session.key, ids = ?full.0.pending_ids, "queue full while resuming; kept for later");
            }
        }
        drop(chats);
        if !unheard.is_empty() {
            // The chat is no longer an auto-chat group (the config changed): they stay in the
            // chat log only.
            tracing::info!(
                count = unheard.len(),
                "dropping unaddressed messages of chats no longer in bot.auto_chat"
            );
            self.inner.store.remove_pending(&unheard)?;
        }
        Ok(())
    }

    /// Hands a committed (durable) row to its chat's outbox lane; `done` learn what became
    /// of it.
    pub(super) fn enqueue_reply(&self, entry: crate::store::OutboxEntry, done: Vec<Waiter>) {
        self.inner.lanes.enqueue(self, entry, done);
    }

    /// Serves system inputs until shutdown begins; call after [`SessionManager::resume`].
    /// The loop is owned by the session layer's task tracker and ends with it; requests
    /// still in the channel then get [`SubmitError::ShuttingDown`].
    pub fn serve_system(&self, receiver: super::SystemReceiver) {
        super::system::serve(self, receiver);
    }

    /// Stores a system input for `chat` as pending (with `also`, in one transaction) and
    /// queues it, with `done` to be told its outcome; returns its pending id. Not yet
    /// durable: the caller waits for that, with no lock held. Both kinds go in even over
    /// the queue's capacity (`input.rs`).
    fn submit(
        &self,
        chat: &ChatRef,
        kind: PendingKind,
        text: String,
        caller: Caller,
        also: Vec<KvWrite>,
        done: Option<Waiter>,
    ) -> Result<u64, SubmitError> {
        if self.inner.draining.is_cancelled() {
            return Err(SubmitError::ShuttingDown);
        }
        if self.platform(chat).is_none() {
            return Err(SubmitError::NoPlatform(chat.platform.clone()));
        }
        let key = chat.session_key();
        let mut chats = self.chats();
        let session = chats.session(&key);
        let pending = PendingItem {
            id: 0,
            session: key.clone(),
            chat: chat.clone(),
            kind,
            caller,
            text,
            reply_to: None,
            images: Vec::new(),
            received: self.now(),
            private: false,
        };
        let mut item = QueueItem::from_pending(pending.clone());
        let id = self.inner.store.add_pending_with(pending, also)?;
        item.pending_ids = vec![id];
        item.done.extend(done);
        if !chats.runs_here(&key) {
            // Held by another instance (cluster mode): its sweep finds the input pending.
            // Its outcome is not known here.
            super::queue::handed_over(vec![item]);
            return Ok(id);
        }
        // A finished task or a due clock task waits over the capacity (`input.rs`).
        if session.queue.push(item).is_err() {
            // Checked above under the same lock; kept for the next start if it happens.
            tracing::error!(session = %session.key, pending = id, "queue refused a checked item; it stays pending");
            return Err(SubmitError::QueueFull);
        }
        Ok(id)
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
    ) -> Result<oneshot::Receiver<ScheduledOutcome>, SubmitError> {
        let (tx, rx) = oneshot::channel();
        // The sender travels with the input to its turn, then with its reply to the lane.
        self.submit(
            chat,
            PendingKind::ClockFire,
            text,
            caller,
            Vec::new(),
            Some(tx),
        )?;
        // The turn may already be running; its commit waits for durability too, and that
        // covers this earlier write (see `session/inbox.rs`).
        self.durable().await?;
        Ok(rx)
    }

    /// Queues a notice for `chat` (a background task's result) as a stackable
    /// `task_result` item: several notices while the session is busy merge into one turn.
    /// Stored as pending together with `also` (the toolset's record that it was told), so
    /// a crash can neither lose it nor tell it twice. Returns the pending id, which
    /// [`SessionManager::withdraw`] takes.
    pub async fn submit_notice(
        &self,
        chat: &ChatRef,
        text: String,
        caller: Caller,
        also: Vec<KvWrite>,
    ) -> Result<u64, SubmitError> {
        let id = self.submit(chat, PendingKind::TaskResult, text, caller, also, None)?;
        self.durable().await?;
        Ok(id)
    }

    /// Withdraws a queued input that has not started its turn yet (a task notice whose
    /// result the model already read). `true` when it was withdrawn; `false` when it already
    /// ran or is running (then it is delivered once, as usual).
    pub fn withdraw(&self, chat: &ChatRef, pending_id: u64) -> Result<bool, SubmitError> {
        let Some(session) = self.live_session(&chat.session_key()) else {
            return Ok(false);
        };
        if !session.queue.withdraw(pending_id) {
            return Ok(false);
        }
        self.inner.store.remove_pending(&[pending_id])?;
        Ok(true)
    }

    /// This daemon's instance id, with several daemons on one store (`[cluster]`).
    pub fn instance(&self) -> Option<&str> {
        self.inner
            .config
            .cluster
            .as_ref()
            .map(|c| c.instance.as_str())
    }

    /// Number of sessions in memory.
    pub fn live_sessions(&self) -> usize {
        self.inner.dispatcher.len()
    }

    /// Items waiting in the queues of the sessions in memory (a merged burst counts once).
    pub fn queued_items(&self) -> usize {
        self.inner.dispatcher.queued()
    }

    /// The session layer's counters.
    pub fn stats(&self) -> SessionStats {
        let counts = self.inner.dispatcher.counts();
        SessionStats {
            actors_started: counts.started,
            actors_running: counts.running,
            evictions: counts.evictions,
            live_sessions: self.live_sessions(),
            leases_held: counts.leases,
            takeovers: counts.takeovers,
            leases_lost: counts.lost,
        }
    }

    /// Whether nothing is queued or running and no reply waits to be sent: what `parlor
    /// chat` waits for after its input ends.
    pub fn is_idle(&self) -> bool {
        let busy = self
            .inner
            .dispatcher
            .all()
            .iter()
            .any(|s| !s.queue.is_empty() || s.running().is_some());
        !busy
            && self.inner.lanes.is_empty()
            && self.inner.store.pending().is_ok_and(|p| p.is_empty())
            && self.inner.store.unsent_outbox().is_ok_and(|o| o.is_empty())
    }

    /// Stops intake, lets running turns finish and their replies go out for up to `grace`,
    /// then cancels what is left (inputs stay pending, replies stay in the outbox; both
    /// resume after the next start), waits for every task and flushes.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.draining.cancel();
        self.inner.tracker.close();
        if tokio::time::timeout(grace, self.inner.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                ?grace,
                "turns or sends still running after the grace period; cancelling them"
            );
            self.inner.abort.cancel();
            self.inner.tracker.wait().await;
        }
        // Nothing will answer a waiter now (an abandoned reply is sent after the next
        // start): dropping them tells each (a clock fire) at once that it was abandoned.
        for session in self.inner.dispatcher.all() {
            session.queue.drop_waiters();
        }
        self.inner.lanes.drop_waiters();
        // Cluster mode: the chats left here go to the other instances at once.
        self.inner.dispatcher.release_all(self);
        if let Err(e) = self.inner.store.flush() {
            tracing::error!(error = %e, "could not flush the store on shutdown");
        }
    }
}

/// What the operator's console and `/status` read, and what they do.
impl SessionManager {
    /// Every session in memory, by key.
    pub fn live_chats(&self) -> Vec<super::LiveChat> {
        let sessions: Vec<_> = self.dispatcher().all();
        let mut chats: Vec<super::LiveChat> = sessions
            .iter()
            .map(|s| {
                let seen = s.seen();
                super::LiveChat {
                    session: s.key.clone(),
                    queued: s.queue.len(),
                    turns: seen.turns,
                    current: seen.current,
                }
            })
            .collect();
        chats.sort_by(|a, b| a.session.cmp(&b.session));
        chats
    }

    /// Cancels `session`'s running turn, as `/stop` does; `false` when none runs.
    pub fn stop_turn(&self, session: &str) -> bool {
        let Some(live) = self.live_session(session) else {
            return false;
        };
        match live.running() {
            Some(token) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    /// Today as the sessions count usage ([`SessionConfig::wall_time`]), for the console.
    pub fn today(&self) -> chrono::NaiveDate {
        self.now().date_naive()
    }

    /// The daily token budget per chat, if there is one.
    pub fn daily_token_budget(&self) -> Option<u64> {
        self.config().daily_tokens_per_chat
    }

    /// `session`'s tokens today and the daily limit, for `/status` and the console.
    pub fn tokens_today(&self, session: &str) -> (u64, Option<u64>) {
        let used = super::usage::day_usage(self.store().as_ref(), self.now().date_naive(), session)
            .map_or(0, |d| d.total_tokens);
        (used, self.config().daily_tokens_per_chat)
    }

    /// `session`'s usage today (zero when unreadable): tokens, cache hits, cost.
    pub fn usage_today(&self, session: &str) -> super::usage::DayUsage {
        super::usage::day_usage(self.store().as_ref(), self.now().date_naive(), session)
            .unwrap_or_default()
    }

    /// `member`'s tokens today across chats and the daily limit per member, for `/status`
    /// in `session`.
    pub fn member_tokens_today(&self, member: &str, session: &str) -> (u64, Option<u64>) {
        let used = super::usage::member_today(
            self.store().as_ref(),
            self.now().date_naive(),
            member,
            session,
        )
        .map_or(0, |(used, _)| used);
        (used, self.config().daily_tokens_per_member)
    }

    /// Re-reads what the toolsets load from outside the program (skill folders): `/reload`
    /// and SIGHUP. Every session's tools share what they load, so this serves them all; a
    /// line for each toolset that loads something.
    pub fn reload(&self) -> Vec<String> {
        self.template().tools().reload()
    }
}
