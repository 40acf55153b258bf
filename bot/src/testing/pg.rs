//! [`PgCluster`]: a throwaway PostgreSQL server for tests, one per test process, with one
//! database per test.
//!
//! It runs the machine's own PostgreSQL binaries (`initdb`, `pg_ctl`, found on `PATH` or
//! under `/usr/lib/postgresql/*/bin`, where Debian puts them) on a fresh directory under
//! the system's temp dir, listening on 127.0.0.1 only, on a free port, with its unix socket
//! in that directory. `initdb` refuses to run as root: as root, the server runs as the
//! `postgres` system user (`runuser`), which Debian's package creates.
//!
//! Where the binaries are missing, [`PgCluster::start`] returns `None` and the test says it
//! skipped; with `PARLOR_REQUIRE_POSTGRES=1` (CI) that is a failure instead.
//!
//! The shared cluster lives in a static, which Rust never drops; a small watcher process
//! stops it (`pg_ctl stop -m immediate`) and removes its directory once the test process is
//! gone, however it ended. A cluster from [`PgCluster::launch`] is stopped on drop.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

/// The environment variable that turns a missing PostgreSQL into a failure.
pub const REQUIRE_POSTGRES: &str = "PARLOR_REQUIRE_POSTGRES";

/// A PostgreSQL server for tests (see the module docs).
#[derive(Debug)]
pub struct PgCluster {
    /// Holds the data directory, the socket and the server's log.
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    /// Whether the server runs as the `postgres` user (this process is root).
    as_postgres: bool,
    /// The process that stops a shared cluster once this process is gone.
    watcher: Mutex<Option<Child>>,
    /// Numbers the databases made, for their names.
    databases: AtomicU32,
}

impl PgCluster {
    /// The test process's cluster, started on first use; `None` (after saying why on
    /// stderr) when PostgreSQL is not installed, unless `PARLOR_REQUIRE_POSTGRES=1`, which
    /// makes that a panic. A cluster that is installed but fails to start is a panic.
    pub fn start() -> Option<&'static PgCluster> {
        static SHARED: OnceLock<Option<PgCluster>> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                let Some(bin) = find_bin() else {
                    if std::env::var(REQUIRE_POSTGRES).as_deref() == Ok("1") {
                        panic!(
                            "{REQUIRE_POSTGRES}=1 but PostgreSQL's initdb is neither on PATH \
                             nor under /usr/lib/postgresql/*/bin (install Debian's \
                             `postgresql` package)"
                        );
                    }
                    eprintln!("SKIPPED: PostgreSQL (initdb) is not installed");
                    return None;
                };
                let cluster = PgCluster::launch_with(&bin).unwrap_or_else(|e| panic!("{e}"));
                cluster.watch();
                Some(cluster)
            })
            .as_ref()
    }

    /// A cluster of its own, stopped when dropped; `Err` says why it could not start
    /// (PostgreSQL missing included).
    pub fn launch() -> Result<PgCluster, String> {
        let bin = find_bin().ok_or("PostgreSQL (initdb) is not installed")?;
        PgCluster::launch_with(&bin)
    }

    fn launch_with(bin: &Path) -> Result<PgCluster, String> {
        let as_postgres = is_root();
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        // Short: the socket's path must fit in 107 bytes.
        let dir = std::env::temp_dir().join(format!("parlor-pg-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut cluster = PgCluster {
            dir,
            bin: bin.to_path_buf(),
            port: 0,
            as_postgres,
            watcher: Mutex::new(None),
            databases: AtomicU32::new(0),
        };
        if as_postgres {
            cluster.run(
                "chown",
                &["-R", "postgres:", &cluster.dir.display().to_string()],
                false,
            )?;
        }
        let data = cluster.data().display().to_string();
        cluster.run(
            &cluster.tool("initdb"),
            &[
                "-D",
                &data,
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            true,
        )?;
        // A free port is taken by binding port 0 and letting go; another process may take
        // it in between, so a failed start is tried again on another.
        let mut last = String::new();
        for _ in 0..3 {
            cluster.port = free_port()?;
            let options = format!(
                "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off \
                 -c full_page_writes=off -c max_connections=200",
                cluster.port,
                cluster.dir.display()
            );
            let log = cluster.dir.join("server.log").display().to_string();
            match cluster.run(
                &cluster.tool("pg_ctl"),
                &[
                    "-D", &data, "-l", &log, "-w", "-t", "60", "-o", &options, "start",
                ],
                true,
            ) {
                Ok(()) => return Ok(cluster),
                Err(e) => {
                    let server_log = std::fs::read_to_string(&log).unwrap_or_default();
                    last = format!("{e}\nserver log:\n{server_log}");
                }
            }
        }
        Err(format!("PostgreSQL did not start: {last}"))
    }

    /// A URL of a fresh, empty database of its own, for one test.
    pub fn database(&self) -> String {
        let n = self.databases.fetch_add(1, Ordering::Relaxed);
        let name = format!("t{n}");
        let admin = self.url("postgres");
        // postgres' sync client must not run on a tokio thread; a test may be one.
        let create = format!("CREATE DATABASE {name}");
        std::thread::spawn(move || -> Result<(), String> {
            let mut client = postgres::Client::connect(&admin, postgres::NoTls)
                .map_err(|e| format!("cannot connect to the test cluster: {e}"))?;
            client
                .batch_execute(&create)
                .map_err(|e| format!("cannot create a test database: {e}"))
        })
        .join()
        .unwrap_or_else(|_| Err("the thread creating a test database panicked".to_owned()))
        .unwrap_or_else(|e| panic!("{e}"));
        self.url(&name)
    }

    /// The URL of database `name` on this cluster (connecting gives up after 10 s).
    pub fn url(&self, name: &str) -> String {
        format!(
            "postgresql://postgres@127.0.0.1:{}/{name}?connect_timeout=10",
            self.port
        )
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn tool(&self, name: &str) -> String {
        self.bin.join(name).display().to_string()
    }

    /// Runs `program` (as the `postgres` user when `as_server` and this process is root).
    fn run(&self, program: &str, args: &[&str], as_server: bool) -> Result<(), String> {
        let mut command = match as_server && self.as_postgres {
            true => {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--", program]);
                c
            }
            false => Command::new(program),
        };
        let output = command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {program}: {e}"))?;
        if output.status.success() {
            return Ok(());
        }
        Err(format!(
            "{program} {} failed ({}): {}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }

    /// The shell command that stops the server at once.
    fn stop_command(&self) -> String {
        let stop = format!(
            "{} -D {} stop -m immediate",
            self.tool("pg_ctl"),
            self.data().display()
        );
        match self.as_postgres {
            true => format!("runuser -u postgres -- {stop}"),
            false => stop,
        }
    }

    /// Starts the watcher that stops the cluster and removes its directory once this
    /// process has ended.
    fn watch(&self) {
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop} >/dev/null 2>&1; rm -rf {dir}",
            pid = std::process::id(),
            stop = self.stop_command(),
            dir = self.dir.display()
        );
        match Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(child) => *self.watcher.lock().unwrap() = Some(child),
            Err(e) => eprintln!("cannot start the test cluster's watcher: {e}"),
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = Command::new("sh")
            .args(["-c", &self.stop_command()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(mut watcher) = self.watcher.lock().unwrap().take() {
            let _ = watcher.kill();
            let _ = watcher.wait();
        }
    }
}

/// The directory of `initdb`: on `PATH`, else the newest `/usr/lib/postgresql/*/bin`.
fn find_bin() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
                return Some(dir);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// Whether this process runs as root (the owner of its own `/proc` entry).
fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("cannot find a free port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}
