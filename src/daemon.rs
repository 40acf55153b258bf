//! `parlor run`: the daemon. Opens the store (refusing a second daemon on the same data
//! directory), connects the adapters (Telegram, Discord, OneBot), resumes what a crash left
//! pending, serves until SIGTERM/SIGINT (SIGHUP re-reads the skills), then drains: intake
//! stops, running turns and sends get `shutdown_grace_secs`, the store is flushed, and
//! only then do the adapters close their connections.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use parlor_adapters::Receiver;
use parlor_adapters::discord::{DiscordAdapter, DiscordConfig};
use parlor_adapters::onebot::{OneBotAdapter, OneBotConfig, Transport};
use parlor_adapters::telegram::{TelegramAdapter, TelegramConfig};
use parlor_bot::platform::{Inbox, Platform};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::{systemd, wiring};

/// Runs the daemon until a signal arrives or an adapter fails for good.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let mut sigterm = listen_for_sigterm();
    let telegram_token = config.telegram_token().map(|t| t.expose().to_owned());
    let discord_token = config.discord_token().map(|t| t.expose().to_owned());
    if telegram_token.is_none() && discord_token.is_none() && !config.onebot.enabled() {
        anyhow::bail!(
            "no chat platform is configured: give systemd the telegram_token or discord_token \
             credential, set TELEGRAM_BOT_TOKEN or DISCORD_BOT_TOKEN, set [telegram] / \
             [discord] token_file, or point [onebot] at a OneBot implementation (url or \
             listen). To try parlor without one, run `parlor chat`"
        );
    }
    let store = wiring::store(&config)?;
    let onebot = onebot(&config, &store)?;
    // Bound before anything connects: a taken port fails the start, not the first scrape.
    let http = match config.http.listen_addr()? {
        Some(addr) => Some(crate::http::bind(addr).await?),
        None => None,
    };
    if config.telegram_webhook().is_some() && http.is_none() {
        // `Config::check` refuses this; kept so the daemon never sets a webhook it cannot serve.
        anyhow::bail!("telegram.webhook_url needs [http] listen");
    }
    let http_store = Arc::clone(&store);
    let telegram = match telegram_token {
        Some(token) => Some(
            TelegramAdapter::connect(TelegramConfig {
                api_url: config.telegram.api_url.clone(),
                poll_timeout_secs: config.telegram.poll_timeout_secs,
                webhook: config.telegram_webhook(),
                poll_lease: wiring::telegram_poll_lease(&config, &store, &token),
                ..TelegramConfig::new(token)
            })
            .await
            .context("cannot connect to Telegram")?,
        ),
        None => None,
    };
    let discord = match discord_token {
        Some(token) => Some(
            DiscordAdapter::connect(DiscordConfig {
                // The token's first part is the bot's user id (base64): it names the gateway.
                shard_leases: wiring::discord_shard_leases(
                    &config,
                    &store,
                    token.split('.').next().unwrap_or_default(),
                ),
                shards: config.discord.shards.max(1),
                api_url: config.discord.api_url.clone(),
                allow_mass_mentions: config.discord.allow_mass_mentions,
                ..DiscordConfig::new(token)
            })
            .await
            .context("cannot connect to Discord")?,
        ),
        None => None,
    };
    let mut platforms: Vec<Arc<dyn Platform>> = Vec::new();
    if let Some(telegram) = &telegram {
        platforms.push(Arc::new(telegram.clone()));
    }
    if let Some(discord) = &discord {
        platforms.push(Arc::new(discord.clone()));
    }
    if let Some(onebot) = &onebot {
        platforms.push(Arc::new(onebot.clone()));
    }
    // Before the sessions: the first turn already sees every server that came up.
    let mcp = wiring::mcp(&config).await?;
    let runtime = wiring::runtime(&config, store, platforms, mcp)?;
    runtime.resume().await?;
    let manager = runtime.sessions.clone();

    // Built before the adapter runs: Telegram may post as soon as `setWebhook` returns, and
    // the bound listener holds those connections until it serves.
    let telegram_webhook = match &telegram {
        Some(telegram) => parlor_adapters::telegram::webhook::WebhookReceiver::new(
            telegram,
            Arc::new(manager.clone()),
        )
        .context("cannot set up the Telegram webhook")?,
        None => None,
    };
    let shutdown = CancellationToken::new();
    let mut tasks = JoinSet::new();
    // READY once every adapter is receiving.
    let readiness = Arc::new(Readiness::new(
        usize::from(telegram.is_some())
            + usize::from(discord.is_some())
            + usize::from(onebot.is_some()),
    ));
    if let Some(telegram) = telegram {
        parlor_bot::health::global().set_down("telegram", "not connected yet");
        let inbox: Arc<dyn Inbox> = Arc::new(manager.clone());
        let shutdown = shutdown.clone();
        let readiness = Arc::clone(&readiness);
        tasks.spawn(async move {
            telegram
                .run_with_ready(inbox, shutdown, move || {
                    parlor_bot::health::global().set_ready("telegram");
                    readiness.one_ready();
                })
                .await
                .context("the Telegram adapter stopped")
        });
    }
    if let Some(discord) = discord {
        parlor_bot::health::global().set_down("discord", "not connected yet");
        let inbox: Arc<dyn Inbox> = Arc::new(manager.clone());
        let shutdown = shutdown.clone();
        let readiness = Arc::clone(&readiness);
        tasks.spawn(async move {
            discord
                .run_with_ready(inbox, shutdown, move || {
                    parlor_bot::health::global().set_ready("discord");
                    readiness.one_ready();
                })
                .await
                .context("the Discord adapter stopped")
        });
    }
    if let Some(onebot) = onebot {
        parlor_bot::health::global().set_down("onebot", "not connected yet");
        let inbox: Arc<dyn Inbox> = Arc::new(manager.clone());
        let shutdown = shutdown.clone();
        let readiness = Arc::clone(&readiness);
        tasks.spawn(async move {
            onebot
                .run_with_ready(inbox, shutdown, move || {
                    parlor_bot::health::global().set_ready("onebot");
                    readiness.one_ready();
                })
                .await
                .context("the OneBot adapter stopped")
        });
    }
    {
        let shutdown = shutdown.clone();
        let readiness = Arc::clone(&readiness);
        tasks.spawn(async move {
            readiness
                .release_code_pages_when_settled(shutdown.clone())
                .await;
            // A task of this set that ends stops the daemon: this one waits for shutdown.
            shutdown.cancelled().await;
            Ok(())
        });
    }
    {
        let shutdown = shutdown.clone();
        let sessions = manager.clone();
        tasks.spawn(async move {
            crate::memory::trim_after_evictions(sessions, shutdown).await;
            Ok(())
        });
    }
    {
        // SIGHUP re-reads what the tools load from files (skills), as `/reload` does.
        let shutdown = shutdown.clone();
        let sessions = manager.clone();
        tasks.spawn(async move {
            reload_on_hangup(sessions, shutdown).await;
            Ok(())
        });
    }
    if let Some(listener) = http {
        let shutdown = shutdown.clone();
        let console = config.http_token().map(|token| {
            Arc::new(crate::http::console::Console {
                auth: crate::http::auth::Auth::new(token.clone()),
                store: Arc::clone(&http_store),
                sessions: Some(manager.clone()),
                clock: runtime.clock_tasks.clone(),
                terminal: runtime.terminal.clone(),
                errors: crate::http::errors::global(),
            })
        });
        let state = crate::http::HttpState {
            store: http_store,
            sessions: Some(manager.clone()),
            console,
            terminal: runtime.terminal.clone(),
            allowed_hosts: config.http.allowed_hosts.clone(),
            telegram_webhook,
        };
        tasks.spawn(async move { crate::http::serve(listener, state, shutdown).await });
    }
    if let Some(interval) = systemd::watchdog_interval() {
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            systemd::watchdog(interval, shutdown).await;
            Ok(())
        });
    }

    let mut result = Ok(());
    tokio::select! {
        signal = wait_for_signal(sigterm.as_mut()) => {
            tracing::info!(signal, "shutting down");
        }
        Some(ended) = tasks.join_next() => {
            // An adapter only returns on its own when it cannot go on (a revoked token).
            result = match ended {
                Ok(Ok(())) => Err(anyhow::anyhow!("an adapter stopped unexpectedly")),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(anyhow::anyhow!("an adapter task failed: {e}")),
            };
        }
    }
    systemd::stopping();
    // The runtime drains first (intake refuses new input at once), and only then do the
    // adapters close: the last replies go out over their connections (OneBot's WebSocket).
    runtime
        .shutdown(Duration::from_secs(config.bot.shutdown_grace_secs))
        .await;
    shutdown.cancel();
    while let Some(ended) = tasks.join_next().await {
        if let Ok(Err(e)) = ended {
            tracing::warn!(error = %format!("{e:#}"), "adapter ended with an error during shutdown");
        }
    }
    tracing::info!("stopped");
    result
}

/// The OneBot adapter `[onebot]` asks for, if any. Nothing is dialled yet: the adapter
/// connects (or listens) when it runs.
fn onebot(
    config: &Config,
    store: &Arc<dyn parlor_bot::store::Store>,
) -> anyhow::Result<Option<OneBotAdapter>> {
    let section = &config.onebot;
    let transport = match (&section.url, section.listen_addr()?) {
        (Some(url), _) => Transport::Forward {
            url: url.trim().to_owned(),
        },
        // `Config::resolve_secrets` refused a listener without a token.
        (None, Some(listen)) => Transport::Reverse { listen },
        (None, None) => return Ok(None),
    };
    // One forward connection per account: its URL names it (never the token).
    let lease = match &transport {
        Transport::Forward { url } => {
            wiring::connection_lease(config, store, &format!("onebot:{url}"))
        }
        Transport::Reverse { .. } => None,
    };
    let mut adapter_config = OneBotConfig {
        connection_lease: lease,
        request_timeout: Duration::from_secs(section.request_timeout_secs),
        min_send_interval: Duration::from_millis(section.min_send_interval_ms),
        max_message_chars: section.max_message_chars,
        ..OneBotConfig::new(transport)
    };
    if let Some(token) = config.onebot_token() {
        adapter_config = adapter_config.with_token(token.expose().to_owned());
    }
    OneBotAdapter::new(adapter_config)
        .map(Some)
        .context("cannot set up the OneBot adapter")
}

/// Counts adapters down to systemd's READY=1.
struct Readiness {
    waiting: std::sync::atomic::AtomicUsize,
    all_ready: tokio::sync::Notify,
}

/// How long after the last adapter is ready the start-up's code pages are released: the
/// adapter calls `ready` just before its first request, and that request runs code the
/// release would have the kernel read back in (10–20 ms of page faults at start).
const SETTLE_BEFORE_RELEASE: Duration = Duration::from_millis(300);

impl Readiness {
    fn new(adapters: usize) -> Self {
        Readiness {
            waiting: std::sync::atomic::AtomicUsize::new(adapters),
            all_ready: tokio::sync::Notify::new(),
        }
    }

    fn one_ready(&self) {
        if self
            .waiting
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
        {
            systemd::ready();
            self.all_ready.notify_one();
        }
    }

    /// Once every adapter is ready and has had a moment to make its first request, gives
    /// back the code pages start-up ran all over the binary (what an idle daemon needs
    /// comes back on its own).
    async fn release_code_pages_when_settled(&self, shutdown: CancellationToken) {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = self.all_ready.notified() => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(SETTLE_BEFORE_RELEASE) => {}
        }
        // A few milliseconds of madvise: not on a worker the first turns may need.
        if let Err(error) = tokio::task::spawn_blocking(crate::memory::release_code_pages).await {
            tracing::debug!(%error, "releasing the code pages failed");
        }
    }
}

/// SIGTERM, listened for from the first moment of the start: one that arrives while the
/// daemon still connects is a clean stop once it can stop, never the default kill.
fn listen_for_sigterm() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{SignalKind, signal};
    signal(SignalKind::terminate())
        .inspect_err(|e| {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the daemon");
        })
        .ok()
}

async fn wait_for_signal(term: Option<&mut tokio::signal::unix::Signal>) -> &'static str {
    match term {
        Some(term) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "SIGINT",
        },
        None => {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}

/// Until `shutdown`: on every SIGHUP, the toolsets re-read their files (off the async
/// workers: it reads folders).
async fn reload_on_hangup(
    sessions: parlor_bot::session::SessionManager,
    shutdown: CancellationToken,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(hangup) => hangup,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; /reload still re-reads the skills");
            shutdown.cancelled().await;
            return;
        }
    };
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            Some(()) = hangup.recv() => {
                let sessions = sessions.clone();
                match tokio::task::spawn_blocking(move || sessions.reload()).await {
                    Ok(lines) if lines.is_empty() => tracing::info!("SIGHUP: nothing to reload"),
                    Ok(lines) => tracing::info!("SIGHUP: reloaded: {}", lines.join("; ")),
                    Err(e) => tracing::error!(error = %e, "reloading on SIGHUP failed"),
                }
            }
        }
    }
}
