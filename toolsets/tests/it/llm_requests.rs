//! The model requests of a chat with real toolsets. The prompt-cache prefix of a busy group:
//! every request repeats the previous one's conversation byte for byte, whatever happens
//! between turns (unaddressed chatter, a memory write, a clock fire, a task notice,
//! `/status`), in the OpenAI body and in the Anthropic one; a provider's prompt cache keeps
//! hitting only while that holds, so per-turn data rides in the newest user message. And a
//! clock fire goes through the failover chain as a mention does.

use std::sync::Arc;

use parlor_bot::agent::{Agent, AgentConfig};
use parlor_bot::llm::{
    AnthropicClient, AnthropicConfig, ChatRequest, Completion, OpenAiClient, ToolCall,
};
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

/// Drives a busy group through 20 turns against a scripted model and returns every request
/// it was sent, in order: members taking turns mentioning the bot, chatter nobody
/// addressed to it between turns, a memory write (a tool call), a clock fire, a task notice
/// and a `/status` answered at intake. The wire format is left to the caller: the requests
/// are the runtime's, and each client's body is a pure function of them.
async fn busy_group_requests() -> Vec<ChatRequest> {
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

    let requests = llm.requests();
    assert!(
        requests.len() >= 21,
        "20 turns, one with a tool call: {}",
        requests.len()
    );
    requests
}

/// The consecutive pairs of turn requests, and how many pairs were skipped because one of
/// them is a compaction's summary request (whose body is a different conversation).
fn turn_pairs(requests: &[ChatRequest]) -> (Vec<(usize, &ChatRequest, &ChatRequest)>, usize) {
    let mut pairs = Vec::new();
    let mut compactions = 0;
    for (i, pair) in requests.windows(2).enumerate() {
        let (before, after) = (&pair[0], &pair[1]);
        if is_summary_request(before) || is_summary_request(after) {
            compactions += 1;
        } else {
            pairs.push((i + 1, before, after));
        }
    }
    (pairs, compactions)
}

#[tokio::test]
async fn a_busy_group_repeats_each_requests_conversation_byte_for_byte() {
    let chat = group_a();
    let requests = busy_group_requests().await;
    let (pairs, compactions) = turn_pairs(&requests);
    for (i, before, after) in pairs {
        let (a, b) = (
            OpenAiClient::request_bytes(before),
            OpenAiClient::request_bytes(after),
        );
        let end = conversation_end(&a);
        assert_eq!(
            String::from_utf8_lossy(&b[..end]),
            String::from_utf8_lossy(&a[..end]),
            "request {i} does not repeat its predecessor's conversation"
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

/// The parts of an Anthropic body that its prompt cache reads, in the cache's order: `tools`
/// and `system` as sent, and `messages` serialized with every content block's
/// `cache_control` removed. That marker moves to the newest user message each turn by
/// design (each request reads back the previous one's cached conversation and writes one
/// more turn); everything else must repeat for the read to hit.
fn anthropic_cached_parts(client: &AnthropicClient, request: &ChatRequest) -> (Vec<u8>, Vec<u8>) {
    let mut body = client.request_body(request);
    let fixed = serde_json::to_vec(&json!([body["tools"], body["system"]])).unwrap();
    let mut messages = body["messages"].take();
    for message in messages.as_array_mut().expect("a messages array") {
        for block in message["content"].as_array_mut().expect("content blocks") {
            block
                .as_object_mut()
                .expect("a content block")
                .remove("cache_control");
        }
    }
    (fixed, serde_json::to_vec(&messages).unwrap())
}

/// The same busy group in the Anthropic Messages body: each request's `tools` and `system`
/// are the previous request's byte for byte, and its messages (without the moving
/// `cache_control` markers) continue the previous request's messages. The markers
/// themselves stay within the API's four breakpoints and sit where the client documents.
#[tokio::test]
async fn a_busy_groups_anthropic_requests_repeat_the_cached_prefix() {
    let client = AnthropicClient::new(AnthropicConfig::default()).unwrap();
    let requests = busy_group_requests().await;
    let (pairs, compactions) = turn_pairs(&requests);
    for (i, before, after) in pairs {
        let (fixed_a, messages_a) = anthropic_cached_parts(&client, before);
        let (fixed_b, messages_b) = anthropic_cached_parts(&client, after);
        assert_eq!(
            String::from_utf8_lossy(&fixed_b),
            String::from_utf8_lossy(&fixed_a),
            "request {i} changes tools or system"
        );
        // The previous array without its closing bracket, then a comma: whole messages
        // added, none changed.
        let open = &messages_a[..messages_a.len() - 1];
        assert_eq!(
            String::from_utf8_lossy(&messages_b[..open.len().min(messages_b.len())]),
            String::from_utf8_lossy(open),
            "request {i} does not continue its predecessor's messages"
        );
        assert_eq!(messages_b[open.len()], b',', "request {i} adds messages");
    }
    for request in &requests {
        let body = client.request_body(request);
        let mut marked = Vec::new();
        for (at, blocks) in [("tools", &body["tools"]), ("system", &body["system"])] {
            let blocks = blocks.as_array().map_or(&[][..], Vec::as_slice);
            for (n, block) in blocks.iter().enumerate() {
                if block.get("cache_control").is_some() {
                    marked.push(format!("{at}/{n}/last={}", n + 1 == blocks.len()));
                }
            }
        }
        let messages = body["messages"].as_array().unwrap();
        let newest_user = messages.iter().rposition(|m| m["role"] == "user");
        for (m, message) in messages.iter().enumerate() {
            let blocks = message["content"].as_array().unwrap();
            for (n, block) in blocks.iter().enumerate() {
                if block.get("cache_control").is_some() {
                    assert_eq!(Some(m), newest_user, "a marker off the newest user message");
                    assert_eq!(n + 1, blocks.len(), "a marker before the last block");
                    marked.push(format!("messages/{m}/{n}"));
                }
            }
        }
        assert!(
            marked.len() <= 4,
            "more breakpoints than the API allows: {marked:?}"
        );
        if !is_summary_request(request) {
            assert_eq!(marked.len(), 3, "tools, system, conversation: {marked:?}");
            assert!(
                !marked.iter().any(|m| m.ends_with("last=false")),
                "{marked:?}"
            );
        }
    }
    println!("{} requests, {compactions} at a compaction", requests.len());
    assert_eq!(compactions, 0, "20 short turns need no compaction");
}

/// A chain whose primary is down (503 to everything) and whose fallback, model `backup`,
/// echoes; the two scripted models are returned to read their requests.
fn down_then_echo() -> (
    Arc<ScriptedLlm>,
    Arc<ScriptedLlm>,
    parlor_bot::llm::Failover,
) {
    use parlor_bot::llm::{Failover, Link, LlmError};
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
    (primary, fallback, chain)
}

/// A clock fire runs on the same failover chain as a mention: with the primary down, the
/// fallback answers it and the post goes out.
#[tokio::test]
async fn a_clock_fire_fails_over_like_a_mention() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (primary, fallback, chain) = down_then_echo();
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

/// A compaction's summary asks the agent's backend, so it runs on the chain too: with the
/// primary down, the fallback writes the summary.
#[tokio::test]
async fn a_summary_fails_over_like_a_mention() {
    use parlor_bot::agent::compact::SummaryInput;
    use parlor_bot::llm::{Message, Spend};
    let (primary, fallback, chain) = down_then_echo();
    let agent = Agent::new(
        Arc::new(chain),
        ToolRegistry::new(Vec::new()).unwrap(),
        "You are a helpful bot.",
        AgentConfig::default(),
    );
    let older = [
        Message::user("[alice] the picnic is on Saturday"),
        Message::assistant("noted"),
    ];
    let mut spent = Spend::default();
    let summary = agent
        .summarize(
            SummaryInput {
                session: "console:local",
                previous: None,
                older: &older,
                topic: None,
            },
            &mut spent,
            &tokio_util::sync::CancellationToken::new(),
        )
        .await
        .unwrap();
    assert!(summary.starts_with("reply: "), "{summary}");
    assert_eq!(primary.requests().len(), 1);
    assert!(is_summary_request(&primary.requests()[0]));
    assert_eq!(fallback.requests()[0].model, "backup");
    assert!(is_summary_request(&fallback.requests()[0]));
}
