//! The operator's console: server-rendered pages, every figure read from the store or a
//! live counter at request time. `/` the chats, `/chat/<session>` a chat's recent turns as
//! traces, `/clock` the clock tasks (pause, resume), `/tasks` the terminal's background
//! tasks (stop), `/usage` tokens and cost per chat and member per day (`parlor usage`'s
//! figures), `/errors` recent warnings and errors; `/login`, `/logout`. Every page and
//! action passes [`Auth`] first; actions are POSTs that also carry the login's CSRF token.
//! Everything a chat or a model wrote is HTML-escaped ([`esc`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Extension, Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use parlor_bot::platform::ChatRef;
use parlor_bot::session::{SessionManager, trace, usage};
use parlor_bot::store::Store;
use parlor_toolsets::clock::{ClockHandle, ClockPatch, ScheduleKind};
use parlor_toolsets::terminal::{TaskStatus, TerminalService};
use serde::Deserialize;

use super::auth::{self, Access, Auth, Client};
use super::errors::ErrorRing;

const CSS: &str = include_str!("assets/console.css");
/// Characters of a background task's output the console shows.
const OUTPUT_TAIL: usize = 2000;
/// Clock runs shown per task.
const RUNS_SHOWN: usize = 10;
/// Background tasks shown.
const TASKS_SHOWN: usize = 50;

/// What the console reads and acts on.
pub struct Console {
    /// The token and the logins.
    pub auth: Auth,
    /// The daemon's store.
    pub store: Arc<dyn Store>,
    /// The live sessions (queue depth, the running turn, stop).
    pub sessions: Option<SessionManager>,
    /// The clock tasks, when the clock is enabled.
    pub clock: Option<ClockHandle>,
    /// The terminal, when enabled.
    pub terminal: Option<Arc<TerminalService>>,
    /// Recent warnings and errors.
    pub errors: &'static ErrorRing,
}

/// The console's routes.
pub fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route("/", get(chats))
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
        .route("/chat/{*session}", get(chat))
        .route("/stop", post(stop))
        .route("/clock", get(clock))
        .route("/clock/{id}/{action}", post(clock_action))
        .route("/tasks", get(tasks))
        .route("/tasks/stop", post(task_stop))
        .route("/errors", get(errors))
        .route("/usage", get(usage_page))
        .route("/console.css", get(css))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&console),
            throttle_bearer,
        ))
        .with_state(console)
}

/// The style sheet, served rather than inlined so the content security policy needs no
/// `'unsafe-inline'`.
async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response()
}

/// Throttles bearer tokens as the login form's are: a client past its wrong tokens waits
/// (429) whether its token is right or not, so guessing costs time on every route.
async fn throttle_bearer(
    State(console): State<Arc<Console>>,
    Extension(Client(client)): Extension<Client>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(given) = Auth::bearer(request.headers()) {
        let throttle = console.auth.throttle();
        if let Some(wait) = throttle.wait(client) {
            return too_many(wait);
        }
        if console.auth.token_matches(given) {
            throttle.succeeded(client);
        } else {
            throttle.failed(client);
        }
    }
    next.run(request).await
}

/// 429 with the wait in `Retry-After` (whole seconds, rounded up).
fn too_many(wait: std::time::Duration) -> Response {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, secs.to_string())],
        format!("too many wrong tokens; try again in {secs} s\n"),
    )
        .into_response()
}

/// HTML-escapes `text` for element content and quoted attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A session key as one path segment of a link.
fn path_part(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn page(title: &str, access: Option<&Access>, body: &str) -> Html<String> {
    let nav = match access {
        Some(access) => format!(
            "<nav><a href=\"/\">Chats</a><a href=\"/clock\">Clock</a><a href=\"/tasks\">Tasks</a>\
             <a href=\"/usage\">Usage</a><a href=\"/errors\">Errors</a></nav>{}",
            form("/logout", access, &[], "Log out")
        ),
        None => String::new(),
    };
    Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · parlor</title><link rel=\"stylesheet\" href=\"/console.css\"></head><body>\
         <header><strong>parlor</strong>{nav}</header><main><h1>{}</h1>{body}</main></body></html>",
        esc(title),
        esc(title)
    ))
}

/// A POST button carrying the CSRF token and `fields`.
fn form(action: &str, access: &Access, fields: &[(&str, &str)], label: &str) -> String {
    let mut out = format!(
        "<form class=\"inline\" method=\"post\" action=\"{}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        esc(action),
        esc(access.csrf())
    );
    for (name, value) in fields {
        let _ = write!(
            out,
            "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
            esc(name),
            esc(value)
        );
    }
    let _ = write!(
        out,
        "<button type=\"submit\">{}</button></form>",
        esc(label)
    );
    out
}

/// Why a request was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// A page without a valid token: to the login form.
    Login,
    /// An action without a valid token.
    Unauthorized,
    /// An action from a login whose form lacks its CSRF token.
    Forged,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::Login => Redirect::to("/login").into_response(),
            Refused::Unauthorized => {
                (StatusCode::UNAUTHORIZED, "a token is needed\n").into_response()
            }
            Refused::Forged => {
                (StatusCode::FORBIDDEN, "the form's CSRF token is wrong\n").into_response()
            }
        }
    }
}

/// The access of a page request; without one, the way to the login form.
fn page_access(console: &Console, headers: &HeaderMap) -> Result<Access, Refused> {
    console.auth.check(headers).ok_or(Refused::Login)
}

/// The access of an action: a valid login (or bearer) and, for a login, its CSRF token.
fn action_access(
    console: &Console,
    headers: &HeaderMap,
    csrf: Option<&str>,
) -> Result<Access, Refused> {
    let access = console.auth.check(headers).ok_or(Refused::Unauthorized)?;
    if !access.form_ok(csrf) {
        return Err(Refused::Forged);
    }
    Ok(access)
}

fn back(to: &str) -> Response {
    Redirect::to(to).into_response()
}

fn failure(status: StatusCode, what: &str) -> Response {
    (status, format!("{what}\n")).into_response()
}

// ---------------------------------------------------------------------------------------
// Login

async fn login_form() -> Html<String> {
    page(
        "Log in",
        None,
        "<form method=\"post\" action=\"/login\"><p><label>Console token<br>\
         <input type=\"password\" name=\"token\" autocomplete=\"current-password\" autofocus>\
         </label></p><p><button type=\"submit\">Log in</button></p></form>",
    )
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(
    State(console): State<Arc<Console>>,
    Extension(Client(client)): Extension<Client>,
    Form(form): Form<LoginForm>,
) -> Response {
    let throttle = console.auth.throttle();
    // Checked before the token: a client past its wrong tokens learns nothing more.
    if let Some(wait) = throttle.wait(client) {
        return too_many(wait);
    }
    if !console.auth.token_matches(form.token.trim()) {
        throttle.failed(client);
        tracing::warn!(%client, "console login refused: wrong token");
        return (
            StatusCode::UNAUTHORIZED,
            page(
                "Log in",
                None,
                "<p class=\"bad\">Wrong token.</p><p><a href=\"/login\">Try again</a></p>",
            ),
        )
            .into_response();
    }
    throttle.succeeded(client);
    let Some(id) = console.auth.login() else {
        return failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            "no randomness for a session id",
        );
    };
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, auth::set_cookie(&id)),
            (header::LOCATION, "/".to_owned()),
        ],
    )
        .into_response()
}

#[derive(Deserialize)]
struct CsrfForm {
    csrf: Option<String>,
}

async fn logout(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Err(refused) = action_access(&console, &headers, form.csrf.as_deref()) {
        return refused.into_response();
    }
    console.auth.logout(&headers);
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, auth::clear_cookie()),
            (header::LOCATION, "/login".to_owned()),
        ],
    )
        .into_response()
}

// ---------------------------------------------------------------------------------------
// Chats

/// One row of `/`.
#[derive(Default)]
struct ChatRow {
    title: Option<String>,
    last: Option<DateTime<Utc>>,
    queued: usize,
    turns_today: u64,
    tokens_today: u64,
    cost_today: u64,
    current: Option<(DateTime<Utc>, String)>,
}

fn later(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    a.max(b)
}

async fn chats(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let access = match page_access(&console, &headers) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let store = console.store.as_ref();
    let mut rows: BTreeMap<String, ChatRow> = BTreeMap::new();
    match trace::heads(store) {
        Ok(heads) => {
            for (session, head) in heads {
                rows.entry(session).or_default().last = head.last;
            }
        }
        Err(e) => tracing::warn!(error = %e, "console: cannot read the trace heads"),
    }
    // The sessions' clock when they run here, so the console counts the day they count in.
    let today = console
        .sessions
        .as_ref()
        .map_or_else(usage::today, SessionManager::today);
    match usage::all_on(store, today) {
        Ok(days) => {
            for (session, day) in days {
                let row = rows.entry(session).or_default();
                row.turns_today = day.turns;
                row.tokens_today = day.total_tokens;
                row.cost_today = day.cost_nanos;
            }
        }
        Err(e) => tracing::warn!(error = %e, "console: cannot read today's usage"),
    }
    if let Some(sessions) = &console.sessions {
        for live in sessions.live_chats() {
            let row = rows.entry(live.session).or_default();
            row.queued = live.queued;
            row.current = live.current;
        }
    }
    for (session, row) in &mut rows {
        row.title = store
            .chat_status(session)
            .ok()
            .flatten()
            .and_then(|c| c.title);
        let said = store
            .recent_messages(session, 1)
            .ok()
            .and_then(|m| m.last().map(|m| m.time));
        row.last = later(row.last, said);
    }
    let limit = console
        .sessions
        .as_ref()
        .and_then(SessionManager::daily_token_budget)
        .map(|l| format!(" (daily budget {l} per chat)"))
        .unwrap_or_default();
    let mut body = format!(
        "<p class=\"muted\">Tokens and turns are counted per UTC day{limit}.</p>\
         <div class=\"scroll\"><table><thead><tr><th>Chat</th><th>Platform</th><th>Title</th>\
         <th>Last activity</th><th>Queued</th><th>Turns today</th><th>Tokens today</th>\
         <th>Cost today</th><th>Current turn</th></tr></thead><tbody>"
    );
    if rows.is_empty() {
        body.push_str(
            "<tr><td colspan=\"9\" class=\"muted\">No chat has had a turn yet.</td></tr>",
        );
    }
    for (session, row) in &rows {
        let platform = ChatRef::parse_session_key(session)
            .map(|c| c.platform)
            .unwrap_or_default();
        let current = match &row.current {
            Some((since, input)) => format!(
                "since {}<pre>{}</pre>{}",
                time(*since),
                esc(&parlor_bot::text::ellipsize(input, 200)),
                form("/stop", &access, &[("session", session)], "Stop")
            ),
            None => "<span class=\"muted\">idle</span>".to_owned(),
        };
        let _ = write!(
            body,
            "<tr><td><a href=\"/chat/{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{current}</td></tr>",
            path_part(session),
            esc(session),
            esc(&platform),
            esc(row.title.as_deref().unwrap_or("")),
            row.last.map(time).unwrap_or_default(),
            row.queued,
            row.turns_today,
            row.tokens_today,
            parlor_bot::llm::price::dollars(row.cost_today),
        );
    }
    body.push_str("</tbody></table></div>");
    page("Chats", Some(&access), &body).into_response()
}

#[derive(Deserialize)]
struct StopForm {
    csrf: Option<String>,
    session: String,
}

async fn stop(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<StopForm>,
) -> Response {
    if let Err(refused) = action_access(&console, &headers, form.csrf.as_deref()) {
        return refused.into_response();
    }
    let stopped = console
        .sessions
        .as_ref()
        .is_some_and(|s| s.stop_turn(&form.session));
    tracing::info!(session = %form.session, stopped, "console: stop");
    back("/")
}

// ---------------------------------------------------------------------------------------
// A chat's traces

async fn chat(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(session): Path<String>,
) -> Response {
    let access = match page_access(&console, &headers) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let store = console.store.as_ref();
    let traces = match trace::recent(store, &session) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(session = %session, error = %e, "console: cannot read traces");
            return failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the traces cannot be read",
            );
        }
    };
    let mut body = format!(
        "<p class=\"muted\">The last {} turns, newest first.</p>",
        trace::KEEP_TRACES
    );
    // The group's own settings and who changed them (`/settings`, `/settings log`).
    if let Some(sessions) = &console.sessions {
        match sessions.settings_view(&session) {
            Ok((text, changes)) => {
                let _ = write!(
                    body,
                    "<section class=\"turn\"><h2>Settings</h2><pre>{}</pre>",
                    esc(&text)
                );
                if !changes.is_empty() {
                    body.push_str(
                        "<div class=\"scroll\"><table><thead><tr><th>When</th><th>Who</th>\
                         <th>Setting</th><th>From</th><th>To</th></tr></thead><tbody>",
                    );
                    for c in &changes {
                        let _ = write!(
                            body,
                            "<tr><td>{}</td><td>{} ({})</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                            time(c.at),
                            esc(&c.by_name),
                            esc(&c.by),
                            esc(&c.key),
                            esc(&c.old),
                            esc(&c.new),
                        );
                    }
                    body.push_str("</tbody></table></div>");
                }
                body.push_str("</section>");
            }
            Err(e) => {
                tracing::warn!(session = %session, error = %e, "console: cannot read the settings log");
            }
        }
    }
    if traces.is_empty() {
        body.push_str("<p class=\"muted\">No traced turn.</p>");
    }
    for t in &traces {
        let _ = write!(
            body,
            "<section class=\"turn\"><h2>Turn {} · {} · {} ms · {}</h2>\
             <p>{} from {} · tokens {} in, {} out{}{}</p><pre>{}</pre>",
            t.seq,
            time(t.started),
            t.millis,
            esc(&t.end),
            esc(&t.kind),
            esc(&t.callers.join(", ")),
            t.prompt_tokens,
            t.completion_tokens,
            // Without `[llm.prices]` a turn costs nothing that could be shown.
            match t.cost_nanos {
                0 => String::new(),
                c => format!(" · {}", parlor_bot::llm::price::dollars(c)),
            },
            t.model
                .as_deref()
                .map(|m| format!(" · answered by {}", esc(m)))
                .unwrap_or_default(),
            esc(&t.input),
        );
        if let Some(error) = &t.error {
            let _ = write!(body, "<p class=\"bad\">Model failed: {}</p>", esc(error));
        }
        for (i, request) in t.requests.iter().enumerate() {
            if request.calls.is_empty() {
                continue;
            }
            let _ = write!(body, "<h3>Request {}</h3>", i + 1);
            if !request.text.is_empty() {
                let _ = write!(body, "<pre>{}</pre>", esc(&request.text));
            }
            body.push_str(
                "<div class=\"scroll\"><table><thead><tr><th>Tool</th><th>Arguments</th>\
                 <th>Result</th></tr></thead><tbody>",
            );
            for call in &request.calls {
                let class = if call.code == "ok" { "ok" } else { "bad" };
                let _ = write!(
                    body,
                    "<tr><td>{}</td><td><pre>{}</pre></td><td><span class=\"{class}\">{}</span> {}</td></tr>",
                    esc(&call.name),
                    esc(&call.arguments),
                    esc(&call.code),
                    esc(&call.message),
                );
            }
            body.push_str("</tbody></table></div>");
        }
        match (&t.reply, t.outbox_id) {
            (Some(reply), Some(id)) => {
                let delivery = match store.sent_reply(id) {
                    Ok(Some(done)) => match done.failed {
                        Some(reason) => {
                            format!("<span class=\"bad\">not delivered: {}</span>", esc(&reason))
                        }
                        None => format!(
                            "<span class=\"ok\">sent</span> as message {}",
                            esc(&done.sent_ids.join(", "))
                        ),
                    },
                    Ok(None) => "not sent yet".to_owned(),
                    Err(e) => format!("unknown ({})", esc(&e.to_string())),
                };
                let _ = write!(
                    body,
                    "<h3>Reply</h3><pre>{}</pre><p>outbox {id}: {delivery}</p>",
                    esc(reply)
                );
            }
            _ => body.push_str("<p class=\"muted\">No reply.</p>"),
        }
        body.push_str("</section>");
    }
    page(&format!("Chat {session}"), Some(&access), &body).into_response()
}

// ---------------------------------------------------------------------------------------
// Clock

async fn clock(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let access = match page_access(&console, &headers) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let Some(handle) = &console.clock else {
        return page(
            "Clock",
            Some(&access),
            "<p class=\"muted\">The clock toolset is not enabled.</p>",
        )
        .into_response();
    };
    let tasks = match handle.tasks() {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "console: cannot read the clock tasks");
            return failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the clock tasks cannot be read",
            );
        }
    };
    let mut body = String::new();
    if tasks.is_empty() {
        body.push_str("<p class=\"muted\">No clock task.</p>");
    }
    for task in &tasks {
        let once = handle
            .schedule_of(task)
            .is_ok_and(|s| s.kind() == ScheduleKind::Once);
        // A one-shot is disabled by its own fire; it is done, not paused.
        let finished = !task.enabled && once && task.last_fire.is_some();
        let state = if task.enabled {
            "<span class=\"ok\">active</span>".to_owned()
        } else if finished {
            "<span class=\"muted\">done</span>".to_owned()
        } else {
            format!(
                "<span class=\"bad\">paused</span> {}",
                esc(task.paused_reason.as_deref().unwrap_or(""))
            )
        };
        let (action, label) = if task.enabled {
            ("pause", "Pause")
        } else {
            ("resume", "Resume")
        };
        let next: Vec<String> = handle.upcoming(task, 3).into_iter().map(time).collect();
        let _ = write!(
            body,
            "<section class=\"turn\" id=\"task-{id}\"><h2>#{id} {}</h2><p>{state} {}</p>\
             <p><code>{}</code> ({}) → <a href=\"/chat/{}\">{}</a></p><pre>{}</pre><p>Next: {}</p>",
            esc(&task.name),
            if finished {
                String::new()
            } else {
                form(&format!("/clock/{}/{action}", task.id), &access, &[], label)
            },
            esc(&task.schedule),
            esc(&task.timezone),
            path_part(&task.target.session_key()),
            esc(&task.target.session_key()),
            esc(&task.content),
            if next.is_empty() {
                "none".to_owned()
            } else {
                next.join(", ")
            },
            id = task.id,
        );
        let runs = handle.runs(task.id, RUNS_SHOWN).unwrap_or_default();
        if runs.is_empty() {
            body.push_str("<p class=\"muted\">No run yet.</p>");
        } else {
            body.push_str(
                "<div class=\"scroll\"><table><thead><tr><th>Run</th><th>Due</th><th>Status</th>\
                 <th>Delivered as</th><th>Error</th></tr></thead><tbody>",
            );
            for run in &runs {
                let _ = write!(
                    body,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    run.run,
                    time(run.due),
                    run.status.as_str(),
                    esc(&run.message_ids.join(", ")),
                    esc(run.error.as_deref().unwrap_or("")),
                );
            }
            body.push_str("</tbody></table></div>");
        }
        body.push_str("</section>");
    }
    page("Clock tasks", Some(&access), &body).into_response()
}

async fn clock_action(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path((id, action)): Path<(u64, String)>,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Err(refused) = action_access(&console, &headers, form.csrf.as_deref()) {
        return refused.into_response();
    }
    let enabled = match action.as_str() {
        "pause" => false,
        "resume" => true,
        _ => return failure(StatusCode::NOT_FOUND, "no such action"),
    };
    let Some(handle) = console.clock.clone() else {
        return failure(StatusCode::NOT_FOUND, "the clock is not enabled");
    };
    // Through the handle, so its index of due times follows; the store write is blocking.
    let patch = ClockPatch {
        enabled: Some(enabled),
        ..ClockPatch::default()
    };
    match tokio::task::spawn_blocking(move || handle.update(id, patch)).await {
        Ok(Ok(task)) => {
            tracing::info!(task = task.id, enabled, "console: clock task changed");
            back(&format!("/clock#task-{id}"))
        }
        Ok(Err(e)) => failure(StatusCode::BAD_REQUEST, &e.to_string()),
        Err(e) => failure(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

// ---------------------------------------------------------------------------------------
// Background tasks

async fn tasks(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let access = match page_access(&console, &headers) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let Some(terminal) = &console.terminal else {
        return page(
            "Background tasks",
            Some(&access),
            "<p class=\"muted\">The terminal is not enabled.</p>",
        )
        .into_response();
    };
    let mut rows = terminal.tasks(None);
    rows.reverse();
    rows.truncate(TASKS_SHOWN);
    let mut body = String::new();
    if rows.is_empty() {
        body.push_str("<p class=\"muted\">No background task.</p>");
    }
    for row in &rows {
        let output = match terminal.output_tail(row, OUTPUT_TAIL) {
            Ok(text) => text,
            Err(e) => format!("(the output cannot be read: {e})"),
        };
        let stop = if row.status == TaskStatus::Running && terminal.is_live(&row.id) {
            form(
                "/tasks/stop",
                &access,
                &[("session", &row.session), ("id", &row.id)],
                "Stop",
            )
        } else {
            String::new()
        };
        let _ = write!(
            body,
            "<section class=\"turn\"><h2>{} · {}{} {stop}</h2><p><a href=\"/chat/{}\">{}</a> · \
             started {} by {}{}</p><pre>{}</pre><pre>{}</pre></section>",
            esc(&row.id),
            row.status.as_str(),
            row.exit_code
                .map(|c| format!(" (exit {c})"))
                .unwrap_or_default(),
            path_part(&row.session),
            esc(&row.session),
            time(row.started),
            esc(&row.started_by_name),
            row.ended
                .map(|t| format!(", ended {}", time(t)))
                .unwrap_or_default(),
            esc(&row.command),
            esc(&output),
        );
    }
    page("Background tasks", Some(&access), &body).into_response()
}

#[derive(Deserialize)]
struct TaskStopForm {
    csrf: Option<String>,
    session: String,
    id: String,
}

async fn task_stop(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<TaskStopForm>,
) -> Response {
    if let Err(refused) = action_access(&console, &headers, form.csrf.as_deref()) {
        return refused.into_response();
    }
    let Some(terminal) = &console.terminal else {
        return failure(StatusCode::NOT_FOUND, "the terminal is not enabled");
    };
    match terminal.stop_task(&form.session, &form.id).await {
        Some((_, stopped)) => {
            tracing::info!(task = %form.id, session = %form.session, stopped, "console: task stop");
            back("/tasks")
        }
        None => failure(StatusCode::NOT_FOUND, "no such task"),
    }
}

// ---------------------------------------------------------------------------------------
// Errors

async fn errors(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let access = match page_access(&console, &headers) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let events = console.errors.recent();
    let mut body = format!(
        "<p class=\"muted\">The last {} warnings and errors since the daemon started, newest first.</p>\
         <div class=\"scroll\"><table><thead><tr><th>Time</th><th>Level</th><th>Chat</th>\
         <th>Where</th><th>What</th></tr></thead><tbody>",
        super::errors::KEEP
    );
    if events.is_empty() {
        body.push_str("<tr><td colspan=\"5\" class=\"muted\">None.</td></tr>");
    }
    for e in &events {
        let chat = match &e.session {
            Some(s) => format!("<a href=\"/chat/{}\">{}</a>", path_part(s), esc(s)),
            None => String::new(),
        };
        let class = if e.level == "ERROR" { "bad" } else { "" };
        let _ = write!(
            body,
            "<tr><td>{}</td><td class=\"{class}\">{}</td><td>{chat}</td><td>{}</td><td>{}</td></tr>",
            time(e.time),
            esc(&e.level),
            esc(&e.target),
            esc(&e.message),
        );
    }
    body.push_str("</tbody></table></div>");
    page("Errors", Some(&access), &body).into_response()
}

// ---------------------------------------------------------------------------------------
// Usage

/// `/usage?days=N&chat=C&member=M`: what `parlor usage` would print.
#[derive(Debug, Default, Deserialize)]
struct UsageQuery {
    days: Option<u32>,
    chat: Option<String>,
    member: Option<String>,
}

/// Days the usage page reads at most.
const USAGE_DAYS_MAX: u32 = 90;

async fn usage_page(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Query(query): Query<UsageQuery>,
) -> Response {
    let access = match page_access(&console, &headers) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let blank = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
    let filter = crate::usage::Filter {
        chat: blank(query.chat),
        member: blank(query.member),
        days: query.days.unwrap_or(7).clamp(1, USAGE_DAYS_MAX),
    };
    let today = console
        .sessions
        .as_ref()
        .map_or_else(usage::today, SessionManager::today);
    let report = match crate::usage::Report::read(console.store.as_ref(), today, &filter) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "console: cannot read usage");
            return failure(StatusCode::INTERNAL_SERVER_ERROR, "cannot read usage");
        }
    };
    let dollars = parlor_bot::llm::price::dollars;
    let mut body = format!(
        "<form method=\"get\" action=\"/usage\">\
         <label>Days <input name=\"days\" type=\"number\" min=\"1\" max=\"{USAGE_DAYS_MAX}\" value=\"{}\"></label> \
         <label>Chat <input name=\"chat\" value=\"{}\"></label> \
         <label>Member <input name=\"member\" value=\"{}\"></label> \
         <button type=\"submit\">Show</button></form>\
         <p class=\"muted\">Per UTC day. Cost is at <code>[llm.prices]</code> when each turn ran; \
         a model without a price adds nothing. Cached: the share of prompt tokens the provider \
         read from its cache.</p>",
        filter.days,
        esc(filter.chat.as_deref().unwrap_or("")),
        esc(filter.member.as_deref().unwrap_or("")),
    );
    if filter.member.is_none() {
        body.push_str(
            "<h2>Chats</h2><div class=\"scroll\"><table><thead><tr><th>Day</th><th>Chat</th>\
             <th>Turns</th><th>Tokens</th><th>Cached</th><th>Cost</th></tr></thead><tbody>",
        );
        for l in &report.chats {
            let r = &l.record;
            let _ = write!(
                body,
                "<tr><td>{}</td><td><a href=\"/chat/{}\">{}</a></td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td></tr>",
                l.day,
                path_part(&l.session),
                esc(&l.session),
                r.turns,
                r.total_tokens,
                crate::usage::cached(r),
                dollars(r.cost_nanos),
            );
        }
        let s = report.chat_sums();
        let _ = write!(
            body,
            "<tr class=\"total\"><th>Total</th><td></td><th>{}</th><th>{}</th><th>{}</th>\
             <th>{}</th></tr></tbody></table></div>",
            s.turns,
            s.tokens,
            s.cached(),
            dollars(s.cost_nanos),
        );
    }
    body.push_str(
        "<h2>Members</h2><div class=\"scroll\"><table><thead><tr><th>Day</th><th>Member</th>\
         <th>Chat</th><th>Turns</th><th>Tokens</th><th>Cost</th></tr></thead><tbody>",
    );
    for l in &report.members {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            l.day,
            esc(&l.who()),
            esc(&l.session),
            l.record.turns,
            l.record.total_tokens,
            dollars(l.record.cost_nanos),
        );
    }
    let s = report.member_sums();
    let _ = write!(
        body,
        "<tr class=\"total\"><th>Total</th><td></td><td></td><th>{}</th><th>{}</th><th>{}</th>\
         </tr></tbody></table></div>",
        s.turns,
        s.tokens,
        dollars(s.cost_nanos),
    );
    page("Usage", Some(&access), &body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_text_cannot_open_a_tag_or_leave_an_attribute() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
    }

    #[test]
    fn session_keys_are_one_path_segment() {
        assert_eq!(
            path_part("telegram:-100/topic:7"),
            "telegram%3A%2D100%2Ftopic%3A7"
        );
    }
}
