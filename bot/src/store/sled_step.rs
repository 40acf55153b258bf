//! [`Steps`]: one logical step of [`SledStore`](super::SledStore) over several trees, atomic
//! across a kill, without sled's transactions.
//!
//! sled 0.34 seals and writes its current log buffer twice for every transaction (and every
//! `apply_batch`): `PageCache::pin_log` rolls the buffer before and after reserving the
//! batch's manifest. Each roll is a `pwrite` and a `sync_file_range` on sled's I/O threads
//! and the wake-ups between them; at four transactions a turn that was most of parlor's CPU
//! per turn (docs/perf.md). A plain `insert` or `remove` only appends to the buffer.
//!
//! A step instead runs its reads and writes against the trees directly, the writes gathered
//! in memory (read back by the step's own reads). Its commit is the gathered writes, in
//! order: a step of one write is that write (sled makes one `insert` atomic); a longer one
//! is first recorded whole as one value under [`JOURNAL_KEY`] in the `steps` tree, then
//! applied. The record stays until the next step replaces it (a longer step) or removes it
//! (a step of one write, before its write): removing it after every step was one more
//! write per step, and a step's writes are most of what a turn costs. sled's recovery keeps
//! a prefix of the log (it stops at the first torn message), so after a kill either the
//! record is absent (and so is every write after it), or it is the last longer step, and
//! [`Steps::recover`] applies it again when the store opens: every write is a blind set or
//! remove of a value computed in the step, and every later write to its keys went through
//! a later step, which replaced or removed the record first; so applying it again is
//! applying it once.
//!
//! Steps run one at a time, under [`Steps::lock`] (which is also why one journal key is
//! enough): a step's reads see every earlier step whole, and no other write to its keys
//! comes between its reads and its writes. Plain writes of the store that share keys with
//! steps take the same lock. A reader that does not may see a step half applied, in the
//! order of its writes; the store's readers are written for that (docs in `sled_store.rs`).

use std::borrow::Borrow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use sled::transaction::{ConflictableTransactionError, UnabortableTransactionError};
use sled::{Db, IVec, Tree};

use super::StoreError;
use super::sled_store::sled_error;

/// The key of the one step record that may be in the `steps` tree.
const JOURNAL_KEY: &[u8] = b"step";

/// The `steps` tree and the lock the steps run under (see the module docs). The lock holds
/// whether the record of an applied step is still in the tree.
#[derive(Debug)]
pub(super) struct Steps {
    journal: Tree,
    lock: Mutex<bool>,
}

/// A tree as a step sees it: its reads see the step's own writes first.
pub(super) struct StepTree<'a> {
    tree: &'a Tree,
    slot: usize,
    writes: &'a RefCell<Writes>,
}

/// The writes of a running step, in order, and the latest value per key.
#[derive(Default)]
struct Writes {
    ops: Vec<Op>,
    latest: HashMap<(usize, IVec), Option<IVec>>,
}

/// One write: set `key` of tree `slot` to `value`, or remove it when `None`.
struct Op {
    slot: usize,
    key: IVec,
    value: Option<IVec>,
}

type StepResult<T> = Result<T, UnabortableTransactionError>;

impl StepTree<'_> {
    /// The value of `key`, as the step left it so far.
    pub(super) fn get<K: AsRef<[u8]>>(&self, key: K) -> StepResult<Option<IVec>> {
        let key = key.as_ref();
        if let Some(value) = self.latest(key) {
            return Ok(value);
        }
        self.tree
            .get(key)
            .map_err(UnabortableTransactionError::Storage)
    }

    /// Sets `key` to `value` when the step commits. Blind: it does not look up the value
    /// before (a lookup is a walk down sled's tree, and most writes of a step are to keys
    /// it just read or that are new).
    pub(super) fn insert<K: AsRef<[u8]>, V: Into<IVec>>(&self, key: K, value: V) -> StepResult<()> {
        self.record(key.as_ref(), Some(value.into()));
        Ok(())
    }

    /// Removes `key` when the step commits, blind like [`StepTree::insert`].
    pub(super) fn delete<K: AsRef<[u8]>>(&self, key: K) -> StepResult<()> {
        self.record(key.as_ref(), None);
        Ok(())
    }

    /// Removes `key` when the step commits; the value before, as the step sees it.
    pub(super) fn remove<K: AsRef<[u8]>>(&self, key: K) -> StepResult<Option<IVec>> {
        let key = key.as_ref();
        let before = self.get(key)?;
        self.record(key, None);
        Ok(before)
    }

    fn latest(&self, key: &[u8]) -> Option<Option<IVec>> {
        self.writes
            .borrow()
            .latest
            .get(&(self.slot, IVec::from(key)))
            .cloned()
    }

    fn record(&self, key: &[u8], value: Option<IVec>) {
        let key = IVec::from(key);
        let mut writes = self.writes.borrow_mut();
        writes
            .latest
            .insert((self.slot, key.clone()), value.clone());
        writes.ops.push(Op {
            slot: self.slot,
            key,
            value,
        });
    }
}

impl Steps {
    /// Opens the `steps` tree of `db` and applies a step a kill interrupted (see
    /// [`Steps::recover`]); call before anything reads the store.
    pub(super) fn open(db: &Db) -> Result<Steps, StoreError> {
        let journal = db.open_tree("steps").map_err(sled_error)?;
        let steps = Steps {
            journal,
            lock: Mutex::new(false),
        };
        steps.recover(db)?;
        Ok(steps)
    }

    /// Held by a step from its first read to its last write, and by plain writes to keys a
    /// step may write.
    pub(super) fn lock(&self) -> MutexGuard<'_, bool> {
        // A panic inside a step left no write behind (they are applied after the step's
        // closure returned), so the lock protects nothing a panic could have broken.
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `step` over `trees` and commits its writes atomically; an `Abort` discards them.
    pub(super) fn run<T, B: Borrow<Tree>>(
        &self,
        trees: &[B],
        step: impl FnOnce(&[StepTree<'_>]) -> Result<T, ConflictableTransactionError<StoreError>>,
    ) -> Result<T, StoreError> {
        let mut recorded = self.lock();
        let writes = RefCell::new(Writes::default());
        let views = views(trees, &writes);
        let value = step(&views).map_err(|e| match e {
            ConflictableTransactionError::Abort(e) => e,
            ConflictableTransactionError::Storage(e) => sled_error(e),
            // Only sled's own transactions conflict; a step never returns it.
            _ => StoreError::Io("a store step conflicted".to_owned()),
        })?;
        drop(views);
        let ops = writes.into_inner().ops;
        self.commit(trees, &ops, &mut recorded)
            .map_err(sled_error)?;
        Ok(value)
    }

    /// Writes `ops`; `recorded` says whether the tree holds an applied step's record, and
    /// is kept true to what it holds after.
    fn commit<B: Borrow<Tree>>(
        &self,
        trees: &[B],
        ops: &[Op],
        recorded: &mut bool,
    ) -> Result<(), sled::Error> {
        match ops {
            [] => Ok(()),
            [op] => {
                // Applied again at the next open, the record would undo this write.
                if *recorded {
                    self.journal.remove(JOURNAL_KEY)?;
                    *recorded = false;
                }
                apply(trees[op.slot].borrow(), op)
            }
            _ => {
                let names: Vec<IVec> = trees.iter().map(|t| t.borrow().name()).collect();
                // Set before the insert: should it fail, a later step of one write still
                // removes whatever it left.
                *recorded = true;
                self.journal.insert(JOURNAL_KEY, encode(&names, ops))?;
                for op in ops {
                    apply(trees[op.slot].borrow(), op)?;
                }
                Ok(())
            }
        }
    }

    /// Applies the step record the last run left, if any (the last longer step, whole or
    /// cut by a kill), and removes it. A record that cannot be read is an error: the store
    /// would otherwise open with half a step.
    fn recover(&self, db: &Db) -> Result<(), StoreError> {
        let Some(record) = self.journal.get(JOURNAL_KEY).map_err(sled_error)? else {
            return Ok(());
        };
        let Some(ops) = decode(&record) else {
            return Err(StoreError::Corrupt {
                key: "steps[step]".to_owned(),
                reason: "not a step record".to_owned(),
            });
        };
        let finish = || -> Result<(), sled::Error> {
            for (name, key, value) in &ops {
                let tree = db.open_tree(name)?;
                match value {
                    Some(value) => tree.insert(key, value.clone())?,
                    None => tree.remove(key)?,
                };
            }
            self.journal.remove(JOURNAL_KEY)?;
            db.flush()?;
            Ok(())
        };
        finish().map_err(sled_error)?;
        tracing::warn!(
            writes = ops.len(),
            "the store finished a step a stop had interrupted"
        );
        Ok(())
    }

    /// For tests: what [`Steps::run`] leaves after a kill in the middle of its commit, with
    /// the record written and only the first `applied` writes after it.
    #[cfg(test)]
    pub(super) fn run_interrupted<B: Borrow<Tree>>(
        &self,
        trees: &[B],
        applied: usize,
        step: impl FnOnce(&[StepTree<'_>]) -> Result<(), ConflictableTransactionError<StoreError>>,
    ) {
        let writes = RefCell::new(Writes::default());
        let views = views(trees, &writes);
        assert!(step(&views).is_ok(), "the interrupted step failed");
        drop(views);
        let ops = writes.into_inner().ops;
        let names: Vec<IVec> = trees.iter().map(|t| t.borrow().name()).collect();
        self.journal
            .insert(JOURNAL_KEY, encode(&names, &ops))
            .expect("journal");
        for op in ops.iter().take(applied) {
            apply(trees[op.slot].borrow(), op).expect("apply");
        }
    }
}

/// Each of `trees` as a running step sees it.
fn views<'a, B: Borrow<Tree>>(trees: &'a [B], writes: &'a RefCell<Writes>) -> Vec<StepTree<'a>> {
    trees
        .iter()
        .enumerate()
        .map(|(slot, tree)| StepTree {
            tree: tree.borrow(),
            slot,
            writes,
        })
        .collect()
}

fn apply(tree: &Tree, op: &Op) -> Result<(), sled::Error> {
    match &op.value {
        Some(value) => tree.insert(&op.key, value.clone())?,
        None => tree.remove(&op.key)?,
    };
    Ok(())
}

/// The record of a step: per write, its tree's name, its key and its value (tag 1) or
/// removal (tag 0), each length-prefixed (u32, big-endian).
fn encode(names: &[IVec], ops: &[Op]) -> Vec<u8> {
    let size: usize = ops
        .iter()
        .map(|op| {
            13 + names[op.slot].len() + op.key.len() + op.value.as_ref().map_or(0, |v| v.len())
        })
        .sum();
    let mut out = Vec::with_capacity(size);
    let mut put = |bytes: &[u8]| {
        // Keys, values and tree names are far below 4 GiB (sled's own limit).
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(bytes);
    };
    for op in ops {
        put(&names[op.slot]);
        put(&op.key);
        match &op.value {
            Some(value) => {
                put(&[1]);
                put(value);
            }
            None => put(&[0]),
        }
    }
    out
}

/// A decoded write: tree name, key, value (`None`: remove).
type RecordedOp = (IVec, IVec, Option<IVec>);

/// The writes of a step record; `None` when it is not one.
fn decode(mut bytes: &[u8]) -> Option<Vec<RecordedOp>> {
    fn take<'a>(bytes: &mut &'a [u8]) -> Option<&'a [u8]> {
        let (len, rest) = bytes.split_first_chunk::<4>()?;
        let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
        if rest.len() < len {
            return None;
        }
        let (field, rest) = rest.split_at(len);
        *bytes = rest;
        Some(field)
    }
    let mut ops = Vec::new();
    while !bytes.is_empty() {
        let name = IVec::from(take(&mut bytes)?);
        let key = IVec::from(take(&mut bytes)?);
        let value = match take(&mut bytes)? {
            [1] => Some(IVec::from(take(&mut bytes)?)),
            [0] => None,
            _ => return None,
        };
        ops.push((name, key, value));
    }
    Some(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = sled::Config::new()
            .path(dir.path().join("db"))
            .open()
            .expect("open");
        (dir, db)
    }

    #[test]
    fn a_record_decodes_to_the_writes_it_was_made_of() {
        let names = [IVec::from("a"), IVec::from("kv/b")];
        let ops = [
            Op {
                slot: 0,
                key: IVec::from("k1"),
                value: Some(IVec::from(&b"v1"[..])),
            },
            Op {
                slot: 1,
                key: IVec::from(""),
                value: None,
            },
            Op {
                slot: 0,
                key: IVec::from("k2"),
                value: Some(IVec::from(&b""[..])),
            },
        ];
        let decoded = decode(&encode(&names, &ops)).expect("decodes");
        let expected: Vec<RecordedOp> = vec![
            (IVec::from("a"), IVec::from("k1"), Some(IVec::from("v1"))),
            (IVec::from("kv/b"), IVec::from(""), None),
            (IVec::from("a"), IVec::from("k2"), Some(IVec::from(""))),
        ];
        assert_eq!(decoded, expected);
        let record = encode(&names, &ops);
        for cut in 1..record.len() {
            // A truncated record is refused, not half read (except at a write's boundary,
            // which the journal never stores: records are written whole).
            if let Some(ops) = decode(&record[..cut]) {
                assert!(ops.len() < 3, "cut at {cut} read every write");
            }
        }
        assert_eq!(decode(&[0, 0, 0, 9]), None);
    }

    #[test]
    fn a_steps_reads_see_its_own_writes_and_an_abort_writes_nothing() {
        let (_dir, db) = db();
        let steps = Steps::open(&db).expect("steps");
        let a = db.open_tree("a").expect("tree");
        a.insert("x", "old").expect("insert");
        let seen = steps
            .run(&[&a], |t| {
                assert_eq!(t[0].get("x")?.as_deref(), Some(&b"old"[..]));
                t[0].insert("x", "new")?;
                assert_eq!(t[0].get("x")?.as_deref(), Some(&b"new"[..]));
                assert_eq!(t[0].remove("x")?.as_deref(), Some(&b"new"[..]));
                t[0].insert("z", "gone")?;
                t[0].delete("z")?;
                Ok((t[0].get("x")?, t[0].get("z")?))
            })
            .expect("step");
        assert_eq!(seen, (None, None));
        assert_eq!(a.get("x").expect("get"), None);
        assert_eq!(a.get("z").expect("get"), None);
        let aborted = steps.run(&[&a], |t| {
            t[0].insert("y", "never")?;
            Err::<(), _>(ConflictableTransactionError::Abort(StoreError::Io(
                "no".to_owned(),
            )))
        });
        assert!(aborted.is_err());
        assert_eq!(a.get("y").expect("get"), None);
        assert_eq!(
            steps.journal.len(),
            1,
            "the last longer step's record stays"
        );
        steps
            .run(&[&a], |t| Ok(t[0].insert("w", "one write")?))
            .expect("step");
        assert_eq!(
            steps.journal.len(),
            0,
            "a step of one write removes it first"
        );
    }

    /// Opens the sled store at `path`, waiting for the last run's file lock to go.
    fn reopen(path: &std::path::Path) -> sled::Db {
        // sled releases its file lock a moment after the last handle is dropped.
        (0..100)
            .find_map(|_| match sled::Config::new().path(path).open() {
                Ok(db) => Some(db),
                Err(_) => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    None
                }
            })
            .expect("reopen")
    }

    /// The record the last longer step leaves is applied again at the next open: that
    /// must change nothing, also for keys later steps wrote.
    #[test]
    fn the_last_steps_record_applied_again_at_open_undoes_no_later_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("db");
        {
            let db = sled::Config::new().path(&path).open().expect("open");
            let steps = Steps::open(&db).expect("steps");
            let a = db.open_tree("a").expect("tree");
            let two = |x: &'static str, y: &'static str| {
                steps
                    .run(&[&a], |t| {
                        t[0].insert("x", x)?;
                        Ok(t[0].insert("y", y)?)
                    })
                    .expect("step");
            };
            two("1", "1");
            two("2", "2");
            // One write to a key of the last longer step.
            steps
                .run(&[&a], |t| Ok(t[0].insert("y", "3")?))
                .expect("step");
            two("4", "4");
            steps.run(&[&a], |t| Ok(t[0].delete("x")?)).expect("step");
            db.flush().expect("flush");
        }
        let db = reopen(&path);
        let steps = Steps::open(&db).expect("steps");
        let a = db.open_tree("a").expect("tree");
        assert_eq!(a.get("x").expect("get"), None);
        assert_eq!(a.get("y").expect("get").as_deref(), Some(&b"4"[..]));
        assert_eq!(steps.journal.len(), 0);
    }

    #[test]
    fn a_step_a_kill_interrupted_is_finished_when_the_store_opens() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("db");
        {
            let db = sled::Config::new().path(&path).open().expect("open");
            let steps = Steps::open(&db).expect("steps");
            let (a, b) = (
                db.open_tree("a").expect("tree"),
                db.open_tree("b").expect("tree"),
            );
            a.insert("gone", "x").expect("insert");
            steps.run_interrupted(&[&a, &b], 1, |t| {
                t[0].insert("one", "1")?;
                t[1].insert("two", "2")?;
                t[0].remove("gone")?;
                Ok(())
            });
            assert_eq!(b.get("two").expect("get"), None, "not applied yet");
            db.flush().expect("flush");
        }
        let db = reopen(&path);
        let steps = Steps::open(&db).expect("steps");
        let (a, b) = (
            db.open_tree("a").expect("tree"),
            db.open_tree("b").expect("tree"),
        );
        assert_eq!(a.get("one").expect("get").as_deref(), Some(&b"1"[..]));
        assert_eq!(b.get("two").expect("get").as_deref(), Some(&b"2"[..]));
        assert_eq!(a.get("gone").expect("get"), None);
        assert_eq!(steps.journal.len(), 0);
    }
}
