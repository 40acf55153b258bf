//! The model requests of a chat with real toolsets. The prompt-cache prefix of a busy group:
//! every request repeats the previous one's conversation byte for byte, whatever happens
//! between turns (unaddressed chatter, a memory write, a clock fire, a task notice,
//! `/status`); a provider's prompt cache keeps hitting only while that holds, so per-turn
//! data rides in the newest user message. And a clock fire goes through the failover chain
//! as a mention does.

use std::sync::Arc;

use parlor_bot::agent::{Agent, AgentConfig};
use parlor_bot::llm::{ChatRequest, Completion, OpenAiClient, ToolCall};
use parlor_bot::platform::{Inbox, Platform};
use parlor_bot::session::{SessionConfig, SessionManager};
use parlor_bot::store::{MemoryStore, Store};
use parlor_bot::testing::{ScriptedLlm, TestPlatform, is_summary_request, last_text, message};
use parlor_bot::tool::ToolRegistry;
use parlor_toolsets::memory::{MemoryOptions, memory_toolset};
use serde_json::json;

use crate::support::alice;
use crate::support::clock::group_a;

/// The end of the conversation in a request body: the body opens with `"messages"`, and a
/// `],"model":` cannot occur inside a JSON string (its quotes would be escaped).
fn conversation_end(body: &[u8]) -> usize {
    body.windows(10)
        .position(|w| w == b"],\"model\":")
        .expect("a messages array")
}

#[tokio::test]
async fn a_busy_group_repeats_each_requests_conversation_byte_for_byte() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let llm = ScriptedLlm::echo()
        .script_when(|request| last_text(request).contains("remember"))
        .shared();
    llm.push(Ok(Completion {
        tool_calls: vec![ToolCall::new(
            "call-1",
            "memory_write",
            json!({"key": "picnic", "content": "Saturday at the lake"}).to_string(),
        )],
        ..Completion::default()
    }));
    let tools = ToolRegistry::new(vec![memory_toolset(
        Arc::clone(&store),
        MemoryOptions::default(),
    )])
    .unwrap();
    let agent = Agent::new(
        llm.clone(),
        tools,
        "You are a helpful bot.",
        AgentConfig::default(),
    );
    let platform = TestPlatform::new();
    let manager = SessionManager::new(
        Arc::clone(&store),
        agent,
        vec![platform.clone() as Arc<dyn Platform>],
        SessionConfig {
            turns_per_minute: 1000,
            ..SessionConfig::default()
        },
    );
    manager.resume().await.unwrap();
    let (inputs, receiver) = parlor_bot::session::system_inputs();
    manager.serve_system(receiver);

    let chat = group_a();
    let mut sent = 0;
    let mut id = 0;
    let mut next_id = || {
        id += 1;
        id
    };
    for turn in 0..20 {
        // Chatter nobody addressed to the bot, recorded between turns.
        manager
            .deliver(message(
                &chat,
                next_id(),
                "carol",
                &format!("nice weather {turn}"),
            ))
            .await
            .unwrap();
        match turn {
            5 => {
                let text = "@parlor remember: the picnic is on Saturday at the lake";
                manager
                    .deliver(message(&chat, next_id(), "alice", text))
                    .await
                    .unwrap();
            }
            8 => {
                let text = "[Scheduled task \"note\" (clock 1)] post the daily note".to_owned();
                let done = inputs.clock_fire(&chat, text, alice()).await.unwrap();
                done.await.unwrap();
            }
            11 => {
                let text = "Background task 3 finished: the build passed".to_owned();
                inputs
                    .notice(&chat, text, alice(), Vec::new())
                    .await
                    .unwrap();
            }
            14 => {
                // Answered at intake: no request, but a reply in the chat.
                manager
                    .deliver(message(&chat, next_id(), "bob", "/status"))
                    .await
                    .unwrap();
                sent += 1;
                platform.wait_sent(sent).await;
                let text = "@parlor and after the status?";
                manager
                    .deliver(message(&chat, next_id(), "bob", text))
                    .await
                    .unwrap();
            }
            _ => {
                let who = if turn % 2 == 0 { "alice" } else { "bob" };
                let text = format!("@parlor question {turn}");
                manager
                    .deliver(message(&chat, next_id(), who, &text))
                    .await
                    .unwrap();
            }
        }
        sent += 1;
        platform.wait_sent(sent).await;
    }

    let requests: Vec<ChatRequest> = llm.requests();
    assert!(
        requests.len() >= 21,
        "20 turns, one with a tool call: {}",
        requests.len()
    );
    let mut compactions = 0;
    for pair in requests.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        if is_summary_request(before) || is_summary_request(after) {
            compactions += 1;
            continue;
        }
        let (a, b) = (
            OpenAiClient::request_bytes(before),
            OpenAiClient::request_bytes(after),
        );
        let end = conversation_end(&a);
        assert_eq!(
            String::from_utf8_lossy(&b[..end]),
            String::from_utf8_lossy(&a[..end]),
            "request {} does not repeat its predecessor's conversation",
            requests.iter().position(|r| r == after).unwrap_or_default()
        );
        assert_eq!(b[end], b',', "a request adds to the conversation");
        assert_eq!(before.tools.wire_json(), after.tools.wire_json());
    }
    // One prompt-cache key for the chat, the same in every request, naming no chat id.
    let key = parlor_bot::llm::wire::prompt_cache_key(&chat.session_key());
    assert!(key.starts_with("parlor-") && !key.contains("-100"), "{key}");
    for request in &requests {
        assert_eq!(request.prompt_cache_key.as_deref(), Some(key.as_str()));
    }
    let body = String::from_utf8(OpenAiClient::request_bytes(&requests[0])).unwrap();
    assert!(
        body.contains(&format!("\"prompt_cache_key\":\"{key}\"")),
        "{body}"
    );
    println!("{} requests, {compactions} at a compaction", requests.len());
    assert_eq!(compactions, 0, "20 short turns need no compaction");
}

/// A clock fire runs on the same failover chain as a mention: with the primary down, the
/// fallback answers it and the post goes out.
#[tokio::test]
async fn a_clock_fire_fails_over_like_a_mention() {
    use parlor_bot::llm::{Failover, Link, LlmError};
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let primary = ScriptedLlm::answering(|_, _| {
        Err(LlmError::Status {
            status: 503,
            body: "down".into(),
            retry_after: None,
        })
    })
    .shared();
    let fallback = ScriptedLlm::echo().shared();
    let chain = Failover::new(vec![
        Link {
            name: "primary".into(),
            model: None,
            llm: primary.clone(),
        },
        Link {
            name: "backup".into(),
            model: Some("backup".into()),
            llm: fallback.clone(),
        },
    ]);
    let agent = Agent::new(
        Arc::new(chain),
        ToolRegistry::new(Vec::new()).unwrap(),
        "You are a helpful bot.",
        AgentConfig::default(),
    );
    let platform = TestPlatform::new();
    let manager = SessionManager::new(
        Arc::clone(&store),
        agent,
        vec![platform.clone() as Arc<dyn Platform>],
        SessionConfig::default(),
    );
    manager.resume().await.unwrap();
    let (inputs, receiver) = parlor_bot::session::system_inputs();
    manager.serve_system(receiver);

    let text = "[Scheduled task \"note\" (clock 1)] post the daily note".to_owned();
    let done = inputs.clock_fire(&group_a(), text, alice()).await.unwrap();
    let outcome = done.await.unwrap();
    assert!(
        matches!(outcome, parlor_bot::session::ScheduledOutcome::Posted(_)),
        "{outcome:?}"
    );
    assert_eq!(primary.requests().len(), 1);
    assert_eq!(fallback.requests()[0].model, "backup");
    assert!(platform.sent()[0].text.starts_with("reply: "));
}
