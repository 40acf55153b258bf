//! `parlor-bench profiles`: the footprint and CPU of the daemon in the configurations people
//! run, not only in the bench's lean one. Three profiles, each on its own daemon, one after
//! the other (never two daemons at once: they would share the binary's pages, which the
//! daemon then cannot release, and read higher):
//!
//! - `lean`: the bench's own config ([`write_config`]: queue_capacity 64, turns_per_minute
//!   100000, the default toolsets);
//! - `default`: `config.example.toml` as shipped, read from the repository at run time, with
//!   only what the bench must change: `bot.data_dir`, `telegram.api_url` (the fake's),
//!   `llm.max_retries = 0`, and `bot.idle_minutes = 1` (so the idle figure after the
//!   10,000 groups comes within a minute; shipped: 10). Its `queue_capacity` (8) and
//!   `turns_per_minute` (12) stay: the burst is rate limited and merged. The web toolset
//!   is on as shipped; its search provider is reached only when the model calls
//!   `web_search`, which the fake model never does;
//! - `full`: `default` plus `llm.vision`, the terminal (`sandbox = "bwrap"` when
//!   `bwrap --ro-bind / / true` runs here, else `"none"`), one MCP stdio server (the
//!   testkit's `parlor-mcp-test-server`), one skill in a `[toolsets.skill]` folder, and
//!   auto-chat in one group (not one the bench posts in: it costs what it costs idle).
//!
//! Per profile: spawn to the first `getUpdates` (one start), the CPU of the next 5 s and
//! the idle RSS at their end, with the breakdown by mapping; daemon CPU per LLM request, per
//! posted reply (turn) and per mention, and context switches per request, over the
//! 1,000-mention burst (20 mentions in each of 50 new groups, after a warm-up of one mention
//! in 50 other groups that is not counted); RSS right after 10,000 new groups one turn
//! each, after `idle_minutes`, and 30 s after that. Then each of the full profile's additions alone
//! on top of `default`, idle RSS only, to say what each costs.
//!
//! The 1,000-mention burst under `turns_per_minute = 12`: the limit is a sliding window per
//! chat (`bot/src/ratelimit.rs`), so a chat's first 12 turns start at once and later input
//! waits and merges. The mentions reach the daemon in `getUpdates` pages of 100, about ten
//! pages for the burst, so each group's 20 mentions make at most about ten turns and the
//! burst ends without waiting for the window (measured: see docs/perf.md, "The profiles").
//! Should it not end within [`BURST_TIMEOUT`], the row says INCOMPLETE and the CPU is that
//! of the window, divided by the LLM requests served in it.
//!
//! The 10,000-group phase and its minute of idling are the longest part (about 80 s a
//! profile). `lean`'s is the main bench's row, so it is skipped here unless `--all` is given.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use toml::{Table, Value};

use super::{
    Burst, Env, MIB, Report, Tag, burst, burst_tags, cpu_run_ms, groups, mib, release_binary,
    rss_breakdown, rss_pss, start_env_with, write_config,
};

/// How long the idle daemon is left before its RSS is read.
const IDLE_AFTER: Duration = Duration::from_secs(5);
/// The longest the 1,000-mention burst is waited for.
const BURST_TIMEOUT: Duration = Duration::from_secs(90);
/// The group auto-chat is configured in (the bench never posts there).
const AUTO_CHAT_GROUP: i64 = -1_009_000_000_000;
/// Who may use the terminal in `full`: the terminal serves operators only, and a user who
/// turns it on names one.
const OPERATOR: &str = "telegram:424242";

/// What `full` adds to `default`, each also measured alone.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Feature {
    Vision,
    Terminal,
    Mcp,
    Skill,
    AutoChat,
}

const FEATURES: [Feature; 5] = [
    Feature::Vision,
    Feature::Terminal,
    Feature::Mcp,
    Feature::Skill,
    Feature::AutoChat,
];

impl Feature {
    fn name(self) -> &'static str {
        match self {
            Feature::Vision => "llm.vision",
            Feature::Terminal => "terminal",
            Feature::Mcp => "one MCP stdio server",
            Feature::Skill => "one skill",
            Feature::AutoChat => "auto-chat in one group",
        }
    }
}

/// What the profile's config is made of.
#[derive(Clone)]
enum Setup {
    Lean,
    /// `config.example.toml` with these features added.
    Shipped(Vec<Feature>),
}

/// What the configs need from the machine, found once.
struct Host {
    /// `config.example.toml` as shipped.
    example: Table,
    mcp_server: PathBuf,
    /// "bwrap" when it runs here, else "none".
    sandbox: &'static str,
}

impl Host {
    fn find() -> Host {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace root");
        let text = std::fs::read_to_string(root.join("config.example.toml"))
            .expect("config.example.toml at the repository root");
        let example = text
            .parse::<Table>()
            .expect("config.example.toml parses as TOML");
        let mcp_server = release_binary("parlor-testkit", "parlor-mcp-test-server");
        // The daemon checks the sandbox when the terminal starts; a host without user
        // namespaces (some containers) cannot run bwrap.
        let bwrap = Command::new("bwrap")
            .args(["--ro-bind", "/", "/", "true"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        Host {
            example,
            mcp_server,
            sandbox: if bwrap { "bwrap" } else { "none" },
        }
    }
}

/// The table under `key`, made when missing.
fn table<'a>(root: &'a mut Table, key: &str) -> &'a mut Table {
    let entry = root
        .entry(key)
        .or_insert_with(|| Value::Table(Table::new()));
    if !entry.is_table() {
        *entry = Value::Table(Table::new());
    }
    entry.as_table_mut().expect("made a table just above")
}

fn string_array(items: &[&str]) -> Value {
    Value::Array(items.iter().map(|s| Value::from(*s)).collect())
}

/// Writes the config of `setup` into `dir` and returns its path.
fn write_setup(host: &Host, setup: &Setup, dir: &Path, api_url: &str) -> PathBuf {
    let features = match setup {
        Setup::Lean => return write_config(dir, api_url, 1),
        Setup::Shipped(features) => features,
    };
    let mut config = host.example.clone();
    let data = dir.join("data").display().to_string();
    let bot = table(&mut config, "bot");
    bot.insert("data_dir".into(), data.into());
    bot.insert("idle_minutes".into(), Value::Integer(1));
    table(&mut config, "telegram").insert("api_url".into(), api_url.into());
    // A failed request is not asked again: the fake never fails, and a retry would hide
    // a bench bug as latency.
    table(&mut config, "llm").insert("max_retries".into(), Value::Integer(0));
    for feature in features {
        match feature {
            Feature::Vision => {
                table(&mut config, "llm").insert("vision".into(), true.into());
            }
            Feature::Terminal => {
                table(&mut config, "bot").insert("admins".into(), string_array(&[OPERATOR]));
                let terminal = table(&mut config, "terminal");
                terminal.insert("enabled".into(), true.into());
                terminal.insert("sandbox".into(), host.sandbox.into());
            }
            Feature::Mcp => {
                let mut server = Table::new();
                server.insert("name".into(), "kb".into());
                server.insert(
                    "command".into(),
                    host.mcp_server.display().to_string().into(),
                );
                server.insert("risk".into(), "read".into());
                table(&mut config, "mcp")
                    .insert("servers".into(), Value::Array(vec![Value::Table(server)]));
            }
            Feature::Skill => {
                let skill = dir.join("skills").join("welcome");
                std::fs::create_dir_all(&skill).expect("skill folder");
                std::fs::write(
                    skill.join("SKILL.md"),
                    "---\nname: welcome\ndescription: How to welcome a new member of the \
                     group. Use when someone joins.\n---\nGreet them by name, say what the \
                     group is about in one sentence, and point them to the pinned message.\n",
                )
                .expect("SKILL.md");
                let skills = dir.join("skills").display().to_string();
                table(table(&mut config, "toolsets"), "skill")
                    .insert("dirs".into(), string_array(&[&skills]));
            }
            Feature::AutoChat => {
                let mut auto = Table::new();
                auto.insert("chat".into(), format!("telegram:{AUTO_CHAT_GROUP}").into());
                table(&mut config, "bot")
                    .insert("auto_chat".into(), Value::Array(vec![Value::Table(auto)]));
            }
        }
    }
    let path = dir.join("config.toml");
    std::fs::write(&path, config.to_string()).expect("write config");
    path
}

/// The processes whose parent is `pid` (the MCP server, shells) and their RSS in bytes.
fn children_rss(pid: u32) -> Vec<(String, u64)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(child) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        // `rest` starts at field 3 (state); the parent's pid is field 4.
        let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        if ppid == Some(pid) {
            let comm = head.split_once('(').map_or("", |(_, c)| c).to_owned();
            out.push((comm, rss_pss(child).0));
        }
    }
    out
}

/// One profile's run: its rows and notes go into `report`.
async fn run_profile(
    bin: &Path,
    host: &Host,
    name: &str,
    setup: &Setup,
    idle_target: f64,
    ten_thousand: bool,
    report: &mut Report,
) {
    eprintln!("profile {name}: starting the daemon...");
    let env = start_env_with(bin, |dir, api| write_setup(host, setup, dir, api)).await;
    let pid = env.daemon.pid();
    let start_ms = env.ready.as_secs_f64() * 1000.0;
    report.target(
        &format!("{name}: start to first getUpdates (one start)"),
        start_ms,
        format!("{start_ms:.0} ms"),
        20.0,
        "<= 20 ms",
    );

    let run0 = cpu_run_ms(pid);
    tokio::time::sleep(IDLE_AFTER).await;
    let idle_cpu = cpu_run_ms(pid) - run0;
    report.row(
        &format!("{name}: idle CPU, the 5 s after ready"),
        format!(
            "{idle_cpu:.2} ms, {:.1} ms a minute",
            idle_cpu * 60.0 / IDLE_AFTER.as_secs_f64()
        ),
    );
    let (rss, pss) = rss_pss(pid);
    report.target(
        &format!("{name}: idle RSS, 5 s after ready"),
        rss as f64 / MIB,
        format!("{} (PSS {})", mib(rss), mib(pss)),
        idle_target,
        &format!("<= {idle_target:.0} MiB"),
    );
    let children: Vec<String> = children_rss(pid)
        .iter()
        .map(|(comm, rss)| format!("{comm} {}", mib(*rss)))
        .collect();
    report.note(format!(
        "{name}: idle RSS by mapping: {}{}",
        rss_breakdown(pid),
        if children.is_empty() {
            String::new()
        } else {
            format!(" (child processes, not counted: {})", children.join(", "))
        }
    ));

    // Connections and the turn's code paths warmed up, as the main bench's earlier phases
    // do before its burst; not counted.
    let warm: Vec<Tag> = groups(-1_008_000_000_000, 50)
        .into_iter()
        .map(|chat| Tag { chat, n: 0 })
        .collect();
    burst(&env, &warm, Some(warm.len()), Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let tags = burst_tags(-1_006_000_000_000);
    let b = burst(&env, &tags, None, BURST_TIMEOUT).await;
    burst_rows(name, &env, &b, tags.len(), report);

    if !ten_thousand {
        env.daemon.stop().await;
        return;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    eprintln!("profile {name}: 10,000 groups, then a minute for idle_minutes...");
    let tags: Vec<Tag> = groups(-1_007_000_000_000, 10_000)
        .into_iter()
        .map(|chat| Tag { chat, n: 0 })
        .collect();
    let b = burst(&env, &tags, Some(tags.len()), Duration::from_secs(150)).await;
    let (rss, pss) = rss_pss(pid);
    report.row(
        &format!("{name}: 10,000 groups one turn each"),
        format!(
            "{:.1} s, {:.2} ms CPU/turn; RSS right after {} (PSS {}){}",
            b.wall.as_secs_f64(),
            b.cpu_ms / b.sends.max(1) as f64,
            mib(rss),
            mib(pss),
            if b.complete { "" } else { " (INCOMPLETE)" }
        ),
    );
    // idle_minutes = 1: the sessions leave a minute after their turn, then the daemon
    // gives the memory back (the trimmer looks every 5 s).
    tokio::time::sleep(Duration::from_secs(65)).await;
    let (rss, pss) = rss_pss(pid);
    report.target(
        &format!("{name}:   RSS after idle_minutes = 1 elapsed"),
        rss as f64 / MIB,
        format!("{} (PSS {})", mib(rss), mib(pss)),
        24.0,
        "<= 24 MiB",
    );
    report.note(format!(
        "{name}: RSS by mapping after 10,000 groups and idle_minutes: {}",
        rss_breakdown(pid)
    ));
    // Half a minute later, for comparison: on 2026-12-07 it was higher, not lower (the
    // executable's code, released when the last session left, was back: 5 MiB).
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (rss, pss) = rss_pss(pid);
    report.row(
        &format!("{name}:   RSS 30 s later"),
        format!("{} (PSS {}); {}", mib(rss), mib(pss), rss_breakdown(pid)),
    );
    env.daemon.stop().await;
}

fn burst_rows(name: &str, env: &Env, b: &Burst, mentions: usize, report: &mut Report) {
    let requests = b.turns;
    // Replies posted: one a turn, as the fake model answers in text and calls no tool.
    let turns = b.sends;
    let seen: usize = env.llm.requests()[b.llm_from..]
        .iter()
        .map(|r| super::parse_tags(&r.last_user_text().unwrap_or_default()).len())
        .sum();
    report.row(
        &format!("{name}: 1,000 mentions / 50 groups"),
        format!(
            "{requests} LLM requests, {turns} replies in {:.0} ms; {seen} of {mentions} \
             mentions reached the model{}",
            b.wall.as_secs_f64() * 1000.0,
            if b.complete { "" } else { " (INCOMPLETE)" }
        ),
    );
    let per_request = b.cpu_ms / requests.max(1) as f64;
    report.row(
        &format!("{name}:   daemon CPU per LLM request"),
        format!(
            "{per_request:.2} ms ({:.0} ms, kernel {:.0} ms of it; {:.3} ms per mention; \
             {:.1} context switches per request)",
            b.cpu_ms,
            b.sys_ms,
            b.cpu_ms / mentions as f64,
            b.switches as f64 / requests.max(1) as f64
        ),
    );
    let per_turn = b.cpu_ms / turns.max(1) as f64;
    report.target(
        &format!("{name}:   daemon CPU per turn (reply posted)"),
        per_turn,
        format!("{per_turn:.2} ms"),
        0.2,
        "<= 0.2 ms",
    );
}

/// The profiles mode: every row into `report`.
/// Runs the profiles named in `only` (every one, and each addition alone, when empty).
pub async fn run(bin: &Path, all: bool, only: &[String], report: &mut Report) {
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    let host = Host::find();
    if host.sandbox == "none" {
        report.note(
            "full: bwrap does not run here (bwrap --ro-bind / / true failed), so the terminal \
             runs with sandbox = \"none\""
                .into(),
        );
    }
    report.note(
        "every profile runs with bot.idle_minutes = 1 (shipped: 10), so the figure after \
         idle_minutes comes within the run"
            .into(),
    );
    if !all {
        report.note(
            "lean: the 10,000-group phase is skipped (the main bench's row; --all runs it)".into(),
        );
    }
    let started = Instant::now();
    if wanted("lean") {
        run_profile(bin, &host, "lean", &Setup::Lean, 8.0, all, report).await;
    }
    if wanted("default") {
        let shipped = Setup::Shipped(Vec::new());
        run_profile(bin, &host, "default", &shipped, 8.0, true, report).await;
    }
    if wanted("full") {
        let full = Setup::Shipped(FEATURES.to_vec());
        run_profile(bin, &host, "full", &full, 10.0, true, report).await;
    }
    if !only.is_empty() {
        eprintln!("profiles took {:.0} s", started.elapsed().as_secs_f64());
        return;
    }

    // Each addition alone on `default`: what it costs idle.
    for feature in FEATURES {
        let setup = Setup::Shipped(vec![feature]);
        let env = start_env_with(bin, |dir, api| write_setup(&host, &setup, dir, api)).await;
        tokio::time::sleep(IDLE_AFTER).await;
        let (rss, _) = rss_pss(env.daemon.pid());
        report.row(&format!("default + {}: idle RSS", feature.name()), mib(rss));
        env.daemon.stop().await;
    }
    eprintln!("profiles took {:.0} s", started.elapsed().as_secs_f64());
}
