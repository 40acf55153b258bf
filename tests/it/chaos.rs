//! Chaos: the real `parlor run` against the fake Telegram and the fake LLM on 127.0.0.1,
//! killed with SIGKILL at seeded random moments and restarted on the same data directory,
//! while members of many groups mention the bot (each mention with a unique tag), the model
//! schedules clock one-shots due during the run and starts background shell tasks. After a
//! clean settle it checks what docs/operating.md (Reliability) claims:
//!
//! - every mention is answered: a reply covers every mention whose tag was in the input of
//!   the turn that produced it (merged turns count), none by two different answers;
//! - no reply is sent twice except in the documented window (a kill between Telegram
//!   accepting a send and parlor marking it sent), which is counted apart;
//! - every clock due time fired at most once, and is logged `ok`, `skipped`, `cancelled`,
//!   `failed` or `timed_out`, never left `started`;
//! - every background task's notice was answered once;
//! - no request to the model holds an assistant `tool_calls` entry without one tool message
//!   per call, in call order.
//!
//! `PARLOR_CHAOS_KILLS` sets how many kills (default 6, the CI size); `PARLOR_CHAOS_SEED`
//! replays a run's choices (the timing of a real process never replays exactly);
//! `PARLOR_CHAOS_DEBUG` prints every tool result the model received. The figures are the last
//! line the test prints. Clock due times are never `skipped` here: a due time at most the
//! clock's late tolerance (5 minutes) old still fires after a restart, and the daemon is never
//! down that long.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use parlor_bot::store::{SledStore, Store, StoreOptions};
// splitmix64: small, seeded, good enough to pick moments and messages.
use parlor_bot::testing::SplitMix as Rng;
use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram, Reply, SentMessage, ToolCallSpec};
use serde_json::{Value, json};

use crate::support::{self, TOKEN, WAIT, config, daemon_command};

pub(crate) const GROUPS: [i64; 8] = [
    -100_901, -100_902, -100_903, -100_904, -100_905, -100_906, -100_907, -100_908,
];
/// The longest a kill may come after Telegram accepted a send for the resend to count as the
/// documented window: marking a row sent is one flushed store write after the answer.
pub(crate) const WINDOW: Duration = Duration::from_secs(1);

pub(crate) fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// What one answer of the model (a final text, not a tool call) covered.
#[derive(Debug, Default, Clone)]
pub(crate) struct Answer {
    mentions: BTreeSet<String>,
    clocks: BTreeSet<u64>,
    tasks: BTreeSet<String>,
}

/// One request the model answered: which daemon (slot) asked, when, when the answer was
/// complete, the turn's input, and the reply id of a final answer.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) slot: usize,
    pub(crate) at: Instant,
    pub(crate) done: Instant,
    pub(crate) input: String,
    /// The first request of a turn (it ends with the turn's input, not tool results).
    pub(crate) first: bool,
    pub(crate) reply: Option<u64>,
}

/// The model's side of the run: every final answer by its reply id (`R<n>` in its text).
#[derive(Default)]
pub(crate) struct Model {
    pub(crate) answers: BTreeMap<u64, Answer>,
    pub(crate) calls: Vec<Call>,
    next: u64,
    rng: Option<Rng>,
}

impl Model {
    pub(crate) fn new(seed: u64) -> Self {
        Model {
            rng: Some(Rng(seed ^ 0x5EED)),
            ..Model::default()
        }
    }
}

/// The turn's input: the user messages before the tool rounds at the end of the request.
fn turn_input(body: &Value) -> String {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let mut end = messages.len();
    while end > 0 {
        let m = &messages[end - 1];
        let tool_round = m["role"] == "tool"
            || (m["role"] == "assistant"
                && m["tool_calls"].as_array().is_some_and(|c| !c.is_empty()));
        if !tool_round {
            break;
        }
        end -= 1;
    }
    let mut start = end;
    while start > 0 && messages[start - 1]["role"] == "user" {
        start -= 1;
    }
    messages[start..end]
        .iter()
        .map(|m| content_text(&m["content"]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Tokens like `m-00042` with the given prefix.
fn tags(text: &str, prefix: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|t| {
            t.len() == prefix.len() + 5
                && t.starts_with(prefix)
                && t[prefix.len()..].bytes().all(|b| b.is_ascii_digit())
        })
        .map(str::to_owned)
        .collect()
}

/// The ids in `(clock N)` of clock fire texts.
fn clock_ids(text: &str) -> BTreeSet<u64> {
    text.match_indices("(clock ")
        .filter_map(|(i, m)| {
            let digits: String = text[i + m.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .collect()
}

/// The ids in `<task_id>..</task_id>` of terminal notices.
fn task_ids(text: &str) -> BTreeSet<String> {
    text.split("<task_id>")
        .skip(1)
        .filter_map(|rest| rest.split("</task_id>").next())
        .map(str::to_owned)
        .collect()
}

/// The reply id `R<n>` in a sent text.
fn reply_id(text: &str) -> Option<u64> {
    let rest = text.strip_prefix("ack R")?;
    rest.split(' ').next()?.parse().ok()
}

/// The serial numbers a turn's input names: `m-`, `c-`, `b-` tags, and the `k` and `t`
/// tags a clock fire or a task notice carries (one number per member's message).
pub(crate) fn serials(text: &str) -> BTreeSet<u64> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter_map(|t| {
            let digits = t
                .strip_prefix("m-")
                .or_else(|| t.strip_prefix("c-"))
                .or_else(|| t.strip_prefix("b-"))
                .or_else(|| t.strip_prefix('k'))
                .or_else(|| t.strip_prefix('t'))?;
            (digits.len() == 5 && digits.bytes().all(|b| b.is_ascii_digit()))
                .then(|| digits.parse().ok())
                .flatten()
        })
        .collect()
}

/// The fake model: a clock or shell request in the turn's input becomes a tool call (one
/// per request, in one reply); after the tools, or without a request, a text answer
/// `ack R<n> ...` naming what it covers. Each reply comes after a seeded delay, so kills
/// land inside turns.
pub(crate) fn script(llm: &FakeLlm, model: &Arc<Mutex<Model>>, slot: usize) {
    let model = Arc::clone(model);
    llm.respond_with(move |body| {
        let at = Instant::now();
        let input = turn_input(body);
        let last_role = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .map(|m| m["role"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_default();
        let mut model = model.lock().unwrap();
        model.next += 1;
        let n = model.next;
        let rng = model.rng.as_mut().unwrap();
        let delay = Duration::from_millis(rng.range(0, 400));
        if last_role == "user" {
            let mut calls = Vec::new();
            for (k, tag) in tags(&input, "c-").into_iter().enumerate() {
                let due = chrono::Utc::now()
                    + chrono::Duration::milliseconds(rng.range(1500, 6000) as i64);
                let missed = if rng.chance(30) { "catch_up" } else { "skip" };
                calls.push(ToolCallSpec::new(
                    format!("call_{n}_c{k}"),
                    "clock_create",
                    json!({
                        "name": tag,
                        "schedule": due.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                        // Not a `c-` tag: the fire's turn must not schedule again.
                        "content": format!("ring k{}", &tag[2..]),
                        "missed": missed,
                    }),
                ));
            }
            for (k, tag) in tags(&input, "b-").into_iter().enumerate() {
                let ms = rng.range(200, 2500);
                calls.push(ToolCallSpec::new(
                    format!("call_{n}_b{k}"),
                    "shell",
                    json!({
                        "command": format!("sleep {}.{:03}; echo done", ms / 1000, ms % 1000),
                        "run_in_background": true,
                        // Not a `b-` tag: the notice's turn must not start another.
                        "description": format!("job t{}", &tag[2..]),
                    }),
                ));
            }
            if !calls.is_empty() {
                model.calls.push(Call {
                    slot,
                    at,
                    done: at + delay,
                    input,
                    first: true,
                    reply: None,
                });
                return Reply::tool_calls(calls).delay(delay);
            }
        }
        let answer = Answer {
            mentions: tags(&input, "m-"),
            clocks: clock_ids(&input),
            tasks: task_ids(&input),
        };
        let mut text = format!("ack R{n}");
        for m in &answer.mentions {
            text.push(' ');
            text.push_str(m);
        }
        model.answers.insert(n, answer);
        model.calls.push(Call {
            slot,
            at,
            done: at + delay,
            input,
            first: last_role == "user",
            reply: Some(n),
        });
        Reply::text(text).delay(delay)
    });
}

/// The run's config: the operator Alice, no rate limit to speak of, the shell unsandboxed.
pub(crate) const EXTRA: &str = r#"turns_per_minute = 1000
queue_capacity = 64
admins = ["telegram:1001"]
[terminal]
enabled = true
sandbox = "none"
max_background_per_session = 50
max_background_total = 200
"#;

/// Starts `parlor run` and waits until it polls Telegram.
async fn start(config: &Path, llm: &FakeLlm, telegram: &FakeTelegram) -> DaemonProcess {
    DaemonProcess::spawn_polling(daemon_command(config, llm), telegram, WAIT).await
}

/// What the members wrote: every mention's tag, and the clock and shell requests.
#[derive(Default)]
pub(crate) struct Traffic {
    pub(crate) mentions: Vec<String>,
    /// The group of each message's serial number.
    pub(crate) groups: BTreeMap<u64, i64>,
    clock_requests: usize,
    shell_requests: usize,
}

/// One member's message, to push to Telegram or deliver by webhook.
pub(crate) struct Message {
    pub(crate) group: i64,
    pub(crate) user: parlor_testkit::TgUser,
    pub(crate) text: String,
    pub(crate) mention: bool,
}

/// One message from a random member into a random group: mostly mentions, some chatter,
/// some asking for a clock one-shot or a background task.
pub(crate) fn next_message(rng: &mut Rng, traffic: &mut Traffic, serial: &mut u64) -> Message {
    *serial += 1;
    let n = *serial;
    let group = GROUPS[rng.range(0, GROUPS.len() as u64) as usize];
    traffic.groups.insert(n, group);
    let roll = rng.range(0, 100);
    if roll < 10 {
        return Message {
            group,
            user: support::bob(),
            text: format!("just chatting {n}"),
            mention: false,
        };
    }
    // Mentions come from the operator: a merged turn runs with the least role of its
    // senders, and the shell is for operators only.
    let tag = format!("m-{n:05}");
    let text = if roll < 20 {
        traffic.clock_requests += 1;
        format!("@parlor_bot {tag} remind us c-{n:05}")
    } else if roll < 28 {
        traffic.shell_requests += 1;
        format!("@parlor_bot {tag} run b-{n:05}")
    } else {
        format!("@parlor_bot hello {tag}")
    };
    traffic.mentions.push(tag);
    Message {
        group,
        user: support::alice(),
        text,
        mention: true,
    }
}

/// Queues `message` for `getUpdates`.
pub(crate) fn push(telegram: &FakeTelegram, message: Message) {
    let builder = telegram.group_message(message.group, message.user, message.text);
    if message.mention {
        builder.mention_bot().push();
    } else {
        builder.push();
    }
}

/// How one life of the daemon ends.
#[derive(Debug, Clone, Copy)]
enum Trigger {
    /// After a random time.
    After(Duration),
    /// Right after the model received `n` more requests (inside a turn).
    Requests(usize, Duration),
    /// Right after Telegram accepted `n` more sends (the window's side).
    Sends(usize),
}

fn pick_trigger(rng: &mut Rng) -> Trigger {
    match rng.range(0, 3) {
        0 => Trigger::After(Duration::from_millis(rng.range(200, 2500))),
        1 => Trigger::Requests(
            rng.range(1, 5) as usize,
            Duration::from_millis(rng.range(0, 60)),
        ),
        _ => Trigger::Sends(rng.range(1, 4) as usize),
    }
}

/// Pushes traffic until `trigger` fires (or a bound passes).
async fn live(
    telegram: &FakeTelegram,
    llm: &FakeLlm,
    trigger: Trigger,
    rng: &Mutex<Rng>,
    traffic: &Mutex<Traffic>,
    serial: &Mutex<u64>,
) {
    let started = Instant::now();
    let requests = llm.request_count();
    let sends = telegram.sent_messages().len();
    let bound = Duration::from_secs(8);
    loop {
        let fired = match trigger {
            Trigger::After(d) => started.elapsed() >= d,
            Trigger::Requests(n, _) => llm.request_count() >= requests + n,
            Trigger::Sends(n) => telegram.sent_messages().len() >= sends + n,
        };
        if fired || started.elapsed() >= bound {
            if let Trigger::Requests(_, d) = trigger {
                tokio::time::sleep(d).await;
            }
            return;
        }
        let pause = {
            let mut rng = rng.lock().unwrap();
            if rng.chance(35) {
                let mut traffic = traffic.lock().unwrap();
                let mut serial = serial.lock().unwrap();
                push(telegram, next_message(&mut rng, &mut traffic, &mut serial));
            }
            rng.range(5, 40)
        };
        // Polls the fakes' counters; the traffic itself is the reason for the pause.
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// The mentions no sent reply covers yet.
pub(crate) fn unanswered(traffic: &Traffic, sent: &[SentMessage], model: &Model) -> Vec<String> {
    let covered: BTreeSet<&String> = sent
        .iter()
        .filter_map(|s| reply_id(&s.text))
        .filter_map(|r| model.answers.get(&r))
        .flat_map(|a| a.mentions.iter())
        .collect();
    traffic
        .mentions
        .iter()
        .filter(|m| !covered.contains(m))
        .cloned()
        .collect()
}

/// A tool_calls entry not followed by exactly one tool message per call, in call order.
fn broken_tool_history(body: &Value) -> Option<String> {
    let messages = body["messages"].as_array()?;
    for (i, m) in messages.iter().enumerate() {
        let Some(calls) = m["tool_calls"].as_array().filter(|c| !c.is_empty()) else {
            continue;
        };
        let ids: Vec<&Value> = calls.iter().map(|c| &c["id"]).collect();
        let following: Vec<&Value> = messages[i + 1..]
            .iter()
            .take_while(|n| n["role"] == "tool")
            .map(|n| &n["tool_call_id"])
            .collect();
        // The last request of a turn may end with its tool results; none may be missing.
        if following != ids {
            return Some(format!(
                "message {i}: calls {ids:?}, tool results {following:?}"
            ));
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_loses_and_doubles_nothing() {
    let kills = env_u64("PARLOR_CHAOS_KILLS").unwrap_or(6);
    let seed = env_u64("PARLOR_CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    println!("chaos: seed {seed} (PARLOR_CHAOS_SEED={seed} replays it), {kills} kills");
    let begun = Instant::now();
    let rng = Mutex::new(Rng(seed));
    let model = Arc::new(Mutex::new(Model::new(seed)));
    let llm = FakeLlm::start().await;
    script(&llm, &model, 0);
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &telegram, EXTRA);
    let traffic = Mutex::new(Traffic::default());
    let serial = Mutex::new(0u64);
    let mut kill_times: Vec<Instant> = Vec::new();
    let mut logs = String::new();

    for life in 0..kills {
        let mut daemon = start(&config, &llm, &telegram).await;
        let trigger = pick_trigger(&mut rng.lock().unwrap());
        live(&telegram, &llm, trigger, &rng, &traffic, &serial).await;
        kill_times.push(Instant::now());
        daemon.kill9().await;
        logs.push_str(&format!("--- life {life} ({trigger:?}) ---\n"));
        logs.push_str(&daemon.log());
        // Now and then the daemon stays down a while: due times pass (skipped or caught
        // up), messages pile up in Telegram.
        let down = {
            let mut rng = rng.lock().unwrap();
            rng.chance(20)
                .then(|| Duration::from_millis(rng.range(1000, 4000)))
        };
        if let Some(down) = down {
            tokio::time::sleep(down).await;
        }
    }

    // Settle: one more life, no more messages, until every mention is answered and the
    // clocks and tasks had their time; then a clean stop.
    let daemon = start(&config, &llm, &telegram).await;
    let settle_by = Instant::now() + Duration::from_secs(90);
    let mut quiet_since = (Instant::now(), llm.request_count(), 0usize);
    loop {
        let sent = telegram.sent_messages();
        let answered =
            unanswered(&traffic.lock().unwrap(), &sent, &model.lock().unwrap()).is_empty();
        let now = (llm.request_count(), sent.len());
        if now != (quiet_since.1, quiet_since.2) {
            quiet_since = (Instant::now(), now.0, now.1);
        }
        // Clocks are due at most 6 s after they were made, tasks end within 2.5 s.
        if answered && quiet_since.0.elapsed() > Duration::from_secs(7) {
            break;
        }
        if Instant::now() >= settle_by {
            let missing = unanswered(&traffic.lock().unwrap(), &sent, &model.lock().unwrap());
            panic!(
                "the run did not settle (seed {seed}): unanswered {missing:?}; logs:\n{logs}\n--- settle ---\n{}",
                daemon.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A clean stop; its last log lines are read before it returns.
    let mut daemon = daemon;
    let exit = daemon.terminate(WAIT).await;
    logs.push_str("--- settle ---\n");
    logs.push_str(&daemon.log());
    assert!(exit.success(), "seed {seed}: {logs}");

    let store =
        SledStore::open(&dir.path().join("data").join("db"), StoreOptions::default()).unwrap();
    let report = check(
        &store,
        &telegram,
        &llm.requests(),
        &model.lock().unwrap(),
        &traffic.lock().unwrap(),
        &kill_times,
        &[],
    );
    let elapsed = begun.elapsed();
    if !report.problems.is_empty() {
        panic!(
            "seed {seed}: {} problem(s):\n{}\n\nlogs:\n{logs}",
            report.problems.len(),
            report.problems.join("\n")
        );
    }
    assert!(!logs.contains("panicked"), "seed {seed}: {logs}");
    println!(
        "chaos figures: seed {seed}, {kills} kills, {} mentions, {} model requests, {} turns \
         answered by the model, {} replies sent, {} duplicate sends inside the window (kill \
         {}ms at most after the accept), 0 outside, clocks {} (fired {} once, {} skipped, {} \
         cancelled, {} other), {} background notices once ({} tasks, {} interrupted), {:.1}s",
        report.mentions,
        report.requests,
        report.turns,
        report.replies,
        report.in_window,
        report.window_gap.as_millis(),
        report.clocks,
        report.clocks_fired,
        report.clocks_skipped,
        report.clocks_cancelled,
        report.clocks_other,
        report.notices,
        report.tasks,
        report.tasks_interrupted,
        elapsed.as_secs_f64(),
    );
}

#[derive(Default)]
pub(crate) struct Report {
    pub(crate) problems: Vec<String>,
    pub(crate) mentions: usize,
    pub(crate) requests: usize,
    pub(crate) turns: usize,
    pub(crate) replies: usize,
    pub(crate) in_window: usize,
    pub(crate) window_gap: Duration,
    pub(crate) clocks: usize,
    pub(crate) clocks_fired: usize,
    pub(crate) clocks_skipped: usize,
    pub(crate) clocks_cancelled: usize,
    pub(crate) clocks_other: usize,
    pub(crate) notices: usize,
    pub(crate) tasks: usize,
    pub(crate) tasks_interrupted: usize,
}

pub(crate) fn check(
    store: &dyn Store,
    telegram: &FakeTelegram,
    requests: &[parlor_testkit::RecordedRequest],
    model: &Model,
    traffic: &Traffic,
    kills: &[Instant],
    pauses: &[(Instant, Instant)],
) -> Report {
    let mut r = Report {
        mentions: traffic.mentions.len(),
        turns: model.answers.len(),
        ..Report::default()
    };
    r.requests = requests.len();
    if std::env::var_os("PARLOR_CHAOS_DEBUG").is_some() {
        for request in requests {
            if let Some(last) = request.messages().last().filter(|m| m["role"] == "tool") {
                println!("tool result: {}", last["content"]);
            }
        }
    }
    for (i, request) in requests.iter().enumerate() {
        if let Some(broken) = broken_tool_history(&request.body) {
            r.problems.push(format!("request {i}: {broken}"));
        }
    }

    // Sends by reply id; every copy after the first must follow a kill that came just
    // after the previous copy was accepted.
    let sent = telegram.sent_messages();
    r.replies = sent.len();
    let mut copies: BTreeMap<u64, Vec<&SentMessage>> = BTreeMap::new();
    for s in &sent {
        match reply_id(&s.text) {
            Some(id) => copies.entry(id).or_default().push(s),
            None => r
                .problems
                .push(format!("a send that is no answer: {:?}", s.text)),
        }
    }
    for (id, list) in &copies {
        for pair in list.windows(2) {
            let (first, again) = (pair[0].accepted_at, pair[1].accepted_at);
            // A send on the wire when the kill came is accepted just after it.
            let kill = kills
                .iter()
                .find(|&&k| k + Duration::from_millis(50) >= first);
            // A daemon stopped (SIGSTOP) with the send on the wire: the same window, however
            // long the pause.
            let paused = pauses
                .iter()
                .any(|&(from, to)| first + WINDOW >= from && first <= to + WINDOW && again > first);
            match kill {
                _ if paused => r.in_window += 1,
                Some(&k) if k < again && k.saturating_duration_since(first) <= WINDOW => {
                    r.in_window += 1;
                    r.window_gap = r.window_gap.max(k.saturating_duration_since(first));
                }
                _ => r.problems.push(format!(
                    "R{id} sent twice outside the window: {:?} then {:?}",
                    pair[0].text, pair[1].text
                )),
            }
        }
    }

    // Mentions: covered by exactly one distinct sent answer.
    let mut by_mention: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    let mut by_clock: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let mut by_task: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for id in copies.keys() {
        let Some(answer) = model.answers.get(id) else {
            r.problems
                .push(format!("R{id} was sent but never answered by the model"));
            continue;
        };
        for m in &answer.mentions {
            by_mention.entry(m).or_default().insert(*id);
        }
        for c in &answer.clocks {
            by_clock.entry(*c).or_default().insert(*id);
        }
        for t in &answer.tasks {
            by_task.entry(t).or_default().insert(*id);
        }
    }
    for m in &traffic.mentions {
        match by_mention.get(m.as_str()).map(BTreeSet::len).unwrap_or(0) {
            1 => {}
            0 => r.problems.push(format!("mention {m} never answered")),
            n => r.problems.push(format!(
                "mention {m} answered {n} times: {:?}",
                by_mention[m.as_str()]
            )),
        }
    }

    match store.pending() {
        Ok(p) if p.is_empty() => {}
        Ok(p) => r
            .problems
            .push(format!("{} inputs still pending after the settle", p.len())),
        Err(e) => r.problems.push(format!("pending: {e}")),
    }
    match store.unsent_outbox() {
        Ok(o) if o.is_empty() => {}
        Ok(o) => r
            .problems
            .push(format!("{} replies still unsent after the settle", o.len())),
        Err(e) => r.problems.push(format!("outbox: {e}")),
    }

    // Clocks: every one-shot due time at most one fire, one final run log entry.
    let runs: Vec<Value> = store
        .kv_scan("clock_runs", "")
        .unwrap()
        .into_iter()
        .map(|(_, v)| serde_json::from_str(&v).unwrap())
        .collect();
    for (_, task) in store.kv_scan("clocks", "").unwrap() {
        let task: Value = serde_json::from_str(&task).unwrap();
        let id = task["id"].as_u64().unwrap();
        r.clocks += 1;
        let mine: Vec<&Value> = runs.iter().filter(|run| run["task"] == id).collect();
        let fires = by_clock.get(&id).map(BTreeSet::len).unwrap_or(0);
        if fires > 1 {
            r.problems.push(format!(
                "clock {id} fired {fires} times: {:?}",
                by_clock[&id]
            ));
        }
        let statuses: Vec<&str> = mine.iter().filter_map(|m| m["status"].as_str()).collect();
        match statuses.as_slice() {
            ["ok"] if fires == 1 => r.clocks_fired += 1,
            ["skipped"] if fires == 0 => r.clocks_skipped += 1,
            // Cancelled by a kill after it was handed over: its input stayed pending and
            // was answered after the restart, or the turn had not started.
            ["cancelled"] if fires <= 1 => {
                r.clocks_cancelled += 1;
                if fires == 1 {
                    r.clocks_fired += 1;
                }
            }
            // Several daemons: fired in one, run by the chat's holder.
            ["handed_over"] if fires <= 1 => {
                r.clocks_other += 1;
                r.clocks_fired += fires;
            }
            ["failed" | "timed_out"] if fires <= 1 => {
                r.clocks_other += 1;
                r.clocks_fired += fires;
            }
            other => r.problems.push(format!(
                "clock {id} ({}): run log {other:?}, {fires} fire replies; task {task}",
                task["name"]
            )),
        }
    }

    // Background tasks: each notice answered once.
    for (_, row) in store.kv_scan("terminal_tasks", "").unwrap() {
        let row: Value = serde_json::from_str(&row).unwrap();
        let id = row["id"].as_str().unwrap();
        r.tasks += 1;
        if row["status"] == "interrupted" {
            r.tasks_interrupted += 1;
        }
        match by_task.get(id).map(BTreeSet::len).unwrap_or(0) {
            1 => r.notices += 1,
            n => r.problems.push(format!(
                "task {id} ({}) notice answered {n} times: {:?}; row {row}",
                row["status"],
                by_task.get(id)
            )),
        }
    }
    r
}
