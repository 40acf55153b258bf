//! `provider = "anthropic"` end to end: the real `parlor run` against `FakeAnthropic` and
//! `FakeTelegram` on 127.0.0.1. A mention runs a tool round trip over the Messages API and
//! its answer reaches the group; the key travels as `x-api-key`, the prompt prefix carries
//! cache breakpoints with the configured TTL, and the next turn replays the history.

use parlor_testkit::{AnthropicReply, DaemonProcess, FakeAnthropic, FakeTelegram, TgUser};
use serde_json::json;

use crate::support::{TOKEN, WAIT};

const KEY: &str = "sk-ant-test-0123456789";
const GROUP: i64 = -100_555;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_is_answered_through_the_messages_api_with_a_tool_round_trip() {
    let claude = FakeAnthropic::start().await;
    claude.push(AnthropicReply::text("Let me note that.").tool_use(
        "toolu_1",
        "memory_write",
        json!({"key": "picnic", "content": "Saturday at the lake"}),
    ));
    claude.push(AnthropicReply::text("Noted: the picnic is on Saturday."));
    claude.push(AnthropicReply::text("Saturday, at the lake."));
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[bot]\ndata_dir = \"{data}\"\nshutdown_grace_secs = 1\n\
         [llm]\nprovider = \"anthropic\"\nbase_url = \"{url}\"\nmodel = \"claude-test\"\n\
         cache_ttl = \"1h\"\nmax_retries = 0\n\
         [telegram]\napi_url = \"{api}\"\npoll_timeout_secs = 1\n",
        data = dir.path().join("data").display(),
        url = claude.base_url(),
        api = telegram.api_url(),
    );
    let path = dir.path().join("config.toml");
    std::fs::write(&path, config).unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_parlor"));
    command
        .arg("--config")
        .arg(&path)
        .arg("run")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TELEGRAM_BOT_TOKEN", TOKEN)
        .env("ANTHROPIC_API_KEY", KEY)
        .env("PARLOR_LOG", "info");
    let daemon = DaemonProcess::spawn_polling(command, &telegram, WAIT).await;

    let alice = TgUser::new(1001, "Alice");
    telegram
        .group_message(
            GROUP,
            alice.clone(),
            "@parlor_bot remember: picnic on Saturday",
        )
        .mention_bot()
        .push();
    let sent = telegram
        .wait_for_sent(1, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", daemon.log()));
    assert_eq!(sent[0].text, "Noted: the picnic is on Saturday.");

    let requests = claude.requests();
    assert_eq!(requests.len(), 2, "{}", daemon.log());
    let first = &requests[0];
    assert_eq!(first.path, "/v1/messages");
    assert_eq!(first.header("x-api-key"), Some(KEY));
    assert!(first.header("authorization").is_none());
    assert_eq!(first.body["model"], "claude-test");
    assert!(
        first.body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "memory_write")
    );
    let breakpoints = first.cache_breakpoints();
    assert!(!breakpoints.is_empty(), "{}", first.body);
    // The tool's result answers its call in the second request.
    let messages = requests[1].body["messages"].as_array().unwrap();
    let used = messages
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .find(|b| b["type"] == "tool_use")
        .expect("the tool call is replayed");
    assert_eq!(used["id"], "toolu_1");
    let result = messages
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .find(|b| b["type"] == "tool_result")
        .expect("its result follows");
    assert_eq!(result["tool_use_id"], "toolu_1");
    assert!(
        requests[0].body.to_string().contains("\"ttl\":\"1h\""),
        "{}",
        requests[0].body
    );

    // The next turn carries the conversation so far.
    telegram
        .group_message(GROUP, alice, "@parlor_bot when is the picnic?")
        .mention_bot()
        .push();
    let sent = telegram.wait_for_sent(2, WAIT).await.unwrap();
    assert_eq!(sent[1].text, "Saturday, at the lake.");
    let last = claude.requests().pop().unwrap();
    assert!(
        last.body["messages"]
            .to_string()
            .contains("Noted: the picnic is on Saturday."),
        "{}",
        last.body
    );
}
