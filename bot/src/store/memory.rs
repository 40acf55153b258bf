//! [`MemoryStore`]: the [`Store`] in memory, for tests and `--ephemeral` runs. Same
//! semantics as [`super::SledStore`] (dedupe, per-session bound, id order, atomic commits);
//! nothing survives the process.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use futures::future::BoxFuture;

use super::common::{StoreOptions, check_session, is_pending_for, migrated_record};
use super::{
    ChatRecord, Edited, GroupCommit, HistoryChange, Inbound, Intake, KvWrite, OutboxEntry,
    PendingItem, Store, StoreError, StoredMessage, Summary, TurnCommit, merged_summaries,
    migrated_key, moved_message, moved_outbox, moved_pending,
};
use crate::llm::Message;
use crate::platform::ChatRef;
use crate::time::WallTime;

/// The [`Store`] in memory. One mutex guards everything, so every method is atomic.
#[derive(Debug)]
pub struct MemoryStore {
    bound: u64,
    wall: WallTime,
    inner: Mutex<Inner>,
    /// Nothing to flush, but the waits are grouped and counted as sled's are, so that
    /// tests see how many flushes the session layer asks for. Never yields: waiting for
    /// durability costs a test nothing and changes no interleaving.
    commit: GroupCommit,
}

#[derive(Debug, Default)]
struct Inner {
    /// Per session: seq -> message, and message id -> seq (the dedupe index).
    logs: HashMap<String, SessionLog>,
    history: HashMap<String, Vec<Message>>,
    summaries: HashMap<String, Summary>,
    pending: BTreeMap<u64, PendingItem>,
    outbox: BTreeMap<u64, OutboxEntry>,
    /// Replies sent or given up on, with what became of them.
    outbox_done: BTreeMap<u64, OutboxEntry>,
    meta: HashMap<String, String>,
    /// The bot's place in each chat it was added to or removed from.
    chats: HashMap<String, ChatRecord>,
    /// Toolset collections: (space, key) -> value, in key order for prefix scans.
    kv: BTreeMap<(String, String), String>,
    /// Last id handed out for pending items and replies.
    last_id: u64,
}

#[derive(Debug, Default)]
struct SessionLog {
    messages: BTreeMap<u64, StoredMessage>,
    ids: HashMap<String, u64>,
    next: u64,
}

impl Inner {
    fn next_id(&mut self) -> u64 {
        self.last_id += 1;
        self.last_id
    }

    /// Refuses `writes` when a conditional one finds its record changed; called before
    /// anything of the transaction is written.
    fn check_kv(&self, writes: &[KvWrite]) -> Result<(), StoreError> {
        for write in writes {
            if let Some(expected) = &write.if_unchanged
                && self.kv.get(&(write.space.clone(), write.key.clone())) != expected.as_ref()
            {
                return Err(write.changed());
            }
        }
        Ok(())
    }

    fn apply_kv(&mut self, writes: Vec<KvWrite>) {
        for write in writes {
            let key = (write.space, write.key);
            match write.value {
                Some(value) => self.kv.insert(key, value),
                None => self.kv.remove(&key),
            };
        }
    }
}

impl SessionLog {
    /// Appends a message (no dedupe check), dropping the oldest beyond `bound`.
    fn append(&mut self, message: StoredMessage, bound: u64) {
        let seq = self.next;
        self.next += 1;
        self.ids.insert(message.message_id.clone(), seq);
        self.messages.insert(seq, message);
        while u64::try_from(self.messages.len()).unwrap_or(u64::MAX) > bound {
            let Some((old_seq, old)) = self.messages.pop_first() else {
                break;
            };
            if self.ids.get(&old.message_id) == Some(&old_seq) {
                self.ids.remove(&old.message_id);
            }
        }
    }
}

impl MemoryStore {
    /// An empty store with default options.
    pub fn new() -> Self {
        Self::with_options(StoreOptions::default())
    }

    /// An empty store.
    pub fn with_options(options: StoreOptions) -> Self {
        MemoryStore {
            bound: options.bound(),
            wall: options.wall,
            inner: Mutex::new(Inner::default()),
            commit: GroupCommit::immediate(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding the lock; a poisoned one is still consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl MemoryStore {
    fn finish_outbox(&self, outbox_id: u64, finish: impl Fn(&mut OutboxEntry)) {
        let mut inner = self.lock();
        if let Some(mut entry) = inner.outbox.remove(&outbox_id) {
            finish(&mut entry);
            let now = self.wall.now();
            entry.done_at = Some(now);
            let cutoff = now - chrono::Duration::days(super::SENT_KEEP_DAYS);
            // Oldest ids first, as the sled store prunes (ids grow with time): a walk over
            // every done reply at each send cost a turn more the longer the daemon ran.
            while let Some(oldest) = inner.outbox_done.first_entry() {
                if oldest.get().done_at.is_some_and(|t| t >= cutoff) {
                    break;
                }
                oldest.remove();
            }
            inner.outbox_done.insert(outbox_id, entry);
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl Store for MemoryStore {
    fn record_inbound(
        &self,
        session: &str,
        message: &StoredMessage,
        intake: Intake,
    ) -> Result<Inbound, StoreError> {
        check_session(session)?;
        let mut inner = self.lock();
        let log = inner.logs.entry(session.to_owned()).or_default();
        if log.ids.contains_key(&message.message_id) {
            return Ok(Inbound::Duplicate);
        }
        log.append(message.clone(), self.bound);
        Ok(Inbound::Recorded(match intake {
            Intake::Record => None,
            Intake::Pending(mut item) => {
                let id = inner.next_id();
                item.id = id;
                inner.pending.insert(id, item);
                Some(id)
            }
            Intake::Reply(mut entry) => {
                let id = inner.next_id();
                entry.id = id;
                inner.outbox.insert(id, entry);
                Some(id)
            }
        }))
    }

    fn get_message(
        &self,
        session: &str,
        message_id: &str,
    ) -> Result<Option<StoredMessage>, StoreError> {
        check_session(session)?;
        let inner = self.lock();
        Ok(inner.logs.get(session).and_then(|log| {
            let seq = log.ids.get(message_id)?;
            log.messages.get(seq).cloned()
        }))
    }

    fn recent_messages(
        &self,
        session: &str,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        check_session(session)?;
        let inner = self.lock();
        let Some(log) = inner.logs.get(session) else {
            return Ok(Vec::new());
        };
        let mut out: Vec<StoredMessage> =
            log.messages.values().rev().take(limit).cloned().collect();
        out.reverse();
        Ok(out)
    }

    fn load_history(&self, session: &str) -> Result<Vec<Message>, StoreError> {
        Ok(self
            .lock()
            .history
            .get(session)
            .cloned()
            .unwrap_or_default())
    }

    fn load_summary(&self, session: &str) -> Result<Option<Summary>, StoreError> {
        Ok(self.lock().summaries.get(session).cloned())
    }

    fn save_history(&self, session: &str, history: &[Message]) -> Result<(), StoreError> {
        self.lock()
            .history
            .insert(session.to_owned(), history.to_vec());
        Ok(())
    }

    fn add_pending_with(
        &self,
        mut item: PendingItem,
        also: Vec<KvWrite>,
    ) -> Result<u64, StoreError> {
        let mut inner = self.lock();
        inner.check_kv(&also)?;
        let id = inner.next_id();
        item.id = id;
        inner.pending.insert(id, item);
        inner.apply_kv(also);
        Ok(id)
    }

    fn pending(&self) -> Result<Vec<PendingItem>, StoreError> {
        Ok(self.lock().pending.values().cloned().collect())
    }

    fn remove_pending(&self, ids: &[u64]) -> Result<(), StoreError> {
        let mut inner = self.lock();
        for id in ids {
            inner.pending.remove(id);
        }
        Ok(())
    }

    fn commit_turn(&self, commit: TurnCommit) -> Result<Option<u64>, StoreError> {
        let mut inner = self.lock();
        inner.check_kv(&commit.also)?;
        match commit.history {
            Some(HistoryChange::Append { dropped, messages }) => {
                let history = inner.history.entry(commit.session.clone()).or_default();
                history.drain(..dropped.min(history.len()));
                history.extend(messages);
            }
            Some(HistoryChange::Replace(messages)) => {
                inner.summaries.remove(&commit.session);
                inner.history.insert(commit.session.clone(), messages);
            }
            None => {}
        }
        if let Some(summary) = commit.summary {
            inner.summaries.insert(commit.session, summary);
        }
        for id in &commit.answered {
            inner.pending.remove(id);
        }
        inner.apply_kv(commit.also);
        Ok(commit.reply.map(|mut entry| {
            let id = match entry.id {
                0 => inner.next_id(),
                reserved => reserved,
            };
            entry.id = id;
            inner.outbox.insert(id, entry);
            id
        }))
    }

    fn reserve_id(&self) -> Result<u64, StoreError> {
        Ok(self.lock().next_id())
    }

    fn unsent_outbox(&self) -> Result<Vec<OutboxEntry>, StoreError> {
        Ok(self.lock().outbox.values().cloned().collect())
    }

    fn mark_sent(&self, outbox_id: u64, platform_ids: &[String]) -> Result<(), StoreError> {
        self.finish_outbox(outbox_id, |e| e.sent_ids = platform_ids.to_vec());
        Ok(())
    }

    fn record_sent_parts(&self, outbox_id: u64, platform_ids: &[String]) -> Result<(), StoreError> {
        if let Some(entry) = self.lock().outbox.get_mut(&outbox_id) {
            entry.sent_ids = platform_ids.to_vec();
        }
        Ok(())
    }

    fn mark_failed(&self, outbox_id: u64, reason: &str) -> Result<(), StoreError> {
        self.finish_outbox(outbox_id, |e| e.failed = Some(reason.to_owned()));
        Ok(())
    }

    fn sent_reply(&self, outbox_id: u64) -> Result<Option<OutboxEntry>, StoreError> {
        Ok(self.lock().outbox_done.get(&outbox_id).cloned())
    }

    fn get_meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self.lock().meta.get(key).cloned())
    }

    fn set_meta(&self, key: &str, value: &str) -> Result<(), StoreError> {
        self.lock().meta.insert(key.to_owned(), value.to_owned());
        Ok(())
    }

    fn kv_get(&self, space: &str, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .lock()
            .kv
            .get(&(space.to_owned(), key.to_owned()))
            .cloned())
    }

    fn kv_put(&self, space: &str, key: &str, value: &str) -> Result<(), StoreError> {
        self.lock()
            .kv
            .insert((space.to_owned(), key.to_owned()), value.to_owned());
        Ok(())
    }

    fn kv_write(&self, writes: Vec<KvWrite>) -> Result<(), StoreError> {
        let mut inner = self.lock();
        inner.check_kv(&writes)?;
        inner.apply_kv(writes);
        Ok(())
    }

    fn kv_delete(&self, space: &str, key: &str) -> Result<bool, StoreError> {
        Ok(self
            .lock()
            .kv
            .remove(&(space.to_owned(), key.to_owned()))
            .is_some())
    }

    fn kv_scan(&self, space: &str, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .kv
            .range((space.to_owned(), prefix.to_owned())..)
            .take_while(|((s, k), _)| s == space && k.starts_with(prefix))
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect())
    }

    fn chat_status(&self, session: &str) -> Result<Option<ChatRecord>, StoreError> {
        Ok(self.lock().chats.get(session).cloned())
    }

    fn queue_outbox_with(
        &self,
        mut entry: OutboxEntry,
        also: Vec<KvWrite>,
    ) -> Result<u64, StoreError> {
        check_session(&entry.session)?;
        let mut inner = self.lock();
        inner.check_kv(&also)?;
        inner.apply_kv(also);
        let id = inner.next_id();
        entry.id = id;
        inner.outbox.insert(id, entry);
        Ok(id)
    }

    fn set_chat_status(
        &self,
        record: &ChatRecord,
        also: Vec<KvWrite>,
        notices: Vec<OutboxEntry>,
    ) -> Result<Vec<u64>, StoreError> {
        let session = record.chat.session_key();
        check_session(&session)?;
        let mut inner = self.lock();
        inner.check_kv(&also)?;
        inner.chats.insert(session, record.clone());
        inner.apply_kv(also);
        Ok(notices
            .into_iter()
            .map(|mut entry| {
                let id = inner.next_id();
                entry.id = id;
                inner.outbox.insert(id, entry);
                id
            })
            .collect())
    }

    fn migrate_session(
        &self,
        from: &ChatRef,
        to: &ChatRef,
        also: Vec<KvWrite>,
    ) -> Result<bool, StoreError> {
        let (old, new) = (from.session_key(), to.session_key());
        check_session(&old)?;
        check_session(&new)?;
        let mut inner = self.lock();
        let marker = migrated_key(&old);
        if inner.meta.contains_key(&marker) {
            return Ok(false);
        }
        inner.check_kv(&also)?;
        // The log: the old chat's messages first, then whatever the new chat logged.
        let moved = inner.logs.remove(&old).unwrap_or_default();
        let kept = inner.logs.remove(&new).unwrap_or_default();
        let mut log = SessionLog::default();
        for message in moved.messages.into_values() {
            log.append(moved_message(from, message), self.bound);
        }
        for message in kept.messages.into_values() {
            log.append(message, self.bound);
        }
        if !log.messages.is_empty() {
            inner.logs.insert(new.clone(), log);
        }
        if let Some(mut history) = inner.history.remove(&old) {
            history.extend(inner.history.remove(&new).unwrap_or_default());
            inner.history.insert(new.clone(), history);
        }
        let old_summary = inner.summaries.remove(&old);
        let new_summary = inner.summaries.remove(&new);
        if let Some(summary) = merged_summaries(old_summary, new_summary) {
            inner.summaries.insert(new.clone(), summary);
        }
        for item in inner.pending.values_mut() {
            if item.session == old {
                *item = moved_pending(to, item.clone());
            }
        }
        for entry in inner.outbox.values_mut() {
            if entry.session == old {
                *entry = moved_outbox(to, entry.clone());
            }
        }
        let record = inner.chats.remove(&old);
        inner
            .chats
            .insert(new.clone(), migrated_record(to, record, self.wall.now()));
        inner.apply_kv(also);
        inner.meta.insert(marker, new);
        Ok(true)
    }

    fn migrated_to(&self, session: &str) -> Result<Option<String>, StoreError> {
        Ok(self.lock().meta.get(&migrated_key(session)).cloned())
    }

    fn edit_message(
        &self,
        session: &str,
        message: &StoredMessage,
        pending_text: Option<&str>,
    ) -> Result<Edited, StoreError> {
        check_session(session)?;
        let mut inner = self.lock();
        let Some(log) = inner.logs.get_mut(session) else {
            return Ok(Edited::Unknown);
        };
        let Some(seq) = log.ids.get(&message.message_id).copied() else {
            return Ok(Edited::Unknown);
        };
        log.messages.insert(seq, message.clone());
        let Some(text) = pending_text else {
            return Ok(Edited::Logged);
        };
        match inner
            .pending
            .values_mut()
            .find(|item| is_pending_for(item, session, &message.message_id))
        {
            Some(item) => {
                item.text = text.to_owned();
                item.images = message.images.clone();
                Ok(Edited::Pending(item.id))
            }
            None => Ok(Edited::Logged),
        }
    }

    fn durable(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        let ticket = self.commit.ticket();
        Box::pin(self.commit.wait(ticket, || Ok(())))
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.commit.wait_blocking(self.commit.ticket(), || Ok(()))
    }

    fn flushes(&self) -> u64 {
        self.commit.flushes()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};

    use super::*;
    use crate::store::test_reply as reply;

    #[test]
    fn sent_replies_past_the_keep_days_are_pruned_oldest_first() {
        let days = Arc::new(AtomicI64::new(0));
        let start = chrono::Utc::now();
        let clock = Arc::clone(&days);
        let store = MemoryStore::with_options(StoreOptions {
            wall: WallTime::from_fn(move || {
                start + chrono::Duration::days(clock.load(Ordering::SeqCst))
            }),
            ..StoreOptions::default()
        });
        let send = |text: &str| {
            let id = store
                .queue_outbox_with(reply(text), Vec::new())
                .expect("queue");
            store.mark_sent(id, &[format!("m-{text}")]).expect("sent");
            id
        };
        let old = send("old");
        let older_id_done_later = store
            .queue_outbox_with(reply("slow"), Vec::new())
            .expect("queue");
        days.store(2, Ordering::SeqCst);
        store.mark_sent(older_id_done_later, &[]).expect("sent");
        let recent = send("recent");

        days.store(super::super::SENT_KEEP_DAYS + 1, Ordering::SeqCst);
        let now = send("now");
        let kept: Vec<u64> = store.lock().outbox_done.keys().copied().collect();
        // The one done at day 0 is past the keep days; the next, done at day 2, is not yet,
        // and the walk stops there.
        assert_eq!(kept, [older_id_done_later, recent, now]);
        assert!(store.sent_reply(old).expect("read").is_none());
    }
}
