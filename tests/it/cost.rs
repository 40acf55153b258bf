//! What a group costs, through the real `parlor run` with `[llm.prices]`: two members'
//! turns are priced by the model that answered, summed per chat and per member in the
//! store, and shown the same in `/status`, `/metrics` and `parlor usage`.

use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram, Reply};

use crate::support::{self, WAIT, alice, bob, config, daemon_command};

const GROUP: i64 = -100_123;

/// The price per million tokens: input $1, output $4, cache reads $0.25.
const PRICES: &str = "[llm.prices.\"gpt-4o-mini\"]\ninput = 1.0\noutput = 4.0\ncache_read = 0.25\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_are_priced_and_summed_per_chat_and_member_in_status_metrics_and_usage() {
    let llm = FakeLlm::start().await;
    // Alice's turn: 1000 prompt tokens (400 from the cache) and 100 out:
    // 600 × $1 + 400 × $0.25 + 100 × $4 per million = $0.0011.
    llm.push(Reply::text("Hi Alice.").usage(1000, 100).cached(400));
    // Bob's: 2000 in, 200 out: $0.0028.
    llm.push(Reply::text("Hi Bob.").usage(2000, 200));
    let telegram = FakeTelegram::start(support::TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(
        dir.path(),
        &telegram,
        &format!("[http]\nlisten = \"127.0.0.1:0\"\n{PRICES}"),
    );
    let mut daemon =
        DaemonProcess::spawn_polling(daemon_command(&config, &llm), &telegram, WAIT).await;
    for (who, text, sent) in [
        (alice(), "@parlor_bot hi", 1),
        (bob(), "@parlor_bot hey", 2),
    ] {
        telegram
            .group_message(GROUP, who, text)
            .mention_bot()
            .push();
        telegram.wait_for_sent(sent, WAIT).await.unwrap();
    }

    telegram.group_message(GROUP, alice(), "/status").push();
    let sent = telegram.wait_for_sent(3, WAIT).await.unwrap();
    let status = &sent[2].text;
    assert!(
        status.contains(
            "Tokens today (UTC): 3300 (cost $0.003900; 13% of prompt tokens read from the cache)"
        ),
        "{status}"
    );
    assert!(
        status.contains("Your tokens today, in every chat: 1100"),
        "{status}"
    );
    assert_eq!(llm.request_count(), 2, "/status asks no model");

    let addr = support::http_addr(&daemon).await;
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
    };
    let cost = value("parlor_llm_cost_usd_total{model=\"gpt-4o-mini\"}");
    assert!((cost - 0.0039).abs() < 1e-9, "{cost}");
    for (kind, tokens) in [
        ("prompt", 3000.0),
        ("completion", 300.0),
        ("cache_read", 400.0),
    ] {
        let series = format!("parlor_llm_tokens_total{{model=\"gpt-4o-mini\",kind=\"{kind}\"}}");
        assert_eq!(value(&series), tokens, "{kind}");
    }
    let exit = daemon.terminate(WAIT).await;
    assert!(exit.success(), "{}", daemon.log());

    // The store holds the same sums, per chat and per member.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_parlor"))
        .arg("--config")
        .arg(&config)
        .args(["usage", "--days", "1"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let today = chrono::Utc::now().date_naive().to_string();
    let chat = format!("telegram:{GROUP}");
    let has = |cells: &[&str]| {
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == cells)
    };
    assert!(
        has(&[&today, &chat, "2", "3300", "13%", "$0.003900"]),
        "{text}"
    );
    assert!(
        has(&[
            &today,
            "Alice",
            "(telegram:1001)",
            &chat,
            "1",
            "1100",
            "$0.001100"
        ]),
        "{text}"
    );
    assert!(
        has(&[
            &today,
            "Bob",
            "(telegram:1002)",
            &chat,
            "1",
            "2200",
            "$0.002800"
        ]),
        "{text}"
    );
    assert!(has(&["Total", "2", "3300", "$0.003900"]), "{text}");
}

/// A background sub-agent's tokens are spent while no turn of its chat runs: they count in
/// the chat's day and toward the member who started it, priced by the sub-agent's model,
/// once its chat's next commit (the result's notice turn) folds them in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_sub_agents_tokens_count_for_its_chat_and_its_starter() {
    let llm = FakeLlm::start().await;
    llm.respond_with(|body| {
        let last = parlor_testkit::last_user_text(body).unwrap_or_default();
        let sub_agent = body["messages"][0]["content"]
            .as_str()
            .is_some_and(|s| s.contains("You are a sub-agent"));
        let after_tool = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .is_some_and(|m| m["role"] == "tool");
        // The sub-agent: 1000 in, 100 out at cheap-model's $2 / $8 = $0.0028.
        if sub_agent {
            return Reply::text("Done: serde.").usage(1000, 100);
        }
        // Each of the chat's three requests: 100 in, 10 out at $1 / $4 = $0.00014.
        if last.contains("<SUBAGENT_RESULT>") {
            return Reply::text("The sub-agent says: serde.").usage(100, 10);
        }
        if after_tool {
            return Reply::text("A sub-agent is on it.").usage(100, 10);
        }
        Reply::tool_calls(vec![parlor_testkit::ToolCallSpec::new(
            "s1",
            "subagent",
            serde_json::json!({"task": "pick a serde crate", "run_in_background": true}),
        )])
        .usage(100, 10)
    });
    let telegram = FakeTelegram::start(support::TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "{PRICES}[llm.prices.\"cheap-model\"]\ninput = 2.0\noutput = 8.0\n\
         [toolsets]\nenabled = [\"time\", \"subagent\"]\n\
         [toolsets.subagent]\nmodel = \"cheap-model\"\n"
    );
    let config = config(dir.path(), &telegram, &extra);
    let mut daemon =
        DaemonProcess::spawn_polling(daemon_command(&config, &llm), &telegram, WAIT).await;
    telegram
        .group_message(GROUP, bob(), "@parlor_bot which serde crate?")
        .mention_bot()
        .push();
    let sent = telegram.wait_for_sent(2, WAIT).await.unwrap();
    assert_eq!(sent[1].text, "The sub-agent says: serde.");

    telegram.group_message(GROUP, bob(), "/status").push();
    let sent = telegram.wait_for_sent(3, WAIT).await.unwrap();
    let status = &sent[2].text;
    // 3 × 110 + 1100 tokens; 3 × $0.00014 + $0.0028.
    assert!(
        status.contains("Tokens today (UTC): 1430 (cost $0.003220;"),
        "{status}"
    );
    // Bob's turn (220 tokens) and the sub-agent he started; the notice turn is the chat's.
    assert!(
        status.contains("Your tokens today, in every chat: 1320"),
        "{status}"
    );
    let exit = daemon.terminate(WAIT).await;
    assert!(exit.success(), "{}", daemon.log());
}
