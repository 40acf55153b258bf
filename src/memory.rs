//! The daemon's allocator, and giving memory back.
//!
//! jemalloc is the global allocator. After a burst (10,000 chats answered once, then idle)
//! glibc's allocator kept 50 MiB resident for about 20 MiB in use, even after
//! `malloc_trim`: what stays alive (sled's cached nodes, the pools' buffers) sits on pages
//! among the freed sessions. jemalloc keeps each size class on its own pages and gives
//! freed pages back on its own (`dirty_decay_ms`, from its background thread), and at once
//! when its arena is purged, which the daemon does after sessions left memory
//! (docs/perf.md has the figures).
//!
//! What the store allocates goes to two arenas of its own ([`Allocator`]): sled keeps a
//! record of every page of every tree in memory, replaced at each write, and cached nodes;
//! placed among the short-lived objects of the busy daemon around them, each pinned a page
//! of freed memory once the chats left (docs/perf.md, "sled's page records in an arena of
//! their own").
//!
//! The executable's own pages are most of an idle daemon's memory: starting touches code
//! all over a large binary (config, every adapter's set-up, the store's recovery), and the
//! kernel maps 64 KiB around each page touched. Once the daemon is ready, and again when
//! every session has left memory, it asks the kernel to reclaim those clean file pages
//! (`MADV_PAGEOUT`); the few an idle daemon runs come back on use, each page alone rather
//! than with the kernel's read-around (`MADV_RANDOM`). Elsewhere than Linux this is a no-op.

// `mallctl` and `madvise` are C calls the standard library does not wrap, and jemalloc
// reads its options from an exported symbol; each says why it is sound.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use parlor_bot::session::SessionManager;
use parlor_bot::store::arena::Class;
use tikv_jemalloc_sys as jemalloc;
use tokio_util::sync::CancellationToken;

#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

/// The arenas the store's allocations go to ([`parlor_bot::store::arena`]): sled's page
/// records, and the rest of a store call's. 0 until [`start_background_purge`] created
/// them (arena 0 is one of jemalloc's automatic arenas, never one of these).
static PAGE_ARENA: AtomicU32 = AtomicU32::new(0);
static STORE_ARENA: AtomicU32 = AtomicU32::new(0);

/// jemalloc, with what the store allocates placed in arenas of its own.
struct Allocator;

/// `mallocx` flags for the store's arenas, bypassing the thread's cache (a cache holds
/// freed objects of any arena and would hand them back for other uses), or `None` for an
/// allocation of anything else.
#[inline]
fn store_flags(align: usize, size: usize) -> Option<c_int> {
    let arena = match parlor_bot::store::arena::current() {
        Class::Other => return None,
        Class::Page => PAGE_ARENA.load(Ordering::Relaxed),
        Class::Store => STORE_ARENA.load(Ordering::Relaxed),
    };
    if arena == 0 {
        return None;
    }
    // As `tikv_jemallocator` does: jemalloc's own alignment suffices up to `max_align_t`'s.
    let align = if align <= std::mem::align_of::<libc::max_align_t>() && align <= size {
        0
    } else {
        jemalloc::MALLOCX_ALIGN(align)
    };
    Some(align | jemalloc::MALLOCX_ARENA(arena as usize) | jemalloc::MALLOCX_TCACHE_NONE)
}

// SAFETY: every path is jemalloc's own `GlobalAlloc` or its `*allocx` functions with the
// same size and alignment flags; an arena flag only picks where a new object goes, and
// `sdallocx`/`rallocx` find an object's arena from its address whatever arena it is in.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match store_flags(layout.align(), layout.size()) {
            // SAFETY: as the impl says; the size is not zero (GlobalAlloc's contract).
            Some(flags) => unsafe { jemalloc::mallocx(layout.size(), flags).cast() },
            // SAFETY: the caller's contract is passed on.
            None => unsafe { tikv_jemallocator::Jemalloc.alloc(layout) },
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match store_flags(layout.align(), layout.size()) {
            // SAFETY: as in `alloc`.
            Some(flags) => unsafe {
                jemalloc::mallocx(layout.size(), flags | jemalloc::MALLOCX_ZERO).cast()
            },
            // SAFETY: the caller's contract is passed on.
            None => unsafe { tikv_jemallocator::Jemalloc.alloc_zeroed(layout) },
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on; jemalloc frees into the object's own
        // arena whatever the flags.
        unsafe { tikv_jemallocator::Jemalloc.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match store_flags(layout.align(), new_size) {
            // SAFETY: as in `alloc`; `ptr` is live and was allocated with this alignment.
            Some(flags) => unsafe { jemalloc::rallocx(ptr.cast(), new_size, flags).cast() },
            // SAFETY: the caller's contract is passed on.
            None => unsafe { tikv_jemallocator::Jemalloc.realloc(ptr, layout, new_size) },
        }
    }
}

/// jemalloc's options, read once at its first allocation (the symbol name is its
/// prefixed `malloc_conf`):
/// - two arenas: jemalloc's default is four per core, one per thread allocating at once;
///   the daemon's work is mostly waiting, and every further arena strands freed memory.
///   One arena was tried: the workers then wait on its lock (more than twice the CPU per
///   turn in parlor-bench);
/// - freed pages go back after a second (`dirty_decay_ms`), purged by a background thread
///   ([`start_background_purge`]) rather than by the threads that free them, in the middle
///   of a turn (purging inline about doubled the CPU per turn). That thread is not asked
///   for here: jemalloc would start it at its first allocation, before `main`, and the
///   environment can only be scrubbed of secrets while the process has one thread;
/// - no lazy `MADV_FREE` stage (`muzzy_decay_ms:0`): such pages stay counted in RSS until
///   the kernel wants them;
/// - one page per slab for the size classes up to 2 KiB (`slab_sizes:1-2048:1`; by default
///   a slab is the least common multiple of page and object size, up to 7 pages): a page
///   goes back once its own objects are freed, rather than once all of a larger slab's are. After 10,000 chats left memory, what stays alive
///   (sled's cached nodes, the pools) had pinned many half-empty slabs: RSS 39.9 -> 32.1 MiB
///   in parlor-bench, CPU per turn unchanged in alternating `parlor-bench cpu 6` runs;
/// - smaller thread caches (`lg_tcache_nslots_mul:-1,tcache_nslots_small_max:64`: half as
///   many objects a size class, 64 at most instead of 200): what a thread caches stays
///   allocated, with the page under it, for as long as the thread lives and allocates
///   nothing else. After 10,000 chats it was over a mebibyte.
// SAFETY: jemalloc reads this as a NUL-terminated `const char *`: a reference to a byte
// array is exactly that pointer, and the bytes end in NUL and live for the whole process.
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: &[u8; 118] =
    b"narenas:2,dirty_decay_ms:1000,muzzy_decay_ms:0,slab_sizes:1-2048:1,lg_tcache_nslots_mul:-1,tcache_nslots_small_max:64\0";

/// Starts jemalloc's background purging thread. Call once the environment is scrubbed
/// (`main`), and before the runtime starts: the thread is jemalloc's own, lives as long as
/// the process and touches nothing but the allocator's state.
pub fn start_background_purge() {
    let name = b"background_thread\0";
    let mut enable = true;
    // SAFETY: `name` is NUL-terminated; the new value is a `bool`, as jemalloc documents
    // for this option, passed by pointer with its size, and no old value is read. A
    // non-zero result (a jemalloc built without background threads) leaves purging to the
    // freeing threads, which only costs CPU.
    let rc = unsafe {
        jemalloc::mallctl(
            name.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            (&raw mut enable).cast(),
            std::mem::size_of::<bool>(),
        )
    };
    if rc != 0 {
        tracing::debug!(rc, "jemalloc's background purging thread did not start");
    }
    create_store_arenas();
}

/// Creates the store's arenas ([`PAGE_ARENA`], [`STORE_ARENA`]). Without them (an
/// error), the store's allocations go where every other one does.
fn create_store_arenas() {
    for arena in [&PAGE_ARENA, &STORE_ARENA] {
        let name = b"arenas.create\0";
        let mut index: u32 = 0;
        let mut len = std::mem::size_of::<u32>();
        // SAFETY: `name` is NUL-terminated; `arenas.create` writes the new arena's index,
        // an `unsigned`, through the pointer given with its size, and reads no new value.
        let rc = unsafe {
            jemalloc::mallctl(
                name.as_ptr().cast(),
                (&raw mut index).cast(),
                &raw mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        if rc != 0 || index == 0 {
            tracing::debug!(rc, "jemalloc did not create the store's arenas");
            return;
        }
        arena.store(index, Ordering::Relaxed);
    }
}

/// How often the trimmer looks whether sessions left memory; soon enough that a burst's
/// memory is back within seconds of going idle.
const TRIM_EVERY: Duration = Duration::from_secs(5);

/// Returns the freed pages of every jemalloc arena to the kernel now, rather than over
/// the next second.
fn trim() {
    // `arena.<MALLCTL_ARENAS_ALL>.purge`, MALLCTL_ARENAS_ALL being 4096.
    let name = b"arena.4096.purge\0";
    // SAFETY: `name` is NUL-terminated; a purge reads and writes no value (all pointers
    // null, length 0) and is thread-safe. A non-zero result only means nothing was purged.
    unsafe {
        jemalloc::mallctl(
            name.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

/// Trims the heap after sessions left memory, until `shutdown`.
pub async fn trim_after_evictions(sessions: SessionManager, shutdown: CancellationToken) {
    let mut seen = sessions.stats().evictions;
    let mut ticks = tokio::time::interval(TRIM_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let stats = sessions.stats();
        if stats.evictions != seen {
            seen = stats.evictions;
            // Inline: a few milliseconds at most, every few seconds at most, and a blocking
            // thread started for it would itself stay resident for a while.
            trim();
            if stats.live_sessions == 0 {
                // Idle again, as after starting: what the burst ran of the binary can go.
                release_code_pages();
            }
        }
    }
}

/// Asks the kernel to reclaim the resident pages of the executable's read-only mappings
/// (code and constants). They are clean pages of the file, so nothing is lost: a page used
/// again is read back in, without the pages around it. Pages written at load time (the
/// few the loader fills in a position-dependent build, every pointer table in a PIE) are
/// left alone by the kernel. Best effort: an older kernel without `MADV_PAGEOUT` (before
/// 5.4) keeps them, which only costs memory.
pub fn release_code_pages() {
    #[cfg(target_os = "linux")]
    {
        let (Ok(exe), Ok(maps)) = (
            std::fs::read_link("/proc/self/exe"),
            std::fs::read_to_string("/proc/self/maps"),
        ) else {
            return;
        };
        let exe = exe.to_string_lossy();
        let mut released = 0usize;
        for (start, len) in maps
            .lines()
            .filter_map(|line| read_only_mapping(line, &exe))
        {
            // SAFETY: `start..start + len` is one of this process's own mappings of its
            // executable, as /proc/self/maps lists it (they are never unmapped while the
            // process runs). `MADV_RANDOM` changes no content and no protection, only how
            // much the kernel reads in at a fault: a page run again comes back alone, not
            // with the 128 KiB around it (idle RSS 0.3-0.5 MiB lower in parlor-bench).
            // `MADV_PAGEOUT` neither: it only lets the kernel reclaim the pages now rather
            // than under memory pressure.
            let rc = unsafe {
                libc::madvise(start as *mut libc::c_void, len, libc::MADV_RANDOM);
                libc::madvise(start as *mut libc::c_void, len, libc::MADV_PAGEOUT)
            };
            if rc == 0 {
                released += len;
            }
        }
        tracing::debug!(
            mapped_bytes = released,
            "asked the kernel to reclaim the executable's pages"
        );
    }
}

/// `(start, length)` of a line of /proc/self/maps when it maps `exe` without write access.
fn read_only_mapping(line: &str, exe: &str) -> Option<(usize, usize)> {
    let mut fields = line.split_whitespace();
    let range = fields.next()?;
    let perms = fields.next()?;
    // The fields before the path (range, perms, offset, device, inode) hold no '/', and
    // the path may hold spaces.
    let path = &line[line.find('/')?..];
    if path != exe || perms.contains('w') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    Some((start, end.checked_sub(start)?))
}

#[cfg(test)]
mod tests {
    use parlor_bot::store::arena::StoreScope;

    use super::{PAGE_ARENA, STORE_ARENA, create_store_arenas, jemalloc, read_only_mapping};
    use std::sync::atomic::Ordering;

    /// The jemalloc arena `ptr` was allocated in (`arenas.lookup`).
    fn arena_of(ptr: *const u8) -> u32 {
        let name = b"arenas.lookup\0";
        let mut index: u32 = u32::MAX;
        let mut len = std::mem::size_of::<u32>();
        let mut ptr = ptr;
        // SAFETY: `name` is NUL-terminated; `arenas.lookup` reads a pointer (passed by
        // pointer with its size) and writes the arena's index, an `unsigned`.
        let rc = unsafe {
            jemalloc::mallctl(
                name.as_ptr().cast(),
                (&raw mut index).cast(),
                &raw mut len,
                (&raw mut ptr).cast(),
                std::mem::size_of::<*const u8>(),
            )
        };
        assert_eq!(rc, 0, "arenas.lookup");
        index
    }

    #[test]
    fn what_a_store_call_allocates_goes_to_the_store_arena() {
        create_store_arenas();
        let store = STORE_ARENA.load(Ordering::Relaxed);
        let page = PAGE_ARENA.load(Ordering::Relaxed);
        assert!(store != 0 && page != 0 && store != page);
        let inside = {
            let _scope = StoreScope::enter();
            Box::new([7u8; 40])
        };
        let outside = Box::new([7u8; 40]);
        assert_eq!(arena_of(inside.as_ptr()), store);
        let other = arena_of(outside.as_ptr());
        assert!(other != store && other != page, "arena {other}");
    }

    #[test]
    fn only_read_only_mappings_of_the_executable_are_chosen() {
        let exe = "/opt/parlor dir/parlor";
        let line = |perms: &str, path: &str| {
            format!("55d0c0a00000-55d0c0c00000 {perms} 00000000 fd:01 1234   {path}")
        };
        assert_eq!(
            read_only_mapping(&line("r-xp", exe), exe),
            Some((0x55d0_c0a0_0000, 0x20_0000))
        );
        assert!(read_only_mapping(&line("r--p", exe), exe).is_some());
        assert_eq!(read_only_mapping(&line("rw-p", exe), exe), None);
        assert_eq!(
            read_only_mapping(&line("r-xp", "/usr/lib/libc.so.6"), exe),
            None
        );
        assert_eq!(
            read_only_mapping("7ffd1000-7ffd2000 rw-p 00000000 00:00 0", exe),
            None
        );
        assert_eq!(read_only_mapping("garbage", exe), None);
    }
}
