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
//! The argument type `A` ([`ToolArgs`]: `DeserializeOwned + JsonSchema`) gives the tool's
//! schema through [`schema_for`]; the function returns a future ([`ToolFuture`]) of anything
//! [`IntoToolResult`]: a [`ToolResult`], or a `Result<T: Serialize, E: Into<ToolError>>`.
//!
//! Per-tool metadata (`.risk`, `.role`, `.role_in_chat_arg`, `.failure_codes`,
//! `.result_doc`) is chained on the same
//! builder and applies to the tool added last: it keeps one flat chain per toolset, without
//! a sub-builder to finish. Calling one before any tool is added is reported by `build()`.
//!
//! **State.** A bridge from [`ToolSetBridge::builder`] is stateless: `fork()` shares it,
//! `reset()` does nothing, and what a tool needs lives in what its closure captures. A toolset
//! with state starts from [`ToolSetBridge::builder_with_state`]: its tools
//! ([`add_function_with_state`](ToolSetBridgeBuilder::add_function_with_state)) get the state
//! with every call, and so do the toolset's hooks, the rest of the [`ToolSet`] contract:
//!
//! - `.fork_state(f)`: each fork (a new session) gets its own state `f(&parent)`: the
//!   per-session part fresh, the configuration shared. Without it every fork shares one state
//!   (one kept in the store, by session).
//! - `.injection(f)`: the text prepended to a turn's user message in a session
//!   ([`ToolSet::iteration_prompt_injection`]).
//! - `.on_reset(f)`: what `/reset` of a session forgets ([`ToolSet::reset`]).
//! - `.holds_session_state(f)`: whether the state lives only in memory
//!   ([`ToolSet::holds_session_state`]).
//! - `.before_call(f)`: a check every call passes before its arguments are read (the
//!   terminal's "is it open in this chat"); never a role check, roles are the specs'.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use parlor_bot::tool::bridge::{BridgeError, ToolError, ToolSetBridge};
//! use parlor_bot::tool::{ToolContext, ToolSet};
//!
//! /// Arguments of `tally_add` (none).
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Nothing {}
//!
//! let tally = ToolSetBridge::builder_with_state("tally", Arc::new(AtomicUsize::new(0)))
//!     .add_function_with_state("tally_add", "Counts one more.", |count, _: Nothing, _cx: ToolContext| async move {
//!         Ok::<_, ToolError>(count.fetch_add(1, Ordering::Relaxed) + 1)
//!     })
//!     .fork_state(|_| AtomicUsize::new(0))
//!     .injection(|count, _session| match count.load(Ordering::Relaxed) {
//!         0 => None,
//!         n => Some(format!("<TALLY>{n} so far</TALLY>")),
//!     })
//!     .on_reset(|count, _session| count.store(0, Ordering::Relaxed))
//!     .holds_session_state(|count| count.load(Ordering::Relaxed) > 0)
//!     .build()?;
//! assert_eq!(tally.fork().iteration_prompt_injection("console:local"), None);
//! # Ok::<(), BridgeError>(())
//! ```
//!
//! A toolset type of its own (constructors, accessors) holds its bridge and implements
//! [`Bridged`]; that gives it [`ToolSet`].
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
use super::schema::{check_parameters, schema_for};
use super::validate::{ArgumentsError, drop_optional_nulls};
use super::{MessageAppender, Offer, Risk, Role, ToolContext, ToolInvocation, ToolSet, ToolSpec};

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

/// An argument type of a tool: read from the call's JSON, its schema from [`schema_for`].
pub trait ToolArgs: DeserializeOwned + JsonSchema + Send + 'static {}

impl<T: DeserializeOwned + JsonSchema + Send + 'static> ToolArgs for T {}

/// What a tool function returns: a future of anything [`IntoToolResult`].
pub trait ToolFuture: Future<Output: IntoToolResult> + Send + 'static {}

impl<T: Future<Output: IntoToolResult> + Send + 'static> ToolFuture for T {}

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

/// One constructor per shared code: `ToolError::timeout(message)` is
/// `ToolError::new(codes::TIMEOUT, message)`.
macro_rules! shared_code_constructors {
    ($($(#[$doc:meta])* $name:ident => $code:ident,)*) => {
        $(
            $(#[$doc])*
            pub fn $name(message: impl Into<String>) -> Self {
                Self::new(codes::$code, message)
            }
        )*
    };
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

    shared_code_constructors! {
        /// `INVALID_ARGUMENTS`: the arguments fit the schema but not the situation.
        invalid_arguments => INVALID_ARGUMENTS,
        /// `PERMISSION_DENIED`: this caller may not do this here.
        permission_denied => PERMISSION_DENIED,
        /// `UNAVAILABLE`: something the tool needs is unreachable.
        unavailable => UNAVAILABLE,
        /// `TIMEOUT`: the work took too long.
        timeout => TIMEOUT,
        /// `CANCELLED`: the turn was stopped.
        cancelled => CANCELLED,
        /// `RATE_LIMITED`: too many calls; try later.
        rate_limited => RATE_LIMITED,
        /// `INTERNAL`: a failure the model cannot fix. Say so in general terms and log the
        /// details yourself; the message reaches the model.
        internal => INTERNAL,
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

/// A type-erased tool function of a toolset with state `S`: the state, the validated
/// arguments and the context in, a result out.
type Handler<S> =
    Arc<dyn Fn(Arc<S>, Value, ToolContext) -> BoxFuture<'static, ToolResult> + Send + Sync>;

/// Reads arguments into a tool's argument type and drops the result: what [`Handler`] does
/// before it calls the function, without calling it.
type Reader = Arc<dyn Fn(Value) -> Result<(), ArgumentsError> + Send + Sync>;

/// The hooks of a toolset with state `S` (see the module docs), boxed.
type ForkHook<S> = Box<dyn Fn(&S) -> S + Send + Sync>;
type CheckHook<S> = Box<dyn Fn(&S, &ToolContext) -> Result<(), ToolError> + Send + Sync>;
type InjectionHook<S> = Box<dyn Fn(&S, &str) -> Option<String> + Send + Sync>;
type ResetHook<S> = Box<dyn Fn(&S, &str) + Send + Sync>;
type HoldsHook<S> = Box<dyn Fn(&S) -> bool + Send + Sync>;

/// The toolset-wide hooks; each absent one does what [`ToolSet`]'s default does.
struct Hooks<S> {
    fork: Option<ForkHook<S>>,
    before_call: Option<CheckHook<S>>,
    injection: Option<InjectionHook<S>>,
    reset: Option<ResetHook<S>>,
    holds_session_state: Option<HoldsHook<S>>,
}

impl<S> Default for Hooks<S> {
    fn default() -> Self {
        Hooks {
            fork: None,
            before_call: None,
            injection: None,
            reset: None,
            holds_session_state: None,
        }
    }
}

/// What every fork of a bridge shares: the tool functions (in the order of its specs) and
/// the hooks.
struct Definition<S> {
    handlers: Vec<Handler<S>>,
    hooks: Hooks<S>,
}

/// One fork's state with the tools and hooks bound to it.
struct Bound<S> {
    state: Arc<S>,
    definition: Arc<Definition<S>>,
}

/// [`Bound`] with its state type erased, so that a [`ToolSetBridge`] is one type whatever
/// its state.
trait Session: Send + Sync {
    /// Runs the tool at `tool` (an index into the bridge's specs).
    fn call(
        &self,
        tool: usize,
        arguments: Value,
        cx: ToolContext,
    ) -> BoxFuture<'static, ToolResult>;
    fn injection(&self, session: &str) -> Option<String>;
    fn reset(&self, session: &str);
    fn holds_session_state(&self) -> bool;
    fn fork(&self) -> Arc<dyn Session>;
}

impl<S: Send + Sync + 'static> Session for Bound<S> {
    fn call(
        &self,
        tool: usize,
        arguments: Value,
        cx: ToolContext,
    ) -> BoxFuture<'static, ToolResult> {
        let hooks = &self.definition.hooks;
        if let Some(check) = &hooks.before_call
            && let Err(refused) = check(&self.state, &cx)
        {
            return Box::pin(std::future::ready(refused.into()));
        }
        // `build()` makes the specs and the handlers from one list: an index of one is an
        // index of the other.
        (self.definition.handlers[tool])(Arc::clone(&self.state), arguments, cx)
    }

    fn injection(&self, session: &str) -> Option<String> {
        let injection = self.definition.hooks.injection.as_ref()?;
        injection(&self.state, session)
    }

    fn reset(&self, session: &str) {
        if let Some(reset) = &self.definition.hooks.reset {
            reset(&self.state, session);
        }
    }

    fn holds_session_state(&self) -> bool {
        self.definition
            .hooks
            .holds_session_state
            .as_ref()
            .is_some_and(|holds| holds(&self.state))
    }

    fn fork(&self) -> Arc<dyn Session> {
        let state = match &self.definition.hooks.fork {
            Some(fork) => Arc::new(fork(&self.state)),
            None => Arc::clone(&self.state),
        };
        Arc::new(Bound {
            state,
            definition: Arc::clone(&self.definition),
        })
    }
}

/// A toolset made of typed async functions; see the module docs. Cloning is cheap and
/// shares the state; [`ToolSet::fork`] is what gives a session its own.
#[derive(Clone)]
pub struct ToolSetBridge {
    name: Arc<str>,
    prompt: Option<Arc<str>>,
    /// The same for every fork.
    specs: Arc<[ToolSpec]>,
    /// One per spec, in the same order (see [`ToolSetBridge::read_arguments`]).
    readers: Arc<[Reader]>,
    /// This fork's state and what uses it.
    session: Arc<dyn Session>,
}

impl fmt::Debug for ToolSetBridge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolSetBridge")
            .field("name", &self.name)
            .field(
                "tools",
                &self
                    .specs
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl ToolSetBridge {
    /// Starts a stateless toolset called `name` (as the config and the catalog know it).
    pub fn builder(name: &str) -> ToolSetBridgeBuilder {
        Self::builder_with_state(name, Arc::new(()))
    }

    /// Whether `arguments` read into the argument type of the tool `tool`, exactly as a call
    /// would read them, without running the tool; `None` when there is no such tool. Every
    /// value the tool's schema accepts should read (the schema is made from that type): this
    /// is how tests and the fuzz targets check that the two agree.
    ///
    /// # Errors
    /// The message a call would answer with (`invalid_arguments`).
    pub fn read_arguments(
        &self,
        tool: &str,
        arguments: Value,
    ) -> Option<Result<(), ArgumentsError>> {
        let index = self.specs.iter().position(|s| s.name == tool)?;
        self.readers.get(index).map(|read| read(arguments))
    }

    /// Starts a toolset called `name` whose tools and hooks share `state` (see the module
    /// docs).
    pub fn builder_with_state<S: Send + Sync + 'static>(
        name: &str,
        state: Arc<S>,
    ) -> ToolSetBridgeBuilder<S> {
        ToolSetBridgeBuilder {
            name: name.to_owned(),
            prompt: None,
            state,
            tools: Vec::new(),
            hooks: Hooks::default(),
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
        self.specs.to_vec()
    }

    async fn invoke(&self, call: ToolInvocation, cx: ToolContext) -> ToolResult {
        let Some(tool) = self.specs.iter().position(|s| s.name == call.name) else {
            return ToolResult::err(
                codes::TOOL_NOT_FOUND,
                format!("the toolset `{}` has no tool `{}`", self.name, call.name),
            );
        };
        let session = Arc::clone(&self.session);
        let arguments = call.arguments;
        // Everything of the toolset's own (the check before the call, the user's function
        // and the synchronous part before its first await) runs inside this future, so a
        // panic anywhere in it is caught here and never unwinds into the agent.
        let run = async move { session.call(tool, arguments, cx).await };
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

    fn iteration_prompt_injection(&self, session: &str) -> Option<String> {
        self.session.injection(session)
    }

    /// The specs are shared; the state is this one's, or its own with `.fork_state`.
    fn fork(&self) -> Arc<dyn ToolSet> {
        Arc::new(ToolSetBridge {
            session: self.session.fork(),
            ..self.clone()
        })
    }

    fn reset(&self, session: &str) {
        self.session.reset(session);
    }

    fn holds_session_state(&self) -> bool {
        self.session.holds_session_state()
    }
}

/// A toolset type of its own (with constructors and accessors) whose tools are a
/// [`ToolSetBridge`] it holds: implementing [`Bridged::bridge`] gives it [`ToolSet`], every
/// method answered by that bridge.
pub trait Bridged: Send + Sync {
    /// The bridge behind this toolset.
    fn bridge(&self) -> &ToolSetBridge;
}

#[async_trait]
impl<T: Bridged> ToolSet for T {
    fn name(&self) -> &str {
        self.bridge().name()
    }

    fn tools(&self) -> Vec<ToolSpec> {
        self.bridge().tools()
    }

    async fn invoke(&self, call: ToolInvocation, cx: ToolContext) -> ToolResult {
        self.bridge().invoke(call, cx).await
    }

    fn prompt(&self) -> Option<String> {
        self.bridge().prompt()
    }

    fn iteration_prompt_injection(&self, session: &str) -> Option<String> {
        self.bridge().iteration_prompt_injection(session)
    }

    fn fork(&self) -> Arc<dyn ToolSet> {
        self.bridge().fork()
    }

    fn reset(&self, session: &str) {
        self.bridge().reset(session);
    }

    fn holds_session_state(&self) -> bool {
        self.bridge().holds_session_state()
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
fn read_args<A: DeserializeOwned>(schema: &Value, mut args: Value) -> Result<A, ArgumentsError> {
    drop_optional_nulls(schema, &mut args);
    let empty = args.as_object().is_some_and(Map::is_empty);
    match A::deserialize(&args) {
        Ok(a) => Ok(a),
        Err(error) => {
            if empty && let Ok(a) = serde_json::from_value::<A>(Value::Null) {
                return Ok(a);
            }
            // JSON Schema (and a model) takes `3.0` for the integer 3; serde does not.
            if let Some(fixed) = integral_floats_as_integers(&args)
                && let Ok(a) = A::deserialize(&fixed)
            {
                return Ok(a);
            }
            Err(ArgumentsError::Unreadable(format!(
                "the arguments could not be read: {error}"
            )))
        }
    }
}

/// `value` with every float that is a whole number in the range of `i64` or `u64` written
/// as that integer; `None` when there is none.
fn integral_floats_as_integers(value: &Value) -> Option<Value> {
    fn fix(value: &mut Value) -> bool {
        match value {
            Value::Number(n) if n.is_f64() => {
                let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0) else {
                    return false;
                };
                // 2^63 and 2^64 are exact in f64; the casts below are exact inside them.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let integer: Option<Value> =
                    if (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&f) {
                        Some((f as i64).into())
                    } else if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                        Some((f as u64).into())
                    } else {
                        None
                    };
                match integer {
                    Some(i) => {
                        *value = i;
                        true
                    }
                    None => false,
                }
            }
            Value::Array(items) => items.iter_mut().fold(false, |any, v| fix(v) | any),
            Value::Object(map) => map.values_mut().fold(false, |any, v| fix(v) | any),
            _ => false,
        }
    }
    let mut copy = value.clone();
    fix(&mut copy).then_some(copy)
}

/// A tool being added, before `build()` checks it.
struct PendingTool<S> {
    spec: ToolSpec,
    handler: Handler<S>,
    reader: Reader,
}

/// Builds a [`ToolSetBridge`]: `.prompt()` and the hooks, then `add_*` per tool, each
/// optionally followed by `.risk()`, `.role()`, `.role_in_chat_arg()`, `.failure_codes()`,
/// `.result_doc()` for that tool, then `.build()`. `S` is the state of
/// [`ToolSetBridge::builder_with_state`], `()` for a stateless toolset.
#[must_use = "a builder does nothing until `.build()`"]
pub struct ToolSetBridgeBuilder<S = ()> {
    name: String,
    prompt: Option<String>,
    /// The state of the bridge `build()` returns (forks make their own from it).
    state: Arc<S>,
    tools: Vec<PendingTool<S>>,
    hooks: Hooks<S>,
    /// The first misuse of the builder, reported by `build()` (the chain stays infallible).
    error: Option<BridgeError>,
}

impl<S> fmt::Debug for ToolSetBridgeBuilder<S> {
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

impl<S: Send + Sync + 'static> ToolSetBridgeBuilder<S> {
    /// The static text appended to the system prompt once (empty means none).
    pub fn prompt(mut self, text: impl Into<String>) -> Self {
        let text = text.into();
        self.prompt = (!text.trim().is_empty()).then_some(text);
        self
    }

    /// Adds a tool `f(args)`.
    pub fn add_function<A: ToolArgs, Fut: ToolFuture>(
        self,
        name: &str,
        description: &str,
        f: impl Fn(A) -> Fut + Send + Sync + 'static,
    ) -> Self {
        self.add_function_with_context(name, description, move |args: A, _| f(args))
    }

    /// Adds a tool `f(args, appender)` that may append messages to the conversation (an
    /// image as a user message, say); they follow this batch's tool results.
    pub fn add_function_with_messages<A: ToolArgs, Fut: ToolFuture>(
        self,
        name: &str,
        description: &str,
        f: impl Fn(A, MessageAppender) -> Fut + Send + Sync + 'static,
    ) -> Self {
        self.add_function_with_context(name, description, move |args: A, cx| f(args, cx.appender))
    }

    /// Adds a tool `f(args, cancel)` that watches the call's cancellation token (cancelled by
    /// `/stop`, shutdown, a reset, or the call's timeout) to stop work and clean up.
    pub fn add_function_cancellable<A: ToolArgs, Fut: ToolFuture>(
        self,
        name: &str,
        description: &str,
        f: impl Fn(A, CancellationToken) -> Fut + Send + Sync + 'static,
    ) -> Self {
        self.add_function_with_context(name, description, move |args: A, cx| f(args, cx.cancel))
    }

    /// Adds a tool `f(args, context)` seeing the whole [`ToolContext`] (session, caller,
    /// cancellation, appender).
    pub fn add_function_with_context<A: ToolArgs, Fut: ToolFuture>(
        self,
        name: &str,
        description: &str,
        f: impl Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
    ) -> Self {
        self.add_function_with_state(name, description, move |_, args: A, cx| f(args, cx))
    }

    /// Adds a tool `f(state, args, context)`: the toolset's state (this fork's, see
    /// [`ToolSetBridge::builder_with_state`]) and the whole [`ToolContext`]. The other
    /// `add_*` are built on this one.
    pub fn add_function_with_state<A: ToolArgs, Fut: ToolFuture>(
        mut self,
        name: &str,
        description: &str,
        f: impl Fn(Arc<S>, A, ToolContext) -> Fut + Send + Sync + 'static,
    ) -> Self {
        let parameters = schema_for::<A>();
        let schema = Arc::new(parameters.clone());
        let reader: Reader = {
            let schema = Arc::clone(&schema);
            Arc::new(move |args: Value| read_args::<A>(&schema, args).map(drop))
        };
        let f = Arc::new(f);
        let handler: Handler<S> = Arc::new(move |state: Arc<S>, args: Value, cx: ToolContext| {
            let f = Arc::clone(&f);
            let schema = Arc::clone(&schema);
            Box::pin(async move {
                match read_args::<A>(&schema, args) {
                    Ok(args) => f(state, args, cx).await.into_tool_result(),
                    Err(refused) => ToolResult::err(codes::INVALID_ARGUMENTS, refused.to_string()),
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
                offer: Default::default(),
            },
            handler,
            reader,
        });
        self
    }

    /// Gives each fork (a new session) its own state, `fresh(&parent)`: the per-session
    /// part new, the configuration shared. Without it every fork shares one state.
    pub fn fork_state(mut self, fresh: impl Fn(&S) -> S + Send + Sync + 'static) -> Self {
        self.hooks.fork = Some(Box::new(fresh));
        self
    }

    /// A check every call of this toolset passes before its arguments are read; an `Err` is
    /// the call's result. For whether the toolset is open at all (a switched-off terminal),
    /// never for roles: those are each tool's `.role()`, checked by the registry.
    pub fn before_call(
        mut self,
        check: impl Fn(&S, &ToolContext) -> Result<(), ToolError> + Send + Sync + 'static,
    ) -> Self {
        self.hooks.before_call = Some(Box::new(check));
        self
    }

    /// The per-turn text: `injection(state, session)` is prepended to the user message of
    /// the turn about to start in `session`, and persisted with it
    /// ([`ToolSet::iteration_prompt_injection`]).
    pub fn injection(
        mut self,
        injection: impl Fn(&S, &str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.hooks.injection = Some(Box::new(injection));
        self
    }

    /// What `/reset` of a session does to the state: `reset(state, session)`
    /// ([`ToolSet::reset`]).
    pub fn on_reset(mut self, reset: impl Fn(&S, &str) + Send + Sync + 'static) -> Self {
        self.hooks.reset = Some(Box::new(reset));
        self
    }

    /// Whether this fork's state lives only in memory, so that its idle session must stay
    /// loaded ([`ToolSet::holds_session_state`]; without the hook, no).
    pub fn holds_session_state(
        mut self,
        holds: impl Fn(&S) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.hooks.holds_session_state = Some(Box::new(holds));
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

    /// Which turns offer the tool added last (default [`Offer::Always`]); the registry
    /// leaves it out of the others.
    pub fn offer(self, offer: Offer) -> Self {
        self.with_last("offer", |spec| spec.offer = offer)
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
            // Not compiled here: the registry compiles a schema at the tool's first call
            // (`ArgValidator::lazy`); every built-in schema is compiled by a test
            // (`src/wiring.rs`).
            let schema_problem = check_parameters(&spec.parameters)
                .err()
                .map(|unfit| unfit.to_string());
            if let Some(reason) = schema_problem {
                return Err(BridgeError::Schema {
                    toolset: toolset.clone(),
                    tool: tool_name(),
                    reason,
                });
            }
        }
        let mut specs = Vec::with_capacity(self.tools.len());
        let mut handlers = Vec::with_capacity(self.tools.len());
        let mut readers = Vec::with_capacity(self.tools.len());
        for tool in self.tools {
            specs.push(tool.spec);
            handlers.push(tool.handler);
            readers.push(tool.reader);
        }
        Ok(ToolSetBridge {
            name: self.name.into(),
            prompt: self.prompt.map(Into::into),
            specs: specs.into(),
            readers: readers.into(),
            session: Arc::new(Bound {
                state: self.state,
                definition: Arc::new(Definition {
                    handlers,
                    hooks: self.hooks,
                }),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::tool::validate::ArgValidator;

    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    /// Arguments of `tick` (none).
    #[derive(Deserialize, JsonSchema)]
    struct Nothing {}

    /// Arguments of `say`.
    #[derive(Deserialize, JsonSchema)]
    struct Say {
        /// A word.
        word: String,
    }

    /// A per-fork counter behind a shared configuration (the label).
    struct Counter {
        label: String,
        count: AtomicUsize,
    }

    fn counter(fork_state: bool) -> ToolSetBridge {
        let state = Arc::new(Counter {
            label: "ticks".to_owned(),
            count: AtomicUsize::new(0),
        });
        let builder = ToolSetBridge::builder_with_state("counter", state)
            .prompt("Count with tick.")
            .add_function_with_state(
                "tick",
                "Counts one.",
                |c: Arc<Counter>, _: Nothing, _| async move {
                    Ok::<_, ToolError>(c.count.fetch_add(1, Ordering::SeqCst) + 1)
                },
            )
            .add_function("say", "Says a word.", |args: Say| async move {
                Ok::<_, ToolError>(args.word)
            })
            .injection(|c, session| match c.count.load(Ordering::SeqCst) {
                0 => None,
                n => Some(format!("{session}: {n} {}", c.label)),
            })
            .on_reset(|c, _| c.count.store(0, Ordering::SeqCst))
            .holds_session_state(|c| c.count.load(Ordering::SeqCst) > 0);
        let builder = if fork_state {
            builder.fork_state(|parent| Counter {
                label: parent.label.clone(),
                count: AtomicUsize::new(0),
            })
        } else {
            builder
        };
        builder.build().expect("valid")
    }

    fn call(name: &str, arguments: Value) -> ToolInvocation {
        ToolInvocation {
            id: "c1".to_owned(),
            name: name.to_owned(),
            arguments,
        }
    }

    async fn tick(tools: &dyn ToolSet) -> ToolResult {
        tools
            .invoke(call("tick", json!({})), ToolContext::default())
            .await
    }

    /// Arguments of `wait`.
    #[derive(Deserialize, JsonSchema)]
    struct Wait {
        /// Seconds.
        timeout_secs: Option<u64>,
        /// A count.
        count: Option<u32>,
    }

    /// Found by the `tool_args` fuzz target: the terminal's `shell` schema accepted
    /// `"timeout_secs": 1e+300` (JSON Schema calls any whole number an integer), which no
    /// `u64` holds, and `3.0`, which serde refuses for one. Now the first is refused by the
    /// schema and the second reads as 3; whatever the validator accepts reads.
    #[test]
    fn what_the_schema_accepts_for_an_integer_reads() {
        let tools = ToolSetBridge::builder("waiter")
            .add_function("wait", "Waits.", |w: Wait| async move {
                Ok::<_, ToolError>(w.timeout_secs.map(|t| t / 2) > w.count.map(u64::from))
            })
            .build()
            .expect("valid");
        let spec = &tools.tools()[0];
        let validator = ArgValidator::new(&spec.parameters).expect("compiles");
        for (args, accepted) in [
            (json!({"timeout_secs": 1e300}), false),
            (json!({"timeout_secs": 18_446_744_073_709_551_616.0}), false),
            (json!({"timeout_secs": -1}), false),
            (json!({"count": 4_294_967_296u64}), false),
            (
                json!({"timeout_secs": 3.0, "count": 4_294_967_295u64}),
                true,
            ),
            (json!({"timeout_secs": 18_446_744_073_709_551_615u64}), true),
            (json!({"timeout_secs": 1e19}), true),
            (json!({"count": 0.0}), true),
        ] {
            assert_eq!(validator.validate(&args).is_ok(), accepted, "{args}");
            if accepted {
                assert_eq!(
                    tools.read_arguments("wait", args.clone()),
                    Some(Ok(())),
                    "{args}"
                );
            }
        }
    }

    #[test]
    fn read_arguments_reads_as_a_call_would_without_running_the_tool() {
        let tools = counter(false);
        assert_eq!(
            tools.read_arguments("say", json!({"word": "hi"})),
            Some(Ok(()))
        );
        assert_eq!(tools.read_arguments("tick", json!({})), Some(Ok(())));
        let refused = tools.read_arguments("say", json!({"word": 1}));
        assert!(
            refused
                .as_ref()
                .is_some_and(|r| r.as_ref().is_err_and(|e| e.contains("could not be read"))),
            "{refused:?}"
        );
        assert_eq!(tools.read_arguments("missing", json!({})), None);
        // Nothing ran.
        assert!(!tools.holds_session_state());
    }

    #[tokio::test]
    async fn each_fork_has_its_own_state_and_the_hooks_see_it() {
        let root = counter(true);
        let one = root.fork();
        let two = root.fork();
        assert_eq!(tick(&*one).await.data, Some(json!(1)));
        assert_eq!(tick(&*one).await.data, Some(json!(2)));
        assert_eq!(
            one.iteration_prompt_injection("s").as_deref(),
            Some("s: 2 ticks")
        );
        assert!(one.holds_session_state());
        assert_eq!(two.iteration_prompt_injection("s"), None);
        assert!(!two.holds_session_state());
        assert!(!root.holds_session_state());
        assert_eq!(one.fork().iteration_prompt_injection("s"), None);

        one.reset("s");
        assert_eq!(one.iteration_prompt_injection("s"), None);
        assert!(!one.holds_session_state());
        assert_eq!(one.prompt().as_deref(), Some("Count with tick."));
        assert_eq!(one.tools(), root.tools());
    }

    #[tokio::test]
    async fn without_fork_state_every_fork_shares_the_state() {
        let root = counter(false);
        tick(&*root.fork()).await;
        tick(&*root.fork()).await;
        assert_eq!(
            root.iteration_prompt_injection("s").as_deref(),
            Some("s: 2 ticks")
        );
    }

    #[tokio::test]
    async fn the_check_before_a_call_runs_before_its_arguments_are_read() {
        let checked = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&checked);
        let closed = ToolSetBridge::builder_with_state("closed", Arc::new(()))
            .before_call(move |(), cx| {
                seen.fetch_add(1, Ordering::SeqCst);
                match cx.session.as_str() {
                    "open" => Ok(()),
                    _ => Err(ToolError::unavailable("closed here")),
                }
            })
            .add_function("say", "Says a word.", |args: Say| async move {
                Ok::<_, ToolError>(args.word)
            })
            .build()
            .expect("valid");
        let refused = closed
            .invoke(call("say", json!({"word": 5})), ToolContext::default())
            .await;
        assert_eq!(
            refused.to_json(),
            r#"{"success":false,"error_code":"UNAVAILABLE","message":"closed here"}"#
        );
        let open = ToolContext {
            session: "open".to_owned(),
            ..ToolContext::default()
        };
        let said = closed
            .invoke(call("say", json!({"word": "hi"})), open)
            .await;
        assert_eq!(said.message, "hi");
        let unknown = closed
            .invoke(call("nope", json!({})), ToolContext::default())
            .await;
        assert_eq!(unknown.code(), Some(codes::TOOL_NOT_FOUND));
        assert_eq!(
            checked.load(Ordering::SeqCst),
            2,
            "an unknown tool is not checked"
        );
    }

    #[tokio::test]
    async fn a_panicking_check_is_caught_like_a_panicking_tool() {
        let tools = ToolSetBridge::builder("panics")
            .before_call(|(), _| panic!("check broke"))
            .add_function("say", "Says a word.", |args: Say| async move {
                Ok::<_, ToolError>(args.word)
            })
            .build()
            .expect("valid");
        let result = tools
            .invoke(call("say", json!({"word": "hi"})), ToolContext::default())
            .await;
        assert_eq!(result.code(), Some(codes::INTERNAL));
        assert_eq!(result.message, PANIC_MESSAGE);
    }

    /// A toolset type of its own, with an accessor, over a bridge.
    struct Named {
        label: &'static str,
        bridge: ToolSetBridge,
    }

    impl Bridged for Named {
        fn bridge(&self) -> &ToolSetBridge {
            &self.bridge
        }
    }

    #[tokio::test]
    async fn a_bridged_type_is_its_bridge_as_a_toolset() {
        let named = Named {
            label: "mine",
            bridge: counter(true),
        };
        assert_eq!(named.label, "mine");
        assert_eq!(named.name(), "counter");
        assert_eq!(named.tools(), named.bridge.tools());
        assert_eq!(named.prompt().as_deref(), Some("Count with tick."));
        assert_eq!(tick(&named).await.data, Some(json!(1)));
        assert_eq!(
            named.iteration_prompt_injection("s").as_deref(),
            Some("s: 1 ticks")
        );
        assert!(named.holds_session_state());
        assert!(!named.fork().holds_session_state());
        named.reset("s");
        assert!(!named.holds_session_state());
    }
}
