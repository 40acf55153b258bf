//! bubblewrap's command line for one sandboxed command.
//!
//! The sandbox is built up from nothing rather than carved out of the host: only the system
//! directories are mounted (read-only), so the daemon's data directory (its store: every
//! chat's history), other chats' workspaces, home directories, `/run` (systemd credentials,
//! sockets) and `/var` are absent without having to be named. A fresh `/proc` in a new PID
//! namespace shows the sandbox's own processes only, never the daemon's memory or
//! environment.
//!
//! [`Host::probe`] looks at the host (a few `stat` calls); [`bwrap_args`] is pure, so the
//! exact argument list is unit-tested.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The host directories a sandboxed command sees, read-only.
pub(crate) const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// Well-known secrets inside the system directories. Unreadable to an unprivileged user
/// anyway; masked for a daemon that runs as root, whose sandboxed root keeps file ownership.
const SYSTEM_SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssl/private",
    "/etc/credstore",
    "/etc/credstore.encrypted",
    "/etc/NetworkManager/system-connections",
    "/etc/wireguard",
    "/etc/security/opasswd",
];

/// What a path on the host is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    Dir,
    File,
    /// A symbolic link and its target as written (`usr/bin` for a merged-/usr `/bin`).
    Symlink(PathBuf),
}

/// The parts of the host the sandbox is assembled from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Host {
    /// The [`SYSTEM_DIRS`] that exist, in that order.
    pub(crate) system: Vec<(PathBuf, Entry)>,
    /// Paths inside the mounted system directories that must not be seen: directories get an
    /// empty tmpfs, files an unreadable stand-in.
    pub(crate) masked: Vec<(PathBuf, Entry)>,
    /// Where `/etc/resolv.conf` really lives when it points out of the system directories
    /// (systemd-resolved's `/run/systemd/resolve/stub-resolv.conf`); mounted only with the
    /// network on, so name resolution works there.
    pub(crate) resolv_conf: Option<PathBuf>,
}

impl Host {
    /// Looks at this host. `hide` are the daemon's own sensitive paths (its data directory,
    /// config file, secret files): masked when they lie inside a system directory, absent
    /// anyway otherwise.
    pub(crate) fn probe(hide: &[PathBuf]) -> Host {
        let mut system = Vec::new();
        for dir in SYSTEM_DIRS {
            let path = Path::new(dir);
            let Ok(meta) = std::fs::symlink_metadata(path) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                if let Ok(target) = std::fs::read_link(path) {
                    system.push((path.to_owned(), Entry::Symlink(target)));
                }
            } else if meta.is_dir() {
                system.push((path.to_owned(), Entry::Dir));
            }
        }
        let mounted: Vec<&Path> = system
            .iter()
            .filter(|(_, e)| *e == Entry::Dir)
            .map(|(p, _)| p.as_path())
            .collect();
        let inside = |p: &Path| mounted.iter().any(|m| p.starts_with(m));
        let mut candidates: Vec<PathBuf> = SYSTEM_SECRETS.iter().map(PathBuf::from).collect();
        // Host private keys, not the client configuration beside them.
        if let Ok(dir) = std::fs::read_dir("/etc/ssh") {
            for entry in dir.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with("ssh_host_") && name.ends_with("_key") {
                    candidates.push(entry.path());
                }
            }
        }
        candidates.extend(hide.iter().cloned());
        let mut masked: Vec<(PathBuf, Entry)> = Vec::new();
        for path in candidates {
            // Symlinks resolved, so `/bin/x` is masked where it is mounted: `/usr/bin/x`.
            let Ok(real) = std::fs::canonicalize(&path) else {
                continue;
            };
            if !inside(&real) || masked.iter().any(|(m, _)| real.starts_with(m)) {
                continue;
            }
            let entry = match std::fs::metadata(&real) {
                Ok(m) if m.is_dir() => Entry::Dir,
                Ok(_) => Entry::File,
                Err(_) => continue,
            };
            masked.retain(|(m, _)| !m.starts_with(&real));
            masked.push((real, entry));
        }
        let resolv_conf = std::fs::canonicalize("/etc/resolv.conf")
            .ok()
            .filter(|real| !inside(real));
        Host {
            system,
            masked,
            resolv_conf,
        }
    }
}

/// One sandboxed command.
pub(crate) struct Spec<'a> {
    pub(crate) host: &'a Host,
    /// Whether the command may use the network (the host's network namespace).
    pub(crate) network: bool,
    /// The chat's workspace: writable, the working directory and `HOME`.
    pub(crate) workspace: &'a Path,
    /// Further writable directories (the shell's state directory).
    pub(crate) writable: &'a [&'a Path],
    /// The program to run inside and its arguments.
    pub(crate) program: &'a Path,
    pub(crate) args: &'a [&'a str],
}

/// bubblewrap's arguments for `spec`. Mounts apply in order, so the masks come after the
/// system directories they cover, and the workspace last (it may lie under a masked data
/// directory, or under `/tmp`).
pub(crate) fn bwrap_args(spec: &Spec<'_>) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |parts: &[&std::ffi::OsStr]| args.extend(parts.iter().map(|p| p.into()));
    // Nothing of the sandbox outlives the daemon (or its kill of the process group).
    push(&["--die-with-parent".as_ref()]);
    // Its own session: no controlling terminal to inject keystrokes into (TIOCSTI) when the
    // daemon runs in one (`parlor chat`).
    push(&["--new-session".as_ref()]);
    // Its own PID namespace: the daemon's /proc/<pid> (environment, memory) does not exist.
    push(&["--unshare-pid".as_ref(), "--unshare-ipc".as_ref()]);
    push(&["--unshare-uts".as_ref(), "--unshare-cgroup-try".as_ref()]);
    if !spec.network {
        push(&["--unshare-net".as_ref()]);
    }
    // A daemon running as root would otherwise hand its capabilities to the command.
    push(&["--cap-drop".as_ref(), "ALL".as_ref()]);
    for (path, entry) in &spec.host.system {
        match entry {
            Entry::Symlink(target) => {
                push(&["--symlink".as_ref(), target.as_os_str(), path.as_os_str()])
            }
            Entry::Dir | Entry::File => {
                push(&["--ro-bind".as_ref(), path.as_os_str(), path.as_os_str()])
            }
        }
    }
    push(&["--proc".as_ref(), "/proc".as_ref()]);
    push(&["--dev".as_ref(), "/dev".as_ref()]);
    push(&["--tmpfs".as_ref(), "/tmp".as_ref()]);
    for (path, entry) in &spec.host.masked {
        match entry {
            Entry::Dir => push(&["--tmpfs".as_ref(), path.as_os_str()]),
            // Bind mounts are nodev, so the device node cannot even be opened.
            Entry::File | Entry::Symlink(_) => {
                push(&["--ro-bind".as_ref(), "/dev/null".as_ref(), path.as_os_str()])
            }
        }
    }
    if spec.network
        && let Some(resolv) = &spec.host.resolv_conf
    {
        push(&[
            "--ro-bind-try".as_ref(),
            resolv.as_os_str(),
            resolv.as_os_str(),
        ]);
    }
    for dir in std::iter::once(&spec.workspace).chain(spec.writable) {
        push(&["--bind".as_ref(), dir.as_os_str(), dir.as_os_str()]);
    }
    push(&["--chdir".as_ref(), spec.workspace.as_os_str()]);
    push(&[spec.program.as_os_str()]);
    args.extend(spec.args.iter().map(OsString::from));
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged_usr_host() -> Host {
        Host {
            system: vec![
                ("/usr".into(), Entry::Dir),
                ("/bin".into(), Entry::Symlink("usr/bin".into())),
                ("/lib".into(), Entry::Symlink("usr/lib".into())),
                ("/etc".into(), Entry::Dir),
            ],
            masked: vec![
                ("/etc/shadow".into(), Entry::File),
                ("/etc/parlor".into(), Entry::Dir),
            ],
            resolv_conf: Some("/run/systemd/resolve/stub-resolv.conf".into()),
        }
    }

    fn args_of(network: bool) -> Vec<String> {
        let host = merged_usr_host();
        let state = Path::new("/var/lib/parlor/shell_state/telegram_-100-1a2b3c4d");
        bwrap_args(&Spec {
            host: &host,
            network,
            workspace: Path::new("/var/lib/parlor/workspaces/telegram_-100-1a2b3c4d"),
            writable: &[state],
            program: Path::new("/usr/bin/bash"),
            args: &["--noprofile", "--norc"],
        })
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
    }

    #[test]
    fn the_sandbox_sees_the_system_and_its_own_workspace_only() {
        let args = args_of(false).join(" ");
        assert_eq!(
            args,
            "--die-with-parent --new-session --unshare-pid --unshare-ipc --unshare-uts \
             --unshare-cgroup-try --unshare-net --cap-drop ALL \
             --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib \
             --ro-bind /etc /etc \
             --proc /proc --dev /dev --tmpfs /tmp \
             --ro-bind /dev/null /etc/shadow --tmpfs /etc/parlor \
             --bind /var/lib/parlor/workspaces/telegram_-100-1a2b3c4d /var/lib/parlor/workspaces/telegram_-100-1a2b3c4d \
             --bind /var/lib/parlor/shell_state/telegram_-100-1a2b3c4d /var/lib/parlor/shell_state/telegram_-100-1a2b3c4d \
             --chdir /var/lib/parlor/workspaces/telegram_-100-1a2b3c4d \
             /usr/bin/bash --noprofile --norc"
        );
        // The data directory (the store, other workspaces) is never mounted as a whole, and
        // nothing of the host's root is.
        assert!(!args.contains("/var/lib/parlor "), "{args}");
        assert!(!args.contains("--ro-bind / /"), "{args}");
        assert!(!args.contains("/run/"), "{args}");
    }

    #[test]
    fn with_the_network_name_resolution_comes_along() {
        let args = args_of(true);
        assert!(!args.iter().any(|a| a == "--unshare-net"), "{args:?}");
        let joined = args.join(" ");
        assert!(
            joined.contains(
                "--ro-bind-try /run/systemd/resolve/stub-resolv.conf /run/systemd/resolve/stub-resolv.conf"
            ),
            "{joined}"
        );
    }

    #[test]
    fn probing_masks_only_what_lies_in_a_mounted_system_dir() {
        let outside = tempfile::tempdir().unwrap();
        let host = Host::probe(&[outside.path().to_owned(), "/nonexistent/x".into()]);
        assert!(host.system.iter().any(|(p, _)| p == Path::new("/usr")));
        assert!(host.system.iter().any(|(p, _)| p == Path::new("/etc")));
        // A temporary directory is not mounted at all, so there is nothing to mask.
        assert!(
            !host
                .masked
                .iter()
                .any(|(p, _)| p.starts_with(outside.path())),
            "{host:?}"
        );
        for (path, _) in &host.masked {
            assert!(
                path.starts_with("/usr") || path.starts_with("/etc"),
                "{path:?}"
            );
        }
    }
}
