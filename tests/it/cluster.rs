//! `parlor run` daemons on one PostgreSQL database with `[cluster]`: one polls Telegram (the
//! poll lease), each may run chats (chat leases). When the polling daemon is killed
//! with SIGKILL mid-turn, the other takes the poll and the chats over once the leases
//! expire: every question is answered once. Skipped without PostgreSQL (a failure under
//! `PARLOR_REQUIRE_POSTGRES=1`, as in CI).

use std::time::Duration;

use parlor_bot::testing::PgCluster;
use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram, Reply};

use crate::support::{self, TOKEN, WAIT, alice, config, daemon_command, echo};

const GROUPS: [i64; 3] = [-100_701, -100_702, -100_703];

const CLUSTER: &str = "[store]\nbackend = \"postgres\"\n\
    [cluster]\nenabled = true\nlease_ttl_secs = 2\nsweep_interval_ms = 100\n";

fn command(
    dir: &std::path::Path,
    name: &str,
    llm: &FakeLlm,
    telegram: &FakeTelegram,
    url: &str,
) -> tokio::process::Command {
    let extra = format!("{CLUSTER}instance = \"{name}\"\n[http]\nlisten = \"127.0.0.1:0\"\n");
    let mut command = daemon_command(&config(dir, telegram, &extra), llm);
    command.env("PARLOR_DATABASE_URL", url);
    command
}

/// How many of the messages sent in `chat` reply to message `id`.
fn replies_to(telegram: &FakeTelegram, chat: i64, id: i64) -> usize {
    telegram
        .sent_messages()
        .iter()
        .filter(|m| m.chat_id == chat && m.reply_to_message_id == Some(id))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_daemons_poll_and_chats_go_to_the_other_and_each_question_is_answered_once() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let url = cluster.database();
    let telegram = FakeTelegram::start(TOKEN).await;
    let llm_a = FakeLlm::start().await;
    for _ in GROUPS {
        llm_a.push(Reply::text("answered by a"));
    }
    // A's next turn never ends: A is killed in the middle of it.
    llm_a.push(Reply::text("never sent").delay(Duration::from_secs(600)));
    let llm_b = FakeLlm::start().await;
    echo(&llm_b);
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = DaemonProcess::spawn_polling(
        command(dir_a.path(), "a", &llm_a, &telegram, &url),
        &telegram,
        WAIT,
    )
    .await;
    let mut first = Vec::new();
    for chat in GROUPS {
        let id = telegram
            .group_message(chat, alice(), "@parlor_bot first")
            .mention_bot()
            .push();
        first.push((chat, id));
    }
    for &(chat, id) in &first {
        telegram
            .wait_for_sent_where(WAIT, |m| {
                m.chat_id == chat && m.reply_to_message_id == Some(id)
            })
            .await
            .unwrap();
    }
    // B starts once A holds the three chats (alone, A's share has no limit).
    let mut b = DaemonProcess::spawn(command(dir_b.path(), "b", &llm_b, &telegram, &url));
    b.wait_for_log("another instance holds the lease", WAIT)
        .await;
    assert_eq!(
        llm_b.request_count(),
        0,
        "A took the chats it received first"
    );
    // Past the send window (docs/operating.md): every reply is marked sent.
    crate::postgres::unsent_outbox_empties(&url).await;

    let interrupted = telegram
        .group_message(GROUPS[0], alice(), "@parlor_bot second")
        .mention_bot()
        .push();
    llm_a
        .wait_for_requests(GROUPS.len() + 1, WAIT)
        .await
        .unwrap();
    a.kill9().await;

    let mut second = vec![(GROUPS[0], interrupted)];
    for chat in &GROUPS[1..] {
        let id = telegram
            .group_message(*chat, alice(), "@parlor_bot second")
            .mention_bot()
            .push();
        second.push((*chat, id));
    }
    // B takes the poll and, once A's leases expired, the chats.
    for &(chat, id) in &second {
        telegram
            .wait_for_sent_where(WAIT, |m| {
                m.chat_id == chat && m.reply_to_message_id == Some(id)
            })
            .await
            .unwrap();
    }
    for chat in GROUPS {
        support::sentinel(&telegram, chat).await;
    }
    for &(chat, id) in first.iter().chain(&second) {
        assert_eq!(
            replies_to(&telegram, chat, id),
            1,
            "chat {chat}, message {id}"
        );
    }
    assert!(
        telegram
            .sent_messages()
            .iter()
            .all(|m| m.text != "never sent")
    );
    // B says what it took: on /readyz and in /metrics.
    let addr = support::http_addr(&b).await;
    let get = |path: &str| {
        let url = format!("http://{addr}{path}");
        async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
    };
    let ready = get("/readyz").await;
    assert!(ready.contains("instance b-"), "{ready}");
    assert!(ready.contains("3 taken over"), "{ready}");
    let metrics = get("/metrics").await;
    assert!(
        metrics.contains("parlor_chat_lease_takeovers_total 3"),
        "{metrics}"
    );
    let status = b.terminate(WAIT).await;
    assert!(status.success(), "{}", b.log());
}

/// Whether `text` (an echoed reply) carries question `n`: merged questions come back
/// together, one turn for a burst, in one reply.
fn carries(text: &str, n: usize) -> bool {
    let needle = format!("question {n}");
    text.match_indices(&needle).any(|(at, _)| {
        !text[at + needle.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

/// Three daemons on one database under steady traffic, restarted one after the other
/// (SIGTERM, then started again): each lets its chats and the poll go as it stops, the
/// others answer meanwhile, and every question is answered exactly once (alone, or merged
/// with others of its chat into one turn). The longest wait for an answer is printed, not
/// asserted (a slow machine must not fail it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_three_daemons_under_traffic_loses_and_doubles_nothing() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let url = cluster.database();
    let telegram = std::sync::Arc::new(FakeTelegram::start(TOKEN).await);
    let llm = FakeLlm::start().await;
    echo(&llm);
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let names = ["a", "b", "c"];
    let start = |i: usize| {
        DaemonProcess::spawn(command(
            dirs[i].path(),
            names[i],
            &llm,
            telegram.as_ref(),
            &url,
        ))
    };
    let mut daemons: Vec<DaemonProcess> = (0..3).map(start).collect();
    for daemon in &daemons {
        daemon
            .wait_for_log("sharing the store with other daemons", WAIT)
            .await;
    }

    let chats: Vec<i64> = (0..6).map(|i| -100_800 - i).collect();
    type Asked = Vec<(i64, usize, std::time::Instant)>;
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Asked::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let traffic = {
        let (telegram, asked, stop, chats) =
            (telegram.clone(), asked.clone(), stop.clone(), chats.clone());
        tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.is_cancelled() {
                let chat = chats[n % chats.len()];
                telegram
                    .group_message(chat, alice(), format!("@parlor_bot question {n}"))
                    .mention_bot()
                    .push();
                asked
                    .lock()
                    .unwrap()
                    .push((chat, n, std::time::Instant::now()));
                n += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    // When each question's answer was first seen (50 ms resolution).
    let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::<
        usize,
        std::time::Instant,
    >::new()));
    let watching = tokio_util::sync::CancellationToken::new();
    let watcher = {
        let (telegram, seen, asked, watching) = (
            telegram.clone(),
            seen.clone(),
            asked.clone(),
            watching.clone(),
        );
        tokio::spawn(async move {
            while !watching.is_cancelled() {
                let now = std::time::Instant::now();
                let sent = telegram.sent_messages();
                let asked = asked.lock().unwrap().clone();
                {
                    let mut seen = seen.lock().unwrap();
                    for &(chat, n, _) in &asked {
                        if sent
                            .iter()
                            .any(|m| m.chat_id == chat && carries(&m.text, n))
                        {
                            seen.entry(n).or_insert(now);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let mut old_logs = Vec::new();
    for (i, daemon) in daemons.iter_mut().enumerate() {
        let status = daemon.terminate(WAIT).await;
        assert!(status.success(), "{}", daemon.log());
        old_logs.push(daemon.log());
        *daemon = start(i);
        daemon
            .wait_for_log("sharing the store with other daemons", WAIT)
            .await;
        // Some traffic on the new set before the next one goes.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.cancel();
    traffic.await.unwrap();

    let asked = asked.lock().unwrap().clone();
    for &(chat, n, _) in &asked {
        telegram
            .wait_for_sent_where(WAIT, |m| m.chat_id == chat && carries(&m.text, n))
            .await
            .unwrap_or_else(|e| {
                let mut logs = old_logs.clone();
                logs.extend(daemons.iter().map(DaemonProcess::log));
                panic!(
                    "chat {chat}: question {n} unanswered: {e:?}\n{}",
                    logs.join("\n----\n")
                )
            });
    }
    for &chat in &chats {
        support::sentinel(telegram.as_ref(), chat).await;
    }
    watching.cancel();
    watcher.await.unwrap();
    let sent = telegram.sent_messages();
    for &(chat, n, _) in &asked {
        let answers = sent
            .iter()
            .filter(|m| m.chat_id == chat && carries(&m.text, n))
            .count();
        assert_eq!(answers, 1, "chat {chat}, question {n}");
    }
    let seen = seen.lock().unwrap().clone();
    let longest = asked
        .iter()
        .filter_map(|(_, n, at)| seen.get(n).map(|answered| answered.duration_since(*at)))
        .max()
        .unwrap_or_default();
    println!(
        "rolling restart: {} questions in {} chats, each answered once; longest wait for an \
         answer {longest:?}",
        asked.len(),
        chats.len()
    );
    for daemon in &mut daemons {
        let status = daemon.terminate(WAIT).await;
        assert!(status.success(), "{}", daemon.log());
    }
}

/// Discord's gateway in two shards on two daemons: the first takes both while alone, lets
/// one go when the second starts (each then holds its share, one), and the second takes both
/// once the first is killed. A server's messages arrive on its own shard, whichever daemon
/// holds it, and each mention is answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_split_discords_shards_and_one_takes_both_when_the_other_dies() {
    use parlor_testkit::{DiscordUser, FakeDiscord};
    const DISCORD_TOKEN: &str = "discord-shard-token";
    // Shard (id >> 22) % 2: 0 and 1.
    const GUILDS: [(u64, u64); 2] = [(5, 6), ((1 << 22) + 5, (1 << 22) + 6)];
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let url = cluster.database();
    let telegram = FakeTelegram::start(TOKEN).await;
    let discord = FakeDiscord::start(DISCORD_TOKEN).await;
    discord.set_shards(2);
    for (guild, channel) in GUILDS {
        discord.guild(guild, 1);
        discord.text_channel(guild, channel);
    }
    let llm = FakeLlm::start().await;
    echo(&llm);
    let start = |dir: &std::path::Path, name: &str| {
        let mut command = command(dir, name, &llm, &telegram, &url);
        let path = dir.join("config.toml");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&format!(
            "[discord]\napi_url = \"{}\"\nshards = 2\n",
            discord.api_url()
        ));
        std::fs::write(&path, text).unwrap();
        command.env("DISCORD_BOT_TOKEN", DISCORD_TOKEN);
        DaemonProcess::spawn(command)
    };
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = start(dir_a.path(), "a");
    discord.wait_for_all_shards(WAIT).await.unwrap();
    let shards_of = |daemon: &DaemonProcess| {
        daemon
            .log()
            .matches("connecting a shard of the Discord gateway")
            .count()
    };
    assert_eq!(shards_of(&a), 2, "alone, A runs both shards");

    let b = start(dir_b.path(), "b");
    b.wait_for_log("connecting a shard of the Discord gateway", WAIT)
        .await;
    a.wait_for_log("over this daemon's share", WAIT).await;
    // Discord keeps no events for a closed connection: what comes while a shard changes
    // hands is lost, so the test asks once the handover is over.
    a.wait_for_log("went to another instance", WAIT).await;
    discord.wait_for_all_shards(WAIT).await.unwrap();
    assert_eq!(shards_of(&b), 1, "B took one shard, its share");

    let dana = DiscordUser::new(77, "dana");
    let ask = |channel: u64, guild: u64| {
        discord
            .message(channel, &dana, "hello shard")
            .guild(guild)
            .mention_bot()
            .push()
    };
    let mut asked: Vec<(u64, String)> = GUILDS
        .iter()
        .map(|&(guild, channel)| (channel, ask(channel, guild)))
        .collect();
    if let Err(e) = discord.wait_for_sent(2, WAIT).await {
        panic!("{e:?}\n--- a ---\n{}\n--- b ---\n{}", a.log(), b.log());
    }

    a.kill9().await;
    // Once A's leases expired, B's share is both shards.
    let deadline = std::time::Instant::now() + WAIT;
    while shards_of(&b) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "B never took A's shard:\n{}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    discord.wait_for_all_shards(WAIT).await.unwrap();
    for &(guild, channel) in &GUILDS {
        asked.push((channel, ask(channel, guild)));
    }
    discord.wait_for_sent(4, WAIT).await.unwrap();
    let sent = discord.sent_messages();
    for (channel, id) in &asked {
        let replies = sent
            .iter()
            .filter(|m| m.channel_id == channel.to_string() && m.reply_to().as_ref() == Some(id))
            .count();
        assert_eq!(replies, 1, "channel {channel}, message {id}");
    }
    let mut b = b;
    let status = b.terminate(WAIT).await;
    assert!(status.success(), "{}", b.log());
}
