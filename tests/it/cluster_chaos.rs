//! Chaos across several daemons: three `parlor run` on one PostgreSQL database with
//! `[cluster]`, against the fake Telegram (in webhook mode, each update POSTed to a random
//! daemon as a load balancer would, and retried on another when it gets no 200; or in long
//! polling, where only the poll lease's holder polls) and one fake model per daemon. While
//! members of many groups mention the bot, ask for clock one-shots and background commands
//! (`chaos.rs` makes the traffic and the model), daemons are killed with SIGKILL and started
//! again, or stopped with SIGSTOP for longer than a lease lives and woken (a paused owner:
//! the others take its chats, and its late commits must be refused). After a settle with
//! all three up it checks what `chaos.rs` checks (every mention answered once, a repeat only
//! inside the send window, every due time fired once, every notice told once, nothing left
//! pending or unsent) and, from the model's side, that when a chat ran in two daemons at
//! once (one of them paused past its lease, or too starved to renew it) only one of the two
//! turns took effect. Those overlaps and the fenced commits (a woken daemon's refused turns,
//! counted from the logs) are printed.
//!
//! `PARLOR_CHAOS_EVENTS` sets how many kills and pauses (default 8); `PARLOR_CHAOS_SEED`
//! replays a run's choices. Skipped without PostgreSQL (a failure under
//! `PARLOR_REQUIRE_POSTGRES=1`, as in CI).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use parlor_bot::store::{PgStore, StoreOptions};
use parlor_bot::testing::{PgCluster, SplitMix as Rng};
use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram, telegram::SECRET_HEADER};
use tokio_util::sync::CancellationToken;

use crate::chaos::{self, Model, Traffic};
use crate::support::{TOKEN, WAIT, config, daemon_command};

const DAEMONS: usize = 3;
/// The lease's life: long enough for a loaded CI machine's heartbeat, short enough that a
/// pause past it is a few seconds.
const LEASE_SECS: u64 = 2;
const SECRET: &str = "cluster-chaos-secret_0123";
const PATH_SECRET: &str = "c7a1e9d04b2f6a83e15d";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Webhook,
    Polling,
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// One daemon's place: its directory, config, model and listener port (the same for every
/// life, as a machine behind a load balancer keeps its address).
struct Slot {
    _dir: tempfile::TempDir,
    config: std::path::PathBuf,
    llm: FakeLlm,
    port: u16,
    daemon: Option<DaemonProcess>,
    /// When it was paused (SIGSTOP), if it is.
    paused: Option<Instant>,
}

impl Slot {
    async fn new(i: usize, mode: Mode, telegram: &FakeTelegram, model: &Arc<Mutex<Model>>) -> Slot {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let extra = format!(
            "{}[store]\nbackend = \"postgres\"\n[cluster]\nenabled = true\ninstance = \"d{i}\"\n\
             lease_ttl_secs = {LEASE_SECS}\nsweep_interval_ms = 100\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
            chaos::EXTRA
        );
        let config = config(dir.path(), telegram, &extra);
        if mode == Mode::Webhook {
            // `[telegram]` is the file's last section.
            let mut text = std::fs::read_to_string(&config).unwrap();
            text.push_str(&format!(
                "webhook_url = \"http://127.0.0.1:{port}/telegram/{PATH_SECRET}\"\n"
            ));
            std::fs::write(&config, text).unwrap();
        }
        let llm = FakeLlm::start().await;
        chaos::script(&llm, model, i);
        Slot {
            _dir: dir,
            config,
            llm,
            port,
            daemon: None,
            paused: None,
        }
    }

    async fn start(&mut self, url: &str) {
        let mut command = daemon_command(&self.config, &self.llm);
        command
            .env("PARLOR_DATABASE_URL", url)
            .env("TELEGRAM_WEBHOOK_SECRET", SECRET);
        let daemon = DaemonProcess::spawn(command);
        daemon
            .wait_for_log("sharing the store with other daemons", WAIT)
            .await;
        self.daemon = Some(daemon);
    }

    fn signal(&self, signal: &str) {
        let pid = self.daemon.as_ref().and_then(|d| d.child.id()).unwrap();
        let sent = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status();
        assert!(sent.is_ok_and(|s| s.success()), "cannot send {signal}");
    }
}

/// Which slots are up and awake: where webhook updates may go.
type Up = Arc<Mutex<Vec<bool>>>;

/// POSTs `update` to a random daemon that is up, as a load balancer would, and to another
/// when it gets no 200 (a daemon killed or paused meanwhile); Telegram retries the same.
async fn deliver(update: serde_json::Value, ports: Vec<u16>, up: Up, mut rng: Rng) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(1500))
        .no_proxy()
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let choices: Vec<usize> = {
            let up = up.lock().unwrap();
            (0..ports.len()).filter(|&i| up[i]).collect()
        };
        if !choices.is_empty() {
            let port = ports[choices[rng.below(choices.len())]];
            let answer = client
                .post(format!("http://127.0.0.1:{port}/telegram/{PATH_SECRET}"))
                .header(SECRET_HEADER, SECRET)
                .json(&update)
                .send()
                .await;
            if answer.is_ok_and(|a| a.status().is_success()) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no daemon took update {update}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_in_webhook_mode_killed_and_paused_at_random_lose_and_double_nothing() {
    run(Mode::Webhook).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_in_polling_mode_killed_and_paused_at_random_lose_and_double_nothing() {
    run(Mode::Polling).await;
}

async fn run(mode: Mode) {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let url = cluster.database();
    let events = chaos::env_u64("PARLOR_CHAOS_EVENTS").unwrap_or(8);
    let seed = chaos::env_u64("PARLOR_CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    println!(
        "cluster chaos ({mode:?}): seed {seed} (PARLOR_CHAOS_SEED={seed} replays it), {events} events"
    );
    let begun = Instant::now();
    let model = Arc::new(Mutex::new(Model::new(seed)));
    let telegram = Arc::new(FakeTelegram::start(TOKEN).await);
    let mut slots = Vec::new();
    for i in 0..DAEMONS {
        slots.push(Slot::new(i, mode, &telegram, &model).await);
    }
    for slot in &mut slots {
        slot.start(&url).await;
    }
    let ports: Vec<u16> = slots.iter().map(|s| s.port).collect();
    let up: Up = Arc::new(Mutex::new(vec![true; DAEMONS]));
    let traffic = Arc::new(Mutex::new(Traffic::default()));

    // The members: a message every 20-80 ms until told to stop.
    let stop = CancellationToken::new();
    let members = {
        let (telegram, traffic, up, ports, stop) = (
            Arc::clone(&telegram),
            Arc::clone(&traffic),
            Arc::clone(&up),
            ports.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let mut rng = Rng(seed ^ 0x7AFF);
            let mut serial = 0u64;
            let mut deliveries = Vec::new();
            while !stop.is_cancelled() {
                let message =
                    chaos::next_message(&mut rng, &mut traffic.lock().unwrap(), &mut serial);
                match mode {
                    Mode::Polling => chaos::push(&telegram, message),
                    Mode::Webhook => {
                        let builder =
                            telegram.group_message(message.group, message.user, message.text);
                        let update = if message.mention {
                            builder.mention_bot().webhook_update()
                        } else {
                            builder.webhook_update()
                        };
                        deliveries.push(tokio::spawn(deliver(
                            update,
                            ports.clone(),
                            Arc::clone(&up),
                            Rng(rng.next_u64()),
                        )));
                    }
                }
                tokio::time::sleep(Duration::from_millis(rng.range(20, 80))).await;
            }
            for delivery in deliveries {
                delivery.await.unwrap();
            }
        })
    };

    // The operator's bad day: kills and pauses, never of the last daemon awake.
    let mut rng = Rng(seed);
    let mut moments: Vec<Instant> = Vec::new();
    let mut pauses: Vec<(usize, Instant, Instant)> = Vec::new();
    let mut kills: Vec<(usize, Instant)> = Vec::new();
    let mut logs = String::new();
    for event in 0..events {
        tokio::time::sleep(Duration::from_millis(rng.range(300, 2000))).await;
        let awake: Vec<usize> = (0..DAEMONS).filter(|&i| up.lock().unwrap()[i]).collect();
        let i = awake[rng.below(awake.len())];
        let slot = &mut slots[i];
        up.lock().unwrap()[i] = false;
        let at = Instant::now();
        moments.push(at);
        if rng.chance(50) {
            let mut daemon = slot.daemon.take().unwrap();
            daemon.kill9().await;
            kills.push((i, at));
            logs.push_str(&format!(
                "--- d{i}, killed at event {event} ---\n{}",
                daemon.log()
            ));
            tokio::time::sleep(Duration::from_millis(rng.range(0, 2500))).await;
            slot.start(&url).await;
        } else {
            slot.signal("-STOP");
            slot.paused = Some(at);
            // Past the lease: the others take its chats (and its poll) meanwhile.
            tokio::time::sleep(Duration::from_millis(
                LEASE_SECS * 1000 + rng.range(500, 2500),
            ))
            .await;
            slot.signal("-CONT");
            slot.paused = None;
            pauses.push((i, at, Instant::now()));
        }
        up.lock().unwrap()[i] = true;
    }
    stop.cancel();
    members.await.unwrap();

    // Settle: all three up, until every mention is answered and it has been quiet a while.
    let settle_by = Instant::now() + Duration::from_secs(120);
    let requests = |slots: &[Slot]| slots.iter().map(|s| s.llm.request_count()).sum::<usize>();
    let mut quiet_since = (Instant::now(), requests(&slots), 0usize);
    loop {
        let sent = telegram.sent_messages();
        let answered =
            chaos::unanswered(&traffic.lock().unwrap(), &sent, &model.lock().unwrap()).is_empty();
        let now = (requests(&slots), sent.len());
        if now != (quiet_since.1, quiet_since.2) {
            quiet_since = (Instant::now(), now.0, now.1);
        }
        if answered && quiet_since.0.elapsed() > Duration::from_secs(7) {
            break;
        }
        if Instant::now() >= settle_by {
            let missing =
                chaos::unanswered(&traffic.lock().unwrap(), &sent, &model.lock().unwrap());
            for slot in &slots {
                logs.push_str(&format!(
                    "--- settle ---\n{}",
                    slot.daemon.as_ref().unwrap().log()
                ));
            }
            panic!("the run did not settle (seed {seed}): unanswered {missing:?}; logs:\n{logs}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (i, slot) in slots.iter_mut().enumerate() {
        let mut daemon = slot.daemon.take().unwrap();
        let exit = daemon.terminate(WAIT).await;
        logs.push_str(&format!("--- d{i}, last life ---\n{}", daemon.log()));
        assert!(
            exit.success(),
            "seed {seed}: d{i} did not stop cleanly\n{logs}"
        );
    }

    let store = PgStore::open(&url, StoreOptions::default()).unwrap();
    let all_requests: Vec<_> = slots.iter().flat_map(|s| s.llm.requests()).collect();
    let model = model.lock().unwrap();
    let traffic = traffic.lock().unwrap();
    let paused: Vec<(Instant, Instant)> = pauses.iter().map(|&(_, from, to)| (from, to)).collect();
    let mut report = chaos::check(
        &store,
        &telegram,
        &all_requests,
        &model,
        &traffic,
        &moments,
        &paused,
    );
    let (paused_overlaps, starved_overlaps) = overlaps(
        &model,
        &traffic,
        &telegram,
        &kills,
        &pauses,
        &mut report.problems,
    );
    let fenced = logs.matches("(fenced)").count();
    if !report.problems.is_empty() {
        panic!(
            "seed {seed}: {} problem(s):\n{}\n\nlogs:\n{logs}",
            report.problems.len(),
            report.problems.join("\n")
        );
    }
    assert!(!logs.contains("panicked"), "seed {seed}: {logs}");
    println!(
        "cluster chaos figures ({mode:?}): seed {seed}, {} kills, {} pauses, {} mentions, {} \
         turns answered by the model, {} replies sent, {} duplicate sends inside the window, 0 \
         outside, clocks {} (fired {} once), {} background notices once, turns run while \
         another daemon still ran the chat: {paused_overlaps} after a pause, {starved_overlaps} \
         after a missed renewal (never both sent), {fenced} fenced commits, {:.1}s",
        kills.len(),
        pauses.len(),
        report.mentions,
        report.turns,
        report.replies,
        report.in_window,
        report.clocks,
        report.clocks_fired,
        report.notices,
        begun.elapsed().as_secs_f64(),
    );
}

/// A turn as the model saw it: one daemon's requests for one chat, up to its final answer.
#[derive(Debug)]
struct Turn {
    slot: usize,
    from: Instant,
    to: Instant,
    /// Its last request.
    last: Instant,
    reply: Option<u64>,
}

/// The first kill of `slot` after `from` and before `to`.
fn killed_between(
    kills: &[(usize, Instant)],
    slot: usize,
    from: Instant,
    to: Instant,
) -> Option<Instant> {
    kills
        .iter()
        .filter(|(s, at)| *s == slot && *at > from && *at < to)
        .map(|(_, at)| *at)
        .min()
}

/// Finds the moments two daemons ran one chat at once: a request from one while a turn of
/// the other was open. That happens only to a daemon that lost the chat's lease (paused
/// past it, or too starved to renew it) while its turn ran; at most one of the two turns
/// may have had its answer sent. Returns how many there were: with the older daemon
/// paused, and otherwise.
fn overlaps(
    model: &Model,
    traffic: &Traffic,
    telegram: &FakeTelegram,
    kills: &[(usize, Instant)],
    pauses: &[(usize, Instant, Instant)],
    problems: &mut Vec<String>,
) -> (usize, usize) {
    let sent: BTreeSet<u64> = telegram
        .sent_messages()
        .iter()
        .filter_map(|m| {
            m.text
                .strip_prefix("ack R")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    // The turns of each chat, by daemon, in order.
    let mut open: BTreeMap<(i64, usize), Turn> = BTreeMap::new();
    let mut turns: BTreeMap<i64, Vec<Turn>> = BTreeMap::new();
    let mut calls = model.calls.clone();
    calls.sort_by_key(|c| c.at);
    for call in &calls {
        let chats: BTreeSet<i64> = chaos::serials(&call.input)
            .iter()
            .filter_map(|n| traffic.groups.get(n).copied())
            .collect();
        let [chat] = chats.into_iter().collect::<Vec<_>>()[..] else {
            continue;
        };
        // A kill of this daemon since the open turn's last request ended that turn: this
        // request is a later life's.
        // A request that starts a turn ends the open one, which was cut short (cancelled
        // when its daemon found the chat taken).
        if let Some(turn) = open.get(&(chat, call.slot)) {
            let killed = killed_between(kills, call.slot, turn.last, call.at);
            if killed.is_some() || call.first {
                let mut turn = open.remove(&(chat, call.slot)).unwrap();
                turn.to = killed.map_or(turn.to, |k| turn.to.min(k));
                turns.entry(chat).or_default().push(turn);
            }
        }
        let turn = open.entry((chat, call.slot)).or_insert(Turn {
            slot: call.slot,
            from: call.at,
            to: call.done,
            last: call.at,
            reply: None,
        });
        turn.to = call.done;
        turn.last = call.at;
        if call.reply.is_some() {
            let mut turn = open.remove(&(chat, call.slot)).unwrap();
            turn.reply = call.reply;
            turns.entry(chat).or_default().push(turn);
        }
    }
    // A turn cut by a kill ends with it.
    for ((chat, _), mut turn) in open {
        if let Some(killed) = killed_between(kills, turn.slot, turn.last, Instant::now()) {
            turn.to = turn.to.min(killed);
        }
        turns.entry(chat).or_default().push(turn);
    }
    // A pause during the turn, or just before its first request: the daemon took the item
    // before the pause and its first request may leave as it wakes, before the turn sees
    // the lease gone (the commit is refused either way).
    let paused_in = |turn: &Turn| {
        pauses.iter().any(|(slot, from, to)| {
            *slot == turn.slot && *from <= turn.to && *to + Duration::from_millis(500) >= turn.from
        })
    };
    let mut counts = (0, 0);
    for (chat, list) in &turns {
        for a in list {
            for b in list {
                if a.slot == b.slot || !(a.from < b.from && b.from < a.to) {
                    continue;
                }
                if paused_in(a) {
                    counts.0 += 1;
                } else {
                    // A daemon too starved to renew in time (a loaded machine) lost the chat
                    // the same way; what matters is the same: only one of them took effect.
                    counts.1 += 1;
                }
                let both = [a.reply, b.reply]
                    .iter()
                    .flatten()
                    .filter(|r| sent.contains(r))
                    .count();
                if both > 1 {
                    problems.push(format!(
                        "chat {chat}: two daemons' overlapping turns were both sent: {a:?} {b:?}"
                    ));
                }
            }
        }
    }
    counts
}
