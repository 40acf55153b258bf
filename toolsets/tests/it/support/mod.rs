//! Test doubles of the traits parlor-toolsets defines (the others are in
//! `parlor_bot::testing`): one [`Notifier`] and one [`Lookup`] for every module that needs
//! one; the clock task the clock tests create; a wall time stopped at one instant; and the
//! clock tests' rig ([`clock`]).

#![allow(dead_code)]

pub mod clock;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use parlor_bot::platform::ChatRef;
use parlor_bot::store::KvWrite;
use parlor_bot::testing::WAIT_LIMIT;
use parlor_bot::time::WallTime;
use parlor_bot::tool::{Caller, Role};
use parlor_toolsets::clock::{MissedPolicy, NewClock};
use parlor_toolsets::net::Lookup;
use parlor_toolsets::terminal::{Notifier, NotifyError};
use tokio::sync::watch;

/// An instant (2031-02-03T04:05:06Z) and a wall time stopped there: a service given it
/// stamps everything with that instant.
pub fn stopped_wall_time() -> (DateTime<Utc>, WallTime) {
    let at = DateTime::parse_from_rfc3339("2031-02-03T04:05:06Z")
        .unwrap()
        .with_timezone(&Utc);
    (at, WallTime::from_fn(move || at))
}

/// Asserts that a background job started and ended at `at` and that its id
/// (`<prefix>-<milliseconds in hex><counter>`) was made at `at`.
pub fn assert_stamped(
    id: &str,
    prefix: &str,
    started: DateTime<Utc>,
    ended: Option<DateTime<Utc>>,
    at: DateTime<Utc>,
) {
    assert_eq!(started, at);
    assert_eq!(ended, Some(at));
    let made = format!("{prefix}-{:x}", at.timestamp_millis());
    assert!(id.starts_with(&made), "{id} does not start with {made}");
}

/// One notice a [`TestNotifier`] took.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    pub chat: ChatRef,
    pub text: String,
    /// Whom the notice turn would run as.
    pub caller: Caller,
    /// The pending id it was given: 100, 101, ...
    pub pending_id: u64,
}

/// A notifier that records every notice; `withdraw` always succeeds (and is recorded).
/// While [shutting down](TestNotifier::set_shutting_down) it refuses notices as the session
/// layer does.
pub struct TestNotifier {
    notices: watch::Sender<Vec<Notice>>,
    withdrawn: Mutex<Vec<u64>>,
    shutting_down: AtomicBool,
    /// Where the notices' `also` writes go, as the session layer stores them with the
    /// notice (none: they are dropped).
    store: Mutex<Option<std::sync::Arc<dyn parlor_bot::store::Store>>>,
}

impl Default for TestNotifier {
    fn default() -> Self {
        TestNotifier {
            notices: watch::Sender::new(Vec::new()),
            withdrawn: Mutex::default(),
            shutting_down: AtomicBool::new(false),
            store: Mutex::default(),
        }
    }
}

impl TestNotifier {
    /// Every notice so far.
    pub fn notices(&self) -> Vec<Notice> {
        self.notices.borrow().clone()
    }

    /// Waits until `n` notices came, for at most [`WAIT_LIMIT`] of tokio time; every notice
    /// so far.
    pub async fn wait_notices(&self, n: usize) -> Vec<Notice> {
        let mut seen = self.notices.subscribe();
        let waited = tokio::time::timeout(WAIT_LIMIT, seen.wait_for(|all| all.len() >= n)).await;
        match waited {
            Ok(Ok(all)) => all.clone(),
            _ => panic!("expected {n} notices, got {:?}", self.notices()),
        }
    }

    /// The pending ids withdrawn so far.
    pub fn withdrawn(&self) -> Vec<u64> {
        self.withdrawn.lock().unwrap().clone()
    }

    /// Stores each notice's `also` writes in `store` (one transaction, conditions checked),
    /// as the session layer does: a notice whose rows changed is refused.
    pub fn writes_to(&self, store: std::sync::Arc<dyn parlor_bot::store::Store>) {
        *self.store.lock().unwrap() = Some(store);
    }

    /// Refuses notices (as shutting down) while `on`.
    pub fn set_shutting_down(&self, on: bool) {
        self.shutting_down.store(on, Ordering::SeqCst);
    }
}

#[async_trait]
impl Notifier for TestNotifier {
    async fn notify(
        &self,
        chat: &ChatRef,
        text: String,
        caller: Caller,
        also: Vec<KvWrite>,
    ) -> Result<u64, NotifyError> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(NotifyError::ShuttingDown);
        }
        let store = self.store.lock().unwrap().clone();
        if let Some(store) = store {
            match store.kv_write(also) {
                Ok(()) => {}
                Err(parlor_bot::store::StoreError::Changed(what)) => {
                    return Err(NotifyError::Changed(what));
                }
                Err(e) => return Err(NotifyError::Failed(e.to_string())),
            }
        }
        let mut pending_id = 0;
        self.notices.send_modify(|all| {
            pending_id = all.len() as u64 + 100;
            all.push(Notice {
                chat: chat.clone(),
                text,
                caller,
                pending_id,
            });
        });
        Ok(pending_id)
    }

    async fn withdraw(&self, _chat: &ChatRef, pending_id: u64) -> Result<bool, NotifyError> {
        self.withdrawn.lock().unwrap().push(pending_id);
        Ok(true)
    }
}

/// Alice, a chat admin of the test chats: the clock tests' task creator.
pub fn alice() -> Caller {
    Caller {
        user_id: "test:alice".into(),
        name: "Alice".into(),
        role: Role::ChatAdmin,
        grants: Vec::new(),
    }
}

/// A task `name` on `schedule` into `target`, created there by [`alice`].
pub fn new_clock(name: &str, schedule: &str, target: ChatRef) -> NewClock {
    NewClock {
        name: name.into(),
        schedule: schedule.into(),
        content: format!("post the {name} note"),
        timezone: None,
        created_in: target.session_key(),
        target,
        creator: alice(),
        missed: MissedPolicy::Skip,
    }
}

/// A resolver answering from a script: each name has a list of answers, handed out one per
/// lookup (the last one repeats), so a test can make a name change its address between two
/// lookups (DNS rebinding). Names not in the script do not resolve. It records every lookup.
#[derive(Debug, Default)]
pub struct ScriptedLookup {
    answers: Mutex<std::collections::HashMap<String, Vec<Vec<std::net::IpAddr>>>>,
    lookups: Mutex<Vec<String>>,
}

impl ScriptedLookup {
    /// `host` answers `addresses` from now on, after the answers scripted before.
    pub fn answer(&self, host: &str, addresses: &[&str]) -> &Self {
        let parsed = addresses.iter().map(|a| a.parse().unwrap()).collect();
        self.answers
            .lock()
            .unwrap()
            .entry(host.to_owned())
            .or_default()
            .push(parsed);
        self
    }

    /// The names looked up so far, in order.
    pub fn lookups(&self) -> Vec<String> {
        self.lookups.lock().unwrap().clone()
    }
}

#[async_trait]
impl Lookup for ScriptedLookup {
    async fn lookup(&self, host: &str) -> std::io::Result<Vec<std::net::IpAddr>> {
        self.lookups.lock().unwrap().push(host.to_owned());
        let mut answers = self.answers.lock().unwrap();
        let Some(script) = answers.get_mut(host) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{host}: no such name (scripted)"),
            ));
        };
        if script.len() > 1 {
            Ok(script.remove(0))
        } else {
            Ok(script.first().cloned().unwrap_or_default())
        }
    }
}
