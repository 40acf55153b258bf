//! The store tells the allocator which allocations are its own (`bot/src/store/arena.rs`):
//! sled's page records apart from the rest of a store call's, and nothing outside a call.
//! Its own test binary, to count allocations with a global allocator of its own.

// A global allocator is an unsafe trait; each block says why it is sound.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use parlor_bot::store::arena::{self, Class, StoreScope};
use parlor_bot::store::{SledStore, Store, StoreOptions};

static PAGE: AtomicUsize = AtomicUsize::new(0);
static STORE: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting allocations by the store's class.
struct Counting;

// SAFETY: every call is passed on to `System` unchanged; counting touches only atomics and
// the store's thread-local marks, which allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match arena::current() {
            Class::Page => PAGE.fetch_add(1, Ordering::Relaxed),
            Class::Store => STORE.fetch_add(1, Ordering::Relaxed),
            Class::Other => 0,
        };
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn sled_page_records_and_the_rest_of_a_store_call_are_told_apart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SledStore::open(&dir.path().join("db"), StoreOptions::default()).expect("open");
    assert_eq!(arena::current(), Class::Other);
    let (page, other) = (PAGE.load(Ordering::Relaxed), STORE.load(Ordering::Relaxed));
    for n in 0..200 {
        store
            .kv_put("notes", &format!("telegram:-100{n}|key"), "a value")
            .expect("put");
    }
    assert!(
        PAGE.load(Ordering::Relaxed) > page,
        "writes make page records"
    );
    assert!(
        STORE.load(Ordering::Relaxed) > other,
        "and other allocations"
    );
    // Outside a call, nothing is the store's, nested scopes included.
    assert_eq!(arena::current(), Class::Other);
    {
        let _outer = StoreScope::enter();
        {
            let _inner = StoreScope::enter();
            assert_eq!(arena::current(), Class::Store);
        }
        assert_eq!(arena::current(), Class::Store);
    }
    assert_eq!(arena::current(), Class::Other);
}
