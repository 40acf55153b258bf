//! `/metrics` of the real `parlor run` stays well-formed and bounded whatever tool names the
//! model invents: a name that tries to close its label and start a series of its own, and
//! a crowd of made-up names, all count as the one tool `unknown`.

use std::collections::HashSet;

use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram, Reply, TgUser, ToolCallSpec};

use crate::support::{self, WAIT, config, daemon_command};

const GROUP: i64 = -100_123;
const EVIL: &str = "x\"} 1\nparlor_evil{a=\"b";

/// One sample of the exposition: its name and labels.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
}

/// Parses the text exposition strictly: comments are `# HELP|TYPE|UNIT|EOF`; a sample is a
/// metric name of a family declared by `# TYPE` (with the type's suffixes), labels with
/// only the escapes the format knows, and a number. Panics at the first line that is not.
fn parse_strictly(text: &str) -> Vec<Sample> {
    let mut families: HashSet<String> = HashSet::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut words = rest.splitn(3, ' ');
            match words.next() {
                Some("TYPE") => {
                    families.insert(words.next().unwrap().to_owned());
                }
                Some("HELP" | "UNIT") => {}
                Some("EOF") if rest == "EOF" => {}
                _ => panic!("a bad comment: {line:?}"),
            }
            continue;
        }
        let name_end = line
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(line.len());
        let name = &line[..name_end];
        let declared = families.contains(name)
            || ["_total", "_bucket", "_sum", "_count", "_created"]
                .iter()
                .any(|s| name.strip_suffix(s).is_some_and(|f| families.contains(f)));
        assert!(declared, "a sample of no declared family: {line:?}");
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(inner) = rest.strip_prefix('{') {
            let mut chars = inner.char_indices().peekable();
            loop {
                let start = chars.peek().map(|(i, _)| *i).unwrap();
                if inner[start..].starts_with('}') {
                    rest = &inner[start + 1..];
                    break;
                }
                let eq = inner[start..].find('=').unwrap() + start;
                let key = &inner[start..eq];
                assert!(
                    !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "a bad label name {key:?} in {line:?}"
                );
                assert_eq!(&inner[eq + 1..eq + 2], "\"", "{line:?}");
                let mut value = String::new();
                let mut end = None;
                let mut escaped = false;
                for (i, c) in inner[eq + 2..].char_indices() {
                    match (escaped, c) {
                        (true, '\\' | '"') => {
                            value.push(c);
                            escaped = false;
                        }
                        (true, 'n') => {
                            value.push('\n');
                            escaped = false;
                        }
                        (true, _) => panic!("a bad escape in {line:?}"),
                        (false, '\\') => escaped = true,
                        (false, '"') => {
                            end = Some(eq + 2 + i + 1);
                            break;
                        }
                        (false, c) => value.push(c),
                    }
                }
                let end = end.unwrap_or_else(|| panic!("an unclosed label in {line:?}"));
                labels.push((key.to_owned(), value));
                chars = inner.char_indices().peekable();
                while chars.peek().is_some_and(|(i, _)| *i < end) {
                    chars.next();
                }
                if chars.peek().is_some_and(|(_, c)| *c == ',') {
                    chars.next();
                }
            }
        }
        let value = rest.strip_prefix(' ').unwrap_or_else(|| panic!("{line:?}"));
        let number = value.split(' ').next().unwrap();
        assert!(
            number.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&number),
            "a bad value in {line:?}"
        );
        samples.push(Sample {
            name: name.to_owned(),
            labels,
        });
    }
    samples
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_stay_well_formed_and_bounded_whatever_tool_names_the_model_invents() {
    let llm = FakeLlm::start().await;
    let mut calls = vec![ToolCallSpec::new("c0", EVIL, serde_json::json!({}))];
    for i in 1..=20 {
        calls.push(ToolCallSpec::new(
            format!("c{i}"),
            format!("made_up_{i}_{:x}", i * 7919),
            serde_json::json!({}),
        ));
    }
    llm.push(Reply::tool_calls(calls));
    llm.push(Reply::text("Tried."));
    let telegram = FakeTelegram::start(support::TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &telegram, "[http]\nlisten = \"127.0.0.1:0\"\n");
    let mut daemon =
        DaemonProcess::spawn_polling(daemon_command(&config, &llm), &telegram, WAIT).await;
    telegram
        .group_message(GROUP, TgUser::new(1001, "Alice"), "@parlor_bot try these")
        .mention_bot()
        .push();
    let sent = telegram.wait_for_sent(1, WAIT).await.unwrap();
    assert_eq!(sent[0].text, "Tried.", "{}", daemon.log());

    let addr = support::http_addr(&daemon).await;
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let samples = parse_strictly(&text);
    let tools: HashSet<&str> = samples
        .iter()
        .filter(|s| s.name == "parlor_tool_calls_total")
        .flat_map(|s| s.labels.iter())
        .filter(|(k, _)| k == "tool")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(tools, HashSet::from(["unknown"]), "{text}");
    assert!(!text.contains("parlor_evil"), "{text}");
    assert!(!text.contains("made_up"), "{text}");
    let exit = daemon.terminate(WAIT).await;
    assert!(exit.success(), "{}", daemon.log());
}
