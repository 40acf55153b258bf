//! End-to-end tests of work the agent hands on, through `parlor run` against a fake Telegram
//! and a fake LLM: a background sub-agent whose result comes back into the group by
//! itself, a sub-agent on the failover chain, and skills loaded from folders, re-read on
//! `/reload` and SIGHUP.

use std::path::Path;

use serde_json::{Value, json};

use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram, Reply, ToolCallSpec};

use crate::support::{self, TOKEN, WAIT, alice, bob, config, daemon_command};

const GROUP: i64 = -100_123;

fn system_text(body: &Value) -> String {
    body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn last_role(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["role"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn is_sub_agent(body: &Value) -> bool {
    system_text(body).contains("You are a sub-agent")
}

async fn wait_log(daemon: &DaemonProcess, needle: &str) {
    daemon.wait_for_log(needle, WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_sub_agent_reports_back_into_the_group_by_itself() {
    let llm = FakeLlm::start().await;
    llm.respond_with(|body| {
        let last = parlor_testkit::last_user_text(body).unwrap_or_default();
        if last.contains(support::SENTINEL) {
            return Reply::text("noted");
        }
        if is_sub_agent(body) {
            return Reply::text("Compared: serde is the most used <by far> & stable.");
        }
        if last.contains("<SUBAGENT_RESULT>") {
            return Reply::text(format!("The comparison is done:\n{last}"));
        }
        if last_role(body) == "tool" {
            return Reply::text("A sub-agent is comparing them; I will post the result.");
        }
        Reply::tool_calls(vec![ToolCallSpec::new(
            "p1",
            "subagent",
            json!({
                "task": "compare serde, miniserde and nanoserde",
                "context": "the group writes a Rust daemon",
                "run_in_background": true
            }),
        )])
    });
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let extra = "[toolsets]\n\
        enabled = [\"todo_list\", \"time\", \"message\", \"memory\", \"clock\", \"subagent\"]\n\
        [toolsets.subagent]\nmodel = \"cheap-model\"\nmax_iterations = 4\n";
    let mut daemon = DaemonProcess::spawn_polling(
        daemon_command(&config(dir.path(), &telegram, extra), &llm),
        &telegram,
        WAIT,
    )
    .await;
    let asked = telegram
        .group_message(GROUP, bob(), "@parlor_bot compare the serde crates for us")
        .mention_bot()
        .push();
    let sent = telegram.wait_for_sent(2, WAIT).await.unwrap();
    assert_eq!(
        sent[0].text,
        "A sub-agent is comparing them; I will post the result."
    );
    assert_eq!(sent[0].reply_to_message_id, Some(asked));
    assert_eq!(sent[1].chat_id, GROUP);
    assert!(
        sent[1].text.starts_with("The comparison is done:"),
        "{}",
        sent[1].text
    );
    assert!(
        sent[1].text.contains("<status>completed</status>"),
        "{}",
        sent[1].text
    );

    let requests = llm.requests();
    let sub: Vec<_> = requests.iter().filter(|r| is_sub_agent(&r.body)).collect();
    assert_eq!(sub.len(), 1);
    assert_eq!(sub[0].model(), Some("cheap-model"));
    assert!(
        !sub[0].tool_names().contains(&"subagent".to_owned()),
        "no nesting"
    );
    assert!(sub[0].tool_names().contains(&"time_now".to_owned()));
    let task = sub[0].last_user_text().unwrap();
    assert!(
        task.contains("compare serde, miniserde and nanoserde"),
        "{task}"
    );
    assert!(
        !task.contains("compare the serde crates for us"),
        "nothing of the chat: {task}"
    );
    let main = requests.iter().find(|r| !is_sub_agent(&r.body)).unwrap();
    assert!(main.tool_names().contains(&"subagent".to_owned()));
    let notice = requests
        .iter()
        .filter_map(|r| r.last_user_text())
        .find(|t| t.contains("<SUBAGENT_RESULT>"))
        .unwrap();
    assert!(notice.contains("&lt;by far&gt; &amp; stable"), "{notice}");
    let sent = support::sentinel(&telegram, GROUP).await;
    assert_eq!(sent.len(), 3, "the result arrives once: {sent:?}");
    let status = daemon.terminate(WAIT).await;
    assert!(status.success(), "{}", daemon.log());
}

/// The daemon gives sub-agents the agent's backend, the failover chain of `[[llm.fallbacks]]`:
/// the primary answers the sub-agent's request with a 500 and the fallback's answer is the
/// sub-agent's, under the fallback's own model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agent_fails_over_to_the_fallback_when_the_primary_answers_500() {
    let primary = FakeLlm::start().await;
    primary.respond_with(|body| {
        if is_sub_agent(body) {
            return Reply::status(500);
        }
        let last = parlor_testkit::last_user_text(body).unwrap_or_default();
        if last.contains(support::SENTINEL) {
            return Reply::text("noted");
        }
        if last_role(body) == "tool" {
            let result = body["messages"]
                .as_array()
                .and_then(|m| m.last())
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default()
                .to_owned();
            return Reply::text(format!("the sub-agent said: {result}"));
        }
        Reply::tool_calls(vec![ToolCallSpec::new(
            "p1",
            "subagent",
            json!({"task": "compare serde and miniserde"}),
        )])
    });
    let backup = FakeLlm::start().await;
    backup.respond_with(|body| {
        if is_sub_agent(body) {
            Reply::text("answered by the backup")
        } else {
            Reply::status(503)
        }
    });
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "[toolsets]\n\
        enabled = [\"time\", \"message\", \"subagent\"]\n\
        [[llm.fallbacks]]\nmodel = \"backup-model\"\nbase_url = \"{}\"\n",
        backup.base_url()
    );
    let mut daemon = DaemonProcess::spawn_polling(
        daemon_command(&config(dir.path(), &telegram, &extra), &primary),
        &telegram,
        WAIT,
    )
    .await;
    telegram
        .group_message(GROUP, bob(), "@parlor_bot compare the serde crates")
        .mention_bot()
        .push();
    let sent = telegram.wait_for_sent(1, WAIT).await.unwrap();
    assert!(
        sent[0].text.starts_with("the sub-agent said:")
            && sent[0].text.contains("answered by the backup"),
        "{}\n{}",
        sent[0].text,
        daemon.log()
    );
    let asked: Vec<_> = primary
        .requests()
        .into_iter()
        .filter(|r| is_sub_agent(&r.body))
        .collect();
    assert_eq!(
        asked.len(),
        1,
        "the primary saw the sub-agent's request once"
    );
    let answered = backup.requests();
    assert_eq!(
        answered.len(),
        1,
        "only the sub-agent's request failed over"
    );
    assert!(is_sub_agent(&answered[0].body));
    assert_eq!(answered[0].model(), Some("backup-model"));
    let status = daemon.terminate(WAIT).await;
    assert!(status.success(), "{}", daemon.log());
}

fn write_skill(dir: &Path, name: &str, description: &str, body: &str) {
    std::fs::create_dir_all(dir.join(name)).unwrap();
    std::fs::write(
        dir.join(name).join("SKILL.md"),
        format!("---\nname: {name}\ndescription: {description}\n---\n{body}\n"),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_from_a_folder_is_followed_and_reload_and_sighup_pick_up_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let skills = dir.path().join("skills");
    write_skill(
        &skills,
        "welcome",
        "How to welcome a new member of the group.",
        "Greet them with the phrase in phrases.md.",
    );
    std::fs::write(
        skills.join("welcome/phrases.md"),
        "Welcome aboard, friend!\n",
    )
    .unwrap();

    let llm = FakeLlm::start().await;
    llm.respond_with(|body| {
        let last_tool = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .filter(|m| m["role"] == "tool")
            .and_then(|m| m["content"].as_str())
            .map(|c| serde_json::from_str::<Value>(c).unwrap_or_default());
        match last_tool {
            None => Reply::tool_calls(vec![ToolCallSpec::new(
                "s1",
                "skill",
                json!({"name": "welcome"}),
            )]),
            Some(r) if r["data"]["instructions"].is_string() => {
                Reply::tool_calls(vec![ToolCallSpec::new(
                    "s2",
                    "skill_read",
                    json!({"name": "welcome", "path": r["data"]["resources"][0]}),
                )])
            }
            Some(r) => Reply::text(r["data"]["text"].as_str().unwrap_or("no text").trim()),
        }
    });
    let telegram = FakeTelegram::start(TOKEN).await;
    // Relative to the config file's folder.
    let extra = "admins = [\"telegram:1001\"]\n[toolsets.skill]\ndirs = [\"skills\"]\n";
    let mut daemon = DaemonProcess::spawn_polling(
        daemon_command(&config(dir.path(), &telegram, extra), &llm),
        &telegram,
        WAIT,
    )
    .await;
    telegram
        .group_message(GROUP, bob(), "@parlor_bot carol just joined, welcome her")
        .mention_bot()
        .push();
    let sent = telegram.wait_for_sent(1, WAIT).await.unwrap();
    assert_eq!(sent[0].text, "Welcome aboard, friend!");
    let first = &llm.requests()[0];
    let prompt = system_text(&first.body);
    assert!(
        prompt.contains("- welcome: How to welcome a new member of the group."),
        "{prompt}"
    );
    assert!(
        !prompt.contains("phrases.md"),
        "the body is not in the prompt"
    );

    // A new skill; a member may not reload, an operator may.
    write_skill(&skills, "farewell", "How to say goodbye.", "Wave.");
    std::fs::create_dir_all(skills.join("broken")).unwrap();
    std::fs::write(skills.join("broken/SKILL.md"), "no frontmatter here").unwrap();
    telegram
        .group_message(GROUP, bob(), "/reload")
        .command("/reload")
        .push();
    let sent = telegram.wait_for_sent(2, WAIT).await.unwrap();
    assert_eq!(sent[1].text, "Only an operator of the bot may /reload.");
    telegram
        .group_message(GROUP, alice(), "/reload")
        .command("/reload")
        .push();
    let sent = telegram.wait_for_sent(3, WAIT).await.unwrap();
    assert!(
        sent[2]
            .text
            .starts_with("Reloaded.\nskills: 2 skills loaded (farewell, welcome); 1 skipped:"),
        "{}",
        sent[2].text
    );
    assert!(sent[2].text.contains("broken/SKILL.md"), "{}", sent[2].text);
    telegram
        .group_message(GROUP, bob(), "@parlor_bot say hi")
        .mention_bot()
        .push();
    telegram.wait_for_sent(4, WAIT).await.unwrap();
    let requests = llm.requests();
    let prompt = system_text(&requests.last().unwrap().body);
    assert!(
        prompt.contains("- farewell: How to say goodbye."),
        "{prompt}"
    );

    // SIGHUP does the same (systemctl reload).
    write_skill(
        &skills,
        "agenda",
        "How to post the meeting agenda.",
        "List it.",
    );
    let pid = daemon.child.id().unwrap();
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    wait_log(
        &daemon,
        "SIGHUP: reloaded: skills: 3 skills loaded (agenda, farewell, welcome)",
    )
    .await;
    let status = daemon.terminate(WAIT).await;
    assert!(status.success(), "{}", daemon.log());
}
