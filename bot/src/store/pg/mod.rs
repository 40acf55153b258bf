//! [`PgStore`]: the [`Store`] on PostgreSQL, for a daemon whose state lives on a database
//! server rather than under its `data_dir`.
//!
//! ## Layout
//! The tables are in `bot/migrations/postgres/` (applied at open, `schema.rs`). Rows are
//! found by real columns (session, seq, id, key); the values are the versioned JSON the sled
//! store writes (`common.rs`), as text, read back by the same decoder.
//!
//! ## Transactions
//! Every method is one transaction at READ COMMITTED, the server's default, with row locks
//! where a step reads before it writes: a session's log and history each have a head row
//! (`parlor_message_heads`, `parlor_history_heads`) that every write to them locks first,
//! so two writers of one chat take turns and writers of different chats never wait on each
//! other. A conditional toolset write ([`KvWrite::if_unchanged`]) locks its row (or, for
//! "still absent", inserts a placeholder that a concurrent insert would wait on) before it
//! compares. SERIALIZABLE would need no such locks, but would refuse and retry writers of
//! different chats whose index ranges happen to touch; the locks say exactly what must not
//! interleave. A deadlock between two multi-row writers is retried (`pool.rs`).
//!
//! Ids of pending inputs and replies come from the sequence `parlor_ids`: increasing and
//! never handed out twice, even by a transaction that rolled back.
//!
//! ## Durability
//! A transaction is durable once its COMMIT returned (with the server's default
//! `synchronous_commit`), so [`Store::durable`] and [`Store::flush`] have nothing left to
//! wait for.
//!
//! ## Threads
//! `postgres::Client` cannot be used from a tokio thread; every call runs on one of a few
//! connection threads (`pool.rs`).

mod pool;
mod schema;

use std::sync::Arc;

use futures::future::BoxFuture;
use postgres::Config;

use self::pool::{Db, Pool, TxError, TxResult};
use super::common::{
    StoreOptions, check_session, decode, decode_history_entry, encode, encode_turn, is_pending_for,
    migrated_record,
};
use super::{
    ChatRecord, Edited, HistoryChange, Inbound, Intake, KvWrite, OutboxEntry, PendingItem,
    SENT_KEEP_DAYS, Store, StoreError, StoredMessage, Summary, TurnCommit, merged_summaries,
    migrated_key, moved_message, moved_outbox, moved_pending,
};
use crate::llm::Message;
use crate::platform::ChatRef;
use crate::time::WallTime;

/// How many done replies one `mark_sent` prunes at most: the old ones go a few at a time,
/// so no single send pays for a week of them.
const PRUNE_AT_ONCE: i64 = 16;

/// The [`Store`] on a PostgreSQL database (see the module docs). Clones share the
/// connections.
#[derive(Clone, Debug)]
pub struct PgStore {
    pool: Arc<Pool>,
    /// How many messages the log of one session keeps.
    bound: i64,
    /// Where a done reply's `done_at`, the prune cutoff and a migrated chat's `since` are
    /// read ([`StoreOptions::wall`]).
    wall: WallTime,
}

impl PgStore {
    /// Connects to the database at `url` (a `postgres://` URL or `key=value` string) and
    /// brings its schema up to date. Fails with [`StoreError::Io`] when the URL cannot be
    /// read, the server cannot be reached or refuses, or the schema is newer than this
    /// parlor. The message names the server and database, never the password.
    ///
    /// Every statement is bounded by `statement_timeout`, and connecting by
    /// `connect_timeout`; both are set here unless the URL sets its own.
    pub fn open(url: &str, options: StoreOptions) -> Result<PgStore, StoreError> {
        let mut config = parse_url(url)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(pool::CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("parlor");
        }
        // A dead peer fails a call after this long instead of when TCP gives up.
        config.tcp_user_timeout(pool::STATEMENT_TIMEOUT);
        config.keepalives(true);
        let timeouts = format!(
            "-c statement_timeout={ms} -c idle_in_transaction_session_timeout={ms}",
            ms = pool::STATEMENT_TIMEOUT.as_millis()
        );
        let server_options = match config.get_options() {
            // The URL's own options come last, so they win.
            Some(own) => format!("{timeouts} {own}"),
            None => timeouts,
        };
        config.options(&server_options);
        let pool = Arc::new(Pool::start(config, pool::CONNECTIONS)?);
        let applied = schema::migrate(&pool)?;
        tracing::debug!(server = pool.server(), applied, "PostgreSQL store opened");
        Ok(PgStore {
            pool,
            bound: i64::try_from(options.bound()).unwrap_or(i64::MAX),
            wall: options.wall,
        })
    }

    /// The server and database, as `host:port/dbname`.
    pub fn server(&self) -> &str {
        self.pool.server()
    }

    /// The server and database a URL names, as `host:port/dbname` (never its password),
    /// without connecting: what `parlor check-config` shows.
    pub fn describe_url(url: &str) -> Result<String, StoreError> {
        Ok(pool::describe_server(&parse_url(url)?))
    }
}

fn parse_url(url: &str) -> Result<Config, StoreError> {
    url.parse().map_err(|e: postgres::Error| {
        // The parser's message names the option it did not understand, not the value.
        StoreError::Io(format!("the PostgreSQL URL cannot be read: {e}"))
    })
}

impl Store for PgStore {
    fn record_inbound(
        &self,
        session: &str,
        message: &StoredMessage,
        intake: Intake,
    ) -> Result<Inbound, StoreError> {
        check_session(session)?;
        let session = session.to_owned();
        let message_id = message.message_id.clone();
        let value = text(encode(message)?)?;
        let bound = self.bound;
        self.pool.write(move |db| {
            if !record_log(db, &session, &message_id, &value, bound)? {
                return Ok(Inbound::Duplicate);
            }
            Ok(Inbound::Recorded(match intake.clone() {
                Intake::Record => None,
                Intake::Pending(item) => Some(insert_pending(db, item)?),
                Intake::Reply(entry) => Some(insert_outbox(db, entry)?),
            }))
        })
    }

    fn get_message(
        &self,
        session: &str,
        message_id: &str,
    ) -> Result<Option<StoredMessage>, StoreError> {
        check_session(session)?;
        let (session, message_id) = (session.to_owned(), message_id.to_owned());
        self.pool.read(move |db| {
            let row = db.query_opt(
                "SELECT value FROM parlor_messages WHERE session = $1 AND message_id = $2",
                &[&session, &message_id],
            )?;
            row.map(|row| {
                read(&row.get::<_, String>(0), || {
                    format!("parlor_messages[{session}/{message_id}]")
                })
            })
            .transpose()
        })
    }

    fn recent_messages(
        &self,
        session: &str,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        check_session(session)?;
        let session = session.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.pool.read(move |db| {
            db.query(
                "SELECT seq, value FROM (SELECT seq, value FROM parlor_messages
                     WHERE session = $1 ORDER BY seq DESC LIMIT $2) AS last
                 ORDER BY seq",
                &[&session, &limit],
            )?
            .iter()
            .map(|row| {
                let seq: i64 = row.get(0);
                read(&row.get::<_, String>(1), || {
                    format!("parlor_messages[{session}/{seq}]")
                })
            })
            .collect()
        })
    }

    fn load_history(&self, session: &str) -> Result<Vec<Message>, StoreError> {
        check_session(session)?;
        let session = session.to_owned();
        self.pool.read(move |db| read_history(db, &session))
    }

    fn save_history(&self, session: &str, history: &[Message]) -> Result<(), StoreError> {
        check_session(session)?;
        let session = session.to_owned();
        let values = encode_history(history)?;
        self.pool
            .write(move |db| replace_history(db, &session, &values))
    }

    fn load_summary(&self, session: &str) -> Result<Option<Summary>, StoreError> {
        check_session(session)?;
        let session = session.to_owned();
        self.pool.read(move |db| {
            let row = db.query_opt(
                "SELECT value FROM parlor_summaries WHERE session = $1",
                &[&session],
            )?;
            row.map(|row| {
                read(&row.get::<_, String>(0), || {
                    format!("parlor_summaries[{session}]")
                })
            })
            .transpose()
        })
    }

    fn add_pending_with(&self, item: PendingItem, also: Vec<KvWrite>) -> Result<u64, StoreError> {
        check_session(&item.session)?;
        check_spaces(&also)?;
        self.pool.write(move |db| {
            check_kv(db, &also)?;
            let id = insert_pending(db, item.clone())?;
            apply_kv(db, &also)?;
            Ok(id)
        })
    }

    fn pending(&self) -> Result<Vec<PendingItem>, StoreError> {
        self.pool.read(|db| {
            db.query("SELECT id, value FROM parlor_pending ORDER BY id", &[])?
                .iter()
                .map(|row| {
                    let id: i64 = row.get(0);
                    read(&row.get::<_, String>(1), || format!("parlor_pending[{id}]"))
                })
                .collect()
        })
    }

    fn remove_pending(&self, ids: &[u64]) -> Result<(), StoreError> {
        let ids = db_ids(ids);
        self.pool.write(move |db| {
            db.execute("DELETE FROM parlor_pending WHERE id = ANY($1)", &[&ids])?;
            Ok(())
        })
    }

    fn commit_turn(&self, commit: TurnCommit) -> Result<Option<u64>, StoreError> {
        check_session(&commit.session)?;
        check_spaces(&commit.also)?;
        // Encoded before the transaction, which holds the session's locks.
        let history = match &commit.history {
            Some(HistoryChange::Append { dropped, messages }) => Some((
                Some(i64::try_from(*dropped).unwrap_or(i64::MAX)),
                encode_history(messages)?,
            )),
            Some(HistoryChange::Replace(messages)) => Some((None, encode_history(messages)?)),
            None => None,
        };
        let summary = commit
            .summary
            .as_ref()
            .map(encode)
            .transpose()?
            .map(text)
            .transpose()?;
        let TurnCommit {
            session,
            answered,
            reply,
            also,
            ..
        } = commit;
        let answered = db_ids(&answered);
        self.pool.write(move |db| {
            check_kv(db, &also)?;
            match &history {
                Some((Some(dropped), values)) => append_history(db, &session, *dropped, values)?,
                Some((None, values)) => {
                    replace_history(db, &session, values)?;
                    db.execute(
                        "DELETE FROM parlor_summaries WHERE session = $1",
                        &[&session],
                    )?;
                }
                None => {}
            }
            if let Some(value) = &summary {
                db.execute(
                    "INSERT INTO parlor_summaries (session, value) VALUES ($1, $2)
                     ON CONFLICT (session) DO UPDATE SET value = EXCLUDED.value",
                    &[&session, value],
                )?;
            }
            if !answered.is_empty() {
                db.execute(
                    "DELETE FROM parlor_pending WHERE id = ANY($1)",
                    &[&answered],
                )?;
            }
            let id = reply
                .clone()
                .map(|entry| insert_outbox(db, entry))
                .transpose()?;
            apply_kv(db, &also)?;
            Ok(id)
        })
    }

    fn reserve_id(&self) -> Result<u64, StoreError> {
        self.pool.read(next_id)
    }

    fn queue_outbox_with(&self, entry: OutboxEntry, also: Vec<KvWrite>) -> Result<u64, StoreError> {
        check_session(&entry.session)?;
        check_spaces(&also)?;
        self.pool.write(move |db| {
            check_kv(db, &also)?;
            let id = insert_outbox(db, entry.clone())?;
            apply_kv(db, &also)?;
            Ok(id)
        })
    }

    fn unsent_outbox(&self) -> Result<Vec<OutboxEntry>, StoreError> {
        self.pool.read(|db| {
            db.query("SELECT id, value FROM parlor_outbox ORDER BY id", &[])?
                .iter()
                .map(|row| {
                    let id: i64 = row.get(0);
                    read(&row.get::<_, String>(1), || format!("parlor_outbox[{id}]"))
                })
                .collect()
        })
    }

    fn mark_sent(&self, outbox_id: u64, platform_ids: &[String]) -> Result<(), StoreError> {
        let ids = platform_ids.to_vec();
        self.finish_outbox(outbox_id, move |entry| entry.sent_ids = ids.clone(), None)
    }

    fn mark_sent_with_own(
        &self,
        outbox_id: u64,
        platform_ids: &[String],
        session: &str,
        own: Option<&StoredMessage>,
    ) -> Result<(), StoreError> {
        let own = match own {
            Some(message) => {
                check_session(session)?;
                Some(OwnRecord {
                    session: session.to_owned(),
                    message_id: message.message_id.clone(),
                    value: text(encode(message)?)?,
                })
            }
            None => None,
        };
        let ids = platform_ids.to_vec();
        self.finish_outbox(outbox_id, move |entry| entry.sent_ids = ids.clone(), own)
    }

    fn record_sent_parts(&self, outbox_id: u64, platform_ids: &[String]) -> Result<(), StoreError> {
        let id = db_id(outbox_id);
        let ids = platform_ids.to_vec();
        self.pool.write(move |db| {
            let Some(row) = db.query_opt(
                "SELECT value FROM parlor_outbox WHERE id = $1 FOR UPDATE",
                &[&id],
            )?
            else {
                return Ok(());
            };
            let mut entry: OutboxEntry =
                read(&row.get::<_, String>(0), || format!("parlor_outbox[{id}]"))?;
            entry.sent_ids = ids.clone();
            db.execute(
                "UPDATE parlor_outbox SET value = $2 WHERE id = $1",
                &[&id, &text(encode(&entry)?)?],
            )?;
            Ok(())
        })
    }

    fn mark_failed(&self, outbox_id: u64, reason: &str) -> Result<(), StoreError> {
        let reason = reason.to_owned();
        self.finish_outbox(
            outbox_id,
            move |entry| entry.failed = Some(reason.clone()),
            None,
        )
    }

    fn sent_reply(&self, outbox_id: u64) -> Result<Option<OutboxEntry>, StoreError> {
        let id = db_id(outbox_id);
        self.pool.read(move |db| {
            db.query_opt("SELECT value FROM parlor_outbox_done WHERE id = $1", &[&id])?
                .map(|row| {
                    read(&row.get::<_, String>(0), || {
                        format!("parlor_outbox_done[{id}]")
                    })
                })
                .transpose()
        })
    }

    fn get_meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        let key = key.to_owned();
        self.pool.read(move |db| get_meta(db, &key))
    }

    fn set_meta(&self, key: &str, value: &str) -> Result<(), StoreError> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.pool.write(move |db| {
            db.execute(
                "INSERT INTO parlor_meta (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                &[&key, &value],
            )?;
            Ok(())
        })
    }

    fn kv_get(&self, space: &str, key: &str) -> Result<Option<String>, StoreError> {
        check_space(space)?;
        let (space, key) = (space.to_owned(), key.to_owned());
        self.pool.read(move |db| {
            Ok(db
                .query_opt(
                    "SELECT value FROM parlor_kv WHERE space = $1 AND key = $2",
                    &[&space, &key],
                )?
                .map(|row| row.get(0)))
        })
    }

    fn kv_put(&self, space: &str, key: &str, value: &str) -> Result<(), StoreError> {
        self.kv_write(vec![KvWrite {
            space: space.to_owned(),
            key: key.to_owned(),
            value: Some(value.to_owned()),
            if_unchanged: None,
        }])
    }

    fn kv_delete(&self, space: &str, key: &str) -> Result<bool, StoreError> {
        check_space(space)?;
        let (space, key) = (space.to_owned(), key.to_owned());
        self.pool.write(move |db| {
            Ok(db.execute(
                "DELETE FROM parlor_kv WHERE space = $1 AND key = $2",
                &[&space, &key],
            )? > 0)
        })
    }

    fn kv_write(&self, writes: Vec<KvWrite>) -> Result<(), StoreError> {
        if writes.is_empty() {
            return Ok(());
        }
        check_spaces(&writes)?;
        self.pool.write(move |db| {
            check_kv(db, &writes)?;
            apply_kv(db, &writes)
        })
    }

    fn kv_scan(&self, space: &str, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
        check_space(space)?;
        let (space, prefix) = (space.to_owned(), prefix.to_owned());
        self.pool.read(move |db| {
            // `key >= prefix` lets the primary key's index find the start; `starts_with`
            // ends the range. Keys are COLLATE "C": byte order, as sled's.
            Ok(db
                .query(
                    "SELECT key, value FROM parlor_kv
                     WHERE space = $1 AND key >= $2 AND starts_with(key, $2)
                     ORDER BY key",
                    &[&space, &prefix],
                )?
                .iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect())
        })
    }

    fn chat_status(&self, session: &str) -> Result<Option<ChatRecord>, StoreError> {
        let session = session.to_owned();
        self.pool.read(move |db| {
            db.query_opt(
                "SELECT value FROM parlor_chats WHERE session = $1",
                &[&session],
            )?
            .map(|row| {
                read(&row.get::<_, String>(0), || {
                    format!("parlor_chats[{session}]")
                })
            })
            .transpose()
        })
    }

    fn set_chat_status(
        &self,
        record: &ChatRecord,
        also: Vec<KvWrite>,
        notices: Vec<OutboxEntry>,
    ) -> Result<Vec<u64>, StoreError> {
        let session = record.chat.session_key();
        check_session(&session)?;
        check_spaces(&also)?;
        let value = text(encode(record)?)?;
        self.pool.write(move |db| {
            check_kv(db, &also)?;
            put_chat(db, &session, &value)?;
            let ids = notices
                .iter()
                .map(|entry| insert_outbox(db, entry.clone()))
                .collect::<TxResult<Vec<u64>>>()?;
            apply_kv(db, &also)?;
            Ok(ids)
        })
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
        check_spaces(&also)?;
        let (from, to) = (from.clone(), to.clone());
        let bound = self.bound;
        let wall = self.wall.clone();
        self.pool.write(move |db| {
            let moving = Migration {
                from: &from,
                to: &to,
                old: &old,
                new: &new,
                bound,
            };
            moving.run(db, &also, &wall)
        })
    }

    fn migrated_to(&self, session: &str) -> Result<Option<String>, StoreError> {
        let key = migrated_key(session);
        self.pool.read(move |db| get_meta(db, &key))
    }

    fn edit_message(
        &self,
        session: &str,
        message: &StoredMessage,
        pending_text: Option<&str>,
    ) -> Result<Edited, StoreError> {
        check_session(session)?;
        let session = session.to_owned();
        let message = message.clone();
        let value = text(encode(&message)?)?;
        let pending_text = pending_text.map(str::to_owned);
        self.pool.write(move |db| {
            let changed = db.execute(
                "UPDATE parlor_messages SET value = $3 WHERE session = $1 AND message_id = $2",
                &[&session, &message.message_id, &value],
            )?;
            if changed == 0 {
                return Ok(Edited::Unknown);
            }
            let Some(new_text) = &pending_text else {
                return Ok(Edited::Logged);
            };
            let rows = db.query(
                "SELECT id, value FROM parlor_pending WHERE session = $1 ORDER BY id FOR UPDATE",
                &[&session],
            )?;
            for row in rows {
                let id: i64 = row.get(0);
                let mut item: PendingItem =
                    read(&row.get::<_, String>(1), || format!("parlor_pending[{id}]"))?;
                if !is_pending_for(&item, &session, &message.message_id) {
                    continue;
                }
                item.text.clone_from(new_text);
                item.images.clone_from(&message.images);
                db.execute(
                    "UPDATE parlor_pending SET value = $2 WHERE id = $1",
                    &[&id, &text(encode(&item)?)?],
                )?;
                return Ok(Edited::Pending(item.id));
            }
            Ok(Edited::Logged)
        })
    }

    fn durable(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        // Every write returned after its COMMIT: it is durable already.
        Box::pin(async { Ok(()) })
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl PgStore {
    /// Moves an unsent reply to the done records, changed by `finish`, and records `own` in
    /// its chat's log, in one transaction; then prunes a few records done more than
    /// [`SENT_KEEP_DAYS`] ago, in the same one.
    fn finish_outbox(
        &self,
        outbox_id: u64,
        finish: impl Fn(&mut OutboxEntry) + Send + 'static,
        own: Option<OwnRecord>,
    ) -> Result<(), StoreError> {
        let id = db_id(outbox_id);
        let wall = self.wall.clone();
        let bound = self.bound;
        self.pool.write(move |db| {
            let Some(row) = db.query_opt(
                "DELETE FROM parlor_outbox WHERE id = $1 RETURNING value",
                &[&id],
            )?
            else {
                return Ok(());
            };
            let mut entry: OutboxEntry =
                read(&row.get::<_, String>(0), || format!("parlor_outbox[{id}]"))?;
            finish(&mut entry);
            let now = wall.now();
            entry.done_at = Some(now);
            db.execute(
                "INSERT INTO parlor_outbox_done (id, done_at, value) VALUES ($1, $2, $3)
                 ON CONFLICT (id) DO UPDATE SET done_at = EXCLUDED.done_at, value = EXCLUDED.value",
                &[&id, &now, &text(encode(&entry)?)?],
            )?;
            if let Some(own) = &own {
                record_log(db, &own.session, &own.message_id, &own.value, bound)?;
            }
            let cutoff = now - chrono::Duration::days(SENT_KEEP_DAYS);
            db.execute(
                "DELETE FROM parlor_outbox_done WHERE id IN (
                     SELECT id FROM parlor_outbox_done WHERE done_at < $1
                     ORDER BY done_at LIMIT $2)",
                &[&cutoff, &PRUNE_AT_ONCE],
            )?;
            Ok(())
        })
    }
}

/// The bot's own message for [`PgStore::finish_outbox`], encoded before its transaction.
struct OwnRecord {
    session: String,
    message_id: String,
    value: String,
}

/// What one [`Store::migrate_session`] moves.
struct Migration<'a> {
    from: &'a ChatRef,
    to: &'a ChatRef,
    old: &'a str,
    new: &'a str,
    bound: i64,
}

impl Migration<'_> {
    fn run<C: postgres::GenericClient>(
        &self,
        db: &mut Db<'_, C>,
        also: &[KvWrite],
        wall: &WallTime,
    ) -> TxResult<bool> {
        let (old, new) = (self.old, self.new);
        // The marker first: a second migration of the same chat waits on this row until
        // the first commits, then finds it and writes nothing.
        let marker = migrated_key(old);
        let fresh = db.execute(
            "INSERT INTO parlor_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
            &[&marker, &new],
        )?;
        if fresh == 0 {
            return Ok(false);
        }
        check_kv(db, also)?;
        self.move_log(db)?;
        // The history: the old chat's first; nothing moves without one.
        let old_history = read_history_values(db, old)?;
        if !old_history.is_empty() {
            let mut values = old_history;
            lock_history(db, new)?;
            values.extend(read_history_values(db, new)?);
            replace_history(db, old, &[])?;
            replace_history(db, new, &values)?;
        }
        let old_summary = take_summary(db, old)?;
        if old_summary.is_some() {
            let new_summary = take_summary(db, new)?;
            if let Some(summary) = merged_summaries(old_summary, new_summary) {
                db.execute(
                    "INSERT INTO parlor_summaries (session, value) VALUES ($1, $2)",
                    &[&new, &text(encode(&summary)?)?],
                )?;
            }
        }
        for row in db.query(
            "SELECT id, value FROM parlor_pending WHERE session = $1 ORDER BY id FOR UPDATE",
            &[&old],
        )? {
            let id: i64 = row.get(0);
            let item: PendingItem =
                read(&row.get::<_, String>(1), || format!("parlor_pending[{id}]"))?;
            let item = moved_pending(self.to, item);
            db.execute(
                "UPDATE parlor_pending SET session = $2, value = $3 WHERE id = $1",
                &[&id, &item.session, &text(encode(&item)?)?],
            )?;
        }
        for row in db.query(
            "SELECT id, value FROM parlor_outbox WHERE session = $1 ORDER BY id FOR UPDATE",
            &[&old],
        )? {
            let id: i64 = row.get(0);
            let entry: OutboxEntry =
                read(&row.get::<_, String>(1), || format!("parlor_outbox[{id}]"))?;
            let entry = moved_outbox(self.to, entry);
            db.execute(
                "UPDATE parlor_outbox SET session = $2, value = $3 WHERE id = $1",
                &[&id, &entry.session, &text(encode(&entry)?)?],
            )?;
        }
        let record = db
            .query_opt(
                "DELETE FROM parlor_chats WHERE session = $1 RETURNING value",
                &[&old],
            )?
            .map(|row| {
                read::<ChatRecord>(&row.get::<_, String>(0), || format!("parlor_chats[{old}]"))
            })
            .transpose()?;
        let record = migrated_record(self.to, record, wall.now());
        put_chat(db, new, &text(encode(&record)?)?)?;
        apply_kv(db, also)?;
        Ok(true)
    }

    /// The chat log, rebuilt under the new session from seq 0: the old chat's messages
    /// (renamed) before the new chat's, the oldest dropped past the bound.
    fn move_log<C: postgres::GenericClient>(&self, db: &mut Db<'_, C>) -> TxResult<()> {
        let (old, new) = (self.old, self.new);
        // Both heads locked, in one order whoever migrates, so that no intake of either
        // chat writes in between.
        let mut sessions = [old, new];
        sessions.sort_unstable();
        for session in sessions {
            lock_log(db, session)?;
        }
        let mut combined: Vec<StoredMessage> = Vec::new();
        for session in [old, new] {
            for row in db.query(
                "SELECT seq, value FROM parlor_messages WHERE session = $1 ORDER BY seq",
                &[&session],
            )? {
                let seq: i64 = row.get(0);
                let message: StoredMessage = read(&row.get::<_, String>(1), || {
                    format!("parlor_messages[{session}/{seq}]")
                })?;
                combined.push(match session == old {
                    true => moved_message(self.from, message),
                    false => message,
                });
            }
            db.execute(
                "DELETE FROM parlor_messages WHERE session = $1",
                &[&session],
            )?;
        }
        let excess = combined
            .len()
            .saturating_sub(usize::try_from(self.bound).unwrap_or(usize::MAX));
        combined.drain(..excess);
        for (seq, message) in (0_i64..).zip(&combined) {
            db.execute(
                "INSERT INTO parlor_messages (session, seq, message_id, value)
                 VALUES ($1, $2, $3, $4)",
                &[&new, &seq, &message.message_id, &text(encode(message)?)?],
            )?;
        }
        db.execute(
            "DELETE FROM parlor_message_heads WHERE session = $1",
            &[&old],
        )?;
        let next = i64::try_from(combined.len()).unwrap_or(i64::MAX);
        match next {
            0 => db.execute(
                "DELETE FROM parlor_message_heads WHERE session = $1",
                &[&new],
            )?,
            _ => db.execute(
                "UPDATE parlor_message_heads SET next = $2 WHERE session = $1",
                &[&new, &next],
            )?,
        };
        Ok(())
    }
}

/// Locks the head of a session's chat log (made if missing); returns its next seq.
fn lock_log<C: postgres::GenericClient>(db: &mut Db<'_, C>, session: &str) -> TxResult<i64> {
    // An upsert that changes nothing still locks the row, and makes it when absent, in one
    // round trip; a concurrent first writer of the same chat waits on the key.
    Ok(db
        .query_one(
            "INSERT INTO parlor_message_heads (session, next) VALUES ($1, 0)
             ON CONFLICT (session) DO UPDATE SET next = parlor_message_heads.next
             RETURNING next",
            &[&session],
        )?
        .get(0))
}

/// Appends a message to a session's log unless its id is recorded (`false` then, nothing
/// written), dropping the oldest past `bound`.
fn record_log<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    session: &str,
    message_id: &str,
    value: &str,
    bound: i64,
) -> TxResult<bool> {
    let seq = lock_log(db, session)?;
    let inserted = db.execute(
        "INSERT INTO parlor_messages (session, seq, message_id, value) VALUES ($1, $2, $3, $4)
         ON CONFLICT (session, message_id) DO NOTHING",
        &[&session, &seq, &message_id, &value],
    )?;
    if inserted == 0 {
        return Ok(false);
    }
    let next = seq.saturating_add(1);
    db.execute(
        "UPDATE parlor_message_heads SET next = $2 WHERE session = $1",
        &[&session, &next],
    )?;
    // Seqs are dense, so the messages past the bound are those below `next - bound`.
    let keep_from = next.saturating_sub(bound);
    if keep_from > 0 {
        db.execute(
            "DELETE FROM parlor_messages WHERE session = $1 AND seq < $2",
            &[&session, &keep_from],
        )?;
    }
    Ok(true)
}

/// Locks the head of a session's history (made if missing); returns its next seq.
fn lock_history<C: postgres::GenericClient>(db: &mut Db<'_, C>, session: &str) -> TxResult<i64> {
    Ok(db
        .query_one(
            "INSERT INTO parlor_history_heads (session, next) VALUES ($1, 0)
             ON CONFLICT (session) DO UPDATE SET next = parlor_history_heads.next
             RETURNING next",
            &[&session],
        )?
        .get(0))
}

/// Drops the `dropped` oldest messages of a history, then appends `values`.
fn append_history<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    session: &str,
    dropped: i64,
    values: &[String],
) -> TxResult<()> {
    let mut next = lock_history(db, session)?;
    if dropped > 0 {
        db.execute(
            "DELETE FROM parlor_history WHERE session = $1 AND seq IN (
                 SELECT seq FROM parlor_history WHERE session = $1 ORDER BY seq LIMIT $2)",
            &[&session, &dropped],
        )?;
    }
    for value in values {
        db.execute(
            "INSERT INTO parlor_history (session, seq, value) VALUES ($1, $2, $3)",
            &[&session, &next, value],
        )?;
        next += 1;
    }
    db.execute(
        "UPDATE parlor_history_heads SET next = $2 WHERE session = $1",
        &[&session, &next],
    )?;
    Ok(())
}

/// Replaces a whole history by `values` (none: the session has no history left).
fn replace_history<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    session: &str,
    values: &[String],
) -> TxResult<()> {
    lock_history(db, session)?;
    db.execute("DELETE FROM parlor_history WHERE session = $1", &[&session])?;
    if values.is_empty() {
        db.execute(
            "DELETE FROM parlor_history_heads WHERE session = $1",
            &[&session],
        )?;
        return Ok(());
    }
    let mut next = 0_i64;
    for value in values {
        db.execute(
            "INSERT INTO parlor_history (session, seq, value) VALUES ($1, $2, $3)",
            &[&session, &next, value],
        )?;
        next += 1;
    }
    db.execute(
        "UPDATE parlor_history_heads SET next = $2 WHERE session = $1",
        &[&session, &next],
    )?;
    Ok(())
}

/// A session's history values, oldest first, as stored.
fn read_history_values<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    session: &str,
) -> TxResult<Vec<String>> {
    Ok(db
        .query(
            "SELECT value FROM parlor_history WHERE session = $1 ORDER BY seq",
            &[&session],
        )?
        .iter()
        .map(|row| row.get(0))
        .collect())
}

/// A session's history, decoded.
fn read_history<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    session: &str,
) -> TxResult<Vec<Message>> {
    db.query(
        "SELECT seq, value FROM parlor_history WHERE session = $1 ORDER BY seq",
        &[&session],
    )?
    .iter()
    .map(|row| {
        let seq: i64 = row.get(0);
        let value: String = row.get(1);
        Ok(decode_history_entry(value.as_bytes(), || {
            format!("parlor_history[{session}/{seq}]")
        })?)
    })
    .collect()
}

/// Removes and returns a session's summary.
fn take_summary<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    session: &str,
) -> TxResult<Option<Summary>> {
    db.query_opt(
        "DELETE FROM parlor_summaries WHERE session = $1 RETURNING value",
        &[&session],
    )?
    .map(|row| {
        read(&row.get::<_, String>(0), || {
            format!("parlor_summaries[{session}]")
        })
    })
    .transpose()
}

fn put_chat<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    session: &str,
    value: &str,
) -> TxResult<()> {
    db.execute(
        "INSERT INTO parlor_chats (session, value) VALUES ($1, $2)
         ON CONFLICT (session) DO UPDATE SET value = EXCLUDED.value",
        &[&session, &value],
    )?;
    Ok(())
}

fn get_meta<C: postgres::GenericClient>(db: &mut Db<'_, C>, key: &str) -> TxResult<Option<String>> {
    Ok(db
        .query_opt("SELECT value FROM parlor_meta WHERE key = $1", &[&key])?
        .map(|row| row.get(0)))
}

/// A fresh id from the sequence.
fn next_id<C: postgres::GenericClient>(db: &mut Db<'_, C>) -> TxResult<u64> {
    let id: i64 = db.query_one("SELECT nextval('parlor_ids')", &[])?.get(0);
    // The sequence starts at 1 and only grows.
    u64::try_from(id).map_err(|_| {
        TxError::Store(StoreError::Corrupt {
            key: "parlor_ids".to_owned(),
            reason: format!("the sequence gave {id}"),
        })
    })
}

/// Records a pending input under a fresh id; returns the id.
fn insert_pending<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    mut item: PendingItem,
) -> TxResult<u64> {
    item.id = next_id(db)?;
    db.execute(
        "INSERT INTO parlor_pending (id, session, value) VALUES ($1, $2, $3)",
        &[&db_id(item.id), &item.session, &text(encode(&item)?)?],
    )?;
    Ok(item.id)
}

/// Queues a reply under a fresh id (or the one [`Store::reserve_id`] gave it); returns
/// the id.
fn insert_outbox<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    mut entry: OutboxEntry,
) -> TxResult<u64> {
    if entry.id == 0 {
        entry.id = next_id(db)?;
    }
    db.execute(
        "INSERT INTO parlor_outbox (id, session, value) VALUES ($1, $2, $3)",
        &[&db_id(entry.id), &entry.session, &text(encode(&entry)?)?],
    )?;
    Ok(entry.id)
}

/// Refuses the transaction when a conditional write finds its record changed. Each
/// conditional record is locked first (in one order, so two such transactions cannot
/// deadlock on each other): a row that exists with `FOR UPDATE`; one that must still be
/// absent by inserting a placeholder, which a concurrent insert waits on and which the
/// write itself then replaces or removes.
fn check_kv<C: postgres::GenericClient>(db: &mut Db<'_, C>, writes: &[KvWrite]) -> TxResult<()> {
    let mut conditional: Vec<&KvWrite> = writes
        .iter()
        .filter(|write| write.if_unchanged.is_some())
        .collect();
    conditional.sort_by(|a, b| (&a.space, &a.key).cmp(&(&b.space, &b.key)));
    conditional.dedup_by(|a, b| a.space == b.space && a.key == b.key);
    for write in conditional {
        let Some(expected) = &write.if_unchanged else {
            continue;
        };
        let holds = match expected {
            Some(expected) => db
                .query_opt(
                    "SELECT value FROM parlor_kv WHERE space = $1 AND key = $2 FOR UPDATE",
                    &[&write.space, &write.key],
                )?
                .is_some_and(|row| row.get::<_, String>(0) == *expected),
            None => {
                db.execute(
                    "INSERT INTO parlor_kv (space, key, value) VALUES ($1, $2, '')
                     ON CONFLICT (space, key) DO NOTHING",
                    &[&write.space, &write.key],
                )? == 1
            }
        };
        if !holds {
            return Err(TxError::Store(write.changed()));
        }
    }
    Ok(())
}

/// Applies toolset writes, in order.
fn apply_kv<C: postgres::GenericClient>(db: &mut Db<'_, C>, writes: &[KvWrite]) -> TxResult<()> {
    for write in writes {
        match &write.value {
            Some(value) => db.execute(
                "INSERT INTO parlor_kv (space, key, value) VALUES ($1, $2, $3)
                 ON CONFLICT (space, key) DO UPDATE SET value = EXCLUDED.value",
                &[&write.space, &write.key, value],
            )?,
            None => db.execute(
                "DELETE FROM parlor_kv WHERE space = $1 AND key = $2",
                &[&write.space, &write.key],
            )?,
        };
    }
    Ok(())
}

/// Refuses a collection name sled could not name a tree by, so both stores accept the same.
fn check_space(space: &str) -> Result<(), StoreError> {
    if space.is_empty() || space.contains('\0') {
        return Err(StoreError::Io(format!("invalid collection name {space:?}")));
    }
    Ok(())
}

fn check_spaces(writes: &[KvWrite]) -> Result<(), StoreError> {
    writes
        .iter()
        .try_for_each(|write| check_space(&write.space))
}

/// A versioned JSON value as text (it always is UTF-8).
fn text(bytes: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(bytes).map_err(|e| StoreError::Io(format!("cannot encode a value: {e}")))
}

/// Reads a stored versioned JSON value; `key` names it in errors.
fn read<T: serde::de::DeserializeOwned>(value: &str, key: impl Fn() -> String) -> TxResult<T> {
    Ok(decode(value.as_bytes(), key)?)
}

/// Each history message as its stored text.
fn encode_history(messages: &[Message]) -> Result<Vec<String>, StoreError> {
    messages
        .iter()
        .map(|message| text(encode_turn(message)?))
        .collect()
}

/// An id as the `bigint` column holds it. Ids come from the sequence, so they fit; one that
/// does not (a caller's invention) matches no row.
fn db_id(id: u64) -> i64 {
    i64::try_from(id).unwrap_or(-1)
}

fn db_ids(ids: &[u64]) -> Vec<i64> {
    ids.iter().copied().map(db_id).collect()
}
