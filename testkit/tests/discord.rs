//! `FakeDiscord` spoken to on the wire (reqwest + a raw WebSocket client), with the payloads of
//! Discord's documentation examples. The adapter's tests cover it with the real serenity.

// A failed unwrap in a test is the test failing.
#![allow(clippy::unwrap_used)]

use futures::{SinkExt, StreamExt};
use parlor_testkit::{DiscordFailure, DiscordUser, FakeDiscord, discord_fixture};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

mod support;
use support::{WAIT, client};

const TOKEN: &str = "MTEwMA.fake.token";

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn connect(fake: &FakeDiscord) -> Ws {
    let url: Value = client()
        .get(format!("{}/api/v10/gateway", fake.api_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = url["url"].as_str().expect("a gateway url").to_owned();
    assert_eq!(url, fake.gateway_url());
    let (ws, _) = tokio_tungstenite::connect_async(format!("{url}?v=10&encoding=json"))
        .await
        .expect("the gateway accepts");
    ws
}

/// The next JSON payload (text frame); `Err(close code)` if the server closed.
async fn next(ws: &mut Ws) -> Result<Value, u16> {
    loop {
        let frame = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("a frame in time")
            .expect("the connection is open")
            .expect("a valid frame");
        match frame {
            Message::Text(text) => return Ok(serde_json::from_str(&text).unwrap()),
            Message::Close(frame) => return Err(frame.map_or(0, |f| u16::from(f.code))),
            _ => continue,
        }
    }
}

async fn send(ws: &mut Ws, payload: &Value) {
    ws.send(Message::Text(payload.to_string())).await.unwrap();
}

/// GETs `path` under `/api/v10` as the bot.
async fn get(fake: &FakeDiscord, path: &str) -> reqwest::Response {
    client()
        .get(format!("{}/api/v10{path}", fake.api_url()))
        .header("authorization", format!("Bot {TOKEN}"))
        .send()
        .await
        .unwrap()
}

/// GETs `path` under `/api/v10` as the bot; the JSON answer.
async fn get_json(fake: &FakeDiscord, path: &str) -> Value {
    get(fake, path).await.json().await.unwrap()
}

fn identify(token: &str) -> Value {
    let mut identify = discord_fixture("gateway.Example_Identify_Payload.L198.json").unwrap();
    identify["d"]["token"] = json!(token);
    identify
}

#[tokio::test]
async fn hello_identify_ready_heartbeat_dispatch_and_resume() {
    let fake = FakeDiscord::start(TOKEN).await;
    let alice = DiscordUser::new(42, "alice");
    let mut ws = connect(&fake).await;
    let hello = next(&mut ws).await.unwrap();
    assert_eq!(
        hello,
        discord_fixture("gateway.Example_Hello_Event.L129.json").unwrap()
    );

    // Pushed before anyone is ready: queued.
    let early = fake.message_create(7, &alice, "early");
    send(&mut ws, &identify(TOKEN)).await;
    let ready = next(&mut ws).await.unwrap();
    assert_eq!(
        (ready["op"].clone(), ready["t"].clone()),
        (json!(0), json!("READY"))
    );
    assert_eq!(ready["s"], 1);
    assert_eq!(ready["d"]["user"]["id"], "1100");
    let session = ready["d"]["session_id"].as_str().unwrap().to_owned();
    assert_eq!(fake.identifies()[0]["intents"], 513);

    let first = next(&mut ws).await.unwrap();
    assert_eq!(first["t"], "MESSAGE_CREATE");
    assert_eq!(first["s"], 2);
    assert_eq!(first["d"]["id"], early.as_str());
    assert_eq!(first["d"]["author"]["username"], "alice");
    assert_eq!(
        first["d"]["guild_id"],
        parlor_testkit::DEFAULT_GUILD_ID.to_string()
    );

    send(&mut ws, &json!({"op": 1, "d": 2})).await;
    assert_eq!(
        next(&mut ws).await.unwrap(),
        discord_fixture("gateway.Example_Heartbeat_ACK.L161.json").unwrap()
    );
    assert_eq!(fake.heartbeats(), 1);

    // Dropped: close 4000; an event pushed meanwhile is replayed on resume.
    assert!(fake.disconnect());
    assert_eq!(next(&mut ws).await, Err(4000));
    let missed = fake.message_create(7, &alice, "missed");
    let mut ws = connect(&fake).await;
    assert_eq!(next(&mut ws).await.unwrap()["op"], 10);
    let mut resume = discord_fixture("gateway.Example_Gateway_Resume_Event.L276.json").unwrap();
    resume["d"]["token"] = json!(TOKEN);
    resume["d"]["session_id"] = json!(session);
    resume["d"]["seq"] = json!(1);
    send(&mut ws, &resume).await;
    // Everything after seq 1: the early message again, then RESUMED, then the missed one.
    let replayed = next(&mut ws).await.unwrap();
    assert_eq!(replayed["d"]["id"], early.as_str());
    let resumed = next(&mut ws).await.unwrap();
    assert_eq!(resumed["t"], "RESUMED");
    let after = next(&mut ws).await.unwrap();
    assert_eq!(after["d"]["id"], missed.as_str());
    assert!(after["s"].as_u64().unwrap() > resumed["s"].as_u64().unwrap());
    fake.wait_for_ready(WAIT).await.unwrap();
    assert_eq!(fake.connections(), 2);

    // An unknown session cannot be resumed.
    let mut ws = connect(&fake).await;
    next(&mut ws).await.unwrap();
    resume["d"]["session_id"] = json!("nope");
    send(&mut ws, &resume).await;
    assert_eq!(next(&mut ws).await.unwrap(), json!({"op": 9, "d": false}));
}

#[tokio::test]
async fn a_wrong_token_closes_with_4004() {
    let fake = FakeDiscord::start(TOKEN).await;
    let mut ws = connect(&fake).await;
    next(&mut ws).await.unwrap();
    send(&mut ws, &identify("my_token")).await;
    assert_eq!(next(&mut ws).await, Err(4004));
}

#[tokio::test]
async fn rest_routes_answer_like_discord() {
    let fake = FakeDiscord::start(TOKEN).await;
    fake.guild(10, 11);
    fake.role(10, 12, 8);
    fake.member(10, 13, vec![12]);
    fake.text_channel(10, 20);
    let http = client();
    let api = format!("{}/api/v10", fake.api_url());
    let auth = format!("Bot {TOKEN}");

    let me = http.get(format!("{api}/users/@me")).send().await.unwrap();
    assert_eq!(me.status(), 401, "no token");
    let me = get_json(&fake, "/users/@me").await;
    assert_eq!(
        (me["id"].clone(), me["bot"].clone()),
        (json!("1100"), json!(true))
    );

    let gw = get_json(&fake, "/gateway/bot").await;
    assert_eq!(gw["url"], fake.gateway_url());
    assert_eq!(gw["shards"], 1);
    assert_eq!(gw["session_start_limit"]["max_concurrency"], 1);

    let guild = get_json(&fake, "/guilds/10").await;
    assert_eq!(guild["owner_id"], "11");
    let roles = get_json(&fake, "/guilds/10/roles").await;
    assert!(
        roles
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["id"] == "12" && r["permissions"] == "8")
    );
    let member = get_json(&fake, "/guilds/10/members/13").await;
    assert_eq!(member["roles"], json!(["12"]));
    let channel = get_json(&fake, "/channels/20").await;
    assert_eq!(
        (channel["type"].clone(), channel["guild_id"].clone()),
        (json!(0), json!("10"))
    );

    let post = |body: Value| {
        http.post(format!("{api}/channels/20/messages"))
            .header("authorization", &auth)
            .json(&body)
            .send()
    };
    let ok: Value = post(json!({"content": "hi @everyone"}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ok["author"]["id"], "1100");
    assert_eq!(
        ok["mention_everyone"], true,
        "no allowed_mentions: it pings"
    );
    let sent = fake.wait_for_sent(1, WAIT).await.unwrap();
    assert_eq!(sent[0].id, ok["id"].as_str().unwrap());
    assert!(sent[0].pings_everyone());
    assert_eq!(
        fake.dispatched().last().unwrap()["d"]["id"],
        ok["id"],
        "echoed as MESSAGE_CREATE"
    );

    let too_long = post(json!({"content": "x".repeat(2001)})).await.unwrap();
    assert_eq!(too_long.status(), 400);
    let unknown_ref = post(json!({"content": "r", "message_reference": {"message_id": "5"}}))
        .await
        .unwrap();
    assert_eq!(unknown_ref.status(), 400);
    let lenient = post(json!({"content": "r", "allowed_mentions": {"parse": []},
        "message_reference": {"message_id": "5", "fail_if_not_exists": false}}))
    .await
    .unwrap();
    assert_eq!(lenient.status(), 200);
    let sent = fake.sent_messages();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1].reply_to().as_deref(), Some("5"));
    assert!(!sent[1].parses("users"));

    fake.fail_next("create_message", DiscordFailure::rate_limited(1.5));
    let limited = post(json!({"content": "x"})).await.unwrap();
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["retry-after"], "2");
    let body: Value = limited.json().await.unwrap();
    assert_eq!(body["retry_after"], 1.5);
    assert_eq!(fake.sent_messages().len(), 2);

    let typing = http
        .post(format!("{api}/channels/20/typing"))
        .header("authorization", &auth)
        .send()
        .await
        .unwrap();
    assert_eq!(typing.status(), 204);
    assert_eq!(fake.typing_calls().len(), 1);

    let url = fake.add_attachment(20, "a.png", vec![9, 8, 7]);
    let bytes = client()
        .get(&url)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(&bytes[..], &[9, 8, 7]);

    let nowhere = get(&fake, "/applications/@me").await;
    assert_eq!(nowhere.status(), 404);
    assert_eq!(fake.unknown_routes(), ["GET /api/v10/applications/@me"]);
}

#[tokio::test]
async fn latency_delays_rest_calls() {
    let fake = FakeDiscord::start(TOKEN).await;
    fake.guild(10, 11);
    fake.set_latency(std::time::Duration::from_millis(60));
    let started = std::time::Instant::now();
    let guild = get_json(&fake, "/guilds/10").await;
    assert_eq!(guild["owner_id"], "11");
    // A lower bound only: the knob must hold a call for its whole round trip.
    assert!(started.elapsed() >= std::time::Duration::from_millis(60));
}

#[tokio::test]
async fn components_interactions_and_follow_ups_behave_like_discord() {
    let fake = FakeDiscord::start(TOKEN).await;
    fake.text_channel(10, 20);
    let http = client();
    let api = format!("{}/api/v10", fake.api_url());
    let post = |path: String, body: Value| {
        http.post(format!("{api}{path}"))
            .header("authorization", format!("Bot {TOKEN}"))
            .json(&body)
            .send()
    };
    let row = |custom_id: &str| {
        json!([{"type": 1, "components": [
            {"type": 2, "style": 2, "label": "Yes", "custom_id": custom_id}
        ]}])
    };
    let refused = post(
        "/channels/20/messages".to_owned(),
        json!({"content": "ok?", "components": row(&"x".repeat(101))}),
    )
    .await
    .unwrap();
    assert_eq!(refused.status(), 400);
    let sent: Value = post(
        "/channels/20/messages".to_owned(),
        json!({"content": "ok?", "components": row("yes")}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(sent["components"], row("yes"));
    let buttons = fake.sent_messages()[0].buttons();
    assert_eq!(buttons[0].custom_id.as_deref(), Some("yes"));
    assert_eq!(buttons[0].label.as_deref(), Some("Yes"));

    let alice = DiscordUser::new(30, "alice");
    let message_id = sent["id"].as_str().unwrap().to_owned();
    let pressed = fake
        .button_press(20, &alice, message_id.clone(), "yes")
        .push();
    let event = fake
        .dispatched()
        .into_iter()
        .find(|e| e["t"] == "INTERACTION_CREATE")
        .expect("dispatched");
    let d = &event["d"];
    assert_eq!(
        (d["type"].clone(), d["data"]["custom_id"].clone()),
        (json!(3), json!("yes"))
    );
    assert_eq!(d["member"]["user"]["id"], "30");
    assert_eq!(d["guild_id"], "10");
    assert_eq!(d["message"]["id"], json!(message_id));
    assert_eq!(d["message"]["components"], row("yes"));

    let hook = format!("/webhooks/{}/{}", pressed.application_id, pressed.token);
    let early = post(hook.clone(), json!({"content": "too early"}))
        .await
        .unwrap();
    assert_eq!(early.status(), 404, "no follow-up before the response");
    let callback = format!("/interactions/{}/{}/callback", pressed.id, pressed.token);
    let acked = post(callback.clone(), json!({"type": 6})).await.unwrap();
    assert_eq!(acked.status(), 204);
    let again = post(callback, json!({"type": 6})).await.unwrap();
    assert_eq!(again.status(), 400, "one response per interaction");
    let wrong = post(
        format!("/interactions/{}/wrong-token/callback", pressed.id),
        json!({"type": 6}),
    )
    .await
    .unwrap();
    assert_eq!(wrong.status(), 404);
    let followed = post(hook, json!({"content": "done", "flags": 64}))
        .await
        .unwrap();
    assert_eq!(followed.status(), 200);

    let callbacks = fake.wait_for_interaction_callbacks(1, WAIT).await.unwrap();
    assert_eq!(callbacks.len(), 1);
    assert_eq!(
        (callbacks[0].interaction_id.as_str(), callbacks[0].kind),
        (pressed.id.as_str(), 6)
    );
    let followups = fake.wait_for_followups(1, WAIT).await.unwrap();
    assert_eq!(followups[0].content, "done");
    assert!(followups[0].is_ephemeral());
    assert_eq!(followups[0].interaction_id, pressed.id);
}
