//! Where wall time comes from. Waiting is always tokio's timer; [`WallTime`] only says what
//! time it is, so a test under paused tokio time moves the wall clock too.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};

/// Where the clock, the sessions, the stores' callers and the toolsets' background tasks,
/// sub-agents and memory read wall time. Waiting is always done with tokio's timer; this only
/// says what time it is.
#[derive(Clone)]
pub struct WallTime(Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>);

impl fmt::Debug for WallTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WallTime").field(&self.now()).finish()
    }
}

impl WallTime {
    /// The system clock (`Utc::now`): the production default. It follows a wall-clock step
    /// (the NTP sync after boot, a VM resumed) within one sleep of the service, which never
    /// sleeps longer than a minute at a time.
    pub fn system() -> Self {
        WallTime(Arc::new(Utc::now))
    }

    /// Wall time that follows tokio's clock: `Utc::now()` at this call plus the tokio time
    /// elapsed since. Under paused time (`start_paused` tests) wall time moves exactly as
    /// far as tokio time does, so a task due in an hour fires after an hour of paused time.
    pub fn tokio_anchored() -> Self {
        Self::anchored_at(Utc::now())
    }

    /// Like [`tokio_anchored`](Self::tokio_anchored), with the wall time at this instant
    /// given: a test can start on a chosen day (a DST change, say).
    pub fn anchored_at(wall: DateTime<Utc>) -> Self {
        let base = tokio::time::Instant::now();
        WallTime(Arc::new(move || {
            let elapsed = tokio::time::Instant::now().saturating_duration_since(base);
            wall + TimeDelta::from_std(elapsed).unwrap_or(TimeDelta::MAX)
        }))
    }

    /// Any function of no arguments.
    pub fn from_fn(f: impl Fn() -> DateTime<Utc> + Send + Sync + 'static) -> Self {
        WallTime(Arc::new(f))
    }

    /// What time it is.
    pub fn now(&self) -> DateTime<Utc> {
        (self.0)()
    }
}
