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
//!
//! ## Adding to it
//! Another trait on the same database (leases for several instances, say) is a file beside
//! these: its tables in a new `bot/migrations/postgres/000N_*.sql` listed in `schema.rs`,
//! its calls through the same pool (the `pool` field, which a child module of `pg` reaches;
//! one transaction per call), so that its writes can share a transaction with the store's
//! row helpers (`rows.rs`).

mod migrate;
mod pool;
mod rows;
mod schema;

use std::sync::Arc;

use futures::future::BoxFuture;
use postgres::Config;

use self::migrate::Migration;
use self::pool::{Pool, TxResult};
use self::rows::{
    append_history, apply_kv, check_kv, check_space, check_spaces, db_id, db_ids, encode_history,
    get_meta, insert_outbox, insert_pending, next_id, put_chat, read, read_history, record_log,
    replace_history, text,
};
use super::common::{StoreOptions, check_session, encode, is_pending_for};
use super::{
    ChatRecord, Edited, HistoryChange, Inbound, Intake, KvWrite, OutboxEntry, PendingItem,
    SENT_KEEP_DAYS, Store, StoreError, StoredMessage, Summary, TurnCommit, migrated_key,
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
