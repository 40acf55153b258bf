//! Results that arrive by themselves: the one way background work (a terminal task, a
//! sub-agent) tells its chat that it ended, exactly once (docs/contract.md, "Asynchronous
//! results").
//!
//! - [`Notifier`]: where notices go, the session layer's [`SystemInputs`] in the daemon (a stackable
//!   `task_result` item whose turn runs unattended: as the system with the least role plus
//!   the grants the work carries, reading or stopping that one job, never a dangerous tool).
//! - [`Told`]: the part of a job's stored row that says where it stands with its chat (its
//!   notice's pending id, whether that notice was withdrawn, whether the chat was told).
//! - [`Rows`]: the rows of one kind in the store (read, list, save, tell after a restart).
//! - [`tell`], [`tell_once`], [`read_before_told`]: the state changes of that part, shared
//!   so that every kind of background work keeps the same promise: "told" is written in the
//!   same transaction as the notice (a kill can neither lose it nor, after the restart, tell
//!   it twice), a result read before its notice ran withdraws the notice, and work that
//!   ended while the daemon stopped is told after the next start.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use parlor_bot::platform::ChatRef;
use parlor_bot::session::{SubmitError, SystemInputs};
use parlor_bot::store::{KvWrite, Store, StoreError};
use parlor_bot::tool::Caller;

/// The indentation of quoted text inside a notice block (a job's output, a model's answer):
/// deeper than the block's own tag lines, so every line of it reads as quoted.
pub const QUOTED: &str = "    ";

/// How long a notice may take to be queued before it is given up (logged).
pub const NOTIFY_TIMEOUT: Duration = Duration::from_secs(15);

/// Why a notice was not queued.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// The daemon is shutting down; the notice can be given after the next start.
    #[error("the daemon is shutting down")]
    ShuttingDown,
    /// The rows changed since they were read: another daemon on the store recovered or
    /// told them (cluster mode). Nothing was queued.
    #[error("the rows changed meanwhile: {0}")]
    Changed(String),
    /// Any other failure (no adapter for the chat, a full queue, storage).
    #[error("{0}")]
    Failed(String),
}

/// Where completion notices go: the session layer's [`SystemInputs`] in the daemon, a
/// recorder in tests.
#[async_trait]
pub trait Notifier: Send + Sync {
    /// Queues `text` for `chat` as a stackable task result about work `caller` started (its
    /// grants say what the unattended turn may do with it), stored together with `also`
    /// (the rows saying they were told) in one transaction; returns its pending id.
    async fn notify(
        &self,
        chat: &ChatRef,
        text: String,
        caller: Caller,
        also: Vec<KvWrite>,
    ) -> Result<u64, NotifyError>;
    /// Withdraws a queued notice that has not started its turn; `true` when withdrawn.
    async fn withdraw(&self, chat: &ChatRef, pending_id: u64) -> Result<bool, NotifyError>;
}

fn submit_error(e: SubmitError) -> NotifyError {
    match e {
        SubmitError::ShuttingDown => NotifyError::ShuttingDown,
        SubmitError::Store(StoreError::Changed(what)) => NotifyError::Changed(what),
        // Anything else (no adapter, storage) is logged by the caller; the work is unharmed.
        other => NotifyError::Failed(other.to_string()),
    }
}

#[async_trait]
impl Notifier for SystemInputs {
    async fn notify(
        &self,
        chat: &ChatRef,
        text: String,
        caller: Caller,
        also: Vec<KvWrite>,
    ) -> Result<u64, NotifyError> {
        self.notice(chat, text, caller, also)
            .await
            .map_err(submit_error)
    }
    async fn withdraw(&self, chat: &ChatRef, pending_id: u64) -> Result<bool, NotifyError> {
        SystemInputs::withdraw(self, chat, pending_id)
            .await
            .map_err(submit_error)
    }
}

/// Where a job stands with its chat, as stored in its row (flattened: the fields sit beside
/// the row's own).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Told {
    /// The pending id of its queued notice.
    #[serde(default)]
    pub notice_pending_id: Option<u64>,
    /// Whether that notice was withdrawn because the model read the result first.
    #[serde(default)]
    pub notice_withdrawn: bool,
    /// Whether the chat has been told of its end (a notice queued, the result read, or
    /// stopped on request): nothing more will be sent about it.
    #[serde(default)]
    pub notified: bool,
}

/// A stored row of background work that tells its chat when it ends: versioned JSON under
/// `<session>|<id>` in the space of its kind.
pub trait NoticeRow: Clone + Serialize + DeserializeOwned {
    /// The store space of its kind.
    const SPACE: &'static str;
    /// Its id (`task-…`, `sa-…`).
    fn id(&self) -> &str;
    /// The session that started it.
    fn session(&self) -> &str;
    /// When it started.
    fn started(&self) -> DateTime<Utc>;
    /// Where it stands with its chat.
    fn told(&self) -> &Told;
    /// The same, to change.
    fn told_mut(&mut self) -> &mut Told;
    /// The daemon running it, with several on one store; `None` with one.
    fn runner(&self) -> Option<&str>;
    /// The store write that saves this row as it is.
    fn write(&self) -> Result<KvWrite, StoreError> {
        let key = row_key(self.session(), self.id());
        let text = serde_json::to_string(self).map_err(|e| StoreError::Corrupt {
            key: key.clone(),
            reason: e.to_string(),
        })?;
        Ok(KvWrite {
            space: Self::SPACE.to_owned(),
            key,
            value: Some(text),
            if_unchanged: None,
        })
    }
}

fn row_key(session: &str, id: &str) -> String {
    format!("{session}|{id}")
}

/// The stored rows of one kind of background work.
pub struct Rows<R> {
    store: Arc<dyn Store>,
    kind: PhantomData<fn() -> R>,
}

impl<R: NoticeRow> Rows<R> {
    /// The rows of kind `R` in `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Rows {
            store,
            kind: PhantomData,
        }
    }

    /// The row `id` of `session`; an unreadable one is logged and missing.
    pub fn get(&self, session: &str, id: &str) -> Option<R> {
        match self.store.kv_get(R::SPACE, &row_key(session, id)) {
            Ok(Some(text)) => serde_json::from_str(&text)
                .inspect_err(
                    |e| tracing::error!(space = R::SPACE, id, error = %e, "unreadable row"),
                )
                .ok(),
            Ok(None) => None,
            Err(e) => {
                tracing::error!(space = R::SPACE, id, error = %e, "cannot read a row");
                None
            }
        }
    }

    /// Every row of `session` (of every session with `None`), oldest first; unreadable ones
    /// are logged and skipped.
    pub fn list(&self, session: Option<&str>) -> Vec<R> {
        let prefix = session.map(|s| format!("{s}|")).unwrap_or_default();
        let rows = match self.store.kv_scan(R::SPACE, &prefix) {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!(space = R::SPACE, error = %e, "cannot list rows");
                return Vec::new();
            }
        };
        let mut rows: Vec<R> = rows
            .into_iter()
            .filter_map(|(k, v)| {
                serde_json::from_str(&v)
                    .inspect_err(|e| tracing::error!(space = R::SPACE, key = k, error = %e, "unreadable row skipped"))
                    .ok()
            })
            .collect();
        rows.sort_by(|a, b| a.started().cmp(&b.started()).then(a.id().cmp(b.id())));
        rows
    }

    /// The store the rows are in.
    pub fn store(&self) -> &dyn Store {
        self.store.as_ref()
    }

    /// Writes `row` (not flushed).
    pub fn save(&self, row: &R) -> Result<(), StoreError> {
        let write = row.write()?;
        self.store.kv_put(
            &write.space,
            &write.key,
            write.value.as_deref().unwrap_or_default(),
        )
    }

    /// The row `id` of `session` and its stored text (what a conditional write compares).
    pub fn get_raw(&self, session: &str, id: &str) -> Option<(R, String)> {
        let text = match self.store.kv_get(R::SPACE, &row_key(session, id)) {
            Ok(text) => text?,
            Err(e) => {
                tracing::error!(space = R::SPACE, id, error = %e, "cannot read a row");
                return None;
            }
        };
        match serde_json::from_str(&text) {
            Ok(row) => Some((row, text)),
            Err(e) => {
                tracing::error!(space = R::SPACE, id, error = %e, "unreadable row");
                None
            }
        }
    }

    /// Every row with its stored text, oldest first; unreadable ones are logged and skipped.
    pub fn list_raw(&self) -> Vec<(R, String)> {
        let rows = match self.store.kv_scan(R::SPACE, "") {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!(space = R::SPACE, error = %e, "cannot list rows");
                return Vec::new();
            }
        };
        let mut rows: Vec<(R, String)> = rows
            .into_iter()
            .filter_map(|(k, v)| {
                serde_json::from_str(&v)
                    .inspect_err(|e| tracing::error!(space = R::SPACE, key = k, error = %e, "unreadable row skipped"))
                    .ok()
                    .map(|row| (row, v))
            })
            .collect();
        rows.sort_by(|(a, _), (b, _)| a.started().cmp(&b.started()).then(a.id().cmp(b.id())));
        rows
    }

    /// Writes `row` and `also` in one transaction if the row is still stored as `was`;
    /// `false` when it changed meanwhile (another daemon recovered or told it).
    pub fn save_if(&self, row: &R, was: &str, also: Vec<KvWrite>) -> Result<bool, StoreError> {
        let mut write = row.write()?;
        write.if_unchanged = Some(Some(was.to_owned()));
        let mut writes = vec![write];
        writes.extend(also);
        match self.store.kv_write(writes) {
            Ok(()) => Ok(true),
            Err(StoreError::Changed(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes and flushes `row`; a failure is logged (the work goes on either way).
    pub fn save_logged(&self, row: &R) {
        self.save_logged_with(row, Vec::new());
    }

    /// Writes `row` and `also` in one transaction and flushes; a failure is logged.
    pub fn save_logged_with(&self, row: &R, also: Vec<KvWrite>) {
        let saved = row.write().and_then(|write| {
            let mut writes = vec![write];
            writes.extend(also);
            self.store.kv_write(writes)
        });
        if let Err(e) = saved.and_then(|()| self.store.flush()) {
            tracing::error!(space = R::SPACE, id = row.id(), error = %e, "cannot store a row");
        }
    }

    /// Flushes the store.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.store.flush()
    }

    /// After a restart: each chat of `to_tell` is told once, in one notice of every row's
    /// `block`, running as their [`starters`] (named `system_name` for several people);
    /// the rows are saved as told unless the daemon is shutting down again.
    pub async fn tell_chats(
        &self,
        notifier: &dyn Notifier,
        to_tell: BTreeMap<String, (ChatRef, Vec<R>)>,
        block: impl Fn(&R) -> String,
        starter: impl Fn(&R) -> Caller,
        system_name: &str,
    ) -> Result<(), StoreError> {
        for (_, (chat, mut rows)) in to_tell {
            let text = rows.iter().map(&block).collect::<Vec<_>>().join("\n");
            let callers: Vec<Caller> = rows.iter().map(&starter).collect();
            let caller = starters(&callers, system_name);
            if matches!(
                tell(notifier, &chat, text, caller, &mut rows).await,
                Telling::Queued(_) | Telling::GivenUp
            ) {
                for row in &rows {
                    self.save(row)?;
                }
            }
        }
        self.store.flush()
    }
}

/// What became of a notice [`tell`] tried to queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Telling {
    /// Queued, with this pending id; the rows say so.
    Queued(u64),
    /// The daemon is shutting down: the rows stay untold, for the next start.
    Later,
    /// Given up (logged); the rows count as told, so nothing retries it.
    GivenUp,
    /// The rows changed since they were read (another daemon told or recovered them):
    /// nothing was queued, and they are that daemon's.
    Elsewhere,
}

/// Queues one notice about `rows` (all for `chat`), the rows saved as told in the same
/// transaction, on condition that each is still stored as it is now (so two daemons
/// recovering one dead daemon's rows tell them once). Updates the rows' [`Told`] to what happened; the caller saves them (the
/// pending id is known only now). A store failure building the rows' writes is given up.
pub async fn tell<R: NoticeRow>(
    notifier: &dyn Notifier,
    chat: &ChatRef,
    text: String,
    caller: Caller,
    rows: &mut [R],
) -> Telling {
    let also = rows
        .iter()
        .map(|row| {
            let was = row.write()?.value;
            let mut told = row.clone();
            told.told_mut().notified = true;
            let mut write = told.write()?;
            write.if_unchanged = Some(was);
            Ok::<KvWrite, StoreError>(write)
        })
        .collect::<Result<Vec<_>, _>>();
    let outcome = match also {
        Err(e) => {
            tracing::error!(chat = %chat, error = %e, "cannot write the rows of a notice");
            Telling::GivenUp
        }
        Ok(also) => {
            let notify = notifier.notify(chat, text, caller, also);
            match tokio::time::timeout(NOTIFY_TIMEOUT, notify).await {
                Ok(Ok(pending)) => Telling::Queued(pending),
                Ok(Err(NotifyError::ShuttingDown)) => {
                    tracing::info!(chat = %chat, "shutting down; the notice is sent after the next start");
                    Telling::Later
                }
                Ok(Err(NotifyError::Changed(what))) => {
                    tracing::info!(chat = %chat, row = %what, "another daemon told this notice");
                    Telling::Elsewhere
                }
                Ok(Err(e)) => {
                    tracing::warn!(chat = %chat, error = %e, "a notice could not be queued");
                    Telling::GivenUp
                }
                Err(_) => {
                    tracing::warn!(chat = %chat, "queueing a notice timed out");
                    Telling::GivenUp
                }
            }
        }
    };
    for row in rows.iter_mut() {
        let told = row.told_mut();
        match outcome {
            Telling::Queued(pending) => {
                told.notice_pending_id = Some(pending);
                told.notified = true;
            }
            Telling::GivenUp => told.notified = true,
            Telling::Later | Telling::Elsewhere => {}
        }
    }
    outcome
}

/// [`tell`] for one row that has not been told yet; a told row is left alone.
pub async fn tell_once<R: NoticeRow>(
    notifier: &dyn Notifier,
    chat: &ChatRef,
    text: String,
    caller: Caller,
    row: &mut R,
) -> Option<Telling> {
    if row.told().notified {
        return None;
    }
    Some(tell(notifier, chat, text, caller, std::slice::from_mut(row)).await).inspect(|t| {
        tracing::debug!(job = row.id(), outcome = ?t, "notice");
    })
}

/// The model reads an ended job's result itself: its notice, when queued and not started,
/// is withdrawn, and the row counts as told. `true` when the row changed (save it).
pub async fn read_before_told<R: NoticeRow>(
    notifier: &dyn Notifier,
    chat: &ChatRef,
    row: &mut R,
) -> bool {
    let mut withdrawn = false;
    let told = row.told().clone();
    if let (Some(pending), false) = (told.notice_pending_id, told.notice_withdrawn) {
        match tokio::time::timeout(NOTIFY_TIMEOUT, notifier.withdraw(chat, pending)).await {
            Ok(Ok(true)) => withdrawn = true,
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::warn!(job = row.id(), error = %e, "cannot withdraw the notice"),
            Err(_) => tracing::warn!(job = row.id(), "withdrawing the notice timed out"),
        }
    }
    let t = row.told_mut();
    if withdrawn {
        t.notice_withdrawn = true;
    }
    if !t.notified || withdrawn {
        t.notified = true;
        return true;
    }
    false
}

/// The caller of one notice about several jobs: their starter when it is one person, else
/// the system (named `system_name`) with the least of their roles (as the session queue
/// merges callers), so nobody's notice gains a role its starter did not have; either way
/// with every job's grants (reading or stopping that one job). The session queue runs the
/// notice's turn as the system with the least role and these grants, whoever started it.
pub fn starters(callers: &[Caller], system_name: &str) -> Caller {
    let Some(first) = callers.first() else {
        return Caller::default();
    };
    let role = callers.iter().map(|c| c.role).min().unwrap_or_default();
    let mut grants = Vec::new();
    for grant in callers.iter().flat_map(|c| &c.grants) {
        if !grants.contains(grant) {
            grants.push(grant.clone());
        }
    }
    if callers.iter().all(|c| c.user_id == first.user_id) {
        return Caller {
            role,
            grants,
            ..first.clone()
        };
    }
    Caller {
        user_id: String::new(),
        name: system_name.to_owned(),
        role,
        grants,
    }
}

/// Ends a notice block opened with `<tag>`: `notes`, then `note`, joined on one `<note>`
/// line (escaped and kept on that line: a note may quote a provider's, a tool's or a
/// program's words), then `</tag>`.
pub fn end_block(
    mut block: String,
    mut notes: Vec<String>,
    note: Option<&str>,
    tag: &str,
) -> String {
    if let Some(note) = note {
        notes.push(note.to_owned());
    }
    if !notes.is_empty() {
        block.push_str(&format!(
            "  <note>{}</note>\n",
            parlor_bot::quote::one_line(&xml_escape(&notes.join("; ")), usize::MAX)
        ));
    }
    block.push_str(&format!("</{tag}>"));
    block
}

/// Escapes `&`, `<`, `>`, `"` and `'` for XML text and attribute values: what a notice block
/// carries from its job (output, a model's answer) can never close the block or open another.
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}
