//! Leases: which daemon runs a chat when several share one store. A lease is two records
//! of the store's collections, written only by compare-and-set ([`KvWrite::if_unchanged`]),
//! so every backend that keeps the [`Store`] contract (sled, PostgreSQL) holds them alike:
//!
//! - `lease/<name>`: the holder, `{owner, token}`. It changes only when the lease changes
//!   hands, and the token then grows by one: the *fencing token*.
//! - `lease_expiry/<name>`: until when the holder may act, renewed by its heartbeat.
//!
//! A holder's commits carry [`Held::fence`], a write of the holder record conditional on
//! it being unchanged: once another daemon took the lease over (after it expired), the old
//! holder's commit is refused as a whole ([`StoreError::Changed`]), however long it was
//! paused. Expiry compares the daemons' wall clocks: keep them in sync (NTP); a skew eats
//! into the lease's time to live.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::store::{KvWrite, Store, StoreError};

/// The collection of lease holders.
pub const LEASE_SPACE: &str = "lease";
/// The collection of lease expiries.
pub const EXPIRY_SPACE: &str = "lease_expiry";

/// Who holds a lease, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// Schema version (1).
    pub v: u32,
    /// The instance holding it (its id for this run of the daemon).
    pub owner: String,
    /// The fencing token: one more at each change of hands.
    pub token: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Expiry {
    v: u32,
    expires: DateTime<Utc>,
}

/// A lease this instance holds: the records as it last wrote them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    name: String,
    token: u64,
    holder: String,
    expiry: String,
    expires: DateTime<Utc>,
    took_over: bool,
}

impl Held {
    /// Whether it was taken from another instance that let it expire (died, hung, or lost
    /// the store) rather than let it go.
    pub fn took_over(&self) -> bool {
        self.took_over
    }

    /// What the lease is for (a chat's session key).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its fencing token.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Until when it is held unless renewed.
    pub fn expires(&self) -> DateTime<Utc> {
        self.expires
    }

    /// The write that makes a transaction fail unless this lease is still held as taken:
    /// it rewrites the holder record as it is, on condition that it is unchanged.
    pub fn fence(&self) -> KvWrite {
        KvWrite {
            space: LEASE_SPACE.to_owned(),
            key: self.name.clone(),
            value: Some(self.holder.clone()),
            if_unchanged: Some(Some(self.holder.clone())),
        }
    }
}

/// What [`acquire`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// The lease is ours now.
    Held(Held),
    /// Another instance holds it (or took it at the same moment).
    Busy,
}

fn json<T: Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Io(e.to_string()))
}

fn read<T: for<'de> Deserialize<'de>>(
    store: &dyn Store,
    space: &str,
    name: &str,
) -> Result<Option<(String, T)>, StoreError> {
    let Some(text) = store.kv_get(space, name)? else {
        return Ok(None);
    };
    let value = serde_json::from_str(&text).map_err(|e| StoreError::Corrupt {
        key: format!("{space}/{name}"),
        reason: e.to_string(),
    })?;
    Ok(Some((text, value)))
}

/// Takes lease `name` for `owner` until `now + ttl`, unless another instance holds it
/// and it has not expired. Taking it makes the token grow, fencing out any earlier holder.
pub fn acquire(
    store: &dyn Store,
    name: &str,
    owner: &str,
    now: DateTime<Utc>,
    ttl: chrono::Duration,
) -> Result<Taken, StoreError> {
    let holder = read::<Holder>(store, LEASE_SPACE, name)?;
    let expiry = read::<Expiry>(store, EXPIRY_SPACE, name)?;
    let live = expiry.as_ref().is_some_and(|(_, e)| e.expires > now);
    if live && holder.as_ref().is_some_and(|(_, h)| h.owner != owner) {
        return Ok(Taken::Busy);
    }
    let token = holder.as_ref().map_or(0, |(_, h)| h.token) + 1;
    let took_over = holder.as_ref().is_some_and(|(_, h)| h.owner != owner)
        && expiry
            .as_ref()
            .is_some_and(|(_, e)| e.expires != DateTime::<Utc>::UNIX_EPOCH);
    let new_holder = json(&Holder {
        v: 1,
        owner: owner.to_owned(),
        token,
    })?;
    let expires = now + ttl;
    let new_expiry = json(&Expiry { v: 1, expires })?;
    let written = store.kv_write(vec![
        KvWrite {
            space: LEASE_SPACE.to_owned(),
            key: name.to_owned(),
            value: Some(new_holder.clone()),
            if_unchanged: Some(holder.map(|(text, _)| text)),
        },
        KvWrite {
            space: EXPIRY_SPACE.to_owned(),
            key: name.to_owned(),
            value: Some(new_expiry.clone()),
            if_unchanged: Some(expiry.map(|(text, _)| text)),
        },
    ]);
    match written {
        Ok(()) => Ok(Taken::Held(Held {
            name: name.to_owned(),
            token,
            holder: new_holder,
            expiry: new_expiry,
            expires,
            took_over,
        })),
        Err(StoreError::Changed(_)) => Ok(Taken::Busy),
        Err(e) => Err(e),
    }
}

/// Extends `held` to `now + ttl`; `false` when it was lost (another instance took it over
/// after it expired), and then it must not be used again.
pub fn renew(
    store: &dyn Store,
    held: &mut Held,
    now: DateTime<Utc>,
    ttl: chrono::Duration,
) -> Result<bool, StoreError> {
    let expires = now + ttl;
    let new_expiry = json(&Expiry { v: 1, expires })?;
    let written = store.kv_write(vec![
        held.fence(),
        KvWrite {
            space: EXPIRY_SPACE.to_owned(),
            key: held.name.clone(),
            value: Some(new_expiry.clone()),
            if_unchanged: Some(Some(held.expiry.clone())),
        },
    ]);
    match written {
        Ok(()) => {
            held.expiry = new_expiry;
            held.expires = expires;
            Ok(true)
        }
        Err(StoreError::Changed(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Lets `held` go: it expires now, so another instance may take it at once. `false` when
/// it was lost already.
pub fn release(store: &dyn Store, held: &Held) -> Result<bool, StoreError> {
    let gone = json(&Expiry {
        v: 1,
        expires: DateTime::<Utc>::UNIX_EPOCH,
    })?;
    let written = store.kv_write(vec![
        held.fence(),
        KvWrite {
            space: EXPIRY_SPACE.to_owned(),
            key: held.name.clone(),
            value: Some(gone),
            if_unchanged: Some(Some(held.expiry.clone())),
        },
    ]);
    match written {
        Ok(()) => Ok(true),
        Err(StoreError::Changed(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Who holds lease `name` at `now`, if anyone: (holder, expiry).
pub fn holder(
    store: &dyn Store,
    name: &str,
    now: DateTime<Utc>,
) -> Result<Option<(Holder, DateTime<Utc>)>, StoreError> {
    let Some((_, holder)) = read::<Holder>(store, LEASE_SPACE, name)? else {
        return Ok(None);
    };
    let Some((_, expiry)) = read::<Expiry>(store, EXPIRY_SPACE, name)? else {
        return Ok(None);
    };
    Ok((expiry.expires > now).then_some((holder, expiry.expires)))
}

/// A lease one loop keeps for itself (a platform connection only one daemon may hold, such
/// as Telegram's long poll): taken when free, renewed each time the loop comes round, which
/// must be well within the lease's time to live.
pub struct Keeper {
    store: std::sync::Arc<dyn Store>,
    name: String,
    owner: String,
    ttl: std::time::Duration,
    wall: crate::time::WallTime,
    held: std::sync::Mutex<Option<Held>>,
    /// Whether this daemon may hold the lease (`true`: it holds it now) or take it
    /// (`false`), when some are to be spread across daemons (Discord's shards).
    gate: Option<Gate>,
}

/// See [`Keeper::with_gate`].
pub type Gate = std::sync::Arc<dyn Fn(bool) -> bool + Send + Sync>;

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("name", &self.name)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl Keeper {
    /// Keeps lease `name` for `owner` in `store`, `ttl` long at each renewal.
    pub fn new(
        store: std::sync::Arc<dyn Store>,
        name: &str,
        owner: &str,
        ttl: std::time::Duration,
        wall: crate::time::WallTime,
    ) -> Self {
        Keeper {
            store,
            name: name.to_owned(),
            owner: owner.to_owned(),
            ttl,
            wall,
            held: std::sync::Mutex::new(None),
            gate: None,
        }
    }

    /// Asks `gate` before taking the lease (`gate(false)`) and at each renewal
    /// (`gate(true)`): a daemon over its share of several such leases takes no more, and
    /// lets one go for a daemon with fewer.
    #[must_use]
    pub fn with_gate(mut self, gate: Gate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Whether this daemon holds the lease now (as far as it knows).
    pub fn is_held(&self) -> bool {
        self.slot().is_some()
    }

    fn may(&self, held: bool) -> bool {
        self.gate.as_ref().is_none_or(|gate| gate(held))
    }

    /// How long the loop may spend between two calls of [`Keeper::hold`]: a third of the
    /// lease, so that one failed renewal still leaves time for the next.
    pub fn period(&self) -> std::time::Duration {
        self.ttl / 3
    }

    fn chrono_ttl(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.ttl).unwrap_or(chrono::Duration::seconds(10))
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Renews the lease, or waits until it can be taken; `false` when `stop` ended the
    /// wait. Another holder, or a store that cannot be reached, is waited out a
    /// [period](Keeper::period) at a time.
    pub async fn hold(&self, stop: &tokio_util::sync::CancellationToken) -> bool {
        let mut waited = false;
        loop {
            if self.slot().is_some() && self.renew_now() {
                return true;
            }
            // Not held (never, or lost just now): take it if it is free.
            let now = self.wall.now();
            let taken = if self.may(false) {
                acquire(
                    self.store.as_ref(),
                    &self.name,
                    &self.owner,
                    now,
                    self.chrono_ttl(),
                )
            } else {
                // Past this daemon's share: left to the others.
                Ok(Taken::Busy)
            };
            match taken {
                Ok(Taken::Held(held)) => {
                    tracing::info!(lease = %self.name, took_over = held.took_over(), "holding the lease");
                    *self.slot() = Some(held);
                    return true;
                }
                Ok(Taken::Busy) => {
                    if !waited {
                        tracing::info!(lease = %self.name, "another instance holds the lease; waiting");
                        waited = true;
                    }
                }
                Err(e) => tracing::warn!(lease = %self.name, error = %e, "cannot take the lease"),
            }
            tokio::select! {
                () = tokio::time::sleep(self.period()) => {}
                () = stop.cancelled() => return false,
            }
        }
    }

    /// Renews the lease if held, without waiting: `false` when it is not held (lost to
    /// another instance, or never taken). A store that cannot be reached keeps it until
    /// it would expire.
    pub fn renew_now(&self) -> bool {
        let Some(mut held) = self.slot().clone() else {
            return false;
        };
        if !self.may(true) {
            tracing::info!(lease = %self.name, "over this daemon's share; letting it go to another");
            self.release();
            return false;
        }
        let now = self.wall.now();
        match renew(self.store.as_ref(), &mut held, now, self.chrono_ttl()) {
            Ok(true) => {
                *self.slot() = Some(held);
                true
            }
            Ok(false) => {
                tracing::warn!(lease = %self.name, "lost to another instance");
                *self.slot() = None;
                false
            }
            Err(e) if held.expires() > now + self.chrono_ttl() / 3 => {
                tracing::warn!(lease = %self.name, error = %e, "cannot renew; still held");
                true
            }
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, "cannot renew; letting it go");
                *self.slot() = None;
                false
            }
        }
    }

    /// Lets the lease go (shutdown): another instance takes it at its next try.
    pub fn release(&self) {
        if let Some(held) = self.slot().take()
            && let Err(e) = release(self.store.as_ref(), &held)
        {
            tracing::warn!(lease = %self.name, error = %e, "cannot let the lease go; it expires by itself");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::seconds(1_700_000_000 + secs)
    }

    fn held(taken: Taken) -> Held {
        match taken {
            Taken::Held(held) => held,
            Taken::Busy => panic!("busy"),
        }
    }

    #[test]
    fn a_lease_is_held_until_it_expires_then_taken_over_and_the_old_holder_is_fenced() {
        let store = MemoryStore::new();
        let ttl = chrono::Duration::seconds(10);
        let a = held(acquire(&store, "chat", "a", at(0), ttl).unwrap());
        assert_eq!(a.token(), 1);
        assert_eq!(
            acquire(&store, "chat", "b", at(5), ttl).unwrap(),
            Taken::Busy
        );
        let mut a2 = a.clone();
        assert!(renew(&store, &mut a2, at(8), ttl).unwrap());
        assert_eq!(
            acquire(&store, "chat", "b", at(12), ttl).unwrap(),
            Taken::Busy
        );
        // The renewal changed only the expiry: the fence still holds.
        store.kv_write(vec![a2.fence()]).unwrap();

        let b = held(acquire(&store, "chat", "b", at(19), ttl).unwrap());
        assert_eq!(b.token(), 2);
        assert!(b.took_over());
        assert!(matches!(
            store.kv_write(vec![a2.fence()]),
            Err(StoreError::Changed(_))
        ));
        assert!(!renew(&store, &mut a2, at(20), ttl).unwrap());
        assert!(!release(&store, &a2).unwrap());
        assert_eq!(
            holder(&store, "chat", at(20)).unwrap().unwrap().0.owner,
            "b"
        );

        assert!(release(&store, &b).unwrap());
        assert_eq!(holder(&store, "chat", at(20)).unwrap(), None);
        let a3 = held(acquire(&store, "chat", "a", at(20), ttl).unwrap());
        assert_eq!(a3.token(), 3);
        assert!(!a3.took_over(), "let go, not taken over");
        assert!(!a.took_over(), "a first lease");
    }
}

#[cfg(test)]
mod keeper_tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::store::MemoryStore;
    use crate::time::WallTime;

    #[tokio::test(start_paused = true)]
    async fn one_keeper_holds_the_other_waits_and_takes_over_after_a_release_or_an_expiry() {
        let store = Arc::new(MemoryStore::new());
        let keeper = |owner: &str| {
            Keeper::new(
                Arc::clone(&store) as Arc<dyn Store>,
                "telegram:poll",
                owner,
                Duration::from_secs(9),
                WallTime::tokio_anchored(),
            )
        };
        let (a, b) = (keeper("a"), keeper("b"));
        let stop = CancellationToken::new();
        assert!(a.hold(&stop).await);
        let waiting = tokio::time::timeout(Duration::from_secs(5), b.hold(&stop)).await;
        assert!(
            waiting.is_err(),
            "b waits while a's lease lives: {waiting:?}"
        );
        a.release();
        assert!(b.hold(&stop).await, "taken at once after the release");
        // b stops coming round: once its lease expired, a takes it.
        assert!(
            tokio::time::timeout(Duration::from_secs(30), a.hold(&stop))
                .await
                .unwrap()
        );
        let lost = tokio::time::timeout(Duration::from_secs(5), b.hold(&stop)).await;
        assert!(lost.is_err(), "b lost it and waits");
        assert!(b.slot().is_none());
        stop.cancel();
        assert!(
            !keeper("c").hold(&stop).await,
            "a stopped wait returns false"
        );
    }

    /// A gated keeper takes the lease only when its gate allows, and lets it go at a
    /// renewal when the gate says it is over its share; another keeper takes it then.
    #[tokio::test(start_paused = true)]
    async fn a_gated_keeper_takes_only_within_its_share_and_lets_go_past_it() {
        let store = Arc::new(MemoryStore::new());
        let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let gate: Gate = {
            let open = Arc::clone(&open);
            Arc::new(move |_holding| open.load(std::sync::atomic::Ordering::SeqCst))
        };
        let keeper = |owner: &str| {
            Keeper::new(
                Arc::clone(&store) as Arc<dyn Store>,
                "discord:shard:0/2",
                owner,
                Duration::from_secs(9),
                WallTime::tokio_anchored(),
            )
        };
        let a = keeper("a").with_gate(gate);
        let b = keeper("b");
        let stop = CancellationToken::new();
        let shut = tokio::time::timeout(Duration::from_secs(20), a.hold(&stop)).await;
        assert!(
            shut.is_err(),
            "a closed gate: a waits though the lease is free"
        );
        open.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(a.hold(&stop).await);
        assert!(a.is_held());
        open.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(!a.renew_now(), "past its share, a lets go");
        assert!(!a.is_held());
        assert!(b.hold(&stop).await, "b takes it at once");
    }
}
