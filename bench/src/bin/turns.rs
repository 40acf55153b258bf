//! `parlor-turns`: what one turn costs the daemon, in-process and repeatable (issue 14).
//!
//! The runtime is built as `parlor run` builds it (`src/wiring.rs`): the real
//! `SessionManager` and `Agent`, the default toolsets in the default order, the real
//! OpenAI-compatible client (with its retry decorator), and a store (`SledStore` in a temp
//! directory, or `MemoryStore`). The model is `parlor_testkit::FakeLlm` on 127.0.0.1, run in
//! a child process (this same executable with `--serve-llm`) so that its work is neither in
//! this process's CPU time nor in its instruction count; the request serialization and the
//! SSE parsing are. The platform is a `TestPlatform` behind a wrapper that renders each reply
//! as the Telegram adapter does (`parlor_render::telegram`) and counts it.
//!
//! The mentions arrive in rounds: one per chat through `Inbox::deliver`, then a wait for
//! every reply of the round, so that no turn merges two mentions and a run of N turns is
//! always the same N turns. One round of warm-up comes first (connections, sessions, the
//! first history record of each chat) and is not counted. Every fifth round asks for the
//! time: the model calls `time_now` and answers after the tool result (two requests).
//!
//! ```sh
//! cargo run --release -p parlor-bench --bin parlor-turns -- [--turns N] [--chats N] [--store sled|memory|both]
//! bench/callgrind [N]     # instructions per turn under valgrind (docs/perf.md)
//! ```
//!
//! It prints figures and never fails on them; it is not part of `cargo test`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parlor_bot::agent::{Agent, AgentConfig};
use parlor_bot::llm::{
    ChatRequest, Completion, LlmBackend, LlmError, OpenAiClient, OpenAiConfig, RetryPolicy,
};
use parlor_bot::platform::{ChatRef, Inbox, Platform};
use parlor_bot::session::{ATTRIBUTION_PROMPT, SessionConfig, SessionManager};
use parlor_bot::store::{MemoryStore, SledStore, Store, StoreOptions};
use parlor_bot::testing::{TestPlatform, message};
use parlor_bot::tool::{ToolRegistry, ToolSet};
use parlor_testkit::{FakeLlm, Reply, ToolCallSpec};
use parlor_toolsets::clock::{ClockChatHook, ClockHandle, ClockOptions};
use parlor_toolsets::{
    MemoryChatHook, MemoryOptions, MessageOptions, TodoChatHook, TodoList, memory_toolset,
    message_toolset, time,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

// The daemon's allocator and options (src/memory.rs), so that the figures are the
// daemon's. The daemon starts the background thread after scrubbing its environment;
// nothing is scrubbed here, so it is asked for at once.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
/// jemalloc's options, read by jemalloc itself at its first allocation.
// SAFETY: jemalloc reads this as a NUL-terminated `const char *`, alive for the process.
#[allow(unsafe_code)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: &[u8; 90] =
    b"narenas:2,background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,slab_sizes:1-2048:1\0";

/// The answer the fake model gives; a little Markdown, so that rendering has work.
const ANSWER: &str =
    "Sure: here is a **short** answer, with `code` and a [link](https://example.com).";
/// The base prompt of `parlor run` (`src/config.rs`, `DEFAULT_SYSTEM_PROMPT`).
const SYSTEM_PROMPT: &str = "You are parlor, an assistant in a group chat. Several \
people may talk to you; each message starts with the name of who wrote it. Answer the person \
who addressed you, briefly and in their language. Use your tools when they help, and say \
plainly when something failed.";
/// Every this many rounds the mentions ask for the time (a tool call, then the answer).
const TOOL_ROUND_EVERY: usize = 5;
/// Longest a round may take before the run gives up (valgrind is slow, not this slow).
const ROUND_LIMIT: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, PartialEq, Eq)]
enum StoreKind {
    Sled,
    Memory,
}

impl StoreKind {
    fn name(self) -> &'static str {
        match self {
            StoreKind::Sled => "sled",
            StoreKind::Memory => "memory",
        }
    }
}

struct Args {
    turns: usize,
    chats: usize,
    stores: Vec<StoreKind>,
}

fn usage() -> ! {
    eprintln!(
        "usage: parlor-turns [--turns N] [--chats N] [--store sled|memory|both]\n\
         runs N turns (after one warm-up turn per chat) and prints CPU per turn"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut args = Args {
        turns: 1000,
        chats: 50,
        stores: vec![StoreKind::Memory, StoreKind::Sled],
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--turns" => args.turns = value().parse().unwrap_or_else(|_| usage()),
            "--chats" => args.chats = value().parse().unwrap_or_else(|_| usage()),
            "--store" => {
                args.stores = match value().as_str() {
                    "sled" => vec![StoreKind::Sled],
                    "memory" => vec![StoreKind::Memory],
                    "both" => vec![StoreKind::Memory, StoreKind::Sled],
                    _ => usage(),
                }
            }
            _ => usage(),
        }
    }
    if args.chats == 0 {
        usage();
    }
    args
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--serve-llm") {
        serve_llm();
        return;
    }
    let args = parse_args();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let mut llm = LlmChild::spawn();
    println!(
        "parlor-turns: {} turns over {} chats (after {} warm-up turns), every {}th round with a tool call",
        args.turns, args.chats, args.chats, TOOL_ROUND_EVERY
    );
    println!(
        "{:<8} {:>7} {:>9} {:>9} {:>10} {:>12} {:>13}",
        "store", "turns", "requests", "wall s", "cpu s", "cpu/turn ms", "flushes/turn"
    );
    for &kind in &args.stores {
        let figures = runtime.block_on(run(kind, &args, &llm.base_url));
        let per_turn = if figures.turns == 0 {
            0.0
        } else {
            figures.cpu.as_secs_f64() * 1000.0 / figures.turns as f64
        };
        let flushes = if figures.turns == 0 {
            0.0
        } else {
            figures.flushes as f64 / figures.turns as f64
        };
        println!(
            "{:<8} {:>7} {:>9} {:>9.2} {:>10.3} {:>12.3} {:>13.2}",
            kind.name(),
            figures.turns,
            figures.requests,
            figures.wall.as_secs_f64(),
            figures.cpu.as_secs_f64(),
            per_turn,
            flushes
        );
    }
    llm.stop();
}

/// What one run measured, over the counted turns only.
struct Figures {
    turns: usize,
    requests: u64,
    wall: Duration,
    cpu: Duration,
    /// The store's flushes ([`Store::flushes`]) over the counted turns.
    flushes: u64,
}

async fn run(kind: StoreKind, args: &Args, llm_url: &str) -> Figures {
    let dir = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn Store> = match kind {
        StoreKind::Sled => Arc::new(
            SledStore::open(&dir.path().join("db"), StoreOptions::default()).expect("sled store"),
        ),
        StoreKind::Memory => Arc::new(MemoryStore::new()),
    };
    // Each reply is rendered as the Telegram adapter would before it is taken, so the
    // figures include rendering.
    let platform = TestPlatform::default()
        .named("telegram")
        .on_send(|_, text| {
            std::hint::black_box(parlor_render::telegram::render(text));
        })
        .shared();
    let requests = Arc::new(AtomicU64::new(0));
    let (sessions, clock) = runtime(
        Arc::clone(&store),
        Arc::clone(&platform) as Arc<dyn Platform>,
        llm_url,
        Arc::clone(&requests),
    );
    let chats: Vec<ChatRef> = (0..args.chats)
        .map(|c| ChatRef::new("telegram", format!("-{}", 1000 + c)))
        .collect();
    let rounds = args.turns.div_ceil(args.chats);
    let mut sent = 0;
    let mut id = 0u32;
    // Round 0 is the warm-up; the clock starts after it.
    let mut started = None;
    for round in 0..=rounds {
        if round == 1 {
            started = Some((
                Instant::now(),
                cpu_time(),
                requests.load(Ordering::SeqCst),
                store.flushes(),
            ));
        }
        let in_round = if round == 0 {
            args.chats
        } else {
            (args.turns - (round - 1) * args.chats).min(args.chats)
        };
        for (c, chat) in chats.iter().take(in_round).enumerate() {
            id += 1;
            let text = if round > 0 && round % TOOL_ROUND_EVERY == 0 {
                format!("@parlor what time is it in Paris? (round {round})")
            } else {
                format!("@parlor a short question, round {round}, please")
            };
            let who = format!("member{}", c % 3);
            if let Err(e) = sessions.deliver(message(chat, id, &who, &text)).await {
                eprintln!("deliver failed: {e}");
            }
        }
        sent += in_round;
        if !platform.wait_taken(sent, ROUND_LIMIT).await {
            eprintln!(
                "round {round}: only {} of {sent} replies after {ROUND_LIMIT:?}",
                platform.taken()
            );
            break;
        }
    }
    let (wall, cpu, counted_requests, flushes) = match started {
        Some((t0, cpu0, r0, f0)) => (
            t0.elapsed(),
            cpu_time().saturating_sub(cpu0),
            requests.load(Ordering::SeqCst) - r0,
            store.flushes() - f0,
        ),
        None => (Duration::ZERO, Duration::ZERO, 0, 0),
    };
    sessions.shutdown(Duration::from_secs(5)).await;
    // Left to the process's exit, not dropped: freeing every chat's history and every
    // stored record costs in proportion to the turns run, and would be counted as work
    // per turn by `bench/callgrind`, which no turn of the daemon does. Its tasks are
    // stopped above; a sled store's own threads idle until the exit (which is why the
    // memory store runs first with `--store both`).
    std::mem::forget(clock);
    std::mem::forget(sessions);
    std::mem::forget(store);
    // The directory goes: a sled store left open only writes to files already open.
    drop(dir);
    Figures {
        turns: platform.taken().saturating_sub(args.chats),
        requests: counted_requests,
        wall,
        cpu,
        flushes,
    }
}

/// The session manager over `store` and `platform` as `src/wiring.rs` builds it with the
/// default configuration (terminal off), except for the limits a burst needs (those of the
/// daemon bench's config: queue 64, no practical rate limit).
fn runtime(
    store: Arc<dyn Store>,
    platform: Arc<dyn Platform>,
    llm_url: &str,
    requests: Arc<AtomicU64>,
) -> (SessionManager, ClockHandle) {
    let client = OpenAiClient::with_retries(OpenAiConfig {
        base_url: llm_url.to_owned(),
        api_key: Some("sk-bench".into()),
        retry: RetryPolicy {
            max_retries: 0,
            ..RetryPolicy::default()
        },
        ..OpenAiConfig::default()
    })
    .expect("llm client");
    let llm = Arc::new(Counted {
        inner: client,
        requests,
    });
    let utc = time::parse_timezone("UTC").expect("UTC");
    let clock = ClockHandle::new(
        Arc::clone(&store),
        ClockOptions {
            default_timezone: utc,
            ..ClockOptions::default()
        },
    );
    // `toolsets.enabled` by default: todo_list, time, message, memory, clock.
    let toolsets: Vec<Arc<dyn ToolSet>> = vec![
        Arc::new(TodoList::stored(Arc::clone(&store))),
        Arc::new(time::time_toolset(utc).expect("time toolset")),
        message_toolset(Arc::clone(&store), MessageOptions::default()).expect("message toolset"),
        memory_toolset(Arc::clone(&store), MemoryOptions::default()),
        Arc::new(parlor_toolsets::clock::toolset(clock.clone()).expect("clock toolset")),
    ];
    let registry = ToolRegistry::new(toolsets).expect("registry");
    let agent = Agent::new(
        llm,
        registry,
        &format!("{SYSTEM_PROMPT}\n\n{ATTRIBUTION_PROMPT}"),
        AgentConfig::default(),
    );
    let sessions = SessionManager::new(
        store,
        agent,
        vec![platform],
        SessionConfig {
            queue_capacity: 64,
            turns_per_minute: 100_000,
            // `llm.context_tokens * 6 / 10` with the default 32,000.
            history_tokens: 19_200,
            ..SessionConfig::default()
        },
    );
    sessions.add_chat_hook(Arc::new(MemoryChatHook));
    sessions.add_chat_hook(Arc::new(TodoChatHook));
    sessions.add_chat_hook(Arc::new(ClockChatHook::new(clock.clone())));
    (sessions, clock)
}

/// The model client, counting requests (each attempt of the inner client is one).
struct Counted<B> {
    inner: B,
    requests: Arc<AtomicU64>,
}

#[async_trait]
impl<B: LlmBackend> LlmBackend for Counted<B> {
    async fn stream(
        &self,
        request: &ChatRequest,
        cancel: &CancellationToken,
    ) -> Result<Completion, LlmError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.stream(request, cancel).await
    }
}

/// utime + stime of this process, every thread (also those that ended).
fn cpu_time() -> Duration {
    // SAFETY: `getrusage` writes into the zeroed struct it is given and has no other effect.
    #[allow(unsafe_code)]
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let micros = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    micros(usage.ru_utime) + micros(usage.ru_stime)
}

// ---------------------------------------------------------------------------
// The model, in a child process

/// The fake model's process: this executable with `--serve-llm`. It prints its base URL and
/// lives until its stdin closes, so it ends with this process whatever happens.
struct LlmChild {
    child: Child,
    stdin: Option<ChildStdin>,
    base_url: String,
}

impl LlmChild {
    fn spawn() -> LlmChild {
        let exe = std::env::current_exe().expect("own executable");
        let mut child = Command::new(exe)
            .arg("--serve-llm")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the fake model");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("child stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the fake model's address");
        LlmChild {
            child,
            stdin,
            base_url: line.trim().to_owned(),
        }
    }

    fn stop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

impl Drop for LlmChild {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            self.stop();
        }
    }
}

/// `--serve-llm`: the fake model until stdin closes. A user message asking for the time gets
/// a `time_now` call; its tool result, and any other message, the text answer.
fn serve_llm() {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async {
        let llm = FakeLlm::start().await;
        let calls = AtomicU64::new(0);
        llm.respond_with(move |body: &Value| {
            let last = body["messages"]
                .as_array()
                .and_then(|m| m.last())
                .cloned()
                .unwrap_or_default();
            let asks_time = last["role"] == "user"
                && last["content"]
                    .as_str()
                    .is_some_and(|t| t.contains("what time is it"));
            if asks_time {
                let n = calls.fetch_add(1, Ordering::Relaxed);
                Reply::tool_calls(vec![ToolCallSpec::new(
                    format!("call_{n}"),
                    "time_now",
                    json!({"timezone": "Europe/Paris"}),
                )])
            } else {
                Reply::text(ANSWER)
            }
        });
        let mut out = std::io::stdout();
        let _ = writeln!(out, "{}", llm.base_url());
        let _ = out.flush();
        let mut sink = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await;
        llm.shutdown().await;
    });
}
