//! The cluster rows: turns per second and added latency of one `parlor run` on sled and of
//! one, two and three `parlor run` daemons on one PostgreSQL database with `[cluster]`.
//!
//! Every daemon runs in Telegram webhook mode (`[telegram] webhook_url` on its own `[http]
//! listen` port, with a secret token): the bench hands each update out itself, POSTing it
//! to a daemon's listener as Telegram would, so every daemon receives updates (with long
//! polling only the holder of the poll lease would). Two ways of spreading the updates over
//! the daemons are measured:
//!
//! - *round-robin*: each update to the next daemon, as a load balancer that knows nothing
//!   of chats does. A question may land on a daemon that does not hold its chat: that one
//!   records it, and the holder finds it at its next sweep (`cluster.sweep_interval_ms`,
//!   1 s by default, used here), or a daemon takes the chat once its holder let it go idle;
//! - *by chat*: every update of a chat to the same daemon (chat id modulo the daemons), as
//!   a balancer hashing on the chat would.
//!
//! The load: [`QUESTIONS`] mentions over [`CHATS`] new groups, each chat asking its next
//! question once its previous one was answered, at most [`IN_FLIGHT`] questions in flight
//! over all chats. A question's answer is the `sendMessage` replying to it, seen at the
//! Telegram timing proxy. Its added latency is the time from the bench starting the
//! webhook POST (the update handed out) to that `sendMessage` arriving at the proxy, minus
//! the fake LLM's time for the request carrying the question (through its proxy). Turns
//! per second is answers over the time from the first POST to the last answer. Each
//! question is counted once; any that got no answer or two are printed.
//!
//! The fakes, the proxies, PostgreSQL and every daemon share the machine's cores, so with
//! more daemons there is no more CPU: the figures say what the cluster costs, not what
//! more machines would give.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parlor_bot::testing::PgCluster;
use parlor_testkit::{FakeLlm, FakeTelegram, Reply, TgUser};
use tokio::sync::Semaphore;

use super::{ANSWER, Daemon, Kind, Proxy, Report, TOKEN, Tag, cpu_split_ms, percentile, tag_text};

/// New groups asked in each setup.
pub const CHATS: usize = 100;
/// Questions in each setup, spread evenly over the chats.
pub const QUESTIONS: usize = 400;
/// Questions in flight at most, over all chats (one per chat at a time).
pub const IN_FLIGHT: usize = 16;
/// How long one question may wait for its answer.
const ANSWER_WAIT: Duration = Duration::from_secs(30);
/// No question is asked after this much time into a setup (a setup that lost its way
/// would otherwise wait out every question).
const SETUP_LIMIT: Duration = Duration::from_secs(90);
/// After the last answer: long enough for a second answer to any question to show.
const SETTLE: Duration = Duration::from_millis(2_500);
/// The webhook's secret token, and its path secret.
const SECRET: &str = "bench-webhook-secret-0123456789";
const PATH_SECRET: &str = "3f9c2a7d0b6e41c8a5d2c0e7f1b4a9d6";

/// Where a setup keeps its state.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sled,
    Postgres,
}

/// How updates are spread over the daemons.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Spread {
    /// Each update to the next daemon.
    RoundRobin,
    /// Every update of a chat to the same daemon.
    ByChat,
}

/// One measured setup.
struct Setup {
    backend: Backend,
    daemons: usize,
    spread: Spread,
}

impl Setup {
    fn label(&self) -> String {
        let store = match self.backend {
            Backend::Sled => "sled",
            Backend::Postgres => "PostgreSQL",
        };
        let daemons = match self.daemons {
            1 => "1 daemon".to_owned(),
            n => format!("{n} daemons"),
        };
        let spread = match (self.daemons, self.spread) {
            (1, _) => "",
            (_, Spread::RoundRobin) => ", round-robin",
            (_, Spread::ByChat) => ", by chat",
        };
        format!("{store}, {daemons}{spread}")
    }
}

/// What one setup measured.
pub struct Figures {
    label: String,
    /// Answers over the time from the first POST to the last answer.
    turns_per_s: f64,
    /// Added latency per answered question, ms, sorted.
    latencies: Vec<f64>,
    answered_once: usize,
    /// Questions without an answer, and with two or more.
    unanswered: Vec<Tag>,
    twice: Vec<(Tag, usize)>,
    /// Webhook POSTs not answered 200.
    refused: usize,
    /// CPU of all the daemons over the run, per answer, ms.
    cpu_per_turn: f64,
    /// Why the setup could not run, if it did not.
    error: Option<String>,
}

impl Figures {
    fn failed(label: String, error: String) -> Figures {
        Figures {
            label,
            turns_per_s: f64::NAN,
            latencies: Vec::new(),
            answered_once: 0,
            unanswered: Vec::new(),
            twice: Vec::new(),
            refused: 0,
            cpu_per_turn: f64::NAN,
            error: Some(error),
        }
    }

    fn p50(&self) -> f64 {
        percentile(&self.latencies, 50.0)
    }
}

/// All the cluster figures: sled first, then PostgreSQL (or why it was skipped).
pub struct ClusterFigures {
    setups: Vec<Figures>,
    postgres_skipped: Option<String>,
}

/// Runs every setup.
pub async fn run(bin: &Path) -> ClusterFigures {
    let mut setups = Vec::new();
    let sled = Setup {
        backend: Backend::Sled,
        daemons: 1,
        spread: Spread::ByChat,
    };
    eprintln!("cluster: {}...", sled.label());
    setups.push(run_setup(bin, &sled, None).await);
    let pg = match PgCluster::launch() {
        Ok(pg) => pg,
        Err(e) => {
            return ClusterFigures {
                setups,
                postgres_skipped: Some(e),
            };
        }
    };
    let mut pg_setups = vec![Setup {
        backend: Backend::Postgres,
        daemons: 1,
        spread: Spread::ByChat,
    }];
    for daemons in [2, 3] {
        for spread in [Spread::RoundRobin, Spread::ByChat] {
            pg_setups.push(Setup {
                backend: Backend::Postgres,
                daemons,
                spread,
            });
        }
    }
    for setup in &pg_setups {
        eprintln!("cluster: {}...", setup.label());
        // A database of its own for each setup: no leases or chats left from the last.
        let url = pg.database();
        setups.push(run_setup(bin, setup, Some(&url)).await);
    }
    drop(pg);
    ClusterFigures {
        setups,
        postgres_skipped: None,
    }
}

/// A port nobody listens on now (another process may take it before the daemon does).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn write_config(dir: &Path, api_url: &str, port: u16, setup: &Setup, n: usize) -> String {
    let mut text = format!(
        r#"[bot]
data_dir = "{data}"
queue_capacity = 64
turns_per_minute = 100000
idle_minutes = 10
shutdown_grace_secs = 2
[llm]
max_retries = 0
[telegram]
api_url = "{api_url}"
webhook_url = "http://127.0.0.1:{port}/telegram/{PATH_SECRET}"
webhook_secret_env = "TELEGRAM_WEBHOOK_SECRET"
[http]
listen = "127.0.0.1:{port}"
"#,
        data = dir.join("data").display(),
    );
    if setup.backend == Backend::Postgres {
        text.push_str(&format!(
            "[store]\nbackend = \"postgres\"\n[cluster]\nenabled = true\ninstance = \"bench-{n}\"\n"
        ));
    }
    let path = dir.join("config.toml");
    std::fs::write(&path, text).expect("write config");
    path.display().to_string()
}

fn spawn(bin: &Path, config: &str, llm_url: &str, log: &Path, db: Option<&str>) -> Daemon {
    let log = std::fs::File::create(log).expect("daemon log file");
    let mut command = Command::new(bin);
    command
        .arg("--config")
        .arg(config)
        .arg("run")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TELEGRAM_BOT_TOKEN", TOKEN)
        .env("TELEGRAM_WEBHOOK_SECRET", SECRET)
        .env("OPENAI_BASE_URL", llm_url)
        .env("OPENAI_API_KEY", "sk-bench")
        .env("PARLOR_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log);
    if let Some(url) = db {
        command.env("PARLOR_DATABASE_URL", url);
    }
    Daemon {
        child: command.spawn().expect("spawn parlor"),
    }
}

/// Waits until `/readyz` on `port` answers 200.
async fn wait_ready(client: &reqwest::Client, port: u16, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if let Ok(r) = client
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            && r.status().is_success()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Everything one setup runs against.
struct Rig {
    tg: FakeTelegram,
    tg_proxy: Proxy,
    llm_proxy: Proxy,
    client: reqwest::Client,
    /// Each daemon's webhook URL.
    hooks: Vec<String>,
    next: AtomicUsize,
    spread: Spread,
    refused: AtomicUsize,
}

impl Rig {
    /// Which daemon gets the next update of `chat_index`.
    fn pick(&self, chat_index: usize) -> usize {
        match self.spread {
            Spread::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % self.hooks.len(),
            Spread::ByChat => chat_index % self.hooks.len(),
        }
    }

    /// Hands out one question of `chat` to a daemon; its message id and when it was
    /// handed out.
    async fn ask(&self, chat_index: usize, tag: Tag) -> (i64, Instant) {
        let user = TgUser::new(10_000 + i64::from(tag.n), format!("Member{}", tag.n));
        let update = self
            .tg
            .group_message(
                tag.chat,
                user,
                format!("@parlor_bot question {}", tag_text(tag)),
            )
            .mention_bot()
            .webhook_update();
        let id = update
            .pointer("/message/message_id")
            .and_then(serde_json::Value::as_i64)
            .unwrap_or_default();
        let hook = &self.hooks[self.pick(chat_index)];
        let handed = Instant::now();
        let answer = self
            .client
            .post(hook)
            .header(parlor_testkit::telegram::SECRET_HEADER, SECRET)
            .json(&update)
            .send()
            .await;
        if !answer.is_ok_and(|a| a.status().is_success()) {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        (id, handed)
    }

    /// Waits until some `sendMessage` replied to message `id` of `chat`; when the first
    /// arrived.
    async fn answer(&self, chat: i64, id: i64, wait: Duration) -> Option<Instant> {
        let state = &self.tg_proxy.state;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = state.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let first = state
                .log
                .lock()
                .expect("proxy log")
                .replies
                .get(&(chat, id))
                .and_then(|r| r.first().copied());
            if first.is_some() {
                return first;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }
}

async fn run_setup(bin: &Path, setup: &Setup, db: Option<&str>) -> Figures {
    let label = setup.label();
    let llm = FakeLlm::start().await;
    llm.respond_with(|_| Reply::text(ANSWER));
    let tg = FakeTelegram::start(TOKEN).await;
    let tg_proxy = Proxy::start(Kind::Telegram, tg.addr()).await;
    let llm_proxy = Proxy::start(Kind::Llm, llm.addr()).await;
    let api = tg
        .api_url()
        .replace(&tg.addr().to_string(), &tg_proxy.addr.to_string());
    let llm_url = llm
        .base_url()
        .replace(&llm.addr().to_string(), &llm_proxy.addr.to_string());
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(64)
        .timeout(ANSWER_WAIT)
        .build()
        .expect("reqwest client");
    let mut dirs = Vec::new();
    let mut daemons = Vec::new();
    let mut hooks = Vec::new();
    for n in 0..setup.daemons {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let config = write_config(dir.path(), &api, port, setup, n);
        let log = dir.path().join("log");
        let daemon = spawn(bin, &config, &llm_url, &log, db);
        if !wait_ready(&client, port, Duration::from_secs(60)).await {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            return Figures::failed(label, format!("daemon {n} never became ready:\n{log}"));
        }
        daemons.push(daemon);
        hooks.push(format!("http://127.0.0.1:{port}/telegram/{PATH_SECRET}"));
        dirs.push(dir);
    }
    let rig = Arc::new(Rig {
        tg,
        tg_proxy,
        llm_proxy,
        client,
        hooks,
        next: AtomicUsize::new(0),
        spread: setup.spread,
        refused: AtomicUsize::new(0),
    });

    // Warm-up, not counted: one question per daemon in chats of their own (connections
    // to the fakes and the database, code paths).
    for n in 0..setup.daemons {
        let tag = Tag {
            chat: -1_009_900_000_000 - n as i64,
            n: 0,
        };
        let (id, _) = rig.ask(n, tag).await;
        let _ = rig.answer(tag.chat, id, ANSWER_WAIT).await;
    }
    rig.refused.store(0, Ordering::Relaxed);

    let pids: Vec<u32> = daemons.iter().map(Daemon::pid).collect();
    let cpu = || -> f64 {
        pids.iter()
            .map(|&pid| {
                let (user, sys) = cpu_split_ms(pid);
                user + sys
            })
            .sum()
    };
    let cpu0 = cpu();
    let per_chat = QUESTIONS / CHATS;
    let gate = Arc::new(Semaphore::new(IN_FLIGHT));
    let t0 = Instant::now();
    let mut chats = tokio::task::JoinSet::new();
    for c in 0..CHATS {
        let rig = Arc::clone(&rig);
        let gate = Arc::clone(&gate);
        chats.spawn(async move {
            let chat = -1_009_000_000_000 - c as i64;
            let mut asked = Vec::new();
            for n in 0..per_chat {
                if t0.elapsed() > SETUP_LIMIT {
                    break;
                }
                let tag = Tag { chat, n: n as u32 };
                let Ok(_permit) = gate.acquire().await else {
                    break;
                };
                let (id, handed) = rig.ask(c, tag).await;
                let answered = rig.answer(chat, id, ANSWER_WAIT).await;
                asked.push((tag, id, handed, answered));
            }
            asked
        });
    }
    let mut asked = Vec::new();
    while let Some(done) = chats.join_next().await {
        asked.extend(done.unwrap_or_default());
    }
    let last = asked.iter().filter_map(|a| a.3).max();
    let wall = last.map_or(t0.elapsed(), |l| l.saturating_duration_since(t0));
    let cpu_ms = cpu() - cpu0;
    // A second answer to any question would come within a sweep or two.
    tokio::time::sleep(SETTLE).await;

    let llm_time: HashMap<Tag, Duration> = {
        let log = rig.llm_proxy.state.log.lock().expect("proxy log");
        let mut times = HashMap::new();
        for rec in &log.llm {
            for t in &rec.tags {
                times
                    .entry(*t)
                    .or_insert(rec.done.saturating_duration_since(rec.arrive));
            }
        }
        times
    };
    let replies = rig
        .tg_proxy
        .state
        .log
        .lock()
        .expect("proxy log")
        .replies
        .clone();
    let mut latencies = Vec::new();
    let mut unanswered = Vec::new();
    let mut twice = Vec::new();
    for &(tag, id, handed, answered) in &asked {
        let count = replies.get(&(tag.chat, id)).map_or(0, Vec::len);
        match count {
            0 => unanswered.push(tag),
            1 => {}
            n => twice.push((tag, n)),
        }
        if let Some(at) = answered {
            let total = at.saturating_duration_since(handed);
            let llm = llm_time.get(&tag).copied().unwrap_or_default();
            latencies.push(total.saturating_sub(llm).as_secs_f64() * 1000.0);
        }
    }
    latencies.sort_by(f64::total_cmp);
    let answers = latencies.len();
    for daemon in daemons {
        daemon.stop().await;
    }
    drop(dirs);
    Figures {
        label,
        turns_per_s: answers as f64 / wall.as_secs_f64(),
        answered_once: asked.len() - unanswered.len() - twice.len(),
        latencies,
        unanswered,
        twice,
        refused: rig.refused.load(Ordering::Relaxed),
        cpu_per_turn: cpu_ms / answers.max(1) as f64,
        error: None,
    }
}

/// The cluster rows and their targets.
pub fn rows(c: &ClusterFigures, report: &mut Report) {
    report.row(
        "cluster: webhook mode, updates POSTed by the bench",
        format!(
            "{QUESTIONS} mentions over {CHATS} new groups, one per chat and at most {IN_FLIGHT} in flight"
        ),
    );
    for f in &c.setups {
        if let Some(e) = &f.error {
            report.row(&format!("  {}", f.label), "n/a (see the notes)".to_owned());
            report.note(format!("cluster, {}: {e}", f.label));
            continue;
        }
        report.row(
            &format!("  {}: turns/s; added latency p50 / p99", f.label),
            format!(
                "{:.0} turns/s; {:.1} / {:.1} ms; {:.2} ms daemon CPU/turn",
                f.turns_per_s,
                f.p50(),
                percentile(&f.latencies, 99.0),
                f.cpu_per_turn
            ),
        );
        let asked = f.answered_once + f.unanswered.len() + f.twice.len();
        report.row(
            "    questions answered exactly once",
            format!(
                "{} of {asked}{}",
                f.answered_once,
                if asked < QUESTIONS {
                    format!(" asked ({QUESTIONS} meant; the rest past the time limit)")
                } else {
                    String::new()
                }
            ),
        );
        if !f.unanswered.is_empty() || !f.twice.is_empty() {
            let shown: Vec<String> = f
                .unanswered
                .iter()
                .take(10)
                .map(|t| format!("{} no answer", tag_text(*t)))
                .chain(
                    f.twice
                        .iter()
                        .take(10)
                        .map(|(t, n)| format!("{} {n} answers", tag_text(*t))),
                )
                .collect();
            report.note(format!(
                "cluster, {}: {} questions got no answer, {} got two or more: {}",
                f.label,
                f.unanswered.len(),
                f.twice.len(),
                shown.join(", ")
            ));
        }
        if f.refused > 0 {
            report.note(format!(
                "cluster, {}: {} webhook POSTs were not answered 200",
                f.label, f.refused
            ));
        }
    }
    if let Some(why) = &c.postgres_skipped {
        report.row(
            "  PostgreSQL setups",
            format!("skipped: {}", why.lines().next().unwrap_or_default()),
        );
        report.note(format!(
            "cluster: the PostgreSQL figures were skipped: {why}"
        ));
        return;
    }
    let find = |backend_label: &str| {
        c.setups
            .iter()
            .find(|f| f.label == backend_label && f.error.is_none())
    };
    let sled = find("sled, 1 daemon");
    let pg1 = find("PostgreSQL, 1 daemon");
    let (ratio, shown) = match (sled, pg1) {
        (Some(s), Some(p)) => {
            let r = p.p50() / s.p50();
            (r, format!("{:.1} / {:.1} ms = {r:.2}x", p.p50(), s.p50()))
        }
        _ => (f64::NAN, "n/a".to_owned()),
    };
    report.target(
        "  PostgreSQL 1 daemon vs sled: added latency p50",
        ratio,
        shown,
        2.0,
        "<= 2x sled's",
    );
    for spread in ["round-robin", "by chat"] {
        let two = find(&format!("PostgreSQL, 2 daemons, {spread}"));
        let (ratio, shown) = match (two, pg1) {
            (Some(t), Some(p)) => {
                let r = t.turns_per_s / p.turns_per_s;
                (
                    r,
                    format!(
                        "{:.0} / {:.0} turns/s = {r:.2}x",
                        t.turns_per_s, p.turns_per_s
                    ),
                )
            }
            _ => (f64::NAN, "n/a".to_owned()),
        };
        report.target_at_least(
            &format!("  PostgreSQL 2 daemons ({spread}) vs 1: turns/s"),
            ratio,
            shown,
            1.0,
            ">= 1x",
        );
    }
    report.note(
        "cluster: every daemon runs in Telegram webhook mode, each update POSTed by the bench \
         to one daemon's listener (round-robin: the next daemon; by chat: chat modulo daemons); \
         cluster.sweep_interval_ms is the default 1 s. The fakes, the proxies, PostgreSQL and \
         all the daemons share this machine's cores: more daemons bring no more CPU, so the \
         throughput rows are informative, not what more machines would give."
            .to_owned(),
    );
}
