//! [`SledStore`]: the [`Store`] on an embedded sled 0.34 database under `data_dir`.
//!
//! ## Layout
//! Named trees; every value is a JSON object carrying a schema version `"v": 1` next to
//! its fields. A value with another version (or no version, or bad JSON) is reported as
//! [`StoreError::Corrupt`] naming the tree and key, never guessed at.
//!
//! | tree            | key                                  | value                                   |
//! |-----------------|--------------------------------------|-----------------------------------------|
//! | `messages`      | session `\0` seq (u64 big-endian)    | `{"v":1, ...StoredMessage}`             |
//! | `message_ids`   | session `\0` message_id              | `{"v":1,"seq":N}` (the dedupe index)    |
//! | `message_heads` | session                              | `{"v":1,"first":N,"next":M}`            |
//! | `history_heads` | session                              | `{"v":1,"first":N,"next":M}`            |
//! | `history_messages` | session `\0` seq (u64 big-endian) | `{"v":2,"kind":...}` (`history.rs`)     |
//! | `history`       | session                              | `{"v":1,"messages":[...]}` (old format) |
//! | `summaries`     | session                              | `{"v":1, ...Summary}` (compaction)      |
//! | `pending`       | id (u64 big-endian)                  | `{"v":1, ...PendingItem}`               |
//! | `outbox`        | id (u64 big-endian)                  | `{"v":1, ...OutboxEntry}` (unsent)      |
//! | `outbox_done`   | id (u64 big-endian)                  | `{"v":1, ...OutboxEntry}` (sent/failed) |
//! | `meta`          | key                                  | `{"v":1,"value":"..."}`                 |
//! | `chats`         | session                              | `{"v":1, ...ChatRecord}`                |
//!
//! `seq` is dense per session (`first..next` are the recorded messages), so the log of a
//! session is bounded without scanning it, and `recent_messages` is a reverse range scan.
//!
//! History is kept the same way, one record per message: a turn appends its new messages
//! and drops the trimmed ones from the front (by seq, without reading them), instead of
//! writing the whole history again. A message is stored in parlor's own form (schema version
//! 2, `history.rs`), not a provider's. Older releases kept a session's history as one
//! `history` record, and up to a271e69 each message as OpenAI's wire JSON (version 1);
//! [`SledStore::open`] migrates both once, and `meta` key `schema.history` says it did.

//! ## Atomic steps
//! Every write of more than one key (a message recorded and made pending, a turn's commit,
//! a reply moved to the done records) is one [`Steps`] step, not a sled transaction: sled
//! 0.34 writes its log buffer out twice for each transaction, which was most of a turn's
//! CPU (docs/perf.md). A step is recorded whole in the `steps` tree before it is applied,
//! and a step a kill interrupted is applied again when the store opens. Steps run one at a
//! time; readers do not wait for them, and may see one half applied, in the order of its
//! writes: each step writes what a reader looks up first last (a message's dedupe entry
//! after the message, a head after the records it counts), and the session layer reads a
//! chat's history only from the chat's own worker, which is also its only writer.
//! Pending and outbox ids come from sled's `generate_id`, which is monotonic across
//! restarts, so key order is arrival order.
//!
//! Session keys must not contain a NUL byte (it separates the session from the rest of a
//! key); such a session is refused with [`StoreError::Io`].

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sled::transaction::ConflictableTransactionError;
use sled::{Db, IVec, Tree};

use super::arena::StoreScope;
use super::common::{
    StoreOptions, check_session, decode, decode_history_entry, encode, encode_turn, is_pending_for,
    migrated_record,
};
use super::history::HISTORY_VERSION;
use super::sled_step::{StepTree, Steps};
use super::{
    ChatRecord, Edited, GroupCommit, HistoryChange, Inbound, Intake, KvWrite, OutboxEntry,
    PendingItem, SENT_KEEP_DAYS, Store, StoreError, StoredMessage, Summary, TurnCommit,
    merged_summaries, migrated_key, moved_message, moved_outbox, moved_pending,
};
use crate::llm::Message;
use crate::platform::ChatRef;
use crate::time::WallTime;

/// How often [`Store::migrate_session`] re-reads and retries when the sessions it moves
/// changed between its read and its step.
const MIGRATE_ATTEMPTS: usize = 8;

/// The `meta` key saying which history schema every history message is at.
const HISTORY_SCHEMA_KEY: &str = "schema.history";

/// Bytes sled may keep in its page cache: the hot chats' nodes fit, and with 10,000 chats
/// known it is most of what an idle daemon holds (docs/perf.md: 4 MiB cost 5 MiB of RSS;
/// 1.5 MiB instead of 2 took about 0.6 MiB off the RSS after 10,000 groups, CPU per turn
/// unchanged).
const CACHE_CAPACITY: u64 = 3 * 512 * 1024;

/// The [`Store`] on a sled database (see the module docs for the layout).
#[derive(Clone)]
pub struct SledStore {
    path: PathBuf,
    db: Db,
    messages: Tree,
    message_ids: Tree,
    message_heads: Tree,
    /// Histories in the format of earlier releases, read until rewritten.
    history: Tree,
    history_heads: Tree,
    history_messages: Tree,
    /// Session key -> [`Summary`] of its compacted older turns.
    summaries: Tree,
    pending: Tree,
    outbox: Tree,
    outbox_done: Tree,
    meta: Tree,
    chats: Tree,
    bound: u64,
    /// Shared by the clones: they are one database, whose flushes cover them all.
    commit: Arc<GroupCommit>,
    /// Every write of more than one key is a step ([`Steps`]); shared by the clones.
    steps: Arc<Steps>,
    /// Unix seconds before which no done reply can be old enough to prune (the oldest one's
    /// `done_at` plus [`SENT_KEEP_DAYS`]); 0 until the first look. Shared by the clones.
    prune_due: Arc<AtomicI64>,
    /// The toolset collections' trees opened so far, by collection. sled keeps opened trees
    /// too, but its lookup (a formatted name, its lock, a map of byte strings) cost a turn
    /// about five thousand instructions. Shared by the clones.
    kv_trees: Arc<RwLock<HashMap<String, Tree>>>,
    /// Where a done reply's `done_at`, the prune cutoff and a migrated chat's `since` are
    /// read ([`StoreOptions::wall`]).
    wall: WallTime,
}

impl fmt::Debug for SledStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.path)
            .field("max_messages_per_chat", &self.bound)
            .finish_non_exhaustive()
    }
}

impl SledStore {
    /// Opens (creating if needed) the database in `dir`.
    ///
    /// Fails with [`StoreError::Locked`] when the directory is already open, in another
    /// process or in this one: sled takes an exclusive `flock` on its `db` file, and such a
    /// lock conflicts with any other open file description, whichever process holds it.
    /// A locked database is retried for [`StoreOptions::lock_timeout`] first (blocking the
    /// calling thread: open the store at startup, or in `spawn_blocking`).
    pub fn open(dir: &Path, options: StoreOptions) -> Result<SledStore, StoreError> {
        // Recovery loads a record of every page of the database.
        let _scope = StoreScope::enter();
        let start = Instant::now();
        let db = loop {
            // sled's default page cache may grow to 1 GiB; a chat daemon's working set is a
            // few hot chats, and RSS is one of parlor's targets (docs/perf.md).
            match sled::Config::new()
                .path(dir)
                .cache_capacity(CACHE_CAPACITY)
                .open()
            {
                Ok(db) => break db,
                Err(e) => match open_error(dir, e) {
                    StoreError::Locked(_) if start.elapsed() < options.lock_timeout => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    other => return Err(other),
                },
            }
        };
        let tree = |name: &str| db.open_tree(name).map_err(|e| open_error(dir, e));
        // First: a step a kill interrupted is finished before anything is read.
        let steps = Arc::new(Steps::open(&db)?);
        let store = SledStore {
            path: dir.to_path_buf(),
            messages: tree("messages")?,
            message_ids: tree("message_ids")?,
            message_heads: tree("message_heads")?,
            history: tree("history")?,
            history_heads: tree("history_heads")?,
            history_messages: tree("history_messages")?,
            summaries: tree("summaries")?,
            pending: tree("pending")?,
            outbox: tree("outbox")?,
            outbox_done: tree("outbox_done")?,
            meta: tree("meta")?,
            chats: tree("chats")?,
            db,
            bound: options.bound(),
            commit: Arc::new(GroupCommit::new()),
            steps,
            prune_due: Arc::new(AtomicI64::new(0)),
            kv_trees: Arc::default(),
            wall: options.wall,
        };
        store.migrate_history()?;
        tracing::debug!(path = %dir.display(), "store opened");
        Ok(store)
    }

    /// Brings every history to parlor's own form (schema version 2, `history.rs`) once:
    /// histories still in one old `history` record become messages, and each message in
    /// OpenAI's wire JSON (version 1) is written again in the new form. Each rewrite is one
    /// write of a value that reads the same before and after, so a kill in the middle leaves
    /// a readable store and the next open goes on; `schema.history` in `meta` says it is
    /// done. A value that cannot be read is left as it is: reading that chat's history
    /// reports it, as it would have before.
    fn migrate_history(&self) -> Result<(), StoreError> {
        let done = self.get_meta(HISTORY_SCHEMA_KEY)?;
        if done.as_deref() == Some(HISTORY_VERSION.to_string().as_str()) {
            return Ok(());
        }
        let mut chats = 0_u64;
        for entry in self.history.iter().keys() {
            let key = entry.map_err(sled_error)?;
            let session = String::from_utf8_lossy(&key).into_owned();
            let moved = self.steps.run(
                &[&self.history, &self.history_heads, &self.history_messages],
                |t| {
                    let (legacy, heads, log) = (&t[0], &t[1], &t[2]);
                    let tx = HistoryTx { legacy, heads, log };
                    if heads.get(&session)?.is_some() {
                        // A history already in messages wins on reading; the record is dead.
                        legacy.remove(session.as_bytes())?;
                    } else {
                        // `head` writes the record out as messages and removes it.
                        let head = tx.head(&session)?;
                        tx.set_head(&session, head)?;
                    }
                    Ok(())
                },
            );
            match moved {
                Ok(()) => chats += 1,
                Err(e @ StoreError::Corrupt { .. }) => {
                    tracing::warn!(error = %e, "a history cannot be read; left as it is");
                }
                Err(e) => return Err(e),
            }
        }
        let mut rewritten = 0_u64;
        for entry in self.history_messages.iter() {
            let (key, bytes) = entry.map_err(sled_error)?;
            if bytes.starts_with(b"{\"v\":2,") {
                continue;
            }
            let message = match decode_history_entry(&bytes, || {
                format!("history_messages[{}]", describe_seq(&key))
            }) {
                Ok(message) => message,
                Err(e) => {
                    tracing::warn!(error = %e, "a history message cannot be read; left as it is");
                    continue;
                }
            };
            let value = encode_turn(&message)?;
            // Only if unchanged since it was read: nothing else writes while the store
            // opens, but a compare-and-swap costs nothing here and states the intent.
            self.history_messages
                .compare_and_swap(&key, Some(bytes), Some(value))
                .map_err(sled_error)?
                .ok();
            rewritten += 1;
        }
        self.flush_log()?;
        self.set_meta(HISTORY_SCHEMA_KEY, &HISTORY_VERSION.to_string())?;
        self.flush_log()?;
        if chats + rewritten > 0 {
            tracing::info!(
                chats_from_one_record = chats,
                messages = rewritten,
                "history migrated to parlor's own form (schema version {HISTORY_VERSION})"
            );
        }
        Ok(())
    }

    /// The directory the database lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Store for SledStore {
    fn record_inbound(
        &self,
        session: &str,
        message: &StoredMessage,
        intake: Intake,
    ) -> Result<Inbound, StoreError> {
        let _scope = StoreScope::enter();
        check_session(session)?;
        let value = encode(message)?;
        let id_key = message_id_key(session, &message.message_id);
        let bound = self.bound;
        // Ids are taken before the step (a refused one only wastes one),
        // and the value is encoded once.
        let extra = match intake {
            Intake::Record => None,
            Intake::Pending(mut item) => {
                let id = self.db.generate_id().map_err(sled_error)?;
                item.id = id;
                Some((0usize, id, encode(&item)?))
            }
            Intake::Reply(mut entry) => {
                let id = self.db.generate_id().map_err(sled_error)?;
                entry.id = id;
                Some((1usize, id, encode(&entry)?))
            }
        };
        let trees = [
            &self.messages,
            &self.message_ids,
            &self.message_heads,
            &self.pending,
            &self.outbox,
        ];
        self.steps.run(&trees[..], |t| {
            let log = ChatLogTx {
                log: &t[0],
                ids: &t[1],
                heads: &t[2],
                bound,
            };
            if !log.record(session, &id_key, &value)? {
                return Ok(Inbound::Duplicate);
            }
            match &extra {
                Some((which, id, value)) => {
                    t[3 + which].insert(id.to_be_bytes(), value.as_slice())?;
                    Ok(Inbound::Recorded(Some(*id)))
                }
                None => Ok(Inbound::Recorded(None)),
            }
        })
    }

    fn get_message(
        &self,
        session: &str,
        message_id: &str,
    ) -> Result<Option<StoredMessage>, StoreError> {
        let _scope = StoreScope::enter();
        check_session(session)?;
        let Some(bytes) = self
            .message_ids
            .get(message_id_key(session, message_id))
            .map_err(sled_error)?
        else {
            return Ok(None);
        };
        let SeqRecord { seq } = decode(&bytes, || format!("message_ids[{session}/{message_id}]"))?;
        match self
            .messages
            .get(message_key(session, seq))
            .map_err(sled_error)?
        {
            Some(bytes) => decode(&bytes, || format!("messages[{session}/{seq}]")).map(Some),
            None => Ok(None),
        }
    }

    fn recent_messages(
        &self,
        session: &str,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        let _scope = StoreScope::enter();
        check_session(session)?;
        let mut out = Vec::with_capacity(limit.min(256));
        for entry in self
            .messages
            .scan_prefix(session_prefix(session))
            .rev()
            .take(limit)
        {
            let (key, bytes) = entry.map_err(sled_error)?;
            out.push(decode(&bytes, || {
                format!("messages[{session}/{}]", describe_seq(&key))
            })?);
        }
        out.reverse();
        Ok(out)
    }

    fn load_history(&self, session: &str) -> Result<Vec<Message>, StoreError> {
        let _scope = StoreScope::enter();
        check_session(session)?;
        Ok(self.read_history(session)?.1)
    }

    fn load_summary(&self, session: &str) -> Result<Option<Summary>, StoreError> {
        let _scope = StoreScope::enter();
        check_session(session)?;
        match self.summaries.get(session).map_err(sled_error)? {
            Some(bytes) => decode(&bytes, || format!("summaries[{session}]")).map(Some),
            None => Ok(None),
        }
    }

    fn save_history(&self, session: &str, history: &[Message]) -> Result<(), StoreError> {
        let _scope = StoreScope::enter();
        check_session(session)?;
        let values = encode_history(history)?;
        self.steps.run(
            &[&self.history, &self.history_heads, &self.history_messages],
            |t| {
                let (legacy, heads, log) = (&t[0], &t[1], &t[2]);
                HistoryTx { legacy, heads, log }.replace(session, &values)
            },
        )
    }

    fn add_pending_with(
        &self,
        mut item: PendingItem,
        also: Vec<KvWrite>,
    ) -> Result<u64, StoreError> {
        let _scope = StoreScope::enter();
        let id = self.db.generate_id().map_err(sled_error)?;
        item.id = id;
        let value = encode(&item)?;
        let (trees, index) = self.with_kv_trees(vec![self.pending.clone()], &also)?;
        self.steps.run(&trees[..], |t| {
            t[0].insert(id.to_be_bytes(), value.as_slice())?;
            apply_kv(t, &also, &index)
        })?;
        Ok(id)
    }

    fn pending(&self) -> Result<Vec<PendingItem>, StoreError> {
        let _scope = StoreScope::enter();
        read_all(&self.pending, "pending")
    }

    fn remove_pending(&self, ids: &[u64]) -> Result<(), StoreError> {
        let _scope = StoreScope::enter();
        self.steps.run(&[&self.pending], |t| {
            for id in ids {
                t[0].delete(id.to_be_bytes())?;
            }
            Ok(())
        })
    }

    fn commit_turn(&self, commit: TurnCommit) -> Result<Option<u64>, StoreError> {
        let _scope = StoreScope::enter();
        check_session(&commit.session)?;
        // Encoded outside the step, which holds the store's write lock.
        let history = match &commit.history {
            Some(HistoryChange::Append { dropped, messages }) => Some((
                Some(u64::try_from(*dropped).unwrap_or(u64::MAX)),
                encode_history(messages)?,
            )),
            Some(HistoryChange::Replace(messages)) => Some((None, encode_history(messages)?)),
            None => None,
        };
        let reply = match commit.reply {
            Some(mut entry) => {
                // Assigned before the step: a failed commit only wastes an id.
                let id = match entry.id {
                    0 => self.db.generate_id().map_err(sled_error)?,
                    reserved => reserved,
                };
                entry.id = id;
                Some((id, encode(&entry)?))
            }
            None => None,
        };
        let summary = commit.summary.as_ref().map(encode).transpose()?;
        let session = commit.session.as_str();
        let answered = &commit.answered;
        let also = &commit.also;
        let (trees, index) = self.with_kv_trees(
            vec![
                self.history.clone(),
                self.history_heads.clone(),
                self.history_messages.clone(),
                self.pending.clone(),
                self.outbox.clone(),
                self.summaries.clone(),
            ],
            also,
        )?;
        self.steps.run(&trees[..], |t| {
            let (pending, outbox, summaries) = (&t[3], &t[4], &t[5]);
            let tx = HistoryTx {
                legacy: &t[0],
                heads: &t[1],
                log: &t[2],
            };
            match &history {
                Some((Some(dropped), values)) => tx.append(session, *dropped, values)?,
                Some((None, values)) => {
                    tx.replace(session, values)?;
                    summaries.delete(session)?;
                }
                None => {}
            }
            if let Some(value) = &summary {
                summaries.insert(session, value.as_slice())?;
            }
            for id in answered {
                pending.delete(id.to_be_bytes())?;
            }
            if let Some((id, value)) = &reply {
                outbox.insert(id.to_be_bytes(), value.as_slice())?;
            }
            apply_kv(t, also, &index)
        })?;
        Ok(reply.map(|(id, _)| id))
    }

    fn reserve_id(&self) -> Result<u64, StoreError> {
        let _scope = StoreScope::enter();
        self.db.generate_id().map_err(sled_error)
    }

    fn unsent_outbox(&self) -> Result<Vec<OutboxEntry>, StoreError> {
        let _scope = StoreScope::enter();
        read_all(&self.outbox, "outbox")
    }

    fn mark_sent(&self, outbox_id: u64, platform_ids: &[String]) -> Result<(), StoreError> {
        let _scope = StoreScope::enter();
        self.finish_outbox(
            outbox_id,
            |entry| entry.sent_ids = platform_ids.to_vec(),
            None,
        )
    }

    fn mark_sent_with_own(
        &self,
        outbox_id: u64,
        platform_ids: &[String],
        session: &str,
        own: Option<&StoredMessage>,
    ) -> Result<(), StoreError> {
        let _scope = StoreScope::enter();
        let own = match own {
            Some(message) => {
                check_session(session)?;
                Some(OwnRecord {
                    session,
                    id_key: message_id_key(session, &message.message_id),
                    value: encode(message)?,
                })
            }
            None => None,
        };
        self.finish_outbox(
            outbox_id,
            |entry| entry.sent_ids = platform_ids.to_vec(),
            own.as_ref(),
        )
    }

    fn record_sent_parts(&self, outbox_id: u64, platform_ids: &[String]) -> Result<(), StoreError> {
        let _scope = StoreScope::enter();
        let key = outbox_id.to_be_bytes();
        self.steps.run(&[&self.outbox], |t| {
            let Some(bytes) = t[0].get(key)? else {
                return Ok(());
            };
            let mut entry: OutboxEntry = decode(&bytes, || format!("outbox[{outbox_id}]"))
                .map_err(ConflictableTransactionError::Abort)?;
            entry.sent_ids = platform_ids.to_vec();
            t[0].insert(key, encode_abort(&entry)?)?;
            Ok(())
        })
    }

    fn mark_failed(&self, outbox_id: u64, reason: &str) -> Result<(), StoreError> {
        let _scope = StoreScope::enter();
        self.finish_outbox(
            outbox_id,
            |entry| entry.failed = Some(reason.to_owned()),
            None,
        )
    }

    fn sent_reply(&self, outbox_id: u64) -> Result<Option<OutboxEntry>, StoreError> {
        let _scope = StoreScope::enter();
        match self
            .outbox_done
            .get(outbox_id.to_be_bytes())
            .map_err(sled_error)?
        {
            Some(bytes) => decode(&bytes, || format!("outbox_done[{outbox_id}]")).map(Some),
            None => Ok(None),
        }
    }

    fn get_meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        let _scope = StoreScope::enter();
        match self.meta.get(key).map_err(sled_error)? {
            Some(bytes) => {
                let record: MetaRecord = decode(&bytes, || format!("meta[{key}]"))?;
                Ok(Some(record.value))
            }
            None => Ok(None),
        }
    }

    fn set_meta(&self, key: &str, value: &str) -> Result<(), StoreError> {
        let _scope = StoreScope::enter();
        let value = encode(&MetaRef { value })?;
        self.steps.run(&[&self.meta], |t| {
            t[0].insert(key, value.as_slice())?;
            Ok(())
        })
    }

    fn kv_get(&self, space: &str, key: &str) -> Result<Option<String>, StoreError> {
        let _scope = StoreScope::enter();
        let tree = self.kv_tree(space)?;
        match tree.get(key).map_err(sled_error)? {
            Some(bytes) => Ok(Some(kv_text(&bytes, space, key)?)),
            None => Ok(None),
        }
    }

    fn kv_put(&self, space: &str, key: &str, value: &str) -> Result<(), StoreError> {
        let _scope = StoreScope::enter();
        let tree = self.kv_tree(space)?;
        self.steps.run(&[&tree], |t| {
            t[0].insert(key, value.as_bytes())?;
            Ok(())
        })
    }

    fn kv_write(&self, writes: Vec<KvWrite>) -> Result<(), StoreError> {
        let _scope = StoreScope::enter();
        let (trees, index) = self.with_kv_trees(Vec::new(), &writes)?;
        if trees.is_empty() {
            return Ok(());
        }
        self.steps.run(&trees[..], |t| apply_kv(t, &writes, &index))
    }

    fn kv_delete(&self, space: &str, key: &str) -> Result<bool, StoreError> {
        let _scope = StoreScope::enter();
        let tree = self.kv_tree(space)?;
        self.steps
            .run(&[&tree], |t| Ok(t[0].remove(key)?.is_some()))
    }

    fn kv_scan(&self, space: &str, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
        let _scope = StoreScope::enter();
        let tree = self.kv_tree(space)?;
        tree.scan_prefix(prefix)
            .map(|entry| {
                let (k, v) = entry.map_err(sled_error)?;
                let key = String::from_utf8_lossy(&k).into_owned();
                let value = kv_text(&v, space, &key)?;
                Ok((key, value))
            })
            .collect()
    }

    fn chat_status(&self, session: &str) -> Result<Option<ChatRecord>, StoreError> {
        let _scope = StoreScope::enter();
        match self.chats.get(session).map_err(sled_error)? {
            Some(bytes) => decode(&bytes, || format!("chats[{session}]")).map(Some),
            None => Ok(None),
        }
    }

    fn queue_outbox_with(
        &self,
        mut entry: OutboxEntry,
        also: Vec<KvWrite>,
    ) -> Result<u64, StoreError> {
        let _scope = StoreScope::enter();
        check_session(&entry.session)?;
        // Assigned before the step: a failed one only wastes an id.
        entry.id = self.db.generate_id().map_err(sled_error)?;
        let row = encode(&entry)?;
        let (trees, index) = self.with_kv_trees(vec![self.outbox.clone()], &also)?;
        self.steps.run(&trees[..], |t| {
            t[0].insert(entry.id.to_be_bytes(), row.as_slice())?;
            apply_kv(t, &also, &index)
        })?;
        Ok(entry.id)
    }

    fn set_chat_status(
        &self,
        record: &ChatRecord,
        also: Vec<KvWrite>,
        notices: Vec<OutboxEntry>,
    ) -> Result<Vec<u64>, StoreError> {
        let _scope = StoreScope::enter();
        let session = record.chat.session_key();
        check_session(&session)?;
        let value = encode(record)?;
        let mut rows = Vec::with_capacity(notices.len());
        for mut entry in notices {
            // Assigned before the step: a failed one only wastes ids.
            entry.id = self.db.generate_id().map_err(sled_error)?;
            rows.push((entry.id, encode(&entry)?));
        }
        let (trees, index) =
            self.with_kv_trees(vec![self.chats.clone(), self.outbox.clone()], &also)?;
        self.steps.run(&trees[..], |t| {
            t[0].insert(session.as_bytes(), value.as_slice())?;
            for (id, row) in &rows {
                t[1].insert(id.to_be_bytes(), row.as_slice())?;
            }
            apply_kv(t, &also, &index)
        })?;
        Ok(rows.into_iter().map(|(id, _)| id).collect())
    }

    fn migrate_session(
        &self,
        from: &ChatRef,
        to: &ChatRef,
        also: Vec<KvWrite>,
    ) -> Result<bool, StoreError> {
        let _scope = StoreScope::enter();
        let (old, new) = (from.session_key(), to.session_key());
        check_session(&old)?;
        check_session(&new)?;
        for _ in 0..MIGRATE_ATTEMPTS {
            if let Some(moved) = self.try_migrate(from, to, &old, &new, &also)? {
                return Ok(moved);
            }
            tracing::debug!(from = %old, to = %new, "a session changed while it was moved; again");
        }
        Err(StoreError::Io(format!(
            "could not move session {old} to {new}: it kept changing"
        )))
    }

    fn migrated_to(&self, session: &str) -> Result<Option<String>, StoreError> {
        let _scope = StoreScope::enter();
        self.get_meta(&migrated_key(session))
    }

    fn edit_message(
        &self,
        session: &str,
        message: &StoredMessage,
        pending_text: Option<&str>,
    ) -> Result<Edited, StoreError> {
        let _scope = StoreScope::enter();
        check_session(session)?;
        let value = encode(message)?;
        let id_key = message_id_key(session, &message.message_id);
        // The pending input of the message, found outside the step and checked again
        // inside it (a step reads keys, it does not scan).
        let candidate = match pending_text {
            Some(_) => read_all::<PendingItem>(&self.pending, "pending")?
                .into_iter()
                .find(|item| is_pending_for(item, session, &message.message_id))
                .map(|item| item.id),
            None => None,
        };
        self.steps
            .run(&[&self.messages, &self.message_ids, &self.pending], |t| {
                let (log, ids, pending) = (&t[0], &t[1], &t[2]);
                let Some(bytes) = ids.get(&id_key)? else {
                    return Ok(Edited::Unknown);
                };
                let SeqRecord { seq } = decode(&bytes, || {
                    format!("message_ids[{session}/{}]", message.message_id)
                })
                .map_err(ConflictableTransactionError::Abort)?;
                log.insert(message_key(session, seq), value.as_slice())?;
                let (Some(id), Some(text)) = (candidate, pending_text) else {
                    return Ok(Edited::Logged);
                };
                let Some(bytes) = pending.get(id.to_be_bytes())? else {
                    // Answered meanwhile.
                    return Ok(Edited::Logged);
                };
                let mut item: PendingItem = decode(&bytes, || format!("pending[{id}]"))
                    .map_err(ConflictableTransactionError::Abort)?;
                item.text = text.to_owned();
                item.images = message.images.clone();
                pending.insert(id.to_be_bytes(), encode_abort(&item)?)?;
                Ok(Edited::Pending(id))
            })
    }

    fn durable(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        let ticket = self.commit.ticket();
        Box::pin(self.commit.wait(ticket, || self.flush_log()))
    }

    fn flush(&self) -> Result<(), StoreError> {
        let _scope = StoreScope::enter();
        self.commit
            .wait_blocking(self.commit.ticket(), || self.flush_log())
    }

    fn flushes(&self) -> u64 {
        self.commit.flushes()
    }
}

/// A chat log as read for a migration: each message's key and value.
type LogRead = Vec<(IVec, StoredMessage)>;

impl SledStore {
    /// Reads what a migration moves, then moves it in one step, provided neither
    /// session's log changed in between; `None` when one did (read again and retry).
    fn try_migrate(
        &self,
        from: &ChatRef,
        to: &ChatRef,
        old: &str,
        new: &str,
        also: &[KvWrite],
    ) -> Result<Option<bool>, StoreError> {
        let marker = migrated_key(old);
        if self.meta.get(&marker).map_err(sled_error)?.is_some() {
            return Ok(Some(false));
        }
        let heads = (
            self.message_heads.get(old).map_err(sled_error)?,
            self.message_heads.get(new).map_err(sled_error)?,
        );
        let (old_log, new_log) = (self.read_log(old)?, self.read_log(new)?);
        let (old_stamp, old_history) = self.read_history(old)?;
        let (new_stamp, new_history) = self.read_history(new)?;
        // The old chat's history goes before the new one's; nothing moves without one.
        let history = match old_stamp.exists() {
            true => Some(encode_history(
                &old_history
                    .into_iter()
                    .chain(new_history)
                    .collect::<Vec<_>>(),
            )?),
            false => None,
        };
        let mut combined: Vec<StoredMessage> = old_log
            .iter()
            .map(|(_, m)| moved_message(from, m.clone()))
            .chain(new_log.iter().map(|(_, m)| m.clone()))
            .collect();
        let excess = combined
            .len()
            .saturating_sub(usize::try_from(self.bound).unwrap_or(usize::MAX));
        combined.drain(..excess);
        let combined = combined
            .iter()
            .map(|m| Ok((m.message_id.clone(), encode(m)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let pending_ids: Vec<u64> = read_all::<PendingItem>(&self.pending, "pending")?
            .into_iter()
            .filter(|item| item.session == old)
            .map(|item| item.id)
            .collect();
        let outbox_ids: Vec<u64> = read_all::<OutboxEntry>(&self.outbox, "outbox")?
            .into_iter()
            .filter(|entry| entry.session == old)
            .map(|entry| entry.id)
            .collect();
        let marker_value = encode(&MetaRef { value: new })?;
        let base = vec![
            self.messages.clone(),
            self.message_ids.clone(),
            self.message_heads.clone(),
            self.history.clone(),
            self.pending.clone(),
            self.outbox.clone(),
            self.chats.clone(),
            self.meta.clone(),
            self.history_heads.clone(),
            self.history_messages.clone(),
            self.summaries.clone(),
        ];
        let (trees, index) = self.with_kv_trees(base, also)?;
        self.steps.run(&trees[..], |t| {
            let (log, ids, head_tree) = (&t[0], &t[1], &t[2]);
            let (pending, outbox, chats, meta) = (&t[4], &t[5], &t[6], &t[7]);
            let history_tx = HistoryTx {
                legacy: &t[3],
                heads: &t[8],
                log: &t[9],
            };
            if meta.get(&marker)?.is_some() {
                return Ok(Some(false));
            }
            if (head_tree.get(old)?, head_tree.get(new)?) != heads
                || history_tx.stamp(old)? != old_stamp
                || history_tx.stamp(new)? != new_stamp
            {
                return Ok(None);
            }
            // The log, rebuilt under the new session from seq 0.
            for (session, read) in [(old, &old_log), (new, &new_log)] {
                for (key, message) in read.iter() {
                    log.delete(key)?;
                    ids.delete(message_id_key(session, &message.message_id))?;
                }
            }
            for (seq, (message_id, value)) in (0u64..).zip(&combined) {
                log.insert(message_key(new, seq), value.as_slice())?;
                ids.insert(
                    message_id_key(new, message_id),
                    encode_abort(&SeqRecord { seq })?,
                )?;
            }
            head_tree.delete(old)?;
            if !combined.is_empty() {
                let next = u64::try_from(combined.len()).unwrap_or(u64::MAX);
                head_tree.insert(new, encode_abort(&Head { first: 0, next })?)?;
            }
            if let Some(values) = &history {
                history_tx.replace(old, &[])?;
                history_tx.replace(new, values)?;
            }
            let summaries = &t[10];
            let read_summary = |session: &str| match summaries.get(session)? {
                Some(bytes) => decode::<Summary>(&bytes, || format!("summaries[{session}]"))
                    .map(Some)
                    .map_err(ConflictableTransactionError::Abort),
                None => Ok(None),
            };
            let (old_summary, new_summary) = (read_summary(old)?, read_summary(new)?);
            if old_summary.is_some() {
                summaries.delete(old)?;
                if let Some(summary) = merged_summaries(old_summary, new_summary) {
                    summaries.insert(new, encode_abort(&summary)?)?;
                }
            }
            for id in &pending_ids {
                if let Some(bytes) = pending.get(id.to_be_bytes())? {
                    let item: PendingItem = decode(&bytes, || format!("pending[{id}]"))
                        .map_err(ConflictableTransactionError::Abort)?;
                    pending.insert(id.to_be_bytes(), encode_abort(&moved_pending(to, item))?)?;
                }
            }
            for id in &outbox_ids {
                if let Some(bytes) = outbox.get(id.to_be_bytes())? {
                    let entry: OutboxEntry = decode(&bytes, || format!("outbox[{id}]"))
                        .map_err(ConflictableTransactionError::Abort)?;
                    outbox.insert(id.to_be_bytes(), encode_abort(&moved_outbox(to, entry))?)?;
                }
            }
            let record = match chats.remove(old)? {
                Some(bytes) => Some(
                    decode::<ChatRecord>(&bytes, || format!("chats[{old}]"))
                        .map_err(ConflictableTransactionError::Abort)?,
                ),
                None => None,
            };
            chats.insert(
                new,
                encode_abort(&migrated_record(to, record, self.wall.now()))?,
            )?;
            apply_kv(t, also, &index)?;
            meta.insert(marker.as_bytes(), marker_value.as_slice())?;
            Ok(Some(true))
        })
    }

    /// The history of `session` and what it was read from (to tell whether it changed since).
    fn read_history(&self, session: &str) -> Result<(HistoryStamp, Vec<Message>), StoreError> {
        let head = self.history_heads.get(session).map_err(sled_error)?;
        let legacy = self.history.get(session).map_err(sled_error)?;
        let messages = match (&head, &legacy) {
            (Some(_), _) => self
                .history_messages
                .scan_prefix(session_prefix(session))
                .map(|entry| {
                    let (key, bytes) = entry.map_err(sled_error)?;
                    decode_history_entry(&bytes, || {
                        format!("history_messages[{session}/{}]", describe_seq(&key))
                    })
                })
                .collect::<Result<_, StoreError>>()?,
            (None, Some(bytes)) => {
                decode::<HistoryRecord>(bytes, || format!("history[{session}]"))?.messages
            }
            (None, None) => Vec::new(),
        };
        Ok((HistoryStamp { head, legacy }, messages))
    }

    /// Makes every write so far durable. sled's `flush` makes the log stable up to the
    /// highest position reserved when it starts (sled 0.34: `iobuf::flush` is
    /// `make_stable(max_reserved_lsn)`, and the stable position only advances over a
    /// contiguous prefix), so one flush covers every write that returned before it began,
    /// in every tree and every chat: a turn's commit flush covers the intake write of its
    /// input, whoever was still waiting for that. A flush may cover half of a step running
    /// at the same time; the step's record makes that whole again after a kill ([`Steps`]).
    fn flush_log(&self) -> Result<(), StoreError> {
        let _scope = StoreScope::enter();
        self.db.flush().map_err(sled_error)?;
        Ok(())
    }

    /// Every logged message of `session`, with its key, oldest first.
    fn read_log(&self, session: &str) -> Result<LogRead, StoreError> {
        self.messages
            .scan_prefix(session_prefix(session))
            .map(|entry| {
                let (key, bytes) = entry.map_err(sled_error)?;
                let message = decode(&bytes, || {
                    format!("messages[{session}/{}]", describe_seq(&key))
                })?;
                Ok((key, message))
            })
            .collect()
    }

    /// `base` and the trees of the collections `also` writes to, each once, with the index
    /// (into the list) of each write's tree, for one step over all of them.
    fn with_kv_trees(
        &self,
        mut trees: Vec<Tree>,
        also: &[KvWrite],
    ) -> Result<(Vec<Tree>, Vec<usize>), StoreError> {
        let mut index = Vec::with_capacity(also.len());
        for write in also {
            let tree = self.kv_tree(&write.space)?;
            let at = match trees.iter().position(|t| t.name() == tree.name()) {
                Some(at) => at,
                None => {
                    trees.push(tree);
                    trees.len() - 1
                }
            };
            index.push(at);
        }
        Ok((trees, index))
    }
}

/// Inside a step over [`SledStore::with_kv_trees`]' list: applies `also`.
fn apply_kv(
    t: &[StepTree<'_>],
    also: &[KvWrite],
    index: &[usize],
) -> Result<(), ConflictableTransactionError<StoreError>> {
    for (write, &at) in also.iter().zip(index) {
        if let Some(expected) = &write.if_unchanged {
            let current = t[at].get(write.key.as_bytes())?;
            if current.as_deref() != expected.as_deref().map(str::as_bytes) {
                return Err(ConflictableTransactionError::Abort(write.changed()));
            }
        }
    }
    for (write, &at) in also.iter().zip(index) {
        match &write.value {
            Some(v) => t[at].insert(write.key.as_bytes(), v.as_bytes())?,
            None => t[at].delete(write.key.as_bytes())?,
        };
    }
    Ok(())
}

impl SledStore {
    /// Moves an unsent reply to the done records, changed by `finish`, and records `own` in
    /// its chat's log, in one step; then prunes records done more than [`SENT_KEEP_DAYS`]
    /// ago (oldest ids first).
    fn finish_outbox(
        &self,
        outbox_id: u64,
        finish: impl Fn(&mut OutboxEntry),
        own: Option<&OwnRecord<'_>>,
    ) -> Result<(), StoreError> {
        let key = outbox_id.to_be_bytes();
        let trees = [
            &self.outbox,
            &self.outbox_done,
            &self.messages,
            &self.message_ids,
            &self.message_heads,
        ];
        self.steps.run(&trees[..], |t| {
            let (outbox, done) = (&t[0], &t[1]);
            let Some(bytes) = outbox.get(key)? else {
                return Ok(());
            };
            let mut entry: OutboxEntry = decode(&bytes, || format!("outbox[{outbox_id}]"))
                .map_err(ConflictableTransactionError::Abort)?;
            finish(&mut entry);
            entry.done_at = Some(self.wall.now());
            // Done before it leaves the outbox: a reader in between sees it in both.
            done.insert(key, encode_abort(&entry)?)?;
            outbox.delete(key)?;
            if let Some(own) = own {
                let log = ChatLogTx {
                    log: &t[2],
                    ids: &t[3],
                    heads: &t[4],
                    bound: self.bound,
                };
                log.record(own.session, &own.id_key, &own.value)?;
            }
            Ok(())
        })?;
        self.prune_done()
    }

    /// Removes done replies older than [`SENT_KEEP_DAYS`], [`PRUNE_AT_ONCE`] at a time, oldest ids first
    /// (ids grow with time). Between looks it only compares the clock with `prune_due`: a
    /// turn's `mark_sent` would otherwise read and parse the oldest record every time.
    fn prune_done(&self) -> Result<(), StoreError> {
        let now = self.wall.now();
        if now.timestamp() < self.prune_due.load(Ordering::Relaxed) {
            return Ok(());
        }
        let keep = chrono::Duration::days(SENT_KEEP_DAYS);
        let cutoff = now - keep;
        // Nothing left to prune: the next candidate is a reply done from now on.
        let mut due = (now + keep).timestamp();
        let mut removed = 0;
        for entry in self.outbox_done.iter() {
            let (key, bytes) = entry.map_err(sled_error)?;
            let done_at = serde_json::from_slice::<DoneAt>(&bytes)
                .ok()
                .and_then(|record| record.done_at);
            match done_at {
                Some(done_at) if done_at >= cutoff => {
                    due = (done_at + keep).timestamp();
                    break;
                }
                // Old, or a record without a readable time: it goes.
                _ if removed < PRUNE_AT_ONCE => {
                    self.outbox_done.remove(key).map_err(sled_error)?;
                    removed += 1;
                }
                // More than one call's share: the next call looks again.
                _ => {
                    due = 0;
                    break;
                }
            }
        }
        self.prune_due.store(due, Ordering::Relaxed);
        Ok(())
    }

    /// The tree of a toolset collection, opened at its first use and kept.
    fn kv_tree(&self, space: &str) -> Result<Tree, StoreError> {
        // A poisoned lock only means a panic while inserting a `Tree`; the map is sound.
        if let Some(tree) = self
            .kv_trees
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(space)
        {
            return Ok(tree.clone());
        }
        if space.is_empty() || space.contains('\0') {
            return Err(StoreError::Io(format!("invalid collection name {space:?}")));
        }
        let tree = self
            .db
            .open_tree(format!("kv/{space}"))
            .map_err(sled_error)?;
        self.kv_trees
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(space.to_owned(), tree.clone());
        Ok(tree)
    }
}

/// How many old done replies one `mark_sent` removes at the most: a few keep it cheap.
const PRUNE_AT_ONCE: usize = 8;

/// The one field of a done reply that pruning reads.
#[derive(serde::Deserialize)]
struct DoneAt {
    #[serde(default)]
    done_at: Option<chrono::DateTime<chrono::Utc>>,
}

fn kv_text(bytes: &[u8], space: &str, key: &str) -> Result<String, StoreError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| StoreError::Corrupt {
        key: format!("{space}[{key}]"),
        reason: "not UTF-8".to_owned(),
    })
}

/// Where the message log of a session stands: messages `first..next` are recorded.
#[derive(Debug, Default, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct Head {
    first: u64,
    next: u64,
}

/// A dedupe index entry: the seq of the message with this id.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SeqRecord {
    seq: u64,
}

/// A history in the format of earlier releases: the whole of it in one value.
#[derive(serde::Deserialize)]
struct HistoryRecord {
    messages: Vec<Message>,
}

/// The raw values a history was read from: a migration moves it only if they are unchanged
/// inside its step.
#[derive(Debug, PartialEq)]
struct HistoryStamp {
    head: Option<IVec>,
    legacy: Option<IVec>,
}

impl HistoryStamp {
    fn exists(&self) -> bool {
        self.head.is_some() || self.legacy.is_some()
    }
}

/// Each message as its `history_messages` value.
fn encode_history(messages: &[Message]) -> Result<Vec<Vec<u8>>, StoreError> {
    messages.iter().map(encode_turn).collect()
}

type TxResult<T> = Result<T, ConflictableTransactionError<StoreError>>;

/// The bot's own message for [`SledStore::finish_outbox`], encoded before its step.
struct OwnRecord<'a> {
    session: &'a str,
    id_key: Vec<u8>,
    value: Vec<u8>,
}

/// The trees of the chat log inside a step: the messages of each session under dense
/// sequence numbers (`first..next` of its head, at most `bound` of them) and the index of
/// their platform ids.
struct ChatLogTx<'a> {
    log: &'a StepTree<'a>,
    ids: &'a StepTree<'a>,
    heads: &'a StepTree<'a>,
    bound: u64,
}

impl ChatLogTx<'_> {
    /// Appends the encoded message `value` (whose id's index key is `id_key`), dropping the
    /// oldest past the bound; `false`, and nothing written, when the id is already recorded.
    fn record(&self, session: &str, id_key: &[u8], value: &[u8]) -> TxResult<bool> {
        if self.ids.get(id_key)?.is_some() {
            return Ok(false);
        }
        let mut head: Head = match self.heads.get(session)? {
            Some(bytes) => decode(&bytes, || format!("message_heads[{session}]"))
                .map_err(ConflictableTransactionError::Abort)?,
            None => Head::default(),
        };
        let seq = head.next;
        self.log.insert(message_key(session, seq), value)?;
        self.ids.insert(id_key, encode_abort(&SeqRecord { seq })?)?;
        head.next = seq.saturating_add(1);
        while head.next.saturating_sub(head.first) > self.bound {
            drop_oldest(session, head.first, self.log, self.ids)?;
            head.first += 1;
        }
        self.heads.insert(session, encode_abort(&head)?)?;
        Ok(true)
    }
}

/// The trees of a history inside a step. Keeps `history_messages` of a session dense
/// (`first..next` of its head) and the head absent when the history is empty.
struct HistoryTx<'a> {
    legacy: &'a StepTree<'a>,
    heads: &'a StepTree<'a>,
    log: &'a StepTree<'a>,
}

impl HistoryTx<'_> {
    /// What [`SledStore::read_history`] would stamp, read inside the step.
    fn stamp(&self, session: &str) -> TxResult<HistoryStamp> {
        Ok(HistoryStamp {
            head: self.heads.get(session)?,
            legacy: self.legacy.get(session)?,
        })
    }

    /// The head of the session's history; one in the old format is first written out as
    /// messages (and its record removed).
    fn head(&self, session: &str) -> TxResult<Head> {
        if let Some(bytes) = self.heads.get(session)? {
            return decode(&bytes, || format!("history_heads[{session}]"))
                .map_err(ConflictableTransactionError::Abort);
        }
        let mut head = Head::default();
        if let Some(bytes) = self.legacy.remove(session)? {
            let record: HistoryRecord = decode(&bytes, || format!("history[{session}]"))
                .map_err(ConflictableTransactionError::Abort)?;
            for message in &record.messages {
                self.log.insert(
                    message_key(session, head.next),
                    encode_turn(message).map_err(ConflictableTransactionError::Abort)?,
                )?;
                head.next += 1;
            }
        }
        Ok(head)
    }

    /// Drops the `dropped` oldest messages, then appends `values`.
    fn append(&self, session: &str, dropped: u64, values: &[Vec<u8>]) -> TxResult<()> {
        let mut head = self.head(session)?;
        let keep_from = head.first.saturating_add(dropped).min(head.next);
        for seq in head.first..keep_from {
            self.log.delete(message_key(session, seq))?;
        }
        head.first = keep_from;
        for value in values {
            self.log
                .insert(message_key(session, head.next), value.as_slice())?;
            head.next += 1;
        }
        self.set_head(session, head)
    }

    /// Replaces the whole history by `values`.
    fn replace(&self, session: &str, values: &[Vec<u8>]) -> TxResult<()> {
        self.legacy.delete(session)?;
        if let Some(bytes) = self.heads.get(session)? {
            let old: Head = decode(&bytes, || format!("history_heads[{session}]"))
                .map_err(ConflictableTransactionError::Abort)?;
            for seq in old.first..old.next {
                self.log.delete(message_key(session, seq))?;
            }
        }
        let mut head = Head::default();
        for value in values {
            self.log
                .insert(message_key(session, head.next), value.as_slice())?;
            head.next += 1;
        }
        self.set_head(session, head)
    }

    fn set_head(&self, session: &str, head: Head) -> TxResult<()> {
        if head.first == head.next {
            self.heads.delete(session)?;
        } else {
            self.heads.insert(session, encode_abort(&head)?)?;
        }
        Ok(())
    }
}

#[derive(serde::Deserialize)]
struct MetaRecord {
    value: String,
}

#[derive(serde::Serialize)]
struct MetaRef<'a> {
    value: &'a str,
}

/// Inside the `record_message` step: drops message `seq` from the log and, when the
/// dedupe entry of its id points at it, from the index. A log value too damaged to name its
/// id is dropped all the same (its index entry, if any, stays behind), so that one bad
/// value cannot stop a chat from being recorded.
fn drop_oldest(
    session: &str,
    seq: u64,
    log: &StepTree<'_>,
    ids: &StepTree<'_>,
) -> Result<(), ConflictableTransactionError<StoreError>> {
    let Some(old) = log.remove(message_key(session, seq))? else {
        return Ok(());
    };
    let message_id = serde_json::from_slice::<Value>(&old)
        .ok()
        .and_then(|v| v.get("message_id")?.as_str().map(str::to_owned));
    let Some(message_id) = message_id else {
        tracing::warn!(session, seq, "dropped an unreadable message from the log");
        return Ok(());
    };
    let key = message_id_key(session, &message_id);
    if let Some(bytes) = ids.get(&key)? {
        let points_here = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v.get("seq")?.as_u64())
            .is_none_or(|s| s == seq);
        if points_here {
            ids.delete(key)?;
        }
    }
    Ok(())
}

/// Every value of an id-keyed tree, in key (= id) order.
fn read_all<T: DeserializeOwned>(tree: &Tree, name: &str) -> Result<Vec<T>, StoreError> {
    tree.iter()
        .map(|entry| {
            let (key, bytes) = entry.map_err(sled_error)?;
            decode(&bytes, || format!("{name}[{}]", describe_id(&key)))
        })
        .collect()
}

fn session_prefix(session: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(session.len() + 9);
    key.extend_from_slice(session.as_bytes());
    key.push(0);
    key
}

fn message_key(session: &str, seq: u64) -> Vec<u8> {
    let mut key = session_prefix(session);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

fn message_id_key(session: &str, message_id: &str) -> Vec<u8> {
    let mut key = session_prefix(session);
    key.extend_from_slice(message_id.as_bytes());
    key
}

/// The seq part of a `messages` key (its last 8 bytes), for error messages.
fn describe_seq(key: &IVec) -> String {
    key.len()
        .checked_sub(8)
        .and_then(|start| <[u8; 8]>::try_from(&key[start..]).ok())
        .map(|bytes| u64::from_be_bytes(bytes).to_string())
        .unwrap_or_else(|| format!("{key:?}"))
}

/// A big-endian u64 key, for error messages.
fn describe_id(key: &IVec) -> String {
    match <[u8; 8]>::try_from(key.as_ref()) {
        Ok(bytes) => u64::from_be_bytes(bytes).to_string(),
        Err(_) => format!("{key:?}"),
    }
}

fn encode_abort<T: Serialize + ?Sized>(
    value: &T,
) -> Result<Vec<u8>, ConflictableTransactionError<StoreError>> {
    encode(value).map_err(ConflictableTransactionError::Abort)
}

pub(super) fn sled_error(e: sled::Error) -> StoreError {
    match e {
        sled::Error::Corruption { at, .. } => StoreError::Corrupt {
            key: "<database>".to_owned(),
            reason: format!("sled reports corruption at {at:?}"),
        },
        other => StoreError::Io(other.to_string()),
    }
}

/// Maps an error of `Config::open` / `open_tree`, recognizing sled's lock failure
/// ("could not acquire lock on ...", an `io::Error` of kind `Other` wrapping `WouldBlock`).
fn open_error(dir: &Path, e: sled::Error) -> StoreError {
    if let sled::Error::Io(io) = &e {
        let text = io.to_string();
        if io.kind() == std::io::ErrorKind::WouldBlock || text.contains("could not acquire lock") {
            return StoreError::Locked(dir.display().to_string());
        }
    }
    StoreError::Io(format!(
        "cannot open the database in {}: {e}",
        dir.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_reply as reply;

    /// A reply done `days` ago, written as `finish_outbox` leaves it; its id.
    fn seed_done(store: &SledStore, days: i64) -> u64 {
        let id = store.reserve_id().expect("id");
        let entry = OutboxEntry {
            id,
            done_at: Some(chrono::Utc::now() - chrono::Duration::days(days)),
            ..reply("old")
        };
        store
            .outbox_done
            .insert(id.to_be_bytes(), encode(&entry).expect("encode"))
            .expect("insert");
        id
    }

    fn done_ids(store: &SledStore) -> Vec<u64> {
        store
            .outbox_done
            .iter()
            .keys()
            .map(|k| u64::from_be_bytes(k.expect("key").as_ref().try_into().expect("id")))
            .collect()
    }

    fn send(store: &SledStore, text: &str) -> u64 {
        let id = store
            .queue_outbox_with(reply(text), Vec::new())
            .expect("queue");
        store.mark_sent(id, &[format!("m-{text}")]).expect("sent");
        id
    }

    #[test]
    fn sent_replies_past_the_keep_days_are_pruned_a_few_at_a_time_and_not_looked_at_between() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SledStore::open(&dir.path().join("db"), StoreOptions::default()).expect("open");
        let old: Vec<u64> = (0..10)
            .map(|_| seed_done(&store, SENT_KEEP_DAYS + 1))
            .collect();
        let recent = seed_done(&store, SENT_KEEP_DAYS - 1);

        let first = send(&store, "a");
        // One call's share of the old ones went; the rest wait for the next call.
        assert_eq!(done_ids(&store), [old[8], old[9], recent, first]);
        assert_eq!(store.prune_due.load(Ordering::Relaxed), 0);

        let second = send(&store, "b");
        assert_eq!(done_ids(&store), [recent, first, second]);
        // The next look is due when the oldest left (done SENT_KEEP_DAYS - 1 days ago) is old.
        let due = store.prune_due.load(Ordering::Relaxed);
        let expected = (chrono::Utc::now() + chrono::Duration::days(1)).timestamp();
        assert!(
            (due - expected).abs() <= 5,
            "due {due}, expected about {expected}"
        );

        // Until then nothing reads the done replies: an old one at the front stays.
        let stale = OutboxEntry {
            id: old[0],
            done_at: Some(chrono::Utc::now() - chrono::Duration::days(SENT_KEEP_DAYS + 1)),
            ..reply("stale")
        };
        store
            .outbox_done
            .insert(old[0].to_be_bytes(), encode(&stale).expect("encode"))
            .expect("insert");
        let third = send(&store, "c");
        assert_eq!(done_ids(&store), [old[0], recent, first, second, third]);

        // Once due, the look happens again (and stops at the first recent one).
        store.prune_due.store(0, Ordering::Relaxed);
        let fourth = send(&store, "d");
        assert_eq!(done_ids(&store), [recent, first, second, third, fourth]);
    }
}
