//! Which of sled's allocations outlive the call that makes them (a parlor patch).
//!
//! Every page of every tree keeps a small record in memory for as long as the database is
//! open (`Page` and its `cache_infos`), whether or not the page's node is cached, and a new
//! record replaces the old one at each write of the page. Placed among the short-lived
//! objects of the same calls, each of these records pins a mostly freed page of memory
//! once a burst is over. [`is_long_lived`] tells the process's allocator, if it cares,
//! that the current thread is allocating such a record, so it can place them together.

use std::cell::Cell;

thread_local! {
    static LONG_LIVED: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread is allocating a page's record.
#[inline]
pub fn is_long_lived() -> bool {
    LONG_LIVED.with(Cell::get)
}

/// Runs `f` with the current thread marked as allocating a page's record.
#[inline]
pub(crate) fn long_lived<T>(f: impl FnOnce() -> T) -> T {
    let outer = LONG_LIVED.with(|c| c.replace(true));
    let result = f();
    LONG_LIVED.with(|c| c.set(outer));
    result
}
