//! Giving memory back: glibc's allocator keeps what a burst freed (the sessions of
//! thousands of chats that went quiet) mapped in the process, so RSS stays at the peak for
//! the daemon's whole life. Two glibc knobs fix most of that (docs/perf.md, "Profiles"):
//! fewer arenas, so freed blocks are reused instead of scattered over one arena per thread,
//! and `malloc_trim` after sessions left memory, which returns the free pages to the
//! kernel. Elsewhere than glibc both are no-ops.

// `mallopt` and `malloc_trim` are C calls the standard library does not wrap; each says
// why it is sound.
#![allow(unsafe_code)]

use std::time::Duration;

use parlor_bot::session::SessionManager;
use tokio_util::sync::CancellationToken;

/// How often the trimmer looks whether sessions left memory. Trimming walks the heap
/// (a few milliseconds for a large one), so it runs at most this often, and only after
/// evictions; soon enough that a burst's memory is back within seconds of going idle.
const TRIM_EVERY: Duration = Duration::from_secs(5);

/// Arenas glibc may create. Its default is eight per core, one per thread that allocates
/// at the same time; the daemon's work is mostly waiting, so two are plenty.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENAS: libc::c_int = 2;

/// Blocks at least this large get their own mapping, given back whole when freed. Setting
/// it also stops glibc from raising it after each such free (up to 32 MiB), which makes
/// a burst's large buffers come from the heap, where they pin the pages around them.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// Sets glibc's allocator up for a long-lived daemon. Call first thing in `main`, before
/// any thread exists.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets allocator parameters; called before other threads
    // exist, nothing allocates concurrently. Its result (0 on an unknown parameter) only
    // means the default stays, which is harmless.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Returns freed heap pages to the kernel.
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` is thread-safe (it takes each arena's lock) and only releases
    // memory no allocation uses. The result says whether anything was released.
    unsafe {
        libc::malloc_trim(0);
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
        let evictions = sessions.stats().evictions;
        if evictions != seen {
            seen = evictions;
            // Inline: a few milliseconds at most, every few seconds at most, and a blocking
            // thread started for it would itself stay resident for a while.
            trim();
        }
    }
}
