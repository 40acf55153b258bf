//! The `Store` contract (docs/contract.md, "Storage"). Every behaviour has one test body that runs against
//! every backend ([`MemoryStore`], a [`SledStore`] in a temporary directory and a
//! [`PgStore`] on a database of a throwaway PostgreSQL, `testing::PgCluster`); restart,
//! locking, corruption and the format of earlier releases are sled-only, sharing and
//! reconnecting PostgreSQL-only (`store_pg.rs`).

use std::path::Path;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use parlor_bot::llm::{Content, ContentPart, ImageUrl, Message, ToolCall};
use parlor_bot::platform::{ChatRef, ImageRef, Sender};
use parlor_bot::store::{
    ChatRecord, Edited, HistoryChange, Inbound, Intake, KvWrite, MemoryStore, OutboxEntry,
    PendingItem, PendingKind, PgStore, SledStore, Store, StoreError, StoreOptions, StoredMessage,
    Summary, TurnCommit,
};
use parlor_bot::testing::PgCluster;
use parlor_bot::time::WallTime;
use parlor_bot::tool::{Caller, Role};

// ---- fixtures ----------------------------------------------------------------------------

const A: &str = "telegram:-100";
const B: &str = "telegram:-200/topic:7";

fn time(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_700_000_000 + secs, 0)
        .single()
        .expect("valid time")
}

fn chat(session: &str) -> ChatRef {
    match session {
        B => ChatRef::new("telegram", "-200").in_thread("7"),
        _ => ChatRef::new("telegram", "-100"),
    }
}

fn msg(id: &str) -> StoredMessage {
    StoredMessage {
        message_id: id.to_owned(),
        sender: Sender {
            id: "telegram:1001".to_owned(),
            name: "Alice".to_owned(),
            username: Some("alice".to_owned()),
            is_bot: false,
        },
        text: format!("text of {id}"),
        time: time(id.len() as i64),
        reply_to: None,
        images: Vec::new(),
        from_self: false,
    }
}

fn pending_item(session: &str, text: &str) -> PendingItem {
    PendingItem {
        id: 0,
        session: session.to_owned(),
        chat: chat(session),
        kind: PendingKind::UserMessage,
        caller: Caller {
            user_id: "telegram:1001".to_owned(),
            name: "Alice".to_owned(),
            role: Role::Member,
            grants: Vec::new(),
        },
        text: format!("alice: {text}"),
        reply_to: Some("41".to_owned()),
        images: vec![ImageRef {
            file_id: "file-1".to_owned(),
            mime_type: Some("image/png".to_owned()),
            size: Some(1234),
        }],
        received: time(5),
        private: false,
    }
}

fn reply(session: &str, text: &str) -> OutboxEntry {
    OutboxEntry {
        id: 0,
        session: session.to_owned(),
        chat: chat(session),
        text: text.to_owned(),
        reply_to: Some("41".to_owned()),
        created: time(9),
        sent_ids: Vec::new(),
        done_at: None,
        failed: None,
        buttons: Vec::new(),
    }
}

/// A history with every message shape: system, plain and multi-part user content, an
/// assistant tool call (no text), tool results, and a final assistant text.
fn rich_history() -> Vec<Message> {
    vec![
        Message::system("You are parlor."),
        Message::user("alice: hi"),
        Message::User {
            content: Content::Parts(vec![
                ContentPart::Text {
                    text: "bob: what is this?".to_owned(),
                },
                ContentPart::ImageUrl {
                    image_url: ImageUrl {
                        url: "data:image/png;base64,iVBORw0KGgo=".to_owned(),
                        detail: Some("low".to_owned()),
                    },
                },
            ]),
        },
        Message::Assistant {
            content: None,
            tool_calls: vec![
                ToolCall::new("call_1", "time_now", "{}"),
                ToolCall::new("call_2", "todo_add", r#"{"text":"buy milk"}"#),
            ],
            thinking: Vec::new(),
            model: None,
        },
        Message::tool("call_1", r#"{"ok":true,"time":"12:00"}"#),
        Message::tool("call_2", r#"{"ok":true}"#),
        Message::assistant("It is noon; milk noted."),
    ]
}

/// What a turn commits: `dropped` old messages trimmed, `messages` new.
fn append(dropped: usize, messages: Vec<Message>) -> HistoryChange {
    HistoryChange::Append { dropped, messages }
}

/// A history of `n` short user messages `{tag}0..{tag}n`.
fn lines(tag: &str, n: usize) -> Vec<Message> {
    (0..n).map(|i| Message::user(format!("{tag}{i}"))).collect()
}

/// A history as the texts of its messages.
fn texts(history: &[Message]) -> Vec<String> {
    history
        .iter()
        .map(|m| match m {
            Message::User { content } => content.text(),
            Message::Assistant { content, .. } => content.clone().unwrap_or_default(),
            Message::Tool { content, .. } => content.clone(),
            Message::System { content } => content.clone(),
        })
        .collect()
}

/// The texts `{tag}{from}..{tag}{to}`.
fn range(tag: &str, from: usize, to: usize) -> Vec<String> {
    (from..to).map(|i| format!("{tag}{i}")).collect()
}

/// A turn's commit of `change` to the history of `session`, and nothing else.
fn commit_history(store: &dyn Store, session: &str, change: HistoryChange) {
    store
        .commit_turn(TurnCommit {
            session: session.to_owned(),
            history: Some(change),
            answered: Vec::new(),
            reply: None,
            summary: None,
            also: Vec::new(),
        })
        .unwrap();
}

fn summary(text: &str) -> Summary {
    Summary {
        text: text.to_owned(),
        made: time(7),
        messages: 10,
    }
}

fn ids(messages: &[StoredMessage]) -> Vec<&str> {
    messages.iter().map(|m| m.message_id.as_str()).collect()
}

/// Runs `f` against a fresh [`MemoryStore`], a fresh [`SledStore`] and, where PostgreSQL
/// is installed, a [`PgStore`] on a database of its own, with `options`.
fn each_store_with(options: StoreOptions, f: impl Fn(&str, &dyn Store)) {
    f("memory", &MemoryStore::with_options(options.clone()));
    let dir = tempfile::tempdir().expect("tempdir");
    let sled = SledStore::open(dir.path(), options.clone()).expect("open sled store");
    f("sled", &sled);
    if let Some(cluster) = PgCluster::start() {
        let pg = PgStore::open(&cluster.database(), options).expect("open PostgreSQL store");
        f("postgres", &pg);
    }
}

/// The times a store stamps itself (a done reply's `done_at`, a migrated chat's `since`)
/// come from `StoreOptions::wall`, not the system clock.
#[test]
fn the_times_a_store_stamps_come_from_its_wall_time() {
    let options = StoreOptions {
        wall: WallTime::from_fn(|| time(500)),
        ..StoreOptions::default()
    };
    each_store_with(options, |name, store| {
        let sent = store.queue_outbox_with(reply(A, "hi"), vec![]).unwrap();
        store.mark_sent(sent, &["m-1".to_owned()]).unwrap();
        let done = store.sent_reply(sent).unwrap().unwrap();
        assert_eq!(done.done_at, Some(time(500)), "{name}");
        let failed = store.queue_outbox_with(reply(A, "no"), vec![]).unwrap();
        store.mark_failed(failed, "chat gone").unwrap();
        assert_eq!(
            store.sent_reply(failed).unwrap().unwrap().done_at,
            Some(time(500)),
            "{name}"
        );

        assert!(
            store
                .migrate_session(&old_chat(), &new_chat(), vec![])
                .unwrap(),
            "{name}"
        );
        let record = store.chat_status(NEW).unwrap().unwrap();
        assert_eq!(record.since, time(500), "{name}");
    });
}

fn each_store(f: impl Fn(&str, &dyn Store)) {
    each_store_with(StoreOptions::default(), f);
}

fn open(dir: &Path) -> SledStore {
    SledStore::open(dir, StoreOptions::default()).expect("open sled store")
}

// ---- both backends -----------------------------------------------------------------------

#[test]
fn a_summary_lands_with_the_history_it_replaces_and_goes_with_a_reset() {
    each_store(|name, store| {
        let session = "telegram:-77";
        store.save_history(session, &rich_history()).unwrap();
        let compact = |dropped, summary| TurnCommit {
            session: session.to_owned(),
            history: Some(HistoryChange::Append {
                dropped,
                messages: vec![],
            }),
            answered: vec![],
            reply: None,
            summary,
            also: Vec::new(),
        };
        store
            .commit_turn(compact(3, Some(summary("decided: Saturday"))))
            .unwrap();
        assert_eq!(
            store.load_history(session).unwrap(),
            rich_history()[3..],
            "{name}"
        );
        assert_eq!(
            store.load_summary(session).unwrap(),
            Some(summary("decided: Saturday")),
            "{name}"
        );
        // A later turn without a summary keeps the one there is.
        store.commit_turn(compact(0, None)).unwrap();
        assert!(store.load_summary(session).unwrap().is_some(), "{name}");
        assert_eq!(store.load_summary("telegram:-78").unwrap(), None, "{name}");
        // Replacing the history (`/reset`) drops it.
        store
            .commit_turn(TurnCommit {
                history: Some(HistoryChange::Replace(vec![])),
                ..compact(0, None)
            })
            .unwrap();
        assert_eq!(store.load_summary(session).unwrap(), None, "{name}");
    });
}

#[test]
fn a_conditional_write_on_a_changed_record_refuses_the_whole_transaction() {
    each_store(|name, store| {
        store.kv_put("clocks", "1", "old").unwrap();
        let stale = KvWrite {
            if_unchanged: Some(Some("read".to_owned())),
            ..kv("clocks", "1", Some("stale"))
        };
        let record = ChatRecord {
            chat: old_chat(),
            title: None,
            present: false,
            status: "kicked".to_owned(),
            since: time(0),
        };
        let refused =
            store.set_chat_status(&record, vec![kv("todo", "x", Some("y")), stale], vec![]);
        assert!(
            matches!(refused, Err(StoreError::Changed(_))),
            "{name}: {refused:?}"
        );
        assert_eq!(
            store.kv_get("clocks", "1").unwrap().as_deref(),
            Some("old"),
            "{name}"
        );
        assert_eq!(
            store.kv_get("todo", "x").unwrap(),
            None,
            "{name}: nothing of it"
        );
        assert_eq!(store.chat_status(OLD).unwrap(), None, "{name}");
        let refused = store.migrate_session(
            &old_chat(),
            &new_chat(),
            vec![KvWrite {
                if_unchanged: Some(None),
                ..kv("clocks", "1", Some("new"))
            }],
        );
        assert!(
            matches!(refused, Err(StoreError::Changed(_))),
            "{name}: {refused:?}"
        );
        assert_eq!(store.migrated_to(OLD).unwrap(), None, "{name}");

        // Read right, it lands.
        let fresh = KvWrite {
            if_unchanged: Some(Some("old".to_owned())),
            ..kv("clocks", "1", Some("new"))
        };
        store.set_chat_status(&record, vec![fresh], vec![]).unwrap();
        assert_eq!(
            store.kv_get("clocks", "1").unwrap().as_deref(),
            Some("new"),
            "{name}"
        );
    });
}

#[test]
fn a_summary_survives_reopening_the_sled_store() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        store
            .commit_turn(TurnCommit {
                session: "telegram:-77".to_owned(),
                history: None,
                answered: vec![],
                reply: None,
                summary: Some(summary("kept")),
                also: Vec::new(),
            })
            .unwrap();
        store.flush().unwrap();
    }
    let store = open(dir.path());
    assert_eq!(
        store.load_summary("telegram:-77").unwrap(),
        Some(summary("kept"))
    );
}

const OLD: &str = "telegram:-5001";
const NEW: &str = "telegram:-1005001";

fn old_chat() -> ChatRef {
    ChatRef::new("telegram", "-5001")
}

fn new_chat() -> ChatRef {
    ChatRef::new("telegram", "-1005001")
}

fn in_old(item: PendingItem) -> PendingItem {
    PendingItem {
        session: OLD.to_owned(),
        chat: old_chat(),
        ..item
    }
}

fn kv(space: &str, key: &str, value: Option<&str>) -> KvWrite {
    KvWrite {
        space: space.to_owned(),
        key: key.to_owned(),
        value: value.map(str::to_owned),
        if_unchanged: None,
    }
}

#[test]
fn a_chat_record_lands_with_its_toolset_writes_and_notices() {
    each_store(|name, store| {
        assert_eq!(store.chat_status(A).unwrap(), None, "{name}");
        let record = ChatRecord {
            chat: chat(A),
            title: Some("club".to_owned()),
            present: false,
            status: "kicked".to_owned(),
            since: time(1),
        };
        let notice = OutboxEntry {
            reply_to: None,
            ..reply(B, "task paused")
        };
        let ids = store
            .set_chat_status(
                &record,
                vec![kv("clocks", "1", Some("paused"))],
                vec![notice],
            )
            .unwrap();
        assert_eq!(ids.len(), 1, "{name}");
        assert_eq!(store.chat_status(A).unwrap(), Some(record), "{name}");
        assert_eq!(
            store.kv_get("clocks", "1").unwrap().as_deref(),
            Some("paused")
        );
        let unsent = store.unsent_outbox().unwrap();
        assert_eq!(unsent.len(), 1, "{name}");
        assert_eq!(
            (unsent[0].id, unsent[0].text.as_str()),
            (ids[0], "task paused")
        );
    });
}

#[test]
fn a_migration_moves_the_whole_session_once() {
    each_store(|name, store| {
        // The old group: a log, a history, a pending input, an unsent reply, a record.
        let mut first = msg("1");
        first.reply_to = Some("0".to_owned());
        store.record_message(OLD, &first).unwrap();
        store
            .record_inbound(
                OLD,
                &msg("2"),
                Intake::Pending(in_old(pending_item(OLD, "hi"))),
            )
            .unwrap();
        store.save_history(OLD, &rich_history()).unwrap();
        let unsent = OutboxEntry {
            session: OLD.to_owned(),
            chat: old_chat(),
            ..reply(OLD, "an answer")
        };
        store
            .commit_turn(TurnCommit {
                session: OLD.to_owned(),
                history: None,
                answered: vec![],
                reply: Some(unsent),
                summary: Some(summary("the old group's plans")),
                also: Vec::new(),
            })
            .unwrap();
        store
            .commit_turn(TurnCommit {
                session: NEW.to_owned(),
                history: None,
                answered: vec![],
                reply: None,
                summary: Some(summary("the supergroup's plans")),
                also: Vec::new(),
            })
            .unwrap();
        let record = ChatRecord {
            chat: old_chat(),
            title: Some("book club".to_owned()),
            present: true,
            status: "member".to_owned(),
            since: time(0),
        };
        store.set_chat_status(&record, vec![], vec![]).unwrap();
        // The supergroup already logged its own message 1 (ids start afresh there).
        let mut theirs = msg("1");
        theirs.text = "in the supergroup".to_owned();
        store.record_message(NEW, &theirs).unwrap();

        let moved = store
            .migrate_session(
                &old_chat(),
                &new_chat(),
                vec![kv("todo", NEW, Some("plan"))],
            )
            .unwrap();
        assert!(moved, "{name}");

        assert!(store.recent_messages(OLD, 10).unwrap().is_empty(), "{name}");
        let log = store.recent_messages(NEW, 10).unwrap();
        assert_eq!(ids(&log), ["-5001/1", "-5001/2", "1"], "{name}");
        assert_eq!(log[0].reply_to.as_deref(), Some("-5001/0"), "{name}");
        assert_eq!(log[2].text, "in the supergroup", "{name}");
        // The new chat's own ids still dedupe, the old ones no longer collide.
        assert!(!store.record_message(NEW, &theirs).unwrap(), "{name}");
        assert!(store.record_message(NEW, &msg("2")).unwrap(), "{name}");
        assert_eq!(
            store.get_message(NEW, "-5001/2").unwrap().unwrap().text,
            "text of 2"
        );

        assert!(store.load_history(OLD).unwrap().is_empty(), "{name}");
        assert_eq!(store.load_history(NEW).unwrap(), rich_history(), "{name}");
        assert_eq!(store.load_summary(OLD).unwrap(), None, "{name}");
        let merged = store.load_summary(NEW).unwrap().unwrap();
        assert_eq!(
            merged.text, "the old group's plans\n\nthe supergroup's plans",
            "{name}: the old chat's first, as its history"
        );
        assert_eq!(merged.messages, 20, "{name}");
        let pending = store.pending().unwrap();
        assert_eq!(pending.len(), 1, "{name}");
        assert_eq!(
            (pending[0].session.as_str(), pending[0].chat.clone()),
            (NEW, new_chat())
        );
        assert_eq!(
            pending[0].reply_to, None,
            "{name}: not threaded into the new chat"
        );
        let outbox = store.unsent_outbox().unwrap();
        assert_eq!(
            (outbox[0].session.as_str(), outbox[0].chat.clone()),
            (NEW, new_chat())
        );
        assert_eq!(store.chat_status(OLD).unwrap(), None, "{name}");
        let record = store.chat_status(NEW).unwrap().unwrap();
        assert!(record.present, "{name}");
        assert_eq!(record.title.as_deref(), Some("book club"), "{name}");
        assert_eq!(store.kv_get("todo", NEW).unwrap().as_deref(), Some("plan"));
        assert_eq!(
            store.migrated_to(OLD).unwrap().as_deref(),
            Some(NEW),
            "{name}"
        );

        // Both updates arrive, or one twice: the second changes nothing.
        let again = store
            .migrate_session(
                &old_chat(),
                &new_chat(),
                vec![kv("todo", NEW, Some("other"))],
            )
            .unwrap();
        assert!(!again, "{name}");
        assert_eq!(store.kv_get("todo", NEW).unwrap().as_deref(), Some("plan"));
        assert_eq!(store.recent_messages(NEW, 10).unwrap().len(), 4, "{name}");
        assert_eq!(store.pending().unwrap().len(), 1, "{name}");
    });
}

#[test]
fn an_edit_updates_the_log_and_a_pending_input_but_not_an_answered_one() {
    each_store(|name, store| {
        let mut item = pending_item(A, "what is 2+3?");
        item.reply_to = Some("41".to_owned());
        store
            .record_inbound(A, &msg("41"), Intake::Pending(item))
            .unwrap();
        store.record_message(A, &msg("42")).unwrap();

        let mut edited = msg("41");
        edited.text = "what is 2+2?".to_owned();
        let outcome = store
            .edit_message(A, &edited, Some("alice: what is 2+2?"))
            .unwrap();
        let Edited::Pending(id) = outcome else {
            panic!("{name}: {outcome:?}");
        };
        assert_eq!(
            store.get_message(A, "41").unwrap().unwrap().text,
            "what is 2+2?"
        );
        let pending = store.pending().unwrap();
        assert_eq!(
            (pending[0].id, pending[0].text.as_str()),
            (id, "alice: what is 2+2?")
        );

        // Answered: only the log changes.
        store
            .commit_turn(TurnCommit {
                session: A.to_owned(),
                history: None,
                answered: vec![id],
                reply: None,
                summary: None,
                also: Vec::new(),
            })
            .unwrap();
        edited.text = "what is 3+3?".to_owned();
        let outcome = store
            .edit_message(A, &edited, Some("alice: what is 3+3?"))
            .unwrap();
        assert_eq!(outcome, Edited::Logged, "{name}");
        assert_eq!(
            store.get_message(A, "41").unwrap().unwrap().text,
            "what is 3+3?"
        );
        assert!(store.pending().unwrap().is_empty(), "{name}");

        // Chatter edited: the log only; an unknown message: nothing.
        let mut chatter = msg("42");
        chatter.text = "fixed".to_owned();
        assert_eq!(
            store.edit_message(A, &chatter, Some("x")).unwrap(),
            Edited::Logged
        );
        assert_eq!(
            store.edit_message(A, &msg("99"), None).unwrap(),
            Edited::Unknown
        );
        assert!(store.get_message(A, "99").unwrap().is_none(), "{name}");
        assert_eq!(
            ids(&store.recent_messages(A, 10).unwrap()),
            ["41", "42"],
            "{name}"
        );
    });
}

#[test]
fn sled_a_migration_survives_a_restart_whole() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        store.record_message(OLD, &msg("1")).unwrap();
        store.save_history(OLD, &rich_history()).unwrap();
        assert!(
            store
                .migrate_session(&old_chat(), &new_chat(), vec![])
                .unwrap()
        );
        store.flush().unwrap();
    }
    let store = open(dir.path());
    assert_eq!(ids(&store.recent_messages(NEW, 10).unwrap()), ["-5001/1"]);
    assert!(store.recent_messages(OLD, 10).unwrap().is_empty());
    assert_eq!(store.load_history(NEW).unwrap(), rich_history());
    assert!(
        !store
            .migrate_session(&old_chat(), &new_chat(), vec![])
            .unwrap()
    );
    // The moved log continues: a new message goes after the moved ones.
    store.record_message(NEW, &msg("7")).unwrap();
    assert_eq!(
        ids(&store.recent_messages(NEW, 10).unwrap()),
        ["-5001/1", "7"]
    );
}

#[test]
fn record_message_dedupes_by_session_and_id() {
    each_store(|name, store| {
        assert!(store.record_message(A, &msg("1")).unwrap(), "{name}");
        let mut again = msg("1");
        again.text = "edited".to_owned();
        assert!(!store.record_message(A, &again).unwrap(), "{name}");
        // Nothing changed: the first version stays, and there is one message.
        assert_eq!(store.get_message(A, "1").unwrap(), Some(msg("1")), "{name}");
        assert_eq!(
            store.recent_messages(A, 10).unwrap(),
            vec![msg("1")],
            "{name}"
        );
        // The same id in another session is another message.
        assert!(store.record_message(B, &msg("1")).unwrap(), "{name}");
    });
}

/// The log of a session keeps the newest `max_messages_per_chat`. A dropped message is gone
/// from the log *and* the dedupe index: `get_message` no longer finds it, and recording it
/// again succeeds (it is appended as the newest). The dedupe window is thus the bound.
#[test]
fn the_log_is_bounded_per_chat_and_drops_the_oldest() {
    let options = StoreOptions {
        max_messages_per_chat: 3,
        ..StoreOptions::default()
    };
    each_store_with(options, |name, store| {
        for id in ["1", "2", "3", "4", "5"] {
            assert!(store.record_message(A, &msg(id)).unwrap(), "{name}");
        }
        store.record_message(B, &msg("b1")).unwrap();
        let recent = store.recent_messages(A, 10).unwrap();
        assert_eq!(ids(&recent), ["3", "4", "5"], "{name}");
        assert_eq!(store.get_message(A, "1").unwrap(), None, "{name}");
        assert_eq!(store.get_message(A, "2").unwrap(), None, "{name}");
        assert_eq!(store.get_message(A, "3").unwrap(), Some(msg("3")), "{name}");
        // Still-kept ids are deduped; a dropped one is accepted again, as the newest.
        assert!(!store.record_message(A, &msg("4")).unwrap(), "{name}");
        assert!(store.record_message(A, &msg("1")).unwrap(), "{name}");
        let recent = store.recent_messages(A, 10).unwrap();
        assert_eq!(ids(&recent), ["4", "5", "1"], "{name}");
        // The bound is per chat: B is untouched.
        assert_eq!(
            ids(&store.recent_messages(B, 10).unwrap()),
            ["b1"],
            "{name}"
        );
    });
}

#[test]
fn recent_messages_are_the_last_ones_oldest_first() {
    each_store(|name, store| {
        assert!(store.recent_messages(A, 5).unwrap().is_empty(), "{name}");
        for i in 0..12 {
            store.record_message(A, &msg(&format!("m{i}"))).unwrap();
        }
        let recent = store.recent_messages(A, 3).unwrap();
        assert_eq!(ids(&recent), ["m9", "m10", "m11"], "{name}");
        assert_eq!(store.recent_messages(A, 100).unwrap().len(), 12, "{name}");
        assert!(store.recent_messages(A, 0).unwrap().is_empty(), "{name}");
        let all = store.recent_messages(A, 12).unwrap();
        assert_eq!(all.first().map(|m| m.message_id.as_str()), Some("m0"));
    });
}

#[test]
fn sessions_are_isolated() {
    each_store(|name, store| {
        // "telegram:-100" is a prefix of "telegram:-1000": keys must not bleed.
        let a2 = "telegram:-1000";
        store.record_message(A, &msg("1")).unwrap();
        store.record_message(a2, &msg("2")).unwrap();
        store.record_message(B, &msg("3")).unwrap();
        assert_eq!(ids(&store.recent_messages(A, 10).unwrap()), ["1"], "{name}");
        assert_eq!(
            ids(&store.recent_messages(a2, 10).unwrap()),
            ["2"],
            "{name}"
        );
        assert_eq!(store.get_message(A, "3").unwrap(), None, "{name}");
        assert_eq!(store.get_message(B, "3").unwrap(), Some(msg("3")), "{name}");

        store.save_history(A, &[Message::user("a")]).unwrap();
        assert!(store.load_history(B).unwrap().is_empty(), "{name}");
        assert!(store.load_history(a2).unwrap().is_empty(), "{name}");
    });
}

#[test]
fn session_keys_with_nul_are_refused() {
    each_store(|name, store| {
        let err = store.record_message("a\0b", &msg("1")).unwrap_err();
        assert!(matches!(err, StoreError::Io(_)), "{name}: {err}");
    });
}

#[test]
fn history_roundtrips_every_message_shape() {
    each_store(|name, store| {
        assert!(store.load_history(A).unwrap().is_empty(), "{name}");
        store.save_history(A, &rich_history()).unwrap();
        assert_eq!(store.load_history(A).unwrap(), rich_history(), "{name}");
        // Replaced, not appended (trimming, /reset).
        store.save_history(A, &[Message::user("fresh")]).unwrap();
        assert_eq!(
            store.load_history(A).unwrap(),
            vec![Message::user("fresh")],
            "{name}"
        );
        store.save_history(A, &[]).unwrap();
        assert!(store.load_history(A).unwrap().is_empty(), "{name}");
    });
}

#[test]
fn pending_ids_increase_and_pending_is_in_arrival_order_across_sessions() {
    each_store(|name, store| {
        let first = store.add_pending(pending_item(A, "one")).unwrap();
        let second = store.add_pending(pending_item(B, "two")).unwrap();
        let third = store.add_pending(pending_item(A, "three")).unwrap();
        assert!(first < second && second < third, "{name}");
        let pending = store.pending().unwrap();
        let got: Vec<(u64, &str, &str)> = pending
            .iter()
            .map(|p| (p.id, p.session.as_str(), p.text.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (first, A, "alice: one"),
                (second, B, "alice: two"),
                (third, A, "alice: three")
            ],
            "{name}"
        );
        // Everything else roundtrips; the id is the store's.
        let mut expected = pending_item(B, "two");
        expected.id = second;
        assert_eq!(pending[1], expected, "{name}");

        store.remove_pending(&[first, third, 999_999]).unwrap();
        let left: Vec<u64> = store.pending().unwrap().iter().map(|p| p.id).collect();
        assert_eq!(left, [second], "{name}");
    });
}

#[test]
fn commit_turn_writes_history_removes_answered_and_queues_the_reply() {
    each_store(|name, store| {
        let p1 = store.add_pending(pending_item(A, "one")).unwrap();
        let p2 = store.add_pending(pending_item(A, "two")).unwrap();
        let other = store.add_pending(pending_item(B, "other")).unwrap();

        let outbox_id = store
            .commit_turn(TurnCommit {
                session: A.to_owned(),
                history: Some(append(0, rich_history())),
                answered: vec![p1, p2],
                reply: Some(reply(A, "done")),
                summary: None,
                also: Vec::new(),
            })
            .unwrap()
            .expect("a reply was given");

        assert_eq!(store.load_history(A).unwrap(), rich_history(), "{name}");
        let left: Vec<u64> = store.pending().unwrap().iter().map(|p| p.id).collect();
        assert_eq!(left, [other], "{name}");
        let mut expected = reply(A, "done");
        expected.id = outbox_id;
        assert_eq!(store.unsent_outbox().unwrap(), vec![expected], "{name}");
        // Reply ids come from the same increasing sequence as pending ids.
        assert!(outbox_id > other, "{name}");

        // A turn without a reply still writes history and removes what it answered.
        let none = store
            .commit_turn(TurnCommit {
                session: B.to_owned(),
                history: Some(append(0, vec![Message::user("alice: other")])),
                answered: vec![other],
                reply: None,
                summary: None,
                also: Vec::new(),
            })
            .unwrap();
        assert_eq!(none, None, "{name}");
        assert!(store.pending().unwrap().is_empty(), "{name}");
        assert_eq!(store.unsent_outbox().unwrap().len(), 1, "{name}");
        assert_eq!(store.load_history(B).unwrap().len(), 1, "{name}");
    });
}

#[test]
fn unsent_outbox_is_oldest_first_and_mark_sent_removes() {
    each_store(|name, store| {
        let mut ids = Vec::new();
        for (session, text) in [(A, "r1"), (B, "r2"), (A, "r3")] {
            let id = store
                .commit_turn(TurnCommit {
                    session: session.to_owned(),
                    history: Some(HistoryChange::Replace(Vec::new())),
                    answered: Vec::new(),
                    reply: Some(reply(session, text)),
                    summary: None,
                    also: Vec::new(),
                })
                .unwrap()
                .expect("queued");
            ids.push(id);
        }
        let texts = |store: &dyn Store| -> Vec<String> {
            store
                .unsent_outbox()
                .unwrap()
                .into_iter()
                .map(|e| e.text)
                .collect()
        };
        assert_eq!(texts(store), ["r1", "r2", "r3"], "{name}");
        store.mark_sent(ids[1], &["555".to_owned()]).unwrap();
        assert_eq!(texts(store), ["r1", "r3"], "{name}");
        // Marking again, or an unknown id, is harmless.
        store.mark_sent(ids[1], &[]).unwrap();
        store.mark_sent(987_654, &[]).unwrap();
        store
            .mark_sent(ids[0], &["556".to_owned(), "557".to_owned()])
            .unwrap();
        store.mark_sent(ids[2], &[]).unwrap();
        assert!(texts(store).is_empty(), "{name}");
        // The platform's ids stay on the record of the sent reply.
        let sent = store.sent_reply(ids[0]).unwrap().expect("kept");
        assert_eq!(sent.sent_ids, ["556", "557"], "{name}");
        assert!(sent.done_at.is_some() && sent.failed.is_none(), "{name}");
        assert_eq!(store.sent_reply(ids[1]).unwrap().unwrap().sent_ids, ["555"]);
    });
}

#[test]
fn the_parts_of_a_cut_reply_stay_on_its_unsent_row_until_it_is_sent() {
    each_store(|name, store| {
        let id = store
            .queue_outbox_with(reply(A, "one two three"), Vec::new())
            .unwrap();
        store.record_sent_parts(id, &["901".to_owned()]).unwrap();
        let unsent = store.unsent_outbox().unwrap();
        assert_eq!(unsent.len(), 1, "{name}: still unsent");
        assert_eq!(unsent[0].sent_ids, ["901"], "{name}");
        let all: Vec<String> = ["901", "902", "903"].map(str::to_owned).to_vec();
        store.mark_sent(id, &all).unwrap();
        assert_eq!(
            store.sent_reply(id).unwrap().unwrap().sent_ids,
            all,
            "{name}"
        );
        // A row no longer unsent is left as it is.
        store.record_sent_parts(id, &["x".to_owned()]).unwrap();
        assert!(store.unsent_outbox().unwrap().is_empty(), "{name}");
        assert_eq!(
            store.sent_reply(id).unwrap().unwrap().sent_ids,
            all,
            "{name}"
        );
    });
}

#[test]
fn a_reply_marked_sent_with_its_own_message_is_in_the_log_and_done_together() {
    each_store(|name, store| {
        let id = store
            .queue_outbox_with(reply(A, "hello there"), Vec::new())
            .unwrap();
        let own = StoredMessage::from_bot(
            "telegram",
            "parlor",
            "901",
            "hello there",
            Some("7"),
            chrono::Utc::now(),
        );
        store
            .mark_sent_with_own(id, &["901".to_owned()], A, Some(&own))
            .unwrap();
        assert!(store.unsent_outbox().unwrap().is_empty(), "{name}");
        assert_eq!(store.sent_reply(id).unwrap().unwrap().sent_ids, ["901"]);
        let logged = store.get_message(A, "901").unwrap().expect("logged");
        assert_eq!(logged.text, "hello there", "{name}");
        assert_eq!(
            ids(&store.recent_messages(A, 10).unwrap()),
            ["901"],
            "{name}"
        );
        // Marked again (a resend after a restart): the log keeps one copy.
        let again = store
            .queue_outbox_with(reply(A, "hello there"), Vec::new())
            .unwrap();
        store
            .mark_sent_with_own(again, &["901".to_owned()], A, Some(&own))
            .unwrap();
        assert_eq!(
            ids(&store.recent_messages(A, 10).unwrap()),
            ["901"],
            "{name}"
        );
        // Without a platform id nothing is logged, and the reply is still done.
        let quiet = store.queue_outbox_with(reply(B, "x"), Vec::new()).unwrap();
        store.mark_sent_with_own(quiet, &[], B, None).unwrap();
        assert!(store.unsent_outbox().unwrap().is_empty(), "{name}");
        assert!(store.recent_messages(B, 10).unwrap().is_empty(), "{name}");
    });
}

#[test]
fn a_refused_reply_leaves_the_outbox_with_its_reason() {
    each_store(|name, store| {
        let id = store
            .commit_turn(TurnCommit {
                session: A.to_owned(),
                history: None,
                answered: Vec::new(),
                reply: Some(reply(A, "r")),
                summary: None,
                also: Vec::new(),
            })
            .unwrap()
            .expect("queued");
        store.mark_failed(id, "chat not found").unwrap();
        assert!(store.unsent_outbox().unwrap().is_empty(), "{name}");
        let done = store.sent_reply(id).unwrap().expect("kept");
        assert_eq!(done.failed.as_deref(), Some("chat not found"), "{name}");
        assert!(done.sent_ids.is_empty(), "{name}");
    });
}

#[test]
fn a_commit_without_history_leaves_the_history_alone() {
    each_store(|name, store| {
        store.save_history(A, &rich_history()).unwrap();
        let id = store.add_pending(pending_item(A, "/reset")).unwrap();
        store
            .commit_turn(TurnCommit {
                session: A.to_owned(),
                history: None,
                answered: vec![id],
                reply: Some(reply(A, "only admins")),
                summary: None,
                also: Vec::new(),
            })
            .unwrap();
        assert_eq!(store.load_history(A).unwrap(), rich_history(), "{name}");
        assert!(store.pending().unwrap().is_empty(), "{name}");
        assert_eq!(store.unsent_outbox().unwrap().len(), 1, "{name}");
    });
}

#[test]
fn a_turn_appends_its_messages_and_drops_what_the_trim_dropped() {
    each_store(|name, store| {
        // The first turn of a chat: nothing stored yet.
        commit_history(store, A, append(0, lines("a", 4)));
        assert_eq!(texts(&store.load_history(A).unwrap()), range("a", 0, 4));
        commit_history(store, A, append(0, lines("b", 2)));
        let mut expected = range("a", 0, 4);
        expected.extend(range("b", 0, 2));
        assert_eq!(texts(&store.load_history(A).unwrap()), expected, "{name}");

        // Trimmed: the oldest go, the turn's follow.
        commit_history(store, A, append(3, lines("c", 1)));
        let mut expected = vec!["a3".to_owned()];
        expected.extend(range("b", 0, 2));
        expected.push("c0".to_owned());
        assert_eq!(texts(&store.load_history(A).unwrap()), expected, "{name}");

        // Dropping more than is stored drops it all.
        commit_history(store, A, append(100, lines("d", 2)));
        assert_eq!(texts(&store.load_history(A).unwrap()), range("d", 0, 2));
        // Everything dropped and nothing new: empty, and appending starts afresh.
        commit_history(store, A, append(2, Vec::new()));
        assert!(store.load_history(A).unwrap().is_empty(), "{name}");
        commit_history(store, A, append(1, lines("e", 3)));
        assert_eq!(texts(&store.load_history(A).unwrap()), range("e", 0, 3));

        // `/reset` and `save_history` replace; appending continues after a replacement.
        commit_history(store, A, HistoryChange::Replace(Vec::new()));
        assert!(store.load_history(A).unwrap().is_empty(), "{name}");
        store.save_history(A, &lines("f", 3)).unwrap();
        commit_history(store, A, append(1, lines("g", 1)));
        assert_eq!(
            texts(&store.load_history(A).unwrap()),
            ["f1", "f2", "g0"],
            "{name}"
        );
        store.save_history(A, &rich_history()).unwrap();
        assert_eq!(store.load_history(A).unwrap(), rich_history(), "{name}");
        commit_history(store, A, HistoryChange::Replace(lines("h", 2)));
        assert_eq!(texts(&store.load_history(A).unwrap()), range("h", 0, 2));

        // Other sessions (one a prefix of this one's key) are untouched throughout.
        assert!(store.load_history(B).unwrap().is_empty(), "{name}");
        assert!(store.load_history("telegram:-10").unwrap().is_empty());
    });
}

#[test]
fn a_migration_puts_the_old_chats_appended_history_before_the_new_chats() {
    each_store(|name, store| {
        commit_history(store, OLD, append(0, lines("old", 3)));
        commit_history(store, OLD, append(1, lines("old-b", 1)));
        commit_history(store, NEW, append(0, lines("new", 2)));
        assert!(
            store
                .migrate_session(&old_chat(), &new_chat(), vec![])
                .unwrap()
        );
        let mut expected = vec!["old1", "old2", "old-b0", "new0", "new1"];
        assert_eq!(texts(&store.load_history(NEW).unwrap()), expected, "{name}");
        assert!(store.load_history(OLD).unwrap().is_empty(), "{name}");
        // The moved history goes on as any other.
        commit_history(store, NEW, append(2, lines("after", 1)));
        expected.drain(..2);
        expected.push("after0");
        assert_eq!(texts(&store.load_history(NEW).unwrap()), expected, "{name}");
        // A late turn of the old chat starts a history of its own there.
        commit_history(store, OLD, append(5, lines("late", 1)));
        assert_eq!(texts(&store.load_history(OLD).unwrap()), ["late0"]);
    });
}

#[test]
fn record_inbound_records_and_makes_pending_together_or_not_at_all() {
    each_store(|name, store| {
        let first = store
            .record_inbound(A, &msg("1"), Intake::Pending(pending_item(A, "hi")))
            .unwrap();
        let Inbound::Recorded(Some(id)) = first else {
            panic!("{name}: {first:?}");
        };
        assert_eq!(store.pending().unwrap()[0].id, id, "{name}");
        assert_eq!(store.get_message(A, "1").unwrap(), Some(msg("1")), "{name}");
        // A redelivery writes nothing: no second pending record.
        let again = store
            .record_inbound(A, &msg("1"), Intake::Pending(pending_item(A, "hi")))
            .unwrap();
        assert_eq!(again, Inbound::Duplicate, "{name}");
        assert_eq!(store.pending().unwrap().len(), 1, "{name}");
        // A command's answer is queued with its record.
        let answered = store
            .record_inbound(A, &msg("2"), Intake::Reply(reply(A, "help text")))
            .unwrap();
        let Inbound::Recorded(Some(out)) = answered else {
            panic!("{name}: {answered:?}");
        };
        assert_eq!(store.unsent_outbox().unwrap()[0].id, out, "{name}");
        assert_eq!(
            store.record_inbound(A, &msg("3"), Intake::Record).unwrap(),
            Inbound::Recorded(None),
            "{name}"
        );
        assert_eq!(store.recent_messages(A, 10).unwrap().len(), 3, "{name}");
    });
}

#[test]
fn add_pending_with_writes_the_toolset_records_too() {
    each_store(|name, store| {
        store.kv_put("tasks", "gone", "old").unwrap();
        let id = store
            .add_pending_with(
                pending_item(A, "notice"),
                vec![
                    KvWrite {
                        space: "tasks".to_owned(),
                        key: "t1".to_owned(),
                        value: Some("{\"notified\":true}".to_owned()),
                        if_unchanged: None,
                    },
                    KvWrite {
                        space: "tasks".to_owned(),
                        key: "gone".to_owned(),
                        value: None,
                        if_unchanged: None,
                    },
                ],
            )
            .unwrap();
        assert_eq!(store.pending().unwrap()[0].id, id, "{name}");
        assert_eq!(
            store.kv_get("tasks", "t1").unwrap().as_deref(),
            Some("{\"notified\":true}"),
            "{name}"
        );
        assert_eq!(store.kv_get("tasks", "gone").unwrap(), None, "{name}");
    });
}

#[test]
fn queue_outbox_with_writes_the_row_and_its_records_together() {
    each_store(|name, store| {
        let first = store
            .queue_outbox_with(
                reply(A, "said in an auto-chat turn"),
                vec![kv("auto_chat", A, Some("{\"v\":1}"))],
            )
            .unwrap();
        let second = store.queue_outbox_with(reply(A, "again"), vec![]).unwrap();
        assert!(second > first, "{name}");
        let unsent = store.unsent_outbox().unwrap();
        let texts: Vec<(u64, &str)> = unsent.iter().map(|e| (e.id, e.text.as_str())).collect();
        assert_eq!(
            texts,
            [(first, "said in an auto-chat turn"), (second, "again")],
            "{name}"
        );
        assert_eq!(
            store.kv_get("auto_chat", A).unwrap().as_deref(),
            Some("{\"v\":1}"),
            "{name}"
        );
        assert!(
            store
                .queue_outbox_with(reply("bad\0key", "x"), vec![])
                .is_err(),
            "{name}"
        );
    });
}

#[test]
fn collections_get_put_delete_and_scan_by_prefix() {
    each_store(|name, store| {
        assert_eq!(store.kv_get("memory", "a\u{1}x").unwrap(), None, "{name}");
        store.kv_put("memory", "telegram:-1\u{1}b", "2").unwrap();
        store.kv_put("memory", "telegram:-1\u{1}a", "1").unwrap();
        store
            .kv_put("memory", "telegram:-10\u{1}a", "other chat")
            .unwrap();
        store
            .kv_put("clocks", "telegram:-1\u{1}a", "other space")
            .unwrap();
        store.kv_put("memory", "telegram:-1\u{1}a", "1b").unwrap();
        assert_eq!(
            store.kv_scan("memory", "telegram:-1\u{1}").unwrap(),
            [
                ("telegram:-1\u{1}a".to_owned(), "1b".to_owned()),
                ("telegram:-1\u{1}b".to_owned(), "2".to_owned())
            ],
            "{name}"
        );
        assert!(
            store.kv_delete("memory", "telegram:-1\u{1}b").unwrap(),
            "{name}"
        );
        assert!(
            !store.kv_delete("memory", "telegram:-1\u{1}b").unwrap(),
            "{name}"
        );
        assert_eq!(
            store
                .kv_get("clocks", "telegram:-1\u{1}a")
                .unwrap()
                .as_deref(),
            Some("other space"),
            "{name}"
        );
        assert_eq!(store.kv_scan("memory", "").unwrap().len(), 2, "{name}");
    });
}

#[test]
fn meta_get_set() {
    each_store(|name, store| {
        assert_eq!(store.get_meta("telegram.offset").unwrap(), None, "{name}");
        store.set_meta("telegram.offset", "41").unwrap();
        store.set_meta("telegram.offset", "42").unwrap();
        store.set_meta("other", "").unwrap();
        assert_eq!(
            store.get_meta("telegram.offset").unwrap().as_deref(),
            Some("42"),
            "{name}"
        );
        assert_eq!(store.get_meta("other").unwrap().as_deref(), Some(""));
        store.flush().unwrap();
    });
}

#[test]
fn concurrent_recording_in_different_sessions() {
    let options = StoreOptions {
        max_messages_per_chat: 50,
        ..StoreOptions::default()
    };
    each_store_with(options, |name, store| {
        std::thread::scope(|scope| {
            for t in 0..8 {
                scope.spawn(move || {
                    let session = format!("console:t{t}");
                    for i in 0..100 {
                        let m = msg(&format!("{i}"));
                        assert!(store.record_message(&session, &m).unwrap());
                        // A duplicate right away is refused.
                        assert!(!store.record_message(&session, &m).unwrap());
                    }
                });
            }
        });
        for t in 0..8 {
            let session = format!("console:t{t}");
            let recent = store.recent_messages(&session, 1000).unwrap();
            let expected: Vec<String> = (50..100).map(|i| i.to_string()).collect();
            assert_eq!(ids(&recent), expected, "{name} {session}");
            assert_eq!(store.get_message(&session, "49").unwrap(), None, "{name}");
        }
    });
}

// ---- sled only ---------------------------------------------------------------------------

#[test]
fn sled_state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (p1, p2, outbox_id) = {
        let store = open(dir.path());
        store.record_message(A, &msg("1")).unwrap();
        store.record_message(A, &msg("2")).unwrap();
        let p1 = store.add_pending(pending_item(A, "one")).unwrap();
        let p2 = store.add_pending(pending_item(B, "two")).unwrap();
        let outbox_id = store
            .commit_turn(TurnCommit {
                session: A.to_owned(),
                history: Some(append(0, rich_history())),
                answered: vec![p1],
                reply: Some(reply(A, "hello")),
                summary: None,
                also: Vec::new(),
            })
            .unwrap()
            .unwrap();
        store.set_meta("telegram.offset", "7").unwrap();
        store.flush().unwrap();
        (p1, p2, outbox_id)
    };

    let store = open(dir.path());
    // Dedupe index and log.
    assert!(!store.record_message(A, &msg("1")).unwrap());
    assert!(store.record_message(A, &msg("3")).unwrap());
    assert_eq!(ids(&store.recent_messages(A, 10).unwrap()), ["1", "2", "3"]);
    // Pending: the answered one is gone, the other is there to resume.
    let pending = store.pending().unwrap();
    assert_eq!(pending.iter().map(|p| p.id).collect::<Vec<_>>(), [p2]);
    // Unsent outbox, history and meta.
    let unsent = store.unsent_outbox().unwrap();
    assert_eq!(unsent.len(), 1);
    assert_eq!(
        (unsent[0].id, unsent[0].text.as_str()),
        (outbox_id, "hello")
    );
    assert_eq!(store.load_history(A).unwrap(), rich_history());
    assert_eq!(
        store.get_meta("telegram.offset").unwrap().as_deref(),
        Some("7")
    );
    // Ids keep increasing across the restart.
    let p3 = store.add_pending(pending_item(A, "three")).unwrap();
    assert!(p3 > p2 && p3 > outbox_id && p2 > p1);
}

#[test]
fn sled_drop_without_flush_still_persists() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        store.add_pending(pending_item(A, "one")).unwrap();
    }
    assert_eq!(open(dir.path()).pending().unwrap().len(), 1);
}

/// Many threads flushing at once, each right after its own write (the flushing thread
/// writes sled's buffer itself: vendor/sled/PARLOR.md). The files are copied while the
/// store is still open and never dropped, as a `kill -9` leaves them, and the copy holds
/// every write whose flush returned.
#[test]
fn sled_flushes_from_many_threads_cover_each_writer_as_a_kill_leaves_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    std::thread::scope(|scope| {
        for t in 0..8 {
            let store = &store;
            scope.spawn(move || {
                let session = format!("console:t{t}");
                for i in 0..40 {
                    assert!(
                        store
                            .record_message(&session, &msg(&format!("{i}")))
                            .unwrap()
                    );
                    store.flush().unwrap();
                }
            });
        }
    });
    let copy = tempfile::tempdir().unwrap();
    parlor_bot::testing::copy_dir(dir.path(), copy.path());
    // Not dropped: sled's drop would flush once more.
    std::mem::forget(store);
    let reopened = open(copy.path());
    for t in 0..8 {
        let recent = reopened
            .recent_messages(&format!("console:t{t}"), 100)
            .unwrap();
        let expected: Vec<String> = (0..40).map(|i| i.to_string()).collect();
        assert_eq!(ids(&recent), expected, "thread {t}");
    }
}

#[test]
fn sled_a_lower_bound_after_restart_trims_on_the_next_record() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        for i in 0..10 {
            store.record_message(A, &msg(&format!("m{i}"))).unwrap();
        }
    }
    let options = StoreOptions {
        max_messages_per_chat: 4,
        ..StoreOptions::default()
    };
    let store = SledStore::open(dir.path(), options).unwrap();
    assert!(store.record_message(A, &msg("m10")).unwrap());
    let recent = store.recent_messages(A, 100).unwrap();
    assert_eq!(ids(&recent), ["m7", "m8", "m9", "m10"]);
    assert!(
        store.record_message(A, &msg("m0")).unwrap(),
        "m0 was dropped"
    );
}

#[test]
fn sled_second_open_of_the_same_dir_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let _first = open(dir.path());
    let impatient = StoreOptions {
        lock_timeout: Duration::from_millis(100),
        ..StoreOptions::default()
    };
    let start = Instant::now();
    let err = SledStore::open(dir.path(), impatient).unwrap_err();
    assert!(
        start.elapsed() >= Duration::from_millis(100),
        "retried first"
    );
    match &err {
        StoreError::Locked(path) => assert_eq!(path, &dir.path().display().to_string()),
        other => panic!("expected Locked, got {other:?}"),
    }
    assert!(err.to_string().contains("in use by another parlor process"));
}

/// sled lets go of its file lock a moment after the last handle is dropped; `open` waits
/// for it (up to `lock_timeout`), so a restart in the same process works.
#[test]
fn sled_open_waits_for_a_lock_being_released() {
    let dir = tempfile::tempdir().unwrap();
    let first = open(dir.path());
    first.set_meta("k", "v").unwrap();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(first);
    });
    let second = open(dir.path());
    assert_eq!(second.get_meta("k").unwrap().as_deref(), Some("v"));
    holder.join().unwrap();
}

/// Opens the database with sled itself, waiting (like `SledStore::open`) for a lock that a
/// just-dropped handle has not released yet.
fn raw_open(dir: &Path) -> sled::Db {
    let start = Instant::now();
    loop {
        match sled::open(dir) {
            Ok(db) => return db,
            Err(_) if start.elapsed() < Duration::from_secs(2) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("cannot open {}: {e}", dir.display()),
        }
    }
}

/// Writes raw `(tree, key, value)`s with sled itself, as an older or newer parlor might.
fn write_raw(dir: &Path, entries: &[(&str, &[u8], &[u8])]) {
    let db = raw_open(dir);
    for (tree, key, value) in entries {
        db.open_tree(tree).unwrap().insert(key, *value).unwrap();
    }
    db.flush().unwrap();
}

#[test]
fn sled_unknown_version_is_corrupt_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    write_raw(
        dir.path(),
        &[
            ("history", A.as_bytes(), br#"{"v":2,"messages":[]}"#),
            (
                "pending",
                &7u64.to_be_bytes(),
                br#"{"v":99,"whatever":true}"#,
            ),
            ("meta", b"k", br#"{"value":"no version"}"#),
            ("outbox", &3u64.to_be_bytes(), b"not json"),
        ],
    );
    let store = open(dir.path());

    let err = store.load_history(A).unwrap_err();
    match &err {
        StoreError::Corrupt { key, reason } => {
            assert_eq!(key, &format!("history[{A}]"));
            assert!(reason.contains("unknown schema version 2"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let err = store.pending().unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt { key, reason }
            if key == "pending[7]" && reason.contains("version 99")),
        "{err:?}"
    );
    let err = store.get_meta("k").unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt { key, reason }
            if key == "meta[k]" && reason.contains("no schema version")),
        "{err:?}"
    );
    let err = store.unsent_outbox().unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt { key, reason }
            if key == "outbox[3]" && reason.contains("invalid JSON")),
        "{err:?}"
    );
    // Other keys are unaffected.
    assert!(store.load_history(B).unwrap().is_empty());
}

#[test]
fn sled_values_are_versioned_json() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        store.record_message(A, &msg("1")).unwrap();
        store.save_history(A, &[Message::user("hi")]).unwrap();
        commit_history(&store, A, append(0, vec![Message::assistant("hello")]));
    }
    let db = raw_open(dir.path());
    let key = |seq: u64| {
        let mut key = format!("{A}\0").into_bytes();
        key.extend_from_slice(&seq.to_be_bytes());
        key
    };
    let json = |bytes: &[u8]| serde_json::from_slice::<serde_json::Value>(bytes).unwrap();
    // History: one record per message in parlor's own form (version 2), and a head saying
    // which are there.
    let history: Vec<_> = db
        .open_tree("history_messages")
        .unwrap()
        .iter()
        .map(|entry| {
            let (k, v) = entry.unwrap();
            (k.to_vec(), json(&v))
        })
        .collect();
    assert_eq!(
        history,
        [
            (
                key(0),
                serde_json::json!({"v": 2, "kind": "input", "text": "hi"})
            ),
            (
                key(1),
                serde_json::json!({"v": 2, "kind": "answer", "text": "hello"})
            ),
        ]
    );
    let head = db
        .open_tree("history_heads")
        .unwrap()
        .get(A)
        .unwrap()
        .unwrap();
    assert_eq!(
        json(&head),
        serde_json::json!({"v": 1, "first": 0, "next": 2})
    );
    assert!(db.open_tree("history").unwrap().is_empty());
    let messages = db.open_tree("messages").unwrap();
    let (k, value) = messages.iter().next().unwrap().unwrap();
    assert_eq!(k.as_ref(), key(0).as_slice());
    let value = json(&value);
    assert_eq!(value["v"], 1);
    assert_eq!(value["message_id"], "1");
}

/// A history as releases before the per-message layout stored it: one `history` record.
fn write_old_history(dir: &Path, session: &str, history: &[Message]) {
    let value = serde_json::to_vec(&serde_json::json!({"v": 1, "messages": history})).unwrap();
    write_raw(dir, &[("history", session.as_bytes(), &value)]);
}

#[test]
fn sled_migrates_a_history_of_the_old_format_when_it_opens() {
    let dir = tempfile::tempdir().unwrap();
    write_old_history(dir.path(), A, &rich_history());
    write_old_history(dir.path(), B, &lines("b", 3));
    write_old_history(dir.path(), OLD, &lines("old", 2));
    {
        let store = open(dir.path());
        assert_eq!(store.load_history(A).unwrap(), rich_history());
        // Opening wrote it out as messages; a turn appends to those.
        commit_history(&store, A, append(1, lines("new", 1)));
        let mut expected = rich_history()[1..].to_vec();
        expected.extend(lines("new", 1));
        assert_eq!(store.load_history(A).unwrap(), expected);
        // A replacement (`/reset`) drops it.
        store.save_history(B, &[]).unwrap();
        assert!(store.load_history(B).unwrap().is_empty());
        // A migration moves it before the new chat's history.
        commit_history(&store, NEW, append(0, lines("new", 1)));
        assert!(
            store
                .migrate_session(&old_chat(), &new_chat(), vec![])
                .unwrap()
        );
        assert_eq!(
            texts(&store.load_history(NEW).unwrap()),
            ["old0", "old1", "new0"]
        );
        store.flush().unwrap();
    }
    {
        let db = raw_open(dir.path());
        assert!(db.open_tree("history").unwrap().is_empty(), "converted");
    }
    let store = open(dir.path());
    let mut expected = rich_history()[1..].to_vec();
    expected.extend(lines("new", 1));
    assert_eq!(store.load_history(A).unwrap(), expected);
    assert!(store.load_history(B).unwrap().is_empty());
    assert!(store.load_history(OLD).unwrap().is_empty());
    assert_eq!(
        texts(&store.load_history(NEW).unwrap()),
        ["old0", "old1", "new0"]
    );
}

/// History messages as releases up to a271e69 wrote them (OpenAI's wire JSON, version 1),
/// one of them already in the new form as a migration cut off by a kill leaves it: opening
/// reads both and writes every one in parlor's own form, once.
#[test]
fn sled_migrates_history_messages_in_the_wire_form_to_its_own_form_once() {
    let dir = tempfile::tempdir().unwrap();
    let key = |seq: u64| {
        let mut key = format!("{A}\0").into_bytes();
        key.extend_from_slice(&seq.to_be_bytes());
        key
    };
    let (k0, k1, k2) = (key(0), key(1), key(2));
    write_raw(
        dir.path(),
        &[
            ("history_heads", A.as_bytes(), br#"{"v":1,"first":0,"next":3}"#),
            (
                "history_messages",
                &k0,
                br#"{"v":1,"message":{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_ref","image":{"file_id":"f1"},"message_id":"9"}]}}"#,
            ),
            (
                "history_messages",
                &k1,
                br#"{"v":1,"message":{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"time_now","arguments":"{}"}}]}}"#,
            ),
            (
                "history_messages",
                &k2,
                br#"{"v":2,"kind":"tool_result","call_id":"c1","text":"noon"}"#,
            ),
        ],
    );
    let expected = vec![
        Message::User {
            content: Content::Parts(vec![
                ContentPart::Text {
                    text: "look".into(),
                },
                ContentPart::ImageRef {
                    image: ImageRef {
                        file_id: "f1".into(),
                        mime_type: None,
                        size: None,
                    },
                    message_id: Some("9".into()),
                },
            ]),
        },
        Message::Assistant {
            content: None,
            tool_calls: vec![ToolCall::new("c1", "time_now", "{}")],
            thinking: Vec::new(),
            model: None,
        },
        Message::tool("c1", "noon"),
    ];
    {
        let store = open(dir.path());
        assert_eq!(store.load_history(A).unwrap(), expected);
        assert_eq!(
            store.get_meta("schema.history").unwrap().as_deref(),
            Some("2")
        );
        store.flush().unwrap();
    }
    {
        let db = raw_open(dir.path());
        for entry in db.open_tree("history_messages").unwrap().iter() {
            let (_, value) = entry.unwrap();
            let value: serde_json::Value = serde_json::from_slice(&value).unwrap();
            assert_eq!(value["v"], 2, "{value}");
            assert!(value.get("message").is_none(), "{value}");
        }
    }
    assert_eq!(open(dir.path()).load_history(A).unwrap(), expected);
}

#[test]
fn sled_an_appended_history_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        for turn in 0..5 {
            commit_history(&store, A, append(1, lines(&format!("t{turn}-"), 2)));
        }
        store.flush().unwrap();
    }
    let store = open(dir.path());
    // Each turn dropped one message and added two.
    assert_eq!(
        texts(&store.load_history(A).unwrap()),
        ["t2-0", "t2-1", "t3-0", "t3-1", "t4-0", "t4-1"]
    );
    commit_history(&store, A, append(5, Vec::new()));
    assert_eq!(texts(&store.load_history(A).unwrap()), ["t4-1"]);
}

#[test]
fn kv_writes_land_together_or_not_at_all() {
    each_store(|name, store| {
        store
            .kv_write(vec![
                kv("jobs", "s|1", Some("ended")),
                kv("usage_pending", "s|1", Some("spent")),
            ])
            .unwrap();
        assert_eq!(
            store.kv_get("jobs", "s|1").unwrap().as_deref(),
            Some("ended"),
            "{name}"
        );
        assert_eq!(
            store.kv_get("usage_pending", "s|1").unwrap().as_deref(),
            Some("spent"),
            "{name}"
        );
        // A conditional write that finds its record changed refuses the others too.
        let refused = store.kv_write(vec![
            kv("usage_pending", "s|1", None),
            KvWrite {
                if_unchanged: Some(None),
                ..kv("jobs", "s|1", Some("again"))
            },
        ]);
        assert!(
            matches!(refused, Err(StoreError::Changed(_))),
            "{name}: {refused:?}"
        );
        assert_eq!(
            store.kv_get("jobs", "s|1").unwrap().as_deref(),
            Some("ended"),
            "{name}"
        );
        assert!(
            store.kv_get("usage_pending", "s|1").unwrap().is_some(),
            "{name}"
        );
    });
}
