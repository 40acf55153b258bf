//! The agent loop (docs/contract.md, "A turn"): assembles the prompt from the three paths, calls the model
//! while it asks for tools, runs each batch of tool calls concurrently but bounded, and
//! returns the turn whole.
//!
//! Invariants the loop keeps, whatever happens:
//! - every assistant `tool_calls` entry is followed by exactly one tool message per call, in
//!   call order (a cancelled or timed-out call still gets a `CANCELLED` / `TIMEOUT` result);
//! - a turn is returned whole ([`Turn`]) or not at all ([`AgentError`]); the caller stores it
//!   in one write, so history never holds half a turn;
//! - a tool's failure never aborts the turn: it is a result the model reads;
//! - no request carries an image reference ([`ContentPart::ImageRef`]): references of the
//!   current turn become `data:` URLs, older ones a line of text (see [`images`]).

mod events;
pub mod images;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::llm::{
    ChatRequest, Content, ContentPart, LlmBackend, LlmError, Message, ToolCall, ToolChoice, Usage,
};
use crate::platform::{ChatRef, Platform};
use crate::tool::{Caller, MessageAppender, ToolContext, ToolRegistry, ToolResult, codes};

pub use events::{AgentEvent, AgentObserver, TracingObserver};
pub use images::{ImageOptions, strip_image_data};

/// Limits and model settings of the loop. Defaults follow docs/contract.md, "A turn".
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// Model name sent with every request.
    pub model: String,
    /// Most LLM calls in one turn; past it the turn ends with a message saying so.
    pub max_iterations: usize,
    /// Most tool calls of one response running at the same time.
    pub max_concurrent_tool_calls: usize,
    /// Longest a single tool call may run before it answers `TIMEOUT`.
    pub tool_timeout: Duration,
    /// Longest tool result, in characters, kept in the conversation.
    pub tool_result_max_chars: usize,
    /// Sampling temperature; provider default when `None`.
    pub temperature: Option<f32>,
    /// Whether the model may call several tools in one response.
    pub parallel_tool_calls: bool,
    /// Whether and how attached images are shown to the model.
    pub images: ImageOptions,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            model: "gpt-4o-mini".to_owned(),
            max_iterations: 10,
            max_concurrent_tool_calls: 4,
            tool_timeout: Duration::from_secs(60),
            tool_result_max_chars: 8000,
            temperature: None,
            parallel_tool_calls: true,
            images: ImageOptions::default(),
        }
    }
}

/// What starts a turn: the input, who gave it, and where.
#[derive(Clone)]
pub struct TurnInput {
    /// Session key (`telegram:-100123`, `console:local`).
    pub session: String,
    /// Who is speaking; decides what tools they may use.
    pub caller: Caller,
    /// The user's text, or text and images.
    pub content: Content,
    /// The chat the turn runs in, handed to tools; `None` outside a chat.
    pub chat: Option<ChatRef>,
    /// The chat's platform, handed to tools; `None` outside a chat.
    pub platform: Option<Arc<dyn Platform>>,
    /// Resolves roles in other chats, handed to tools; `None` outside the daemon.
    pub roles: Option<Arc<dyn crate::tool::RoleResolver>>,
}

impl std::fmt::Debug for TurnInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnInput")
            .field("session", &self.session)
            .field("caller", &self.caller)
            .field("content", &self.content)
            .field("chat", &self.chat)
            .finish_non_exhaustive()
    }
}

impl TurnInput {
    /// A plain-text input outside any chat.
    pub fn text(session: impl Into<String>, caller: Caller, text: impl Into<String>) -> Self {
        TurnInput {
            session: session.into(),
            caller,
            content: Content::Text(text.into()),
            chat: None,
            platform: None,
            roles: None,
        }
    }
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    /// The model answered without asking for more tools.
    Answered,
    /// The model kept calling tools until `max_iterations`.
    IterationLimit,
    /// The turn was cancelled (`/stop`, shutdown, reset).
    Cancelled,
}

/// A finished turn, to be appended to history in one write.
#[derive(Debug, Clone)]
pub struct Turn {
    /// New messages, in order: the user message (with injections), then assistant and tool
    /// messages, ending with the final assistant message unless cancelled.
    pub messages: Vec<Message>,
    /// The text to send to the chat; empty when cancelled before any answer.
    pub reply: String,
    /// Tokens used by every LLM call of the turn.
    pub usage: Usage,
    /// LLM calls made.
    pub iterations: usize,
    /// How the turn ended.
    pub end: TurnEnd,
}

/// Why a turn produced nothing to store.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The model could not be reached or answered garbage, after retries.
    #[error(transparent)]
    Llm(#[from] LlmError),
}

/// An agent: a model, a registry of tools and the system prompt built from them.
///
/// One `Agent` serves one session; [`Agent::fork`] makes the next session's copy with its
/// own toolset state.
#[derive(Clone)]
pub struct Agent {
    llm: Arc<dyn LlmBackend>,
    tools: ToolRegistry,
    config: AgentConfig,
    /// Base prompt plus every toolset's static prompt, fixed at construction so that the
    /// provider's prompt cache keeps hitting.
    system_prompt: Arc<str>,
    observer: Arc<dyn AgentObserver>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("tools", &self.tools)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Builds an agent; the system prompt is `base_prompt` followed by each toolset's prompt.
    pub fn new(
        llm: Arc<dyn LlmBackend>,
        tools: ToolRegistry,
        base_prompt: &str,
        config: AgentConfig,
    ) -> Self {
        let system_prompt = assemble_system_prompt(base_prompt, &tools.prompts());
        Agent {
            llm,
            tools,
            config,
            system_prompt: system_prompt.into(),
            observer: Arc::new(TracingObserver),
        }
    }

    /// Sends loop events to `observer` instead of the log.
    pub fn with_observer(mut self, observer: Arc<dyn AgentObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// A copy for another session: same model, prompt and observer; forked toolset state.
    pub fn fork(&self) -> Self {
        Agent {
            tools: self.tools.fork(),
            ..self.clone()
        }
    }

    /// The system prompt sent first in every request.
    pub fn system_prompt(&self) -> &str {
        &self.system_prompt
    }

    /// This agent's tools.
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// The loop's settings.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// Runs one turn on top of `history` (which this call does not change).
    ///
    /// Cancelling `cancel` ends the turn promptly with [`TurnEnd::Cancelled`]: tool calls
    /// still running or not yet started answer `CANCELLED`, so the returned messages are a
    /// valid conversation.
    pub async fn run_turn(
        &self,
        history: &[Message],
        input: TurnInput,
        cancel: CancellationToken,
    ) -> Result<Turn, AgentError> {
        let user = Message::User {
            content: with_injections(
                input.content.clone(),
                &self.tools.injections(&input.session),
            ),
        };
        let mut turn = Turn {
            messages: vec![user],
            reply: String::new(),
            usage: Usage::default(),
            iterations: 0,
            end: TurnEnd::Answered,
        };
        let tools = self.tools.defs();
        let vision = self.config.images.vision;
        let mut images =
            images::TurnImages::new(self.config.images.clone(), input.platform.clone());

        loop {
            if turn.iterations >= self.config.max_iterations {
                let text = format!(
                    "I stopped after {} steps without a final answer (my limit per message). \
                     Ask me to continue if you want me to go on.",
                    self.config.max_iterations
                );
                turn.messages.push(Message::assistant(&text));
                turn.reply = text;
                turn.end = TurnEnd::IterationLimit;
                break;
            }
            if cancel.is_cancelled() {
                turn.end = TurnEnd::Cancelled;
                break;
            }
            // Before the iteration counts: a turn cancelled while its images download made
            // no request.
            images.load(&turn.messages, &cancel).await;
            if cancel.is_cancelled() {
                turn.end = TurnEnd::Cancelled;
                break;
            }
            turn.iterations += 1;

            let mut messages = Vec::with_capacity(1 + history.len() + turn.messages.len());
            messages.push(Message::system(&*self.system_prompt));
            messages.extend(history.iter().map(|m| images::earlier(m, vision)));
            messages.extend(turn.messages.iter().map(|m| images.current(m)));
            let request = ChatRequest {
                model: self.config.model.clone(),
                messages,
                tool_choice: (!tools.is_empty()).then_some(ToolChoice::Auto),
                parallel_tool_calls: (!tools.is_empty()).then_some(self.config.parallel_tool_calls),
                tools: tools.clone(),
                temperature: self.config.temperature,
                max_completion_tokens: None,
            };
            self.observer.on_event(&AgentEvent::LlmRequest {
                session: &input.session,
                iteration: turn.iterations,
            });
            let completion = match self.llm.stream(&request, &cancel).await {
                Ok(c) => c,
                Err(LlmError::Cancelled) => {
                    turn.end = TurnEnd::Cancelled;
                    break;
                }
                Err(e) => return Err(e.into()),
            };
            if let Some(usage) = &completion.usage {
                turn.usage.add(usage);
                self.observer.on_event(&AgentEvent::Usage {
                    session: &input.session,
                    usage,
                });
            }
            turn.messages.push(completion.to_message());
            if completion.tool_calls.is_empty() {
                turn.reply = completion.content;
                break;
            }

            let appender = MessageAppender::default();
            let results = self
                .run_tool_batch(&completion.tool_calls, &input, &appender, &cancel)
                .await;
            for (call, result) in completion.tool_calls.iter().zip(results) {
                let text = truncate_result(&result.to_json(), self.config.tool_result_max_chars);
                turn.messages.push(Message::tool(&call.id, text));
            }
            turn.messages.extend(appender.drain());
        }
        self.observer.on_event(&AgentEvent::TurnFinished {
            session: &input.session,
            iterations: turn.iterations,
            end: turn.end,
            usage: &turn.usage,
        });
        Ok(turn)
    }

    /// Runs one response's tool calls, at most `max_concurrent_tool_calls` at a time, and
    /// returns their results in call order.
    async fn run_tool_batch(
        &self,
        calls: &[ToolCall],
        input: &TurnInput,
        appender: &MessageAppender,
        cancel: &CancellationToken,
    ) -> Vec<ToolResult> {
        // `buffered` keeps at most N futures in flight and yields in input order: the
        // concurrency bound and the ordering rule in one place, with nothing detached.
        // The futures are built before the stream (not in a `map` closure) so that the
        // compiler can see they are `Send` for the caller's concrete lifetimes.
        let calls: Vec<_> = calls
            .iter()
            .map(|call| self.run_tool(call, input, appender, cancel))
            .collect();
        futures::stream::iter(calls)
            .buffered(self.config.max_concurrent_tool_calls.max(1))
            .collect()
            .await
    }

    async fn run_tool(
        &self,
        call: &ToolCall,
        input: &TurnInput,
        appender: &MessageAppender,
        cancel: &CancellationToken,
    ) -> ToolResult {
        let name = call.function.name.as_str();
        if cancel.is_cancelled() {
            return cancelled_result(name);
        }
        let call_cancel = cancel.child_token();
        let cx = ToolContext {
            session: input.session.clone(),
            caller: input.caller.clone(),
            cancel: call_cancel.clone(),
            appender: appender.clone(),
            chat: input.chat.clone(),
            platform: input.platform.clone(),
            roles: input.roles.clone(),
        };
        self.observer.on_event(&AgentEvent::ToolStarted {
            session: &input.session,
            call,
        });
        let started = Instant::now();
        let result = tokio::select! {
            biased;
            () = cancel.cancelled() => cancelled_result(name),
            outcome = tokio::time::timeout(self.config.tool_timeout, self.tools.call(call, cx)) => {
                match outcome {
                    Ok(result) => result,
                    Err(_) => ToolResult::err(
                        codes::TIMEOUT,
                        format!(
                            "{name} did not finish within {} seconds and was stopped",
                            self.config.tool_timeout.as_secs_f64()
                        ),
                    ),
                }
            }
        };
        // Tell a tool that outlived its call (timeout, cancel) to clean up.
        call_cancel.cancel();
        self.observer.on_event(&AgentEvent::ToolFinished {
            session: &input.session,
            call,
            result: &result,
            elapsed: started.elapsed(),
        });
        result
    }
}

fn cancelled_result(name: &str) -> ToolResult {
    ToolResult::err(
        codes::CANCELLED,
        format!("{name} was cancelled because the turn was stopped"),
    )
}

/// Base prompt, then each toolset's prompt, separated by blank lines.
fn assemble_system_prompt(base: &str, prompts: &[String]) -> String {
    let mut out = base.trim_end().to_owned();
    for prompt in prompts {
        let prompt = prompt.trim();
        if prompt.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str(prompt);
    }
    out
}

/// Prepends the turn's injections to the user content; they are stored with it, so the
/// history shows what the model saw.
fn with_injections(content: Content, injections: &[String]) -> Content {
    if injections.is_empty() {
        return content;
    }
    let prefix = injections.join("\n\n");
    match content {
        Content::Text(text) => Content::Text(format!("{prefix}\n\n{text}")),
        Content::Parts(mut parts) => {
            // Joined to the first text as with plain text content, so that the text reads
            // the same whether or not images came with it.
            match parts.first_mut() {
                Some(ContentPart::Text { text }) => *text = format!("{prefix}\n\n{text}"),
                _ => parts.insert(0, ContentPart::Text { text: prefix }),
            }
            Content::Parts(parts)
        }
    }
}

/// Cuts `text` to at most `max_chars` characters (never inside a character) and says how
/// much was cut, so the model knows the result is partial.
pub fn truncate_result(text: &str, max_chars: usize) -> String {
    crate::text::clip_with(text, max_chars, |rest| {
        let cut = rest.chars().count();
        format!("\n[truncated: {cut} of {} characters cut]", cut + max_chars)
    })
    .into_owned()
}
