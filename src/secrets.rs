//! Keeping the daemon's secrets (the LLM API key, the bot tokens) to the daemon: a type whose
//! `Debug` never shows them, systemd credentials, and the scrubbing of the process
//! environment once they are read, so that neither a child process nor anyone reading
//! `/proc/<pid>/environ` finds them there.

// Changing the environment (and its block in place) and `prctl` are unsafe calls; each says
// why it is sound where it is made.
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;

/// A secret value. `Debug` prints `[redacted]`; the value is reached only by
/// [`Secret::expose`], at the place it is handed to a client.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`, trimmed (files and environment files often end in a newline).
    pub fn new(value: &str) -> Secret {
        Secret(value.trim().to_owned())
    }

    /// The value itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Reads a secret file the configuration names; an empty one is an error, as it is
/// certainly a mistake.
pub fn read_file(path: &Path, key: &str) -> anyhow::Result<Secret> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {key} {}", path.display()))?;
    let secret = Secret::new(&text);
    if secret.expose().is_empty() {
        bail!("{key} {} is empty", path.display());
    }
    Ok(secret)
}

/// The systemd credential `name` (`LoadCredential=name:/path` in the unit), when systemd
/// passed one: `$CREDENTIALS_DIRECTORY/name`.
pub fn credential(name: &str) -> anyhow::Result<Option<(PathBuf, Secret)>> {
    let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY") else {
        return Ok(None);
    };
    let path = Path::new(&dir).join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let secret = Secret::new(&text);
            if secret.expose().is_empty() {
                bail!("the systemd credential {} is empty", path.display());
            }
            Ok(Some((path, secret)))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => {
            Err(e).with_context(|| format!("cannot read the systemd credential {}", path.display()))
        }
    }
}

/// The secret in environment variable `name`, if set and not blank.
pub fn from_env(name: &str) -> Option<Secret> {
    let value = std::env::var(name).ok()?;
    let secret = Secret::new(&value);
    (!secret.expose().is_empty()).then_some(secret)
}

/// What [`scrub_env`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scrubbed {
    /// The variables that were set and are now gone.
    pub removed: Vec<String>,
    /// Those whose value `/proc/self/environ` still shows (the in-place overwrite missed
    /// it, say because something had replaced the variable before).
    pub still_visible: Vec<String>,
}

/// Removes the variables `names` from this process: their values are overwritten in place
/// in the environment block the kernel shows as `/proc/<pid>/environ` (unsetting a variable
/// only drops libc's pointer to it; the block on the initial stack keeps the text), then
/// they are unset, so no child inherits them.
///
/// # Safety
///
/// No other thread may run: they could be reading the environment meanwhile
/// (`std::env::remove_var`'s own contract).
pub unsafe fn scrub_env(names: &[String]) -> Scrubbed {
    let mut scrubbed = Scrubbed::default();
    let mut values = Vec::new();
    for name in names {
        if name.is_empty() || name.contains('=') || scrubbed.removed.contains(name) {
            continue;
        }
        let Some(value) = std::env::var_os(name) else {
            continue;
        };
        // SAFETY: the caller guarantees a single thread; see the function's contract.
        unsafe {
            overwrite_in_place(name);
            std::env::remove_var(name);
        }
        scrubbed.removed.push(name.clone());
        values.push((name.clone(), value));
    }
    if let Ok(shown) = std::fs::read("/proc/self/environ") {
        for (name, value) in values {
            let value = std::os::unix::ffi::OsStrExt::as_bytes(value.as_os_str());
            if !value.is_empty() && shown.windows(value.len()).any(|w| w == value) {
                scrubbed.still_visible.push(name);
            }
        }
    }
    scrubbed
}

unsafe extern "C" {
    // POSIX: the process's environment, initially pointing into the block on the stack.
    static mut environ: *mut *mut libc::c_char;
}

/// Overwrites with zero bytes the value of every `name=value` entry of `environ`.
///
/// # Safety
///
/// No other thread may touch the environment meanwhile.
unsafe fn overwrite_in_place(name: &str) {
    let name = name.as_bytes();
    // SAFETY: `environ` is a NULL-terminated array of NUL-terminated strings owned by libc;
    // with a single thread nothing changes it while we walk it. Each entry is writable
    // memory (the initial stack, or a copy setenv allocated), and we write only inside the
    // entry's own length, keeping its terminating NUL.
    unsafe {
        let mut entry = environ;
        if entry.is_null() {
            return;
        }
        while !(*entry).is_null() {
            let text = *entry;
            let len = std::ffi::CStr::from_ptr(text).to_bytes().len();
            let bytes = std::slice::from_raw_parts(text.cast::<u8>(), len);
            if len > name.len() && bytes.starts_with(name) && bytes[name.len()] == b'=' {
                let value = text.add(name.len() + 1);
                for i in 0..len - name.len() - 1 {
                    // Volatile: no write to memory only the kernel reads is "dead".
                    std::ptr::write_volatile(value.add(i), 0);
                }
            }
            entry = entry.add(1);
        }
    }
}

/// Makes this process non-dumpable: `/proc/<pid>/environ`, `mem`, `maps` and the like
/// become root's, so a child running as the same unprivileged user (the terminal's shell)
/// cannot read them, nor ptrace the daemon; no core dump carries the secrets either. A child
/// regains the default when it executes a program.
pub fn make_non_dumpable() {
    // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot make the process non-dumpable");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let s = Secret::new(" sk-very-secret\n");
        assert_eq!(s.expose(), "sk-very-secret");
        assert_eq!(format!("{s:?}"), "[redacted]");
        assert_eq!(format!("{:?}", Some(&s)), "Some([redacted])");
    }

    #[test]
    fn an_empty_secret_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "\n").unwrap();
        let e = read_file(&path, "llm.api_key_file").unwrap_err();
        assert!(e.to_string().contains("is empty"), "{e}");
        std::fs::write(&path, "sk-1\n").unwrap();
        assert_eq!(read_file(&path, "k").unwrap().expose(), "sk-1");
    }
}
