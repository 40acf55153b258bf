//! [`Store::migrate_session`](crate::store::Store::migrate_session) on PostgreSQL: a chat's
//! whole session moved onto its new id, in the caller's one transaction.

use super::pool::{Db, TxResult};
use super::rows::{
    apply_kv, check_kv, lock_history, lock_log, put_chat, read, read_history_values,
    replace_history, take_summary, text,
};
use crate::platform::ChatRef;
use crate::store::common::{encode, migrated_record};
use crate::store::{
    ChatRecord, KvWrite, OutboxEntry, PendingItem, StoredMessage, merged_summaries, migrated_key,
    moved_message, moved_outbox, moved_pending,
};
use crate::time::WallTime;

/// What one [`Store::migrate_session`] moves.
pub(super) struct Migration<'a> {
    pub(super) from: &'a ChatRef,
    pub(super) to: &'a ChatRef,
    pub(super) old: &'a str,
    pub(super) new: &'a str,
    pub(super) bound: i64,
}

impl Migration<'_> {
    pub(super) fn run<C: postgres::GenericClient>(
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
