//! The few process-group calls the standard library lacks (`kill(-pgid, sig)`), through
//! `libc`, plus `/proc` checks.

// The one unsafe call of the toolsets: `kill(2)` on a process group.
#![allow(unsafe_code)]

use std::path::Path;

pub(crate) use libc::{SIGINT, SIGKILL, SIGTERM};

/// Sends `signal` to every process of the group `pgid`. Refuses groups 0 and 1 (our own
/// group, init) so a bad value can never signal the daemon itself. `true` when the group
/// existed.
pub(crate) fn signal_group(pgid: u32, signal: i32) -> bool {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return false;
    };
    if pgid <= 1 || u32::try_from(pgid).ok() == Some(std::process::id()) {
        return false;
    }
    // SAFETY: `kill` has no memory-safety preconditions; a negative pid addresses the
    // process group `pgid`, which we created for a child of ours.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

/// Whether the process `pid` is running: it exists in `/proc` and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) S ...`: the state follows the last `)`.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}

/// Whether process `pid` carries `NAME=value` in its environment: how a restarted daemon
/// recognises a task process of its predecessor before killing its group (a pid may have
/// been reused by an unrelated process since).
pub(crate) fn process_has_env(pid: u32, entry: &str) -> bool {
    let path = Path::new("/proc").join(pid.to_string()).join("environ");
    match std::fs::read(path) {
        Ok(environ) => environ.split(|&b| b == 0).any(|e| e == entry.as_bytes()),
        Err(_) => false,
    }
}
