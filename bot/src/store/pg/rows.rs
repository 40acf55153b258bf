//! The row work [`PgStore`](super::PgStore)'s transactions share: a session's chat log and
//! history under their head rows, ids from the sequence, pending and outbox rows, toolset
//! records with their conditional writes, and the values' text form.

use super::pool::{Db, TxError, TxResult};
use crate::llm::Message;
use crate::store::common::{decode, decode_history_entry, encode, encode_turn};
use crate::store::{KvWrite, OutboxEntry, PendingItem, StoreError, Summary};

/// Locks the head of a session's chat log (made if missing); returns its next seq.
pub(super) fn lock_log<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    session: &str,
) -> TxResult<i64> {
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
pub(super) fn record_log<C: postgres::GenericClient>(
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
pub(super) fn lock_history<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    session: &str,
) -> TxResult<i64> {
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
pub(super) fn append_history<C: postgres::GenericClient>(
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
    next = insert_history(db, session, next, values)?;
    db.execute(
        "UPDATE parlor_history_heads SET next = $2 WHERE session = $1",
        &[&session, &next],
    )?;
    Ok(())
}

/// Inserts `values` as history messages `first..`, in one statement (one round trip
/// whatever their number); returns the seq after the last.
fn insert_history<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    session: &str,
    first: i64,
    values: &[String],
) -> TxResult<i64> {
    if !values.is_empty() {
        db.execute(
            "INSERT INTO parlor_history (session, seq, value)
             SELECT $1, $2 + ordinality - 1, value
             FROM unnest($3::text[]) WITH ORDINALITY AS new (value, ordinality)",
            &[&session, &first, &values],
        )?;
    }
    Ok(first.saturating_add(i64::try_from(values.len()).unwrap_or(i64::MAX)))
}

/// Replaces a whole history by `values` (none: the session has no history left).
pub(super) fn replace_history<C: postgres::GenericClient>(
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
    let next = insert_history(db, session, 0, values)?;
    db.execute(
        "UPDATE parlor_history_heads SET next = $2 WHERE session = $1",
        &[&session, &next],
    )?;
    Ok(())
}

/// A session's history values, oldest first, as stored.
pub(super) fn read_history_values<C: postgres::GenericClient>(
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
pub(super) fn read_history<C: postgres::GenericClient>(
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
pub(super) fn take_summary<C: postgres::GenericClient>(
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

pub(super) fn put_chat<C: postgres::GenericClient>(
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

pub(super) fn get_meta<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    key: &str,
) -> TxResult<Option<String>> {
    Ok(db
        .query_opt("SELECT value FROM parlor_meta WHERE key = $1", &[&key])?
        .map(|row| row.get(0)))
}

/// A fresh id from the sequence.
pub(super) fn next_id<C: postgres::GenericClient>(db: &mut Db<'_, C>) -> TxResult<u64> {
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
pub(super) fn insert_pending<C: postgres::GenericClient>(
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
pub(super) fn insert_outbox<C: postgres::GenericClient>(
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
pub(super) fn check_kv<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    writes: &[KvWrite],
) -> TxResult<()> {
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
pub(super) fn apply_kv<C: postgres::GenericClient>(
    db: &mut Db<'_, C>,
    writes: &[KvWrite],
) -> TxResult<()> {
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
pub(super) fn check_space(space: &str) -> Result<(), StoreError> {
    if space.is_empty() || space.contains('\0') {
        return Err(StoreError::Io(format!("invalid collection name {space:?}")));
    }
    Ok(())
}

pub(super) fn check_spaces(writes: &[KvWrite]) -> Result<(), StoreError> {
    writes
        .iter()
        .try_for_each(|write| check_space(&write.space))
}

/// A versioned JSON value as text (it always is UTF-8).
pub(super) fn text(bytes: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(bytes).map_err(|e| StoreError::Io(format!("cannot encode a value: {e}")))
}

/// Reads a stored versioned JSON value; `key` names it in errors.
pub(super) fn read<T: serde::de::DeserializeOwned>(
    value: &str,
    key: impl Fn() -> String,
) -> TxResult<T> {
    Ok(decode(value.as_bytes(), key)?)
}

/// Each history message as its stored text.
pub(super) fn encode_history(messages: &[Message]) -> Result<Vec<String>, StoreError> {
    messages
        .iter()
        .map(|message| text(encode_turn(message)?))
        .collect()
}

/// An id as the `bigint` column holds it. Ids come from the sequence, so they fit; one that
/// does not (a caller's invention) matches no row.
pub(super) fn db_id(id: u64) -> i64 {
    i64::try_from(id).unwrap_or(-1)
}

pub(super) fn db_ids(ids: &[u64]) -> Vec<i64> {
    ids.iter().copied().map(db_id).collect()
}
