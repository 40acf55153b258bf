//! The cost row: how much of a busy group's prompt a provider that caches exact prefixes
//! could serve from its cache. The real daemon runs 200 turns in one Telegram group
//! against the fake LLM, through the timing proxy, which keeps every request body as sent.
//! Four members take turns mentioning the bot, with chatter nobody addressed to it between
//! turns; every 25th turn asks it to remember something (a `memory_write` call, then the
//! answer), and twice an admin has it set a one-shot clock task, whose fire is a turn of
//! its own.
//!
//! For each request, the cached part is the longest common byte prefix with any earlier
//! request (a provider keeps every prefix it has seen for a while; with one chat that is
//! nearly always the previous request, and that figure is printed too), turned into tokens
//! at four bytes a token. Two byte orders are measured:
//!
//! - the prompt order: the `tools` array, then the `messages` array, each serialized from
//!   the body as sent. Providers tokenize the tool definitions ahead of the conversation
//!   (OpenAI renders them into the system prompt; Anthropic's cache order is tools, system,
//!   messages), so this is the prefix their cache sees. The target is on this one;
//! - the body as POSTed. Its keys are sorted, so `tools` comes after `messages`, and a
//!   byte prefix of the body can never reach the tool definitions: a lower bound.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{SecondsFormat, TimeDelta, Utc};
use parlor_testkit::{Reply, TgUser, ToolCallSpec};
use serde_json::{Value, json};

use super::{ANSWER, Report, start_env};

/// Turns the group takes (mentions answered), not counting the clock fires.
pub const TURNS: usize = 200;
/// The group.
const CHAT: i64 = -1_004_000_000_000;
/// Members taking turns; the first is the group's admin (clock tasks need one).
const MEMBERS: [(i64, &str); 4] = [
    (20_001, "Alice"),
    (20_002, "Bob"),
    (20_003, "Carol"),
    (20_004, "Dave"),
];
/// Bytes per token, the usual rough figure for English text and JSON.
const BYTES_PER_TOKEN: usize = 4;

/// What the cost phase measured: one prompt-order and one body byte string per request.
pub struct CostFigures {
    /// Every request, `tools` then `messages`.
    prompts: Vec<Vec<u8>>,
    /// Every request body as POSTed.
    bodies: Vec<Vec<u8>>,
    /// How many bytes of each prompt are its `tools`, and the last line of its last user
    /// message: to say what a request that breaks the prefix was.
    shapes: Vec<(usize, String)>,
    /// Replies and clock posts seen.
    posts: usize,
    /// The error, if the run did not finish.
    error: Option<String>,
}

/// The fake model: a tool call where the member asked for one, else the usual answer.
fn responder() -> impl Fn(&Value) -> Reply + Send + Sync + 'static {
    let calls = AtomicUsize::new(0);
    move |body: &Value| {
        let last_is_tool = body
            .get("messages")
            .and_then(Value::as_array)
            .and_then(|m| m.last())
            .and_then(|m| m.get("role"))
            .and_then(Value::as_str)
            == Some("tool");
        if last_is_tool {
            return Reply::text(ANSWER);
        }
        let text = parlor_testkit::last_user_text(body).unwrap_or_default();
        let asked = text.lines().last().unwrap_or_default();
        let id = format!("call_{}", calls.fetch_add(1, Ordering::Relaxed));
        if asked.contains("remember") {
            let key = format!("note-{id}");
            return Reply::tool_calls(vec![ToolCallSpec::new(
                id,
                "memory_write",
                json!({"key": key, "content": "the picnic moved to the lake"}),
            )]);
        }
        if asked.contains("remind us") {
            let due =
                (Utc::now() + TimeDelta::seconds(2)).to_rfc3339_opts(SecondsFormat::Secs, true);
            return Reply::tool_calls(vec![ToolCallSpec::new(
                id,
                "clock_create",
                json!({"name": "note", "schedule": due, "content": "Post the daily note."}),
            )]);
        }
        Reply::text(ANSWER)
    }
}

/// What member `turn` says to the bot, and whether that turn ends with a clock fire too.
fn mention(turn: usize) -> (usize, String, bool) {
    match turn {
        50 | 150 => (
            0,
            "remind us of the daily note in a moment".to_owned(),
            true,
        ),
        t if t % 25 == 7 => (t % 4, format!("please remember the picnic ({t})"), false),
        t => (t % 4, format!("what do you think about point {t}?"), false),
    }
}

/// Runs the cost phase on a daemon of its own.
pub async fn run(bin: &std::path::Path) -> CostFigures {
    let env = start_env(bin, 10).await;
    env.llm.respond_with(responder());
    env.llm_proxy.keep_bodies();
    env.tg.set_admins(CHAT, vec![MEMBERS[0].0]);
    let user = |m: usize| TgUser::new(MEMBERS[m].0, MEMBERS[m].1);
    let mut posts = env.tg_proxy.sends();
    let mut error = None;
    let started = std::time::Instant::now();
    for turn in 0..TURNS {
        if turn % 20 == 0 {
            eprintln!(
                "  turn {turn} of {TURNS}, {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        // Chatter between turns, none of it addressed to the bot: zero to two lines.
        for k in 0..turn % 3 {
            let from = (turn + k + 1) % MEMBERS.len();
            env.tg
                .group_message(CHAT, user(from), format!("ha, nice one {turn}.{k}"))
                .push();
        }
        let (from, text, fires) = mention(turn);
        env.tg
            .group_message(CHAT, user(from), format!("@parlor_bot {text}"))
            .mention_bot()
            .push();
        posts += 1 + usize::from(fires);
        if !env
            .tg_proxy
            .wait_sends(posts, Duration::from_secs(30))
            .await
        {
            error = Some(format!(
                "turn {turn}: {} of {posts} posts after 30 s",
                env.tg_proxy.sends()
            ));
            break;
        }
    }
    let bodies = env.llm_proxy.bodies();
    env.daemon.stop().await;
    let (prompts, shapes) = bodies.iter().map(|b| prompt_order(b)).unzip();
    CostFigures {
        prompts,
        shapes,
        bodies,
        posts,
        error,
    }
}

/// `tools` then `messages` of a body, each as the body has it; and the request's shape.
fn prompt_order(body: &[u8]) -> (Vec<u8>, (usize, String)) {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return (body.to_vec(), (0, String::new()));
    };
    let mut out = serde_json::to_vec(&value["tools"]).unwrap_or_default();
    let tools = out.len();
    out.extend(serde_json::to_vec(&value["messages"]).unwrap_or_default());
    let text = parlor_testkit::last_user_text(&value).unwrap_or_default();
    let last = text
        .lines()
        .last()
        .unwrap_or_default()
        .chars()
        .take(60)
        .collect();
    (out, (tools, last))
}

/// The length of the longest common prefix of `a` and `b`. Whole chunks are compared as
/// slices first (a `memcmp`): the 200-turn run compares some twenty thousand pairs of
/// prompts tens of kilobytes long, which byte by byte takes minutes in a debug build.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const CHUNK: usize = 256;
    let len = a.len().min(b.len());
    let mut at = 0;
    while at + CHUNK <= len && a[at..at + CHUNK] == b[at..at + CHUNK] {
        at += CHUNK;
    }
    at + a[at..len]
        .iter()
        .zip(&b[at..len])
        .take_while(|(x, y)| x == y)
        .count()
}

/// (total, cacheable from any earlier request, cacheable from the previous one), in bytes.
fn cacheable(requests: &[Vec<u8>]) -> (usize, usize, usize) {
    let (mut total, mut any, mut previous) = (0, 0, 0);
    for (i, request) in requests.iter().enumerate() {
        total += request.len();
        any += requests[..i]
            .iter()
            .map(|earlier| common_prefix(earlier, request))
            .max()
            .unwrap_or(0);
        if i > 0 {
            previous += common_prefix(&requests[i - 1], request);
        }
    }
    (total, any, previous)
}

/// The rows of the cost phase.
pub fn rows(figures: &CostFigures, report: &mut Report) {
    if let Some(error) = &figures.error {
        report.note(format!("cost phase: {error}"));
    }
    let tokens = |bytes: usize| bytes / BYTES_PER_TOKEN;
    let (total, any, previous) = cacheable(&figures.prompts);
    let share = |part: usize| {
        if total == 0 {
            f64::NAN
        } else {
            part as f64 / total as f64
        }
    };
    report.row(
        &format!("cost: {TURNS}-turn busy group: requests, prompt tokens"),
        format!(
            "{} requests, {} posts, {} tokens ({} bytes / {BYTES_PER_TOKEN})",
            figures.prompts.len(),
            figures.posts,
            tokens(total),
            total
        ),
    );
    // Why 80 %: with nothing per-turn ahead of the conversation, each request repeats the
    // one before and adds a turn (the chatter, the mention, the answer: a few hundred
    // bytes against a prompt of tens of kilobytes), so the uncached part is the first
    // request, those additions and a full miss at each break (a compaction, a trimmed
    // history). Over 200 turns that leaves well under 20 % uncached; a figure below it
    // means something changing sits in front of the conversation (a timestamp, an index
    // in the system prompt, reordered tools) and every turn pays the whole prompt again.
    report.target_at_least(
        "  cacheable, prompt order (tools, messages), any earlier request",
        share(any),
        format!("{} tokens, {:.1} %", tokens(any), share(any) * 100.0),
        0.80,
        ">= 80 %",
    );
    report.row(
        "  cacheable, prompt order, previous request only",
        format!(
            "{} tokens, {:.1} %",
            tokens(previous),
            share(previous) * 100.0
        ),
    );
    let (body_total, body_any, _) = cacheable(&figures.bodies);
    report.row(
        "  cacheable, body bytes as POSTed (tools after messages)",
        format!(
            "{} of {} tokens, {:.1} %",
            tokens(body_any),
            tokens(body_total),
            if body_total == 0 {
                f64::NAN
            } else {
                body_any as f64 * 100.0 / body_total as f64
            }
        ),
    );
    let mut breaks = 0;
    for (i, prompt) in figures.prompts.iter().enumerate().skip(1) {
        let before = &figures.prompts[i - 1];
        let common = common_prefix(before, prompt);
        if common * 2 >= before.len() {
            continue;
        }
        breaks += 1;
        let (tools, last) = &figures.shapes[i];
        let (tools_before, _) = &figures.shapes[i - 1];
        report.note(format!(
            "cost: request {i} repeats {common} of the previous request's {} bytes; {}; it ends \"{last}\"",
            before.len(),
            if common < (*tools).min(*tools_before) {
                format!("its tools differ ({tools} bytes against {tools_before})")
            } else {
                "its messages differ".to_owned()
            }
        ));
    }
    report.row(
        "  requests repeating less than half of the previous one",
        breaks.to_string(),
    );
}
