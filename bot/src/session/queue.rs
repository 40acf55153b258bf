//! The bounded, typed queue in front of each chat worker. Items of a stackable kind that
//! arrive while the session is busy merge into the tail item of the same kind, so a burst of
//! messages becomes one turn; when the queue is full the caller gets the item back to tell
//! the chat, never a silent drop.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::{Notify, oneshot};

use super::input::{CallerRule, TextRule, Wait};
use crate::platform::{ChatRef, ImageRef};
use crate::store::{PendingItem, PendingKind};
use crate::tool::Caller;

/// What became of a scheduled input (a clock task firing), as its submitter learns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduledOutcome {
    /// The turn ran and its reply was posted: the platform's message ids. Only this means
    /// "delivered".
    Posted(Vec<String>),
    /// The turn ran but produced nothing to post.
    NoReply,
    /// The turn ran but the platform refused the reply for good (the reason).
    NotDelivered(String),
    /// The model could not be reached (the reason); the chat was told.
    Failed(String),
    /// Another daemon holds the chat and runs the input there (several daemons on one
    /// store): its outcome is not known here.
    Elsewhere,
}

/// Tells each of `items`' waiters that another daemon runs them now.
pub(super) fn handed_over(items: Vec<QueueItem>) {
    for waiter in items.into_iter().flat_map(|item| item.done) {
        // The submitter may have given up waiting.
        let _ = waiter.send(ScheduledOutcome::Elsewhere);
    }
}

/// Told what became of a queued input; dropped unanswered when its turn is abandoned.
pub type Waiter = oneshot::Sender<ScheduledOutcome>;

/// Most lines one merged item holds; a longer burst starts a new item (which counts
/// against the queue's capacity), so one turn's input stays readable and bounded.
pub const MAX_LINES_PER_ITEM: usize = 50;

/// One unit of work for a session: one turn's input.
#[derive(Debug)]
pub struct QueueItem {
    /// What kind of input; decides stacking.
    pub kind: PendingKind,
    /// Where the reply goes.
    pub chat: ChatRef,
    /// Input lines, each already attributed (`alice: hi`).
    pub lines: Vec<String>,
    /// Store ids of the pending records this item answers.
    pub pending_ids: Vec<u64>,
    /// The platform message to thread the reply to (the latest addressed message).
    pub reply_to: Option<String>,
    /// Everyone who contributed, in order.
    pub callers: Vec<Caller>,
    /// Images attached to any of the merged messages, each with the id of its message.
    pub images: Vec<(ImageRef, Option<String>)>,
    /// Whether the chat is a direct message (nobody there is a chat admin).
    pub private: bool,
    /// Who waits for the outcome of this input's turn (a clock fire's run): carried to the
    /// turn, then with its reply to the outbox lane. Not durable: after a restart the input
    /// still runs, but nobody waits for it.
    pub done: Vec<Waiter>,
}

impl QueueItem {
    /// The queue item of one stored input.
    pub fn from_pending(item: PendingItem) -> Self {
        QueueItem {
            kind: item.kind,
            chat: item.chat,
            lines: vec![item.text],
            pending_ids: vec![item.id],
            reply_to: item.reply_to.clone(),
            callers: vec![item.caller],
            // A member's message threads its reply to itself, so `reply_to` is the message
            // the images came with.
            images: item
                .images
                .into_iter()
                .map(|image| (image, item.reply_to.clone()))
                .collect(),
            private: item.private,
            done: Vec::new(),
        }
    }

    /// The caller the turn runs as: the single sender, or — for a merged burst — a caller
    /// with the least role of all contributors, so a member cannot borrow an admin's
    /// rights by speaking in the same burst.
    ///
    /// A clock fire or a background task's notice runs unattended: nobody is there to see
    /// what it does, and its input quotes text others wrote (the task's output, the plan,
    /// the memory). It runs as the system with the least role, whoever started the work,
    /// plus the grants the work asked for (reading or stopping that one task), never a
    /// dangerous tool ([`crate::tool::ToolRegistry::defs_for_caller`]).
    pub fn caller(&self) -> Caller {
        match self.kind.rules().caller {
            CallerRule::AutoChat => return super::auto_chat::auto_chat_caller(),
            CallerRule::Unattended => return unattended_caller(&self.callers),
            CallerRule::Senders => {}
        }
        match self.callers.as_slice() {
            [] => Caller::default(),
            [one] => one.clone(),
            many => {
                let least = many.iter().map(|c| c.role).min().unwrap_or_default();
                let first = &many[0];
                if many.iter().all(|c| c.user_id == first.user_id) {
                    return first.clone();
                }
                Caller {
                    user_id: String::new(),
                    name: "several members".to_owned(),
                    role: least,
                    grants: Vec::new(),
                }
            }
        }
    }

    /// The turn's input text: every line, in arrival order.
    pub fn text(&self) -> String {
        match self.kind.rules().text {
            TextRule::AutoChat => super::auto_chat::input_text(&self.lines),
            TextRule::Lines => self.lines.join("\n"),
        }
    }

    fn merge(&mut self, other: QueueItem) {
        self.lines.extend(other.lines);
        self.pending_ids.extend(other.pending_ids);
        if other.reply_to.is_some() {
            self.reply_to = other.reply_to;
        }
        self.callers.extend(other.callers);
        self.images.extend(other.images);
        self.done.extend(other.done);
    }
}

/// The caller of an unattended turn started by `callers`: no user id (so no role is
/// looked up), the least role, and every grant any of them carried.
fn unattended_caller(callers: &[Caller]) -> Caller {
    let mut grants = Vec::new();
    for grant in callers.iter().flat_map(|c| &c.grants) {
        if !grants.contains(grant) {
            grants.push(grant.clone());
        }
    }
    // A person's name would read as if they were there.
    let name = match callers {
        [one] if one.is_system() && !one.name.is_empty() => one.name.clone(),
        _ => "an unattended turn".to_owned(),
    };
    Caller {
        user_id: String::new(),
        name,
        role: crate::tool::Role::Member,
        grants,
    }
}

/// The queue of one session.
#[derive(Debug)]
pub struct SessionQueue {
    items: Mutex<Items>,
    capacity: usize,
    notify: Notify,
}

/// The waiting items, and the pending ids of the item taken last (running, or just run).
#[derive(Debug, Default)]
struct Items {
    waiting: VecDeque<QueueItem>,
    taken: Vec<u64>,
}

impl Items {
    /// Whether an input with one of `ids` is waiting or was taken last: a pending input
    /// is queued at most once, whoever offers it (intake, a submission, the resume).
    fn holds_any(&self, ids: &[u64]) -> bool {
        ids.iter().any(|id| {
            self.taken.contains(id) || self.waiting.iter().any(|i| i.pending_ids.contains(id))
        })
    }
}

/// The queue is full; the item comes back so the caller can say so in the chat.
#[derive(Debug)]
pub struct QueueFull(pub Box<QueueItem>);

impl SessionQueue {
    /// A queue holding at most `capacity` items (merged items count once).
    pub fn new(capacity: usize) -> Self {
        SessionQueue {
            items: Mutex::new(Items::default()),
            capacity: capacity.max(1),
            notify: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Items> {
        // Every operation leaves the deque consistent, so a poisoned lock is still usable.
        self.items.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds an item where its kind waits ([`Wait`]): at the back, merging into the tail when
    /// both merge and are of one kind, refused when the queue is full unless its kind waits
    /// over the capacity; or at the front. An item whose input is already queued or running
    /// is dropped (it is there once).
    pub fn push(&self, item: QueueItem) -> Result<(), QueueFull> {
        let wait = item.kind.rules().waits;
        self.insert(item, wait)
    }

    /// Adds inputs accepted before (a chat's queue moved to its new id), in order, even
    /// over the capacity: they are pending already.
    pub fn push_over_capacity(&self, item: QueueItem) {
        // Never refused: `insert` refuses only a `Wait::Queue` item.
        let _ = self.insert(item, Wait::QueueOverCapacity);
    }

    fn insert(&self, item: QueueItem, wait: Wait) -> Result<(), QueueFull> {
        {
            let mut items = self.lock();
            if items.holds_any(&item.pending_ids) {
                tracing::debug!(ids = ?item.pending_ids, "input already queued");
                return Ok(());
            }
            if wait == Wait::QueueFront {
                items.waiting.push_front(item);
            } else {
                let full = wait != Wait::QueueOverCapacity && items.waiting.len() >= self.capacity;
                match items.waiting.back_mut() {
                    Some(tail) if Self::merges(tail, &item) => tail.merge(item),
                    _ if full => return Err(QueueFull(Box::new(item))),
                    _ => items.waiting.push_back(item),
                }
            }
        }
        self.notify.notify_one();
        Ok(())
    }

    /// Whether intake should accept `item` now: the queue has room for it, it merges, or
    /// its kind waits over the capacity.
    pub fn can_take(&self, item: &QueueItem) -> bool {
        if item.kind.rules().waits == Wait::QueueOverCapacity {
            return true;
        }
        let items = self.lock();
        items.waiting.len() < self.capacity
            || items
                .waiting
                .back()
                .is_some_and(|tail| Self::merges(tail, item))
    }

    fn merges(tail: &QueueItem, item: &QueueItem) -> bool {
        item.kind.rules().merges
            && tail.kind == item.kind
            && tail.chat == item.chat
            && tail.lines.len() + item.lines.len() <= MAX_LINES_PER_ITEM
    }

    /// Takes the next item, if any. The buffer is released once the queue is empty: most
    /// chats are quiet most of the time, and thousands of idle queues each keeping the
    /// buffer of their last burst add up.
    pub fn pop(&self) -> Option<QueueItem> {
        let mut items = self.lock();
        let item = items.waiting.pop_front();
        if items.waiting.is_empty() && items.waiting.capacity() > 0 {
            items.waiting = VecDeque::new();
        }
        items.taken.clear();
        if let Some(item) = &item {
            items.taken.extend_from_slice(&item.pending_ids);
        }
        if items.taken.is_empty() && items.taken.capacity() > 0 {
            items.taken = Vec::new();
        }
        item
    }

    /// The kind of the next item, which stays queued (and can still take merges).
    pub fn front_kind(&self) -> Option<PendingKind> {
        self.lock().waiting.front().map(|item| item.kind)
    }

    /// Wakes the worker without an item: an auto-chat batch changed (see
    /// [`super::auto_chat`]).
    pub fn wake(&self) {
        self.notify.notify_one();
    }

    /// Waits until an item may be available.
    pub async fn notified(&self) {
        self.notify.notified().await;
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Whether no item waits.
    pub fn is_empty(&self) -> bool {
        self.lock().waiting.is_empty()
    }

    /// Removes the input with pending id `pending_id` from a waiting item (its line goes
    /// with it; an item left empty goes too). `false` when no waiting item holds it.
    pub fn withdraw(&self, pending_id: u64) -> bool {
        let mut guard = self.lock();
        let items = &mut guard.waiting;
        for index in 0..items.len() {
            let item = &mut items[index];
            let Some(at) = item.pending_ids.iter().position(|&id| id == pending_id) else {
                continue;
            };
            item.pending_ids.remove(at);
            // Lines and ids are pushed in pairs, one line per input.
            if at < item.lines.len() {
                item.lines.remove(at);
            }
            if at < item.callers.len() {
                item.callers.remove(at);
            }
            if item.pending_ids.is_empty() {
                items.remove(index);
            }
            return true;
        }
        false
    }

    /// Replaces the line (and the images) of the input with pending id `pending_id`, from
    /// message `message_id`, in a waiting item: an edited message that has not had its
    /// turn yet. `false` when no waiting item holds it (it is being answered, or was).
    pub fn edit(&self, pending_id: u64, message_id: &str, line: &str, images: &[ImageRef]) -> bool {
        let mut items = self.lock();
        for item in items.waiting.iter_mut() {
            let Some(at) = item.pending_ids.iter().position(|&id| id == pending_id) else {
                continue;
            };
            // Lines and ids are pushed in pairs, one line per input.
            if let Some(slot) = item.lines.get_mut(at) {
                line.clone_into(slot);
            }
            item.images
                .retain(|(_, of)| of.as_deref() != Some(message_id));
            item.images.extend(
                images
                    .iter()
                    .map(|image| (image.clone(), Some(message_id.to_owned()))),
            );
            return true;
        }
        false
    }

    /// Drops every waiter of the waiting items (shutdown): each learns its input was not
    /// run now; the inputs stay pending for the next start.
    pub fn drop_waiters(&self) {
        for item in &mut self.lock().waiting {
            item.done.clear();
        }
    }

    /// Removes every waiting item and returns them (`/reset`).
    pub fn clear(&self) -> Vec<QueueItem> {
        self.lock().waiting.drain(..).collect()
    }
}
