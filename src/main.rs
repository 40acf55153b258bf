//! # parlor — the daemon binary
//!
//! Owns the command line, the configuration file and the wiring of the runtime (`bot`),
//! the platform adapters and the plugins. It is the only crate that uses `anyhow`; it holds
//! no agent logic of its own.

mod config;
mod wiring;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

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
    /// Print every tool this configuration registers (Markdown; --json for the exact
    /// `tools` array sent to the model).
    Tools {
        /// Print the JSON `tools` array instead of Markdown.
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
        /// Speak as an admin (allows dangerous tools).
        #[arg(long)]
        admin: bool,
    },
    /// Check the configuration file and exit.
    CheckConfig,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("parlor: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("PARLOR_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    // Logs go to stderr so that `parlor tools --json` stays machine-readable.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = match &cli.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    match cli.command {
        Command::Tools { json } => {
            let registry = wiring::registry(&config)?;
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
            wiring::registry(&config)?;
            println!("configuration is valid");
            Ok(ExitCode::SUCCESS)
        }
        Command::Ask { text, name, admin } => {
            let runtime = tokio::runtime::Runtime::new().context("cannot start the runtime")?;
            runtime.block_on(ask(&config, text, name, admin))
        }
    }
}

async fn ask(config: &Config, text: String, name: String, admin: bool) -> anyhow::Result<ExitCode> {
    let agent = wiring::agent(config)?;
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
        role: if admin { Role::Admin } else { Role::Member },
    };
    let input = TurnInput::text("console:local", caller, format!("{name}: {text}"));
    let result = agent.run_turn(&[], input, cancel).await;
    watcher.abort();
    let turn = result.context("the turn failed")?;
    println!("{}", turn.reply);
    Ok(match turn.end {
        TurnEnd::Cancelled => ExitCode::from(130),
        TurnEnd::Answered | TurnEnd::IterationLimit => ExitCode::SUCCESS,
    })
}
