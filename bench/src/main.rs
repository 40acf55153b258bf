//! `parlor-bench`: the footprint and speed figures of docs/perf.md, measured on the real
//! `parlor` binary (how each is taken: `docs/perf.md`).
//!
//! Run with `cargo run --release -p parlor-bench`. The bench builds the release `parlor`
//! binary first (`cargo build --release -p parlor --bin parlor`, a no-op when it is up to
//! date) and runs `parlor run` next to its own executable (`PARLOR_BIN` overrides the path).
//! The daemon talks to a fake Telegram Bot API and an instant fake OpenAI-compatible LLM
//! (`parlor-testkit`), both in this process on 127.0.0.1, each behind a small timing proxy
//! that records when updates are handed out, when replies arrive and how long the LLM took.
//! The fakes, the proxies and the daemon share the machine's cores.
//! The cost phase (`cost.rs`) counts how much of a busy group's prompt a prefix cache
//! could serve, from the request bodies the LLM proxy keeps. The cluster phase
//! (`cluster.rs`) compares one daemon on sled with one to three on one PostgreSQL database.
//! The profiles mode (`profiles.rs`) runs the daemon on the lean config, on
//! `config.example.toml` as shipped and on that plus vision, the terminal, MCP, a skill
//! and auto-chat.
//! The recall phase (`recall.rs`) is in-process: how often `memory_search` finds the entry
//! that answers a question put in other words, against the word counts it ranked by before,
//! and how long a search takes at 1,000 and 100,000 entries.
//!
//! It prints figures and never fails on a missed target; `cargo test` runs only the recall
//! comparison of `recall.rs` (figures, no timings).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use parlor_testkit::{FakeLlm, FakeTelegram, Reply, TgUser};
use serde_json::Value;
use tokio::sync::Notify;

mod clock;
mod cluster;
mod cost;
mod profiles;
mod recall;

const TOKEN: &str = "123456:BENCH-token";
const ANSWER: &str = "Sure: here is a short answer.";
const STARTS: usize = 5;
const MIB: f64 = 1024.0 * 1024.0;

// ---------------------------------------------------------------------------
// Timing proxy
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Telegram,
    Llm,
}

/// A `sendMessage` as it passed the proxy.
struct SendRec {
    chat: i64,
    text: String,
    arrive: Instant,
    done: Instant,
}

/// A chat-completions request as it passed the proxy.
struct LlmRec {
    tags: Vec<Tag>,
    arrive: Instant,
    done: Instant,
}

#[derive(Default)]
struct ProxyLog {
    /// (chat, message id) -> when a `getUpdates` answer first carried it to the daemon.
    handed: HashMap<(i64, i64), Instant>,
    sends: Vec<SendRec>,
    /// (chat, message replied to) -> when each `sendMessage` replying to it arrived.
    replies: HashMap<(i64, i64), Vec<Instant>>,
    llm: Vec<LlmRec>,
    /// LLM request bodies as sent, kept only after [`Proxy::keep_bodies`] (the cost phase).
    bodies: Vec<Vec<u8>>,
}

struct ProxyState {
    kind: Kind,
    upstream: String,
    client: reqwest::Client,
    log: Mutex<ProxyLog>,
    sends: AtomicUsize,
    changed: Notify,
    /// Whether LLM request bodies are kept: only the cost phase reads them, and the bursts
    /// would keep tens of thousands.
    keep_bodies: AtomicBool,
}

/// Forwards every request to `upstream`, buffering the answer, and records timings.
struct Proxy {
    state: Arc<ProxyState>,
    addr: std::net::SocketAddr,
}

impl Proxy {
    async fn start(kind: Kind, upstream: std::net::SocketAddr) -> Proxy {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let state = Arc::new(ProxyState {
            kind,
            upstream: format!("http://{upstream}"),
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(512)
                .build()
                .expect("reqwest client"),
            log: Mutex::new(ProxyLog::default()),
            sends: AtomicUsize::new(0),
            changed: Notify::new(),
            keep_bodies: AtomicBool::new(false),
        });
        let app = Router::new()
            .fallback(forward)
            .with_state(Arc::clone(&state));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Proxy { state, addr }
    }

    fn sends(&self) -> usize {
        self.state.sends.load(Ordering::SeqCst)
    }

    /// From now on, keeps every LLM request body.
    fn keep_bodies(&self) {
        self.state.keep_bodies.store(true, Ordering::SeqCst);
    }

    /// The LLM request bodies kept, in the order they arrived.
    fn bodies(&self) -> Vec<Vec<u8>> {
        self.state.log.lock().expect("proxy log").bodies.clone()
    }

    /// Waits until `n` `sendMessage` calls went through (answered by the fake).
    async fn wait_sends(&self, n: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.state.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.sends() >= n {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.sends() >= n;
            }
        }
    }
}

async fn forward(
    State(p): State<Arc<ProxyState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let arrive = Instant::now();
    let path = uri.path().to_owned();
    let target = format!(
        "{}{}",
        p.upstream,
        uri.path_and_query().map_or("/", |pq| pq.as_str())
    );
    let mut req = p.client.request(method, target);
    for (name, value) in &headers {
        if name != header::HOST && name != header::CONTENT_LENGTH {
            req = req.header(name, value);
        }
    }
    let resp = match req.body(body.clone()).send().await {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let status = resp.status();
    let mut out_headers = HeaderMap::new();
    for (name, value) in resp.headers() {
        if name != header::CONTENT_LENGTH
            && name != header::TRANSFER_ENCODING
            && name != header::CONNECTION
        {
            out_headers.append(name, value.clone());
        }
    }
    let bytes = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let done = Instant::now();
    observe(&p, &path, &body, &bytes, arrive, done);
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    *response.headers_mut() = out_headers;
    response
}

fn observe(p: &ProxyState, path: &str, req: &[u8], resp: &[u8], arrive: Instant, done: Instant) {
    let method = path
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    match p.kind {
        Kind::Telegram if method == "getupdates" => {
            let Ok(v) = serde_json::from_slice::<Value>(resp) else {
                return;
            };
            let Some(updates) = v.get("result").and_then(Value::as_array) else {
                return;
            };
            let mut log = p.log.lock().expect("proxy log");
            for u in updates {
                let chat = u.pointer("/message/chat/id").and_then(Value::as_i64);
                let id = u.pointer("/message/message_id").and_then(Value::as_i64);
                if let (Some(chat), Some(id)) = (chat, id) {
                    log.handed.entry((chat, id)).or_insert(done);
                }
            }
        }
        Kind::Telegram if method == "sendmessage" => {
            let v = serde_json::from_slice::<Value>(req).unwrap_or(Value::Null);
            let chat = match v.get("chat_id") {
                Some(Value::Number(n)) => n.as_i64().unwrap_or_default(),
                Some(Value::String(s)) => s.parse().unwrap_or_default(),
                _ => 0,
            };
            let text = v
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let reply_to = v
                .pointer("/reply_parameters/message_id")
                .or_else(|| v.get("reply_to_message_id"))
                .and_then(Value::as_i64);
            let mut log = p.log.lock().expect("proxy log");
            if let Some(id) = reply_to {
                log.replies.entry((chat, id)).or_default().push(arrive);
            }
            log.sends.push(SendRec {
                chat,
                text,
                arrive,
                done,
            });
            drop(log);
            p.sends.fetch_add(1, Ordering::SeqCst);
            p.changed.notify_waiters();
        }
        Kind::Llm => {
            let tags = serde_json::from_slice::<Value>(req)
                .ok()
                .and_then(|v| parlor_testkit::last_user_text(&v))
                .map(|t| parse_tags(&t))
                .unwrap_or_default();
            let mut log = p.log.lock().expect("proxy log");
            log.llm.push(LlmRec { tags, arrive, done });
            if p.keep_bodies.load(Ordering::SeqCst) {
                log.bodies.push(req.to_vec());
            }
        }
        Kind::Telegram => {}
    }
}

// ---------------------------------------------------------------------------
// Mentions and their tags
// ---------------------------------------------------------------------------

/// A mention's unique marker `[m<chat>:<n>]`, found again in the LLM requests.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
struct Tag {
    chat: i64,
    n: u32,
}

fn tag_text(t: Tag) -> String {
    format!("[m{}:{}]", t.chat, t.n)
}

fn parse_tags(text: &str) -> Vec<Tag> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("[m") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(']') else { break };
        if let Some((chat, n)) = rest[..end].split_once(':')
            && let (Ok(chat), Ok(n)) = (chat.parse(), n.parse())
        {
            out.push(Tag { chat, n });
        }
        rest = &rest[end..];
    }
    out
}

/// Pushes one mention per tag; returns tag -> (chat, message id).
fn push_mentions(tg: &FakeTelegram, tags: &[Tag]) -> HashMap<Tag, (i64, i64)> {
    let mut map = HashMap::with_capacity(tags.len());
    for &t in tags {
        let user = TgUser::new(10_000 + i64::from(t.n), format!("Member{}", t.n));
        let id = tg
            .group_message(
                t.chat,
                user,
                format!("@parlor_bot question {}", tag_text(t)),
            )
            .mention_bot()
            .push();
        map.insert(t, (t.chat, id));
    }
    map
}

// ---------------------------------------------------------------------------
// The daemon process
// ---------------------------------------------------------------------------

struct Daemon {
    child: Child,
}

impl Daemon {
    fn spawn(bin: &Path, config: &Path, llm_url: &str, log: &Path) -> Daemon {
        let log = std::fs::File::create(log).expect("daemon log file");
        // `PARLOR_BENCH_WRAP="heaptrack -o FILE"` runs the daemon under a profiler (the
        // figures then describe the wrapper's process, not the daemon's: for finding where
        // memory goes, not for the table).
        let wrap = std::env::var("PARLOR_BENCH_WRAP").unwrap_or_default();
        let mut words = wrap.split_whitespace();
        let mut command = match words.next() {
            Some(program) => {
                let mut c = Command::new(program);
                c.args(words).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        command.env_clear();
        // Worker threads of the daemon's runtime, when set, for comparing thread counts.
        if let Some(threads) = std::env::var_os("TOKIO_WORKER_THREADS") {
            command.env("TOKIO_WORKER_THREADS", threads);
        }
        let child = command
            .arg("--config")
            .arg(config)
            .arg("run")
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("TELEGRAM_BOT_TOKEN", TOKEN)
            .env("OPENAI_BASE_URL", llm_url)
            .env("OPENAI_API_KEY", "sk-bench")
            .env("PARLOR_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn parlor");
        Daemon { child }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then wait (SIGKILL after 15 s).
    async fn stop(mut self) {
        let pid = libc::pid_t::try_from(self.pid()).expect("pid");
        // SAFETY: `kill` with a pid of our own child and a valid signal number.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn write_config(dir: &Path, api_url: &str, idle_minutes: u64) -> PathBuf {
    let path = dir.join("config.toml");
    let text = format!(
        r#"[bot]
data_dir = "{data}"
queue_capacity = 64
turns_per_minute = 100000
idle_minutes = {idle_minutes}
shutdown_grace_secs = 2
[llm]
max_retries = 0
[telegram]
api_url = "{api_url}"
poll_timeout_secs = 30
"#,
        data = dir.join("data").display(),
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// (Rss, Pss) in bytes from `/proc/<pid>/smaps_rollup`.
fn rss_pss(pid: u32) -> (u64, u64) {
    let text = match std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) {
        Ok(text) => text,
        Err(e) => {
            // The daemon makes itself non-dumpable: only root may read its smaps.
            eprintln!("cannot read /proc/{pid}/smaps_rollup ({e}); run the bench as root");
            String::new()
        }
    };
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("Rss:"), field("Pss:"))
}

/// Where a process's RSS is: the largest groups of mappings in `/proc/<pid>/smaps`.
fn rss_breakdown(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut groups: BTreeMap<String, u64> = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let first = parts.next().unwrap_or_default();
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            let perms = parts.next().unwrap_or_default();
            let path = parts.nth(3).unwrap_or("");
            current = if path.ends_with("/parlor") {
                format!("binary {perms}")
            } else if path.is_empty() {
                "anonymous (malloc arenas, stacks)".into()
            } else if path.starts_with('[') {
                path.to_owned()
            } else {
                "shared libraries".into()
            };
        } else if first == "Rss:" {
            let kb: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            *groups.entry(current.clone()).or_default() += kb * 1024;
        }
    }
    let mut groups: Vec<(String, u64)> = groups
        .into_iter()
        .filter(|(_, b)| *b >= 64 * 1024)
        .collect();
    groups.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
    let threads = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Threads:"))
        .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_default();
    let parts: Vec<String> = groups
        .iter()
        .map(|(n, b)| format!("{n} {}", mib(*b)))
        .collect();
    format!("{}; {threads} threads", parts.join(", "))
}

/// utime and stime of a process (all threads), in milliseconds.
fn cpu_split_ms(pid: u32) -> (f64, f64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after = text.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state); utime is field 14, stime field 15.
    let ticks = |i: usize| -> f64 {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0) as f64
    };
    // SAFETY: sysconf has no preconditions.
    #[allow(unsafe_code)]
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) * 1000.0 / hz, ticks(12) * 1000.0 / hz)
}

/// The contents of file `name` of each live thread of a process (`/proc/PID/task/*/NAME`).
fn task_files(pid: u32, name: &str) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join(name)).ok())
        .collect()
}

/// Time the live threads of a process have run, in milliseconds, to the nanosecond
/// (`schedstat`): for short, quiet spans, where `cpu_split_ms`'s clock ticks (10 ms) would
/// read 0 or 10.
fn cpu_run_ms(pid: u32) -> f64 {
    let ns: u64 = task_files(pid, "schedstat")
        .iter()
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e6
}

/// Context switches (voluntary and not) of the live threads of a process: each is a thread
/// put to sleep or woken, which the CPU figures pay for in the kernel. Unlike CPU time it
/// hardly depends on how busy the machine is.
fn context_switches(pid: u32) -> u64 {
    task_files(pid, "status")
        .iter()
        .flat_map(|s| s.lines())
        .filter(|l| l.contains("ctxt_switches:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(&v, 50.0)
}

fn parlor_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("PARLOR_BIN") {
        return PathBuf::from(p);
    }
    release_binary("parlor", "parlor")
}

/// Builds `bin` of `package` in release (a no-op when up to date) and returns its path next
/// to this executable.
fn release_binary(package: &str, bin: &str) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf();
    eprintln!(
        "building the release {bin} binary (cargo build --release -p {package} --bin {bin})..."
    );
    // A plain build, as from a shell: without the variables `cargo run` set for us (they
    // change build-script fingerprints and would rebuild dependencies every time).
    let mut build = Command::new(cargo);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("CARGO_")
            && key != "CARGO_HOME"
            && key != "CARGO_TARGET_DIR"
            && !key.starts_with("CARGO_BUILD_")
            && !key.starts_with("CARGO_PROFILE_")
            && !key.starts_with("CARGO_REGISTRIES_")
            && !key.starts_with("CARGO_NET_")
        {
            build.env_remove(&key);
        }
    }
    let status = build
        .args(["build", "--release", "-p", package, "--bin", bin])
        .current_dir(&root)
        .status();
    if !matches!(status, Ok(s) if s.success()) {
        eprintln!("warning: building {bin} failed; using whatever binary is there");
    }
    let exe = std::env::current_exe().expect("current exe");
    exe.parent().expect("exe dir").join(bin)
}

// ---------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------

struct Row {
    figure: String,
    value: String,
    target: String,
    status: String,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
    notes: Vec<String>,
}

impl Report {
    fn row(&mut self, figure: &str, value: String) {
        self.rows.push(Row {
            figure: figure.into(),
            value,
            target: String::new(),
            status: String::new(),
        });
    }

    /// A figure with a target: met when `value <= limit`.
    fn target(&mut self, figure: &str, value: f64, shown: String, limit: f64, target: &str) {
        let status = if value.is_nan() {
            "n/a"
        } else if value <= limit {
            "met"
        } else {
            "MISSED"
        };
        self.rows.push(Row {
            figure: figure.into(),
            value: shown,
            target: target.into(),
            status: status.into(),
        });
    }

    /// A figure with a floor: met when `value >= limit`.
    fn target_at_least(
        &mut self,
        figure: &str,
        value: f64,
        shown: String,
        limit: f64,
        target: &str,
    ) {
        // The same row with the comparison turned round.
        self.target(figure, -value, shown, -limit, target);
    }

    fn note(&mut self, text: String) {
        eprintln!("  note: {text}");
        self.notes.push(text);
    }

    fn print(&self) {
        let w0 = self.rows.iter().map(|r| r.figure.len()).max().unwrap_or(0);
        let w1 = self.rows.iter().map(|r| r.value.len()).max().unwrap_or(0);
        let w2 = self.rows.iter().map(|r| r.target.len()).max().unwrap_or(0);
        println!();
        println!(
            "| {:w0$} | {:w1$} | {:w2$} | status |",
            "figure", "value", "target"
        );
        println!(
            "|{}|{}|{}|--------|",
            "-".repeat(w0 + 2),
            "-".repeat(w1 + 2),
            "-".repeat(w2 + 2)
        );
        for r in &self.rows {
            println!(
                "| {:w0$} | {:w1$} | {:w2$} | {:6} |",
                r.figure, r.value, r.target, r.status
            );
        }
        if !self.notes.is_empty() {
            println!();
            for n in &self.notes {
                println!("- {n}");
            }
        }
    }
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_owned();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0.0, |kb| kb as f64 / 1024.0 / 1024.0);
    format!("{cpus} CPUs ({model}), {mem:.1} GiB RAM, Linux {kernel}")
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB)
}

// ---------------------------------------------------------------------------
// Phases
// ---------------------------------------------------------------------------

/// Start to first `getUpdates`, `STARTS` times, each on a fresh data directory and fake.
async fn measure_starts(bin: &Path, llm: &FakeLlm, report: &mut Report) {
    let mut times = Vec::new();
    for i in 0..STARTS {
        let dir = tempfile::tempdir().expect("tempdir");
        let tg = FakeTelegram::start(TOKEN).await;
        let config = write_config(dir.path(), &tg.api_url(), 10);
        let t0 = Instant::now();
        let daemon = Daemon::spawn(bin, &config, &llm.base_url(), &dir.path().join("log"));
        let ready = tg
            .wait_for_calls("getUpdates", 1, Duration::from_secs(30))
            .await;
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        daemon.stop().await;
        match ready {
            Ok(_) => times.push(ms),
            Err(e) => {
                let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
                report.note(format!("start {i} never polled: {e}\n{log}"));
            }
        }
    }
    let shown: Vec<String> = times.iter().map(|t| format!("{t:.0}")).collect();
    let med = median(times.clone());
    report.target(
        "start to first getUpdates (median of 5)",
        med,
        format!("{med:.0} ms ({} ms)", shown.join("/")),
        20.0,
        "<= 20 ms",
    );
}

struct Env {
    /// Spawn to the first `getUpdates` at the fake (through the proxy).
    ready: Duration,
    tg: FakeTelegram,
    llm: FakeLlm,
    tg_proxy: Proxy,
    llm_proxy: Proxy,
    daemon: Daemon,
    _dir: tempfile::TempDir,
}

/// Added latency per turn, in ms, for the turns of `chats` from the proxy log entries at
/// or after the given indexes. Per chat, the k-th LLM request and the k-th answer send
/// make turn k; it is ready when its newest mention was handed out and the chat's previous
/// reply was accepted; its added latency is ready -> reply arrives, minus the LLM's time.
fn turn_latencies(
    env: &Env,
    llm_from: usize,
    send_from: usize,
    mentions: &HashMap<Tag, (i64, i64)>,
) -> Vec<f64> {
    let tg_log = env.tg_proxy.state.log.lock().expect("log");
    let llm_log = env.llm_proxy.state.log.lock().expect("log");
    let mut turns: BTreeMap<i64, Vec<&LlmRec>> = BTreeMap::new();
    for rec in &llm_log.llm[llm_from..] {
        if let Some(t) = rec.tags.first() {
            turns.entry(t.chat).or_default().push(rec);
        }
    }
    let mut sends: HashMap<i64, Vec<&SendRec>> = HashMap::new();
    for s in &tg_log.sends[send_from..] {
        if s.text == ANSWER {
            sends.entry(s.chat).or_default().push(s);
        }
    }
    let mut out = Vec::new();
    for (chat, recs) in &mut turns {
        recs.sort_by_key(|r| r.arrive);
        let Some(replies) = sends.get(chat) else {
            continue;
        };
        for (k, (l, s)) in recs.iter().zip(replies.iter()).enumerate() {
            let newest = l
                .tags
                .iter()
                .filter_map(|t| mentions.get(t))
                .filter_map(|key| tg_log.handed.get(key))
                .max()
                .copied();
            let Some(mut ready) = newest else { continue };
            if k > 0 {
                ready = ready.max(replies[k - 1].done);
            }
            let total = s.arrive.saturating_duration_since(ready);
            let llm = l.done.saturating_duration_since(l.arrive);
            out.push(total.saturating_sub(llm).as_secs_f64() * 1000.0);
        }
    }
    out.sort_by(f64::total_cmp);
    out
}

async fn start_env(bin: &Path, idle_minutes: u64) -> Env {
    start_env_with(bin, |dir, api| write_config(dir, api, idle_minutes)).await
}

/// Starts the fakes, their proxies and the daemon on the config `write` puts in the given
/// directory (it gets the fake Bot API's URL, behind its proxy), and waits until the
/// daemon polls.
async fn start_env_with(bin: &Path, write: impl FnOnce(&Path, &str) -> PathBuf) -> Env {
    let llm = FakeLlm::start().await;
    llm.respond_with(|_| Reply::text(ANSWER));
    let tg = FakeTelegram::start(TOKEN).await;
    let tg_proxy = Proxy::start(Kind::Telegram, tg.addr()).await;
    let llm_proxy = Proxy::start(Kind::Llm, llm.addr()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let api = tg
        .api_url()
        .replace(&tg.addr().to_string(), &tg_proxy.addr.to_string());
    let llm_url = llm
        .base_url()
        .replace(&llm.addr().to_string(), &llm_proxy.addr.to_string());
    let config = write(dir.path(), &api);
    let t0 = Instant::now();
    let daemon = Daemon::spawn(bin, &config, &llm_url, &dir.path().join("log"));
    if let Err(e) = tg
        .wait_for_calls("getUpdates", 1, Duration::from_secs(30))
        .await
    {
        let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
        panic!("the daemon never polled: {e}\n{log}");
    }
    let ready = t0.elapsed();
    Env {
        ready,
        tg,
        llm,
        tg_proxy,
        llm_proxy,
        daemon,
        _dir: dir,
    }
}

fn groups(base: i64, n: usize) -> Vec<i64> {
    (0..n as i64).map(|i| base - i).collect()
}

struct Burst {
    wall: Duration,
    complete: bool,
    turns: usize,
    cpu_ms: f64,
    /// The kernel's part of `cpu_ms`.
    sys_ms: f64,
    latencies: Vec<f64>,
    llm_from: usize,
    /// `sendMessage` calls that went through during the burst (replies posted).
    sends: usize,
    /// Context switches of the daemon's threads during the burst (those alive at its end).
    switches: u64,
}

/// Pushes the mentions at once and waits until `expect_sends` replies went out (or, when
/// `expect_sends` is `None`, until every mention is in some LLM request and each request
/// has its reply).
async fn burst(env: &Env, tags: &[Tag], expect_sends: Option<usize>, timeout: Duration) -> Burst {
    let pid = env.daemon.pid();
    let send_from = env.tg_proxy.sends();
    let llm_from = env.llm.request_count();
    let proxy_llm_from = env.llm_proxy.state.log.lock().expect("log").llm.len();
    let perf = perf_record(pid).await;
    let (user0, sys0) = cpu_split_ms(pid);
    let switches0 = context_switches(pid);
    let t0 = Instant::now();
    let mentions = push_mentions(&env.tg, tags);
    let complete = match expect_sends {
        Some(n) => env.tg_proxy.wait_sends(send_from + n, timeout).await,
        None => {
            // Until every mention reached the LLM and every LLM turn was answered.
            let deadline = Instant::now() + timeout;
            loop {
                let seen: usize = {
                    let log = env.llm_proxy.state.log.lock().expect("log");
                    log.llm[proxy_llm_from..].iter().map(|r| r.tags.len()).sum()
                };
                let turns = env.llm.request_count() - llm_from;
                let sends = env.tg_proxy.sends() - send_from;
                if seen >= tags.len() && sends >= turns {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                let _ = env
                    .tg_proxy
                    .wait_sends(env.tg_proxy.sends() + 1, Duration::from_millis(50))
                    .await;
            }
        }
    };
    let wall = t0.elapsed();
    let (user1, sys1) = cpu_split_ms(pid);
    let (cpu, sys) = (user1 + sys1 - user0 - sys0, sys1 - sys0);
    let switches = context_switches(pid).saturating_sub(switches0);
    if let Some(perf) = perf {
        perf.finish();
    }
    let turns = env.llm.request_count() - llm_from;
    let sends = env.tg_proxy.sends() - send_from;
    let latencies = turn_latencies(env, proxy_llm_from, send_from, &mentions);
    Burst {
        sends,
        wall,
        complete,
        turns,
        cpu_ms: cpu,
        sys_ms: sys,
        latencies,
        llm_from,
        switches,
    }
}

/// `perf record` of the daemon during one burst, when `PARLOR_BENCH_PERF` names a directory
/// (each burst writes `burst-N.data` there; `perf report -i FILE` reads it). For finding
/// where a turn's CPU goes, kernel included: the figures of a recorded run are not kept.
struct PerfRecord(Child);

async fn perf_record(pid: u32) -> Option<PerfRecord> {
    static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::var_os("PARLOR_BENCH_PERF")?;
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = Path::new(&dir).join(format!("burst-{n}.data"));
    let child = Command::new("perf")
        .args([
            "record",
            "--call-graph",
            "dwarf,16384",
            "-F",
            "1000",
            "-q",
            "-p",
            &pid.to_string(),
            "-o",
        ])
        .arg(&out)
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| eprintln!("perf record did not start: {e}"))
        .ok()?;
    // perf attaches within a moment; the burst's first turns are not worth waiting for.
    tokio::time::sleep(Duration::from_millis(300)).await;
    eprintln!("perf recording the burst into {}", out.display());
    Some(PerfRecord(child))
}

impl PerfRecord {
    fn finish(mut self) {
        // SAFETY: kill has no memory preconditions; the pid is our own child's.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGINT);
        }
        let _ = self.0.wait();
    }
}

/// The mentions of the 1,000-mention burst: 20 each in 50 new groups from `base` down.
fn burst_tags(base: i64) -> Vec<Tag> {
    let chats = groups(base, 50);
    let mut tags = Vec::new();
    for n in 0..20u32 {
        for &chat in &chats {
            tags.push(Tag { chat, n });
        }
    }
    tags
}

async fn cpu_runs(bin: &Path, runs: usize) {
    let env = start_env(bin, 60).await;
    // Connections and code paths warmed up first, not counted.
    let warm = burst_tags(-1_004_000_000_000);
    burst(&env, &warm, None, Duration::from_secs(60)).await;
    let mut per_turn = Vec::new();
    let mut per_mention = Vec::new();
    println!("run  turns  wall ms  CPU ms  kernel ms  CPU/turn ms  CPU/mention ms  switches/turn");
    for run in 0..runs {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let tags = burst_tags(-1_005_000_000_000 - 1_000 * run as i64);
        let b = burst(&env, &tags, None, Duration::from_secs(60)).await;
        let turn = b.cpu_ms / b.turns.max(1) as f64;
        let mention = b.cpu_ms / tags.len() as f64;
        println!(
            "{run:>3}  {:>5}  {:>7.0}  {:>6.0}  {:>9.0}  {turn:>11.2}  {mention:>14.3}  {:>13.1}{}",
            b.turns,
            b.wall.as_secs_f64() * 1000.0,
            b.cpu_ms,
            b.sys_ms,
            b.switches as f64 / b.turns.max(1) as f64,
            if b.complete { "" } else { " INCOMPLETE" }
        );
        per_turn.push(turn);
        per_mention.push(mention);
    }
    println!(
        "median CPU per turn {:.2} ms, per mention {:.3} ms ({runs} runs)",
        median(per_turn),
        median(per_mention)
    );
    env.daemon.stop().await;
}

async fn run_daemon_phases(bin: &Path, report: &mut Report) {
    let env = start_env(bin, 1).await;
    let pid = env.daemon.pid();

    // Idle: ready and quiet for a second.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rss, pss) = rss_pss(pid);
    report.target(
        "idle RSS (store open, after 1 s quiet)",
        rss as f64 / MIB,
        mib(rss),
        12.0,
        "<= 12 MiB",
    );
    report.row("idle PSS", mib(pss));
    report.note(format!("idle RSS by mapping: {}", rss_breakdown(pid)));

    // One mention at a time, unloaded: the added latency of a lone turn.
    let mut lone = Vec::new();
    for (k, chat) in groups(-1_000_500_000_000, 20).into_iter().enumerate() {
        let b = burst(
            &env,
            &[Tag { chat, n: 0 }],
            Some(1),
            Duration::from_secs(10),
        )
        .await;
        if k > 0 {
            // The first one pays for connection set-up.
            lone.extend(b.latencies);
        }
    }
    lone.sort_by(f64::total_cmp);
    report.row(
        "one mention at a time: added latency p50 / max",
        format!(
            "{:.1} / {:.1} ms ({} turns)",
            percentile(&lone, 50.0),
            lone.last().copied().unwrap_or(f64::NAN),
            lone.len()
        ),
    );

    // 200 groups at once: with instant fakes, then with every Bot API call but the long
    // poll taking a real round trip (the figure users feel).
    for (base, round_trip) in [(-1_001_000_000_000, 0u64), (-1_001_100_000_000, 40)] {
        env.tg.set_latency(Duration::from_millis(round_trip));
        let tags: Vec<Tag> = groups(base, 200)
            .into_iter()
            .map(|chat| Tag { chat, n: 0 })
            .collect();
        let b = burst(&env, &tags, Some(200), Duration::from_secs(60)).await;
        let (rss, _) = rss_pss(pid);
        let ms = b.wall.as_secs_f64() * 1000.0;
        report.target(
            &format!(
                "200 new groups mention at once, Bot API round trip {round_trip} ms: all answered"
            ),
            if b.complete { ms } else { f64::INFINITY },
            format!(
                "{ms:.0} ms{}",
                if b.complete { "" } else { " (INCOMPLETE)" }
            ),
            1000.0,
            "<= 1000 ms",
        );
        report.row("  RSS after", mib(rss));
        report.row(
            "  added latency per turn p50 / p99",
            format!(
                "{:.1} / {:.1} ms",
                percentile(&b.latencies, 50.0),
                percentile(&b.latencies, 99.0)
            ),
        );
        report.row(
            "  daemon CPU per turn",
            format!("{:.2} ms", b.cpu_ms / b.turns.max(1) as f64),
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    env.tg.set_latency(Duration::ZERO);

    // 1,000 mentions over 50 groups at once.
    let tags = burst_tags(-1_002_000_000_000);
    let b = burst(&env, &tags, None, Duration::from_secs(60)).await;
    let requests = env.llm.requests();
    let mut own = 0usize;
    let mut merged = 0usize;
    let mut found: HashMap<Tag, usize> = HashMap::new();
    for r in &requests[b.llm_from..] {
        let text = r.last_user_text().unwrap_or_default();
        let in_req = parse_tags(&text);
        for t in &in_req {
            *found.entry(*t).or_default() += 1;
        }
        if in_req.len() == 1 {
            own += 1;
        } else {
            merged += in_req.len();
        }
    }
    let missing = tags.iter().filter(|t| !found.contains_key(t)).count();
    let twice = found.values().filter(|&&c| c > 1).count();
    let secs = b.wall.as_secs_f64();
    report.row(
        "1,000 mentions / 50 groups: turns, wall time",
        format!(
            "{} turns in {:.0} ms{}",
            b.turns,
            secs * 1000.0,
            if b.complete { "" } else { " (INCOMPLETE)" }
        ),
    );
    report.row(
        "  turns/s (mentions/s)",
        format!(
            "{:.0} ({:.0})",
            b.turns as f64 / secs,
            tags.len() as f64 / secs
        ),
    );
    report.target(
        "  mentions not accounted for",
        missing as f64,
        format!(
            "{missing} of {} ({own} answered in their own turn, {merged} merged; {twice} in two turns)",
            tags.len()
        ),
        0.0,
        "0 (merging ok)",
    );
    report.row(
        "  added latency per turn p50 / p99",
        format!(
            "{:.1} / {:.1} ms ({} turns)",
            percentile(&b.latencies, 50.0),
            percentile(&b.latencies, 99.0),
            b.latencies.len()
        ),
    );
    let per_turn = b.cpu_ms / b.turns.max(1) as f64;
    report.target(
        "  daemon CPU per turn",
        per_turn,
        format!(
            "{per_turn:.2} ms ({:.0} ms / {} turns; kernel {:.0} ms of it)",
            b.cpu_ms, b.turns, b.sys_ms
        ),
        0.5,
        "<= 0.5 ms",
    );
    let (rss, _) = rss_pss(pid);
    report.row("  RSS after", mib(rss));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // 10,000 distinct groups, one turn each.
    let tags: Vec<Tag> = groups(-1_003_000_000_000, 10_000)
        .into_iter()
        .map(|chat| Tag { chat, n: 0 })
        .collect();
    let b = burst(&env, &tags, Some(10_000), Duration::from_secs(150)).await;
    let (rss, pss) = rss_pss(pid);
    report.row(
        "10,000 groups one turn each: wall time",
        format!(
            "{:.1} s, {:.0} turns/s, {:.2} ms CPU/turn{}",
            b.wall.as_secs_f64(),
            b.turns as f64 / b.wall.as_secs_f64(),
            b.cpu_ms / b.turns.max(1) as f64,
            if b.complete { "" } else { " (INCOMPLETE)" }
        ),
    );
    report.target(
        "  RSS right after (sessions still in memory)",
        rss as f64 / MIB,
        format!("{} (PSS {})", mib(rss), mib(pss)),
        64.0,
        "<= 64 MiB",
    );
    // While the daemon's sessions idle out (bot.idle_minutes = 1), the clock phase runs
    // in this process; the daemon is quiet meanwhile.
    let idle_from = Instant::now();
    eprintln!(
        "clock phase ({} tasks), then waiting for the daemon's idle sessions to leave memory...",
        clock::TASKS
    );
    let clock = clock::run(|| rss_pss(std::process::id()).0).await;
    let left = Duration::from_secs(65).saturating_sub(idle_from.elapsed());
    tokio::time::sleep(left).await;
    let (rss, pss) = rss_pss(pid);
    report.target(
        "  RSS after idle_minutes = 1 elapsed",
        rss as f64 / MIB,
        format!("{} (PSS {})", mib(rss), mib(pss)),
        40.0,
        "<= 40 MiB",
    );
    report.note(format!(
        "RSS by mapping after 10,000 groups and idle_minutes: {}",
        rss_breakdown(pid)
    ));
    if let Some(secs) = std::env::var("PARLOR_BENCH_HOLD")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        // For a profiler to attach to the idle daemon (docs/perf.md, "Profiles").
        eprintln!("holding daemon pid {pid} for {secs} s (PARLOR_BENCH_HOLD)");
        tokio::time::sleep(Duration::from_secs(secs)).await;
    }
    let data = dir_size(&env._dir.path().join("data"));
    report.row("  store on disk", mib(data));
    env.daemon.stop().await;
    drop(env.tg);
    drop(env.llm);
    clock_rows(&clock, report);
}

fn clock_rows(c: &clock::ClockFigures, report: &mut Report) {
    if let Some(e) = &c.error {
        report.row("clock: 10,000 tasks", format!("n/a ({e})"));
        return;
    }
    let p50 = percentile(&c.lateness_ms, 50.0);
    let p99 = percentile(&c.lateness_ms, 99.0);
    let max = c.lateness_ms.last().copied().unwrap_or(f64::NAN);
    report.row(
        "clock: 10,000 one-shot tasks (MemoryStore), 20 s window",
        format!("{} tasks, each through ClockHandle::create", c.created),
    );
    report.row(
        "  create p50 / p99 (max)",
        format!(
            "{:.3} / {:.3} ms ({:.3} ms)",
            percentile(&c.create_ms, 50.0),
            percentile(&c.create_ms, 99.0),
            c.create_ms.last().copied().unwrap_or(f64::NAN)
        ),
    );
    report.target(
        "  one create at 10,000 tasks",
        c.last_create_ms,
        format!("{:.3} ms", c.last_create_ms),
        1.0,
        "<= 1 ms",
    );
    report.row(
        "  fired / posted",
        format!("{} / {} of {}", c.fired, c.posts, c.created),
    );
    report.row("  fire lateness p50", format!("{p50:.1} ms"));
    let complete = c.fired >= c.created;
    report.target(
        "  fire lateness p99 (max)",
        if complete { p99 } else { f64::INFINITY },
        format!(
            "{p99:.1} ms ({max:.1} ms){}",
            if complete { "" } else { " of those fired" }
        ),
        10.0,
        "<= 10 ms",
    );
    report.row(
        "  memory the tasks cost (bench RSS growth)",
        format!("{:.1} MiB", c.rss_delta as f64 / MIB),
    );
}

fn dir_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `parlor-bench clock`: the in-process clock phase alone, without the daemon.
    if std::env::args().nth(1).as_deref() == Some("clock") {
        let mut report = Report::default();
        let clock = clock::run(|| rss_pss(std::process::id()).0).await;
        clock_rows(&clock, &mut report);
        report.print();
        return;
    }
    // `parlor-bench recall [--misses]`: memory_search's recall and latency alone,
    // in-process; `--misses` lists every question each ranking missed.
    if std::env::args().nth(1).as_deref() == Some("recall") {
        let mut report = Report::default();
        let recall = recall::run().await;
        let all_misses = std::env::args().nth(2).as_deref() == Some("--misses");
        recall::rows(&recall, &mut report, all_misses);
        println!("parlor-bench recall — {}", machine());
        report.print();
        return;
    }
    let started = Instant::now();
    let bin = parlor_binary();
    // `parlor-bench idle`: the idle footprint alone (a few seconds), for trying changes.
    if std::env::args().nth(1).as_deref() == Some("idle") {
        let env = start_env(&bin, 1).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (rss, pss) = rss_pss(env.daemon.pid());
        println!("idle RSS {} (PSS {})", mib(rss), mib(pss));
        println!("by mapping: {}", rss_breakdown(env.daemon.pid()));
        env.daemon.stop().await;
        return;
    }
    // `parlor-bench cpu [runs]`: the 1,000-mention burst again and again on one daemon, its
    // CPU printed per run, for comparing two builds (docs/perf.md).
    if std::env::args().nth(1).as_deref() == Some("cpu") {
        let runs = std::env::args()
            .nth(2)
            .and_then(|n| n.parse().ok())
            .unwrap_or(8);
        cpu_runs(&bin, runs).await;
        return;
    }
    // `parlor-bench cost`: the prompt-cache figures of a 200-turn busy group alone.
    if std::env::args().nth(1).as_deref() == Some("cost") {
        let mut report = Report::default();
        let cost = cost::run(&bin).await;
        cost::rows(&cost, &mut report);
        report.print();
        return;
    }
    // `parlor-bench profiles [--all] [NAME...]`: the lean, default and full configurations,
    // each on its own daemon (about four minutes; `--all` adds lean's 10,000 groups; names
    // run only those profiles, without the additions' rows).
    if std::env::args().nth(1).as_deref() == Some("profiles") {
        let machine = machine();
        let mut report = Report::default();
        let rest: Vec<String> = std::env::args().skip(2).collect();
        let all = rest.iter().any(|a| a == "--all");
        let only: Vec<String> = rest.into_iter().filter(|a| a != "--all").collect();
        profiles::run(&bin, all, &only, &mut report).await;
        println!("parlor-bench profiles — {machine}");
        report.print();
        println!(
            "\n(total bench time {:.0} s)",
            started.elapsed().as_secs_f64()
        );
        return;
    }
    // `parlor-bench cluster`: sled against one, two and three daemons on PostgreSQL alone.
    if std::env::args().nth(1).as_deref() == Some("cluster") {
        let machine = machine();
        let mut report = Report::default();
        let cluster = cluster::run(&bin).await;
        cluster::rows(&cluster, &mut report);
        println!("parlor-bench cluster — {machine}");
        report.print();
        println!(
            "\n(total bench time {:.0} s)",
            started.elapsed().as_secs_f64()
        );
        return;
    }
    let mut report = Report::default();
    let machine = machine();
    eprintln!("machine: {machine}");
    eprintln!("parlor binary: {}", bin.display());

    let llm = FakeLlm::start().await;
    llm.respond_with(|_| Reply::text(ANSWER));
    eprintln!("measuring start time...");
    measure_starts(&bin, &llm, &mut report).await;
    drop(llm);

    eprintln!("running the daemon phases...");
    run_daemon_phases(&bin, &mut report).await;
    eprintln!("cost phase: a {}-turn busy group...", cost::TURNS);
    let cost = cost::run(&bin).await;
    cost::rows(&cost, &mut report);
    eprintln!("cluster phase: sled, then one to three daemons on PostgreSQL...");
    let cluster = cluster::run(&bin).await;
    cluster::rows(&cluster, &mut report);
    eprintln!("recall phase: memory_search at 1,000 and 100,000 entries...");
    let recall = recall::run().await;
    recall::rows(&recall, &mut report, false);

    println!("parlor-bench — {}", machine);
    println!(
        "The fake Telegram, the fake LLM and their timing proxies run in the bench process and \
         share the cores with the daemon."
    );
    report.print();
    println!(
        "\n(total bench time {:.0} s)",
        started.elapsed().as_secs_f64()
    );
}
