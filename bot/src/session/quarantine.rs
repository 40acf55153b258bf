//! An input that stops the daemon while its turn runs would be replayed at every start and
//! stop it again: a crash loop that silences every chat. The one input from outside that
//! can do that before any limit applies is a picture (decoding runs native code over
//! memory the picture's header asks for), so a turn whose input carries images marks its
//! pending inputs as started (the `turn_starts` collection, made durable before the turn)
//! and its commit clears the marks in the same transaction. At the next start an input whose
//! turn was started [`LIMIT`] times without committing is set aside (`quarantine`, with the
//! input as it was) and its chat told, in one transaction, instead of being replayed.
//!
//! Text inputs are not marked: they are bounded (`bot.max_input_chars`) and a panic in a
//! turn is caught, so they cannot stop the daemon, and a daemon killed twice while it
//! answers a mention (an operator's `kill -9`, a host that reboots) must still answer it.
//! A turn abandoned by a clean shutdown clears its marks, so only an unclean stop counts.

use crate::store::{KvWrite, OutboxEntry, PendingItem, Store, StoreError, TurnCommit};

use super::queue::QueueItem;
use super::worker::ChatWorker;

/// The collection of start marks: pending id → starts without a commit.
pub const STARTS: &str = "turn_starts";

/// The collection of inputs set aside: `<session>|<pending id>` → the pending item's JSON.
pub const QUARANTINE: &str = "quarantine";

/// Starts without a commit after which an input is set aside at the next start.
pub const LIMIT: u32 = 2;

/// The deletes of `ids`' marks, for the commit that answers them.
pub(super) fn cleared(ids: &[u64]) -> impl Iterator<Item = KvWrite> + '_ {
    ids.iter().map(|id| KvWrite {
        space: STARTS.to_owned(),
        key: id.to_string(),
        value: None,
        if_unchanged: None,
    })
}

fn notice(item: &PendingItem, lang: crate::lang::Lang) -> String {
    let who = crate::quote::name(&item.caller.name, 64);
    crate::lang::say(lang, crate::lang::Msg::SetAside, &[("who", &who)])
}

impl ChatWorker {
    /// Marks `item`'s inputs started, durably, when it carries images.
    pub(super) async fn mark_started(&self, item: &QueueItem) {
        if item.images.is_empty() {
            return;
        }
        let store = self.manager.store();
        for id in &item.pending_ids {
            let key = id.to_string();
            let starts = match store.kv_get(STARTS, &key) {
                Ok(value) => value.and_then(|v| v.parse::<u32>().ok()).unwrap_or(0),
                Err(e) => {
                    tracing::warn!(pending = id, error = %e, "cannot read a start mark");
                    0
                }
            };
            if let Err(e) = store.kv_put(STARTS, &key, &(starts + 1).to_string()) {
                tracing::warn!(pending = id, error = %e, "cannot mark a turn started");
                return;
            }
        }
        if let Err(e) = self.manager.durable().await {
            tracing::warn!(error = %e, "a start mark is not durable");
        }
    }

    /// Clears the marks of a turn that did not run to its end for a reason of ours (a
    /// clean shutdown): only an unclean stop counts.
    pub(super) fn unmark_started(&self, ids: &[u64]) {
        for id in ids {
            if let Err(e) = self.manager.store().kv_delete(STARTS, &id.to_string()) {
                tracing::warn!(pending = id, error = %e, "cannot clear a start mark");
            }
        }
    }
}

/// Sets aside the inputs of `pending` that were started [`LIMIT`] times, each with its
/// chat's notice in one transaction; returns the others and the notices to send once
/// durable.
pub(super) fn set_aside(
    store: &dyn Store,
    pending: Vec<PendingItem>,
    now: chrono::DateTime<chrono::Utc>,
    lang: &dyn Fn(&str) -> crate::lang::Lang,
) -> Result<(Vec<PendingItem>, Vec<OutboxEntry>), StoreError> {
    let mut keep = Vec::with_capacity(pending.len());
    let mut notices = Vec::new();
    for item in pending {
        let starts = store
            .kv_get(STARTS, &item.id.to_string())?
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0);
        if starts < LIMIT {
            keep.push(item);
            continue;
        }
        tracing::error!(session = %item.session, pending = item.id, starts, kind = ?item.kind, "an input stopped the daemon {starts} times while its turn ran; set aside in the store's quarantine, not replayed");
        let record = serde_json::to_string(&item).map_err(|e| StoreError::Corrupt {
            key: item.id.to_string(),
            reason: e.to_string(),
        })?;
        let mut also: Vec<KvWrite> = cleared(std::slice::from_ref(&item.id)).collect();
        also.push(KvWrite {
            space: QUARANTINE.to_owned(),
            key: format!("{}|{}", item.session, item.id),
            value: Some(record),
            if_unchanged: None,
        });
        let mut reply = OutboxEntry::new(
            &item.session,
            &item.chat,
            notice(&item, lang(&item.session)),
            item.reply_to.clone(),
            now,
        );
        let id = store.commit_turn(TurnCommit {
            session: item.session.clone(),
            history: None,
            answered: vec![item.id],
            reply: Some(reply.clone()),
            also,
            summary: None,
        })?;
        if let Some(id) = id {
            reply.id = id;
            notices.push(reply);
        }
    }
    Ok((keep, notices))
}
