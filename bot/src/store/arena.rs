//! Which allocations are the store's, for the allocator to keep them together.
//!
//! sled keeps a record of every page of every tree in memory while the database is open,
//! replaced at each write of the page, and caches nodes; the session that made the call is
//! freed far sooner. Placed among a busy daemon's short-lived objects, each such survivor
//! pins a page of freed ones once the sessions left memory. [`StoreScope`] marks the thread
//! while a store call runs, sled marks where it allocates a page's record
//! (`sled::alloc_class`), and [`current`] combines the two for the daemon's allocator
//! (`src/memory.rs`), which places each class in an arena of its own. Without such an
//! allocator the mark costs one thread-local write.

use std::cell::Cell;

thread_local! {
    static IN_STORE: Cell<bool> = const { Cell::new(false) };
}

/// What the current thread is allocating, as far as the store knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Nothing of the store's.
    Other,
    /// A sled page's record (`sled::alloc_class`): kept while the database is open.
    Page,
    /// Anything else a store call allocates: cached nodes, and what the call drops.
    Store,
}

/// What the current thread is allocating.
#[inline]
pub fn current() -> Class {
    if !IN_STORE.with(Cell::get) {
        Class::Other
    } else if sled::alloc_class::is_long_lived() {
        Class::Page
    } else {
        Class::Store
    }
}

/// Marks the current thread as inside a store call until dropped (nested scopes keep the
/// outer mark).
#[must_use = "the mark lasts as long as the scope"]
pub struct StoreScope {
    outer: bool,
}

impl StoreScope {
    /// Marks the thread until the scope drops.
    #[inline]
    pub fn enter() -> StoreScope {
        StoreScope {
            outer: IN_STORE.replace(true),
        }
    }
}

impl Drop for StoreScope {
    #[inline]
    fn drop(&mut self) {
        IN_STORE.set(self.outer);
    }
}
