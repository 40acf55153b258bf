//! [`TaskIndex`]: the tasks in memory, the enabled ones by next fire time and every one by
//! target chat, so that a pass of the service reads from the store only the tasks that are
//! due, the earliest due time is a lookup and the per-chat cap is a count. The cap counts
//! paused and finished tasks too: pausing must not be a way past it. The store stays the truth: the
//! [`ClockHandle`](super::ClockHandle) files a task here only after its write landed, and
//! re-reads a task whose entry it is about to act on.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};

use super::task::ClockTask;
use parlor_bot::platform::ChatRef;

/// What the index keeps of a task.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// When it fires next; `None` for a paused or finished task, and for an enabled one
    /// without a next fire (a record written by hand): it counts toward its chat's cap but
    /// never fires, as the store scan had it.
    next_fire: Option<DateTime<Utc>>,
    /// The chat whose cap it counts toward.
    target: ChatRef,
}

/// The tasks, as the store had them after the last write the handle saw land.
#[derive(Debug, Default)]
pub(crate) struct TaskIndex {
    /// Every task by id: where to find it in the other two maps.
    entries: HashMap<u64, Entry>,
    /// `(next_fire, id)` of the enabled tasks that have a next fire, earliest first.
    by_time: BTreeSet<(DateTime<Utc>, u64)>,
    /// Tasks per target chat (topic included, like the cap), enabled or not, never zero.
    per_target: HashMap<ChatRef, usize>,
}

impl TaskIndex {
    /// The index of `tasks` (every task in the store, enabled or not).
    pub(crate) fn of(tasks: impl IntoIterator<Item = ClockTask>) -> Self {
        let mut index = TaskIndex::default();
        for task in tasks {
            index.put(&task);
        }
        index
    }

    /// Files `task` as it now is in the store: a disabled task stays, counted toward its
    /// chat's cap, but never fires.
    pub(crate) fn put(&mut self, task: &ClockTask) {
        self.remove(task.id);
        let next_fire = task.next_fire.filter(|_| task.enabled);
        if let Some(at) = next_fire {
            self.by_time.insert((at, task.id));
        }
        *self.per_target.entry(task.target.clone()).or_default() += 1;
        self.entries.insert(
            task.id,
            Entry {
                next_fire,
                target: task.target.clone(),
            },
        );
    }

    /// Forgets task `id` (deleted, or unreadable).
    pub(crate) fn remove(&mut self, id: u64) {
        let Some(entry) = self.entries.remove(&id) else {
            return;
        };
        if let Some(at) = entry.next_fire {
            self.by_time.remove(&(at, id));
        }
        if let Some(count) = self.per_target.get_mut(&entry.target) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.per_target.remove(&entry.target);
            }
        }
    }

    /// The earliest next fire of the enabled tasks.
    pub(crate) fn earliest(&self) -> Option<DateTime<Utc>> {
        self.by_time.first().map(|(at, _)| *at)
    }

    /// The tasks due at `now`, by id (the order the store scan fired them in).
    pub(crate) fn due(&self, now: DateTime<Utc>) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .by_time
            .range(..=(now, u64::MAX))
            .map(|(_, id)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Tasks firing into `target`, paused and finished ones included, not counting task
    /// `except`.
    pub(crate) fn tasks_for(&self, target: &ChatRef, except: Option<u64>) -> usize {
        let count = self.per_target.get(target).copied().unwrap_or(0);
        let excepted = except
            .and_then(|id| self.entries.get(&id))
            .is_some_and(|entry| entry.target == *target);
        count.saturating_sub(usize::from(excepted))
    }

    /// Where this index and `truth` (an index freshly built from the store) differ, one line
    /// per task, plus any break of this index's own bookkeeping; empty when they agree.
    pub(crate) fn mismatches(&self, truth: &TaskIndex) -> Vec<String> {
        let mut ids: Vec<u64> = self
            .entries
            .keys()
            .chain(truth.entries.keys())
            .copied()
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let mut out: Vec<String> = ids
            .into_iter()
            .filter_map(|id| {
                let (mine, real) = (self.entries.get(&id), truth.entries.get(&id));
                (mine != real).then(|| format!("task {id}: index {mine:?}, store {real:?}"))
            })
            .collect();
        let timed = self
            .entries
            .values()
            .filter(|e| e.next_fire.is_some())
            .count();
        let filed = self.by_time.iter().all(|(at, id)| {
            self.entries
                .get(id)
                .is_some_and(|e| e.next_fire == Some(*at))
        });
        if timed != self.by_time.len() || !filed {
            out.push(format!(
                "by time: {} entries for {timed} timed tasks, all filed: {filed}",
                self.by_time.len()
            ));
        }
        let mut counted: HashMap<&ChatRef, usize> = HashMap::new();
        for entry in self.entries.values() {
            *counted.entry(&entry.target).or_default() += 1;
        }
        let counts_agree = counted.len() == self.per_target.len()
            && counted
                .iter()
                .all(|(chat, n)| self.per_target.get(*chat) == Some(n));
        if !counts_agree {
            out.push(format!(
                "per-chat counts {:?}, entries give {counted:?}",
                self.per_target
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::MissedPolicy;
    use parlor_bot::tool::{Caller, Role};

    fn at(minute: u32) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(&format!("2026-06-01T08:{minute:02}:00Z"))
            .unwrap()
            .with_timezone(&Utc)
    }

    fn task(id: u64, chat: &str, next: Option<u32>) -> ClockTask {
        ClockTask {
            id,
            name: format!("t{id}"),
            schedule: "every 1h".into(),
            timezone: "UTC".into(),
            content: "x".into(),
            target: ChatRef::new("test", chat),
            creator: Caller {
                user_id: "u".into(),
                name: "U".into(),
                role: Role::ChatAdmin,
                grants: Vec::new(),
            },
            created_in: format!("test:{chat}"),
            created_at: at(0),
            anchor: at(0),
            missed: MissedPolicy::Skip,
            enabled: next.is_some(),
            next_fire: next.map(at),
            last_fire: None,
            last_status: None,
            updated_at: at(0),
            paused_reason: None,
        }
    }

    #[test]
    fn due_tasks_come_by_id_and_the_earliest_is_first() {
        let index = TaskIndex::of([
            task(3, "-1", Some(5)),
            task(1, "-1", Some(7)),
            task(2, "-2", Some(5)),
            task(4, "-2", None),
        ]);
        assert_eq!(index.earliest(), Some(at(5)));
        assert_eq!(index.due(at(4)), Vec::<u64>::new());
        assert_eq!(index.due(at(5)), vec![2, 3]);
        assert_eq!(index.due(at(9)), vec![1, 2, 3]);
        assert!(index.mismatches(&TaskIndex::of([])).len() == 4);
    }

    #[test]
    fn put_moves_a_task_and_a_disabled_one_stops_firing_but_still_counts() {
        let mut index = TaskIndex::of([task(1, "-1", Some(5)), task(2, "-1", Some(6))]);
        assert_eq!(index.tasks_for(&ChatRef::new("test", "-1"), None), 2);
        assert_eq!(index.tasks_for(&ChatRef::new("test", "-1"), Some(2)), 1);
        assert_eq!(index.tasks_for(&ChatRef::new("test", "-1"), Some(9)), 2);

        index.put(&task(1, "-3", Some(9)));
        assert_eq!(index.earliest(), Some(at(6)));
        assert_eq!(index.tasks_for(&ChatRef::new("test", "-1"), None), 1);
        assert_eq!(index.tasks_for(&ChatRef::new("test", "-3"), Some(2)), 1);

        index.put(&task(2, "-1", None));
        index.remove(7);
        assert_eq!(index.earliest(), Some(at(9)));
        assert_eq!(index.due(at(59)), vec![1]);
        assert_eq!(index.tasks_for(&ChatRef::new("test", "-1"), None), 1);
        index.remove(2);
        assert_eq!(index.tasks_for(&ChatRef::new("test", "-1"), None), 0);
        let truth = TaskIndex::of([task(1, "-3", Some(9))]);
        assert_eq!(index.mismatches(&truth), Vec::<String>::new());
    }
}
