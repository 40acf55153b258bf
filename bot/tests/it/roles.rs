//! Roles as data: the registry compares a tool's spec role with the caller's, checks the
//! role again in a chat an argument names (through `TestRoles`), and refuses at
//! construction a dangerous tool that a non-operator could call. Also the session-key
//! parser and what the catalog says about roles.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parlor_bot::llm::ToolCall;
use parlor_bot::platform::ChatRef;
use parlor_bot::testing::{TestRoles, group, tool_context};
use parlor_bot::tool::bridge::ToolError;
use parlor_bot::tool::{
    Caller, Grant, RegistryError, Risk, Role, RoleResolver, ToolContext, ToolRegistry, ToolResult,
    ToolSetBridge, catalog, codes,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

/// Arguments of the tools below; only their schema matters here.
#[derive(Debug, Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Args {
    /// A count the model must give.
    n: u32,
    /// Another chat to act on, as a session key.
    target: Option<String>,
}

/// Arguments of `rehome`.
#[derive(Debug, Deserialize, JsonSchema)]
struct RehomeArgs {
    /// Which stored item.
    item: u32,
}

/// `reboot` (operator, dangerous), `schedule` (chat admin, also in `target`'s chat),
/// `rehome` (chat admin, whose target only the toolset knows: item 1 lives in `test:-200`),
/// `chat` (anyone). Each counts its runs.
fn toolset(runs: Arc<AtomicUsize>) -> ToolSetBridge {
    let (r1, r2, r3, r4) = (runs.clone(), runs.clone(), runs.clone(), runs);
    ToolSetBridge::builder("roles")
        .add_function("reboot", "Reboots the host.", move |_: Args| {
            r1.fetch_add(1, Ordering::SeqCst);
            async { ToolResult::ok("rebooted") }
        })
        .risk(Risk::Dangerous)
        .role(Role::Operator)
        .add_function("schedule", "Schedules into a chat.", move |_: Args| {
            r2.fetch_add(1, Ordering::SeqCst);
            async { ToolResult::ok("scheduled") }
        })
        .risk(Risk::Write)
        .role(Role::ChatAdmin)
        .role_in_chat_arg("target")
        .add_function_with_context(
            "rehome",
            "Changes a stored item wherever it lives.",
            move |args: RehomeArgs, cx: ToolContext| {
                let runs = r3.clone();
                async move {
                    let lives_in = match args.item {
                        1 => ChatRef::new("test", "-200"),
                        _ => group(),
                    };
                    cx.require_role_in(&lives_in, Role::ChatAdmin).await?;
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, ToolError>("changed")
                }
            },
        )
        .risk(Risk::Write)
        .role(Role::ChatAdmin)
        .add_function("chat", "Says hello.", move |_: Args| {
            r4.fetch_add(1, Ordering::SeqCst);
            async { ToolResult::ok("hello") }
        })
        .build()
        .expect("valid toolset")
}

/// Roles in other chats: `test:alice` administers `test:-200`, `test:carol` `test:-100`;
/// `test:-666` cannot be read. The double counts every lookup, so a test can tell that none
/// was needed.
fn roles() -> Arc<TestRoles> {
    let roles = TestRoles::new();
    roles.set("test:alice", &ChatRef::new("test", "-200"), Role::ChatAdmin);
    roles.set("test:carol", &group(), Role::ChatAdmin);
    roles.unreadable(&ChatRef::new("test", "-666"), true);
    roles.shared()
}

struct Rig {
    registry: ToolRegistry,
    roles: Arc<TestRoles>,
    runs: Arc<AtomicUsize>,
}

fn rig() -> Rig {
    let runs = Arc::new(AtomicUsize::new(0));
    let registry = ToolRegistry::new(vec![Arc::new(toolset(runs.clone()))]).unwrap();
    Rig {
        registry,
        roles: roles(),
        runs,
    }
}

impl Rig {
    fn cx(&self, who: &str, role: Role) -> ToolContext {
        ToolContext {
            roles: Some(self.roles.clone() as Arc<dyn RoleResolver>),
            ..tool_context(&group(), &format!("test:{who}"), role)
        }
    }

    async fn call(&self, cx: &ToolContext, name: &str, args: Value) -> ToolResult {
        self.registry
            .call(&ToolCall::new("c1", name, args.to_string()), cx.clone())
            .await
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn lookups(&self) -> usize {
        self.roles.lookups()
    }
}

#[tokio::test]
async fn a_chat_admin_is_refused_an_operator_tool_and_told_to_say_so() {
    let rig = rig();
    for role in [Role::Member, Role::ChatAdmin] {
        let r = rig
            .call(&rig.cx("alice", role), "reboot", json!({"n": 1}))
            .await;
        assert_eq!(r.code(), Some(codes::PERMISSION_DENIED), "{role:?}: {r:?}");
        assert!(r.message.contains("operator"), "{}", r.message);
        assert!(r.message.contains("alice"), "{}", r.message);
        assert!(r.message.contains("do not try again"), "{}", r.message);
    }
    assert_eq!(rig.runs(), 0, "the tool never ran");
    let r = rig
        .call(&rig.cx("olga", Role::Operator), "reboot", json!({"n": 1}))
        .await;
    assert!(r.success, "{r:?}");
    assert_eq!(rig.runs(), 1);
}

#[tokio::test]
async fn the_role_is_checked_before_the_arguments_and_members_keep_member_tools() {
    let rig = rig();
    let member = rig.cx("bob", Role::Member);
    // Arguments that do not fit: a member learns only that the tool is not theirs.
    let r = rig.call(&member, "schedule", json!({"n": "many"})).await;
    assert_eq!(r.code(), Some(codes::PERMISSION_DENIED), "{r:?}");
    assert!(r.message.contains("chat_admin"), "{}", r.message);
    let r = rig.call(&member, "chat", json!({"n": 1})).await;
    assert!(r.success, "{r:?}");
    // The system caller (a background turn) is a member who is not even offered more.
    let system = ToolContext {
        caller: Caller::default(),
        ..member
    };
    let r = rig.call(&system, "reboot", json!({"n": 1})).await;
    assert_eq!(r.code(), Some(codes::TOOL_NOT_FOUND));
    let r = rig.call(&system, "schedule", json!({"n": 1})).await;
    assert_eq!(r.code(), Some(codes::TOOL_NOT_FOUND));
}

/// A merged burst of several members runs as the system with their least role: its
/// `tools` array is built once and shared by every such turn (not rebuilt and serialized
/// each time), and a caller of another role, or with grants, gets its own.
#[test]
fn a_system_callers_tools_array_is_built_once_per_role() {
    let rig = rig();
    let several = |role: Role| Caller {
        user_id: String::new(),
        name: "several members".into(),
        role,
        grants: Vec::new(),
    };
    let first = rig.registry.defs_for_caller(false, &several(Role::Member));
    let again = rig.registry.defs_for_caller(false, &several(Role::Member));
    assert!(
        std::ptr::eq(first.as_ptr(), again.as_ptr()),
        "shared, not rebuilt"
    );
    let names = |defs: &parlor_bot::llm::ToolDefs| -> Vec<String> {
        defs.iter().map(|d| d.function.name.clone()).collect()
    };
    let operator = rig
        .registry
        .defs_for_caller(false, &several(Role::Operator));
    assert!(!std::ptr::eq(first.as_ptr(), operator.as_ptr()));
    assert!(
        names(&operator).len() > names(&first).len(),
        "{:?}",
        names(&operator)
    );
    let mut granted = several(Role::Member);
    granted.grants = vec![Grant::new("schedule", "target", "test:-100")];
    let with_grant = rig.registry.defs_for_caller(false, &granted);
    assert!(names(&with_grant).contains(&"schedule".to_owned()));
    assert!(!names(&first).contains(&"schedule".to_owned()));
}

#[tokio::test]
async fn an_unattended_caller_is_offered_and_granted_only_what_its_grants_name() {
    let rig = rig();
    // A background notice started by an operator: the system, a member, two grants. One
    // names a dangerous tool, which no grant can open.
    let system = ToolContext {
        caller: Caller {
            user_id: String::new(),
            name: "an unattended turn".into(),
            role: Role::Member,
            grants: vec![
                Grant::new("schedule", "target", "test:-100"),
                Grant::new("reboot", "target", "test:-100"),
            ],
        },
        ..rig.cx("x", Role::Member)
    };
    let offered: Vec<String> = rig
        .registry
        .defs_for_caller(false, &system.caller)
        .iter()
        .map(|d| d.function.name.clone())
        .collect();
    assert_eq!(
        offered,
        ["schedule", "chat"],
        "no dangerous tool, nothing ungranted"
    );
    // A person's turn is offered everything (the gate explains refusals).
    let person = rig.cx("bob", Role::Member).caller;
    assert_eq!(rig.registry.defs_for_caller(false, &person).len(), 4);

    let r = rig
        .call(&system, "schedule", json!({"n": 1, "target": "test:-100"}))
        .await;
    assert!(r.success, "granted: {r:?}");
    let r = rig
        .call(&system, "schedule", json!({"n": 1, "target": "test:-200"}))
        .await;
    assert_eq!(
        r.code(),
        Some(codes::PERMISSION_DENIED),
        "another value: {r:?}"
    );
    assert!(r.message.contains("test:-100"), "{}", r.message);
    let r = rig
        .call(&system, "reboot", json!({"n": 1, "target": "test:-100"}))
        .await;
    assert_eq!(r.code(), Some(codes::TOOL_NOT_FOUND), "dangerous: {r:?}");
    let r = rig.call(&system, "rehome", json!({"item": 2})).await;
    assert_eq!(r.code(), Some(codes::TOOL_NOT_FOUND), "ungranted: {r:?}");
    assert_eq!(rig.runs(), 1, "only the granted call ran");
    assert_eq!(rig.lookups(), 0, "the system's role is never looked up");
}

#[tokio::test]
async fn another_chat_in_the_role_argument_needs_the_role_there_too() {
    let rig = rig();
    let alice = rig.cx("alice", Role::ChatAdmin);
    let erin = rig.cx("erin", Role::ChatAdmin);

    // Alice administers test:-200: allowed.
    let r = rig
        .call(&alice, "schedule", json!({"n": 1, "target": "test:-200"}))
        .await;
    assert!(r.success, "{r:?}");
    assert_eq!(rig.lookups(), 1);
    // Erin is a member there: refused, and told which chat.
    let r = rig
        .call(&erin, "schedule", json!({"n": 1, "target": "test:-200"}))
        .await;
    assert_eq!(r.code(), Some(codes::PERMISSION_DENIED), "{r:?}");
    assert!(r.message.contains("test:-200"), "{}", r.message);
    assert!(r.message.contains("erin"), "{}", r.message);
    // The resolver cannot tell: unavailable, not denied.
    let r = rig
        .call(&alice, "schedule", json!({"n": 1, "target": "test:-666"}))
        .await;
    assert_eq!(r.code(), Some(codes::UNAVAILABLE), "{r:?}");
    assert_eq!(rig.runs(), 1, "only the allowed call ran");
    // Not a chat key at all.
    let r = rig
        .call(
            &alice,
            "schedule",
            json!({"n": 1, "target": "the other group"}),
        )
        .await;
    assert_eq!(r.code(), Some(codes::INVALID_ARGUMENTS), "{r:?}");
    assert!(r.message.contains("telegram:-100123"), "{}", r.message);
}

#[tokio::test]
async fn this_chat_blank_or_absent_needs_no_lookup() {
    let rig = rig();
    let erin = rig.cx("erin", Role::ChatAdmin);
    for target in [
        json!("test:-100"),
        json!("test:-100/topic:7"),
        json!("  "),
        Value::Null,
    ] {
        let r = rig
            .call(&erin, "schedule", json!({"n": 1, "target": target}))
            .await;
        assert!(r.success, "{target}: {r:?}");
    }
    let r = rig.call(&erin, "schedule", json!({"n": 1})).await;
    assert!(r.success, "{r:?}");
    // An operator holds every role everywhere, without asking.
    let olga = rig.cx("olga", Role::Operator);
    let r = rig
        .call(&olga, "schedule", json!({"n": 1, "target": "test:-200"}))
        .await;
    assert!(r.success, "{r:?}");
    assert_eq!(rig.lookups(), 0);
    assert_eq!(rig.runs(), 6);
}

#[tokio::test]
async fn without_a_resolver_only_an_operator_acts_on_another_chat() {
    let rig = rig();
    let alone = |cx: ToolContext| ToolContext { roles: None, ..cx };
    let r = rig
        .call(
            &alone(rig.cx("alice", Role::ChatAdmin)),
            "schedule",
            json!({"n": 1, "target": "test:-200"}),
        )
        .await;
    assert_eq!(r.code(), Some(codes::PERMISSION_DENIED), "{r:?}");
    let r = rig
        .call(
            &alone(rig.cx("olga", Role::Operator)),
            "schedule",
            json!({"n": 1, "target": "test:-200"}),
        )
        .await;
    assert!(r.success, "{r:?}");
    // Outside any chat (`parlor ask`) every chat is another chat.
    let nowhere = ToolContext {
        chat: None,
        ..rig.cx("alice", Role::ChatAdmin)
    };
    let r = rig
        .call(&nowhere, "schedule", json!({"n": 1, "target": "test:-200"}))
        .await;
    assert!(r.success, "{r:?}");
    let r = rig
        .call(&nowhere, "schedule", json!({"n": 1, "target": "test:-300"}))
        .await;
    assert_eq!(r.code(), Some(codes::PERMISSION_DENIED), "{r:?}");
}

#[tokio::test]
async fn a_toolset_asks_about_a_target_only_its_data_knows_through_the_context() {
    let rig = rig();
    let alice = rig.cx("alice", Role::ChatAdmin);
    let erin = rig.cx("erin", Role::ChatAdmin);
    let r = rig.call(&erin, "rehome", json!({"item": 2})).await;
    assert!(r.success, "an item of this chat: {r:?}");
    assert_eq!(rig.lookups(), 0);
    let r = rig.call(&erin, "rehome", json!({"item": 1})).await;
    assert_eq!(r.code(), Some(codes::PERMISSION_DENIED), "{r:?}");
    let r = rig.call(&alice, "rehome", json!({"item": 1})).await;
    assert!(r.success, "{r:?}");
    assert_eq!(rig.runs(), 2);
}

#[test]
fn a_dangerous_tool_below_operator_or_a_missing_role_argument_is_a_startup_error() {
    for role in [Role::Member, Role::ChatAdmin] {
        let tools = ToolSetBridge::builder("risky")
            .add_function("wipe", "Wipes the disk.", |_: Args| async {
                ToolResult::ok("")
            })
            .risk(Risk::Dangerous)
            .role(role)
            .build()
            .unwrap();
        let error = ToolRegistry::new(vec![Arc::new(tools)]).unwrap_err();
        assert!(
            matches!(&error, RegistryError::DangerousBelowOperator { name, .. } if name == "wipe"),
            "{error}"
        );
        assert!(error.to_string().contains("operator"), "{error}");
    }
    for argument in ["chat", "n"] {
        let tools = ToolSetBridge::builder("confused")
            .add_function("aim", "Aims.", |_: Args| async { ToolResult::ok("") })
            .role(Role::ChatAdmin)
            .role_in_chat_arg(argument)
            .build()
            .unwrap();
        let error = ToolRegistry::new(vec![Arc::new(tools)]).unwrap_err();
        assert!(
            matches!(&error, RegistryError::BadRoleArgument { argument: a, .. } if a == argument),
            "{error}"
        );
    }
}

#[test]
fn session_keys_parse_back_into_chats() {
    for chat in [
        ChatRef::new("telegram", "-100123"),
        ChatRef::new("telegram", "-100123").in_thread("7"),
        ChatRef::new("console", "local"),
    ] {
        assert_eq!(
            ChatRef::parse_session_key(&chat.session_key()),
            Some(chat.clone())
        );
    }
    assert_eq!(
        ChatRef::new("telegram", "-100123")
            .in_thread("7")
            .session_key(),
        "telegram:-100123/topic:7"
    );
    assert_eq!(
        ChatRef::new("console", "local").session_key(),
        "console:local"
    );
    assert_eq!(
        ChatRef::parse_session_key("  discord:42 "),
        Some(ChatRef::new("discord", "42"))
    );
    for bad in [
        "",
        "telegram",
        ":1",
        "telegram:",
        "tele gram:1",
        "t:1/topic:",
        "t:1 2",
    ] {
        assert_eq!(ChatRef::parse_session_key(bad), None, "{bad:?}");
    }
}

#[test]
fn the_catalog_shows_every_tools_role() {
    let rig = rig();
    let md = catalog::to_markdown(&rig.registry);
    for needle in [
        "Toolset `roles` · risk `dangerous` · role `operator`\n",
        "Toolset `roles` · risk `write` · role `chat_admin` (also in the chat `target` names)\n",
        "Toolset `roles` · risk `read` · role `member`\n",
        "A chat admin is never an operator.",
        "An unattended turn (a clock task firing, a background job's result) runs as a `member`",
    ] {
        assert!(md.contains(needle), "missing {needle:?} in:\n{md}");
    }
    let tools: Value = serde_json::from_str(&catalog::to_json(&rig.registry)).unwrap();
    assert_eq!(tools[0]["function"]["name"], "reboot");
    assert_eq!(tools[0]["x-parlor"]["role"], "operator");
    assert_eq!(tools[0]["x-parlor"]["risk"], "dangerous");
    assert_eq!(tools[1]["x-parlor"]["role_in_chat_arg"], "target");
    assert_eq!(tools[3]["x-parlor"]["role"], "member");
    // What the model is sent carries no policy.
    let sent = serde_json::to_value(rig.registry.defs()).unwrap();
    assert!(sent[0].get("x-parlor").is_none());
    let help = catalog::to_help(&rig.registry);
    assert_eq!(
        help,
        "• reboot — Reboots the host. (operators)\n\
         • schedule — Schedules into a chat. (chat admins)\n\
         • rehome — Changes a stored item wherever it lives. (chat admins)\n\
         • chat — Says hello. (everyone)"
    );
}

#[tokio::test]
async fn a_member_is_looked_up_only_when_a_tool_needs_more() {
    let rig = rig();
    // Carol administers this chat, but the session only knows her as a member so far.
    let carol = rig.cx("carol", Role::Member);
    let r = rig.call(&carol, "chat", json!({"n": 1})).await;
    assert!(r.success, "{r:?}");
    assert_eq!(rig.lookups(), 0, "a member tool needs no lookup");
    let r = rig.call(&carol, "schedule", json!({"n": 1})).await;
    assert!(r.success, "{r:?}");
    assert_eq!(rig.lookups(), 1, "a chat-admin tool asks once");
    let r = rig.call(&carol, "rehome", json!({"item": 2})).await;
    assert!(r.success, "{r:?}");
    // Bob really is a member: looked up, and refused as one.
    let bob = rig.cx("bob", Role::Member);
    let r = rig.call(&bob, "schedule", json!({"n": 1})).await;
    assert_eq!(r.code(), Some(codes::PERMISSION_DENIED), "{r:?}");
    assert!(r.message.contains("a member"), "{}", r.message);
    // A chat admin's role is never raised to an operator's by a lookup.
    let r = rig.call(&carol, "reboot", json!({"n": 1})).await;
    assert_eq!(r.code(), Some(codes::PERMISSION_DENIED), "{r:?}");
    assert_eq!(rig.runs(), 3);
}
