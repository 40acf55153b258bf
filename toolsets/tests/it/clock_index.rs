//! The clock's in-memory index of the tasks, with paused time: after create, update,
//! delete, fires, pauses, a removal from a chat and a chat's migration it agrees with the
//! store (`ClockHandle::index_mismatches`), and the service and the cap act on it; a fresh
//! handle on the same store starts from what the last one left; a due entry whose record
//! changed behind the handle's back is filed anew, never fired as it was.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use parlor_bot::platform::{ChatEvent, ChatRef, Inbox, Sender};
use parlor_bot::session::ChatHook;
use parlor_bot::store::{MemoryStore, Store};
use parlor_toolsets::clock::{
    ClockChatHook, ClockError, ClockHandle, ClockOptions, ClockPatch, WallTime,
};

use crate::support::clock::*;
use crate::support::new_clock;

fn create(handle: &ClockHandle, name: &str, schedule: &str, target: ChatRef) -> u64 {
    handle.create(new_clock(name, schedule, target)).unwrap().id
}

fn refused(handle: &ClockHandle, name: &str, schedule: &str, target: ChatRef) -> bool {
    matches!(
        handle.create(new_clock(name, schedule, target)),
        Err(ClockError::Limit(_))
    )
}

fn pause(handle: &ClockHandle, id: u64, enabled: bool) -> Result<(), ClockError> {
    let patch = ClockPatch {
        enabled: Some(enabled),
        ..ClockPatch::default()
    };
    handle.update(id, patch).map(drop)
}

/// The index agrees with the store.
fn agrees(handle: &ClockHandle) {
    assert_eq!(handle.index_mismatches().unwrap(), Vec::<String>::new());
}

fn rfc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// `(wall time, chat id, task name)` of every post, in time order.
fn posts(rig: &Rig) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = rig
        .platform
        .sent()
        .iter()
        .map(|p| {
            let name = p.text.split('"').nth(1).unwrap_or("?").to_owned();
            (rfc(p.wall), p.chat.chat_id.clone(), name)
        })
        .collect();
    out.sort();
    out
}

fn post(wall: &str, chat: &str, name: &str) -> (String, String, String) {
    (format!("2026-06-01T{wall}Z"), chat.into(), name.into())
}

fn admin() -> Sender {
    Sender {
        id: "test:owner".into(),
        name: "Owner".into(),
        username: None,
        is_bot: false,
    }
}

struct Life {
    store: Arc<MemoryStore>,
    clock: WallTime,
}

fn life() -> Life {
    Life {
        store: Arc::new(MemoryStore::new()),
        clock: WallTime::anchored_at(utc("2026-06-01T08:00:00Z")),
    }
}

impl Life {
    /// A rig whose chats hold at most `cap` tasks each, with the clock's chat hook.
    async fn rig(&self, prefix: &str, cap: usize) -> Rig {
        let options = ClockOptions {
            max_tasks_per_chat: cap,
            ..options(&self.clock)
        };
        let rig = Rig::start(
            self.store.clone(),
            platform(&self.clock, prefix),
            model(),
            options,
        )
        .await;
        rig.manager
            .add_chat_hook(Arc::new(ClockChatHook::new(rig.handle.clone())));
        rig
    }

    async fn until(&self, hh_mm_ss: &str) {
        sleep_until_wall(&self.clock, utc(&format!("2026-06-01T{hh_mm_ss}Z"))).await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_index_follows_create_update_delete_and_fires() {
    let life = life();
    let rig = life.rig("m", 20).await;
    let h = &rig.handle;
    create(h, "once", "2026-06-01T08:01:00Z", group_a());
    let tick = create(h, "tick", "every 1m", group_a());
    let later = create(h, "later", "2026-06-01T08:10:00Z", group_b());
    let gone = create(h, "gone", "2026-06-01T08:02:00Z", group_a());
    agrees(h);
    h.delete(gone).unwrap();
    agrees(h);
    let retime = ClockPatch {
        schedule: Some("2026-06-01T08:03:00Z".into()),
        ..ClockPatch::default()
    };
    h.update(later, retime).unwrap();
    agrees(h);
    pause(h, tick, false).unwrap();
    agrees(h);

    life.until("08:02:30").await;
    assert_eq!(posts(&rig), [post("08:01:00", "-100", "once")]);
    // The one-shot left the index when it fired.
    agrees(h);

    let resume_elsewhere = ClockPatch {
        enabled: Some(true),
        target: Some(group_b()),
        ..ClockPatch::default()
    };
    h.update(tick, resume_elsewhere).unwrap();
    agrees(h);
    life.until("08:04:30").await;
    assert_eq!(
        posts(&rig),
        [
            post("08:01:00", "-100", "once"),
            post("08:03:00", "-200", "later"),
            post("08:03:00", "-200", "tick"),
            post("08:04:00", "-200", "tick"),
        ]
    );
    agrees(h);
    assert!(rig.runs(gone).is_empty());
    rig.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_cap_counts_every_task_through_pause_resume_move_delete_and_fire() {
    let life = life();
    let rig = life.rig("m", 2).await;
    let h = &rig.handle;
    let first = create(h, "first", "2026-06-01T08:01:00Z", group_a());
    let second = create(h, "second", "every 1h", group_a());
    assert!(refused(h, "third", "every 1h", group_a()));
    // Another topic of the same chat is its own session, with its own cap.
    let topic = ChatRef {
        thread_id: Some("7".into()),
        ..group_a()
    };
    create(h, "topic", "every 1h", topic);

    // Pausing is no way past the cap; resuming changes no count.
    pause(h, second, false).unwrap();
    assert!(refused(h, "third", "every 1h", group_a()));
    pause(h, second, true).unwrap();
    agrees(h);

    // Moving a task moves its place.
    let move_second = ClockPatch {
        target: Some(group_b()),
        ..ClockPatch::default()
    };
    h.update(second, move_second).unwrap();
    let third = create(h, "third", "every 1h", group_a());
    assert!(refused(h, "fourth", "every 1h", group_a()));
    let back = ClockPatch {
        target: Some(group_a()),
        ..ClockPatch::default()
    };
    assert!(matches!(h.update(second, back), Err(ClockError::Limit(_))));
    agrees(h);

    // A one-shot that fired keeps its place until it is deleted.
    life.until("08:01:30").await;
    assert_eq!(posts(&rig), [post("08:01:00", "-100", "first")]);
    assert!(refused(h, "fourth", "every 1h", group_a()));
    h.delete(first).unwrap();
    let fourth = create(h, "fourth", "every 1h", group_a());
    assert!(refused(h, "fifth", "every 1h", group_a()));
    h.delete(fourth).unwrap();
    h.delete(third).unwrap();
    create(h, "fifth", "every 1h", group_a());
    agrees(h);
    assert!(rig.runs(first).is_empty(), "its log went with it");
    rig.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_removal_pauses_what_the_index_would_fire_and_keeps_the_cap() {
    let life = life();
    let rig = life.rig("m", 2).await;
    let h = &rig.handle;
    let x = create(h, "x", "2026-06-01T08:01:00Z", group_a());
    let y = create(h, "y", "every 1m", group_a());
    create(h, "z", "2026-06-01T08:01:00Z", group_b());
    rig.manager
        .chat_event(ChatEvent::Removed {
            chat: group_a(),
            status: "kicked".into(),
            by: admin(),
            time: utc("2026-06-01T08:00:10Z"),
        })
        .await
        .unwrap();

    // Paused, they still count toward the cap, before any pass of the service.
    assert!(refused(h, "x2", "every 1h", group_a()));
    agrees(h);

    life.until("08:02:30").await;
    assert_eq!(posts(&rig), [post("08:01:00", "-200", "z")]);
    assert!(rig.runs(x).is_empty());
    assert!(rig.runs(y).is_empty());
    agrees(h);
    rig.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_migration_moves_the_indexed_tasks_and_their_cap_to_the_new_chat() {
    let life = life();
    let rig = life.rig("m", 2).await;
    let h = &rig.handle;
    let new = ChatRef::new("test", "-1000100");
    create(h, "m1", "every 1m", group_a());
    let m2 = create(h, "m2", "2026-06-01T08:02:00Z", group_a());
    rig.manager
        .chat_event(ChatEvent::Migrated {
            from: group_a(),
            to: new.clone(),
        })
        .await
        .unwrap();

    assert!(refused(h, "full", "every 1h", new.clone()));
    create(h, "old chat", "2026-06-01T08:05:00Z", group_a());
    agrees(h);
    life.until("08:02:30").await;
    assert_eq!(
        posts(&rig),
        [
            post("08:01:00", "-1000100", "m1"),
            post("08:02:00", "-1000100", "m1"),
            post("08:02:00", "-1000100", "m2"),
        ]
    );
    // m2 fired and keeps its place until it is deleted.
    assert!(refused(h, "full", "every 1h", new.clone()));
    h.delete(m2).unwrap();
    create(h, "room", "every 1h", new.clone());
    assert!(refused(h, "full", "every 1h", new));
    agrees(h);
    rig.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_hook_write_counts_once_it_is_in_the_store_and_not_before() {
    let life = life();
    let rig = life.rig("m", 20).await;
    let h = &rig.handle;
    let hook = ClockChatHook::new(h.clone());
    create(h, "t", "2026-06-01T08:01:00Z", group_a());
    // The event's transaction failed: its writes never reach the store, the task fires.
    let lost = hook
        .on_removed(life.store.as_ref(), &group_a(), "kicked")
        .unwrap();
    assert_eq!(lost.writes.len(), 1);
    agrees(h);
    life.until("08:01:30").await;
    assert_eq!(posts(&rig), [post("08:01:00", "-100", "t")]);

    // This time the transaction lands (after the hook returned, as in the session layer).
    let u = create(h, "u", "2026-06-01T08:03:00Z", group_a());
    let removal = hook
        .on_removed(life.store.as_ref(), &group_a(), "kicked")
        .unwrap();
    for write in removal.writes {
        let value = write.value.unwrap();
        life.store.kv_put(&write.space, &write.key, &value).unwrap();
    }
    life.until("08:03:30").await;
    assert_eq!(posts(&rig).len(), 1);
    assert!(rig.runs(u).is_empty());
    assert!(!h.task(u).unwrap().unwrap().enabled);
    agrees(h);
    rig.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_due_entry_whose_record_is_gone_or_changed_is_filed_anew_not_fired() {
    let life = life();
    let rig = life.rig("m", 20).await;
    let h = &rig.handle;
    let gone = create(h, "gone", "2026-06-01T08:01:00Z", group_a());
    let later = create(h, "later", "2026-06-01T08:01:00Z", group_a());
    let off = create(h, "off", "2026-06-01T08:01:00Z", group_a());
    // Behind the handle's back, straight in the store.
    let store = &life.store;
    let record = |id: u64| -> serde_json::Value {
        serde_json::from_str(&store.kv_get("clocks", &id.to_string()).unwrap().unwrap()).unwrap()
    };
    store.kv_delete("clocks", &gone.to_string()).unwrap();
    let mut moved = record(later);
    moved["next_fire"] = "2026-06-01T08:03:00Z".into();
    store
        .kv_put("clocks", &later.to_string(), &moved.to_string())
        .unwrap();
    let mut disabled = record(off);
    disabled["enabled"] = false.into();
    disabled["next_fire"] = serde_json::Value::Null;
    store
        .kv_put("clocks", &off.to_string(), &disabled.to_string())
        .unwrap();

    life.until("08:01:30").await;
    assert!(posts(&rig).is_empty());
    agrees(h);
    life.until("08:03:30").await;
    assert_eq!(posts(&rig), [post("08:03:00", "-100", "later")]);
    assert!(rig.runs(off).is_empty());
    agrees(h);
    rig.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_fresh_handle_on_the_same_store_starts_from_what_the_last_one_left() {
    let life = life();
    let first = life.rig("first", 2).await;
    create(&first.handle, "r1", "every 1m", group_a());
    create(&first.handle, "r2", "2026-06-01T08:05:00Z", group_a());
    let r3 = create(&first.handle, "r3", "2026-06-01T08:02:00Z", group_b());
    pause(&first.handle, r3, false).unwrap();
    life.until("08:01:30").await;
    assert_eq!(posts(&first), [post("08:01:00", "-100", "r1")]);
    first.stop().await;

    let second = life.rig("second", 2).await;
    agrees(&second.handle);
    assert!(refused(&second.handle, "r4", "every 1h", group_a()));
    life.until("08:05:30").await;
    assert_eq!(
        posts(&second),
        [
            post("08:02:00", "-100", "r1"),
            post("08:03:00", "-100", "r1"),
            post("08:04:00", "-100", "r1"),
            post("08:05:00", "-100", "r1"),
            post("08:05:00", "-100", "r2"),
        ]
    );
    agrees(&second.handle);
    second.stop().await;
}

/// A hook that changes clock task `id` the first time a chat moves, after the clock's hook
/// has read the tasks and before the event's transaction: a tool's update (or a fire)
/// landing in that gap.
struct WriteInTheGap {
    handle: ClockHandle,
    id: u64,
    calls: std::sync::atomic::AtomicUsize,
}

impl ChatHook for WriteInTheGap {
    fn on_migrate(
        &self,
        _store: &dyn Store,
        _from: &ChatRef,
        _to: &ChatRef,
    ) -> Result<Vec<parlor_bot::store::KvWrite>, parlor_bot::store::StoreError> {
        if self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            let patch = ClockPatch {
                name: Some("renamed in the gap".into()),
                ..ClockPatch::default()
            };
            self.handle.update(self.id, patch).unwrap();
        }
        Ok(Vec::new())
    }
}

#[tokio::test(start_paused = true)]
async fn a_write_between_a_hooks_read_and_its_transaction_is_not_undone() {
    let life = life();
    let rig = life.rig("m", 20).await;
    let h = &rig.handle;
    let id = create(h, "tick", "every 1m", group_a());
    let gap = Arc::new(WriteInTheGap {
        handle: h.clone(),
        id,
        calls: 0.into(),
    });
    rig.manager.add_chat_hook(gap.clone());
    let new = ChatRef::new("test", "-1000100");
    rig.manager
        .chat_event(ChatEvent::Migrated {
            from: group_a(),
            to: new.clone(),
        })
        .await
        .unwrap();
    // The clock hook's stale copy was refused and read again: both changes are kept.
    assert_eq!(gap.calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    let task = h.task(id).unwrap().unwrap();
    assert_eq!(task.name, "renamed in the gap");
    assert_eq!(task.target, new);
    agrees(h);
    life.until("08:01:30").await;
    assert_eq!(
        posts(&rig),
        [post("08:01:00", "-1000100", "renamed in the gap")]
    );
    rig.stop().await;
}
