//! What the store backends share: their options, the session keys they accept, the rules
//! of records they write, and the versioned JSON every stored value is (sled and
//! PostgreSQL keep the same bytes). No backend imports another.

use std::time::Duration;

use chrono::{DateTime, Utc};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::history::{HISTORY_VERSION, StoredTurn};
use super::{ChatRecord, PendingItem, PendingKind, StoreError};
use crate::llm::Message;
use crate::platform::ChatRef;
use crate::time::WallTime;

/// Tunables shared by both store backends.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How many messages the log of one session keeps; the oldest are dropped first, from
    /// the log and from the dedupe index alike. Values below 1 are treated as 1.
    pub max_messages_per_chat: usize,
    /// How long [`SledStore::open`](super::SledStore::open) retries when the database is locked before it gives up
    /// with [`StoreError::Locked`]. sled releases its file lock a moment *after* the last
    /// handle is dropped (its background threads close the file), so an immediate reopen in
    /// the same process (a restart in tests) needs a short wait. Ignored by [`MemoryStore`].
    ///
    /// [`MemoryStore`]: super::MemoryStore
    pub lock_timeout: Duration,
    /// Where the store reads the time it stamps itself: a done reply's `done_at` (and so
    /// when it is pruned) and a migrated chat's `since`. Everything else it stores carries
    /// the time its caller gave.
    pub wall: WallTime,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_messages_per_chat: 2000,
            lock_timeout: Duration::from_secs(2),
            wall: WallTime::system(),
        }
    }
}

impl StoreOptions {
    /// The bound as used: at least one message.
    pub(crate) fn bound(&self) -> u64 {
        u64::try_from(self.max_messages_per_chat.max(1)).unwrap_or(u64::MAX)
    }
}

/// Refuses session keys that would make the `session \0 ...` keys ambiguous.
pub(crate) fn check_session(session: &str) -> Result<(), StoreError> {
    if session.contains('\0') {
        return Err(StoreError::Io(format!(
            "session key {session:?} contains a NUL byte"
        )));
    }
    Ok(())
}

/// The chat record of the new chat after a migration: the old one's, moved.
pub(super) fn migrated_record(
    to: &ChatRef,
    old: Option<ChatRecord>,
    since: DateTime<Utc>,
) -> ChatRecord {
    ChatRecord {
        chat: to.clone(),
        title: old.and_then(|record| record.title),
        present: true,
        status: "migrated".to_owned(),
        since,
    }
}

/// Whether `item` is the user-message input of message `message_id` of `session`.
pub(super) fn is_pending_for(item: &PendingItem, session: &str, message_id: &str) -> bool {
    item.session == session
        && item.kind == PendingKind::UserMessage
        && item.reply_to.as_deref() == Some(message_id)
}

/// The schema version written into every value (history messages have their own,
/// [`HISTORY_VERSION`]).
const VERSION: u64 = 1;

/// One message of a history in the format of releases up to a271e69 (schema version 1):
/// OpenAI's wire JSON under `message`.
#[derive(serde::Deserialize)]
struct HistoryEntry {
    message: Message,
}

/// A history message as stored, read from `history_messages`: parlor's own form (version
/// 2, see `history.rs`), or version 1 until [`SledStore::open`] has migrated it.
pub(super) fn decode_history_entry(
    bytes: &[u8],
    key: impl Fn() -> String,
) -> Result<Message, StoreError> {
    // The encoder writes the version first, so one look at the bytes finds the common case
    // and it is read in one pass (a turn reads every message of its history).
    if bytes.starts_with(b"{\"v\":2,")
        && let Ok(turn) = serde_json::from_slice::<StoredTurn>(bytes)
    {
        return Ok(turn.into());
    }
    match history_version(bytes, &key)? {
        1 => decode_version::<HistoryEntry>(bytes, 1, key).map(|entry| entry.message),
        _ => decode_version::<StoredTurn>(bytes, HISTORY_VERSION, key).map(Message::from),
    }
}

/// The schema version of a `history_messages` value, 1 or 2; anything else is corrupt.
fn history_version(bytes: &[u8], key: &impl Fn() -> String) -> Result<u64, StoreError> {
    #[derive(serde::Deserialize)]
    struct Version {
        v: Option<Value>,
    }
    let corrupt = |reason: String| StoreError::Corrupt { key: key(), reason };
    let version = serde_json::from_slice::<Version>(bytes)
        .map_err(|e| corrupt(format!("invalid JSON: {e}")))?;
    match version.v {
        Some(v) if v.as_u64() == Some(1) => Ok(1),
        Some(v) if v.as_u64() == Some(HISTORY_VERSION) => Ok(HISTORY_VERSION),
        Some(v) => Err(corrupt(format!(
            "unknown schema version {v} (this parlor reads history versions 1 and \
             {HISTORY_VERSION}; was it written by a newer one?)"
        ))),
        None => Err(corrupt("no schema version \"v\"".to_owned())),
    }
}

/// A history message as its `history_messages` value (version 2).
pub(super) fn encode_turn(message: &Message) -> Result<Vec<u8>, StoreError> {
    encode_version(&StoredTurn::from(message), HISTORY_VERSION)
}

/// Serializes `value` (a struct) as a JSON object with `"v": VERSION` added.
pub(super) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, StoreError> {
    encode_version(value, VERSION)
}

/// [`encode`] with another schema version.
fn encode_version<T: Serialize + ?Sized>(value: &T, version: u64) -> Result<Vec<u8>, StoreError> {
    // The version first, then the value's members after it: the value's opening brace
    // becomes the comma between them. Going through a `serde_json::Value` to insert it cost
    // more than the rest of a turn's store work, and serializing apart then copying a
    // tenth of it.
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"{\"v\":");
    serde_json::to_writer(&mut out, &version)
        .and_then(|()| {
            let at = out.len();
            serde_json::to_writer(&mut out, value).map(|()| at)
        })
        .map_err(|e| StoreError::Io(format!("cannot encode a value: {e}")))
        .and_then(|at| match out.get(at..) {
            Some(b"{}") => {
                out.truncate(at + 1);
                out[at] = b'}';
                Ok(out)
            }
            Some([b'{', ..]) => {
                out[at] = b',';
                Ok(out)
            }
            _ => Err(StoreError::Io(
                "cannot encode a value: not a JSON object".to_owned(),
            )),
        })
}

/// Reads a versioned JSON object; `key` names the value in errors.
pub(super) fn decode<T: DeserializeOwned>(
    bytes: &[u8],
    key: impl Fn() -> String,
) -> Result<T, StoreError> {
    decode_version(bytes, VERSION, key)
}

/// [`decode`] of a value that must be at schema version `expected`.
fn decode_version<T: DeserializeOwned>(
    bytes: &[u8],
    expected: u64,
    key: impl Fn() -> String,
) -> Result<T, StoreError> {
    /// The version member alone; every other member is skipped without being built.
    #[derive(serde::Deserialize)]
    struct Version {
        v: Option<Value>,
    }
    let corrupt = |reason: String| StoreError::Corrupt { key: key(), reason };
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                Err(e) => corrupt(format!("invalid JSON: {e}")),
                Ok(_) => corrupt("not a JSON object".to_owned()),
            },
        );
    }
    let version = serde_json::from_slice::<Version>(bytes)
        .map_err(|e| corrupt(format!("invalid JSON: {e}")))?;
    match version.v {
        Some(v) if v.as_u64() == Some(expected) => {}
        Some(v) => {
            return Err(corrupt(format!(
                "unknown schema version {v} (this parlor reads version {expected}; \
                 was it written by a newer one?)"
            )));
        }
        None => return Err(corrupt("no schema version \"v\"".to_owned())),
    }
    // Stored types ignore members they do not know, `v` among them.
    serde_json::from_slice(bytes).map_err(|e| corrupt(format!("unexpected content: {e}")))
}

#[cfg(test)]
mod tests {
    use serde::Serialize;

    use super::encode_version;

    #[derive(Serialize)]
    struct Two {
        a: u32,
        b: &'static str,
    }

    #[derive(Serialize)]
    struct Nothing {}

    #[test]
    fn the_version_comes_first_in_the_object() {
        let two = encode_version(&Two { a: 1, b: "{x}" }, 3).unwrap();
        assert_eq!(two, br#"{"v":3,"a":1,"b":"{x}"}"#);
        assert_eq!(encode_version(&Nothing {}, 12).unwrap(), br#"{"v":12}"#);
        assert!(encode_version(&[1, 2], 1).is_err());
        assert!(encode_version("{}", 1).is_err());
    }
}
