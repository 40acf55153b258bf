//! [`ToolRegistry`]: the toolsets of one session and the gate every tool call passes.
//!
//! The program, not the model, enforces policy (docs/contract.md, "Tools"). Before a toolset sees a call
//! the registry checks that the tool exists, that the caller holds the tool's
//! [`ToolSpec::role`] in this chat, that the arguments parse and fit the schema, and, when
//! the tool's [`ToolSpec::role_in_chat_arg`] names another chat, that the caller holds the
//! role there too. This is the only place a spec's role is compared: toolsets never look at
//! `caller.role` themselves (a target known only from a toolset's data goes through
//! [`ToolContext::require_role_in`]). A panic inside a tool is caught here and becomes
//! `INTERNAL`, so one broken tool cannot take a session down.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use futures::FutureExt;

use super::bridge::is_valid_tool_name;
use super::result::codes;
use super::schema::check_parameters;
use super::validate::{ArgValidator, drop_optional_nulls, parse_arguments};
use super::{
    Caller, Risk, Role, ToolContext, ToolInvocation, ToolProfile, ToolResult, ToolSet, ToolSpec,
};
use crate::llm::{ToolCall, ToolDefs};
use crate::platform::ChatRef;

/// Why a set of toolsets cannot be registered. Raised at startup, never at the first request.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A tool name breaks OpenAI's rule `^[a-zA-Z0-9_-]{1,64}$`.
    #[error(
        "tool name {name:?} of toolset {toolset:?} is invalid: names are 1-64 characters of a-z, A-Z, 0-9, '_' or '-'"
    )]
    InvalidName {
        /// The offending name.
        name: String,
        /// The toolset declaring it.
        toolset: String,
    },
    /// Two tools share a name.
    #[error("tool {name:?} is declared by both toolset {first:?} and toolset {second:?}")]
    Duplicate {
        /// The shared name.
        name: String,
        /// The toolset registered first.
        first: String,
        /// The toolset registered second.
        second: String,
    },
    /// A tool's parameter schema is not a self-contained JSON Schema object.
    #[error("tool {name:?} has an unusable parameter schema: {reason}")]
    BadSchema {
        /// The tool.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A `dangerous` tool (it reaches the host) that someone below an operator could call.
    #[error(
        "tool {name:?} of toolset {toolset:?} is dangerous (it reaches the host) but needs only the {role} role; dangerous tools need the operator role"
    )]
    DangerousBelowOperator {
        /// The tool.
        name: String,
        /// The toolset declaring it.
        toolset: String,
        /// The role it declared.
        role: &'static str,
    },
    /// A tool's `role_in_chat_arg` is not one of its string arguments.
    #[error(
        "tool {name:?} checks roles in the chat named by argument {argument:?}, but it has no such string argument"
    )]
    BadRoleArgument {
        /// The tool.
        name: String,
        /// The argument it names.
        argument: String,
    },
}

/// One registered tool: where it lives, what it looks like, how its arguments are checked.
struct Entry {
    /// Index into [`ToolRegistry::toolsets`].
    toolset: usize,
    spec: ToolSpec,
    validator: ArgValidator,
}

/// The registry's view of its toolsets' tools at one [`ToolSet::generation`] sum: specs,
/// validators, the name index and the `tools` array, built together.
struct Built {
    entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
    /// What every request of a turn that answers someone offers the model: the same for
    /// every fork and turn until a toolset's generation moves.
    defs: ToolDefs,
    /// The same for an auto-chat turn, by each spec's [`Offer`].
    auto_chat_defs: ToolDefs,
    /// The sum of the toolsets' generations this was built at.
    generation: u64,
    /// The narrower arrays asked for since (a merged burst runs as the system, a group may
    /// pick its toolsets): built once each, as [`Built::defs`] is, instead of every turn.
    scoped: Mutex<HashMap<Scope, ToolDefs>>,
}

/// What a narrower `tools` array depends on, when the caller carries no grants.
#[derive(PartialEq, Eq, Hash)]
struct Scope {
    auto_chat: bool,
    /// The role of a system caller; `None` for a person (offered every tool of the kind).
    system_role: Option<Role>,
    toolsets: Option<Vec<String>>,
}

/// The most narrower arrays kept: each is a group's pick of toolsets or a role, so a few
/// at most in practice; past this (groups picking many different sets) it starts over.
const MAX_SCOPED: usize = 64;

impl Built {
    /// Checks and indexes every tool of `toolsets`. `strict` (at startup) fails on the
    /// first bad tool; otherwise (a toolset's list changed while running) a bad tool is
    /// logged and left out, so the others stay usable.
    fn build(
        toolsets: &[Arc<dyn ToolSet>],
        generation: u64,
        strict: bool,
        profile: ToolProfile,
    ) -> Result<Self, RegistryError> {
        let mut entries: Vec<Entry> = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for (index, toolset) in toolsets.iter().enumerate() {
            for spec in toolset.tools() {
                match check_spec(toolsets, &entries, &by_name, toolset.as_ref(), &spec) {
                    Ok(validator) => {
                        by_name.insert(spec.name.clone(), entries.len());
                        entries.push(Entry {
                            toolset: index,
                            spec,
                            validator,
                        });
                    }
                    Err(e) if strict => return Err(e),
                    Err(e) => {
                        tracing::error!(toolset = toolset.name(), error = %e, "tool left out");
                    }
                }
            }
        }
        let defs_for = |auto_chat: bool| {
            entries
                .iter()
                .filter(|e| e.spec.offer.includes(auto_chat))
                .map(|e| e.spec.to_def_as(profile))
                .collect::<Vec<_>>()
                .into()
        };
        let defs = defs_for(false);
        let auto_chat_defs = defs_for(true);
        Ok(Built {
            entries,
            by_name,
            defs,
            auto_chat_defs,
            generation,
            scoped: Mutex::new(HashMap::new()),
        })
    }
}

/// Every check a tool passes before it is registered; its argument validator when it does.
fn check_spec(
    toolsets: &[Arc<dyn ToolSet>],
    entries: &[Entry],
    by_name: &HashMap<String, usize>,
    toolset: &dyn ToolSet,
    spec: &ToolSpec,
) -> Result<ArgValidator, RegistryError> {
    if !is_valid_tool_name(&spec.name) {
        return Err(RegistryError::InvalidName {
            name: spec.name.clone(),
            toolset: toolset.name().to_owned(),
        });
    }
    if let Some(&first) = by_name.get(&spec.name) {
        return Err(RegistryError::Duplicate {
            name: spec.name.clone(),
            first: toolsets[entries[first].toolset].name().to_owned(),
            second: toolset.name().to_owned(),
        });
    }
    check_parameters(&spec.parameters).map_err(|unfit| RegistryError::BadSchema {
        name: spec.name.clone(),
        reason: unfit.to_string(),
    })?;
    // Compiled at the tool's first call (`ArgValidator::lazy`); `check_parameters` above
    // has refused what the wire cannot carry.
    let validator = ArgValidator::lazy(&spec.parameters);
    if spec.risk == Risk::Dangerous && spec.role < Role::Operator {
        return Err(RegistryError::DangerousBelowOperator {
            name: spec.name.clone(),
            toolset: toolset.name().to_owned(),
            role: spec.role.as_str(),
        });
    }
    if let Some(argument) = &spec.role_in_chat_arg
        && !is_string_property(&spec.parameters, argument)
    {
        return Err(RegistryError::BadRoleArgument {
            name: spec.name.clone(),
            argument: argument.clone(),
        });
    }
    Ok(validator)
}

/// The toolsets of one agent, in registration order, with a name index.
///
/// Cloning is cheap and shares the toolsets; [`ToolRegistry::fork`] gives a new session its
/// own per-session state.
#[derive(Clone)]
pub struct ToolRegistry {
    toolsets: Vec<Arc<dyn ToolSet>>,
    /// Specs, validators and defs, shared by every fork: swapped for a rebuilt set when a
    /// toolset's [`ToolSet::generation`] moves (the readers of the old one keep it).
    built: Arc<RwLock<Arc<Built>>>,
    /// How the tools are described to the model.
    profile: ToolProfile,
    /// The tools (by tool or toolset name) that run only after a person with the role says
    /// yes ([`super::approval`]).
    approvals: Arc<HashMap<String, Role>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRegistry")
            .field(
                "toolsets",
                &self.toolsets.iter().map(|t| t.name()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl ToolRegistry {
    /// Registers `toolsets` in order, checking every name, duplicate and schema, that every
    /// dangerous tool needs an operator, and that a `role_in_chat_arg` names a string
    /// argument.
    pub fn new(toolsets: Vec<Arc<dyn ToolSet>>) -> Result<Self, RegistryError> {
        Self::with_profile(toolsets, ToolProfile::Full)
    }

    /// [`ToolRegistry::new`], describing the tools to the model as `profile` says.
    pub fn with_profile(
        toolsets: Vec<Arc<dyn ToolSet>>,
        profile: ToolProfile,
    ) -> Result<Self, RegistryError> {
        let generation = generation_of(&toolsets);
        let built = Built::build(&toolsets, generation, true, profile)?;
        Ok(ToolRegistry {
            toolsets,
            built: Arc::new(RwLock::new(Arc::new(built))),
            profile,
            approvals: Arc::default(),
        })
    }

    /// Has the tools `approvals` names (a tool's name, or a toolset's for all its tools)
    /// wait for a yes from someone with the role before they run.
    pub fn with_approvals(mut self, approvals: HashMap<String, Role>) -> Self {
        self.approvals = Arc::new(approvals);
        self
    }

    /// The role whose yes tool `name` (of toolset `toolset`) waits for, if any.
    pub fn approval(&self, name: &str, toolset: &str) -> Option<Role> {
        self.approvals
            .get(name)
            .or_else(|| self.approvals.get(toolset))
            .copied()
    }

    /// The tools as of now: the shared build, rebuilt first when a toolset's generation
    /// moved. The common case is a few integer reads and one uncontended read lock.
    fn current(&self) -> Arc<Built> {
        let generation = generation_of(&self.toolsets);
        let built = Arc::clone(&self.built.read().unwrap_or_else(|e| e.into_inner()));
        if built.generation == generation {
            return built;
        }
        // Lenient: a bad tool appearing at runtime is logged and left out, never an error.
        let fresh = match Built::build(&self.toolsets, generation, false, self.profile) {
            Ok(fresh) => Arc::new(fresh),
            Err(_) => return built,
        };
        *self.built.write().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&fresh);
        fresh
    }

    /// A registry for a new session: every toolset forked, specs shared.
    pub fn fork(&self) -> Self {
        ToolRegistry {
            toolsets: self.toolsets.iter().map(|t| t.fork()).collect(),
            built: Arc::clone(&self.built),
            profile: self.profile,
            approvals: Arc::clone(&self.approvals),
        }
    }

    /// Forgets every toolset's state of `session` (`/reset`).
    pub fn reset(&self, session: &str) {
        for toolset in &self.toolsets {
            toolset.reset(session);
        }
    }

    /// The toolsets, in registration order.
    pub fn toolsets(&self) -> &[Arc<dyn ToolSet>] {
        &self.toolsets
    }

    /// Every tool with the name of its toolset, in registration order (a snapshot).
    pub fn specs(&self) -> impl Iterator<Item = (String, ToolSpec)> + use<> {
        let built = self.current();
        let toolsets: Vec<String> = self.toolsets.iter().map(|t| t.name().to_owned()).collect();
        (0..built.entries.len()).map(move |i| {
            let entry = &built.entries[i];
            (toolsets[entry.toolset].clone(), entry.spec.clone())
        })
    }

    /// The names of every tool, in registration order.
    pub fn names(&self) -> Vec<String> {
        names_of(&self.current())
    }

    /// Whether a tool of this name exists now (one map lookup).
    pub fn has(&self, name: &str) -> bool {
        self.current().by_name.contains_key(name)
    }

    /// The exact `tools` array sent to the model in a turn that answers someone (shared,
    /// not copied).
    pub fn defs(&self) -> ToolDefs {
        self.current().defs.clone()
    }

    /// The `tools` array of an auto-chat turn (auto-chat) or not (see [`Offer`]).
    pub fn defs_for(&self, auto_chat: bool) -> ToolDefs {
        let built = self.current();
        if auto_chat {
            built.auto_chat_defs.clone()
        } else {
            built.defs.clone()
        }
    }

    /// The `tools` array for a turn of `caller`: a person's turn is offered every tool of
    /// its kind ([`ToolRegistry::defs_for`]; the gate refuses what their role does not
    /// allow, and the model can say why), the system's (a clock fire, a background
    /// notice: nobody watches it) only what its role and grants allow, never a dangerous
    /// tool.
    pub fn defs_for_caller(&self, auto_chat: bool, caller: &Caller) -> ToolDefs {
        self.defs_in_scope(auto_chat, caller, None)
    }

    /// [`ToolRegistry::defs_for_caller`], offering only the tools of `toolsets` when given
    /// (a group's `toolsets` setting).
    pub fn defs_in_scope(
        &self,
        auto_chat: bool,
        caller: &Caller,
        toolsets: Option<&[String]>,
    ) -> ToolDefs {
        if !caller.is_system() && toolsets.is_none() {
            return self.defs_for(auto_chat);
        }
        let built = self.current();
        let build = || -> ToolDefs {
            built
                .entries
                .iter()
                .filter(|e| offered(&e.spec, auto_chat, caller) && self.in_scope(e, toolsets))
                .map(|e| e.spec.to_def_as(self.profile))
                .collect::<Vec<_>>()
                .into()
        };
        // Grants name argument values: such a caller (a clock fire's) gets its own array.
        if !caller.grants.is_empty() {
            return build();
        }
        let scope = Scope {
            auto_chat,
            system_role: caller.is_system().then_some(caller.role),
            toolsets: toolsets.map(<[String]>::to_vec),
        };
        let lock = || built.scoped.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(defs) = lock().get(&scope) {
            return defs.clone();
        }
        let defs = build();
        let mut scoped = lock();
        if scoped.len() >= MAX_SCOPED {
            scoped.clear();
        }
        scoped.insert(scope, defs.clone());
        defs
    }

    /// Whether `entry`'s toolset is among `toolsets` (all are without a list).
    fn in_scope(&self, entry: &Entry, toolsets: Option<&[String]>) -> bool {
        toolsets.is_none_or(|names| {
            self.toolsets
                .get(entry.toolset)
                .is_some_and(|t| names.iter().any(|n| n == t.name()))
        })
    }

    /// Every toolset's static prompt, in order.
    pub fn prompts(&self) -> Vec<String> {
        self.toolsets.iter().filter_map(|t| t.prompt()).collect()
    }

    /// The sum of every toolset's [`ToolSet::prompt_version`]: when it changes, so did
    /// [`ToolRegistry::prompts`].
    pub fn prompt_version(&self) -> u64 {
        self.toolsets
            .iter()
            .fold(0u64, |sum, t| sum.wrapping_add(t.prompt_version()))
    }

    /// Re-reads what the toolsets load from outside ([`ToolSet::reload`]); a line for each
    /// toolset that loads something. Toolsets share what they load across forks, so one
    /// reload serves every session.
    pub fn reload(&self) -> Vec<String> {
        self.toolsets.iter().filter_map(|t| t.reload()).collect()
    }

    /// Whether any toolset holds in-memory session state (see
    /// [`ToolSet::holds_session_state`]).
    pub fn holds_session_state(&self) -> bool {
        self.toolsets.iter().any(|t| t.holds_session_state())
    }

    /// Every toolset's injection for the turn about to start in `session`, in order.
    pub fn injections(&self, session: &str) -> Vec<String> {
        self.toolsets
            .iter()
            .filter_map(|t| t.iteration_prompt_injection(session))
            .collect()
    }

    /// Runs one call through the policy gate and the toolset. Never panics, never fails:
    /// every problem is a [`ToolResult`] with an error code.
    pub async fn call(&self, call: &ToolCall, mut cx: ToolContext) -> ToolResult {
        let name = &call.function.name;
        let built = self.current();
        let auto_chat = cx.auto_chat.is_some();
        let scope = cx.toolsets.clone();
        let scope = scope.as_deref();
        // A tool this turn is not offered is as unknown as one that does not exist.
        let Some(entry) = built
            .by_name
            .get(name)
            .map(|&i| &built.entries[i])
            .filter(|e| offered(&e.spec, auto_chat, &cx.caller) && self.in_scope(e, scope))
        else {
            let offered: Vec<&str> = built
                .entries
                .iter()
                .filter(|e| offered(&e.spec, auto_chat, &cx.caller) && self.in_scope(e, scope))
                .map(|e| e.spec.name.as_str())
                .collect();
            return ToolResult::err(
                codes::TOOL_NOT_FOUND,
                format!(
                    "there is no tool named {name:?}; the tools are: {}",
                    offered.join(", ")
                ),
            );
        };
        // Before the arguments: a caller who may not use the tool gains nothing from being
        // told how to fix them.
        let needed = entry.spec.role;
        let role = if cx.caller.role < needed {
            cx.role_here().await
        } else {
            cx.caller.role
        };
        // A grant (an unattended turn's) may stand in for the role, never for a tool that
        // reaches the host; whether its argument matches is checked once they are valid.
        let by_grant = role < needed
            && entry.spec.risk != Risk::Dangerous
            && cx.caller.grants.iter().any(|g| g.tool == *name);
        if role < needed && !by_grant {
            return ToolResult::err(
                codes::PERMISSION_DENIED,
                format!(
                    "{name} needs the {} role: only {} may use it, and {} is {}. Tell them so; \
                     do not try again",
                    needed.as_str(),
                    needed.who(),
                    cx.caller_name(),
                    role.who()
                ),
            );
        }
        // The tool sees the role that let it run, not the one known before the lookup.
        cx.caller.role = role;
        let mut arguments = match parse_arguments(&call.function.arguments) {
            Ok(value) => value,
            Err(why) => {
                return ToolResult::err(codes::INVALID_ARGUMENTS, format!("{name}: {why}"));
            }
        };
        // `"x": null` from a model means "not given"; serde only applies defaults to absent
        // members, so nulls of optional members are removed before the toolset sees them.
        drop_optional_nulls(entry.validator.schema(), &mut arguments);
        if let Err(why) = entry.validator.validate(&arguments) {
            return ToolResult::err(codes::INVALID_ARGUMENTS, format!("{name}: {why}"));
        }
        if by_grant && !cx.caller.granted(name, &arguments) {
            return ToolResult::err(
                codes::PERMISSION_DENIED,
                format!(
                    "{name} is allowed in this turn only for what it was granted: {}. Do not \
                     try again",
                    grants_text(&cx.caller, name)
                ),
            );
        }
        // A grant names the argument's exact value: it stands for the role there too.
        if let Some(argument) = entry.spec.role_in_chat_arg.as_ref().filter(|_| !by_grant) {
            match chat_argument(&arguments, argument) {
                Ok(None) => {}
                Ok(Some(target)) => {
                    if let Err(refused) = cx.require_role_in(&target, needed).await {
                        return refused.into();
                    }
                }
                Err(why) => {
                    return ToolResult::err(codes::INVALID_ARGUMENTS, format!("{name}: {why}"));
                }
            }
        }
        let toolset = &self.toolsets[entry.toolset];
        // Last: a person is asked only for a call that would run as it stands.
        if let Some(role) = self.approval(name, toolset.name()) {
            let Some(approver) = cx.approver.clone() else {
                return ToolResult::err(
                    codes::PERMISSION_DENIED,
                    format!(
                        "{name} needs the approval of {}, which cannot be asked here; it did not run",
                        role.who()
                    ),
                );
            };
            let request = super::approval::ApprovalRequest {
                tool: name,
                arguments: &arguments,
                role,
                caller: &cx.caller,
            };
            let answer = approver.approve(request, &cx.cancel).await;
            if let Some(refused) = answer.refusal(name) {
                return refused;
            }
        }
        let invocation = ToolInvocation {
            id: call.id.clone(),
            name: name.clone(),
            arguments,
        };
        match AssertUnwindSafe(toolset.invoke(invocation, cx))
            .catch_unwind()
            .await
        {
            Ok(result) => result,
            Err(panic) => {
                let what = super::bridge::panic_text(panic.as_ref());
                tracing::error!(tool = %name, panic = %what, "tool panicked");
                ToolResult::err(
                    codes::INTERNAL,
                    format!("{name} failed unexpectedly; the error was logged for the operator"),
                )
            }
        }
    }
}

/// The sum of the toolsets' generations: it moves whenever one of them does (each only
/// counts up).
fn generation_of(toolsets: &[Arc<dyn ToolSet>]) -> u64 {
    toolsets
        .iter()
        .fold(0u64, |sum, t| sum.wrapping_add(t.generation()))
}

fn names_of(built: &Built) -> Vec<String> {
    built.entries.iter().map(|e| e.spec.name.clone()).collect()
}

/// Whether `schema` has a top-level property `name` that may be a string.
fn is_string_property(schema: &serde_json::Value, name: &str) -> bool {
    let Some(property) = schema.get("properties").and_then(|p| p.get(name)) else {
        return false;
    };
    match property.get("type") {
        Some(serde_json::Value::String(t)) => t == "string",
        Some(serde_json::Value::Array(types)) => types.iter().any(|t| t == "string"),
        _ => false,
    }
}

/// The chat named by `argument`: `None` when absent, null or blank (the tool's own chat).
fn chat_argument(arguments: &serde_json::Value, argument: &str) -> Result<Option<ChatRef>, String> {
    let key = match arguments.get(argument) {
        None | Some(serde_json::Value::Null) => return Ok(None),
        Some(serde_json::Value::String(key)) => key,
        Some(_) => return Err(format!("{argument} must be a chat key string")),
    };
    if key.trim().is_empty() {
        return Ok(None);
    }
    ChatRef::parse_session_key(key).map(Some).ok_or_else(|| {
        format!(
            "{argument}: {key:?} is not a chat key; write it like \"telegram:-100123\" \
             (platform:chat id)"
        )
    })
}

/// Whether a turn of `caller` (`auto_chat` or not) is offered the tool of `spec`: by its
/// [`Offer`](super::Offer), and for the system (an unattended turn) only within its role or
/// a grant, never a dangerous tool. A person is offered everything of the turn's kind; the
/// gate then tells them what their role does not allow.
fn offered(spec: &ToolSpec, auto_chat: bool, caller: &Caller) -> bool {
    if !spec.offer.includes(auto_chat) {
        return false;
    }
    !caller.is_system()
        || spec.role <= caller.role
        || (spec.risk != Risk::Dangerous && caller.grants.iter().any(|g| g.tool == spec.name))
}

/// The values a caller's grants allow for `tool`, for a refusal.
fn grants_text(caller: &Caller, tool: &str) -> String {
    caller
        .grants
        .iter()
        .filter(|g| g.tool == tool)
        .map(|g| format!("{} = {:?}", g.argument, g.value))
        .collect::<Vec<_>>()
        .join(", ")
}
