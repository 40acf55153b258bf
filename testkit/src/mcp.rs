//! [`TestMcpServer`]: a real Model Context Protocol server, built with rmcp's own server
//! side, for the MCP client's tests. Not a mock of the protocol: the client under test
//! speaks to it over stdio (the `parlor-mcp-test-server` binary) or streamable HTTP on
//! 127.0.0.1 ([`McpHttpServer`], in-process).
//!
//! Its tools cover what a client has to handle: `echo` (read-only, with structured
//! content), `delete_file` (annotated destructive; deletes nothing), `move_file`
//! (annotated not read-only and not destructive; moves nothing), `lookup` (its schema
//! uses `$ref`/`$defs` and recurses), `fail` (answers `isError`), `slow` (waits until
//! cancelled or for `secs`), `picture` (an image result), `whoami` (its pid and
//! environment, so a test can check what the child was given and kill it) and
//! `add_tool` (adds `late_tool` and sends `notifications/tools/list_changed`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ContentBlock, JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::server::{Server, loopback};

/// A 1×1 PNG, the `picture` tool's image.
pub const PICTURE_PNG_BASE64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

/// What the server saw, shared by every connection to one [`TestMcpServer`].
#[derive(Debug)]
struct Seen {
    /// Whether `add_tool` has run: `late_tool` is offered from then on.
    late_tool: AtomicBool,
    /// `slow` calls that ended because the client cancelled them; a watch so a test can
    /// wait for the count instead of sleeping.
    cancelled: watch::Sender<usize>,
    /// `tools/call` requests received, for tests that check a call never left the client
    /// or wait for one to arrive.
    calls: watch::Sender<usize>,
}

/// The test MCP server's handler. Cloning shares what it saw.
#[derive(Debug, Clone)]
pub struct TestMcpServer {
    seen: Arc<Seen>,
}

impl Default for TestMcpServer {
    fn default() -> Self {
        TestMcpServer::new()
    }
}

impl TestMcpServer {
    /// A server offering the tools of the module docs.
    pub fn new() -> Self {
        TestMcpServer {
            seen: Arc::new(Seen {
                late_tool: AtomicBool::new(false),
                cancelled: watch::channel(0).0,
                calls: watch::channel(0).0,
            }),
        }
    }

    /// How many `slow` calls the client cancelled (`notifications/cancelled`) so far.
    pub fn cancelled(&self) -> watch::Receiver<usize> {
        self.seen.cancelled.subscribe()
    }

    /// How many `tools/call` requests arrived so far (a watch: wait for one to arrive).
    pub fn calls(&self) -> watch::Receiver<usize> {
        self.seen.calls.subscribe()
    }

    /// Serves one client on this process's stdin and stdout until it hangs up (the
    /// `parlor-mcp-test-server` binary).
    pub async fn serve_stdio(self) -> Result<(), std::io::Error> {
        use rmcp::ServiceExt;
        let running = self
            .serve(rmcp::transport::stdio())
            .await
            .map_err(std::io::Error::other)?;
        running.waiting().await.map_err(std::io::Error::other)?;
        Ok(())
    }

    /// Every tool offered right now.
    fn tools(&self) -> Vec<Tool> {
        let mut tools = vec![
            tool(
                "echo",
                "Repeats the text back.",
                json!({"type":"object","properties":{"text":{"type":"string","description":"What to repeat."}},"required":["text"]}),
                Some(ToolAnnotations::new().read_only(true)),
            ),
            tool(
                "delete_file",
                "Deletes a file (in this test server: pretends to).",
                json!({"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}),
                Some(ToolAnnotations::new().destructive(true)),
            ),
            tool(
                "move_file",
                "Moves a file (in this test server: pretends to).",
                json!({"type":"object","properties":{"from":{"type":"string"},"to":{"type":"string"}},"required":["from","to"]}),
                Some(ToolAnnotations::new().read_only(false).destructive(false)),
            ),
            tool(
                "lookup",
                "Looks a term up in a tree of topics.",
                json!({
                    "type": "object",
                    "properties": {"query": {"$ref": "#/$defs/Query"}},
                    "required": ["query"],
                    "$defs": {
                        "Query": {
                            "type": "object",
                            "properties": {
                                "term": {"type": "string"},
                                "limit": {"type": "integer", "minimum": 1},
                                "within": {"$ref": "#/$defs/Topic"}
                            },
                            "required": ["term"]
                        },
                        "Topic": {
                            "type": "object",
                            "description": "A topic and its subtopics.",
                            "properties": {
                                "name": {"type": "string"},
                                "children": {"type": "array", "items": {"$ref": "#/$defs/Topic"}}
                            }
                        }
                    }
                }),
                None,
            ),
            tool(
                "fail",
                "Always fails.",
                json!({"type":"object","properties":{}}),
                None,
            ),
            tool(
                "slow",
                "Waits `secs` seconds (an hour if not given), or until cancelled.",
                json!({"type":"object","properties":{"secs":{"type":"integer","minimum":0}}}),
                None,
            ),
            tool(
                "picture",
                "Returns a picture.",
                json!({"type":"object","properties":{}}),
                None,
            ),
            tool(
                "whoami",
                "This server's process id and environment.",
                json!({"type":"object","properties":{}}),
                None,
            ),
            tool(
                "add_tool",
                "Adds late_tool and tells the client its tool list changed.",
                json!({"type":"object","properties":{}}),
                None,
            ),
        ];
        if self.seen.late_tool.load(Ordering::SeqCst) {
            tools.push(tool(
                "late_tool",
                "Exists only after add_tool.",
                json!({"type":"object","properties":{}}),
                None,
            ));
        }
        tools
    }

    async fn call(
        &self,
        name: &str,
        args: &JsonObject,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let text = |s: String| Ok(CallToolResult::success(vec![ContentBlock::text(s)]));
        match name {
            "echo" => {
                let said = args.get("text").and_then(Value::as_str).unwrap_or_default();
                let mut result =
                    CallToolResult::success(vec![ContentBlock::text(format!("echo: {said}"))]);
                result.structured_content = Some(json!({"echoed": said}));
                Ok(result)
            }
            "delete_file" => {
                let path = args.get("path").and_then(Value::as_str).unwrap_or_default();
                text(format!("deleted {path}"))
            }
            "move_file" => {
                let arg = |k: &str| args.get(k).and_then(Value::as_str).unwrap_or_default();
                text(format!("moved {} to {}", arg("from"), arg("to")))
            }
            "lookup" => {
                let term = args
                    .get("query")
                    .and_then(|q| q.get("term"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                text(format!("found 3 entries for {term}"))
            }
            "fail" => Ok(CallToolResult::error(vec![ContentBlock::text(
                "the widget is broken",
            )])),
            "slow" => {
                let secs = args.get("secs").and_then(Value::as_u64).unwrap_or(3600);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(secs)) => text(format!("waited {secs}s")),
                    () = context.ct.cancelled() => {
                        self.seen.cancelled.send_modify(|n| *n += 1);
                        text("cancelled".to_owned())
                    }
                }
            }
            "picture" => Ok(CallToolResult::success(vec![
                ContentBlock::text("a red dot"),
                ContentBlock::image(PICTURE_PNG_BASE64, "image/png"),
            ])),
            "whoami" => {
                let env: serde_json::Map<String, Value> = std::env::vars()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect();
                text(json!({"pid": std::process::id(), "env": env}).to_string())
            }
            "add_tool" => {
                self.seen.late_tool.store(true, Ordering::SeqCst);
                if let Err(e) = context.peer.notify_tool_list_changed().await {
                    return Err(ErrorData::internal_error(e.to_string(), None));
                }
                text("late_tool added".to_owned())
            }
            "late_tool" if self.seen.late_tool.load(Ordering::SeqCst) => {
                text("late and here".to_owned())
            }
            other => Err(ErrorData::invalid_params(
                format!("no tool named {other}"),
                None,
            )),
        }
    }
}

fn tool(
    name: &str,
    description: &str,
    schema: Value,
    annotations: Option<ToolAnnotations>,
) -> Tool {
    let schema = match schema {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    };
    let mut tool = Tool::new(name.to_owned(), description.to_owned(), Arc::new(schema));
    tool.annotations = annotations;
    tool
}

impl ServerHandler for TestMcpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.seen.calls.send_modify(|n| *n += 1);
        let args = request.arguments.unwrap_or_default();
        self.call(&request.name, &args, context)
            .await
            .map(CallToolResponse::from)
    }

    async fn on_cancelled(
        &self,
        _notification: CancelledNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        // The request's own token is cancelled by rmcp; `slow` counts it.
    }
}

/// [`TestMcpServer`] over streamable HTTP on `127.0.0.1:0`, in-process; stops when
/// dropped.
pub struct McpHttpServer {
    handler: TestMcpServer,
    url: String,
    server: Server,
}

impl McpHttpServer {
    /// Starts the server.
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub async fn start() -> Self {
        let handler = TestMcpServer::new();
        let cancel = CancellationToken::new();
        let factory = handler.clone();
        let service = StreamableHttpService::new(
            move || Ok(factory.clone()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default()
                .with_cancellation_token(cancel.child_token())
                .with_legacy_session_mode(true),
        );
        let (listener, addr) = loopback("mcp").await;
        let mut server = Server::new(cancel);
        server.serve(listener, axum::Router::new().nest_service("/mcp", service));
        McpHttpServer {
            handler,
            url: format!("http://{addr}/mcp"),
            server,
        }
    }

    /// The endpoint, `http://127.0.0.1:PORT/mcp`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The handler, to see what it received.
    pub fn handler(&self) -> &TestMcpServer {
        &self.handler
    }

    /// Stops serving.
    pub async fn shutdown(mut self) {
        self.server.shutdown().await;
    }
}

/// The `parlor-mcp-test-server` binary, built first when it is not there yet.
///
/// Another crate's tests cannot name a testkit binary (`CARGO_BIN_EXE_*` is for the
/// package's own), so this looks beside the test executable (`target/debug/deps/..`) and
/// otherwise asks cargo to build it into the same target directory.
///
/// # Panics
/// When the binary can neither be found nor built: the stdio tests cannot run without it.
pub fn mcp_server_bin() -> std::path::PathBuf {
    const NAME: &str = "parlor-mcp-test-server";
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap_or_default();
            // target/debug/deps/test-hash -> target/debug
            let profile_dir = exe
                .parent()
                .and_then(|deps| deps.parent())
                .map(std::path::Path::to_path_buf)
                .unwrap_or_default();
            let bin = profile_dir.join(NAME);
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
            // Always asked, so a changed server is rebuilt; a no-op when it is fresh.
            let status = std::process::Command::new(cargo)
                .args([
                    "build",
                    "--quiet",
                    "--manifest-path",
                    manifest,
                    "--bin",
                    NAME,
                ])
                .env(
                    "CARGO_TARGET_DIR",
                    profile_dir.parent().unwrap_or(&profile_dir),
                )
                .status();
            match status {
                Ok(s) if s.success() && bin.exists() => bin,
                Ok(s) => panic!("building {NAME} failed ({s})"),
                Err(e) => panic!("cannot run cargo to build {NAME}: {e}"),
            }
        })
        .clone()
}
