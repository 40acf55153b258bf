//! The operator's console (`[http] token_env`) of the real `parlor run` against the fake
//! Telegram and the fake LLM, all on loopback: every console route refuses a missing or
//! wrong token, the login sets a session cookie, the pages render the store's turns, clock
//! runs and background tasks, and pausing a clock task changes the stored task. Every
//! route refuses a foreign `Host`, every answer carries the security headers, and wrong
//! tokens are throttled per client address.

use parlor_bot::store::{SledStore, Store, StoreOptions};
use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram, Reply, ToolCallSpec};
use parlor_toolsets::clock::{ClockHandle, ClockOptions};
use reqwest::StatusCode;
use reqwest::redirect::Policy;

use crate::support::{self, WAIT, alice, config, daemon_command};

const GROUP: i64 = -100_123;
const CONSOLE_TOKEN: &str = "console-token-for-the-test-0123";

/// The running daemon with its console, after one turn that created a clock task firing
/// soon (and fired), an hourly one, and a background task still running.
struct World {
    daemon: DaemonProcess,
    telegram: FakeTelegram,
    /// Kept alive: the daemon still talks to it.
    llm: FakeLlm,
    /// The console's address.
    addr: String,
    /// The daemon's data directory.
    dir: tempfile::TempDir,
}

async fn world() -> World {
    let llm = FakeLlm::start().await;
    let telegram = FakeTelegram::start(support::TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let due = chrono::Utc::now() + chrono::Duration::seconds(2);
    llm.push(Reply::tool_calls(vec![
        ToolCallSpec::new(
            "c1",
            "clock_create",
            serde_json::json!({
                "name": "ping <soon>",
                "schedule": due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                "content": "Say ping.",
            }),
        ),
        ToolCallSpec::new(
            "c2",
            "clock_create",
            serde_json::json!({"name": "hourly", "schedule": "every 1h", "content": "Say hour."}),
        ),
        ToolCallSpec::new(
            "c3",
            "shell",
            serde_json::json!({"command": "echo started; sleep 60", "run_in_background": true}),
        ),
    ]));
    llm.push(Reply::text("Scheduled <b>both</b>."));
    llm.respond_with(|_| Reply::text("Ping!"));
    let extra = "admins = [\"telegram:1001\"]\n[http]\nlisten = \"127.0.0.1:0\"\n\
                 token_env = \"PARLOR_HTTP_TOKEN\"\n[terminal]\nenabled = true\nsandbox = \"none\"\n";
    let config = config(dir.path(), &telegram, extra);
    let mut command = daemon_command(&config, &llm);
    command.env("PARLOR_HTTP_TOKEN", CONSOLE_TOKEN);
    let daemon = DaemonProcess::spawn_polling(command, &telegram, WAIT).await;
    telegram
        .group_message(GROUP, alice(), "@parlor_bot set things up")
        .mention_bot()
        .push();
    let sent = telegram.wait_for_sent(2, WAIT).await.unwrap();
    assert_eq!(sent[0].text, "Scheduled <b>both</b>.", "{}", daemon.log());
    assert_eq!(sent[1].text, "Ping!");
    let addr = support::http_addr(&daemon).await;
    World {
        daemon,
        telegram,
        llm,
        addr,
        dir,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .timeout(WAIT)
        .build()
        .unwrap()
}

/// A client from loopback address 127.0.1.`n`: wrong tokens count against the address
/// they come from, so each stranger starts with a clean record.
fn stranger(n: u8) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .timeout(WAIT)
        .local_address(std::net::IpAddr::from([127, 0, 1, n]))
        .build()
        .unwrap()
}

/// The `csrf` value of the first form of `html`.
fn csrf(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").unwrap() + "name=\"csrf\" value=\"".len();
    html[at..].split('"').next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_needs_the_token_and_shows_turns_clock_runs_and_tasks() {
    let mut world = world().await;
    let base = format!("http://{}", world.addr);
    let http = client();
    let session = format!("telegram:{GROUP}");
    let encoded = "telegram%3A%2D100123";

    // The probes stay open.
    for probe in ["/healthz", "/metrics"] {
        let r = http.get(format!("{base}{probe}")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{probe}");
    }
    // Every page without a token, or with a wrong one, goes to the login form; every
    // action is refused.
    let pages = [
        "/".to_owned(),
        format!("/chat/{encoded}"),
        "/clock".to_owned(),
        "/tasks".to_owned(),
        "/errors".to_owned(),
    ];
    let mut strangers = (1..).map(stranger);
    for page in &pages {
        for bearer in [None, Some("wrong-token-wrong-token")] {
            let mut request = strangers.next().unwrap().get(format!("{base}{page}"));
            if let Some(b) = bearer {
                request = request.bearer_auth(b);
            }
            let r = request.send().await.unwrap();
            assert_eq!(r.status(), StatusCode::SEE_OTHER, "{page}");
            assert_eq!(r.headers()["location"], "/login", "{page}");
        }
    }
    let actions = [
        "/stop",
        "/clock/2/pause",
        "/clock/2/resume",
        "/tasks/stop",
        "/logout",
    ];
    for action in actions {
        for bearer in [None, Some("wrong-token-wrong-token")] {
            let mut request = strangers
                .next()
                .unwrap()
                .post(format!("{base}{action}"))
                .form(&[("session", session.as_str()), ("id", "x"), ("csrf", "x")]);
            if let Some(b) = bearer {
                request = request.bearer_auth(b);
            }
            let r = request.send().await.unwrap();
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{action}");
        }
    }
    // A made-up cookie is no login.
    let r = http
        .get(format!("{base}/"))
        .header("cookie", "parlor_console=00ff")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);

    // The login form: a wrong token is refused (and logged), the right one sets a cookie.
    let r = http
        .post(format!("{base}/login"))
        .form(&[("token", "not-the-token-not-the-token")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = http
        .post(format!("{base}/login"))
        .form(&[("token", CONSOLE_TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(!set.contains(CONSOLE_TOKEN), "{set}");
    let cookie = set.split(';').next().unwrap().to_owned();
    let get = |path: String| {
        let http = http.clone();
        let cookie = cookie.clone();
        let base = base.clone();
        async move {
            let r = http
                .get(format!("{base}{path}"))
                .header("cookie", cookie)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            r.text().await.unwrap()
        }
    };

    // Chats: the group with its turns and tokens of today.
    let chats = get("/".to_owned()).await;
    assert!(
        chats.contains(&format!("href=\"/chat/{encoded}\"")),
        "{chats}"
    );
    assert!(chats.contains("<meta name=\"viewport\""), "{chats}");
    // Both turns (the mention and the fire) of today, at the fake's default usage each.
    assert!(chats.contains("<td>2</td>"), "{chats}");

    // Usage: the same day's figures per chat and per member, with their totals; no
    // `[llm.prices]`, so nothing costs.
    let usage = get("/usage?days=3".to_owned()).await;
    assert!(usage.contains("<h2>Chats</h2>"), "{usage}");
    assert!(
        usage.contains(&format!("<a href=\"/chat/{encoded}\">")),
        "{usage}"
    );
    assert!(
        usage.contains("<th>Total</th><td></td><th>2</th>"),
        "{usage}"
    );
    assert!(usage.contains("Alice (telegram:1001)"), "{usage}");
    assert!(usage.contains("<td>$0</td>"), "{usage}");
    let bob_only = get("/usage?member=telegram:1002".to_owned()).await;
    assert!(!bob_only.contains("<h2>Chats</h2>"), "{bob_only}");
    assert!(!bob_only.contains("Alice"), "{bob_only}");

    // The chat's trace: the input, every tool call with its code, the reply escaped, with
    // the platform's message id.
    let trace = get(format!("/chat/{encoded}")).await;
    assert!(trace.contains("set things up"), "{trace}");
    // The fake answers as the model it was asked for.
    assert!(trace.contains("answered by gpt-4o-mini"), "{trace}");
    assert!(trace.contains("clock_create"), "{trace}");
    assert!(trace.contains("shell"), "{trace}");
    assert!(trace.contains("<span class=\"ok\">ok</span>"), "{trace}");
    assert!(
        trace.contains("Scheduled &lt;b&gt;both&lt;/b&gt;."),
        "{trace}"
    );
    assert!(!trace.contains("<b>both</b>"), "{trace}");
    let sent = world.telegram.sent_messages();
    assert!(
        trace.contains(&format!("as message {}", sent[0].message_id)),
        "{trace}"
    );

    // Clock: the fired one-shot's run with its delivery proof; the hourly one paused and
    // resumed through the form.
    // The run is marked `ok` once the outbox lane has the platform's ids, just after the
    // fake took the message: the page is read until it says so.
    let delivered = format!("<td>ok</td><td>{}</td>", sent[1].message_id);
    let clock = tokio::time::timeout(WAIT, async {
        loop {
            let clock = get("/clock".to_owned()).await;
            if clock.contains(&delivered) {
                return clock;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    assert!(clock.contains("ping &lt;soon&gt;"), "{clock}");
    assert!(clock.contains("action=\"/clock/2/pause\""), "{clock}");
    let token = csrf(&clock);
    // Without the CSRF token a logged-in browser's POST is refused.
    let r = http
        .post(format!("{base}/clock/2/pause"))
        .header("cookie", &cookie)
        .form(&[("csrf", "forged")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = http
        .post(format!("{base}/clock/2/pause"))
        .header("cookie", &cookie)
        .form(&[("csrf", token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let clock = get("/clock".to_owned()).await;
    assert!(clock.contains("action=\"/clock/2/resume\""), "{clock}");

    // Tasks: the background shell task, running, stopped from the console; /metrics counts
    // it by status.
    let metrics = || async {
        http.get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let scraped = metrics().await;
    assert!(
        scraped.contains("parlor_background_tasks{status=\"running\"} 1"),
        "{scraped}"
    );
    assert!(scraped.contains("parlor_queued_items 0"), "{scraped}");
    let tasks = get("/tasks".to_owned()).await;
    assert!(tasks.contains("echo started; sleep 60"), "{tasks}");
    assert!(tasks.contains("running"), "{tasks}");
    assert!(tasks.contains("action=\"/tasks/stop\""), "{tasks}");
    let id_at = tasks.find("name=\"id\" value=\"").unwrap() + "name=\"id\" value=\"".len();
    let task_id = tasks[id_at..].split('"').next().unwrap().to_owned();
    let r = http
        .post(format!("{base}/tasks/stop"))
        .bearer_auth(CONSOLE_TOKEN)
        .form(&[("session", session.as_str()), ("id", task_id.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let tasks = get("/tasks".to_owned()).await;
    assert!(tasks.contains("stopped"), "{tasks}");
    let scraped = metrics().await;
    assert!(
        scraped.contains("parlor_background_tasks{status=\"running\"} 0"),
        "{scraped}"
    );
    assert!(
        scraped.contains("parlor_background_tasks{status=\"stopped\"} 1"),
        "{scraped}"
    );
    assert!(!tasks.contains("action=\"/tasks/stop\""), "{tasks}");

    // Errors: the refused login is there.
    let errors = get("/errors".to_owned()).await;
    assert!(errors.contains("console login refused"), "{errors}");

    // Bearer access works for pages too.
    let r = http
        .get(format!("{base}/clock"))
        .bearer_auth(CONSOLE_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // The pause went through the clock's handle into the store.
    let task = stop_and_read_task(&mut world, 2).await;
    assert_eq!(task.name, "hourly");
    assert!(!task.enabled);
    drop(world.llm);
}

#[tokio::test]
async fn check_config_says_whether_the_console_is_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, "[http]\nlisten = \"127.0.0.1:9464\"\n").unwrap();
    let text = check_config(&path).await;
    assert!(text.contains("the console is off"), "{text}");

    std::fs::write(
        &path,
        "[http]\nlisten = \"127.0.0.1:9464\"\ntoken_env = \"PARLOR_HTTP_TOKEN\"\n",
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_parlor"))
        .arg("--config")
        .arg(&path)
        .arg("check-config")
        .env_clear()
        .env("PARLOR_HTTP_TOKEN", CONSOLE_TOKEN)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("and the console"), "{text}");
    assert!(!text.contains("put TLS"), "{text}");

    // Other hosts can reach it: TLS belongs in front.
    std::fs::write(&path, "[http]\nlisten = \"0.0.0.0:9464\"\n").unwrap();
    let text = check_config(&path).await;
    assert!(
        text.contains("put TLS (a reverse proxy) in front"),
        "{text}"
    );
}

/// A daemon with the console on and no turn yet: its address, and what keeps it running.
async fn quiet_console(
    extra: &str,
) -> (
    DaemonProcess,
    String,
    FakeTelegram,
    FakeLlm,
    tempfile::TempDir,
) {
    let llm = FakeLlm::start().await;
    let telegram = FakeTelegram::start(support::TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(
        dir.path(),
        &telegram,
        &format!("[http]\nlisten = \"127.0.0.1:0\"\ntoken_env = \"PARLOR_HTTP_TOKEN\"\n{extra}"),
    );
    let mut command = daemon_command(&config, &llm);
    command.env("PARLOR_HTTP_TOKEN", CONSOLE_TOKEN);
    let daemon = DaemonProcess::spawn_polling(command, &telegram, WAIT).await;
    // The listener may log a moment after the first poll.
    let addr = support::http_addr(&daemon).await;
    (daemon, addr, telegram, llm, dir)
}

/// Sends `request` (without its `Host` line) with `host` as the Host header (or none) over
/// a fresh connection; returns the status line's code and the header block.
async fn raw(addr: &str, request_line: &str, host: Option<&str>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let host = host.map(|h| format!("Host: {h}\r\n")).unwrap_or_default();
    let request = format!(
        "{request_line}\r\n{host}Content-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let status = answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let head = answer
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    (status, head)
}

/// The security headers every answer carries.
fn assert_secure(head: &str, what: &str) {
    for header in [
        "x-content-type-options: nosniff",
        "x-frame-options: deny",
        "referrer-policy: no-referrer",
        "content-security-policy: default-src 'none'; style-src 'self'",
        "cache-control: no-store",
    ] {
        assert!(head.contains(header), "{what}: no {header} in\n{head}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_is_refused_on_every_route_and_every_answer_has_the_security_headers() {
    let (mut daemon, addr, _telegram, _llm, _dir) =
        quiet_console("allowed_hosts = [\"parlor.example.com\"]\n").await;
    let routes = [
        "GET /healthz",
        "GET /readyz",
        "GET /metrics",
        "GET /",
        "GET /login",
        "GET /chat/telegram%3A1",
        "GET /clock",
        "GET /tasks",
        "GET /errors",
        "GET /console.css",
        "GET /no-such-page",
        "POST /login",
        "POST /logout",
        "POST /stop",
        "POST /clock/1/pause",
        "POST /tasks/stop",
    ];
    let port = addr.rsplit(':').next().unwrap();
    for route in routes {
        let line = format!("{route} HTTP/1.1");
        // A page whose DNS name was rebound to 127.0.0.1 sends its own name.
        for host in [
            Some("evil.example".to_owned()),
            Some(format!("evil.example:{port}")),
            Some(format!("127.0.0.1.evil.example:{port}")),
        ] {
            let (status, head) = raw(&addr, &line, host.as_deref()).await;
            assert_eq!(status, 421, "{route} with Host {host:?}");
            assert_secure(&head, route);
        }
        // HTTP/1.0 may omit the Host: refused too.
        let (status, _) = raw(&addr, &format!("{route} HTTP/1.0"), None).await;
        assert_eq!(status, 421, "{route} without a Host");
        // Loopback names, and the listed one, are served.
        for host in [
            addr.clone(),
            format!("localhost:{port}"),
            format!("parlor.example.com:{port}"),
        ] {
            let (status, head) = raw(&addr, &line, Some(&host)).await;
            assert_ne!(status, 421, "{route} with Host {host}");
            assert_secure(&head, route);
        }
    }
    // The pages load their style sheet, which the policy allows ('self'); none is inline.
    let login = client()
        .get(format!("http://{addr}/login"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(login.contains("href=\"/console.css\""), "{login}");
    assert!(!login.contains("<style"), "{login}");
    let exit = daemon.terminate(WAIT).await;
    assert!(exit.success(), "{}", daemon.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_wrong_logins_are_throttled() {
    let (mut daemon, addr, _telegram, _llm, _dir) = quiet_console("").await;
    let base = format!("http://{addr}");
    let guesser = stranger(200);
    let mut throttled = 0;
    let mut retry_after = None;
    for i in 0..300 {
        let r = guesser
            .post(format!("{base}/login"))
            .form(&[("token", format!("guess-{i:04}-of-the-console-token"))])
            .send()
            .await
            .unwrap();
        match r.status() {
            StatusCode::UNAUTHORIZED => {}
            StatusCode::TOO_MANY_REQUESTS => {
                throttled += 1;
                retry_after = r.headers().get("retry-after").cloned();
            }
            other => panic!("guess {i}: {other}"),
        }
    }
    assert!(throttled >= 290, "only {throttled} of 300 throttled");
    let secs: u64 = retry_after.unwrap().to_str().unwrap().parse().unwrap();
    assert!((1..=300).contains(&secs), "{secs}");
    // While it waits, even the right token gets the guesser nothing, nor does a bearer.
    let r = guesser
        .post(format!("{base}/login"))
        .form(&[("token", CONSOLE_TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let r = guesser
        .get(format!("{base}/"))
        .bearer_auth("wrong-token-wrong-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // Another address is not held back.
    let r = stranger(201)
        .post(format!("{base}/login"))
        .form(&[("token", CONSOLE_TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let exit = daemon.terminate(WAIT).await;
    assert!(exit.success(), "{}", daemon.log());
}

/// A WebDriver session on chromedriver, spoken over its W3C JSON protocol: the few
/// commands the test needs do not call for a client crate.
struct Browser {
    http: reqwest::Client,
    url: String,
}

impl Browser {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: serde_json::Value,
    ) -> serde_json::Value {
        let mut request = self.http.request(method, format!("{}{path}", self.url));
        if !body.is_null() {
            request = request.json(&body);
        }
        let r = request.send().await.unwrap();
        let status = r.status();
        let value: serde_json::Value = r.json().await.unwrap();
        assert!(status.is_success(), "{path}: {value}");
        value["value"].clone()
    }

    async fn go(&self, url: &str) {
        self.call(
            reqwest::Method::POST,
            "/url",
            serde_json::json!({ "url": url }),
        )
        .await;
    }

    async fn find(&self, css: &str) -> String {
        let found = self
            .call(
                reqwest::Method::POST,
                "/element",
                serde_json::json!({"using": "css selector", "value": css}),
            )
            .await;
        found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(|v| v.as_str())
            .unwrap()
            .to_owned()
    }

    /// The page's source once it contains `text` (a click's navigation ends on the
    /// browser's own time).
    async fn source_with(&self, text: &str) -> String {
        tokio::time::timeout(WAIT, async {
            loop {
                let source = self.source().await;
                if source.contains(text) {
                    return source;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the page never showed {text:?}"))
    }

    async fn source(&self) -> String {
        self.call(reqwest::Method::GET, "/source", serde_json::Value::Null)
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }
}

/// Where a program is on `PATH`.
fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headless_chromium_logs_in_reads_a_trace_and_pauses_a_clock_task() {
    use base64::Engine as _;
    use tokio::io::AsyncBufReadExt as _;

    let (Some(chromium), Some(driver)) = (which("chromium"), which("chromedriver")) else {
        // CI (.ci/run) installs both and sets this, so there the test never skips.
        assert!(
            std::env::var_os("PARLOR_REQUIRE_CHROMIUM").is_none(),
            "PARLOR_REQUIRE_CHROMIUM is set but chromium or chromedriver is missing"
        );
        eprintln!("SKIPPED: chromium and chromedriver are not installed");
        return;
    };
    let mut world = world().await;
    let base = format!("http://{}", world.addr);

    // A free loopback port for the driver, which says on stdout when it listens.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut chromedriver = tokio::process::Command::new(driver)
        .arg(format!("--port={port}"))
        .arg("--allowed-ips=127.0.0.1")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(chromedriver.stdout.take().unwrap()).lines();
    tokio::time::timeout(WAIT, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("started successfully") {
                return;
            }
        }
        panic!("chromedriver ended before it listened");
    })
    .await
    .unwrap();

    let http = client();
    let created: serde_json::Value = http
        .post(format!("http://127.0.0.1:{port}/session"))
        .json(&serde_json::json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                // A phone's width: the console must stay usable there.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=412,1400"],
            }
        }}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["value"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    let browser = Browser {
        http: http.clone(),
        url: format!("http://127.0.0.1:{port}/session/{id}"),
    };

    // Not logged in: the console sends the browser to the login form.
    browser.go(&format!("{base}/")).await;
    let field = browser.find("input[name=token]").await;
    browser
        .call(
            reqwest::Method::POST,
            &format!("/element/{field}/value"),
            serde_json::json!({ "text": CONSOLE_TOKEN }),
        )
        .await;
    let submit = browser.find("button[type=submit]").await;
    browser
        .call(
            reqwest::Method::POST,
            &format!("/element/{submit}/click"),
            serde_json::json!({}),
        )
        .await;
    browser.source_with("Turns today").await;

    // The chat's trace, reached through its link.
    let link = browser.find("a[href^='/chat/']").await;
    browser
        .call(
            reqwest::Method::POST,
            &format!("/element/{link}/click"),
            serde_json::json!({}),
        )
        .await;
    let trace = browser.source_with("clock_create").await;
    assert!(trace.contains("set things up"), "{trace}");

    // Pause the hourly task with its button.
    browser.go(&format!("{base}/clock")).await;
    let pause = browser.find("form[action='/clock/2/pause'] button").await;
    browser
        .call(
            reqwest::Method::POST,
            &format!("/element/{pause}/click"),
            serde_json::json!({}),
        )
        .await;
    browser.source_with("/clock/2/resume").await;

    let shot = browser
        .call(reqwest::Method::GET, "/screenshot", serde_json::Value::Null)
        .await;
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot.as_str().unwrap())
        .unwrap();
    let artifacts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    std::fs::write(artifacts.join("console.png"), &png).unwrap();
    browser
        .call(reqwest::Method::DELETE, "", serde_json::Value::Null)
        .await;
    chromedriver.kill().await.unwrap();

    let task = stop_and_read_task(&mut world, 2).await;
    assert!(!task.enabled, "the click paused the task in the store");
}

/// Stops the daemon cleanly and reads clock task `id` from what it left in its store.
async fn stop_and_read_task(world: &mut World, id: u64) -> parlor_toolsets::clock::ClockTask {
    let exit = world.daemon.terminate(WAIT).await;
    assert!(exit.success(), "{}", world.daemon.log());
    let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(
        SledStore::open(
            &world.dir.path().join("data").join("db"),
            StoreOptions::default(),
        )
        .unwrap(),
    );
    ClockHandle::new(store, ClockOptions::default())
        .task(id)
        .unwrap()
        .unwrap()
}

/// What `parlor check-config` prints for the config at `path`, with no environment.
async fn check_config(path: &std::path::Path) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_parlor"))
        .arg("--config")
        .arg(path)
        .arg("check-config")
        .env_clear()
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}
