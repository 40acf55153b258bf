//! The web tools end to end through `parlor run`: a mention, the model searches (the fake
//! SearXNG on 127.0.0.1, reached as the operator's configured provider), reads a result
//! (a fake page on 127.0.0.2, the one network `allow_networks` opens), and the reply
//! quotes the page. Every packet stays on loopback.

use std::net::Ipv4Addr;

use parlor_testkit::{
    DaemonProcess, FakeLlm, FakePage, FakeTelegram, FakeWeb, Reply, SearchHit, TgUser,
    ToolCallSpec, searxng_json,
};
use serde_json::{Value, json};

use crate::support::{TOKEN, WAIT, config, daemon_command};

const GROUP: i64 = -100_777;
const QUOTE: &str = "The lighthouse keeper logged 4,212 ships in 1911.";

/// The text of the last tool result in a chat-completions request.
fn last_tool_result(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "tool"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mention_searches_reads_a_result_and_quotes_the_page() {
    let search = FakeWeb::start().await;
    let site = FakeWeb::start_on(Ipv4Addr::new(127, 0, 0, 2)).await;
    let article = site.url("/history/lighthouse");
    site.page(
        "/history/lighthouse",
        FakePage::html(format!(
            "<html><head><title>The Old Lighthouse</title></head><body>\
             <nav><a href=\"/\">Home</a></nav><article><h1>The Old Lighthouse</h1>\
             <p>The lighthouse stood on the northern cape for two centuries, guiding the \
             fishing fleet home through fog and storm, and its logbooks survive.</p>\
             <p>{QUOTE} That was the busiest year the station ever recorded.</p></article>\
             </body></html>"
        )),
    );
    search.page(
        "/search",
        FakePage::json(&searxng_json(
            "old lighthouse ships 1911",
            &[SearchHit::new(
                "The Old Lighthouse",
                &article,
                "The lighthouse stood on the northern cape",
            )],
        )),
    );

    let llm = FakeLlm::start().await;
    llm.push(Reply::tool_calls(vec![ToolCallSpec::new(
        "c1",
        "web_search",
        json!({"query": "old lighthouse ships 1911"}),
    )]));
    {
        let article = article.clone();
        llm.respond_with(move |body| {
            let result = last_tool_result(body);
            if result.contains("<web_search_results") && result.contains(&article) {
                // The model reads the first result.
                Reply::tool_calls(vec![ToolCallSpec::new(
                    "c2",
                    "web_fetch",
                    json!({"url": article}),
                )])
            } else if let Some(at) = result.find("The lighthouse keeper") {
                let sentence: String = result[at..].chars().take_while(|c| *c != '.').collect();
                Reply::text(format!("According to the page: \"{sentence}.\""))
            } else {
                Reply::text(format!("unexpected: {result}"))
            }
        });
    }

    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let web_section = format!(
        "[toolsets.web]\nprovider = \"searxng\"\nsearxng_url = \"{}\"\nallow_networks = [\"127.0.0.2/32\"]\n",
        search.base_url()
    );
    let path = config(dir.path(), &telegram, &web_section);
    let mut daemon =
        DaemonProcess::spawn_polling(daemon_command(&path, &llm), &telegram, WAIT).await;

    let asked = telegram
        .group_message(
            GROUP,
            TgUser::new(1001, "Alice"),
            "@parlor_bot how busy was the old lighthouse in 1911?",
        )
        .mention_bot()
        .push();
    let sent = telegram.wait_for_sent(1, WAIT).await.unwrap();
    assert_eq!(
        sent[0].text,
        format!("According to the page: \"{QUOTE}\""),
        "{}",
        daemon.log()
    );
    assert_eq!(sent[0].reply_to_message_id, Some(asked));

    let queried = search.requests_to("/search");
    assert_eq!(queried.len(), 1);
    assert_eq!(queried[0].param("q"), Some("old lighthouse ships 1911"));
    assert_eq!(site.requests_to("/history/lighthouse").len(), 1);
    // The page reached the model fenced as untrusted content.
    let requests = llm.requests();
    let fetched = requests
        .iter()
        .map(|r| last_tool_result(&r.body))
        .find(|t| t.contains("<web_page"))
        .unwrap();
    assert!(
        fetched.contains("Untrusted content from the web"),
        "{fetched}"
    );
    assert!(fetched.contains("The Old Lighthouse"), "{fetched}");
    daemon.terminate(WAIT).await;
}
