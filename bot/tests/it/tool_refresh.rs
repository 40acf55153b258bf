//! A toolset whose tools change while the registry runs (an MCP server's `list_changed`):
//! the registry's definitions and its gate follow `ToolSet::generation`, for every fork,
//! and a bad tool that appears later is left out instead of breaking the others.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use parlor_bot::llm::ToolCall;
use parlor_bot::tool::{
    Risk, Role, ToolContext, ToolInvocation, ToolRegistry, ToolResult, ToolSet, ToolSpec,
};
use serde_json::json;

/// Tools set from outside, as a server's list would be.
#[derive(Default)]
struct Changing {
    specs: Mutex<Vec<ToolSpec>>,
    generation: AtomicU64,
}

impl Changing {
    fn set(&self, specs: Vec<ToolSpec>) {
        *self.specs.lock().unwrap() = specs;
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

struct Handle(Arc<Changing>);

#[async_trait]
impl ToolSet for Handle {
    fn name(&self) -> &str {
        "changing"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        self.0.specs.lock().unwrap().clone()
    }

    fn generation(&self) -> u64 {
        self.0.generation.load(Ordering::SeqCst)
    }

    async fn invoke(&self, call: ToolInvocation, _cx: ToolContext) -> ToolResult {
        ToolResult::ok(format!("ran {}", call.name))
    }

    fn fork(&self) -> Arc<dyn ToolSet> {
        Arc::new(Handle(Arc::clone(&self.0)))
    }
}

fn spec(name: &str, risk: Risk, role: Role) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: format!("{name} does a thing"),
        parameters: json!({"type": "object", "properties": {}}),
        result: String::new(),
        risk,
        role,
        role_in_chat_arg: None,
        failure_codes: Vec::new(),
        offer: Default::default(),
    }
}

fn member() -> ToolContext {
    ToolContext::default()
}

#[tokio::test]
async fn a_changed_tool_list_reaches_the_definitions_the_gate_and_every_fork() {
    let changing = Arc::new(Changing::default());
    changing.set(vec![spec("first", Risk::Read, Role::Member)]);
    let registry = ToolRegistry::new(vec![Arc::new(Handle(Arc::clone(&changing)))]).unwrap();
    let session = registry.fork();
    assert_eq!(registry.names(), ["first"]);
    let r = session
        .call(&ToolCall::new("1", "second", "{}"), member())
        .await;
    assert_eq!(r.code(), Some("TOOL_NOT_FOUND"));

    changing.set(vec![
        spec("first", Risk::Read, Role::Member),
        spec("second", Risk::Read, Role::Member),
    ]);
    let defs = serde_json::to_string(&session.defs()).unwrap();
    assert!(defs.contains("\"second\""), "{defs}");
    let r = session
        .call(&ToolCall::new("2", "second", "{}"), member())
        .await;
    assert_eq!(r.message, "ran second", "{r:?}");
    assert_eq!(registry.names(), ["first", "second"]);
}

#[tokio::test]
async fn a_bad_tool_appearing_later_is_left_out_and_the_rest_stay() {
    let changing = Arc::new(Changing::default());
    changing.set(vec![spec("first", Risk::Read, Role::Member)]);
    let registry = ToolRegistry::new(vec![Arc::new(Handle(Arc::clone(&changing)))]).unwrap();
    changing.set(vec![
        spec("first", Risk::Read, Role::Member),
        // Would be a startup error: dangerous below operator, and a bad name.
        spec("host", Risk::Dangerous, Role::Member),
        spec("bad name", Risk::Read, Role::Member),
    ]);
    assert_eq!(registry.names(), ["first"]);
    let r = registry
        .call(&ToolCall::new("1", "host", "{}"), member())
        .await;
    assert_eq!(r.code(), Some("TOOL_NOT_FOUND"), "{r:?}");
}
