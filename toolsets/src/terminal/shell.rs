//! The persistent foreground shell of a session: one `bash` per session, in its own process
//! group, driven over stdin with a sentinel protocol.
//!
//! Each command is sent as one line:
//! `eval $'<command>' </dev/null; rc=$?; <save state>; printf '\n__PARLOR_DONE_<nonce>_%s\n' $rc`
//! and stdout (stderr is merged into it with `exec 2>&1` at start) is read until that
//! sentinel. (Not `{ eval ...; }`: after a syntax error inside `eval`, bash 5 no longer
//! parses `{` as a reserved word on the next line.) `eval` runs in the shell itself, so `cd` and `export` carry over; its stdin is
//! `/dev/null`, so a command that reads stdin cannot eat the protocol. After every completed
//! command the shell saves its exported variables and working directory to a state file.
//!
//! On a timeout or cancellation the whole process group (the shell, the command and
//! everything it started, `&` jobs included) gets SIGINT, then SIGKILL after a grace period,
//! and the shell is discarded; the next call starts a new one that first restores the state
//! file, so the working directory and exports of the last *completed* command survive. A
//! shell that exits (`exit`, `set -e`) is replaced the same way. Dropping a [`Shell`] (a
//! cancelled call, `/reset`, an idle session leaving memory) kills its group.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio_util::sync::CancellationToken;

use super::output::CappedBuf;
use super::sys;

/// Process groups of live shells, for shutdown.
#[derive(Debug, Default)]
pub(crate) struct Groups(Mutex<HashSet<u32>>);

impl Groups {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<u32>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub(crate) fn all(&self) -> Vec<u32> {
        self.lock().iter().copied().collect()
    }
}

/// One running bash.
pub(crate) struct Shell {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    pgid: u32,
    session: String,
    state_file: PathBuf,
    groups: Arc<Groups>,
}

impl Drop for Shell {
    fn drop(&mut self) {
        sys::signal_group(self.pgid, sys::SIGKILL);
        self.groups.lock().remove(&self.pgid);
    }
}

/// Why a command did not finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interrupt {
    Timeout,
    Cancelled,
}

/// How a foreground command ended.
pub(crate) enum RunEnd {
    /// The sentinel arrived: the command's exit code; the shell is reusable.
    Done { code: i32, output: CappedBuf },
    /// Timed out or cancelled; the group was killed and the shell is gone.
    Interrupted { why: Interrupt, output: CappedBuf },
    /// The shell itself ended (`exit`, a fatal error); its status if known.
    Exited {
        status: Option<ExitStatus>,
        output: CappedBuf,
    },
    /// Writing the command failed: the shell was already dead.
    Broken,
}

static NONCE: AtomicU64 = AtomicU64::new(0);

fn nonce() -> String {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded randomly per process; mixing in a counter makes every nonce
    // unique. Unpredictable enough that output cannot fake a sentinel by accident.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(NONCE.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    format!("{:016x}", h.finish())
}

/// `s` as a bash ANSI-C quoted word (`$'...'`), safe for any text without NUL.
pub(crate) fn ansi_c_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 3);
    out.push_str("$'");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\x7f' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// `s` as a single-quoted shell word.
pub(crate) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Shell {
    /// Starts bash from `command` (already carrying env, cwd and sandbox) in its own process
    /// group, and restores `state_file` when it exists.
    pub(crate) async fn spawn(
        mut command: Command,
        session: &str,
        state_file: PathBuf,
        groups: Arc<Groups>,
    ) -> std::io::Result<Shell> {
        command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = command.spawn()?;
        let pgid = child.id().unwrap_or(0);
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(std::io::Error::other("bash started without pipes"));
        };
        groups.lock().insert(pgid);
        let state = sh_quote(&state_file.to_string_lossy());
        let init = format!("exec 2>&1\nif [ -r {state} ]; then . {state} >/dev/null 2>&1; fi\n",);
        let shell_result = stdin.write_all(init.as_bytes()).await;
        let shell = Shell {
            child,
            stdin,
            stdout,
            pgid,
            session: session.to_owned(),
            state_file,
            groups,
        };
        shell_result?;
        Ok(shell)
    }

    pub(crate) fn session(&self) -> &str {
        &self.session
    }

    pub(crate) fn pgid(&self) -> u32 {
        self.pgid
    }

    /// Runs `command` to its end, its timeout or `cancel`. See the module docs.
    pub(crate) async fn run(
        &mut self,
        command: &str,
        timeout: Duration,
        cancel: &CancellationToken,
        grace: Duration,
        cap_bytes: usize,
    ) -> RunEnd {
        let nonce = nonce();
        let state = sh_quote(&self.state_file.to_string_lossy());
        let line = format!(
            "eval {} </dev/null; __parlor_rc=$?; {{ export -p; printf 'cd -- %q\\n' \"$PWD\"; }} >{state} 2>/dev/null; printf '\\n__PARLOR_DONE_{nonce}_%s\\n' \"$__parlor_rc\"\n",
            ansi_c_quote(command),
        );
        let marker = format!("\n__PARLOR_DONE_{nonce}_");
        let mut output = CappedBuf::new(cap_bytes);
        if self.stdin.write_all(line.as_bytes()).await.is_err() || self.stdin.flush().await.is_err()
        {
            return RunEnd::Broken;
        }
        let Shell { child, stdout, .. } = &mut *self;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut chunk = vec![0u8; 8192];
        enum Stop {
            Interrupt(Interrupt),
            Eof,
            Exited(Option<ExitStatus>),
        }
        let stop = loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => break Stop::Interrupt(Interrupt::Cancelled),
                () = &mut deadline => break Stop::Interrupt(Interrupt::Timeout),
                read = stdout.read(&mut chunk) => match read {
                    Ok(0) | Err(_) => break Stop::Eof,
                    Ok(n) => {
                        output.push(&chunk[..n]);
                        if let Some((len, code)) = find_sentinel(&output, &marker) {
                            output.truncate_end(len);
                            return RunEnd::Done { code, output };
                        }
                    }
                },
                status = child.wait() => break Stop::Exited(status.ok()),
            }
        };
        match stop {
            Stop::Interrupt(why) => {
                sys::signal_group(self.pgid, sys::SIGINT);
                drain(&mut self.stdout, &mut output, &mut self.child, grace, true).await;
                sys::signal_group(self.pgid, sys::SIGKILL);
                drain(
                    &mut self.stdout,
                    &mut output,
                    &mut self.child,
                    Duration::from_millis(500),
                    false,
                )
                .await;
                RunEnd::Interrupted { why, output }
            }
            Stop::Eof | Stop::Exited(_) => {
                // The shell ended; whatever it left behind in its group goes with it.
                let mut status = match stop {
                    Stop::Exited(s) => s,
                    _ => None,
                };
                let drained = drain(
                    &mut self.stdout,
                    &mut output,
                    &mut self.child,
                    Duration::from_millis(300),
                    false,
                )
                .await;
                status = status.or(drained);
                sys::signal_group(self.pgid, sys::SIGKILL);
                if let Some((len, code)) = find_sentinel(&output, &marker) {
                    // The command finished and then the shell went (an `exit` in a trap).
                    output.truncate_end(len);
                    return RunEnd::Done { code, output };
                }
                RunEnd::Exited { status, output }
            }
        }
    }
}

/// Reads output until end of file and the shell's exit (or only its exit, with
/// `stop_on_exit`), at most `limit`. Returns the shell's status when it ended.
async fn drain(
    stdout: &mut ChildStdout,
    output: &mut CappedBuf,
    child: &mut Child,
    limit: Duration,
    stop_on_exit: bool,
) -> Option<ExitStatus> {
    let sleep = tokio::time::sleep(limit);
    tokio::pin!(sleep);
    let mut chunk = vec![0u8; 8192];
    let mut status = None;
    let mut exited = false;
    let mut eof = false;
    while !(eof && exited) {
        tokio::select! {
            biased;
            read = stdout.read(&mut chunk), if !eof => match read {
                Ok(0) | Err(_) => eof = true,
                Ok(n) => output.push(&chunk[..n]),
            },
            s = child.wait(), if !exited => {
                exited = true;
                status = s.ok();
                if stop_on_exit {
                    break;
                }
            }
            () = &mut sleep => break,
        }
    }
    status
}

/// When the output ends with the sentinel line: its length (to cut) and the exit code.
fn find_sentinel(output: &CappedBuf, marker: &str) -> Option<(usize, i32)> {
    let last = output.last_bytes(marker.len() + 16);
    let marker = marker.as_bytes();
    let at = last.windows(marker.len()).rposition(|w| w == marker)?;
    let rest = &last[at + marker.len()..];
    let digits = rest.strip_suffix(b"\n")?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let code = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some((last.len() - at, code))
}

/// A session's slot for its shell: serializes the session's foreground calls and lets
/// `/reset` kill the shell even while a command runs.
#[derive(Default)]
pub(crate) struct ShellHandle {
    pub(crate) slot: tokio::sync::Mutex<Option<Shell>>,
    /// Bumped by a reset: a shell from an older generation is not put back.
    pub(crate) generation: AtomicU64,
    /// The group of the shell running a command now (0: none), for a reset mid-command.
    pub(crate) busy_pgid: AtomicU32,
    /// Whether a shell has been started before (to tell the model a new one began).
    pub(crate) started_once: std::sync::atomic::AtomicBool,
    /// The state file of this handle, once known.
    pub(crate) state_file: Mutex<Option<PathBuf>>,
}

impl ShellHandle {
    /// Whether a shell is alive, busy, or has state saved for the next one.
    pub(crate) fn holds_state(&self) -> bool {
        let live = match self.slot.try_lock() {
            Ok(slot) => slot.is_some(),
            Err(_) => true,
        };
        live || self.started_once.load(Ordering::SeqCst)
    }

    /// Kills the shell (idle or busy) and forgets its saved state.
    pub(crate) fn reset(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut slot) = self.slot.try_lock() {
            slot.take();
        } else {
            let pgid = self.busy_pgid.load(Ordering::SeqCst);
            if pgid != 0 {
                sys::signal_group(pgid, sys::SIGKILL);
            }
        }
        let state = self
            .state_file
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(path) = state {
            let _ = std::fs::remove_file(path);
        }
        self.started_once.store(false, Ordering::SeqCst);
    }
}

impl Drop for ShellHandle {
    fn drop(&mut self) {
        if let Some(path) = self
            .state_file
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Whether `path` names an executable file (`bwrap`, `bash`), searching `PATH` when it is
/// a bare name.
pub(crate) fn find_program(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let is_exec = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if path.components().count() > 1 {
        return is_exec(path).then(|| path.to_owned());
    }
    let dirs = std::env::var_os("PATH")?;
    std::env::split_paths(&dirs)
        .map(|d| d.join(path))
        .find(|p| is_exec(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(ansi_c_quote("echo 'a'\n\\"), r"$'echo \'a\'\n\\'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn sentinel_is_found_only_at_the_end() {
        let mut buf = CappedBuf::new(256);
        buf.push(b"out\n__PARLOR_DONE_ab_1");
        assert_eq!(find_sentinel(&buf, "\n__PARLOR_DONE_ab_"), None);
        buf.push(b"7\n");
        assert_eq!(find_sentinel(&buf, "\n__PARLOR_DONE_ab_"), Some((21, 17)));
    }
}
