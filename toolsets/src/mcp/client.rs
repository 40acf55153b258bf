//! One server's supervisor: connect (spawning the stdio child with its allow-listed
//! environment, or opening the HTTP session), list the tools, relist on `list_changed`,
//! and after a crash or hang-up reconnect with backoff until the service stops.

use std::process::Stdio;
use std::sync::Arc;

use parlor_bot::backoff::Failures;
use rmcp::model::ClientConfig;
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{McpTransport, ServerStatus, Shared, convert};

/// The client side rmcp calls back: it only passes `list_changed` on to the supervisor.
struct Handler {
    /// Capacity one: a change announced while a relist is pending is covered by it.
    relist: mpsc::Sender<()>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.relist.try_send(());
    }

    fn get_info(&self) -> ClientConfig {
        let mut config = ClientConfig::default();
        config.client_info.name = "parlor".to_owned();
        config.client_info.version = env!("CARGO_PKG_VERSION").to_owned();
        config
    }
}

type Running = RunningService<RoleClient, Handler>;

/// Why a server is down: shown in its status and logged.
#[derive(Debug, thiserror::Error)]
enum Down {
    #[error("cannot start {}: {source}", command.display())]
    Spawn {
        command: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("initialization failed: {0}")]
    Initialize(String),
    #[error("header name {0:?} is not valid")]
    HeaderName(String),
    #[error("the value of header {0} is not valid")]
    HeaderValue(http::HeaderName),
    #[error("connecting timed out")]
    ConnectTimedOut,
    #[error("tools/list failed: {0}")]
    List(String),
    #[error("tools/list timed out")]
    ListTimedOut,
    /// A list parlor cannot take (two tools with one wire name...).
    #[error("{0}")]
    Unfit(String),
    #[error("the server closed the connection")]
    Closed,
}

/// Runs until `stop`: one connection after another, waiting the backoff between failures.
pub(super) async fn supervise(shared: Arc<Shared>, stop: CancellationToken) {
    let name = shared.config.name.clone();
    let mut failures = Failures::new(shared.options.backoff);
    let mut first = true;
    while !stop.is_cancelled() {
        let (relist, mut relists) = mpsc::channel(1);
        let session = stop.child_token();
        let connected = tokio::select! {
            connected = tokio::time::timeout(
                shared.config.timeout,
                connect(&shared, Handler { relist }, session.clone()),
            ) => connected,
            () = stop.cancelled() => break,
        };
        let running = match connected {
            Ok(Ok(running)) => running,
            Ok(Err(why)) => {
                down(&shared, &name, &why, first);
                first = false;
                if !pause(&mut failures, &stop).await {
                    break;
                }
                continue;
            }
            Err(_) => {
                session.cancel();
                down(&shared, &name, &Down::ConnectTimedOut, first);
                first = false;
                if !pause(&mut failures, &stop).await {
                    break;
                }
                continue;
            }
        };
        let peer = running.peer().clone();
        if let Err(why) = relist_tools(&shared, &peer, first).await {
            session.cancel();
            let _ = running.waiting().await;
            down(&shared, &name, &why, first);
            first = false;
            if !pause(&mut failures, &stop).await {
                break;
            }
            continue;
        }
        first = false;
        failures.reset();
        shared.write().peer = Some(peer.clone());
        shared.set_status(ServerStatus::Connected);
        tracing::info!(server = %name, tools = shared.read().tools.len(), "MCP server connected");
        let waiting = running.waiting();
        tokio::pin!(waiting);
        loop {
            tokio::select! {
                _ = &mut waiting => break,
                Some(()) = relists.recv() => {
                    if let Err(why) = relist_tools(&shared, &peer, false).await {
                        tracing::warn!(server = %name, error = %why, "MCP tool list not refreshed");
                    }
                    // Touched after every relist, so waiters on the list see it.
                    shared.set_status(ServerStatus::Connected);
                }
            }
        }
        shared.write().peer = None;
        if stop.is_cancelled() {
            break;
        }
        down(&shared, &name, &Down::Closed, false);
        if !pause(&mut failures, &stop).await {
            break;
        }
    }
    shared.write().peer = None;
    shared.set_status(ServerStatus::Down("stopped".to_owned()));
}

/// Marks the server down and logs why (an error at start, a warning later).
fn down(shared: &Shared, name: &str, why: &Down, first: bool) {
    if first {
        tracing::error!(server = %name, error = %why, "MCP server failed to start; running without it and retrying");
    } else {
        tracing::warn!(server = %name, error = %why, "MCP server down; restarting with backoff");
    }
    shared.set_status(ServerStatus::Down(why.to_string()));
}

/// Waits the next backoff delay; `false` when stopped meanwhile.
async fn pause(failures: &mut Failures, stop: &CancellationToken) -> bool {
    let wait = failures.next_delay();
    tokio::select! {
        () = tokio::time::sleep(wait) => true,
        () = stop.cancelled() => false,
    }
}

/// Lists the server's tools and publishes them. At start a list parlor cannot take (two
/// tools with one wire name) is kept as the start error; later it is only reported.
async fn relist_tools(
    shared: &Shared,
    peer: &rmcp::Peer<RoleClient>,
    first: bool,
) -> Result<(), Down> {
    let tools = match tokio::time::timeout(shared.config.timeout, peer.list_all_tools()).await {
        Ok(Ok(tools)) => tools,
        Ok(Err(e)) => return Err(Down::List(e.to_string())),
        Err(_) => return Err(Down::ListTimedOut),
    };
    match convert::offered(&shared.config, &tools) {
        Ok(offered) => {
            shared.publish(offered);
            Ok(())
        }
        Err(e) => {
            let why = Down::Unfit(e.to_string());
            if first {
                *shared.start_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            }
            Err(why)
        }
    }
}

/// Opens one connection; `session` ends it (and, for stdio, the child).
async fn connect(
    shared: &Shared,
    handler: Handler,
    session: CancellationToken,
) -> Result<Running, Down> {
    match &shared.config.transport {
        McpTransport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(args).env_clear().kill_on_drop(true);
            // Only what the allow-list names, then what the operator set: no parlor secret
            // reaches the child unless they put it there.
            for name in &shared.options.env_allow {
                if let Some(value) = std::env::var_os(name) {
                    cmd.env(name, value);
                }
            }
            cmd.envs(env);
            if let Some(cwd) = cwd {
                cmd.current_dir(cwd);
            }
            let (transport, _) = TokioChildProcess::builder(cmd)
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|source| Down::Spawn {
                    command: command.clone(),
                    source,
                })?;
            handler
                .serve_with_ct(transport, session)
                .await
                .map_err(|e| Down::Initialize(e.to_string()))
        }
        McpTransport::Http {
            url,
            headers,
            bearer_token,
        } => {
            install_crypto();
            let mut custom = std::collections::HashMap::new();
            for (name, value) in headers {
                let name = http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| Down::HeaderName(name.clone()))?;
                let value = http::HeaderValue::from_str(value)
                    .map_err(|_| Down::HeaderValue(name.clone()))?;
                custom.insert(name, value);
            }
            let mut config =
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom);
            if let Some(token) = bearer_token {
                config = config.auth_header(token.clone());
            }
            let transport = StreamableHttpClientTransport::from_config(config);
            handler
                .serve_with_ct(transport, session)
                .await
                .map_err(|e| Down::Initialize(e.to_string()))
        }
    }
}

/// rmcp's reqwest is built without a TLS crypto provider of its own (the workspace uses
/// ring, not aws-lc); the process default is set once, before the first HTTP client.
fn install_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err: another part of the process installed one first, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
