//! [`ToolSetBridge`]: typed async functions as tools (docs/contract.md, "Tools").
//!
//! ```
//! use parlor_bot::tool::bridge::{BridgeError, ToolError, ToolSetBridge};
//! use parlor_bot::tool::{Risk, Role, ToolSet};
//! use schemars::JsonSchema;
//! use serde::Deserialize;
//!
//! /// Arguments of `note_add`.
//! #[derive(Deserialize, JsonSchema)]
//! struct NoteArgs {
//!     /// The note, one line.
//!     text: String,
//! }
//!
//! let notes = ToolSetBridge::builder("notes")
//!     .prompt("Use `note_add` to remember things for this chat.")
//!     .add_function("note_add", "Stores a note for this chat.", |args: NoteArgs| async move {
//!         if args.text.len() > 200 {
//!             return Err(ToolError::new("NOTE_TOO_LONG", "a note is at most 200 bytes"));
//!         }
//!         Ok(serde_json::json!({"id": 1}))
//!     })
//!     .risk(Risk::Write)
//!     .role(Role::ChatAdmin)
//!     .failure_codes(&["NOTE_TOO_LONG"])
//!     .result_doc("`{\"id\": number}` of the stored note")
//!     .build()?;
//! assert_eq!(notes.tools()[0].risk, Risk::Write);
//! assert_eq!(notes.tools()[0].role, Role::ChatAdmin);
//! # Ok::<(), BridgeError>(())
//! ```
//!
//! The argument type `A` (`DeserializeOwned + JsonSchema`) gives the tool's schema through
//! [`schema_for`]; the function returns anything [`IntoToolResult`]: a [`ToolResult`], or a
//! `Result<T: Serialize, E: Into<ToolError>>`.
//!
//! Per-tool metadata (`.risk`, `.role`, `.role_in_chat_arg`, `.failure_codes`,
//! `.result_doc`) is chained on the same
//! builder and applies to the tool added last: it keeps one flat chain per toolset, without
//! a sub-builder to finish. Calling one before any tool is added is reported by `build()`.
//!
//! A bridge is stateless: `fork()` shares it, `reset()` does nothing. State a tool needs lives
//! in what its closure captures (an `Arc`), which every session then shares. A toolset with
//! per-session state (the todo list) implements [`ToolSet`] itself.
//!
//! The bridge does not race tools against cancellation or timeouts: the agent owns those for
//! every toolset alike (dropping the `invoke` future). A tool that must clean up on
//! cancellation takes the token ([`ToolSetBridgeBuilder::add_function_cancellable`]).

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use async_trait::async_trait;
use futures::FutureExt;
use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::result::{ToolResult, codes};
use super::schema::{check_schema, schema_for};
use super::validate::{ArgValidator, drop_optional_nulls};
use super::{MessageAppender, Risk, Role, ToolContext, ToolInvocation, ToolSet, ToolSpec};

/// What a panicking tool answers; the panic itself only goes to the log.
const PANIC_MESSAGE: &str = "the tool failed unexpectedly; the error was logged";

/// The `result` line of a tool whose builder gave none.
const DEFAULT_RESULT_DOC: &str = "see message";

/// What a tool function may return: turned into the stable result JSON.
pub trait IntoToolResult {
    /// The [`ToolResult`] sent to the model.
    fn into_tool_result(self) -> ToolResult;
}

impl IntoToolResult for ToolResult {
    fn into_tool_result(self) -> ToolResult {
        self
    }
}

/// `Ok(value)`: a success. A string becomes the message (no data); `()` / `None` give the
/// message `"ok"` and no data; anything else is the `data`, with the message `"ok"`.
/// `Err(e)`: a failure with `e`'s code, message and data.
///
/// Note that `Ok(ToolResult)` is *data* like any other `Serialize` value; return a bare
/// [`ToolResult`] to control the result fully.
impl<T, E> IntoToolResult for Result<T, E>
where
    T: Serialize,
    E: Into<ToolError>,
{
    fn into_tool_result(self) -> ToolResult {
        match self {
            Ok(value) => match serde_json::to_value(&value) {
                Ok(Value::Null) => ToolResult::ok("ok"),
                Ok(Value::String(message)) => ToolResult::ok(message),
                Ok(data) => ToolResult::ok_with("ok", data),
                Err(error) => {
                    tracing::error!(%error, "a tool's result could not be encoded as JSON");
                    ToolResult::err(
                        codes::INTERNAL,
                        "the tool's result could not be encoded; the error was logged",
                    )
                }
            },
            Err(error) => error.into().into(),
        }
    }
}

/// A tool's failure, for the model: a code (shared from [`codes`] or the toolset's own), a
/// sentence it can act on, optional data. The message goes to the model verbatim, so it
/// must not carry secrets or raw internal errors (log those).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ToolError {
    code: String,
    message: String,
    data: Option<Value>,
}

impl ToolError {
    /// A failure with any code (a toolset's own, such as `TASK_NOT_FOUND`).
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        ToolError {
            code: code.into(),
            message: message.into(),
            data: None,
        }
    }

    /// `INVALID_ARGUMENTS`: the arguments fit the schema but not the situation.
    pub fn invalid_arguments(message: impl Into<String>) -> Self {
        Self::new(codes::INVALID_ARGUMENTS, message)
    }

    /// `PERMISSION_DENIED`: this caller may not do this here.
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(codes::PERMISSION_DENIED, message)
    }

    /// `UNAVAILABLE`: something the tool needs is unreachable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(codes::UNAVAILABLE, message)
    }

    /// `TIMEOUT`: the work took too long.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(codes::TIMEOUT, message)
    }

    /// `CANCELLED`: the turn was stopped.
    pub fn cancelled(message: impl Into<String>) -> Self {
        Self::new(codes::CANCELLED, message)
    }

    /// `RATE_LIMITED`: too many calls; try later.
    pub fn rate_limited(message: impl Into<String>) -> Self {
        Self::new(codes::RATE_LIMITED, message)
    }

    /// `INTERNAL`: a failure the model cannot fix. Say so in general terms and log the
    /// details yourself; the message reaches the model.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(codes::INTERNAL, message)
    }

    /// Adds structured data to the failure.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// The error code.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The message for the model.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The structured data, if any.
    pub fn data(&self) -> Option<&Value> {
        self.data.as_ref()
    }
}

impl From<ToolError> for ToolResult {
    fn from(error: ToolError) -> Self {
        let result = ToolResult::err(error.code, error.message);
        match error.data {
            Some(data) => result.with_data(data),
            None => result,
        }
    }
}

/// Why a [`ToolSetBridgeBuilder`] could not build.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BridgeError {
    /// Two tools of the toolset have the same name.
    #[error("toolset `{toolset}`: the tool name `{tool}` is used twice")]
    DuplicateName {
        /// The toolset.
        toolset: String,
        /// The repeated name.
        tool: String,
    },
    /// A tool name does not match `^[a-zA-Z0-9_-]{1,64}$`.
    #[error(
        "toolset `{toolset}`: `{tool}` is not a valid tool name (1 to 64 of a-z, A-Z, 0-9, `_`, `-`)"
    )]
    InvalidName {
        /// The toolset.
        toolset: String,
        /// The refused name.
        tool: String,
    },
    /// A tool has an empty description; the model would have to guess what it does.
    #[error("toolset `{toolset}`: the tool `{tool}` has no description")]
    EmptyDescription {
        /// The toolset.
        toolset: String,
        /// The tool.
        tool: String,
    },
    /// A tool's argument type gave a schema that cannot be sent or compiled.
    #[error("toolset `{toolset}`: the tool `{tool}` has an unusable parameters schema: {reason}")]
    Schema {
        /// The toolset.
        toolset: String,
        /// The tool.
        tool: String,
        /// What is wrong with the schema.
        reason: String,
    },
    /// A per-tool method (`.risk()`, `.role()`, `.failure_codes()`...) was called before any
    /// tool was added.
    #[error("toolset `{toolset}`: `.{method}()` was called before any tool was added")]
    MetadataWithoutTool {
        /// The toolset.
        toolset: String,
        /// The builder method.
        method: &'static str,
    },
}

/// Whether `name` is a valid wire name, `^[a-zA-Z0-9_-]{1,64}$` (OpenAI's rule; a dot is
/// refused).
pub fn is_valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A type-erased tool function: validated arguments and the context in, a result out.
type Handler = Arc<dyn Fn(Value, ToolContext) -> BoxFuture<'static, ToolResult> + Send + Sync>;

/// One tool of a bridge.
struct BridgeTool {
    spec: ToolSpec,
    handler: Handler,
}

/// A toolset made of typed async functions; see the module docs. Cloning is cheap (shared).
#[derive(Clone)]
pub struct ToolSetBridge {
    name: Arc<str>,
    prompt: Option<Arc<str>>,
    tools: Arc<[BridgeTool]>,
}

impl fmt::Debug for ToolSetBridge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolSetBridge")
            .field("name", &self.name)
            .field(
                "tools",
                &self
                    .tools
                    .iter()
                    .map(|t| t.spec.name.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl ToolSetBridge {
    /// Starts a toolset called `name` (as the config and the catalog know it).
    pub fn builder(name: &str) -> ToolSetBridgeBuilder {
        ToolSetBridgeBuilder {
            name: name.to_owned(),
            prompt: None,
            tools: Vec::new(),
            error: None,
        }
    }
}

#[async_trait]
impl ToolSet for ToolSetBridge {
    fn name(&self) -> &str {
        &self.name
    }

    fn tools(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|t| t.spec.clone()).collect()
    }

    async fn invoke(&self, call: ToolInvocation, cx: ToolContext) -> ToolResult {
        let Some(tool) = self.tools.iter().find(|t| t.spec.name == call.name) else {
            return ToolResult::err(
                codes::TOOL_NOT_FOUND,
                format!("the toolset `{}` has no tool `{}`", self.name, call.name),
            );
        };
        let handler = Arc::clone(&tool.handler);
        // The handler's future runs the user's function; a panic anywhere in it (including
        // the synchronous part before its first await) is caught here and never unwinds into
        // the agent.
        let run = async move { handler(call.arguments, cx).await };
        match AssertUnwindSafe(run).catch_unwind().await {
            Ok(result) => result,
            Err(payload) => {
                tracing::error!(
                    toolset = %self.name,
                    tool = %call.name,
                    call_id = %call.id,
                    panic = %panic_text(payload.as_ref()),
                    "tool panicked"
                );
                ToolResult::err(codes::INTERNAL, PANIC_MESSAGE)
            }
        }
    }

    fn prompt(&self) -> Option<String> {
        self.prompt.as_deref().map(str::to_owned)
    }

    /// Stateless: every session shares this bridge.
    fn fork(&self) -> Arc<dyn ToolSet> {
        Arc::new(self.clone())
    }
}

/// The text of a panic payload (`panic!` gives a `&str` or a `String`).
pub(crate) fn panic_text(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("<non-string panic payload>")
}

/// Reads the arguments into `A`. The registry validated them against the schema already;
/// this is the backstop for what a schema cannot say. An argument-less `A` (`()`, a unit
/// struct) deserializes from `null`, not `{}`, so an empty object is retried as `null`.
fn read_args<A: DeserializeOwned>(schema: &Value, mut args: Value) -> Result<A, String> {
    drop_optional_nulls(schema, &mut args);
    let empty = args.as_object().is_some_and(Map::is_empty);
    match serde_json::from_value::<A>(args) {
        Ok(a) => Ok(a),
        Err(error) => {
            if empty && let Ok(a) = serde_json::from_value::<A>(Value::Null) {
                return Ok(a);
            }
            Err(format!("the arguments could not be read: {error}"))
        }
    }
}

/// A tool being added, before `build()` checks it.
struct PendingTool {
    spec: ToolSpec,
    handler: Handler,
}

/// Builds a [`ToolSetBridge`]: `.prompt()`, then `add_*` per tool, each optionally followed by
/// `.risk()`, `.role()`, `.role_in_chat_arg()`, `.failure_codes()`, `.result_doc()` for that
/// tool, then `.build()`.
#[must_use = "a builder does nothing until `.build()`"]
pub struct ToolSetBridgeBuilder {
    name: String,
    prompt: Option<String>,
    tools: Vec<PendingTool>,
    /// The first misuse of the builder, reported by `build()` (the chain stays infallible).
    error: Option<BridgeError>,
}

impl fmt::Debug for ToolSetBridgeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolSetBridgeBuilder")
            .field("name", &self.name)
            .field(
                "tools",
                &self
                    .tools
                    .iter()
                    .map(|t| t.spec.name.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl ToolSetBridgeBuilder {
    /// The static text appended to the system prompt once (empty means none).
    pub fn prompt(mut self, text: impl Into<String>) -> Self {
        let text = text.into();
        self.prompt = (!text.trim().is_empty()).then_some(text);
        self
    }

    /// Adds a tool `f(args)`.
    pub fn add_function<A, F, Fut, R>(self, name: &str, description: &str, f: F) -> Self
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoToolResult,
    {
        self.add_function_with_context(name, description, move |args: A, _cx: ToolContext| f(args))
    }

    /// Adds a tool `f(args, appender)` that may append messages to the conversation (an
    /// image as a user message, say); they follow this batch's tool results.
    pub fn add_function_with_messages<A, F, Fut, R>(
        self,
        name: &str,
        description: &str,
        f: F,
    ) -> Self
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(A, MessageAppender) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoToolResult,
    {
        self.add_function_with_context(name, description, move |args: A, cx: ToolContext| {
            f(args, cx.appender)
        })
    }

    /// Adds a tool `f(args, cancel)` that watches the call's cancellation token (cancelled by
    /// `/stop`, shutdown, a reset, or the call's timeout) to stop work and clean up.
    pub fn add_function_cancellable<A, F, Fut, R>(self, name: &str, description: &str, f: F) -> Self
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(A, CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoToolResult,
    {
        self.add_function_with_context(name, description, move |args: A, cx: ToolContext| {
            f(args, cx.cancel)
        })
    }

    /// Adds a tool `f(args, context)` seeing the whole [`ToolContext`] (session, caller,
    /// cancellation, appender); the other `add_*` are built on this one.
    pub fn add_function_with_context<A, F, Fut, R>(
        mut self,
        name: &str,
        description: &str,
        f: F,
    ) -> Self
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoToolResult,
    {
        let parameters = schema_for::<A>();
        let schema = Arc::new(parameters.clone());
        let f = Arc::new(f);
        let handler: Handler = Arc::new(move |args: Value, cx: ToolContext| {
            let f = Arc::clone(&f);
            let schema = Arc::clone(&schema);
            Box::pin(async move {
                match read_args::<A>(&schema, args) {
                    Ok(args) => f(args, cx).await.into_tool_result(),
                    Err(message) => ToolResult::err(codes::INVALID_ARGUMENTS, message),
                }
            })
        });
        self.tools.push(PendingTool {
            spec: ToolSpec {
                name: name.to_owned(),
                description: description.to_owned(),
                parameters,
                result: DEFAULT_RESULT_DOC.to_owned(),
                risk: Risk::Read,
                role: Role::Member,
                role_in_chat_arg: None,
                failure_codes: Vec::new(),
            },
            handler,
        });
        self
    }

    /// The risk level of the tool added last (default [`Risk::Read`]).
    pub fn risk(self, risk: Risk) -> Self {
        self.with_last("risk", |spec| spec.risk = risk)
    }

    /// The least role a caller needs for the tool added last (default [`Role::Member`]);
    /// the registry checks it before the call runs.
    pub fn role(self, role: Role) -> Self {
        self.with_last("role", |spec| spec.role = role)
    }

    /// Names the argument of the tool added last that may point the call at another chat (a
    /// session key): the caller must then hold the tool's role there too (see
    /// [`ToolSpec::role_in_chat_arg`]).
    pub fn role_in_chat_arg(self, argument: &str) -> Self {
        self.with_last("role_in_chat_arg", |spec| {
            spec.role_in_chat_arg = Some(argument.to_owned());
        })
    }

    /// The toolset-specific error codes the tool added last may return (besides the shared
    /// ones in [`codes`]).
    pub fn failure_codes(self, failure_codes: &[&str]) -> Self {
        self.with_last("failure_codes", |spec| {
            spec.failure_codes = failure_codes.iter().map(|c| (*c).to_owned()).collect();
        })
    }

    /// One line describing the `data` of a successful result of the tool added last, for
    /// the catalog (default "see message").
    pub fn result_doc(self, doc: &str) -> Self {
        self.with_last("result_doc", |spec| spec.result = doc.to_owned())
    }

    /// Applies `edit` to the last tool's spec, or records the misuse for `build()`.
    fn with_last(mut self, method: &'static str, edit: impl FnOnce(&mut ToolSpec)) -> Self {
        match self.tools.last_mut() {
            Some(tool) => edit(&mut tool.spec),
            None => {
                if self.error.is_none() {
                    self.error = Some(BridgeError::MetadataWithoutTool {
                        toolset: self.name.clone(),
                        method,
                    });
                }
            }
        }
        self
    }

    /// Checks every tool (valid and unique name, a description, a self-contained schema that
    /// compiles) and builds the toolset.
    pub fn build(self) -> Result<ToolSetBridge, BridgeError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let toolset = &self.name;
        for (index, tool) in self.tools.iter().enumerate() {
            let spec = &tool.spec;
            let tool_name = || spec.name.clone();
            if !is_valid_tool_name(&spec.name) {
                return Err(BridgeError::InvalidName {
                    toolset: toolset.clone(),
                    tool: tool_name(),
                });
            }
            if self.tools[..index].iter().any(|t| t.spec.name == spec.name) {
                return Err(BridgeError::DuplicateName {
                    toolset: toolset.clone(),
                    tool: tool_name(),
                });
            }
            if spec.description.trim().is_empty() {
                return Err(BridgeError::EmptyDescription {
                    toolset: toolset.clone(),
                    tool: tool_name(),
                });
            }
            let schema_problem = check_schema(&spec.parameters).err().or_else(|| {
                ArgValidator::new(&spec.parameters)
                    .err()
                    .map(|e| e.to_string())
            });
            if let Some(reason) = schema_problem {
                return Err(BridgeError::Schema {
                    toolset: toolset.clone(),
                    tool: tool_name(),
                    reason,
                });
            }
        }
        let tools: Vec<BridgeTool> = self
            .tools
            .into_iter()
            .map(|t| BridgeTool {
                spec: t.spec,
                handler: t.handler,
            })
            .collect();
        Ok(ToolSetBridge {
            name: self.name.into(),
            prompt: self.prompt.map(Into::into),
            tools: tools.into(),
        })
    }
}
