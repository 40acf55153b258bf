//! The LLM fault matrix (issue 13): the real `parlor run` binary against `FakeLlm` and
//! `FakeTelegram` on 127.0.0.1, one test per way the model server can fail. Each fault ends
//! in a reply or in a short notice in the chat (never silence, never the provider's error
//! text or the key), and the next mention in the same chat gets a normal answer.

use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram, Reply, TgUser, ToolCallSpec};
use serde_json::json;

use crate::support::{self, TOKEN, WAIT};

const API_KEY: &str = "sk-test-faults-0123456789";
const GROUP: i64 = -100_777;

/// A daemon serving one group, with the fakes it talks to.
struct Rig {
    llm: Option<FakeLlm>,
    telegram: FakeTelegram,
    _dir: tempfile::TempDir,
    daemon: DaemonProcess,
}

/// `llm_lines` go into `[llm]` (which already holds `max_retries = 0` unless they set it).
async fn rig(llm_lines: &str) -> Rig {
    let llm = FakeLlm::start().await;
    let url = llm.base_url();
    rig_at(Some(llm), &url, llm_lines).await
}

async fn rig_at(llm: Option<FakeLlm>, base_url: &str, llm_lines: &str) -> Rig {
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let retries = if llm_lines.contains("max_retries") {
        ""
    } else {
        "max_retries = 0\n"
    };
    let config = format!(
        "[bot]\ndata_dir = \"{data}\"\nshutdown_grace_secs = 1\n\
         [llm]\n{retries}{llm_lines}\n\
         [telegram]\napi_url = \"{api}\"\npoll_timeout_secs = 1\n",
        data = dir.path().join("data").display(),
        api = telegram.api_url(),
    );
    let path = dir.path().join("config.toml");
    std::fs::write(&path, config).unwrap();
    let command = support::parlor_command(&path, base_url, API_KEY);
    let daemon = DaemonProcess::spawn_polling(command, &telegram, WAIT).await;
    Rig {
        llm,
        telegram,
        _dir: dir,
        daemon,
    }
}

impl Rig {
    fn llm(&self) -> &FakeLlm {
        self.llm.as_ref().unwrap()
    }

    /// Alice mentions the bot with `text`; returns the text of the one reply it gets.
    async fn ask(&self, text: &str) -> String {
        let before = self.telegram.sent_messages().len();
        let id = self
            .telegram
            .group_message(
                GROUP,
                TgUser::new(1001, "Alice"),
                format!("@parlor_bot {text}"),
            )
            .mention_bot()
            .push();
        let sent = self
            .telegram
            .wait_for_sent(before + 1, WAIT)
            .await
            .unwrap_or_else(|e| panic!("no reply to {text:?}: {e}\n{}", self.log()));
        let reply = &sent[before];
        assert_eq!(reply.chat_id, GROUP);
        assert_eq!(reply.reply_to_message_id, Some(id), "{}", reply.text);
        reply.text.clone()
    }

    /// After the fault: the next mention is answered by the model as usual.
    async fn recovers(&self) {
        let reply = self.ask("still there?").await;
        assert!(reply.starts_with("fine: "), "{reply}\n{}", self.log());
        assert!(reply.ends_with("still there?"), "{reply}");
    }

    /// The daemon's stderr so far, without colour codes.
    fn log(&self) -> String {
        let log = self.daemon.log();
        let mut plain = String::with_capacity(log.len());
        let mut chars = log.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                chars.by_ref().find(|&c| c == 'm');
            } else {
                plain.push(c);
            }
        }
        plain
    }
}

/// Once the script is used up the model answers `fine: <the user's text>`.
fn answer_normally(llm: &FakeLlm) {
    llm.respond_with(|body| {
        let last = parlor_testkit::last_user_text(body).unwrap_or_default();
        Reply::text(format!("fine: {last}"))
    });
}

/// What a failed turn tells the chat: one or two short sentences, no error dump, no key.
fn assert_notice(text: &str, says: &str) {
    assert!(text.starts_with("Sorry, "), "{text}");
    assert!(text.contains(says), "{text:?} should say {says:?}");
    assert!(text.chars().count() <= 160, "too long: {text}");
    for leak in [API_KEY, "{", "error_code", "fake llm", "Bearer"] {
        assert!(!text.contains(leak), "{text:?} contains {leak:?}");
    }
}

/// The content of the tool messages of the latest request, in order.
fn tool_results(llm: &FakeLlm) -> Vec<String> {
    llm.last_request()
        .unwrap()
        .messages()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

// 1 ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_refused_is_told_and_the_chat_recovers_when_the_model_is_back() {
    // A loopback port with nothing listening on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut rig = rig_at(None, &format!("http://127.0.0.1:{port}/v1"), "").await;

    let reply = rig.ask("hello?").await;
    assert_notice(&reply, "could not reach the language model");

    let llm = FakeLlm::start_at(port).await;
    answer_normally(&llm);
    rig.llm = Some(llm);
    rig.recovers().await;
}

// 2 ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_is_retried_and_the_retry_answers() {
    let rig = rig("max_retries = 1").await;
    rig.llm().push(Reply::status(500));
    answer_normally(rig.llm());

    assert_eq!(
        rig.ask("once more").await,
        "fine: Alice (telegram:1001): @parlor_bot once more"
    );
    assert_eq!(rig.llm().request_count(), 2, "one failure, one retry");
    rig.recovers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_that_persists_is_told_as_a_server_error_without_its_body() {
    let rig = rig("").await;
    rig.llm().push(Reply::status(500).body(json!({"error": {
        "message": format!("upstream exploded; key {API_KEY}"),
        "type": "server_error",
    }})));
    answer_normally(rig.llm());

    let reply = rig.ask("hello").await;
    assert_notice(&reply, "server error (HTTP 500)");
    assert!(!reply.contains("upstream exploded"), "{reply}");
    assert!(!rig.log().contains(API_KEY), "the key reached the log");
    rig.recovers().await;
}

// 3 ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_is_waited_out_and_answered() {
    let rig = rig("max_retries = 1").await;
    rig.llm().push(Reply::status(429).retry_after(1));
    answer_normally(rig.llm());

    assert!(rig.ask("busy?").await.starts_with("fine: "));
    assert_eq!(rig.llm().request_count(), 2);
    assert!(
        rig.log().contains("delay_ms=1000"),
        "the retry waited Retry-After:\n{}",
        rig.log()
    );
    rig.recovers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_without_retry_after_backs_off_and_is_answered() {
    let rig = rig("max_retries = 1").await;
    rig.llm().push(Reply::status(429));
    answer_normally(rig.llm());

    assert!(rig.ask("busy?").await.starts_with("fine: "));
    assert_eq!(rig.llm().request_count(), 2);
    rig.recovers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_left_after_the_retries_is_told_as_rate_limiting() {
    let rig = rig("").await;
    rig.llm().push(Reply::status(429).retry_after(30));
    answer_normally(rig.llm());

    assert_notice(&rig.ask("busy?").await, "rate-limiting");
    rig.recovers().await;
}

// 4 ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_inside_an_event_is_told_as_broken_off() {
    let rig = rig("").await;
    rig.llm()
        .push(Reply::text("The answer is forty-").cut_mid_event());
    answer_normally(rig.llm());

    let reply = rig.ask("what is the answer?").await;
    assert_notice(&reply, "broke off mid-answer");
    assert!(!reply.contains("forty"), "half an answer was sent: {reply}");
    rig.recovers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_inside_an_event_is_retried_like_a_broken_connection() {
    let rig = rig("max_retries = 1").await;
    rig.llm()
        .push(Reply::text("The answer is forty-").cut_mid_event());
    answer_normally(rig.llm());

    assert!(rig.ask("what is the answer?").await.starts_with("fine: "));
    assert_eq!(rig.llm().request_count(), 2);
}

// 5 ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_never_ends_is_ended_by_the_idle_timeout() {
    let rig = rig("idle_timeout_secs = 1").await;
    rig.llm().push(Reply::text("I am thinking").then_stall());
    answer_normally(rig.llm());

    assert_notice(&rig.ask("think hard").await, "did not answer in time (1s)");
    rig.recovers().await;
}

// 6 ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_json_in_a_chunk_is_told_as_unreadable() {
    let rig = rig("").await;
    rig.llm().push(Reply::raw_sse(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"}}]}\n\n\
         data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"there\"}]\n\n\
         data: [DONE]\n\n",
    ));
    answer_normally(rig.llm());

    assert_notice(&rig.ask("hi").await, "could not read");
    rig.recovers().await;
}

// 7 ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_cut_off_by_the_length_limit_is_not_run_and_the_model_is_told() {
    let rig = rig("").await;
    rig.llm().push(
        Reply::tool_calls(vec![ToolCallSpec::raw(
            "call_1",
            "time_now",
            "{\"timezone\": \"Europe/Be",
        )])
        .finish_reason("length"),
    );
    rig.llm()
        .push_text("Sorry, my answer got too long; which city did you mean?");
    answer_normally(rig.llm());

    assert_eq!(
        rig.ask("what time is it in Berlin?").await,
        "Sorry, my answer got too long; which city did you mean?"
    );
    let results = tool_results(rig.llm());
    assert_eq!(results.len(), 1);
    assert!(results[0].contains("INVALID_ARGUMENTS"), "{}", results[0]);
    assert!(results[0].contains("length limit"), "{}", results[0]);
    rig.recovers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_answer_cut_off_by_the_length_limit_says_so() {
    let rig = rig("").await;
    rig.llm()
        .push(Reply::text("The first three reasons are: one, two").finish_reason("length"));
    answer_normally(rig.llm());

    let reply = rig.ask("list the reasons").await;
    assert!(
        reply.starts_with("The first three reasons are: one, two"),
        "{reply}"
    );
    assert!(reply.contains("cut off"), "{reply}");
    rig.recovers().await;
}

// 8 ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_arguments_that_are_not_json_become_an_error_the_model_answers() {
    let rig = rig("").await;
    rig.llm()
        .push_tool_call_raw("call_1", "time_now", "timezone=UTC please");
    rig.llm().push_text("I could not look the time up, sorry.");
    answer_normally(rig.llm());

    assert_eq!(
        rig.ask("what time is it?").await,
        "I could not look the time up, sorry."
    );
    let results = tool_results(rig.llm());
    assert!(results[0].contains("INVALID_ARGUMENTS"), "{}", results[0]);
    rig.recovers().await;
}

// 9 ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_tool_becomes_an_error_naming_the_real_ones() {
    let rig = rig("").await;
    rig.llm()
        .push_tool_call("call_1", "launch_rockets", json!({"count": 3}));
    rig.llm().push_text("I have no such tool.");
    answer_normally(rig.llm());

    assert_eq!(rig.ask("launch the rockets").await, "I have no such tool.");
    let results = tool_results(rig.llm());
    assert!(results[0].contains("TOOL_NOT_FOUND"), "{}", results[0]);
    assert!(results[0].contains("time_now"), "{}", results[0]);
    rig.recovers().await;
}

// 10 -----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_call_over_and_over_is_stopped_after_the_configured_repeats() {
    let rig = rig("max_identical_tool_calls = 2").await;
    for i in 1..=3 {
        // The same arguments, written differently: still the same call.
        let args = if i % 2 == 0 {
            "{ \"timezone\" : \"UTC\" }"
        } else {
            "{\"timezone\":\"UTC\"}"
        };
        rig.llm()
            .push_tool_call_raw(format!("call_{i}"), "time_now", args);
    }
    answer_normally(rig.llm());

    let reply = rig.ask("what time is it?").await;
    assert!(reply.starts_with("I stopped"), "{reply}");
    assert!(reply.contains("time_now"), "{reply}");
    assert_eq!(
        rig.llm().request_count(),
        3,
        "the third identical call ended the turn"
    );

    rig.recovers().await;
    // The next turn shows the model what became of its last call.
    let results = tool_results(rig.llm());
    assert_eq!(results.len(), 3);
    assert!(results[2].contains("REPEATED_CALL"), "{}", results[2]);
}

// 11 -----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_answer_is_told_as_empty() {
    let rig = rig("").await;
    rig.llm().push(Reply::text(""));
    answer_normally(rig.llm());

    let reply = rig.ask("hello").await;
    assert!(reply.contains("empty answer"), "{reply}");
    assert!(reply.contains("ask again"), "{reply}");
    rig.recovers().await;
}

// 12 -----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_length_error_is_retried_once_without_the_older_history() {
    let rig = rig("").await;
    answer_normally(rig.llm());
    assert!(rig.ask("first question").await.starts_with("fine: "));
    assert!(rig.ask("second question").await.starts_with("fine: "));

    rig.llm().push(Reply::context_length_exceeded());
    let reply = rig.ask("third question").await;
    assert!(reply.starts_with("fine: "), "{reply}");
    assert!(reply.contains("too long for the model"), "{reply}");
    assert!(reply.contains("summarized its older part"), "{reply}");
    let requests = rig.llm().requests();
    // The refused request, the summary of its older half (tools off), the retry.
    assert_eq!(requests.len(), 5);
    assert!(
        requests[3].tool_names().is_empty(),
        "a summarizer does not act"
    );
    assert!(format!("{:?}", requests[3].body).contains("first question"));
    let refused = requests[2].messages().len();
    let retried = requests[4].messages().len();
    assert!(retried < refused, "{retried} < {refused}");
    assert!(!user_texts(&requests[4]).contains("first question"));

    // What was dropped stays dropped (its summary stands in for it): the next turn does
    // not send it again.
    rig.recovers().await;
    let last = rig.llm().last_request().unwrap();
    assert!(!user_texts(&last).contains("first question"));
    assert!(user_texts(&last).contains("third question"));
    assert!(!format!("{:?}", last.messages()[0]).contains("conversation_summary"));
    assert!(format!("{:?}", last.messages()).contains("<conversation_summary"));
}

/// The text of a request's user messages, for what the conversation itself still holds.
fn user_texts(request: &parlor_testkit::RecordedRequest) -> String {
    request
        .messages()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| {
            // What the conversation holds, not the summary quoted in front of it.
            let text = m["content"].to_string();
            match text.split_once("</conversation_summary>") {
                Some((_, rest)) => rest.to_owned(),
                None => text,
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_length_error_that_persists_tells_the_chat_to_reset() {
    let rig = rig("").await;
    answer_normally(rig.llm());
    assert!(rig.ask("first question").await.starts_with("fine: "));

    // The request, both attempts at summarizing its older half, and the one retry.
    for _ in 0..4 {
        rig.llm().push(Reply::context_length_exceeded());
    }
    let reply = rig.ask("a very long question").await;
    assert_notice(&reply, "too long for the language model");
    assert!(reply.contains("/reset"), "{reply}");
    assert_eq!(rig.llm().request_count(), 5, "one retry, not more");
    rig.recovers().await;
}

// Failover -----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_is_down_hands_the_mention_to_the_fallback() {
    let backup = FakeLlm::start().await;
    backup.respond_with(|body| {
        let last = parlor_testkit::last_user_text(body).unwrap_or_default();
        Reply::text(format!("backup: {last}"))
    });
    let rig = rig(&format!(
        "[[llm.fallbacks]]\nmodel = \"backup-model\"\nbase_url = \"{}\"\n",
        backup.base_url()
    ))
    .await;
    rig.llm().respond_with(|_| Reply::status(503));

    let reply = rig.ask("anyone?").await;
    assert_eq!(
        reply,
        "backup: Alice (telegram:1001): @parlor_bot anyone?",
        "{}",
        rig.log()
    );
    assert_eq!(rig.llm().request_count(), 1, "the primary was asked first");
    let asked = backup.requests();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].model(), Some("backup-model"));
    assert_eq!(
        asked[0].authorization(),
        None,
        "the main key never goes to another host"
    );

    // /status says which model gave the last answer.
    let before = rig.telegram.sent_messages().len();
    rig.telegram
        .group_message(GROUP, TgUser::new(1001, "Alice"), "/status")
        .push();
    let sent = rig.telegram.wait_for_sent(before + 1, WAIT).await.unwrap();
    assert!(
        sent[before].text.contains("(last answer by backup-model)"),
        "{}",
        sent[before].text
    );

    // A request the provider refuses as such is not sent elsewhere.
    rig.llm().respond_with(|_| Reply::status(400));
    let reply = rig.ask("too long?").await;
    assert_notice(&reply, "refused the request (HTTP 400)");
    assert_eq!(backup.requests().len(), 1, "no failover on a 400");
}

// A local model ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_model_slower_to_begin_than_every_other_limit_answers_the_first_turn() {
    // The fake is on 127.0.0.1, a local server: it may read the prompt for minutes. Here it
    // takes 3 s, three times the idle and request limits, and is asked once.
    let rig = rig("max_retries = 3\nidle_timeout_secs = 1\nrequest_timeout_secs = 1").await;
    rig.llm().respond_with(|body| {
        let last = parlor_testkit::last_user_text(body).unwrap_or_default();
        Reply::text(format!("fine: {last}")).delay(std::time::Duration::from_secs(3))
    });
    let reply = rig.ask("slowly").await;
    assert_eq!(
        reply,
        "fine: Alice (telegram:1001): @parlor_bot slowly",
        "{}",
        rig.log()
    );
    assert_eq!(rig.llm().request_count(), 1, "not sent again while it read");
}
