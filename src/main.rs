//! # parlor — the daemon binary
//!
//! Owns the command line, the configuration file and the wiring of the runtime
//! (`parlor-bot`), the platform adapters (`parlor-adapters`) and the toolsets
//! (`parlor-toolsets`). It is the only crate that uses `anyhow`; it holds no agent logic of
//! its own.
//!
//! ## Layout
//! - `main.rs` — the command line: `run`, `chat`, `ask`, `tools`, `check-config`, `mcp`,
//!   `skills`, `usage`.
//! - `usage.rs` — `parlor usage`'s tables.
//! - `config.rs` — the TOML file, then the environment, then defaults; every option checked
//!   at load with a message naming it.
//! - `secrets.rs` — secrets resolved once (`*_file`, file value, systemd credential,
//!   environment), scrubbed from the process environment, the process made non-dumpable.
//! - `wiring.rs` — config into runtime objects: the agent, its toolsets, the session
//!   manager, the clock service.
//! - `daemon.rs` — `parlor run`'s life cycle: adapters in a `JoinSet`, signals, the draining
//!   shutdown.
//! - `systemd.rs` — readiness and the watchdog.
//! - `memory.rs` — freed memory given back to the kernel (glibc arenas, trimming).

mod config;
mod daemon;
mod firstrun;
mod http;
mod memory;
mod secrets;
mod systemd;
mod usage;
mod wiring;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use parlor_bot::agent::{TurnEnd, TurnInput};
use parlor_bot::tool::{Caller, Role, catalog};
use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// parlor puts an LLM agent into group chats.
#[derive(Debug, Parser)]
#[command(name = "parlor", version, about)]
struct Cli {
    /// Configuration file (TOML); built-in defaults when absent.
    #[arg(long, short, global = true, env = "PARLOR_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print every tool this configuration registers, with the role each needs (Markdown;
    /// --json for the `tools` array sent to the model, each entry with an `x-parlor` member:
    /// toolset, risk, role, failure codes).
    Tools {
        /// Print the JSON `tools` array (with `x-parlor`) instead of Markdown.
        #[arg(long)]
        json: bool,
    },
    /// Run one agent turn and print the reply: a quick end-to-end check of the model,
    /// the key and the tools.
    Ask {
        /// What to ask.
        text: String,
        /// Speak as this member.
        #[arg(long = "as", default_value = "operator")]
        name: String,
        /// Speak as an operator (one of bot.admins: may use operator tools such as the
        /// terminal).
        #[arg(long)]
        admin: bool,
    },
    /// Run the daemon: serve every configured chat platform until SIGTERM.
    Run,
    /// Check the configuration file (and the skill folders it names) and exit.
    CheckConfig,
    /// Print the tokens each chat and each member used per UTC day, from the store (stop
    /// the daemon first, or read the console's usage page while it runs).
    Usage {
        /// Only this chat, by its session key (`telegram:-100123`).
        #[arg(long)]
        chat: Option<String>,
        /// Only this member (`telegram:42`).
        #[arg(long)]
        member: Option<String>,
        /// How many days, today (UTC) included.
        #[arg(long, default_value_t = 7)]
        days: u32,
    },
    /// Connect to every configured MCP server and report what each offers: its status,
    /// and each tool's wire name, risk and role.
    Mcp,
    /// List the skills `[toolsets.skill] dirs` holds, and every one skipped with its file
    /// and the problem.
    Skills,
    /// Play a group chat in this terminal: `alice: hi @parlor` speaks as alice. Same
    /// sessions, store and tools as the daemon.
    Chat {
        /// Direct-message mode: every line is addressed to the bot (no mention needed).
        #[arg(long)]
        dm: bool,
        /// Who speaks when a line has no `name:` prefix.
        #[arg(long = "as", default_value = "you")]
        name: String,
        /// Make every console member an operator (as if listed in bot.admins): the console
        /// is the operator's own terminal.
        #[arg(long)]
        admin: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The daemon logs its life (info). `chat` and `ask` share the terminal with a
    // conversation: only errors, so retries and warnings do not interleave with it
    // (PARLOR_LOG=warn or info brings them back). The rest stay quiet but for warnings.
    init_logging(match cli.command {
        Command::Run => "info",
        Command::Chat { .. } | Command::Ask { .. } => "error",
        _ => "warn",
    });
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("parlor: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Why compaction cannot work well with a fixed part of `fixed` tokens, if it cannot: that
/// part alone reaches the window's share `bot.compact_ratio` (a summary after nearly every
/// turn before, and little room for the conversation now).
fn compaction_warning(config: &Config, fixed: usize) -> Option<String> {
    let ratio = config.bot.compact_ratio;
    if ratio <= 0.0 {
        return None;
    }
    // A token count and a ratio in (0, 0.95].
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let share = (config.llm.context_window as f64 * ratio) as usize;
    (fixed >= share).then(|| {
        format!(
            "the system prompt and tool schemas alone (about {fixed} tokens) reach \
             llm.context_window x bot.compact_ratio ({share} tokens): the conversation has \
             little room before each compaction; raise llm.context_window if the model allows, \
             or enable fewer toolsets"
        )
    })
}

/// Takes the secrets out of the process environment once the config has read them, and
/// for the long-running commands (`run`, `chat`: the ones with a terminal) makes the
/// process non-dumpable. Runs on the main thread before any runtime exists: removing
/// environment variables is only sound while no other thread can read them.
fn protect_secrets(config: &Config, long_running: bool) {
    if long_running {
        secrets::make_non_dumpable();
    }
    if !single_threaded() {
        // Cannot happen as `main` is written; refusing beats undefined behaviour.
        tracing::warn!(
            "other threads already run; the secrets stay in the process environment (children \
             still never get them: the terminal passes an allow-list only)"
        );
        return;
    }
    // SAFETY: this process has one thread (checked just above, and no code before this
    // point starts one: argument parsing, logging set-up and reading the config do not),
    // so nothing reads the environment while it changes.
    #[allow(unsafe_code)]
    let scrubbed = unsafe { secrets::scrub_env(&config.secret_env_names()) };
    if !scrubbed.removed.is_empty() {
        tracing::debug!(variables = ?scrubbed.removed, "secrets removed from the environment");
    }
    if !scrubbed.still_visible.is_empty() {
        tracing::warn!(
            variables = ?scrubbed.still_visible,
            "these secrets could not be erased from /proc/self/environ"
        );
    }
}

/// Whether this process runs one thread only (Linux: `Threads:` in `/proc/self/status`).
fn single_threaded() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .any(|l| l.strip_prefix("Threads:").is_some_and(|n| n.trim() == "1"))
    })
}

/// A store that lives for this command only: `tools` and `ask` need the toolsets built, not
/// the daemon's database (which a running daemon holds locked).
fn ephemeral_store() -> Arc<dyn parlor_bot::store::Store> {
    Arc::new(parlor_bot::store::MemoryStore::new())
}

fn init_logging(default_level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("PARLOR_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new(default_level));
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    // Logs go to stderr so that `parlor tools --json` stays machine-readable. The console's
    // `/errors` keeps every warning and error whatever the log level.
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(filter),
        )
        .with(http::errors::RingLayer.with_filter(tracing_subscriber::filter::LevelFilter::WARN))
        .try_init();
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut config = match &cli.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    // The catalog needs no secret, and must print for someone who may not read them.
    let needs_secrets = !matches!(cli.command, Command::Tools { .. } | Command::Skills);
    let resolved = if needs_secrets {
        config.resolve_secrets()
    } else {
        Ok(())
    };
    protect_secrets(
        &config,
        matches!(cli.command, Command::Run | Command::Chat { .. }),
    );
    memory::start_background_purge();
    resolved?;
    match cli.command {
        Command::Tools { json } => {
            // MCP tools are known only from their servers: connect for the listing.
            let runtime = runtime()?;
            let mcp = runtime.block_on(wiring::mcp(&config))?;
            let registry = wiring::catalog_registry(&config, mcp.clone());
            if let Some(mcp) = &mcp {
                runtime.block_on(mcp.shutdown());
            }
            let registry = registry?;
            let text = if json {
                catalog::to_json(&registry)
            } else {
                catalog::to_markdown(&registry)
            };
            let mut out = std::io::stdout().lock();
            writeln!(out, "{text}").context("cannot write to stdout")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::CheckConfig => {
            // The secrets were resolved (files and credentials read) before this.
            let registry = wiring::catalog_registry(&config, None)?;
            let tools = registry.defs().len();
            let size = wiring::prompt_size(&config, registry)?;
            println!(
                "every request starts with about {} tokens before the conversation: the system \
                 prompt {}, the schemas of {tools} tools {}",
                size.total(),
                size.system,
                size.tools
            );
            if let Some(warning) = compaction_warning(&config, size.total()) {
                println!("warning: {warning}");
            }
            let problems = skill_problems(&config);
            println!("{}", wiring::store_line(&config));
            if let Some(listen) = &config.http.listen {
                println!(
                    "{}",
                    http::console_line(listen, config.http_token().is_some())
                );
            }
            for line in http::webhook::telegram_lines(&config) {
                println!("{line}");
            }
            if problems.is_empty() {
                println!("configuration is valid");
                Ok(ExitCode::SUCCESS)
            } else {
                for problem in &problems {
                    println!("{problem}");
                }
                println!(
                    "configuration is valid, but {} skill problem(s) above: those skills are \
                     skipped until fixed",
                    problems.len()
                );
                Ok(ExitCode::FAILURE)
            }
        }
        Command::Skills => {
            print_skills(&config).context("cannot write to stdout")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Usage { chat, member, days } => {
            let store = wiring::store(&config)?;
            let filter = usage::Filter { chat, member, days };
            let table = usage::report(store.as_ref(), chrono::Utc::now().date_naive(), &filter)?;
            print!("{table}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Mcp => {
            let runtime = runtime()?;
            runtime.block_on(mcp_report(&config))
        }
        Command::Ask { text, name, admin } => {
            let runtime = runtime()?;
            if let Some(help) = runtime.block_on(firstrun::preflight(&config)) {
                eprintln!("{help}");
                return Ok(ExitCode::from(2));
            }
            runtime.block_on(ask(&config, text, name, admin))
        }
        Command::Run => {
            let runtime = runtime()?;
            runtime.block_on(daemon::run(config))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Chat { dm, name, admin } => {
            let runtime = runtime()?;
            if let Some(help) = runtime.block_on(firstrun::preflight(&config)) {
                eprintln!("{help}");
                return Ok(ExitCode::from(2));
            }
            runtime.block_on(chat(config, dm, name, admin))
        }
    }
}

async fn chat(
    mut config: Config,
    direct: bool,
    speaker: String,
    admin: bool,
) -> anyhow::Result<ExitCode> {
    use parlor_adapters::console::{self, ConsoleOptions, ConsolePlatform};
    use parlor_bot::platform::{Inbox, Platform};

    if admin {
        // Every console member is an operator: the console is the operator's own terminal.
        config.bot.admins.push(format!("{}:*", console::PLATFORM));
    }
    let store = wiring::store(&config)?;
    let platform = ConsolePlatform::new(Box::new(std::io::stdout()), &config.bot.name);
    let mcp = wiring::mcp(&config).await?;
    let runtime = wiring::runtime(
        &config,
        store,
        vec![Arc::new(platform.clone()) as Arc<dyn Platform>],
        mcp,
    )?;
    runtime.resume().await?;
    let manager = runtime.sessions.clone();
    let options = ConsoleOptions {
        bot_name: config.bot.name.clone(),
        default_speaker: speaker,
        direct,
        ..ConsoleOptions::default()
    };
    let interactive = std::io::IsTerminal::is_terminal(&std::io::stdin());
    if interactive {
        eprintln!(
            "parlor chat — model {} at {}. Store: {}\n\
             You are in a group chat: write `name: text` to speak as someone, mention @{} to \
             address the bot ({}), `> text` replies to its last message, /help lists commands. \
             Ctrl-D ends. Logs: errors only, on stderr (PARLOR_LOG=info for more).",
            config.model(),
            config.base_url(),
            config.data_dir().display(),
            config.bot.name,
            if direct {
                "or just write: --dm is on"
            } else {
                "or use --dm"
            },
        );
    }
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let signals = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.cancel();
        }
    });
    let inbox: Arc<dyn Inbox> = Arc::new(manager.clone());
    let stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let result = console::run(stdin, inbox, platform, options, shutdown.clone()).await;
    // The input ended: wait for the answers still on their way, unless Ctrl-C.
    while !shutdown.is_cancelled() && !manager.is_idle() {
        tokio::select! {
            () = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
            () = shutdown.cancelled() => {}
        }
    }
    // The daemon's own path: terminal process groups, the clock service, then the sessions.
    runtime
        .shutdown(std::time::Duration::from_secs(
            config.bot.shutdown_grace_secs,
        ))
        .await;
    signals.abort();
    result.context("the console stopped")?;
    Ok(ExitCode::SUCCESS)
}

async fn ask(config: &Config, text: String, name: String, admin: bool) -> anyhow::Result<ExitCode> {
    // `ask` runs outside any chat: no terminal (its notices would have nowhere to go).
    // No sub-agents: `ask` runs one turn and ends, so a background one could tell nobody.
    let services = wiring::Services {
        skills: wiring::skills(config),
        mcp: wiring::mcp(config).await?,
        ..wiring::Services::default()
    };
    let agent = wiring::agent(config, ephemeral_store(), &services)?;
    let cancel = CancellationToken::new();
    let ctrl_c = cancel.clone();
    // Ctrl-C stops the turn cleanly instead of killing the process mid-call.
    let watcher = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            ctrl_c.cancel();
        }
    });
    let caller = Caller {
        user_id: format!("console:{name}"),
        name: name.clone(),
        role: if admin { Role::Operator } else { Role::Member },
        grants: Vec::new(),
    };
    let line = parlor_bot::session::attribute(
        &parlor_bot::platform::Sender {
            id: caller.user_id.clone(),
            name: name.clone(),
            username: None,
            is_bot: false,
        },
        &text,
        usize::MAX,
    );
    let input = TurnInput::text("console:local", caller, line);
    let result = agent.run_turn(&[], input, cancel).await;
    watcher.abort();
    if let Some(mcp) = &services.mcp {
        mcp.shutdown().await;
    }
    let turn = match result {
        Ok(turn) => turn,
        Err(e) if firstrun::is_unreachable(&e) => {
            eprintln!("{}", firstrun::unreachable(config, &e.to_string()).await);
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(anyhow::Error::new(e).context("the turn failed")),
    };
    println!("{}", turn.reply);
    Ok(match turn.end {
        TurnEnd::Cancelled => ExitCode::from(130),
        TurnEnd::Answered | TurnEnd::IterationLimit | TurnEnd::RepeatedToolCall => {
            ExitCode::SUCCESS
        }
    })
}

/// `parlor mcp`: every configured server connected (or its failure), and what it offers.
async fn mcp_report(config: &Config) -> anyhow::Result<ExitCode> {
    use parlor_bot::tool::ToolSet;
    use parlor_toolsets::mcp::ServerStatus;
    let Some(mcp) = wiring::mcp(config).await? else {
        println!("no MCP server is configured (add [[mcp.servers]] to the config)");
        return Ok(ExitCode::SUCCESS);
    };
    let mut all_up = true;
    let mut out = String::new();
    for toolset in mcp.toolsets() {
        let status = match toolset.status() {
            ServerStatus::Connected => "connected".to_owned(),
            ServerStatus::Starting => {
                all_up = false;
                "no answer yet".to_owned()
            }
            ServerStatus::Down(why) => {
                all_up = false;
                format!("DOWN: {why}")
            }
        };
        let tools = toolset.tools();
        out.push_str(&format!(
            "{} ({status}): {} tool(s)\n",
            toolset.server(),
            tools.len()
        ));
        for spec in tools {
            let first_line = spec.description.lines().next().unwrap_or_default();
            out.push_str(&format!(
                "  {}  risk {} · role {}  {first_line}\n",
                spec.name,
                spec.risk.as_str(),
                spec.role.as_str()
            ));
        }
    }
    mcp.shutdown().await;
    let mut stdout = std::io::stdout().lock();
    write!(stdout, "{out}").context("cannot write to stdout")?;
    Ok(if all_up {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// What is wrong with the skill folders: each skipped skill with its file, and each
/// `[toolsets.skill.chats]` entry naming no skill.
fn skill_problems(config: &Config) -> Vec<String> {
    let Some(library) = wiring::skills(config) else {
        return Vec::new();
    };
    let catalog = library.catalog();
    let mut problems: Vec<String> = catalog
        .problems
        .iter()
        .map(|p| format!("skill skipped: {p}"))
        .collect();
    let options = parlor_toolsets::skill::SkillOptions {
        chats: config.toolsets.skill.chats.clone(),
        ..parlor_toolsets::skill::SkillOptions::default()
    };
    for name in parlor_toolsets::skill::unknown_restricted(&options, &catalog) {
        problems.push(format!(
            "toolsets.skill.chats names skill {name:?}, which no skill folder provides"
        ));
    }
    problems
}

/// `parlor skills`.
fn print_skills(config: &Config) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    let Some(library) = wiring::skills(config) else {
        writeln!(
            out,
            "no skills: [toolsets.skill] dirs names no folder (or `skill` is not in toolsets.enabled)"
        )?;
        return Ok(());
    };
    let catalog = library.catalog();
    for skill in catalog.skills.values() {
        let chats = config
            .toolsets
            .skill
            .chats
            .get(&skill.name)
            .map_or_else(|| "every chat".to_owned(), |c| c.join(", "));
        writeln!(out, "{} — {}", skill.name, skill.description)?;
        writeln!(
            out,
            "  folder: {}\n  files: {}\n  offered in: {chats}",
            skill.dir.display(),
            if skill.resources.is_empty() {
                "none".to_owned()
            } else {
                skill.resources.join(", ")
            }
        )?;
    }
    if catalog.skills.is_empty() {
        writeln!(out, "no skills found")?;
    }
    for problem in skill_problems(config) {
        writeln!(out, "{problem}")?;
    }
    Ok(())
}

/// The runtime of every command: tokio's defaults, but a blocking pool of at most
/// [`MAX_BLOCKING_THREADS`] (file reads, image decoding, the store's flushes) instead of
/// 512, so that the unit's `TasksMax=` leaves room for the shell's and MCP servers'
/// processes.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .build()
        .context("cannot start the runtime")
}

/// Most threads of the runtime's blocking pool.
const MAX_BLOCKING_THREADS: usize = 64;
